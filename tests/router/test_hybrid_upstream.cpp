// The hybrid router over HTTP on loopback: a fake upstream records what it receives; a front server runs
// HybridRouter::maybe_forward like `lilac serve` does. Checks forwarding (model rewrite, `lilac` stripped,
// Bearer key), streaming passed through chunk by chunk with `lilac_route`, 4xx passthrough, 5xx and
// unreachable fallback or 502, and /v1/models merging.
#include <gtest/gtest.h>
#include <httplib.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "router/hybrid.h"
#include "router/upstream.h"
#include "server/server_test_util.h"

using namespace lilac::router;
using json = nlohmann::json;
using namespace std::chrono_literals;

namespace {

struct FakeUpstream {
  httplib::Server http;
  std::thread th;
  int port = 0;
  std::mutex mu;
  std::vector<json> bodies;
  std::vector<std::string> auths;
  std::map<std::string, json> responses;  // /v1/responses: the background responses held here, by id
  int response_gets = 0, response_cancels = 0;
  // 0 ok, 1 -> 500, 2 -> 400, 3 -> 503 on models too, 4 -> 200 that is not JSON, 8 -> 400 whose text is Latin-1,
  // 9 -> 500 whose message has a 2-byte character at bytes 299-300 (5-7: below)
  std::atomic<int> mode{0};
  std::atomic<int> chunk_delay_ms{0};
  std::atomic<int> refuse_status{0};  // non-zero: every POST is answered with this status (refused())
  std::atomic<bool> data_colon_only{false};  // Responses streams write `data:{...}` (SSE's other form: no space)
  std::atomic<bool> created_type_not_string{false};  // the first event's "type" is ["response.created"]

  // A redirect to the provider's site, or a refusal of the router's key, with the headers and body a provider sends.
  bool refused(httplib::Response& res) {
    const int st = refuse_status;
    if (st == 0) return false;
    res.status = st;
    if (st >= 300 && st < 400) res.set_header("Location", "https://provider.example/login?next=/v1");
    if (st == 401) res.set_header("WWW-Authenticate", "Bearer realm=\"provider\"");
    res.set_content(R"({"error":{"message":"Incorrect API key provided: sk-te****cdef","type":"invalid_request_error","code":"invalid_api_key"}})",
                    "application/json");
    return true;
  }

