// Objects (declared property order, required, additionalProperties, allOf merging) and arrays
// (items, prefixItems, minItems, maxItems).
#include <algorithm>
#include <functional>
#include <map>
#include <set>

#include "grammar/charset.h"
#include "grammar/schema_internal.h"

namespace lilac::grammar::detail {

namespace {

enum class Extra { Absent, False, Allowed };

struct Branch {
  std::vector<std::pair<std::string, std::pair<const Json*, std::string>>> props;  // declared order
  std::set<std::string> required;
  Extra extra = Extra::Absent;
  const Json* extra_schema = nullptr;  // when Allowed by a schema object
  std::string extra_path;
};

Branch read_branch(const Json& node, const std::string& path) {
  Branch b;
  if (auto p = node.find("properties"); p != node.end())
    for (const auto& [name, sub] : p->items())
      b.props.push_back({name, {&sub, child_path(child_path(path, "properties"), name)}});
  if (auto r = node.find("required"); r != node.end())
    for (const Json& n : *r) b.required.insert(n.get<std::string>());
  if (auto a = node.find("additionalProperties"); a != node.end()) {
    b.extra_path = child_path(path, "additionalProperties");
    if (a->is_boolean()) {
      b.extra = a->get<bool>() ? Extra::Allowed : Extra::False;
    } else {
      b.extra = Extra::Allowed;
      b.extra_schema = &*a;
    }
  }
  return b;
}

}  // namespace

ObjectSpec SchemaCompiler::object_spec(const Json& node, const std::string& path) {
  const Branch b = read_branch(node, path);
  ObjectSpec s;
  // An object that declares nothing ({"type":"object"}) is any object; one that declares properties
  // gets no others unless additionalProperties allows them.
  const bool declares = node.contains("properties") || node.contains("required");
  s.extra = b.extra == Extra::Allowed || (b.extra == Extra::Absent && !declares);
  s.extra_schema = b.extra_schema;
  s.extra_path = b.extra_path;
  std::set<std::string> declared;
  for (const auto& [name, sp] : b.props) {
    s.props.push_back({name, sp.first, sp.second, b.required.count(name) > 0});
    declared.insert(name);
  }
  for (const std::string& name : b.required) {
    if (declared.count(name)) continue;
    if (b.extra == Extra::False)
      fail(child_path(path, "required"), "required",
           "required property \"" + name + "\" is not in \"properties\" and additionalProperties is false: the "
           "schema matches nothing");
    s.props.push_back({name, b.extra_schema, b.extra_path, true});
  }
  return s;
}

ObjectSpec SchemaCompiler::merge_all_of(const Json& node, const std::string& path) {
  // The branches: the node itself (minus allOf) and every allOf entry, $refs and nested allOf
  // resolved; each must be an object schema.
  std::vector<Branch> branches;
  std::function<void(const Json&, const std::string&, int)> collect = [&](const Json& n, const std::string& p, int depth) {
    if (depth > 32) fail(p, "allOf", "allOf / $ref nested too deeply");
    if (expansion_left_ == 0) fail(p, "allOf", "allOf / $ref expand to too many subschemas to merge");
    --expansion_left_;
    if (n.is_boolean()) {
      if (!n.get<bool>()) fail(p, "allOf", "an allOf branch is false: the schema matches nothing");
      return;
    }
    for (const auto& [key, v] : n.items()) {
      if (!is_constraint(key)) continue;
      if (key == "type") {
        if (declared_types(n) != kObject) fail(child_path(p, key), "allOf", "allOf is supported for object schemas only");
      } else if (key != "properties" && key != "required" && key != "additionalProperties" && key != "allOf" &&
                 key != "$ref") {
        fail(child_path(p, key), key, "\"" + key + "\" inside allOf is not supported (allOf merges object schemas only)");
      }
    }
    if (auto r = n.find("$ref"); r != n.end()) {
      std::string tp;
      const Json& t = resolve_ref(*root_, r->get<std::string>(), child_path(p, "$ref"), tp);
      collect(t, tp, depth + 1);
    }
    if (auto a = n.find("allOf"); a != n.end())
      for (size_t i = 0; i < a->size(); ++i)
        collect((*a)[i], child_path(child_path(p, "allOf"), std::to_string(i)), depth + 1);
    branches.push_back(read_branch(n, p));
  };
  collect(node, path, 0);

  ObjectSpec s;
  std::vector<std::string> names;
  std::set<std::string> seen, required;
  for (const Branch& b : branches) {
    for (const auto& [name, sp] : b.props)
      if (seen.insert(name).second) names.push_back(name);
    required.insert(b.required.begin(), b.required.end());
  }
  for (const std::string& name : required)
    if (seen.insert(name).second) names.push_back(name);
  // Names not declared anywhere: allowed unless some branch forbids extras.
  bool extra_false = false, extra_allowed = false;
  std::vector<std::pair<const Json*, std::string>> extra_schemas;
  for (const Branch& b : branches) {
    if (b.extra == Extra::False) extra_false = true;
    if (b.extra == Extra::Allowed) {
      extra_allowed = true;
      if (b.extra_schema) extra_schemas.push_back({b.extra_schema, b.extra_path});
    }
  }
  auto single = [&](std::vector<std::pair<const Json*, std::string>>& list, const std::string& what) {
    for (size_t i = 1; i < list.size(); ++i)
      if (*list[i].first != *list[0].first)
        fail(list[i].second, "allOf", what + " is constrained differently by several allOf branches (not supported)");
  };
  single(extra_schemas, "additionalProperties");
  for (const std::string& name : names) {
    std::vector<std::pair<const Json*, std::string>> schemas;
    bool forbidden = false;
    for (const Branch& b : branches) {
      auto it = std::find_if(b.props.begin(), b.props.end(), [&](const auto& p) { return p.first == name; });
      if (it != b.props.end()) {
        if (!(it->second.first->is_boolean() && it->second.first->get<bool>())) schemas.push_back(it->second);
      } else if (b.extra == Extra::False) {
        forbidden = true;
      } else if (b.extra_schema) {
        schemas.push_back({b.extra_schema, b.extra_path});
      }
    }
    const bool req = required.count(name) > 0;
    if (forbidden) {
      if (req)
        fail(child_path(path, "allOf"), "allOf",
             "property \"" + name + "\" is required by one allOf branch and forbidden by another: the schema "
             "matches nothing");
      continue;
    }
    single(schemas, "property \"" + name + "\"");
    if (schemas.empty())
      s.props.push_back({name, nullptr, path, req});
    else
      s.props.push_back({name, schemas[0].first, schemas[0].second, req});
  }
  bool declares = false;
  for (const Branch& b : branches) declares = declares || !b.props.empty() || !b.required.empty();
  s.extra = (extra_allowed || !declares) && !extra_false;
  if (s.extra && !extra_schemas.empty()) {
    s.extra_schema = extra_schemas[0].first;
    s.extra_path = extra_schemas[0].second;
  }
  return s;
}

int32_t SchemaCompiler::extra_key_rule(const ObjectSpec& spec, const std::string& path) {
  if (spec.props.empty()) return string_rule(0, -1);
  // Any name in canonical spelling, minus the declared names.
  Nfa any(lim_.max_automaton * 4);
  const int32_t body = any.add_state(), end = any.add_state();
  any.add_range(any.start(), '"', '"', body);
  add_charset(any, body, CharSet::any(), string_encoding(), body);
  any.add_range(body, '"', '"', end);
  any.set_accept(end);
  Nfa names(lim_.max_automaton * 4);
  const int32_t nend = names.add_state();
  names.set_accept(nend);
  for (const Property& p : spec.props) names.add_literal_to(names.start(), literal(Json(p.name)), nend);
  Rule r;
  r.name = "a property name of the object at " + path;
  r.states = intersect(determinize(any, lim_.max_automaton, &work_),
                       complement(determinize(names, lim_.max_automaton, &work_)), lim_.max_automaton);
  return g_.add_rule(std::move(r));
}

int32_t SchemaCompiler::object_rule(const ObjectSpec& spec, const std::string& path) {
  const size_t n = spec.props.size();
  if (n > size_t(lim_.max_items) * 4) fail(path, "properties", "too many properties");
  // Value rules first (they may recurse back here through $ref).
  std::vector<int32_t> vals(n);
  for (size_t i = 0; i < n; ++i)
    vals[i] = spec.props[i].schema ? value_rule(*spec.props[i].schema, spec.props[i].path) : any_value_rule();
  const int32_t extra_val =
      !spec.extra ? -1 : spec.extra_schema ? value_rule(*spec.extra_schema, spec.extra_path) : any_value_rule();
  const int32_t extra_key = spec.extra ? extra_key_rule(spec, path) : -1;
  const int32_t ws = ws_rule();

  Nfa nfa(lim_.max_automaton * 4);
  const int32_t end = nfa.add_state();
  nfa.set_accept(end);
  // next_req[i]: index of the first required property at or after i (n: none).
  std::vector<size_t> next_req(n + 1, n);
  for (size_t i = n; i-- > 0;) next_req[i] = spec.props[i].required ? i : next_req[i + 1];
  // Member j: its key (after the opening quote, shared by every place it may appear), ws ':' ws
  // value ws, then after[j].
  std::vector<int32_t> key_entry(n), after(n);
  auto chain_call = [&](int32_t from, int32_t rule) {
    const int32_t s = nfa.add_state();
    nfa.add_call(from, rule, s);
    return s;
  };
  for (size_t j = 0; j < n; ++j) {
    key_entry[j] = nfa.add_state();
    const std::string quoted = literal(Json(spec.props[j].name));
    int32_t s = nfa.add_literal(key_entry[j], std::string_view(quoted).substr(1));
    s = chain_call(s, ws);
    const int32_t colon = nfa.add_state();
    nfa.add_range(s, ':', ':', colon);
    s = chain_call(chain_call(chain_call(colon, ws), vals[j]), ws);
    after[j] = s;
  }
  int32_t extra_entry = -1;
  if (spec.extra) {
    extra_entry = nfa.add_state();
    int32_t s = chain_call(chain_call(extra_entry, extra_key), ws);
    const int32_t colon = nfa.add_state();
    nfa.add_range(s, ':', ':', colon);
    const int32_t m = chain_call(chain_call(chain_call(colon, ws), extra_val), ws);
    nfa.add_range(m, '}', '}', end);
    const int32_t comma = nfa.add_state();
    nfa.add_range(m, ',', ',', comma);
    nfa.add_call(comma, ws, extra_entry);
  }
  // From a choice point, the members that may come next: from `first` up to the next required one.
  auto choices = [&](int32_t x, size_t first) {
    const size_t last = next_req[first] == n ? n : next_req[first] + 1;
    for (size_t k = first; k < last; ++k) nfa.add_range(x, '"', '"', key_entry[k]);
    if (spec.extra && next_req[first] == n) nfa.add_eps(x, extra_entry);
  };
  const int32_t open = nfa.add_state();
  nfa.add_range(nfa.start(), '{', '{', open);
  const int32_t first = chain_call(open, ws);
  if (next_req[0] == n) nfa.add_range(first, '}', '}', end);
  choices(first, 0);
  for (size_t j = 0; j < n; ++j) {
    if (next_req[j + 1] == n) nfa.add_range(after[j], '}', '}', end);
    if (j + 1 < n || spec.extra) {
      const int32_t comma = nfa.add_state();
      nfa.add_range(after[j], ',', ',', comma);
      choices(chain_call(comma, ws), j + 1);
    }
  }
  return add_rule(nfa, "the object at " + path);
}

int32_t SchemaCompiler::array_rule(const Json& node, const std::string& path) {
  auto count = [&](const char* key, int64_t dflt) -> int64_t {
    auto it = node.find(key);
    if (it == node.end()) return dflt;
    const int64_t v = count_value(*it);
    if (v > lim_.max_items)
      fail(child_path(path, key), key, std::string("\"") + key + "\" above " + std::to_string(lim_.max_items) + " is not supported");
    return v;
  };
  const int64_t lo = count("minItems", 0), hi = count("maxItems", -1);
  if (hi >= 0 && lo > hi) fail(path, "minItems", "minItems > maxItems: the schema matches nothing");
  std::vector<int32_t> prefix;
  if (auto p = node.find("prefixItems"); p != node.end()) {
    if (int64_t(p->size()) > lim_.max_items) fail(child_path(path, "prefixItems"), "prefixItems", "too many prefixItems");
    for (size_t i = 0; i < p->size(); ++i)
      prefix.push_back(value_rule((*p)[i], child_path(child_path(path, "prefixItems"), std::to_string(i))));
  }
  int32_t items = any_value_rule();
  if (auto it = node.find("items"); it != node.end()) {
    if (it->is_boolean() && !it->get<bool>())
      items = -1;
    else
      items = value_rule(*it, child_path(path, "items"));
  }
  const int64_t m = int64_t(prefix.size());
  auto elem = [&](int64_t c) { return c < m ? prefix[size_t(c)] : items; };
  const int32_t ws = ws_rule();
  Nfa nfa(lim_.max_automaton * 4);
  const int32_t end = nfa.add_state();
  nfa.set_accept(end);
  const int64_t cap = hi >= 0 ? hi : std::max<int64_t>({m, lo, 1});
  // after[c]: after c elements and the whitespace after the last one (c = 1 .. cap).
  std::vector<int32_t> after(size_t(cap) + 1, -1);
  for (int64_t c = 1; c <= cap; ++c) after[size_t(c)] = nfa.add_state();
  auto element = [&](int32_t from, int64_t c, int32_t to) {  // element c (0-based) then ws
    const int32_t s = nfa.add_state();
    nfa.add_call(from, elem(c), s);
    nfa.add_call(s, ws, to);
  };
  const int32_t open = nfa.add_state();
  nfa.add_range(nfa.start(), '[', '[', open);
  const int32_t first = nfa.add_state();
  nfa.add_call(open, ws, first);
  if (lo == 0) nfa.add_range(first, ']', ']', end);
  if (cap >= 1 && elem(0) >= 0) element(first, 0, after[1]);
  for (int64_t c = 1; c <= cap; ++c) {
    const int32_t a = after[size_t(c)];
    if (c >= lo) nfa.add_range(a, ']', ']', end);
    if ((hi >= 0 && c >= hi) || elem(c) < 0) continue;
    const int32_t comma = nfa.add_state(), s = nfa.add_state();
    nfa.add_range(a, ',', ',', comma);
    nfa.add_call(comma, ws, s);
    element(s, c, after[size_t(std::min(c + 1, cap))]);
  }
  return add_rule(nfa, "the array at " + path);
}

}  // namespace lilac::grammar::detail
