// The check of Session::set_token_mask on the tiny fixture, for every CPU backend (tests/cpu and
// tests/cpufast include it): the next choice only among allowed tokens, for that choice only; greedy
// under a mask is the best allowed logit; a mask that allows no token fails its choice only.
#pragma once
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "engine/backend.h"
#include "engine/sampler.h"

namespace lilac::test {

inline void expect_mask_restricts_next_choice_only(Backend& backend) {
  Backend* be = &backend;
  const int64_t V = be->config().vocab_size;
  auto s = be->new_session(64);
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5};
  s->prefill(prompt);
  s->begin_generation(SamplingParams{}, prompt);
  const std::vector<float> logits = s->logits();
  const int32_t best = argmax(logits);
  // Allow every odd id other than the best one: greedy takes the best allowed logit.
  std::vector<uint32_t> mask(size_t((V + 31) / 32), 0);
  int32_t want = -1;
  for (int32_t t = 1; t < V; t += 2) {
    if (t == best) continue;
    mask[size_t(t) >> 5] |= 1u << (t & 31);
    if (want < 0 || logits[size_t(t)] > logits[size_t(want)]) want = t;
  }
  s->set_token_mask(mask.data());
  mask.assign(mask.size(), 0);  // the session keeps its own copy
  const TokenChoice c = s->sample();
  EXPECT_EQ(c.token, want);
  // The next step is unconstrained again: the same as an unmasked session fed the same token.
  const TokenChoice next = s->decode_step();
  auto ref = be->new_session(64);
  std::vector<int32_t> fed = prompt;
  fed.push_back(want);
  ref->prefill(fed);
  ref->begin_generation(SamplingParams{}, prompt);
  EXPECT_EQ(next.token, argmax(ref->logits()));
  // Sampling at temperature 1 under a two-token mask never leaves it.
  std::vector<uint32_t> two(size_t((V + 31) / 32), 0);
  two[0] |= 1u << 5;
  two[1] |= 1u << 1;  // token 33
  SamplingParams p;
  p.temperature = 1.f;
  p.seed = 3;
  s->begin_generation(p, prompt);
  for (int i = 0; i < 8; ++i) {
    s->set_token_mask(two.data());
    const int32_t t = s->decode_step().token;
    EXPECT_TRUE(t == 5 || t == 33) << t;
  }
  // A mask that allows no token of the vocabulary (bits past it allow nothing): that choice is an InputError naming
  // the constraint, where a backend may refuse the mask itself (engine/sampler.h); the mask is gone with it, and the
  // next choice is free. The CPU sampler took the raw argmax before.
  std::vector<uint32_t> none(size_t((V + 31) / 32), 0);
  if (V % 32) none.back() = ~((1u << (V % 32)) - 1u);
  try {
    s->set_token_mask(none.data());
    s->sample();
    ADD_FAILURE() << "a mask that allows no token made a choice";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("allows no token"), std::string::npos) << e.what();
  }
  const TokenChoice unmasked = s->sample();
  EXPECT_TRUE(unmasked.token >= 0 && unmasked.token < V) << unmasked.token;
}

}  // namespace lilac::test
