#include "grammar/automaton.h"

#include <algorithm>
#include <map>
#include <unordered_map>

namespace lilac::grammar {

int32_t Nfa::add_state() {
  if (states_.size() >= max_states_)
    throw SizeError("automaton exceeds " + std::to_string(max_states_) + " states");
  states_.emplace_back();
  return int32_t(states_.size() - 1);
}

void Nfa::count_edges(size_t n) {
  if (n > max_edges_ - edges_)
    throw SizeError("automaton exceeds " + std::to_string(max_edges_) + " edges");
  edges_ += n;
}

void Nfa::add_range(int32_t from, Sym lo, Sym hi, int32_t to) {
  count_edges(1);
  states_[size_t(from)].edges.push_back({lo, hi, to});
}
void Nfa::add_eps(int32_t from, int32_t to) {
  count_edges(1);
  states_[size_t(from)].eps.push_back(to);
}
void Nfa::add_call(int32_t from, int32_t rule, int32_t to) {
  count_edges(1);
  states_[size_t(from)].calls.push_back({rule, to});
}

int32_t Nfa::add_literal(int32_t from, std::string_view bytes) {
  int32_t cur = from;
  for (unsigned char c : bytes) {
    int32_t next = add_state();
    add_range(cur, c, c, next);
    cur = next;
  }
  return cur;
}

void Nfa::add_literal_to(int32_t from, std::string_view bytes, int32_t to) {
  if (bytes.empty()) {
    add_eps(from, to);
    return;
  }
  int32_t end = add_literal(from, bytes.substr(0, bytes.size() - 1));
  unsigned char last = static_cast<unsigned char>(bytes.back());
  add_range(end, last, last, to);
}

int32_t Nfa::add_automaton(const std::vector<RuleState>& dfa, int32_t accept_to) {
  const int32_t base = int32_t(states_.size());
  for (size_t i = 0; i < dfa.size(); ++i) add_state();
  for (size_t i = 0; i < dfa.size(); ++i) {
    count_edges(dfa[i].ranges.size() + dfa[i].calls.size() + (dfa[i].accept ? 1 : 0));
    State& s = states_[size_t(base) + i];
    for (const SymRange& r : dfa[i].ranges) s.edges.push_back({r.lo, r.hi, base + r.to});
    for (const CallEdge& c : dfa[i].calls) s.calls.push_back({c.rule, base + c.to});
    if (dfa[i].accept) s.eps.push_back(accept_to);
  }
  return base;
}

struct SigHash {
  size_t operator()(const std::vector<int64_t>& v) const {
    uint64_t h = 1469598103934665603ull;
    for (int64_t x : v) h = (h ^ uint64_t(x)) * 1099511628211ull;
    return size_t(h ^ (h >> 29));
  }
};

namespace {

struct VecHash {
  size_t operator()(const std::vector<int32_t>& v) const {
    uint64_t h = 1469598103934665603ull;
    for (int32_t x : v) h = (h ^ uint32_t(x)) * 1099511628211ull;
    return size_t(h ^ (h >> 29));
  }
};

// Epsilon closure of `set` (sorted, unique on return). Returns its steps: states and epsilon edges looked at.
uint64_t eps_closure(const Nfa& nfa, std::vector<int32_t>& set, std::vector<uint8_t>& mark) {
  uint64_t steps = set.size();
  std::vector<int32_t> stack(set.begin(), set.end());
  set.clear();
  while (!stack.empty()) {
    int32_t s = stack.back();
    stack.pop_back();
    if (mark[size_t(s)]) continue;
    mark[size_t(s)] = 1;
    set.push_back(s);
    const std::vector<int32_t>& eps = nfa.states()[size_t(s)].eps;
    steps += 1 + eps.size();
    for (int32_t t : eps)
      if (!mark[size_t(t)]) stack.push_back(t);
  }
  for (int32_t s : set) mark[size_t(s)] = 0;
  std::sort(set.begin(), set.end());
  return steps + set.size();  // + the sort, the hash and the comparison of the set
}

}  // namespace

std::vector<RuleState> determinize(const Nfa& nfa, size_t max_states, WorkBudget* work) {
  auto spend = [work](uint64_t steps) {
    if (work) work->spend(steps);
  };
  std::vector<RuleState> out;
  std::unordered_map<std::vector<int32_t>, int32_t, VecHash> ids;
  std::vector<std::vector<int32_t>> sets;
  std::vector<uint8_t> mark(nfa.size(), 0);
  auto intern = [&](std::vector<int32_t>& set) -> int32_t {
    spend(eps_closure(nfa, set, mark));
    auto [it, fresh] = ids.try_emplace(set, int32_t(sets.size()));
    if (fresh) {
      if (sets.size() >= max_states)
        throw SizeError("automaton exceeds " + std::to_string(max_states) + " states");
      sets.push_back(set);
    }
    return it->second;
  };
  std::vector<int32_t> first{nfa.start()};
  intern(first);
  std::vector<Nfa::Edge> edges;
  std::vector<uint32_t> cuts;
  std::vector<int32_t> target;
  for (size_t d = 0; d < sets.size(); ++d) {
    RuleState rs;
    edges.clear();
    std::map<int32_t, std::vector<int32_t>> calls;
    uint64_t steps = sets[d].size();
    for (int32_t s : sets[d]) {
      const Nfa::State& st = nfa.states()[size_t(s)];
      rs.accept = rs.accept || st.accept;
      edges.insert(edges.end(), st.edges.begin(), st.edges.end());
      for (const CallEdge& c : st.calls) calls[c.rule].push_back(c.to);
      steps += st.calls.size();
    }
    spend(steps + 4 * edges.size());  // collected, cut, sorted twice
    // Split the symbol space into atoms at every edge boundary; each atom has one target set.
    cuts.clear();
    for (const auto& e : edges) {
      cuts.push_back(e.lo);
      cuts.push_back(uint32_t(e.hi) + 1);
    }
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    std::sort(edges.begin(), edges.end(), [](const Nfa::Edge& a, const Nfa::Edge& b) { return a.lo < b.lo; });
    for (size_t i = 0; i + 1 < cuts.size(); ++i) {
      const uint32_t lo = cuts[i], hi = cuts[i + 1] - 1;
      target.clear();
      uint64_t scanned = 1;
      for (const auto& e : edges) {
        if (e.lo > lo) break;
        ++scanned;
        if (e.hi >= hi) target.push_back(e.to);
      }
      spend(scanned);
      if (target.empty()) continue;
      const int32_t to = intern(target);
      if (!rs.ranges.empty() && rs.ranges.back().to == to && uint32_t(rs.ranges.back().hi) + 1 == lo)
        rs.ranges.back().hi = Sym(hi);
      else
        rs.ranges.push_back({Sym(lo), Sym(hi), to});
    }
    for (auto& [rule, tos] : calls) rs.calls.push_back({rule, intern(tos)});
    out.push_back(std::move(rs));
  }
  return out;
}

void minimize(std::vector<RuleState>& dfa, size_t max_states, uint64_t max_steps) {
  const size_t n = dfa.size();
  if (n < 2 || n > max_states) return;
  // Steps of one round: each state with its ranges and calls. A chain of n states takes up to n rounds.
  uint64_t round = n;
  for (const RuleState& s : dfa) round += s.ranges.size() + s.calls.size();
  uint64_t steps = 0;
  std::vector<int32_t> cls(n), next(n);
  for (size_t s = 0; s < n; ++s) cls[s] = dfa[s].accept ? 1 : 0;
  size_t count = 0;
  std::vector<int64_t> sig;
  for (;;) {
    if ((steps += round) > max_steps) return;  // left as it is: a correct automaton, with more states
    std::unordered_map<std::vector<int64_t>, int32_t, struct SigHash> ids;
    for (size_t s = 0; s < n; ++s) {
      sig.assign(1, cls[s]);
      // Ranges by target class, adjacent ones with the same class merged.
      int64_t lo = -1, hi = -1, to = -1;
      for (const SymRange& r : dfa[s].ranges) {
        const int64_t c = cls[size_t(r.to)];
        if (c == to && r.lo == hi + 1) {
          hi = r.hi;
          continue;
        }
        if (to >= 0) sig.insert(sig.end(), {lo, hi, to});
        lo = r.lo, hi = r.hi, to = c;
      }
      if (to >= 0) sig.insert(sig.end(), {lo, hi, to});
      sig.push_back(-1);
      for (const CallEdge& c : dfa[s].calls) sig.insert(sig.end(), {c.rule, cls[size_t(c.to)]});
      next[s] = ids.try_emplace(sig, int32_t(ids.size())).first->second;
    }
    const size_t k = ids.size();
    cls.swap(next);
    if (k == count) break;
    count = k;
  }
  if (count == n) return;
  // Renumber so that the start's class is 0, in order of first appearance.
  std::vector<int32_t> id(count, -1);
  int32_t m = 0;
  for (size_t s = 0; s < n; ++s)
    if (id[size_t(cls[s])] < 0) id[size_t(cls[s])] = m++;
  std::vector<RuleState> out(count);
  std::vector<uint8_t> done(count, 0);
  for (size_t s = 0; s < n; ++s) {
    const int32_t c = id[size_t(cls[s])];
    if (done[size_t(c)]) continue;
    done[size_t(c)] = 1;
    RuleState& o = out[size_t(c)];
    o.accept = dfa[s].accept;
    for (const SymRange& r : dfa[s].ranges) {
      const int32_t to = id[size_t(cls[size_t(r.to)])];
      if (!o.ranges.empty() && o.ranges.back().to == to && o.ranges.back().hi + 1 == r.lo)
        o.ranges.back().hi = r.hi;
      else
        o.ranges.push_back({r.lo, r.hi, to});
    }
    for (const CallEdge& ce : dfa[s].calls) o.calls.push_back({ce.rule, id[size_t(cls[size_t(ce.to)])]});
  }
  dfa = std::move(out);
}

std::vector<RuleState> intersect(const std::vector<RuleState>& a, const std::vector<RuleState>& b,
                                 size_t max_states) {
  std::vector<RuleState> out;
  std::unordered_map<uint64_t, int32_t> ids;
  std::vector<std::pair<int32_t, int32_t>> pairs;
  auto intern = [&](int32_t x, int32_t y) {
    const uint64_t key = (uint64_t(uint32_t(x)) << 32) | uint32_t(y);
    auto [it, fresh] = ids.try_emplace(key, int32_t(pairs.size()));
    if (fresh) {
      if (pairs.size() >= max_states)
        throw SizeError("automaton exceeds " + std::to_string(max_states) + " states");
      pairs.push_back({x, y});
    }
    return it->second;
  };
  intern(0, 0);
  for (size_t p = 0; p < pairs.size(); ++p) {
    const RuleState& sa = a[size_t(pairs[p].first)];
    const RuleState& sb = b[size_t(pairs[p].second)];
    RuleState rs;
    rs.accept = sa.accept && sb.accept;
    size_t i = 0, j = 0;
    while (i < sa.ranges.size() && j < sb.ranges.size()) {
      const SymRange& ra = sa.ranges[i];
      const SymRange& rb = sb.ranges[j];
      const Sym lo = std::max(ra.lo, rb.lo), hi = std::min(ra.hi, rb.hi);
      if (lo <= hi) {
        const int32_t to = intern(ra.to, rb.to);
        if (!rs.ranges.empty() && rs.ranges.back().to == to && rs.ranges.back().hi + 1 == lo)
          rs.ranges.back().hi = hi;
        else
          rs.ranges.push_back({lo, hi, to});
      }
      if (ra.hi < rb.hi) ++i; else ++j;
    }
    out.push_back(std::move(rs));
  }
  trim(out);
  minimize(out);
  return out;
}

std::vector<RuleState> complement(const std::vector<RuleState>& a) {
  std::vector<RuleState> out = a;
  const int32_t sink = int32_t(out.size());
  out.emplace_back();
  out.back().ranges.push_back({0, 255, sink});
  for (size_t s = 0; s + 1 < out.size(); ++s) {
    RuleState& st = out[s];
    std::vector<SymRange> full;
    uint32_t next = 0;
    for (const SymRange& r : st.ranges) {
      if (r.lo > next) full.push_back({Sym(next), Sym(r.lo - 1), sink});
      full.push_back(r);
      next = uint32_t(r.hi) + 1;
    }
    if (next <= 255) full.push_back({Sym(next), 255, sink});
    st.ranges = std::move(full);
  }
  for (RuleState& st : out) st.accept = !st.accept;
  trim(out);
  return out;
}

bool trim(std::vector<RuleState>& dfa) {
  const size_t n = dfa.size();
  // Co-reachability: reverse edges, flood from accepting states.
  std::vector<std::vector<int32_t>> rev(n);
  for (size_t s = 0; s < n; ++s) {
    for (const SymRange& r : dfa[s].ranges) rev[size_t(r.to)].push_back(int32_t(s));
    for (const CallEdge& c : dfa[s].calls) rev[size_t(c.to)].push_back(int32_t(s));
  }
  std::vector<uint8_t> live(n, 0);
  std::vector<int32_t> stack;
  for (size_t s = 0; s < n; ++s)
    if (dfa[s].accept) {
      live[s] = 1;
      stack.push_back(int32_t(s));
    }
  while (!stack.empty()) {
    int32_t s = stack.back();
    stack.pop_back();
    for (int32_t p : rev[size_t(s)])
      if (!live[size_t(p)]) {
        live[size_t(p)] = 1;
        stack.push_back(p);
      }
  }
  if (n == 0 || !live[0]) {
    dfa.assign(1, RuleState{});
    return false;
  }
  // Reachability from the start through live states; renumber in discovery order (start stays 0).
  std::vector<int32_t> id(n, -1);
  std::vector<int32_t> order{0};
  id[0] = 0;
  for (size_t k = 0; k < order.size(); ++k) {
    const RuleState& st = dfa[size_t(order[k])];
    auto visit = [&](int32_t t) {
      if (live[size_t(t)] && id[size_t(t)] < 0) {
        id[size_t(t)] = int32_t(order.size());
        order.push_back(t);
      }
    };
    for (const SymRange& r : st.ranges) visit(r.to);
    for (const CallEdge& c : st.calls) visit(c.to);
  }
  std::vector<RuleState> out(order.size());
  for (size_t k = 0; k < order.size(); ++k) {
    const RuleState& st = dfa[size_t(order[k])];
    RuleState& o = out[k];
    o.accept = st.accept;
    for (const SymRange& r : st.ranges)
      if (id[size_t(r.to)] >= 0) {
        const int32_t to = id[size_t(r.to)];
        if (!o.ranges.empty() && o.ranges.back().to == to && o.ranges.back().hi + 1 == r.lo)
          o.ranges.back().hi = r.hi;
        else
          o.ranges.push_back({r.lo, r.hi, to});
      }
    for (const CallEdge& c : st.calls)
      if (id[size_t(c.to)] >= 0) o.calls.push_back({c.rule, id[size_t(c.to)]});
  }
  dfa = std::move(out);
  return true;
}

}  // namespace lilac::grammar
