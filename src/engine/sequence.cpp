#include "engine/sequence.h"

#include <algorithm>

#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/sampler.h"

namespace lilac {

namespace {
// The prompt scores' rows (Sequence::prefill_call), one pool for the process: the backends' own pools are idle
// while their logits are scored.
ThreadPool& scoring_pool() {
  static ThreadPool pool(0);
  return pool;
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}
}  // namespace

Sequence::Sequence(Generator& gen, GenerationRequest req, TokenCallback on_token, const std::atomic<bool>* cancel)
    : gen_(gen), req_(std::move(req)), on_token_(std::move(on_token)), cancel_(cancel),
      detok_(gen.tok_, req_.stop_strings, false), t0_(Clock::now()) {
  st_.prompt_tokens = int64_t(req_.prompt.size());
  req_.sampling = effective_sampling(req_.sampling);  // every backend's sampler sees the same temperature
}

void Sequence::begin_prefill() {
  pos_ = gen_.prepare(req_, st_);
  st_.cached_tokens = pos_;
  // Segment ends: message boundaries after the restored part, and the end of the prompt.
  const auto& p = req_.prompt;
  if (req_.boundary_token >= 0)
    for (int64_t i = pos_; i + 1 < int64_t(p.size()); ++i)
      if (p[size_t(i)] == req_.boundary_token) ends_.push_back(i + 1);
  ends_.push_back(int64_t(p.size()));
  started_ = true;
}

void Sequence::prefill_call(int64_t n) {
  const auto& p = req_.prompt;
  gen_.context_valid_ = false;  // in case prefill throws half-way
  const std::span<const int32_t> piece(p.data() + pos_, size_t(n));
  if (req_.prompt_logprobs >= 0) {
    // Row j (the logits after prompt token j) scores token j + 1; the last row is the first choice's.
    const int64_t V = gen_.s_.vocab_size();
    if (V <= 0) throw InputError("this backend cannot score a prompt (no logits of its positions)");
    const LogitsSink sink = [this, &p, V](int64_t first, int64_t rows, const float* logits) {
      if (first != int64_t(prompt_lp_.size())) throw Error("Sequence: prompt logits out of order");
      const int64_t scored = std::clamp<int64_t>(int64_t(p.size()) - 1 - first, 0, rows);  // not the last row
      prompt_lp_.resize(size_t(first + scored));
      // Rows are independent (~1.3 ms each at a 248K vocabulary): scored on the idle cores.
      parallel_for(&scoring_pool(), scored, [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r)
          prompt_lp_[size_t(first + r)] = score_token(std::span<const float>(logits + r * V, size_t(V)),
                                                      p[size_t(first + r + 1)], req_.prompt_logprobs);
      }, 2);
    };
    gen_.s_.prefill(piece, &sink);
  } else {
    gen_.s_.prefill(piece);
  }
  gen_.context_.insert(gen_.context_.end(), p.begin() + pos_, p.begin() + pos_ + n);
  gen_.context_valid_ = true;
  pos_ += n;
}

bool Sequence::cancel_if_requested() {
  if (phase_ != Phase::Prefill || !cancelled()) return false;
  gen_.context_valid_ = false;
  st_.prefill_seconds = seconds_since(t0_);
  finish(FinishReason::Cancelled);
  return true;
}

int64_t Sequence::prefill_step() {
  if (phase_ != Phase::Prefill) throw Error("Sequence::prefill_step: not in the prefill phase");
  try {
    if (!started_) begin_prefill();
    if (cancel_if_requested()) return 0;
    const auto& p = req_.prompt;
    const int64_t chunk = std::max<int64_t>(1, req_.prefill_chunk);
    int64_t computed = 0;
    while (pos_ < int64_t(p.size())) {
      const int64_t end = ends_[next_end_];
      const int64_t n = std::min(chunk, end - pos_);
      if (computed > 0 && computed + n > chunk) break;
      prefill_call(n);
      computed += n;
      if (pos_ == end) ++next_end_;
      // Snapshots where a later prompt holding this prefix may resume bit for bit (exact_resume_point): every
      // segment end after a boundary token, and the last piece boundary before the end of the prompt (a prompt
      // that extends this one resumes there). The prompt's own end is such a point only by coincidence.
      const bool last_piece = end == int64_t(p.size()) && pos_ < end && end - pos_ <= chunk;
      if (gen_.cache_ && req_.use_cache && (pos_ == end || last_piece) &&
          exact_resume_point(p, pos_, req_.boundary_token, chunk)) {
        std::span<const int32_t> prefix(p.data(), size_t(pos_));
        if (!gen_.cache_->contains(prefix)) {
          gen_.cache_->insert(prefix, gen_.s_.snapshot());
          ++st_.snapshots_taken;
        }
      }
    }
    if (pos_ == int64_t(p.size())) prompt_done();
    return computed;
  } catch (...) {
    abort();
    throw;
  }
}

void Sequence::prompt_done() {
  if (req_.prompt_logprobs >= 0 && req_.on_prompt_logprobs) req_.on_prompt_logprobs(std::move(prompt_lp_));
  prompt_lp_.clear();
  if (req_.max_tokens > 0) return first_choice();
  st_.prefill_seconds = seconds_since(t0_);  // scoring only: nothing to generate
  finish(FinishReason::Length);
}

void Sequence::set_mask() {
  if (req_.constraint) gen_.s_.set_token_mask(req_.constraint->allowed());
}

void Sequence::first_choice() {
  st_.prefill_seconds = seconds_since(t0_);
  t1_ = Clock::now();
  phase_ = Phase::Decode;
  gen_.s_.begin_generation(req_.sampling, req_.prompt);
  set_mask();
  TokenChoice t = gen_.s_.sample();
  st_.ttft_seconds = seconds_since(t0_);
  st_.completion_tokens = 1;
  accept(std::move(t));
}

