#include "cuda/kernels/launch.cuh"

#include <cstdlib>
#include <cstring>

namespace lilac::cuda {

bool pdl_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("LILAC_PDL");
    if (e && std::strcmp(e, "0") == 0) return false;
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return false;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) return false;
    return major >= 9;
  }();
  return on;
}

}  // namespace lilac::cuda
