// The upstream's HTTP client with bounded answer heads and framing lines (see upstream_http.h).
#include "router/upstream_http.h"

#include <httplib.h>
#include <poll.h>
#ifdef CPPHTTPLIB_OPENSSL_SUPPORT
#include <openssl/err.h>
#endif

#include <algorithm>
#include <cerrno>
#include <climits>

#include "core/error.h"

namespace lilac::router {

namespace {

// A Stream that passes everything to `in`, watching the bytes read until the head's end: the blank line ("\r\n";
// cpp-httplib takes no bare "\n" as a line end) that ends a head whose status is not 100 (after a "100 Continue"
// the library reads another head, watched too, the bytes counted together; any other status is its answer). After the head, the library reads a
// chunked body's framing lines (chunk sizes, the CRLF after a chunk, the end) as it reads the head's, one byte per
// read(), whole before any check: a run of one-byte reads without a line end is such a line (a body's data is read in
// blocks; a one-byte read of data, its last byte, is followed by a line's), bounded like a line of the head.
class LineWatch final : public httplib::Stream {
 public:
  LineWatch(httplib::Stream& in, std::string& error) : in_(in), error_(error) {}

  bool is_readable() const override { return in_.is_readable(); }
  bool is_writable() const override { return in_.is_writable(); }
  ssize_t read(char* ptr, size_t size) override {
    const ssize_t n = in_.read(ptr, size);
    if (n > 0 && done_) {
      run_ = size == 1 && ptr[0] != '\n' ? run_ + 1 : 0;
      if (run_ <= kMaxHttpLineBytes) return n;
      fail("a line of the upstream's chunked body framing is longer than " + std::to_string(kMaxHttpLineBytes >> 10) +
           " KiB");
      return -1;
    }
    for (ssize_t i = 0; i < n && !done_; ++i)
      if (!take(ptr[i])) return -1;
    return n;
  }
  ssize_t write(const char* ptr, size_t size) override { return in_.write(ptr, size); }
  void get_remote_ip_and_port(std::string& ip, int& port) const override { in_.get_remote_ip_and_port(ip, port); }
  void get_local_ip_and_port(std::string& ip, int& port) const override { in_.get_local_ip_and_port(ip, port); }
  socket_t socket() const override { return in_.socket(); }

 private:
  bool fail(std::string why) {
    error_ = std::move(why);
    return false;
  }

  // One byte of the head; false when it breaks a bound.
  bool take(char c) {
    if (++bytes_ > kMaxHeadBytes)
      return fail("the upstream's answer head (status line and headers) is longer than " +
                  std::to_string(kMaxHeadBytes >> 10) + " KiB");
    if (c != '\n') {
      if (lines_ == 0 && line_ + 1 > kMaxStatusLineBytes)
        return fail("the upstream's status line is longer than " + std::to_string(kMaxStatusLineBytes >> 10) + " KiB");
      if (++line_ > kMaxHttpLineBytes)
        return fail("a line of the upstream's answer head is longer than " + std::to_string(kMaxHttpLineBytes >> 10) +
                    " KiB");
      if (line_ <= 12) start_ += c;
      last_ = c;
      return true;
    }
    const bool blank = line_ == 1 && last_ == '\r';
    // the status line: "HTTP/1.1 100" is an interim answer after which the library reads another head (it loops on
    // 100 only: a 101-103 it takes as the answer, and reads a body after it)
    if (lines_ == 0 && !blank)
      interim_ = start_.size() == 12 && start_.compare(0, 7, "HTTP/1.") == 0 && start_.compare(8, 4, " 100") == 0;
    line_ = 0;
    start_.clear();
    if (blank) {
      if (interim_) {
        interim_ = false;
        lines_ = 0;
      } else {
        done_ = true;
      }
      return true;
    }
    if (++lines_ > kMaxHeaderLines + 1)
      return fail("the upstream's answer has more than " + std::to_string(kMaxHeaderLines) + " header lines");
    return true;
  }

  httplib::Stream& in_;
  std::string& error_;
  size_t bytes_ = 0, line_ = 0, lines_ = 0;
  size_t run_ = 0;     // one-byte reads since a line end, after the head
  std::string start_;  // the first bytes of the line
  char last_ = 0;
  bool interim_ = false, done_ = false;
};

class PlainClient final : public UpstreamHttp, public httplib::ClientImpl {
 public:
  PlainClient(const std::string& host, int port) : httplib::ClientImpl(host, port) {}
  httplib::ClientImpl& http() override { return *this; }

