// Chunked Gated DeltaNet prefill (gdn_prefill_chunked, src/cuda/kernels/gdn/gdn_chunked.cu) against the CPU
// token-by-token recurrence (cpu::gdn_recurrent_step) on random inputs: fresh seeds (printed on
// failure), outputs poisoned with NaN, lengths around the chunk size (1, 63, 64, 65, 200, 1100), a
// non-zero initial state, the model's head sizes and tiny2's (dk 32, dv 48), both state-product
// precisions. Bars: the bf16 output ‖Δ‖/‖ref‖ ≤ 5e-3 (bf16 rounding ≈ 2e-3); the fp32 state ≤ 1e-4 with
// 3xTF32 (≈ fp32, other summation order) and ≤ 1e-3 with plain TF32 (operands rounded to 2^-11).
// Also a real-size run (4096 tokens, 16/32 heads of 128) checked against the CPU (timed in
// bench/bench_kernels_gdn.cpp; see bench/GPU_NOTES.md, "Chunked GDN").
#include <gtest/gtest.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "core/error.h"
#include "cpu/ops.h"
#include "cuda/kernels/gdn/gdn.h"
#include "gdn_problem.h"
#include "prefill_test_util.h"

using namespace lilac;
namespace lc = lilac::cuda;
using namespace lilac::cuda::prefill_testing;

namespace {

void expect_close(const Problem& p, DevProblem& d, lc::GdnChunkedMath math) {
  const double e_out = rel_err(bf16_to_f(d.out.get()), p.out_ref, "out(bf16)");
  const double e_o = rel_err(d.osc.get(), p.o_ref, "o(fp32)");
  const double e_s = rel_err(d.S.get(), p.S_ref, "state");
  EXPECT_LT(e_out, 5e-3);
  if (math == lc::GdnChunkedMath::Split3xTF32) {
    EXPECT_LT(e_o, 1e-4);
    EXPECT_LT(e_s, 1e-4);
  } else {
    EXPECT_LT(e_s, 1e-3);
  }
}

void check_chunked(int n, int Hk, int Hv, int dk, int dv, lc::GdnChunkedMath math, bool own_work) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed) + " n=" + std::to_string(n) + " Hk=" + std::to_string(Hk) +
               " Hv=" + std::to_string(Hv) + " dk=" + std::to_string(dk) + " dv=" + std::to_string(dv) + " " +
               math_name(math) + (own_work ? " work=given" : " work=internal"));
  std::printf("[case] n=%d Hk=%d Hv=%d dk=%d dv=%d %s\n", n, Hk, Hv, dk, dv, math_name(math));
  std::mt19937 rng(seed);
  Problem p(n, Hk, Hv, dk, dv, rng);
  p.reference();
  DevProblem d(p);
  Dev<float> work(lc::gdn_chunked_work_floats(n, Hk, Hv, dk, dv));
  work.poison();
  if (own_work) d.a.work = work.p;
  lc::gdn_prefill_chunked(d.a, nullptr, math);
  CK(cudaDeviceSynchronize());
  expect_close(p, d, math);
}

TEST(PrefillGdnChunked, MatchesTokenByToken) {
  NEED_GPU();
  for (auto math : {lc::GdnChunkedMath::Split3xTF32, lc::GdnChunkedMath::TF32}) {
    check_chunked(1, 1, 2, 128, 128, math, true);
    check_chunked(63, 2, 4, 128, 128, math, true);
    check_chunked(64, 2, 4, 128, 128, math, false);
    check_chunked(65, 2, 4, 128, 128, math, true);
    check_chunked(200, 3, 3, 128, 128, math, true);
    check_chunked(1100, 2, 4, 128, 128, math, true);
    check_chunked(130, 2, 4, 64, 64, math, true);    // tiny's sizes
    check_chunked(1, 1, 4, 32, 48, math, true);      // tiny2's sizes
    check_chunked(63, 1, 4, 32, 48, math, true);
    check_chunked(200, 1, 4, 32, 48, math, false);
    check_chunked(1100, 1, 4, 32, 48, math, true);
    check_chunked(97, 2, 4, 32, 96, math, true);     // dv with 32-column blocks
  }
}

