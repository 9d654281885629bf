// The 4-bit dense rows GEMV on Hopper's warpgroup MMA (rows_mm.h: gemv_rows, RowsGemvKernel::Wgmma; issue 11).
//
// Why. The tiles and slice kernels (gemv_rows.cu) give each mma.sync 4 input rows (8 B columns: 4 rows × {hi, lo}):
// at 16-64 rows a weight tile costs 4-16 mmas per group, each with its B fragment loaded from shared memory by every
// lane, and the tiles kernel dequantizes the whole matrix again for every 8 rows. Here one warpgroup multiplies 64
// weight rows with the 32 B columns of 16 input rows per wgmma: the weights are the A operand in registers (the group
// layout's own fragments, tc_g4.cuh), B comes from shared memory without a load instruction per lane, and a weight
// tile is dequantized once per 16 rows.
//
// Same bits. A row's value is today's: per k-slice s of gemv_tc's rule, a chain from 0 over the slice's k-tiles
// s, s + KS, ... and their 4 groups in order, acc += s·2^E·dot + (zc·s + b)·Σx with the group's dot from the two
// chains of two k16 steps (mma 0 then 2, 1 then 3) that g4_dots runs; then v = 0, v += the slices' chains in slice
// order, y = v or y + v. wgmma's k16 steps accumulate bit for bit as mma.sync m16n8k16's (bench/probe_wgmma_exact.cu:
// 67 M accumulators, 0 differ; a chain's first step with scale-d 0 differs from mma.sync's + 0 at most in the sign of
// an exact zero, which every chain here adds to +0 first), and the accumulator of column 8j + 2c (+1) in lane (g, c)
// is the mma's, so thread (warp, g, c) holds exactly the dots lane (g, c) of gemv_tc's warp holds for input row
// 4j + c and runs the same chains on them. Tested by memcmp against the tiles kernel (test_rows_gemv.cpp).
//
// Block: one warpgroup, a 64-row weight tile T at a time (grid-strided, blockIdx.x) for 16 input rows (blockIdx.z).
// A step = one k-tile of T: its weights (64 rows × 128 bytes, scales and biases), the 16 rows' B tiles of its 4 groups
// (stage()'s frag4w layout, copied into the 128-byte swizzle) and meta go through a 2-stage cp.async ring, the next
// step's requested as a step begins. Per group: A dequantized from the ring (g4_trade / g4_dequant), 4 wgmmas (two
// chains) into one of two accumulator sets, so group q + 1's products run while group q's values are added.
// 159-165 registers, 69 KB: 3 blocks per SM. No partial sums: a thread keeps its rows' slice chains and their running
// sum to the end of the weight tile. At up to 16 rows (one block row) a tile's slices are split over a 2-block cluster
// (below). Measured (H100, bench/BENCHMARKS.md "Stop 51", "Stop 52"): in_proj 27 against 35 µs at 32 rows and 54
// against 65 at 64, 17.8 against 19.3 at 16 with the split (21.6 without); for q/kv (144 weight tiles) and out_proj
// (32) not faster than the tiles kernel, so Auto takes it for in_proj's shape from 16 rows.
// Above 16 rows with K <= 2048, gemv_rows_wgr_kernel (below) holds the input resident instead: in_proj 27.3 → 24.6 µs
// at 32 rows and 54.0 → 45.3 at 64 (H200, bench/BENCHMARKS.md "Stop 64"); q/kv on it from 16 rows: within noise.
#include <algorithm>
#include <cstdlib>
#include <string>

#include "cuda/cuda_common.h"
#include "cuda/kernels/gemm/gemm.h"
#include "cuda/kernels/launch.cuh"
#include "cuda/kernels/rows/gemv_rows_wg.h"
#include "cuda/kernels/rows/tc_rows.cuh"
#include "cuda/kernels/tc_g4.cuh"
#include "cuda/kernels/wgmma.cuh"

