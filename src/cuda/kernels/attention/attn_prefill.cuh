// What the two prefill attention kernels share (attention_prefill.cu: mma.sync, any sm_80+; attention_prefill_wg.cu:
// wgmma, Hopper): P's bf16 packing and the output rows. Both keep a warp's 16 query rows in the mma.m16n8 C layout —
// o[4j + e] is row g + 8·(e / 2), column 8j + c2 + e % 2 (g = lane / 4, c2 = 2·(lane % 4)) — and each row's running
// sum l spread over the quad of lanes that hold it.
#pragma once
#include <cstdint>
#include <cuda_bf16.h>

#include "cuda/kernels/attention/attention.h"

namespace lilac::cuda::attn {

__device__ __forceinline__ uint32_t pack_bf16(float a, float b) {
  __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<uint32_t*>(&v);
}

// out[row] = O / l (⊙ sigmoid(gate) when a.gate is set) in bf16 for this warp's chunk rows r0 + g and r0 + g + 8 (those
// below n_new) of head h; l0 / l1 are the two rows' partial sums of this lane, reduced over the quad here.
template <int HD>
__device__ __forceinline__ void store_rows(const AttentionPrefillArgs& a, const float* o, float l0, float l1, int r0,
                                           int h, int g, int c2) {
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  const float inv0 = l0 > 0.f ? 1.f / l0 : 0.f, inv1 = l1 > 0.f ? 1.f / l1 : 0.f;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int qi = r0 + g + half * 8;
    if (qi >= a.n_new) continue;
    const float inv = half ? inv1 : inv0;
    __nv_bfloat16* out = a.out + int64_t(qi) * a.out_stride + int64_t(h) * HD;
    const float* gate = a.gate ? a.gate + int64_t(qi) * a.gate_stride + int64_t(h) * a.gate_head_stride : nullptr;
#pragma unroll
    for (int j = 0; j < HD / 8; ++j) {
      const int d = j * 8 + c2;
      float v0 = o[4 * j + half * 2] * inv, v1 = o[4 * j + half * 2 + 1] * inv;
      if (gate) {
        v0 *= 1.f / (1.f + __expf(-gate[d]));
        v1 *= 1.f / (1.f + __expf(-gate[d + 1]));
      }
      *reinterpret_cast<__nv_bfloat162*>(out + d) = __floats2bfloat162_rn(v0, v1);
    }
  }
}

}  // namespace lilac::cuda::attn
