// The hybrid router's decision: local engine or OpenAI-compatible upstream, keeping sensitive data local.
// Pure (no HTTP): router/hybrid.h applies it to requests.
//
// Router::decide() applies, in order:
//   1. an explicit choice: body `"lilac": {"route": "local"|"cloud"|"auto"}` (wins) or header `x-lilac-route`;
//      "local" is always honoured; "cloud" is honoured unless the request is sensitive (then it stays local,
//      unless the policy sets allow_explicit_cloud_for_sensitive); "auto" = no explicit choice;
//   2. sensitivity: built-in detectors and the policy's user rules over everything in the body (every
//      key and string, numbers' text, JSON inside strings, encodings undone, values joined to catch split
//      secrets: router/scan.h), whatever its protocol -> local; a body that cannot be shown clean (too
//      much text) -> local too; a request the local server refuses (a completions prompt that is an
//      object, ...) -> local (400);
//   3. stickiness: a request whose messages (Responses: input items) start with a list that was served
//      locally -> local;
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
#include "router/scan.h"

namespace lilac::router {

// The protocol of a request, known by its path: what the sensitivity scan reads and where a cloud
// request goes (the upstream is called in the same protocol: base + upstream_path).
enum class Api { chat, completions, messages, responses };
Api api_for_path(std::string_view path);  // /v1/chat/completions, /v1/completions, /v1/messages, /v1/responses
const char* upstream_path(Api api);       // "/chat/completions", "/completions", "/messages", "/responses"

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

// 64-bit hashes of each message prefix: result[k] covers messages[0..k]. Stable across re-serialisation
// and whitespace-only edits: role, name, tool_call_id, content (a string or its text parts joined, with
// runs of whitespace made one space and none at the ends), tool calls (name + arguments, a JSON string
// hashed as its parsed value); any other value (an object, odd content) is hashed independently of its
// objects' key order. Exposed for tests.
std::vector<uint64_t> message_prefix_hashes(const nlohmann::ordered_json& messages);

class Router {
 public:
  Router(RoutePolicy policy, RouterConfig config);

  // `api`: the request's protocol. `header_route`: the x-lilac-route header ("" = none).
  RouteDecision decide(const nlohmann::ordered_json& body, Api api, std::string_view header_route, bool local_busy) const;
  // `chat`: /v1/chat/completions (else /v1/completions).
  RouteDecision decide(const nlohmann::ordered_json& body, bool chat, std::string_view header_route, bool local_busy) const {
    return decide(body, chat ? Api::chat : Api::completions, header_route, local_busy);
  }

  // Sensitivity only (step 2): fills matched; returns whether anything fired (or the body could not be
  // shown clean). `chat` is unused (every body is scanned whole: router/scan.h).
  bool scan_body(const nlohmann::ordered_json& body, bool chat, std::vector<std::string>* matched) const;
  // The whole scan (router/scan.h) with this policy's detectors and rules.
  ScanOutcome scan(const nlohmann::ordered_json& body) const;

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
  bool text_sensitive(std::string_view text, bool is_id, std::vector<std::string>* matched, std::string& fold_buf) const;
  static const char* invalid_shape(const nlohmann::ordered_json& body, bool chat);

  RoutePolicy policy_;
  RouterConfig config_;
  mutable std::mutex mu_;
  std::unordered_set<uint64_t> sticky_;
  std::deque<uint64_t> sticky_order_;
  std::vector<std::string> upstream_ids_;
};

}  // namespace lilac::router
