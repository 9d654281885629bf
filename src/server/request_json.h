// Request bodies as JSON, parsed once with bounds (text/bounded_json.h: nesting depth, number of
// values, time linear in the size) before any adapter, router or template sees them.
#pragma once
#include <string_view>

#include <nlohmann/json.hpp>

#include "text/bounded_json.h"

namespace lilac::server {

// The body as a JSON object (ordered: key order is kept). Throws ApiError 400: "invalid_json" (not
// JSON, or not an object), "json_too_deep" (nested more than 64 levels), "json_too_large" (more than
// 1,048,576 values).
nlohmann::ordered_json parse_request_body(std::string_view body);

// The same, the elements of the array under the body's key `key` handed to `take` one at a time as they are read, and
// left in the result as nulls (text/bounded_json.h: parse_bounded_json_handing): a body of many large elements (a
// Message Batches create) is never held as JSON values all at once. Elements read before an error of the body was found
// have been handed all the same: use them only once this returned.
nlohmann::ordered_json parse_request_body_handing(std::string_view body, std::string_view key,
                                                  const JsonElementTaker& take);

// A tool call's "arguments" sent as a string (a chat assistant message's tool_calls, a Responses function_call item):
// a JSON object within the request body's bounds, as the body itself would be. The string is not bounded by the
// body's depth limit, and the value goes on into the conversation (copied, rendered: recursion), so 100,000 nested
// arrays in it crashed the server. Throws ApiError 400 naming `param`: "invalid_value" when it is not a JSON object,
// "json_too_deep" / "json_too_large" past the bounds.
nlohmann::ordered_json parse_tool_arguments(std::string_view text, const std::string& param);

}  // namespace lilac::server
