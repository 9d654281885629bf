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
// From 49 rows in_proj and q/kv take the input-streaming form instead (gemv_rows_wgs.cu: 58.9 → 53.9 µs for in_proj at 64
// rows on the H100, bench/BENCHMARKS.md "Stop 69"). The pieces the kernels share are in gemv_rows_wg.cuh.
#include <algorithm>
#include <cstdlib>
#include <string>

#include "cuda/cuda_common.h"
#include "cuda/kernels/gemm/gemm.h"
#include "cuda/kernels/launch.cuh"
#include "cuda/kernels/rows/gemv_rows_wg.cuh"
#include "cuda/kernels/rows/gemv_rows_wg.h"
#include "cuda/kernels/rows/tc_rows.cuh"
#include "cuda/kernels/tc_g4.cuh"
#include "cuda/kernels/wgmma.cuh"

namespace lilac::cuda::rows {
namespace {

using namespace wg_dev;

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

  // slices past the last k-tile (KS > KT: gemv_tc's rule can give a small K more slices than k-tiles) add 0 to a
  // row's sum in the tiles kernel: skipped here, the same bits
  const int nslices = min(KS, KT);
  // this block's slices [s0, s1) and tiles (T0, T0 + tstride, ...): all of them, or its rank's run (the host takes CL
  // only where it divides nslices, so every rank has slices and meets the cluster barriers of every tile)
  constexpr bool SPLIT = CL > 1;
  const int per = nslices / CL, rank = SPLIT ? int(blockIdx.x % CL) : 0;
  const int s0 = rank * per, s1 = SPLIT ? s0 + per : nslices;
  const int64_t T0 = blockIdx.x / CL, tstride = gridDim.x / CL;
  const WgWalk walk{KS, KT, s0, s1, tstride};
  auto copy_w = [&](const WgStep& st, int b) {
    if (st.T < nwt) wg_copy_w(a.W, st.T, walk.kt(st), smem + b * S::STAGE);
  };
  uint32_t pmask = 0;  // present rows of the block's MT (set after the PDL wait)
  auto copy_x = [&](const WgStep& st, int b) {
    if (st.T < nwt) wg_copy_x(a, row0, pmask, walk.kt(st), smem + b * S::STAGE);
  };

  // prologue: the first STAGES - 1 steps' weights before the PDL wait, their inputs after it (one commit group each)
  WgStep st{T0, s0, 0};
  {
    WgStep p = st;
    for (int k = 0; k < STAGES - 1; ++k, p = walk.next(p)) copy_w(p, k);
  }
  pdl_wait();
  pdl_trigger();
  pmask = present_rows(a.row_slot, row0, mrows);
  WgStep ahead = st;  // the step whose copies are issued next
  for (int k = 0; k < STAGES - 1; ++k, ahead = walk.next(ahead)) {
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

  for (int k = 0; st.T < nwt; ++k, st = walk.next(st)) {
    cp_async_wait<STAGES - 2>();
    fence_proxy_async();  // this thread's cp.async writes of step k's B tiles → the async proxy (wgmma reads them)
    __syncthreads();      // step k's stage landed; every warp is done with step k - 1's stage
    {
      const int b = (k + STAGES - 1) % STAGES;
      copy_w(ahead, b);
      copy_x(ahead, b);
      cp_async_commit();
      ahead = walk.next(ahead);
    }
    const unsigned char* sb = smem + (k % STAGES) * S::STAGE;
    wg_step_math<NJ, 4, 1>(sb + S::W, sb + S::SC, sb + S::BI, smem_u32(sb),
                           reinterpret_cast<const float2*>(sb + S::META), lr0, c, pmask, D, A, sc, acc);

    const WgStep ns = walk.next(st);
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
  const WgWalk walk{KS, KT, 0, nslices, tstride};
  unsigned char* ring = smem + R::RING + wg * kWgrWS * R::STAGE;
  // a step's weights into stage b of this warpgroup's ring (wg_copy_w by the warpgroup's 128 threads)
  auto copy_w = [&](const WgStep& st, int b) {
    if (st.T >= nwt) return;
    unsigned char* sb = ring + b * R::STAGE;
    const int kt = walk.kt(st);
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
  for (int k = 0; k < kWgrWS - 1; ++k, ahead = walk.next(ahead)) {
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

  for (int k = 0; st.T < nwt; ++k, st = walk.next(st)) {
    if (k > 0) cp_async_wait<kWgrWS - 2>();  // step k's weights (this thread's copies); k = 0 waited above
    wg_bar();  // step k's stage landed for the warpgroup; its warps are done with step k - 1's stage
    copy_w(ahead, (k + kWgrWS - 1) % kWgrWS);
    cp_async_commit();
    ahead = walk.next(ahead);
    const unsigned char* sb = ring + (k % kWgrWS) * R::STAGE;
    const int kt = walk.kt(st);
    wg_step_math<NJ, 1, MT>(sb + R::W, sb + R::SC, sb + R::BI, smem_u32(smem + R::B + kt * 4 * S::TILE),
                            meta + kt * 4 * MT, lr0, c, pmask, D, A, sc, acc);
    const WgStep ns = walk.next(st);
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
