// Speculative decoding on the CUDA backend (Session::draft / verify, ../shared/MODEL_MTP.md): the MTP head's
// logits against the CPU reference on tiny-mtp; drafts independent of how the context was fed and carried
// by snapshots; verify with injected drafts at every acceptance length 0..K bit for bit plain decoding
// (greedy and sampling, across prefill pieces and at the context limit); greedy generation with the head's
// drafts identical to plain decoding; the head after long plain stretches (the adaptive policy's k = 0); a
// row with no choice ending the generation after the round's choices before it; the head on a real-width
// synthetic model. Skip without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "cuda/batch_step.h"
#include "cpu/cpu_backend.h"
#include "cuda/cuda_backend.h"
#include "cuda/cuda_session.h"
#include "decode_test_util.h"
#include "engine/speculative.h"
#include "model/weights.h"
#include "support/fixtures.h"
#include "support/generator_spec.h"
#include "support/draft_vocab.h"
#include "support/spec_stretch.h"

using namespace lilac;
using testutil::fixture;
using testutil::random_tokens;
using testutil::same_bits;
using testutil::same_choice;

namespace {

#define NEED_CUDA()                                                        \
  do {                                                                     \
    if (!cuda::gpu_available()) GTEST_SKIP() << "no CUDA GPU: none found"; \
  } while (0)

// Feeds the prompt in pieces of `piece` tokens (prefill boundaries at different places).
void prefill_in_pieces(Session& s, const std::vector<int32_t>& prompt, size_t piece) {
  for (size_t i = 0; i < prompt.size(); i += piece)
    s.prefill(std::span(prompt).subspan(i, std::min(piece, prompt.size() - i)));
}

struct Reference {
  std::vector<TokenChoice> choices;
  std::vector<std::vector<float>> logits;  // logits[i]: current when choices[i] was made
};

Reference decode_plainly(Backend& be, const std::vector<int32_t>& prompt, const SamplingParams& sp, int64_t n,
                         int64_t max_len, size_t piece) {
  Reference r;
  auto s = be.new_session(max_len);
  prefill_in_pieces(*s, prompt, piece);
  s->begin_generation(sp, prompt);
  r.logits.push_back(s->logits());
  r.choices.push_back(s->sample());
  while (int64_t(r.choices.size()) < n) {
    r.choices.push_back(s->decode_step());
    r.logits.push_back(s->logits());
  }
  return r;
}

int64_t g_rows_verifies = 0;  // verify steps the last speculate_against ran on the multi-row kernels

// Speculative rounds with drafts = the reference continuation, wrong at place error(round) (k or more: all
// right); every choice and the logits after every round must be the reference's bit for bit. At round
// `move_at` the state moves to a fresh session through a snapshot (the prefix cache's path). Returns the
// rounds per acceptance length.
std::vector<int> speculate_against(Backend& be, const std::vector<int32_t>& prompt, const SamplingParams& sp,
                                   const Reference& ref, int K, int64_t max_len, size_t piece, bool drafting,
                                   const std::function<int(int)>& error, int move_at = -1,
                                   const std::function<void(int)>& at_round = {}) {
  const int64_t n = int64_t(ref.choices.size()), V = be.config().vocab_size;
  g_rows_verifies = 0;
  auto count_rows = [&](Session& x) {
    if (auto* c = dynamic_cast<cuda::CudaSession*>(&x)) g_rows_verifies += c->rows_verifies();
  };
  auto s = be.new_session(max_len);
  s->enable_drafting(drafting);
  prefill_in_pieces(*s, prompt, piece);
  s->begin_generation(sp, prompt);
  std::vector<TokenChoice> got{s->sample()};
  std::vector<int> lengths(static_cast<size_t>(K + 1), 0);
  for (int round = 0; int64_t(got.size()) < n; ++round) {
    const int64_t i = int64_t(got.size()) - 1;
    const int k = int(std::min<int64_t>(K, n - 2 - i));
    if (at_round) at_round(round);
    if (round == move_at) {  // the sampler's state is not in a snapshot: only greedy continues bitwise
      auto t = be.new_session(max_len);
      t->enable_drafting(drafting);
      t->restore(*s->snapshot());
      t->begin_generation(sp, prompt);
      EXPECT_EQ(t->sample().token, got.back().token) << "after the move";
      count_rows(*s);
      s = std::move(t);
    }
    if (drafting && round % 3 == 0) s->draft(k);  // the head runs between steps: it must not change them
    std::vector<int32_t> drafts;
    for (int j = 0; j < k; ++j) drafts.push_back(ref.choices[static_cast<size_t>(i + 1 + j)].token);
    const int e = error(round);
    if (e < k) drafts[static_cast<size_t>(e)] = (drafts[static_cast<size_t>(e)] + 1 + round % 7) % int32_t(V);
    const std::vector<TokenChoice> ch = s->verify(drafts);
    const int accepted = int(ch.size()) - 1;
    EXPECT_EQ(accepted, std::min(e, k)) << "round " << round;
    if (accepted >= 0 && accepted <= K) lengths[static_cast<size_t>(accepted)]++;
    for (const TokenChoice& c : ch) {
      const size_t at = got.size();
      if (at >= ref.choices.size()) break;
      EXPECT_TRUE(same_choice(c, ref.choices[at])) << "choice " << at << ": " << c.token << " vs " << ref.choices[at].token;
      got.push_back(c);
    }
    EXPECT_EQ(s->length(), int64_t(prompt.size()) + int64_t(got.size()) - 1);
    EXPECT_TRUE(same_bits(s->logits(), ref.logits[got.size() - 1])) << "logits after round " << round;
    if (::testing::Test::HasFailure()) break;
  }
  count_rows(*s);
  return lengths;
}

}  // namespace

