// What the standalone prototypes (bench/proto_*.cu; not part of the build) share: a CUDA check that exits, and the
// graph timer they time kernels with (as bench_kernels_rows times main's). Launches with PDL go through
// src/cuda/kernels/launch.cuh's launch_pdl: compile src/cuda/kernels/launch.cu beside the prototype.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#define CK(x)                                                      \
  do {                                                             \
    cudaError_t e_ = (x);                                          \
    if (e_ != cudaSuccess) {                                       \
      std::printf("%s: %s\n", #x, cudaGetErrorString(e_));         \
      std::exit(1);                                                \
    }                                                              \
  } while (0)

namespace proto {

// µs per run(i): a graph of 20 runs (i = 0..19), one warm-up replay, the best of 10 replays.
template <typename Run>
double graph_us(cudaStream_t st, Run&& run) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < 20; ++i) run(i);
  CK(cudaStreamEndCapture(st, &graph));
  CK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaGraphLaunch(exec, st));
  float best = 1e30f;
  for (int rep = 0; rep < 10; ++rep) {
    CK(cudaEventRecord(e0, st));
    CK(cudaGraphLaunch(exec, st));
    CK(cudaEventRecord(e1, st));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    best = std::min(best, ms);
  }
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  return best * 1000.0 / 20;
}

}  // namespace proto
