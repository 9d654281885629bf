#include "server/scheduler.h"

#include "core/error.h"
#include "core/log.h"
#include "engine/backend.h"
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

Scheduler::Scheduler(std::shared_ptr<Backend> backend, std::shared_ptr<const Tokenizer> tokenizer,
                     SchedulerOptions opts, Metrics* metrics)
    : backend_(std::move(backend)), tok_(std::move(tokenizer)), opts_(opts), metrics_(metrics),
      cache_(opts.cache_bytes) {
  session_ = backend_->new_session(opts_.max_seq);
  gen_ = std::make_unique<Generator>(*session_, *tok_, &cache_);
  thread_ = std::thread([this] { worker(); });
}

Scheduler::~Scheduler() { stop(); }

void Scheduler::stop() {
  {
    std::lock_guard lk(mu_);
    if (stop_) return;
    stop_ = true;
    for (auto& j : queue_) j->cancel = true;
    if (current_) current_->cancel = true;
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

void Scheduler::worker() {
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping
      job = std::move(queue_.front());
      queue_.pop_front();
      current_ = job;
      job->started = true;
      if (stop_) job->cancel = true;
    }
    if (metrics_) metrics_->running = 1;
    JobEvent done;
    try {
      if (job->cancel.load()) {
        done.kind = JobEvent::Done;
        done.stats.finish = FinishReason::Cancelled;
      } else {
        Job* j = job.get();
        done.stats = gen_->run(
            j->req,
            [j](const GeneratedToken& t) {
              if (j->cancel.load(std::memory_order_relaxed)) return false;
              JobEvent ev;
              ev.kind = JobEvent::Token;
              ev.token = t;
              j->push(std::move(ev));
              return true;
            },
            &j->cancel);
        done.kind = JobEvent::Done;
      }
    } catch (const InputError& e) {
      done.kind = JobEvent::Error;
      done.status = 400;
      done.message = e.what();
    } catch (const std::exception& e) {
      done.kind = JobEvent::Error;
      done.status = 500;
      done.message = std::string("internal error: ") + e.what();
      LILAC_LOG_ERROR("generation failed: %s", e.what());
    } catch (...) {
      done.kind = JobEvent::Error;
      done.status = 500;
      done.message = "internal error";
      LILAC_LOG_ERROR("generation failed with an unknown exception");
    }
    if (metrics_) {
      if (done.kind == JobEvent::Done) {
        auto& s = done.stats;
        if (s.finish == FinishReason::Cancelled) metrics_->cancelled++;
        if (s.completion_tokens > 0 || s.finish != FinishReason::Cancelled)
          metrics_->add_generation(s.prompt_tokens, s.cached_tokens, s.completion_tokens, s.prefill_seconds,
                                   s.decode_seconds, s.cache_hit);
      }
      metrics_->cache_entries = int64_t(cache_.entries());
      metrics_->cache_bytes = int64_t(cache_.bytes());
      metrics_->running = 0;
    }
    // Leave the queue before answering, so a client that got its answer sees the depth without it.
    {
      std::lock_guard lk(mu_);
      current_.reset();
    }
    --depth_;
    if (metrics_) metrics_->queue_depth = depth_.load();
    job->push(std::move(done));
  }
}

}  // namespace lilac::server
