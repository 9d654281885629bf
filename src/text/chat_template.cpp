// Chat templates: loading the checkpoint's Jinja template and rendering OpenAI chat requests with it.
#include "text/chat_template.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "core/error.h"
#include "text/bounded_json.h"
#include "text/jinja.h"

namespace lilac {

namespace {

using nlohmann::ordered_json;

class JinjaChatTemplate : public ChatTemplate {
 public:
  JinjaChatTemplate(const std::string& source, const std::string& origin, std::string bos, std::string eos)
      : tmpl_(source, origin), source_(source), bos_(std::move(bos)), eos_(std::move(eos)) {}

  const std::string& source() const override { return source_; }

  std::string render(const ordered_json& variables) const override {
    if (!variables.is_object()) throw Error(tmpl_.origin() + ": template variables must be a JSON object");
    if (bos_.empty() && eos_.empty()) return tmpl_.render(variables);
    ordered_json vars = ordered_json::object();
    if (!bos_.empty()) vars["bos_token"] = bos_;
    if (!eos_.empty()) vars["eos_token"] = eos_;
    for (auto it = variables.begin(); it != variables.end(); ++it) vars[it.key()] = it.value();
    return tmpl_.render(vars);
  }

 private:
  jinja::Template tmpl_;
  std::string source_;
  std::string bos_, eos_;
};

std::string read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) throw Error("cannot read " + p.string());
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) throw Error("cannot read " + p.string());
  return ss.str();
}

// A special token in tokenizer_config.json: a string, {"content": "..."} or null.
std::string special_token(const ordered_json& cfg, const char* key, const std::string& origin) {
  if (!cfg.contains(key)) return "";
  const auto& v = cfg[key];
  if (v.is_null()) return "";
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  throw Error(origin + ": \"" + key + "\" must be a string or an object with a string \"content\"");
}

}  // namespace

std::unique_ptr<ChatTemplate> ChatTemplate::from_source(const std::string& source, const std::string& origin,
                                                        const std::string& bos_token, const std::string& eos_token) {
  return std::make_unique<JinjaChatTemplate>(source, origin, bos_token, eos_token);
}

std::unique_ptr<ChatTemplate> ChatTemplate::load(const std::string& dir) {
  namespace fs = std::filesystem;
  fs::path base(dir);
  fs::path jinja_path = base / "chat_template.jinja";
  fs::path cfg_path = base / "tokenizer_config.json";
  ordered_json cfg;
  bool have_cfg = fs::exists(cfg_path);
  if (have_cfg) {
    try {
      cfg = ordered_json::parse(read_file(cfg_path));
    } catch (const ordered_json::parse_error& e) {
      throw Error(cfg_path.string() + ": invalid JSON: " + e.what());
    }
    if (!cfg.is_object()) throw Error(cfg_path.string() + ": expected a JSON object");
  }
  std::string bos = have_cfg ? special_token(cfg, "bos_token", cfg_path.string()) : "";
  std::string eos = have_cfg ? special_token(cfg, "eos_token", cfg_path.string()) : "";
  if (fs::exists(jinja_path)) return from_source(read_file(jinja_path), jinja_path.string(), bos, eos);
  if (!have_cfg)
    throw Error("no chat template in " + dir + ": neither chat_template.jinja nor tokenizer_config.json exists");
  if (!cfg.contains("chat_template") || cfg["chat_template"].is_null())
    throw Error(cfg_path.string() + ": no \"chat_template\" (and no chat_template.jinja beside it)");
  const auto& ct = cfg["chat_template"];
  std::string origin = cfg_path.string() + " chat_template";
  if (ct.is_string()) return from_source(ct.get<std::string>(), origin, bos, eos);
  if (ct.is_array()) {
    for (const auto& e : ct) {
      if (e.is_object() && e.contains("name") && e["name"] == "default" && e.contains("template") &&
          e["template"].is_string())
        return from_source(e["template"].get<std::string>(), origin + " \"default\"", bos, eos);
    }
    throw Error(cfg_path.string() + ": \"chat_template\" list has no entry named \"default\"");
  }
  throw Error(cfg_path.string() + ": \"chat_template\" must be a string or a list of {name, template}");
}

