// Upstream client: forwards OpenAI requests to a cloud endpoint, passing streams through as they arrive.
#include "router/upstream.h"

#include <httplib.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "router/upstream_http.h"
#include "server/anthropic_schema.h"
#include "server/api_error.h"
#include "server/openai_schema.h"
#include "text/bounded_json.h"
#include "text/json_dump.h"

namespace lilac::router {

using json = nlohmann::ordered_json;

// Registers a client of a request in flight, so that cancel_all() can cut it.
struct ActiveClient {
  UpstreamClient& up;
  httplib::ClientImpl* cli;
  bool ok;
  ActiveClient(UpstreamClient& u, httplib::ClientImpl* c) : up(u), cli(c) {
    std::lock_guard lk(up.active_mu_);
    ok = !up.cancelled_;
    if (ok) up.active_.insert(cli);
  }
  ~ActiveClient() {
    std::lock_guard lk(up.active_mu_);
    up.active_.erase(cli);
  }
};

namespace {
// An upstream's answer as JSON (bounded like a request: it is parsed, dumped and passed on).
json parse_answer(const std::string& text) {
  JsonParseResult r = parse_bounded_json(text, kRequestJsonLimits);
  return r.ok() ? std::move(r.value) : json(json::value_t::discarded);
}
}  // namespace

std::string UpstreamUrl::origin() const {
  // An IPv6 literal in brackets, as URLs spell it (without them the client could not parse "http://::1:9000" and
  // every forward to an IPv6 upstream failed).
  const std::string h = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  return scheme + "://" + h + ":" + std::to_string(port);
}

bool upstream_https_supported() {
#ifdef CPPHTTPLIB_OPENSSL_SUPPORT
  return true;
#else
  return false;
#endif
}

UpstreamUrl parse_upstream_url(const std::string& url) {
  UpstreamUrl u;
  auto bad = [&](const std::string& why) {
    return InputError("--upstream '" + url + "': " + why + " (expected http://host[:port][/base] or https://...)");
  };
  size_t p = url.find("://");
  if (p == std::string::npos) throw bad("no scheme");
  u.scheme = url.substr(0, p);
  if (u.scheme != "http" && u.scheme != "https") throw bad("unsupported scheme '" + u.scheme + "'");
  if (u.scheme == "https" && !upstream_https_supported()) throw bad("this build of cpp-httplib has no TLS support");
  std::string rest = url.substr(p + 3);
  size_t slash = rest.find('/');
  std::string hostport = rest.substr(0, slash);
  std::string path = slash == std::string::npos ? "" : rest.substr(slash);
  if (hostport.find('@') != std::string::npos) throw bad("credentials in the URL are not supported; use --upstream-key-env");
  if (hostport.empty()) throw bad("no host");
  u.port = u.scheme == "https" ? 443 : 80;
  if (hostport.front() == '[') {  // [::1]:port
    size_t close = hostport.find(']');
    if (close == std::string::npos) throw bad("unterminated IPv6 host");
    u.host = hostport.substr(1, close - 1);
    std::string tail = hostport.substr(close + 1);
    if (!tail.empty()) {
      if (tail[0] != ':') throw bad("junk after the host");
      hostport = tail;
      hostport.erase(0, 1);
      try {
        u.port = std::stoi(hostport);
      } catch (...) {
        throw bad("bad port");
      }
    }
  } else {
    size_t colon = hostport.rfind(':');
    u.host = hostport.substr(0, colon);
    if (colon != std::string::npos) {
      std::string ps = hostport.substr(colon + 1);
      if (ps.empty() || ps.find_first_not_of("0123456789") != std::string::npos) throw bad("bad port");
      u.port = std::stoi(ps);
    }
  }
  if (u.host.empty()) throw bad("no host");
  if (u.port <= 0 || u.port > 65535) throw bad("port out of range");
  if (path.find_first_of("?#") != std::string::npos) throw bad("no query or fragment allowed");
  while (!path.empty() && path.back() == '/') path.pop_back();
  u.base = path.empty() ? "/v1" : path;
  return u;
}

std::optional<std::string_view> sse_data_payload(std::string_view line) {
  if (!line.starts_with("data:")) return std::nullopt;
  line.remove_prefix(5);
  if (line.starts_with(' ')) line.remove_prefix(1);
  return line;
}

std::string inject_route_into_sse_lines(const std::string& lines, const std::string& label) {
  const std::string field = "\"lilac_route\":\"" + label + "\"";
  std::string out;
  out.reserve(lines.size() + 64);
  size_t i = 0;
  while (i < lines.size()) {
    size_t nl = lines.find('\n', i);
    size_t end = nl == std::string::npos ? lines.size() : nl + 1;
    std::string_view line(lines.data() + i, end - i);
    const std::optional<std::string_view> payload = sse_data_payload(line);
    if (payload && payload->starts_with('{')) {
      const size_t brace = static_cast<size_t>(payload->data() - line.data());
      out.append(line.substr(0, brace + 1));
      // Skip whitespace to see whether the object is empty.
      size_t k = brace + 1;
      while (k < line.size() && (line[k] == ' ' || line[k] == '\t')) ++k;
      out += field;
      if (k < line.size() && line[k] != '}') out += ',';
      out.append(line.substr(brace + 1));
    } else {
      out.append(line);
    }
    i = end;
  }
  return out;
}

namespace {

// A client of the upstream whose answers' heads are bounded (router/upstream_http.h).
std::unique_ptr<UpstreamHttp> make_client(const UpstreamOptions& o, int read_timeout_ms) {
  auto up = UpstreamHttp::make(o.url.scheme == "https", o.url.host, o.url.port);
  httplib::ClientImpl& cli = up->http();
  cli.set_connection_timeout(std::chrono::milliseconds(o.connect_timeout_ms));
  cli.set_read_timeout(std::chrono::milliseconds(read_timeout_ms));
  cli.set_write_timeout(std::chrono::milliseconds(std::max(o.connect_timeout_ms, 10000)));
  cli.set_keep_alive(false);
  cli.set_follow_location(false);
#ifdef CPPHTTPLIB_OPENSSL_SUPPORT
  cli.enable_server_certificate_verification(true);
  if (!o.ca_cert_file.empty()) cli.set_ca_cert_path(o.ca_cert_file.c_str());
#endif
  return up;
}

httplib::Headers request_headers(const UpstreamOptions& o, const std::string& auth_override, bool stream) {
  httplib::Headers h;
  if (!auth_override.empty()) h.emplace("Authorization", auth_override);
  else if (!o.api_key.empty()) h.emplace("Authorization", "Bearer " + o.api_key);
  h.emplace("Accept", stream ? "text/event-stream" : "application/json");
  h.emplace("Accept-Encoding", "identity");
  h.emplace("User-Agent", "lilac-hybrid-router");
  return h;
}

// A 4xx answer: the upstream's OpenAI error body when it is one, else one made from the text.
std::string client_error_body(int status, const std::string& body) {
  json j = parse_answer(body);
  if (j.is_object() && j.contains("error")) return dump_json(j);
  std::string msg = body.substr(0, 500);
  if (msg.empty()) msg = "The upstream answered HTTP " + std::to_string(status) + ".";
  else msg = "The upstream answered HTTP " + std::to_string(status) + ": " + msg;
  return dump_json(server::error_body(status, msg, "", "", "upstream_error"));  // msg: the upstream's bytes, cut
}

std::string describe_5xx(int status, const std::string& body) {
  std::string s = "HTTP " + std::to_string(status);
  json j = parse_answer(body);
  if (j.is_object() && j.contains("error") && j["error"].is_object() && j["error"].contains("message") &&
      j["error"]["message"].is_string())
    s += ": " + j["error"]["message"].get<std::string>().substr(0, 300);
  return s;
}

// Why an upstream answer with `status` is the upstream failing rather than an answer for the client; empty when it
// goes to the client as it is (2xx, and a 4xx about the request itself: 400, 404, 422, 429, ...). A 5xx fails; a
// redirect would point the client at the cloud provider (the router follows none); a 401 / 403 (or a proxy's 407)
// refuses lilac's configured cloud key, not the client's, which the client would read as its own key being wrong; a
// 1xx is not a final answer. The caller falls back to local or answers 502; neither the body nor the headers
// (Location, WWW-Authenticate) are passed on.
std::string upstream_status_failure(int status, const std::string& body) {
  if (status >= 500) return "the upstream failed (" + describe_5xx(status, body) + ")";
  const std::string n = "the cloud upstream answered HTTP " + std::to_string(status);
  if (status >= 300 && status < 400) return n + " (a redirect, not followed)";
  if (status == 401 || status == 403 || status == 407) return n + ": lilac's upstream credentials were refused";
  if (status < 200) return n + " (not a final answer)";
  return "";
}


// What the router holds of an upstream's answer: a whole answer (not streamed, or JSON to a stream request) of at most
// kMaxAnswerBytes, and of a stream at most kMaxQueuedBytes not yet sent to a slow client (the upstream then waits:
// TCP's backpressure) and SSE lines of at most kMaxLineBytes. Nothing bounded them (an upstream, or anyone between it
// and an http:// URL, could take the process's memory).
constexpr size_t kMaxAnswerBytes = size_t(64) << 20, kMaxQueuedBytes = size_t(16) << 20, kMaxLineBytes = size_t(4) << 20;
// The body of an error answer to a stream request and of the model list: what is kept of it; the read ends there.
constexpr size_t kMaxErrorBytes = size_t(1) << 20, kMaxModelsBytes = size_t(4) << 20;
const std::string kTooLarge = "the upstream's answer is larger than " + std::to_string(kMaxAnswerBytes >> 20) + " MiB";


// The event that ends a stream the upstream broke off, in the request's protocol, as the local server ends a stream
// with an error: Anthropic's named error event (an unnamed one was skipped by the SDKs: a silently cut message), the
// Responses API's error event, or chat / completions' error data and [DONE]. The blank line first ends whatever event
// the upstream left open (an error line right after a partial one made a single unparseable event).
std::string broken_stream_event(const std::string& path, const std::string& message) {
  const auto ends_with = [&](std::string_view tail) {
    return path.size() >= tail.size() && path.compare(path.size() - tail.size(), tail.size(), tail) == 0;
  };
  if (ends_with("/messages"))
    return "\nevent: error\ndata: " + dump_json(server::anthropic_error_body(server::ApiError(502, message))) + "\n\n";
  if (ends_with("/responses"))
    return "\nevent: error\ndata: " +
           dump_json(json{{"type", "error"}, {"code", "upstream_error"}, {"message", message}, {"param", nullptr}}) +
           "\n\n";
  return "\ndata: " + dump_json(server::error_body(502, message, "", "", "upstream_error")) + "\n\ndata: [DONE]\n\n";
}

// State shared by the request handler, the upstream reader thread and the chunked content provider.
struct Pipe {
  std::mutex mu;
  std::condition_variable cv;
  std::unique_ptr<UpstreamHttp> client;
  std::thread reader;
  bool got_headers = false;
  bool finished = false;
  bool canceled = false;
  int status = 0;
  std::string content_type;
  std::deque<std::string> chunks;  // the body as it arrives (2xx)
  size_t queued = 0;               // bytes in chunks
  bool over = false;               // an answer past kMaxAnswerBytes, or a line past kMaxLineBytes
  std::string error_body;          // the body of a non-2xx answer
  std::string transport_error;     // set when the request failed on the wire
  std::string limit_error;         // set when the answer broke a bound of the client's (UpstreamHttp::limit_error)
  std::string pending;             // partial SSE line not yet forwarded
  std::string path;                // the upstream path (its protocol)
  bool inject = true;
  std::string label;
  std::function<void(const std::string&)> on_lines;  // sees the complete lines passed on, as the upstream sent them
  std::unique_ptr<ActiveClient> active;  // registered with the UpstreamClient until the pipe ends

