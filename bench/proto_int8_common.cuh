// The routed-MoE prototype's pieces (bench/proto_int8_moe.cu): the input digits' staging, the packed weights'
// reference decoding, random weights; one weight tile's math is the engine's, PDL launches and the graph timer as
// bench/proto_common.cuh says
// (src/cuda/kernels/digits/digits_tile.cuh, whose digits.h explains the arithmetic). Not part of the build
// (bench/BENCHMARKS.md "Twelfth stop"; the dense prototype, bench/proto_int8_rows.cu, became src/cuda/kernels/digits/
// in the thirteenth stop and is in the history at 97c3d76).
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

#include "cuda/kernels/digits/digits_tile.cuh"  // the tile math (the engine's)
#include "cuda/kernels/launch.cuh"              // launch_pdl
#include "cuda/kernels/ptx.cuh"                 // ld_stream, PDL, cp.async
#include "proto_common.cuh"                     // CK, graph_us

namespace proto_i8 {
using namespace lilac::cuda::dev;
using ::lilac::cuda::launch_pdl;
using ::proto::graph_us;

constexpr int kThreads = 256, kWarps = 8, kSliceGroups = 8;

using ::lilac::cuda::digits::tile::bf_hi;
using ::lilac::cuda::digits::tile::bf_lo;
using ::lilac::cuda::digits::tile::tile_math;

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

}  // namespace proto_i8
