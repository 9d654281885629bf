#include "server/http_response.h"

#include <httplib.h>

#include "core/log.h"
#include "server/http_server.h"
#include "server/metrics.h"

namespace lilac::server {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

std::string sse_data(const json& j) {
  std::string s = "data: ";
  s += dump_json(j);
  s += "\n\n";
  return s;
}

namespace {

// The state a chunked content provider keeps between its calls: one request's generations (one, or
// `n` choices) and their formatters.
struct Sending {
  std::vector<std::shared_ptr<Generation>> gens;
  std::vector<std::shared_ptr<ResponseFormatter>> fmts;
  ChoicesJoin join;  // several choices only
  RequestLog log;
  bool started = false;
  std::vector<std::vector<OutputEvent>> early;  // streaming: events that came before the stream's first bytes
  Clock::time_point last_write;
  bool broke = false;  // streaming: a formatter's call threw (format()); the stream ended with its error

  bool finished() const {
    for (const auto& g : gens)
      if (!g->finished()) return false;
    return true;
  }
  // The first failed generation, or nullptr.
  const Generation* failed() const {
    for (const auto& g : gens)
      if (g->failed()) return g.get();
    return nullptr;
  }
  void cancel() const {
    for (const auto& g : gens) g->cancel();
  }
  std::vector<GenerationStats> stats() const {
    std::vector<GenerationStats> st;
    for (const auto& g : gens) st.push_back(g->stats());
    return st;
  }
  // Polls the unfinished generations (all of them waiting `timeout` at most in all), handing each event
  // to sink(choice, event); false when none had any.
  template <class Sink>
  bool poll(std::chrono::milliseconds timeout, Sink sink) {
    const auto each = gens.size() == 1 ? timeout : std::chrono::milliseconds(5);
    const auto until = Clock::now() + timeout;
    std::vector<OutputEvent> evs;
    bool got = false;
    do {
      for (size_t i = 0; i < gens.size(); ++i) {
        if (gens[i]->finished()) continue;
        evs.clear();
        if (gens[i]->poll(evs, each)) got = true;
        for (auto& e : evs) sink(i, std::move(e));
      }
    } while (!got && !finished() && Clock::now() < until);
    return got;
  }
};

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

// Prompt tokens of the first choice (all choices share the prompt), cached and generated of all.
void log_done(const Sending& s, const char* what) {
  if (!s.log.log_requests || s.failed()) return;
  int64_t cached = 0, generated = 0;
  for (const auto& g : s.gens) {
    cached += g->stats().cached_tokens;
    generated += g->stats().completion_tokens;
  }
  LILAC_LOG_INFO("POST %s -> 200%s (%lld prompt, %lld cached, %lld generated%s, %s, %.1f ms)", s.log.endpoint.c_str(),
                 what, (long long)s.gens.front()->stats().prompt_tokens, (long long)cached, (long long)generated,
                 s.gens.size() > 1 ? (", " + std::to_string(s.gens.size()) + " choices").c_str() : "",
                 s.fmts.front()->finish_reason().c_str(), ms_since(s.log.t0));
}

void count(const RequestLog& log, int status) {
  if (log.metrics) log.metrics->count_request(log.endpoint, status);
}

// Writes `out` (if any); false (and the generations cancelled) when the client is gone.
bool write(Sending& s, httplib::DataSink& sink, const std::string& out) {
  if (out.empty()) return true;
  if (!sink.write(out.data(), out.size())) {
    s.cancel();
    return false;
  }
  s.last_write = Clock::now();
  return true;
}

// Streaming: choice i's formatter text from make() (a formatter call). A call that throws (a Responses stream's on_done
// storing the completed response, say) ends the stream as a failed generation does: the error is logged, and that
// formatter's text for an Error event (500, the exception's message) follows what was sent; the other choices stop.
// Nothing is formatted after that. (The throw reached the HTTP worker's send loop, which does not catch: the whole
// server ended with std::terminate.)
template <class Make>
std::string format(Sending& s, size_t i, Make make) {
  if (s.broke) return "";
  std::string what;
  try {
    return make();
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
    what = "unknown error";
  }
  s.broke = true;
  LILAC_LOG_ERROR("POST %s -> stream error: %s", s.log.endpoint.c_str(), what.c_str());
  OutputEvent ev;
  ev.kind = OutputEvent::Error;
  ev.status = 500;
  ev.message = what;
  try {
    return s.fmts[i]->stream_event(ev);
  } catch (const std::exception& e) {  // the stream ends without its error event
    LILAC_LOG_ERROR("POST %s: the stream's error event failed: %s", s.log.endpoint.c_str(), e.what());
  } catch (...) {
    LILAC_LOG_ERROR("POST %s: the stream's error event failed", s.log.endpoint.c_str());
  }
  return "";
}

const char* error_code_for(int status) {
  switch (status) {
    case 400: return "invalid_request";
    case 503: return "shutting_down";
    default: return "internal_error";
  }
}

ApiError error_of(const Generation& g) {
  return ApiError(g.error_status(), g.error_message(), "", error_code_for(g.error_status()));
}

// Waits (watching the connection) until `ready`; the events meanwhile go to sink(choice, event). False when
// the client went away (the generations are cancelled; nothing is sent).
template <class Ready, class Sink>
bool wait_watching(Sending& s, Ready ready, Sink sink) {
  while (!ready()) {
    s.poll(std::chrono::milliseconds(100), sink);
    if (!ready() && http_client_gone()) {
      s.cancel();
      LILAC_LOG_INFO("POST %s: client went away, generation cancelled", s.log.endpoint.c_str());
      count(s.log, 499);  // nginx's "client closed request"
      return false;
    }
  }
  return true;
}

void send_body(httplib::Response& res, std::shared_ptr<Sending> s, const ErrorReply& fail) {
  // Nothing is sent before the generations end, so every failure (prefill, a stop by shutdown) gets its
  // own status. Meanwhile the connection is watched: a client that goes away cancels the generations.
  // A failed choice ends the others at once.
  auto done = [&] {
    if (s->failed()) s->cancel();
    return s->finished();
  };
  if (!wait_watching(*s, done, [&](size_t i, OutputEvent e) { s->fmts[i]->add(e); })) return;
  if (const Generation* g = s->failed()) return fail(error_of(*g));
  for (const auto& g : s->gens)
    if (g->stats().finish == FinishReason::Cancelled)
      // Cancelled without an error: the server stopped the generation (never a 200 with cut text).
      return fail(ApiError(503, "The server is shutting down: the generation was stopped before it finished.", "",
                           "shutting_down"));
  if (s->gens.size() == 1) {
    res.set_content(s->fmts.front()->body(), "application/json");
  } else {
    std::vector<std::string> bodies;
    for (const auto& f : s->fmts) bodies.push_back(f->body());
    res.set_content(s->join.body(bodies, s->stats()), "application/json");
  }
  count(s->log, 200);
  log_done(*s, "");
}

void send_stream(httplib::Response& res, std::shared_ptr<Sending> s, const ErrorReply& fail) {
  // The stream (status 200) starts once a generation left the queue (the choices of a request larger than
  // the batch start as others end): until then a failure (the server stops: 503) gets its own status.
  auto ready = [&] {
    if (s->failed()) s->cancel();
    for (const auto& g : s->gens)
      if (g->started()) return true;
    return s->finished() || s->failed();
  };
  s->early.resize(s->gens.size());
  if (!wait_watching(*s, ready, [&](size_t i, OutputEvent e) { s->early[i].push_back(std::move(e)); })) return;
  if (const Generation* g = s->failed()) return fail(error_of(*g));
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
          for (size_t i = 0; i < s->gens.size(); ++i) {
            out += format(*s, i, [&] { return s->fmts[i]->stream_start(); });
            for (auto& e : s->early[i]) out += format(*s, i, [&] { return s->fmts[i]->stream_event(e); });
          }
          s->early.clear();
        } else {
          const bool got = s->poll(std::chrono::milliseconds(250), [&](size_t i, OutputEvent e) {
            out += format(*s, i, [&] { return s->fmts[i]->stream_event(e); });
          });
          if (!got && Clock::now() - s->last_write > std::chrono::seconds(2)) out = ": keep-alive\n\n";
        }
        // A failed choice's error event (or a formatter's that threw) ended the stream: the others stop.
        const bool failed = s->failed() != nullptr || s->broke;
        if (failed) s->cancel();
        const bool end = failed || s->finished();
        if (end && !failed && s->gens.size() > 1) out += s->join.stream_tail(s->stats());
        if (!write(*s, sink, out)) return false;
        if (end) sink.done();
        return true;
      },
      [s](bool success) {
        if (s->broke) return;  // logged when it broke
        if (!success || !s->finished()) {
          s->cancel();
          if (!s->failed()) {
            LILAC_LOG_INFO("POST %s: client went away, generation cancelled", s->log.endpoint.c_str());
            return;
          }
        }
        if (const Generation* g = s->failed())
          LILAC_LOG_WARN("POST %s -> stream error: %s", s->log.endpoint.c_str(), g->error_message().c_str());
        else
          log_done(*s, " stream");
      });
}

}  // namespace

void send_generation(httplib::Response& res, std::shared_ptr<Generation> gen, std::shared_ptr<ResponseFormatter> fmt,
                     bool stream, const RequestLog& log, const ErrorReply& fail) {
  send_generations(res, {std::move(gen)}, {std::move(fmt)}, {}, stream, log, fail);
}

void send_generations(httplib::Response& res, std::vector<std::shared_ptr<Generation>> gens,
                      std::vector<std::shared_ptr<ResponseFormatter>> fmts, ChoicesJoin join, bool stream,
                      const RequestLog& log, const ErrorReply& fail) {
  auto s = std::make_shared<Sending>();
  s->gens = std::move(gens);
  s->fmts = std::move(fmts);
  s->join = std::move(join);
  s->log = log;
  if (stream)
    send_stream(res, std::move(s), fail);
  else
    send_body(res, std::move(s), fail);
}

}  // namespace lilac::server
