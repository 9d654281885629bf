#include "server/responses_format.h"

#include <exception>

#include "server/anthropic_format.h"  // sse_event
#include "server/openai_schema.h"

namespace lilac::server {

using json = nlohmann::json;

namespace {

class ResponsesFormatter final : public ResponseFormatter {
 public:
  explicit ResponsesFormatter(ResponsesMeta meta) : meta_(std::move(meta)) {}

  json object(const std::string& status, const json& error) const { return response(status, error); }

  std::string stream_start() override {
    const Unspent unspent(seq_);
    streaming_ = true;
    json r = response("in_progress");
    std::string out = event("response.created", json{{"response", r}});
    return out + event("response.in_progress", json{{"response", r}});
  }

  std::string stream_event(const OutputEvent& ev) override {
    Unspent unspent(seq_);
    if (ev.kind == OutputEvent::Error)
      return after_unsent([&] {
        const std::string out = event("error", json{{"code", ev.status >= 500 ? "server_error" : "invalid_request"},
                                                    {"message", ev.message},
                                                    {"param", nullptr}});
        return out + failed_event_now(responses_failure(ev.status, ev.message));
      });
    note(ev);
    if (ev.kind == OutputEvent::Done && ev.stats.finish == FinishReason::Cancelled) return "";
    std::string out;
    for (const auto& d : ev.deltas) out += stream_delta(d);
    if (ev.kind != OutputEvent::Done) return out;
    out += close_item();
    const std::string status = finish_reason();
    json r;
    try {
      r = final_response();
    } catch (...) {
      // on_done threw (its store). The events above carry the generation's last text and close its open item, and the
      // object the failure ends with holds that text: they are kept, numbered, and sent ahead of the failure's events
      // (after_unsent). (Dropped, the client got a response.failed whose output it had not been sent all of.)
      unspent.keep();
      unsent_ = std::move(out);
      throw;
    }
    return out + event(status == "completed" ? "response.completed" : "response.incomplete", json{{"response", r}});
  }

  void add(const OutputEvent& ev) override {
    if (ev.kind == OutputEvent::Error) return;
    note(ev);
    for (const auto& d : ev.deltas) {
      if (d.kind == OutputDelta::ToolCall) {
        call_piece(d);
        continue;
      }
      if (d.text.empty()) continue;
      if (open_ < 0 || open_kind_ != d.kind) open_item(d.kind);
      append_text(d.text);
    }
    if (ev.kind == OutputEvent::Done) close_item();
  }

  std::string body() const override { return dump_json(final_response()); }

  std::string error_body(const ApiError& e) const override { return dump_json(server::error_body(e)); }

  // The stream's terminal event for a failure: response.failed with the response so far, status "failed" (after the
  // events a throw of on_done left unsent).
  std::string failed_event(const json& error) {
    const Unspent unspent(seq_);
    return after_unsent([&] { return failed_event_now(error); });
  }

  // The stream's terminal event for a cancellation: response.cancelled with the response so far, status "cancelled".
  std::string cancelled_event() {
    const Unspent unspent(seq_);
    return event("response.cancelled", json{{"response", response("cancelled")}});
  }

  std::string finish_reason() const override {
    return stats_.finish == FinishReason::Length ? "incomplete" : "completed";
  }

 private:
  // Gives back the sequence numbers taken in its scope when a throw leaves it: the events numbered there are never
  // sent, so the next event sent follows the last one sent. (They were spent: when the store of a completed object
  // in on_done threw, the stream's response.failed came after a gap.)
  class Unspent {
   public:
    explicit Unspent(int64_t& seq) : seq_(seq), at_(seq), exceptions_(std::uncaught_exceptions()) {}
    ~Unspent() {
      if (std::uncaught_exceptions() > exceptions_) seq_ = at_;
    }
    // The numbers taken so far stay spent even if a throw follows: their events will be sent (unsent_).
    void keep() { at_ = seq_; }
    Unspent(const Unspent&) = delete;
    Unspent& operator=(const Unspent&) = delete;

   private:
    int64_t& seq_;
    int64_t at_;
    const int exceptions_;
  };

  // The events a throw of on_done left unsent (unsent_), then make()'s; they are handed out once. When make() throws,
  // they stay for the next failure's events.
  template <class Make>
  std::string after_unsent(Make make) {
    std::string out = unsent_ + make();
    unsent_.clear();
    return out;
  }

  std::string failed_event_now(const json& error) {
    return event("response.failed", json{{"response", response("failed", error)}});
  }

