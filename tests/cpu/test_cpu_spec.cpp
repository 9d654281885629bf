// Speculative decoding on the CPU backend (Session::draft / verify, ../shared/MODEL_MTP.md): verify rows
// are bit for bit one-token steps at every acceptance length 0..K (injected drafts: the true continuation
// with one error at a chosen place), also with penalties and sampling; the Gated DeltaNet / conv / KV
// rollback leaves exactly the one-by-one state; the context limit; the MTP head's own cache across
// prefill chunks and snapshots; a row with no choice ends the verify's choices; and a statistical test of the
// acceptance rule.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "cpu/cpu_backend.h"
#include "engine/sampler.h"
#include "model/weights.h"
#include "support/fixtures.h"
#include "support/draft_vocab.h"
#include "support/spec_stretch.h"

using namespace lilac;
using testutil::fixture;
using testutil::random_tokens;
using testutil::same_bits;
using testutil::same_choice;

namespace {

// Plain decoding: the choices (the first from sample()) and the logits current after each of them.
struct Reference {
  std::vector<TokenChoice> choices;
  std::vector<std::vector<float>> logits;  // logits[i]: current when choices[i] was made
};

Reference decode_plainly(Backend& be, const std::vector<int32_t>& prompt, const SamplingParams& sp, int64_t n,
                         int64_t max_len, int64_t chunk = 256) {
  Reference r;
  auto s = be.new_session(max_len);
  dynamic_cast<cpu::CpuSession&>(*s).set_prefill_chunk(chunk);
  s->prefill(prompt);
  s->begin_generation(sp, prompt);
  r.logits.push_back(s->logits());
  r.choices.push_back(s->sample());
  while (int64_t(r.choices.size()) < n) {
    r.choices.push_back(s->decode_step());
    r.logits.push_back(s->logits());
  }
  return r;
}

// Runs speculative rounds with drafts = the reference continuation, wrong at place `error(round)` (k or
// more: all right), and checks every choice and the logits after every round bit for bit. Returns the
// number of rounds per acceptance length.
std::vector<int> speculate_against(Backend& be, const std::vector<int32_t>& prompt, const SamplingParams& sp,
                                   const Reference& ref, int K, int64_t max_len, int64_t chunk,
                                   const std::function<int(int round)>& error) {
  const int64_t n = int64_t(ref.choices.size()), V = be.config().vocab_size;
  auto s = be.new_session(max_len);
  dynamic_cast<cpu::CpuSession&>(*s).set_prefill_chunk(chunk);
  s->prefill(prompt);
  s->begin_generation(sp, prompt);
  std::vector<TokenChoice> got{s->sample()};
  std::vector<int> lengths(static_cast<size_t>(K + 1), 0);
  for (int round = 0; int64_t(got.size()) < n; ++round) {
    const int64_t i = int64_t(got.size()) - 1;  // index of the pending token
    const int k = int(std::min<int64_t>(K, n - 2 - i));  // the choices fill places i + 1 .. i + k + 1 < n
    std::vector<int32_t> drafts;
    for (int j = 0; j < k; ++j) drafts.push_back(ref.choices[static_cast<size_t>(i + 1 + j)].token);
    const int e = error(round);
    if (e < k) drafts[static_cast<size_t>(e)] = (drafts[static_cast<size_t>(e)] + 1 + round % 7) % int32_t(V);
    const std::vector<TokenChoice> ch = s->verify(drafts);
    const int accepted = int(ch.size()) - 1;
    EXPECT_EQ(accepted, std::min(e, k)) << "round " << round;
    lengths[static_cast<size_t>(accepted)]++;
    for (const TokenChoice& c : ch) {
      const size_t at = got.size();
      EXPECT_TRUE(same_choice(c, ref.choices[at])) << "choice " << at << ": " << c.token << " vs " << ref.choices[at].token;
      got.push_back(c);
    }
    EXPECT_EQ(s->length(), int64_t(prompt.size()) + int64_t(got.size()) - 1);
    EXPECT_TRUE(same_bits(s->logits(), ref.logits[got.size() - 1])) << "logits after round " << round;
    if (::testing::Test::HasFailure()) break;
  }
  return lengths;
}

}  // namespace

