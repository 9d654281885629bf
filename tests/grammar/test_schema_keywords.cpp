// Every supported keyword: documents the compiled grammar must accept and must reject (bytes).
#include <gtest/gtest.h>

#include "grammar_test_util.h"

namespace lilac::grammar::test {
namespace {

void expect(const std::string& schema, const std::vector<std::string>& yes, const std::vector<std::string>& no) {
  Grammar g = compile_json_schema_text(schema);
  for (const auto& d : yes) EXPECT_TRUE(accepts(g, d)) << schema << "\n  should accept: " << d;
  for (const auto& d : no) EXPECT_FALSE(accepts(g, d)) << schema << "\n  should reject: " << d;
}

TEST(SchemaKeywords, TypeEachOfSeven) {
  expect(R"({"type":"null"})", {"null", " null "}, {"nul", "Null", "0", "\"null\""});
  expect(R"({"type":"boolean"})", {"true", "false"}, {"True", "1", "null"});
  expect(R"({"type":"string"})", {"\"\"", "\"a b\"", "\"\\u00e9\""}, {"a", "'a'", "\"a", "1"});
  expect(R"({"type":"integer"})", {"0", "-7", "1234567890123456789"},
         {"01", "-0", "1.0", "1e3", "+1", "12345678901234567890", "-"});
  expect(R"({"type":"number"})", {"0", "-0.5", "3.25e10", "1E-2", "6.02e+23", "-0"},
         {".5", "1.", "01", "1e", "1e123", "NaN", "Infinity"});
  expect(R"({"type":"object"})", {"{}", R"({"a":[1,{"b":null}]})"}, {"[]", "{", R"({"a"})", R"({a:1})"});
  expect(R"({"type":"array"})", {"[]", R"([1,"x",[],{}])"}, {"{}", "[1,]", "[,1]"});
}

TEST(SchemaKeywords, TypeListAndEmptySchema) {
  expect(R"({"type":["string","null"]})", {"\"x\"", "null"}, {"1", "true"});
  expect(R"({"type":["integer","number"]})", {"1", "1.5"}, {"\"1\""});
  expect(R"({})", {"1", "\"s\"", "null", "[{}]", R"({"k":{"k":[true]}})"}, {"", "{]"});
  expect(R"(true)", {"false", "[]"}, {"x"});
  expect(R"({"title":"t","description":"d","default":1,"examples":[1],"$schema":"x","$comment":"c"})", {"1"}, {});
}

TEST(SchemaKeywords, PropertiesRequiredAndOrder) {
  const std::string s = R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"},"c":{"type":"boolean"}},"required":["b"]})";
  expect(s, {R"({"b":"x"})", R"({"a":1,"b":"x"})", R"({"b":"x","c":true})", R"({"a":1,"b":"x","c":false})"},
         {R"({})", R"({"a":1})", R"({"b":"x","a":1})", R"({"c":true,"b":"x"})", R"({"b":"x","d":1})",
          R"({"b":"x","b":"y"})", R"({"b":1})"});
  // Whitespace: at most one space, or one newline plus up to 32 spaces / 8 tabs.
  expect(s, {"{ \"b\" : \"x\" }", "{\n  \"b\": \"x\"\n}", "{\n\t\t\"b\":\"x\"}", "\n{\"b\":\"x\"}\n",
             "{\"b\":\n" + std::string(32, ' ') + "\"x\"}"},
         {"{  \"b\":\"x\"}", "{\n\n\"b\":\"x\"}", "{\"b\":\n" + std::string(33, ' ') + "\"x\"}",
          "{\"b\":\n" + std::string(9, '\t') + "\"x\"}", "{\r\n\"b\":\"x\"}", "  {\"b\":\"x\"}"});
}

TEST(SchemaKeywords, AllOptionalAndAllRequired) {
  expect(R"({"type":"object","properties":{"a":{},"b":{},"c":{}}})",
         {"{}", R"({"a":1})", R"({"b":1})", R"({"c":1})", R"({"a":1,"c":2})", R"({"a":1,"b":2,"c":3})"},
         {R"({"c":1,"a":2})", R"({"a":1,})", R"({,"a":1})"});
  expect(R"({"type":"object","properties":{"a":{},"b":{}},"required":["a","b"]})", {R"({"a":1,"b":2})"},
         {R"({"a":1})", R"({"b":2})"});
}

TEST(SchemaKeywords, AdditionalProperties) {
  // Absent: only declared names are generated.
  expect(R"({"type":"object","properties":{"a":{"type":"integer"}}})", {R"({"a":1})"}, {R"({"a":1,"z":2})"});
  expect(R"({"type":"object","properties":{"a":{"type":"integer"}},"additionalProperties":false})", {R"({"a":1})"},
         {R"({"z":2})"});
  // A schema: extra names (not declared ones) after the declared properties.
  expect(R"({"type":"object","properties":{"a":{"type":"integer"}},"additionalProperties":{"type":"string"}})",
         {R"({"a":1,"z":"x"})", R"({"z":"x","y":"w"})", R"({"ab":"x"})", R"({"":"x"})"},
         {R"({"z":1})", R"({"a":"x"})", R"({"z":"x","a":1})", R"({"a":1,"a":"x"})"});
  expect(R"({"type":"object","additionalProperties":true})", {R"({"x":[1]})", "{}"}, {});
  // Required but not declared: an extra property with any value.
  expect(R"({"type":"object","properties":{"a":{}},"required":["a","q"]})", {R"({"a":1,"q":[]})"}, {R"({"a":1})"});
}

TEST(SchemaKeywords, ItemsPrefixItemsAndCounts) {
  expect(R"({"type":"array","items":{"type":"integer"}})", {"[]", "[1]", "[1, 2,3]", "[\n  1,\n  2\n]"},
         {"[1.5]", "[\"a\"]", "[1,]"});
  expect(R"({"type":"array","items":{"type":"integer"},"minItems":2,"maxItems":3})", {"[1,2]", "[1,2,3]"},
         {"[]", "[1]", "[1,2,3,4]"});
  expect(R"({"type":"array","prefixItems":[{"type":"string"},{"type":"boolean"}]})",
         {"[]", R"(["a"])", R"(["a",true])", R"(["a",true,3,{}])"}, {R"([true])", R"(["a","b"])"});
  expect(R"({"type":"array","prefixItems":[{"type":"string"}],"items":false})", {"[]", R"(["a"])"}, {R"(["a",1])"});
  expect(R"({"type":"array","prefixItems":[{"type":"string"}],"items":{"type":"null"},"minItems":2})",
         {R"(["a",null])", R"(["a",null,null])"}, {R"(["a"])", R"(["a",1])"});
  expect(R"({"type":"array","maxItems":0})", {"[]"}, {"[1]"});
}

TEST(SchemaKeywords, EnumAndConst) {
  expect(R"({"enum":["red","green",1,null,{"a":[1]},true]})",
         {"\"red\"", "\"green\"", "1", "null", R"({"a":[1]})", "true"}, {"\"blue\"", "2", "false", R"({"a":[2]})", "\"re\""});
  expect(R"({"type":"string","enum":["a",1,"b"]})", {"\"a\"", "\"b\""}, {"1"});
  expect(R"({"const":"only"})", {"\"only\""}, {"\"Only\""});
  expect(R"({"const":{"k":"é\"\n"}})", {"{\"k\":\"\xC3\xA9\\\"\\n\"}"}, {});
}

