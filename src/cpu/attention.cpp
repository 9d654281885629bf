#include "cpu/attention.h"

#include <algorithm>
#include <cstring>

#include "core/bf16.h"
#include "cpu/ops.h"

namespace lilac::cpu {

void reserve_kv(const AttentionCall& c, KvCache& cache, int64_t end) {
  const int64_t kvd = c.cfg.kv_dim(), have = int64_t(cache.k.size()) / std::max<int64_t>(1, kvd);
  if (have >= end) return;
  const size_t cap = static_cast<size_t>(std::min(c.max_len, std::max(end, 2 * have)) * kvd);
  cache.k.resize(cap);
  cache.v.resize(cap);
}

void attention_qk_token(const AttentionCall& c, const AttentionWeights& a, const float* qg_row, int64_t pos, float* q,
                        float* gate, float* k_row, float* v_row) {
  const ModelConfig& cfg = c.cfg;
  const int heads = cfg.num_heads, kvh = cfg.num_kv_heads, hd = cfg.head_dim;
  const int64_t kvd = cfg.kv_dim(), qd = int64_t(heads) * hd;
  const float eps = float(cfg.rms_norm_eps);
  if (cfg.attn_output_gate)
    split_query_gate(qg_row, heads, hd, q, gate);
  else
    std::memcpy(q, qg_row, static_cast<size_t>(qd) * sizeof(float));
  for (int h = 0; h < heads; ++h) {
    float* qh = q + int64_t(h) * hd;
    rmsnorm(qh, a.q_norm.data(), hd, eps, qh);
    rope_with(qh, cfg.rotary_dim, pos, c.inv_freq);
  }
  for (int h = 0; h < kvh; ++h) {
    float* kh = k_row + int64_t(h) * hd;
    rmsnorm(kh, a.k_norm.data(), hd, eps, kh);
    rope_with(kh, cfg.rotary_dim, pos, c.inv_freq);
  }
  if (c.kv_bf16)
    for (int64_t i = 0; i < kvd; ++i) {
      k_row[i] = bf16_to_f32(f32_to_bf16(k_row[i]));
      v_row[i] = bf16_to_f32(f32_to_bf16(v_row[i]));
    }
}

void attention_rows(const AttentionCall& c, const AttentionWeights& a, KvCache& cache, int64_t pos0, const float* y,
                    int64_t n, float* out) {
  const ModelConfig& cfg = c.cfg;
  const int heads = cfg.num_heads, kvh = cfg.num_kv_heads, hd = cfg.head_dim;
  const int64_t qrows = cfg.q_proj_rows(), kvd = cfg.kv_dim(), qd = int64_t(heads) * hd;
  const bool gated = cfg.attn_output_gate;
  ThreadPool* pool = c.pool;
  auto mm = [&](const QMatrix& W, const float* X, float* Y) {
    if (c.exact_rows) qmatvec_rows(W, X, n, Y, pool);
    else qmatmul(W, X, n, Y, pool);
  };
  std::vector<float> qg(static_cast<size_t>(n * qrows)), q(static_cast<size_t>(n * qd)),
      gate(gated ? static_cast<size_t>(n * qd) : 0), att(static_cast<size_t>(n * qd));
  reserve_kv(c, cache, pos0 + n);
  float* K = cache.k.data();
  float* Vc = cache.v.data();
  mm(a.q_proj, y, qg.data());
  mm(a.k_proj, y, K + pos0 * kvd);
  mm(a.v_proj, y, Vc + pos0 * kvd);
  for (int64_t t = 0; t < n; ++t)
    attention_qk_token(c, a, qg.data() + t * qrows, pos0 + t, q.data() + t * qd, gated ? gate.data() + t * qd : nullptr,
                       K + (pos0 + t) * kvd, Vc + (pos0 + t) * kvd);
  // Each token attends to the cache up to and including itself; tokens are independent.
  parallel_for(pool, n, [&](int64_t t0, int64_t t1) {
    std::vector<float> scores(static_cast<size_t>(pos0 + n));
    for (int64_t t = t0; t < t1; ++t)
      gated_attention_token(q.data() + t * qd, gated ? gate.data() + t * qd : nullptr, K, Vc, pos0 + t + 1, heads, kvh,
                            hd, att.data() + t * qd, scores.data());
  });
  mm(a.o_proj, att.data(), out);
}

}  // namespace lilac::cpu
