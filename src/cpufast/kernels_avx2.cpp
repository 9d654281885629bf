// AVX2 kernels (with FMA and F16C): vpmaddubsw (u4 weights x s8 activations) + vpmaddwd, 8 rows per
// tile, one int32 lane per row, up to 4 tokens per pass sharing each weight load. Compiled with
// -mavx2 -mfma -mf16c for this file only; used only when the CPU reports AVX2 + FMA.
#include "cpufast/kernels.h"

#if defined(__x86_64__) && defined(__AVX2__)
#include <immintrin.h>
#include <cstring>

namespace lilac::cpufast {
namespace {

constexpr int R = 8;

inline __m256i bcast32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

inline __m256 bf16x8(const uint8_t* p) {
  return _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
}

// The float terms of one block (kernels.h): inner = s d + mid rsum [+ s2 d2], acc += scale inner + bias xsum.
template <int NT, int L>
inline void block_epilogue(const uint8_t* sb, const QActs& X, int64_t t0, int64_t b, float mid, const __m256i* iacc,
                           __m256* acc) {
  const __m256 sc = bf16x8(sb), bi = bf16x8(sb + 2 * R);
  for (int t = 0; t < NT; ++t) {
    __m256 inner = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc[t * L]), _mm256_set1_ps(act_d(X, t0 + t)[b]),
                                   _mm256_set1_ps(mid * act_rsum(X, t0 + t)[b]));
    if (L == 2)
      inner = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc[t * L + L - 1]), _mm256_set1_ps(act_d2(X, t0 + t)[b]), inner);
    acc[t] = _mm256_fmadd_ps(sc, inner, acc[t]);
    acc[t] = _mm256_fmadd_ps(bi, _mm256_set1_ps(act_sum(X, t0 + t)[b]), acc[t]);
  }
}

// NT tokens (rows t0.. of X; L levels each, so NT * L integer streams) against one tile; returns the
// R sums per token in acc.
template <int NT, int L>
void tile4(const uint8_t* tp, const PackedMatrix& W, const QActs& X, int64_t t0, __m256* acc) {
  constexpr int NS = NT * L;
  const __m256i m4 = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
  const int64_t qbytes = W.block_bytes - 4 * R;
  const float mid = W.mid;
  const int8_t* xs[NS];
  for (int t = 0; t < NT; ++t) {
    xs[t * L] = act_q(X, t0 + t);
    if (L == 2) xs[t * L + L - 1] = act_q2(X, t0 + t);
  }
  for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < W.blocks; ++b) {
    const uint8_t* bp = tp + b * W.block_bytes;
    __m256i iacc[NS];
    for (int i = 0; i < NS; ++i) iacc[i] = _mm256_setzero_si256();
    for (int half = 0; half < 2; ++half) {
      __m256i p16[NS];
      for (int i = 0; i < NS; ++i) p16[i] = _mm256_setzero_si256();
      for (int c = 4 * half; c < 4 * half + 4; ++c) {
        const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bp + c * 32));
        const __m256i lo = _mm256_and_si256(w, m4), hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), m4);
        for (int i = 0; i < NS; ++i) {
          const int8_t* x = xs[i] + b * kBlock + 4 * c;
          const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, bcast32(x)), _mm256_maddubs_epi16(hi, bcast32(x + 32)));
          p16[i] = _mm256_add_epi16(p16[i], p);  // |.| <= 4 * 2 * 2 * 15 * 127 = 30480
        }
      }
      for (int i = 0; i < NS; ++i) iacc[i] = _mm256_add_epi32(iacc[i], _mm256_madd_epi16(p16[i], ones));
    }
    block_epilogue<NT, L>(bp + qbytes, X, t0, b, mid, iacc, acc);
  }
}

template <int NT, int L>
void tile8(const uint8_t* tp, const PackedMatrix& W, const QActs& X, int64_t t0, __m256* acc) {
  constexpr int NS = NT * L;
  const __m256i m4 = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1), sixteen = _mm256_set1_epi16(16);
  const int64_t qbytes = W.block_bytes - 4 * R;
  const float mid = W.mid;
  const int8_t* xs[NS];
  for (int t = 0; t < NT; ++t) {
    xs[t * L] = act_q(X, t0 + t);
    if (L == 2) xs[t * L + L - 1] = act_q2(X, t0 + t);
  }
  for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < W.blocks; ++b) {
    const uint8_t* bp = tp + b * W.block_bytes;
    __m256i iacc[NS];
    for (int i = 0; i < NS; ++i) iacc[i] = _mm256_setzero_si256();
    for (int half = 0; half < 2; ++half) {
      __m256i plo[NS], phi[NS];
      for (int i = 0; i < NS; ++i) plo[i] = phi[i] = _mm256_setzero_si256();
      for (int c = 8 * half; c < 8 * half + 8; ++c) {
        const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bp + c * 32));
        const __m256i lo = _mm256_and_si256(w, m4), hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), m4);
        for (int i = 0; i < NS; ++i) {
          const __m256i x = bcast32(xs[i] + b * kBlock + 4 * c);
          plo[i] = _mm256_add_epi16(plo[i], _mm256_maddubs_epi16(lo, x));  // |.| <= 8 * 3810
          phi[i] = _mm256_add_epi16(phi[i], _mm256_maddubs_epi16(hi, x));
        }
      }
      for (int i = 0; i < NS; ++i)
        iacc[i] = _mm256_add_epi32(iacc[i], _mm256_add_epi32(_mm256_madd_epi16(plo[i], ones),
                                                             _mm256_madd_epi16(phi[i], sixteen)));
    }
    block_epilogue<NT, L>(bp + qbytes, X, t0, b, mid, iacc, acc);
  }
}

