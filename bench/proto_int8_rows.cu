// Prototype (not part of the build; bench/BENCHMARKS.md "Twelfth stop" quotes its output): the 4-bit GEMV over
// M input rows on the integer tensor cores. The question it answers: how fast can the rows step's 4-bit matrices
// be once the weights need no fp16 dequantization and one dequantized tile serves every row of the batch?
//
// Arithmetic. Each input row's 64-group is scaled by a power of two 2^E >= max|x| and rounded to a (8L - 3)-bit
// integer v, written as L signed base-256 digits (the first |d0| <= 33, the others in [-128, 127]). The 4-bit
// weights q (0..15) are the u8 A operand of mma.m16n8k32.u8.s8 as they are (no zero point, no conversion beyond
// splitting nibbles into bytes), the digits the s8 B operand (one n-tile per digit and 8 rows), so every group
// dot Σ q·d_l is an exact int32, and Σ q·v = (S0·256 + S1)·256 + S2 (|Σ q·v| <= 64·15·2^21 < 2^31) is exact too.
// The float part per (output, row, group): y = fma(scale, float(Σ q·v)·2^(E-B), y); y = fma(bias, Σx, y), in group
// order inside fixed 8-group slices, the slices' sums added in order (so the result does not depend on M or on
// how a kernel splits K: a kernel with the whole K in one block folds the slices in registers, one with a block
// per slice writes per-slice partials that a second launch folds in the same order, one with a warp per slice
// folds through shared memory; every configuration's output is compared with the first one's by memcmp).
// Also the MoE's routed gate/up (PROTO_MOE=1): a row's 8 experts and the shared one, chunks of <= 8 rows.
//
// Weights are packed as a load-time repack would: per 16-row block and 64-group 512 bytes, lane l's 16 bytes
// being exactly its A fragments of the group's two k32 steps (low nibbles: k 4c..4c+3, high: 16 + 4c ..), and
// per (block, group) 16 words {bf16 scale, bf16 bias}. Bytes per weight as MLX's layout.
//
// Output per case: µs per launch (a graph of 20 launches with PDL over weight copies >= 256 MB, as
// bench_kernels_rows), the weight stream rate, and the error against a double-precision reference next to a
// plain fp32 GEMV's error (the yardstick: the CPU reference computes in fp32).
// nvcc -O3 -std=c++20 -arch=sm_90a -I src -o proto_int8_rows bench/proto_int8_rows.cu
// PROTO_ONE="name,M,L,cfg" runs one case once, untimed (for Nsight Compute); PROTO_MOE=1 (or =M for one M) the
// routed MoE instead of the dense shapes.
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

