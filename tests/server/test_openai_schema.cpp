// OpenAI request validation: defaults from generation_config, tool_choice handling, error params.
#include <gtest/gtest.h>

#include "server/openai_schema.h"

using lilac::server::ApiError;
using lilac::server::ojson;
using lilac::server::parse_chat_request;
using lilac::server::parse_completion_request;
using lilac::server::ToolChoice;
using lilac::server::ChatParams;
using lilac::server::CommonParams;
using lilac::server::ResponseFormat;

namespace {

lilac::ModelConfig config_with_defaults() {
  lilac::ModelConfig c;
  c.vocab_size = 1000;
  c.default_temperature = 0.6f;
  c.default_top_p = 0.95f;
  c.default_top_k = 20;
  c.default_min_p = 0.05f;
  c.default_repetition_penalty = 1.1f;
  return c;
}

ojson chat(ojson extra = ojson::object()) {
  ojson b = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  for (auto& [k, v] : extra.items()) b[k] = v;
  return b;
}

// Runs parse_chat_request and returns the ApiError's param (fails if it does not throw).
// The param of the ApiError a chat (or, with is_chat false, a completions) request body raises.
std::string error_param(const ojson& body, int* status = nullptr, std::string* code = nullptr, bool is_chat = true) {
  try {
    if (is_chat)
      parse_chat_request(body, config_with_defaults(), 1);
    else
      parse_completion_request(body, config_with_defaults(), 1);
  } catch (const ApiError& e) {
    if (status) *status = e.status;
    if (code) *code = e.code;
    return e.param;
  }
  ADD_FAILURE() << "no error for " << body.dump();
  return "";
}

}  // namespace

TEST(OpenAISchema, SamplingDefaultsComeFromGenerationConfigElseOpenAI) {
  auto p = parse_chat_request(chat(), config_with_defaults(), 77);
  EXPECT_FLOAT_EQ(p.sampling.temperature, 0.6f);
  EXPECT_FLOAT_EQ(p.sampling.top_p, 0.95f);
  EXPECT_EQ(p.sampling.top_k, 20);
  EXPECT_FLOAT_EQ(p.sampling.min_p, 0.05f);
  EXPECT_FLOAT_EQ(p.sampling.repetition_penalty, 1.1f);
  EXPECT_EQ(p.sampling.seed, 77u);
  EXPECT_FALSE(p.max_tokens.has_value());
  lilac::ModelConfig none;
  none.vocab_size = 10;
  p = parse_chat_request(chat(), none, 1);
  EXPECT_FLOAT_EQ(p.sampling.temperature, 1.f);
  EXPECT_FLOAT_EQ(p.sampling.top_p, 1.f);
  EXPECT_EQ(p.sampling.top_k, 0);
  EXPECT_FLOAT_EQ(p.sampling.repetition_penalty, 1.f);
  // Explicit values win; temperature 0 stays 0 (exact greedy).
  p = parse_chat_request(chat({{"temperature", 0}, {"top_p", 0.5}, {"top_k", 3}, {"seed", 9}, {"max_tokens", 5},
                               {"max_completion_tokens", 7}, {"stop", "END"}, {"presence_penalty", 0.5},
                               {"frequency_penalty", -0.5}, {"logprobs", true}, {"top_logprobs", 4}}),
                         config_with_defaults(), 1);
  EXPECT_EQ(p.sampling.temperature, 0.f);
  EXPECT_FLOAT_EQ(p.sampling.top_p, 0.5f);
  EXPECT_EQ(p.sampling.top_k, 3);
  EXPECT_EQ(p.sampling.seed, 9u);
  EXPECT_EQ(*p.max_tokens, 7);
  EXPECT_EQ(p.stop, std::vector<std::string>{"END"});
  EXPECT_FLOAT_EQ(p.sampling.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(p.sampling.frequency_penalty, -0.5f);
  EXPECT_TRUE(p.sampling.logprobs);
  EXPECT_EQ(p.sampling.top_logprobs, 4);
  // null means "not given".
  p = parse_chat_request(chat({{"temperature", nullptr}, {"max_tokens", nullptr}}), config_with_defaults(), 1);
  EXPECT_FLOAT_EQ(p.sampling.temperature, 0.6f);
  EXPECT_FALSE(p.max_tokens.has_value());
}

TEST(OpenAISchema, ToolsAndToolChoice) {
  ojson tools = ojson::parse(R"([{"type":"function","function":{"name":"get_weather",
      "parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}])");
  auto p = parse_chat_request(chat({{"tools", tools}}), config_with_defaults(), 1);
  EXPECT_EQ(p.tool_choice, ToolChoice::Auto);
  EXPECT_EQ(p.template_request["tools"], tools);
  p = parse_chat_request(chat({{"tools", tools}, {"tool_choice", "none"}}), config_with_defaults(), 1);
  EXPECT_EQ(p.tool_choice, ToolChoice::None);
  EXPECT_FALSE(p.template_request.contains("tools"));
  EXPECT_TRUE(p.tools.is_null());
  p = parse_chat_request(chat({{"tools", tools}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}}}),
                         config_with_defaults(), 1);
  EXPECT_EQ(p.tool_choice, ToolChoice::Function);
  EXPECT_EQ(p.tool_choice_name, "get_weather");
  p = parse_chat_request(chat({{"tools", tools}, {"tool_choice", "required"}}), config_with_defaults(), 1);
  EXPECT_EQ(p.tool_choice, ToolChoice::Required);
  // chat_template_kwargs pass through; top-level enable_thinking is folded in.
  p = parse_chat_request(chat({{"chat_template_kwargs", {{"enable_thinking", false}, {"x", 1}}}}), config_with_defaults(), 1);
  EXPECT_EQ(p.template_request["chat_template_kwargs"]["enable_thinking"], false);
  EXPECT_EQ(p.template_request["chat_template_kwargs"]["x"], 1);
  p = parse_chat_request(chat({{"enable_thinking", false}}), config_with_defaults(), 1);
  EXPECT_EQ(p.template_request["chat_template_kwargs"]["enable_thinking"], false);
}