namespace lilac::cuda::rows {
namespace {

using namespace rows_dev;
using ::lilac::cuda::dev::cp_async16_zfill;
using ::lilac::cuda::dev::cp_async_commit;
using ::lilac::cuda::dev::cp_async_wait;
using ::lilac::cuda::dev::fence_proxy_async;
using ::lilac::cuda::dev::pdl_trigger;
using ::lilac::cuda::dev::pdl_wait;
using ::lilac::cuda::dev::smem_u32;
using ::lilac::cuda::dev::wg_arrive;
using ::lilac::cuda::dev::wg_commit;
using ::lilac::cuda::dev::wg_desc;
using ::lilac::cuda::dev::wg_fence_acc;
using ::lilac::cuda::dev::wg_hold;
using ::lilac::cuda::dev::wg_wait;

constexpr int kWgThreads = 128;
constexpr int kWgMinRows = 9;        // forced (RowsGemvKernel::Wgmma): from 9 rows
constexpr int kWgAutoMinRows = 16;   // Auto: where it measured faster (in_proj's shape from 16 rows)
constexpr int kWgSplitMaxRows = 16;  // the cluster split up to 16 rows (one block row; above, enough blocks without it)
constexpr int kWgAutoMinWeightRows = 12288, kWgAutoMaxWeightRows = 16384;
constexpr int N = 32, MT = 16;       // B columns (16 input rows × {hi, lo}) and input rows per block
constexpr int STAGES = 2;

// Shared memory: STAGES stages of a step's copies (a step = one k-tile of one weight tile), each: the 4 groups' B
// tiles (N rows of 128 bytes each, 128-byte swizzle, 1024-byte aligned; rows_mm.h's frag4w), the 64 weight rows'
// k-tile (128 bytes each, as in memory), their scales and biases of the k-tile's 4 groups (8 bytes per row each), the
// MT input rows' meta of those groups.
struct WgSmem {
  static constexpr int TILE = N * 128;
  static constexpr int W = 4 * TILE, SC = W + 64 * 128, BI = SC + 64 * 8, META = BI + 64 * 8;
  static constexpr int STAGE = (META + MT * 4 * 8 + 1023) / 1024 * 1024;
  static constexpr int HANDOVER = STAGES * STAGE;  // the split's handover: up to 4 slices' chains per thread
  static constexpr int alloc = HANDOVER + 4 * 128 * 2 * (N / 8) * 4 + 1024;
  static_assert(TILE % 1024 == 0, "the swizzled B tiles must stay 1024-byte aligned");
};

// The weight tile, slice and k-tile of a block's step: T grid-strided; slices s = 0 .. KS - 1 in order; in a slice
// its k-tiles s, s + KS, ... (j counts them).
struct WgStep {
  int64_t T;
  int s, j;
};

#if LILAC_WGMMA
// A step's weights into a stage: the 64 rows of weight tile T's k-tile kt (rows past the matrix as zeros), their
// scales and biases of the k-tile's 4 groups.
__device__ __forceinline__ void wg_copy_w(const QMatrixDev& W, int64_t T, int kt, unsigned char* sb) {
  using S = WgSmem;
  const int64_t nrows = W.rows, wrow_bytes = W.cols / 2, gpr = W.cols / kGroup;
  for (int i = threadIdx.x; i < 64 * 8; i += kWgThreads) {
    const int lr = i >> 3, u = i & 7;
    const int64_t row = T * 64 + lr;
    const bool on = row < nrows;
    const char* src = reinterpret_cast<const char*>(W.qweight) + (on ? row * wrow_bytes + kt * 128 + 16 * u : 0);
    cp_async16_zfill(sb + S::W + lr * 128 + 16 * u, src, on ? 16 : 0);
  }
  for (int i = threadIdx.x; i < 128; i += kWgThreads) {
    const int lr = i & 63, arr = i >> 6;
    const int64_t row = min(T * 64 + lr, nrows - 1);
    const __nv_bfloat16* src = (arr ? W.biases : W.scales) + row * gpr + kt * 4;
    dev::cp_async8(sb + (arr ? S::BI : S::SC) + lr * 8, src);
  }
}

// A step's input into a stage: the block's MT rows (row0 ..) of k-tile kt, its 4 groups' B rows in the 128-byte swizzle
// and their meta; rows not in pmask as zeros.
__device__ __forceinline__ void wg_copy_x(const GemvRowsArgs& a, int row0, uint32_t pmask, int kt, unsigned char* sb) {
  using S = WgSmem;
  const int KT = tc_kt(a.W.cols);
  const int64_t wstride = int64_t(KT) * kTileXBytes;  // frag4w bytes per input row (as frag4g)
  const char* gf = static_cast<const char*>(a.frag_wg);
  for (int i = threadIdx.x; i < MT * 64; i += kWgThreads) {  // (row r, group q, hi / lo e, 16-byte chunk ch)
    const int r = i >> 6, q = (i >> 4) & 3, e = (i >> 3) & 1, ch = i & 7;
    const bool on = (pmask >> r) & 1u;
    const int n = 2 * r + e;
    cp_async16_zfill(sb + q * S::TILE + (n >> 3) * 1024 + (n & 7) * 128 + ((ch ^ (n & 7)) * 16),
                     on ? gf + int64_t(row0 + r) * wstride + (kt * 4 + q) * kG4GroupBytes + e * 128 + ch * 16 : gf,
                     on ? 16 : 0);
  }
  for (int i = threadIdx.x; i < MT * 2; i += kWgThreads) {
    const int r = i >> 1, u = i & 1;
    const bool on = (pmask >> r) & 1u;
    const float2* src = on ? a.meta + int64_t(row0 + r) * (KT * 4) + kt * 4 + 2 * u : a.meta;
    cp_async16_zfill(sb + S::META + r * 32 + 16 * u, src, on ? 16 : 0);
  }
}
// The split's handover (a [slice][thread][j][h] array of fp32 chains in each rank's shared memory at ho): a rank > 0
// stores its slice sl's chains there (and restarts them from 0); rank 0 adds the n slices that follow its own (slice
// per + i: rank 1 + i / per's slice i % per) to its running sums v in slice order.
template <int NJ>
__device__ __forceinline__ void wg_hand_over(unsigned char* ho, int sl, float (&acc)[NJ][2]) {
  float* p = reinterpret_cast<float*>(ho) + (sl * kWgThreads + int(threadIdx.x)) * 2 * NJ;
#pragma unroll
  for (int j = 0; j < NJ; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h) p[2 * j + h] = acc[j][h], acc[j][h] = 0.f;
}
template <int NJ>
__device__ __forceinline__ void wg_take_over(unsigned char* ho, int n, int per, float (&v)[NJ][2]) {
  for (int i = 0; i < n; ++i) {
    const uint32_t src = dev::cluster_map(smem_u32(ho), 1 + i / per) +
                         uint32_t((i % per) * kWgThreads + int(threadIdx.x)) * 2 * NJ * 4;
    float r[2 * NJ];
#pragma unroll
    for (int u = 0; u < 2 * NJ / 4; ++u) {
      const float4 f = dev::ld_cluster_f4(src + 16 * u);
      r[4 * u] = f.x, r[4 * u + 1] = f.y, r[4 * u + 2] = f.z, r[4 * u + 3] = f.w;
    }
#pragma unroll
    for (int j = 0; j < NJ; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) v[j][h] += r[2 * j + h];
  }
}
// A weight tile's outputs (rows n0, n0 + 8 of the thread's, input rows 4j + c) into y (or added to it); v restarts at 0.
template <int NJ>
__device__ __forceinline__ void wg_store(const GemvRowsArgs& a, int row0, uint32_t pmask, int64_t n0, int64_t ldy, int c,
                                         float (&v)[NJ][2]) {
#pragma unroll
  for (int j = 0; j < NJ; ++j) {
    const int rl = 4 * j + c;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t n = n0 + 8 * h;
      if (((pmask >> rl) & 1u) && n < a.W.rows) {
        float* yp = a.y + (row0 + rl) * ldy + n;
        *yp = a.accumulate ? *yp + v[j][h] : v[j][h];
      }
      v[j][h] = 0.f;
    }
  }
}
// One step's math (one k-tile of a 64-row weight tile) for a warpgroup: the weight rows' k-tile at w (64 rows × 128
// bytes), their scales and biases of the k-tile's 4 groups at sc / bi (8 bytes per row each), the 4 groups' B tiles at
// btiles (WgSmem::TILE apart), input row rl's meta of group q at meta[rl * RS + q * QS] (compile-time strides: the
// loads take constant offsets). Per group q: A dequantized, 4 wgmmas (two chains) into the register set q & 1, so
// group q + 1's products run while group q's values are added to acc. lr0: this thread's first weight row in the
// tile (16 · warp of the warpgroup + g). (The per-row branch stays: without it these kernels spilled at their
// register caps, stop 68.)
template <int NJ, int RS, int QS>
__device__ __forceinline__ void wg_step_math(const unsigned char* w, const unsigned char* sc_b,
                                             const unsigned char* bi_b, uint32_t btiles, const float2* meta, int lr0,
                                             int c, uint32_t pmask, float (&D)[2][2][N / 2], uint32_t (&A)[2][4][4],
                                             G4Scale (&sc)[2], float (&acc)[NJ][2]) {
  using S = WgSmem;
  G4Tile t;
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int i = 0; i < 2; ++i) t.w[h][i] = *reinterpret_cast<const uint4*>(w + (lr0 + 8 * h) * 128 + 64 * i + 16 * c);
  uint2 wv[2][2];
  // group q: its A fragments and scales (parity q & 1), then its 4 wgmmas (two chains) into D[q & 1]
  auto issue = [&](int q) {
    const int half = q & 1;  // the group's half of the traded chunk q / 2
    const int p = q & 1;     // its register set (two groups in flight): the same index, another meaning
    if (half == 0) g4_trade(t, q >> 1, c, wv);
    g4_dequant(wv[0][half], wv[1][half], A[p]);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t s16 = *reinterpret_cast<const unsigned short*>(sc_b + (lr0 + 8 * h) * 8 + 2 * q);
      const uint32_t b16 = *reinterpret_cast<const unsigned short*>(bi_b + (lr0 + 8 * h) * 8 + 2 * q);
      sc[p].s[h] = __uint_as_float(s16 << 16);
      sc[p].cz[h] = fmaf(TcShape<4>::ZC, sc[p].s[h], __uint_as_float(b16 << 16));
    }
    wg_fence_acc<N / 2>(D[p][0]);
    wg_fence_acc<N / 2>(D[p][1]);
    wg_arrive();
    const uint32_t tile = btiles + q * S::TILE;
    dev::wgmma_rs_f16_m64n32k16(D[p][0], A[p][0], wg_desc(tile), 0);
    dev::wgmma_rs_f16_m64n32k16(D[p][1], A[p][1], wg_desc(tile + 32), 0);
    dev::wgmma_rs_f16_m64n32k16(D[p][0], A[p][2], wg_desc(tile + 64), 1);
    dev::wgmma_rs_f16_m64n32k16(D[p][1], A[p][3], wg_desc(tile + 96), 1);
    wg_commit();
  };
  // group q's values into the chains (its wgmmas done)
  auto finish = [&](int q) {
    const int p = q & 1;
    wg_fence_acc<N / 2>(D[p][0]);
    wg_fence_acc<N / 2>(D[p][1]);
    wg_hold(A[p][0]), wg_hold(A[p][1]), wg_hold(A[p][2]), wg_hold(A[p][3]);
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
      if ((pmask >> (4 * j + c)) & 1u) {
        const float2 mm = meta[(4 * j + c) * RS + q * QS];
        const float dot0 = (D[p][0][4 * j] + D[p][0][4 * j + 1]) + (D[p][1][4 * j] + D[p][1][4 * j + 1]);
        const float dot1 = (D[p][0][4 * j + 2] + D[p][0][4 * j + 3]) + (D[p][1][4 * j + 2] + D[p][1][4 * j + 3]);
        acc[j][0] += g4_value(sc[p], 0, dot0, mm);
        acc[j][1] += g4_value(sc[p], 1, dot1, mm);
      }
    }
  };
  issue(0);
  issue(1);
  wg_wait<1>();
  finish(0);
  issue(2);
  wg_wait<1>();
  finish(1);
  issue(3);
  wg_wait<1>();
  finish(2);
  wg_wait<0>();
  finish(3);
}
#endif

