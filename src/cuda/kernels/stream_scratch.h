// Host helpers for kernels that need a scratch buffer when the caller passes none: one buffer per
// stream, owned by the (static) StreamScratch instance of the kernel that uses it, grown on demand
// (the old one freed once its stream has drained), never shrunk. No allocation may happen while a
// stream is captured into a CUDA graph: callers check `capturing` first.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <map>
#include <mutex>
#include <utility>

namespace lilac::cuda {

// Whether `stream` is being captured (an error asking counts as capturing: allocate nothing; the
// error is cleared).
inline bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &cs) != cudaSuccess) {
    cudaGetLastError();
    return true;
  }
  return cs != cudaStreamCaptureStatusNone;
}

class StreamScratch {
 public:
  // At least `floats` floats for `stream`, or nullptr when the allocation fails (the CUDA error is
  // cleared; the stream then has no buffer).
  float* get(cudaStream_t stream, size_t floats) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& b = bufs_[stream];
    if (b.second < floats) {
      if (b.first) {
        cudaStreamSynchronize(stream);
        cudaFree(b.first);
        b = {nullptr, 0};
      }
      if (cudaMalloc(&b.first, floats * sizeof(float)) != cudaSuccess) {
        cudaGetLastError();
        b = {nullptr, 0};
        return nullptr;
      }
      b.second = floats;
    }
    return b.first;
  }

 private:
  std::mutex mu_;
  std::map<cudaStream_t, std::pair<float*, size_t>> bufs_;
};

}  // namespace lilac::cuda
