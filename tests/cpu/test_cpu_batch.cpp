// CpuBackend::decode_batch: one batched step over sessions of different lengths, sampling parameters
// and K/V precision gives every session exactly what its own decode_step() gives: the same choice
// (token, logprob, alternatives) and logits equal bit for bit (tiny and tiny2).
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "cpu/cpu_backend.h"
#include "model/weights.h"
#include "support/fixtures.h"

using namespace lilac;
using testutil::fixture;
using testutil::random_tokens;

namespace {

SamplingParams params_for(int i) {
  SamplingParams p;
  switch (i % 3) {
    case 0: break;  // greedy
    case 1:
      p.temperature = 0.8f;
      p.top_p = 0.9f;
      p.presence_penalty = 0.3f;
      p.frequency_penalty = 0.2f;
      p.repetition_penalty = 1.1f;
      break;
    default:
      p.temperature = 1.2f;
      p.top_k = 20;
      p.min_p = 0.05f;
      p.logprobs = true;
      p.top_logprobs = 3;
  }
  p.seed = 1000 + uint64_t(i);
  return p;
}

void expect_same_choice(const TokenChoice& a, const TokenChoice& b, const std::string& where) {
  EXPECT_EQ(a.token, b.token) << where;
  EXPECT_EQ(std::memcmp(&a.logprob, &b.logprob, sizeof(float)), 0) << where;
  ASSERT_EQ(a.top.size(), b.top.size()) << where;
  for (size_t k = 0; k < a.top.size(); ++k) {
    EXPECT_EQ(a.top[k].token, b.top[k].token) << where;
    EXPECT_EQ(std::memcmp(&a.top[k].logprob, &b.top[k].logprob, sizeof(float)), 0) << where;
  }
}

void expect_same_logits(Session& a, Session& b, const std::string& where) {
  const auto la = a.logits(), lb = b.logits();
  ASSERT_EQ(la.size(), lb.size());
  EXPECT_EQ(std::memcmp(la.data(), lb.data(), la.size() * sizeof(float)), 0) << where;
}

// Twin sessions: `alone` steps with decode_step(), `batched` through decode_batch().
struct Twin {
  std::unique_ptr<Session> alone, batched;
};

std::vector<Twin> make_twins(Backend& be, const std::vector<int64_t>& lengths, uint32_t seed) {
  std::vector<Twin> tw;
  const int64_t V = be.config().vocab_size;
  for (size_t i = 0; i < lengths.size(); ++i) {
    Twin t{be.new_session(128), be.new_session(128)};
    if (i == 2)  // one session with the bf16 K/V cache (the flag is per session)
      for (Session* s : {t.alone.get(), t.batched.get()}) dynamic_cast<cpu::CpuSession&>(*s).set_kv_bf16(true);
    const auto prompt = random_tokens(lengths[i], V, seed + uint32_t(i));
    const SamplingParams p = params_for(int(i));
    for (Session* s : {t.alone.get(), t.batched.get()}) {
      s->prefill(prompt);
      s->begin_generation(p, prompt);
    }
    expect_same_choice(t.alone->sample(), t.batched->sample(), "first choice");
    tw.push_back(std::move(t));
  }
  return tw;
}

}  // namespace

TEST(CpuBatch, DecodeBatchEqualsDecodeStepBitForBit) {
  for (const char* fx : {"tiny", "tiny2"}) {
    auto be = make_cpu_backend(fixture(fx), 2);
    EXPECT_GT(be->max_batch(), 1);
    auto tw = make_twins(*be, {1, 6, 23, 40, 9}, 17);
    for (int step = 0; step < 10; ++step) {
      // Batch membership changes from step to step (the lengths drift apart); step 4 is a batch of one.
      std::vector<size_t> active;
      for (size_t i = 0; i < tw.size(); ++i)
        if (step == 4 ? i == 3 : (step + int(i)) % 4 != 3) active.push_back(i);
      std::vector<Session*> batch;
      for (size_t i : active) batch.push_back(tw[i].batched.get());
      const auto got = be->decode_batch(batch);
      ASSERT_EQ(got.size(), active.size());
      for (size_t k = 0; k < active.size(); ++k) {
        Twin& t = tw[active[k]];
        const std::string where = std::string(fx) + " step " + std::to_string(step) + " seq " + std::to_string(active[k]);
        expect_same_choice(t.alone->decode_step(), got[k], where);
        expect_same_logits(*t.alone, *t.batched, where);
        EXPECT_EQ(t.alone->length(), t.batched->length()) << where;
      }
    }
  }
}

TEST(CpuBatch, BatchesLargerThanMaxBatchAreSplit) {
  auto be = make_cpu_backend(fixture("tiny2"), 2);
  const int n = be->max_batch() + 3;
  std::vector<int64_t> lengths;
  for (int i = 0; i < n; ++i) lengths.push_back(1 + i % 5);
  auto tw = make_twins(*be, lengths, 99);
  for (int step = 0; step < 2; ++step) {
    std::vector<Session*> batch;
    for (auto& t : tw) batch.push_back(t.batched.get());
    const auto got = be->decode_batch(batch);
    ASSERT_EQ(got.size(), tw.size());
    for (size_t i = 0; i < tw.size(); ++i) {
      expect_same_choice(tw[i].alone->decode_step(), got[i], "seq " + std::to_string(i));
      expect_same_logits(*tw[i].alone, *tw[i].batched, "seq " + std::to_string(i));
    }
  }
}

