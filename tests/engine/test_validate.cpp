// engine/validate.h: the one set of token and length rules, their boundaries and their words.
#include <gtest/gtest.h>

#include <vector>

#include "core/error.h"
#include "engine/validate.h"

namespace lilac {
namespace {

TEST(Validate, TokenIds) {
  const std::vector<int32_t> ok{0, 5, 99};
  EXPECT_FALSE(check_token_ids(ok, 100));
  const std::vector<int32_t> high{3, 100, -1};
  Check c = check_token_ids(high, 100);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->kind, Invalid::TokenOutOfVocab);
  EXPECT_EQ(c->message, "token id 100 is outside the vocabulary (size 100)");  // the first one
  const std::vector<int32_t> neg{-1};
  EXPECT_EQ(check_token_ids(neg, 100)->message, "token id -1 is outside the vocabulary (size 100)");
  EXPECT_FALSE(check_token_ids({}, 100));
}

TEST(Validate, ContextBoundaries) {
  EXPECT_FALSE(check_context(10, 22, 32));  // exactly fills it
  Check c = check_context(10, 23, 32);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->kind, Invalid::TotalTooLong);
  EXPECT_EQ(c->message, "This model's maximum context length is 32 tokens; the prompt (10 tokens) + max_tokens (23) exceeds it.");
  c = check_context(32, 1, 32);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->kind, Invalid::PromptTooLong);
  EXPECT_EQ(c->message, "This model's maximum context length is 32 tokens; the prompt has 32 tokens.");
  EXPECT_FALSE(check_context(31, 1, 32));
  EXPECT_EQ(check_context(0, 1, 32)->kind, Invalid::EmptyPrompt);
  EXPECT_EQ(check_context(5, 0, 32)->kind, Invalid::BadMaxTokens);
  // Issue 13, 6: prompt + max_tokens overflowed int64 for max_tokens near 2^63 and passed.
  c = check_context(10, INT64_MAX, 32);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->kind, Invalid::TotalTooLong);
  ASSERT_TRUE(check_context(1, INT64_MAX - 5, 32768));
}

TEST(Validate, SessionCapacityAndRequire) {
  EXPECT_FALSE(check_session_capacity(3, 5, 8));
  Check c = check_session_capacity(3, 6, 8);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->kind, Invalid::SessionFull);
  EXPECT_EQ(c->message, "context of 9 tokens exceeds the session's max_length 8");
  EXPECT_NO_THROW(require(std::nullopt));
  try {
    require(c);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()), c->message);
  }
}

}  // namespace
}  // namespace lilac
