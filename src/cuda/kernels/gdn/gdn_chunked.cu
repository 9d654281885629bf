// Chunked Gated DeltaNet prefill (gdn.h: gdn_prefill_chunked): the WY / UT-transform form of the
// recurrence, chunks of CH = 64 tokens, tensor cores (mma.sync m16n8k8 tf32, fp32 accumulation) for
// the matrix products, fp32 for the triangular solve and the decays.
//
// Math, per value head, chunk of tokens t = 0..63 (padded tokens: k = q = 0, β = 0, g = 0), G_t the
// inclusive cumulative sum of g inside the chunk, S0 the state entering the chunk:
//   S_t = e^{g_t} S_{t-1} + k_t δ_tᵀ,  δ_t = β_t (v_t − e^{g_t} S_{t-1}ᵀ k_t)
//   ⇒ (I + A) Δ = diag(β) V − diag(β e^G) K S0,   A_ts = β_t e^{G_t−G_s} k_t·k_s  (s < t)
//   ⇒ Δ = U − W S0 with U = T diag(β) V, W = T diag(β e^G) K, T = (I + A)⁻¹
//   O = diag(e^G) Q S0 + P Δ,  P_ts = e^{G_t−G_s} q_t·k_s (s ≤ t)
//   S_64 = e^{G_63} S0 + (diag(e^{G_63−G}) K)ᵀ Δ
// Only exponents of non-positive numbers are taken (no overflow).
//
// Launches: (1) per token: q̂, k̂ (l2-normed, q̂ scaled), g, β;  (2) per (chunk, value head), all chunks
// in parallel: K Kᵀ, Q Kᵀ (3xTF32 ≈ fp32), the masked/decayed A and P, then U and W by forward
// substitution in fp32 (one column per thread);  (3) per (value head, column block), sequential over
// the chunks: Δ, O, the state update (3xTF32 or plain TF32), operands streamed in with cp.async so
// the next chunk's loads overlap this chunk's products — by default warp-specialized: O, which the recurrence does
// not wait for, on warps of its own a chunk behind (gdn_state.cu);  (4) the gated RMSNorm epilogue → bf16.
#include <cstdlib>
#include <mutex>
#include <string>

#include "core/error.h"
#include "cuda/kernels/gdn/gdn.h"
#include "cuda/kernels/gdn/gdn_chunked.cuh"
#include "cuda/kernels/ptx.cuh"
#include "cuda/kernels/stream_scratch.h"

namespace lilac::cuda {
namespace {

using namespace gdnc;

// ---- (1) per token: one warp per (token, key head)
template <int DK>
__global__ void token_prep_kernel(const GdnPrefillArgs a, Work w) {
  constexpr int PER = DK / 32;
  const int lane = threadIdx.x & 31;
  const int64_t idx = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (idx >= int64_t(a.n) * a.Hk) return;
  const int t = int(idx / a.Hk), hk = int(idx % a.Hk);
  const float* row = a.qkv + int64_t(t) * a.ld_qkv;
  float qv[PER], kv[PER];
  float qq = 0.f, kk = 0.f;
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    qv[i] = row[int64_t(hk) * DK + lane + 32 * i];
    kv[i] = row[int64_t(a.Hk) * DK + int64_t(hk) * DK + lane + 32 * i];
    qq = fmaf(qv[i], qv[i], qq);
    kk = fmaf(kv[i], kv[i], kk);
  }
  qq = warp_sum(qq);
  kk = warp_sum(kk);
  const float qs = rsqrtf(qq + 1e-6f) * rsqrtf(float(DK)), ks = rsqrtf(kk + 1e-6f);
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    w.qn[idx * DK + lane + 32 * i] = qv[i] * qs;
    w.kn[idx * DK + lane + 32 * i] = kv[i] * ks;
  }
  const int ratio = a.Hv / a.Hk;
  if (lane < ratio) {
    const int h = hk * ratio + lane;
    const float bb = a.b[int64_t(t) * a.ld_b + h];
    const float aa = a.a[int64_t(t) * a.ld_a + h] + a.dt_bias[h];
    const float sp = aa > 20.f ? aa : log1pf(expf(aa));
    w.glog[int64_t(t) * a.Hv + h] = -expf(a.A_log[h]) * sp;
    w.beta[int64_t(t) * a.Hv + h] = 1.f / (1.f + expf(-bb));
  }
}

