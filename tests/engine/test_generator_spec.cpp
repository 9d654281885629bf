// Generator with speculative decoding (draft_tokens > 0) on the CPU backend and fixtures/tiny-mtp: the
// output is plain decoding's, token for token and logprob for logprob, with the real MTP head and with
// injected drafts (the true continuation with errors, so that every acceptance length happens), with
// sampling, at the context limit, with small prefill chunks, end-of-turn ids in the drafts, stop strings,
// and across turns through the prefix cache (whose snapshots carry the head's cache); a round with a row that has no
// choice ends the generation as plain decoding does.
#include "spec_test_util.h"
#include "support/generator_spec.h"

TEST(GeneratorSpec, GreedyEqualsPlainWithTheHeadAndWithInjectedDrafts) {
  auto be = make_cpu_backend(tiny_mtp(), 1);
  for (int64_t chunk : {int64_t(2048), int64_t(5)}) {
    const int64_t session_chunk = chunk == 5 ? 3 : 256;  // prefill calls of 5 in chunks of 3
    auto s0 = be->new_session(128);
    dynamic_cast<cpu::CpuSession&>(*s0).set_prefill_chunk(session_chunk);
    Generator plain(*s0, tokenizer(), nullptr);
    auto r0 = request(prompt_of(23, 1), 48, 0);
    r0.prefill_chunk = chunk;
    const Outcome ref = run(plain, r0);
    ASSERT_EQ(ref.ids.size(), 48u);

    for (int K : {1, 4}) {
      auto s1 = be->new_session(128);
      dynamic_cast<cpu::CpuSession&>(*s1).set_prefill_chunk(session_chunk);
      Generator spec(*s1, tokenizer(), nullptr);
      auto r = r0;
      r.draft_tokens = K;
      const Outcome head = run(spec, r);  // the real (random) head: drafts almost never right
      expect_same(head, ref, "real head, K=" + std::to_string(K));
      EXPECT_GT(head.st.spec_rounds, 0);

      std::vector<int> planned;
      spec.set_draft_hook(truth_with_errors(ref.ids, K, &planned));
      const Outcome inj = run(spec, r);
      expect_same(inj, ref, "injected drafts, K=" + std::to_string(K));
      int64_t expect_acc = 0;
      std::vector<int> seen(size_t(K + 1), 0);
      for (int a : planned) {
        expect_acc += a;
        seen[size_t(a)]++;
      }
      EXPECT_EQ(inj.st.spec_accepted, expect_acc);
      for (int a = 0; a <= K; ++a) EXPECT_GT(seen[size_t(a)], 0) << "acceptance length " << a << ", K=" << K;
    }
  }
}

// Sampling with penalties: the same tokens as plain decoding for the seed, whatever the drafts.
TEST(GeneratorSpec, SamplingEqualsPlainForTheSeed) {
  auto be = make_cpu_backend(tiny_mtp(), 1);
  auto r0 = request(prompt_of(9, 2), 40, 0);
  r0.sampling.temperature = 0.9f;
  r0.sampling.top_p = 0.9f;
  r0.sampling.repetition_penalty = 1.2f;
  r0.sampling.frequency_penalty = 0.2f;
  r0.sampling.seed = 77;
  auto s0 = be->new_session(64);
  Generator plain(*s0, tokenizer(), nullptr);
  const Outcome ref = run(plain, r0);
  auto s1 = be->new_session(64);
  Generator spec(*s1, tokenizer(), nullptr);
  auto r = r0;
  r.draft_tokens = 3;
  expect_same(run(spec, r), ref, "real head");
  spec.set_draft_hook(truth_with_errors(ref.ids, 3));
  const Outcome inj = run(spec, r);
  expect_same(inj, ref, "injected drafts");
  EXPECT_GT(inj.st.spec_accepted, 0);
}

// logit_bias applies in the verify's choices as in plain steps: greedy and sampled, the tokens of plain decoding
// with the same biases (here a ban of plain greedy's first token and a boost of another).
TEST(GeneratorSpec, LogitBiasEqualsPlain) {
  auto be = make_cpu_backend(tiny_mtp(), 1);
  auto unbiased_sess = be->new_session(64);
  Generator unbiased(*unbiased_sess, tokenizer(), nullptr);
  const Outcome u = run(unbiased, request(prompt_of(11, 3), 24, 0));
  for (float temperature : {0.f, 0.8f}) {
    auto r0 = request(prompt_of(11, 3), 24, 0);
    r0.sampling.temperature = temperature;
    r0.sampling.seed = 5;
    r0.sampling.logit_bias = {{u.ids[0], -100.f}, {7, 3.f}};
    auto s0 = be->new_session(64);
    Generator plain(*s0, tokenizer(), nullptr);
    const Outcome ref = run(plain, r0);
    EXPECT_NE(ref.ids[0], u.ids[0]) << "the ban holds";
    auto s1 = be->new_session(64);
    Generator spec(*s1, tokenizer(), nullptr);
    auto r = r0;
    r.draft_tokens = 3;
    spec.set_draft_hook(truth_with_errors(ref.ids, 3));
    const Outcome inj = run(spec, r);
    expect_same(inj, ref, "injected drafts, temperature " + std::to_string(temperature));
    EXPECT_GT(inj.st.spec_accepted, 0);
  }
}