TEST(OpenAISchema, ErrorsNameTheParameter) {
  int status = 0;
  std::string code;
  EXPECT_EQ(error_param(ojson::object(), &status, &code), "messages");
  EXPECT_EQ(status, 400);
  EXPECT_EQ(code, "missing_required_parameter");
  EXPECT_EQ(error_param(chat({{"temperature", "1"}}), nullptr, &code), "temperature");
  EXPECT_EQ(code, "invalid_type");
  EXPECT_EQ(error_param(chat({{"top_p", 0}})), "top_p");
  EXPECT_EQ(error_param(chat({{"n", 17}})), "n");
  EXPECT_EQ(parse_chat_request(chat({{"n", 3}}), config_with_defaults(), 1).n, 3);
  EXPECT_EQ(error_param(chat({{"stop", {1, 2}}})), "stop");
  EXPECT_EQ(error_param(chat({{"stream_options", {{"include_usage", true}}}})), "stream_options");
  EXPECT_EQ(error_param(chat({{"logprobs", true}, {"top_logprobs", 30}})), "top_logprobs");
  EXPECT_EQ(error_param(chat({{"response_format", {{"type", "json_schema"}}}})), "response_format.json_schema");
  EXPECT_EQ(error_param(chat({{"response_format", {{"type", "yaml"}}}})), "response_format.type");
  EXPECT_EQ(error_param(chat({{"response_format", {{"type", "json_schema"}, {"json_schema", {{"schema", ojson::object()}}}}}})),
            "response_format.json_schema.name");
  EXPECT_EQ(error_param(chat({{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "a b"}}}}}})),
            "response_format.json_schema.name");
  EXPECT_EQ(error_param(chat({{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "a"}, {"schema", 3}}}}}})),
            "response_format.json_schema.schema");
  EXPECT_EQ(error_param(chat({{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "a"}, {"strict", "yes"}}}}}})),
            "response_format.json_schema.strict");
  EXPECT_EQ(error_param(chat({{"tools", {{{"type", "function"}, {"function", {{"name", "a"}, {"strict", 1}}}}}}})),
            "tools[0].function.strict");
  EXPECT_EQ(error_param(chat({{"parallel_tool_calls", "no"}})), "parallel_tool_calls");
  EXPECT_EQ(error_param(chat({{"tools", {{{"type", "function"}, {"function", {{"name", ""}}}}}}})), "tools[0].function.name");
  EXPECT_EQ(error_param(chat({{"tools", {{{"type", "function"}, {"function", {{"name", "a"}}}},
                                         {{"type", "function"}, {"function", {{"name", "a"}}}}}}})),
            "tools[1].function.name");
  EXPECT_EQ(error_param(chat({{"tool_choice", "maybe"}})), "tool_choice");
  ojson m = {{"messages", {{{"role", "user"}, {"content", {{{"type", "text"}}}}}}}};
  EXPECT_EQ(error_param(m), "messages[0].content[0].text");
  m = {{"messages", {{{"content", "a"}}}}};
  EXPECT_EQ(error_param(m), "messages[0].role");
  // Valid odd-but-allowed shapes.
  m = ojson::parse(R"({"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
     {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"x\":1}"}}]},
     {"role":"tool","tool_call_id":"c1","content":"42"}], "unknown_field": {"a": 1}})");
  EXPECT_NO_THROW(parse_chat_request(m, config_with_defaults(), 1));
}

