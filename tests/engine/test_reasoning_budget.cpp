// ReasoningBudgetConstraint (engine/reasoning_budget.h) on the real Qwen3 tokenizer: free choices until the budget,
// then the closing markup forced one token at a time (a mask with one bit), then free again; a block the model closes
// itself (in one token or several) is never forced; a response grammar under it accepts the forced markup and then
// constrains the answer.
#include <gtest/gtest.h>

#include <bit>
#include <limits>

#include "spec_test_util.h"

#include "engine/grammar_constraint.h"
#include "engine/reasoning_budget.h"
#include "grammar/grammar_test_util.h"
#include "grammar/response_grammar.h"
#include "text/model_format.h"

using namespace lilac;
using grammar::test::qwen3;

namespace {

constexpr int64_t kVocab = 248320;

std::vector<int32_t> ids(std::string_view text) { return qwen3().encode(text, /*parse_special=*/true); }

ReasoningBudgetConstraint budget(int64_t n, std::shared_ptr<TokenConstraint> inner = nullptr) {
  return ReasoningBudgetConstraint(qwen3(), kVocab, n, ids("\n</think>\n\n"), "</think>", std::move(inner));
}

// The one token a mask allows (-1: none or several).
int32_t only(const uint32_t* mask) {
  int32_t t = -1;
  for (int64_t w = 0; w < (kVocab + 31) / 32; ++w) {
    if (!mask[w]) continue;
    if (t >= 0 || std::popcount(mask[w]) != 1) return -1;
    t = int32_t(w * 32 + std::countr_zero(mask[w]));
  }
  return t;
}

}  // namespace

TEST(ReasoningBudget, ForcesTheClosingMarkupWhenTheBudgetRunsOut) {
  auto c = budget(3);
  const std::vector<int32_t> text = ids(" one two three four");
  ASSERT_GE(text.size(), 4u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(c.free_choices(), 3 - i);
    EXPECT_EQ(c.allowed(), nullptr);
    c.accept(text[size_t(i)]);
  }
  EXPECT_TRUE(c.forcing());
  EXPECT_EQ(c.free_choices(), 0);
  for (int32_t t : ids("\n</think>\n\n")) {
    const uint32_t* m = c.allowed();
    ASSERT_NE(m, nullptr);
    EXPECT_EQ(only(m), t);
    c.accept(t);
  }
  EXPECT_FALSE(c.open());
  EXPECT_FALSE(c.forcing());
  EXPECT_EQ(c.allowed(), nullptr);
  EXPECT_EQ(c.free_choices(), std::numeric_limits<int64_t>::max());
}

TEST(ReasoningBudget, ABudgetOfZeroForcesTheFirstChoice) {
  auto c = budget(0);
  EXPECT_EQ(c.free_choices(), 0);
  EXPECT_EQ(only(c.allowed()), ids("\n")[0]);
}

TEST(ReasoningBudget, ABlockTheModelClosesIsNeverForced) {
  for (const std::vector<int32_t>& close : {ids("</think>"), std::vector<int32_t>{}}) {
    auto c = budget(4);
    std::vector<int32_t> text = ids("ok");
    if (close.empty())  // the marker spelled in ordinary tokens, split across them
      for (char ch : std::string("</think>")) text.push_back(ids(std::string(1, ch))[0]);
    else
      text.insert(text.end(), close.begin(), close.end());
    ASSERT_LE(text.size(), 10u);
    for (int32_t t : text) c.accept(t);
    EXPECT_FALSE(c.open());
    for (int i = 0; i < 10; ++i) {
      EXPECT_EQ(c.allowed(), nullptr);
      c.accept(text[0]);
    }
    EXPECT_FALSE(c.forcing());
  }
}

// Under the response grammar (reasoning, then a JSON object): the forced markup is what the grammar allows, it
// accepts it, and the answer is constrained after it.
TEST(ReasoningBudget, AResponseGrammarAcceptsTheForcedMarkup) {
  grammar::ResponseSpec spec;
  spec.content = grammar::ResponseSpec::Content::JsonObject;
  spec.in_reasoning = true;
  auto g = grammar::test::compiled(grammar::build_response_grammar(spec, qwen3_6_format().markup(), qwen3()));
  auto inner = std::make_shared<GrammarConstraint>(g, std::vector<int32_t>{grammar::test::qwen3_im_end()});
  auto c = budget(2, inner);
  EXPECT_EQ(c.free_choices(), 0);  // a grammar masks every choice: no speculation
  for (int32_t t : ids(" hmm ok")) {
    ASSERT_FALSE(c.forcing());
    c.allowed();
    c.accept(t);
  }
  for (int32_t t : ids("\n</think>\n\n")) {
    ASSERT_TRUE(c.forcing());
    EXPECT_EQ(only(c.allowed()), t);
    c.accept(t);  // GrammarConstraint throws for a token outside its mask
  }
  EXPECT_FALSE(c.open());
  const uint32_t* m = c.allowed();
  ASSERT_NE(m, nullptr);
  const int32_t brace = ids("{")[0], word = ids("hello")[0];
  EXPECT_TRUE((m[brace >> 5] >> (brace & 31)) & 1u);
  EXPECT_FALSE((m[word >> 5] >> (word & 31)) & 1u);  // the answer is JSON now
}

