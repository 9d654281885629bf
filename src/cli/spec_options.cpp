#include "cli/spec_options.h"

#include "core/error.h"
#include "core/log.h"

namespace lilac::cli {

// Off by default, from measurement: the only backend that can draft today is the CPU reference, and there
// speculation is slower even at 80 % acceptance (tiny-mtp, K = 3: 0.55-0.79x plain decoding at P = 0.8,
// 0.15-0.24x at P = 0; its small matrices are compute-bound, so verifying k + 1 rows costs about k + 1
// one-token steps, and a draft costs ~0.5 ms: bench/BENCHMARKS.md, "Speculative decoding"). The CUDA
// backend drafts too; `lilac bench --synthetic --spec-tokens K --draft-accept P` on the GPU decides the
// default (issue 14's targets are stated for K = 3). With the adaptive draft policy (--spec-policy, the
// default) a K > 0 costs little where drafts are wrong: 0.99x at P = 0 on the H200, 1.2-1.6x at P = 0.8-0.9
// (bench/BENCHMARKS.md). Concurrent streams now batch with it on (the batched step feeds the MTP heads, and
// above --spec-max-batch decoding streams none drafts), but what a followed head costs inside batched steps
// (its catch-up rows) has not been measured yet: it stays off until that is measured on the GPU.
const int kDefaultSpecTokens = 0;

void add_spec_option(CLI::App& sub, int& spec_tokens) {
  spec_tokens = kDefaultSpecTokens;
  sub.add_option("--spec-tokens", spec_tokens,
                 "speculative decoding: drafts per step from the model's MTP head (0 = off); output unchanged")
      ->check(CLI::Range(0, 16))
      ->capture_default_str();
}

void add_spec_policy_option(CLI::App& sub, std::string& policy, bool allow_both) {
  policy = allow_both ? "both" : "adaptive";
  sub.add_option("--spec-policy", policy,
                 allow_both ? "drafts per step: adaptive (0..K, following the measured acceptance and costs), fixed "
                              "(always K), or both side by side"
                            : "drafts per step: adaptive (0..K, following the measured acceptance and costs) or "
                              "fixed (always K); output unchanged either way")
      ->capture_default_str();  // checked by parse_spec_policy (an InputError naming the option)
}

int effective_spec_tokens(int requested, Backend& backend, const ModelWeights& weights) {
  if (requested <= 0) return 0;
  if (!weights.has_mtp()) {
    LILAC_LOG_INFO("speculative decoding off: %s", weights.no_mtp_reason.c_str());
    return 0;
  }
  if (!backend.new_session(8)->can_draft()) {
    LILAC_LOG_INFO("speculative decoding off: the %s backend cannot draft with the MTP head yet", backend.name().c_str());
    return 0;
  }
  LILAC_LOG_INFO("speculative decoding: up to %d MTP drafts per step", requested);
  return requested;
}

}  // namespace lilac::cli