// The head's logits for every pair row (catch-up rows and the pending row of a draft) against the CPU
// reference (bf16 K/V like the GPU): the same tolerance as the main model's logits (test_cuda_backend.cpp),
// and the first draft is the argmax of the pending row's logits.
TEST(CudaMtp, HeadLogitsMatchCpuReference) {
  NEED_CUDA();
  auto w = fixture("tiny-mtp");
  ASSERT_TRUE(w->has_mtp());
  auto cpu_b = make_cpu_backend(w, 2);
  auto gpu_b = cuda::make_cuda_backend(w);
  const int64_t V = w->config.vocab_size, P = 150;  // more rows than the head's ring (128)
  const auto prompt = random_tokens(P, V, 8);
  auto run = [&](Backend& be, std::vector<float>& rows, bool kv_bf16) {
    auto s = be.new_session(256);
    if (kv_bf16) dynamic_cast<cpu::CpuSession&>(*s).set_kv_bf16(true);
    EXPECT_TRUE(s->can_draft());
    s->enable_drafting(true);
    rows.assign(static_cast<size_t>(P * V), NAN);
    s->set_draft_logits_sink([&](int64_t first, int64_t n, const float* lg) {
      ASSERT_LE(first + n, P);
      std::copy(lg, lg + n * V, rows.begin() + first * V);
    });
    prefill_in_pieces(*s, prompt, 100);
    s->begin_generation(SamplingParams{}, prompt);
    s->sample();
    return s->draft(3);
  };
  std::vector<float> cpu_rows, gpu_rows;
  const auto cpu_drafts = run(*cpu_b, cpu_rows, true);
  const auto gpu_drafts = run(*gpu_b, gpu_rows, false);
  ASSERT_EQ(gpu_drafts.size(), 3u);
  for (float v : gpu_rows) ASSERT_FALSE(std::isnan(v)) << "a pair row the GPU head did not deliver";
  // Per row, the main model's tolerance; at most 2 of the 150 rows may exceed it: a near-tie top-8 expert
  // choice of these random routers (the head's MoE, or the main model's under the hidden) can flip between
  // the two backends' roundings (test_cuda_backend.cpp).
  int over = 0;
  std::string worst;
  for (int64_t p = 0; p < P; ++p) {
    const std::vector<float> g(gpu_rows.begin() + p * V, gpu_rows.begin() + (p + 1) * V);
    const std::vector<float> r(cpu_rows.begin() + p * V, cpu_rows.begin() + (p + 1) * V);
    const double e = cuda::testing::rel_err(g, r);
    if (e > 3e-3) {
      ++over;
      worst += " " + std::to_string(p) + " (rel " + std::to_string(e) + ")";
    }
  }
  EXPECT_LE(over, 2) << "rows over 3e-3:" << worst;
  const float* last = gpu_rows.data() + (P - 1) * V;
  int32_t best = 0;
  for (int32_t t = 1; t < V; ++t)
    if (last[t] > last[best]) best = t;
  EXPECT_EQ(gpu_drafts[0], best);
  (void)cpu_drafts;  // the chain's later drafts may differ at near ties of these random weights
}

