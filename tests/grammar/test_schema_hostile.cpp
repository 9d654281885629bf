// Hostile schemas (a request's response_format or tool parameters): each once crashed the server, got a 500 or took
// time that grew without bound. Every one must be a SchemaError (the server's 400 invalid_schema) naming the keyword.
#include <gtest/gtest.h>

#include <chrono>

#include "grammar/response_grammar.h"
#include "grammar_test_util.h"
#include "text/model_format.h"

namespace lilac::grammar::test {
namespace {

SchemaError refusal(const std::string& schema) {
  try {
    compile_json_schema_text(schema);
  } catch (const SchemaError& e) {
    return e;
  }
  ADD_FAILURE() << "accepted: " << schema.substr(0, 200);
  return SchemaError("", "", "");
}

// A quantifier after a quantifier ("a**", "a{2}{3}") is ECMAScript's "nothing to repeat". The parser stacked them,
// each a level of the pattern's tree, which the anchor check and the builder recursed through: 200,000 '*' (a 200 KB
// request) overflowed the stack of the request's thread, a crash of the whole server.
TEST(SchemaHostile, StackedQuantifiersAreRefusedNotACrash) {
  for (const std::string q : {"*", "+", "?", "{1}", "*?"}) {
    std::string p = "a";
    for (int i = 0; i < 200000; ++i) p += q;
    const SchemaError e = refusal(R"({"type":"string","pattern":")" + p + "\"}");
    EXPECT_EQ(e.keyword(), "pattern") << q;
    EXPECT_NE(std::string(e.what()).find("nothing to repeat"), std::string::npos) << q << ": " << e.what();
  }
  for (const char* p : {"a**", "a+*", "(ab){2}{3}", "a???", "a*?+"})
    EXPECT_EQ(refusal(std::string(R"({"type":"string","pattern":")") + p + "\"}").keyword(), "pattern") << p;
  // One quantifier, lazy or not, is fine.
  EXPECT_TRUE(schema_accepts(R"({"type":"string","pattern":"^a+?b*?c??(de){1,2}?$"})", R"("aaabcdede")"));
  EXPECT_FALSE(schema_accepts(R"({"type":"string","pattern":"^a+?b*?c??(de){1,2}?$"})", R"("aaabcdedede")"));
}


// A $ref into an array whose index has more digits than an unsigned long holds: std::stoul threw out_of_range, which
// was no SchemaError, so the server answered 500 "Internal server error: stoul".
TEST(SchemaHostile, ARefIndexTooLargeForAnIntegerPointsToNothing) {
  for (const char* index : {"99999999999999999999999", "18446744073709551616", "4294967296", "1"}) {
    const SchemaError e = refusal(std::string(R"({"$ref":"#/$defs/a/anyOf/)") + index +
                                  R"(","$defs":{"a":{"anyOf":[{"type":"string"}]}}})");
    EXPECT_EQ(e.keyword(), "$ref") << index;
    EXPECT_NE(std::string(e.what()).find("does not point to anything"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(schema_accepts(R"({"$ref":"#/$defs/a/anyOf/0","$defs":{"a":{"anyOf":[{"type":"string"}]}}})", R"("x")"));
}


// A forced call of a tool that is not strict falls back to unconstrained arguments when its schema fails to compile.
// A failure deep inside the schema (here a oneOf whose branches overlap, found only when compiling) left the rules
// reserved for the enclosing subschemas without states, and the grammar's finalization read their first state: a
// crash of the server for an Anthropic tool_choice "any" (or OpenAI "required") with such a tool.
TEST(SchemaHostile, AForcedCallFallsBackAfterASchemaFailedMidwayNotACrash) {
  for (const bool xml : {true, false}) {
    ResponseSpec spec;
    spec.xml_calls = xml;
    spec.calls = ResponseSpec::Calls::Forced;
    spec.tools = OrderedJson::parse(R"([{"type":"function","function":{"name":"f","parameters":{"type":"object",
        "properties":{"x":{"type":"array","items":{"type":"array","items":{"oneOf":[{"type":"string"},{"type":"string"}]}}}},
        "required":["x"]}}}])");
    Grammar g;
    EXPECT_NO_THROW(g = build_response_grammar(spec, qwen3_6_format().markup(), qwen3())) << "xml " << xml;
    // The arguments are free: any parameter (XML) or any object (JSON), not the failed schema's.
    const std::string args = xml ? "<function=f>\n<parameter=y>\nfree\n</parameter>\n</function>\n"
                                 : "{\"name\": \"f\", \"arguments\": {\"y\": 1}}\n";
    EXPECT_TRUE(is_prefix(g, args)) << "xml " << xml;
    // Strict, the same schema is the tool's error.
    spec.tools[0]["function"]["strict"] = true;
    try {
      build_response_grammar(spec, qwen3_6_format().markup(), qwen3());
      ADD_FAILURE() << "accepted (xml " << xml << ")";
    } catch (const SchemaError& e) {
      EXPECT_EQ(e.param(), "tools[0].function.parameters");
      EXPECT_EQ(e.keyword(), "oneOf");
    }
  }
}

// A strict tool's parameters (or a forced call's) too large for the automaton bounds: the SizeError left
// build_response_grammar as it was (not a SchemaError), and the server answered 500 "automaton exceeds 50000 states".
// It is the tool's schema error, as it is for response_format; a forced call of a tool that is not strict falls back
// to unconstrained arguments, as for its other schema errors.
TEST(SchemaHostile, AToolSchemaTooLargeIsTheToolsSchemaError) {
  const std::string long_const = "{\"const\":\"" + std::string(60000, 'a') + "\"}";
  for (const bool xml : {true, false}) {
    ResponseSpec spec;
    spec.xml_calls = xml;
    spec.calls = ResponseSpec::Calls::Auto;
    spec.tools = OrderedJson::parse(R"([{"type":"function","function":{"name":"ok","strict":true,"parameters":{}}},
        {"type":"function","function":{"name":"big","strict":true,"parameters":{"type":"object","properties":{"x":
        {"type":"array","items":)" + long_const + R"(}},"required":["x"]}}}])");
    try {
      build_response_grammar(spec, qwen3_6_format().markup(), qwen3());
      ADD_FAILURE() << "accepted (xml " << xml << ")";
    } catch (const SchemaError& e) {
      EXPECT_EQ(e.param(), "tools[1].function.parameters") << "xml " << xml;
      EXPECT_NE(std::string(e.what()).find("too large"), std::string::npos) << e.what();
    }
    spec.tools[1]["function"].erase("strict");
    spec.calls = ResponseSpec::Calls::Forced;
    spec.forced_function = "big";
    EXPECT_NO_THROW(build_response_grammar(spec, qwen3_6_format().markup(), qwen3())) << "xml " << xml;
    // A call forced among 1,000 tools of 64-character names: the automaton of their names is over the bound.
    spec.forced_function.clear();
    spec.tools = OrderedJson::array();
    for (int t = 0; t < 1000; ++t) {
      const std::string n = std::to_string(t);
      spec.tools.push_back({{"type", "function"}, {"function", {{"name", n + std::string(64 - n.size(), 'x')}}}});
    }
    try {
      build_response_grammar(spec, qwen3_6_format().markup(), qwen3());
      ADD_FAILURE() << "accepted (xml " << xml << ")";
    } catch (const SchemaError& e) {
      EXPECT_EQ(e.param(), "tools") << e.what();
    }
  }
}


// $defs level l: a combinator of `fan` $refs to level l + 1; the last level is `leaf`.
std::string fan_out(const char* comb, int levels, int fan, const std::string& leaf, const std::string& top) {
  std::string defs;
  for (int l = 0; l < levels; ++l) {
    std::string body = leaf;
    if (l + 1 < levels) {
      body = std::string("{\"") + comb + "\":[";
      for (int k = 0; k < fan; ++k) body += (k ? ",{\"$ref\":\"#/$defs/l" : "{\"$ref\":\"#/$defs/l") + std::to_string(l + 1) + "\"}";
      body += "]}";
    }
    defs += (l ? ",\"l" : "\"l") + std::to_string(l) + "\":" + body;
  }
  return "{" + top + ",\"$defs\":{" + defs + "}}";
}

// oneOf's disjointness check and allOf's merge follow $refs without remembering them: seven levels of $defs, each
// naming the next ten times (a 1 KB schema), are 10^6 visits, eight levels 10^7 (3 s for oneOf, 44 s for allOf in a
// request), nine or more hold a request thread for minutes to hours. Past SchemaLimits::max_expansion visits in all,
// the schema is refused naming the keyword.
TEST(SchemaHostile, RefFanOutIsBoundedInOneOfAndAllOf) {
  const std::string one = fan_out("anyOf", 7, 10, R"({"type":"string"})",
                                  R"("oneOf":[{"$ref":"#/$defs/l0"},{"type":"integer"}])");
  const std::string all = fan_out("allOf", 6, 12, R"({"type":"object","properties":{"a":{"type":"string"}}})",
                                  R"("allOf":[{"$ref":"#/$defs/l0"},{"type":"object","properties":{"b":{"type":"integer"}}}])");
  for (const auto& [schema, keyword] : {std::pair{one, "oneOf"}, std::pair{all, "allOf"}}) {
    const auto t0 = std::chrono::steady_clock::now();
    const SchemaError e = refusal(schema);
    EXPECT_EQ(e.keyword(), keyword) << e.what();
    EXPECT_NE(std::string(e.what()).find("too many subschemas"), std::string::npos) << e.what();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2)) << keyword;
  }
  // A small fan-out compiles as before.
  EXPECT_TRUE(schema_accepts(fan_out("anyOf", 4, 3, R"({"type":"string"})", R"("oneOf":[{"$ref":"#/$defs/l0"},{"type":"integer"}])"),
                             R"("x")"));
  EXPECT_TRUE(schema_accepts(fan_out("allOf", 4, 3, R"({"type":"object","properties":{"a":{"type":"string"}}})",
                                     R"("allOf":[{"$ref":"#/$defs/l0"},{"type":"object","properties":{"b":{"type":"integer"}}}])"),
                             R"({"a":"x","b":1})"));
}

}  // namespace
}  // namespace lilac::grammar::test
