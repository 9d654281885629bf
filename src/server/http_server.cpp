// lilac's HTTP server: the I/O thread (accepting, reading and bounding requests, deadlines, the answers
// it makes itself) and the server's life cycle. The workers are in server/http_worker.cpp.
#include "server/http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "core/log.h"
#include "server/http_internal.h"

namespace lilac::server {

using http_detail::Clock;
using http_detail::Conn;
using Phase = http_detail::Conn::Phase;

namespace {

constexpr size_t kReadChunk = 65536;
constexpr size_t kMaxInBuffer = 256 * 1024;  // unconsumed input kept per connection (pipelining)
constexpr int kLingerMs = 2000;              // after an error answer: drain the client's bytes this long
constexpr size_t kLingerBytes = size_t(1) << 20;

std::chrono::milliseconds ms(int v) { return std::chrono::milliseconds(v); }

std::string addr_string(const sockaddr_storage& ss, int* port) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (ss.ss_family == AF_INET) {
    auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, buf, sizeof buf);
    *port = ntohs(a->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof buf);
    *port = ntohs(a->sin6_port);
  }
  return buf;
}

}  // namespace

// ------------------------------------------------------------------------------------------- HttpServer

HttpServer::HttpServer(HttpServerOptions opts) : impl_(std::make_unique<Impl>(this, std::move(opts))) {}

HttpServer::~HttpServer() { stop(); }

void HttpServer::route(const std::string& method, const std::string& pattern, HttpHandler handler, RouteOptions o) {
  if (impl_->started) throw Error("HttpServer: route " + method + " " + pattern + " added after start()");
  auto r = std::make_unique<http_detail::Route>();
  r->method = method;
  r->pattern = pattern;
  r->is_regex = pattern.find('(') != std::string::npos;
  if (r->is_regex) {
    r->re = std::regex(pattern);
    r->prefix = pattern.substr(0, pattern.find_first_of("()[]{}.*+?^$|\\"));
  }
  r->handler = std::move(handler);
  r->opts = std::move(o);
  impl_->routes.push_back(std::move(r));
}

void HttpServer::set_default_errors(ErrorFormatter f) { impl_->default_errors = std::move(f); }
void HttpServer::set_header_check(std::function<std::optional<HttpError>(const httplib::Request&)> check) {
  impl_->header_check = std::move(check);
}
void HttpServer::set_default_headers(httplib::Headers h) { impl_->default_headers = std::move(h); }
void HttpServer::set_preflight_headers(httplib::Headers h) { impl_->preflight_headers = std::move(h); }
void HttpServer::set_observer(std::function<void(const std::string&, int)> f) { impl_->observer = std::move(f); }
const HttpServerOptions& HttpServer::options() const { return impl_->opts; }

HttpStats HttpServer::stats() const {
  HttpStats s;
  s.connections = impl_->n_conns.load();
  s.busy_workers = impl_->busy.load();
  s.pending = impl_->n_pending.load();
  s.pending_bytes = impl_->n_pending_bytes.load();
  s.receiving_bytes = impl_->n_receiving_bytes.load();
  s.timeouts = impl_->timeouts.load();
  s.rejected_busy = impl_->rejected.load();
  s.evicted = impl_->evicted.load();
  s.clients = impl_->n_clients.load();
  s.rejected_client = impl_->rejected_client.load();
  return s;
}

int HttpServer::bind() {
  Impl& I = *impl_;
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  const std::string port = std::to_string(I.opts.port);
  const std::string where = I.opts.host + ":" + port;
  int rc = getaddrinfo(I.opts.host.empty() ? nullptr : I.opts.host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0) throw Error("cannot listen on " + where + ": " + gai_strerror(rc));
  std::string why = "no address";
  for (addrinfo* a = res; a; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 1024) == 0) {
      I.listen_fd = fd;
      break;
    }
    why = std::strerror(errno);
    ::close(fd);
  }
  freeaddrinfo(res);
  if (I.listen_fd < 0) throw Error("cannot listen on " + where + " (" + why + ")");
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  getsockname(I.listen_fd, reinterpret_cast<sockaddr*>(&ss), &len);
  addr_string(ss, &I.port);
  I.epfd = epoll_create1(EPOLL_CLOEXEC);
  I.wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (I.epfd < 0 || I.wake_fd < 0) throw Error(std::string("cannot create the server's event loop: ") + std::strerror(errno));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = I.listen_fd;
  epoll_ctl(I.epfd, EPOLL_CTL_ADD, I.listen_fd, &ev);
  ev.data.fd = I.wake_fd;
  epoll_ctl(I.epfd, EPOLL_CTL_ADD, I.wake_fd, &ev);
  return I.port;
}

