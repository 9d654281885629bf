// Gated DeltaNet decode step (gdn_decode_step, src/cuda/kernels/gdn/gdn_decode.cu) against the CPU
// recurrence (cpu::gdn_gates + l2norm + cpu::gdn_recurrent_step) on the shapes the kernel tiles
// unevenly: 1, 2, 4 and 8 key rows per thread (dk 32, 48, 96, 200, 256), a last 16-column slice that is
// partly empty (dv 20, 52), dv 48 (tiny2), dv not a multiple of 4 (7, 33: scalar columns), a state that
// is not 16-byte aligned (scalar columns with dv % 4 == 0), 1, 3 and 4 value heads per key head.
// Fresh seeds (printed on failure), output poisoned with NaN, three steps on the same state.
// Also a chain on a stream with no host sync between steps, each step preceded by another PDL kernel
// (increment_i32), as in the decode graph: the step loads the state before its pdl_wait().
// The state is fp32, so errors are summation-order differences: ‖Δ‖/‖ref‖ ≤ 1e-5. Also the basic case
// at the model's shape and two small ones (GatedDeltaNetStepMatchesCpu).
#include <gtest/gtest.h>
#include <cuda_runtime.h>

#include <cmath>
#include <string>
#include <vector>

#include "cpu/ops.h"
#include "cuda/kernels/gdn/gdn.h"
#include "cuda/kernels/gemv/gemv.h"
#include "cuda/kernels/sampling/sampling.h"
#include "decode_test_util.h"
#include "support/fixtures.h"

using namespace lilac;
namespace lc = lilac::cuda;

namespace {

using namespace lilac::cuda::testing;

struct Shape {
  int Hk, Hv, dk, dv;
};

// One CPU step of every head on S (updated in place); o [Hv*dv].
void cpu_step(const Shape& c, const std::vector<float>& qkv, const std::vector<float>& b, const std::vector<float>& a,
              const std::vector<float>& A, const std::vector<float>& dt, std::vector<float>& S, std::vector<float>& o) {
  std::vector<float> beta(size_t(c.Hv)), g(size_t(c.Hv));
  cpu::gdn_gates(b.data(), a.data(), A.data(), dt.data(), c.Hv, beta.data(), g.data());
  o.assign(size_t(c.Hv) * c.dv, 0.f);
  for (int h = 0; h < c.Hv; ++h) {
    const int kh = h / (c.Hv / c.Hk);
    std::vector<float> q(qkv.begin() + int64_t(kh) * c.dk, qkv.begin() + int64_t(kh + 1) * c.dk);
    std::vector<float> k(qkv.begin() + int64_t(c.Hk) * c.dk + int64_t(kh) * c.dk,
                         qkv.begin() + int64_t(c.Hk) * c.dk + int64_t(kh + 1) * c.dk);
    cpu::l2norm(q.data(), c.dk);
    cpu::l2norm(k.data(), c.dk);
    for (auto& v : q) v /= std::sqrt(float(c.dk));
    const float* v = qkv.data() + 2LL * c.Hk * c.dk + int64_t(h) * c.dv;
    cpu::gdn_recurrent_step(S.data() + int64_t(h) * c.dk * c.dv, q.data(), k.data(), v, g[size_t(h)],
                            beta[size_t(h)], c.dk, c.dv, o.data() + int64_t(h) * c.dv);
  }
}

void check_shape(Rng& r, const Shape& c, int state_offset) {
  SCOPED_TRACE("Hk " + std::to_string(c.Hk) + " Hv " + std::to_string(c.Hv) + " dk " + std::to_string(c.dk) +
               " dv " + std::to_string(c.dv) + " state offset " + std::to_string(state_offset));
  const int64_t C = 2LL * c.Hk * c.dk + int64_t(c.Hv) * c.dv;
  const size_t n_state = size_t(c.Hv) * c.dk * c.dv;
  auto S = randv(r, n_state, 0.3f);
  std::vector<float> A(size_t(c.Hv)), dt(size_t(c.Hv));
  for (auto& v : A) v = r.uni(-1.f, 1.f);
  for (auto& v : dt) v = r.uni(-1.f, 1.f);
  Dev<float> dS(n_state + size_t(state_offset)), dA(A), ddt(dt), out(size_t(c.Hv) * c.dv);
  float* state = dS.p + state_offset;
  CK(cudaMemcpy(state, S.data(), n_state * sizeof(float), cudaMemcpyHostToDevice));
  std::vector<float> ref;
  for (int step = 0; step < 3; ++step) {
    const auto qkv = randv(r, size_t(C));
    const auto b = randv(r, size_t(c.Hv)), a = randv(r, size_t(c.Hv));
    Dev<float> dqkv(qkv), db(b), da(a);
    out.poison();
    lc::gdn_decode_step({c.Hk, c.Hv, c.dk, c.dv}, dqkv.p, db.p, da.p, dA.p, ddt.p, state, out.p, nullptr);
    CK(cudaDeviceSynchronize());
    cpu_step(c, qkv, b, a, A, dt, S, ref);
    EXPECT_LE(rel_err(out.get(), ref), 1e-5) << "step " << step;
    std::vector<float> got(n_state);
    CK(cudaMemcpy(got.data(), state, n_state * sizeof(float), cudaMemcpyDeviceToHost));
    EXPECT_LE(rel_err(got, S), 1e-5) << "state, step " << step;
  }
}

TEST(CudaDecodeGdn, StepMatchesCpuOnUnevenTiles) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng r(seed);
  for (const Shape c : {Shape{1, 2, 32, 48}, Shape{2, 8, 32, 52}, Shape{1, 3, 96, 20}, Shape{1, 4, 200, 64},
                        Shape{2, 2, 256, 128}, Shape{2, 6, 48, 7}, Shape{1, 1, 256, 33}})
    check_shape(r, c, 0);
  // not 16-byte aligned: scalar columns although dv % 4 == 0
  for (const Shape c : {Shape{2, 4, 64, 48}, Shape{1, 2, 128, 128}}) check_shape(r, c, 1);
}

