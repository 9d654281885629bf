// Multi-row MoE, the expert launches (rows_mm.h): gate/up + SwiGLU and down, over the chunks that
// moe_route_rows made (an expert's rows, at most MT of them), so each chunk's expert weights are read once
// for all its rows. Work items are (chunk, rows of the expert's matrix); each persistent block takes a
// contiguous range of items, so it reloads the staged rows of a chunk only when the chunk changes.
//
// gate/up: exactly moe_gate_up_tc's arithmetic per row (4 warps × gate rows, 4 warps × up rows of a 16-row
// block, 4 k-slices each, partial sums added in order, act = silu(gate)·up).
// down: for each row, expert (its slot j) and output row, the expert's sum P_e of its 64-group values in
// moe_down_tc's order (rows_mm.h: four chains a_σ over the expert's k-tiles, then (a0 + a1) + (a2 + a3)),
// which moe_combine_rows then weighs and adds in moe_down_tc's order.
//
// Weight tiles reach the warps one of two ways (the same bytes into the same registers, so the same bits):
// 4-bit weights with aligned scale rows (the model's) through per-warp cp.async rings in shared memory
// (ring_rows.cuh), 3 tiles ahead for one-tile chunks and 2 for two-tile chunks; otherwise two register tiles
// swapping roles, one step ahead. The rings took the MoE layer at M = 16 / 32 / 64 from 111 / 188 / 290 to 109 /
// 178 / 267 µs (bench/BENCHMARKS.md): the kernels are bound by issue more than by bytes in flight, so the rings'
// requests take their rows' addresses from per-chunk bases (ChunkRows; 31.7 → 26.6 M instructions for gate/up at
// M = 16, the layer 104 µs).
#include <algorithm>
#include <string>
#include <type_traits>

#include "cuda/cuda_common.h"
#include "cuda/kernels/launch.cuh"
#include "cuda/kernels/rows/moe_rows.cuh"
#include "cuda/kernels/rows/ring_rows.cuh"
#include "cuda/kernels/rows/rows_mm.h"
#include "cuda/kernels/rows/tc_rows.cuh"

