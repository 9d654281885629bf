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
// That is the layout of the MoE kernels and of 8-bit weights. The dense 4-bit kernel (batch 1, the MTP head,
// the LM head) uses the group layout of tc_g4.cuh instead — the same loads, each mma inside one group — which
// lets the multi-row kernel (rows/gemv_rows.cu) put 4 input rows in one mma with the same bits per row.
#include <algorithm>
#include <string>
#include <type_traits>

#include "cuda/cuda_common.h"
#include "cuda/kernels/gemv/gemv.h"
#include "cuda/kernels/gemv/gemv_common.cuh"
#include "cuda/kernels/gemv/gemv_tc.h"
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
  const int nh = in.pro == Prologue::GatedHeadNorm ? K / in.head_dim : 0;
  for (int h = threadIdx.x; h < nh; h += blockDim.x) m.hss[h] = 0.f;
  // zero block + fragment units past K (up to the end of the last k-tile)
  const int KT = tc_kt(K);
  for (int i = threadIdx.x; i < kZeroBytes / 16; i += blockDim.x)
    reinterpret_cast<uint4*>(m.xf + KT * kTileXBytes)[i] = make_uint4(0, 0, 0, 0);
}

// t(x) → fragments + meta once the copies landed. Ends with a barrier. G4L: the group layout of the 4-bit
// dense kernel (tc_g4.cuh) instead of the k-tile layout of BITS.
template <int BITS, bool G4L = false>
__device__ void stage_compute(const StageIn& in, const TcSmem& m, int K, float* red) {
  using S = TcShape<BITS>;
  cp_async_wait_all();
  __syncthreads();
  tc_mark(2);
  const int hd = in.head_dim, KT = tc_kt(K);
  const int n8 = K / 8, n8t = KT * kTileCols / 8;
  float scale = 1.f;
  if (in.pro == Prologue::RmsNorm) {
    float ss = 0.f;
    for (int t = threadIdx.x; t < n8; t += blockDim.x) {
      const float4 a = reinterpret_cast<const float4*>(m.xs)[2 * t], b = reinterpret_cast<const float4*>(m.xs)[2 * t + 1];
      ss += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w + b.x * b.x + b.y * b.y + b.z * b.z + b.w * b.w;
    }
    ss = block_sum(ss, red);
    scale = rsqrtf(ss / float(K) + in.eps);
  } else if (in.pro == Prologue::GatedHeadNorm) {
    const int lph = hd / 8;  // lanes per head when each lane's 8 values lie in one head
    if (hd % 8 == 0 && lph <= 32 && (lph & (lph - 1)) == 0) {
      for (int t0 = 0; t0 < n8; t0 += blockDim.x) {  // whole warps iterate together (n8 % lph == 0)
        const int t = t0 + threadIdx.x;
        float ss = 0.f;
        if (t < n8) {
          const float4 a = reinterpret_cast<const float4*>(m.xs)[2 * t], b = reinterpret_cast<const float4*>(m.xs)[2 * t + 1];
          ss = a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w + b.x * b.x + b.y * b.y + b.z * b.z + b.w * b.w;
        }
        for (int o = 1; o < lph; o <<= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        if (t < n8 && t % lph == 0) m.hss[t / lph] = ss;
      }
    } else {
      for (int t = threadIdx.x; t < n8; t += blockDim.x) {
      if (hd % 8 == 0) {
        float ss = 0.f;
#pragma unroll
        for (int j = 0; j < 8; ++j) ss += m.xs[8 * t + j] * m.xs[8 * t + j];
        atomicAdd(&m.hss[(8 * t) / hd], ss);
      } else {
        for (int j = 0; j < 8; ++j) atomicAdd(&m.hss[(8 * t + j) / hd], m.xs[8 * t + j] * m.xs[8 * t + j]);
      }
      }
    }
    __syncthreads();
  }
  // one thread per 8 values; the 8 threads of a 64-group agree on E and Σx by shuffles, so every
  // thread of a warp runs the same number of iterations
  for (int t0 = 0; t0 < n8t; t0 += blockDim.x) {
    const int t = t0 + threadIdx.x;
    const bool ok = t < n8;
    // 16-byte reads (a thread's 8 values are contiguous): 2-way bank conflicts instead of 8-way
    float v[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    if (ok) {
      const float4 xa = reinterpret_cast<const float4*>(m.xs)[2 * t], xb = reinterpret_cast<const float4*>(m.xs)[2 * t + 1];
      v[0] = xa.x, v[1] = xa.y, v[2] = xa.z, v[3] = xa.w, v[4] = xb.x, v[5] = xb.y, v[6] = xb.z, v[7] = xb.w;
      if (in.pro == Prologue::RmsNorm) {
        const float4 wa = reinterpret_cast<const float4*>(m.nws)[2 * t], wb = reinterpret_cast<const float4*>(m.nws)[2 * t + 1];
        const float w8[8] = {wa.x, wa.y, wa.z, wa.w, wb.x, wb.y, wb.z, wb.w};
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = v[j] * scale * w8[j];
      } else if (in.pro == Prologue::GatedHeadNorm) {
        const float4 za = reinterpret_cast<const float4*>(m.zs)[2 * t], zb = reinterpret_cast<const float4*>(m.zs)[2 * t + 1];
        const float z8[8] = {za.x, za.y, za.z, za.w, zb.x, zb.y, zb.z, zb.w};
        if (hd % 8 == 0) {  // the 8 values lie in one head
          const int h = (8 * t) / hd, d0 = 8 * t - h * hd;
          const float r = rsqrtf(m.hss[h] / float(hd) + in.eps);
          const float4 wa = reinterpret_cast<const float4*>(m.nws + d0)[0], wb = reinterpret_cast<const float4*>(m.nws + d0)[1];
          const float w8[8] = {wa.x, wa.y, wa.z, wa.w, wb.x, wb.y, wb.z, wb.w};
#pragma unroll
          for (int j = 0; j < 8; ++j) v[j] = v[j] * r * w8[j] * silu_f(z8[j]);
        } else {
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            const int k = 8 * t + j, h = k / hd, d = k - h * hd;
            const float r = rsqrtf(m.hss[h] / float(hd) + in.eps);
            v[j] = v[j] * r * m.nws[d] * silu_f(z8[j]);
          }
        }
      }
    }
    float mx = 0.f, sum = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      mx = fmaxf(mx, fabsf(v[j]));
      sum += v[j];
    }
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) {
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      sum += __shfl_xor_sync(0xffffffffu, sum, o);
    }
    const int E = frexp_e(mx);
    const float inv = pow2i(-E);
    uint32_t hi[4], lo[4];
    // 4-bit unit: (0,4),(1,5),(2,6),(3,7); 8-bit unit: (0,2),(1,3),(4,6),(5,7)
    constexpr int A4[4] = {0, 1, 2, 3}, B4[4] = {4, 5, 6, 7};
    constexpr int A8[4] = {0, 1, 4, 5}, B8[4] = {2, 3, 6, 7};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float xa = v[BITS == 4 ? A4[j] : A8[j]] * inv, xb = v[BITS == 4 ? B4[j] : B8[j]] * inv;
      const __half ha = __float2half_rn(xa), hb = __float2half_rn(xb);
      const __half la = __float2half_rn(xa - __half2float(ha)), lb = __float2half_rn(xb - __half2float(hb));
      const __half2 h2 = __halves2half2(ha, hb), l2 = __halves2half2(la, lb);
      hi[j] = *reinterpret_cast<const uint32_t*>(&h2);
      lo[j] = *reinterpret_cast<const uint32_t*>(&l2);
    }
    if (t < n8t) {
      const int q = t / S::U, u = t % S::U, kt = q / S::CPT, rem = q % S::CPT;
      char* dst = G4L ? m.xf + g4_unit_off(t) : m.xf + kt * kTileXBytes + frag_off<BITS>(rem / 4, u, rem % 4, 0);
      *reinterpret_cast<uint4*>(dst) = make_uint4(hi[0], hi[1], hi[2], hi[3]);
      *reinterpret_cast<uint4*>(dst + 16) = make_uint4(lo[0], lo[1], lo[2], lo[3]);
      if ((t & 7) == 0) m.meta[t / 8] = make_float2(pow2i(E), sum);
    }
  }
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