// Drafts do not depend on how the context was fed (prefill pieces, decode steps, verify rounds) and
// snapshots carry the head's cache; a snapshot taken without drafting, or drafting enabled late: none.
TEST(CudaMtp, DraftsAcrossPiecesStepsAndSnapshots) {
  NEED_CUDA();
  auto be = cuda::make_cuda_backend(fixture("tiny-mtp"));
  const int64_t V = be->config().vocab_size;
  const auto prompt = random_tokens(140, V, 4);
  auto start = [&](size_t piece) {
    auto s = be->new_session(256);
    s->enable_drafting(true);
    prefill_in_pieces(*s, prompt, piece);
    s->begin_generation(SamplingParams{}, prompt);
    s->sample();
    return s;
  };
  auto a = start(256), b = start(9);
  const auto da = a->draft(4);
  ASSERT_EQ(da.size(), 4u);
  EXPECT_EQ(b->draft(4), da);
  for (int i = 0; i < 5; ++i) {
    a->decode_step();
    b->decode_step();
  }
  const auto da2 = a->draft(4);
  EXPECT_EQ(b->draft(4), da2);

  auto s = be->new_session(256);
  s->enable_drafting(true);
  s->prefill(prompt);
  auto snap = s->snapshot();
  auto t = be->new_session(256);
  t->enable_drafting(true);
  t->prefill(random_tokens(20, V, 9));
  t->restore(*snap);
  t->begin_generation(SamplingParams{}, prompt);
  t->sample();
  EXPECT_EQ(t->draft(4), da);
  auto u = be->new_session(256);
  u->restore(*snap);
  u->begin_generation(SamplingParams{}, prompt);
  u->sample();
  EXPECT_TRUE(u->draft(4).empty());
  u->enable_drafting(true);
  EXPECT_TRUE(u->draft(4).empty());
  u->reset();
  u->prefill(prompt);
  u->begin_generation(SamplingParams{}, prompt);
  u->sample();
  EXPECT_EQ(u->draft(4), da);
}

// A catch-up row run without a logits sink computes only its K/V row of the head's cache (mtp_head.cu); with
// a sink it runs the whole row. The rows computed after the first ones must not see a difference: session b
// runs the 300-token prompt's first pairs without a sink (the ring overflows during the prefill), then gets a
// sink; every row it reports (the last catch-up rows and the draft's first row, which attend over the K/V rows
// written without a sink) is bit for bit session a's, whose rows all ran with the sink.
TEST(CudaMtp, CatchUpRowsWithoutASinkLeaveTheFullRowsKv) {
  NEED_CUDA();
  auto be = cuda::make_cuda_backend(fixture("tiny-mtp"));
  const int64_t V = be->config().vocab_size;
  const auto prompt = random_tokens(300, V, 5);
  using Rows = std::map<int64_t, std::vector<float>>;
  auto sink_into = [V](Rows& rows) {
    return LogitsSink([&rows, V](int64_t pos, int64_t n, const float* logits) {
      for (int64_t i = 0; i < n; ++i) rows[pos + i].assign(logits + i * V, logits + (i + 1) * V);
    });
  };
  Rows ra, rb;
  auto a = be->new_session(512), b = be->new_session(512);
  a->enable_drafting(true);
  b->enable_drafting(true);
  a->set_draft_logits_sink(sink_into(ra));
  a->prefill(prompt);
  b->prefill(prompt);
  b->set_draft_logits_sink(sink_into(rb));
  std::vector<int32_t> da, db;
  for (auto* s : {a.get(), b.get()}) {
    s->begin_generation(SamplingParams{}, prompt);
    s->sample();
  }
  da = a->draft(4);
  db = b->draft(4);
  ASSERT_EQ(da.size(), 4u);
  EXPECT_EQ(db, da);
  ASSERT_FALSE(rb.empty());
  ASSERT_LT(rb.size(), ra.size()) << "session b ran some catch-up rows without the sink";
  for (const auto& [pos, row] : rb) {
    ASSERT_TRUE(ra.count(pos)) << "position " << pos;
    EXPECT_EQ(std::memcmp(row.data(), ra[pos].data(), row.size() * sizeof(float)), 0) << "position " << pos;
  }
}

// Greedy, every acceptance length 0..K, prefill in one piece and in small pieces, with and without the
// head following the context (tiny has no head: verify needs none).
TEST(CudaSpec, VerifyEqualsOneByOneAtEveryAcceptanceLength) {
  NEED_CUDA();
  for (const char* fx : {"tiny", "tiny-mtp"}) {
    auto be = cuda::make_cuda_backend(fixture(fx));
    const int64_t V = be->config().vocab_size;
    const auto prompt = random_tokens(29, V, 11);
    SamplingParams sp;
    sp.logprobs = true;
    sp.top_logprobs = 3;
    const int K = 4;
    for (size_t piece : {size_t(256), size_t(6)}) {
      const Reference ref = decode_plainly(*be, prompt, sp, 40, 100, piece);
      const bool drafting = be->new_session(8)->can_draft();
      auto lengths = speculate_against(*be, prompt, sp, ref, K, 100, piece, drafting,
                                       [&](int round) { return round % (K + 2); });
      for (int a = 0; a <= K; ++a) EXPECT_GT(lengths[static_cast<size_t>(a)], 0) << fx << ": acceptance length " << a;
    }
  }
}

