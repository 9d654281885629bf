// One weight tile's math in the digits arithmetic (digits.h): 16 weight rows × one 64-group against J n-tiles of 8
// input rows, or against one input row (its three digits as one n-tile's columns). Shared by digits.cu, the digits
// MoE (moe_digits_one.cu, moe_digits_rows.cu), the rows staging (stage_rows.cu: digits8 / put_digits) and the
// routed-MoE prototype (bench/proto_int8_moe.cu), which keeps its own L (digits per value) to compare 2 and 3.
#pragma once
#include <cstdint>

#include "cuda/kernels/ptx.cuh"
#include "cuda/kernels/tc_common.cuh"  // group_meta

namespace lilac::cuda::digits::tile {

__device__ __forceinline__ float bf_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf_hi(uint32_t w) { return __uint_as_float(w & 0xFFFF0000u); }

// A weight tile's 16 bytes w as the u8 A operands of its two k32 steps (a0: words x, y; a1: words z, w), each byte's
// low and high nibbles apart.
__device__ __forceinline__ void nibble_operands(const uint4 w, uint32_t (&a0)[4], uint32_t (&a1)[4]) {
  constexpr uint32_t kM = 0x0F0F0F0Fu;
  a0[0] = w.x & kM, a0[1] = w.y & kM, a0[2] = (w.x >> 4) & kM, a0[3] = (w.y >> 4) & kM;
  a1[0] = w.z & kM, a1[1] = w.w & kM, a1[2] = (w.z >> 4) & kM, a1[3] = (w.w >> 4) & kM;
}

// w: this lane's 16 bytes of the tile (its A fragments of both k32 steps), s0 / s1: the {scale, bias} words of its
// rows g8 and g8 + 8. The L digits' mmas, then per (output, row) acc = fma(scale, float(Σ q·v)·2^(E-B), acc);
// acc = fma(bias, Σx, acc). xb: this lane's B unit of digit 0 (shared address), lstep: to the next digit; mp: this
// lane's meta pair {2^(E-B), Σx} of n-tile 0 (rows 2c, 2c + 1; n-tiles 8 float2 apart).
template <int L, int J>
__device__ __forceinline__ void tile_math(const uint4 w, uint32_t s0, uint32_t s1, uint32_t xb, uint32_t lstep,
                                          const float2* mp, float (&acc)[J][4]) {
  uint32_t a0[4], a1[4];
  nibble_operands(w, a0, a1);
  const float ws[2] = {bf_lo(s0), bf_lo(s1)}, wb[2] = {bf_hi(s0), bf_hi(s1)};
#pragma unroll
  for (int j = 0; j < J; ++j) {
    int d[L][4];
#pragma unroll
    for (int l = 0; l < L; ++l) {
      d[l][0] = d[l][1] = d[l][2] = d[l][3] = 0;
      const uint4 b = ::lilac::cuda::dev::lds128(xb + l * lstep + j * 512);
      ::lilac::cuda::dev::mma_m16n8k32_u8s8(d[l], a0, b.x, b.y);
      ::lilac::cuda::dev::mma_m16n8k32_u8s8(d[l], a1, b.z, b.w);
    }
    const float4 mm = *reinterpret_cast<const float4*>(mp + 8 * j);  // rows 2c, 2c + 1 of the n-tile
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      int S = d[0][v];
#pragma unroll
      for (int l = 1; l < L; ++l) S = S * 256 + d[l][v];
      const float p2 = (v & 1) ? mm.z : mm.x, xsum = (v & 1) ? mm.w : mm.y;
      acc[j][v] = fmaf(ws[v >> 1], float(S) * p2, acc[j][v]);
      acc[j][v] = fmaf(wb[v >> 1], xsum, acc[j][v]);
    }
  }
}

// The digits of one 64-group's values, v = the 8 values of one thread (columns 8t'..8t'+7 of the group, t' in
// 0..7) with the group's exponent E (frexp_e of its max |x|: |x| < 2^E): q = rint(v·2^(21-E)), |q| <= 2^21,
// as three signed base-256 digits d0·65536 + d1·256 + d2. In the MoE layout (moe_digits.h) the thread's 8 bytes
// of digit l are word 0 = columns 0, 2, 4, 6 and word 1 = columns 1, 3, 5, 7 of its eight.
__device__ __forceinline__ void digits8(const float (&v)[8], int E, uint2 (&d)[3]) {
  const float inv = __int_as_float((127 - E) << 23);  // 2^-E (E in [-125, 126])
  uint32_t w[3][2] = {{0u, 0u}, {0u, 0u}, {0u, 0u}};
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    int q = int(rintf((v[j] * inv) * 2097152.f));
    const int d2 = ((q + 128) & 255) - 128;
    q = (q - d2) >> 8;
    const int d1 = ((q + 128) & 255) - 128;
    const int d0 = (q - d1) >> 8;
    const int sh = 8 * (j >> 1), h = j & 1;
    w[0][h] |= uint32_t(d0 & 255) << sh;
    w[1][h] |= uint32_t(d1 & 255) << sh;
    w[2][h] |= uint32_t(d2 & 255) << sh;
  }
