// Data helpers of the prefill-kernel tests and the prefill kernel benchmarks (bench/bench_kernels_*.cpp),
// free of GoogleTest: device buffers, relative error (printed), bf16 / random vectors, random quantized
// matrices (host + device copies), CUDA-event timing.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "core/bf16.h"
#include "cuda/kernels/qmatrix.cuh"
#include "model/weights.h"

namespace lilac::cuda::prefill_testing {

inline uint32_t fresh_seed() { return std::random_device{}(); }

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

// Random values, rounded to bf16: returns the bf16 bits; `f` gets the same values as float.
inline std::vector<uint16_t> rand_bf16(size_t n, std::mt19937& rng, float lo, float hi, std::vector<float>* f) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<uint16_t> v(n);
  if (f) f->resize(n);
  for (size_t i = 0; i < n; ++i) {
    v[i] = f32_to_bf16(d(rng));
    if (f) (*f)[i] = bf16_to_f32(v[i]);
  }
  return v;
}

// A random quantized matrix (or `count` of them back to back), host copy + device copy.
struct QMat {
  std::vector<uint32_t> q;
  std::vector<uint16_t> s, b;
  QMatrix host;  // first matrix
  uint32_t* dq = nullptr;
  __nv_bfloat16 *ds = nullptr, *db = nullptr;
  QMat(int64_t rows, int64_t cols, int bits, std::mt19937& rng, int count = 1) {
    const int64_t words = rows * cols * bits / 32 * count, groups = rows * cols / 64 * count;
    q.resize(words);
    s.resize(groups);
    b.resize(groups);
    for (auto& w : q) w = rng();
    std::uniform_real_distribution<float> sd(0.5f, 1.5f), bd(-0.2f, 0.2f);
    const float qmax = float((1 << bits) - 1);
    for (int64_t g = 0; g < groups; ++g) {
      float sc = sd(rng) * 0.04f / qmax;  // values within ≈ ±0.02·(1 ± 0.5)
      s[g] = f32_to_bf16(sc);
      b[g] = f32_to_bf16(-0.5f * qmax * sc + bd(rng) * sc * qmax);
    }
    host.rows = rows;
    host.cols = cols;
    host.bits = bits;
    host.group_size = 64;
    host.qweight = q.data();
    host.scales = s.data();
    host.biases = b.data();
    cudaMalloc(&dq, q.size() * 4);
    cudaMalloc(&ds, s.size() * 2);
    cudaMalloc(&db, b.size() * 2);
    cudaMemcpy(dq, q.data(), q.size() * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(ds, s.data(), s.size() * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(db, b.data(), b.size() * 2, cudaMemcpyHostToDevice);
  }
  ~QMat() {
    cudaFree(dq);
    cudaFree(ds);
    cudaFree(db);
  }
  QMat(const QMat&) = delete;
  QMatrixDev dev() const {
    QMatrixDev m;
    m.rows = host.rows;
    m.cols = host.cols;
    m.bits = host.bits;
    m.group_size = 64;
    m.qweight = dq;
    m.scales = ds;
    m.biases = db;
    return m;
  }
  QExpertsDev experts(int n) const { return QExpertsDev{n, dev()}; }
  QExperts host_experts(int n) const { return QExperts{n, host}; }
};

inline float silu(float x) { return x / (1.f + std::exp(-x)); }
inline float sigm(float x) { return 1.f / (1.f + std::exp(-x)); }

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