// Penalties and sampling (one seed with logit_bias too): the same tokens as plain decoding for the same seed.
TEST(CudaSpec, SamplingAndPenaltiesGiveThePlainTokensForTheSeed) {
  NEED_CUDA();
  auto be = cuda::make_cuda_backend(fixture("tiny-mtp"));
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
    if (seed == 2u) sp.logit_bias = {{prompt[0], -100.f}, {prompt[2], 2.5f}, {7, 1.5f}};
    const int K = 3;
    const Reference ref = decode_plainly(*be, prompt, sp, 30, 64, 256);
    speculate_against(*be, prompt, sp, ref, K, 64, 256, true, [&](int round) { return (round + int(seed)) % (K + 1); });
  }
}

// Drafts up to the last position of the context; one more does not fit: InputError, state unchanged.
TEST(CudaSpec, ContextLimit) {
  NEED_CUDA();
  auto be = cuda::make_cuda_backend(fixture("tiny-mtp"));
  const int64_t V = be->config().vocab_size, P = 10, max_len = 16;
  const auto prompt = random_tokens(P, V, 5);
  const Reference ref = decode_plainly(*be, prompt, SamplingParams{}, max_len - P + 1, max_len, 256);
  auto s = be->new_session(max_len);
  s->enable_drafting(true);
  s->prefill(prompt);
  s->begin_generation(SamplingParams{}, prompt);
  EXPECT_EQ(s->sample().token, ref.choices[0].token);
  EXPECT_EQ(s->draft(9).size(), 5u);  // room for the pending token + 5 drafts
  std::vector<int32_t> too_many;
  for (int j = 1; j <= 6; ++j) too_many.push_back(ref.choices[static_cast<size_t>(j)].token);
  EXPECT_THROW(s->verify(too_many), InputError);
  EXPECT_EQ(s->length(), P);
  EXPECT_THROW(s->verify(std::vector<int32_t>{int32_t(V)}), InputError);
  EXPECT_EQ(s->length(), P);
  too_many.pop_back();
  const auto ch = s->verify(too_many);
  ASSERT_EQ(ch.size(), 6u);
  for (size_t j = 0; j < ch.size(); ++j) EXPECT_EQ(ch[j].token, ref.choices[j + 1].token);
  EXPECT_EQ(s->length(), max_len);
  EXPECT_TRUE(s->draft(3).empty());
  EXPECT_TRUE(same_bits(s->logits(), ref.logits.back()));
}

// Greedy generation with the head's own drafts (speculative_step) gives plain decoding's tokens.
TEST(CudaSpec, GreedyWithTheHeadsDraftsEqualsPlain) {
  NEED_CUDA();
  auto be = cuda::make_cuda_backend(fixture("tiny-mtp"));
  const int64_t V = be->config().vocab_size;
  const auto prompt = random_tokens(23, V, 17);
  const Reference ref = decode_plainly(*be, prompt, SamplingParams{}, 48, 128, 256);
  for (int K : {1, 3, 5}) {
    auto s = be->new_session(128);
    s->enable_drafting(true);
    s->prefill(prompt);
    s->begin_generation(SamplingParams{}, prompt);
    std::vector<int32_t> got{s->sample().token};
    SpecStats st;
    while (got.size() < ref.choices.size()) {
      const int k = int(std::min<size_t>(size_t(K), ref.choices.size() - got.size() - 1));
      for (const TokenChoice& c : speculative_step(*s, k, int64_t(got.size()) - 1, {}, {}, st)) got.push_back(c.token);
    }
    got.resize(ref.choices.size());
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], ref.choices[i].token) << "K " << K << ", token " << i;
    EXPECT_GT(st.rounds, 0) << "K " << K;
  }
}