 private:
  // What ClientImpl::process_socket does (the library's socket stream, with the client's timeouts), the head watched.
  bool process_socket(const Socket& socket, std::function<bool(httplib::Stream&)> callback) override {
    limit_error_.clear();
    return httplib::detail::process_client_socket(socket.sock, read_timeout_sec_, read_timeout_usec_,
                                                  write_timeout_sec_, write_timeout_usec_, [&](httplib::Stream& s) {
                                                    LineWatch w(s, limit_error_);
                                                    return callback(w);
                                                  });
  }
};

#ifdef CPPHTTPLIB_OPENSSL_SUPPORT
// A Stream over a TLS connection that SSLClient established (cpp-httplib's own, SSLSocketStream, is not in its
// header), as that one behaves: waits bounded by the client's read / write timeouts; SSL_read / SSL_write retried
// while OpenSSL wants more of the socket (a TLS 1.3 session ticket arrives as a record without data); 0 for the
// end of the connection, -1 for an error or a timeout.
class TlsStream final : public httplib::Stream {
 public:
  TlsStream(int sock, SSL* ssl, time_t rs, time_t rus, time_t ws, time_t wus)
      : sock_(sock), ssl_(ssl), read_ms_(int(rs * 1000 + rus / 1000)), write_ms_(int(ws * 1000 + wus / 1000)) {
    SSL_clear_mode(ssl_, SSL_MODE_AUTO_RETRY);  // a record without data returns to the loops below (no blocking)
  }

  bool is_readable() const override { return wait(POLLIN, read_ms_); }
  bool is_writable() const override { return wait(POLLOUT, write_ms_); }

  ssize_t read(char* ptr, size_t size) override {
    const int len = int(std::min<size_t>(size, INT_MAX));
    short want = POLLIN;
    for (int tries = 0; tries < 1000; ++tries) {
      if (SSL_pending(ssl_) <= 0 && !wait(want, read_ms_)) return -1;
      ERR_clear_error();  // SSL_get_error reads this thread's queue: a stale entry would turn "want read" fatal
      const int r = SSL_read(ssl_, ptr, len);
      if (r > 0) return r;
      const int err = SSL_get_error(ssl_, r);
      if (err == SSL_ERROR_WANT_READ) want = POLLIN;
      else if (err == SSL_ERROR_WANT_WRITE) want = POLLOUT;
      else return err == SSL_ERROR_ZERO_RETURN ? 0 : -1;  // the peer's close_notify ends the stream; else an error
    }
    return -1;
  }

  ssize_t write(const char* ptr, size_t size) override {
    const int len = int(std::min<size_t>(size, INT_MAX));
    short want = POLLOUT;
    for (int tries = 0; tries < 1000; ++tries) {
      if (!wait(want, write_ms_)) return -1;
      ERR_clear_error();
      const int r = SSL_write(ssl_, ptr, len);
      if (r > 0) return r;
      const int err = SSL_get_error(ssl_, r);
      if (err == SSL_ERROR_WANT_WRITE) want = POLLOUT;
      else if (err == SSL_ERROR_WANT_READ) want = POLLIN;
      else return -1;
    }
    return -1;
  }

  // (The client never asks; a server's logs would.)
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    ip.clear();
    port = 0;
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    ip.clear();
    port = 0;
  }
  socket_t socket() const override { return sock_; }

 private:
  bool wait(short events, int ms) const {
    pollfd p{sock_, events, 0};
    int r;
    do r = ::poll(&p, 1, ms);
    while (r < 0 && errno == EINTR);
    return r > 0;
  }

  int sock_;
  SSL* ssl_;
  int read_ms_, write_ms_;
};

class TlsClient final : public UpstreamHttp, public httplib::SSLClient {
 public:
  TlsClient(const std::string& host, int port) : httplib::SSLClient(host, port) {}
  httplib::ClientImpl& http() override { return *this; }

 private:
  bool process_socket(const Socket& socket, std::function<bool(httplib::Stream&)> callback) override {
    limit_error_.clear();
    if (!socket.ssl) return false;
    TlsStream s(socket.sock, socket.ssl, read_timeout_sec_, read_timeout_usec_, write_timeout_sec_,
                write_timeout_usec_);
    LineWatch w(s, limit_error_);
    return callback(w);
  }
};
#endif

}  // namespace

std::unique_ptr<UpstreamHttp> UpstreamHttp::make(bool tls, const std::string& host, int port) {
  if (!tls) return std::make_unique<PlainClient>(host, port);
#ifdef CPPHTTPLIB_OPENSSL_SUPPORT
  return std::make_unique<TlsClient>(host, port);
#else
  throw Error("upstream " + host + ": this build of cpp-httplib has no TLS support");
#endif
}

}  // namespace lilac::router
