// Gated DeltaNet prefill (gdn.h): causal conv + SiLU over the chunk, then the recurrence as a
// column-parallel sequential scan (exact fp32, token by token), then the gated output RMSNorm.
//
// Fast path (args.work given): a prep kernel computes q̂, k̂, k̂·q̂, e^g, β once per token (one warp per
// token and key head), and the scan streams them in with double-buffered cp.async.
// Scan layout: value column j of S evolves on its own:
//   δ_j = β (v_j − e^g S[:,j]·k̂) ;  o_j = e^g S[:,j]·q̂ + (k̂·q̂) δ_j ;  S[:,j] ← e^g S[:,j] + k̂ δ_j
// A block owns one value head and COLS columns; 8 threads share a column (16 key rows each, in
// registers), so each token costs two 3-step shuffle reductions. q̂, k̂ (normalised), e^g, β, k̂·q̂ and
// v of a block of T tokens are staged in shared memory first.
#include <string>

#include "core/error.h"
#include "cuda/kernels/gdn/gdn.h"
#include "cuda/kernels/ptx.cuh"
#include "cuda/kernels/stream_scratch.h"

namespace lilac::cuda {
namespace {

void check_launch(const char* what) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw Error(std::string(what) + ": launch failed: " + cudaGetErrorString(e));
}

constexpr int CONV_TOK = 32;  // tokens per thread in the conv kernel

// y[t, c] = silu(Σ_j w[c, j] · in(t − (K−1) + j)), in(τ < 0) from the state (oldest first).
template <int K>
__global__ void conv_kernel(const float* __restrict__ x, int64_t ldx, const float* __restrict__ w,
                            const float* __restrict__ state, float* __restrict__ y, int64_t ldy, int n, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const int t0 = blockIdx.y * CONV_TOK;
  if (c >= C) return;
  float wr[K], win[K];
#pragma unroll
  for (int j = 0; j < K; ++j) wr[j] = w[int64_t(c) * K + j];
  // window: inputs t0-K+1 .. t0-1
#pragma unroll
  for (int j = 0; j < K - 1; ++j) {
    int tau = t0 - (K - 1) + j;
    win[j] = tau >= 0 ? x[int64_t(tau) * ldx + c] : state[int64_t(c) * (K - 1) + (K - 1 + tau)];
  }
  const int t1 = min(n, t0 + CONV_TOK);
  for (int t = t0; t < t1; ++t) {
    win[K - 1] = x[int64_t(t) * ldx + c];
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < K; ++j) s = fmaf(wr[j], win[j], s);
    y[int64_t(t) * ldy + c] = s / (1.f + expf(-s));
#pragma unroll
    for (int j = 0; j < K - 1; ++j) win[j] = win[j + 1];
  }
}

// New state = the last K-1 entries of [old state, x_0 .. x_{n-1}].
__global__ void conv_state_kernel(const float* __restrict__ x, int64_t ldx, float* __restrict__ state, int n, int C,
                                  int K) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float ns[8];
  for (int j = 0; j < K - 1; ++j) {
    int tau = n - (K - 1) + j;  // index into the combined sequence, relative to x_0
    ns[j] = tau >= 0 ? x[int64_t(tau) * ldx + c] : state[int64_t(c) * (K - 1) + (K - 1 + tau)];
  }
  for (int j = 0; j < K - 1; ++j) state[int64_t(c) * (K - 1) + j] = ns[j];
}

