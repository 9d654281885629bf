#include "server/json_route.h"

#include <httplib.h>

#include <cstdlib>

#include "server/metrics.h"

namespace lilac::server {

std::optional<int64_t> query_int(const httplib::Request& req, const char* name, int64_t lo, int64_t hi) {
  if (!req.has_param(name)) return std::nullopt;
  const std::string v = req.get_param_value(name);
  char* end = nullptr;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != 0 || x < lo || x > hi)
    throw ApiError(400, "Invalid value for '" + std::string(name) + "': an integer in [" + std::to_string(lo) + ", " +
                            std::to_string(hi) + "] (got '" + v.substr(0, 32) + "').",
                   name, "invalid_value");
  return int64_t(x);
}

void answer_json(Metrics& metrics, const char* route, httplib::Response& res, const ErrorSender& send_error,
                 const std::function<std::string()>& answer, const char* content_type) {
  int status = 200;
  try {
    res.set_content(answer(), content_type);
  } catch (const ApiError& e) {
    status = e.status;
    send_error(res, e);
  } catch (const std::exception& e) {
    status = 500;
    send_error(res, ApiError(500, std::string("Internal server error: ") + e.what(), "", "internal_error"));
  }
  metrics.count_request(route, status);
}

}  // namespace lilac::server
