#include "cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "core/bf16.h"
#include "core/error.h"
#include "model/quant.h"

namespace lilac::cpu {

// ---------------------------------------------------------------- quantized matrices

namespace {

// Outputs of y = W x without materialising the row: y_r = Σ_g scale_g (Σ_j q_j x_j) + bias_g Σ_j x_j,
// with the per-group sums of x precomputed in xsum. xt is x permuted within each group so that the
// element at bit slot i of word w sits at xt[g * group + i * words_per_group + w]: the inner loop then
// shifts every word of a group by the same constant (vectorises without per-lane shifts).
// NT inputs at once (xt[t], xsum[t] -> y[t]): each unpacked weight is applied to all of them, and every
// input goes through exactly the operations of NT == 1 (qmatvec), in the same order, so a row's result
// does not depend on the other inputs (the batched decode step relies on it).
template <int BITS, int NT>
void qdot_row_bits(const QMatrix& W, int64_t r, const float* const* xt, const float* const* xsum, float* y) {
  constexpr int per_word = 32 / BITS;
  constexpr uint32_t mask = (1u << BITS) - 1u;
  const uint32_t* q = W.qweight + r * W.words_per_row();
  const uint16_t* sc = W.scales + r * W.groups_per_row();
  const uint16_t* bi = W.biases + r * W.groups_per_row();
  const int64_t words_per_group = W.group_size / per_word;
  float yy[NT] = {};
  if (words_per_group == 64 / per_word) {  // the usual group of 64: fixed trip counts
    constexpr int WPG = 64 / per_word;
    for (int64_t g = 0; g < W.groups_per_row(); ++g) {
      const uint32_t* qg = q + g * WPG;
      float acc[NT][WPG] = {};
      for (int i = 0; i < per_word; ++i)
        for (int w = 0; w < WPG; ++w) {
          const float qv = float((qg[w] >> (i * BITS)) & mask);
          for (int t = 0; t < NT; ++t) acc[t][w] += qv * xt[t][g * 64 + i * WPG + w];
        }
      for (int t = 0; t < NT; ++t) {
        float a = 0.f;
        for (int w = 0; w < WPG; ++w) a += acc[t][w];
        yy[t] += bf16_to_f32(sc[g]) * a + bf16_to_f32(bi[g]) * xsum[t][g];
      }
    }
  } else {
    for (int64_t g = 0; g < W.groups_per_row(); ++g) {
      const uint32_t* qg = q + g * words_per_group;
      float a[NT] = {};
      for (int i = 0; i < per_word; ++i)
        for (int64_t w = 0; w < words_per_group; ++w) {
          const float qv = float((qg[w] >> (i * BITS)) & mask);
          for (int t = 0; t < NT; ++t) a[t] += qv * xt[t][g * W.group_size + i * words_per_group + w];
        }
      for (int t = 0; t < NT; ++t) yy[t] += bf16_to_f32(sc[g]) * a[t] + bf16_to_f32(bi[g]) * xsum[t][g];
    }
  }
  for (int t = 0; t < NT; ++t) y[t] = yy[t];
}

// Row r against n inputs, four at a time.
template <int BITS>
void qdot_row_n(const QMatrix& W, int64_t r, int64_t n, const float* const* xt, const float* const* xsum, float* y) {
  int64_t t = 0;
  for (; t + 4 <= n; t += 4) qdot_row_bits<BITS, 4>(W, r, xt + t, xsum + t, y + t);
  for (; t + 2 <= n; t += 2) qdot_row_bits<BITS, 2>(W, r, xt + t, xsum + t, y + t);
  for (; t < n; ++t) qdot_row_bits<BITS, 1>(W, r, xt + t, xsum + t, y + t);
}

}  // namespace

namespace {

bool has_qdot(const QMatrix& W) { return W.quantized() && (W.bits == 4 || W.bits == 8); }

// The input as qdot_row_bits reads it: xt (x permuted within each group) and xsum (per-group sums).
void qdot_input(const QMatrix& W, const float* x, float* xt, float* xsum) {
  const int64_t G = W.groups_per_row(), gs = W.group_size;
  const int per_word = 32 / W.bits;
  const int64_t wpg = gs / per_word;
  for (int64_t g = 0; g < G; ++g) {
    float s = 0.f;
    for (int64_t j = 0; j < gs; ++j) s += x[g * gs + j];
    xsum[g] = s;
    for (int64_t w = 0; w < wpg; ++w)
      for (int i = 0; i < per_word; ++i) xt[g * gs + i * wpg + w] = x[g * gs + w * per_word + i];
  }
}

}  // namespace

void qmatvec(const QMatrix& W, const float* x, float* y, ThreadPool* pool) {
  if (!has_qdot(W)) return qmatmul(W, x, 1, y, pool);
  qmatvec_rows(W, x, 1, y, pool);
}

void qmatvec_rows(const QMatrix& W, const float* X, int64_t n, float* Y, ThreadPool* pool) {
  // Without the qdot form qmatmul computes every row on its own already (dequantized row · input).
  if (!has_qdot(W)) return qmatmul(W, X, n, Y, pool);
  const int64_t G = W.groups_per_row(), cols = W.cols, rows = W.rows;
  std::vector<float> xsum(static_cast<size_t>(n * G)), xt(static_cast<size_t>(n * cols));
  std::vector<const float*> xtp(static_cast<size_t>(n)), xsp(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) {
    qdot_input(W, X + t * cols, xt.data() + t * cols, xsum.data() + t * G);
    xtp[size_t(t)] = xt.data() + t * cols;
    xsp[size_t(t)] = xsum.data() + t * G;
  }
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, cols * n));
  parallel_for(pool, rows, [&](int64_t r0, int64_t r1) {
    std::vector<float> yr(static_cast<size_t>(n));
    for (int64_t r = r0; r < r1; ++r) {
      if (W.bits == 4)
        qdot_row_n<4>(W, r, n, xtp.data(), xsp.data(), yr.data());
      else
        qdot_row_n<8>(W, r, n, xtp.data(), xsp.data(), yr.data());
      for (int64_t t = 0; t < n; ++t) Y[t * rows + r] = yr[size_t(t)];
    }
  }, grain);
}

