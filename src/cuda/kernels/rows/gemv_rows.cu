// Dense quantized GEMV over M rows on the tensor cores (rows_mm.h: gemv_rows).
//
// The structure is gemv_tc.cu's dense kernel: a block = 8 warps = RB row blocks (16 weight rows) × KS
// k-slices, with KS chosen from the matrix shape alone by the same rule (so every row sees today's k-slices
// and summation order); a warp's next k-tile is requested before the current one's math; the KS partial sums
// of a row are added in a fixed order. What changes: a block owns a tile of up to MT input rows (staged
// fragments copied into shared memory once), and each weight tile, dequantized once into the A operand,
// serves them all. 4-bit weights: the group layout (tc_g4.cuh), 4 input rows per mma, NT mma tiles per block
// (gemv_rows_g4_kernel, the arithmetic of gemv_tc's 4-bit kernel); 8-bit: the k-tile layout, 4 rows per mma
// (tc_rows.cuh). Larger M runs several row tiles (gridDim.y) whose blocks walk the same weight rows in the same
// order, so the repeated reads meet in L2.
#include <algorithm>
#include <cstdlib>
#include <string>

#include "cuda/cuda_common.h"
#include "cuda/kernels/launch.cuh"
#include "cuda/kernels/rows/gemv_rows_wg.h"
#include "cuda/kernels/rows/rows_mm.h"
#include "cuda/kernels/rows/tc_rows.cuh"
#include "cuda/kernels/tc_g4.cuh"

namespace lilac::cuda::rows {
namespace {

using namespace rows_dev;
using ::lilac::cuda::dev::cp_async16_zfill;
using ::lilac::cuda::dev::cp_async_commit;
using ::lilac::cuda::dev::pdl_trigger;
using ::lilac::cuda::dev::pdl_wait;

constexpr size_t kMaxSmem = 100 * 1024;
constexpr int kTodayMinBlocks = 3;  // gemv_tc's occupancy target, which its k-slice rule uses
constexpr int kSliceMinRows = 8;    // the slice kernel from 9 rows (up to 8, one row tile does the same)

__host__ __device__ inline size_t dense_smem_bytes(int K, int MT) {
  const int KT = tc_kt(K);
  return size_t(MT) * KT * kTileXBytes + kZeroBytes + size_t(MT) * KT * 4 * sizeof(float2);
}

// What both kernels share around their k-tile math: the block's shape (RB row blocks × KS k-slices of 8 warps,
// a tile of up to MT input rows tok0 .. tok0 + nt - 1; tmask, set after the PDL wait: the present ones), where
// the staged input lives in shared memory, and the steps: copy the rows' staged input in, fetch the residual y
// of a group of row blocks into epi_y ([MT][RB·16]), and at the end of the group add each row's KS k-slice sums
// of part ([8][MT·16]) in slice order, plus the residual, into y.
template <int KS, int MT>
struct RowsBlock {
  static constexpr int RB = kWarps / KS;
  const GemvRowsArgs& a;
  int KT, ngroups_k, xstride, mstride, rbw, ks, iters, tok0, nt;
  int64_t nrows, ngrp, ldy;
  char* xf;
  char* zero;
  float2* meta;
  uint32_t tmask = 0;

  __device__ __forceinline__ RowsBlock(const GemvRowsArgs& args, char* smem) : a(args) {
    const int K = int(a.W.cols);
    KT = tc_kt(K), ngroups_k = K / kGroup;
    xstride = KT * kTileXBytes, mstride = KT * 4;
    xf = smem;
    zero = xf + MT * xstride;
    meta = reinterpret_cast<float2*>(zero + kZeroBytes);
    const int warp = threadIdx.x >> 5;
    rbw = warp / KS, ks = warp % KS;
    iters = (KT + KS - 1) / KS;
    nrows = a.W.rows, ngrp = ((nrows + 15) / 16 + RB - 1) / RB;
    ldy = a.ldy > 0 ? a.ldy : nrows;
    tok0 = blockIdx.y * MT, nt = min(MT, a.M - tok0);
  }

