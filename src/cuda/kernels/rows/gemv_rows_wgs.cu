// The input-streaming form of the 4-bit dense rows GEMV on wgmma (rows_mm.h: gemv_rows, RowsGemvKernel::WgmmaStream;
// Auto from 49 rows for in_proj and q/kv). The shared pieces and the same-bits argument are gemv_rows_wg.cu's.
#include <cstdlib>

#include "cuda/cuda_common.h"
#include "cuda/kernels/launch.cuh"
#include "cuda/kernels/rows/gemv_rows_wg.cuh"

namespace lilac::cuda::rows {
namespace {

using namespace wg_dev;

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
  const G4Tile t = wg_tile(w, lr0, c);
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
  const WgWalk walk{KS, KT, 0, nslices, tstride};
  // this warpgroup's weights of a step into stage b (as gemv_rows_wgr_kernel's copy_w)
  auto copy_w = [&](const WgStep& st, int b) {
    const int64_t T = st.T + wg;
    if (st.T >= nwt || T >= nwt) return;
    unsigned char* sb = smem + b * X::STAGE + X::W + wg * X::WSTAGE;
    const int kt = walk.kt(st);
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
    const int kt = walk.kt(st);
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
    for (int k = 0; k < STAGES - 1; ++k, p = walk.next(p)) copy_w(p, k);
  }
  pdl_wait();
  pdl_trigger();
  pmask = present_rows(a.row_slot, row0, mrows);
  WgStep ahead = st;
  for (int k = 0; k < STAGES - 1; ++k, ahead = walk.next(ahead)) {
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

  for (int k = 0; st.T < nwt; ++k, st = walk.next(st)) {
    cp_async_wait<STAGES - 2>();
    fence_proxy_async();  // this thread's cp.async writes of step k's B tiles → the async proxy (wgmma reads them)
    __syncthreads();      // step k's stage landed; every warp is done with step k - 1's stage
    copy_w(ahead, (k + STAGES - 1) % STAGES);
    copy_x(ahead, (k + STAGES - 1) % STAGES);
    cp_async_commit();
    ahead = walk.next(ahead);
    const int64_t T = st.T + wg;
    if (T >= nwt) continue;  // this warpgroup has no tile in the block's last round (warpgroup-uniform)
    const unsigned char* sb = smem + (k % STAGES) * X::STAGE;
    const unsigned char* wsb = sb + X::W + wg * X::WSTAGE;
    wgs_step_math<NZ>(wsb + X::WW, wsb + X::WSC, wsb + X::WBI, smem_u32(sb + X::B),
                      reinterpret_cast<const float2*>(sb + X::META), lr0, c, pmask, D, A, acc);
    const WgStep ns = walk.next(st);
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

}  // namespace

namespace wg_dev {

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

}  // namespace wg_dev
}  // namespace lilac::cuda::rows
