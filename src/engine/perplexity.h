// Perplexity of a token sequence under the model, as llama.cpp's `llama-perplexity` measures it: the tokens are cut
// into windows of `ctx` tokens, each window is computed from a fresh state (its own context only), and the
// negative log-likelihood of its tokens from position `first` on is summed (the tokens before `first` are
// context only: llama.cpp scores the second half, ctx / 2). The scores are those of prompt scoring
// (GenerationRequest::prompt_logprobs: log_softmax of the raw logits, every backend's prefill). A last window
// shorter than ctx is scored too when it has a token past `first`.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "engine/backend.h"

namespace lilac {

class Tokenizer;

struct PerplexityOptions {
  int64_t ctx = 512;     // tokens per window (>= 2)
  int64_t first = -1;    // the first scored position of a window (1..ctx-1); -1: ctx / 2
  int64_t max_windows = 0;  // 0: all
  int64_t first_scored() const { return first < 0 ? ctx / 2 : first; }
};

struct PerplexityWindow {
  int64_t start = 0;   // its first token in the sequence
  int64_t tokens = 0;  // tokens computed (ctx, or fewer for the last window)
  int64_t scored = 0;  // tokens scored
  double nll = 0;      // their summed negative log-likelihood (natural log)
  double seconds = 0;
};

struct PerplexityResult {
  std::vector<PerplexityWindow> windows;
  int64_t tokens = 0;  // computed
  int64_t scored = 0;
  double nll = 0;
  double ppl() const;     // exp(nll / scored)
  double stderr_ppl = 0;  // standard error of ppl (delta method from the per-token NLLs' variance)
  double seconds = 0;
};

// Throws lilac::InputError for bad options or a sequence with nothing to score. `on_window` (optional) sees each
// window as it ends, with the result so far.
PerplexityResult perplexity(Backend& backend, const Tokenizer& tokenizer, std::span<const int32_t> tokens,
                            const PerplexityOptions& opts,
                            const std::function<void(const PerplexityWindow&, const PerplexityResult&)>& on_window = {});

}  // namespace lilac
