// Hostile schemas (a request's response_format or tool parameters): each once crashed the server, got a 500 or took
// time that grew without bound. Every one must be a SchemaError (the server's 400 invalid_schema) naming the keyword.
#include <gtest/gtest.h>

#include <optional>
#include <vector>

#include "grammar/regex.h"
#include "grammar/response_grammar.h"
#include "grammar/schema_internal.h"
#include "grammar_corpus.h"
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

// The response grammar of `spec` in Qwen3.6's format.
Grammar response_grammar(const ResponseSpec& spec, const SchemaLimits& lim = {}) {
  return build_response_grammar(spec, qwen3_6_format().markup(), qwen3(), lim);
}

// The SchemaError of a response grammar that must be refused; a failure naming `at` (the case) when it is built.
SchemaError response_refusal(const ResponseSpec& spec, const std::string& at, const SchemaLimits& lim = {}) {
  try {
    response_grammar(spec, lim);
  } catch (const SchemaError& e) {
    return e;
  }
  ADD_FAILURE() << at << ": accepted";
  return SchemaError("", "", "");
}

// The response grammar of `spec`, which must build; nullopt and a failure naming `at` (the case) when it is refused.
std::optional<Grammar> response_built(const ResponseSpec& spec, const std::string& at, const SchemaLimits& lim = {}) {
  try {
    return response_grammar(spec, lim);
  } catch (const SchemaError& e) {
    ADD_FAILURE() << at << ": refused, param " << e.param() << ": " << e.what();
    return std::nullopt;
  }
}

// A function tool of OpenAI's shape.
OrderedJson function_tool(const std::string& name, const OrderedJson& params, bool strict) {
  OrderedJson f = {{"name", name}, {"parameters", params}};
  if (strict) f["strict"] = true;
  return {{"type", "function"}, {"function", std::move(f)}};
}

// A response of tool calls (`tools`) in the XML form or Qwen3's JSON form, free content otherwise.
ResponseSpec calls_spec(bool xml, ResponseSpec::Calls calls, OrderedJson tools) {
  ResponseSpec spec;
  spec.xml_calls = xml;
  spec.calls = calls;
  spec.tools = std::move(tools);
  return spec;
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
    ResponseSpec spec = calls_spec(xml, ResponseSpec::Calls::Forced, OrderedJson::parse(R"([{"type":"function",
        "function":{"name":"f","parameters":{"type":"object","properties":{"x":{"type":"array","items":{"type":"array",
        "items":{"oneOf":[{"type":"string"},{"type":"string"}]}}}},"required":["x"]}}}])"));
    Grammar g;
    EXPECT_NO_THROW(g = response_grammar(spec)) << "xml " << xml;
    // The arguments are free: any parameter (XML) or any object (JSON), not the failed schema's.
    const std::string args = xml ? "<function=f>\n<parameter=y>\nfree\n</parameter>\n</function>\n"
                                 : "{\"name\": \"f\", \"arguments\": {\"y\": 1}}\n";
    EXPECT_TRUE(is_prefix(g, args)) << "xml " << xml;
    // Strict, the same schema is the tool's error.
    spec.tools[0]["function"]["strict"] = true;
    const SchemaError e = response_refusal(spec, "xml " + std::to_string(xml));
    EXPECT_EQ(e.param(), "tools[0].function.parameters");
    EXPECT_EQ(e.keyword(), "oneOf");
  }
}

