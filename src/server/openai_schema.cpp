#include "server/openai_schema.h"

#include "server/generation.h"
#include "server/request_fields.h"
#include "server/request_json.h"
#include "text/json_dump.h"

#include <cmath>
#include <regex>
#include <set>

namespace lilac::server {

nlohmann::json error_body(int status, const std::string& message, const std::string& type, const std::string& param,
                          const std::string& code) {
  nlohmann::json e;
  e["message"] = message;
  e["type"] = type.empty() ? error_type_for(status) : type;
  e["param"] = param.empty() ? nlohmann::json(nullptr) : nlohmann::json(param);
  e["code"] = code.empty() ? nlohmann::json(nullptr) : nlohmann::json(code);
  return nlohmann::json{{"error", e}};
}

nlohmann::json error_body(const ApiError& e) { return error_body(e.status, e.message, e.type, e.param, e.code); }

namespace {

using namespace fields;

// An object member that must be there: absent or null is missing, another type invalid_type (either names `param`).
const ojson* need_object(const ojson& obj, const char* key, const std::string& param) {
  const ojson* v = field(obj, key);
  if (!v) missing(param);
  if (!v->is_object()) wrong_type(param, "an object", *v);
  return v;
}

// response_format: {"type": "text" | "json_object" | "json_schema", "json_schema": {"name", "schema",
// "strict", "description"}}. The schema itself is checked when it is compiled (GenerationCore).
void parse_response_format(const ojson& body, CommonParams& p) {
  const ojson* rf = field(body, "response_format");
  if (!rf) return;
  if (!rf->is_object()) wrong_type("response_format", "an object", *rf);
  const std::string ty = need_string(*rf, "type", "response_format.type");
  if (ty == "text") return;
  if (ty == "json_object") {
    p.response_format = ResponseFormat::JsonObject;
    return;
  }
  if (ty != "json_schema") bad("response_format.type", "Invalid value for 'response_format.type': '" + ty + "'.");
  const ojson* js = field(*rf, "json_schema");
  if (!js) bad("response_format.json_schema", "Missing required parameter: 'response_format.json_schema'.", "missing_required_parameter");
  if (!js->is_object()) wrong_type("response_format.json_schema", "an object", *js);
  const ojson* name = field(*js, "name");
  if (!name) bad("response_format.json_schema.name", "Missing required parameter: 'response_format.json_schema.name'.", "missing_required_parameter");
  static const std::regex name_re("^[A-Za-z0-9_-]{1,64}$");
  if (!name->is_string() || !std::regex_match(name->get<std::string>(), name_re))
    bad("response_format.json_schema.name",
        "Invalid 'response_format.json_schema.name': must be 1-64 characters of a-z, A-Z, 0-9, underscores and dashes.");
  if (const ojson* d = field(*js, "description"); d && !d->is_string())
    wrong_type("response_format.json_schema.description", "a string", *d);
  // "strict" is accepted either way: the schema is always enforced.
  if (const ojson* st = field(*js, "strict"); st && !st->is_boolean())
    wrong_type("response_format.json_schema.strict", "a boolean", *st);
  p.response_format = ResponseFormat::JsonSchema;
  p.json_schema = ojson::object();
  if (const ojson* sc = field(*js, "schema")) {
    if (!sc->is_object() && !sc->is_boolean()) wrong_type("response_format.json_schema.schema", "an object", *sc);
    p.json_schema = *sc;
  }
}

// logit_bias: {"token id": bias in [-100, 100], ...}, at most kMaxLogitBias entries (checked before any is read: a
// huge object costs nothing more than its parse).
void parse_logit_bias(const ojson& body, const ModelConfig& cfg, SamplingParams& sp) {
  const ojson* lb = field(body, "logit_bias");
  if (!lb) return;
  if (!lb->is_object()) wrong_type("logit_bias", "an object mapping token ids to biases", *lb);
  if (lb->size() > size_t(kMaxLogitBias))
    bad("logit_bias", "Invalid 'logit_bias': at most " + std::to_string(kMaxLogitBias) + " tokens (got " +
                          std::to_string(lb->size()) + ").");
  for (auto it = lb->begin(); it != lb->end(); ++it) {
    const std::string& key = it.key();
    int64_t id = -1;
    if (!key.empty() && key.size() <= 10 && key.find_first_not_of("0123456789") == std::string::npos) id = std::stoll(key);
    if (id < 0 || id >= cfg.vocab_size)
      bad("logit_bias", "Invalid 'logit_bias': '" + key.substr(0, 32) + "' is not a token id in [0, " +
                            std::to_string(cfg.vocab_size) + ").");
    if (!it.value().is_number() || !(it.value().get<double>() >= -100 && it.value().get<double>() <= 100))
      bad("logit_bias", "Invalid 'logit_bias' value for token " + key + ": must be a number in [-100, 100].");
    // "1" and "01" are one token: the samplers add every entry, so two would take its bias past [-100, 100].
    for (const auto& [t, b] : sp.logit_bias)
      if (t == int32_t(id))
        bad("logit_bias", "Invalid 'logit_bias': token " + std::to_string(id) + " is named twice ('" + key.substr(0, 32) +
                              "').");
    sp.logit_bias.emplace_back(int32_t(id), float(it.value().get<double>()));
  }
}

void parse_common(const ojson& body, const ModelConfig& cfg, uint64_t seed, CommonParams& p, bool chat) {
  if (const ojson* m = field(body, "model")) {
    if (!m->is_string()) wrong_type("model", "a string", *m);
    p.model = m->get<std::string>();
  }
  p.stream = get_bool(body, "stream").value_or(false);
  if (const ojson* so = field(body, "stream_options")) {
    if (!so->is_object()) wrong_type("stream_options", "an object", *so);
    if (!p.stream) bad("stream_options", "'stream_options' is only allowed when 'stream' is true.");
    p.include_usage = get_bool(*so, "include_usage").value_or(false);
  }
  // n
  if (auto n = get_int(body, "n", 1, 128)) {
    if (*n > kMaxChoices)
      bad("n", "At most n = " + std::to_string(kMaxChoices) + " choices per request are supported (got " +
                   std::to_string(*n) + ").", "unsupported_value");
    p.n = int(*n);
  }
  if (auto b = get_int(body, "best_of", 1, 128); b && *b != 1)
    bad("best_of", "Only best_of = 1 is supported.", "unsupported_value");
  // max tokens
  // (completions: 0 is allowed by the range and refused there unless `echo` asks only for the prompt)
  auto mt = get_int(body, "max_tokens", chat ? 1 : 0, INT64_MAX);
  if (chat) {
    auto mct = get_int(body, "max_completion_tokens", 1, INT64_MAX);
    if (mct) mt = mct;
  }
  p.max_tokens = mt;
  // stop (its bounds: check_stop_bytes)
  size_t stop_bytes = 0;
  auto stop_string = [&](const std::string& x) {
    check_stop_bytes(x.size(), stop_bytes, "stop");
    if (!x.empty()) p.stop.push_back(x);
  };
  if (const ojson* s = field(body, "stop")) {
    if (s->is_string()) {
      stop_string(s->get<std::string>());
    } else if (s->is_array()) {
      if (s->size() > 16) bad("stop", "At most 16 stop sequences are supported.");
      for (auto& x : *s) {
        if (!x.is_string()) wrong_type("stop", "a string or an array of strings", x);
        stop_string(x.get<std::string>());
      }
    } else {
      wrong_type("stop", "a string or an array of strings", *s);
    }
  }
  // sampling: request, else generation_config.json, else OpenAI defaults
  SamplingParams& sp = p.sampling;
  sp = sampling_defaults(cfg, seed);
  if (auto v = get_number(body, "temperature", 0, 2)) sp.temperature = float(*v);
  if (auto v = get_number(body, "top_p", 0, 1)) sp.top_p = float(*v);
  if (sp.top_p <= 0) bad("top_p", "Invalid value for 'top_p': must be greater than 0.");
  if (auto tk = get_int(body, "top_k", -1, 1 << 30)) sp.top_k = int(std::max<int64_t>(0, *tk));
  if (auto v = get_number(body, "min_p", 0, 1)) sp.min_p = float(*v);
  if (auto v = get_number(body, "presence_penalty", -2, 2)) sp.presence_penalty = float(*v);
  if (auto v = get_number(body, "frequency_penalty", -2, 2)) sp.frequency_penalty = float(*v);
  if (auto v = get_number(body, "repetition_penalty", 1e-3, 100)) sp.repetition_penalty = float(*v);
  if (const ojson* s = field(body, "seed")) {
    if (!s->is_number_integer()) wrong_type("seed", "an integer", *s);
    sp.seed = s->is_number_unsigned() ? s->get<uint64_t>() : uint64_t(s->get<int64_t>());
  }
  if (auto e = get_bool(body, "echo"); chat && e && *e)
    bad("echo", "'echo' is only supported by /v1/completions.", "unsupported_value");
  parse_response_format(body, p);
  parse_logit_bias(body, cfg, sp);
}

const std::regex& tool_name_re() {
  static const std::regex re("^[A-Za-z0-9_.\\-]{1,64}$");
  return re;
}

void validate_tools(const ojson& tools) {
  if (!tools.is_array()) wrong_type("tools", "an array", tools);
  std::set<std::string> names;
  for (size_t i = 0; i < tools.size(); ++i) {
    const ojson& t = tools[i];
    std::string pfx = "tools[" + std::to_string(i) + "]";
    if (!t.is_object()) wrong_type(pfx, "an object", t);
    auto ty = t.find("type");
    if (ty == t.end() || !ty->is_string() || *ty != "function")
      bad(pfx + ".type", "Invalid value for '" + pfx + ".type': only \"function\" tools are supported.");
    const ojson* f = need_object(t, "function", pfx + ".function");
    std::string name = need_string(*f, "name", pfx + ".function.name");
    if (!std::regex_match(name, tool_name_re()))
      bad(pfx + ".function.name", "Invalid '" + pfx + ".function.name': '" + name +
                                      "' must be 1-64 characters of a-z, A-Z, 0-9, underscores, dots and dashes.");
    if (!names.insert(name).second) bad(pfx + ".function.name", "Duplicate tool name '" + name + "'.");
    if (auto d = f->find("description"); d != f->end() && !d->is_null() && !d->is_string())
      wrong_type(pfx + ".function.description", "a string", *d);
    if (auto st = f->find("strict"); st != f->end() && !st->is_null() && !st->is_boolean())
      wrong_type(pfx + ".function.strict", "a boolean", *st);
    if (auto ps = f->find("parameters"); ps != f->end() && !ps->is_null()) {
      if (!ps->is_object()) wrong_type(pfx + ".function.parameters", "an object (a JSON schema)", *ps);
      // A JSON schema of type "object" (an empty object means no parameters).
      auto pt = ps->find("type");
      if (!ps->empty() && (pt == ps->end() || !(pt->is_string() && *pt == "object")))
        bad(pfx + ".function.parameters",
            "Invalid schema for function '" + name + "': parameters must be a JSON schema of type \"object\", got " +
                (pt == ps->end() ? std::string("no type") : "type " + dump_json(*pt)) + ".",
            "invalid_function_parameters");
      check_tool_parameters(*ps, pfx + ".function.parameters", name);
    }
  }
}

std::string check_content(const ojson& c, const std::string& pfx, bool allow_null) {
  if (c.is_null()) {
    if (!allow_null) bad(pfx, "Invalid value for '" + pfx + "': content must not be null for this role.");
    return "null";
  }
  if (c.is_string()) return "string";
  if (!c.is_array()) wrong_type(pfx, "a string or an array of content parts", c);
  for (size_t k = 0; k < c.size(); ++k) {
    const ojson& part = c[k];
    std::string pp = pfx + "[" + std::to_string(k) + "]";
    if (!part.is_object()) wrong_type(pp, "an object", part);
    const std::string ty = need_string(part, "type", pp + ".type");
    if (ty != "text")
      bad(pp + ".type", "Content parts of type '" + ty + "' are not supported (text only).", "unsupported_value");
    need_string(part, "text", pp + ".text");
  }
  return "array";
}

void validate_messages(const ojson& body) {
  const ojson* msgs = field(body, "messages");
  if (!msgs) bad("messages", "Missing required parameter: 'messages'.", "missing_required_parameter");
  if (!msgs->is_array()) wrong_type("messages", "an array", *msgs);
  if (msgs->empty()) bad("messages", "Invalid 'messages': empty array. Expected an array with at least 1 message.", "empty_array");
  static const std::set<std::string> roles = {"system", "developer", "user", "assistant", "tool"};
  for (size_t i = 0; i < msgs->size(); ++i) {
    const ojson& m = (*msgs)[i];
    std::string pfx = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) wrong_type(pfx, "an object", m);
    auto r = m.find("role");
    if (r == m.end() || r->is_null()) bad(pfx + ".role", "Missing required parameter: '" + pfx + ".role'.", "missing_required_parameter");
    if (!r->is_string()) wrong_type(pfx + ".role", "a string", *r);
    std::string role = r->get<std::string>();
    if (!roles.count(role))
      bad(pfx + ".role", "Invalid value for '" + pfx + ".role': '" + role +
                             "'. Supported values are: 'system', 'developer', 'user', 'assistant' and 'tool'.");
    auto c = m.find("content");
    bool has_tool_calls = false;
    if (role == "assistant") {
      auto tc = m.find("tool_calls");
      if (tc != m.end() && !tc->is_null()) {
        if (!tc->is_array()) wrong_type(pfx + ".tool_calls", "an array", *tc);
        for (size_t k = 0; k < tc->size(); ++k) {
          const ojson& call = (*tc)[k];
          std::string cp = pfx + ".tool_calls[" + std::to_string(k) + "]";
          if (!call.is_object()) wrong_type(cp, "an object", call);
          const ojson* f = need_object(call, "function", cp + ".function");
          need_string(*f, "name", cp + ".function.name");
          auto args = f->find("arguments");
          if (args != f->end() && !args->is_null()) {
            if (args->is_string()) {
              parse_tool_arguments(args->get_ref<const std::string&>(), cp + ".function.arguments");
            } else if (!args->is_object()) {
              wrong_type(cp + ".function.arguments", "a JSON string or an object", *args);
            }
          }
        }
        has_tool_calls = !tc->empty();
      }
    }
    if (c == m.end()) {
      if (role != "assistant" || !has_tool_calls)
        if (role != "assistant") bad(pfx + ".content", "Missing required parameter: '" + pfx + ".content'.", "missing_required_parameter");
    } else {
      check_content(*c, pfx + ".content", role == "assistant");
    }
    if (auto n = m.find("name"); n != m.end() && !n->is_null() && !n->is_string()) wrong_type(pfx + ".name", "a string", *n);
    if (role == "tool") {
      if (auto id = m.find("tool_call_id"); id != m.end() && !id->is_null() && !id->is_string())
        wrong_type(pfx + ".tool_call_id", "a string", *id);
    }
  }
  const std::string last = msgs->back()["role"].get<std::string>();
  if (last == "assistant") {  // a prefill: the model continues this message's content
    const ojson& m = msgs->back();
    if (const ojson* tc = field(m, "tool_calls"); tc && !tc->empty())
      bad("messages", "The last message is the assistant's tool calls: a conversation that ends with calls goes on "
                      "with their results (tool messages), not with more of that message.", "invalid_last_message");
    std::string text;
    if (const ojson* c = field(m, "content"); c && c->is_string()) text = c->get<std::string>();
    else if (c)
      for (const ojson& part : *c) text += part["text"].get<std::string>();
    check_prefill_text(text);
  }
  if (last == "system" || last == "developer") {
    bool has_user = false;
    for (auto& m : *msgs) has_user |= m["role"] == "user";
    if (!has_user) bad("messages", "The conversation has no user message to answer.", "invalid_last_message");
  }
}

}  // namespace

