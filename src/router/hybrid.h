// The hybrid router's HTTP side (`lilac serve --upstream URL`): a server::RouteHook that applies the
// Router's decisions (router/router.h) to POST /v1/chat/completions and /v1/completions, forwards cloud
// requests through the UpstreamClient, falls back to local, and lists upstream models in /v1/models.
#pragma once
#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include <nlohmann/json.hpp>

#include "router/route_policy.h"
#include "router/router.h"
#include "router/upstream.h"
#include "server/server.h"

namespace httplib {
struct Request;
struct Response;
}  // namespace httplib

namespace lilac::router {

struct HybridOptions {
  std::string upstream_url;
  std::string upstream_model;
  std::string api_key;  // read from --upstream-key-env by the caller; never logged
  RoutePolicy policy;
};

class HybridRouter : public std::enable_shared_from_this<HybridRouter> {
 public:
  HybridRouter(HybridOptions opts, std::string local_model_id);

  // The hook to install with Server::set_route_hook.
  server::RouteHook make_hook();

  // The pieces of the hook (public for tests).
  server::RouteDecisionKind maybe_forward(const httplib::Request& req, httplib::Response& res,
                                          const nlohmann::ordered_json& body, bool local_busy);
  void on_local(const nlohmann::ordered_json& body);
  nlohmann::json extra_models();
  // A stored response's route (GET, input_items, cancel, DELETE) for an id lilac does not hold: forwarded upstream
  // when the id is one of a Responses answer the router passed on from there (the last kUpstreamIdsKept); else false.
  bool response_route(const httplib::Request& req, httplib::Response& res, const std::string& id);
  static constexpr size_t kUpstreamIdsKept = 4096;

  Router& router() { return router_; }
  UpstreamClient& upstream() { return *upstream_; }

 private:
  void answer_error(httplib::Response& res, int status, const std::string& msg, const std::string& code,
                    const std::string& param = "");

  HybridOptions opts_;
  Router router_;
  std::unique_ptr<UpstreamClient> upstream_;
  void remember_upstream_response(const std::string& id);
  std::mutex ids_mu_;
  std::deque<std::string> upstream_ids_;             // oldest first
  std::unordered_set<std::string> upstream_id_set_;  // the same ids
  std::mutex models_mu_;
  std::chrono::steady_clock::time_point models_at_{};
  bool models_fetched_ = false;
};

// The body a cloud-routed request is forwarded with: `body` without "lilac" and the policy's dropped fields, "model"
// set to `model` (in its place, or last when absent or dropped) — the bytes that copying the request, erasing and
// assigning would dump, without copying its parsed tree (a hostile body of a few MB parses to tens of MB).
std::string upstream_body(const nlohmann::ordered_json& body, const std::vector<std::string>& drop,
                          const std::string& model);

// What `lilac serve`'s hybrid options say (src/cli/serve_hybrid.cpp).
struct HybridSettings {
  std::string upstream_url;    // --upstream ("" = no hybrid routing)
  std::string upstream_model;  // --upstream-model
  std::string key_env = "LILAC_UPSTREAM_API_KEY";  // --upstream-key-env: the variable holding the key
  std::string policy_file;     // --route-policy ("" = built-in defaults)
};

// Builds a HybridRouter from `s` (reading the policy file and the key's environment variable) and plugs
// it into `server` with Server::set_route_hook. The caller keeps the returned router alive (the hook holds
// a weak reference). Throws lilac::InputError for a bad URL or policy.
std::shared_ptr<HybridRouter> install_hybrid_router(server::Server& server, const HybridSettings& s);

}  // namespace lilac::router
