#include "server/responses_schema.h"

#include <regex>
#include <set>

#include "server/api_error.h"
#include "server/request_fields.h"
#include "server/request_json.h"

namespace lilac::server {

using namespace fields;

namespace {

[[noreturn]] void unsupported(const std::string& param, const std::string& what) {
  bad(param, what + " is not supported by this server.", "unsupported_value");
}

// A message's content: a string or an array of text parts (input_text / output_text / text).
std::string content_text(const ojson& c, const std::string& p) {
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) wrong_type(p, "a string or an array of content parts", c);
  std::string out;
  for (size_t i = 0; i < c.size(); ++i) {
    const std::string pp = p + "[" + std::to_string(i) + "]";
    if (!c[i].is_object()) wrong_type(pp, "an object", c[i]);
    const std::string ty = need_string(c[i], "type", pp + ".type");
    if (ty == "input_text" || ty == "output_text" || ty == "text") {
      out += need_string(c[i], "text", pp + ".text");
    } else if (ty == "refusal") {
      out += need_string(c[i], "refusal", pp + ".refusal");
    } else {
      bad(pp + ".type", "Content parts of type '" + ty + "' are not supported (text only).", "unsupported_value");
    }
  }
  return out;
}

// A reasoning item's content or summary: an array of objects with a text. An element that is not an object is
// the wrong type (need_string on it would call its text missing).
std::string reasoning_text(const ojson& v, const std::string& p) {
  if (!v.is_array()) wrong_type(p, "an array", v);
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string pp = p + "[" + std::to_string(i) + "]";
    if (!v[i].is_object()) wrong_type(pp, "an object", v[i]);
    out += need_string(v[i], "text", pp + ".text");
  }
  return out;
}

// Builds the chat message list from `input` items.
struct Translator {
  ojson msgs = ojson::array();
  std::string system;
  bool in_lead = true;        // still reading leading system / developer messages
  std::string reasoning;      // a reasoning item waiting for its assistant message
  bool open_calls = false;    // msgs.back() is an assistant message that function calls may extend

  ojson& assistant() {
    if (!open_calls) {
      msgs.push_back(ojson{{"role", "assistant"}, {"content", ""}});
      open_calls = true;
    }
    ojson& m = msgs.back();
    if (!reasoning.empty()) {
      m["reasoning_content"] = m.value("reasoning_content", std::string()) + reasoning;
      reasoning.clear();
    }
    return m;
  }

  void message(const ojson& it, const std::string& p) {
    const std::string role = need_string(it, "role", p + ".role");
    const ojson* c = field(it, "content");
    if (!c) missing(p + ".content");
    std::string text = content_text(*c, p + ".content");
    if (role == "system" || role == "developer") {
      if (in_lead) {
        system += (system.empty() ? "" : "\n\n") + text;
        return;
      }
      msgs.push_back(ojson{{"role", "system"}, {"content", text}});  // the template tells whether it may
      open_calls = false;
      return;
    }
    in_lead = false;
    if (role == "assistant") {
      if (open_calls && !msgs.back().contains("tool_calls") && reasoning.empty()) {
        // Consecutive message items of one turn are one message (the template would make each a turn of its
        // own): e.g. a prefill's text and, stored, its continuation.
        msgs.back()["content"] = msgs.back()["content"].get<std::string>() + text;
        return;
      }
      open_calls = false;
      ojson& m = assistant();
      m["content"] = m["content"].get<std::string>() + text;
      return;
    }
    if (role != "user")
      bad(p + ".role", "Invalid value for '" + p + ".role': '" + role +
                           "'. Supported values are 'user', 'assistant', 'system' and 'developer'.");
    msgs.push_back(ojson{{"role", "user"}, {"content", text}});
    open_calls = false;
  }