// Greedy, every acceptance length 0..K, on all fixtures (tiny and tiny2 have no MTP head: verify needs none),
// with prefill chunks that end at various places.
TEST(CpuSpec, VerifyEqualsOneByOneAtEveryAcceptanceLength) {
  for (const char* fx : {"tiny", "tiny2", "tiny-mtp"}) {
    auto be = make_cpu_backend(fixture(fx), 2);
    const int64_t V = be->config().vocab_size;
    const auto prompt = random_tokens(29, V, 11);
    SamplingParams sp;
    sp.logprobs = true;
    sp.top_logprobs = 3;
    const int K = 4;
    for (int64_t chunk : {int64_t(256), int64_t(6)}) {
      const Reference ref = decode_plainly(*be, prompt, sp, 40, 100, chunk);
      auto lengths = speculate_against(*be, prompt, sp, ref, K, 100, chunk, [&](int round) { return round % (K + 2); });
      for (int a = 0; a <= K; ++a) EXPECT_GT(lengths[static_cast<size_t>(a)], 0) << fx << ": acceptance length " << a;
    }
  }
}

// Penalties and sampling: rows are chosen by the sampler in the state decode_step() would be in, with the
// same random draws, so the tokens equal plain decoding's for the same seed.
TEST(CpuSpec, SamplingAndPenaltiesGiveThePlainTokensForTheSeed) {
  auto be = make_cpu_backend(fixture("tiny-mtp"), 2);
  const int64_t V = be->config().vocab_size;
  const auto prompt = random_tokens(17, V, 3);
  for (uint64_t seed : {1u, 2u, 3u}) {
    SamplingParams sp;
    sp.temperature = 1.2f;
    sp.top_p = 0.95f;
    sp.top_k = 50;
    sp.repetition_penalty = 1.3f;
    sp.presence_penalty = 0.5f;
    sp.frequency_penalty = 0.3f;
    sp.seed = seed;
    sp.logprobs = true;
    const int K = 3;
    const Reference ref = decode_plainly(*be, prompt, sp, 30, 64);
    speculate_against(*be, prompt, sp, ref, K, 64, 256, [&](int round) { return (round + int(seed)) % (K + 1); });
  }
}

// An MTP head whose output is not a number (here its final norm is NaN: broken or badly converted mtp.* weights)
// drafts nothing, and the main model's tokens come as without speculation. Its argmax of -1 was drafted before: fed to
// the head's next forward (k >= 2) or to verify (k = 1), it failed the request with "token id -1 is outside the
// vocabulary".
TEST(CpuSpec, AHeadWithNonFiniteLogitsDraftsNothing) {
  auto w = std::make_shared<ModelWeights>(*fixture("tiny-mtp"));
  std::fill(w->mtp.norm.begin(), w->mtp.norm.end(), std::nanf(""));
  auto be = make_cpu_backend(w, 1);
  auto plain = make_cpu_backend(fixture("tiny-mtp"), 1);
  const int64_t V = be->config().vocab_size;
  const auto prompt = random_tokens(12, V, 5);
  SamplingParams sp;
  const Reference ref = decode_plainly(*plain, prompt, sp, 6, 64);
  for (int k : {1, 3}) {
    SCOPED_TRACE("k " + std::to_string(k));
    auto s = be->new_session(64);
    s->enable_drafting(true);
    s->prefill(prompt);
    s->begin_generation(sp, prompt);
    std::vector<TokenChoice> got{s->sample()};
    while (got.size() < ref.choices.size()) {
      std::vector<int32_t> drafts;
      ASSERT_NO_THROW(drafts = s->draft(k));
      EXPECT_TRUE(drafts.empty()) << drafts[0];
      std::vector<TokenChoice> ch;
      ASSERT_NO_THROW(ch = s->verify(drafts));
      for (const TokenChoice& c : ch) got.push_back(c);
    }
    for (size_t i = 0; i < ref.choices.size(); ++i) EXPECT_TRUE(same_choice(got[i], ref.choices[i])) << i;
  }
}

