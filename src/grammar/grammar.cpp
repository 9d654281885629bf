#include "grammar/grammar.h"

#include <algorithm>

namespace lilac::grammar {

namespace {

// Whether `r` can reach an accepting state, passing calls only of rules with ok[callee] and
// (when symbols is false) no symbol edges.
bool reaches_accept(const Rule& r, const std::vector<uint8_t>& ok, bool symbols) {
  std::vector<uint8_t> seen(r.states.size(), 0);
  std::vector<int32_t> stack{0};
  seen[0] = 1;
  while (!stack.empty()) {
    const RuleState& st = r.states[size_t(stack.back())];
    stack.pop_back();
    if (st.accept) return true;
    auto visit = [&](int32_t t) {
      if (!seen[size_t(t)]) {
        seen[size_t(t)] = 1;
        stack.push_back(t);
      }
    };
    if (symbols)
      for (const SymRange& e : st.ranges) visit(e.to);
    for (const CallEdge& c : st.calls)
      if (ok[size_t(c.rule)]) visit(c.to);
  }
  return false;
}

// Fixed point of reaches_accept over all rules.
std::vector<uint8_t> fixed_point(const std::vector<Rule>& rules, bool symbols) {
  std::vector<uint8_t> ok(rules.size(), 0);
  for (size_t i = 0; i < rules.size(); ++i)
    if (rules[i].kind == Rule::Kind::String)
      ok[i] = symbols && (rules[i].max_chars < 0 || rules[i].min_chars <= rules[i].max_chars);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t i = 0; i < rules.size(); ++i)
      if (!ok[i] && rules[i].kind == Rule::Kind::Automaton && reaches_accept(rules[i], ok, symbols)) {
        ok[i] = 1;
        changed = true;
      }
  }
  return ok;
}

// The deepest unproductive rule under `root` (following calls between unproductive rules).
int32_t blame(const std::vector<Rule>& rules, const std::vector<uint8_t>& prod, int32_t root) {
  std::vector<uint8_t> seen(rules.size(), 0);
  std::vector<int32_t> order{root};
  seen[size_t(root)] = 1;
  for (size_t k = 0; k < order.size(); ++k)
    for (const RuleState& st : rules[size_t(order[k])].states)
      for (const CallEdge& c : st.calls)
        if (!prod[size_t(c.rule)] && !seen[size_t(c.rule)]) {
          seen[size_t(c.rule)] = 1;
          order.push_back(c.rule);
        }
  return order.back();
}

}  // namespace

size_t Grammar::states(size_t first, size_t last) const {
  size_t n = 0;
  for (size_t i = first; i < last; ++i)
    n += rules[i].kind == Rule::Kind::String ? 1 : std::max<size_t>(rules[i].states.size(), 1);
  return n;
}

bool Grammar::matches_nothing(int32_t rule) const {
  const Rule& r = rules[size_t(rule)];
  if (r.kind == Rule::Kind::String) return r.max_chars >= 0 && r.min_chars > r.max_chars;
  // (A rule that matches something kept an accepting state through the trim; one that does not was reset.)
  return std::none_of(r.states.begin(), r.states.end(), [](const RuleState& st) { return st.accept; });
}

void Grammar::finalize(size_t max_states) {
  if (root < 0 || size_t(root) >= rules.size()) throw Error("grammar has no root rule");
  // A rule reserved for a subschema whose compilation was abandoned has no states (a forced call of a tool that is not
  // strict falls back to free arguments when its schema fails midway): it matches nothing, and only such rules call it.
  for (Rule& r : rules)
    if (r.kind == Rule::Kind::Automaton && r.states.empty()) r.states.assign(1, RuleState{});
  if (total_states() > max_states)
    throw SizeError("grammar exceeds " + std::to_string(max_states) + " states");
  const std::vector<uint8_t> prod = fixed_point(rules, true);
  if (!prod[size_t(root)]) {
    const int32_t at = blame(rules, prod, root);
    const Rule& r = rules[size_t(at)];
    throw UnsatisfiableError(r.name + " can never be satisfied", r.name, at);
  }
  for (size_t i = 0; i < rules.size(); ++i) {
    Rule& r = rules[i];
    if (r.kind != Rule::Kind::Automaton) continue;
    if (!prod[i]) {  // never called after the pruning below
      r.states.assign(1, RuleState{});
      continue;
    }
    for (RuleState& st : r.states)
      st.calls.erase(std::remove_if(st.calls.begin(), st.calls.end(),
                                    [&](const CallEdge& c) { return !prod[size_t(c.rule)]; }),
                     st.calls.end());
    trim(r.states);
  }
  // Left recursion: a rule that can call itself before reading anything would make the matcher's
  // stacks grow without input.
  const std::vector<uint8_t> nullable = fixed_point(rules, false);
  std::vector<std::vector<int32_t>> left(rules.size());
  for (size_t i = 0; i < rules.size(); ++i) {
    const Rule& r = rules[i];
    if (r.kind != Rule::Kind::Automaton) continue;
    std::vector<uint8_t> seen(r.states.size(), 0);
    std::vector<int32_t> stack{0};
    seen[0] = 1;
    while (!stack.empty()) {
      const RuleState& st = r.states[size_t(stack.back())];
      stack.pop_back();
      for (const CallEdge& c : st.calls) {
        left[i].push_back(c.rule);
        if (nullable[size_t(c.rule)] && !seen[size_t(c.to)]) {
          seen[size_t(c.to)] = 1;
          stack.push_back(c.to);
        }
      }
    }
  }
  // (Only rules reachable from the root matter: a grammar may hold rules nothing calls.)
  std::vector<uint8_t> color(rules.size(), 0);  // 0 new, 1 on the path, 2 done
  {
    std::vector<std::pair<int32_t, size_t>> path{{root, 0}};
    color[size_t(root)] = 1;
    while (!path.empty()) {
      auto& [u, k] = path.back();
      if (k < left[size_t(u)].size()) {
        const int32_t v = left[size_t(u)][k++];
        if (color[size_t(v)] == 1)
          throw Error(rules[size_t(v)].name + " refers to itself without any text in between (left recursion)");
        if (color[size_t(v)] == 0) {
          color[size_t(v)] = 1;
          path.push_back({v, 0});
        }
      } else {
        color[size_t(u)] = 2;
        path.pop_back();
      }
    }
  }
}

}  // namespace lilac::grammar