  // The completed / incomplete object, handed to on_done (which stores it); one the store refused says "store": false.
  json final_response() const {
    json r = response(finish_reason());
    if (meta_.on_done && !meta_.on_done(r)) r["store"] = false;
    return r;
  }

  json usage() const {
    const int64_t in = stats_.prompt_tokens > 0 ? stats_.prompt_tokens : meta_.input_tokens;
    return json{{"input_tokens", in},
                {"input_tokens_details", json{{"cached_tokens", stats_.cached_tokens}}},
                {"output_tokens", stats_.completion_tokens},
                {"output_tokens_details", json{{"reasoning_tokens", reasoning_tokens_}}},
                {"total_tokens", in + stats_.completion_tokens}};
  }

  json response(const std::string& status, const json& error = nullptr) const {
    json r;
    r["id"] = meta_.id;
    r["object"] = "response";
    r["created_at"] = meta_.created_at;
    r["status"] = status;
    r["background"] = meta_.background;
    r["error"] = error;
    r["incomplete_details"] = status == "incomplete" ? json{{"reason", "max_output_tokens"}} : json(nullptr);
    r["instructions"] = meta_.instructions;
    r["max_output_tokens"] = meta_.max_output_tokens;
    r["model"] = meta_.model;
    r["output"] = items_;
    r["parallel_tool_calls"] = meta_.parallel_tool_calls;
    r["previous_response_id"] = meta_.previous_response_id;
    r["conversation"] = meta_.conversation;
    r["reasoning"] = json{{"effort", meta_.reasoning_effort}, {"summary", nullptr}};
    r["store"] = meta_.store;
    r["temperature"] = meta_.temperature;
    r["text"] = json{{"format", meta_.text_format}};
    r["tool_choice"] = meta_.tool_choice;
    r["tools"] = meta_.tools;
    r["top_p"] = meta_.top_p;
    r["truncation"] = "disabled";
    r["usage"] = status == "in_progress" || status == "queued" ? json(nullptr) : usage();
    r["metadata"] = meta_.metadata;
    if (meta_.route_field) r["lilac_route"] = "local";
    return r;
  }

  std::string event(const std::string& type, json data) {
    json e;
    e["type"] = type;
    e["sequence_number"] = seq_++;
    for (auto& [k, v] : data.items()) e[k] = v;
    if (meta_.route_field) e["lilac_route"] = "local";
    return sse_event(type, e);
  }

  // Counts the reasoning tokens and keeps the stats.
  void note(const OutputEvent& ev) {
    if (ev.kind == OutputEvent::Done) stats_ = ev.stats;
    if (ev.kind == OutputEvent::Token && ev.token.id >= 0 && ev.reasoning) ++reasoning_tokens_;
  }

  json call_item(const OutputDelta& d, const char* status) const {
    return json{{"id", meta_.new_id("fc_")}, {"type", "function_call"}, {"status", status},
                {"call_id", d.tool_id}, {"name", d.tool_name}, {"arguments", d.arguments}};
  }

  // Opens a reasoning or message item (non-streaming and streaming share the items).
  void open_item(int kind) {
    close_item();
    open_ = int(items_.size());
    open_kind_ = kind;
    if (kind == OutputDelta::Reasoning)
      items_.push_back(json{{"id", meta_.new_id("rs_")}, {"type", "reasoning"}, {"summary", json::array()},
                            {"content", json::array({part(kind)})}});
    else
      items_.push_back(json{{"id", meta_.new_id("msg_")}, {"type", "message"}, {"status", "completed"},
                            {"role", "assistant"}, {"content", json::array({part(kind)})}});
  }

  static json part(int kind) {
    if (kind == OutputDelta::Reasoning) return json{{"type", "reasoning_text"}, {"text", ""}};
    return json{{"type", "output_text"}, {"text", ""}, {"annotations", json::array()}, {"logprobs", json::array()}};
  }

  void append_text(const std::string& t) {
    json& p = items_[size_t(open_)]["content"][0];
    p["text"].get_ref<std::string&>() += t;  // in place: a long answer is not copied per token
  }

