// A small fixed-size thread pool for data-parallel loops (rows of a matrix, heads, experts).
// parallel_for splits [0, n) into contiguous ranges, runs them on the workers and the calling
// thread, and returns when all are done. Calls from inside a worker run serially (no nesting).
#pragma once
#include <atomic>
#include <condition_variable>
#include <exception>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace lilac {

class ThreadPool {
 public:
  // threads <= 0: std::thread::hardware_concurrency(). threads == 1: everything runs on the caller.
  explicit ThreadPool(int threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return int(workers_.size()) + 1; }  // workers + the calling thread

  // fn(begin, end) over contiguous ranges covering [0, n); ranges hold at least `grain` items
  // (except the last). The first exception thrown by fn is rethrown on the calling thread.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t grain = 1);

 private:
  void worker_loop(int index);
  void run_task(int index);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_work_, cv_done_;
  // Current job (guarded by mu_ for publication; ranges claimed through next_).
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0, chunk_ = 1;
  std::atomic<int64_t> next_{0};
  uint64_t generation_ = 0;
  int active_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  std::mutex run_mu_;  // one parallel_for at a time
};

// Serial fallback when pool is null.
inline void parallel_for(ThreadPool* pool, int64_t n, const std::function<void(int64_t, int64_t)>& fn,
                         int64_t grain = 1) {
  if (pool && n > grain) {
    pool->parallel_for(n, fn, grain);
  } else if (n > 0) {
    fn(0, n);
  }
}

}  // namespace lilac