// Adds one finished k-tile (scaled by wt) to the accumulators of rows g, g+8 (group 4·kt + c).
template <int BITS>
__device__ __forceinline__ void tile_accumulate(const TileRegs<BITS>& t, const TcSmem& m, const char* zero, int kt,
                                                int c, int ngroups, const LaneB<BITS>& lb, float wt, float (&acc)[2]) {
  float dot[2];
  tile_dots<BITS>(t, m.xf, zero, kt, lb, dot);
  const int G = kt * 4 + c;
  if (G < ngroups) {
    const float2 mm = m.meta[G];
    acc[0] = fmaf(wt, group_value<BITS>(dot[0], t.s[0], t.b[0], mm), acc[0]);
    acc[1] = fmaf(wt, group_value<BITS>(dot[1], t.s[1], t.b[1], mm), acc[1]);
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

// ------------------------------------------------------------------------------------------------ dense GEMV
// Block = 8 warps = RB row blocks (16 rows each) x KS k-slices (RB·KS = 8); a block loops over groups
// of RB row blocks (grid-stride); within a group, warp (rb, ks) takes k-tiles ks, ks + KS, ... and the
// KS partial sums of each row are added in a fixed order (deterministic).
// Latency: a warp's first two tiles, the norm weights and the conv taps / state of the epilogue rows
// are requested before the PDL wait; then the residual y and the input; every later tile is requested
// one step ahead of its math. The epilogue data goes through shared memory (cp.async), not registers.
constexpr int kMaxConvK = 4;
constexpr int kMaxEpiRows = 128;

// One step of a warp's tile sequence: the group of row blocks and the k-tile.
struct Step {
  int64_t grp;
  int j;
};
// The step after `st` for a warp with `iters` k-tiles per group; groups are grid-strided.
__device__ __forceinline__ Step next_step(Step st, int iters) {
  if (++st.j == iters) {
    st.j = 0;
    st.grp += gridDim.x;
  }
  return st;
}

// 4-bit weights take the group layout (tc_g4.cuh): the same tiles and loads, 4 mmas per group whose B columns
// hold the one input row in lanes g = 0, 1 (hi / lo) and zeros elsewhere; lane (g, 0) ends with the row's chains
// for weight rows g, g+8 (the other lanes' columns are the zero rows), bit for bit gemv_rows' row 0.
template <int BITS, int KS>
__global__ void __launch_bounds__(kThreads, kMinBlocks<BITS>) gemv_tc_kernel(GemvArgs a) {
  constexpr int RB = kWarps / KS;
  constexpr bool G4 = BITS == 4;
  using Tile = std::conditional_t<G4, G4Tile, TileRegs<BITS>>;
  extern __shared__ float4 smem4[];
  __shared__ float red[32];
  __shared__ float part[2][kWarps][16];
  __shared__ float epi_cw[kMaxEpiRows][kMaxConvK], epi_cs[kMaxEpiRows][kMaxConvK], epi_y[kMaxEpiRows];
  const int K = int(a.W.cols), KT = tc_kt(K), ngroups_k = K / kGroup;
  const TcSmem m = carve(reinterpret_cast<char*>(smem4), K, a.pro, a.head_dim);
  const char* zero = m.xf + KT * kTileXBytes;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const int rbw = warp / KS, ks = warp % KS;
  const int iters = (KT + KS - 1) / KS;
  const int64_t rows = a.W.rows, nrb = (rows + 15) / 16, ngrp = (nrb + RB - 1) / RB;
  const LaneB<BITS> lb(lane);
  StageIn in;
  in.x = a.x;
  in.norm_w = a.norm_w;
  in.z = a.z;
  in.pro = a.pro;
  in.head_dim = a.head_dim;
  in.eps = a.eps;

  auto refs_for = [&](int64_t grp, RowRef(&r)[2]) {
    const int64_t r0 = (grp * RB + rbw) * 16 + g;
    r[0] = row_ref(a.W, min(r0, rows - 1), BITS);
    r[1] = row_ref(a.W, min(r0 + 8, rows - 1), BITS);
  };
  auto next = [&](Step s2) { return next_step(s2, iters); };
  auto load = [&](Tile& t, Step st) {
    if (st.grp < ngrp && ks + st.j * KS < KT) {
      RowRef r[2];
      refs_for(st.grp, r);
      if constexpr (G4)
        load_g4_tile(t, r, ks + st.j * KS, c, ngroups_k);
      else
        load_tile<BITS>(t, r, ks + st.j * KS, c, ngroups_k);
    }
  };
  // epilogue thread e < RB·16 owns row (grp·RB + e/16)·16 + e%16 of each group
  const bool epi = threadIdx.x < RB * 16;
  auto epi_row = [&](int64_t grp) { return (grp * RB + threadIdx.x / 16) * 16 + threadIdx.x % 16; };
  auto conv_fetch = [&](int64_t grp) {  // taps + state: not written by the step's other kernels
    const int64_t r = epi_row(grp);
    if (epi && grp < ngrp && r < a.conv_rows) {
      const int Kc = a.conv_k;
      for (int k = 0; k < Kc; ++k) cp_async4(&epi_cw[threadIdx.x][k], a.conv_w + r * Kc + k);
      for (int k = 0; k + 1 < Kc; ++k)
        cp_async4(&epi_cs[threadIdx.x][k], a.conv_state + r * (Kc - 1) + k);
    }
  };
  auto y_fetch = [&](int64_t grp) {  // the residual: after the PDL wait
    const int64_t r = epi_row(grp);
    if (epi && grp < ngrp && a.accumulate && r < rows) cp_async4(&epi_y[threadIdx.x], a.y + r);
  };

  tc_mark(0);
  Step st{blockIdx.x, 0};
  Tile t0, t1;  // swapping roles each step (the loop body runs twice per iteration): no tile copies
  load(t0, st);
  load(t1, next(st));
  bool nxt_loaded = true;
  conv_fetch(st.grp);
  stage_preload(in, m, K);
  pdl_wait();
  pdl_trigger();
  tc_mark(1);
  y_fetch(st.grp);
  stage_issue(in, m, K);
  stage_compute<BITS, G4>(in, m, K, red);
  tc_mark(3);
  bool first_group = true;
  // G4: this lane's B unit of group G at xb0 + G·gst (the zero block, gst = 0, in lanes g >= 2)
  const char* xb0 = ((g >> 1) == 0 ? m.xf : zero) + g4_lane_off(lane);
  const int gst = (g >> 1) == 0 ? kG4GroupBytes : 0;

  float acc[2] = {0.f, 0.f};
  int par = 0;
  auto step = [&](const Tile& cur, Tile& nxt) {
    if (st.grp >= ngrp) return false;
    const Step ns = next(st);
    if (!nxt_loaded) load(nxt, ns);
    nxt_loaded = false;
    const int kt = ks + st.j * KS;
    if (kt < KT) {
      if constexpr (G4) {
        g4_walk<1>(
            cur, lane, 1, [&](int, int q) { return xb0 + (kt * 4 + q) * gst; },
            [&](int, int q, float dot0, float dot1, const G4Scale& sc) {
              const int G = kt * 4 + q;
              if (c == 0 && G < ngroups_k) {
                const float2 mm = m.meta[G];
                acc[0] += g4_value(sc, 0, dot0, mm);
                acc[1] += g4_value(sc, 1, dot1, mm);
              }
            });
      } else {
        tile_accumulate<BITS>(cur, m, zero, kt, c, ngroups_k, lb, 1.f, acc);
      }
    }
    if (ns.j == 0) {  // end of the group: combine the k-slices, epilogue
      if constexpr (G4) {
        if (c == 0) {
          part[par][warp][g] = acc[0];
          part[par][warp][g + 8] = acc[1];
        }
        acc[0] = acc[1] = 0.f;
      } else {
        write_partials(acc, part[par][warp], g, c);
      }
      cp_async_wait_all();  // this thread's epilogue copies
      __syncthreads();
      const int64_t r = epi_row(st.grp);
      if (epi && r < rows) {
        const int rb = threadIdx.x / 16, rr = threadIdx.x % 16;
        float v = 0.f;
#pragma unroll
        for (int s2 = 0; s2 < KS; ++s2) v += part[par][rb * KS + s2][rr];
        if (r < a.conv_rows) {  // causal depthwise conv (state oldest first) + SiLU
          const int S = a.conv_k - 1;
          float cacc = 0.f;
          for (int k = 0; k < S; ++k) cacc += epi_cw[threadIdx.x][k] * epi_cs[threadIdx.x][k];
          cacc += epi_cw[threadIdx.x][S] * v;
          float* stt = a.conv_state + r * S;
          for (int k = 0; k + 1 < S; ++k) stt[k] = epi_cs[threadIdx.x][k + 1];
          if (S > 0) stt[S - 1] = v;
          v = silu_f(cacc);
        }
        a.y[r] = a.accumulate ? epi_y[threadIdx.x] + v : v;
      }
      par ^= 1;
      conv_fetch(ns.grp);
      y_fetch(ns.grp);
      if (first_group) tc_mark(4);
      first_group = false;
    }
    st = ns;
    return true;
  };
  while (step(t0, t1) && step(t1, t0)) {
  }
  tc_mark(7);
}

// ------------------------------------------------------------------------------------------------ MoE gate/up
// Routing (warp 0), RMSNorm of x, then per group (slot e in 0..k: the k routed experts and the shared
// one; 16 rows j): row block 0 = gate rows, row block 1 = up rows, 4 k-slices each; epilogue
// act[e·I + j] = silu(gate)·up. The first two tiles are requested right after the routing, before
// the input's normalisation.
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
  const int K = int(w.gate.first.cols), KT = tc_kt(K), ngroups_k = K / kGroup;
  const TcSmem m = carve(reinterpret_cast<char*>(smem4), K, Prologue::RmsNorm, 0);
  const char* zero = m.xf + KT * kTileXBytes;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const int rbw = warp / KS, ks = warp % KS;  // rbw 0: gate, 1: up
  const int iters = (KT + KS - 1) / KS;
  const int I = int(w.gate.first.rows), Is = int(w.shared_gate.rows);
  const int nbI = (I + 15) / 16, nbS = (Is + 15) / 16;
  const int64_t ngrp = int64_t(w.top_k) * nbI + nbS;
  const LaneB<BITS> lb(lane);
  StageIn in;
  in.x = x;
  in.norm_w = norm_w;
  in.pro = Prologue::RmsNorm;
  in.eps = eps;

  tc_mark(0);
  stage_preload(in, m, K);
  pdl_wait();
  tc_mark(1);
  stage_issue(in, m, K);
  if (warp == 0) {
    route_warp(logits, w.E, w.top_k, w.renormalise, s_ids, s_w, sel_ids, sel_w);
    if (blockIdx.x == 0) __threadfence();  // the ids are global before this block's trigger (MoE down reads them early)
  }
  __syncthreads();  // s_ids
  pdl_trigger();
  tc_mark(5);

  // group → (slot, first row j0, rows of this slot's matrices)
  auto slot_of = [&](int64_t grp, int& slot, int& j0, int& nrows) {
    if (grp < int64_t(w.top_k) * nbI) {
      slot = int(grp / nbI);
      j0 = int(grp % nbI) * 16;
      nrows = I;
    } else {
      slot = w.top_k;
      j0 = int(grp - int64_t(w.top_k) * nbI) * 16;
      nrows = Is;
    }
  };
  auto next = [&](Step s2) { return next_step(s2, iters); };
  auto load = [&](TileRegs<BITS>& t, Step st) {
    if (st.grp < ngrp && ks + st.j * KS < KT) {
      int slot, j0, nrows;
      slot_of(st.grp, slot, j0, nrows);
      const QMatrixDev M = slot < w.top_k ? (rbw == 0 ? w.gate.expert(s_ids[slot]) : w.up.expert(s_ids[slot]))
                                          : (rbw == 0 ? w.shared_gate : w.shared_up);
      RowRef r[2];
      r[0] = row_ref(M, min(j0 + g, nrows - 1), BITS);
      r[1] = row_ref(M, min(j0 + g + 8, nrows - 1), BITS);
      load_tile<BITS>(t, r, ks + st.j * KS, c, ngroups_k);
    }
  };
  Step st{blockIdx.x, 0};
  TileRegs<BITS> t0, t1;  // swapping roles each step, as in the dense kernel
  load(t0, st);
  load(t1, next(st));
  bool nxt_loaded = true;
  stage_compute<BITS>(in, m, K, red);
  tc_mark(3);

  float acc[2] = {0.f, 0.f};
  int par = 0;
  auto step = [&](const TileRegs<BITS>& cur, TileRegs<BITS>& nxt) {
    if (st.grp >= ngrp) return false;
    const Step ns = next(st);
    if (!nxt_loaded) load(nxt, ns);
    nxt_loaded = false;
    const int kt = ks + st.j * KS;
    if (kt < KT) tile_accumulate<BITS>(cur, m, zero, kt, c, ngroups_k, lb, 1.f, acc);
    if (ns.j == 0) {
      write_partials(acc, part[par][warp], g, c);
      __syncthreads();
      if (threadIdx.x < 16) {
        int slot, j0, nrows;
        slot_of(st.grp, slot, j0, nrows);
        const int rr = threadIdx.x;
        if (j0 + rr < nrows) {
          float gv = 0.f, uv = 0.f;
#pragma unroll
          for (int s2 = 0; s2 < KS; ++s2) {
            gv += part[par][s2][rr];
            uv += part[par][KS + s2][rr];
          }
          act[int64_t(slot) * I + j0 + rr] = silu_f(gv) * uv;
        }
      }
      par ^= 1;
    }
    st = ns;
    return true;
  };
  while (step(t0, t1) && step(t1, t0)) {
  }
  tc_mark(7);
}

// ------------------------------------------------------------------------------------------------ MoE down
// y[r] += Σ_e sel_w[e] · down_e[r] · act_e over the k routed experts and the shared one, as one GEMV
// over the concatenated input act [k·I + Is]: each 64-group belongs to one segment (expert), whose
// matrix, row stride and combine weight are looked up per group. 8 warps = 8 k-slices of one row block.
struct DownSeg {
  const char* q;
  const unsigned short* s;
  const unsigned short* b;
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
      t.s[h] = __ldg(sg.s + r * sg.gpr + Gl);
      t.b[h] = __ldg(sg.b + r * sg.gpr + Gl);
    } else {
      t.s[h] = t.b[h] = 0;
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
  __shared__ float epi_y[16];
  const int I = int(w.down.first.cols), Is = int(w.shared_down.cols), k = w.top_k;
  const int K = k * I + Is, KT = tc_kt(K), ngroups_k = K / kGroup, gI = I / kGroup;
  const TcSmem m = carve(reinterpret_cast<char*>(smem4), K, Prologue::None, 0);
  const char* zero = m.xf + KT * kTileXBytes;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const int ks = warp;
  const int iters = (KT + KS - 1) / KS;
  const int64_t rows = w.down.first.rows, nrb = (rows + 15) / 16;
  const LaneB<BITS> lb(lane);
  StageIn in;
  in.x = act;

  // The segment table and the first two tiles are set up before the PDL wait from the expert ids that
  // MoE gate/up's block 0 publishes before its trigger (read past L1, clamped to a valid expert), and
  // checked again after the wait: if they changed (this kernel did not follow a gate/up that published
  // them, e.g. without PDL), the table and tiles are redone. Weights only are read before the wait.
  auto set_seg = [&](int t, int id, float wt) {
    const QMatrixDev M = t < k ? w.down.expert(min(max(id, 0), w.E - 1)) : w.shared_down;
    DownSeg sg;
    sg.q = reinterpret_cast<const char*>(M.qweight);
    sg.s = reinterpret_cast<const unsigned short*>(M.scales);
    sg.b = reinterpret_cast<const unsigned short*>(M.biases);
    sg.row_bytes = int(M.cols * BITS / 8);
    sg.gpr = int(M.cols / kGroup);
    sg.wt = wt;
    seg[t] = sg;
  };
  auto next = [&](Step s2) { return next_step(s2, iters); };
  auto load = [&](TileRegs<BITS>& t, Step s2) {
    if (s2.grp < nrb && ks + s2.j * KS < KT)
      load_tile_down<BITS>(t, seg, gI, k, min(s2.grp * 16 + g, rows - 1), min(s2.grp * 16 + g + 8, rows - 1),
                           ks + s2.j * KS, c, ngroups_k);
  };
  tc_mark(0);
  int early_id = 0;
  float early_w = 0.f;
  if (threadIdx.x <= k) {
    const int t = threadIdx.x;
    early_id = t < k ? __ldcg(sel_ids + t) : 0;
    early_w = __ldcg(sel_w + t);
    set_seg(t, early_id, early_w);
  }
  __syncthreads();  // seg
  Step st{blockIdx.x, 0};
  TileRegs<BITS> t0, t1;  // swapping roles each step, as in the dense kernel
  load(t0, st);
  load(t1, next(st));
  pdl_wait();
  pdl_trigger();
  tc_mark(1);
  stage_issue(in, m, K);
  auto y_fetch = [&](int64_t grp) {
    if (threadIdx.x < 16 && grp < nrb && grp * 16 + threadIdx.x < rows) cp_async4(&epi_y[threadIdx.x], y + grp * 16 + threadIdx.x);
  };
  y_fetch(st.grp);
  // the re-read of the ids is in flight while the input is staged
  int id = 0;
  float wt = 0.f;
  if (threadIdx.x <= k) {
    id = threadIdx.x < k ? __ldcg(sel_ids + threadIdx.x) : 0;
    wt = __ldcg(sel_w + threadIdx.x);
  }
  stage_compute<BITS>(in, m, K, red);  // (its barriers: every thread's pre-wait reads of seg are done)
  tc_mark(3);
  bool changed = false;
  if (threadIdx.x <= k && (id != early_id || __float_as_uint(wt) != __float_as_uint(early_w))) {
    seg[threadIdx.x].wt = wt;
    if (id != early_id) {
      set_seg(threadIdx.x, id, wt);
      changed = true;
    }
  }
  if (__syncthreads_or(changed)) {  // seg
    load(t0, st);
    load(t1, next(st));
  }
  tc_mark(5);
  bool nxt_loaded = true;

  float acc[2] = {0.f, 0.f};
  int par = 0;
  auto step = [&](const TileRegs<BITS>& cur, TileRegs<BITS>& nxt) {
    if (st.grp >= nrb) return false;
    const Step ns = next(st);
    if (!nxt_loaded) load(nxt, ns);
    nxt_loaded = false;
    const int kt = ks + st.j * KS;
    if (kt < KT) {
      // the combine weight of this lane's group (the groups of one tile may span segments)
      const int G = kt * 4 + c;
      const float wt = G < ngroups_k ? seg[G < k * gI ? G / gI : k].wt : 0.f;
      tile_accumulate<BITS>(cur, m, zero, kt, c, ngroups_k, lb, wt, acc);
    }
    if (ns.j == 0) {
      write_partials(acc, part[par][warp], g, c);
      cp_async_wait_all();
      __syncthreads();
      if (threadIdx.x < 16) {
        const int64_t r = st.grp * 16 + threadIdx.x;
        if (r < rows) {
          float v = 0.f;
#pragma unroll
          for (int s2 = 0; s2 < KS; ++s2) v += part[par][s2][threadIdx.x];
          y[r] = epi_y[threadIdx.x] + v;
        }
      }
      par ^= 1;
      y_fetch(ns.grp);
    }
    st = ns;
    return true;
  };
  while (step(t0, t1) && step(t1, t0)) {
  }
  tc_mark(7);
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

int grid_of(int64_t groups, int occ) {
  return int(std::max<int64_t>(1, std::min<int64_t>(groups, int64_t(sm_count()) * occ)));
}

bool shape_ok(const QMatrixDev& W) {
  return (W.bits == 4 || W.bits == 8) && W.group_size == kGroup && W.cols % kGroup == 0 && W.cols > 0;
}
bool aligned16(const void* p) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

void gemv_tc_trace(unsigned long long* buf) {
  LILAC_CUDA_CHECK(cudaMemcpyToSymbol(g_tc_trace, &buf, sizeof(buf)));
}

bool gemv_tc_supported(const GemvArgs& a) {
  const int K = int(a.W.cols);
  if (!shape_ok(a.W) || !aligned16(a.x)) return false;
  if (a.pro == Prologue::RmsNorm && !aligned16(a.norm_w)) return false;
  if (a.pro == Prologue::GatedHeadNorm &&
      (a.head_dim <= 0 || a.head_dim % 4 != 0 || K % a.head_dim != 0 || !aligned16(a.z) || !aligned16(a.norm_w)))
    return false;
  if (a.conv_rows > 0 && (a.conv_k < 1 || a.conv_k > kMaxConvK)) return false;
  return size_t(tc_smem_bytes(K, a.pro, a.head_dim)) <= kMaxSmem;
}

void gemv_tc(const GemvArgs& a, cudaStream_t stream) {
  const int64_t K = a.W.cols, KT = tc_kt(int(K)), nrb = (a.W.rows + 15) / 16;
  // k-slices per row block: enough warps in flight (~3 blocks of 8 warps per SM) for small matrices.
  const int64_t target = int64_t(sm_count()) * kMinBlocks<4> * kWarps;
  int KS = 1;
  while (KS < kWarps && KS < KT && nrb * KS < target) KS *= 2;
  const size_t smem = size_t(tc_smem_bytes(int(K), a.pro, a.head_dim));
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

bool moe_tc_supported(const MoEDecodeWeights& w, const float* x, const float* norm_w, const float* act) {
  const int64_t n_act = w.top_k * w.down.first.cols + w.shared_down.cols;
  return shape_ok(w.gate.first) && shape_ok(w.up.first) && shape_ok(w.shared_gate) && shape_ok(w.shared_up) &&
         shape_ok(w.down.first) && shape_ok(w.shared_down) && w.gate.first.bits == w.down.first.bits &&
         aligned16(x) && aligned16(norm_w) && aligned16(act) &&
         size_t(tc_smem_bytes(int(w.gate.first.cols), Prologue::RmsNorm, 0)) <= kMaxSmem &&
         size_t(tc_smem_bytes(int(n_act), Prologue::None, 0)) <= kMaxSmem;
}

void moe_gate_up_tc(const MoEDecodeWeights& w, const float* logits, const float* x, const float* norm_w, float eps,
                    int32_t* sel_ids, float* sel_w, float* act, cudaStream_t stream) {
  const int K = int(w.gate.first.cols);
  const size_t smem = size_t(tc_smem_bytes(K, Prologue::RmsNorm, 0));
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
  const int K = int(w.top_k * w.down.first.cols + w.shared_down.cols);
  const size_t smem = size_t(tc_smem_bytes(K, Prologue::None, 0));
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