// A strict tool's parameters (or a forced call's) too large for the automaton bounds: the SizeError left
// build_response_grammar as it was (not a SchemaError), and the server answered 500 "automaton exceeds 50000 states".
// It is the tool's schema error, as it is for response_format; a forced call of a tool that is not strict falls back
// to unconstrained arguments, as for its other schema errors.
TEST(SchemaHostile, AToolSchemaTooLargeIsTheToolsSchemaError) {
  const std::string long_const = "{\"const\":\"" + std::string(60000, 'a') + "\"}";
  for (const bool xml : {true, false}) {
    const std::string at = "xml " + std::to_string(xml);
    ResponseSpec spec = calls_spec(xml, ResponseSpec::Calls::Auto, OrderedJson::parse(R"([{"type":"function",
        "function":{"name":"ok","strict":true,"parameters":{}}},{"type":"function","function":{"name":"big",
        "strict":true,"parameters":{"type":"object","properties":{"x":{"type":"array","items":)" + long_const + R"(}},
        "required":["x"]}}}])"));
    const SchemaError e = response_refusal(spec, at);
    EXPECT_EQ(e.param(), "tools[1].function.parameters") << at;
    EXPECT_NE(std::string(e.what()).find("too large"), std::string::npos) << e.what();
    spec.tools[1]["function"].erase("strict");
    spec.calls = ResponseSpec::Calls::Forced;
    spec.forced_function = "big";
    EXPECT_NO_THROW(response_grammar(spec)) << at;
    // A call forced among 1,000 tools of 64-character names: the automaton of their names is over the bound.
    spec.forced_function.clear();
    spec.tools = OrderedJson::array();
    for (int t = 0; t < 1000; ++t) {
      const std::string n = std::to_string(t);
      spec.tools.push_back({{"type", "function"}, {"function", {{"name", n + std::string(64 - n.size(), 'x')}}}});
    }
    const SchemaError many = response_refusal(spec, at + ", 1,000 tools");
    EXPECT_EQ(many.param(), "tools") << many.what();
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
    const SchemaError e = refusal(schema);
    EXPECT_EQ(e.keyword(), keyword) << e.what();
    EXPECT_NE(std::string(e.what()).find("too many subschemas"), std::string::npos) << e.what();
  }
  // A small fan-out compiles as before.
  EXPECT_TRUE(schema_accepts(fan_out("anyOf", 4, 3, R"({"type":"string"})", R"("oneOf":[{"$ref":"#/$defs/l0"},{"type":"integer"}])"),
                             R"("x")"));
  EXPECT_TRUE(schema_accepts(fan_out("allOf", 4, 3, R"({"type":"object","properties":{"a":{"type":"string"}}})",
                                     R"("allOf":[{"$ref":"#/$defs/l0"},{"type":"object","properties":{"b":{"type":"integer"}}}])"),
                             R"({"a":"x","b":1})"));
}

// A character class of `n` separate code points (U+0100, U+0102, ...: two- and three-byte UTF-8), as pattern text.
std::string wide_class(int n) {
  std::string c = "[";
  for (int i = 0; i < n; ++i) append_utf8(c, 0x100 + 2 * uint32_t(i));
  return c + "]";
}

std::string string_schema(const std::string& pattern) {
  return OrderedJson{{"type", "string"}, {"pattern", pattern}}.dump();
}

// A 14 KB pattern, a class of 5,000 code points repeated (or inside a group repeated): each state of its automaton
// is a set of thousands of NFA states with thousands of edges, and only the 50,000-state bound stopped the subset
// construction: 25-50 s of a request's thread for {1000}; {100} compiled after 4-9 s, {40} after 1 s. The steps of
// determinization are bounded per compile (SchemaLimits::max_automaton_work): a 400 naming the pattern, in
// response_format and in a strict tool alike.
TEST(SchemaHostile, AHugeClassRepeatedIsRefusedByTheWorkBound) {
  const std::string cls = wide_class(5000);
  for (const std::string& pattern : {cls + "{40}", "(?:" + cls + "|x){40}"}) {
    const SchemaError e = refusal(string_schema(pattern));
    EXPECT_EQ(e.keyword(), "pattern");
    EXPECT_NE(std::string(e.what()).find("more than 100000000 steps"), std::string::npos) << e.what();
    // The same schema as a strict tool's parameter.
    for (const bool xml : {true, false}) {
      const OrderedJson params = {{"type", "object"},
                                  {"properties", {{"x", OrderedJson::parse(string_schema(pattern))}}},
                                  {"required", {"x"}}};
      const ResponseSpec spec = calls_spec(xml, ResponseSpec::Calls::Auto, OrderedJson::array({function_tool("f", params, true)}));
      const SchemaError t = response_refusal(spec, "xml " + std::to_string(xml));
      EXPECT_EQ(t.param(), "tools[0].function.parameters") << "xml " << xml;
      EXPECT_EQ(t.keyword(), "pattern") << "xml " << xml << ": " << t.what();
      EXPECT_NE(std::string(t.what()).find("steps"), std::string::npos) << t.what();
    }
  }
}

// With {1000}, the 1,000 copies of the class (5 million edges) were built before any bound was checked, twice (the
// schema check builds the pattern too), then determinized. The first copy's size times the count is checked against
// the NFA's bounds before the others are made.
TEST(SchemaHostile, ARepetitionTooLargeStopsAfterItsFirstCopy) {
  const std::string cls = wide_class(5000);
  for (const std::string& pattern : {cls + "{1000}", "(?:" + cls + "|x){1000}", "(?:" + cls + "){999,}"}) {
    Nfa nfa(200000);
    const int32_t end = nfa.add_state();
    try {
      add_pattern(nfa, nfa.start(), pattern, Encoding::JsonString, end);
      ADD_FAILURE() << "built " << nfa.size() << " states, " << nfa.edges() << " edges";
    } catch (const SizeError& e) {
      EXPECT_NE(std::string(e.what()).find("repetition"), std::string::npos) << e.what();
    }
    // One copy (about 160 states and 5,000 edges) and the unanchored ends, not hundreds.
    EXPECT_LT(nfa.size(), 1000u);
    EXPECT_LT(nfa.edges(), 20000u);
    const SchemaError e = refusal(string_schema(pattern));
    EXPECT_EQ(e.keyword(), "pattern");
    EXPECT_NE(std::string(e.what()).find("repetition"), std::string::npos) << e.what();
  }
  // Repetitions that fit are built as before.
  EXPECT_TRUE(schema_accepts(string_schema("^(?:" + wide_class(50) + "){3}$"), "\"\u0100\u0162\u0104\""));
  EXPECT_TRUE(schema_accepts(string_schema("^[ab]{1000}$"), "\"" + std::string(1000, 'a') + "\""));
  EXPECT_FALSE(schema_accepts(string_schema("^[ab]{1000}$"), "\"" + std::string(999, 'a') + "\""));
}

// The work bound itself: determinize stops once its steps pass what is left of the budget, and says so.
TEST(SchemaHostile, DeterminizeSpendsFromItsWorkBudget) {
  Nfa nfa;
  const int32_t end = nfa.add_state();
  nfa.set_accept(end);
  add_pattern(nfa, nfa.start(), "[a-z]{200}", Encoding::Utf8, end);
  WorkBudget unbounded(UINT64_MAX);
  const size_t states = determinize(nfa, 50000, &unbounded).size();
  const uint64_t steps = unbounded.spent();
  EXPECT_GT(steps, 100000u);
  WorkBudget exact(steps);
  EXPECT_EQ(determinize(nfa, 50000, &exact).size(), states);
  WorkBudget short_by_one(steps - 1);
  try {
    determinize(nfa, 50000, &short_by_one);
    ADD_FAILURE() << "finished with " << steps - 1 << " steps";
  } catch (const SizeError& e) {
    EXPECT_NE(std::string(e.what()).find("more than " + std::to_string(steps - 1) + " steps"), std::string::npos)
        << e.what();
  }
  // One budget for a whole compile: a schema of two such patterns needs both.
  const OrderedJson one = OrderedJson::parse(R"({"type":"string","pattern":"[a-z]{200}"})");
  detail::SchemaCompiler sc(one, SchemaLimits{});
  sc.document();
  SchemaLimits lim;
  lim.max_automaton_work = sc.work_spent() * 3 / 2;
  EXPECT_NO_THROW(compile_json_schema(one, lim));
  const SchemaError e = [&] {
    try {
      compile_json_schema_text(R"({"type":"array","prefixItems":[)" + one.dump() +
                                   R"(,{"type":"string","pattern":"[a-y]{200}"}]})", lim);
    } catch (const SchemaError& e) {
      return e;
    }
    ADD_FAILURE() << "accepted";
    return SchemaError("", "", "");
  }();
  EXPECT_EQ(e.keyword(), "pattern");
  EXPECT_NE(std::string(e.what()).find("steps"), std::string::npos) << e.what();
}

// The bound's margin: every schema of the grammar corpus (the tests' largest and most varied) takes under 1% of it.
TEST(SchemaHostile, TheWorkBoundLeavesLegitimateSchemasAWideMargin) {
  const SchemaLimits lim;
  for (const auto& c : corpus::cases()) {
    if (c.schema.empty()) continue;  // json_object
    const OrderedJson schema = OrderedJson::parse(c.schema);
    detail::SchemaCompiler sc(schema, lim);
    sc.document();
    EXPECT_LT(sc.work_spent(), lim.max_automaton_work / 100) << c.name;
  }
  // Long but ordinary patterns, and a maxLength of 1000 with a pattern, are well inside it too.
  for (const char* s : {R"({"type":"string","pattern":"^[A-Za-z0-9 ]{0,1000}$","maxLength":1000})",
                        R"({"type":"string","format":"email","maxLength":1000})",
                        R"({"type":"string","pattern":"[a-z]{1,100}@[a-z]{1,100}\\.[a-z]{2,10}"})"}) {
    const OrderedJson schema = OrderedJson::parse(s);
    detail::SchemaCompiler sc(schema, lim);
    sc.document();
    EXPECT_LT(sc.work_spent(), lim.max_automaton_work / 10) << s;
  }
}

// A class of thousands of code points was made one range at a time, the set sorted again after each (20,000 code
// points: 3 s). The class is the same set.
TEST(SchemaHostile, AClassOfManyCodePointsIsTheSameSet) {
  const std::string schema = string_schema("^" + wide_class(20000) + "$");
  const Grammar g = compile_json_schema_text(schema);
  for (uint32_t c : {0x100u, 0x102u, 0x7FEu, 0x800u, 0x100u + 2 * 19999u}) {
    std::string doc = "\"";
    append_utf8(doc, c);
    EXPECT_TRUE(accepts(g, doc + "\"")) << c;
  }
  for (uint32_t c : {0xFFu, 0x101u, 0x801u, 0x100u + 2 * 20000u}) {
    std::string doc = "\"";
    append_utf8(doc, c);
    EXPECT_FALSE(accepts(g, doc + "\"")) << c;
  }
  CharSet set = CharSet::of({{9, 9}, {1, 3}, {4, 5}, {20, 30}, {25, 40}, {7, 6}});
  EXPECT_EQ(set.ranges(), (std::vector<std::pair<uint32_t, uint32_t>>{{1, 5}, {9, 9}, {20, 40}}));
}

// Minimization refines up to one round per state of a chain, each round over every edge: a 200-byte pattern of three
// 1,000-character runs of a 47-range class took 6 s there. Past its step bound the automaton is left unminimized
// (as above 4,000 states): the same language, more states.
TEST(SchemaHostile, MinimizationGivesUpPastItsStepBound) {
  std::string cls = "[";
  for (char c = '!'; c < '~'; c += 2)
    if (c != '"' && c != '\\' && c != ']' && c != '-' && c != '^') cls += c;
  cls += "]";
  const std::string pattern = "^" + cls + "{1000}" + cls + "{1000}" + cls + "{1000}$";
  const Grammar g = compile_json_schema_text(string_schema(pattern));
  EXPECT_TRUE(accepts(g, "\"" + std::string(3000, '!') + "\""));
  EXPECT_FALSE(accepts(g, "\"" + std::string(2999, '!') + "\""));
  // The bound at the automaton level: two equivalent accepting states merge, unless the steps run out.
  std::vector<RuleState> dfa(3);
  dfa[0].ranges = {{'a', 'a', 1}, {'b', 'b', 2}};
  dfa[1].accept = dfa[2].accept = true;
  std::vector<RuleState> capped = dfa;
  minimize(capped, 4000, 3);
  EXPECT_EQ(capped.size(), 3u);
  minimize(dfa, 4000, 100);
  EXPECT_EQ(dfa.size(), 2u);
}

// Whether `text` can be continued to a whole response of `g`, its markup (<tool_call>, </tool_call>) read as the
// grammar's special tokens where the grammar has them.
bool reads(const Grammar& g, const std::string& text) {
  ConfigSpace sp(g);
  int32_t c = sp.initial(g.root, 0);
  for (size_t i = 0; i < text.size();) {
    Sym sym = Sym(uint8_t(text[i]));
    size_t len = 1;
    for (size_t k = 0; k < g.special_tokens.size(); ++k) {
      const std::string& t = qwen3().token_bytes(g.special_tokens[k]);
      if (text.compare(i, t.size(), t) == 0) {
        sym = Sym(kByteSyms + k);
        len = t.size();
      }
    }
    c = sp.step(c, sym);
    if (c == ConfigSpace::kDead) return false;
    i += len;
  }
  return true;
}

// A call of `name` with arguments {key: value} in the spec's form (value as the model writes it), from its opening;
// `opened`: the prompt already wrote the opening (a forced call of this tool), so only the arguments on.
std::string call_text(bool xml, const std::string& name, const std::string& key, const std::string& value,
                      bool opened = false) {
  if (xml)
    return (opened ? "" : "<function=" + name + ">\n") + "<parameter=" + key + ">\n" + value + "\n</parameter>\n";
  return (opened ? "" : "{\"name\": \"" + name + "\", \"arguments\": ") + "{\"" + key + "\": " + value + "}";
}

// A whole call of `name` with arguments {key: value} whose opening the prompt wrote (a call forced by name), and the
// opening of the call after it.
std::string forced_call_then_next(bool xml, const std::string& name, const std::string& key, const std::string& value) {
  return call_text(xml, name, key, value, true) + (xml ? "</function>\n" : "}\n") + "</tool_call>\n<tool_call>\n";
}

// A value of free arguments as the model writes it, one that no constrained call of these tests takes.
std::string free_value(bool xml) { return xml ? "anything" : "\"anything\""; }

// Parameters of one required integer n.
const OrderedJson& counted() {
  static const OrderedJson c =
      OrderedJson::parse(R"({"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]})");
  return c;
}