TEST(CpuBatch, BadBatchesThrowBeforeChangingAnySession) {
  auto be = make_cpu_backend(fixture("tiny2"), 1);
  auto other = make_cpu_backend(fixture("tiny2"), 1);
  auto tw = make_twins(*be, {3, 4}, 5);
  auto fresh = be->new_session(16);  // nothing sampled
  fresh->prefill(random_tokens(2, be->config().vocab_size, 1));
  auto foreign = other->new_session(16);
  foreign->prefill(random_tokens(2, be->config().vocab_size, 1));
  foreign->begin_generation({}, {});
  foreign->sample();
  auto full = be->new_session(4);  // no room for one more token
  full->prefill(random_tokens(4, be->config().vocab_size, 2));
  full->begin_generation({}, {});
  full->sample();
  Session* a = tw[0].batched.get();
  const int64_t len = a->length();
  EXPECT_THROW(be->decode_batch(std::vector<Session*>{a, fresh.get()}), Error);
  EXPECT_THROW(be->decode_batch(std::vector<Session*>{a, a}), Error);
  EXPECT_THROW(be->decode_batch(std::vector<Session*>{a, foreign.get()}), Error);
  EXPECT_THROW(be->decode_batch(std::vector<Session*>{a, full.get()}), InputError);
  EXPECT_EQ(a->length(), len);
  EXPECT_TRUE(be->decode_batch(std::vector<Session*>{}).empty());
  // Still in step with its twin.
  expect_same_choice(tw[0].alone->decode_step(), be->decode_batch(std::vector<Session*>{a})[0], "after errors");
  expect_same_logits(*tw[0].alone, *a, "after errors");
}

// A session whose own step fails in a batch (its sampler has no choice: engine/sampler.h) gets the error in its row
// (TokenChoice::error) and the others their choices, those of their twins stepped alone, in that step and the next:
// here one session fed a token whose embedding row is NaN (every logit NaN: an Error naming the logits) and one whose
// mask allows no token (an InputError naming the constraint). Before, the first such session failed the whole call
// (decode_batch threw, the sessions after it not sampled).
TEST(CpuBatch, ASessionsOwnFailureIsItsRowsErrorOnly) {
  const int64_t V = fixture("tiny2")->config.vocab_size;
  const int32_t poison = int32_t(V - 1);
  auto be = make_cpu_backend(testutil::with_nan_embedding_row("tiny2", poison), 2);
  auto tw = make_twins(*be, {5, 9, 14}, 41);
  const std::vector<int32_t> prompt = random_tokens(6, V, 3);
  std::vector<uint32_t> only(size_t((V + 31) / 32), 0), none(only.size(), 0);
  only[size_t(poison) / 32] |= 1u << (poison % 32);
  auto nan_s = be->new_session(64), none_s = be->new_session(64);
  for (Session* s : {nan_s.get(), none_s.get()}) {
    s->prefill(prompt);
    s->begin_generation({}, prompt);
  }
  nan_s->set_token_mask(only.data());
  ASSERT_EQ(nan_s->sample().token, poison);  // fed by the batched step: NaN from then on
  none_s->sample();
  none_s->set_token_mask(none.data());
  const std::vector<Session*> batch = {tw[0].batched.get(), nan_s.get(), tw[1].batched.get(), none_s.get(),
                                       tw[2].batched.get()};
  std::vector<TokenChoice> got;
  ASSERT_NO_THROW(got = be->decode_batch(batch));
  ASSERT_EQ(got.size(), batch.size());
  const testutil::RowError nan_err = testutil::row_error(got[1]), none_err = testutil::row_error(got[3]);
  EXPECT_FALSE(nan_err.input);
  EXPECT_NE(nan_err.message.find("finite logit"), std::string::npos) << nan_err.message;
  EXPECT_TRUE(none_err.input);
  EXPECT_NE(none_err.message.find("allows no token"), std::string::npos) << none_err.message;
  auto expect_twins = [&](const std::vector<TokenChoice>& mine, const std::string& step) {
    ASSERT_EQ(mine.size(), tw.size());
    for (size_t i = 0; i < tw.size(); ++i) {
      const std::string where = step + ", seq " + std::to_string(i);
      EXPECT_FALSE(mine[i].error) << where << ": " << testutil::row_error(mine[i]).message;
      expect_same_choice(tw[i].alone->decode_step(), mine[i], where);
      expect_same_logits(*tw[i].alone, *tw[i].batched, where);
    }
  };
  expect_twins({got[0], got[2], got[4]}, "beside the failing sessions");
  expect_twins(be->decode_batch(std::vector<Session*>{tw[0].batched.get(), tw[1].batched.get(), tw[2].batched.get()}),
               "the next step");
}