// CL > 1: a weight tile's k-slices split over the CL blocks of a cluster (rank r the r-th run of nslices / CL slices);
// ranks 1 .. CL - 1 hand their slices' chains over through distributed shared memory and rank 0 adds them to its own in
// slice order (the same fold, the same bits), so a tile's slices run on CL SMs (in_proj at 16 rows: 193 weight tiles,
// 1.5 per SM without the split). Launched with CL = 2 at up to 16 rows: 4 and 8 ranks measured slower for in_proj
// (34.8 and 49.3 µs at 16 rows against 17.8; each rank's two or one k-tiles do not cover its prologue and barriers).
template <int CL>
__global__ void __launch_bounds__(kWgThreads, 3) gemv_rows_wg_kernel(GemvRowsArgs a, int KS) {
#if LILAC_WGMMA
  constexpr int NJ = N / 8;
  using S = WgSmem;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t raw_u32 = smem_u32(smem_raw);
  unsigned char* smem = smem_raw + (((raw_u32 + 1023u) & ~1023u) - raw_u32);

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
  const int KT = tc_kt(a.W.cols);
  const int64_t nrows = a.W.rows, nwt = (nrows + 63) / 64, ldy = a.ldy > 0 ? a.ldy : nrows;
  const int row0 = int(blockIdx.z) * MT, mrows = min(MT, a.M - row0);

  auto kt_of = [&](const WgStep& st) { return st.s + st.j * KS; };
  // slices past the last k-tile (KS > KT: gemv_tc's rule can give a small K more slices than k-tiles) add 0 to a
  // row's sum in the tiles kernel: skipped here, the same bits
  const int nslices = min(KS, KT);
  // this block's slices [s0, s1) and tiles (T0, T0 + tstride, ...): all of them, or its rank's run (the host takes CL
  // only where it divides nslices, so every rank has slices and meets the cluster barriers of every tile)
  constexpr bool SPLIT = CL > 1;
  const int per = nslices / CL, rank = SPLIT ? int(blockIdx.x % CL) : 0;
  const int s0 = rank * per, s1 = SPLIT ? s0 + per : nslices;
  const int64_t T0 = blockIdx.x / CL, tstride = gridDim.x / CL;
  auto next = [&](WgStep st) {
    if (kt_of(st) + KS < KT) {
      ++st.j;
    } else if (st.s + 1 < s1) {
      ++st.s, st.j = 0;
    } else {
      st.T += tstride, st.s = s0, st.j = 0;
    }
    return st;
  };
  auto copy_w = [&](const WgStep& st, int b) {
    if (st.T < nwt) wg_copy_w(a.W, st.T, kt_of(st), smem + b * S::STAGE);
  };
  uint32_t pmask = 0;  // present rows of the block's MT (set after the PDL wait)
  auto copy_x = [&](const WgStep& st, int b) {
    if (st.T < nwt) wg_copy_x(a, row0, pmask, kt_of(st), smem + b * S::STAGE);
  };

  // prologue: the first STAGES - 1 steps' weights before the PDL wait, their inputs after it (one commit group each)
  WgStep st{T0, s0, 0};
  {
    WgStep p = st;
    for (int k = 0; k < STAGES - 1; ++k, p = next(p)) copy_w(p, k);
  }
  pdl_wait();
  pdl_trigger();
  pmask = present_rows(a.row_slot, row0, mrows);
  WgStep ahead = st;  // the step whose copies are issued next
  for (int k = 0; k < STAGES - 1; ++k, ahead = next(ahead)) {
    copy_x(ahead, k);
    cp_async_commit();
  }

  float acc[NJ][2], v[NJ][2];
#pragma unroll
  for (int j = 0; j < NJ; ++j) acc[j][0] = acc[j][1] = v[j][0] = v[j][1] = 0.f;
  float D[2][2][N / 2];  // [group parity][chain]
  uint32_t A[2][4][4];   // [group parity][k16 step]
  G4Scale sc[2];
  const int lr0 = 16 * warp + g;

  for (int k = 0; st.T < nwt; ++k, st = next(st)) {
    cp_async_wait<STAGES - 2>();
    fence_proxy_async();  // this thread's cp.async writes of step k's B tiles → the async proxy (wgmma reads them)
    __syncthreads();      // step k's stage landed; every warp is done with step k - 1's stage
    {
      const int b = (k + STAGES - 1) % STAGES;
      copy_w(ahead, b);
      copy_x(ahead, b);
      cp_async_commit();
      ahead = next(ahead);
    }
    const unsigned char* sb = smem + (k % STAGES) * S::STAGE;
    wg_step_math<NJ, 4, 1>(sb + S::W, sb + S::SC, sb + S::BI, smem_u32(sb),
                           reinterpret_cast<const float2*>(sb + S::META), lr0, c, pmask, D, A, sc, acc);

    const WgStep ns = next(st);
    if (ns.T != st.T || ns.s != st.s) {  // the slice's chains are complete
      if (SPLIT && rank) {
        wg_hand_over(smem + S::HANDOVER, st.s - s0, acc);
      } else {
#pragma unroll
        for (int j = 0; j < NJ; ++j)
#pragma unroll
          for (int h = 0; h < 2; ++h) v[j][h] += acc[j][h], acc[j][h] = 0.f;
      }
    }
    if (SPLIT && ns.T != st.T) {  // rank 0 adds the other ranks' chains in slice order
      dev::cluster_sync();        // the handovers written
      if (!rank) wg_take_over(smem + S::HANDOVER, nslices - per, per, v);
      dev::cluster_sync();  // rank 0 done reading: the others may write the next tile's chains
    }
    if (ns.T != st.T && !(SPLIT && rank)) wg_store(a, row0, pmask, st.T * 64 + lr0, ldy, c, v);  // the tile is complete
  }
  cp_async_wait<0>();
#endif
}