// Parameters that can never be satisfied: a required parameter of one character and at least three; a required array
// of at least one item that can be nothing.
const std::vector<OrderedJson>& never_params() {
  static const std::vector<OrderedJson> n = {
      OrderedJson::parse(R"({"type":"object","properties":{"x":{"type":"string","pattern":"^a$","minLength":3}},
          "required":["x"]})"),
      OrderedJson::parse(R"({"type":"object","properties":{"x":{"type":"array","items":false,"minItems":1}},
          "required":["x"]})"),
  };
  return n;
}

// `tool` beside a tool "loose" (not strict) and a tool "ok" (strict), both of counted() parameters: first or last.
OrderedJson beside_counted_tools(const OrderedJson& tool, bool first) {
  OrderedJson tools = OrderedJson::array();
  if (first) tools.push_back(tool);
  tools.push_back(function_tool("loose", counted(), false));
  tools.push_back(function_tool("ok", counted(), true));
  if (!first) tools.push_back(tool);
  return tools;
}

// A forced call (tool_choice required, Anthropic's "any", or a named one) constrains every tool, and a tool that is not
// strict falls back to free arguments when its schema cannot be compiled. Past the work bound it did not: the budget is
// one per grammar (SchemaLimits::max_automaton_work), spent to zero by the failed tool, so whatever was built after it
// (its own free arguments, every other tool) failed too, and the request was a 400 naming `tools` for a tool whose
// schema it would not have enforced. The tools that are not strict now spend from a pool of their own, each at most
// its share of it: the one past its share falls back alone, and the others (strict or not) are constrained as they
// were. A strict tool past the bound is still its own 400.
TEST(SchemaHostile, ANonStrictToolPastTheWorkBoundFallsBackAlone) {
  const OrderedJson hostile = {{"type", "object"},
                               {"properties", {{"x", OrderedJson::parse(string_schema(wide_class(5000) + "{40}"))}}},
                               {"required", {"x"}}};
  for (const bool xml : {true, false}) {
    for (const bool hostile_first : {true, false}) {
      ResponseSpec spec =
          calls_spec(xml, ResponseSpec::Calls::Forced, beside_counted_tools(function_tool("h", hostile, false), hostile_first));
      const std::string at = std::string("xml ") + (xml ? "1" : "0") + ", hostile first " + (hostile_first ? "1" : "0");
      const std::optional<Grammar> g = response_built(spec, at);
      if (!g) continue;
      // The hostile tool's arguments are free: any parameter (XML), any object (JSON).
      EXPECT_TRUE(reads(*g, call_text(xml, "h", "y", free_value(xml)))) << at;
      // The others are constrained as without it: n is an integer.
      for (const char* name : {"loose", "ok"}) {
        EXPECT_TRUE(reads(*g, call_text(xml, name, "n", "12"))) << at << ": " << name;
        EXPECT_FALSE(reads(*g, call_text(xml, name, "n", free_value(xml)))) << at << ": " << name;
      }
      // Strict, the hostile tool is the request's error, naming it.
      const size_t h = hostile_first ? 0 : 2;
      spec.tools[h]["function"]["strict"] = true;
      const SchemaError e = response_refusal(spec, at + ", a strict tool past the bound");
      EXPECT_EQ(e.param(), "tools[" + std::to_string(h) + "].function.parameters") << at << ": " << e.what();
      EXPECT_EQ(e.keyword(), "pattern") << at << ": " << e.what();
    }
    // A call of the hostile tool forced by name: its arguments are free, and so are those of a second call of it (the
    // tool was compiled again for the calls after the first); a second call of another tool is constrained.
    ResponseSpec named = calls_spec(xml, ResponseSpec::Calls::Forced,
                                    OrderedJson::array({function_tool("h", hostile, false), function_tool("ok", counted(), true)}));
    named.forced_function = "h";
    const std::optional<Grammar> g = response_built(named, "xml " + std::to_string(xml) + ", named");
    if (!g) continue;
    const std::string first = forced_call_then_next(xml, "h", "y", free_value(xml));
    EXPECT_TRUE(reads(*g, first + call_text(xml, "h", "y", free_value(xml)))) << "xml " << xml;
    EXPECT_TRUE(reads(*g, first + call_text(xml, "ok", "n", "12"))) << "xml " << xml;
    EXPECT_FALSE(reads(*g, first + call_text(xml, "ok", "n", free_value(xml)))) << "xml " << xml;
  }
}