// A draft vocabulary (--draft-vocab) cut below the head's own first draft (tests/support/draft_vocab.h), on the tiny
// model and at the real widths (the LM head on the digits kernels, 248,320 rows, cut to the first rows' tiles): drafts
// below the cut and equal to whole rows' argmax below it, plain decoding's tokens; the backend's setting reaches its
// sessions.
TEST(CudaSpec, ADraftVocabularyKeepsTheDraftsBelowItAndTheOutputPlain) {
  NEED_CUDA();
  for (int real : {0, 1}) {
    SCOPED_TRACE(real ? "real widths" : "tiny-mtp");
    auto be = real ? cuda::make_synthetic_cuda_backend(cuda::synthetic_config(4), 7)
                   : cuda::make_cuda_backend(fixture("tiny-mtp"));
    testutil::expect_draft_vocab_cut(*be, random_tokens(real ? 200 : 19, be->config().vocab_size, 43));
  }
}

// Plain stretches up to 256 steps under the adaptive policy (the head's 128-row ring fills and its pairs run
// in a burst inside a plain step), then drafting again: plain decoding's tokens, and the head's drafts after
// every stretch equal those of a head that drafted at every step (tests/support/spec_stretch.h; the same
// test runs on the CPU reference: CpuSpec.HeadAfterLongPlainStretchesDraftsAsIfDraftingEveryStep).
TEST(CudaSpec, HeadAfterLongPlainStretchesDraftsAsIfDraftingEveryStep) {
  NEED_CUDA();
  auto be = cuda::make_cuda_backend(fixture("tiny-mtp"));
  const int64_t V = be->config().vocab_size;
  const auto prompt = random_tokens(23, V, 31);
  const Reference ref = decode_plainly(*be, prompt, SamplingParams{}, 600, 640, 256);
  std::vector<int32_t> truth;
  for (const TokenChoice& c : ref.choices) truth.push_back(c.token);
  testutil::expect_head_exact_after_stretches(testutil::run_plain_stretches(*be, prompt, truth, 300, 3), truth);
}

// A round with a row that has no choice (a NaN embedding row fed) ends the generation after the round's choices
// before it, as plain decoding does (tests/support/generator_spec.h; the same test on the CPU reference:
// GeneratorSpec.ARowWithNoChoiceEndsTheGenerationAfterTheChoicesBeforeIt). tiny-mtp verifies by plain decode steps
// (verify_rows_ok does not hold for it).
TEST(CudaSpec, ARowWithNoChoiceEndsTheGenerationAfterTheChoicesBeforeIt) {
  NEED_CUDA();
  testutil::genspec::expect_a_row_with_no_choice_ends_the_generation_after_the_choices_before_it(
      [](std::shared_ptr<const ModelWeights> w) { return cuda::make_cuda_backend(std::move(w)); });
}

// The head at the real model's widths (synthetic weights, 4 layers): drafts are in the vocabulary, equal for
// two sessions fed alike, carried by a snapshot; a long prompt (batched prefill chunks, ring wrap-around).
TEST(CudaMtp, SyntheticRealWidth) {
  NEED_CUDA();
  auto be = cuda::make_synthetic_cuda_backend(cuda::synthetic_config(4), 7);
  ASSERT_TRUE(be->new_session(8)->can_draft());
  const int64_t V = be->config().vocab_size;
  const auto prompt = random_tokens(300, V, 2);
  auto start = [&] {
    auto s = be->new_session(512);
    s->enable_drafting(true);
    s->prefill(prompt);
    s->begin_generation(SamplingParams{}, prompt);
    s->sample();
    return s;
  };
  auto a = start(), b = start();
  const auto da = a->draft(4);
  ASSERT_EQ(da.size(), 4u);
  for (int32_t t : da) EXPECT_TRUE(t >= 0 && t < V) << t;
  EXPECT_EQ(b->draft(4), da);
  auto snap = a->snapshot();
  auto c = be->new_session(512);
  c->enable_drafting(true);
  c->restore(*snap);
  c->begin_generation(SamplingParams{}, prompt);
  c->sample();
  EXPECT_EQ(c->draft(4), a->draft(4));
  // verify with the head's drafts, then plain steps: the same tokens as a session decoding plainly
  const auto ch = a->verify(da);
  ASSERT_GE(ch.size(), 1u);
  auto p = be->new_session(512);
  p->prefill(prompt);
  p->begin_generation(SamplingParams{}, prompt);
  p->sample();
  for (const TokenChoice& t : ch) EXPECT_EQ(p->decode_step().token, t.token);
}

