// Shared pieces of the CUDA kernel benchmarks (bench_kernels_<family>.cpp, built only with CUDA):
// a main() that exits 0 with "no CUDA GPU" when there is none, CUDA-graph / CUDA-event timing, and the
// summary of a per-block phase trace (the kernels' %globaltimer hooks).
//
// Each benchmark runs its measurement once (Iterations(1), manual time): the reported time is the
// measurement's own per-launch figure (graph replays or a median of event timings, as each benchmark
// says), and the details go to counters and to one printed line per case.
//   build/bench_kernels_gemv --benchmark_filter=GemvTc
#pragma once
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

namespace lilac::bench {

// Whether a CUDA device is usable; otherwise *why says why.
inline bool gpu_present(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    *why = e != cudaSuccess ? cudaGetErrorString(e) : "no device";
    cudaGetLastError();
    return false;
  }
  return true;
}

// µs per repetition of `body` (launches on stream s): `copies` repetitions captured once in a graph,
// one warm-up replay, then `reps` replays back to back between two events; -1 on a CUDA error.
template <typename Body>
double graph_us(cudaStream_t s, int copies, int reps, Body&& body, int warmup = 1) {
  cudaGraph_t g = nullptr;
  cudaGraphExec_t ge = nullptr;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  double us = -1.0;
  if (cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed) == cudaSuccess) {
    for (int i = 0; i < copies; ++i) body();
    if (cudaStreamEndCapture(s, &g) == cudaSuccess && cudaGraphInstantiate(&ge, g, 0) == cudaSuccess &&
        cudaEventCreate(&e0) == cudaSuccess && cudaEventCreate(&e1) == cudaSuccess) {
      for (int i = 0; i < warmup; ++i) cudaGraphLaunch(ge, s);
      cudaEventRecord(e0, s);
      for (int rep = 0; rep < reps; ++rep) cudaGraphLaunch(ge, s);
      cudaEventRecord(e1, s);
      float ms = 0.f;
      if (cudaEventSynchronize(e1) == cudaSuccess && cudaEventElapsedTime(&ms, e0, e1) == cudaSuccess)
        us = 1000.0 * ms / (double(reps) * copies);
    }
  }
  if (ge) cudaGraphExecDestroy(ge);
  if (g) cudaGraphDestroy(g);
  if (e0) cudaEventDestroy(e0);
  if (e1) cudaEventDestroy(e1);
  return us;
}

// A phase trace: buf[block * 8 + k] = %globaltimer (ns) of mark k of each block (0 = not recorded;
// mark 0 = entry, 7 = exit). Summarised per mark as the median (and for every mark the maximum) over
// the blocks that recorded it, in µs after the earliest block entry; `keep(t, block)` may leave blocks
// out of a mark (default: every block that recorded it).
struct PhaseTrace {
  int blocks = 0;       // blocks that recorded an entry
  double med[8], max[8];  // -1: no block recorded the mark
};
template <typename Keep>
PhaseTrace summarise_trace(const std::vector<unsigned long long>& t, size_t n_blocks, Keep&& keep) {
  PhaseTrace pt;
  unsigned long long t0 = ~0ull;
  for (size_t b = 0; b < n_blocks; ++b)
    if (t[b * 8]) {
      t0 = std::min(t0, t[b * 8]);
      ++pt.blocks;
    }
  for (int k = 0; k < 8; ++k) {
    std::vector<double> v;
    for (size_t b = 0; b < n_blocks; ++b)
      if (t[b * 8] && t[b * 8 + size_t(k)] && keep(t, b, k))
        v.push_back((double(t[b * 8 + size_t(k)]) - double(t0)) / 1e3);
    std::sort(v.begin(), v.end());
    pt.med[k] = v.empty() ? -1 : v[v.size() / 2];
    pt.max[k] = v.empty() ? -1 : v.back();
  }
  return pt;
}
inline PhaseTrace summarise_trace(const std::vector<unsigned long long>& t, size_t n_blocks) {
  return summarise_trace(t, n_blocks, [](const std::vector<unsigned long long>&, size_t, int) { return true; });
}

// The benchmarks of one binary are registered by register_benchmarks() (in the binary's .cpp), after
// the GPU check, so that they may depend on the device (e.g. wgmma only on Hopper).
void register_benchmarks();

inline int kernel_bench_main(int argc, char** argv, const char* what) {
  std::string why;
  if (!gpu_present(&why)) {
    std::printf("no CUDA GPU: %s; skipping the %s benchmarks\n", why.c_str(), what);
    return 0;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  register_benchmarks();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

}  // namespace lilac::bench

#define LILAC_KERNEL_BENCH_MAIN(what) \
  int main(int argc, char** argv) { return ::lilac::bench::kernel_bench_main(argc, argv, what); }