// The same for a tool whose schema fails midway with a schema error (oneOf branches that overlap, found only while
// compiling): a call forced by name fell back to free arguments, but the calls after it compiled the tool again, and
// the second compile found the rules the first had reserved and abandoned (matching nothing), so a second call of it
// could not be written at all. A tool is compiled once per grammar.
TEST(SchemaHostile, ATooLooseToolForcedByNameIsFreeInEveryCall) {
  const OrderedJson overlapping = OrderedJson::parse(R"({"type":"object","properties":{"x":{"type":"array","items":
      {"oneOf":[{"type":"string"},{"type":"string"}]}}},"required":["x"]})");
  for (const bool xml : {true, false}) {
    ResponseSpec spec =
        calls_spec(xml, ResponseSpec::Calls::Forced, OrderedJson::array({function_tool("f", overlapping, false)}));
    spec.forced_function = "f";
    const Grammar g = response_grammar(spec);
    const std::string first = forced_call_then_next(xml, "f", "y", free_value(xml));
    EXPECT_TRUE(reads(g, first)) << "xml " << xml;
    EXPECT_TRUE(reads(g, first + call_text(xml, "f", "y", free_value(xml)))) << "xml " << xml;
  }
}

// The rules every schema shares (any value, whitespace, ...) are kept for later users once built. Any value's three
// rules were kept before they were built: a tool that is not strict whose share of the budget ran out while building
// them (reachable once such a tool's failure no longer failed the whole grammar: the test above) left them matching
// nothing, and a strict tool after it that used them could then never be called. At every budget, a grammar that
// builds constrains the strict tool as it should.
TEST(SchemaHostile, ASharedRuleIsKeptOnlyOnceBuilt) {
  ResponseSpec spec;
  spec.xml_calls = false;  // JSON arguments: a property of any type is any JSON value
  spec.calls = ResponseSpec::Calls::Forced;
  const OrderedJson any_p = OrderedJson::parse(R"({"type":"object","properties":{"p":{}},"required":["p"]})");
  spec.tools = OrderedJson::array({function_tool("a", any_p, false), function_tool("b", any_p, true)});
  int built = 0;
  for (uint64_t w = 0; w <= 40000; w += 25) {
    SchemaLimits lim;
    lim.max_automaton_work = w;
    Grammar g;
    try {
      g = response_grammar(spec, lim);
    } catch (const SchemaError&) {
      continue;  // too small for the grammar itself
    }
    ++built;
    EXPECT_TRUE(reads(g, call_text(false, "b", "p", "[1, {\"k\": null}]") + "}\n")) << w;
    EXPECT_FALSE(reads(g, call_text(false, "b", "q", "1"))) << w;
  }
  EXPECT_GT(built, 0);
}

