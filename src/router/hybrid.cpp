// The hybrid router's HTTP side (HybridRouter): applies the Router's decision to a request, forwards it
// upstream or re-addresses it to the local model, falls back, merges /v1/models; and installs itself.
#include "router/hybrid.h"

#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>

#include "core/error.h"
#include "core/log.h"
#include "server/openai_schema.h"
#include "server/server.h"
#include "text/json_dump.h"

namespace lilac::router {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;
using server::RouteHook;
using server::Server;

// ------------------------------------------------------------------------------------------- HybridRouter

HybridRouter::HybridRouter(HybridOptions opts, std::string local_model_id)
    : opts_(std::move(opts)),
      router_(std::move(opts_.policy),
              RouterConfig{local_model_id, opts_.upstream_model}) {
  UpstreamOptions uo;
  uo.url = parse_upstream_url(opts_.upstream_url);
  uo.api_key = opts_.api_key;
  uo.connect_timeout_ms = router_.policy().connect_timeout_ms;
  uo.read_timeout_ms = router_.policy().read_timeout_ms;
  upstream_ = std::make_unique<UpstreamClient>(uo);
}

void HybridRouter::answer_error(httplib::Response& res, int status, const std::string& msg, const std::string& code,
                                const std::string& param) {
  res.status = status;
  res.set_content(dump_json(server::error_body(status, msg, "", param, code)), "application/json");
}

namespace {
// The response id of a Responses stream's response.created event among complete SSE lines ("" when none is there).
std::string created_response_id(const std::string& lines) {
  for (size_t at = 0; at < lines.size();) {
    size_t end = lines.find('\n', at);
    if (end == std::string::npos) end = lines.size();
    const std::optional<std::string_view> payload = sse_data_payload(std::string_view(lines).substr(at, end - at));
    if (payload && payload->find("response.created") != std::string_view::npos) {
      const json j = json::parse(*payload, nullptr, false);
      if (j.is_object() && j.contains("type") && j["type"] == "response.created" && j.contains("response") &&
          j["response"].is_object() && j["response"].contains("id") && j["response"]["id"].is_string())
        return j["response"]["id"].get<std::string>();
    }
    at = end + 1;
  }
  return "";
}
}  // namespace

std::string upstream_body(const ojson& body, const std::vector<std::string>& drop, const std::string& model) {
  std::string out = "{";
  bool placed = false;
  auto member = [&](const std::string& key, const std::string& value) {
    if (out.size() > 1) out += ',';
    out += dump_json(ojson(key));
    out += ':';
    out += value;
  };
  for (auto it = body.begin(); it != body.end(); ++it) {
    const std::string& k = it.key();
    if (k == "lilac" || std::find(drop.begin(), drop.end(), k) != drop.end()) continue;
    if (k == "model") {
      member(k, dump_json(ojson(model)));
      placed = true;
    } else {
      member(k, dump_json(it.value()));
    }
  }
  if (!placed) member("model", dump_json(ojson(model)));
  return out + "}";
}

server::RouteDecisionKind HybridRouter::maybe_forward(const httplib::Request& req, httplib::Response& res,
                                                      const ojson& body, bool local_busy) {
  using K = server::RouteDecisionKind;
  if (!body.is_object()) return K::Local;
  const Api api = api_for_path(req.path);
  const auto t0 = std::chrono::steady_clock::now();
  RouteDecision d = router_.decide(body, api, req.get_header_value("x-lilac-route"), local_busy);
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  std::string why = d.reason;
  for (size_t i = 0; i < d.matched.size(); ++i) why += (i ? "," : ": ") + d.matched[i];
  // The reason travels with the answer (the chat page's badge): the rule, and the detector kinds or
  // rule names that fired (never the values).
  res.set_header("x-lilac-route-reason", why);
  if (d.error_status) {
    LILAC_LOG_WARN("route: refused (%s) -> %d", why.c_str(), d.error_status);
    answer_error(res, d.error_status, d.error_message, d.error_code, d.error_param);
    return K::Answered;
  }
  const bool stream = body.contains("stream") && body["stream"].is_boolean() && body["stream"].get<bool>();
  const std::string model = body.contains("model") && body["model"].is_string() ? body["model"].get<std::string>() : "";
  const bool model_local_ok = model.empty() || model == router_.config().local_model_id;
  const auto& pol = router_.policy();

  // Served by the local engine in-process (and the server calls on_local); a request that named an
  // upstream model is answered by the local model, never re-sent to lilac's own port.
  auto go_local = [&]() { return model_local_ok ? K::Local : K::LocalAnyModel; };

  if (d.route == Route::local) {
    LILAC_LOG_INFO("route: local (%s) [%.0f us]", why.c_str(), us);
    return go_local();
  }

  std::string upstream_model = d.upstream_model;
  if (upstream_model.empty()) {  // no --upstream-model: ask the upstream what it serves
    extra_models();
    upstream_model = router_.upstream_model_for(model);
  }
  std::string failure;
  if (upstream_model.empty()) {
    failure = "no upstream model is known (pass --upstream-model, or the upstream's /v1/models failed)";
  } else {
    LILAC_LOG_INFO("route: cloud (%s) model=%s [%.0f us]", why.c_str(), upstream_model.c_str(), us);
    // The upstream is called in the request's own protocol; an Anthropic upstream also gets its key as
    // x-api-key, and the client's anthropic-version.
    std::vector<std::pair<std::string, std::string>> extra;
    if (api == Api::messages) {
      if (!opts_.api_key.empty()) extra.emplace_back("x-api-key", opts_.api_key);
      const std::string v = req.get_header_value("anthropic-version");
      extra.emplace_back("anthropic-version", v.empty() ? "2023-06-01" : v);
    }
    // A Responses answer's id (the upstream's): the client GETs / cancels / deletes it through lilac later.
    std::function<void(const std::string&)> on_lines;
    if (api == Api::responses && stream)
      on_lines = [self = weak_from_this(), seen = false](const std::string& lines) mutable {
        if (seen) return;
        const std::string id = created_response_id(lines);
        if (id.empty()) return;
        seen = true;
        if (auto s = self.lock()) s->remember_upstream_response(id);
      };
    auto r = upstream_->forward(upstream_path(api), upstream_body(body, pol.drop_fields, upstream_model), stream, res, "",
                                extra, std::move(on_lines));
    if (r.answered && api == Api::responses && !stream && res.status >= 200 && res.status < 300) {
      const json j = json::parse(res.body, nullptr, false);
      if (j.is_object() && j.contains("id") && j["id"].is_string()) remember_upstream_response(j["id"].get<std::string>());
    }
    if (r.answered) {
      if (r.upstream_status >= 400) LILAC_LOG_WARN("route: cloud answered HTTP %d", r.upstream_status);
      return K::Answered;
    }
    failure = r.failure;
  }
  if (pol.upstream_failure_to_local) {
    LILAC_LOG_WARN("route: upstream failed (%s); serving locally (fallback)", failure.c_str());
    // What the upstream attempt set goes (set_header adds a header: the answer carried two reasons, and an
    // upstream 2xx that was not JSON left "x-lilac-route: cloud" beside the local server's "local").
    res.headers.erase("x-lilac-route");
    res.headers.erase("x-lilac-route-reason");
    res.set_header("x-lilac-route-reason", "fallback: " + why);
    return go_local();
  }
  LILAC_LOG_WARN("route: upstream failed (%s); fallback to local is off -> 502", failure.c_str());
  answer_error(res, 502,
               "The upstream " + upstream_->options().url.origin() + " failed: " + failure +
                   ". The route policy does not allow serving this request locally (fallback.upstream_failure_to_local).",
               "upstream_unavailable");
  res.set_header("x-lilac-route", "cloud");
  return K::Answered;
}

void HybridRouter::on_local(const ojson& body) { router_.remember_local(body); }

void HybridRouter::remember_upstream_response(const std::string& id) {
  std::lock_guard lk(ids_mu_);
  if (!upstream_id_set_.insert(id).second) return;
  upstream_ids_.push_back(id);
  if (upstream_ids_.size() > kUpstreamIdsKept) {
    upstream_id_set_.erase(upstream_ids_.front());
    upstream_ids_.pop_front();
  }
}

bool HybridRouter::response_route(const httplib::Request& req, httplib::Response& res, const std::string& id) {
  {
    std::lock_guard lk(ids_mu_);
    if (!upstream_id_set_.count(id)) return false;
  }
  if (req.get_param_value("stream") == "true") {  // an SSE answer is not read whole (it may run for minutes)
    answer_error(res, 400,
                 "Response '" + id + "' is held by the upstream: lilac does not stream its events again (GET it "
                 "without 'stream').", "invalid_request", "stream");
    res.set_header("x-lilac-route", "cloud");
    return true;
  }
  // The route's tail after the id ("", "/input_items", "/cancel"), and its query as the client sent it.
  const std::string marker = "/responses/" + id;
  const size_t at = req.path.find(marker);
  std::string path = "/responses/" + id + (at == std::string::npos ? "" : req.path.substr(at + marker.size()));
  std::string query;
  for (const auto& [k, v] : req.params)
    query += (query.empty() ? "?" : "&") + httplib::detail::encode_query_param(k) + "=" +
             httplib::detail::encode_query_param(v);
  const ForwardResult r = upstream_->request(req.method, path + query, res);
  if (r.answered) {
    if (r.upstream_status >= 400) LILAC_LOG_WARN("route: cloud answered HTTP %d for response %s", r.upstream_status, id.c_str());
    return true;
  }
  answer_error(res, 502,
               "Response '" + id + "' is held by the upstream " + upstream_->options().url.origin() +
                   ", which failed: " + r.failure + ".",
               "upstream_unavailable");
  res.set_header("x-lilac-route", "cloud");
  return true;
}

json HybridRouter::extra_models() {
  const auto& pol = router_.policy();
  {
    std::lock_guard lk(models_mu_);
    auto now = std::chrono::steady_clock::now();
    if (!models_fetched_ || now - models_at_ > std::chrono::seconds(pol.models_cache_s)) {
      auto ids = upstream_->list_models(pol.models_timeout_ms);
      if (ids) router_.set_upstream_model_ids(*ids);
      models_fetched_ = true;
      models_at_ = now;
    }
  }
  std::vector<std::string> ids = router_.upstream_model_ids();
  if (ids.empty() && !router_.config().upstream_model.empty()) ids.push_back(router_.config().upstream_model);
  json out = json::array();
  const int64_t now = static_cast<int64_t>(std::time(nullptr));
  for (const auto& id : ids)
    out.push_back(json{{"id", pol.model_prefix + id}, {"object", "model"}, {"created", now}, {"owned_by", "upstream"}});
  return out;
}

RouteHook HybridRouter::make_hook() {
  std::weak_ptr<HybridRouter> self = weak_from_this();
  RouteHook h;
  h.maybe_forward = [self](const httplib::Request& req, httplib::Response& res, const ojson& body, bool busy) {
    auto s = self.lock();
    return s ? s->maybe_forward(req, res, body, busy) : server::RouteDecisionKind::Local;
  };
  h.on_shutdown = [self]() {
    if (auto s = self.lock()) s->upstream().cancel_all();
  };
  h.on_local = [self](const ojson& body) {
    if (auto s = self.lock()) s->on_local(body);
  };
  h.response_route = [self](const httplib::Request& req, httplib::Response& res, const std::string& id) {
    auto s = self.lock();
    return s && s->response_route(req, res, id);
  };
  h.extra_models = [self]() {
    auto s = self.lock();
    return s ? s->extra_models() : json::array();
  };
  return h;
}

std::shared_ptr<HybridRouter> install_hybrid_router(Server& srv, const HybridSettings& s) {
  if (s.upstream_url.empty()) return nullptr;
  HybridOptions ho;
  ho.upstream_url = s.upstream_url;
  ho.upstream_model = s.upstream_model;
  if (!s.policy_file.empty()) ho.policy = load_route_policy_file(s.policy_file);
  if (!s.key_env.empty()) {
    if (const char* k = std::getenv(s.key_env.c_str())) ho.api_key = k;
  }
  const bool has_key = !ho.api_key.empty();
  auto r = std::make_shared<HybridRouter>(std::move(ho), srv.options().model_id);
  srv.set_route_hook(r->make_hook());
  const auto& p = r->router().policy();
  const std::string key_note = has_key ? "from $" + s.key_env : "none ($" + s.key_env + " is unset)";
  LILAC_LOG_INFO("hybrid: upstream %s%s, default route %s, policy %s, API key %s",
                 r->upstream().options().url.origin().c_str(), r->upstream().options().url.base.c_str(),
                 route_name(p.default_route), s.policy_file.empty() ? "(built-in defaults)" : s.policy_file.c_str(),
                 key_note.c_str());
  return r;
}

}  // namespace lilac::router
