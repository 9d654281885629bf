// Gated DeltaNet prefill, column scan (src/cuda/kernels/gdn/gdn.h: gdn_conv_prefill, gdn_prefill) against
// the CPU token-by-token reference (cpu::conv1d_silu_step, cpu::gdn_recurrent_step + gated_rmsnorm):
// fresh seeds (printed on failure), outputs poisoned with NaN, with and without a work buffer (without
// one inside a graph capture: the allocation-free path). The conv and the state are fp32 (1e-5 / 1e-4),
// the output is rounded to bf16 (5e-3). (The chunked form: test_gdn_chunked.cpp.)
#include <gtest/gtest.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "cpu/ops.h"
#include "cuda/kernels/gdn/gdn.h"
#include "prefill_test_util.h"

using namespace lilac;
namespace lc = lilac::cuda;
using namespace lilac::cuda::prefill_testing;

namespace {

// -------------------------------------------------------------------------------- Gated DeltaNet
TEST(PrefillGdn, ConvSiluAndState) {
  NEED_GPU();
  for (int n : {37, 2, 70}) {
    const uint32_t seed = fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed) + " n=" + std::to_string(n));
    std::mt19937 rng(seed);
    const int C = 200, K = 4;
    const int64_t ldx = C + 8;
    auto x = rand_f(size_t(n) * ldx, rng, -2.f, 2.f);
    auto w = rand_f(size_t(C) * K, rng, -1.f, 1.f);
    auto st = rand_f(size_t(C) * (K - 1), rng, -2.f, 2.f);
    std::vector<float> ref(size_t(n) * C), st_ref = st;
    for (int t = 0; t < n; ++t) {
      std::vector<float> row(&x[size_t(t) * ldx], &x[size_t(t) * ldx] + C);
      cpu::conv1d_silu_step(w.data(), C, K, st_ref.data(), row.data(), &ref[size_t(t) * C]);
    }
    Dev<float> dx(x), dw(w), ds(st), dy(size_t(n) * C);
    dy.poison();
    lc::gdn_conv_prefill(dx.p, ldx, dw.p, ds.p, dy.p, C, n, C, K, nullptr);
    CK(cudaDeviceSynchronize());
    EXPECT_LT(rel_err(dy.get(), ref), 1e-5);
    EXPECT_LT(rel_err(ds.get(), st_ref), 1e-7);
  }
}

void check_gdn(int n, int Hk, int Hv, bool use_work) {
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " n=" + std::to_string(n) + " work=" + std::to_string(use_work));
  std::mt19937 rng(seed);
  const int dk = 128, dv = 128;
  const int64_t conv_dim = 2 * int64_t(Hk) * dk + int64_t(Hv) * dv;
  const int64_t ld_qkv = conv_dim + 4;
  auto qkv = rand_f(size_t(n) * ld_qkv, rng, -1.f, 1.f);
  auto ab = rand_f(size_t(n) * 2 * Hv, rng, -3.f, 3.f);  // [b | a] per row
  auto z = rand_f(size_t(n) * Hv * dv, rng, -2.f, 2.f);
  auto A_log = rand_f(Hv, rng, -1.f, 1.f);
  auto dt_bias = rand_f(Hv, rng, -1.f, 1.f);
  auto norm_w = rand_f(dv, rng, 0.5f, 1.5f);
  auto S0 = rand_f(size_t(Hv) * dk * dv, rng, -0.1f, 0.1f);
  // reference
  std::vector<float> S = S0, ref(size_t(n) * Hv * dv);
  std::vector<float> beta(Hv), g(Hv), o(dv);
  for (int t = 0; t < n; ++t) {
    const float* row = &qkv[size_t(t) * ld_qkv];
    std::vector<float> q(row, row + Hk * dk), k(row + Hk * dk, row + 2 * Hk * dk);
    for (int hk = 0; hk < Hk; ++hk) {
      cpu::l2norm(&q[hk * dk], dk);
      cpu::l2norm(&k[hk * dk], dk);
      for (int i = 0; i < dk; ++i) q[hk * dk + i] /= std::sqrt(float(dk));
    }
    cpu::gdn_gates(&ab[size_t(t) * 2 * Hv], &ab[size_t(t) * 2 * Hv + Hv], A_log.data(), dt_bias.data(), Hv,
                   beta.data(), g.data());
    for (int h = 0; h < Hv; ++h) {
      const int hk = h / (Hv / Hk);
      cpu::gdn_recurrent_step(&S[size_t(h) * dk * dv], &q[hk * dk], &k[hk * dk], row + 2 * Hk * dk + h * dv, g[h],
                              beta[h], dk, dv, o.data());
      cpu::gated_rmsnorm(o.data(), &z[(size_t(t) * Hv + h) * dv], norm_w.data(), dv, 1e-6f,
                         &ref[(size_t(t) * Hv + h) * dv]);
    }
  }
  Dev<float> dqkv(qkv), dab(ab), dz(z), dA(A_log), ddt(dt_bias), dw(norm_w), dS(S0), dosc(size_t(n) * Hv * dv);
  Dev<uint16_t> dout(size_t(n) * Hv * dv);
  dout.poison();
  dosc.poison();
  Dev<float> dwork(lc::gdn_prefill_work_floats(n, Hk, Hv, dk));
  dwork.poison();
  lc::GdnPrefillArgs a;
  a.work = use_work ? dwork.p : nullptr;
  a.qkv = dqkv.p;
  a.ld_qkv = ld_qkv;
  a.b = dab.p;
  a.ld_b = 2 * Hv;
  a.a = dab.p + Hv;
  a.ld_a = 2 * Hv;
  a.z = dz.p;
  a.ld_z = int64_t(Hv) * dv;
  a.A_log = dA.p;
  a.dt_bias = ddt.p;
  a.norm_w = dw.p;
  a.state = dS.p;
  a.o_scratch = dosc.p;
  a.out = reinterpret_cast<__nv_bfloat16*>(dout.p);
  a.ld_out = int64_t(Hv) * dv;
  a.n = n;
  a.Hk = Hk;
  a.Hv = Hv;
  a.dk = dk;
  a.dv = dv;
  if (use_work) {
    lc::gdn_prefill(a, nullptr);
  } else {
    // no work buffer, inside a graph capture: the allocation-free path, and capturability
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    lc::gdn_prefill(a, st);
    CK(cudaStreamEndCapture(st, &graph));
    CK(cudaGraphInstantiate(&exec, graph, 0));
    CK(cudaGraphLaunch(exec, st));
    CK(cudaStreamSynchronize(st));
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(st);
  }
  CK(cudaDeviceSynchronize());
  EXPECT_LT(rel_err(bf16_to_f(dout.get()), ref), 5e-3);  // output rounded to bf16
  EXPECT_LT(rel_err(dS.get(), S), 1e-4);                 // fp32 state, different summation order
}

TEST(PrefillGdn, RecurrenceMatchesTokenByToken) {
  NEED_GPU();
  check_gdn(70, 2, 4, true);
  check_gdn(1, 1, 2, true);
  check_gdn(300, 4, 8, true);
  check_gdn(37, 2, 4, false);  // captured in a graph without a work buffer: the in-scan path
  check_gdn(17, 3, 3, true);
}

}  // namespace