// An object schema of one property per letter, each an array of a string constant of 1,000 times the letter: about
// 1,000 states each (distinct letters: no rule shared).
OrderedJson letter_props(const std::string& letters) {
  OrderedJson o = {{"type", "object"}, {"properties", OrderedJson::object()}, {"required", OrderedJson::array()}};
  for (const char c : letters) {
    const std::string k(1, c);
    o["properties"][k] = {{"type", "array"}, {"items", {{"const", std::string(1000, c)}}}};
    o["required"].push_back(k);
  }
  return o;
}

}  // namespace
// The errors of a response grammar as a whole (past SchemaLimits::max_states in all, or a root that matches nothing)
// named no request field, and the server filled in the content schema's (response_format.json_schema.schema) even for
// tools only. They name the field that holds the schema: one schema's alone past the bound; else the content schema's
// or "tools" (the calls together), whichever holds more states; the schema of the rule that matches nothing.
TEST(SchemaHostile, AWholeGrammarsErrorNamesItsField) {
  SchemaLimits lim;
  lim.max_states = 2500;
  const OrderedJson small = letter_props("");
  struct Case {
    const char* what;
    std::vector<std::string> tools;  // the letters of each strict tool's parameters
    std::optional<std::string> content;
    std::string param;
  };
  const std::vector<Case> cases = {
      {"tools together", {"a", "b", "c"}, std::nullopt, "tools"},
      {"tools beside a small content schema", {"a", "b", "c"}, "", "tools"},
      {"one tool alone", {"", "abc"}, std::nullopt, "tools[1].function.parameters"},
      {"one tool alone beside more tools", {"d", "abc", "e"}, "", "tools[1].function.parameters"},
      {"the content schema alone", {""}, "abc", "response_format.json_schema.schema"},
      {"the content schema with more states", {"a"}, "bc", "response_format.json_schema.schema"},
      {"the tools with more states", {"a", "b"}, "c", "tools"},
  };
  for (const bool xml : {true, false}) {
    for (const Case& c : cases) {
      ResponseSpec spec = calls_spec(xml, ResponseSpec::Calls::Auto, OrderedJson::array());
      for (size_t i = 0; i < c.tools.size(); ++i)
        spec.tools.push_back(function_tool("f" + std::to_string(i), letter_props(c.tools[i]), true));
      if (c.content) {
        spec.content = ResponseSpec::Content::JsonSchema;
        spec.schema = letter_props(*c.content);
      }
      const std::string at = std::string(c.what) + ", xml " + std::to_string(xml);
      const SchemaError e = response_refusal(spec, at, lim);
      EXPECT_EQ(e.param(), c.param) << at << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find("grammar exceeds 2500 states"), std::string::npos) << e.what();
    }
    // Within the bound, the same grammars build.
    const ResponseSpec fits = calls_spec(
        xml, ResponseSpec::Calls::Auto,
        OrderedJson::array({function_tool("f0", letter_props("a"), true), function_tool("f1", small, true)}));
    EXPECT_NO_THROW(response_grammar(fits, lim)) << "xml " << xml;
    // A forced call whose tool's parameters match nothing (one character, at least three), after a tool that is fine:
    // that tool's; a content schema that matches nothing: the content's.
    ResponseSpec forced =
        calls_spec(xml, ResponseSpec::Calls::Forced,
                   OrderedJson::array({function_tool("ok", small, true), function_tool("never", never_params()[0], true)}));
    forced.forced_function = "never";
    const SchemaError e = response_refusal(forced, "xml " + std::to_string(xml) + ", a call that matches nothing");
    EXPECT_EQ(e.param(), "tools[1].function.parameters") << "xml " << xml << ": " << e.what();
    EXPECT_NE(std::string(e.what()).find("can never be satisfied"), std::string::npos) << e.what();
  }
  ResponseSpec content;
  content.content = ResponseSpec::Content::JsonSchema;
  content.schema = OrderedJson::parse(R"({"type":"string","pattern":"^a$","minLength":3})");
  const SchemaError e = response_refusal(content, "a content schema that matches nothing");
  EXPECT_EQ(e.param(), "response_format.json_schema.schema") << e.what();
}

