// The CPU backend: the model's forward pass written with the reference ops, one function per block.
#include "cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <thread>

#include "core/bf16.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "cpu/attention.h"
#include "cpu/gdn_undo.h"
#include "cpu/mtp.h"
#include "cpu/ops.h"
#include "cpu/sampling_state.h"
#include "engine/sampler.h"
#include "engine/validate.h"

namespace lilac::cpu {

namespace {

class CpuBackend;
class CpuSessionImpl;

constexpr int kMaxBatch = 64;  // rows of one batched decode step (larger batches are split)

// Per-layer state of one session: attention k / v [len, kv_dim] each (KvCache, grows with the context),
// or Gated DeltaNet S [Hv, dk, dv] and conv [conv_dim, K-1].
struct LayerState : KvCache {
  std::vector<float> S, conv;
};

class CpuSnapshot : public SessionSnapshot {
 public:
  const void* owner = nullptr;  // the ModelWeights the state belongs to
  int64_t len = 0;
  std::vector<LayerState> layers;
  std::vector<float> logits;  // current logits at the time (empty when len == 0)
  MtpData mtp;                // the MTP head's cache when the session was drafting
  int64_t length() const override { return len; }
  size_t bytes() const override {
    size_t b = logits.size() * sizeof(float) + mtp.bytes();
    for (const auto& l : layers) b += (l.k.size() + l.v.size() + l.S.size() + l.conv.size()) * sizeof(float);
    return b;
  }
};

class CpuBackend : public Backend {
 public:
  CpuBackend(std::shared_ptr<const ModelWeights> w, int threads)
      : w_(std::move(w)), pool_(threads), inv_freq_(rope_inv_freq(w_->config.rotary_dim, w_->config.rope_theta)) {
    const ModelConfig& c = w_->config;
    LILAC_CHECK(int(w_->layers.size()) == c.num_layers, "cpu backend: weights have " +
                                                            std::to_string(w_->layers.size()) + " layers, config " +
                                                            std::to_string(c.num_layers));
    LILAC_CHECK(c.num_kv_heads > 0 && c.num_heads % c.num_kv_heads == 0,
                "cpu backend: num_attention_heads must be a multiple of num_key_value_heads");
    LILAC_CHECK(c.linear_num_key_heads > 0 && c.linear_num_value_heads % c.linear_num_key_heads == 0,
                "cpu backend: linear_num_value_heads must be a multiple of linear_num_key_heads");
    LILAC_CHECK(int64_t(c.full_attention.size()) == c.num_layers, "cpu backend: config has no layer types");
  }
  std::string name() const override { return "cpu-ref"; }
  const ModelConfig& config() const override { return w_->config; }
  std::string describe() const override { return "cpu-ref (fp32 reference), " + std::to_string(pool_.size()) + " threads"; }
  std::unique_ptr<Session> new_session(int64_t max_length) override;
  std::vector<TokenChoice> decode_batch(std::span<Session* const> sessions) override;
  int max_batch() const override { return kMaxBatch; }
  bool supports_logit_bias() const override { return true; }
  size_t session_bytes(int64_t max_length) const override {
    const ModelConfig& c = w_->config;
    if (max_length <= 0) max_length = c.max_position_embeddings;
    size_t per_layer_attn = size_t(2) * size_t(max_length) * size_t(c.kv_dim());
    size_t per_layer_gdn = size_t(c.linear_num_value_heads) * c.linear_key_head_dim * c.linear_value_head_dim +
                           size_t(c.gdn_conv_dim()) * size_t(c.linear_conv_kernel_dim - 1);
    size_t floats = size_t(c.vocab_size);  // current logits
    for (bool full : c.full_attention) floats += full ? per_layer_attn : per_layer_gdn;
    return floats * sizeof(float);
  }
  // The K/V cache grows with the context (RAM is not reserved up front): a few sessions by default,
  // fewer when half the available RAM would not hold them at full length.
  int default_sessions(int64_t max_length) const override { return default_cpu_sessions(session_bytes(max_length)); }

  const ModelWeights& weights() const { return *w_; }
  ThreadPool* pool() { return &pool_; }
  const float* inv_freq() const { return inv_freq_.data(); }

 private:
  std::shared_ptr<const ModelWeights> w_;
  ThreadPool pool_;
  std::vector<float> inv_freq_;
};

class CpuSessionImpl : public CpuSession {
 public:
  CpuSessionImpl(CpuBackend& be, int64_t max_length)
      : be_(be), w_(be.weights()), cfg_(w_.config), max_len_(max_length), sampling_(cfg_.vocab_size) {
    if (w_.has_mtp()) mtp_ = std::make_unique<MtpHead>(w_, be.pool(), be.inv_freq(), max_length);
    undo_.resize(static_cast<size_t>(cfg_.num_layers));
    reset();
  }

