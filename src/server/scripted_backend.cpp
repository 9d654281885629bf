#include "server/scripted_backend.h"

#include <bit>
#include <chrono>
#include <cmath>
#include <fstream>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "text/tokenizer.h"

namespace lilac::server {

namespace {

struct Rule {
  std::string match;
  std::vector<int32_t> reply;
  int delay_ms = 0;
  bool repeat = false;
};

struct Script {
  std::vector<Rule> rules;
  Rule fallback;
  int prefill_delay_ms = 0;
  bool logit_bias = true;  // "logit_bias": false plays a backend that does not support it
};

class ScriptedSnapshot : public SessionSnapshot {
 public:
  std::vector<int32_t> tokens;
  int64_t length() const override { return int64_t(tokens.size()); }
  size_t bytes() const override { return tokens.size() * sizeof(int32_t) + 64; }
};

class ScriptedBackend;

class ScriptedSession : public Session {
 public:
  ScriptedSession(const ScriptedBackend& b, int64_t max_len) : b_(b), max_(max_len) {}
  int64_t length() const override { return int64_t(ctx_.size()); }
  int64_t max_length() const override { return max_; }
  int64_t vocab_size() const override;
  void prefill(std::span<const int32_t> tokens, const LogitsSink* sink) override;
  void begin_generation(const SamplingParams& params, std::span<const int32_t> context) override;
  TokenChoice sample() override;
  void advance() override;
  std::vector<float> logits() override;
  std::shared_ptr<const SessionSnapshot> snapshot() override {
    auto s = std::make_shared<ScriptedSnapshot>();
    s->tokens = ctx_;
    return s;
  }
  void restore(const SessionSnapshot& snap) override {
    auto* s = dynamic_cast<const ScriptedSnapshot*>(&snap);
    if (!s) throw Error("scripted session: snapshot from another backend");
    ctx_ = s->tokens;
  }
  void reset() override { ctx_.clear(); }
  // Constrained decoding: the scripted reply is not changed, but a scripted token outside the mask is
  // an error (so scripts exercise the grammars with real tokenizations) -- unless the mask allows one
  // token only (a forced token: a reasoning budget's closing markup), which is chosen instead; the reply
  // starts over after it.
  void set_token_mask(const uint32_t* bits) override;

 private:
  std::vector<uint32_t> mask_;
  bool has_mask_ = false;
  int32_t next_token() const;
  const ScriptedBackend& b_;
  int64_t max_;
  std::vector<int32_t> ctx_;
  const Rule* rule_ = nullptr;
  size_t pos_ = 0;
  int32_t current_ = -1;
  bool forced_ = false;  // current_ was forced by the mask
  SamplingParams params_;
};

class ScriptedBackend : public Backend {
 public:
  ScriptedBackend(Script s, std::shared_ptr<const Tokenizer> tok) : script(std::move(s)), tok(std::move(tok)) {
    cfg.model_type = "scripted";
    cfg.vocab_size = this->tok->vocab_size();
    cfg.max_position_embeddings = int64_t(1) << 30;
    for (const char* name : {"<|im_end|>", "<|endoftext|>"})
      if (auto id = this->tok->token_id(name)) cfg.eos_token_ids.push_back(*id);
    if (cfg.eos_token_ids.empty()) throw InputError("scripted backend: the tokenizer has no <|im_end|> token");
  }
  std::string name() const override { return "scripted"; }
  const ModelConfig& config() const override { return cfg; }
  std::unique_ptr<Session> new_session(int64_t max_length) override {
    return std::make_unique<ScriptedSession>(*this, max_length);
  }
  std::string describe() const override { return "scripted test backend (no model)"; }
  bool supports_logit_bias() const override { return script.logit_bias; }  // accepted, not applied

