// ARM64 kernels with the dot-product extension (SDOT, Armv8.2-A+dotprod): 8 rows per tile as two
// int32x4 lanes sets, up to 4 tokens per pass. The 4-bit quants (0..15) are valid signed bytes; 8-bit
// quants are split into nibbles (q = 16 hi + lo). Compiled with -march=armv8.2-a+dotprod for this file
// only; used only when the CPU reports asimddp (isa.cpp).
#include "cpufast/kernels.h"

#if defined(__aarch64__) && defined(__ARM_FEATURE_DOTPROD)
#include <arm_neon.h>
#include <cstring>

namespace lilac::cpufast {
namespace {

constexpr int R = 8;

inline int8x16_t bcast32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return vreinterpretq_s8_s32(vdupq_n_s32(v));
}

inline float32x4_t bf16x4(const uint8_t* p) {
  return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(reinterpret_cast<const uint16_t*>(p)), 16));
}

template <int NT, int L>
void tile_nt(const uint8_t* tp, const PackedMatrix& W, const QActs& X, int64_t t0, float32x4_t* acc) {
  constexpr int NS = NT * L;
  const uint8x16_t m4 = vdupq_n_u8(15);
  const int64_t qbytes = W.block_bytes - 4 * R;
  const float mid = W.mid;
  const int8_t* xs[NS];
  for (int t = 0; t < NT; ++t) {
    xs[t * L] = act_q(X, t0 + t);
    if (L == 2) xs[t * L + L - 1] = act_q2(X, t0 + t);
  }
  for (int t = 0; t < 2 * NT; ++t) acc[t] = vdupq_n_f32(0.f);
  for (int64_t b = 0; b < W.blocks; ++b) {
    const uint8_t* bp = tp + b * W.block_bytes;
    int32x4_t ia[2 * NS], ih[2 * NS];  // [stream][half]
    for (int i = 0; i < 2 * NS; ++i) ia[i] = ih[i] = vdupq_n_s32(0);
    const int chunks = W.bits == 4 ? 8 : 16;
    for (int c = 0; c < chunks; ++c) {
      for (int h = 0; h < 2; ++h) {
        const uint8x16_t w = vld1q_u8(bp + c * 32 + h * 16);
        const int8x16_t lo = vreinterpretq_s8_u8(vandq_u8(w, m4)), hi = vreinterpretq_s8_u8(vshrq_n_u8(w, 4));
        for (int i = 0; i < NS; ++i) {
          const int8_t* x = xs[i] + b * kBlock + 4 * c;
          if (W.bits == 4) {
            ia[2 * i + h] = vdotq_s32(ia[2 * i + h], lo, bcast32(x));
            ia[2 * i + h] = vdotq_s32(ia[2 * i + h], hi, bcast32(x + 32));
          } else {
            const int8x16_t xv = bcast32(x);
            ia[2 * i + h] = vdotq_s32(ia[2 * i + h], lo, xv);
            ih[2 * i + h] = vdotq_s32(ih[2 * i + h], hi, xv);
          }
        }
      }
    }
    for (int h = 0; h < 2; ++h) {
      const float32x4_t sc = bf16x4(bp + qbytes + 8 * h), bi = bf16x4(bp + qbytes + 2 * R + 8 * h);
      // The float terms (kernels.h): inner = s d + mid rsum [+ s2 d2], acc += scale inner + bias xsum.
      for (int t = 0; t < NT; ++t) {
        const int i1 = 2 * (t * L) + h;
        float32x4_t inner = vfmaq_n_f32(vdupq_n_f32(mid * act_rsum(X, t0 + t)[b]),
                                        vcvtq_f32_s32(vaddq_s32(ia[i1], vshlq_n_s32(ih[i1], 4))), act_d(X, t0 + t)[b]);
        if (L == 2) {
          const int i2 = 2 * (t * L + L - 1) + h;
          inner = vfmaq_n_f32(inner, vcvtq_f32_s32(vaddq_s32(ia[i2], vshlq_n_s32(ih[i2], 4))), act_d2(X, t0 + t)[b]);
        }
        acc[2 * t + h] = vfmaq_f32(acc[2 * t + h], sc, inner);
        acc[2 * t + h] = vfmaq_n_f32(acc[2 * t + h], bi, act_sum(X, t0 + t)[b]);
      }
    }
  }
}

