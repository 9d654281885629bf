// One warp's share of a decode attention split on the tensor cores: the per-chunk scores, online softmax
// and P·V of attention_decode (attention_decode.cu) and of the multi-row kernel (rows/attention_rows.cu),
// which must compute a row's output with the same arithmetic (bitwise), so both take it from here.
//
// A chunk is R consecutive cache rows (positions) of one kv head, staged by the caller's cp.async copies in
// one stage of the warp's ring (KS stages) as R K rows then R V rows of HD bf16 each; chunk c of a split
// goes to warp c % NW, and a warp handles CP = 8 / R of its chunks (8 positions, at least one chunk) in one
// pass, so that the tensor cores' tiles are full. For the unit's NG (<= 8) query heads, per pass:
//   scores  S = q · Kᵀ as mma m16n8k16: A = q, rows 0..7 the heads' bf16 high parts, rows 8..15 their
//           bf16 low parts (q = hi + lo to 2^-17 relative, so the fp32 q loses almost nothing), B = Kᵀ
//           by ldmatrix (k = dims, n = 8 positions); a lane then holds head g's scores of positions 2c,
//           2c+1 of each 8-position tile as (hi row + lo row), summed in its own registers;
//   softmax the running max / sum per head over the chunk's positions (two quad shuffles);
//   P·V     Oᵀ += Vᵀ · P as mma m16n8k8: A = Vᵀ by ldmatrix.trans (m = 16 dims, k = 8 positions),
//           B = P (k = 8 positions, n = 8 heads), which is the scores' register layout unchanged; P is
//           split hi + lo the same way, two mmas per tile.
// The lane's accumulators hold Oᵀ[16·mt + g (+8)][heads 2c, 2c+1] for the HD / 16 dim tiles mt, all in
// fp32. Positions of a pass that are not the warp's (chunks past the split) read the pass's first row
// again (finite; their P is 0); positions past the split's end are masked to -inf (their rows are
// zero-filled by the caller's copies, so finite too).
// Include from one .cu only (anonymous namespace).
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/kernels/ptx.cuh"

namespace lilac::cuda {
namespace {

// x as bf16 hi + lo: hi = bf16(x), the remainder x - hi (exact in fp32) rounded to bf16.
__device__ __forceinline__ void split_pair(float x0, float x1, uint32_t& hi, uint32_t& lo) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
  const float2 hf = __bfloat1622float2(h);
  const __nv_bfloat162 l = __floats2bfloat162_rn(x0 - hf.x, x1 - hf.y);
  hi = *reinterpret_cast<const uint32_t*>(&h);
  lo = *reinterpret_cast<const uint32_t*>(&l);
}

template <int HD, int NG, int R, int KS, int NW>
struct WarpAttnTc {
  static constexpr int KK = HD / 16;            // k-steps of the scores = dim tiles of P·V
  static constexpr int CP = R >= 8 ? 1 : 8 / R;  // chunks per pass
  static constexpr int PP = CP * R;              // positions per pass (8 or 16)
  static constexpr int NT = PP / 8;              // 8-position tiles per pass
  static constexpr int STAGE = 2 * R * HD;       // bf16 per ring stage
  static constexpr int kQFloats = KK * 32 * 4;   // the q fragments in shared memory (stage_q)
  // The block merge's copy of a warp's accumulators: [NG][kAccStride], a head's HD floats padded by 4 so
  // that the stores of a quad's four head pairs fall in distinct banks.
  static constexpr int kAccStride = HD + 4;
  static constexpr int kAccFloats = NG * kAccStride;
  static_assert(NG >= 1 && NG <= 8 && HD % 32 == 0 && PP % 8 == 0 && CP <= KS - 1, "attention warp tile");

  float acc[KK][4];
  float m_run, l_run;  // head g = lane / 4 (the same in the 4 lanes of a quad)

  __device__ __forceinline__ void init() {
#pragma unroll
    for (int mt = 0; mt < KK; ++mt)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[mt][j] = 0.f;
    m_run = -INFINITY;
    l_run = 0.f;
  }