  int64_t length() const override { return len_; }
  int64_t max_length() const override { return max_len_; }
  int64_t vocab_size() const override { return cfg_.vocab_size; }
  void set_activation_tap(ActivationTap tap) override { tap_ = std::move(tap); }
  void set_prefill_chunk(int64_t tokens) override { chunk_ = std::max<int64_t>(1, tokens); }
  void set_kv_bf16(bool on) override {
    kv_bf16_ = on;
    if (mtp_) mtp_->set_kv_bf16(on);
  }

  void prefill(std::span<const int32_t> tokens, const LogitsSink* sink) override {
    check_tokens(tokens);
    const int64_t n = int64_t(tokens.size());
    for (int64_t b = 0; b < n; b += chunk_) {
      const int64_t m = std::min(chunk_, n - b);
      forward(tokens.subspan(static_cast<size_t>(b), static_cast<size_t>(m)), sink, b + m == n);
    }
  }

  void begin_generation(const SamplingParams& params, std::span<const int32_t> context) override {
    sampling_.begin(params, context);
  }

  TokenChoice sample() override {
    TokenChoice c = sampling_.sample();
    next_token_ = c.token;
    return c;
  }

  void set_token_mask(const uint32_t* bits) override { sampling_.set_mask(bits); }

  void advance() override {
    if (next_token_ < 0) throw Error("cpu session: advance() without a sampled token");
    const int32_t t = next_token_;
    next_token_ = -1;
    prefill(std::span<const int32_t>(&t, 1), nullptr);
  }

  std::vector<float> logits() override { return sampling_.logits(); }

  // ---- speculative decoding (MODEL_MTP.md; the head's state: src/cpu/mtp.h)
  bool can_draft() const override { return mtp_ != nullptr; }
  void enable_drafting(bool on) override {
    if (!mtp_ || on == drafting_) return;
    drafting_ = on;
    if (on && len_ == 0) mtp_->reset(true);
    else mtp_->invalidate();  // enabled on a context it did not follow: no drafts until reset()
  }
  void set_draft_logits_sink(LogitsSink sink) override {
    if (mtp_) mtp_->set_sink(std::move(sink));
  }
  void set_draft_vocab(int64_t n) override {
    if (mtp_) mtp_->set_draft_vocab(n);
  }
  std::vector<int32_t> draft(int k) override {
    if (!mtp_ || !drafting_ || next_token_ < 0) return {};
    k = int(std::min<int64_t>(k, max_len_ - len_ - 1));  // verify feeds k + 1 rows
    if (k <= 0) return {};
    return mtp_->draft(next_token_, len_, k);
  }
  std::vector<TokenChoice> verify(std::span<const int32_t> drafts) override;

  std::shared_ptr<const SessionSnapshot> snapshot() override {
    auto s = std::make_shared<CpuSnapshot>();
    s->owner = &w_;
    s->len = len_;
    s->layers.resize(layers_.size());
    const int64_t kvd = cfg_.kv_dim();
    for (size_t l = 0; l < layers_.size(); ++l) {
      const LayerState& src = layers_[l];
      LayerState& dst = s->layers[l];
      if (cfg_.full_attention[l]) {
        dst.k.assign(src.k.begin(), src.k.begin() + len_ * kvd);
        dst.v.assign(src.v.begin(), src.v.begin() + len_ * kvd);
      } else {
        dst.S = src.S;
        dst.conv = src.conv;
      }
    }
    s->logits = sampling_.saved_logits();
    if (following_mtp()) s->mtp = mtp_->snapshot();
    return s;
  }

  void restore(const SessionSnapshot& snap) override {
    const auto* s = dynamic_cast<const CpuSnapshot*>(&snap);
    if (!s || s->owner != &w_) throw Error("cpu session: snapshot is from another backend or model");
    if (s->len > max_len_)
      throw InputError("cpu session: snapshot length " + std::to_string(s->len) + " exceeds max_length " +
                       std::to_string(max_len_));
    const int64_t kvd = cfg_.kv_dim();
    for (size_t l = 0; l < layers_.size(); ++l) {
      LayerState& dst = layers_[l];
      const LayerState& src = s->layers[l];
      if (cfg_.full_attention[l]) {
        if (int64_t(dst.k.size()) < s->len * kvd) {
          dst.k.resize(static_cast<size_t>(s->len * kvd));
          dst.v.resize(static_cast<size_t>(s->len * kvd));
        }
        std::copy(src.k.begin(), src.k.end(), dst.k.begin());
        std::copy(src.v.begin(), src.v.end(), dst.v.begin());
      } else {
        dst.S = src.S;
        dst.conv = src.conv;
      }
    }
    len_ = s->len;
    sampling_.restore_logits(s->logits);
    next_token_ = -1;
    if (mtp_ && drafting_) mtp_->restore(s->mtp);  // a snapshot taken without drafting: no drafts
  }

