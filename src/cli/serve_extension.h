// Extensions of `lilac serve` (e.g. the hybrid router): a src/cli/*.cpp file registers one from a
// static initializer (`static bool reg = register_serve_extension({...});`). cmd_serve.cpp adds its
// options to the serve subcommand and, once options are parsed and the Server is built (before it
// binds or loads the model), calls `configure` so it can install a RouteHook or extra routes.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "server/server.h"

namespace lilac::cli {

struct ServeExtension {
  std::string name;
  std::function<void(CLI::App& serve)> add_options;
  // Throw lilac::InputError for bad option values (the CLI prints it and exits 1).
  std::function<void(lilac::server::Server& server)> configure;
};

bool register_serve_extension(ServeExtension ext);
std::vector<ServeExtension>& serve_extensions();

}  // namespace lilac::cli
