// GPU presence for the CUDA tests: without a usable GPU a test skips and says so (the one allowed skip).
#pragma once
#include <gtest/gtest.h>
#include <cuda_runtime.h>

#include <string>

namespace lilac::cuda::testing {

inline bool gpu_ok(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    *why = e != cudaSuccess ? cudaGetErrorString(e) : "no device";
    cudaGetLastError();
    return false;
  }
  return true;
}

}  // namespace lilac::cuda::testing

#define NEED_GPU()                                                                       \
  do {                                                                                   \
    std::string why_;                                                                    \
    if (!::lilac::cuda::testing::gpu_ok(&why_)) GTEST_SKIP() << "no CUDA GPU: " << why_; \
  } while (0)
