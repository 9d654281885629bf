// The request bodies parsed and prepared at once (server/parse_budget.h, `serve --parse-mb`): the budget itself, and
// the server's routes under it (the heap counted exactly: heap_count.h); and the bodies being received
// (`serve --receive-mb`), refused in their route's shape.
#include <gtest/gtest.h>

#include <atomic>
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "heap_count.h"
#include "raw_socket.h"
#include "server/api_error.h"
#include "server/parse_budget.h"
#include "server_test_util.h"

using json = nlohmann::json;
using lilac::server::ApiError;
using lilac::server::ParseBudget;

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
const std::string kChat = R"({"max_tokens":2,"messages":[{"role":"user","content":"hi"}])";

// A route hook that holds every request it gets (with its parsed body) until open() is called, and answers it itself.
struct HoldingHook {
  std::mutex mu;
  std::condition_variable cv;
  bool is_open = false;
  std::atomic<int> inside{0}, entered{0}, most_inside{0};
  lilac::server::RouteHook hook() {
    lilac::server::RouteHook h;
    h.maybe_forward = [this](const httplib::Request&, httplib::Response& res, const nlohmann::ordered_json&, bool) {
      const int now = ++inside;
      ++entered;
      for (int m = most_inside.load(); now > m && !most_inside.compare_exchange_weak(m, now);) {
      }
      {
        std::unique_lock lk(mu);
        cv.wait(lk, [&] { return is_open; });
      }
      --inside;
      res.status = 200;
      res.set_content(R"({"held":true})", "application/json");
      return lilac::server::RouteDecisionKind::Answered;
    };
    return h;
  }
  void open() {
    {
      std::lock_guard lk(mu);
      is_open = true;
    }
    cv.notify_all();
  }
};

// A server whose route hook holds every request (HoldingHook) under a parse budget of `parse_bytes`, a body waiting up
// to `wait_ms` for room; `o`: its other options.
struct HeldServer {
  HeldServer(size_t parse_bytes, int wait_ms, lilac::server::ServerOptions o = lilac::test::LocalServer::options())
      : srv(with_budget(std::move(o), parse_bytes, wait_ms), &hook) {}

  HoldingHook holder;
  const lilac::server::RouteHook hook = holder.hook();
  lilac::test::LocalServer srv;

 private:
  static lilac::server::ServerOptions with_budget(lilac::server::ServerOptions o, size_t parse_bytes, int wait_ms) {
    o.parse_bytes = parse_bytes;
    o.parse_wait_ms = wait_ms;
    return o;
  }
};

// A body of 0.8 MB: two do not fit 1 MiB.
std::string body_over_half_a_mib() { return padded_body(kChat, 200000); }

// `n` answers not yet come (each client's thread sets its own).
std::vector<httplib::Result> no_answers(size_t n) {
  std::vector<httplib::Result> results;
  for (size_t i = 0; i < n; ++i) results.emplace_back(nullptr, httplib::Error::Unknown);
  return results;
}

// POSTs `body` to `path` on a thread of its own, the answer into `out` (`body` and `out` outlive the thread).
std::thread post_on_thread(int port, const std::string& path, const std::string& body, httplib::Result& out) {
  return std::thread([port, path, &body, &out] { out = httplib::Client("127.0.0.1", port).Post(path, body, "application/json"); });
}

int64_t metric(int port, const std::string& name) {
  auto r = httplib::Client("127.0.0.1", port).Get("/metrics");
  if (!r) return -1;
  const size_t at = r->body.find("\n" + name + " ");
  return at == std::string::npos ? -1 : std::stoll(r->body.substr(at + name.size() + 2));
}

}  // namespace

TEST(ParseBudget, LeasesShareTheBudgetAndAreGivenBack) {
  ParseBudget b(100, 0);
  {
    ParseBudget::Lease x = b.acquire(60);
    ParseBudget::Lease y = b.acquire(40);
    EXPECT_EQ(b.stats().held, 100);
    EXPECT_FALSE(b.try_acquire(1));
    ParseBudget::Lease moved = std::move(y);
    EXPECT_EQ(b.stats().held, 100);  // (moved, not given back twice)
    moved.release();
    EXPECT_EQ(b.stats().held, 60);
    auto z = b.try_acquire(40);
    ASSERT_TRUE(z);
    EXPECT_EQ(b.stats().held, 100);
  }
  EXPECT_EQ(b.stats().held, 0);
  // A body larger than the whole budget gets it when nothing else holds any, and then holds it alone.
  {
    ParseBudget::Lease big = b.acquire(500);
    EXPECT_EQ(b.stats().held, 500);
    EXPECT_FALSE(b.try_acquire(1));
  }
  ParseBudget::Lease small = b.acquire(1);
  EXPECT_FALSE(b.try_acquire(500));
  EXPECT_EQ(b.stats().refused, 0);
}

