// Multi-row MoE (rows_mm.h: moe_route_rows, moe_gate_up_rows, moe_down_rows, moe_combine_rows) against the
// CPU reference on random inputs (NaN-poisoned act, sentinel-filled padding), at the model's shape (256
// experts, top 8, H 2048, I = Is = 512) and odd ones; every row's routing, act and output bit for bit equal
// to today's single-row kernels (moe_gate_up + moe_down) on that row alone where the expert width is a
// multiple of 256 (else within 1e-6); batch invariance by memcmp (a row alone and inside M = 2, 7, 16, 64,
// padding rows untouched); the grouping by expert read back from the scratch; a PDL chain in a CUDA graph. And the
// digits MoE (digits/moe_digits.h): its rows kernels bit for bit its one-row kernels per row, near the CPU.
#include <gtest/gtest.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <string>
#include <vector>

#include "cpu/ops.h"
#include "cuda/kernels/digits/moe_digits.h"
#include "cuda/kernels/gemv/gemv.h"
#include "cuda/kernels/rows/moe_rows.cuh"
#include "cuda/kernels/rows/rows_mm.h"
#include "decode_test_util.h"
#include "rows_test_util.h"

using namespace lilac;
namespace lc = lilac::cuda;
namespace lr = lilac::cuda::rows;
using namespace lilac::cuda::testing;

