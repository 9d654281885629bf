// Multi-row Gated DeltaNet (gdn_step_rows, gdn_commit_rows, src/cuda/kernels/rows/gdn_rows.cu): the
// fused conv + SiLU and delta-rule step over the rows of several sequences, each in its own slot of
// slot-strided state / conv-state pools, against the CPU reference (cpu::conv1d_silu_step, l2norm,
// gdn_gates, gdn_recurrent_step fed row by row): runs of 1, 2, 3 and 4 rows of one sequence, padding
// rows (out stays NaN-poisoned), slots not in the batch untouched, uneven tiles (dk 32..256, dv not a
// multiple of 4 or of 16, a state pool not 16-byte aligned, conv kernels 1..4).
// Bitwise (memcmp): a sequence's rows inside a batch = the sequence alone = its rows fed one call at a
// time = the batch permuted; M = 1 = today's path (in_proj GEMV with the conv epilogue, then
// gdn_decode_step) given the raw in_proj rows, for both GEMV implementations; and the chain
// rows::stage → rows::gemv_rows → gdn_step_rows = today's chain per row.
// Rollback: a Log-mode step gives Advance's outputs bit for bit, leaves the state and conv state
// unchanged and logs the raw rows; gdn_commit_rows with keep = 0..R (and more than the log holds)
// leaves the state bit for bit where Advance over the first `keep` rows leaves it, for two layers and
// several sequences in one launch. A captured graph (verify in Log mode → commit → next step) replayed
// with the rows and the accepted counts changed between replays, checked against the CPU.
// Tolerance against the CPU: ‖Δ‖/‖ref‖ ≤ 1e-5 (fp32 throughout) for a row's output, unless the output
// cancels: o_j = Σ_i S_ij q_i is then far smaller than the terms it sums (q nearly orthogonal to the
// updated state), and any fp32 evaluation, the CPU reference included, is off from the exact value by
// ~eps · Σ_i |S_ij q_i|. The denominator is therefore max(‖o‖, ‖a‖ / 100), a_j = Σ_i |S_ij q_i| (the row's
// rounding envelope): the plain relative bound for every row whose condition ‖a‖ / ‖o‖ is ≤ 100 (random
// rows: 5–11), proportional to the envelope beyond. Seed 2410001318165662721 draws a row of condition 429
// (the fp32 CPU reference 9.5e-6 from a double evaluation, the kernel 1.15e-5 from the CPU): kept as a case.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "cpu/ops.h"
#include "cuda/kernels/gdn/gdn.h"
#include "cuda/kernels/gemv/gemv.h"
#include "cuda/kernels/sampling/sampling.h"
#include "cuda/kernels/rows/rows_mm.h"
#include "cuda/kernels/rows/rows_state.h"
#include "decode_test_util.h"

using namespace lilac;
namespace lc = lilac::cuda;
namespace lr = lilac::cuda::rows;

