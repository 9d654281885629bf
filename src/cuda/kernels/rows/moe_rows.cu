// Multi-row MoE, the expert launches (rows_mm.h): gate/up + SwiGLU and down over the chunks that
// moe_route_rows made (an expert's rows, at most MT of them), each chunk's expert weights read once for all
// its rows.
//
// Work items are (chunk, 16-row block of the expert's matrix), chunk-major. Each persistent block (one per SM)
// takes a contiguous range of items and walks it chunk by chunk: the chunk's rows are staged in shared memory
// (a barrier pair per chunk), then warp w takes the range's items of that chunk ≡ w (mod 8). A warp owns its
// item (no barrier inside it) and its weights stream through its cp.async ring (ring_rows.cuh), which runs
// D-1 k-tiles ahead across items and chunks, so the memory stays busy while the block restages.
//
// gate/up: exactly moe_gate_up_tc's arithmetic per row: the gate rows and the up rows of the item, each over
// gemv_tc's 4 k-slices (walked in slice order, the slice sums added in order), act = silu(gate)·up.
// down: for each row, expert (its slot j) and 64-group G of the concatenated input (moe_down_tc's K = k·I +
// Is), the group value of each output row — today's group values, which moe_combine_rows then sums in today's
// order. The expert-local k-tiles line up with today's global ones when I is a multiple of 256.
#include <algorithm>
#include <string>

#include "cuda/cuda_common.h"
#include "cuda/kernels/launch.cuh"
#include "cuda/kernels/rows/moe_rows.cuh"
#include "cuda/kernels/rows/ring_rows.cuh"
#include "cuda/kernels/rows/rows_mm.h"
#include "cuda/kernels/rows/rows_tune.h"

