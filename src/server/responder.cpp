#include "server/responder.h"

#include "server/openai_schema.h"
#include "text/tokenizer.h"

namespace lilac::server {

using json = nlohmann::json;

std::string dump_json(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string sse_data(const json& j) {
  std::string s = "data: ";
  s += dump_json(j);
  s += "\n\n";
  return s;
}

Responder::Responder(ResponseMeta meta, const Tokenizer& tok, bool in_reasoning, const json& tools,
                     const std::string& forced_prefix)
    : meta_(std::move(meta)), tok_(tok), parser_(in_reasoning, tools) {
  if (meta_.chat && !forced_prefix.empty()) {
    for (auto& d : parser_.push(forced_prefix)) accumulate(d);  // normally nothing comes out yet
  }
}

json Responder::chunk_base() const {
  json c;
  c["id"] = meta_.id;
  c["object"] = meta_.chat ? "chat.completion.chunk" : "text_completion";
  c["created"] = meta_.created;
  c["model"] = meta_.model;
  c["system_fingerprint"] = "lilac";
  if (meta_.include_usage) c["usage"] = nullptr;
  if (meta_.route_field) c["lilac_route"] = "local";
  return c;
}

namespace {
json bytes_of(const std::string& s) {
  json b = json::array();
  for (unsigned char ch : s) b.push_back(int(ch));
  return b;
}
}  // namespace

json Responder::logprob_entry(const TokenChoice& c) const {
  const std::string& tb = tok_.token_bytes(c.token);
  json e;
  e["token"] = tb;  // invalid UTF-8 is replaced when dumped; "bytes" keeps the exact bytes
  e["logprob"] = c.logprob;
  e["bytes"] = bytes_of(tb);
  json top = json::array();
  for (size_t i = 0; i < c.top.size() && int(i) < meta_.top_logprobs; ++i) {
    const std::string& s = tok_.token_bytes(c.top[i].token);
    top.push_back(json{{"token", s}, {"logprob", c.top[i].logprob}, {"bytes", bytes_of(s)}});
  }
  e["top_logprobs"] = std::move(top);
  return e;
}

void Responder::add_logprobs(const GeneratedToken& t) {
  if (!meta_.logprobs || t.id < 0) return;
  if (meta_.chat) {
    json e = logprob_entry(t.choice);
    logprobs_.push_back(e);
    pending_logprobs_.push_back(std::move(e));
  } else {
    const std::string& tb = tok_.token_bytes(t.id);
    lp_tokens_.push_back(tb);
    lp_values_.push_back(t.choice.logprob);
    json top = json::object();
    for (size_t i = 0; i < t.choice.top.size() && int(i) < meta_.top_logprobs; ++i)
      top[tok_.token_bytes(t.choice.top[i].token)] = t.choice.top[i].logprob;
    lp_top_.push_back(meta_.top_logprobs > 0 ? top : json(nullptr));
    lp_offsets_.push_back(text_offset_);
  }
}

void Responder::accumulate(const OutputDelta& d) {
  switch (d.kind) {
    case OutputDelta::Content: content_ += d.text; break;
    case OutputDelta::Reasoning: reasoning_ += d.text; break;
    case OutputDelta::ToolCall: {
      json call;
      call["id"] = d.tool_id;
      call["type"] = "function";
      call["function"] = json{{"name", d.tool_name}, {"arguments", d.arguments}};
      tool_calls_.push_back(std::move(call));
      break;
    }
  }
}

std::string Responder::first_sse() {
  if (!meta_.chat) return "";
  json c = chunk_base();
  c["choices"] = json::array({json{{"index", 0},
                                   {"delta", json{{"role", "assistant"}, {"content", ""}}},
                                   {"logprobs", nullptr},
                                   {"finish_reason", nullptr}}});
  return sse_data(c);
}

std::string Responder::delta_chunk(const OutputDelta& d) {
  json delta = json::object();
  switch (d.kind) {
    case OutputDelta::Content: delta["content"] = d.text; break;
    case OutputDelta::Reasoning: delta["reasoning_content"] = d.text; break;
    case OutputDelta::ToolCall:
      delta["tool_calls"] = json::array({json{{"index", d.tool_index},
                                              {"id", d.tool_id},
                                              {"type", "function"},
                                              {"function", json{{"name", d.tool_name}, {"arguments", d.arguments}}}}});
      break;
  }
  json choice{{"index", 0}, {"delta", std::move(delta)}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
  if (!pending_logprobs_.empty() && d.kind != OutputDelta::ToolCall) {
    choice["logprobs"] = json{{"content", std::move(pending_logprobs_)}, {"refusal", nullptr}};
    pending_logprobs_ = json::array();
  }
  json c = chunk_base();
  c["choices"] = json::array({std::move(choice)});
  return sse_data(c);
}

std::string Responder::text_chunk(const std::string& text) {
  json choice{{"text", text}, {"index", 0}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
  if (meta_.logprobs && !lp_tokens_.empty()) {
    choice["logprobs"] = json{{"tokens", lp_tokens_}, {"token_logprobs", lp_values_}, {"top_logprobs", lp_top_},
                              {"text_offset", lp_offsets_}};
    lp_tokens_ = json::array();
    lp_values_ = json::array();
    lp_top_ = json::array();
    lp_offsets_ = json::array();
  }
  json c = chunk_base();
  c["choices"] = json::array({std::move(choice)});
  return sse_data(c);
}

std::string Responder::logprob_tail() {
  if (pending_logprobs_.empty()) return "";
  json c = chunk_base();
  c["choices"] = json::array({json{{"index", 0},
                                   {"delta", json::object()},
                                   {"logprobs", json{{"content", std::move(pending_logprobs_)}, {"refusal", nullptr}}},
                                   {"finish_reason", nullptr}}});
  pending_logprobs_ = json::array();
  return sse_data(c);
}

std::string Responder::finish_reason() const {
  if (stats_.finish == FinishReason::Length) return "length";
  if (meta_.chat && parser_.tool_calls() > 0) return "tool_calls";
  return "stop";
}

json Responder::usage() const {
  return json{{"prompt_tokens", stats_.prompt_tokens},
              {"completion_tokens", stats_.completion_tokens},
              {"total_tokens", stats_.prompt_tokens + stats_.completion_tokens},
              {"prompt_tokens_details", json{{"cached_tokens", stats_.cached_tokens}}}};
}

std::string Responder::sse(const JobEvent& ev) {
  std::string out;
  if (finished_) return out;
  if (ev.kind == JobEvent::Token) {
    const GeneratedToken& t = ev.token;
    add_logprobs(t);
    if (meta_.chat) {
      for (auto& d : parser_.push(t.text)) {
        accumulate(d);
        out += delta_chunk(d);
      }
    } else {
      text_offset_ += int64_t(t.text.size());
      if (!t.text.empty() || (meta_.logprobs && !lp_tokens_.empty())) out += text_chunk(t.text);
    }
    return out;
  }
  finished_ = true;
  if (ev.kind == JobEvent::Error) {
    error_status_ = ev.status;
    error_message_ = ev.message;
    out += sse_data(error_body(ev.status, ev.message));
    out += "data: [DONE]\n\n";
    return out;
  }
  stats_ = ev.stats;
  if (stats_.finish == FinishReason::Cancelled) return out;
  if (meta_.chat) {
    for (auto& d : parser_.finish()) {
      accumulate(d);
      out += delta_chunk(d);
    }
    out += logprob_tail();
  } else if (meta_.logprobs && !lp_tokens_.empty()) {
    out += text_chunk("");
  }
  json c = chunk_base();
  if (meta_.chat)
    c["choices"] = json::array({json{{"index", 0}, {"delta", json::object()}, {"logprobs", nullptr},
                                     {"finish_reason", finish_reason()}}});
  else
    c["choices"] = json::array({json{{"text", ""}, {"index", 0}, {"logprobs", nullptr},
                                     {"finish_reason", finish_reason()}}});
  out += sse_data(c);
  if (meta_.include_usage) {
    json u = chunk_base();
    u["choices"] = json::array();
    u["usage"] = usage();
    out += sse_data(u);
  }
  out += "data: [DONE]\n\n";
  return out;
}

void Responder::consume(const JobEvent& ev) {
  if (finished_) return;
  if (ev.kind == JobEvent::Token) {
    const GeneratedToken& t = ev.token;
    add_logprobs(t);
    if (meta_.chat) {
      for (auto& d : parser_.push(t.text)) accumulate(d);
    } else {
      text_offset_ += int64_t(t.text.size());
      content_ += t.text;
    }
    return;
  }
  finished_ = true;
  if (ev.kind == JobEvent::Error) {
    error_status_ = ev.status;
    error_message_ = ev.message;
    return;
  }
  stats_ = ev.stats;
  if (meta_.chat)
    for (auto& d : parser_.finish()) accumulate(d);
}

json Responder::body() const {
  json b;
  b["id"] = meta_.id;
  b["object"] = meta_.chat ? "chat.completion" : "text_completion";
  b["created"] = meta_.created;
  b["model"] = meta_.model;
  b["system_fingerprint"] = "lilac";
  json choice;
  choice["index"] = 0;
  if (meta_.chat) {
    json msg;
    msg["role"] = "assistant";
    bool calls = !tool_calls_.empty();
    msg["content"] = (calls && content_.empty()) ? json(nullptr) : json(content_);
    if (!reasoning_.empty()) msg["reasoning_content"] = reasoning_;
    if (calls) msg["tool_calls"] = tool_calls_;
    msg["refusal"] = nullptr;
    choice["message"] = std::move(msg);
    choice["logprobs"] = meta_.logprobs ? json{{"content", logprobs_}, {"refusal", nullptr}} : json(nullptr);
  } else {
    choice["text"] = content_;
    choice["logprobs"] = meta_.logprobs ? json{{"tokens", lp_tokens_},
                                               {"token_logprobs", lp_values_},
                                               {"top_logprobs", lp_top_},
                                               {"text_offset", lp_offsets_}}
                                        : json(nullptr);
  }
  choice["finish_reason"] = finish_reason();
  b["choices"] = json::array({std::move(choice)});
  b["usage"] = usage();
  if (meta_.route_field) b["lilac_route"] = "local";
  return b;
}

}  // namespace lilac::server