void HttpServer::start() {
  Impl& I = *impl_;
  if (I.listen_fd < 0) throw Error("HttpServer::start before bind");
  I.started = true;
  for (int i = 0; i < std::max(1, I.opts.workers); ++i) I.workers.emplace_back([&I] { I.worker_loop(); });
  I.io_thread = std::thread([&I] { I.io_loop(); });
}

void HttpServer::run() {
  start();
  std::unique_lock lk(impl_->run_mu);
  impl_->run_cv.wait(lk, [&] { return impl_->io_done.load(); });
}

void HttpServer::begin_drain() {
  draining_ = true;
  impl_->wake();
}

void HttpServer::stop() {
  Impl& I = *impl_;
  if (I.stopping.exchange(true)) return;
  draining_ = true;
  if (I.started) {
    I.wake();
    if (I.io_thread.joinable()) I.io_thread.join();
    I.task_cv.notify_all();
    for (auto& t : I.workers)
      if (t.joinable()) t.join();
  }
  // Requests never served, connections handed back after the I/O thread ended: no thread runs now.
  I.tasks.clear();
  I.pending_body = 0;
  I.n_pending_bytes = 0;
  I.buffered_body = 0;
  I.n_receiving_bytes = 0;
  for (auto& [fd, c] : I.conns) ::close(fd);
  I.conns.clear();
  I.clients.clear();
  I.n_clients = 0;
  I.ready.clear();
  for (int* fd : {&I.listen_fd, &I.epfd, &I.wake_fd})
    if (*fd >= 0) {
      ::close(*fd);
      *fd = -1;
    }
  {
    std::lock_guard lk(I.run_mu);
    I.io_done = true;
  }
  I.run_cv.notify_all();
}

// ------------------------------------------------------------------------------------------- routes

const http_detail::Route* HttpServer::Impl::find_route(const std::string& method, const std::string& path,
                                                       std::string* allow) const {
  const Route* hit = nullptr;
  for (const auto& r : routes) {
    bool match;
    if (!r->is_regex) {
      match = r->pattern == path;
    } else {
      // std::regex recurses per character: only paths of sane length are tried.
      match = path.size() <= 2048 && path.compare(0, r->prefix.size(), r->prefix) == 0 && std::regex_match(path, r->re);
    }
    if (!match) continue;
    const bool same = r->method == method || (method == "HEAD" && r->method == "GET");
    if (same && !hit) hit = r.get();
    if (allow && allow->find(r->method) == std::string::npos) *allow += (allow->empty() ? "" : ", ") + r->method;
  }
  if (allow && !allow->empty()) *allow += ", OPTIONS";
  return hit;
}

// The route whose error shape an error about (method, path) takes: the route itself, else one on the
// same path under another method; nullptr (the default shape) when none.
const http_detail::Route* HttpServer::Impl::shape_route(const std::string& method, const std::string& path) const {
  if (const Route* r = find_route(method, path, nullptr)) return r;
  for (const auto& r : routes)
    if (find_route(r->method, path, nullptr) == r.get()) return r.get();
  return nullptr;
}

std::string HttpServer::Impl::error_json(const Route* r, int status, const std::string& message,
                                         const std::string& code) const {
  if (r && r->opts.errors) return r->opts.errors(status, message, code);
  if (default_errors) return default_errors(status, message, code);
  return "{\"error\":{\"message\":\"" + message + "\"}}";
}

// ------------------------------------------------------------------------------------------- I/O loop