// The input resident (above 16 rows, K up to kWgrMaxKT k-tiles): a block of NW warpgroups copies its MT input rows'
// B tiles and meta for the whole K into shared memory once, then each warpgroup streams its own weight tiles
// (T = blockIdx.x · NW + wg, + gridDim.x · NW, ...) through its own WS-stage ring of weight k-tiles, WS - 1 steps
// ahead. The per-tile math is gemv_rows_wg_kernel's (wg_step_math), so the same bits. Where that kernel re-reads
// its 16 KB of B tiles from L2 for every step of every weight tile (~100 MB per GDN in_proj at 64 rows, against
// 14 MB of weights) and requests a step's data one step ahead, this one reads the input once per block.
constexpr int kWgrMaxKT = 8;  // K <= 2048: 128 KB of B tiles for 16 rows
constexpr int kWgrWS = 3;     // weight stages per warpgroup
constexpr int kWgrNW = 3;     // warpgroups per block (2: slower at 32 and 64 rows, bench/BENCHMARKS.md "Stop 64")
struct WgrSmem {
  static constexpr int B = 0;                                             // the input's B tiles [k-tile][group]
  static constexpr int META = B + kWgrMaxKT * 4 * WgSmem::TILE;           // [KT · 4 groups][MT rows] float2
  static constexpr int RING = META + MT * kWgrMaxKT * 4 * 8;              // per warpgroup WS stages of:
  static constexpr int W = 0, SC = 64 * 128, BI = SC + 64 * 8, STAGE = BI + 64 * 8;  // weights, scales, biases
  static constexpr int alloc(int nw) { return RING + nw * kWgrWS * STAGE + 1024; }
  static_assert(RING % 1024 == 0 && STAGE % 16 == 0, "alignment");
};

