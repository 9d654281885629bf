// Server overhead: the full HTTP path (httplib, JSON parse + validation, chat template, tokenizer,
// scheduler, generator, detokenizer, output parser, SSE JSON) against an engine stub that produces
// tokens instantly (the scripted backend), on loopback with a real HTTP client.
//   BM_StreamPerToken: streamed chat completion of N tokens; per-token overhead = (T(N) - T(1)) / (N - 1)
//                      is reported as the counter us_per_token (target < 50 us).
//   BM_TimeToFirstByte: request sent -> first content chunk received (target < 2 ms).
// Run: build/bench_server   (needs ../shared/fixtures for the tokenizer and the Qwen3.6 template)
#include <benchmark/benchmark.h>
#include <httplib.h>

#include <chrono>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "core/log.h"
#include "core/mapped_file.h"
#include "engine/backend.h"
#include "server/scripted_backend.h"
#include "server/server.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Fixture {
  std::unique_ptr<lilac::server::Server> server;
  int port = 0;
  Fixture() {
    lilac::set_log_level(lilac::LogLevel::Warn);
    const std::string shared = LILAC_SHARED_DIR;
    auto tok = std::shared_ptr<const lilac::Tokenizer>(lilac::Tokenizer::load(shared + "/fixtures/qwen3-tokenizer"));
    auto tmpl = std::shared_ptr<const lilac::ChatTemplate>(lilac::ChatTemplate::from_source(
        lilac::read_text_file(shared + "/fixtures/qwen3.6-template/chat_template.jinja"), "qwen3.6 template"));
    nlohmann::json script = {
        {"default", {{"reply", "</think>\n\nThe quick brown fox jumps over the lazy dog, again and again. "}, {"repeat", true}}}};
    auto backend = std::shared_ptr<lilac::Backend>(lilac::server::make_scripted_backend(script, tok));
    lilac::server::ServerOptions o;
    o.port = 0;
    o.model_id = "bench";
    o.max_seq = 1 << 20;
    server = std::make_unique<lilac::server::Server>(o);
    port = server->bind();
    server->start();
    server->set_model(backend, tok, tmpl);
  }
  ~Fixture() { server->stop(); }
};

Fixture& fixture() {
  static Fixture f;
  return f;
}

std::string body(int max_tokens) {
  return nlohmann::json{{"model", "bench"},
                        {"messages", {{{"role", "user"}, {"content", "Tell me a story."}}}},
                        {"max_tokens", max_tokens},
                        {"stream", true}}
      .dump();
}

// Streams one completion; returns seconds until the first content chunk and in total.
std::pair<double, double> stream_once(httplib::Client& cli, int max_tokens, bool stop_at_first) {
  const auto t0 = Clock::now();
  double first = -1;
  size_t bytes = 0;
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/chat/completions";
  req.headers = {{"Content-Type", "application/json"}};
  req.body = body(max_tokens);
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    bytes += len;
    if (first < 0 && std::string_view(data, len).find("\"content\":\"T") != std::string_view::npos) {
      first = std::chrono::duration<double>(Clock::now() - t0).count();
      if (stop_at_first) return false;
    }
    return true;
  };
  auto res = cli.send(req);
  double total = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!stop_at_first && (!res || res->status != 200)) throw std::runtime_error("request failed");
  if (bytes == 0) throw std::runtime_error("no bytes");
  return {first, total};
}

void BM_StreamPerToken(benchmark::State& state) {
  auto& f = fixture();
  const int n = int(state.range(0));
  httplib::Client cli("127.0.0.1", f.port);
  cli.set_keep_alive(true);
  cli.set_tcp_nodelay(true);
  stream_once(cli, 4, false);  // warm up (template, tokenizer caches, connection)
  double t1 = 0, tn = 0;
  int iters = 0;
  for (auto _ : state) {
    t1 += stream_once(cli, 1, false).second;
    tn += stream_once(cli, n, false).second;
    ++iters;
  }
  state.counters["us_per_token"] = (tn - t1) / iters / (n - 1) * 1e6;
  state.counters["ms_per_request_1tok"] = t1 / iters * 1e3;
}
BENCHMARK(BM_StreamPerToken)->Arg(1000)->Unit(benchmark::kMillisecond)->Iterations(10);

void BM_TimeToFirstByte(benchmark::State& state) {
  auto& f = fixture();
  httplib::Client cli("127.0.0.1", f.port);
  cli.set_keep_alive(false);
  cli.set_tcp_nodelay(true);
  stream_once(cli, 4, false);
  double sum = 0, worst = 0;
  int iters = 0;
  for (auto _ : state) {
    double t = stream_once(cli, 8, false).first;
    sum += t;
    worst = std::max(worst, t);
    ++iters;
  }
  state.counters["ttfb_ms"] = sum / iters * 1e3;
  state.counters["ttfb_worst_ms"] = worst * 1e3;
}
BENCHMARK(BM_TimeToFirstByte)->Unit(benchmark::kMillisecond)->Iterations(50);

}  // namespace

BENCHMARK_MAIN();
