#include "cpu/attention.h"

#include <algorithm>
#include <cstring>

#include "core/bf16.h"
#include "cpu/ops.h"

namespace lilac::cpu {

void attention_rows(const AttentionCall& c, const AttentionWeights& a, KvCache& cache, int64_t pos0, const float* y,
                    int64_t n, float* out) {
  const ModelConfig& cfg = c.cfg;
  const int heads = cfg.num_heads, kvh = cfg.num_kv_heads, hd = cfg.head_dim;
  const int64_t qrows = cfg.q_proj_rows(), kvd = cfg.kv_dim(), qd = int64_t(heads) * hd;
  const bool gated = cfg.attn_output_gate;
  const float eps = float(cfg.rms_norm_eps);
  ThreadPool* pool = c.pool;
  auto mm = [&](const QMatrix& W, const float* X, float* Y) {
    if (c.exact_rows) qmatvec_rows(W, X, n, Y, pool);
    else qmatmul(W, X, n, Y, pool);
  };
  std::vector<float> qg(static_cast<size_t>(n * qrows)), q(static_cast<size_t>(n * qd)),
      gate(gated ? static_cast<size_t>(n * qd) : 0), att(static_cast<size_t>(n * qd));
  if (int64_t(cache.k.size()) < (pos0 + n) * kvd) {
    const size_t cap = static_cast<size_t>(std::min(c.max_len, std::max(pos0 + n, 2 * pos0)) * kvd);
    cache.k.resize(cap);
    cache.v.resize(cap);
  }
  float* K = cache.k.data();
  float* Vc = cache.v.data();
  mm(a.q_proj, y, qg.data());
  mm(a.k_proj, y, K + pos0 * kvd);
  mm(a.v_proj, y, Vc + pos0 * kvd);
  for (int64_t t = 0; t < n; ++t) {
    const int64_t pos = pos0 + t;
    float* qt = q.data() + t * qd;
    if (gated)
      split_query_gate(qg.data() + t * qrows, heads, hd, qt, gate.data() + t * qd);
    else
      std::memcpy(qt, qg.data() + t * qrows, static_cast<size_t>(qd) * sizeof(float));
    for (int h = 0; h < heads; ++h) {
      float* qh = qt + int64_t(h) * hd;
      rmsnorm(qh, a.q_norm.data(), hd, eps, qh);
      rope_with(qh, cfg.rotary_dim, pos, c.inv_freq);
    }
    float* kt = K + pos * kvd;
    for (int h = 0; h < kvh; ++h) {
      float* kh = kt + int64_t(h) * hd;
      rmsnorm(kh, a.k_norm.data(), hd, eps, kh);
      rope_with(kh, cfg.rotary_dim, pos, c.inv_freq);
    }
    if (c.kv_bf16) {
      float* vt = Vc + pos * kvd;
      for (int64_t i = 0; i < kvd; ++i) {
        kt[i] = bf16_to_f32(f32_to_bf16(kt[i]));
        vt[i] = bf16_to_f32(f32_to_bf16(vt[i]));
      }
    }
  }
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
