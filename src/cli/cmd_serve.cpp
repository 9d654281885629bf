// `lilac serve --model DIR`: the OpenAI-compatible HTTP server. It listens at once (GET /health answers
// 503 while the model loads, 200 after), loads the tokenizer, chat template and weights, then serves
// until SIGINT / SIGTERM, then shuts down gracefully (Server::shutdown: --shutdown-grace-s for the
// running generations; a second signal cuts the wait short).
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "cli/backend_select.h"
#include "cli/command.h"
#include "cli/serve_extension.h"
#include "cli/spec_options.h"
#include "core/error.h"
#include "core/log.h"
#include "core/mapped_file.h"
#include "engine/backend.h"
#include "engine/spec_policy.h"
#include "model/config.h"
#include "model/weights.h"
#include "server/metrics.h"
#include "server/scripted_backend.h"
#include "server/server.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace lilac::cli {

std::vector<ServeExtension>& serve_extensions() {
  static std::vector<ServeExtension> all;
  return all;
}

bool register_serve_extension(ServeExtension ext) {
  serve_extensions().push_back(std::move(ext));
  return true;
}

namespace {

volatile std::sig_atomic_t g_stop = 0;  // signals received
void on_signal(int) { g_stop = g_stop + 1; }

// Keeps the memory of request-sized buffers from piling up in glibc's per-thread arenas: blocks of
// 1 MiB and more (bodies, parsed JSON, forwarded copies) are mapped and unmapped on their own instead
// of staying in whichever arena served them (the threshold no longer adapts upwards), and free pages
// are handed back every 10 s (malloc_trim). Measured by bench/soak.mjs (bench/BENCHMARKS.md).
void bound_allocator_retention() {
#ifdef __GLIBC__
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
#endif
}
void release_free_memory() {
#ifdef __GLIBC__
  malloc_trim(0);
#endif
}

struct ServeArgs {
  std::string model, backend = "auto", model_name, api_key, host = "127.0.0.1";
  int port = 8080, threads = 0, max_queue = 64, http_threads = 0, max_connections = 1024, max_batch = 0,
      max_client_connections = -1,
      spec_tokens = 0, spec_max_batch = kDefaultSpecMaxBatch, synthetic_layers = 0;
  int64_t max_seq = 0, prefill_chunk = 512, draft_vocab = 0;
  std::string spec_policy = "adaptive", burst_prefill = "on";
  double seq_memory_gb = 0;
  int debug_load_delay_ms = 0;  // tests: keep /health at 503 this long
  double cache_mb = 2048, responses_mb = 256, batches_mb = 256, max_body_mb = 8, parse_mb = 16, receive_mb = 0, client_receive_mb = -1, header_timeout_s = 10, body_timeout_s = 60, shutdown_grace_s = 10;
};

int run(const ServeArgs& a) {
  bound_allocator_retention();
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  std::signal(SIGPIPE, SIG_IGN);
  if (a.port < 0 || a.port > 65535) throw InputError("--port must be in [0, 65535]");
  if (a.max_queue < 1) throw InputError("--max-queue must be at least 1");
  if (a.max_batch < 0) throw InputError("--max-batch must be at least 1 (0: the backend's default)");
  if (a.seq_memory_gb < 0) throw InputError("--seq-memory-gb must be >= 0");
  if (a.prefill_chunk < 1) throw InputError("--prefill-chunk must be at least 1");
  if (a.burst_prefill != "on" && a.burst_prefill != "off") throw InputError("--burst-prefill must be on or off");
  if (a.spec_max_batch < 1) throw InputError("--spec-max-batch must be at least 1 (--spec-tokens 0 turns speculation off)");
  if (a.cache_mb < 0) throw InputError("--cache-mb must be >= 0");
  if (a.responses_mb < 0) throw InputError("--responses-mb must be >= 0");
  if (a.batches_mb < 0) throw InputError("--batches-mb must be >= 0");
  if (a.max_body_mb <= 0 || a.max_body_mb > 4096) throw InputError("--max-body-mb must be in (0, 4096]");
  if (!(a.parse_mb > 0 && a.parse_mb <= 4096)) throw InputError("--parse-mb must be in (0, 4096]");
  if (!(a.receive_mb >= 0 && a.receive_mb <= 65536)) throw InputError("--receive-mb must be in [0, 65536]");
  if (a.max_connections < 1) throw InputError("--max-connections must be at least 1");
  if (a.max_client_connections < -1)
    throw InputError("--max-client-connections must be at least 0 (-1: a quarter of --max-connections)");
  if (!(a.client_receive_mb == -1 || (a.client_receive_mb >= 0 && a.client_receive_mb <= 65536)))
    throw InputError("--client-receive-mb must be in [0, 65536] (-1: half of --receive-mb)");
  for (auto [v, name] : {std::pair{a.header_timeout_s, "--header-timeout-s"}, {a.body_timeout_s, "--body-timeout-s"}})
    if (!(v > 0 && v <= 3600)) throw InputError(std::string(name) + " must be in (0, 3600]");
  if (!(a.shutdown_grace_s >= 0 && a.shutdown_grace_s <= 3600)) throw InputError("--shutdown-grace-s must be in [0, 3600]");
  if (!std::filesystem::is_directory(a.model)) throw InputError("--model: " + a.model + " is not a folder");
  const bool scripted = a.backend.rfind("scripted:", 0) == 0;

  server::ServerOptions o;
  o.host = a.host;
  o.port = a.port;
  o.api_key = a.api_key;
  if (o.api_key.empty())
    if (const char* k = std::getenv("LILAC_API_KEY")) o.api_key = k;
  std::string name = a.model_name;
  if (name.empty()) {
    name = std::filesystem::path(a.model).lexically_normal().filename().string();
    if (name.empty()) name = std::filesystem::absolute(a.model).lexically_normal().parent_path().filename().string();
    if (name.empty()) name = "lilac";
  }
  o.model_id = name;
  o.max_queue = a.max_queue;
  o.max_batch = a.max_batch;
  o.seq_memory_bytes = a.seq_memory_gb * 1e9;
  o.prefill_chunk = a.prefill_chunk;
  o.burst_prefill = a.burst_prefill == "on";
  o.spec_tokens = a.spec_tokens;
  o.spec_policy = parse_spec_policy(a.spec_policy);
  o.spec_max_batch = a.spec_max_batch;
  o.http_threads = a.http_threads;
  o.max_connections = a.max_connections;
  o.max_client_connections = a.max_client_connections;
  o.header_timeout_ms = int(a.header_timeout_s * 1000);
  o.body_timeout_ms = int(a.body_timeout_s * 1000);
  o.cache_bytes = size_t(a.cache_mb * 1024 * 1024);
  o.responses_bytes = size_t(a.responses_mb * 1024 * 1024);
  o.batches_bytes = size_t(a.batches_mb * 1024 * 1024);
  o.max_body_bytes = size_t(a.max_body_mb * 1024 * 1024);
  o.parse_bytes = size_t(a.parse_mb * 1024 * 1024);
  o.receive_bytes = size_t(a.receive_mb * 1024 * 1024);
  o.client_receive_bytes = a.client_receive_mb < 0 ? -1 : int64_t(a.client_receive_mb * 1024 * 1024);
  // Context limit: --max-seq, else min(32768, the model's max_position_embeddings).
  ModelConfig cfg;
  if (!scripted && a.synthetic_layers == 0) cfg = load_config(a.model);
  int64_t model_max = scripted ? int64_t(1) << 30 : a.synthetic_layers > 0 ? qwen36_shape(1).max_position_embeddings
                                                           : cfg.max_position_embeddings;
  o.max_seq = a.max_seq > 0 ? a.max_seq : std::min<int64_t>(32768, model_max > 0 ? model_max : 32768);
  if (model_max > 0 && o.max_seq > model_max)
    throw InputError("--max-seq " + std::to_string(o.max_seq) + " exceeds the model's max_position_embeddings (" +
                     std::to_string(model_max) + ")");

  server::Server srv(o);
  for (auto& ext : serve_extensions())
    if (ext.configure) ext.configure(srv);
  int port = srv.bind();
  srv.start();
  std::printf("lilac: listening on http://%s:%d (loading %s)\n", o.host.c_str(), port, a.model.c_str());
  std::fflush(stdout);

  if (a.debug_load_delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(a.debug_load_delay_ms));
  auto tok = std::shared_ptr<const Tokenizer>(Tokenizer::load(a.model));
  auto tmpl = std::shared_ptr<const ChatTemplate>(ChatTemplate::load(a.model));
  std::shared_ptr<Backend> backend;
  if (scripted) {
    backend = server::make_scripted_backend_from_file(a.backend.substr(9), tok);
  } else if (a.synthetic_layers > 0) {
    // Benchmarks over HTTP without a checkpoint: the model folder gives the tokenizer and chat template,
    // the weights are random (the real shape with the tokenizer's vocabulary, so that every sampled id
    // detokenizes); the generated text is meaningless.
    std::printf("lilac: random weights of the Qwen3.6-35B-A3B shape, %d layers (--synthetic-layers): for "
                "benchmarks only, the text is meaningless\n", a.synthetic_layers);
    std::fflush(stdout);
    backend = make_synthetic_backend(a.backend, a.synthetic_layers, 1, a.threads, (tok->vocab_size() + 63) / 64 * 64);
  } else {
    auto weights = load_model(a.model);
    backend = make_backend(a.backend, weights, a.threads);
    effective_spec_tokens(a.spec_tokens, *backend, *weights);  // logs whether it applies, and why not
  }
  backend->set_draft_vocab(a.draft_vocab);
  srv.set_model(backend, tok, tmpl);
  std::printf(
      "lilac: ready: model '%s' on %s, context %lld tokens, %lld concurrent generations, queue %d, prefix cache "
      "%.0f MiB%s\n",
      o.model_id.c_str(), backend->describe().c_str(), (long long)o.max_seq,
      (long long)srv.metrics().pool_capacity.load(), o.max_queue, a.cache_mb, o.api_key.empty() ? "" : ", API key required");
  std::fflush(stdout);
  for (int tick = 1; !g_stop; ++tick) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (tick % 500 == 0) release_free_memory();
  }
  std::printf("lilac: shutting down (new requests get 503; running generations have %.0f s to finish)\n",
              a.shutdown_grace_s);
  std::fflush(stdout);
  srv.shutdown(int(a.shutdown_grace_s * 1000), [] { return g_stop > 1; });
  std::printf("lilac: stopped\n");
  std::fflush(stdout);
  return 0;
}

