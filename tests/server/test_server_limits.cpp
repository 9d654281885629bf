// `lilac serve` (in-process, scripted backend) under the hostile inputs and slow clients of issue 13:
// /health while slow-header clients hold connections and every generation slot is taken, 429 beyond
// the queue, bodies bounded after decoding, deep and wide JSON, max_tokens overflow, the bearer scheme
// in any case, 405 with Allow, bounded metric labels; and shutdown: queued requests get 503, running
// ones finish within the grace period or end with an error (never a 200 with cut text).
#include <gtest/gtest.h>
#include <httplib.h>
#include <zlib.h>

#include <atomic>
#include <future>
#include <thread>

#include <nlohmann/json.hpp>

#include "raw_socket.h"
#include "server/metrics.h"
#include "server/server.h"
#include "server_test_util.h"

using json = nlohmann::json;
using namespace std::chrono_literals;
using lilac::test::LocalServer;
using lilac::test::Sock;
using lilac::test::status_of;
using lilac::test::wait_for;

namespace {

json chat(const std::string& text) { return {{"messages", {{{"role", "user"}, {"content", text}}}}}; }

httplib::Result post(int port, const json& body, httplib::Headers h = {}, int timeout_s = 10) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(std::chrono::seconds(timeout_s));
  c.set_connection_timeout(std::chrono::seconds(timeout_s));
  return c.Post("/v1/chat/completions", h, body.dump(), "application/json");
}

int health(int port, std::string* body = nullptr) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(5s);
  c.set_connection_timeout(5s);
  auto r = c.Get("/health");
  if (body && r) *body = r->body;
  return r ? r->status : -1;
}

std::string gzip(const std::string& data) {
  z_stream zs{};
  deflateInit2(&zs, Z_BEST_COMPRESSION, Z_DEFLATED, 15 + 16, 9, Z_DEFAULT_STRATEGY);
  std::string out(deflateBound(&zs, data.size()) + 64, '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  zs.avail_in = static_cast<uInt>(data.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  deflate(&zs, Z_FINISH);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

}  // namespace

// Issue 13, 4: 70 connections trickling one header byte at a time made /health and every request time
// out (each held a worker). Now they only hold a connection; the I/O thread answers /health.
TEST(ServerLimits, HealthAndRequestsAnswerWhileSlowHeaderClientsHoldConnections) {
  auto o = LocalServer::options(2);
  o.http_threads = 4;
  o.header_timeout_ms = 3000;
  LocalServer l(o);
  std::vector<std::unique_ptr<Sock>> slow;
  for (int i = 0; i < 70; ++i) {
    slow.push_back(std::make_unique<Sock>(l.port));
    slow.back()->send("P");
  }
  for (int round = 0; round < 3; ++round) {
    for (auto& s : slow) s->send("O");
    EXPECT_EQ(health(l.port), 200);
    auto r = post(l.port, chat("hi"), {}, 5);
    ASSERT_TRUE(r) << "a request timed out while slow clients held connections";
    EXPECT_EQ(r->status, 200);
    std::this_thread::sleep_for(100ms);
  }
  for (auto& s : slow) EXPECT_EQ(status_of(s->answer(10000ms)), 408);
}

// Issue 13, 4: with --max-queue equal to the worker count 429 never fired. Streams take the queue; the
// next request finds a worker and gets 429 at once; /health and /metrics answer meanwhile.
TEST(ServerLimits, StreamsBeyondTheQueueGet429AndHealthAnswers) {
  auto o = LocalServer::options(2);
  o.http_threads = 3;
  LocalServer l(o);
  json slow = chat("slow");
  slow["stream"] = true;
  slow["max_tokens"] = 100;
  std::vector<std::future<int>> streams;
  for (int i = 0; i < 2; ++i)
    streams.push_back(std::async(std::launch::async, [&] {
      auto r = post(l.port, slow, {}, 30);
      return r ? r->status : -1;
    }));
  ASSERT_TRUE(wait_for([&] { return l.server->metrics().queue_depth.load() == 2; }));
  auto r = post(l.port, chat("hi"));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 429);
  EXPECT_EQ(json::parse(r->body)["error"]["code"], "queue_full");
  EXPECT_EQ(health(l.port), 200);
  httplib::Client m("127.0.0.1", l.port);
  auto mr = m.Get("/metrics");
  ASSERT_TRUE(mr);
  const size_t at = mr->body.find("\nlilac_http_workers_busy ");
  ASSERT_NE(at, std::string::npos) << mr->body;
  EXPECT_GE(std::stoi(mr->body.substr(at + 25)), 2) << mr->body;  // the two streams (+ the 429 one finishing)
  for (auto& s : streams) EXPECT_EQ(s.get(), 200);
}