namespace {

using namespace lilac::cuda::testing;

struct Shape {
  int Hk, Hv, dk, dv, K;
};
const Shape kQwen{16, 32, 128, 128, 4};

bool same(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}
bool all_ff(const float* a, size_t n) {
  const auto* p = reinterpret_cast<const unsigned char*>(a);
  return std::all_of(p, p + n * sizeof(float), [](unsigned char c) { return c == 0xff; });
}
std::vector<float> slice(const std::vector<float>& v, int64_t at, int64_t n) {
  return std::vector<float>(v.begin() + at, v.begin() + at + n);
}

// One GDN layer: weights and host pools (state, conv state) of n_slots slots, strided with gaps.
struct Pool {
  Shape c;
  lr::GdnRowsShape rs;
  int n_slots, log_rows;
  int64_t conv_dim, state_elems, conv_elems, state_stride, conv_stride, log_stride, proj_stride, od;
  std::vector<float> conv_w, A, dt, S, C;
  Pool(Rng& r, Shape c_, int n_slots_, int log_rows_, int state_pad)
      : c(c_), rs{c_.Hk, c_.Hv, c_.dk, c_.dv, c_.K}, n_slots(n_slots_), log_rows(log_rows_) {
    conv_dim = rs.conv_dim();
    state_elems = int64_t(c.Hv) * c.dk * c.dv;
    conv_elems = conv_dim * (c.K - 1);
    state_stride = state_elems + state_pad;
    conv_stride = conv_elems + 3;
    log_stride = lr::gdn_log_floats(rs, log_rows) + 5;
    proj_stride = conv_dim + int64_t(c.Hv) * c.dv + 2 * c.Hv + 3;
    od = int64_t(c.Hv) * c.dv;
    conv_w.resize(size_t(conv_dim * c.K));
    for (auto& v : conv_w) v = r.uni(-0.5f, 0.5f);
    A.resize(static_cast<size_t>(c.Hv));
    dt.resize(static_cast<size_t>(c.Hv));
    for (auto& v : A) v = r.uni(-1.f, 1.f);
    for (auto& v : dt) v = r.uni(-1.f, 1.f);
    S = randv(r, size_t(n_slots * state_stride), 0.3f);
    C = randv(r, size_t(std::max<int64_t>(1, n_slots * conv_stride)));
  }
  std::vector<float> rows(Rng& r, int M) const { return randv(r, size_t(M * proj_stride)); }
  // CPU: one row (proj row x) of slot s: S, C advanced; o [Hv*dv]; *env = ‖a‖, a_j = Σ_i |S_ij q_i| over
  // the updated state (the envelope of the output's rounding error).
  void cpu_row(int s, const float* x, float* o, double* env = nullptr) {
    std::vector<float> qkv(static_cast<size_t>(conv_dim));
    double env2 = 0;
    cpu::conv1d_silu_step(conv_w.data(), conv_dim, c.K, C.data() + s * conv_stride, x, qkv.data());
    const float* b = x + conv_dim + od;
    const float* a = b + c.Hv;
    std::vector<float> beta(static_cast<size_t>(c.Hv)), g(static_cast<size_t>(c.Hv));
    cpu::gdn_gates(b, a, A.data(), dt.data(), c.Hv, beta.data(), g.data());
    for (int h = 0; h < c.Hv; ++h) {
      const int kh = h / (c.Hv / c.Hk);
      std::vector<float> q(qkv.begin() + int64_t(kh) * c.dk, qkv.begin() + int64_t(kh + 1) * c.dk);
      std::vector<float> k(qkv.begin() + int64_t(c.Hk + kh) * c.dk, qkv.begin() + int64_t(c.Hk + kh + 1) * c.dk);
      cpu::l2norm(q.data(), c.dk);
      cpu::l2norm(k.data(), c.dk);
      for (auto& v : q) v /= std::sqrt(float(c.dk));
      const float* v = qkv.data() + 2LL * c.Hk * c.dk + int64_t(h) * c.dv;
      float* Sh = S.data() + s * state_stride + int64_t(h) * c.dk * c.dv;
      cpu::gdn_recurrent_step(Sh, q.data(), k.data(), v, g[size_t(h)], beta[size_t(h)], c.dk, c.dv,
                              o + int64_t(h) * c.dv);
      for (int j = 0; env && j < c.dv; ++j) {
        double a = 0;
        for (int i = 0; i < c.dk; ++i) a += std::fabs(double(Sh[int64_t(i) * c.dv + j]) * q[size_t(i)]);
        env2 += a * a;
      }
    }
    if (env) *env = std::sqrt(env2);
  }
  // CPU over a batch: rows in order (each sequence's rows in order); out [M][od] (padding rows NaN); each
  // row's envelope in env.
  std::vector<float> cpu_rows(const std::vector<int>& slots, const std::vector<float>& proj) {
    std::vector<float> out(slots.size() * size_t(od), NAN);
    env.assign(slots.size(), 0.0);
    for (size_t i = 0; i < slots.size(); ++i)
      if (slots[i] >= 0)
        cpu_row(slots[i], proj.data() + int64_t(i) * proj_stride, out.data() + int64_t(i) * od, &env[i]);
    return out;
  }
  std::vector<double> env;  // of the last cpu_rows
  // Row i of a batch output against cpu_rows' reference: ‖Δ‖ / max(‖ref‖, env / 100) (file header).
  double row_err(const std::vector<float>& got, const std::vector<float>& ref, int64_t i) const {
    const auto g = slice(got, i * od, od), r = slice(ref, i * od, od);
    double num = 0, den = 0;
    for (size_t j = 0; j < r.size(); ++j) {
      if (!std::isfinite(g[j])) return INFINITY;
      num += (double(g[j]) - r[j]) * (double(g[j]) - r[j]);
      den += double(r[j]) * r[j];
    }
    return std::sqrt(num) / std::max({std::sqrt(den), env[size_t(i)] / 100, 1e-30});
  }
};

// Device copy of a Pool.
struct DevPool {
  Dev<float> conv_w, A, dt, S, C, log;
  Dev<unsigned> sync;  // conv_sync counters: zeroed here, must be left zeroed by every launch
  DevPool(const Pool& p, int state_offset = 0)
      : conv_w(p.conv_w),
        A(p.A),
        dt(p.dt),
        S(p.S.size() + size_t(state_offset)),
        C(p.C),
        log(size_t(p.n_slots * p.log_stride)),
        sync(std::vector<unsigned>(size_t(p.n_slots * p.c.Hk), 0u)),
        off(state_offset) {
    reset(p);
    log.poison();
  }
  int off;
  float* state() { return S.p + off; }
  void reset(const Pool& p) {
    CK_VOID(cudaMemcpy(state(), p.S.data(), p.S.size() * 4, cudaMemcpyHostToDevice));
    C.set(p.C);
  }
  std::vector<float> state_host(const Pool& p) const {
    std::vector<float> v(p.S.size());
    cudaMemcpy(v.data(), S.p + off, v.size() * 4, cudaMemcpyDeviceToHost);
    return v;
  }
  lr::GdnLayer layer() { return {conv_w.p, A.p, dt.p, state(), C.p, log.p, sync.p}; }
  bool sync_zero() const {
    const auto v = sync.get();
    return std::all_of(v.begin(), v.end(), [](unsigned x) { return x == 0; });
  }
  static void CK_VOID(cudaError_t e) { EXPECT_EQ(e, cudaSuccess); }
};
lr::GdnPool pool_of(const Pool& p) { return {p.state_stride, p.conv_stride, p.log_stride, p.log_rows}; }

// One gdn_step_rows; returns out [M][od] (poisoned before: padding rows stay NaN-bytes).
std::vector<float> gpu_step(const Pool& p, DevPool& d, const std::vector<int>& slots, const std::vector<float>& proj,
                            lr::GdnMode mode) {
  const int M = int(slots.size());
  Dev<int32_t> ds(std::vector<int32_t>(slots.begin(), slots.end()));
  Dev<float> dp(proj), out(size_t(M * p.od));
  out.poison();
  Dev<float> cv(size_t(lr::gdn_conv_rows_floats(p.rs, M)));
  lr::gdn_step_rows(p.rs, d.layer(), pool_of(p), M, ds.p, dp.p, p.proj_stride, out.p, p.od, mode, cv.p, nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return out.get();
}

// Runs the batch on the GPU and the CPU (p is advanced) and compares everything.
void check_batch(Pool& p, DevPool& d, const std::vector<int>& slots, const std::vector<float>& proj) {
  const auto before_S = p.S, before_C = p.C;
  const auto got = gpu_step(p, d, slots, proj, lr::GdnMode::Advance);
  const auto ref = p.cpu_rows(slots, proj);
  for (size_t i = 0; i < slots.size(); ++i) {
    SCOPED_TRACE("row " + std::to_string(i) + " slot " + std::to_string(slots[i]));
    if (slots[i] < 0)
      EXPECT_TRUE(all_ff(got.data() + int64_t(i) * p.od, size_t(p.od))) << "padding row written";
    else
      EXPECT_LE(p.row_err(got, ref, int64_t(i)), 1e-5);
  }
  const auto S = d.state_host(p), C = d.C.get();
  for (int s = 0; s < p.n_slots; ++s) {
    SCOPED_TRACE("slot " + std::to_string(s));
    const bool used = std::find(slots.begin(), slots.end(), s) != slots.end();
    const auto gs = slice(S, s * p.state_stride, p.state_stride), gc = slice(C, s * p.conv_stride, p.conv_stride);
    if (!used) {
      EXPECT_TRUE(same(gs, slice(before_S, s * p.state_stride, p.state_stride))) << "state of an idle slot";
      EXPECT_TRUE(same(gc, slice(before_C, s * p.conv_stride, p.conv_stride))) << "conv state of an idle slot";
      continue;
    }
    EXPECT_LE(rel_err(slice(gs, 0, p.state_elems), slice(p.S, s * p.state_stride, p.state_elems)), 1e-5);
    EXPECT_TRUE(same(slice(gs, p.state_elems, p.state_stride - p.state_elems),
                     slice(before_S, s * p.state_stride + p.state_elems, p.state_stride - p.state_elems)))
        << "the gap after a state";
    EXPECT_TRUE(same(gc, slice(p.C, s * p.conv_stride, p.conv_stride))) << "conv state (copies of inputs: exact)";
  }
}

// A mixed batch: one row of slot 2, padding, 4 rows of slot 0, one of slot 5, 2 of slot 1, padding.
const std::vector<int> kMixed{2, -1, 0, 0, 0, 0, 5, 1, 1, -1};

void mixed_runs_match_cpu(uint64_t seed) {
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng r(seed);
  struct Case {
    Shape c;
    int pad, offset;
  };
  const Case cases[] = {{kQwen, 4, 0},
                        {{1, 2, 32, 48, 4}, 0, 0},
                        {{2, 8, 32, 52, 3}, 4, 0},
                        {{1, 3, 96, 20, 2}, 0, 0},
                        {{1, 4, 200, 64, 4}, 8, 0},
                        {{2, 2, 256, 128, 4}, 0, 0},
                        {{2, 6, 48, 7, 1}, 1, 0},
                        {{1, 1, 256, 33, 4}, 0, 0},
                        {{2, 4, 64, 48, 4}, 0, 1},
                        {{4, 8, 128, 128, 4}, 1, 0}};  // the last two: not 16-byte aligned → scalar columns
  for (const Case& k : cases) {
    const Shape c = k.c;
    SCOPED_TRACE("Hk " + std::to_string(c.Hk) + " Hv " + std::to_string(c.Hv) + " dk " + std::to_string(c.dk) + " dv " +
                 std::to_string(c.dv) + " K " + std::to_string(c.K) + " pad " + std::to_string(k.pad) + " offset " +
                 std::to_string(k.offset));
    Pool p(r, c, 7, 4, k.pad);
    DevPool d(p, k.offset);
    for (int step = 0; step < 2; ++step) {  // twice: the second step starts from the first's states
      SCOPED_TRACE("step " + std::to_string(step));
      check_batch(p, d, kMixed, p.rows(r, int(kMixed.size())));
    }
  }
}

TEST(CudaRowsGdn, MixedRunsMatchCpu) {
  NEED_GPU();
  mixed_runs_match_cpu(fresh_seed());
}

// A seed whose draw has a row of condition 429 (case Hk 1, Hv 1, dk 256, dv 33, step 0, row 4): it failed
// the plain relative bound, which no fp32 evaluation meets there (file header).
TEST(CudaRowsGdn, MixedRunsMatchCpuWhenTheOutputCancels) {
  NEED_GPU();
  mixed_runs_match_cpu(2410001318165662721ull);
}

// Rows of kMixed that belong to sequence `slot`, in order.
std::vector<int> rows_of(const std::vector<int>& slots, int slot) {
  std::vector<int> v;
  for (size_t i = 0; i < slots.size(); ++i)
    if (slots[i] == slot) v.push_back(int(i));
  return v;
}
std::vector<float> gather(const Pool& p, const std::vector<float>& proj, const std::vector<int>& rows) {
  std::vector<float> v;
  for (const int i : rows) v.insert(v.end(), proj.begin() + i * p.proj_stride, proj.begin() + (i + 1) * p.proj_stride);
  return v;
}

TEST(CudaRowsGdn, RowsAreBatchInvariantAndRunsEqualRowByRow) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng r(seed);
  Pool p(r, kQwen, 7, 4, 4);
  DevPool d(p);
  const auto proj = p.rows(r, int(kMixed.size()));
  const auto out = gpu_step(p, d, kMixed, proj, lr::GdnMode::Advance);
  const auto S1 = d.state_host(p), C1 = d.C.get();
  auto check_slot = [&](int s, const char* what) {
    EXPECT_TRUE(
        same(slice(d.state_host(p), s * p.state_stride, p.state_stride), slice(S1, s * p.state_stride, p.state_stride)))
        << what << ": state of slot " << s;
    EXPECT_TRUE(same(slice(d.C.get(), s * p.conv_stride, p.conv_stride), slice(C1, s * p.conv_stride, p.conv_stride)))
        << what << ": conv state of slot " << s;
  };
  for (const int s : {2, 0, 5, 1}) {
    SCOPED_TRACE("sequence in slot " + std::to_string(s));
    const auto rows = rows_of(kMixed, s);
    // the sequence alone (all its rows in one call)
    d.reset(p);
    const auto alone = gpu_step(p, d, std::vector<int>(rows.size(), s), gather(p, proj, rows), lr::GdnMode::Advance);
    for (size_t j = 0; j < rows.size(); ++j)
      EXPECT_TRUE(same(slice(alone, int64_t(j) * p.od, p.od), slice(out, rows[j] * p.od, p.od))) << "alone, row " << j;
    check_slot(s, "alone");
    // its rows one call at a time
    d.reset(p);
    for (size_t j = 0; j < rows.size(); ++j) {
      const auto one = gpu_step(p, d, {s}, gather(p, proj, {rows[j]}), lr::GdnMode::Advance);
      EXPECT_TRUE(same(one, slice(out, rows[j] * p.od, p.od))) << "row by row, row " << j;
    }
    check_slot(s, "row by row");
  }
  // the sequences in reverse order, padding first
  const std::vector<int> order{-1, 7, 8, 6, 2, 3, 4, 5, 0};  // kMixed rows (-1: a padding row)
  std::vector<int> slots;
  std::vector<float> pproj;
  for (const int i : order) {
    slots.push_back(i < 0 ? -1 : kMixed[size_t(i)]);
    const auto row = i < 0 ? std::vector<float>(size_t(p.proj_stride), 0.f) : gather(p, proj, {i});
    pproj.insert(pproj.end(), row.begin(), row.end());
  }
  d.reset(p);
  const auto perm = gpu_step(p, d, slots, pproj, lr::GdnMode::Advance);
  for (size_t j = 0; j < order.size(); ++j) {
    if (order[j] < 0) continue;
    EXPECT_TRUE(same(slice(perm, int64_t(j) * p.od, p.od), slice(out, order[j] * p.od, p.od))) << "permuted, row " << j;
  }
  for (const int s : {2, 0, 5, 1}) check_slot(s, "permuted");
}

// M = 1 against today's path: in_proj GEMV with the conv epilogue (on conv state A) + gdn_decode_step
// (state A) vs the GEMV without the epilogue + gdn_step_rows (pool slot with state B = A), three steps.
TEST(CudaRowsGdn, OneRowEqualsTodaysEpilogueAndStep) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng r(seed);
  const Shape c = kQwen;
  const int64_t H = 256;
  for (const lc::GemvImpl impl : {lc::GemvImpl::Tensor, lc::GemvImpl::Fp32}) {
    SCOPED_TRACE(impl == lc::GemvImpl::Tensor ? "tensor-core GEMV" : "fp32 GEMV");
    Pool p(r, c, 2, 1, 0);
    const int64_t in_rows = p.conv_dim + p.od + 2 * c.Hv;
    p.proj_stride = in_rows;
    HostQ W(r, in_rows, H, 4);
    DevQ dW(W);
    DevPool d(p);
    Dev<float> stA(static_cast<size_t>(p.state_elems)), cvA(static_cast<size_t>(p.conv_elems)),
        yA(static_cast<size_t>(in_rows)), yB(static_cast<size_t>(in_rows)), oA(static_cast<size_t>(p.od)),
        oB(static_cast<size_t>(p.od));
    CK(cudaMemcpy(stA.p, d.state() + 1 * p.state_stride, size_t(p.state_elems) * 4, cudaMemcpyDeviceToDevice));
    CK(cudaMemcpy(cvA.p, d.C.p + 1 * p.conv_stride, size_t(p.conv_elems) * 4, cudaMemcpyDeviceToDevice));
    Dev<int32_t> slot1(std::vector<int32_t>{1});
    for (int step = 0; step < 3; ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      Dev<float> x(randv(r, size_t(H)));
      lc::GemvArgs g;
      g.W = dW.d;
      g.x = x.p;
      g.impl = impl;
      g.y = yB.p;  // raw
      lc::gemv(g, nullptr);
      g.y = yA.p;  // with the conv epilogue
      g.conv_rows = int(p.conv_dim);
      g.conv_k = c.K;
      g.conv_w = d.conv_w.p;
      g.conv_state = cvA.p;
      lc::gemv(g, nullptr);
      const float* b = yA.p + p.conv_dim + p.od;
      lc::gdn_decode_step({c.Hk, c.Hv, c.dk, c.dv}, yA.p, b, b + c.Hv, d.A.p, d.dt.p, stA.p, oA.p, nullptr);
      Dev<float> cv1(size_t(lr::gdn_conv_rows_floats(p.rs, 1)));
      lr::gdn_step_rows(p.rs, d.layer(), pool_of(p), 1, slot1.p, yB.p, in_rows, oB.p, p.od, lr::GdnMode::Advance,
                        cv1.p, nullptr);
      CK(cudaDeviceSynchronize());
      const auto ya = yA.get(), yb = yB.get();
      EXPECT_TRUE(same(slice(ya, p.conv_dim, in_rows - p.conv_dim), slice(yb, p.conv_dim, in_rows - p.conv_dim)))
          << "z, b, a differ between the GEMV with and without the epilogue";
      EXPECT_TRUE(same(oA.get(), oB.get())) << "output";
      EXPECT_TRUE(same(stA.get(), slice(d.state_host(p), p.state_stride, p.state_elems))) << "state";
      EXPECT_TRUE(same(cvA.get(), slice(d.C.get(), p.conv_stride, p.conv_elems))) << "conv state";
    }
  }
}

