// Generator: prefix reuse gives the same tokens as a fresh prefill (with a deterministic fake backend
// whose output depends on the whole context, and with the real CPU backend on fixtures/tiny), stop
// conditions, cancellation and limits.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "engine/generator.h"
#include "fake_session.h"
#include "text/tokenizer.h"

#if __has_include("cpu/cpu_backend.h")
#include "cpu/cpu_backend.h"
#include "model/weights.h"
#define HAVE_CPU_BACKEND 1
#endif

namespace {

const lilac::Tokenizer& qwen3_tokenizer() {
  static std::unique_ptr<lilac::Tokenizer> t =
      lilac::Tokenizer::load(std::string(LILAC_SHARED_DIR) + "/fixtures/qwen3-tokenizer");
  return *t;
}

int32_t im_end() { return *qwen3_tokenizer().token_id("<|im_end|>"); }

std::vector<int32_t> encode(const std::string& s) { return qwen3_tokenizer().encode(s, true); }

std::vector<int32_t> run_collect(lilac::Generator& g, const lilac::GenerationRequest& r, lilac::GenerationStats* st,
                                 std::string* text = nullptr) {
  std::vector<int32_t> out;
  auto s = g.run(r, [&](const lilac::GeneratedToken& t) {
    if (t.id >= 0) out.push_back(t.id);
    if (text) *text += t.text;
    return true;
  });
  if (st) *st = s;
  return out;
}

const std::string kTurn1 =
    "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n"
    "<think>\n";  // like Qwen3.6: the next turn's history drops the reasoning, so this is not its prefix
const std::string kTurn2 = "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHello there<|im_end|>\n"
                           "<|im_start|>assistant\nHi.<|im_end|>\n<|im_start|>user\nAnd now?<|im_end|>\n"
                           "<|im_start|>assistant\n";

lilac::GenerationRequest request(const std::string& prompt, int64_t max_tokens = 40) {
  lilac::GenerationRequest r;
  r.prompt = encode(prompt);
  r.max_tokens = max_tokens;
  r.stop_ids = {im_end()};
  r.boundary_token = im_end();
  return r;
}

}  // namespace

TEST(Generator, ReusedPrefixGivesTheSameTokensAsAFreshPrefill) {
  Counters c1, c2;
  HashSession fresh_s(4096, im_end(), &c1), reuse_s(4096, im_end(), &c2);
  lilac::PrefixCache cache(1 << 20);
  lilac::Generator fresh(fresh_s, qwen3_tokenizer(), nullptr);
  lilac::Generator reuse(reuse_s, qwen3_tokenizer(), &cache);

  // Turn 1 on the caching generator: snapshots at both <|im_end|> boundaries (its end, inside the segment after the
  // last one, is not an exact resume point: exact_resume_point).
  lilac::GenerationStats st;
  auto r1 = request(kTurn1);
  auto out1 = run_collect(reuse, r1, &st);
  EXPECT_EQ(st.cached_tokens, 0);
  EXPECT_EQ(st.snapshots_taken, 2);
  EXPECT_EQ(cache.entries(), 2u);

  // Something unrelated in between so the session's own context is not a prefix of turn 2.
  auto other = request("<|im_start|>user\nunrelated<|im_end|>\n<|im_start|>assistant\n");
  run_collect(reuse, other, nullptr);

  auto r2 = request(kTurn2);
  auto out2 = run_collect(reuse, r2, &st);
  // Turn 2 shares turn 1's messages up to the user's <|im_end|>.
  auto boundary = encode("<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHello there<|im_end|>");
  EXPECT_EQ(st.cached_tokens, int64_t(boundary.size()));
  EXPECT_TRUE(st.cache_hit);
  EXPECT_EQ(st.prompt_tokens, int64_t(r2.prompt.size()));
  EXPECT_GE(c2.restores, 1);

  // The same prompts on a generator without a cache.
  EXPECT_EQ(run_collect(fresh, r1, nullptr), out1);
  auto fresh2 = run_collect(fresh, r2, &st);
  EXPECT_EQ(st.cached_tokens, 0);
  EXPECT_EQ(fresh2, out2);
  EXPECT_FALSE(out2.empty());
  // Repeating turn 2 resumes from its last boundary (the last token is always recomputed for its logits).
  auto again = run_collect(reuse, r2, &st);
  EXPECT_EQ(again, out2);
  EXPECT_EQ(st.cached_tokens, int64_t(encode(kTurn2.substr(0, kTurn2.rfind("<|im_end|>") + 10)).size()));
}