  // After the first tiles' requests: the PDL wait, the tile's present rows, its staged input and the first group's
  // residual in shared memory (ends with a barrier).
  __device__ __forceinline__ void begin(int64_t grp, float* epi_y) {
    pdl_wait();
    pdl_trigger();
    tmask = present_rows(a.row_slot, tok0, nt);  // rows of this tile that are not padding
    stage();
    fetch_y(grp, epi_y);
    cp_async_wait_all();
    __syncthreads();
  }
  __device__ __forceinline__ void stage() const {
    const char* gf = static_cast<const char*>(a.frag);
    for (int t = 0; t < nt; ++t) {
      if (!((tmask >> t) & 1u)) continue;
      for (int i = threadIdx.x; i < xstride / 16; i += kThreads)
        cp_async16(xf + t * xstride + 16 * i, gf + int64_t(tok0 + t) * xstride + 16 * i);
      for (int i = threadIdx.x; i < mstride / 2; i += kThreads)
        cp_async16(meta + t * mstride + 2 * i, a.meta + int64_t(tok0 + t) * mstride + 2 * i);
    }
    for (int i = threadIdx.x; i < kZeroBytes / 16; i += kThreads)
      reinterpret_cast<uint4*>(zero)[i] = make_uint4(0, 0, 0, 0);
  }
  // epilogue entry e < nt·RB·16: row tok = e / (RB·16) of the tile, weight row (grp·RB + rem/16)·16 + rem%16
  __device__ __forceinline__ void fetch_y(int64_t grp, float* epi_y) const {
    if (!a.accumulate || grp >= ngrp) return;
    for (int e = threadIdx.x; e < nt * RB * 16; e += kThreads) {
      const int tok = e / (RB * 16), rem = e % (RB * 16);
      const int64_t n = (grp * RB + rem / 16) * 16 + rem % 16;
      if (((tmask >> tok) & 1u) && n < nrows) cp_async4(&epi_y[tok * RB * 16 + rem], a.y + (tok0 + tok) * ldy + n);
    }
  }
  __device__ __forceinline__ void store(int64_t grp, const float (&part)[kWarps][MT * 16], const float* epi_y) const {
    for (int e = threadIdx.x; e < nt * RB * 16; e += kThreads) {
      const int tok = e / (RB * 16), rem = e % (RB * 16), rb = rem / 16, rr = rem % 16;
      const int64_t n = (grp * RB + rb) * 16 + rr;
      if (((tmask >> tok) & 1u) && n < nrows) {
        float v = 0.f;
#pragma unroll
        for (int s2 = 0; s2 < KS; ++s2) v += part[rb * KS + s2][tok * 16 + rr];
        float* yp = a.y + (tok0 + tok) * ldy + n;
        *yp = a.accumulate ? epi_y[tok * RB * 16 + rem] + v : v;
      }
    }
  }
};

template <int BITS, int KS, int NP>
__global__ void __launch_bounds__(kThreads, 2) gemv_rows_kernel(GemvRowsArgs a, bool sb_vec) {
  using S = TcShape<BITS>;
  constexpr int RB = kWarps / KS;
  constexpr int MT = NP * S::TPM;
  static_assert(MT <= 32, "a row tile's presence mask is one warp ballot");
  constexpr int PH = NP > 2 ? 2 : NP;  // mma tiles per pass over a weight tile (registers)
  extern __shared__ float4 smem4[];
  __shared__ float part[2][kWarps][MT * 16];
  __shared__ float epi_y[MT][RB * 16];
  RowsBlock<KS, MT> b(a, reinterpret_cast<char*>(smem4));
  const int KT = b.KT, ngroups_k = b.ngroups_k, xstride = b.xstride, mstride = b.mstride, rbw = b.rbw, ks = b.ks;
  const int64_t nrows = b.nrows, ngrp = b.ngrp;
  char* xf = b.xf;
  char* zero = b.zero;
  const float2* meta = b.meta;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const LaneRows<BITS> lr(lane);

  auto next = [&](Step s2) { return next_step(s2, b.iters); };
  auto load = [&](RowTile<BITS>& t, Step s2) {
    if (s2.grp < ngrp && ks + s2.j * KS < KT) {
      const int64_t r0 = (s2.grp * RB + rbw) * 16 + g;
      const RowRef r[2] = {row_ref(a.W, min(r0, nrows - 1), BITS), row_ref(a.W, min(r0 + 8, nrows - 1), BITS)};
      load_row_tile<BITS>(t, r, ks + s2.j * KS, c, ngroups_k, sb_vec);
    }
  };

  Step st{blockIdx.x, 0};
  RowTile<BITS> t0, t1;  // swapping roles each step (the loop body runs twice per iteration): no tile copies
  load(t0, st);
  load(t1, next(st));
  bool nxt_loaded = true;
  b.begin(st.grp, &epi_y[0][0]);
  const uint32_t tmask = b.tmask;
  const int np_act = active_tiles<BITS>(tmask);

  float acc[NP][S::NCH][2];
  clear_acc<BITS, NP>(acc);
  int par = 0;
  auto step = [&](const RowTile<BITS>& cur, RowTile<BITS>& nxt) {
    if (st.grp >= ngrp) return false;
    const Step ns = next(st);
    if (!nxt_loaded) load(nxt, ns);
    nxt_loaded = false;
    const int kt = ks + st.j * KS;
    if (kt < KT) tile_rows_acc<BITS, NP, PH>(cur, xf, xstride, meta, mstride, zero, kt, ngroups_k, lr, tmask, np_act, acc);
    if (ns.j == 0) {  // end of the group: combine the k-slices, epilogue
      write_partials_rows<BITS, NP>(acc, part[par][warp], g, c);
      cp_async_wait_all();  // this thread's residual copies
      __syncthreads();
      b.store(st.grp, part[par], &epi_y[0][0]);
      par ^= 1;
      b.fetch_y(ns.grp, &epi_y[0][0]);
    }
    st = ns;
    return true;
  };
  while (step(t0, t1) && step(t1, t0)) {
  }
}

// The 4-bit kernel: NT mma tiles of 4 input rows (MT = 4·NT) per block; lane (g, c) keeps the chains of input
// row 4p + c with weight rows g, g+8 (acc[p][h]); a row's chains are gemv_tc's 4-bit kernel's, bit for bit.
template <int KS, int NT>
__global__ void __launch_bounds__(kThreads, 2) gemv_rows_g4_kernel(GemvRowsArgs a) {
  constexpr int RB = kWarps / KS, MT = 4 * NT;
  extern __shared__ float4 smem4[];
  __shared__ float part[2][kWarps][MT * 16];
  __shared__ float epi_y[MT][RB * 16];
  RowsBlock<KS, MT> b(a, reinterpret_cast<char*>(smem4));
  const int KT = b.KT, ngroups_k = b.ngroups_k, xstride = b.xstride, mstride = b.mstride, rbw = b.rbw, ks = b.ks;
  const int64_t nrows = b.nrows, ngrp = b.ngrp;
  char* xf = b.xf;
  char* zero = b.zero;
  const float2* meta = b.meta;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;

  auto next = [&](Step s2) { return next_step(s2, b.iters); };
  auto load = [&](G4Tile& t, Step s2) {
    if (s2.grp < ngrp && ks + s2.j * KS < KT) {
      const int64_t r0 = (s2.grp * RB + rbw) * 16 + g;
      const RowRef r[2] = {row_ref(a.W, min(r0, nrows - 1), 4), row_ref(a.W, min(r0 + 8, nrows - 1), 4)};
      load_g4_tile(t, r, ks + s2.j * KS, c, ngroups_k);
    }
  };

  Step st{blockIdx.x, 0};
  G4Tile t0, t1;  // swapping roles each step (the loop body runs twice per iteration): no tile copies
  load(t0, st);
  load(t1, next(st));
  bool nxt_loaded = true;
  b.begin(st.grp, &epi_y[0][0]);
  const uint32_t tmask = b.tmask;
  const int np_act = active_tiles_of(tmask, 4);
  // this lane's B unit of group G of tile p at xb0[p] + G·gst[p]: input row 4p + g / 2, or the zero block
  const char* xb0[NT];
  int gst[NT];
#pragma unroll
  for (int p = 0; p < NT; ++p) {
    const int bt = 4 * p + (g >> 1);
    const bool on = (tmask >> bt) & 1u;
    xb0[p] = (on ? xf + bt * xstride : zero) + g4_lane_off(lane);
    gst[p] = on ? kG4GroupBytes : 0;
  }

  float acc[NT][2];
#pragma unroll
  for (int p = 0; p < NT; ++p) acc[p][0] = acc[p][1] = 0.f;
  int par = 0;
  auto step = [&](const G4Tile& cur, G4Tile& nxt) {
    if (st.grp >= ngrp) return false;
    const Step ns = next(st);
    if (!nxt_loaded) load(nxt, ns);
    nxt_loaded = false;
    const int kt = ks + st.j * KS;
    if (kt < KT) {
      g4_walk<NT>(
          cur, lane, np_act, [&](int p, int q) { return xb0[p] + (kt * 4 + q) * gst[p]; },
          [&](int p, int q, float dot0, float dot1, const G4Scale& sc) {
            const int ot = 4 * p + c, G = kt * 4 + q;  // ot < MT, G < 4·KT = mstride: in bounds
            const bool ok = ((tmask >> ot) & 1u) && G < ngroups_k;
            const float2 mm = meta[ot * mstride + G];
            add_where(acc[p][0], ok, g4_value(sc, 0, dot0, mm));
            add_where(acc[p][1], ok, g4_value(sc, 1, dot1, mm));
          });
    }
    if (ns.j == 0) {  // end of the group: combine the k-slices, epilogue
#pragma unroll
      for (int p = 0; p < NT; ++p) {
        part[par][warp][(4 * p + c) * 16 + g] = acc[p][0];
        part[par][warp][(4 * p + c) * 16 + g + 8] = acc[p][1];
        acc[p][0] = acc[p][1] = 0.f;
      }
      cp_async_wait_all();  // this thread's residual copies
      __syncthreads();
      b.store(st.grp, part[par], &epi_y[0][0]);
      par ^= 1;
      b.fetch_y(ns.grp, &epi_y[0][0]);
    }
    st = ns;
    return true;
  };
  while (step(t0, t1) && step(t1, t0)) {
  }
}

// ------------------------------------------------------------------------------------------------ slices
// The slice kernel (4-bit, M > 8): every weight tile dequantized once per 16 or 32 rows. The tiles kernel above runs
// ceil(M / 8) row tiles side by side, each dequantizing the whole matrix again (at 64 rows, 8 times); here a warp
// owns one row block (16 weight rows) for the block's 4·NT rows (NT mma tiles of 4; above 32 rows two row tiles,
// gridDim.z), and a block owns one k-slice s of the k-slice rule and 8 consecutive row blocks at a time
// (gridDim.y = KS). The slice's staged input of the block's rows goes through shared memory one k-tile at a time
// (1 KB per row): kept for the whole launch when the slice has at most two k-tiles (in_proj, qkv, out_proj), else
// streamed through two buffers for every 8 row blocks (the LM head, KS = 1). A row's chain over its slice (acc from 0, g4_value added group by group in k order) is the
// tiles kernel's chain; with KS = 1 the kernel adds it to the residual as the tiles kernel does (v = 0, v += acc),
// with KS > 1 it writes the chain to partials[s][row][n] and slice_sum_kernel adds the KS chains in slice order.
// So a row's bits are the same in both kernels and alone (tested by memcmp).
constexpr int kSliceMetaBytes = 4 * int(sizeof(float2));  // one k-tile's meta per row

__host__ __device__ inline size_t slice_buf_bytes(int MT) { return size_t(MT) * (kTileXBytes + kSliceMetaBytes); }

template <int NT>
__global__ void __launch_bounds__(kThreads, 2) gemv_rows_slice_kernel(GemvRowsArgs a, int KS) {
  constexpr int MT = 4 * NT;
  static_assert(MT <= 32, "the present rows are one warp ballot");
  extern __shared__ float4 smem4[];
  char* smem = reinterpret_cast<char*>(smem4);
  const int K = int(a.W.cols), KT = tc_kt(K), ngroups_k = K / kGroup;
  const int s = blockIdx.y, nks = (KT - s + KS - 1) / KS;  // this block's slice: k-tiles s, s + KS, ...
  const bool resident = nks <= 2;
  const int64_t nrows = a.W.rows, nrb = (nrows + 15) / 16, nbb = (nrb + kWarps - 1) / kWarps;
  const int64_t ldy = a.ldy > 0 ? a.ldy : nrows;
  const int xstride = KT * kTileXBytes, mstride = KT * 4;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  // this block's rows row0 .. row0 + mrows - 1 (NT = 4 runs up to 16 rows: one row tile, row0 known to be 0)
  const int row0 = NT == 4 ? 0 : int(blockIdx.z) * MT, mrows = min(MT, a.M - row0);
  const int np_act = (mrows + 3) / 4;

  // buffer b: MT staged k-tile rows of 1024 bytes, then their meta (4 float2 each); absent rows are zeros
  auto xbuf = [&](int b) { return smem + b * slice_buf_bytes(MT); };
  auto mbuf = [&](int b) { return xbuf(b) + MT * kTileXBytes; };
  uint32_t pmask = 0;  // present rows (set after the PDL wait)
  auto stage = [&](int j, int b) {
    const int kt = s + j * KS;
    char* xb = xbuf(b);
    char* mb = mbuf(b);
    const char* gf = static_cast<const char*>(a.frag);
    const char* gm = reinterpret_cast<const char*>(a.meta);
    for (int i = threadIdx.x; i < MT * (kTileXBytes / 16); i += kThreads) {
      const int r = i / (kTileXBytes / 16), u = i % (kTileXBytes / 16);
      const bool on = (pmask >> r) & 1u;
      cp_async16_zfill(xb + r * kTileXBytes + 16 * u, on ? gf + int64_t(row0 + r) * xstride + kt * kTileXBytes + 16 * u : gf,
                       on ? 16 : 0);
    }
    for (int i = threadIdx.x; i < MT * 2; i += kThreads) {
      const int r = i / 2, u = i % 2;
      const bool on = (pmask >> r) & 1u;
      cp_async16_zfill(mb + r * kSliceMetaBytes + 16 * u,
                       on ? gm + (int64_t(row0 + r) * mstride + kt * 4) * int64_t(sizeof(float2)) + 16 * u : gm, on ? 16 : 0);
    }
    cp_async_commit();
  };

  // the warp's steps: (row-block batch bb, k-tile j of the slice), batches grid-strided
  int64_t bb = blockIdx.x;
  int j = 0;
  auto load = [&](G4Tile& t, int64_t b2, int j2) {
    if (b2 < nbb) {
      const int64_t r0 = (b2 * kWarps + warp) * 16 + g;
      const RowRef r[2] = {row_ref(a.W, min(r0, nrows - 1), 4), row_ref(a.W, min(r0 + 8, nrows - 1), 4)};
      load_g4_tile(t, r, s + j2 * KS, c, ngroups_k);
    }
  };
  G4Tile t0, t1;  // swapping roles each step (the loop body runs twice per iteration)
  load(t0, bb, 0);
  pdl_wait();
  pdl_trigger();
  pmask = present_rows(a.row_slot, row0, mrows);
  if (resident) {
    for (int j2 = 0; j2 < nks; ++j2) stage(j2, j2);
  } else if (bb < nbb) {
    stage(0, 0);
  }
  int step_i = 0;  // steps taken (streaming: buffer step_i & 1)

  // lane (g, c): B unit of tile p, group q at xl + p·4 KB + q·256 of a buffer (input row 4p + g/2, hi or lo)
  const int xl = (g >> 1) * kTileXBytes + g4_lane_off(lane);
  float acc[NT][2];
#pragma unroll
  for (int p = 0; p < NT; ++p) acc[p][0] = acc[p][1] = 0.f;

  auto step = [&](const G4Tile& cur, G4Tile& nxt) {
    if (bb >= nbb) return false;
    int64_t nb2 = bb;
    int nj = j + 1;
    if (nj == nks) nj = 0, nb2 += gridDim.x;
    const int b = resident ? j : (step_i & 1);
    if (!resident || step_i == 0) {
      cp_async_wait_all();
      __syncthreads();  // this step's input is in; every warp is done with the other buffer
    }
    if (!resident && nb2 < nbb) stage(nj, b ^ 1);
    load(nxt, nb2, nj);
    const int kt = s + j * KS;
    const char* xb = xbuf(b) + xl;
    const float2* mb = reinterpret_cast<const float2*>(mbuf(b));
    g4_walk<NT>(
        cur, lane, np_act, [&](int p, int q) { return xb + p * 4 * kTileXBytes + q * kG4GroupBytes; },
        [&](int p, int q, float dot0, float dot1, const G4Scale& sc) {
          const bool ok = kt * 4 + q < ngroups_k;
          const float2 mm = mb[(4 * p + c) * 4 + q];
          add_where(acc[p][0], ok, g4_value(sc, 0, dot0, mm));
          add_where(acc[p][1], ok, g4_value(sc, 1, dot1, mm));
        });
    if (nj == 0) {  // the row block's slice chain is complete
      const int64_t n0 = (bb * kWarps + warp) * 16 + g;
#pragma unroll
      for (int p = 0; p < NT; ++p) {
        const int row = 4 * p + c;
        if (p < np_act && ((pmask >> row) & 1u)) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int64_t n = n0 + 8 * h;
            if (n < nrows) {
              if (KS == 1) {
                float v = 0.f;
                v += acc[p][h];
                float* yp = a.y + (row0 + row) * ldy + n;
                *yp = a.accumulate ? *yp + v : v;
              } else {
                a.partials[(int64_t(s) * a.M + row0 + row) * nrows + n] = acc[p][h];
              }
            }
          }
        }
        acc[p][0] = acc[p][1] = 0.f;
      }
    }
    bb = nb2, j = nj, ++step_i;
    return true;
  };
  while (step(t0, t1) && step(t1, t0)) {
  }
}