void HttpServer::Impl::wake() {
  if (wake_fd >= 0) {
    uint64_t one = 1;
    ssize_t w = ::write(wake_fd, &one, sizeof one);
    (void)w;
  }
}

void HttpServer::Impl::set_events(Conn& c, uint32_t ev) {
  epoll_event e{};
  e.events = ev;
  e.data.fd = c.fd;
  if (!c.in_epoll) {
    epoll_ctl(epfd, EPOLL_CTL_ADD, c.fd, &e);
    c.in_epoll = true;
  } else if (c.events != ev) {
    epoll_ctl(epfd, EPOLL_CTL_MOD, c.fd, &e);
  }
  c.events = ev;
}

void HttpServer::Impl::io_loop() {
  std::vector<epoll_event> evs(256);
  Clock::time_point last_sweep = Clock::now();
  bool was_draining = false;
  while (!stopping.load()) {
    int n = epoll_wait(epfd, evs.data(), int(evs.size()), ready.empty() ? 50 : 0);
    if (n < 0 && errno != EINTR) {
      LILAC_LOG_ERROR("http: epoll_wait failed: %s", std::strerror(errno));
      break;
    }
    for (int i = 0; i < n; ++i) {
      const int fd = evs[i].data.fd;
      if (fd == listen_fd) {
        accept_all();
      } else if (fd == wake_fd) {
        uint64_t v;
        while (::read(wake_fd, &v, sizeof v) > 0) {
        }
      } else if (auto it = conns.find(fd); it != conns.end()) {
        std::shared_ptr<Conn> keep = it->second;
        on_event(*keep, evs[i].events);
      }
    }
    take_returned();
    serve_ready();
    const bool drain = self->draining();
    if (drain && !was_draining) {  // idle keep-alive connections are closed at once
      std::vector<int> idle;
      for (auto& [fd, c] : conns)
        if (c->phase == Phase::Reading && !c->parser->started() && c->served > 0 && !c->ready) idle.push_back(fd);
      for (int fd : idle) close_conn(fd);
    }
    was_draining = drain;
    const auto now = Clock::now();
    if (now - last_sweep >= ms(50)) {
      sweep(now);
      last_sweep = now;
    }
  }
  // Stopping: no more accepts; every connection is shut down (workers' writes fail at once).
  shutdown_all();
  io_done = true;
}

void HttpServer::Impl::shutdown_all() {
  if (listen_fd >= 0) {
    epoll_ctl(epfd, EPOLL_CTL_DEL, listen_fd, nullptr);
    ::close(listen_fd);
    listen_fd = -1;
  }
  for (auto& [fd, c] : conns) ::shutdown(fd, SHUT_RDWR);
}

void HttpServer::Impl::accept_all() {
  for (;;) {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    int fd = accept4(listen_fd, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE) LILAC_LOG_WARN("http: cannot accept: %s", std::strerror(errno));
      return;
    }
    // The client's own bound first: at it, its own idle connection that has waited longest makes room (never
    // another client's), else the new one is refused. (Closing one may remove the client's entry: looked up again.)
    std::string key = http_detail::client_key(ss);
    if (opts.max_client_connections > 0) {
      auto it = clients.find(key);
      if (it != clients.end() && it->second.conns >= opts.max_client_connections && !evict_one(&it->second)) {
        rejected++;
        rejected_client++;
        refuse_connection(fd, "This client has too many open connections; retry shortly.");
        continue;
      }
    }
    if (int64_t(conns.size()) >= opts.max_connections && !evict_one()) {
      rejected++;  // full of connections that are all busy
      refuse_connection(fd, "The server has too many open connections; retry shortly.");
      continue;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    auto c = std::make_shared<Conn>();
    c->fd = fd;
    c->peer_addr = addr_string(ss, &c->peer_port);
    sockaddr_storage ls{};
    socklen_t ll = sizeof ls;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&ls), &ll) == 0) c->local_addr = addr_string(ls, &c->local_port);
    c->parser = std::make_unique<RequestParser>(opts.limits);
    c->idle_since = Clock::now();
    c->deadline = c->idle_since + ms(opts.idle_timeout_ms);  // until its first byte, then header_timeout_ms
    http_detail::Client& client = clients[key];
    client.conns++;
    c->client = &client;
    c->client_key = std::move(key);
    conns.emplace(fd, c);
    n_conns = int64_t(conns.size());
    n_clients = int64_t(clients.size());
    set_events(*c, EPOLLIN | EPOLLRDHUP);
  }
}

