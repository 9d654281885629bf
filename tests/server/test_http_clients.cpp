// HttpServer's per-client bounds over real sockets (127.0.0.1 and 127.0.0.2 as two clients: on Linux every 127.x.y.z
// is loopback): one client's connections (--max-client-connections) and its bodies being received
// (--client-receive-mb), what frees its share, and what a client is (its peer address; an IPv4-mapped IPv6 address
// is its IPv4 address).
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "http_test_server.h"
#include "raw_socket.h"
#include "server/http_internal.h"
#include "server/http_server.h"

using namespace std::chrono_literals;
using lilac::server::HttpServer;
using lilac::server::HttpServerOptions;
using lilac::server::RouteOptions;
using lilac::test::busy;
using lilac::test::kContinue;
using lilac::test::kExpect100;
using lilac::test::post;
using lilac::test::post_head;
using lilac::test::Sock;
using lilac::test::opts;
using lilac::test::status_of;
using lilac::test::TestServer;

// The per-client bounds. Every bound on connections and on bodies being received was global, so one client (one peer
// address) could take all of it: open every connection, or declare bodies that fill --receive-mb and trickle them,
// and every other client got 503. Now a client's connections are bounded too (max_client_connections): past it a new
// one of its closes its own idle connection that has waited longest, or gets 503 too_many_connections when none of
// its own is idle, while another client still connects (127.0.0.1 and 127.0.0.2 are two clients of the loopback).
TEST(HttpServer, AClientPastItsConnectionBoundGets503OrClosesItsOwnIdleOneOthersStillConnect) {
  HttpServerOptions o = opts(2);
  o.max_connections = 100;
  o.max_client_connections = 3;
  TestServer s(o);
  const std::string head = post_head("/echo", 5, kExpect100);
  // Client 1 holds 3 connections, each with a request in progress (headers in, body to come: none idle).
  std::vector<std::unique_ptr<Sock>> one;
  for (int i = 0; i < 3; ++i) {
    one.push_back(std::make_unique<Sock>(s.port, "127.0.0.1"));
    ASSERT_TRUE(one.back()->send(head));
    ASSERT_EQ(one.back()->read(10000ms, "\r\n\r\n"), kContinue);
  }
  Sock late(s.port, "127.0.0.1");
  const std::string a = late.answer();
  EXPECT_EQ(status_of(a), 503) << a;
  EXPECT_NE(a.find("too_many_connections"), std::string::npos) << a;
  EXPECT_NE(a.find("Retry-After: 1"), std::string::npos) << a;
  EXPECT_EQ(s.http.stats().rejected_client, 1);
  EXPECT_EQ(s.http.stats().rejected_busy, 1);
  EXPECT_EQ(s.http.stats().connections, 3);
  // Client 2 opens 3 idle connections (at its own bound now)...
  std::vector<std::unique_ptr<Sock>> two;
  for (int i = 0; i < 3; ++i) {
    two.push_back(std::make_unique<Sock>(s.port, "127.0.0.2"));
    ASSERT_TRUE(s.wait_for([&] { return s.http.stats().connections == 4 + i; })) << s.http.stats().connections;
  }
  EXPECT_EQ(s.http.stats().clients, 2);
  // ... and a fourth of its own gets in: its longest idle one is closed for it, never one of client 1's.
  Sock fourth(s.port, "127.0.0.2");
  ASSERT_TRUE(fourth.send(post("/echo", "four")));
  const std::string f = fourth.answer();
  EXPECT_EQ(status_of(f), 200) << f;
  EXPECT_NE(f.find("four"), std::string::npos) << f;
  EXPECT_EQ(two[0]->read(5000ms), "");  // closed by the server: EOF
  EXPECT_EQ(s.http.stats().evicted, 1);
  EXPECT_EQ(s.http.stats().rejected_client, 1);
  // Client 1's requests were never cut off: their bodies come and are answered.
  for (auto& c : one) {
    ASSERT_TRUE(c->send("12345"));
    const std::string r = c->answer();
    EXPECT_EQ(status_of(r), 200) << r;
    EXPECT_NE(r.find("12345"), std::string::npos) << r;
  }
  // Every connection closed: no client's entry is left.
  one.clear();
  two.clear();
  fourth.close();
  late.close();
  ASSERT_TRUE(s.wait_for([&] { return s.http.stats().connections == 0; })) << s.http.stats().connections;
  EXPECT_EQ(s.http.stats().clients, 0);
}

