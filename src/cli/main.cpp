// lilac: one binary, subcommands registered by src/cli/cmd_*.cpp.
#include <cstdio>
#include <exception>
#include <map>

#include "cli/command.h"
#include "core/error.h"

namespace lilac::cli {

std::vector<Command>& commands() {
  static std::vector<Command> all;
  return all;
}

bool register_command(Command c) {
  commands().push_back(std::move(c));
  return true;
}

}  // namespace lilac::cli

int main(int argc, char** argv) {
  using namespace lilac::cli;
  CLI::App app{"lilac: a fast inference engine for Qwen3.6-35B-A3B (qwen3_5_moe)"};
  app.require_subcommand(1);
  std::map<CLI::App*, std::function<int()>> runs;
  for (auto& c : commands()) {
    CLI::App* sub = app.add_subcommand(c.name, c.help);
    runs[sub] = c.setup(*sub);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    for (auto& [sub, run] : runs)
      if (sub->parsed()) return run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lilac: error: %s\n", e.what());
    return 1;
  }
  return 1;
}
