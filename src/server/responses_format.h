// The OpenAI Responses adapter's output side: a generation's OutputEvents as one Response object or
// as the Responses stream of typed events, each with a sequence_number: response.created,
// response.in_progress; per output item response.output_item.added, then for a reasoning item
// response.content_part.added, response.reasoning_text.delta / .done, response.content_part.done; for
// a message response.content_part.added, response.output_text.delta / .done,
// response.content_part.done; for a function call response.function_call_arguments.delta / .done;
// then response.output_item.done; finally response.completed (or response.incomplete when
// max_output_tokens ended it). An error mid-stream is an `error` event, then response.failed (the response so
// far, status "failed", with its `error`): a failed stream ends with a terminal event as a finished one does. A
// cancelled background stream ends with response.cancelled (responses_cancelled_event); a cancelled foreground one
// has no reader left and no terminal event. When on_done (its store) throws at a completed stream's end, the events
// made before it (the last deltas, the open item's .done events) are sent first by the failure's events (stream_event's
// for an Error event, responses_failed_event): response.failed's output is what the client got. Any other call that
// throws spends no sequence number: the events a client gets are numbered 0, 1, 2, ... without a gap.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "server/http_response.h"

namespace lilac::server {

struct ResponsesMeta {
  std::string id;  // "resp_..."
  std::string model;
  int64_t created_at = 0;
  int64_t input_tokens = 0;
  bool route_field = false;
  // Request fields the response object echoes.
  nlohmann::json instructions, max_output_tokens, tools = nlohmann::json::array(), tool_choice = "auto";
  double temperature = 1, top_p = 1;
  nlohmann::json reasoning_effort;  // string or null
  nlohmann::json text_format = nlohmann::json{{"type", "text"}};
  bool parallel_tool_calls = true;
  nlohmann::json metadata = nlohmann::json::object();
  // New ids ("rs_", "msg_", "fc_" + random) for output items.
  std::function<std::string(const char* prefix)> new_id;
  bool store = false;                             // echoed
  bool background = false;                        // echoed (server/background_responses.h)
  nlohmann::json previous_response_id = nullptr;  // echoed (string or null)
  nlohmann::json conversation = nullptr;          // echoed ({"id"} or null)
  // Called with the final response object (completed or incomplete; not for a cancelled generation). Returns whether
  // it was stored where it was to be: false when the response store refused it (larger than --responses-mb). The
  // object answered (the body, the stream's response.completed / .incomplete) then says "store": false, with all its
  // output: for a foreground response the client learns that GET /v1/responses/{id} will not find it (a background
  // one's run then stores it "failed", saying why: server/background_responses.cpp, so GET answers that).
  std::function<bool(const nlohmann::json& response)> on_done;
};

std::shared_ptr<ResponseFormatter> make_responses_formatter(ResponsesMeta meta);
// The response object a formatter made by make_responses_formatter gives in `status` from the events added so
// far: "queued" / "in_progress" (usage null), "cancelled", "failed" (with `error`: {code, message}).
nlohmann::json responses_object(const ResponseFormatter& fmt, const std::string& status,
                                const nlohmann::json& error = nullptr);
// The response.failed event (the stream's next sequence number) of a formatter made by make_responses_formatter:
// the response so far, status "failed", with `error`; after the events a throw of on_done left unsent, if any.
std::string responses_failed_event(ResponseFormatter& fmt, const nlohmann::json& error);
// The response.cancelled event (the stream's next sequence number) of a formatter made by make_responses_formatter:
// the response so far, status "cancelled", as responses_object gives it (a background stream's end when it is
// cancelled: server/background_responses.h).
std::string responses_cancelled_event(ResponseFormatter& fmt);
// A failed response's `error` for a generation that failed with HTTP `status`: {code, message}.
nlohmann::json responses_failure(int status, const std::string& message);

}  // namespace lilac::server
