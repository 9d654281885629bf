// Device pieces of the multi-row tensor-core kernels in the k-tile layout (the MoE kernels and 8-bit weights;
// the 4-bit dense GEMV uses the group layout, tc_g4.cuh). The arithmetic is gemv_tc.cu's, piece for piece
// (nibble/byte → fp16, the hi + lo split of the input per 64-group, the mma, the group value), so that a row
// computed here is bit for bit what the single-row kernel computes; the pieces both use (dq4 / dq8, the
// fragment layout, the power-of-two helpers, where a row lives) are tc_common.cuh's.
//
// Rows in one mma. Today's B operand holds 8 columns = 4 group slots × {hi, lo} of one input, and in the
// mma of chunk i only the columns of the chunk's own groups are non-zero (4-bit: groups 2i, 2i+1; 8-bit:
// group i). Here the other columns carry other rows: 4-bit: 2 rows per mma (row τ = 1 in the columns of the
// two slots the chunk does not use, as group slot σ ^ 2); 8-bit: 4 rows (row τ in the columns of slot i ^ τ).
// Every column still holds exactly the products it holds in today's kernel for its row, so each row's group
// dots, and the fixed-order sums after them, are today's. A lane that holds the output columns of row τ
// and group slot σ holds them in the lane today's kernel uses for slot σ, XOR-permuted (lane = σ ^ 2τ for
// 4-bit, σ ^ τ for 8-bit), which keeps the quad sum's pairs {0,1}, {2,3}.
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/kernels/gemv/gemv.h"
#include "cuda/kernels/qdot.cuh"
#include "cuda/kernels/tc_common.cuh"

namespace lilac::cuda::rows_dev {

using namespace ::lilac::cuda::tc;  // the k-tile shape, fragment layout, dq4 / dq8, ... (tc_common.cuh)
using ::lilac::cuda::dev::block_sum;
using ::lilac::cuda::dev::cp_async16;
using ::lilac::cuda::dev::cp_async4;
using ::lilac::cuda::dev::cp_async_wait_all;
using ::lilac::cuda::dev::ld_stream;
using ::lilac::cuda::dev::sel4;
using ::lilac::cuda::dev::silu_f;

// ------------------------------------------------------------------------------------------------ tiles
// Weights of one k-tile for one lane: rows g and g+8, NCH chunks each, plus the raw bf16 scales / biases of
// the tile's 4 groups for both rows (a lane needs the groups of the rows it holds in several columns).
template <int BITS>
struct RowTile {
  uint4 w[2][TcShape<BITS>::NCH];
  uint2 s[2], b[2];
};
// The bf16 at slot q (0..3) of v as a float (bf_raw of it): one byte permute puts its two bytes in the float's
// high half (with q & 2 known at compile time, as the 4-bit lanes' slots are, no select either).
__device__ __forceinline__ float bf_at(uint2 v, int q) {
  const uint32_t w = (q & 2) ? v.y : v.x;
  return __uint_as_float(__byte_perm(w, 0u, (q & 1) ? 0x3244u : 0x1044u));
}
// Tile kt of rows (g, g+8) whose groups are G0 = 4·kt .. of the row (local group index), `ngroups` valid
// groups in the row. sb_vec: the scale / bias rows are 8-byte aligned with a multiple of 4 groups.
template <int BITS>
__device__ __forceinline__ void load_row_tile(RowTile<BITS>& t, const RowRef (&r)[2], int kt, int c, int ngroups,
                                              bool sb_vec) {
  load_tile_words<BITS>(t.w, r, kt, c, ngroups);
  const int G0 = kt * 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (sb_vec && G0 + 3 < ngroups) {
      t.s[h] = __ldg(reinterpret_cast<const uint2*>(r[h].s + G0));
      t.b[h] = __ldg(reinterpret_cast<const uint2*>(r[h].b + G0));
    } else {
      uint32_t s4[4], b4[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        s4[q] = G0 + q < ngroups ? uint32_t(__ldg(r[h].s + G0 + q)) : 0u;
        b4[q] = G0 + q < ngroups ? uint32_t(__ldg(r[h].b + G0 + q)) : 0u;
      }
      t.s[h] = make_uint2(s4[0] | (s4[1] << 16), s4[2] | (s4[3] << 16));
      t.b[h] = make_uint2(b4[0] | (b4[1] << 16), b4[2] | (b4[3] << 16));
    }
  }
}

