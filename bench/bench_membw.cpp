// The machine's memory bandwidth floor for the CPU decode (a token of the full model streams ~1.7 GB
// of packed weights): a multi-threaded copy of a buffer much larger than the caches, reported in GB/s
// counting bytes read + written. Google Benchmark driver; `--benchmark_filter=Copy/threads:N`.
// bench/cpu_vs_llamacpp.sh runs it and divides the decode bytes per token by its figure.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

namespace {

constexpr size_t kBytes = size_t(1) << 30;  // 1 GiB source + 1 GiB destination

struct Buffers {
  std::vector<char> src, dst;
  Buffers() : src(kBytes, 1), dst(kBytes, 0) {}
};

Buffers& buffers() {
  static Buffers b;
  return b;
}

void Copy(benchmark::State& state) {
  Buffers& b = buffers();
  const int threads = int(state.range(0));
  const size_t part = kBytes / size_t(threads);
  for (auto _ : state) {
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t)
      ts.emplace_back([&, t] { std::memcpy(b.dst.data() + t * part, b.src.data() + t * part, part); });
    for (auto& t : ts) t.join();
    benchmark::DoNotOptimize(b.dst.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(2 * part * size_t(threads)));
}

void Args(benchmark::internal::Benchmark* b) {
  const int hw = int(std::max(1u, std::thread::hardware_concurrency()));
  for (int t = 1; t < hw; t *= 2) b->Arg(t);
  b->Arg(hw);
  b->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(1.0);
}

BENCHMARK(Copy)->Apply(Args);

// A read-only pass (what decode mostly does: weights are read, not written): sum of 64-bit words.
void Read(benchmark::State& state) {
  Buffers& b = buffers();
  const int threads = int(state.range(0));
  const size_t part = kBytes / size_t(threads) / 8;
  const uint64_t* p = reinterpret_cast<const uint64_t*>(b.src.data());
  for (auto _ : state) {
    std::vector<std::thread> ts;
    std::vector<uint64_t> sums(static_cast<size_t>(threads), 0);
    for (int t = 0; t < threads; ++t)
      ts.emplace_back([&, t] {
        uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        const uint64_t* q = p + size_t(t) * part;
        for (size_t i = 0; i + 4 <= part; i += 4) {
          s0 += q[i];
          s1 += q[i + 1];
          s2 += q[i + 2];
          s3 += q[i + 3];
        }
        sums[size_t(t)] = s0 + s1 + s2 + s3;
      });
    for (auto& t : ts) t.join();
    benchmark::DoNotOptimize(sums.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(part * 8 * size_t(threads)));
}

BENCHMARK(Read)->Apply(Args);

}  // namespace

BENCHMARK_MAIN();
