// lilac's HTTP server: the workers (run a handler, write its answer with a write deadline, hand a
// keep-alive connection back to the I/O thread) and the answer serialisation.
#include <poll.h>
#include <sys/socket.h>

#include <strings.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>

#include "core/error.h"
#include "core/log.h"
#include "server/http_internal.h"

namespace lilac::server {

namespace http_detail {

std::string reason_phrase(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 201: return "Created";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 415: return "Unsupported Media Type";
    case 417: return "Expectation Failed";
    case 422: return "Unprocessable Content";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 505: return "HTTP Version Not Supported";
    default: return status < 400 ? "OK" : status < 500 ? "Client Error" : "Server Error";
  }
}

std::string response_head(const httplib::Response& res, const httplib::Headers& defaults, int64_t length,
                          bool keep_alive, bool http10) {
  std::string h = std::string(http10 ? "HTTP/1.0 " : "HTTP/1.1 ") + std::to_string(res.status) + " " +
                  reason_phrase(res.status) + "\r\n";
  auto add = [&](const std::string& k, const std::string& v) {
    // A handler's header value never splits the answer (no CR / LF).
    if (k.find_first_of("\r\n:") != std::string::npos || v.find_first_of("\r\n") != std::string::npos) return;
    h += k;
    h += ": ";
    h += v;
    h += "\r\n";
  };
  for (const auto& [k, v] : defaults)
    if (!res.has_header(k)) add(k, v);
  for (const auto& [k, v] : res.headers) {
    // The server frames the body itself.
    if (strcasecmp(k.c_str(), "Content-Length") == 0 || strcasecmp(k.c_str(), "Transfer-Encoding") == 0) continue;
    add(k, v);
  }
  if (length >= 0) {
    if (res.status != 204 && res.status != 304 && res.status >= 200) add("Content-Length", std::to_string(length));
  } else if (length == -1) {
    add("Transfer-Encoding", "chunked");
  }  // -2: the body ends when the connection closes (HTTP/1.0)
  if (!keep_alive) add("Connection", "close");
  else if (http10) add("Connection", "keep-alive");
  h += "\r\n";
  return h;
}

std::string simple_response(int status, const std::string& body, const httplib::Headers& defaults,
                            const httplib::Headers& extra, bool keep_alive) {
  httplib::Response res;
  res.status = status;
  res.headers = extra;
  res.set_header("Content-Type", "application/json");
  return response_head(res, defaults, int64_t(body.size()), keep_alive, false) + body;
}

}  // namespace http_detail

namespace {

thread_local int t_client_fd = -1;  // the connection of the request a worker is answering

}  // namespace

