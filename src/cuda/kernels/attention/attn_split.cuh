// Device pieces of the split-K decode attention shared by the single-row kernel (attention_decode.cu) and the
// multi-row one (rows/attention_rows.cu), which must compute a row's output with exactly the same arithmetic
// (bitwise): the tile configuration, the arrival counters and the partial merge (given the row's gate / output
// pointers); a warp's chunk math is attn_warp_tc.cuh's and the cp.async wrappers are ptx.cuh's. Include from one
// .cu only (anonymous namespace).
#pragma once
#include <cuda_bf16.h>

#include <cstdint>
#include <cstdlib>

#include "cuda/kernels/attention/attention.h"
#include "cuda/kernels/attention/attn_warp_tc.cuh"
#include "cuda/kernels/ptx.cuh"  // cp_async16_zfill, cp_async_commit, cp_async_wait
#include "cuda/kernels/qdot.cuh"

namespace lilac::cuda {
namespace {
using namespace dev;

// The split rule's minimum rows per split, for both attention kernels (a row's splits, hence its bits, must be
// the same in either): Cfg::kMinRows, or LILAC_ATTN_MIN_ROWS (a multiple of R, >= R; for measurement).
inline int attn_min_rows(int compiled, int R) {
  static const int env = [] {
    const char* e = std::getenv("LILAC_ATTN_MIN_ROWS");
    return e ? std::atoi(e) : 0;
  }();
  return env >= R && env % R == 0 ? env : compiled;
}

constexpr int kMaxHeadDim = 256;
constexpr int kMaxGroup = 16;     // query heads per kv head
constexpr int kWarps = 8;         // warps per split block (256 threads, 2 blocks per SM on sm_90)
constexpr int kStages = 5;        // cp.async ring depth per warp (4 chunks in flight)
constexpr int kGroupSplits = 16;  // partials merged per first-level combine
constexpr int kMaxGroups = (kAttnMaxSplit + kGroupSplits - 1) / kGroupSplits;
constexpr int kMergeMax = kMaxGroups > kGroupSplits ? kMaxGroups : kGroupSplits;  // partials per merge
// Each counter is two 64-bit words: [0] the fast counter (kCtrMagic << 32 | count, reset by the block
// that completes it), [1] the tagged fallback used only while word 0 holds garbage (first use).
constexpr int kCtrPerUnit = 2 * (kMaxGroups + 1);  // group counters + the top counter
constexpr uint32_t kTagMagic = 0xA5C3E1F7u;        // bit 31 set: never the tag of zeroed memory
constexpr uint32_t kCtrMagic = 0x2C1A7E55u;
constexpr unsigned long long kCtrReset = static_cast<unsigned long long>(kCtrMagic) << 32;

int ng_of(int G) {  // query heads per unit: G rounded up to a power of two, at most 8
  int ng = 1;
  while (ng < G && ng < 8) ng *= 2;
  return ng;
}
// One partial: acc [NG][HD], m [NG], l [NG], padded to 16 bytes (merged with float4 loads).
constexpr int slot_floats_of(int NG, int HD) { return NG * HD + (2 * NG + 3) / 4 * 4; }

// The 16-byte pieces of one ring chunk (R K rows, then R V rows, of HD bf16) that `lane` copies:
// fn(r, v, dst, col): chunk row r, V or K, the piece's offset in the stage, its first column.
template <int HD, int R, class Fn>
__device__ __forceinline__ void for_chunk_pieces(int lane, Fn&& fn) {
  constexpr int PIECES = 2 * R * HD / 8;
#pragma unroll
  for (int i0 = 0; i0 < PIECES; i0 += 32) {
    const int i = i0 + lane;
    if (PIECES % 32 == 0 || i < PIECES) {
      const int isv = i / (PIECES / 2), rem = i % (PIECES / 2);
      const int r = rem / (HD / 8), c8 = rem % (HD / 8);
      fn(r, isv != 0, isv * R * HD + r * HD + c8 * 8, c8 * 8);
    }
  }
}

template <int HD, int NG>
struct Cfg {
  static constexpr int DPL = HD / 32;
  static constexpr int R = 16 / (NG > DPL ? NG : DPL);  // rows per chunk (one stage of a warp's ring)
  static constexpr int STAGE = 2 * R * HD;              // bf16 per ring stage: R K rows then R V rows
  // at least 1.5 x (kStages - 1) chunks per warp per split: fewer splits means fewer partials to merge (at
  // 512 rows, HD 256, NG 8: 6 splits of 86 rows, one 48 KB merge, instead of 8 x 64 rows and 64 KB). A split's
  // first kStages - 1 chunks per warp are requested before the PDL wait, the rest as the ring frees. Measured
  // on the H200 (bench/BENCHMARKS.md "Seventeenth stop"): against 4 chunks per warp (64 rows) the step +2 % at 16
  // and 64 rows, +0.4 % at 1 and 4; 8 chunks (128 rows) as fast at 16 / 64 and slower at one row.
  static constexpr int kMinRows = (kStages - 1) * kWarps * R * 3 / 2;
  using Warp = WarpAttnTc<HD, NG, R, kStages, kWarps>;  // a warp's chunk math (attn_warp_tc.cuh)
  // shared memory (floats): big [max(ring, warp accumulators)] | q fragments | wm, wl [W][NG] | flag [4].
  // At most 89 KB (HD 256): fits the 99 KB per block of sm_86/sm_89.
  static constexpr int kRingF = kWarps * kStages * STAGE / 2;
  static constexpr int kAccF = kWarps * Warp::kAccFloats;
  static constexpr int kBigF = kRingF > kAccF ? kRingF : kAccF;
  static constexpr int kQf = kBigF;
  static constexpr int kWm = kQf + Warp::kQFloats;
  static constexpr int kWl = kWm + kWarps * NG;
  static constexpr int kFlag = kWl + kWarps * NG;
  static constexpr int kTotalF = kFlag + 4;
  static constexpr int SL = slot_floats_of(NG, HD);
  static_assert(Warp::STAGE == STAGE && (kBigF % 4) == 0 && (kWm % 4) == 0, "attention tile");
  static_assert(size_t(kTotalF) * 4 <= 99 * 1024, "attention smem must fit sm_86/sm_89 (99 KB per block)");
};

// The block's warps' online-softmax states merged into its partial slot (both split kernels), in two steps around the
// caller's barrier and slot address: store_warp_state puts this warp's state (wa) into the ring's shared memory (sm,
// free once the ring is drained); after a __syncthreads, warps_to_slot has every thread take 4 consecutive dims of one
// head, the head's maximum and weights from the warps' maxima. Ends without a barrier.
template <int HD, int NG>
__device__ __forceinline__ void store_warp_state(const typename Cfg<HD, NG>::Warp& wa, float* sm, int warp, int lane) {
  using C = Cfg<HD, NG>;
  wa.store(sm + warp * C::Warp::kAccFloats, sm + C::kWm + warp * NG, sm + C::kWl + warp * NG, lane);
}
template <int HD, int NG>
__device__ __forceinline__ void warps_to_slot(const float* sm, float* my_slot, int tid) {
  using C = Cfg<HD, NG>;
  const float* wacc = sm;  // [W][NG][kAccStride]
  const float* wm = sm + C::kWm;
  const float* wl = sm + C::kWl;
  for (int f = tid; f < NG * HD / 4; f += blockDim.x) {
    const int i = 4 * f, h = i / HD;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, wm[w * NG + h]);
    float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
    float Ls = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float mw = wm[w * NG + h];
      const float fw = mw == -INFINITY ? 0.f : expf(mw - M);
      const float4 x = *reinterpret_cast<const float4*>(wacc + w * C::Warp::kAccFloats + h * C::Warp::kAccStride + i % HD);
      s.x = fmaf(fw, x.x, s.x);
      s.y = fmaf(fw, x.y, s.y);
      s.z = fmaf(fw, x.z, s.z);
      s.w = fmaf(fw, x.w, s.w);
      Ls = fmaf(fw, wl[w * NG + h], Ls);
    }
    *reinterpret_cast<float4*>(my_slot + i) = s;
    if (i % HD == 0) {
      my_slot[NG * HD + h] = M;
      my_slot[NG * HD + NG + h] = Ls;
    }
  }
}