// A row with no choice in the middle of a verify (engine/sampler.h; here every logit NaN once a token whose embedding
// row is NaN has been fed): the choices before it, then one carrying the sampler's error (TokenChoice::error), and the
// session as decode steps leave it when the last of them throws there: that row fed, no token pending.
TEST(CpuSpec, ARowWithNoChoiceIsTheLastOfTheVerify) {
  auto good = make_cpu_backend(fixture("tiny-mtp"), 1);
  const int64_t V = good->config().vocab_size, P = 12;
  const auto prompt = random_tokens(P, V, 17);
  const Reference ref = decode_plainly(*good, prompt, SamplingParams{}, 12, 64);
  // The poisoned token: the first choice after the first that is new to the context (its embedding never read before).
  std::vector<bool> seen(static_cast<size_t>(V), false);
  for (int32_t t : prompt) seen[static_cast<size_t>(t)] = true;
  size_t j = 0;
  for (size_t i = 0; i + 3 < ref.choices.size() && j == 0; ++i) {
    const int32_t t = ref.choices[i].token;
    if (i >= 2 && !seen[static_cast<size_t>(t)]) j = i;
    seen[static_cast<size_t>(t)] = true;
  }
  ASSERT_GT(j, 0u) << "no choice to poison";
  auto bad = make_cpu_backend(testutil::with_nan_embedding_row("tiny-mtp", ref.choices[j].token), 1);
  const std::string want = no_finite_logit_error().what();
  auto start = [&] {
    auto s = bad->new_session(64);
    s->prefill(prompt);
    s->begin_generation(SamplingParams{}, prompt);
    EXPECT_EQ(s->sample().token, ref.choices[0].token);
    return s;
  };
  // Plain decoding: choices 1..j, then the step that feeds choice j throws.
  auto plain = start();
  for (size_t i = 1; i <= j; ++i) EXPECT_TRUE(same_choice(plain->decode_step(), ref.choices[i])) << i;
  try {
    plain->decode_step();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), want);
  }
  // One verify of drafts = choices 1..j+2: rows 0..j+2, row j (fed choice j) has no choice.
  auto s = start();
  std::vector<int32_t> drafts;
  for (size_t i = 1; i <= j + 2; ++i) drafts.push_back(ref.choices[i].token);
  const std::vector<TokenChoice> ch = s->verify(drafts);
  ASSERT_EQ(ch.size(), j + 1);
  for (size_t i = 0; i < j; ++i) {
    EXPECT_FALSE(ch[i].error) << i;
    EXPECT_TRUE(same_choice(ch[i], ref.choices[i + 1])) << i;
  }
  ASSERT_TRUE(ch[j].error);
  try {
    std::rethrow_exception(ch[j].error);
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), want);
  }
  EXPECT_EQ(s->length(), plain->length());
  EXPECT_EQ(s->length(), P + int64_t(j) + 1);
  EXPECT_THROW(s->decode_step(), Error);  // no token pending
  EXPECT_THROW(s->verify(drafts), Error);
}

// Drafts up to the last position of the context; one more does not fit: InputError, state unchanged.
TEST(CpuSpec, ContextLimit) {
  auto be = make_cpu_backend(fixture("tiny-mtp"), 2);
  const int64_t V = be->config().vocab_size, P = 10, max_len = 16;
  const auto prompt = random_tokens(P, V, 5);
  const Reference ref = decode_plainly(*be, prompt, SamplingParams{}, max_len - P + 1, max_len);
  auto s = be->new_session(max_len);
  s->enable_drafting(true);
  s->prefill(prompt);
  s->begin_generation(SamplingParams{}, prompt);
  EXPECT_EQ(s->sample().token, ref.choices[0].token);
  // Room for 6 more fed tokens: the pending one + at most 5 drafts.
  EXPECT_LE(s->draft(9).size(), 5u);
  std::vector<int32_t> too_many;
  for (int j = 1; j <= 6; ++j) too_many.push_back(ref.choices[static_cast<size_t>(j)].token);
  EXPECT_THROW(s->verify(too_many), InputError);
  EXPECT_EQ(s->length(), P);
  too_many.pop_back();
  const auto ch = s->verify(too_many);  // all right: 6 choices, the context is full
  ASSERT_EQ(ch.size(), 6u);
  for (size_t j = 0; j < ch.size(); ++j) EXPECT_EQ(ch[j].token, ref.choices[j + 1].token);
  EXPECT_EQ(s->length(), max_len);
  EXPECT_TRUE(s->draft(3).empty());
  EXPECT_TRUE(same_bits(s->logits(), ref.logits.back()));
}