constexpr int DK = 128, DV = 128;
constexpr int COLS = 16;          // value columns per block
constexpr int PARTS = 8;          // threads per column
constexpr int RPT = DK / PARTS;   // key rows per thread (16)
constexpr int TB = 32;            // tokens staged per round
constexpr int SCAN_THREADS = COLS * PARTS;  // 128

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__global__ void __launch_bounds__(SCAN_THREADS) gdn_scan_kernel(const GdnPrefillArgs a) {
  __shared__ __align__(16) float sq[TB][DK];
  __shared__ __align__(16) float sk[TB][DK];
  __shared__ float sv[TB][COLS];
  __shared__ float seg[TB], sbeta[TB], skq[TB];
  __shared__ float so[TB][COLS];

  const int h = blockIdx.y;
  const int j0 = blockIdx.x * COLS;
  const int hk = h / (a.Hv / a.Hk);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int col = tid / PARTS, part = tid % PARTS;
  // thread holds key rows r = 4 * (part + 8 i) + u, i < 4, u < 4
  float S[RPT];
  float* Sg = a.state + int64_t(h) * DK * DV;
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int u = 0; u < 4; ++u) S[i * 4 + u] = Sg[int64_t(4 * (part + 8 * i) + u) * DV + j0 + col];

  const float A = -expf(a.A_log[h]);
  const float dtb = a.dt_bias[h];
  const float qscale = rsqrtf(float(DK));
  const int64_t q_off = int64_t(hk) * DK, k_off = int64_t(a.Hk) * DK + int64_t(hk) * DK,
                v_off = 2 * int64_t(a.Hk) * DK + int64_t(h) * DV + j0;

  for (int t0 = 0; t0 < a.n; t0 += TB) {
    const int nt = min(TB, a.n - t0);
    __syncthreads();  // previous round's smem reads done
    // stage q, k (one warp per token, 4 floats per lane), normalise, k̂·q̂
    for (int tt = warp; tt < nt; tt += SCAN_THREADS / 32) {
      const float* row = a.qkv + int64_t(t0 + tt) * a.ld_qkv;
      float4 q4 = *reinterpret_cast<const float4*>(row + q_off + lane * 4);
      float4 k4 = *reinterpret_cast<const float4*>(row + k_off + lane * 4);
      float qq = warp_sum(q4.x * q4.x + q4.y * q4.y + q4.z * q4.z + q4.w * q4.w);
      float kk = warp_sum(k4.x * k4.x + k4.y * k4.y + k4.z * k4.z + k4.w * k4.w);
      float qn = rsqrtf(qq + 1e-6f) * qscale, kn = rsqrtf(kk + 1e-6f);
      q4.x *= qn; q4.y *= qn; q4.z *= qn; q4.w *= qn;
      k4.x *= kn; k4.y *= kn; k4.z *= kn; k4.w *= kn;
      float kq = warp_sum(q4.x * k4.x + q4.y * k4.y + q4.z * k4.z + q4.w * k4.w);
      *reinterpret_cast<float4*>(&sq[tt][lane * 4]) = q4;
      *reinterpret_cast<float4*>(&sk[tt][lane * 4]) = k4;
      if (lane == 0) {
        skq[tt] = kq;
        float bb = a.b[int64_t(t0 + tt) * a.ld_b + h];
        float aa = a.a[int64_t(t0 + tt) * a.ld_a + h] + dtb;
        float sp = aa > 20.f ? aa : log1pf(expf(aa));
        seg[tt] = expf(A * sp);
        sbeta[tt] = 1.f / (1.f + expf(-bb));
      }
    }
    for (int idx = tid; idx < nt * COLS; idx += SCAN_THREADS) {
      int tt = idx / COLS, c = idx % COLS;
      sv[tt][c] = a.qkv[int64_t(t0 + tt) * a.ld_qkv + v_off + c];
    }
    __syncthreads();
    for (int tt = 0; tt < nt; ++tt) {
      float dk0 = 0.f, dk1 = 0.f, dq0 = 0.f, dq1 = 0.f;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float4 k4 = *reinterpret_cast<const float4*>(&sk[tt][4 * (part + 8 * i)]);
        float4 q4 = *reinterpret_cast<const float4*>(&sq[tt][4 * (part + 8 * i)]);
        dk0 = fmaf(S[i * 4 + 0], k4.x, dk0);
        dk1 = fmaf(S[i * 4 + 1], k4.y, dk1);
        dk0 = fmaf(S[i * 4 + 2], k4.z, dk0);
        dk1 = fmaf(S[i * 4 + 3], k4.w, dk1);
        dq0 = fmaf(S[i * 4 + 0], q4.x, dq0);
        dq1 = fmaf(S[i * 4 + 1], q4.y, dq1);
        dq0 = fmaf(S[i * 4 + 2], q4.z, dq0);
        dq1 = fmaf(S[i * 4 + 3], q4.w, dq1);
      }
      float sk_ = dk0 + dk1, sq_ = dq0 + dq1;
#pragma unroll
      for (int o = 1; o < PARTS; o <<= 1) {
        sk_ += __shfl_xor_sync(0xffffffffu, sk_, o);
        sq_ += __shfl_xor_sync(0xffffffffu, sq_, o);
      }
      const float eg = seg[tt];
      const float delta = sbeta[tt] * (sv[tt][col] - eg * sk_);
      if (part == 0) so[tt][col] = eg * sq_ + skq[tt] * delta;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float4 k4 = *reinterpret_cast<const float4*>(&sk[tt][4 * (part + 8 * i)]);
        S[i * 4 + 0] = fmaf(eg, S[i * 4 + 0], k4.x * delta);
        S[i * 4 + 1] = fmaf(eg, S[i * 4 + 1], k4.y * delta);
        S[i * 4 + 2] = fmaf(eg, S[i * 4 + 2], k4.z * delta);
        S[i * 4 + 3] = fmaf(eg, S[i * 4 + 3], k4.w * delta);
      }
    }
    __syncthreads();
    for (int idx = tid; idx < nt * COLS; idx += SCAN_THREADS) {
      int tt = idx / COLS, c = idx % COLS;
      a.o_scratch[int64_t(t0 + tt) * (int64_t(a.Hv) * DV) + int64_t(h) * DV + j0 + c] = so[tt][c];
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int u = 0; u < 4; ++u) Sg[int64_t(4 * (part + 8 * i) + u) * DV + j0 + col] = S[i * 4 + u];
}

