#include "server/openai_format.h"

#include "server/openai_schema.h"
#include "text/tokenizer.h"
#include "text/unicode.h"

namespace lilac::server {

using json = nlohmann::json;

namespace {

json bytes_of(const std::string& s) {
  json b = json::array();
  for (unsigned char ch : s) b.push_back(int(ch));
  return b;
}

// What a body and a stream chunk start with; `object` names which.
json response_header(const ResponseMeta& meta, const char* object) {
  json h;
  h["id"] = meta.id;
  h["object"] = object;
  h["created"] = meta.created;
  h["model"] = meta.model;
  h["system_fingerprint"] = "lilac";
  return h;
}

// A stream chunk's header ("usage": null on every chunk when the usage chunk was asked for).
json chunk_header(const ResponseMeta& meta, bool chat) {
  json c = response_header(meta, chat ? "chat.completion.chunk" : "text_completion");
  if (meta.include_usage) c["usage"] = nullptr;
  if (meta.route_field) c["lilac_route"] = "local";
  return c;
}

json usage_json(int64_t prompt, int64_t completion, int64_t cached) {
  return json{{"prompt_tokens", prompt},
              {"completion_tokens", completion},
              {"total_tokens", prompt + completion},
              {"prompt_tokens_details", json{{"cached_tokens", cached}}}};
}

// The end of a stream after the finish chunk(s): the usage chunk (when asked) and [DONE].
std::string stream_end(const ResponseMeta& meta, bool chat, const json& usage) {
  std::string out;
  if (meta.include_usage) {
    json u = chunk_header(meta, chat);
    u["choices"] = json::array();
    u["usage"] = usage;
    out += sse_data(u);
  }
  return out + "data: [DONE]\n\n";
}

// What chat and legacy completions responses share: the chunk header, usage, the finish reason.
class OpenAIFormatter : public ResponseFormatter {
 public:
  OpenAIFormatter(ResponseMeta meta, const Tokenizer& tok, bool chat) : meta_(std::move(meta)), tok_(tok), chat_(chat) {}

  std::string error_body(const ApiError& e) const override { return dump_json(server::error_body(e)); }

  std::string finish_reason() const override {
    if (stats_.finish == FinishReason::Length) return "length";
    if (chat_ && n_tool_calls_ > 0) return "tool_calls";
    return "stop";
  }

 protected:
  json chunk_base() const { return chunk_header(meta_, chat_); }

  json body_base() const { return response_header(meta_, chat_ ? "chat.completion" : "text_completion"); }

  json usage() const { return usage_json(stats_.prompt_tokens, stats_.completion_tokens, stats_.cached_tokens); }

  // The stream's end (for a request of several choices, once after the last: openai_choices_join).
  std::string stream_tail() const { return meta_.stream_tail ? stream_end(meta_, chat_, usage()) : ""; }

  static std::string stream_error(const OutputEvent& ev) {
    return sse_data(server::error_body(ev.status, ev.message)) + "data: [DONE]\n\n";
  }

  // Records what finish_reason() and usage() need.
  void note(const OutputEvent& ev) {
    for (const auto& d : ev.deltas) n_tool_calls_ += d.kind == OutputDelta::ToolCall && d.tool_start();
    if (ev.kind == OutputEvent::Done) stats_ = ev.stats;
  }

  ResponseMeta meta_;
  const Tokenizer& tok_;
  bool chat_;
  GenerationStats stats_;
  int n_tool_calls_ = 0;
};

// ------------------------------------------------------------------------------------------- chat

class ChatFormatter final : public OpenAIFormatter {
 public:
  ChatFormatter(ResponseMeta meta, const Tokenizer& tok) : OpenAIFormatter(std::move(meta), tok, true) {}

  std::string stream_start() override {
    json c = chunk_base();
    c["choices"] = json::array({json{{"index", meta_.index},
                                     {"delta", json{{"role", "assistant"}, {"content", ""}}},
                                     {"logprobs", nullptr},
                                     {"finish_reason", nullptr}}});
    return sse_data(c);
  }