namespace {

struct MoECase {
  int E, k;
  int64_t H, I, Is;
  int bits = 4;  // the experts' (the router and shared expert gate stay 8-bit)
};

// Host + device weights of one MoE layer (router [E, H] and shared expert gate [1, H] 8-bit).
struct MoEFixture {
  MoECase c;
  HostQ gate, up, down, sg, su, sd, router, seg;
  DevMoE dev;
  DevQ drouter, dseg;
  std::vector<float> nw;
  Dev<float> dnw;
  MoEFixture(Rng& r, const MoECase& cs)
      : c(cs), gate(r, cs.I * cs.E, cs.H, cs.bits), up(r, cs.I * cs.E, cs.H, cs.bits), down(r, cs.H * cs.E, cs.I, cs.bits),
        sg(r, cs.Is, cs.H, cs.bits), su(r, cs.Is, cs.H, cs.bits), sd(r, cs.H, cs.Is, cs.bits), router(r, cs.E, cs.H, 8),
        seg(r, 1, cs.H, 8), dev(gate, up, down, sg, su, sd, cs.E, cs.k, cs.I, cs.H), drouter(router), dseg(seg),
        nw(norm(r, cs.H)), dnw(nw) {}
  static std::vector<float> norm(Rng& r, int64_t H) {
    std::vector<float> v(static_cast<size_t>(H));
    for (auto& x : v) x = r.uni(0.7f, 1.3f);
    return v;
  }
  int64_t act_ld() const { return c.k * c.I + c.Is; }
  QMatrix expert(const HostQ& h, int e, int64_t rows) const {
    QExperts x;
    x.n = c.E;
    x.first = h.m;
    x.first.rows = rows;
    return x.expert(e);
  }
  // x̃ = RMSNorm(h; nw) and the router logits [E + 1] of one row, on the CPU
  void logits_cpu(const float* h, float* xn, float* logits) const {
    cpu::rmsnorm(h, nw.data(), c.H, 1e-6f, xn);
    cpu::qmatvec(router.m, xn, logits);
    cpu::qmatvec(seg.m, xn, logits + c.E);
  }
  // Σ_j w_j down_e(silu(gate_e x̃) up_e x̃) + sigmoid(logit E) shared(x̃), the routing from `logits`
  std::vector<float> moe_cpu(const float* xn, const float* logits) const {
    std::vector<int> ids(static_cast<size_t>(c.k));
    std::vector<float> wts(static_cast<size_t>(c.k));
    cpu::moe_route(logits, c.E, c.k, true, ids.data(), wts.data());
    std::vector<float> y(static_cast<size_t>(c.H), 0.f), t(static_cast<size_t>(c.H));
    auto expert_out = [&](const QMatrix& G, const QMatrix& U, const QMatrix& D, float w) {
      std::vector<float> g(static_cast<size_t>(G.rows)), u(g.size());
      cpu::qmatvec(G, xn, g.data());
      cpu::qmatvec(U, xn, u.data());
      for (size_t i = 0; i < g.size(); ++i) g[i] = cpu::silu(g[i]) * u[i];
      cpu::qmatvec(D, g.data(), t.data());
      for (int64_t i = 0; i < c.H; ++i) y[size_t(i)] += w * t[size_t(i)];
    };
    for (int j = 0; j < c.k; ++j)
      expert_out(expert(gate, ids[size_t(j)], c.I), expert(up, ids[size_t(j)], c.I), expert(down, ids[size_t(j)], c.H),
                 wts[size_t(j)]);
    expert_out(sg.m, su.m, sd.m, 1.f / (1.f + std::exp(-logits[c.E])));
    return y;
  }
};

// Device buffers of one multi-row MoE run; run() = stage + route + gate/up + down + combine.
struct RowsMoERun {
  const MoEFixture& f;
  int M;
  Dev<float> h, logits, act, selw, y;
  Dev<int32_t> sel, slot;
  Dev<char> frag, scratch;
  Dev<float2> meta;
  RowsMoERun(const MoEFixture& fx, int m, const std::vector<float>& hv, const std::vector<float>& lg,
             const std::vector<float>& y0, const std::vector<int32_t>& slots)
      : f(fx), M(m), h(hv), logits(lg), act(size_t(m) * fx.act_ld()), selw(size_t(m) * (fx.c.k + 1)), y(y0),
        sel(size_t(m) * fx.c.k), slot(slots.empty() ? std::vector<int32_t>(1) : slots),
        frag(lr::frag_row_bytes(fx.c.H) * size_t(m)), scratch(lr::moe_rows_scratch_bytes(fx.dev.w, m)),
        meta(lr::meta_row_count(fx.c.H) * size_t(m)) {
    has_slots = !slots.empty();
  }
  bool has_slots = false;
  const int32_t* slots() const { return has_slots ? slot.p : nullptr; }
  // the input in the experts' layout (frag), and in the 8-bit layout for the router when frag8 is given
  void stage(cudaStream_t s, void* frag8 = nullptr) {
    lr::StageArgs a;
    a.x = h.p;
    a.K = f.c.H;
    a.M = M;
    a.row_slot = slots();
    a.pro = lc::Prologue::RmsNorm;
    a.norm_w = f.dnw.p;
    if (f.c.bits == 4) {
      a.frag4 = frag.p;
      a.frag8 = frag8;
    } else {
      EXPECT_EQ(frag8, nullptr) << "8-bit experts: the router reads their layout";
      a.frag8 = frag.p;
    }
    a.meta = meta.p;
    lr::stage(a, s);
  }
  void experts(cudaStream_t s) {  // route, gate/up, down: the combine's input in the scratch
    const auto& w = f.dev.w;
    lr::moe_route_rows(w, logits.p, f.c.E + 1, M, slots(), sel.p, selw.p, scratch.p, s);
    lr::moe_gate_up_rows(w, frag.p, meta.p, M, scratch.p, act.p, s);
    lr::moe_down_rows(w, act.p, M, scratch.p, s);
  }
  void moe(cudaStream_t s) {
    experts(s);
    lr::moe_combine_rows(f.dev.w, selw.p, M, slots(), scratch.p, y.p, f.c.H, s);
  }
  void run() {
    stage(nullptr);
    moe(nullptr);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
};

struct TodayRow {
  std::vector<int32_t> sel;
  std::vector<float> selw, act, y;
};
TodayRow today_row(const MoEFixture& f, const float* h, const float* logits, const float* y0) {
  const auto& c = f.c;
  Dev<float> dh(std::vector<float>(h, h + c.H)), dl(std::vector<float>(logits, logits + c.E + 1)),
      act(size_t(f.act_ld())), selw(size_t(c.k + 1)), y(std::vector<float>(y0, y0 + c.H));
  Dev<int32_t> sel(size_t(c.k));
  lc::moe_gate_up(f.dev.w, dl.p, dh.p, f.dnw.p, 1e-6f, sel.p, selw.p, act.p, nullptr, lc::GemvImpl::Tensor);
  lc::moe_down(f.dev.w, sel.p, selw.p, act.p, y.p, nullptr, lc::GemvImpl::Tensor);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return {sel.get(), selw.get(), act.get(), y.get()};
}

// M rows of residual h and their router logits (CPU), y0 random.
struct Inputs {
  std::vector<float> h, xn, logits, y0;
};
Inputs make_inputs(Rng& r, const MoEFixture& f, int M) {
  const auto& c = f.c;
  Inputs in;
  in.h = randv(r, size_t(M * c.H), 1.5f);
  in.xn.resize(size_t(M * c.H));
  in.logits.resize(size_t(M * (c.E + 1)));
  for (int m = 0; m < M; ++m) f.logits_cpu(in.h.data() + m * c.H, in.xn.data() + m * c.H, in.logits.data() + m * (c.E + 1));
  in.y0 = randv(r, size_t(M * c.H));
  return in;
}

const MoECase kReal{256, 8, 2048, 512, 512};

TEST(RowsMoE, MatchesCpuAndTodaysKernelsRowByRow) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng r(seed);
  // the model's shape, odd widths, more experts than 256, 8-bit experts (chunks of 4 rows); H = 512: both kernels
  // take their k-tiles through rings (as at the model's shape) while half of gate/up's k-slices have no tile
  for (const MoECase c : {kReal, MoECase{64, 8, 320, 512, 576}, MoECase{37, 3, 320, 64, 192}, MoECase{16, 4, 256, 128, 128},
                          MoECase{300, 8, 128, 256, 64}, MoECase{64, 4, 256, 256, 128, 8}, MoECase{32, 4, 512, 256, 256}}) {
    MoEFixture f(r, c);
    const bool exact = c.I % 256 == 0;  // down's expert tiles line up with today's concatenated k-tiles
    for (int M : {1, 6, 16, 40}) {  // chunks of 2 rows (M <= 32) and of 4
      SCOPED_TRACE("E " + std::to_string(c.E) + " I " + std::to_string(c.I) + " M " + std::to_string(M));
      const Inputs in = make_inputs(r, f, M);
      RowsMoERun run(f, M, in.h, in.logits, in.y0, {});
      run.act.poison();
      run.selw.poison();
      run.run();
      const auto sel = run.sel.get();
      const auto selw = run.selw.get();
      const auto act = run.act.get();
      const auto y = run.y.get();
      for (int m = 0; m < M; ++m) {
        SCOPED_TRACE("row " + std::to_string(m));
        const auto t = today_row(f, in.h.data() + m * c.H, in.logits.data() + m * (c.E + 1), in.y0.data() + m * c.H);
        EXPECT_TRUE(std::equal(t.sel.begin(), t.sel.end(), sel.begin() + m * c.k)) << "expert ids";
        EXPECT_EQ(first_bit_diff(t.selw.data(), selw.data() + m * (c.k + 1), c.k + 1), -1) << "weights";
        EXPECT_EQ(first_bit_diff(act.data() + m * f.act_ld(), t.act.data(), f.act_ld()), -1)
            << "act vs moe_gate_up_tc: " << bit_diff_msg(act.data() + m * f.act_ld(), t.act.data(), f.act_ld());
        const std::vector<float> yr(y.begin() + m * c.H, y.begin() + (m + 1) * c.H);
        if (exact)
          EXPECT_EQ(first_bit_diff(yr.data(), t.y.data(), c.H), -1)
              << "y vs moe_down_tc: " << bit_diff_msg(yr.data(), t.y.data(), c.H);
        else
          EXPECT_LE(rel_err(yr, t.y), 1e-6);
        auto ref = f.moe_cpu(in.xn.data() + m * c.H, in.logits.data() + m * (c.E + 1));
        std::vector<float> got(yr);
        for (int64_t i = 0; i < c.H; ++i) got[size_t(i)] -= in.y0[size_t(m * c.H + i)];
        EXPECT_LE(rel_err(got, ref), 1e-5);
      }
    }
  }
}

TEST(RowsMoE, BatchInvariantAndPaddingUntouched) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng r(seed);
  for (const MoECase c : {kReal, MoECase{37, 3, 320, 64, 192}}) {
    MoEFixture f(r, c);
    const Inputs one = make_inputs(r, f, 1);
    RowsMoERun alone(f, 1, one.h, one.logits, one.y0, {});
    alone.run();
    const std::vector<int32_t> a_sel = alone.sel.get();
    const std::vector<float> a_act = alone.act.get(), a_selw = alone.selw.get(), a_y = alone.y.get();
    for (int M : {2, 7, 16, 64}) {
      SCOPED_TRACE("E " + std::to_string(c.E) + " M " + std::to_string(M));
      Inputs in = make_inputs(r, f, M);
      const int pos = int(r.word() % uint32_t(M));
      std::copy(one.h.begin(), one.h.end(), in.h.begin() + pos * c.H);
      std::copy(one.logits.begin(), one.logits.end(), in.logits.begin() + pos * (c.E + 1));
      std::copy(one.y0.begin(), one.y0.end(), in.y0.begin() + pos * c.H);
      const auto slots = slots_with_padding(r, M, pos);
      for (int m = 0; m < M; ++m)
        if (slots[size_t(m)] < 0) std::fill(in.y0.begin() + m * c.H, in.y0.begin() + (m + 1) * c.H, kSentinel);
      RowsMoERun run(f, M, in.h, in.logits, in.y0, slots);
      run.act.set(std::vector<float>(size_t(M) * f.act_ld(), kSentinel));
      run.sel.set(std::vector<int32_t>(size_t(M) * c.k, -7));
      run.run();
      const std::vector<int32_t> sel = run.sel.get();
      const std::vector<float> act = run.act.get(), selw = run.selw.get(), y = run.y.get();
      EXPECT_TRUE(std::equal(a_sel.begin(), a_sel.end(), sel.begin() + pos * c.k));
      EXPECT_EQ(first_bit_diff(a_selw.data(), selw.data() + pos * (c.k + 1), c.k + 1), -1);
      EXPECT_EQ(first_bit_diff(a_act.data(), act.data() + pos * f.act_ld(), f.act_ld()), -1)
          << "act: " << bit_diff_msg(a_act.data(), act.data() + pos * f.act_ld(), f.act_ld());
      EXPECT_EQ(first_bit_diff(a_y.data(), y.data() + pos * c.H, c.H), -1)
          << "y: " << bit_diff_msg(a_y.data(), y.data() + pos * c.H, c.H);
      for (int m = 0; m < M; ++m) {
        if (slots[size_t(m)] >= 0) continue;
        bool untouched = sel[size_t(m * c.k)] == -7;
        for (int64_t i = 0; i < c.H; ++i) untouched &= y[size_t(m * c.H + i)] == kSentinel;
        for (int64_t i = 0; i < f.act_ld(); ++i) untouched &= act[size_t(m * f.act_ld() + i)] == kSentinel;
        EXPECT_TRUE(untouched) << "padding row " << m << " was written";
      }
    }
  }
}

