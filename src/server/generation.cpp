#include "server/generation.h"

#include "core/error.h"
#include "engine/backend.h"
#include "engine/validate.h"
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
        append(parser_->push(out.token.text));
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
      out.stats = ev.stats;
      if (parser_) append(parser_->finish());
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
    out.push_back(decode(e));
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
    text = render_chat_request(*tmpl_, request);
  } catch (const Error& e) {  // InputError or a template error (raise_exception)
    throw ApiError(400, std::string("Cannot render the conversation with the model's chat template: ") + e.what(),
                   "messages", "invalid_messages");
  }
  prompt = format_.generation_prompt(std::move(text), spec.force_tool_call, spec.forced_function);
  return guard_->encode(prompt.text);
}

std::shared_ptr<Generation> GenerationCore::start(const GenerationSpec& spec) {
  const bool chat = spec.input == GenerationSpec::Input::Chat;
  GenerationPrompt prompt;
  std::vector<int32_t> ids = prompt_tokens(spec, prompt);
  // One set of rules (engine/validate.h); the answer names the field at fault.
  const int64_t n = int64_t(ids.size());
  const int64_t max_tokens = spec.max_tokens.value_or(opts_.max_seq - n);
  if (Check bad = check_context(n, max_tokens, opts_.max_seq)) {
    switch (bad->kind) {
      case Invalid::EmptyPrompt: throw ApiError(400, bad->message, spec.prompt_param);
      case Invalid::BadMaxTokens: throw ApiError(400, bad->message, "max_tokens", "invalid_value");
      case Invalid::TotalTooLong: throw ApiError(400, bad->message, "max_tokens", "context_length_exceeded");
      default: throw ApiError(400, bad->message, spec.prompt_param, "context_length_exceeded");
    }
  }
  if (Check bad = check_token_ids(ids, backend_->config().vocab_size)) throw ApiError(400, bad->message, "prompt");

  GenerationRequest gr;
  gr.prompt = std::move(ids);
  gr.sampling = spec.sampling;
  gr.max_tokens = max_tokens;
  gr.stop_ids = eos_;
  gr.stop_strings = spec.stop;
  gr.boundary_token = chat ? boundary_ : -1;
  gr.draft_tokens = opts_.spec_tokens;
  auto job = std::make_shared<Job>(std::move(gr));
  auto gen = std::make_shared<Generation>(job, chat, prompt, spec.tools, format_);
  {
    std::lock_guard lk(live_mu_);  // with begin_shutdown's: a generation added here is seen by it
    if (shutting_down_.load())
      throw ApiError(503, "The server is shutting down; it accepts no new requests.", "", "shutting_down");
    std::erase_if(live_, [](const std::weak_ptr<Generation>& w) { return w.expired(); });
    live_.push_back(gen);
  }
  if (!sched_->submit(job))
    throw ApiError(429,
                   "The server is busy: " + std::to_string(opts_.max_queue) +
                       " requests are already queued or running. Retry later.",
                   "", "queue_full");
  return gen;
}

}  // namespace lilac::server