namespace {
using namespace lilac::cuda::dev;

constexpr int kThreads = 256, kWarps = 8, kSliceGroups = 8;

struct Args {
  const uint4* qp;     // [rows/16][G][32 lanes] 16 bytes
  const uint32_t* sb;  // [rows/16][G][16] {bf16 scale (low), bf16 bias (high)}
  int rows, K;
  const char* xq;      // [L][G][Mpad][64] digit bytes, per (row, group) 4 words per quad lane c
  const float2* meta;  // [G][Mpad] {2^(E-B), Σx}
  int M, Mpad;
  int Gs, KS;          // groups per block range, ranges (KS = G / Gs)
  float* out;          // KS == 1: y [M][rows]; else partials [KS][M][rows]
};


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

// The MoE kernel's D weight tiles in flight per warp (registers): tile i of the warp's sequence sits in slot i % D.
template <int D>
struct TileRing {
  uint4 w[D];
  uint32_t s0[D], s1[D];
  const uint4* lw = nullptr;     // the next tile to request: this lane's 16 bytes
  const uint32_t* ls = nullptr;  // its scale words of rows g and g + 8
  __device__ __forceinline__ void fetch(int i) {
    w[i] = ld_stream(lw);
    s0[i] = __ldg(ls);
    s1[i] = __ldg(ls + 8);
  }
  __device__ __forceinline__ void advance(int64_t tiles) {
    lw += tiles * 32;
    ls += tiles * 16;
  }
};

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

// Warp w of block b: range ks = b % KS, row blocks rb0 + i·stride, n-tiles jb .. jb + J - 1 of the rows (JS warps
// share a row block when the rows need more than J n-tiles: each loads the weight tile, the second from L2).
// D: weight tiles in flight per warp.
template <int L, int J, int JS, int D>
__global__ void __launch_bounds__(kThreads, 2) gemv_i8(Args a) {
  extern __shared__ uint4 sm4[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g8 = lane >> 2, c = lane & 3;
  const int G = a.K / 64, Gs = a.Gs, KS = a.KS, nrb = a.rows / 16, Mpad = a.Mpad;
  const int ks = blockIdx.x % KS, g0 = ks * Gs;
  constexpr int WR = kWarps / JS;  // row blocks per block at a time
  const int stride = (gridDim.x / KS) * WR, rb0 = (blockIdx.x / KS) * WR + warp / JS, jb = (warp % JS) * J;
  char* xs = reinterpret_cast<char*>(sm4);
  float2* ms = reinterpret_cast<float2*>(xs + size_t(L) * Gs * Mpad * 64);

  // The load cursor walks this warp's tiles (Gs groups of a row block, then the next row block) D tiles ahead
  // of the compute cursor; both step by constants.
  uint4 pw[D];
  uint32_t ps0[D], ps1[D];
  const uint4* lw = a.qp + (int64_t(rb0) * G + g0) * 32 + lane;
  const uint32_t* ls = a.sb + (int64_t(rb0) * G + g0) * 16 + g8;
  const int64_t jump = int64_t(stride) * G - Gs;  // tiles from a range's end to the next row block's range
  int lrb = rb0, lg = Gs;
  auto load = [&](int i) {
    if (lrb < nrb) {
      pw[i] = ld_stream(lw);
      ps0[i] = __ldg(ls);
      ps1[i] = __ldg(ls + 8);
    }
    lw += 32;
    ls += 16;
    if (--lg == 0) {
      lg = Gs;
      lw += jump * 32;
      ls += jump * 16;
      lrb += stride;
    }
  };
#pragma unroll
  for (int i = 0; i < D; ++i) load(i);
  pdl_wait();
  pdl_trigger();
  {
    // only the present rows' units: the padding columns' products are never stored
    const int per_l = Gs * Mpad * 4, n4 = Gs * a.M * 4;  // uint4 per digit in shared memory / copied
    const uint4* src = reinterpret_cast<const uint4*>(a.xq);
    uint4* dst = reinterpret_cast<uint4*>(xs);
    for (int l = 0; l < L; ++l)
      for (int i = threadIdx.x; i < n4; i += kThreads) {
        const int u = ((i >> 2) / a.M * Mpad + (i >> 2) % a.M) * 4 + (i & 3);
        dst[l * per_l + u] = src[(int64_t(l) * G + g0) * Mpad * 4 + u];
      }
    for (int i = threadIdx.x; i < Gs * a.M; i += kThreads) {
      const int u = i / a.M * Mpad + i % a.M;
      ms[u] = a.meta[int64_t(g0) * Mpad + u];
    }
  }
  __syncthreads();

  float acc[J][4], tot[J][4];
#pragma unroll
  for (int j = 0; j < J; ++j)
#pragma unroll
    for (int v = 0; v < 4; ++v) acc[j][v] = tot[j][v] = 0.f;

  // compute cursor: this lane's B units and meta of group gl, its outputs' base
  const uint32_t xb0 = uint32_t(__cvta_generic_to_shared(xs)) + (8 * jb + g8) * 64 + c * 16;
  const uint32_t lstep = uint32_t(Gs * Mpad * 64), gstep = uint32_t(Mpad * 64);
  const float2* mp0 = ms + 8 * jb + 2 * c;
  uint32_t xb = xb0;
  const float2* mp = mp0;
  int rb = rb0, gl = 0;
  float* ob = a.out + int64_t(ks) * a.M * a.rows + int64_t(8 * jb + 2 * c) * a.rows + g8;
  const int mrem = a.M - (8 * jb + 2 * c);  // rows of this lane's column pair that exist: m = 8j + (v & 1) < mrem
  for (;;) {
#pragma unroll
    for (int i = 0; i < D; ++i) {
      if (rb >= nrb) return;
      const uint4 w = pw[i];
      const uint32_t s0 = ps0[i], s1 = ps1[i];
      load(i);
      tile_math<L, J>(w, s0, s1, xb, lstep, mp, acc);
      ++gl;
      xb += gstep;
      mp += Mpad;
      if ((gl & (kSliceGroups - 1)) == 0) {  // a slice ends: fold it
#pragma unroll
        for (int j = 0; j < J; ++j)
#pragma unroll
          for (int v = 0; v < 4; ++v) {
            tot[j][v] += acc[j][v];
            acc[j][v] = 0.f;
          }
      }
      if (gl == Gs) {  // the range ends: this row block's outputs
        float* o = ob + rb * 16;
#pragma unroll
        for (int j = 0; j < J; ++j)
#pragma unroll
          for (int v = 0; v < 4; ++v) {
            if (8 * j + (v & 1) < mrem) o[int64_t(8 * j + (v & 1)) * a.rows + 8 * (v >> 1)] = tot[j][v];
            tot[j][v] = 0.f;
          }
        gl = 0;
        xb = xb0;
        mp = mp0;
        rb += stride;
      }
    }
  }
}

// Small M: the whole K staged once per block, KW = G / 8 warps per row block, warp kw the 8-group slice kw; the
// slices' sums folded in slice order through shared memory by the row block's first warp (the same bits as the
// kernel above: that fold is its register fold).
template <int L, int J, int KW, int D>
__global__ void __launch_bounds__(kThreads, 2) gemv_i8_kw(Args a) {
  extern __shared__ uint4 sm4[];
  __shared__ float part[kWarps][4 * J][32];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g8 = lane >> 2, c = lane & 3;
  const int G = a.K / 64, nrb = a.rows / 16, Mpad = a.Mpad;
  constexpr int WR = kWarps / KW;
  const int kw = warp % KW, stride = gridDim.x * WR, g0 = kSliceGroups * kw;
  int rb = blockIdx.x * WR + warp / KW;
  char* xs = reinterpret_cast<char*>(sm4);
  float2* ms = reinterpret_cast<float2*>(xs + size_t(L) * G * Mpad * 64);

  uint4 pw[D];
  uint32_t ps0[D], ps1[D];
  const uint4* lw = a.qp + (int64_t(rb) * G + g0) * 32 + lane;
  const uint32_t* ls = a.sb + (int64_t(rb) * G + g0) * 16 + g8;
  const int64_t jump = int64_t(stride) * G - kSliceGroups;
  int lrb = rb, lg = kSliceGroups;
  auto load = [&](int i) {
    if (lrb < nrb) {
      pw[i] = ld_stream(lw);
      ps0[i] = __ldg(ls);
      ps1[i] = __ldg(ls + 8);
    }
    lw += 32;
    ls += 16;
    if (--lg == 0) {
      lg = kSliceGroups;
      lw += jump * 32;
      ls += jump * 16;
      lrb += stride;
    }
  };
#pragma unroll
  for (int i = 0; i < D; ++i) load(i);
  pdl_wait();
  pdl_trigger();
  {
    // only the present rows' units: the padding columns' products are never stored
    const int n4 = L * G * a.M * 4;
    const uint4* src = reinterpret_cast<const uint4*>(a.xq);
    uint4* dst = reinterpret_cast<uint4*>(xs);
    for (int i = threadIdx.x; i < n4; i += kThreads) {
      const int u = ((i >> 2) / a.M * Mpad + (i >> 2) % a.M) * 4 + (i & 3);
      dst[u] = src[u];
    }
    for (int i = threadIdx.x; i < G * a.M; i += kThreads) ms[i / a.M * Mpad + i % a.M] = a.meta[i / a.M * Mpad + i % a.M];
  }
  __syncthreads();
  const uint32_t xb = uint32_t(__cvta_generic_to_shared(xs)) + (g0 * Mpad + g8) * 64 + c * 16;
  const uint32_t lstep = uint32_t(G * Mpad * 64), gstep = uint32_t(Mpad * 64);
  const float2* mp = ms + g0 * Mpad + 2 * c;
  float* ob = a.out + int64_t(2 * c) * a.rows + g8;
  const int mrem = a.M - 2 * c;
  for (int n = 0; int(blockIdx.x) * WR + n * stride < nrb; ++n) {
    const bool on = rb < nrb;
    float acc[J][4];
#pragma unroll
    for (int j = 0; j < J; ++j)
#pragma unroll
      for (int v = 0; v < 4; ++v) acc[j][v] = 0.f;
#pragma unroll
    for (int t = 0; t < kSliceGroups; ++t) {
      const int i = t % D;
      const uint4 w = pw[i];
      const uint32_t s0 = ps0[i], s1 = ps1[i];
      load(i);
      if (on) tile_math<L, J>(w, s0, s1, xb + t * gstep, lstep, mp + t * Mpad, acc);
    }
#pragma unroll
    for (int j = 0; j < J; ++j)
#pragma unroll
      for (int v = 0; v < 4; ++v) part[warp][4 * j + v][lane] = acc[j][v];
    __syncthreads();
    if (kw == 0 && on) {
      float* o = ob + rb * 16;
#pragma unroll
      for (int j = 0; j < J; ++j)
#pragma unroll
        for (int v = 0; v < 4; ++v) {
          float tot = 0.f;
#pragma unroll
          for (int q = 0; q < KW; ++q) tot += part[warp + q][4 * j + v][lane];
          if (8 * j + (v & 1) < mrem) o[int64_t(8 * j + (v & 1)) * a.rows + 8 * (v >> 1)] = tot;
        }
    }
    __syncthreads();
    rb += stride;
  }
}

// ------------------------------------------------------------------------------------------------ MoE gate/up
// The routed shape: E experts (+ the shared one as expert E), each 16·rbe rows × K (gate/up: 1024 × 2048, down:
// 2048 × 512); a row's 8 experts grouped into chunks of <= 8 entries per expert (one n-tile per digit); an entry's
// input is row entry_row[entry] of xr (gate/up: the token's row; down: the entry's own act). Items = (chunk, 8 row
// blocks); a block takes
// items b, b + grid, ..., stages the next item's rows' digits (gathered by row) into its second buffer by cp.async
// while its warps compute the current one (a warp a row block, the whole K, D tiles in flight across items).
struct MoEArgs {
  const uint4* qp;     // [E + 1][64 row blocks][G][32]
  const uint32_t* sb;  // [E + 1][64][G][16]
  int K;
  const char* xr;      // [M][L][G][64] digits per row
  const float2* meta;  // [M][G]
  const int4* chunks;  // {expert, first entry, rows, 0}
  const int* entry_row;
  int nchunks;
  int rbe;             // row blocks per expert (a multiple of 8)
  float* y;            // [entries][16·rbe]
};

__device__ __forceinline__ void cp8(uint32_t dst, const void* src, int n) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"(dst), "l"(src), "r"(n) : "memory");
}

template <int L, int D>
__global__ void __launch_bounds__(kThreads, 2) moe_i8(MoEArgs a) {
  extern __shared__ uint4 sm4[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g8 = lane >> 2, c = lane & 3;
  const int G = a.K / 64, ipc = a.rbe / 8, items = a.nchunks * ipc, ldy = a.rbe * 16;
  const uint32_t digits_bytes = uint32_t(L * G * 8 * 64), buf_bytes = digits_bytes + uint32_t(G * 8 * 8);
  const uint32_t sbase = uint32_t(__cvta_generic_to_shared(sm4));
  const char* sgen = reinterpret_cast<const char*>(sm4);

  TileRing<D> ring;
  int litem = blockIdx.x, lg = 0;
  auto lstart = [&]() {
    if (litem < items) {
      const int64_t t0 = (int64_t(a.chunks[litem / ipc].x) * a.rbe + (litem % ipc) * 8 + warp) * G;
      ring.lw = a.qp + t0 * 32 + lane;
      ring.ls = a.sb + t0 * 16 + g8;
    }
  };
  lstart();
  auto load = [&](int i) {
    if (litem < items) ring.fetch(i);
    ring.advance(1);
    if (++lg == G) {
      lg = 0;
      litem += gridDim.x;
      lstart();
    }
  };
#pragma unroll
  for (int i = 0; i < D; ++i) load(i);
  auto stage = [&](int it, int b) {
    const int4 ch = a.chunks[it / ipc];
    const uint32_t dst = sbase + b * buf_bytes;
    for (int idx = threadIdx.x; idx < L * G * 32; idx += kThreads) {
      const int q = idx & 3, col = (idx >> 2) & 7, lgi = idx >> 5;
      const bool on = col < ch.z;
      const int row = on ? a.entry_row[ch.y + col] : 0;
      const int l = lgi / G, g = lgi % G;
      cp_async16_zfill(dst + uint32_t(((l * G + g) * 8 + col) * 64 + q * 16), a.xr + ((int64_t(row) * L + l) * G + g) * 64 + q * 16,
           on ? 16 : 0);
    }
    for (int idx = threadIdx.x; idx < G * 8; idx += kThreads) {
      const int col = idx & 7, g = idx >> 3;
      const bool on = col < ch.z;
      const int row = on ? a.entry_row[ch.y + col] : 0;
      cp8(dst + digits_bytes + uint32_t(idx * 8), a.meta + int64_t(row) * G + g, on ? 8 : 0);
    }
  };
  pdl_wait();
  pdl_trigger();
  int item = blockIdx.x;
  if (item < items) stage(item, 0);
  cp_async_commit();
  for (int n = 0; item < items; ++n, item += gridDim.x) {
    const int4 ch = a.chunks[item / ipc];
    if (item + int(gridDim.x) < items) stage(item + gridDim.x, (n + 1) & 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const uint32_t xb = sbase + (n & 1) * buf_bytes + g8 * 64 + c * 16;
    const float2* mp = reinterpret_cast<const float2*>(sgen + (n & 1) * buf_bytes + digits_bytes) + 2 * c;
    float acc[1][4] = {{0.f, 0.f, 0.f, 0.f}}, tot[4] = {0.f, 0.f, 0.f, 0.f};
    for (int g0 = 0; g0 < G; g0 += D) {
#pragma unroll
      for (int i = 0; i < D; ++i) {
        const int gl = g0 + i;
        const uint4 w = ring.w[i];
        const uint32_t s0 = ring.s0[i], s1 = ring.s1[i];
        load(i);
        tile_math<L, 1>(w, s0, s1, xb + gl * 512, uint32_t(G * 512), mp + gl * 8, acc);
        if (((gl + 1) & (kSliceGroups - 1)) == 0)
#pragma unroll
          for (int v = 0; v < 4; ++v) {
            tot[v] += acc[0][v];
            acc[0][v] = 0.f;
          }
      }
    }
    const int rb = (item % ipc) * 8 + warp;
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      const int m = 2 * c + (v & 1);
      if (m < ch.z) a.y[int64_t(ch.y + m) * ldy + rb * 16 + g8 + 8 * (v >> 1)] = tot[v];
    }
    __syncthreads();  // this buffer is restaged at item n + 2
  }
}

__global__ void fold_partials(const float* part, int KS, int64_t n, float* y) {
  pdl_wait();
  pdl_trigger();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float s = 0.f;
  for (int k = 0; k < KS; ++k) s += part[int64_t(k) * n + i];
  y[i] = s;
}

// q of packed weights at (row o, column k)
__device__ int q_at(const uint4* qp, int G, int o, int k) {
  const int rb = o / 16, r = o % 16, g8 = r % 8, h = r / 8, g = k / 64, kk = k % 64;
  const int half = kk / 32, k2 = kk % 32, hi = k2 / 16, k3 = k2 % 16, c = k3 / 4, i = k3 % 4;
  const uint4 w = qp[(int64_t(rb) * G + g) * 32 + 4 * g8 + c];
  const uint32_t word = (2 * half + h) == 0 ? w.x : (2 * half + h) == 1 ? w.y : (2 * half + h) == 2 ? w.z : w.w;
  return int((word >> (8 * i + 4 * hi)) & 15u);
}

// references: double, and a plain fp32 chain in k order (the CPU reference's kind of arithmetic)
__global__ void ref_kernel(const uint4* qp, const uint32_t* sb, int rows, int K, const float* x, double* yd, float* yf) {
  const int o = blockIdx.x * blockDim.x + threadIdx.x, m = blockIdx.y;
  if (o >= rows) return;
  const int G = K / 64;
  double s = 0;
  float f = 0.f;
  for (int k = 0; k < K; ++k) {
    const uint32_t w = sb[(int64_t(o / 16) * G + k / 64) * 16 + o % 16];
    const float wf = fmaf(bf_lo(w), float(q_at(qp, G, o, k)), bf_hi(w));
    const float xv = x[int64_t(m) * K + k];
    s += double(wf) * xv;
    f = fmaf(wf, xv, f);
  }
  yd[int64_t(m) * rows + o] = s;
  yf[int64_t(m) * rows + o] = f;
}

__global__ void ref_moe(const uint4* qp, const uint32_t* sb, int R, int K, const float* x, const int* entry_row,
                        const int* entry_expert, int entries, double* yd) {
  const int o = blockIdx.x * blockDim.x + threadIdx.x, en = blockIdx.y;
  if (o >= R || en >= entries) return;
  const int G = K / 64, e = entry_expert[en], r = entry_row[en];
  const uint4* q = qp + int64_t(e) * (R / 16) * G * 32;
  const uint32_t* s = sb + int64_t(e) * (R / 16) * G * 16;
  double acc = 0;
  for (int k = 0; k < K; ++k) {
    const uint32_t w = s[(int64_t(o / 16) * G + k / 64) * 16 + o % 16];
    acc += double(fmaf(bf_lo(w), float(q_at(q, G, o, k)), bf_hi(w))) * x[int64_t(r) * K + k];
  }
  yd[int64_t(en) * R + o] = acc;
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

template <int L, int J, int JS, int D>
void launch(const Args& a, cudaStream_t st, int sms, float* y) {
  const size_t smem = size_t(L) * a.Gs * a.Mpad * 64 + size_t(a.Gs) * a.Mpad * 8;
  static size_t set = 0;
  if (smem > set) {
    CK(cudaFuncSetAttribute(gemv_i8<L, J, JS, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    set = smem;
  }
  int occ = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, gemv_i8<L, J, JS, D>, kThreads, smem));
  const int nrb = a.rows / 16;
  const int want = a.KS * ((nrb + kWarps / JS - 1) / (kWarps / JS));
  int grid = std::min(want, sms * std::max(occ, 1));
  grid = std::max(a.KS, grid / a.KS * a.KS);
  launch_pdl(gemv_i8<L, J, JS, D>, grid, kThreads, smem, st, a);
  if (a.KS > 1) {
    const int64_t n = int64_t(a.M) * a.rows;
    launch_pdl(fold_partials, int((n + 255) / 256), 256, 0, st, (const float*)a.out, a.KS, n, y);
  }
}

template <int L, int D>
void launch_j(const Args& a, cudaStream_t st, int sms, float* y) {
  switch (a.Mpad / 8) {
    case 1: launch<L, 1, 1, D>(a, st, sms, y); break;
    case 2: launch<L, 2, 1, D>(a, st, sms, y); break;
    case 4: launch<L, 4, 1, D>(a, st, sms, y); break;
    default: launch<L, 4, 2, D>(a, st, sms, y); break;
  }
}

template <int L, int J, int KW, int D>
void launch_kw(const Args& a, cudaStream_t st, int sms) {
  const size_t smem = size_t(L) * a.Gs * a.Mpad * 64 + size_t(a.Gs) * a.Mpad * 8;
  static size_t set = 0;
  if (smem > set) {
    CK(cudaFuncSetAttribute(gemv_i8_kw<L, J, KW, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    set = smem;
  }
  int occ = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, gemv_i8_kw<L, J, KW, D>, kThreads, smem));
  constexpr int WR = kWarps / KW;
  const int grid = std::min((a.rows / 16 + WR - 1) / WR, sms * std::max(occ, 1));
  launch_pdl(gemv_i8_kw<L, J, KW, D>, grid, kThreads, smem, st, a);
}

template <int L>
void launch_kw_any(const Args& a, cudaStream_t st, int sms, bool deep) {
  const int KW = a.K / 64 / kSliceGroups;
  const bool two = a.Mpad > 8;
  if (KW == 4) {
    if (two) deep ? launch_kw<L, 2, 4, 8>(a, st, sms) : launch_kw<L, 2, 4, 4>(a, st, sms);
    else deep ? launch_kw<L, 1, 4, 8>(a, st, sms) : launch_kw<L, 1, 4, 4>(a, st, sms);
  } else {
    if (two) deep ? launch_kw<L, 2, 8, 8>(a, st, sms) : launch_kw<L, 2, 8, 4>(a, st, sms);
    else deep ? launch_kw<L, 1, 8, 8>(a, st, sms) : launch_kw<L, 1, 8, 4>(a, st, sms);
  }
}


// The routed MoE at M rows: routing random (8 distinct experts per row) plus the shared expert for every row;
// gate/up (the token rows as input) or down (each entry's own act as input). The experts are held in enough copies
// that consecutive launches read ≥ 100 MB of distinct weights (L2 holds ~50 MB), as main's bench changes routings.
void run_moe(int sms, cudaStream_t st, bool down) {
  constexpr int E = 256, L = 3, D = 4;
  const int R = down ? 2048 : 1024, K = down ? 512 : 2048, G = K / 64, rbe = R / 16;
  const int64_t tiles = int64_t(E + 1) * rbe * G;
  std::mt19937 rng(99);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<uint4> hq(static_cast<size_t>(tiles * 32));
  for (auto& v : hq) v = make_uint4(rng(), rng(), rng(), rng());
  std::vector<uint32_t> hs(static_cast<size_t>(tiles * 16));
  auto bf16 = [](float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  };
  for (auto& v : hs) {
    const float sc = 0.01f + 0.01f * std::fabs(nd(rng));
    v = bf16(sc) | (bf16(-8.f * sc + 0.002f * nd(rng)) << 16);
  }
  const double expert_bytes = double(R) * K / 2 + double(rbe) * G * 64;
  const int only = std::atoi(std::getenv("PROTO_MOE"));  // PROTO_MOE=M: that M only
  for (int M : {1, 4, 16, 64}) {
    if (only > 1 && M != only) continue;
    std::vector<std::vector<int>> rows_of(E + 1);
    for (int m = 0; m < M; ++m) {
      std::vector<int> ex;
      while (ex.size() < 8) {
        const int e = int(rng() % E);
        if (std::find(ex.begin(), ex.end(), e) == ex.end()) ex.push_back(e);
      }
      for (int e : ex) rows_of[e].push_back(m);
      rows_of[E].push_back(m);
    }
    std::vector<int4> chunks;
    std::vector<int> entry_row, entry_expert;
    for (int e = 0; e <= E; ++e)
      for (size_t i = 0; i < rows_of[e].size(); i += 8) {
        const int n = int(std::min<size_t>(8, rows_of[e].size() - i));
        chunks.push_back(make_int4(e, int(entry_row.size()), n, 0));
        for (int j = 0; j < n; ++j) {
          entry_row.push_back(rows_of[e][i + j]);
          entry_expert.push_back(e);
        }
      }
    const int entries = int(entry_row.size());
    if (down)  // an entry's input is its own act row
      for (int i = 0; i < entries; ++i) entry_row[i] = i;
    const int X = down ? entries : M, Xpad = (X + 7) / 8 * 8;
    int touched = 0;
    for (int e = 0; e < E; ++e) touched += !rows_of[e].empty();
    const int copies = std::max(2, int(std::ceil(100e6 / ((touched + 1) * expert_bytes))));
    uint4* dq;
    uint32_t* ds;
    CK(cudaMalloc(&dq, hq.size() * 16 * copies));
    CK(cudaMalloc(&ds, hs.size() * 4 * copies));
    for (int cp = 0; cp < copies; ++cp) {
      CK(cudaMemcpy(dq + hq.size() * cp, hq.data(), hq.size() * 16, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(ds + hs.size() * cp, hs.data(), hs.size() * 4, cudaMemcpyHostToDevice));
    }
    std::vector<float> hx(size_t(X) * K);
    for (int m = 0; m < X; ++m)
      for (int k = 0; k < K; ++k) hx[size_t(m) * K + k] = nd(rng) * (k % 53 == 7 ? 20.f : 1.f);
    float *dx, *dy;
    double* dyd;
    char *dxq, *dxr;
    float2 *dmeta, *dmr;
    int4* dch;
    int *der, *dee;
    CK(cudaMalloc(&dx, hx.size() * 4));
    CK(cudaMalloc(&dy, size_t(entries) * R * 4));
    CK(cudaMalloc(&dyd, size_t(entries) * R * 8));
    CK(cudaMalloc(&dxq, size_t(L) * G * Xpad * 64));
    CK(cudaMalloc(&dxr, size_t(X) * L * G * 64));
    CK(cudaMalloc(&dmeta, size_t(G) * Xpad * 8));
    CK(cudaMalloc(&dmr, size_t(X) * G * 8));
    CK(cudaMalloc(&dch, chunks.size() * 16));
    CK(cudaMalloc(&der, entries * 4));
    CK(cudaMalloc(&dee, entries * 4));
    CK(cudaMemcpy(dx, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dch, chunks.data(), chunks.size() * 16, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(der, entry_row.data(), entries * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dee, entry_expert.data(), entries * 4, cudaMemcpyHostToDevice));
    // digits per input row: the dense staging's, regathered [row][l][g] (the layout a routed kernel gathers by row)
    stage_digits<L><<<(Xpad * G + 127) / 128, 128, 0, st>>>(dx, X, Xpad, K, dxq, dmeta);
    CK(cudaStreamSynchronize(st));
    {
      std::vector<char> q(size_t(L) * G * Xpad * 64), r(size_t(X) * L * G * 64);
      std::vector<float2> mq(size_t(G) * Xpad), mr(size_t(X) * G);
      CK(cudaMemcpy(q.data(), dxq, q.size(), cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(mq.data(), dmeta, mq.size() * 8, cudaMemcpyDeviceToHost));
      for (int m = 0; m < X; ++m)
        for (int l = 0; l < L; ++l)
          for (int g = 0; g < G; ++g) {
            std::memcpy(&r[((size_t(m) * L + l) * G + g) * 64], &q[((size_t(l) * G + g) * Xpad + m) * 64], 64);
            mr[size_t(m) * G + g] = mq[size_t(g) * Xpad + m];
          }
      CK(cudaMemcpy(dxr, r.data(), r.size(), cudaMemcpyHostToDevice));
      CK(cudaMemcpy(dmr, mr.data(), mr.size() * 8, cudaMemcpyHostToDevice));
    }
    ref_moe<<<dim3((R + 127) / 128, entries), 128, 0, st>>>(dq, ds, R, K, dx, der, dee, entries, dyd);
    MoEArgs a{dq, ds, K, dxr, dmr, dch, der, int(chunks.size()), rbe, dy};
    const size_t smem = 2 * (size_t(L) * G * 8 * 64 + size_t(G) * 8 * 8);
    CK(cudaFuncSetAttribute(moe_i8<L, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    int occ = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, moe_i8<L, D>, kThreads, smem));
    const int grid = std::min(int(chunks.size()) * (rbe / 8), sms * std::max(occ, 1));
    auto run = [&](int i) {
      MoEArgs b = a;
      b.qp = dq + hq.size() * (i % copies);
      b.sb = ds + hs.size() * (i % copies);
      launch_pdl(moe_i8<L, D>, grid, kThreads, smem, st, b);
    };
    run(0);
    CK(cudaStreamSynchronize(st));
    std::vector<float> y(size_t(entries) * R);
    std::vector<double> yd(y.size());
    CK(cudaMemcpy(y.data(), dy, y.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(yd.data(), dyd, yd.size() * 8, cudaMemcpyDeviceToHost));
    double num = 0, den = 0;
    for (size_t i = 0; i < y.size(); ++i) {
      num += (double(y[i]) - yd[i]) * (double(y[i]) - yd[i]);
      den += yd[i] * yd[i];
    }
    const double us = graph_us(st, run);
    std::printf("moe_%-7s_routed  M=%-2d L=%d experts %3d+1 chunks %3zu copies %2d: %8.1f us  %5.2f TB/s  rel_err %.2e\n",
                down ? "down" : "gate_up", M, L, touched, chunks.size(), copies, us, (touched + 1) * expert_bytes / us * 1e-6,
                std::sqrt(num / den));
    cudaFree(dx), cudaFree(dy), cudaFree(dyd), cudaFree(dxq), cudaFree(dxr), cudaFree(dmeta), cudaFree(dmr);
    cudaFree(dch), cudaFree(der), cudaFree(dee), cudaFree(dq), cudaFree(ds);
  }
}

}  // namespace

int main() {
  struct Shape {
    const char* name;
    int rows, K;
  };
  const Shape shapes[] = {{"gdn_in_proj", 12352, 2048}, {"gdn_out_proj", 2048, 4096}, {"attn_qkv", 9216, 2048},
                          {"lm_head", 248320, 2048}, {"moe_gate_up_100exp", 102400, 2048}, {"moe_down_100exp", 204800, 512}};
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  std::mt19937 rng(1234);
  std::normal_distribution<float> nd(0.f, 1.f);
  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  if (std::getenv("PROTO_MOE")) {
    run_moe(sms, st, false);
    run_moe(sms, st, true);
    return 0;
  }
  for (const Shape& sh : shapes) {
    const int G = sh.K / 64, nrb = sh.rows / 16;
    const int64_t qb = int64_t(sh.rows) * sh.K / 2, sbw = int64_t(nrb) * G * 16;
    const int copies = int(std::max<int64_t>(2, (256ll << 20) / (qb + 4 * sbw)));
    std::vector<uint32_t> hq(static_cast<size_t>(qb / 4)), hs(static_cast<size_t>(sbw));
    for (auto& v : hq) v = rng();
    auto bf16 = [](float f) {
      uint32_t u;
      std::memcpy(&u, &f, 4);
      return (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    };
    for (auto& v : hs) {
      const float s = 0.01f + 0.01f * std::fabs(nd(rng));
      v = bf16(s) | (bf16(-8.f * s + 0.002f * nd(rng)) << 16);
    }
    char* dq;
    uint32_t* ds;
    CK(cudaMalloc(&dq, qb * copies));
    CK(cudaMalloc(&ds, sbw * 4 * copies));
    for (int cp = 0; cp < copies; ++cp) {
      CK(cudaMemcpy(dq + qb * cp, hq.data(), qb, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(ds + sbw * cp, hs.data(), sbw * 4, cudaMemcpyHostToDevice));
    }
    for (int M : {1, 2, 4, 8, 16, 32, 64}) {
      if (std::strncmp(sh.name, "lm", 2) == 0 && (M == 2 || M == 8 || M == 32)) continue;
      if (std::strncmp(sh.name, "moe", 3) == 0 && M > 2) continue;  // ~100 experts of ~1.3 rows: the MoE at 16 rows
      const int Mpad = (M + 7) / 8 * 8;
      std::vector<float> hx(size_t(M) * sh.K);
      for (int m = 0; m < M; ++m)
        for (int k = 0; k < sh.K; ++k) hx[size_t(m) * sh.K + k] = nd(rng) * (k % 53 == 7 ? 20.f : 1.f);  // outlier channels
      float *dx, *dy, *dyf, *dpart;
      double* dyd;
      char* dxq;
      float2* dmeta;
      CK(cudaMalloc(&dx, hx.size() * 4));
      CK(cudaMalloc(&dy, size_t(M) * sh.rows * 4));
      CK(cudaMalloc(&dyf, size_t(M) * sh.rows * 4));
      CK(cudaMalloc(&dyd, size_t(M) * sh.rows * 8));
      CK(cudaMalloc(&dpart, size_t(G / kSliceGroups) * M * sh.rows * 4));
      CK(cudaMalloc(&dxq, size_t(3) * G * Mpad * 64));
      CK(cudaMalloc(&dmeta, size_t(G) * Mpad * 8));
      CK(cudaMemcpy(dx, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
      const bool check = sh.rows < 100000;
      std::vector<double> yd;
      std::vector<float> yf;
      if (check) {
        ref_kernel<<<dim3((sh.rows + 127) / 128, M), 128, 0, st>>>(reinterpret_cast<const uint4*>(dq), ds, sh.rows, sh.K,
                                                                   dx, dyd, dyf);
        CK(cudaStreamSynchronize(st));
        yd.resize(size_t(M) * sh.rows);
        yf.resize(yd.size());
        CK(cudaMemcpy(yd.data(), dyd, yd.size() * 8, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(yf.data(), dyf, yf.size() * 4, cudaMemcpyDeviceToHost));
      }
      auto rel = [&](const std::vector<float>& y) {
        double num = 0, den = 0;
        for (size_t i = 0; i < y.size(); ++i) {
          num += (double(y[i]) - yd[i]) * (double(y[i]) - yd[i]);
          den += yd[i] * yd[i];
        }
        return std::sqrt(num / den);
      };
      for (int L : {2, 3}) {
        std::vector<float> first;  // every configuration must give these bits
        for (int cfg = 0; cfg < 6; ++cfg) {  // bit 0: one range per 8-group slice; bit 1: 8 tiles in flight; 4, 5: KW warps per row block
          const bool sliced = cfg & 1, deep = cfg & 2, kwv = cfg >= 4;
          const size_t whole = size_t(L) * G * Mpad * 64 + size_t(G) * Mpad * 8;
          if (!sliced && whole > 110 * 1024) continue;
          if (kwv && (whole > 110 * 1024 || Mpad > 16 || (G != 32 && G != 64))) continue;
          if (sliced && G == kSliceGroups) continue;  // one slice: the same launch as "whole"
          // PROTO_ONE="name,M,L,cfg": that case only, one launch, no timing (for Nsight Compute)
          const char* one = std::getenv("PROTO_ONE");
          char want[96];
          std::snprintf(want, sizeof want, "%s,%d,%d,%d", sh.name, M, L, cfg);
          if (one && std::strcmp(one, want) != 0) continue;
          if (L == 3) stage_digits<3><<<(Mpad * G + 127) / 128, 128, 0, st>>>(dx, M, Mpad, sh.K, dxq, dmeta);
          else stage_digits<2><<<(Mpad * G + 127) / 128, 128, 0, st>>>(dx, M, Mpad, sh.K, dxq, dmeta);
          Args a{};
          a.rows = sh.rows;
          a.K = sh.K;
          a.xq = dxq;
          a.meta = dmeta;
          a.M = M;
          a.Mpad = Mpad;
          a.Gs = sliced ? kSliceGroups : G;
          a.KS = G / a.Gs;
          a.out = a.KS > 1 ? dpart : dy;
          auto run = [&](int cp) {
            Args b = a;
            b.qp = reinterpret_cast<const uint4*>(dq + qb * cp);
            b.sb = ds + sbw * cp;
            if (kwv) {
              Args c = b;
              c.Gs = G;
              c.KS = 1;
              c.out = dy;
              L == 3 ? launch_kw_any<3>(c, st, sms, cfg & 1) : launch_kw_any<2>(c, st, sms, cfg & 1);
            } else if (L == 3) deep ? launch_j<3, 8>(b, st, sms, dy) : launch_j<3, 4>(b, st, sms, dy);
            else deep ? launch_j<2, 8>(b, st, sms, dy) : launch_j<2, 4>(b, st, sms, dy);
          };
          CK(cudaMemsetAsync(dy, 0xFF, size_t(M) * sh.rows * 4, st));
          run(0);
          CK(cudaStreamSynchronize(st));
          std::vector<float> y(size_t(M) * sh.rows);
          CK(cudaMemcpy(y.data(), dy, y.size() * 4, cudaMemcpyDeviceToHost));
          if (one) {
            std::printf("%s: one launch\n", want);
            continue;
          }
          bool same = true;
          if (first.empty()) first = y;
          else same = std::memcmp(first.data(), y.data(), y.size() * 4) == 0;
          const double us = graph_us(st, [&](int i) { run(i % copies); });
          std::printf("%-22s M=%-2d L=%d %s D=%d KS=%-2d: %8.1f us  %5.2f TB/s", sh.name, M, L,
                      kwv ? "kw    " : sliced ? "slices" : "whole ", kwv ? ((cfg & 1) ? 8 : 4) : deep ? 8 : 4,
                      kwv ? 1 : a.KS, us, (qb + 4.0 * sbw) / us * 1e-6);
          if (check) std::printf("  rel_err %.2e (fp32 chain %.2e)", rel(y), rel(yf));
          std::printf("%s\n", same ? "" : "  BITS DIFFER FROM THE FIRST CONFIGURATION");
        }
      }
      cudaFree(dx), cudaFree(dy), cudaFree(dyf), cudaFree(dyd), cudaFree(dpart), cudaFree(dxq), cudaFree(dmeta);
    }
    cudaFree(dq), cudaFree(ds);
  }
  return 0;
}