// Issue 13, 2: the body limit held for Content-Length only.
TEST(ServerLimits, BodiesAreBoundedAfterDecoding) {
  auto o = LocalServer::options();
  o.max_body_bytes = 1u << 20;
  LocalServer l(o);
  httplib::Client c("127.0.0.1", l.port);
  // gzip: 32 MB of text in ~32 KB.
  json big = chat(std::string(32u << 20, 'a'));
  httplib::Headers gz = {{"Content-Encoding", "gzip"}};
  auto r = c.Post("/v1/chat/completions", gz, gzip(big.dump()), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 413);
  EXPECT_NE(r->body.find("after decompression"), std::string::npos);
  EXPECT_EQ(json::parse(r->body)["error"]["code"], "payload_too_large");
  // A small gzip body is served.
  r = c.Post("/v1/chat/completions", gz, gzip(chat("hi").dump()), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  // Chunked: 2 MB in 64 KB chunks.
  std::string body = chat(std::string(2u << 20, 'b')).dump();
  size_t off = 0;
  r = c.Post("/v1/chat/completions", [&](size_t, httplib::DataSink& sink) {
    size_t n = std::min<size_t>(65536, body.size() - off);
    sink.write(body.data() + off, n);
    off += n;
    if (off == body.size()) sink.done();
    return true;
  }, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 413);
  // Content-Length: 10^20 is answered at once (the body is never awaited).
  Sock s(l.port);
  s.send("POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 100000000000000000000\r\n\r\n");
  EXPECT_EQ(status_of(s.answer(5000ms)), 413);
  // No length at all: 411 (never read to EOF).
  Sock n(l.port);
  n.send("POST /v1/chat/completions HTTP/1.1\r\nContent-Type: application/json\r\n\r\n{}");
  EXPECT_EQ(status_of(n.answer(5000ms)), 411);
}

// Issue 13, 1 and 5: 100,000-deep JSON crashed the hybrid path (recursion); 400,000 keys took 138 s;
// a 100,000-entry logit_bias 9 s. Since stop 50 an object of more than 16,384 keys is a 400 (json_too_large): the
// 400,000-key body cost ~80 MB of RSS per request while parsed; 16,384 keys still parse (linear, through the index).
TEST(ServerLimits, DeepAndWideJson) {
  LocalServer l(LocalServer::options());
  std::string deep = R"({"messages":[{"role":"user","content":"hi"}],"metadata":)" + std::string(100000, '[') +
                     std::string(100000, ']') + "}";
  httplib::Client c("127.0.0.1", l.port);
  c.set_read_timeout(60s);
  auto r = c.Post("/v1/chat/completions", deep, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(json::parse(r->body)["error"]["code"], "json_too_deep");
  auto wide = [](int keys) {
    // (under a field the server ignores: `metadata` is checked, at most 16 pairs)
    std::string w = R"({"messages":[{"role":"user","content":"hi"}],"x_unknown":{)";
    for (int i = 0; i < keys; ++i) w += (i ? ",\"" : "\"") + std::to_string(i) + "\":1";
    return w + "}}";
  };
  const std::string w400k = wide(400000);
  ASSERT_GT(w400k.size(), 4000000u);
  r = c.Post("/v1/chat/completions", w400k, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body.substr(0, 300);
  EXPECT_EQ(json::parse(r->body)["error"]["code"], "json_too_large");
  EXPECT_NE(json::parse(r->body)["error"]["message"].get<std::string>().find("more than 16384 keys"), std::string::npos);
  r = c.Post("/v1/chat/completions", wide(16384), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body.substr(0, 300);
  std::string bias = R"({"messages":[{"role":"user","content":"hi"}],"logit_bias":{)";
  for (int i = 0; i < 16000; ++i) bias += (i ? ",\"" : "\"") + std::to_string(i) + "\":1";  // past 1,024
  bias += "}}";
  r = c.Post("/v1/chat/completions", bias, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(json::parse(r->body)["error"]["param"], "logit_bias");
}

// Issue 13, 6: max_tokens of 2^63-1 overflowed the context check (HTTP 200 with an error inside).
TEST(ServerLimits, HugeMaxTokensIs400) {
  LocalServer l(LocalServer::options());
  for (const char* mt : {"9223372036854775807", "18446744073709551615", "9223372036854775000"}) {
    std::string body = R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":)" + std::string(mt) + "}";
    httplib::Client c("127.0.0.1", l.port);
    auto r = c.Post("/v1/chat/completions", body, "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << mt << ": " << r->body;
    EXPECT_EQ(json::parse(r->body)["error"]["code"], "context_length_exceeded") << r->body;
  }
}

// Issue 13, 7: "Authorization: bearer" (lower case) was rejected; a wrong method answered 404.
TEST(ServerLimits, BearerInAnyCaseAnd405WithAllow) {
  auto o = LocalServer::options();
  o.api_key = "s3cret";
  LocalServer l(o);
  for (const char* auth : {"Bearer s3cret", "bearer s3cret", "BEARER   s3cret  "}) {
    auto r = post(l.port, chat("hi"), {{"Authorization", auth}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << auth;
  }
  for (const char* auth : {"Bearer s3cre", "Basic s3cret", "Bearers3cret", "s3cret"}) {
    auto r = post(l.port, chat("hi"), {{"Authorization", auth}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 401) << auth;
  }
  httplib::Client c("127.0.0.1", l.port);
  httplib::Headers auth = {{"Authorization", "Bearer s3cret"}};
  auto r = c.Get("/v1/chat/completions", auth);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 405);
  EXPECT_EQ(r->get_header_value("Allow"), "POST, OPTIONS");
  EXPECT_EQ(json::parse(r->body)["error"]["code"], "method_not_allowed");
  r = c.Post("/v1/models", auth, "{}", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 405);
  EXPECT_EQ(r->get_header_value("Allow"), "GET, OPTIONS");
  // Unknown paths do not become metric labels.
  for (int i = 0; i < 5; ++i) c.Get("/random-" + std::to_string(i));
  r = c.Get("/metrics");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->body.find("random-"), std::string::npos);
  EXPECT_NE(r->body.find("lilac_requests_total{endpoint=\"other\",status=\"404\"} 5"), std::string::npos) << r->body;
}

// Issue 13, 6: SIGTERM answered running non-streaming requests 200 with cut text and queued ones 200
// with empty content; streams ended without an error event or [DONE].
TEST(ServerShutdown, QueuedGet503RunningFinishWithinTheGrace) {
  LocalServer l(LocalServer::options(4));
  json running = chat("slow");
  running["max_tokens"] = 25;  // ~0.5 s
  auto first = std::async(std::launch::async, [&] { return post(l.port, running, {}, 30); });
  ASSERT_TRUE(wait_for([&] { return l.server->metrics().running.load() == 1; }));
  std::vector<std::future<httplib::Result>> queued;
  for (int i = 0; i < 2; ++i) queued.push_back(std::async(std::launch::async, [&] { return post(l.port, running, {}, 30); }));
  ASSERT_TRUE(wait_for([&] { return l.server->metrics().queue_depth.load() == 3; }));
  std::thread stopper([&] { l.server->shutdown(20000); });
  for (auto& q : queued) {
    auto r = q.get();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 503) << r->body;
    EXPECT_EQ(json::parse(r->body)["error"]["code"], "shutting_down");
  }
  std::string hb;
  EXPECT_EQ(health(l.port, &hb), 503);
  EXPECT_NE(hb.find("shutting_down"), std::string::npos);
  auto r = first.get();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  json j = json::parse(r->body);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["completion_tokens"], 25);
  stopper.join();
}

TEST(ServerShutdown, RunningPastTheGraceEndWithAnErrorNever200) {
  LocalServer l(LocalServer::options(4));
  json body = chat("slow");
  body["max_tokens"] = 30000;
  json stream_body = body;
  stream_body["stream"] = true;
  auto plain = std::async(std::launch::async, [&] { return post(l.port, body, {}, 30); });
  ASSERT_TRUE(wait_for([&] { return l.server->metrics().running.load() == 1; }));
  // The stream waits behind it; to have it running too, shut down with a grace that ends both: the
  // plain one is running (-> 503 after the grace), the stream is queued (-> 503 at once).
  auto stream_queued = std::async(std::launch::async, [&] { return post(l.port, stream_body, {}, 30); });
  ASSERT_TRUE(wait_for([&] { return l.server->metrics().queue_depth.load() == 2; }));
  l.server->shutdown(300);
  auto r = plain.get();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503) << r->body.substr(0, 200);
  EXPECT_EQ(json::parse(r->body)["error"]["code"], "shutting_down");
  auto s = stream_queued.get();
  ASSERT_TRUE(s);
  EXPECT_EQ(s->status, 503);
}

TEST(ServerShutdown, AStreamCutByShutdownEndsWithAnErrorEventAndDone) {
  LocalServer l(LocalServer::options(4));
  json body = chat("slow");
  body["max_tokens"] = 30000;
  body["stream"] = true;
  auto stream = std::async(std::launch::async, [&] { return post(l.port, body, {}, 30); });
  ASSERT_TRUE(wait_for([&] { return l.server->metrics().running.load() == 1; }));
  std::this_thread::sleep_for(200ms);  // some tokens out
  l.server->shutdown(200);
  auto r = stream.get();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  const std::string& t = r->body;
  size_t err = t.find("data: {\"error\"");
  ASSERT_NE(err, std::string::npos) << t.substr(t.size() > 400 ? t.size() - 400 : 0);
  EXPECT_NE(t.find("shutting down", err), std::string::npos);
  EXPECT_EQ(t.substr(t.size() - 14), "data: [DONE]\n\n");
  EXPECT_EQ(t.find("finish_reason\":\"stop\""), std::string::npos);
}

// Issue 13, 7: tool_calls came back for a request without tools or with tool_choice "none"; control
// tokens typed by a user were tokenized as control tokens.
TEST(ServerProtocol, NoToolCallsWithoutToolsAndRequestTextIsNeverSpecial) {
  json script = {{"rules", {{{"match", "weather"},
                             {"reply", "</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
                                       "</parameter>\n</function>\n</tool_call>"}}}},
                 {"default", {{"reply", "</think>\n\nok"}}}};
  LocalServer l(LocalServer::options(), nullptr, script);
  json tools = json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])");
  json with_tools = chat("weather in Paris?");
  with_tools["tools"] = tools;
  auto r = post(l.port, with_tools);
  ASSERT_TRUE(r);
  json j = json::parse(r->body);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls") << r->body;  // the control
  for (json body : {chat("weather in Paris?"), with_tools}) {
    if (body.contains("tools")) body["tool_choice"] = "none";
    r = post(l.port, body);
    ASSERT_TRUE(r);
    j = json::parse(r->body);
    EXPECT_EQ(j["choices"][0]["finish_reason"], "stop") << r->body;
    EXPECT_FALSE(j["choices"][0]["message"].contains("tool_calls")) << r->body;
    EXPECT_NE(j["choices"][0]["message"]["content"].get<std::string>().find("<tool_call>"), std::string::npos);
  }
  // "<|im_end|>" typed by the user is several plain tokens, not one control token.
  auto prompt_tokens = [&](const std::string& text) {
    auto res = post(l.port, chat(text));
    return res ? json::parse(res->body)["usage"]["prompt_tokens"].get<int>() : -1;
  };
  EXPECT_GE(prompt_tokens("hi<|im_end|>") - prompt_tokens("hi"), 4);
  httplib::Client c("127.0.0.1", l.port);
  auto comp = c.Post("/v1/completions", R"({"prompt": "<|im_end|>", "max_tokens": 1})", "application/json");
  ASSERT_TRUE(comp);
  EXPECT_GE(json::parse(comp->body)["usage"]["prompt_tokens"].get<int>(), 4) << comp->body;
}

// A tool call cut off by max_tokens got stop_reason "tool_use" on /v1/messages (the call count was checked before
// the length finish); Anthropic answers "max_tokens" then, as OpenAI's finish_reason says "length".
TEST(ServerProtocol, AToolCallCutByMaxTokensStopsForMaxTokens) {
  std::string call = "<tool_call>\n<function=get_weather>\n<parameter=city>\n";
  for (int i = 0; i < 40; ++i) call += "Paris and more ";
  call += "\n</parameter>\n</function>\n</tool_call>";
  // Messages requests have thinking off, chat requests on (their reply closes the reasoning first).
  json script = {{"rules", {{{"match", "chat:"}, {"reply", "</think>\n\n" + call}}}}, {"default", {{"reply", call}}}};
  LocalServer l(LocalServer::options(), nullptr, script);
  json msg = {{"max_tokens", 40},
              {"messages", {{{"role", "user"}, {"content", "weather in Paris?"}}}},
              {"tools", json::parse(R"([{"name": "get_weather", "input_schema": {"type": "object",
                                        "properties": {"city": {"type": "string"}}}}])")}};
  const json m = lilac::test::post_json(l.port, "/v1/messages", msg);
  ASSERT_TRUE(m["content"].is_array()) << m.dump();
  ASSERT_FALSE(m["content"].empty()) << m.dump();
  EXPECT_EQ(m["content"][0]["type"], "tool_use") << m.dump();  // the call was cut, not absent
  EXPECT_EQ(m["stop_reason"], "max_tokens") << m.dump();
  msg["stream"] = true;
  httplib::Client c("127.0.0.1", l.port);
  auto r = c.Post("/v1/messages", msg.dump(), "application/json");
  ASSERT_TRUE(r);
  std::string stop_reason;
  for (const json& e : lilac::test::sse_events(r->body))
    if (e.value("type", "") == "message_delta") stop_reason = e["delta"]["stop_reason"];
  EXPECT_EQ(stop_reason, "max_tokens") << r->body;
  // The control: OpenAI's chat completion of the same cut call says "length".
  json body = chat("chat: weather in Paris?");
  body["max_tokens"] = 40;
  body["tools"] = json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])");
  r = post(l.port, body);
  ASSERT_TRUE(r);
  const json j = json::parse(r->body);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length") << r->body;
  EXPECT_TRUE(j["choices"][0]["message"].contains("tool_calls")) << r->body;
}

// A client that half-closes its connection after its request (shutdown(SHUT_WR), as `nc -N` does) counts as gone: its
// generation is cancelled. It was then sent "200 OK" with an empty body, as if the request had succeeded; nothing is
// written now and the connection closes.
TEST(ServerLimits, AHalfClosedClientGetsNoFalseSuccess) {
  LocalServer l(LocalServer::options());
  const std::string body = R"({"messages":[{"role":"user","content":"slow please"}],"max_tokens":500})";
  Sock s(l.port);
  ASSERT_TRUE(s.send("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                     std::to_string(body.size()) + "\r\n\r\n" + body));
  std::this_thread::sleep_for(100ms);  // the generation runs
  ::shutdown(s.fd, SHUT_WR);
  const std::string got = s.read(5000ms);
  EXPECT_EQ(got.find("200 OK"), std::string::npos) << got;
  EXPECT_TRUE(got.empty()) << got;
  // The server goes on: the next request is answered.
  httplib::Client c("127.0.0.1", l.port);
  auto r = c.Post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":5})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
}
