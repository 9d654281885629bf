// AVX-512 VNNI kernels: vpdpbusd (u4 / u8 weights x s8 activations, int32 accumulate without
// saturation), 16 rows per tile (one int32 lane per row), up to 4 tokens per pass sharing each weight
// load. Compiled with AVX-512 F/BW/VL/VNNI flags for this file only; used only when the CPU and the
// OS report them (isa.cpp).
#include "cpufast/kernels.h"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#include <cstring>

namespace lilac::cpufast {
namespace {

constexpr int R = 16;

inline __m512i bcast32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

inline __m512 bf16x16(const uint8_t* p) {
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}

template <int NT, int L>
void tile_nt(const uint8_t* tp, const PackedMatrix& W, const QActs& X, int64_t t0, __m512* acc) {
  constexpr int NS = NT * L;
  const __m512i m4 = _mm512_set1_epi8(15);
  const int64_t qbytes = W.block_bytes - 4 * R;
  const float mid = W.mid;
  const int8_t* xs[NS];
  for (int t = 0; t < NT; ++t) {
    xs[t * L] = act_q(X, t0 + t);
    if (L == 2) xs[t * L + L - 1] = act_q2(X, t0 + t);
  }
  for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t b = 0; b < W.blocks; ++b) {
    const uint8_t* bp = tp + b * W.block_bytes;
    __m512i iacc[NS];
    for (int i = 0; i < NS; ++i) iacc[i] = _mm512_setzero_si512();
    if (W.bits == 4) {
      for (int c = 0; c < 8; ++c) {
        const __m512i w = _mm512_loadu_si512(bp + c * 64);
        const __m512i lo = _mm512_and_si512(w, m4), hi = _mm512_and_si512(_mm512_srli_epi16(w, 4), m4);
        for (int i = 0; i < NS; ++i) {
          const int8_t* x = xs[i] + b * kBlock + 4 * c;
          iacc[i] = _mm512_dpbusd_epi32(iacc[i], lo, bcast32(x));
          iacc[i] = _mm512_dpbusd_epi32(iacc[i], hi, bcast32(x + 32));
        }
      }
    } else {
      for (int c = 0; c < 16; ++c) {
        const __m512i w = _mm512_loadu_si512(bp + c * 64);
        for (int i = 0; i < NS; ++i) iacc[i] = _mm512_dpbusd_epi32(iacc[i], w, bcast32(xs[i] + b * kBlock + 4 * c));
      }
    }
    // The float terms (kernels.h): inner = s d + mid rsum [+ s2 d2], acc += scale inner + bias xsum.
    const __m512 sc = bf16x16(bp + qbytes), bi = bf16x16(bp + qbytes + 2 * R);
    for (int t = 0; t < NT; ++t) {
      __m512 inner = _mm512_fmadd_ps(_mm512_cvtepi32_ps(iacc[t * L]), _mm512_set1_ps(act_d(X, t0 + t)[b]),
                                     _mm512_set1_ps(mid * act_rsum(X, t0 + t)[b]));
      if (L == 2)
        inner = _mm512_fmadd_ps(_mm512_cvtepi32_ps(iacc[t * L + L - 1]), _mm512_set1_ps(act_d2(X, t0 + t)[b]), inner);
      acc[t] = _mm512_fmadd_ps(sc, inner, acc[t]);
      acc[t] = _mm512_fmadd_ps(bi, _mm512_set1_ps(act_sum(X, t0 + t)[b]), acc[t]);
    }
  }
}

template <int NT, int L>
void run_tile(const uint8_t* tp, const PackedMatrix& W, const QActs& X, int64_t t0, int64_t r0, int nr, float* Y,
              int64_t ldy) {
  __m512 acc[NT];
  tile_nt<NT, L>(tp, W, X, t0, acc);
  const __mmask16 m = nr == R ? __mmask16(0xFFFF) : __mmask16((1u << nr) - 1u);
  for (int t = 0; t < NT; ++t) _mm512_mask_storeu_ps(Y + (t0 + t) * ldy + r0, m, acc[t]);
}

// Tokens in groups of 4 (either level count: 32 zmm registers), the rest one by one.
template <int L>
void gemm_levels(const PackedMatrix& W, int64_t tile0, int64_t tile1, const QActs& X, float* Y, int64_t ldy) {
  for (int64_t tile = tile0; tile < tile1; ++tile) {
    const uint8_t* tp = W.data + tile * tile_bytes(W);
    const int64_t r0 = tile * R;
    const int nr = int(W.rows - r0 < R ? W.rows - r0 : R);
    int64_t t = 0;
    for (; t + 4 <= X.n; t += 4) run_tile<4, L>(tp, W, X, t, r0, nr, Y, ldy);
    for (; t < X.n; ++t) run_tile<1, L>(tp, W, X, t, r0, nr, Y, ldy);
  }
}

void gemm_avx512(const PackedMatrix& W, int64_t tile0, int64_t tile1, const QActs& X, float* Y, int64_t ldy) {
  if (X.q2)
    gemm_levels<2>(W, tile0, tile1, X, Y, ldy);
  else
    gemm_levels<1>(W, tile0, tile1, X, Y, ldy);
}

inline __m512 load_f16(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
inline __m512 load_f16_masked(__mmask16 m, const uint16_t* p) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p)); }