template <int NT, int L>
void run_tile(const uint8_t* tp, const PackedMatrix& W, const QActs& X, int64_t t0, int64_t r0, int nr, float* Y,
              int64_t ldy) {
  float32x4_t acc[2 * NT];
  tile_nt<NT, L>(tp, W, X, t0, acc);
  for (int t = 0; t < NT; ++t) {
    float tmp[R];
    vst1q_f32(tmp, acc[2 * t]);
    vst1q_f32(tmp + 4, acc[2 * t + 1]);
    float* y = Y + (t0 + t) * ldy + r0;
    for (int r = 0; r < nr; ++r) y[r] = tmp[r];
  }
}

template <int L>
void gemm_levels(const PackedMatrix& W, int64_t tile0, int64_t tile1, const QActs& X, float* Y, int64_t ldy) {
  constexpr int G = L == 1 ? 4 : 2;
  for (int64_t tile = tile0; tile < tile1; ++tile) {
    const uint8_t* tp = W.data + tile * tile_bytes(W);
    const int64_t r0 = tile * R;
    const int nr = int(W.rows - r0 < R ? W.rows - r0 : R);
    int64_t t = 0;
    for (; t + G <= X.n; t += G) run_tile<G, L>(tp, W, X, t, r0, nr, Y, ldy);
    for (; t < X.n; ++t) run_tile<1, L>(tp, W, X, t, r0, nr, Y, ldy);
  }
}

void gemm_neon(const PackedMatrix& W, int64_t tile0, int64_t tile1, const QActs& X, float* Y, int64_t ldy) {
  if (X.q2)
    gemm_levels<2>(W, tile0, tile1, X, Y, ldy);
  else
    gemm_levels<1>(W, tile0, tile1, X, Y, ldy);
}

float dot_neon(const float* a, const float* b, int64_t n) {
  float32x4_t s0 = vdupq_n_f32(0.f), s1 = vdupq_n_f32(0.f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    s0 = vfmaq_f32(s0, vld1q_f32(a + i), vld1q_f32(b + i));
    s1 = vfmaq_f32(s1, vld1q_f32(a + i + 4), vld1q_f32(b + i + 4));
  }
  float s = vaddvq_f32(vaddq_f32(s0, s1));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

void axpy_neon(float a, const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vfmaq_n_f32(vld1q_f32(y + i), vld1q_f32(x + i), a));
  for (; i < n; ++i) y[i] += a * x[i];
}

inline float32x4_t load_f16(const uint16_t* p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))); }
inline float f16f(uint16_t h) {
  __fp16 v;
  std::memcpy(&v, &h, 2);
  return float(v);
}

float dot_f16_neon(const float* a, const uint16_t* b, int64_t n) {
  float32x4_t s0 = vdupq_n_f32(0.f), s1 = vdupq_n_f32(0.f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    s0 = vfmaq_f32(s0, vld1q_f32(a + i), load_f16(b + i));
    s1 = vfmaq_f32(s1, vld1q_f32(a + i + 4), load_f16(b + i + 4));
  }
  float s = vaddvq_f32(vaddq_f32(s0, s1));
  for (; i < n; ++i) s += a[i] * f16f(b[i]);
  return s;
}

void axpy_f16_neon(float a, const uint16_t* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vfmaq_n_f32(vld1q_f32(y + i), load_f16(x + i), a));
  for (; i < n; ++i) y[i] += a * f16f(x[i]);
}

void dots_neon(const float* a, const float* B, int64_t ldb, int64_t m, int64_t n, float* out) {
  for (int64_t j = 0; j < m; ++j) out[j] = dot_neon(a, B + j * ldb, n);
}

void axpys_neon(const float* p, const float* B, int64_t ldb, int64_t m, float* y, int64_t n) {
  for (int64_t j = 0; j < m; ++j) axpy_neon(p[j], B + j * ldb, y, n);
}

void f16_to_f32_neon(const uint16_t* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) vst1q_f32(y + i, load_f16(x + i));
  for (; i < n; ++i) y[i] = f16f(x[i]);
}

const KernelSet kSet = {"neon-dot", R,         gemm_neon,  dot_neon,       axpy_neon, dot_f16_neon,
                        axpy_f16_neon, dots_neon, axpys_neon, f16_to_f32_neon};

}  // namespace

const KernelSet* kernels_neon() { return &kSet; }

}  // namespace lilac::cpufast

#else
namespace lilac::cpufast {
const KernelSet* kernels_neon() { return nullptr; }
}  // namespace lilac::cpufast
#endif
