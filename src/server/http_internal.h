// Internal to server/http_server.cpp and server/http_worker.cpp: the state the I/O thread and the
// workers share.
#pragma once
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <regex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "server/http_server.h"

namespace lilac::server::http_detail {

using Clock = std::chrono::steady_clock;

// Requests of one connection answered on the I/O thread in one pass of its loop (inline routes,
// preflights): a client that pipelines many in one write gets this many, then the other connections'
// events are served before its next ones (Conn::ready), so it cannot hold the I/O thread.
inline constexpr int kMaxAnswersPerPass = 32;

// A body must keep arriving: each 64 KiB of it (or all the rest) within header_timeout_ms (10 s: a rate of 6.4 KB/s
// at least, over each 10 s) of the headers' end or of the previous 64 KiB, else 408, so that a client that declared a
// length and sends nothing, or a byte now and then, frees its room among the bodies being received
// (max_buffered_body_bytes) in seconds rather than at body_timeout_ms (as nginx's client_body_timeout between two
// reads, and Apache's mod_reqtimeout with a minimum rate).
inline constexpr size_t kBodyProgressBytes = size_t(64) << 10;

struct Route {
  std::string method, pattern;
  bool is_regex = false;
  std::string prefix;  // regex: the literal text before its first special character
  std::regex re;
  HttpHandler handler;
  RouteOptions opts;
};

// One client (one peer address) and what its connections hold, for the per-client bounds
// (HttpServerOptions::max_client_connections, max_client_body_bytes). I/O thread only. Its entry in
// HttpServer::Impl::clients is made with its first connection and removed with its last (whose body was released
// before: `body` is 0 then).
struct Client {
  int conns = 0;     // open connections (accepted, not yet closed: reading, at a worker, writing or lingering)
  size_t body = 0;   // the Conn::body_counted of its connections (the bytes it holds among the bodies being received)
};

// The key of a peer address among the clients: the IPv4 address (4 bytes) for IPv4 and for an IPv4-mapped IPv6
// address (a dual-stack listener's IPv4 client is the same client as on an IPv4 one), the IPv6 address (16 bytes),
// or "" for any other family (all one client).
std::string client_key(const sockaddr_storage& peer);

struct Conn {
  enum class Phase { Reading, Worker, Writing, Closing };
  int fd = -1;
  std::string peer_addr, local_addr;
  int peer_port = -1, local_port = -1;
  std::string client_key;     // its client (client_key()) ...
  Client* client = nullptr;   // ... and that client's entry (nullptr once closed; unordered_map entries stay put)
  Phase phase = Phase::Reading;
  std::string in;  // received, not yet consumed (a pipelined next request)
  std::unique_ptr<RequestParser> parser;
  bool headers_handled = false;  // the checks after the headers ran (route, header check, 100-continue)
  const Route* route = nullptr;  // the route of the request being read (nullptr: none matched)
  size_t body_counted = 0;       // this request's body bytes counted in the server's buffered total and in its
                                 // client's (its declared length from its headers on, or what arrived when more)
  Clock::time_point deadline;
  // The body (headers in, body not complete): the end of its whole allowance (body_timeout_ms), and the bytes of it
  // read since its stall clock (header_timeout_ms) last restarted; see HttpServer::Impl::body_progress.
  Clock::time_point body_end;
  size_t body_since = 0;
  Clock::time_point idle_since;  // eviction order among idle connections
  std::string out;               // answer being written by the I/O thread
  size_t out_off = 0;
  bool close_after_write = false;
  bool in_epoll = false;
  uint32_t events = 0;
  size_t discarded = 0;          // Closing: bytes read and dropped
  int served = 0;                // requests answered on this connection
  bool ready = false;            // on Impl::ready: received requests wait for the next pass (see process())
  // Set by a worker when it hands the connection back.
  bool worker_keep_alive = false;
};

struct Task {
  std::shared_ptr<Conn> conn;
  httplib::Request req;
  const Route* route = nullptr;
  bool keep_alive = false;
  bool head = false;  // HEAD request on a GET route: no body in the answer
};

std::string reason_phrase(int status);
// The status line and headers of an answer. `length` -1: chunked; -2: until the connection closes.
std::string response_head(const httplib::Response& res, const httplib::Headers& defaults, int64_t length,
                          bool keep_alive, bool http10);
// A complete answer with a JSON body (errors of the HTTP layer).
std::string simple_response(int status, const std::string& body, const httplib::Headers& defaults,
                            const httplib::Headers& extra, bool keep_alive);

}  // namespace lilac::server::http_detail

