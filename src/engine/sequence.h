// One generation as a steppable state machine: a Sequence is one request on one Session (through the
// Generator that owns the Session's context bookkeeping). The single-sequence driver (Generator::run)
// and the continuous-batching scheduler (src/server/scheduler.h) both step it:
//
//   Prefill ──prefill_step()──▶ ... ──▶ Decode ──(prepare_step, a decode step, consume)──▶ ... ──▶ Done
//
// Prefill: prefill_step() runs the next piece of the prompt (at most req.prefill_chunk tokens), so a
//   scheduler can interleave it with other sequences' decode steps. Its first call restores the best
//   starting point (the session's own context or the longest prefix-cache snapshot, at an exact resume point
//   of this prompt: exact_resume_point, generator.h). Pieces end at segment ends (after each boundary token
//   and at the end of the prompt) and every req.prefill_chunk tokens inside a segment; the session is
//   snapshotted into the prefix cache after each boundary and at the last piece boundary before the end.
//   The split points up to an exact resume point depend only on the tokens before it, so the state there is
//   the same bits whether computed or restored. The call that completes the prompt also makes the first
//   choice (begin_generation, then sample()) and consumes it.
// Decode: one step is
//     if (!seq.prepare_step()) → it ended (cancelled); else the constraint mask is set on the session
//     choices = the driver's step: session.decode_step(), or backend.decode_batch(...)[i], or
//               speculative_step(session, seq.draft_budget(), ...) (engine/speculative.h)
//     seq.consume(choices)
//   decode_alone() does exactly that for a sequence stepped on its own.
// consume() takes a step's choices one by one (one from a decode step, several from an MTP verify) and
// applies, per choice and in this order: cancellation, the constraint's accept(), stop ids, the
// detokenizer and the token callback, stop strings, max_tokens.
//
// Hooks for the work that plugs in here:
// - Constrained decoding: GenerationRequest::constraint (TokenConstraint, generator.h). Before every
//   choice (the first sample() and every decode step) the sequence calls
//   session.set_token_mask(constraint->allowed()); after, constraint->accept(token) for each consumed
//   choice. A verify chooses several tokens inside the backend, with only the first one masked, so a
//   constrained sequence speculates only over the choices its constraint leaves free
//   (TokenConstraint::free_choices: a grammar none, a reasoning budget those before it runs out).
// - Speculative decoding (MTP): GenerationRequest::draft_tokens > 0 and session.can_draft() (the
//   Generator turns the session's drafting on; a draft hook, Generator::set_draft_hook, also counts): the
//   driver drafts draft_budget() tokens -- the Generator's SpecPolicy's choice for this step
//   (engine/spec_policy.h), 0 for a plain step -- and verifies them through speculative_step, which also
//   keeps the drafts within the context and before the first stop id (decode_alone() does, and reports
//   what the step did and how long it took to the policy); the scheduler steps a sequence alone, after
//   its batched step, when its draft_budget() > 0, else in the batch (a batched verify is future work);
//   above --spec-max-batch decoding sequences it steps them all in the batch (suppress_drafts()).
//   The policy never changes the tokens: only how many drafts each step checks.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "engine/generator.h"
#include "text/detokenizer.h"

namespace lilac {

class Sequence {
 public:
  enum class Phase { Prefill, Decode, Done };

  Phase phase() const { return phase_; }
  bool done() const { return phase_ == Phase::Done; }
  Session& session() { return gen_.s_; }
  const GenerationRequest& request() const { return req_; }
  // Final once done(); while running, the counts so far.
  const GenerationStats& stats() const { return st_; }
  // Prompt tokens not yet in the session (valid in the Prefill phase after the first prefill_step).
  int64_t prompt_remaining() const { return int64_t(req_.prompt.size()) - pos_; }

  // ---- Prefill phase
  // Cancellation check, then prefill calls (each at most req.prefill_chunk tokens, ending at segment
  // ends) while they fit in req.prefill_chunk tokens together (at least one call). Returns the prompt
  // tokens computed (0 when cancelled, or when the whole prompt was restored from a snapshot).
  int64_t prefill_step();
  // Between prefill steps (a driver that prefills one sequence at a time checks the others): when the client went
  // away, the generation ends as Cancelled at once (true) instead of at its own next prefill step.
  bool cancel_if_requested();

  // ---- Decode phase
  // Before a step: false (and done()) when the generation was cancelled; else sets the constraint's
  // mask for the step's choice.
  bool prepare_step();
  // Tokens the next step may draft and verify (0: a plain decode step): min(the policy's choice (at most
  // req.draft_tokens), what max_tokens leaves), 0 without session.can_draft() (and no draft hook) or with
  // a constraint that does not leave those choices free. The same until the step is consumed.
  int draft_budget() const;
  // The step's choices, in order (see the header comment). The session must have fed the pending token
  // and every choice but the last (a verify's accepted drafts). A step a driver ran (not decode_alone)
  // counts as a plain step, untimed, for the draft policy. A choice carrying an error (TokenChoice::error:
  // decode_batch's step failed for this session; a verify's row had no choice) is rethrown after the choices
  // before it are consumed (before anything changes when it is the first): the driver fails the sequence as if
  // its own step had thrown there.
  void consume(std::span<const TokenChoice> choices);
  // prepare_step + (draft + verify | decode_step) + consume, for a sequence stepped on its own.
  void decode_alone();
  // Before a driver's plain step of a sequence whose draft_budget() is > 0: the driver does not let it
  // draft this step (the scheduler, when more sequences decode than --spec-max-batch). The step is reported
  // to the policy as suppressed (SpecPolicy::on_suppressed: its acceptance and probe schedule do not move),
  // not as a plain step it chose, and counted in stats().spec_suppressed.
  void suppress_drafts();

  // Any phase: the step that involved this sequence threw. The session's state is unknown: it is reset
  // and its context forgotten; the sequence is done (the caller reports the error).
  void abort() noexcept;
  // Generator::run: prefill_step until Decode, then decode_alone until Done (abort() and rethrow on an
  // exception).
  void run_to_end();

 private:
  friend class Generator;
  Sequence(Generator& gen, GenerationRequest req, TokenCallback on_token, const std::atomic<bool>* cancel);

  using Clock = std::chrono::steady_clock;
  bool cancelled() const { return cancel_ && cancel_->load(std::memory_order_relaxed); }
  void begin_prefill();      // restore the best start, compute the segment ends
  void prefill_call(int64_t n);
  void prompt_done();        // the prompt is complete: its scores out, then first_choice (or the end: max_tokens 0)
  void first_choice();       // begin_generation + sample + consume
  void set_mask();
  bool accept(TokenChoice c);  // one choice; false when the sequence ended
  void finish(FinishReason r);

  Generator& gen_;
  GenerationRequest req_;
  TokenCallback on_token_;
  const std::atomic<bool>* cancel_;
  Phase phase_ = Phase::Prefill;
  GenerationStats st_;
  bool started_ = false;            // begin_prefill done
  int64_t pos_ = 0;                 // prompt tokens in the session
  std::vector<int64_t> ends_;       // segment ends still ahead (ascending)
  size_t next_end_ = 0;
  int32_t pending_ = -1;            // the last consumed choice: the next step's input
  bool step_reported_ = false;      // decode_alone told the policy about the step being consumed
  bool step_suppressed_ = false;    // the driver's step being consumed was one without its drafts
  std::vector<TokenChoice> prompt_lp_;  // req.prompt_logprobs >= 0: the prompt's scores so far
  StreamDetokenizer detok_;
  Clock::time_point t0_, t1_;
};

}  // namespace lilac