  std::string stream_event(const OutputEvent& ev) override {
    note(ev);
    std::string out;
    switch (ev.kind) {
      case OutputEvent::Token:
        add_logprobs(ev.token);
        for (const auto& d : ev.deltas) {
          accumulate(d);
          out += delta_chunk(d);
        }
        return out;
      case OutputEvent::Error: return stream_error(ev);
      case OutputEvent::Done: break;
    }
    if (ev.stats.finish == FinishReason::Cancelled) return out;
    for (const auto& d : ev.deltas) {
      accumulate(d);
      out += delta_chunk(d);
    }
    out += logprob_tail();
    json c = chunk_base();
    c["choices"] = json::array(
        {json{{"index", meta_.index}, {"delta", json::object()}, {"logprobs", nullptr}, {"finish_reason", finish_reason()}}});
    out += sse_data(c);
    return out + stream_tail();
  }

  void add(const OutputEvent& ev) override {
    note(ev);
    if (ev.kind == OutputEvent::Token) add_logprobs(ev.token);
    if (ev.kind != OutputEvent::Error)
      for (const auto& d : ev.deltas) accumulate(d);
  }

  std::string body() const override {
    json b = body_base();
    json msg;
    msg["role"] = "assistant";
    const bool calls = !tool_calls_.empty();
    msg["content"] = (calls && content_.empty()) ? json(nullptr) : json(content_);
    if (!reasoning_.empty()) msg["reasoning_content"] = reasoning_;
    if (calls) msg["tool_calls"] = tool_calls_;
    msg["refusal"] = nullptr;
    json choice;
    choice["index"] = meta_.index;
    choice["message"] = std::move(msg);
    choice["logprobs"] = meta_.logprobs ? json{{"content", logprobs_}, {"refusal", nullptr}} : json(nullptr);
    choice["finish_reason"] = finish_reason();
    b["choices"] = json::array({std::move(choice)});
    b["usage"] = usage();
    if (meta_.route_field) b["lilac_route"] = "local";
    return dump_json(b);
  }