  Script script;
  std::shared_ptr<const Tokenizer> tok;
  ModelConfig cfg;
};

int64_t ScriptedSession::vocab_size() const { return b_.cfg.vocab_size; }

void ScriptedSession::prefill(std::span<const int32_t> tokens, const LogitsSink* sink) {
  if (int64_t(ctx_.size() + tokens.size()) > max_)
    throw InputError("scripted session: context of " + std::to_string(ctx_.size() + tokens.size()) +
                     " tokens exceeds its capacity of " + std::to_string(max_));
  for (int32_t t : tokens)
    if (t < 0 || t >= b_.cfg.vocab_size) throw InputError("scripted session: token id " + std::to_string(t) + " out of range");
  if (b_.script.prefill_delay_ms > 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(b_.script.prefill_delay_ms));
  ctx_.insert(ctx_.end(), tokens.begin(), tokens.end());
  if (sink) {
    std::vector<float> row(size_t(b_.cfg.vocab_size), 0.f);
    for (size_t i = 0; i < tokens.size(); ++i) (*sink)(int64_t(ctx_.size() - tokens.size() + i), 1, row.data());
  }
}

void ScriptedSession::begin_generation(const SamplingParams& params, std::span<const int32_t> context) {
  params_ = params;
  std::string text = b_.tok->decode(ctx_, false);
  size_t u = text.rfind("<|im_start|>user");
  std::string tail = u == std::string::npos ? text : text.substr(u);
  rule_ = &b_.script.fallback;
  for (auto& r : b_.script.rules)
    if (!r.match.empty() && tail.find(r.match) != std::string::npos) {
      rule_ = &r;
      break;
    }
  pos_ = 0;
  // A continuation (the generation core resumes a generation from what it wrote so far, e.g. after a
  // reasoning budget): when the assistant turn already holds a prefix of the reply, go on from there.
  const std::string head = "<|im_start|>assistant\n";
  size_t a = text.rfind(head);
  if (a == std::string::npos || rule_->reply.empty()) return;
  std::string written = text.substr(a + head.size());
  if (written.rfind("<think>\n", 0) == 0) written.erase(0, 8);
  if (written.empty()) return;
  std::string acc;
  for (size_t k = 0; k < rule_->reply.size() && acc.size() < written.size(); ++k) {
    acc += b_.tok->decode(std::span<const int32_t>(&rule_->reply[k], 1), false);
    if (acc == written) pos_ = k + 1;
  }
}

int32_t ScriptedSession::next_token() const {
  if (!rule_ || rule_->reply.empty()) return b_.cfg.eos_token_ids[0];
  if (pos_ < rule_->reply.size()) return rule_->reply[pos_];
  if (rule_->repeat) return rule_->reply[pos_ % rule_->reply.size()];
  return b_.cfg.eos_token_ids[0];
}

void ScriptedSession::set_token_mask(const uint32_t* bits) {
  has_mask_ = bits != nullptr;
  if (bits) mask_.assign(bits, bits + (b_.cfg.vocab_size + 31) / 32);
}

TokenChoice ScriptedSession::sample() {
  TokenChoice c;
  c.token = next_token();
  forced_ = false;
  if (has_mask_) {
    has_mask_ = false;
    int64_t set = 0;
    int32_t only = -1;
    for (size_t w = 0; w < mask_.size() && set < 2; ++w)
      if (mask_[w]) {
        set += std::popcount(mask_[w]);
        only = int32_t(w * 32) + std::countr_zero(mask_[w]);
      }
    if (set == 1 && only != c.token) {
      c.token = only;
      forced_ = true;
    } else if (!((mask_[size_t(c.token) >> 5] >> (c.token & 31)) & 1u))
      throw Error("scripted backend: the script's token " + std::to_string(c.token) + " ('" + b_.tok->token_bytes(c.token) +
                  "') is not allowed by the token mask (the reply breaks the request's constraint)");
  }
  current_ = c.token;
  if (params_.logprobs) {
    c.logprob = std::log(0.75f);
    const int64_t V = b_.cfg.vocab_size;
    if (params_.top_logprobs > 0) c.top.push_back({c.token, c.logprob});
    for (int k = 1; k < params_.top_logprobs; ++k)
      c.top.push_back({int32_t((c.token + k) % V), std::log(0.2f / float(1 << k))});
  }
  return c;
}

void ScriptedSession::advance() {
  if (rule_ && rule_->delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(rule_->delay_ms));
  if (int64_t(ctx_.size()) + 1 > max_) throw InputError("scripted session: context full");
  ctx_.push_back(current_);
  pos_ = forced_ ? 0 : pos_ + 1;
  forced_ = false;
}

std::vector<float> ScriptedSession::logits() {
  std::vector<float> l(size_t(b_.cfg.vocab_size), 0.f);
  l[size_t(next_token())] = 1.f;
  return l;
}

Rule parse_rule(const nlohmann::json& j, const Tokenizer& tok, const std::string& where) {
  if (!j.is_object()) throw InputError("scripted backend: " + where + " must be an object");
  Rule r;
  r.match = j.value("match", "");
  std::string reply = j.value("reply", "");
  r.reply = tok.encode(reply, true);
  r.delay_ms = j.value("delay_ms", 0);
  r.repeat = j.value("repeat", false);
  return r;
}

}  // namespace

std::unique_ptr<Backend> make_scripted_backend(const nlohmann::json& script, std::shared_ptr<const Tokenizer> tokenizer) {
  if (!tokenizer) throw InputError("scripted backend: needs a tokenizer");
  Script s;
  try {
    if (!script.is_object()) throw InputError("scripted backend: the script must be a JSON object");
    if (script.contains("rules")) {
      if (!script["rules"].is_array()) throw InputError("scripted backend: 'rules' must be an array");
      for (size_t i = 0; i < script["rules"].size(); ++i)
        s.rules.push_back(parse_rule(script["rules"][i], *tokenizer, "rules[" + std::to_string(i) + "]"));
    }
    if (script.contains("default")) s.fallback = parse_rule(script["default"], *tokenizer, "default");
    s.prefill_delay_ms = script.value("prefill_delay_ms", 0);
    s.logit_bias = script.value("logit_bias", true);
  } catch (const nlohmann::json::exception& e) {
    throw InputError(std::string("scripted backend: bad script: ") + e.what());
  }
  return std::make_unique<ScriptedBackend>(std::move(s), std::move(tokenizer));
}

std::unique_ptr<Backend> make_scripted_backend_from_file(const std::string& path, std::shared_ptr<const Tokenizer> tokenizer) {
  std::ifstream f(path);
  if (!f) throw InputError("scripted backend: cannot read " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  auto j = nlohmann::json::parse(ss.str(), nullptr, false);
  if (j.is_discarded()) throw InputError("scripted backend: " + path + " is not valid JSON");
  return make_scripted_backend(j, std::move(tokenizer));
}

}  // namespace lilac::server