  FakeUpstream() {
    http.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
      json body = json::parse(req.body, nullptr, false);
      {
        std::lock_guard lk(mu);
        bodies.push_back(body);
        auths.push_back(req.get_header_value("Authorization"));
      }
      if (refused(res)) return;
      if (mode == 1) {
        res.status = 500;
        res.set_content(R"({"error":{"message":"boom","type":"server_error"}})", "application/json");
        return;
      }
      if (mode == 4) {
        res.set_content("<html>captive portal</html>", "text/html");
        return;
      }
      if (mode == 8) {
        res.status = 400;
        res.set_content("caf\xe9 au lait is not a model", "text/plain");  // Latin-1: not UTF-8
        return;
      }
      if (mode == 9) {
        res.status = 500;
        res.set_content(json{{"error", {{"message", std::string(299, 'x') + "\xc3\xa9 and more"}}}}.dump(),
                        "application/json");
        return;
      }
      if (mode == 5 || mode == 6 || mode == 7) {  // 5: a 65 MiB answer; 6: an SSE line of 5 MiB; 7: a broken stream
        const int m = mode;
        const char* type = m == 5 ? "application/json" : "text/event-stream";
        res.set_chunked_content_provider(type, [m, n = 0](size_t, httplib::DataSink& sink) mutable {
          std::string s;
          if (m == 7) {
            s = n == 0 ? "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"choi" : "";
            if (n++ > 0) return false;  // the connection breaks off mid-line
          } else if (n < 65) {
            s = n == 0 && m == 5 ? "{\"x\":\"" : n == 0 ? "data: " : "";
            s += std::string(m == 5 ? (1u << 20) : (80u << 10), 'a');
            if (m == 5 && n == 64) s += "\"}";  // valid JSON: only its size is wrong
            ++n;
          } else if (m == 6 && n++ < 200) {  // the line goes on, slowly: the router must cut it
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
            return sink.is_writable();
          } else if (m == 5) {
            sink.done();  // the whole answer, properly ended
            return true;
          } else {
            return false;
          }
          return sink.write(s.data(), s.size());
        });
        return;
      }
      if (mode == 2) {
        res.status = 400;
        res.set_content(R"({"error":{"message":"bad temperature","type":"invalid_request_error","param":"temperature","code":null}})",
                        "application/json");
        return;
      }
      if (body.value("stream", false)) {
        int delay = chunk_delay_ms;
        res.set_chunked_content_provider("text/event-stream", [delay, n = 0](size_t, httplib::DataSink& sink) mutable {
          if (delay) std::this_thread::sleep_for(std::chrono::milliseconds(delay));
          std::string s;
          if (n < 3) {
            json c = {{"id", "up-1"}, {"object", "chat.completion.chunk"}, {"choices", json::array({{{"index", 0}, {"delta", {{"content", "w" + std::to_string(n)}}}}})}};
            s = "data: " + c.dump() + "\n\n";
          } else if (n == 3) {
            json u = {{"id", "up-1"}, {"object", "chat.completion.chunk"}, {"choices", json::array()}, {"usage", {{"prompt_tokens", 7}, {"completion_tokens", 3}, {"total_tokens", 10}}}};
            s = "data: " + u.dump() + "\n\ndata: [DONE]\n\n";
          }
          ++n;
          if (!s.empty()) sink.write(s.data(), s.size());
          if (n > 3) sink.done();
          return true;
        });
        return;
      }
      json out = {{"id", "up-1"},
                  {"object", "chat.completion"},
                  {"model", body.value("model", "")},
                  {"choices", json::array({{{"index", 0}, {"message", {{"role", "assistant"}, {"content", "from upstream"}}}, {"finish_reason", "stop"}}})},
                  {"usage", {{"prompt_tokens", 7}, {"completion_tokens", 2}, {"total_tokens", 9}}}};
      res.set_content(out.dump(), "application/json");
    });
    // Responses: a background response held upstream (its id, "resp_up_<n>"), which GET and cancel reach.
    http.Post("/v1/responses", [this](const httplib::Request& req, httplib::Response& res) {
      if (refused(res)) return;
      json body = json::parse(req.body, nullptr, false);
      json r;
      {
        std::lock_guard lk(mu);
        r = {{"id", "resp_up_" + std::to_string(responses.size())}, {"object", "response"}, {"status", "queued"},
             {"background", body.value("background", false)}, {"model", body.value("model", "")},
             {"output", json::array()}};
        responses[r["id"].get<std::string>()] = r;
      }
      if (!body.value("stream", false)) {
        res.set_content(r.dump(), "application/json");
        return;
      }
      // A background stream: created, queued, then nothing for a while (the generation runs on upstream).
      const std::string data = data_colon_only ? "data:" : "data: ";
      const json created_type = created_type_not_string ? json::array({"response.created"}) : json("response.created");
      res.set_chunked_content_provider("text/event-stream", [r, data, created_type, n = 0](size_t,
                                                                                          httplib::DataSink& sink) mutable {
        if (n++ == 0) {
          const std::string s = "event: response.created\n" + data +
                                json{{"type", created_type}, {"sequence_number", 0}, {"response", r}}.dump() +
                                "\n\nevent: response.queued\n" + data +
                                json{{"type", "response.queued"}, {"sequence_number", 1}, {"response", r}}.dump() + "\n\n";
          return sink.write(s.data(), s.size());
        }
        std::this_thread::sleep_for(20ms);
        return n < 250 && sink.is_writable();
      });
    });
    // The held response the route's id names, counted in `calls`; nullptr after answering 404 (mu held).
    auto held = [this](const httplib::Request& req, httplib::Response& res, int& calls) -> json* {
      ++calls;
      auto it = responses.find(req.matches[1]);
      if (it != responses.end()) return &it->second;
      res.status = 404;
      res.set_content(R"({"error":{"message":"No response found","type":"invalid_request_error","code":null}})",
                      "application/json");
      return nullptr;
    };
    http.Get("/v1/responses/([A-Za-z0-9_-]+)", [this, held](const httplib::Request& req, httplib::Response& res) {
      std::lock_guard lk(mu);
      if (json* r = held(req, res, response_gets)) res.set_content(r->dump(), "application/json");
    });
    http.Post("/v1/responses/([A-Za-z0-9_-]+)/cancel",
              [this, held](const httplib::Request& req, httplib::Response& res) {
                std::lock_guard lk(mu);
                if (json* r = held(req, res, response_cancels)) {
                  (*r)["status"] = "cancelled";
                  res.set_content(r->dump(), "application/json");
                }
              });
    http.Post("/v1/messages", [this](const httplib::Request&, httplib::Response& res) {  // a stream that breaks off
      if (refused(res)) return;
      res.set_chunked_content_provider("text/event-stream", [n = 0](size_t, httplib::DataSink& sink) mutable {
        if (n++ > 0) return false;
        const std::string s = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{}}\n\n"
                              "event: content_block_delta\ndata: {\"type\":\"content_bl";
        return sink.write(s.data(), s.size());
      });
    });
    http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      std::lock_guard lk(mu);
      bodies.push_back(json::parse(req.body, nullptr, false));
      auths.push_back(req.get_header_value("Authorization"));
      res.set_content(R"({"id":"c","object":"text_completion","choices":[{"index":0,"text":"up text","finish_reason":"stop"}]})",
                      "application/json");
    });
    http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      if (mode == 3) {
        res.status = 503;
        return;
      }
      res.set_content(R"({"object":"list","data":[{"id":"up-a","object":"model"},{"id":"up-b","object":"model"}]})",
                      "application/json");
    });
    port = http.bind_to_any_port("127.0.0.1");
    th = std::thread([this] { http.listen_after_bind(); });
    for (int i = 0; i < 500 && !http.is_running(); ++i) std::this_thread::sleep_for(2ms);
  }
  ~FakeUpstream() {
    http.stop();
    th.join();
  }
  size_t count() {
    std::lock_guard lk(mu);
    return bodies.size();
  }
  json last() {
    std::lock_guard lk(mu);
    return bodies.back();
  }
  std::string last_auth() {
    std::lock_guard lk(mu);
    return auths.back();
  }
};

