// Fuzz target of structured outputs: a JSON Schema made from the input is compiled to a grammar, then
// the input walks the grammar byte by byte (any allowed byte, the end when allowed) and the walk is
// completed by the shortest way to an end. Whatever the walk, the document is JSON and valid under the
// schema by an independent validator (tests/grammar/schema_validator.h): the grammar never lets the
// model write something the schema forbids.
#include <deque>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "fuzz/fuzz_target.h"
#include "grammar/config_space.h"
#include "grammar/schema.h"
#include "grammar/schema_validator.h"

namespace {

using lilac::fuzz::Input;
using lilac::fuzz::violated;
using J = nlohmann::ordered_json;

const char* const kNames[] = {"a", "b", "name", "c d", "\xc3\xa9t\xc3\xa9", "q\"uote", "x/y~z", "0"};
const char* const kPatterns[] = {"^[a-z]+$", "[0-9]{2}", "^(ab|cd)*$", "x", "^\\d{3}-\\d{4}$", "^[^\"\\\\]{0,3}$",
                                 "^.$", "^\\w+@\\w+$", "^(?:[A-F0-9]{2})+$"};
const char* const kFormats[] = {"date", "time", "date-time", "uuid", "email"};

J literal(Input& in) {
  switch (in.below(6)) {
    case 0: return nullptr;
    case 1: return in.flag();
    case 2: return int(in.below(200)) - 100;
    case 3: return (int(in.below(2000)) - 1000) / 8.0;
    case 4: return std::string(kNames[in.below(8)]);
    default: return J{{kNames[in.below(8)], int(in.below(5))}};
  }
}

J schema(Input& in, int depth) {
  const uint32_t pick = depth >= 4 ? in.below(6) : in.below(16);
  J s = J::object();
  switch (pick) {
    case 0:
      s["type"] = "string";
      if (in.flag()) s["minLength"] = in.below(4);
      if (in.flag()) s["maxLength"] = in.below(8);
      if (in.below(3) == 0) s["pattern"] = kPatterns[in.below(9)];
      else if (in.below(4) == 0) s["format"] = kFormats[in.below(5)];
      break;
    case 1:
      s["type"] = "integer";
      if (in.flag()) s["minimum"] = int(in.below(100)) - 50;
      if (in.flag()) s["maximum"] = int(in.below(100)) - 20;
      if (in.below(4) == 0) s["exclusiveMinimum"] = int(in.below(100)) - 50;
      if (in.below(4) == 0) s["exclusiveMaximum"] = int(in.below(100)) - 20;
      break;
    case 2: s["type"] = "number"; break;
    case 3: s["type"] = "boolean"; break;
    case 4: s["type"] = "null"; break;
    case 5: {
      J e = J::array();
      for (uint32_t i = 0, n = 1 + in.below(3); i < n; ++i) e.push_back(literal(in));
      s["enum"] = e;
      break;
    }
    case 6: s["const"] = literal(in); break;
    case 7:
    case 8: {
      s["type"] = "object";
      J props = J::object(), req = J::array();
      for (uint32_t i = 0, n = in.below(4); i < n; ++i) {
        const std::string k = kNames[in.below(8)];
        props[k] = schema(in, depth + 1);
        if (in.flag()) req.push_back(k);
      }
      if (!props.empty()) s["properties"] = props;
      if (!req.empty()) s["required"] = req;
      switch (in.below(4)) {
        case 0: s["additionalProperties"] = false; break;
        case 1: s["additionalProperties"] = schema(in, depth + 1); break;
        case 2: s["additionalProperties"] = true; break;
        default: break;
      }
      break;
    }
    case 9:
    case 10: {
      s["type"] = "array";
      if (in.below(3) == 0) {
        J pre = J::array();
        for (uint32_t i = 0, n = 1 + in.below(2); i < n; ++i) pre.push_back(schema(in, depth + 1));
        s["prefixItems"] = pre;
      }
      if (in.below(4)) s["items"] = schema(in, depth + 1);
      if (in.flag()) s["minItems"] = in.below(3);
      if (in.flag()) s["maxItems"] = in.below(4);
      break;
    }
    case 11:
    case 12: {
      static const char* const ks[] = {"anyOf", "oneOf", "allOf"};
      J b = J::array();
      for (uint32_t i = 0, n = 1 + in.below(3); i < n; ++i) b.push_back(schema(in, depth + 1));
      s[ks[in.below(3)]] = b;
      break;
    }
    case 13: s["type"] = J{"string", "null"}; break;
    case 14: s["$ref"] = "#/$defs/node"; break;
    default: break;  // {}: any JSON value
  }
  return s;
}

// A schema from the input (with a recursive $defs entry its $refs point to) and its grammar; false when
// the compiler refuses it (unsupported or unsatisfiable: a request would get a 400).
bool schema_and_grammar(Input& in, J& root, lilac::grammar::Grammar& g) {
  root = schema(in, 0);
  root["$defs"] = J::parse(
      R"({"node": {"type": "object", "properties": {"v": {"type": "integer"}, "next": {"$ref": "#/$defs/node"}},
                   "required": ["v"]}})");
  try {
    g = lilac::grammar::compile_json_schema(root);
  } catch (const lilac::Error&) {
    return false;
  }
  return true;
}

