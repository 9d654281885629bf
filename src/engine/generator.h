// One generation on a Session: prefill (resuming from the prefix cache), then sample / decode_step
// until an end-of-turn id, a stop string, max_tokens or cancellation; streams detokenized text.
// The loop itself is a steppable state machine, Sequence (engine/sequence.h): Generator::run drives one
// alone; the server's scheduler drives several at once (continuous batching).
// With draft_tokens > 0 and a session that can draft, a sequence's decode steps are speculative ones
// (engine/speculative.h) whose 1..K+1 choices go through the same stop / detokenizer logic one by one:
// the output is the one plain decoding gives (token for token, for greedy and for a sampling seed).
// How many drafts each step makes (0..draft_tokens) is the Generator's SpecPolicy's choice
// (engine/spec_policy.h: adaptive by default, or fixed at draft_tokens).
//
// Prefix reuse: the prompt is prefilled in segments that end at message boundaries (after each
// `boundary_token`, i.e. <|im_end|>) and at the end of the prompt; the session is snapshotted at each
// segment end and the snapshot stored in the PrefixCache. A later prompt resumes from the longest
// cached snapshot (or the session's own context) that is a prefix of it and prefills only the rest.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/prefix_cache.h"
#include "engine/spec_policy.h"
#include "engine/speculative.h"

namespace lilac {

class Tokenizer;
class Sequence;

// Constrained decoding, per generation (e.g. a grammar): consulted around every token choice.
// Called on the thread that steps the sequence.
class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // The allowed tokens of the next choice, as Session::set_token_mask takes them (nullptr: any);
  // valid until the next call.
  virtual const uint32_t* allowed() = 0;
  // The token that was chosen (in order, once per consumed choice, also the end-of-turn id).
  virtual void accept(int32_t token) = 0;
  // How many of the next choices are free whatever they are (allowed() returns nullptr for each): a speculative
  // step may choose that many tokens without a mask (Sequence::draft_budget drafts at most this many minus one).
  // 0: every choice may be masked (no speculation).
  virtual int64_t free_choices() const { return 0; }
};

// Whether the state after the first k tokens of `prompt`, as any earlier prefill of those k tokens left it (a
// prefix-cache snapshot, a session's own context), is bit for bit what a fresh prefill of `prompt` computes there. A
// prefill calls the backend once per piece: segments end after each boundary token and at the prompt's end, and a
// segment is cut into pieces of `chunk` tokens from its start (Sequence::prefill_step). The backends' arithmetic
// depends on how the tokens are split into calls (the Gated DeltaNet's chunked form counts its chunks from a call's
// start; a decode step computes a token in another order than a prefill), so an earlier computation of the k tokens
// is this prompt's only where k is a split point that those k tokens alone decide: right after a boundary token,
// or a whole number of pieces after the segment start before k. (The end of the earlier prompt is not one.)
bool exact_resume_point(std::span<const int32_t> prompt, int64_t k, int32_t boundary_token, int64_t chunk);

struct GenerationRequest {
  std::vector<int32_t> prompt;  // must not be empty
  SamplingParams sampling;
  int64_t max_tokens = 256;                // >= 1 (0 only when scoring the prompt: nothing is generated)
  std::vector<int32_t> stop_ids;           // end-of-turn ids: generation stops, their text is not emitted
  std::vector<std::string> stop_strings;   // generation stops; the text from the stop string on is dropped
  int32_t boundary_token = -1;             // snapshot after each occurrence in the prompt (-1: none)
  bool use_cache = true;
  int64_t prefill_chunk = 2048;            // prefill calls of at most this many tokens (cancel checks;
                                           // Sequence::prefill_step runs at most this many)
  std::shared_ptr<TokenConstraint> constraint;  // null: unconstrained
  int draft_tokens = 0;                    // MTP speculation depth (0: off; used when the session can_draft())
  SpecPolicyKind spec_policy = SpecPolicyKind::Adaptive;  // drafts per step: adaptive (0..draft_tokens) or fixed
  // Scoring the prompt (OpenAI completions' `echo` with `logprobs`): >= 0 computes, for every prompt token after
  // the first, its log-probability under the model given the tokens before it, with this many most likely
  // alternatives (0..20; Session::prefill's logits sink, log_softmax of the raw logits as for generated tokens).
  // They go to on_prompt_logprobs once, when the prompt is in and before the first choice: entry i is prompt
  // token i + 1's. The whole prompt is computed (a restored state has no logits: no prefix reuse; snapshots are
  // still taken for later requests). -1: off.
  int prompt_logprobs = -1;
  std::function<void(std::vector<TokenChoice>&&)> on_prompt_logprobs;
};

