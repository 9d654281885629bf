// Helpers of the speculative-decoding generator tests (test_generator_spec*.cpp): the tiny-mtp model on the
// CPU reference backend, a run's outcome, exact comparison, requests, and a draft hook that proposes the
// plain run's continuation with errors at chosen places.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cpu/cpu_backend.h"
#include "engine/generator.h"
#include "model/weights.h"
#include "text/tokenizer.h"

namespace {

using namespace lilac;

const Tokenizer& tokenizer() {
  static std::unique_ptr<Tokenizer> t = Tokenizer::load(std::string(LILAC_SHARED_DIR) + "/fixtures/qwen3-tokenizer");
  return *t;
}

std::shared_ptr<const ModelWeights> tiny_mtp() {
  static auto w = load_model(std::string(LILAC_SHARED_DIR) + "/fixtures/tiny-mtp/mlx4", {.progress = false});
  return w;
}

struct Outcome {
  std::vector<int32_t> ids;
  std::vector<float> logprobs;
  std::string text;
  GenerationStats st;
};

Outcome run(Generator& g, const GenerationRequest& r) {
  Outcome out;
  out.st = g.run(r, [&](const GeneratedToken& t) {
    if (t.id >= 0) {
      out.ids.push_back(t.id);
      out.logprobs.push_back(t.choice.logprob);
    }
    out.text += t.text;
    return true;
  });
  return out;
}

void expect_same(const Outcome& a, const Outcome& b, const std::string& what) {
  EXPECT_EQ(a.ids, b.ids) << what;
  ASSERT_EQ(a.logprobs.size(), b.logprobs.size()) << what;
  EXPECT_EQ(0, std::memcmp(a.logprobs.data(), b.logprobs.data(), a.logprobs.size() * sizeof(float))) << what;
  EXPECT_EQ(a.text, b.text) << what;
  EXPECT_EQ(a.st.finish, b.st.finish) << what;
  EXPECT_EQ(a.st.completion_tokens, b.st.completion_tokens) << what;
}

GenerationRequest request(std::vector<int32_t> prompt, int64_t max_tokens, int spec) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.draft_tokens = spec;
  r.spec_policy = SpecPolicyKind::Fixed;  // every step drafts `spec` (the adaptive tests ask for theirs)
  r.sampling.logprobs = true;
  r.use_cache = false;
  return r;
}

std::vector<int32_t> prompt_of(int n, int salt) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back(int32_t((i * 37 + salt * 101 + 5) % 1000));
  return p;
}

// Drafts = the plain run's continuation, wrong at place round % (K + 2) (>= k: all right).
[[maybe_unused]] DraftHook truth_with_errors(const std::vector<int32_t>& truth, int K, std::vector<int>* planned = nullptr) {
  auto round = std::make_shared<int>(0);
  return [=](int64_t i, int k, std::vector<int32_t>& drafts) {
    drafts.clear();
    for (int j = 0; j < k; ++j) {
      const size_t at = size_t(i + 1 + j);
      drafts.push_back(at < truth.size() ? truth[at] : 0);
    }
    const int e = (*round)++ % (K + 2);
    if (e < k) drafts[size_t(e)] = (drafts[size_t(e)] + 3) % 1000;
    if (planned) planned->push_back(std::min(e, k));
  };
}

}  // namespace
