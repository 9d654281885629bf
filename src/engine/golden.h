// Comparison of a backend with the oracle's golden outputs (golden.safetensors + golden.json, see
// ../shared/README.md): teacher-forced logits of every seqK, greedy generations genJ, and the hidden
// states of the sequence that lists `activations`. Used by `lilac check-golden` and the tests.
// Goldens made with an MTP head (`seqK.mtp_logits`, `genJ.mtp_accepted`) also check the backend's head:
// the teacher-forced MTP logits of every row, and each generation again with speculative decoding (k = 3,
// the oracle's loop): the same tokens and the same drafts accepted per round.
#pragma once
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "engine/backend.h"

namespace lilac {

// Hidden-state tap: (name, first_pos, n_rows, data [n_rows, hidden]).
using HiddenTap = std::function<void(const std::string& name, int64_t first_pos, int64_t n_rows, const float* data)>;

struct GoldenSeqResult {
  std::string name;
  int64_t length = 0;
  double max_abs = 0;      // max |Δlogit|
  // Reference logits stored as BF16 (the real4 preset) carry their own rounding error of up to half a
  // bf16 ulp: max over positions of max(0, |Δlogit| − half_ulp_bf16(ref)). Equals max_abs for F32.
  bool ref_bf16 = false;
  double max_abs_beyond_rounding = 0;
  double rel_l2 = 0;       // ‖Δ‖ / ‖ref‖ over all positions
  int64_t top1_agree = 0;  // positions where argmax(engine) == oracle top-1
  int64_t confident = 0, confident_agree = 0;  // the same on positions with oracle margin ≥ confident_margin
  double ppl_engine = std::numeric_limits<double>::quiet_NaN();  // teacher-forced perplexity (NaN if L < 2)
  double ppl_oracle = std::numeric_limits<double>::quiet_NaN();
  double ppl_rel_pct() const { return 100.0 * (ppl_engine - ppl_oracle) / ppl_oracle; }
  // MTP rows (the golden has seqK.mtp_logits and the backend can draft): the same measures.
  bool mtp = false;
  int64_t mtp_rows = 0;  // rows the backend's head delivered (all `length` when complete)
  double mtp_max_abs = 0, mtp_rel_l2 = 0;
  int64_t mtp_top1_agree = 0, mtp_confident = 0, mtp_confident_agree = 0;
  bool mtp_next_token_agrees = true;  // the main model's greedy token after the sequence = the golden's
};

struct GoldenGenResult {
  std::string name;
  int64_t prompt_length = 0;
  std::vector<int32_t> expected, got;
  std::vector<float> margin;       // oracle margin per step
  int64_t first_mismatch = -1;     // -1: identical
  int64_t first_low_margin = -1;   // first step with margin < confident_margin (-1: none)
  // Speculative greedy decoding with the backend's MTP head (k = 3), when the golden has mtp_accepted.
  bool spec = false;
  std::vector<int32_t> spec_got;                          // first `expected.size()` tokens
  std::vector<int32_t> accepted_expected, accepted_got;   // drafts accepted per round
  int64_t spec_first_mismatch = -1;
};

struct GoldenActivation {
  std::string seq, name;  // e.g. "seq2", "layer.3"
  double max_abs = 0;     // max |Δ|
  double ref_max_abs = 0; // max |ref| (scale)
};

struct GoldenReport {
  std::string golden_path, preset;
  std::vector<GoldenSeqResult> seqs;
  std::vector<GoldenGenResult> gens;
  std::vector<GoldenActivation> activations;
  bool activations_requested = false, activations_available = false;
  bool golden_has_mtp = false;  // the golden has MTP rows
  std::string mtp_unchecked;    // why they were not checked (empty: checked or none)
};

struct GoldenOptions {
  double confident_margin = 0.1;
  bool activations = false;
  // Installs a hidden-state tap on a fresh session (returns false if the backend has none).
  std::function<bool(Session&, HiddenTap)> install_tap;
  // Prefill chunking is the backend's; this only sets the session capacity slack.
  int64_t extra_length = 8;
};

// Runs every sequence and generation of the golden file through `backend` (a fresh session each).
// Throws lilac::Error naming the file / tensor when the golden file is malformed, or when its
// vocabulary differs from the backend's.
GoldenReport run_golden(Backend& backend, const std::string& golden_safetensors, const GoldenOptions& opts = {});

struct GoldenThresholds {
  bool exact = true;  // cpu-ref (fp32 reference): max |Δlogit| bound and identical generations
  double max_abs = 2e-3;
  double min_confident_top1 = 0.99;  // GPU rules
  double max_rel_l2 = 3e-2;
  double max_ppl_rel_pct = 1.0;
  double confident_margin = 0.1;
  static GoldenThresholds for_backend(const std::string& backend_name);
  std::string describe() const;
};

// Every violated threshold, as one line each (empty: PASS).
std::vector<std::string> golden_failures(const GoldenReport& r, const GoldenThresholds& t);

// The report as a human-readable table (per sequence, per generation, activations).
std::string format_golden_report(const GoldenReport& r);

}  // namespace lilac
