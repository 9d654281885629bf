// The group layout ("G4") of the 4-bit dense decode GEMVs: the single-row kernel (gemv_tc.cu: batch 1, the MTP
// head, the LM head) and the multi-row one (rows/gemv_rows.cu) share these pieces, so that a row computed by either
// is bit for bit the other's.
//
// Each mma m16n8k16's 16 k values lie inside one 64-group of the weights: lane c of a quad supplies 4 of them
// (k = 2c, 2c+1, 2c+8, 2c+9 of the mma) from its 16 nibbles of the group, so a B column holds one input row's hi
// or lo part of the whole k16 and the group's scale applies to a whole output column. A B operand of 8 columns is
// 4 input rows × {hi, lo}; after the group's 4 mmas lane (g, c) holds the group dots of input row c (of the 4)
// with weight rows g and g+8, and a row's value over K is a chain of group values in one lane (no reduction over
// the quad). The old layout (tc_common.cuh, still the MoE kernels') spreads a mma over two groups and fits 2
// input rows per mma; this one does the same arithmetic per row with half the mmas, B loads and group
// epilogues per input row from 4 rows on, and the same count at one row.
//
// The weights are not repacked: each lane loads gemv_tc's 16 bytes per row and 2-group chunk (lanes 0, 1: the
// first group of the chunk, bytes 0..15 / 16..31; lanes 2, 3: the second) and trades 8 of them with lane c ^ 2,
// after which lane c holds bytes 8·π(c) .. 8·π(c) + 7 of both groups (quarter π(c) of each), π swapping 1 and 2.
// The staging writes quarter q of a group where lane π(q) reads it:
//   staged bytes per input row and 64-group G: 256, at G·256; half h (values 8·(2q + h) .. of quarter q) at
//   + 128·h; the hi unit at + 32·π(q), the lo unit at + 32·π(q) + 16; a unit's 4 words are the fp16 pairs
//   (v0, v4), (v1, v5), (v2, v6), (v3, v7) of its 8 values (gemv_tc's 4-bit unit order).
// A k-tile (4 groups) takes 1024 bytes, as in the old layout, and the per-group meta {2^E, Σx} is shared.
#pragma once
#include <cstdint>

#include "cuda/kernels/ptx.cuh"
#include "cuda/kernels/tc_common.cuh"

namespace lilac::cuda::tc {

constexpr int kG4GroupBytes = 256;  // staged bytes per 64-group and input row

// The quarter of a group lane c of a quad holds after the trade (and the staging position of quarter c).
__host__ __device__ constexpr int g4_pi(int c) { return ((c & 1) << 1) | (c >> 1); }
// Byte offset of the hi unit of values 8t .. 8t + 7 in an input row's staged G4 fragments (lo: + 16).
__host__ __device__ inline int g4_unit_off(int t) { return (t >> 3) * kG4GroupBytes + (t & 1) * 128 + g4_pi((t >> 1) & 3) * 32; }
// Byte offset, inside a group's 256 staged bytes, of the B unit lane (g, c) reads for half 0 (half 1: + 128):
// input row g / 2 of the mma's 4, hi (g even) or lo.
__device__ __forceinline__ int g4_lane_off(int lane) { return ((lane & 3) * 2 + ((lane >> 2) & 1)) * 16; }

// Weights of one k-tile for one lane: rows g, g+8; chunks i = 0, 1 (groups 2i, 2i+1): the 16 bytes at byte
// 64i + 16c of the row's k-tile, as gemv_tc loads them; and for rows g, g+8 the raw bf16 scale | bias << 16 of
// group 4·kt + c (a group's pair is fetched from lane q of the quad when it is used: 2 registers instead of 8).
struct G4Tile {
  uint4 w[2][2];
  uint32_t sb[2];
};

// Tile kt of rows (g, g+8); groups past `ngroups` load as zeros (their staged input is zero too).
__device__ __forceinline__ void load_g4_tile(G4Tile& t, const RowRef (&r)[2], int kt, int c, int ngroups) {
  load_tile_words<4>(t.w, r, kt, c, ngroups);
  const int G = kt * 4 + c;
#pragma unroll
  for (int h = 0; h < 2; ++h)
    t.sb[h] = G < ngroups ? uint32_t(__ldg(r[h].s + G)) | (uint32_t(__ldg(r[h].b + G)) << 16) : 0u;
}

// Chunk i's trade: wv[h][q] = the 8 bytes of group 2i + q of row h this lane multiplies (quarter π(c)).
__device__ __forceinline__ void g4_trade(const G4Tile& t, int i, int c, uint2 (&wv)[2][2]) {
  const bool lo = c < 2;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint4 u = t.w[h][i];
    const uint2 f = make_uint2(u.x, u.y), l = make_uint2(u.z, u.w);
    const uint2 snd = lo ? l : f;
    const uint2 rcv = make_uint2(__shfl_xor_sync(0xffffffffu, snd.x, 2), __shfl_xor_sync(0xffffffffu, snd.y, 2));
    wv[h][0] = lo ? f : rcv;
    wv[h][1] = lo ? rcv : l;
  }
}

