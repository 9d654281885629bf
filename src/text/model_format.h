// The model's output format beyond the chat template: the markup it writes around reasoning and tool
// calls (what text/output_parser.h recognises) and the prompt suffix that forces a tool call
// (tool_choice "required" or a named function). One implementation today: Qwen3.6 (qwen3_6_format()).
#pragma once
#include <optional>
#include <string>
#include <string_view>

namespace lilac {

// The markup of the model's output. Tool calls in the XML form read
//   <tool_call>\n<function=NAME>\n<parameter=ARG>\nVALUE\n</parameter>\n</function>\n</tool_call>
// (Qwen3's JSON form `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` is accepted too).
struct FormatMarkup {
  std::string_view think_open, think_close;          // reasoning block
  std::string_view tool_open, tool_close;            // one tool call (several functions allowed inside)
  std::string_view function_open, function_close;    // function_open + NAME + ">"
  std::string_view parameter_open, parameter_close;  // parameter_open + ARG + ">"
};

// What to append to a rendered prompt, and how the output parser must start, for one generation.
struct GenerationPrompt {
  std::string text;           // the rendered prompt with the suffix appended
  bool in_reasoning = false;  // the prompt leaves the model inside a reasoning block
  std::string call_prefix;    // the forced call's opening (already in `text`): feed it to the parser first
};

class ModelFormat {
 public:
  virtual ~ModelFormat() = default;
  virtual const FormatMarkup& markup() const = 0;
  // Whether a rendered prompt (with the generation prompt) leaves the model inside a reasoning block.
  virtual bool prompt_opens_reasoning(std::string_view prompt) const = 0;
  // The text that, appended to `prompt`, closes an open reasoning block ("" when none is open).
  virtual std::string close_reasoning(std::string_view prompt) const = 0;
  // The text that closes a reasoning block the model is still writing (a reasoning budget ran out),
  // after which the model writes its answer.
  virtual std::string force_close_reasoning() const = 0;
  // The opening of a tool call, appended to `prompt` (reasoning closed) to force a call: of `function`
  // when it is not empty, else of any tool.
  virtual std::string tool_call_prefix(std::string_view prompt, std::string_view function) const = 0;
  // A conversation that ends with an assistant message, rendered without a generation prompt, with that
  // message's end of turn removed so that the model continues the message (a prefill); nullopt when the
  // rendered text does not end with an end of turn.
  virtual std::optional<std::string> continue_final_turn(std::string rendered) const = 0;
  // Whether calls are written in the XML form (markup().function_open ...) after this rendered prompt,
  // else in the JSON form.
  virtual bool xml_tool_calls(std::string_view prompt) const = 0;

  // The prompt for one generation: `rendered` as is, or, when `force_call`, with reasoning closed and
  // the call opened (of `function`, or any tool when it is empty).
  GenerationPrompt generation_prompt(std::string rendered, bool force_call, std::string_view function = "") const;
};

// Qwen3.6 (and Qwen3): <think>...</think>, <tool_call> with the XML form, or the JSON form when the
// chat template did not describe the XML form.
const ModelFormat& qwen3_6_format();

}  // namespace lilac