// The GDN part of a layer as the integrator chains it — rows::stage (input RMSNorm) → rows::gemv_rows
// (in_proj, no epilogue) → gdn_step_rows — against today's chain per row, in order (gemv with the
// RMSNorm prologue and the conv epilogue, then gdn_decode_step, on per-slot copies of the states):
// the same bytes for the outputs, the states and the conv states (a 2-row run and a padding row).
TEST(CudaRowsGdn, LayerChainEqualsTodaysPerRow) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng r(seed);
  const Shape c = kQwen;
  const int64_t H = 512;
  const std::vector<int> slots{2, 0, 0, -1, 3};
  const int M = int(slots.size());
  Pool p(r, c, 4, 1, 0);
  const int64_t in_rows = p.conv_dim + p.od + 2 * c.Hv;
  p.proj_stride = in_rows;
  HostQ W(r, in_rows, H, 4);
  DevQ dW(W);
  DevPool d(p);
  std::vector<float> nw(static_cast<size_t>(H));
  for (auto& v : nw) v = r.uni(0.8f, 1.2f);
  const auto x = randv(r, size_t(M * H));
  Dev<float> dx(x), dnw(nw), y(size_t(M * in_rows)), out(size_t(M * p.od));
  Dev<int32_t> dslot(std::vector<int32_t>(slots.begin(), slots.end()));
  Dev<char> frag(lr::frag_row_bytes(H) * M);
  Dev<float2> meta(lr::meta_row_count(H) * M);
  out.poison();
  lr::StageArgs sa;
  sa.x = dx.p;
  sa.K = H;
  sa.M = M;
  sa.row_slot = dslot.p;
  sa.pro = lc::Prologue::RmsNorm;
  sa.norm_w = dnw.p;
  sa.frag4g = frag.p;
  sa.meta = meta.p;
  lr::stage(sa, nullptr);
  lr::GemvRowsArgs ga;
  ga.W = dW.d;
  ga.frag = frag.p;
  ga.meta = meta.p;
  ga.M = M;
  ga.row_slot = dslot.p;
  ga.y = y.p;
  lr::gemv_rows(ga, nullptr);
  Dev<float> conv_out(size_t(lr::gdn_conv_rows_floats(p.rs, M)));
  lr::gdn_step_rows(p.rs, d.layer(), pool_of(p), M, dslot.p, y.p, in_rows, out.p, p.od, lr::GdnMode::Advance,
                    conv_out.p, nullptr);
  CK(cudaDeviceSynchronize());
  const auto got = out.get(), S = d.state_host(p), C = d.C.get(), yrows = y.get();
  // today's chain, row by row, on per-slot copies of the initial states
  Dev<float> st(p.S), cv(p.C), yt(static_cast<size_t>(in_rows)), o(static_cast<size_t>(p.od)),
      xr(static_cast<size_t>(H));
  for (int i = 0; i < M; ++i) {
    const int s = slots[size_t(i)];
    if (s < 0) {
      EXPECT_TRUE(all_ff(got.data() + i * p.od, size_t(p.od))) << "padding row written";
      continue;
    }
    xr.set(std::vector<float>(x.begin() + i * H, x.begin() + (i + 1) * H));
    lc::GemvArgs g;
    g.W = dW.d;
    g.x = xr.p;
    g.y = yt.p;
    g.pro = lc::Prologue::RmsNorm;
    g.norm_w = dnw.p;
    g.conv_rows = int(p.conv_dim);
    g.conv_k = c.K;
    g.conv_w = d.conv_w.p;
    g.conv_state = cv.p + s * p.conv_stride;
    g.impl = lc::GemvImpl::Tensor;
    lc::gemv(g, nullptr);
    const float* b = yt.p + p.conv_dim + p.od;
    lc::gdn_decode_step({c.Hk, c.Hv, c.dk, c.dv}, yt.p, b, b + c.Hv, d.A.p, d.dt.p, st.p + s * p.state_stride, o.p,
                        nullptr);
    CK(cudaDeviceSynchronize());
    EXPECT_TRUE(same(slice(yt.get(), p.conv_dim, in_rows - p.conv_dim),
                     slice(yrows, i * in_rows + p.conv_dim, in_rows - p.conv_dim)))
        << "z, b, a of row " << i << ": gemv_rows differs from gemv (not this family's kernels)";
    EXPECT_TRUE(same(o.get(), slice(got, i * p.od, p.od))) << "output of row " << i;
  }
  EXPECT_TRUE(same(st.get(), S)) << "states";
  EXPECT_TRUE(same(cv.get(), C)) << "conv states";
}

