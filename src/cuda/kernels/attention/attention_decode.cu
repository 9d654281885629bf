// Decode attention: q/k RMSNorm + partial RoPE + KV append (one warp per head), then one split-K
// kernel over the bf16 KV cache whose last blocks also do the cross-split combine and the output gate.
//
// attn_decode_kernel<HD, NG>: block (unit, split) of 8 warps; a unit is one kv head and a group of NG
// (<= 8) of its query heads (NG = G rounded up to a power of two, padded heads have q = 0 and are not
// written). The number of useful splits is derived on the device from *pos (graph replays reuse the
// launch): nsp = min(gridDim.y, ceil(L / min_rows)) (min_rows: kMinRows unless LILAC_ATTN_MIN_ROWS), each split a
// run of whole R-row chunks (kMinRows: 6 per warp, attn_split.cuh); blocks past it exit.
// The grid is one wave of
// resident blocks (2 per SM on sm_90: 256 threads, <= 90 KB shared memory, which also fits the 99 KB
// per block of sm_86 / sm_89). Each
// warp streams its chunks (chunk c of the split goes to warp c % 8) through a private 5-stage cp.async
// ring (16-byte copies of K and V rows) and keeps its own online softmax: 8 positions at a time (4 chunks
// at HD 256), the scores of the NG heads and the P·V products on the tensor cores with q and P split
// into bf16 high and low parts (attn_warp_tc.cuh, shared with the multi-row kernel). The warps' states are merged
// into one partial per block (m, l, acc for NG heads; every thread 4 dims, no serial per-head loop).
// Combine: the partials of splits [16j, 16j+16) are merged by the last of those blocks to finish
// (arrival counter per group) — at short contexts (nsp <= 16) that is the only level; with more
// groups the group results are merged by the last group merger (a second counter), so no block reads
// more than 16 partials. A merge is one pass in which each thread issues all its loads at once
// (float4 accumulators, the m / l of its head, its gate values). The last merger writes
// out = acc / l ⊙ sigmoid(gate).
// Counters live at the start of `partial`, two 64-bit words each: normally one atomicAdd on word 0
// (kCtrMagic << 32 | count), reset by the block that completes the count, so the next layer / replay
// at any position starts from zero; on memory never used by this kernel (garbage in word 0) the
// arrivals count on word 1 with tagged CAS (tag = *pos ^ magic, a word whose tag differs counts as 0)
// and the completing block resets word 0 (see arrive()).
#include <algorithm>
#include <cstdint>
#include <string>

#include "cuda/cuda_common.h"
#include "cuda/kernels/attention/attention.h"
#include "cuda/kernels/attention/attn_split.cuh"
#include "cuda/kernels/attention/qk_norm_rope.cuh"
#include "cuda/kernels/launch.cuh"
#include "cuda/kernels/ptx.cuh"
#include "cuda/kernels/qdot.cuh"