  void reset() override {
    const int64_t Hv = cfg_.linear_num_value_heads, dk = cfg_.linear_key_head_dim, dv = cfg_.linear_value_head_dim;
    layers_.assign(static_cast<size_t>(cfg_.num_layers), LayerState{});
    for (int l = 0; l < cfg_.num_layers; ++l) {
      if (cfg_.full_attention[static_cast<size_t>(l)]) continue;
      layers_[static_cast<size_t>(l)].S.assign(static_cast<size_t>(Hv * dk * dv), 0.f);
      layers_[static_cast<size_t>(l)].conv.assign(static_cast<size_t>(cfg_.gdn_conv_dim() * (cfg_.linear_conv_kernel_dim - 1)), 0.f);
    }
    len_ = 0;
    sampling_.reset();
    next_token_ = -1;
    if (mtp_) mtp_->reset(drafting_);
  }

  // ---- the batched decode step (CpuBackend::decode_batch)
  CpuBackend& backend() const { return be_; }
  bool has_tap() const { return bool(tap_); }
  // Throws unless the session holds a sampled token and has room for it (before any state changes).
  void check_decodable() const {
    if (next_token_ < 0) throw Error("cpu decode_batch: a session has no sampled token to feed");
    require(check_session_capacity(len_, 1, max_len_));
  }

  // Feeds each session's pending token as one step: one product per weight matrix for the whole batch
  // (qmatvec_rows: row b is computed exactly as session b's own one-token forward computes it), the
  // attention and the Gated DeltaNet per session on its own state. Afterwards every session's logits
  // are current (bit-identical to what advance() would have left).
  static void forward_batch(CpuBackend& be, std::span<CpuSessionImpl* const> ss) {
    const ModelWeights& w = be.weights();
    const ModelConfig& cfg = w.config;
    const int64_t B = int64_t(ss.size()), H = cfg.hidden_size, V = cfg.vocab_size;
    const float eps = float(cfg.rms_norm_eps);
    ThreadPool* pool = be.pool();
    std::vector<float> x(static_cast<size_t>(B * H)), y(static_cast<size_t>(B * H)), out(static_cast<size_t>(B * H));
    std::vector<int32_t> fed(static_cast<size_t>(B));
    for (int64_t b = 0; b < B; ++b) {
      fed[size_t(b)] = ss[size_t(b)]->next_token_;
      embed_row(w.embed, fed[size_t(b)], x.data() + b * H);
      ss[size_t(b)]->next_token_ = -1;
    }
    for (int l = 0; l < cfg.num_layers; ++l) {
      const LayerWeights& lw = w.layers[static_cast<size_t>(l)];
      for (int64_t b = 0; b < B; ++b) rmsnorm(x.data() + b * H, lw.input_norm.data(), H, eps, y.data() + b * H);
      if (lw.full_attention)
        attention_batch(be, lw.attn, l, ss, y.data(), out.data());
      else
        deltanet_batch(be, lw.gdn, l, ss, y.data(), out.data());
      for (int64_t i = 0; i < B * H; ++i) x[static_cast<size_t>(i)] += out[static_cast<size_t>(i)];
      for (int64_t b = 0; b < B; ++b) rmsnorm(x.data() + b * H, lw.post_norm.data(), H, eps, y.data() + b * H);
      moe_forward(lw.moe, cfg, y.data(), B, out.data(), pool, /*rowwise=*/true);
      for (int64_t i = 0; i < B * H; ++i) x[static_cast<size_t>(i)] += out[static_cast<size_t>(i)];
    }
    for (int64_t b = 0; b < B; ++b) rmsnorm(x.data() + b * H, w.final_norm.data(), H, eps, y.data() + b * H);
    std::vector<float> lg(static_cast<size_t>(B * V));
    qmatvec_rows(w.lm_head, y.data(), B, lg.data(), pool);
    for (int64_t b = 0; b < B; ++b) {
      CpuSessionImpl& s = *ss[size_t(b)];
      std::memcpy(s.sampling_.logits_data(), lg.data() + b * V, static_cast<size_t>(V) * sizeof(float));
      // A drafting session's MTP head sees the row as after a one-token step (its hidden, after the final norm).
      if (s.following_mtp()) s.mtp_->on_rows(s.len_, std::span<const int32_t>(&fed[size_t(b)], 1), y.data() + b * H);
      s.len_ += 1;
      s.sampling_.logits_ready();
    }
  }

