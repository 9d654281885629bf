// Sending one generation over HTTP, for any protocol: the protocol's ResponseFormatter turns the
// generation's OutputEvents into bytes; send_generation streams them as server-sent events or answers
// one JSON body. Both notice a client that goes away and cancel its generation.
#pragma once
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/api_error.h"
#include "server/generation.h"
#include "text/json_dump.h"  // dump_json: every JSON this layer writes goes through it

namespace httplib {
struct Response;
}

namespace lilac::server {

struct Metrics;

// One response of one protocol (a protocol adapter's output side).
class ResponseFormatter {
 public:
  virtual ~ResponseFormatter() = default;
  // Streaming: the text sent before any event ("" = nothing), then the text for each event ("" = nothing
  // yet). The text for a Done or Error event ends the stream.
  virtual std::string stream_start() = 0;
  virtual std::string stream_event(const OutputEvent& ev) = 0;
  // Not streaming: every event is added, then body() is sent once the generation is done.
  virtual void add(const OutputEvent& ev) = 0;
  virtual std::string body() const = 0;
  // This protocol's JSON error body.
  virtual std::string error_body(const ApiError& e) const = 0;
  // For the log line ("stop", "length", ...).
  virtual std::string finish_reason() const = 0;
};

// What a request's log lines and counters need.
struct RequestLog {
  std::string endpoint;  // e.g. "/v1/chat/completions"
  std::chrono::steady_clock::time_point t0;
  bool log_requests = true;
  Metrics* metrics = nullptr;
};

// Several generations answered as one response (OpenAI's `n`): how their formatters' outputs join.
struct ChoicesJoin {
  // Not streaming: the body from each formatter's body() and each generation's stats.
  std::function<std::string(const std::vector<std::string>& bodies, const std::vector<GenerationStats>& stats)> body;
  // Streaming: what ends the stream once all finished (the formatters were made without their tails).
  std::function<std::string(const std::vector<GenerationStats>& stats)> stream_tail;
};

// Answers an error before anything was sent (the endpoint's error reply: body, counters, log).
using ErrorReply = std::function<void(const ApiError&)>;

// Answers `res` with `gen`'s output. Not streaming: waits for the end, watching the connection
// (http_client_gone: a client that goes away cancels the generation), then answers the body, or the
// error through `fail` with its own status (a generation stopped by shutdown: 503, never a 200 with
// cut text). Streaming: server-sent events as the tokens come; an error after the start is an error
// event followed by [DONE]. A formatter call that throws while streaming (a Responses stream's store of its
// completed object) is such an error too (500, its message; logged): the protocol's error event(s) end the stream.
void send_generation(httplib::Response& res, std::shared_ptr<Generation> gen, std::shared_ptr<ResponseFormatter> fmt,
                     bool stream, const RequestLog& log, const ErrorReply& fail);
// The same for several generations of one request (choice i: gens[i], fmts[i]), joined by `join`. The
// answer waits for all (not streaming) or streams each choice's events as they come; the first failure
// answers the request (its status, or its error event) and cancels the others, as does a client gone.
void send_generations(httplib::Response& res, std::vector<std::shared_ptr<Generation>> gens,
                      std::vector<std::shared_ptr<ResponseFormatter>> fmts, ChoicesJoin join, bool stream,
                      const RequestLog& log, const ErrorReply& fail);

// SSE framing of one JSON value ("data: ...\n\n"), invalid UTF-8 replaced (dump_json).
std::string sse_data(const nlohmann::json& j);

}  // namespace lilac::server