namespace lilac::server {

struct HttpServer::Impl {
  using Conn = http_detail::Conn;
  using Route = http_detail::Route;
  using Task = http_detail::Task;
  using Clock = http_detail::Clock;

  Impl(HttpServer* s, HttpServerOptions o) : self(s), opts(std::move(o)) {}

  HttpServer* self;
  HttpServerOptions opts;
  std::vector<std::unique_ptr<Route>> routes;
  ErrorFormatter default_errors;
  std::function<std::optional<HttpError>(const httplib::Request&)> header_check;
  httplib::Headers default_headers, preflight_headers;
  std::function<void(const std::string&, int)> observer;

  int listen_fd = -1, epfd = -1, wake_fd = -1;
  int port = 0;
  std::thread io_thread;
  std::vector<std::thread> workers;
  std::atomic<bool> started{false}, stopping{false}, io_done{false};
  std::mutex run_mu;
  std::condition_variable run_cv;

  // I/O thread only.
  std::unordered_map<int, std::shared_ptr<Conn>> conns;
  size_t buffered_body = 0;  // the bodies being received (Conn::body_counted of every connection)
  // The clients with a connection open, by client_key (per-client bounds).
  std::unordered_map<std::string, http_detail::Client> clients;
  // Connections whose received requests were left for the next pass (kMaxAnswersPerPass): epoll does
  // not report them again, their bytes being read already.
  std::vector<std::shared_ptr<Conn>> ready;

  // Requests waiting for a worker.
  std::mutex task_mu;
  std::condition_variable task_cv;
  std::deque<Task> tasks;
  size_t pending_body = 0;  // the bytes of their bodies (HttpServerOptions::max_pending_body_bytes)
  // Connections handed back by workers.
  std::mutex ret_mu;
  std::vector<std::shared_ptr<Conn>> returned;

  std::atomic<int64_t> n_conns{0}, busy{0}, n_pending{0}, n_pending_bytes{0}, n_receiving_bytes{0}, timeouts{0},
      rejected{0}, evicted{0}, n_clients{0}, rejected_client{0};

  // http_server.cpp: the I/O thread.
  void io_loop();
  void accept_all();
  void on_event(Conn& c, uint32_t ev);
  void read_some(Conn& c);
  void process(Conn& c);
  void serve_ready();
  bool after_headers(Conn& c);
  void complete(Conn& c);
  void run_inline(Conn& c, httplib::Request& req, const Route& r, bool head, bool keep_alive);
  void answer_error(Conn& c, int status, const std::string& message, const std::string& code,
                    const httplib::Headers& extra = {});
  // The busy refusal (server_busy, Retry-After 1) in the route's shape and with its busy_status.
  void answer_busy(Conn& c, const std::string& message);
  void queue_out(Conn& c, std::string bytes, bool close_after);
  void flush(Conn& c);
  void reset_for_next(Conn& c);
  void close_conn(int fd);
  void linger(Conn& c);
  void set_events(Conn& c, uint32_t ev);
  void sweep(Clock::time_point now);
  // Closes the idle connection that has waited longest, of `only` that client when given.
  bool evict_one(const http_detail::Client* only = nullptr);
  void refuse_connection(int fd, const std::string& message);
  void take_returned();
  void release_body(Conn& c);
  void body_progress(Conn& c, size_t bytes, bool start);
  void count_body(Conn& c, size_t bytes);
  bool admit_body(Conn& c);
  bool body_fits(Conn& c);
  bool refuse_body(Conn& c, bool client_share);
  void shutdown_all();
  const Route* find_route(const std::string& method, const std::string& path, std::string* allow) const;
  const Route* shape_route(const std::string& method, const std::string& path) const;
  std::string error_json(const Route* r, int status, const std::string& message, const std::string& code) const;
  void wake();

  // http_worker.cpp: the workers.
  void worker_loop();
  void serve(Task& t);
  bool write_all(int fd, const char* data, size_t n);
  bool write_provider(int fd, httplib::Response& res, bool head, bool chunked);
};

}  // namespace lilac::server
