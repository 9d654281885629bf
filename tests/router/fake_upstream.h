// The hybrid router's HTTP test fixtures (test_hybrid_upstream*.cpp): a fake upstream on loopback that records what it
// receives and answers in each protocol (and holds background Responses), a front server that runs
// HybridRouter::maybe_forward as `lilac serve` does, lilac's own routes behind a HybridRouter (RoutedServer), and a
// port where nothing listens.
#pragma once
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
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "router/hybrid.h"
#include "router/upstream.h"
#include "serve_thread.h"
#include "server/server_test_util.h"

namespace lilac::router::testing {

using json = nlohmann::json;
using namespace std::chrono_literals;

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
    port = serve_in_thread(http, th);
  }
  ~FakeUpstream() {
    stop_serving(http, th);
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
    port = serve_in_thread(http, th);
  }
  ~Front() {
    stop_serving(http, th);
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

inline json chat_body(const std::string& text, bool stream = false) {
  json b = {{"model", "lilac"}, {"messages", json::array({{{"role", "user"}, {"content", text}}})}};
  if (stream) {
    b["stream"] = true;
    b["stream_options"] = {{"include_usage", true}};
  }
  return b;
}

// POSTs the streamed Responses `body` to lilac, reads the stream's first event (response.created), then goes away: that
// event's response id.
inline std::string first_streamed_response_id(httplib::Client& cli, const json& body) {
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

}  // namespace lilac::router::testing
