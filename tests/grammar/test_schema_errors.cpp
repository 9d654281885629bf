// Schemas the compiler refuses: unsupported keywords (named with their JSON pointer), invalid
// values, unsatisfiable and too large schemas. Never silently ignored.
#include <gtest/gtest.h>

#include "grammar_corpus.h"
#include "grammar_test_util.h"

namespace lilac::grammar::test {
namespace {

struct Refusal {
  std::string keyword, path, message;
};

Refusal refuse(const std::string& schema, const SchemaLimits& lim = {}) {
  try {
    compile_json_schema_text(schema, lim);
  } catch (const SchemaError& e) {
    return {e.keyword(), e.path(), e.what()};
  }
  ADD_FAILURE() << "accepted: " << schema;
  return {};
}

TEST(SchemaErrors, UnsupportedKeywordsNameKeywordAndPath) {
  const std::vector<std::pair<std::string, std::string>> kws = {
      {"minProperties", "1"},     {"maxProperties", "1"},     {"patternProperties", "{}"}, {"propertyNames", "{}"},
      {"dependentRequired", "{}"}, {"dependentSchemas", "{}"}, {"not", "{}"},               {"if", "{}"},
      {"then", "{}"},             {"else", "{}"},             {"multipleOf", "2"},          {"uniqueItems", "true"},
      {"contains", "{}"},         {"minContains", "1"},       {"maxContains", "1"},         {"unevaluatedProperties", "false"},
      {"unevaluatedItems", "false"}, {"additionalItems", "false"}, {"$anchor", "\"a\""},     {"$dynamicRef", "\"#a\""},
      {"nullable", "true"},       {"contentEncoding", "\"base64\""}, {"x-extension", "1"}, {"discriminator", "{}"}};
  for (const auto& [kw, val] : kws) {
    const std::string schema = R"({"type":"object","properties":{"a b":{"type":"object","properties":{"c/d":{")" + kw +
                               "\":" + val + "}}}}}";
    Refusal r = refuse(schema);
    EXPECT_EQ(r.keyword, kw);
    EXPECT_EQ(r.path, "#/properties/a b/properties/c~1d/" + kw) << kw;
    EXPECT_NE(r.message.find("unsupported JSON Schema keyword \"" + kw + "\""), std::string::npos) << r.message;
  }
  // Also inside $defs that nothing references, items, anyOf branches.
  EXPECT_EQ(refuse(R"({"$defs":{"x":{"not":{}}},"type":"string"})").path, "#/$defs/x/not");
  EXPECT_EQ(refuse(R"({"type":"array","items":{"uniqueItems":true}})").path, "#/items/uniqueItems");
  EXPECT_EQ(refuse(R"({"anyOf":[{"type":"string"},{"multipleOf":3}]})").path, "#/anyOf/1/multipleOf");
}

TEST(SchemaErrors, InvalidValues) {
  EXPECT_EQ(refuse(R"({"type":"float"})").keyword, "type");
  EXPECT_EQ(refuse(R"({"type":["string","string"]})").keyword, "type");
  EXPECT_EQ(refuse(R"({"type":"string","minLength":-1})").keyword, "minLength");
  EXPECT_EQ(refuse(R"({"type":"string","maxLength":1.5})").keyword, "maxLength");
  EXPECT_EQ(refuse(R"({"required":"a"})").keyword, "required");
  EXPECT_EQ(refuse(R"({"enum":[]})").keyword, "enum");
  EXPECT_EQ(refuse(R"({"anyOf":[]})").keyword, "anyOf");
  EXPECT_EQ(refuse(R"({"properties":[]})").keyword, "properties");
  EXPECT_EQ(refuse(R"({"type":"array","items":[{"type":"string"}]})").keyword, "items");
  EXPECT_EQ(refuse(R"({"type":"string","pattern":"(a"})").keyword, "pattern");
  EXPECT_EQ(refuse(R"j({"type":"string","pattern":"(?=x)"})j").keyword, "pattern");
  EXPECT_EQ(refuse(R"({"type":"string","format":"ipv4"})").keyword, "format");
  EXPECT_EQ(refuse(R"({"$ref":"http://example.com/s.json"})").keyword, "$ref");
  EXPECT_EQ(refuse(R"({"$ref":"#/$defs/missing"})").keyword, "$ref");
  EXPECT_EQ(refuse(R"({"$ref":"#anchor"})").keyword, "$ref");
  EXPECT_EQ(refuse(R"(42)").path, "#");
  EXPECT_EQ(refuse(R"({"properties":{"a":"string"}})").path, "#/properties/a");
  EXPECT_EQ(refuse(R"({"type": "object",)").path, "#");  // not JSON
  // Keywords of the subset in combinations it does not cover.
  EXPECT_EQ(refuse(R"({"type":"number","minimum":0})").keyword, "minimum");
  EXPECT_EQ(refuse(R"({"$ref":"#/$defs/a","type":"string","$defs":{"a":{}}})").keyword, "type");
  EXPECT_EQ(refuse(R"({"enum":["a"],"maxLength":3})").keyword, "maxLength");
  EXPECT_EQ(refuse(R"({"anyOf":[{"type":"string"}],"minLength":1})").keyword, "minLength");
  EXPECT_EQ(refuse(R"({"allOf":[{"type":"string"},{"maxLength":2}]})").keyword, "allOf");
  EXPECT_EQ(refuse(R"({"allOf":[{"properties":{"a":{"type":"string"}}},{"properties":{"a":{"type":"integer"}}}]})").keyword,
            "allOf");
}

TEST(SchemaErrors, OneOfMustBeDisjoint) {
  Refusal r = refuse(R"({"oneOf":[{"type":"string"},{"type":"string","maxLength":3}]})");
  EXPECT_EQ(r.keyword, "oneOf");
  EXPECT_EQ(r.path, "#/oneOf");
  EXPECT_EQ(refuse(R"({"oneOf":[{"type":"integer"},{"type":"number"}]})").keyword, "oneOf");
  EXPECT_EQ(refuse(R"({"oneOf":[{"enum":["a","b"]},{"enum":["b","c"]}]})").keyword, "oneOf");
  EXPECT_EQ(refuse(R"({"oneOf":[{"type":"object"},{"type":"object","properties":{"k":{"const":1}},"required":["k"]}]})").keyword,
            "oneOf");
  EXPECT_NO_THROW(compile_json_schema_text(R"({"oneOf":[{"enum":["a","b"]},{"enum":["c"]},{"type":"null"}]})"));
}

TEST(SchemaErrors, Unsatisfiable) {
  EXPECT_EQ(refuse(R"({"type":"string","minLength":5,"maxLength":2})").keyword, "minLength");
  EXPECT_EQ(refuse(R"({"type":"integer","minimum":5,"maximum":2})").keyword, "minimum");
  EXPECT_EQ(refuse(R"({"type":"integer","exclusiveMinimum":1,"exclusiveMaximum":2})").keyword, "minimum");
  EXPECT_EQ(refuse(R"({"type":"array","minItems":3,"maxItems":2})").keyword, "minItems");
  EXPECT_EQ(refuse(R"({"type":"object","properties":{"a":{}},"required":["b"],"additionalProperties":false})").keyword,
            "required");
  EXPECT_EQ(refuse(R"({"const":"x","enum":["y"]})").keyword, "const");
  // Found by trimming the grammar: the deepest schema that matches nothing is named.
  Refusal r = refuse(R"({"type":"object","properties":{"a":{"type":"object","properties":{"b":false},"required":["b"]}},"required":["a"]})");
  EXPECT_NE(r.message.find("can never be satisfied"), std::string::npos) << r.message;
  EXPECT_EQ(r.path, "#/properties/a/properties/b") << r.message;
  EXPECT_EQ(refuse(R"({"type":"integer","enum":["a","b"]})").path, "#");
  EXPECT_EQ(refuse(R"({"type":"array","prefixItems":[{}],"items":false,"minItems":2})").path, "#");
  EXPECT_EQ(refuse(R"({"type":"string","pattern":"^a$","format":"date"})").path, "#");
  EXPECT_EQ(refuse(R"(false)").path, "#");
  // Optional parts that match nothing are fine: they are just never generated.
  Grammar g = compile_json_schema_text(R"({"type":"object","properties":{"a":false,"b":{"type":"integer"}}})");
  EXPECT_TRUE(accepts(g, R"({"b":1})"));
  EXPECT_FALSE(accepts(g, R"({"a":1})"));
}

TEST(SchemaErrors, TooLarge) {
  EXPECT_EQ(refuse(R"({"type":"array","maxItems":100000})").keyword, "maxItems");
  std::string deep = R"({"type":"string"})";
  for (int i = 0; i < 60; ++i) deep = R"({"type":"array","items":)" + deep + "}";
  EXPECT_NE(refuse(deep).message.find("nested deeper"), std::string::npos);
  SchemaLimits small;
  small.max_states = 200;
  EXPECT_NE(refuse(corpus::fifty_property_schema(), small).message.find("too large"), std::string::npos);
  EXPECT_EQ(refuse(R"({"type":"string","pattern":"^[a-z]+$","maxLength":5000})").keyword, "maxLength");
}

TEST(SchemaErrors, LeftRecursionIsRefused) {
  EXPECT_EQ(refuse(R"({"$ref":"#"})").path, "#");
  EXPECT_EQ(refuse(R"({"anyOf":[{"$ref":"#"},{"type":"null"}]})").path, "#");
  EXPECT_EQ(refuse(R"({"$ref":"#/$defs/a","$defs":{"a":{"$ref":"#/$defs/b"},"b":{"$ref":"#/$defs/a"}}})").path, "#/$defs/a");
  // Recursion that reads something first is fine.
  EXPECT_NO_THROW(compile_json_schema_text(R"({"type":"array","items":{"$ref":"#"}})"));
}

}  // namespace
}  // namespace lilac::grammar::test