 private:
  bool following_mtp() const { return mtp_ && drafting_ && mtp_->valid(); }
  // A matrix product: row-exact during verification (every row as a one-token step computes it).
  void mm(const QMatrix& W, const float* X, int64_t n, float* Y) {
    if (exact_rows_) qmatvec_rows(W, X, n, Y, be_.pool());
    else qmatmul(W, X, n, Y, be_.pool());
  }

  static void attention_batch(CpuBackend& be, const AttentionWeights& a, int l, std::span<CpuSessionImpl* const> ss,
                              const float* y, float* out) {
    const ModelConfig& cfg = be.weights().config;
    const int heads = cfg.num_heads, kvh = cfg.num_kv_heads, hd = cfg.head_dim;
    const int64_t B = int64_t(ss.size()), qrows = cfg.q_proj_rows(), kvd = cfg.kv_dim(), qd = int64_t(heads) * hd;
    const bool gated = cfg.attn_output_gate;
    ThreadPool* pool = be.pool();
    std::vector<float> qg(static_cast<size_t>(B * qrows)), kb(static_cast<size_t>(B * kvd)),
        vb(static_cast<size_t>(B * kvd)), q(static_cast<size_t>(B * qd)), gate(gated ? static_cast<size_t>(B * qd) : 0),
        att(static_cast<size_t>(B * qd));
    qmatvec_rows(a.q_proj, y, B, qg.data(), pool);
    qmatvec_rows(a.k_proj, y, B, kb.data(), pool);
    qmatvec_rows(a.v_proj, y, B, vb.data(), pool);
    parallel_for(pool, B, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        CpuSessionImpl& s = *ss[size_t(b)];
        LayerState& st = s.layers_[static_cast<size_t>(l)];
        const int64_t pos = s.len_;
        s.reserve_kv(st, 1);
        std::memcpy(st.k.data() + pos * kvd, kb.data() + b * kvd, static_cast<size_t>(kvd) * sizeof(float));
        std::memcpy(st.v.data() + pos * kvd, vb.data() + b * kvd, static_cast<size_t>(kvd) * sizeof(float));
        float* gb = gated ? gate.data() + b * qd : nullptr;
        s.qk_token(a, qg.data() + b * qrows, pos, q.data() + b * qd, gb, st);
        std::vector<float> scores(static_cast<size_t>(pos + 1));
        gated_attention_token(q.data() + b * qd, gb, st.k.data(), st.v.data(), pos + 1, heads, kvh, hd,
                              att.data() + b * qd, scores.data());
      }
    });
    qmatvec_rows(a.o_proj, att.data(), B, out, pool);
  }

