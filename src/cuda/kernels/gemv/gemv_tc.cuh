// The device pieces of the tensor-core decode GEMVs that the dense kernel (gemv_tc.cu) and the MoE kernels
// (moe_tc.cu) share: the input staging (t(x) → hi / lo fp16 fragments and group meta), the k-tile registers,
// loads and mma arithmetic of the k-tile layout, the step sequence of a warp, the phase trace and the launch
// helpers. gemv_tc.cu explains the scheme. For those two files only: everything is internal to the file that
// includes it (each has its own trace pointer; gemv_tc_trace sets both).
#pragma once
#include <algorithm>
#include <cstdint>

#include "cuda/cuda_common.h"
#include "cuda/kernels/gemv/gemv.h"
#include "cuda/kernels/gemv/gemv_common.cuh"
#include "cuda/kernels/launch.cuh"
#include "cuda/kernels/ptx.cuh"
#include "cuda/kernels/qdot.cuh"
#include "cuda/kernels/tc_common.cuh"
#include "cuda/kernels/tc_g4.cuh"

namespace lilac::cuda {
namespace {

using namespace dev;
using namespace tc;  // the k-tile shape, fragment layout, dq4 / dq8, ... (tc_common.cuh)
// Blocks per SM the register allocation is made for: 4-bit 3 (80 registers), 8-bit 2 (its tiles are
// twice as large; only the small router / shared-expert-gate matrices are 8-bit).
template <int BITS>
constexpr int kMinBlocks = BITS == 4 ? 3 : 2;
constexpr size_t kMaxSmem = 96 * 1024;

// ------------------------------------------------------------------------------------------------ tracing
// Per-block timeline for measurements (gemv_tc_trace): %globaltimer at entry, after the PDL wait,
// after the input copies landed, after staging, after the first group and at exit, [block][8];
// off (null) in normal runs.
__device__ unsigned long long* g_tc_trace = nullptr;
__device__ __forceinline__ void tc_mark(int k) {
  if (g_tc_trace != nullptr && threadIdx.x == 0) {
    g_tc_trace[blockIdx.x * 8 + k] = globaltimer();
  }
}

// ------------------------------------------------------------------------------------------------ staging
// The input prologue of every tensor-core GEMV: t(x) (None / RmsNorm / GatedHeadNorm, see gemv.h)
// computed from x, z, norm_w staged in shared memory with one batch of cp.async (a single memory
// round trip), then split into the hi / lo fp16 fragments and the per-group meta {2^E, Σx}.
struct StageIn {
  const float* x = nullptr;
  const float* norm_w = nullptr;
  const float* z = nullptr;
  Prologue pro = Prologue::None;
  int head_dim = 0;
  float eps = 1e-6f;
};

// Shared memory carve-up (all parts 16-byte aligned).
struct TcSmem {
  char* xf;      // KT·1024 fragment bytes + kZeroBytes zeros
  float2* meta;  // KT·4 groups
  float* xs;     // K
  float* zs;     // K (GatedHeadNorm)
  float* nws;    // K (RmsNorm) / head_dim (GatedHeadNorm)
  float* hss;    // K / head_dim + 1 (GatedHeadNorm per-head Σx²)
};
__host__ __device__ inline int round16(int b) { return (b + 15) / 16 * 16; }
__host__ __device__ inline int tc_smem_bytes(int K, Prologue pro, int hd) {
  const int KT = tc_kt(K);
  int b = KT * kTileXBytes + kZeroBytes + KT * 4 * 8 + K * 4;
  if (pro == Prologue::RmsNorm) b += K * 4;
  if (pro == Prologue::GatedHeadNorm) b += K * 4 + round16(hd * 4) + round16((K / hd + 1) * 4);
  return b;
}
__device__ inline TcSmem carve(char* base, int K, Prologue pro, int hd) {
  TcSmem m;
  const int KT = tc_kt(K);
  m.xf = base;
  m.meta = reinterpret_cast<float2*>(base + KT * kTileXBytes + kZeroBytes);
  m.xs = reinterpret_cast<float*>(m.meta + KT * 4);
  char* p = reinterpret_cast<char*>(m.xs + K);
  m.zs = m.nws = m.hss = nullptr;
  if (pro == Prologue::RmsNorm) m.nws = reinterpret_cast<float*>(p);
  if (pro == Prologue::GatedHeadNorm) {
    m.zs = reinterpret_cast<float*>(p);
    m.nws = m.zs + K;
    m.hss = reinterpret_cast<float*>(reinterpret_cast<char*>(m.nws) + round16(hd * 4));
  }
  return m;
}

// Before the PDL wait: the norm weights (weights, written by no kernel of the step).
__device__ inline void stage_preload(const StageIn& in, const TcSmem& m, int K) {
  if (in.pro == Prologue::RmsNorm)
    for (int i = threadIdx.x; i < K / 4; i += blockDim.x) cp_async16(m.nws + 4 * i, in.norm_w + 4 * i);
  if (in.pro == Prologue::GatedHeadNorm)
    for (int i = threadIdx.x; i < in.head_dim / 4; i += blockDim.x) cp_async16(m.nws + 4 * i, in.norm_w + 4 * i);
}

// After the PDL wait: the copies of x (and z) into shared memory, zero fills. No barrier.
__device__ inline void stage_issue(const StageIn& in, const TcSmem& m, int K) {
  for (int i = threadIdx.x; i < K / 4; i += blockDim.x) {
    cp_async16(m.xs + 4 * i, in.x + 4 * i);
    if (in.pro == Prologue::GatedHeadNorm) cp_async16(m.zs + 4 * i, in.z + 4 * i);
  }
  // zero block + fragment units past K (up to the end of the last k-tile)
  const int KT = tc_kt(K);
  for (int i = threadIdx.x; i < kZeroBytes / 16; i += blockDim.x)
    reinterpret_cast<uint4*>(m.xf + KT * kTileXBytes)[i] = make_uint4(0, 0, 0, 0);
}

// Unit t (8 values) of t(x) → its fragment halves, and its group's meta from the group's first unit. Every thread of
// a warp calls it for the same number of units (the 8 threads of a 64-group agree on E and Σx by shuffles); units
// past K (t >= n8) stage zeros, and only units below n8t (the last k-tile's end) are stored.
template <int BITS, bool G4L = false>
__device__ __forceinline__ void stage_unit(const StageIn& in, const TcSmem& m, int t, int n8, int n8t, float scale) {
  // 16-byte reads (a thread's 8 values are contiguous): 2-way bank conflicts instead of 8-way
  float v[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  if (t < n8) unit_values(in.pro, m, t, scale, in.head_dim, in.eps, v);
  int E;
  float sum;
  group_meta(v, E, sum);
  uint4 hi, lo;
  split_unit<BITS>(v, pow2i(-E), hi, lo);
  if (t < n8t) {
    char* dst = m.xf + (G4L ? g4_unit_off(t) : unit_off<BITS>(t));
    *reinterpret_cast<uint4*>(dst) = hi;
    *reinterpret_cast<uint4*>(dst + 16) = lo;
    if ((t & 7) == 0) m.meta[t / 8] = make_float2(pow2i(E), sum);
  }
}

// t(x) → fragments + meta once the copies landed. Ends with a barrier. G4L: the group layout of the 4-bit
// dense kernel (tc_g4.cuh) instead of the k-tile layout of BITS.
template <int BITS, bool G4L = false>
__device__ void stage_compute(const StageIn& in, const TcSmem& m, int K, float* red) {
  cp_async_wait_all();
  __syncthreads();
  tc_mark(2);
  const int hd = in.head_dim, KT = tc_kt(K);
  const int n8 = K / 8, n8t = KT * kTileCols / 8;
  float scale = 1.f;
  if (in.pro == Prologue::RmsNorm) {
    float ss = 0.f;
    for (int t = threadIdx.x; t < n8; t += blockDim.x) ss += unit_sumsq(m.xs, t);
    ss = block_sum(ss, red);
    scale = rsqrtf(ss / float(K) + in.eps);
  } else if (in.pro == Prologue::GatedHeadNorm) {
    head_sums(m.xs, m.hss, K, hd, 0, n8);  // tc_common.cuh: the rows stagings' fixed order (ends with a barrier)
  }
  // one thread per 8 values, every thread of a warp the same number of iterations
  for (int t0 = 0; t0 < n8t; t0 += blockDim.x) stage_unit<BITS, G4L>(in, m, t0 + threadIdx.x, n8, n8t, scale);
  __syncthreads();
}

// ------------------------------------------------------------------------------------------------ tiles
// Weights of one k-tile for one thread: rows g and g+8, NCH chunks each, plus the scale / bias of
// group (4·kt + c) of both rows (raw bf16 bits).
template <int BITS>
struct TileRegs {
  uint4 w[2][TcShape<BITS>::NCH];
  uint32_t s[2], b[2];  // raw bf16 bits of the scale / bias for rows g, g+8 (combined only when used,
                        // so that issuing the loads never waits for them)
};

// Loads the tile `kt` of rows (g, g+8) for a single-segment K (dense, gate/up). Groups past the end
// of K load as zero words (their x fragments are zero).
template <int BITS>
__device__ __forceinline__ void load_tile(TileRegs<BITS>& t, const RowRef (&r)[2], int kt, int c, int ngroups) {
  load_tile_words<BITS>(t.w, r, kt, c, ngroups);
  const int G = kt * 4 + c;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    t.s[h] = G < ngroups ? uint32_t(__ldg(r[h].s + G)) : 0u;
    t.b[h] = G < ngroups ? uint32_t(__ldg(r[h].b + G)) : 0u;
  }
}

// Per-lane constants of the B operand: for chunk i, the lane supplies x (its own chunk's values)
// when the chunk's group slot is g / 2, else zeros. xoff[i]: byte offset of its first unit inside a
// k-tile, or -1 for the zero block.
template <int BITS>
struct LaneB {
  int xoff[TcShape<BITS>::NCH];
  __device__ explicit LaneB(int lane) {
    const int g = lane >> 2, c = lane & 3, p = g & 1;
#pragma unroll
    for (int i = 0; i < TcShape<BITS>::NCH; ++i)
      xoff[i] = (g >> 1) == TcShape<BITS>::slot(i, c) ? frag_off<BITS>(i, 0, c, p) : -1;
  }
};

// The tensor-core part of one k-tile: the raw group dots Σ (q - zc)·x̃ over group 4·kt + c of rows
// g (dot[0]) and g+8 (dot[1]).
template <int BITS>
__device__ __forceinline__ void tile_dots(const TileRegs<BITS>& t, const char* xf, const char* zero, int kt,
                                          const LaneB<BITS>& lb, float (&dot)[2]) {
  using S = TcShape<BITS>;
  float d0[4] = {0.f, 0.f, 0.f, 0.f}, d1[4] = {0.f, 0.f, 0.f, 0.f};
  const char* tile = xf + kt * kTileXBytes;
#pragma unroll
  for (int i = 0; i < S::NCH; ++i) {
    const char* xb = lb.xoff[i] >= 0 ? tile + lb.xoff[i] : zero;
#pragma unroll
    for (int u = 0; u < S::U; ++u) {
      const uint4 xv = *reinterpret_cast<const uint4*>(xb + u * 128);
      if constexpr (BITS == 4) {
        uint32_t ha[4], hb[4];
        dq4(sel4(t.w[0][i], u), ha);
        dq4(sel4(t.w[1][i], u), hb);
        mma_m16n8k16_f16(d0, ha[0], hb[0], ha[1], hb[1], xv.x, xv.y);
        mma_m16n8k16_f16(d1, ha[2], hb[2], ha[3], hb[3], xv.z, xv.w);
      } else {
        uint32_t ha[2], hb[2];
        dq8(sel4(t.w[0][i], 2 * u), ha);
        dq8(sel4(t.w[1][i], 2 * u), hb);
        mma_m16n8k16_f16(d0, ha[0], hb[0], ha[1], hb[1], xv.x, xv.y);
        dq8(sel4(t.w[0][i], 2 * u + 1), ha);
        dq8(sel4(t.w[1][i], 2 * u + 1), hb);
        mma_m16n8k16_f16(d1, ha[0], hb[0], ha[1], hb[1], xv.z, xv.w);
      }
    }
  }
  dot[0] = (d0[0] + d0[1]) + (d1[0] + d1[1]);
  dot[1] = (d0[2] + d0[3]) + (d1[2] + d1[3]);
}

// s·2^E·dot + (zc·s + b)·Σx for one row's group.
template <int BITS>
__device__ __forceinline__ float group_value(float dot, uint32_t s_raw, uint32_t b_raw, float2 m) {
  const float s = bf_raw(s_raw), b = bf_raw(b_raw);
  return fmaf(s * m.x, dot, fmaf(TcShape<BITS>::ZC, s, b) * m.y);
}


// Adds one finished k-tile to the accumulators of rows g, g+8 (group 4·kt + c; fmaf(1, ·): the rows kernels' AccStore).
template <int BITS>
__device__ __forceinline__ void tile_accumulate(const TileRegs<BITS>& t, const TcSmem& m, const char* zero, int kt,
                                                int c, int ngroups, const LaneB<BITS>& lb, float (&acc)[2]) {
  float dot[2];
  tile_dots<BITS>(t, m.xf, zero, kt, lb, dot);
  const int G = kt * 4 + c;
  if (G < ngroups) {
    const float2 mm = m.meta[G];
    acc[0] = fmaf(1.f, group_value<BITS>(dot[0], t.s[0], t.b[0], mm), acc[0]);
    acc[1] = fmaf(1.f, group_value<BITS>(dot[1], t.s[1], t.b[1], mm), acc[1]);
  }
}

// The group values of k-tile kt (this lane's group 4·kt + c, rows g and g + 8) into gvs[G·16 + row] (MoE down).
template <int BITS>
__device__ __forceinline__ void tile_group_values(const TileRegs<BITS>& t, const TcSmem& m, const char* zero, int kt,
                                                  int c, int ngroups, const LaneB<BITS>& lb, float* gvs, int g) {
  float dot[2];
  tile_dots<BITS>(t, m.xf, zero, kt, lb, dot);
  const int G = kt * 4 + c;
  if (G < ngroups) {
    const float2 mm = m.meta[G];
    gvs[G * 16 + g] = group_value<BITS>(dot[0], t.s[0], t.b[0], mm);
    gvs[G * 16 + g + 8] = group_value<BITS>(dot[1], t.s[1], t.b[1], mm);
  }
}

// End of a group of row blocks: this warp's row sums (over its k-slice) into part[warp][16].
__device__ __forceinline__ void write_partials(float (&acc)[2], float* part_w, int g, int c) {
  const float v0 = quad_sum(acc[0]), v1 = quad_sum(acc[1]);
  if (c == 0) {
    part_w[g] = v0;
    part_w[g + 8] = v1;
  }
  acc[0] = acc[1] = 0.f;
}


// ------------------------------------------------------------------------------------------------ host side


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

inline int grid_of(int64_t groups, int occ) {
  return int(std::max<int64_t>(1, std::min<int64_t>(groups, int64_t(sm_count()) * occ)));
}

inline bool shape_ok(const QMatrixDev& W) {
  return (W.bits == 4 || W.bits == 8) && W.group_size == kGroup && W.cols % kGroup == 0 && W.cols > 0;
}
inline bool aligned16(const void* p) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 == 0; }


}  // namespace
}  // namespace lilac::cuda