// The head's catch-up rows on the multi-row kernels (the real model's widths) are bit for bit the one-row
// catch-up (LILAC_MTP_CATCHUP_ROWS=0, read when the head is made): after a long prompt (ring bursts of 127
// rows: a 64-row and a 63-row step), after plain steps and after a verify, the first draft row's logits
// (attention over every K/V row the catch-up wrote) and the drafts are the same.
TEST(CudaMtp, CatchUpRowsEqualOneByOneAtRealWidth) {
  NEED_CUDA();
  auto be = cuda::make_synthetic_cuda_backend(cuda::synthetic_config(4), 7);
  const int64_t V = be->config().vocab_size;
  const auto prompt = random_tokens(300, V, 4);
  auto start = [&](bool rows) {
    if (!rows) setenv("LILAC_MTP_CATCHUP_ROWS", "0", 1);
    auto s = be->new_session(512);
    s->enable_drafting(true);
    unsetenv("LILAC_MTP_CATCHUP_ROWS");
    s->prefill(prompt);
    s->begin_generation(SamplingParams{}, prompt);
    s->sample();
    return s;
  };
  auto one = start(false), rows = start(true);
  // The waiting pairs run (snapshot() runs them without a sink, so on the path under test), then the sink
  // takes the first draft row's logits.
  auto first_row = [&](Session& s, std::vector<int32_t>& drafts) {
    (void)s.snapshot();
    std::vector<float> got;
    s.set_draft_logits_sink([&](int64_t, int64_t, const float* p) { got.assign(p, p + V); });
    drafts = s.draft(4);
    s.set_draft_logits_sink({});
    return got;
  };
  auto expect_same = [&](const char* when) -> std::vector<int32_t> {
    std::vector<int32_t> d1, d2;
    const auto a = first_row(*one, d1), b = first_row(*rows, d2);
    EXPECT_EQ(a.size(), size_t(V)) << when;
    EXPECT_EQ(b.size(), size_t(V)) << when;
    if (a.size() == b.size()) EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << when;
    EXPECT_EQ(d1, d2) << when;
    return d1;
  };
  expect_same("after the prompt");
  for (int i = 0; i < 150; ++i) ASSERT_EQ(one->decode_step().token, rows->decode_step().token) << "step " << i;
  const auto d = expect_same("after 150 plain steps");
  const auto c1 = one->verify(d), c2 = rows->verify(d);
  ASSERT_EQ(c1.size(), c2.size());
  for (size_t i = 0; i < c1.size(); ++i) EXPECT_EQ(c1[i].token, c2[i].token);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(one->decode_step().token, rows->decode_step().token);
  expect_same("after a verify and plain steps");
  auto* c1s = dynamic_cast<cuda::CudaSession*>(one.get());
  auto* c2s = dynamic_cast<cuda::CudaSession*>(rows.get());
  ASSERT_TRUE(c1s && c2s);
  EXPECT_EQ(c1s->mtp_rows_catchups(), 0);
  EXPECT_GE(c2s->mtp_rows_catchups(), 299 + 150);  // every pair of the context
}

// The verify step on the multi-row kernels (taken at the real model's widths, where its rows are bit for
// bit decode steps): every acceptance length 0..K, greedy with logprobs and sampling with penalties, up to
// the last position of the context, and moved to another session through a snapshot midway.
TEST(CudaSpec, RowsVerifyEqualsOneByOneAtRealWidth) {
  NEED_CUDA();
  auto be = cuda::make_synthetic_cuda_backend(cuda::synthetic_config(4), 3);
  const int64_t V = be->config().vocab_size, P = 40, N = 32, max_len = P + N - 1;  // the last round fills it
  const auto prompt = random_tokens(P, V, 19);
  const int K = 4;
  SamplingParams greedy;
  greedy.logprobs = true;
  greedy.top_logprobs = 3;
  {
    const Reference ref = decode_plainly(*be, prompt, greedy, N, max_len, 256);
    auto lengths = speculate_against(*be, prompt, greedy, ref, K, max_len, 256, true,
                                     [&](int round) { return round % (K + 2); });
    for (int a = 0; a <= K; ++a) EXPECT_GT(lengths[static_cast<size_t>(a)], 0) << "acceptance length " << a;
    EXPECT_GT(g_rows_verifies, 0) << "no verify ran on the multi-row kernels";
  }
  {
    const Reference ref = decode_plainly(*be, prompt, greedy, N, max_len, 256);
    speculate_against(*be, prompt, greedy, ref, K, max_len, 256, true, [&](int round) { return (round * 3) % (K + 1); },
                      /*move_at=*/4);
    EXPECT_GT(g_rows_verifies, 0);
  }
  SamplingParams sp;
  sp.temperature = 0.8f;
  sp.top_k = 40;
  sp.repetition_penalty = 1.2f;
  sp.presence_penalty = 0.4f;
  sp.frequency_penalty = 0.2f;
  sp.seed = 5;
  sp.logprobs = true;
  const Reference ref = decode_plainly(*be, prompt, sp, N, max_len, 256);
  speculate_against(*be, prompt, sp, ref, K, max_len, 256, false, [&](int round) { return (round + 1) % (K + 1); });
  EXPECT_GT(g_rows_verifies, 0);
}