template <int NW>
__global__ void __launch_bounds__(NW * kWgThreads, 1) gemv_rows_wgr_kernel(GemvRowsArgs a, int KS) {
#if LILAC_WGMMA
  constexpr int NJ = N / 8;
  using S = WgSmem;
  using R = WgrSmem;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t raw_u32 = smem_u32(smem_raw);
  unsigned char* smem = smem_raw + (((raw_u32 + 1023u) & ~1023u) - raw_u32);

  const int tid = threadIdx.x, wg = tid >> 7, wtid = tid & 127, warp = wtid >> 5, lane = tid & 31;
  const int g = lane >> 2, c = lane & 3;
  const int KT = tc_kt(a.W.cols);
  const int64_t nrows = a.W.rows, nwt = (nrows + 63) / 64, ldy = a.ldy > 0 ? a.ldy : nrows;
  const int row0 = int(blockIdx.z) * MT, mrows = min(MT, a.M - row0);
  const int nslices = min(KS, KT);
  const int64_t tstride = int64_t(gridDim.x) * NW;
  auto kt_of = [&](const WgStep& st) { return st.s + st.j * KS; };
  auto next = [&](WgStep st) {
    if (kt_of(st) + KS < KT) {
      ++st.j;
    } else if (st.s + 1 < nslices) {
      ++st.s, st.j = 0;
    } else {
      st.T += tstride, st.s = 0, st.j = 0;
    }
    return st;
  };
  unsigned char* ring = smem + R::RING + wg * kWgrWS * R::STAGE;
  // a step's weights into stage b of this warpgroup's ring (wg_copy_w by the warpgroup's 128 threads)
  auto copy_w = [&](const WgStep& st, int b) {
    if (st.T >= nwt) return;
    unsigned char* sb = ring + b * R::STAGE;
    const int kt = kt_of(st);
    const int64_t wrow_bytes = a.W.cols / 2, gpr = a.W.cols / kGroup;
    for (int i = wtid; i < 64 * 8; i += kWgThreads) {
      const int lr = i >> 3, u = i & 7;
      const int64_t row = st.T * 64 + lr;
      const bool on = row < nrows;
      const char* src = reinterpret_cast<const char*>(a.W.qweight) + (on ? row * wrow_bytes + kt * 128 + 16 * u : 0);
      cp_async16_zfill(sb + R::W + lr * 128 + 16 * u, src, on ? 16 : 0);
    }
    {
      const int lr = wtid & 63, arr = wtid >> 6;
      const int64_t row = min(st.T * 64 + lr, nrows - 1);
      const __nv_bfloat16* src = (arr ? a.W.biases : a.W.scales) + row * gpr + kt * 4;
      dev::cp_async8(sb + (arr ? R::BI : R::SC) + lr * 8, src);
    }
  };
  auto wg_bar = [&] { asm volatile("bar.sync %0, %1;" ::"r"(1 + wg), "r"(kWgThreads) : "memory"); };

  // prologue: this warpgroup's first WS - 1 steps' weights (one commit group each) before the PDL wait, then the
  // block's input (every k-tile's B tiles and the meta: one group) after it
  WgStep st{int64_t(blockIdx.x) * NW + wg, 0, 0};
  WgStep ahead = st;
  for (int k = 0; k < kWgrWS - 1; ++k, ahead = next(ahead)) {
    copy_w(ahead, k);
    cp_async_commit();
  }
  pdl_wait();
  pdl_trigger();
  const uint32_t pmask = present_rows(a.row_slot, row0, mrows);
  {
    const int64_t wstride = int64_t(KT) * kTileXBytes;  // frag4w bytes per input row
    const char* gf = static_cast<const char*>(a.frag_wg);
    for (int i = tid; i < KT * MT * 64; i += NW * kWgThreads) {  // (k-tile kt, row r, group q, hi / lo e, chunk ch)
      const int kt = i / (MT * 64), rem = i % (MT * 64);
      const int r = rem >> 6, q = (rem >> 4) & 3, e = (rem >> 3) & 1, ch = rem & 7;
      const bool on = (pmask >> r) & 1u;
      const int n = 2 * r + e;
      cp_async16_zfill(smem + R::B + (kt * 4 + q) * S::TILE + (n >> 3) * 1024 + (n & 7) * 128 + ((ch ^ (n & 7)) * 16),
                       on ? gf + int64_t(row0 + r) * wstride + (kt * 4 + q) * kG4GroupBytes + e * 128 + ch * 16 : gf,
                       on ? 16 : 0);
    }
    // the meta group-major (row r's of group gq at gq · MT + r), so a group's loads in wg_step_math take constant
    // offsets; absent rows' as zeros
    float2* smeta = reinterpret_cast<float2*>(smem + R::META);
    for (int i = tid; i < MT * KT * 4; i += NW * kWgThreads) {
      const int gq = i / MT, r = i % MT;
      if ((pmask >> r) & 1u)
        dev::cp_async8(smeta + i, a.meta + int64_t(row0 + r) * (KT * 4) + gq);
      else
        smeta[i] = make_float2(0.f, 0.f);
    }
    cp_async_commit();
  }
  cp_async_wait<0>();
  fence_proxy_async();  // the B tiles (cp.async writes) → the async proxy (wgmma reads them)
  __syncthreads();

  float acc[NJ][2], v[NJ][2];
#pragma unroll
  for (int j = 0; j < NJ; ++j) acc[j][0] = acc[j][1] = v[j][0] = v[j][1] = 0.f;
  float D[2][2][N / 2];
  uint32_t A[2][4][4];
  G4Scale sc[2];
  const int lr0 = 16 * warp + g;
  const float2* meta = reinterpret_cast<const float2*>(smem + R::META);

  for (int k = 0; st.T < nwt; ++k, st = next(st)) {
    if (k > 0) cp_async_wait<kWgrWS - 2>();  // step k's weights (this thread's copies); k = 0 waited above
    wg_bar();  // step k's stage landed for the warpgroup; its warps are done with step k - 1's stage
    copy_w(ahead, (k + kWgrWS - 1) % kWgrWS);
    cp_async_commit();
    ahead = next(ahead);
    const unsigned char* sb = ring + (k % kWgrWS) * R::STAGE;
    const int kt = kt_of(st);
    wg_step_math<NJ, 1, MT>(sb + R::W, sb + R::SC, sb + R::BI, smem_u32(smem + R::B + kt * 4 * S::TILE),
                            meta + kt * 4 * MT, lr0, c, pmask, D, A, sc, acc);
    const WgStep ns = next(st);
    if (ns.T != st.T || ns.s != st.s) {  // the slice's chains are complete
#pragma unroll
      for (int j = 0; j < NJ; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) v[j][h] += acc[j][h], acc[j][h] = 0.f;
    }
    if (ns.T != st.T) wg_store(a, row0, pmask, st.T * 64 + lr0, ldy, c, v);  // the tile is complete
  }
  cp_async_wait<0>();
#endif
}

// The input streamed, NZ 16-row slices per warpgroup (above 32 rows; LILAC_ROWS_WGS, RowsGemvKernel::WgmmaStream).
// At 64 rows the resident-input kernel dequantizes every weight tile four times (once per 16-row block row) and a
// warp spends as many instructions on the dequantization, the copies and the walk as on the group values
// (bench/GPU_NOTES.md "Stop 68"). Here a warpgroup dequantizes each group of its weight tile once into A and runs
// the 4 wgmmas (two chains) of each of its NZ slices on it, so at 64 rows a tile is dequantized twice. The input does
// not fit in shared memory for 32 rows (256 KB at K = 2048), so the block's NW warpgroups — each on its own weight
// tile, all on the same k-tile at a time — share a ring of the block's input steps (the NZ slices' B tiles and meta
// of one k-tile), and every warpgroup's weights stream through the same ring. Per group: A dequantized (the previous
// group's wgmmas done), the NZ slices' wgmmas issued into their own accumulators, slice z's values added once its
// wgmmas are done while slice z + 1's run. The per-row arithmetic and its order are wg_step_math's: the same bits.
constexpr int kWgsNW = 3;      // warpgroups per block
constexpr int kWgsNZ = 2;      // 16-row slices per warpgroup (32 input rows per block)
constexpr int kWgsStages = 3;  // ring depth (steps)
constexpr int kWgsMinRows = 33;      // forced (RowsGemvKernel::WgmmaStream): from here
constexpr int kWgsAutoMinRows = 49;  // Auto: from here, where a block's second slice is full (at 33-48 rows it would
                                     // cost what 64 rows cost, the resident kernel three quarters of it)