namespace lilac::cuda {
namespace {
using namespace dev;

struct Layout {
  int NG, HG, units;
  size_t ctr_floats, slot_floats, slots_per_unit;
};
Layout layout_of(const AttnDecodeShape& s, int cap) {
  Layout l;
  const int G = s.heads / s.kv_heads;
  l.NG = ng_of(G);
  l.HG = (G + l.NG - 1) / l.NG;
  l.units = s.kv_heads * l.HG;
  l.ctr_floats = (size_t(l.units) * kCtrPerUnit * 2 + 63) / 64 * 64;
  l.slot_floats = slot_floats_of(l.NG, s.head_dim);
  l.slots_per_unit = size_t(cap) + (cap + kGroupSplits - 1) / kGroupSplits;
  return l;
}

// ------------------------------------------------------------------------------------------------ q/k norm + rope
// One warp per head (q heads first, then kv heads).
__global__ void __launch_bounds__(128) qk_norm_rope_kernel(AttnDecodeShape s, const float* qg, const float* k,
                                                           const float* v, const float* q_norm, const float* k_norm,
                                                           const float* inv_freq, const int32_t* pos_p, float* q_out,
                                                           __nv_bfloat16* k_cache, __nv_bfloat16* v_cache) {
  __shared__ float xs[4][kMaxHeadDim];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int b = blockIdx.x * 4 + warp;
  const int hd = s.head_dim, half = s.rotary_dim / 2;
  const bool active = b < s.heads + s.kv_heads;
  const bool is_q = b < s.heads;
  const int h = is_q ? b : b - s.heads;
  const float* w = is_q ? q_norm : k_norm;
  // weights (not written by the step) before the wait
  float wv[kMaxHeadDim / 32], fr[kMaxHeadDim / 32];
#pragma unroll
  for (int j = 0; j < kMaxHeadDim / 32; ++j) {
    const int d = lane + 32 * j;
    wv[j] = active && d < hd ? w[d] : 0.f;
    fr[j] = active && d < 2 * half ? inv_freq[d < half ? d : d - half] : 0.f;
  }
  pdl_wait();
  pdl_trigger();
  if (!active) return;
  const float* src = is_q ? qg + int64_t(h) * 2 * hd : k + int64_t(h) * hd;
  const int64_t pos = *pos_p;
  float x[kMaxHeadDim / 32];
#pragma unroll
  for (int j = 0; j < kMaxHeadDim / 32; ++j) {
    const int d = lane + 32 * j;
    x[j] = d < hd ? src[d] : 0.f;
  }
  const int64_t row = (pos * s.kv_heads + h) * hd;
  qk_head_norm_rope(x, wv, fr, hd, half, s.eps, pos, xs[warp], lane, [&](int d, float val) {
    if (is_q) {
      q_out[int64_t(h) * hd + d] = val;
    } else {
      k_cache[row + d] = __float2bfloat16(val);
      v_cache[row + d] = __float2bfloat16(v[int64_t(h) * hd + d]);
    }
  });
}

// ------------------------------------------------------------------------------------------------ split kernel

struct AttnArgs {
  const float* q;
  const float* qg;
  const __nv_bfloat16* kc;
  const __nv_bfloat16* vc;
  const int32_t* pos;
  unsigned long long* ctr;  // [units][kCtrPerUnit]
  float* slots;             // [units][slots_per_unit][NG][HD + 2]: acc [NG][HD], m [NG], l [NG]
  float* out;
  int G, HG, kv_heads, cap, slots_per_unit;
  int min_rows;  // the split rule's (attn_min_rows)
};

// ------------------------------------------------------------------------------------------------ tracing
// Per-block timeline for measurements (attn_decode_trace): %globaltimer by thread 0 at
// [0] entry, [1] after the PDL wait, [2] q staged and the first K/V copies issued, [3] K/V loop done,
// [4] partial slot written, [5] first arrival decided, [6] first-level merge done (only the group
// mergers), [7] exit (every block; for the final merger after the output is written); layout
// [blockIdx.y * gridDim.x + blockIdx.x][8]. Off (null) in normal runs.
__device__ unsigned long long* g_attn_trace = nullptr;
__device__ __forceinline__ void attn_mark(int k) {
  unsigned long long* tr = g_attn_trace;
  if (tr != nullptr && threadIdx.x == 0) {
    tr[(size_t(blockIdx.y) * gridDim.x + blockIdx.x) * 8 + k] = globaltimer();
  }
}


template <int HD, int NG>
__global__ void __launch_bounds__(kWarps * 32, 2) attn_decode_kernel(AttnArgs a) {
  using C = Cfg<HD, NG>;
  constexpr int R = C::R;
  extern __shared__ float4 smem4[];
  float* sm = reinterpret_cast<float*>(smem4);
  uint4* qf = reinterpret_cast<uint4*>(sm + C::kQf);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int unit = blockIdx.x, split = blockIdx.y;
  const int kvh = unit / a.HG, hg = unit % a.HG;
  const int h0 = kvh * a.G + hg * NG;
  const int hv = min(NG, a.G - hg * NG);

  attn_mark(0);
  // Before the wait (launch.cuh, rule 2): *pos — its writer (the step's position increment, the MTP head's
  // input kernel) is at least two launches back — and the K/V rows before it, which earlier steps wrote. Row
  // pos is the predecessor's (the q/k norm kernel appends it): it is read after the wait.
  const int32_t pos = __ldcg(a.pos);  // through L2: before the wait no ordering is documented, so no L1 copy is trusted
  const int64_t L = int64_t(pos) + 1;
  const int64_t want = (L + a.min_rows - 1) / a.min_rows;
  int nsp = want < int64_t(gridDim.y) ? int(want) : int(gridDim.y);
  nsp = max(nsp, 1);
  int64_t rps = (L + nsp - 1) / nsp;
  rps = (rps + R - 1) / R * R;
  nsp = int((L + rps - 1) / rps);
  if (split >= nsp) {
    attn_mark(7);
    return;  // reads and writes nothing: no wait needed
  }
  const int64_t begin = int64_t(split) * rps, end = begin + rps < L ? begin + rps : L;
  const int nch = int((end - begin + R - 1) / R);
  int64_t lim = end < pos ? end : pos;  // rows copied below lim (zeros past it); `end` after the wait

  // this warp's ring and the chunk copies
  __nv_bfloat16* ring = reinterpret_cast<__nv_bfloat16*>(sm) + size_t(warp) * kStages * C::STAGE;
  const int64_t row_stride = int64_t(a.kv_heads) * HD;
  const __nv_bfloat16* kbase = a.kc + int64_t(kvh) * HD;
  const __nv_bfloat16* vbase = a.vc + int64_t(kvh) * HD;
  auto issue = [&](int c, int stage) {
    __nv_bfloat16* st = ring + stage * C::STAGE;
    for_chunk_pieces<HD, R>(lane, [&](int r, bool v, int dst, int col) {
      const int64_t row = begin + int64_t(c) * R + r;
      const bool ok = row < lim;
      cp_async16_zfill(st + dst, (v ? vbase : kbase) + (ok ? row : 0) * row_stride + col, ok ? 16 : 0);
    });
  };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    const int c = warp + s * kWarps;
    if (c < nch) issue(c, s);
    cp_async_commit();
  }
  pdl_wait();
  pdl_trigger();
  attn_mark(1);
  lim = end;
  // Row pos, when its chunk was among those copied before the wait (as zeros): this warp's copies done, the
  // row's pieces loaded by the lanes that copied them.
  if (pos >= begin && pos < end) {
    const int cp = int((pos - begin) / R);
    if (cp % kWarps == warp && cp / kWarps < kStages - 1) {
      cp_async_wait<0>();
      __nv_bfloat16* st = ring + (cp / kWarps) * C::STAGE;
      for_chunk_pieces<HD, R>(lane, [&](int r, bool v, int dst, int col) {
        if (begin + int64_t(cp) * R + r == pos)
          *reinterpret_cast<uint4*>(st + dst) =
              *reinterpret_cast<const uint4*>((v ? vbase : kbase) + int64_t(pos) * row_stride + col);
      });
      __syncwarp();
    }
  }
  // q's fragments (attn_warp_tc.cuh): requested right after the first K/V copies (whose addresses need
  // *pos), all loads at once, so its round trip overlaps theirs instead of preceding it
  C::Warp::template stage_q<kWarps * 32>(a.q + int64_t(h0) * HD, hv, qf, tid);
  __syncthreads();  // qf
  attn_mark(2);

