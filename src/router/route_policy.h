// The hybrid router's policy: a JSON file (`lilac serve --route-policy FILE`) that says where requests go.
// The README ("Hybrid routing") documents the format with a full example. Every key is optional; an
// unknown key is an error (a typo must not silently weaken the policy).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "router/detectors.h"

namespace lilac::router {

enum class Route { local, cloud, auto_ };

const char* route_name(Route r);                       // "local", "cloud", "auto"
bool parse_route(std::string_view s, Route* out);       // case-insensitive; false when unknown

// A compiled user rule: keywords (substring match) and regular expressions (PCRE2, JIT, UTF).
// A text matches the rule when any keyword or any regex occurs in it.
class UserRule {
 public:
  UserRule(std::string name, std::vector<std::string> keywords, std::vector<std::string> regexes,
           bool case_insensitive);  // throws lilac::InputError naming the bad regex
  ~UserRule();
  UserRule(UserRule&&) noexcept;
  UserRule& operator=(UserRule&&) noexcept;
  UserRule(const UserRule&) = delete;
  UserRule& operator=(const UserRule&) = delete;

  const std::string& name() const { return name_; }
  bool case_insensitive() const { return ci_; }
  // `lowered` is `text` with ASCII A-Z folded to a-z (the caller folds once for all rules); it is
  // only read when the rule is case-insensitive.
  bool matches(std::string_view text, std::string_view lowered) const;

 private:
  struct Regex;
  std::string name_;
  std::vector<std::string> keywords_;  // folded when case-insensitive
  std::vector<std::unique_ptr<Regex>> regexes_;
  bool ci_;
};

struct ModelRule {
  std::string match;           // model name pattern; '*' matches any run of characters
  bool allow_local = true;
  bool allow_cloud = true;
};

struct RoutePolicy {
  Route default_route = Route::cloud;  // where a request goes when no rule decides
  DetectorSet detectors = DetectorSet::all();
  std::vector<UserRule> rules;
  // Prompts larger than this go upstream (unless sensitive or sticky). 0 = no limit.
  // Tokens are estimated as ceil(bytes / 4) (the router does not tokenize).
  uint64_t max_local_prompt_bytes = 0;
  uint64_t max_local_prompt_tokens = 0;
  std::vector<ModelRule> models;  // first match wins; no match = both routes allowed
  bool allow_explicit_cloud_for_sensitive = false;
  // Fallbacks.
  bool upstream_failure_to_local = true;  // upstream unreachable / timeout / 5xx -> serve locally
  bool local_busy_to_cloud = true;        // local queue full and not sensitive -> upstream
  // Stickiness: conversations (message prefixes) once served locally stay local.
  bool sticky = true;
  size_t sticky_max_entries = 100000;
  // Upstream connection.
  std::string model_prefix = "cloud/";  // how /v1/models lists upstream models and requests name them
  int connect_timeout_ms = 3000;
  int read_timeout_ms = 300000;
  int models_timeout_ms = 1500;
  int models_cache_s = 60;
  std::vector<std::string> drop_fields;  // request fields removed before forwarding (besides "lilac")

  // Returns the first model rule matching `model`, or nullptr.
  const ModelRule* model_rule(std::string_view model) const;
};

// Parses a policy document; throws lilac::InputError naming the field (and `origin`, e.g. the file).
RoutePolicy parse_route_policy(const nlohmann::json& doc, const std::string& origin = "route policy");
RoutePolicy load_route_policy_file(const std::string& path);

namespace detail {
// Whether `needle` occurs in `hay`: std::string_view::find's answer, found faster in long texts (a rule's keywords are
// looked for in every text a request holds; tests/router/test_router_fast_paths.cpp compares the two).
bool contains(std::string_view hay, std::string_view needle);
}  // namespace detail

// Glob match with '*' only (for model rules).
bool glob_match(std::string_view pattern, std::string_view text);

}  // namespace lilac::router
