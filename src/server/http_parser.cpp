#include "server/http_parser.h"

#include <zlib.h>

#include <algorithm>
#include <cstring>

namespace lilac::server {

namespace {

bool is_tchar(unsigned char c) {
  if (c >= '0' && c <= '9') return true;
  if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return true;
  return std::strchr("!#$%&'*+-.^_`|~", c) != nullptr && c != 0;
}

std::string lower(std::string_view s) {
  std::string r(s);
  for (auto& c : r) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return r;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// Whether a comma-separated header value lists `token` (case-insensitive).
bool lists_token(std::string_view value, std::string_view token) {
  const std::string v = lower(value);
  size_t i = 0;
  while (i <= v.size()) {
    size_t c = v.find(',', i);
    if (c == std::string::npos) c = v.size();
    if (trim(std::string_view(v).substr(i, c - i)) == token) return true;
    i = c + 1;
  }
  return false;
}

int hex_value(unsigned char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

void parse_query(std::string_view q, httplib::Params& params) {
  size_t i = 0;
  while (i < q.size()) {
    size_t amp = q.find('&', i);
    if (amp == std::string_view::npos) amp = q.size();
    std::string_view kv = q.substr(i, amp - i);
    if (!kv.empty()) {
      size_t eq = kv.find('=');
      std::string k = decode_path(kv.substr(0, eq));
      std::string v = eq == std::string_view::npos ? "" : decode_path(kv.substr(eq + 1));
      params.emplace(std::move(k), std::move(v));
    }
    i = amp + 1;
  }
}

}  // namespace

std::string decode_path(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size()) {
      int h = hex_value(static_cast<unsigned char>(s[i + 1])), l = hex_value(static_cast<unsigned char>(s[i + 2]));
      if (h >= 0 && l >= 0) {
        out.push_back(static_cast<char>(h * 16 + l));
        i += 2;
        continue;
      }
    }
    out.push_back(s[i]);
  }
  return out;
}

// ------------------------------------------------------------------------------------------- Inflater

// zlib inflate of a gzip or deflate body, stopping as soon as the output passes the limit.
struct RequestParser::Inflater {
  z_stream zs{};
  bool gzip;
  bool init = false, ended = false;
  std::string head;  // deflate: the first bytes, until two tell zlib's header from a raw stream

