#include "server/http_response.h"

#include <httplib.h>

#include "core/log.h"
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

void send_body(httplib::Response& res, std::shared_ptr<Sending> s, const ErrorReply& fail) {
  // Wait until the generation produces its first token (or ends): errors up to then (prefill) get
  // their own status code.
  std::vector<OutputEvent> evs;
  bool got_token = false;
  while (!s->gen->finished() && !got_token) {
    evs.clear();
    s->gen->poll(evs, std::chrono::milliseconds(500));
    for (auto& e : evs) {
      got_token |= e.kind == OutputEvent::Token;
      s->fmt->add(e);
    }
  }
  if (s->gen->finished()) {
    if (s->gen->failed()) {
      const int status = s->gen->error_status();
      return fail(ApiError(status, s->gen->error_message(), "", status == 400 ? "invalid_request" : "internal_error"));
    }
    res.set_content(s->fmt->body(), "application/json");
    count(s->log, 200);
    log_body_done(*s);
    return;
  }
  // Still generating: send the body through a chunked provider so that a client that goes away is
  // noticed and its generation cancelled: until the body is ready a space is written every 200 ms.
  count(s->log, 200);
  s->last_write = Clock::now();
  res.set_chunked_content_provider(
      // Not plain "application/json": httplib would gzip it for clients that accept gzip, buffering
      // the keep-alive spaces (so a gone client would not be noticed).
      "application/json; charset=utf-8",
      [s](size_t, httplib::DataSink& sink) -> bool {
        std::vector<OutputEvent> evs;
        s->gen->poll(evs, std::chrono::milliseconds(100));
        for (auto& e : evs) s->fmt->add(e);
        std::string out;
        if (s->gen->finished()) {
          out = s->gen->failed() ? s->fmt->error_body(ApiError(s->gen->error_status(), s->gen->error_message()))
                                 : s->fmt->body();
        } else if (Clock::now() - s->last_write >= std::chrono::milliseconds(200)) {
          out = " ";
        }
        if (!write(*s, sink, out)) return false;
        if (s->gen->finished()) sink.done();
        return true;
      },
      [s](bool success) {
        if (!success || !s->gen->finished() || s->gen->stats().finish == FinishReason::Cancelled) {
          s->gen->cancel();
          LILAC_LOG_INFO("POST %s: client went away, generation cancelled", s->log.endpoint.c_str());
          return;
        }
        if (s->gen->failed())
          LILAC_LOG_ERROR("POST %s -> error after the response started: %s", s->log.endpoint.c_str(),
                          s->gen->error_message().c_str());
        log_body_done(*s);
      });
}

void send_stream(httplib::Response& res, std::shared_ptr<Sending> s) {
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
    send_stream(res, std::move(s));
  else
    send_body(res, std::move(s), fail);
}

}  // namespace lilac::server
