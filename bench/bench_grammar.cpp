// Constrained decoding: token mask computation per generated token, and schema compilation, on
// the real Qwen3 tokenizer (151,669 tokens; masks cover the Qwen3.6 model's 248,320 ids).
//
// Per-token numbers follow documents of tests/grammar/grammar_corpus.h (realistic schemas: nested
// objects, arrays of objects, enums, formats and patterns, 50 properties, recursive $ref, anyOf,
// json_object mode) token by token as the real tokenizer splits them: before each token the mask
// is computed (fill_mask, the work the server does per step), then the token is accepted.
//   Warm: the compiled grammars and their token-class caches exist (a schema seen before), each
//         document gets a fresh Matcher (a new request).
//   Cold: every iteration starts from nothing (new process: no compiled grammar, empty caches);
//         compilation is not timed, the classes computed along the way are.
//   NewSchemas: like Cold after GrammarCache::warm() (a server after startup: the classes shared
//         by all schemas exist; every schema is new).
// Counters: median / p99 / max microseconds per token over all tokens of all documents, as thread
// CPU time (cpu_*: what one core spends; the shared 2-core VM inflates wall time) and wall time.
//   build/bench/bench_grammar
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <ctime>

#include "../tests/grammar/grammar_corpus.h"
#include "grammar/cache.h"
#include "grammar/matcher.h"
#include "grammar/response_grammar.h"
#include "grammar/schema.h"
#include "text/model_format.h"
#include "text/tokenizer.h"

namespace {

using namespace lilac::grammar;
using Clock = std::chrono::steady_clock;

const lilac::Tokenizer& qwen3() {
  static auto tok = lilac::Tokenizer::load(std::string(LILAC_SHARED_DIR) + "/fixtures/qwen3-tokenizer");
  return *tok;
}
std::shared_ptr<const Vocabulary> vocab() {
  static auto v = Vocabulary::from_tokenizer(qwen3(), 248320);
  return v;
}
int32_t im_end() { return *qwen3().token_id("<|im_end|>"); }

Grammar compile(const corpus::Case& c) {
  return c.schema.empty() ? json_object_grammar() : compile_json_schema_text(c.schema);
}

struct Doc {
  size_t grammar;
  std::vector<int32_t> ids;
};

struct Setup {
  std::vector<corpus::Case> cases = corpus::cases();
  std::vector<Doc> docs;
  Setup() {
    for (size_t i = 0; i < cases.size(); ++i)
      for (const auto& d : cases[i].docs) docs.push_back({i, qwen3().encode(d)});
  }
};
const Setup& setup() {
  static Setup s;
  return s;
}

double cpu_us() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) * 1e6 + double(ts.tv_nsec) * 1e-3;
}

struct Times {
  std::vector<double> wall, cpu;
  void clear() {
    wall.clear();
    cpu.clear();
  }
};

// Follows `doc` with a fresh matcher; appends the microseconds of each mask computation.
bool follow(const std::shared_ptr<const CompiledGrammar>& g, const Doc& doc, std::vector<uint32_t>& mask, Times& us) {
  Matcher m(g, {im_end()});
  for (size_t i = 0; i <= doc.ids.size(); ++i) {
    const double c0 = cpu_us();
    const auto t0 = Clock::now();
    m.fill_mask(mask);
    us.wall.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    us.cpu.push_back(cpu_us() - c0);
    const int32_t t = i < doc.ids.size() ? doc.ids[i] : im_end();
    if (!((mask[size_t(t) >> 5] >> (t & 31)) & 1u) || !m.accept_token(t)) return false;
  }
  return m.finished();
}

void report(benchmark::State& state, Times& t) {
  auto put = [&](std::vector<double>& us, const std::string& prefix) {
    std::sort(us.begin(), us.end());
    if (us.empty()) return;
    state.counters[prefix + "median_us"] = us[us.size() / 2];
    state.counters[prefix + "p99_us"] = us[std::min(us.size() - 1, size_t(double(us.size()) * 0.99))];
    state.counters[prefix + "max_us"] = us.back();
  };
  put(t.cpu, "cpu_");
  put(t.wall, "wall_");
  state.counters["tokens"] = double(t.cpu.size());
}

void BM_MaskPerTokenWarm(benchmark::State& state) {
  const Setup& s = setup();
  auto cache = std::make_shared<TokenClassCache>(size_t(512) << 20);
  std::vector<std::shared_ptr<const CompiledGrammar>> gs;
  for (const auto& c : s.cases) gs.push_back(std::make_shared<CompiledGrammar>(compile(c), vocab(), cache));
  std::vector<uint32_t> mask(vocab()->mask_words());
  Times us;
  for (const Doc& d : s.docs)
    if (!follow(gs[d.grammar], d, mask, us)) state.SkipWithError(("rejected: " + s.cases[d.grammar].name).c_str());
  us.clear();
  for (auto _ : state)
    for (const Doc& d : s.docs) follow(gs[d.grammar], d, mask, us);
  report(state, us);
}
BENCHMARK(BM_MaskPerTokenWarm)->Unit(benchmark::kMillisecond)->MinTime(2.0);

