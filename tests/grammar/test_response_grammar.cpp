// Whole-response grammars (reasoning, JSON content, Qwen3.6 XML tool calls) on the real Qwen3
// tokenizer: random walks over the allowed tokens, read back by the real output parser, always give
// tool arguments and content that validate against their schemas.
#include <gtest/gtest.h>

#include <random>

#include "grammar/response_grammar.h"
#include "grammar_test_util.h"
#include "schema_validator.h"
#include "text/model_format.h"
#include "text/output_parser.h"

namespace lilac::grammar::test {
namespace {

const OrderedJson& tools() {
  static const OrderedJson t = OrderedJson::parse(R"([
    {"type":"function","function":{"name":"get_weather","strict":true,"description":"Weather for a city",
      "parameters":{"type":"object","properties":{
        "city":{"type":"string","minLength":1,"maxLength":40,"description":"City name"},
        "unit":{"type":"string","enum":["celsius","fahrenheit"]},
        "days":{"type":"integer","minimum":1,"maximum":7},
        "detailed":{"type":"boolean"}},
        "required":["city","unit"],"additionalProperties":false}}},
    {"type":"function","function":{"name":"search","strict":true,
      "parameters":{"type":"object","properties":{
        "query":{"type":"string","pattern":"^[a-z ]+$","maxLength":30},
        "filters":{"type":"object","properties":{"site":{"type":"string"},"year":{"type":"integer"}},"required":["site"]},
        "tags":{"type":"array","items":{"type":"string","maxLength":8},"maxItems":3},
        "note":{"type":["string","null"],"maxLength":20},
        "when":{"type":"string","format":"date"}},
        "required":["query","note"]}}},
    {"type":"function","function":{"name":"free_tool","description":"not strict",
      "parameters":{"type":"object","properties":{"x":{"type":"integer"}},"minProperties":1}}}
  ])");
  return t;
}

const OrderedJson& params_of(const std::string& name) {
  for (const auto& t : tools())
    if (t["function"]["name"] == name) return t["function"]["parameters"];
  static const OrderedJson none;
  return none;
}

std::shared_ptr<const CompiledGrammar> response(const ResponseSpec& spec) {
  return compiled(build_response_grammar(spec, qwen3_6_format().markup(), qwen3()));
}

// A walk: uniform among allowed tokens, but an allowed added token (markup, the end) is taken with
// probability 1/4 so that the structure gets exercised. Returns the text (special tokens as text).
std::string walk(const std::shared_ptr<const CompiledGrammar>& g, uint64_t seed, int max_steps = 400) {
  const auto& v = *qwen3_vocab();
  Matcher m(g, {qwen3_im_end()});
  std::vector<uint32_t> mask(v.mask_words());
  std::mt19937_64 rng(seed);
  std::string text;
  for (int step = 0; step < max_steps; ++step) {
    m.fill_mask(mask);
    std::vector<int32_t> all, marks;
    for (size_t w = 0; w < mask.size(); ++w)
      for (uint32_t b = mask[w]; b; b &= b - 1) {
        const int32_t t = int32_t(w * 32 + size_t(__builtin_ctz(b)));
        all.push_back(t);
        if (qwen3().is_added(t)) marks.push_back(t);
      }
    EXPECT_FALSE(all.empty());
    if (all.empty()) return text;
    const int32_t t = !marks.empty() && rng() % 4 == 0 ? marks[rng() % marks.size()] : all[rng() % all.size()];
    EXPECT_EQ(m.allows(t), true);
    EXPECT_TRUE(m.accept_token(t));
    if (t == qwen3_im_end()) return text;
    text += qwen3().token_bytes(t);
  }
  // Finish along the shortest completion (single bytes; markup as its token).
  auto rest = m.shortest_completion();
  EXPECT_TRUE(rest.has_value());
  if (!rest) return text;
  for (int32_t t : *rest) {
    m.fill_mask(mask);
    EXPECT_TRUE(bit(mask, t));
    EXPECT_TRUE(m.accept_token(t));
    text += qwen3().token_bytes(t);
  }
  m.fill_mask(mask);
  EXPECT_TRUE(bit(mask, qwen3_im_end()));
  return text;
}

struct Parsed {
  std::string content, reasoning;
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments
};

Parsed parse(const std::string& text, bool in_reasoning) {
  OutputParser p(in_reasoning, tools(), qwen3_6_format());
  Parsed out;
  auto take = [&](std::vector<OutputDelta> ds) {
    for (auto& d : ds) {
      if (d.kind == OutputDelta::Content) out.content += d.text;
      if (d.kind == OutputDelta::Reasoning) out.reasoning += d.text;
      if (d.kind != OutputDelta::ToolCall) continue;
      if (d.tool_start()) out.calls.push_back({d.tool_name, d.arguments});  // a call's first piece names it
      else if (!out.calls.empty()) out.calls.back().second += d.arguments;
    }
  };
  // In pieces, as a stream would deliver it.
  for (size_t i = 0; i < text.size(); i += 7) take(p.push(text.substr(i, 7)));
  take(p.finish());
  return out;
}

void expect_valid_calls(const Parsed& p, const std::string& text) {
  for (const auto& [name, args] : p.calls) {
    const OrderedJson& schema = params_of(name);
    ASSERT_FALSE(schema.is_null()) << "unknown tool " << name << " in: " << text;
    const VJson a = VJson::parse(args);
    if (name == "free_tool") continue;  // not strict: unconstrained
    EXPECT_EQ(Validator(schema).check(a), "") << name << " " << args << "\nfrom: " << text;
  }
}

TEST(ResponseGrammar, ForcedCallsOfAnyToolValidate) {
  ResponseSpec spec;
  spec.tools = tools();
  spec.calls = ResponseSpec::Calls::Forced;  // prompt ends with "<tool_call>\n"
  auto g = response(spec);
  size_t calls = 0;
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    const std::string text = "<tool_call>\n" + walk(g, seed, 200);
    const Parsed p = parse(text, false);
    EXPECT_GE(p.calls.size(), 1u) << text;
    EXPECT_EQ(p.content, "") << text;
    expect_valid_calls(p, text);
    calls += p.calls.size();
  }
  EXPECT_GE(calls, 6u);
}

