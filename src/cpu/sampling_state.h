// The choosing half both CPU sessions share (the reference session, cpu_backend.cpp, and the fast one,
// src/cpufast/fast_backend.cpp): the current logits, the host sampler (engine/sampler.h) and the next choice's
// token mask -- what Session's begin_generation, sample, set_token_mask and logits do on the CPU.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "engine/backend.h"
#include "engine/sampler.h"

namespace lilac::cpu {

class SamplingState {
 public:
  explicit SamplingState(int64_t vocab);

  // ---- the current logits: the last fed row's. The forward writes them through logits_data(), then calls
  // logits_ready().
  float* logits_data() { return logits_.data(); }
  void logits_ready() { has_logits_ = true; }
  // Session::logits(): a copy; throws before any prefill.
  std::vector<float> logits() const;
  // For snapshots: the current logits (empty when there are none), and back.
  std::vector<float> saved_logits() const { return has_logits_ ? logits_ : std::vector<float>{}; }
  void restore_logits(const std::vector<float>& saved);

  // ---- the choice
  // Session::begin_generation.
  void begin(const SamplingParams& params, std::span<const int32_t> context) { sampler_.begin(params, context); }
  // Session::set_token_mask: the next choice's allowed tokens (a copy: the caller's buffer may change before the
  // choice is made); nullptr: none.
  void set_mask(const uint32_t* bits);
  // Session::sample(): the next choice from the current logits, under the mask, which is for that one choice (also
  // one that fails: engine/sampler.h, no allowed token). Throws before any prefill.
  TokenChoice sample();
  // The sampler itself (a verify chooses its rows with it, from logits of its own, unmasked).
  HostSampler& sampler() { return sampler_; }

  // Session::reset(): no logits, no mask (the sampler's generation stays).
  void reset();

 private:
  int64_t vocab_;
  std::vector<float> logits_;
  bool has_logits_ = false;
  HostSampler sampler_;
  std::vector<uint32_t> mask_;
  bool has_mask_ = false;
};

}  // namespace lilac::cpu
