// The pieces the chunked Gated DeltaNet prefill's two files share (gdn_chunked.cu: token prep, chunk kernel, gated
// norm, the entry point; gdn_state.cu: the sequential state pass): the chunk length, the tf32 fragment products, the
// scratch layout. gdn_chunked.cu's header comment explains the math.
#pragma once
#include <cstdint>
#include <string>

#include "core/error.h"
#include "cuda/kernels/gdn/gdn.h"
#include "cuda/kernels/ptx.cuh"

namespace lilac::cuda::gdnc {

constexpr int CH = 64;        // chunk length
constexpr int THREADS = 256;  // 8 warps in the chunk and state kernels

inline void check_launch(const char* what) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw Error(std::string(what) + ": launch failed: " + cudaGetErrorString(e));
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// ---- tensor-core helpers (mma.sync m16n8k8, tf32 operands, fp32 accumulators)
// Fragment layout (PTX ISA, m16n8k8 .tf32): g = lane / 4, q = lane % 4
//   A (16×8): a0 (g, q)  a1 (g+8, q)  a2 (g, q+4)  a3 (g+8, q+4)
//   B (8×8):  b0 (k=q, n=g)  b1 (k=q+4, n=g)
//   C (16×8): c0 (g, 2q)  c1 (g, 2q+1)  c2 (g+8, 2q)  c3 (g+8, 2q+1)
using dev::cvt_rna_tf32;
using dev::mma_m16n8k8_tf32;

// Products of fp32 fragments: SPLIT = 3xTF32 (a = ah + al, b = bh + bl; ah·bh + ah·bl + al·bh), relative error
// ~1e-6 like fp32; otherwise one tf32 product (operands rounded to 10 mantissa bits). Each fragment is split once
// (cvt_frag) and reused by every product it enters (mma_acc).
//
// cvt_frag, SPLIT: hi = x with its low 13 mantissa bits cleared (one LOP3) and lo = x − hi (exact in fp32; the tensor
// core reads only its top 19 bits, so lo is truncated there): |x − hi − lo| ≤ 2⁻²⁰|x|, the accuracy of 3xTF32.
// (cvt.rna.tf32.f32 is emulated on sm_90, ~5 instructions, and two per operand were half of the state pass's
// instructions: bench/GPU_NOTES.md "Twenty-first stop".) Otherwise one tf32 operand rounded to nearest.
template <bool SPLIT, int N>
__device__ __forceinline__ void cvt_frag(const float* x, uint32_t* hi, uint32_t* lo) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
    if constexpr (SPLIT) {
      hi[i] = __float_as_uint(x[i]) & 0xffffe000u;
      lo[i] = __float_as_uint(x[i] - __uint_as_float(hi[i]));
    } else {
      hi[i] = cvt_rna_tf32(x[i]);
    }
  }
}
// c += ah·bh; with SPLIT also cl += al·bh + ah·bl (a second accumulator: independent mma chains).
template <bool SPLIT>
__device__ __forceinline__ void mma_acc(float c[4], float cl[4], const uint32_t ah[4], const uint32_t al[4],
                                        const uint32_t bh[2], const uint32_t bl[2]) {
  if constexpr (SPLIT) {
    mma_m16n8k8_tf32(cl, al, bh);
    mma_m16n8k8_tf32(cl, ah, bl);
  }
  mma_m16n8k8_tf32(c, ah, bh);
}

// A fragment of a row-major matrix (element (m, k) at p[m*ld + k]), tile origin (m0, k0).
__device__ __forceinline__ void frag_a(float a[4], const float* p, int ld, int m0, int k0, int g, int q) {
  a[0] = p[(m0 + g) * ld + k0 + q];
  a[1] = p[(m0 + g + 8) * ld + k0 + q];
  a[2] = p[(m0 + g) * ld + k0 + q + 4];
  a[3] = p[(m0 + g + 8) * ld + k0 + q + 4];
}
// B fragment of a row-major [k][n] matrix (element (k, n) at p[k*ld + n]).
__device__ __forceinline__ void frag_b_kn(float b[2], const float* p, int ld, int k0, int n0, int g, int q) {
  b[0] = p[(k0 + q) * ld + n0 + g];
  b[1] = p[(k0 + q + 4) * ld + n0 + g];
}
// B fragment of an [n][k] matrix (element (k, n) at p[n*ld + k]), i.e. Mᵀ of a row-major M.
__device__ __forceinline__ void frag_b_nk(float b[2], const float* p, int ld, int k0, int n0, int g, int q) {
  b[0] = p[(n0 + g) * ld + k0 + q];
  b[1] = p[(n0 + g) * ld + k0 + q + 4];
}

// ---- cp.async (ptx.cuh)
using dev::cp_async16;
using dev::cp_async16_zfill;
using dev::cp_async_commit;
using dev::cp_async_wait;

// ---- scratch layout (floats)
__host__ __device__ inline int64_t round4(int64_t x) { return (x + 3) & ~int64_t(3); }

struct Work {
  float* qn;    // [n][Hk][dk]  q̂ (normed, scaled by 1/sqrt(dk))
  float* kn;    // [n][Hk][dk]  k̂
  float* glog;  // [n][Hv]      g (log decay)
  float* beta;  // [n][Hv]
  float* W;     // [chunks][Hv][CH][dk]
  float* U;     // [chunks][Hv][CH][dv]
  float* P;     // [chunks][Hv][CH][CH]
  float* G;     // [chunks][Hv][CH]  cumulative g inside the chunk
};

__host__ __device__ inline Work work_view(float* w, int n, int Hk, int Hv, int dk, int dv) {
  const int64_t nch = (n + CH - 1) / CH;
  Work v;
  v.qn = w;
  v.kn = v.qn + int64_t(n) * Hk * dk;
  v.glog = v.kn + int64_t(n) * Hk * dk;
  v.beta = v.glog + round4(int64_t(n) * Hv);
  v.W = v.beta + round4(int64_t(n) * Hv);
  v.U = v.W + nch * Hv * CH * dk;
  v.P = v.U + nch * Hv * CH * dv;
  v.G = v.P + nch * Hv * CH * CH;
  return v;
}

inline size_t work_floats(int n, int Hk, int Hv, int dk, int dv) {
  const int64_t nch = (n + CH - 1) / CH;
  return size_t(2 * int64_t(n) * Hk * dk + 2 * round4(int64_t(n) * Hv) + nch * Hv * CH * (dk + dv + CH + 1)) + 4;
}

// (3) the state pass for the chunks prepared in w (gdn_state.cu): the product precision (3xTF32 or TF32) and the
// value-column block of its blocks (16, 32, or 64 with dk 128).
void state_pass(const GdnPrefillArgs& a, const Work& w, bool split, int cols, cudaStream_t stream);

}  // namespace lilac::cuda::gdnc