TEST(ParseBudget, ABodyThatFindsNoRoomInTimeIsRefusedAsBusy) {
  ParseBudget b(100, 0);
  ParseBudget::Lease x = b.acquire(80);
  try {
    b.acquire(30, 529);
    FAIL() << "no room: a refusal was expected";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 529);
    EXPECT_EQ(e.code, "server_busy");
    EXPECT_EQ(e.retry_after_s, 1);
    EXPECT_NE(e.message.find("--parse-mb"), std::string::npos) << e.message;
  }
  try {
    b.acquire(30);
    FAIL() << "no room: a refusal was expected";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 503);
    EXPECT_EQ(e.type, "service_unavailable_error");
  }
  EXPECT_EQ(b.stats().refused, 2);
  EXPECT_EQ(b.stats().held, 80);
}

TEST(ParseBudget, ABodyWaitsForRoomAndGetsItWhenALeaseEnds) {
  ParseBudget b(100, 60000);
  std::optional<ParseBudget::Lease> x(b.acquire(80));
  std::atomic<bool> got{false};
  std::thread t([&] {
    ParseBudget::Lease y = b.acquire(30);
    got = true;
  });
  ASSERT_TRUE(eventually([&] { return b.stats().waiting == 1; }));
  EXPECT_FALSE(got.load());
  x.reset();  // room
  t.join();
  EXPECT_TRUE(got.load());
  EXPECT_EQ(b.stats().waiting, 0);
  EXPECT_EQ(b.stats().refused, 0);
  EXPECT_EQ(b.stats().held, 0);
}

// The bodies waiting for room were bounded by nothing but the workers (--http-threads, 96 by default): each held its
// body's text while it waited, 8 MB each at most, ~800 MB in all. The bodies waiting are bounded by the budget's bytes
// too now: one that would take them past it is refused at once (not left waiting beside the others), unless none waits.
TEST(ParseBudget, ABodyThatWouldOverfillTheWaitingBodiesIsRefusedAtOnce) {
  ParseBudget b(100, 60000);
  std::optional<ParseBudget::Lease> x(b.acquire(100));
  auto take = [&b](size_t n, std::atomic<int>& status) {
    try {
      ParseBudget::Lease l = b.acquire(n, 529);
      status = 200;
    } catch (const ApiError& e) {
      status = e.status;
    }
  };
  std::atomic<int> first{0}, second{0}, third{0};
  std::thread t1([&] { take(60, first); });
  ASSERT_TRUE(eventually([&] { return b.stats().waiting == 1; }));
  EXPECT_EQ(b.stats().waiting_bytes, 60);
  // 60 + 50 bytes waiting would be more than the budget's 100: refused before any room comes.
  std::thread t2([&] { take(50, second); });
  const bool placed = eventually([&] { return second.load() != 0 || b.stats().waiting == 2; });
  EXPECT_EQ(second.load(), 529) << "left waiting beside the first";
  EXPECT_EQ(b.stats().refused, second.load() == 529 ? 1 : 0);
  // 60 + 40 fit: it waits its turn.
  std::thread t3([&] { take(40, third); });
  const bool third_waits = eventually([&] { return b.stats().waiting == 2; });
  x.reset();  // room
  t1.join();
  t2.join();
  t3.join();
  ASSERT_TRUE(placed);
  EXPECT_TRUE(third_waits);
  EXPECT_EQ(first.load(), 200);
  EXPECT_EQ(third.load(), 200);
  EXPECT_EQ(b.stats().waiting, 0);
  EXPECT_EQ(b.stats().waiting_bytes, 0);
  EXPECT_EQ(b.stats().held, 0);
  // A body larger than the whole budget still waits when no other does (and gets it when nothing else holds any).
  std::optional<ParseBudget::Lease> y(b.acquire(1));
  std::atomic<int> large{0};
  std::thread t4([&] { take(500, large); });
  ASSERT_TRUE(eventually([&] { return b.stats().waiting == 1; }));
  y.reset();
  t4.join();
  EXPECT_EQ(large.load(), 200);
}