// A front server that does what `lilac serve` does with the hook: ask the router, else answer "local".
struct Front {
  httplib::Server http;
  std::thread th;
  int port = 0;
  std::shared_ptr<HybridRouter> router;
  std::atomic<int> local_served{0};

  Front(const std::string& upstream_url, const char* policy, std::string upstream_model = "up-model") {
    HybridOptions o;
    o.upstream_url = upstream_url;
    o.upstream_model = std::move(upstream_model);
    o.api_key = "sk-test-NEVERLOGME-0123456789abcdef";
    o.policy = parse_route_policy(json::parse(policy));
    router = std::make_shared<HybridRouter>(std::move(o), "lilac");
    auto handler = [this](const httplib::Request& req, httplib::Response& res) {
      json body = json::parse(req.body, nullptr, false);
      if (router->maybe_forward(req, res, body, false) == lilac::server::RouteDecisionKind::Answered) return;
      router->on_local(body);
      ++local_served;
      res.set_header("x-lilac-route", "local");
      res.set_content(json{{"local", true}, {"lilac_route", "local"}}.dump(), "application/json");
    };
    http.Post("/v1/chat/completions", handler);
    http.Post("/v1/completions", handler);
    http.Post("/v1/messages", handler);
    port = http.bind_to_any_port("127.0.0.1");
    th = std::thread([this] { http.listen_after_bind(); });
    for (int i = 0; i < 500 && !http.is_running(); ++i) std::this_thread::sleep_for(2ms);
  }
  ~Front() {
    http.stop();
    th.join();
  }
  httplib::Result post(const json& body, const std::string& path = "/v1/chat/completions", httplib::Headers h = {}) {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(10s);
    return c.Post(path, h, body.dump(), "application/json");
  }
};

// A lilac server (LocalServer: the real routes) whose route hook is a HybridRouter to the fake upstream at `port` with
// route policy `policy` (JSON), and a client of it.
struct RoutedServer {
  std::shared_ptr<HybridRouter> router;  // the hook holds it weakly
  lilac::server::RouteHook hook;
  lilac::test::LocalServer srv;
  httplib::Client cli;

  RoutedServer(int port, const char* policy, std::string api_key = "")
      : router(make_router(port, policy, std::move(api_key))),
        hook(router->make_hook()),
        srv(lilac::test::LocalServer::options(), &hook),
        cli("127.0.0.1", srv.port) {
    cli.set_read_timeout(10s);
  }
  static std::shared_ptr<HybridRouter> make_router(int port, const char* policy, std::string api_key) {
    HybridOptions o;
    o.upstream_url = "http://127.0.0.1:" + std::to_string(port);
    o.upstream_model = "up-model";
    o.api_key = std::move(api_key);
    o.policy = parse_route_policy(json::parse(policy));
    return std::make_shared<HybridRouter>(std::move(o), "local-model");
  }
};

json chat_body(const std::string& text, bool stream = false) {
  json b = {{"model", "lilac"}, {"messages", json::array({{{"role", "user"}, {"content", text}}})}};
  if (stream) {
    b["stream"] = true;
    b["stream_options"] = {{"include_usage", true}};
  }
  return b;
}

// POSTs the streamed Responses `body` to lilac, reads the stream's first event (response.created), then goes away: that
// event's response id.
std::string first_streamed_response_id(httplib::Client& cli, const json& body) {
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/responses";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  std::string got, id;
  req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
    got.append(d, n);
    const size_t end = got.find("\n\n");
    if (end == std::string::npos) return true;
    size_t at = got.find("data:");
    if (at == std::string::npos || at > end) return false;  // no data line in the first event: no id
    at += 5;
    if (got[at] == ' ') ++at;
    id = json::parse(got.substr(at, end - at))["response"]["id"].get<std::string>();
    return false;  // disconnects
  };
  (void)cli.send(req);
  return id;
}

// A loopback port where nothing listens for the life of the object: a socket bound but never listening
// (connections are refused, and no other server can take the port meanwhile).
struct DeadPort {
  int fd = -1;
  int port = 0;
  DeadPort() {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
      socklen_t len = sizeof a;
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
      port = ntohs(a.sin_port);
    }
  }
  ~DeadPort() { ::close(fd); }
};

}  // namespace

TEST(HybridUpstream, ParsesUpstreamUrls) {
  auto u = parse_upstream_url("http://127.0.0.1:9000");
  EXPECT_EQ(u.scheme, "http");
  EXPECT_EQ(u.host, "127.0.0.1");
  EXPECT_EQ(u.port, 9000);
  EXPECT_EQ(u.base, "/v1");
  u = parse_upstream_url("https://api.example.com/openai/v1/");
  EXPECT_EQ(u.port, 443);
  EXPECT_EQ(u.base, "/openai/v1");
  EXPECT_EQ(u.origin(), "https://api.example.com:443");
  u = parse_upstream_url("http://[::1]:8081/v1");
  EXPECT_EQ(u.host, "::1");
  EXPECT_EQ(u.port, 8081);
  EXPECT_EQ(u.origin(), "http://[::1]:8081");  // was "http://::1:8081": no client could connect
  EXPECT_THROW(parse_upstream_url("ftp://x"), lilac::InputError);
  EXPECT_THROW(parse_upstream_url("localhost:80"), lilac::InputError);
  EXPECT_THROW(parse_upstream_url("http://user:pw@host/v1"), lilac::InputError);
  EXPECT_THROW(parse_upstream_url("http://host:99999"), lilac::InputError);
  EXPECT_TRUE(upstream_https_supported());  // Debian's cpp-httplib is built with OpenSSL
}

