#include "server/endpoint.h"

#include <httplib.h>

#include <chrono>
#include <string>
#include <utility>

#include "core/error.h"
#include "core/log.h"
#include "server/parse_budget.h"
#include "server/request_json.h"
#include "server/server_context.h"

namespace lilac::server {

using Clock = std::chrono::steady_clock;
using ojson = nlohmann::ordered_json;

bool read_openai_error(const std::string& body, int status, ApiError& out) {
  const auto j = nlohmann::json::parse(body, nullptr, false);
  if (!j.is_object() || !j.contains("error") || !j["error"].is_object() || j.contains("type")) return false;
  const auto& e = j["error"];
  auto str = [&](const char* k) { return e.contains(k) && e[k].is_string() ? e[k].get<std::string>() : std::string(); };
  out = ApiError(status, str("message"), str("param"), str("code"));
  return true;
}

void require_ready(const ServerContext& C) {
  if (!C.ready.load()) throw ApiError(503, "The model is still loading; retry shortly.", "", "model_not_loaded");
}

void require_served_model(const ServerContext& C, const std::string& model) {
  if (!model.empty() && model != C.opts.model_id)
    throw ApiError(404, "The model '" + model + "' does not exist (this server serves '" + C.opts.model_id + "').",
                   "model", "model_not_found");
}

namespace {

// The route hook answered: rewrite an OpenAI-shaped error into the endpoint's protocol.
void rewrite_hook_error(const Endpoint& ep, httplib::Response& res) {
  if (!ep.rewrite_hook_errors || res.status < 400 || res.body.empty()) return;
  ApiError e(res.status, "");
  if (!read_openai_error(res.body, res.status, e)) return;
  ep.send_error(res, e);
}

}  // namespace

void serve_generation(ServerContext& C, const Endpoint& ep, httplib::Request& req, httplib::Response& res) {
  const auto t0 = Clock::now();
  auto fail = [&](const ApiError& e) {
    ep.send_error(res, e);
    C.metrics.count_request(ep.path, e.status);
    if (e.status >= 500)
      LILAC_LOG_ERROR("POST %s -> %d: %s", ep.path.c_str(), e.status, e.message.c_str());
    else
      LILAC_LOG_WARN("POST %s -> %d: %s", ep.path.c_str(), e.status, e.message.c_str());
  };
  try {
    PreparedRequest r;
    std::vector<std::shared_ptr<Generation>> gens;
    {
      // The body's share of the bodies parsed at once, held while its JSON values and the specs made from them live:
      // they go before the answer is sent (a generation may run for minutes).
      ParseBudget::Lease lease = C.parse.acquire(req.body.size(), ep.busy_status);
      // The body's text is freed once parsed (the worker's request held it until the answer was sent: a streamed
      // generation kept its up-to-8 MB body for as long as it ran); everything after reads `body`.
      const ojson body = parse_request_body(std::exchange(req.body, std::string()));
      bool any_model = false;  // the router keeps a request that named an upstream model local
      if (C.hook.maybe_forward && !(ep.keep_local && ep.keep_local(body))) {
        const bool busy = C.ready.load() && C.core->busy();
        const RouteDecisionKind d = C.hook.maybe_forward(req, res, body, busy);
        if (d == RouteDecisionKind::Answered) {
          rewrite_hook_error(ep, res);
          C.metrics.count_request(ep.path, res.status);
          return;
        }
        any_model = d == RouteDecisionKind::LocalAnyModel;
      }
      require_ready(C);
      r = ep.prepare(body, C.core->config(), C.random_u64());
      if (!any_model) require_served_model(C, r.model);
      std::vector<GenerationSpec> specs;  // every prompt's, in order
      specs.reserve(1 + r.more_specs.size());
      specs.push_back(std::move(r.spec));
      for (GenerationSpec& s : r.more_specs) specs.push_back(std::move(s));
      r.more_specs.clear();
      gens = C.core->start_choices(specs, r.n);
      if (C.hook_set) {
        res.set_header("x-lilac-route", "local");
        if (C.hook.on_local) {
          try {
            C.hook.on_local(body);
          } catch (const std::exception& e) {
            LILAC_LOG_WARN("route hook on_local failed: %s", e.what());
          }
        }
      }
    }
    const RequestLog log{ep.path, t0, C.opts.log_requests, &C.metrics};
    if (gens.size() == 1 && r.background) {
      auto fmt = r.formatter(*gens.front(), C.hook_set);
      r.background(std::move(gens.front()), std::move(fmt), res);
      C.metrics.count_request(ep.path, res.status);
      return;
    }
    if (gens.size() == 1) {
      auto fmt = r.formatter(*gens.front(), C.hook_set);
      return send_generation(res, std::move(gens.front()), std::move(fmt), r.stream, log, fail);
    }
    std::vector<std::shared_ptr<ResponseFormatter>> fmts;
    for (size_t i = 0; i < gens.size(); ++i) fmts.push_back(r.choice_formatter(*gens[i], C.hook_set, int(i)));
    send_generations(res, std::move(gens), std::move(fmts), std::move(r.join), r.stream, log, fail);
  } catch (const ApiError& e) {
    return fail(e);
  } catch (const InputError& e) {
    return fail(ApiError(400, e.what(), "", "invalid_request"));
  } catch (const std::exception& e) {
    return fail(ApiError(500, std::string("Internal server error: ") + e.what(), "", "internal_error"));
  } catch (...) {
    return fail(ApiError(500, "Internal server error", "", "internal_error"));
  }
}

}  // namespace lilac::server
