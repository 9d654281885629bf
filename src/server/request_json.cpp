#include "server/request_json.h"

#include "server/api_error.h"
#include "text/bounded_json.h"

namespace lilac::server {

namespace {

// A body's parse as the body (its errors as the 400 of each).
nlohmann::ordered_json checked_body(JsonParseResult r) {
  switch (r.status) {
    case JsonParseResult::Ok: break;
    case JsonParseResult::Invalid:
      throw ApiError(400, "We could not parse the JSON body of your request: " + r.message, "", "invalid_json");
    case JsonParseResult::TooDeep:
      throw ApiError(400, "The JSON body is nested too deeply (" + r.message + ").", "", "json_too_deep");
    case JsonParseResult::TooManyValues:
      throw ApiError(400, "The JSON body has too many values (" + r.message + ").", "", "json_too_large");
  }
  if (!r.value.is_object()) throw ApiError(400, "The request body must be a JSON object.", "", "invalid_json");
  return std::move(r.value);
}

}  // namespace

nlohmann::ordered_json parse_request_body(std::string_view body) {
  return checked_body(parse_bounded_json(body, kRequestJsonLimits));
}

nlohmann::ordered_json parse_request_body_handing(std::string_view body, std::string_view key,
                                                  const JsonElementTaker& take) {
  return checked_body(parse_bounded_json_handing(body, kRequestJsonLimits, key, take));
}

nlohmann::ordered_json parse_tool_arguments(std::string_view text, const std::string& param) {
  JsonParseResult r = parse_bounded_json(text, kRequestJsonLimits);
  if (r.status == JsonParseResult::TooDeep)
    throw ApiError(400, "Invalid '" + param + "': nested too deeply (" + r.message + ").", param, "json_too_deep");
  if (r.status == JsonParseResult::TooManyValues)
    throw ApiError(400, "Invalid '" + param + "': too many values (" + r.message + ").", param, "json_too_large");
  if (!r.ok() || !r.value.is_object())
    throw ApiError(400, "Invalid '" + param + "': not a JSON object.", param, "invalid_value");
  return std::move(r.value);
}

}  // namespace lilac::server