// y[r][n] (+)= Σ_s partials[s][r][n], added from 0 in slice order (the tiles kernel's order), present rows only.
__global__ void __launch_bounds__(256) slice_sum_kernel(GemvRowsArgs a, int KS) {
  pdl_wait();
  pdl_trigger();
  const int r = blockIdx.y;
  if (a.row_slot != nullptr && a.row_slot[r] < 0) return;
  const int64_t nrows = a.W.rows, ldy = a.ldy > 0 ? a.ldy : nrows;
  for (int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; n < nrows; n += int64_t(gridDim.x) * blockDim.x) {
    float v = 0.f;
    for (int s2 = 0; s2 < KS; ++s2) v += a.partials[(int64_t(s2) * a.M + r) * nrows + n];
    float* yp = a.y + r * ldy + n;
    *yp = a.accumulate ? *yp + v : v;
  }
}

bool aligned(const void* p, uintptr_t n) { return reinterpret_cast<uintptr_t>(p) % n == 0; }

// The grid for MT rows per block: row tiles side by side (gridDim.y), each with as many blocks as are resident.
template <int KS, typename Kern, typename... Extra>
void launch_tiles(Kern kernel, int MT, const GemvRowsArgs& a, cudaStream_t stream, Extra... extra) {
  constexpr int RB = kWarps / KS;
  const size_t smem = dense_smem_bytes(int(a.W.cols), MT);
  const int tiles = (a.M + MT - 1) / MT;
  const int64_t nrb = (a.W.rows + 15) / 16, groups = (nrb + RB - 1) / RB;
  const int64_t resident = int64_t(sm_count()) * resident_blocks(kernel, kThreads, smem);
  const int gx = int(std::max<int64_t>(1, std::min<int64_t>(groups, resident / tiles)));
  launch_pdl(kernel, dim3(gx, tiles), dim3(kThreads), smem, stream, a, extra...);
}

