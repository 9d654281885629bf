// A grammar: rules (automata with call edges, see automaton.h) and a root rule; a document is one
// match of the root. Built by the JSON Schema compiler (schema.h), run by the Matcher (matcher.h).
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "grammar/automaton.h"
#include "grammar/json_string.h"

namespace lilac::grammar {

struct Rule {
  enum class Kind : uint8_t {
    Automaton,  // explicit states (start = 0)
    String,     // a JSON string literal with [min_chars, max_chars] characters (json_string.h)
  };
  Kind kind = Kind::Automaton;
  std::string name;       // for messages: what it matches and where in the schema it comes from
  // Non-empty: the rule and everything it calls behave the same in every grammar with this key,
  // so work done for one grammar (token classes of its states) is reused by all of them.
  std::string share_key;
  std::vector<RuleState> states;
  int64_t min_chars = 0, max_chars = -1;  // String (max -1: unbounded)
  bool no_lt = false;                     // String: '<' only as \u003c
};

// The schema (or a part every document must contain) matches nothing.
class UnsatisfiableError : public Error {
 public:
  UnsatisfiableError(const std::string& msg, std::string where, int32_t rule = -1)
      : Error(msg), where_(std::move(where)), rule_(rule) {}
  const std::string& where() const { return where_; }  // the failing rule's name
  int32_t rule() const { return rule_; }               // and its index (-1: not known)

 private:
  std::string where_;
  int32_t rule_;
};

class Grammar {
 public:
  std::vector<Rule> rules;
  int32_t root = -1;
  std::vector<int32_t> special_tokens;  // symbol kByteSyms + i stands for token special_tokens[i]

  int32_t add_rule(Rule r) {
    rules.push_back(std::move(r));
    return int32_t(rules.size() - 1);
  }

  // Runtime queries on (rule, state).
  int32_t step(int32_t rule, int32_t state, Sym sym) const {
    const Rule& r = rules[size_t(rule)];
    if (r.kind == Rule::Kind::String)
      return sym < kByteSyms ? jstr::string_step(r.min_chars, r.max_chars, r.no_lt, state, uint8_t(sym)) : -1;
    return grammar::step(r.states[size_t(state)], sym);
  }
  bool accepting(int32_t rule, int32_t state) const {
    const Rule& r = rules[size_t(rule)];
    return r.kind == Rule::Kind::String ? state == jstr::kClosed : r.states[size_t(state)].accept;
  }
  bool has_symbols(int32_t rule, int32_t state) const {
    const Rule& r = rules[size_t(rule)];
    return r.kind == Rule::Kind::String ? state != jstr::kClosed : !r.states[size_t(state)].ranges.empty();
  }
  std::span<const CallEdge> calls(int32_t rule, int32_t state) const {
    const Rule& r = rules[size_t(rule)];
    if (r.kind == Rule::Kind::String) return {};
    return r.states[size_t(state)].calls;
  }
  // Whether some edge of (rule, state) reads a special-token symbol.
  bool has_special(int32_t rule, int32_t state) const {
    const Rule& r = rules[size_t(rule)];
    return r.kind == Rule::Kind::Automaton && !r.states[size_t(state)].ranges.empty() &&
           r.states[size_t(state)].ranges.back().hi >= kByteSyms;
  }

  // Removes what can never be part of a document (calls of rules that match nothing, dead states),
  // then checks the result: throws UnsatisfiableError when the root matches nothing (naming the
  // deepest rule responsible), Error for left recursion (a rule reaching itself without reading a
  // byte) and SizeError above `max_states` states in all.
  void finalize(size_t max_states);
  // After finalize: whether `rule` matches nothing (finalize left it one state, not accepting, and pruned the calls of
  // it: a caller that offered it among other choices no longer does).
  bool matches_nothing(int32_t rule) const;

  // The states of rules [first, last) (total_states: all of them), as finalize bounds them: a String rule 1, an
  // automaton its states, at least 1 (finalize gives an automaton abandoned without states one before it counts).
  size_t states(size_t first, size_t last) const;
  size_t total_states() const { return states(0, rules.size()); }
};

}  // namespace lilac::grammar
