// Decode GEMV (one token): quantized weights (4/8-bit, MLX layout) with dequantization fused,
// input prologues (RMSNorm / gated head norm) and the Gated DeltaNet conv epilogue fused; the MoE
// gather-GEMVs (routing + gate/up + SwiGLU, down + weighted combine + residual add); the embedding gather.
#include <algorithm>
#include <cstdlib>
#include <string>

#include "cuda/cuda_common.h"
#include "cuda/kernels/decode.h"
#include "cuda/kernels/gemv_common.cuh"
#include "cuda/kernels/gemv_tc.h"
#include "cuda/kernels/launch.cuh"
#include "cuda/kernels/qdot.cuh"
#include "cuda/kernels/qdot_dp4a.cuh"
#include "cuda/kernels/qdot_half2.cuh"

namespace lilac::cuda {
namespace {

using namespace dev;
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

int num_sms() {
  static int n = [] {
    int dev = 0, v = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev);
    return v > 0 ? v : 1;
  }();
  return n;
}

// Lanes per row: the largest power of two <= min(32, chunks per row).
int lanes_per_row(int64_t nchunk) {
  int l = 1;
  while (l * 2 <= 32 && l * 2 <= nchunk) l *= 2;
  return l;
}

void check_q(const QMatrixDev& W, const char* what) {
  LILAC_CHECK(W.bits == 4 || W.bits == 8, std::string(what) + ": only 4- and 8-bit matrices are supported");
  const int epl = 128 / W.bits;
  LILAC_CHECK(W.cols % 64 == 0 && W.group_size % epl == 0 && W.cols % W.group_size == 0,
              std::string(what) + ": cols must be a multiple of 64 and of the group size (a multiple of " +
                  std::to_string(epl) + ")");
}

// Σx per 16-byte chunk of weights (EPL = 128/BITS values), one warp per chunk.
template <int BITS>
__device__ void chunk_sums(const float* xs, float* xsum, int nchunk) {
  constexpr int EPL = 128 / BITS;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int c = warp; c < nchunk; c += nw) {
    float v = lane < EPL ? xs[c * EPL + lane] : 0.f;
    v = warp_sum(v);
    if (lane == 0) xsum[c] = v;
  }
}


template <int BITS, int MINB>
__global__ void __launch_bounds__(kThreads, MINB) gemv_kernel(GemvArgs a, int lpr) {
  extern __shared__ float4 smem4[];
  __shared__ float red[32];
  constexpr int EPL = 128 / BITS;
  const int cols = int(a.W.cols);
  const int nchunk = cols / EPL;
  float* xs = reinterpret_cast<float*>(smem4);
  float* xsum = xs + cols;
  stage_input(a, xs, cols, red);
  chunk_sums<BITS>(xs, xsum, nchunk);
  __syncthreads();

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int gpw = 32 / lpr, grp = lane / lpr, gl = lane % lpr;
  const int cpg = a.W.group_size / EPL;
  const int64_t rows = a.W.rows, npairs = (rows + 1) / 2;
  const int64_t wpr = a.W.words_per_row(), gpr = a.W.groups_per_row();
  const int rot = lane & 7;
  for (int64_t base = (int64_t(blockIdx.x) * kWarps + warp) * gpw; base < npairs;
       base += int64_t(gridDim.x) * kWarps * gpw) {
    const int64_t p = base + grp;
    float v0 = 0.f, v1 = 0.f;
    const int64_t r0 = 2 * p, r1 = r0 + 1;
    const bool valid = p < npairs, has1 = r1 < rows;
    if (valid) {
      row_dot2<BITS>(a.W.qweight + r0 * wpr, a.W.scales + r0 * gpr, a.W.biases + r0 * gpr, xs, xsum,
                     has1 ? a.W.qweight + r1 * wpr : nullptr, a.W.scales + r1 * gpr, a.W.biases + r1 * gpr, xs,
                     xsum, nchunk, lpr, gl, cpg, rot, v0, v1);
    }
    v0 = group_sum(v0, lpr);
    v1 = group_sum(v1, lpr);
    if (valid && gl == 0) {
#pragma unroll
      for (int t = 0; t < 2; ++t) {
        const int64_t r = t == 0 ? r0 : r1;
        if (t == 1 && !has1) break;
        float v = t == 0 ? v0 : v1;
        if (r < a.conv_rows) {  // causal depthwise conv (state oldest first) + SiLU
          const int K = a.conv_k, S = K - 1;
          const float* w = a.conv_w + r * K;
          float* st = a.conv_state + r * S;
          float acc = 0.f;
          for (int k = 0; k < S; ++k) acc += w[k] * st[k];
          acc += w[S] * v;
          for (int k = 0; k + 1 < S; ++k) st[k] = st[k + 1];
          if (S > 0) st[S - 1] = v;
          v = silu_f(acc);
        }
        a.y[r] = a.accumulate ? a.y[r] + v : v;
      }
    }
  }
}

// ------------------------------------------------------------------------------------------------ dp4a GEMV
// LILAC_GEMV=dp4a: t(x) is staged as in gemv_kernel, then quantized to int8 per group of 64 in shared
// memory (qdot_dp4a.cuh); each 16-byte weight chunk costs 8 (4-bit) or 4 (8-bit) dp4a plus one
// I2F and three FMAs. A group of `lpr` lanes takes kDpRows rows at once; each lane keeps
// kDpRows × kDpUnroll independent 16-byte streaming loads in flight before it uses them.
// Default: kDpUnroll 2 (8 loads in flight per lane) at <= 80 registers (3 blocks = 24 warps per SM);
// LILAC_GEMV_DP4A_UNROLL=1: 4 loads in flight at <= 64 registers (4 blocks = 32 warps per SM).
constexpr int kDpRows = 4;


// Shared memory of the dp4a GEMV: meta float4[nchunk] | xq bytes[cols] | xs float[cols].
size_t dp4a_smem(int64_t cols, int bits) {
  const int64_t nchunk = cols / (128 / bits);
  return size_t(nchunk * 16 + cols + cols * 4);
}

