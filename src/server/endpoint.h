// The path every generation endpoint shares, whatever its protocol (OpenAI chat/completions and
// completions, Anthropic Messages, OpenAI Responses): parse the body once, let the route hook (hybrid
// router) forward it, check readiness, have the protocol adapter translate it into a GenerationSpec,
// start it on the generation core, mark a routed answer local, and send the adapter's formatter's
// output (server/http_response.h). Errors are answered in the endpoint's protocol's shape.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/api_error.h"
#include "server/generation.h"
#include "server/http_response.h"

namespace httplib {
struct Request;
struct Response;
}  // namespace httplib

namespace lilac {
struct ModelConfig;
}

namespace lilac::server {

struct ServerContext;

// A request an adapter validated and translated.
struct PreparedRequest {
  GenerationSpec spec;
  std::string model;  // the model the request named ("" when none)
  bool stream = false;
  // Makes the response's formatter once the generation started; `route_field`: a route hook is set,
  // so the answer says "lilac_route": "local".
  std::function<std::shared_ptr<ResponseFormatter>(const Generation& gen, bool route_field)> formatter;
  // Completions with several prompts: prompts 2.. (spec is the first; each is `spec` but for its prompt).
  std::vector<GenerationSpec> more_specs;
  // OpenAI's `n` > 1 or several prompts: `n` generations of each prompt's spec (GenerationCore::start_choices),
  // choice i = prompt · n + its choice, each formatted by choice_formatter(gen, route_field, i) and answered as
  // one response through `join`.
  int n = 1;
  std::function<std::shared_ptr<ResponseFormatter>(const Generation& gen, bool route_field, int index)> choice_formatter;
  ChoicesJoin join;
  // Set: the generation runs in the background (the Responses API's `background`), and this answers the
  // request at once instead of send_generation (its one generation and formatter, the HTTP response).
  std::function<void(std::shared_ptr<Generation> gen, std::shared_ptr<ResponseFormatter> fmt, httplib::Response& res)>
      background;
};

struct Endpoint {
  std::string path;  // e.g. "/v1/messages" (counters, log lines)
  // Validates and translates a parsed body (throws ApiError naming the field at fault).
  std::function<PreparedRequest(const nlohmann::ordered_json& body, const ModelConfig& cfg, uint64_t seed)> prepare;
  // Answers an error in this protocol's shape (status, body).
  std::function<void(httplib::Response& res, const ApiError& e)> send_error;
  // The status of a request refused because too many bodies are being parsed at once (server/parse_budget.h): 503, or
  // Anthropic's 529 (overloaded_error) on its routes.
  int busy_status = 503;
  // Whether errors the route hook answers in OpenAI's shape ({"error": {...}}) are rewritten with
  // send_error (protocols other than OpenAI's).
  bool rewrite_hook_errors = false;
  // A request this server must answer itself, whatever the route hook would decide (it continues a
  // conversation stored here: only this server has it).
  std::function<bool(const nlohmann::ordered_json& body)> keep_local;
};

// What every generation route checks before it starts one: 503 (model_not_loaded) while the model loads; 404
// (model_not_found, param "model") for a model name other than the one this server serves (no name is this one).
void require_ready(const ServerContext& C);
void require_served_model(const ServerContext& C, const std::string& model);

// POST handler body of a generation endpoint. It takes the request's body: its text is freed once parsed (the route
// hook sees `req` without it), so a generation that runs for minutes does not hold it.
void serve_generation(ServerContext& C, const Endpoint& ep, httplib::Request& req, httplib::Response& res);

// An OpenAI-shaped error answer ({"error": {message, type, param, code}}) read back into an ApiError
// (false when `body` is not one).
bool read_openai_error(const std::string& body, int status, ApiError& out);

}  // namespace lilac::server
