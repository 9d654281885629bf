// Request bodies as JSON, parsed once with bounds (text/bounded_json.h: nesting depth, number of
// values, time linear in the size) before any adapter, router or template sees them.
#pragma once
#include <string_view>

#include <nlohmann/json.hpp>

namespace lilac::server {

// The body as a JSON object (ordered: key order is kept). Throws ApiError 400: "invalid_json" (not
// JSON, or not an object), "json_too_deep" (nested more than 64 levels), "json_too_large" (more than
// 1,048,576 values).
nlohmann::ordered_json parse_request_body(std::string_view body);

}  // namespace lilac::server
