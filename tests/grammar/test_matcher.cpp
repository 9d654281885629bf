// The Matcher and GrammarCache interfaces on a small hand-made vocabulary.
#include <gtest/gtest.h>

#include "grammar/cache.h"
#include "grammar_test_util.h"

namespace lilac::grammar::test {
namespace {

// Ids 0..255: the bytes; then a few merged tokens; then markup that never appears in text.
struct TinyVocab {
  std::vector<std::string> tokens;
  std::vector<uint8_t> excluded;
  int32_t end = -1, markup = -1;
  TinyVocab() {
    for (int b = 0; b < 256; ++b) tokens.push_back(std::string(1, char(b)));
    for (const char* t : {"{\"", "\":", "\"}", "true", "tr", "ue}", "\", \"", "ab", "abc", "\n  "}) tokens.push_back(t);
    excluded.assign(tokens.size(), 0);
    end = int32_t(tokens.size());
    tokens.push_back("<|im_end|>");
    markup = int32_t(tokens.size());
    tokens.push_back("<tool_call>");
    excluded.resize(tokens.size(), 1);
  }
  int32_t id(const std::string& s) const {
    for (size_t i = 0; i < tokens.size(); ++i)
      if (tokens[i] == s && !excluded[i]) return int32_t(i);
    return -1;
  }
};

std::shared_ptr<const Vocabulary> tiny_vocab(const TinyVocab& t, int64_t mask_size = 300) {
  return std::make_shared<const Vocabulary>(t.tokens, t.excluded, mask_size);
}

TEST(GrammarMatcher, MaskAcceptRollbackAndEnd) {
  TinyVocab tv;
  auto v = tiny_vocab(tv);
  EXPECT_EQ(v->mask_words(), 10u);  // 300 ids
  auto g = std::make_shared<CompiledGrammar>(
      compile_json_schema_text(R"({"type":"object","properties":{"a":{"type":"boolean"}},"required":["a"]})"), v, nullptr);
  Matcher m(g, {tv.end});
  std::vector<uint32_t> mask(m.mask_words());
  m.fill_mask(mask);
  EXPECT_TRUE(bit(mask, tv.id("{")));
  EXPECT_TRUE(bit(mask, tv.id("{\"")));
  EXPECT_TRUE(bit(mask, tv.id(" ")));
  EXPECT_TRUE(bit(mask, tv.id("\n  ")));  // leading whitespace
  EXPECT_FALSE(bit(mask, tv.id("\"")));
  EXPECT_FALSE(bit(mask, tv.end));
  EXPECT_FALSE(bit(mask, tv.markup));
  EXPECT_FALSE(bit(mask, 299));  // beyond the tokenizer
  EXPECT_FALSE(m.accept_token(tv.id("ab")));  // refused, state unchanged
  ASSERT_TRUE(m.accept_token(tv.id("{\"")));
  ASSERT_TRUE(m.accept_bytes("a"));
  ASSERT_TRUE(m.accept_token(tv.id("\":")));
  const Matcher::State before_value = m.state();
  ASSERT_TRUE(m.accept_token(tv.id("tr")));
  m.fill_mask(mask);
  EXPECT_TRUE(bit(mask, tv.id("ue}")));
  EXPECT_FALSE(bit(mask, tv.id("true")));
  m.set_state(before_value);  // roll back "tr"
  m.fill_mask(mask);
  EXPECT_TRUE(bit(mask, tv.id("true")));
  EXPECT_TRUE(bit(mask, tv.id("tr")));
  ASSERT_TRUE(m.accept_token(tv.id("true")));
  EXPECT_FALSE(m.can_end());
  ASSERT_TRUE(m.accept_token(tv.id("}")));
  EXPECT_TRUE(m.can_end());
  EXPECT_FALSE(m.must_end());  // trailing whitespace may still come
  m.fill_mask(mask);
  EXPECT_TRUE(bit(mask, tv.end));
  EXPECT_TRUE(bit(mask, tv.id("\n")));
  EXPECT_FALSE(bit(mask, tv.id("}")));
  EXPECT_EQ(m.shortest_completion(), std::vector<int32_t>());
  ASSERT_TRUE(m.accept_token(tv.end));
  EXPECT_TRUE(m.finished());
  EXPECT_FALSE(m.accept_token(tv.id(" ")));
  m.fill_mask(mask);  // finished: only the end token (never an empty mask)
  EXPECT_TRUE(bit(mask, tv.end));
  EXPECT_EQ(allowed_count(mask), 1u);
  std::vector<uint32_t> small(2);
  EXPECT_THROW(m.fill_mask(small), Error);
  EXPECT_THROW(Matcher(g, {300}), Error);
}

TEST(GrammarMatcher, ShortestCompletion) {
  TinyVocab tv;
  auto g = std::make_shared<CompiledGrammar>(
      compile_json_schema_text(R"({"type":"object","properties":{"k":{"type":"array","items":{"type":"string"},"minItems":2}},"required":["k"]})"),
      tiny_vocab(tv), nullptr);
  Matcher m(g, {tv.end});
  auto text = [&](const std::optional<std::vector<int32_t>>& ids) {
    std::string s;
    for (int32_t t : ids.value()) s += tv.tokens[size_t(t)];  // single bytes
    return s;
  };
  EXPECT_EQ(text(m.shortest_completion()), R"({"k":["",""]})");
  ASSERT_TRUE(m.accept_bytes(R"({"k":["x)"));
  EXPECT_EQ(text(m.shortest_completion()), R"(",""]})");
}

TEST(GrammarCache, CompilesOncePerSchemaAndEvicts) {
  TinyVocab tv;
  GrammarCache cache(tiny_vocab(tv), 2);
  auto a = cache.json_schema_text(R"({"type":"string"})");
  auto a2 = cache.json_schema_text(R"({ "type" : "string" })");  // same schema, other spacing
  EXPECT_EQ(a.get(), a2.get());
  auto b = cache.json_schema_text(R"({"type":"integer"})");
  EXPECT_NE(a.get(), b.get());
  auto o = cache.json_object();
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_NE(cache.json_schema_text(R"({"type":"string"})").get(), a.get());  // evicted, compiled again
  EXPECT_EQ(cache.json_object().get(), o.get());
  EXPECT_THROW(cache.json_schema_text(R"({"type":"strin"})"), SchemaError);
  EXPECT_THROW(cache.json_schema_text(R"({"type":)"), SchemaError);
  // Property order is part of the key (it changes the documents).
  auto p1 = cache.json_schema_text(R"({"properties":{"a":{},"b":{}},"required":["a","b"]})");
  auto p2 = cache.json_schema_text(R"({"properties":{"b":{},"a":{}},"required":["a","b"]})");
  EXPECT_NE(p1.get(), p2.get());
  EXPECT_TRUE(accepts(p1->grammar(), R"({"a":1,"b":2})"));
  EXPECT_TRUE(accepts(p2->grammar(), R"({"b":2,"a":1})"));
}

}  // namespace
}  // namespace lilac::grammar::test