// Arrival of a block on a counter (two words, see kCtrPerUnit), by one thread after a __syncthreads
// that follows the block's partial writes; true for the arrival that makes the count `expected`.
// Release (the block's writes, cumulative through the barrier) before the atomic, acquire after it —
// the pattern of cooperative groups' grid sync. Normally one atomicAdd: word 0 reads
// kCtrMagic << 32 | count and the completing block resets it to kCtrReset. While word 0 holds anything
// else (memory never used by this kernel: every block of the launch sees garbage there, since adding
// at most kAttnMaxSplit never turns garbage into kCtrMagic << 32 | small), the blocks count on word 1
// with tagged compare-and-swap (tag = *pos ^ magic, a word with another tag counts as 0) and the
// completing block puts word 0 in the reset state, so later launches take the fast path.
__device__ bool arrive(unsigned long long* ctr, uint32_t tag, uint32_t expected) {
  __threadfence();
  const unsigned long long old0 = atomicAdd(ctr, 1ull);
  bool last;
  if (uint32_t(old0 >> 32) == kCtrMagic && uint32_t(old0) < 0x80000000u) {
    last = uint32_t(old0) + 1u == expected;
    if (last) atomicExch(ctr, kCtrReset);
  } else {
    unsigned long long* w1 = ctr + 1;
    unsigned long long old = atomicAdd(w1, 0ull), assumed;
    uint32_t cnt;
    do {
      assumed = old;
      cnt = (uint32_t(assumed >> 32) == tag ? uint32_t(assumed) : 0u) + 1u;
      old = atomicCAS(w1, assumed, (static_cast<unsigned long long>(tag) << 32) | cnt);
    } while (old != assumed);
    last = cnt == expected;
    if (last) {
      atomicExch(w1, ~0ull);
      atomicExch(ctr, kCtrReset);
    }
  }
  __threadfence();
  return last;
}

