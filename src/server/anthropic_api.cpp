#include "server/anthropic_api.h"

#include <httplib.h>

#include <regex>

#include "core/error.h"
#include "core/log.h"
#include "server/anthropic_format.h"
#include "server/anthropic_schema.h"
#include "server/endpoint.h"
#include "server/http_server.h"
#include "server/parse_budget.h"
#include "server/request_json.h"
#include "server/server_context.h"

namespace lilac::server {

void send_anthropic_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(dump_json(anthropic_error_body(e)), "application/json");
  if (e.retry_after_s > 0) res.set_header("Retry-After", std::to_string(e.retry_after_s));
}

RouteOptions anthropic_route_options() {
  RouteOptions ro;
  ro.errors = [](int status, const std::string& message, const std::string& code) {
    return dump_json(anthropic_error_body(ApiError(status, message, "", code)));
  };
  ro.busy_status = kAnthropicOverloaded;
  return ro;
}

namespace {

// The anthropic-version header: absent is accepted (curl), and so is any version date from 2023-01-01 on
// (the answer has the 2023-06-01 shape, which later versions extend); anything else is a 400.
void check_version(const httplib::Request& req) {
  if (!req.has_header("anthropic-version")) return;
  const std::string v = req.get_header_value("anthropic-version");
  static const std::regex date("^20[2-9][0-9]-[01][0-9]-[0-3][0-9]$");
  if (!std::regex_match(v, date) || v < "2023-01-01")
    throw ApiError(400, "anthropic-version: unsupported version '" + v + "' (a date such as 2023-06-01 is expected).",
                   "anthropic-version");
}

GenerationSpec messages_spec(MessagesParams& p) {
  GenerationSpec s;
  apply_chat_prompt(std::move(p.template_request), std::move(p.tools), p.continue_final, p.tool_choice,
                    p.tool_choice_name, s);
  s.parallel_tool_calls = p.parallel_tool_calls;
  s.sampling = p.sampling;
  s.max_tokens = p.max_tokens;
  s.stop = p.stop;
  if (p.thinking) s.reasoning_budget = p.budget_tokens;
  s.prompt_param = "messages";
  s.max_tokens_param = "max_tokens";
  s.tool_schema_field = "input_schema";
  return s;
}

}  // namespace

Endpoint messages_endpoint(ServerContext& C) {
  Endpoint ep;
  ep.path = "/v1/messages";
  ep.send_error = send_anthropic_error;
  ep.busy_status = kAnthropicOverloaded;
  ep.rewrite_hook_errors = true;
  ep.prepare = [&C](const ojson& body, const ModelConfig& cfg, uint64_t seed) {
    MessagesParams p = parse_messages_request(body, cfg, seed);
    PreparedRequest r;
    r.model = p.model;
    r.stream = p.stream;
    r.spec = messages_spec(p);
    MessagesMeta meta;
    meta.id = C.new_id("msg_");
    meta.model = p.model.empty() ? C.opts.model_id : p.model;
    r.formatter = [meta](const Generation& gen, bool route_field) mutable {
      meta.input_tokens = gen.prompt_tokens();
      meta.route_field = route_field;
      return make_messages_formatter(meta);
    };
    return r;
  };
  return ep;
}

namespace {

void count_tokens(ServerContext& C, const httplib::Request& req, httplib::Response& res) {
  const std::string path = "/v1/messages/count_tokens";
  try {
    check_version(req);
    const ParseBudget::Lease lease = C.parse.acquire(req.body.size(), kAnthropicOverloaded);
    const ojson body = parse_request_body(req.body);
    require_ready(C);
    MessagesParams p = parse_messages_request(body, C.core->config(), 0, /*for_count=*/true);
    require_served_model(C, p.model);
    const int64_t n = C.core->count_prompt_tokens(messages_spec(p));
    res.set_content(dump_json(nlohmann::json{{"input_tokens", n}}), "application/json");
    C.metrics.count_request(path, 200);
  } catch (const ApiError& e) {
    send_anthropic_error(res, e);
    C.metrics.count_request(path, e.status);
    LILAC_LOG_WARN("POST %s -> %d: %s", path.c_str(), e.status, e.message.c_str());
  } catch (const std::exception& e) {
    send_anthropic_error(res, ApiError(500, std::string("Internal server error: ") + e.what()));
    C.metrics.count_request(path, 500);
  }
}

}  // namespace

void add_anthropic_routes(HttpServer& http, ServerContext& ctx) {
  ServerContext* C = &ctx;
  const RouteOptions ro = anthropic_route_options();
  auto ep = std::make_shared<Endpoint>(messages_endpoint(ctx));
  http.Post(ep->path, [C, ep](httplib::Request& req, httplib::Response& res) {
    try {
      check_version(req);
    } catch (const ApiError& e) {
      send_anthropic_error(res, e);
      C->metrics.count_request(ep->path, e.status);
      return;
    }
    serve_generation(*C, *ep, req, res);
  }, ro);
  http.Post("/v1/messages/count_tokens",
            [C](const httplib::Request& req, httplib::Response& res) { count_tokens(*C, req, res); }, ro);
}

}  // namespace lilac::server
