// Decode GEMVs on the tensor cores (the default on sm_80+): dense GEMV, MoE gate/up and MoE down.
//
// Why: the decode step moves ~1.7 GB of 4-bit weights per token. Dequantizing to fp32 and using fp32
// FMAs costs ~4 instructions per weight, which keeps the kernels issue/latency-bound far below the
// memory bandwidth. Here a warp multiplies a 16-row x 256-column weight tile with `mma.sync
// m16n8k16` (fp16 inputs, fp32 accumulation): per thread ~1.3 instructions per weight.
//
// Exactness: nibbles (bytes) become fp16 exactly, centred (q - 8, q - 128). The input x is split per
// 64-column quantization group into x = 2^E (hi + lo), hi and lo fp16 (E from the group's max |x|), so
// hi + lo carries ~22 bits of each value relative to its group's max; products are exact in the
// tensor core and summed in fp32. A group then adds s·2^E·dot + (zc·s + b)·Σx in fp32 (zc = 8 or
// 128, Σx the exact fp32 sum). The result matches the fp32 kernel to ~1e-6 relative.
//
// Tile layout. B is 16 x 8: its 8 columns are 4 group slots x {hi, lo}: the k-tile's 4 groups each go
// to their own pair of accumulator columns, so after the tile thread (g, c) holds, for rows g and g+8,
// the dot products of group c of the tile. A thread's weights per row and k-tile: NCH 16-byte chunks
// (4-bit: 2, 8-bit: 4) at byte offsets i*64 + c*16 of the row's tile (each warp load instruction reads
// whole 32-byte sectors). The k order inside the mma is a permutation of the columns; the staged
// fragments of x follow the same permutation (build_frags), so the dot products are unchanged.
#include <algorithm>
#include <string>

#include "cuda/cuda_common.h"
#include "cuda/kernels/decode.h"
#include "cuda/kernels/gemv_common.cuh"
#include "cuda/kernels/gemv_tc.h"
#include "cuda/kernels/launch.cuh"
#include "cuda/kernels/qdot.cuh"