  static void deltanet_batch(CpuBackend& be, const DeltaNetWeights& g, int l, std::span<CpuSessionImpl* const> ss,
                             const float* y, float* out) {
    const ModelConfig& cfg = be.weights().config;
    const int Hk = cfg.linear_num_key_heads, Hv = cfg.linear_num_value_heads;
    const int dk = cfg.linear_key_head_dim, dv = cfg.linear_value_head_dim, ratio = Hv / Hk;
    const int64_t B = int64_t(ss.size()), C = cfg.gdn_conv_dim(), kd = cfg.gdn_key_dim(), vd = cfg.gdn_value_dim();
    const float eps = float(cfg.rms_norm_eps);
    ThreadPool* pool = be.pool();
    std::vector<float> mixed(static_cast<size_t>(B * C)), z(static_cast<size_t>(B * vd)), bb(static_cast<size_t>(B * Hv)),
        aa(static_cast<size_t>(B * Hv)), beta(static_cast<size_t>(B * Hv)), gg(static_cast<size_t>(B * Hv)),
        o(static_cast<size_t>(B * vd));
    qmatvec_rows(g.in_proj_qkv, y, B, mixed.data(), pool);
    qmatvec_rows(g.in_proj_z, y, B, z.data(), pool);
    qmatvec_rows(g.in_proj_b, y, B, bb.data(), pool);
    qmatvec_rows(g.in_proj_a, y, B, aa.data(), pool);
    for (int64_t b = 0; b < B; ++b)
      ss[size_t(b)]->gdn_token(g, ss[size_t(b)]->layers_[static_cast<size_t>(l)], mixed.data() + b * C,
                               bb.data() + b * Hv, aa.data() + b * Hv, beta.data() + b * Hv, gg.data() + b * Hv);
    parallel_for(pool, B * Hv, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t b = i / Hv, h = i % Hv, kh = h / ratio;
        const float* m = mixed.data() + b * C;
        float* S = ss[size_t(b)]->layers_[static_cast<size_t>(l)].S.data() + h * dk * dv;
        float* op = o.data() + b * vd + h * dv;
        gdn_recurrent_step(S, m + kh * dk, m + kd + kh * dk, m + 2 * kd + h * dv, gg[size_t(i)], beta[size_t(i)], dk, dv,
                           op);
        gated_rmsnorm(op, z.data() + b * vd + h * dv, g.norm.data(), dv, eps, op);
      }
    });
    qmatvec_rows(g.out_proj, o.data(), B, out, pool);
  }

  void check_tokens(std::span<const int32_t> tokens) const {
    require(check_token_ids(tokens, cfg_.vocab_size));
    require(check_session_capacity(len_, int64_t(tokens.size()), max_len_));
  }

  void tap(const char* name, int64_t n, const float* data) {
    if (tap_) tap_(name, len_, n, data);
  }

  // One chunk of tokens at positions [len_, len_ + n): all layers, then the LM head for the rows
  // that are needed (all rows for a sink, else the last row of the last chunk). With exact_rows_
  // (verification) every row is computed as a one-token step would compute it, each row's logits go to
  // row_logits_ and its hidden to row_hidden_, and the Gated DeltaNet layers record their undo data.
  void forward(std::span<const int32_t> tokens, const LogitsSink* sink, bool last_chunk) {
    const int64_t n = int64_t(tokens.size()), H = cfg_.hidden_size;
    const float eps = float(cfg_.rms_norm_eps);
    ThreadPool* pool = be_.pool();
    std::vector<float> x(static_cast<size_t>(n * H)), y(static_cast<size_t>(n * H)), out(static_cast<size_t>(n * H));
    for (int64_t t = 0; t < n; ++t) embed_row(w_.embed, tokens[static_cast<size_t>(t)], x.data() + t * H);
    tap("embed", n, x.data());
    for (int l = 0; l < cfg_.num_layers; ++l) {
      const LayerWeights& lw = w_.layers[static_cast<size_t>(l)];
      for (int64_t t = 0; t < n; ++t) rmsnorm(x.data() + t * H, lw.input_norm.data(), H, eps, y.data() + t * H);
      if (lw.full_attention)
        attention_block(lw.attn, layers_[static_cast<size_t>(l)], y.data(), n, out.data());
      else
        deltanet_block(lw.gdn, layers_[static_cast<size_t>(l)], y.data(), n, out.data(),
                       exact_rows_ ? &undo_[static_cast<size_t>(l)] : nullptr);
      for (int64_t i = 0; i < n * H; ++i) x[static_cast<size_t>(i)] += out[static_cast<size_t>(i)];
      for (int64_t t = 0; t < n; ++t) rmsnorm(x.data() + t * H, lw.post_norm.data(), H, eps, y.data() + t * H);
      moe_forward(lw.moe, cfg_, y.data(), n, out.data(), pool, /*rowwise=*/exact_rows_);
      for (int64_t i = 0; i < n * H; ++i) x[static_cast<size_t>(i)] += out[static_cast<size_t>(i)];
      if (tap_) tap(("layer." + std::to_string(l)).c_str(), n, x.data());
    }
    // Final norm + LM head on the rows that need logits (the MTP head needs every row's hidden).
    const bool mtp_rows = following_mtp() && !exact_rows_;
    const int64_t first = (sink || tap_ || exact_rows_ || mtp_rows) ? 0 : (last_chunk ? n - 1 : n);
    for (int64_t t = first; t < n; ++t) rmsnorm(x.data() + t * H, w_.final_norm.data(), H, eps, y.data() + t * H);
    if (tap_) tap("final_norm", n, y.data());
    const int64_t V = cfg_.vocab_size;
    if (exact_rows_) {
      row_logits_.resize(static_cast<size_t>(n * V));
      qmatvec_rows(w_.lm_head, y.data(), n, row_logits_.data(), pool);
      std::memcpy(sampling_.logits_data(), row_logits_.data() + (n - 1) * V, static_cast<size_t>(V) * sizeof(float));
      row_hidden_.assign(y.begin(), y.end());
    } else if (sink) {
      // Sub-chunks keep the logits buffer near 32 MiB whatever the vocabulary.
      const int64_t rows = std::clamp<int64_t>((int64_t(32) << 20) / (V * 4), 1, n);
      std::vector<float> lg(static_cast<size_t>(rows * V));
      for (int64_t b = 0; b < n; b += rows) {
        const int64_t m = std::min(rows, n - b);
        qmatmul(w_.lm_head, y.data() + b * H, m, lg.data(), pool);
        // The prompt's last row is the next choice's: the same product as without a sink (qmatvec; qmatmul over
        // several rows adds in another order), so asking for the prompt's logprobs does not change that choice.
        if (last_chunk && b + m == n) qmatvec(w_.lm_head, y.data() + (n - 1) * H, lg.data() + (m - 1) * V, pool);
        (*sink)(len_ + b, m, lg.data());
        if (b + m == n)
          std::memcpy(sampling_.logits_data(), lg.data() + (m - 1) * V, static_cast<size_t>(V) * sizeof(float));
      }
    } else if (last_chunk) {
      qmatvec(w_.lm_head, y.data() + (n - 1) * H, sampling_.logits_data(), pool);
    }
    if (mtp_rows) mtp_->on_rows(len_, tokens, y.data());
    len_ += n;
    if (last_chunk) sampling_.logits_ready();
  }

  // Room in the K/V cache for n more rows.
  void reserve_kv(LayerState& st, int64_t n) { cpu::reserve_kv(attention_call(), st, len_ + n); }

  // One token at `pos` whose k/v projections already sit in the cache row pos: q (and the gate) from
  // q_proj's row, q/k RMSNorm + RoPE, optionally the cached k/v rounded to bf16 (cpu/attention.h).
  void qk_token(const AttentionWeights& a, const float* qg_row, int64_t pos, float* q, float* gate, LayerState& st) {
    const int64_t kvd = cfg_.kv_dim();
    attention_qk_token(attention_call(), a, qg_row, pos, q, gate, st.k.data() + pos * kvd, st.v.data() + pos * kvd);
  }

  AttentionCall attention_call() const { return AttentionCall{cfg_, be_.inv_freq(), max_len_, kv_bf16_, exact_rows_, be_.pool()}; }

  // One token of the Gated DeltaNet's input side: causal conv + SiLU of the mixed row m [conv_dim]
  // (state updated), q/k L2 norms (q scaled by 1/sqrt(dk)), and the gates of the Hv value heads.
  void gdn_token(const DeltaNetWeights& g, LayerState& st, float* m, const float* b_row, const float* a_row,
                 float* beta, float* gg) const {
    const int Hk = cfg_.linear_num_key_heads, Hv = cfg_.linear_num_value_heads;
    const int dk = cfg_.linear_key_head_dim, K = cfg_.linear_conv_kernel_dim;
    const int64_t C = cfg_.gdn_conv_dim(), kd = cfg_.gdn_key_dim();
    conv1d_silu_step(g.conv1d.data(), C, K, st.conv.data(), m, m);
    const float qscale = 1.f / std::sqrt(float(dk));
    for (int h = 0; h < Hk; ++h) {
      float* qh = m + int64_t(h) * dk;
      l2norm(qh, dk);
      for (int d = 0; d < dk; ++d) qh[d] *= qscale;
      l2norm(m + kd + int64_t(h) * dk, dk);
    }
    gdn_gates(b_row, a_row, g.A_log.data(), g.dt_bias.data(), Hv, beta, gg);
  }

  // Gated attention over the chunk; appends k/v to the cache.
  void attention_block(const AttentionWeights& a, LayerState& st, const float* y, int64_t n, float* out) {
    attention_rows(attention_call(), a, st, len_, y, n, out);
  }

  // Gated DeltaNet over the chunk: conv (recurrent state of the last K-1 inputs), then the delta
  // rule per value head (chunked form for several tokens, recurrent step for one, and for every row
  // when verifying: then `undo` receives what a rollback needs, src/cpu/gdn_undo.h).
  void deltanet_block(const DeltaNetWeights& g, LayerState& st, const float* y, int64_t n, float* out,
                      GdnUndo* undo) {
    const int Hk = cfg_.linear_num_key_heads, Hv = cfg_.linear_num_value_heads;
    const int dk = cfg_.linear_key_head_dim, dv = cfg_.linear_value_head_dim;
    const int64_t C = cfg_.gdn_conv_dim(), kd = cfg_.gdn_key_dim(), vd = cfg_.gdn_value_dim();
    const float eps = float(cfg_.rms_norm_eps);
    ThreadPool* pool = be_.pool();
    std::vector<float> mixed(static_cast<size_t>(n * C)), z(static_cast<size_t>(n * vd)), b(static_cast<size_t>(n * Hv)), a(static_cast<size_t>(n * Hv));
    mm(g.in_proj_qkv, y, n, mixed.data());
    mm(g.in_proj_z, y, n, z.data());
    mm(g.in_proj_b, y, n, b.data());
    mm(g.in_proj_a, y, n, a.data());
    if (undo) {
      undo->n = n;
      undo->S = st.S;
      undo->conv = st.conv;
      undo->conv_in = mixed;
      undo->g.resize(static_cast<size_t>(n * Hv));
      undo->beta.resize(static_cast<size_t>(n * Hv));
    }
    // Gates, per head contiguous over time: beta[h * n + t], gg[h * n + t].
    std::vector<float> beta(static_cast<size_t>(n * Hv)), gg(static_cast<size_t>(n * Hv)), bt(static_cast<size_t>(Hv)), gt(static_cast<size_t>(Hv));
    for (int64_t t = 0; t < n; ++t) {
      gdn_token(g, st, mixed.data() + t * C, b.data() + t * Hv, a.data() + t * Hv, bt.data(), gt.data());
      for (int h = 0; h < Hv; ++h) {
        beta[static_cast<size_t>(h * n + t)] = bt[static_cast<size_t>(h)];
        gg[static_cast<size_t>(h * n + t)] = gt[static_cast<size_t>(h)];
      }
      if (undo) {
        std::copy(bt.begin(), bt.end(), undo->beta.begin() + t * Hv);
        std::copy(gt.begin(), gt.end(), undo->g.begin() + t * Hv);
      }
    }
    if (undo) undo->qkv = mixed;
    const bool recurrent = n == 1 || undo;
    std::vector<float> o(static_cast<size_t>(n * vd));
    const int ratio = Hv / Hk;
    parallel_for(pool, Hv, [&](int64_t h0, int64_t h1) {
      for (int64_t h = h0; h < h1; ++h) {
        const int64_t kh = h / ratio;
        const float* qp = mixed.data() + kh * dk;
        const float* kp = mixed.data() + kd + kh * dk;
        const float* vp = mixed.data() + 2 * kd + h * dv;
        float* S = st.S.data() + h * dk * dv;
        float* op = o.data() + h * dv;
        if (recurrent)
          for (int64_t t = 0; t < n; ++t)
            gdn_recurrent_step(S, qp + t * C, kp + t * C, vp + t * C, gg[static_cast<size_t>(h * n + t)],
                               beta[static_cast<size_t>(h * n + t)], dk, dv, op + t * vd);
        else
          gdn_chunked(S, qp, C, kp, C, vp, C, gg.data() + h * n, beta.data() + h * n, n, dk, dv, op, vd, 64);
        for (int64_t t = 0; t < n; ++t)
          gated_rmsnorm(op + t * vd, z.data() + t * vd + h * dv, g.norm.data(), dv, eps, op + t * vd);
      }
    });
    mm(g.out_proj, o.data(), n, out);
  }

  CpuBackend& be_;
  const ModelWeights& w_;
  const ModelConfig& cfg_;
  int64_t max_len_;
  int64_t chunk_ = 256;
  bool kv_bf16_ = false;
  int64_t len_ = 0;
  std::vector<LayerState> layers_;
  SamplingState sampling_;  // the current logits, the sampler, the next choice's mask
  int32_t next_token_ = -1;
  ActivationTap tap_;
  // Speculative decoding: the MTP head (models that have one), whether it follows the context, and the
  // verification step's row-exact mode with its per-row outputs and Gated DeltaNet undo data.
  std::unique_ptr<MtpHead> mtp_;
  bool drafting_ = false;
  bool exact_rows_ = false;
  std::vector<float> row_logits_, row_hidden_;
  std::vector<GdnUndo> undo_;
};

