// The sampling family (src/cuda/kernels/sampling/sampling.h): exact greedy argmax with ties to the
// lower id and log-probabilities against a host computation, the filters (top-k, top-p, min-p,
// penalties) and seeding, and the sampled distribution; a row with no finite logit. Fresh seed per run.
#include <gtest/gtest.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "cuda/kernels/sampling/sampling.h"
#include "decode_test_util.h"

using namespace lilac;
namespace lc = lilac::cuda;

namespace {

using namespace lilac::cuda::testing;

// ------------------------------------------------------------------------------------------------ sampling
struct SampleRig {
  int64_t V;
  Dev<float> logits;
  Dev<lc::SampleParamsDev> prm;
  Dev<int32_t> counts, slot;
  Dev<uint8_t> mask;
  Dev<char> scratch;
  Dev<lc::SampleResult> res;
  explicit SampleRig(int64_t v)
      : V(v), logits(static_cast<size_t>(v)), prm(1), counts(static_cast<size_t>(v)), slot(1), mask(static_cast<size_t>(v)),
        scratch(lc::sample_scratch_bytes(v)), res(1) {
    cudaMemset(counts.p, 0, size_t(v) * 4);
    cudaMemset(mask.p, 0, size_t(v));
  }
  lc::SampleResult run(const lc::SampleParamsDev& p) {
    prm.set({p});
    slot.poison();
    lc::sample_token(logits.p, V, prm.p, counts.p, mask.p, scratch.p, slot.p, res.p, nullptr);
    cudaDeviceSynchronize();
    return res.get()[0];
  }
};
lc::SampleParamsDev params(float t) {
  lc::SampleParamsDev p{};
  p.temperature = t;
  p.top_p = 1.f;
  p.repetition = 1.f;
  return p;
}

TEST(CudaDecode, GreedyArgmaxTiesAndLogprobs) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  Rng r(seed);
  const int64_t V = 248320 - 3;
  SampleRig rig(V);
  auto l = randv(r, size_t(V), 3.f);
  const int64_t a = int64_t(r.g() % V), b = int64_t(r.g() % V);
  l[size_t(a)] = l[size_t(b)] = 50.f;  // tie: the lower id wins
  rig.logits.set(l);
  auto p = params(0.f);
  p.logprobs = 1;
  p.top_logprobs = 5;
  const auto res = rig.run(p);
  EXPECT_EQ(res.token, int32_t(std::min(a, b))) << "seed " << seed;
  EXPECT_EQ(rig.slot.get()[0], res.token);
  double mx = -1e30, s = 0;
  for (float v : l) mx = std::max(mx, double(v));
  for (float v : l) s += std::exp(double(v) - mx);
  const double lse = mx + std::log(s);
  EXPECT_NEAR(res.logprob, l[size_t(res.token)] - lse, 1e-4);
  std::vector<int> order(static_cast<size_t>(V));
  for (int i = 0; i < V; ++i) order[size_t(i)] = i;
  std::partial_sort(order.begin(), order.begin() + 5, order.end(),
                    [&](int x, int y) { return l[size_t(x)] > l[size_t(y)] || (l[size_t(x)] == l[size_t(y)] && x < y); });
  ASSERT_EQ(res.n_top, 5);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(res.top_ids[i], order[size_t(i)]);
    EXPECT_NEAR(res.top_lp[i], l[size_t(order[size_t(i)])] - lse, 1e-4);
  }
  EXPECT_EQ(rig.counts.get()[size_t(res.token)], 1);
}

