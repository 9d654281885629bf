// gemv_rows for many rows of 4-bit matrices with many 16-row blocks (the LM head at M >= 16, the GDN in_proj at
// M = 64): the launch gemv_rows.cu hands over when each warp gets >= ~2.5 row blocks (rows_wide_applies).
//
// Same arithmetic as gemv_rows.cu per row (gemv_tc's k-slices, chains and fixed-order sums; 2 rows per mma),
// another structure: a block holds 16 input rows (8 mma tiles), a warp owns a 16-row block at a time and walks
// all its k-slices in slice order (tc_rows.cuh, "whole rows": each weight unit dequantized once for the 16
// rows, the slice sums added in registers, no barrier after the staging), and its weights stream through its
// cp.async ring (ring_rows.cuh) D-1 k-tiles ahead, the first ones before the PDL wait. Measured on the H200
// (bench/BENCHMARKS.md): LM head 1794 → 1312 µs at M = 64, 465 → 347 µs at M = 16; in_proj 104 → 86 µs at
// M = 64; slower than gemv_rows.cu where the warps get fewer row blocks (one block of 8 warps per SM).
#include <algorithm>

#include "cuda/cuda_common.h"
#include "cuda/kernels/launch.cuh"
#include "cuda/kernels/rows/gemv_rows_wide.h"
#include "cuda/kernels/rows/ring_rows.cuh"

