// The attention family: decode (one token against the bf16 KV cache: q/k norm + RoPE + append, then a
// split-K attention with the combine and the output gate fused; attention_decode.cu) and prefill (a
// chunk of n queries, causal, flash-style on tensor cores; attention_prefill.cu).
// Conventions: cuda/kernels/api.h.
#pragma once
#include "cuda/kernels/api.h"

namespace lilac::cuda {

// ------------------------------------------------------------------------------------------------ decode
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

// ------------------------------------------------------------------------------------------------ prefill
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
// Which kernel runs it. Auto: for head_dim 256 on Hopper with sm_90a code (gemm_wgmma_available()) the wgmma kernel
// (attention_prefill_wg.cu) when its 128-query blocks fill the GPU (at least one block per SM), else the mma.sync
// kernel; LILAC_ATTN_WGMMA=0 keeps mma.sync. A forced Wgmma takes the wgmma kernel wherever it can run (head_dim 256
// and sm_90a), else falls back to mma.sync. The two differ only in rounding (the order of the fp32 sums, one fma in
// the softmax).
enum class AttnPrefillPath { Auto, MmaSync, Wgmma };
void attention_prefill(const AttentionPrefillArgs& a, cudaStream_t stream, AttnPrefillPath path = AttnPrefillPath::Auto);
// The wgmma kernel itself (head_dim 256, sm_90a; attention_prefill checks both) and its grid's block count.
void attention_prefill_wgmma(const AttentionPrefillArgs& a, float scale_log2, cudaStream_t stream);
int attention_prefill_wgmma_blocks(int n_new, int heads);

}  // namespace lilac::cuda