  explicit Inflater(bool is_gzip) : gzip(is_gzip) {}
  ~Inflater() {
    if (init) inflateEnd(&zs);
  }
  // Returns "" on success, else what is wrong; sets `over` when the output passed `limit`.
  std::string feed(std::string_view in, std::string& out, size_t limit, bool& over) {
    if (!init) {
      // deflate: the zlib format (RFC 1950), or a raw deflate stream as some clients send. The header is two bytes,
      // which may arrive apart (a chunk of one byte was read as a raw stream's start and refused).
      int bits = 15 + 32;  // gzip or zlib, detected from the header
      if (!gzip) {
        head.append(in);
        if (head.size() < 2) return "";
        in = head;
      }
      if (!gzip && !in.empty()) {
        const unsigned char cmf = static_cast<unsigned char>(in[0]);
        const unsigned char flg = in.size() > 1 ? static_cast<unsigned char>(in[1]) : 0;
        const bool zlib_header = (cmf & 0x0f) == 8 && (cmf >> 4) <= 7 && in.size() > 1 && (cmf * 256 + flg) % 31 == 0;
        bits = zlib_header ? 15 : -15;
      }
      if (in.empty()) return "";
      if (inflateInit2(&zs, bits) != Z_OK) return "cannot start decompression";
      init = true;
    }
    if (ended) return in.empty() ? "" : "data after the end of the compressed body";
    zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
    zs.avail_in = static_cast<uInt>(in.size());
    char buf[16384];
    while (zs.avail_in > 0 || zs.avail_out == 0) {
      zs.next_out = reinterpret_cast<Bytef*>(buf);
      zs.avail_out = sizeof buf;
      int rc = inflate(&zs, Z_NO_FLUSH);
      const size_t got = sizeof buf - zs.avail_out;
      if (out.size() + got > limit) {
        over = true;
        return "";
      }
      out.append(buf, got);
      if (rc == Z_STREAM_END) {
        ended = true;
        return zs.avail_in ? "data after the end of the compressed body" : "";
      }
      if (rc == Z_BUF_ERROR && got == 0) break;  // needs more input
      if (rc != Z_OK) return std::string("corrupt compressed body (") + (zs.msg ? zs.msg : "zlib error") + ")";
    }
    return "";
  }
};

// ------------------------------------------------------------------------------------------- RequestParser

RequestParser::RequestParser(HttpLimits limits) : limits_(limits) {}
RequestParser::~RequestParser() = default;

bool RequestParser::fail(int status, std::string message, std::string code) {
  state_ = State::Error;
  error_status_ = status;
  error_message_ = std::move(message);
  error_code_ = std::move(code);
  keep_alive_ = false;
  return false;
}

// Takes the next line from data[pos..] (joined with a partial line kept from earlier feeds).
bool RequestParser::take_line(std::string_view data, size_t& pos, size_t max, std::string_view& line,
                              bool& complete) {
  const size_t nl = data.find('\n', pos);
  const size_t end = nl == std::string_view::npos ? data.size() : nl;
  if (line_.size() + (end - pos) > max + 1) {  // + 1: the '\r'
    complete = false;
    return false;
  }
  if (nl == std::string_view::npos) {
    line_.append(data.substr(pos));
    pos = data.size();
    complete = false;
    return true;
  }
  if (line_.empty()) {
    line = data.substr(pos, nl - pos);
  } else {
    line_.append(data.substr(pos, nl - pos));
    line = line_;
  }
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  pos = nl + 1;
  complete = true;
  return true;
}

// A line over max_line may also pass max_header_bytes: the limit passed at the earlier byte of the stream
// answers, so the status never depends on how the bytes arrived (found by the `http` fuzz target: fed whole,
// such a request got 414, fed in pieces 431). The line passes its limit at its (max_line + 2)-th byte; the
// headers theirs at byte max_header_bytes + 1 (header_bytes_ already counts this line's bytes kept in line_).
bool RequestParser::header_total_passed_first() const {
  const uint64_t line_limit_at = uint64_t(header_bytes_ - line_.size()) + limits_.max_line + 2;
  return uint64_t(limits_.max_header_bytes) + 1 < line_limit_at;
}

size_t RequestParser::feed(std::string_view data) { return feed_impl(data, false); }
size_t RequestParser::feed_headers(std::string_view data) { return feed_impl(data, true); }

size_t RequestParser::feed_impl(std::string_view data, bool stop_after_headers) {
  size_t pos = 0;
  if (!data.empty()) started_ = true;
  while (pos < data.size() && state_ == State::Headers) {
    const size_t before = pos;
    std::string_view line;
    bool complete = false;
    const size_t max = limits_.max_line;
    if (!take_line(data, pos, max, line, complete)) {
      if (header_total_passed_first())
        fail(431, "The request headers are larger than " + std::to_string(limits_.max_header_bytes) + " bytes.",
             "headers_too_large");
      else if (!request_line_done_) fail(414, "The request line is longer than " + std::to_string(max) + " bytes.", "uri_too_long");
      else fail(431, "A header line is longer than " + std::to_string(max) + " bytes.", "headers_too_large");
      return pos;
    }
    header_bytes_ += pos - before;
    if (header_bytes_ > limits_.max_header_bytes) {
      fail(431, "The request headers are larger than " + std::to_string(limits_.max_header_bytes) + " bytes.",
           "headers_too_large");
      return pos;
    }
    if (!complete) break;
    bool ok = !request_line_done_ ? on_request_line(line) : (line.empty() ? on_headers_end() : on_header_line(line));
    line_.clear();
    if (!ok) return pos;
  }
  if (stop_after_headers) return pos;  // the body, if any, is read by feed()
  if (state_ == State::Body && pos < data.size()) pos += feed_body(data.substr(pos));
  return pos;
}

bool RequestParser::on_request_line(std::string_view line) {
  if (line.empty()) {  // empty lines before a request are ignored (RFC 9112 2.2), a few of them
    if (++leading_empty_lines_ > 4) return fail(400, "Malformed request: empty lines instead of a request line.", "bad_request");
    return true;
  }
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp1 == std::string_view::npos || sp2 == std::string_view::npos || line.find(' ', sp2 + 1) != std::string_view::npos)
    return fail(400, "Malformed request line.", "bad_request");
  std::string_view method = line.substr(0, sp1), target = line.substr(sp1 + 1, sp2 - sp1 - 1),
                   version = line.substr(sp2 + 1);
  if (method.empty() || method.size() > 32 || !std::all_of(method.begin(), method.end(), [](char c) { return is_tchar(c); }))
    return fail(400, "Malformed request method.", "bad_request");
  if (target.empty() || (target[0] != '/' && target != "*"))
    return fail(400, "The request target must be a path starting with '/'.", "bad_request");
  for (unsigned char c : target)
    if (c <= 0x20 || c == 0x7f) return fail(400, "The request target contains control characters.", "bad_request");
  if (version != "HTTP/1.1" && version != "HTTP/1.0") {
    if (version.substr(0, 5) == "HTTP/") return fail(505, "Only HTTP/1.0 and HTTP/1.1 are supported.", "http_version_not_supported");
    return fail(400, "Malformed request line.", "bad_request");
  }
  req_.method = std::string(method);
  req_.target = std::string(target);
  req_.version = std::string(version);
  const size_t q = target.find('?');
  req_.path = decode_path(target.substr(0, q));
  if (q != std::string_view::npos) parse_query(target.substr(q + 1), req_.params);
  keep_alive_ = version == "HTTP/1.1";
  request_line_done_ = true;
  return true;
}

