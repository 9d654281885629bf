// The gated attention block over one layer's KV cache, for n rows at consecutive positions: used by the
// model's full-attention layers and by the MTP head's layer (its own cache), src/cpu/cpu_backend.cpp and
// src/cpu/mtp.cpp.
#pragma once
#include <cstdint>
#include <vector>

#include "core/thread_pool.h"
#include "model/config.h"
#include "model/weights.h"

namespace lilac::cpu {

// KV cache of one attention layer: k (after k_norm + RoPE) and v, [capacity, kv_dim] each; grows on demand.
struct KvCache {
  std::vector<float> k, v;
};

struct AttentionCall {
  const ModelConfig& cfg;
  const float* inv_freq;    // rope_inv_freq(cfg.rotary_dim, cfg.rope_theta)
  int64_t max_len;          // the cache never grows beyond this many rows
  bool kv_bf16 = false;     // round the stored k / v to bf16 (as the CUDA backend's cache)
  bool exact_rows = false;  // row-exact projections (qmatvec_rows): each row as a one-token step computes it
  ThreadPool* pool = nullptr;
};

// Room for cache rows [0, end) (capacity doubles, never beyond c.max_len rows).
void reserve_kv(const AttentionCall& c, KvCache& cache, int64_t end);

// One token at `pos` whose k / v projections already sit in its cache rows k_row / v_row: q (and the output
// gate, when gated) from q_proj's row qg_row, RMSNorm + partial RoPE of every q and k head, the cached k / v
// rounded to bf16 when c.kv_bf16. q, gate [heads * head_dim] (gate may be null when not gated).
void attention_qk_token(const AttentionCall& c, const AttentionWeights& a, const float* qg_row, int64_t pos, float* q,
                        float* gate, float* k_row, float* v_row);

// y [n, hidden] (after input_layernorm) at positions pos0 .. pos0 + n - 1: writes k / v of those positions
// into the cache (rows beyond are left as they are), row t attends to cache rows [0, pos0 + t], out [n, hidden]
// (after o_proj). The attention of a row is the same arithmetic whatever n is.
void attention_rows(const AttentionCall& c, const AttentionWeights& a, KvCache& cache, int64_t pos0, const float* y,
                    int64_t n, float* out);

}  // namespace lilac::cpu
