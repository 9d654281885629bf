#include "server/scheduler.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "core/error.h"
#include "core/log.h"
#include "engine/backend.h"
#include "engine/sequence.h"
#include "server/metrics.h"
#include "text/tokenizer.h"

namespace lilac::server {

void Job::push(JobEvent ev) {
  {
    std::lock_guard lk(mu_);
    events_.push_back(std::move(ev));
  }
  cv_.notify_one();
}

bool Job::pop_all(std::vector<JobEvent>& out, std::chrono::milliseconds timeout) {
  std::unique_lock lk(mu_);
  if (!cv_.wait_for(lk, timeout, [&] { return !events_.empty(); })) return false;
  while (!events_.empty()) {
    out.push_back(std::move(events_.front()));
    events_.pop_front();
  }
  return true;
}

// One session of the pool and the generation running on it (if any).
struct Scheduler::Slot {
  std::unique_ptr<Session> session;
  std::unique_ptr<Generator> gen;
  std::shared_ptr<Job> job;
  std::unique_ptr<Sequence> seq;
  uint64_t tick = 0;  // when it was admitted (prefill order) or released (LRU)
  uint64_t ready_tick = 0;     // ticks_ when its prefill ended (burst_prefill)
  bool decoding = false;       // it has taken a decode step (burst_prefill holds only before the first)
  std::optional<JobEvent> error;  // set when a step involving it threw
};

namespace {

JobEvent error_event(std::exception_ptr e) {
  JobEvent ev;
  ev.kind = JobEvent::Error;
  try {
    std::rethrow_exception(e);
  } catch (const InputError& x) {
    ev.status = 400;
    ev.message = x.what();
  } catch (const std::exception& x) {
    ev.message = std::string("internal error: ") + x.what();
    LILAC_LOG_ERROR("generation failed: %s", x.what());
  } catch (...) {
    ev.message = "internal error";
    LILAC_LOG_ERROR("generation failed with an unknown exception");
  }
  return ev;
}

}  // namespace

int Scheduler::pool_size(const Backend& backend, const SchedulerOptions& o) {
  if (o.max_batch < 0) throw InputError("--max-batch must be at least 1");
  if (o.seq_memory_bytes < 0) throw InputError("--seq-memory-gb must be >= 0");
  const size_t per = backend.session_bytes(o.max_seq);
  int by_budget = 0;
  if (o.seq_memory_bytes > 0 && per > 0) {
    const double n = std::floor(o.seq_memory_bytes / double(per));
    if (n < 1)
      throw InputError("--seq-memory-gb: " + std::to_string(o.seq_memory_bytes / 1e9) +
                       " GB does not hold one session of " + std::to_string(o.max_seq) + " tokens (" +
                       std::to_string(double(per) / 1e9) + " GB each); lower --max-seq or raise the budget");
    by_budget = int(std::min(n, 4096.0));
  }
  if (o.max_batch > 0) return by_budget > 0 ? std::min(o.max_batch, by_budget) : o.max_batch;
  if (by_budget > 0) return by_budget;
  return std::max(1, backend.default_sessions(o.max_seq));
}

Scheduler::Scheduler(std::shared_ptr<Backend> backend, std::shared_ptr<const Tokenizer> tokenizer,
                     SchedulerOptions opts, Metrics* metrics)
    : backend_(std::move(backend)), tok_(std::move(tokenizer)), opts_(opts), metrics_(metrics),
      cache_(opts.cache_bytes) {
  const int n = pool_size(*backend_, opts_);
  backend_->reserve_sessions(n, opts_.max_seq);
  for (int i = 0; i < n; ++i) {
    auto slot = std::make_unique<Slot>();
    try {
      slot->session = backend_->new_session(opts_.max_seq);
    } catch (const std::exception& e) {
      if (i == 0) throw;  // not even one session: the server cannot serve
      LILAC_LOG_WARN("session pool: only %d of %d sessions could be created (%s)", i, n, e.what());
      break;
    }
    slot->gen = std::make_unique<Generator>(*slot->session, *tok_, &cache_);
    slots_.push_back(std::move(slot));
  }
  if (metrics_) {
    metrics_->pool_capacity = int64_t(slots_.size());
    metrics_->running = 0;
  }
  thread_ = std::thread([this] { worker(); });
}

Scheduler::~Scheduler() { stop(); }

void Scheduler::stop() {
  {
    std::lock_guard lk(mu_);
    if (stop_) return;
    stop_ = true;
    for (auto& j : queue_) j->cancel = true;
    for (auto& j : running_) j->cancel = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool Scheduler::submit(std::shared_ptr<Job> job) {
  {
    std::lock_guard lk(mu_);
    if (stop_ || depth_.load() >= opts_.max_queue) return false;
    ++depth_;
    queue_.push_back(std::move(job));
  }
  if (metrics_) metrics_->queue_depth = depth_.load();
  cv_.notify_one();
  return true;
}

bool Scheduler::submit_all(const std::vector<std::shared_ptr<Job>>& jobs) {
  {
    std::lock_guard lk(mu_);
    if (stop_ || depth_.load() + int(jobs.size()) > opts_.max_queue) return false;
    depth_ += int(jobs.size());
    for (auto& j : jobs) queue_.push_back(j);
  }
  if (metrics_) metrics_->queue_depth = depth_.load();
  cv_.notify_one();
  return true;
}

void Scheduler::answer(Job& job, JobEvent done) {
  if (metrics_ && done.kind == JobEvent::Done) {
    auto& s = done.stats;
    if (s.finish == FinishReason::Cancelled) metrics_->cancelled++;
    if (s.completion_tokens > 0 || s.finish != FinishReason::Cancelled)
      metrics_->add_generation(s.prompt_tokens, s.cached_tokens, s.completion_tokens, s.prefill_seconds,
                               s.decode_seconds, s.cache_hit);
    if (job.req.draft_tokens > 0)
      metrics_->add_speculation(s.decode_steps, s.spec_rounds, s.spec_drafted, s.spec_accepted);
  }
  if (metrics_) {
    metrics_->cache_entries = int64_t(cache_.entries());
    metrics_->cache_bytes = int64_t(cache_.bytes());
  }
  // Leave the queue before answering, so a client that got its answer sees the depth without it.
  --depth_;
  if (metrics_) metrics_->queue_depth = depth_.load();
  job.push(std::move(done));
}

void Scheduler::admit(std::shared_ptr<Job> job) {
  if (job->cancel.load()) {
    JobEvent done;
    done.kind = JobEvent::Done;
    done.stats.finish = FinishReason::Cancelled;
    answer(*job, std::move(done));
    return;
  }
  // The free session whose own context saves the most prefill, else the least recently used one.
  Slot* best = nullptr;
  int64_t best_reuse = -1;
  for (auto& s : slots_) {
    if (s->seq) continue;
    const int64_t reuse = s->gen->reusable_prefix(job->req.prompt, job->req.boundary_token, opts_.prefill_chunk);
    if (reuse > best_reuse || (reuse == best_reuse && s->tick < best->tick)) {
      best = s.get();
      best_reuse = reuse;
    }
  }
  if (!best) {  // cannot happen (the worker admits at most as many jobs as there are free sessions)
    answer(*job, error_event(std::make_exception_ptr(Error("scheduler: no free session for an admitted job"))));
    return;
  }
  job->started = true;
  best->gen->set_draft_hook(opts_.draft_hook ? opts_.draft_hook(job->req) : DraftHook{});
  GenerationRequest req = job->req;
  req.prefill_chunk = opts_.prefill_chunk;
  Job* j = job.get();
  TokenCallback on_token = [j](const GeneratedToken& t) {
    if (j->cancel.load(std::memory_order_relaxed)) return false;
    JobEvent ev;
    ev.kind = JobEvent::Token;
    ev.token = t;
    j->push(std::move(ev));
    return true;
  };
  if (req.prompt_logprobs >= 0)
    req.on_prompt_logprobs = [j](std::vector<TokenChoice>&& scores) {
      JobEvent ev;
      ev.kind = JobEvent::PromptScores;
      ev.prompt_scores = std::move(scores);
      j->push(std::move(ev));
    };
  try {
    best->seq = best->gen->start(std::move(req), std::move(on_token), &j->cancel);
  } catch (...) {
    answer(*job, error_event(std::current_exception()));
    return;
  }
  best->job = job;
  best->tick = ++ticks_;
  best->ready_tick = 0;
  best->decoding = false;
  best->error.reset();
  ++in_use_;
  std::lock_guard lk(mu_);
  running_.push_back(std::move(job));
}

void Scheduler::fail(Slot& s, std::exception_ptr e) {
  s.seq->abort();  // done: retire_done() answers with the error and frees the session
  s.error = error_event(e);
}

// Whether s (prefill ended, no decode step yet) waits: some sequence admitted before s's prefill ended is still
// prefilling (admitted after s, as the prefill goes oldest first, but before s was ready), and s is not cancelled.
bool Scheduler::burst_held(const Slot& s) const {
  if (!opts_.burst_prefill || (s.job && s.job->cancel.load())) return false;
  for (const auto& p : slots_)
    if (p->seq && p->seq->phase() == Sequence::Phase::Prefill && p->tick <= s.ready_tick) return true;
  return false;
}

bool Scheduler::step() {
  // At most one prefill step: the oldest sequence still prefilling. The others waiting for theirs end now if their
  // clients went away (their slots free at this step's end, not after the oldest's whole prompt).
  Slot* pre = nullptr;
  for (auto& s : slots_)
    if (s->seq && s->seq->phase() == Sequence::Phase::Prefill && (!pre || s->tick < pre->tick)) pre = s.get();
  for (auto& s : slots_)
    if (s->seq && s.get() != pre) s->seq->cancel_if_requested();
  if (pre) {
    try {
      pre->seq->prefill_step();
    } catch (...) {
      fail(*pre, std::current_exception());
    }
    if (pre->seq->phase() != Sequence::Phase::Prefill) pre->ready_tick = ticks_;
  }
  // One decode step for every sequence in its decode phase (including one whose prefill just ended), but a
  // burst's sequences wait for the burst's prefill (burst_prefill: the header).
  // Above spec_max_batch decoding sequences none drafts: they all step in the batch.
  std::vector<Slot*> decoding, batch, alone;
  int64_t held = 0;
  for (auto& s : slots_) {
    if (!s->seq || s->seq->phase() != Sequence::Phase::Decode) continue;
    if (!s->decoding && burst_held(*s)) {
      ++held;
      continue;
    }
    s->decoding = true;
    decoding.push_back(s.get());
  }
  const bool may_draft = int64_t(decoding.size()) <= int64_t(opts_.spec_max_batch);
  int64_t suppressed = 0;
  for (Slot* s : decoding) {
    if (s->seq->draft_budget() > 0) {
      if (may_draft) {
        alone.push_back(s);
        continue;
      }
      s->seq->suppress_drafts();
      ++suppressed;
    }
    // prepare_step sets the constraint's mask: a grammar that cannot be followed (too many parses at once) throws
    // here, and that fails this sequence only (it once escaped the worker thread: std::terminate).
    try {
      if (s->seq->prepare_step()) batch.push_back(s);
    } catch (...) {
      fail(*s, std::current_exception());
    }
  }
  const size_t group = size_t(std::max(1, backend_->max_batch()));
  for (size_t g0 = 0; g0 < batch.size(); g0 += group) {
    const size_t g1 = std::min(batch.size(), g0 + group);
    std::vector<Session*> sessions;
    for (size_t i = g0; i < g1; ++i) sessions.push_back(&batch[i]->seq->session());
    std::vector<TokenChoice> choices;
    try {
      choices = backend_->decode_batch(sessions);
      if (choices.size() != sessions.size()) throw Error("decode_batch returned a wrong number of choices");
    } catch (...) {
      for (size_t i = g0; i < g1; ++i) fail(*batch[i], std::current_exception());
      continue;
    }
    for (size_t i = g0; i < g1; ++i) {
      try {  // a row's own error (TokenChoice::error) is rethrown here: that sequence fails, the others go on
        batch[i]->seq->consume(std::span<const TokenChoice>(&choices[i - g0], 1));
      } catch (...) {
        fail(*batch[i], std::current_exception());
      }
    }
  }
  for (Slot* s : alone) {
    try {
      s->seq->decode_alone();
    } catch (...) {
      fail(*s, std::current_exception());
    }
  }
  if (metrics_) metrics_->observe_step(int64_t(batch.size() + alone.size()), pre != nullptr, suppressed, held);
  return pre || !batch.empty() || !alone.empty();
}

void Scheduler::retire_done() {
  for (auto& s : slots_) {
    if (!s->seq || !s->seq->done()) continue;
    std::shared_ptr<Job> job = std::move(s->job);
    JobEvent done;
    if (s->error) {
      done = std::move(*s->error);
      s->error.reset();
    } else {
      done.kind = JobEvent::Done;
      done.stats = s->seq->stats();
    }
    s->seq.reset();
    s->tick = ++ticks_;
    --in_use_;
    if (metrics_) metrics_->running = in_use_.load();
    {
      std::lock_guard lk(mu_);
      running_.erase(std::find(running_.begin(), running_.end(), job));
    }
    answer(*job, std::move(done));
  }
  if (metrics_) metrics_->running = in_use_.load();
}

void Scheduler::worker() {
  std::vector<std::shared_ptr<Job>> admitted, dropped;
  for (;;) {
    admitted.clear();
    dropped.clear();
    {
      std::unique_lock lk(mu_);
      const size_t cap = slots_.size();
      cv_.wait(lk, [&] {
        return stop_ || in_use_.load() > 0 || (!queue_.empty() && size_t(in_use_.load()) < cap);
      });
      if (stop_ && in_use_.load() == 0 && queue_.empty()) return;
      // Jobs whose client left while they waited are answered now, not when a session frees up.
      for (auto it = queue_.begin(); it != queue_.end();) {
        if (stop_) (*it)->cancel = true;
        if ((*it)->cancel.load()) {
          dropped.push_back(std::move(*it));
          it = queue_.erase(it);
        } else {
          ++it;
        }
      }
      while (!queue_.empty() && size_t(in_use_.load()) + admitted.size() < cap) {
        admitted.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
    }
    for (auto& j : dropped) admit(std::move(j));  // answers Cancelled
    for (auto& j : admitted) admit(std::move(j));
    if (metrics_) metrics_->running = in_use_.load();
    step();
    retire_done();
  }
}

}  // namespace lilac::server
