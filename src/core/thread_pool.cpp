#include "core/thread_pool.h"

#include <algorithm>

namespace lilac {

namespace {
thread_local bool t_inside_pool = false;  // set while running a range: nested calls go serial
}

ThreadPool::ThreadPool(int threads) {
  if (threads <= 0) threads = int(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_work_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run_task(int) {
  bool was_inside = t_inside_pool;
  t_inside_pool = true;
  for (;;) {
    int64_t b = next_.fetch_add(chunk_);
    if (b >= n_) break;
    int64_t e = std::min(n_, b + chunk_);
    try {
      (*fn_)(b, e);
    } catch (...) {
      std::lock_guard<std::mutex> lk(mu_);
      if (!error_) error_ = std::current_exception();
      next_.store(n_);  // stop handing out ranges
    }
  }
  t_inside_pool = was_inside;
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_work_.wait(lk, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    run_task(index);
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (--active_ == 0) cv_done_.notify_all();
    }
  }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t grain) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  if (workers_.empty() || t_inside_pool || n <= grain) {
    bool was_inside = t_inside_pool;
    t_inside_pool = true;
    try {
      fn(0, n);
    } catch (...) {
      t_inside_pool = was_inside;
      throw;
    }
    t_inside_pool = was_inside;
    return;
  }
  std::lock_guard<std::mutex> run_lk(run_mu_);
  const int64_t parts = int64_t(size()) * 4;  // a few ranges per thread for balance
  {
    std::lock_guard<std::mutex> lk(mu_);
    fn_ = &fn;
    n_ = n;
    chunk_ = std::max(grain, (n + parts - 1) / parts);
    next_.store(0);
    error_ = nullptr;
    active_ = int(workers_.size());
    ++generation_;
  }
  cv_work_.notify_all();
  run_task(0);
  std::exception_ptr err;
  {
    std::unique_lock<std::mutex> lk(mu_);
    cv_done_.wait(lk, [&] { return active_ == 0; });
    fn_ = nullptr;
    err = error_;
    error_ = nullptr;
  }
  if (err) std::rethrow_exception(err);
}

}  // namespace lilac
