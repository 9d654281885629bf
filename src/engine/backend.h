// The Backend interface every backend (cpu/, cuda/) implements, and the Session it creates.
//
// A generation is:
//   s->prefill(prompt);                 // logits of the last prompt position become current
//   s->begin_generation(params, prompt);
//   TokenChoice t = s->sample();        // choose from the current logits (on the device)
//   while (!stop(t)) t = s->decode_step();   // feed t, compute logits, choose the next token
// decode_step() reads the previously chosen token from the backend's own slot (a GPU backend
// never round-trips it through the host); the host only receives copies for streaming.
//
// Several sessions at once (continuous batching): Backend::decode_batch(sessions) is one decode step
// for each of them, with exactly the result s->decode_step() would give for each alone (token for
// token, logits bit for bit: every backend's kernels are batch-invariant: a row's arithmetic never
// depends on which other rows share the step). The default implementation is that loop; backends
// override it to read each weight once for the whole batch. The single-sequence path stays as it is.
// The server keeps a pool of sessions created at start (session_bytes / default_sessions size it) and
// steps every generation in its decode phase together (src/server/scheduler.h).
//
// Speculative decoding (the model's MTP head, ../shared/MODEL_MTP.md): enable_drafting(true) on an empty
// session makes it keep the head's cache in step with the context; draft() proposes up to k tokens after
// the pending one; verify(drafts) feeds the pending token plus the drafts as one multi-row step, chooses
// tokens row by row with the session's sampler, and leaves the state as if the accepted tokens had been
// decoded one by one with decode_step() (rolled back past the first rejected draft). verify() needs no
// MTP head: drafts may come from anywhere (tests inject them). decode_batch() feeds a drafting session's
// head as its decode_step() would, so the session can draft after batched steps.
//
// Constrained decoding: set_token_mask() restricts the choices of the next sample() / decode_step()
// (and of decode_batch) to the allowed tokens.
#pragma once
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "model/config.h"

namespace lilac {

struct SamplingParams {
  float temperature = 0.f;  // 0 = exact greedy (argmax, ties to the lower id); see kMinTemperature
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
  // OpenAI's logit_bias: (token, bias in [-100, 100]) added to the token's logit after the penalties, before
  // temperature and truncation (greedy too: a bias of -100 in practice bans a token, +100 forces it). Logprobs stay
  // the raw distribution's. Backend::supports_logit_bias() says whether a backend applies it.
  std::vector<std::pair<int32_t, float>> logit_bias;
};

// Temperatures below this are greedy (their limit): 1 / t is not finite in float below ~2.9e-39, and the GPU samplers
// scale logits by it in float (|logit| / t overflows long before). Applied where a generation starts (Sequence,
// HostSampler::begin).
constexpr float kMinTemperature = 1e-30f;
inline SamplingParams effective_sampling(SamplingParams p) {
  if (p.temperature > 0.f && p.temperature < kMinTemperature) p.temperature = 0.f;
  return p;
}

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
  // Backend::decode_batch and Session::verify only: this session's step (a verify: this row) failed on its own (its
  // sampler found no choice, say), and the other fields mean nothing. Its generation fails with this error after the
  // choices before it (Sequence::consume rethrows it); the other sessions' choices of the batch stand.
  std::exception_ptr error;
};

// decode_batch's step of one session: its choice, or, when the step throws, a choice carrying the error.
template <typename Step>
TokenChoice choice_or_error(Step&& step) {
  try {
    return step();
  } catch (...) {
    TokenChoice c;
    c.error = std::current_exception();
    return c;
  }
}

// The error of the first of `choices` that failed (Backend::decode_batch, Session::verify rows), rethrown; nothing
// when every row has its choice. For drivers that take a verify's rows whole, as the decode step that throws there
// would end them (Sequence::consume keeps the rows before the failed one instead).
inline void rethrow_choice_error(const std::vector<TokenChoice>& choices) {
  for (const TokenChoice& c : choices)
    if (c.error) std::rethrow_exception(c.error);
}