// The head's cache follows the context whatever the prefill chunks (its rows run in multi-row passes at
// other places), and snapshots carry it: drafts after a restore are those of the session it came from.
TEST(CpuSpec, MtpCacheAcrossChunksAndSnapshots) {
  auto be = make_cpu_backend(fixture("tiny-mtp"), 2);
  const int64_t V = be->config().vocab_size;
  const auto prompt = random_tokens(150, V, 8);
  std::vector<float> rows_a(static_cast<size_t>(150 * V)), rows_b(rows_a.size());
  auto run = [&](int64_t chunk, std::vector<float>& rows) {
    auto s = be->new_session(200);
    dynamic_cast<cpu::CpuSession&>(*s).set_prefill_chunk(chunk);
    s->enable_drafting(true);
    s->set_draft_logits_sink([&](int64_t first, int64_t n, const float* lg) {
      std::copy(lg, lg + n * V, rows.begin() + first * V);
    });
    s->prefill(std::span(prompt).subspan(0, 100));
    s->prefill(std::span(prompt).subspan(100));
    s->begin_generation(SamplingParams{}, prompt);
    s->sample();
    return std::make_pair(std::move(s), s->draft(4));
  };
  auto [a, drafts_a] = run(256, rows_a);
  auto [b, drafts_b] = run(7, rows_b);
  ASSERT_EQ(drafts_a.size(), 4u);
  double worst = 0;
  for (size_t i = 0; i < rows_a.size(); ++i) worst = std::max(worst, double(std::abs(rows_a[i] - rows_b[i])));
  EXPECT_LT(worst, 1e-4);
  EXPECT_EQ(drafts_a, drafts_b);

  // Snapshot after the prompt, restore elsewhere: the same drafts; without drafting: none.
  auto s = be->new_session(200);
  s->enable_drafting(true);
  s->prefill(prompt);
  auto snap = s->snapshot();
  auto t = be->new_session(200);
  t->enable_drafting(true);
  t->prefill(random_tokens(20, V, 9));  // some other context first
  t->restore(*snap);
  t->begin_generation(SamplingParams{}, prompt);
  t->sample();
  EXPECT_EQ(t->draft(4), drafts_a);
  auto u = be->new_session(200);
  u->restore(*snap);
  u->begin_generation(SamplingParams{}, prompt);
  u->sample();
  EXPECT_TRUE(u->draft(4).empty());
  // Drafting turned on over a context it did not follow: nothing until reset.
  u->enable_drafting(true);
  EXPECT_TRUE(u->draft(4).empty());
  u->reset();
  u->prefill(prompt);
  u->begin_generation(SamplingParams{}, prompt);
  u->sample();
  EXPECT_EQ(u->draft(4), drafts_a);
}

// Pearson's statistic of `counts` against `expected` (same total), bins with expected < 5 pooled, and the
// 1e-4 critical value of its chi-square distribution (Wilson-Hilferty).
std::pair<double, double> chi_square(const std::vector<int>& counts, const std::vector<double>& expected) {
  double stat = 0, pooled_o = 0, pooled_e = 0;
  int bins = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (expected[i] < 5) {
      pooled_o += counts[i];
      pooled_e += expected[i];
      continue;
    }
    stat += (counts[i] - expected[i]) * (counts[i] - expected[i]) / expected[i];
    ++bins;
  }
  if (pooled_e > 0) {
    stat += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e;
    ++bins;
  }
  const double df = std::max(1, bins - 1), z = 3.719;
  const double crit = df * std::pow(1 - 2 / (9 * df) + z * std::sqrt(2 / (9 * df)), 3);
  return {stat, crit};
}