TEST(CudaDecode, SamplingFiltersAndSeeds) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng r(seed);
  const int64_t V = 5003;
  SampleRig rig(V);
  auto l = randv(r, size_t(V), 1.f);
  for (int i = 0; i < 5; ++i) l[size_t(100 * i + 7)] = 6.f - 0.5f * i;  // top 5: 7, 107, 207, 307, 407
  rig.logits.set(l);
  // top_k = 1 is greedy
  auto p = params(1.f);
  p.top_k = 1;
  p.seed = r.g();
  EXPECT_EQ(rig.run(p).token, 7);
  // top_k = 3: only the top three ever
  p.top_k = 3;
  std::vector<int> seen(V, 0);
  for (int i = 0; i < 200; ++i) {
    p.step = uint64_t(i);
    const int t = rig.run(p).token;
    ASSERT_TRUE(t == 7 || t == 107 || t == 207) << t;
    seen[size_t(t)]++;
  }
  EXPECT_GT(seen[107], 0);
  // same seed and step → same token; many steps spread
  p.top_k = 0;
  p.seed = 42;
  p.step = 3;
  const int t1 = rig.run(p).token;
  EXPECT_EQ(rig.run(p).token, t1);
  // top_p tiny → the argmax
  p.top_p = 1e-4f;
  EXPECT_EQ(rig.run(p).token, 7);
  // min_p = 0.5 with temperature 1: only tokens with p >= 0.5 p_max: 7 (6.0) and 107 (5.5; e^-0.5 = 0.61)
  p.top_p = 1.f;
  p.min_p = 0.5f;
  for (int i = 0; i < 50; ++i) {
    p.step = uint64_t(i);
    const int t = rig.run(p).token;
    ASSERT_TRUE(t == 7 || t == 107) << t;
  }
  // frequency penalty pushes the argmax away in greedy mode
  auto g = params(0.f);
  g.frequency = 10.f;
  std::vector<int32_t> counts(size_t(V), 0);
  counts[7] = 1;
  rig.counts.set(counts);
  EXPECT_EQ(rig.run(g).token, 107);
  // repetition penalty on a prompt token
  counts[7] = 0;
  rig.counts.set(counts);
  std::vector<uint8_t> mask(size_t(V), 0);
  mask[7] = 1;
  rig.mask.set(mask);
  g.frequency = 0.f;
  g.repetition = 1.2f;  // 6 / 1.2 = 5 < 5.5
  EXPECT_EQ(rig.run(g).token, 107);
}

TEST(CudaDecode, SamplingFollowsTheDistribution) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  Rng r(seed);
  const int64_t V = 1000;
  SampleRig rig(V);
  std::vector<float> l(size_t(V), -30.f);
  l[3] = std::log(0.5f);
  l[500] = std::log(0.3f);
  l[999] = std::log(0.2f);
  rig.logits.set(l);
  auto p = params(1.f);
  p.seed = r.g();
  std::vector<int> n(size_t(V), 0);
  const int N = 2000;
  for (int i = 0; i < N; ++i) {
    p.step = uint64_t(i);
    n[size_t(rig.run(p).token)]++;
  }
  EXPECT_NEAR(n[3] / double(N), 0.5, 0.05) << "seed " << seed;
  EXPECT_NEAR(n[500] / double(N), 0.3, 0.05);
  EXPECT_NEAR(n[999] / double(N), 0.2, 0.05);
}