#pragma unroll
  for (int l = 0; l < 3; ++l) d[l] = make_uint2(w[l][0], w[l][1]);
}

// The exact group dots of one input row: b = this lane's B unit of digit g8 (lanes g8 >= 3: zeros), so column n
// of the n-tile is digit n; lane c = 0 gets S for rows g8 (S0) and g8 + 8 (S1), the third digit's sum from lane
// c = 1. The same integers as tile_math's S, hence the same float operations give the same bits.
__device__ __forceinline__ void tile_dots_one(const uint4 w, const uint4 b, int& S0, int& S1) {
  uint32_t a0[4], a1[4];
  nibble_operands(w, a0, a1);
  int d[4] = {0, 0, 0, 0};
  ::lilac::cuda::dev::mma_m16n8k32_u8s8(d, a0, b.x, b.y);
  ::lilac::cuda::dev::mma_m16n8k32_u8s8(d, a1, b.z, b.w);
  const int t0 = __shfl_down_sync(0xffffffffu, d[0], 1), t2 = __shfl_down_sync(0xffffffffu, d[2], 1);
  S0 = (d[0] * 256 + d[1]) * 256 + t0;
  S1 = (d[2] * 256 + d[3]) * 256 + t2;
}

// J n-tiles of 8 input rows: S[j][v] for (row g8 + 8(v >> 1), input row 8j + 2c + (v & 1)), as tile_math.
template <int L, int J>
__device__ __forceinline__ void tile_dots(const uint4 w, uint32_t xb, uint32_t lstep, int (&S)[J][4]) {
  uint32_t a0[4], a1[4];
  nibble_operands(w, a0, a1);
#pragma unroll
  for (int j = 0; j < J; ++j) {
    int d[L][4];
#pragma unroll
    for (int l = 0; l < L; ++l) {
      d[l][0] = d[l][1] = d[l][2] = d[l][3] = 0;
      const uint4 b = ::lilac::cuda::dev::lds128(xb + l * lstep + j * 512);
      ::lilac::cuda::dev::mma_m16n8k32_u8s8(d[l], a0, b.x, b.y);
      ::lilac::cuda::dev::mma_m16n8k32_u8s8(d[l], a1, b.z, b.w);
    }
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      int x = d[0][v];
#pragma unroll
      for (int l = 1; l < L; ++l) x = x * 256 + d[l][v];
      S[j][v] = x;
    }
  }
}

// The float part, per (output, input row, group): the chained form (a slice's sum) and the group value (MoE
// down, whose one-row kernel spreads an expert's groups over warps).
__device__ __forceinline__ float fold(float acc, float ws, float wb, int S, float p2, float xsum) {
  acc = fmaf(ws, float(S) * p2, acc);
  return fmaf(wb, xsum, acc);
}
__device__ __forceinline__ float group_value(float ws, float wb, int S, float p2, float xsum) {
  return fmaf(ws, float(S) * p2, wb * xsum);
}

// Thread t's 8 values (columns 8t..8t+7 of a row) → its bytes of the three digits at dig ([3][G][64],
// moe_digits.h's layout) and, from the group's first thread, meta[g] = {2^(E-21), Σx}; group_meta's shuffles need
// the 8 threads of a group together (callers iterate whole warps; on = false: a thread past the row).
__device__ __forceinline__ void put_digits(const float (&v)[8], bool on, int t, int G, char* dig, float2* meta) {
  int E;
  float sum;
  ::lilac::cuda::tc::group_meta(v, E, sum);
  if (!on) return;
  uint2 d[3];
  digits8(v, E, d);
#pragma unroll
  for (int l = 0; l < 3; ++l) *reinterpret_cast<uint2*>(dig + (int64_t(l) * G + t / 8) * 64 + 8 * (t & 7)) = d[l];
  if ((t & 7) == 0) meta[t / 8] = make_float2(ldexpf(1.f, E - 21), sum);
}

}  // namespace lilac::cuda::digits::tile