bool http_client_gone() {
  const int fd = t_client_fd;
  if (fd < 0) return false;
  pollfd p{fd, POLLIN | POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return true;
  if (p.revents & POLLIN) {  // EOF shows as readable with nothing to read (pipelined bytes do not count)
    char c;
    ssize_t r = ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
  }
  return false;
}

void HttpServer::Impl::worker_loop() {
  for (;;) {
    Task t;
    {
      std::unique_lock lk(task_mu);
      task_cv.wait(lk, [&] { return stopping.load() || !tasks.empty(); });
      if (stopping.load()) return;
      t = std::move(tasks.front());
      tasks.pop_front();
      pending_body -= std::min(pending_body, t.req.body.size());
      n_pending = int64_t(tasks.size());
      n_pending_bytes = int64_t(pending_body);
    }
    busy++;
    serve(t);
    busy--;
    {
      std::lock_guard lk(ret_mu);
      returned.push_back(std::move(t.conn));
    }
    wake();
  }
}

// Writes all of `data` (a stalled client is given write_timeout_ms per write that makes no progress).
bool HttpServer::Impl::write_all(int fd, const char* data, size_t n) {
  while (n > 0) {
    ssize_t w = ::send(fd, data, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      data += w;
      n -= size_t(w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd, POLLOUT, 0};
      int r = poll(&p, 1, opts.write_timeout_ms);
      if (r <= 0 || (p.revents & (POLLERR | POLLHUP | POLLNVAL))) return false;
      continue;
    }
    return false;
  }
  return true;
}

// Sends a content provider's output: chunked, of the fixed length the handler gave, or (HTTP/1.0) as
// is until the connection closes.
bool HttpServer::Impl::write_provider(int fd, httplib::Response& res, bool head, bool chunked) {
  if (head) return true;
  bool ok = true, done = false;
  size_t offset = 0;
  httplib::DataSink sink;
  sink.write = [&](const char* d, size_t n) -> bool {
    if (!ok || done) return false;
    if (n == 0) return true;
    if (chunked) {
      char hdr[32];
      int hl = std::snprintf(hdr, sizeof hdr, "%zx\r\n", n);
      ok = write_all(fd, hdr, size_t(hl)) && write_all(fd, d, n) && write_all(fd, "\r\n", 2);
    } else {
      ok = (res.content_length_ == 0 || offset + n <= res.content_length_) && write_all(fd, d, n);
    }
    offset += n;
    return ok;
  };
  sink.done = [&] {
    if (ok && !done && chunked) ok = write_all(fd, "0\r\n\r\n", 5);
    done = true;
  };
  sink.is_writable = [&] { return ok && !done && !http_client_gone(); };
  const bool fixed = !res.is_chunked_content_provider_ && res.content_length_ > 0;
  while (ok && !done) {
    if (stopping.load()) ok = false;
    else if (fixed && offset >= res.content_length_) done = true;
    else if (!res.content_provider_(offset, fixed ? res.content_length_ - offset : 0, sink)) ok = false;
  }
  return ok && done;
}

void HttpServer::Impl::serve(Task& t) {
  http_detail::Conn& c = *t.conn;
  t_client_fd = c.fd;
  httplib::Request& req = t.req;
  const bool http10 = req.version == "HTTP/1.0";
  bool ok = true;
  {
    httplib::Response res;
    try {
      if (t.route->is_regex) std::regex_match(req.path, req.matches, t.route->re);
      t.route->handler(req, res);
    } catch (const std::exception& e) {
      LILAC_LOG_ERROR("%s %s -> 500 (%s)", req.method.c_str(), req.path.c_str(), e.what());
      res = httplib::Response();
      res.status = 500;
      res.set_content(error_json(t.route, 500, std::string("Internal server error: ") + e.what(), "internal_error"),
                      "application/json");
    } catch (...) {
      res = httplib::Response();
      res.status = 500;
      res.set_content(error_json(t.route, 500, "Internal server error", "internal_error"), "application/json");
    }
    // A handler that stopped because the client went away (it cancelled its generation: a half-closed client counts,
    // as for nginx's 499) answered nothing: nothing is written and the connection closes (an empty 200 said the
    // request had succeeded).
    const bool gone = res.status < 0 && res.body.empty() && !res.content_provider_ && http_client_gone();
    if (res.status < 0) res.status = 200;
    const bool keep = t.keep_alive && !self->draining() && !stopping.load();
    bool keep_after = keep;
    if (gone) {
      ok = false;
    } else if (res.content_provider_) {
      const bool fixed = !res.is_chunked_content_provider_ && res.content_length_ > 0;
      const bool chunked = !fixed && !http10;
      if (!fixed && http10) keep_after = false;  // HTTP/1.0 has no chunks: the close ends the body
      std::string head = http_detail::response_head(
          res, default_headers, fixed ? int64_t(res.content_length_) : chunked ? -1 : -2, keep_after, http10);
      ok = write_all(c.fd, head.data(), head.size()) && write_provider(c.fd, res, t.head, chunked);
      res.content_provider_success_ = ok;
    } else {
      std::string out = http_detail::response_head(res, default_headers, int64_t(res.body.size()), keep, http10);
      if (!t.head) out += res.body;
      ok = write_all(c.fd, out.data(), out.size());
    }
    c.worker_keep_alive = ok && keep_after;
  }  // ~Response runs the provider's releaser (it may wait for threads of its own) before the handback
  t_client_fd = -1;
  (void)ok;
}

}  // namespace lilac::server
