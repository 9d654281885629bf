// The Gated DeltaNet family: the decode step (one token, state in registers; gdn_decode.cu), the
// prefill conv and the column scan (gdn_prefill.cu), and the chunked WY / UT-transform prefill on
// tensor cores (gdn_chunked.cu). Conventions: cuda/kernels/api.h.
#pragma once
#include "cuda/kernels/api.h"

namespace lilac::cuda {

// ------------------------------------------------------------------------------------------------ decode
// One token of the recurrence (conv + SiLU already applied by the in_proj GEMV epilogue):
// qkv [q Hk*dk | k Hk*dk | v Hv*dv], b, a [Hv]; state fp32 [Hv][dk][dv]; out o [Hv*dv] (raw, before the
// gated output norm, which the out_proj GEMV prologue applies). dk <= 256.
struct GdnShape {
  int Hk = 0, Hv = 0, dk = 0, dv = 0;
};
// With a gate, out is instead the gated output norm o_h·rsqrt(Σo_h²/dv + eps)·norm_w·silu(z_h) per value head h
// (norm_w [dv], z [Hv*dv]): bit for bit what the out_proj GEMV's GatedHeadNorm prologue stages from the raw o
// (gemv_tc), so out_proj can take it with no prologue. Needs gdn_decode_gate_supported (sm_90 clusters, dv % 8 == 0,
// dv <= 128, a 16-byte-aligned state).
struct GdnGate {
  const float* z = nullptr;
  const float* norm_w = nullptr;
  float eps = 1e-6f;
};
bool gdn_decode_gate_supported(const GdnShape& s, const float* state);
void gdn_decode_step(const GdnShape& s, const float* qkv, const float* b, const float* a, const float* A_log,
                     const float* dt_bias, float* state, float* out, cudaStream_t stream, const GdnGate* gate = nullptr);

// ------------------------------------------------------------------------------------------------ prefill
// Gated DeltaNet prefill, in two launches the caller makes in order.
//
// (1) Causal depthwise conv (kernel K) over the chunk, then SiLU, updating the conv state:
//   x        fp32 [n, C] with row stride ldx (in_proj_qkv's output, layout [q | k | v])
//   w        fp32 [C, K]  (tap K-1 multiplies the current input, tap 0 the input K-1 steps back)
//   state    fp32 [C, K-1], the previous K-1 inputs per channel, OLDEST FIRST; updated to the last
//            K-1 inputs (earlier state entries when n < K-1)
//   y        fp32 [n, C] with row stride ldy (y must not alias x)
void gdn_conv_prefill(const float* x, int64_t ldx, const float* w, float* state, float* y, int64_t ldy, int n,
                      int C, int K, cudaStream_t stream);

// (2) The recurrence + the gated output norm. From the conv'd+SiLU'd qkv (layout [q Hk*dk | k Hk*dk |
// v Hv*dv] per row) it does, per token and value head h (key head h / (Hv/Hk)), all in fp32:
//   q̂ = l2norm(q)/sqrt(dk), k̂ = l2norm(k) (eps 1e-6 inside the sqrt), β = sigmoid(b),
//   g = −exp(A_log)·softplus(a + dt_bias);  S ← e^g S ; S ← S + k̂ (β (v − Sᵀk̂))ᵀ ; o = Sᵀ q̂
//   out = RMSNorm(o; norm_w, eps) ⊙ silu(z)   → bf16 (the input of out_proj)
// S is fp32 [Hv, dk, dv] (row i = key dim i), the initial state on entry, the final state on return.
// Sizes: dk == dv == 128 (checked).
//   qkv  fp32, row stride ld_qkv      b, a  fp32 [n, Hv] rows ld_b / ld_a     z fp32 [n, Hv*dv] rows ld_z
//   o_scratch fp32 [n, Hv*dv] (dense), out bf16 [n, Hv*dv] rows ld_out
struct GdnPrefillArgs {
  const float* qkv = nullptr;
  int64_t ld_qkv = 0;
  const float* b = nullptr;
  int64_t ld_b = 0;
  const float* a = nullptr;
  int64_t ld_a = 0;
  const float* z = nullptr;
  int64_t ld_z = 0;
  const float* A_log = nullptr;    // [Hv]
  const float* dt_bias = nullptr;  // [Hv]
  const float* norm_w = nullptr;   // [dv] plain multiplier
  float eps = 1e-6f;               // of the output RMSNorm
  float* state = nullptr;          // [Hv, dk, dv]
  float* o_scratch = nullptr;      // [n, Hv*dv]
  // Optional fp32 scratch of gdn_prefill_work_floats(n, Hk, Hv, dk) floats (16-byte aligned) for the
  // fast path (q̂, k̂, k̂·q̂ and the gates computed once per token by a parallel kernel, then streamed into
  // the scan with cp.async). When null, gdn_prefill uses a buffer it owns per stream (allocated on first
  // use / growth), or — while the stream is being captured into a CUDA graph — a slower path that needs
  // no scratch. Pass one to keep allocation out of prefill.
  float* work = nullptr;
  __nv_bfloat16* out = nullptr;
  int64_t ld_out = 0;
  int n = 0, Hk = 0, Hv = 0, dk = 0, dv = 0;
};
size_t gdn_prefill_work_floats(int n, int Hk, int Hv, int dk);
void gdn_prefill(const GdnPrefillArgs& a, cudaStream_t stream);

// (2') The same step as gdn_prefill (same arguments, same results up to rounding) in the chunked
// WY / UT-transform form, chunks of 64 tokens: per chunk K Kᵀ and Q Kᵀ on tensor cores (3xTF32, fp32
// accumulation), the triangular solve and all decays in fp32, chunks in parallel; then one pass over
// the chunks per (value head, 32 value columns) for the state products. `math` picks those products'
// precision: Split3xTF32 (≈ fp32) or TF32 (operands rounded to 10 mantissa bits, ~3x fewer mma).
// Sizes: dk ∈ {32, 64, 128}, dv % 16 == 0 (≤ 512), Hv a multiple (≤ 32x) of Hk; ld_out even.
// `work`, when given, must hold gdn_chunked_work_floats(n, Hk, Hv, dk, dv) floats (16-byte aligned;
// NOT gdn_prefill_work_floats: ~58 M floats = 237 MB at n = 4096 for the model); when null, a buffer
// owned per stream is used, or — while capturing a graph — gdn_prefill's allocation-free path
// (dk == dv == 128; other sizes throw). o_scratch [n, Hv*dv] as for gdn_prefill.
enum class GdnChunkedMath { Split3xTF32, TF32 };
size_t gdn_chunked_work_floats(int n, int Hk, int Hv, int dk, int dv);
void gdn_prefill_chunked(const GdnPrefillArgs& a, cudaStream_t stream,
                         GdnChunkedMath math = GdnChunkedMath::Split3xTF32);
// The state pass warp-specialized (default; the output products on 8 warps of their own, a chunk behind the
// recurrence's 8) or plain (false; also LILAC_GDN_STATE_WS=0). The same bits; for tests and measurements.
void set_gdn_state_ws(bool on);

}  // namespace lilac::cuda