void HttpServer::Impl::close_conn(int fd) {
  auto it = conns.find(fd);
  if (it == conns.end()) return;
  Conn& c = *it->second;
  release_body(c);
  if (c.client && --c.client->conns == 0) clients.erase(c.client_key);  // its last: every body of it released
  c.client = nullptr;
  n_clients = int64_t(clients.size());
  if (c.in_epoll) epoll_ctl(epfd, EPOLL_CTL_DEL, fd, nullptr);
  ::close(fd);
  c.fd = -1;
  conns.erase(it);
  n_conns = int64_t(conns.size());
}

void HttpServer::Impl::on_event(Conn& c, uint32_t ev) {
  const int fd = c.fd;
  if (c.phase == Phase::Writing || (!c.out.empty() && (ev & EPOLLOUT))) {
    if (ev & (EPOLLERR | EPOLLHUP)) return close_conn(fd);
    flush(c);
    if (!conns.count(fd)) return;
    if (c.phase == Phase::Writing) return;
    if (c.phase == Phase::Reading && !c.in.empty()) {
      process(c);
      if (!conns.count(fd)) return;
    }
  }
  if (c.phase == Phase::Closing) {
    char buf[16384];
    for (;;) {
      ssize_t r = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
      if (r > 0 && (c.discarded += size_t(r)) < kLingerBytes) continue;
      if (r < 0 && (errno == EAGAIN || errno == EINTR)) return;
      return close_conn(fd);  // EOF, error, or enough drained
    }
  }
  if (c.phase != Phase::Reading) return;
  if (ev & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) read_some(c);
}

void HttpServer::Impl::read_some(Conn& c) {
  const int fd = c.fd;
  bool eof = false;
  while (c.in.size() < kMaxInBuffer) {
    char buf[kReadChunk];
    ssize_t r = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (r > 0) {
      c.in.append(buf, size_t(r));
      if (size_t(r) < sizeof buf) break;
      continue;
    }
    if (r == 0) eof = true;
    else if (errno == EINTR) continue;
    else if (errno != EAGAIN && errno != EWOULDBLOCK) eof = true;
    break;
  }
  if (!c.in.empty()) process(c);
  if (!conns.count(fd)) return;
  // The client is gone (or half-closed mid-request). A half-closed one with requests left for the next
  // pass gets them answered first (EOF is seen again on the next read).
  if (eof && c.phase == Phase::Reading && !c.ready) return close_conn(fd);
}

// Feeds the connection's input to its parser and acts on what comes out: at most kMaxAnswersPerPass
// answers, then the connection is put on the ready list for the loop's next pass. It stops too while
// an answer is still being written (Phase::Writing: the rest of the input waits until it drains).
void HttpServer::Impl::process(Conn& c) {
  const int fd = c.fd;
  int answered = 0;
  while (c.phase == Phase::Reading && !c.in.empty() && conns.count(fd)) {
    if (answered == http_detail::kMaxAnswersPerPass) {
      if (!c.ready) {
        c.ready = true;
        ready.push_back(conns.at(fd));
      }
      return;
    }
    RequestParser& p = *c.parser;
    const bool fresh = !p.started();
    // The headers alone until they were checked (after_headers): a body is read only once there is room for it.
    const bool body_read = c.headers_handled;
    const size_t used = body_read ? p.feed(c.in) : p.feed_headers(c.in);
    c.in.erase(0, used);
    if (body_read && used > 0 && p.state() == RequestParser::State::Body) body_progress(c, used, false);
    // The headers' deadline runs from the request's first byte, read now or received with the request
    // before it (pipelined: its clock starts once that one is answered), never the idle deadline.
    if (fresh && p.started()) c.deadline = Clock::now() + ms(opts.header_timeout_ms);
    if (p.state() == RequestParser::State::Error) {
      if (!c.route && !p.request().path.empty()) c.route = shape_route(p.request().method, p.request().path);
      return answer_error(c, p.error_status(), p.error_message(), p.error_code());
    }
    if (p.headers_done() && !c.headers_handled && !after_headers(c)) return;
    if (!body_fits(c)) return;
    if (p.state() == RequestParser::State::Done) {
      complete(c);
      ++answered;
      continue;  // an inline answer: the next pipelined request may follow
    }
    if (used == 0) break;
  }
}

