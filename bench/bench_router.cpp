// Cost of the hybrid router's decision for a 100 KB prompt (target: < 1 ms), and of its parts.
//   build-*/bench/bench_router --benchmark_min_time=0.5
#include <benchmark/benchmark.h>

#include <string>

#include "router/detectors.h"
#include "router/hybrid.h"

using namespace lilac::router;
using json = nlohmann::ordered_json;  // bodies as the server parses them

namespace {

// ~100 KB of mixed prose, code-ish text, numbers, dates and versions, with nothing sensitive in it.
std::string prompt_text(size_t bytes) {
  static const char* words[] = {
      "The ",       "quick ",  "brown ",       "fox ",        "jumps ",   "over ",     "the ",    "lazy ",
      "dog. ",      "Meeting ", "at ",         "10:30, ",     "room ",    "4.2; ",     "budget ", "$1,250.00 ",
      "on ",        "2024-01-15 ", "(v1.2.3) ", "getUserAccountBalance2024ByRegion ", "std::vector<int> ",
      "x = a[i] + b[j]; ", "see https://example.org/docs/page ", "release 10.0.19041.1 ", "commit 3f786850e387550fdab836ed7e6dc881de23001b ",
      "id 123e4567-e89b-12d3-a456-426614174000 ", "@mention ", "C++20 ", "-- ", "user_name ", "\n"};
  constexpr size_t n = sizeof(words) / sizeof(words[0]);
  std::string s;
  s.reserve(bytes + 64);
  for (size_t i = 0; s.size() < bytes; ++i) s += words[(i * 7 + i / 5) % n];
  s.resize(bytes);
  return s;
}

json chat_body(const std::string& text) {
  return json{{"model", "lilac"},
              {"messages", json::array({{{"role", "system"}, {"content", "You are a helpful assistant."}},
                                        {{"role", "user"}, {"content", text}}})}};
}

const char* kPolicy = R"({
  "rules": [{"name": "projects", "keywords": ["project falcon", "internal only", "do not share"]},
            {"name": "ids", "regex": ["\\bEMP-[0-9]{6}\\b"], "case_insensitive": false}]
})";

void BM_RouterDecide100KB(benchmark::State& st) {
  Router r(parse_route_policy(nlohmann::json::parse(kPolicy)), RouterConfig{"lilac", "gpt-up"});
  json body = chat_body(prompt_text(100 * 1024));
  // Some conversations remembered as local (the lookup is part of the decision).
  for (int i = 0; i < 1000; ++i) r.remember_local(chat_body("conversation " + std::to_string(i)));
  for (auto _ : st) {
    RouteDecision d = r.decide(body, true, "", false);
    if (d.route != Route::cloud) st.SkipWithError("a clean prompt was judged sensitive");
    benchmark::DoNotOptimize(d);
  }
  st.SetBytesProcessed(int64_t(st.iterations()) * 100 * 1024);
}
BENCHMARK(BM_RouterDecide100KB)->Unit(benchmark::kMicrosecond);

void BM_RouterDecide100KBSensitiveAtEnd(benchmark::State& st) {
  Router r(parse_route_policy(nlohmann::json::parse(kPolicy)), RouterConfig{"lilac", "gpt-up"});
  json body = chat_body(prompt_text(100 * 1024) + " mail jane.roe@example.org");
  for (auto _ : st) {
    RouteDecision d = r.decide(body, true, "", false);
    if (d.route != Route::local) st.SkipWithError("missed the e-mail");
    benchmark::DoNotOptimize(d);
  }
}
BENCHMARK(BM_RouterDecide100KBSensitiveAtEnd)->Unit(benchmark::kMicrosecond);

void BM_Detectors100KB(benchmark::State& st) {
  std::string text = prompt_text(100 * 1024);
  std::vector<Finding> f;
  for (auto _ : st) {
    f.clear();
    scan_sensitive(text, DetectorSet::all(), f, 1);
    benchmark::DoNotOptimize(f);
  }
  st.SetBytesProcessed(int64_t(st.iterations()) * int64_t(text.size()));
}
BENCHMARK(BM_Detectors100KB)->Unit(benchmark::kMicrosecond);

void BM_PrefixHashes100KB(benchmark::State& st) {
  json body = chat_body(prompt_text(100 * 1024));
  for (auto _ : st) benchmark::DoNotOptimize(message_prefix_hashes(body["messages"]));
}
BENCHMARK(BM_PrefixHashes100KB)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