void qmatmul(const QMatrix& W, const float* X, int64_t n, float* Y, ThreadPool* pool) {
  if (n == 1 && has_qdot(W)) return qmatvec(W, X, Y, pool);
  const int64_t rows = W.rows, cols = W.cols;
  // Grain: enough rows per range that a range is worth a task (~64k multiply-adds).
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, cols * n));
  parallel_for(pool, rows, [&](int64_t r0, int64_t r1) {
    std::vector<float> row(static_cast<size_t>(cols));
    for (int64_t r = r0; r < r1; ++r) {
      const float* w = W.quantized() ? row.data() : W.dense + r * cols;
      if (W.quantized()) dequantize_row(W, r, row.data());
      for (int64_t t = 0; t < n; ++t) Y[t * rows + r] = dot(w, X + t * cols, cols);
    }
  }, grain);
}

void embed_row(const QMatrix& embed, int32_t token, float* out) {
  if (token < 0 || token >= embed.rows)
    throw InputError("token id " + std::to_string(token) + " is outside the vocabulary [0, " +
                     std::to_string(embed.rows) + ")");
  dequantize_row(embed, token, out);
}

// ---------------------------------------------------------------- small vector ops

float dot(const float* a, const float* b, int64_t n) {
  // Eight independent partial sums: the compiler vectorises this without -ffast-math.
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) acc[k] += a[i + k] * b[i + k];
  float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

float sigmoid(float x) { return 1.f / (1.f + std::exp(-x)); }

float softplus(float x) { return x > 20.f ? x : std::log1p(std::exp(x)); }