// A body that did not fit waited for any room, and a later body that fitted the room left took it at once: under a
// steady flow of small bodies a large one kept waiting (one larger than the budget until nothing else held any) and
// was refused after its 5 s. The bodies waiting are admitted in arrival order now, and a later body (or the Message
// Batches' try_acquire) does not go ahead of one that waits, even where it would fit.
TEST(ParseBudget, BodiesAreAdmittedInArrivalOrder) {
  ParseBudget b(100, 60000);
  std::optional<ParseBudget::Lease> x(b.acquire(40)), y(b.acquire(20));
  std::mutex mu;
  std::vector<std::string> order;  // as the bodies got their room
  auto take = [&](const std::string& name, size_t n) {
    try {
      ParseBudget::Lease l = b.acquire(n);
      std::lock_guard lk(mu);
      order.push_back(name);
    } catch (const ApiError&) {
      std::lock_guard lk(mu);
      order.push_back(name + " refused");
    }
  };
  std::thread large(take, "large", 70);
  ASSERT_TRUE(eventually([&] { return b.stats().waiting == 1; }));
  EXPECT_FALSE(b.try_acquire(30)) << "went ahead of the body waiting";
  // 30 fits beside the 60 held, but the large body came first: it waits behind it.
  std::thread small(take, "small", 30);
  const bool placed = eventually([&] {
    std::lock_guard lk(mu);
    return b.stats().waiting == 2 || !order.empty();
  });
  x.reset();  // room for the large body (20 + 70), not for both: the small one goes once the large one is done
  large.join();
  small.join();
  y.reset();
  EXPECT_TRUE(placed);
  EXPECT_EQ(order, (std::vector<std::string>{"large", "small"}));
  EXPECT_EQ(b.stats().held, 0);
  EXPECT_EQ(b.stats().refused, 0);
}

// Admitting the first body waiting may leave room for the next: it is admitted too, while the first still holds its
// share (the order is of admission, not one body at a time).
TEST(ParseBudget, TheBodyBehindIsAdmittedWhenItFitsBesideTheOneAhead) {
  ParseBudget b(100, 60000);
  std::optional<ParseBudget::Lease> x(b.acquire(90));
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<bool> second_in{false};
  std::thread first([&] {
    ParseBudget::Lease l = b.acquire(30);
    std::unique_lock lk(mu);
    cv.wait(lk, [&] { return second_in.load(); });  // holds its share until the second is in
  });
  ASSERT_TRUE(eventually([&] { return b.stats().waiting == 1; }));
  std::thread second([&] {
    ParseBudget::Lease l = b.acquire(10);
    {
      std::lock_guard lk(mu);
      second_in = true;
    }
    cv.notify_all();
  });
  ASSERT_TRUE(eventually([&] { return b.stats().waiting == 2 || second_in.load(); }));
  x.reset();
  first.join();
  second.join();
  EXPECT_TRUE(second_in.load());
  EXPECT_EQ(b.stats().refused, 0);
  EXPECT_EQ(b.stats().held, 0);
}

// The same on the routes: while one body is parsed (held by the hook) and another waits, a third that would take the
// waiting bodies past the budget is answered at once, in its protocol's shape (529 overloaded_error on Anthropic's).
TEST(ParseBudget, ARouteRefusesABodyAtOnceWhenTheWaitingBodiesAreFull) {
  HeldServer server(size_t(1) << 20, 60000);
  HoldingHook& holder = server.holder;
  lilac::test::LocalServer& srv = server.srv;
  const std::string body = body_over_half_a_mib();
  std::vector<httplib::Result> results = no_answers(3);
  std::atomic<bool> third_answered{false};
  std::thread first = post_on_thread(srv.port, "/v1/chat/completions", body, results[0]);
  ASSERT_TRUE(eventually([&] { return holder.entered.load() == 1; }));
  std::thread second = post_on_thread(srv.port, "/v1/responses", body, results[1]);
  ASSERT_TRUE(eventually([&] { return metric(srv.port, "lilac_parse_waiting") == 1; }));
  EXPECT_EQ(metric(srv.port, "lilac_parse_waiting_bytes"), int64_t(body.size()));
  std::thread third([&] {
    results[2] = httplib::Client("127.0.0.1", srv.port).Post("/v1/messages", body, "application/json");
    third_answered = true;
  });
  const bool placed = eventually([&] { return third_answered.load() || metric(srv.port, "lilac_parse_waiting") == 2; });
  const bool answered_at_once = third_answered.load();
  holder.open();
  first.join();
  second.join();
  third.join();
  ASSERT_TRUE(placed);
  EXPECT_TRUE(answered_at_once) << "left waiting beside the second";
  ASSERT_TRUE(results[0] && results[1] && results[2]);
  EXPECT_EQ(results[0]->status, 200) << results[0]->body;
  EXPECT_EQ(results[1]->status, 200) << results[1]->body;
  ASSERT_EQ(results[2]->status, 529) << results[2]->body;
  EXPECT_EQ(results[2]->get_header_value("Retry-After"), "1");
  const json e = json::parse(results[2]->body, nullptr, false);
  EXPECT_EQ(e["error"]["type"], "overloaded_error") << results[2]->body;
  EXPECT_EQ(metric(srv.port, "lilac_parse_refused_total"), 1);
  EXPECT_EQ(holder.most_inside.load(), 1);
}

