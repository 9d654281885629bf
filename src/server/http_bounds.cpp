// lilac's HTTP server: what one connection and one client may hold. The per-client bounds (a client is its peer
// address: client_key), making room among the connections (evict_one), and the bodies being received: their
// reservations (count_body, admit_body, body_fits), the busy answer past a bound (refuse_body) and their progress
// deadline (body_progress). I/O thread only, like the rest of HttpServer::Impl's connection state.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>

#include "server/http_internal.h"

namespace lilac::server {

using http_detail::Clock;
using http_detail::Conn;
using Phase = http_detail::Conn::Phase;

std::string http_detail::client_key(const sockaddr_storage& peer) {
  if (peer.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&peer);
    return std::string(reinterpret_cast<const char*>(&a->sin_addr), 4);
  }
  if (peer.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&peer);
    const char* b = reinterpret_cast<const char*>(&a->sin6_addr);
    if (IN6_IS_ADDR_V4MAPPED(&a->sin6_addr)) return std::string(b + 12, 4);
    return std::string(b, 16);
  }
  return "";
}

// A connection refused at accept (too many open): a short answer, then close.
void HttpServer::Impl::refuse_connection(int fd, const std::string& message) {
  std::string out = http_detail::simple_response(503, error_json(nullptr, 503, message, "too_many_connections"),
                                                 default_headers, {{"Retry-After", "1"}}, false);
  ssize_t w = ::send(fd, out.data(), out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  (void)w;
  ::close(fd);
}

// Closes the idle connection that has waited longest (between requests, or still sending headers), among the
// connections of `only` when given.
bool HttpServer::Impl::evict_one(const http_detail::Client* only) {
  Conn* oldest = nullptr;
  for (auto& [fd, c] : conns) {
    if (only && c->client != only) continue;
    if (c->phase != Phase::Reading && c->phase != Phase::Closing) continue;
    if (c->phase == Phase::Reading && (c->parser->headers_done() || c->ready)) continue;
    if (!oldest || c->idle_since < oldest->idle_since) oldest = c.get();
  }
  if (!oldest) return false;
  evicted++;
  close_conn(oldest->fd);
  return true;
}

void HttpServer::Impl::release_body(Conn& c) { count_body(c, 0); }

// Counts `bytes` as the connection's body in the total of the bodies being received, and in its client's.
void HttpServer::Impl::count_body(Conn& c, size_t bytes) {
  buffered_body = buffered_body - std::min(buffered_body, c.body_counted) + bytes;
  if (c.client) c.client->body = c.client->body - std::min(c.client->body, c.body_counted) + bytes;
  c.body_counted = bytes;
  n_receiving_bytes = int64_t(buffered_body);
}

// When a request's headers are in and a body follows: its declared length (Content-Length; a chunked body needs room
// for a byte) is reserved among the bodies being received, or, when that would take them past
// max_buffered_body_bytes, or its client's past max_client_body_bytes, the request is refused at once (busy), before
// any byte of its body is read. A body larger than the bound is taken when no other is being received (larger than
// the client's share: when no other of its client's is). Returns false when refused.
bool HttpServer::Impl::admit_body(Conn& c) {
  const RequestParser& p = *c.parser;
  if (p.state() != RequestParser::State::Body) return true;
  const uint64_t need = std::max<uint64_t>(p.declared_length(), 1);
  const size_t others = buffered_body - std::min(buffered_body, c.body_counted);
  if (others > 0 && others + need > opts.max_buffered_body_bytes) return refuse_body(c, false);
  if (opts.max_client_body_bytes > 0 && c.client) {
    const size_t mine = c.client->body - std::min(c.client->body, c.body_counted);
    if (mine > 0 && mine + need > opts.max_client_body_bytes) return refuse_body(c, true);
  }
  count_body(c, size_t(p.declared_length()));
  return true;
}

// The busy answer of a body that does not fit among the bodies being received (admit_body, body_fits), or among its
// client's (`client_share`); false.
bool HttpServer::Impl::refuse_body(Conn& c, bool client_share) {
  rejected++;
  if (client_share) rejected_client++;
  answer_busy(c, client_share ? "This client is sending too many request bodies at once; retry shortly."
                              : "The server is receiving too many request bodies at once; retry shortly.");
  return false;
}

// As a body arrives: the bytes beyond what it reserved (a chunked or compressed body) are counted, and refused
// (busy) when they take the bodies being received past max_buffered_body_bytes while other bodies hold some, or its
// client's past max_client_body_bytes while other bodies of that client hold some. A body within its declared length
// adds nothing, so a body taken with one is never cut off. Returns false when refused.
bool HttpServer::Impl::body_fits(Conn& c) {
  const size_t body = c.parser->request().body.size();
  if (body <= c.body_counted) return true;
  count_body(c, body);
  if (buffered_body > opts.max_buffered_body_bytes && buffered_body > c.body_counted) return refuse_body(c, false);
  if (opts.max_client_body_bytes > 0 && c.client && c.client->body > opts.max_client_body_bytes &&
      c.client->body > c.body_counted)
    return refuse_body(c, true);
  return true;
}

// A body being read: its deadline is the end of its whole allowance (body_timeout_ms), or sooner header_timeout_ms
// after the headers' end or after the last time kBodyProgressBytes of it had come, whichever is first (see
// kBodyProgressBytes). `bytes` were just read; `start`: the headers just ended.
void HttpServer::Impl::body_progress(Conn& c, size_t bytes, bool start) {
  c.body_since = start ? 0 : c.body_since + bytes;
  if (!start && c.body_since < http_detail::kBodyProgressBytes) return;
  c.body_since = 0;
  c.deadline = std::min(c.body_end, Clock::now() + std::chrono::milliseconds(opts.header_timeout_ms));
}

}  // namespace lilac::server
