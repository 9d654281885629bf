// Anthropic Messages requests (POST /v1/messages and /v1/messages/count_tokens): validation and the
// translation into what the generation core renders (an OpenAI-style message list for the chat
// template), and Anthropic's error body. Unknown fields are ignored; wrong types, out-of-range values
// and what lilac cannot do (images, documents, server tools) are ApiErrors (400) naming the field.
// A final assistant message is a prefill: its text is continued (not with thinking enabled, a forced
// tool use, or a final tool_use; text ending in whitespace is refused, as Anthropic does).
//
// Translation: `system` (a string or text blocks) -> a system message; user text blocks -> a user
// message; tool_result blocks -> tool messages (in block order; is_error prefixes the content with
// "Error: "); assistant text -> content, thinking -> reasoning_content (redacted_thinking is dropped),
// tool_use -> tool_calls (input as the arguments object); tools (name, description, input_schema) ->
// function tools; thinking enabled -> the template's reasoning on (budget_tokens -> the generation
// core's reasoning budget), disabled or absent -> off.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/backend.h"
#include "model/config.h"
#include "server/api_error.h"
#include "server/openai_schema.h"

namespace lilac::server {

struct MessagesParams {
  std::string model;  // "" when absent
  bool stream = false;
  std::optional<int64_t> max_tokens;  // required by /v1/messages, not by count_tokens
  std::vector<std::string> stop;
  SamplingParams sampling;
  ojson template_request;  // messages, tools (unless tool_choice none), chat_template_kwargs
  ojson tools;             // OpenAI-form tools (null when none or tool_choice none)
  ToolChoice tool_choice = ToolChoice::Auto;
  std::string tool_choice_name;
  bool parallel_tool_calls = true;  // tool_choice.disable_parallel_tool_use: at most one call (enforced)
  bool thinking = false;
  std::optional<int64_t> budget_tokens;
  bool continue_final = false;  // the last message is the assistant's: its text is continued (a prefill)
};

// `for_count`: count_tokens (max_tokens, stream and sampling are not required nor read).
MessagesParams parse_messages_request(const ojson& body, const ModelConfig& cfg, uint64_t seed, bool for_count = false);

// Anthropic's error type for an HTTP status (invalid_request_error, authentication_error, ...).
std::string anthropic_error_type(int status);
// {"type": "error", "error": {"type", "message"}}.
nlohmann::json anthropic_error_body(const ApiError& e);

// Tool-call ids: the parser's "call_..." ids as Anthropic's "toolu_..." ones.
std::string anthropic_tool_id(const std::string& call_id);

}  // namespace lilac::server
