// Multi-row decode attention (rows_state.h: attention_rows): one split-K kernel over every row's own
// KV cache. Per row the arithmetic is attention_decode's (attention_decode.cu; both kernels call the device
// pieces of attention/attn_split.cuh and attn_warp_tc.cuh): the same split rule, chunking, warp assignment,
// online softmax, block merge and combine tree, so a row's output is bitwise what attention_decode gives for that token with the
// same n_split. Only the distribution of the work over blocks differs:
//
// Work items. Row r has nsp_r splits (split_plan: from its own length and W only); the items
// (r, split) are numbered row after row and block y of a unit takes items y, y + Y, y + 2Y, ...
// (Y = gridDim.y). W, the split rule's width, is the grid attention_decode launches for one row (one
// wave of resident blocks per unit, capped by the split capacity); it is passed in, not read from
// gridDim.y: the rows grid is one wave per unit whatever the capacity (up to M·W items), so a batch
// of short rows does not queue on the few blocks a small capacity gives one row. At M = 1, Y = W and
// block y does split y as there. Every block builds the item table itself from row_slot / row_pos
// (M <= 64: one warp scan). A row's splits are consecutive items, so they go to distinct blocks when
// Y >= W, and the load per block stays within one item of the mean.
// Combine per (row, unit): the arrival counters and the partial slots are per (row, unit); otherwise
// as in attention_decode (the last block of each group of 16 splits merges them, the last group
// merger merges the groups; self-resetting counters with the tagged fallback for never-used memory).
#include <algorithm>
#include <cstdint>
#include <string>

#include "cuda/cuda_common.h"
#include "cuda/kernels/attention/attn_split.cuh"
#include "cuda/kernels/launch.cuh"
#include "cuda/kernels/rows/rows_plan.h"
#include "cuda/kernels/rows/rows_state.h"

namespace lilac::cuda::rows {
namespace {
using namespace dev;
using plan::split_plan;

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
  // counters for kMaxRows rows whatever M: at the same place for every M, so that one buffer sized for
  // the largest M serves the graphs of every batch size (a counter is always left reset)
  l.ctr_floats = (size_t(kMaxRows) * l.units * kCtrPerUnit * 2 + 63) / 64 * 64;
  l.slot_floats = slot_floats_of(l.NG, s.head_dim);
  l.slots_per_unit = size_t(cap) + (cap + kGroupSplits - 1) / kGroupSplits;
  return l;
}

struct RowsAttnArgs {
  const float* q;   // [M][heads * HD]
  const float* qg;  // row r at qg + r * qg_stride: [heads][q HD | gate HD]
  int64_t qg_stride;
  const __nv_bfloat16* kc;  // slot 0's caches; slot s at + s * kv_slot_stride
  const __nv_bfloat16* vc;
  int64_t kv_slot_stride;
  const int32_t* row_slot;
  const int32_t* row_pos;
  unsigned long long* ctr;  // [M][units][kCtrPerUnit]
  float* slots;             // [M][units][slots_per_unit][SL]
  float* out;               // [M][heads * HD]
  int M, G, HG, units, kv_heads, cap, slots_per_unit;
  int W;  // the split rule's width: attention_decode's gridDim.y for one row
  int min_rows;  // and its minimum rows per split (attn_min_rows, as attention_decode's)
};

// One work item: split `split` of row `ri` for this block's unit (attention_decode's block body).
template <int HD, int NG>
__device__ __forceinline__ void attn_item(const RowsAttnArgs& a, int ri, int slot, int32_t pos, int split) {
  using C = Cfg<HD, NG>;
  constexpr int R = C::R;
  extern __shared__ float4 smem4[];
  float* sm = reinterpret_cast<float*>(smem4);
  uint4* qf = reinterpret_cast<uint4*>(sm + C::kQf);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int unit = blockIdx.x;
  const int kvh = unit / a.HG, hg = unit % a.HG;
  const int h0 = kvh * a.G + hg * NG;
  const int hv = min(NG, a.G - hg * NG);
  const int64_t hdim = int64_t(a.kv_heads) * a.G * HD;  // q / out row width
  const float* q = a.q + ri * hdim;
  const float* qg = a.qg + ri * a.qg_stride;
  float* out = a.out + ri * hdim;
  const __nv_bfloat16* kc = a.kc + slot * a.kv_slot_stride;
  const __nv_bfloat16* vc = a.vc + slot * a.kv_slot_stride;

  const int64_t L = int64_t(pos) + 1;
  int nsp;
  int64_t rps;
  split_plan(L, a.W, a.min_rows, R, nsp, rps);
  const int64_t begin = int64_t(split) * rps, end = begin + rps < L ? begin + rps : L;
  const int nch = int((end - begin + R - 1) / R);

  // this warp's ring and the chunk copies
  __nv_bfloat16* ring = reinterpret_cast<__nv_bfloat16*>(sm) + size_t(warp) * kStages * C::STAGE;
  const int64_t row_stride = int64_t(a.kv_heads) * HD;
  const __nv_bfloat16* kbase = kc + int64_t(kvh) * HD;
  const __nv_bfloat16* vbase = vc + int64_t(kvh) * HD;
  auto issue = [&](int c, int stage) {
    __nv_bfloat16* st = ring + stage * C::STAGE;
    for_chunk_pieces<HD, R>(lane, [&](int r, bool v, int dst, int col) {
      const int64_t row = begin + int64_t(c) * R + r;
      const bool ok = row < end;
      cp_async16_zfill(st + dst, (v ? vbase : kbase) + (ok ? row : 0) * row_stride + col, ok ? 16 : 0);
    });
  };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    const int c = warp + s * kWarps;
    if (c < nch) issue(c, s);
    cp_async_commit();
  }
  // q's fragments (attn_warp_tc.cuh): requested right after the first K/V copies (whose addresses need
  // *pos), all loads at once, so its round trip overlaps theirs instead of preceding it
  C::Warp::template stage_q<kWarps * 32>(q + int64_t(h0) * HD, hv, qf, tid);
  __syncthreads();  // qf

