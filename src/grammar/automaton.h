// The automaton pieces grammars are made of.
//
// A grammar is a set of rules; a rule is a deterministic automaton over symbols (bytes 0..255, and
// special tokens as symbols 256 + i) whose states may also *call* other rules: a call edge
// (rule R, state T) means "match one R, then continue at T" (a pushdown automaton: recursion through
// $ref works). Calls are epsilon moves, so a state with several call edges (or call edges and symbol
// edges starting with the same byte) is nondeterministic; the matcher follows every alternative.
//
// Rules are built as NFAs (Thompson style: symbol ranges, epsilon and call edges) and determinized
// here by subset construction, where each called rule is one more alphabet letter. Call-free
// automata (patterns, literals, formats) can also be intersected and complemented.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace lilac::grammar {

using Sym = uint16_t;
constexpr int kByteSyms = 256;  // symbols 0..255 are bytes; 256 + i is the grammar's i-th special token

struct SymRange {
  Sym lo, hi;  // inclusive
  int32_t to;
};

struct CallEdge {
  int32_t rule;  // rule to match
  int32_t to;    // state of the calling rule after the callee has matched
};

struct RuleState {
  std::vector<SymRange> ranges;  // sorted by lo, disjoint
  std::vector<CallEdge> calls;   // sorted by rule, one edge per rule
  bool accept = false;           // the rule may end here
};

// Too large for the configured bounds (states of one automaton, size of a grammar).
class SizeError : public Error {
 public:
  explicit SizeError(const std::string& msg) : Error(msg) {}
};

class Nfa {
 public:
  struct Edge {
    Sym lo, hi;
    int32_t to;
  };
  struct State {
    std::vector<Edge> edges;
    std::vector<int32_t> eps;
    std::vector<CallEdge> calls;
    bool accept = false;
  };

  explicit Nfa(size_t max_states = 200000) : max_states_(max_states) { add_state(); }
  int32_t start() const { return 0; }
  int32_t add_state();
  void add_range(int32_t from, Sym lo, Sym hi, int32_t to);
  void add_eps(int32_t from, int32_t to);
  void add_call(int32_t from, int32_t rule, int32_t to);
  void set_accept(int32_t s) { states_[size_t(s)].accept = true; }
  // Path spelling `bytes` from `from`; returns its end state (`from` itself for an empty string).
  int32_t add_literal(int32_t from, std::string_view bytes);
  // Path spelling `bytes` from `from` ending in the existing state `to` (an epsilon edge if empty).
  void add_literal_to(int32_t from, std::string_view bytes, int32_t to);
  // Copies `dfa` (a determinized rule's states) into this NFA; returns the state its start maps to.
  // Its accepting states get an epsilon edge to `accept_to`.
  int32_t add_automaton(const std::vector<RuleState>& dfa, int32_t accept_to);

  const std::vector<State>& states() const { return states_; }
  size_t size() const { return states_.size(); }

 private:
  std::vector<State> states_;
  size_t max_states_;
};

// Subset construction (start = state 0 of the result). Throws SizeError above `max_states`.
std::vector<RuleState> determinize(const Nfa& nfa, size_t max_states);
// Merges equivalent states (Moore's partition refinement; call edges count as letters), so that
// per-state work (token classes) is done once per distinct state. Automata above `max_states`
// states are left as they are (refinement is quadratic in the worst case).
void minimize(std::vector<RuleState>& dfa, size_t max_states = 4000);

// Call-free automata over bytes (start = state 0):
// the language of both; empty automaton (one non-accepting state) when they share no string.
std::vector<RuleState> intersect(const std::vector<RuleState>& a, const std::vector<RuleState>& b,
                                 size_t max_states);
// Every byte string not in `a`'s language.
std::vector<RuleState> complement(const std::vector<RuleState>& a);
// Removes states that are unreachable or cannot reach an accepting state (calls count as
// passable). Returns false when the start state cannot reach acceptance (an empty language); the
// automaton is then a single non-accepting state.
bool trim(std::vector<RuleState>& dfa);

// The state reached from `s` on `sym`, or -1.
inline int32_t step(const RuleState& s, Sym sym) {
  // Small fan-outs: a linear scan beats a binary search.
  for (const SymRange& r : s.ranges) {
    if (sym < r.lo) return -1;
    if (sym <= r.hi) return r.to;
  }
  return -1;
}

}  // namespace lilac::grammar