// SSE's field syntax: "data:" and one optional space before the payload. A bare "data" line (an empty data field in
// SSE) carries no payload for lilac's readers (JSON events), so it is none here.
TEST(HybridUpstream, ReadsTheSseDataPayloadWithOrWithoutTheSpace) {
  EXPECT_EQ(sse_data_payload("data: {\"a\":1}"), "{\"a\":1}");
  EXPECT_EQ(sse_data_payload("data:{\"a\":1}"), "{\"a\":1}");
  EXPECT_EQ(sse_data_payload("data:  {}\n"), " {}\n");  // one space only is the separator
  EXPECT_EQ(sse_data_payload("data:"), "");
  EXPECT_EQ(sse_data_payload("data"), std::nullopt);
  EXPECT_EQ(sse_data_payload("event: data: {}"), std::nullopt);
  EXPECT_EQ(sse_data_payload(": data: {}"), std::nullopt);
}

TEST(HybridUpstream, InjectsRouteIntoSseDataLines) {
  std::string in = "data: {\"a\":1}\n\ndata: {}\n: comment\ndata: [DONE]\n\n";
  EXPECT_EQ(inject_route_into_sse_lines(in, "cloud"),
            "data: {\"lilac_route\":\"cloud\",\"a\":1}\n\ndata: {\"lilac_route\":\"cloud\"}\n: comment\ndata: [DONE]\n\n");
}

TEST(HybridUpstream, ForwardsNonStreamingWithKeyAndRewrittenModel) {
  FakeUpstream up;
  Front front("http://127.0.0.1:" + std::to_string(up.port), R"({"upstream": {"drop_fields": ["top_k"]}})");
  json b = chat_body("What is 2+2?");
  b["lilac"] = {{"route", "cloud"}};
  b["top_k"] = 20;
  auto r = front.post(b);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("x-lilac-route"), "cloud");
  json j = json::parse(r->body);
  EXPECT_EQ(j["lilac_route"], "cloud");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "from upstream");
  EXPECT_EQ(j["usage"]["total_tokens"], 9);
  ASSERT_EQ(up.count(), 1u);
  json sent = up.last();
  EXPECT_EQ(sent["model"], "up-model");
  EXPECT_FALSE(sent.contains("lilac"));
  EXPECT_FALSE(sent.contains("top_k"));
  EXPECT_EQ(sent["messages"][0]["content"], "What is 2+2?");
  EXPECT_EQ(up.last_auth(), "Bearer sk-test-NEVERLOGME-0123456789abcdef");
  // /v1/completions goes to the upstream's /v1/completions.
  r = front.post(json{{"model", "cloud/up-b"}, {"prompt", "Once upon a time"}}, "/v1/completions");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(json::parse(r->body)["choices"][0]["text"], "up text");
  EXPECT_EQ(up.last()["model"], "up-b");
}

TEST(HybridUpstream, SensitiveRequestsNeverReachTheUpstream) {
  FakeUpstream up;
  Front front("http://127.0.0.1:" + std::to_string(up.port), "{}");
  for (bool stream : {false, true}) {
    for (const char* text : {"email me at jane.roe@example.org", "card 4111 1111 1111 1111", "ssn 123-45-6789"}) {
      json b = chat_body(text, stream);
      auto r = front.post(b);
      ASSERT_TRUE(r);
      EXPECT_EQ(r->status, 200);
      EXPECT_EQ(r->get_header_value("x-lilac-route"), "local");
      b["lilac"] = {{"route", "cloud"}};  // asking does not help
      r = front.post(b);
      EXPECT_EQ(r->get_header_value("x-lilac-route"), "local");
      r = front.post(chat_body(text, stream), "/v1/chat/completions", {{"x-lilac-route", "cloud"}});
      EXPECT_EQ(r->get_header_value("x-lilac-route"), "local");
    }
  }
  EXPECT_EQ(up.count(), 0u);
  EXPECT_EQ(front.local_served.load(), 18);
}

