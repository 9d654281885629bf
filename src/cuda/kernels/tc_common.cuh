// The tensor-core decode arithmetic shared by the single-row kernels (gemv/gemv_tc.cu) and the multi-row ones
// (rows/): the k-tile shape, the staged-fragment layout, nibble/byte → fp16 conversion, the power-of-two
// helpers of the input split, and where a weight row lives. One definition, so that a row computed by the
// rows kernels stays bit for bit the single-row kernels' (gemv_tc.cu explains the scheme).
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/kernels/gemv/gemv.h"
#include "cuda/kernels/ptx.cuh"
#include "cuda/kernels/qdot.cuh"
#include "cuda/kernels/qmatrix.cuh"

namespace lilac::cuda::tc {

constexpr int kThreads = 256, kWarps = 8;
constexpr int kTileCols = 256, kGroup = 64;
// Staged x fragments: per k-tile 1024 bytes, 16-byte units ordered [chunk i][unit u][thread c][hi/lo p], so that
// the 8 lanes that read one unit (c = 0..3, p = 0..1) read 128 contiguous bytes (no bank conflicts), followed by
// kZeroBytes of zeros (what the lanes that supply a zero B column read).
constexpr int kTileXBytes = 1024, kZeroBytes = 512;

template <int BITS>
struct TcShape {
  static constexpr int NCH = BITS == 4 ? 2 : 4;          // 16-byte chunks per thread per row and k-tile
  static constexpr int CPT = 4 * NCH;                    // chunks per row per k-tile
  static constexpr int U = BITS == 4 ? 4 : 2;            // fragment units (8 values) per chunk
  static constexpr int GROUP_BYTES = kGroup * BITS / 8;  // bytes of one group in a row
  static constexpr int TPM = BITS == 4 ? 2 : 4;          // rows per mma in the multi-row kernels
  static constexpr float ZC = BITS == 4 ? 8.f : 128.f;
  // group slot (0..3) of chunk i of thread c
  __host__ __device__ static constexpr int slot(int i, int c) { return BITS == 4 ? 2 * i + (c >> 1) : i; }
  // byte offset of chunk i of thread c inside its group
  __device__ static int off_in_group(int c) { return BITS == 4 ? 16 * (c & 1) : 16 * c; }
};

template <int BITS>
__host__ __device__ __forceinline__ int frag_off(int i, int u, int c, int p) {
  return (((i * TcShape<BITS>::U + u) * 4 + c) * 2 + p) * 16;
}
__host__ __device__ inline int tc_kt(int64_t K) { return int((K + kTileCols - 1) / kTileCols); }

// One 4-bit word (nibbles n0..n7) → fp16 pairs (n0-8, n4-8), (n1-8, n5-8), (n2-8, n6-8), (n3-8, n7-8).
__device__ __forceinline__ void dq4(uint32_t w, uint32_t (&h)[4]) {
  using dev::and_or;
  using dev::hfma2_u;
  using dev::hsub2_u;
  constexpr uint32_t kMagic = 0x64006400u;  // fp16 1024 in both halves
  constexpr uint32_t kSub = 0x64086408u;    // 1032
  constexpr uint32_t kInv16 = 0x2C002C00u;  // 1/16
  constexpr uint32_t kNeg72 = 0xD480D480u;  // -72
  const uint32_t w8 = w >> 8;
  h[0] = hsub2_u(and_or(w, 0x000F000Fu, kMagic), kSub);
  h[1] = hfma2_u(and_or(w, 0x00F000F0u, kMagic), kInv16, kNeg72);  // (1024 + 16n)/16 - 72
  h[2] = hsub2_u(and_or(w8, 0x000F000Fu, kMagic), kSub);
  h[3] = hfma2_u(and_or(w8, 0x00F000F0u, kMagic), kInv16, kNeg72);
}
// One 8-bit word (bytes b0..b3) → fp16 pairs (b0-128, b2-128), (b1-128, b3-128).
__device__ __forceinline__ void dq8(uint32_t w, uint32_t (&h)[2]) {
  constexpr uint32_t kSub = 0x64806480u;  // 1152
  h[0] = dev::hsub2_u(__byte_perm(w, 0x64646464u, 0x4240), kSub);
  h[1] = dev::hsub2_u(__byte_perm(w, 0x64646464u, 0x4341), kSub);
}

// 2^-e and 2^e as floats for e in [-126, 127] (exact, no libm).
__device__ __forceinline__ float pow2i(int e) { return __int_as_float((127 + e) << 23); }
// The power-of-two exponent E with m = mant·2^E, mant in [0.5, 1) (frexp), clamped to [-125, 126].
__device__ __forceinline__ int frexp_e(float m) {
  const int e = int((__float_as_uint(m) >> 23) & 0xFF) - 126;
  return m > 0.f ? max(-125, min(126, e)) : 0;
}
// A raw bf16 (low 16 bits) as a float.
__device__ __forceinline__ float bf_raw(uint32_t v) { return __uint_as_float(v << 16); }
// Sum over the 4 lanes of a row (c = 0..3): every lane gets the total.
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  v += __shfl_xor_sync(0xffffffffu, v, 2);
  return v;
}

