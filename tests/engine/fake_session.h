// Test doubles for the engine's generation loop: a deterministic fake Session whose output depends on
// the whole context, with optional token-mask and MTP-draft support.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/error.h"
#include "engine/backend.h"

namespace {

// A "model" whose state is a hash of every token it has seen; the next token is a function of that
// hash (ids 32..1031, plus eos when the hash says so). Any state error (wrong restore, token skipped
// or fed twice) changes the output.
struct HashState {
  uint64_t h = 14695981039346656037ull;
  int64_t len = 0;
  void feed(int32_t t) {
    h ^= uint64_t(uint32_t(t)) + 0x9e3779b97f4a7c15ull;
    h *= 1099511628211ull;
    ++len;
  }
  int32_t next(int32_t eos) const { return (h >> 7) % 23 == 0 ? eos : int32_t(32 + (h >> 11) % 1000); }
};

class HashSnap : public lilac::SessionSnapshot {
 public:
  explicit HashSnap(HashState s) : s(s) {}
  HashState s;
  int64_t length() const override { return s.len; }
  size_t bytes() const override { return 1000; }
};

struct Counters {
  int64_t prefilled = 0, restores = 0, resets = 0, snapshots = 0;
  int64_t masks = 0, drafts = 0, verifies = 0, decode_steps = 0;
  std::vector<int64_t> prefill_calls;  // sizes of the prefill() calls
};

class HashSession : public lilac::Session {
 public:
  HashSession(int64_t max, int32_t eos, Counters* c) : max_(max), eos_(eos), c_(c) {}
  int64_t length() const override { return st_.len; }
  int64_t max_length() const override { return max_; }
  void prefill(std::span<const int32_t> tokens, const lilac::LogitsSink*) override {
    if (st_.len + int64_t(tokens.size()) > max_) throw lilac::InputError("too long");
    for (int32_t t : tokens) st_.feed(t);
    c_->prefilled += int64_t(tokens.size());
    c_->prefill_calls.push_back(int64_t(tokens.size()));
  }
  void begin_generation(const lilac::SamplingParams&, std::span<const int32_t>) override {}
  // The model's token, unless a mask forbids it: then the lowest allowed id.
  lilac::TokenChoice sample() override {
    lilac::TokenChoice c;
    c.token = st_.next(eos_);
    if (!mask_.empty()) {
      auto allowed = [&](int32_t t) { return (mask_[size_t(t) / 32] >> (t % 32)) & 1u; };
      if (!allowed(c.token)) {
        c.token = -1;
        for (int32_t t = 0; t < int32_t(mask_.size() * 32); ++t)
          if (allowed(t)) {
            c.token = t;
            break;
          }
        if (c.token < 0) throw lilac::Error("empty mask");
      }
      mask_.clear();
    }
    last_ = c.token;
    return c;
  }
  void advance() override { st_.feed(last_); }
  lilac::TokenChoice decode_step() override {
    ++c_->decode_steps;
    advance();
    return sample();
  }
  std::vector<float> logits() override { return {}; }
  std::shared_ptr<const lilac::SessionSnapshot> snapshot() override {
    ++c_->snapshots;
    return std::make_shared<HashSnap>(st_);
  }
  void restore(const lilac::SessionSnapshot& s) override {
    ++c_->restores;
    st_ = dynamic_cast<const HashSnap&>(s).s;
  }
  void reset() override {
    ++c_->resets;
    st_ = HashState{};
  }

  // Token masks over a vocabulary of `mask_vocab` ids.
  void set_token_mask(const uint32_t* bits) override {
    ++c_->masks;
    if (bits)
      mask_.assign(bits, bits + (mask_vocab + 31) / 32);
    else
      mask_.clear();
  }
  int64_t mask_vocab = 0;

  // MTP doubles: drafts follow the model except where the running hash says "wrong" (about a third);
  // verify is decode_step() token by token while the drafts match (what a backend's verify computes).
  bool drafting = false;
  bool can_draft() const override { return drafting; }
  std::vector<int32_t> draft(int k) override {
    ++c_->drafts;
    std::vector<int32_t> d;
    HashState s = st_;
    int32_t prev = last_;
    for (int i = 0; i < k; ++i) {
      s.feed(prev);
      int32_t t = s.next(eos_);
      if ((s.h >> 3) % 3 == 0) t = 32 + (t + 1) % 1000;  // a wrong draft
      d.push_back(t);
      prev = t;
    }
    return d;
  }
  std::vector<lilac::TokenChoice> verify(std::span<const int32_t> drafts) override {
    ++c_->verifies;
    std::vector<lilac::TokenChoice> out;
    advance();
    out.push_back(sample());
    for (int32_t d : drafts) {
      if (out.back().token != d) break;
      advance();
      out.push_back(sample());
    }
    return out;
  }

 private:
  int64_t max_;
  int32_t eos_;
  Counters* c_;
  HashState st_;
  int32_t last_ = 0;
  std::vector<uint32_t> mask_;
};

}  // namespace