// The grouping read back from the scratch: every active row's choices exactly once, experts ascending, an
// expert's rows ascending across its chunks, chunks of at most moe_chunk_rows rows (only an expert's last one
// shorter), the shared expert's chunks holding every active row; padding rows nowhere. Ties go to lower ids.
// M = 2..4 (M·k <= 32 pairs) takes the one-warp sort, M = 64 the block's counting sort: the same layout.
TEST(RowsMoE, RoutingGroupsRowsByExpert) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng r(seed);
  const MoECase c{64, 8, 64, 64, 64};
  MoEFixture f(r, c);
  for (int M : {2, 3, 4, 33, 64}) {  // 33, 64: a cluster's second block routes rows 32.. (moe_route_cluster_ok)
    SCOPED_TRACE("M " + std::to_string(M));
    const int CH = lr::moe_chunk_rows(4, M);
    std::vector<float> logits(size_t(M * (c.E + 1)));
    for (int m = 0; m < M; ++m)
      for (int e = 0; e <= c.E; ++e)  // rows 0..3 all ties: top 8 = ids 0..7; the others few distinct levels
        logits[size_t(m * (c.E + 1) + e)] = m < 4 ? 0.f : float(int(r.word() % 6u));
    auto slots = slots_with_padding(r, M, 0);
    for (int m = 1; m < std::min(M, 4); ++m) slots[size_t(m)] = 5;
    if (M == 3) slots[2] = -1;  // a padding row among few
    RowsMoERun run(f, M, randv(r, size_t(M * c.H)), logits, std::vector<float>(size_t(M * c.H), 0.f), slots);
    run.sel.set(std::vector<int32_t>(size_t(M * c.k), -7));
    lr::moe_route_rows(f.dev.w, run.logits.p, c.E + 1, M, run.slots(), run.sel.p, run.selw.p, run.scratch.p, nullptr);
    CK(cudaDeviceSynchronize());
    const auto sel = run.sel.get();
    std::vector<char> raw(run.scratch.n);
    CK(cudaMemcpy(raw.data(), run.scratch.p, raw.size(), cudaMemcpyDeviceToHost));
    const auto sc = lilac::cuda::rows_dev::moe_carve(raw.data(), f.dev.w, M);
    const int n_rc = sc.hdr[0], n_ch = sc.hdr[1];
    int active = 0;
    for (int m = 0; m < M; ++m) active += slots[size_t(m)] >= 0;
    EXPECT_EQ(sc.hdr[3], active);
    EXPECT_EQ(sc.hdr[2], active * (c.k + 1));
    for (int m = 0; m < std::min(M, 4); ++m)
      for (int j = 0; j < c.k && slots[size_t(m)] >= 0; ++j) EXPECT_EQ(sel[size_t(m * c.k + j)], j) << "ties: row " << m;
    std::vector<int> seen(size_t(M * (c.k + 1)), 0);
    int prev_e = -1, prev_row = -1;
    for (int ch = 0; ch < n_ch; ++ch) {
      const int4 d = sc.chunks[ch];
      const bool shared = ch >= n_rc;
      EXPECT_EQ(d.x == c.E, shared) << "chunk " << ch;
      EXPECT_GE(d.x, prev_e) << "experts ascending";
      EXPECT_TRUE(d.z >= 1 && d.z <= CH);
      if (d.x != prev_e) prev_row = -1;
      if (ch + 1 < n_ch && sc.chunks[ch + 1].x == d.x) {
        EXPECT_EQ(d.z, CH) << "only an expert's last chunk is short";
      }
      for (int t = 0; t < d.z; ++t) {
        const int ent = sc.entries[d.y + t], row = ent >> 8, j = ent & 0xFF;
        ASSERT_TRUE(row >= 0 && row < M);
        EXPECT_GE(slots[size_t(row)], 0) << "padding row " << row << " grouped";
        EXPECT_GT(row, prev_row) << "rows ascending within an expert";
        prev_row = row;
        if (shared) {
          EXPECT_EQ(j, c.k);
        } else {
          EXPECT_EQ(sel[size_t(row * c.k + j)], d.x) << "row " << row << " slot " << j;
        }
        seen[size_t(row * (c.k + 1) + j)] += 1;
      }
      prev_e = d.x;
    }
    for (int m = 0; m < M; ++m)
      for (int j = 0; j <= c.k; ++j)
        EXPECT_EQ(seen[size_t(m * (c.k + 1) + j)], slots[size_t(m)] >= 0 ? 1 : 0) << "row " << m << " slot " << j;
    for (int m = 0; m < M; ++m) {
      if (slots[size_t(m)] < 0) {
        EXPECT_EQ(sel[size_t(m * c.k)], -7) << "padding row " << m << " routed";
      }
    }
  }
}