TEST(SchemaKeywords, AnyOfOneOfAllOf) {
  expect(R"({"anyOf":[{"type":"string","maxLength":2},{"type":"string","pattern":"^x+$"},{"type":"integer"}]})",
         {"\"ab\"", "\"xxxxx\"", "5"}, {"\"abc\"", "true"});
  expect(R"({"oneOf":[{"type":"string"},{"type":"integer"},{"const":true}]})", {"\"s\"", "3", "true"}, {"false"});
  expect(R"({"oneOf":[{"type":"object","properties":{"kind":{"const":"a"},"x":{"type":"integer"}},"required":["kind"]},
                     {"type":"object","properties":{"kind":{"const":"b"},"y":{"type":"string"}},"required":["kind"]}]})",
         {R"({"kind":"a","x":1})", R"({"kind":"b","y":"s"})"}, {R"({"kind":"a","y":"s"})", R"({"kind":"c"})"});
  expect(R"({"allOf":[{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]},
                     {"properties":{"b":{"type":"string"}},"required":["b"]}]})",
         {R"({"a":1,"b":"x"})"}, {R"({"a":1})", R"({"b":"x"})", R"({"b":"x","a":1})"});
  expect(R"({"allOf":[{"$ref":"#/$defs/s"}],"description":"wrapped","$defs":{"s":{"type":"string","enum":["x"]}}})",
         {"\"x\""}, {"\"y\""});
  // Branches that constrain nothing drop out (found by the schema_complete fuzz target: {"allOf": [{}, {}]}
  // generated objects only, so null, numbers or strings its schema accepts could not be written).
  expect(R"({"allOf":[{},{}]})", {"null", "1", "\"s\"", "{}", "[1]"}, {"", "{]"});
  expect(R"({"allOf":[{"description":"d"},{"type":"string","maxLength":2},true]})", {"\"ab\""}, {"\"abc\"", "1", "{}"});
}

