#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <vector>

#include "core/thread_pool.h"

using lilac::ThreadPool;

TEST(ThreadPool, CoversEveryIndexExactlyOnce) {
  ThreadPool pool(3);
  EXPECT_EQ(pool.size(), 3);
  for (int64_t n : {1, 2, 7, 100, 1001}) {
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    pool.parallel_for(n, [&](int64_t b, int64_t e) {
      ASSERT_LT(b, e);
      for (int64_t i = b; i < e; ++i) hits[i]++;
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n=" << n << " i=" << i;
  }
}

TEST(ThreadPool, GrainBoundsRangeSize) {
  ThreadPool pool(2);
  std::atomic<int64_t> smallest{1 << 30};
  pool.parallel_for(1000, [&](int64_t b, int64_t e) {
    if (e != 1000) {
      int64_t s = e - b, cur = smallest.load();
      while (s < cur && !smallest.compare_exchange_weak(cur, s)) {}
    }
  }, 100);
  EXPECT_GE(smallest.load(), 100);
}

TEST(ThreadPool, NestedCallsRunSeriallyAndSumsAreRight) {
  ThreadPool pool(2);
  std::atomic<int64_t> total{0};
  pool.parallel_for(10, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      pool.parallel_for(10, [&](int64_t b2, int64_t e2) {
        for (int64_t j = b2; j < e2; ++j) total += i * 10 + j;
      });
  });
  EXPECT_EQ(total.load(), 99 * 100 / 2);
}

TEST(ThreadPool, RethrowsWorkerExceptionAndStaysUsable) {
  ThreadPool pool(2);
  EXPECT_THROW(pool.parallel_for(100, [&](int64_t b, int64_t e) {
    if (b <= 50 && 50 < e) throw std::runtime_error("boom");
  }), std::runtime_error);
  std::atomic<int> n{0};
  pool.parallel_for(100, [&](int64_t b, int64_t e) { n += int(e - b); });
  EXPECT_EQ(n.load(), 100);
}

TEST(ThreadPool, NullPoolHelperRunsSerially) {
  int calls = 0;
  lilac::parallel_for(nullptr, 5, [&](int64_t b, int64_t e) {
    ++calls;
    EXPECT_EQ(b, 0);
    EXPECT_EQ(e, 5);
  });
  EXPECT_EQ(calls, 1);
}