namespace lilac::cuda::rows {
namespace {

using namespace rows_dev;
using ::lilac::cuda::dev::pdl_trigger;
using ::lilac::cuda::dev::pdl_wait;

constexpr int kBits = 4, kNP = 8, kMT = kNP * TcShape<kBits>::TPM;  // 16 input rows per block
constexpr int kMaxRingWide = 6;

struct WideCfg {
  int KS, D;
  bool sb_vec;
};

// Dynamic shared memory: staged rows, zero k-tile, meta, the warps' rings.
size_t wide_fixed_bytes(int K) {
  const int KT = tc_kt(K);
  return size_t(kMT) * KT * kTileXBytes + kZeroTileBytes + size_t(kMT) * KT * 4 * sizeof(float2);
}

template <int BITS, int NP>
__global__ void __launch_bounds__(kThreads, 1) gemv_rows_wide_kernel(GemvRowsArgs a, WideCfg cfg) {
  using S = TcShape<BITS>;
  using SS = SliceSums<BITS, NP>;
  constexpr int MT = NP * S::TPM, QL = SS::QL, STAGE = RingShape<BITS>::STAGE, RB = kWarps;
  static_assert(MT <= 32, "a row tile's presence mask is one warp ballot");
  extern __shared__ float4 smem4[];
  __shared__ uint8_t s_tbl[kWarps][64];
  __shared__ int s_rows[MT];
  const int K = int(a.W.cols), KT = tc_kt(K), ngroups = K / kGroup;
  const int xstride = KT * kTileXBytes, mstride = KT * 4;
  char* xf = reinterpret_cast<char*>(smem4);
  char* zero = xf + MT * xstride;
  float2* meta = reinterpret_cast<float2*>(zero + kZeroTileBytes);
  char* rings = reinterpret_cast<char*>(meta + MT * mstride);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const int KS = cfg.KS, rbw = warp;
  const int64_t nrows = a.W.rows, nrb = (nrows + 15) / 16, ngrp = (nrb + RB - 1) / RB;
  const int64_t ldy = a.ldy > 0 ? a.ldy : nrows;
  const int tok0 = blockIdx.y * MT, nt = min(MT, a.M - tok0);
  const LaneRows<BITS> lr(lane);
  const int nsw = slice_table(s_tbl[warp], 0, 1, KS, KT, lane);  // all k-tiles, slice by slice
  __syncwarp();

  // issue side of the warp's steps: group i_grp, table position i_j
  int64_t i_grp = blockIdx.x;
  int i_j = 0;
  bool i_done = nsw == 0 || i_grp >= ngrp;
  auto advance = [&] {
    if (++i_j == nsw) {
      i_j = 0;
      i_grp += gridDim.x;
      i_done = i_grp >= ngrp;
    }
  };
  auto issue = [&](char* st) {
    if (i_done) return;
    const int kt = s_tbl[warp][i_j] & 0x7F;
    const int64_t r0 = (i_grp * RB + rbw) * 16;
    const RowRef r[2] = {row_ref(a.W, min(r0 + g, nrows - 1), BITS), row_ref(a.W, min(r0 + g + 8, nrows - 1), BITS)};
    ring_issue<BITS>(st, r, row_ref(a.W, min(r0 + (lane & 15), nrows - 1), BITS), kt, lane, ngroups, cfg.sb_vec);
    advance();
  };
  WarpRing ring{rings + warp * cfg.D * STAGE, STAGE, cfg.D};
  ring.prologue(issue);  // weights only: before the PDL wait
  pdl_wait();
  pdl_trigger();
  const uint32_t tmask = present_rows(a.row_slot, tok0, nt);  // rows of this tile that are not padding
  if (threadIdx.x < MT) s_rows[threadIdx.x] = ((tmask >> threadIdx.x) & 1u) ? tok0 + int(threadIdx.x) : -1;
  __syncthreads();
  stage_rows_in(xf, meta, zero, static_cast<const char*>(a.frag), a.meta, s_rows, 0, nt, xstride, mstride);
  __syncthreads();
  const int np_act = active_tiles<BITS>(tmask);
  const int q0 = slice_q0(c, SS::QV);

  float acc[NP][S::NCH][2];
  clear_acc<BITS, NP>(acc);
  for (int64_t grp = blockIdx.x; grp < ngrp; grp += gridDim.x) {
    const int64_t row0 = (grp * RB + rbw) * 16;
    // the residual, requested now and used after the group's math
    float yo[QL];
    if (a.accumulate) {
#pragma unroll
      for (int j = 0; j < QL; ++j) {
        const int t = (q0 + j) >> 1;
        const int64_t n = row0 + g + 8 * ((q0 + j) & 1);
        yo[j] = ((tmask >> t) & 1u) && n < nrows ? a.y[(tok0 + t) * ldy + n] : 0.f;
      }
    }
    float tot[QL];
#pragma unroll
    for (int j = 0; j < QL; ++j) tot[j] = 0.f;
    for (int j = 0; j < nsw; ++j) {
      const int e = s_tbl[warp][j], kt = e & 0x7F;
      RowTile<BITS> t;
      const char* st = ring.step(issue);
      const bool sbs = sb_staged(cfg.sb_vec, kt, ngroups);
      ring_read<BITS>(t, st, lane, sbs);
      if (!sbs) {
        const RowRef r[2] = {row_ref(a.W, min(row0 + g, nrows - 1), BITS), row_ref(a.W, min(row0 + g + 8, nrows - 1), BITS)};
        load_sb_slow<BITS>(t, r, kt, ngroups);
      }
      tile_acc<BITS, NP>(t, xf, xstride, meta, mstride, zero, kt, ngroups, lr, tmask, np_act, acc);
      if (e & 0x80) {  // the end of a slice: its sums, added in slice order
        float z[QL];
        slice_reduce<BITS, NP>(acc, c, z);
#pragma unroll
        for (int q = 0; q < QL; ++q) tot[q] += z[q];
      }
    }
    // the warp's outputs: rows g, g+8 of its block for the quad's share of the input rows
#pragma unroll
    for (int j = 0; j < QL; ++j) {
      const int t = (q0 + j) >> 1;
      const int64_t n = row0 + g + 8 * ((q0 + j) & 1);
      if (((tmask >> t) & 1u) && n < nrows) a.y[(tok0 + t) * ldy + n] = a.accumulate ? yo[j] + tot[j] : tot[j];
    }
  }
  cp_async_wait_all();
}

bool aligned(const void* p, uintptr_t n) { return reinterpret_cast<uintptr_t>(p) % n == 0; }

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

// Ring stages per warp beside the fixed part (1 block per SM); < 3: the wide launch does not fit.
int wide_ring(int64_t K) {
  const size_t fixed = wide_fixed_bytes(int(K)) + 1024;  // + s_tbl, s_rows and the block's reserve
  if (size_t(smem_optin()) <= fixed) return 0;
  return int(std::min<size_t>((size_t(smem_optin()) - fixed) / (size_t(kWarps) * RingShape<kBits>::STAGE), kMaxRingWide));
}

}  // namespace

bool rows_wide_applies(const GemvRowsArgs& a) {
  if (a.W.bits != kBits || a.M < kMT || tc_kt(a.W.cols) > 64 || !aligned(a.W.qweight, 16)) return false;
  const int64_t nrb = (a.W.rows + 15) / 16, tiles = (a.M + kMT - 1) / kMT;
  // one block of 8 warps per SM: whole-row warps pay off from ~2.5 row blocks per warp and row tile
  return nrb * tiles >= int64_t(20) * sm_count() && wide_ring(a.W.cols) >= 3;
}

void gemv_rows_wide(const GemvRowsArgs& a, int KS, cudaStream_t stream) {
  auto kernel = gemv_rows_wide_kernel<kBits, kNP>;
  WideCfg cfg;
  cfg.KS = KS;
  cfg.D = wide_ring(a.W.cols);
  cfg.sb_vec = (a.W.cols / kGroup) % 4 == 0 && aligned(a.W.scales, 8) && aligned(a.W.biases, 8);
  const size_t smem = wide_fixed_bytes(int(a.W.cols)) + size_t(kWarps) * cfg.D * RingShape<kBits>::STAGE;
  LILAC_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const int tiles = (a.M + kMT - 1) / kMT;
  const int64_t nrb = (a.W.rows + 15) / 16, groups = (nrb + kWarps - 1) / kWarps;
  const int gx = int(std::max<int64_t>(1, std::min<int64_t>(groups, int64_t(sm_count()) / tiles)));
  launch_pdl(kernel, dim3(gx, tiles), dim3(kThreads), smem, stream, a, cfg);
}

}  // namespace lilac::cuda::rows