ChatParams parse_chat_request(const ojson& body, const ModelConfig& cfg, uint64_t seed) {
  if (!body.is_object()) throw ApiError(400, "The request body must be a JSON object.", "", "invalid_json");
  ChatParams p;
  validate_messages(body);
  parse_common(body, cfg, seed, p, true);
  // logprobs
  p.logprobs = get_bool(body, "logprobs").value_or(false);
  if (auto tl = get_int(body, "top_logprobs", 0, 20)) {
    if (!p.logprobs && *tl > 0) bad("top_logprobs", "'top_logprobs' requires 'logprobs' to be true.");
    p.top_logprobs = int(*tl);
  }
  p.sampling.logprobs = p.logprobs;
  p.sampling.top_logprobs = p.top_logprobs;
  // tools
  if (const ojson* t = field(body, "tools")) {
    validate_tools(*t);
    if (!t->empty()) p.tools = *t;
  }
  if (const ojson* tc = field(body, "tool_choice")) {
    if (tc->is_string()) {
      std::string s = tc->get<std::string>();
      if (s == "auto") p.tool_choice = ToolChoice::Auto;
      else if (s == "none") p.tool_choice = ToolChoice::None;
      else if (s == "required") p.tool_choice = ToolChoice::Required;
      else bad("tool_choice", "Invalid value for 'tool_choice': '" + s + "'. Supported values are: 'none', 'auto' and 'required'.");
    } else if (tc->is_object()) {
      auto f = tc->find("function");
      auto ty = tc->find("type");
      if (ty == tc->end() || *ty != "function" || f == tc->end() || !f->is_object() || !f->contains("name") ||
          !(*f)["name"].is_string())
        bad("tool_choice", "Invalid 'tool_choice': expected {\"type\": \"function\", \"function\": {\"name\": ...}}.");
      p.tool_choice = ToolChoice::Function;
      p.tool_choice_name = (*f)["name"].get<std::string>();
    } else {
      wrong_type("tool_choice", "a string or an object", *tc);
    }
    if (forces_call(p.tool_choice)) {
      if (p.tools.is_null())
        bad("tool_choice", "'tool_choice' requires 'tools' to be given.", "invalid_value");
    }
    if (p.tool_choice == ToolChoice::Function) {
      bool found = false;
      for (auto& t : p.tools) found |= t["function"]["name"] == p.tool_choice_name;
      if (!found) bad("tool_choice", "Invalid 'tool_choice': no tool named '" + p.tool_choice_name + "' in 'tools'.");
    }
  }
  p.parallel_tool_calls = get_bool(body, "parallel_tool_calls").value_or(true);
  // OpenAI's `store` and `metadata` (the completion kept for its dashboard, tagged): accepted and ignored (nothing is
  // stored), but checked as OpenAI checks them, so that a client's mistake is not silently accepted here and refused there.
  get_bool(body, "store");
  checked_metadata(body);
  p.continue_final = body["messages"].back()["role"] == "assistant";
  if (p.continue_final && p.response_format != ResponseFormat::Text)
    bad("response_format", "'response_format' cannot be combined with a final assistant message: its content is "
                           "continued (a prefill), and the format constrains the whole content.", "invalid_last_message");
  if (p.continue_final && forces_call(p.tool_choice))
    bad("tool_choice", "A forced tool call cannot be combined with a final assistant message: its content is continued "
                       "(a prefill). Use tool_choice 'auto', or end the conversation with a user or tool message.",
        "invalid_last_message");
  // chat_template_kwargs (and a top-level enable_thinking, which some clients send)
  ojson kwargs = ojson::object();
  if (const ojson* k = field(body, "chat_template_kwargs")) {
    if (!k->is_object()) wrong_type("chat_template_kwargs", "an object", *k);
    kwargs = *k;
  }
  if (auto et = get_bool(body, "enable_thinking"); et && !kwargs.contains("enable_thinking"))
    kwargs["enable_thinking"] = *et;
  ojson tr = ojson::object();
  tr["messages"] = body["messages"];
  if (!p.tools.is_null() && p.tool_choice != ToolChoice::None) tr["tools"] = p.tools;
  if (p.tool_choice == ToolChoice::None) p.tools = nullptr;
  if (!kwargs.empty()) tr["chat_template_kwargs"] = kwargs;
  p.template_request = std::move(tr);
  return p;
}

