// Prompt scoring (GenerationRequest::prompt_logprobs, completions' echo, `lilac perplexity`) on the CUDA backend.
// By default (and always on the tiny fixtures, outside the prefill kernels' limits) a scored prompt runs through the
// decode step token by token, so the tokens a greedy generation chose score what the generation's own logprobs said
// (the same logits; the host's double log-sum-exp against the device's float one); a golden sequence's perplexity is
// the oracle's within check-golden's reduced-precision bound (1 %). logit_bias bans and forces tokens. On a
// real-width model with LILAC_CUDA_SCORE=prefill a scored prompt runs on the prefill kernels, its rows' logits from
// the LM head over the chunk's residual rows: the last row is the bits an unscored prefill leaves, and the state
// after it is the unscored prefill's. Skips without a GPU.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "core/error.h"
#include "cuda/cuda_backend.h"
#include "cuda/cuda_session.h"
#include "engine/generator.h"
#include "engine/perplexity.h"
#include "gpu_test.h"
#include "model/weights.h"
#include "support/fixtures.h"

using namespace lilac;

namespace {


GenerationStats run_scored(Generator& g, GenerationRequest req, std::vector<TokenChoice>& scores,
                           std::vector<TokenChoice>& generated) {
  req.on_prompt_logprobs = [&](std::vector<TokenChoice>&& s) { scores = std::move(s); };
  return g.run(req, [&](const GeneratedToken& t) {
    if (t.id >= 0) generated.push_back(t.choice);
    return true;
  });
}

}  // namespace

TEST(CudaPromptScoring, GeneratedTokensScoreAsTheyWereSampled) {
  NEED_GPU();
  auto be = cuda::make_cuda_backend(testutil::fixture("tiny"));
  auto sess = be->new_session(64);
  Generator gen(*sess, *testutil::qwen3_tokenizer(), nullptr);
  GenerationRequest req;
  req.prompt = testutil::random_tokens(12, be->config().vocab_size, 5);
  req.max_tokens = 6;
  req.sampling.logprobs = true;
  req.sampling.top_logprobs = 2;
  req.prompt_logprobs = 2;
  std::vector<TokenChoice> s0, generated;
  run_scored(gen, req, s0, generated);
  ASSERT_EQ(s0.size(), req.prompt.size() - 1);
  ASSERT_EQ(generated.size(), 6u);
  GenerationRequest whole = req;
  for (const TokenChoice& c : generated) whole.prompt.push_back(c.token);
  whole.max_tokens = 0;
  std::vector<TokenChoice> s, none;
  const GenerationStats st = run_scored(gen, whole, s, none);
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(st.finish, FinishReason::Length);
  ASSERT_EQ(s.size(), whole.prompt.size() - 1);
  for (size_t i = 0; i + 1 < req.prompt.size(); ++i) EXPECT_TRUE(testutil::same_choice(s[i], s0[i])) << i;
  for (size_t i = 0; i < generated.size(); ++i) {
    const TokenChoice& a = s[req.prompt.size() - 1 + i];
    EXPECT_EQ(a.token, generated[i].token);
    EXPECT_NEAR(a.logprob, generated[i].logprob, 1e-4) << "generated token " << i;
    ASSERT_FALSE(a.top.empty());
    EXPECT_EQ(a.top[0].token, generated[i].token) << "greedy: the most likely";
  }
}

TEST(CudaPromptScoring, PerplexityIsTheOraclesWithinTheReducedPrecisionBound) {
  NEED_GPU();
  for (const char* fx : {"tiny", "tiny2"}) {
    auto be = cuda::make_cuda_backend(testutil::fixture(fx));
    const testutil::GoldenSeq g = testutil::golden_seq(fx, "seq2");
    const double want = testutil::oracle_perplexity(g);
    PerplexityOptions o;
    o.ctx = int64_t(g.tokens.size());
    o.first = 1;
    const PerplexityResult r = perplexity(*be, *testutil::qwen3_tokenizer(), g.tokens, o);
    EXPECT_NEAR(r.ppl() / want, 1.0, 0.01) << fx << ": " << r.ppl() << " vs the oracle's " << want;
  }
}