// The requests waiting for a worker (every worker busy) held their bodies' text, bounded by their count only
// (ServerOptions::max_pending, 32 of up to 8 MB). Their bytes are bounded by --parse-mb too now: with both workers held
// in the hook and one 0.8 MB body waiting for a worker, another is refused at once with the full queue's 503
// server_busy, in its route's shape (Anthropic's overloaded_error on /v1/messages), not left waiting beside it.
TEST(ParseBudget, TheBodiesWaitingForAWorkerAreBoundedByTheBudget) {
  auto o = lilac::test::LocalServer::options(1);
  o.http_threads = 2;
  o.max_pending = 8;
  HeldServer server(size_t(1) << 20, 60000, o);
  HoldingHook& holder = server.holder;
  lilac::test::LocalServer& srv = server.srv;
  const std::string body = body_over_half_a_mib();
  const std::vector<std::pair<std::string, std::string>> posts = {
      {"/v1/chat/completions", kChat + "}"}, {"/v1/messages", kChat + "}"},  // the workers, held in the hook
      {"/v1/messages", body},                                              // waits for a worker
      {"/v1/chat/completions", body}, {"/v1/messages", body}};            // refused
  std::vector<httplib::Result> results = no_answers(posts.size());
  std::vector<std::atomic<bool>> answered(posts.size());
  std::vector<std::thread> clients;
  auto send = [&](size_t i) {
    clients.emplace_back([&, i] {
      httplib::Client cli("127.0.0.1", srv.port);
      cli.set_read_timeout(120, 0);
      results[i] = cli.Post(posts[i].first, posts[i].second, "application/json");
      answered[i] = true;
    });
  };
  send(0);
  ASSERT_TRUE(eventually([&] { return holder.entered.load() == 1; }));
  send(1);
  ASSERT_TRUE(eventually([&] { return holder.entered.load() == 2; }));
  send(2);
  ASSERT_TRUE(eventually([&] { return metric(srv.port, "lilac_http_pending") == 1; }));
  EXPECT_EQ(metric(srv.port, "lilac_http_pending_bytes"), int64_t(body.size()));
  bool at_once = true;
  for (size_t i = 3; i < posts.size(); ++i) {
    send(i);
    const bool placed = eventually([&] { return answered[i].load() || metric(srv.port, "lilac_http_pending") > 1; });
    at_once = at_once && placed && answered[i].load();
  }
  holder.open();
  for (auto& t : clients) t.join();
  EXPECT_TRUE(at_once) << "left waiting for a worker beside the first body";
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(results[i]) << i;
    EXPECT_EQ(results[i]->status, 200) << i << ": " << results[i]->body;
  }
  for (size_t i = 3; i < posts.size(); ++i) {
    const auto& r = results[i];
    ASSERT_TRUE(r) << i;
    // Anthropic's routes answer 529 (overloaded_error), as for the parse budget's own refusals (503 before)
    ASSERT_EQ(r->status, posts[i].first == "/v1/messages" ? 529 : 503) << posts[i].first << ": " << r->body;
    EXPECT_EQ(r->get_header_value("Retry-After"), "1") << posts[i].first;
    const json e = json::parse(r->body, nullptr, false);
    if (posts[i].first == "/v1/messages") {
      EXPECT_EQ(e["type"], "error") << r->body;
      EXPECT_EQ(e["error"]["type"], "overloaded_error") << r->body;
    } else {
      EXPECT_EQ(e["error"]["code"], "server_busy") << r->body;
      EXPECT_EQ(e["error"]["type"], "service_unavailable_error") << r->body;
    }
  }
  EXPECT_EQ(metric(srv.port, "lilac_http_pending_bytes"), 0);
  EXPECT_EQ(metric(srv.port, "lilac_http_rejected_busy_total"), 2);
  EXPECT_EQ(metric(srv.port, "lilac_parse_refused_total"), 0);
}

