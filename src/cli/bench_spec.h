// `lilac bench --spec-tokens K [--draft-accept P,...] [--spec-policy adaptive|fixed|both]`: speculative
// decoding at a known acceptance, next to plain decoding (cmd_bench.cpp parses the options).
//
// For each prompt length: a plain greedy run gives the true continuation (untimed) and plain decode tok/s;
// then, for each P and each policy, the timed run does the real pipeline -- each step the policy
// (engine/spec_policy.h: fixed = always K; adaptive = 0..K from the acceptance and the costs it measures)
// picks k; k = 0 is a plain decode step; else the MTP head drafts k tokens (when the backend can: its time
// is reported per draft), each draft is replaced by the true token with probability P and by a wrong one
// otherwise (P not given: the head's own drafts), and one verify step checks them and rolls back. Tokens/s
// counts the tokens the steps emit; they must equal the plain run's (else the bench fails). It reports
// the accepted drafts and tokens per round, the mean k chosen per step (plain steps count 0), the time in
// draft() per draft and in verify() per round. Before the timed runs, a short run at each fixed k = 1..K
// captures the backend's graphs (and gives the adaptive policy's cost estimates a start, as a session's
// earlier requests would).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/backend.h"
#include "engine/spec_policy.h"

namespace lilac::cli {

struct SpecBenchOptions {
  std::vector<int64_t> prompt_lens;
  int64_t decode_tokens = 64;
  int spec_tokens = 0;                   // K
  std::vector<double> accept;            // forced acceptances; empty: the head's own drafts
  std::vector<SpecPolicyKind> policies;  // run in this order
  uint64_t seed = 1;
};

// "--draft-accept": comma-separated probabilities in [0, 1] (InputError otherwise).
std::vector<double> parse_accept_list(const std::string& s);
// "--spec-policy" of bench: adaptive, fixed or both.
std::vector<SpecPolicyKind> parse_bench_policies(const std::string& s);

// Prints the table and appends one entry per (prompt length, P, policy) to out["results"].
void run_spec_bench(const SpecBenchOptions& o, Backend& backend, nlohmann::json& out);

}  // namespace lilac::cli
