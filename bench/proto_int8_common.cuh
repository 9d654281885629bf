// The pieces bench/proto_int8_rows.cu (dense shapes) and bench/proto_int8_moe.cu (the routed MoE) share: the
// arithmetic of the 4-bit matrices on the integer tensor cores (proto_int8_rows.cu's header explains it), the input
// digits' staging, one weight tile's math, the packed weights' reference decoding, random weights, PDL launches and
// the graph timer. Prototypes, not part of the build (bench/BENCHMARKS.md "Twelfth stop").
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "cuda/kernels/ptx.cuh"  // ld_stream, PDL, cp.async

#define CK(x)                                                      \
  do {                                                             \
    cudaError_t e_ = (x);                                          \
    if (e_ != cudaSuccess) {                                       \
      std::printf("%s: %s\n", #x, cudaGetErrorString(e_));         \
      std::exit(1);                                                \
    }                                                              \
  } while (0)

namespace proto_i8 {
using namespace lilac::cuda::dev;

constexpr int kThreads = 256, kWarps = 8, kSliceGroups = 8;

__device__ __forceinline__ void mma_u8s8(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}


__device__ __forceinline__ float bf_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf_hi(uint32_t w) { return __uint_as_float(w & 0xFFFF0000u); }

// Staging: a thread per (row m < Mpad, group g): the 64 values' exponent, digits and sum.
template <int L>
__global__ void stage_digits(const float* x, int M, int Mpad, int K, char* xq, float2* meta) {
  constexpr int B = 8 * L - 3;
  const int G = K / 64;
  const int id = blockIdx.x * blockDim.x + threadIdx.x;
  if (id >= Mpad * G) return;
  const int m = id % Mpad, g = id / Mpad;
  float v[64];
  float mx = 0.f, sum = 0.f;
  for (int i = 0; i < 64; ++i) {
    v[i] = m < M ? x[int64_t(m) * K + 64 * g + i] : 0.f;
    mx = fmaxf(mx, fabsf(v[i]));
    sum += v[i];
  }
  int e = 0;
  frexpf(mx, &e);  // mx < 2^e
  uint8_t d[L][64];
  for (int i = 0; i < 64; ++i) {
    int q = int(rintf(ldexpf(v[i], B - e)));  // |q| <= 2^B
    for (int l = L - 1; l >= 1; --l) {
      const int r = ((q + 128) & 255) - 128;
      d[l][i] = uint8_t(int8_t(r));
      q = (q - r) / 256;
    }
    d[0][i] = uint8_t(int8_t(q));
  }
  for (int l = 0; l < L; ++l) {
    char* dst = xq + ((int64_t(l) * G + g) * Mpad + m) * 64;
    for (int c = 0; c < 4; ++c)
      for (int j = 0; j < 4; ++j)
        for (int i = 0; i < 4; ++i) dst[c * 16 + j * 4 + i] = char(d[l][16 * j + 4 * c + i]);
  }
  meta[int64_t(g) * Mpad + m] = make_float2(ldexpf(1.f, e - B), sum);
}

// One weight tile (16 rows × one 64-group) against J n-tiles of rows: the digits' mmas, then per (output, row)
// y = fma(scale, float(Σ q·v)·2^(E-B), y); y = fma(bias, Σx, y). xb: this lane's B unit of digit 0 (shared
// memory address), lstep: to the next digit; mp: this lane's meta pair of n-tile 0.
template <int L, int J>
__device__ __forceinline__ void tile_math(const uint4 w, uint32_t s0, uint32_t s1, uint32_t xb, uint32_t lstep,
                                          const float2* mp, float (&acc)[J][4]) {
  constexpr uint32_t kM = 0x0F0F0F0Fu;
  const uint32_t a0[4] = {w.x & kM, w.y & kM, (w.x >> 4) & kM, (w.y >> 4) & kM};
  const uint32_t a1[4] = {w.z & kM, w.w & kM, (w.z >> 4) & kM, (w.w >> 4) & kM};
  const float ws[2] = {bf_lo(s0), bf_lo(s1)}, wb[2] = {bf_hi(s0), bf_hi(s1)};
#pragma unroll
  for (int j = 0; j < J; ++j) {
    int d[L][4];
#pragma unroll
    for (int l = 0; l < L; ++l) {
      d[l][0] = d[l][1] = d[l][2] = d[l][3] = 0;
      uint4 b;
      asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];"
                   : "=r"(b.x), "=r"(b.y), "=r"(b.z), "=r"(b.w)
                   : "r"(xb + l * lstep + j * 512));
      mma_u8s8(d[l], a0, b.x, b.y);
      mma_u8s8(d[l], a1, b.z, b.w);
    }
    const float4 mm = *reinterpret_cast<const float4*>(mp + 8 * j);  // columns 2c, 2c+1
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      int S = d[0][v];
#pragma unroll
      for (int l = 1; l < L; ++l) S = S * 256 + d[l][v];
      const float p2 = (v & 1) ? mm.z : mm.x, xsum = (v & 1) ? mm.w : mm.y;
      acc[j][v] = fmaf(ws[v >> 1], float(S) * p2, acc[j][v]);
      acc[j][v] = fmaf(wb[v >> 1], xsum, acc[j][v]);
    }
  }
}

// q of packed weights at (row o, column k)
__device__ int q_at(const uint4* qp, int G, int o, int k) {
  const int rb = o / 16, r = o % 16, g8 = r % 8, h = r / 8, g = k / 64, kk = k % 64;
  const int half = kk / 32, k2 = kk % 32, hi = k2 / 16, k3 = k2 % 16, c = k3 / 4, i = k3 % 4;
  const uint4 w = qp[(int64_t(rb) * G + g) * 32 + 4 * g8 + c];
  const uint32_t word = (2 * half + h) == 0 ? w.x : (2 * half + h) == 1 ? w.y : (2 * half + h) == 2 ? w.z : w.w;
  return int((word >> (8 * i + 4 * hi)) & 15u);
}

// Host: bf16 bits of f (round to nearest even).
inline uint32_t bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
}

// Host: random {scale, bias} words of 4-bit groups (scale 0.01..., bias about -8·scale: MLX's affine zero point).
inline void random_scales(std::vector<uint32_t>& hs, std::mt19937& rng, std::normal_distribution<float>& nd) {
  for (auto& v : hs) {
    const float sc = 0.01f + 0.01f * std::fabs(nd(rng));
    v = bf16_bits(sc) | (bf16_bits(-8.f * sc + 0.002f * nd(rng)) << 16);
  }
}

// A launch with programmatic dependent launch, as the decode kernels are launched.
template <typename Kernel, typename... Ts>
void launch_pdl(Kernel k, int grid, int threads, size_t smem, cudaStream_t st, Ts... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(grid));
  cfg.blockDim = dim3(unsigned(threads));
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  CK(cudaLaunchKernelEx(&cfg, k, args...));
}

// µs per run(): a graph of 20 runs, one warm-up replay, the best of 10 replays.
template <typename Run>
double graph_us(cudaStream_t st, Run&& run) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < 20; ++i) run(i);
  CK(cudaStreamEndCapture(st, &graph));
  CK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaGraphLaunch(exec, st));
  float best = 1e30f;
  for (int rep = 0; rep < 10; ++rep) {
    CK(cudaEventRecord(e0, st));
    CK(cudaGraphLaunch(exec, st));
    CK(cudaEventRecord(e1, st));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    best = std::min(best, ms);
  }
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  return best * 1000.0 / 20;
}

}  // namespace proto_i8