namespace lilac::cuda::rows {
namespace {

using namespace rows_dev;
using ::lilac::cuda::dev::pdl_trigger;
using ::lilac::cuda::dev::pdl_wait;

constexpr int kMaxBlockChunks = 64;  // chunk descriptors a block caches (the host sizes the grid for it)
// Chunks of 4-bit experts with one mma tile, or two through the rings, take the precomputed ChunkTiles path
// (tc_rows.cuh); 8-bit experts and the two-tile register walk keep tile_rows (there ChunkTiles would not fit in
// the registers).
template <int BITS, int NP, int D>
constexpr bool kChunkTiles = BITS == 4 && (NP == 1 || (NP == 2 && D > 0));

// A position in a block's walk: item (work items fit in 32 bits: at most (M·k + M) chunks × row blocks), k-tile
// step j of the item, and the item's chunk cq (absolute) and row block rb inside the chunk, advanced by
// next_item without divisions.
struct Step {
  int item, j, cq, rb;
};

// One stack of expert matrices (or the shared expert: one matrix) with its strides computed on the host, so
// that a k-tile's row pointers cost a few integer multiply-adds. (Through QExpertsDev::expert() and row_ref()
// they cost two 64-bit divisions and a dozen 64-bit multiplies per k-tile step; replacing them took the gate/up
// kernel at M = 16 from 35.7 M to 30.7 M executed instructions, by Nsight Compute.)
struct ExpertRows {
  const char* q = nullptr;
  const unsigned short* s = nullptr;
  const unsigned short* b = nullptr;
  int64_t q_estride = 0, sb_estride = 0;  // bytes / scale entries from one expert to the next
  int q_row = 0, sb_row = 0;              // bytes / scale entries per row
};
ExpertRows expert_rows(const QMatrixDev& m, bool stacked) {
  ExpertRows x;
  x.q = reinterpret_cast<const char*>(m.qweight);
  x.s = reinterpret_cast<const unsigned short*>(m.scales);
  x.b = reinterpret_cast<const unsigned short*>(m.biases);
  x.q_row = int(m.cols * m.bits / 8);
  x.sb_row = int(m.cols / m.group_size);
  x.q_estride = stacked ? m.rows * x.q_row : 0;
  x.sb_estride = stacked ? m.rows * x.sb_row : 0;
  return x;
}
// Row r of expert e of x (row_ref's result, without its arithmetic).
__device__ __forceinline__ RowRef expert_row(const ExpertRows& x, int e, int r) {
  RowRef ref;
  ref.q = x.q + e * x.q_estride + int64_t(r) * x.q_row;
  const int64_t sb = e * x.sb_estride + int64_t(r) * x.sb_row;
  ref.s = x.s + sb;
  ref.b = x.b + sb;
  return ref;
}

// The rows of one expert matrix as a ring kernel's issue needs them, fixed for a chunk (computed when the issue
// cursor enters a chunk, not per k-tile): row r's weights at q + r·q_row, the scales (lanes 0..15) or biases (lanes
// 16..31) of row r at sb + r·sb_row, rows clamped to `last`.
struct ChunkRows {
  const char* q;
  const unsigned short* sb;
  int q_row, sb_row, last;
};
__device__ __forceinline__ ChunkRows chunk_rows(const ExpertRows& x, int e, int nrows, int lane) {
  return ChunkRows{x.q + e * x.q_estride, (lane < 16 ? x.s : x.b) + e * x.sb_estride, x.q_row, x.sb_row, nrows - 1};
}
// ring_issue<4> (ring_rows.cuh) for a whole tile (4-bit, K a multiple of 256, scale rows 8-byte aligned: no zero fill,
// scales always staged) of the 16-row block from row j0, k-tile kt: the same copies, with 32-bit row offsets.
__device__ __forceinline__ void ring_issue_rows(char* st, const ChunkRows& cr, int j0, int kt, int lane) {
  const int g = lane >> 2, c = lane & 3;
  const char* q0 = cr.q + min(j0 + g, cr.last) * cr.q_row + kt * 128 + 16 * c;
  const char* q1 = cr.q + min(j0 + g + 8, cr.last) * cr.q_row + kt * 128 + 16 * c;
#pragma unroll
  for (int i = 0; i < 2; ++i) {  // unit i of rows g (h = 0) and g + 8 (h = 1): byte 64·i of the lane's 16
    ::lilac::cuda::dev::cp_async16_l2pf(st + RingShape<4>::w_off(0, i, lane), q0 + 64 * i);
    ::lilac::cuda::dev::cp_async16_l2pf(st + RingShape<4>::w_off(1, i, lane), q1 + 64 * i);
  }
  cp_async8(st + RingShape<4>::sb_off(lane & 15, lane >> 4), cr.sb + min(j0 + (lane & 15), cr.last) * cr.sb_row + kt * 4);
}

// A block's walk of its steps from st (until item hi) with each warp's k-tiles through its ring of D stages: the
// request cursor runs D - 1 steps ahead; tile_at(s, j0, kt) says whether the warp has a tile in step s (its 16-row
// block from row j0, k-tile kt); rows_of(cq) gives the warp's matrix rows for chunk cq, computed when the cursor
// enters a chunk. For every step: before(st) (the chunk's staging), the wait for its tile, body(cur, st, ns).
template <int D, typename Next, typename TileAt, typename RowsOf, typename Before, typename Body>
__device__ __forceinline__ void ring_walk(Step st, int hi, char* ring, int lane, Next&& next, TileAt&& tile_at,
                                          RowsOf&& rows_of, Before&& before, Body&& body) {
  Step is = st;  // the step whose tile the ring requests next
  int icq = -1;  // the chunk of icr
  ChunkRows icr;
  auto issue = [&](char* stage) {
    int j0, kt;
    if (tile_at(is, j0, kt)) {
      if (is.cq != icq) {
        icq = is.cq;
        icr = rows_of(icq);
      }
      ring_issue_rows(stage, icr, j0, kt, lane);
    }
    is = next(is);
  };
  WarpRing ring_w{ring, RingShape<4>::STAGE, D};
  ring_w.prologue(issue);
  RowTile<4> cur;
  while (st.item < hi) {
    before(st);
    const char* stg = ring_w.step(issue);
    int j0, kt;
    if (tile_at(st, j0, kt)) ring_read<4>(cur, stg, lane, true);
    const Step ns = next(st);
    body(cur, st, ns);
    st = ns;
  }
  cp_async_wait_all();
}
// The same walk with each warp's k-tiles in registers, one step ahead (the kernels' D = 0): load(t, s) requests
// step s's tile into t; the two tiles swap roles each step (the loop body runs twice per iteration: no register
// copy of the next tile into the current one).
template <typename Tile, typename Next, typename Load, typename Before, typename Body>
__device__ __forceinline__ void reg_walk(Step st, int hi, Next&& next, Load&& load, Before&& before, Body&& body) {
  Tile t0, t1;
  load(t0, st);
  load(t1, next(st));
  bool nxt_loaded = true;
  auto step = [&](const Tile& cur, Tile& nxt) {
    if (st.item >= hi) return false;
    before(st);
    const Step ns = next(st);
    if (!nxt_loaded) load(nxt, ns);
    nxt_loaded = false;
    body(cur, st, ns);
    st = ns;
    return true;
  };
  while (step(t0, t1) && step(t1, t0)) {
  }
}

struct GateUpArgs {
  MoEDecodeWeights w;
  ExpertRows rows[2][2];  // [routed, shared][gate, up]
  const char* frag;
  const float2* meta;
  MoEScratch sc;
  float* act;
  bool sbv;
};
struct DownArgs {
  MoEDecodeWeights w;
  ExpertRows rows[2];  // routed, shared
  const float* act;
  MoEScratch sc;
  bool sbv_r, sbv_s;
};

__host__ __device__ inline size_t chunk_smem_bytes(int KT, int MT) {
  return size_t(MT) * KT * kTileXBytes + kZeroBytes + size_t(MT) * KT * 4 * sizeof(float2);
}

// The block's item range [lo, hi) of n items, and the descriptors / entries of its chunks into shared memory.
// chunk_of(item, &sub) → chunk index, sub = the item's index inside its chunk. Returns false when empty.
template <int MT, typename ChunkOf>
__device__ bool block_chunks(const MoEScratch& sc, int n_items, ChunkOf chunk_of, int& lo, int& hi, int& c_lo,
                             int4* s_desc, int (*s_ent)[MT]) {
  lo = int(int64_t(blockIdx.x) * n_items / gridDim.x);
  hi = int(int64_t(blockIdx.x + 1) * n_items / gridDim.x);
  if (lo >= hi) return false;
  int sub;
  c_lo = chunk_of(lo, sub);
  const int nbc = chunk_of(hi - 1, sub) - c_lo + 1;
  if (nbc > kMaxBlockChunks) __trap();  // the host sizes the grid so that this cannot happen
  for (int q = threadIdx.x; q < nbc; q += blockDim.x) s_desc[q] = __ldcg(sc.chunks + c_lo + q);
  __syncthreads();
  for (int q = threadIdx.x; q < nbc * MT; q += blockDim.x) {
    const int cq = q / MT, t = q % MT;
    const int4 d = s_desc[cq];
    s_ent[cq][t] = t < d.z ? __ldcg(sc.entries + d.y + t) : -1;
  }
  return true;  // s_ent is visible after the caller's next barrier
}

// nb: row blocks of chunk s.cq's matrix
__device__ __forceinline__ Step next_item(Step s, int iters, int nb) {
  if (++s.j == iters) {
    s.j = 0;
    ++s.item;
    if (++s.rb == nb) {
      s.rb = 0;
      ++s.cq;
    }
  }
  return s;
}

// The staged input rows (fragments + meta) of a chunk's n_tok entries into shared memory: with plain loads for the
// ring kernels (D > 0: cp.async copies would join the rings' groups, and block_copy16's 8 loads in flight per
// thread take registers those kernels lack), through cp.async otherwise (waited for here).
template <int D>
__device__ __forceinline__ void copy_chunk_rows(const char* frag, const float2* gmeta, const int* ent, int n_tok,
                                                char* xf, float2* meta, int xstride, int mstride) {
  for (int t = 0; t < n_tok; ++t) {
    const int64_t row = ent[t] >> 8;
    if constexpr (D > 0) {
      const uint4* src = reinterpret_cast<const uint4*>(frag + row * xstride);
      const float4* msrc = reinterpret_cast<const float4*>(gmeta + row * mstride);
      for (int i = threadIdx.x; i < xstride / 16; i += kThreads)
        reinterpret_cast<uint4*>(xf + t * xstride)[i] = __ldcg(src + i);
      for (int i = threadIdx.x; i < mstride / 2; i += kThreads)
        reinterpret_cast<float4*>(meta + t * mstride)[i] = __ldcg(msrc + i);
    } else {
      for (int i = threadIdx.x; i < xstride / 16; i += kThreads)
        cp_async16(xf + t * xstride + 16 * i, frag + row * xstride + 16 * i);
      for (int i = threadIdx.x; i < mstride / 2; i += kThreads)
        cp_async16(meta + t * mstride + 2 * i, gmeta + row * mstride + 2 * i);
    }
  }
  if constexpr (D == 0) cp_async_wait_all();
}

// ------------------------------------------------------------------------------------------------ gate/up
// D: depth of the warps' k-tile rings (ring_walk; 0: reg_walk, two register tiles one step ahead).
template <int BITS, int NP, int D>
__global__ void __launch_bounds__(kThreads, 2) moe_gate_up_rows_kernel(GateUpArgs a) {
  using S = TcShape<BITS>;
  constexpr int KS = 4, MT = NP * S::TPM;
  constexpr int PH = NP > 2 ? 2 : NP;
  static_assert(D == 0 || (BITS == 4 && D >= 2), "rings: 4-bit weights, at least 2 stages");
  extern __shared__ float4 smem4[];
  __shared__ float part[2][kWarps][MT * 16];
  __shared__ int4 s_desc[kMaxBlockChunks];
  __shared__ int s_ent[kMaxBlockChunks][MT];
  const MoEDecodeWeights& w = a.w;
  const int K = int(w.gate.first.cols), KT = tc_kt(K), ngroups_k = K / kGroup;
  const int xstride = KT * kTileXBytes, mstride = KT * 4;
  char* xf = reinterpret_cast<char*>(smem4);
  char* zero = xf + MT * xstride;
  float2* meta = reinterpret_cast<float2*>(zero + kZeroBytes);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  char* ring = reinterpret_cast<char*>(meta + MT * mstride) + warp * D * RingShape<4>::STAGE;
  const int rbw = warp / KS, ks = warp % KS;  // rbw 0: gate, 1: up
  const int iters = (KT + KS - 1) / KS;
  const int I = int(w.gate.first.rows), Is = int(w.shared_gate.rows);
  const int nbI = (I + 15) / 16, nbS = (Is + 15) / 16;
  const int64_t act_ld = int64_t(w.top_k) * I + Is;
  const LaneRows<BITS> lr(lane);

  pdl_wait();
  pdl_trigger();
  const int n_rc = __ldcg(a.sc.hdr), n_ch = __ldcg(a.sc.hdr + 1);
  const int n_items = n_rc * nbI + (n_ch - n_rc) * nbS;
  auto chunk_of = [&](int item, int& rb) -> int {
    if (item < n_rc * nbI) {
      rb = item % nbI;
      return item / nbI;
    }
    const int q = item - n_rc * nbI;
    rb = q % nbS;
    return n_rc + q / nbS;
  };
  int lo, hi;
  int c_lo;
  if (!block_chunks<MT>(a.sc, n_items, chunk_of, lo, hi, c_lo, s_desc, s_ent)) return;
  for (int i = threadIdx.x; i < kZeroBytes / 16; i += kThreads) reinterpret_cast<uint4*>(zero)[i] = make_uint4(0, 0, 0, 0);

  auto next = [&](Step s2) { return next_item(s2, iters, s2.cq < n_rc ? nbI : nbS); };
  // The register walk's rows, per k-tile (caching them per item costs the registers that keep that path from
  // spilling: measured by ptxas, not kept; the ring walk caches per chunk, ChunkRows).
  auto block_row = [&](Step s2, int j) {  // row j of the 16-row block of step s2
    const int e = s_desc[s2.cq - c_lo].x;
    const bool routed = e < w.E;
    return expert_row(a.rows[routed ? 0 : 1][rbw], e, min(s2.rb * 16 + j, (routed ? I : Is) - 1));
  };
  auto rows_of = [&](Step s2, RowRef(&r)[2]) {  // this warp's tile of step s2 (rows g, g + 8; false: none)
    if (s2.item >= hi || ks + s2.j * KS >= KT) return false;
    r[0] = block_row(s2, g);
    r[1] = block_row(s2, g + 8);
    return true;
  };
  auto load = [&](RowTile<BITS>& t, Step s2) {
    RowRef r[2];
    if (rows_of(s2, r)) load_row_tile<BITS>(t, r, ks + s2.j * KS, c, ngroups_k, a.sbv);
  };
  int cur_cq = -1, n_tok = 0;
  uint32_t tmask = 0;
  ChunkTiles<BITS, NP> ct;  // kChunkTiles: the lane's B units and output groups for the chunk's rows
  // A new chunk: its rows' staged input into shared memory.
  auto stage_chunk = [&](int cq) {
    __syncthreads();  // the previous chunk's fragments are read no more; s_ent, zero block visible
    n_tok = s_desc[cq].z;
    copy_chunk_rows<D>(a.frag, a.meta, s_ent[cq], n_tok, xf, meta, xstride, mstride);
    __syncthreads();
    cur_cq = cq;
    tmask = (1u << n_tok) - 1u;
    if constexpr (kChunkTiles<BITS, NP, D>) ct = chunk_tiles<BITS, NP>(lr, xstride, MT * xstride, mstride, tmask);
  };
  float acc[NP][S::NCH][2];
  clear_acc<BITS, NP>(acc);
  int par = 0;
  // The math of step st with its tile in cur (ns: the step after it), and at the end of an item its gate and up
  // rows → act.
  auto work = [&](const RowTile<BITS>& cur, Step st, Step ns) {
    const int cq = st.cq - c_lo, rb = st.rb;
    const int kt = ks + st.j * KS;
    if (kt < KT) {
      if constexpr (kChunkTiles<BITS, NP, D>)
        tile_chunk_acc<BITS, NP>(cur, xf, ct, meta, kt, ngroups_k, lr, acc);
      else
        tile_rows_acc<BITS, NP, PH>(cur, xf, xstride, meta, mstride, zero, kt, ngroups_k, lr, tmask,
                                    active_tiles<BITS>(tmask), acc);
    }
    if (ns.j == 0) {
      write_partials_rows<BITS, NP>(acc, part[par][warp], g, c);
      __syncthreads();
      const int e = s_desc[cq].x, nrows = e < w.E ? I : Is, j0 = rb * 16;
      for (int q = threadIdx.x; q < n_tok * 16; q += kThreads) {
        const int t = q / 16, rr = q % 16;
        if (j0 + rr < nrows) {
          float gv = 0.f, uv = 0.f;
#pragma unroll
          for (int s2 = 0; s2 < KS; ++s2) {
            gv += part[par][s2][t * 16 + rr];
            uv += part[par][KS + s2][t * 16 + rr];
          }
          const int ent = s_ent[cq][t];
          a.act[int64_t(ent >> 8) * act_ld + int64_t(ent & 0xFF) * I + j0 + rr] = silu_f(gv) * uv;
        }
      }
      par ^= 1;
    }
  };
  Step st{lo, 0, 0, 0};
  st.cq = chunk_of(lo, st.rb);
  auto before = [&](Step s2) {
    if (s2.cq - c_lo != cur_cq) stage_chunk(s2.cq - c_lo);
  };
  if constexpr (D > 0) {
    ring_walk<D>(
        st, hi, ring, lane, next,
        [&](Step s2, int& j0, int& kt) {
          j0 = s2.rb * 16;
          kt = ks + s2.j * KS;
          return s2.item < hi && kt < KT;
        },
        [&](int cq) {
          const int e = s_desc[cq - c_lo].x;
          const bool routed = e < w.E;
          return chunk_rows(a.rows[routed ? 0 : 1][rbw], e, routed ? I : Is, lane);
        },
        before, work);
  } else {
    reg_walk<RowTile<BITS>>(st, hi, next, load, before, work);
  }
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
      const float4 p = src[0], q = src[1];
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

template <int BITS, int NP, int D>
__global__ void __launch_bounds__(kThreads, 2) moe_down_rows_kernel(DownArgs a) {
  using S = TcShape<BITS>;
  constexpr int MT = NP * S::TPM;
  constexpr int PH = NP > 2 ? 2 : NP;
  static_assert(D == 0 || (BITS == 4 && D >= 2), "rings: 4-bit weights, at least 2 stages");
  extern __shared__ float4 smem4[];
  __shared__ int4 s_desc[kMaxBlockChunks];
  __shared__ int s_ent[kMaxBlockChunks][MT];
  __shared__ int s_pb[MT];  // the current chunk's rows: where their expert sums start in pe (32-bit: moe_rows_supported)
  const MoEDecodeWeights& w = a.w;
  const int64_t H = w.down.first.rows;
  const int I = int(w.down.first.cols), Is = int(w.shared_down.cols), k = w.top_k;
  const int KTI = tc_kt(I), KTS = tc_kt(Is), KTm = max(KTI, KTS);
  const int xstride = KTm * kTileXBytes, mstride = KTm * 4;
  char* xf = reinterpret_cast<char*>(smem4);
  char* zero = xf + MT * xstride;
  float2* meta = reinterpret_cast<float2*>(zero + kZeroBytes);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  char* ring = reinterpret_cast<char*>(meta + MT * mstride) + warp * D * RingShape<4>::STAGE;
  const int64_t nrbH = (H + 15) / 16;
  const int nbH = int((nrbH + kWarps - 1) / kWarps);  // items per chunk: 8 row blocks, one per warp
  const int64_t act_ld = int64_t(k) * I + Is;
  const LaneRows<BITS> lr(lane);

  // The routing's chunks and the expert weights are read before the wait: the routing is two launches back
  // (launch.cuh: when kernel K starts, kernel K - 2 is complete), so the block's first weight tiles are requested
  // while gate/up's last blocks still run (this kernel's blocks become resident as theirs retire); act is read after
  // the wait (`before`, at the first staging).
  const int n_ch = __ldcg(a.sc.hdr + 1);
  auto chunk_of = [&](int item, int& ib) -> int {
    ib = item % nbH;
    return item / nbH;
  };
  int lo, hi;
  int c_lo;
  if (!block_chunks<MT>(a.sc, n_ch * nbH, chunk_of, lo, hi, c_lo, s_desc, s_ent)) {
    // No chunk at all (every row a padding row): no block would pass the wait, and this launch could complete before
    // gate/up — the kernels after it read, before their own waits, what the kernel two launches back wrote
    // (launch.cuh rule 2), which holds only if some block of each launch waited. Blocks merely without items exit.
    if (n_ch == 0) pdl_wait();
    return;
  }
  for (int i = threadIdx.x; i < kZeroBytes / 16; i += kThreads) reinterpret_cast<uint4*>(zero)[i] = make_uint4(0, 0, 0, 0);

  auto next = [&](Step s2) { return next_item(s2, KTm, nbH); };
  auto has_tile = [&](Step s2) {  // whether this warp has a tile in step s2
    return s2.item < hi && s2.j < (s_desc[s2.cq - c_lo].x < w.E ? KTI : KTS) && int64_t(s2.rb) * kWarps + warp < nrbH;
  };
  auto block_row = [&](Step s2, int j) {  // row j of this warp's 16-row block of step s2
    const int e = s_desc[s2.cq - c_lo].x;
    return expert_row(a.rows[e < w.E ? 0 : 1], e, min((s2.rb * kWarps + warp) * 16 + j, int(H) - 1));
  };
  auto rows_of = [&](Step s2, RowRef(&r)[2]) {  // this warp's tile of step s2 (false: none)
    if (!has_tile(s2)) return false;
    r[0] = block_row(s2, g);
    r[1] = block_row(s2, g + 8);
    return true;
  };
  auto load = [&](RowTile<BITS>& t, Step s2) {
    RowRef r[2];
    if (!rows_of(s2, r)) return;
    const bool routed = s_desc[s2.cq - c_lo].x < w.E;
    load_row_tile<BITS>(t, r, s2.j, c, int((routed ? I : Is) / kGroup), routed ? a.sbv_r : a.sbv_s);
  };
  int cur_cq = -1;
  uint32_t tmask = 0;
  ChunkTiles<BITS, NP> ct;   // kChunkTiles: the lane's B units and output groups for the chunk's rows
  auto stage_chunk = [&](int cq, int K_l) {
    __syncthreads();  // the previous chunk's fragments are read no more; s_ent, zero block visible
    const int n_tok = s_desc[cq].z;
    if (threadIdx.x < n_tok) {  // row r's slot j (the shared expert's: k): H floats at (r·(k + 1) + j)·H
      const int en = s_ent[cq][threadIdx.x];
      s_pb[threadIdx.x] = ((en >> 8) * (k + 1) + (en & 0xFF)) * int(H);
    }
    stage_segments<BITS, MT>(a.act, act_ld, I, s_ent[cq], n_tok, K_l, xf, xstride, meta, mstride);
    __syncthreads();
    cur_cq = cq;
    tmask = (1u << n_tok) - 1u;
    if constexpr (kChunkTiles<BITS, NP, D>) ct = chunk_tiles<BITS, NP>(lr, xstride, MT * xstride, mstride, tmask);
  };
  // The math of step st with its tile in cur: every present row's group values of this warp's 16 output rows,
  // added to the lane's chains (group slot osig(i) of the expert's k-tiles, in k-tile order); at the end of the
  // item (ns.j == 0) each row's expert sum, the chains' quad sum, into pe.
  float acc[NP][S::NCH][2];
  clear_acc<BITS, NP>(acc);
  auto work = [&](const RowTile<BITS>& cur, Step st, Step ns) {
    const int cq = st.cq - c_lo;
    const bool routed = s_desc[cq].x < w.E;
    const int K_l = routed ? I : Is;
    const int64_t rb = int64_t(st.rb) * kWarps + warp;
    if (rb >= nrbH) return;  // warp-uniform: no tile, nothing accumulated
    if (st.j < (routed ? KTI : KTS)) {
      if constexpr (kChunkTiles<BITS, NP, D>)
        tile_chunk_acc<BITS, NP>(cur, xf, ct, meta, st.j, K_l / kGroup, lr, acc);
      else
        tile_rows_acc<BITS, NP, PH>(cur, xf, xstride, meta, mstride, zero, st.j, K_l / kGroup, lr, tmask,
                                    active_tiles<BITS>(tmask), acc);
    }
    if (ns.j == 0) {
      const int n0 = int(rb) * 16 + g, Hi = int(H);
      row_sums<BITS, NP>(acc, c, [&](int t, int h, float v) {
        if (((tmask >> t) & 1u) && n0 + 8 * h < Hi) a.sc.pe[s_pb[t] + n0 + 8 * h] = v;
      });
    }
  };
  auto chunk_k = [&](int cq) { return s_desc[cq].x < w.E ? I : Is; };
  Step st{lo, 0, 0, 0};
  st.cq = chunk_of(lo, st.rb);
  bool waited = false;
  auto before = [&](Step s2) {
    if (!waited) {  // gate/up's act: every thread, before the block's first staging
      pdl_wait();
      pdl_trigger();
      waited = true;
    }
    const int cq = s2.cq - c_lo;
    if (cq != cur_cq) stage_chunk(cq, chunk_k(cq));
  };
  if constexpr (D > 0) {
    ring_walk<D>(
        st, hi, ring, lane, next,
        [&](Step s2, int& j0, int& kt) {
          j0 = (s2.rb * kWarps + warp) * 16;
          kt = s2.j;
          return has_tile(s2);
        },
        [&](int cq) {
          const int e = s_desc[cq - c_lo].x;
          return chunk_rows(a.rows[e < w.E ? 0 : 1], e, int(H), lane);
        },
        before, work);
  } else {
    reg_walk<RowTile<BITS>>(st, hi, next, load, before, work);
  }
}

bool sb_vec(const QMatrixDev& m) {
  return (m.cols / kGroup) % 4 == 0 && reinterpret_cast<uintptr_t>(m.scales) % 8 == 0 &&
         reinterpret_cast<uintptr_t>(m.biases) % 8 == 0;
}

// Persistent grid: the resident blocks, but enough that no block spans more than kMaxBlockChunks chunks.
int moe_grid(int resident, int64_t max_items, int min_items_per_chunk) {
  const int64_t need = (max_items + int64_t(min_items_per_chunk) * (kMaxBlockChunks - 2) - 1) /
                       (int64_t(min_items_per_chunk) * (kMaxBlockChunks - 2));
  return int(std::max<int64_t>({int64_t(resident), need, 1}));
}

template <int BITS, int NP, int D>
void launch_gate_up(const GateUpArgs& a, int M, cudaStream_t stream) {
  constexpr int MT = NP * TcShape<BITS>::TPM;
  auto kernel = moe_gate_up_rows_kernel<BITS, NP, D>;
  const size_t smem = chunk_smem_bytes(tc_kt(a.w.gate.first.cols), MT) + size_t(kWarps) * D * RingShape<4>::STAGE;
  const int nbI = int((a.w.gate.first.rows + 15) / 16), nbS = int((a.w.shared_gate.rows + 15) / 16);
  const int64_t max_chunks = int64_t(M) * (a.w.top_k + 1);
  const int grid = moe_grid(sm_count() * resident_blocks(kernel, kThreads, smem), max_chunks * std::max(nbI, nbS), std::min(nbI, nbS));
  launch_pdl(kernel, dim3(grid), dim3(kThreads), smem, stream, a);
}

template <int BITS, int NP, int D>
void launch_down(const DownArgs& a, int M, cudaStream_t stream) {
  constexpr int MT = NP * TcShape<BITS>::TPM;
  auto kernel = moe_down_rows_kernel<BITS, NP, D>;
  const int KTm = std::max(tc_kt(a.w.down.first.cols), tc_kt(a.w.shared_down.cols));
  const size_t smem = chunk_smem_bytes(KTm, MT) + size_t(kWarps) * D * RingShape<4>::STAGE;
  const int64_t nbH = ((a.w.down.first.rows + 15) / 16 + kWarps - 1) / kWarps;
  const int64_t max_chunks = int64_t(M) * (a.w.top_k + 1);
  const int grid = moe_grid(sm_count() * resident_blocks(kernel, kThreads, smem), max_chunks * nbH, int(nbH));
  launch_pdl(kernel, dim3(grid), dim3(kThreads), smem, stream, a);
}

// Whether the 4-bit kernels take their k-tiles through per-warp rings (tc_rows.cuh): the scale / bias rows must
// be 8-byte aligned with a multiple of 4 groups (sb_vec). LILAC_MOE_RING=0 turns them off (measurement).
bool rings_on(bool sbv) {
  static const bool env_on = env_switch_on("LILAC_MOE_RING");
  return sbv && env_on;
}

// f(bits, NP, D) with the weights' bits, the mma tiles a chunk of moe_chunk_rows(bits, M) rows needs and the
// ring depth (0: none), as std::integral_constant values (the kernels' template arguments). Depths: 4 stages
// for one-tile chunks, 3 for two (their staged rows take the shared memory of the fourth at 2 blocks per SM).
template <typename F>
void with_tiles(int bits, int M, bool rings, F&& f) {
  using std::integral_constant;
  if (bits != 4)
    f(integral_constant<int, 8>{}, integral_constant<int, 1>{}, integral_constant<int, 0>{});
  else if (const int ch = moe_chunk_rows(4, M); ch <= 2) {
    if (rings)
      f(integral_constant<int, 4>{}, integral_constant<int, 1>{}, integral_constant<int, 4>{});
    else
      f(integral_constant<int, 4>{}, integral_constant<int, 1>{}, integral_constant<int, 0>{});
  } else if (ch <= 4) {
    if (rings)
      f(integral_constant<int, 4>{}, integral_constant<int, 2>{}, integral_constant<int, 3>{});
    else
      f(integral_constant<int, 4>{}, integral_constant<int, 2>{}, integral_constant<int, 0>{});
  } else {
    f(integral_constant<int, 4>{}, integral_constant<int, 4>{}, integral_constant<int, 0>{});
  }
}

}  // namespace

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
  a.rows[0][0] = expert_rows(w.gate.first, true);
  a.rows[0][1] = expert_rows(w.up.first, true);
  a.rows[1][0] = expert_rows(w.shared_gate, false);
  a.rows[1][1] = expert_rows(w.shared_up, false);
  a.sbv = sb_vec(w.gate.first) && sb_vec(w.up.first) && sb_vec(w.shared_gate) && sb_vec(w.shared_up);
  with_tiles(w.gate.first.bits, M, rings_on(a.sbv), [&](auto bits, auto np, auto d) {
    launch_gate_up<decltype(bits)::value, decltype(np)::value, decltype(d)::value>(a, M, stream);
  });
}

void moe_down_rows(const MoEDecodeWeights& w, const float* act, int M, void* scratch, cudaStream_t stream) {
  if (!moe_rows_supported(w, std::max(M, 1))) throw Error("rows::moe_down_rows: unsupported MoE shape or M");
  if (M == 0) return;
  DownArgs a;
  a.w = w;
  a.act = act;
  a.sc = moe_carve(scratch, w, M);
  a.rows[0] = expert_rows(w.down.first, true);
  a.rows[1] = expert_rows(w.shared_down, false);
  a.sbv_r = sb_vec(w.down.first);
  a.sbv_s = sb_vec(w.shared_down);
  with_tiles(w.down.first.bits, M, rings_on(a.sbv_r && a.sbv_s), [&](auto bits, auto np, auto d) {
    launch_down<decltype(bits)::value, decltype(np)::value, decltype(d)::value>(a, M, stream);
  });
}

}  // namespace lilac::cuda::rows