constexpr int kWgsAutoMinWeightRows = 8192;  // from kWgsAutoMinRows q/kv too
struct WgsSmem {
  static constexpr int B = 0;                                      // [slice z][group q] B tiles (WgSmem::TILE each)
  static constexpr int META = B + kWgsNZ * 4 * WgSmem::TILE;       // [group q][NZ · MT rows] float2
  static constexpr int W = META + 4 * kWgsNZ * MT * 8;             // per warpgroup: its weight tile's k-tile:
  static constexpr int WW = 0, WSC = 64 * 128, WBI = WSC + 64 * 8, WSTAGE = WBI + 64 * 8;  // weights, scales, biases
  static constexpr int STAGE = (W + kWgsNW * WSTAGE + 1023) / 1024 * 1024;
  static constexpr int alloc = kWgsStages * STAGE + 1024;
  static_assert(WgSmem::TILE % 1024 == 0 && W % 16 == 0, "alignment");
};

#if LILAC_WGMMA
// One step's math of a warpgroup with NZ slices: per group q, A dequantized once, then the 4 wgmmas of every slice
// into D[z], then each slice's values added (meta of row rl of slice z, group q at meta[q · NZ · MT + z · MT + rl]) as
// soon as its wgmmas are done. Every slice is issued, rows or not (an empty one's B tiles are zeros): a wgmma issued
// under a run-time condition made ptxas serialize them all.
template <int NZ>
__device__ __forceinline__ void wgs_step_math(const unsigned char* w, const unsigned char* sc_b,
                                              const unsigned char* bi_b, uint32_t btiles, const float2* meta, int lr0,
                                              int c, uint32_t pmask, float (&D)[NZ][2][N / 2],
                                              uint32_t (&A)[4][4], float (&acc)[NZ][N / 8][2]) {
  using S = WgSmem;
  constexpr int NJ = N / 8;
  static_assert(NZ == 2, "the waits below are written for two slices");
  G4Tile t;
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int i = 0; i < 2; ++i) t.w[h][i] = *reinterpret_cast<const uint4*>(w + (lr0 + 8 * h) * 128 + 64 * i + 16 * c);
  uint2 wv[2][2];
  auto finish = [&](int q, int z, const G4Scale& sc) {
    wg_fence_acc<N / 2>(D[z][0]);
    wg_fence_acc<N / 2>(D[z][1]);
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
      const int rl = 4 * j + c;
      if ((pmask >> (z * MT + rl)) & 1u) {
        const float2 mm = meta[q * NZ * MT + z * MT + rl];
        const float dot0 = (D[z][0][4 * j] + D[z][0][4 * j + 1]) + (D[z][1][4 * j] + D[z][1][4 * j + 1]);
        const float dot1 = (D[z][0][4 * j + 2] + D[z][0][4 * j + 3]) + (D[z][1][4 * j + 2] + D[z][1][4 * j + 3]);
        acc[z][j][0] += g4_value(sc, 0, dot0, mm);
        acc[z][j][1] += g4_value(sc, 1, dot1, mm);
      }
    }
  };
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    if ((q & 1) == 0) g4_trade(t, q >> 1, c, wv);
    g4_dequant(wv[0][q & 1], wv[1][q & 1], A);  // the previous group's wgmmas are done: A is free
    G4Scale sc;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t s16 = *reinterpret_cast<const unsigned short*>(sc_b + (lr0 + 8 * h) * 8 + 2 * q);
      const uint32_t b16 = *reinterpret_cast<const unsigned short*>(bi_b + (lr0 + 8 * h) * 8 + 2 * q);
      sc.s[h] = __uint_as_float(s16 << 16);
      sc.cz[h] = fmaf(TcShape<4>::ZC, sc.s[h], __uint_as_float(b16 << 16));
    }
#pragma unroll
    for (int z = 0; z < NZ; ++z) {
      wg_fence_acc<N / 2>(D[z][0]);
      wg_fence_acc<N / 2>(D[z][1]);
      wg_arrive();
      const uint32_t tile = btiles + (z * 4 + q) * S::TILE;
      dev::wgmma_rs_f16_m64n32k16(D[z][0], A[0], wg_desc(tile), 0);
      dev::wgmma_rs_f16_m64n32k16(D[z][1], A[1], wg_desc(tile + 32), 0);
      dev::wgmma_rs_f16_m64n32k16(D[z][0], A[2], wg_desc(tile + 64), 1);
      dev::wgmma_rs_f16_m64n32k16(D[z][1], A[3], wg_desc(tile + 96), 1);
      wg_commit();
    }
    wg_wait<1>();
    finish(q, 0, sc);
    wg_wait<0>();
    wg_hold(A[0]), wg_hold(A[1]), wg_hold(A[2]), wg_hold(A[3]);
    finish(q, 1, sc);
  }
}
#endif

