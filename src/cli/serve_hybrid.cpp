// `lilac serve --upstream URL [--upstream-model NAME] [--upstream-key-env VAR] [--route-policy FILE]`:
// the hybrid router (src/server/hybrid.h) as a serve extension.
#include <cstdlib>
#include <memory>
#include <string>

#include "cli/serve_extension.h"
#include "core/error.h"
#include "core/log.h"
#include "server/hybrid.h"
#include "server/route_policy.h"
#include "server/server.h"

namespace lilac::cli {
namespace {

struct HybridArgs {
  std::string upstream, upstream_model, key_env = "LILAC_UPSTREAM_API_KEY", policy_file;
};

HybridArgs& hybrid_args() {
  static HybridArgs a;
  return a;
}

// Owned here for the life of the process (the Server's hook holds a weak reference).
std::shared_ptr<server::HybridRouter>& router_slot() {
  static std::shared_ptr<server::HybridRouter> r;
  return r;
}

const bool registered = register_serve_extension(ServeExtension{
    "hybrid",
    [](CLI::App& serve) {
      HybridArgs& a = hybrid_args();
      auto* g = serve.add_option_group("Hybrid routing", "Send some requests to an OpenAI-compatible upstream");
      g->add_option("--upstream", a.upstream,
                    "OpenAI-compatible upstream base URL, http(s)://host[:port][/base] (an empty path means /v1)");
      g->add_option("--upstream-model", a.upstream_model,
                    "Model name sent upstream (default: the first model the upstream lists)");
      g->add_option("--upstream-key-env", a.key_env,
                    "Environment variable holding the upstream API key (sent as a Bearer token, never logged)")
          ->capture_default_str();
      g->add_option("--route-policy", a.policy_file, "Route policy JSON file (README: Hybrid routing)");
    },
    [](server::Server& srv) {
      HybridArgs& a = hybrid_args();
      if (a.upstream.empty()) {
        if (!a.policy_file.empty() || !a.upstream_model.empty())
          throw InputError("--route-policy and --upstream-model need --upstream URL");
        return;
      }
      server::HybridOptions ho;
      ho.upstream_url = a.upstream;
      ho.upstream_model = a.upstream_model;
      if (!a.policy_file.empty()) ho.policy = server::load_route_policy_file(a.policy_file);
      if (!a.key_env.empty()) {
        if (const char* k = std::getenv(a.key_env.c_str())) ho.api_key = k;
      }
      const bool has_key = !ho.api_key.empty();
      auto r = std::make_shared<server::HybridRouter>(std::move(ho), srv.options().model_id);
      srv.set_route_hook(r->make_hook(&srv));
      router_slot() = r;
      const auto& p = r->router().policy();
      const std::string key_note = has_key ? "from $" + a.key_env : "none ($" + a.key_env + " is unset)";
      LILAC_LOG_INFO("hybrid: upstream %s%s, default route %s, policy %s, API key %s",
                     r->upstream().options().url.origin().c_str(), r->upstream().options().url.base.c_str(),
                     server::route_name(p.default_route),
                     a.policy_file.empty() ? "(built-in defaults)" : a.policy_file.c_str(), key_note.c_str());
    }});

}  // namespace
}  // namespace lilac::cli