bool RequestParser::on_header_line(std::string_view line) {
  if (line[0] == ' ' || line[0] == '\t')
    return fail(400, "Folded header lines (obs-fold) are not accepted.", "bad_request");
  if (++header_count_ > limits_.max_headers)
    return fail(431, "More than " + std::to_string(limits_.max_headers) + " header fields.", "headers_too_large");
  const size_t colon = line.find(':');
  if (colon == std::string_view::npos || colon == 0) return fail(400, "Malformed header line.", "bad_request");
  std::string_view name = line.substr(0, colon);
  if (!std::all_of(name.begin(), name.end(), [](char c) { return is_tchar(c); }))
    return fail(400, "Malformed header name.", "bad_request");
  std::string_view value = trim(line.substr(colon + 1));
  for (unsigned char c : value)
    if ((c < 0x20 && c != '\t') || c == 0x7f) return fail(400, "A header value contains control characters.", "bad_request");
  if (framing_ == Framing::Chunked && chunk_ == ChunkState::Trailer) return true;  // trailers are dropped
  req_.headers.emplace(std::string(name), std::string(value));
  return true;
}

bool RequestParser::on_headers_end() {
  // Connection
  for (auto [it, end] = req_.headers.equal_range("Connection"); it != end; ++it) {
    if (lists_token(it->second, "close")) keep_alive_ = false;
    if (lists_token(it->second, "keep-alive") && req_.version == "HTTP/1.0") keep_alive_ = true;
  }
  // Expect
  if (req_.has_header("Expect")) {
    if (lower(trim(req_.get_header_value("Expect"))) != "100-continue")
      return fail(417, "Only 'Expect: 100-continue' is supported.", "expectation_failed");
    expect_continue_ = true;
  }
  // Content-Encoding
  if (req_.has_header("Content-Encoding")) {
    if (req_.get_header_value_count("Content-Encoding") > 1)
      return fail(415, "Only one Content-Encoding (gzip or deflate) is supported.", "unsupported_encoding");
    std::string ce = lower(trim(req_.get_header_value("Content-Encoding")));
    if (ce == "gzip" || ce == "x-gzip") inflater_ = std::make_unique<Inflater>(true);
    else if (ce == "deflate") inflater_ = std::make_unique<Inflater>(false);
    else if (!ce.empty() && ce != "identity")
      return fail(415, "Unsupported Content-Encoding '" + ce + "' (gzip, deflate or identity).", "unsupported_encoding");
  }
  // Framing: Transfer-Encoding chunked, else Content-Length, else no body (411 where one is expected).
  const bool has_te = req_.has_header("Transfer-Encoding"), has_cl = req_.has_header("Content-Length");
  if (has_te && has_cl)
    return fail(400, "Both Transfer-Encoding and Content-Length were sent.", "bad_request");
  if (has_te) {
    if (req_.get_header_value_count("Transfer-Encoding") > 1 ||
        lower(trim(req_.get_header_value("Transfer-Encoding"))) != "chunked")
      return fail(501, "Only 'Transfer-Encoding: chunked' is supported.", "not_implemented");
    if (req_.version == "HTTP/1.0") return fail(400, "Transfer-Encoding in an HTTP/1.0 request.", "bad_request");
    framing_ = Framing::Chunked;
    chunk_ = ChunkState::Size;
  } else if (has_cl) {
    std::string cl;
    bool first = true;  // (an empty value followed by another was read as the other)
    for (auto [it, end] = req_.headers.equal_range("Content-Length"); it != end; ++it) {
      std::string v(trim(it->second));
      if (!first && v != cl) return fail(400, "Conflicting Content-Length values.", "bad_request");
      cl = v;
      first = false;
    }
    if (cl.empty() || !std::all_of(cl.begin(), cl.end(), [](char c) { return c >= '0' && c <= '9'; }))
      return fail(400, "Malformed Content-Length.", "bad_request");
    size_t z = cl.find_first_not_of('0');
    std::string digits = z == std::string::npos ? "0" : cl.substr(z);
    if (digits.size() > 18 || std::stoull(digits) > limits_.max_body_bytes)
      return fail(413, "Request body too large: the limit is " + std::to_string(limits_.max_body_bytes) + " bytes.",
                  "payload_too_large");
    remaining_ = declared_ = std::stoull(digits);
    framing_ = Framing::Length;
  } else {
    framing_ = Framing::None;
    if (req_.method == "POST" || req_.method == "PUT" || req_.method == "PATCH")
      return fail(411, "A request body needs a Content-Length or 'Transfer-Encoding: chunked'.", "length_required");
  }
  if (framing_ == Framing::None || (framing_ == Framing::Length && remaining_ == 0)) {
    if (!body_end()) return false;
    state_ = State::Done;
    return true;
  }
  // The room for a body of known length is taken with its first byte, not now: the caller may refuse the body first.
  reserve_ = size_t(
      std::min<uint64_t>(framing_ == Framing::Length && !inflater_ ? remaining_ : 0, limits_.max_body_bytes));
  state_ = State::Body;
  return true;
}