// Feeds the pending token and the drafts as one row-exact step, then chooses row by row with the
// session's sampler while the choice equals the next draft (greedy: the argmax; sampling: the same draw
// decode_step() would make, so a draft d is kept with probability p(d), and a rejected row's choice is a
// draw from p without d -- the rejection-sampling rule for a point-mass proposal). A row with no choice
// (engine/sampler.h) is the last kept, as the decode step that throws there: its choice carries the error.
// Rows after the last kept are undone: attention rows by length, Gated DeltaNet layers by gdn_rollback.
std::vector<TokenChoice> CpuSessionImpl::verify(std::span<const int32_t> drafts) {
  if (drafts.empty()) return {decode_step()};
  if (next_token_ < 0) throw Error("cpu session: verify() without a sampled token");
  std::vector<int32_t> rows{next_token_};
  rows.insert(rows.end(), drafts.begin(), drafts.end());
  check_tokens(rows);  // bad ids or no room: InputError, nothing changed
  const int64_t len0 = len_, n = int64_t(rows.size()), V = cfg_.vocab_size;
  next_token_ = -1;
  exact_rows_ = true;
  try {
    forward(rows, nullptr, true);
  } catch (...) {
    exact_rows_ = false;
    throw;
  }
  exact_rows_ = false;
  std::vector<TokenChoice> out;
  HostSampler& sampler = sampling_.sampler();
  for (int64_t i = 0; i < n; ++i) {
    out.push_back(choice_or_error(
        [&] { return sampler.sample(std::span<const float>(row_logits_.data() + i * V, static_cast<size_t>(V))); }));
    if (out.back().error || i + 1 == n || out.back().token != drafts[static_cast<size_t>(i)]) break;
  }
  const int64_t m = int64_t(out.size()) - 1;  // accepted drafts (rows 0..m kept)
  if (m + 1 < n) {
    for (int l = 0; l < cfg_.num_layers; ++l)
      if (!cfg_.full_attention[static_cast<size_t>(l)]) {
        LayerState& st = layers_[static_cast<size_t>(l)];
        gdn_rollback(undo_[static_cast<size_t>(l)], w_.layers[static_cast<size_t>(l)].gdn, cfg_, m, st.S, st.conv);
      }
    len_ = len0 + m + 1;  // attention rows beyond are stale
    std::memcpy(sampling_.logits_data(), row_logits_.data() + m * V, static_cast<size_t>(V) * sizeof(float));
  }
  next_token_ = out.back().error ? -1 : out.back().token;  // no choice: nothing pending (a decode step that threw)
  if (following_mtp()) mtp_->on_rows(len0, std::span<const int32_t>(rows.data(), static_cast<size_t>(m + 1)), row_hidden_.data());
  return out;
}