TEST(SchemaKeywords, RefsAndRecursion) {
  expect(R"({"$defs":{"n":{"type":"integer","minimum":1}},"type":"object","properties":{"a":{"$ref":"#/$defs/n"}},"required":["a"]})",
         {R"({"a":5})"}, {R"({"a":0})"});
  expect(R"({"definitions":{"n":{"type":"boolean"}},"type":"array","items":{"$ref":"#/definitions/n"}})", {"[true]"}, {"[1]"});
  const std::string tree =
      R"({"type":"object","properties":{"v":{"type":"integer"},"kids":{"type":"array","items":{"$ref":"#"}}},"required":["v"]})";
  expect(tree, {R"({"v":1})", R"({"v":1,"kids":[{"v":2,"kids":[{"v":3,"kids":[]}]},{"v":4}]})"},
         {R"({"v":1,"kids":[{}]})", R"({"v":1,"kids":[{"v":"x"}]})"});
  expect(R"({"$ref":"#/$defs/list","$defs":{"list":{"anyOf":[{"type":"null"},{"type":"object","properties":{"head":{"type":"integer"},"tail":{"$ref":"#/$defs/list"}},"required":["head","tail"]}]}}})",
         {"null", R"({"head":1,"tail":{"head":2,"tail":null}})"}, {R"({"head":1})"});
  expect(R"({"properties":{"a~b":{"type":"integer"},"c/d":{"$ref":"#/properties/a~0b"}},"required":["c/d"]})",
         {R"({"c/d":1})"}, {R"({"c/d":"x"})"});
}

TEST(SchemaKeywords, StringLengthsCountCharacters) {
  expect(R"({"type":"string","minLength":2,"maxLength":3})",
         {"\"ab\"", "\"abc\"", "\"\xC3\xA9\xC3\xA9\"", "\"\\u00e9\\n\"", "\"\\ud83d\\ude00x\""},
         {"\"a\"", "\"abcd\"", "\"\xF0\x9F\x98\x80\""});
  expect(R"({"type":"string","minLength":1})", {"\"x\"", "\"xxxxxxxxxxxxxxxxxx\""}, {"\"\""});
  expect(R"({"type":"string","maxLength":0})", {"\"\""}, {"\"a\""});
}

TEST(SchemaKeywords, Pattern) {
  expect(R"({"type":"string","pattern":"^[A-Z]{3}-\\d{4}$"})", {"\"ABC-1234\""}, {"\"AB-1234\"", "\"ABC-12345\"", "\"abc-1234\""});
  expect(R"({"type":"string","pattern":"cat"})", {"\"cat\"", "\"concatenate\""}, {"\"dog\""});
  expect(R"({"type":"string","pattern":"^a.c$"})", {"\"abc\"", "\"a\\\"c\"", "\"a\\\\c\"", "\"a\xC3\xA9" "c\""},
         {"\"ac\"", "\"a\\nc\"", "\"a\\u0062c\""});
  expect(R"({"type":"string","pattern":"^[a-z]+$","minLength":2,"maxLength":3})", {"\"ab\"", "\"abc\""},
         {"\"a\"", "\"abcd\"", "\"aB\""});
}

TEST(SchemaKeywords, Formats) {
  expect(R"({"type":"string","format":"date"})",
         {"\"2024-02-29\"", "\"2000-02-29\"", "\"1999-12-31\"", "\"2023-04-30\"", "\"0000-02-29\""},
         {"\"2023-02-29\"", "\"1900-02-29\"", "\"2023-04-31\"", "\"2023-13-01\"", "\"2023-00-10\"", "\"2023-1-01\""});
  expect(R"({"type":"string","format":"time"})", {"\"23:59:59Z\"", "\"00:00:00.5+01:00\"", "\"12:30:00-05:30\""},
         {"\"24:00:00Z\"", "\"12:60:00Z\"", "\"12:00Z\"", "\"12:00:00\""});
  expect(R"({"type":"string","format":"date-time"})", {"\"2024-02-29T13:45:00Z\"", "\"2023-11-05T08:00:00.123+01:00\""},
         {"\"2024-02-29 13:45:00Z\"", "\"2024-02-30T13:45:00Z\"", "\"2024-02-29T13:45Z\""});
  expect(R"({"type":"string","format":"uuid"})", {"\"123e4567-e89b-12d3-a456-426614174000\"", "\"ABCDEF00-0000-0000-0000-000000000000\""},
         {"\"123e4567e89b12d3a456426614174000\"", "\"123e4567-e89b-12d3-a456-42661417400\"", "\"g23e4567-e89b-12d3-a456-426614174000\""});
  expect(R"({"type":"string","format":"email"})", {"\"a@b.co\"", "\"first.last+tag@mail.example.org\""},
         {"\"a@b\"", "\"@b.co\"", "\"a..b@c.de\"", "\"a@-b.co\"", "\"a b@c.de\""});
}

TEST(SchemaKeywords, IntegerBounds) {
  expect(R"({"type":"integer","minimum":0,"maximum":100})", {"0", "7", "99", "100"}, {"-1", "101", "1000", "-0"});
  expect(R"({"type":"integer","exclusiveMinimum":-3,"exclusiveMaximum":3})", {"-2", "0", "2"}, {"-3", "3"});
  expect(R"({"type":"integer","minimum":-150,"maximum":-20})", {"-150", "-20", "-99"}, {"-19", "-151", "0", "20"});
  expect(R"({"type":"integer","minimum":1.5})", {"2", "123456"}, {"1", "0", "-5"});
  expect(R"({"type":"integer","maximum":5})", {"5", "-1234567890123456789"}, {"6"});
  expect(R"({"type":"integer","minimum":3,"exclusiveMinimum":true})", {"4"}, {"3"});  // draft 4
  expect(R"({"minimum":10})", {"10", "11"}, {"9", "10.5"});                         // inferred integer
}

TEST(SchemaKeywords, JsonObjectMode) {
  Grammar g = json_object_grammar();
  for (const char* d : {"{}", R"({"a":1})", R"({"a":{"b":[1,2,{"c":null}]},"d":"\u00e9"})", " {\n  \"x\": true\n}\n"})
    EXPECT_TRUE(accepts(g, d)) << d;
  for (const char* d : {"[]", "1", "\"s\"", "null", "{", R"({"a":1}{})", R"({"a":})", R"({1:2})"})
    EXPECT_FALSE(accepts(g, d)) << d;
}

}  // namespace
}  // namespace lilac::grammar::test