  void item(const ojson& it, const std::string& p) {
    if (!it.is_object()) wrong_type(p, "an object (an input item)", it);
    get_string(it, "id", p + ".id");  // (not read here; a conversation keeps it: conversation_items)
    const std::string ty = get_string(it, "type", p + ".type").value_or("message");
    if (ty == "message") return message(it, p);
    in_lead = false;
    if (ty == "function_call") {
      const std::string call_id = need_string(it, "call_id", p + ".call_id");
      const std::string name = need_string(it, "name", p + ".name");
      const std::string args = need_string(it, "arguments", p + ".arguments");
      ojson parsed = parse_tool_arguments(args, p + ".arguments");
      ojson& m = assistant();
      if (!m.contains("tool_calls")) m["tool_calls"] = ojson::array();
      m["tool_calls"].push_back(
          ojson{{"id", call_id}, {"type", "function"}, {"function", ojson{{"name", name}, {"arguments", std::move(parsed)}}}});
    } else if (ty == "function_call_output") {
      const std::string call_id = need_string(it, "call_id", p + ".call_id");
      const ojson* out = field(it, "output");
      if (!out) missing(p + ".output");
      msgs.push_back(ojson{{"role", "tool"}, {"tool_call_id", call_id}, {"content", content_text(*out, p + ".output")}});
      open_calls = false;
    } else if (ty == "reasoning") {
      std::string text;
      if (const ojson* c = field(it, "content")) text = reasoning_text(*c, p + ".content");
      if (text.empty())
        if (const ojson* s = field(it, "summary")) text = reasoning_text(*s, p + ".summary");
      open_calls = false;
      reasoning += text;
    } else if (ty == "item_reference") {
      unsupported(p + ".type", "An item_reference (send the item itself, or continue a stored response with previous_response_id)");
    } else {
      bad(p + ".type", "Input items of type '" + ty + "' are not supported (message, function_call, "
                       "function_call_output and reasoning are).", "unsupported_value");
    }
  }
};

// The conversation's items: a previous response's (its conversation's input items and its output items),
// then this request's input (a string is one user message). r.input_items keeps them for the store.
ojson translate_input(const ojson& body, ResponsesParams& r, const ojson& previous_items) {
  Translator t;
  if (const ojson* ins = field(body, "instructions")) {
    if (!ins->is_string()) wrong_type("instructions", "a string", *ins);
    t.system = ins->get<std::string>();
    r.instructions = *ins;
  }
  const ojson* in = field(body, "input");
  if (!in) missing("input");
  ojson items = ojson::array();
  if (in->is_string()) {
    items.push_back(ojson{{"role", "user"}, {"content", *in}});
  } else if (in->is_array()) {
    if (in->empty()) bad("input", "'input' must contain at least one item.", "empty_array");
    items = *in;
  } else {
    wrong_type("input", "a string or an array of input items", *in);
  }
  const std::string from = r.conversation_id.empty() ? "previous_response_id" : "conversation";
  for (size_t i = 0; i < previous_items.size(); ++i)
    t.item(previous_items[i], from + " (its conversation's item " + std::to_string(i) + ")");
  for (size_t i = 0; i < items.size(); ++i) t.item(items[i], in->is_string() ? "input" : "input[" + std::to_string(i) + "]");
  r.input_items = previous_items;
  r.request_items = items;
  for (auto& it : items) r.input_items.push_back(std::move(it));
  ojson msgs = ojson::array();
  if (!t.system.empty()) msgs.push_back(ojson{{"role", "system"}, {"content", t.system}});
  for (auto& m : t.msgs) msgs.push_back(std::move(m));
  if (msgs.empty() || msgs.back()["role"] == "system")
    bad("input", "The input must end with a user message, a function_call_output or an assistant message to "
                 "continue.", "invalid_last_message");
  if (msgs.back()["role"] == "assistant") {  // a prefill: the model continues this message's text
    if (msgs.back().contains("tool_calls"))
      bad("input", "The input ends with function calls: a conversation goes on with their results "
                   "(function_call_output items), not with more of that turn.", "invalid_last_message");
    check_prefill_text(msgs.back()["content"].get<std::string>(), "input");
    r.continue_final = true;
  }
  return msgs;
}

const std::regex& tool_name_re() {
  static const std::regex re("^[A-Za-z0-9_.\\-]{1,64}$");
  return re;
}

