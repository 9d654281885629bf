// The OpenAI-compatible HTTP server (`lilac serve`). The request path: lilac's HTTP layer
// (server/http_server.h: bounded reading, deadlines, connection limits, an I/O thread that answers
// /health and /metrics itself, workers for the rest) -> an endpoint's protocol adapter
// (server/openai_api.cpp: parse once with bounds (server/request_json.h) + validate -> GenerationSpec)
// -> the generation core (server/generation.h: render, tokenize, check, queue a Job on the Scheduler,
// which owns the engine Session and the prefix cache) -> the adapter's ResponseFormatter, sent by
// server/http_response.h.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "engine/spec_policy.h"

namespace httplib {
struct Request;
struct Response;
}  // namespace httplib

namespace lilac {
class Backend;
class Tokenizer;
class ChatTemplate;
}  // namespace lilac

namespace lilac::server {

class HttpServer;
class Scheduler;
struct Metrics;

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                 // 0 = any free port (see Server::port())
  std::string api_key;             // non-empty: require "Authorization: Bearer <key>" (scheme in any case)
  std::string model_id = "lilac";  // the id /v1/models lists and requests may name
  size_t max_body_bytes = 8u << 20;  // request body after decoding (413 beyond)
  // Request bodies being parsed and prepared at once, all requests together (server/parse_budget.h; --parse-mb), and
  // how long a body waits for room before it is refused (503; 529 on Anthropic's routes). The bodies waiting for room,
  // and those of the requests waiting for a worker (max_pending), are bounded by parse_bytes too.
  size_t parse_bytes = size_t(16) << 20;
  int parse_wait_ms = 5000;
  // Request bodies being received at once, all connections together (HttpServerOptions::max_buffered_body_bytes;
  // --receive-mb): a body's declared length is reserved when its headers are in (503 at once, 529 on Anthropic's
  // routes, when it does not fit). 0: 256 MiB, or 4 * max_body_bytes when larger.
  size_t receive_bytes = 0;
  // Per client (one peer IP address; HttpServerOptions::max_client_body_bytes; --client-receive-mb): the bytes of its
  // bodies being received. -1: half of the receive bound; 0: no per-client bound.
  int64_t client_receive_bytes = -1;
  int max_queue = 64;              // queued + running generations; more -> 429
  int64_t max_seq = 32768;         // prompt + max_tokens limit (and the session's capacity)
  size_t cache_bytes = size_t(2048) << 20;  // prefix-cache budget (SessionSnapshot::bytes())
  size_t responses_bytes = size_t(256) << 20;  // stored Responses (response_store.h); 0: none kept
  size_t batches_bytes = size_t(256) << 20;  // Message Batches: requests held while running + results kept (0: none)
  int max_batch = 0;               // concurrent generations (sessions in the pool); 0: backend default
  double seq_memory_bytes = 0;     // memory budget of the session pool (0: none); see SchedulerOptions
  int64_t prefill_chunk = 512;     // prompt tokens per prefill step (interleaved with decode steps)
  bool burst_prefill = true;       // requests that arrive together are prefilled before they decode (SchedulerOptions)
  int http_threads = 0;            // HTTP workers; 0 = max_queue + 32 (must exceed max_queue)
  int max_pending = 32;            // complete requests waiting for a worker (503 beyond; their bodies: parse_bytes)
  int max_connections = 1024;      // open connections
  int max_client_connections = -1;  // open connections of one client (peer address); -1: max_connections / 4, at
                                    // least 1; 0: no per-client bound
  int header_timeout_ms = 10000;   // request line + headers
  int body_timeout_ms = 60000;     // the body
  int idle_timeout_ms = 30000;     // keep-alive connection between requests
  int write_timeout_ms = 30000;    // a stalled client
  bool log_requests = true;
  int spec_tokens = 0;             // speculative decoding: MTP drafts per step (GenerationRequest::draft_tokens)
  SpecPolicyKind spec_policy = SpecPolicyKind::Adaptive;  // adaptive (0..spec_tokens drafts) or fixed
  int spec_max_batch = kDefaultSpecMaxBatch;  // no drafts while more sequences decode (SchedulerOptions)
  // Tests only (response_store.h's seam; empty in production): called before each store of a Responses object,
  // with its id and the object; a throw from it is that store throwing.
  std::function<void(const std::string& id, const nlohmann::json& response)> response_store_put_fault;
};

// Optional hook for a request router (the hybrid router, src/router/hybrid.h). Every member may be
// empty. maybe_forward is called first by POST /v1/chat/completions and /v1/completions with the
// parsed body (the request's own body text is freed by then: read `body`); it answers `Answered` when it
// answered the request itself (forwarded it upstream, or an error; the local engine does nothing), `Local` to
// let the local engine serve it, `LocalAnyModel` to let the local engine serve it although it names another
// model (a sensitive request that named an upstream model: served in-process by the local model, never re-sent
// over HTTP).
// local_busy: the local queue is full (a local request would get 429). on_local is called when a
// request is served locally. extra_models: entries appended to GET /v1/models' "data". on_shutdown:
// the server stops (cut what the hook has in flight, e.g. upstream requests).
// When a hook is set, local responses carry the header `x-lilac-route: local` and the body field
// `"lilac_route": "local"` (in every streamed chunk too).
enum class RouteDecisionKind { Local, LocalAnyModel, Answered };
struct RouteHook {
  std::function<RouteDecisionKind(const httplib::Request&, httplib::Response&, const nlohmann::ordered_json& body,
                                  bool local_busy)>
      maybe_forward;
  std::function<void(const nlohmann::ordered_json& body)> on_local;
  std::function<nlohmann::json()> extra_models;
  std::function<void()> on_shutdown;
  // GET /v1/responses/{id} (and /input_items), POST .../cancel, DELETE for an id this server does not hold: true when
  // the hook answered it (a response the router created upstream, whose id the client got from lilac).
  std::function<bool(const httplib::Request&, httplib::Response&, const std::string& id)> response_route;
};

class Server {
 public:
  explicit Server(ServerOptions opts);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  void set_route_hook(RouteHook hook);
  // Attach the loaded model; /health turns 200 and generation endpoints start answering.
  void set_model(std::shared_ptr<Backend> backend, std::shared_ptr<const Tokenizer> tokenizer,
                 std::shared_ptr<const ChatTemplate> chat_template);

  // Bind the listening socket (throws lilac::Error when it cannot); returns the bound port.
  int bind();
  // Serve on background threads (after bind()).
  void start();
  // Serve on the calling thread until stop() (after bind()).
  void run();
  // Graceful stop (SIGTERM): new requests get 503 and /health says "shutting_down"; generations not
  // started yet end with 503; running ones get up to `grace_ms` to finish (less when `hurry` turns
  // true), then end with an error (non-streaming: 503; streaming: an error event, then [DONE]); then
  // stop().
  void shutdown(int grace_ms, const std::function<bool()>& hurry = nullptr);
  // Immediate stop: generations are cancelled, connections closed, threads joined.
  void stop();
  int port() const { return port_; }
  bool ready() const;

  HttpServer& http();  // e.g. for extra routes
  Metrics& metrics();
  const ServerOptions& options() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

}  // namespace lilac::server