template <int BITS, int kDpUnroll, int MINB>
__global__ void __launch_bounds__(kThreads, MINB) gemv_dp4a_kernel(GemvArgs a, int lpr, int cpg_log2) {
  extern __shared__ float4 smem4[];
  __shared__ float red[32];
  constexpr int EPL = 128 / BITS;
  const int cols = int(a.W.cols);
  const int nchunk = cols / EPL;
  float4* meta = smem4;
  signed char* xq = reinterpret_cast<signed char*>(smem4 + nchunk);
  float* xs = reinterpret_cast<float*>(xq + cols);
  stage_input(a, xs, cols, red);
  quantize_input<BITS>(xs, cols, xq, meta);
  __syncthreads();
  const int4* xa = reinterpret_cast<const int4*>(xq);
  const int4* xb = xa + nchunk;  // 4-bit only

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int gpw = 32 / lpr, grp = lane / lpr, gl = lane % lpr;
  const int64_t rows = a.W.rows, nquads = (rows + kDpRows - 1) / kDpRows;
  const int64_t wpr4 = a.W.words_per_row() / 4, gpr = a.W.groups_per_row();
  const uint4* wbase = reinterpret_cast<const uint4*>(a.W.qweight);
  for (int64_t base = (int64_t(blockIdx.x) * kWarps + warp) * gpw; base < nquads;
       base += int64_t(gridDim.x) * kWarps * gpw) {
    const int64_t qd = base + grp;
    const int64_t r0 = qd * kDpRows;
    float acc[kDpRows];
#pragma unroll
    for (int i = 0; i < kDpRows; ++i) acc[i] = 0.f;
    if (qd < nquads) {
      // Rows r0 + i past the end re-read the last row (the result is dropped). Offsets from row r0 in
      // 32 bits (kDpRows rows of one matrix) keep the register count down.
      const uint4* wp = wbase + r0 * wpr4;
      const __nv_bfloat16* sp = a.W.scales + r0 * gpr;
      const __nv_bfloat16* bp = a.W.biases + r0 * gpr;
      int ow[kDpRows], og[kDpRows];
#pragma unroll
      for (int i = 0; i < kDpRows; ++i) {
        const int d = int(min(int64_t(i), rows - 1 - r0));
        ow[i] = d * int(wpr4);
        og[i] = d * int(gpr);
      }
      for (int c = gl; c < nchunk; c += kDpUnroll * lpr) {
        uint4 w[kDpUnroll][kDpRows];
#pragma unroll
        for (int u = 0; u < kDpUnroll; ++u) {
          const int cu = c + u * lpr;
#pragma unroll
          for (int i = 0; i < kDpRows; ++i) w[u][i] = cu < nchunk ? ld_stream(wp + (ow[i] + cu)) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < kDpUnroll; ++u) {
          const int cu = c + u * lpr;
          if (cu < nchunk) {
            const float4 m = meta[cu];
            const int4 va = xa[cu];
            const int4 vb = BITS == 4 ? xb[cu] : va;
            const int g = cu >> cpg_log2;
#pragma unroll
            for (int i = 0; i < kDpRows; ++i) {
              const int dot = chunk_dot_i8<BITS>(w[u][i], va, vb);
              const float s = bf2f(sp[og[i] + g]), b = bf2f(bp[og[i] + g]);
              acc[i] = fmaf(s, fmaf(m.x, float(dot), m.y), fmaf(b, m.z, acc[i]));
            }
          }
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kDpRows; ++i) acc[i] = group_sum(acc[i], lpr);
    if (qd < nquads && gl == 0) {
#pragma unroll
      for (int i = 0; i < kDpRows; ++i)
        if (r0 + i < rows) gemv_store_row(a, r0 + i, acc[i]);
    }
  }
}

// ------------------------------------------------------------------------------------------------ half2 GEMV
// LILAC_GEMV=half2 (4-bit only; 8-bit matrices keep the fp32 kernel): t(x) staged as in gemv_kernel,
// then converted to fp16 per chunk of 32 (qdot_half2.cuh); each 16-byte weight chunk costs 4 SHF +
// 16 LOP3 + 16 HSUB2 + 16 HFMA2 + 2 conversions and 3 FADD + 3 FFMA, accumulated in fp32 across chunks.
// Work partition and load pipelining as gemv_dp4a_kernel (kDpRows rows × kUnroll chunk positions of
// 16-byte streaming loads in flight per lane).
// Shared memory: meta float4[nchunk] | xh half[cols] | xs float[cols].
size_t half2_smem(int64_t cols) { return size_t((cols / 32) * 16 + cols * 2 + cols * 4); }

template <int kUnroll, int MINB>
__global__ void __launch_bounds__(kThreads, MINB) gemv_half2_kernel(GemvArgs a, int lpr, int cpg_log2) {
  extern __shared__ float4 smem4[];
  __shared__ float red[32];
  const int cols = int(a.W.cols);
  const int nchunk = cols / 32;
  float4* meta = smem4;
  __half* xh = reinterpret_cast<__half*>(smem4 + nchunk);
  float* xs = reinterpret_cast<float*>(xh + cols);
  stage_input(a, xs, cols, red);
  stage_input_h2(xs, cols, xh, meta);
  __syncthreads();
  const uint4* xv = reinterpret_cast<const uint4*>(xh);  // word k of chunk c: xv[k * nchunk + c]

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int gpw = 32 / lpr, grp = lane / lpr, gl = lane % lpr;
  const int64_t rows = a.W.rows, nquads = (rows + kDpRows - 1) / kDpRows;
  const int64_t wpr4 = a.W.words_per_row() / 4, gpr = a.W.groups_per_row();
  const uint4* wbase = reinterpret_cast<const uint4*>(a.W.qweight);
  for (int64_t base = (int64_t(blockIdx.x) * kWarps + warp) * gpw; base < nquads;
       base += int64_t(gridDim.x) * kWarps * gpw) {
    const int64_t qd = base + grp;
    const int64_t r0 = qd * kDpRows;
    float acc[kDpRows];
#pragma unroll
    for (int i = 0; i < kDpRows; ++i) acc[i] = 0.f;
    if (qd < nquads) {
      const uint4* wp = wbase + r0 * wpr4;
      const __nv_bfloat16* sp = a.W.scales + r0 * gpr;
      const __nv_bfloat16* bp = a.W.biases + r0 * gpr;
      int ow[kDpRows], og[kDpRows];
#pragma unroll
      for (int i = 0; i < kDpRows; ++i) {
        const int d = int(min(int64_t(i), rows - 1 - r0));
        ow[i] = d * int(wpr4);
        og[i] = d * int(gpr);
      }
      for (int c = gl; c < nchunk; c += kUnroll * lpr) {
        uint4 w[kUnroll][kDpRows];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int cu = c + u * lpr;
#pragma unroll
          for (int i = 0; i < kDpRows; ++i) w[u][i] = cu < nchunk ? ld_stream(wp + (ow[i] + cu)) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int cu = c + u * lpr;
          if (cu < nchunk) {
            const float4 m = meta[cu];
            const uint4 x0 = xv[cu], x1 = xv[nchunk + cu], x2 = xv[2 * nchunk + cu], x3 = xv[3 * nchunk + cu];
            const int g = cu >> cpg_log2;
#pragma unroll
            for (int i = 0; i < kDpRows; ++i) {
              const float dot = chunk_dot_h2(w[u][i], x0, x1, x2, x3);
              const float s = bf2f(sp[og[i] + g]), b = bf2f(bp[og[i] + g]);
              acc[i] = fmaf(s, fmaf(m.x, dot, m.y), fmaf(b, m.z, acc[i]));
            }
          }
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kDpRows; ++i) acc[i] = group_sum(acc[i], lpr);
    if (qd < nquads && gl == 0) {
#pragma unroll
      for (int i = 0; i < kDpRows; ++i)
        if (r0 + i < rows) gemv_store_row(a, r0 + i, acc[i]);
    }
  }
}

// ------------------------------------------------------------------------------------------------ MoE

template <int BITS, int MINB>
__global__ void __launch_bounds__(kThreads, MINB)
    moe_gate_up_kernel(MoEDecodeWeights w, const float* logits, const float* x, const float* norm_w, float eps,
                       int32_t* sel_ids, float* sel_w, float* act, int lpr) {
  extern __shared__ float4 smem4[];
  __shared__ float red[32];
  __shared__ int s_ids[32];
  __shared__ float s_w[33];
  constexpr int EPL = 128 / BITS;
  const int cols = int(w.gate.first.cols);
  const int nchunk = cols / EPL;
  float* xs = reinterpret_cast<float*>(smem4);
  float* xsum = xs + cols;
  GemvArgs a;
  a.x = x;
  a.pro = Prologue::RmsNorm;
  a.norm_w = norm_w;
  a.eps = eps;
  if ((threadIdx.x >> 5) == 0) route_warp(logits, w.E, w.top_k, w.renormalise, s_ids, s_w, sel_ids, sel_w);
  stage_input(a, xs, cols, red);
  chunk_sums<BITS>(xs, xsum, nchunk);
  __syncthreads();

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int gpw = 32 / lpr, grp = lane / lpr, gl = lane % lpr;
  const int cpg = w.gate.first.group_size / EPL;
  const int I = int(w.gate.first.rows), Is = int(w.shared_gate.rows);
  const int64_t items = int64_t(w.top_k) * I + Is;
  const int rot = lane & 7;
  for (int64_t base = (int64_t(blockIdx.x) * kWarps + warp) * gpw; base < items;
       base += int64_t(gridDim.x) * kWarps * gpw) {
    const int64_t it = base + grp;
    const bool valid = it < items;
    float g = 0.f, u = 0.f;
    int slot = 0, j = 0;
    if (valid) {
      QMatrixDev G, U;
      if (it < int64_t(w.top_k) * I) {
        slot = int(it / I);
        j = int(it % I);
        G = w.gate.expert(s_ids[slot]);
        U = w.up.expert(s_ids[slot]);
      } else {
        slot = w.top_k;
        j = int(it - int64_t(w.top_k) * I);
        G = w.shared_gate;
        U = w.shared_up;
      }
      const int64_t wpr = G.words_per_row(), gpr = G.groups_per_row();
      row_dot2<BITS>(G.qweight + j * wpr, G.scales + j * gpr, G.biases + j * gpr, xs, xsum, U.qweight + j * wpr,
                     U.scales + j * gpr, U.biases + j * gpr, xs, xsum, nchunk, lpr, gl, cpg, rot, g, u);
    }
    g = group_sum(g, lpr);
    u = group_sum(u, lpr);
    if (valid && gl == 0) act[int64_t(slot) * I + j] = silu_f(g) * u;
  }
}

// dp4a variant of moe_gate_up_kernel (LILAC_GEMV=dp4a): the normalised x quantized once per block as in
// gemv_dp4a_kernel; a group of `lpr` lanes takes one item (gate row j and up row j of one expert) and
// keeps 2 rows × kGuUnroll chunk positions of 16-byte loads in flight.
constexpr int kGuUnroll = 4;
template <int BITS, int MINB>
__global__ void __launch_bounds__(kThreads, MINB)
    moe_gate_up_dp4a_kernel(MoEDecodeWeights w, const float* logits, const float* x, const float* norm_w, float eps,
                            int32_t* sel_ids, float* sel_w, float* act, int lpr, int cpg_log2) {
  extern __shared__ float4 smem4[];
  __shared__ float red[32];
  __shared__ int s_ids[32];
  __shared__ float s_w[33];
  constexpr int EPL = 128 / BITS;
  const int cols = int(w.gate.first.cols);
  const int nchunk = cols / EPL;
  float4* meta = smem4;
  signed char* xq = reinterpret_cast<signed char*>(smem4 + nchunk);
  float* xs = reinterpret_cast<float*>(xq + cols);
  GemvArgs a;
  a.x = x;
  a.pro = Prologue::RmsNorm;
  a.norm_w = norm_w;
  a.eps = eps;
  if ((threadIdx.x >> 5) == 0) route_warp(logits, w.E, w.top_k, w.renormalise, s_ids, s_w, sel_ids, sel_w);
  stage_input(a, xs, cols, red);
  quantize_input<BITS>(xs, cols, xq, meta);
  __syncthreads();
  const int4* xa = reinterpret_cast<const int4*>(xq);
  const int4* xb = xa + nchunk;  // 4-bit only

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int gpw = 32 / lpr, grp = lane / lpr, gl = lane % lpr;
  const int I = int(w.gate.first.rows), Is = int(w.shared_gate.rows);
  const int64_t items = int64_t(w.top_k) * I + Is;
  for (int64_t base = (int64_t(blockIdx.x) * kWarps + warp) * gpw; base < items;
       base += int64_t(gridDim.x) * kWarps * gpw) {
    const int64_t it = base + grp;
    const bool valid = it < items;
    float acc[2] = {0.f, 0.f};
    int slot = 0, j = 0;
    if (valid) {
      QMatrixDev G, U;
      if (it < int64_t(w.top_k) * I) {
        slot = int(it / I);
        j = int(it % I);
        G = w.gate.expert(s_ids[slot]);
        U = w.up.expert(s_ids[slot]);
      } else {
        slot = w.top_k;
        j = int(it - int64_t(w.top_k) * I);
        G = w.shared_gate;
        U = w.shared_up;
      }
      const int64_t wpr4 = G.words_per_row() / 4, gpr = G.groups_per_row();
      const uint4* wp[2] = {reinterpret_cast<const uint4*>(G.qweight) + j * wpr4,
                            reinterpret_cast<const uint4*>(U.qweight) + j * wpr4};
      const __nv_bfloat16* sp[2] = {G.scales + j * gpr, U.scales + j * gpr};
      const __nv_bfloat16* bp[2] = {G.biases + j * gpr, U.biases + j * gpr};
      for (int c = gl; c < nchunk; c += kGuUnroll * lpr) {
        uint4 wv[kGuUnroll][2];
#pragma unroll
        for (int u = 0; u < kGuUnroll; ++u) {
          const int cu = c + u * lpr;
#pragma unroll
          for (int i = 0; i < 2; ++i) wv[u][i] = cu < nchunk ? ld_stream(wp[i] + cu) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < kGuUnroll; ++u) {
          const int cu = c + u * lpr;
          if (cu < nchunk) {
            const float4 m = meta[cu];
            const int4 va = xa[cu];
            const int4 vb = BITS == 4 ? xb[cu] : va;
            const int g = cu >> cpg_log2;
#pragma unroll
            for (int i = 0; i < 2; ++i) {
              const int dot = chunk_dot_i8<BITS>(wv[u][i], va, vb);
              const float sc = bf2f(sp[i][g]), bi = bf2f(bp[i][g]);
              acc[i] = fmaf(sc, fmaf(m.x, float(dot), m.y), fmaf(bi, m.z, acc[i]));
            }
          }
        }
      }
    }
    const float g = group_sum(acc[0], lpr);
    const float u = group_sum(acc[1], lpr);
    if (valid && gl == 0) act[int64_t(slot) * I + j] = silu_f(g) * u;
  }
}

template <int BITS, int MINB>
__global__ void __launch_bounds__(kThreads, MINB)
    moe_down_kernel(MoEDecodeWeights w, const int32_t* sel_ids, const float* sel_w, const float* act, float* y,
                    int lpr) {
  extern __shared__ float4 smem4[];
  __shared__ int s_ids[32];
  __shared__ float s_w[33];
  constexpr int EPL = 128 / BITS;
  const int I = int(w.down.first.cols), Is = int(w.shared_down.cols);
  const int k = w.top_k;
  const int n_act = k * I + Is;
  float* xs = reinterpret_cast<float*>(smem4);
  float* xsum = xs + n_act;
  for (int i = threadIdx.x; i < n_act; i += blockDim.x) xs[i] = act[i];
  if (threadIdx.x < k) s_ids[threadIdx.x] = sel_ids[threadIdx.x];
  if (threadIdx.x <= k) s_w[threadIdx.x] = sel_w[threadIdx.x];
  __syncthreads();
  chunk_sums<BITS>(xs, xsum, n_act / EPL);
  __syncthreads();

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int gpw = 32 / lpr, grp = lane / lpr, gl = lane % lpr;
  const int cpg = w.down.first.group_size / EPL;
  const int nch = I / EPL, nchs = Is / EPL;
  const int64_t rows = w.down.first.rows;
  const int rot = lane & 7;
  for (int64_t base = (int64_t(blockIdx.x) * kWarps + warp) * gpw; base < rows;
       base += int64_t(gridDim.x) * kWarps * gpw) {
    const int64_t r = base + grp;
    const bool valid = r < rows;
    float total = 0.f;
    if (valid) {
      for (int e = 0; e < k; e += 2) {
        const QMatrixDev A = w.down.expert(s_ids[e]);
        const bool two = e + 1 < k;
        const QMatrixDev B = w.down.expert(two ? s_ids[e + 1] : s_ids[e]);
        const int64_t wpr = A.words_per_row(), gpr = A.groups_per_row();
        float va = 0.f, vb = 0.f;
        row_dot2<BITS>(A.qweight + r * wpr, A.scales + r * gpr, A.biases + r * gpr, xs + e * I,
                       xsum + e * nch, two ? B.qweight + r * wpr : nullptr, B.scales + r * gpr, B.biases + r * gpr,
                       xs + (e + 1) * I, xsum + (e + 1) * nch, nch, lpr, gl, cpg, rot, va, vb);
        total += s_w[e] * va + (two ? s_w[e + 1] * vb : 0.f);
      }
      const QMatrixDev S = w.shared_down;
      const int64_t wpr = S.words_per_row(), gpr = S.groups_per_row();
      float vs = 0.f, dummy = 0.f;
      row_dot2<BITS>(S.qweight + r * wpr, S.scales + r * gpr, S.biases + r * gpr, xs + k * I, xsum + k * nch,
                     nullptr, nullptr, nullptr, nullptr, nullptr, nchs, lpr, gl, cpg, rot, vs, dummy);
      total += s_w[k] * vs;
    }
    total = group_sum(total, lpr);
    if (valid && gl == 0) y[r] += total;
  }
}

// dp4a variant of moe_down_kernel (LILAC_GEMV=dp4a): the activations act [k·I + Is] quantized once per
// block (I, Is multiples of 64, so every 64-group lies in one expert's segment); a group of `lpr` lanes
// takes 4 output rows and strides over the chunks of all k + 1 segments (expert of a chunk: c / nch),
// 4 rows × 2 chunk positions of loads in flight; y[r] += Σ_e sel_w[e]·(row r of down_e)·act_e.
template <int BITS, int MINB>
__global__ void __launch_bounds__(kThreads, MINB)
    moe_down_dp4a_kernel(MoEDecodeWeights w, const int32_t* sel_ids, const float* sel_w, const float* act, float* y,
                         int lpr, int cpg_log2) {
  extern __shared__ float4 smem4[];
  __shared__ const uint4* s_q[33];
  __shared__ const __nv_bfloat16* s_sc[33];
  __shared__ const __nv_bfloat16* s_bi[33];
  __shared__ float s_w[33];
  constexpr int EPL = 128 / BITS;
  const int I = int(w.down.first.cols), Is = int(w.shared_down.cols);
  const int k = w.top_k;
  const int n_act = k * I + Is;
  const int nchunk = n_act / EPL, nch = I / EPL, nche = k * nch;
  float4* meta = smem4;
  signed char* xq = reinterpret_cast<signed char*>(smem4 + nchunk);
  float* xs = reinterpret_cast<float*>(xq + n_act);
  for (int i = threadIdx.x; i < n_act; i += blockDim.x) xs[i] = act[i];
  if (threadIdx.x <= k) {
    const int t = threadIdx.x;
    const QMatrixDev M = t < k ? w.down.expert(sel_ids[t]) : w.shared_down;
    s_q[t] = reinterpret_cast<const uint4*>(M.qweight);
    s_sc[t] = M.scales;
    s_bi[t] = M.biases;
    s_w[t] = sel_w[t];
  }
  __syncthreads();
  quantize_input<BITS>(xs, n_act, xq, meta);
  __syncthreads();
  const int4* xa = reinterpret_cast<const int4*>(xq);
  const int4* xb = xa + nchunk;  // 4-bit only

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int gpw = 32 / lpr, grp = lane / lpr, gl = lane % lpr;
  const int64_t rows = w.down.first.rows, nquads = (rows + kDpRows - 1) / kDpRows;
  const int wpr4 = int(w.down.first.words_per_row() / 4), gpr = int(w.down.first.groups_per_row());
  const int wpr4s = int(w.shared_down.words_per_row() / 4), gprs = int(w.shared_down.groups_per_row());
  for (int64_t base = (int64_t(blockIdx.x) * kWarps + warp) * gpw; base < nquads;
       base += int64_t(gridDim.x) * kWarps * gpw) {
    const int64_t qd = base + grp;
    const int64_t r0 = qd * kDpRows;
    float acc[kDpRows];
#pragma unroll
    for (int i = 0; i < kDpRows; ++i) acc[i] = 0.f;
    if (qd < nquads) {
      int dr[kDpRows];  // row offsets from r0 (rows past the end re-read the last row; result dropped)
#pragma unroll
      for (int i = 0; i < kDpRows; ++i) dr[i] = int(min(int64_t(i), rows - 1 - r0));
      for (int c = gl; c < nchunk; c += 2 * lpr) {
        uint4 wv[2][kDpRows];
        int seg[2], cl[2];
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          const int cu = c + u * lpr;
          const bool ok = cu < nchunk;
          const int e = cu < nche ? cu / nch : k;
          seg[u] = e;
          cl[u] = cu - e * nch;
          const bool sh = e == k;
          const int stride = sh ? wpr4s : wpr4;
          const uint4* q = s_q[ok ? e : 0] + r0 * stride + cl[u];
#pragma unroll
          for (int i = 0; i < kDpRows; ++i) wv[u][i] = ok ? ld_stream(q + dr[i] * stride) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          const int cu = c + u * lpr;
          if (cu < nchunk) {
            const int e = seg[u];
            const bool sh = e == k;
            const int gp = sh ? gprs : gpr;
            const int64_t goff = r0 * gp + (cl[u] >> cpg_log2);
            const __nv_bfloat16* sp = s_sc[e] + goff;
            const __nv_bfloat16* bp = s_bi[e] + goff;
            const float sw = s_w[e];
            const float4 m = meta[cu];
            const int4 va = xa[cu];
            const int4 vb = BITS == 4 ? xb[cu] : va;
#pragma unroll
            for (int i = 0; i < kDpRows; ++i) {
              const int dot = chunk_dot_i8<BITS>(wv[u][i], va, vb);
              const float sc = bf2f(sp[dr[i] * gp]), bi = bf2f(bp[dr[i] * gp]);
              acc[i] = fmaf(sw, fmaf(sc, fmaf(m.x, float(dot), m.y), bi * m.z), acc[i]);
            }
          }
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kDpRows; ++i) acc[i] = group_sum(acc[i], lpr);
    if (qd < nquads && gl == 0) {
#pragma unroll
      for (int i = 0; i < kDpRows; ++i)
        if (r0 + i < rows) y[r0 + i] += acc[i];
    }
  }
}

// half2 variant of moe_gate_up_kernel (LILAC_GEMV=half2, 4-bit): the normalised x staged once per block
// as fp16 (qdot_half2.cuh); the item partition and load pipelining of moe_gate_up_dp4a_kernel.
template <int MINB>
__global__ void __launch_bounds__(kThreads, MINB)
    moe_gate_up_half2_kernel(MoEDecodeWeights w, const float* logits, const float* x, const float* norm_w, float eps,
                             int32_t* sel_ids, float* sel_w, float* act, int lpr, int cpg_log2) {
  extern __shared__ float4 smem4[];
  __shared__ float red[32];
  __shared__ int s_ids[32];
  __shared__ float s_w[33];
  const int cols = int(w.gate.first.cols);
  const int nchunk = cols / 32;
  float4* meta = smem4;
  __half* xh = reinterpret_cast<__half*>(smem4 + nchunk);
  float* xs = reinterpret_cast<float*>(xh + cols);
  GemvArgs a;
  a.x = x;
  a.pro = Prologue::RmsNorm;
  a.norm_w = norm_w;
  a.eps = eps;
  if ((threadIdx.x >> 5) == 0) route_warp(logits, w.E, w.top_k, w.renormalise, s_ids, s_w, sel_ids, sel_w);
  stage_input(a, xs, cols, red);
  stage_input_h2(xs, cols, xh, meta);
  __syncthreads();
  const uint4* xv = reinterpret_cast<const uint4*>(xh);

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int gpw = 32 / lpr, grp = lane / lpr, gl = lane % lpr;
  const int I = int(w.gate.first.rows), Is = int(w.shared_gate.rows);
  const int64_t items = int64_t(w.top_k) * I + Is;
  for (int64_t base = (int64_t(blockIdx.x) * kWarps + warp) * gpw; base < items;
       base += int64_t(gridDim.x) * kWarps * gpw) {
    const int64_t it = base + grp;
    const bool valid = it < items;
    float acc[2] = {0.f, 0.f};
    int slot = 0, j = 0;
    if (valid) {
      QMatrixDev G, U;
      if (it < int64_t(w.top_k) * I) {
        slot = int(it / I);
        j = int(it % I);
        G = w.gate.expert(s_ids[slot]);
        U = w.up.expert(s_ids[slot]);
      } else {
        slot = w.top_k;
        j = int(it - int64_t(w.top_k) * I);
        G = w.shared_gate;
        U = w.shared_up;
      }
      const int64_t wpr4 = G.words_per_row() / 4, gpr = G.groups_per_row();
      const uint4* wp[2] = {reinterpret_cast<const uint4*>(G.qweight) + j * wpr4,
                            reinterpret_cast<const uint4*>(U.qweight) + j * wpr4};
      const __nv_bfloat16* sp[2] = {G.scales + j * gpr, U.scales + j * gpr};
      const __nv_bfloat16* bp[2] = {G.biases + j * gpr, U.biases + j * gpr};
      for (int c = gl; c < nchunk; c += kGuUnroll * lpr) {
        uint4 wv[kGuUnroll][2];
#pragma unroll
        for (int u = 0; u < kGuUnroll; ++u) {
          const int cu = c + u * lpr;
#pragma unroll
          for (int i = 0; i < 2; ++i) wv[u][i] = cu < nchunk ? ld_stream(wp[i] + cu) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < kGuUnroll; ++u) {
          const int cu = c + u * lpr;
          if (cu < nchunk) {
            const float4 m = meta[cu];
            const uint4 x0 = xv[cu], x1 = xv[nchunk + cu], x2 = xv[2 * nchunk + cu], x3 = xv[3 * nchunk + cu];
            const int g = cu >> cpg_log2;
#pragma unroll
            for (int i = 0; i < 2; ++i) {
              const float dot = chunk_dot_h2(wv[u][i], x0, x1, x2, x3);
              const float sc = bf2f(sp[i][g]), bi = bf2f(bp[i][g]);
              acc[i] = fmaf(sc, fmaf(m.x, dot, m.y), fmaf(bi, m.z, acc[i]));
            }
          }
        }
      }
    }
    const float g = group_sum(acc[0], lpr);
    const float u = group_sum(acc[1], lpr);
    if (valid && gl == 0) act[int64_t(slot) * I + j] = silu_f(g) * u;
  }
}

// half2 variant of moe_down_kernel (LILAC_GEMV=half2, 4-bit): act [k·I + Is] staged once per block as fp16
// per chunk of 32 (I, Is multiples of 64: no chunk straddles two segments); the row partition and load
// pipelining of moe_down_dp4a_kernel.
template <int MINB>
__global__ void __launch_bounds__(kThreads, MINB)
    moe_down_half2_kernel(MoEDecodeWeights w, const int32_t* sel_ids, const float* sel_w, const float* act, float* y,
                          int lpr, int cpg_log2) {
  extern __shared__ float4 smem4[];
  __shared__ const uint4* s_q[33];
  __shared__ const __nv_bfloat16* s_sc[33];
  __shared__ const __nv_bfloat16* s_bi[33];
  __shared__ float s_w[33];
  constexpr int EPL = 32;
  const int I = int(w.down.first.cols), Is = int(w.shared_down.cols);
  const int k = w.top_k;
  const int n_act = k * I + Is;
  const int nchunk = n_act / EPL, nch = I / EPL, nche = k * nch;
  float4* meta = smem4;
  __half* xh = reinterpret_cast<__half*>(smem4 + nchunk);
  float* xs = reinterpret_cast<float*>(xh + n_act);
  for (int i = threadIdx.x; i < n_act; i += blockDim.x) xs[i] = act[i];
  if (threadIdx.x <= k) {
    const int t = threadIdx.x;
    const QMatrixDev M = t < k ? w.down.expert(sel_ids[t]) : w.shared_down;
    s_q[t] = reinterpret_cast<const uint4*>(M.qweight);
    s_sc[t] = M.scales;
    s_bi[t] = M.biases;
    s_w[t] = sel_w[t];
  }
  __syncthreads();
  stage_input_h2(xs, n_act, xh, meta);
  __syncthreads();
  const uint4* xv = reinterpret_cast<const uint4*>(xh);

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int gpw = 32 / lpr, grp = lane / lpr, gl = lane % lpr;
  const int64_t rows = w.down.first.rows, nquads = (rows + kDpRows - 1) / kDpRows;
  const int wpr4 = int(w.down.first.words_per_row() / 4), gpr = int(w.down.first.groups_per_row());
  const int wpr4s = int(w.shared_down.words_per_row() / 4), gprs = int(w.shared_down.groups_per_row());
  for (int64_t base = (int64_t(blockIdx.x) * kWarps + warp) * gpw; base < nquads;
       base += int64_t(gridDim.x) * kWarps * gpw) {
    const int64_t qd = base + grp;
    const int64_t r0 = qd * kDpRows;
    float acc[kDpRows];
#pragma unroll
    for (int i = 0; i < kDpRows; ++i) acc[i] = 0.f;
    if (qd < nquads) {
      int dr[kDpRows];  // row offsets from r0 (rows past the end re-read the last row; result dropped)
#pragma unroll
      for (int i = 0; i < kDpRows; ++i) dr[i] = int(min(int64_t(i), rows - 1 - r0));
      for (int c = gl; c < nchunk; c += 2 * lpr) {
        uint4 wv[2][kDpRows];
        int seg[2], cl[2];
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          const int cu = c + u * lpr;
          const bool ok = cu < nchunk;
          const int e = cu < nche ? cu / nch : k;
          seg[u] = e;
          cl[u] = cu - e * nch;
          const bool sh = e == k;
          const int stride = sh ? wpr4s : wpr4;
          const uint4* q = s_q[ok ? e : 0] + r0 * stride + cl[u];
#pragma unroll
          for (int i = 0; i < kDpRows; ++i) wv[u][i] = ok ? ld_stream(q + dr[i] * stride) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          const int cu = c + u * lpr;
          if (cu < nchunk) {
            const int e = seg[u];
            const bool sh = e == k;
            const int gp = sh ? gprs : gpr;
            const int64_t goff = r0 * gp + (cl[u] >> cpg_log2);
            const __nv_bfloat16* sp = s_sc[e] + goff;
            const __nv_bfloat16* bp = s_bi[e] + goff;
            const float sw = s_w[e];
            const float4 m = meta[cu];
            const uint4 x0 = xv[cu], x1 = xv[nchunk + cu], x2 = xv[2 * nchunk + cu], x3 = xv[3 * nchunk + cu];
#pragma unroll
            for (int i = 0; i < kDpRows; ++i) {
              const float dot = chunk_dot_h2(wv[u][i], x0, x1, x2, x3);
              const float sc = bf2f(sp[dr[i] * gp]), bi = bf2f(bp[dr[i] * gp]);
              acc[i] = fmaf(sw, fmaf(sc, fmaf(m.x, dot, m.y), bi * m.z), acc[i]);
            }
          }
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kDpRows; ++i) acc[i] = group_sum(acc[i], lpr);
    if (qd < nquads && gl == 0) {
#pragma unroll
      for (int i = 0; i < kDpRows; ++i)
        if (r0 + i < rows) y[r0 + i] += acc[i];
    }
  }
}

template <int BITS>
__global__ void embed_kernel(QMatrixDev E, const int32_t* token, float* out) {
  pdl_wait();
  pdl_trigger();
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= E.cols) return;
  const int64_t t = *token;
  constexpr int per = 32 / BITS;
  const uint32_t word = E.qweight[t * E.words_per_row() + c / per];
  const uint32_t q = (word >> ((c % per) * BITS)) & ((1u << BITS) - 1u);
  const int64_t g = t * E.groups_per_row() + c / E.group_size;
  out[c] = bf2f(E.scales[g]) * float(q) + bf2f(E.biases[g]);
}

// Blocks: enough for the work, but no more than fit on the GPU at once (each block stages its input
// once and then loops over rows, so extra waves would only repeat the staging).
template <typename K>
int grid_for(K kernel, size_t smem, int64_t work_items_per_warp_group, int gpw) {
  const int64_t per_block = int64_t(kWarps) * gpw;
  const int64_t need = (work_items_per_warp_group + per_block - 1) / per_block;
  static const bool many = [] {  // LILAC_GEMV_MANY_BLOCKS=1: the first version's 8 blocks per SM
    const char* e = std::getenv("LILAC_GEMV_MANY_BLOCKS");
    return e && std::string(e) == "1";
  }();
  if (many) return int(std::max<int64_t>(1, std::min<int64_t>(need, int64_t(num_sms()) * 8)));
  int occ = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kernel, kThreads, smem) != cudaSuccess || occ < 1) {
    cudaGetLastError();
    occ = 1;
  }
  return int(std::max<int64_t>(1, std::min<int64_t>(need, int64_t(num_sms()) * occ)));
}

// LILAC_GEMV_MINB=2|3|4: ask the compiler for that many resident 256-thread blocks per SM (caps the
// registers: more warps in flight, possibly spills). Default 1 (no cap).
int gemv_minb() {
  static const int v = [] {
    const char* e = std::getenv("LILAC_GEMV_MINB");
    const int n = e ? std::atoi(e) : 1;
    return (n == 2 || n == 3 || n == 4) ? n : 1;
  }();
  return v;
}

// The dp4a path: asked for (GemvImpl::Dp4a, or FromEnv with LILAC_GEMV=dp4a) and the group size is a
// power of two (chunk → group by a shift) and the input fits in shared memory. Otherwise the fp32 path.
int dp4a_unroll() {
  static const int v = [] {
    const char* e = std::getenv("LILAC_GEMV_DP4A_UNROLL");
    return e && std::string(e) == "1" ? 1 : 2;
  }();
  return v;
}

// The half2 path: asked for (GemvImpl::Half2, or FromEnv with LILAC_GEMV=half2), 4-bit, a power-of-two
// group size and the staged input fits in shared memory. Otherwise the fp32 path.
bool gemv_use_half2(GemvImpl impl, const QMatrixDev& W) {
  if (impl == GemvImpl::FromEnv) impl = gemv_impl_from_env();
  if (impl != GemvImpl::Half2) return false;
  return W.bits == 4 && W.group_size > 0 && (W.group_size & (W.group_size - 1)) == 0 &&
         half2_smem(W.cols) <= 48 * 1024;
}

int cpg_log2_of(int epl, int group_size) {
  int l = 0;
  while ((epl << l) < group_size) ++l;
  return l;
}

bool gemv_use_dp4a(GemvImpl impl, const QMatrixDev& W) {
  if (impl == GemvImpl::FromEnv) impl = gemv_impl_from_env();
  if (impl != GemvImpl::Dp4a) return false;
  return W.group_size > 0 && (W.group_size & (W.group_size - 1)) == 0 && dp4a_smem(W.cols, W.bits) <= 48 * 1024;
}

}  // namespace

GemvImpl gemv_impl_from_env() {
  const char* e = std::getenv("LILAC_GEMV");
  if (e && std::string(e) == "dp4a") return GemvImpl::Dp4a;
  if (e && std::string(e) == "half2") return GemvImpl::Half2;
  if (e && std::string(e) == "fp32") return GemvImpl::Fp32;
  return GemvImpl::Tensor;
}

void gemv(const GemvArgs& a, cudaStream_t stream) {
  check_q(a.W, "gemv");
  const GemvImpl impl = a.impl == GemvImpl::FromEnv ? gemv_impl_from_env() : a.impl;
  if (impl == GemvImpl::Tensor && gemv_tc_supported(a)) {
    gemv_tc(a, stream);
    return;
  }
  if (gemv_use_half2(a.impl, a.W)) {
    const int unroll = dp4a_unroll();
    const int64_t nchunk = a.W.cols / 32;
    const int lpr = lanes_per_row(std::max<int64_t>(1, nchunk / unroll));
    const int64_t nquads = (a.W.rows + kDpRows - 1) / kDpRows;
    const size_t smem = half2_smem(a.W.cols);
    const int cpg_log2 = cpg_log2_of(32, a.W.group_size);
    auto go = [&](auto kernel) {
      kernel<<<grid_for(kernel, smem, nquads, 32 / lpr), kThreads, smem, stream>>>(a, lpr, cpg_log2);
    };
    unroll == 1 ? go(gemv_half2_kernel<1, 4>) : go(gemv_half2_kernel<2, 3>);
    LILAC_CUDA_LAUNCH_CHECK();
    return;
  }
  if (gemv_use_dp4a(a.impl, a.W)) {
    const int unroll = dp4a_unroll();
    const int epl = 128 / a.W.bits;
    const int64_t nchunk = a.W.cols / epl;
    const int lpr = lanes_per_row(std::max<int64_t>(1, nchunk / unroll));
    const int64_t nquads = (a.W.rows + kDpRows - 1) / kDpRows;
    const size_t smem = dp4a_smem(a.W.cols, a.W.bits);
    LILAC_CHECK(smem <= 48 * 1024, "gemv: input too wide for the decode GEMV (" + std::to_string(a.W.cols) + ")");
    int cpg_log2 = 0;
    while ((epl << cpg_log2) < a.W.group_size) ++cpg_log2;
    auto go = [&](auto kernel) {
      kernel<<<grid_for(kernel, smem, nquads, 32 / lpr), kThreads, smem, stream>>>(a, lpr, cpg_log2);
    };
    if (a.W.bits == 4)
      unroll == 1 ? go(gemv_dp4a_kernel<4, 1, 4>) : go(gemv_dp4a_kernel<4, 2, 3>);
    else
      unroll == 1 ? go(gemv_dp4a_kernel<8, 1, 4>) : go(gemv_dp4a_kernel<8, 2, 3>);
    LILAC_CUDA_LAUNCH_CHECK();
    return;
  }
  const int epl = 128 / a.W.bits;
  const int64_t nchunk = a.W.cols / epl;
  const int lpr = lanes_per_row(nchunk);
  const int64_t npairs = (a.W.rows + 1) / 2;
  const size_t smem = size_t(a.W.cols + nchunk) * sizeof(float);
  LILAC_CHECK(smem <= 48 * 1024, "gemv: input too wide for the decode GEMV (" + std::to_string(a.W.cols) + ")");
  auto go = [&](auto kernel) {
    kernel<<<grid_for(kernel, smem, npairs, 32 / lpr), kThreads, smem, stream>>>(a, lpr);
  };
  const int mb = gemv_minb();
  if (a.W.bits == 4)
    mb == 1 ? go(gemv_kernel<4, 1>) : mb == 2 ? go(gemv_kernel<4, 2>) : mb == 3 ? go(gemv_kernel<4, 3>) : go(gemv_kernel<4, 4>);
  else
    go(gemv_kernel<8, 1>);
  LILAC_CUDA_LAUNCH_CHECK();
}

void embed_gather(const QMatrixDev& E, const int32_t* token, float* out, cudaStream_t stream) {
  const int grid = int((E.cols + 255) / 256);
  if (E.bits == 4)
    launch_pdl(embed_kernel<4>, dim3(grid), dim3(256), 0, stream, E, token, out);
  else if (E.bits == 8)
    launch_pdl(embed_kernel<8>, dim3(grid), dim3(256), 0, stream, E, token, out);
  else
    throw Error("embed_gather: only 4- and 8-bit embeddings are supported");
  LILAC_CUDA_LAUNCH_CHECK();
}

static void check_moe(const MoEDecodeWeights& w) {
  check_q(w.gate.first, "moe gate");
  check_q(w.down.first, "moe down");
  LILAC_CHECK(w.top_k >= 1 && w.top_k <= 32 && w.E >= w.top_k && w.E <= 512, "moe: unsupported top_k / experts");
  const int b = w.gate.first.bits;
  LILAC_CHECK(w.up.first.bits == b && w.down.first.bits == b && w.shared_gate.bits == b && w.shared_up.bits == b &&
                  w.shared_down.bits == b,
              "moe: the experts and the shared expert must have the same bits");
  LILAC_CHECK(w.shared_gate.cols == w.gate.first.cols && w.shared_down.rows == w.down.first.rows,
              "moe: shared expert shape mismatch");
  LILAC_CHECK(w.shared_down.cols % 64 == 0, "moe: shared expert intermediate size must be a multiple of 64");
}

void moe_gate_up(const MoEDecodeWeights& w, const float* logits, const float* x, const float* norm_w, float eps,
                 int32_t* sel_ids, float* sel_w, float* act, cudaStream_t stream, GemvImpl moe_impl) {
  check_moe(w);
  if (moe_impl == GemvImpl::FromEnv) moe_impl = gemv_impl_from_env();
  if (moe_impl == GemvImpl::Tensor && moe_tc_supported(w, x, norm_w, act)) {
    moe_gate_up_tc(w, logits, x, norm_w, eps, sel_ids, sel_w, act, stream);
    return;
  }
  const int bits = w.gate.first.bits, epl = 128 / bits;
  const int64_t cols = w.gate.first.cols, nchunk = cols / epl;
  if (moe_impl == GemvImpl::FromEnv) moe_impl = gemv_impl_from_env();
  if (moe_impl == GemvImpl::Half2 && gemv_use_half2(GemvImpl::Half2, w.gate.first) &&
      w.up.first.group_size == w.gate.first.group_size && w.shared_gate.group_size == w.gate.first.group_size &&
      w.shared_up.group_size == w.gate.first.group_size) {
    const int lpr = lanes_per_row(std::max<int64_t>(1, (cols / 32) / kGuUnroll));
    const int64_t items = int64_t(w.top_k) * w.gate.first.rows + w.shared_gate.rows;
    const size_t smem = half2_smem(cols);
    const int cpg_log2 = cpg_log2_of(32, w.gate.first.group_size);
    auto kernel = moe_gate_up_half2_kernel<3>;
    kernel<<<grid_for(kernel, smem, items, 32 / lpr), kThreads, smem, stream>>>(w, logits, x, norm_w, eps, sel_ids,
                                                                            sel_w, act, lpr, cpg_log2);
    LILAC_CUDA_LAUNCH_CHECK();
    return;
  }
  if (moe_impl == GemvImpl::Dp4a && gemv_use_dp4a(GemvImpl::Dp4a, w.gate.first) &&
      w.up.first.group_size == w.gate.first.group_size && w.shared_gate.group_size == w.gate.first.group_size &&
      w.shared_up.group_size == w.gate.first.group_size) {
    const int lpr = lanes_per_row(std::max<int64_t>(1, nchunk / kGuUnroll));
    const int64_t items = int64_t(w.top_k) * w.gate.first.rows + w.shared_gate.rows;
    const size_t smem = dp4a_smem(cols, bits);
    int cpg_log2 = 0;
    while ((epl << cpg_log2) < w.gate.first.group_size) ++cpg_log2;
    auto go = [&](auto kernel) {
      kernel<<<grid_for(kernel, smem, items, 32 / lpr), kThreads, smem, stream>>>(w, logits, x, norm_w, eps, sel_ids,
                                                                              sel_w, act, lpr, cpg_log2);
    };
    if (bits == 4)
      go(moe_gate_up_dp4a_kernel<4, 3>);
    else
      go(moe_gate_up_dp4a_kernel<8, 3>);
    LILAC_CUDA_LAUNCH_CHECK();
    return;
  }
  const int lpr = lanes_per_row(nchunk);
  const int64_t items = int64_t(w.top_k) * w.gate.first.rows + w.shared_gate.rows;
  const size_t smem = size_t(cols + nchunk) * sizeof(float);
  auto go = [&](auto kernel) {
    kernel<<<grid_for(kernel, smem, items, 32 / lpr), kThreads, smem, stream>>>(w, logits, x, norm_w, eps, sel_ids,
                                                                            sel_w, act, lpr);
  };
  const int mb = gemv_minb();
  if (bits == 4)
    mb == 1 ? go(moe_gate_up_kernel<4, 1>) : mb == 2 ? go(moe_gate_up_kernel<4, 2>) : mb == 3 ? go(moe_gate_up_kernel<4, 3>) : go(moe_gate_up_kernel<4, 4>);
  else
    go(moe_gate_up_kernel<8, 1>);
  LILAC_CUDA_LAUNCH_CHECK();
}

void moe_down(const MoEDecodeWeights& w, const int32_t* sel_ids, const float* sel_w, const float* act, float* y,
              cudaStream_t stream, GemvImpl impl) {
  check_moe(w);
  if (impl == GemvImpl::FromEnv) impl = gemv_impl_from_env();
  if (impl == GemvImpl::Tensor && moe_tc_supported(w, act, nullptr, act)) {
    moe_down_tc(w, sel_ids, sel_w, act, y, stream);
    return;
  }
  const int bits = w.down.first.bits, epl = 128 / bits;
  const int64_t I = w.down.first.cols, Is = w.shared_down.cols;
  const int64_t n_act = w.top_k * I + Is;
  if (impl == GemvImpl::FromEnv) impl = gemv_impl_from_env();
  if (impl == GemvImpl::Half2 && gemv_use_half2(GemvImpl::Half2, w.down.first) &&
      w.shared_down.group_size == w.down.first.group_size && half2_smem(n_act) <= 48 * 1024) {
    const int64_t nchunk = n_act / 32;
    const int lpr = lanes_per_row(std::max<int64_t>(1, nchunk / 2));
    const int64_t nquads = (w.down.first.rows + kDpRows - 1) / kDpRows;
    const size_t smem = half2_smem(n_act);
    const int cpg_log2 = cpg_log2_of(32, w.down.first.group_size);
    auto kernel = moe_down_half2_kernel<3>;
    kernel<<<grid_for(kernel, smem, nquads, 32 / lpr), kThreads, smem, stream>>>(w, sel_ids, sel_w, act, y, lpr,
                                                                             cpg_log2);
    LILAC_CUDA_LAUNCH_CHECK();
    return;
  }
  if (impl == GemvImpl::Dp4a && gemv_use_dp4a(GemvImpl::Dp4a, w.down.first) &&
      w.shared_down.group_size == w.down.first.group_size && dp4a_smem(n_act, bits) <= 48 * 1024) {
    const int64_t nchunk = n_act / epl;
    const int lpr = lanes_per_row(std::max<int64_t>(1, nchunk / 2));
    const int64_t nquads = (w.down.first.rows + kDpRows - 1) / kDpRows;
    const size_t smem = dp4a_smem(n_act, bits);
    int cpg_log2 = 0;
    while ((epl << cpg_log2) < w.down.first.group_size) ++cpg_log2;
    auto go = [&](auto kernel) {
      kernel<<<grid_for(kernel, smem, nquads, 32 / lpr), kThreads, smem, stream>>>(w, sel_ids, sel_w, act, y, lpr,
                                                                               cpg_log2);
    };
    if (bits == 4)
      go(moe_down_dp4a_kernel<4, 3>);
    else
      go(moe_down_dp4a_kernel<8, 2>);  // 8-bit spills 4 bytes at 80 registers
    LILAC_CUDA_LAUNCH_CHECK();
    return;
  }
  const int lpr = lanes_per_row(std::min(I, Is) / epl);
  const size_t smem = size_t(n_act + n_act / epl) * sizeof(float);
  LILAC_CHECK(smem <= 48 * 1024, "moe_down: too many expert activations for shared memory");
  const int64_t rows = w.down.first.rows;
  auto go = [&](auto kernel) {
    kernel<<<grid_for(kernel, smem, rows, 32 / lpr), kThreads, smem, stream>>>(w, sel_ids, sel_w, act, y, lpr);
  };
  const int mb = gemv_minb();
  if (bits == 4)
    mb == 1 ? go(moe_down_kernel<4, 1>) : mb == 2 ? go(moe_down_kernel<4, 2>) : mb == 3 ? go(moe_down_kernel<4, 3>) : go(moe_down_kernel<4, 4>);
  else
    go(moe_down_kernel<8, 1>);
  LILAC_CUDA_LAUNCH_CHECK();
}

}  // namespace lilac::cuda
