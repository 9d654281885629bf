// Gated DeltaNet decode step, fused: L2 norms of q and k, the gates, the delta-rule recurrence on the
// fp32 state (read once, written once, kept in registers), the output o = Sᵀq̂. The conv + SiLU ran in
// the in_proj GEMV's epilogue; the gated output norm runs in the out_proj GEMV's prologue, or (GATE, sm_90) here:
// the blocks of a value head form a thread-block cluster, each gathers the head's o from the others' shared
// memory, and each writes its own columns of o·rsqrt(Σo²/dv + eps)·w·silu(z) with gemv_tc's staging arithmetic
// (tc::head_sums, unit_values' product order), so out_proj then stages its input with no prologue, same bits.
//
// Bandwidth-bound (the state, Hv·dk·dv fp32, is read and written once per token): grid (value head,
// 16-column slice of the state), 128 threads = 4 column groups of 4 columns (one float4 per row) ×
// 32 row groups; a thread owns rows rg, rg+32, ... (R of them) of its 4 columns. Every state load is
// issued at the start, before pdl_wait(): the state is written only by this kernel, once per token, and
// never by the kernel launched right before it (the in_proj GEMV), so with the launch.cuh rules its
// last writer completed long ago and the loads overlap the predecessor's tail. (Consequence: never
// launch two steps on the same state back to back with nothing in between.) Activations (qkv, b, a)
// are read, and everything is written, after pdl_wait().
// The column reduction u = Σ_i S_ij k_i is done on the raw k with ‖k‖² reduced alongside, then scaled
// by 1/‖k‖ (same math as scaling k first); the update and o = Σ_i S_ij q̂_i use the normalised k̂, q̂.
// dv % 4 == 0 with a 16-byte-aligned state takes float4 loads/stores; otherwise scalar columns.
#include <cstdint>
#include <string>

#include "cuda/cuda_common.h"
#include "cuda/kernels/gdn/gdn.h"
#include "cuda/kernels/launch.cuh"
#include "cuda/kernels/qdot.cuh"
#include "cuda/kernels/tc_common.cuh"

namespace lilac::cuda {
namespace {
using namespace dev;
constexpr int kMaxDk = 256;
constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kColGroups = 4;                        // float4 column groups per block
constexpr int kCols = 4 * kColGroups;                // state columns per block
constexpr int kRowGroups = kThreads / kColGroups;    // 32; a warp holds 8 consecutive row groups
constexpr int kRowsPerWarp = 32 / kColGroups;        // 8

constexpr int kMaxGateSlices = 8;

// The GATE epilogue: thread i < kCols holds t, column col of head h's o (col < dv), and w · silu(z) of it as the
// pair (w, sz) loaded early. Every thread of the block calls. The second barrier's wait is the block's last act:
// no block leaves while another may still read its o_s, and the gating runs between its arrive and wait.
__device__ __forceinline__ void gate_output(int dv, float eps, int h, int col, float t, float w, float sz, float* out) {
  __shared__ __align__(16) float o_s[kCols];
  __shared__ __align__(16) float xs[kMaxGateSlices * kCols];
  __shared__ float hss[1];
  if (threadIdx.x < kCols) o_s[threadIdx.x] = t;
  cluster_arrive();
  cluster_wait();  // every block's o_s written
  for (int d4 = threadIdx.x; d4 < dv / 4; d4 += kThreads)
    reinterpret_cast<float4*>(xs)[d4] =
        ld_cluster_f4(cluster_map(smem_u32(&o_s[(4 * d4) % kCols]), uint32_t((4 * d4) / kCols)));
  cluster_arrive();  // this block's reads of the cluster done
  __syncthreads();   // xs complete
  tc::head_sums(xs, hss, dv, dv, 0, dv / 8);  // out_proj staging's Σo² of the head (ends with a barrier)
  if (threadIdx.x < kCols && col < dv) {
    const float r = rsqrtf(hss[0] / float(dv) + eps);
    out[int64_t(h) * dv + col] = t * r * w * sz;  // unit_values' order: ((o · r) · w) · silu(z)
  }
  cluster_wait();
}

// R: rows per thread (dk <= 32 R). VEC: dv % 4 == 0 and the state 16-byte aligned. GATE: grid (slice, head) in
// clusters of a head's slices, the gated output norm applied (gdn_decode_gate_supported).
template <int R, bool VEC, bool GATE>
__global__ void __launch_bounds__(kThreads)
    gdn_step_kernel(GdnShape s, const float* qkv, const float* bp, const float* ap, const float* A_log,
                    const float* dt_bias, float* state, float* out, GdnGate gate) {
  __shared__ float part_u[kWarps][kColGroups][6];  // Σ S k (4 columns), Σ k², Σ q² per warp
  __shared__ float part_o[kWarps][kCols];
  const int h = GATE ? blockIdx.y : blockIdx.x, slice = GATE ? blockIdx.x : blockIdx.y, dk = s.dk, dv = s.dv;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int cg = lane & (kColGroups - 1);
  const int rg = warp * kRowsPerWarp + lane / kColGroups;
  const int c0 = slice * kCols + cg * 4;
  float* S = state + int64_t(h) * dk * dv;

  // 1. the state (and the weights A_log, dt_bias) before the wait: all loads in flight at once
  float sr[R][4];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int i = rg + r * kRowGroups;
    if constexpr (VEC) {
      float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
      if (i < dk && c0 < dv) x = __ldcs(reinterpret_cast<const float4*>(S + int64_t(i) * dv + c0));
      sr[r][0] = x.x;
      sr[r][1] = x.y;
      sr[r][2] = x.z;
      sr[r][3] = x.w;
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) sr[r][j] = (i < dk && c0 + j < dv) ? __ldcs(S + int64_t(i) * dv + c0 + j) : 0.f;
    }
  }
  const float negA = -expf(A_log[h]);
  const float dtb = dt_bias[h];