// ---- (2) per (chunk, value head): A, P, U, W
template <int DK>
struct ChunkSmem {
  static constexpr int LDQ = DK + 4;  // ≡ 4 (mod 32): conflict-free row-wise fragments
  static constexpr int LDA = CH + 4;
  static constexpr int floats = 2 * CH * LDQ + CH * LDA + 3 * CH;
  static constexpr size_t bytes = size_t(floats) * sizeof(float);
};

template <int DK>
__global__ void __launch_bounds__(THREADS) chunk_kernel(const GdnPrefillArgs a, Work w) {
  using L = ChunkSmem<DK>;
  constexpr int LDQ = L::LDQ, LDA = L::LDA;
  extern __shared__ __align__(16) float smem[];
  float* Qs = smem;
  float* Ks = Qs + CH * LDQ;
  float* Am = Ks + CH * LDQ;
  float* sG = Am + CH * LDA;
  float* sB = sG + CH;
  float* sEG = sB + CH;

  const int c = blockIdx.x, h = blockIdx.y;
  const int Hv = a.Hv, dv = a.dv;
  const int hk = h / (Hv / a.Hk);
  const int t0 = c * CH, nt = min(CH, a.n - t0);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, q = lane & 3;

  for (int idx = tid; idx < CH * DK / 4; idx += THREADS) {
    const int t = idx / (DK / 4), i = (idx % (DK / 4)) * 4;
    float4 qv = make_float4(0.f, 0.f, 0.f, 0.f), kv = qv;
    if (t < nt) {
      const int64_t off = (int64_t(t0 + t) * a.Hk + hk) * DK + i;
      qv = *reinterpret_cast<const float4*>(w.qn + off);
      kv = *reinterpret_cast<const float4*>(w.kn + off);
    }
    *reinterpret_cast<float4*>(Qs + t * LDQ + i) = qv;
    *reinterpret_cast<float4*>(Ks + t * LDQ + i) = kv;
  }
  if (warp == 0) {  // inclusive scan of g over the chunk, lane l holds tokens 2l, 2l+1
    const int ta = 2 * lane, tb = 2 * lane + 1;
    float g0 = 0.f, g1 = 0.f, b0 = 0.f, b1 = 0.f;
    if (ta < nt) {
      g0 = w.glog[int64_t(t0 + ta) * Hv + h];
      b0 = w.beta[int64_t(t0 + ta) * Hv + h];
    }
    if (tb < nt) {
      g1 = w.glog[int64_t(t0 + tb) * Hv + h];
      b1 = w.beta[int64_t(t0 + tb) * Hv + h];
    }
    const float pair = g0 + g1;
    float s = pair;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const float y = __shfl_up_sync(0xffffffffu, s, o);
      if (lane >= o) s += y;
    }
    const float Ga = s - pair + g0, Gb = s;
    sG[ta] = Ga;
    sG[tb] = Gb;
    sB[ta] = b0;
    sB[tb] = b1;
    sEG[ta] = expf(Ga);
    sEG[tb] = expf(Gb);
  }
  __syncthreads();
  const int64_t blk = int64_t(c) * Hv + h;
  if (tid < CH) w.G[blk * CH + tid] = sG[tid];

  {  // K Kᵀ and Q Kᵀ (3xTF32): warp → row tile mt, column tiles nb..nb+3; each fragment split into its tf32 parts
     // once per k step (the B fragment serves both products), the low-part products in their own accumulators
    const int mt = warp >> 1, nb = (warp & 1) * 4;
    float ak[4][4] = {}, akl[4][4] = {}, aq[4][4] = {}, aql[4][4] = {};
#pragma unroll 4
    for (int k0 = 0; k0 < DK; k0 += 8) {
      float fk[4], fq[4];
      uint32_t kh[4], kl[4], qh[4], ql[4];
      frag_a(fk, Ks, LDQ, 16 * mt, k0, g, q);
      frag_a(fq, Qs, LDQ, 16 * mt, k0, g, q);
      cvt_frag<true, 4>(fk, kh, kl);
      cvt_frag<true, 4>(fq, qh, ql);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        float b[2];
        uint32_t bh[2], bl[2];
        frag_b_nk(b, Ks, LDQ, k0, 8 * (nb + j), g, q);
        cvt_frag<true, 2>(b, bh, bl);
        mma_acc<true>(ak[j], akl[j], kh, kl, bh, bl);
        mma_acc<true>(aq[j], aql[j], qh, ql, bh, bl);
      }
    }
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        ak[j][e] += akl[j][e];
        aq[j][e] += aql[j][e];
      }
    float* Pg = w.P + blk * CH * CH;
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int t = 16 * mt + g + 8 * half;
        const int s0 = 8 * (nb + j) + 2 * q;
        float av[2], pv[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int s = s0 + e;
          const float dec = s <= t ? expf(sG[t] - sG[s]) : 0.f;
          av[e] = s < t ? sB[t] * dec * ak[j][2 * half + e] : 0.f;
          pv[e] = dec * aq[j][2 * half + e];
        }
        Am[t * LDA + s0] = av[0];
        Am[t * LDA + s0 + 1] = av[1];
        *reinterpret_cast<float2*>(Pg + t * CH + s0) = make_float2(pv[0], pv[1]);
      }
  }
  __syncthreads();

  // (I + A) X = R, R = [β V | β e^G K], by forward substitution; one column per thread.
  const int64_t v_off = 2 * int64_t(a.Hk) * DK + int64_t(h) * dv;
  float* Ug = w.U + blk * CH * dv;
  float* Wg = w.W + blk * CH * DK;
  for (int col = tid; col < dv + DK; col += THREADS) {
    float x[CH];
    if (col < dv) {
#pragma unroll
      for (int t = 0; t < CH; ++t)
        x[t] = t < nt ? sB[t] * a.qkv[int64_t(t0 + t) * a.ld_qkv + v_off + col] : 0.f;
    } else {
#pragma unroll
      for (int t = 0; t < CH; ++t) x[t] = sB[t] * sEG[t] * Ks[t * LDQ + col - dv];
    }
#pragma unroll
    for (int t = 1; t < CH; ++t) {
      const float* ar = Am + t * LDA;
      float acc0 = x[t], acc1 = 0.f;
#pragma unroll
      for (int s = 0; s + 4 <= t; s += 4) {
        const float4 av = *reinterpret_cast<const float4*>(ar + s);
        acc0 = fmaf(-av.x, x[s], acc0);
        acc1 = fmaf(-av.y, x[s + 1], acc1);
        acc0 = fmaf(-av.z, x[s + 2], acc0);
        acc1 = fmaf(-av.w, x[s + 3], acc1);
      }
#pragma unroll
      for (int s = t & ~3; s < t; ++s) acc0 = fmaf(-ar[s], x[s], acc0);
      x[t] = acc0 + acc1;
    }
    if (col < dv) {
#pragma unroll
      for (int t = 0; t < CH; ++t) Ug[int64_t(t) * dv + col] = x[t];
    } else {
#pragma unroll
      for (int t = 0; t < CH; ++t) Wg[int64_t(t) * DK + col - dv] = x[t];
    }
  }
}

