// The keyword check of the whole schema tree, references, and small helpers of the compiler.
#include <cmath>
#include <set>

#include "grammar/regex.h"
#include "grammar/schema_internal.h"

namespace lilac::grammar::detail {

namespace {

const std::set<std::string_view>& annotations() {
  static const std::set<std::string_view> s{"title",   "description", "default",  "examples", "$schema",
                                            "$id",     "$comment",    "deprecated", "readOnly", "writeOnly"};
  return s;
}

const std::set<std::string_view>& supported() {
  static const std::set<std::string_view> s{
      "type",      "properties", "required",  "additionalProperties", "items",     "prefixItems",
      "minItems",  "maxItems",   "enum",      "const",                "anyOf",     "oneOf",
      "allOf",     "$ref",       "$defs",     "definitions",          "minLength", "maxLength",
      "pattern",   "format",     "minimum",   "maximum",              "exclusiveMinimum", "exclusiveMaximum"};
  return s;
}

const std::set<std::string_view>& type_names() {
  static const std::set<std::string_view> s{"null", "boolean", "object", "array", "number", "integer", "string"};
  return s;
}

const std::set<std::string_view>& formats() {
  static const std::set<std::string_view> s{"date", "time", "date-time", "uuid", "email"};
  return s;
}

std::string describe(const Json& v) {
  std::string s = dump_json(v);
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

class Checker {
 public:
  explicit Checker(const SchemaLimits& lim) : lim_(lim) {}

  void schema(const Json& node, const std::string& path, size_t depth) {
    if (depth > lim_.max_depth) fail(path, "", "schema nested deeper than " + std::to_string(lim_.max_depth) + " levels");
    if (++nodes_ > lim_.max_nodes) fail(path, "", "schema has more than " + std::to_string(lim_.max_nodes) + " subschemas");
    if (node.is_boolean()) return;
    if (!node.is_object()) fail(path, "", "a schema must be an object or a boolean, got " + describe(node));
    for (const auto& [key, val] : node.items()) {
      if (annotations().count(key)) continue;
      if (!supported().count(key)) fail(child_path(path, key), key, "unsupported JSON Schema keyword \"" + key + "\"");
      keyword(key, val, child_path(path, key), depth);
    }
  }

 private:
  void keyword(const std::string& key, const Json& v, const std::string& at, size_t depth) {
    auto bad = [&](const std::string& what) { fail(at, key, "\"" + key + "\" must be " + what + ", got " + describe(v)); };
    if (key == "type") {
      if (v.is_string()) {
        if (!type_names().count(v.get<std::string>())) bad("a JSON Schema type name");
      } else if (v.is_array() && !v.empty()) {
        std::set<std::string> seen;
        for (const Json& t : v)
          if (!t.is_string() || !type_names().count(t.get<std::string>()) || !seen.insert(t.get<std::string>()).second)
            bad("a type name or a non-empty list of distinct type names");
      } else {
        bad("a type name or a non-empty list of distinct type names");
      }
    } else if (key == "properties" || key == "$defs" || key == "definitions") {
      if (!v.is_object()) bad("an object");
      for (const auto& [name, sub] : v.items()) schema(sub, child_path(at, name), depth + 1);
    } else if (key == "required") {
      if (!v.is_array()) bad("an array of strings");
      for (const Json& s : v)
        if (!s.is_string()) bad("an array of strings");
    } else if (key == "additionalProperties") {
      schema(v, at, depth + 1);
    } else if (key == "items") {
      if (v.is_array())
        fail(at, key, "\"items\" as an array (draft-07 tuples) is not supported: use \"prefixItems\"");
      schema(v, at, depth + 1);
    } else if (key == "prefixItems" || key == "anyOf" || key == "oneOf" || key == "allOf") {
      if (!v.is_array() || v.empty()) bad("a non-empty array of schemas");
      for (size_t i = 0; i < v.size(); ++i) schema(v[i], child_path(at, std::to_string(i)), depth + 1);
    } else if (key == "minItems" || key == "maxItems" || key == "minLength" || key == "maxLength") {
      const bool integral = v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0) ||
                            (v.is_number_float() && v.get<double>() >= 0 && std::floor(v.get<double>()) == v.get<double>() &&
                             v.get<double>() < 9e15);
      if (!integral) bad("a non-negative integer");
    } else if (key == "enum") {
      if (!v.is_array() || v.empty()) bad("a non-empty array");
    } else if (key == "const") {
      // any value
    } else if (key == "$ref") {
      if (!v.is_string()) bad("a string");
    } else if (key == "pattern") {
      if (!v.is_string()) bad("a string");
      try {
        Nfa scratch(size_t(lim_.max_automaton) * 4);
        const int32_t end = scratch.add_state();
        add_pattern(scratch, scratch.start(), v.get<std::string>(), Encoding::JsonString, end);
      } catch (const PatternError& e) {
        fail(at, key, std::string("invalid or unsupported pattern: ") + e.what());
      } catch (const SizeError& e) {
        fail(at, key, std::string("pattern too large: ") + e.what());
      }
    } else if (key == "format") {
      if (!v.is_string()) bad("a string");
      if (!formats().count(v.get<std::string>()))
        fail(at, key, "format \"" + v.get<std::string>() + "\" is not supported (supported: date, time, date-time, uuid, email)");
    } else if (key == "minimum" || key == "maximum") {
      if (!v.is_number()) bad("a number");
    } else if (key == "exclusiveMinimum" || key == "exclusiveMaximum") {
      if (!v.is_number() && !v.is_boolean()) bad("a number");
    }
  }

  const SchemaLimits& lim_;
  size_t nodes_ = 0;
};

std::string unescape_pointer_token(const std::string& tok, const std::string& at) {
  std::string out;
  for (size_t i = 0; i < tok.size(); ++i) {
    if (tok[i] != '~') {
      out += tok[i];
      continue;
    }
    if (i + 1 < tok.size() && tok[i + 1] == '0') out += '~';
    else if (i + 1 < tok.size() && tok[i + 1] == '1') out += '/';
    else fail(at, "$ref", "invalid JSON pointer escape in $ref");
    ++i;
  }
  // Percent-encoding (URI fragments).
  std::string dec;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == '%' && i + 2 < out.size() && std::isxdigit(static_cast<unsigned char>(out[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(out[i + 2]))) {
      dec += char(std::stoi(out.substr(i + 1, 2), nullptr, 16));
      i += 2;
    } else {
      dec += out[i];
    }
  }
  return dec;
}

}  // namespace

void fail(const std::string& path, const std::string& keyword, const std::string& msg, const std::string& param) {
  throw SchemaError(msg + " at " + path, keyword, path, param);
}

std::string child_path(const std::string& path, std::string_view key) {
  std::string out = path;
  out += '/';
  for (char c : key) {
    if (c == '~') out += "~0";
    else if (c == '/') out += "~1";
    else out += c;
  }
  return out;
}

bool is_annotation(std::string_view key) { return annotations().count(key) != 0; }

bool is_constraint(std::string_view key) {
  return !is_annotation(key) && key != "$defs" && key != "definitions";
}

void check_schema(const Json& root, const SchemaLimits& lim) { Checker(lim).schema(root, "#", 0); }

const Json& resolve_ref(const Json& root, const std::string& ref, const std::string& at, std::string& target_path) {
  if (ref.empty() || ref[0] != '#')
    fail(at, "$ref", "only local references (\"#...\") are supported, got \"" + ref + "\"");
  if (ref.size() > 1 && ref[1] != '/')
    fail(at, "$ref", "anchors in $ref are not supported, got \"" + ref + "\"");
  const Json* cur = &root;
  target_path = "#";
  size_t i = 2;
  while (i <= ref.size() && ref.size() > 1) {
    size_t j = ref.find('/', i);
    if (j == std::string::npos) j = ref.size();
    const std::string tok = unescape_pointer_token(ref.substr(i, j - i), at);
    if (cur->is_object() && cur->contains(tok)) {
      cur = &(*cur)[tok];
    } else if (cur->is_array() && !tok.empty() && tok.size() <= 18 &&  // (more digits: past any array, and stoull's range)
               tok.find_first_not_of("0123456789") == std::string::npos && std::stoull(tok) < cur->size()) {
      cur = &(*cur)[size_t(std::stoull(tok))];
    } else {
      fail(at, "$ref", "$ref \"" + ref + "\" does not point to anything in the schema");
    }
    target_path = child_path(target_path, tok);
    i = j + 1;
  }
  return *cur;
}

unsigned declared_types(const Json& node) {
  if (!node.is_object()) return kAnyType;
  auto it = node.find("type");
  if (it != node.end()) {
    unsigned t = 0;
    auto bit = [](const std::string& s) -> unsigned {
      if (s == "null") return kNull;
      if (s == "boolean") return kBoolean;
      if (s == "object") return kObject;
      if (s == "array") return kArray;
      if (s == "string") return kString;
      if (s == "integer") return kInteger;
      return kNumber;
    };
    if (it->is_string()) return bit(it->get<std::string>());
    for (const Json& s : *it) t |= bit(s.get<std::string>());
    return t;
  }
  for (const char* k : {"$ref", "anyOf", "oneOf", "allOf", "enum", "const"})
    if (node.contains(k)) return 0;
  unsigned t = 0;
  for (const auto& [key, v] : node.items()) {
    if (key == "properties" || key == "required" || key == "additionalProperties") t |= kObject;
    else if (key == "items" || key == "prefixItems" || key == "minItems" || key == "maxItems") t |= kArray;
    else if (key == "minLength" || key == "maxLength" || key == "pattern" || key == "format") t |= kString;
    else if (key == "minimum" || key == "maximum" || key == "exclusiveMinimum" || key == "exclusiveMaximum") t |= kInteger;
  }
  return t ? t : kAnyType;
}

bool value_has_type(const Json& v, unsigned types) {
  if (v.is_null()) return types & kNull;
  if (v.is_boolean()) return types & kBoolean;
  if (v.is_object()) return types & kObject;
  if (v.is_array()) return types & kArray;
  if (v.is_string()) return types & kString;
  if (v.is_number_integer() || v.is_number_unsigned()) return types & (kInteger | kNumber);
  if (v.is_number_float()) {
    const double d = v.get<double>();
    return (types & kNumber) || ((types & kInteger) && std::floor(d) == d);
  }
  return false;
}

int64_t count_value(const Json& v) {
  if (v.is_number_float()) return int64_t(v.get<double>());
  if (v.is_number_unsigned()) return int64_t(std::min<uint64_t>(v.get<uint64_t>(), uint64_t(INT64_MAX)));
  return v.get<int64_t>();
}

}  // namespace lilac::grammar::detail