// A client's bodies being received are bounded too (max_client_body_bytes): declared lengths reserved when the headers
// are in, chunked bodies counted as they arrive, as for the global bound. A body that would take its client past its
// share gets the same busy answer (503 server_busy, the route's busy status: Anthropic's 529) before any byte of it is
// read, while another client's body of the same size is taken and answered; a body larger than the share is received
// when its client has no other body being received.
TEST(HttpServer, AClientsBodiesPastItsShareGetTheBusyAnswerAnotherClientsAreAnswered) {
  HttpServerOptions o = opts(4);
  o.max_buffered_body_bytes = 100000;
  o.max_client_body_bytes = 1000;
  TestServer s(o, [](HttpServer& http) {
    RouteOptions anthropic;
    anthropic.busy_status = 529;
    http.Post("/messages", [](const httplib::Request& req, httplib::Response& res) {
      res.set_content(req.body, "text/plain");
    }, anthropic);
  });
  auto head = [](const std::string& path, size_t length) { return post_head(path, length, kExpect100); };
  // Client 1 declares 600 and 300 bytes (900 of its 1000: both taken) and sends a little of each.
  Sock a(s.port, "127.0.0.1"), b(s.port, "127.0.0.1");
  ASSERT_TRUE(a.send(head("/echo", 600)));
  ASSERT_EQ(a.read(10000ms, "\r\n\r\n"), kContinue);
  ASSERT_TRUE(a.send(std::string(10, 'a')));
  ASSERT_TRUE(b.send(head("/echo", 300)));
  ASSERT_EQ(b.read(10000ms, "\r\n\r\n"), kContinue);
  ASSERT_TRUE(b.send(std::string(10, 'b')));
  EXPECT_EQ(s.http.stats().receiving_bytes, 900);
  // Its next body of 200 would take it past its share: refused before any byte of it (no 100 Continue).
  Sock c(s.port, "127.0.0.1");
  ASSERT_TRUE(c.send(head("/echo", 200)));
  busy(c.answer(), 503);
  Sock m(s.port, "127.0.0.1");
  ASSERT_TRUE(m.send(head("/messages", 200)));
  busy(m.answer(), 529);
  // Client 2's body of the same size, and one of 900, are taken and answered meanwhile.
  for (size_t n : {size_t(200), size_t(900)}) {
    Sock d(s.port, "127.0.0.2");
    ASSERT_TRUE(d.send(post("/echo", std::string(n, 'd'))));
    const std::string r = d.answer();
    EXPECT_EQ(status_of(r), 200) << r.substr(0, 300);
    EXPECT_NE(r.find("\r\n\r\n" + std::string(n, 'd')), std::string::npos) << r.substr(0, 300);
  }
  // A chunked body of client 1 counts as it arrives: 200 bytes beside its 900 are refused.
  Sock e(s.port, "127.0.0.1");
  ASSERT_TRUE(e.send("POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n"));
  ASSERT_EQ(e.read(10000ms, "\r\n\r\n"), kContinue);
  ASSERT_TRUE(e.send("c8\r\n" + std::string(200, 'e')));
  busy(e.answer(), 503);
  EXPECT_EQ(s.http.stats().receiving_bytes, 900);
  EXPECT_EQ(s.http.stats().rejected_client, 3);
  EXPECT_EQ(s.http.stats().rejected_busy, 3);
  // Client 1's two bodies come in full and are answered: what was refused never cut them off.
  ASSERT_TRUE(a.send(std::string(590, 'a')));
  ASSERT_TRUE(b.send(std::string(290, 'b')));
  const std::string ra = a.answer(), rb = b.answer();
  EXPECT_EQ(status_of(ra), 200) << ra.substr(0, 300);
  EXPECT_NE(ra.find(std::string(600, 'a')), std::string::npos) << ra.substr(0, 300);
  EXPECT_EQ(status_of(rb), 200) << rb.substr(0, 300);
  EXPECT_NE(rb.find(std::string(300, 'b')), std::string::npos) << rb.substr(0, 300);
  EXPECT_EQ(s.http.stats().receiving_bytes, 0);
  // Alone, a body of client 1 larger than its share is received; beside it, another of its bodies is refused, while
  // client 2's is answered.
  Sock g(s.port, "127.0.0.1");
  ASSERT_TRUE(g.send(head("/echo", 1500)));
  ASSERT_EQ(g.read(10000ms, "\r\n\r\n"), kContinue);
  EXPECT_EQ(s.http.stats().receiving_bytes, 1500);
  Sock h(s.port, "127.0.0.1");
  ASSERT_TRUE(h.send(post("/echo", "{}")));
  busy(h.answer(), 503);
  Sock k(s.port, "127.0.0.2");
  ASSERT_TRUE(k.send(post("/echo", "{}")));
  EXPECT_EQ(status_of(k.answer()), 200);
  ASSERT_TRUE(g.send(std::string(1500, 'g')));
  const std::string rg = g.answer();
  EXPECT_EQ(status_of(rg), 200) << rg.substr(0, 300);
  EXPECT_NE(rg.find(std::string(1500, 'g')), std::string::npos);
  EXPECT_EQ(s.http.stats().receiving_bytes, 0);
  EXPECT_EQ(s.http.stats().rejected_client, 4);
  EXPECT_EQ(s.served.load(), 6);  // the echo route: 2 + 1 of client 2, a, b, g
}