// A forced call constrains the tools that are not strict too, and falls back to free arguments for one whose schema
// cannot be enforced (ANonStrictToolPastTheWorkBoundFallsBackAlone), but not when the grammar failed as a whole: past
// SchemaLimits::max_states with the tools together (or one tool alone, through many rules each within its own bounds),
// or a call forced by name whose tool's parameters match nothing, was a SchemaError naming `tools` or the tool, though
// the same tool not forced is simply free. Such a grammar is built again with the tools that are not strict responsible
// freed: the largest first until the states fit, the forced one that matches nothing. A strict tool keeps its error.
TEST(SchemaHostile, ANonStrictToolPastTheStatesBoundFallsBack) {
  SchemaLimits lim;
  lim.max_states = 2600;  // (a free call is counted as 256 states in the estimate: ~150 here)
  for (const bool xml : {true, false}) {
    // The one value of the letter c's parameter (an array of its constant).
    auto value = [&](char c) { return "[\"" + std::string(1000, c) + "\"]"; };
    const std::string x = std::string("xml ") + (xml ? "1" : "0");

    // Forced by `required`: a tool not strict of ~1,000 states, one of ~2,000, a strict one of ~1,000: past 2,600
    // together. The largest tool that is not strict alone is freed; the others stay constrained.
    const ResponseSpec any = calls_spec(xml, ResponseSpec::Calls::Forced, OrderedJson::array({
        function_tool("f0", letter_props("a"), false),
        function_tool("f1", letter_props("bc"), false),
        function_tool("f2", letter_props("d"), true)}));
    if (std::optional<Grammar> g = response_built(any, x + ", required", lim)) {
      EXPECT_TRUE(reads(*g, call_text(xml, "f1", "y", free_value(xml)))) << x;
      EXPECT_TRUE(reads(*g, call_text(xml, "f0", "a", value('a')))) << x;
      EXPECT_FALSE(reads(*g, call_text(xml, "f0", "y", free_value(xml)))) << x;
      EXPECT_TRUE(reads(*g, call_text(xml, "f2", "d", value('d')))) << x;
      EXPECT_FALSE(reads(*g, call_text(xml, "f2", "y", free_value(xml)))) << x;
    }

    // Forced by name: a tool not strict past the bound alone (~3,000 states of its own), beside a strict one.
    ResponseSpec named = calls_spec(xml, ResponseSpec::Calls::Forced, OrderedJson::array({
        function_tool("ok", letter_props("a"), true),
        function_tool("big", letter_props("bcd"), false)}));
    named.forced_function = "big";
    if (std::optional<Grammar> g = response_built(named, x + ", named", lim)) {
      const std::string first = forced_call_then_next(xml, "big", "y", free_value(xml));
      EXPECT_TRUE(reads(*g, first)) << x;
      EXPECT_TRUE(reads(*g, first + call_text(xml, "ok", "a", value('a')))) << x;
      EXPECT_FALSE(reads(*g, first + call_text(xml, "ok", "y", free_value(xml)))) << x;
    }

    // Forced by name, a tool not strict whose parameters match nothing (one character, at least three): free.
    const OrderedJson& never = never_params()[0];
    ResponseSpec nothing = named;
    nothing.forced_function = "never";
    nothing.tools = OrderedJson::array({
        function_tool("ok", letter_props(""), true),
        function_tool("never", never, false)});
    if (std::optional<Grammar> g = response_built(nothing, x + ", never", lim))
      EXPECT_TRUE(reads(*g, call_text(xml, "never", "y", free_value(xml), true))) << x;
    // Forced by `required` with that tool alone: the same.
    nothing.forced_function.clear();
    nothing.tools = OrderedJson::array({function_tool("never", never, false)});
    if (std::optional<Grammar> g = response_built(nothing, x + ", never, required", lim))
      EXPECT_TRUE(reads(*g, call_text(xml, "never", "y", free_value(xml)))) << x;

    // A strict tool past the bound is the request's error, naming it, even once the tools not strict are freed.
    ResponseSpec strict = any;
    strict.tools = OrderedJson::array({
        function_tool("f0", letter_props("a"), false),
        function_tool("f1", letter_props("bcd"), true)});
    const SchemaError e = response_refusal(strict, x + ", a strict tool past the bound", lim);
    EXPECT_EQ(e.param(), "tools[1].function.parameters") << x << ": " << e.what();
    EXPECT_NE(std::string(e.what()).find("grammar exceeds 2600 states"), std::string::npos) << e.what();
    // So are strict tools past it together, beside a tool not strict.
    strict.tools = OrderedJson::array({
        function_tool("f0", letter_props("ab"), true),
        function_tool("f1", letter_props("c"), false),
        function_tool("f2", letter_props("de"), true)});
    const SchemaError together = response_refusal(strict, x + ", strict tools past the bound", lim);
    EXPECT_EQ(together.param(), "tools") << x << ": " << together.what();
  }
}