  pdl_wait();
  pdl_trigger();

  // 2. activations: q, k rows of this thread, v of its columns, the gate inputs
  const int kh = h / (s.Hv / s.Hk);
  const float* qp = qkv + int64_t(kh) * dk;
  const float* kp = qkv + int64_t(s.Hk) * dk + int64_t(kh) * dk;
  const float* vp = qkv + 2 * int64_t(s.Hk) * dk + int64_t(h) * dv;
  float qv[R], kv[R], vv[4];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int i = rg + r * kRowGroups;
    qv[r] = i < dk ? qp[i] : 0.f;
    kv[r] = i < dk ? kp[i] : 0.f;
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) vv[j] = c0 + j < dv ? vp[c0 + j] : 0.f;
  float gw = 0.f, gsz = 0.f;  // GATE: this thread's column's norm weight and silu(z), well before they are used
  if constexpr (GATE) {
    const int col = slice * kCols + threadIdx.x;
    if (threadIdx.x < kCols && col < dv) {
      gw = gate.norm_w[col];
      gsz = silu_f(gate.z[int64_t(h) * dv + col]);
    }
  }
  const float beta = sigmoid_f(bp[h]);
  const float xa = ap[h] + dtb;
  const float sp = xa > 20.f ? xa : log1pf(expf(xa));
  const float g = negA * sp;
  const float eg = expf(g);

  // 3. decay, then the partial column sums Σ S k and the squared norms
  float acc[6] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      sr[r][j] *= eg;
      acc[j] = fmaf(sr[r][j], kv[r], acc[j]);
    }
    acc[4] = fmaf(kv[r], kv[r], acc[4]);
    acc[5] = fmaf(qv[r], qv[r], acc[5]);
  }
  warp_partials<kColGroups>(acc, &part_u[warp][0][0], lane);
  __syncthreads();
  float tot[6] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int w = 0; w < kWarps; ++w)