 private:
  json logprob_entry(const TokenChoice& c) const {
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

  void add_logprobs(const GeneratedToken& t) {
    if (!meta_.logprobs || t.id < 0) return;
    json e = logprob_entry(t.choice);
    logprobs_.push_back(e);
    pending_logprobs_.push_back(std::move(e));
  }

  void accumulate(const OutputDelta& d) {
    switch (d.kind) {
      case OutputDelta::Content: content_ += d.text; break;
      case OutputDelta::Reasoning: reasoning_ += d.text; break;
      case OutputDelta::ToolCall: {
        if (!d.tool_start()) {  // the next piece of the last call's arguments
          if (!tool_calls_.empty()) tool_calls_.back()["function"]["arguments"].get_ref<std::string&>() += d.arguments;
          break;
        }
        json call;
        call["id"] = d.tool_id;
        call["type"] = "function";
        call["function"] = json{{"name", d.tool_name}, {"arguments", d.arguments}};
        tool_calls_.push_back(std::move(call));
        break;
      }
    }
  }

  std::string delta_chunk(const OutputDelta& d) {
    json delta = json::object();
    switch (d.kind) {
      case OutputDelta::Content: delta["content"] = d.text; break;
      case OutputDelta::Reasoning: delta["reasoning_content"] = d.text; break;
      case OutputDelta::ToolCall:  // the call's first chunk names it; the next ones carry argument pieces
        delta["tool_calls"] = json::array(
            {d.tool_start() ? json{{"index", d.tool_index},
                                   {"id", d.tool_id},
                                   {"type", "function"},
                                   {"function", json{{"name", d.tool_name}, {"arguments", d.arguments}}}}
                            : json{{"index", d.tool_index}, {"function", json{{"arguments", d.arguments}}}}});
        break;
    }
    json choice{{"index", meta_.index}, {"delta", std::move(delta)}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
    if (!pending_logprobs_.empty() && d.kind != OutputDelta::ToolCall) {
      choice["logprobs"] = json{{"content", std::move(pending_logprobs_)}, {"refusal", nullptr}};
      pending_logprobs_ = json::array();
    }
    json c = chunk_base();
    c["choices"] = json::array({std::move(choice)});
    return sse_data(c);
  }

  // Pending logprobs in an empty-delta chunk.
  std::string logprob_tail() {
    if (pending_logprobs_.empty()) return "";
    json c = chunk_base();
    c["choices"] = json::array({json{{"index", meta_.index},
                                     {"delta", json::object()},
                                     {"logprobs", json{{"content", std::move(pending_logprobs_)}, {"refusal", nullptr}}},
                                     {"finish_reason", nullptr}}});
    pending_logprobs_ = json::array();
    return sse_data(c);
  }

  std::string content_, reasoning_;
  json tool_calls_ = json::array();
  json logprobs_ = json::array();          // every entry (not streaming)
  json pending_logprobs_ = json::array();  // streaming: not yet sent
};

// ------------------------------------------------------------------------------------------- completions

class CompletionFormatter final : public OpenAIFormatter {
 public:
  CompletionFormatter(ResponseMeta meta, const Tokenizer& tok) : OpenAIFormatter(std::move(meta), tok, false) {}

  std::string stream_start() override { return ""; }

  std::string stream_event(const OutputEvent& ev) override {
    note(ev);
    std::string out;
    if (meta_.echo && !echoed_ && ev.kind != OutputEvent::Error) out += text_chunk(echo(ev));
    switch (ev.kind) {
      case OutputEvent::Token: {
        const GeneratedToken& t = ev.token;
        add_logprobs(t);
        if (!t.text.empty() || (meta_.logprobs && !lp_tokens_.empty())) out += text_chunk(t.text);
        return out;
      }
      case OutputEvent::Error: return stream_error(ev);
      case OutputEvent::Done: break;
    }
    if (ev.stats.finish == FinishReason::Cancelled) return out;
    if (meta_.logprobs && !lp_tokens_.empty()) out += text_chunk("");
    json c = chunk_base();
    c["choices"] = json::array(
        {json{{"text", ""}, {"index", meta_.index}, {"logprobs", nullptr}, {"finish_reason", finish_reason()}}});
    out += sse_data(c);
    return out + stream_tail();
  }

  void add(const OutputEvent& ev) override {
    note(ev);
    if (meta_.echo && !echoed_ && ev.kind != OutputEvent::Error) content_ += echo(ev);
    if (ev.kind != OutputEvent::Token) return;
    add_logprobs(ev.token);
    content_ += ev.token.text;
  }

  std::string body() const override {
    json b = body_base();
    json choice;
    choice["index"] = meta_.index;
    choice["text"] = content_;
    choice["logprobs"] = meta_.logprobs ? json{{"tokens", lp_tokens_},
                                               {"token_logprobs", lp_values_},
                                               {"top_logprobs", lp_top_},
                                               {"text_offset", lp_offsets_}}
                                        : json(nullptr);
    choice["finish_reason"] = finish_reason();
    b["choices"] = json::array({std::move(choice)});
    b["usage"] = usage();
    if (meta_.route_field) b["lilac_route"] = "local";
    return dump_json(b);
  }

 private:
  // The prompt's echo, at the generation's first event: its text (the tokens' bytes), and with logprobs an entry
  // per prompt token (scores from the event, which then holds them: the first is null, as OpenAI's).
  std::string echo(const OutputEvent& ev) {
    echoed_ = true;
    std::string text;
    const std::vector<TokenChoice>* scores = ev.prompt_scores ? &*ev.prompt_scores : nullptr;
    for (size_t i = 0; i < meta_.echo_ids.size(); ++i) {
      const std::string& tb = tok_.token_bytes(meta_.echo_ids[i]);
      if (meta_.logprobs) push_entry(tb, i > 0 && scores && i - 1 < scores->size() ? &(*scores)[i - 1] : nullptr);
      text += tb;
    }
    return text;
  }

  // A token as the completions logprobs name it: its text, or "bytes:\\xe2\\x82" (OpenAI's spelling) when its bytes
  // are not whole UTF-8 characters (as text, every such token read "\ufffd": the top_logprobs of a CJK or emoji
  // token had one key for several alternatives).
  static std::string label(const std::string& bytes) {
    if (unicode::is_valid_utf8(bytes)) return bytes;
    std::string out = "bytes:";
    char hex[5];
    for (unsigned char c : bytes) {
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    }
    return out;
  }

  json top_json(const std::vector<TokenLogprob>& top) const {
    json j = json::object();
    for (size_t i = 0; i < top.size() && int(i) < meta_.top_logprobs; ++i) {
      const std::string key = label(tok_.token_bytes(top[i].token));
      if (!j.contains(key)) j[key] = top[i].logprob;  // two ids with the same bytes: the more likely one
    }
    return j;
  }

  // One logprobs entry: a token's bytes and its choice (null: an unscored prompt token). Its text_offset is the
  // index of the character its first byte belongs to, counted over the tokens' own bytes (the text emitted so far
  // lags behind them where text is held back for a stop string or an incomplete character), in characters as
  // OpenAI's.
  void push_entry(const std::string& token_bytes, const TokenChoice* c) {
    lp_tokens_.push_back(label(token_bytes));
    lp_values_.push_back(c ? json(c->logprob) : json(nullptr));
    lp_top_.push_back(c && meta_.top_logprobs > 0 ? top_json(c->top) : json(nullptr));
    const bool continues = !token_bytes.empty() && (static_cast<unsigned char>(token_bytes[0]) & 0xC0) == 0x80;
    lp_offsets_.push_back(continues && text_offset_ > 0 ? text_offset_ - 1 : text_offset_);
    text_offset_ += unicode::utf8_chars(token_bytes);
  }

  void add_logprobs(const GeneratedToken& t) {
    if (meta_.logprobs && t.id >= 0) push_entry(tok_.token_bytes(t.id), &t.choice);
  }

  std::string text_chunk(const std::string& text) {
    json choice{{"text", text}, {"index", meta_.index}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
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

  std::string content_;
  json lp_tokens_ = json::array(), lp_values_ = json::array(), lp_top_ = json::array(), lp_offsets_ = json::array();
  int64_t text_offset_ = 0;
  bool echoed_ = false;
};

}  // namespace

ChoicesJoin openai_choices_join(const ResponseMeta& meta, bool chat, int n) {
  // Each prompt (and its cached part) once, every choice's completion.
  auto usage = [n](const std::vector<GenerationStats>& st) {
    int64_t prompt = 0, completion = 0, cached = 0;
    for (size_t i = 0; i < st.size(); ++i) {
      completion += st[i].completion_tokens;
      if (i % size_t(std::max(1, n)) == 0) {
        prompt += st[i].prompt_tokens;
        cached += st[i].cached_tokens;
      }
    }
    return usage_json(prompt, completion, cached);
  };
  ChoicesJoin j;
  j.body = [usage](const std::vector<std::string>& bodies, const std::vector<GenerationStats>& st) {
    json b = json::parse(bodies.front());
    json choices = json::array();
    for (const auto& text : bodies) choices.push_back(json::parse(text)["choices"][0]);
    b["choices"] = std::move(choices);
    b["usage"] = usage(st);
    return dump_json(b);
  };
  j.stream_tail = [meta, chat, usage](const std::vector<GenerationStats>& st) { return stream_end(meta, chat, usage(st)); };
  return j;
}

std::shared_ptr<ResponseFormatter> make_chat_formatter(ResponseMeta meta, const Tokenizer& tok) {
  return std::make_shared<ChatFormatter>(std::move(meta), tok);
}

std::shared_ptr<ResponseFormatter> make_completion_formatter(ResponseMeta meta, const Tokenizer& tok) {
  return std::make_shared<CompletionFormatter>(std::move(meta), tok);
}

}  // namespace lilac::server
