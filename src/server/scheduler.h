// The scheduler: continuous batching of generation jobs. A pool of Sessions is created at start (its
// size: --max-batch, or the memory budget --seq-memory-gb / Backend::session_bytes, or the backend's
// default_sessions). One worker thread owns the backend, the pool and the shared prefix cache; each
// iteration of its loop
//   1. answers jobs cancelled while queued, and admits queued jobs into free sessions (the session
//      whose own context is the longest prefix of the prompt, else the least recently used one);
//   2. runs at most one prefill step of one sequence (the oldest one still prefilling; at most
//      --prefill-chunk prompt tokens), so a long prompt delays the running streams by one chunk at most;
//   3. runs one decode step for every sequence in its decode phase, together through
//      Backend::decode_batch (in groups of Backend::max_batch(); a sequence whose own step fails, its row's
//      TokenChoice::error, fails alone); sequences that speculate (MTP) this
//      step (Sequence::draft_budget() > 0: the draft policy chose drafts) step on their own after it --
//      but only while at most --spec-max-batch sequences decode: above that no sequence drafts that step
//      (Sequence::suppress_drafts), they all go through decode_batch (which keeps their MTP heads fed, so
//      they draft again as soon as the batch is small enough);
//   4. retires the sequences that ended (finished, stopped, cancelled, failed): their Done event is
//      sent and the session is free for the next admission at once.
// Bursts (SchedulerOptions::burst_prefill, `--burst-prefill`, on by default): a sequence whose prefill has
// just ended (its first token is out) takes its first decode step only once the sequences admitted before
// that moment have finished their prefill too, so requests that arrive together are prefilled together and
// then decode together. Without it each of them would decode between the others' chunks, and every one of
// those steps would be an inter-token gap of a chunk's length: with 16 clients arriving at once, ~6 % of all
// gaps (bench/BENCHMARKS.md). With it, each such stream has one long gap (after its first token) instead of
// many. A stream that is already decoding is never held: it still waits for one chunk at most. A cancelled
// sequence is not held.
// Each job streams its events back through its own thread-safe channel to the HTTP thread waiting on
// it. Each sequence keeps its own sampling parameters, seed, penalties, stop strings and logprobs; the
// batched step is bit-identical to stepping each alone, so a stream's tokens never depend on the others.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/generator.h"
#include "engine/prefix_cache.h"

namespace lilac {
class Backend;
class Tokenizer;
class Sequence;
}  // namespace lilac

namespace lilac::server {

struct Metrics;

struct JobEvent {
  enum Kind { Token, Done, Error, PromptScores } kind = Token;
  GeneratedToken token;   // Token
  std::vector<TokenChoice> prompt_scores;  // PromptScores (GenerationRequest::prompt_logprobs), before any Token
  GenerationStats stats;  // Done
  int status = 500;       // Error: HTTP status (400 for lilac::InputError, 500 otherwise)
  std::string message;    // Error
};

class Job {
 public:
  explicit Job(GenerationRequest r) : req(std::move(r)) {}
  GenerationRequest req;
  std::atomic<bool> cancel{false};  // set by the HTTP side when the client goes away
  std::atomic<bool> started{false};  // set by the scheduler when the job leaves the queue to run

  void push(JobEvent ev);
  // Moves every pending event into `out` (waiting up to `timeout` for the first); false on timeout.
  bool pop_all(std::vector<JobEvent>& out, std::chrono::milliseconds timeout);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<JobEvent> events_;
};

struct SchedulerOptions {
  int max_queue = 64;     // queued + running; more: submit() refuses (429)
  int64_t max_seq = 32768;  // capacity of every session of the pool
  size_t cache_bytes = size_t(2048) << 20;
  int max_batch = 0;            // sessions in the pool (concurrent generations); 0: see pool_size()
  double seq_memory_bytes = 0;  // memory budget of the pool (0: none)
  int64_t prefill_chunk = 512;  // prompt tokens per prefill step of one sequence (overrides the job's)
  bool burst_prefill = true;    // sequences admitted together are prefilled before they decode (see above)
  int spec_tokens = 0;    // speculative decoding: MTP drafts per step (GenerationRequest::draft_tokens)
  SpecPolicyKind spec_policy = SpecPolicyKind::Adaptive;  // drafts per step: adaptive (0..spec_tokens) or fixed
  // Speculation only while at most this many sequences are decoding (engine/spec_policy.h, kDefaultSpecMaxBatch).
  int spec_max_batch = kDefaultSpecMaxBatch;
  // Tests: a draft hook for each admitted job (Generator::set_draft_hook), made from its request.
  std::function<DraftHook(const GenerationRequest&)> draft_hook;
};

class Scheduler {
 public:
  // Creates the session pool (throws lilac::InputError when the memory budget holds no session).
  Scheduler(std::shared_ptr<Backend> backend, std::shared_ptr<const Tokenizer> tokenizer,
            SchedulerOptions opts, Metrics* metrics = nullptr);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // The pool size for these options: max_batch when > 0, capped by the memory budget when the
  // backend reports session_bytes; else what the budget holds; else backend.default_sessions(max_seq).
  // At least 1 (throws lilac::InputError when a budget is given that holds no session).
  static int pool_size(const Backend& backend, const SchedulerOptions& opts);

  // Queue a job; false when the queue is full (the caller answers 429).
  bool submit(std::shared_ptr<Job> job);
  // Queue several jobs at once (the worker sees all of them at its next admission); all or none.
  bool submit_all(const std::vector<std::shared_ptr<Job>>& jobs);
  int depth() const { return depth_.load(); }  // queued + running
  bool full() const { return depth_.load() >= opts_.max_queue; }
  int64_t max_seq() const { return opts_.max_seq; }
  int capacity() const { return int(slots_.size()); }  // sessions in the pool
  int in_use() const { return in_use_.load(); }         // sessions running a generation
  PrefixCache& cache() { return cache_; }
  // Cancels the queued and the running jobs (they end with FinishReason::Cancelled) and joins the worker.
  void stop();

 private:
  struct Slot;
  void worker();
  void admit(std::shared_ptr<Job> job);
  bool step();  // one iteration's prefill + decode work; false when there was nothing to do
  bool burst_held(const Slot& s) const;
  void fail(Slot& s, std::exception_ptr e);
  void retire_done();
  void answer(Job& job, JobEvent done);  // the Done / Error event of a job that leaves the scheduler

  std::shared_ptr<Backend> backend_;
  std::shared_ptr<const Tokenizer> tok_;
  SchedulerOptions opts_;
  Metrics* metrics_;
  PrefixCache cache_;
  std::vector<std::unique_ptr<Slot>> slots_;  // the pool (worker thread only, after construction)
  uint64_t ticks_ = 0;                        // admission / release order

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  std::vector<std::shared_ptr<Job>> running_;  // jobs in slots (cancelled by stop())
  std::atomic<int> depth_{0};
  std::atomic<int> in_use_{0};
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace lilac::server
