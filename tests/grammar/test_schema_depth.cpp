// Schemas whose nesting the document check cannot see: $ref chains through $defs. The check bounds nesting inside
// the document (48 levels), but each $ref hop starts again, and the compiler recursed once per subschema: a few
// thousand $defs chained through "properties" or "items" overflowed the stack (a crash of the server, which compiles
// response_format and tool schemas on its request threads).
#include <gtest/gtest.h>

#include "grammar_test_util.h"

namespace lilac::grammar::test {
namespace {

// {"$ref": "#/$defs/d0", "$defs": {"d0": pre{"$ref": "#/$defs/d1"}post, ..., "dn": {"type": "string"}}}
std::string ref_chain(int n, const std::string& pre, const std::string& post) {
  std::string s = R"({"$ref":"#/$defs/d0","$defs":{)";
  for (int i = 0; i < n; ++i)
    s += "\"d" + std::to_string(i) + "\":" + pre + R"({"$ref":"#/$defs/d)" + std::to_string(i + 1) + "\"}" + post + ",";
  return s + "\"d" + std::to_string(n) + R"(":{"type":"string"}}})";
}

struct Chain {
  const char* name;
  std::string pre, post;
};

const std::vector<Chain>& chains() {
  static const std::vector<Chain> c = {
      {"ref", "", ""},
      {"properties", R"({"type":"object","properties":{"x":)", R"(},"required":["x"]})"},
      {"items", R"({"type":"array","items":)", R"(,"minItems":1,"maxItems":1})"},
      {"anyOf", R"({"anyOf":[{"type":"null"},)", "]}"},
      {"additionalProperties", R"({"type":"object","additionalProperties":)", "}"},
  };
  return c;
}

TEST(SchemaDepth, LongRefChainsAreRefusedNotACrash) {
  for (const Chain& c : chains()) {
    // 19,000 plain $refs or 4,000 through properties/items overflowed the 8 MB stack before the limit.
    const int n = c.pre.empty() ? 19000 : 6000;
    try {
      compile_json_schema_text(ref_chain(n, c.pre, c.post));
      ADD_FAILURE() << c.name << ": a chain of " << n << " $refs compiled";
    } catch (const SchemaError& e) {
      EXPECT_EQ(e.keyword(), "$ref") << c.name << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find("nested deeper than 256 levels through $ref"), std::string::npos)
          << c.name << ": " << e.what();
      EXPECT_EQ(e.path().rfind("#/$defs/d", 0), 0u) << c.name << ": " << e.path();
    }
  }
}

TEST(SchemaDepth, ShortRefChainsStillCompile) {
  Grammar props = compile_json_schema_text(ref_chain(100, chains()[1].pre, chains()[1].post));
  std::string doc = "\"s\"";
  for (int i = 0; i < 100; ++i) doc = "{\"x\":" + doc + "}";
  EXPECT_TRUE(accepts(props, doc));
  EXPECT_FALSE(accepts(props, doc.substr(5, doc.size() - 6)));  // one level short
  Grammar refs = compile_json_schema_text(ref_chain(250, "", ""));
  EXPECT_TRUE(accepts(refs, "\"s\""));
  EXPECT_FALSE(accepts(refs, "1"));
  // Recursion is not a chain: a tree of any depth compiles once.
  Grammar tree = compile_json_schema_text(
      R"({"type":"object","properties":{"kids":{"type":"array","items":{"$ref":"#"}}},"required":["kids"]})");
  std::string t = R"({"kids":[]})";
  for (int i = 0; i < 300; ++i) t = R"({"kids":[)" + t + "]}";
  EXPECT_TRUE(accepts(tree, t));
}

}  // namespace
}  // namespace lilac::grammar::test
