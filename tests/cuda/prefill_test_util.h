// Shared helpers of the prefill-kernel tests: the data helpers of prefill_data.h, CK (a CUDA call
// must succeed), GPU presence (NEED_GPU() from gpu_test.h), and a loop over the quantized GEMMs'
// tensor-core paths.
#pragma once
#include <gtest/gtest.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "cuda/kernels/gemm/gemm.h"
#include "gpu_test.h"
#include "prefill_data.h"

#define CK(x)                                                           \
  do {                                                                  \
    cudaError_t e_ = (x);                                               \
    ASSERT_EQ(e_, cudaSuccess) << #x << ": " << cudaGetErrorString(e_); \
  } while (0)

namespace lilac::cuda::prefill_testing {

// Runs `f` once per tensor-core path of the quantized GEMMs (mma.sync, and wgmma where available),
// then restores the automatic choice.
template <class F>
void for_each_gemm_path(F&& f) {
  std::vector<std::pair<GemmPath, const char*>> paths = {{GemmPath::MmaSync, "mma.sync"}};
  if (gemm_wgmma_available()) {
    paths.push_back({GemmPath::Wgmma, "wgmma"});  // 4-bit: the register-operand kernel (gemm_rs.cuh)
    paths.push_back({GemmPath::WgmmaSmem, "wgmma-smem"});
  }
  for (auto& [path, name] : paths) {
    SCOPED_TRACE(std::string("gemm path ") + name);
    std::printf("[path] %s\n", name);
    set_gemm_path(path);
    f();
  }
  set_gemm_path(GemmPath::Auto);
}

}  // namespace lilac::cuda::prefill_testing
