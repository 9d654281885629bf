// Dense quantized GEMV over M rows on the tensor cores (rows_mm.h: gemv_rows).
//
// Arithmetic: gemv_tc.cu's dense kernel per row — its k-slice rule (from the matrix shape alone), its chains
// and fixed-order sums — with 2 (4-bit) / 4 (8-bit) rows per mma (tc_rows.cuh), so every row is bit for bit
// gemv_tc's. Structure (free to choose, it changes no bits):
//  - a block (8 warps) holds a tile of MT = NP·TPM input rows, their staged fragments copied into shared
//    memory once; larger M runs several row tiles side by side (gridDim.y) whose blocks walk the same weights
//    in the same order, so the repeated reads meet in L2;
//  - whole-row warps (KSW = 1, matrices with many 16-row blocks): a warp owns a 16-row block at a time and
//    walks all its k-slices in slice order (ring_rows.cuh), adding the slice sums in registers, then writes
//    its outputs: no barrier after the staging;
//  - split warps (KSW = KS, matrices with few row blocks, for parallelism): warp = (row block, k-slice) as in
//    gemv_tc; the slice sums meet in shared memory and are added in slice order after one barrier per group;
//  - the weights stream through each warp's cp.async ring D-1 k-tiles ahead, the first ones before the PDL
//    wait; B units of columns that are zero in today's layout read a zero block at their own offset (no bank
//    conflicts); each weight unit is dequantized once for all the block's rows.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "cuda/cuda_common.h"
#include "cuda/kernels/launch.cuh"
#include "cuda/kernels/rows/ring_rows.cuh"
#include "cuda/kernels/rows/rows_mm.h"
#include "cuda/kernels/rows/rows_tune.h"

namespace lilac::cuda::rows {

const RowsTune& rows_tune() {
  static const RowsTune t = [] {
    RowsTune r;
    const char* e = std::getenv("LILAC_ROWS_TUNE");
    if (e == nullptr) return r;
    const std::string s(e);
    auto get = [&](const char* key) {
      const std::string k = std::string(key) + "=";
      for (size_t p = s.find(k); p != std::string::npos; p = s.find(k, p + 1))
        if (p == 0 || s[p - 1] == ',') return std::atoi(s.c_str() + p + k.size());
      return 0;
    };
    r.np = get("np");
    r.ksw = get("ksw");
    r.ring = get("ring");
    r.moe_ring = get("moe_ring");
    r.moe_split = get("moe_split");
    r.pipe = s.find("pipe=reg2") != std::string::npos ? 3
             : s.find("pipe=reg") != std::string::npos ? 2
             : s.find("pipe=ring") != std::string::npos ? 1 : 0;
    return r;
  }();
  return t;
}

namespace {

using namespace rows_dev;
using ::lilac::cuda::dev::pdl_trigger;
using ::lilac::cuda::dev::pdl_wait;

constexpr int kTodayMinBlocks = 3;  // gemv_tc's occupancy target, which its k-slice rule uses
constexpr int kMaxEpi = 4;          // epilogue entries per thread of a split group (MT · RB · 16 <= 1024)

struct DenseCfg {
  int KS, KSW, D;
  bool sb_vec;
};

// Dynamic shared memory: staged rows, zero block, meta, the warps' rings, split partials.
__host__ __device__ inline size_t dense_fixed_bytes(int K, int MT, bool split) {
  const int KT = tc_kt(K);
  return size_t(MT) * KT * kTileXBytes + kZeroBytes + size_t(MT) * KT * 4 * sizeof(float2) +
         (split ? size_t(2) * kWarps * MT * 16 * sizeof(float) : 0);
}

// PIPE 0: weights through the warps' shared-memory rings (cfg.D stages); 1 / 2: through registers, 1 / 2
// tiles ahead (pipe=reg / reg2).
template <int BITS, int NP, int PIPE>
__global__ void __launch_bounds__(kThreads, BITS == 4 && NP <= 2 ? 2 : 1)
    gemv_rows_kernel(GemvRowsArgs a, DenseCfg cfg) {
  using S = TcShape<BITS>;
  using SS = SliceSums<BITS, NP>;
  constexpr int MT = NP * S::TPM, QL = SS::QL, STAGE = RingShape<BITS>::STAGE;
  extern __shared__ float4 smem4[];
  __shared__ uint8_t s_tbl[kWarps][64];
  __shared__ int s_rows[MT];
  const int K = int(a.W.cols), KT = tc_kt(K), ngroups = K / kGroup;
  const int xstride = KT * kTileXBytes, mstride = KT * 4;
  char* xf = reinterpret_cast<char*>(smem4);
  char* zero = xf + MT * xstride;
  float2* meta = reinterpret_cast<float2*>(zero + kZeroBytes);
  char* rings = reinterpret_cast<char*>(meta + MT * mstride);
  float* part = reinterpret_cast<float*>(rings + kWarps * cfg.D * STAGE);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const int KS = cfg.KS, KSW = cfg.KSW, RB = kWarps / KSW, rbw = warp / KSW, kw = warp % KSW;
  const int64_t nrows = a.W.rows, nrb = (nrows + 15) / 16, ngrp = (nrb + RB - 1) / RB;
  const int64_t ldy = a.ldy > 0 ? a.ldy : nrows;
  const int tok0 = blockIdx.y * MT, nt = min(MT, a.M - tok0);
  const LaneRows<BITS> lr(lane);
  const int nsw = slice_table(s_tbl[warp], KSW == 1 ? 0 : kw, KSW == 1 ? 1 : KS, KS, KT, lane);
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
    const RowRef r[2] = {row_ref(a.W, min(r0 + g, nrows - 1)), row_ref(a.W, min(r0 + g + 8, nrows - 1))};
    ring_issue<BITS>(st, r, row_ref(a.W, min(r0 + (lane & 15), nrows - 1)), kt, lane, ngroups, cfg.sb_vec);
    advance();
  };
  auto load = [&](RowTile<BITS>& t) {
    if (i_done) return;
    const int kt = s_tbl[warp][i_j] & 0x7F;
    const int64_t r0 = (i_grp * RB + rbw) * 16;
    const RowRef r[2] = {row_ref(a.W, min(r0 + g, nrows - 1)), row_ref(a.W, min(r0 + g + 8, nrows - 1))};
    load_tile_regs<BITS>(t, r, kt, c, ngroups, cfg.sb_vec);
    advance();
  };
  WarpRing ring{rings + warp * cfg.D * STAGE, STAGE, cfg.D};
  RowTile<BITS> nxt, nxt2;
  if constexpr (PIPE == 0) {
    ring.prologue(issue);  // weights only: before the PDL wait
  } else {
    load(nxt);
    if constexpr (PIPE == 2) load(nxt2);
  }
  pdl_wait();
  pdl_trigger();
  uint32_t tmask = 0;  // rows of this tile that are present (not padding)
  for (int t = 0; t < nt; ++t)
    if (a.row_slot == nullptr || a.row_slot[tok0 + t] >= 0) tmask |= 1u << t;
  if (threadIdx.x < MT) s_rows[threadIdx.x] = ((tmask >> threadIdx.x) & 1u) ? tok0 + int(threadIdx.x) : -1;
  __syncthreads();
  stage_rows_in(xf, meta, zero, static_cast<const char*>(a.frag), a.meta, s_rows, 0, nt, xstride, mstride);
  __syncthreads();
  const int np_act = active_tiles<BITS>(tmask);
  const int q0 = slice_q0(c, SS::QV);