void parse_tools(const ojson& body, ResponsesParams& r) {
  const ojson* ts = field(body, "tools");
  if (!ts) return;
  if (!ts->is_array()) wrong_type("tools", "an array", *ts);
  r.echo_tools = *ts;
  ojson out = ojson::array();
  std::set<std::string> names;
  for (size_t i = 0; i < ts->size(); ++i) {
    const ojson& t = (*ts)[i];
    const std::string p = "tools[" + std::to_string(i) + "]";
    if (!t.is_object()) wrong_type(p, "an object", t);
    const std::string ty = need_string(t, "type", p + ".type");
    if (ty != "function")
      bad(p + ".type", "Tools of type '" + ty + "' are not supported (only 'function').", "unsupported_value");
    const std::string name = need_string(t, "name", p + ".name");
    if (!std::regex_match(name, tool_name_re()))
      bad(p + ".name", "Invalid '" + p + ".name': '" + name + "' must be 1-64 characters of a-z, A-Z, 0-9, '_', '.' and '-'.");
    if (!names.insert(name).second) bad(p + ".name", "Duplicate tool name '" + name + "'.");
    ojson fn{{"name", name}};
    if (auto d = get_string(t, "description", p + ".description")) fn["description"] = *d;
    if (const ojson* ps = field(t, "parameters")) {
      if (!ps->is_object()) wrong_type(p + ".parameters", "an object (a JSON schema)", *ps);
      if (auto pt = ps->find("type"); pt != ps->end() && !(pt->is_string() && *pt == "object"))
        bad(p + ".parameters", "Invalid '" + p + ".parameters': its type must be \"object\".");
      check_tool_parameters(*ps, p + ".parameters", name);
      fn["parameters"] = *ps;
    }
    // strict: true constrains the call's arguments to `parameters` (constrained decoding); absent or
    // false leaves them free (OpenAI's default is true, but a schema outside lilac's subset would then
    // fail the request, so lilac enforces only what the client asks for explicitly)
    if (auto st = get_bool(t, "strict", p + ".strict"); st && *st) fn["strict"] = true;
    out.push_back(ojson{{"type", "function"}, {"function", std::move(fn)}});
  }
  if (!out.empty()) r.tools = std::move(out);
}

void parse_tool_choice(const ojson& body, ResponsesParams& r) {
  const ojson* tc = field(body, "tool_choice");
  if (!tc) return;
  r.echo_tool_choice = *tc;
  if (tc->is_string()) {
    const std::string s = tc->get<std::string>();
    if (s == "auto") r.tool_choice = ToolChoice::Auto;
    else if (s == "none") r.tool_choice = ToolChoice::None;
    else if (s == "required") r.tool_choice = ToolChoice::Required;
    else bad("tool_choice", "Invalid value for 'tool_choice': '" + s + "'. Supported values are 'none', 'auto' and 'required'.");
  } else if (tc->is_object()) {
    const std::string ty = need_string(*tc, "type", "tool_choice.type");
    if (ty != "function") bad("tool_choice.type", "Invalid value for 'tool_choice.type': '" + ty + "' (only 'function').");
    r.tool_choice = ToolChoice::Function;
    r.tool_choice_name = need_string(*tc, "name", "tool_choice.name");
  } else {
    wrong_type("tool_choice", "a string or an object", *tc);
  }
  if (forces_call(r.tool_choice) && r.tools.is_null())
    bad("tool_choice", "'tool_choice' requires 'tools' to be given.");
  if (r.tool_choice == ToolChoice::Function) {
    bool found = false;
    for (auto& t : r.tools) found |= t["function"]["name"] == r.tool_choice_name;
    if (!found) bad("tool_choice.name", "No tool named '" + r.tool_choice_name + "' in 'tools'.");
  }
}