// out[t, h] = RMSNorm(o[t, h]; w) ⊙ silu(z[t, h]) → bf16. One warp per (token, head), dv = 128.
__global__ void gated_norm_kernel(const GdnPrefillArgs a) {
  const int lane = threadIdx.x & 31;
  const int64_t idx = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (idx >= int64_t(a.n) * a.Hv) return;
  const int t = int(idx / a.Hv), h = int(idx % a.Hv);
  float4 o = *reinterpret_cast<const float4*>(a.o_scratch + (int64_t(t) * a.Hv + h) * DV + lane * 4);
  float ss = warp_sum(o.x * o.x + o.y * o.y + o.z * o.z + o.w * o.w);
  float r = rsqrtf(ss / DV + a.eps);
  const float* z = a.z + int64_t(t) * a.ld_z + int64_t(h) * DV + lane * 4;
  const float* w = a.norm_w + lane * 4;
  float v[4] = {o.x, o.y, o.z, o.w};
  __nv_bfloat16* out = a.out + int64_t(t) * a.ld_out + int64_t(h) * DV + lane * 4;
#pragma unroll
  for (int i = 0; i < 4; i += 2) {
    float z0 = z[i], z1 = z[i + 1];
    float y0 = v[i] * r * w[i] * (z0 / (1.f + expf(-z0)));
    float y1 = v[i + 1] * r * w[i + 1] * (z1 / (1.f + expf(-z1)));
    *reinterpret_cast<__nv_bfloat162*>(out + i) = __floats2bfloat162_rn(y0, y1);
  }
}


// ---- fast path: per-token preparation once, then a cp.async-fed scan

// work layout (floats): qk [n][Hk][2][DK] (q̂ scaled, then k̂) | kq [n][Hk] | eg [n][Hv] | beta [n][Hv]
struct WorkView {
  float *qk, *kq, *eg, *beta;
};
__host__ __device__ inline WorkView work_view(float* w, int n, int Hk, int Hv) {
  WorkView v;
  v.qk = w;
  v.kq = v.qk + int64_t(n) * Hk * 2 * DK;
  v.eg = v.kq + int64_t(n) * Hk;
  v.beta = v.eg + int64_t(n) * Hv;
  return v;
}

