// The chunked Gated DeltaNet prefill's state pass (gdn_chunked.cu's launch (3); the math in its header comment): per
// (value head, column block of COLS), sequential over the chunks, Δ = U − W S, the outputs O = e^G ⊙ (Q S) + P Δ and
// the state update S ← e^{G_63} S + (diag(e^{G_63−G}) K)ᵀ Δ on the tensor cores (3xTF32 or TF32), operands streamed in
// with cp.async. Two kernels with the same products in the same order: state_kernel (8 warps do the three in turn)
// and, by default, state_ws_kernel (the outputs on 8 warps of their own, a chunk behind the recurrence's 8).
#include <atomic>
#include <mutex>
#include <type_traits>

#include "cuda/cuda_common.h"
#include "cuda/kernels/gdn/gdn_chunked.cuh"

namespace lilac::cuda {
namespace {

using namespace gdnc;

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

// A block's state slice between global memory (Sg: row i at Sg + i·dv) and shared memory (S: row i at S + i·LDS), by
// threads t = 0 .. nthr − 1.
template <int DK, int COLS, bool TO_SMEM>
__device__ __forceinline__ void copy_state(float* S, float* Sg, int dv, int t, int nthr) {
  constexpr int LDS = StateSmem<DK, COLS>::LDS;
  for (int idx = t; idx < DK * COLS; idx += nthr) {
    const int i = idx / COLS, j = idx % COLS;
    if constexpr (TO_SMEM)
      S[i * LDS + j] = Sg[int64_t(i) * dv + j];
    else
      Sg[int64_t(i) * dv + j] = S[i * LDS + j];
  }
}

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
  copy_state<DK, COLS, true>(Ss, Sg, dv, tid, THREADS);
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
  copy_state<DK, COLS, false>(Ss, Sg, dv, tid, THREADS);
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
  copy_state<DK, COLS, true>(S2, Sg, dv, tid, ALL);
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
    copy_state<DK, COLS, false>(S_of(nch), Sg, dv, tid, THREADS);
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

// Whether the state pass runs warp-specialized (state_ws_kernel; LILAC_GDN_STATE_WS=0 or set_gdn_state_ws(false): the
// plain kernel). Both give the same bits.
std::atomic<int> g_state_ws{0};  // 0 auto (on), 1 on, 2 off
bool state_ws_on() {
  const int forced = g_state_ws.load();
  if (forced != 0) return forced == 1;
  static const bool on = env_switch_on("LILAC_GDN_STATE_WS");
  return on;
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

}  // namespace

void gdnc::state_pass(const GdnPrefillArgs& a, const Work& w, bool split, int cols, cudaStream_t stream) {
  auto go = [&](auto dk) {
    constexpr int DK = decltype(dk)::value;
    if (split)
      launch_state_cols<DK, true>(a, w, cols, stream);
    else
      launch_state_cols<DK, false>(a, w, cols, stream);
  };
  switch (a.dk) {
    case 32: return go(std::integral_constant<int, 32>{});
    case 64: return go(std::integral_constant<int, 64>{});
    default: return go(std::integral_constant<int, 128>{});
  }
}

void set_gdn_state_ws(bool on) { g_state_ws.store(on ? 1 : 2); }

}  // namespace lilac::cuda