std::vector<TokenChoice> CpuBackend::decode_batch(std::span<Session* const> sessions) {
  std::vector<CpuSessionImpl*> ss;
  ss.reserve(sessions.size());
  for (Session* s : sessions) {
    auto* c = dynamic_cast<CpuSessionImpl*>(s);
    if (!c || &c->backend() != this) throw Error("cpu decode_batch: a session of another backend");
    if (std::find(ss.begin(), ss.end(), c) != ss.end()) throw Error("cpu decode_batch: the same session twice");
    c->check_decodable();
    ss.push_back(c);
  }
  std::vector<TokenChoice> out;
  out.reserve(ss.size());
  for (size_t i = 0; i < ss.size(); i += kMaxBatch) {
    std::span<CpuSessionImpl* const> group(ss.data() + i, std::min<size_t>(kMaxBatch, ss.size() - i));
    // A session's own failure (its sampler found no choice) is its row's error (Backend::decode_batch).
    if (std::any_of(group.begin(), group.end(), [](CpuSessionImpl* c) { return c->has_tap(); })) {
      for (CpuSessionImpl* c : group)  // activation taps: the one-token path
        out.push_back(choice_or_error([c] { return c->decode_step(); }));
      continue;
    }
    CpuSessionImpl::forward_batch(*this, group);
    for (CpuSessionImpl* c : group) out.push_back(choice_or_error([c] { return c->sample(); }));
  }
  return out;
}

std::unique_ptr<Session> CpuBackend::new_session(int64_t max_length) {
  if (max_length <= 0) max_length = w_->config.max_position_embeddings;
  if (max_length <= 0) throw InputError("cpu backend: max_length must be positive");
  auto s = std::make_unique<CpuSessionImpl>(*this, max_length);
  s->set_draft_vocab(draft_vocab_);
  return s;
}

}  // namespace

size_t available_ram_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  size_t kb = 0;
  std::string unit;
  while (f >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return 0;
}

int default_cpu_sessions(size_t per_session_bytes, int k_default) {
  const size_t avail = available_ram_bytes();
  if (per_session_bytes == 0 || avail == 0) return k_default;
  return int(std::clamp<size_t>(avail / 2 / per_session_bytes, 1, size_t(k_default)));
}

std::unique_ptr<Backend> make_cpu_backend(std::shared_ptr<const ModelWeights> weights, int threads) {
  if (!weights) throw Error("make_cpu_backend: no weights");
  if (threads <= 0) threads = int(std::max(1u, std::thread::hardware_concurrency()));
  return std::make_unique<CpuBackend>(std::move(weights), threads);
}

}  // namespace lilac::cpu
