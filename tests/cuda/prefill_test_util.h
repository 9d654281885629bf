// Shared helpers of the prefill-kernel tests: device buffers, relative error (printed), bf16 / random
// vectors, CUDA-event timing. GPU presence: NEED_GPU() from gpu_test.h.
#pragma once
#include <gtest/gtest.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "core/bf16.h"
#include "gpu_test.h"

#define CK(x)                                                           \
  do {                                                                  \
    cudaError_t e_ = (x);                                               \
    ASSERT_EQ(e_, cudaSuccess) << #x << ": " << cudaGetErrorString(e_); \
  } while (0)

namespace lilac::cuda::prefill_testing {

template <class T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t count) : n(count) {
    if (cudaMalloc(&p, sizeof(T) * (count ? count : 1)) != cudaSuccess) p = nullptr;
  }
  Dev(const std::vector<T>& v) : Dev(v.size()) { cudaMemcpy(p, v.data(), sizeof(T) * v.size(), cudaMemcpyHostToDevice); }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  std::vector<T> get() const {
    std::vector<T> v(n);
    cudaMemcpy(v.data(), p, sizeof(T) * n, cudaMemcpyDeviceToHost);
    return v;
  }
  void put(const std::vector<T>& v) { cudaMemcpy(p, v.data(), sizeof(T) * v.size(), cudaMemcpyHostToDevice); }
  void poison() { cudaMemset(p, 0xff, sizeof(T) * n); }  // NaN for float / bf16
};

// ‖got − ref‖ / ‖ref‖ (printed, with `what` when given); any non-finite value in `got` returns +inf.
inline double rel_err(const std::vector<float>& got, const std::vector<float>& ref, const char* what = nullptr) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i])) {
      if (what) std::printf("[rel_err] %s: non-finite at %zu\n", what, i);
      return INFINITY;
    }
    const double d = double(got[i]) - ref[i];
    num += d * d;
    den += double(ref[i]) * ref[i];
  }
  const double e = std::sqrt(num / std::max(den, 1e-30));
  if (what)
    std::printf("[rel_err] %s %.3g\n", what, e);
  else
    std::printf("[rel_err] %.3g\n", e);
  return e;
}

inline std::vector<float> bf16_to_f(const std::vector<uint16_t>& v) {
  std::vector<float> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = bf16_to_f32(v[i]);
  return o;
}

inline std::vector<float> rand_f(size_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Median of `reps` CUDA-event timings (ms) of f() on the default stream, after 3 warm-up calls.
template <class F>
float time_ms(F&& f, int reps = 20) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (int i = 0; i < 3; ++i) f();
  cudaDeviceSynchronize();
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    cudaEventRecord(a);
    f();
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0.f;
    cudaEventElapsedTime(&ms, a, b);
    t.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace lilac::cuda::prefill_testing