// A client's share is freed on every path a body ends by: 408 (the body stopped arriving), the client going away
// mid-body, and stop() — after each, a body of the same client that needs the share is taken again.
TEST(HttpServer, AClientsShareIsFreedAfter408DisconnectAndStop) {
  HttpServerOptions o = opts(2);
  o.header_timeout_ms = 1500;  // A's 408 below; B is refused long before it
  o.body_timeout_ms = 600000;
  o.max_buffered_body_bytes = 100000;
  o.max_client_body_bytes = 1000;
  TestServer s(o);
  auto head = [](size_t length) { return post_head("/echo", length, kExpect100); };
  // A declares 900 and sends nothing more: B's 200 from the same client are refused.
  Sock a(s.port, "127.0.0.1");
  ASSERT_TRUE(a.send(head(900)));
  ASSERT_EQ(a.read(10000ms, "\r\n\r\n"), kContinue);
  Sock b(s.port, "127.0.0.1");
  ASSERT_TRUE(b.send(head(200)));
  EXPECT_EQ(status_of(b.answer()), 503);
  EXPECT_EQ(s.http.stats().rejected_client, 1);
  // 408 for A, and its share is free: a body of 900 of the same client is answered.
  const std::string ra = a.answer(20000ms);
  EXPECT_EQ(status_of(ra), 408) << ra;
  EXPECT_EQ(s.http.stats().receiving_bytes, 0);
  Sock c(s.port, "127.0.0.1");
  ASSERT_TRUE(c.send(post("/echo", std::string(900, 'c'))));
  EXPECT_EQ(status_of(c.answer()), 200);
  // D declares 900, sends some and goes away: its share is freed, and E's 900 are answered.
  Sock d(s.port, "127.0.0.1");
  ASSERT_TRUE(d.send(head(900)));
  ASSERT_EQ(d.read(10000ms, "\r\n\r\n"), kContinue);
  ASSERT_TRUE(d.send(std::string(100, 'd')));
  EXPECT_EQ(s.http.stats().receiving_bytes, 900);
  d.close();
  ASSERT_TRUE(s.wait_for([&] { return s.http.stats().receiving_bytes == 0; })) << s.http.stats().receiving_bytes;
  Sock e(s.port, "127.0.0.1");
  ASSERT_TRUE(e.send(post("/echo", std::string(900, 'e'))));
  EXPECT_EQ(status_of(e.answer()), 200);
  EXPECT_EQ(s.http.stats().rejected_client, 1);
  // Every connection closed: no entry is left for the client.
  a.close();
  b.close();
  c.close();
  e.close();
  ASSERT_TRUE(s.wait_for([&] { return s.http.stats().connections == 0; })) << s.http.stats().connections;
  EXPECT_EQ(s.http.stats().clients, 0);
  // A body being received when the server stops: nothing is left counted.
  Sock f(s.port, "127.0.0.1");
  ASSERT_TRUE(f.send(head(900)));
  ASSERT_EQ(f.read(10000ms, "\r\n\r\n"), kContinue);
  EXPECT_EQ(s.http.stats().receiving_bytes, 900);
  EXPECT_EQ(s.http.stats().clients, 1);
  s.http.stop();
  EXPECT_EQ(s.http.stats().receiving_bytes, 0);
  EXPECT_EQ(s.http.stats().clients, 0);
}

// A client is its IP address: an IPv4-mapped IPv6 address (a dual-stack listener's IPv4 client) is the same client as
// that IPv4 address; other IPv6 addresses, and other IPv4 ones, are other clients.
TEST(HttpServer, AClientIsItsAddressAnIPv4MappedOneIsItsIPv4Address) {
  auto v4 = [](const char* text) {
    sockaddr_storage ss{};
    auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    a->sin_family = AF_INET;
    a->sin_port = htons(1234);
    EXPECT_EQ(inet_pton(AF_INET, text, &a->sin_addr), 1) << text;
    return lilac::server::http_detail::client_key(ss);
  };
  auto v6 = [](const char* text, uint16_t port) {
    sockaddr_storage ss{};
    auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    a->sin6_family = AF_INET6;
    a->sin6_port = htons(port);
    EXPECT_EQ(inet_pton(AF_INET6, text, &a->sin6_addr), 1) << text;
    return lilac::server::http_detail::client_key(ss);
  };
  EXPECT_EQ(v4("10.1.2.3"), v6("::ffff:10.1.2.3", 5678));
  EXPECT_EQ(v4("10.1.2.3"), std::string("\x0a\x01\x02\x03", 4));
  EXPECT_NE(v4("10.1.2.3"), v4("10.1.2.4"));
  EXPECT_NE(v6("2001:db8::1", 1), v6("2001:db8::2", 1));
  EXPECT_EQ(v6("2001:db8::1", 1), v6("2001:db8::1", 2));  // the port is not the client
  EXPECT_EQ(v6("2001:db8::1", 1).size(), 16u);
  EXPECT_NE(v6("::1", 1), v4("127.0.0.1"));
  sockaddr_storage unix_peer{};
  unix_peer.ss_family = AF_UNIX;
  EXPECT_EQ(lilac::server::http_detail::client_key(unix_peer), "");
}
