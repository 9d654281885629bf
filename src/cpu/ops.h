// The reference ops of the model, one small function per op, plain fp32 (llama2.c style).
// The CPU backend is built from these; the CUDA kernels are tested against them.
//
// Conventions: activations are fp32 row-major; a "row" of tokens has the width given by the op.
// Sizes always come from arguments (ultimately from ModelConfig), never from constants.
// `pool` may be null (serial).
#pragma once
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "core/thread_pool.h"
#include "model/rope.h"
#include "model/weights.h"

namespace lilac::cpu {

// ---------------------------------------------------------------- quantized matrices
// (Row dequantization: lilac::dequantize_row in model/quant.h.)
// y[W.rows] = W x  (x [W.cols]); fp32 accumulation, rows split over the pool. Quantized rows are not
// materialised: y_r = Σ_g scale_g Σ_j q_j x_j + bias_g Σ_j x_j (another summation order than qmatmul's).
void qmatvec(const QMatrix& W, const float* x, float* y, ThreadPool* pool = nullptr);
// Y[n, W.rows] = X[n, W.cols] Wᵀ: each row of W is dequantized once and dotted with all n inputs
// (n == 1 goes through qmatvec). For n > 1 a row's result is not bit-equal to qmatvec's (another
// summation order): prefill uses it.
void qmatmul(const QMatrix& W, const float* X, int64_t n, float* Y, ThreadPool* pool = nullptr);
// Y[n, W.rows] with row t bit-identical to qmatvec(W, X[t]) (each weight row read once for all n
// inputs): the batched decode step, whose rows must not depend on the other rows of the batch.
void qmatvec_rows(const QMatrix& W, const float* X, int64_t n, float* Y, ThreadPool* pool = nullptr);
// out[W.cols] = dequantized row `token` of the embedding matrix.
void embed_row(const QMatrix& embed, int32_t token, float* out);

// ---------------------------------------------------------------- small vector ops
float dot(const float* a, const float* b, int64_t n);
inline float silu(float x);
float sigmoid(float x);
float softplus(float x);  // log(1 + exp(x)), stable (threshold 20 as torch)
// out = x * rsqrt(mean(x²) + eps) * w, over n values. `w` is the effective multiplier: for the
// zero-centred norms the checkpoint's (1 + w) (MLX bakes the +1 in), for the GDN norm the plain weight.
// out may alias x.
void rmsnorm(const float* x, const float* w, int64_t n, float eps, float* out);
// Same with a zero-centred weight given raw (multiplier 1 + w), as Hugging Face stores it.
void rmsnorm_zero_centred(const float* x, const float* w_raw, int64_t n, float eps, float* out);
// In place softmax over n values (fp32, max-subtracted).
void softmax(float* x, int64_t n);

// ---------------------------------------------------------------- gated attention
// Partial rotate-half (NeoX) RoPE of one head x[head_dim] at position pos: for i < rotary_dim/2,
// θ = pos · theta^(−2i/rotary_dim), (a, b) = (x[i], x[i + rotary_dim/2]) →
// (a cos θ − b sin θ, b cos θ + a sin θ); dims ≥ rotary_dim pass through.
void rope(float* x, int rotary_dim, int64_t pos, double theta);
// The inverse frequencies, as float (what rope() uses): inv_freq[i] = theta^(−2i/rotary_dim). Lives in
// model/rope.h (the CUDA backend uses it too); named here for the reference's readers.
using lilac::rope_inv_freq;
void rope_with(float* x, int rotary_dim, int64_t pos, const float* inv_freq);

// Split q_proj's output of one token ([heads][query head_dim | gate head_dim] interleaved per head)
// into q [heads * head_dim] and gate [heads * head_dim].
void split_query_gate(const float* qg, int heads, int head_dim, float* q, float* gate);

// One query head against a cache: out[head_dim] = Σ_j softmax_j(q·k_j · scale) v_j over
// j < n_ctx. K and V point at the first row of this head's kv slice; rows are `kv_stride` apart.
// scores: scratch of n_ctx floats.
void attention_head(const float* q, const float* K, const float* V, int64_t n_ctx, int64_t kv_stride,
                    int head_dim, float scale, float* out, float* scores);

// Gated attention of one token at position n_ctx - 1 given the cache rows [0, n_ctx) (k after norm +
// RoPE, v), already holding this token's k and v: for query head h (kv head h / (heads/kv_heads)),
// out[h] = attention_head(...) ⊙ sigmoid(gate[h]). q is normed + roped. out [heads * head_dim].
// gate == nullptr: no output gate (attn_output_gate false).
void gated_attention_token(const float* q, const float* gate, const float* K_cache, const float* V_cache,
                           int64_t n_ctx, int heads, int kv_heads, int head_dim, float* out, float* scores);

// ---------------------------------------------------------------- Gated DeltaNet
// Causal depthwise conv, one time step, then SiLU. w [C, K] (tap k multiplies the input K-1-k steps
// back, tap K-1 the current one); state [C, K-1] holds the previous K-1 inputs per channel, oldest
// first, and is updated. y may alias x.
void conv1d_silu_step(const float* w, int64_t C, int K, float* state, const float* x, float* y);
// x / sqrt(Σx² + eps) over n values, in place.
void l2norm(float* x, int64_t n, float eps = 1e-6f);
// β = sigmoid(b), g = −exp(A_log) · softplus(a + dt_bias), for Hv value heads.
void gdn_gates(const float* b, const float* a, const float* A_log, const float* dt_bias, int Hv, float* beta,
               float* g);
// One token of the recurrence for one value head; S [dk, dv] (row i = key dim i):
//   S ← exp(g)·S ; u = Sᵀk ; S ← S + k (β (v − u))ᵀ ; o = Sᵀ q.
// q, k already L2-normed (q also scaled by 1/sqrt(dk)).
void gdn_recurrent_step(float* S, const float* q, const float* k, const float* v, float g, float beta, int dk,
                        int dv, float* o);
// The same recurrence over T tokens of one head in the chunked (WY / UT transform) form, chunks of
// `chunk` tokens, all fp32. Token t reads q + t*q_stride, k + t*k_stride, v + t*v_stride, g[t], beta[t]
// and writes o + t*o_stride [dv]. S is the initial state on entry and the final state on return.
// Equals T calls of gdn_recurrent_step up to rounding.
void gdn_chunked(float* S, const float* q, int64_t q_stride, const float* k, int64_t k_stride, const float* v,
                 int64_t v_stride, const float* g, const float* beta, int64_t T, int dk, int dv, float* o,
                 int64_t o_stride, int chunk = 64);
// out[dv] = RMSNorm(o; w plain) ⊙ silu(z), o may alias out.
void gated_rmsnorm(const float* o, const float* z, const float* w, int dv, float eps, float* out);

// ---------------------------------------------------------------- MoE
// p = softmax(router_logits) over n_experts (fp32); the top k (ties to the lower id), by descending
// probability; weights p_e (renormalised to sum 1 when `renormalise`). ids/weights [k].
void moe_route(const float* router_logits, int n_experts, int k, bool renormalise, int* ids, float* weights);
// SwiGLU MLP on n tokens: Y[n, down.rows] = down( silu(gate X) ⊙ (up X) ). X [n, gate.cols].
// hidden: scratch of 2 * n * gate.rows floats. rowwise: products by qmatvec_rows (each row exactly as
// alone) instead of qmatmul.
void swiglu(const QMatrix& gate, const QMatrix& up, const QMatrix& down, const float* X, int64_t n, float* Y,
            float* hidden, ThreadPool* pool = nullptr, bool rowwise = false);
// The full MoE block on n tokens: Y[n, hidden] = Σ_top-k w_e expert_e(x) + sigmoid(shared_gate·x) ·
// shared(x). Tokens are grouped by expert so every expert's weights are dequantized once per call.
// rowwise: every product by qmatvec_rows, so row t is bit-identical to moe_forward of row t alone
// (the experts' sum runs in expert-id order for every row either way).
void moe_forward(const MoEWeights& w, const ModelConfig& cfg, const float* X, int64_t n, float* Y,
                 ThreadPool* pool = nullptr, bool rowwise = false);

// ---------------------------------------------------------------- inline definitions
inline float silu(float x) { return x / (1.f + std::exp(-x)); }

}  // namespace lilac::cpu