// Above 32 rows the routing takes a cluster of two blocks wherever the device can (sm_90+: every lilac build carries
// sm_90a code, CMakeLists.txt), so the tests of 33-64 rows above check that path there; a wrong check of the
// kernel's architecture (cudaFuncAttributes::binaryVersion is the device's after a PTX JIT, ptxVersion the code's)
// would silently keep one block.
TEST(RowsMoE, RoutingOfMoreThan32RowsTakesTheClusterFromSm90) {
  NEED_GPU();
  int dev = 0, major = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  const char* e = std::getenv("LILAC_MOE_ROUTE_CLUSTER");
  const bool off = e != nullptr && std::string(e) == "0";
  EXPECT_EQ(lr::moe_route_cluster_ok(), major >= 9 && !off) << "compute capability " << major;
}

// stage (4- and 8-bit layouts) → router + shared-gate GEMVs (8-bit) → route → gate/up → down → combine as
// PDL launches captured once in a graph, replayed twice (y accumulates); reference: the CPU MoE routed from
// the logits the GPU computed.
TEST(RowsMoE, PdlChainInAGraphMatchesCpu) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng r(seed);
  const MoECase c{64, 8, 320, 512, 576};
  MoEFixture f(r, c);
  const int M = 9;
  Inputs in = make_inputs(r, f, M);
  RowsMoERun run(f, M, in.h, in.logits, in.y0, {});
  Dev<char> frag8(lr::frag_row_bytes(c.H) * M);
  run.logits.poison();
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  auto router = [&](const DevQ& W, float* y) {
    lr::GemvRowsArgs a;
    a.W = W.d;
    a.frag = frag8.p;
    a.meta = run.meta.p;
    a.M = M;
    a.y = y;
    a.ldy = c.E + 1;
    lr::gemv_rows(a, s);
  };
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
  run.stage(s, frag8.p);
  router(f.drouter, run.logits.p);
  router(f.dseg, run.logits.p + c.E);
  run.moe(s);
  cudaGraph_t g;
  CK(cudaStreamEndCapture(s, &g));
  cudaGraphExec_t ge;
  CK(cudaGraphInstantiate(&ge, g, 0));
  std::vector<float> y = in.y0;
  for (int rep = 0; rep < 2; ++rep) {
    CK(cudaGraphLaunch(ge, s));
    CK(cudaStreamSynchronize(s));
    const auto lg = run.logits.get();
    for (int m = 0; m < M; ++m) {
      std::vector<float> want(size_t(c.E + 1));
      f.logits_cpu(in.h.data() + m * c.H, in.xn.data() + m * c.H, want.data());
      EXPECT_LE(rel_err(std::vector<float>(lg.begin() + m * (c.E + 1), lg.begin() + (m + 1) * (c.E + 1)), want), 1e-5);
      const auto ref = f.moe_cpu(in.xn.data() + m * c.H, lg.data() + m * (c.E + 1));
      for (int64_t i = 0; i < c.H; ++i) y[size_t(m * c.H + i)] += ref[size_t(i)];
    }
  }
  const auto got = run.y.get();
  for (int m = 0; m < M; ++m) {
    const std::vector<float> gr(got.begin() + m * c.H, got.begin() + (m + 1) * c.H),
        yr(y.begin() + m * c.H, y.begin() + (m + 1) * c.H);
    EXPECT_LE(rel_err(gr, yr), 1e-5) << "row " << m;
  }
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  cudaStreamDestroy(s);
}

