// Device helpers for the dp4a decode GEMV (LILAC_GEMV=dp4a): the input vector quantized to int8 per
// group of 64 values, laid out so that each packed weight word meets its activations with one
// __dp4a per 4 weights.
//
// Layout (per 16-byte weight chunk c, EPL = 128/BITS elements):
//   4-bit: a weight word w holds elements 8k..8k+7 (element j at bits 4j). lo = w & 0x0F0F0F0F holds
//          elements 0,2,4,6 in bytes 0..3, hi = (w >> 4) & 0x0F0F0F0F elements 1,3,5,7. The activations
//          of chunk c are 8 int32 slots s = 2k + (j&1) (k = word 0..3), byte (j&7)>>1 of the slot; slots
//          0..3 (words 0, 1) are at xa[c] and slots 4..7 (words 2, 3) at xb[c] (two 16-byte arrays, so
//          consecutive lanes read consecutive 16-byte rows: no bank conflicts).
//   8-bit: word k holds elements 4k..4k+3 in bytes 0..3: the natural byte order, xa[c] only.
// Per chunk, meta[c] = {d, C, S1, 0}: d = max|x|/127 of the chunk's 64-group, S1 = Σx over the chunk
// (fp32, exact input), C = zc·(S1 − d·Σxq) with zc = (2^BITS − 1)/2. A chunk's contribution to a row is
//   scale·(d·Σ q·xq + C) + bias·S1
// = scale·Σ q·x + bias·S1 − scale·Σ (q − zc)·e,   e = d·xq − x (the rounding error),
// i.e. the rounding error only meets the centred weights (q − zc), not their mean.
#pragma once
#include <cstdint>

namespace lilac::cuda::dev {

// d = a (unsigned bytes) · b (signed bytes) + c.
__device__ __forceinline__ int dp4a_us(uint32_t a, int b, int c) {
  int d;
  asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// Σ q·xq over one 16-byte weight chunk (integer, exact).
template <int BITS>
__device__ __forceinline__ int chunk_dot_i8(const uint4 w, const int4 xa, const int4 xb) {
  if constexpr (BITS == 4) {
    constexpr uint32_t M = 0x0F0F0F0Fu;
    int s = dp4a_us(w.x & M, xa.x, 0);
    s = dp4a_us((w.x >> 4) & M, xa.y, s);
    s = dp4a_us(w.y & M, xa.z, s);
    s = dp4a_us((w.y >> 4) & M, xa.w, s);
    s = dp4a_us(w.z & M, xb.x, s);
    s = dp4a_us((w.z >> 4) & M, xb.y, s);
    s = dp4a_us(w.w & M, xb.z, s);
    s = dp4a_us((w.w >> 4) & M, xb.w, s);
    return s;
  } else {
    int s = dp4a_us(w.x, xa.x, 0);
    s = dp4a_us(w.y, xa.y, s);
    s = dp4a_us(w.z, xa.z, s);
    s = dp4a_us(w.w, xa.w, s);
    return s;
  }
}

// Byte offset (from the start of xa; xb starts nchunk*16 bytes later) of element i of the input.
template <int BITS>
__device__ __forceinline__ int xq_byte(int i, int nchunk) {
  constexpr int EPL = 128 / BITS;
  const int c = i / EPL, j = i % EPL;
  if constexpr (BITS == 4) {
    const int k = j >> 3, p = j & 7;
    const int slot = 2 * k + (p & 1);
    return (slot >> 2) * nchunk * 16 + c * 16 + (slot & 3) * 4 + (p >> 1);
  } else {
    return c * 16 + j;
  }
}

// Sum over aligned segments of `n` lanes (n a power of two <= 32).
template <typename T>
__device__ __forceinline__ T seg_sum(T v, int n) {
  for (int o = n >> 1; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Quantize xs[cols] (fp32, shared) into xq (bytes, the layout above; 16-byte aligned) and meta[nchunk],
// one warp per group of 64. No barrier inside; the caller syncs before use.
template <int BITS>
__device__ void quantize_input(const float* xs, int cols, signed char* xq, float4* meta) {
  constexpr int EPL = 128 / BITS;
  constexpr float zc = float((1 << BITS) - 1) * 0.5f;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const int nchunk = cols / EPL;
  for (int g = warp; g < cols / 64; g += nw) {
    const int i0 = g * 64 + lane, i1 = i0 + 32;
    const float v0 = xs[i0], v1 = xs[i1];
    float amax = fmaxf(fabsf(v0), fabsf(v1));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float d = amax / 127.f;
    const float inv = amax > 0.f ? 127.f / amax : 0.f;
    const int q0 = max(-127, min(127, __float2int_rn(v0 * inv)));
    const int q1 = max(-127, min(127, __float2int_rn(v1 * inv)));
    xq[xq_byte<BITS>(i0, nchunk)] = static_cast<signed char>(q0);
    xq[xq_byte<BITS>(i1, nchunk)] = static_cast<signed char>(q1);
    const float s0 = seg_sum(v0, EPL), s1 = seg_sum(v1, EPL);
    const int n0 = seg_sum(q0, EPL), n1 = seg_sum(q1, EPL);
    if (lane % EPL == 0) {
      meta[i0 / EPL] = make_float4(d, zc * (s0 - d * float(n0)), s0, 0.f);
      meta[i1 / EPL] = make_float4(d, zc * (s1 - d * float(n1)), s1, 0.f);
    }
  }
}

}  // namespace lilac::cuda::dev