TEST(OpenAISchema, CompletionPrompts) {
  auto cfg = config_with_defaults();
  auto p = parse_completion_request(ojson{{"prompt", "abc"}}, cfg, 1);
  ASSERT_EQ(p.prompts.size(), 1u);
  EXPECT_EQ(p.prompts[0].text, "abc");
  EXPECT_FALSE(p.prompts[0].ids);
  EXPECT_EQ(*p.max_tokens, 16);
  EXPECT_FALSE(p.echo);
  p = parse_completion_request(ojson{{"prompt", {"xyz"}}, {"max_tokens", 3}, {"logprobs", 2}}, cfg, 1);
  EXPECT_EQ(p.prompts[0].text, "xyz");
  EXPECT_EQ(*p.max_tokens, 3);
  EXPECT_TRUE(p.sampling.logprobs);
  EXPECT_EQ(p.sampling.top_logprobs, 2);
  p = parse_completion_request(ojson{{"prompt", {1, 2, 3}}}, cfg, 1);
  ASSERT_EQ(p.prompts.size(), 1u);
  EXPECT_EQ(*p.prompts[0].ids, (std::vector<int32_t>{1, 2, 3}));
  p = parse_completion_request(ojson{{"prompt", {{4, 5}}}}, cfg, 1);
  EXPECT_EQ(*p.prompts[0].ids, (std::vector<int32_t>{4, 5}));
  EXPECT_THROW(parse_completion_request(ojson{{"prompt", {1000}}}, cfg, 1), ApiError);
  EXPECT_THROW(parse_completion_request(ojson{{"prompt", ""}}, cfg, 1), ApiError);
  EXPECT_THROW(parse_completion_request(ojson{{"prompt", "a"}, {"suffix", "b"}}, cfg, 1), ApiError);
}

// Several prompts per request (as OpenAI's API and evaluation harnesses send them): strings or id arrays, not
// mixed, none empty; at most kMaxPrompts, and kMaxGenerations with n.
TEST(OpenAISchema, SeveralCompletionPrompts) {
  auto cfg = config_with_defaults();
  auto p = parse_completion_request(ojson{{"prompt", {"a", "b", "c"}}}, cfg, 1);
  ASSERT_EQ(p.prompts.size(), 3u);
  EXPECT_EQ(p.prompts[2].text, "c");
  p = parse_completion_request(ojson::parse(R"({"prompt": [[1, 2], [3], [4, 5, 6]], "n": 2})"), cfg, 1);
  ASSERT_EQ(p.prompts.size(), 3u);
  EXPECT_EQ(*p.prompts[1].ids, (std::vector<int32_t>{3}));
  EXPECT_EQ(p.n, 2);
  for (const char* bad : {R"({"prompt": ["a", [1]]})", R"({"prompt": [[1], "a"]})", R"({"prompt": ["a", ""]})",
                          R"({"prompt": [[1], []]})", R"({"prompt": [[1], [1000]]})", R"({"prompt": ["a", 5]})"}) {
    int status = 0;
    EXPECT_EQ(error_param(ojson::parse(bad), &status, nullptr, false), "prompt") << bad;
    EXPECT_EQ(status, 400) << bad;
  }
  ojson many = {{"prompt", ojson::array()}};
  for (int i = 0; i < lilac::server::kMaxPrompts + 1; ++i) many["prompt"].push_back("x");
  EXPECT_EQ(error_param(many, nullptr, nullptr, false), "prompt");
  many["prompt"].erase(0);
  EXPECT_NO_THROW(parse_completion_request(many, cfg, 1));
  many["n"] = 2;  // 128 generations
  EXPECT_EQ(error_param(many, nullptr, nullptr, false), "n");
}

