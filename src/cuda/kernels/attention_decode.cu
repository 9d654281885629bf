// Decode attention: q/k RMSNorm + partial RoPE + KV append, then split-K attention over the bf16 KV
// cache (GQA: one block per kv head and context split reads each K/V row once for all its query
// heads) and the combine with the output gate sigmoid fused.
#include <string>

#include "cuda/cuda_common.h"
#include "cuda/kernels/decode.h"
#include "cuda/kernels/qdot.cuh"

namespace lilac::cuda {
namespace {
using namespace dev;

constexpr int kTile = 32;       // positions per tile (one per lane)
constexpr int kMaxHeadDim = 256;
constexpr int kMaxGroup = 16;   // query heads per kv head
constexpr int kWarps = 8;

__global__ void qk_norm_rope_kernel(AttnDecodeShape s, const float* qg, const float* k, const float* v,
                                    const float* q_norm, const float* k_norm, const float* inv_freq,
                                    const int32_t* pos_p, float* q_out, __nv_bfloat16* k_cache,
                                    __nv_bfloat16* v_cache) {
  __shared__ float xs[kMaxHeadDim];
  __shared__ float red[32];
  const int hd = s.head_dim, b = blockIdx.x;
  const bool is_q = b < s.heads;
  const int h = is_q ? b : b - s.heads;
  const float* src = is_q ? qg + int64_t(h) * 2 * hd : k + int64_t(h) * hd;
  const float* w = is_q ? q_norm : k_norm;
  const int64_t pos = *pos_p;
  float ss = 0.f;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    const float x = src[d];
    xs[d] = x;
    ss += x * x;
  }
  ss = block_sum(ss, red);
  const float r = rsqrtf(ss / float(hd) + s.eps);
  for (int d = threadIdx.x; d < hd; d += blockDim.x) xs[d] = xs[d] * r * w[d];
  __syncthreads();
  const int half = s.rotary_dim / 2;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float val = xs[d];
    if (d < half) {
      const float ang = float(pos) * inv_freq[d];
      float sn, cs;
      sincosf(ang, &sn, &cs);
      val = xs[d] * cs - xs[d + half] * sn;
    } else if (d < 2 * half) {
      const float ang = float(pos) * inv_freq[d - half];
      float sn, cs;
      sincosf(ang, &sn, &cs);
      val = xs[d] * cs + xs[d - half] * sn;
    }
    if (is_q)
      q_out[int64_t(h) * hd + d] = val;
    else {
      const int64_t row = (pos * s.kv_heads + h) * hd + d;
      k_cache[row] = __float2bfloat16(val);
      v_cache[row] = __float2bfloat16(v[int64_t(h) * hd + d]);
    }
  }
}

__global__ void __launch_bounds__(kWarps * 32)
    attn_split_kernel(AttnDecodeShape s, const float* q, const __nv_bfloat16* kc, const __nv_bfloat16* vc,
                      const int32_t* pos_p, int n_split, float* partial) {
  extern __shared__ float4 smem4[];
  const int hd = s.head_dim, G = s.heads / s.kv_heads, kvh = blockIdx.x, split = blockIdx.y;
  const int kstride = hd + 2;  // bf16 elements per K row in shared memory (odd word stride: no bank conflicts)
  float* qs = reinterpret_cast<float*>(smem4);                              // [G][hd]
  __nv_bfloat16* Kt = reinterpret_cast<__nv_bfloat16*>(qs + G * hd);        // [kTile][hd + 2]
  __nv_bfloat16* Vt = Kt + kTile * kstride;                                 // [kTile][hd]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t L = int64_t(*pos_p) + 1;
  int64_t chunk = (L + n_split - 1) / n_split;
  chunk = (chunk + kTile - 1) / kTile * kTile;
  const int64_t begin = split * chunk, end = begin + chunk < L ? begin + chunk : L;
  const float scale = rsqrtf(float(hd));
  for (int i = threadIdx.x; i < G * hd; i += blockDim.x) qs[i] = q[int64_t(kvh) * G * hd + i] * scale;
  const int dpl = hd / 32;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  float o[2][kMaxHeadDim / 32];
#pragma unroll
  for (int t = 0; t < 2; ++t)
#pragma unroll
    for (int i = 0; i < kMaxHeadDim / 32; ++i) o[t][i] = 0.f;
  const int64_t row_stride = int64_t(s.kv_heads) * hd;
  for (int64_t t0 = begin; t0 < end; t0 += kTile) {
    __syncthreads();
    const int vec = hd / 8;  // 16-byte pieces per row
    for (int i = threadIdx.x; i < kTile * vec; i += blockDim.x) {
      const int p = i / vec, c = i % vec;
      uint4 kv = make_uint4(0, 0, 0, 0), vv = make_uint4(0, 0, 0, 0);
      if (t0 + p < end) {
        const int64_t off = (t0 + p) * row_stride + int64_t(kvh) * hd + c * 8;
        kv = *reinterpret_cast<const uint4*>(kc + off);
        vv = *reinterpret_cast<const uint4*>(vc + off);
      }
      uint32_t* kd = reinterpret_cast<uint32_t*>(Kt + p * kstride + c * 8);
      kd[0] = kv.x;
      kd[1] = kv.y;
      kd[2] = kv.z;
      kd[3] = kv.w;
      *reinterpret_cast<uint4*>(Vt + p * hd + c * 8) = vv;
    }
    __syncthreads();
    const bool valid = t0 + lane < end;
#pragma unroll
    for (int t = 0; t < 2; ++t) {
      const int hl = warp + t * kWarps;
      if (hl >= G) break;
      const float* qh = qs + hl * hd;
      const __nv_bfloat162* kr = reinterpret_cast<const __nv_bfloat162*>(Kt + lane * kstride);
      float sc = 0.f;
      for (int i = 0; i < hd / 2; ++i) {
        const float2 kf = __bfloat1622float2(kr[i]);
        sc = fmaf(qh[2 * i], kf.x, sc);
        sc = fmaf(qh[2 * i + 1], kf.y, sc);
      }
      sc = valid ? sc : -INFINITY;
      const float mt = warp_max(sc);
      const float mn = fmaxf(m[t], mt);
      const float corr = m[t] == -INFINITY ? 0.f : expf(m[t] - mn);
      const float p = valid ? expf(sc - mn) : 0.f;
      l[t] = l[t] * corr + warp_sum(p);
      m[t] = mn;
#pragma unroll
      for (int i = 0; i < kMaxHeadDim / 32; ++i) o[t][i] *= corr;
      const int np = int(end - t0 < kTile ? end - t0 : kTile);
      for (int pp = 0; pp < np; ++pp) {
        const float pv = __shfl_sync(0xffffffffu, p, pp);
        const __nv_bfloat16* vr = Vt + pp * hd;
#pragma unroll
        for (int i = 0; i < kMaxHeadDim / 32; ++i)
          if (i < dpl) o[t][i] = fmaf(pv, __bfloat162float(vr[lane + 32 * i]), o[t][i]);
      }
    }
  }
#pragma unroll
  for (int t = 0; t < 2; ++t) {
    const int hl = warp + t * kWarps;
    if (hl >= G) break;
    const int h = kvh * G + hl;
    float* dst = partial + (int64_t(h) * n_split + split) * (hd + 2);
    if (lane == 0) {
      dst[0] = m[t];
      dst[1] = l[t];
    }
#pragma unroll
    for (int i = 0; i < kMaxHeadDim / 32; ++i)
      if (i < dpl) dst[2 + lane + 32 * i] = o[t][i];
  }
}

