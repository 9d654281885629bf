// What a request's body costs in memory while it is answered (the heap counted exactly: heap_count.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "heap_count.h"
#include "server_test_util.h"

using json = nlohmann::json;

namespace {

// Waits (polling, at most ~60 s) until `done` is true; false if it never was.
template <typename F>
bool eventually(F done) {
  for (int i = 0; i < 6000; ++i) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return done();
}

// A body of `values` one-letter strings under an extra key "x" (a field the adapters ignore) beside a short chat:
// the JSON shape that takes most memory per byte of text (~20 times while parsed: 58 MB of values for 4.2 MB).
std::string padded_body(const std::string& head, size_t values) {
  std::string s = head + ",\"x\":[";
  s.reserve(s.size() + values * 4 + 2);
  for (size_t i = 0; i < values; ++i) s += i ? ",\"a\"" : "\"a\"";
  return s + "]}";
}

int64_t metric(int port, const std::string& name) {
  auto r = httplib::Client("127.0.0.1", port).Get("/metrics");
  if (!r) return -1;
  const size_t at = r->body.find("\n" + name + " ");
  return at == std::string::npos ? -1 : std::stoll(r->body.substr(at + name.size() + 2));
}

}  // namespace

// A generation's request kept its body's JSON values (and the specs made from them) until its answer was sent, so a
// generation answered as one body (not streamed) held them (~58 MB for this 4.2 MB body) as long as it ran: they go
// once it is queued now.
TEST(ParseBudget, AGenerationDoesNotHoldItsBodysValuesWhileItRuns) {
  lilac::test::LocalServer srv(lilac::test::LocalServer::options());
  const std::string body = padded_body(R"({"max_tokens":100,"messages":[{"role":"user","content":"slow"}])", 1000000);
  ASSERT_TRUE(lilac::test::heap_counted());
  const int64_t before = lilac::test::heap_live();
  httplib::Result r(nullptr, httplib::Error::Unknown);
  std::thread client([&] { r = httplib::Client("127.0.0.1", srv.port).Post("/v1/chat/completions", body, "application/json"); });
  // While it runs (100 tokens of 20 ms): the least the heap holds over the run (it starts while the handler is still
  // freeing what it held).
  const bool running = eventually([&] { return metric(srv.port, "lilac_running") == 1; });
  int64_t during = lilac::test::heap_live() - before;
  while (metric(srv.port, "lilac_running") == 1) during = std::min(during, lilac::test::heap_live() - before);
  client.join();
  ASSERT_TRUE(running);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body.substr(0, 300);
  // The body's text in the client and the server (~4.2 MB each, and the client's copy of it), not its ~58 MB of values.
  EXPECT_LT(during, int64_t(24) << 20) << "heap over the " << before << " bytes held before, while generating";
}