// Per-lane constants (functions of the lane; `i` is always a compile-time chunk index): for chunk i the B unit
// this lane supplies (row btok of the mma's rows; byte offset boff of unit 0 inside a k-tile, valid = false:
// the zero block) and the output columns it holds afterwards (row otok, group slot osig of the k-tile).
template <int BITS>
struct LaneRows {
  int s, c, base;  // s = g / 2 (the B column's group slot), c = lane % 4, base = frag_off(0, 0, c, g & 1)
  __device__ explicit LaneRows(int lane) : s(lane >> 3), c(lane & 3), base(frag_off<BITS>(0, 0, lane & 3, (lane >> 2) & 1)) {}
  __device__ __forceinline__ int btok(int i) const { return BITS == 4 ? int((s >> 1) != i) : (s ^ i); }
  __device__ __forceinline__ bool bvalid() const { return BITS == 4 ? (s & 1) == (c >> 1) : true; }
  __device__ __forceinline__ int boff(int i) const { return base + i * TcShape<BITS>::U * 128; }
  __device__ __forceinline__ int otok(int i) const { return BITS == 4 ? int((c >> 1) != i) : (c ^ i); }
  // 4-bit: ((c >> 1) != i) ? c ^ 2 : c, which is 2i + (c & 1) for every lane (chunk i's groups are slots 2i, 2i + 1)
  __device__ __forceinline__ int osig(int i) const { return BITS == 4 ? 2 * i + (c & 1) : i; }
};

// Unit u of chunk i of a lane's weight tile, dequantized once into the A registers of the unit's two mmas (a0 for
// the first k16 half, a1 for the second): rows g and g+8 interleaved as the fragment layout wants them.
template <int BITS>
__device__ __forceinline__ void unit_a(const RowTile<BITS>& t, int i, int u, uint32_t (&a0)[4], uint32_t (&a1)[4]) {
  if constexpr (BITS == 4) {
    uint32_t ha[4], hb[4];
    dq4(sel4(t.w[0][i], u), ha);
    dq4(sel4(t.w[1][i], u), hb);
    a0[0] = ha[0], a0[1] = hb[0], a0[2] = ha[1], a0[3] = hb[1];
    a1[0] = ha[2], a1[1] = hb[2], a1[2] = ha[3], a1[3] = hb[3];
  } else {
    uint32_t ha[2], hb[2];
    dq8(sel4(t.w[0][i], 2 * u), ha);
    dq8(sel4(t.w[1][i], 2 * u), hb);
    a0[0] = ha[0], a0[1] = hb[0], a0[2] = ha[1], a0[3] = hb[1];
    dq8(sel4(t.w[0][i], 2 * u + 1), ha);
    dq8(sel4(t.w[1][i], 2 * u + 1), hb);
    a1[0] = ha[0], a1[1] = hb[0], a1[2] = ha[1], a1[3] = hb[1];
  }
}

// One k-tile kt (of the weights and of the staged fragments alike; ngroups: the weights' groups) for NP mma
// tiles of rows: accumulates the group values of this lane's output columns into acc[p][i][h] (chunk i's
// columns, rows g / g+8). xf: fragments of row 0 of the block's row tile (row t at xf + t·xstride); meta: row
// t's group G at meta[t·mstride + G]; tmask: rows present. The mma tiles are walked by a loop that is not
// unrolled (the registers of one tile at a time), rotating acc so that tile p is always in acc[0].
// Where this lane's B unit of chunk i of mma tile p lives (the zero block for absent rows).
template <int BITS>
__device__ __forceinline__ const char* b_unit(const LaneRows<BITS>& lr, const char* xf, int xstride, const char* zero,
                                              int kt, int p, int i, uint32_t tmask) {
  const int bt = p * TcShape<BITS>::TPM + lr.btok(i);
  return (lr.bvalid() && ((tmask >> bt) & 1u)) ? xf + bt * xstride + kt * kTileXBytes + lr.boff(i) : zero;
}