// Merges n (<= kMergeMax) partial slots (stride C::SL floats) into dst (a slot) or, with dst ==
// nullptr, into the gated output of heads h0 .. h0+hv-1. Whole block; sml: 2 * kMergeMax * NG floats of
// shared memory. One load per thread brings the m / l of every (slot, head) into sml, issued together
// with the gate values and the first batch of accumulators: each thread owns F (<= 2) float4 outputs
// and requests B slots' float4 for all of them at once, so a merge of n slots costs ceil(n / B) L2
// round trips (8 slots: 1, 16: 2; before: 2 per output float4 per 16 slots). Reads through L2 (.cg:
// other blocks wrote the slots).
template <int HD, int NG>
__device__ void merge_slots(const float* first, int n, float* dst, const float* qg, float* out, int h0, int hv,
                            float* sml) {
  constexpr int SL = Cfg<HD, NG>::SL;
  constexpr int NT = kWarps * 32;
  constexpr int NO = NG * HD / 4;        // float4 outputs
  constexpr int F = (NO + NT - 1) / NT;  // per thread
  constexpr int B = 8;                   // slots per batch (registers: 4 F B)
  constexpr int ML = kMergeMax * NG;     // offset of the l values in sml
  static_assert(ML <= NT && F <= 2 && kMergeMax % B == 0, "attention merge layout");
  const int tid = threadIdx.x;
  {
    const int s = tid / NG, h = tid % NG;
    float mv = -INFINITY, lv = 0.f;
    if (s < n) {
      const float* sl = first + size_t(s) * SL + NG * HD;
      mv = __ldcg(sl + h);
      lv = __ldcg(sl + NG + h);
    }
    if (tid < ML) {
      sml[tid] = mv;  // slots >= n: weight 0
      sml[ML + tid] = lv;
    }
  }
  bool ok[F];
  int hh[F], ii[F];
  float g[F][4];
  float4 x[F][B];
#pragma unroll
  for (int f = 0; f < F; ++f) {
    const int o = tid + f * NT;
    ii[f] = 4 * o;
    hh[f] = ii[f] / HD;
    ok[f] = o < NO && (dst != nullptr || hh[f] < hv);
    if (!ok[f]) ii[f] = 0, hh[f] = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) g[f][k] = 0.f;
    if (!dst && ok[f]) {
      const float* gp = qg + int64_t(h0 + hh[f]) * 2 * HD + HD + ii[f] % HD;
#pragma unroll
      for (int k = 0; k < 4; ++k) g[f][k] = gp[k];
    }
#pragma unroll
    for (int s = 0; s < B; ++s)
      x[f][s] = ok[f] && s < n ? __ldcg(reinterpret_cast<const float4*>(first + size_t(s) * SL + ii[f]))
                               : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  __syncthreads();  // sml
  float M[F], Ls[F];
  float4 acc[F];
#pragma unroll
  for (int f = 0; f < F; ++f) {
    M[f] = -INFINITY;
    for (int s = 0; s < n; ++s) M[f] = fmaxf(M[f], sml[s * NG + hh[f]]);
    Ls[f] = 0.f;
    acc[f] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
#pragma unroll
  for (int s0 = 0; s0 < kMergeMax; s0 += B) {
    if (s0 > 0) {
      if (s0 >= n) break;
#pragma unroll
      for (int f = 0; f < F; ++f)
#pragma unroll
        for (int s = 0; s < B; ++s)
          x[f][s] = ok[f] && s0 + s < n ? __ldcg(reinterpret_cast<const float4*>(first + size_t(s0 + s) * SL + ii[f]))
                                        : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int s = 0; s < B; ++s) {
      const int t = s0 + s;
#pragma unroll
      for (int f = 0; f < F; ++f) {
        const float mt = sml[t * NG + hh[f]];
        const float fs = mt == -INFINITY ? 0.f : expf(mt - M[f]);
        Ls[f] = fmaf(fs, sml[ML + t * NG + hh[f]], Ls[f]);
        acc[f].x = fmaf(fs, x[f][s].x, acc[f].x);
        acc[f].y = fmaf(fs, x[f][s].y, acc[f].y);
        acc[f].z = fmaf(fs, x[f][s].z, acc[f].z);
        acc[f].w = fmaf(fs, x[f][s].w, acc[f].w);
      }
    }
  }
#pragma unroll
  for (int f = 0; f < F; ++f) {
    if (!ok[f]) continue;
    const int i = ii[f], h = hh[f], d = i % HD;
    if (dst) {
      *reinterpret_cast<float4*>(dst + i) = acc[f];
      if (d == 0) {
        dst[NG * HD + h] = M[f];
        dst[NG * HD + NG + h] = Ls[f];
      }
    } else {
      const float inv = 1.f / Ls[f];
      float* o = out + int64_t(h0 + h) * HD + d;
      o[0] = acc[f].x * inv * sigmoid_f(g[f][0]);
      o[1] = acc[f].y * inv * sigmoid_f(g[f][1]);
      o[2] = acc[f].z * inv * sigmoid_f(g[f][2]);
      o[3] = acc[f].w * inv * sigmoid_f(g[f][3]);
    }
  }
}

}  // namespace
}  // namespace lilac::cuda
