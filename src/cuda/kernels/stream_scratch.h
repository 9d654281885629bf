// Per-stream host helpers. StreamScratch: for kernels that need a scratch buffer when the caller passes
// none: one buffer per stream, owned by the (static) StreamScratch instance of the kernel that uses it,
// grown on demand (the old one freed once its stream has drained), never shrunk. No allocation may
// happen while a stream is captured into a CUDA graph: callers check `capturing` first.
// SideStream: a second stream per stream for independent work inside one call (fork / join by events).
#pragma once
#include <cuda_runtime.h>

#include <atomic>
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

// Bytes all StreamScratch buffers hold (memory outside every session's budget: the engine's own paths pass
// their scratch in; tests check that a session's prefill and decode leave this unchanged).
inline std::atomic<size_t> g_stream_scratch_bytes{0};

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
        g_stream_scratch_bytes -= b.second * sizeof(float);
        b = {nullptr, 0};
      }
      if (cudaMalloc(&b.first, floats * sizeof(float)) != cudaSuccess) {
        cudaGetLastError();
        b = {nullptr, 0};
        return nullptr;
      }
      b.second = floats;
      g_stream_scratch_bytes += floats * sizeof(float);
    }
    return b.first;
  }

 private:
  std::mutex mu_;
  std::map<cudaStream_t, std::pair<float*, size_t>> bufs_;
};

// fork(stream): a side stream that first waits for everything queued on `stream` so far (or `stream`
// itself when none can be made, e.g. the first use happens during a graph capture); join(stream):
// `stream` waits for everything queued on that side stream since. Under graph capture the side
// branch becomes part of the captured graph. One fork / join pair at a time per stream.
class SideStream {
 public:
  cudaStream_t fork(cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mu_);
    Side& sd = sides_[stream];
    if (sd.s == nullptr) {
      if (capturing(stream)) return stream;
      if (cudaStreamCreateWithFlags(&sd.s, cudaStreamNonBlocking) != cudaSuccess ||
          cudaEventCreateWithFlags(&sd.fork, cudaEventDisableTiming) != cudaSuccess ||
          cudaEventCreateWithFlags(&sd.join, cudaEventDisableTiming) != cudaSuccess) {
        cudaGetLastError();
        sides_.erase(stream);
        return stream;
      }
    }
    cudaEventRecord(sd.fork, stream);
    cudaStreamWaitEvent(sd.s, sd.fork, 0);
    return sd.s;
  }
  void join(cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sides_.find(stream);
    if (it == sides_.end() || it->second.s == nullptr) return;  // fork returned `stream` itself
    cudaEventRecord(it->second.join, it->second.s);
    cudaStreamWaitEvent(stream, it->second.join, 0);
  }

 private:
  struct Side {
    cudaStream_t s = nullptr;
    cudaEvent_t fork = nullptr, join = nullptr;
  };
  std::mutex mu_;
  std::map<cudaStream_t, Side> sides_;
};

}  // namespace lilac::cuda
