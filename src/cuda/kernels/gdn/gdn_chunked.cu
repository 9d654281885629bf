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
// the next chunk's loads overlap this chunk's products — by default warp-specialized (state_ws_kernel): O, which the
// recurrence does not wait for, on warps of its own a chunk behind;  (4) the gated RMSNorm epilogue → bf16.
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/error.h"
#include "cuda/kernels/gdn/gdn.h"
#include "cuda/kernels/ptx.cuh"
#include "cuda/kernels/stream_scratch.h"

namespace lilac::cuda {
namespace {

constexpr int CH = 64;        // chunk length
constexpr int THREADS = 256;  // 8 warps in the chunk and state kernels

void check_launch(const char* what) {
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

size_t work_floats(int n, int Hk, int Hv, int dk, int dv) {
  const int64_t nch = (n + CH - 1) / CH;
  return size_t(2 * int64_t(n) * Hk * dk + 2 * round4(int64_t(n) * Hv) + nch * Hv * CH * (dk + dv + CH + 1)) + 4;
}

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

// ---- (3) per (value head, column block of COLS), sequential over the chunks
template <int DK, int COLS>
struct StateSmem {
  static constexpr int LDW = DK + 4;    // W, Q: row-wise A fragments
  static constexpr int LDK = DK + 8;    // K: transposed A fragments (≡ 8 mod 32)
  static constexpr int LDP = CH + 4;
  static constexpr int LDU = COLS + 4;
  static constexpr int LDS = COLS + 8;  // S, Δ: B fragments [k][n] (≡ 8 mod 32)
  static constexpr int floats = 2 * CH * LDW + CH * LDK + CH * LDP + CH * LDU + DK * LDS + CH * LDS + 3 * CH;
  static constexpr size_t bytes = size_t(floats) * sizeof(float);
  // the warp-specialized kernel: a second S and Δ (the output warps read chunk c's while the recurrence writes
  // c + 1's) and the output warps' own G
  static constexpr int ws_floats = floats + DK * LDS + CH * LDS + CH;
  static constexpr size_t ws_bytes = size_t(ws_floats) * sizeof(float);
};

// The state pass's three products per chunk, each run by 8 warps (wi = 0..7: the warp's index among them). The plain
// kernel runs them in turn; the warp-specialized one runs (a) and (c) — the recurrence — on warps 0-7 and (b) — the
// output, which nothing of the recurrence waits for — on warps 8-15, a chunk behind.
template <int DK, int COLS>
struct StateMap {
  static constexpr int NT = COLS / 8;  // column tiles
  // (a), (b): 4 row tiles of 16 tokens; warp → row tile mta, column tiles cba .. cba+CPA-1.
  static constexpr int CPA = NT / 2;
  // (c): DK/16 row tiles of key rows; warp → row tile mtc, column tiles cbc .. cbc+CPC-1 (< NT).
  static constexpr int MTC = DK / 16, GC = 8 / MTC, CPC = (NT + GC - 1) / GC;
  static_assert(NT % 2 == 0 && MTC <= 8, "tile mapping");
};

// acc[j] (+ accl[j]) += A[m0 .. m0+15][0 .. K) · B[0 .. K)[8(cb + j) .. +7] for j < CPA: A row-major (lda), B [k][n]
// (ldb), K a multiple of 8 — the products of (a) and (b), fragments split once each (cvt_frag).
template <bool SPLIT, int CPA>
__device__ __forceinline__ void frag_products(float (&acc)[CPA][4], float (&accl)[CPA][4], const float* A, int lda,
                                              int m0, const float* B, int ldb, int cb, int K, int g, int q) {
#pragma unroll 2
  for (int k0 = 0; k0 < K; k0 += 8) {
    float fa[4];
    uint32_t ah[4], al[4];
    frag_a(fa, A, lda, m0, k0, g, q);
    cvt_frag<SPLIT, 4>(fa, ah, al);
#pragma unroll
    for (int j = 0; j < CPA; ++j) {
      float fb[2];
      uint32_t bh[2], bl[2];
      frag_b_kn(fb, B, ldb, k0, 8 * (cb + j), g, q);
      cvt_frag<SPLIT, 2>(fb, bh, bl);
      mma_acc<SPLIT>(acc[j], accl[j], ah, al, bh, bl);
    }
  }
}

// (a) Δ = U − W S
template <int DK, int COLS, bool SPLIT>
__device__ __forceinline__ void state_delta(const float* Ws, const float* Us, const float* Ss, float* Ds, int wi, int g,
                                            int q) {
  using L = StateSmem<DK, COLS>;
  constexpr int CPA = StateMap<DK, COLS>::CPA;
  const int mta = wi & 3, cba = (wi >> 2) * CPA;
  float acc[CPA][4] = {}, accl[CPA][4] = {};
  frag_products<SPLIT>(acc, accl, Ws, L::LDW, 16 * mta, Ss, L::LDS, cba, DK, g, q);
#pragma unroll
  for (int j = 0; j < CPA; ++j)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int t = 16 * mta + g + 8 * half, col = 8 * (cba + j) + 2 * q;
      Ds[t * L::LDS + col] = Us[t * L::LDU + col] - (acc[j][2 * half] + accl[j][2 * half]);
      Ds[t * L::LDS + col + 1] = Us[t * L::LDU + col + 1] - (acc[j][2 * half + 1] + accl[j][2 * half + 1]);
    }
}

// (b) O = e^G ⊙ (Q S) + P Δ for the chunk's tokens t0 .. t0 + nt − 1 (gc: the chunk's G) → o_scratch
template <int DK, int COLS, bool SPLIT>
__device__ __forceinline__ void state_out(const GdnPrefillArgs& a, const float* Qs, const float* Ps, const float* Ss,
                                          const float* Ds, const float* gc, int t0, int nt, int h, int j0, int wi,
                                          int g, int q) {
  using L = StateSmem<DK, COLS>;
  constexpr int CPA = StateMap<DK, COLS>::CPA;
  const int mta = wi & 3, cba = (wi >> 2) * CPA;
  float aq[CPA][4] = {}, aql[CPA][4] = {}, ap[CPA][4] = {}, apl[CPA][4] = {};
  frag_products<SPLIT>(aq, aql, Qs, L::LDW, 16 * mta, Ss, L::LDS, cba, DK, g, q);
  frag_products<SPLIT>(ap, apl, Ps, L::LDP, 16 * mta, Ds, L::LDS, cba, 16 * (mta + 1), g, q);  // P: lower triangular
  const int64_t o_stride = int64_t(a.Hv) * a.dv;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int t = 16 * mta + g + 8 * half;
    if (t < nt) {
      const float e = expf(gc[t]);
      float* orow = a.o_scratch + int64_t(t0 + t) * o_stride + int64_t(h) * a.dv + j0;
#pragma unroll
      for (int j = 0; j < CPA; ++j) {
        const int col = 8 * (cba + j) + 2 * q;
        const float o0 = fmaf(e, aq[j][2 * half] + aql[j][2 * half], ap[j][2 * half] + apl[j][2 * half]);
        const float o1 =
            fmaf(e, aq[j][2 * half + 1] + aql[j][2 * half + 1], ap[j][2 * half + 1] + apl[j][2 * half + 1]);
        *reinterpret_cast<float2*>(orow + col) = make_float2(o0, o1);
      }
    }
  }
}

// (c) S_out = e^{G_63} S_in + (diag(e^{G_63−G}) K)ᵀ Δ (S_out may be S_in: each thread reads only the elements it writes)
template <int DK, int COLS, bool SPLIT>
__device__ __forceinline__ void state_update(const float* Ks, const float* Ds, const float* sDec, float eG,
                                             const float* Sin, float* Sout, int wi, int g, int q) {
  using L = StateSmem<DK, COLS>;
  using M = StateMap<DK, COLS>;
  constexpr int NT = M::NT, CPC = M::CPC, LDS = L::LDS, LDK = L::LDK;
  const int mtc = wi % M::MTC, cbc = (wi / M::MTC) * CPC;
  const int i = 16 * mtc + g;
  float acc[CPC][4], accl[CPC][4] = {};
#pragma unroll
  for (int j = 0; j < CPC; ++j) {
    const int col = 8 * (cbc + j) + 2 * q;
    const bool ok = cbc + j < NT;
    acc[j][0] = ok ? eG * Sin[i * LDS + col] : 0.f;
    acc[j][1] = ok ? eG * Sin[i * LDS + col + 1] : 0.f;
    acc[j][2] = ok ? eG * Sin[(i + 8) * LDS + col] : 0.f;
    acc[j][3] = ok ? eG * Sin[(i + 8) * LDS + col + 1] : 0.f;
  }
  if (cbc < NT) {
#pragma unroll 2
    for (int k0 = 0; k0 < CH; k0 += 8) {
      const float d0 = sDec[k0 + q], d1 = sDec[k0 + q + 4];
      float fa[4];
      uint32_t ah[4], al[4];
      fa[0] = Ks[(k0 + q) * LDK + i] * d0;
      fa[1] = Ks[(k0 + q) * LDK + i + 8] * d0;
      fa[2] = Ks[(k0 + q + 4) * LDK + i] * d1;
      fa[3] = Ks[(k0 + q + 4) * LDK + i + 8] * d1;
      cvt_frag<SPLIT, 4>(fa, ah, al);
#pragma unroll
      for (int j = 0; j < CPC; ++j) {
        if (cbc + j < NT) {
          float fb[2];
          uint32_t bh[2], bl[2];
          frag_b_kn(fb, Ds, LDS, k0, 8 * (cbc + j), g, q);
          cvt_frag<SPLIT, 2>(fb, bh, bl);
          mma_acc<SPLIT>(acc[j], accl[j], ah, al, bh, bl);
        }
      }
    }
  }
#pragma unroll
  for (int j = 0; j < CPC; ++j) {
    if (cbc + j < NT) {
      const int col = 8 * (cbc + j) + 2 * q;
      Sout[i * LDS + col] = acc[j][0] + accl[j][0];
      Sout[i * LDS + col + 1] = acc[j][1] + accl[j][1];
      Sout[(i + 8) * LDS + col] = acc[j][2] + accl[j][2];
      Sout[(i + 8) * LDS + col + 1] = acc[j][3] + accl[j][3];
    }
  }
}

// The state pass's operand copies (cp.async, one commit group per call, empty past the last chunk), by threads
// t = 0 .. nthr − 1 of the caller's group: W, U and G (into gdst); Q and P (and G into gdst when given); K.
template <int DK, int COLS>
struct StateLoads {
  using L = StateSmem<DK, COLS>;
  const GdnPrefillArgs& a;
  const Work& w;
  int h, hk, j0, nch;
  __device__ __forceinline__ void wu(int c, float* Ws, float* Us, float* gdst, int t, int nthr) const {
    if (c < nch) {
      const int64_t blk = int64_t(c) * a.Hv + h;
      const float* Wg = w.W + blk * CH * DK;
      for (int idx = t; idx < CH * DK / 4; idx += nthr) {
        const int r = idx / (DK / 4), i = (idx % (DK / 4)) * 4;
        cp_async16(Ws + r * L::LDW + i, Wg + r * DK + i);
      }
      const float* Ug = w.U + blk * CH * a.dv + j0;
      for (int idx = t; idx < CH * COLS / 4; idx += nthr) {
        const int r = idx / (COLS / 4), i = (idx % (COLS / 4)) * 4;
        cp_async16(Us + r * L::LDU + i, Ug + int64_t(r) * a.dv + i);
      }
      if (t < CH / 4) cp_async16(gdst + 4 * t, w.G + blk * CH + 4 * t);
    }
    cp_async_commit();
  }
  __device__ __forceinline__ void qp(int c, float* Qs, float* Ps, float* gdst, int t, int nthr) const {
    if (c < nch) {
      const int t0 = c * CH, nt = min(CH, a.n - t0);
      for (int idx = t; idx < CH * DK / 4; idx += nthr) {
        const int r = idx / (DK / 4), i = (idx % (DK / 4)) * 4;
        const bool ok = r < nt;
        cp_async16_zfill(Qs + r * L::LDW + i, w.qn + (int64_t(ok ? t0 + r : 0) * a.Hk + hk) * DK + i, ok ? 16 : 0);
      }
      const float* Pg = w.P + (int64_t(c) * a.Hv + h) * CH * CH;
      for (int idx = t; idx < CH * CH / 4; idx += nthr) {
        const int r = idx / (CH / 4), i = (idx % (CH / 4)) * 4;
        cp_async16(Ps + r * L::LDP + i, Pg + r * CH + i);
      }
      if (gdst != nullptr && t < CH / 4) cp_async16(gdst + 4 * t, w.G + (int64_t(c) * a.Hv + h) * CH + 4 * t);
    }
    cp_async_commit();
  }
  __device__ __forceinline__ void k(int c, float* Ks, int t, int nthr) const {
    if (c < nch) {
      const int t0 = c * CH, nt = min(CH, a.n - t0);
      for (int idx = t; idx < CH * DK / 4; idx += nthr) {
        const int r = idx / (DK / 4), i = (idx % (DK / 4)) * 4;
        const bool ok = r < nt;
        cp_async16_zfill(Ks + r * L::LDK + i, w.kn + (int64_t(ok ? t0 + r : 0) * a.Hk + hk) * DK + i, ok ? 16 : 0);
      }
    }
    cp_async_commit();
  }
};

template <int DK, int COLS, bool SPLIT>
__global__ void __launch_bounds__(THREADS, 1) state_kernel(const GdnPrefillArgs a, Work w) {
  using L = StateSmem<DK, COLS>;
  constexpr int LDS = L::LDS;
  extern __shared__ __align__(16) float smem[];
  float* Ws = smem;
  float* Qs = Ws + CH * L::LDW;
  float* Ks = Qs + CH * L::LDW;
  float* Ps = Ks + CH * L::LDK;
  float* Us = Ps + CH * L::LDP;
  float* Ss = Us + CH * L::LDU;
  float* Ds = Ss + DK * LDS;
  float* sG = Ds + CH * LDS;  // [2][CH]
  float* sDec = sG + 2 * CH;  // [CH] e^{G_63 − G_t}

  const int h = blockIdx.y, j0 = blockIdx.x * COLS;
  const int dv = a.dv, n = a.n;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, q = lane & 3;
  const int nch = (n + CH - 1) / CH;
  const StateLoads<DK, COLS> ld{a, w, h, h / (a.Hv / a.Hk), j0, nch};

  float* Sg = a.state + int64_t(h) * DK * dv + j0;
  for (int idx = tid; idx < DK * COLS; idx += THREADS) {
    const int i = idx / COLS, j = idx % COLS;
    Ss[i * LDS + j] = Sg[int64_t(i) * dv + j];
  }
  ld.wu(0, Ws, Us, sG, tid, THREADS);
  ld.qp(0, Qs, Ps, nullptr, tid, THREADS);

  for (int c = 0; c < nch; ++c) {
    const float* gc = sG + (c & 1) * CH;
    const int t0 = c * CH, nt = min(CH, n - t0);
    // ---- (a) Δ = U − W S          (pending: WU(c), QP(c))
    cp_async_wait<1>();
    __syncthreads();
    ld.k(c, Ks, tid, THREADS);
    state_delta<DK, COLS, SPLIT>(Ws, Us, Ss, Ds, warp, g, q);
    // ---- (b) O = e^G ⊙ (Q S) + P Δ   (pending: QP(c), K(c))
    cp_async_wait<1>();
    __syncthreads();
    ld.wu(c + 1, Ws, Us, sG + ((c + 1) & 1) * CH, tid, THREADS);
    if (tid < CH) sDec[tid] = expf(gc[CH - 1] - gc[tid]);
    state_out<DK, COLS, SPLIT>(a, Qs, Ps, Ss, Ds, gc, t0, nt, h, j0, warp, g, q);
    // ---- (c) S ← e^{G_63} S + (diag(e^{G_63−G}) K)ᵀ Δ   (pending: K(c), WU(c+1))
    cp_async_wait<1>();
    __syncthreads();
    ld.qp(c + 1, Qs, Ps, nullptr, tid, THREADS);
    state_update<DK, COLS, SPLIT>(Ks, Ds, sDec, expf(gc[CH - 1]), Ss, Ss, warp, g, q);
  }
  cp_async_wait<0>();
  __syncthreads();
  for (int idx = tid; idx < DK * COLS; idx += THREADS) {
    const int i = idx / COLS, j = idx % COLS;
    Sg[int64_t(i) * dv + j] = Ss[i * LDS + j];
  }
}

// Named barriers of the warp-specialized kernel (ids 1..6; 0 is __syncthreads): bar.sync waits for `count` threads
// (arrivals included), bar.arrive signals without waiting. Shared-memory writes before either are visible to the
// threads that complete the barrier's bar.sync.
__device__ __forceinline__ void bar_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(count) : "memory");
}