// logit_bias (SampleParamsDev::bias, a dense row): added after the penalties and before the temperature, in
// greedy decoding too; a ban moves the choice, a force takes it, sampling follows the biased distribution, and
// logprobs stay the raw distribution's.
TEST(CudaDecode, LogitBiasAfterPenaltiesBeforeTemperature) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng r(seed);
  const int64_t V = 248320;
  SampleRig rig(V);
  auto l = randv(r, size_t(V), 1.f);
  l[7] = 9.f;
  l[107] = 8.f;
  l[207] = 7.5f;
  rig.logits.set(l);
  Dev<float> bias(static_cast<size_t>(V));
  std::vector<float> b(size_t(V), 0.f);
  auto g = params(0.f);
  g.logprobs = 1;
  g.bias = bias.p;
  bias.set(b);
  EXPECT_EQ(rig.run(g).token, 7) << "a zero row changes nothing";
  b[7] = -100.f;  // ban the argmax: the runner-up
  bias.set(b);
  lc::SampleResult res = rig.run(g);
  EXPECT_EQ(res.token, 107);
  double mx = -1e30, z = 0;
  for (float v : l) mx = std::max(mx, double(v));
  for (float v : l) z += std::exp(double(v) - mx);
  EXPECT_NEAR(res.logprob, l[107] - (mx + std::log(z)), 1e-4) << "logprobs: the raw distribution's";
  b[V - 1] = 100.f;  // force the last id
  bias.set(b);
  EXPECT_EQ(rig.run(g).token, int32_t(V - 1));
  b[V - 1] = 0.f;
  b[207] = 0.75f;  // 8.25 > 8: a small bias moves the choice
  bias.set(b);
  EXPECT_EQ(rig.run(g).token, 207);
  // after the penalties: a presence penalty of 1 on 207 (8.25 - 1 < 8) and then a bias of 2 on it again
  std::vector<int32_t> counts(size_t(V), 0);
  counts[207] = 1;
  rig.counts.set(counts);
  g.presence = 1.f;
  EXPECT_EQ(rig.run(g).token, 107);
  b[207] = 2.f;  // 7.5 - 1 + 2 = 8.5 > 8
  bias.set(b);
  EXPECT_EQ(rig.run(g).token, 207);
  rig.counts.set(std::vector<int32_t>(size_t(V), 0));
  // sampling: before the temperature, so at temperature 2 the two biased-equal tokens 107 and 207 (both 8 after
  // the bias; 7 banned) are drawn about equally and nothing else often
  std::fill(b.begin(), b.end(), 0.f);
  b[7] = -100.f;
  b[207] = 0.5f;
  bias.set(b);
  for (auto& v : l) v = std::min(v, 0.f);
  l[7] = 9.f;
  l[107] = 8.f;
  l[207] = 7.5f;
  rig.logits.set(l);
  auto p = params(2.f);
  p.bias = bias.p;
  p.top_k = 2;
  p.seed = r.g();
  int n107 = 0, n207 = 0;
  for (int i = 0; i < 400; ++i) {
    p.step = uint64_t(i);
    const int t = rig.run(p).token;
    ASSERT_TRUE(t == 107 || t == 207) << t;
    (t == 107 ? n107 : n207)++;
  }
  EXPECT_NEAR(n107 / 400.0, 0.5, 0.1);
}

// A row with no choice (engine/sampler.h's rule): every logit NaN, every logit -inf, or a mix, greedy and sampled, with
// a bias that does not revive a -inf logit: kNoFiniteLogit (the session throws the CPU sampler's error), the slot's
// next token 0 (in range for the next step), nothing counted, the step moved on. Every logit -inf gave id 0 before.
TEST(CudaDecode, NoFiniteLogitIsNoChoice) {
  NEED_GPU();
  const int64_t V = 5003;
  SampleRig rig(V);
  Dev<float> bias(std::vector<float>(size_t(V), 100.f));
  std::vector<float> mixed(size_t(V), NAN);
  for (int64_t i = 0; i < V; i += 3) mixed[size_t(i)] = -INFINITY;
  const std::vector<std::pair<const char*, std::vector<float>>> rows = {
      {"every logit NaN", std::vector<float>(size_t(V), NAN)},
      {"every logit -inf", std::vector<float>(size_t(V), -INFINITY)},
      {"NaN and -inf", mixed}};
  for (const auto& [what, l] : rows) {
    rig.logits.set(l);
    for (float t : {0.f, 0.8f})
      for (bool biased : {false, true}) {
        SCOPED_TRACE(std::string(what) + ", temperature " + std::to_string(t) + (biased ? ", biased" : ""));
        auto p = params(t);
        p.seed = 3;
        p.step = 7;
        p.logprobs = 1;
        p.top_logprobs = 3;
        if (biased) p.bias = bias.p;
        const lc::SampleResult res = rig.run(p);
        EXPECT_EQ(res.token, lc::kNoFiniteLogit);
        EXPECT_EQ(res.n_top, 0);
        EXPECT_EQ(rig.slot.get()[0], 0) << "the next token";
        EXPECT_EQ(rig.prm.get()[0].step, 8u);
        const auto c = rig.counts.get();
        EXPECT_EQ(std::count(c.begin(), c.end(), 0), V) << "counted tokens";
      }
  }
}

}  // namespace
