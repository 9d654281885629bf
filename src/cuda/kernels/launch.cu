#include "cuda/kernels/launch.cuh"

#include <cstdlib>
#include <cstring>

namespace lilac::cuda {

bool sm90_or_later() {
  static const bool yes = [] {
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return major >= 9;
  }();
  return yes;
}

bool pdl_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("LILAC_PDL");
    if (e && std::strcmp(e, "0") == 0) return false;
    return sm90_or_later();
  }();
  return on;
}

int sm_count() {
  static int cache[64] = {};
  int dev = 0;
  LILAC_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 0 || dev >= 64) dev = 0;
  if (cache[dev] == 0) {
    int n = 0;
    LILAC_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    cache[dev] = n > 0 ? n : 1;
  }
  return cache[dev];
}

}  // namespace lilac::cuda
