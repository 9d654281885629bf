// The server's protocol-neutral generation core. A protocol adapter (server/openai_api.cpp today;
// Anthropic Messages and OpenAI Responses can be added the same way) validates its request and
// translates it into a GenerationSpec; GenerationCore::start renders the conversation with the chat
// template, shapes the prompt with the model format (open reasoning, a forced tool call:
// text/model_format.h), tokenizes it, checks it against the context and queues a Job on the Scheduler.
// The Generation it returns yields the job's events decoded into OutputEvents (reasoning / content /
// tool-call deltas, per-token logprobs, the end), which the adapter's ResponseFormatter turns into its
// protocol's bytes (server/http_response.h sends them).
#pragma once
#include <chrono>
#include <cstdint>
#include <mutex>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/generator.h"
#include "server/scheduler.h"
#include "text/output_parser.h"

namespace lilac {
class Backend;
class ChatTemplate;
class ModelFormat;
class Tokenizer;
struct ModelConfig;
namespace grammar {
class GrammarCache;
}
}  // namespace lilac

namespace lilac::server {

struct Metrics;

// One generation request, protocol-neutral and already validated by its adapter.
struct GenerationSpec {
  enum class Input { Chat, Text, Tokens };
  Input input = Input::Chat;
  nlohmann::ordered_json chat;  // Chat: {"messages", "tools"?, "chat_template_kwargs"?} (render_chat_request)
  std::string text;             // Text: the prompt
  std::vector<int32_t> tokens;  // Tokens: the prompt's ids
  // Chat: the tools (they type tool-call arguments by their JSON schema; null when none), and whether
  // to force a call (of `forced_function`, or of any tool when it is empty).
  nlohmann::ordered_json tools;
  bool force_tool_call = false;
  std::string forced_function;
  // Constrained decoding (grammar/response_grammar.h): what the content must be; tool calls are
  // constrained when forced or when their tool is strict.
  enum class Format { Text, JsonObject, JsonSchema };
  Format format = Format::Text;
  nlohmann::ordered_json schema;  // JsonSchema
  bool parallel_tool_calls = true;
  SamplingParams sampling;
  std::optional<int64_t> max_tokens;  // nullopt: up to the context limit
  std::vector<std::string> stop;
  std::string prompt_param = "messages";  // the request field that errors about the prompt name
};

// A generation's output, decoded: what a protocol adapter formats.
struct OutputEvent {
  enum Kind { Token, Done, Error } kind = Token;
  GeneratedToken token;             // Token: the sampled token (id -1: the final flush of held-back text)
  std::vector<OutputDelta> deltas;  // Token, Done: parsed output (chat: reasoning, content, tool calls;
                                    // text and token prompts: the text as content)
  GenerationStats stats;            // Done (finish == Cancelled: the client went away or the server stops)
  int status = 0;                   // Error: HTTP status (400 for a prompt found bad late, 500 otherwise)
  std::string message;              // Error
};

// One queued or running generation, seen from the HTTP thread that answers it.
class Generation {
 public:
  Generation(std::shared_ptr<Job> job, bool chat, const GenerationPrompt& prompt, const nlohmann::ordered_json& tools,
             const ModelFormat& format);

  // Waits up to `timeout` for the job's next events and appends them, decoded, to `out`; false on
  // timeout. After a Done or Error event finished() is true and nothing more comes.
  bool poll(std::vector<OutputEvent>& out, std::chrono::milliseconds timeout);
  void cancel();  // the client went away: the scheduler stops the generation

  bool finished() const { return finished_; }
  bool failed() const { return error_status_ != 0; }
  int error_status() const { return error_status_; }
  const std::string& error_message() const { return error_message_; }
  const GenerationStats& stats() const { return stats_; }
  int tool_calls() const { return parser_ ? parser_->tool_calls() : 0; }

 private:
  OutputEvent decode(JobEvent& ev);

  std::shared_ptr<Job> job_;
  std::optional<OutputParser> parser_;  // chat only
  std::vector<OutputDelta> pending_;    // deltas of the forced call prefix (normally none)
  bool finished_ = false;
  int error_status_ = 0;
  std::string error_message_;
  GenerationStats stats_;
};

class GenerationCore {
 public:
  GenerationCore(std::shared_ptr<Backend> backend, std::shared_ptr<const Tokenizer> tokenizer,
                 std::shared_ptr<const ChatTemplate> chat_template, const ModelFormat& format,
                 SchedulerOptions options, Metrics* metrics);
  ~GenerationCore();

  // Renders, tokenizes, checks and queues `spec`. Throws ApiError: 400 for a prompt that cannot be
  // rendered, is empty or does not fit the context, or a schema that cannot be enforced (param names
  // the schema's field, the message its keyword and JSON pointer), 429 when the queue is full.
  std::shared_ptr<Generation> start(const GenerationSpec& spec);
  bool busy() const;  // the queue is full: start() would answer 429
  const ModelConfig& config() const;
  void stop();  // cancels the queued and running generations

 private:
  std::vector<int32_t> prompt_tokens(const GenerationSpec& spec, GenerationPrompt& prompt) const;
  // The constraint of `spec` after `prompt` (null when nothing is constrained).
  std::shared_ptr<TokenConstraint> constraint(const GenerationSpec& spec, const GenerationPrompt& prompt);
  grammar::GrammarCache& grammars();

  std::shared_ptr<Backend> backend_;
  std::shared_ptr<const Tokenizer> tok_;
  std::shared_ptr<const ChatTemplate> tmpl_;
  const ModelFormat& format_;
  SchedulerOptions opts_;
  std::vector<int32_t> eos_;
  int32_t boundary_ = -1;
  std::unique_ptr<Scheduler> sched_;
  // Compiled grammars by request constraints, with the vocabulary trie and the token classes every
  // schema shares: built by the first constrained request (~0.15 s of CPU on the Qwen3 vocabulary).
  std::once_flag grammars_once_;
  std::unique_ptr<grammar::GrammarCache> grammars_;
};

}  // namespace lilac::server