TEST(ResponseGrammar, NamedForcedCallValidates) {
  ResponseSpec spec;
  spec.tools = tools();
  spec.calls = ResponseSpec::Calls::Forced;
  spec.forced_function = "search";
  spec.parallel_calls = false;
  auto g = response(spec);
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    const std::string text = "<tool_call>\n<function=search>\n" + walk(g, seed, 200);
    const Parsed p = parse(text, false);
    ASSERT_EQ(p.calls.size(), 1u) << text;
    EXPECT_EQ(p.calls[0].first, "search");
    expect_valid_calls(p, text);
  }
}

TEST(ResponseGrammar, AutoCallsAfterReasoningAndContent) {
  ResponseSpec spec;
  spec.tools = tools();
  spec.calls = ResponseSpec::Calls::Auto;
  spec.in_reasoning = true;
  ASSERT_TRUE(spec.constrained());
  auto g = response(spec);
  size_t calls = 0;
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    const std::string text = walk(g, seed, 200);
    const Parsed p = parse(text, true);
    expect_valid_calls(p, text);
    calls += p.calls.size();
  }
  EXPECT_GE(calls, 2u);  // markup is favoured, so calls do happen
}

TEST(ResponseGrammar, JsonContentAfterReasoningValidates) {
  ResponseSpec spec;
  spec.content = ResponseSpec::Content::JsonSchema;
  spec.schema = OrderedJson::parse(
      R"({"type":"object","properties":{"answer":{"type":"string","maxLength":12},"score":{"type":"integer","minimum":0,"maximum":10}},"required":["answer","score"]})");
  spec.in_reasoning = true;
  auto g = response(spec);
  for (uint64_t seed = 1; seed <= 10; ++seed) {
    const std::string text = walk(g, seed, 200);
    const Parsed p = parse(text, true);
    EXPECT_TRUE(p.calls.empty());
    VJson doc;
    ASSERT_NO_THROW(doc = VJson::parse(p.content)) << text;
    EXPECT_EQ(Validator(spec.schema).check(doc), "") << text;
  }
}