  typename C::Warp wa;
  wa.init();
  wa.stream(issue, ring, qf, warp, lane, nch, begin, end);
  cp_async_wait<0>();
  __syncthreads();  // ring no longer read or written: reuse it for the warp accumulators
  attn_mark(3);

  // merge the warps' states into this block's partial slot
  store_warp_state<HD, NG>(wa, sm, warp, lane);
  __syncthreads();
  constexpr int SL = C::SL;
  float* uslots = a.slots + size_t(unit) * a.slots_per_unit * SL;
  float* my_slot = uslots + size_t(split) * SL;
  warps_to_slot<HD, NG>(sm, my_slot, tid);

  // first-level combine: the last block of splits [16j, 16j+16) merges them
  const int ngroups = (nsp + kGroupSplits - 1) / kGroupSplits;
  const int grp = split / kGroupSplits;
  const int gsize = min(kGroupSplits, nsp - grp * kGroupSplits);
  const uint32_t tag = uint32_t(pos) ^ kTagMagic;
  unsigned long long* uctr = a.ctr + size_t(unit) * kCtrPerUnit;
  int* flag = reinterpret_cast<int*>(sm + C::kFlag);
  __syncthreads();
  attn_mark(4);
  if (tid == 0) *flag = arrive(uctr + 2 * grp, tag, uint32_t(gsize));
  __syncthreads();
  attn_mark(5);
  if (!*flag) {
    attn_mark(7);
    return;
  }
  // the merges reuse the start of shared memory (m / l of the merged slots): free since the barrier
  // before the arrival
  const float* gfirst = uslots + size_t(grp) * kGroupSplits * SL;
  if (ngroups == 1) {
    merge_slots<HD, NG>(gfirst, gsize, nullptr, a.qg, a.out, h0, hv, sm);
    attn_mark(6);
    attn_mark(7);
    return;
  }
  float* gslot = uslots + size_t(a.cap + grp) * SL;
  merge_slots<HD, NG>(gfirst, gsize, gslot, a.qg, a.out, h0, hv, sm);
  // second level: the last group merger merges the group results
  __syncthreads();
  attn_mark(6);
  if (tid == 0) *flag = arrive(uctr + 2 * kMaxGroups, tag, uint32_t(ngroups));
  __syncthreads();
  if (!*flag) {
    attn_mark(7);
    return;
  }
  merge_slots<HD, NG>(uslots + size_t(a.cap) * SL, ngroups, nullptr, a.qg, a.out, h0, hv, sm);
  attn_mark(7);
}

void check_shape(const AttnDecodeShape& s) {
  const int hd = s.head_dim;
  LILAC_CHECK((hd == 32 || hd == 64 || hd == 128 || hd == kMaxHeadDim) && s.kv_heads > 0 && s.heads % s.kv_heads == 0 &&
                  s.heads / s.kv_heads <= kMaxGroup && s.rotary_dim <= s.head_dim && s.rotary_dim % 2 == 0,
              "attention decode: unsupported shape (head_dim " + std::to_string(s.head_dim) + ", heads " +
                  std::to_string(s.heads) + "/" + std::to_string(s.kv_heads) + ")");
}


template <int HD, int NG>
void launch_attn(const AttnDecodeShape& s, const Layout& lay, const AttnArgs& a, cudaStream_t stream) {
  using C = Cfg<HD, NG>;
  const size_t smem = size_t(C::kTotalF) * sizeof(float);
  static int per_sm[64] = {};  // resident blocks per SM, per device (0: not yet set up)
  int dev = 0;
  LILAC_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 0 || dev >= 64) dev = 0;
  if (per_sm[dev] == 0) {
    LILAC_CUDA_CHECK(cudaFuncSetAttribute(attn_decode_kernel<HD, NG>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          int(smem)));
    int n = 0;
    LILAC_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, attn_decode_kernel<HD, NG>, kWarps * 32, smem));
    LILAC_CHECK(n >= 1, "attention decode: kernel cannot be resident (" + std::to_string(smem) + " B shared memory)");
    per_sm[dev] = std::min(n, 2);
  }
  // up to one wave of resident blocks: enough to fill the GPU at long contexts, never more than the
  // buffer holds (the device uses fewer splits at short contexts, see the kernel)
  const int gy = std::max(1, std::min(a.cap, (per_sm[dev] * sm_count() + lay.units - 1) / lay.units));
  AttnArgs b = a;
  b.min_rows = attn_min_rows(C::kMinRows, C::R);
  launch_pdl(attn_decode_kernel<HD, NG>, dim3(lay.units, gy), dim3(kWarps * 32), smem, stream, b);
}