// The A operands of a group's 4 mmas from this lane's 16 nibbles of rows g (w0) and g+8 (w1).
__device__ __forceinline__ void g4_dequant(uint2 w0, uint2 w1, uint32_t (&A)[4][4]) {
  uint32_t a0[4], a1[4], b0[4], b1[4];
  dq4(w0.x, a0);
  dq4(w1.x, a1);
  dq4(w0.y, b0);
  dq4(w1.y, b1);
  A[0][0] = a0[0], A[0][1] = a1[0], A[0][2] = a0[1], A[0][3] = a1[1];
  A[1][0] = a0[2], A[1][1] = a1[2], A[1][2] = a0[3], A[1][3] = a1[3];
  A[2][0] = b0[0], A[2][1] = b1[0], A[2][2] = b0[1], A[2][3] = b1[1];
  A[3][0] = b0[2], A[3][1] = b1[2], A[3][2] = b0[3], A[3][3] = b1[3];
}

// The group's raw dots Σ (q - 8)·x̃ of this lane's input row with weight rows g (dot0) and g+8 (dot1); xb: the
// lane's B unit of half 0 (half 1 at + 128). The chains: d0 = mma 0 then 2, d1 = mma 1 then 3.
__device__ __forceinline__ void g4_dots(const uint32_t (&A)[4][4], const char* xb, float& dot0, float& dot1) {
  const uint4 x0 = *reinterpret_cast<const uint4*>(xb), x1 = *reinterpret_cast<const uint4*>(xb + 128);
  float d0[4] = {0.f, 0.f, 0.f, 0.f}, d1[4] = {0.f, 0.f, 0.f, 0.f};
  dev::mma_m16n8k16_f16(d0, A[0][0], A[0][1], A[0][2], A[0][3], x0.x, x0.y);
  dev::mma_m16n8k16_f16(d1, A[1][0], A[1][1], A[1][2], A[1][3], x0.z, x0.w);
  dev::mma_m16n8k16_f16(d0, A[2][0], A[2][1], A[2][2], A[2][3], x1.x, x1.y);
  dev::mma_m16n8k16_f16(d1, A[3][0], A[3][1], A[3][2], A[3][3], x1.z, x1.w);
  dot0 = (d0[0] + d0[1]) + (d1[0] + d1[1]);
  dot1 = (d0[2] + d0[3]) + (d1[2] + d1[3]);
}

// Scale s and zc·s + b (zc = 8) of group 4·kt + q for rows g (h = 0) and g+8, from lane q of this lane's quad.
// All 32 lanes must call.
struct G4Scale {
  float s[2], cz[2];
};
__device__ __forceinline__ G4Scale g4_scale(const G4Tile& t, int lane, int q) {
  G4Scale o;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint32_t v = __shfl_sync(0xffffffffu, t.sb[h], (lane & ~3) | q);
    o.s[h] = __uint_as_float(v << 16);
    o.cz[h] = fmaf(TcShape<4>::ZC, o.s[h], __uint_as_float(v & 0xFFFF0000u));
  }
  return o;
}
// A row's group value s·2^E·dot + (zc·s + b)·Σx (gemv_tc's group_value).
__device__ __forceinline__ float g4_value(const G4Scale& sc, int h, float dot, float2 m) {
  return fmaf(sc.s[h] * m.x, dot, sc.cz[h] * m.y);
}
// acc += v where `ok`, without a branch: a chain that starts at +0 is never -0 (a sum is -0 only when both terms
// are), so adding +0 leaves its bits as they are. A fin that branches around its group value splits g4_walk's
// groups into separate basic blocks, so one group's mma chain cannot overlap the next group's dequantization
// (stop 67, scripts/sass.sh); callers compute the value from an in-bounds meta slot whatever `ok` says.
__device__ __forceinline__ void add_where(float& acc, bool ok, float v) { acc += ok ? v : 0.f; }

// One k-tile for the first np_act of NT mma tiles of 4 input rows: for each group q = 0..3 of the tile in order
// and each active tile p, fin(p, q, dot0, dot1, scale) with the raw dots of input row 4p + c of the tile (the
// lane's output row) and the group's scale. xb_of(p, q): the lane's B unit (half 0) of group q of tile p.
template <int NT, typename XbOf, typename Fin>
__device__ __forceinline__ void g4_walk(const G4Tile& t, int lane, int np_act, XbOf&& xb_of, Fin&& fin) {
  const int c = lane & 3;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    uint2 wv[2][2];
    g4_trade(t, i, c, wv);
#pragma unroll
    for (int q2 = 0; q2 < 2; ++q2) {
      const int q = 2 * i + q2;
      uint32_t A[4][4];
      g4_dequant(wv[0][q2], wv[1][q2], A);
      const G4Scale sc = g4_scale(t, lane, q);
#pragma unroll
      for (int p = 0; p < NT; ++p) {
        if (NT == 1 || p < np_act) {
          float dot0, dot1;
          g4_dots(A, xb_of(p, q), dot0, dot1);
          fin(p, q, dot0, dot1, sc);
        }
      }
    }
  }
}

}  // namespace lilac::cuda::tc