// moe_combine_stage_rows (the combine and the next layer's input staging in one launch) against
// moe_combine_rows followed by stage(): y, both 4-bit layouts' fragments, the 8-bit ones and the meta bit for
// bit, padding rows' y and staged input untouched. k + 1 <= 9 slots (the kernel's loads all in flight) and more.
TEST(RowsMoE, CombineStageIsCombineThenStage) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng r(seed);
  for (const MoECase c : {kReal, MoECase{37, 3, 320, 64, 192}, MoECase{40, 11, 512, 128, 64}}) {
    MoEFixture f(r, c);
    const std::vector<float> nw2 = MoEFixture::norm(r, c.H);  // the next layer's input norm
    const Dev<float> dnw2(nw2);
    for (int M : {1, 5}) {
      SCOPED_TRACE("E " + std::to_string(c.E) + " M " + std::to_string(M));
      const Inputs in = make_inputs(r, f, M);
      const auto slots = M > 1 ? slots_with_padding(r, M, 0) : std::vector<int32_t>{};
      RowsMoERun run(f, M, in.h, in.logits, in.y0, slots);
      run.stage(nullptr);
      run.experts(nullptr);
      const size_t fb = lr::frag_row_bytes(c.H) * size_t(M), mb = lr::meta_row_count(c.H) * size_t(M);
      struct Out {
        Dev<float> y;
        Dev<char> f4g, f4, f8;
        Dev<float2> meta;
      };
      auto fresh = [&] {  // guaranteed elision: Dev has no move
        return Out{Dev<float>(in.y0), Dev<char>(std::vector<char>(fb, 'p')), Dev<char>(std::vector<char>(fb, 'p')),
                   Dev<char>(std::vector<char>(fb, 'p')), Dev<float2>(std::vector<float2>(mb, make_float2(kSentinel, 0.f)))};
      };
      auto combine = [&](Out& o, bool fused) {
        lr::StageArgs st;
        st.x = o.y.p;
        st.K = c.H;
        st.M = M;
        st.row_slot = run.slots();
        st.pro = lc::Prologue::RmsNorm;
        st.norm_w = dnw2.p;
        st.frag4g = o.f4g.p;
        st.frag4 = o.f4.p;
        st.frag8 = o.f8.p;
        st.meta = o.meta.p;
        if (fused) {
          EXPECT_TRUE(lr::combine_stage_supported(f.dev.w, st));
          lr::moe_combine_stage_rows(f.dev.w, run.selw.p, M, run.slots(), run.scratch.p, o.y.p, c.H, st, nullptr);
        } else {
          lr::moe_combine_rows(f.dev.w, run.selw.p, M, run.slots(), run.scratch.p, o.y.p, c.H, nullptr);
          lr::stage(st, nullptr);
        }
        EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      };
      Out want = fresh(), got = fresh();
      combine(want, false);
      combine(got, true);
      EXPECT_EQ(want.y.get(), got.y.get()) << "y";
      EXPECT_EQ(want.f4g.get(), got.f4g.get()) << "4-bit group layout";
      EXPECT_EQ(want.f4.get(), got.f4.get()) << "4-bit k-tile layout";
      EXPECT_EQ(want.f8.get(), got.f8.get()) << "8-bit layout";
      const std::vector<float2> wm = want.meta.get(), gm = got.meta.get();
      EXPECT_EQ(first_bit_diff(reinterpret_cast<const float*>(wm.data()), reinterpret_cast<const float*>(gm.data()),
                               int64_t(2 * mb)),
                -1)
          << "meta";
      const std::vector<float> y = got.y.get();
      for (int m = 0; m < M; ++m) {  // padding rows: y and meta as they were (the fragments: compared above)
        if (slots.empty() || slots[size_t(m)] >= 0) continue;
        EXPECT_TRUE(std::equal(y.begin() + m * c.H, y.begin() + (m + 1) * c.H, in.y0.begin() + m * c.H));
        EXPECT_EQ(gm[lr::meta_row_count(c.H) * size_t(m)].x, kSentinel) << "padding row " << m << " was staged";
      }
    }
  }
}

