#include "avx512_emu.h"

#include "core/bf16.h"

#include <cmath>
#include <algorithm>
#include <cstring>
#include <vector>

namespace lilac::cpufast::emu {

namespace {

constexpr int kLanes = 16;

float bf16f(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

float f16f(uint16_t h) { return f16_to_f32(h); }

// _mm512_reduce_add_ps: upper 8 lanes + lower 8, then upper 4 + lower 4, then (0 + 2), (1 + 3), then the two.
float reduce_add(const float* v) {
  float t3[8], t6[4];
  for (int i = 0; i < 8; ++i) t3[i] = v[8 + i] + v[i];
  for (int i = 0; i < 4; ++i) t6[i] = t3[4 + i] + t3[i];
  return (t6[0] + t6[2]) + (t6[1] + t6[3]);
}

// The 16-row tile of kernels_avx512.cpp computes each row independently: the integer sums (exact), then
// per block inner = fma(s, d, mid · rsum) [= fma(s2, d2, inner)], acc = fma(scale, inner, acc),
// acc = fma(bias, xsum, acc).
void gemm_emu(const PackedMatrix& W, int64_t tile0, int64_t tile1, const QActs& X, float* Y, int64_t ldy) {
  const int R = W.R;
  const int64_t qbytes = W.block_bytes - 4 * R;
  std::vector<float> acc(static_cast<size_t>(X.n));
  for (int64_t tile = tile0; tile < tile1; ++tile) {
    const uint8_t* tp = W.data + tile * tile_bytes(W);
    const int64_t r0 = tile * R;
    const int nr = int(W.rows - r0 < R ? W.rows - r0 : R);
    for (int r = 0; r < nr; ++r) {
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t b = 0; b < W.blocks; ++b) {
        const uint8_t* bp = tp + b * W.block_bytes;
        int32_t q[kBlock];
        for (int j = 0; j < kBlock; ++j) {
          if (W.bits == 4) {
            const uint8_t byte = bp[((j % 32) / 4 * R + r) * 4 + j % 4];
            q[j] = j < 32 ? byte & 15 : byte >> 4;
          } else {
            q[j] = bp[(j / 4 * R + r) * 4 + j % 4];
          }
        }
        uint16_t sc, bi;
        std::memcpy(&sc, bp + qbytes + 2 * r, 2);
        std::memcpy(&bi, bp + qbytes + 2 * R + 2 * r, 2);
        for (int64_t t = 0; t < X.n; ++t) {
          const int8_t* x = act_q(X, t) + b * kBlock;
          int32_t s = 0, s2 = 0;
          for (int j = 0; j < kBlock; ++j) s += q[j] * x[j];
          float inner = std::fma(float(s), act_d(X, t)[b], W.mid * act_rsum(X, t)[b]);
          if (X.q2) {
            const int8_t* x2 = act_q2(X, t) + b * kBlock;
            for (int j = 0; j < kBlock; ++j) s2 += q[j] * x2[j];
            inner = std::fma(float(s2), act_d2(X, t)[b], inner);
          }
          float& a = acc[static_cast<size_t>(t)];
          a = std::fma(bf16f(sc), inner, a);
          a = std::fma(bf16f(bi), act_sum(X, t)[b], a);
        }
      }
      for (int64_t t = 0; t < X.n; ++t) Y[t * ldy + r0 + r] = acc[static_cast<size_t>(t)];
    }
  }
}

// dot_avx512 / dot_f16_avx512: two 16-lane accumulators over 32 values per step, one more 16 into the
// first, a masked tail into the second, the lanes added and reduced; axpy: one fused multiply-add per value.
template <typename B>
float dot_emu_t(const float* a, const B* b, int64_t n, float (*cvt)(B)) {
  float s0[kLanes] = {}, s1[kLanes] = {};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int l = 0; l < kLanes; ++l) {
      s0[l] = std::fma(a[i + l], cvt(b[i + l]), s0[l]);
      s1[l] = std::fma(a[i + 16 + l], cvt(b[i + 16 + l]), s1[l]);
    }
  for (; i + 16 <= n; i += 16)
    for (int l = 0; l < kLanes; ++l) s0[l] = std::fma(a[i + l], cvt(b[i + l]), s0[l]);
  for (int l = 0; l < n - i; ++l) s1[l] = std::fma(a[i + l], cvt(b[i + l]), s1[l]);
  float v[kLanes];
  for (int l = 0; l < kLanes; ++l) v[l] = s0[l] + s1[l];
  return reduce_add(v);
}

float id(float x) { return x; }

float dot_emu(const float* a, const float* b, int64_t n) { return dot_emu_t<float>(a, b, n, id); }
float dot_f16_emu(const float* a, const uint16_t* b, int64_t n) { return dot_emu_t<uint16_t>(a, b, n, f16f); }
void axpy_emu(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = std::fma(a, x[i], y[i]);
}
void axpy_f16_emu(float a, const uint16_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = std::fma(a, f16f(x[i]), y[i]);
}

// The several-row helpers: each row as the one-row helper (kernels.h).
void dots_emu(const float* a, const float* B, int64_t ldb, int64_t m, int64_t n, float* out) {
  for (int64_t j = 0; j < m; ++j) out[j] = dot_emu(a, B + j * ldb, n);
}
void axpys_emu(const float* p, const float* B, int64_t ldb, int64_t m, float* y, int64_t n) {
  for (int64_t j = 0; j < m; ++j) axpy_emu(p[j], B + j * ldb, y, n);
}
void f16_to_f32_emu(const uint16_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = f16f(x[i]);
}

const KernelSet kSet = {"avx512-vnni (emulated)", 8,        gemm_emu,  dot_emu,       axpy_emu, dot_f16_emu,
                        axpy_f16_emu,             dots_emu, axpys_emu, f16_to_f32_emu};

}  // namespace

const KernelSet& avx512_emulated() { return kSet; }

}  // namespace lilac::cpufast::emu