// ------------------------------------------------------------------------------------------------ staging
// The input split both families' staging does (gemv_tc.cuh in the launch, rows/stage_rows.cu and the MoE rows
// kernels beforehand), one definition so that their fragments agree bit for bit.
// 8 values (one "unit": columns 8t..8t+7) of t(x), scaled by 2^-E of their group → the hi/lo fp16 fragments
// of one layout (units past K are zeros and give zero fragments).
template <int BITS>
__device__ __forceinline__ void split_unit(const float (&v)[8], float inv, uint4& hi4, uint4& lo4) {
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
  hi4 = make_uint4(hi[0], hi[1], hi[2], hi[3]);
  lo4 = make_uint4(lo[0], lo[1], lo[2], lo[3]);
}
// The 8 values of unit t (columns 8t .. 8t+7, t < K / 8) of t(x), from the staging's shared memory m (xs; nws the
// norm weights; zs, hss the gate and the heads' Σx² for GatedHeadNorm): RmsNorm x·scale·w, GatedHeadNorm
// x·rsqrt(Σx²/hd + eps)·w·silu(z), None x. Both families' staging (16-byte reads: a thread's 8 values are contiguous).
template <typename Smem>
__device__ __forceinline__ void unit_values(Prologue pro, const Smem& m, int t, float scale, int hd, float eps,
                                            float (&v)[8]) {
  const float4 xa = reinterpret_cast<const float4*>(m.xs)[2 * t], xb = reinterpret_cast<const float4*>(m.xs)[2 * t + 1];
  v[0] = xa.x, v[1] = xa.y, v[2] = xa.z, v[3] = xa.w, v[4] = xb.x, v[5] = xb.y, v[6] = xb.z, v[7] = xb.w;
  if (pro == Prologue::RmsNorm) {
    const float4 wa = reinterpret_cast<const float4*>(m.nws)[2 * t], wb = reinterpret_cast<const float4*>(m.nws)[2 * t + 1];
    const float w8[8] = {wa.x, wa.y, wa.z, wa.w, wb.x, wb.y, wb.z, wb.w};
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = v[j] * scale * w8[j];
  } else if (pro == Prologue::GatedHeadNorm) {
    const float4 za = reinterpret_cast<const float4*>(m.zs)[2 * t], zb = reinterpret_cast<const float4*>(m.zs)[2 * t + 1];
    const float z8[8] = {za.x, za.y, za.z, za.w, zb.x, zb.y, zb.z, zb.w};
    if (hd % 8 == 0) {  // the 8 values lie in one head
      const int h = (8 * t) / hd, d0 = 8 * t - h * hd;
      const float r = rsqrtf(m.hss[h] / float(hd) + eps);
      const float4 wa = reinterpret_cast<const float4*>(m.nws + d0)[0], wb = reinterpret_cast<const float4*>(m.nws + d0)[1];
      const float w8[8] = {wa.x, wa.y, wa.z, wa.w, wb.x, wb.y, wb.z, wb.w};
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = v[j] * r * w8[j] * ::lilac::cuda::dev::silu_f(z8[j]);
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int k = 8 * t + j, h = k / hd, d = k - h * hd;
        const float r = rsqrtf(m.hss[h] / float(hd) + eps);
        v[j] = v[j] * r * m.nws[d] * ::lilac::cuda::dev::silu_f(z8[j]);
      }
    }
  }
}
// Σx² of staging unit t's 8 values xs[8t .. 8t+8) (the RMSNorm's and the gated head norm's partial sums), in
// one fixed order: every staging (gemv_tc's in-block one, the rows stagings) adds the same terms the same way.
__device__ __forceinline__ float unit_sumsq(const float* xs, int t) {
  const float4 a = reinterpret_cast<const float4*>(xs)[2 * t], b = reinterpret_cast<const float4*>(xs)[2 * t + 1];
  return a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w + b.x * b.x + b.y * b.y + b.z * b.z + b.w * b.w;
}
// head_sums' general case, heads [h0, h1): a warp per head, lanes over the head's values, a butterfly sum. No barrier.
// Not inlined: inside gemv_tc's staging it cost gemv_tc<4,8> 4 bytes of spills (ptxas, sm_90a).
inline __device__ __noinline__ void head_sums_by_warp(const float* xs, float* hss, int hd, int h0, int h1) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int h = h0 + warp; h < h1; h += nw) {
    float ss = 0.f;
    for (int d = lane; d < hd; d += 32) ss += xs[h * hd + d] * xs[h * hd + d];
    ss = ::lilac::cuda::dev::warp_sum(ss);
    if (lane == 0) hss[h] = ss;
  }
}
// Per-head Σx² of the gated head norm into hss[h] for the heads of units [u0, u1) (whole heads; u0 a multiple of
// 32: a unit's lane is its index mod 32 as when one block stages the whole row, so each head's sum has the same
// bits however the row is cut): a lane per unit and butterfly sums where a head is a power-of-two number of units
// (at most 32), else a warp per head (no lane's 8 values need lie in one head). Fixed orders, no atomics: gemv_tc's
// staging and the rows stagings call this one function, so a row's norm is the same bits in every kernel and run.
// Every thread of the block calls it; ends with a barrier.
__device__ inline void head_sums(const float* xs, float* hss, int K, int hd, int u0, int u1) {
  const int n8 = min(K / 8, u1), lph = hd / 8;
  if (hd % 8 == 0 && lph <= 32 && (lph & (lph - 1)) == 0) {
    for (int t0 = u0; t0 < n8; t0 += blockDim.x) {  // whole warps iterate together (n8 % lph == 0)
      const int t = t0 + threadIdx.x;
      float ss = 0.f;
      if (t < n8) ss = unit_sumsq(xs, t);
      for (int o = 1; o < lph; o <<= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
      if (t < n8 && t % lph == 0) hss[t / lph] = ss;
    }
  } else {
    head_sums_by_warp(xs, hss, hd, 8 * u0 / hd, 8 * n8 / hd);
  }
  __syncthreads();
}
// Byte offset of unit t's hi fragment inside a row's fragments (lo: +16).
template <int BITS>
__device__ __forceinline__ int unit_off(int t) {
  using S = TcShape<BITS>;
  const int q = t / S::U, u = t % S::U, kt = q / S::CPT, rem = q % S::CPT;
  return kt * kTileXBytes + frag_off<BITS>(rem / 4, u, rem % 4, 0);
}
// E and Σx of the 64-group of this lane's unit (8 lanes per group): the lane's own sum
// in order, then a butterfly over the 8 lanes (every lane ends with the same bits). All 32 lanes must call.
__device__ __forceinline__ void group_meta(const float (&v)[8], int& E, float& sum) {
  float mx = 0.f;
  sum = 0.f;
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
  E = frexp_e(mx);
}

// One step of a warp's tile sequence in the decode GEMVs: the group of row blocks and the k-tile.
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

// Where one row of weights lives: its packed words, scales and biases.
struct RowRef {
  const char* q = nullptr;
  const unsigned short* s = nullptr;
  const unsigned short* b = nullptr;
};
__device__ __forceinline__ RowRef row_ref(const QMatrixDev& W, int64_t r, int bits) {
  const int64_t gpr = W.cols / kGroup;
  RowRef ref;
  ref.q = reinterpret_cast<const char*>(W.qweight) + r * (W.cols * bits / 8);
  ref.s = reinterpret_cast<const unsigned short*>(W.scales) + r * gpr;
  ref.b = reinterpret_cast<const unsigned short*>(W.biases) + r * gpr;
  return ref;
}

// The weight words lane c loads of k-tile kt of rows (g, g+8): NCH 16-byte chunks per row, chunk i at byte
// off_in_group(c) of group 4·kt + slot(i, c); groups past `ngroups` are zeros (their staged input is zero too).
// Every decode GEMV loads its tiles this way (the group layout trades them between lanes afterwards).
template <int BITS>
__device__ __forceinline__ void load_tile_words(uint4 (&w)[2][TcShape<BITS>::NCH], const RowRef (&r)[2], int kt, int c,
                                                int ngroups) {
  using S = TcShape<BITS>;
#pragma unroll
  for (int i = 0; i < S::NCH; ++i) {
    const int G = kt * 4 + S::slot(i, c);
    const bool ok = G < ngroups;
#pragma unroll
    for (int h = 0; h < 2; ++h)
      w[h][i] = ok ? dev::ld_stream(reinterpret_cast<const uint4*>(r[h].q + G * S::GROUP_BYTES + S::off_in_group(c)))
                   : make_uint4(0, 0, 0, 0);
  }
}

}  // namespace lilac::cuda::tc