// The session's own context is resumed only where a fresh prefill would compute the same state: not the tokens
// decode steps fed (a decode step computes a token in another order than a prefill), and only up to an exact resume
// point of the next prompt (exact_resume_point).
TEST(Generator, ContinuesFromItsOwnContext) {
  Counters c;
  HashSession s(4096, im_end(), &c);
  lilac::Generator g(s, qwen3_tokenizer(), nullptr);
  lilac::GenerationStats st;
  auto r = request("<|im_start|>user\nabc", 3);
  r.stop_ids = {};
  auto out = run_collect(g, r, &st);
  ASSERT_EQ(out.size(), 3u);
  // The session now holds the prompt + the first two generated tokens (the last was never fed).
  EXPECT_EQ(g.context().size(), r.prompt.size() + 2);
  auto r2 = r;
  r2.prompt.insert(r2.prompt.end(), out.begin(), out.end());
  r2.prompt.push_back(100);
  r2.prefill_chunk = 1;  // every position a piece boundary: only the decode-fed tokens stand in the way
  EXPECT_EQ(g.reusable_prefix(r2), 0);
  c.prefilled = 0;
  auto out2 = run_collect(g, r2, &st);
  EXPECT_EQ(st.cached_tokens, 0);
  EXPECT_EQ(c.prefilled, int64_t(r2.prompt.size()));

  // A context that prefill alone computed (max_tokens 1: the choice is not fed) is resumed at an exact point.
  auto r3 = r;
  r3.max_tokens = 1;
  ASSERT_EQ(run_collect(g, r3, &st).size(), 1u);
  EXPECT_EQ(g.context().size(), r3.prompt.size());
  auto r4 = r2;
  c.prefilled = 0;
  auto out4 = run_collect(g, r4, &st);
  EXPECT_EQ(st.cached_tokens, int64_t(r3.prompt.size()));
  EXPECT_EQ(c.prefilled, int64_t(r4.prompt.size() - r3.prompt.size()));
  EXPECT_EQ(out4, out2);
  // ... but not where the next prompt's own prefill would not stop (default pieces: inside a segment).
  ASSERT_EQ(run_collect(g, r3, &st).size(), 1u);
  r4.prefill_chunk = 2048;
  EXPECT_EQ(g.reusable_prefix(r4), 0);

  Counters c3;
  HashSession s3(4096, im_end(), &c3);
  lilac::Generator g3(s3, qwen3_tokenizer(), nullptr);
  g3.run(request("<|im_start|>user\nzzz"), [](const lilac::GeneratedToken&) { return true; });
  EXPECT_EQ(run_collect(g3, r2, &st), out2);
  EXPECT_EQ(st.cached_tokens, 0);
}

TEST(Generator, StopsAtEosMaxTokensStopStringsAndCancellation) {
  Counters c;
  HashSession s(4096, im_end(), &c);
  lilac::Generator g(s, qwen3_tokenizer(), nullptr);
  lilac::GenerationStats st;

  // Find a prompt whose continuation hits eos within 200 tokens.
  std::vector<int32_t> out;
  std::string prompt;
  for (int i = 0; i < 50; ++i) {
    prompt = "<|im_start|>user\nq" + std::to_string(i) + "<|im_end|>\n<|im_start|>assistant\n";
    out = run_collect(g, request(prompt, 200), &st);
    if (st.stopped_by_eos) break;
  }
  ASSERT_TRUE(st.stopped_by_eos);
  EXPECT_EQ(st.finish, lilac::FinishReason::Stop);
  EXPECT_EQ(st.completion_tokens, int64_t(out.size()) + 1);  // the eos counts, its text is not emitted
  for (int32_t t : out) EXPECT_NE(t, im_end());

  // max_tokens
  auto r = request(prompt, 200);
  r.stop_ids = {};
  r.max_tokens = 7;
  out = run_collect(g, r, &st);
  EXPECT_EQ(st.finish, lilac::FinishReason::Length);
  EXPECT_EQ(out.size(), 7u);
  EXPECT_EQ(st.completion_tokens, 7);

  // Stop string: generate freely, then stop on a piece of that text.
  r.max_tokens = 30;
  std::string full;
  run_collect(g, r, &st, &full);
  ASSERT_GE(full.size(), 12u);
  std::string stop = full.substr(6, 4);
  size_t first = full.find(stop);
  r.stop_strings = {stop};
  std::string cut;
  run_collect(g, r, &st, &cut);
  EXPECT_EQ(st.finish, lilac::FinishReason::Stop);
  EXPECT_FALSE(st.stopped_by_eos);
  EXPECT_EQ(st.stop_string, stop);
  EXPECT_EQ(cut, full.substr(0, first));

  // Cancellation from the callback.
  r.stop_strings.clear();
  int n = 0;
  st = g.run(r, [&](const lilac::GeneratedToken&) { return ++n < 3; });
  EXPECT_EQ(st.finish, lilac::FinishReason::Cancelled);
  EXPECT_EQ(n, 3);
  // And from the flag, before anything is generated.
  std::atomic<bool> cancel{true};
  n = 0;
  st = g.run(r, [&](const lilac::GeneratedToken&) { return ++n > 0; }, &cancel);
  EXPECT_EQ(st.finish, lilac::FinishReason::Cancelled);
  EXPECT_EQ(n, 0);
}