// A saved session state (KV length + recurrent + conv state) at some context length.
class SessionSnapshot {
 public:
  virtual ~SessionSnapshot() = default;
  virtual int64_t length() const = 0;  // context length at which it was taken
  virtual size_t bytes() const = 0;    // memory it holds (for cache accounting)
};

// What speculative decoding costs on a backend, in plain decode steps: the adaptive draft policy's prior
// (engine/spec_policy.h) until it has timed them. The default is a compute-bound backend's (the CPU
// reference: verifying m rows costs about m steps, a draft about half a step).
struct SpecCostHint {
  double draft = 0.5;       // one draft token from the MTP head
  double verify_row = 1.0;  // each row of a verify beyond the first (m rows: 1 + (m - 1) * verify_row)
};

// Receives logits of consecutive positions: rows [first_pos, first_pos + n_rows), each vocab_size floats.
using LogitsSink = std::function<void(int64_t first_pos, int64_t n_rows, const float* logits)>;

class Session {
 public:
  virtual ~Session() = default;
  virtual int64_t length() const = 0;      // tokens in the context so far
  virtual int64_t max_length() const = 0;  // capacity given at creation
  // Floats per row of logits (the model's vocabulary); 0: unknown (the session cannot score a prompt:
  // GenerationRequest::prompt_logprobs).
  virtual int64_t vocab_size() const { return 0; }

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

  // ---- constrained decoding
  // Allowed tokens for the next choice only: `bits` holds ceil(vocab/32) words, bit (t % 32) of word
  // t / 32 set = token t allowed; nullptr = no constraint. The mask applies before penalties and
  // temperature; logprobs stay those of the raw distribution. A mask that allows no token fails that choice
  // (engine/sampler.h: no_allowed_token_error; a backend may refuse the mask itself with it).
  virtual void set_token_mask(const uint32_t* bits) {
    if (bits) throw Error("this backend does not support token masks");
  }

  // ---- speculative decoding with the model's MTP head
  // Whether draft() is available (the checkpoint has an MTP head and the backend implements it).
  virtual bool can_draft() const { return false; }
  // Keep the MTP head's own KV cache in step with the context from now on (it costs about one more
  // decoder layer per token, run in multi-row passes; off by default). Turn it on while the context is
  // empty (after creation or reset()): turned on over a context it did not follow, draft() returns
  // nothing until reset(). Snapshots taken while it is on carry the head's cache; restoring one taken
  // while it was off leaves draft() empty for that context. No-op without an MTP head.
  virtual void enable_drafting(bool on) { (void)on; }
  // Up to k greedy draft tokens (argmax of the head's logits) that follow the pending (sampled, not yet
  // fed) token; fewer near the context limit (a verify of the result always fits), none when drafting is
  // off or out of step. Does not change what decode_step() / verify() compute.
  virtual std::vector<int32_t> draft(int k) {
    (void)k;
    return {};
  }
  // Draft only among token ids < n (n <= 0 or >= the vocabulary: all, the default): the head's LM head then computes
  // n rows for a draft instead of the whole vocabulary (~290 MB of the real model's head, most of a draft's bytes).
  // Byte-level BPE vocabularies number tokens in merge order, so low ids are the frequent ones and most accepted
  // drafts lie below a few tens of thousands (the frequency-ranked draft vocabulary of FR-Spec). A token the model
  // would choose past n cannot be drafted, so acceptance can only fall; what verify() outputs does not change.
  virtual void set_draft_vocab(int64_t n) { (void)n; }
  // The ids a draft chooses among for set_draft_vocab(n) with a vocabulary of `vocab` tokens.
  static int64_t draft_rows(int64_t n, int64_t vocab) { return n > 0 && n < vocab ? n : vocab; }
  // Feed the pending token and `drafts` (one multi-row step), then choose tokens row by row: the result
  // holds the choices for the accepted drafts followed by one more (the model's own next token), i.e.
  // 1..drafts.size()+1 choices, exactly those decode_step() would have produced one by one: every row's
  // logits are bit for bit a one-token step's, row i is chosen by the sampler in the state decode_step()
  // would be in (penalties count the rows before it; the same random draw), and draft i is accepted when
  // that choice equals it. Greedy: equal tokens. Sampling: the same tokens as decode_step() for the same
  // seed, which is the rejection-sampling rule for a point-mass proposal (draft d kept with probability
  // p(d), else a draw from p without d), so the output distribution is unchanged. Logprobs are the main
  // model's. Afterwards the session is in the state decode_step() would have left: its length grew by the
  // number of choices and the last choice is pending. A row with no choice (engine/sampler.h) is the last: its
  // TokenChoice carries the sampler's error (TokenChoice::error) after the choices before it, and the session is
  // as after the decode step that throws there (that row fed, no token pending). Drafts must fit the context
  // (else InputError, state unchanged). Do not pass drafts while a token mask is set: the masks of later rows
  // depend on the tokens accepted before them (constrained generation does not speculate). Default: no
  // speculation.
  virtual std::vector<TokenChoice> verify(std::span<const int32_t> drafts) {
    if (!drafts.empty()) throw Error("this backend does not support speculative decoding");
    return {decode_step()};
  }
  // The prior of the adaptive draft policy (SpecCostHint).
  virtual SpecCostHint spec_cost_hint() const { return {}; }
  // Tests and check-golden: receives the logits of every MTP row the head computes from the main model's
  // hiddens -- the pair (h_t, x_{t+1}) at position t, as the golden `mtp_logits` row t -- while drafting
  // (draft-chain rows are not sent). Empty function: off.
  virtual void set_draft_logits_sink(LogitsSink sink) { (void)sink; }
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;  // "cpu", "cuda", ...
  virtual const ModelConfig& config() const = 0;
  virtual std::unique_ptr<Session> new_session(int64_t max_length) = 0;
  // Session::set_draft_vocab(n) for every session created from now on (serve / generate / bench --draft-vocab).
  void set_draft_vocab(int64_t n) { draft_vocab_ = n; }
  int64_t draft_vocab() const { return draft_vocab_; }

