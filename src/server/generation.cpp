#include "server/generation.h"

#include "core/error.h"
#include "core/log.h"
#include "engine/backend.h"
#include "engine/grammar_constraint.h"
#include "engine/reasoning_budget.h"
#include "engine/validate.h"
#include "grammar/cache.h"
#include "grammar/response_grammar.h"
#include "server/api_error.h"
#include "text/chat_template.h"
#include "text/model_format.h"
#include "text/special_text.h"
#include "text/tokenizer.h"

namespace lilac::server {

// ------------------------------------------------------------------------------------------- Generation

Generation::Generation(std::shared_ptr<Job> job, bool chat, const GenerationPrompt& prompt,
                       const nlohmann::ordered_json& tools, const ModelFormat& format)
    : job_(std::move(job)) {
  prompt_tokens_ = int64_t(job_->req.prompt.size());
  if (!chat) return;
  // Tool calls are parsed only for a request with tools (tool_choice "none" passes none): otherwise
  // text that looks like a call stays content.
  parser_.emplace(prompt.in_reasoning, tools, format, tools.is_array() && !tools.empty());
  if (!prompt.call_prefix.empty()) pending_ = parser_->push(prompt.call_prefix);  // normally nothing comes out yet
}

void Generation::cancel() { job_->cancel = true; }

void Generation::abort(int status, const std::string& message) {
  {
    std::lock_guard lk(abort_mu_);
    if (abort_status_.load()) return;
    abort_message_ = message;
  }
  abort_status_ = status;
  job_->cancel = true;
}

bool Generation::started() const { return job_->started.load(); }

OutputEvent Generation::decode(JobEvent& ev) {
  OutputEvent out;
  out.deltas = std::move(pending_);
  pending_.clear();
  auto append = [&](std::vector<OutputDelta> ds) {
    for (auto& d : ds) out.deltas.push_back(std::move(d));
  };
  switch (ev.kind) {
    case JobEvent::Token:
      out.kind = OutputEvent::Token;
      out.token = std::move(ev.token);
      if (parser_) {
        out.reasoning = parser_->in_reasoning();
        append(parser_->push(out.token.text));
        out.reasoning |= parser_->in_reasoning();
      } else if (!out.token.text.empty()) {
        OutputDelta d;
        d.text = out.token.text;
        out.deltas.push_back(std::move(d));
      }
      break;
    case JobEvent::Done:
      if (ev.stats.finish == FinishReason::Cancelled && abort_status_.load()) {
        // Stopped by Generation::abort (the server stops): an error, never a normal end.
        std::lock_guard lk(abort_mu_);
        ev.kind = JobEvent::Error;
        ev.status = abort_status_.load();
        ev.message = abort_message_;
        return decode(ev);
      }
      out.kind = OutputEvent::Done;
      finished_ = true;
      stats_ = ev.stats;
      out.stats = stats_;
      if (parser_) append(parser_->finish());
      break;
    case JobEvent::PromptScores:
      out.kind = OutputEvent::Token;  // no token (id -1, no text)
      out.prompt_scores = std::move(ev.prompt_scores);
      break;
    case JobEvent::Error:
      out.kind = OutputEvent::Error;
      finished_ = true;
      error_status_ = ev.status;
      error_message_ = ev.message;
      out.status = ev.status;
      out.message = std::move(ev.message);
      break;
  }
  return out;
}

bool Generation::poll(std::vector<OutputEvent>& out, std::chrono::milliseconds timeout) {
  if (!finished_ && abort_status_.load() && !job_->started.load()) {
    // Aborted while still queued: answered now, not when the scheduler reaches it.
    JobEvent ev;
    ev.kind = JobEvent::Done;
    ev.stats.finish = FinishReason::Cancelled;
    out.push_back(decode(ev));
    return true;
  }
  std::vector<JobEvent> evs;
  const bool got = job_->pop_all(evs, timeout);
  for (auto& e : evs) {
    if (finished_) break;
    OutputEvent o = decode(e);
    if (o.kind == OutputEvent::Token && o.token.id < 0 && o.token.text.empty() && o.deltas.empty() &&
        !o.prompt_scores)
      continue;
    out.push_back(std::move(o));
  }
  return got;
}

// ------------------------------------------------------------------------------------------- GenerationCore

GenerationCore::GenerationCore(std::shared_ptr<Backend> backend, std::shared_ptr<const Tokenizer> tokenizer,
                               std::shared_ptr<const ChatTemplate> chat_template, const ModelFormat& format,
                               SchedulerOptions options, Metrics* metrics)
    : backend_(std::move(backend)), tok_(std::move(tokenizer)), tmpl_(std::move(chat_template)), format_(format),
      opts_(options) {
  guard_ = std::make_unique<SpecialTokenGuard>(*tok_);
  eos_ = backend_->config().eos_token_ids;
  if (eos_.empty()) {
    for (const char* name : {"<|im_end|>", "<|endoftext|>"})
      if (auto id = tok_->token_id(name)) eos_.push_back(*id);
    if (auto id = tok_->token_id(tok_->eos_token()); id && !tok_->eos_token().empty()) eos_.push_back(*id);
  }
  if (auto id = tok_->token_id("<|im_end|>")) boundary_ = *id;
  sched_ = std::make_unique<Scheduler>(backend_, tok_, opts_, metrics);
}

GenerationCore::~GenerationCore() { stop(); }

grammar::GrammarCache& GenerationCore::grammars() {
  try {
    std::call_once(grammars_once_, [&] {
      grammars_ = std::make_unique<grammar::GrammarCache>(
          grammar::Vocabulary::from_tokenizer(*tok_, backend_->config().vocab_size));
      grammars_->warm();
    });
  } catch (const std::exception& e) {  // e.g. a tokenizer with more tokens than the model
    throw ApiError(500, std::string("Constrained decoding is unavailable: ") + e.what(), "", "internal_error");
  }
  return *grammars_;
}

std::shared_ptr<TokenConstraint> GenerationCore::constraint(const GenerationSpec& spec, const GenerationPrompt& prompt) {
  using grammar::ResponseSpec;
  ResponseSpec rs;
  switch (spec.format) {
    case GenerationSpec::Format::Text: rs.content = ResponseSpec::Content::Free; break;
    case GenerationSpec::Format::JsonObject: rs.content = ResponseSpec::Content::JsonObject; break;
    case GenerationSpec::Format::JsonSchema:
      rs.content = ResponseSpec::Content::JsonSchema;
      rs.schema = spec.schema;
      break;
  }
  if (spec.input == GenerationSpec::Input::Chat) {
    if (spec.tools.is_array() && !spec.tools.empty()) {
      rs.tools = spec.tools;
      rs.calls = spec.force_tool_call ? ResponseSpec::Calls::Forced : ResponseSpec::Calls::Auto;
      rs.forced_function = spec.forced_function;
    }
    rs.in_reasoning = prompt.in_reasoning;
    rs.xml_calls = format_.xml_tool_calls(prompt.text);
  }
  rs.parallel_calls = spec.parallel_tool_calls;
  if (!rs.constrained()) return nullptr;
  std::shared_ptr<const grammar::CompiledGrammar> g;
  try {
    g = grammars().get(rs.cache_key(), [&] { return grammar::build_response_grammar(rs, format_.markup(), *tok_); });
  } catch (const grammar::SchemaError& e) {
    // the grammar names OpenAI chat's fields: respell them as this request's protocol does
    std::string param = e.param().empty() ? spec.schema_param : e.param();
    static const std::string kContent = "response_format.json_schema.schema", kTool = "function.parameters";
    if (param.rfind(kContent, 0) == 0) param = spec.schema_param + param.substr(kContent.size());
    if (const size_t at = param.find("]." + kTool); param.rfind("tools[", 0) == 0 && at != std::string::npos)
      param = param.substr(0, at + 2) + spec.tool_schema_field + param.substr(at + 2 + kTool.size());
    throw ApiError(400, "Invalid schema for '" + param + "': " + e.what(), param, "invalid_schema");
  }
  return std::make_shared<GrammarConstraint>(std::move(g), eos_);
}

void GenerationCore::stop() {
  if (sched_) sched_->stop();
}

bool GenerationCore::busy() const { return sched_->full(); }

std::vector<std::shared_ptr<Generation>> GenerationCore::live() const {
  std::vector<std::shared_ptr<Generation>> out;
  std::lock_guard lk(live_mu_);
  for (const auto& w : live_)
    if (auto g = w.lock()) out.push_back(std::move(g));
  return out;
}

size_t GenerationCore::active() const { return live().size(); }

void GenerationCore::begin_shutdown() {
  {
    std::lock_guard lk(live_mu_);
    shutting_down_ = true;
  }
  for (auto& g : live())
    if (!g->started()) g->abort(503, "The server is shutting down: the request was not started. Retry on another server.");
}

void GenerationCore::abort_all(int status, const std::string& message) {
  shutting_down_ = true;
  for (auto& g : live()) g->abort(status, message);
}

const ModelConfig& GenerationCore::config() const { return backend_->config(); }

std::vector<int32_t> GenerationCore::prompt_tokens(const GenerationSpec& spec, GenerationPrompt& prompt) const {
  switch (spec.input) {
    case GenerationSpec::Input::Tokens: return spec.tokens;
    // Request text never becomes special tokens (text/special_text.h): a completions prompt is plain
    // text (send token ids for control tokens); a chat request's strings are marked before rendering.
    case GenerationSpec::Input::Text: return tok_->encode(spec.text, /*parse_special=*/false);
    case GenerationSpec::Input::Chat: break;
  }
  std::string text;
  try {
    nlohmann::ordered_json request = spec.chat;
    guard_->escape_request(request);
    if (spec.continue_final) request["add_generation_prompt"] = false;
    text = render_chat_request(*tmpl_, request);
  } catch (const Error& e) {  // InputError or a template error (raise_exception)
    throw ApiError(400, std::string("Cannot render the conversation with the model's chat template: ") + e.what(),
                   "messages", "invalid_messages");
  }
  if (spec.continue_final) {
    std::optional<std::string> open = format_.continue_final_turn(std::move(text));
    if (!open)
      throw ApiError(400, "The model's chat template does not end the final assistant message with an end of turn, so it "
                          "cannot be continued; end the conversation with a user message.",
                     "messages", "invalid_last_message");
    text = std::move(*open);
  }
  prompt = format_.generation_prompt(std::move(text), spec.force_tool_call, spec.forced_function);
  return guard_->encode(prompt.text);
}

int64_t GenerationCore::count_prompt_tokens(const GenerationSpec& spec) const {
  return int64_t(prompt_ids(spec).size());
}

std::vector<int32_t> GenerationCore::prompt_ids(const GenerationSpec& spec) const {
  GenerationPrompt prompt;
  return prompt_tokens(spec, prompt);
}

std::shared_ptr<Generation> GenerationCore::start(const GenerationSpec& spec) {
  return start_choices(std::span<const GenerationSpec>(&spec, 1), 1).front();
}

void GenerationCore::make_choices(const GenerationSpec& spec, int n, std::vector<std::shared_ptr<Job>>& jobs,
                                  std::vector<std::shared_ptr<Generation>>& gens) {
  const bool chat = spec.input == GenerationSpec::Input::Chat;
  GenerationPrompt prompt;
  std::vector<int32_t> ids = prompt_tokens(spec, prompt);
  // One set of rules (engine/validate.h); the answer names the field at fault.
  const int64_t len = int64_t(ids.size());
  const int64_t max_tokens = spec.max_tokens.value_or(opts_.max_seq - len);
  // Scoring only (max_tokens 0): the prompt must fit as it would with one token to generate.
  const bool score_only = spec.prompt_logprobs >= 0 && max_tokens == 0;
  if (Check bad = check_context(len, score_only ? 1 : max_tokens, opts_.max_seq)) {
    switch (bad->kind) {
      case Invalid::EmptyPrompt: throw ApiError(400, bad->message, spec.prompt_param);
      case Invalid::BadMaxTokens: throw ApiError(400, bad->message, spec.max_tokens_param, "invalid_value");
      case Invalid::TotalTooLong:
        throw ApiError(400, bad->message, spec.max_tokens_param, "context_length_exceeded");
      default: throw ApiError(400, bad->message, spec.prompt_param, "context_length_exceeded");
    }
  }
  if (Check bad = check_token_ids(ids, backend_->config().vocab_size)) throw ApiError(400, bad->message, "prompt");
  if (!spec.sampling.logit_bias.empty() && !backend_->supports_logit_bias())
    throw ApiError(400, "'logit_bias' is not supported by the " + backend_->name() + " backend yet.", "logit_bias",
                   "unsupported_value");

  // A reasoning budget applies when the budget is below the limit: a constraint of the generation closes the block
  // when the budget runs out (engine/reasoning_budget.h) -- the prompt's open block, or one the model opens itself at
  // the start of its output (a template that does not write "<think>" into the generation prompt), forcing the closing
  // markup early enough to end within max_tokens.
  const bool budgeted = chat && spec.reasoning_budget && *spec.reasoning_budget < max_tokens;
  std::vector<int32_t> close_ids;
  if (budgeted) close_ids = tok_->encode(format_.force_close_reasoning(), /*parse_special=*/true);
  for (int i = 0; i < n; ++i) {  // choice i: the same prompt, sampled with seed + i, its own constraint state
    GenerationRequest gr;
    gr.prompt = ids;
    gr.sampling = spec.sampling;
    gr.sampling.seed += uint64_t(i);
    gr.max_tokens = max_tokens;
    gr.stop_ids = eos_;
    gr.stop_strings = spec.stop;
    gr.boundary_token = chat ? boundary_ : -1;
    gr.constraint = constraint(spec, prompt);
    if (budgeted)  // every choice its own: the constraint counts the choice's tokens
      gr.constraint = std::make_shared<ReasoningBudgetConstraint>(*tok_, backend_->config().vocab_size,
                                                                  *spec.reasoning_budget, close_ids,
                                                                  std::string(format_.markup().think_close),
                                                                  std::move(gr.constraint),
                                                                  prompt.in_reasoning
                                                                      ? std::string()
                                                                      : std::string(format_.markup().think_open),
                                                                  max_tokens);
    gr.draft_tokens = opts_.spec_tokens;  // not used under a constraint (Sequence::draft_budget)
    gr.spec_policy = opts_.spec_policy;
    gr.prompt_logprobs = spec.prompt_logprobs;
    jobs.push_back(std::make_shared<Job>(std::move(gr)));
    gens.push_back(std::make_shared<Generation>(jobs.back(), chat, prompt, spec.tools, format_));
  }
}

std::vector<std::shared_ptr<Generation>> GenerationCore::start_choices(std::span<const GenerationSpec> specs, int n) {
  std::vector<std::shared_ptr<Job>> jobs;
  std::vector<std::shared_ptr<Generation>> gens;
  for (const GenerationSpec& spec : specs) make_choices(spec, n, jobs, gens);
  const size_t total = jobs.size();
  // More generations than the queue ever holds: no retry can succeed (a 429 would say "later" forever).
  if (total > size_t(opts_.max_queue))
    throw ApiError(400,
                   "This request needs " + std::to_string(total) + " generations at once" +
                       (specs.size() > 1 ? " (prompts × n)" : std::string()) + " and this server runs at most " +
                       std::to_string(opts_.max_queue) + " (--max-queue). Ask for fewer choices" +
                       (specs.size() > 1 ? " or send fewer prompts." : "."),
                   specs.size() > 1 ? "prompt" : "n", "invalid_value");
  // Prompt scores are held per choice until answered, then written out as JSON (~40 bytes an entry): bounded.
  int64_t entries = 0;
  for (const auto& j : jobs)
    if (j->req.prompt_logprobs >= 0) entries += int64_t(j->req.prompt.size()) * (1 + j->req.prompt_logprobs);
  if (entries > kMaxPromptScoreEntries)
    throw ApiError(400, "The prompts' log-probabilities would be " + std::to_string(entries) +
                            " entries (tokens × (1 + alternatives), over every prompt and choice); at most " +
                            std::to_string(kMaxPromptScoreEntries) + " per request. Send fewer or shorter prompts, or "
                            "fewer alternatives.",
                   "prompt", "invalid_value");
  {
    std::lock_guard lk(live_mu_);  // with begin_shutdown's: a generation added here is seen by it
    if (shutting_down_.load())
      throw ApiError(503, "The server is shutting down; it accepts no new requests.", "", "shutting_down");
    std::erase_if(live_, [](const std::weak_ptr<Generation>& w) { return w.expired(); });
    for (const auto& g : gens) live_.push_back(g);
  }
  // All choices or none (a request's choices are admitted together).
  if (!sched_->submit_all(jobs))
    throw ApiError(429,
                   "The server is busy: " + std::to_string(opts_.max_queue) +
                       " requests are already queued or running" +
                       (total > 1 ? " (this one needs " + std::to_string(total) + " places)" : std::string()) +
                       ". Retry later.",
                   "", "queue_full");
  return gens;
}

}  // namespace lilac::server
