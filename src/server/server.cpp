#include "server/server.h"

#include <httplib.h>

#include <chrono>
#include <ctime>
#include <random>

#include "core/error.h"
#include "core/log.h"
#include "engine/backend.h"
#include "server/metrics.h"
#include "server/openai_schema.h"
#include "server/responder.h"
#include "server/scheduler.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace lilac::server {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

struct Server::Impl {
  httplib::Server http;
  RouteHook hook;
  bool hook_set = false;
  std::shared_ptr<Backend> backend;
  std::shared_ptr<const Tokenizer> tok;
  std::shared_ptr<const ChatTemplate> tmpl;
  std::unique_ptr<Scheduler> sched;
  Metrics metrics;
  std::vector<int32_t> eos;
  int32_t boundary = -1;
  std::mutex rng_mu;
  std::mt19937_64 rng{std::random_device{}()};

  uint64_t random_u64() {
    std::lock_guard lk(rng_mu);
    return rng();
  }
  std::string new_id(const char* prefix) {
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
};

namespace {

void send_error(httplib::Response& res, int status, const std::string& message, const std::string& param = "",
                const std::string& code = "", const std::string& type = "") {
  res.status = status;
  res.set_content(dump_json(error_body(status, message, type, param, code)), "application/json");
}

bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

bool constant_time_equal(const std::string& a, const std::string& b) {
  unsigned char d = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) d |= (unsigned char)(a[i] ^ b[i % (b.empty() ? 1 : b.size())]);
  return d == 0 && !b.empty();
}

}  // namespace

Server::Server(ServerOptions opts) : impl_(std::make_unique<Impl>()), opts_(std::move(opts)) {
  auto& http = impl_->http;
  Impl* I = impl_.get();
  const int threads = std::max(4, opts_.http_threads);
  http.new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
  http.set_payload_max_length(opts_.max_body_bytes);
  http.set_tcp_nodelay(true);
  http.set_keep_alive_max_count(1000);
  http.set_read_timeout(60);
  http.set_write_timeout(30);
  http.set_default_headers({{"Access-Control-Allow-Origin", "*"}});

  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (req.method == "OPTIONS") return httplib::Server::HandlerResponse::Unhandled;
    if (!opts_.api_key.empty() && req.path.rfind("/v1/", 0) == 0) {
      std::string auth = req.get_header_value("Authorization");
      const std::string pfx = "Bearer ";
      std::string key = auth.rfind(pfx, 0) == 0 ? auth.substr(pfx.size()) : "";
      if (!constant_time_equal(key, opts_.api_key)) {
        send_error(res, 401,
                   auth.empty() ? "You didn't provide an API key. Provide it as 'Authorization: Bearer <key>'."
                                : "Incorrect API key provided.",
                   "", "invalid_api_key", "invalid_request_error");
        impl_->metrics.count_request(req.path, 401);
        LILAC_LOG_WARN("%s %s -> 401 (bad or missing API key)", req.method.c_str(), req.path.c_str());
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });

  http.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 413) {
      send_error(res, 413,
                 "Request body too large: the limit is " + std::to_string(opts_.max_body_bytes) + " bytes.", "",
                 "payload_too_large");
    } else if (res.status == 404) {
      send_error(res, 404, "Unknown endpoint: " + req.method + " " + req.path, "", "unknown_url");
    } else {
      send_error(res, res.status, "Bad request (HTTP status " + std::to_string(res.status) + ").");
    }
    impl_->metrics.count_request(req.path, res.status);
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

  http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (ready_.load()) {
      res.set_content(dump_json(json{{"status", "ok"}, {"model", opts_.model_id}}), "application/json");
    } else {
      res.status = 503;
      res.set_content(dump_json(json{{"status", "loading"}}), "application/json");
    }
  });

  http.Get("/metrics", [this](const httplib::Request& req, httplib::Response& res) {
    impl_->metrics.count_request("/metrics", 200);
    res.set_content(impl_->metrics.render(), "text/plain; version=0.0.4");
  });

  auto models = [this, I](const httplib::Request& req, httplib::Response& res) {
    json data = json::array();
    data.push_back(json{{"id", opts_.model_id}, {"object", "model"}, {"created", int64_t(std::time(nullptr))},
                        {"owned_by", "lilac"}});
    if (I->hook.extra_models) {
      try {
        json extra = I->hook.extra_models();
        if (extra.is_array())
          for (auto& m : extra) data.push_back(m);
      } catch (const std::exception& e) {
        LILAC_LOG_WARN("route hook extra_models failed: %s", e.what());
      }
    }
    if (req.matches.size() > 1) {
      std::string want = req.matches[1];
      for (auto& m : data)
        if (m["id"] == want) {
          res.set_content(dump_json(m), "application/json");
          return;
        }
      send_error(res, 404, "The model '" + want + "' does not exist.", "model", "model_not_found");
      return;
    }
    res.set_content(dump_json(json{{"object", "list"}, {"data", data}}), "application/json");
  };
  http.Get("/v1/models", models);
  http.Get(R"(/v1/models/(.+))", models);

  http.Post("/v1/chat/completions",
            [this](const httplib::Request& req, httplib::Response& res) { handle_generation(req, res, true); });
  http.Post("/v1/completions",
            [this](const httplib::Request& req, httplib::Response& res) { handle_generation(req, res, false); });
}