// 8-bit weights (the router, the shared expert's gate): the k-tile layout, one mma tile of 4 rows per block.
template <int KS>
void launch8(const GemvRowsArgs& a, cudaStream_t stream) {
  const int64_t gpr = a.W.cols / kGroup;
  const bool sb_vec = gpr % 4 == 0 && aligned(a.W.scales, 8) && aligned(a.W.biases, 8);
  launch_tiles<KS>(gemv_rows_kernel<8, KS, 1>, TcShape<8>::TPM, a, stream, sb_vec);
}
template <int KS, int NT>
void launch4(const GemvRowsArgs& a, cudaStream_t stream) {
  launch_tiles<KS>(gemv_rows_g4_kernel<KS, NT>, 4 * NT, a, stream);
}

// The slice kernel's grid: KS slices (gridDim.y), each with its share of the resident blocks, batches of 8 row
// blocks grid-strided; then, for KS > 1, the slices' sum.
template <int NT>
void launch_slices(int KS, const GemvRowsArgs& a, cudaStream_t stream) {
  const int KT = tc_kt(a.W.cols), nks0 = (KT + KS - 1) / KS;
  const size_t smem = size_t(nks0 > 1 ? 2 : 1) * slice_buf_bytes(4 * NT);
  const int64_t nrb = (a.W.rows + 15) / 16, nbb = (nrb + kWarps - 1) / kWarps;
  const int64_t resident = int64_t(sm_count()) * resident_blocks(gemv_rows_slice_kernel<NT>, kThreads, smem);
  const int gz = (a.M + 4 * NT - 1) / (4 * NT);  // row tiles of 4·NT rows side by side (gridDim.z)
  const int gx = int(std::max<int64_t>(1, std::min<int64_t>(nbb, resident / (KS * gz))));
  launch_pdl(gemv_rows_slice_kernel<NT>, dim3(gx, KS, gz), dim3(kThreads), smem, stream, a, KS);
  if (KS > 1) {
    const int sx = int(std::min<int64_t>((a.W.rows + 255) / 256, 64));
    launch_pdl(slice_sum_kernel, dim3(sx, a.M), dim3(256), 0, stream, a, KS);
  }
}

