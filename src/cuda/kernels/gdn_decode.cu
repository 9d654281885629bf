// Gated DeltaNet decode step, fused: L2 norms of q and k, the gates, the delta-rule recurrence on the
// fp32 state (read once, written once, kept in registers), the output o = Sᵀq̂. The conv + SiLU ran in
// the in_proj GEMV's epilogue; the gated output norm runs in the out_proj GEMV's prologue.
// Grid: (value head, 32-column slice of the state); block: one warp per 32 key rows.
#include <string>

#include "cuda/cuda_common.h"
#include "cuda/kernels/decode.h"
#include "cuda/kernels/qdot.cuh"

namespace lilac::cuda {
namespace {
using namespace dev;
constexpr int kMaxDk = 256;

__global__ void gdn_step_kernel(GdnShape s, const float* qkv, const float* bp, const float* ap, const float* A_log,
                                const float* dt_bias, float* state, float* out) {
  __shared__ float qs[kMaxDk], ks[kMaxDk];
  __shared__ float red[32];
  __shared__ float part[kMaxDk / 32][32];
  const int h = blockIdx.x, dk = s.dk, dv = s.dv;
  const int kh = h / (s.Hv / s.Hk);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  float sq = 0.f, sk = 0.f;
  for (int i = threadIdx.x; i < dk; i += blockDim.x) {
    const float qv = qkv[int64_t(kh) * dk + i], kv = qkv[int64_t(s.Hk) * dk + int64_t(kh) * dk + i];
    qs[i] = qv;
    ks[i] = kv;
    sq += qv * qv;
    sk += kv * kv;
  }
  sq = block_sum(sq, red);
  sk = block_sum(sk, red);
  const float rq = rsqrtf(sq + 1e-6f) * rsqrtf(float(dk)), rk = rsqrtf(sk + 1e-6f);
  const float beta = sigmoid_f(bp[h]);
  const float xa = ap[h] + dt_bias[h];
  const float sp = xa > 20.f ? xa : log1pf(expf(xa));
  const float g = -expf(A_log[h]) * sp;
  const float eg = expf(g);
  const int col = blockIdx.y * 32 + lane;
  const bool cv = col < dv;
  const float v = cv ? qkv[2 * int64_t(s.Hk) * dk + int64_t(h) * dv + col] : 0.f;
  float* S = state + int64_t(h) * dk * dv + col;
  float sr[32];
  float u = 0.f;
#pragma unroll
  for (int r = 0; r < 32; ++r) {
    const int i = warp * 32 + r;
    sr[r] = (cv && i < dk) ? S[int64_t(i) * dv] * eg : 0.f;
  }
#pragma unroll
  for (int r = 0; r < 32; ++r) {
    const int i = warp * 32 + r;
    if (i < dk) u = fmaf(sr[r], ks[i] * rk, u);
  }
  part[warp][lane] = u;
  __syncthreads();
  u = 0.f;
  for (int w = 0; w < nw; ++w) u += part[w][lane];
  const float delta = beta * (v - u);
  float o = 0.f;
#pragma unroll
  for (int r = 0; r < 32; ++r) {
    const int i = warp * 32 + r;
    if (i < dk) {
      sr[r] = fmaf(ks[i] * rk, delta, sr[r]);
      o = fmaf(sr[r], qs[i] * rq, o);
    }
  }
  __syncthreads();
  part[warp][lane] = o;
#pragma unroll
  for (int r = 0; r < 32; ++r) {
    const int i = warp * 32 + r;
    if (cv && i < dk) S[int64_t(i) * dv] = sr[r];
  }
  __syncthreads();
  if (warp == 0 && cv) {
    o = 0.f;
    for (int w = 0; w < nw; ++w) o += part[w][lane];
    out[int64_t(h) * dv + col] = o;
  }
}

}  // namespace

void gdn_decode_step(const GdnShape& s, const float* qkv, const float* b, const float* a, const float* A_log,
                     const float* dt_bias, float* state, float* out, cudaStream_t stream) {
  LILAC_CHECK(s.dk > 0 && s.dk <= kMaxDk && s.dv > 0 && s.Hk > 0 && s.Hv % s.Hk == 0,
              "gdn decode: unsupported shape (dk " + std::to_string(s.dk) + ")");
  const int nw = (s.dk + 31) / 32;
  gdn_step_kernel<<<dim3(s.Hv, (s.dv + 31) / 32), nw * 32, 0, stream>>>(s, qkv, b, a, A_log, dt_bias, state, out);
  LILAC_CUDA_LAUNCH_CHECK();
}

}  // namespace lilac::cuda
