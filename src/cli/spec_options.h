// `--spec-tokens K` (speculative decoding with the model's MTP head) for serve, generate and bench.
#pragma once
#include <CLI/CLI.hpp>

#include "engine/backend.h"
#include "model/weights.h"

namespace lilac::cli {

// The default K: see spec_options.cpp for why.
extern const int kDefaultSpecTokens;

// Adds `--spec-tokens K` (0 = off; default kDefaultSpecTokens).
void add_spec_option(CLI::App& sub, int& spec_tokens);

// K when `backend` can draft for this model, else 0 -- with a log line saying why when K > 0 was asked
// for (no MTP head in the checkpoint: weights.no_mtp_reason; or a backend without drafting).
int effective_spec_tokens(int requested, Backend& backend, const ModelWeights& weights);

}  // namespace lilac::cli
