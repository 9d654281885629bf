// The hybrid router's decision: local engine or OpenAI-compatible upstream, keeping sensitive data local.
// Pure (no HTTP): router/hybrid.h applies it to requests.
//
// Router::decide() applies, in order:
//   1. an explicit choice: body `"lilac": {"route": "local"|"cloud"|"auto"}` (wins) or header `x-lilac-route`;
//      "local" is always honoured; "cloud" is honoured unless the request is sensitive (then it stays local,
//      unless the policy sets allow_explicit_cloud_for_sensitive); "auto" = no explicit choice;
//   2. sensitivity: built-in detectors and the policy's user rules over every message's content (system,
//      user, assistant, tool results; text parts), reasoning_content, tool-call names and arguments, and the
//      /v1/completions prompt and suffix -> local;
//   3. stickiness: a request whose messages start with a message list that was served locally -> local;
//   4. the model name: an upstream model ("<prefix><id>", the configured --upstream-model, or an id the
//      upstream listed) -> cloud;
//   5. size: a prompt above max_local_prompt_bytes / _tokens -> cloud;
//   6. local busy (queue full) and local_busy_to_cloud -> cloud;
//   7. the policy's default_route ("auto" means local here, since 5 and 6 already sent what should go).
// Model rules ("models") then veto a route a model may not take: the request moves to the other route when
// that one is allowed and safe (a sensitive request never moves to cloud), else it is refused with 403.
#pragma once
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include <nlohmann/json.hpp>

#include "router/route_policy.h"

namespace lilac::router {

struct RouterConfig {
  std::string local_model_id = "lilac";  // the id the local server serves
  std::string upstream_model;            // --upstream-model ("" = the first id the upstream lists)
};

struct RouteDecision {
  Route route = Route::local;     // local or cloud
  std::string reason;             // explicit, sensitive, sticky, model, size, busy, default, model_rule
  bool sensitive = false;
  std::vector<std::string> matched;  // detector kinds / user rule names that fired (never the values)
  bool model_is_upstream = false;    // the request names an upstream model
  std::string upstream_model;        // the model name to send upstream (route == cloud)
  // A request that cannot be routed (bad lilac.route, a policy veto): status + OpenAI error.
  int error_status = 0;
  std::string error_message, error_code, error_param;
};

// 64-bit hashes of each message prefix: result[k] covers messages[0..k]. Stable across re-serialisation:
// role, name, tool_call_id, content (string or text parts), tool calls (name + arguments); any other
// value (an object, odd content) is hashed independently of its objects' key order. Exposed for tests.
std::vector<uint64_t> message_prefix_hashes(const nlohmann::ordered_json& messages);

class Router {
 public:
  Router(RoutePolicy policy, RouterConfig config);

  // `chat`: /v1/chat/completions (else /v1/completions). `header_route`: the x-lilac-route header ("" = none).
  RouteDecision decide(const nlohmann::ordered_json& body, bool chat, std::string_view header_route, bool local_busy) const;

  // Sensitivity only (step 2): fills matched; returns whether anything fired.
  bool scan_body(const nlohmann::ordered_json& body, bool chat, std::vector<std::string>* matched) const;

  // Stickiness: remember the full message list of a request served locally; is_sticky tells whether a
  // request's messages start with a remembered list.
  void remember_local(const nlohmann::ordered_json& body);
  bool is_sticky(const nlohmann::ordered_json& body) const;
  size_t sticky_entries() const;

  // Upstream model naming.
  bool is_upstream_model(const std::string& model) const;
  std::string upstream_model_for(const std::string& model) const;  // "" when none is known
  void set_upstream_model_ids(std::vector<std::string> ids);     // from the upstream's /v1/models
  std::vector<std::string> upstream_model_ids() const;

  const RoutePolicy& policy() const { return policy_; }
  const RouterConfig& config() const { return config_; }

 private:
  bool text_sensitive(std::string_view text, std::vector<std::string>* matched, std::string& fold_buf) const;

  RoutePolicy policy_;
  RouterConfig config_;
  mutable std::mutex mu_;
  std::unordered_set<uint64_t> sticky_;
  std::deque<uint64_t> sticky_order_;
  std::vector<std::string> upstream_ids_;
};

}  // namespace lilac::router