__global__ void attn_combine_kernel(AttnDecodeShape s, const float* partial, int n_split, const float* qg,
                                    float* out) {
  const int h = blockIdx.x, hd = s.head_dim;
  const float* ph = partial + int64_t(h) * n_split * (hd + 2);
  float M = -INFINITY;
  for (int i = 0; i < n_split; ++i)
    if (ph[i * (hd + 2) + 1] > 0.f) M = fmaxf(M, ph[i * (hd + 2)]);
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float num = 0.f, den = 0.f;
    for (int i = 0; i < n_split; ++i) {
      const float* pi = ph + i * (hd + 2);
      if (pi[1] > 0.f) {
        const float f = expf(pi[0] - M);
        num += f * pi[2 + d];
        den += f * pi[1];
      }
    }
    const float gate = qg[int64_t(h) * 2 * hd + hd + d];
    out[int64_t(h) * hd + d] = num / den * sigmoid_f(gate);
  }
}

void check_shape(const AttnDecodeShape& s) {
  LILAC_CHECK(s.head_dim % 32 == 0 && s.head_dim <= kMaxHeadDim && s.kv_heads > 0 && s.heads % s.kv_heads == 0 &&
                  s.heads / s.kv_heads <= kMaxGroup && s.rotary_dim <= s.head_dim && s.rotary_dim % 2 == 0,
              "attention decode: unsupported shape (head_dim " + std::to_string(s.head_dim) + ", heads " +
                  std::to_string(s.heads) + "/" + std::to_string(s.kv_heads) + ")");
}

}  // namespace

size_t attn_decode_partial_floats(const AttnDecodeShape& s, int n_split) {
  return size_t(s.heads) * n_split * (s.head_dim + 2);
}

void attn_qk_norm_rope_append(const AttnDecodeShape& s, const float* qg, const float* k, const float* v,
                              const float* q_norm, const float* k_norm, const float* inv_freq, const int32_t* pos,
                              float* q_out, __nv_bfloat16* k_cache, __nv_bfloat16* v_cache, cudaStream_t stream) {
  check_shape(s);
  qk_norm_rope_kernel<<<s.heads + s.kv_heads, 128, 0, stream>>>(s, qg, k, v, q_norm, k_norm, inv_freq, pos, q_out,
                                                                k_cache, v_cache);
  LILAC_CUDA_LAUNCH_CHECK();
}

void attention_decode(const AttnDecodeShape& s, const float* q, const float* qg, const __nv_bfloat16* k_cache,
                      const __nv_bfloat16* v_cache, const int32_t* pos, int n_split, float* partial, float* out,
                      cudaStream_t stream) {
  check_shape(s);
  LILAC_CHECK(n_split >= 1 && n_split <= kAttnMaxSplit, "attention decode: bad split count");
  const int G = s.heads / s.kv_heads, hd = s.head_dim;
  const size_t smem = size_t(G) * hd * 4 + size_t(kTile) * (hd + 2) * 2 + size_t(kTile) * hd * 2;
  static bool attr = false;
  if (!attr) {
    LILAC_CUDA_CHECK(cudaFuncSetAttribute(attn_split_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 96 * 1024));
    attr = true;
  }
  attn_split_kernel<<<dim3(s.kv_heads, n_split), kWarps * 32, smem, stream>>>(s, q, k_cache, v_cache, pos, n_split,
                                                                              partial);
  LILAC_CUDA_LAUNCH_CHECK();
  attn_combine_kernel<<<s.heads, 256, 0, stream>>>(s, partial, n_split, qg, out);
  LILAC_CUDA_LAUNCH_CHECK();
}

}  // namespace lilac::cuda
