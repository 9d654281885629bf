// `--spec-tokens K` and `--spec-policy adaptive|fixed` (speculative decoding with the model's MTP head) for
// serve, generate and bench.
#pragma once
#include <CLI/CLI.hpp>

#include <string>

#include "engine/backend.h"
#include "model/weights.h"

namespace lilac::cli {

// The default K: see spec_options.cpp for why.
extern const int kDefaultSpecTokens;

// Adds `--spec-tokens K` (0 = off; default kDefaultSpecTokens).
void add_spec_option(CLI::App& sub, int& spec_tokens);
// Adds `--spec-policy adaptive|fixed` (default adaptive: engine/spec_policy.h); `both` too when
// `allow_both` (bench: measure the two side by side, its default). Parse it with parse_spec_policy.
void add_spec_policy_option(CLI::App& sub, std::string& policy, bool allow_both = false);

// Adds `--draft-vocab N` (drafts only among token ids < N; 0 = the whole vocabulary, the default): the MTP head's
// LM head then computes N rows per draft (Session::set_draft_vocab). Apply it with backend.set_draft_vocab.
void add_draft_vocab_option(CLI::App& sub, int64_t& draft_vocab);

// K when `backend` can draft for this model, else 0 -- with a log line saying why when K > 0 was asked
// for (no MTP head in the checkpoint: weights.no_mtp_reason; or a backend without drafting).
int effective_spec_tokens(int requested, Backend& backend, const ModelWeights& weights);

}  // namespace lilac::cli