// The bodies being received were bounded by the bytes that had arrived only, by a constant of the HTTP layer (256 MiB,
// or 4 x --max-body-mb): a body was taken and read whatever the others held, and one taken could be cut off mid-way
// by others' bytes. --receive-mb bounds them now, declared lengths reserved when the headers are in: beside a 0.8 MB
// body being received (lilac_http_receiving_bytes), a 0.3 MB body gets the busy answer at once, in its route's shape
// (503 server_busy; Anthropic's 529 overloaded_error on /v1/messages), a small body is answered, and the large body,
// once all of it has come, is answered as if nothing had happened. (The large body comes from another client,
// 127.0.0.2, than the others: the bound of all clients together is tested here, not a client's share.)
TEST(ReceiveBudget, ABodyThatDoesNotFitBesideTheBodiesBeingReceivedIsRefusedAtOnce) {
  auto o = lilac::test::LocalServer::options();
  o.receive_bytes = size_t(1) << 20;
  lilac::test::LocalServer srv(o);
  const std::string big = body_over_half_a_mib();
  lilac::test::Sock holder(srv.port, "127.0.0.2");
  ASSERT_TRUE(holder.send(lilac::test::post_head("/v1/chat/completions", big.size(),
                                                "Content-Type: application/json\r\n" + lilac::test::kExpect100)));
  ASSERT_EQ(holder.read(std::chrono::milliseconds(10000), "\r\n\r\n"), lilac::test::kContinue);
  ASSERT_TRUE(holder.send(big.substr(0, 1000)));
  EXPECT_EQ(metric(srv.port, "lilac_http_receiving_bytes"), int64_t(big.size()));
  const std::string third = padded_body(kChat, 75000);  // 0.3 MB: not beside 0.8 MB in 1 MiB
  ASSERT_GT(third.size() + big.size(), size_t(1) << 20);
  for (const std::string path : {"/v1/chat/completions", "/v1/messages"}) {
    const auto r = httplib::Client("127.0.0.1", srv.port).Post(path, third, "application/json");
    ASSERT_TRUE(r) << path;
    const json e = json::parse(r->body, nullptr, false);
    EXPECT_EQ(r->get_header_value("Retry-After"), "1") << path;
    if (path == "/v1/messages") {
      EXPECT_EQ(r->status, 529) << r->body;
      EXPECT_EQ(e["type"], "error") << r->body;
      EXPECT_EQ(e["error"]["type"], "overloaded_error") << r->body;
    } else {
      EXPECT_EQ(r->status, 503) << r->body;
      EXPECT_EQ(e["error"]["type"], "service_unavailable_error") << r->body;
      EXPECT_EQ(e["error"]["code"], "server_busy") << r->body;
    }
  }
  EXPECT_EQ(metric(srv.port, "lilac_http_receiving_bytes"), int64_t(big.size()));
  // A small body fits beside it.
  lilac::test::post_json(srv.port, "/v1/messages", json::parse(kChat + "}"));
  // The large body, all come: answered.
  ASSERT_TRUE(holder.send(big.substr(1000)));
  const std::string a = holder.answer(std::chrono::milliseconds(60000));
  EXPECT_EQ(lilac::test::status_of(a), 200) << a.substr(0, 300);
  EXPECT_NE(a.find("\"chat.completion\""), std::string::npos) << a.substr(0, 300);
  EXPECT_EQ(metric(srv.port, "lilac_http_receiving_bytes"), 0);
  EXPECT_EQ(metric(srv.port, "lilac_http_rejected_busy_total"), 2);
  EXPECT_EQ(metric(srv.port, "lilac_parse_refused_total"), 0);
}