bool Sequence::accept(TokenChoice c) {
  if (cancelled()) {
    finish(FinishReason::Cancelled);
    return false;
  }
  if (req_.constraint) req_.constraint->accept(c.token);
  if (std::find(req_.stop_ids.begin(), req_.stop_ids.end(), c.token) != req_.stop_ids.end()) {
    st_.stopped_by_eos = true;
    finish(FinishReason::Stop);
    return false;
  }
  GeneratedToken g;
  g.id = c.token;
  g.text = detok_.push(c.token);
  g.choice = std::move(c);
  if (!on_token_(g)) {
    finish(FinishReason::Cancelled);
    return false;
  }
  if (detok_.stopped()) {
    st_.stop_string = detok_.matched_stop();
    finish(FinishReason::Stop);
    return false;
  }
  if (st_.completion_tokens >= req_.max_tokens) {
    finish(FinishReason::Length);
    return false;
  }
  pending_ = g.id;
  return true;
}

void Sequence::finish(FinishReason r) {
  st_.finish = r;
  if (phase_ == Phase::Decode) {
    if (r != FinishReason::Cancelled && !detok_.stopped()) {
      GeneratedToken g;
      g.text = detok_.finish();
      if (!g.text.empty()) on_token_(g);
    }
    st_.decode_seconds = seconds_since(t1_);
  }
  phase_ = Phase::Done;
}

bool Sequence::prepare_step() {
  if (phase_ != Phase::Decode) throw Error("Sequence::prepare_step: not in the decode phase");
  if (cancelled()) {
    finish(FinishReason::Cancelled);
    return false;
  }
  set_mask();
  gen_.context_valid_ = false;  // the step changes the session
  return true;
}

int Sequence::draft_budget() const {
  if (req_.draft_tokens <= 0 || phase_ != Phase::Decode || (!gen_.s_.can_draft() && !gen_.hook_)) return 0;
  int64_t room = req_.max_tokens - st_.completion_tokens - 1;
  // A verify's choices are made inside the backend, only the first one masked: all of them must be free.
  if (req_.constraint) room = std::min(room, req_.constraint->free_choices() - 1);
  const int k = std::min(gen_.policy_.choose(), req_.draft_tokens);
  return int(std::clamp<int64_t>(room, 0, k));
}

void Sequence::consume(std::span<const TokenChoice> choices) {
  if (phase_ != Phase::Decode) throw Error("Sequence::consume: not in the decode phase");
  if (choices.empty()) throw Error("Sequence::consume: a step made no choice");
  // A choice with an error (a batched step that failed for this sequence alone, Backend::decode_batch; a verify's row
  // with no choice, Session::verify) ends the step: the choices before it count, then it is rethrown.
  size_t n = 0;
  while (n < choices.size() && !choices[n].error) ++n;
  if (n == 0) std::rethrow_exception(choices[0].error);  // nothing changed
  const bool failed = n < choices.size();
  // The session fed the pending token and every choice but the last (after a failed row: every choice before it).
  auto& ctx = gen_.context_;
  ctx.push_back(pending_);
  for (size_t i = 0; i < (failed ? n : n - 1); ++i) ctx.push_back(choices[i].token);
  gen_.context_valid_ = true;
  gen_.context_prefilled_ = false;  // decode steps fed these: a later prompt does not resume from them
  ++st_.decode_steps;
  if (!step_reported_) {  // a driver's (batched) step
    if (step_suppressed_)
      gen_.policy_.on_suppressed();
    else
      gen_.policy_.on_plain(-1);
  }
  step_reported_ = step_suppressed_ = false;
  for (const TokenChoice& c : choices.first(n)) {
    ++st_.completion_tokens;
    if (!accept(c)) return;  // ended before the failed row, as decode steps one by one would have
  }
  if (failed) std::rethrow_exception(choices[n].error);
}

void Sequence::suppress_drafts() {
  if (phase_ != Phase::Decode || step_suppressed_) return;
  step_suppressed_ = true;
  ++st_.spec_suppressed;
}

void Sequence::decode_alone() {
  try {
    if (!prepare_step()) return;
    SpecPolicy& policy = gen_.policy_;
    const std::function<double()> clock = [&policy] { return policy.now(); };
    if (const int k = draft_budget(); k > 0) {
      SpecStats spec;
      SpecRound round;
      const std::vector<TokenChoice> choices =
          speculative_step(gen_.s_, k, st_.completion_tokens - 1, req_.stop_ids, gen_.hook_, spec, &round, &clock);
      st_.spec_rounds += spec.rounds;
      st_.spec_drafted += spec.drafted;
      st_.spec_accepted += spec.accepted;
      if (round.drafted > 0)
        policy.on_round(round.drafted, round.accepted, round.draft_seconds, round.verify_seconds);
      else
        policy.on_plain(round.plain_seconds);
      step_reported_ = true;
      consume(choices);
    } else {
      const double t0 = clock();
      const TokenChoice c = gen_.s_.decode_step();
      policy.on_plain(clock() - t0);
      step_reported_ = true;
      consume(std::span<const TokenChoice>(&c, 1));
    }
  } catch (...) {
    abort();
    throw;
  }
}

void Sequence::abort() noexcept {
  gen_.context_valid_ = false;
  gen_.context_.clear();
  try {
    gen_.s_.reset();
  } catch (...) {
  }
  phase_ = Phase::Done;
}

void Sequence::run_to_end() {
  while (phase_ == Phase::Prefill) prefill_step();
  while (phase_ == Phase::Decode) decode_alone();
}

}  // namespace lilac
