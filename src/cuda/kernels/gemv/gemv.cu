// Decode GEMV (one token): quantized weights (4/8-bit, MLX layout) with dequantization fused,
// input prologues (RMSNorm / gated head norm) and the Gated DeltaNet conv epilogue fused; the MoE
// gather-GEMVs (routing + gate/up + SwiGLU, down + weighted combine + residual add); the embedding gather.
#include <algorithm>
#include <cstdlib>
#include <string>

#include "cuda/cuda_common.h"
#include "cuda/kernels/digits/moe_digits.h"
#include "cuda/kernels/gemv/gemv.h"
#include "cuda/kernels/gemv/gemv_common.cuh"
#include "cuda/kernels/gemv/gemv_tc.h"
#include "cuda/kernels/launch.cuh"
#include "cuda/kernels/qdot.cuh"

namespace lilac::cuda {
namespace {

using namespace dev;
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;


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


template <int BITS>
__global__ void __launch_bounds__(kThreads, 1) gemv_kernel(GemvArgs a, int lpr) {
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
      gemv_store_row(a, r0, v0);
      if (has1) gemv_store_row(a, r1, v1);
    }
  }
}

// ------------------------------------------------------------------------------------------------ MoE

template <int BITS>
__global__ void __launch_bounds__(kThreads, 1)
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

template <int BITS>
__global__ void __launch_bounds__(kThreads, 1)
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
  int occ = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kernel, kThreads, smem) != cudaSuccess || occ < 1) {
    cudaGetLastError();
    occ = 1;
  }
  return int(std::max<int64_t>(1, std::min<int64_t>(need, int64_t(sm_count()) * occ)));
}


}  // namespace

GemvImpl gemv_impl_from_env() {
  const char* e = std::getenv("LILAC_GEMV");
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
  const int epl = 128 / a.W.bits;
  const int64_t nchunk = a.W.cols / epl;
  const int lpr = lanes_per_row(nchunk);
  const int64_t npairs = (a.W.rows + 1) / 2;
  const size_t smem = size_t(a.W.cols + nchunk) * sizeof(float);
  LILAC_CHECK(smem <= 48 * 1024, "gemv: input too wide for the decode GEMV (" + std::to_string(a.W.cols) + ")");
  auto go = [&](auto kernel) {
    kernel<<<grid_for(kernel, smem, npairs, 32 / lpr), kThreads, smem, stream>>>(a, lpr);
  };
  if (a.W.bits == 4)
    go(gemv_kernel<4>);
  else
    go(gemv_kernel<8>);
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
  LILAC_CHECK(w.top_k >= 1 && w.top_k <= 31 && w.E >= w.top_k && w.E <= 512, "moe: unsupported top_k / experts");
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
  if (w.digits) {
    digits::moe_gate_up_one(w, logits, x, norm_w, eps, sel_ids, sel_w, act, stream);
    return;
  }
  if (moe_impl == GemvImpl::FromEnv) moe_impl = gemv_impl_from_env();
  if (moe_impl == GemvImpl::Tensor && moe_tc_supported(w, x, norm_w, act)) {
    moe_gate_up_tc(w, logits, x, norm_w, eps, sel_ids, sel_w, act, stream);
    return;
  }
  const int bits = w.gate.first.bits, epl = 128 / bits;
  const int64_t cols = w.gate.first.cols, nchunk = cols / epl;
  const int lpr = lanes_per_row(nchunk);
  const int64_t items = int64_t(w.top_k) * w.gate.first.rows + w.shared_gate.rows;
  const size_t smem = size_t(cols + nchunk) * sizeof(float);
  auto go = [&](auto kernel) {
    kernel<<<grid_for(kernel, smem, items, 32 / lpr), kThreads, smem, stream>>>(w, logits, x, norm_w, eps, sel_ids,
                                                                            sel_w, act, lpr);
  };
  if (bits == 4)
    go(moe_gate_up_kernel<4>);
  else
    go(moe_gate_up_kernel<8>);
  LILAC_CUDA_LAUNCH_CHECK();
}

void moe_down(const MoEDecodeWeights& w, const int32_t* sel_ids, const float* sel_w, const float* act, float* y,
              cudaStream_t stream, GemvImpl impl) {
  check_moe(w);
  if (w.digits) {
    digits::moe_down_one(w, sel_ids, sel_w, act, y, stream);
    return;
  }
  if (impl == GemvImpl::FromEnv) impl = gemv_impl_from_env();
  if (impl == GemvImpl::Tensor && moe_tc_supported(w, act, nullptr, act)) {
    moe_down_tc(w, sel_ids, sel_w, act, y, stream);
    return;
  }
  const int bits = w.down.first.bits, epl = 128 / bits;
  const int64_t I = w.down.first.cols, Is = w.shared_down.cols;
  const int64_t n_act = w.top_k * I + Is;
  const int lpr = lanes_per_row(std::min(I, Is) / epl);
  const size_t smem = size_t(n_act + n_act / epl) * sizeof(float);
  LILAC_CHECK(smem <= 48 * 1024, "moe_down: too many expert activations for shared memory");
  const int64_t rows = w.down.first.rows;
  auto go = [&](auto kernel) {
    kernel<<<grid_for(kernel, smem, rows, 32 / lpr), kThreads, smem, stream>>>(w, sel_ids, sel_w, act, y, lpr);
  };
  if (bits == 4)
    go(moe_down_kernel<4>);
  else
    go(moe_down_kernel<8>);
  LILAC_CUDA_LAUNCH_CHECK();
}

}  // namespace lilac::cuda
