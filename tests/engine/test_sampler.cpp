// Host sampler: greedy, penalties, truncation and seeded draws against hand-computed distributions.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/sampler.h"

using namespace lilac;

namespace {
std::vector<float> logs(std::initializer_list<double> p) {
  std::vector<float> v;
  for (double x : p) v.push_back(float(std::log(x)));
  return v;
}
}  // namespace

TEST(Sampler, ArgmaxTiesToLowerId) {
  std::vector<float> x = {1.f, 3.f, 2.f, 3.f};
  EXPECT_EQ(argmax(x), 1);
  std::vector<float> y = {NAN, -1.f, -1.f};
  EXPECT_EQ(argmax(y), 1);
}

// A row of NaN logits (a model whose weights or activations are not finite) is an error, greedy or sampled, masked
// or not — it once returned id -1, and read the mask at index 2^27 with one; sampled rows with some NaN logits never
// draw those ids.
TEST(Sampler, NaNLogits) {
  const std::vector<float> nan4(4, NAN);
  for (float t : {0.f, 0.8f}) {
    SamplingParams p;
    p.temperature = t;
    p.seed = 3;
    HostSampler s(4);
    s.begin(p, {});
    EXPECT_THROW(s.sample(nan4), Error) << "temperature " << t;
    const uint32_t all = 0xFu;
    EXPECT_THROW(s.sample(nan4, &all), Error) << "temperature " << t;
  }
  SamplingParams p;
  p.temperature = 1.f;
  p.seed = 5;
  HostSampler s(4);
  s.begin(p, {});
  const std::vector<float> some = {NAN, 0.f, NAN, 0.f};
  for (int i = 0; i < 200; ++i) {
    const int32_t t = s.sample(some).token;
    EXPECT_TRUE(t == 1 || t == 3) << t;
  }
}

TEST(Sampler, WorksWithoutBeginAsGreedy) {
  HostSampler s(4);
  std::vector<float> x = {0.f, 1.f, 3.f, 2.f};
  EXPECT_EQ(s.sample(x).token, 2);
  EXPECT_EQ(s.sample(x).token, 2);
}

TEST(Sampler, GreedyAtTemperatureZero) {
  HostSampler s(5);
  SamplingParams p;  // temperature 0
  s.begin(p, {});
  std::vector<float> x = {0.f, 5.f, 5.f, 1.f, -2.f};
  EXPECT_EQ(s.sample(x).token, 1);
}

TEST(Sampler, TopK1IsGreedyForEverySeed) {
  std::vector<float> x = {0.1f, 0.3f, 0.29f, -1.f, 0.3f};
  for (uint64_t seed = 0; seed < 50; ++seed) {
    HostSampler s(5);
    SamplingParams p;
    p.temperature = 1.5f;
    p.top_k = 1;
    p.seed = seed;
    s.begin(p, {});
    EXPECT_EQ(s.sample(x).token, 1);
  }
}

TEST(Sampler, SameSeedSameDrawsAndFrequenciesMatchProbabilities) {
  const auto x = logs({0.5, 0.3, 0.2});
  SamplingParams p;
  p.temperature = 1.f;
  p.seed = 42;
  HostSampler a(3), b(3);
  a.begin(p, {});
  b.begin(p, {});
  int counts[3] = {0, 0, 0};
  const int N = 20000;
  for (int i = 0; i < N; ++i) {
    int t = a.sample(x).token;
    ASSERT_EQ(t, b.sample(x).token);
    counts[t]++;
  }
  // Binomial std at N = 20000 is about 0.0035; 5 sigma.
  EXPECT_NEAR(counts[0] / double(N), 0.5, 0.018);
  EXPECT_NEAR(counts[1] / double(N), 0.3, 0.018);
  EXPECT_NEAR(counts[2] / double(N), 0.2, 0.018);
  // Another seed gives another sequence.
  p.seed = 43;
  HostSampler c(3);
  c.begin(p, {});
  a.begin(SamplingParams{.temperature = 1.f, .seed = 42}, {});
  int differ = 0;
  for (int i = 0; i < 100; ++i) differ += a.sample(x).token != c.sample(x).token;
  EXPECT_GT(differ, 10);
}

TEST(Sampler, TemperatureSharpensAsComputedByHand) {
  SamplingParams p;
  p.temperature = 0.5f;  // p ∝ p^2 = 0.25, 0.09, 0.04
  auto d = truncated_distribution(logs({0.5, 0.3, 0.2}), p);
  ASSERT_EQ(d.size(), 3u);
  EXPECT_NEAR(d[0].prob, 0.25 / 0.38, 1e-6);
  EXPECT_NEAR(d[1].prob, 0.09 / 0.38, 1e-6);
  EXPECT_NEAR(d[2].prob, 0.04 / 0.38, 1e-6);
}

