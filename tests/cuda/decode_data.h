// Data helpers of the decode-kernel tests and the decode kernel benchmarks (bench/bench_kernels_*.cpp),
// free of GoogleTest: fresh seeds, host-side quantized matrices in the MLX layout and their device copies,
// device buffers, relative error, random vectors.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "cuda/kernels/gemv/gemv.h"
#include "model/weights.h"

namespace lilac::cuda::testing {

struct Rng {
  std::mt19937_64 g;
  explicit Rng(uint64_t s) : g(s) {}
  float uni(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(g); }
  float normal(float sd = 1.f) { return std::normal_distribution<float>(0.f, sd)(g); }
  uint32_t word() { return uint32_t(g()); }
};
// A fresh seed per run (tests print it); LILAC_TEST_SEED=<seed> replays one.
inline uint64_t fresh_seed() {
  if (const char* e = std::getenv("LILAC_TEST_SEED"); e && *e) return std::strtoull(e, nullptr, 10);
  return std::random_device{}() * 0x9E3779B97F4A7C15ull ^ std::random_device{}();
}

// Host quantized matrix with its storage.
struct HostQ {
  std::vector<uint32_t> q;
  std::vector<uint16_t> s, b;
  QMatrix m;
  HostQ(Rng& r, int64_t rows, int64_t cols, int bits) {
    m.rows = rows;
    m.cols = cols;
    m.bits = bits;
    m.group_size = 64;
    q.resize(size_t(rows * m.words_per_row()));
    s.resize(size_t(rows * m.groups_per_row()));
    b.resize(s.size());
    for (auto& w : q) w = r.word();
    const float levels = float((1 << bits) - 1);
    for (size_t i = 0; i < s.size(); ++i) {
      const float sc = r.uni(0.5f, 1.5f) / (std::sqrt(float(cols)) * levels * 0.29f);
      s[i] = f32_to_bf16(sc);
      b[i] = f32_to_bf16(-sc * levels / 2 + r.uni(-0.2f, 0.2f) * sc);
    }
    m.qweight = q.data();
    m.scales = s.data();
    m.biases = b.data();
  }
};

// Writes (the constructor's copy, set, poison) are complete when they return: cudaMemset, and cudaMemcpy from pageable
// host memory, run on the legacy default stream and may still be in flight when the call returns, and the tests launch
// their kernels and graphs on non-blocking streams, which do not wait for that stream. Without the device-wide wait a
// replay's poison could land after the graph had written its output (CudaRowsAttention.GraphReplaysWithChangingRows
// once saw every row of one replay non-finite, stop 54).
template <typename T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t count) : n(count) { cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(T)); }
  Dev(const std::vector<T>& v) : Dev(v.size()) { set(v); }
  ~Dev() { cudaFree(p); }
  void poison() {  // NaN for floats
    cudaMemset(p, 0xff, n * sizeof(T));
    cudaDeviceSynchronize();
  }
  std::vector<T> get() const {
    std::vector<T> v(n);
    cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
    return v;
  }
  void set(const std::vector<T>& v) {
    cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
    cudaDeviceSynchronize();
  }
};

struct DevQ {
  Dev<uint32_t> q;
  Dev<uint16_t> s, b;
  lilac::cuda::QMatrixDev d;
  explicit DevQ(const HostQ& h) : q(h.q), s(h.s), b(h.b) {
    d.rows = h.m.rows;
    d.cols = h.m.cols;
    d.bits = h.m.bits;
    d.group_size = h.m.group_size;
    d.qweight = q.p;
    d.scales = reinterpret_cast<const __nv_bfloat16*>(s.p);
    d.biases = reinterpret_cast<const __nv_bfloat16*>(b.p);
  }
};

// Device copies of a MoE layer's matrices (experts stacked: gate/up [E*I, H], down [E*H, I]; shared expert
// [Is, H] / [H, Is]) and the MoEDecodeWeights view the decode kernels take.
struct DevMoE {
  DevQ g, u, d, sg, su, sd;
  lilac::cuda::MoEDecodeWeights w;
  DevMoE(const HostQ& gate, const HostQ& up, const HostQ& down, const HostQ& shared_gate, const HostQ& shared_up,
         const HostQ& shared_down, int E, int k, int64_t I, int64_t H)
      : g(gate), u(up), d(down), sg(shared_gate), su(shared_up), sd(shared_down) {
    w.E = E;
    w.top_k = k;
    w.gate.n = w.up.n = w.down.n = E;
    w.gate.first = g.d;
    w.gate.first.rows = I;
    w.up.first = u.d;
    w.up.first.rows = I;
    w.down.first = d.d;
    w.down.first.rows = H;
    w.shared_gate = sg.d;
    w.shared_up = su.d;
    w.shared_down = sd.d;
  }
};

inline double rel_err(const std::vector<float>& got, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    num += (double(got[i]) - ref[i]) * (double(got[i]) - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

inline std::vector<float> randv(Rng& r, size_t n, float sd = 1.f) {
  std::vector<float> v(n);
  for (auto& x : v) x = r.normal(sd);
  return v;
}

}  // namespace lilac::cuda::testing