CompletionParams parse_completion_request(const ojson& body, const ModelConfig& cfg, uint64_t seed) {
  if (!body.is_object()) throw ApiError(400, "The request body must be a JSON object.", "", "invalid_json");
  CompletionParams p;
  const ojson* pr = field(body, "prompt");
  if (!pr) bad("prompt", "Missing required parameter: 'prompt'.", "missing_required_parameter");
  auto as_ids = [&](const ojson& a) {
    std::vector<int32_t> ids;
    for (auto& x : a) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= cfg.vocab_size)
        bad("prompt", "Invalid 'prompt': token ids must be integers in [0, " + std::to_string(cfg.vocab_size) + ").");
      ids.push_back(int32_t(x.get<int64_t>()));
    }
    if (ids.empty()) bad("prompt", "Invalid 'prompt': a prompt of token ids is empty.");
    return ids;
  };
  auto text = [&](const ojson& t) {
    if (t.get<std::string>().empty()) bad("prompt", "Invalid 'prompt': it is empty.");
    return CompletionPrompt{t.get<std::string>(), std::nullopt};
  };
  // A string, an array of ids, or an array of prompts (strings or id arrays, not mixed).
  if (pr->is_string()) {
    p.prompts.push_back(text(*pr));
  } else if (pr->is_array()) {
    if (pr->empty()) bad("prompt", "Invalid 'prompt': empty array.", "empty_array");
    const ojson& first = (*pr)[0];
    if (first.is_string() || first.is_array()) {
      if (pr->size() > size_t(kMaxPrompts))
        bad("prompt", "At most " + std::to_string(kMaxPrompts) + " prompts per request are supported (got " +
                          std::to_string(pr->size()) + ").", "unsupported_value");
      for (const auto& x : *pr) {
        if (x.is_string() != first.is_string() || x.is_array() != first.is_array())
          wrong_type("prompt", "an array of strings or an array of token-id arrays (not mixed)", x);
        p.prompts.push_back(x.is_string() ? text(x) : CompletionPrompt{"", as_ids(x)});
      }
    } else {
      p.prompts.push_back(CompletionPrompt{"", as_ids(*pr)});
    }
  } else {
    wrong_type("prompt", "a string, an array of strings or an array of token ids", *pr);
  }
  if (field(body, "suffix")) bad("suffix", "'suffix' is not supported.", "unsupported_value");
  parse_common(body, cfg, seed, p, false);
  p.echo = get_bool(body, "echo").value_or(false);
  if (!p.max_tokens) p.max_tokens = 16;  // OpenAI's default for completions
  if (*p.max_tokens == 0 && !p.echo)
    bad("max_tokens", "Invalid 'max_tokens': must be at least 1 (0 only with 'echo': the prompt alone, scored with "
                      "'logprobs').", "invalid_value");
  if (int64_t(p.prompts.size()) * p.n > kMaxGenerations)
    bad("n", "At most " + std::to_string(kMaxGenerations) + " generations (prompts × n) per request are supported (got " +
                 std::to_string(p.prompts.size()) + " × " + std::to_string(p.n) + ").", "unsupported_value");
  if (auto lp = get_int(body, "logprobs", 0, 20)) {
    p.logprobs = true;
    p.top_logprobs = int(*lp);
  }
  p.sampling.logprobs = p.logprobs;
  p.sampling.top_logprobs = p.top_logprobs;
  return p;
}

void apply_chat_prompt(ojson template_request, ojson tools, bool continue_final, ToolChoice choice,
                       const std::string& function, GenerationSpec& spec) {
  spec.input = GenerationSpec::Input::Chat;
  spec.chat = std::move(template_request);
  spec.tools = std::move(tools);
  spec.continue_final = continue_final;
  spec.force_tool_call = forces_call(choice);
  if (choice == ToolChoice::Function) spec.forced_function = function;
}

void apply_response_format(ResponseFormat f, const ojson& json_schema, GenerationSpec& spec) {
  switch (f) {
    case ResponseFormat::Text:
      spec.format = GenerationSpec::Format::Text;
      break;
    case ResponseFormat::JsonObject:
      spec.format = GenerationSpec::Format::JsonObject;
      break;
    case ResponseFormat::JsonSchema:
      spec.format = GenerationSpec::Format::JsonSchema;
      spec.schema = json_schema;
      break;
  }
}

}  // namespace lilac::server
