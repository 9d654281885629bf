#include "cpufast/fast_backend.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "cpu/cpu_backend.h"
#include "cpu/sampling_state.h"
#include "cpufast/forward.h"
#include "cpufast/isa.h"
#include "engine/validate.h"

namespace lilac::cpufast {

namespace {

class FastSnapshot : public SessionSnapshot {
 public:
  const void* owner = nullptr;
  SeqState st;
  std::vector<float> logits;
  int64_t length() const override { return st.len; }
  size_t bytes() const override {
    size_t b = logits.size() * sizeof(float);
    for (const auto& l : st.layers)
      b += (l.k.size() + l.v.size()) * sizeof(uint16_t) + (l.S.size() + l.conv.size()) * sizeof(float);
    return b;
  }
};

class FastBackend;

class FastSession : public cpu::CpuSession {
 public:
  FastSession(FastBackend& be, FastModel& m, int64_t max_length)
      : be_(be), m_(m), cfg_(m.config()), max_len_(max_length), sampling_(cfg_.vocab_size) {
    reset();
  }

  int64_t length() const override { return st_.len; }
  int64_t max_length() const override { return max_len_; }
  int64_t vocab_size() const override { return cfg_.vocab_size; }
  void set_activation_tap(cpu::ActivationTap tap) override { tap_ = std::move(tap); }
  void set_prefill_chunk(int64_t tokens) override { chunk_ = std::max<int64_t>(1, tokens); }
  void set_kv_bf16(bool) override {}  // always f16 (mixers.cpp)

  void prefill(std::span<const int32_t> tokens, const LogitsSink* sink) override {
    check_tokens(tokens);
    const int64_t n = int64_t(tokens.size()), H = cfg_.hidden_size, V = cfg_.vocab_size;
    for (int64_t b = 0; b < n; b += chunk_) {
      const int64_t m = std::min(chunk_, n - b);
      const bool last = b + m == n;
      const int64_t first_pos = st_.len;
      std::vector<int64_t> rows;
      if (sink)
        for (int64_t i = 0; i < m; ++i) rows.push_back(i);
      else if (last)
        rows.push_back(m - 1);
      std::vector<float> h(rows.size() * static_cast<size_t>(H));
      const Segment seg{&st_, m, max_len_};
      const Tap* tap = tap_ ? &tap_ : nullptr;
      m_.forward(std::span<const Segment>(&seg, 1), tokens.subspan(static_cast<size_t>(b), static_cast<size_t>(m)), rows,
                 h.data(), tap);
      if (sink) {
        const int64_t sub = std::clamp<int64_t>((int64_t(32) << 20) / (V * 4), 1, m);
        std::vector<float> lg(static_cast<size_t>(sub * V));
        for (int64_t r = 0; r < m; r += sub) {
          const int64_t k = std::min(sub, m - r);
          m_.lm_head(h.data() + r * H, k, lg.data());
          (*sink)(first_pos + r, k, lg.data());
          if (last && r + k == m)
            std::memcpy(sampling_.logits_data(), lg.data() + (k - 1) * V, static_cast<size_t>(V) * sizeof(float));
        }
      } else if (last) {
        m_.lm_head(h.data(), 1, sampling_.logits_data());
      }
      if (last) sampling_.logits_ready();
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
    const int32_t t = take_pending();
    prefill(std::span<const int32_t>(&t, 1), nullptr);
  }

  std::vector<float> logits() override { return sampling_.logits(); }

  std::shared_ptr<const SessionSnapshot> snapshot() override {
    auto s = std::make_shared<FastSnapshot>();
    s->owner = &m_;
    s->st.len = st_.len;
    s->st.layers.resize(st_.layers.size());
    const int64_t kvd = cfg_.kv_dim();
    for (size_t l = 0; l < st_.layers.size(); ++l) {
      const LayerState& src = st_.layers[l];
      LayerState& dst = s->st.layers[l];
      if (cfg_.full_attention[l]) {
        dst.k.assign(src.k.begin(), src.k.begin() + st_.len * kvd);
        dst.v.assign(src.v.begin(), src.v.begin() + st_.len * kvd);
      } else {
        dst.S = src.S;
        dst.conv = src.conv;
      }
    }
    s->logits = sampling_.saved_logits();
    return s;
  }

  void restore(const SessionSnapshot& snap) override {
    const auto* s = dynamic_cast<const FastSnapshot*>(&snap);
    if (!s || s->owner != &m_) throw Error("cpu session: snapshot is from another backend or model");
    if (s->st.len > max_len_)
      throw InputError("cpu session: snapshot length " + std::to_string(s->st.len) + " exceeds max_length " +
                       std::to_string(max_len_));
    const int64_t kvd = cfg_.kv_dim();
    for (size_t l = 0; l < st_.layers.size(); ++l) {
      LayerState& dst = st_.layers[l];
      const LayerState& src = s->st.layers[l];
      if (cfg_.full_attention[l]) {
        if (int64_t(dst.k.size()) < s->st.len * kvd) {
          dst.k.resize(static_cast<size_t>(s->st.len * kvd));
          dst.v.resize(static_cast<size_t>(s->st.len * kvd));
        }
        std::copy(src.k.begin(), src.k.end(), dst.k.begin());
        std::copy(src.v.begin(), src.v.end(), dst.v.begin());
      } else {
        dst.S = src.S;
        dst.conv = src.conv;
      }
    }
    st_.len = s->st.len;
    sampling_.restore_logits(s->logits);
    next_token_ = -1;
  }

  void reset() override {
    m_.init_state(st_);
    sampling_.reset();
    next_token_ = -1;
  }

  // For decode_batch.
  FastBackend& backend() { return be_; }
  SeqState& state() { return st_; }
  // Throws unless a token is pending and fits in the context.
  void check_pending() const {
    if (next_token_ < 0) throw Error("cpu session: advance() without a sampled token");
    require(check_session_capacity(st_.len, 1, max_len_));
  }
  int32_t take_pending() {
    check_pending();
    const int32_t t = next_token_;
    next_token_ = -1;
    return t;
  }
  float* logits_data() { return sampling_.logits_data(); }
  void logits_ready() { sampling_.logits_ready(); }

 private:
  void check_tokens(std::span<const int32_t> tokens) const {
    require(check_token_ids(tokens, cfg_.vocab_size));
    require(check_session_capacity(st_.len, int64_t(tokens.size()), max_len_));
  }

  FastBackend& be_;
  FastModel& m_;
  const ModelConfig& cfg_;
  int64_t max_len_;
  int64_t chunk_ = 512;
  SeqState st_;
  cpu::SamplingState sampling_;  // the current logits, the sampler, the next choice's mask
  int32_t next_token_ = -1;
  Tap tap_;
};

class FastBackend : public Backend {
 public:
  FastBackend(std::shared_ptr<const ModelWeights> w, const KernelSet& k, int threads) : m_(std::move(w), k, threads) {
    LILAC_LOG_INFO("cpu backend: %s kernels (CPU features: %s), %d threads, %.2f GB of packed weights", k.name,
                   cpu_features().describe().c_str(), m_.threads(), double(m_.packed_bytes()) / 1e9);
  }
  std::string name() const override { return "cpu"; }
  const ModelConfig& config() const override { return m_.config(); }
  std::string describe() const override {
    return std::string("cpu (") + m_.kernels().name + " int8 kernels), " + std::to_string(m_.threads()) + " threads";
  }
  std::unique_ptr<Session> new_session(int64_t max_length) override {
    if (max_length <= 0) max_length = m_.config().max_position_embeddings;
    if (max_length <= 0) throw InputError("cpu backend: max_length must be positive");
    return std::make_unique<FastSession>(*this, m_, max_length);
  }
  int max_batch() const override { return 32; }
  bool supports_logit_bias() const override { return true; }
  // Per session: f16 K/V of the attention layers at full length, the fp32 Gated DeltaNet and conv
  // states, one row of logits (SeqState in cpufast/forward.h).
  size_t session_bytes(int64_t max_length) const override {
    const ModelConfig& c = m_.config();
    if (max_length <= 0) max_length = c.max_position_embeddings;
    const size_t attn = size_t(2) * size_t(max_length) * size_t(c.kv_dim()) * sizeof(uint16_t);
    const size_t gdn = (size_t(c.linear_num_value_heads) * c.linear_key_head_dim * c.linear_value_head_dim +
                        size_t(c.gdn_conv_dim()) * size_t(c.linear_conv_kernel_dim - 1)) *
                       sizeof(float);
    size_t bytes = size_t(c.vocab_size) * sizeof(float);
    for (bool full : c.full_attention) bytes += full ? attn : gdn;
    return bytes;
  }
  int default_sessions(int64_t max_length) const override {
    return cpu::default_cpu_sessions(session_bytes(max_length));
  }

