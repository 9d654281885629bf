// Tokenizer throughput on English prose (the licenses in /usr/share/common-licenses, repeated to
// about 4 MB), one thread. The BPE cache is warm after the first iteration, as in a server.
//   build-x/bench_tokenizer --benchmark_filter=Encode
#include <benchmark/benchmark.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "text/detokenizer.h"
#include "text/tokenizer.h"

namespace {

const lilac::Tokenizer& qwen3() {
  static auto tok = lilac::Tokenizer::load(std::string(LILAC_SHARED_DIR) + "/fixtures/qwen3-tokenizer");
  return *tok;
}

const std::string& prose() {
  static const std::string text = [] {
    std::string all;
    std::vector<std::filesystem::path> files;
    for (const auto& e : std::filesystem::directory_iterator("/usr/share/common-licenses"))
      if (e.is_regular_file()) files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const auto& p : files) {
      std::ifstream f(p, std::ios::binary);
      std::stringstream ss;
      ss << f.rdbuf();
      all += ss.str();
    }
    if (all.empty()) all = "The quick brown fox jumps over the lazy dog. ";
    std::string out;
    while (out.size() < (4u << 20)) out += all;
    return out;
  }();
  return text;
}

void BM_EncodeProse(benchmark::State& state) {
  const auto& tok = qwen3();
  const auto& text = prose();
  size_t n_ids = 0;
  for (auto _ : state) {
    auto ids = tok.encode(text);
    n_ids = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
  state.counters["tokens"] = static_cast<double>(n_ids);
  state.counters["MB"] = static_cast<double>(text.size()) / 1e6;
}
BENCHMARK(BM_EncodeProse)->Unit(benchmark::kMillisecond)->MinTime(2.0);

// The same text through a freshly loaded tokenizer (empty BPE cache): the first request's cost.
void BM_EncodeProseColdCache(benchmark::State& state) {
  const auto& text = prose();
  for (auto _ : state) {
    state.PauseTiming();
    auto tok = lilac::Tokenizer::load(std::string(LILAC_SHARED_DIR) + "/fixtures/qwen3-tokenizer");
    state.ResumeTiming();
    auto ids = tok->encode(text);
    benchmark::DoNotOptimize(ids.data());
    state.PauseTiming();
    tok.reset();
    state.ResumeTiming();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
}
BENCHMARK(BM_EncodeProseColdCache)->Unit(benchmark::kMillisecond)->Iterations(3);

void BM_DecodeProse(benchmark::State& state) {
  const auto& tok = qwen3();
  const auto ids = tok.encode(prose());
  for (auto _ : state) {
    auto s = tok.decode(ids);
    benchmark::DoNotOptimize(s.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * prose().size()));
}
BENCHMARK(BM_DecodeProse)->Unit(benchmark::kMillisecond);

void BM_StreamDetokenize(benchmark::State& state) {
  const auto& tok = qwen3();
  const auto ids = tok.encode(prose().substr(0, 1 << 20));
  for (auto _ : state) {
    lilac::StreamDetokenizer d(tok, {"<|im_end|>", "\n\nUser:"});
    size_t n = 0;
    for (int32_t id : ids) n += d.push(id).size();
    n += d.finish().size();
    benchmark::DoNotOptimize(n);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * ids.size()));
}
BENCHMARK(BM_StreamDetokenize)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