// The rows of a row tile that are present (bit t: row tok0 + t, t < nt <= 32, whose slot is >= 0; row_slot null:
// all): one row_slot load per lane and a warp ballot, so every warp of the block gets the mask at once.
__device__ __forceinline__ uint32_t present_rows(const int32_t* row_slot, int tok0, int nt) {
  return __ballot_sync(0xffffffffu, (threadIdx.x & 31) < unsigned(nt) &&
                                        (row_slot == nullptr || row_slot[tok0 + (threadIdx.x & 31)] >= 0));
}

// Mma tiles of `per_tile` rows that hold at least one present row (tiles past the last present row skipped).
__device__ __forceinline__ int active_tiles_of(uint32_t tmask, int per_tile) {
  return tmask ? (31 - __clz(int(tmask))) / per_tile + 1 : 0;
}
// The same for the k-tile layout's mma tiles (TcShape<BITS>::TPM rows).
template <int BITS>
__device__ __forceinline__ int active_tiles(uint32_t tmask) {
  return active_tiles_of(tmask, TcShape<BITS>::TPM);
}

// The k-tile walk the tile functions share: per chunk i and pass of PH of the first np_act of NP mma tiles, each
// weight unit is dequantized once (unit_a) and multiplied with the B units xb_of(p, i) of the pass's tiles (the
// unit's address for u = 0; u at + 128·u); then fin(p, i, dot0, dot1) gets the group dots of this lane's output
// columns of tile p, chunk i (rows g, g+8). The mma chains are today's (per column: the units u in order).
template <int BITS, int NP, int PH, typename XbOf, typename Fin>
__device__ __forceinline__ void walk_tile(const RowTile<BITS>& t, int np_act, XbOf&& xb_of, Fin&& fin) {
  using S = TcShape<BITS>;
  static_assert(NP % PH == 0, "passes of PH mma tiles");
#pragma unroll
  for (int i = 0; i < S::NCH; ++i) {
#pragma unroll
    for (int q = 0; q < NP / PH; ++q) {
      if (q * PH < np_act) {
        float d[PH][2][4];
        const char* xb[PH];
#pragma unroll
        for (int pp = 0; pp < PH; ++pp) {
          xb[pp] = xb_of(q * PH + pp, i);
#pragma unroll
          for (int z = 0; z < 4; ++z) d[pp][0][z] = d[pp][1][z] = 0.f;
        }
#pragma unroll
        for (int u = 0; u < S::U; ++u) {
          uint32_t a0[4], a1[4];  // A registers of the unit's two mmas (d0: a0, d1: a1)
          unit_a<BITS>(t, i, u, a0, a1);
#pragma unroll
          for (int pp = 0; pp < PH; ++pp) {
            if (q * PH + pp < np_act) {
              const uint4 xv = *reinterpret_cast<const uint4*>(xb[pp] + u * 128);
              ::lilac::cuda::dev::mma_m16n8k16_f16(d[pp][0], a0[0], a0[1], a0[2], a0[3], xv.x, xv.y);
              ::lilac::cuda::dev::mma_m16n8k16_f16(d[pp][1], a1[0], a1[1], a1[2], a1[3], xv.z, xv.w);
            }
          }
        }
#pragma unroll
        for (int pp = 0; pp < PH; ++pp)
          if (q * PH + pp < np_act)
            fin(q * PH + pp, i, (d[pp][0][0] + d[pp][0][1]) + (d[pp][1][0] + d[pp][1][1]),
                (d[pp][0][2] + d[pp][0][3]) + (d[pp][1][2] + d[pp][1][3]));
      }
    }
  }
}

