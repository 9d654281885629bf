// Prefill kernels: the launch API the CUDA backend calls for a chunk of n new tokens.
//
// Conventions (all functions):
//  * Activations are row-major, one row per token. Row strides are in ELEMENTS (not bytes) and let
//    the caller point into a wider buffer (e.g. the q part of q_proj's interleaved output).
//  * Every function is asynchronous on `stream`, launches a fixed number of kernels (no per-expert
//    or per-token launches), allocates nothing, and is CUDA-graph capturable.
//  * Bad arguments (unsupported bits / group size, misaligned strides) throw lilac::Error.
//  * Hopper (sm_90a) may take faster paths; LILAC_CUDA_PORTABLE=1 in the environment forces the
//    portable (sm_80+) paths everywhere so the H200 tests them too.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "cuda/kernels/qmatrix.cuh"

namespace lilac::cuda {

// ------------------------------------------------------------------------------------------------
// Quantized GEMM: Y[n, W.rows] = X[n, W.cols] · Wᵀ, dequantization fused into the tile loads,
// bf16 tensor cores (mma.sync m16n8k16), fp32 accumulation.
// W: 4- or 8-bit affine, group_size 64, W.cols % 64 == 0. X bf16, ldx % 8 == 0 (16-byte rows),
// X 16-byte aligned. n and W.rows may be anything >= 1 (edges are masked).
enum class GemmOut {
  StoreF32,   // Y (float*)          = X Wᵀ
  AddF32,     // Y (float*)         += X Wᵀ   (e.g. residual add after o_proj / out_proj)
  StoreBF16,  // Y (__nv_bfloat16*)  = X Wᵀ
};
void qgemm(const QMatrixDev& W, const __nv_bfloat16* X, int64_t ldx, int n, void* Y, int64_t ldy, GemmOut mode,
           cudaStream_t stream);

// Which tensor-core path the quantized GEMMs (qgemm, qgemm_swiglu, MoE grouped GEMMs) take.
// Auto (the default): wgmma (sm_90a) when the device is Hopper and the binary holds sm_90a code,
// unless LILAC_QGEMM_WGMMA=0 or LILAC_CUDA_PORTABLE=1; else mma.sync (sm_80+). A forced Wgmma falls
// back to mma.sync where it is unavailable. set_gemm_path is for tests and benchmarks.
// Measured on an H200 at n = 4096: wgmma ≈ 395 TFLOP/s, mma.sync ≈ 240 TFLOP/s (bench/GPU_NOTES.md).
enum class GemmPath { Auto, MmaSync, Wgmma };
void set_gemm_path(GemmPath path);
// Hopper + sm_90a code present (probed once, outside graph capture) and LILAC_CUDA_PORTABLE != 1.
bool gemm_wgmma_available();

// SwiGLU pair: H[n, G.rows] = silu(X Gᵀ) ⊙ (X Uᵀ), bf16 out (the input of the down projection).
// G and U must have the same shape and bits. (Shared expert gate+up in one pass.)
void qgemm_swiglu(const QMatrixDev& G, const QMatrixDev& U, const __nv_bfloat16* X, int64_t ldx, int n,
                  __nv_bfloat16* H, int64_t ldh, cudaStream_t stream);

// ------------------------------------------------------------------------------------------------
// Causal GQA attention for n_new queries at positions start_pos .. start_pos+n_new-1 against the
// cache rows [0, start_pos + n_new) (the caller has already written the new k/v into the cache).
// Query head h reads kv head h / (heads / kv_heads). softmax(q·k · scale) in fp32, flash-style
// (online softmax, no n×n matrix). head_dim must be 64, 128 or 256 (the model: 256).
//   q     bf16, element (i, h, d) at q[i*q_stride + h*q_head_stride + d]     (normed + roped)
//   k, v  bf16 caches, element (pos, kvh, d) at k[pos*kv_stride + kvh*head_dim + d] (same for v)
//   gate  optional (nullptr = none) fp32, element (i, h, d) at gate[i*gate_stride + h*gate_head_stride + d];
//         when given, out = attn ⊙ sigmoid(gate) (the model's output gate, fused)
//   out   bf16, element (i, h, d) at out[i*out_stride + h*head_dim + d] (the input of o_proj)
// Strides in elements; q_stride, q_head_stride, kv_stride, out_stride must be multiples of 8.
struct AttentionPrefillArgs {
  const __nv_bfloat16* q = nullptr;
  int64_t q_stride = 0, q_head_stride = 0;
  const __nv_bfloat16* k_cache = nullptr;
  const __nv_bfloat16* v_cache = nullptr;
  int64_t kv_stride = 0;
  const float* gate = nullptr;
  int64_t gate_stride = 0, gate_head_stride = 0;
  __nv_bfloat16* out = nullptr;
  int64_t out_stride = 0;
  int n_new = 0;
  int64_t start_pos = 0;
  int heads = 0, kv_heads = 0, head_dim = 0;
  float scale = 0.f;  // 0 = 1/sqrt(head_dim)
};
void attention_prefill(const AttentionPrefillArgs& a, cudaStream_t stream);

// ------------------------------------------------------------------------------------------------
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

// ------------------------------------------------------------------------------------------------
// MoE block for a chunk of n tokens:
//   Y[t] (+)= Σ_{top-k e} w_e · down_e(silu(gate_e x) ⊙ up_e x) + sigmoid(seg·x) · shared(x)
// Steps (a fixed number of launches): router qgemm (8-bit) → per-token softmax/top-k/renormalise
// (ties to the lower id) with an expert histogram → exclusive scan + tile list → scatter of the
// (token, slot) pairs sorted by expert → ONE grouped gate+up+SwiGLU GEMM over all experts →
// ONE grouped down GEMM (scaled by the routing weight) → shared expert (qgemm_swiglu + qgemm) →
// deterministic combine (per token, slot order) into Y.
struct MoEPrefillWeights {
  QMatrixDev router;                   // [E, hidden]
  QExpertsDev gate, up, down;          // E × [inter, hidden], E × [hidden, inter]
  QMatrixDev shared_gate, shared_up;   // [shared_inter, hidden]
  QMatrixDev shared_down;              // [hidden, shared_inter]
  QMatrixDev shared_expert_gate;       // [1, hidden]
  int top_k = 8;
  bool renormalise = true;
};
// Bytes of device scratch moe_prefill needs for up to n tokens (256-byte aligned pieces).
size_t moe_prefill_workspace_bytes(const MoEPrefillWeights& w, int n);
// X bf16 [n, hidden] (row stride ldx); Y fp32 [n, hidden] (row stride ldy); accumulate: Y += (residual).
// workspace: moe_prefill_workspace_bytes(w, n) bytes, 256-byte aligned.
// If ids_out / weights_out are given ([n, top_k] int32 / fp32) the routing is copied there (tests).
void moe_prefill(const MoEPrefillWeights& w, const __nv_bfloat16* X, int64_t ldx, int n, float* Y, int64_t ldy,
                 bool accumulate, void* workspace, cudaStream_t stream, int32_t* ids_out = nullptr,
                 float* weights_out = nullptr);

// The expert part alone with a given routing (ids/weights [n, top_k]); shared expert included.
// Exposed for tests (the routing is a discrete choice that rounding can flip near ties).
void moe_prefill_routed(const MoEPrefillWeights& w, const __nv_bfloat16* X, int64_t ldx, int n,
                        const int32_t* ids, const float* weights, float* Y, int64_t ldy, bool accumulate,
                        void* workspace, cudaStream_t stream);

// Routing alone: logits fp32 [n, E] → ids [n, k], weights [n, k] (softmax, top-k by descending
// probability, ties to the lower id, renormalised when asked).
void moe_route_prefill(const float* logits, int n, int E, int k, bool renormalise, int32_t* ids, float* weights,
                       cudaStream_t stream);

}  // namespace lilac::cuda
