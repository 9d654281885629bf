// The sampling family (sample.cu): the token choice on the GPU at the end of a decode step, and the
// step's position counter. Conventions: cuda/kernels/api.h.
#pragma once
#include "cuda/kernels/api.h"

namespace lilac::cuda {

// Sampling parameters as the device reads them (a copy of SamplingParams + the step counter).
struct SampleParamsDev {
  float temperature, top_p, min_p, presence, frequency, repetition;
  int top_k, logprobs, top_logprobs;
  unsigned long long seed;
  unsigned long long step;  // advanced on the device after each sample
  // logit_bias (SamplingParams::logit_bias) as a dense row [vocab] added after the penalties, before the
  // temperature (greedy too); null: none. The session's own memory, so a pool's move leaves it valid.
  const float* bias;
};
constexpr int kMaxTopLogprobs = 20;
struct SampleResult {
  int32_t token;
  float logprob;
  int32_t n_top;
  int32_t top_ids[kMaxTopLogprobs];
  float top_lp[kMaxTopLogprobs];
};
// SampleResult::token of a row that has no choice (engine/sampler.h's rule, every backend's): the host throws the
// matching error (CudaSession::to_choice: no_finite_logit_error / no_allowed_token_error). Such a row counts no
// token, its device-side token slots get id 0 (in range for later launches) and its step advances as any row's.
constexpr int32_t kNoFiniteLogit = -1;   // no allowed logit above -inf (every one NaN or -inf)
constexpr int32_t kNoAllowedToken = -2;  // the allowed-token mask allows no token of the vocabulary
size_t sample_scratch_bytes(int64_t vocab);
// Chooses a token from logits [vocab]: penalties (counts [vocab] of generated tokens, prompt_mask
// [vocab] for the repetition penalty) → logit bias (params->bias) → temperature → top-k → top-p → min-p → sample (exact greedy
// argmax, ties to the lower id, when temperature == 0). Writes the token to *token_slot and *result,
// counts[token] += 1, params->step += 1. Logprobs are from log_softmax of the raw logits. A row with no choice:
// kNoFiniteLogit in *result.
void sample_token(const float* logits, int64_t vocab, SampleParamsDev* params, int32_t* counts,
                  const uint8_t* prompt_mask, void* scratch, int32_t* token_slot, SampleResult* result,
                  cudaStream_t stream);

// *p += n (a position counter inside a captured graph: the decode step's, the MTP head's).
void increment_i32(int32_t* p, cudaStream_t stream, int n = 1);

}  // namespace lilac::cuda