// One k-tile kt (of the weights and of the staged fragments alike) for the first np_act of NP mma tiles of
// rows, in passes of PH tiles (walk_tile), the B units found by b_unit. xf: fragments of row 0 of the block's
// row tile (row t at xf + t·xstride); tmask: rows present.
template <int BITS, int NP, int PH, typename Fin>
__device__ __forceinline__ void tile_rows(const RowTile<BITS>& t, const char* xf, int xstride, const char* zero, int kt,
                                          const LaneRows<BITS>& lr, uint32_t tmask, int np_act, Fin&& fin) {
  if constexpr (NP == 1) np_act = tmask != 0u ? 1 : 0;  // (no leading-zero count per step)
  walk_tile<BITS, NP, PH>(
      t, np_act, [&](int p, int i) { return b_unit<BITS>(lr, xf, xstride, zero, kt, p, i, tmask); }, fin);
}

// The value of one row's group, s·2^E·dot + (zc·s + b)·Σx, computed as gemv_tc's group_value computes it:
// fmaf(s·2^E, dot, fmaf(zc, s, b)·Σx), with the scale s and zc·s + b of the output group of chunk i for rows
// g (h = 0) and g+8 (h = 1): for 4-bit weights once per tile (every pass reuses them), for 8-bit (one pass,
// more chunks) where they are used.
template <int BITS>
__device__ __forceinline__ void group_scale(const RowTile<BITS>& t, int sg, int h, float& s, float& c) {
  s = bf_at(t.s[h], sg);
  c = fmaf(TcShape<BITS>::ZC, s, bf_at(t.b[h], sg));
}
template <int BITS>
struct GroupScale {
  static constexpr int N = BITS == 4 ? TcShape<BITS>::NCH : 1;
  float s[N][2], c[N][2];
  __device__ GroupScale(const RowTile<BITS>& t, const LaneRows<BITS>& lr) {
    if constexpr (BITS == 4) {
#pragma unroll
      for (int i = 0; i < N; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) group_scale<BITS>(t, lr.osig(i), h, s[i][h], c[i][h]);
    }
  }
  // fmaf(s·m.x, dot, c·m.y) for chunk i, row h
  __device__ __forceinline__ float value(const RowTile<BITS>& t, const LaneRows<BITS>& lr, int i, int h, float dot,
                                         float2 m) const {
    if constexpr (BITS == 4) {
      return fmaf(s[i][h] * m.x, dot, c[i][h] * m.y);
    } else {
      float ss, cc;
      group_scale<BITS>(t, lr.osig(i), h, ss, cc);
      return fmaf(ss * m.x, dot, cc * m.y);
    }
  }
};

// tile_rows with each present row's group values handed to store(p, i, gv of row g, gv of row g+8) for tile p's
// chunk-i output group (row p·TPM + otok(i) of the tile, group slot osig(i); meta: row t's group G at
// meta[t·mstride + G]; ngroups: the weights' groups). MoE down keeps every group's value.
template <int BITS, int NP, int PH, typename Store>
__device__ __forceinline__ void tile_rows_store(const RowTile<BITS>& t, const char* xf, int xstride, const float2* meta,
                                                int mstride, const char* zero, int kt, int ngroups,
                                                const LaneRows<BITS>& lr, uint32_t tmask, int np_act, Store&& store) {
  const GroupScale<BITS> gs(t, lr);
  tile_rows<BITS, NP, PH>(t, xf, xstride, zero, kt, lr, tmask, np_act, [&](int p, int i, float dot0, float dot1) {
    const int ot = p * TcShape<BITS>::TPM + lr.otok(i), G = kt * 4 + lr.osig(i);
    if (((tmask >> ot) & 1u) && G < ngroups) {
      const float2 mm = meta[ot * mstride + G];
      store(p, i, gs.value(t, lr, i, 0, dot0, mm), gs.value(t, lr, i, 1, dot1, mm));
    }
  });
}

// Adds the group values a store step hands over to the chains acc[p][i][h] (the dense and gate/up kernels).
template <int BITS, int NP>
struct AccStore {
  float (&acc)[NP][TcShape<BITS>::NCH][2];
  __device__ __forceinline__ void operator()(int p, int i, float v0, float v1) const {
    acc[p][i][0] = fmaf(1.f, v0, acc[p][i][0]);
    acc[p][i][1] = fmaf(1.f, v1, acc[p][i][1]);
  }
};

