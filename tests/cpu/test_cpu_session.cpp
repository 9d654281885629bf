// CpuSession behaviour: chunked prefill == token-by-token, snapshots, sinks, errors, generation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "cpu/cpu_backend.h"
#include "model/weights.h"
#include "support/fixtures.h"
#include "support/session_no_choice.h"

using namespace lilac;
using testutil::fixture;
using testutil::random_tokens;

namespace {

double max_diff(const float* a, const float* b, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, double(std::abs(a[i] - b[i])));
  return m;
}

}  // namespace

// A sink (the prompt's logprobs) does not change the logits of the next choice: the same bits as a prefill without
// one (they once came from the multi-row product, another order of additions than the single-row one).
TEST(CpuSession, SinkLeavesTheNextChoicesLogits) {
  auto be = make_cpu_backend(fixture("tiny"), 2);
  const int64_t V = be->config().vocab_size, N = 150;
  const auto toks = random_tokens(N, V, 9);
  auto a = be->new_session(N);
  a->prefill(toks);
  auto b = be->new_session(N);
  int64_t rows = 0;
  LogitsSink sink = [&](int64_t, int64_t n, const float*) { rows += n; };
  b->prefill(toks, &sink);
  ASSERT_EQ(rows, N);
  const std::vector<float> la = a->logits(), lb = b->logits();
  ASSERT_EQ(la.size(), size_t(V));
  ASSERT_EQ(lb.size(), size_t(V));
  EXPECT_EQ(std::memcmp(la.data(), lb.data(), size_t(V) * sizeof(float)), 0);
}

// prefill(all) with a sink == prefill(part) + one-token prefills, for both fixtures.
TEST(CpuSession, ChunkedPrefillEqualsPartPlusSingleTokens) {
  for (const char* fx : {"tiny", "tiny2"}) {
    auto be = make_cpu_backend(fixture(fx), 2);
    const int64_t V = be->config().vocab_size, N = 150, P = 67;
    const auto toks = random_tokens(N, V, 5);
    auto a = be->new_session(N);
    std::vector<float> all(static_cast<size_t>(N * V), NAN);
    int64_t next = 0;
    LogitsSink sink = [&](int64_t first, int64_t n, const float* lg) {
      ASSERT_EQ(first, next);  // rows arrive in order, chunk by chunk
      std::copy(lg, lg + n * V, all.begin() + first * V);
      next = first + n;
    };
    a->prefill(toks, &sink);
    ASSERT_EQ(next, N);
    EXPECT_EQ(a->length(), N);
    EXPECT_EQ(a->logits(), std::vector<float>(all.end() - V, all.end()));

    auto b = be->new_session(N);
    b->prefill(std::span(toks).subspan(0, P));
    EXPECT_LT(max_diff(b->logits().data(), all.data() + (P - 1) * V, V), 1e-4) << fx;
    double worst = 0;
    for (int64_t i = P; i < N; ++i) {
      b->prefill(std::span(toks).subspan(static_cast<size_t>(i), 1));
      worst = std::max(worst, max_diff(b->logits().data(), all.data() + i * V, V));
    }
    EXPECT_LT(worst, 1e-4) << fx;
    EXPECT_EQ(b->length(), N);
  }
}

TEST(CpuSession, SinkRowsFollowThePrefillChunkSize) {
  auto be = make_cpu_backend(fixture("tiny2"), 1);
  auto s = be->new_session(100);
  auto* cs = dynamic_cast<cpu::CpuSession*>(s.get());
  ASSERT_NE(cs, nullptr);
  cs->set_prefill_chunk(7);
  std::vector<std::pair<int64_t, int64_t>> calls;
  LogitsSink sink = [&](int64_t first, int64_t n, const float*) { calls.push_back({first, n}); };
  s->prefill(random_tokens(20, be->config().vocab_size, 1), &sink);
  ASSERT_EQ(calls.size(), 3u);
  EXPECT_EQ(calls[0], std::make_pair(int64_t(0), int64_t(7)));
  EXPECT_EQ(calls[1], std::make_pair(int64_t(7), int64_t(7)));
  EXPECT_EQ(calls[2], std::make_pair(int64_t(14), int64_t(6)));
}

