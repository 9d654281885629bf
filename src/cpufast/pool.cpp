#include "cpufast/pool.h"

#include <algorithm>

#if defined(__x86_64__)
#include <immintrin.h>
#define LILAC_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define LILAC_RELAX() __asm__ volatile("yield")
#else
#define LILAC_RELAX() ((void)0)
#endif

namespace lilac::cpufast {

namespace {
thread_local bool t_in_pool = false;
constexpr int kSpin = 1 << 14;  // pause iterations (~100 µs) before sleeping
}  // namespace

WorkPool::WorkPool(int threads) {
  if (threads <= 0) threads = int(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

WorkPool::~WorkPool() {
  stop_.store(true);
  gen_.fetch_add(1, std::memory_order_release);
  gen_.notify_all();
  for (auto& t : workers_) t.join();
}

void WorkPool::work() {
  const bool was = t_in_pool;
  t_in_pool = true;
  for (;;) {
    const int64_t i = next_.fetch_add(1, std::memory_order_relaxed);
    if (i >= n_) break;
    try {
      call_(ctx_, i);
    } catch (...) {
      std::lock_guard<std::mutex> lk(err_mu_);
      if (!error_) error_ = std::current_exception();
      failed_.store(true);
      next_.store(n_);
    }
  }
  t_in_pool = was;
}

void WorkPool::worker_loop() {
  uint32_t seen = gen_.load(std::memory_order_acquire);
  for (;;) {
    uint32_t g;
    int spins = 0;
    while ((g = gen_.load(std::memory_order_acquire)) == seen) {
      if (++spins < kSpin)
        LILAC_RELAX();
      else
        gen_.wait(seen, std::memory_order_acquire);
    }
    seen = g;
    if (stop_.load()) return;
    work();
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
  }
}

void WorkPool::run_erased(int64_t n, void (*call)(void*, int64_t), void* ctx) {
  if (n <= 0) return;
  if (workers_.empty() || t_in_pool || n == 1) {
    const bool was = t_in_pool;
    t_in_pool = true;
    try {
      for (int64_t i = 0; i < n; ++i) call(ctx, i);
    } catch (...) {
      t_in_pool = was;
      throw;
    }
    t_in_pool = was;
    return;
  }
  std::lock_guard<std::mutex> lk(run_mu_);
  n_ = n;
  call_ = call;
  ctx_ = ctx;
  error_ = nullptr;
  failed_.store(false);
  next_.store(0, std::memory_order_relaxed);
  pending_.store(int(workers_.size()), std::memory_order_relaxed);
  gen_.fetch_add(1, std::memory_order_release);
  gen_.notify_all();
  work();
  int spins = 0;
  for (;;) {
    const int p = pending_.load(std::memory_order_acquire);
    if (p == 0) break;
    if (++spins < kSpin)
      LILAC_RELAX();
    else
      pending_.wait(p, std::memory_order_acquire);
  }
  if (failed_.load()) std::rethrow_exception(error_);
}

}  // namespace lilac::cpufast
