// The hybrid router's HTTP/1.1 client of the upstream: cpp-httplib's (ClientImpl for http://, SSLClient for https://)
// with every line it reads of an answer (the head: status line and headers; a chunked body's framing lines) read
// within bounds.
//
// cpp-httplib (Debian's 0.11.4, a compiled library) reads an answer's whole head before it hands anything back (the
// response_handler runs after it) and bounds it badly: no bound on the number of header lines (200,000 were read
// into the Response); a line of any length is read whole, one byte at a time, before its 8,192-byte check
// (CPPHTTPLIB_HEADER_MAX_LENGTH, fixed when the library was built: redefining the macro here changes nothing), so
// a line without an end grows until the connection ends; lines without a CR are skipped without limit; the status
// line is matched with std::regex, whose recursion overflowed a thread's 8 MiB stack on a 50 KB line (the process
// died of SIGSEGV); and a chunked body's chunk-size lines are read like header lines, with no check at all. An
// upstream, or anyone between it and an http:// URL, could take the memory or kill the server with one answer.
//
// Here every read of the connection passes through a watch (the library's ClientImpl::process_socket is virtual:
// overridden, it runs the request on a stream that wraps the library's socket stream, or, for TLS, lilac's own
// stream over the connection's SSL object, the library's being internal). A head longer than kMaxHeadBytes, a line
// of it or of a chunked body's framing longer than kMaxHttpLineBytes, or more than kMaxHeaderLines header lines ends
// the read: the request fails as a read error (httplib::Error::Read) and limit_error() says which bound. The body's
// data is not bounded here: the caller bounds it as it arrives (router/upstream.cpp).
#pragma once
#include <cstddef>
#include <memory>
#include <string>

namespace httplib {
class ClientImpl;
}

namespace lilac::router {

constexpr size_t kMaxHeadBytes = size_t(64) << 10;     // status line and headers, line ends included
constexpr size_t kMaxHttpLineBytes = size_t(8) << 10;  // one line of the head or of the framing, its end excluded
// The status line: shorter still — the library matches it with std::regex, whose recursion needs ~1 MiB of stack for
// an 8 KiB line (a reading thread with a small stack would die of it).
constexpr size_t kMaxStatusLineBytes = size_t(1) << 10;
constexpr size_t kMaxHeaderLines = 100;                // lines after the status line

class UpstreamHttp {
 public:
  // A client of `host` (an IPv6 literal without brackets) on `port`; TLS when `tls`. Throws lilac::Error when this
  // build has no TLS and `tls` is asked.
  static std::unique_ptr<UpstreamHttp> make(bool tls, const std::string& host, int port);
  virtual ~UpstreamHttp() = default;

  virtual httplib::ClientImpl& http() = 0;
  // Which bound the last answer broke ("" when none): set while a request runs, read on its thread once the request
  // returned.
  const std::string& limit_error() const { return limit_error_; }

 protected:
  std::string limit_error_;
};

}  // namespace lilac::router