void parse_text_and_reasoning(const ojson& body, ResponsesParams& r) {
  if (const ojson* tx = field(body, "text")) {
    if (!tx->is_object()) wrong_type("text", "an object", *tx);
    if (const ojson* f = field(*tx, "format")) {
      if (!f->is_object()) wrong_type("text.format", "an object", *f);
      const std::string ty = need_string(*f, "type", "text.format.type");
      if (ty == "json_object") {
        r.response_format = ResponseFormat::JsonObject;
      } else if (ty == "json_schema") {
        // {"type": "json_schema", "name", "schema", "strict", "description"}: the schema is checked when
        // it is compiled (GenerationCore: 400 invalid_schema naming the keyword)
        r.response_format = ResponseFormat::JsonSchema;
        need_string(*f, "name", "text.format.name");
        get_string(*f, "description", "text.format.description");
        get_bool(*f, "strict", "text.format.strict");
        r.json_schema = ojson::object();
        if (const ojson* sc = field(*f, "schema")) {
          if (!sc->is_object()) wrong_type("text.format.schema", "an object (a JSON schema)", *sc);
          r.json_schema = *sc;
        }
      } else if (ty != "text") {
        bad("text.format.type", "Invalid value for 'text.format.type': '" + ty + "'.");
      }
      r.echo_text_format = *f;
    }
  }
  if (const ojson* rs = field(body, "reasoning")) {
    if (!rs->is_object()) wrong_type("reasoning", "an object", *rs);
    if (auto e = get_string(*rs, "effort", "reasoning.effort")) {
      static const std::set<std::string> efforts = {"none", "minimal", "low", "medium", "high", "xhigh"};
      if (!efforts.count(*e))
        bad("reasoning.effort", "Invalid value for 'reasoning.effort': '" + *e + "'. Supported values are 'none', "
                                "'minimal', 'low', 'medium' and 'high'.");
      r.effort = *e;
      r.reasoning = *e != "none" && *e != "minimal";
    }
  }
}

}  // namespace

const char* item_id_prefix(std::string_view type) {
  return type == "message" ? "msg_" : type == "function_call" ? "fc_" : type == "reasoning" ? "rs_" : "fco_";
}

const char* const kIdChars = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-";

ojson conversation_items(const ojson& items, const std::string& param,
                         const std::function<std::string(const char*)>& new_id) {
  if (!items.is_array()) wrong_type(param, "an array of items", items);
  Translator t;
  ojson out = ojson::array();
  for (size_t i = 0; i < items.size(); ++i) {
    const std::string p = param + "[" + std::to_string(i) + "]";
    t.item(items[i], p);  // what a Responses input takes, with its errors
    ojson it = items[i];
    // (a null type is "not given", as the translator read it: json::value() would throw on it, a 500)
    const std::string ty = get_string(it, "type", p + ".type").value_or("message");
    it["type"] = ty;
    if (ty == "message" && it["content"].is_string()) {
      const bool assistant = it["role"] == "assistant";
      it["content"] = ojson::array({ojson{{"type", assistant ? "output_text" : "input_text"}, {"text", it["content"]}}});
    }
    if (it.contains("id") && it["id"].is_string()) {
      // The client's id: one the item routes can address (/v1/conversations/{id}/items/{item_id}), once per call.
      const std::string& id = it["id"].get_ref<const std::string&>();
      if (id.empty() || id.size() > 128 || id.find_first_not_of(kIdChars) != std::string::npos)
        bad(p + ".id", "Invalid '" + p + ".id': an item id is 1 to 128 letters, digits, '_' or '-'.");
      for (const auto& o : out)
        if (o["id"] == id) bad(p + ".id", "Invalid '" + p + ".id': '" + id + "' is the id of an earlier item.");
    } else {
      const char* prefix = item_id_prefix(ty);
      ojson with_id = ojson{{"id", new_id(prefix)}};
      for (auto& [k, v] : it.items())
        if (k != "id") with_id[k] = v;
      it = std::move(with_id);
    }
    out.push_back(std::move(it));
  }
  return out;
}