TEST(HybridUpstream, StreamsChunkByChunkWithRouteField) {
  FakeUpstream up;
  up.chunk_delay_ms = 150;
  Front front("http://127.0.0.1:" + std::to_string(up.port), "{}");
  httplib::Client c("127.0.0.1", front.port);
  c.set_read_timeout(10s);
  std::vector<std::pair<std::chrono::steady_clock::time_point, std::string>> pieces;
  std::string status_route;
  int status = 0;
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/chat/completions";
  req.body = chat_body("tell me a story", true).dump();
  req.set_header("Content-Type", "application/json");
  req.response_handler = [&](const httplib::Response& r) {
    status = r.status;
    status_route = r.get_header_value("x-lilac-route");
    return true;
  };
  req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
    pieces.emplace_back(std::chrono::steady_clock::now(), std::string(d, n));
    return true;
  };
  auto t0 = std::chrono::steady_clock::now();
  httplib::Response res;
  httplib::Error err;
  ASSERT_TRUE(c.send(req, res, err)) << httplib::to_string(err);
  EXPECT_EQ(status, 200);
  EXPECT_EQ(status_route, "cloud");
  std::string all;
  for (auto& p : pieces) all += p.second;
  // Passed through as it arrived: the first piece came long before the upstream finished (4 x 150 ms).
  ASSERT_GE(pieces.size(), 3u);
  EXPECT_LT(pieces.front().first - t0, 450ms);
  EXPECT_GT(pieces.back().first - pieces.front().first, 250ms);
  // Every data chunk carries lilac_route; the content and usage are intact.
  std::string content;
  int data_lines = 0;
  bool usage = false, done = false;
  size_t pos = 0;
  while ((pos = all.find("data: ", pos)) != std::string::npos) {
    size_t end = all.find('\n', pos);
    std::string payload = all.substr(pos + 6, end - pos - 6);
    pos = end;
    if (payload == "[DONE]") {
      done = true;
      continue;
    }
    json j = json::parse(payload);
    ++data_lines;
    EXPECT_EQ(j["lilac_route"], "cloud");
    if (!j["choices"].empty()) content += j["choices"][0]["delta"]["content"].get<std::string>();
    if (j.contains("usage")) usage = j["usage"]["total_tokens"] == 10;
  }
  EXPECT_EQ(data_lines, 4);
  EXPECT_EQ(content, "w0w1w2");
  EXPECT_TRUE(usage);
  EXPECT_TRUE(done);
  EXPECT_TRUE(up.last()["stream"].get<bool>());
}

TEST(HybridUpstream, ClientErrorsPassThrough) {
  FakeUpstream up;
  up.mode = 2;
  Front front("http://127.0.0.1:" + std::to_string(up.port), "{}");
  for (bool stream : {false, true}) {
    auto r = front.post(chat_body("hello", stream));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400);
    EXPECT_EQ(r->get_header_value("x-lilac-route"), "cloud");
    json j = json::parse(r->body);
    EXPECT_EQ(j["error"]["message"], "bad temperature");
    EXPECT_EQ(j["error"]["param"], "temperature");
  }
  EXPECT_EQ(front.local_served.load(), 0);
}

TEST(HybridUpstream, ServerErrorsFallBackToLocalOr502) {
  FakeUpstream up;
  up.mode = 1;
  {
    Front front("http://127.0.0.1:" + std::to_string(up.port), "{}");
    for (bool stream : {false, true}) {
      auto r = front.post(chat_body("hello", stream));
      ASSERT_TRUE(r);
      EXPECT_EQ(r->status, 200);
      EXPECT_EQ(r->get_header_value("x-lilac-route"), "local");
      EXPECT_EQ(r->get_header_value_count("x-lilac-route"), 1u);
      EXPECT_EQ(r->get_header_value_count("x-lilac-route-reason"), 1u);  // was two: the reason and the fallback's
      if (!stream)  // (the second request is sticky: the first was served here)
        EXPECT_EQ(r->get_header_value("x-lilac-route-reason"), "fallback: default");
    }
    EXPECT_EQ(front.local_served.load(), 2);
  }
  {  // a 2xx that is not JSON (a proxy's page): served locally, labelled local only (it also said "cloud")
    up.mode = 4;
    Front front("http://127.0.0.1:" + std::to_string(up.port), "{}");
    auto r = front.post(chat_body("hello"));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->get_header_value_count("x-lilac-route"), 1u);
    EXPECT_EQ(r->get_header_value("x-lilac-route"), "local");
    up.mode = 1;
  }
  {
    Front strict("http://127.0.0.1:" + std::to_string(up.port), R"({"fallback": {"upstream_failure_to_local": false}})");
    for (bool stream : {false, true}) {
      auto r = strict.post(chat_body("hello", stream));
      ASSERT_TRUE(r);
      EXPECT_EQ(r->status, 502);
      json j = json::parse(r->body);
      EXPECT_NE(j["error"]["message"].get<std::string>().find("HTTP 500: boom"), std::string::npos) << r->body;
      EXPECT_EQ(j["error"]["code"], "upstream_unavailable");
      EXPECT_EQ(r->body.find("NEVERLOGME"), std::string::npos);
    }
    EXPECT_EQ(strict.local_served.load(), 0);
  }
}

TEST(HybridUpstream, UnreachableUpstreamFallsBack) {
  DeadPort dead;
  ASSERT_GT(dead.port, 0);
  const int port = dead.port;
  Front front("http://127.0.0.1:" + std::to_string(port), R"({"upstream": {"connect_timeout_ms": 500}})");
  auto t0 = std::chrono::steady_clock::now();
  for (bool stream : {false, true}) {
    auto r = front.post(chat_body("hello", stream));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->get_header_value("x-lilac-route"), "local");
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
  Front strict("http://127.0.0.1:" + std::to_string(port),
               R"({"fallback": {"upstream_failure_to_local": false}, "upstream": {"connect_timeout_ms": 500}})");
  auto r = strict.post(chat_body("hello"));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 502);
  EXPECT_NE(json::parse(r->body)["error"]["message"].get<std::string>().find("cannot reach the upstream"), std::string::npos);
}