// The acceptance rule at temperature > 0, measured on the model: after a fixed context and pending token,
// one draft d. Over 2000 seeds the first choice must follow the model's (tempered) distribution p1 --
// d kept with probability p1(d) -- and, when d was kept, the second choice the distribution p2 after d.
TEST(CpuSpec, RejectionSamplingKeepsTheDistribution) {
  auto be = make_cpu_backend(fixture("tiny-mtp"), 1);
  const int64_t V = be->config().vocab_size;
  const auto prompt = random_tokens(12, V, 21);
  SamplingParams sp;
  sp.temperature = 0.7f;  // several tokens likely, the draft often right
  sp.top_k = 40;
  auto base = be->new_session(32);
  base->prefill(prompt);
  auto snap = base->snapshot();
  base->begin_generation(SamplingParams{}, prompt);
  const int32_t pending = base->sample().token;  // greedy: the same pending token in every trial
  auto probs = [&](const std::vector<int32_t>& fed) {
    auto s = be->new_session(32);
    s->restore(*snap);
    s->prefill(fed);
    std::vector<double> p(static_cast<size_t>(V), 0.0);
    for (const Candidate& c : truncated_distribution(s->logits(), sp)) p[static_cast<size_t>(c.token)] = c.prob;
    return p;
  };
  const std::vector<double> p1 = probs({pending});
  int32_t d = 0;
  for (int32_t t = 0; t < V; ++t)
    if (p1[static_cast<size_t>(t)] > p1[static_cast<size_t>(d)]) d = t;
  const std::vector<double> p2 = probs({pending, d});
  ASSERT_GT(p1[static_cast<size_t>(d)], 0.05);
  ASSERT_LT(p1[static_cast<size_t>(d)], 0.95);

  const int N = 2000;
  std::vector<int> first(static_cast<size_t>(V), 0), second(static_cast<size_t>(V), 0);
  int accepted = 0;
  auto s = be->new_session(32);
  for (int i = 0; i < N; ++i) {
    s->restore(*snap);
    s->begin_generation(SamplingParams{}, prompt);
    ASSERT_EQ(s->sample().token, pending);
    SamplingParams q = sp;
    q.seed = 1000 + uint64_t(i);
    s->begin_generation(q, prompt);  // a fresh sampler; the pending token stays
    const std::vector<int32_t> drafts{d};
    const auto ch = s->verify(drafts);
    first[static_cast<size_t>(ch[0].token)]++;
    if (ch.size() == 2) {
      ++accepted;
      second[static_cast<size_t>(ch[1].token)]++;
    } else {
      EXPECT_NE(ch[0].token, d);
    }
  }
  const double pd = p1[static_cast<size_t>(d)];
  EXPECT_LT(std::abs(accepted - N * pd), 4 * std::sqrt(N * pd * (1 - pd))) << accepted << " of " << N << ", p(d) " << pd;
  std::vector<double> e1(p1.size()), e2(p2.size());
  for (size_t t = 0; t < p1.size(); ++t) e1[t] = N * p1[t];
  for (size_t t = 0; t < p2.size(); ++t) e2[t] = accepted * p2[t];
  auto [x1, c1] = chi_square(first, e1);
  EXPECT_LT(x1, c1) << "first choice";
  auto [x2, c2] = chi_square(second, e2);
  EXPECT_LT(x2, c2) << "second choice after an accepted draft";
}

// Batched decode steps (Backend::decode_batch) keep a drafting session's MTP head in step: after plain
// batched steps, the drafts are those of a session stepped alone.
TEST(CpuSpec, BatchedStepsFeedTheMtpHead) {
  auto be = make_cpu_backend(fixture("tiny-mtp"), 2);
  const int64_t V = be->config().vocab_size;
  const auto prompt = random_tokens(21, V, 13);
  auto start = [&] {
    auto s = be->new_session(64);
    s->enable_drafting(true);
    s->prefill(prompt);
    s->begin_generation(SamplingParams{}, prompt);
    s->sample();
    return s;
  };
  auto alone = start();
  for (int i = 0; i < 5; ++i) alone->decode_step();
  const auto want = alone->draft(3);
  ASSERT_EQ(want.size(), 3u);
  auto b = start(), c = start();
  std::vector<Session*> both{b.get(), c.get()};
  for (int i = 0; i < 5; ++i) be->decode_batch(both);
  EXPECT_EQ(b->draft(3), want);
  EXPECT_EQ(c->draft(3), want);
}

// Plain stretches up to 256 steps under the adaptive policy (the head follows in 64-row passes meanwhile),
// then drafting again: plain decoding's tokens, and the head's drafts after every stretch equal those of a
// head that drafted at every step (tests/support/spec_stretch.h).
TEST(CpuSpec, HeadAfterLongPlainStretchesDraftsAsIfDraftingEveryStep) {
  auto be = make_cpu_backend(fixture("tiny-mtp"), 1);
  const int64_t V = be->config().vocab_size;
  const auto prompt = random_tokens(23, V, 31);
  const std::vector<int32_t> truth = testutil::plain_greedy_tokens(*be, prompt, 600, 640);
  testutil::expect_head_exact_after_stretches(testutil::run_plain_stretches(*be, prompt, truth, 300, 3), truth);
}

// A draft vocabulary (--draft-vocab, Session::set_draft_vocab) cut below the head's own first draft: drafts below the
// cut, the same as the argmax of whole rows over the ids below it, and plain decoding's tokens
// (tests/support/draft_vocab.h); the backend's setting reaches the sessions it creates.
TEST(CpuSpec, ADraftVocabularyKeepsTheDraftsBelowItAndTheOutputPlain) {
  auto be = make_cpu_backend(fixture("tiny-mtp"), 1);
  testutil::expect_draft_vocab_cut(*be, random_tokens(19, be->config().vocab_size, 41));
}
