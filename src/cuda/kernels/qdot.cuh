// Device helpers for the decode kernels: dot products of quantized rows (MLX layout) with an fp32
// vector staged in shared memory, and block reductions.
#pragma once
#include <cstdint>
#include <cuda_bf16.h>

#include "cuda/kernels/ptx.cuh"  // ld_stream

namespace lilac::cuda::dev {

__device__ __forceinline__ float bf2f(__nv_bfloat16 v) { return __bfloat162float(v); }

// Exact small-integer to float: 2^23 + u as bits, minus 2^23 (one LOP + one FADD instead of an I2F).
__device__ __forceinline__ float u2f(uint32_t u) { return __int_as_float(0x4B000000u | u) - 8388608.f; }

__device__ __forceinline__ uint32_t sel4(const uint4& w, int i) {
  return i == 0 ? w.x : (i == 1 ? w.y : (i == 2 ? w.z : w.w));
}

// Σ q_i x_i over one 16-byte chunk of packed weights (128/BITS elements); xs = the chunk's x values in
// shared memory (16-byte aligned). `rot` rotates the order of the float4 reads so that the lanes of a
// quarter warp hit different banks.
template <int BITS>
__device__ __forceinline__ float chunk_qx(const uint4 w, const float* xs, int rot) {
  const float4* x4 = reinterpret_cast<const float4*>(xs);
  float a0 = 0.f, a1 = 0.f;
  if constexpr (BITS == 4) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int f = (j + rot) & 7;
      const uint32_t word = sel4(w, f >> 1) >> ((f & 1) * 16);
      const float4 xv = x4[f];
      a0 = fmaf(u2f(word & 15u), xv.x, a0);
      a1 = fmaf(u2f((word >> 4) & 15u), xv.y, a1);
      a0 = fmaf(u2f((word >> 8) & 15u), xv.z, a0);
      a1 = fmaf(u2f((word >> 12) & 15u), xv.w, a1);
    }
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int f = (j + rot) & 3;
      const uint32_t word = sel4(w, f);
      const float4 xv = x4[f];
      a0 = fmaf(u2f(word & 255u), xv.x, a0);
      a1 = fmaf(u2f((word >> 8) & 255u), xv.y, a1);
      a0 = fmaf(u2f((word >> 16) & 255u), xv.z, a0);
      a1 = fmaf(u2f(word >> 24), xv.w, a1);
    }
  }
  return a0 + a1;
}

// Partial dot products (this lane's share) of up to two quantized rows a, b (b may be null) with x
// vectors xa, xb in shared memory (xsum_*: Σx per 16-byte chunk). A group of `lpr` lanes shares the
// rows; gl = lane index in the group. cpg = chunks per quantization group.
template <int BITS>
__device__ __forceinline__ void row_dot2(const uint32_t* qa, const __nv_bfloat16* sa, const __nv_bfloat16* ba,
                                         const float* xa, const float* xsa, const uint32_t* qb,
                                         const __nv_bfloat16* sb, const __nv_bfloat16* bb, const float* xb,
                                         const float* xsb, int nchunk, int lpr, int gl, int cpg, int rot, float& ra,
                                         float& rb) {
  constexpr int EPL = 128 / BITS;
  const uint4* wa = reinterpret_cast<const uint4*>(qa);
  const uint4* wb = reinterpret_cast<const uint4*>(qb);
  float acc_a = 0.f, acc_b = 0.f;
  const uint4 zero = make_uint4(0, 0, 0, 0);
  for (int c = gl; c < nchunk; c += 2 * lpr) {
    const int c2 = c + lpr;
    const bool has2 = c2 < nchunk;
    const uint4 a0 = ld_stream(wa + c);
    const uint4 a1 = has2 ? ld_stream(wa + c2) : zero;
    uint4 b0 = zero, b1 = zero;
    if (qb) {
      b0 = ld_stream(wb + c);
      if (has2) b1 = ld_stream(wb + c2);
    }
    {
      const int g = c / cpg;
      acc_a += bf2f(sa[g]) * chunk_qx<BITS>(a0, xa + c * EPL, rot) + bf2f(ba[g]) * xsa[c];
      if (qb) acc_b += bf2f(sb[g]) * chunk_qx<BITS>(b0, xb + c * EPL, rot) + bf2f(bb[g]) * xsb[c];
    }
    if (has2) {
      const int g = c2 / cpg;
      acc_a += bf2f(sa[g]) * chunk_qx<BITS>(a1, xa + c2 * EPL, rot) + bf2f(ba[g]) * xsa[c2];
      if (qb) acc_b += bf2f(sb[g]) * chunk_qx<BITS>(b1, xb + c2 * EPL, rot) + bf2f(bb[g]) * xsb[c2];
    }
  }
  ra = acc_a;
  rb = acc_b;
}

// Sum over the `lpr` lanes of a group (lpr a power of two <= 32; all 32 lanes must call).
__device__ __forceinline__ float group_sum(float v, int lpr) {
  for (int o = lpr >> 1; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// v summed over the lanes that share lane % FROM (xor shuffles from FROM up to 16); then the lanes below FROM store
// their N sums at part[lane · N + x] (their warp's row of a block's partial sums).
template <int FROM, int N>
__device__ __forceinline__ void warp_partials(float (&v)[N], float* part, int lane) {
#pragma unroll
  for (int o = FROM; o < 32; o <<= 1)
#pragma unroll
    for (int x = 0; x < N; ++x) v[x] += __shfl_xor_sync(0xffffffffu, v[x], o);
  if (lane < FROM)
#pragma unroll
    for (int x = 0; x < N; ++x) part[lane * N + x] = v[x];
}

// Block-wide sum (all threads get the result). red: >= 32 floats of shared memory.
__device__ __forceinline__ float block_sum(float v, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float t = 0.f;
  for (int i = 0; i < nw; ++i) t += red[i];
  return t;
}

__device__ __forceinline__ float silu_f(float x) { return x / (1.f + expf(-x)); }
__device__ __forceinline__ float sigmoid_f(float x) { return 1.f / (1.f + expf(-x)); }

}  // namespace lilac::cuda::dev
