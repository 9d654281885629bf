// The fast CPU path's integer kernels alone, one thread, for every kernel set this CPU runs:
//   Gemm/<set>/<levels>/<tokens>: a 4-bit 4096 x 2048 matrix (4.6 MB packed, L2/L3-resident after the first
//     pass) times `tokens` activation rows; items = multiply-adds (the prefill compute rate per core).
//   Gemv/<set>/<levels>: a 4-bit 32768 x 2048 matrix (37.7 MB, more than the caches) times one row;
//     bytes = packed weight bytes (the decode streaming rate per core).
//   Attention/<set>/<context>: one prefill task of the model's attention (attention.h: 16 queries at the end of
//     `context` positions, the 8 query heads of one kv head, head width 256, f16 cache); items = the
//     multiply-adds of q·k and p·v (the prefill attention's rate per core).
#include <benchmark/benchmark.h>

#include <random>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "cpufast/acts.h"
#include "cpufast/attention.h"
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

void attention(benchmark::State& state, const KernelSet* k, int64_t ctx) {
  constexpr int heads = 16, kvh = 2, hd = 256, nq = 16;
  const AttentionShape s{heads, hd, int64_t(kvh) * hd, 1.f / 16.f};
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  std::vector<uint16_t> K(size_t(ctx * s.kv_dim)), V(K.size());
  for (auto& v : K) v = f32_to_f16(nd(rng));
  for (auto& v : V) v = f32_to_f16(nd(rng));
  std::vector<float> q(size_t(nq * heads * hd)), out(q.size());
  for (auto& v : q) v = nd(rng);
  for (auto _ : state) {
    attention_rows(*k, s, K.data(), V.data(), ctx - nq, nq, 0, 0, heads / kvh, q.data(), nullptr, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  const int64_t pairs = (heads / kvh) * (nq * (ctx - nq) + nq * (nq + 1) / 2);
  state.SetItemsProcessed(int64_t(state.iterations()) * pairs * 2 * hd);
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
  for (const KernelSet* k : available_kernels())
    for (int64_t ctx : {512, 4096})
      benchmark::RegisterBenchmark(("Attention/" + std::string(k->name) + "/" + std::to_string(ctx)).c_str(),
                                   [=](benchmark::State& s) { attention(s, k, ctx); })
          ->Unit(benchmark::kMillisecond);
  return true;
}();

}  // namespace

BENCHMARK_MAIN();