// A forced call by `required` (Anthropic's "any") constrains the tools that are not strict too, and one whose parameters
// can never be satisfied (a required parameter of one character and at least three, an array of at least one item
// that can be nothing) was silently left out of the choice when another tool's call could be written: finalize prunes
// the call of a rule that matches nothing, and only a root that matches nothing (no tool callable) was freed. Such a
// tool promises no conformance: it is offered with free arguments (any parameters, any object), beside the others still
// constrained; so is a second call of it after a call forced by name of another tool. A strict one is never freed.
TEST(SchemaHostile, ANonStrictToolThatMatchesNothingIsFreeBesideOthers) {
  std::vector<OrderedJson> nevers = never_params();
  nevers.push_back(OrderedJson::parse(R"({"not":{}})"));  // (refused by the compiler: free before too)
  for (const bool xml : {true, false}) {
    // A whole call of `name` with free arguments: two parameters (XML), an object of two members (JSON).
    auto free_call = [&](const std::string& name) {
      return xml ? "<function=" + name + ">\n<parameter=y>\nanything\n</parameter>\n<parameter=z>\n1\n</parameter>\n"
                       "</function>\n</tool_call>"
                 : "{\"name\": \"" + name + "\", \"arguments\": {\"y\": \"anything\", \"z\": [1, {}]}}\n</tool_call>";
    };
    for (size_t k = 0; k < nevers.size(); ++k) {
      for (const bool never_first : {true, false}) {
        const std::string at = "xml " + std::to_string(xml) + ", schema " + std::to_string(k) + ", never first " +
                               std::to_string(never_first);
        const ResponseSpec spec = calls_spec(xml, ResponseSpec::Calls::Forced,
                                             beside_counted_tools(function_tool("never", nevers[k], false), never_first));
        const std::optional<Grammar> g = response_built(spec, at);
        if (!g) continue;
        // The tool is offered, its arguments free.
        EXPECT_TRUE(reads(*g, xml ? "<function=never>\n" : "{\"name\": \"never\", ")) << at;
        EXPECT_TRUE(reads(*g, free_call("never"))) << at;
        EXPECT_TRUE(reads(*g, call_text(xml, "never", "y", free_value(xml)))) << at;
        // The others are constrained as without it.
        for (const char* name : {"loose", "ok"}) {
          EXPECT_TRUE(reads(*g, call_text(xml, name, "n", "12"))) << at << ": " << name;
          EXPECT_FALSE(reads(*g, call_text(xml, name, "n", free_value(xml)))) << at << ": " << name;
        }
        // A call forced by name of another tool: a second call may be of this one, free.
        ResponseSpec named = spec;
        named.forced_function = "loose";
        const std::optional<Grammar> after = response_built(named, at + ", named");
        if (!after) continue;
        const std::string first = forced_call_then_next(xml, "loose", "n", "12");
        EXPECT_TRUE(reads(*after, first + free_call("never"))) << at << ", named";
        EXPECT_FALSE(reads(*after, first + call_text(xml, "ok", "n", free_value(xml)))) << at << ", named";
        // Strict, the tool is never given free arguments: the request's error, naming it
        // (AStrictToolThatMatchesNothingIsTheRequestsError).
        ResponseSpec strict = spec;
        strict.tools[never_first ? 0 : 2]["function"]["strict"] = true;
        const SchemaError e = response_refusal(strict, at + ", strict");
        EXPECT_EQ(e.param(), "tools[" + std::to_string(never_first ? 0 : 2) + "].function.parameters")
            << at << ", strict: " << e.what();
      }
    }
  }
}

