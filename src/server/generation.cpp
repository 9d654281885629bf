#include "server/generation.h"

#include "core/error.h"
#include "core/log.h"
#include "engine/backend.h"
#include "engine/grammar_constraint.h"
#include "engine/validate.h"
#include "grammar/cache.h"
#include "grammar/response_grammar.h"
#include "server/api_error.h"
#include "text/chat_template.h"
#include "text/model_format.h"
#include "text/tokenizer.h"

namespace lilac::server {

// ------------------------------------------------------------------------------------------- Generation

Generation::Generation(std::shared_ptr<Job> job, bool chat, const GenerationPrompt& prompt,
                       const nlohmann::ordered_json& tools, const ModelFormat& format)
    : job_(std::move(job)) {
  if (!chat) return;
  parser_.emplace(prompt.in_reasoning, tools, format);
  if (!prompt.call_prefix.empty()) pending_ = parser_->push(prompt.call_prefix);  // normally nothing comes out yet
}

void Generation::cancel() { job_->cancel = true; }

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
    const std::string param = e.param().empty() ? "response_format" : e.param();
    throw ApiError(400, "Invalid schema for '" + param + "': " + e.what(), param, "invalid_schema");
  }
  return std::make_shared<GrammarConstraint>(std::move(g), eos_);
}

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
  gr.constraint = constraint(spec, prompt);
  gr.draft_tokens = opts_.spec_tokens;  // not used under a constraint (Sequence::draft_budget)
  auto job = std::make_shared<Job>(std::move(gr));
  auto gen = std::make_shared<Generation>(job, chat, prompt, spec.tools, format_);
  if (!sched_->submit(job))
    throw ApiError(429,
                   "The server is busy: " + std::to_string(opts_.max_queue) +
                       " requests are already queued or running. Retry later.",
                   "", "queue_full");
  return gen;
}

}  // namespace lilac::server