template <int NT, int L>
void run_tile(const uint8_t* tp, const PackedMatrix& W, const QActs& X, int64_t t0, int64_t r0, int nr, float* Y,
              int64_t ldy) {
  __m256 acc[NT];
  if (W.bits == 4)
    tile4<NT, L>(tp, W, X, t0, acc);
  else
    tile8<NT, L>(tp, W, X, t0, acc);
  for (int t = 0; t < NT; ++t) {
    float* y = Y + (t0 + t) * ldy + r0;
    if (nr == R) {
      _mm256_storeu_ps(y, acc[t]);
    } else {
      float tmp[R];
      _mm256_storeu_ps(tmp, acc[t]);
      for (int r = 0; r < nr; ++r) y[r] = tmp[r];
    }
  }
}

// Tokens in groups of 4 (one level) or 2 (two levels), the rest one by one: a token's operations are
// the same in any group.
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

void gemm_avx2(const PackedMatrix& W, int64_t tile0, int64_t tile1, const QActs& X, float* Y, int64_t ldy) {
  if (X.q2)
    gemm_levels<2>(W, tile0, tile1, X, Y, ldy);
  else
    gemm_levels<1>(W, tile0, tile1, X, Y, ldy);
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

inline __m256 load_f16(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }

float dot_avx2(const float* a, const float* b, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
  float s = hsum(_mm256_add_ps(s0, s1));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

void axpy_avx2(float a, const float* x, float* y, int64_t n) {
  const __m256 va = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += a * x[i];
}

float dot_f16_avx2(const float* a, const uint16_t* b, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), load_f16(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), load_f16(b + i + 8), s1);
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), load_f16(b + i), s0);
  float s = hsum(_mm256_add_ps(s0, s1));
  for (; i < n; ++i) s += a[i] * _cvtsh_ss(b[i]);
  return s;
}

void axpy_f16_avx2(float a, const uint16_t* x, float* y, int64_t n) {
  const __m256 va = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, load_f16(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += a * _cvtsh_ss(x[i]);
}

// Four rows per pass share each load of a; each row's two accumulators and steps are dot_avx2's. Lengths
// that are not a multiple of 16 go row by row through dot_avx2 (its scalar tail).
void dots_avx2(const float* a, const float* B, int64_t ldb, int64_t m, int64_t n, float* out) {
  int64_t j = 0;
  if (n % 16 == 0)
    for (; j + 4 <= m; j += 4) {
      const float* b[4] = {B + j * ldb, B + (j + 1) * ldb, B + (j + 2) * ldb, B + (j + 3) * ldb};
      __m256 s0[4], s1[4];
      for (int r = 0; r < 4; ++r) s0[r] = s1[r] = _mm256_setzero_ps();
      for (int64_t i = 0; i < n; i += 16) {
        const __m256 a0 = _mm256_loadu_ps(a + i), a1 = _mm256_loadu_ps(a + i + 8);
        for (int r = 0; r < 4; ++r) {
          s0[r] = _mm256_fmadd_ps(a0, _mm256_loadu_ps(b[r] + i), s0[r]);
          s1[r] = _mm256_fmadd_ps(a1, _mm256_loadu_ps(b[r] + i + 8), s1[r]);
        }
      }
      for (int r = 0; r < 4; ++r) out[j + r] = hsum(_mm256_add_ps(s0[r], s1[r]));
    }
  for (; j < m; ++j) out[j] = dot_avx2(a, B + j * ldb, n);
}

// y in registers, 32 values at a time, while the m rows are added in order (axpy_avx2's fused
// multiply-add per value and row); a tail shorter than 8 values as axpy_avx2 does it.
void axpys_avx2(const float* p, const float* B, int64_t ldb, int64_t m, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256 v[4];
    for (int k = 0; k < 4; ++k) v[k] = _mm256_loadu_ps(y + i + 8 * k);
    for (int64_t j = 0; j < m; ++j) {
      const __m256 pj = _mm256_set1_ps(p[j]);
      const float* b = B + j * ldb + i;
      for (int k = 0; k < 4; ++k) v[k] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(b + 8 * k), v[k]);
    }
    for (int k = 0; k < 4; ++k) _mm256_storeu_ps(y + i + 8 * k, v[k]);
  }
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(y + i);
    for (int64_t j = 0; j < m; ++j) v = _mm256_fmadd_ps(_mm256_set1_ps(p[j]), _mm256_loadu_ps(B + j * ldb + i), v);
    _mm256_storeu_ps(y + i, v);
  }
  if (i < n)
    for (int64_t j = 0; j < m; ++j) axpy_avx2(p[j], B + j * ldb + i, y + i, n - i);
}

void f16_to_f32_avx2(const uint16_t* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, load_f16(x + i));
  for (; i < n; ++i) y[i] = _cvtsh_ss(x[i]);
}

const KernelSet kSet = {"avx2",        R,         gemm_avx2,  dot_avx2,       axpy_avx2, dot_f16_avx2,
                        axpy_f16_avx2, dots_avx2, axpys_avx2, f16_to_f32_avx2};

}  // namespace

const KernelSet* kernels_avx2() { return &kSet; }

}  // namespace lilac::cpufast

#else
namespace lilac::cpufast {
const KernelSet* kernels_avx2() { return nullptr; }
}  // namespace lilac::cpufast
#endif