const bool registered = register_command(Command{
    "serve", "Serve the OpenAI-compatible HTTP API (chat/completions, completions, models, health, metrics)",
    [](CLI::App& sub) -> std::function<int()> {
      auto a = std::make_shared<ServeArgs>();
      sub.add_option("--model", a->model, "Model folder (config.json, safetensors, tokenizer, chat template)")
          ->required();
      sub.add_option("--backend", a->backend,
                     "auto (CUDA when a GPU is usable, else cpu), cpu (fast), cpu-ref (fp32 reference), cuda, or "
                     "scripted:FILE (test backend)")
          ->capture_default_str();
      sub.add_option("--threads", a->threads, "CPU backend threads (0 = all hardware threads)")->capture_default_str();
      sub.add_option("--host", a->host, "Address to listen on")->capture_default_str();
      sub.add_option("--port", a->port, "Port to listen on (0 = any free port; the chosen one is printed)")
          ->capture_default_str();
      sub.add_option("--api-key", a->api_key,
                     "Require 'Authorization: Bearer KEY' on /v1/* (also from $LILAC_API_KEY)");
      sub.add_option("--model-name", a->model_name, "Model id served in /v1/models (default: the folder name)");
      sub.add_option("--max-seq", a->max_seq,
                     "Context limit in tokens, prompt + max_tokens (default: min(32768, max_position_embeddings))");
      sub.add_option("--cache-mb", a->cache_mb, "Prefix-cache budget in MiB (session snapshots)")->capture_default_str();
      sub.add_option("--responses-mb", a->responses_mb,
                     "Memory for stored Responses (store, previous_response_id) in MiB; 0 keeps none")
          ->capture_default_str();
      sub.add_option("--batches-mb", a->batches_mb,
                     "Memory for Message Batches in MiB: the requests of running batches and the results kept (a "
                     "new batch that does not fit: 429, or 413 when larger than all of it; the oldest ended "
                     "batches' results are dropped first); 0 takes none")
          ->capture_default_str();
      sub.add_option("--max-queue", a->max_queue, "Generations queued or running before requests get 429")
          ->capture_default_str();
      sub.add_option("--max-batch", a->max_batch,
                     "Generations run concurrently (continuous batching; one session each, created at start). "
                     "Default: what --seq-memory-gb holds, else the backend's default (CPU: 4; CUDA: what fits "
                     "the GPU's free memory)");
      sub.add_option("--seq-memory-gb", a->seq_memory_gb,
                     "Memory budget of the session pool in GB (K/V caches at --max-seq + recurrent state): "
                     "caps --max-batch (0 = no budget)");
      sub.add_option("--prefill-chunk", a->prefill_chunk,
                     "Prompt tokens prefilled per scheduler step; decode steps of the running streams run "
                     "between chunks, so a long prompt delays them by one chunk at most")
          ->capture_default_str();
      sub.add_option("--burst-prefill", a->burst_prefill,
                     "on: requests that arrive together are prefilled before any of them takes a decode step "
                     "(each gets its first token when its own prefill ends; a stream already decoding still waits "
                     "one chunk at most), so their inter-token gaps are not stretched by each other's chunks; "
                     "off: every stream decodes between the others' chunks")
          ->capture_default_str();
      sub.add_option("--max-body-mb", a->max_body_mb,
                     "Request body limit in MiB, after decompression (larger: 413)")->capture_default_str();
      sub.add_option("--parse-mb", a->parse_mb,
                     "MiB of request bodies parsed and prepared at once, all requests together (each takes up to "
                     "~63 times its size in memory meanwhile); a body waits its turn (arrival order) up to 5 s, then "
                     "503 (529 on /v1/messages*), at once when the bodies waiting would pass this many MiB with it; a "
                     "larger body runs alone. The bodies of requests waiting for a worker are bounded by it too (503)")
          ->capture_default_str();
      sub.add_option("--receive-mb", a->receive_mb,
                     "MiB of request bodies being received at once, all connections together (0 = 256, or 4 x "
                     "--max-body-mb when larger): a body's Content-Length is reserved when its headers are in, and a "
                     "body that does not fit beside the others gets 503 (529 on /v1/messages*) at once, before it is "
                     "read; a chunked one is counted as it arrives; a larger body is received when no other is")
          ->capture_default_str();
      sub.add_option("--client-receive-mb", a->client_receive_mb,
                     "MiB of request bodies one client (peer IP address) may have being received at once (-1 = half "
                     "of --receive-mb; 0 = no per-client bound): a body past it gets the same 503 (529) at once, unless "
                     "the client has no other body being received")
          ->capture_default_str();
      sub.add_option("--http-threads", a->http_threads,
                     "HTTP worker threads = requests answered at once (0 = --max-queue + 32; must exceed --max-queue)")
          ->capture_default_str();
      sub.add_option("--max-connections", a->max_connections,
                     "Open connections at most (past it the longest-idle one is closed, or 503)")->capture_default_str();
      sub.add_option("--max-client-connections", a->max_client_connections,
                     "Open connections of one client (peer IP address) at most (-1 = a quarter of --max-connections, "
                     "at least 1; 0 = no per-client bound): past it that client's own longest-idle one is closed, or "
                     "503")
          ->capture_default_str();
      sub.add_option("--header-timeout-s", a->header_timeout_s,
                     "Seconds for a request's line and headers to arrive, and for each 64 KiB of its body (or all the "
                     "rest) after the headers or the previous 64 KiB (408 after)")->capture_default_str();
      sub.add_option("--body-timeout-s", a->body_timeout_s,
                     "Seconds for a request's whole body to arrive after its headers (408 after)")->capture_default_str();
      sub.add_option("--shutdown-grace-s", a->shutdown_grace_s,
                     "On SIGTERM / SIGINT: seconds running generations get to finish before they end with an error")
          ->capture_default_str();
      add_spec_option(sub, a->spec_tokens);
      add_draft_vocab_option(sub, a->draft_vocab);
      add_spec_policy_option(sub, a->spec_policy);
      sub.add_option("--spec-max-batch", a->spec_max_batch,
                     "Speculative decoding only while at most N streams decode; above N every stream steps in the "
                     "batched step without drafts (on the H200 a second stream gains more from batching than "
                     "from drafting: README, \"Speculative decoding\")")
          ->capture_default_str();
      sub.add_option("--synthetic-layers", a->synthetic_layers,
                     "Benchmarks: serve random weights of the Qwen3.6-35B-A3B shape with N layers instead of the "
                     "model folder's weights (its tokenizer and chat template are used; the text is meaningless)")
          ->check(CLI::Range(0, 1000));
      sub.add_option("--debug-load-delay-ms", a->debug_load_delay_ms, "(tests) wait before loading the model")
          ->group("");
      for (auto& ext : serve_extensions())
        if (ext.add_options) ext.add_options(sub);
      return [a] { return run(*a); };
    }});

}  // namespace
}  // namespace lilac::cli