TEST(CudaDecodeGdn, StepChainOnAStreamWithoutHostSync) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng r(seed);
  const Shape c{16, 32, 128, 128};  // the model's linear-attention heads
  constexpr int kSteps = 6;
  const int64_t C = 2LL * c.Hk * c.dk + int64_t(c.Hv) * c.dv;
  const size_t n_state = size_t(c.Hv) * c.dk * c.dv;
  auto S = randv(r, n_state, 0.3f);
  std::vector<float> A(size_t(c.Hv)), dt(size_t(c.Hv));
  for (auto& v : A) v = r.uni(-1.f, 1.f);
  for (auto& v : dt) v = r.uni(-1.f, 1.f);
  std::vector<std::vector<float>> qkv, b, a;
  for (int i = 0; i < kSteps; ++i) {
    qkv.push_back(randv(r, size_t(C)));
    b.push_back(randv(r, size_t(c.Hv)));
    a.push_back(randv(r, size_t(c.Hv)));
  }
  Dev<float> dS(S), dA(A), ddt(dt), dqkv(size_t(C) * kSteps), db(size_t(c.Hv) * kSteps), da(size_t(c.Hv) * kSteps),
      out(size_t(c.Hv) * c.dv * kSteps);
  Dev<int32_t> counter(1);
  for (int i = 0; i < kSteps; ++i) {
    CK(cudaMemcpy(dqkv.p + C * i, qkv[size_t(i)].data(), size_t(C) * sizeof(float), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(db.p + c.Hv * i, b[size_t(i)].data(), size_t(c.Hv) * sizeof(float), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(da.p + c.Hv * i, a[size_t(i)].data(), size_t(c.Hv) * sizeof(float), cudaMemcpyHostToDevice));
  }
  CK(cudaMemset(counter.p, 0, sizeof(int32_t)));
  out.poison();
  CK(cudaDeviceSynchronize());
  cudaStream_t st = nullptr;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  for (int i = 0; i < kSteps; ++i) {
    lc::increment_i32(counter.p, st);  // the predecessor: never touches the state
    lc::gdn_decode_step({c.Hk, c.Hv, c.dk, c.dv}, dqkv.p + C * i, db.p + c.Hv * i, da.p + c.Hv * i, dA.p, ddt.p,
                        dS.p, out.p + int64_t(c.Hv) * c.dv * i, st);
  }
  CK(cudaStreamSynchronize(st));
  CK(cudaStreamDestroy(st));
  EXPECT_EQ(counter.get()[0], kSteps);
  const auto got_out = out.get();
  std::vector<float> ref;
  for (int i = 0; i < kSteps; ++i) {
    cpu_step(c, qkv[size_t(i)], b[size_t(i)], a[size_t(i)], A, dt, S, ref);
    const std::vector<float> got(got_out.begin() + int64_t(c.Hv) * c.dv * i,
                                 got_out.begin() + int64_t(c.Hv) * c.dv * (i + 1));
    EXPECT_LE(rel_err(got, ref), 1e-5) << "step " << i;
  }
  EXPECT_LE(rel_err(dS.get(), S), 1e-5) << "state after " << kSteps << " steps";
}

// The gated output norm inside the step (GdnGate, sm_90 clusters of a head's column slices): the out_proj GEMV on its
// output with no prologue gives the bits of the raw step + out_proj with the GatedHeadNorm prologue, and the states
// are the same bits; the model's heads (a power-of-two number of 8-value units per head, 8 slices a cluster), tiny2's
// (48 values: 3 slices, the warp-per-head sum), 40 values (a last slice half empty) and 16 (one slice, no cluster
// attribute), two steps on the same states.
TEST(CudaDecodeGdn, GateInTheStepGivesOutProjsBits) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng r(seed);
  for (const Shape c : {Shape{16, 32, 128, 128}, Shape{2, 4, 32, 48}, Shape{1, 8, 32, 40}, Shape{2, 4, 64, 16}}) {
    SCOPED_TRACE("dv " + std::to_string(c.dv));
    const lc::GdnShape gs{c.Hk, c.Hv, c.dk, c.dv};
    const int64_t C = 2LL * c.Hk * c.dk + int64_t(c.Hv) * c.dv, V = int64_t(c.Hv) * c.dv;
    const size_t n_state = size_t(c.Hv) * c.dk * c.dv;
    const auto S = randv(r, n_state, 0.3f);
    std::vector<float> A(size_t(c.Hv)), dt(size_t(c.Hv));
    for (auto& v : A) v = r.uni(-1.f, 1.f);
    for (auto& v : dt) v = r.uni(-1.f, 1.f);
    Dev<float> SA(S), SB(S), dA(A), ddt(dt), nw(randv(r, size_t(c.dv)));
    Dev<float> oA{size_t(V)}, oB{size_t(V)};
    if (!lc::gdn_decode_gate_supported(gs, SB.p)) GTEST_SKIP() << "no cluster launch on this device (sm_90 needed)";
    HostQ W(r, 256, V, 4);
    DevQ dW(W);
    const auto y0 = randv(r, 256);
    for (int step = 0; step < 2; ++step) {
      Dev<float> qkv(randv(r, size_t(C))), b(randv(r, size_t(c.Hv))), a(randv(r, size_t(c.Hv))), z(randv(r, size_t(V)));
      Dev<float> yA(y0), yB(y0);
      oA.poison();
      oB.poison();
      lc::gdn_decode_step(gs, qkv.p, b.p, a.p, dA.p, ddt.p, SA.p, oA.p, nullptr);
      const lc::GdnGate gate{z.p, nw.p, 1e-6f};
      lc::gdn_decode_step(gs, qkv.p, b.p, a.p, dA.p, ddt.p, SB.p, oB.p, nullptr, &gate);
      lc::GemvArgs ga;
      ga.W = dW.d;
      ga.impl = lc::GemvImpl::Tensor;
      ga.accumulate = true;
      ga.eps = 1e-6f;
      lc::GemvArgs gb = ga;
      ga.x = oA.p;
      ga.y = yA.p;
      ga.pro = lc::Prologue::GatedHeadNorm;
      ga.norm_w = nw.p;
      ga.z = z.p;
      ga.head_dim = c.dv;
      gb.x = oB.p;
      gb.y = yB.p;
      lc::gemv(ga, nullptr);
      lc::gemv(gb, nullptr);
      CK(cudaDeviceSynchronize());
      EXPECT_TRUE(testutil::same_bits(yA.get(), yB.get())) << "step " << step;
      EXPECT_TRUE(testutil::same_bits(SA.get(), SB.get())) << "state, step " << step;
    }
  }
}

