#include "server/api_error.h"

namespace lilac::server {

std::string error_type_for(int status) {
  switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 429: return "rate_limit_error";
    case 503: return "service_unavailable_error";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

ApiError::ApiError(int status_, std::string message_, std::string param_, std::string code_, std::string type_)
    : std::runtime_error(message_), status(status_), message(std::move(message_)),
      type(type_.empty() ? error_type_for(status_) : std::move(type_)), param(std::move(param_)),
      code(std::move(code_)) {}

}  // namespace lilac::server