// echo (completions only), and max_tokens 0 only with it.
TEST(OpenAISchema, CompletionEcho) {
  auto cfg = config_with_defaults();
  auto p = parse_completion_request(ojson{{"prompt", "a"}, {"echo", true}, {"logprobs", 1}, {"max_tokens", 1}}, cfg, 1);
  EXPECT_TRUE(p.echo);
  EXPECT_EQ(p.top_logprobs, 1);
  p = parse_completion_request(ojson{{"prompt", "a"}, {"echo", true}, {"max_tokens", 0}}, cfg, 1);
  EXPECT_EQ(*p.max_tokens, 0);
  int status = 0;
  std::string code;
  EXPECT_EQ(error_param(ojson{{"prompt", "a"}, {"max_tokens", 0}}, &status, &code, false), "max_tokens");
  EXPECT_EQ(code, "invalid_value");
  EXPECT_EQ(error_param(ojson{{"prompt", "a"}, {"echo", "yes"}}, &status, nullptr, false), "echo");
  EXPECT_EQ(error_param(chat({{"echo", true}}), &status, &code), "echo");
  EXPECT_EQ(code, "unsupported_value");
  EXPECT_EQ(error_param(chat({{"max_tokens", 0}}), &status), "max_tokens");
  EXPECT_NO_THROW(parse_chat_request(chat({{"echo", false}}), cfg, 1));
}

// logit_bias: token-id keys in the vocabulary, values in [-100, 100], at most kMaxLogitBias entries; chat and
// completions alike.
TEST(OpenAISchema, LogitBias) {
  auto cfg = config_with_defaults();
  auto p = parse_chat_request(chat({{"logit_bias", {{"5", -100}, {"7", 2.5}}}}), cfg, 1);
  ASSERT_EQ(p.sampling.logit_bias.size(), 2u);
  EXPECT_EQ(p.sampling.logit_bias[0], (std::pair<int32_t, float>{5, -100.f}));
  EXPECT_EQ(p.sampling.logit_bias[1], (std::pair<int32_t, float>{7, 2.5f}));
  auto c = parse_completion_request(ojson{{"prompt", "a"}, {"logit_bias", {{"0", 100}}}}, cfg, 1);
  EXPECT_EQ(c.sampling.logit_bias.size(), 1u);
  EXPECT_TRUE(parse_chat_request(chat({{"logit_bias", ojson::object()}}), cfg, 1).sampling.logit_bias.empty());
  // {"5": 100, "05": 100} named token 5 twice: both were added, a bias of 200.
  for (const char* bad : {R"({"x": 1})", R"({"-1": 1})", R"({"1.5": 1})", R"({"99999999999": 1})", R"({"": 1})",
                          R"({"5": 101})", R"({"5": -100.5})", R"({"5": "1"})", R"([1])", R"("5")",
                          R"({"5": 100, "05": 100})", R"({"0": -100, "000": -100})"}) {
    int status = 0;
    EXPECT_EQ(error_param(chat({{"logit_bias", ojson::parse(bad)}}), &status), "logit_bias") << bad;
    EXPECT_EQ(status, 400) << bad;
  }
  auto big = cfg;
  big.vocab_size = 4096;
  ojson many = ojson::object();
  for (int i = 0; i <= lilac::server::kMaxLogitBias; ++i) many[std::to_string(i)] = 1;
  try {
    parse_chat_request(chat({{"logit_bias", many}}), big, 1);
    ADD_FAILURE() << "no error for " << many.size() << " entries";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param, "logit_bias");
  }
  many.erase("0");
  EXPECT_EQ(parse_chat_request(chat({{"logit_bias", many}}), big, 1).sampling.logit_bias.size(),
            size_t(lilac::server::kMaxLogitBias));
}

// Issue 13, 7: a tool whose `parameters` is not a JSON schema object was accepted.
TEST(OpenAISchema, ToolParametersMustBeAnObjectSchema) {
  auto tool = [](const char* params) {
    return chat({{"tools", ojson::parse(std::string(R"([{"type":"function","function":{"name":"f","parameters":)") + params + "}}]")}});
  };
  for (const char* bad : {R"({"properties": {"a": {"type": "string"}}})", R"({"foo": "bar"})", R"({"type": "string"})",
                          R"({"type": ["object"]})", R"({"type": "object", "properties": {"a": 5}})",
                          R"({"type": "object", "properties": {"a": "string"}})", R"("object")", R"([1])"}) {
    int status = 0;
    std::string code;
    EXPECT_EQ(error_param(tool(bad), &status, &code), "tools[0].function.parameters") << bad;
    EXPECT_EQ(status, 400) << bad;
  }
  for (const char* good : {R"({})", R"(null)", R"({"type": "object"})",
                           R"({"type": "object", "properties": {"a": {"type": "string"}, "b": true}, "required": ["a"]})"})
    EXPECT_NO_THROW(parse_chat_request(tool(good), config_with_defaults(), 1)) << good;
}

