// ModelFormat (Qwen3.6): the prompt suffix that forces a tool call, reasoning detection, and the output
// parser reading a forced call back.
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "text/chat_template.h"
#include "text/model_format.h"
#include "text/output_parser.h"

using lilac::qwen3_6_format;
using nlohmann::ordered_json;

namespace {

const std::string kAsk = "<|im_start|>user\nweather?<|im_end|>\n<|im_start|>assistant\n";

}  // namespace

TEST(ModelFormat, Qwen36Markup) {
  const auto& m = qwen3_6_format().markup();
  EXPECT_EQ(m.think_open, "<think>");
  EXPECT_EQ(m.think_close, "</think>");
  EXPECT_EQ(m.tool_open, "<tool_call>");
  EXPECT_EQ(m.tool_close, "</tool_call>");
  EXPECT_EQ(m.function_open, "<function=");
  EXPECT_EQ(m.parameter_close, "</parameter>");
}

TEST(ModelFormat, NotForcedKeepsThePrompt) {
  auto p = qwen3_6_format().generation_prompt(kAsk + "<think>\n", false);
  EXPECT_EQ(p.text, kAsk + "<think>\n");
  EXPECT_TRUE(p.in_reasoning);
  EXPECT_EQ(p.call_prefix, "");
  p = qwen3_6_format().generation_prompt(kAsk + "<think>\n\n</think>\n\n", false);
  EXPECT_FALSE(p.in_reasoning);
  p = qwen3_6_format().generation_prompt(kAsk + "<think>", false);
  EXPECT_TRUE(p.in_reasoning);
}

// A prefill: the final assistant message's end of turn comes off, so the model continues its content.
TEST(ModelFormat, ContinueFinalTurnRemovesTheEndOfTurn) {
  const std::string turn = kAsk + "<think>\n\n</think>\n\nThe sea is";
  EXPECT_EQ(qwen3_6_format().continue_final_turn(turn + "<|im_end|>\n"), turn);
  EXPECT_EQ(qwen3_6_format().continue_final_turn(turn + "<|im_end|>"), turn);
  EXPECT_EQ(qwen3_6_format().continue_final_turn(turn), std::nullopt);
  EXPECT_EQ(qwen3_6_format().continue_final_turn(turn + "<|im_end|>\n\n"), std::nullopt);
  EXPECT_FALSE(qwen3_6_format().generation_prompt(turn, false).in_reasoning);
}

TEST(ModelFormat, ForcingClosesReasoningAndOpensTheCall) {
  // Any tool: only the <tool_call> opening.
  auto p = qwen3_6_format().generation_prompt(kAsk + "<think>\n", true);
  EXPECT_EQ(p.text, kAsk + "<think>\n" + "\n</think>\n\n" + "<tool_call>\n");
  EXPECT_FALSE(p.in_reasoning);
  EXPECT_EQ(p.call_prefix, "<tool_call>\n");
  // Reasoning opened without a newline.
  p = qwen3_6_format().generation_prompt(kAsk + "<think>", true);
  EXPECT_EQ(p.text, kAsk + "<think>" + "\n\n</think>\n\n" + "<tool_call>\n");
  // Thinking off: nothing to close.
  p = qwen3_6_format().generation_prompt(kAsk, true);
  EXPECT_EQ(p.text, kAsk + "<tool_call>\n");
}

TEST(ModelFormat, NamedFunctionUsesTheFormTheTemplateDescribed) {
  // The template's system prompt shows the XML form: the call opens <function=NAME>.
  const std::string xml_sys = "<|im_start|>system\n... <tool_call>\n<function=example>\n...<|im_end|>\n";
  auto p = qwen3_6_format().generation_prompt(xml_sys + kAsk, true, "get_weather");
  EXPECT_EQ(p.call_prefix, "<tool_call>\n<function=get_weather>\n");
  EXPECT_EQ(p.text, xml_sys + kAsk + p.call_prefix);
  // Otherwise Qwen3's JSON form.
  p = qwen3_6_format().generation_prompt(kAsk, true, "get_weather");
  EXPECT_EQ(p.call_prefix, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": ");
}

TEST(ModelFormat, ForcedCallWithTheQwen36TemplateParsesBack) {
  auto tmpl = lilac::ChatTemplate::load(std::string(LILAC_SHARED_DIR) + "/fixtures/qwen3.6-template");
  ordered_json tools = ordered_json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}])");
  ordered_json req = {{"messages", ordered_json::array({{{"role", "user"}, {"content", "weather in Paris?"}}})},
                      {"tools", tools}};
  std::string rendered = lilac::render_chat_request(*tmpl, req);
  auto p = qwen3_6_format().generation_prompt(rendered, true, "get_weather");
  EXPECT_EQ(p.call_prefix, "<tool_call>\n<function=get_weather>\n");  // the template describes the XML form
  ASSERT_EQ(p.text.substr(0, rendered.size()), rendered);
  EXPECT_FALSE(p.in_reasoning);

  // What the model generates after the prefix completes the call.
  lilac::OutputParser parser(p.in_reasoning, tools);
  auto d = parser.push(p.call_prefix);
  EXPECT_TRUE(d.empty());
  d = parser.push("<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>");
  auto f = parser.finish();
  d.insert(d.end(), f.begin(), f.end());
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].kind, lilac::OutputDelta::ToolCall);
  EXPECT_EQ(d[0].tool_name, "get_weather");
  EXPECT_EQ(d[0].arguments, R"({"city":"Paris","days":3})");
}
