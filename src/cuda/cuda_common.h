// Small helpers shared by the CUDA backend and its kernels: error checks that throw lilac::Error, and the
// measurement switches' reading of the environment.
#pragma once
#include <cuda_runtime.h>

#include <cstdlib>
#include <string>

#include "core/error.h"

namespace lilac::cuda {

inline void check_cuda(cudaError_t e, const char* what, const char* file, int line) {
  if (e != cudaSuccess)
    throw ::lilac::Error(std::string("CUDA error in ") + what + " (" + file + ":" + std::to_string(line) +
                         "): " + cudaGetErrorString(e));
}

// A switch that is on unless the environment variable is exactly "0" (LILAC_DIGITS, LILAC_MOE_RING, ...).
inline bool env_switch_on(const char* var) {
  const char* e = std::getenv(var);
  return !(e && std::string(e) == "0");
}

}  // namespace lilac::cuda

#define LILAC_CUDA_CHECK(expr) ::lilac::cuda::check_cuda((expr), #expr, __FILE__, __LINE__)
#define LILAC_CUDA_LAUNCH_CHECK() ::lilac::cuda::check_cuda(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)
