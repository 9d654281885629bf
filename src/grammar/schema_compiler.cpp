// Schema nodes -> rules: dispatch on the keywords of a node ($ref, enum/const, anyOf/oneOf, allOf,
// types), the oneOf disjointness check, and the public entry points.
#include <map>
#include <set>

#include "grammar/schema_internal.h"

namespace lilac::grammar {

namespace detail {

namespace {

// What a oneOf branch can be, coarsely, to prove branches disjoint.
struct Shape {
  unsigned types = 0;                       // possible JSON types (integer folded into number)
  std::optional<std::set<std::string>> literals;  // exactly these values (serialized)
  std::map<std::string, std::set<std::string>> tags;  // required properties with literal values
};

unsigned fold(unsigned t) { return (t & kInteger) ? ((t & ~unsigned(kInteger)) | kNumber) : t; }

unsigned literal_type(const Json& v) {
  if (v.is_null()) return kNull;
  if (v.is_boolean()) return kBoolean;
  if (v.is_object()) return kObject;
  if (v.is_array()) return kArray;
  if (v.is_string()) return kString;
  return kNumber;
}

// `left`: subschemas it may still visit (SchemaLimits::max_expansion).
Shape shape_of(const Json& root, const Json& node, const std::string& path, int depth, size_t& left) {
  if (left == 0)
    fail(path, "oneOf", "the oneOf branches expand to too many subschemas (through $ref) to check that they are disjoint");
  --left;
  Shape s;
  if (node.is_boolean() || depth > 16) {
    s.types = node.is_boolean() && !node.get<bool>() ? 0 : unsigned(kAnyType);
    s.types = fold(s.types);
    return s;
  }
  if (auto r = node.find("$ref"); r != node.end()) {
    std::string tp;
    return shape_of(root, resolve_ref(root, r->get<std::string>(), path, tp), tp, depth + 1, left);
  }
  const Json* lits = nullptr;
  Json one;
  if (auto c = node.find("const"); c != node.end()) {
    one = Json::array({*c});
    lits = &one;
  } else if (auto e = node.find("enum"); e != node.end()) {
    lits = &*e;
  }
  if (lits) {
    const unsigned allowed = node.contains("type") ? declared_types(node) : unsigned(kAnyType);
    s.literals.emplace();
    for (const Json& v : *lits)
      if (value_has_type(v, allowed)) {
        s.literals->insert(dump_json(v));
        s.types |= literal_type(v);
      }
    return s;
  }
  for (const char* k : {"anyOf", "oneOf"})
    if (auto a = node.find(k); a != node.end()) {
      for (size_t i = 0; i < a->size(); ++i)
        s.types |= shape_of(root, (*a)[i], child_path(path, k), depth + 1, left).types;
      return s;
    }
  if (auto a = node.find("allOf"); a != node.end()) {
    s.types = fold(kAnyType);
    for (size_t i = 0; i < a->size(); ++i) s.types &= shape_of(root, (*a)[i], path, depth + 1, left).types;
    return s;
  }
  s.types = fold(declared_types(node));
  if (s.types == kObject) {
    std::set<std::string> required;
    if (auto r = node.find("required"); r != node.end())
      for (const Json& n : *r) required.insert(n.get<std::string>());
    if (auto p = node.find("properties"); p != node.end())
      for (const auto& [name, sub] : p->items())
        if (required.count(name)) {
          Shape ps = shape_of(root, sub, child_path(path, name), depth + 1, left);
          if (ps.literals) s.tags[name] = *ps.literals;
        }
  }
  return s;
}

bool disjoint(const Shape& a, const Shape& b) {
  if ((a.types & b.types) == 0) return true;
  if (a.literals && b.literals) {
    for (const auto& v : *a.literals)
      if (b.literals->count(v)) return false;
    return true;
  }
  if (a.types == kObject && b.types == kObject)
    for (const auto& [name, vals] : a.tags) {
      auto it = b.tags.find(name);
      if (it == b.tags.end()) continue;
      bool overlap = false;
      for (const auto& v : vals) overlap = overlap || it->second.count(v);
      if (!overlap) return true;
    }
  return false;
}

}  // namespace

int32_t SchemaCompiler::reserve(const std::string& name) {
  Rule r;
  r.name = name;
  return g_.add_rule(std::move(r));
}

int32_t SchemaCompiler::add_rule(const Nfa& nfa, const std::string& name, const std::string& share_key) {
  Rule r;
  r.name = name;
  r.share_key = share_key;
  r.states = determinize(nfa, lim_.max_automaton, &work_);
  return g_.add_rule(std::move(r));
}

int32_t SchemaCompiler::shared(const std::string& key) const {
  auto it = shared_.find(key);
  return it == shared_.end() ? -1 : it->second;
}

std::string SchemaCompiler::literal(const Json& v) const {
  std::string s = dump_json(v);
  if (!xml_safe_) return s;
  std::string out;  // '<' only occurs inside strings in JSON text
  for (char c : s) {
    if (c == '<') out += "\\u003c";
    else out += c;
  }
  return out;
}

int32_t SchemaCompiler::nothing_rule(const std::string& path) {
  Rule r;
  r.name = "the schema at " + path;
  r.states.assign(1, RuleState{});
  return g_.add_rule(std::move(r));
}

int32_t SchemaCompiler::value_rule(const Json& node, const std::string& path) {
  if (node.is_boolean()) return node.get<bool>() ? any_value_rule() : nothing_rule(path);
  const std::string key = scope_ + path;
  if (auto it = by_path_.find(key); it != by_path_.end()) return it->second;
  // The schema check bounds nesting inside the document (max_depth), but $refs chain through $defs without bound:
  // each new subschema is a frame of this recursion (value_rule -> build_value / object_rule / array_rule ->
  // value_rule), and ~3,000 properties chained through $ref overflowed the 8 MB stack.
  if (active_ >= lim_.max_ref_depth)
    fail(path, "$ref", "schema nested deeper than " + std::to_string(lim_.max_ref_depth) + " levels through $ref");
  struct Depth {
    size_t& n;
    ~Depth() { --n; }
  } depth{++active_};
  // Reserved first: a $ref back to this node (recursion) calls this rule.
  const int32_t id = reserve("the schema at " + path);
  by_path_[key] = id;
  Nfa nfa(lim_.max_automaton * 4);
  const int32_t end = nfa.add_state();
  nfa.set_accept(end);
  build_value(node, path, nfa, nfa.start(), end);
  std::vector<RuleState> states = determinize(nfa, lim_.max_automaton, &work_);
  // A node that is just one call (e.g. a string with maxLength) is that callee: later users call
  // it directly (one frame less); users from inside the recursion keep the reserved wrapper.
  if (states.size() == 2 && states[0].ranges.empty() && states[0].calls.size() == 1 && !states[0].accept &&
      states[1].accept && states[1].ranges.empty() && states[1].calls.empty()) {
    by_path_[key] = states[0].calls[0].rule;
  }
  g_.rules[size_t(id)].states = std::move(states);
  return by_path_[key];
}

void SchemaCompiler::build_value(const Json& node, const std::string& path, Nfa& nfa, int32_t from, int32_t to) {
  auto constraints_besides = [&](std::initializer_list<std::string_view> allowed) -> std::string {
    for (const auto& [key, v] : node.items()) {
      if (!is_constraint(key)) continue;
      bool ok = false;
      for (auto a : allowed) ok = ok || key == a;
      if (!ok) return key;
    }
    return "";
  };
  if (auto r = node.find("$ref"); r != node.end()) {
    if (auto k = constraints_besides({"$ref"}); !k.empty())
      fail(child_path(path, k), k, "\"" + k + "\" next to \"$ref\" is not supported (wrap them in allOf)");
    std::string target_path;
    const Json& target = resolve_ref(*root_, r->get<std::string>(), child_path(path, "$ref"), target_path);
    nfa.add_call(from, value_rule(target, target_path), to);
    return;
  }
  if (node.contains("enum") || node.contains("const")) {
    if (auto k = constraints_besides({"enum", "const", "type"}); !k.empty())
      fail(child_path(path, k), k, "\"" + k + "\" next to \"enum\" / \"const\" is not supported");
    build_literals(node, path, nfa, from, to);
    return;
  }
  for (const char* comb : {"anyOf", "oneOf"}) {
    auto a = node.find(comb);
    if (a == node.end()) continue;
    if (auto k = constraints_besides({comb}); !k.empty())
      fail(child_path(path, k), k, "\"" + k + "\" next to \"" + comb + "\" is not supported");
    if (std::string_view(comb) == "oneOf") check_one_of(node, path);
    for (size_t i = 0; i < a->size(); ++i)
      nfa.add_call(from, value_rule((*a)[i], child_path(child_path(path, comb), std::to_string(i))), to);
    return;
  }
  if (auto a = node.find("allOf"); a != node.end()) {
    // Branches that constrain nothing (true, {}, annotations only) drop out: an allOf with one constraining
    // branch is that branch, whatever its type, and with none any value. Only several constraining branches
    // merge, as object schemas. ({"allOf": [{}, {}]} generated objects only; found by the schema_complete
    // fuzz target.) A false branch goes to the merge, which names it.
    std::vector<size_t> constraining;
    bool has_false = false;
    for (size_t i = 0; i < a->size(); ++i) {
      const Json& b = (*a)[i];
      has_false = has_false || (b.is_boolean() && !b.get<bool>());
      bool c = false;
      if (b.is_object())
        for (const auto& [key, v] : b.items()) c = c || is_constraint(key);
      if (c) constraining.push_back(i);
    }
    if (!has_false && constraining.size() <= 1 && constraints_besides({"allOf"}).empty()) {
      if (constraining.empty()) {
        nfa.add_call(from, any_value_rule(), to);
      } else {
        const size_t i = constraining[0];
        nfa.add_call(from, value_rule((*a)[i], child_path(child_path(path, "allOf"), std::to_string(i))), to);
      }
      return;
    }
    nfa.add_call(from, object_rule(merge_all_of(node, path), path), to);
    return;
  }
  const unsigned types = declared_types(node);
  if (types == kAnyType && !node.contains("type")) {
    nfa.add_call(from, any_value_rule(), to);
    return;
  }
  build_types(node, path, types, nfa, from, to);
}

void SchemaCompiler::build_types(const Json& node, const std::string& path, unsigned types, Nfa& nfa,
                                 int32_t from, int32_t to) {
  if (types & kNull) nfa.add_literal_to(from, "null", to);
  if (types & kBoolean) {
    nfa.add_literal_to(from, "true", to);
    nfa.add_literal_to(from, "false", to);
  }
  if (types & kString) nfa.add_call(from, string_value_rule(node, path), to);
  if (types & kNumber) {
    for (const char* k : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})
      if (node.contains(k))
        fail(child_path(path, k), k, std::string("\"") + k + "\" is supported for type \"integer\" only, not \"number\"");
    nfa.add_call(from, number_rule(), to);  // covers integers too
  } else if (types & kInteger) {
    nfa.add_call(from, integer_rule(node, path), to);
  }
  if (types & kObject) nfa.add_call(from, object_rule(object_spec(node, path), path), to);
  if (types & kArray) nfa.add_call(from, array_rule(node, path), to);
}

void SchemaCompiler::build_literals(const Json& node, const std::string& path, Nfa& nfa, int32_t from, int32_t to) {
  const unsigned allowed = node.contains("type") ? declared_types(node) : unsigned(kAnyType);
  auto add = [&](const Json& v) {
    if (value_has_type(v, allowed)) nfa.add_literal_to(from, literal(v), to);
  };
  if (auto c = node.find("const"); c != node.end()) {
    if (auto e = node.find("enum"); e != node.end()) {
      bool in = false;
      for (const Json& v : *e) in = in || v == *c;
      if (!in) fail(path, "const", "\"const\" is not one of the \"enum\" values: the schema matches nothing");
    }
    add(*c);
    return;
  }
  for (const Json& v : node["enum"]) add(v);
}

void SchemaCompiler::check_one_of(const Json& node, const std::string& path) {
  const Json& branches = node["oneOf"];
  const std::string at = child_path(path, "oneOf");
  std::vector<Shape> shapes;
  for (size_t i = 0; i < branches.size(); ++i)
    shapes.push_back(shape_of(*root_, branches[i], child_path(at, std::to_string(i)), 0, expansion_left_));
  for (size_t i = 0; i < shapes.size(); ++i)
    for (size_t j = i + 1; j < shapes.size(); ++j)
      if (!disjoint(shapes[i], shapes[j]))
        fail(at, "oneOf",
             "\"oneOf\" branches " + std::to_string(i) + " and " + std::to_string(j) +
                 " may both match the same value (only branches of different types, different const/enum "
                 "values, or objects with a required property of different const values are supported; use anyOf)");
}

Grammar SchemaCompiler::finish(int32_t value) {
  Nfa nfa;
  const int32_t ws = ws_rule();
  const int32_t a = nfa.add_state(), b = nfa.add_state(), c = nfa.add_state();
  nfa.add_call(nfa.start(), ws, a);
  nfa.add_call(a, value, b);
  nfa.add_call(b, ws, c);
  nfa.set_accept(c);
  return finish_grammar(add_rule(nfa, "the document"));
}

Grammar SchemaCompiler::finish_grammar(int32_t root, const std::function<std::string(int32_t rule)>& param_of) {
  g_.root = root;
  auto param = [&](int32_t rule) { return param_of ? param_of(rule) : std::string(); };
  try {
    g_.finalize(lim_.max_states);
  } catch (const UnsatisfiableError& e) {
    const std::string& w = e.where();
    const size_t at = w.find('#');
    fail(at == std::string::npos ? "#" : w.substr(at), "", "the schema can never be satisfied (" + w + " matches nothing)",
         param(e.rule()));
  } catch (const SizeError& e) {
    fail("#", "", std::string("schema too large: ") + e.what(), param(-1));
  } catch (const SchemaError&) {
    throw;
  } catch (const Error& e) {
    fail("#", "$ref", std::string("unsupported schema: ") + e.what());
  }
  return std::move(g_);
}

Grammar SchemaCompiler::document() {
  int32_t value;
  try {
    value = value_rule(*root_, "#");
  } catch (const SizeError& e) {
    fail("#", "", std::string("schema too large: ") + e.what());
  }
  return finish(value);
}

Grammar SchemaCompiler::object_document() { return finish(any_object_rule()); }

}  // namespace detail

Grammar compile_json_schema(const OrderedJson& schema, const SchemaLimits& limits) {
  detail::check_schema(schema, limits);
  return detail::SchemaCompiler(schema, limits).document();
}

Grammar compile_json_schema_text(std::string_view text, const SchemaLimits& limits) {
  OrderedJson j;
  try {
    j = OrderedJson::parse(text);
  } catch (const std::exception& e) {
    throw SchemaError(std::string("schema is not valid JSON: ") + e.what(), "", "#");
  }
  return compile_json_schema(j, limits);
}

Grammar json_object_grammar() {
  static const OrderedJson empty = OrderedJson::object();
  return detail::SchemaCompiler(empty, SchemaLimits{}).object_document();
}

}  // namespace lilac::grammar
