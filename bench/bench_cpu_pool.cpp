// The cost of one phase (= one barrier) of the fast CPU path's worker pool (src/cpufast/pool.h)
// against the core ThreadPool's parallel_for (one per matrix in the reference backend): empty phases
// of `threads` tasks, and phases of 64 tiny tasks. A decode step of the full model runs ~6 phases per
// layer (240 per token): multiply the time per phase by 240 for the per-token overhead.
#include <benchmark/benchmark.h>

#include <atomic>
#include <thread>

#include "core/thread_pool.h"
#include "cpufast/pool.h"

namespace {

void WorkPoolPhase(benchmark::State& state) {
  lilac::cpufast::WorkPool pool(int(state.range(0)));
  const int64_t tasks = state.range(1);
  std::atomic<int64_t> sink{0};
  for (auto _ : state) pool.run(tasks, [&](int64_t i) { sink.fetch_add(i, std::memory_order_relaxed); });
  benchmark::DoNotOptimize(sink.load());
}

void ThreadPoolParallelFor(benchmark::State& state) {
  lilac::ThreadPool pool(int(state.range(0)));
  const int64_t tasks = state.range(1);
  std::atomic<int64_t> sink{0};
  for (auto _ : state)
    pool.parallel_for(tasks, [&](int64_t b, int64_t e) { sink.fetch_add(e - b, std::memory_order_relaxed); });
  benchmark::DoNotOptimize(sink.load());
}

void Args(benchmark::internal::Benchmark* b) {
  const int hw = int(std::max(1u, std::thread::hardware_concurrency()));
  for (int t : {2, 4, hw})
    for (int tasks : {0, 64}) b->Args({t, tasks == 0 ? t : tasks});
  b->UseRealTime()->Unit(benchmark::kMicrosecond);
}

BENCHMARK(WorkPoolPhase)->Apply(Args);
BENCHMARK(ThreadPoolParallelFor)->Apply(Args);

}  // namespace

BENCHMARK_MAIN();
