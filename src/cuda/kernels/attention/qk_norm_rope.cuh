// RMSNorm + partial rotate-half RoPE of one attention head by one warp: the arithmetic both decode paths share
// (attention_decode.cu's q/k kernel, rows/attn_append_rows.cu), one definition so that they agree bit for bit.
#pragma once
#include <cstdint>

#include "cuda/kernels/qdot.cuh"

namespace lilac::cuda::dev {

// Lane holds x[j] = value d = lane + 32·j of the head (zero for d >= hd), w[j] its norm weight and fr[j] its
// inverse frequency (d < 2·half). xw: hd floats of shared memory for this warp (the rotation's partners).
// emit(d, value) for every d < hd: x·rsqrt(mean(x²) + eps)·w, rotated at position pos where d < 2·half.
// All 32 lanes must call.
template <int NJ, typename Emit>
__device__ __forceinline__ void qk_head_norm_rope(float (&x)[NJ], const float (&w)[NJ], const float (&fr)[NJ], int hd,
                                                  int half, float eps, int64_t pos, float* xw, int lane, Emit&& emit) {
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < NJ; ++j) ss += x[j] * x[j];
  ss = warp_sum(ss);
  const float r = rsqrtf(ss / float(hd) + eps);
#pragma unroll
  for (int j = 0; j < NJ; ++j) {
    const int d = lane + 32 * j;
    x[j] = x[j] * r * w[j];
    if (d < hd) xw[d] = x[j];
  }
  __syncwarp();
#pragma unroll
  for (int j = 0; j < NJ; ++j) {
    const int d = lane + 32 * j;
    if (d >= hd) break;
    float val = x[j];
    if (d < 2 * half) {
      float sn, cs;
      sincosf(float(pos) * fr[j], &sn, &cs);
      val = d < half ? x[j] * cs - xw[d + half] * sn : x[j] * cs + xw[d - half] * sn;
    }
    emit(d, val);
  }
}

}  // namespace lilac::cuda::dev
