#include "server/anthropic_format.h"

#include "server/anthropic_schema.h"

namespace lilac::server {

using json = nlohmann::json;

std::string sse_event(const std::string& name, const json& data) {
  std::string s = "event: " + name + "\ndata: ";
  s += dump_json(data);
  s += "\n\n";
  return s;
}

namespace {

class MessagesFormatter final : public ResponseFormatter {
 public:
  explicit MessagesFormatter(MessagesMeta meta) : meta_(std::move(meta)) {}

  std::string stream_start() override {
    json m = message_shell();
    m["usage"] = json{{"input_tokens", meta_.input_tokens}, {"output_tokens", 0}};
    std::string out = event("message_start", json{{"type", "message_start"}, {"message", std::move(m)}});
    return out + event("ping", json{{"type", "ping"}});
  }

  std::string stream_event(const OutputEvent& ev) override {
    std::string out;
    if (ev.kind == OutputEvent::Error)
      return event("error", anthropic_error_body(ApiError(ev.status, ev.message)));
    if (ev.kind == OutputEvent::Done) {
      stats_ = ev.stats;
      if (ev.stats.finish == FinishReason::Cancelled) return out;
    }
    for (const auto& d : ev.deltas) out += stream_delta(d);
    if (ev.kind != OutputEvent::Done) return out;
    out += close_block();
    json delta{{"stop_reason", finish_reason()}, {"stop_sequence", stop_sequence()}};
    out += event("message_delta", json{{"type", "message_delta"}, {"delta", std::move(delta)}, {"usage", usage()}});
    out += event("message_stop", json{{"type", "message_stop"}});
    return out;
  }

  void add(const OutputEvent& ev) override {
    if (ev.kind == OutputEvent::Error) return;
    if (ev.kind == OutputEvent::Done) stats_ = ev.stats;
    for (const auto& d : ev.deltas) accumulate(d);
  }

  std::string body() const override {
    json b = message_shell();
    b["content"] = blocks_;
    b["stop_reason"] = finish_reason();
    b["stop_sequence"] = stop_sequence();
    b["usage"] = usage();
    return dump_json(b);
  }

  std::string error_body(const ApiError& e) const override { return dump_json(anthropic_error_body(e)); }

  std::string finish_reason() const override {
    // A call cut off by max_tokens is not a finished tool use: Anthropic says "max_tokens" then.
    if (stats_.finish == FinishReason::Length) return "max_tokens";
    if (n_tool_calls_ > 0) return "tool_use";
    if (!stats_.stop_string.empty()) return "stop_sequence";
    return "end_turn";
  }

 private:
  json message_shell() const {
    json m;
    m["id"] = meta_.id;
    m["type"] = "message";
    m["role"] = "assistant";
    m["model"] = meta_.model;
    m["content"] = json::array();
    m["stop_reason"] = nullptr;
    m["stop_sequence"] = nullptr;
    if (meta_.route_field) m["lilac_route"] = "local";
    return m;
  }

  json stop_sequence() const {
    return finish_reason() == "stop_sequence" ? json(stats_.stop_string) : json(nullptr);
  }

  json usage() const {
    const int64_t in = stats_.prompt_tokens > 0 ? stats_.prompt_tokens : meta_.input_tokens;
    return json{{"input_tokens", in}, {"output_tokens", stats_.completion_tokens}};
  }

  std::string event(const std::string& name, json data) const {
    if (meta_.route_field) data["lilac_route"] = "local";
    return sse_event(name, data);
  }

  // A tool_use block for the call that `d` starts, its input still empty.
  static json tool_block(const OutputDelta& d) {
    return json{
        {"type", "tool_use"}, {"id", anthropic_tool_id(d.tool_id)}, {"name", d.tool_name}, {"input", json::object()}};
  }

  // Non-streaming: consecutive deltas of one kind make one block; a tool call's pieces one tool_use block, its
  // input parsed at the call's end.
  void accumulate(const OutputDelta& d) {
    if (d.kind == OutputDelta::ToolCall) {
      if (d.tool_start()) {
        ++n_tool_calls_;
        blocks_.push_back(tool_block(d));
        call_args_.clear();
      }
      call_args_ += d.arguments;
      if (d.tool_end && !blocks_.empty()) {
        json input = json::parse(call_args_, nullptr, false);
        blocks_.back()["input"] = input.is_object() ? std::move(input) : json::object();
      }
      return;
    }
    if (d.text.empty()) return;
    const char* type = d.kind == OutputDelta::Reasoning ? "thinking" : "text";
    if (blocks_.empty() || blocks_.back()["type"] != type) {
      json b{{"type", type}, {type, ""}};
      if (d.kind == OutputDelta::Reasoning) b["signature"] = "";
      blocks_.push_back(std::move(b));
    }
    blocks_.back()[type].get_ref<std::string&>() += d.text;  // in place: a long answer is not copied per token
  }

  std::string close_block() {
    if (open_ < 0) return "";
    std::string out = event("content_block_stop", json{{"type", "content_block_stop"}, {"index", open_}});
    open_ = -1;
    ++next_index_;
    return out;
  }

  std::string open_block(int kind, json block) {
    std::string out = close_block();
    open_ = next_index_;
    open_kind_ = kind;
    return out + event("content_block_start",
                       json{{"type", "content_block_start"}, {"index", open_}, {"content_block", std::move(block)}});
  }

  std::string stream_delta(const OutputDelta& d) {
    std::string out;
    if (d.kind == OutputDelta::ToolCall) {  // a tool_use block; its input streams as partial JSON
      if (d.tool_start()) {
        ++n_tool_calls_;
        out += open_block(OutputDelta::ToolCall, tool_block(d));
      }
      if (open_ >= 0 && open_kind_ == OutputDelta::ToolCall && !d.arguments.empty())
        out += event("content_block_delta",
                     json{{"type", "content_block_delta"},
                          {"index", open_},
                          {"delta", json{{"type", "input_json_delta"}, {"partial_json", d.arguments}}}});
      return d.tool_end ? out + close_block() : out;
    }
    if (d.text.empty()) return out;
    const bool thinking = d.kind == OutputDelta::Reasoning;
    if (open_ < 0 || open_kind_ != d.kind) {
      json b = thinking ? json{{"type", "thinking"}, {"thinking", ""}, {"signature", ""}} : json{{"type", "text"}, {"text", ""}};
      out += open_block(d.kind, std::move(b));
    }
    json delta = thinking ? json{{"type", "thinking_delta"}, {"thinking", d.text}} : json{{"type", "text_delta"}, {"text", d.text}};
    return out + event("content_block_delta",
                       json{{"type", "content_block_delta"}, {"index", open_}, {"delta", std::move(delta)}});
  }

  MessagesMeta meta_;
  GenerationStats stats_;
  json blocks_ = json::array();
  std::string call_args_;  // non-streaming: the open tool call's arguments so far
  int n_tool_calls_ = 0;
  int open_ = -1, open_kind_ = -1, next_index_ = 0;
};

}  // namespace

std::shared_ptr<ResponseFormatter> make_messages_formatter(MessagesMeta meta) {
  return std::make_shared<MessagesFormatter>(std::move(meta));
}

}  // namespace lilac::server
