// What the server's endpoints share (internal to src/server/): options, counters, the route hook, the
// generation core once the model is loaded, and request ids.
#pragma once
#include <atomic>
#include <functional>
#include <vector>
#include <cstdint>
#include <memory>
#include <mutex>
#include <random>
#include <string>

#include "server/background_responses.h"
#include "server/conversation_store.h"
#include "server/generation.h"
#include "server/metrics.h"
#include "server/parse_budget.h"
#include "server/response_store.h"
#include "server/server.h"

namespace httplib {
struct Response;
}

namespace lilac::server {

struct ServerContext {
  explicit ServerContext(ServerOptions o) : opts(std::move(o)) {}

  ServerOptions opts;
  Metrics metrics;
  RouteHook hook;
  bool hook_set = false;
  std::shared_ptr<const Tokenizer> tok;  // set with `core`, before `ready`
  std::unique_ptr<GenerationCore> core;  // set once the model is loaded, before `ready`
  std::atomic<bool> ready{false};
  std::atomic<bool> shutting_down{false};  // Server::shutdown began
  // The Responses API's stored responses (opts.response_store_put_fault: the tests' seam, empty in production).
  ResponseStore responses{1000, opts.responses_bytes, opts.response_store_put_fault};
  BackgroundResponses background{responses};           // its background mode's running generations
  ConversationStore conversations{1000, opts.responses_bytes};  // OpenAI's Conversations
  // The request bodies being parsed and prepared at once: every JSON route leases its body's bytes first.
  ParseBudget parse{opts.parse_bytes, opts.parse_wait_ms};
  // Called by Server::stop after the generations were ended and the connections closed, before the generation core
  // stops (a component joining its threads: the Message Batches).
  std::vector<std::function<void()>> on_stop;

  uint64_t random_u64();
  std::string new_id(const char* prefix);  // prefix + 24 random alphanumerics

 private:
  std::mutex rng_mu_;
  std::mt19937_64 rng_{std::random_device{}()};
};

// An OpenAI-shaped error answer ({"error": {...}}).
void send_error(httplib::Response& res, int status, const std::string& message, const std::string& param = "",
                const std::string& code = "", const std::string& type = "");
// The same for an ApiError (an endpoint's or a JSON route's ErrorSender in OpenAI's shape).
void send_error(httplib::Response& res, const ApiError& e);
// The OpenAI error body for errors the HTTP layer answers itself (HttpServer's ErrorFormatter).
std::string openai_error_text(int status, const std::string& message, const std::string& code);

}  // namespace lilac::server