Server::~Server() { stop(); }

void Server::set_route_hook(RouteHook hook) {
  impl_->hook = std::move(hook);
  impl_->hook_set = bool(impl_->hook.maybe_forward) || bool(impl_->hook.on_local) || bool(impl_->hook.extra_models);
}

void Server::set_model(std::shared_ptr<Backend> backend, std::shared_ptr<const Tokenizer> tokenizer,
                       std::shared_ptr<const ChatTemplate> chat_template) {
  Impl* I = impl_.get();
  I->backend = std::move(backend);
  I->tok = std::move(tokenizer);
  I->tmpl = std::move(chat_template);
  I->eos = I->backend->config().eos_token_ids;
  if (I->eos.empty()) {
    for (const char* name : {"<|im_end|>", "<|endoftext|>"})
      if (auto id = I->tok->token_id(name)) I->eos.push_back(*id);
    if (auto id = I->tok->token_id(I->tok->eos_token()); id && !I->tok->eos_token().empty()) I->eos.push_back(*id);
  }
  if (auto id = I->tok->token_id("<|im_end|>")) I->boundary = *id;
  SchedulerOptions so;
  so.max_queue = opts_.max_queue;
  so.max_seq = opts_.max_seq;
  so.cache_bytes = opts_.cache_bytes;
  so.max_batch = opts_.max_batch;
  so.seq_memory_bytes = opts_.seq_memory_bytes;
  so.prefill_chunk = opts_.prefill_chunk;
  I->sched = std::make_unique<Scheduler>(I->backend, I->tok, so, &I->metrics);
  ready_.store(true);
}

int Server::bind() {
  int p = opts_.port == 0 ? impl_->http.bind_to_any_port(opts_.host) : (impl_->http.bind_to_port(opts_.host, opts_.port) ? opts_.port : -1);
  if (p < 0) throw Error("cannot listen on " + opts_.host + ":" + std::to_string(opts_.port) + " (address in use?)");
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
  if (impl_->sched) impl_->sched->stop();
  impl_->http.stop();
  if (thread_.joinable()) thread_.join();
}

httplib::Server& Server::http() { return impl_->http; }
Metrics& Server::metrics() { return impl_->metrics; }

namespace {

struct StreamState {
  std::shared_ptr<Job> job;
  std::unique_ptr<Responder> resp;
  bool started = false;
  Clock::time_point t0, last_write;
  std::string endpoint;
};

}  // namespace

