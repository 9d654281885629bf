// `lilac serve --upstream URL [--upstream-model NAME] [--upstream-key-env VAR] [--route-policy FILE]`:
// the options of the hybrid router (src/router/) as a serve extension; router::install_hybrid_router
// builds the router and plugs it into the server's route hook.
#include <memory>
#include <string>

#include "cli/serve_extension.h"
#include "core/error.h"
#include "router/hybrid.h"
#include "server/server.h"

namespace lilac::cli {
namespace {

router::HybridSettings& hybrid_settings() {
  static router::HybridSettings s;
  return s;
}

// Owned here for the life of the process (the Server's hook holds a weak reference).
std::shared_ptr<router::HybridRouter>& router_slot() {
  static std::shared_ptr<router::HybridRouter> r;
  return r;
}

const bool registered = register_serve_extension(ServeExtension{
    "hybrid",
    [](CLI::App& serve) {
      router::HybridSettings& s = hybrid_settings();
      auto* g = serve.add_option_group("Hybrid routing", "Send some requests to an OpenAI-compatible upstream");
      g->add_option("--upstream", s.upstream_url,
                    "OpenAI-compatible upstream base URL, http(s)://host[:port][/base] (an empty path means /v1)");
      g->add_option("--upstream-model", s.upstream_model,
                    "Model name sent upstream (default: the first model the upstream lists)");
      g->add_option("--upstream-key-env", s.key_env,
                    "Environment variable holding the upstream API key (sent as a Bearer token, never logged)")
          ->capture_default_str();
      g->add_option("--route-policy", s.policy_file, "Route policy JSON file (README: Hybrid routing)");
    },
    [](server::Server& srv) {
      const router::HybridSettings& s = hybrid_settings();
      if (s.upstream_url.empty() && (!s.policy_file.empty() || !s.upstream_model.empty()))
        throw InputError("--route-policy and --upstream-model need --upstream URL");
      router_slot() = router::install_hybrid_router(srv, s);
    }});

}  // namespace
}  // namespace lilac::cli