  void cancel() {
    {
      std::lock_guard lk(mu);
      canceled = true;
    }
    cv.notify_all();
    if (client) client->http().stop();
  }
  void join() {
    if (reader.joinable()) reader.join();
  }
  ~Pipe() {
    if (reader.joinable()) {
      cancel();
      reader.join();
    }
    active.reset();  // before the client it names
  }
};

// A non-streamed request: the whole answer (at most kMaxAnswerBytes) read, then passed on.
ForwardResult forward_whole(UpstreamClient& up, const std::string& full_path, const std::string& body,
                            httplib::Headers headers, httplib::Response& res, const std::string& method = "POST") {
  const UpstreamOptions& o = up.options();
  ForwardResult fr;
  auto cli = make_client(o, o.read_timeout_ms);
  ActiveClient active(up, &cli->http());
  if (!active.ok) {
    fr.failure = "the server is stopping";
    return fr;
  }
  httplib::Request q;
  q.method = method;
  q.path = full_path;
  q.headers = std::move(headers);
  q.body = body;
  if (method == "POST") q.set_header("Content-Type", "application/json");
  std::string got;
  bool over = false;
  q.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    if (got.size() + n > kMaxAnswerBytes) return !(over = true);
    got.append(data, n);
    return true;
  };
  httplib::Response r;
  httplib::Error err = httplib::Error::Success;
  const bool sent = cli->http().send(q, r, err);
  if (over) {
    fr.failure = kTooLarge;
    return fr;
  }
  if (!sent) {
    fr.failure = !cli->limit_error().empty() ? cli->limit_error()
                                             : "cannot reach the upstream (" + httplib::to_string(err) + ")";
    return fr;
  }
  r.body = std::move(got);
  fr.upstream_status = r.status;
  if (std::string why = upstream_status_failure(r.status, r.body); !why.empty()) {
    fr.failure = why;
    return fr;
  }
  fr.answered = true;
  res.set_header("x-lilac-route", o.route_label);
  if (r.status >= 200 && r.status < 300) {
    json j = parse_answer(r.body);
    if (!j.is_object()) {
      fr.answered = false;
      fr.failure = "the upstream answered HTTP " + std::to_string(r.status) + " with a body that is not a JSON object";
      return fr;
    }
    if (o.inject_route_field) j["lilac_route"] = o.route_label;
    res.status = r.status;
    res.set_content(dump_json(j), "application/json");
  } else {
    res.status = r.status;
    res.set_content(client_error_body(r.status, r.body), "application/json");
  }
  return fr;
}

// The reader thread of a streamed request: sends it and hands what comes (status, then the body's pieces) to the
// waiting thread through P, within the bounds above.
void read_upstream(Pipe* P, const std::string& full_path, const std::string& body, const httplib::Headers& headers) {
  httplib::Request req;
  req.method = "POST";
  req.path = full_path;
  req.headers = headers;
  req.body = body;
  req.set_header("Content-Type", "application/json");
  req.response_handler = [P](const httplib::Response& r) {
    std::lock_guard lk(P->mu);
    P->got_headers = true;
    P->status = r.status;
    P->content_type = r.get_header_value("Content-Type");
    P->cv.notify_all();
    return !P->canceled;
  };
  req.content_receiver = [P](const char* data, size_t n, uint64_t, uint64_t) {
    std::unique_lock lk(P->mu);
    if (P->canceled) return false;
    if (P->status >= 200 && P->status < 300) {
      if (P->content_type.find("text/event-stream") == std::string::npos) {
        if (P->queued + n > kMaxAnswerBytes) {  // a whole answer, read before anything is sent: bounded
          P->over = true;
          P->cv.notify_all();
          return false;
        }
      } else {  // a stream: wait while a slow client has not taken what came
        P->cv.wait(lk, [&] { return P->queued < kMaxQueuedBytes || P->canceled; });
        if (P->canceled) return false;
      }
      P->chunks.emplace_back(data, n);
      P->queued += n;
    } else {  // an error's body: kept up to kMaxErrorBytes, then the read ends (an endless one held this thread)
      P->error_body.append(data, std::min(n, kMaxErrorBytes - P->error_body.size()));
      if (P->error_body.size() >= kMaxErrorBytes) return false;
    }
    P->cv.notify_all();
    return true;
  };
  httplib::Response r;
  httplib::Error err = httplib::Error::Success;
  bool ok = P->client->http().send(req, r, err);
  std::lock_guard lk(P->mu);
  if (!ok && !P->canceled) {
    P->limit_error = P->client->limit_error();
    P->transport_error = P->limit_error.empty() ? httplib::to_string(err) : P->limit_error;
  }
  P->finished = true;
  P->cv.notify_all();
}

// Streaming: a reader thread performs the request; this thread waits for the status line, then either hands the
// stream to a chunked content provider (2xx), passes the error through (4xx but those of upstream_status_failure) or
// reports a failure.
ForwardResult forward_stream(UpstreamClient& up, const std::string& full_path, const std::string& body,
                             httplib::Headers headers, httplib::Response& res,
                             std::function<void(const std::string&)> on_lines) {
  const UpstreamOptions& o = up.options();
  ForwardResult fr;
  auto pipe = std::make_shared<Pipe>();
  pipe->client = make_client(o, o.read_timeout_ms);
  pipe->active = std::make_unique<ActiveClient>(up, &pipe->client->http());
  if (!pipe->active->ok) {
    fr.failure = "the server is stopping";
    return fr;
  }
  pipe->inject = o.inject_route_field;
  pipe->path = full_path;
  pipe->label = o.route_label;
  pipe->on_lines = std::move(on_lines);
  Pipe* P = pipe.get();
  pipe->reader = std::thread(read_upstream, P, full_path, body, std::move(headers));

  {
    std::unique_lock lk(P->mu);
    P->cv.wait(lk, [&] { return P->got_headers || P->finished; });
    if (!P->got_headers) {
      std::string e = P->transport_error.empty() ? "no answer" : P->transport_error;
      const std::string limit = P->limit_error;
      lk.unlock();
      P->join();
      fr.failure = !limit.empty() ? limit : "cannot reach the upstream (" + e + ")";
      return fr;
    }
    fr.upstream_status = P->status;
    if (P->status < 200 || P->status >= 300) {
      P->cv.wait(lk, [&] { return P->finished; });
      int status = P->status;
      std::string eb = P->error_body;
      lk.unlock();
      P->join();
      if (std::string why = upstream_status_failure(status, eb); !why.empty()) {
        fr.failure = why;
        return fr;
      }
      fr.answered = true;
      res.status = status;
      res.set_header("x-lilac-route", o.route_label);
      res.set_content(client_error_body(status, eb), "application/json");
      return fr;
    }
    if (P->content_type.find("text/event-stream") == std::string::npos) {
      // A JSON answer to a stream request (some servers ignore "stream"): pass it through once complete.
      P->cv.wait(lk, [&] { return P->finished; });
      std::string whole;
      for (auto& c : P->chunks) whole += c;
      std::string terr = P->transport_error;
      const bool over = P->over;
      lk.unlock();
      P->join();
      if (over) {
        fr.failure = kTooLarge;
        return fr;
      }
      json j = parse_answer(whole);
      if (!terr.empty() || !j.is_object()) {
        fr.failure = "the upstream answered a stream request with a body that is neither SSE nor JSON";
        return fr;
      }
      if (o.inject_route_field) j["lilac_route"] = o.route_label;
      fr.answered = true;
      res.status = P->status;
      res.set_header("x-lilac-route", o.route_label);
      res.set_content(dump_json(j), "application/json");
      return fr;
    }
  }

  fr.answered = true;
  res.status = 200;
  res.set_header("x-lilac-route", o.route_label);
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream",
      [pipe](size_t, httplib::DataSink& sink) -> bool {
        Pipe* P = pipe.get();
        std::string out;
        bool done = false, stop_reader = false;
        {
          std::unique_lock lk(P->mu);
          P->cv.wait_for(lk, std::chrono::milliseconds(250), [&] { return !P->chunks.empty() || P->finished; });
          while (!P->chunks.empty()) {
            P->pending += P->chunks.front();
            P->chunks.pop_front();
          }
          P->queued = 0;
          P->cv.notify_all();  // the reader may take more
          done = P->finished;
          // Forward complete lines only, so a chunk's `data: {` is never split from the insert point.
          size_t last_nl = P->pending.rfind('\n');
          if (P->pending.size() - (last_nl == std::string::npos ? 0 : last_nl + 1) > kMaxLineBytes && !P->over) {
            // No line end in 4 MiB (or CR-only line ends): not SSE that can be forwarded line by line.
            P->over = true;
            P->canceled = true;
            if (P->transport_error.empty()) P->transport_error = "an SSE line longer than 4 MiB";
            P->pending.erase(last_nl == std::string::npos ? 0 : last_nl + 1);
            done = true;
          }
          if (last_nl != std::string::npos) {
            std::string lines = P->pending.substr(0, last_nl + 1);
            P->pending.erase(0, last_nl + 1);
            if (P->on_lines) P->on_lines(lines);
            out = P->inject ? inject_route_into_sse_lines(lines, P->label) : std::move(lines);
          }
          if (done) {
            if (!P->transport_error.empty()) {  // a partial line of a broken stream is not forwarded
              P->pending.clear();
              out += broken_stream_event(P->path, "The upstream stream broke off (" + P->transport_error + ").");
            } else if (!P->pending.empty()) {
              out += P->inject ? inject_route_into_sse_lines(P->pending + "\n", P->label) : P->pending + "\n";
              P->pending.clear();
            }
          }
          stop_reader = P->over && P->canceled;
        }
        if (stop_reader) P->client->http().stop();
        if (!out.empty() && !sink.write(out.data(), out.size())) {
          P->cancel();
          return false;
        }
        if (done) sink.done();
        return true;
      },
      [pipe](bool success) {
        if (!success) pipe->cancel();
        pipe->join();
      });
  return fr;
}

}  // namespace

