#include "text/model_format.h"

namespace lilac {

namespace {

bool ends_with(std::string_view s, std::string_view suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

class Qwen36Format final : public ModelFormat {
 public:
  const FormatMarkup& markup() const override {
    static const FormatMarkup m{"<think>",    "</think>",    "<tool_call>",  "</tool_call>",
                                "<function=", "</function>", "<parameter=", "</parameter>"};
    return m;
  }

  bool prompt_opens_reasoning(std::string_view prompt) const override {
    return ends_with(prompt, "<think>\n") || ends_with(prompt, "<think>");
  }

  std::string close_reasoning(std::string_view prompt) const override {
    if (!prompt_opens_reasoning(prompt)) return "";
    return ends_with(prompt, "\n") ? "\n</think>\n\n" : "\n\n</think>\n\n";
  }

  std::string force_close_reasoning() const override { return "\n" + std::string(markup().think_close) + "\n\n"; }

  std::string tool_call_prefix(std::string_view prompt, std::string_view function) const override {
    std::string s = std::string(markup().tool_open) + "\n";
    if (function.empty()) return s;
    if (xml_tool_calls(prompt)) return s + std::string(markup().function_open) + std::string(function) + ">\n";
    return s + "{\"name\": \"" + std::string(function) + "\", \"arguments\": ";
  }

  // The template closes every assistant message with "<|im_end|>" and a newline.
  std::optional<std::string> continue_final_turn(std::string rendered) const override {
    static constexpr std::string_view kEnd = "<|im_end|>";
    if (ends_with(rendered, "\n")) rendered.pop_back();
    if (!ends_with(rendered, kEnd)) return std::nullopt;
    rendered.resize(rendered.size() - kEnd.size());
    return rendered;
  }

  // The XML form when the chat template described it (its system prompt shows "<function="), else
  // Qwen3's JSON form.
  bool xml_tool_calls(std::string_view prompt) const override {
    return prompt.find(markup().function_open) != std::string_view::npos;
  }
};

}  // namespace

GenerationPrompt ModelFormat::generation_prompt(std::string rendered, bool force_call, std::string_view function) const {
  GenerationPrompt p;
  p.in_reasoning = prompt_opens_reasoning(rendered);
  if (force_call) {
    rendered += close_reasoning(rendered);
    p.in_reasoning = false;
    p.call_prefix = tool_call_prefix(rendered, function);
    rendered += p.call_prefix;
  }
  p.text = std::move(rendered);
  return p;
}

const ModelFormat& qwen3_6_format() {
  static const Qwen36Format f;
  return f;
}

}  // namespace lilac
