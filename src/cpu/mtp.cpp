#include "cpu/mtp.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "cpu/ops.h"
#include "engine/sampler.h"

namespace lilac::cpu {

MtpHead::MtpHead(const ModelWeights& w, ThreadPool* pool, const float* inv_freq, int64_t max_len)
    : w_(w), cfg_(w.config), pool_(pool), inv_freq_(inv_freq), max_len_(max_len), draft_vocab_(w.config.vocab_size) {
  LILAC_CHECK(w.has_mtp(), "MtpHead: the model has no MTP head");
}

void MtpHead::reset(bool valid) {
  d_.valid = valid;
  d_.committed = 0;
  d_.pending_h.clear();
  d_.pending_x.clear();
}

void MtpHead::invalidate() {
  reset(false);
}

void MtpHead::on_rows(int64_t pos0, std::span<const int32_t> tokens, const float* hidden) {
  if (!d_.valid || tokens.empty()) return;
  const int64_t H = cfg_.hidden_size, n = int64_t(tokens.size());
  const int64_t P = int64_t(d_.pending_h.size()) / H;
  if (pos0 != d_.committed + P || (P == 0 && pos0 != 0)) {  // not the context it follows: give up
    invalidate();
    return;
  }
  // x_0 pairs with no hidden (there is no h_{-1}); every other fed token completes the pair before it.
  d_.pending_x.insert(d_.pending_x.end(), tokens.begin() + (P == 0 ? 1 : 0), tokens.end());
  d_.pending_h.insert(d_.pending_h.end(), hidden, hidden + n * H);
  if (int64_t(d_.pending_x.size()) >= kFlushRows) run_pending_pairs();
}

// Runs every pair whose next token is known (all waiting rows but the last) and commits them.
void MtpHead::run_pending_pairs() {
  const int64_t H = cfg_.hidden_size, n = int64_t(d_.pending_x.size());
  if (n == 0) return;
  std::vector<float> g(static_cast<size_t>(n * H));
  forward(d_.pending_h.data(), d_.pending_x.data(), n, d_.committed, g.data(), nullptr, true);
  d_.committed += n;
  d_.pending_h.erase(d_.pending_h.begin(), d_.pending_h.begin() + n * H);
  d_.pending_x.clear();
}

std::vector<int32_t> MtpHead::draft(int32_t next, int64_t len, int k) {
  const int64_t H = cfg_.hidden_size, V = cfg_.vocab_size;
  const int64_t P = int64_t(d_.pending_h.size()) / H;
  if (!d_.valid || k <= 0 || P == 0 || d_.committed + P != len) return {};
  if (next < 0 || next >= V) throw Error("mtp draft: pending token " + std::to_string(next) + " is outside the vocabulary");
  // Waiting pairs, then the temporary row (h_{len-1}, next) at position len - 1.
  std::vector<int32_t> x = d_.pending_x;
  x.push_back(next);
  std::vector<float> g(static_cast<size_t>(P * H)), logits(static_cast<size_t>(V));
  forward(d_.pending_h.data(), x.data(), P, d_.committed, g.data(), logits.data(), true);
  d_.committed += P - 1;
  d_.pending_h.erase(d_.pending_h.begin(), d_.pending_h.begin() + (P - 1) * H);
  d_.pending_x.clear();
  // Logits with no number in them (broken mtp.* weights, an overflow in the head) have no argmax (-1): the chain
  // stops there. Drafts are only proposals; a -1 fed to the next forward or to verify failed the request, where the
  // same request without speculation succeeds.
  // The drafts are the argmax over the draft vocabulary, ids [0, draft_vocab_) (set_draft_vocab).
  const std::span<const float> drafted(logits.data(), static_cast<size_t>(draft_vocab_));
  std::vector<int32_t> drafts;
  if (const int32_t t = argmax(drafted); t >= 0) drafts.push_back(t);
  std::vector<float> gj(g.end() - H, g.end()), gn(static_cast<size_t>(H));
  for (int j = 2; j <= k && !drafts.empty() && len + j - 2 < max_len_; ++j) {
    const int32_t prev = drafts.back();
    forward(gj.data(), &prev, 1, len + j - 2, gn.data(), logits.data(), false);
    const int32_t t = argmax(drafted);
    if (t < 0) break;
    drafts.push_back(t);
    gj.swap(gn);
  }
  return drafts;
}

void MtpHead::forward(const float* h, const int32_t* x, int64_t n, int64_t pos0, float* g, float* last_logits,
                      bool to_sink) {
  const MtpWeights& m = w_.mtp;
  const LayerWeights& L = m.layers[0];
  const int64_t H = cfg_.hidden_size, V = cfg_.vocab_size;
  const float eps = float(cfg_.rms_norm_eps);
  std::vector<float> cat(static_cast<size_t>(n * 2 * H)), e(static_cast<size_t>(H)), u(static_cast<size_t>(n * H)),
      y(static_cast<size_t>(n * H)), o(static_cast<size_t>(n * H));
  // u = fc(concat(norm(embed[x]), norm(h))): the embedding first (§4).
  for (int64_t t = 0; t < n; ++t) {
    embed_row(w_.embed, x[t], e.data());
    rmsnorm(e.data(), m.pre_fc_norm_embedding.data(), H, eps, cat.data() + t * 2 * H);
    rmsnorm(h + t * H, m.pre_fc_norm_hidden.data(), H, eps, cat.data() + t * 2 * H + H);
  }
  qmatmul(m.fc, cat.data(), n, u.data(), pool_);
  // One full-attention decoder layer with the MoE MLP, then mtp.norm.
  for (int64_t t = 0; t < n; ++t) rmsnorm(u.data() + t * H, L.input_norm.data(), H, eps, y.data() + t * H);
  AttentionCall call{cfg_, inv_freq_, max_len_, kv_bf16_, false, pool_};
  attention_rows(call, L.attn, d_.cache, pos0, y.data(), n, o.data());
  for (int64_t i = 0; i < n * H; ++i) u[static_cast<size_t>(i)] += o[static_cast<size_t>(i)];
  for (int64_t t = 0; t < n; ++t) rmsnorm(u.data() + t * H, L.post_norm.data(), H, eps, y.data() + t * H);
  moe_forward(L.moe, cfg_, y.data(), n, o.data(), pool_);
  for (int64_t i = 0; i < n * H; ++i) u[static_cast<size_t>(i)] += o[static_cast<size_t>(i)];
  for (int64_t t = 0; t < n; ++t) rmsnorm(u.data() + t * H, m.norm.data(), H, eps, g + t * H);
  // The shared LM head: every row for the sink, else only the last row's.
  if (to_sink && sink_) {
    const int64_t rows = std::clamp<int64_t>((int64_t(32) << 20) / (V * 4), 1, n);
    std::vector<float> lg(static_cast<size_t>(rows * V));
    for (int64_t b = 0; b < n; b += rows) {
      const int64_t r = std::min(rows, n - b);
      qmatmul(w_.lm_head, g + b * H, r, lg.data(), pool_);
      sink_(pos0 + b, r, lg.data());
      if (last_logits && b + r == n) std::memcpy(last_logits, lg.data() + (r - 1) * V, static_cast<size_t>(V) * sizeof(float));
    }
  } else if (last_logits) {
    QMatrix head = w_.lm_head;  // a draft row: the draft vocabulary's rows (the first rows of the matrix)
    head.rows = draft_vocab_;
    qmatvec(head, g + (n - 1) * H, last_logits, pool_);
  }
}

MtpData MtpHead::snapshot() const {
  MtpData s;
  s.valid = d_.valid;
  if (!s.valid) return s;
  const int64_t kvd = cfg_.kv_dim();
  s.committed = d_.committed;
  s.cache.k.assign(d_.cache.k.begin(), d_.cache.k.begin() + d_.committed * kvd);
  s.cache.v.assign(d_.cache.v.begin(), d_.cache.v.begin() + d_.committed * kvd);
  s.pending_h = d_.pending_h;
  s.pending_x = d_.pending_x;
  return s;
}

void MtpHead::restore(const MtpData& s) {
  if (!s.valid) return invalidate();
  const int64_t kvd = cfg_.kv_dim();
  if (int64_t(d_.cache.k.size()) < s.committed * kvd) {
    d_.cache.k.resize(static_cast<size_t>(s.committed * kvd));
    d_.cache.v.resize(static_cast<size_t>(s.committed * kvd));
  }
  std::copy(s.cache.k.begin(), s.cache.k.end(), d_.cache.k.begin());
  std::copy(s.cache.v.begin(), s.cache.v.end(), d_.cache.v.begin());
  d_.valid = true;
  d_.committed = s.committed;
  d_.pending_h = s.pending_h;
  d_.pending_x = s.pending_x;
}

}  // namespace lilac::cpu