UpstreamClient::UpstreamClient(UpstreamOptions opts) : opts_(std::move(opts)) {}
UpstreamClient::~UpstreamClient() = default;

ForwardResult UpstreamClient::forward(const std::string& path, const std::string& body, bool stream,
                                      httplib::Response& res, const std::string& auth_override,
                                      const std::vector<std::pair<std::string, std::string>>& extra_headers,
                                      std::function<void(const std::string&)> on_lines) {
  httplib::Headers headers = request_headers(opts_, auth_override, stream);
  for (const auto& [k, v] : extra_headers) headers.emplace(k, v);
  const std::string full_path = opts_.url.base + path;
  return stream ? forward_stream(*this, full_path, body, std::move(headers), res, std::move(on_lines))
                : forward_whole(*this, full_path, body, std::move(headers), res);
}

ForwardResult UpstreamClient::request(const std::string& method, const std::string& path, httplib::Response& res) {
  return forward_whole(*this, opts_.url.base + path, "", request_headers(opts_, "", false), res, method);
}

void UpstreamClient::cancel_all() {
  std::lock_guard lk(active_mu_);
  cancelled_ = true;
  for (httplib::ClientImpl* c : active_) c->stop();
}

std::optional<std::vector<std::string>> UpstreamClient::list_models(int timeout_ms) {
  auto cli = make_client(opts_, timeout_ms);
  ActiveClient active(*this, &cli->http());
  if (!active.ok) return std::nullopt;
  cli->http().set_connection_timeout(std::chrono::milliseconds(std::min(timeout_ms, opts_.connect_timeout_ms)));
  // The body through a receiver that ends the read past kMaxModelsBytes (decompressed bytes: a gzip bomb stops too);
  // without one the library kept a body of any size.
  std::string body;
  auto r = cli->http().Get(opts_.url.base + "/models", request_headers(opts_, "", false),
                           [&](const char* data, size_t n) {
                             if (body.size() + n > kMaxModelsBytes) return false;
                             body.append(data, n);
                             return true;
                           });
  if (!r || r->status != 200) return std::nullopt;
  json j = parse_answer(body);
  if (!j.is_object() || !j.contains("data") || !j["data"].is_array()) return std::nullopt;
  std::vector<std::string> ids;
  for (const auto& m : j["data"])
    if (m.is_object() && m.contains("id") && m["id"].is_string()) ids.push_back(m["id"].get<std::string>());
  return ids;
}

}  // namespace lilac::router
