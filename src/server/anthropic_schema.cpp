#include "server/anthropic_schema.h"

#include <regex>
#include <set>

#include "server/request_fields.h"
#include "text/unicode.h"

namespace lilac::server {

using namespace fields;

std::string anthropic_error_type(int status) {
  switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: case 529: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
  }
}

nlohmann::json anthropic_error_body(const ApiError& e) {
  std::string msg = e.message;
  if (!e.param.empty() && msg.find(e.param) == std::string::npos) msg = e.param + ": " + msg;
  return nlohmann::json{{"type", "error"},
                        {"error", nlohmann::json{{"type", anthropic_error_type(e.status)}, {"message", msg}}}};
}

std::string anthropic_tool_id(const std::string& call_id) {
  if (call_id.rfind("call_", 0) == 0) return "toolu_" + call_id.substr(5);
  return call_id;
}

namespace {

[[noreturn]] void unsupported(const std::string& param, const std::string& what) {
  bad(param, what + " is not supported by this server.", "unsupported_value");
}

std::string block_type(const ojson& b, const std::string& p) {
  if (!b.is_object()) wrong_type(p, "an object (a content block)", b);
  return need_string(b, "type", p + ".type");
}

// The text of a string or of an array of text blocks (other blocks: 400), joined by "\n".
std::string text_of(const ojson& v, const std::string& p) {
  if (v.is_string()) return v.get<std::string>();
  if (!v.is_array()) wrong_type(p, "a string or an array of text blocks", v);
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string bp = p + "[" + std::to_string(i) + "]";
    const std::string ty = block_type(v[i], bp);
    if (ty != "text") unsupported(bp + ".type", "A content block of type '" + ty + "' here");
    if (!out.empty()) out += "\n";
    out += need_string(v[i], "text", bp + ".text");
  }
  return out;
}

void flush_user_text(ojson& msgs, std::string& text, bool& have) {
  if (!have) return;
  msgs.push_back(ojson{{"role", "user"}, {"content", text}});
  text.clear();
  have = false;
}

void add_user(const ojson& content, const std::string& p, ojson& msgs) {
  if (content.is_string()) {
    msgs.push_back(ojson{{"role", "user"}, {"content", content}});
    return;
  }
  std::string text;
  bool have = false;
  for (size_t i = 0; i < content.size(); ++i) {
    const ojson& b = content[i];
    const std::string bp = p + "[" + std::to_string(i) + "]";
    const std::string ty = block_type(b, bp);
    if (ty == "text") {
      if (have) text += "\n";
      text += need_string(b, "text", bp + ".text");
      have = true;
    } else if (ty == "tool_result") {
      flush_user_text(msgs, text, have);
      const std::string id = need_string(b, "tool_use_id", bp + ".tool_use_id");
      std::string out;
      if (const ojson* c = field(b, "content")) out = text_of(*c, bp + ".content");
      if (get_bool(b, "is_error", bp + ".is_error").value_or(false)) out = "Error: " + out;
      msgs.push_back(ojson{{"role", "tool"}, {"tool_call_id", id}, {"content", out}});
    } else if (ty == "tool_use" || ty == "thinking" || ty == "redacted_thinking") {
      bad(bp + ".type", "A '" + ty + "' block may only appear in an assistant message.");
    } else {
      unsupported(bp + ".type", "A content block of type '" + ty + "'");
    }
  }
  flush_user_text(msgs, text, have);
}

void add_assistant(const ojson& content, const std::string& p, ojson& msgs) {
  ojson m{{"role", "assistant"}, {"content", ""}};
  if (content.is_string()) {
    m["content"] = content;
    msgs.push_back(std::move(m));
    return;
  }
  std::string text, reasoning;
  ojson calls = ojson::array();
  for (size_t i = 0; i < content.size(); ++i) {
    const ojson& b = content[i];
    const std::string bp = p + "[" + std::to_string(i) + "]";
    const std::string ty = block_type(b, bp);
    if (ty == "text") {
      text += need_string(b, "text", bp + ".text");
    } else if (ty == "thinking") {
      reasoning += need_string(b, "thinking", bp + ".thinking");
    } else if (ty == "redacted_thinking") {
      // opaque to lilac: dropped
    } else if (ty == "tool_use") {
      const std::string id = need_string(b, "id", bp + ".id");
      const std::string name = need_string(b, "name", bp + ".name");
      const ojson* input = field(b, "input");
      if (input && !input->is_object()) wrong_type(bp + ".input", "an object", *input);
      calls.push_back(ojson{{"id", id},
                            {"type", "function"},
                            {"function", ojson{{"name", name}, {"arguments", input ? *input : ojson::object()}}}});
    } else if (ty == "tool_result") {
      bad(bp + ".type", "A 'tool_result' block may only appear in a user message.");
    } else {
      unsupported(bp + ".type", "A content block of type '" + ty + "'");
    }
  }
  m["content"] = text;
  if (!reasoning.empty()) m["reasoning_content"] = reasoning;
  if (!calls.empty()) m["tool_calls"] = std::move(calls);
  msgs.push_back(std::move(m));
}

