#include "grammar/token_classes.h"

#include <algorithm>
#include <array>

namespace lilac::grammar {

size_t TokenClass::memory() const {
  size_t n = sizeof(*this) + bits.size() * 4 + tokens.size() * 4;
  for (const auto& e : escapes) n += sizeof(e) + e.second.size() * 4;
  return n;
}

void TokenClass::apply(uint32_t* mask) const {
  for (size_t w = 0; w < bits.size(); ++w) mask[w] |= bits[w];
  for (int32_t t : tokens) mask[size_t(t) >> 5] |= 1u << (t & 31);
}

namespace {

void set_bit(std::vector<uint32_t>& bits, int32_t t) { bits[size_t(t) >> 5] |= 1u << (t & 31); }

// Groups the children of `nodes` by their byte.
std::vector<std::pair<Sym, std::vector<uint32_t>>> group_children(const Vocabulary& v,
                                                                  const std::vector<uint32_t>& nodes) {
  std::array<std::vector<uint32_t>, 256> by{};
  for (uint32_t n : nodes)
    for (const Vocabulary::Child& ch : v.children(n)) by[ch.byte].push_back(ch.node);
  std::vector<std::pair<Sym, std::vector<uint32_t>>> out;
  for (int b = 0; b < 256; ++b)
    if (!by[size_t(b)].empty()) out.push_back({Sym(b), std::move(by[size_t(b)])});
  return out;
}

// Dense when a bitmask is cheaper to apply than the list.
void finish_tokens(TokenClass& tc, const Vocabulary& v, std::vector<int32_t>& acc) {
  if (acc.size() > v.token_words() / 2) {
    tc.bits.assign(v.token_words(), 0);
    for (int32_t t : acc) set_bit(tc.bits, t);
  } else {
    tc.tokens = std::move(acc);
  }
}

}  // namespace

std::shared_ptr<const StringProfile> make_string_profile(const Vocabulary& v, jstr::Sub start, bool no_lt) {
  auto p = std::make_shared<StringProfile>();
  p->inside_bits.assign(v.token_words(), 0);
  struct Item {
    uint32_t node;
    jstr::Sub sub;
    int32_t n;
  };
  std::vector<Item> stack{{0, start, 0}};
  while (!stack.empty()) {
    const Item it = stack.back();
    stack.pop_back();
    for (const Vocabulary::Child& ch : v.children(it.node)) {
      const uint32_t c = ch.node;
      const jstr::Move& m = jstr::move(it.sub, ch.byte);
      if (m.kind == jstr::MoveKind::Dead || (no_lt && ch.byte == '<')) continue;
      if (m.kind == jstr::MoveKind::Close) {
        for (int32_t t : v.tokens_at(c)) p->close_end.push_back({it.n, t});
        if (v.has_children(c)) p->close_nodes.push_back({it.n, c});
        continue;
      }
      const int32_t n = it.n + (m.kind == jstr::MoveKind::Char ? 1 : 0);
      const int32_t need = n + (jstr::pending(m.next) ? 1 : 0);
      for (int32_t t : v.tokens_at(c)) {
        p->inside.push_back({need, t});
        set_bit(p->inside_bits, t);
      }
      if (v.has_children(c)) stack.push_back({c, m.next, n});
    }
  }
  std::sort(p->inside.begin(), p->inside.end());
  return p;
}

std::shared_ptr<const TokenClass> classify_string(const StringProfile& p, const Vocabulary& v, int64_t min_chars,
                                                  int64_t max_chars, int64_t k) {
  auto tc = std::make_shared<TokenClass>();
  auto in_range = [&](int64_t m) { return m >= min_chars && (max_chars < 0 || m <= max_chars); };
  if (max_chars < 0) {
    tc->bits = p.inside_bits;
  } else {
    // (the profiles count characters as int32_t: a room past that is no bound on any token)
    const int32_t room = int32_t(std::min<int64_t>(max_chars - k, INT32_MAX));
    const size_t idx = size_t(std::upper_bound(p.inside.begin(), p.inside.end(), std::make_pair(room, INT32_MAX)) -
                              p.inside.begin());
    if (idx <= v.token_words() / 2) {
      for (size_t i = 0; i < idx; ++i) tc->tokens.push_back(p.inside[i].second);
    } else if (idx <= p.inside.size() / 2) {
      tc->bits.assign(v.token_words(), 0);
      for (size_t i = 0; i < idx; ++i) set_bit(tc->bits, p.inside[i].second);
    } else {
      tc->bits = p.inside_bits;
      for (size_t i = idx; i < p.inside.size(); ++i) {
        const int32_t t = p.inside[i].second;
        tc->bits[size_t(t) >> 5] &= ~(1u << (t & 31));
      }
    }
  }
  for (const auto& [n, t] : p.close_end)
    if (in_range(k + n)) tc->tokens.push_back(t);
  std::vector<uint32_t> nodes;
  for (const auto& [n, node] : p.close_nodes)
    if (in_range(k + n)) nodes.push_back(node);
  tc->escapes = group_children(v, nodes);
  return tc;
}

std::shared_ptr<const TokenClass> classify_walk(ConfigSpace& space, const Vocabulary& v, int32_t rule,
                                                int32_t state) {
  auto tc = std::make_shared<TokenClass>();
  std::vector<int32_t> acc;
  std::vector<uint32_t> ends;  // nodes after which the rule may have ended
  struct Item {
    uint32_t node;
    int32_t cfg;
  };
  std::vector<Item> stack{{0, space.single(rule, state)}};
  while (!stack.empty()) {
    const Item it = stack.back();
    stack.pop_back();
    for (const Vocabulary::Child& ch : v.children(it.node)) {
      const uint32_t c = ch.node;
      const int32_t nc = space.step(it.cfg, ch.byte);
      if (nc == ConfigSpace::kDead) continue;
      for (int32_t t : v.tokens_at(c)) acc.push_back(t);
      if (!v.has_children(c)) continue;
      if (space.ended(nc)) ends.push_back(c);
      if (!space.ready(nc).empty()) stack.push_back({c, nc});
    }
  }
  finish_tokens(*tc, v, acc);
  tc->escapes = group_children(v, ends);
  return tc;
}

std::shared_ptr<const TokenClass> TokenClassCache::find(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = classes_.find(key);
  return it == classes_.end() ? nullptr : it->second;
}

void TokenClassCache::put(const std::string& key, std::shared_ptr<const TokenClass> c) {
  const size_t m = c->memory() + key.size() + 64;
  std::lock_guard<std::mutex> lock(mu_);
  if (used_ + m > budget_) {
    classes_.clear();
    used_ = 0;
  }
  if (classes_.emplace(key, std::move(c)).second) used_ += m;
}

std::shared_ptr<const StringProfile> TokenClassCache::profile(const Vocabulary& v, jstr::Sub sub, bool no_lt) {
  auto& slot = profiles_[no_lt ? 1 : 0][sub];
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (slot) return slot;
  }
  auto p = make_string_profile(v, sub, no_lt);
  std::lock_guard<std::mutex> lock(mu_);
  if (!slot) slot = std::move(p);
  return slot;
}

size_t TokenClassCache::memory() const {
  std::lock_guard<std::mutex> lock(mu_);
  return used_;
}

}  // namespace lilac::grammar