// ---- (4) out = RMSNorm(o; w) ⊙ silu(z) → bf16, one warp per (token, head)
__global__ void gated_norm_kernel(const GdnPrefillArgs a) {
  const int lane = threadIdx.x & 31;
  const int64_t idx = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (idx >= int64_t(a.n) * a.Hv) return;
  const int t = int(idx / a.Hv), h = int(idx % a.Hv);
  const int dv = a.dv;
  const float* o = a.o_scratch + idx * dv;
  float ss = 0.f;
  for (int j = lane; j < dv; j += 32) ss = fmaf(o[j], o[j], ss);
  const float r = rsqrtf(warp_sum(ss) / dv + a.eps);
  const float* z = a.z + int64_t(t) * a.ld_z + int64_t(h) * dv;
  __nv_bfloat16* out = a.out + int64_t(t) * a.ld_out + int64_t(h) * dv;
  for (int j = 2 * lane; j < dv; j += 64) {
    const float z0 = z[j], z1 = z[j + 1];
    const float y0 = o[j] * r * a.norm_w[j] * (z0 / (1.f + expf(-z0)));
    const float y1 = o[j + 1] * r * a.norm_w[j + 1] * (z1 / (1.f + expf(-z1)));
    *reinterpret_cast<__nv_bfloat162*>(out + j) = __floats2bfloat162_rn(y0, y1);
  }
}