template <int NZ>
__global__ void __launch_bounds__(kWgsNW * kWgThreads, 1) gemv_rows_wgs_kernel(GemvRowsArgs a, int KS) {
#if LILAC_WGMMA
  constexpr int NJ = N / 8, NW = kWgsNW, STAGES = kWgsStages, ROWS = NZ * MT;
  static_assert(ROWS <= 32, "the present rows are one 32-bit mask");
  using S = WgSmem;
  using X = WgsSmem;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t raw_u32 = smem_u32(smem_raw);
  unsigned char* smem = smem_raw + (((raw_u32 + 1023u) & ~1023u) - raw_u32);

  const int tid = threadIdx.x, wg = tid >> 7, wtid = tid & 127, warp = wtid >> 5, lane = tid & 31;
  const int g = lane >> 2, c = lane & 3;
  const int KT = tc_kt(a.W.cols);
  const int64_t nrows = a.W.rows, nwt = (nrows + 63) / 64, ldy = a.ldy > 0 ? a.ldy : nrows;
  const int row0 = int(blockIdx.z) * ROWS, mrows = min(ROWS, a.M - row0);
  const int nslices = min(KS, KT);
  // the block's walk: st.T = its first weight tile of the round (warpgroup wg takes st.T + wg), slice s, k-tile j
  const int64_t tstride = int64_t(gridDim.x) * NW;
  auto kt_of = [&](const WgStep& st) { return st.s + st.j * KS; };
  auto next = [&](WgStep st) {
    if (kt_of(st) + KS < KT) {
      ++st.j;
    } else if (st.s + 1 < nslices) {
      ++st.s, st.j = 0;
    } else {
      st.T += tstride, st.s = 0, st.j = 0;
    }
    return st;
  };
  // this warpgroup's weights of a step into stage b (as gemv_rows_wgr_kernel's copy_w)
  auto copy_w = [&](const WgStep& st, int b) {
    const int64_t T = st.T + wg;
    if (st.T >= nwt || T >= nwt) return;
    unsigned char* sb = smem + b * X::STAGE + X::W + wg * X::WSTAGE;
    const int kt = kt_of(st);
    const int64_t wrow_bytes = a.W.cols / 2, gpr = a.W.cols / kGroup;
    for (int i = wtid; i < 64 * 8; i += kWgThreads) {
      const int lr = i >> 3, u = i & 7;
      const int64_t row = T * 64 + lr;
      const bool on = row < nrows;
      const char* src = reinterpret_cast<const char*>(a.W.qweight) + (on ? row * wrow_bytes + kt * 128 + 16 * u : 0);
      cp_async16_zfill(sb + X::WW + lr * 128 + 16 * u, src, on ? 16 : 0);
    }
    {
      const int lr = wtid & 63, arr = wtid >> 6;
      const int64_t row = min(T * 64 + lr, nrows - 1);
      const __nv_bfloat16* src = (arr ? a.W.biases : a.W.scales) + row * gpr + kt * 4;
      dev::cp_async8(sb + (arr ? X::WBI : X::WSC) + lr * 8, src);
    }
  };
  uint32_t pmask = 0;  // present rows of the block's ROWS (set after the PDL wait)
  // the block's input of a step into stage b: the NZ slices' B tiles of the k-tile's 4 groups (wg_copy_x's layout per
  // slice) and their meta, group-major; absent rows as zeros
  auto copy_x = [&](const WgStep& st, int b) {
    if (st.T >= nwt) return;
    unsigned char* sb = smem + b * X::STAGE;
    const int kt = kt_of(st);
    const int64_t wstride = int64_t(KT) * kTileXBytes;
    const char* gf = static_cast<const char*>(a.frag_wg);
    for (int i = tid; i < ROWS * 64; i += NW * kWgThreads) {  // (row rr = 16 z + r, group q, hi / lo e, chunk ch)
      const int rr = i >> 6, z = rr / MT, r = rr % MT, q = (i >> 4) & 3, e = (i >> 3) & 1, ch = i & 7;
      const bool on = (pmask >> rr) & 1u;
      const int n = 2 * r + e;
      cp_async16_zfill(sb + X::B + (z * 4 + q) * S::TILE + (n >> 3) * 1024 + (n & 7) * 128 + ((ch ^ (n & 7)) * 16),
                       on ? gf + int64_t(row0 + rr) * wstride + (kt * 4 + q) * kG4GroupBytes + e * 128 + ch * 16 : gf,
                       on ? 16 : 0);
    }
    float2* sm = reinterpret_cast<float2*>(sb + X::META);
    for (int i = tid; i < 4 * ROWS; i += NW * kWgThreads) {
      const int q = i / ROWS, rr = i % ROWS;
      if ((pmask >> rr) & 1u)
        dev::cp_async8(sm + i, a.meta + int64_t(row0 + rr) * (KT * 4) + kt * 4 + q);
      else
        sm[i] = make_float2(0.f, 0.f);  // the stage's last readers are past the barrier before this copy
    }
  };

  // prologue: the first STAGES - 1 steps' weights before the PDL wait, their inputs after it (the first commit group
  // holds the weights and step 0's input)
  WgStep st{int64_t(blockIdx.x) * NW, 0, 0};
  {
    WgStep p = st;
    for (int k = 0; k < STAGES - 1; ++k, p = next(p)) copy_w(p, k);
  }
  pdl_wait();
  pdl_trigger();
  pmask = present_rows(a.row_slot, row0, mrows);
  WgStep ahead = st;
  for (int k = 0; k < STAGES - 1; ++k, ahead = next(ahead)) {
    copy_x(ahead, k);
    cp_async_commit();
  }

  float acc[NZ][NJ][2], v[NZ][NJ][2];
#pragma unroll
  for (int z = 0; z < NZ; ++z)
#pragma unroll
    for (int j = 0; j < NJ; ++j) acc[z][j][0] = acc[z][j][1] = v[z][j][0] = v[z][j][1] = 0.f;
  float D[NZ][2][N / 2];
  uint32_t A[4][4];
  const int lr0 = 16 * warp + g;

  for (int k = 0; st.T < nwt; ++k, st = next(st)) {
    cp_async_wait<STAGES - 2>();
    fence_proxy_async();  // this thread's cp.async writes of step k's B tiles → the async proxy (wgmma reads them)
    __syncthreads();      // step k's stage landed; every warp is done with step k - 1's stage
    copy_w(ahead, (k + STAGES - 1) % STAGES);
    copy_x(ahead, (k + STAGES - 1) % STAGES);
    cp_async_commit();
    ahead = next(ahead);
    const int64_t T = st.T + wg;
    if (T >= nwt) continue;  // this warpgroup has no tile in the block's last round (warpgroup-uniform)
    const unsigned char* sb = smem + (k % STAGES) * X::STAGE;
    const unsigned char* wsb = sb + X::W + wg * X::WSTAGE;
    wgs_step_math<NZ>(wsb + X::WW, wsb + X::WSC, wsb + X::WBI, smem_u32(sb + X::B),
                      reinterpret_cast<const float2*>(sb + X::META), lr0, c, pmask, D, A, acc);
    const WgStep ns = next(st);
    if (ns.T != st.T || ns.s != st.s) {  // the slice's chains are complete
#pragma unroll
      for (int z = 0; z < NZ; ++z)
#pragma unroll
        for (int j = 0; j < NJ; ++j)
#pragma unroll
          for (int h = 0; h < 2; ++h) v[z][j][h] += acc[z][j][h], acc[z][j][h] = 0.f;
    }
    if (ns.T != st.T) {  // the tile is complete
#pragma unroll
      for (int z = 0; z < NZ; ++z) wg_store(a, row0 + z * MT, pmask >> (z * MT), T * 64 + lr0, ldy, c, v[z]);
    }
  }
  cp_async_wait<0>();
#endif
}