// The per-client bounds with lilac serve's defaults: one client (one peer address) may hold half of --receive-mb
// (0.5 MiB of 1 MiB here) and a quarter of --max-connections (2 of 8). Beside its own 0.8 MB body being received, a
// small body of the same client gets the busy answer in its route's shape (503 server_busy; Anthropic's 529
// overloaded_error), while another client's is answered; a client with two requests in progress gets 503
// too_many_connections for a third connection.
TEST(ReceiveBudget, ByDefaultOneClientHoldsHalfTheBodiesBeingReceivedAndAQuarterOfTheConnections) {
  auto o = lilac::test::LocalServer::options();
  o.receive_bytes = size_t(1) << 20;
  o.max_connections = 8;
  lilac::test::LocalServer srv(o);
  const std::string big = body_over_half_a_mib();
  using lilac::test::kContinue;
  auto head = [](const std::string& path, size_t length) {
    return lilac::test::post_head(path, length, "Content-Type: application/json\r\n" + lilac::test::kExpect100);
  };
  auto body_of = [](const std::string& a) {
    const size_t at = a.find("\r\n\r\n");
    return json::parse(at == std::string::npos ? std::string() : a.substr(at + 4), nullptr, false);
  };
  lilac::test::Sock holder(srv.port, "127.0.0.5");
  ASSERT_TRUE(holder.send(head("/v1/chat/completions", big.size())));
  ASSERT_EQ(holder.read(std::chrono::milliseconds(10000), "\r\n\r\n"), kContinue);
  ASSERT_TRUE(holder.send(big.substr(0, 1000)));
  const std::string small = kChat + "}";
  for (const std::string path : {"/v1/chat/completions", "/v1/messages"}) {
    lilac::test::Sock same(srv.port, "127.0.0.5");
    ASSERT_TRUE(same.send(lilac::test::post(path, small, "Content-Type: application/json\r\n")));
    const std::string a = same.answer();
    const json e = body_of(a);
    EXPECT_NE(a.find("Retry-After: 1\r\n"), std::string::npos) << a;
    if (path == "/v1/messages") {
      EXPECT_EQ(lilac::test::status_of(a), 529) << a;
      EXPECT_EQ(e["error"]["type"], "overloaded_error") << a;
    } else {
      EXPECT_EQ(lilac::test::status_of(a), 503) << a;
      EXPECT_EQ(e["error"]["code"], "server_busy") << a;
    }
    lilac::test::Sock other(srv.port, "127.0.0.6");
    ASSERT_TRUE(other.send(lilac::test::post(path, small, "Content-Type: application/json\r\n")));
    const std::string b = other.answer(std::chrono::milliseconds(30000));
    EXPECT_EQ(lilac::test::status_of(b), 200) << b;
  }
  EXPECT_EQ(metric(srv.port, "lilac_http_rejected_client_total"), 2);
  // Two requests of client 7 in progress (headers in, bodies to come): a third connection of it gets 503.
  std::vector<std::unique_ptr<lilac::test::Sock>> seven;
  for (int i = 0; i < 2; ++i) {
    seven.push_back(std::make_unique<lilac::test::Sock>(srv.port, "127.0.0.7"));
    ASSERT_TRUE(seven.back()->send(head("/v1/chat/completions", small.size())));
    ASSERT_EQ(seven.back()->read(std::chrono::milliseconds(10000), "\r\n\r\n"), kContinue);
  }
  lilac::test::Sock third(srv.port, "127.0.0.7");
  const std::string t = third.answer();
  EXPECT_EQ(lilac::test::status_of(t), 503) << t;
  EXPECT_EQ(body_of(t)["error"]["code"], "too_many_connections") << t;
  EXPECT_EQ(metric(srv.port, "lilac_http_rejected_client_total"), 3);
  for (auto& c : seven) {
    ASSERT_TRUE(c->send(small));
    EXPECT_EQ(lilac::test::status_of(c->answer(std::chrono::milliseconds(30000))), 200);
  }
  // The large body, all come: answered.
  ASSERT_TRUE(holder.send(big.substr(1000)));
  const std::string a = holder.answer(std::chrono::milliseconds(60000));
  EXPECT_EQ(lilac::test::status_of(a), 200) << a.substr(0, 300);
  EXPECT_EQ(metric(srv.port, "lilac_http_receiving_bytes"), 0);
}