  // The A fragments of q (scaled by 1/sqrt(HD), heads past hv zero) for every k-step: qf[kk·32 + lane] =
  // {hi(g, 2c..2c+1), lo(g, 2c..), hi(g, 8+2c..), lo(g, 8+2c..)} of dims 16·kk + .... Whole block
  // (NTH threads); q_heads points at head 0 of the unit ([NG][HD] fp32). All loads issued at once.
  template <int NTH>
  static __device__ __forceinline__ void stage_q(const float* q_heads, int hv, uint4* qf, int tid) {
    constexpr int kMaxPer = (KK * 32 + NTH - 1) / NTH;
    const float scale = rsqrtf(float(HD));
    float v[kMaxPer][4];
#pragma unroll
    for (int k = 0; k < kMaxPer; ++k) {
      const int e = tid + k * NTH, kk = e >> 5, l = e & 31, g = l >> 2, c = l & 3;
      const bool on = e < KK * 32 && g < hv;
      const float* p = q_heads + int64_t(on ? g : 0) * HD + 16 * (on ? kk : 0) + 2 * c;
#pragma unroll
      for (int j = 0; j < 4; ++j) v[k][j] = on ? p[(j >> 1) * 8 + (j & 1)] : 0.f;
    }
#pragma unroll
    for (int k = 0; k < kMaxPer; ++k) {
      const int e = tid + k * NTH;
      if (e < KK * 32) {
        uint4 f;
        split_pair(v[k][0] * scale, v[k][1] * scale, f.x, f.y);
        split_pair(v[k][2] * scale, v[k][3] * scale, f.z, f.w);
        qf[e] = f;
      }
    }
  }

  // The warp's chunks of a split [begin, end) of nch chunks, through its ring (KS stages of STAGE bf16).
  // The caller has issued the first KS - 1 chunks (one commit group each, empty past the split) and
  // staged qf; issue(c, stage) copies split chunk c into a stage (no commit).
  template <class Issue>
  __device__ __forceinline__ void stream(Issue&& issue, const __nv_bfloat16* ring, const uint4* qf, int warp, int lane,
                                         int nch, int64_t begin, int64_t end) {
    const int nchw = warp < nch ? (nch - warp + NW - 1) / NW : 0;
    // commit groups: KS - 1 before the loop and CP per pass, so the wait below is static
    for (int j0 = 0; j0 < nchw; j0 += CP) {
      dev::cp_async_wait<KS - 1 - CP>();
      __syncwarp();
      {
        const int jn = j0 + KS - 1;  // into the stage freed by the last pass
        if (jn < nchw) issue(warp + NW * jn, jn % KS);
        dev::cp_async_commit();
      }
      pass(ring, qf, lane, warp, j0, nchw, begin, end);
      __syncwarp();  // the pass's stages are read: refill them
#pragma unroll
      for (int k = 0; k < CP - 1; ++k) {
        const int jn = j0 + KS + k;
        if (jn < nchw) issue(warp + NW * jn, jn % KS);
        dev::cp_async_commit();
      }
    }
  }

