// Device helpers for the half2 decode GEMV (LILAC_GEMV=half2, 4-bit weights): the input vector staged
// in shared memory as fp16, scaled per 32-value chunk by a power of two, and the nibbles turned into
// fp16 by the magic-number trick (0x6400 | n is the fp16 value 1024 + n for n < 1024).
//
// Layout (4-bit, chunk c = one 16-byte weight chunk = 32 elements, word k = 0..3 holds elements
// 8k..8k+7, element m of the word at bits 4m). Per word w:
//   (w & 0x000F000F) | 0x64006400        = (1024 + q0, 1024 + q4)
//   (w & 0x00F000F0) | 0x64006400        = (1024 + 16 q1, 1024 + 16 q5)
//   ((w>>8) & 0x000F000F) | 0x64006400   = (1024 + q2, 1024 + q6)
//   ((w>>8) & 0x00F000F0) | 0x64006400   = (1024 + 16 q3, 1024 + 16 q7)
// One HSUB2 of (1032, 1032) resp. (1152, 1152) gives (q − 8) resp. 16 (q − 8) exactly (integers
// < 2048), centred so that the fp16 products do not carry the weights' mean. The staged x of word k of
// chunk c is one uint4 (4 half2) at xh[k][c] (four arrays of nchunk uint4: consecutive lanes read
// consecutive 16-byte rows, no bank conflicts): half2 p = 0..3 holds elements (p, p + 4) of the word,
// divided by the chunk's power of two sg and, for odd p, by 16 more (matching the 16 q of those pairs).
// Per chunk meta[c] = {sg, 8·S, S, 0}, S = Σx over the chunk (fp32, exact input). A row's chunk gets
//   scale·(sg·Σ (q − 8)·x̂ + 8·S) + bias·S  =  scale·Σ q·x + bias·S  (up to the fp16 rounding of x̂).
#pragma once
#include <cstdint>
#include <cuda_fp16.h>

namespace lilac::cuda::dev {

__device__ __forceinline__ __half2 u2h2(uint32_t u) {
  __half2 h;
  memcpy(&h, &u, 4);
  return h;
}

// Σ (q − 8)·x̂ over one 16-byte chunk (half2 products of one chunk, two fp16 accumulators), in fp32.
__device__ __forceinline__ float chunk_dot_h2(const uint4 w, const uint4 x0, const uint4 x1, const uint4 x2,
                                              const uint4 x3) {
  constexpr uint32_t MLO = 0x000F000Fu, MHI = 0x00F000F0u, MAGIC = 0x64006400u;
  const __half2 off_lo = u2h2(0x64086408u);  // 1032
  const __half2 off_hi = u2h2(0x64806480u);  // 1152 = 1024 + 16·8
  __half2 a0 = u2h2(0u), a1 = u2h2(0u);
  auto word = [&](uint32_t q, const uint4 xv, __half2& acc) {
    const uint32_t q8 = q >> 8;
    acc = __hfma2(__hsub2(u2h2((q & MLO) | MAGIC), off_lo), u2h2(xv.x), acc);
    acc = __hfma2(__hsub2(u2h2((q & MHI) | MAGIC), off_hi), u2h2(xv.y), acc);
    acc = __hfma2(__hsub2(u2h2((q8 & MLO) | MAGIC), off_lo), u2h2(xv.z), acc);
    acc = __hfma2(__hsub2(u2h2((q8 & MHI) | MAGIC), off_hi), u2h2(xv.w), acc);
  };
  word(w.x, x0, a0);
  word(w.y, x1, a1);
  word(w.z, x2, a0);
  word(w.w, x3, a1);
  const float2 f0 = __half22float2(a0), f1 = __half22float2(a1);
  return (f0.x + f0.y) + (f1.x + f1.y);
}

// Half offset (from the start of xh) of element i of the input (nchunk chunks of 32).
__device__ __forceinline__ int xh_index(int i, int nchunk) {
  const int c = i >> 5, j = i & 31;
  const int k = j >> 3, m = j & 7;
  return (k * nchunk + c) * 8 + (m & 3) * 2 + (m >> 2);
}

// Stage xs[cols] (fp32, shared, cols % 32 == 0) into xh (the layout above; 16-byte aligned) and
// meta[nchunk], one warp per chunk of 32. No barrier inside; the caller syncs before use.
__device__ void stage_input_h2(const float* xs, int cols, __half* xh, float4* meta) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const int nchunk = cols >> 5;
  for (int c = warp; c < nchunk; c += nw) {
    const float v = xs[c * 32 + lane];
    float amax = fabsf(v), s = v;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
      s += __shfl_xor_sync(0xffffffffu, s, o);
    }
    int e = 0;
    if (amax > 0.f && amax <= 3.0e38f) frexpf(amax, &e);  // amax = m·2^e, m in [0.5, 1)
    const float sg = ldexpf(1.f, e);                      // |x / sg| < 1 (exact power of two)
    const int m = lane & 7;
    const float xv = ldexpf(v, (m & 1) ? -e - 4 : -e);
    xh[xh_index(c * 32 + lane, nchunk)] = __float2half_rn(xv);
    if (lane == 0) meta[c] = make_float4(sg, 8.f * s, s, 0.f);
  }
}

}  // namespace lilac::cuda::dev