inline __mmask16 tail_mask(int64_t k) { return __mmask16((1u << k) - 1u); }

float dot_avx512(const float* a, const float* b, int64_t n) {
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
  }
  for (; i + 16 <= n; i += 16) s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s1);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

void axpy_avx512(float a, const float* x, float* y, int64_t n) {
  const __m512 va = _mm512_set1_ps(a);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(va, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i)));
  }
}

float dot_f16_avx512(const float* a, const uint16_t* b, int64_t n) {
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), load_f16(b + i), s0);
    s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), load_f16(b + i + 16), s1);
  }
  for (; i + 16 <= n; i += 16) s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), load_f16(b + i), s0);
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), load_f16_masked(m, b + i), s1);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

void axpy_f16_avx512(float a, const uint16_t* x, float* y, int64_t n) {
  const __m512 va = _mm512_set1_ps(a);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, load_f16(x + i), _mm512_loadu_ps(y + i)));
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(va, load_f16_masked(m, x + i), _mm512_maskz_loadu_ps(m, y + i)));
  }
}

// Four rows per pass share each load of a; each row's two accumulators and steps are dot_avx512's. Lengths
// that are not a multiple of 32 go row by row through dot_avx512 (its 16-wide step and masked tail).
void dots_avx512(const float* a, const float* B, int64_t ldb, int64_t m, int64_t n, float* out) {
  int64_t j = 0;
  if (n % 32 == 0)
    for (; j + 4 <= m; j += 4) {
      const float* b[4] = {B + j * ldb, B + (j + 1) * ldb, B + (j + 2) * ldb, B + (j + 3) * ldb};
      __m512 s0[4], s1[4];
      for (int r = 0; r < 4; ++r) s0[r] = s1[r] = _mm512_setzero_ps();
      for (int64_t i = 0; i < n; i += 32) {
        const __m512 a0 = _mm512_loadu_ps(a + i), a1 = _mm512_loadu_ps(a + i + 16);
        for (int r = 0; r < 4; ++r) {
          s0[r] = _mm512_fmadd_ps(a0, _mm512_loadu_ps(b[r] + i), s0[r]);
          s1[r] = _mm512_fmadd_ps(a1, _mm512_loadu_ps(b[r] + i + 16), s1[r]);
        }
      }
      for (int r = 0; r < 4; ++r) out[j + r] = _mm512_reduce_add_ps(_mm512_add_ps(s0[r], s1[r]));
    }
  for (; j < m; ++j) out[j] = dot_avx512(a, B + j * ldb, n);
}

// y in registers, 64 values at a time, while the m rows are added in order (axpy_avx512's fused
// multiply-add per value and row); the rest 16 values at a time, then masked, as axpy_avx512.
void axpys_avx512(const float* p, const float* B, int64_t ldb, int64_t m, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    __m512 v[4];
    for (int k = 0; k < 4; ++k) v[k] = _mm512_loadu_ps(y + i + 16 * k);
    for (int64_t j = 0; j < m; ++j) {
      const __m512 pj = _mm512_set1_ps(p[j]);
      const float* b = B + j * ldb + i;
      for (int k = 0; k < 4; ++k) v[k] = _mm512_fmadd_ps(pj, _mm512_loadu_ps(b + 16 * k), v[k]);
    }
    for (int k = 0; k < 4; ++k) _mm512_storeu_ps(y + i + 16 * k, v[k]);
  }
  for (; i + 16 <= n; i += 16) {
    __m512 v = _mm512_loadu_ps(y + i);
    for (int64_t j = 0; j < m; ++j) v = _mm512_fmadd_ps(_mm512_set1_ps(p[j]), _mm512_loadu_ps(B + j * ldb + i), v);
    _mm512_storeu_ps(y + i, v);
  }
  if (i < n) {
    const __mmask16 mk = tail_mask(n - i);
    __m512 v = _mm512_maskz_loadu_ps(mk, y + i);
    for (int64_t j = 0; j < m; ++j)
      v = _mm512_fmadd_ps(_mm512_set1_ps(p[j]), _mm512_maskz_loadu_ps(mk, B + j * ldb + i), v);
    _mm512_mask_storeu_ps(y + i, mk, v);
  }
}

void f16_to_f32_avx512(const uint16_t* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, load_f16(x + i));
  if (i < n) {
    const __mmask16 mk = tail_mask(n - i);
    _mm512_mask_storeu_ps(y + i, mk, load_f16_masked(mk, x + i));
  }
}

const KernelSet kSet = {"avx512-vnni",   R,           gemm_avx512,  dot_avx512,       axpy_avx512, dot_f16_avx512,
                        axpy_f16_avx512, dots_avx512, axpys_avx512, f16_to_f32_avx512};

}  // namespace

const KernelSet* kernels_avx512() { return &kSet; }

}  // namespace lilac::cpufast

#else
namespace lilac::cpufast {
const KernelSet* kernels_avx512() { return nullptr; }
}  // namespace lilac::cpufast
#endif