namespace lilac::cuda {
namespace {

using namespace dev;
constexpr int kThreads = 256, kWarps = 8;
constexpr int kTileCols = 256, kGroup = 64;
// Blocks per SM the register allocation is made for: 4-bit 3 (80 registers), 8-bit 2 (its tiles are
// twice as large; only the small router / shared-expert-gate matrices are 8-bit).
template <int BITS>
constexpr int kMinBlocks = BITS == 4 ? 3 : 2;
constexpr size_t kMaxSmem = 96 * 1024;

// ------------------------------------------------------------------------------------------------ device pieces
template <int BITS>
struct TcShape {
  static constexpr int NCH = BITS == 4 ? 2 : 4;          // 16-byte chunks per thread per row and k-tile
  static constexpr int CPT = 4 * NCH;                    // chunks per row per k-tile
  static constexpr int U = BITS == 4 ? 4 : 2;            // 16-byte fragment units per chunk and parity
  static constexpr int GROUP_BYTES = kGroup * BITS / 8;  // bytes of one group in a row
  static constexpr float ZC = BITS == 4 ? 8.f : 128.f;
  // group slot (0..3) of chunk i of thread c
  __device__ static int slot(int i, int c) { return BITS == 4 ? 2 * i + (c >> 1) : i; }
  // byte offset of chunk i of thread c inside its group
  __device__ static int off_in_group(int c) { return BITS == 4 ? 16 * (c & 1) : 16 * c; }
  // byte address of fragment unit u, parity p of chunk q in the staged x (XOR-swizzled: conflict-free)
  __device__ static int frag_addr(int q, int u, int p) {
    const int swz = BITS == 4 ? (q & 3) : ((q >> 1) & 1);
    return q * (U * 32) + ((((u ^ swz) << 1) | p) << 4);
  }
};

__device__ __forceinline__ uint32_t hsub2_u(uint32_t a, uint32_t b) {
  uint32_t r;
  asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
__device__ __forceinline__ uint32_t hfma2_u(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t r;
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
  return r;
}
__device__ __forceinline__ void mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// One 4-bit word (nibbles n0..n7) → fp16 pairs (n0-8, n4-8), (n1-8, n5-8), (n2-8, n6-8), (n3-8, n7-8).
__device__ __forceinline__ void dq4(uint32_t w, uint32_t (&h)[4]) {
  constexpr uint32_t kMagic = 0x64006400u;   // fp16 1024 in both halves
  constexpr uint32_t kSub = 0x64086408u;     // 1032
  constexpr uint32_t kInv16 = 0x2C002C00u;   // 1/16
  constexpr uint32_t kNeg72 = 0xD480D480u;   // -72
  const uint32_t w8 = w >> 8;
  h[0] = hsub2_u((w & 0x000F000Fu) | kMagic, kSub);
  h[1] = hfma2_u((w & 0x00F000F0u) | kMagic, kInv16, kNeg72);  // (1024 + 16n)/16 - 72
  h[2] = hsub2_u((w8 & 0x000F000Fu) | kMagic, kSub);
  h[3] = hfma2_u((w8 & 0x00F000F0u) | kMagic, kInv16, kNeg72);
}
// One 8-bit word (bytes b0..b3) → fp16 pairs (b0-128, b2-128), (b1-128, b3-128).
__device__ __forceinline__ void dq8(uint32_t w, uint32_t (&h)[2]) {
  constexpr uint32_t kSub = 0x64806480u;  // 1152
  h[0] = hsub2_u(__byte_perm(w, 0x64646464u, 0x4240), kSub);
  h[1] = hsub2_u(__byte_perm(w, 0x64646464u, 0x4341), kSub);
}

// Staged x → fragments: one thread per 8 consecutive values, 8 threads per 64-group (E, Σx by
// shuffles). xs: fp32 t(x) [K]; xf: fragments (4·K bytes); meta: {2^E, Σx} per group.
template <int BITS>
__device__ void build_frags(const float* xs, int K, char* xf, float2* meta) {
  using S = TcShape<BITS>;
  const int n8 = K / 8;
  for (int t0 = 0; t0 < n8; t0 += blockDim.x) {
    const int t = t0 + threadIdx.x;
    const bool ok = t < n8;
    float v[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = ok ? xs[t * 8 + j] : 0.f;
    float m = 0.f, sum = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      m = fmaxf(m, fabsf(v[j]));
      sum += v[j];
    }
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) {
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
      sum += __shfl_xor_sync(0xffffffffu, sum, o);
    }
    int E = 0;
    if (m > 0.f) frexpf(m, &E);
    const float inv = ldexpf(1.f, -E);
    __half hi[8], lo[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float xt = v[j] * inv;
      hi[j] = __float2half_rn(xt);
      lo[j] = __float2half_rn(xt - __half2float(hi[j]));
    }
    if (ok) {
      // 4-bit unit: (0,4),(1,5),(2,6),(3,7); 8-bit unit: (0,2),(1,3),(4,6),(5,7)
      constexpr int P0[4] = {0, 1, 2, 3}, P1[4] = {4, 5, 6, 7};
      constexpr int Q0[4] = {0, 1, 4, 5}, Q1[4] = {2, 3, 6, 7};
      const int q = BITS == 4 ? t / 4 : t / 2, u = BITS == 4 ? t % 4 : t % 2;
#pragma unroll
      for (int p = 0; p < 2; ++p) {
        const __half* src = p == 0 ? hi : lo;
        uint32_t r[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const __half2 h2 = BITS == 4 ? __halves2half2(src[P0[j]], src[P1[j]]) : __halves2half2(src[Q0[j]], src[Q1[j]]);
          r[j] = *reinterpret_cast<const uint32_t*>(&h2);
        }
        *reinterpret_cast<uint4*>(xf + S::frag_addr(q, u, p)) = make_uint4(r[0], r[1], r[2], r[3]);
      }
      if ((t & 7) == 0) meta[t / 8] = make_float2(ldexpf(1.f, E), sum);
    }
  }
}

// Weights of one k-tile for one thread: rows g and g+8, NCH chunks each, plus the scale / bias of
// group (4·kt + c) of both rows (raw bf16 bits).
template <int BITS>
struct TileRegs {
  uint4 w[2][TcShape<BITS>::NCH];
  uint32_t sb[2];  // (scale | bias << 16) for rows g, g+8
};

// Where one row of weights lives: base of the row's packed words, its scales and biases.
struct RowRef {
  const char* q = nullptr;
  const __nv_bfloat16* s = nullptr;
  const __nv_bfloat16* b = nullptr;
};

// Loads the tile `kt` of rows (rg, rg8) for a single-segment K (dense, gate/up). ngroups: groups per row.
template <int BITS>
__device__ __forceinline__ void load_tile(TileRegs<BITS>& t, const RowRef (&r)[2], int kt, int c, int ngroups) {
  using S = TcShape<BITS>;
#pragma unroll
  for (int i = 0; i < S::NCH; ++i) {
    const int G = kt * 4 + S::slot(i, c);
    const bool ok = G < ngroups;
#pragma unroll
    for (int h = 0; h < 2; ++h)
      t.w[h][i] = ok ? ld_stream(reinterpret_cast<const uint4*>(r[h].q + G * S::GROUP_BYTES + S::off_in_group(c)))
                     : make_uint4(0, 0, 0, 0);
  }
  const int G = kt * 4 + c;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (G < ngroups) {
      const uint32_t s = __ldg(reinterpret_cast<const unsigned short*>(r[h].s) + G);
      const uint32_t b = __ldg(reinterpret_cast<const unsigned short*>(r[h].b) + G);
      t.sb[h] = s | (b << 16);
    } else {
      t.sb[h] = 0;
    }
  }
}

__device__ __forceinline__ float bf_lo(uint32_t v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float bf_hi(uint32_t v) { return __uint_as_float(v & 0xFFFF0000u); }

// The tensor-core part of one k-tile: returns the raw group dots (Σ (q - zc)·x̃ over group 4·kt + c)
// of rows g (dot[0]) and g+8 (dot[1]).
template <int BITS>
__device__ __forceinline__ void tile_dots(const TileRegs<BITS>& t, const char* xf, int kt, int lane, int ngroups,
                                          float (&dot)[2]) {
  using S = TcShape<BITS>;
  const int g = lane >> 2, c = lane & 3, p = g & 1;
  float d0[4] = {0.f, 0.f, 0.f, 0.f}, d1[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int i = 0; i < S::NCH; ++i) {
    const int q = kt * S::CPT + i * 4 + c;
    // this lane supplies B column g: x of its own chunk when the chunk's group slot is g / 2 (and the
    // group exists: past the end of K there is nothing staged)
    const bool active = (g >> 1) == S::slot(i, c) && kt * 4 + S::slot(i, c) < ngroups;
#pragma unroll
    for (int u = 0; u < S::U; ++u) {
      uint4 xv = make_uint4(0, 0, 0, 0);
      if (active) xv = *reinterpret_cast<const uint4*>(xf + S::frag_addr(q, u, p));
      if constexpr (BITS == 4) {
        uint32_t ha[4], hb[4];
        dq4(sel4(t.w[0][i], u), ha);
        dq4(sel4(t.w[1][i], u), hb);
        mma16816(d0, ha[0], hb[0], ha[1], hb[1], xv.x, xv.y);
        mma16816(d1, ha[2], hb[2], ha[3], hb[3], xv.z, xv.w);
      } else {
        uint32_t ha[2], hb[2];
        dq8(sel4(t.w[0][i], 2 * u), ha);
        dq8(sel4(t.w[1][i], 2 * u), hb);
        mma16816(d0, ha[0], hb[0], ha[1], hb[1], xv.x, xv.y);
        dq8(sel4(t.w[0][i], 2 * u + 1), ha);
        dq8(sel4(t.w[1][i], 2 * u + 1), hb);
        mma16816(d1, ha[0], hb[0], ha[1], hb[1], xv.z, xv.w);
      }
    }
  }
  dot[0] = (d0[0] + d0[1]) + (d1[0] + d1[1]);
  dot[1] = (d0[2] + d0[3]) + (d1[2] + d1[3]);
}

// s·2^E·dot + (zc·s + b)·Σx for one row's group.
template <int BITS>
__device__ __forceinline__ float group_value(float dot, uint32_t sb, float2 m) {
  const float s = bf_lo(sb), b = bf_hi(sb);
  return fmaf(s * m.x, dot, fmaf(TcShape<BITS>::ZC, s, b) * m.y);
}

__device__ __forceinline__ RowRef row_ref(const QMatrixDev& W, int64_t r) {
  RowRef ref;
  ref.q = reinterpret_cast<const char*>(W.qweight) + r * (W.cols * W.bits / 8);
  ref.s = W.scales + r * W.groups_per_row();
  ref.b = W.biases + r * W.groups_per_row();
  return ref;
}

// Sum over the 4 lanes of a row (c = 0..3): lane c == 0 gets the total.
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  v += __shfl_xor_sync(0xffffffffu, v, 2);
  return v;
}

// Shared memory: xs fp32 [K] | xf [4K bytes] | meta float2 [K/64].
size_t tc_smem(int64_t K) { return size_t(K) * 4 + size_t(K) * 4 + size_t(K / kGroup) * 8; }

// ------------------------------------------------------------------------------------------------ dense GEMV
// Block = 8 warps = RB row blocks (16 rows each) x KS k-slices (RB·KS = 8); a block loops over groups
// of RB row blocks (grid-stride); within a group, warp (rb, ks) takes k-tiles ks, ks + KS, ... and the
// KS partial sums of each row are added in a fixed order (deterministic). The next tile's weights are
// loaded before the current tile's math; the first tile is loaded before the PDL wait.
template <int BITS, int KS>
__global__ void __launch_bounds__(kThreads, kMinBlocks<BITS>) gemv_tc_kernel(GemvArgs a) {
  using S = TcShape<BITS>;
  constexpr int RB = kWarps / KS;
  extern __shared__ float4 smem4[];
  __shared__ float red[32];
  __shared__ float part[2][kWarps][16];
  const int K = int(a.W.cols);
  float* xs = reinterpret_cast<float*>(smem4);
  char* xf = reinterpret_cast<char*>(xs + K);
  float2* meta = reinterpret_cast<float2*>(xf + 4 * K);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const int rbw = warp / KS, ks = warp % KS;
  const int ngroups_k = K / kGroup, KT = (K + kTileCols - 1) / kTileCols;
  const int iters = (KT + KS - 1) / KS;
  const int64_t rows = a.W.rows, nrb = (rows + 15) / 16, ngrp = (nrb + RB - 1) / RB;

  auto refs_for = [&](int64_t grp, RowRef (&r)[2]) {
    const int64_t r0 = (grp * RB + rbw) * 16 + g;
    r[0] = row_ref(a.W, min(r0, rows - 1));
    r[1] = row_ref(a.W, min(r0 + 8, rows - 1));
  };
  TileRegs<BITS> cur, nxt;
  int64_t grp = blockIdx.x;
  int j = 0;
  RowRef ref[2];
  if (grp < ngrp) {
    refs_for(grp, ref);
    if (ks < KT) load_tile<BITS>(cur, ref, ks, c, ngroups_k);
  }
  pdl_wait();
  pdl_trigger();
  stage_input(a, xs, K, red);
  build_frags<BITS>(xs, K, xf, meta);
  __syncthreads();

  float acc[2] = {0.f, 0.f};
  int par = 0;
  while (grp < ngrp) {
    // next step of this warp
    int64_t ngp = grp;
    int nj = j + 1;
    if (nj == iters) {
      nj = 0;
      ngp += gridDim.x;
    }
    const int kt = ks + j * KS, nkt = ks + nj * KS;
    RowRef nref[2] = {ref[0], ref[1]};
    if (ngp != grp && ngp < ngrp) refs_for(ngp, nref);
    if (ngp < ngrp && nkt < KT) load_tile<BITS>(nxt, nref, nkt, c, ngroups_k);
    if (kt < KT) {
      float dot[2];
      tile_dots<BITS>(cur, xf, kt, lane, ngroups_k, dot);
      const int G = kt * 4 + c;
      if (G < ngroups_k) {
        const float2 m = meta[G];
        acc[0] += group_value<BITS>(dot[0], cur.sb[0], m);
        acc[1] += group_value<BITS>(dot[1], cur.sb[1], m);
      }
    }
    if (nj == 0) {  // end of the group: combine the k-slices, epilogue
      const float v0 = quad_sum(acc[0]), v1 = quad_sum(acc[1]);
      if (c == 0) {
        part[par][warp][g] = v0;
        part[par][warp][g + 8] = v1;
      }
      acc[0] = acc[1] = 0.f;
      __syncthreads();
      if (threadIdx.x < RB * 16) {
        const int rb = threadIdx.x / 16, rr = threadIdx.x % 16;
        const int64_t r = (grp * RB + rb) * 16 + rr;
        if (r < rows) {
          float v = 0.f;
#pragma unroll
          for (int s = 0; s < KS; ++s) v += part[par][rb * KS + s][rr];
          gemv_store_row(a, r, v);
        }
      }
      par ^= 1;
    }
    grp = ngp;
    j = nj;
    ref[0] = nref[0];
    ref[1] = nref[1];
    cur = nxt;
  }
}

// ------------------------------------------------------------------------------------------------ MoE gate/up
// Routing (warp 0), RMSNorm of x, then per group (slot e in 0..k: the k routed experts and the shared
// one; 16 rows j): row block 0 = gate rows, row block 1 = up rows, 4 k-slices each; epilogue
// act[e·I + j] = silu(gate)·up.
template <int BITS>
__global__ void __launch_bounds__(kThreads, kMinBlocks<BITS>)
    moe_gate_up_tc_kernel(MoEDecodeWeights w, const float* logits, const float* x, const float* norm_w, float eps,
                          int32_t* sel_ids, float* sel_w, float* act) {
  constexpr int KS = 4;
  extern __shared__ float4 smem4[];
  __shared__ float red[32];
  __shared__ int s_ids[32];
  __shared__ float s_w[33];
  __shared__ float part[2][kWarps][16];
  const int K = int(w.gate.first.cols);
  float* xs = reinterpret_cast<float*>(smem4);
  char* xf = reinterpret_cast<char*>(xs + K);
  float2* meta = reinterpret_cast<float2*>(xf + 4 * K);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const int rbw = warp / KS, ks = warp % KS;  // rbw 0: gate, 1: up
  const int ngroups_k = K / kGroup, KT = (K + kTileCols - 1) / kTileCols;
  const int iters = (KT + KS - 1) / KS;
  const int I = int(w.gate.first.rows), Is = int(w.shared_gate.rows);
  const int nbI = (I + 15) / 16, nbS = (Is + 15) / 16;
  const int64_t ngrp = int64_t(w.top_k) * nbI + nbS;

  pdl_wait();
  pdl_trigger();
  GemvArgs sa;
  sa.x = x;
  sa.pro = Prologue::RmsNorm;
  sa.norm_w = norm_w;
  sa.eps = eps;
  if (warp == 0) route_warp(logits, w.E, w.top_k, w.renormalise, s_ids, s_w, sel_ids, sel_w);
  stage_input(sa, xs, K, red);  // ends with a barrier: s_ids visible
  build_frags<BITS>(xs, K, xf, meta);
  __syncthreads();

  // group → (slot, first row j0, rows of this slot's matrices)
  auto refs_for = [&](int64_t grp, RowRef (&r)[2], int& slot, int& j0, int& nrows) {
    QMatrixDev M;
    if (grp < int64_t(w.top_k) * nbI) {
      slot = int(grp / nbI);
      j0 = int(grp % nbI) * 16;
      M = rbw == 0 ? w.gate.expert(s_ids[slot]) : w.up.expert(s_ids[slot]);
      nrows = I;
    } else {
      slot = w.top_k;
      j0 = int(grp - int64_t(w.top_k) * nbI) * 16;
      M = rbw == 0 ? w.shared_gate : w.shared_up;
      nrows = Is;
    }
    r[0] = row_ref(M, min(j0 + g, nrows - 1));
    r[1] = row_ref(M, min(j0 + g + 8, nrows - 1));
  };
  TileRegs<BITS> cur, nxt;
  int64_t grp = blockIdx.x;
  int j = 0, slot = 0, j0 = 0, nrows = 0;
  RowRef ref[2];
  if (grp < ngrp) {
    refs_for(grp, ref, slot, j0, nrows);
    if (ks < KT) load_tile<BITS>(cur, ref, ks, c, ngroups_k);
  }
  float acc[2] = {0.f, 0.f};
  int par = 0;
  while (grp < ngrp) {
    int64_t ngp = grp;
    int nj = j + 1;
    if (nj == iters) {
      nj = 0;
      ngp += gridDim.x;
    }
    const int kt = ks + j * KS, nkt = ks + nj * KS;
    RowRef nref[2] = {ref[0], ref[1]};
    int nslot = slot, nj0 = j0, nnrows = nrows;
    if (ngp != grp && ngp < ngrp) refs_for(ngp, nref, nslot, nj0, nnrows);
    if (ngp < ngrp && nkt < KT) load_tile<BITS>(nxt, nref, nkt, c, ngroups_k);
    if (kt < KT) {
      float dot[2];
      tile_dots<BITS>(cur, xf, kt, lane, ngroups_k, dot);
      const int G = kt * 4 + c;
      if (G < ngroups_k) {
        const float2 m = meta[G];
        acc[0] += group_value<BITS>(dot[0], cur.sb[0], m);
        acc[1] += group_value<BITS>(dot[1], cur.sb[1], m);
      }
    }
    if (nj == 0) {
      const float v0 = quad_sum(acc[0]), v1 = quad_sum(acc[1]);
      if (c == 0) {
        part[par][warp][g] = v0;
        part[par][warp][g + 8] = v1;
      }
      acc[0] = acc[1] = 0.f;
      __syncthreads();
      if (threadIdx.x < 16) {
        const int rr = threadIdx.x;
        if (j0 + rr < nrows) {
          float gv = 0.f, uv = 0.f;
#pragma unroll
          for (int s = 0; s < KS; ++s) {
            gv += part[par][s][rr];
            uv += part[par][KS + s][rr];
          }
          act[int64_t(slot) * I + j0 + rr] = silu_f(gv) * uv;
        }
      }
      par ^= 1;
    }
    grp = ngp;
    j = nj;
    ref[0] = nref[0];
    ref[1] = nref[1];
    slot = nslot;
    j0 = nj0;
    nrows = nnrows;
    cur = nxt;
  }
}

// ------------------------------------------------------------------------------------------------ MoE down
// y[r] += Σ_e sel_w[e] · down_e[r] · act_e over the k routed experts and the shared one, as one GEMV
// over the concatenated input act [k·I + Is]: each 64-group belongs to one segment (expert), whose
// matrix, row stride and combine weight are looked up per group. 8 warps = 8 k-slices of one row block.
struct DownSeg {
  const char* q;
  const __nv_bfloat16* s;
  const __nv_bfloat16* b;
  int row_bytes, gpr;
  float wt;
};

template <int BITS>
__device__ __forceinline__ void load_tile_down(TileRegs<BITS>& t, const DownSeg* seg, int gI, int k, int64_t rg,
                                               int64_t rg8, int kt, int c, int ngroups) {
  using S = TcShape<BITS>;
#pragma unroll
  for (int i = 0; i < S::NCH; ++i) {
    const int G = kt * 4 + S::slot(i, c);
    const bool ok = G < ngroups;
    const int e = G < k * gI ? G / gI : k;
    const int Gl = G - e * gI;
    const DownSeg& sg = seg[ok ? e : 0];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t r = h == 0 ? rg : rg8;
      t.w[h][i] = ok ? ld_stream(reinterpret_cast<const uint4*>(sg.q + r * sg.row_bytes + Gl * S::GROUP_BYTES +
                                                                 S::off_in_group(c)))
                     : make_uint4(0, 0, 0, 0);
    }
  }
  const int G = kt * 4 + c;
  const int e = G < k * gI ? G / gI : k;
  const int Gl = G - e * gI;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t r = h == 0 ? rg : rg8;
    if (G < ngroups) {
      const DownSeg& sg = seg[e];
      const uint32_t s = __ldg(reinterpret_cast<const unsigned short*>(sg.s) + r * sg.gpr + Gl);
      const uint32_t b = __ldg(reinterpret_cast<const unsigned short*>(sg.b) + r * sg.gpr + Gl);
      t.sb[h] = s | (b << 16);
    } else {
      t.sb[h] = 0;
    }
  }
}

