// Scoring a prompt (GenerationRequest::prompt_logprobs: OpenAI completions' `echo` with `logprobs`): every
// prompt token's log-probability under the model, checked against the oracle's logits on the shared fixtures
// (the fp32 reference and the fast CPU path), against the logprobs of the same tokens when they were
// generated, and whatever state the session or the prefix cache holds.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "cpu/cpu_backend.h"
#include "cpufast/fast_backend.h"
#include "engine/generator.h"
#include "engine/perplexity.h"
#include "engine/sampler.h"
#include "support/fixtures.h"
#include "text/tokenizer.h"

using namespace lilac;

namespace {

using testutil::golden_seq;
using testutil::GoldenSeq;

// Runs `req` (prompt_logprobs set) and returns the prompt's scores; `tokens` gets the generated ids and
// `order` one letter per callback ('p': the scores, 't': a token).
std::vector<TokenChoice> score(Generator& g, GenerationRequest req, std::vector<TokenChoice>* tokens = nullptr,
                               std::string* order = nullptr, GenerationStats* stats = nullptr) {
  std::vector<TokenChoice> scores;
  bool called = false;
  req.on_prompt_logprobs = [&](std::vector<TokenChoice>&& s) {
    EXPECT_FALSE(called) << "the scores come once";
    called = true;
    scores = std::move(s);
    if (order) *order += 'p';
  };
  GenerationStats st = g.run(req, [&](const GeneratedToken& t) {
    if (t.id < 0) return true;
    if (tokens) tokens->push_back(t.choice);
    if (order) *order += 't';
    return true;
  });
  EXPECT_TRUE(called);
  if (stats) *stats = st;
  return scores;
}

GenerationRequest scoring_request(std::vector<int32_t> prompt, int top, int64_t max_tokens) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.prompt_logprobs = top;
  r.sampling.logprobs = true;
  r.sampling.top_logprobs = top;
  return r;
}

// The scores of `seq` of `fixture` against log_softmax of the oracle's logits: every token's logprob within
// `tol`, the top alternatives the oracle's where its top-1 is clear (margin >= 0.1).
void expect_oracle_scores(Backend& backend, const std::string& fixture, const std::string& seq, double tol) {
  const GoldenSeq g = golden_seq(fixture, seq);
  ASSERT_GE(g.tokens.size(), 2u);
  auto sess = backend.new_session(int64_t(g.tokens.size()) + 8);
  Generator gen(*sess, *testutil::qwen3_tokenizer(), nullptr);
  GenerationStats st;
  std::vector<TokenChoice> out;
  const std::vector<TokenChoice> s = score(gen, scoring_request(g.tokens, 3, 0), &out, nullptr, &st);
  EXPECT_TRUE(out.empty()) << "max_tokens 0 generates nothing";
  EXPECT_EQ(st.finish, FinishReason::Length);
  EXPECT_EQ(st.completion_tokens, 0);
  ASSERT_EQ(s.size(), g.tokens.size() - 1);
  double worst = 0;
  int checked_top = 0;
  for (size_t j = 0; j + 1 < g.tokens.size(); ++j) {
    EXPECT_EQ(s[j].token, g.tokens[j + 1]);
    const double want = double(token_logprob(g.row(j), g.tokens[j + 1]));
    worst = std::max(worst, std::abs(double(s[j].logprob) - want));
    ASSERT_EQ(s[j].top.size(), 3u);
    if (g.margin[j] >= 0.1f) {
      EXPECT_EQ(s[j].top[0].token, g.top1[j]) << "row " << j;
      ++checked_top;
    }
  }
  EXPECT_LE(worst, tol) << fixture << " " << seq;
  EXPECT_GT(checked_top, 0);
}

}  // namespace

TEST(ScoreToken, EqualsTokenLogprobAndTopLogprobs) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> level(0, 40);
  for (int vocab : {1, 5, 300}) {
    std::vector<float> logits(static_cast<size_t>(vocab));
    for (auto& x : logits) x = float(level(rng)) * 0.25f;  // many ties
    for (int n : {0, 1, 3, 20, 400}) {
      const int32_t tok = int32_t(rng() % uint32_t(vocab));
      const TokenChoice c = score_token(logits, tok, n);
      EXPECT_EQ(c.token, tok);
      EXPECT_TRUE(testutil::same_bits(c.logprob, token_logprob(logits, tok)));
      const std::vector<TokenLogprob> want = top_logprobs(logits, n);
      ASSERT_EQ(c.top.size(), want.size()) << "vocab " << vocab << " n " << n;
      // The order by a full sort: descending, ties to the lower id.
      std::vector<int32_t> ids(logits.size());
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i);
      std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return logits[size_t(a)] > logits[size_t(b)]; });
      ASSERT_EQ(want.size(), std::min<size_t>(size_t(n), ids.size()));
      for (size_t i = 0; i < want.size(); ++i) {
        EXPECT_EQ(c.top[i].token, want[i].token) << "vocab " << vocab << " n " << n << " i " << i;
        EXPECT_EQ(want[i].token, ids[i]) << "vocab " << vocab << " n " << n << " i " << i;
        EXPECT_TRUE(testutil::same_bits(c.top[i].logprob, want[i].logprob));
      }
    }
  }
}