template <int NT>
void launch4_ks(int KS, const GemvRowsArgs& a, cudaStream_t stream) {
  switch (KS) {
    case 1: launch4<1, NT>(a, stream); break;
    case 2: launch4<2, NT>(a, stream); break;
    case 4: launch4<4, NT>(a, stream); break;
    default: launch4<8, NT>(a, stream); break;
  }
}

// gemv_tc's k-slice rule (from the shape alone): every row gets today's k-slices and summation order.
int k_slices(const QMatrixDev& W) {
  const int64_t KT = tc_kt(W.cols), nrb = (W.rows + 15) / 16;
  const int64_t target = int64_t(sm_count()) * kTodayMinBlocks * kWarps;
  int KS = 1;
  while (KS < kWarps && KS < KT && nrb * KS < target) KS *= 2;
  return KS;
}

RowsGemvKernel kernel_from_env() {
  static const RowsGemvKernel k = [] {
    const char* v = std::getenv("LILAC_ROWS_GEMV");
    const std::string e = v ? v : "";
    if (e == "tiles") return RowsGemvKernel::Tiles;
    if (e == "slices") return RowsGemvKernel::Slices;
    if (e == "wgmma") return RowsGemvKernel::Wgmma;
    return RowsGemvKernel::Auto;
  }();
  return k;
}

}  // namespace