  std::vector<TokenChoice> decode_batch(std::span<Session* const> sessions) override {
    std::vector<FastSession*> ss;
    std::set<Session*> seen;
    for (Session* s : sessions) {
      auto* f = dynamic_cast<FastSession*>(s);
      if (!f || &f->backend() != this) throw Error("decode_batch: a session of another backend");
      if (!seen.insert(s).second) throw Error("decode_batch: a session appears twice");
      f->check_pending();
      ss.push_back(f);
    }
    std::vector<TokenChoice> out;
    const int64_t V = m_.config().vocab_size, H = m_.config().hidden_size;
    for (size_t b0 = 0; b0 < ss.size(); b0 += size_t(max_batch())) {
      const size_t nb = std::min(ss.size() - b0, size_t(max_batch()));
      std::vector<int32_t> tokens;
      std::vector<Segment> segs;
      std::vector<int64_t> rows;
      for (size_t i = 0; i < nb; ++i) {
        tokens.push_back(ss[b0 + i]->take_pending());
        segs.push_back(Segment{&ss[b0 + i]->state(), 1, ss[b0 + i]->max_length()});
        rows.push_back(int64_t(i));
      }
      std::vector<float> h(nb * static_cast<size_t>(H)), lg(nb * static_cast<size_t>(V));
      m_.forward(segs, tokens, rows, h.data());
      m_.lm_head(h.data(), int64_t(nb), lg.data());
      for (size_t i = 0; i < nb; ++i) {
        std::memcpy(ss[b0 + i]->logits_data(), lg.data() + i * static_cast<size_t>(V), static_cast<size_t>(V) * sizeof(float));
        ss[b0 + i]->logits_ready();
        FastSession* f = ss[b0 + i];
        out.push_back(choice_or_error([f] { return f->sample(); }));  // its own failure: its row's error
      }
    }
    return out;
  }

 private:
  FastModel m_;
};

}  // namespace

std::unique_ptr<Backend> make_fast_cpu_backend(std::shared_ptr<const ModelWeights> weights, const FastOptions& opts) {
  if (!weights) throw Error("make_fast_cpu_backend: no weights");
  const KernelSet* k = opts.kernels;
  if (!k && opts.isa.empty()) k = &best_kernels();
  if (!k) {
    k = kernels_for(opts.isa);
    if (!k) throw Error("cpu backend: kernel level '" + opts.isa + "' cannot run on this CPU or build");
  }
  const int threads = opts.threads > 0 ? opts.threads : int(std::max(1u, std::thread::hardware_concurrency()));
  return std::make_unique<FastBackend>(std::move(weights), *k, threads);
}

}  // namespace lilac::cpufast