#pragma unroll
    for (int x = 0; x < 6; ++x) tot[x] += part_u[w][cg][x];  // Σ k², Σ q² are the same in every column group
  const float rk = rsqrtf(tot[4] + 1e-6f);
  const float rq = rsqrtf(tot[5] + 1e-6f) * rsqrtf(float(dk));
  float delta[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) delta[j] = beta * (vv[j] - tot[j] * rk);

  // 4. S += k̂ deltaᵀ, o = Sᵀ q̂, write the state back
  float o[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int i = rg + r * kRowGroups;
    if (i < dk) {
      const float kn = kv[r] * rk, qn = qv[r] * rq;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        sr[r][j] = fmaf(kn, delta[j], sr[r][j]);
        o[j] = fmaf(sr[r][j], qn, o[j]);
      }
      if constexpr (VEC) {
        if (c0 < dv)
          __stcs(reinterpret_cast<float4*>(S + int64_t(i) * dv + c0),
                 make_float4(sr[r][0], sr[r][1], sr[r][2], sr[r][3]));
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j)
          if (c0 + j < dv) __stcs(S + int64_t(i) * dv + c0 + j, sr[r][j]);
      }
    }
  }
  warp_partials<kColGroups>(o, &part_o[warp][0], lane);
  __syncthreads();
  const int col = slice * kCols + threadIdx.x;
  float t = 0.f;
  if (threadIdx.x < kCols && col < dv) {
#pragma unroll
    for (int w = 0; w < kWarps; ++w) t += part_o[w][threadIdx.x];
    if constexpr (!GATE) out[int64_t(h) * dv + col] = t;
  }
  if constexpr (GATE) gate_output(dv, gate.eps, h, col, t, gw, gsz, out);
}

template <int R>
void launch_step(bool vec, const GdnShape& s, const float* qkv, const float* b, const float* a, const float* A_log,
                 const float* dt_bias, float* state, float* out, const GdnGate* gate, cudaStream_t stream) {
  const unsigned slices = unsigned((s.dv + kCols - 1) / kCols);
  if (gate) {  // vec holds (gdn_decode_gate_supported)
    launch_pdl_cluster(gdn_step_kernel<R, true, true>, dim3(slices, unsigned(s.Hv)), dim3(kThreads), 0, stream, slices,
                       s, qkv, b, a, A_log, dt_bias, state, out, *gate);
    return;
  }
  const dim3 grid(unsigned(s.Hv), slices);
  if (vec)
    launch_pdl(gdn_step_kernel<R, true, false>, grid, dim3(kThreads), 0, stream, s, qkv, b, a, A_log, dt_bias, state,
               out, GdnGate{});
  else
    launch_pdl(gdn_step_kernel<R, false, false>, grid, dim3(kThreads), 0, stream, s, qkv, b, a, A_log, dt_bias, state,
               out, GdnGate{});
}

}  // namespace

bool gdn_decode_gate_supported(const GdnShape& s, const float* state) {
  return sm90_or_later() && s.dv % 8 == 0 && s.dv <= kMaxGateSlices * kCols &&
         reinterpret_cast<uintptr_t>(state) % 16 == 0;
}

void gdn_decode_step(const GdnShape& s, const float* qkv, const float* b, const float* a, const float* A_log,
                     const float* dt_bias, float* state, float* out, cudaStream_t stream, const GdnGate* gate) {
  LILAC_CHECK(s.dk > 0 && s.dk <= kMaxDk && s.dv > 0 && s.Hk > 0 && s.Hv % s.Hk == 0,
              "gdn decode: unsupported shape (dk " + std::to_string(s.dk) + ")");
  LILAC_CHECK(!gate || gdn_decode_gate_supported(s, state), "gdn decode: the gated output norm needs sm_90, dv % 8 == 0, dv <= 128");
  const bool vec = s.dv % 4 == 0 && reinterpret_cast<uintptr_t>(state) % 16 == 0;
  const int rows = (s.dk + kRowGroups - 1) / kRowGroups;  // rows per thread, 1..8
  if (rows <= 1)
    launch_step<1>(vec, s, qkv, b, a, A_log, dt_bias, state, out, gate, stream);
  else if (rows <= 2)
    launch_step<2>(vec, s, qkv, b, a, A_log, dt_bias, state, out, gate, stream);
  else if (rows <= 4)
    launch_step<4>(vec, s, qkv, b, a, A_log, dt_bias, state, out, gate, stream);
  else
    launch_step<8>(vec, s, qkv, b, a, A_log, dt_bias, state, out, gate, stream);
}

}  // namespace lilac::cuda
