#include "cpufast/pool.h"

#include <algorithm>
#include <chrono>

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
// Spin this long before sleeping: covers the serial gaps of a decode step (norms, routing, sampling).
constexpr auto kSpinTime = std::chrono::microseconds(200);

// Spins until done() or kSpinTime passed (the clock read every 64 pauses); returns done().
template <class Done>
bool spin_until(Done&& done) {
  const auto end = std::chrono::steady_clock::now() + kSpinTime;
  for (int i = 1;; ++i) {
    if (done()) return true;
    LILAC_RELAX();
    if ((i & 63) == 0 && std::chrono::steady_clock::now() > end) return done();
  }
}
constexpr int kIdxBits = 22, kNBits = 22;
constexpr uint64_t kIdxMask = (uint64_t(1) << kIdxBits) - 1, kNMask = (uint64_t(1) << kNBits) - 1;
constexpr int64_t kMaxTasks = int64_t(kIdxMask);
}  // namespace

WorkPool::WorkPool(int threads) {
  if (threads <= 0) threads = int(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

WorkPool::~WorkPool() {
  stop_.store(true);
  wake_workers();
  for (auto& t : workers_) t.join();
}

// Bumps wake_ under the sleep mutex: a worker checks wake_ under it before sleeping, so none misses it.
void WorkPool::wake_workers() {
  {
    std::lock_guard<std::mutex> lk(sleep_mu_);
    wake_.fetch_add(1, std::memory_order_release);
  }
  sleep_cv_.notify_all();
}

// Claims and runs tasks of phase `gen` until none is left (or another phase has begun).
void WorkPool::work(uint64_t gen) {
  const bool was = t_in_pool;
  t_in_pool = true;
  uint64_t v = claim_.load(std::memory_order_acquire);
  for (;;) {
    if ((v >> (kIdxBits + kNBits)) != gen) break;
    const uint64_t idx = v & kIdxMask, n = (v >> kIdxBits) & kNMask;
    if (idx >= n) break;
    if (!claim_.compare_exchange_weak(v, v + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
    // The phase cannot end before this task is done: call_ / ctx_ are this phase's.
    try {
      call_(ctx_, int64_t(idx));
    } catch (...) {
      std::lock_guard<std::mutex> lk(err_mu_);
      if (!error_) error_ = std::current_exception();
      failed_.store(true);
    }
    done_.fetch_add(1, std::memory_order_acq_rel);
    v = claim_.load(std::memory_order_acquire);
  }
  t_in_pool = was;
}

void WorkPool::worker_loop() {
  // wake_ was 0 when the pool was made: a worker that starts late (after phases, or after the
  // destructor's wake-up) sees a change at once and never sleeps through stop_.
  uint32_t seen = 0;
  for (;;) {
    auto ready = [&] { return wake_.load(std::memory_order_acquire) != seen || stop_.load(); };
    if (!spin_until(ready)) {
      std::unique_lock<std::mutex> lk(sleep_mu_);
      sleep_cv_.wait(lk, ready);
    }
    if (stop_.load()) return;
    seen = wake_.load(std::memory_order_acquire);
    work(claim_.load(std::memory_order_acquire) >> (kIdxBits + kNBits));
  }
}

void WorkPool::run_erased(int64_t n, void (*call)(void*, int64_t), void* ctx) {
  if (n <= 0) return;
  if (workers_.empty() || t_in_pool || n == 1 || n > kMaxTasks) {
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
  gen_ = (gen_ + 1) & ((uint64_t(1) << (64 - kIdxBits - kNBits)) - 1);
  call_ = call;
  ctx_ = ctx;
  error_ = nullptr;
  failed_.store(false);
  done_.store(0, std::memory_order_relaxed);
  claim_.store((gen_ << (kIdxBits + kNBits)) | (uint64_t(n) << kIdxBits), std::memory_order_release);
  wake_workers();
  work(gen_);
  auto all_done = [&] { return done_.load(std::memory_order_acquire) >= n; };
  while (!spin_until(all_done)) std::this_thread::yield();
  if (failed_.load()) std::rethrow_exception(error_);
}

}  // namespace lilac::cpufast