// The connections process() left with received requests, served after the pass's other events.
void HttpServer::Impl::serve_ready() {
  std::vector<std::shared_ptr<Conn>> now;
  now.swap(ready);
  for (auto& c : now) {
    c->ready = false;
    auto it = conns.find(c->fd);
    if (it == conns.end() || it->second != c) continue;  // closed meanwhile
    if (c->phase == Phase::Reading && !c->in.empty()) process(*c);  // else its flush goes on (on_event)
  }
}

// Runs once per request when its headers are in: route, draining, the header check, 100-continue.
// Returns false when the request was answered (with an error).
bool HttpServer::Impl::after_headers(Conn& c) {
  c.headers_handled = true;
  const httplib::Request& req = c.parser->request();
  std::string allow;
  c.route = find_route(req.method, req.path, &allow);
  if (req.method == "OPTIONS") {
    c.body_end = c.deadline = Clock::now() + ms(opts.body_timeout_ms);
    return true;
  }
  if (!c.route) {
    c.route = shape_route(req.method, req.path);  // for the error's shape only
    if (!allow.empty()) {
      answer_error(c, 405, "Method " + req.method + " is not allowed on " + req.path + " (allowed: " + allow + ").",
                   "method_not_allowed", {{"Allow", allow}});
    } else {
      answer_error(c, 404, "Unknown endpoint: " + req.method + " " + req.path, "unknown_url");
    }
    return false;
  }
  if (self->draining() && !c.route->opts.run_inline) {
    answer_error(c, 503, "The server is shutting down; it accepts no new requests.", "shutting_down",
                 {{"Retry-After", "5"}});
    return false;
  }
  if (header_check && !c.route->opts.run_inline) {
    if (auto e = header_check(req)) {
      answer_error(c, e->status, e->message, e->code);
      return false;
    }
  }
  if (!admit_body(c)) return false;
  // (No 100 Continue once body bytes came with the headers: RFC 9110 lets the server omit it then.)
  if (c.parser->expect_continue() && c.parser->state() == RequestParser::State::Body && c.in.empty()) {
    c.out += "HTTP/1.1 100 Continue\r\n\r\n";
    flush(c);
    if (!conns.count(c.fd)) return false;
  }
  c.body_end = Clock::now() + ms(opts.body_timeout_ms);
  body_progress(c, 0, true);
  return true;
}