ojson translate_messages(const ojson& body) {
  const ojson* ms = field(body, "messages");
  if (!ms) missing("messages");
  if (!ms->is_array()) wrong_type("messages", "an array", *ms);
  if (ms->empty()) bad("messages", "'messages' must contain at least one message.", "empty_array");
  ojson out = ojson::array();
  if (const ojson* sys = field(body, "system")) {
    std::string s = text_of(*sys, "system");
    if (!s.empty()) out.push_back(ojson{{"role", "system"}, {"content", s}});
  }
  for (size_t i = 0; i < ms->size(); ++i) {
    const ojson& m = (*ms)[i];
    const std::string p = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) wrong_type(p, "an object", m);
    const std::string role = need_string(m, "role", p + ".role");
    const ojson* c = field(m, "content");
    if (!c) missing(p + ".content");
    if (!c->is_string() && !c->is_array()) wrong_type(p + ".content", "a string or an array of content blocks", *c);
    if (role == "user")
      add_user(*c, p + ".content", out);
    else if (role == "assistant")
      add_assistant(*c, p + ".content", out);
    else
      bad(p + ".role", "Invalid value for '" + p + ".role': '" + role + "'. Supported values are 'user' and 'assistant'.");
  }
  if ((*ms).back().value("role", "") == "assistant") {  // a prefill: the model continues this message's text
    const ojson& last = out.back();
    if (last.contains("tool_calls"))
      bad("messages", "The last message is the assistant's tool_use: a conversation that ends with tool use goes on "
                      "with a user message holding the tool_result blocks.", "invalid_last_message");
    check_prefill_text(last["content"].get<std::string>());
  }
  return out;
}

const std::regex& tool_name_re() {
  static const std::regex re("^[A-Za-z0-9_.\\-]{1,128}$");
  return re;
}

// Anthropic tools -> OpenAI function tools (what the chat template and the output parser read).
ojson translate_tools(const ojson& tools) {
  if (!tools.is_array()) wrong_type("tools", "an array", tools);
  ojson out = ojson::array();
  std::set<std::string> names;
  for (size_t i = 0; i < tools.size(); ++i) {
    const ojson& t = tools[i];
    const std::string p = "tools[" + std::to_string(i) + "]";
    if (!t.is_object()) wrong_type(p, "an object", t);
    if (auto ty = get_string(t, "type", p + ".type"); ty && *ty != "custom")
      unsupported(p + ".type", "The server tool '" + *ty + "' (only custom tools with an input_schema are)");
    const std::string name = need_string(t, "name", p + ".name");
    if (!std::regex_match(name, tool_name_re()))
      bad(p + ".name", "Invalid '" + p + ".name': '" + name + "' must be 1-128 characters of a-z, A-Z, 0-9, '_', '.' and '-'.");
    if (!names.insert(name).second) bad(p + ".name", "Duplicate tool name '" + name + "'.");
    const ojson* schema = field(t, "input_schema");
    if (!schema) missing(p + ".input_schema");
    if (!schema->is_object()) wrong_type(p + ".input_schema", "an object (a JSON schema)", *schema);
    if (auto st = schema->find("type"); st != schema->end() && !(st->is_string() && *st == "object"))
      bad(p + ".input_schema", "Invalid '" + p + ".input_schema': its type must be \"object\".");
    check_tool_parameters(*schema, p + ".input_schema", name);
    ojson fn{{"name", name}};
    if (auto d = get_string(t, "description", p + ".description")) fn["description"] = *d;
    fn["parameters"] = *schema;
    out.push_back(ojson{{"type", "function"}, {"function", std::move(fn)}});
  }
  return out;
}

void parse_tool_choice(const ojson& body, MessagesParams& p) {
  const ojson* tc = field(body, "tool_choice");
  if (!tc) return;
  if (!tc->is_object()) wrong_type("tool_choice", "an object", *tc);
  const std::string ty = need_string(*tc, "type", "tool_choice.type");
  if (auto d = get_bool(*tc, "disable_parallel_tool_use", "tool_choice.disable_parallel_tool_use"); d && *d)
    p.parallel_tool_calls = false;
  if (ty == "auto") {
    p.tool_choice = ToolChoice::Auto;
  } else if (ty == "none") {
    p.tool_choice = ToolChoice::None;
  } else if (ty == "any") {
    p.tool_choice = ToolChoice::Required;
  } else if (ty == "tool") {
    p.tool_choice = ToolChoice::Function;
    p.tool_choice_name = need_string(*tc, "name", "tool_choice.name");
  } else {
    bad("tool_choice.type", "Invalid value for 'tool_choice.type': '" + ty + "'. Supported values are 'auto', 'any', 'tool' and 'none'.");
  }
  if (forces_call(p.tool_choice) && p.tools.is_null())
    bad("tool_choice", "tool_choice '" + ty + "' requires 'tools'.");
  if (p.tool_choice == ToolChoice::Function) {
    bool found = false;
    for (auto& t : p.tools) found |= t["function"]["name"] == p.tool_choice_name;
    if (!found) bad("tool_choice.name", "No tool named '" + p.tool_choice_name + "' in 'tools'.");
  }
}