// logit_bias through a session (the sampler kernels' order is test_sampling.cpp's): a ban of the greedy choice
// gives the runner-up with the raw distribution's logprob (the same bits as the unbiased step's alternative); a
// +100 forces a token at every step; the bias ends with its generation.
TEST(CudaPromptScoring, LogitBiasBansAndForces) {
  NEED_GPU();
  auto be = cuda::make_cuda_backend(testutil::fixture("tiny"));
  EXPECT_TRUE(be->supports_logit_bias());
  auto sess = be->new_session(64);
  const std::vector<int32_t> prompt = testutil::random_tokens(9, be->config().vocab_size, 3);
  SamplingParams p;
  p.logprobs = true;
  p.top_logprobs = 3;
  auto first = [&](const SamplingParams& sp) {
    sess->reset();
    sess->prefill(prompt);
    sess->begin_generation(sp, prompt);
    return sess->sample();
  };
  const TokenChoice plain = first(p);
  ASSERT_EQ(plain.top.size(), 3u);
  ASSERT_LT(plain.top[1].logprob, plain.top[0].logprob) << "a tie would make the runner-up ambiguous";
  SamplingParams ban = p;
  ban.logit_bias = {{plain.token, -100.f}};
  const TokenChoice banned = first(ban);
  EXPECT_EQ(banned.token, plain.top[1].token);
  EXPECT_TRUE(testutil::same_bits(banned.logprob, plain.top[1].logprob)) << "logprobs: the raw distribution's";
  SamplingParams force = p;
  const int32_t forced = plain.top[2].token == 5 ? 6 : 5;
  force.logit_bias = {{forced, 100.f}};
  EXPECT_EQ(first(force).token, forced);
  for (int i = 0; i < 4; ++i) {
    sess->advance();
    EXPECT_EQ(sess->sample().token, forced) << "step " << i;
  }
  EXPECT_EQ(first(p).token, plain.token) << "the next generation has no bias";
}

TEST(CudaPromptScoring, RealWidthPromptsAreScoredOnThePrefillKernels) {
  NEED_GPU();
  auto be = cuda::make_synthetic_cuda_backend(cuda::synthetic_config(4), 11);
  const int64_t V = be->config().vocab_size;
  const std::vector<int32_t> prompt = testutil::random_tokens(150, V, 9);  // rows in groups of 64, 64, 22
  auto a = be->new_session(256), b = be->new_session(256);
  setenv("LILAC_CUDA_SCORE", "prefill", 1);  // read by a session at its first scored chunk
  int64_t seen = 0;
  std::vector<float> last;
  const LogitsSink sink = [&](int64_t first, int64_t n, const float* lg) {
    EXPECT_EQ(first, seen) << "rows in order, none skipped";
    seen += n;
    if (seen == int64_t(prompt.size())) last.assign(lg + (n - 1) * V, lg + n * V);
  };
  a->prefill(prompt, &sink);
  unsetenv("LILAC_CUDA_SCORE");
  EXPECT_EQ(seen, int64_t(prompt.size()));
  EXPECT_EQ(dynamic_cast<cuda::CudaSession&>(*a).scored_prefills(), 1);
  b->prefill(prompt);
  EXPECT_TRUE(testutil::same_bits(last, b->logits())) << "the last row: the head's bits after an unscored prefill";
  EXPECT_TRUE(testutil::same_bits(a->logits(), b->logits()));
  SamplingParams greedy;
  a->begin_generation(greedy, prompt);
  b->begin_generation(greedy, prompt);
  for (int i = 0; i < 3; ++i) {
    const TokenChoice x = a->sample(), y = b->sample();
    EXPECT_EQ(x.token, y.token) << "step " << i;
    a->advance();
    b->advance();
    EXPECT_TRUE(testutil::same_bits(a->logits(), b->logits())) << "the state after the scored prefill, step " << i;
  }
}