// Sampling without penalties (one seed with logit_bias): the verify samples its rows in one pass (row i at the step plain decoding would
// use for it; the counts and the step for the kept rows only), with the head drafting between rounds (its
// catch-up starts at the end of each verify): every choice, logprob and the logits after each round are
// plain decoding's for the seed; then a greedy generation on the same session after it.
TEST(CudaSpec, RowsVerifySampledWithoutPenaltiesInOnePass) {
  NEED_CUDA();
  auto be = cuda::make_synthetic_cuda_backend(cuda::synthetic_config(4), 3);
  const int64_t V = be->config().vocab_size, P = 33, N = 40, max_len = 128;
  const auto prompt = random_tokens(P, V, 23);
  const int K = 4;
  for (uint64_t seed : {4u, 9u}) {
    SamplingParams sp;
    sp.temperature = 1.0f;
    sp.top_p = 0.9f;
    sp.top_k = 64;
    sp.seed = seed;
    sp.logprobs = true;
    sp.top_logprobs = 2;
    if (seed == 9u)  // logit_bias: a row's choice still does not depend on the rows before it
      sp.logit_bias = {{prompt[0], -100.f}, {prompt[1], 6.f}, {int32_t(V - 1), 3.f}};
    const Reference ref = decode_plainly(*be, prompt, sp, N, max_len, 256);
    auto lengths = speculate_against(*be, prompt, sp, ref, K, max_len, 256, true,
                                     [&](int round) { return (round + int(seed)) % (K + 2); });
    for (int a = 0; a <= K; ++a) EXPECT_GT(lengths[static_cast<size_t>(a)], 0) << "acceptance length " << a;
    EXPECT_GT(g_rows_verifies, 0) << "no verify ran on the multi-row kernels";
  }
}

// decode_batch keeps a drafting session's MTP head in step (tiny-mtp: the batch steps session by session,
// its rows step not being bitwise the single step there): after batched steps its drafts are those of a
// session stepped alone, and its tokens too.
TEST(CudaMtp, BatchedStepsFeedTheMtpHead) {
  NEED_CUDA();
  auto be = cuda::make_cuda_backend(fixture("tiny-mtp"));
  const int64_t V = be->config().vocab_size;
  const auto prompt = random_tokens(21, V, 13);
  auto start = [&](bool drafting) {
    auto s = be->new_session(64);
    s->enable_drafting(drafting);
    s->prefill(prompt);
    s->begin_generation(SamplingParams{}, prompt);
    s->sample();
    return s;
  };
  auto alone = start(true);
  std::vector<int32_t> want_tokens;
  for (int i = 0; i < 5; ++i) want_tokens.push_back(alone->decode_step().token);
  const auto want = alone->draft(3);
  ASSERT_EQ(want.size(), 3u);
  auto b = start(true), c = start(false), d = start(true);
  std::vector<Session*> all{b.get(), c.get(), d.get()};
  for (int i = 0; i < 5; ++i) {
    const auto ch = be->decode_batch(all);
    ASSERT_EQ(ch.size(), 3u);
    for (const TokenChoice& t : ch) EXPECT_EQ(t.token, want_tokens[static_cast<size_t>(i)]) << "step " << i;
  }
  EXPECT_EQ(b->draft(3), want);
  EXPECT_EQ(d->draft(3), want);
  EXPECT_TRUE(c->draft(3).empty());
}

// The session's state moves when its sequence pool grows (more sessions of its capacity): the verify step
// and the MTP head must follow it (their graphs held the old views).
TEST(CudaSpec, RowsVerifyFollowsAGrowingPool) {
  NEED_CUDA();
  auto be = cuda::make_synthetic_cuda_backend(cuda::synthetic_config(4), 5);
  const int64_t V = be->config().vocab_size, P = 24, N = 24, max_len = 96;
  const auto prompt = random_tokens(P, V, 23);
  const int K = 3;
  SamplingParams greedy;
  const Reference ref = decode_plainly(*be, prompt, greedy, N, max_len, 256);
  std::vector<std::unique_ptr<Session>> others;
  speculate_against(*be, prompt, greedy, ref, K, max_len, 256, true, [&](int round) { return round % (K + 1); }, -1,
                    [&](int round) {
                      if (round == 2 || round == 4)  // the pool doubles: 1 → 2 → 4 slots (then 4 → 8)
                        for (int j = 0; j < (round == 2 ? 1 : 3); ++j) others.push_back(be->new_session(max_len));
                    });
  EXPECT_GT(g_rows_verifies, 0);
}