// A strict tool whose parameters can never be satisfied (a required parameter of one character and at least three, an
// array of at least one item that can be nothing), offered beside a tool whose call can be written, was silently left
// out of the choice: finalize prunes the call of a rule that matches nothing, and only a root that matches nothing (no
// tool callable) was an error. `strict: true` promises arguments that conform, and none can: wherever the tool could be
// called (tool_choice required, auto beside free or JSON content, a second call after one forced by name), the request
// is refused naming its parameters, as a strict tool whose schema cannot be compiled is. Where it cannot be called (a
// call of another tool forced by name, no parallel calls) its schema is not compiled, and the request is answered.
TEST(SchemaHostile, AStrictToolThatMatchesNothingIsTheRequestsError) {
  const std::vector<OrderedJson>& nevers = never_params();
  for (const bool xml : {true, false}) {
    for (size_t k = 0; k < nevers.size(); ++k) {
      for (const bool never_first : {true, false}) {
        const std::string at = "xml " + std::to_string(xml) + ", schema " + std::to_string(k) + ", never first " +
                               std::to_string(never_first);
        const OrderedJson tools = beside_counted_tools(function_tool("never", nevers[k], true), never_first);
        const std::string param = "tools[" + std::to_string(never_first ? 0 : 2) + "].function.parameters";

        const ResponseSpec required = calls_spec(xml, ResponseSpec::Calls::Forced, tools);
        const ResponseSpec automatic = calls_spec(xml, ResponseSpec::Calls::Auto, tools);
        ResponseSpec json_content = automatic;
        json_content.content = ResponseSpec::Content::JsonSchema;
        json_content.schema = OrderedJson::parse(R"({"type":"object"})");
        ResponseSpec named = required;
        named.forced_function = "ok";
        const std::vector<std::pair<const char*, const ResponseSpec*>> refused = {
            {"required", &required}, {"auto", &automatic}, {"auto, JSON content", &json_content}, {"named", &named}};
        for (const auto& [what, spec] : refused) {
          const SchemaError e = response_refusal(*spec, at + ", " + what);
          EXPECT_EQ(e.param(), param) << at << ", " << what << ": " << e.what();
          EXPECT_NE(std::string(e.what()).find("can never be satisfied"), std::string::npos)
              << at << ", " << what << ": " << e.what();
        }

        // Forced by name of another tool, one call only: the tool cannot be called, and the call is constrained.
        named.parallel_calls = false;
        const std::optional<Grammar> g = response_built(named, at + ", named, one call");
        if (!g) continue;
        EXPECT_TRUE(reads(*g, call_text(xml, "ok", "n", "12", true))) << at;
        EXPECT_FALSE(reads(*g, call_text(xml, "ok", "n", free_value(xml), true))) << at;
      }
    }
  }
}

}  // namespace lilac::grammar::test