void parse_thinking(const ojson& body, MessagesParams& p, bool for_count) {
  const ojson* th = field(body, "thinking");
  if (!th) return;
  if (!th->is_object()) wrong_type("thinking", "an object", *th);
  const std::string ty = need_string(*th, "type", "thinking.type");
  if (ty == "disabled") return;
  if (ty != "enabled" && ty != "adaptive")
    bad("thinking.type", "Invalid value for 'thinking.type': '" + ty + "'. Supported values are 'enabled' and 'disabled'.");
  p.thinking = true;
  if (ty == "adaptive") return;
  auto budget = get_int(*th, "budget_tokens", 1, INT64_MAX, "thinking.budget_tokens");
  if (!budget) missing("thinking.budget_tokens");
  if (!for_count && p.max_tokens && *budget >= *p.max_tokens)
    bad("thinking.budget_tokens", "'thinking.budget_tokens' (" + std::to_string(*budget) +
                                      ") must be less than 'max_tokens' (" + std::to_string(*p.max_tokens) + ").");
  p.budget_tokens = budget;
}

void parse_sampling(const ojson& body, const ModelConfig& cfg, uint64_t seed, MessagesParams& p) {
  p.sampling = sampling_defaults(cfg, seed);
  if (auto v = get_number(body, "temperature", 0, 1)) p.sampling.temperature = float(*v);
  if (auto v = get_number(body, "top_p", 0, 1)) {
    if (*v <= 0) bad("top_p", "Invalid value for 'top_p': must be greater than 0.");
    p.sampling.top_p = float(*v);
  }
  if (auto v = get_int(body, "top_k", 0, 1 << 30)) p.sampling.top_k = int(*v);
  if (const ojson* s = field(body, "stop_sequences")) {
    if (!s->is_array()) wrong_type("stop_sequences", "an array of strings", *s);
    if (s->size() > 64) bad("stop_sequences", "At most 64 stop sequences are supported.");
    size_t bytes = 0;
    for (auto& x : *s) {
      if (!x.is_string()) wrong_type("stop_sequences", "an array of strings", x);
      check_stop_bytes(x.get_ref<const std::string&>().size(), bytes, "stop_sequences");
      if (!x.get<std::string>().empty()) p.stop.push_back(x.get<std::string>());
    }
  }
}

// metadata: {"user_id": a string of at most 256 characters, or null}; other keys are refused, as Anthropic's API
// refuses them ("Extra inputs are not permitted").
void check_metadata(const ojson& body) {
  const ojson* md = field(body, "metadata");
  if (!md) return;
  if (!md->is_object()) wrong_type("metadata", "an object", *md);
  for (const auto& [k, v] : md->items())
    if (k != "user_id") bad("metadata." + quoted_id(k), "Extra inputs are not permitted.", "extra_forbidden");
  if (auto id = get_string(*md, "user_id", "metadata.user_id"); id && unicode::utf8_chars(*id) > 256)
    bad("metadata.user_id", "Invalid 'metadata.user_id': at most 256 characters.");
}

}  // namespace

MessagesParams parse_messages_request(const ojson& body, const ModelConfig& cfg, uint64_t seed, bool for_count) {
  MessagesParams p;
  if (auto m = get_string(body, "model")) p.model = *m;
  for (const char* k : {"container", "mcp_servers"})
    if (field(body, k)) unsupported(k, std::string("'") + k + "'");
  ojson msgs = translate_messages(body);
  if (!for_count) {
    p.max_tokens = get_int(body, "max_tokens", 1, INT64_MAX);
    if (!p.max_tokens) missing("max_tokens");
    p.stream = get_bool(body, "stream").value_or(false);
    parse_sampling(body, cfg, seed, p);
  }
  if (const ojson* t = field(body, "tools")) {
    ojson tools = translate_tools(*t);
    if (!tools.empty()) p.tools = std::move(tools);
  }
  parse_tool_choice(body, p);
  parse_thinking(body, p, for_count);
  check_metadata(body);
  // The request's own last message decides (a user turn of no blocks translates to nothing: what precedes it
  // must not become a prefill).
  p.continue_final = field(body, "messages")->back().value("role", "") == "assistant";
  if (p.continue_final && p.thinking)
    bad("thinking", "Extended thinking cannot be combined with a final assistant message (a prefill): the answer "
                    "would have to begin with its thinking. Disable thinking or end with a user message.",
        "invalid_last_message");
  if (p.continue_final && forces_call(p.tool_choice))
    bad("tool_choice", "A forced tool use cannot be combined with a final assistant message (a prefill): its text "
                       "is continued. Use tool_choice 'auto', or end with a user message.",
        "invalid_last_message");

  ojson tr = ojson::object();
  tr["messages"] = std::move(msgs);
  if (!p.tools.is_null() && p.tool_choice != ToolChoice::None) tr["tools"] = p.tools;
  if (p.tool_choice == ToolChoice::None) p.tools = nullptr;
  tr["chat_template_kwargs"] = ojson{{"enable_thinking", p.thinking}};
  p.template_request = std::move(tr);
  return p;
}

}  // namespace lilac::server