void Server::handle_generation(const httplib::Request& req, httplib::Response& res, bool chat) {
  Impl* I = impl_.get();
  const auto t0 = Clock::now();
  const std::string endpoint = chat ? "/v1/chat/completions" : "/v1/completions";
  auto fail = [&](int status, const std::string& msg, const std::string& param = "", const std::string& code = "",
                  const std::string& type = "") {
    send_error(res, status, msg, param, code, type);
    I->metrics.count_request(endpoint, status);
    if (status >= 500)
      LILAC_LOG_ERROR("POST %s -> %d: %s", endpoint.c_str(), status, msg.c_str());
    else
      LILAC_LOG_WARN("POST %s -> %d: %s", endpoint.c_str(), status, msg.c_str());
  };
  try {
    ojson body = ojson::parse(req.body, nullptr, false);
    if (body.is_discarded()) return fail(400, "We could not parse the JSON body of your request: it is not valid JSON.", "", "invalid_json");
    if (!body.is_object()) return fail(400, "The request body must be a JSON object.", "", "invalid_json");
    if (I->hook.maybe_forward) {
      json plain = json::parse(req.body, nullptr, false);
      bool busy = ready_.load() && I->sched->full();
      if (I->hook.maybe_forward(req, res, plain, busy)) {
        I->metrics.count_request(endpoint, res.status);
        return;
      }
    }
    if (!ready_.load()) return fail(503, "The model is still loading; retry shortly.", "", "model_not_loaded");
    const ModelConfig& cfg = I->backend->config();
    const uint64_t seed = I->random_u64();
    std::unique_ptr<ChatParams> cp;
    std::unique_ptr<CompletionParams> mp;
    CommonParams* common;
    if (chat) {
      cp = std::make_unique<ChatParams>(parse_chat_request(body, cfg, seed));
      common = cp.get();
    } else {
      mp = std::make_unique<CompletionParams>(parse_completion_request(body, cfg, seed));
      common = mp.get();
    }
    if (!common->model.empty() && common->model != opts_.model_id)
      return fail(404, "The model '" + common->model + "' does not exist (this server serves '" + opts_.model_id + "').",
                  "model", "model_not_found");
    // Render + tokenize.
    std::vector<int32_t> prompt;
    bool in_reasoning = false;
    std::string forced;
    json tools;
    if (chat) {
      std::string text;
      try {
        text = render_chat_request(*I->tmpl, cp->template_request);
      } catch (const ApiError&) {
        throw;
      } catch (const Error& e) {  // InputError or a template error (raise_exception)
        return fail(400, std::string("Cannot render the conversation with the model's chat template: ") + e.what(),
                    "messages", "invalid_messages");
      }
      in_reasoning = ends_with(text, "<think>\n") || ends_with(text, "<think>");
      if (cp->tool_choice == ToolChoice::Required || cp->tool_choice == ToolChoice::Function) {
        // Force a call: close an open reasoning block and prefill the opening of the call.
        if (in_reasoning) text += ends_with(text, "\n") ? "\n</think>\n\n" : "\n\n</think>\n\n";
        in_reasoning = false;
        bool xml = text.find("<function=") != std::string::npos;
        forced = "<tool_call>\n";
        if (cp->tool_choice == ToolChoice::Function)
          forced += xml ? "<function=" + cp->tool_choice_name + ">\n"
                        : "{\"name\": \"" + cp->tool_choice_name + "\", \"arguments\": ";
        text += forced;
      }
      prompt = I->tok->encode(text, true);
      if (!cp->tools.is_null()) tools = json::parse(cp->tools.dump());
    } else if (mp->prompt_ids) {
      prompt = *mp->prompt_ids;
    } else {
      prompt = I->tok->encode(mp->prompt_text, true);
    }
    if (prompt.empty()) return fail(400, "The prompt is empty after tokenization.", chat ? "messages" : "prompt");
    const int64_t n = int64_t(prompt.size());
    const int64_t max_seq = opts_.max_seq;
    if (n >= max_seq)
      return fail(400, "This model's maximum context length is " + std::to_string(max_seq) + " tokens; the prompt has " +
                           std::to_string(n) + " tokens.",
                  chat ? "messages" : "prompt", "context_length_exceeded");
    int64_t max_tokens = common->max_tokens.value_or(max_seq - n);
    if (n + max_tokens > max_seq)
      return fail(400, "This model's maximum context length is " + std::to_string(max_seq) + " tokens; the prompt (" +
                           std::to_string(n) + " tokens) + max_tokens (" + std::to_string(max_tokens) +
                           ") exceeds it.",
                  chat ? "max_tokens" : "max_tokens", "context_length_exceeded");
    for (int32_t id : prompt)
      if (id < 0 || id >= cfg.vocab_size)
        return fail(400, "Token id " + std::to_string(id) + " is outside the model's vocabulary.", "prompt");

    GenerationRequest gr;
    gr.prompt = std::move(prompt);
    gr.sampling = common->sampling;
    gr.max_tokens = max_tokens;
    gr.stop_ids = I->eos;
    gr.stop_strings = common->stop;
    gr.boundary_token = chat ? I->boundary : -1;
    auto job = std::make_shared<Job>(std::move(gr));

    ResponseMeta meta;
    meta.id = I->new_id(chat ? "chatcmpl-" : "cmpl-");
    meta.model = opts_.model_id;
    meta.created = int64_t(std::time(nullptr));
    meta.chat = chat;
    meta.include_usage = common->include_usage;
    meta.logprobs = common->logprobs;
    meta.top_logprobs = common->top_logprobs;
    meta.route_field = I->hook_set;
    auto resp = std::make_unique<Responder>(meta, *I->tok, in_reasoning, tools, forced);

    if (!I->sched->submit(job))
      return fail(429, "The server is busy: " + std::to_string(opts_.max_queue) +
                           " requests are already queued or running. Retry later.",
                  "", "queue_full");
    if (I->hook_set) {
      res.set_header("x-lilac-route", "local");
      if (I->hook.on_local) {
        try {
          I->hook.on_local(json::parse(req.body, nullptr, false));
        } catch (const std::exception& e) {
          LILAC_LOG_WARN("route hook on_local failed: %s", e.what());
        }
      }
    }

    if (!common->stream) {
      // Wait until the generation produces its first token (or ends): errors up to then (prefill) get
      // their own status code.
      std::vector<JobEvent> evs;
      bool got_token = false;
      while (!resp->finished() && !got_token) {
        evs.clear();
        job->pop_all(evs, std::chrono::milliseconds(500));
        for (auto& e : evs) {
          got_token |= e.kind == JobEvent::Token;
          resp->consume(e);
        }
      }
      auto log_done = [log = opts_.log_requests, endpoint, t0](const Responder& r) {
        const auto& s = r.stats();
        if (log && !r.failed())
          LILAC_LOG_INFO("POST %s -> 200 (%lld prompt, %lld cached, %lld generated, %s, %.1f ms)", endpoint.c_str(),
                         (long long)s.prompt_tokens, (long long)s.cached_tokens, (long long)s.completion_tokens,
                         r.finish_reason().c_str(), std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
      };
      if (resp->finished()) {
        if (resp->failed())
          return fail(resp->error_status(), resp->error_message(), "",
                      resp->error_status() == 400 ? "invalid_request" : "internal_error");
        res.set_content(dump_json(resp->body()), "application/json");
        I->metrics.count_request(endpoint, 200);
        log_done(*resp);
        return;
      }
      // Still generating: send the body through a chunked provider so that a client that goes away is
      // noticed and its generation cancelled: until the body is ready a space (which JSON ignores) is
      // written every 200 ms.
      I->metrics.count_request(endpoint, 200);
      auto nst = std::make_shared<StreamState>();
      nst->job = job;
      nst->resp = std::move(resp);
      nst->t0 = t0;
      nst->last_write = Clock::now();
      nst->endpoint = endpoint;
      res.set_chunked_content_provider(
          // Not plain "application/json": httplib would gzip it for clients that accept gzip, buffering
          // the keep-alive spaces (so a gone client would not be noticed).
          "application/json; charset=utf-8",
          [nst](size_t, httplib::DataSink& sink) -> bool {
            std::vector<JobEvent> evs;
            nst->job->pop_all(evs, std::chrono::milliseconds(100));
            for (auto& e : evs) nst->resp->consume(e);
            std::string out;
            if (nst->resp->finished()) {
              out = nst->resp->failed() ? dump_json(error_body(nst->resp->error_status(), nst->resp->error_message()))
                                        : dump_json(nst->resp->body());
            } else if (Clock::now() - nst->last_write >= std::chrono::milliseconds(200)) {
              out = " ";
            }
            if (!out.empty()) {
              if (!sink.write(out.data(), out.size())) {
                nst->job->cancel = true;
                return false;
              }
              nst->last_write = Clock::now();
            }
            if (nst->resp->finished()) sink.done();
            return true;
          },
          [nst, log_done](bool success) {
            if (!success || !nst->resp->finished() || nst->resp->stats().finish == FinishReason::Cancelled) {
              nst->job->cancel = true;
              LILAC_LOG_INFO("POST %s: client went away, generation cancelled", nst->endpoint.c_str());
              return;
            }
            if (nst->resp->failed())
              LILAC_LOG_ERROR("POST %s -> error after the response started: %s", nst->endpoint.c_str(),
                              nst->resp->error_message().c_str());
            log_done(*nst->resp);
          });
      return;
    }

    auto st = std::make_shared<StreamState>();
    st->job = job;
    st->resp = std::move(resp);
    st->t0 = t0;
    st->last_write = Clock::now();
    st->endpoint = endpoint;
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    I->metrics.count_request(endpoint, 200);
    res.set_chunked_content_provider(
        "text/event-stream",
        [st](size_t, httplib::DataSink& sink) -> bool {
          std::string out;
          if (!st->started) {
            st->started = true;
            out = st->resp->first_sse();
          } else {
            std::vector<JobEvent> evs;
            bool got = st->job->pop_all(evs, std::chrono::milliseconds(250));
            for (auto& e : evs) out += st->resp->sse(e);
            if (!got && Clock::now() - st->last_write > std::chrono::seconds(2)) out = ": keep-alive\n\n";
          }
          if (!out.empty()) {
            if (!sink.write(out.data(), out.size())) {
              st->job->cancel = true;
              return false;
            }
            st->last_write = Clock::now();
          }
          if (st->resp->finished()) sink.done();
          return true;
        },
        [st, log = opts_.log_requests](bool success) {
          if (!success || !st->resp->finished()) {
            st->job->cancel = true;
            LILAC_LOG_INFO("POST %s: client went away, generation cancelled", st->endpoint.c_str());
            return;
          }
          const auto& s = st->resp->stats();
          if (st->resp->failed())
            LILAC_LOG_WARN("POST %s -> stream error: %s", st->endpoint.c_str(), st->resp->error_message().c_str());
          else if (log)
            LILAC_LOG_INFO("POST %s -> 200 stream (%lld prompt, %lld cached, %lld generated, %s, %.1f ms)",
                           st->endpoint.c_str(), (long long)s.prompt_tokens, (long long)s.cached_tokens,
                           (long long)s.completion_tokens, st->resp->finish_reason().c_str(),
                           std::chrono::duration<double, std::milli>(Clock::now() - st->t0).count());
        });
  } catch (const ApiError& e) {
    return fail(e.status, e.message, e.param, e.code, e.type);
  } catch (const InputError& e) {
    return fail(400, e.what(), "", "invalid_request");
  } catch (const std::exception& e) {
    return fail(500, std::string("Internal server error: ") + e.what(), "", "internal_error");
  } catch (...) {
    return fail(500, "Internal server error", "", "internal_error");
  }
}

}  // namespace lilac::server
