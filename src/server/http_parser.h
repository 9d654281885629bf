// An incremental HTTP/1.1 request parser that bounds everything a client controls: the request line,
// each header line, the headers' total size and count, and the body after decoding (Content-Length,
// chunked transfer coding, Content-Encoding gzip / deflate inflated only up to the limit). Pure: it
// reads bytes it is given and never does I/O, so every bound is tested byte by byte
// (tests/server/test_http_parser.cpp). The server's I/O loop (server/http_server.h) feeds it.
//
// What it refuses, with the status the server answers:
//   400 malformed request line / header line / chunk framing, Content-Length and Transfer-Encoding
//       together or Content-Lengths that disagree, a compressed body that is corrupt or truncated
//   411 a POST / PUT / PATCH without Content-Length or chunked Transfer-Encoding (never read to EOF)
//   413 a body (after decoding) or a Content-Length over max_body_bytes (at once, before reading it)
//   414 a request line over max_line          415 a Content-Encoding other than identity, gzip, deflate
//   417 an Expect other than 100-continue     431 a header line over max_line, headers over
//   501 a Transfer-Encoding other than chunked    max_header_bytes or more than max_headers
//   505 an HTTP version other than 1.0 / 1.1
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include <httplib.h>

namespace lilac::server {

struct HttpLimits {
  size_t max_line = 8192;            // the request line, one header line, one chunk-size line
  size_t max_header_bytes = 65536;   // request line + headers (+ chunked trailers)
  size_t max_headers = 100;          // header fields (+ trailer fields)
  size_t max_body_bytes = 8u << 20;  // the body after decoding (and the bytes received for it)
};

class RequestParser {
 public:
  enum class State { Headers, Body, Done, Error };

  explicit RequestParser(HttpLimits limits);
  ~RequestParser();
  RequestParser(const RequestParser&) = delete;
  RequestParser& operator=(const RequestParser&) = delete;

  // Consumes bytes of this request (never past its end: bytes of a pipelined next request are left);
  // returns how many were consumed. Nothing is consumed once the state is Done or Error.
  size_t feed(std::string_view data);
  // As feed(), but it stops once the headers are complete, before any byte of the body: the caller looks at the
  // headers (route, API key, room for the body) before the body is read or any memory is taken for it.
  size_t feed_headers(std::string_view data);

  State state() const { return state_; }
  bool started() const { return started_; }          // a byte of this request arrived
  bool headers_done() const { return state_ == State::Body || state_ == State::Done; }
  httplib::Request& request() { return req_; }
  const httplib::Request& request() const { return req_; }
  bool expect_continue() const { return expect_continue_; }  // "Expect: 100-continue" was sent
  bool keep_alive() const { return keep_alive_; }
  int error_status() const { return error_status_; }
  const std::string& error_message() const { return error_message_; }
  const std::string& error_code() const { return error_code_; }  // e.g. "payload_too_large"
  uint64_t body_bytes_received() const { return raw_body_; }    // on the wire (before decoding)
  // The body's length as declared by Content-Length (0 when chunked or without a body), known once the headers are in.
  uint64_t declared_length() const { return declared_; }

 private:
  struct Inflater;
  enum class Framing { None, Length, Chunked };
  enum class ChunkState { Size, Data, DataEnd, Trailer };

  bool fail(int status, std::string message, std::string code);
  bool take_line(std::string_view data, size_t& pos, size_t max, std::string_view& line, bool& complete);
  bool on_request_line(std::string_view line);
  bool on_header_line(std::string_view line);
  bool on_headers_end();
  size_t feed_impl(std::string_view data, bool stop_after_headers);
  size_t feed_body(std::string_view data);
  size_t feed_chunked(std::string_view data);
  bool body_bytes(std::string_view data);  // decoded into req_.body, bounded
  bool body_end();
  bool header_total_passed_first() const;  // a line too long: was max_header_bytes passed before max_line?

  HttpLimits limits_;
  State state_ = State::Headers;
  bool started_ = false;
  httplib::Request req_;
  std::string line_;       // a partial line carried between feeds
  size_t header_bytes_ = 0;
  size_t header_count_ = 0;
  bool request_line_done_ = false;
  int leading_empty_lines_ = 0;
  bool expect_continue_ = false;
  bool keep_alive_ = true;
  int error_status_ = 0;
  std::string error_message_, error_code_;
  Framing framing_ = Framing::None;
  uint64_t remaining_ = 0;  // Length: body bytes to come; Chunked: bytes left in the chunk
  uint64_t raw_body_ = 0;
  uint64_t declared_ = 0;   // Content-Length
  size_t reserve_ = 0;      // the room the body takes in req_.body, taken with its first byte
  ChunkState chunk_ = ChunkState::Size;
  std::unique_ptr<Inflater> inflater_;
};

// Percent-decoding of a path ("%2F" -> "/"; a malformed escape is kept as is).
std::string decode_path(std::string_view s);

}  // namespace lilac::server
