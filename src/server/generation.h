// The server's protocol-neutral generation core. A protocol adapter (server/openai_api.cpp today;
// Anthropic Messages and OpenAI Responses can be added the same way) validates its request and
// translates it into a GenerationSpec; GenerationCore::start renders the conversation with the chat
// template, shapes the prompt with the model format (open reasoning, a forced tool call:
// text/model_format.h), tokenizes it, checks it against the context and queues a Job on the Scheduler.
// The Generation it returns yields the job's events decoded into OutputEvents (reasoning / content /
// tool-call deltas, per-token logprobs, the end), which the adapter's ResponseFormatter turns into its
// protocol's bytes (server/http_response.h sends them).
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
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
class SpecialTokenGuard;
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
  // Chat: the conversation ends with an assistant message that the model continues (a prefill): it is
  // rendered without its end of turn and without a generation prompt, and the output is what follows it.
  // The adapters allow it only with free content and no forced call (its content already began).
  bool continue_final = false;
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
  // Score the prompt (GenerationRequest::prompt_logprobs: -1 off, else the alternatives per token, 0..20): the
  // scores come as OutputEvent::prompt_scores. max_tokens may then be 0 (score only).
  int prompt_logprobs = -1;
  // Chat with reasoning on: at most this many generated tokens are spent inside the reasoning block;
  // when the budget runs out with the reasoning still open, the core closes it (ModelFormat::
  // force_close_reasoning: its tokens are forced as the next choices, and count) and the model goes on
  // with its answer in the same generation, within max_tokens in all (engine/reasoning_budget.h).
  // nullopt: no budget.
  std::optional<int64_t> reasoning_budget;
  std::string prompt_param = "messages";  // the request field that errors about the prompt name
  std::string max_tokens_param = "max_tokens";  // the request field that errors about max_tokens name
  // The request fields that schema errors name (a protocol's spelling of the content schema and of a
  // tool's parameters inside tools[i]).
  std::string schema_param = "response_format.json_schema.schema";
  std::string tool_schema_field = "function.parameters";
};

// A generation's output, decoded: what a protocol adapter formats.
struct OutputEvent {
  enum Kind { Token, Done, Error } kind = Token;
  GeneratedToken token;             // Token: the sampled token (id -1: the final flush of held-back text, or
                                    // the prompt's scores below)
  // Token (id -1, no text), once before the first token when GenerationSpec::prompt_logprobs >= 0: entry i is the
  // score of prompt token i + 1 (Generation::prompt_ids()).
  std::optional<std::vector<TokenChoice>> prompt_scores;
  bool reasoning = false;           // Token: generated inside the reasoning block (its markup included)
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
  // Ends the generation with an error instead (the server stops): the scheduler stops it at its next
  // step and its end comes as an Error event with `status` and `message` (unless it ended already).
  void abort(int status, const std::string& message);
  bool started() const;  // the scheduler took it from its queue

  bool finished() const { return finished_; }
  bool failed() const { return error_status_ != 0; }
  int error_status() const { return error_status_; }
  const std::string& error_message() const { return error_message_; }
  const GenerationStats& stats() const { return stats_; }
  int tool_calls() const { return parser_ ? parser_->tool_calls() : 0; }
  int64_t prompt_tokens() const { return prompt_tokens_; }  // the prompt's length, known at once
  // The prompt's token ids (as tokenized and shaped for the model).
  const std::vector<int32_t>& prompt_ids() const { return job_->req.prompt; }

 private:
  OutputEvent decode(JobEvent& ev);

  std::shared_ptr<Job> job_;
  int64_t prompt_tokens_ = 0;
  std::atomic<int> abort_status_{0};
  std::mutex abort_mu_;
  std::string abort_message_;
  std::optional<OutputParser> parser_;  // chat only
  std::vector<OutputDelta> pending_;    // deltas of the forced call prefix (normally none)
  bool finished_ = false;
  int error_status_ = 0;
  std::string error_message_;
  GenerationStats stats_;
};

