#include "server/http_response.h"

#include <httplib.h>

#include "core/log.h"
#include "server/http_server.h"
#include "server/metrics.h"

namespace lilac::server {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

std::string dump_json(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string sse_data(const json& j) {
  std::string s = "data: ";
  s += dump_json(j);
  s += "\n\n";
  return s;
}

namespace {

// The state a chunked content provider keeps between its calls.
struct Sending {
  std::shared_ptr<Generation> gen;
  std::shared_ptr<ResponseFormatter> fmt;
  RequestLog log;
  bool started = false;
  std::vector<OutputEvent> early;  // streaming: events that came before the stream's first bytes
  Clock::time_point last_write;
};

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

void log_body_done(const Sending& s) {
  const auto& st = s.gen->stats();
  if (s.log.log_requests && !s.gen->failed())
    LILAC_LOG_INFO("POST %s -> 200 (%lld prompt, %lld cached, %lld generated, %s, %.1f ms)", s.log.endpoint.c_str(),
                   (long long)st.prompt_tokens, (long long)st.cached_tokens, (long long)st.completion_tokens,
                   s.fmt->finish_reason().c_str(), ms_since(s.log.t0));
}

void count(const RequestLog& log, int status) {
  if (log.metrics) log.metrics->count_request(log.endpoint, status);
}

// Writes `out` (if any); false (and the generation cancelled) when the client is gone.
bool write(Sending& s, httplib::DataSink& sink, const std::string& out) {
  if (out.empty()) return true;
  if (!sink.write(out.data(), out.size())) {
    s.gen->cancel();
    return false;
  }
  s.last_write = Clock::now();
  return true;
}

const char* error_code_for(int status) {
  switch (status) {
    case 400: return "invalid_request";
    case 503: return "shutting_down";
    default: return "internal_error";
  }
}

// Waits (watching the connection) until `ready`; the events meanwhile go to `sink`. False when the client
// went away (the generation is cancelled; nothing is sent).
template <class Ready, class Sink>
bool wait_watching(Sending& s, Ready ready, Sink sink) {
  std::vector<OutputEvent> evs;
  while (!ready()) {
    evs.clear();
    s.gen->poll(evs, std::chrono::milliseconds(100));
    for (auto& e : evs) sink(std::move(e));
    if (!ready() && http_client_gone()) {
      s.gen->cancel();
      LILAC_LOG_INFO("POST %s: client went away, generation cancelled", s.log.endpoint.c_str());
      count(s.log, 499);  // nginx's "client closed request"
      return false;
    }
  }
  return true;
}

void send_body(httplib::Response& res, std::shared_ptr<Sending> s, const ErrorReply& fail) {
  // Nothing is sent before the generation ends, so every failure (prefill, a stop by shutdown) gets its
  // own status. Meanwhile the connection is watched: a client that goes away cancels the generation.
  if (!wait_watching(*s, [&] { return s->gen->finished(); }, [&](OutputEvent e) { s->fmt->add(e); })) return;
  if (s->gen->failed()) {
    const int status = s->gen->error_status();
    return fail(ApiError(status, s->gen->error_message(), "", error_code_for(status)));
  }
  if (s->gen->stats().finish == FinishReason::Cancelled) {
    // Cancelled without an error: the server stopped the generation (never a 200 with cut text).
    return fail(ApiError(503, "The server is shutting down: the generation was stopped before it finished.", "",
                         "shutting_down"));
  }
  res.set_content(s->fmt->body(), "application/json");
  count(s->log, 200);
  log_body_done(*s);
}

void send_stream(httplib::Response& res, std::shared_ptr<Sending> s, const ErrorReply& fail) {
  // The stream (status 200) starts once the generation leaves the queue: until then a failure (the
  // server stops: 503) gets its own status.
  if (!wait_watching(*s, [&] { return s->gen->started() || s->gen->finished(); },
                     [&](OutputEvent e) { s->early.push_back(std::move(e)); }))
    return;
  if (s->gen->failed()) {
    const int status = s->gen->error_status();
    return fail(ApiError(status, s->gen->error_message(), "", error_code_for(status)));
  }
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  count(s->log, 200);
  s->last_write = Clock::now();
  res.set_chunked_content_provider(
      "text/event-stream",
      [s](size_t, httplib::DataSink& sink) -> bool {
        std::string out;
        if (!s->started) {
          s->started = true;
          out = s->fmt->stream_start();
          for (auto& e : s->early) out += s->fmt->stream_event(e);
          s->early.clear();
        } else {
          std::vector<OutputEvent> evs;
          const bool got = s->gen->poll(evs, std::chrono::milliseconds(250));
          for (auto& e : evs) out += s->fmt->stream_event(e);
          if (!got && Clock::now() - s->last_write > std::chrono::seconds(2)) out = ": keep-alive\n\n";
        }
        if (!write(*s, sink, out)) return false;
        if (s->gen->finished()) sink.done();
        return true;
      },
      [s](bool success) {
        if (!success || !s->gen->finished()) {
          s->gen->cancel();
          LILAC_LOG_INFO("POST %s: client went away, generation cancelled", s->log.endpoint.c_str());
          return;
        }
        const auto& st = s->gen->stats();
        if (s->gen->failed())
          LILAC_LOG_WARN("POST %s -> stream error: %s", s->log.endpoint.c_str(), s->gen->error_message().c_str());
        else if (s->log.log_requests)
          LILAC_LOG_INFO("POST %s -> 200 stream (%lld prompt, %lld cached, %lld generated, %s, %.1f ms)",
                         s->log.endpoint.c_str(), (long long)st.prompt_tokens, (long long)st.cached_tokens,
                         (long long)st.completion_tokens, s->fmt->finish_reason().c_str(), ms_since(s->log.t0));
      });
}

}  // namespace

void send_generation(httplib::Response& res, std::shared_ptr<Generation> gen, std::shared_ptr<ResponseFormatter> fmt,
                     bool stream, const RequestLog& log, const ErrorReply& fail) {
  auto s = std::make_shared<Sending>();
  s->gen = std::move(gen);
  s->fmt = std::move(fmt);
  s->log = log;
  if (stream)
    send_stream(res, std::move(s), fail);
  else
    send_body(res, std::move(s), fail);
}

}  // namespace lilac::server