// Small cases (also what compute-sanitizer racecheck / memcheck run on).
TEST(PrefillGdnChunked, Small) {
  NEED_GPU();
  check_chunked(130, 2, 4, 128, 128, lc::GdnChunkedMath::Split3xTF32, true);
  check_chunked(70, 1, 4, 32, 48, lc::GdnChunkedMath::TF32, true);
}

// Column blocks of 16 / 64 (LILAC_GDN_CHUNKED_COLS) compute the same thing.
TEST(PrefillGdnChunked, ColumnBlockSizes) {
  NEED_GPU();
  for (const char* cols : {"16", "64"}) {
    setenv("LILAC_GDN_CHUNKED_COLS", cols, 1);
    SCOPED_TRACE(std::string("cols ") + cols);
    check_chunked(150, 2, 4, 128, 128, lc::GdnChunkedMath::Split3xTF32, true);
    check_chunked(150, 2, 4, 128, 128, lc::GdnChunkedMath::TF32, true);
  }
  unsetenv("LILAC_GDN_CHUNKED_COLS");
}

// The warp-specialized state pass (state_ws_kernel: the output products on warps of their own, a chunk behind the
// recurrence, S and Δ double-buffered, named barriers between the two groups) gives the plain kernel's bits — the
// fp32 o, the bf16 output and the state — on lengths around the chunk size and past many chunks (the barriers'
// parity), every key / value head size and both precisions.
TEST(PrefillGdnChunked, WarpSpecializedEqualsPlain) {
  NEED_GPU();
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  struct Case {
    int n, Hk, Hv, dk, dv;
  };
  for (const Case& cs : {Case{1, 1, 2, 128, 128}, Case{64, 2, 4, 128, 128}, Case{65, 2, 4, 128, 128},
                         Case{1100, 2, 4, 128, 128}, Case{130, 2, 4, 64, 64}, Case{200, 1, 4, 32, 48},
                         Case{97, 2, 4, 32, 96}}) {
    for (auto math : {lc::GdnChunkedMath::Split3xTF32, lc::GdnChunkedMath::TF32}) {
      SCOPED_TRACE("n=" + std::to_string(cs.n) + " dk=" + std::to_string(cs.dk) + " dv=" + std::to_string(cs.dv) +
                   " " + math_name(math));
      Problem p(cs.n, cs.Hk, cs.Hv, cs.dk, cs.dv, rng);
      struct Out {
        std::vector<float> o, S;
        std::vector<uint16_t> out;
      };
      auto run = [&](bool ws, Out& r) {
        lc::set_gdn_state_ws(ws);
        DevProblem d(p);
        Dev<float> work(lc::gdn_chunked_work_floats(cs.n, cs.Hk, cs.Hv, cs.dk, cs.dv));
        d.a.work = work.p;
        lc::gdn_prefill_chunked(d.a, nullptr, math);
        CK(cudaDeviceSynchronize());
        r.o = d.osc.get();
        r.S = d.S.get();
        r.out = d.out.get();
      };
      Out plain, ws;
      run(false, plain);
      run(true, ws);
      ASSERT_EQ(plain.o.size(), ws.o.size());
      EXPECT_EQ(std::memcmp(plain.o.data(), ws.o.data(), plain.o.size() * 4), 0);
      EXPECT_EQ(std::memcmp(plain.S.data(), ws.S.data(), plain.S.size() * 4), 0);
      EXPECT_EQ(std::memcmp(plain.out.data(), ws.out.data(), plain.out.size() * 2), 0);
    }
  }
  lc::set_gdn_state_ws(true);
}

// Two calls in a row (state carried between prefill chunks) equal one call over the whole sequence.
TEST(PrefillGdnChunked, SplitSequenceCarriesState) {
  NEED_GPU();
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  const int n = 300, n1 = 77;
  Problem p(n, 2, 4, 128, 128, rng);
  p.reference();
  DevProblem d(p);
  Dev<float> work(lc::gdn_chunked_work_floats(n, 2, 4, 128, 128));
  d.a.work = work.p;
  lc::GdnPrefillArgs a1 = d.a, a2 = d.a;
  a1.n = n1;
  a2.n = n - n1;
  a2.qkv += n1 * p.ld_qkv;
  a2.b += n1 * p.ld_ab;
  a2.a += n1 * p.ld_ab;
  a2.z += int64_t(n1) * a2.ld_z;
  a2.o_scratch += int64_t(n1) * p.Hv * p.dv;
  a2.out += int64_t(n1) * a2.ld_out;
  lc::gdn_prefill_chunked(a1, nullptr);
  lc::gdn_prefill_chunked(a2, nullptr);
  CK(cudaDeviceSynchronize());
  expect_close(p, d, lc::GdnChunkedMath::Split3xTF32);
}