size_t gemv_rows_partial_floats(const QMatrixDev& W, int M) {
  if (W.bits != 4 || M <= kSliceMinRows) return 0;
  const int KS = k_slices(W);
  return KS > 1 ? size_t(KS) * size_t(M) * size_t(W.rows) : 0;
}

bool gemv_rows_supported(const GemvRowsArgs& a) {
  const QMatrixDev& W = a.W;
  if ((W.bits != 4 && W.bits != 8) || W.group_size != kGroup || W.cols <= 0 || W.cols % kGroup != 0 || W.rows <= 0)
    return false;
  if (a.frag == nullptr || a.meta == nullptr || a.y == nullptr || a.M < 0 || a.M > 60000) return false;
  if (!aligned(a.frag, 16) || !aligned(a.meta, 16)) return false;
  return dense_smem_bytes(int(W.cols), 4) <= kMaxSmem;  // one mma tile of 4 rows (both layouts)
}

void gemv_rows(const GemvRowsArgs& a, cudaStream_t stream) {
  if (!gemv_rows_supported(a))
    throw Error("rows::gemv_rows: unsupported matrix " + std::to_string(a.W.rows) + "x" + std::to_string(a.W.cols) +
                " bits " + std::to_string(a.W.bits));
  if (a.M == 0) return;
  const int64_t K = a.W.cols;
  const int KS = k_slices(a.W);
  if (a.W.bits == 8) {
    switch (KS) {
      case 1: launch8<1>(a, stream); break;
      case 2: launch8<2>(a, stream); break;
      case 4: launch8<4>(a, stream); break;
      default: launch8<8>(a, stream); break;
    }
    return;
  }
  // 4-bit, more than 8 rows: the slice kernel (each weight tile dequantized once per 16 or 32 rows) where its
  // partial sums have room and it measured faster; else (and when LILAC_ROWS_GEMV=tiles) the tiles kernel
  const RowsGemvKernel want = a.kernel != RowsGemvKernel::Auto ? a.kernel : kernel_from_env();
  const bool wg_forced = want == RowsGemvKernel::Wgmma || want == RowsGemvKernel::WgmmaStream;
  if ((want == RowsGemvKernel::Auto || wg_forced) && gemv_rows_wg_applies(a, wg_forced)) {
    gemv_rows_wg(a, KS, stream, want == RowsGemvKernel::WgmmaStream);
    return;
  }
  if (wg_forced)
    throw Error("rows::gemv_rows: the wgmma kernel needs 4-bit weights with K a multiple of 256, 9..64 rows, "
                "a staged frag_wg and sm_90a code on Hopper");
  const bool room = KS == 1 || (a.partials != nullptr && a.partial_floats >= size_t(KS) * size_t(a.M) * size_t(a.W.rows));
  if (want == RowsGemvKernel::Slices && !room)
    throw Error("rows::gemv_rows: the slice kernel needs " + std::to_string(size_t(KS) * a.M * a.W.rows) +
                " partial floats, got " + std::to_string(a.partial_floats));
  // Auto: where it measured faster in the step (bench/BENCHMARKS.md, ninth stop): the LM head's single streamed
  // slice from 9 rows, slices of two or more k-tiles (out_proj) from 17; in_proj / qkv (one k-tile per slice: the
  // partials' pass costs what the dequantization saves) stay on the tiles kernel
  const int nks = (tc_kt(K) + KS - 1) / KS;
  const bool auto_slices = a.M > kSliceMinRows && room && (KS == 1 || (nks >= 2 && a.M > 16));
  if (want == RowsGemvKernel::Slices || (want == RowsGemvKernel::Auto && auto_slices)) {
    // up to 16 rows one block of 16 (the kernel assumes it), else blocks of 32 rows (above 32 two of them per
    // slice and 8 row blocks: each weight tile dequantized twice, but one block of 64 rows needs 245 registers and
    // 135 KB, one block per SM)
    if (a.M <= 16)
      launch_slices<4>(KS, a, stream);
    else
      launch_slices<8>(KS, a, stream);
    return;
  }
  // 4-bit: one mma tile (4 rows) per block up to 4 rows, else two where their staged input fits
  const int NT = a.M > 4 && dense_smem_bytes(int(K), 8) <= kMaxSmem ? 2 : 1;
  if (NT == 2)
    launch4_ks<2>(KS, a, stream);
  else
    launch4_ks<1>(KS, a, stream);
}

}  // namespace lilac::cuda::rows
