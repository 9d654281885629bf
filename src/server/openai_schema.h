// OpenAI request validation (chat/completions, completions) and the error body.
// Unknown fields are ignored (like OpenAI); wrong types and out-of-range values are ApiErrors (400)
// naming the parameter.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/backend.h"
#include "model/config.h"
#include "server/api_error.h"

namespace lilac::server {

using ojson = nlohmann::ordered_json;

// OpenAI's error body {"error": {"message", "type", "param", "code"}}; param / code are null when empty.
nlohmann::json error_body(int status, const std::string& message, const std::string& type = "",
                          const std::string& param = "", const std::string& code = "");
nlohmann::json error_body(const ApiError& e);

enum class ToolChoice { Auto, None, Required, Function };
// Whether the choice forces a call (`required`, or a named function): the prompt then ends with a call's opening.
inline bool forces_call(ToolChoice c) { return c == ToolChoice::Required || c == ToolChoice::Function; }

// response_format: free text, any JSON object, or a JSON Schema (enforced by constrained decoding).
enum class ResponseFormat { Text, JsonObject, JsonSchema };

// `n`: choices per request at most (each is one generation, batched with the others).
constexpr int kMaxChoices = 16;
// logit_bias: tokens per request at most.
constexpr int kMaxLogitBias = 1024;

struct CommonParams {
  std::string model;  // as given ("" when absent)
  int n = 1;          // choices (generations of the same prompt; choice i samples with seed + i)
  ResponseFormat response_format = ResponseFormat::Text;
  ojson json_schema;  // ResponseFormat::JsonSchema: response_format.json_schema.schema ({} when absent)
  bool stream = false;
  bool include_usage = false;
  std::optional<int64_t> max_tokens;
  std::vector<std::string> stop;
  SamplingParams sampling;
  bool logprobs = false;
  int top_logprobs = 0;
};

struct ChatParams : CommonParams {
  // What render_chat_request gets: messages, tools (absent for tool_choice none), chat_template_kwargs.
  ojson template_request;
  ojson tools;  // the validated tools array (null when none)
  ToolChoice tool_choice = ToolChoice::Auto;
  std::string tool_choice_name;  // ToolChoice::Function
  bool parallel_tool_calls = true;
  // The conversation ends with an assistant message: its content is continued (a prefill).
  bool continue_final = false;
};

// One prompt of a completions request: text, or token ids.
struct CompletionPrompt {
  std::string text;
  std::optional<std::vector<int32_t>> ids;
};

// Completions: prompts per request at most (`prompt` as an array of strings or of id arrays), and generations
// (prompts × n) per request at most (each is one generation; they are admitted together, all or none).
constexpr int kMaxPrompts = 64;
constexpr int kMaxGenerations = 64;

struct CompletionParams : CommonParams {
  std::vector<CompletionPrompt> prompts;  // one or more; choice index = prompt · n + i
  // Echo the prompt before each completion (text, and with logprobs its tokens' entries: the first one's null).
  bool echo = false;
};

// Sampling defaults: the model's generation_config.json values, else OpenAI's (temperature 1, top_p 1).
// `seed` is used when the request gives none.
ChatParams parse_chat_request(const ojson& body, const ModelConfig& cfg, uint64_t seed);
CompletionParams parse_completion_request(const ojson& body, const ModelConfig& cfg, uint64_t seed);

struct GenerationSpec;
// A request's ResponseFormat (and its schema) as the generation spec's constraint on the content: one
// mapping for every adapter that has one (chat / completions' response_format, Responses' text.format).
void apply_response_format(ResponseFormat f, const ojson& json_schema, GenerationSpec& spec);
// A chat prompt's part of the generation spec, one mapping for every protocol's adapter: the conversation as the
// chat template renders it, the tools, a final assistant message to continue (a prefill), a forced call (of
// `function` when the choice names one).
void apply_chat_prompt(ojson template_request, ojson tools, bool continue_final, ToolChoice choice,
                       const std::string& function, GenerationSpec& spec);

}  // namespace lilac::server
