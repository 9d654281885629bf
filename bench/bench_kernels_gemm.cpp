// The quantized GEMM family (src/cuda/kernels/gemm/) at the model's sizes, a 4096-token chunk
// (LILAC_PREFILL_TIMING overrides n), on each tensor-core path (mma.sync, and wgmma where available):
//   Qgemm/<matrix>/<path>  — one 4-bit GEMM, fp32 out (TFLOP/s); paths mma.sync, wgmma (the register-operand
//                            kernel for 4-bit), wgmma-smem (the shared-memory weight tile);
//   MoePrefill/<path>      — the MoE block: router, routing, grouped gate+up+SwiGLU and down GEMMs over
//                            256 experts (top 8), shared expert, combine (TFLOP/s of the useful work);
//   MoePrefillPath/<grouped|small>/n:<16..2048> — the same block at short prompts on each expert-GEMM path
//                            (gemm.h MoePath), µs per call;
//   MoeSmallExperts/n:<16..2048> — the small-M expert GEMMs alone: µs and weight TB/s of each.
// Each time is the median of 20 CUDA-event timings after 3 warm-up calls (default stream); the
// outputs must be finite. Without a GPU it prints "no CUDA GPU" and exits 0.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "cuda/kernels/gemm/gemm.h"
#include "kernel_bench.h"
#include "moe_weights_fixture.h"
#include "prefill_data.h"

namespace lc = lilac::cuda;
using namespace lilac::cuda::prefill_testing;