// prompt + max_tokens = the session's capacity: the last rounds draft less, nothing overflows.
TEST(GeneratorSpec, ContextLimitAndMaxTokens) {
  auto be = make_cpu_backend(tiny_mtp(), 1);
  for (int64_t max_tokens : {1, 2, 3, 7, 20}) {
    const auto prompt = prompt_of(11, 3);
    const int64_t cap = int64_t(prompt.size()) + max_tokens;
    auto s0 = be->new_session(cap);
    Generator plain(*s0, tokenizer(), nullptr);
    const Outcome ref = run(plain, request(prompt, max_tokens, 0));
    auto s1 = be->new_session(cap);
    Generator spec(*s1, tokenizer(), nullptr);
    spec.set_draft_hook(truth_with_errors(ref.ids, 4));
    const Outcome inj = run(spec, request(prompt, max_tokens, 4));
    expect_same(inj, ref, "max_tokens " + std::to_string(max_tokens));
    EXPECT_EQ(inj.st.finish, FinishReason::Length);
    EXPECT_LE(s1->length(), cap);
    EXPECT_EQ(spec.context().size(), plain.context().size());  // the same tokens were fed
  }
}

// End-of-turn ids: drafts are cut before one, so the session feeds exactly what plain decoding feeds;
// stop strings end the generation inside a round with the same text.
TEST(GeneratorSpec, StopIdsAndStopStrings) {
  auto be = make_cpu_backend(tiny_mtp(), 1);
  const auto prompt = prompt_of(15, 4);
  auto s0 = be->new_session(128);
  Generator plain(*s0, tokenizer(), nullptr);
  const Outcome free_run = run(plain, request(prompt, 40, 0));
  // Stop at the 12th generated token's id (it may occur earlier: then there).
  auto r0 = request(prompt, 40, 0);
  r0.stop_ids = {free_run.ids[11]};
  const Outcome ref = run(plain, r0);
  ASSERT_TRUE(ref.st.stopped_by_eos);
  auto s1 = be->new_session(128);
  Generator spec(*s1, tokenizer(), nullptr);
  spec.set_draft_hook(truth_with_errors(free_run.ids, 4));
  auto r = r0;
  r.draft_tokens = 4;
  const Outcome inj = run(spec, r);
  expect_same(inj, ref, "stop id");
  EXPECT_TRUE(inj.st.stopped_by_eos);
  EXPECT_EQ(spec.context(), plain.context());

  // A stop string: the text of plain decoding, cut at the same place.
  const std::vector<int32_t> two{free_run.ids[8], free_run.ids[9]};
  const std::string piece = tokenizer().decode(two);
  auto r2 = request(prompt, 40, 0);
  r2.stop_strings = {piece};
  const Outcome ref2 = run(plain, r2);
  auto r3 = r2;
  r3.draft_tokens = 4;
  spec.set_draft_hook(truth_with_errors(free_run.ids, 4));
  const Outcome inj2 = run(spec, r3);
  expect_same(inj2, ref2, "stop string");
  EXPECT_EQ(inj2.st.stop_string, ref2.st.stop_string);
}

// Two turns through the prefix cache: the second resumes from a snapshot (with the head's cache) and
// drafts with the real head at once; the tokens equal a fresh plain run of the second prompt.
TEST(GeneratorSpec, PrefixCacheCarriesTheHeadsCache) {
  auto be = make_cpu_backend(tiny_mtp(), 1);
  const int32_t boundary = 7;
  std::vector<int32_t> turn1 = {11, 200, 300, 400, boundary, 12, 500, 600, 700, 800, boundary, 13, 14};
  std::vector<int32_t> turn2 = {11, 200, 300, 400, boundary, 12, 500, 600, 700, 800, boundary, 15, 900, 99, boundary, 16};
  auto mk = [&](std::vector<int32_t> p, int spec) {
    auto r = request(std::move(p), 16, spec);
    r.boundary_token = boundary;
    r.use_cache = true;
    return r;
  };
  auto s1 = be->new_session(256);
  PrefixCache cache(size_t(64) << 20);
  Generator cached(*s1, tokenizer(), &cache);
  run(cached, mk(turn1, 3));
  const Outcome second = run(cached, mk(turn2, 3));
  EXPECT_EQ(second.st.cached_tokens, 11);
  EXPECT_GT(second.st.spec_drafted, 0);  // the restored head drafts

  auto s2 = be->new_session(256);
  Generator fresh(*s2, tokenizer(), nullptr);
  auto r = mk(turn2, 0);
  r.use_cache = false;
  expect_same(second, run(fresh, r), "second turn");
}

// A round with a row that has no choice ends the generation after the round's choices before it, as plain decoding
// does (tests/support/generator_spec.h says what is checked).
TEST(GeneratorSpec, ARowWithNoChoiceEndsTheGenerationAfterTheChoicesBeforeIt) {
  testutil::genspec::expect_a_row_with_no_choice_ends_the_generation_after_the_choices_before_it(
      [](std::shared_ptr<const ModelWeights> w) { return make_cpu_backend(std::move(w), 1); });
}
