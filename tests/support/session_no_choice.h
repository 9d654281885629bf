// After a step whose row has no choice (engine/sampler.h: every logit NaN or -inf), a session has no token pending,
// for any backend (tests/cpu/test_cpu_session.cpp: the CPU reference, tests/cpufast/test_fast_backend.cpp: the fast
// CPU backend, tests/cuda/test_cuda_batch.cpp: CUDA): every way of feeding one refuses with an Error before it
// computes anything (the CUDA sessions once fed the sampler's negative code as a token id: row -1 of the embedding),
// and reset() plus a new prompt make the session whole again. Every way a step ends without a choice: the session's
// own decode_step(), its row of a batched step (Backend::decode_batch, beside a session that has a choice) and a
// verify's row (Session::verify with injected drafts).
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/backend.h"
#include "engine/sampler.h"
#include "model/weights.h"
#include "support/fixtures.h"

namespace lilac::testutil::nochoice {

// A backend on the given weights (tiny's, or tiny's with one embedding row NaN).
using BackendFactory = std::function<std::unique_ptr<Backend>(std::shared_ptr<const ModelWeights>)>;

// `verifies`: the backend speculates (Session::verify with drafts; the fast CPU backend does not).
inline void expect_a_row_with_no_choice_leaves_nothing_pending(const BackendFactory& make, bool verifies = true) {
  const std::vector<int32_t> prompt = {11, 203, 57, 998, 4, 640, 77, 312};
  const int32_t poison = 777;  // no id of the prompt: nothing reads its embedding row until it is fed
  auto be = make(with_nan_embedding_row("tiny", poison));
  const int64_t V = be->config().vocab_size;
  ASSERT_GT(V, poison);
  std::vector<uint32_t> only(size_t((V + 31) / 32), 0u);
  only[size_t(poison / 32)] |= 1u << (poison % 32);
  const std::string no_choice = no_finite_logit_error().what();
  // A session whose pending token is the poisoned one (the mask allows nothing else for the first choice).
  auto poisoned = [&] {
    auto s = be->new_session(64);
    s->prefill(prompt);
    s->begin_generation(SamplingParams{}, prompt);
    s->set_token_mask(only.data());
    EXPECT_EQ(s->sample().token, poison);
    return s;
  };
  auto error_of = [](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const std::exception& e) {
      return e.what();
    }
    return "no error";
  };
  auto expect_nothing_pending = [&](Session& s, const std::string& how) {
    SCOPED_TRACE(how);
    const int64_t len = s.length();
    Session* one[] = {&s};
    EXPECT_THROW(be->decode_batch(one), Error) << "decode_batch fed a token that was never chosen";
    const std::string again = error_of([&] { s.decode_step(); });
    EXPECT_NE(again, "no error");
    EXPECT_NE(again, no_choice) << "decode_step fed a token that was never chosen";
    EXPECT_THROW(s.advance(), Error);
    EXPECT_EQ(s.length(), len) << "the refusals changed nothing";
    // whole again after a reset: the prompt's first choice as a fresh session's
    s.reset();
    s.prefill(prompt);
    s.begin_generation(SamplingParams{}, prompt);
    auto fresh = be->new_session(64);
    fresh->prefill(prompt);
    fresh->begin_generation(SamplingParams{}, prompt);
    const TokenChoice a = s.sample(), b = fresh->sample();
    EXPECT_EQ(a.token, b.token);
    EXPECT_NE(a.token, poison);
    EXPECT_EQ(s.decode_step().token, fresh->decode_step().token);
  };
  {  // the session's own step feeds the poisoned token: its row has no choice
    auto s = poisoned();
    EXPECT_EQ(error_of([&] { s->decode_step(); }), no_choice);
    expect_nothing_pending(*s, "after decode_step");
  }
  {  // the same row in a batched step, beside a session with a choice
    auto s = poisoned();
    auto ok = be->new_session(64);
    ok->prefill(prompt);
    ok->begin_generation(SamplingParams{}, prompt);
    ok->sample();
    Session* both[] = {s.get(), ok.get()};
    const std::vector<TokenChoice> got = be->decode_batch(both);
    ASSERT_EQ(got.size(), 2u);
    ASSERT_TRUE(got[0].error);
    EXPECT_EQ(error_of([&] { std::rethrow_exception(got[0].error); }), no_choice);
    EXPECT_FALSE(got[1].error) << "the other session's row has its choice";
    expect_nothing_pending(*s, "after decode_batch");
    EXPECT_NO_THROW(ok->decode_step()) << "the other session goes on";
  }
  if (verifies) {  // a verify whose first row (the poisoned pending token's) has no choice: that row is its last
    auto s = poisoned();
    const std::vector<int32_t> drafts = {5, 6};
    const std::vector<TokenChoice> got = s->verify(drafts);
    ASSERT_EQ(got.size(), 1u);
    ASSERT_TRUE(got[0].error);
    EXPECT_EQ(error_of([&] { std::rethrow_exception(got[0].error); }), no_choice);
    expect_nothing_pending(*s, "after verify");
  }
}

}  // namespace lilac::testutil::nochoice