template <int HD>
void dispatch_ng(const AttnDecodeShape& s, const Layout& lay, const AttnArgs& a, cudaStream_t stream) {
  switch (lay.NG) {
    case 1: return launch_attn<HD, 1>(s, lay, a, stream);
    case 2: return launch_attn<HD, 2>(s, lay, a, stream);
    case 4: return launch_attn<HD, 4>(s, lay, a, stream);
    default: return launch_attn<HD, 8>(s, lay, a, stream);
  }
}

}  // namespace

void attn_decode_trace(unsigned long long* buf) {
  LILAC_CUDA_CHECK(cudaMemcpyToSymbol(g_attn_trace, &buf, sizeof(buf)));
}

size_t attn_decode_partial_floats(const AttnDecodeShape& s, int n_split) {
  const Layout l = layout_of(s, n_split);
  return l.ctr_floats + size_t(l.units) * l.slots_per_unit * l.slot_floats;
}

void attn_qk_norm_rope_append(const AttnDecodeShape& s, const float* qg, const float* k, const float* v,
                              const float* q_norm, const float* k_norm, const float* inv_freq, const int32_t* pos,
                              float* q_out, __nv_bfloat16* k_cache, __nv_bfloat16* v_cache, cudaStream_t stream) {
  check_shape(s);
  const int nheads = s.heads + s.kv_heads;
  launch_pdl(qk_norm_rope_kernel, dim3((nheads + 3) / 4), dim3(128), 0, stream, s, qg, k, v, q_norm, k_norm, inv_freq,
             pos, q_out, k_cache, v_cache);
}

void attention_decode(const AttnDecodeShape& s, const float* q, const float* qg, const __nv_bfloat16* k_cache,
                      const __nv_bfloat16* v_cache, const int32_t* pos, int n_split, float* partial, float* out,
                      cudaStream_t stream) {
  check_shape(s);
  LILAC_CHECK(n_split >= 1 && n_split <= kAttnMaxSplit, "attention decode: bad split count");
  LILAC_CHECK(reinterpret_cast<uintptr_t>(partial) % 16 == 0, "attention decode: partial must be 16-byte aligned");
  const Layout lay = layout_of(s, n_split);
  AttnArgs a;
  a.q = q;
  a.qg = qg;
  a.kc = k_cache;
  a.vc = v_cache;
  a.pos = pos;
  a.ctr = reinterpret_cast<unsigned long long*>(partial);
  a.slots = partial + lay.ctr_floats;
  a.out = out;
  a.G = s.heads / s.kv_heads;
  a.HG = lay.HG;
  a.kv_heads = s.kv_heads;
  a.cap = n_split;
  a.slots_per_unit = int(lay.slots_per_unit);
  switch (s.head_dim) {
    case 32: return dispatch_ng<32>(s, lay, a, stream);
    case 64: return dispatch_ng<64>(s, lay, a, stream);
    case 128: return dispatch_ng<128>(s, lay, a, stream);
    default: return dispatch_ng<256>(s, lay, a, stream);
  }
}

}  // namespace lilac::cuda