TEST(HybridUpstream, ModelsListedWithPrefixAndFallbackToConfiguredModel) {
  FakeUpstream up;
  Front front("http://127.0.0.1:" + std::to_string(up.port), R"({"upstream": {"models_cache_s": 0}})");
  json m = front.router->extra_models();
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0]["id"], "cloud/up-a");
  EXPECT_EQ(m[1]["id"], "cloud/up-b");
  EXPECT_EQ(m[0]["owned_by"], "upstream");
  // Listed ids are upstream models now.
  EXPECT_TRUE(front.router->router().is_upstream_model("up-a"));
  DeadPort dead;
  Front down("http://127.0.0.1:" + std::to_string(dead.port), R"({"upstream": {"models_timeout_ms": 300}})");
  m = down.router->extra_models();
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0]["id"], "cloud/up-model");
  // Without --upstream-model the first listed id is used for requests naming the local model.
  Front noname("http://127.0.0.1:" + std::to_string(up.port), "{}", "");
  auto r = noname.post(chat_body("hello"));
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(up.last()["model"], "up-a");
}

// An upstream's text in an error the router answers was dumped as strict JSON, which throws on bytes that are not UTF-8.
// A 4xx whose body is not UTF-8 (Latin-1 here) is passed on as the error's message: the front answered 500 instead of
// the upstream's 400. The bytes are U+FFFD now.
TEST(HybridUpstream, AClientErrorWhoseTextIsNotUtf8IsPassedOnWithUFFFD) {
  FakeUpstream up;
  up.mode = 8;
  Front front("http://127.0.0.1:" + std::to_string(up.port), "{}");
  for (bool stream : {false, true}) {
    auto r = front.post(chat_body("hello", stream));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << r->body;
    const json j = json::parse(r->body, nullptr, false);
    ASSERT_TRUE(j.is_object()) << r->body;
    EXPECT_EQ(j["error"]["message"], "The upstream answered HTTP 400: caf\xEF\xBF\xBD au lait is not a model") << r->body;
    EXPECT_EQ(j["error"]["code"], "upstream_error") << r->body;
  }
  EXPECT_EQ(front.local_served.load(), 0);
}

// A 5xx's message is quoted in the 502 (fallback off) cut at 300 bytes, which can end inside a character: the front
// answered 500 instead of the 502 saying why. The cut character is U+FFFD now.
TEST(HybridUpstream, AServerErrorMessageCutInsideACharacterIsA502WithUFFFD) {
  FakeUpstream up;
  up.mode = 9;
  Front strict("http://127.0.0.1:" + std::to_string(up.port), R"({"fallback": {"upstream_failure_to_local": false}})");
  for (bool stream : {false, true}) {
    auto r = strict.post(chat_body("hello", stream));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 502) << r->body;
    const json j = json::parse(r->body, nullptr, false);
    ASSERT_TRUE(j.is_object()) << r->body;
    const std::string m = j["error"].value("message", "");
    EXPECT_NE(m.find("HTTP 500: " + std::string(299, 'x') + "\xEF\xBF\xBD)"), std::string::npos) << m;
    EXPECT_EQ(j["error"]["code"], "upstream_unavailable") << r->body;
  }
  EXPECT_EQ(strict.local_served.load(), 0);
}

// Found by review: nothing bounded what the router held of an upstream's answer (a 65 MiB answer was read whole; an SSE
// "line" with no end grew forever), and a stream that broke off ended with an unnamed chat-shaped error glued to the
// partial line (Anthropic clients skipped it: a silently cut message).
TEST(HybridUpstream, UpstreamAnswersAreBoundedAndBrokenStreamsEndInTheirProtocol) {
  FakeUpstream up;
  Front front("http://127.0.0.1:" + std::to_string(up.port), R"({"sticky": false})");
  up.mode = 5;  // 65 MiB: not forwarded; served locally (the fallback)
  auto r = front.post(chat_body("hello"));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->get_header_value("x-lilac-route"), "local");
  EXPECT_EQ(r->get_header_value("x-lilac-route-reason"), "fallback: default");
  up.mode = 6;  // a stream whose first line has no end for 5 MiB: ends with an error event
  r = front.post(chat_body("hello", true));
  ASSERT_TRUE(r);
  EXPECT_LT(r->body.size(), size_t(1) << 20);
  EXPECT_NE(r->body.find("longer than 4 MiB"), std::string::npos) << r->body.substr(0, 300);
  EXPECT_NE(r->body.find("data: [DONE]"), std::string::npos);
  up.mode = 7;  // chat: the partial line is dropped, a blank line, the error, [DONE]
  r = front.post(chat_body("hello", true));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->body.find("{\"choi\n"), std::string::npos) << r->body;
  EXPECT_NE(r->body.find("\n\ndata: {\"error\""), std::string::npos) << r->body;
  EXPECT_NE(r->body.find("broke off"), std::string::npos) << r->body;
  // Messages: Anthropic's named error event
  json m = {{"model", "lilac"}, {"max_tokens", 10}, {"stream", true},
            {"messages", json::array({{{"role", "user"}, {"content", "hello"}}})}};
  r = front.post(m, "/v1/messages");
  ASSERT_TRUE(r);
  const size_t ev = r->body.find("\n\nevent: error\ndata: {");
  ASSERT_NE(ev, std::string::npos) << r->body;
  EXPECT_EQ(json::parse(r->body.substr(ev + 21))["type"], "error") << r->body;
  EXPECT_EQ(r->body.find("content_bl\n"), std::string::npos) << r->body;
}