namespace {

ordered_json normalise_message(const ordered_json& m, size_t idx) {
  std::string where = "messages[" + std::to_string(idx) + "]";
  if (!m.is_object()) throw InputError(where + ": each message must be a JSON object");
  if (!m.contains("role") || !m["role"].is_string()) throw InputError(where + ": \"role\" must be a string");
  ordered_json out = m;
  if (!out.contains("content") || out["content"].is_null()) {
    out["content"] = "";
  } else if (out["content"].is_array()) {
    size_t k = 0;
    bool all_text = true;
    std::string joined;
    for (const auto& part : out["content"]) {
      std::string pw = where + ".content[" + std::to_string(k++) + "]";
      if (!part.is_object()) throw InputError(pw + ": content parts must be objects");
      if (part.contains("type") && !part["type"].is_string()) throw InputError(pw + ": \"type\" must be a string");
      if (part.value("type", "") == "text" && (!part.contains("text") || !part["text"].is_string()))
        throw InputError(pw + ": a text part needs a string \"text\"");
      if (part.value("type", "") == "text") joined += part["text"].get_ref<const std::string&>();
      else all_text = false;
    }
    // Text parts become one string (concatenated, as templates that render parts do): templates that
    // expect a string then work too.
    if (all_text) out["content"] = std::move(joined);
  } else if (!out["content"].is_string()) {
    throw InputError(where + ": \"content\" must be a string, an array of content parts or null");
  }
  if (out.contains("tool_calls")) {
    auto& tcs = out["tool_calls"];
    if (tcs.is_null()) {
      out.erase("tool_calls");
    } else {
      if (!tcs.is_array()) throw InputError(where + ": \"tool_calls\" must be an array");
      size_t k = 0;
      for (auto& tc : tcs) {
        std::string tw = where + ".tool_calls[" + std::to_string(k++) + "]";
        if (!tc.is_object()) throw InputError(tw + ": each tool call must be an object");
        if (!tc.contains("function")) continue;
        auto& fn = tc["function"];
        if (!fn.is_object()) throw InputError(tw + ": \"function\" must be an object");
        if (fn.contains("arguments") && fn["arguments"].is_string()) {
          // The Qwen3.6 template iterates over the arguments: parse a JSON object given as a string.
          JsonParseResult parsed = parse_bounded_json(fn["arguments"].get<std::string>());
          if (parsed.ok() && parsed.value.is_object()) fn["arguments"] = std::move(parsed.value);
        }
      }
    }
  }
  return out;
}

// Nesting depth of a JSON value, without recursion (requests come from users).
size_t json_depth(const ordered_json& root) {
  size_t max_depth = 0;
  std::vector<std::pair<const ordered_json*, size_t>> stack{{&root, 1}};
  while (!stack.empty()) {
    auto [j, d] = stack.back();
    stack.pop_back();
    max_depth = std::max(max_depth, d);
    if (j->is_structured())
      for (const auto& c : *j) stack.emplace_back(&c, d + 1);
  }
  return max_depth;
}

}  // namespace

std::string render_chat_request(const ChatTemplate& tmpl, const ordered_json& request) {
  if (!request.is_object()) throw InputError("chat request must be a JSON object");
  if (json_depth(request) > 128) throw InputError("chat request is nested too deeply (more than 128 levels)");
  if (!request.contains("messages") || !request["messages"].is_array())
    throw InputError("\"messages\" must be an array");
  ordered_json vars = ordered_json::object();
  if (request.contains("chat_template_kwargs") && !request["chat_template_kwargs"].is_null()) {
    const auto& kw = request["chat_template_kwargs"];
    if (!kw.is_object()) throw InputError("\"chat_template_kwargs\" must be an object");
    for (auto it = kw.begin(); it != kw.end(); ++it) vars[it.key()] = it.value();
  }
  ordered_json messages = ordered_json::array();
  size_t idx = 0;
  for (const auto& m : request["messages"]) messages.push_back(normalise_message(m, idx++));
  vars["messages"] = std::move(messages);
  if (request.contains("tools") && !request["tools"].is_null()) {
    if (!request["tools"].is_array()) throw InputError("\"tools\" must be an array");
    vars["tools"] = request["tools"];
  } else {
    vars["tools"] = nullptr;  // Hugging Face passes tools=None
  }
  bool agp = true;
  if (request.contains("add_generation_prompt") && !request["add_generation_prompt"].is_null()) {
    if (!request["add_generation_prompt"].is_boolean()) throw InputError("\"add_generation_prompt\" must be a boolean");
    agp = request["add_generation_prompt"].get<bool>();
  }
  vars["add_generation_prompt"] = agp;
  try {
    return tmpl.render(vars);
  } catch (const InputError&) {
    throw;
  } catch (const Error& e) {
    // The template rejected this request (raise_exception, or e.g. content of a type it cannot handle):
    // the request is at fault, as servers such as vLLM answer (400).
    throw InputError(e.what());
  }
}

}  // namespace lilac