namespace {

int timing_n() {
  const char* env = std::getenv("LILAC_PREFILL_TIMING");
  return env && *env ? std::atoi(env) : 4096;
}

bool all_finite_dev(const float* p, size_t n) {
  std::vector<float> v(n);
  cudaMemcpy(v.data(), p, n * 4, cudaMemcpyDeviceToHost);
  for (float x : v)
    if (!std::isfinite(x)) return false;
  return true;
}

// Random bf16 activations [n, 8192] (wide enough for every case), built once.
const __nv_bfloat16* activations() {
  static std::mt19937 rng(fresh_seed());
  static Dev<uint16_t> dx(rand_bf16(size_t(timing_n()) * 8192, rng, -1.f, 1.f, nullptr));
  return reinterpret_cast<const __nv_bfloat16*>(dx.p);
}

const char* path_name(lc::GemmPath p) {
  return p == lc::GemmPath::Wgmma ? "wgmma" : p == lc::GemmPath::WgmmaSmem ? "wgmma-smem" : "mma.sync";
}

struct Shape {
  const char* name;
  int rows, cols;
};
const Shape kShapes[] = {{"in_proj_qkv 2048->8192", 8192, 2048},
                         {"q_proj 2048->8192", 8192, 2048},
                         {"out_proj 4096->2048", 2048, 4096},
                         {"in_proj_z 2048->4096", 4096, 2048}};

void BM_Qgemm(benchmark::State& state, Shape sh, lc::GemmPath path) {
  const int n = timing_n();
  std::mt19937 rng(fresh_seed());
  QMat W(sh.rows, sh.cols, 4, rng);
  Dev<float> dy(size_t(n) * sh.rows);
  const __nv_bfloat16* X = activations();
  lc::set_gemm_path(path);
  float ms = 0;
  for (auto _ : state) {
    ms = time_ms([&] { lc::qgemm(W.dev(), X, sh.cols, n, dy.p, sh.rows, lc::GemmOut::StoreF32, nullptr); });
    state.SetIterationTime(ms * 1e-3);
  }
  lc::set_gemm_path(lc::GemmPath::Auto);
  const double fl = 2.0 * n * sh.rows * sh.cols;
  std::printf("[timing] qgemm %-24s %-8s n=%d: %8.3f ms  %6.1f TFLOP/s\n", sh.name, path_name(path), n, ms,
              fl / ms / 1e9);
  state.counters["TFLOP/s"] = fl / ms / 1e9;
  if (!all_finite_dev(dy.p, dy.n)) state.SkipWithError("non-finite output");
}

void BM_MoePrefill(benchmark::State& state, lc::GemmPath path) {
  const int n = timing_n();
  const int hidden = 2048, E = 256, k = 8, inter = 512;
  std::mt19937 rng(fresh_seed());
  const MoeBlockQ m(E, hidden, inter, inter, rng);  // shared expert as wide as a routed one
  const lc::MoEPrefillWeights w = m.view(k);
  Dev<float> dy(size_t(n) * hidden);
  Dev<unsigned char> ws(lc::moe_prefill_workspace_bytes(w, n));
  cudaMemset(dy.p, 0, dy.n * 4);
  const __nv_bfloat16* X = activations();
  lc::set_gemm_path(path);
  float ms = 0;
  for (auto _ : state) {
    ms = time_ms([&] { lc::moe_prefill(w, X, hidden, n, dy.p, hidden, false, ws.p, nullptr); });
    state.SetIterationTime(ms * 1e-3);
  }
  lc::set_gemm_path(lc::GemmPath::Auto);
  const double fl = 2.0 * n * (double(k) * 3 * inter * hidden + 3.0 * inter * hidden + double(E) * hidden);
  std::printf("[timing] moe_prefill (256 experts top-8 + shared) %-8s n=%d: %8.3f ms  %6.1f TFLOP/s\n",
              path_name(path), n, ms, fl / ms / 1e9);
  state.counters["TFLOP/s"] = fl / ms / 1e9;
  if (!all_finite_dev(dy.p, dy.n)) state.SkipWithError("non-finite output");
}

// The MoE block at a short prompt on each expert-GEMM path (gemm.h: MoePath; the default tensor-core path):
// what a prefill chunk of n tokens pays per layer for its MoE.
void BM_MoePrefillPath(benchmark::State& state, int n, lc::MoePath path) {
  const int hidden = 2048, E = 256, k = 8, inter = 512;
  std::mt19937 rng(fresh_seed());
  const MoeBlockQ m(E, hidden, inter, inter, rng);  // shared expert as wide as a routed one
  const lc::MoEPrefillWeights w = m.view(k);
  Dev<uint16_t> dx(rand_bf16(size_t(n) * hidden, rng, -1.f, 1.f, nullptr));
  Dev<float> dy(size_t(n) * hidden);
  Dev<unsigned char> ws(lc::moe_prefill_workspace_bytes(w, n));
  cudaMemset(dy.p, 0, dy.n * 4);
  const auto* X = reinterpret_cast<const __nv_bfloat16*>(dx.p);
  lc::set_moe_path(path);
  float ms = 0;
  for (auto _ : state) {
    ms = time_ms([&] { lc::moe_prefill(w, X, hidden, n, dy.p, hidden, false, ws.p, nullptr); });
    state.SetIterationTime(ms * 1e-3);
  }
  lc::set_moe_path(lc::MoePath::Auto);
  std::printf("[timing] moe_prefill %-7s n=%5d: %8.1f us\n", path == lc::MoePath::Small ? "small" : "grouped", n,
              ms * 1e3);
  state.counters["us"] = ms * 1e3;
  if (!all_finite_dev(dy.p, dy.n)) state.SkipWithError("non-finite output");
}

// The small-M expert GEMMs alone (gate/up + SwiGLU, down) at the model's widths on a uniform random top-8
// routing of n tokens: µs of each kernel and the weight bytes of the hit experts (each once: the floor; CTAs
// sharing an expert's 16-token chunks read its weights together) per µs — compare with the grouped GEMMs' ncu times (bench/PERF.md).
void BM_MoeSmallExperts(benchmark::State& state, int n) {
  const int hidden = 2048, E = 256, k = 8, inter = 512;
  std::mt19937 rng(fresh_seed());
  const MoeBlockQ m(E, hidden, inter, 0, rng, /*with_router=*/false);
  const lc::MoEPrefillWeights w = m.view(k);
  SortedRouting r = make_sorted_routing(n, E, k, 0.f, rng);
  const int P = n * k;
  Dev<uint16_t> dx(rand_bf16(size_t(n) * hidden, rng, -1.f, 1.f, nullptr)), dh(size_t(P) * inter);
  SortedRoutingDev dr(r);
  Dev<float> dy(size_t(P) * hidden);
  const auto* X = reinterpret_cast<const __nv_bfloat16*>(dx.p);
  auto* H = reinterpret_cast<__nv_bfloat16*>(dh.p);
  float ms_gu = 0, ms_dn = 0;
  for (auto _ : state) {
    ms_gu = time_ms([&] { lc::moe_small_gate_up(w.gate, w.up, X, hidden, dr.tok.p, dr.start.p, P, H, inter, 0); });
    ms_dn = time_ms([&] { lc::moe_small_down(w.down, H, inter, dr.start.p, P, dr.w.p, dy.p, hidden, nullptr); });
    state.SetIterationTime((ms_gu + ms_dn) * 1e-3);
  }
  const double per_row = double(hidden) / 2 + double(hidden) / 64 * 4;  // packed 4-bit + bf16 scale, bias
  const int once = 1 << 30;  // "chunk" larger than any expert's count: each hit expert once
  const double b_gu = r.chunked_bytes(2.0 * inter * per_row, once);
  const double b_dn = r.chunked_bytes(double(hidden) * (double(inter) / 2 + double(inter) / 64 * 4), once);
  int hit = 0;
  for (int e = 0; e < E; ++e) hit += r.start[e + 1] > r.start[e];
  std::printf("[timing] moe_small n=%5d (%3d experts hit): gate/up %7.1f us (%5.0f MB, %4.2f TB/s)  down %7.1f us "
              "(%5.0f MB, %4.2f TB/s)\n",
              n, hit, ms_gu * 1e3, b_gu / 1e6, b_gu / ms_gu / 1e9, ms_dn * 1e3, b_dn / 1e6, b_dn / ms_dn / 1e9);
  state.counters["gate_up_us"] = ms_gu * 1e3;
  state.counters["down_us"] = ms_dn * 1e3;
  if (!all_finite_dev(dy.p, dy.n)) state.SkipWithError("non-finite output");
}

}  // namespace

