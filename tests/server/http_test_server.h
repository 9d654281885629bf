// The HTTP-layer tests' server (tests/server/test_http_server.cpp, test_http_clients.cpp): HttpServer on a free
// port with /health (inline), /slow (held at a gate) and /echo, and the checks those tests share.
#pragma once
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "raw_socket.h"
#include "server/http_server.h"

namespace lilac::test {

using lilac::server::HttpServer;
using lilac::server::HttpServerOptions;
using lilac::server::RouteOptions;

// The answer to a request the server is too busy to take: `status` (503, or 529 on /v1/messages*), server_busy,
// Retry-After: 1.
inline void busy(const std::string& a, int status = 503) {
  EXPECT_EQ(status_of(a), status) << a;
  EXPECT_NE(a.find("server_busy"), std::string::npos) << a;
  EXPECT_NE(a.find("Retry-After: 1"), std::string::npos) << a;
}

// A gate the stalled handlers wait on (released by the test or after 20 s).
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  void wait() {
    std::unique_lock lk(mu);
    cv.wait_for(lk, 20s, [&] { return open; });
  }
  void release() {
    {
      std::lock_guard lk(mu);
      open = true;
    }
    cv.notify_all();
  }
};

struct TestServer {
  HttpServer http;
  int port = 0;
  Gate gate;
  std::atomic<int> served{0};
  // `extra`: more routes, registered before the server starts (the route table is fixed after).
  explicit TestServer(HttpServerOptions o, const std::function<void(HttpServer&)>& extra = nullptr) : http(o) {
    RouteOptions fast;
    fast.run_inline = true;
    http.Get("/health", [](const httplib::Request&, httplib::Response& res) { res.set_content("{\"ok\":1}", "application/json"); }, fast);
    http.Post("/slow", [this](const httplib::Request&, httplib::Response& res) {
      gate.wait();
      ++served;
      res.set_content("{\"slow\":1}", "application/json");
    });
    http.Post("/echo", [this](const httplib::Request& req, httplib::Response& res) {
      ++served;
      res.set_content(req.body, "text/plain");
    });
    http.set_default_errors([](int status, const std::string& msg, const std::string& code) {
      return "{\"error\":{\"code\":\"" + code + "\",\"status\":" + std::to_string(status) + "}}";
    });
    if (extra) extra(http);
    port = http.bind();
    http.start();
  }
  ~TestServer() {
    gate.release();
    http.stop();
  }
  template <class F>
  bool wait_for(F f, std::chrono::milliseconds t = 10000ms) {
    return lilac::test::wait_for(f, t);
  }
};

inline HttpServerOptions opts(int workers = 4) {
  HttpServerOptions o;
  o.port = 0;
  o.workers = workers;
  o.max_pending = 2;
  return o;
}

}  // namespace lilac::test