  float acc[NP][S::NCH][2];
#pragma unroll
  for (int p = 0; p < NP; ++p)
#pragma unroll
    for (int i = 0; i < S::NCH; ++i) acc[p][i][0] = acc[p][i][1] = 0.f;
  int par = 0;
  for (int64_t grp = blockIdx.x; grp < ngrp; grp += gridDim.x) {
    const int64_t row0 = (grp * RB + rbw) * 16;
    // the residual, requested now and used after the group's math
    float yo[QL > kMaxEpi ? QL : kMaxEpi];
    if (a.accumulate) {
      if (KSW == 1) {
#pragma unroll
        for (int j = 0; j < QL; ++j) {
          const int t = (q0 + j) >> 1;
          const int64_t n = row0 + g + 8 * ((q0 + j) & 1);
          yo[j] = ((tmask >> t) & 1u) && n < nrows ? a.y[(tok0 + t) * ldy + n] : 0.f;
        }
      } else {
#pragma unroll
        for (int m = 0; m < kMaxEpi; ++m) {
          const int e = threadIdx.x + m * kThreads, tok = e / (RB * 16), rem = e % (RB * 16);
          const int64_t n = (grp * RB + rem / 16) * 16 + rem % 16;
          yo[m] = tok < nt && ((tmask >> tok) & 1u) && n < nrows ? a.y[(tok0 + tok) * ldy + n] : 0.f;
        }
      }
    }
    float tot[QL];
#pragma unroll
    for (int j = 0; j < QL; ++j) tot[j] = 0.f;
    for (int j = 0; j < nsw; ++j) {
      const int e = s_tbl[warp][j], kt = e & 0x7F;
      RowTile<BITS> t;
      if constexpr (PIPE == 0) {
        const char* st = ring.step(issue);
        const bool sbs = sb_staged(cfg.sb_vec, kt, ngroups);
        ring_read<BITS>(t, st, lane, sbs);
        if (!sbs) {
          const RowRef r[2] = {row_ref(a.W, min(row0 + g, nrows - 1)), row_ref(a.W, min(row0 + g + 8, nrows - 1))};
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
      if (e & 0x80) {  // the end of a slice
        float z[QL];
        slice_reduce<BITS, NP>(acc, c, z);
        if (KSW == 1) {
#pragma unroll
          for (int q = 0; q < QL; ++q) tot[q] += z[q];
        } else {
#pragma unroll
          for (int q = 0; q < QL; ++q)
            part[(par * kWarps + warp) * MT * 16 + ((q0 + q) >> 1) * 16 + g + 8 * ((q0 + q) & 1)] = z[q];
        }
      }
    }
    if (KSW == 1) {  // the warp's outputs: rows g, g+8 of its block for the quad's share of the input rows
#pragma unroll
      for (int j = 0; j < QL; ++j) {
        const int t = (q0 + j) >> 1;
        const int64_t n = row0 + g + 8 * ((q0 + j) & 1);
        if (((tmask >> t) & 1u) && n < nrows) a.y[(tok0 + t) * ldy + n] = a.accumulate ? yo[j] + tot[j] : tot[j];
      }
    } else {  // the slices of each row block, added in slice order
      __syncthreads();
      const int nsl = min(KS, KT);
#pragma unroll
      for (int m = 0; m < kMaxEpi; ++m) {
        const int e = threadIdx.x + m * kThreads, tok = e / (RB * 16), rem = e % (RB * 16), rb = rem / 16, rr = rem % 16;
        const int64_t n = (grp * RB + rb) * 16 + rr;
        if (tok < nt && ((tmask >> tok) & 1u) && n < nrows) {
          float v = 0.f;
          for (int s = 0; s < nsl; ++s) v += part[(par * kWarps + rb * KS + s) * MT * 16 + tok * 16 + rr];
          a.y[(tok0 + tok) * ldy + n] = a.accumulate ? yo[m] + v : v;
        }
      }
      par ^= 1;
    }
  }
  if constexpr (PIPE == 0) cp_async_wait_all();
}

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

// Ring depth for a block of `fixed` bytes: 2 blocks per SM when that leaves >= 4 stages (small tiles),
// else 1 block with up to 6 stages; 0 when not even 3 fit.
int dense_ring(size_t fixed, int stage, int want) {
  const size_t static_b = 1024;  // s_tbl, s_rows and the block's reserve
  const size_t two = size_t(smem_optin()) / 2 > fixed + static_b ? size_t(smem_optin()) / 2 - fixed - static_b : 0;
  const size_t one = size_t(smem_optin()) > fixed + static_b ? size_t(smem_optin()) - fixed - static_b : 0;
  int d2 = int(std::min<size_t>(two / (size_t(kWarps) * stage), kMaxRing));
  int d1 = int(std::min<size_t>(one / (size_t(kWarps) * stage), 6));
  if (want > 0) return std::min(want, std::max(d1, d2)) >= 3 ? std::min(want, std::max(d1, d2)) : 0;
  if (d2 >= 4) return std::min(d2, 6);
  return d1 >= 3 ? d1 : 0;
}

template <int BITS, int NP>
void launch(const GemvRowsArgs& a, int KS, int KSW, int D, cudaStream_t stream) {
  constexpr int MT = NP * TcShape<BITS>::TPM;
  auto kernel = D > 0 ? gemv_rows_kernel<BITS, NP, 0>
                      : (rows_tune().pipe == 3 ? gemv_rows_kernel<BITS, NP, 2> : gemv_rows_kernel<BITS, NP, 1>);
  const size_t smem = dense_fixed_bytes(int(a.W.cols), MT, KSW > 1) + size_t(kWarps) * D * RingShape<BITS>::STAGE;
  const int tiles = (a.M + MT - 1) / MT, RB = kWarps / KSW;
  const int64_t nrb = (a.W.rows + 15) / 16, groups = (nrb + RB - 1) / RB;
  const int64_t resident = int64_t(sm_count()) * resident_blocks(kernel, smem);
  const int gx = int(std::max<int64_t>(1, std::min<int64_t>(groups, resident / tiles)));
  DenseCfg cfg;
  cfg.KS = KS;
  cfg.KSW = KSW;
  cfg.D = D;
  cfg.sb_vec = (a.W.cols / kGroup) % 4 == 0 && aligned(a.W.scales, 8) && aligned(a.W.biases, 8);
  launch_pdl(kernel, dim3(gx, tiles), dim3(kThreads), smem, stream, a, cfg);
}

// The launch shape: mma tiles per block NP (the fewest covering M, at most 4 — or the tune's np — and what
// shared memory holds), whole-row or split warps (sms = 0: whole-row, for the shape check), ring depth.
// Returns false when nothing fits.
struct Shape {
  int NP, KSW, D;
};
bool dense_shape(const GemvRowsArgs& a, int KS, int sms, Shape& sh) {
  const int bits = int(a.W.bits), tpm = bits == 4 ? 2 : 4, stage = bits == 4 ? RingShape<4>::STAGE : RingShape<8>::STAGE;
  const RowsTune& tn = rows_tune();
  const int np_max = bits == 8 ? 2 : (tn.np == 8 ? 8 : (tn.np == 1 || tn.np == 2 ? tn.np : 4));
  const bool reg = tn.pipe >= 2;
  int NP = 1;
  while (NP < np_max && NP * tpm < a.M) NP *= 2;
  const int64_t nrb = (a.W.rows + 15) / 16;
  for (; NP >= 1; NP /= 2) {
    const int MT = NP * tpm, tiles = (std::max(a.M, 1) + MT - 1) / MT;
    // split warps when whole-row warps would leave more than half of the warps idle
    const int64_t warps = int64_t(sms) * (bits == 4 && NP <= 2 ? 2 : 1) * kWarps;
    int KSW = KS > 1 && nrb * tiles * 2 < warps ? KS : 1;
    if (tn.ksw == 1) KSW = 1;
    if (tn.ksw == 2) KSW = KS;
    if (KSW > 1 && size_t(MT) * (kWarps / KSW) * 16 > size_t(kMaxEpi) * kThreads) KSW = 1;
    for (;; KSW = 1) {
      const size_t fixed = dense_fixed_bytes(int(a.W.cols), MT, KSW > 1);
      if (reg && fixed + 1024 <= size_t(smem_optin())) {
        sh = {NP, KSW, 0};
        return true;
      }
      const int D = dense_ring(fixed, stage, tn.ring);
      if (D >= 3) {
        sh = {NP, KSW, D};
        return true;
      }
      if (KSW == 1) break;
    }
  }
  return false;
}

}  // namespace

bool gemv_rows_supported(const GemvRowsArgs& a) {
  const QMatrixDev& W = a.W;
  if ((W.bits != 4 && W.bits != 8) || W.group_size != kGroup || W.cols <= 0 || W.cols % kGroup != 0 || W.rows <= 0)
    return false;
  if (a.frag == nullptr || a.meta == nullptr || a.y == nullptr || a.M < 0 || a.M > 60000) return false;
  if (!aligned(a.frag, 16) || !aligned(a.meta, 16) || !aligned(W.qweight, 16)) return false;
  if (tc_kt(W.cols) > 64) return false;  // a warp's k-tile table
  Shape sh;
  return dense_shape(a, 1, 0, sh);
}

void gemv_rows(const GemvRowsArgs& a, cudaStream_t stream) {
  if (!gemv_rows_supported(a))
    throw Error("rows::gemv_rows: unsupported matrix " + std::to_string(a.W.rows) + "x" + std::to_string(a.W.cols) +
                " bits " + std::to_string(a.W.bits));
  if (a.M == 0) return;
  const int64_t KT = tc_kt(a.W.cols), nrb = (a.W.rows + 15) / 16;
  // gemv_tc's k-slice rule (from the shape alone): every row gets today's k-slices and summation order.
  const int64_t target = int64_t(sm_count()) * kTodayMinBlocks * kWarps;
  int KS = 1;
  while (KS < kWarps && KS < KT && nrb * KS < target) KS *= 2;
  Shape sh;
  if (!dense_shape(a, KS, sm_count(), sh)) throw Error("rows::gemv_rows: no launch shape fits in shared memory");
  if (a.W.bits == 8) {
    if (sh.NP == 1)
      launch<8, 1>(a, KS, sh.KSW, sh.D, stream);
    else
      launch<8, 2>(a, KS, sh.KSW, sh.D, stream);
    return;
  }
  switch (sh.NP) {
    case 1: launch<4, 1>(a, KS, sh.KSW, sh.D, stream); break;
    case 2: launch<4, 2>(a, KS, sh.KSW, sh.D, stream); break;
    case 4: launch<4, 4>(a, KS, sh.KSW, sh.D, stream); break;
    default: launch<4, 8>(a, KS, sh.KSW, sh.D, stream); break;
  }
}

}  // namespace lilac::cuda::rows
