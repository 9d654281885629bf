#include <gtest/gtest.h>

#include "grammar_test_util.h"

namespace lilac::grammar::test {

TEST(SchemaSmoke, SimpleObject) {
  const char* s = R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"}},"required":["name"]})";
  auto g = compile_json_schema_text(s);
  EXPECT_TRUE(accepts(g, R"({"name":"x"})"));
  EXPECT_TRUE(accepts(g, R"({"name": "x", "age": 3})"));
  EXPECT_TRUE(accepts(g, "{\n  \"name\": \"x\",\n  \"age\": -12\n}\n"));
  EXPECT_FALSE(accepts(g, R"({"age": 3})"));
  EXPECT_FALSE(accepts(g, R"({"name":"x","age":3.5})"));
  EXPECT_FALSE(accepts(g, R"({"age":3,"name":"x"})"));  // declared order
  EXPECT_FALSE(accepts(g, R"({"name":"x",})"));
}

TEST(SchemaSmoke, MaskMatchesBruteForce) {
  const char* s = R"({"type":"object","properties":{"name":{"type":"string","maxLength":8},"n":{"type":"integer"}},"required":["name","n"]})";
  auto cg = compiled(compile_json_schema_text(s));
  Matcher m(cg, {qwen3_im_end()});
  std::vector<uint32_t> mask(m.mask_words());
  const std::string doc = R"({"name": "abc", "n": 12})";
  auto ids = qwen3().encode(doc);
  for (size_t step = 0; step <= ids.size(); ++step) {
    m.fill_mask(mask);
    size_t n_allowed = 0;
    for (int32_t t = 0; t < int32_t(qwen3_vocab()->mask_size()); ++t) {
      const bool want = m.allows(t);
      ASSERT_EQ(bit(mask, t), want) << "step " << step << " token " << t << " '" << qwen3().token_bytes(t) << "'";
      n_allowed += want;
    }
    EXPECT_GT(n_allowed, 0u);
    if (step < ids.size()) {
      ASSERT_TRUE(m.accept_token(ids[step])) << step;
    }
  }
  EXPECT_TRUE(m.can_end());
}

}  // namespace lilac::grammar::test
