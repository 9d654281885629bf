// The hybrid router's HTTP client for an OpenAI-compatible upstream (`lilac serve --upstream URL`).
//
// forward() sends a prepared chat/completions or completions body and writes the upstream's answer into
// the server's response: non-streaming bodies get `"lilac_route": "<label>"`; streams are passed through
// line by line as they arrive, each `data: {...}` chunk getting the same field (a string insert, no JSON
// parse); 4xx answers are passed through (non-JSON bodies wrapped in an OpenAI error body). When the
// upstream cannot be reached, times out before answering, answers 5xx, or answers what the client must not
// see as it is (a 3xx redirect, a 401 / 403 / 407 refusing lilac's own cloud credentials, a 1xx), nothing is
// written and the caller decides (fallback to local or a 502). No upstream header is passed on. An answer's head
// (status line and headers) and a chunked body's framing lines are read within the bounds of
// router/upstream_http.h; an answer past them is a failure too. The API key goes only into the Authorization
// header; nothing here logs it.
#pragma once
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace httplib {
class ClientImpl;
struct Response;
}

namespace lilac::router {

struct UpstreamUrl {
  std::string scheme;  // "http" or "https"
  std::string host;
  int port = 0;
  std::string base;    // path prefix of the OpenAI API, e.g. "/v1" (an empty path in the URL means "/v1")
  std::string origin() const;  // scheme://host:port
};
// Parses http://host[:port][/base] or https://...; throws lilac::InputError on anything else.
UpstreamUrl parse_upstream_url(const std::string& url);
// Whether this build of cpp-httplib can talk https.
bool upstream_https_supported();

struct UpstreamOptions {
  UpstreamUrl url;
  std::string api_key;           // sent as "Authorization: Bearer <key>" when non-empty
  int connect_timeout_ms = 3000;
  int read_timeout_ms = 300000;  // also bounds the wait for the first byte of an answer
  std::string ca_cert_file;      // https: PEM certificates to verify the upstream with ("": the system's)
  std::string route_label = "cloud";  // the x-lilac-route header value
  bool inject_route_field = true;     // add "lilac_route": route_label to bodies and chunks
};

struct ForwardResult {
  bool answered = false;  // true: `res` holds the answer (2xx or 4xx, or a stream being passed through)
  int upstream_status = 0;  // HTTP status from the upstream, 0 when there was none
  std::string failure;      // when !answered: what went wrong (no secrets in it)
};

class UpstreamClient {
 public:
  explicit UpstreamClient(UpstreamOptions opts);
  ~UpstreamClient();

  // POST base + path (e.g. "/chat/completions") with `body`. `auth_override`, when non-empty, replaces the
  // configured key's Authorization header (used when the router re-enters the local server).
  // `extra_headers` are sent as well (e.g. Anthropic's x-api-key and anthropic-version). `on_lines` (a stream) sees
  // each run of complete lines as the upstream sent them, before they are passed on.
  ForwardResult forward(const std::string& path, const std::string& body, bool stream, httplib::Response& res,
                        const std::string& auth_override = "",
                        const std::vector<std::pair<std::string, std::string>>& extra_headers = {},
                        std::function<void(const std::string&)> on_lines = nullptr);
  // `method` (GET, POST without a body, DELETE) base + path, its whole answer into `res` as forward() does.
  ForwardResult request(const std::string& method, const std::string& path, httplib::Response& res);

  // GET base + "/models": the ids, or nullopt when the upstream does not answer in time / answers badly.
  std::optional<std::vector<std::string>> list_models(int timeout_ms);

  // Cuts every request in flight (the server stops); later requests fail at once.
  void cancel_all();

  const UpstreamOptions& options() const { return opts_; }

 private:
  friend struct ActiveClient;
  UpstreamOptions opts_;
  std::mutex active_mu_;
  std::set<httplib::ClientImpl*> active_;
  bool cancelled_ = false;
};

// The payload of an SSE data line: what follows "data:" and one optional space (SSE allows `data: {` and `data:{`), or
// nullopt when `line` is not a data line (a bare "data", SSE's empty data field, has no payload for these readers).
// A line end that `line` holds stays in the payload. Every reader of an upstream's stream lines goes through it
// (inject_route_into_sse_lines, the router's response.created id).
std::optional<std::string_view> sse_data_payload(std::string_view line);

// Adds `"lilac_route": "<label>"` to every data line of an SSE fragment made of complete lines whose payload
// (sse_data_payload) opens a JSON object, `{` (exposed for tests).
std::string inject_route_into_sse_lines(const std::string& lines, const std::string& label);

}  // namespace lilac::router
