// The portable kernels (any CPU): plain C++ over the packed layout of kernels.h, rows_per_tile 8.
// Also the reference the SIMD kernels are tested against (same integer sums, same block order).
#include "cpufast/kernels.h"

#include <cstring>

namespace lilac::cpufast {
namespace {

inline float bf16f(uint16_t h) {
  union {
    uint32_t u;
    float f;
  } v;
  v.u = uint32_t(h) << 16;
  return v.f;
}

void gemm_scalar(const PackedMatrix& W, int64_t tile0, int64_t tile1, const QActs& X, float* Y, int64_t ldy) {
  const int R = W.R;
  const int64_t qbytes = W.block_bytes - 4 * R;
  const float mid = W.mid;
  for (int64_t tile = tile0; tile < tile1; ++tile) {
    const uint8_t* tp = W.data + tile * tile_bytes(W);
    const int64_t r0 = tile * R;
    const int nr = int(W.rows - r0 < R ? W.rows - r0 : R);
    for (int64_t t = 0; t < X.n; ++t) {
      const int8_t* xq = act_q(X, t);
      const float* xd = act_d(X, t);
      const float* xs = act_sum(X, t);
      const float* xr = act_rsum(X, t);
      float acc[16] = {};
      for (int64_t b = 0; b < W.blocks; ++b) {
        const uint8_t* bp = tp + b * W.block_bytes;
        const uint16_t* sc = reinterpret_cast<const uint16_t*>(bp + qbytes);
        const uint16_t* bi = sc + R;
        const int8_t* x = xq + b * kBlock;
        const int8_t* x2 = X.q2 ? act_q2(X, t) + b * kBlock : nullptr;
        for (int r = 0; r < nr; ++r) {
          int32_t s = 0, s2 = 0;
          if (W.bits == 4) {
            for (int c = 0; c < 8; ++c) {
              const uint8_t* w = bp + (c * R + r) * 4;
              for (int i = 0; i < 4; ++i) {
                s += int32_t(w[i] & 15) * x[4 * c + i] + int32_t(w[i] >> 4) * x[32 + 4 * c + i];
                if (x2) s2 += int32_t(w[i] & 15) * x2[4 * c + i] + int32_t(w[i] >> 4) * x2[32 + 4 * c + i];
              }
            }
          } else {
            for (int c = 0; c < 16; ++c) {
              const uint8_t* w = bp + (c * R + r) * 4;
              for (int i = 0; i < 4; ++i) {
                s += int32_t(w[i]) * x[4 * c + i];
                if (x2) s2 += int32_t(w[i]) * x2[4 * c + i];
              }
            }
          }
          float inner = float(s) * xd[b] + mid * xr[b];
          if (x2) inner = inner + float(s2) * act_d2(X, t)[b];
          acc[r] = acc[r] + bf16f(sc[r]) * inner;
          acc[r] = acc[r] + bf16f(bi[r]) * xs[b];
        }
      }
      for (int r = 0; r < nr; ++r) Y[t * ldy + r0 + r] = acc[r];
    }
  }
}

float dot_scalar(const float* a, const float* b, int64_t n) {
  float acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) acc[k] += a[i + k] * b[i + k];
  float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

void axpy_scalar(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

// IEEE half to float (normal, subnormal, inf, NaN).
inline float f16f(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16, e = (h >> 10) & 31u, m = h & 0x3ffu;
  uint32_t u;
  if (e == 31) {
    u = sign | 0x7f800000u | (m << 13);
  } else if (e != 0) {
    u = sign | ((e + 112) << 23) | (m << 13);
  } else {
    const float f = float(m) * 5.9604644775390625e-8f;  // m * 2^-24, exact
    std::memcpy(&u, &f, 4);
    u |= sign;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

float dot_f16_scalar(const float* a, const uint16_t* b, int64_t n) {
  float acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) acc[k] += a[i + k] * f16f(b[i + k]);
  float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  for (; i < n; ++i) s += a[i] * f16f(b[i]);
  return s;
}

void axpy_f16_scalar(float a, const uint16_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * f16f(x[i]);
}

void dots_scalar(const float* a, const float* B, int64_t ldb, int64_t m, int64_t n, float* out) {
  for (int64_t j = 0; j < m; ++j) out[j] = dot_scalar(a, B + j * ldb, n);
}

void axpys_scalar(const float* p, const float* B, int64_t ldb, int64_t m, float* y, int64_t n) {
  for (int64_t j = 0; j < m; ++j) axpy_scalar(p[j], B + j * ldb, y, n);
}

void f16_to_f32_scalar(const uint16_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = f16f(x[i]);
}

const KernelSet kSet = {"scalar",     8,           gemm_scalar,    dot_scalar,      axpy_scalar,      dot_f16_scalar,
                        axpy_f16_scalar, dots_scalar, axpys_scalar, f16_to_f32_scalar};

}  // namespace

const KernelSet* kernels_scalar() { return &kSet; }

}  // namespace lilac::cpufast
