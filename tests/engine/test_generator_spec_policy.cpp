// The adaptive draft policy (engine/spec_policy.h) inside the Generator, on the CPU backend and
// fixtures/tiny-mtp with injected drafts: the tokens are plain decoding's whatever the policy does (greedy
// and seeded sampling; policies in many states, including one timed by an erratic clock); the policy
// follows easy and hard stretches of the text (deep rounds where drafts are right, plain steps and sparse
// probes where they are wrong); and the MTP head survives long plain stretches: after them it drafts
// exactly what a head that drafted at every step drafts.
#include <map>

#include "spec_test_util.h"

namespace {

// Costs of a GPU-like backend, not timed: speculation pays when drafts are right, so the policy's choices
// depend on the acceptance only.
void gpu_like(Generator& g, SpecPolicy::Options o = {}) {
  o.measure = false;
  g.spec_policy().set_options(o);
  g.spec_policy().set_cost_hint({0.12, 0.4});
}

GenerationRequest adaptive(std::vector<int32_t> prompt, int64_t max_tokens, int K) {
  GenerationRequest r = request(std::move(prompt), max_tokens, K);
  r.spec_policy = SpecPolicyKind::Adaptive;
  return r;
}

// Drafts right where the output index is in an easy stretch, wrong elsewhere. Records the k asked and the
// head's own drafts per pending index.
struct Zones {
  std::vector<int32_t> truth;
  std::function<bool(int64_t)> easy;
  std::map<int64_t, int> asked;                     // pending index -> k
  std::map<int64_t, std::vector<int32_t>> head;     // pending index -> the head's drafts
  DraftHook hook() {
    return [this](int64_t i, int k, std::vector<int32_t>& drafts) {
      asked[i] = k;
      head[i] = drafts;
      drafts.clear();
      for (int j = 0; j < k; ++j) {
        const int64_t at = i + 1 + j;
        const int32_t t = at < int64_t(truth.size()) ? truth[size_t(at)] : 0;
        drafts.push_back(easy(at) ? t : (t + 3) % 1000);
      }
    };
  }
  int rounds_in(int64_t a, int64_t b) const {
    int n = 0;
    for (const auto& [i, k] : asked) n += i >= a && i < b;
    return n;
  }
  int max_k_in(int64_t a, int64_t b) const {
    int m = 0;
    for (const auto& [i, k] : asked)
      if (i >= a && i < b) m = std::max(m, k);
    return m;
  }
};

}  // namespace

// Easy, hard, easy: deep rounds, then plain steps with sparse probes, then deep rounds again; greedy tokens
// and logprobs exactly plain decoding's.
TEST(GeneratorSpecPolicy, FollowsEasyAndHardStretchesGreedyExact) {
  auto be = make_cpu_backend(tiny_mtp(), 1);
  const auto prompt = prompt_of(23, 5);
  auto s0 = be->new_session(256);
  Generator plain(*s0, tokenizer(), nullptr);
  const Outcome ref = run(plain, request(prompt, 150, 0));
  ASSERT_EQ(ref.ids.size(), 150u);

  auto s1 = be->new_session(256);
  Generator spec(*s1, tokenizer(), nullptr);
  gpu_like(spec);
  Zones z{ref.ids, [](int64_t i) { return i < 30 || i >= 90; }};
  spec.set_draft_hook(z.hook());
  const Outcome out = run(spec, adaptive(prompt, 150, 3));
  expect_same(out, ref, "adaptive, easy/hard/easy");
  EXPECT_EQ(out.st.decode_steps, 149 - out.st.spec_accepted);
  EXPECT_EQ(z.max_k_in(0, 30), 3);                 // deep while drafts are right
  EXPECT_LE(z.rounds_in(40, 90), 4);               // hard: probes only (gaps 4, 8, 16, 32)
  EXPECT_GE(out.st.decode_steps - out.st.spec_rounds, 40);  // plain steps
  EXPECT_EQ(z.max_k_in(110, 150), 3);              // recovered
  EXPECT_GE(z.rounds_in(110, 150), 8);
}

// Seeded sampling with penalties: the same tokens as plain decoding through the same stretches.
TEST(GeneratorSpecPolicy, SamplingExactThroughStretches) {
  auto be = make_cpu_backend(tiny_mtp(), 1);
  auto r0 = request(prompt_of(9, 6), 100, 0);
  r0.sampling.temperature = 0.8f;
  r0.sampling.top_k = 40;
  r0.sampling.presence_penalty = 0.3f;
  r0.sampling.seed = 1234;
  auto s0 = be->new_session(160);
  Generator plain(*s0, tokenizer(), nullptr);
  const Outcome ref = run(plain, r0);
  auto s1 = be->new_session(160);
  Generator spec(*s1, tokenizer(), nullptr);
  gpu_like(spec);
  Zones z{ref.ids, [](int64_t i) { return (i / 25) % 2 == 0; }};
  spec.set_draft_hook(z.hook());
  auto r = r0;
  r.draft_tokens = 4;
  r.spec_policy = SpecPolicyKind::Adaptive;
  const Outcome out = run(spec, r);
  expect_same(out, ref, "adaptive sampling");
  EXPECT_GT(out.st.spec_accepted, 0);
  EXPECT_GT(out.st.decode_steps, out.st.spec_rounds);
}