TEST(Sampler, TopPTopKMinPCuts) {
  const auto x = logs({0.05, 0.5, 0.15, 0.3});
  SamplingParams p;
  p.temperature = 1.f;
  p.top_p = 0.75f;  // 0.5 + 0.3 reaches it
  auto d = truncated_distribution(x, p);
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].token, 1);
  EXPECT_EQ(d[1].token, 3);
  EXPECT_NEAR(d[0].prob, 0.5 / 0.8, 1e-6);
  p.top_p = 1.f;
  p.min_p = 0.2f;  // threshold 0.1: drops the 0.05
  d = truncated_distribution(x, p);
  ASSERT_EQ(d.size(), 3u);
  EXPECT_EQ(d[2].token, 2);
  EXPECT_NEAR(d[2].prob, 0.15 / 0.95, 1e-6);
  p.min_p = 0.f;
  p.top_k = 3;
  d = truncated_distribution(x, p);
  ASSERT_EQ(d.size(), 3u);
  EXPECT_NEAR(d[0].prob, 0.5 / 0.95, 1e-6);
  // Sampling never leaves the kept set.
  HostSampler s(4);
  p.top_k = 0;
  p.min_p = 0.4f;  // threshold 0.2: keeps tokens 1 and 3
  p.seed = 7;
  s.begin(p, {});
  for (int i = 0; i < 500; ++i) {
    int t = s.sample(x).token;
    ASSERT_TRUE(t == 1 || t == 3) << t;
  }
}

TEST(Sampler, RepetitionPenaltyChangesArgmaxAsComputedByHand) {
  // Token 0 (2.0) is in the context: 2.0 / 1.25 = 1.6 < 1.9, so token 1 wins. Negative logits are
  // multiplied: token 2 at -1 becomes -1.25.
  std::vector<float> x = {2.f, 1.9f, -1.f};
  std::vector<float> y = x;
  SamplingParams p;
  p.repetition_penalty = 1.25f;
  std::vector<int32_t> seen = {0, 2};
  apply_penalties(y, p, seen, {});
  EXPECT_FLOAT_EQ(y[0], 1.6f);
  EXPECT_FLOAT_EQ(y[1], 1.9f);
  EXPECT_FLOAT_EQ(y[2], -1.25f);
  HostSampler s(3);
  std::vector<int32_t> ctx = {0, 0, 2};
  s.begin(p, ctx);
  EXPECT_EQ(s.sample(x).token, 1);
  // Token 1 is now generated too: 1.9 / 1.25 = 1.52 < 1.6, token 0 wins again.
  EXPECT_EQ(s.sample(x).token, 0);
}

TEST(Sampler, PresenceAndFrequencyPenaltiesOnGeneratedTokens) {
  std::vector<float> x = {3.f, 2.5f, 0.f};
  SamplingParams p;
  p.presence_penalty = 0.2f;
  p.frequency_penalty = 0.2f;
  HostSampler s(3);
  std::vector<int32_t> ctx = {1};  // context does not count for these
  s.begin(p, ctx);
  EXPECT_EQ(s.sample(x).token, 0);  // 3.0
  EXPECT_EQ(s.sample(x).token, 0);  // 3 - 0.2 - 0.2 = 2.6 > 2.5
  EXPECT_EQ(s.sample(x).token, 1);  // 3 - 0.2 - 0.4 = 2.4 < 2.5
  std::vector<float> y = x;
  std::unordered_map<int32_t, int> counts = {{0, 2}, {1, 1}};
  apply_penalties(y, p, {}, counts);
  EXPECT_FLOAT_EQ(y[0], 3.f - 0.2f - 0.4f);
  EXPECT_FLOAT_EQ(y[1], 2.5f - 0.2f - 0.2f);
  EXPECT_FLOAT_EQ(y[2], 0.f);
}

TEST(Sampler, LogprobsAreRawLogSoftmax) {
  const auto x = logs({0.1, 0.6, 0.3});
  SamplingParams p;
  p.logprobs = true;
  p.top_logprobs = 2;
  p.repetition_penalty = 3.f;  // penalties do not change the reported logprobs
  HostSampler s(3);
  std::vector<int32_t> ctx = {1};
  s.begin(p, ctx);
  TokenChoice c = s.sample(x);
  EXPECT_EQ(c.token, 2);  // 1 is penalised: log 0.6 * 3 < log 0.3
  EXPECT_NEAR(c.logprob, std::log(0.3), 1e-6);
  ASSERT_EQ(c.top.size(), 2u);
  EXPECT_EQ(c.top[0].token, 1);
  EXPECT_NEAR(c.top[0].logprob, std::log(0.6), 1e-6);
  EXPECT_EQ(c.top[1].token, 2);
  EXPECT_NEAR(c.top[1].logprob, std::log(0.3), 1e-6);
}

TEST(Sampler, RejectsBadParameters) {
  HostSampler s(3);
  SamplingParams p;
  p.temperature = -1.f;
  EXPECT_THROW(s.begin(p, {}), InputError);
  p = {};
  p.top_p = 0.f;
  EXPECT_THROW(s.begin(p, {}), InputError);
  p = {};
  p.top_logprobs = 21;
  EXPECT_THROW(s.begin(p, {}), InputError);
}

