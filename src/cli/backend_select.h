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

// A model of the real Qwen3.6-35B-A3B shape with `layers` layers and random 4-bit weights (8-bit router and
// shared-expert gate), deterministic in `seed`, on the named backend: generated on the GPU for cuda (with an
// MTP head) and in memory for cpu / cpu-ref ("auto" as in make_backend). vocab > 0 replaces the real
// vocabulary size (`serve --synthetic-layers`: the tokenizer's). For benchmarks: the real model's work per
// token without its checkpoint.
std::unique_ptr<Backend> make_synthetic_backend(const std::string& name, int layers, uint64_t seed, int threads = 0,
                                                int64_t vocab = 0);

// True when "auto" would pick the CUDA backend (a CUDA build and a usable GPU).
bool cuda_usable();

// Adds `--backend auto|cpu|cpu-ref|cuda` (default "auto") and `--threads N` to a subcommand.
void add_backend_options(CLI::App& sub, std::string& backend, int& threads);

}  // namespace lilac::cli
