// The fast CPU path's integer kernels alone, one thread, for every kernel set this CPU runs:
//   Gemm/<set>/<levels>/<tokens>: a 4-bit 4096 x 2048 matrix (4.6 MB packed, L2/L3-resident after the first
//     pass) times `tokens` activation rows; items = multiply-adds (the prefill compute rate per core).
//   Gemv/<set>/<levels>: a 4-bit 32768 x 2048 matrix (37.7 MB, more than the caches) times one row;
//     bytes = packed weight bytes (the decode streaming rate per core).
#include <benchmark/benchmark.h>

#include <random>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "cpufast/acts.h"
#include "cpufast/isa.h"
#include "cpufast/pack.h"
#include "model/quant.h"

using namespace lilac;
using namespace lilac::cpufast;

namespace {

struct Mat {
  std::vector<uint32_t> w;
  std::vector<uint16_t> s, b;
  QMatrix m;
  Mat(int64_t rows, int64_t cols) {
    std::mt19937 rng(1);
    w.resize(size_t(rows * cols / 8));
    for (auto& x : w) x = rng();
    s.assign(size_t(rows * cols / 64), f32_to_bf16(0.01f));
    b.assign(s.size(), f32_to_bf16(-0.08f));
    m.rows = rows;
    m.cols = cols;
    m.bits = 4;
    m.group_size = 64;
    m.qweight = w.data();
    m.scales = s.data();
    m.biases = b.data();
  }
};

void run(benchmark::State& state, const KernelSet* k, int64_t rows, int levels, int64_t n, bool bytes) {
  static std::vector<std::shared_ptr<PackedBuffer>> owners;
  Mat mat(rows, 2048);
  const PackedMatrix P = pack_matrix({mat.m}, k->rows_per_tile, "bench", owners, nullptr);
  std::vector<float> x(size_t(n * 2048));
  std::mt19937 rng(2);
  std::normal_distribution<float> nd;
  for (auto& v : x) v = nd(rng);
  ActBuffer ab;
  QActs X = ab.resize(n, 2048, levels);
  for (int64_t t = 0; t < n; ++t) ab.quantize_row(t, x.data() + t * 2048);
  std::vector<float> y(size_t(n * rows));
  for (auto _ : state) {
    k->gemm(P, 0, P.tiles, X, y.data(), rows);
    benchmark::DoNotOptimize(y.data());
  }
  if (bytes)
    state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(packed_bytes(P)));
  else
    state.SetItemsProcessed(int64_t(state.iterations()) * rows * 2048 * n);
  owners.clear();
}

const bool registered = [] {
  for (const KernelSet* k : available_kernels())
    for (int levels : {1, 2}) {
      const std::string base = std::string(k->name) + "/" + std::to_string(levels);
      for (int n : {4, 64})
        benchmark::RegisterBenchmark(("Gemm/" + base + "/" + std::to_string(n)).c_str(),
                                     [=](benchmark::State& s) { run(s, k, 4096, levels, n, false); })
            ->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark(("Gemv/" + base).c_str(), [=](benchmark::State& s) { run(s, k, 32768, levels, 1, true); })
          ->Unit(benchmark::kMillisecond);
    }
  return true;
}();

}  // namespace

BENCHMARK_MAIN();
