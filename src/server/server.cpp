#include "server/server.h"

#include <httplib.h>

#include <chrono>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "engine/backend.h"
#include "server/http_response.h"
#include "server/http_server.h"
#include "server/message_batches.h"
#include "server/metrics.h"
#include "server/anthropic_api.h"
#include "server/openai_api.h"
#include "server/conversations_api.h"
#include "server/responses_api.h"
#include "server/tokenizer_api.h"
#include "server/web_ui.h"
#include "server/openai_schema.h"
#include "server/server_context.h"
#include "text/model_format.h"
#include "text/tokenizer.h"

namespace lilac::server {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// ------------------------------------------------------------------------------------------- ServerContext

uint64_t ServerContext::random_u64() {
  std::lock_guard lk(rng_mu_);
  return rng_();
}

std::string ServerContext::new_id(const char* prefix) {
  static const char* al = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  std::string s = prefix;
  uint64_t a = random_u64(), b = random_u64();
  for (int i = 0; i < 24; ++i) {
    uint64_t& x = i < 12 ? a : b;
    s += al[x % 62];
    x /= 62;
  }
  return s;
}

void send_error(httplib::Response& res, int status, const std::string& message, const std::string& param,
                const std::string& code, const std::string& type) {
  res.status = status;
  res.set_content(dump_json(error_body(status, message, type, param, code)), "application/json");
}

void send_error(httplib::Response& res, const ApiError& e) {
  send_error(res, e.status, e.message, e.param, e.code, e.type);
  if (e.retry_after_s > 0) res.set_header("Retry-After", std::to_string(e.retry_after_s));
}

std::string openai_error_text(int status, const std::string& message, const std::string& code) {
  return dump_json(error_body(status, message, "", "", code));
}

// ------------------------------------------------------------------------------------------- Server

namespace {

HttpServerOptions http_options(const ServerOptions& o) {
  HttpServerOptions h;
  h.host = o.host;
  h.port = o.port;
  h.workers = o.http_threads > 0 ? o.http_threads : o.max_queue + 32;
  h.max_pending = o.max_pending;
  // The bodies of the requests waiting for a worker are bounded as those waiting for room to be parsed: by
  // --parse-mb (server/parse_budget.h).
  h.max_pending_body_bytes = o.parse_bytes;
  h.max_connections = o.max_connections;
  h.limits.max_body_bytes = o.max_body_bytes;
  h.header_timeout_ms = o.header_timeout_ms;
  h.body_timeout_ms = o.body_timeout_ms;
  h.idle_timeout_ms = o.idle_timeout_ms;
  h.write_timeout_ms = o.write_timeout_ms;
  h.max_buffered_body_bytes =
      o.receive_bytes > 0 ? o.receive_bytes : std::max<size_t>(size_t(256) << 20, 4 * o.max_body_bytes);
  // One client may take a quarter of the connections and half of the bodies being received by default: enough for
  // any one well-behaved client (a load test's few hundred streams, a large body beside another), while one that
  // opens connections or declares bodies without end leaves the rest to the others.
  h.max_client_connections =
      o.max_client_connections >= 0 ? o.max_client_connections : std::max(1, o.max_connections / 4);
  h.max_client_body_bytes =
      o.client_receive_bytes >= 0 ? size_t(o.client_receive_bytes) : h.max_buffered_body_bytes / 2;
  return h;
}

}  // namespace

struct Server::Impl {
  explicit Impl(ServerOptions o) : ctx(std::move(o)), http(http_options(ctx.opts)) {}
  ServerContext ctx;
  HttpServer http;
};

namespace {

bool constant_time_equal(const std::string& a, const std::string& b) {
  unsigned char d = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) d |= (unsigned char)(a[i] ^ b[i % (b.empty() ? 1 : b.size())]);
  return d == 0 && !b.empty();
}

// The key of "Authorization: Bearer <key>": the scheme in any case, spaces around the key ignored.
std::string bearer_key(const std::string& auth) {
  size_t i = 0;
  while (i < auth.size() && auth[i] == ' ') ++i;
  if (auth.size() < i + 6) return "";
  std::string scheme = auth.substr(i, 6);
  for (auto& c : scheme) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (scheme != "bearer" || (auth.size() > i + 6 && auth[i + 6] != ' ')) return "";
  size_t b = auth.find_first_not_of(' ', i + 6), e = auth.find_last_not_of(' ');
  return b == std::string::npos ? "" : auth.substr(b, e - b + 1);
}

// The API key of /v1/* (checked when the headers are in, before any body is read), error bodies of the
// HTTP layer, counters for the answers it makes itself, CORS.
void add_http_basics(HttpServer& http, ServerContext& C) {
  http.set_header_check([&C](const httplib::Request& req) -> std::optional<HttpError> {
    if (C.opts.api_key.empty() || req.path.rfind("/v1/", 0) != 0) return std::nullopt;
    // "Authorization: Bearer <key>", or Anthropic's "x-api-key: <key>".
    const std::string auth = req.get_header_value("Authorization");
    const std::string xkey = req.get_header_value("x-api-key");
    if (constant_time_equal(bearer_key(auth), C.opts.api_key) || constant_time_equal(xkey, C.opts.api_key))
      return std::nullopt;
    return HttpError{401,
                     auth.empty() && xkey.empty()
                         ? "You didn't provide an API key. Provide it as 'Authorization: Bearer <key>' or 'x-api-key: <key>'."
                         : "Incorrect API key provided.",
                     "invalid_api_key"};
  });
  http.set_default_errors(openai_error_text);
  // By route pattern (never the raw path: the label set stays bounded whatever clients send).
  http.set_observer([&C](const std::string& route, int status) {
    C.metrics.count_request(route.empty() ? "other" : route, status);
  });
  http.set_default_headers({{"Access-Control-Allow-Origin", "*"}});
  http.set_preflight_headers({{"Access-Control-Allow-Methods", "GET, POST, OPTIONS"},
                              {"Access-Control-Allow-Headers",
                               "Authorization, Content-Type, x-api-key, anthropic-version, anthropic-beta, x-lilac-route"},
                              {"Access-Control-Max-Age", "600"}});
}

std::string http_metrics(const HttpStats& s, const ParseBudget::Stats& p) {
  std::string out;
  auto gauge = [&](const char* name, const char* help, const char* type, int64_t v) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n" + name + " " +
           std::to_string(v) + "\n";
  };
  gauge("lilac_http_connections", "Open HTTP connections.", "gauge", s.connections);
  gauge("lilac_http_workers_busy", "HTTP workers answering a request.", "gauge", s.busy_workers);
  gauge("lilac_http_pending", "Complete requests waiting for a worker.", "gauge", s.pending);
  gauge("lilac_http_pending_bytes", "Bytes of the bodies of the requests waiting for a worker (bounded by --parse-mb).",
        "gauge", s.pending_bytes);
  gauge("lilac_http_receiving_bytes",
        "Bytes of the request bodies being received, declared lengths reserved (bounded by --receive-mb).", "gauge",
        s.receiving_bytes);
  gauge("lilac_http_timeouts_total", "Requests whose headers or body did not arrive in time (408).", "counter",
        s.timeouts);
  gauge("lilac_http_rejected_busy_total", "Requests or connections refused with 503 because the server was full.",
        "counter", s.rejected_busy);
  gauge("lilac_http_evicted_total", "Idle connections closed to make room for new ones.", "counter", s.evicted);
  gauge("lilac_http_clients", "Clients (peer addresses) with an HTTP connection open.", "gauge", s.clients);
  gauge("lilac_http_rejected_client_total",
        "Requests or connections refused (503 / 529) because their client held its share (--max-client-connections, "
        "--client-receive-mb); counted in lilac_http_rejected_busy_total too.",
        "counter", s.rejected_client);
  gauge("lilac_parse_bytes", "Bytes of the request bodies being parsed and prepared (--parse-mb).", "gauge", p.held);
  gauge("lilac_parse_waiting", "Requests waiting for room to parse their body.", "gauge", p.waiting);
  gauge("lilac_parse_waiting_bytes", "Bytes of the request bodies waiting for room (bounded by --parse-mb).", "gauge",
        p.waiting_bytes);
  gauge("lilac_parse_refused_total",
        "Requests refused because too many bodies were being parsed or waiting to be (503 / 529).", "counter",
        p.refused);
  return out;
}

}  // namespace

