// `lilac <subcommand>`: each src/cli/cmd_*.cpp registers one subcommand with CLI11.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace lilac::cli {

struct Command {
  std::string name;
  std::string help;
  // Adds options to `sub` and returns the function to run once parsed (returns the exit code).
  std::function<std::function<int()>(CLI::App& sub)> setup;
};

// Registration from a static initializer in each cmd_*.cpp (they are linked into the binary).
bool register_command(Command c);
std::vector<Command>& commands();

}  // namespace lilac::cli
