// Text outside JSON string literals: raw string values (the XML tool-call format writes a string
// parameter as is), and free text that must not contain some markup.
#include "grammar/charset.h"
#include "grammar/regex.h"
#include "grammar/schema_internal.h"

namespace lilac::grammar::detail {

namespace {

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += s + '\x01';
  return out;
}

// Byte strings that never contain one of `forbidden`.
std::vector<RuleState> without(const std::vector<std::string>& forbidden, size_t max_states, WorkBudget& work) {
  Nfa nfa;
  const int32_t found = nfa.add_state();
  nfa.add_range(nfa.start(), 0, 255, nfa.start());
  nfa.add_range(found, 0, 255, found);
  nfa.set_accept(found);
  for (const auto& f : forbidden) nfa.add_literal_to(nfa.start(), f, found);
  return complement(determinize(nfa, max_states, &work));
}

}  // namespace

int32_t SchemaCompiler::free_text_rule(const std::vector<std::string>& forbidden) {
  const std::string key = "free:" + join(forbidden);
  if (int32_t id = shared(key); id >= 0) return id;
  Rule r;
  r.name = "free text";
  r.share_key = key;
  r.states = without(forbidden, lim_.max_automaton, work_);
  minimize(r.states);
  return shared_[key] = g_.add_rule(std::move(r));
}

int32_t SchemaCompiler::raw_text_rule(const Json& node, const std::string& path, const std::vector<std::string>& forbidden) {
  std::string key = "raw:" + join(forbidden);
  if (node.is_object()) {
    for (const auto& [k, v] : node.items()) {
      if (!is_constraint(k)) continue;
      if (k != "type" && k != "minLength" && k != "maxLength" && k != "pattern" && k != "format" && k != "enum" &&
          k != "const")
        fail(child_path(path, k), k, "\"" + k + "\" is not supported for a string parameter of a tool call");
      key += k + "=" + dump_json(v) + ";";
    }
  } else if (node.is_boolean() && !node.get<bool>()) {
    return value_rule(node, path);  // matches nothing
  }
  if (int32_t id = shared(key); id >= 0) return id;
  auto has = [&](const char* k) { return node.is_object() && node.contains(k); };
  const size_t max = lim_.max_automaton;
  auto build = [&](auto&& body) {  // body(nfa, from, to)
    Nfa nfa(max * 4);
    const int32_t end = nfa.add_state();
    nfa.set_accept(end);
    body(nfa, nfa.start(), end);
    return determinize(nfa, max, &work_);
  };
  std::vector<RuleState> dfa = without(forbidden, max, work_);
  auto meet = [&](std::vector<RuleState> d) { dfa = intersect(dfa, d, max); };
  try {
    if (has("enum") || has("const")) {
      meet(build([&](Nfa& n, int32_t a, int32_t b) {
        auto add = [&](const Json& v) {
          if (v.is_string()) n.add_literal_to(a, v.get<std::string>(), b);
        };
        if (has("const")) add(node["const"]);
        else
          for (const Json& v : node["enum"]) add(v);
      }));
    } else {
      // Valid UTF-8 text.
      meet(build([&](Nfa& n, int32_t a, int32_t b) {
        add_charset(n, a, CharSet::any(), Encoding::Utf8, a);
        n.add_eps(a, b);
      }));
    }
    if (has("pattern"))
      meet(build([&](Nfa& n, int32_t a, int32_t b) { add_pattern(n, a, node["pattern"].get<std::string>(), Encoding::Utf8, b); }));
    if (has("format"))
      meet(build([&](Nfa& n, int32_t a, int32_t b) {
        add_pattern(n, a, format_pattern(node["format"].get<std::string>()), Encoding::Utf8, b, false);
      }));
    const int64_t lo = has("minLength") ? count_value(node["minLength"]) : 0;
    const int64_t hi = has("maxLength") ? count_value(node["maxLength"]) : -1;
    if (hi >= 0 && lo > hi) fail(path, "minLength", "minLength > maxLength: the schema matches nothing");
    if (lo > 0 || hi >= 0) {
      if (std::max(lo, hi) > lim_.max_pattern_length)
        fail(path, hi >= 0 ? "maxLength" : "minLength",
             "minLength / maxLength above " + std::to_string(lim_.max_pattern_length) +
                 " is not supported for a string parameter of a tool call");
      meet(build([&](Nfa& n, int32_t a, int32_t b) {
        const CharSet any = CharSet::any();
        int32_t cur = a;
        for (int64_t i = 0; i < lo; ++i) {
          const int32_t s = n.add_state();
          add_charset(n, cur, any, Encoding::Utf8, s);
          cur = s;
        }
        if (hi < 0) {
          add_charset(n, cur, any, Encoding::Utf8, cur);
        } else {
          for (int64_t i = lo; i < hi; ++i) {
            n.add_eps(cur, b);
            const int32_t s = n.add_state();
            add_charset(n, cur, any, Encoding::Utf8, s);
            cur = s;
          }
        }
        n.add_eps(cur, b);
      }));
    }
  } catch (const SizeError& e) {
    fail(path, has("pattern") ? "pattern" : "", std::string("string parameter constraints too large (") + e.what() + ")");
  }
  minimize(dfa);
  Rule r;
  r.name = "the string parameter at " + path;
  r.share_key = key;
  r.states = std::move(dfa);
  return shared_[key] = g_.add_rule(std::move(r));
}

}  // namespace lilac::grammar::detail