// Found by review: a 3xx or a 401 / 403 from the upstream was passed to the client as it was: a redirect (whose
// Location would point the client at the cloud provider), or "your key is wrong" about lilac's configured cloud key.
// They are the upstream failing now: served locally (the fallback), or a 502 saying what the upstream answered; no
// upstream header or body is passed on.
TEST(HybridUpstream, RedirectsAndRefusedCredentialsAreUpstreamFailures) {
  FakeUpstream up;
  const std::string url = "http://127.0.0.1:" + std::to_string(up.port);
  Front strict(url, R"({"fallback": {"upstream_failure_to_local": false}})");
  Front lenient(url, R"({"sticky": false})");
  for (int status : {302, 307, 401, 403}) {
    up.refuse_status = status;
    for (bool stream : {false, true}) {
      const std::string what = "HTTP " + std::to_string(status) + (stream ? " streamed" : "");
      auto r = strict.post(chat_body("hello", stream));
      ASSERT_TRUE(r) << what;
      EXPECT_EQ(r->status, 502) << what << ": " << r->body;
      EXPECT_FALSE(r->has_header("Location")) << what;
      EXPECT_FALSE(r->has_header("WWW-Authenticate")) << what;
      EXPECT_EQ(r->get_header_value("x-lilac-route"), "cloud") << what;
      const json j = json::parse(r->body, nullptr, false);
      ASSERT_TRUE(j.is_object() && j.contains("error")) << what << ": " << r->body;
      EXPECT_EQ(j["error"]["code"], "upstream_unavailable") << what;
      const std::string msg = j["error"]["message"];
      EXPECT_NE(msg.find("the cloud upstream answered HTTP " + std::to_string(status)), std::string::npos) << msg;
      EXPECT_EQ(msg.find("lilac's upstream credentials were refused") != std::string::npos, status >= 400) << msg;
      EXPECT_EQ(r->body.find("Incorrect API key"), std::string::npos) << r->body;
      EXPECT_EQ(r->body.find("provider.example"), std::string::npos) << r->body;
      // With the fallback on (the default): served locally, saying so.
      r = lenient.post(chat_body("hello", stream));
      ASSERT_TRUE(r) << what;
      EXPECT_EQ(r->status, 200) << what << ": " << r->body;
      EXPECT_EQ(r->get_header_value("x-lilac-route"), "local") << what;
      EXPECT_EQ(r->get_header_value("x-lilac-route-reason"), "fallback: default") << what;
      EXPECT_FALSE(r->has_header("Location")) << what;
    }
  }
  EXPECT_EQ(strict.local_served.load(), 0);
  // A 4xx about the request itself still passes through.
  up.refuse_status = 0;
  up.mode = 2;
  auto r = strict.post(chat_body("hello"));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
}