// Log mode + commit, two layers and three verifying sequences (4, 3 and 1 rows) and a padding row.
TEST(CudaRowsGdn, LogAndCommitRollBackToEveryRow) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng r(seed);
  const int kLog = 4;
  const std::vector<int> slots{1, 1, 1, 1, -1, 3, 3, 3, 0};
  const int M = int(slots.size());
  std::vector<Pool> P;
  P.emplace_back(r, kQwen, 4, kLog, 4);
  P.emplace_back(r, kQwen, 4, kLog, 4);
  DevPool d0(P[0]), d1(P[1]);
  DevPool* D[2] = {&d0, &d1};
  std::vector<std::vector<float>> proj{P[0].rows(r, M), P[1].rows(r, M)};
  std::vector<std::vector<float>> adv(2);
  for (int l = 0; l < 2; ++l) {
    adv[size_t(l)] = gpu_step(P[size_t(l)], *D[size_t(l)], slots, proj[size_t(l)], lr::GdnMode::Advance);
    D[size_t(l)]->reset(P[size_t(l)]);
    const auto lg = gpu_step(P[size_t(l)], *D[size_t(l)], slots, proj[size_t(l)], lr::GdnMode::Log);
    EXPECT_TRUE(same(lg, adv[size_t(l)])) << "Log-mode outputs differ from Advance, layer " << l;
    EXPECT_TRUE(same(D[size_t(l)]->state_host(P[size_t(l)]), P[size_t(l)].S)) << "Log mode wrote the state";
    EXPECT_TRUE(same(D[size_t(l)]->C.get(), P[size_t(l)].C)) << "Log mode wrote the conv state";
    // the log: raw [qkv | b | a] of each row of each sequence
    const auto log = D[size_t(l)]->log.get();
    const Pool& p = P[size_t(l)];
    for (const int s : {1, 3, 0}) {
      const auto rows = rows_of(slots, s);
      for (size_t j = 0; j < rows.size(); ++j) {
        const float* x = proj[size_t(l)].data() + rows[j] * p.proj_stride;
        std::vector<float> want(x, x + p.conv_dim);
        want.insert(want.end(), x + p.conv_dim + p.od, x + p.conv_dim + p.od + 2 * p.c.Hv);
        EXPECT_TRUE(
            same(slice(log, s * p.log_stride + int64_t(j) * p.rs.log_row_floats(), p.rs.log_row_floats()), want))
            << "log row " << j << " of slot " << s;
      }
    }
  }
  std::vector<lr::GdnLayer> layers{d0.layer(), d1.layer()};
  const std::vector<int32_t> seq_slot{1, 3, 0, -1, 2};
  for (int a = 0; a <= 5; ++a) {
    const std::vector<int32_t> keep{a, (a + 1) % 4, a % 2, 3, 0};  // a = 5: more than the log holds
    SCOPED_TRACE("keep " + std::to_string(keep[0]) + "," + std::to_string(keep[1]) + "," + std::to_string(keep[2]));
    for (int l = 0; l < 2; ++l) D[size_t(l)]->reset(P[size_t(l)]);  // the state the Log step left
    Dev<int32_t> ds(seq_slot), dk(keep);
    lr::gdn_commit_rows(P[0].rs, layers.data(), 2, pool_of(P[0]), int(seq_slot.size()), ds.p, dk.p, nullptr);
    CK(cudaDeviceSynchronize());
    std::vector<std::vector<float>> S(2), C(2);
    for (int l = 0; l < 2; ++l) {
      S[size_t(l)] = D[size_t(l)]->state_host(P[size_t(l)]);
      C[size_t(l)] = D[size_t(l)]->C.get();
    }
    // expected: Advance over the kept rows only, from the same start
    std::vector<int> kept;
    for (size_t q = 0; q < 3; ++q) {
      const auto rows = rows_of(slots, seq_slot[q]);
      for (int j = 0; j < std::min<int>(keep[q], std::min<int>(kLog, int(rows.size()))); ++j)
        kept.push_back(rows[size_t(j)]);
    }
    for (int l = 0; l < 2; ++l) {
      SCOPED_TRACE("layer " + std::to_string(l));
      Pool& p = P[size_t(l)];
      DevPool& d = *D[size_t(l)];
      d.reset(p);
      if (!kept.empty()) {
        std::vector<int> ks;
        for (const int i : kept) ks.push_back(slots[size_t(i)]);
        gpu_step(p, d, ks, gather(p, proj[size_t(l)], kept), lr::GdnMode::Advance);
      }
      EXPECT_TRUE(same(S[size_t(l)], d.state_host(p))) << "state after commit";
      EXPECT_TRUE(d.sync_zero()) << "conv_sync counters not left zeroed";
      EXPECT_TRUE(same(C[size_t(l)], d.C.get())) << "conv state after commit";
      if (a == 2) {  // and once against the CPU
        Pool cp = p;
        std::vector<int> ks;
        for (const int i : kept) ks.push_back(slots[size_t(i)]);
        cp.cpu_rows(ks, gather(p, proj[size_t(l)], kept));
        for (const int s : {1, 3, 0, 2})
          EXPECT_LE(rel_err(slice(S[size_t(l)], s * p.state_stride, p.state_elems),
                            slice(cp.S, s * p.state_stride, p.state_elems)),
                    1e-5)
              << "slot " << s;
      }
    }
  }
}

