// Choosing a backend by name for the subcommands: "auto" (CUDA when a GPU is usable, else the fast
// CPU backend), "cpu" (the fast CPU path, src/cpufast), "cpu-ref" (the exact fp32 reference, src/cpu)
// or "cuda".
#pragma once
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "engine/backend.h"
#include "model/weights.h"

namespace lilac::cli {

// Throws lilac::InputError for an unknown name, or for "cuda" when this build has no CUDA backend or no
// GPU is present. threads: CPU worker threads (0 = all hardware threads).
std::unique_ptr<Backend> make_backend(const std::string& name, std::shared_ptr<const ModelWeights> weights,
                                      int threads = 0);

// True when "auto" would pick the CUDA backend (a CUDA build and a usable GPU).
bool cuda_usable();

// Adds `--backend auto|cpu|cpu-ref|cuda` (default "auto") and `--threads N` to a subcommand.
void add_backend_options(CLI::App& sub, std::string& backend, int& threads);

}  // namespace lilac::cli
