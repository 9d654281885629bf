// What the server's small JSON routes share (the Conversations, the Message Batches, a stored response's stream):
// an integer query parameter read with its bounds, and one answer path — the body a handler returns, or the
// ApiError it throws in the route's protocol shape, counted under the route.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "server/api_error.h"

namespace httplib {
struct Request;
struct Response;
}  // namespace httplib

namespace lilac::server {

struct Metrics;

// The query parameter `name` as an integer in [lo, hi]; nullopt when absent, ApiError 400 naming it when it is not
// one (code invalid_value).
std::optional<int64_t> query_int(const httplib::Request& req, const char* name, int64_t lo, int64_t hi);

// Answers `res` with the text `answer` returns (JSON unless `content_type` says otherwise), or with the ApiError it
// throws sent by `send_error` (the route's error shape); any other exception is a 500 the same way. Counts the
// request under `route`.
using ErrorSender = std::function<void(httplib::Response& res, const ApiError& e)>;
void answer_json(Metrics& metrics, const char* route, httplib::Response& res, const ErrorSender& send_error,
                 const std::function<std::string()>& answer, const char* content_type = "application/json");

}  // namespace lilac::server