TEST(ResponseGrammar, RealOutputsAreAccepted) {
  ResponseSpec spec;
  spec.tools = tools();
  spec.calls = ResponseSpec::Calls::Auto;
  spec.in_reasoning = true;
  auto g = response(spec);
  const std::string outputs[] = {
      "The user wants the weather.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
      "</parameter>\n<parameter=unit>\ncelsius\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n"
      "</tool_call>",
      "Two lookups.\n</think>\n\nLet me search.\n\n<tool_call>\n<function=search>\n<parameter=query>\nbest pizza\n"
      "</parameter>\n<parameter=filters>\n{\"site\": \"example.com\", \"year\": 2024}\n</parameter>\n<parameter=tags>\n"
      "[\"food\", \"nyc\"]\n</parameter>\n<parameter=note>\nnull\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n"
      "<function=free_tool>\n<parameter=x>\nanything goes\n</parameter>\n</function>\n</tool_call>",
      "Nothing to call.\n</think>\n\nIt is sunny.",
  };
  for (const auto& out : outputs) {
    Matcher m(g, {qwen3_im_end()});
    std::vector<uint32_t> mask(m.mask_words());
    for (int32_t t : qwen3().encode(out, true)) {
      m.fill_mask(mask);
      ASSERT_TRUE(bit(mask, t)) << "'" << qwen3().token_bytes(t) << "' in " << out;
      ASSERT_TRUE(m.accept_token(t));
    }
    EXPECT_TRUE(m.can_end()) << out;
  }
  // Values that would end early, or break the schema, are refused.
  auto prefix_ok = [&](const std::string& s) {
    Matcher m(g, {qwen3_im_end()});
    for (int32_t t : qwen3().encode(s, true))
      if (!m.accept_token(t)) return false;
    return true;
  };
  const std::string call = "x\n</think>\n\n<tool_call>\n<function=search>\n<parameter=query>\nab";
  EXPECT_TRUE(prefix_ok(call));
  EXPECT_FALSE(prefix_ok(call + "C"));                                   // pattern ^[a-z ]+$
  EXPECT_FALSE(prefix_ok(call + "</parameter>"));                        // markup inside the value
  const std::string filters = call + "\n</parameter>\n<parameter=filters>\n{\"site\": \"";
  EXPECT_TRUE(prefix_ok(filters + "a\\u003c/parameter>"));
  EXPECT_FALSE(prefix_ok(filters + "a<"));                               // '<' only escaped in JSON values
  EXPECT_FALSE(prefix_ok("x\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=unit>"));  // city first
}

TEST(ResponseGrammar, SchemaErrorsNameTheRequestField) {
  ResponseSpec spec;
  spec.tools = OrderedJson::parse(
      R"([{"type":"function","function":{"name":"a","strict":true,"parameters":{"type":"object","properties":{"p":{"type":"string","not":{}}}}}}])");
  spec.calls = ResponseSpec::Calls::Auto;
  try {
    build_response_grammar(spec, qwen3_6_format().markup(), qwen3());
    ADD_FAILURE() << "accepted";
  } catch (const SchemaError& e) {
    EXPECT_EQ(e.param(), "tools[0].function.parameters");
    EXPECT_EQ(e.path(), "#/properties/p/not");
    EXPECT_EQ(e.keyword(), "not");
  }
  // A mix of string and integer cannot be read back from the XML form.
  spec.tools[0]["function"]["parameters"]["properties"]["p"] = OrderedJson::parse(R"({"type":["string","integer"]})");
  try {
    build_response_grammar(spec, qwen3_6_format().markup(), qwen3());
    ADD_FAILURE() << "accepted";
  } catch (const SchemaError& e) {
    EXPECT_EQ(e.param(), "tools[0].function.parameters");
    EXPECT_EQ(e.path(), "#/properties/p");
  }
  // A forced call of a tool that is not strict falls back to unconstrained arguments.
  spec.tools[0]["function"].erase("strict");
  spec.calls = ResponseSpec::Calls::Forced;
  EXPECT_NO_THROW(build_response_grammar(spec, qwen3_6_format().markup(), qwen3()));
  spec.calls = ResponseSpec::Calls::Auto;
  EXPECT_FALSE(spec.constrained());  // nothing strict, content free
  ResponseSpec js;
  js.content = ResponseSpec::Content::JsonSchema;
  js.schema = OrderedJson::parse(R"({"type":"object","minProperties":1})");
  try {
    build_response_grammar(js, qwen3_6_format().markup(), qwen3());
    ADD_FAILURE() << "accepted";
  } catch (const SchemaError& e) {
    EXPECT_EQ(e.param(), "response_format.json_schema.schema");
    EXPECT_EQ(e.keyword(), "minProperties");
  }
  EXPECT_NE(js.cache_key(), spec.cache_key());
}

}  // namespace
}  // namespace lilac::grammar::test