// The same through lilac's server, whose endpoints answer the router's 502 in their protocol's error shape: OpenAI's
// on chat/completions and Responses, Anthropic's on Messages (the 401 reached a Messages client as its own key's
// authentication_error).
TEST(HybridUpstream, RefusedUpstreamAnswersAre502InTheEndpointsShape) {
  FakeUpstream up;
  up.refuse_status = 401;
  RoutedServer rs(up.port, R"({"fallback": {"upstream_failure_to_local": false}})", "sk-test-NEVERLOGME-0123456789abcdef");
  httplib::Client& cli = rs.cli;
  const json user = json::array({{{"role", "user"}, {"content", "hello"}}});
  for (bool stream : {false, true}) {
    auto r = cli.Post("/v1/chat/completions", json{{"messages", user}, {"stream", stream}}.dump(), "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 502) << r->body;
    EXPECT_FALSE(r->has_header("WWW-Authenticate"));
    json j = json::parse(r->body, nullptr, false);
    EXPECT_EQ(j["error"]["code"], "upstream_unavailable") << r->body;
    EXPECT_NE(j["error"]["message"].get<std::string>().find("HTTP 401: lilac's upstream credentials were refused"),
              std::string::npos) << r->body;
    r = cli.Post("/v1/messages", json{{"messages", user}, {"max_tokens", 20}, {"stream", stream}}.dump(), "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 502) << r->body;
    j = json::parse(r->body, nullptr, false);
    EXPECT_EQ(j["type"], "error") << r->body;
    EXPECT_EQ(j["error"]["type"], "api_error") << r->body;  // not authentication_error: the client's key is fine
    EXPECT_NE(j["error"]["message"].get<std::string>().find("HTTP 401: lilac's upstream credentials were refused"),
              std::string::npos) << r->body;
    r = cli.Post("/v1/responses", json{{"input", "hello"}, {"stream", stream}}.dump(), "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 502) << r->body;
    EXPECT_EQ(json::parse(r->body, nullptr, false)["error"]["code"], "upstream_unavailable") << r->body;
  }
  EXPECT_EQ(up.count(), 2u);  // the chat requests reached it (the only path that records bodies)
}

// A background Responses request the router sends to the cloud is held upstream, under the upstream's id: the client
// cancels it and polls it through lilac as one lilac served (cancel: "cancelled"; GET: the object), whether it was
// answered whole or streamed and the client left the stream. lilac answered 404 ("not stored here") to both, for a
// response it had accepted and answered with that id. An id lilac never handed out is still 404, never asked upstream.
TEST(HybridUpstream, ARoutedBackgroundResponseIsCancelledAndFetchedThroughLilac) {
  FakeUpstream up;
  RoutedServer rs(up.port, R"({"default_route": "cloud"})");
  httplib::Client& cli = rs.cli;
  for (bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "streamed" : "whole");
    const json body = {{"input", "hello"}, {"background", true}, {"stream", stream}};
    std::string id;
    if (!stream) {
      auto r = cli.Post("/v1/responses", body.dump(), "application/json");
      ASSERT_TRUE(r);
      ASSERT_EQ(r->status, 200) << r->body;
      EXPECT_EQ(r->get_header_value("x-lilac-route"), "cloud");
      id = json::parse(r->body)["id"].get<std::string>();
    } else {
      id = first_streamed_response_id(cli, body);
    }
    ASSERT_EQ(id.rfind("resp_up_", 0), 0u) << id;
    auto r = cli.Post("/v1/responses/" + id + "/cancel", "", "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
    json j = json::parse(r->body, nullptr, false);
    EXPECT_EQ(j.value("id", ""), id) << r->body;
    EXPECT_EQ(j.value("status", ""), "cancelled") << r->body;
    r = cli.Get("/v1/responses/" + id);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
    j = json::parse(r->body, nullptr, false);
    EXPECT_EQ(j.value("id", ""), id) << r->body;
    EXPECT_EQ(j.value("status", ""), "cancelled") << r->body;
  }
  {
    std::lock_guard lk(up.mu);
    EXPECT_EQ(up.response_cancels, 2);
    EXPECT_EQ(up.response_gets, 2);
  }
  // Its events are not streamed again through lilac: 400 naming "stream", as for a local one whose events are not held.
  {
    auto r = cli.Get("/v1/responses/resp_up_0?stream=true");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << r->body;
    EXPECT_EQ(json::parse(r->body, nullptr, false)["error"]["param"], "stream") << r->body;
  }
  // An id lilac never answered with: lilac's own 404, and the upstream is not asked.
  auto r = cli.Get("/v1/responses/resp_never_seen");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404) << r->body;
  r = cli.Post("/v1/responses/resp_never_seen/cancel", "", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404) << r->body;
  std::lock_guard lk(up.mu);
  EXPECT_EQ(up.response_cancels, 2);
  EXPECT_EQ(up.response_gets, 2);
}

// A background Responses stream routed to the fake upstream, then a GET of the id its first event named, through lilac:
// that id, the GET's answer, and how many GETs reached the upstream.
struct StreamedThenFetched {
  std::string id;
  int status = 0;
  std::string body;
  int upstream_gets = 0;
};
StreamedThenFetched stream_then_fetch(FakeUpstream& up) {
  RoutedServer rs(up.port, R"({"default_route": "cloud"})");
  StreamedThenFetched out;
  out.id = first_streamed_response_id(rs.cli, json{{"input", "hello"}, {"background", true}, {"stream", true}});
  if (auto r = rs.cli.Get("/v1/responses/" + out.id)) {
    out.status = r->status;
    out.body = r->body;
  }
  std::lock_guard lk(up.mu);
  out.upstream_gets = up.response_gets;
  return out;
}

// SSE's data field is "data:" and one optional space. An upstream that streams `data:{...}` has its response.created id
// remembered as one that streams `data: {...}`: the client GETs it through lilac. The router read the id only from
// "data: " lines (while it added lilac_route to both forms), so lilac answered its own 404 for an id it had handed out.
TEST(HybridUpstream, AStreamWrittenAsDataColonBraceRemembersItsResponseId) {
  FakeUpstream up;
  up.data_colon_only = true;
  const StreamedThenFetched f = stream_then_fetch(up);
  ASSERT_EQ(f.id, "resp_up_0");
  EXPECT_EQ(f.status, 200) << f.body;
  EXPECT_EQ(json::parse(f.body, nullptr, false).value("id", ""), f.id) << f.body;
  EXPECT_EQ(f.upstream_gets, 1);
}

// An upstream event that names response.created but whose "type" is not a string is passed on as it came and
// remembers nothing: reading it (nlohmann's value("type", "") throws type_error for a non-string) threw out of the
// stream's pump.
TEST(HybridUpstream, ACreatedEventWhoseTypeIsNotAStringIsPassedOnAndRemembersNothing) {
  FakeUpstream up;
  up.created_type_not_string = true;
  const StreamedThenFetched f = stream_then_fetch(up);
  EXPECT_EQ(f.id, "resp_up_0");
  EXPECT_EQ(f.status, 404) << f.body;  // not remembered: lilac's own answer
  EXPECT_EQ(f.upstream_gets, 0);
}