enum class FinishReason { Stop, Length, Cancelled };
const char* finish_reason_name(FinishReason r);

// One generated token (id >= 0), or the final flush of held-back text (id == -1, no choice).
struct GeneratedToken {
  int32_t id = -1;
  std::string text;  // text that became safe to emit with this token (may be empty)
  TokenChoice choice;
};

struct GenerationStats {
  FinishReason finish = FinishReason::Stop;
  bool stopped_by_eos = false;
  std::string stop_string;        // the stop string that matched, if any
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;      // prompt tokens restored instead of recomputed
  int64_t completion_tokens = 0;  // sampled tokens (an end-of-turn id counts)
  int snapshots_taken = 0;
  bool cache_hit = false;
  double prefill_seconds = 0, decode_seconds = 0, ttft_seconds = 0;
  int64_t spec_rounds = 0, spec_drafted = 0, spec_accepted = 0;  // speculative steps, drafts, accepted drafts
  int64_t decode_steps = 0;       // decode steps (plain or speculative) after the first choice
  int64_t spec_suppressed = 0;    // decode steps whose drafts the driver did not allow (Sequence::suppress_drafts)
};

// Return false to cancel the generation (e.g. the client went away).
using TokenCallback = std::function<bool(const GeneratedToken&)>;

class Generator {
 public:
  // `cache` may be null (no prefix reuse across sessions; the session's own context is still reused).
  Generator(Session& session, const Tokenizer& tokenizer, PrefixCache* cache);

  // Throws lilac::InputError for prompts that do not fit (prompt + max_tokens > session capacity)
  // or contain ids outside the vocabulary. After an exception the session is reset.
  GenerationStats run(const GenerationRequest& req, const TokenCallback& on_token,
                      const std::atomic<bool>* cancel = nullptr);

  // The same generation as a steppable Sequence (engine/sequence.h), for drivers that interleave
  // several. Checks the request as run() does (throws lilac::InputError; nothing changes then). One
  // sequence at a time per Generator; it must not outlive the Generator.
  std::unique_ptr<Sequence> start(GenerationRequest req, TokenCallback on_token,
                                  const std::atomic<bool>* cancel = nullptr);

  // Tokens the session holds after the last run (its context), or empty when unknown. With speculation
  // it may go past the last emitted token (drafts fed in the step a stop string ended).
  const std::vector<int32_t>& context() const { return context_; }
  // How many leading tokens of `prompt` a generation on this session would not recompute because its
  // own context already holds them (0 when none; the last prompt token is always recomputed): only a context
  // that prefill calls computed (no token a decode step fed) ending at an exact resume point of `prompt`.
  int64_t reusable_prefix(std::span<const int32_t> prompt, int32_t boundary_token, int64_t prefill_chunk) const;
  int64_t reusable_prefix(const GenerationRequest& req) const {
    return reusable_prefix(req.prompt, req.boundary_token, req.prefill_chunk);
  }
  Session& session() { return s_; }

  // Tests and `bench`: replaces the MTP drafts of speculative steps (see DraftHook); also makes sessions
  // without an MTP head speculate.
  void set_draft_hook(DraftHook hook) { hook_ = std::move(hook); }
  // The draft-length policy of this session's sequences (its cost estimates persist across them; each
  // sequence restarts its acceptance estimate). Tests inject options, costs and a clock here.
  SpecPolicy& spec_policy() { return policy_; }

 private:
  friend class Sequence;
  int64_t prepare(const GenerationRequest& req, GenerationStats& st);

  Session& s_;
  const Tokenizer& tok_;
  PrefixCache* cache_;
  std::vector<int32_t> context_;
  bool context_valid_ = false;
  bool context_prefilled_ = true;  // every token of context_ came from prefill calls or a prefill's snapshot
  bool drafting_ = false;  // the session follows the context with its MTP head
  DraftHook hook_;
  SpecPolicy policy_;
};

}  // namespace lilac