// Prompt scoring (GenerationSpec::prompt_logprobs): at most this many entries (prompt tokens × (1 + alternatives),
// summed over a request's prompts and choices) per request: 400 above (each is held, then answered as JSON).
constexpr int64_t kMaxPromptScoreEntries = int64_t(1) << 22;

class GenerationCore {
 public:
  GenerationCore(std::shared_ptr<Backend> backend, std::shared_ptr<const Tokenizer> tokenizer,
                 std::shared_ptr<const ChatTemplate> chat_template, const ModelFormat& format,
                 SchedulerOptions options, Metrics* metrics);
  ~GenerationCore();

  // Renders, tokenizes, checks and queues `spec`. Throws ApiError: 400 for a prompt that cannot be
  // rendered, is empty or does not fit the context, or a schema that cannot be enforced (param names
  // the schema's field, the message its keyword and JSON pointer), 429 when the queue is full, 503 once
  // shutting down.
  std::shared_ptr<Generation> start(const GenerationSpec& spec);
  // `n` generations of each of `specs` (choice i of a spec sampled with seed + i; generation k·n + i is spec k's
  // choice i), each spec rendered and checked once, all admitted to the queue together: all or none (429).
  std::vector<std::shared_ptr<Generation>> start_choices(std::span<const GenerationSpec> specs, int n);
  // The prompt's length in tokens once rendered and shaped as start() would (nothing is queued).
  // Throws ApiError 400 for a prompt that cannot be rendered.
  int64_t count_prompt_tokens(const GenerationSpec& spec) const;
  // Those tokens (what start() would feed the model for `spec`).
  std::vector<int32_t> prompt_ids(const GenerationSpec& spec) const;
  const ChatTemplate& chat_template() const { return *tmpl_; }
  bool busy() const;  // the queue is full: start() would answer 429
  const ModelConfig& config() const;
  // Shutdown: start() refuses (503) from now on, and the generations still queued end with 503.
  void begin_shutdown();
  // Generations whose Generation object is alive (their answer is still being sent).
  size_t active() const;
  // Ends every live generation with an error (Generation::abort).
  void abort_all(int status, const std::string& message);
  void stop();  // cancels the queued and running generations

 private:
  std::vector<int32_t> prompt_tokens(const GenerationSpec& spec, GenerationPrompt& prompt) const;
  // Renders and checks `spec` and appends its `n` choices' jobs and generations.
  void make_choices(const GenerationSpec& spec, int n, std::vector<std::shared_ptr<Job>>& jobs,
                    std::vector<std::shared_ptr<Generation>>& gens);
  std::vector<std::shared_ptr<Generation>> live() const;
  // The constraint of `spec` after `prompt` (null when nothing is constrained).
  std::shared_ptr<TokenConstraint> constraint(const GenerationSpec& spec, const GenerationPrompt& prompt);
  grammar::GrammarCache& grammars();

  std::shared_ptr<Backend> backend_;
  std::shared_ptr<const Tokenizer> tok_;
  std::shared_ptr<const ChatTemplate> tmpl_;
  std::unique_ptr<SpecialTokenGuard> guard_;  // request text never becomes special tokens
  const ModelFormat& format_;
  SchedulerOptions opts_;
  std::vector<int32_t> eos_;
  int32_t boundary_ = -1;
  std::unique_ptr<Scheduler> sched_;
  mutable std::mutex live_mu_;
  std::vector<std::weak_ptr<Generation>> live_;
  std::atomic<bool> shutting_down_{false};
  // Compiled grammars by request constraints, with the vocabulary trie and the token classes every
  // schema shares: built by the first constrained request (~0.15 s of CPU on the Qwen3 vocabulary).
  std::once_flag grammars_once_;
  std::unique_ptr<grammar::GrammarCache> grammars_;
};

}  // namespace lilac::server