// The shortest bytes from `c` to a complete document (breadth first over configurations), or nothing when
// the search gives up (any-value schemas nest without bound: the configurations within reach explode).
std::optional<std::string> shortest_end(lilac::grammar::ConfigSpace& sp, int32_t c) {
  std::unordered_map<int32_t, std::pair<int32_t, int>> from{{c, {-1, -1}}};
  std::deque<int32_t> q{c};
  while (!q.empty()) {
    if (from.size() > 20000) return std::nullopt;
    const int32_t x = q.front();
    q.pop_front();
    if (sp.ended(x)) {
      std::string out;
      for (int32_t y = x; from[y].first >= 0; y = from[y].first) out.insert(out.begin(), char(from[y].second));
      return out;
    }
    for (int b = 0; b < 256; ++b) {
      const int32_t y = sp.step(x, lilac::grammar::Sym(b));
      if (y != lilac::grammar::ConfigSpace::kDead && !from.count(y)) {
        from[y] = {x, b};
        q.push_back(y);
      }
    }
  }
  violated("schema", "a live state from which no document can be completed");
}

}  // namespace

LILAC_FUZZ_TARGET(schema, "every document the schema's grammar allows is JSON valid under the schema") {
  Input in(data, size);
  J root;
  lilac::grammar::Grammar g;
  if (!schema_and_grammar(in, root, g)) return;
  lilac::grammar::ConfigSpace sp(g);
  int32_t c = sp.initial(g.root, 0);
  std::string doc;
  std::vector<int> allowed;
  while (!in.empty() && doc.size() < 2000) {
    if (sp.ended(c) && in.below(8) == 0) break;
    allowed.clear();
    for (int b = 0; b < 256; ++b)
      if (sp.step(c, lilac::grammar::Sym(b)) != lilac::grammar::ConfigSpace::kDead) allowed.push_back(b);
    if (allowed.empty()) {
      if (!sp.ended(c)) violated("schema", "a live state allows no byte: " + doc);
      break;
    }
    const int b = allowed[in.below(uint32_t(allowed.size()))];
    doc += char(b);
    c = sp.step(c, lilac::grammar::Sym(b));
  }
  if (!sp.ended(c)) {
    const std::optional<std::string> end = shortest_end(sp, c);
    if (!end) return;  // no verdict
    doc += *end;
  }
  J v;
  try {
    v = J::parse(doc);
  } catch (const std::exception& e) {
    violated("schema", "not JSON: " + doc + "\n  schema: " + root.dump());
  }
  const std::string why = lilac::grammar::test::Validator(root).check(v);
  if (!why.empty()) violated("schema", "invalid (" + why + "): " + doc + "\n  schema: " + root.dump());
}

