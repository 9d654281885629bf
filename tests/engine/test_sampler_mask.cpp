// Host sampler with an allowed-token mask (constrained decoding): masked tokens are never chosen, the
// mask applies before penalties / temperature / top-k / top-p, logprobs stay the raw distribution's.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/sampler.h"

using namespace lilac;

namespace {

std::vector<uint32_t> mask_of(size_t vocab, std::initializer_list<int> allowed) {
  std::vector<uint32_t> m((vocab + 31) / 32, 0);
  for (int t : allowed) m[size_t(t) >> 5] |= 1u << (t & 31);
  return m;
}

}  // namespace

TEST(SamplerMask, GreedyTakesTheBestAllowedToken) {
  HostSampler s(40);
  s.begin(SamplingParams{}, {});
  std::vector<float> x(40, 0.f);
  x[3] = 9.f;   // best overall, masked
  x[35] = 2.f;  // best allowed (in the second word)
  x[7] = 1.f;
  const auto m = mask_of(40, {7, 35, 36});
  TokenChoice c = s.sample(x, m.data());
  EXPECT_EQ(c.token, 35);
  EXPECT_EQ(s.sample(x).token, 3);  // no mask: unconstrained again
}

TEST(SamplerMask, SamplingDrawsOnlyAllowedTokensInProportion) {
  // Allowed {1, 4}: p(1) = e^0 / (e^0 + e^1), whatever the huge masked logits are.
  std::vector<float> x = {10.f, 0.f, 9.f, 8.f, 1.f};
  const auto m = mask_of(5, {1, 4});
  SamplingParams p;
  p.temperature = 1.f;
  p.top_k = 3;  // counts allowed tokens only: both stay
  p.seed = 7;
  HostSampler s(5);
  s.begin(p, {});
  int n1 = 0, n4 = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    const int32_t t = s.sample(x, m.data()).token;
    ASSERT_TRUE(t == 1 || t == 4) << t;
    (t == 1 ? n1 : n4)++;
  }
  const double want = 1.0 / (1.0 + std::exp(1.0));
  EXPECT_NEAR(double(n1) / n, want, 0.01);  // 0.269; 20000 draws: sigma 0.003
  EXPECT_EQ(n1 + n4, n);
}

TEST(SamplerMask, TopPAndMinPWorkOnTheAllowedSet) {
  std::vector<float> x = {5.f, 1.f, 1.f, 0.f};
  const auto m = mask_of(4, {1, 2, 3});
  SamplingParams p;
  p.temperature = 1.f;
  p.top_p = 0.5f;  // among {1, 2, 3}: p = 0.42, 0.42, 0.16 -> {1, 2}
  for (uint64_t seed = 0; seed < 200; ++seed) {
    p.seed = seed;
    HostSampler s(4);
    s.begin(p, {});
    const int32_t t = s.sample(x, m.data()).token;
    EXPECT_TRUE(t == 1 || t == 2) << t;
  }
  std::vector<Candidate> d = truncated_distribution(std::vector<float>{-INFINITY, 2.f, -INFINITY, 1.f}, p);
  ASSERT_EQ(d.size(), 1u);  // top-p over {1, 3}: 0.73 >= 0.5
  EXPECT_EQ(d[0].token, 1);
}

TEST(SamplerMask, PenaltiesApplyAfterTheMask) {
  // Token 0 is allowed and seen (repetition penalty halves its positive logit): 4/2 = 2 < 3.
  std::vector<float> x = {4.f, 3.f, 10.f};
  const auto m = mask_of(3, {0, 1});
  SamplingParams p;
  p.repetition_penalty = 2.f;
  HostSampler s(3);
  const std::vector<int32_t> ctx = {0, 2};
  s.begin(p, ctx);
  EXPECT_EQ(s.sample(x, m.data()).token, 1);
}

TEST(SamplerMask, LogprobsAreTheRawDistributions) {
  std::vector<float> x = {2.f, 1.f, 0.f};
  const auto m = mask_of(3, {1});
  SamplingParams p;
  p.logprobs = true;
  p.top_logprobs = 2;
  HostSampler s(3);
  s.begin(p, {});
  TokenChoice c = s.sample(x, m.data());
  EXPECT_EQ(c.token, 1);
  const double lse = std::log(std::exp(2.0) + std::exp(1.0) + 1.0);
  EXPECT_NEAR(c.logprob, 1.0 - lse, 1e-5);
  ASSERT_EQ(c.top.size(), 2u);  // the model's two most likely, masked or not
  EXPECT_EQ(c.top[0].token, 0);
  EXPECT_NEAR(c.top[0].logprob, 2.0 - lse, 1e-5);
}

// A mask that allows no id of the vocabulary is an error of the generation (an InputError naming the constraint, as
// the CUDA backend's set_token_mask throws), whatever the logits, greedy or sampled: it took the raw argmax (a token
// the mask forbids), or id 0 when every logit was -inf. Bits past the vocabulary allow nothing.
TEST(SamplerMask, NoAllowedTokenIsAnError) {
  const float ninf = -std::numeric_limits<float>::infinity();
  const std::vector<std::vector<float>> rows = {{1.f, 5.f, 2.f}, {ninf, ninf, ninf}, {NAN, 0.f, NAN}};
  for (float t : {0.f, 0.7f})
    for (const auto& x : rows)
      for (uint32_t bits : {0u, 0b1000u, 0xfffffff8u}) {
        SCOPED_TRACE("temperature " + std::to_string(t) + ", mask " + std::to_string(bits) + ", logit 0 " +
                     std::to_string(x[0]));
        HostSampler s(3);
        SamplingParams p;
        p.temperature = t;
        s.begin(p, {});
        try {
          s.sample(x, &bits);
          ADD_FAILURE() << "no error";
        } catch (const InputError& e) {
          EXPECT_NE(std::string(e.what()).find("allows no token"), std::string::npos) << e.what();
        }
      }
}