void lilac::bench::register_benchmarks() {
  for (int n : {16, 128, 512, 2048})
    benchmark::RegisterBenchmark((std::string("MoeSmallExperts/n:") + std::to_string(n)).c_str(), BM_MoeSmallExperts,
                                 n)
        ->UseManualTime()
        ->Iterations(1)
        ->Unit(benchmark::kMicrosecond);
  for (int n : {16, 128, 512, 1024, 2048})
    for (lc::MoePath p : {lc::MoePath::Grouped, lc::MoePath::Small})
      benchmark::RegisterBenchmark(
          (std::string("MoePrefillPath/") + (p == lc::MoePath::Small ? "small" : "grouped") + "/n:" + std::to_string(n))
              .c_str(),
          BM_MoePrefillPath, n, p)
          ->UseManualTime()
          ->Iterations(1)
          ->Unit(benchmark::kMicrosecond);
  std::vector<lc::GemmPath> paths = {lc::GemmPath::MmaSync};
  if (lc::gemm_wgmma_available()) {
    paths.push_back(lc::GemmPath::Wgmma);  // 4-bit: the register-operand kernel
    paths.push_back(lc::GemmPath::WgmmaSmem);
  }
  const std::string n = "/n:" + std::to_string(timing_n());
  for (const Shape& sh : kShapes)
    for (lc::GemmPath p : paths) {
      std::string name = std::string("Qgemm/") + sh.name + "/" + path_name(p) + n;
      for (char& ch : name)
        if (ch == ' ') ch = '_';
      benchmark::RegisterBenchmark(name.c_str(), BM_Qgemm, sh, p)
          ->UseManualTime()
          ->Iterations(1)
          ->Unit(benchmark::kMillisecond);
    }
  for (lc::GemmPath p : paths)
    benchmark::RegisterBenchmark((std::string("MoePrefill/") + path_name(p) + n).c_str(), BM_MoePrefill, p)
        ->UseManualTime()
        ->Iterations(1)
        ->Unit(benchmark::kMillisecond);
}

LILAC_KERNEL_BENCH_MAIN("quantized GEMM")
