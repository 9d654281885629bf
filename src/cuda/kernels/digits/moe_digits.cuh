// Device pieces shared by the digits MoE's one-row and rows kernels (moe_digits_one.cu, moe_digits_rows.cu): the
// weight tiles read in the checkpoint layout (moe_digits.h), the launch constants, the persistent grid size.
#pragma once
#include <algorithm>
#include <cstdint>

#include "cuda/cuda_common.h"
#include "cuda/kernels/digits/digits_tile.cuh"
#include "cuda/kernels/launch.cuh"
#include "cuda/kernels/ptx.cuh"
#include "cuda/kernels/qdot.cuh"
#include "cuda/kernels/qmatrix.cuh"

namespace lilac::cuda::digits::moe_dev {

using ::lilac::cuda::dev::block_sum;
using ::lilac::cuda::dev::cp_async16;
using ::lilac::cuda::dev::cp_async16_zfill;
using ::lilac::cuda::dev::cp_async4;
using ::lilac::cuda::dev::cp_async8;
using ::lilac::cuda::dev::cp_async_commit;
using ::lilac::cuda::dev::cp_async_wait;
using ::lilac::cuda::dev::cp_async_wait_all;
using ::lilac::cuda::dev::lds128;
using ::lilac::cuda::dev::pdl_trigger;
using ::lilac::cuda::dev::pdl_wait;
using ::lilac::cuda::dev::silu_f;
using ::lilac::cuda::dev::smem_u32;
using tile::bf_lo;

constexpr int kThreads = 256, kWarps = 8, kSlice = 8, kL = 3;
constexpr int kMaxH = 2048, kMaxSlots = 32;

__device__ __forceinline__ uint2 ld_stream8(const char* p) {
  uint2 r;
  asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];" : "=r"(r.x), "=r"(r.y) : "l"(p));
  return r;
}

// One warp's 16-row block of a matrix in the checkpoint layout: this lane's bytes of rows g8 and g8 + 8 (clamped
// to the matrix) at column 16c of group 0, and their scale / bias entries of group 0.
struct Src {
  const char* q0;
  const char* q1;
  const unsigned short *s0, *s1, *b0, *b1;
};
__device__ __forceinline__ Src src_of(const QMatrixDev& m, int64_t row0, int g8, int c) {
  const int64_t rb = m.cols / 2, G = m.cols / 64;
  const int64_t r0 = min(row0 + g8, m.rows - 1), r1 = min(row0 + g8 + 8, m.rows - 1);
  const char* q = reinterpret_cast<const char*>(m.qweight) + c * 8;
  const unsigned short* s = reinterpret_cast<const unsigned short*>(m.scales);
  const unsigned short* b = reinterpret_cast<const unsigned short*>(m.biases);
  return Src{q + r0 * rb, q + r1 * rb, s + r0 * G, s + r1 * G, b + r0 * G, b + r1 * G};
}
// A tile's registers; scale and bias stay raw bf16 until used (issuing the loads never waits for them).
struct Tile {
  uint2 q0, q1;
  uint32_t s0, b0, s1, b1;
};
__device__ __forceinline__ Tile fetch(const Src& s, int g) {
  Tile t;
  t.q0 = ld_stream8(s.q0 + g * 32);
  t.q1 = ld_stream8(s.q1 + g * 32);
  t.s0 = __ldg(s.s0 + g);
  t.b0 = __ldg(s.b0 + g);
  t.s1 = __ldg(s.s1 + g);
  t.b1 = __ldg(s.b1 + g);
  return t;
}
// The A fragments as tile_math takes them: rows g8 / g8 + 8 of the first 8 columns, then of the next 8.
__device__ __forceinline__ uint4 wq(const Tile& t) { return make_uint4(t.q0.x, t.q1.x, t.q0.y, t.q1.y); }

// Thread t's 8 values of a row staged in shared memory (columns 8t..8t+7; two 16-byte reads).
__device__ __forceinline__ void row8(const float* xs, int t, float (&v)[8]) {
  const float4 a = reinterpret_cast<const float4*>(xs)[2 * t], b = reinterpret_cast<const float4*>(xs)[2 * t + 1];
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

// Value i (0..7) of 8 consecutive raw bf16 values held as one 16-byte load (a slice's scales or biases of a row).
__device__ __forceinline__ float bf_half(const uint4& v, int i) {
  const uint32_t w = (i >> 1) == 0 ? v.x : (i >> 1) == 1 ? v.y : (i >> 1) == 2 ? v.z : v.w;
  return (i & 1) ? __uint_as_float(w & 0xFFFF0000u) : __uint_as_float(w << 16);
}

// Persistent grids: the blocks that fit at once, at most one per item.
template <typename Kern>
inline int grid_for(Kern kernel, size_t smem, int64_t items) {
  if (smem > 48 * 1024) LILAC_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  int occ = 0;
  LILAC_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kernel, kThreads, smem));
  return int(std::max<int64_t>(1, std::min<int64_t>(items, int64_t(sm_count()) * std::max(occ, 1))));
}

}  // namespace lilac::cuda::digits::moe_dev