// logit_bias: added after the penalties, in greedy and sampled choices; a masked token stays masked; logprobs stay
// the raw distribution's; ids and values checked.
TEST(Sampler, LogitBias) {
  const std::vector<float> x = {3.f, 2.5f, 0.f, 1.f};
  SamplingParams p;
  p.logprobs = true;
  p.logit_bias = {{0, -1.f}};  // 2.0 < 2.5
  HostSampler s(4);
  s.begin(p, {});
  TokenChoice c = s.sample(x);
  EXPECT_EQ(c.token, 1);
  EXPECT_NEAR(c.logprob, double(x[1]) - std::log(std::exp(3.0) + std::exp(2.5) + 1.0 + std::exp(1.0)), 1e-6);
  p.logit_bias = {{2, 100.f}};  // forces token 2, greedy and sampled alike
  s.begin(p, {});
  EXPECT_EQ(s.sample(x).token, 2);
  p.temperature = 1.f;
  p.seed = 9;
  s.begin(p, {});
  for (int i = 0; i < 50; ++i) EXPECT_EQ(s.sample(x).token, 2);
  // A ban (-100) of the most likely token leaves it out of every draw.
  p.logit_bias = {{0, -100.f}};
  s.begin(p, {});
  for (int i = 0; i < 200; ++i) EXPECT_NE(s.sample(x).token, 0);
  // After the penalties: token 0 penalised to 3 - 0.5 = 2.5 ties token 1 (lower id wins) until the bias decides.
  p = {};
  p.presence_penalty = 0.5f;
  p.logit_bias = {{1, 0.25f}};
  s.begin(p, {});
  EXPECT_EQ(s.sample(x).token, 0);  // 3 vs 2.75
  EXPECT_EQ(s.sample(x).token, 1);  // 2.5 vs 2.75
  // A masked token stays masked whatever its bias.
  p = {};
  p.logit_bias = {{0, 100.f}};
  s.begin(p, {});
  const uint32_t allowed = 0b1110u;
  EXPECT_EQ(s.sample(x, &allowed).token, 1);
  // Bad ids and values.
  p = {};
  p.logit_bias = {{4, 1.f}};
  EXPECT_THROW(s.begin(p, {}), InputError);
  p.logit_bias = {{-1, 1.f}};
  EXPECT_THROW(s.begin(p, {}), InputError);
  p.logit_bias = {{1, 101.f}};
  EXPECT_THROW(s.begin(p, {}), InputError);
  p.logit_bias = {{1, NAN}};
  EXPECT_THROW(s.begin(p, {}), InputError);
}

// A temperature so small that 1 / t is not finite in float (a request may send 1e-39: it is in [0, 2]) made every
// probability NaN and drew the last candidate, the least likely token, every step. It is greedy now, its limit.
TEST(Sampler, ATinyTemperatureIsGreedy) {
  for (float t : {1e-39f, 1e-44f, 1e-31f}) {
    HostSampler s(4);
    SamplingParams p;
    p.temperature = t;
    p.seed = 3;
    s.begin(p, {});
    const std::vector<float> x = {5.f, 1.f, 0.5f, -3.f};
    for (int i = 0; i < 5; ++i) EXPECT_EQ(s.sample(x).token, 0) << t;
  }
  EXPECT_EQ(effective_sampling(SamplingParams{.temperature = 1e-29f}).temperature, 1e-29f);
}

// A row whose allowed logits are all -inf or NaN is an error of its generation, greedy or sampled, never a made-up id
// (sampler.h): before, a mask of such logits gave its first allowed id and a row of -inf logits without a mask gave id
// 0, where the CUDA sampler gave other ids or refused. A bias does not revive a -inf logit. The error names the logits
// (an Error), not the constraint.
TEST(Sampler, NoFiniteAllowedLogitIsAnError) {
  const float ninf = -std::numeric_limits<float>::infinity();
  struct Case {
    std::vector<float> x;
    uint32_t mask;  // 0: no mask
    const char* what;
  };
  const std::vector<Case> cases = {
      {{0.f, ninf, ninf, ninf}, 0b1100u, "allowed logits -inf, one other finite"},
      {{0.f, NAN, ninf, NAN}, 0b1110u, "allowed logits NaN and -inf"},
      {{ninf, ninf, ninf, ninf}, 0u, "every logit -inf, no mask"},
      {{NAN, ninf, NAN, ninf}, 0u, "every logit NaN or -inf, no mask"},
      {{NAN, NAN, NAN, NAN}, 0b1111u, "every logit NaN, every id allowed"},
  };
  for (const Case& c : cases)
    for (float t : {0.f, 1.f}) {
      SCOPED_TRACE(std::string(c.what) + ", temperature " + std::to_string(t));
      HostSampler s(4);
      SamplingParams p;
      p.temperature = t;
      p.seed = 9;
      p.repetition_penalty = 1.2f;
      p.logit_bias = {{2, 100.f}};
      s.begin(p, std::vector<int32_t>{1, 2});
      try {
        s.sample(c.x, c.mask ? &c.mask : nullptr);
        ADD_FAILURE() << "no error";
      } catch (const InputError& e) {
        ADD_FAILURE() << "an InputError: " << e.what();
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("finite logit"), std::string::npos) << e.what();
      }
    }
}