  typename C::Warp wa;
  wa.init();
  wa.stream(issue, ring, qf, warp, lane, nch, begin, end);
  cp_async_wait<0>();
  __syncthreads();  // ring no longer read or written: reuse it for the warp accumulators

  // merge the warps' states into this block's partial slot
  store_warp_state<HD, NG>(wa, sm, warp, lane);
  __syncthreads();
  constexpr int SL = C::SL;
  float* uslots = a.slots + (size_t(ri) * a.units + unit) * a.slots_per_unit * SL;
  float* my_slot = uslots + size_t(split) * SL;
  warps_to_slot<HD, NG>(sm, my_slot, tid);

  // first-level combine: the last block of splits [16j, 16j+16) merges them
  const int ngroups = (nsp + kGroupSplits - 1) / kGroupSplits;
  const int grp = split / kGroupSplits;
  const int gsize = min(kGroupSplits, nsp - grp * kGroupSplits);
  const uint32_t tag = uint32_t(pos) ^ kTagMagic;
  unsigned long long* uctr = a.ctr + (size_t(ri) * a.units + unit) * kCtrPerUnit;
  int* flag = reinterpret_cast<int*>(sm + C::kFlag);
  __syncthreads();
  if (tid == 0) *flag = arrive(uctr + 2 * grp, tag, uint32_t(gsize));
  __syncthreads();
  if (!*flag) {
    return;
  }
  // the merges reuse the start of shared memory (m / l of the merged slots): free since the barrier
  // before the arrival
  const float* gfirst = uslots + size_t(grp) * kGroupSplits * SL;
  if (ngroups == 1) {
    merge_slots<HD, NG>(gfirst, gsize, nullptr, qg, out, h0, hv, sm);
    return;
  }
  float* gslot = uslots + size_t(a.cap + grp) * SL;
  merge_slots<HD, NG>(gfirst, gsize, gslot, qg, out, h0, hv, sm);
  // second level: the last group merger merges the group results
  __syncthreads();
  if (tid == 0) *flag = arrive(uctr + 2 * kMaxGroups, tag, uint32_t(ngroups));
  __syncthreads();
  if (!*flag) {
    return;
  }
  merge_slots<HD, NG>(uslots + size_t(a.cap) * SL, ngroups, nullptr, qg, out, h0, hv, sm);
}

template <int HD, int NG>
__global__ void __launch_bounds__(kWarps * 32, 2) attn_rows_kernel(RowsAttnArgs a) {
  using C = Cfg<HD, NG>;
  __shared__ int s_first[kMaxRows + 1];  // items of rows < r: s_first[r]
  __shared__ int s_slot[kMaxRows], s_pos[kMaxRows];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  pdl_wait();
  pdl_trigger();
  if (warp == 0) {
    int cnt[2];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const int r = lane + 32 * k;
      cnt[k] = 0;
      if (r < a.M) {
        const int slot = a.row_slot[r];
        const int32_t pos = a.row_pos[r];
        s_slot[r] = slot;
        s_pos[r] = pos;
        if (slot >= 0) {
          int64_t rps;
          split_plan(int64_t(pos) + 1, a.W, a.min_rows, C::R, cnt[k], rps);
        }
      }
#pragma unroll
      for (int off = 1; off < 32; off <<= 1) {
        const int t = __shfl_up_sync(0xffffffffu, cnt[k], off);
        if (lane >= off) cnt[k] += t;
      }
    }
    const int tot0 = __shfl_sync(0xffffffffu, cnt[0], 31);
    s_first[lane + 1] = cnt[0];
    s_first[lane + 33] = tot0 + cnt[1];
    if (lane == 0) s_first[0] = 0;
  }
  __syncthreads();
  int row = 0;
  for (int item = blockIdx.y; item < s_first[a.M]; item += gridDim.y) {
    row = plan::item_row(s_first, item, row);
    attn_item<HD, NG>(a, row, s_slot[row], s_pos[row], item - s_first[row]);
    __syncthreads();  // shared memory (ring, merge scratch, flag) reused by the next item
  }
}

