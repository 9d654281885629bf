// The fast CPU path's worker pool: every task runs exactly once per phase, phases after the workers
// went to sleep still complete and the pool shuts down (a lost wake-up once hung the destructor),
// exceptions reach the caller, nested phases run serially.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "cpufast/pool.h"

using lilac::cpufast::WorkPool;

TEST(CpuFastPool, EveryTaskOnceThroughSleepsAndShutdown) {
  for (int threads : {1, 2, 4}) {
    auto pool = std::make_unique<WorkPool>(threads);
    for (int phase = 0; phase < 200; ++phase) {
      const int64_t n = 1 + phase % 37;
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      pool->run(n, [&](int64_t i) { hits[static_cast<size_t>(i)].fetch_add(1); });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << threads << " " << phase;
      if (phase % 50 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));  // workers fall asleep
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    pool.reset();  // must return
  }
}

TEST(CpuFastPool, ExceptionsAndNesting) {
  WorkPool pool(3);
  EXPECT_THROW(pool.run(50, [](int64_t i) {
    if (i == 17) throw std::runtime_error("task 17");
  }), std::runtime_error);
  std::atomic<int64_t> sum{0};
  pool.run(8, [&](int64_t i) { pool.run(4, [&](int64_t j) { sum.fetch_add(i * 4 + j); }); });
  EXPECT_EQ(sum.load(), 31 * 32 / 2);
}