// tile_rows with the group values of the present rows accumulated into acc[p][i][h].
template <int BITS, int NP, int PH>
__device__ __forceinline__ void tile_rows_acc(const RowTile<BITS>& t, const char* xf, int xstride, const float2* meta,
                                              int mstride, const char* zero, int kt, int ngroups,
                                              const LaneRows<BITS>& lr, uint32_t tmask, int np_act,
                                              float (&acc)[NP][TcShape<BITS>::NCH][2]) {
  tile_rows_store<BITS, NP, PH>(t, xf, xstride, meta, mstride, zero, kt, ngroups, lr, tmask, np_act,
                                AccStore<BITS, NP>{acc});
}

// ------------------------------------------------------------------------------------------------ chunk tiles
// A lane's fixed part of b_unit and of the group values for a chunk's rows (the MoE kernels), computed when the
// chunk changes instead of in every k-tile step (Nsight Compute: ~20 instructions per chunk and step rebuilt the
// lane constants and the row tests). Tile p, chunk i: the lane's B units of k-tile kt at xf + off + kt·kst (kst
// = 0: the zero block, read for every k-tile), its output row present (on), the meta of its output group at
// meta[moff + 4·kt]; np_act: the tiles holding a present row.
template <int BITS, int NP>
struct ChunkTiles {
  static constexpr int NCH = TcShape<BITS>::NCH;
  int off[NP][NCH], kst[NP][NCH], moff[NP][NCH];
  bool on[NP][NCH];
  int np_act;
};
template <int BITS, int NP>
__device__ __forceinline__ ChunkTiles<BITS, NP> chunk_tiles(const LaneRows<BITS>& lr, int xstride, int zero_off,
                                                            int mstride, uint32_t tmask) {
  ChunkTiles<BITS, NP> o;
#pragma unroll
  for (int p = 0; p < NP; ++p)
#pragma unroll
    for (int i = 0; i < TcShape<BITS>::NCH; ++i) {
      const int bt = p * TcShape<BITS>::TPM + lr.btok(i), ot = p * TcShape<BITS>::TPM + lr.otok(i);
      const bool bv = lr.bvalid() && ((tmask >> bt) & 1u);
      o.off[p][i] = bv ? bt * xstride + lr.boff(i) : zero_off;
      o.kst[p][i] = bv ? kTileXBytes : 0;
      o.on[p][i] = (tmask >> ot) & 1u;
      o.moff[p][i] = ot * mstride + lr.osig(i);
    }
  o.np_act = active_tiles<BITS>(tmask);
  return o;
}
// tile_rows<BITS, NP, PH> for one k-tile kt with the chunk's ChunkTiles: fin(p, i, dot0, dot1) as tile_rows gives
// it (the same units, mmas and sums in the same order).
template <int BITS, int NP, typename Fin>
__device__ __forceinline__ void tile_chunk(const RowTile<BITS>& t, const char* xf, const ChunkTiles<BITS, NP>& o, int kt,
                                           Fin&& fin) {
  walk_tile<BITS, NP, (NP > 2 ? 2 : NP)>(
      t, NP == 1 ? 1 : o.np_act, [&](int p, int i) { return xf + o.off[p][i] + kt * o.kst[p][i]; }, fin);
}
// tile_rows_acc<BITS, NP, PH> with the chunk's ChunkTiles. Without a branch per chunk (which kept the compiler from
// interleaving one chunk's mma chain with the next chunk's dequantization): a group value whose row is absent, or
// whose group is past the weights', is computed from whatever its meta slot holds (in bounds: ot < MT, G < 4·KT)
// and replaced by +0 before the add. The chains start at +0 and a sum of two values is -0 only when both are, so
// acc + 0 = acc: the same bits as skipping the add.
template <int BITS, int NP>
__device__ __forceinline__ void tile_chunk_acc(const RowTile<BITS>& t, const char* xf, const ChunkTiles<BITS, NP>& o,
                                               const float2* meta, int kt, int ngroups, const LaneRows<BITS>& lr,
                                               float (&acc)[NP][TcShape<BITS>::NCH][2]) {
  const GroupScale<BITS> gs(t, lr);
  tile_chunk<BITS, NP>(t, xf, o, kt, [&](int p, int i, float dot0, float dot1) {
    const bool ok = o.on[p][i] && kt * 4 + lr.osig(i) < ngroups;
    const float2 mm = meta[o.moff[p][i] + 4 * kt];
    const float v0 = gs.value(t, lr, i, 0, dot0, mm), v1 = gs.value(t, lr, i, 1, dot1, mm);
    acc[p][i][0] = fmaf(1.f, ok ? v0 : 0.f, acc[p][i][0]);
    acc[p][i][1] = fmaf(1.f, ok ? v1 : 0.f, acc[p][i][1]);
  });
}

