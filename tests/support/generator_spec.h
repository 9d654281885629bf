// Generator with speculative decoding, for any backend with tiny-mtp (tests/engine/test_generator_spec.cpp: the CPU
// reference; tests/cuda/test_cuda_mtp.cpp: CUDA): a round with a row that has no choice (engine/sampler.h) ends the
// generation as plain decoding does, after the round's choices before that row (Session::verify, engine/backend.h).
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/backend.h"
#include "engine/generator.h"
#include "engine/sampler.h"
#include "model/weights.h"
#include "support/fixtures.h"

namespace lilac::testutil::genspec {

// A backend on the given weights (tiny-mtp's, or tiny-mtp's with one embedding row NaN).
using BackendFactory = std::function<std::unique_ptr<Backend>(std::shared_ptr<const ModelWeights>)>;

// A row with no choice in the middle of a round's rows: here every logit is NaN once a token whose embedding row is
// NaN has been fed, a token the model chooses itself and that the drafts propose. The generation ends with the
// sampler's error after exactly the tokens plain decoding delivers before it (the round's choices before that row),
// and no id stands in for the row. Drafts are injected by the draft hook (the true continuation), K = 4, the fixed
// policy.
inline void expect_a_row_with_no_choice_ends_the_generation_after_the_choices_before_it(const BackendFactory& make) {
  const int K = 4;
  std::vector<int32_t> prompt;
  for (int i = 0; i < 23; ++i) prompt.push_back(int32_t((i * 37 + 101 + 5) % 1000));
  auto request = [&](int spec) {
    GenerationRequest r;
    r.prompt = prompt;
    r.max_tokens = 40;
    r.draft_tokens = spec;
    r.spec_policy = SpecPolicyKind::Fixed;  // every step drafts `spec`
    r.sampling.logprobs = true;
    r.use_cache = false;
    return r;
  };
  const Tokenizer& tok = *qwen3_tokenizer();
  auto run_to_error = [&](Generator& g, const GenerationRequest& r, std::vector<int32_t>& ids) -> std::string {
    try {
      g.run(r, [&](const GeneratedToken& t) {
        if (t.id >= 0) ids.push_back(t.id);
        return true;
      });
    } catch (const std::exception& e) {
      return e.what();
    }
    return "no error";
  };

  std::vector<int32_t> truth;
  {
    auto good = make(fixture("tiny-mtp"));
    auto s0 = good->new_session(128);
    Generator truth_gen(*s0, tok, nullptr);
    ASSERT_EQ(run_to_error(truth_gen, request(0), truth), "no error");
  }
  ASSERT_EQ(truth.size(), 40u);
  // Every round accepts its K drafts (the truth) until the poisoned token: round r's pending token is choice
  // (K + 1) * r, and choice j is fed as row j % (K + 1) of its round. Poison the first choice after round 0 that is
  // fed as row 2..K-1 (two choices of its round before the row with no choice, rows after it), is no id of the prompt
  // or of an earlier choice (so nothing reads its embedding before), and has no id 0 before it.
  std::vector<bool> seen(1000, false);
  for (int32_t t : prompt) seen[size_t(t)] = true;
  int j = -1;
  for (int i = 0; i < 30 && truth[size_t(i)] != 0; ++i) {
    const int32_t t = truth[size_t(i)];
    const int row = i % (K + 1);
    if (i > K && row > 1 && row < K && !seen[size_t(t)]) {
      j = i;
      break;
    }
    seen[size_t(t)] = true;
  }
  ASSERT_GE(j, 0) << "no choice to poison";
  const int32_t poison = truth[size_t(j)];
  SCOPED_TRACE("poisoned choice " + std::to_string(j) + ", id " + std::to_string(poison));
  const std::vector<int32_t> before(truth.begin(), truth.begin() + j + 1);  // the poisoned token is chosen
  auto bad = make(with_nan_embedding_row("tiny-mtp", poison));
  const std::string want = no_finite_logit_error().what();

  {  // plain decoding
    auto s = bad->new_session(128);
    Generator g(*s, tok, nullptr);
    std::vector<int32_t> ids;
    EXPECT_EQ(run_to_error(g, request(0), ids), want);
    EXPECT_EQ(ids, before);
  }
  // Speculative: drafts = the truth, so the poisoned token is accepted inside its round and the next row has no choice.
  auto s = bad->new_session(128);
  Generator g(*s, tok, nullptr);
  std::vector<std::pair<int64_t, int>> rounds;  // (pending index, drafts)
  g.set_draft_hook([&](int64_t pending, int k, std::vector<int32_t>& drafts) {
    drafts.assign(truth.begin() + pending + 1, truth.begin() + pending + 1 + k);
    rounds.emplace_back(pending, k);
  });
  std::vector<int32_t> ids;
  EXPECT_EQ(run_to_error(g, request(K), ids), want);
  EXPECT_EQ(ids, before);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 0), 0);
  // The last round verified rows 0..K, and the row with no choice (the one fed the poisoned token) was in between.
  ASSERT_FALSE(rounds.empty());
  EXPECT_EQ(rounds.back().second, K);
  const int64_t row = j - rounds.back().first;
  EXPECT_GT(row, 0);
  EXPECT_LT(row, K);
}

}  // namespace lilac::testutil::genspec