// Graph capture: with a work buffer the chunked kernels are captured; without one, dk = dv = 128 falls
// back to the column scan's allocation-free path, and other sizes throw before launching anything.
TEST(PrefillGdnChunked, GraphCapture) {
  NEED_GPU();
  for (int with_work : {1, 0}) {
    const uint32_t seed = std::random_device{}();
    SCOPED_TRACE("seed " + std::to_string(seed) + " with_work=" + std::to_string(with_work));
    std::mt19937 rng(seed);
    Problem p(150, 2, 4, 128, 128, rng);
    p.reference();
    DevProblem d(p);
    Dev<float> work(lc::gdn_chunked_work_floats(p.n, 2, 4, 128, 128));
    if (with_work) d.a.work = work.p;
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    lc::gdn_prefill_chunked(d.a, st);  // first call outside capture (sets kernel attributes)
    CK(cudaStreamSynchronize(st));
    d.S.put(p.S0);
    d.out.poison();
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    lc::gdn_prefill_chunked(d.a, st);
    CK(cudaStreamEndCapture(st, &graph));
    CK(cudaGraphInstantiate(&exec, graph, 0));
    CK(cudaGraphLaunch(exec, st));
    CK(cudaStreamSynchronize(st));
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    const double e_out = rel_err(bf16_to_f(d.out.get()), p.out_ref, "out(bf16)");
    const double e_s = rel_err(d.S.get(), p.S_ref, "state");
    EXPECT_LT(e_out, 5e-3);
    EXPECT_LT(e_s, 1e-4);
    if (!with_work) {
      Problem p2(20, 1, 4, 32, 48, rng);
      DevProblem d2(p2);
      CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
      EXPECT_THROW(lc::gdn_prefill_chunked(d2.a, st), lilac::Error);
      cudaGraph_t g2;
      CK(cudaStreamEndCapture(st, &g2));
      cudaGraphDestroy(g2);
    }
    cudaStreamDestroy(st);
  }
}

TEST(PrefillGdnChunked, RejectsBadShapes) {
  NEED_GPU();
  std::mt19937 rng(1);
  Problem p(10, 1, 2, 32, 48, rng);
  DevProblem d(p);
  lc::GdnPrefillArgs a = d.a;
  a.dk = 48;
  EXPECT_THROW(lc::gdn_prefill_chunked(a, nullptr), lilac::Error);
  a = d.a;
  a.dv = 40;
  EXPECT_THROW(lc::gdn_prefill_chunked(a, nullptr), lilac::Error);
  a = d.a;
  a.Hk = 2;
  a.Hv = 3;
  EXPECT_THROW(lc::gdn_prefill_chunked(a, nullptr), lilac::Error);
}

// The model's sizes (4096 tokens, 16 / 32 heads of 128), both precisions, against the CPU (the timing
// is in bench/bench_kernels_gdn.cpp). LILAC_GDN_TIMING_N overrides n.
TEST(PrefillGdnChunked, RealSizeMatchesCpu) {
  NEED_GPU();
  const char* env = std::getenv("LILAC_GDN_TIMING_N");
  const int n = env && *env ? std::atoi(env) : 4096;
  const int Hk = 16, Hv = 32, d = 128;
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  Problem p(n, Hk, Hv, d, d, rng);
  p.reference();
  DevProblem dp(p);
  Dev<float> work(lc::gdn_chunked_work_floats(n, Hk, Hv, d, d));
  dp.a.work = work.p;
  for (auto math : {lc::GdnChunkedMath::Split3xTF32, lc::GdnChunkedMath::TF32}) {
    SCOPED_TRACE(math_name(math));
    std::printf("[case] real size n=%d %s\n", n, math_name(math));
    dp.S.put(p.S0);
    dp.out.poison();
    lc::gdn_prefill_chunked(dp.a, nullptr, math);
    CK(cudaDeviceSynchronize());
    expect_close(p, dp, math);
  }
  CK(cudaGetLastError());
}

}  // namespace