void check_shape(const AttnDecodeShape& s) {
  const int hd = s.head_dim;
  LILAC_CHECK((hd == 32 || hd == 64 || hd == 128 || hd == kMaxHeadDim) && s.kv_heads > 0 && s.heads % s.kv_heads == 0 &&
                  s.heads / s.kv_heads <= kMaxGroup && s.rotary_dim <= s.head_dim && s.rotary_dim % 2 == 0,
              "rows attention: unsupported shape (head_dim " + std::to_string(s.head_dim) + ", heads " +
                  std::to_string(s.heads) + "/" + std::to_string(s.kv_heads) + ")");
}

template <int HD, int NG>
void launch_rows(const Layout& lay, const RowsAttnArgs& a, cudaStream_t stream) {
  using C = Cfg<HD, NG>;
  const size_t smem = size_t(C::kTotalF) * sizeof(float);
  static int per_sm[64] = {};  // resident blocks per SM, per device (0: not yet set up)
  int dev = 0;
  LILAC_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 0 || dev >= 64) dev = 0;
  if (per_sm[dev] == 0) {
    LILAC_CUDA_CHECK(
        cudaFuncSetAttribute(attn_rows_kernel<HD, NG>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    int n = 0;
    LILAC_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, attn_rows_kernel<HD, NG>, kWarps * 32, smem));
    LILAC_CHECK(n >= 1, "rows attention: kernel cannot be resident (" + std::to_string(smem) + " B shared memory)");
    per_sm[dev] = std::min(n, 2);
  }
  // the split rule's width: one wave of resident blocks per unit, capped by the split capacity
  // (attention_decode's grid for one row, so that each row's splits are the same); the grid: one wave
  // per unit, or fewer blocks when the M rows cannot have that many items (at most W each)
  const int wave = (per_sm[dev] * sm_count() + lay.units - 1) / lay.units;
  RowsAttnArgs b = a;
  b.W = std::max(1, std::min(a.cap, wave));
  b.min_rows = attn_min_rows(C::kMinRows, C::R);
  const int gy = std::max(1, std::min(wave, a.M * b.W));
  launch_pdl(attn_rows_kernel<HD, NG>, dim3(lay.units, gy), dim3(kWarps * 32), smem, stream, b);
}

template <int HD>
void dispatch_ng(const Layout& lay, const RowsAttnArgs& a, cudaStream_t stream) {
  switch (lay.NG) {
    case 1:
      return launch_rows<HD, 1>(lay, a, stream);
    case 2:
      return launch_rows<HD, 2>(lay, a, stream);
    case 4:
      return launch_rows<HD, 4>(lay, a, stream);
    default:
      return launch_rows<HD, 8>(lay, a, stream);
  }
}

}  // namespace

size_t attention_rows_partial_floats(const AttnDecodeShape& s, int n_split, int M) {
  const Layout l = layout_of(s, n_split);
  return l.ctr_floats + size_t(M) * l.units * l.slots_per_unit * l.slot_floats;
}

void attention_rows(const AttnDecodeShape& s, int M, const int32_t* row_slot, const int32_t* row_pos, const float* q,
                    const float* proj, int64_t proj_stride, const KvPool& kv, int n_split, float* partial, float* out,
                    cudaStream_t stream) {
  check_shape(s);
  LILAC_CHECK(M >= 1 && M <= kMaxRows, "rows attention: M must be 1.." + std::to_string(kMaxRows));
  LILAC_CHECK(n_split >= 1 && n_split <= kAttnMaxSplit, "rows attention: bad split count");
  LILAC_CHECK(reinterpret_cast<uintptr_t>(partial) % 16 == 0, "rows attention: partial must be 16-byte aligned");
  LILAC_CHECK(reinterpret_cast<uintptr_t>(kv.k) % 16 == 0 && reinterpret_cast<uintptr_t>(kv.v) % 16 == 0 &&
                  kv.slot_stride % 8 == 0,
              "rows attention: KV pools must be 16-byte aligned, slot stride a multiple of 8 elements");
  const Layout lay = layout_of(s, n_split);
  RowsAttnArgs a;
  a.q = q;
  a.qg = proj;
  a.qg_stride = proj_stride;
  a.kc = kv.k;
  a.vc = kv.v;
  a.kv_slot_stride = kv.slot_stride;
  a.row_slot = row_slot;
  a.row_pos = row_pos;
  a.ctr = reinterpret_cast<unsigned long long*>(partial);
  a.slots = partial + lay.ctr_floats;
  a.out = out;
  a.M = M;
  a.G = s.heads / s.kv_heads;
  a.HG = lay.HG;
  a.units = lay.units;
  a.kv_heads = s.kv_heads;
  a.cap = n_split;
  a.slots_per_unit = int(lay.slots_per_unit);
  switch (s.head_dim) {
    case 32:
      return dispatch_ng<32>(lay, a, stream);
    case 64:
      return dispatch_ng<64>(lay, a, stream);
    case 128:
      return dispatch_ng<128>(lay, a, stream);
    default:
      return dispatch_ng<256>(lay, a, stream);
  }
}

}  // namespace lilac::cuda::rows