// One warp per (token, key head): q̂, k̂, k̂·q̂; lanes < Hv/Hk also do the gates of its value heads.
__global__ void gdn_prep_kernel(const GdnPrefillArgs a) {
  const int lane = threadIdx.x & 31;
  const int64_t idx = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (idx >= int64_t(a.n) * a.Hk) return;
  const int t = int(idx / a.Hk), hk = int(idx % a.Hk);
  const WorkView w = work_view(a.work, a.n, a.Hk, a.Hv);
  const float* row = a.qkv + int64_t(t) * a.ld_qkv;
  float4 q4 = *reinterpret_cast<const float4*>(row + int64_t(hk) * DK + lane * 4);
  float4 k4 = *reinterpret_cast<const float4*>(row + int64_t(a.Hk) * DK + int64_t(hk) * DK + lane * 4);
  const int ratio = a.Hv / a.Hk;
  float bb = 0.f, aa = 0.f;
  if (lane < ratio) {
    const int h = hk * ratio + lane;
    bb = a.b[int64_t(t) * a.ld_b + h];
    aa = a.a[int64_t(t) * a.ld_a + h] + a.dt_bias[h];
  }
  float qq = warp_sum(q4.x * q4.x + q4.y * q4.y + q4.z * q4.z + q4.w * q4.w);
  float kk = warp_sum(k4.x * k4.x + k4.y * k4.y + k4.z * k4.z + k4.w * k4.w);
  float qn = rsqrtf(qq + 1e-6f) * rsqrtf(float(DK)), kn = rsqrtf(kk + 1e-6f);
  q4.x *= qn; q4.y *= qn; q4.z *= qn; q4.w *= qn;
  k4.x *= kn; k4.y *= kn; k4.z *= kn; k4.w *= kn;
  float kq = warp_sum(q4.x * k4.x + q4.y * k4.y + q4.z * k4.z + q4.w * k4.w);
  float* dst = w.qk + idx * 2 * DK;
  *reinterpret_cast<float4*>(dst + lane * 4) = q4;
  *reinterpret_cast<float4*>(dst + DK + lane * 4) = k4;
  if (lane == 0) w.kq[idx] = kq;
  if (lane < ratio) {
    const int h = hk * ratio + lane;
    float sp = aa > 20.f ? aa : log1pf(expf(aa));
    w.eg[int64_t(t) * a.Hv + h] = expf(-expf(a.A_log[h]) * sp);
    w.beta[int64_t(t) * a.Hv + h] = 1.f / (1.f + expf(-bb));
  }
}

constexpr int TB2 = 16;  // tokens per staged round (double-buffered)