template <int BITS>
__global__ void __launch_bounds__(kThreads, kMinBlocks<BITS>)
    moe_down_tc_kernel(MoEDecodeWeights w, const int32_t* sel_ids, const float* sel_w, const float* act, float* y) {
  constexpr int KS = kWarps;
  extern __shared__ float4 smem4[];
  __shared__ float red[32];
  __shared__ DownSeg seg[33];
  __shared__ float part[2][kWarps][16];
  const int I = int(w.down.first.cols), Is = int(w.shared_down.cols), k = w.top_k;
  const int K = k * I + Is;
  float* xs = reinterpret_cast<float*>(smem4);
  char* xf = reinterpret_cast<char*>(xs + K);
  float2* meta = reinterpret_cast<float2*>(xf + 4 * K);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const int ks = warp;
  const int ngroups_k = K / kGroup, gI = I / kGroup, KT = (K + kTileCols - 1) / kTileCols;
  const int iters = (KT + KS - 1) / KS;
  const int64_t rows = w.down.first.rows, nrb = (rows + 15) / 16;

  pdl_wait();
  pdl_trigger();
  if (threadIdx.x <= k) {
    const int t = threadIdx.x;
    const QMatrixDev M = t < k ? w.down.expert(sel_ids[t]) : w.shared_down;
    DownSeg sg;
    sg.q = reinterpret_cast<const char*>(M.qweight);
    sg.s = M.scales;
    sg.b = M.biases;
    sg.row_bytes = int(M.cols * M.bits / 8);
    sg.gpr = int(M.groups_per_row());
    sg.wt = sel_w[t];
    seg[t] = sg;
  }
  GemvArgs sa;
  sa.x = act;
  stage_input(sa, xs, K, red);  // barrier: seg visible
  (void)red;
  build_frags<BITS>(xs, K, xf, meta);
  __syncthreads();

  TileRegs<BITS> cur, nxt;
  int64_t grp = blockIdx.x;
  int j = 0;
  auto rg_of = [&](int64_t gp) { return min(gp * 16 + g, rows - 1); };
  auto rg8_of = [&](int64_t gp) { return min(gp * 16 + g + 8, rows - 1); };
  if (grp < nrb && ks < KT) load_tile_down<BITS>(cur, seg, gI, k, rg_of(grp), rg8_of(grp), ks, c, ngroups_k);
  float acc[2] = {0.f, 0.f};
  int par = 0;
  while (grp < nrb) {
    int64_t ngp = grp;
    int nj = j + 1;
    if (nj == iters) {
      nj = 0;
      ngp += gridDim.x;
    }
    const int kt = ks + j * KS, nkt = ks + nj * KS;
    if (ngp < nrb && nkt < KT) load_tile_down<BITS>(nxt, seg, gI, k, rg_of(ngp), rg8_of(ngp), nkt, c, ngroups_k);
    if (kt < KT) {
      float dot[2];
      tile_dots<BITS>(cur, xf, kt, lane, ngroups_k, dot);
      const int G = kt * 4 + c;
      if (G < ngroups_k) {
        const float2 m = meta[G];
        const float wt = seg[G < k * gI ? G / gI : k].wt;
        acc[0] += wt * group_value<BITS>(dot[0], cur.sb[0], m);
        acc[1] += wt * group_value<BITS>(dot[1], cur.sb[1], m);
      }
    }
    if (nj == 0) {
      const float v0 = quad_sum(acc[0]), v1 = quad_sum(acc[1]);
      if (c == 0) {
        part[par][warp][g] = v0;
        part[par][warp][g + 8] = v1;
      }
      acc[0] = acc[1] = 0.f;
      __syncthreads();
      if (threadIdx.x < 16) {
        const int64_t r = grp * 16 + threadIdx.x;
        if (r < rows) {
          float v = 0.f;
#pragma unroll
          for (int s = 0; s < KS; ++s) v += part[par][s][threadIdx.x];
          y[r] += v;
        }
      }
      par ^= 1;
    }
    grp = ngp;
    j = nj;
    cur = nxt;
  }
}

