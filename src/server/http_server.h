// lilac's HTTP/1.1 server (the server side only; cpp-httplib's client still talks to upstreams, and its
// Request / Response structs carry requests and answers, so handlers are written as for httplib).
//
// One I/O thread (epoll) accepts connections and reads every request in full, bounded by
// server/http_parser.h (line, header and body limits, body size after decompression) and by deadlines
// (the headers within header_timeout_ms of their first byte, or for a request pipelined behind another,
// of the answer before it; the body within body_timeout_ms of the headers' end, and each 64 KiB of it within
// header_timeout_ms of the headers' end or of the previous 64 KiB; a connection without a
// request in progress, new or kept alive, closed after idle_timeout_ms). It answers on its own,
// without a worker: the errors of the HTTP layer (in the route's protocol, see ErrorFormatter), CORS
// preflights, 503 while draining, and the routes marked `inline` (/health, /metrics: quick, never
// blocking), so those answer at once even when every worker is busy or stalled. A connection that
// pipelines many gets a few answers per pass of the loop (http_detail::kMaxAnswersPerPass), the other
// connections served in between, and its input waits while an answer is being written. Complete requests go
// to a bounded queue (max_pending requests, max_pending_body_bytes of their bodies; beyond either 503 at once)
// served by `workers` threads, which write the answer with a write deadline (a client that stops reading is
// dropped) and hand a keep-alive connection back to the I/O thread. Open connections are capped
// (max_connections): past the cap the idle connection that has waited longest is closed to make room (idle =
// between requests, or still sending its headers), or the new one gets 503 when none is idle. The bodies being
// received are bounded together (max_buffered_body_bytes): only a request's headers are read until they were
// checked, then a body with a Content-Length reserves that length, or is refused at once with the route's busy answer
// (503; Anthropic's 529), before any byte of it is read or any room taken for it, when it does not fit beside the
// bodies being received; a chunked (or compressed) body counts its bytes as they arrive (beyond its declared length)
// and gets the same answer when they take the total past the bound. A body taken with its declared length is never
// cut off for room, and a body larger than the bound is received when no other is (so any body the limits admit can
// be answered). Both bounds hold per client too (a client: the peer's IP address, an IPv4-mapped IPv6 address as its
// IPv4 one), so that one client cannot take what they give all: its open connections (max_client_connections: past
// it its own idle connection that has waited longest is closed to make room, or the new one gets 503 when none of its
// own is idle; another client's connection is never closed for it), and its bodies being received
// (max_client_body_bytes: counted as above, a body that would take it past its share gets the same busy answer at
// once unless it has no other body being received).
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <httplib.h>

#include "server/http_parser.h"

namespace lilac::server {

// A route's handler. The request is the handler's to take from: one that keeps running after it no longer needs the
// body's text (a generation answered for minutes) moves it out, so that the text is not held until the answer is sent.
// (A handler declared with a const Request& fits too.)
using HttpHandler = std::function<void(httplib::Request&, httplib::Response&)>;

// The body (JSON text) of an error the HTTP layer answers itself, in one protocol's shape. `code` is a
// machine-readable name such as "payload_too_large".
using ErrorFormatter = std::function<std::string(int status, const std::string& message, const std::string& code)>;

struct HttpError {
  int status = 0;
  std::string message, code;
};

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                 // 0 = any free port
  int workers = 96;                // handler threads (each request in progress holds one)
  int max_pending = 32;            // complete requests waiting for a worker; more: 503 at once
  // The bytes of their bodies: a request that would wait for a worker with more than this many bytes of bodies
  // waiting (its own included) gets the same 503 at once, unless no waiting request holds any (so any body the
  // limits admit can wait its turn). Without it the queue could hold max_pending bodies of max_body_bytes.
  size_t max_pending_body_bytes = size_t(16) << 20;
  int max_connections = 1024;      // open connections (see above)
  HttpLimits limits;
  int header_timeout_ms = 10000;   // request line + headers, from their first byte
  int body_timeout_ms = 60000;     // the whole body, from the end of the headers
  // Besides, a body must keep arriving: each 64 KiB of it (http_detail::kBodyProgressBytes), or all the rest, within
  // header_timeout_ms of the headers' end or of the previous 64 KiB (else 408), so that an idle or trickling client
  // frees its room among the bodies being received in seconds.
  int idle_timeout_ms = 30000;     // a connection with no request in progress (new, or between requests)
  int write_timeout_ms = 30000;    // a write that makes no progress
  // The bodies being received, all connections together (declared lengths reserved; see above). Without it each of
  // max_connections could hold a body of max_body_bytes.
  size_t max_buffered_body_bytes = size_t(256) << 20;
  // Per client (one peer address; see above): its open connections, and the bytes of its bodies being received
  // (declared lengths reserved, chunked bodies as they arrive). 0: no per-client bound. (lilac serve's defaults:
  // a quarter of max_connections, half of max_buffered_body_bytes; server.cpp.)
  int max_client_connections = 0;
  size_t max_client_body_bytes = 0;
};