bool wg_env_on() {
  static const bool on = env_switch_on("LILAC_ROWS_WGMMA");
  return on;
}
// The cluster split at 9..16 rows (kWgSplitMaxRows); LILAC_ROWS_WGMMA_SPLIT=0 turns it off (measurement)
bool wg_split_on() {
  static const bool on = env_switch_on("LILAC_ROWS_WGMMA_SPLIT");
  return on;
}

// Measurement switch: LILAC_ROWS_WGR=0 keeps gemv_rows_wg_kernel above 16 rows.
bool wgr_on() {
  static const bool on = env_switch_on("LILAC_ROWS_WGR");
  return on;
}

// Measurement switch: LILAC_ROWS_WGS=0 keeps the resident-input kernel (in_proj) and the tiles kernel (q/kv) from 49
// rows. At 64 rows (H100, stop 69) in_proj 58.9 → 53.9 µs and `bench --batch` +0.5-1.2 % at 64 streams.
bool wgs_on() {
  static const bool on = env_switch_on("LILAC_ROWS_WGS");
  return on;
}

void launch_wgs(const GemvRowsArgs& a, int KS, cudaStream_t stream) {
  constexpr int ROWS = kWgsNZ * MT;
  auto kernel = gemv_rows_wgs_kernel<kWgsNZ>;
  static bool attr = false;  // one GPU per process
  if (!attr) {
    LILAC_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, WgsSmem::alloc));
    attr = true;
  }
  const int gz = (a.M + ROWS - 1) / ROWS;
  const int64_t nwt = (a.W.rows + 63) / 64;
  const int gx = int(std::max<int64_t>(1, std::min<int64_t>(sm_count() / gz, (nwt + kWgsNW - 1) / kWgsNW)));
  launch_pdl(kernel, dim3(unsigned(gx), 1, unsigned(gz)), dim3(kWgsNW * kWgThreads), size_t(WgsSmem::alloc), stream,
             a, KS);
}

template <int NW>
void launch_wgr(const GemvRowsArgs& a, int KS, cudaStream_t stream) {
  auto kernel = gemv_rows_wgr_kernel<NW>;
  const int smem = WgrSmem::alloc(NW);
  static bool attr = false;  // per instantiation (one GPU per process)
  if (!attr) {
    LILAC_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    attr = true;
  }
  const int gz = (a.M + MT - 1) / MT;
  const int64_t nwt = (a.W.rows + 63) / 64;
  const int gx = int(std::max<int64_t>(1, std::min<int64_t>(sm_count() / gz, (nwt + NW - 1) / NW)));
  launch_pdl(kernel, dim3(unsigned(gx), 1, unsigned(gz)), dim3(NW * kWgThreads), size_t(smem), stream, a, KS);
}

}  // namespace

bool gemv_rows_wg_wanted(int M) { return M >= kWgAutoMinRows && M <= 64 && wg_env_on() && gemm_wgmma_available(); }

bool gemv_rows_wg_auto(const QMatrixDev& W, int M) {
  // where it measured faster than the tiles kernel (H100, 2026-12-05): in_proj (12,352 rows) from 16 rows (at 16 with
  // the cluster split); not q/kv (9,216 rows: too few weight tiles for 3 blocks per SM) or out_proj (32 tiles: 13-36
  // against the tiles kernel's 10 µs at 16 rows, split or not); the LM head runs on the digits kernels
  // from 49 rows the input-streaming kernel also takes q/kv (9,216 rows; LILAC_ROWS_WGS=0: not)
  const int64_t min_rows = M >= kWgsAutoMinRows && wgs_on() ? kWgsAutoMinWeightRows : kWgAutoMinWeightRows;
  return W.bits == 4 && W.cols % kTileCols == 0 && W.rows >= min_rows && W.rows <= kWgAutoMaxWeightRows &&
         gemv_rows_wg_wanted(M);
}

bool gemv_rows_wg_applies(const GemvRowsArgs& a, bool forced) {
  auto aligned = [](const void* p, uintptr_t n) { return reinterpret_cast<uintptr_t>(p) % n == 0; };
  if (a.W.bits != 4 || a.W.cols % kTileCols != 0 || a.frag_wg == nullptr || a.M < kWgMinRows || a.M > 64 ||
      !aligned(a.frag_wg, 16) || !aligned(a.W.qweight, 16) || !aligned(a.W.scales, 8) || !aligned(a.W.biases, 8) ||
      !gemm_wgmma_available())
    return false;
  return forced || gemv_rows_wg_auto(a.W, a.M);
}

void gemv_rows_wg(const GemvRowsArgs& a, int KS, cudaStream_t stream, bool stream_input) {
  using S = WgSmem;
  if (a.M >= kWgsMinRows && (stream_input || (a.M >= kWgsAutoMinRows && wgs_on()))) {
    launch_wgs(a, KS, stream);
    return;
  }
  if (a.M > kWgSplitMaxRows && tc_kt(a.W.cols) <= kWgrMaxKT && wgr_on()) {
    launch_wgr<kWgrNW>(a, KS, stream);
    return;
  }
  const int nslices = int(std::min<int64_t>(KS, tc_kt(a.W.cols)));
  // the split: 2 ranks where each gets half of the slices (the handover holds up to 4 per thread)
  const int per_tile = a.M <= kWgSplitMaxRows && wg_split_on() && nslices % 2 == 0 && nslices / 2 <= 4 ? 2 : 1;
  auto kernel = per_tile == 2 ? gemv_rows_wg_kernel<2> : gemv_rows_wg_kernel<1>;
  const int occ = resident_blocks(kernel, kWgThreads, size_t(S::alloc));
  const int gz = (a.M + MT - 1) / MT;
  const int64_t nwt = (a.W.rows + 63) / 64;
  const int64_t per_z = std::max<int64_t>(1, int64_t(sm_count()) * occ / (gz * per_tile));
  // as few weight tiles per block as the resident blocks allow, the same number for every block
  const int64_t rounds = (nwt + per_z - 1) / per_z;
  const int gx = int((nwt + rounds - 1) / rounds) * per_tile;
  launch_pdl_cluster(kernel, dim3(gx, 1, gz), dim3(kWgThreads), size_t(S::alloc), stream, unsigned(per_tile), a, KS);
}

}  // namespace lilac::cuda::rows