ResponsesParams parse_responses_request(const ojson& body, const ModelConfig& cfg, uint64_t seed,
                                        const ResponseStore* store, ConversationStore* conversations) {
  ResponsesParams r;
  if (auto m = get_string(body, "model")) r.model = *m;
  r.store = get_bool(body, "store").value_or(true);
  ojson previous_items = ojson::array();
  if (const ojson* c = field(body, "conversation")) {
    if (c->is_string())
      r.conversation_id = c->get<std::string>();
    else if (c->is_object())
      r.conversation_id = need_string(*c, "id", "conversation.id");
    else
      wrong_type("conversation", "a conversation id or an object with one", *c);
    if (field(body, "previous_response_id"))
      bad("conversation", "'conversation' and 'previous_response_id' cannot be used together: a conversation holds "
                          "its items itself.");
    std::optional<ConversationStore::Conversation> conv =
        conversations ? conversations->get(r.conversation_id) : std::nullopt;
    if (!conv)
      bad("conversation", "Conversation with id '" + quoted_id(r.conversation_id) + "' not found (conversations are "
                          "kept in this server's memory until it restarts).", "conversation_not_found");
    previous_items = std::move(conv->items);
  }
  if (auto prev = get_string(body, "previous_response_id")) {
    std::optional<ResponseStore::Entry> e = store ? store->get(*prev) : std::nullopt;
    if (!e)
      bad("previous_response_id",
          "Previous response with id '" + quoted_id(*prev) +
              "' not found (responses are kept in this server's memory, the oldest dropped first, until it restarts).",
          "previous_response_not_found");
    // A background response that has not ended holds no output yet: its items would continue the conversation
    // without the answer.
    if (response_running(e->response))
      bad("previous_response_id", "Previous response with id '" + quoted_id(*prev) + "' is still " +
                                      e->response.value("status", std::string()) +
                                      ": wait until it ends (or cancel it) before continuing from it.",
          "previous_response_not_ended");
    r.previous_response_id = *prev;
    previous_items = std::move(e->items);
  }
  if (field(body, "prompt")) unsupported("prompt", "'prompt' (stored prompt templates)");
  r.stream = get_bool(body, "stream").value_or(false);
  r.background = get_bool(body, "background").value_or(false);
  if (r.background && !r.store)
    bad("background", "Invalid value for 'background': a background response must be stored ('store': true): it is "
                      "retrieved with GET /v1/responses/{id}.");
  r.max_output_tokens = get_int(body, "max_output_tokens", 1, INT64_MAX);
  r.sampling = sampling_defaults(cfg, seed);
  if (auto v = get_number(body, "temperature", 0, 2)) r.sampling.temperature = float(*v);
  if (auto v = get_number(body, "top_p", 0, 1)) {
    if (*v <= 0) bad("top_p", "Invalid value for 'top_p': must be greater than 0.");
    r.sampling.top_p = float(*v);
  }
  if (auto t = get_string(body, "truncation"); t && *t != "disabled" && *t != "auto")
    bad("truncation", "Invalid value for 'truncation': '" + *t + "'.");
  r.metadata = checked_metadata(body);  // up to 16 string pairs (request_fields.h)
  r.parallel_tool_calls = get_bool(body, "parallel_tool_calls").value_or(true);
  get_string(body, "user");  // (accepted and ignored, as `include`: typed as OpenAI types them)
  if (const ojson* inc = field(body, "include")) {
    if (!inc->is_array()) wrong_type("include", "an array of strings", *inc);
    for (size_t i = 0; i < inc->size(); ++i)
      if (!(*inc)[i].is_string()) wrong_type("include[" + std::to_string(i) + "]", "a string", (*inc)[i]);
  }
  ojson msgs = translate_input(body, r, previous_items);
  parse_tools(body, r);
  parse_tool_choice(body, r);
  parse_text_and_reasoning(body, r);
  if (r.continue_final && r.response_format != ResponseFormat::Text)
    bad("text.format", "'text.format' json_object / json_schema cannot be combined with a final assistant message: "
                       "its text is continued (a prefill), and the format constrains the whole text.",
        "invalid_last_message");
  if (r.continue_final && forces_call(r.tool_choice))
    bad("tool_choice", "A forced tool call cannot be combined with a final assistant message: its text is "
                       "continued (a prefill).", "invalid_last_message");

  ojson tr = ojson::object();
  tr["messages"] = std::move(msgs);
  if (!r.tools.is_null() && r.tool_choice != ToolChoice::None) tr["tools"] = r.tools;
  if (r.tool_choice == ToolChoice::None) r.tools = nullptr;
  if (!r.reasoning) tr["chat_template_kwargs"] = ojson{{"enable_thinking", false}};
  r.template_request = std::move(tr);
  return r;
}

}  // namespace lilac::server