void HttpServer::Impl::complete(Conn& c) {
  httplib::Request req = std::move(c.parser->request());
  const bool keep_alive = c.parser->keep_alive() && !self->draining();
  const bool http10 = req.version == "HTTP/1.0";
  req.remote_addr = c.peer_addr;
  req.remote_port = c.peer_port;
  req.local_addr = c.local_addr;
  req.local_port = c.local_port;
  const Route* r = c.route;
  if (req.method == "OPTIONS") {
    std::string allow;
    find_route("GET", req.path, &allow);
    httplib::Response res;
    res.status = 204;
    res.headers = preflight_headers;
    if (!allow.empty()) res.set_header("Allow", allow);
    reset_for_next(c);
    return queue_out(c, http_detail::response_head(res, default_headers, 0, keep_alive, http10), !keep_alive);
  }
  if (r->opts.run_inline) {
    reset_for_next(c);
    run_inline(c, req, *r, req.method == "HEAD", keep_alive);
    return;
  }
  // A worker answers. The connection leaves the event loop until the worker hands it back.
  {
    std::lock_guard lk(task_mu);
    // Room: the idle workers, plus max_pending requests waiting, whose bodies hold max_pending_body_bytes at most (a
    // request that finds no idle worker waits; one without a body adds no bytes; a body larger than the bound waits
    // when no other waiting body holds any, so any body the limits admit can be answered).
    const int64_t taken = int64_t(tasks.size()) + busy.load();
    const size_t bytes = req.body.size();
    const bool waits = taken >= int64_t(opts.workers);
    const bool full = taken >= int64_t(opts.workers) + opts.max_pending;
    const bool too_many_bytes =
        waits && bytes > 0 && pending_body > 0 && pending_body + bytes > opts.max_pending_body_bytes;
    if (full || too_many_bytes) {
      rejected++;
      c.parser = std::make_unique<RequestParser>(opts.limits);  // the request is dropped
      answer_busy(c, full ? "The server is busy: every worker is taken and the wait queue is full; retry shortly."
                          : "The server is busy: every worker is taken and the requests waiting for one hold too many "
                            "body bytes; retry shortly.");
      return;
    }
    release_body(c);
    if (c.in_epoll) {
      epoll_ctl(epfd, EPOLL_CTL_DEL, c.fd, nullptr);
      c.in_epoll = false;
    }
    c.phase = Phase::Worker;
    Task t;
    t.conn = conns.at(c.fd);
    t.req = std::move(req);
    t.route = r;
    t.keep_alive = keep_alive;
    t.head = t.req.method == "HEAD";
    pending_body += t.req.body.size();
    tasks.push_back(std::move(t));
    n_pending = int64_t(tasks.size());
    n_pending_bytes = int64_t(pending_body);
  }
  task_cv.notify_one();
}

void HttpServer::Impl::run_inline(Conn& c, httplib::Request& req, const Route& r, bool head, bool keep_alive) {
  httplib::Response res;
  try {
    if (r.is_regex) std::regex_match(req.path, req.matches, r.re);
    r.handler(req, res);
    if (res.content_provider_) throw Error("an inline route answered with a content provider");
  } catch (const std::exception& e) {
    LILAC_LOG_ERROR("%s %s -> 500 (%s)", req.method.c_str(), req.path.c_str(), e.what());
    res = httplib::Response();
    res.status = 500;
    res.set_content(error_json(&r, 500, std::string("Internal server error: ") + e.what(), "internal_error"),
                    "application/json");
  }
  if (res.status < 0) res.status = 200;
  std::string out = http_detail::response_head(res, default_headers, int64_t(res.body.size()), keep_alive,
                                               req.version == "HTTP/1.0");
  if (!head) out += res.body;
  queue_out(c, std::move(out), !keep_alive);
}

void HttpServer::Impl::reset_for_next(Conn& c) {
  release_body(c);
  c.served++;
  c.parser = std::make_unique<RequestParser>(opts.limits);
  c.headers_handled = false;
  c.route = nullptr;
  c.idle_since = Clock::now();
  c.deadline = c.idle_since + ms(opts.idle_timeout_ms);
}

void HttpServer::Impl::answer_busy(Conn& c, const std::string& message) {
  answer_error(c, c.route ? c.route->opts.busy_status : 503, message, "server_busy", {{"Retry-After", "1"}});
}

void HttpServer::Impl::answer_error(Conn& c, int status, const std::string& message, const std::string& code,
                                    const httplib::Headers& extra) {
  const httplib::Request& req = c.parser->request();
  if (status == 408) timeouts++;
  const std::string route = c.route ? c.route->pattern : "";
  if (observer) observer(route, status);
  LILAC_LOG_WARN("%s %s -> %d: %s", req.method.empty() ? "-" : req.method.c_str(),
                 req.path.empty() ? "-" : req.path.c_str(), status, message.c_str());
  std::string out = http_detail::simple_response(status, error_json(c.route, status, message, code), default_headers,
                                                 extra, false);
  // The connection closes after this answer: the request's body (read so far) is never used, and no longer counted
  // among the bodies being received while the answer is written and the connection lingers.
  std::string().swap(c.parser->request().body);
  release_body(c);
  c.in.clear();
  queue_out(c, std::move(out), true);
}

