// The Gated DeltaNet family's prefill kernels (src/cuda/kernels/gdn/) at the model's sizes (16 key / 32
// value heads of 128, n = LILAC_GDN_TIMING_N tokens, default 4096; one random problem for all cases):
//   GdnConvPrefill  — the causal conv + SiLU over the chunk (GB/s of its fp32 input + output);
//   GdnScan         — the column scan gdn_prefill (prep + scan + gated norm), with a work buffer;
//   GdnChunked/<math>/cols:C — the chunked WY form (LILAC_GDN_CHUNKED_COLS = C value columns per
//                     state block), 3xTF32 or plain TF32 state products.
// Each time is the median of 20 CUDA-event timings after 3 warm-up calls (default stream). The chunked
// results are checked against the column scan's once (bf16 output ‖Δ‖/‖ref‖ ≤ 5e-3; the CPU reference
// at this size is tests/cuda/test_gdn_chunked.cpp's RealSizeMatchesCpu). The decode step has no
// benchmark of its own: see scripts/gpu-profile.sh (Nsight Compute over the decode graph).
// Without a GPU it prints "no CUDA GPU" and exits 0.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "cuda/kernels/gdn/gdn.h"
#include "gdn_problem.h"
#include "kernel_bench.h"
#include "prefill_data.h"

namespace lc = lilac::cuda;
using namespace lilac::cuda::prefill_testing;
using lilac::cuda::GdnChunkedMath;
using lilac::cuda::GdnPrefillArgs;

namespace {

constexpr int kHk = 16, kHv = 32, kD = 128;

int timing_n() {
  const char* env = std::getenv("LILAC_GDN_TIMING_N");
  return env && *env ? std::atoi(env) : 4096;
}

// One problem at the model's size with both work buffers, and the column scan's output to compare with.
struct GdnRig {
  int n = timing_n();
  std::mt19937 rng{fresh_seed()};
  Problem p{n, kHk, kHv, kD, kD, rng};
  DevProblem dp{p};
  Dev<float> work{lc::gdn_chunked_work_floats(n, kHk, kHv, kD, kD)};
  Dev<float> work_scan{lc::gdn_prefill_work_floats(n, kHk, kHv, kD)};
  std::vector<float> scan_out;  // bf16 output of the column scan from S0, as floats
  GdnRig() {
    std::printf("[work] chunked scratch %.1f MB, column scan scratch %.1f MB\n", work.n * 4 / 1e6,
                work_scan.n * 4 / 1e6);
    GdnPrefillArgs a = dp.a;
    a.work = work_scan.p;
    lc::gdn_prefill(a, nullptr);
    cudaDeviceSynchronize();
    scan_out = bf16_to_f(dp.out.get());
  }
};
GdnRig& rig() {
  static GdnRig r;
  return r;
}

void BM_GdnConvPrefill(benchmark::State& state) {
  const int n = timing_n();
  const int64_t conv_dim = 2 * kHk * kD + kHv * kD;
  std::mt19937 rng(fresh_seed());
  Dev<float> dqkv(rand_f(size_t(n) * conv_dim, rng, -1.f, 1.f)), dconv(size_t(n) * conv_dim);
  Dev<float> dcw(rand_f(size_t(conv_dim) * 4, rng, -0.5f, 0.5f)), dcs(rand_f(size_t(conv_dim) * 3, rng, -1.f, 1.f));
  float ms = 0;
  for (auto _ : state) {
    ms = time_ms([&] {
      lc::gdn_conv_prefill(dqkv.p, conv_dim, dcw.p, dcs.p, dconv.p, conv_dim, n, int(conv_dim), 4, nullptr);
    });
    state.SetIterationTime(ms * 1e-3);
  }
  const double bytes = double(n) * conv_dim * 4 * 2;
  std::printf("[timing] gdn_conv_prefill n=%d: %8.3f ms  %6.0f GB/s\n", n, ms, bytes / ms / 1e6);
  state.counters["GB/s"] = bytes / ms / 1e6;
  if (cudaGetLastError() != cudaSuccess) state.SkipWithError("CUDA error");
}

void BM_GdnScan(benchmark::State& state) {
  GdnRig& g = rig();
  GdnPrefillArgs a = g.dp.a;
  a.work = g.work_scan.p;
  float ms = 0;
  for (auto _ : state) {
    ms = time_ms([&] { lc::gdn_prefill(a, nullptr); });
    state.SetIterationTime(ms * 1e-3);
  }
  std::printf("[timing] gdn_prefill column scan (prep + scan + norm) 32 heads n=%d: %8.3f ms  %.1f us/token\n", g.n,
              ms, ms * 1e3 / g.n);
  state.counters["us/token"] = ms * 1e3 / g.n;
  if (cudaGetLastError() != cudaSuccess) state.SkipWithError("CUDA error");
}

void BM_GdnChunked(benchmark::State& state, GdnChunkedMath math, const char* cols) {
  GdnRig& g = rig();
  GdnPrefillArgs a = g.dp.a;
  a.work = g.work.p;
  {  // once from the initial state: the same output as the column scan (up to rounding)
    g.dp.S.put(g.p.S0);
    g.dp.out.poison();
    lc::gdn_prefill_chunked(a, nullptr, math);
    cudaDeviceSynchronize();
    const double e = rel_err(bf16_to_f(g.dp.out.get()), g.scan_out, "chunked vs column scan out(bf16)");
    if (!(e <= 5e-3)) {
      state.SkipWithError(("output off the column scan's: " + std::to_string(e)).c_str());
      return;
    }
  }
  setenv("LILAC_GDN_CHUNKED_COLS", cols, 1);
  float ms = 0;
  for (auto _ : state) {
    ms = time_ms([&] { lc::gdn_prefill_chunked(a, nullptr, math); });
    state.SetIterationTime(ms * 1e-3);
  }
  unsetenv("LILAC_GDN_CHUNKED_COLS");
  std::printf("[timing] gdn_prefill_chunked %-6s cols %s n=%d: %8.3f ms\n", math_name(math), cols, g.n, ms);
  state.counters["us/token"] = ms * 1e3 / g.n;
  if (cudaGetLastError() != cudaSuccess) state.SkipWithError("CUDA error");
}

}  // namespace

void lilac::bench::register_benchmarks() {
  const std::string n = "/n:" + std::to_string(timing_n());
  benchmark::RegisterBenchmark(("GdnConvPrefill" + n).c_str(), BM_GdnConvPrefill)
      ->UseManualTime()
      ->Iterations(1)
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark(("GdnScan" + n).c_str(), BM_GdnScan)
      ->UseManualTime()
      ->Iterations(1)
      ->Unit(benchmark::kMillisecond);
  for (const char* cols : {"32", "64", "16"})
    for (auto math : {GdnChunkedMath::Split3xTF32, GdnChunkedMath::TF32})
      benchmark::RegisterBenchmark(
          (std::string("GdnChunked/") + math_name(math) + "/cols:" + cols + n).c_str(), BM_GdnChunked, math, cols)
          ->UseManualTime()
          ->Iterations(1)
          ->Unit(benchmark::kMillisecond);
}

LILAC_KERNEL_BENCH_MAIN("Gated DeltaNet")