struct RouteOptions {
  bool run_inline = false;  // answered on the I/O thread: must be quick and never block
  ErrorFormatter errors;    // this route's error shape (empty: the server's default)
  int busy_status = 503;    // the status of the HTTP layer's "busy, retry shortly" refusals (Anthropic's: 529)
};

struct HttpStats {
  int64_t connections = 0, busy_workers = 0, pending = 0;
  int64_t pending_bytes = 0;  // the bytes of the bodies of the requests waiting for a worker
  int64_t receiving_bytes = 0;  // the bytes of the bodies being received (declared lengths; max_buffered_body_bytes)
  int64_t timeouts = 0, rejected_busy = 0, evicted = 0;  // totals
  int64_t clients = 0;          // the clients (peer addresses) with a connection open
  int64_t rejected_client = 0;  // total: the refusals of rejected_busy made by a per-client bound
};

class HttpServer {
 public:
  explicit HttpServer(HttpServerOptions opts);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // `pattern`: a literal path, or a regular expression (std::regex, whole path; groups in req.matches)
  // when it contains '('. A path that matches a route under another method gets 405 with Allow.
  // Routes are added before start() (throws lilac::Error after).
  void route(const std::string& method, const std::string& pattern, HttpHandler handler, RouteOptions o = {});
  void Get(const std::string& pattern, HttpHandler h, RouteOptions o = {}) { route("GET", pattern, std::move(h), std::move(o)); }
  void Post(const std::string& pattern, HttpHandler h, RouteOptions o = {}) { route("POST", pattern, std::move(h), std::move(o)); }

  void set_default_errors(ErrorFormatter f);
  // Runs on the I/O thread once a request's headers are in, before its body is read (e.g. the API key):
  // an error is answered at once and the body is never read.
  void set_header_check(std::function<std::optional<HttpError>(const httplib::Request&)> check);
  void set_default_headers(httplib::Headers h);  // added to every answer (unless the answer sets them)
  void set_preflight_headers(httplib::Headers h);  // added to the 204 answer of OPTIONS requests
  // Told about every answer the HTTP layer makes itself (errors): the matched route's pattern ("" when
  // none) and the status.
  void set_observer(std::function<void(const std::string& route, int status)> f);

  int bind();   // throws lilac::Error; returns the port
  void start();  // serve on background threads
  void run();    // serve; returns after stop()
  // New requests get 503 (inline routes still answer; keep-alive connections close after their answer).
  void begin_drain();
  // Stops accepting, closes every connection (a worker's writes then fail) and joins the threads.
  void stop();
  bool draining() const { return draining_.load(); }
  HttpStats stats() const;
  const HttpServerOptions& options() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::atomic<bool> draining_{false};
};

// For a handler running on a worker: whether the client of the current request has closed its side
// of the connection (checked without blocking). False outside a worker.
bool http_client_gone();

}  // namespace lilac::server