__global__ void __launch_bounds__(SCAN_THREADS) gdn_scan2_kernel(const GdnPrefillArgs a) {
  __shared__ __align__(16) float sqk[2][TB2][2 * DK];  // q̂ | k̂
  __shared__ __align__(16) float sv[2][TB2][COLS];
  __shared__ float seg[2][TB2], sbeta[2][TB2], skq[2][TB2];

  const int h = blockIdx.y;
  const int j0 = blockIdx.x * COLS;
  const int hk = h / (a.Hv / a.Hk);
  const int tid = threadIdx.x;
  const int col = tid / PARTS, part = tid % PARTS;
  const WorkView w = work_view(a.work, a.n, a.Hk, a.Hv);
  const int64_t v_off = 2 * int64_t(a.Hk) * DK + int64_t(h) * DV + j0;

  auto issue = [&](int r, int buf) {
    const int t0 = r * TB2, nt = min(TB2, a.n - t0);
    // q̂k̂: nt tokens × 2*DK floats = nt × 64 chunks
    for (int c = tid; c < nt * (2 * DK / 4); c += SCAN_THREADS) {
      int tt = c / (2 * DK / 4), ch = c % (2 * DK / 4);
      dev::cp_async16(&sqk[buf][tt][ch * 4], w.qk + (int64_t(t0 + tt) * a.Hk + hk) * 2 * DK + ch * 4);
    }
    for (int c = tid; c < nt * (COLS / 4); c += SCAN_THREADS) {
      int tt = c / (COLS / 4), ch = c % (COLS / 4);
      dev::cp_async16(&sv[buf][tt][ch * 4], a.qkv + int64_t(t0 + tt) * a.ld_qkv + v_off + ch * 4);
    }
    if (tid < nt) {
      dev::cp_async4(&seg[buf][tid], w.eg + int64_t(t0 + tid) * a.Hv + h);
      dev::cp_async4(&sbeta[buf][tid], w.beta + int64_t(t0 + tid) * a.Hv + h);
      dev::cp_async4(&skq[buf][tid], w.kq + int64_t(t0 + tid) * a.Hk + hk);
    }
    dev::cp_async_commit();
  };

  float S[RPT];
  float* Sg = a.state + int64_t(h) * DK * DV;
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int u = 0; u < 4; ++u) S[i * 4 + u] = Sg[int64_t(4 * (part + 8 * i) + u) * DV + j0 + col];

  const int rounds = (a.n + TB2 - 1) / TB2;
  float* o_base = a.o_scratch + int64_t(h) * DV + j0 + col;
  const int64_t o_stride = int64_t(a.Hv) * DV;
  issue(0, 0);
  for (int r = 0; r < rounds; ++r) {
    const int buf = r & 1;
    if (r + 1 < rounds) {
      issue(r + 1, buf ^ 1);
      dev::cp_async_wait<1>();
    } else {
      dev::cp_async_wait<0>();
    }
    __syncthreads();
    const int t0 = r * TB2, nt = min(TB2, a.n - t0);
    for (int tt = 0; tt < nt; ++tt) {
      float4 k4[4], q4[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        q4[i] = *reinterpret_cast<const float4*>(&sqk[buf][tt][4 * (part + 8 * i)]);
        k4[i] = *reinterpret_cast<const float4*>(&sqk[buf][tt][DK + 4 * (part + 8 * i)]);
      }
      float dk[4] = {0.f, 0.f, 0.f, 0.f}, dq[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        dk[0] = fmaf(S[i * 4 + 0], k4[i].x, dk[0]);
        dk[1] = fmaf(S[i * 4 + 1], k4[i].y, dk[1]);
        dk[2] = fmaf(S[i * 4 + 2], k4[i].z, dk[2]);
        dk[3] = fmaf(S[i * 4 + 3], k4[i].w, dk[3]);
        dq[0] = fmaf(S[i * 4 + 0], q4[i].x, dq[0]);
        dq[1] = fmaf(S[i * 4 + 1], q4[i].y, dq[1]);
        dq[2] = fmaf(S[i * 4 + 2], q4[i].z, dq[2]);
        dq[3] = fmaf(S[i * 4 + 3], q4[i].w, dq[3]);
      }
      float sk_ = (dk[0] + dk[1]) + (dk[2] + dk[3]), sq_ = (dq[0] + dq[1]) + (dq[2] + dq[3]);
#pragma unroll
      for (int o = 1; o < PARTS; o <<= 1) {
        sk_ += __shfl_xor_sync(0xffffffffu, sk_, o);
        sq_ += __shfl_xor_sync(0xffffffffu, sq_, o);
      }
      const float eg = seg[buf][tt];
      const float delta = sbeta[buf][tt] * (sv[buf][tt][col] - eg * sk_);
      if (part == 0) o_base[int64_t(t0 + tt) * o_stride] = eg * sq_ + skq[buf][tt] * delta;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        S[i * 4 + 0] = fmaf(eg, S[i * 4 + 0], k4[i].x * delta);
        S[i * 4 + 1] = fmaf(eg, S[i * 4 + 1], k4[i].y * delta);
        S[i * 4 + 2] = fmaf(eg, S[i * 4 + 2], k4[i].z * delta);
        S[i * 4 + 3] = fmaf(eg, S[i * 4 + 3], k4[i].w * delta);
      }
    }
    __syncthreads();  // buffer `buf` is refilled by the next iteration's issue
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int u = 0; u < 4; ++u) Sg[int64_t(4 * (part + 8 * i) + u) * DV + j0 + col] = S[i * 4 + u];
}

}  // namespace