namespace lilac::cuda::rows {
namespace {

using namespace rows_dev;
using ::lilac::cuda::dev::pdl_trigger;
using ::lilac::cuda::dev::pdl_wait;

constexpr int kMaxBlockChunks = 64;  // chunk descriptors a block caches (the host sizes the grid for it)

struct GateUpArgs {
  MoEDecodeWeights w;
  const char* frag;
  const float2* meta;
  MoEScratch sc;
  float* act;
  bool sbv;
  int D;
  int split;  // 0: decided on the device from the routing, 1: never, 2: always (LILAC_ROWS_TUNE moe_split)
};
struct DownArgs {
  MoEDecodeWeights w;
  const float* act;
  MoEScratch sc;
  bool sbv_r, sbv_s;
  int D;
};

// Dynamic shared memory: a chunk's staged rows, the zero block, meta, the warps' rings.
__host__ __device__ inline size_t chunk_fixed_bytes(int KT, int MT) {
  return size_t(MT) * KT * kTileXBytes + kZeroBytes + size_t(MT) * KT * 4 * sizeof(float2);
}

// A block's contiguous range [lo, hi) of n_items chunk-major items and its chunks c_lo..c_hi (descriptors in
// s_desc[c - c_lo], entries in s_ent, -1 past a chunk's rows). chunk_of(item) → chunk. Ends with a barrier;
// false (for the whole block) when the range is empty.
template <int MT, typename ChunkOf>
__device__ bool block_chunks(const MoEScratch& sc, int n_items, ChunkOf chunk_of, int& lo, int& hi, int& c_lo,
                             int& c_hi, int4* s_desc, int (*s_ent)[MT]) {
  lo = int(int64_t(blockIdx.x) * n_items / gridDim.x);
  hi = int(int64_t(blockIdx.x + 1) * n_items / gridDim.x);
  if (lo >= hi) return false;
  c_lo = chunk_of(lo);
  c_hi = chunk_of(hi - 1);
  const int nbc = c_hi - c_lo + 1;
  if (nbc > kMaxBlockChunks) __trap();  // the host sizes the grid so that this cannot happen
  for (int q = threadIdx.x; q < nbc; q += blockDim.x) s_desc[q] = __ldcg(sc.chunks + c_lo + q);
  __syncthreads();
  for (int q = threadIdx.x; q < nbc * MT; q += blockDim.x) {
    const int cq = q / MT, t = q % MT;
    const int4 d = s_desc[cq];
    s_ent[cq][t] = t < d.z ? __ldcg(sc.entries + d.y + t) : -1;
  }
  __syncthreads();
  return true;
}

// The issue side of a warp's walk over the block's items: chunk ic, item ii, step ij of the item; the warp's
// items of chunk c are first(c), first(c) + stride, ... < end(c).
struct ItemCursor {
  int ic, ii, ij, stride;
  bool done;
  template <typename First, typename End>
  __device__ void seek(int c_hi, First first, End end) {  // from chunk ic on, the first chunk with an item
    for (; ic <= c_hi; ++ic) {
      ii = first(ic);
      if (ii < end(ic)) return;
    }
    done = true;
  }
  template <typename First, typename End>
  __device__ void advance(int steps, int c_hi, First first, End end) {
    if (++ij < steps) return;
    ij = 0;
    ii += stride;
    if (ii < end(ic)) return;
    ++ic;
    seek(c_hi, first, end);
  }
};

// ------------------------------------------------------------------------------------------------ gate/up
// Whole items (many items): a warp computes the gate rows and the up rows of its item, each over the 4
// k-slices in slice order, and writes act. Split items (fewer items than half the warps, small M): the
// block's 8 warps share each item as moe_gate_up_tc's warps do (warp w: matrix w / 4, slice w % 4), their
// slice sums meet in shared memory and are added in slice order after a barrier per item.
// PIPE 0: weights through the warps' shared-memory rings (a.D stages); 1 / 2: through registers, 1 / 2 tiles
// ahead (pipe=reg / reg2).
template <int BITS, int NP, int PIPE>
__global__ void __launch_bounds__(kThreads, 1) moe_gate_up_rows_kernel(GateUpArgs a) {
  using S = TcShape<BITS>;
  using SS = SliceSums<BITS, NP>;
  constexpr int KS = 4, MT = NP * S::TPM, QL = SS::QL, STAGE = RingShape<BITS>::STAGE;
  extern __shared__ float4 smem4[];
  __shared__ int4 s_desc[kMaxBlockChunks];
  __shared__ int s_ent[kMaxBlockChunks][MT];
  __shared__ uint8_t s_wt[kWarps][64];  // the warp's steps of an item: kt | matrix << 6 | slice end << 7
  __shared__ float s_part[2][kWarps][MT * 16];
  const MoEDecodeWeights& w = a.w;
  const int K = int(w.gate.first.cols), KT = tc_kt(K), ngroups = K / kGroup;
  const int xstride = KT * kTileXBytes, mstride = KT * 4;
  char* xf = reinterpret_cast<char*>(smem4);
  char* zero = xf + MT * xstride;
  float2* meta = reinterpret_cast<float2*>(zero + kZeroBytes);
  char* rings = reinterpret_cast<char*>(meta + MT * mstride);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const int I = int(w.gate.first.rows), Is = int(w.shared_gate.rows), E = w.E;
  const int nbI = (I + 15) / 16, nbS = (Is + 15) / 16;
  const int64_t act_ld = int64_t(w.top_k) * I + Is;
  const LaneRows<BITS> lr(lane);

  pdl_wait();
  pdl_trigger();
  const int n_rc = __ldcg(a.sc.hdr), n_ch = __ldcg(a.sc.hdr + 1);
  const int n_items = n_rc * nbI + (n_ch - n_rc) * nbS;
  const bool split = a.split == 2 || (a.split == 0 && int64_t(n_items) * 2 < int64_t(gridDim.x) * kWarps);
  // the warp's steps per item (tables visible after block_chunks' barriers)
  int nst;
  {
    uint8_t* t = s_wt[warp];
    if (split) {
      nst = slice_table(t, warp % KS, KS, KS, KT, lane);
      for (int q = lane; q < nst; q += 32) t[q] = uint8_t((t[q] & 0x80) | ((warp / KS) << 6) | (t[q] & 0x3F));
    } else {
      const int n = slice_table(t, 0, 1, KS, KT, lane);
      __syncwarp();
      for (int q = lane; q < n; q += 32) t[n + q] = uint8_t(t[q] | 0x40);
      nst = 2 * n;
    }
  }
  auto base = [&](int cc) { return cc < n_rc ? cc * nbI : n_rc * nbI + (cc - n_rc) * nbS; };
  auto chunk_of = [&](int item) { return item < n_rc * nbI ? item / nbI : n_rc + (item - n_rc * nbI) / nbS; };
  int lo, hi, c_lo, c_hi;
  if (!block_chunks<MT>(a.sc, n_items, chunk_of, lo, hi, c_lo, c_hi, s_desc, s_ent)) return;
  const int stride = split ? 1 : kWarps;
  auto first = [&](int cc) { return max(lo, base(cc)) + (split ? 0 : warp); };
  auto end = [&](int cc) { return min(hi, base(cc) + (cc < n_rc ? nbI : nbS)); };
  auto matrix = [&](int e, int mat) {
    return e < E ? (mat ? w.up.expert(e) : w.gate.expert(e)) : (mat ? w.shared_up : w.shared_gate);
  };

  ItemCursor cur{c_lo, 0, 0, stride, nst == 0};
  if (!cur.done) cur.seek(c_hi, first, end);
  // the rows and k-tile of the cursor's step
  auto at = [&](const ItemCursor& cu, QMatrixDev& m, RowRef (&r)[2], int& kt, int& j0, int& nrows) {
    const int e = s_desc[cu.ic - c_lo].x, ent = s_wt[warp][cu.ij];
    m = matrix(e, (ent >> 6) & 1);
    kt = ent & 0x3F;
    nrows = e < E ? I : Is;
    j0 = (cu.ii - base(cu.ic)) * 16;
    r[0] = row_ref(m, min(j0 + g, nrows - 1));
    r[1] = row_ref(m, min(j0 + g + 8, nrows - 1));
  };
  auto issue = [&](char* st) {
    if (cur.done) return;
    QMatrixDev m;
    RowRef r[2];
    int kt, j0, nrows;
    at(cur, m, r, kt, j0, nrows);
    ring_issue<BITS>(st, r, row_ref(m, min(j0 + (lane & 15), nrows - 1)), kt, lane, ngroups, a.sbv);
    cur.advance(nst, c_hi, first, end);
  };
  auto load = [&](RowTile<BITS>& t) {
    if (cur.done) return;
    QMatrixDev m;
    RowRef r[2];
    int kt, j0, nrows;
    at(cur, m, r, kt, j0, nrows);
    load_tile_regs<BITS>(t, r, kt, c, ngroups, a.sbv);
    cur.advance(nst, c_hi, first, end);
  };
  WarpRing ring{rings + warp * a.D * STAGE, STAGE, a.D};
  RowTile<BITS> nxt, nxt2;
  if constexpr (PIPE == 0) {
    ring.prologue(issue);
  } else {
    load(nxt);
    if constexpr (PIPE == 2) load(nxt2);
  }

  const int q0 = slice_q0(c, SS::QV);
  float acc[NP][S::NCH][2];
#pragma unroll
  for (int p = 0; p < NP; ++p)
#pragma unroll
    for (int i = 0; i < S::NCH; ++i) acc[p][i][0] = acc[p][i][1] = 0.f;
  int par = 0;
  for (int cc = c_lo; cc <= c_hi; ++cc) {
    const int4 d = s_desc[cc - c_lo];
    __syncthreads();  // the previous chunk's rows are read no more
    stage_rows_in(xf, meta, zero, a.frag, a.meta, s_ent[cc - c_lo], 8, d.z, xstride, mstride);
    __syncthreads();
    const uint32_t tmask = (1u << d.z) - 1u;
    const int np_act = active_tiles<BITS>(tmask), nrows = d.x < E ? I : Is;
    const int* ent = s_ent[cc - c_lo];
    for (int item = first(cc); item < end(cc); item += stride) {
      const int j0 = (item - base(cc)) * 16;
      float tg[QL], tu[QL];
#pragma unroll
      for (int q = 0; q < QL; ++q) tg[q] = tu[q] = 0.f;
      for (int j = 0; j < nst; ++j) {
        const int e = s_wt[warp][j], kt = e & 0x3F, mat = (e >> 6) & 1;
        RowTile<BITS> t;
        if constexpr (PIPE == 0) {
          const char* st = ring.step(issue);
          const bool sbs = sb_staged(a.sbv, kt, ngroups);
          ring_read<BITS>(t, st, lane, sbs);
          if (!sbs) {
            const QMatrixDev m = matrix(d.x, mat);
            const RowRef r[2] = {row_ref(m, min(j0 + g, nrows - 1)), row_ref(m, min(j0 + g + 8, nrows - 1))};
            load_sb_slow<BITS>(t, r, kt, ngroups);
          }
        } else {
          t = nxt;
          if constexpr (PIPE == 2) {
            nxt = nxt2;
            load(nxt2);
          } else {
            load(nxt);
          }
        }
        tile_acc<BITS, NP>(t, xf, xstride, meta, mstride, zero, kt, ngroups, lr, tmask, np_act, acc);
        if (e & 0x80) {  // the end of a slice: its sums, added in slice order
          float z[QL];
          slice_reduce<BITS, NP>(acc, c, z);
          if (split) {
#pragma unroll
            for (int q = 0; q < QL; ++q) s_part[par][warp][((q0 + q) >> 1) * 16 + g + 8 * ((q0 + q) & 1)] = z[q];
          } else if (mat) {
#pragma unroll
            for (int q = 0; q < QL; ++q) tu[q] += z[q];
          } else {
#pragma unroll
            for (int q = 0; q < QL; ++q) tg[q] += z[q];
          }
        }
      }
      if (split) {  // the 4 gate and 4 up slices of each row, added in slice order
        __syncthreads();
        const int nsl = min(KS, KT);
        for (int q = threadIdx.x; q < d.z * 16; q += kThreads) {
          const int t = q / 16, rr = q % 16;
          if (j0 + rr < nrows) {
            float gv = 0.f, uv = 0.f;
            for (int s2 = 0; s2 < nsl; ++s2) {
              gv += s_part[par][s2][t * 16 + rr];
              uv += s_part[par][KS + s2][t * 16 + rr];
            }
            a.act[int64_t(ent[t] >> 8) * act_ld + int64_t(ent[t] & 0xFF) * I + j0 + rr] = silu_f(gv) * uv;
          }
        }
        par ^= 1;
      } else {
#pragma unroll
        for (int q = 0; q < QL; ++q) {
          const int t = (q0 + q) >> 1, rr = g + 8 * ((q0 + q) & 1);
          if (t < d.z && j0 + rr < nrows)
            a.act[int64_t(ent[t] >> 8) * act_ld + int64_t(ent[t] & 0xFF) * I + j0 + rr] = silu_f(tg[q]) * tu[q];
        }
      }
    }
  }
  if constexpr (PIPE == 0) cp_async_wait_all();
}

// ------------------------------------------------------------------------------------------------ down
// A chunk's rows' input segments (act of their slot, K_l values) → hi/lo fragments + meta in shared memory,
// exactly as gemv_tc's staging of moe_down_tc's concatenated input (per 64-group, no prologue).
template <int BITS, int MT>
__device__ void stage_segments(const float* act, int64_t act_ld, int I, const int* ent, int n_tok, int K_l, char* xf,
                               int xstride, float2* meta, int mstride) {
  const int n8 = K_l / 8, n8t = tc_kt(K_l) * kTileCols / 8;
  for (int t0 = 0; t0 < MT * n8t; t0 += kThreads) {  // whole warps iterate together (n8t % 32 == 0)
    const int u = t0 + threadIdx.x, tok = u / n8t, tl = u % n8t;
    float v[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    if (tok < n_tok && tl < n8) {
      const int e = ent[tok];
      const float4* src = reinterpret_cast<const float4*>(act + int64_t(e >> 8) * act_ld + int64_t(e & 0xFF) * I + 8 * tl);
      const float4 p = __ldcg(src), q = __ldcg(src + 1);
      v[0] = p.x, v[1] = p.y, v[2] = p.z, v[3] = p.w, v[4] = q.x, v[5] = q.y, v[6] = q.z, v[7] = q.w;
    }
    int E;
    float sum;
    group_meta(v, E, sum);
    if (tok < n_tok) {
      uint4 hi, lo;
      split_unit<BITS>(v, pow2i(-E), hi, lo);
      char* dst = xf + tok * xstride + unit_off<BITS>(tl);
      *reinterpret_cast<uint4*>(dst) = hi;
      *reinterpret_cast<uint4*>(dst + 16) = lo;
      if ((tl & 7) == 0) meta[tok * mstride + tl / 8] = make_float2(pow2i(E), sum);
    }
  }
}

template <int BITS, int NP, int PIPE>
__global__ void __launch_bounds__(kThreads, 1) moe_down_rows_kernel(DownArgs a) {
  using S = TcShape<BITS>;
  constexpr int MT = NP * S::TPM, STAGE = RingShape<BITS>::STAGE;
  extern __shared__ float4 smem4[];
  __shared__ int4 s_desc[kMaxBlockChunks];
  __shared__ int s_ent[kMaxBlockChunks][MT];
  const MoEDecodeWeights& w = a.w;
  const int64_t H = w.down.first.rows;
  const int I = int(w.down.first.cols), Is = int(w.shared_down.cols), k = w.top_k, gI = I / kGroup, E = w.E;
  const int NG = moe_ngroups(w);
  const int KTI = tc_kt(I), KTS = tc_kt(Is), KTm = max(KTI, KTS);
  const int xstride = KTm * kTileXBytes, mstride = KTm * 4;
  char* xf = reinterpret_cast<char*>(smem4);
  char* zero = xf + MT * xstride;
  float2* meta = reinterpret_cast<float2*>(zero + kZeroBytes);
  char* rings = reinterpret_cast<char*>(meta + MT * mstride);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2;
  const int nrbH = int((H + 15) / 16);
  const int64_t act_ld = int64_t(k) * I + Is;
  const LaneRows<BITS> lr(lane);
  for (int i = threadIdx.x; i < kZeroBytes / 16; i += kThreads) reinterpret_cast<uint4*>(zero)[i] = make_uint4(0, 0, 0, 0);

  pdl_wait();
  pdl_trigger();
  const int n_ch = __ldcg(a.sc.hdr + 1);
  auto chunk_of = [&](int item) { return item / nrbH; };
  int lo, hi, c_lo, c_hi;
  if (!block_chunks<MT>(a.sc, n_ch * nrbH, chunk_of, lo, hi, c_lo, c_hi, s_desc, s_ent)) return;
  auto first = [&](int cc) { return max(lo, cc * nrbH) + warp; };
  auto end = [&](int cc) { return min(hi, (cc + 1) * nrbH); };
  auto steps = [&](int cc) { return s_desc[cc - c_lo].x < E ? KTI : KTS; };

  ItemCursor cur{c_lo, 0, 0, kWarps, false};
  cur.seek(c_hi, first, end);
  auto issue = [&](char* st) {
    if (cur.done) return;
    const int e = s_desc[cur.ic - c_lo].x;
    const bool routed = e < E;
    const QMatrixDev m = routed ? w.down.expert(e) : w.shared_down;
    const int64_t r0 = int64_t(cur.ii - cur.ic * nrbH) * 16;
    const RowRef r[2] = {row_ref(m, min(r0 + g, H - 1)), row_ref(m, min(r0 + g + 8, H - 1))};
    ring_issue<BITS>(st, r, row_ref(m, min(r0 + (lane & 15), H - 1)), cur.ij, lane, (routed ? I : Is) / kGroup,
                     routed ? a.sbv_r : a.sbv_s);
    cur.advance(steps(cur.ic), c_hi, first, end);
  };
  auto load = [&](RowTile<BITS>& t) {
    if (cur.done) return;
    const int e = s_desc[cur.ic - c_lo].x;
    const bool routed = e < E;
    const QMatrixDev m = routed ? w.down.expert(e) : w.shared_down;
    const int64_t r0 = int64_t(cur.ii - cur.ic * nrbH) * 16;
    const RowRef r[2] = {row_ref(m, min(r0 + g, H - 1)), row_ref(m, min(r0 + g + 8, H - 1))};
    load_tile_regs<BITS>(t, r, cur.ij, lane & 3, (routed ? I : Is) / kGroup, routed ? a.sbv_r : a.sbv_s);
    cur.advance(steps(cur.ic), c_hi, first, end);
  };
  WarpRing ring{rings + warp * a.D * STAGE, STAGE, a.D};
  RowTile<BITS> nxt, nxt2;
  if constexpr (PIPE == 0) {
    ring.prologue(issue);
  } else {
    load(nxt);
    if constexpr (PIPE == 2) load(nxt2);
  }

  for (int cc = c_lo; cc <= c_hi; ++cc) {
    const int4 d = s_desc[cc - c_lo];
    const bool routed = d.x < E;
    const int K_l = routed ? I : Is, ng = K_l / kGroup, KT_l = routed ? KTI : KTS;
    __syncthreads();  // the previous chunk's fragments are read no more
    stage_segments<BITS, MT>(a.act, act_ld, I, s_ent[cc - c_lo], d.z, K_l, xf, xstride, meta, mstride);
    __syncthreads();
    const uint32_t tmask = (1u << d.z) - 1u;
    const int np_act = active_tiles<BITS>(tmask);
    const int* ent = s_ent[cc - c_lo];
    for (int item = first(cc); item < end(cc); item += kWarps) {
      const int64_t r0 = int64_t(item - cc * nrbH) * 16, n0 = r0 + g;
      const QMatrixDev m = routed ? w.down.expert(d.x) : w.shared_down;
      for (int kt = 0; kt < KT_l; ++kt) {
        RowTile<BITS> t;
        if constexpr (PIPE == 0) {
          const char* st = ring.step(issue);
          const bool sbs = sb_staged(routed ? a.sbv_r : a.sbv_s, kt, ng);
          ring_read<BITS>(t, st, lane, sbs);
          if (!sbs) {
            const RowRef r[2] = {row_ref(m, min(r0 + g, H - 1)), row_ref(m, min(r0 + g + 8, H - 1))};
            load_sb_slow<BITS>(t, r, kt, ng);
          }
        } else {
          t = nxt;
          if constexpr (PIPE == 2) {
            nxt = nxt2;
            load(nxt2);
          } else {
            load(nxt);
          }
        }
        tile_store<BITS, NP>(t, xf, xstride, meta, mstride, zero, kt, ng, lr, tmask, np_act,
                             [&](int tk, int sg, float gv0, float gv1) {
                               const int en = ent[tk], j = en & 0xFF;
                               const int G = (j < k ? j * gI : k * gI) + kt * 4 + sg;
                               float* dst = a.sc.gv + (int64_t(en >> 8) * NG + G) * H + n0;
                               if (n0 < H) dst[0] = gv0;
                               if (n0 + 8 < H) dst[8] = gv1;
                             });
      }
    }
  }
  if constexpr (PIPE == 0) cp_async_wait_all();
}

// ------------------------------------------------------------------------------------------------ host side
template <typename Kern>
int resident_blocks(Kern kernel, size_t smem) {
  LILAC_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  int occ = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kernel, kThreads, smem) != cudaSuccess || occ < 1) {
    cudaGetLastError();
    occ = 1;
  }
  return occ;
}

bool sb_vec(const QMatrixDev& m) {
  return (m.cols / kGroup) % 4 == 0 && reinterpret_cast<uintptr_t>(m.scales) % 8 == 0 &&
         reinterpret_cast<uintptr_t>(m.biases) % 8 == 0;
}

int smem_optin() {
  static const int v = [] {
    int dev = 0, b = 0;
    cudaGetDevice(&dev);
    if (cudaDeviceGetAttribute(&b, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess || b <= 0) {
      cudaGetLastError();
      b = 227 * 1024;  // sm_90 (this code is built for sm_90a only)
    }
    return b;
  }();
  return v;
}

// Ring stages per warp that fit beside `fixed` bytes (at most `want`, the tune's moe_ring if set); < 3: none.
int moe_ring(size_t fixed, int stage, int want) {
  const size_t static_b = 4096;  // s_desc, s_ent, s_tbl and the block's reserve
  const size_t room = size_t(smem_optin()) > fixed + static_b ? size_t(smem_optin()) - fixed - static_b : 0;
  const int fit = int(std::min<size_t>(room / (size_t(kWarps) * stage), kMaxRing));
  const int t = rows_tune().moe_ring;
  return std::min(fit, t >= 3 ? t : want);
}

template <int BITS>
constexpr int moe_np() {
  return BITS == 4 ? 4 : 1;  // chunks of moe_chunk_rows(BITS) rows
}
int gate_up_ring(const MoEDecodeWeights& w) {
  const int b = w.gate.first.bits, MT = b == 4 ? 8 : 4;
  return moe_ring(chunk_fixed_bytes(tc_kt(w.gate.first.cols), MT), b == 4 ? RingShape<4>::STAGE : RingShape<8>::STAGE, 6);
}
int down_ring(const MoEDecodeWeights& w) {
  const int b = w.down.first.bits, MT = b == 4 ? 8 : 4;
  const int KTm = std::max(tc_kt(w.down.first.cols), tc_kt(w.shared_down.cols));
  return moe_ring(chunk_fixed_bytes(KTm, MT), b == 4 ? RingShape<4>::STAGE : RingShape<8>::STAGE, 8);
}

// Persistent grid: one block per SM (what shared memory holds), but enough that no block spans more than
// kMaxBlockChunks chunks.
int moe_grid(int resident, int64_t max_items, int min_items_per_chunk) {
  const int64_t need = (max_items + int64_t(min_items_per_chunk) * (kMaxBlockChunks - 2) - 1) /
                       (int64_t(min_items_per_chunk) * (kMaxBlockChunks - 2));
  return int(std::max<int64_t>({int64_t(resident), need, 1}));
}

template <int BITS>
void launch_gate_up(const GateUpArgs& a, int M, cudaStream_t stream) {
  constexpr int NP = moe_np<BITS>(), MT = NP * TcShape<BITS>::TPM;
  auto kernel = a.D > 0 ? moe_gate_up_rows_kernel<BITS, NP, 0>
                        : (rows_tune().pipe == 3 ? moe_gate_up_rows_kernel<BITS, NP, 2> : moe_gate_up_rows_kernel<BITS, NP, 1>);
  const size_t smem = chunk_fixed_bytes(tc_kt(a.w.gate.first.cols), MT) + size_t(kWarps) * a.D * RingShape<BITS>::STAGE;
  const int nbI = int((a.w.gate.first.rows + 15) / 16), nbS = int((a.w.shared_gate.rows + 15) / 16);
  const int64_t max_chunks = int64_t(M) * (a.w.top_k + 1);
  const int grid = moe_grid(sm_count() * resident_blocks(kernel, smem), max_chunks * std::max(nbI, nbS), std::min(nbI, nbS));
  launch_pdl(kernel, dim3(grid), dim3(kThreads), smem, stream, a);
}

template <int BITS>
void launch_down(const DownArgs& a, int M, cudaStream_t stream) {
  constexpr int NP = moe_np<BITS>(), MT = NP * TcShape<BITS>::TPM;
  auto kernel = a.D > 0 ? moe_down_rows_kernel<BITS, NP, 0>
                        : (rows_tune().pipe == 3 ? moe_down_rows_kernel<BITS, NP, 2> : moe_down_rows_kernel<BITS, NP, 1>);
  const int KTm = std::max(tc_kt(a.w.down.first.cols), tc_kt(a.w.shared_down.cols));
  const size_t smem = chunk_fixed_bytes(KTm, MT) + size_t(kWarps) * a.D * RingShape<BITS>::STAGE;
  const int64_t nrbH = (a.w.down.first.rows + 15) / 16;
  const int64_t max_chunks = int64_t(M) * (a.w.top_k + 1);
  const int grid = moe_grid(sm_count() * resident_blocks(kernel, smem), max_chunks * nrbH, int(nrbH));
  launch_pdl(kernel, dim3(grid), dim3(kThreads), smem, stream, a);
}

}  // namespace

bool moe_rows_ring_fits(const MoEDecodeWeights& w) { return gate_up_ring(w) >= 3 && down_ring(w) >= 3; }

void moe_gate_up_rows(const MoEDecodeWeights& w, const void* frag, const float2* meta, int M, const void* scratch,
                      float* act, cudaStream_t stream) {
  if (!moe_rows_supported(w, std::max(M, 1))) throw Error("rows::moe_gate_up_rows: unsupported MoE shape or M");
  if (M == 0) return;
  GateUpArgs a;
  a.w = w;
  a.frag = static_cast<const char*>(frag);
  a.meta = meta;
  a.sc = moe_carve(const_cast<void*>(scratch), w, M);
  a.act = act;
  a.sbv = sb_vec(w.gate.first) && sb_vec(w.up.first) && sb_vec(w.shared_gate) && sb_vec(w.shared_up);
  a.D = rows_tune().pipe >= 2 ? 0 : gate_up_ring(w);
  a.split = rows_tune().moe_split;
  if (w.gate.first.bits == 4)
    launch_gate_up<4>(a, M, stream);
  else
    launch_gate_up<8>(a, M, stream);
}

void moe_down_rows(const MoEDecodeWeights& w, const float* act, int M, void* scratch, cudaStream_t stream) {
  if (!moe_rows_supported(w, std::max(M, 1))) throw Error("rows::moe_down_rows: unsupported MoE shape or M");
  if (M == 0) return;
  DownArgs a;
  a.w = w;
  a.act = act;
  a.sc = moe_carve(scratch, w, M);
  a.sbv_r = sb_vec(w.down.first);
  a.sbv_s = sb_vec(w.shared_down);
  a.D = rows_tune().pipe >= 2 ? 0 : down_ring(w);
  if (w.down.first.bits == 4)
    launch_down<4>(a, M, stream);
  else
    launch_down<8>(a, M, stream);
}

}  // namespace lilac::cuda::rows