namespace {

const J& deref(const J& root, const std::string& ref) { return root["$defs"][ref.substr(ref.rfind('/') + 1)]; }

// A string for one of kPatterns / kFormats (the validator decides whether it also meets the lengths).
const char* const kPatternStrings[] = {"abc", "x12y", "abcd", "axb", "123-4567", "a'b", "\xc3\xa9", "a_1@b", "0AFF"};
const char* const kFormatStrings[] = {"2024-02-29", "12:34:56Z", "2024-02-29T12:34:56.5+01:00",
                                      "123e4567-e89b-12d3-a456-426614174000", "a.b@example.com"};
const char* const kStringPieces[] = {"a", "Z", "0", " ", "\"", "\\", "/", "\n", "\t", "\x01", "\x1f", "\xc3\xa9",
                                     "\xe2\x82\xac", "\xf0\x9f\x98\x80", "<", "\xe2\x80\xa8", "}", "]"};

std::optional<J> instance(const J& s, const J& root, Input& in, int depth);

J any_value(Input& in, int depth) {
  if (depth > 3) return int(in.below(10));
  switch (in.below(6)) {
    case 0: return literal(in);
    case 1: return J::array({literal(in), literal(in)});
    case 2: return J{{kNames[in.below(8)], literal(in)}};
    default: return literal(in);
  }
}

std::optional<J> instance(const J& s, const J& root, Input& in, int depth) {
  if (depth > 8) return std::nullopt;
  if (s.is_boolean()) return s.get<bool>() ? std::optional<J>(any_value(in, depth)) : std::nullopt;
  if (s.contains("$ref")) return instance(deref(root, s["$ref"].get<std::string>()), root, in, depth + 1);
  if (s.contains("enum")) return s["enum"][in.below(uint32_t(s["enum"].size()))];
  if (s.contains("const")) return s["const"];
  for (const char* k : {"anyOf", "oneOf"})
    if (s.contains(k)) return instance(s[k][in.below(uint32_t(s[k].size()))], root, in, depth + 1);
  if (s.contains("allOf")) {  // several constraining branches merge as objects (schema.h): not generated here
    const J* only = nullptr;
    int constraining = 0;
    for (const J& b : s["allOf"])
      if (!b.empty()) {
        only = &b;
        ++constraining;
      }
    if (constraining > 1) return std::nullopt;
    return only ? instance(*only, root, in, depth + 1) : std::optional<J>(any_value(in, depth));
  }
  if (!s.contains("type")) return any_value(in, depth);
  std::string type = s["type"].is_array() ? s["type"][in.below(uint32_t(s["type"].size()))].get<std::string>()
                                          : s["type"].get<std::string>();
  if (type == "null") return J(nullptr);
  if (type == "boolean") return J(in.flag());
  if (type == "number") return J((int(in.below(4000)) - 2000) / 16.0);
  if (type == "integer") {
    int64_t lo = -1000, hi = 1000;
    if (s.contains("minimum")) lo = std::max(lo, s["minimum"].get<int64_t>());
    if (s.contains("exclusiveMinimum")) lo = std::max(lo, s["exclusiveMinimum"].get<int64_t>() + 1);
    if (s.contains("maximum")) hi = std::min(hi, s["maximum"].get<int64_t>());
    if (s.contains("exclusiveMaximum")) hi = std::min(hi, s["exclusiveMaximum"].get<int64_t>() - 1);
    if (lo > hi) return std::nullopt;
    return J(lo + int64_t(in.below(uint32_t(hi - lo + 1))));
  }
  if (type == "string") {
    if (s.contains("pattern")) {
      for (size_t i = 0; i < sizeof kPatterns / sizeof *kPatterns; ++i)
        if (s["pattern"] == kPatterns[i]) return J(kPatternStrings[i]);
      return std::nullopt;
    }
    if (s.contains("format")) {
      for (size_t i = 0; i < sizeof kFormats / sizeof *kFormats; ++i)
        if (s["format"] == kFormats[i]) return J(kFormatStrings[i]);
      return std::nullopt;
    }
    std::string str;
    const uint32_t lo = s.value("minLength", 0u), hi = s.value("maxLength", lo + 6u);
    for (uint32_t i = 0, n = lo + in.below(hi - lo + 1); i < n; ++i)
      str += kStringPieces[in.below(sizeof kStringPieces / sizeof *kStringPieces)];
    return J(str);
  }
  if (type == "object") {
    J o = J::object();
    const J props = s.value("properties", J::object());
    const J req = s.value("required", J::array());
    for (const auto& [k, ps] : props.items()) {
      bool needed = false;
      for (const auto& r : req) needed = needed || r == k;
      if (!needed && in.flag()) continue;
      auto v = instance(ps, root, in, depth + 1);
      if (!v) return std::nullopt;
      o[k] = *v;
    }
    for (const auto& r : req)
      if (!o.contains(r.get<std::string>())) return std::nullopt;  // required but not declared: skip
    const bool declares = s.contains("properties") || s.contains("required");
    const J* extra = s.contains("additionalProperties") ? &s["additionalProperties"] : nullptr;
    if ((extra && !(extra->is_boolean() && !extra->get<bool>())) || (!extra && !declares)) {
      for (uint32_t i = 0, n = in.below(3); i < n; ++i) {
        const std::string k = "extra" + std::to_string(i);
        auto v = extra && extra->is_object() ? instance(*extra, root, in, depth + 1) : std::optional<J>(any_value(in, depth + 1));
        if (!v) return std::nullopt;
        o[k] = *v;
      }
    }
    return o;
  }
  if (type == "array") {
    J a = J::array();
    const J pre = s.value("prefixItems", J::array());
    const uint32_t lo = s.value("minItems", 0u), hi = s.value("maxItems", lo + 3u);
    if (lo > hi) return std::nullopt;
    const uint32_t n = lo + in.below(hi - lo + 1);
    for (uint32_t i = 0; i < n; ++i) {
      std::optional<J> v;
      if (i < pre.size()) v = instance(pre[i], root, in, depth + 1);
      else if (s.contains("items")) v = instance(s["items"], root, in, depth + 1);
      else v = any_value(in, depth + 1);
      if (!v) return std::nullopt;
      a.push_back(*v);
    }
    return a;
  }
  return std::nullopt;
}

}  // namespace

// The other direction: a document the schema accepts, written compactly within the generated subset that
// lilac/grammar/schema.h documents (declared properties in order, extra ones after them and only where
// allowed), is one the grammar lets the model write.
LILAC_FUZZ_TARGET(schema_complete, "every compact document valid under a schema (in the documented subset) is allowed") {
  Input in(data, size);
  J root;
  lilac::grammar::Grammar g;
  if (!schema_and_grammar(in, root, g)) return;
  const std::optional<J> v = instance(root, root, in, 0);
  if (!v || !lilac::grammar::test::Validator(root).check(*v).empty()) return;
  const std::string doc = v->dump();
  lilac::grammar::ConfigSpace sp(g);
  int32_t c = sp.initial(g.root, 0);
  for (size_t i = 0; i < doc.size(); ++i) {
    c = sp.step(c, lilac::grammar::Sym(static_cast<unsigned char>(doc[i])));
    if (c == lilac::grammar::ConfigSpace::kDead)
      violated("schema_complete", "rejected at byte " + std::to_string(i) + ": " + doc + "\n  schema: " + root.dump());
  }
  if (!sp.ended(c)) violated("schema_complete", "incomplete: " + doc + "\n  schema: " + root.dump());
}
