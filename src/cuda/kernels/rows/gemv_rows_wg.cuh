// The pieces the wgmma rows GEMV kernels share (gemv_rows_wg.cu: the per-16-row and resident-input kernels and the
// dispatch; gemv_rows_wgs.cu: the input-streaming kernel): the block shape, the shared-memory layout of a step, the
// copies of a step's weights and input, the split's handover, a weight tile's store and one step's math. Included
// by those two files only.
#pragma once
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

namespace lilac::cuda::rows::wg_dev {

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
// A block's walk over its steps: in slice s its k-tiles s, s + KS, ... below KT, then slice s + 1 up to s1, then the
// block's next weight tile (tstride on) from slice s0.
struct WgWalk {
  int KS, KT, s0, s1;
  int64_t tstride;
  __device__ __forceinline__ int kt(const WgStep& st) const { return st.s + st.j * KS; }
  __device__ __forceinline__ WgStep next(WgStep st) const {
    if (kt(st) + KS < KT) {
      ++st.j;
    } else if (st.s + 1 < s1) {
      ++st.s, st.j = 0;
    } else {
      st.T += tstride, st.s = s0, st.j = 0;
    }
    return st;
  }
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
// This thread's rows lr0 and lr0 + 8 of a step's 64 weight rows at w (128 bytes each): the two 16-byte pieces of
// each that lane c's A fragments take.
__device__ __forceinline__ G4Tile wg_tile(const unsigned char* w, int lr0, int c) {
  G4Tile t;
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int i = 0; i < 2; ++i) t.w[h][i] = *reinterpret_cast<const uint4*>(w + (lr0 + 8 * h) * 128 + 64 * i + 16 * c);
  return t;
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
  const G4Tile t = wg_tile(w, lr0, c);
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

// The input-streaming kernel (gemv_rows_wgs.cu), as the dispatch in gemv_rows_wg.cu needs it.
constexpr int kWgsNW = 3;      // warpgroups per block
constexpr int kWgsNZ = 2;      // 16-row slices per warpgroup (32 input rows per block)
constexpr int kWgsStages = 3;  // ring depth (steps)
constexpr int kWgsMinRows = 33;      // forced (RowsGemvKernel::WgmmaStream): from here
constexpr int kWgsAutoMinRows = 49;  // Auto: from here, where a block's second slice is full (at 33-48 rows it would
                                     // cost what 64 rows cost, the resident kernel three quarters of it)
constexpr int kWgsAutoMinWeightRows = 8192;  // from kWgsAutoMinRows q/kv too
// LILAC_ROWS_WGS=0 turns the Auto choice of the streaming kernel off (measurement).
bool wgs_on();
// The streaming kernel for a (a.M >= kWgsMinRows) with gemv_tc's k-slice count KS.
void launch_wgs(const GemvRowsArgs& a, int KS, cudaStream_t stream);

}  // namespace lilac::cuda::rows::wg_dev