// Sessions following their MTP heads in rows steps (the real model's widths, where the rows step is bitwise
// the single step) with other sessions, in batches whose members and order change, then drafting and
// verifying, then batched again: every token, every draft and every verify's choices are those of twins
// stepped alone all the way (the batched step handed each head its token and hidden).
TEST(CudaMtp, RowsBatchedStepsFeedTheMtpHeadAtRealWidth) {
  NEED_CUDA();
  auto be = cuda::make_synthetic_cuda_backend(cuda::synthetic_config(4), 11);
  const int64_t V = be->config().vocab_size, max_len = 160;
  SamplingParams sampled;
  sampled.temperature = 0.8f;
  sampled.top_k = 40;
  sampled.seed = 3;
  sampled.logprobs = true;
  struct Stream {
    std::vector<int32_t> prompt;
    SamplingParams sp;
    bool drafting;
  };
  const std::vector<Stream> streams{{random_tokens(30, V, 41), SamplingParams{}, true},
                                    {random_tokens(12, V, 42), SamplingParams{}, false},
                                    {random_tokens(45, V, 43), sampled, true}};
  auto start = [&](const Stream& x) {
    auto s = be->new_session(max_len);
    s->enable_drafting(x.drafting);
    s->prefill(x.prompt);
    s->begin_generation(x.sp, x.prompt);
    s->sample();
    return s;
  };
  std::vector<std::unique_ptr<Session>> bat, ref;
  for (const Stream& x : streams) bat.push_back(start(x));
  for (const Stream& x : streams) ref.push_back(start(x));
  auto rows_steps = [&] { return dynamic_cast<cuda::CudaSession&>(*bat[0]).pool().batch().steps(); };
  const uint64_t steps0 = rows_steps();
  // batched steps of {0, 1, 2}, {2, 0}, {1, 2, 0}, ... against each twin's decode_step
  auto batched = [&](int n, const std::string& what) {
    const std::vector<std::vector<size_t>> orders{{0, 1, 2}, {2, 0}, {1, 2, 0}, {0, 2}};
    for (int t = 0; t < n; ++t) {
      const auto& idx = orders[size_t(t) % orders.size()];
      std::vector<Session*> ss;
      for (size_t i : idx) ss.push_back(bat[i].get());
      const auto got = be->decode_batch(ss);
      ASSERT_EQ(got.size(), idx.size());
      for (size_t k = 0; k < idx.size(); ++k) {
        const TokenChoice want = ref[idx[k]]->decode_step();
        EXPECT_TRUE(same_choice(got[k], want)) << what << " step " << t << " stream " << idx[k];
      }
    }
  };
  // drafts of the drafting streams (0 and 2), then a verify of them with one draft made wrong
  auto draft_and_verify = [&](const std::string& what, int wrong_at) {
    for (size_t i : {size_t(0), size_t(2)}) {
      const auto want = ref[i]->draft(3);
      ASSERT_EQ(want.size(), 3u) << what;
      EXPECT_EQ(bat[i]->draft(3), want) << what << " stream " << i;
      std::vector<int32_t> d = want;
      if (wrong_at < 3) d[size_t(wrong_at)] = (d[size_t(wrong_at)] + 1) % int32_t(V);
      const auto a = bat[i]->verify(d), b = ref[i]->verify(d);
      ASSERT_EQ(a.size(), b.size()) << what << " stream " << i;
      for (size_t k = 0; k < a.size(); ++k) EXPECT_TRUE(same_choice(a[k], b[k])) << what << " stream " << i;
    }
    EXPECT_TRUE(bat[1]->draft(3).empty());
  };
  batched(7, "first batches");
  draft_and_verify("after the first batches", 1);
  batched(9, "second batches");
  draft_and_verify("after the second batches", 3);
  batched(5, "third batches");
  draft_and_verify("after the third batches", 0);
  EXPECT_GE(rows_steps() - steps0, 21u) << "the batches did not run as rows steps";
  for (size_t i = 0; i < bat.size(); ++i) {
    EXPECT_EQ(bat[i]->length(), ref[i]->length()) << i;
    EXPECT_TRUE(same_bits(bat[i]->logits(), ref[i]->logits())) << i;
  }
}
