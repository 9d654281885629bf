#include "cpu/sampling_state.h"

#include "core/error.h"

namespace lilac::cpu {

SamplingState::SamplingState(int64_t vocab) : vocab_(vocab), sampler_(vocab) { reset(); }

std::vector<float> SamplingState::logits() const {
  if (!has_logits_) throw Error("cpu session: no logits yet (empty context)");
  return logits_;
}

void SamplingState::restore_logits(const std::vector<float>& saved) {
  has_logits_ = !saved.empty();
  if (has_logits_) logits_ = saved;
}

void SamplingState::set_mask(const uint32_t* bits) {
  has_mask_ = bits != nullptr;
  if (bits) mask_.assign(bits, bits + (vocab_ + 31) / 32);
}

TokenChoice SamplingState::sample() {
  if (!has_logits_) throw Error("cpu session: sample() before any prefill");
  const bool masked = has_mask_;
  has_mask_ = false;  // the mask is for one choice, also one that fails (engine/sampler.h: no allowed token)
  return sampler_.sample(logits_, masked ? mask_.data() : nullptr);
}

void SamplingState::reset() {
  has_logits_ = false;
  has_mask_ = false;
  logits_.assign(static_cast<size_t>(vocab_), 0.f);
}

}  // namespace lilac::cpu