// Every JSON route parsed its whole body into JSON values and went on (adapter, template, tokenizer) with nothing
// bounding how many did so at once but the workers (--http-threads, 96 by default): each 4.2 MB body of this shape is
// ~58 MB of values (~84 MB at the parse's peak), so six at once took ~500 MB here, and 96 clients several GB. With a
// budget of 4 MiB only one is parsed at a time; the others (no wait here) are refused in their protocol's shape.
TEST(ParseBudget, BodiesParsedAtOnceStayWithinTheBudget) {
  HeldServer server(size_t(4) << 20, 0);
  HoldingHook& holder = server.holder;
  lilac::test::LocalServer& srv = server.srv;
  const size_t kValues = 1000000;  // 4.2 MB, within the 1,048,576 values a body may hold
  const std::string body = padded_body(kChat, kValues);
  ASSERT_GT(body.size(), size_t(4) << 20 >> 1);  // two never fit the budget together
  ASSERT_LT(body.size(), size_t(4) << 20);
  const std::vector<std::string> paths = {"/v1/chat/completions", "/v1/messages", "/v1/chat/completions",
                                          "/v1/messages", "/v1/responses", "/v1/messages"};
  const int n = int(paths.size());
  ASSERT_TRUE(lilac::test::heap_counted());
  const int64_t before = lilac::test::heap_live();
  lilac::test::heap_peak_reset();
  std::vector<httplib::Result> results = no_answers(size_t(n));
  std::atomic<int> answered{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < n; ++i)
    clients.emplace_back([&, i] {
      httplib::Client cli("127.0.0.1", srv.port);
      cli.set_read_timeout(120, 0);
      results[size_t(i)] = cli.Post(paths[size_t(i)], body, "application/json");
      ++answered;
    });
  // Each request is either held by the hook (its body parsed, its values alive) or answered.
  const bool all_placed = eventually([&] { return holder.entered.load() + answered.load() == n; });
  const int64_t peak = lilac::test::heap_peak() - before;
  const int held_at_once = holder.inside.load();
  holder.open();
  for (auto& t : clients) t.join();
  ASSERT_TRUE(all_placed) << holder.entered.load() << " held, " << answered.load() << " answered";
  EXPECT_EQ(held_at_once, 1) << "bodies parsed and held at once";
  // One body's values (~84 MB at the parse's peak), the bodies' text in the clients and the server (~10 MB each).
  EXPECT_LT(peak, int64_t(160) << 20) << "heap over the " << before << " bytes held before";
  int held = 0, refused = 0;
  for (int i = 0; i < n; ++i) {
    const auto& r = results[size_t(i)];
    ASSERT_TRUE(r) << paths[size_t(i)];
    if (r->status == 200) {
      EXPECT_EQ(r->body, R"({"held":true})");
      ++held;
      continue;
    }
    ++refused;
    EXPECT_EQ(r->get_header_value("Retry-After"), "1") << paths[size_t(i)];
    const json e = json::parse(r->body, nullptr, false);
    if (paths[size_t(i)] == "/v1/messages") {  // Anthropic's answer when it is overloaded
      EXPECT_EQ(r->status, 529) << r->body;
      EXPECT_EQ(e["type"], "error") << r->body;
      EXPECT_EQ(e["error"]["type"], "overloaded_error") << r->body;
      EXPECT_NE(e["error"]["message"].get<std::string>().find("--parse-mb"), std::string::npos) << r->body;
    } else {
      EXPECT_EQ(r->status, 503) << r->body;
      EXPECT_EQ(e["error"]["type"], "service_unavailable_error") << r->body;
      EXPECT_EQ(e["error"]["code"], "server_busy") << r->body;
      EXPECT_NE(e["error"]["message"].get<std::string>().find("--parse-mb"), std::string::npos) << r->body;
    }
  }
  EXPECT_EQ(held, 1);
  EXPECT_EQ(refused, n - 1);
  EXPECT_EQ(metric(srv.port, "lilac_parse_refused_total"), n - 1);
  EXPECT_EQ(metric(srv.port, "lilac_parse_bytes"), 0);
}

// A body that does not fit waits for room (up to parse_wait_ms) and is answered once the body before it is done.
TEST(ParseBudget, ABodyWaitsItsTurnAndIsAnswered) {
  HeldServer server(size_t(1) << 20, 60000);
  HoldingHook& holder = server.holder;
  lilac::test::LocalServer& srv = server.srv;
  const std::string body = body_over_half_a_mib();
  std::vector<httplib::Result> results = no_answers(2);
  std::thread first = post_on_thread(srv.port, "/v1/chat/completions", body, results[0]);
  ASSERT_TRUE(eventually([&] { return holder.entered.load() == 1; }));
  std::thread second = post_on_thread(srv.port, "/v1/messages", body, results[1]);
  // The second waits for room (the old code parsed it at once: it reached the hook beside the first).
  ASSERT_TRUE(eventually([&] { return metric(srv.port, "lilac_parse_waiting") == 1 || holder.entered.load() == 2; }));
  EXPECT_EQ(holder.entered.load(), 1);
  EXPECT_EQ(metric(srv.port, "lilac_parse_bytes"), int64_t(body.size()));
  holder.open();
  first.join();
  second.join();
  for (auto& r : results) {
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
  }
  EXPECT_EQ(holder.most_inside.load(), 1);
  EXPECT_EQ(metric(srv.port, "lilac_parse_refused_total"), 0);
}

