// One weight tile's math in the digits arithmetic (digits.h): 16 weight rows × one 64-group against J n-tiles of 8
// input rows. Shared by digits.cu and the routed-MoE prototype (bench/proto_int8_moe.cu), which keeps its own L
// (digits per value) to compare 2 and 3.
#pragma once
#include <cstdint>

#include "cuda/kernels/ptx.cuh"

namespace lilac::cuda::digits::tile {

__device__ __forceinline__ float bf_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf_hi(uint32_t w) { return __uint_as_float(w & 0xFFFF0000u); }

// w: this lane's 16 bytes of the tile (its A fragments of both k32 steps), s0 / s1: the {scale, bias} words of its
// rows g8 and g8 + 8. The L digits' mmas, then per (output, row) acc = fma(scale, float(Σ q·v)·2^(E-B), acc);
// acc = fma(bias, Σx, acc). xb: this lane's B unit of digit 0 (shared address), lstep: to the next digit; mp: this
// lane's meta pair {2^(E-B), Σx} of n-tile 0 (rows 2c, 2c + 1; n-tiles 8 float2 apart).
template <int L, int J>
__device__ __forceinline__ void tile_math(const uint4 w, uint32_t s0, uint32_t s1, uint32_t xb, uint32_t lstep,
                                          const float2* mp, float (&acc)[J][4]) {
  constexpr uint32_t kM = 0x0F0F0F0Fu;
  const uint32_t a0[4] = {w.x & kM, w.y & kM, (w.x >> 4) & kM, (w.y >> 4) & kM};
  const uint32_t a1[4] = {w.z & kM, w.w & kM, (w.z >> 4) & kM, (w.w >> 4) & kM};
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

}  // namespace lilac::cuda::digits::tile
