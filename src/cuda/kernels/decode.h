// Decode kernels (one token per step): the launch API the CUDA backend's decode graph is built from.
// Every function is asynchronous on `stream`, allocates nothing, reads positions / tokens from device
// memory where the graph must stay reusable, and is CUDA-graph capturable.
// Activations are fp32 unless stated. Quantized matrices are in the MLX layout (qmatrix.cuh), bits 4
// or 8, cols % 64 == 0, group_size a multiple of 32.
#pragma once
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "cuda/kernels/qmatrix.cuh"

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
};
// impl: as GemvArgs::impl.
void moe_gate_up(const MoEDecodeWeights& w, const float* logits, const float* x, const float* norm_w, float eps,
                 int32_t* sel_ids, float* sel_w, float* act, cudaStream_t stream,
                 GemvImpl impl = GemvImpl::FromEnv);
void moe_down(const MoEDecodeWeights& w, const int32_t* sel_ids, const float* sel_w, const float* act, float* y,
              cudaStream_t stream, GemvImpl impl = GemvImpl::FromEnv);

// ------------------------------------------------------------------------------------------------ attention
// From q_proj's output qg [heads][query head_dim | gate head_dim] and k, v [kv_heads * head_dim]:
// RMSNorm each q / k head (q_norm, k_norm multipliers), partial rotate-half RoPE (inv_freq
// [rotary_dim/2]) at position *pos; q → q_out fp32 [heads * head_dim]; k, v → row *pos of the bf16
// caches [max_len][kv_heads][head_dim].
struct AttnDecodeShape {
  int heads = 0, kv_heads = 0, head_dim = 0, rotary_dim = 0;
  float eps = 1e-6f;
};
void attn_qk_norm_rope_append(const AttnDecodeShape& s, const float* qg, const float* k, const float* v,
                              const float* q_norm, const float* k_norm, const float* inv_freq, const int32_t* pos,
                              float* q_out, __nv_bfloat16* k_cache, __nv_bfloat16* v_cache, cudaStream_t stream);
// Attention of the token at *pos over cache rows [0, *pos], split over up to `n_split` parts of the
// context per kv head (the number actually used is chosen on the device from *pos and the SM count),
// then combined and gated: out[h] = attn_h ⊙ sigmoid(gate_h), gate read from qg. scale = 1/sqrt(head_dim).
// One kernel (the last blocks to finish do the combine). `partial` (attn_decode_partial_floats floats)
// holds arrival counters and the per-split partials; 16-byte aligned; it needs no initialisation (the
// block that completes a count resets it; never-used memory is detected and counted with tagged CAS)
// but must not be shared by launches that can run concurrently. head_dim 32, 64, 128 or 256;
// heads / kv_heads <= 16. At most 90 KB of shared memory per block (runs on sm_86 / sm_89 too).
constexpr int kAttnMaxSplit = 128;
size_t attn_decode_partial_floats(const AttnDecodeShape& s, int n_split);
void attention_decode(const AttnDecodeShape& s, const float* q, const float* qg, const __nv_bfloat16* k_cache,
                      const __nv_bfloat16* v_cache, const int32_t* pos, int n_split, float* partial, float* out,
                      cudaStream_t stream);
// Measurement hook: while buf is non-null, every attention_decode block records %globaltimer (ns) by
// thread 0 into buf[(blockIdx.y * gridDim.x + blockIdx.x) * 8 + k] (gridDim.x = units = kv_heads *
// ceil(G / 8), gridDim.y <= n_split; zero-fill buf first): k = 0 entry, 1 after the PDL wait, 2 q staged
// and the first K/V copies issued, 3 K/V loop done, 4 partial written, 5 arrival decided, 6 merge done
// (group / final mergers only), 7 exit (every block; blocks without work record only 0, 1, 7).
// nullptr turns it off. Not for use while a graph containing attention_decode may run.
void attn_decode_trace(unsigned long long* buf);

// ------------------------------------------------------------------------------------------------ Gated DeltaNet
// One token of the recurrence (conv + SiLU already applied by the in_proj GEMV epilogue):
// qkv [q Hk*dk | k Hk*dk | v Hv*dv], b, a [Hv]; state fp32 [Hv][dk][dv]; out o [Hv*dv] (raw, before the
// gated output norm, which the out_proj GEMV prologue applies). dk <= 256.
struct GdnShape {
  int Hk = 0, Hv = 0, dk = 0, dv = 0;
};
void gdn_decode_step(const GdnShape& s, const float* qkv, const float* b, const float* a, const float* A_log,
                     const float* dt_bias, float* state, float* out, cudaStream_t stream);

// ------------------------------------------------------------------------------------------------ sampling
// Sampling parameters as the device reads them (a copy of SamplingParams + the step counter).
struct SampleParamsDev {
  float temperature, top_p, min_p, presence, frequency, repetition;
  int top_k, logprobs, top_logprobs;
  unsigned long long seed;
  unsigned long long step;  // advanced on the device after each sample
};
constexpr int kMaxTopLogprobs = 20;
struct SampleResult {
  int32_t token;
  float logprob;
  int32_t n_top;
  int32_t top_ids[kMaxTopLogprobs];
  float top_lp[kMaxTopLogprobs];
};
size_t sample_scratch_bytes(int64_t vocab);
// Chooses a token from logits [vocab]: penalties (counts [vocab] of generated tokens, prompt_mask
// [vocab] for the repetition penalty) → temperature → top-k → top-p → min-p → sample (exact greedy
// argmax, ties to the lower id, when temperature == 0). Writes the token to *token_slot and *result,
// counts[token] += 1, params->step += 1. Logprobs are from log_softmax of the raw logits.
void sample_token(const float* logits, int64_t vocab, SampleParamsDev* params, int32_t* counts,
                  const uint8_t* prompt_mask, void* scratch, int32_t* token_slot, SampleResult* result,
                  cudaStream_t stream);

// *p += 1 (the position counter of the decode graph).
void increment_i32(int32_t* p, cudaStream_t stream);

}  // namespace lilac::cuda