void gdn_conv_prefill(const float* x, int64_t ldx, const float* w, float* state, float* y, int64_t ldy, int n, int C,
                      int K, cudaStream_t stream) {
  if (n <= 0) return;
  if (K < 2 || K > 8) throw Error("gdn_conv_prefill: conv kernel size must be 2..8, got " + std::to_string(K));
  dim3 grid((C + 127) / 128, (n + CONV_TOK - 1) / CONV_TOK);
  switch (K) {
    case 2: conv_kernel<2><<<grid, 128, 0, stream>>>(x, ldx, w, state, y, ldy, n, C); break;
    case 3: conv_kernel<3><<<grid, 128, 0, stream>>>(x, ldx, w, state, y, ldy, n, C); break;
    case 4: conv_kernel<4><<<grid, 128, 0, stream>>>(x, ldx, w, state, y, ldy, n, C); break;
    case 5: conv_kernel<5><<<grid, 128, 0, stream>>>(x, ldx, w, state, y, ldy, n, C); break;
    case 6: conv_kernel<6><<<grid, 128, 0, stream>>>(x, ldx, w, state, y, ldy, n, C); break;
    case 7: conv_kernel<7><<<grid, 128, 0, stream>>>(x, ldx, w, state, y, ldy, n, C); break;
    case 8: conv_kernel<8><<<grid, 128, 0, stream>>>(x, ldx, w, state, y, ldy, n, C); break;
  }
  check_launch("gdn conv");
  conv_state_kernel<<<(C + 127) / 128, 128, 0, stream>>>(x, ldx, state, n, C, K);
  check_launch("gdn conv state");
}

size_t gdn_prefill_work_floats(int n, int Hk, int Hv, int dk) {
  return size_t(n) * (size_t(Hk) * (2 * size_t(dk) + 1) + 2 * size_t(Hv)) + 4;
}

void gdn_prefill(const GdnPrefillArgs& a, cudaStream_t stream) {
  if (a.n <= 0) return;
  if (a.dk != DK || a.dv != DV)
    throw Error("gdn_prefill: key/value head dims must be 128, got " + std::to_string(a.dk) + "/" +
                std::to_string(a.dv));
  if (a.Hk <= 0 || a.Hv % a.Hk || a.Hv / a.Hk > 32)
    throw Error("gdn_prefill: value heads must be a multiple (at most 32x) of key heads");
  if (a.ld_qkv % 4 || a.ld_out % 2 || reinterpret_cast<uintptr_t>(a.qkv) % 16)
    throw Error("gdn_prefill: qkv must be 16-byte aligned with ld_qkv % 4 == 0 and ld_out even");
  dim3 grid(DV / COLS, a.Hv);
  GdnPrefillArgs args = a;
  if (!args.work && !capturing(stream)) {
    // No work buffer given: use one owned here per stream (grown on demand, never freed), unless the
    // stream is being captured into a graph (no allocation there: the slower in-scan path runs; so
    // does a failed allocation).
    static StreamScratch scratch;
    args.work = scratch.get(stream, gdn_prefill_work_floats(a.n, a.Hk, a.Hv, a.dk));
  }
  if (args.work) {
    if (reinterpret_cast<uintptr_t>(args.work) % 16) throw Error("gdn_prefill: work must be 16-byte aligned");
    const int64_t warps = int64_t(a.n) * a.Hk;
    gdn_prep_kernel<<<unsigned((warps + 7) / 8), 256, 0, stream>>>(args);
    check_launch("gdn prep");
    gdn_scan2_kernel<<<grid, SCAN_THREADS, 0, stream>>>(args);
    check_launch("gdn scan");
  } else {
    gdn_scan_kernel<<<grid, SCAN_THREADS, 0, stream>>>(a);
    check_launch("gdn scan");
  }
  const int64_t warps = int64_t(a.n) * a.Hv;
  gated_norm_kernel<<<unsigned((warps + 7) / 8), 256, 0, stream>>>(a);
  check_launch("gdn gated norm");
}

}  // namespace lilac::cuda
