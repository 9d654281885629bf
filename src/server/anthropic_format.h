// The Anthropic Messages adapter's output side: a generation's OutputEvents as one Message body or
// as the Messages stream (event: message_start, ping, then per content block content_block_start,
// content_block_delta (text_delta / thinking_delta / input_json_delta), content_block_stop, then
// message_delta with stop_reason, stop_sequence and usage, and message_stop; an error mid-stream is
// an `error` event). Content blocks: thinking (reasoning; "signature" is empty: lilac does not sign),
// text, tool_use (id "toolu_...", input the parsed arguments; streamed as one input_json_delta).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "server/http_response.h"

namespace lilac::server {

struct MessagesMeta {
  std::string id;  // "msg_..."
  std::string model;
  int64_t input_tokens = 0;  // the prompt's length (message_start's usage)
  bool route_field = false;  // add "lilac_route": "local" to the body and to every event
};

std::shared_ptr<ResponseFormatter> make_messages_formatter(MessagesMeta meta);

// SSE framing with an event name ("event: NAME\ndata: JSON\n\n").
std::string sse_event(const std::string& name, const nlohmann::json& data);

}  // namespace lilac::server