// A body larger than the whole budget is answered alone (the largest body the HTTP layer takes must always be
// answerable), and an 8 MB body under the default budget is answered as before.
TEST(ParseBudget, ABodyLargerThanTheBudgetIsAnsweredAlone) {
  auto o = lilac::test::LocalServer::options();
  o.parse_bytes = size_t(1) << 20;
  lilac::test::LocalServer small(o);
  auto r = httplib::Client("127.0.0.1", small.port).Post("/v1/chat/completions", padded_body(kChat, 1000000),
                                                         "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body.substr(0, 300);
  lilac::test::LocalServer standard(lilac::test::LocalServer::options());
  const std::string eight = kChat + ",\"x\":\"" + std::string((size_t(8) << 20) - 200, 'a') + "\"}";
  r = httplib::Client("127.0.0.1", standard.port).Post("/v1/messages", eight, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body.substr(0, 300);
}

// A generation's request kept its body's JSON values (and the specs made from them) until its answer was sent, so a
// generation answered as one body (not streamed) held them (~58 MB for this 4.2 MB body) as long as it ran: they go
// once it is queued now, and with them its share of the budget.
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

// A generation's worker kept its request, body text included, until the answer was sent (handlers got it as const):
// a streamed generation held its up-to-8 MB body for as long as it ran. The text goes once it is parsed now. Each
// route's stream is read until its first token, which comes after the handler has started the generation and
// returned: the heap then holds no copy of the 6 MB body (the raw socket keeps none; the request text sent is counted
// before), while the generation still runs.
TEST(ParseBudget, AGenerationFreesItsBodysTextOnceParsed) {
  lilac::test::LocalServer srv(lilac::test::LocalServer::options());
  ASSERT_TRUE(lilac::test::heap_counted());
  const std::string pad = ",\"x\":\"" + std::string(size_t(6) << 20, 'a') + "\"}";
  const std::vector<std::pair<std::string, std::string>> routes = {
      {"/v1/chat/completions", R"({"max_tokens":20000,"stream":true,"messages":[{"role":"user","content":"slow"}])"},
      {"/v1/messages", R"({"max_tokens":20000,"stream":true,"messages":[{"role":"user","content":"slow"}])"},
      {"/v1/responses", R"({"max_output_tokens":20000,"stream":true,"store":false,"input":"slow")"}};
  for (const auto& [path, head] : routes) {
    std::string request = lilac::test::post(path, head + pad);
    const int64_t before = lilac::test::heap_live();
    lilac::test::Sock client(srv.port);
    ASSERT_TRUE(client.send(request)) << path;
    const std::string first = client.read(std::chrono::seconds(60), "\" x\"");  // the first token's event
    const int64_t during = lilac::test::heap_live() - before;
    const bool running = metric(srv.port, "lilac_running") == 1;
    ASSERT_NE(first.find("\" x\""), std::string::npos) << path << ": " << first.substr(0, 400);
    EXPECT_TRUE(running) << path;
    EXPECT_LT(during, int64_t(2) << 20) << path << ": heap over the " << before << " bytes held before, while generating";
    client.close();  // the client goes: its generation is cancelled
    ASSERT_TRUE(eventually([&] { return metric(srv.port, "lilac_running") == 0; })) << path;
  }
}

// The Message Batches' runner takes its share of the budget for each request it reads and starts: a request larger
// than the whole budget runs alone, and every request of a batch is answered.
TEST(ParseBudget, ABatchsRequestsRunUnderATinyBudget) {
  auto o = lilac::test::LocalServer::options();
  o.parse_bytes = 64;
  lilac::test::LocalServer srv(o);
  json requests = json::array();
  for (int i = 0; i < 6; ++i)
    requests.push_back({{"custom_id", "r" + std::to_string(i)},
                        {"params", {{"max_tokens", 4}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}}}});
  const json b = lilac::test::post_json(srv.port, "/v1/messages/batches", {{"requests", requests}});
  ASSERT_TRUE(b.contains("id")) << b.dump();
  json got;
  ASSERT_TRUE(eventually([&] {
    auto r = httplib::Client("127.0.0.1", srv.port).Get("/v1/messages/batches/" + b["id"].get<std::string>());
    if (!r) return false;
    got = json::parse(r->body, nullptr, false);
    return got.value("processing_status", "") == "ended";
  }));
  EXPECT_EQ(got["request_counts"]["succeeded"], 6) << got.dump();
}