TEST(OpenAISchema, ResponseFormat) {
  for (bool is_chat : {true, false}) {
    auto parse = [&](const ojson& extra) -> CommonParams {
      if (is_chat) return parse_chat_request(chat(extra), config_with_defaults(), 1);
      ojson b = {{"prompt", "hi"}};
      for (auto& [k, v] : extra.items()) b[k] = v;
      return parse_completion_request(b, config_with_defaults(), 1);
    };
    EXPECT_EQ(parse(ojson::object()).response_format, ResponseFormat::Text);
    EXPECT_EQ(parse({{"response_format", {{"type", "text"}}}}).response_format, ResponseFormat::Text);
    EXPECT_EQ(parse({{"response_format", {{"type", "json_object"}}}}).response_format, ResponseFormat::JsonObject);
    const ojson schema = ojson::parse(R"({"type":"object","properties":{"b":{},"a":{}}})");
    CommonParams p = parse({{"response_format", {{"type", "json_schema"},
                                                 {"json_schema", {{"name", "out_1"}, {"strict", true}, {"schema", schema}}}}}});
    EXPECT_EQ(p.response_format, ResponseFormat::JsonSchema);
    EXPECT_EQ(p.json_schema.dump(), schema.dump());  // property order kept
    p = parse({{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}}}}}});
    EXPECT_EQ(p.json_schema, ojson::object());  // no schema: any JSON value
  }
  ChatParams c = parse_chat_request(chat({{"parallel_tool_calls", false}}), config_with_defaults(), 1);
  EXPECT_FALSE(c.parallel_tool_calls);
  EXPECT_TRUE(parse_chat_request(chat(ojson::object()), config_with_defaults(), 1).parallel_tool_calls);
}

// A final assistant message is continued (a prefill, as llama.cpp's server and Anthropic's API do); what cannot be
// continued is a 400 naming the field.
TEST(OpenAISchema, FinalAssistantMessageIsAPrefill) {
  const ojson user = {{"role", "user"}, {"content", "a"}};
  ChatParams p = parse_chat_request({{"messages", {user, {{"role", "assistant"}, {"content", "The answer is"}}}}},
                                    config_with_defaults(), 1);
  EXPECT_TRUE(p.continue_final);
  EXPECT_FALSE(parse_chat_request(chat(), config_with_defaults(), 1).continue_final);
  p = parse_chat_request({{"messages", {user, {{"role", "assistant"}, {"content", {{{"type", "text"}, {"text", "{"}}}}}}}},
                         config_with_defaults(), 1);
  EXPECT_TRUE(p.continue_final);
  std::string code;
  EXPECT_EQ(error_param({{"messages", {user, {{"role", "assistant"}, {"content", "b "}}}}}, nullptr, &code), "messages");
  EXPECT_EQ(code, "invalid_last_message");
  EXPECT_EQ(error_param({{"messages", {user, {{"role", "assistant"}, {"content", {{{"type", "text"}, {"text", "b\n"}}}}}}}},
                        nullptr, &code), "messages");
  const ojson calls = ojson::parse(R"([{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}])");
  EXPECT_EQ(error_param({{"messages", {user, {{"role", "assistant"}, {"content", nullptr}, {"tool_calls", calls}}}}}, nullptr,
                        &code), "messages");
  EXPECT_EQ(code, "invalid_last_message");
  const ojson prefill = {{"messages", {user, {{"role", "assistant"}, {"content", "{"}}}}};
  ojson b = prefill;
  b["response_format"] = {{"type", "json_object"}};
  EXPECT_EQ(error_param(b), "response_format");
  b = prefill;
  b["tools"] = ojson::parse(R"([{"type":"function","function":{"name":"f"}}])");
  b["tool_choice"] = "required";
  EXPECT_EQ(error_param(b), "tool_choice");
  b["tool_choice"] = "auto";
  EXPECT_TRUE(parse_chat_request(b, config_with_defaults(), 1).continue_final);
}
