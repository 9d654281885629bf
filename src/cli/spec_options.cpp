#include "cli/spec_options.h"

#include "core/error.h"
#include "core/log.h"

namespace lilac::cli {

// Off by default, from measurement. On the CPU reference backend speculation is slower even at 80 % acceptance
// (tiny-mtp, K = 3: 0.55-0.79x plain decoding at P = 0.8; verifying k + 1 rows costs about k + 1 one-token steps:
// bench/BENCHMARKS.md, "Speculative decoding"); the fast CPU backend does not draft. On the H200 (2026-12-05) one
// stream with K = 3 and the adaptive policy decodes at 0.98x / 1.25x / 1.68x of plain decoding at 0 / 60 / 80 %
// acceptance, but a session that follows its MTP head pays for it where it does not draft: every prompt's first
// token (27.2 against 25 ms at 512 tokens: the head's catch-up rows run on the decode kernels) and every batched
// step the heads' rows (`lilac bench --batch 1,16,64 --follow-mtp`: 1.1 / 4.8 / 7.3 % slower at 1 / 16 / 64
// streams). A server that batches would pay on every step for heads only a lone stream uses, so K > 0 is the
// user's choice (single-user serving gains the most).
const int kDefaultSpecTokens = 0;

void add_spec_option(CLI::App& sub, int& spec_tokens) {
  spec_tokens = kDefaultSpecTokens;
  sub.add_option("--spec-tokens", spec_tokens,
                 "speculative decoding: drafts per step from the model's MTP head (0 = off); output unchanged")
      ->check(CLI::Range(0, 16))
      ->capture_default_str();
}

void add_draft_vocab_option(CLI::App& sub, int64_t& draft_vocab) {
  draft_vocab = 0;
  sub.add_option("--draft-vocab", draft_vocab,
                 "speculative decoding: draft only among token ids below N (the frequent end of a BPE vocabulary): "
                 "cheaper drafts, possibly fewer accepted; output unchanged (0 = all)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 24))
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