TEST(CpuSession, SnapshotContinueRestoreContinueIsIdentical) {
  auto be = make_cpu_backend(fixture("tiny"), 2);
  const int64_t V = be->config().vocab_size;
  const auto toks = random_tokens(90, V, 9);
  auto s = be->new_session(200);
  s->prefill(std::span(toks).subspan(0, 50));
  const auto at50 = s->logits();
  auto snap = s->snapshot();
  EXPECT_EQ(snap->length(), 50);
  EXPECT_GT(snap->bytes(), 0u);
  s->prefill(std::span(toks).subspan(50, 40));
  const auto first = s->logits();
  s->begin_generation(SamplingParams{}, toks);
  std::vector<int32_t> gen1;
  gen1.push_back(s->sample().token);
  for (int i = 0; i < 5; ++i) gen1.push_back(s->decode_step().token);

  s->restore(*snap);
  EXPECT_EQ(s->length(), 50);
  EXPECT_EQ(s->logits(), at50);
  s->prefill(std::span(toks).subspan(50, 40));
  EXPECT_EQ(s->logits(), first);  // bit-identical: same computation from the same state
  s->begin_generation(SamplingParams{}, toks);
  std::vector<int32_t> gen2;
  gen2.push_back(s->sample().token);
  for (int i = 0; i < 5; ++i) gen2.push_back(s->decode_step().token);
  EXPECT_EQ(gen1, gen2);

  // Restoring into another session of the same backend works too.
  auto t = be->new_session(200);
  t->restore(*snap);
  t->prefill(std::span(toks).subspan(50, 40));
  EXPECT_EQ(t->logits(), first);
  // Reset empties the context; the same prompt then gives the same logits.
  s->reset();
  EXPECT_EQ(s->length(), 0);
  EXPECT_THROW(s->logits(), Error);
  s->prefill(std::span(toks).subspan(0, 50));
  EXPECT_EQ(s->logits(), at50);
}

TEST(CpuSession, SnapshotFromAnotherModelIsRejected) {
  auto a = make_cpu_backend(fixture("tiny"), 1);
  auto b = make_cpu_backend(fixture("tiny2"), 1);
  auto sa = a->new_session(10), sb = b->new_session(10);
  sa->prefill(std::vector<int32_t>{1, 2, 3});
  EXPECT_THROW(sb->restore(*sa->snapshot()), Error);
}

TEST(CpuSession, GreedyDecodeEqualsPrefillOfTheArgmax) {
  auto be = make_cpu_backend(fixture("tiny2"), 2);
  const int64_t V = be->config().vocab_size;
  const auto prompt = random_tokens(30, V, 3);
  auto s = be->new_session(64), r = be->new_session(64);
  s->prefill(prompt);
  r->prefill(prompt);
  s->begin_generation(SamplingParams{}, prompt);
  TokenChoice c = s->sample();
  for (int i = 0; i < 10; ++i) {
    const auto lg = r->logits();
    int32_t best = 0;
    for (int32_t j = 1; j < V; ++j)
      if (lg[static_cast<size_t>(j)] > lg[static_cast<size_t>(best)]) best = j;
    ASSERT_EQ(c.token, best) << i;
    r->prefill(std::vector<int32_t>{best});
    c = s->decode_step();
    EXPECT_EQ(s->logits(), r->logits());  // one-token prefill == advance()
  }
  EXPECT_EQ(s->length(), 30 + 10);
}