// The fp32 reference computes the oracle's function (|dlogit| ~ 1e-5 on these fixtures): a logprob within
// twice the check-golden bound of the logits (1e-4 each side).
TEST(PromptScoring, CpuReferenceMatchesTheOracle) {
  auto be = make_cpu_backend(testutil::fixture("tiny"), 2);
  expect_oracle_scores(*be, "tiny", "seq2", 2e-4);
  auto be2 = make_cpu_backend(testutil::fixture("tiny2"), 2);
  expect_oracle_scores(*be2, "tiny2", "seq2", 2e-4);
}

// The fast CPU path's reduced precision: its check-golden bound on tiny's logits is 2e-3 (max |dlogit|,
// bench/BENCHMARKS.md), so a logprob within twice that.
TEST(PromptScoring, FastCpuMatchesTheOracle) {
  auto be = cpufast::make_fast_cpu_backend(testutil::fixture("tiny"), {.threads = 2});
  expect_oracle_scores(*be, "tiny", "seq2", 4e-3);
}

// Scoring never resumes from a state without logits: a session holding the prompt's start and a prefix-cache
// snapshot of it change nothing (the scores are a fresh session's, bit for bit), and the snapshot is still
// there for later generations.
TEST(PromptScoring, ComputesTheWholePromptWhateverIsCached) {
  auto be = make_cpu_backend(testutil::fixture("tiny"), 2);
  const std::vector<int32_t> prompt = testutil::random_tokens(40, be->config().vocab_size, 3);
  const int32_t boundary = prompt[20];
  auto fresh_sess = be->new_session(64);
  Generator fresh(*fresh_sess, *testutil::qwen3_tokenizer(), nullptr);
  GenerationRequest req = scoring_request(prompt, 2, 1);
  req.boundary_token = boundary;
  const std::vector<TokenChoice> want = score(fresh, req);
  ASSERT_EQ(want.size(), prompt.size() - 1);

  PrefixCache cache(size_t(64) << 20);
  auto sess = be->new_session(64);
  Generator gen(*sess, *testutil::qwen3_tokenizer(), &cache);
  GenerationRequest first;
  // up to the boundary at 20 (an exact resume point); its token is not fed: the session holds exactly the 21 tokens
  first.prompt.assign(prompt.begin(), prompt.begin() + 21);
  first.max_tokens = 1;
  first.boundary_token = boundary;
  gen.run(first, [](const GeneratedToken&) { return true; });
  ASSERT_GT(gen.reusable_prefix(req), 0) << "the session holds the prompt's start";
  ASSERT_TRUE(cache.lookup(prompt, int64_t(prompt.size()) - 1).has_value()) << "the cache holds a snapshot of it";
  GenerationStats st;
  const std::vector<TokenChoice> got = score(gen, req, nullptr, nullptr, &st);
  EXPECT_EQ(st.cached_tokens, 0);
  EXPECT_FALSE(st.cache_hit);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(testutil::same_choice(got[i], want[i])) << "position " << i + 1;
  // A later plain generation of the same prompt resumes from a snapshot as before.
  GenerationRequest again;
  again.prompt = prompt;
  again.max_tokens = 1;
  again.boundary_token = boundary;
  auto sess2 = be->new_session(64);
  Generator gen2(*sess2, *testutil::qwen3_tokenizer(), &cache);
  const GenerationStats st2 = gen2.run(again, [](const GeneratedToken&) { return true; });
  EXPECT_TRUE(st2.cache_hit);
  EXPECT_GT(st2.cached_tokens, 0);
}

// The tokens a greedy generation chose score, as part of a prompt, what the generation said they had; the
// scores come before the first generated token.
TEST(PromptScoring, GeneratedTokensScoreAsTheyWereSampled) {
  auto be = make_cpu_backend(testutil::fixture("tiny"), 2);
  const std::vector<int32_t> prompt = testutil::random_tokens(12, be->config().vocab_size, 5);
  auto sess = be->new_session(64);
  Generator gen(*sess, *testutil::qwen3_tokenizer(), nullptr);
  std::vector<TokenChoice> generated;
  std::string order;
  score(gen, scoring_request(prompt, 2, 6), &generated, &order);
  EXPECT_EQ(order, "ptttttt");
  ASSERT_EQ(generated.size(), 6u);
  std::vector<int32_t> whole = prompt;
  for (const TokenChoice& c : generated) whole.push_back(c.token);
  const std::vector<TokenChoice> s = score(gen, scoring_request(whole, 2, 0));
  ASSERT_EQ(s.size(), whole.size() - 1);
  for (size_t i = 0; i < generated.size(); ++i) {
    const TokenChoice& a = s[prompt.size() - 1 + i];
    const TokenChoice& b = generated[i];
    EXPECT_EQ(a.token, b.token);
    EXPECT_NEAR(a.logprob, b.logprob, 1e-4) << "generated token " << i;
    ASSERT_EQ(a.top.size(), b.top.size());
    EXPECT_EQ(a.top[0].token, b.token) << "greedy: the chosen token is the most likely";
    EXPECT_TRUE(testutil::same_bits(a.top[0].logprob, a.logprob)) << "one value for the token and its top entry";
  }
}