// With speculative decoding: a budgeted generation speculates over its free choices and steps plainly while the
// markup is forced; the tokens are plain decoding's with the same budget (sampled, with penalties), the forced
// markup where the budget ran out. (The tiny model's vocabulary is 1,000 ids: the "markup" is three of them.)
TEST(ReasoningBudget, SpeculatesUntilTheCutAndGivesPlainDecodingsTokens) {
  const std::vector<int32_t> close = {5, 6, 7};
  std::string marker;
  for (int32_t t : close) marker += tokenizer().token_bytes(t);
  auto make = [&] {
    return std::make_shared<ReasoningBudgetConstraint>(tokenizer(), 1000, 17, close, marker, nullptr);
  };
  auto be = make_cpu_backend(tiny_mtp(), 1);
  auto r0 = request(prompt_of(9, 4), 40, 0);
  r0.sampling.temperature = 0.9f;
  r0.sampling.repetition_penalty = 1.2f;
  r0.sampling.seed = 5;
  r0.constraint = make();
  auto s0 = be->new_session(64);
  Generator plain(*s0, tokenizer(), nullptr);
  const Outcome ref = run(plain, r0);
  ASSERT_EQ(ref.ids.size(), 40u);
  EXPECT_EQ(std::vector<int32_t>(ref.ids.begin() + 17, ref.ids.begin() + 20), close);
  auto s1 = be->new_session(64);
  Generator spec(*s1, tokenizer(), nullptr);
  auto r = r0;
  r.draft_tokens = 3;
  r.constraint = make();
  spec.set_draft_hook(truth_with_errors(ref.ids, 3));
  const Outcome inj = run(spec, r);
  expect_same(inj, ref, "injected drafts");
  EXPECT_GT(inj.st.spec_accepted, 0);
  EXPECT_LT(inj.st.decode_steps, 39);  // speculative rounds took several tokens at once
}

// A template that lets the model open the block itself ("<think>" not in the generation prompt): the budget applies
// when the output begins with the open marker (as the output parser reads it), counted from the output's start, and
// nothing is forced when it does not.
TEST(ReasoningBudget, ABlockTheModelOpensItselfIsBudgetedToo) {
  auto make = [] {
    return ReasoningBudgetConstraint(qwen3(), kVocab, 4, ids("\n</think>\n\n"), "</think>", nullptr, "<think>");
  };
  for (const std::vector<int32_t>& open : {ids("<think>"), std::vector<int32_t>{ids("<")[0], ids("think")[0], ids(">")[0]}}) {
    auto c = make();
    std::vector<int32_t> text = open;
    for (int32_t t : ids(" hmm hmm hmm")) text.push_back(t);
    size_t i = 0;
    for (; i < text.size() && !c.forcing(); ++i) {
      EXPECT_EQ(c.allowed(), nullptr);
      c.accept(text[i]);
    }
    EXPECT_EQ(i, 4u);  // forced after 4 choices, the open marker's included
    ASSERT_TRUE(c.forcing());
    EXPECT_EQ(only(c.allowed()), ids("\n")[0]);
  }
  auto plain = make();
  EXPECT_EQ(plain.free_choices(), 4);
  for (int32_t t : ids("Hello there, no reasoning at all here")) {
    EXPECT_EQ(plain.allowed(), nullptr);
    plain.accept(t);
  }
  EXPECT_FALSE(plain.forcing());
  EXPECT_FALSE(plain.open());
  EXPECT_EQ(plain.free_choices(), std::numeric_limits<int64_t>::max());
}

// A budget that leaves the closing markup fewer choices than it has tokens before max_tokens (max_tokens - 1, the most
// Anthropic's thinking.budget_tokens may be): the markup was forced from the budget on and cut by max_tokens, the
// block left open. It is forced early enough to end on the last choice now; a budget with room is unchanged.
TEST(ReasoningBudget, TheForcedMarkupEndsWithinMaxTokens) {
  const std::vector<int32_t> close = ids("\n</think>\n\n");
  const int64_t k = int64_t(close.size()), max_tokens = 12;
  const int32_t tick = ids(" tick")[0];
  for (int64_t b : {max_tokens - 1, max_tokens - 2, max_tokens - k, max_tokens - k - 2}) {
    ReasoningBudgetConstraint c(qwen3(), kVocab, b, close, "</think>", nullptr, "", max_tokens);
    std::string text;
    for (int64_t n = 0; n < max_tokens; ++n) {  // the reasoning would go on to the limit: " tick" whenever free
      const uint32_t* m = c.allowed();
      const int32_t t = m ? only(m) : tick;
      ASSERT_GE(t, 0);
      c.accept(t);
      text += qwen3().token_bytes(t);
    }
    std::string want;
    for (int64_t i = 0; i < std::min(b, max_tokens - k); ++i) want += " tick";
    want += "\n</think>\n\n";
    if (b < max_tokens - k) want += " tick tick";  // free again after the markup
    EXPECT_EQ(text, want) << "budget " << b;
    EXPECT_FALSE(c.open()) << "budget " << b;
    EXPECT_FALSE(c.forcing()) << "budget " << b;
  }
  // max_tokens shorter than the markup: forced from the first choice.
  ReasoningBudgetConstraint tiny(qwen3(), kVocab, 1, close, "</think>", nullptr, "", 2);
  EXPECT_EQ(tiny.free_choices(), 0);
  EXPECT_EQ(only(tiny.allowed()), close[0]);
}