// The chunk whose output columns hold row τ of an mma tile in lane c (the inverse of LaneRows::otok).
template <int BITS>
__device__ __forceinline__ float acc_of_row(const float (&a)[TcShape<BITS>::NCH][2], int c, int tau, int h) {
  if constexpr (BITS == 4) {
    return ((c >> 1) ^ tau) ? a[1][h] : a[0][h];
  } else {
    const int i = c ^ tau;
    return i == 0 ? a[0][h] : (i == 1 ? a[1][h] : (i == 2 ? a[2][h] : a[3][h]));
  }
}

// The group-value accumulators of NP mma tiles, zeroed.
template <int BITS, int NP>
__device__ __forceinline__ void clear_acc(float (&acc)[NP][TcShape<BITS>::NCH][2]) {
#pragma unroll
  for (int p = 0; p < NP; ++p)
#pragma unroll
    for (int i = 0; i < TcShape<BITS>::NCH; ++i) acc[p][i][0] = acc[p][i][1] = 0.f;
}

// Each row's sum of the chains acc (the quad sum, today's order): store(t, h, v) in lane c = 0 for row t of the
// block's row tiles (t = p·TPM + τ) and output row g + 8·h; then the accumulators are cleared.
template <int BITS, int NP, typename Store>
__device__ __forceinline__ void row_sums(float (&acc)[NP][TcShape<BITS>::NCH][2], int c, Store&& store) {
  using S = TcShape<BITS>;
#pragma unroll
  for (int p = 0; p < NP; ++p) {
#pragma unroll
    for (int tau = 0; tau < S::TPM; ++tau) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float v = quad_sum(acc_of_row<BITS>(acc[p], c, tau, h));
        if (c == 0) store(p * S::TPM + tau, h, v);
      }
    }
  }
  clear_acc<BITS, NP>(acc);
}

// End of a row group: each row's sum over this warp's k-slice into part[t·16 + r] for the block's rows t.
template <int BITS, int NP>
__device__ __forceinline__ void write_partials_rows(float (&acc)[NP][TcShape<BITS>::NCH][2], float* part, int g, int c) {
  row_sums<BITS, NP>(acc, c, [&](int t, int h, float v) { part[t * 16 + g + 8 * h] = v; });
}


// ------------------------------------------------------------------------------------------------ rings
// Pieces of the MoE kernels' cp.async weight rings (ring_rows.cuh).
constexpr int kZeroTileBytes = 1024;  // one k-tile of zeros

// The scales / biases of tile kt of rows (g, g+8) one by one (rows whose scale rows are not 8-byte aligned
// with a multiple of 4 groups, and partial last tiles; groups past `ngroups` read as 0).
template <int BITS>
__device__ __forceinline__ void load_sb_slow(RowTile<BITS>& t, const RowRef (&r)[2], int kt, int ngroups) {
  const int G0 = kt * 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    uint32_t s4[4], b4[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      s4[q] = G0 + q < ngroups ? uint32_t(__ldg(r[h].s + G0 + q)) : 0u;
      b4[q] = G0 + q < ngroups ? uint32_t(__ldg(r[h].b + G0 + q)) : 0u;
    }
    t.s[h] = make_uint2(s4[0] | (s4[1] << 16), s4[2] | (s4[3] << 16));
    t.b[h] = make_uint2(b4[0] | (b4[1] << 16), b4[2] | (b4[3] << 16));
  }
}

}  // namespace lilac::cuda::rows_dev