TEST(PromptScoring, RejectsWhatItCannotDo) {
  auto be = make_cpu_backend(testutil::fixture("tiny"), 1);
  auto sess = be->new_session(16);
  Generator gen(*sess, *testutil::qwen3_tokenizer(), nullptr);
  GenerationRequest r = scoring_request({1, 2, 3}, 21, 0);
  EXPECT_THROW(gen.run(r, [](const GeneratedToken&) { return true; }), InputError);
  r = scoring_request({1, 2, 3}, -1, 0);  // max_tokens 0 without scoring
  EXPECT_THROW(gen.run(r, [](const GeneratedToken&) { return true; }), InputError);
  r = scoring_request(std::vector<int32_t>(16, 1), 0, 0);  // the prompt fills the session
  EXPECT_THROW(gen.run(r, [](const GeneratedToken&) { return true; }), InputError);
  r = scoring_request(std::vector<int32_t>(15, 1), 0, 0);  // one place left: it fits
  EXPECT_EQ(score(gen, r).size(), 14u);
  r = scoring_request({7}, 1, 0);  // one token: nothing to score
  EXPECT_TRUE(score(gen, r).empty());
}

// perplexity (engine/perplexity.h): on a golden sequence scored whole (one window, from position 1), the oracle's
// perplexity from its logits; windows are independent (each a fresh state: its scores are the slice's alone).
TEST(PromptScoring, PerplexityIsTheOraclesOnTheFixtures) {
  for (const char* fx : {"tiny", "tiny2"}) {
    auto be = make_cpu_backend(testutil::fixture(fx), 2);
    const GoldenSeq g = golden_seq(fx, "seq2");
    const double want = testutil::oracle_perplexity(g);
    PerplexityOptions o;
    o.ctx = int64_t(g.tokens.size());
    o.first = 1;
    const PerplexityResult r = perplexity(*be, *testutil::qwen3_tokenizer(), g.tokens, o);
    ASSERT_EQ(r.windows.size(), 1u);
    EXPECT_EQ(r.scored, int64_t(g.tokens.size()) - 1);
    EXPECT_NEAR(r.ppl() / want, 1.0, 2e-4) << fx << ": " << r.ppl() << " vs the oracle's " << want;
    EXPECT_GT(r.stderr_ppl, 0.0);
  }
}

TEST(PromptScoring, PerplexityWindows) {
  auto be = make_cpu_backend(testutil::fixture("tiny"), 2);
  const std::vector<int32_t> toks = testutil::random_tokens(100, be->config().vocab_size, 11);
  PerplexityOptions o;
  o.ctx = 32;  // first: 16
  std::vector<int64_t> starts;
  const PerplexityResult r = perplexity(*be, *testutil::qwen3_tokenizer(), toks, o, [&](const PerplexityWindow& w, const PerplexityResult&) {
    starts.push_back(w.start);
  });
  EXPECT_EQ(starts, (std::vector<int64_t>{0, 32, 64}));  // 96..99 has no token past position 16
  EXPECT_EQ(r.scored, 3 * 16);
  EXPECT_EQ(r.tokens, 3 * 32);
  // Window 1 alone: the scores of tokens 32..63 as a prompt of their own, positions 16..31.
  auto sess = be->new_session(40);
  Generator gen(*sess, *testutil::qwen3_tokenizer(), nullptr);
  const std::vector<TokenChoice> s =
      score(gen, scoring_request(std::vector<int32_t>(toks.begin() + 32, toks.begin() + 64), 0, 0));
  double nll = 0;
  for (int pos = 16; pos < 32; ++pos) nll -= double(s[size_t(pos - 1)].logprob);
  EXPECT_DOUBLE_EQ(r.windows[1].nll, nll);
  // A short last window is scored when it reaches past `first`.
  o.first = 2;
  EXPECT_EQ(perplexity(*be, *testutil::qwen3_tokenizer(), toks, o).windows.size(), 4u);  // 96..99: positions 2, 3
  o.first = 32;
  EXPECT_THROW(perplexity(*be, *testutil::qwen3_tokenizer(), toks, o), InputError);
  o = {};
  o.ctx = 1;
  EXPECT_THROW(perplexity(*be, *testutil::qwen3_tokenizer(), toks, o), InputError);
  o = {};
  EXPECT_THROW(perplexity(*be, *testutil::qwen3_tokenizer(), std::vector<int32_t>(toks.begin(), toks.begin() + 28), o),
               InputError);  // ctx 512 scores from 256: 28 tokens leave nothing
}
