// The Backend interface every backend (cpu/, cuda/) implements, and the Session it creates.
//
// A generation is:
//   s->prefill(prompt);                 // logits of the last prompt position become current
//   s->begin_generation(params, prompt);
//   TokenChoice t = s->sample();        // choose from the current logits (on the device)
//   while (!stop(t)) t = s->decode_step();   // feed t, compute logits, choose the next token
// decode_step() reads the previously chosen token from the backend's own slot (a GPU backend
// never round-trips it through the host); the host only receives copies for streaming.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "model/config.h"

namespace lilac {

struct SamplingParams {
  float temperature = 0.f;  // 0 = exact greedy (argmax, ties to the lower id)
  float top_p = 1.f;        // nucleus
  int top_k = 0;            // 0 = off
  float min_p = 0.f;        // 0 = off
  // OpenAI-style penalties on tokens generated so far (subtract presence + frequency * count).
  float presence_penalty = 0.f, frequency_penalty = 0.f;
  // HF-style multiplicative penalty on tokens in the prompt and the output (1 = off).
  float repetition_penalty = 1.f;
  uint64_t seed = 0;
  bool logprobs = false;  // return the chosen token's log-probability
  int top_logprobs = 0;   // and this many most likely alternatives (0..20)
};

struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0.f;
};

// Log-probabilities are those of the model's raw distribution (log_softmax of the logits,
// before penalties, temperature and truncation).
struct TokenChoice {
  int32_t token = -1;
  float logprob = 0.f;             // when logprobs were requested
  std::vector<TokenLogprob> top;   // top_logprobs alternatives, most likely first
};

// A saved session state (KV length + recurrent + conv state) at some context length.
class SessionSnapshot {
 public:
  virtual ~SessionSnapshot() = default;
  virtual int64_t length() const = 0;  // context length at which it was taken
  virtual size_t bytes() const = 0;    // memory it holds (for cache accounting)
};

// Receives logits of consecutive positions: rows [first_pos, first_pos + n_rows), each vocab_size floats.
using LogitsSink = std::function<void(int64_t first_pos, int64_t n_rows, const float* logits)>;

class Session {
 public:
  virtual ~Session() = default;
  virtual int64_t length() const = 0;      // tokens in the context so far
  virtual int64_t max_length() const = 0;  // capacity given at creation

  // Append `tokens` to the context and run the model over them (in bounded-size chunks).
  // Afterwards the last position's logits are current. If `sink` is given, it receives every
  // position's logits, chunk by chunk (never a [n x vocab] buffer for the whole prompt).
  // Throws lilac::InputError for ids outside the vocabulary or when max_length would be exceeded.
  virtual void prefill(std::span<const int32_t> tokens, const LogitsSink* sink = nullptr) = 0;

  // Reset the sampler for a new generation: RNG from params.seed, penalty counts. `context` is what
  // repetition_penalty sees besides the generated tokens (normally the prompt).
  virtual void begin_generation(const SamplingParams& params, std::span<const int32_t> context) = 0;
  // Choose the next token from the current logits; the backend keeps it as the next input.
  virtual TokenChoice sample() = 0;
  // Feed the last chosen token through the model; its logits become current.
  virtual void advance() = 0;
  // One decode step: advance() then sample() (a GPU backend runs this as one graph replay).
  virtual TokenChoice decode_step() {
    advance();
    return sample();
  }

  // Host copy of the current logits [vocab] (tests, check-golden).
  virtual std::vector<float> logits() = 0;

  virtual std::shared_ptr<const SessionSnapshot> snapshot() = 0;
  // Restore a snapshot taken from a session of the same backend and model (else throws).
  virtual void restore(const SessionSnapshot& snap) = 0;
  // Back to an empty context.
  virtual void reset() = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;  // "cpu", "cuda", ...
  virtual const ModelConfig& config() const = 0;
  virtual std::unique_ptr<Session> new_session(int64_t max_length) = 0;
  // Human-readable device description for logs (e.g. "NVIDIA H200, 132 SMs").
  virtual std::string describe() const { return name(); }
};

}  // namespace lilac