Server::Server(ServerOptions opts) {
  if (opts.http_threads > 0 && opts.http_threads <= opts.max_queue)
    throw InputError("--http-threads (" + std::to_string(opts.http_threads) + ") must be larger than --max-queue (" +
                     std::to_string(opts.max_queue) +
                     "): each queued or running generation holds a worker, and requests beyond the queue must "
                     "still find one to be answered 429");
  impl_ = std::make_unique<Impl>(std::move(opts));
  HttpServer& http = impl_->http;
  ServerContext& C = impl_->ctx;
  add_http_basics(http, C);

  RouteOptions fast;
  fast.run_inline = true;  // answered by the I/O thread: at once even when every worker is busy
  http.Get("/health", [&C](const httplib::Request&, httplib::Response& res) {
    if (C.shutting_down.load()) {
      res.status = 503;
      res.set_content(dump_json(json{{"status", "shutting_down"}}), "application/json");
    } else if (C.ready.load()) {
      res.set_content(dump_json(json{{"status", "ok"}, {"model", C.opts.model_id}}), "application/json");
    } else {
      res.status = 503;
      res.set_content(dump_json(json{{"status", "loading"}}), "application/json");
    }
  }, fast);

  HttpServer* hp = &http;
  http.Get("/metrics", [&C, hp](const httplib::Request&, httplib::Response& res) {
    C.metrics.count_request("/metrics", 200);
    res.set_content(C.metrics.render() + http_metrics(hp->stats(), C.parse.stats()), "text/plain; version=0.0.4");
  }, fast);

  add_openai_routes(http, C);
  add_anthropic_routes(http, C);
  add_responses_routes(http, C);
  add_conversations_routes(http, C);
  add_message_batch_routes(http, C);
  add_tokenizer_routes(http, C);
  add_web_routes(http);
}