void rmsnorm(const float* x, const float* w, int64_t n, float eps, float* out) {
  double ss = 0;  // the sum is tiny next to the matmuls; double keeps it order-independent
  for (int64_t i = 0; i < n; ++i) ss += double(x[i]) * x[i];
  const float inv = float(1.0 / std::sqrt(ss / double(n) + double(eps)));
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * inv * w[i];
}

void rmsnorm_zero_centred(const float* x, const float* w_raw, int64_t n, float eps, float* out) {
  std::vector<float> w(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) w[i] = 1.f + w_raw[i];
  rmsnorm(x, w.data(), n, eps, out);
}

void softmax(float* x, int64_t n) {
  if (n <= 0) return;
  float mx = x[0];
  for (int64_t i = 1; i < n; ++i) mx = std::max(mx, x[i]);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  const float inv = float(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

// ---------------------------------------------------------------- gated attention

void rope_with(float* x, int rotary_dim, int64_t pos, const float* inv_freq) {
  const int half = rotary_dim / 2;
  for (int i = 0; i < half; ++i) {
    const float ang = float(pos) * inv_freq[i];  // fp32 angle, as the oracle
    const float c = float(std::cos(double(ang))), s = float(std::sin(double(ang)));
    const float a = x[i], b = x[i + half];
    x[i] = a * c - b * s;
    x[i + half] = b * c + a * s;
  }
}

void rope(float* x, int rotary_dim, int64_t pos, double theta) {
  const std::vector<float> f = rope_inv_freq(rotary_dim, theta);
  rope_with(x, rotary_dim, pos, f.data());
}

void split_query_gate(const float* qg, int heads, int head_dim, float* q, float* gate) {
  for (int h = 0; h < heads; ++h) {
    std::memcpy(q + int64_t(h) * head_dim, qg + int64_t(h) * 2 * head_dim, static_cast<size_t>(head_dim) * sizeof(float));
    std::memcpy(gate + int64_t(h) * head_dim, qg + int64_t(h) * 2 * head_dim + head_dim,
                static_cast<size_t>(head_dim) * sizeof(float));
  }
}

void attention_head(const float* q, const float* K, const float* V, int64_t n_ctx, int64_t kv_stride,
                    int head_dim, float scale, float* out, float* scores) {
  for (int64_t j = 0; j < n_ctx; ++j) scores[j] = dot(q, K + j * kv_stride, head_dim) * scale;
  softmax(scores, n_ctx);
  std::fill(out, out + head_dim, 0.f);
  for (int64_t j = 0; j < n_ctx; ++j) {
    const float p = scores[j];
    const float* v = V + j * kv_stride;
    for (int d = 0; d < head_dim; ++d) out[d] += p * v[d];
  }
}

void gated_attention_token(const float* q, const float* gate, const float* K_cache, const float* V_cache,
                           int64_t n_ctx, int heads, int kv_heads, int head_dim, float* out, float* scores) {
  const int group = heads / kv_heads;
  const int64_t kv_stride = int64_t(kv_heads) * head_dim;
  const float scale = 1.f / std::sqrt(float(head_dim));
  for (int h = 0; h < heads; ++h) {
    const int kvh = h / group;
    float* o = out + int64_t(h) * head_dim;
    attention_head(q + int64_t(h) * head_dim, K_cache + int64_t(kvh) * head_dim, V_cache + int64_t(kvh) * head_dim,
                   n_ctx, kv_stride, head_dim, scale, o, scores);
    if (!gate) continue;
    const float* gt = gate + int64_t(h) * head_dim;
    for (int d = 0; d < head_dim; ++d) o[d] *= sigmoid(gt[d]);
  }
}

// ---------------------------------------------------------------- Gated DeltaNet

void conv1d_silu_step(const float* w, int64_t C, int K, float* state, const float* x, float* y) {
  const int S = K - 1;
  for (int64_t c = 0; c < C; ++c) {
    const float* wc = w + c * K;
    float* st = state + c * S;
    const float xc = x[c];
    float acc = 0.f;
    for (int k = 0; k < S; ++k) acc += wc[k] * st[k];
    acc += wc[S] * xc;
    for (int k = 0; k + 1 < S; ++k) st[k] = st[k + 1];
    if (S > 0) st[S - 1] = xc;
    y[c] = silu(acc);
  }
}

void l2norm(float* x, int64_t n, float eps) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += double(x[i]) * x[i];
  const float inv = float(1.0 / std::sqrt(ss + double(eps)));
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void gdn_gates(const float* b, const float* a, const float* A_log, const float* dt_bias, int Hv, float* beta,
               float* g) {
  for (int h = 0; h < Hv; ++h) {
    beta[h] = sigmoid(b[h]);
    g[h] = -std::exp(A_log[h]) * softplus(a[h] + dt_bias[h]);
  }
}

void gdn_recurrent_step(float* S, const float* q, const float* k, const float* v, float g, float beta, int dk,
                        int dv, float* o) {
  const float decay = std::exp(g);
  std::vector<float> u(static_cast<size_t>(dv), 0.f);
  for (int i = 0; i < dk; ++i) {
    float* Si = S + int64_t(i) * dv;
    const float ki = k[i];
    for (int j = 0; j < dv; ++j) {
      Si[j] *= decay;
      u[j] += Si[j] * ki;
    }
  }
  for (int j = 0; j < dv; ++j) u[j] = beta * (v[j] - u[j]);  // now the delta
  std::fill(o, o + dv, 0.f);
  for (int i = 0; i < dk; ++i) {
    float* Si = S + int64_t(i) * dv;
    const float ki = k[i], qi = q[i];
    for (int j = 0; j < dv; ++j) {
      Si[j] += ki * u[j];
      o[j] += Si[j] * qi;
    }
  }
}

void gdn_chunked(float* S, const float* q, int64_t q_stride, const float* k, int64_t k_stride, const float* v,
                 int64_t v_stride, const float* g, const float* beta, int64_t T, int dk, int dv, float* o,
                 int64_t o_stride, int chunk) {
  const int C = chunk;
  std::vector<float> kb(static_cast<size_t>(C) * dk), gc(static_cast<size_t>(C)), A(static_cast<size_t>(C) * C), W(static_cast<size_t>(C) * dk), U(static_cast<size_t>(C) * dv),
      Vn(static_cast<size_t>(C) * dv), tmp(static_cast<size_t>(std::max(dk, dv))), row(static_cast<size_t>(C));
  for (int64_t t0 = 0; t0 < T; t0 += C) {
    const int c = int(std::min<int64_t>(C, T - t0));
    auto Q = [&](int i) { return q + (t0 + i) * q_stride; };
    auto Kr = [&](int i) { return k + (t0 + i) * k_stride; };
    auto Vr = [&](int i) { return v + (t0 + i) * v_stride; };
    // Cumulative log-decay within the chunk, and β-scaled keys.
    float acc = 0.f;
    for (int i = 0; i < c; ++i) {
      acc += g[t0 + i];
      gc[i] = acc;
      const float b = beta[t0 + i];
      for (int d = 0; d < dk; ++d) kb[static_cast<size_t>(i) * dk + d] = Kr(i)[d] * b;
    }
    // A[i][j] = −(β_i k_i · k_j) e^{gc_i − gc_j} for j < i; then the UT transform
    // T = (I − A_strict)^{-1} row by row: T[i][j] = A[i][j] + Σ_{j<m<i} A[i][m] T[m][j].
    std::fill(A.begin(), A.end(), 0.f);
    for (int i = 0; i < c; ++i)
      for (int j = 0; j < i; ++j)
        A[static_cast<size_t>(i) * C + j] = -dot(kb.data() + static_cast<size_t>(i) * dk, Kr(j), dk) * std::exp(gc[i] - gc[j]);
    for (int i = 1; i < c; ++i) {
      for (int j = 0; j < i; ++j) row[j] = A[static_cast<size_t>(i) * C + j];
      for (int j = 0; j < i; ++j) {
        float s = row[j];
        for (int m = j + 1; m < i; ++m) s += row[m] * A[static_cast<size_t>(m) * C + j];
        A[static_cast<size_t>(i) * C + j] = s;
      }
    }
    for (int i = 0; i < c; ++i) A[static_cast<size_t>(i) * C + i] = 1.f;
    // U = T (β v), W = T (β k e^{gc}).
    for (int i = 0; i < c; ++i) {
      float* Ui = U.data() + static_cast<size_t>(i) * dv;
      float* Wi = W.data() + static_cast<size_t>(i) * dk;
      std::fill(Ui, Ui + dv, 0.f);
      std::fill(Wi, Wi + dk, 0.f);
      for (int j = 0; j <= i; ++j) {
        const float a = A[static_cast<size_t>(i) * C + j];
        if (a == 0.f) continue;
        const float bj = beta[t0 + j] * a;
        const float* vj = Vr(j);
        for (int d = 0; d < dv; ++d) Ui[d] += bj * vj[d];
        const float ej = a * std::exp(gc[j]);
        const float* kbj = kb.data() + static_cast<size_t>(j) * dk;
        for (int d = 0; d < dk; ++d) Wi[d] += ej * kbj[d];
      }
    }
    // New values: Vn_i = U_i − W_i S (S before this chunk).
    for (int i = 0; i < c; ++i) {
      float* vn = Vn.data() + static_cast<size_t>(i) * dv;
      std::memcpy(vn, U.data() + static_cast<size_t>(i) * dv, static_cast<size_t>(dv) * sizeof(float));
      const float* Wi = W.data() + static_cast<size_t>(i) * dk;
      for (int d = 0; d < dk; ++d) {
        const float w = Wi[d];
        const float* Sd = S + static_cast<size_t>(d) * dv;
        for (int e = 0; e < dv; ++e) vn[e] -= w * Sd[e];
      }
    }
    // Output: o_i = e^{gc_i} q_i S + Σ_{j≤i} (q_i·k_j) e^{gc_i − gc_j} Vn_j.
    for (int i = 0; i < c; ++i) {
      float* oi = o + (t0 + i) * o_stride;
      const float* qi = Q(i);
      std::fill(oi, oi + dv, 0.f);
      for (int d = 0; d < dk; ++d) {
        const float w = qi[d];
        const float* Sd = S + static_cast<size_t>(d) * dv;
        for (int e = 0; e < dv; ++e) oi[e] += w * Sd[e];
      }
      const float ei = std::exp(gc[i]);
      for (int e = 0; e < dv; ++e) oi[e] *= ei;
      for (int j = 0; j <= i; ++j) {
        const float a = dot(qi, Kr(j), dk) * std::exp(gc[i] - gc[j]);
        const float* vn = Vn.data() + static_cast<size_t>(j) * dv;
        for (int e = 0; e < dv; ++e) oi[e] += a * vn[e];
      }
    }
    // State: S ← e^{gc_last} S + Σ_j e^{gc_last − gc_j} k_j Vn_jᵀ.
    const float glast = gc[c - 1];
    const float el = std::exp(glast);
    for (int d = 0; d < dk; ++d) {
      float* Sd = S + static_cast<size_t>(d) * dv;
      for (int e = 0; e < dv; ++e) Sd[e] *= el;
    }
    for (int j = 0; j < c; ++j) {
      const float f = std::exp(glast - gc[j]);
      const float* kj = Kr(j);
      const float* vn = Vn.data() + static_cast<size_t>(j) * dv;
      for (int d = 0; d < dk; ++d) {
        const float w = kj[d] * f;
        float* Sd = S + static_cast<size_t>(d) * dv;
        for (int e = 0; e < dv; ++e) Sd[e] += w * vn[e];
      }
    }
  }
}

void gated_rmsnorm(const float* o, const float* z, const float* w, int dv, float eps, float* out) {
  rmsnorm(o, w, dv, eps, out);
  for (int i = 0; i < dv; ++i) out[i] *= silu(z[i]);
}

// ---------------------------------------------------------------- MoE

void moe_route(const float* router_logits, int n_experts, int k, bool renormalise, int* ids, float* weights) {
  std::vector<float> p(router_logits, router_logits + n_experts);
  softmax(p.data(), n_experts);
  std::vector<int> order(static_cast<size_t>(n_experts));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](int a, int b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
  float sum = 0.f;
  for (int i = 0; i < k; ++i) sum += p[order[i]];
  for (int i = 0; i < k; ++i) {
    ids[i] = order[i];
    weights[i] = renormalise ? p[order[i]] / sum : p[order[i]];
  }
}

void swiglu(const QMatrix& gate, const QMatrix& up, const QMatrix& down, const float* X, int64_t n, float* Y,
            float* hidden, ThreadPool* pool, bool rowwise) {
  const auto mm = rowwise ? qmatvec_rows : qmatmul;
  const int64_t I = gate.rows;
  float* G = hidden;
  float* Uu = hidden + n * I;
  mm(gate, X, n, G, pool);
  mm(up, X, n, Uu, pool);
  for (int64_t i = 0; i < n * I; ++i) G[i] = silu(G[i]) * Uu[i];
  mm(down, G, n, Y, pool);
}

void moe_forward(const MoEWeights& w, const ModelConfig& cfg, const float* X, int64_t n, float* Y,
                 ThreadPool* pool, bool rowwise) {
  const auto mm = rowwise ? qmatvec_rows : qmatmul;
  const int64_t H = cfg.hidden_size;
  const int E = cfg.num_experts, k = cfg.num_experts_per_tok;
  const int64_t I = cfg.moe_intermediate_size, Is = cfg.shared_expert_intermediate_size;
  // Routing.
  std::vector<float> logits(static_cast<size_t>(n) * E);
  mm(w.router, X, n, logits.data(), pool);
  std::vector<int> ids(static_cast<size_t>(n) * k);
  std::vector<float> wts(static_cast<size_t>(n) * k);
  for (int64_t t = 0; t < n; ++t)
    moe_route(logits.data() + t * E, E, k, cfg.norm_topk_prob, ids.data() + t * k, wts.data() + t * k);
  // Shared expert, gated by sigmoid(shared_expert_gate · x).
  std::vector<float> hidden(static_cast<size_t>(2 * n * std::max(I, Is))), out(static_cast<size_t>(n * H));
  swiglu(w.shared_gate, w.shared_up, w.shared_down, X, n, Y, hidden.data(), pool, rowwise);
  std::vector<float> sg(static_cast<size_t>(n));
  mm(w.shared_expert_gate, X, n, sg.data(), pool);
  for (int64_t t = 0; t < n; ++t) {
    const float s = sigmoid(sg[t]);
    for (int64_t d = 0; d < H; ++d) Y[t * H + d] *= s;
  }
  // Routed experts: group tokens by expert, one batched SwiGLU per expert in use.
  std::vector<std::vector<std::pair<int64_t, float>>> by_expert(static_cast<size_t>(E));
  for (int64_t t = 0; t < n; ++t)
    for (int i = 0; i < k; ++i) by_expert[ids[t * k + i]].push_back({t, wts[t * k + i]});
  std::vector<float> xe(static_cast<size_t>(n * H));
  for (int e = 0; e < E; ++e) {
    const auto& toks = by_expert[e];
    if (toks.empty()) continue;
    const int64_t m = int64_t(toks.size());
    for (int64_t i = 0; i < m; ++i) std::memcpy(xe.data() + i * H, X + toks[i].first * H, static_cast<size_t>(H) * sizeof(float));
    swiglu(w.gate.expert(e), w.up.expert(e), w.down.expert(e), xe.data(), m, out.data(), hidden.data(), pool,
           rowwise);
    for (int64_t i = 0; i < m; ++i) {
      float* y = Y + toks[i].first * H;
      const float* oe = out.data() + i * H;
      const float wt = toks[i].second;
      for (int64_t d = 0; d < H; ++d) y[d] += wt * oe[d];
    }
  }
}

}  // namespace lilac::cpu
