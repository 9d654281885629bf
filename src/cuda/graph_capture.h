// Capturing a sequence of launches on a stream into an instantiated CUDA graph (the MTP head's and the
// verify step's graphs; relaxed capture mode, so host-side allocation-free helpers may run meanwhile).
#pragma once
#include <cuda_runtime.h>

#include "cuda/cuda_common.h"

namespace lilac::cuda {

// Runs f() under capture on `s` and instantiates what it enqueued; on an exception the capture is ended
// and the exception passes on.
template <typename F>
cudaGraphExec_t capture_graph(cudaStream_t s, F&& f) {
  cudaGraph_t g = nullptr;
  LILAC_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
  try {
    f();
  } catch (...) {
    cudaStreamEndCapture(s, &g);
    if (g) cudaGraphDestroy(g);
    throw;
  }
  LILAC_CUDA_CHECK(cudaStreamEndCapture(s, &g));
  cudaGraphExec_t e = nullptr;
  LILAC_CUDA_CHECK(cudaGraphInstantiate(&e, g, 0));
  cudaGraphDestroy(g);
  return e;
}

}  // namespace lilac::cuda