// ------------------------------------------------------------------------------------------------ host side
int num_sms_tc() {
  static int n = [] {
    int dev = 0, v = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev);
    return v > 0 ? v : 1;
  }();
  return n;
}

// Blocks resident per SM for `kernel` at `smem` bytes (also lifts the 48 KB dynamic shared memory cap).
template <typename Kern>
int resident_blocks(Kern kernel, size_t smem) {
  if (smem > 48 * 1024) LILAC_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  int occ = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kernel, kThreads, smem) != cudaSuccess || occ < 1) {
    cudaGetLastError();
    occ = 1;
  }
  return occ;
}

int grid_of(int64_t groups, int occ) {
  return int(std::max<int64_t>(1, std::min<int64_t>(groups, int64_t(num_sms_tc()) * occ)));
}

bool shape_ok(const QMatrixDev& W) {
  return (W.bits == 4 || W.bits == 8) && W.group_size == kGroup && W.cols % kGroup == 0 && W.cols > 0 &&
         tc_smem(W.cols) <= kMaxSmem;
}

}  // namespace

bool gemv_tc_supported(const QMatrixDev& W) { return shape_ok(W); }

void gemv_tc(const GemvArgs& a, cudaStream_t stream) {
  const int64_t K = a.W.cols, KT = (K + kTileCols - 1) / kTileCols, nrb = (a.W.rows + 15) / 16;
  // k-slices per row block: enough warps in flight (~3 blocks of 8 warps per SM) for small matrices.
  const int64_t target = int64_t(num_sms_tc()) * kMinBlocks<4> * kWarps;
  int KS = 1;
  while (KS < kWarps && KS < KT && nrb * KS < target) KS *= 2;
  const size_t smem = tc_smem(K);
  auto go = [&](auto kernel) {
    const int RB = kWarps / KS;
    const int64_t groups = (nrb + RB - 1) / RB;
    launch_pdl(kernel, dim3(grid_of(groups, resident_blocks(kernel, smem))), dim3(kThreads), smem, stream, a);
  };
  if (a.W.bits == 4) {
    switch (KS) {
      case 1: go(gemv_tc_kernel<4, 1>); break;
      case 2: go(gemv_tc_kernel<4, 2>); break;
      case 4: go(gemv_tc_kernel<4, 4>); break;
      default: go(gemv_tc_kernel<4, 8>); break;
    }
  } else {
    switch (KS) {
      case 1: go(gemv_tc_kernel<8, 1>); break;
      case 2: go(gemv_tc_kernel<8, 2>); break;
      case 4: go(gemv_tc_kernel<8, 4>); break;
      default: go(gemv_tc_kernel<8, 8>); break;
    }
  }
}