TEST(CpuSession, SamplingIsDeterministicForASeedAndLogprobsAreReturned) {
  auto be = make_cpu_backend(fixture("tiny2"), 1);
  const auto prompt = random_tokens(10, be->config().vocab_size, 4);
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_p = 0.9f;
  p.seed = 1234;
  p.logprobs = true;
  p.top_logprobs = 3;
  std::vector<int32_t> runs[2];
  for (auto& out : runs) {
    auto s = be->new_session(40);
    s->prefill(prompt);
    s->begin_generation(p, prompt);
    TokenChoice c = s->sample();
    for (int i = 0; i < 12; ++i) {
      out.push_back(c.token);
      ASSERT_EQ(c.top.size(), 3u);
      EXPECT_LE(c.logprob, 0.f);
      EXPECT_GE(c.top[0].logprob, c.top[1].logprob);
      EXPECT_GE(c.top[0].logprob, c.logprob);
      c = s->decode_step();
    }
  }
  EXPECT_EQ(runs[0], runs[1]);
}

TEST(CpuSession, BadInputThrowsAndLeavesStateUnchanged) {
  auto be = make_cpu_backend(fixture("tiny2"), 1);
  const int64_t V = be->config().vocab_size;
  auto s = be->new_session(8);
  s->prefill(std::vector<int32_t>{1, 2, 3});
  const auto before = s->logits();
  try {
    s->prefill(std::vector<int32_t>{4, int32_t(V), 5});
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("token id " + std::to_string(V)), std::string::npos) << e.what();
  }
  EXPECT_THROW(s->prefill(std::vector<int32_t>{-1}), InputError);
  EXPECT_EQ(s->length(), 3);
  EXPECT_EQ(s->logits(), before);
  try {
    s->prefill(std::vector<int32_t>{1, 2, 3, 4, 5, 6});  // 3 + 6 > 8
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("max_length 8"), std::string::npos) << e.what();
  }
  EXPECT_EQ(s->length(), 3);
  s->prefill(std::vector<int32_t>{1, 2, 3, 4, 5});  // exactly fills it
  EXPECT_EQ(s->length(), 8);
  auto fresh = be->new_session(8);
  EXPECT_THROW(fresh->sample(), Error);
  EXPECT_THROW(fresh->advance(), Error);
}

namespace {

TEST(CpuSession, Bf16KvCacheChangesTheLogitsOnlyByItsRounding) {
  auto be = make_cpu_backend(fixture("tiny"), 2);
  const int64_t V = be->config().vocab_size;
  const auto toks = random_tokens(40, V, 11);
  auto fp = be->new_session(64), bf = be->new_session(64), bf7 = be->new_session(64);
  dynamic_cast<cpu::CpuSession&>(*bf).set_kv_bf16(true);
  dynamic_cast<cpu::CpuSession&>(*bf7).set_kv_bf16(true);
  dynamic_cast<cpu::CpuSession&>(*bf7).set_prefill_chunk(7);
  fp->prefill(toks);
  bf->prefill(toks);
  bf7->prefill(toks);
  const auto a = fp->logits(), b = bf->logits();
  double num = 0, den = 0;
  for (int64_t i = 0; i < V; ++i) {
    num += (double(a[size_t(i)]) - b[size_t(i)]) * (double(a[size_t(i)]) - b[size_t(i)]);
    den += double(a[size_t(i)]) * a[size_t(i)];
  }
  const double rel = std::sqrt(num / den);
  EXPECT_GT(rel, 0.0);   // the cache is rounded...
  EXPECT_LT(rel, 2e-2);  // ...by bf16's 2^-9, not more
  EXPECT_LT(max_diff(bf7->logits().data(), b.data(), V), 1e-4);  // every prefill path rounds the same way
}

}  // namespace

// After a row with no choice nothing is pending: decode_step, advance and decode_batch refuse before computing, and
// reset() makes the session whole (tests/support/session_no_choice.h; the same test for the fast CPU and CUDA backends).
TEST(CpuSession, ARowWithNoChoiceLeavesNothingPending) {
  testutil::nochoice::expect_a_row_with_no_choice_leaves_nothing_pending(
      [](std::shared_ptr<const ModelWeights> w) { return make_cpu_backend(std::move(w), 1); });
}
