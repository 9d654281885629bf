// Device pieces shared by the decode GEMV families (gemv.cu: fp32; gemv_tc.cu: tensor cores): the input
// prologues, the row store with the Gated DeltaNet conv epilogue, MoE routing.
#pragma once
#include <cmath>

#include "cuda/kernels/gemv/gemv.h"
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

// Routing by one warp into shared memory (and global from block 0): expert e = lane + 32·i lives in
// slot i of its lane, kMaxPer slots (E <= 32·kMaxPer).
template <int kMaxPer>
__device__ inline void route_warp_n(const float* logits, int E, int k, bool renorm, int* s_ids, float* s_w,
                                    int32_t* g_ids, float* g_w) {
  const int lane = threadIdx.x & 31;
  const float shared_logit = lane == k ? logits[E] : 0.f;  // the shared expert's gate, loaded with the rest
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
  // k rounds of "largest remaining probability, ties to the lower id". A probability p >= 0 orders like
  // its bit pattern; key = bits + 1 (0: taken or past E). One redux for the largest key, one for the
  // lowest id holding it; within a lane the first slot holding its best is its lowest id.
  // The keys stay read-only and the taken slots are a mask: clearing key[bid >> 5] in place made the compiler keep
  // key[] in local memory (an indexed store; two LDL.128 per round, stop 67's SASS survey).
  uint32_t key[kMaxPer];
#pragma unroll
  for (int i = 0; i < kMaxPer; ++i) key[i] = p[i] >= 0.f ? __float_as_uint(p[i]) + 1u : 0u;
  uint32_t taken = 0;  // bit i: this lane's slot i was chosen
  float sum = 0.f, my_w = 0.f;
  int my_id = 0;
  for (int t = 0; t < k; ++t) {
    uint32_t best = 0;
    int bi = 0;
#pragma unroll
    for (int i = 0; i < kMaxPer; ++i) {
      const uint32_t ki = (taken >> i) & 1u ? 0u : key[i];
      if (ki > best) {
        best = ki;
        bi = i;
      }
    }
    const uint32_t top = __reduce_max_sync(0xffffffffu, best);
    const uint32_t bid = __reduce_min_sync(0xffffffffu, best == top ? uint32_t(lane + 32 * bi) : 0xffffffffu);
    if (int(bid & 31) == lane) taken |= 1u << (bid >> 5);
    const float pv = __uint_as_float(top - 1u);
    if (lane == t) {
      my_id = int(bid);
      my_w = pv;
    }
    sum += pv;
  }
  // lane t < k: the t-th choice; lane k: the shared expert's sigmoid gate.
  if (lane < k) {
    const float wt = renorm ? my_w / sum : my_w;
    s_ids[lane] = my_id;
    s_w[lane] = wt;
    if (blockIdx.x == 0) {
      g_ids[lane] = my_id;
      g_w[lane] = wt;
    }
  } else if (lane == k) {
    const float wt = sigmoid_f(shared_logit);
    s_w[k] = wt;
    if (blockIdx.x == 0) g_w[k] = wt;
  }
}

__device__ inline void route_warp(const float* logits, int E, int k, bool renorm, int* s_ids, float* s_w, int32_t* g_ids,
                                  float* g_w) {
  if (E <= 256)
    route_warp_n<8>(logits, E, k, renorm, s_ids, s_w, g_ids, g_w);
  else
    route_warp_n<16>(logits, E, k, renorm, s_ids, s_w, g_ids, g_w);  // E <= 512
}

// [p, p + bytes) into L2, a 128-byte line per thread t of nt, fire and forget (no register holds the result).
__device__ __forceinline__ void prefetch_l2(const void* p, int64_t bytes, int64_t t, int64_t nt) {
  for (int64_t o = t * 128; o < bytes; o += nt * 128)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(static_cast<const char*>(p) + o));
}

// f(pointer, bytes) for each array of the shared expert's gate, up and down (weights, scales, biases): what the MoE
// requests into L2 before it needs them (moe_tc.cu at one row, moe_route_rows.cu for the rows path).
template <typename F>
__host__ __device__ inline void for_shared_expert_spans(const MoEDecodeWeights& w, F&& f) {
  for (const QMatrixDev* q : {&w.shared_gate, &w.shared_up, &w.shared_down}) {
    const int64_t groups = q->rows * q->groups_per_row();
    f(static_cast<const void*>(q->qweight), q->rows * q->words_per_row() * 4);
    f(static_cast<const void*>(q->scales), groups * 2);
    f(static_cast<const void*>(q->biases), groups * 2);
  }
}

}  // namespace lilac::cuda::dev
