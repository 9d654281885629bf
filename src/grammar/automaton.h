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

// Steps of automaton construction left to one compile (SchemaLimits::max_automaton_work). The state bounds alone
// let a pattern of a few KB (a class of thousands of code points, repeated) determinize for half a minute: each
// subset holds thousands of NFA states, and each step looks at all their edges. Every step of determinize (an NFA
// state, edge or epsilon move looked at) is spent here; past the limit it is a SizeError.
class WorkBudget {
 public:
  explicit WorkBudget(uint64_t steps) : limit_(steps), left_(steps) {}
  void spend(uint64_t steps) {
    if (steps > left_) {
      left_ = 0;
      throw SizeError("building the automata takes more than " + std::to_string(limit_) + " steps");
    }
    left_ -= steps;
  }
  uint64_t limit() const { return limit_; }
  uint64_t spent() const { return limit_ - left_; }

 private:
  uint64_t limit_, left_;
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

  // At most `max_states` states and kEdgesPerState times as many edges (symbol, epsilon and call edges): a
  // pattern's class of thousands of code points is thousands of edges for one or two states.
  static constexpr size_t kEdgesPerState = 8;
  explicit Nfa(size_t max_states = 200000) : max_states_(max_states), max_edges_(max_states * kEdgesPerState) {
    add_state();
  }
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
  size_t edges() const { return edges_; }
  size_t max_states() const { return max_states_; }
  size_t max_edges() const { return max_edges_; }

 private:
  void count_edges(size_t n);
  std::vector<State> states_;
  size_t max_states_, max_edges_;
  size_t edges_ = 0;
};

// Subset construction (start = state 0 of the result). Throws SizeError above `max_states`, or when its steps
// exceed what is left of `work` (nullptr: no bound on the steps).
std::vector<RuleState> determinize(const Nfa& nfa, size_t max_states, WorkBudget* work = nullptr);
constexpr uint64_t kMinimizeSteps = 20'000'000;
// Merges equivalent states (Moore's partition refinement; call edges count as letters), so that
// per-state work (token classes) is done once per distinct state. Refinement is quadratic in the
// worst case (a round per state of a chain, each looking at every edge): automata above
// `max_states` states, and those whose refinement passes `max_steps` (states and edges looked at),
// are left as they are.
void minimize(std::vector<RuleState>& dfa, size_t max_states = 4000, uint64_t max_steps = kMinimizeSteps);

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
