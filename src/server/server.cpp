#include "server/server.h"

#include <httplib.h>

#include <chrono>

#include "core/error.h"
#include "core/log.h"
#include "engine/backend.h"
#include "server/http_response.h"
#include "server/metrics.h"
#include "server/openai_api.h"
#include "server/openai_schema.h"
#include "server/server_context.h"
#include "text/model_format.h"
#include "text/tokenizer.h"

namespace lilac::server {

using json = nlohmann::json;

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

// ------------------------------------------------------------------------------------------- Server

struct Server::Impl {
  explicit Impl(ServerOptions o) : ctx(std::move(o)) {}
  httplib::Server http;
  ServerContext ctx;
};

namespace {

bool constant_time_equal(const std::string& a, const std::string& b) {
  unsigned char d = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) d |= (unsigned char)(a[i] ^ b[i % (b.empty() ? 1 : b.size())]);
  return d == 0 && !b.empty();
}

// Bearer-key check of /v1/*, error bodies for httplib's own errors, CORS preflight.
void add_http_basics(httplib::Server& http, ServerContext& C) {
  http.set_pre_routing_handler([&C](const httplib::Request& req, httplib::Response& res) {
    if (req.method == "OPTIONS") return httplib::Server::HandlerResponse::Unhandled;
    if (!C.opts.api_key.empty() && req.path.rfind("/v1/", 0) == 0) {
      std::string auth = req.get_header_value("Authorization");
      const std::string pfx = "Bearer ";
      std::string key = auth.rfind(pfx, 0) == 0 ? auth.substr(pfx.size()) : "";
      if (!constant_time_equal(key, C.opts.api_key)) {
        send_error(res, 401,
                   auth.empty() ? "You didn't provide an API key. Provide it as 'Authorization: Bearer <key>'."
                                : "Incorrect API key provided.",
                   "", "invalid_api_key", "invalid_request_error");
        C.metrics.count_request(req.path, 401);
        LILAC_LOG_WARN("%s %s -> 401 (bad or missing API key)", req.method.c_str(), req.path.c_str());
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });

  http.set_error_handler([&C](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 413) {
      send_error(res, 413,
                 "Request body too large: the limit is " + std::to_string(C.opts.max_body_bytes) + " bytes.", "",
                 "payload_too_large");
    } else if (res.status == 404) {
      send_error(res, 404, "Unknown endpoint: " + req.method + " " + req.path, "", "unknown_url");
    } else {
      send_error(res, res.status, "Bad request (HTTP status " + std::to_string(res.status) + ").");
    }
    C.metrics.count_request(req.path, res.status);
    LILAC_LOG_WARN("%s %s -> %d", req.method.c_str(), req.path.c_str(), res.status);
  });

  http.set_exception_handler([](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    LILAC_LOG_ERROR("%s %s -> 500 (%s)", req.method.c_str(), req.path.c_str(), what.c_str());
    send_error(res, 500, "Internal server error: " + what, "", "internal_error");
  });

  http.Options(R"(.*)", [](const httplib::Request&, httplib::Response& res) {
    res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    res.set_header("Access-Control-Allow-Headers", "Authorization, Content-Type");
    res.status = 204;
  });
}

}  // namespace

Server::Server(ServerOptions opts) : impl_(std::make_unique<Impl>(std::move(opts))) {
  auto& http = impl_->http;
  ServerContext& C = impl_->ctx;
  const int threads = std::max(4, C.opts.http_threads);
  http.new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
  http.set_payload_max_length(C.opts.max_body_bytes);
  http.set_tcp_nodelay(true);
  http.set_keep_alive_max_count(1000);
  http.set_read_timeout(60);
  http.set_write_timeout(30);
  http.set_default_headers({{"Access-Control-Allow-Origin", "*"}});
  add_http_basics(http, C);

  http.Get("/health", [&C](const httplib::Request&, httplib::Response& res) {
    if (C.ready.load()) {
      res.set_content(dump_json(json{{"status", "ok"}, {"model", C.opts.model_id}}), "application/json");
    } else {
      res.status = 503;
      res.set_content(dump_json(json{{"status", "loading"}}), "application/json");
    }
  });

  http.Get("/metrics", [&C](const httplib::Request&, httplib::Response& res) {
    C.metrics.count_request("/metrics", 200);
    res.set_content(C.metrics.render(), "text/plain; version=0.0.4");
  });

  add_openai_routes(http, C);
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
  so.spec_tokens = C.opts.spec_tokens;
  C.tok = tokenizer;
  C.core = std::make_unique<GenerationCore>(std::move(backend), std::move(tokenizer), std::move(chat_template),
                                            qwen3_6_format(), so, &C.metrics);
  C.ready.store(true);
}

int Server::bind() {
  const ServerOptions& o = impl_->ctx.opts;
  int p = o.port == 0 ? impl_->http.bind_to_any_port(o.host) : (impl_->http.bind_to_port(o.host, o.port) ? o.port : -1);
  if (p < 0) throw Error("cannot listen on " + o.host + ":" + std::to_string(o.port) + " (address in use?)");
  port_ = p;
  return p;
}

void Server::start() {
  thread_ = std::thread([this] { impl_->http.listen_after_bind(); });
  for (int i = 0; i < 500 && !impl_->http.is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
}

void Server::run() { impl_->http.listen_after_bind(); }

void Server::stop() {
  if (!impl_) return;
  // Cancel generations first so streaming responses end, then stop accepting and join.
  if (impl_->ctx.core) impl_->ctx.core->stop();
  impl_->http.stop();
  if (thread_.joinable()) thread_.join();
}

httplib::Server& Server::http() { return impl_->http; }
Metrics& Server::metrics() { return impl_->ctx.metrics; }

}  // namespace lilac::server
