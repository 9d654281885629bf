// Incremental parser of generated text in the Qwen3.6 format (text/model_format.h): <think>...</think> reasoning,
// <tool_call> XML (or Qwen3's JSON inside <tool_call>) -> OpenAI tool_calls, the rest content.
// The concatenated result never depends on how the text is split across push() calls. Newlines the
// format puts around markup (after <think>/</think>/</tool_call>, before </think>/<tool_call>) are
// dropped; a tool call's arguments stream as ToolCall deltas while they are generated (the first carries
// the call's id and name, the last is marked tool_end; their arguments concatenate to the call's JSON);
// markup that is not a call becomes plain content (reasoning stays reasoning); never throws on text.
// Every delta's text is valid UTF-8. Full list of choices: output_parser.cpp.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/model_format.h"

namespace lilac {

struct OutputDelta {
  enum Kind { Content, Reasoning, ToolCall } kind = Content;
  std::string text;        // Content / Reasoning text
  int tool_index = -1;     // ToolCall: index among this response's tool calls
  std::string tool_id;     // ToolCall: "call_..." on the call's first delta, else empty
  std::string tool_name;   // ToolCall: function name on the call's first delta, else empty
  std::string arguments;   // ToolCall: the next piece of the arguments JSON text (the call's deltas in order
                           // concatenate to one JSON object)
  bool tool_end = false;   // ToolCall: the call's last delta (its arguments are complete)
  bool tool_start() const { return !tool_id.empty(); }
};

class OutputParser {
 public:
  // `in_reasoning`: the prompt already opened <think> (thinking on). `tools`: the request's
  // OpenAI tools array (used to type parameter values by their JSON schema), may be null. `format`:
  // the markup (its tags; the grammar around them is Qwen3.6's). `tool_calls`: whether tool-call
  // markup is recognised at all (false when the request has no tools or tool_choice "none": text that
  // looks like a call then stays content).
  OutputParser(bool in_reasoning, const nlohmann::ordered_json& tools = nullptr,
               const ModelFormat& format = qwen3_6_format(), bool tool_calls = true);
  // Feed generated text (any split, even mid-tag or mid-UTF-8); returns deltas ready to stream.
  std::vector<OutputDelta> push(std::string_view text);
  // End of generation: flush held-back text; unterminated markup degrades to plain content.
  std::vector<OutputDelta> finish();
  int tool_calls() const { return n_tool_calls_; }
  // Whether the text so far left the model inside a reasoning block.
  bool in_reasoning() const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
  int n_tool_calls_ = 0;
};

}  // namespace lilac
