#include "server/request_fields.h"

#include "text/json_dump.h"
#include "text/unicode.h"

#include <algorithm>
#include <cmath>

namespace lilac::server::fields {

void bad(const std::string& param, const std::string& msg, const std::string& code) {
  throw ApiError(400, msg, param, code);
}

const char* type_name(const ojson& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  return "an object";
}

void wrong_type(const std::string& param, const char* want, const ojson& v) {
  bad(param, "Invalid type for '" + param + "': expected " + want + ", but got " + type_name(v) + ".", "invalid_type");
}

void missing(const std::string& param) {
  bad(param, "Missing required parameter: '" + param + "'.", "missing_required_parameter");
}

const ojson* field(const ojson& obj, const char* key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

namespace {
std::string name_of(const char* key, const std::string& param) { return param.empty() ? std::string(key) : param; }
}  // namespace

std::optional<double> get_number(const ojson& obj, const char* key, double lo, double hi, const std::string& param) {
  const ojson* v = field(obj, key);
  if (!v) return std::nullopt;
  const std::string name = name_of(key, param);
  if (!v->is_number()) wrong_type(name, "a number", *v);
  double d = v->get<double>();
  if (!std::isfinite(d) || d < lo || d > hi)
    bad(name, "Invalid value for '" + name + "': " + dump_json(*v) + " is not in [" + dump_json(ojson(lo)) + ", " +
                  dump_json(ojson(hi)) + "].");
  return d;
}

std::optional<int64_t> get_int(const ojson& obj, const char* key, int64_t lo, int64_t hi, const std::string& param) {
  const ojson* v = field(obj, key);
  if (!v) return std::nullopt;
  const std::string name = name_of(key, param);
  bool integral = v->is_number_integer() || (v->is_number_float() && std::floor(v->get<double>()) == v->get<double>() &&
                                             std::abs(v->get<double>()) < 9e15);
  if (!integral) wrong_type(name, "an integer", *v);
  int64_t i = v->is_number_unsigned() ? int64_t(std::min<uint64_t>(v->get<uint64_t>(), uint64_t(INT64_MAX)))
              : v->is_number_integer() ? v->get<int64_t>()
                                       : int64_t(v->get<double>());
  if (i < lo || i > hi)
    bad(name, "Invalid value for '" + name + "': " + std::to_string(i) + " is not in [" + std::to_string(lo) + ", " +
                  std::to_string(hi) + "].");
  return i;
}

std::optional<bool> get_bool(const ojson& obj, const char* key, const std::string& param) {
  const ojson* v = field(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) wrong_type(name_of(key, param), "a boolean", *v);
  return v->get<bool>();
}

std::optional<std::string> get_string(const ojson& obj, const char* key, const std::string& param) {
  const ojson* v = field(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_string()) wrong_type(name_of(key, param), "a string", *v);
  return v->get<std::string>();
}

std::string need_string(const ojson& obj, const char* key, const std::string& param) {
  auto s = get_string(obj, key, param);
  if (!s) missing(param);
  return *s;
}

ojson checked_metadata(const ojson& body) {
  const ojson* m = field(body, "metadata");
  if (!m) return ojson::object();
  if (!m->is_object()) wrong_type("metadata", "an object of strings", *m);
  if (m->size() > kMaxMetadataPairs)
    bad("metadata", "Invalid 'metadata': at most " + std::to_string(kMaxMetadataPairs) + " key-value pairs (got " +
                        std::to_string(m->size()) + ").");
  for (const auto& [k, v] : m->items()) {
    // (the key is checked first: the params below quote it, and a client's key can be of any length)
    if (unicode::utf8_chars(k) > kMaxMetadataKeyChars)
      bad("metadata", "Invalid 'metadata': keys are at most " + std::to_string(kMaxMetadataKeyChars) + " characters.");
    const std::string p = "metadata." + k;
    if (!v.is_string()) wrong_type(p, "a string", v);
    if (unicode::utf8_chars(v.get_ref<const std::string&>()) > kMaxMetadataValueChars)
      bad(p, "Invalid '" + p + "': values are at most " + std::to_string(kMaxMetadataValueChars) + " characters.",
          "string_above_max_length");
  }
  return *m;
}

void check_tool_parameters(const ojson& ps, const std::string& param, const std::string& name) {
  auto invalid = [&](const std::string& what) {
    bad(param, "Invalid schema for function '" + name + "': " + what, "invalid_function_parameters");
  };
  if (auto props = ps.find("properties"); props != ps.end()) {
    if (!props->is_object()) invalid("'properties' must be an object.");
    for (auto it = props->begin(); it != props->end(); ++it)
      if (!it.value().is_object() && !it.value().is_boolean())
        invalid("property '" + it.key() + "' must be a JSON schema (an object).");
  }
  if (auto req = ps.find("required"); req != ps.end()) {
    if (!req->is_array()) invalid("'required' must be an array.");
    for (const auto& r : *req)
      if (!r.is_string()) invalid("'required' must list strings.");
  }
}

void check_stop_bytes(size_t n, size_t& total, const std::string& param) {
  if (n > kMaxStopBytes) bad(param, "A stop sequence may be at most " + std::to_string(kMaxStopBytes) + " bytes long.");
  if ((total += n) > kMaxStopTotalBytes)
    bad(param, "The stop sequences may be at most " + std::to_string(kMaxStopTotalBytes) + " bytes in all.");
}

void check_prefill_text(const std::string& text, const std::string& param) {
  if (!text.empty() && (text.back() == ' ' || text.back() == '\n' || text.back() == '\t' || text.back() == '\r'))
    bad(param,
        "The final assistant message's content ends with whitespace: it is continued from where it ends (a prefill), "
        "and the chat template trims it. Remove the trailing whitespace.",
        "invalid_last_message");
}

SamplingParams sampling_defaults(const ModelConfig& cfg, uint64_t seed) {
  SamplingParams sp;
  sp.temperature = cfg.default_temperature >= 0 ? cfg.default_temperature : 1.0f;
  sp.top_p = cfg.default_top_p > 0 ? cfg.default_top_p : 1.0f;
  sp.top_k = cfg.default_top_k > 0 ? cfg.default_top_k : 0;
  sp.min_p = cfg.default_min_p > 0 ? cfg.default_min_p : 0.0f;
  sp.presence_penalty =
      cfg.default_presence_penalty >= -2 && cfg.default_presence_penalty != -1 ? cfg.default_presence_penalty : 0.0f;
  sp.frequency_penalty = 0;
  sp.repetition_penalty = cfg.default_repetition_penalty > 0 ? cfg.default_repetition_penalty : 1.0f;
  sp.seed = seed;
  return sp;
}

}  // namespace lilac::server::fields