bool moe_tc_supported(const MoEDecodeWeights& w) {
  const int64_t n_act = w.top_k * w.down.first.cols + w.shared_down.cols;
  return shape_ok(w.gate.first) && shape_ok(w.up.first) && shape_ok(w.shared_gate) && shape_ok(w.shared_up) &&
         shape_ok(w.down.first) && shape_ok(w.shared_down) && n_act % kGroup == 0 && tc_smem(n_act) <= kMaxSmem &&
         w.gate.first.bits == w.down.first.bits;
}

void moe_gate_up_tc(const MoEDecodeWeights& w, const float* logits, const float* x, const float* norm_w, float eps,
                    int32_t* sel_ids, float* sel_w, float* act, cudaStream_t stream) {
  const int64_t K = w.gate.first.cols;
  const size_t smem = tc_smem(K);
  const int64_t groups = int64_t(w.top_k) * ((w.gate.first.rows + 15) / 16) + (w.shared_gate.rows + 15) / 16;
  auto go = [&](auto kernel) {
    launch_pdl(kernel, dim3(grid_of(groups, resident_blocks(kernel, smem))), dim3(kThreads), smem, stream, w, logits,
               x, norm_w, eps, sel_ids, sel_w, act);
  };
  if (w.gate.first.bits == 4)
    go(moe_gate_up_tc_kernel<4>);
  else
    go(moe_gate_up_tc_kernel<8>);
}

void moe_down_tc(const MoEDecodeWeights& w, const int32_t* sel_ids, const float* sel_w, const float* act, float* y,
                 cudaStream_t stream) {
  const int64_t K = w.top_k * w.down.first.cols + w.shared_down.cols;
  const size_t smem = tc_smem(K);
  const int64_t groups = (w.down.first.rows + 15) / 16;
  auto go = [&](auto kernel) {
    launch_pdl(kernel, dim3(grid_of(groups, resident_blocks(kernel, smem))), dim3(kThreads), smem, stream, w, sel_ids,
               sel_w, act, y);
  };
  if (w.down.first.bits == 4)
    go(moe_down_tc_kernel<4>);
  else
    go(moe_down_tc_kernel<8>);
}

}  // namespace lilac::cuda