// Writes what it can now; the rest when the socket is writable (Phase::Writing until done).
void HttpServer::Impl::queue_out(Conn& c, std::string bytes, bool close_after) {
  c.out += bytes;
  c.close_after_write = c.close_after_write || close_after;
  c.phase = Phase::Writing;
  c.deadline = Clock::now() + ms(opts.write_timeout_ms);
  flush(c);
}

void HttpServer::Impl::flush(Conn& c) {
  const int fd = c.fd;
  while (c.out_off < c.out.size()) {
    ssize_t w = ::send(fd, c.out.data() + c.out_off, c.out.size() - c.out_off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      c.out_off += size_t(w);
      c.deadline = Clock::now() + ms(opts.write_timeout_ms);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      // Not EPOLLRDHUP while answering: a half-closed client must not wake the loop over and over.
      set_events(c, c.phase == Phase::Reading ? (EPOLLOUT | EPOLLIN | EPOLLRDHUP) : EPOLLOUT);
      return;
    }
    return close_conn(fd);
  }
  c.out.clear();
  c.out_off = 0;
  if (c.phase != Phase::Writing) {  // a 100 Continue while reading
    set_events(c, EPOLLIN | EPOLLRDHUP);
    return;
  }
  if (c.close_after_write) return linger(c);
  c.phase = Phase::Reading;
  c.deadline = std::max(c.deadline, c.idle_since + ms(opts.idle_timeout_ms));
  set_events(c, EPOLLIN | EPOLLRDHUP);
  // A pipelined request already received is processed by the caller (process() loops; on_event calls it).
}

// After an answer that closes the connection: stop writing, and read (and drop) what the client still
// sends for a moment, so that closing with unread bytes does not reset the connection before the
// client has read the answer.
void HttpServer::Impl::linger(Conn& c) {
  ::shutdown(c.fd, SHUT_WR);
  c.phase = Phase::Closing;
  c.in.clear();
  c.deadline = Clock::now() + ms(kLingerMs);
  set_events(c, EPOLLIN | EPOLLRDHUP);
}

void HttpServer::Impl::sweep(Clock::time_point now) {
  std::vector<int> expired;
  for (auto& [fd, c] : conns)
    if (c->phase != Phase::Worker && now >= c->deadline) expired.push_back(fd);
  for (int fd : expired) {
    auto it = conns.find(fd);
    if (it == conns.end()) continue;
    Conn& c = *it->second;
    if (c.phase == Phase::Reading && c.parser->started()) {
      const bool headers = c.parser->headers_done();
      const bool stalled = headers && now < c.body_end;  // the body stopped arriving (kBodyProgressBytes)
      answer_error(c, 408,
                   stalled ? "The request body stalled: less than 64 KiB of it arrived in " +
                                 std::to_string(opts.header_timeout_ms / 1000) + " s."
                   : headers ? "The request body did not arrive within " + std::to_string(opts.body_timeout_ms / 1000) + " s."
                             : "The request headers did not arrive within " + std::to_string(opts.header_timeout_ms / 1000) + " s.",
                   "request_timeout");
    } else {
      close_conn(fd);  // idle keep-alive, a stalled write, or the end of a lingering close
    }
  }
}

// Connections handed back by workers: closed, or read from again (a keep-alive connection).
void HttpServer::Impl::take_returned() {
  std::vector<std::shared_ptr<Conn>> back;
  {
    std::lock_guard lk(ret_mu);
    back.swap(returned);
  }
  for (auto& c : back) {
    if (!conns.count(c->fd)) continue;
    if (!c->worker_keep_alive || self->draining() || stopping) {
      close_conn(c->fd);
      continue;
    }
    c->phase = Phase::Reading;
    reset_for_next(*c);
    set_events(*c, EPOLLIN | EPOLLRDHUP);
    if (!c->in.empty()) process(*c);
  }
}

}  // namespace lilac::server