// Fresh grammars every iteration (untimed compilation); `warm` = GrammarCache::warm() ran first
// (a server after startup meeting new schemas), else nothing is cached (a new process).
void cold_run(benchmark::State& state, bool warm) {
  const Setup& s = setup();
  std::vector<uint32_t> mask(vocab()->mask_words());
  Times us;
  for (auto _ : state) {
    state.PauseTiming();
    GrammarCache cache(vocab());
    if (warm) cache.warm();
    std::vector<std::shared_ptr<const CompiledGrammar>> gs;
    for (const auto& c : s.cases)
      gs.push_back(c.schema.empty() ? cache.json_object() : cache.json_schema_text(c.schema));
    state.ResumeTiming();
    for (const Doc& d : s.docs)
      if (!follow(gs[d.grammar], d, mask, us)) state.SkipWithError(("rejected: " + s.cases[d.grammar].name).c_str());
  }
  report(state, us);
}
void BM_MaskPerTokenCold(benchmark::State& state) { cold_run(state, false); }
BENCHMARK(BM_MaskPerTokenCold)->Unit(benchmark::kMillisecond)->Iterations(5);
void BM_MaskPerTokenNewSchemas(benchmark::State& state) { cold_run(state, true); }
BENCHMARK(BM_MaskPerTokenNewSchemas)->Unit(benchmark::kMillisecond)->Iterations(5);

// One schema at a time (warm), to see which kind costs what.
void BM_MaskPerTokenBySchema(benchmark::State& state) {
  const Setup& s = setup();
  const size_t k = size_t(state.range(0));
  state.SetLabel(s.cases[k].name);
  auto g = std::make_shared<CompiledGrammar>(compile(s.cases[k]), vocab(), std::make_shared<TokenClassCache>(size_t(512) << 20));
  std::vector<uint32_t> mask(vocab()->mask_words());
  Times us;
  for (const Doc& d : s.docs)
    if (d.grammar == k && !follow(g, d, mask, us)) state.SkipWithError("rejected");
  us.clear();
  for (auto _ : state)
    for (const Doc& d : s.docs)
      if (d.grammar == k) follow(g, d, mask, us);
  report(state, us);
}
BENCHMARK(BM_MaskPerTokenBySchema)->DenseRange(0, 7)->Unit(benchmark::kMillisecond)->MinTime(0.5);

// Whole responses in the model's format (response_grammar.h): reasoning (free text), then content and
// Qwen3.6 XML tool calls of strict tools (raw string values, JSON values), as the real tokenizer
// splits them (markup as its added tokens).
void BM_MaskPerTokenToolCalls(benchmark::State& state) {
  using lilac::grammar::OrderedJson;
  ResponseSpec spec;
  spec.tools = OrderedJson::parse(R"([
    {"type":"function","function":{"name":"get_weather","strict":true,"parameters":{"type":"object","properties":{
      "city":{"type":"string","maxLength":40},"unit":{"type":"string","enum":["celsius","fahrenheit"]},
      "days":{"type":"integer","minimum":1,"maximum":7}},"required":["city","unit"]}}},
    {"type":"function","function":{"name":"write_file","strict":true,"parameters":{"type":"object","properties":{
      "path":{"type":"string"},"content":{"type":"string"},"options":{"type":"object","properties":{
      "overwrite":{"type":"boolean"},"mode":{"type":"string","pattern":"^[0-7]{3}$"}}}},"required":["path","content"]}}}])");
  spec.calls = ResponseSpec::Calls::Auto;
  spec.in_reasoning = true;
  const std::string outputs[] = {
      "The user wants the weather in Paris for the next three days, in Celsius. I will call get_weather.\n</think>\n\n"
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=unit>\ncelsius\n"
      "</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
      "I need to save the script.\n</think>\n\nSaving it now.\n\n<tool_call>\n<function=write_file>\n<parameter=path>\n"
      "scripts/build.sh\n</parameter>\n<parameter=content>\n#!/usr/bin/env bash\nset -euo pipefail\ncmake -S . -B build "
      "-G Ninja\ncmake --build build -j\"$(nproc)\"\necho \"done: $(date)\" > build/stamp.txt\n</parameter>\n"
      "<parameter=options>\n{\"overwrite\": true, \"mode\": \"755\"}\n</parameter>\n</function>\n</tool_call>",
  };
  std::vector<std::vector<int32_t>> docs;
  for (const auto& o : outputs) docs.push_back(qwen3().encode(o, true));
  auto g = std::make_shared<CompiledGrammar>(build_response_grammar(spec, lilac::qwen3_6_format().markup(), qwen3()),
                                             vocab(), std::make_shared<TokenClassCache>(size_t(512) << 20));
  std::vector<uint32_t> mask(vocab()->mask_words());
  Times us;
  for (const auto& ids : docs)
    if (!follow(g, Doc{0, ids}, mask, us)) state.SkipWithError("rejected");
  us.clear();
  for (auto _ : state)
    for (const auto& ids : docs) follow(g, Doc{0, ids}, mask, us);
  report(state, us);
}
BENCHMARK(BM_MaskPerTokenToolCalls)->Unit(benchmark::kMillisecond)->MinTime(1.0);

void BM_Compile50Properties(benchmark::State& state) {
  const std::string schema = corpus::fifty_property_schema();
  for (auto _ : state) {
    Grammar g = compile_json_schema_text(schema);
    benchmark::DoNotOptimize(g.rules.data());
  }
}
BENCHMARK(BM_Compile50Properties)->Unit(benchmark::kMillisecond);

void BM_CompileEach(benchmark::State& state) {
  const Setup& s = setup();
  const size_t k = size_t(state.range(0));
  state.SetLabel(s.cases[k].name);
  for (auto _ : state) {
    Grammar g = compile(s.cases[k]);
    benchmark::DoNotOptimize(g.rules.data());
  }
}
BENCHMARK(BM_CompileEach)->DenseRange(0, 7)->Unit(benchmark::kMillisecond);

}  // namespace
BENCHMARK_MAIN();
