// The scheduler: a bounded queue of generation jobs served one at a time by a worker thread that
// owns the Backend's Session and the prefix cache. Each job streams its events back through its own
// thread-safe channel to the HTTP thread that waits on it.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
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
}  // namespace lilac

namespace lilac::server {

struct Metrics;

struct JobEvent {
  enum Kind { Token, Done, Error } kind = Token;
  GeneratedToken token;   // Token
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
  int max_queue = 64;     // queued + running
  int64_t max_seq = 32768;
  size_t cache_bytes = size_t(2048) << 20;
};

class Scheduler {
 public:
  Scheduler(std::shared_ptr<Backend> backend, std::shared_ptr<const Tokenizer> tokenizer,
            SchedulerOptions opts, Metrics* metrics = nullptr);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queue a job; false when the queue is full (the caller answers 429).
  bool submit(std::shared_ptr<Job> job);
  int depth() const { return depth_.load(); }  // queued + running
  bool full() const { return depth_.load() >= opts_.max_queue; }
  int64_t max_seq() const { return opts_.max_seq; }
  PrefixCache& cache() { return cache_; }
  // Cancels the queued and the running jobs (they end with FinishReason::Cancelled) and joins the worker.
  void stop();

 private:
  void worker();

  std::shared_ptr<Backend> backend_;
  std::shared_ptr<const Tokenizer> tok_;
  SchedulerOptions opts_;
  Metrics* metrics_;
  PrefixCache cache_;
  std::unique_ptr<Session> session_;
  std::unique_ptr<Generator> gen_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  std::shared_ptr<Job> current_;  // the running job (cancelled by stop())
  std::atomic<int> depth_{0};
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace lilac::server