TEST(RowsMoE, RejectsUnsupportedShapes) {
  lc::MoEDecodeWeights w;
  EXPECT_FALSE(lr::moe_rows_supported(w, 4));  // no matrices
}

// The digits MoE (digits/moe_digits.h; MoEDecodeWeights::digits): every row's routing, act and output through the
// rows kernels (the staged digits, chunks of 8 rows, act's digits staged in a launch of their own) bit for bit
// what the one-row kernels (moe_gate_up / moe_down) give that row alone, padding rows untouched, and within the
// fp16 path's bound of the CPU reference. Shapes: the model's, the fixtures' (tiny, tiny2), odd ones.
TEST(DigitsMoE, RowsMatchOneRowBitwiseAndCpu) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng r(seed);
  for (const MoECase c : {kReal, MoECase{37, 3, 320, 64, 192}, MoECase{16, 4, 256, 128, 128}, MoECase{8, 2, 192, 64, 128},
                          MoECase{64, 8, 320, 512, 576}}) {
    MoEFixture f(r, c);
    lc::MoEDecodeWeights w = f.dev.w;
    ASSERT_TRUE(lc::digits::moe_supported(w));
    w.digits = true;
    for (int M : {1, 5, 16, 64}) {
      SCOPED_TRACE("E " + std::to_string(c.E) + " I " + std::to_string(c.I) + " M " + std::to_string(M));
      Inputs in = make_inputs(r, f, M);
      const std::vector<int32_t> slots = M >= 16 ? slots_with_padding(r, M, 0) : std::vector<int32_t>{};
      for (size_t m = 0; m < slots.size(); ++m)
        if (slots[m] < 0) std::fill(in.y0.begin() + int64_t(m) * c.H, in.y0.begin() + int64_t(m + 1) * c.H, kSentinel);
      Dev<float> h(in.h), logits(in.logits), act(std::vector<float>(size_t(M) * f.act_ld(), kSentinel)),
          selw(size_t(M) * (c.k + 1)), y(in.y0);
      Dev<int32_t> sel(size_t(M) * c.k), slot(slots.empty() ? std::vector<int32_t>(1) : slots);
      const int32_t* rs = slots.empty() ? nullptr : slot.p;
      Dev<char> xdig(lc::digits::moe_stage_bytes(c.H, M)), adig(lc::digits::moe_stage_bytes(f.act_ld(), M)),
          scratch(lr::moe_rows_scratch_bytes(w, M));
      lr::StageArgs st;
      st.x = h.p;
      st.K = c.H;
      st.M = M;
      st.row_slot = rs;
      st.pro = lc::Prologue::RmsNorm;
      st.norm_w = f.dnw.p;
      st.digits = xdig.p;
      lr::stage(st, nullptr);
      lr::moe_route_rows(w, logits.p, c.E + 1, M, rs, sel.p, selw.p, scratch.p, nullptr, lc::digits::kMoEChunk);
      lc::digits::moe_gate_up_rows(w, xdig.p, M, scratch.p, act.p, nullptr);
      lr::StageArgs sa;
      sa.x = act.p;
      sa.K = f.act_ld();
      sa.M = M;
      sa.row_slot = rs;
      sa.digits = adig.p;
      lr::stage(sa, nullptr);
      lc::digits::moe_down_rows(w, adig.p, M, scratch.p, nullptr);
      lr::moe_combine_rows(w, selw.p, M, rs, scratch.p, y.p, c.H, nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const auto gsel = sel.get();
      const auto gselw = selw.get();
      const auto gact = act.get();
      const auto gy = y.get();
      for (int m = 0; m < M; ++m) {
        SCOPED_TRACE("row " + std::to_string(m));
        if (!slots.empty() && slots[size_t(m)] < 0) {
          bool untouched = true;
          for (int64_t i = 0; i < c.H; ++i) untouched &= gy[size_t(m * c.H + i)] == kSentinel;
          for (int64_t i = 0; i < f.act_ld(); ++i) untouched &= gact[size_t(m * f.act_ld() + i)] == kSentinel;
          EXPECT_TRUE(untouched) << "padding row written";
          continue;
        }
        Dev<float> dh(std::vector<float>(in.h.begin() + m * c.H, in.h.begin() + (m + 1) * c.H)),
            dl(std::vector<float>(in.logits.begin() + m * (c.E + 1), in.logits.begin() + (m + 1) * (c.E + 1))),
            oact(size_t(f.act_ld())), oselw(size_t(c.k + 1)),
            oy(std::vector<float>(in.y0.begin() + m * c.H, in.y0.begin() + (m + 1) * c.H));
        Dev<int32_t> osel(size_t(c.k));
        lc::moe_gate_up(w, dl.p, dh.p, f.dnw.p, 1e-6f, osel.p, oselw.p, oact.p, nullptr);
        lc::moe_down(w, osel.p, oselw.p, oact.p, oy.p, nullptr);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const auto t_sel = osel.get();
        const auto t_selw = oselw.get();
        const auto t_act = oact.get();
        const auto t_y = oy.get();
        EXPECT_TRUE(std::equal(t_sel.begin(), t_sel.end(), gsel.begin() + m * c.k)) << "expert ids";
        EXPECT_EQ(first_bit_diff(t_selw.data(), gselw.data() + m * (c.k + 1), c.k + 1), -1) << "weights";
        EXPECT_EQ(first_bit_diff(gact.data() + m * f.act_ld(), t_act.data(), f.act_ld()), -1)
            << "act: " << bit_diff_msg(gact.data() + m * f.act_ld(), t_act.data(), f.act_ld());
        EXPECT_EQ(first_bit_diff(gy.data() + m * c.H, t_y.data(), c.H), -1)
            << "y: " << bit_diff_msg(gy.data() + m * c.H, t_y.data(), c.H);
        auto ref = f.moe_cpu(in.xn.data() + m * c.H, in.logits.data() + m * (c.E + 1));
        std::vector<float> got(t_y);
        for (int64_t i = 0; i < c.H; ++i) got[size_t(i)] -= in.y0[size_t(m * c.H + i)];
        EXPECT_LE(rel_err(got, ref), 1e-5);
      }
    }
  }
}

}  // namespace