// ------------------------------------------------------------------------------------------------ basic case
TEST(CudaDecode, GatedDeltaNetStepMatchesCpu) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng r(seed);
  struct Case {
    int Hk, Hv, dk, dv;
  };
  for (const Case c : {Case{16, 32, 128, 128}, Case{2, 8, 48, 80}, Case{3, 3, 64, 33}}) {
    SCOPED_TRACE("dk " + std::to_string(c.dk) + " dv " + std::to_string(c.dv));
    const int64_t C = 2LL * c.Hk * c.dk + int64_t(c.Hv) * c.dv;
    auto S = randv(r, size_t(c.Hv) * c.dk * c.dv, 0.3f);
    std::vector<float> A(size_t(c.Hv)), dt(size_t(c.Hv));
    for (auto& v : A) v = r.uni(-1.f, 1.f);
    for (auto& v : dt) v = r.uni(-1.f, 1.f);
    Dev<float> dS(S), dA(A), ddt(dt), out(size_t(c.Hv) * c.dv);
    for (int step = 0; step < 3; ++step) {
      const auto qkv = randv(r, size_t(C));
      const auto b = randv(r, size_t(c.Hv)), a = randv(r, size_t(c.Hv));
      Dev<float> dqkv(qkv), db(b), da(a);
      out.poison();
      lc::gdn_decode_step({c.Hk, c.Hv, c.dk, c.dv}, dqkv.p, db.p, da.p, dA.p, ddt.p, dS.p, out.p, nullptr);
      CK(cudaDeviceSynchronize());
      std::vector<float> beta(size_t(c.Hv)), g(size_t(c.Hv)), ref(size_t(c.Hv) * c.dv);
      cpu::gdn_gates(b.data(), a.data(), A.data(), dt.data(), c.Hv, beta.data(), g.data());
      for (int h = 0; h < c.Hv; ++h) {
        const int kh = h / (c.Hv / c.Hk);
        std::vector<float> q(qkv.begin() + kh * c.dk, qkv.begin() + (kh + 1) * c.dk);
        std::vector<float> k(qkv.begin() + int64_t(c.Hk) * c.dk + kh * c.dk,
                             qkv.begin() + int64_t(c.Hk) * c.dk + (kh + 1) * c.dk);
        cpu::l2norm(q.data(), c.dk);
        cpu::l2norm(k.data(), c.dk);
        for (auto& v : q) v /= std::sqrt(float(c.dk));
        const float* v = qkv.data() + 2LL * c.Hk * c.dk + int64_t(h) * c.dv;
        cpu::gdn_recurrent_step(S.data() + int64_t(h) * c.dk * c.dv, q.data(), k.data(), v, g[size_t(h)],
                                beta[size_t(h)], c.dk, c.dv, ref.data() + int64_t(h) * c.dv);
      }
      EXPECT_LE(rel_err(out.get(), ref), 1e-5) << "step " << step;
      EXPECT_LE(rel_err(dS.get(), S), 1e-5) << "state, step " << step;
    }
  }
}

}  // namespace