bool RequestParser::body_bytes(std::string_view data) {
  raw_body_ += data.size();
  if (raw_body_ > limits_.max_body_bytes)
    return fail(413, "Request body too large: the limit is " + std::to_string(limits_.max_body_bytes) + " bytes.",
                "payload_too_large");
  if (!inflater_) {
    if (reserve_) {
      req_.body.reserve(reserve_);
      reserve_ = 0;
    }
    req_.body.append(data);
    return true;
  }
  bool over = false;
  std::string err = inflater_->feed(data, req_.body, limits_.max_body_bytes, over);
  if (over)
    return fail(413, "Request body too large after decompression: the limit is " +
                         std::to_string(limits_.max_body_bytes) + " bytes.", "payload_too_large");
  if (!err.empty()) return fail(400, "Cannot decompress the request body: " + err + ".", "bad_encoding");
  return true;
}

bool RequestParser::body_end() {
  if (inflater_ && raw_body_ > 0 && !inflater_->ended)
    return fail(400, "Cannot decompress the request body: it is truncated.", "bad_encoding");
  return true;
}

size_t RequestParser::feed_body(std::string_view data) {
  if (framing_ == Framing::Chunked) return feed_chunked(data);
  const size_t n = static_cast<size_t>(std::min<uint64_t>(remaining_, data.size()));
  if (!body_bytes(data.substr(0, n))) return n;
  remaining_ -= n;
  if (remaining_ == 0 && body_end()) state_ = State::Done;
  return n;
}