  // One pass over the warp's chunks j0 .. j0 + CP - 1 (those < nchw).
  __device__ __forceinline__ void pass(const __nv_bfloat16* ring, const uint4* qf, int lane, int warp, int j0,
                                       int nchw, int64_t begin, int64_t end) {
    constexpr unsigned kFull = 0xffffffffu;
    const int c = lane & 3;
    const uint32_t rb = dev::smem_u32(ring);
    // this lane's ldmatrix row (position 8t + lane % 8 of the pass): its K row's byte offset in the ring
    uint32_t row_off[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const int p = 8 * t + (lane & 7);
      int j = j0 + p / R, r = p % R;
      if (j >= nchw) j = j0, r = 0;
      row_off[t] = uint32_t(((j % KS) * STAGE + r * HD + 8 * (lane >> 3)) * 2);
    }
    // scores: two accumulators per tile (even / odd k-steps), summed after
    float s[NT][2][4];
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
      for (int j = 0; j < 4; ++j) s[t][0][j] = s[t][1][j] = 0.f;
#pragma unroll
    for (int t = 0; t < NT; ++t) {
#pragma unroll
      for (int kk = 0; kk < KK; kk += 2) {
        uint32_t b0, b1, b2, b3;
        dev::ldmatrix_x4(rb + row_off[t] + kk * 32, b0, b1, b2, b3);
        dev::mma_m16n8k16_bf16_nv(s[t][0], qf[kk * 32 + lane], b0, b1);
        dev::mma_m16n8k16_bf16_nv(s[t][1], qf[(kk + 1) * 32 + lane], b2, b3);
      }
    }
    float sc[NT][2];
    float mx = -INFINITY;
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int p = 8 * t + 2 * c + e, j = j0 + p / R;
        const bool ok = j < nchw && begin + int64_t(warp + NW * j) * R + p % R < end;
        const float hi = s[t][0][e] + s[t][1][e], lo = s[t][0][2 + e] + s[t][1][2 + e];
        sc[t][e] = ok ? hi + lo : -INFINITY;
        mx = fmaxf(mx, sc[t][e]);
      }
    mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, 2));
    const float m_new = fmaxf(m_run, mx);
    float p[NT][2], ps = 0.f;
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        p[t][e] = expf(sc[t][e] - m_new);
        ps += p[t][e];
      }
    ps += __shfl_xor_sync(kFull, ps, 1);
    ps += __shfl_xor_sync(kFull, ps, 2);
    const bool grow = m_new > m_run;
    const float corr = grow ? expf(m_run - m_new) : 1.f;
    l_run = fmaf(l_run, corr, ps);
    m_run = m_new;
    if (__any_sync(kFull, grow)) {  // the lane's heads are 2c and 2c + 1: their quads' corr
      const float ca = __shfl_sync(kFull, corr, 8 * c), cb = __shfl_sync(kFull, corr, 8 * c + 4);
#pragma unroll
      for (int mt = 0; mt < KK; ++mt) {
        acc[mt][0] *= ca;
        acc[mt][1] *= cb;
        acc[mt][2] *= ca;
        acc[mt][3] *= cb;
      }
    }
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      uint32_t ph, pl;
      split_pair(p[t][0], p[t][1], ph, pl);
      const uint32_t va = rb + row_off[t] + uint32_t(R * HD * 2);  // the V row of the same position
#pragma unroll
      for (int mt = 0; mt < KK; mt += 2) {
        uint32_t a0, a1, a2, a3;
        dev::ldmatrix_x4_trans(va + mt * 32, a0, a1, a2, a3);
        dev::mma_m16n8k8_bf16(acc[mt], a0, a1, ph);
        dev::mma_m16n8k8_bf16(acc[mt + 1], a2, a3, ph);
        dev::mma_m16n8k8_bf16(acc[mt], a0, a1, pl);
        dev::mma_m16n8k8_bf16(acc[mt + 1], a2, a3, pl);
      }
    }
  }

  // The warp's state into the block merge's layout: wacc [NG][kAccStride] (this warp's), wm / wl [NG].
  __device__ __forceinline__ void store(float* wacc, float* wm, float* wl, int lane) const {
    const int g = lane >> 2, c = lane & 3, ha = 2 * c, hb = 2 * c + 1;
#pragma unroll
    for (int mt = 0; mt < KK; ++mt) {
      const int d = 16 * mt + g;
      if (ha < NG) {
        wacc[ha * kAccStride + d] = acc[mt][0];
        wacc[ha * kAccStride + d + 8] = acc[mt][2];
      }
      if (hb < NG) {
        wacc[hb * kAccStride + d] = acc[mt][1];
        wacc[hb * kAccStride + d + 8] = acc[mt][3];
      }
    }
    if (c == 0 && g < NG) {
      wm[g] = m_run;
      wl[g] = l_run;
    }
  }
};

}  // namespace
}  // namespace lilac::cuda
