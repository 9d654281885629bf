// Device pieces shared by the decode GEMV families (gemv.cu: fp32; gemv_tc.cu: tensor cores): the input
// prologues, the row store with the Gated DeltaNet conv epilogue, MoE routing.
#pragma once
#include <cmath>

#include "cuda/kernels/decode.h"
#include "cuda/kernels/qdot.cuh"

namespace lilac::cuda::dev {

// Stage t(x) into xs[cols] (see Prologue). Ends with a barrier.
__device__ inline void stage_input(const GemvArgs& a, float* xs, int cols, float* red) {
  for (int i = threadIdx.x; i < cols; i += blockDim.x) xs[i] = a.x[i];
  if (a.pro == Prologue::RmsNorm) {
    float ss = 0.f;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) ss += xs[i] * xs[i];
    ss = block_sum(ss, red);
    const float r = rsqrtf(ss / float(cols) + a.eps);
    for (int i = threadIdx.x; i < cols; i += blockDim.x) xs[i] = xs[i] * r * a.norm_w[i];
  } else if (a.pro == Prologue::GatedHeadNorm) {
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int hd = a.head_dim, nh = cols / hd;
    for (int h = warp; h < nh; h += nw) {
      float* xh = xs + h * hd;
      float ss = 0.f;
      for (int d = lane; d < hd; d += 32) ss += xh[d] * xh[d];
      ss = warp_sum(ss);
      const float r = rsqrtf(ss / float(hd) + a.eps);
      for (int d = lane; d < hd; d += 32) xh[d] = xh[d] * r * a.norm_w[d] * silu_f(a.z[h * hd + d]);
    }
  }
  __syncthreads();
}

// The y write of one row: optional causal conv + SiLU (rows < conv_rows), then store or accumulate.
__device__ __forceinline__ void gemv_store_row(const GemvArgs& a, int64_t r, float v) {
  if (r < a.conv_rows) {  // causal depthwise conv (state oldest first) + SiLU
    const int K = a.conv_k, S = K - 1;
    const float* w = a.conv_w + r * K;
    float* st = a.conv_state + r * S;
    float acc = 0.f;
    for (int k = 0; k < S; ++k) acc += w[k] * st[k];
    acc += w[S] * v;
    for (int k = 0; k + 1 < S; ++k) st[k] = st[k + 1];
    if (S > 0) st[S - 1] = v;
    v = silu_f(acc);
  }
  a.y[r] = a.accumulate ? a.y[r] + v : v;
}

// Routing by warp 0 of the block into shared memory (and global from block 0).
__device__ inline void route_warp(const float* logits, int E, int k, bool renorm, int* s_ids, float* s_w, int32_t* g_ids,
                           float* g_w) {
  constexpr int kMaxPer = 16;  // E <= 512
  const int lane = threadIdx.x & 31;
  float p[kMaxPer];
  float m = -INFINITY;
#pragma unroll
  for (int i = 0; i < kMaxPer; ++i) {
    const int e = lane + 32 * i;
    p[i] = e < E ? logits[e] : -INFINITY;
    m = fmaxf(m, p[i]);
  }
  m = warp_max(m);
  float z = 0.f;
#pragma unroll
  for (int i = 0; i < kMaxPer; ++i) {
    const int e = lane + 32 * i;
    p[i] = e < E ? expf(p[i] - m) : 0.f;
  }
  // Sum in expert order (as the CPU reference) would be serial; the warp tree sum differs only by rounding.
#pragma unroll
  for (int i = 0; i < kMaxPer; ++i) z += p[i];
  z = warp_sum(z);
#pragma unroll
  for (int i = 0; i < kMaxPer; ++i) p[i] = (lane + 32 * i) < E ? p[i] / z : -1.f;
  uint32_t taken = 0;
  float sum = 0.f;
  for (int t = 0; t < k; ++t) {
    float best = -2.f;
    int bid = 0x7fffffff;
#pragma unroll
    for (int i = 0; i < kMaxPer; ++i)
      if (!(taken >> i & 1u) && p[i] > best) {
        best = p[i];
        bid = lane + 32 * i;
      }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bid, o);
      if (ob > best || (ob == best && oi < bid)) {
        best = ob;
        bid = oi;
      }
    }
    if ((bid & 31) == lane) taken |= 1u << (bid >> 5);
    if (lane == 0) {
      s_ids[t] = bid;
      s_w[t] = best;
    }
    sum += best;
  }
  __syncwarp();
  if (lane == 0) {
    for (int t = 0; t < k; ++t) s_w[t] = renorm ? s_w[t] / sum : s_w[t];
    s_w[k] = sigmoid_f(logits[E]);
    if (blockIdx.x == 0) {
      for (int t = 0; t < k; ++t) {
        g_ids[t] = s_ids[t];
        g_w[t] = s_w[t];
      }
      g_w[k] = s_w[k];
    }
  }
}

}  // namespace lilac::cuda::dev