TEST(Generator, RejectsPromptsThatDoNotFit) {
  Counters c;
  HashSession s(64, im_end(), &c);
  lilac::Generator g(s, qwen3_tokenizer(), nullptr);
  auto r = request(kTurn2, 60);
  EXPECT_THROW(g.run(r, [](const lilac::GeneratedToken&) { return true; }), lilac::InputError);
  r.max_tokens = 0;
  EXPECT_THROW(g.run(r, [](const lilac::GeneratedToken&) { return true; }), lilac::InputError);
  r.prompt.clear();
  r.max_tokens = 1;
  EXPECT_THROW(g.run(r, [](const lilac::GeneratedToken&) { return true; }), lilac::InputError);
  // Still usable afterwards.
  auto ok = request("<|im_start|>user\nhi", 4);
  ok.stop_ids = {};
  lilac::GenerationStats st;
  EXPECT_EQ(run_collect(g, ok, &st).size(), 4u);
}

#ifdef HAVE_CPU_BACKEND
// The real model: greedy continuation after resuming from a message-boundary snapshot equals the one
// after a fresh prefill of the whole prompt (fixtures/tiny; ids kept inside its 2048-token vocabulary).
TEST(Generator, CpuBackendReuseMatchesFreshPrefill) {
  std::string dir = std::string(LILAC_SHARED_DIR) + "/fixtures/tiny/mlx4";
  if (!std::filesystem::exists(dir)) GTEST_FAIL() << "missing fixture " << dir;
  auto w = lilac::load_model(dir, {.progress = false});
  auto backend = lilac::make_cpu_backend(w, 2);
  const int32_t boundary = 7;  // plays the role of <|im_end|>
  auto mk = [&](std::vector<int32_t> prompt) {
    lilac::GenerationRequest r;
    r.prompt = std::move(prompt);
    r.max_tokens = 12;
    r.boundary_token = boundary;
    r.sampling.temperature = 0;
    return r;
  };
  std::vector<int32_t> turn1 = {11, 200, 300, 400, boundary, 12, 500, 600, 700, 800, boundary, 13, 14};
  std::vector<int32_t> turn2 = {11, 200, 300, 400, boundary, 12, 500, 600, 700, 800, boundary,
                                15, 900, 1000, 1100, boundary, 16, 17};

  auto s1 = backend->new_session(256);
  lilac::PrefixCache cache(size_t(64) << 20);
  lilac::Generator cached(*s1, qwen3_tokenizer(), &cache);
  lilac::GenerationStats st;
  run_collect(cached, mk(turn1), &st);
  EXPECT_EQ(st.snapshots_taken, 2);  // after each boundary (the end of the prompt is not an exact resume point)
  auto reused = run_collect(cached, mk(turn2), &st);
  EXPECT_EQ(st.cached_tokens, 11);
  ASSERT_EQ(reused.size(), 12u);

  auto s2 = backend->new_session(256);
  lilac::Generator fresh(*s2, qwen3_tokenizer(), nullptr);
  auto expect = run_collect(fresh, mk(turn2), &st);
  EXPECT_EQ(st.cached_tokens, 0);
  EXPECT_EQ(reused, expect);
}

using Scored = std::vector<std::pair<int32_t, float>>;  // generated ids and their log-probabilities

// A greedy request with log-probabilities, boundary token 7 (fixtures/tiny).
static lilac::GenerationRequest greedy_scored(std::vector<int32_t> prompt, int max_tokens) {
  lilac::GenerationRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.boundary_token = 7;
  r.sampling.temperature = 0;
  r.sampling.logprobs = true;
  return r;
}
static Scored run_scored(lilac::Generator& g, const lilac::GenerationRequest& r, lilac::GenerationStats& st) {
  Scored out;
  st = g.run(r, [&](const lilac::GeneratedToken& t) {
    if (t.id >= 0) out.emplace_back(t.id, t.choice.logprob);
    return true;
  });
  return out;
}

// Tokens and their log-probabilities, bit for bit.
static void expect_same_bits(const Scored& got, const Scored& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].first, want[i].first) << "token " << i;
    EXPECT_EQ(std::memcmp(&got[i].second, &want[i].second, sizeof(float)), 0)
        << "token " << i << " logprob " << got[i].second << " vs " << want[i].second;
  }
}

