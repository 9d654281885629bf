#include "server/generation.h"

#include "core/error.h"
#include "engine/backend.h"
#include "engine/validate.h"
#include "server/api_error.h"
#include "text/chat_template.h"
#include "text/model_format.h"
#include "text/tokenizer.h"

namespace lilac::server {

// ------------------------------------------------------------------------------------------- Generation

Generation::Generation(std::shared_ptr<Job> job, bool chat, const GenerationPrompt& prompt,
                       const nlohmann::ordered_json& tools, const ModelFormat& format)
    : job_(std::move(job)) {
  prompt_tokens_ = int64_t(job_->req.prompt.size());
  if (!chat) return;
  parser_.emplace(prompt.in_reasoning, tools, format);
  if (!prompt.call_prefix.empty()) pending_ = parser_->push(prompt.call_prefix);  // normally nothing comes out yet
}

void Generation::set_reasoning_budget(ReasoningBudget budget) { budget_ = std::move(budget); }

void Generation::cancel() {
  cancelled_ = true;
  std::lock_guard lk(job_mu_);
  job_->cancel = true;
}

// A budgeted generation whose job ended on its token limit: queues the continuation from where it
// stopped (closing the reasoning when it is still open) and returns true; false when the generation
// ends here. The closing markup goes through the parser (it yields no text, only the switch).
bool Generation::continue_after(const GenerationStats& st, std::vector<OutputDelta>& deltas) {
  if (!budget_ || !parser_ || cancelled_.load() || st.finish != FinishReason::Length) return false;
  const int64_t used = acc_.completion_tokens + st.completion_tokens;
  if (used >= budget_->max_total) return false;
  GenerationRequest req = job_->req;
  req.prompt.insert(req.prompt.end(), generated_.begin(), generated_.end());
  if (!continued_ && parser_->in_reasoning()) {
    req.prompt.insert(req.prompt.end(), budget_->close_ids.begin(), budget_->close_ids.end());
    for (auto& d : parser_->push(budget_->close_text)) deltas.push_back(std::move(d));
  }
  req.max_tokens = budget_->max_total - used;
  generated_.clear();
  auto next = std::make_shared<Job>(std::move(req));
  if (!budget_->submit(next)) return false;  // queue full: the generation ends on its limit
  if (!continued_) {
    acc_.prompt_tokens = st.prompt_tokens;
    acc_.cached_tokens = st.cached_tokens;
    acc_.ttft_seconds = st.ttft_seconds;
    acc_.cache_hit = st.cache_hit;
  }
  acc_.completion_tokens += st.completion_tokens;
  acc_.prefill_seconds += st.prefill_seconds;
  acc_.decode_seconds += st.decode_seconds;
  acc_.snapshots_taken += st.snapshots_taken;
  continued_ = true;
  std::lock_guard lk(job_mu_);
  job_ = std::move(next);
  if (cancelled_.load()) job_->cancel = true;
  return true;
}

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
      if (budget_ && out.token.id >= 0) generated_.push_back(out.token.id);
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
      if (continue_after(ev.stats, out.deltas)) {
        out.kind = OutputEvent::Token;  // no token (id -1, no text): only the deltas, if any
        break;
      }
      out.kind = OutputEvent::Done;
      finished_ = true;
      stats_ = ev.stats;
      if (continued_) {  // the whole generation's counts
        stats_.prompt_tokens = acc_.prompt_tokens;
        stats_.cached_tokens = acc_.cached_tokens;
        stats_.ttft_seconds = acc_.ttft_seconds;
        stats_.cache_hit = acc_.cache_hit;
        stats_.completion_tokens += acc_.completion_tokens;
        stats_.prefill_seconds += acc_.prefill_seconds;
        stats_.decode_seconds += acc_.decode_seconds;
        stats_.snapshots_taken += acc_.snapshots_taken;
      }
      out.stats = stats_;
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
  std::vector<JobEvent> evs;
  const bool got = job_->pop_all(evs, timeout);  // job_ is replaced only on this thread
  for (auto& e : evs) {
    if (finished_) break;
    OutputEvent o = decode(e);
    if (o.kind == OutputEvent::Token && o.token.id < 0 && o.token.text.empty() && o.deltas.empty()) continue;
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

const ModelConfig& GenerationCore::config() const { return backend_->config(); }

std::vector<int32_t> GenerationCore::prompt_tokens(const GenerationSpec& spec, GenerationPrompt& prompt) const {
  switch (spec.input) {
    case GenerationSpec::Input::Tokens: return spec.tokens;
    case GenerationSpec::Input::Text: return tok_->encode(spec.text, true);
    case GenerationSpec::Input::Chat: break;
  }
  std::string text;
  try {
    text = render_chat_request(*tmpl_, spec.chat);
  } catch (const Error& e) {  // InputError or a template error (raise_exception)
    throw ApiError(400, std::string("Cannot render the conversation with the model's chat template: ") + e.what(),
                   "messages", "invalid_messages");
  }
  prompt = format_.generation_prompt(std::move(text), spec.force_tool_call, spec.forced_function);
  return tok_->encode(prompt.text, true);
}

int64_t GenerationCore::count_prompt_tokens(const GenerationSpec& spec) const {
  GenerationPrompt prompt;
  return int64_t(prompt_tokens(spec, prompt).size());
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
      case Invalid::BadMaxTokens: throw ApiError(400, bad->message, spec.max_tokens_param, "invalid_value");
      case Invalid::TotalTooLong:
        throw ApiError(400, bad->message, spec.max_tokens_param, "context_length_exceeded");
      default: throw ApiError(400, bad->message, spec.prompt_param, "context_length_exceeded");
    }
  }
  if (Check bad = check_token_ids(ids, backend_->config().vocab_size)) throw ApiError(400, bad->message, "prompt");

  // A reasoning budget applies when the model starts inside its reasoning and the budget is below the
  // limit: the first job stops at the budget (see Generation::continue_after).
  const bool budgeted = chat && prompt.in_reasoning && spec.reasoning_budget && *spec.reasoning_budget < max_tokens;
  GenerationRequest gr;
  gr.prompt = std::move(ids);
  gr.sampling = spec.sampling;
  gr.max_tokens = budgeted ? *spec.reasoning_budget : max_tokens;
  gr.stop_ids = eos_;
  gr.stop_strings = spec.stop;
  gr.boundary_token = chat ? boundary_ : -1;
  gr.draft_tokens = opts_.spec_tokens;
  auto job = std::make_shared<Job>(std::move(gr));
  auto gen = std::make_shared<Generation>(job, chat, prompt, spec.tools, format_);
  if (budgeted) {
    ReasoningBudget b;
    b.max_total = max_tokens;
    b.close_text = format_.force_close_reasoning();
    b.close_ids = tok_->encode(b.close_text, true);
    Scheduler* sched = sched_.get();
    b.submit = [sched](std::shared_ptr<Job> j) { return sched->submit(std::move(j)); };
    gen->set_reasoning_budget(std::move(b));
  }
  if (!sched_->submit(job))
    throw ApiError(429,
                   "The server is busy: " + std::to_string(opts_.max_queue) +
                       " requests are already queued or running. Retry later.",
                   "", "queue_full");
  return gen;
}

}  // namespace lilac::server
