// OpenAI Responses requests (POST /v1/responses): validation and the translation into what
// the generation core renders (an OpenAI chat message list for the chat template). Unknown fields are
// ignored; wrong types, out-of-range values and what lilac cannot do are ApiErrors (400) naming the
// field: item references, images and files, non-function tools.
// `previous_response_id` continues a stored response (server/response_store.h): its conversation's items
// come before this request's input; its instructions do not carry over (as OpenAI's). text.format json_object / json_schema and tools with strict: true
// are enforced by constrained decoding (as response_format and strict tools on chat completions).
//
// Translation: `instructions` and leading system / developer messages -> one system message; user and
// assistant messages (content a string or input_text / output_text parts) -> messages; function_call
// items -> tool_calls of an assistant message (consecutive calls share one; a preceding reasoning
// item becomes its reasoning_content); function_call_output -> tool messages; reasoning items ->
// reasoning_content of the assistant message that follows. reasoning.effort "none" / "minimal" turns
// the model's reasoning off, any other effort (or none given) leaves it on.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/backend.h"
#include "model/config.h"
#include "server/openai_schema.h"
#include "server/conversation_store.h"
#include "server/response_store.h"

namespace lilac::server {

struct ResponsesParams {
  std::string model;
  bool stream = false;
  std::optional<int64_t> max_output_tokens;
  SamplingParams sampling;
  ojson template_request;  // messages, tools (unless tool_choice none), chat_template_kwargs
  ojson tools;             // OpenAI chat-form tools (null when none or tool_choice none)
  ToolChoice tool_choice = ToolChoice::Auto;
  std::string tool_choice_name;
  bool reasoning = true;
  bool parallel_tool_calls = true;  // false: at most one call (enforced where calls are constrained, as on chat); echoed
  bool continue_final = false;  // the input ends with an assistant message: its text is continued (a prefill)
  // Echoed in the response object.
  ojson echo_tools = ojson::array();  // the request's tools as given
  ojson echo_tool_choice = "auto";
  ojson instructions;                 // string or null
  std::string effort;                 // "" when not given
  ojson echo_text_format = ojson{{"type", "text"}};
  ojson metadata = ojson::object();   // at most 16 string pairs (fields::checked_metadata)
  // text.format: free text, any JSON object, or a JSON Schema (the schema in json_schema)
  ResponseFormat response_format = ResponseFormat::Text;
  ojson json_schema;
  // Stored responses (server/response_store.h): keep this one (`store`, default true as OpenAI's), the
  // one it continues ("" when none), and the conversation's input items so far (the previous response's
  // items, then this request's input) that its entry will hold with its output.
  bool store = true;
  // `conversation` (server/conversation_store.h): its items come before this request's input, and once the response
  // completes this request's input items (request_items) and its output are added to it. "" when none.
  std::string conversation_id;
  ojson request_items = ojson::array();
  // Run in the background (server/background_responses.h): answered at once (in status "queued", or the stream of
  // its events), then polled with GET /v1/responses/{id}; needs `store`.
  bool background = false;
  std::string previous_response_id;
  ojson input_items = ojson::array();
};

// `store`: where previous_response_id is looked up, `conversations`: where `conversation` is (nullptr: none is found).
ResponsesParams parse_responses_request(const ojson& body, const ModelConfig& cfg, uint64_t seed,
                                        const ResponseStore* store = nullptr, ConversationStore* conversations = nullptr);

// Conversation items (POST /v1/conversations, its items, a completed response's input added to its conversation):
// checked as a Responses input's items (ApiError naming param[i]), returned as stored — each with a "type" and an
// "id" (new_id(prefix) when it has none; a client's id must be 1-128 of [A-Za-z0-9_-], as the item routes address
// them, and unique within `items`), a message's string content as one text part (output_text for the assistant's,
// else input_text).
// The prefix of a new id for a conversation item of `type` ("msg_", "fc_", "rs_", else "fco_").
const char* item_id_prefix(std::string_view type);

ojson conversation_items(const ojson& items, const std::string& param,
                         const std::function<std::string(const char*)>& new_id);

}  // namespace lilac::server