// The policy in many states -- optimistic, pessimistic, probing every step with deep probes, fixed, and
// timed by an erratic clock (its choices then follow noise) -- never changes a token.
TEST(GeneratorSpecPolicy, AnyPolicyStateGivesPlainTokens) {
  auto be = make_cpu_backend(tiny_mtp(), 1);
  const auto prompt = prompt_of(17, 7);
  auto s0 = be->new_session(128);
  Generator plain(*s0, tokenizer(), nullptr);
  auto greedy = request(prompt, 60, 0);
  auto sampled = greedy;
  sampled.sampling.temperature = 1.0f;
  sampled.sampling.seed = 99;
  const Outcome ref_g = run(plain, greedy), ref_s = run(plain, sampled);

  for (int variant = 0; variant < 5; ++variant) {
    auto s1 = be->new_session(128);
    Generator spec(*s1, tokenizer(), nullptr);
    SpecPolicy::Options o;
    SpecPolicyKind kind = SpecPolicyKind::Adaptive;
    if (variant == 0) o.prior_accept = 1.0;
    if (variant == 1) o.prior_accept = 0.0, o.probe_min = 1, o.probe_max = 2, o.probe_k = 3;
    if (variant == 2) kind = SpecPolicyKind::Fixed;
    if (variant <= 2) gpu_like(spec, o);
    if (variant == 3) {  // measured with an erratic clock
      auto t = std::make_shared<double>(0);
      auto rng = std::make_shared<uint64_t>(42);
      spec.spec_policy().set_clock([t, rng] {
        *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
        return *t += 1e-3 * double((*rng >> 33) % 1000 + 1);
      });
    }
    // variant 4: the defaults (the CPU reference's compute-bound prior, the steady clock)
    for (int sampling = 0; sampling < 2; ++sampling) {
      const Outcome& ref = sampling ? ref_s : ref_g;
      Zones z{ref.ids, [](int64_t i) { return (i / 7) % 3 != 1; }};
      spec.set_draft_hook(z.hook());
      auto r = sampling ? sampled : greedy;
      r.draft_tokens = 3;
      r.spec_policy = kind;
      expect_same(run(spec, r), ref, "variant " + std::to_string(variant) + (sampling ? " sampled" : " greedy"));
    }
  }
}

// A long stretch of plain steps (k = 0: the head only follows the context, in the CPU head's 64-row passes)
// neither breaks the MTP head nor changes it: every draft it makes afterwards equals the draft of a head
// that drafted at every step, and the tokens are plain decoding's.
TEST(GeneratorSpecPolicy, HeadSurvivesLongPlainStretch) {
  auto be = make_cpu_backend(tiny_mtp(), 1);
  const auto prompt = prompt_of(23, 8);
  const int64_t n = 230;
  auto s0 = be->new_session(300);
  Generator plain(*s0, tokenizer(), nullptr);
  const Outcome ref = run(plain, request(prompt, n, 0));

  // A: the real head's drafts at every step (fixed K = 2), recorded, not replaced.
  auto s1 = be->new_session(300);
  Generator every(*s1, tokenizer(), nullptr);
  std::map<int64_t, std::vector<int32_t>> head_a;
  every.set_draft_hook([&](int64_t i, int, std::vector<int32_t>& d) { head_a[i] = d; });
  expect_same(run(every, request(prompt, n, 2)), ref, "drafting every step");

  // B: adaptive; drafts wrong until index 140 (plain steps, probes 4..64 apart), right after.
  auto s2 = be->new_session(300);
  Generator adapt(*s2, tokenizer(), nullptr);
  gpu_like(adapt);
  Zones z{ref.ids, [](int64_t i) { return i >= 140; }};
  adapt.set_draft_hook(z.hook());
  const Outcome out = run(adapt, adaptive(prompt, n, 2));
  expect_same(out, ref, "adaptive");

  int64_t prev = -1, longest = 0, after_long = -1;
  for (const auto& [i, k] : z.asked) {
    if (prev >= 0 && i - prev > longest) longest = i - prev, after_long = i;
    prev = i;
  }
  EXPECT_GE(longest, 64);  // a plain stretch over a whole pass of the head
  ASSERT_GE(after_long, 0);
  EXPECT_GE(z.rounds_in(200, n), 10);  // drafting again
  int compared = 0;
  for (const auto& [i, d] : z.head) {
    ASSERT_EQ(int(d.size()), z.asked[i]) << "the head stopped drafting at " << i;
    const auto& a = head_a.at(i);
    const size_t m = std::min(a.size(), d.size());
    EXPECT_TRUE(std::equal(d.begin(), d.begin() + long(m), a.begin())) << "head drafts differ at " << i;
    compared += i >= after_long;
  }
  EXPECT_GE(compared, 10);
}