  // One decode step for each of `sessions` (all created by this backend, each with a pending token):
  // the same choices as calling decode_step() on each in turn. Backends override it to share the
  // weight reads across the batch. A session whose own step fails (where its decode_step() would throw: its
  // sampler found no choice, say) gets its error in its TokenChoice::error, and the others' choices are
  // delivered. What is wrong with the batch itself (the backends check it: a session of another backend, one
  // twice, one without a pending token or room) throws before any session changes.
  virtual std::vector<TokenChoice> decode_batch(std::span<Session* const> sessions) {
    std::vector<TokenChoice> out;
    out.reserve(sessions.size());
    for (Session* s : sessions) out.push_back(choice_or_error([s] { return s->decode_step(); }));
    return out;
  }
  // Largest batch decode_batch() runs as one step (larger batches are split); 1 = no batching.
  virtual int max_batch() const { return 1; }
  // Whether its sessions apply SamplingParams::logit_bias (the others refuse it: InputError in begin_generation).
  virtual bool supports_logit_bias() const { return false; }

  // ---- sizing the session pool (the server creates its sessions once, at start)
  // Memory one session of capacity max_length holds at its largest (K/V cache, recurrent and conv
  // state, its share of per-step scratch), in bytes; 0 = unknown. The server divides its memory budget
  // (--seq-memory-gb) by it.
  virtual size_t session_bytes(int64_t max_length) const {
    (void)max_length;
    return 0;
  }
  // How many sessions of capacity max_length the server creates when the user gives neither
  // --max-batch nor --seq-memory-gb: what fits the device's free memory (at least 1); 1 = unknown.
  virtual int default_sessions(int64_t max_length) const {
    (void)max_length;
    return 1;
  }
  // Called once before the server creates its n sessions of capacity max_length (the pool sized above): a
  // backend may allocate their state at once (the CUDA backend's slot-strided sequence pools). A hint: it
  // may allocate less (it never throws); new_session() still decides.
  virtual void reserve_sessions(int n, int64_t max_length) {
    (void)n;
    (void)max_length;
  }
  // Human-readable device description for logs (e.g. "NVIDIA H200, 132 SMs").
  virtual std::string describe() const { return name(); }

 protected:
  int64_t draft_vocab_ = 0;  // set_draft_vocab's; new_session() applies it to the sessions that can draft
};

}  // namespace lilac
