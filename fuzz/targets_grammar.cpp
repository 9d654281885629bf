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
  J root = schema(in, 0);
  root["$defs"] = J::parse(
      R"({"node": {"type": "object", "properties": {"v": {"type": "integer"}, "next": {"$ref": "#/$defs/node"}},
                   "required": ["v"]}})");
  lilac::grammar::Grammar g;
  try {
    g = lilac::grammar::compile_json_schema(root);
  } catch (const lilac::Error&) {
    return;  // unsupported or unsatisfiable: the request gets a 400
  }
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