// A prompt-end snapshot (turn 1 ends inside a segment of turn 2, which extends it) restored by another session:
// turn 2 resumes at the boundary before it instead, and gives a fresh prefill's bits.
TEST(Generator, CpuBackendPromptEndSnapshotMatchesFreshPrefill) {
  std::string dir = std::string(LILAC_SHARED_DIR) + "/fixtures/tiny/mlx4";
  if (!std::filesystem::exists(dir)) GTEST_FAIL() << "missing fixture " << dir;
  auto w = lilac::load_model(dir, {.progress = false});
  auto backend = lilac::make_cpu_backend(w, 2);
  const auto mk = greedy_scored;
  const auto collect = run_scored;
  std::vector<int32_t> turn1 = {11, 200, 300, 400, 7, 12, 500, 600};
  lilac::PrefixCache cache(size_t(64) << 20);
  auto s1 = backend->new_session(256);
  lilac::Generator g1(*s1, qwen3_tokenizer(), &cache);
  lilac::GenerationStats st;
  collect(g1, mk(turn1, 4), st);
  std::vector<int32_t> turn2 = turn1;
  for (int32_t t : {13, 900, 1000, 1100, 1200, 14, 15}) turn2.push_back(t);
  auto s3 = backend->new_session(256);
  lilac::Generator g3(*s3, qwen3_tokenizer(), &cache);
  const auto resumed = collect(g3, mk(turn2, 24), st);
  EXPECT_EQ(st.cached_tokens, 5);  // after the boundary: turn 1's end (8) is inside a segment of turn 2
  auto s2 = backend->new_session(256);
  lilac::Generator g2(*s2, qwen3_tokenizer(), nullptr);
  const auto fresh = collect(g2, mk(turn2, 24), st);
  expect_same_bits(resumed, fresh);

  // Without boundaries (a completions prompt), in pieces of 4: turn 1's snapshot is at its last piece boundary (8 of
  // 10 tokens), where turn 2, which extends it, resumes.
  auto mk4 = [&](std::vector<int32_t> prompt) {
    auto r = mk(std::move(prompt), 16);
    r.boundary_token = -1;
    r.prefill_chunk = 4;
    return r;
  };
  lilac::PrefixCache cache4(size_t(64) << 20);
  std::vector<int32_t> t1 = {11, 200, 300, 400, 500, 600, 700, 800, 900, 1000};
  lilac::Generator h1(*s1, qwen3_tokenizer(), &cache4);
  collect(h1, mk4(t1), st);
  EXPECT_EQ(st.snapshots_taken, 1);
  std::vector<int32_t> t2 = t1;
  for (int32_t t : {13, 1100, 1200, 1300, 14}) t2.push_back(t);
  lilac::Generator h3(*s3, qwen3_tokenizer(), &cache4);
  const auto resumed4 = collect(h3, mk4(t2), st);
  EXPECT_EQ(st.cached_tokens, 8);
  const auto fresh4 = collect(g2, mk4(t2), st);
  EXPECT_EQ(st.cached_tokens, 0);
  expect_same_bits(resumed4, fresh4);
}

// The session's own context (the last prompt and the tokens it generated, which decode steps fed) resumed by the
// next request whose prompt extends it, against the same request prefilled fresh on another session: the same tokens
// and log-probabilities, bit for bit (fixtures/tiny, greedy with logprobs).
TEST(Generator, CpuBackendOwnContextMatchesFreshPrefill) {
  std::string dir = std::string(LILAC_SHARED_DIR) + "/fixtures/tiny/mlx4";
  if (!std::filesystem::exists(dir)) GTEST_FAIL() << "missing fixture " << dir;
  auto w = lilac::load_model(dir, {.progress = false});
  auto backend = lilac::make_cpu_backend(w, 2);
  auto mk = [](std::vector<int32_t> prompt) { return greedy_scored(std::move(prompt), 24); };
  const auto collect = run_scored;
  std::vector<int32_t> turn1 = {11, 200, 300, 400, 7, 12, 500, 600};
  auto s1 = backend->new_session(256);
  lilac::Generator g1(*s1, qwen3_tokenizer(), nullptr);
  lilac::GenerationStats st;
  const auto out1 = collect(g1, mk(turn1), st);
  ASSERT_EQ(out1.size(), 24u);
  std::vector<int32_t> turn2 = turn1;
  for (const auto& [id, lp] : out1) turn2.push_back(id);
  for (int32_t t : {13, 900, 1000, 7, 14}) turn2.push_back(t);
  const auto resumed = collect(g1, mk(turn2), st);
  EXPECT_EQ(st.cached_tokens, 0);  // decode steps fed the generated tokens: turn 2 is prefilled again

  auto s2 = backend->new_session(256);
  lilac::Generator g2(*s2, qwen3_tokenizer(), nullptr);
  const auto fresh = collect(g2, mk(turn2), st);
  EXPECT_EQ(st.cached_tokens, 0);
  expect_same_bits(resumed, fresh);
}
#endif