// The state pass with its output off the recurrence's path: warps 0-7 (group A) run (a) and (c) chunk after chunk;
// warps 8-15 (group B) run (b) for chunk c while A works on c + 1 — S and Δ are double-buffered, B has its own Q, P and
// G buffers. Per chunk A signals "Δ_c and S_c ready" (barrier 3 + (c & 1)) after (a) and waits, before (c) of c, for
// B's "done with c − 1" (barrier 5 + ((c − 1) & 1)), whose S buffer (c) overwrites; the barriers alternate with the
// chunk's parity, so A may run one chunk ahead of B. The same products in the same order as state_kernel: the same bits.
constexpr int kBarA = 1, kBarB = 2, kBarReady = 3, kBarDone = 5;
template <int DK, int COLS, bool SPLIT>
__global__ void __launch_bounds__(2 * THREADS, 1) state_ws_kernel(const GdnPrefillArgs a, Work w) {
  using L = StateSmem<DK, COLS>;
  constexpr int LDS = L::LDS, ALL = 2 * THREADS;
  extern __shared__ __align__(16) float smem[];
  float* Ws = smem;
  float* Qs = Ws + CH * L::LDW;
  float* Ks = Qs + CH * L::LDW;
  float* Ps = Ks + CH * L::LDK;
  float* Us = Ps + CH * L::LDP;
  float* const S2 = Us + CH * L::LDU;  // [2][DK][LDS]: chunk c's state at S2 + (c & 1)·DK·LDS
  float* const D2 = S2 + 2 * DK * LDS;  // [2][CH][LDS]: chunk c's Δ at D2 + (c & 1)·CH·LDS
  auto S_of = [&](int c) { return S2 + (c & 1) * (DK * LDS); };
  auto D_of = [&](int c) { return D2 + (c & 1) * (CH * LDS); };
  float* sG = D2 + 2 * CH * LDS;  // [2][CH] (group A)
  float* sDec = sG + 2 * CH;     // [CH] e^{G_63 − G_t}
  float* sGb = sDec + CH;        // [CH] (group B)

  const int h = blockIdx.y, j0 = blockIdx.x * COLS;
  const int dv = a.dv, n = a.n;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, q = lane & 3;
  const int nch = (n + CH - 1) / CH;
  const StateLoads<DK, COLS> ld{a, w, h, h / (a.Hv / a.Hk), j0, nch};

  float* Sg = a.state + int64_t(h) * DK * dv + j0;
  for (int idx = tid; idx < DK * COLS; idx += ALL) {
    const int i = idx / COLS, j = idx % COLS;
    S2[i * LDS + j] = Sg[int64_t(i) * dv + j];
  }
  __syncthreads();

  if (warp < 8) {  // ---- group A: the recurrence
    ld.wu(0, Ws, Us, sG, tid, THREADS);
    for (int c = 0; c < nch; ++c) {
      const float* gc = sG + (c & 1) * CH;
      float* Sc = S_of(c);
      float* Dc = D_of(c);
      cp_async_wait<0>();  // W, U, G of chunk c
      bar_sync(kBarA, THREADS);
      ld.k(c, Ks, tid, THREADS);  // (c) of chunk c − 1 is past the barrier above
      state_delta<DK, COLS, SPLIT>(Ws, Us, Sc, Dc, warp, g, q);  // Δ_c's buffer: B is done with c − 2
      bar_sync(kBarA, THREADS);
      bar_arrive(kBarReady + (c & 1), ALL);  // Δ_c, S_c → B
      ld.wu(c + 1, Ws, Us, sG + ((c + 1) & 1) * CH, tid, THREADS);
      if (tid < CH) sDec[tid] = expf(gc[CH - 1] - gc[tid]);
      cp_async_wait<1>();  // K of chunk c
      if (c >= 1) bar_sync(kBarDone + ((c - 1) & 1), ALL);  // B is done with S_{c−1}, the buffer (c) writes
      bar_sync(kBarA, THREADS);
      state_update<DK, COLS, SPLIT>(Ks, Dc, sDec, expf(gc[CH - 1]), Sc, S_of(c + 1), warp, g, q);
    }
    cp_async_wait<0>();
    bar_sync(kBarA, THREADS);
    const float* Sf = S_of(nch);
    for (int idx = tid; idx < DK * COLS; idx += THREADS) {
      const int i = idx / COLS, j = idx % COLS;
      Sg[int64_t(i) * dv + j] = Sf[i * LDS + j];
    }
  } else {  // ---- group B: the outputs, a chunk behind
    const int tb = tid - THREADS;
    ld.qp(0, Qs, Ps, sGb, tb, THREADS);
    for (int c = 0; c < nch; ++c) {
      const int t0 = c * CH, nt = min(CH, n - t0);
      cp_async_wait<0>();  // Q, P, G of chunk c
      bar_sync(kBarB, THREADS);
      bar_sync(kBarReady + (c & 1), ALL);
      state_out<DK, COLS, SPLIT>(a, Qs, Ps, S_of(c), D_of(c), sGb, t0, nt, h, j0, warp - 8, g, q);
      if (c + 1 < nch) bar_arrive(kBarDone + (c & 1), ALL);  // A waits for it before (c) of chunk c + 1
      bar_sync(kBarB, THREADS);  // every B warp is done with Q, P, G
      ld.qp(c + 1, Qs, Ps, sGb, tb, THREADS);
    }
    cp_async_wait<0>();
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

// Whether the state pass runs warp-specialized (state_ws_kernel; LILAC_GDN_STATE_WS=0 or set_gdn_state_ws(false): the
// plain kernel). Both give the same bits.
std::atomic<int> g_state_ws{0};  // 0 auto (on), 1 on, 2 off
bool state_ws_on() {
  const int forced = g_state_ws.load();
  if (forced != 0) return forced == 1;
  static const bool off = [] {
    const char* e = std::getenv("LILAC_GDN_STATE_WS");
    return e && std::strcmp(e, "0") == 0;
  }();
  return !off;
}

template <int DK, int COLS, bool SPLIT>
void launch_state(const GdnPrefillArgs& a, const Work& w, cudaStream_t stream) {
  using L = StateSmem<DK, COLS>;
  static std::once_flag once;
  static bool ws_ok = false;  // the warp-specialized kernel's shared memory fits the device
  std::call_once(once, [] {
    cudaFuncSetAttribute(state_kernel<DK, COLS, SPLIT>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(L::bytes));
    ws_ok = cudaFuncSetAttribute(state_ws_kernel<DK, COLS, SPLIT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 int(L::ws_bytes)) == cudaSuccess;
    cudaGetLastError();
  });
  const dim3 grid(a.dv / COLS, a.Hv);
  if (ws_ok && state_ws_on())
    state_ws_kernel<DK, COLS, SPLIT><<<grid, 2 * THREADS, L::ws_bytes, stream>>>(a, w);
  else
    state_kernel<DK, COLS, SPLIT><<<grid, THREADS, L::bytes, stream>>>(a, w);
  check_launch("gdn chunked state kernel");
}

template <int DK, bool SPLIT>
void launch_state_cols(const GdnPrefillArgs& a, const Work& w, int cols, cudaStream_t stream) {
  if constexpr (DK == 128) {
    if (cols == 64) return launch_state<DK, 64, SPLIT>(a, w, stream);
  }
  if (cols == 32) return launch_state<DK, 32, SPLIT>(a, w, stream);
  return launch_state<DK, 16, SPLIT>(a, w, stream);
}

template <int DK>
void run_dk(const GdnPrefillArgs& a, const Work& w, GdnChunkedMath math, int cols, cudaStream_t stream) {
  launch_prep_and_chunks<DK>(a, w, stream);
  if (math == GdnChunkedMath::TF32)
    launch_state_cols<DK, false>(a, w, cols, stream);
  else
    launch_state_cols<DK, true>(a, w, cols, stream);
}

}  // namespace

void set_gdn_state_ws(bool on) { g_state_ws.store(on ? 1 : 2); }

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
