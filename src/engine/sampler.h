// Host sampler: chooses the next token from a row of logits (the CPU backend uses it; the CUDA
// backend does the same steps on the GPU).
//
// Steps, in order:
//   1. penalties (also in greedy mode, where they are no-ops at their defaults):
//      repetition_penalty (HF: for every distinct token of context + generated, logit / p if > 0,
//      else logit * p), then presence / frequency (OpenAI: logit −= presence·[count > 0] +
//      frequency·count over the generated tokens), then logit_bias (logit += bias, greedy too);
//   2. temperature == 0: greedy argmax (ties to the lower id), done;
//   3. logits / temperature; top-k (keep the k largest, ties to the lower id); top-p (keep the
//      smallest most-likely-first prefix whose probability reaches top_p); min-p (drop tokens whose
//      probability is below min_p × the largest); a draw from the kept tokens, renormalised, with a
//      64-bit Mersenne Twister seeded by params.seed (deterministic for a seed).
// Logprobs are those of the raw logits (log_softmax before any step above).
//
// An allowed-token mask (constrained decoding: Session::set_token_mask's format) applies before step 1:
// a token outside it is never chosen (its logit counts as -inf through every step). Logprobs stay those
// of the raw logits (as on the GPU).
//
// A row with no choice is an error of its generation, on every backend and in every sampler (single row,
// batched rows, a speculative verify's rows), never a made-up id: a mask that allows no id of the
// vocabulary throws no_allowed_token_error(); a row whose allowed logits (after the penalties and the bias)
// are all NaN or -inf throws no_finite_logit_error() (a model whose weights or activations are not finite).
#pragma once
#include <cstdint>
#include <random>
#include <span>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "engine/backend.h"

namespace lilac {

// Index of the largest value, ties to the lower index (NaNs never win). Empty span: -1.
int32_t argmax(std::span<const float> x);

// log_softmax(logits)[token] and the `n` most likely tokens (descending, ties to the lower id).
float token_logprob(std::span<const float> logits, int32_t token);
std::vector<TokenLogprob> top_logprobs(std::span<const float> logits, int n);
// Both at once (one log-sum-exp): `token` with its logprob and `top` exactly as token_logprob / top_logprobs give
// them. For every sampled token's logprobs and every scored prompt row.
TokenChoice score_token(std::span<const float> logits, int32_t token, int n);

// Applies the penalties of `p` in place. `seen` = distinct tokens of context + generated (for the
// repetition penalty); `counts` = occurrences of each generated token.
void apply_penalties(std::span<float> logits, const SamplingParams& p, std::span<const int32_t> seen,
                     const std::unordered_map<int32_t, int>& counts);

// The tokens step 3 keeps (after temperature / top-k / top-p / min-p) with their normalised
// probabilities, most likely first (ties to the lower id); tokens whose logit is -inf (masked) are never
// kept. Exposed for tests and the CUDA helper.
struct Candidate {
  int32_t token;
  float prob;
};
std::vector<Candidate> truncated_distribution(std::span<const float> logits, const SamplingParams& p);

// The two rows that have no choice (the header comment): the errors every backend's sampler throws for them.
// The constraint (token mask) allows no token of the vocabulary: an InputError (as Session::set_token_mask's).
InputError no_allowed_token_error();
// No allowed token has a logit above -inf (every one is NaN or -inf).
Error no_finite_logit_error();

// Throws lilac::InputError unless every logit_bias entry names a token in [0, vocab) with a bias in [-100, 100]
// (every backend's sampler checks it so).
void check_logit_bias(const SamplingParams& p, int64_t vocab);

class HostSampler {
 public:
  explicit HostSampler(int64_t vocab_size = 0) : vocab_(vocab_size) {}
  // New generation: params, RNG from params.seed, penalty state from `context` (no generated tokens).
  void begin(const SamplingParams& params, std::span<const int32_t> context);
  // Choose from `logits` [vocab] (among the tokens `allowed` allows, when given: ceil(vocab / 32)
  // words) and record the choice as generated (for the penalties).
  TokenChoice sample(std::span<const float> logits, const uint32_t* allowed = nullptr);
  const SamplingParams& params() const { return params_; }

 private:
  int64_t vocab_;
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<int32_t> seen_;      // distinct tokens of context + generated
  std::vector<uint8_t> seen_mask_; // [vocab] membership of seen_
  std::unordered_map<int32_t, int> counts_;
  std::vector<float> work_;
};

}  // namespace lilac
