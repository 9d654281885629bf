// The decode GEMV family (one token): dense quantized GEMV with fused input prologues and the Gated
// DeltaNet conv epilogue, the embedding gather, and the MoE decode GEMVs (routing + gate/up, down).
// Two implementations behind one API: tensor cores (gemv_tc.cu, the default) and fp32 (gemv.cu).
// Conventions: cuda/kernels/api.h.
#pragma once
#include "cuda/kernels/api.h"

namespace lilac::cuda {

// ------------------------------------------------------------------------------------------------ GEMV
// y[W.rows] (+)= W · t(x), where t is the input prologue applied once per block while x is staged
// in shared memory:
//   None:          t(x) = x
//   RmsNorm:       t(x) = x · rsqrt(mean(x²) + eps) · norm_w              (norm_w [cols])
//   GatedHeadNorm: per head of `head_dim` values: t(x) = RMSNorm(x_h; norm_w plain) · silu(z_h)
//                  (norm_w [head_dim], z [cols]) — the Gated DeltaNet output norm
// Optional epilogue for the Gated DeltaNet in_proj: rows r < conv_rows go through the causal depthwise
// conv (taps conv_w [conv_rows, K], state conv_state [conv_rows, K-1] oldest first, updated) and SiLU.
enum class Prologue { None = 0, RmsNorm = 1, GatedHeadNorm = 2 };
// Which GEMV implementation:
//   Tensor (the default): tensor-core GEMV (gemv_tc.cu): nibbles → fp16 exactly, the input split per
//     64-group into fp16 hi + lo parts with a power-of-two scale, mma.sync with fp32 accumulation —
//     the fp32 result to ~1e-6 relative; 4/8-bit, group size 64 (other shapes fall back to Fp32).
//   Fp32: dequantize to fp32, fp32 FMAs (the reference kernel; also the fallback for shapes the
//     tensor-core kernel does not take).
//   FromEnv: LILAC_GEMV=fp32 selects Fp32; anything else or unset: Tensor (read at each launch call,
//     i.e. when the decode graph is captured).
enum class GemvImpl { FromEnv = -1, Fp32 = 0, Tensor = 1 };
GemvImpl gemv_impl_from_env();
struct GemvArgs {
  QMatrixDev W;
  const float* x = nullptr;
  float* y = nullptr;
  bool accumulate = false;  // y += W t(x) (residual add)
  Prologue pro = Prologue::None;
  const float* norm_w = nullptr;
  const float* z = nullptr;
  int head_dim = 0;
  float eps = 1e-6f;
  // conv epilogue
  int conv_rows = 0, conv_k = 0;
  const float* conv_w = nullptr;
  float* conv_state = nullptr;
  GemvImpl impl = GemvImpl::FromEnv;
};
void gemv(const GemvArgs& a, cudaStream_t stream);

// out[cols] = dequantized row *token of E.
void embed_gather(const QMatrixDev& E, const int32_t* token, float* out, cudaStream_t stream);

// ------------------------------------------------------------------------------------------------ MoE
// Decode MoE for one token, in two launches:
// (1) moe_gate_up: routing from logits [E + 1] (E router logits, then the shared_expert_gate logit):
//     softmax, top-k by probability (ties to the lower id), renormalised when asked; the selected ids /
//     weights (weight k = sigmoid(shared logit)) go to sel_ids [k] / sel_w [k + 1]; then for the k experts
//     and the shared expert: act[e][j] = silu(gate_e[j]·t(x)) · up_e[j]·t(x), t = RmsNorm(norm_w).
// (2) moe_down: y[r] += Σ_e sel_w[e] · down_e[r]·act[e]  (e over the k experts and the shared one).
struct MoEDecodeWeights {
  QExpertsDev gate, up, down;
  QMatrixDev shared_gate, shared_up, shared_down;
  int E = 0, top_k = 0;
  bool renormalise = true;
  // The digits kernels (kernels/digits/moe_digits.h) instead of the fp16 ones, for one row (moe_gate_up /
  // moe_down) and for the rows step alike, so a row's bits stay the same alone and in a batch; set by
  // finish_model where digits::moe_supported holds and LILAC_DIGITS_MOE=1 (opt-in for now; LILAC_DIGITS=0: off).
  bool digits = false;
};
// impl: as GemvArgs::impl.
void moe_gate_up(const MoEDecodeWeights& w, const float* logits, const float* x, const float* norm_w, float eps,
                 int32_t* sel_ids, float* sel_w, float* act, cudaStream_t stream,
                 GemvImpl impl = GemvImpl::FromEnv);
void moe_down(const MoEDecodeWeights& w, const int32_t* sel_ids, const float* sel_w, const float* act, float* y,
              cudaStream_t stream, GemvImpl impl = GemvImpl::FromEnv);

// ------------------------------------------------------------------------------------------------ measurement
// While buf != null, every tensor-core GEMV block (dense and MoE) writes %globaltimer (ns) to
// buf[block * 8 + i]: 0 entry, 1 after the PDL wait, 5 routing / expert table ready (MoE), 2 input
// copies landed, 3 staged, 4 first group done (dense; MoE gate/up: its last group's act written), 7 exit;
// MoE down overwrites 2 with its first row block's group values complete and 4 with its expert sums
// complete; the MoE kernels write their block's SM id (not a time) to 6. nullptr turns it off. Not for use
// while a graph containing these kernels may run (gemv_tc.h: tc_trace_from_env keeps the last launch's).
void gemv_tc_trace(unsigned long long* buf);

}  // namespace lilac::cuda
