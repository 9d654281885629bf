// The fast CPU path's persistent worker pool. A phase is one list of independent tasks (e.g. the row
// tiles of q, k and v together, or of all selected experts) that every thread claims from one atomic
// word (generation | task count | next index, so a late worker can never claim a task of another
// phase); the only barrier is the calling thread waiting for the phase's tasks to be done (not for
// the workers: one that was not scheduled in time simply takes no task). Workers spin for a short
// while between phases (phases of a decode step follow each other within microseconds), then sleep on
// a condition variable.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace lilac::cpufast {

class WorkPool {
 public:
  // threads <= 0: hardware concurrency. The calling thread is one of them.
  explicit WorkPool(int threads);
  ~WorkPool();
  WorkPool(const WorkPool&) = delete;
  WorkPool& operator=(const WorkPool&) = delete;

  int size() const { return int(workers_.size()) + 1; }

  // f(task) for task in [0, n) on all threads; returns when every task is done. The first exception
  // is rethrown here. Called from inside a task, it runs serially on that thread.
  template <class F>
  void run(int64_t n, F&& f) {
    using Fn = std::remove_reference_t<F>;
    auto call = [](void* ctx, int64_t i) { (*static_cast<Fn*>(ctx))(i); };
    run_erased(n, call, const_cast<void*>(static_cast<const void*>(&f)));
  }

 private:
  void run_erased(int64_t n, void (*call)(void*, int64_t), void* ctx);
  void worker_loop();
  void work(uint64_t gen);

  std::vector<std::thread> workers_;
  std::mutex run_mu_;  // one phase at a time
  void wake_workers();
  std::atomic<uint32_t> wake_{0};   // bumped per phase (workers wait for a change)
  std::mutex sleep_mu_;
  std::condition_variable sleep_cv_;
  std::atomic<uint64_t> claim_{0};  // [gen 20 bits | n 22 bits | next 22 bits]
  std::atomic<int64_t> done_{0};    // tasks finished in the current phase
  uint64_t gen_ = 0;                // current phase (caller only)
  void (*call_)(void*, int64_t) = nullptr;
  void* ctx_ = nullptr;
  std::atomic<bool> stop_{false}, failed_{false};
  std::exception_ptr error_;
  std::mutex err_mu_;
};

}  // namespace lilac::cpufast