  // A tool call's piece (streaming or not): its first opens a function_call item, the next ones add to its
  // arguments, the last closes it.
  std::string call_piece(const OutputDelta& d) {
    std::string out;
    if (d.tool_start()) {
      out += close_item();
      open_ = int(items_.size());
      open_kind_ = OutputDelta::ToolCall;
      items_.push_back(call_item(d, "in_progress"));
      if (streaming_) {
        json added = items_.back();
        added["arguments"] = "";
        out += event("response.output_item.added", json{{"output_index", open_}, {"item", added}});
      }
    }
    if (open_ < 0 || open_kind_ != OutputDelta::ToolCall) return out;
    json& item = items_[size_t(open_)];
    if (!d.tool_start()) item["arguments"].get_ref<std::string&>() += d.arguments;
    if (streaming_ && !d.arguments.empty())
      out += event("response.function_call_arguments.delta",
                   json{{"item_id", item["id"]}, {"output_index", open_}, {"delta", d.arguments}});
    return d.tool_end ? out + close_item() : out;
  }

  // The events that end the open item when streaming (nothing when none is open); a call item is completed.
  std::string close_item() {
    if (open_ < 0) return "";
    std::string out;
    if (open_kind_ == OutputDelta::ToolCall) {
      json& item = items_[size_t(open_)];
      item["status"] = "completed";
      if (streaming_) {
        out += event("response.function_call_arguments.done", json{{"item_id", item["id"]},
                                                                   {"output_index", open_},
                                                                   {"name", item["name"]},
                                                                   {"arguments", item["arguments"]}});
        out += event("response.output_item.done", json{{"output_index", open_}, {"item", item}});
      }
      open_ = -1;
      return out;
    }
    if (streaming_) {
      const json& item = items_[size_t(open_)];
      const json& p = item["content"][0];
      json ids{{"item_id", item["id"]}, {"output_index", open_}, {"content_index", 0}};
      if (open_kind_ == OutputDelta::Reasoning) {
        out += event("response.reasoning_text.done", merge(ids, json{{"text", p["text"]}}));
      } else {
        out += event("response.output_text.done", merge(ids, json{{"text", p["text"]}, {"logprobs", json::array()}}));
      }
      out += event("response.content_part.done", merge(ids, json{{"part", p}}));
      out += event("response.output_item.done", json{{"output_index", open_}, {"item", item}});
    }
    open_ = -1;
    return out;
  }

  static json merge(json a, const json& b) {
    for (auto& [k, v] : b.items()) a[k] = v;
    return a;
  }

  std::string stream_delta(const OutputDelta& d) {
    streaming_ = true;
    std::string out;
    if (d.kind == OutputDelta::ToolCall) return out + call_piece(d);
    if (d.text.empty()) return out;
    if (open_ < 0 || open_kind_ != d.kind) {
      out += close_item();
      open_item(d.kind);
      json added = items_[size_t(open_)];
      added["content"] = json::array();
      if (d.kind != OutputDelta::Reasoning) added["status"] = "in_progress";
      json ids{{"item_id", added["id"]}, {"output_index", open_}, {"content_index", 0}};
      out += event("response.output_item.added", json{{"output_index", open_}, {"item", added}});
      out += event("response.content_part.added", merge(ids, json{{"part", part(d.kind)}}));
    }
    append_text(d.text);
    json ids{{"item_id", items_[size_t(open_)]["id"]}, {"output_index", open_}, {"content_index", 0}};
    if (d.kind == OutputDelta::Reasoning)
      return out + event("response.reasoning_text.delta", merge(ids, json{{"delta", d.text}}));
    return out + event("response.output_text.delta", merge(ids, json{{"delta", d.text}, {"logprobs", json::array()}}));
  }

  ResponsesMeta meta_;
  GenerationStats stats_;
  json items_ = json::array();
  int open_ = -1, open_kind_ = -1;
  int64_t reasoning_tokens_ = 0;
  int64_t seq_ = 0;
  bool streaming_ = false;
  // Streaming: the events of a completed stream's end made before on_done threw (its last deltas, its open item's .done
  // events), numbered; sent first by the failure's events.
  std::string unsent_;
};

}  // namespace

json responses_object(const ResponseFormatter& fmt, const std::string& status, const json& error) {
  return dynamic_cast<const ResponsesFormatter&>(fmt).object(status, error);
}

std::string responses_failed_event(ResponseFormatter& fmt, const json& error) {
  return dynamic_cast<ResponsesFormatter&>(fmt).failed_event(error);
}

std::string responses_cancelled_event(ResponseFormatter& fmt) {
  return dynamic_cast<ResponsesFormatter&>(fmt).cancelled_event();
}

json responses_failure(int status, const std::string& message) {
  return json{{"code", status >= 500 ? "server_error" : "invalid_prompt"}, {"message", message}};
}

std::shared_ptr<ResponseFormatter> make_responses_formatter(ResponsesMeta meta) {
  return std::make_shared<ResponsesFormatter>(std::move(meta));
}

}  // namespace lilac::server