// The verification cycle as a captured graph, replayed: Log step of both layers (an unrelated PDL
// kernel between launches, as in a decode step) → commit with the accepted counts from device
// memory → one Advance step of both layers on other rows. Rows, inputs and counts change by host
// copies between replays; every replay is checked against the CPU model of the same cycle.
TEST(CudaRowsGdn, GraphReplaysOfVerifyCommitStep) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng r(seed);
  const Shape c{4, 8, 128, 128, 4};
  const int kLog = 4, M = 6, n_seq = 3;
  std::vector<Pool> P;
  P.emplace_back(r, c, 4, kLog, 4);
  P.emplace_back(r, c, 4, kLog, 4);
  DevPool d0(P[0]), d1(P[1]);
  DevPool* D[2] = {&d0, &d1};
  Dev<int32_t> vslot(static_cast<size_t>(M)), aslot(static_cast<size_t>(M)), sslot(static_cast<size_t>(n_seq)),
      skeep(static_cast<size_t>(n_seq)), counter(std::vector<int32_t>{0});
  Dev<float> vproj0(size_t(M * P[0].proj_stride)), vproj1(vproj0.n), aproj0(vproj0.n), aproj1(vproj0.n);
  Dev<float> vout(size_t(M * P[0].od)), aout(vout.n);
  Dev<float> gcv(size_t(lr::gdn_conv_rows_floats(P[0].rs, M)));  // conv scratch, shared by the layers
  Dev<float>* vproj[2] = {&vproj0, &vproj1};
  Dev<float>* aproj[2] = {&aproj0, &aproj1};
  std::vector<lr::GdnLayer> layers{d0.layer(), d1.layer()};
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  for (int l = 0; l < 2; ++l) {
    lr::gdn_step_rows(P[size_t(l)].rs, D[l]->layer(), pool_of(P[size_t(l)]), M, vslot.p, vproj[l]->p,
                      P[size_t(l)].proj_stride, vout.p, P[size_t(l)].od, lr::GdnMode::Log, gcv.p, st);
    lc::increment_i32(counter.p, st);
  }
  lr::gdn_commit_rows(P[0].rs, layers.data(), 2, pool_of(P[0]), n_seq, sslot.p, skeep.p, st);
  lc::increment_i32(counter.p, st);
  for (int l = 0; l < 2; ++l) {
    lr::gdn_step_rows(P[size_t(l)].rs, D[l]->layer(), pool_of(P[size_t(l)]), M, aslot.p, aproj[l]->p,
                      P[size_t(l)].proj_stride, aout.p, P[size_t(l)].od, lr::GdnMode::Advance, gcv.p, st);
    lc::increment_i32(counter.p, st);
  }
  CK(cudaStreamEndCapture(st, &graph));
  CK(cudaGraphInstantiate(&exec, graph, 0));
  struct Replay {
    std::vector<int> vrows, arows;
    std::vector<int32_t> sslot, keep;
  };
  const std::vector<Replay> replays = {
      {{0, 0, 0, 0, 2, 2}, {0, 2, 1, -1, -1, -1}, {0, 2, -1}, {2, 1, 0}},
      {{1, 1, 1, -1, 3, 3}, {3, 1, 2, 2, 0, -1}, {1, 3, -1}, {3, 2, 0}},
      {{2, 2, 0, 0, 0, 0}, {0, 0, 2, -1, -1, 3}, {2, 0, -1}, {0, 4, 0}},
      {{3, 3, 3, 3, -1, -1}, {3, 3, 3, 1, 1, 0}, {3, -1, -1}, {9, 0, 0}},  // 9: more than the log holds
  };
  for (size_t t = 0; t < replays.size(); ++t) {
    SCOPED_TRACE("replay " + std::to_string(t));
    const Replay& rp = replays[t];
    vslot.set(std::vector<int32_t>(rp.vrows.begin(), rp.vrows.end()));
    aslot.set(std::vector<int32_t>(rp.arows.begin(), rp.arows.end()));
    sslot.set(rp.sslot);
    skeep.set(rp.keep);
    std::vector<std::vector<float>> vp(2), ap(2);
    for (int l = 0; l < 2; ++l) {
      vp[size_t(l)] = P[size_t(l)].rows(r, M);
      ap[size_t(l)] = P[size_t(l)].rows(r, M);
      vproj[l]->set(vp[size_t(l)]);
      aproj[l]->set(ap[size_t(l)]);
    }
    vout.poison();
    aout.poison();
    CK(cudaGraphLaunch(exec, st));
    CK(cudaStreamSynchronize(st));
    // CPU: verify outputs from the states before (layer 1's outputs are in vout: the last writer),
    // then the kept rows, then the Advance rows
    for (int l = 0; l < 2; ++l) {
      SCOPED_TRACE("layer " + std::to_string(l));
      Pool& p = P[size_t(l)];
      Pool tmp = p;
      const auto vref = tmp.cpu_rows(rp.vrows, vp[size_t(l)]);
      if (l == 1) {
        const auto got = vout.get();
        for (int i = 0; i < M; ++i) {
          if (rp.vrows[size_t(i)] < 0) continue;
          EXPECT_LE(tmp.row_err(got, vref, i), 1e-5) << "verify row " << i;
        }
      }
      for (int q = 0; q < n_seq; ++q) {
        if (rp.sslot[size_t(q)] < 0) continue;
        const auto rows = rows_of(rp.vrows, rp.sslot[size_t(q)]);
        const int keep = std::min<int>(rp.keep[size_t(q)], std::min<int>(kLog, int(rows.size())));
        for (int j = 0; j < keep; ++j) {
          std::vector<float> o(static_cast<size_t>(p.od));
          p.cpu_row(rp.sslot[size_t(q)], vp[size_t(l)].data() + rows[size_t(j)] * p.proj_stride, o.data());
        }
      }
      const auto aref = p.cpu_rows(rp.arows, ap[size_t(l)]);
      if (l == 1) {
        const auto got = aout.get();
        for (int i = 0; i < M; ++i) {
          if (rp.arows[size_t(i)] < 0)
            EXPECT_TRUE(all_ff(got.data() + i * p.od, size_t(p.od)));
          else
            EXPECT_LE(p.row_err(got, aref, i), 1e-5) << "step row " << i;
        }
      }
      const auto S = D[l]->state_host(p);
      for (int s = 0; s < p.n_slots; ++s)
        EXPECT_LE(rel_err(slice(S, s * p.state_stride, p.state_elems), slice(p.S, s * p.state_stride, p.state_elems)),
                  1e-5)
            << "state of slot " << s;
      EXPECT_TRUE(same(D[l]->C.get(), p.C)) << "conv states (copies of inputs: exact)";
    }
  }
  EXPECT_EQ(counter.get()[0], int(5 * replays.size()));
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  CK(cudaStreamDestroy(st));
}

}  // namespace