template <int DK>
void launch_prep_and_chunks(const GdnPrefillArgs& a, const Work& w, cudaStream_t stream) {
  const int64_t warps = int64_t(a.n) * a.Hk;
  token_prep_kernel<DK><<<unsigned((warps + 7) / 8), 256, 0, stream>>>(a, w);
  check_launch("gdn chunked prep");
  static std::once_flag once;
  std::call_once(once, [] {
    cudaFuncSetAttribute(chunk_kernel<DK>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(ChunkSmem<DK>::bytes));
  });
  const int nch = (a.n + CH - 1) / CH;
  chunk_kernel<DK><<<dim3(nch, a.Hv), THREADS, ChunkSmem<DK>::bytes, stream>>>(a, w);
  check_launch("gdn chunked chunk kernel");
}

template <int DK>
void run_dk(const GdnPrefillArgs& a, const Work& w, GdnChunkedMath math, int cols, cudaStream_t stream) {
  launch_prep_and_chunks<DK>(a, w, stream);
  state_pass(a, w, math == GdnChunkedMath::Split3xTF32, cols, stream);
}

}  // namespace

size_t gdn_chunked_work_floats(int n, int Hk, int Hv, int dk, int dv) { return work_floats(n, Hk, Hv, dk, dv); }

void gdn_prefill_chunked(const GdnPrefillArgs& a, cudaStream_t stream, GdnChunkedMath math) {
  if (a.n <= 0) return;
  if (a.dk != 32 && a.dk != 64 && a.dk != 128)
    throw Error("gdn_prefill_chunked: key head dim must be 32, 64 or 128, got " + std::to_string(a.dk));
  if (a.dv <= 0 || a.dv % 16 || a.dv > 512)
    throw Error("gdn_prefill_chunked: value head dim must be a multiple of 16 up to 512, got " +
                std::to_string(a.dv));
  if (a.Hk <= 0 || a.Hv % a.Hk || a.Hv / a.Hk > 32)
    throw Error("gdn_prefill_chunked: value heads must be a multiple (at most 32x) of key heads");
  if (a.ld_out % 2) throw Error("gdn_prefill_chunked: ld_out must be even");
  // Column block of the state kernel: 32 (128 blocks for 32 heads of dv 128, one wave on an H200);
  // LILAC_GDN_CHUNKED_COLS=64 (dk 128 only) or 16 for experiments; 16 when dv % 32 != 0.
  int cols = 32;
  if (const char* e = std::getenv("LILAC_GDN_CHUNKED_COLS")) {
    const int v = std::atoi(e);
    if (v == 16 || v == 32 || (v == 64 && a.dk == 128)) cols = v;
  }
  while (a.dv % cols) cols /= 2;

  GdnPrefillArgs args = a;
  if (!args.work) {
    if (capturing(stream)) {
      // No allocation inside a graph capture: the column scan (which has an allocation-free path).
      if (a.dk == 128 && a.dv == 128) return gdn_prefill(a, stream);
      throw Error("gdn_prefill_chunked: a work buffer is required while capturing a CUDA graph");
    }
    static StreamScratch scratch;
    const size_t need = work_floats(a.n, a.Hk, a.Hv, a.dk, a.dv);
    args.work = scratch.get(stream, need);
    if (!args.work)
      throw Error("gdn_prefill_chunked: cannot allocate " + std::to_string(need * 4) + " bytes of scratch");
  }
  if (reinterpret_cast<uintptr_t>(args.work) % 16) throw Error("gdn_prefill_chunked: work must be 16-byte aligned");
  const Work w = work_view(args.work, a.n, a.Hk, a.Hv, a.dk, a.dv);
  switch (a.dk) {
    case 32: run_dk<32>(args, w, math, cols, stream); break;
    case 64: run_dk<64>(args, w, math, cols, stream); break;
    default: run_dk<128>(args, w, math, cols, stream); break;
  }
  const int64_t warps = int64_t(a.n) * a.Hv;
  gated_norm_kernel<<<unsigned((warps + 7) / 8), 256, 0, stream>>>(args);
  check_launch("gdn chunked gated norm");
}

}  // namespace lilac::cuda