size_t RequestParser::feed_chunked(std::string_view data) {
  size_t pos = 0;
  while (pos < data.size() && state_ == State::Body) {
    if (chunk_ == ChunkState::Data) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(remaining_, data.size() - pos));
      if (!body_bytes(data.substr(pos, n))) return pos + n;
      pos += n;
      remaining_ -= n;
      if (remaining_ == 0) chunk_ = ChunkState::DataEnd;
      continue;
    }
    const size_t before = pos;
    std::string_view line;
    bool complete = false;
    if (!take_line(data, pos, limits_.max_line, line, complete)) {
      if (chunk_ == ChunkState::Trailer && header_total_passed_first()) {
        fail(431, "The request trailers are too large.", "headers_too_large");
        return pos;
      }
      fail(400, "A chunk-size or trailer line is longer than " + std::to_string(limits_.max_line) + " bytes.", "bad_request");
      return pos;
    }
    if (chunk_ == ChunkState::Trailer) {
      header_bytes_ += pos - before;
      if (header_bytes_ > limits_.max_header_bytes) {
        fail(431, "The request trailers are too large.", "headers_too_large");
        return pos;
      }
    }
    if (!complete) break;
    std::string l(line);
    line_.clear();
    if (chunk_ == ChunkState::DataEnd) {
      if (!l.empty()) {
        fail(400, "Malformed chunked body: no CRLF after a chunk's data.", "bad_request");
        return pos;
      }
      chunk_ = ChunkState::Size;
    } else if (chunk_ == ChunkState::Size) {
      std::string_view hex = trim(std::string_view(l).substr(0, l.find(';')));
      // Chunk extensions are ignored, but control bytes in them (NUL, a bare CR) are refused as in header values: a
      // proxy in front may frame such a line otherwise.
      const bool ctl = std::any_of(l.begin(), l.end(), [](char c) {
        const auto u = static_cast<unsigned char>(c);
        return (u < 0x20 && u != '\t') || u == 0x7f;
      });
      if (ctl || hex.empty() || !std::all_of(hex.begin(), hex.end(), [](char c) { return hex_value(c) >= 0; })) {
        fail(400, "Malformed chunked body: bad chunk size.", "bad_request");
        return pos;
      }
      while (hex.size() > 1 && hex.front() == '0') hex.remove_prefix(1);
      const uint64_t size = hex.size() > 15 ? UINT64_MAX : std::stoull(std::string(hex), nullptr, 16);
      if (size > limits_.max_body_bytes || raw_body_ + size > limits_.max_body_bytes) {
        fail(413, "Request body too large: the limit is " + std::to_string(limits_.max_body_bytes) + " bytes.",
             "payload_too_large");
        return pos;
      }
      if (size == 0) {
        chunk_ = ChunkState::Trailer;
      } else {
        remaining_ = size;
        chunk_ = ChunkState::Data;
      }
    } else {  // Trailer
      if (l.empty()) {
        if (body_end()) state_ = State::Done;
        return pos;
      }
      if (!on_header_line(l)) return pos;
    }
  }
  return pos;
}

}  // namespace lilac::server