Server::~Server() { stop(); }

bool Server::ready() const { return impl_->ctx.ready.load(); }
const ServerOptions& Server::options() const { return impl_->ctx.opts; }

void Server::set_route_hook(RouteHook hook) {
  ServerContext& C = impl_->ctx;
  C.hook = std::move(hook);
  C.hook_set = bool(C.hook.maybe_forward) || bool(C.hook.on_local) || bool(C.hook.extra_models);
}

void Server::set_model(std::shared_ptr<Backend> backend, std::shared_ptr<const Tokenizer> tokenizer,
                       std::shared_ptr<const ChatTemplate> chat_template) {
  ServerContext& C = impl_->ctx;
  SchedulerOptions so;
  so.max_queue = C.opts.max_queue;
  so.max_seq = C.opts.max_seq;
  so.cache_bytes = C.opts.cache_bytes;
  so.max_batch = C.opts.max_batch;
  so.seq_memory_bytes = C.opts.seq_memory_bytes;
  so.prefill_chunk = C.opts.prefill_chunk;
  so.burst_prefill = C.opts.burst_prefill;
  so.spec_tokens = C.opts.spec_tokens;
  so.spec_policy = C.opts.spec_policy;
  so.spec_max_batch = C.opts.spec_max_batch;
  C.tok = tokenizer;
  C.core = std::make_unique<GenerationCore>(std::move(backend), std::move(tokenizer), std::move(chat_template),
                                            qwen3_6_format(), so, &C.metrics);
  C.ready.store(true);
}

int Server::bind() {
  port_ = impl_->http.bind();
  return port_;
}

void Server::start() { impl_->http.start(); }

void Server::run() { impl_->http.run(); }

void Server::shutdown(int grace_ms, const std::function<bool()>& hurry) {
  if (!impl_) return;
  ServerContext& C = impl_->ctx;
  HttpServer& http = impl_->http;
  C.shutting_down = true;
  http.begin_drain();
  if (C.core) C.core->begin_shutdown();
  // Requests in progress (generations, upstream forwards) get the grace period to finish.
  auto quiet = [&] {
    return (!C.core || C.core->active() == 0) && http.stats().busy_workers == 0 && C.background.active() == 0;
  };
  const auto t0 = Clock::now();
  while (!quiet() && Clock::now() - t0 < std::chrono::milliseconds(grace_ms) && !(hurry && hurry()))
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  if (!quiet()) {
    LILAC_LOG_WARN("shutdown: requests still running after the grace period: they end with an error");
    if (C.core)
      C.core->abort_all(503, "The server is shutting down: the generation was stopped before it finished.");
    if (C.hook.on_shutdown) C.hook.on_shutdown();
    const auto t1 = Clock::now();  // their error answers get a moment to be written
    while (!quiet() && Clock::now() - t1 < std::chrono::seconds(2)) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  stop();
}

void Server::stop() {
  if (!impl_) return;
  ServerContext& C = impl_->ctx;
  C.shutting_down = true;
  // Cancel generations first so that their answers end, then close the connections and join.
  if (C.core) C.core->abort_all(503, "The server is shutting down: the generation was stopped before it finished.");
  if (C.hook.on_shutdown) C.hook.on_shutdown();
  impl_->http.stop();
  C.background.stop();  // the background responses' threads (their generations were just ended)
  for (const auto& f : C.on_stop) f();
  if (C.core) C.core->stop();
}

HttpServer& Server::http() { return impl_->http; }
Metrics& Server::metrics() { return impl_->ctx.metrics; }

}  // namespace lilac::server
