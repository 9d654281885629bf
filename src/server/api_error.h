// An error answered to a client, in any protocol: HTTP status, message, and the request field (param)
// and machine-readable code it concerns. Each protocol adapter formats it in its own error shape
// (OpenAI's: server/openai_schema.h, error_body).
#pragma once
#include <stdexcept>
#include <string>

namespace lilac::server {

struct ApiError : std::runtime_error {
  ApiError(int status, std::string message, std::string param = "", std::string code = "",
           std::string type = "");
  int status;
  std::string message, type, param, code;  // type: error_type_for(status) unless given
  int retry_after_s = 0;                    // > 0: answered with a Retry-After header of that many seconds
};

// The default error `type` for a status ("invalid_request_error", "authentication_error", ...).
std::string error_type_for(int status);

// An id the client sent (in the path or the body), as an error message quotes it: its first 128 bytes. The id is the
// client's own string, of any length, and the message is echoed into the log.
inline std::string quoted_id(const std::string& id) { return id.substr(0, 128); }

}  // namespace lilac::server
