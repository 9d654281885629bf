#include "grammar/matcher.h"

#include <algorithm>

namespace lilac::grammar {

CompiledGrammar::CompiledGrammar(Grammar g, std::shared_ptr<const Vocabulary> vocab,
                                 std::shared_ptr<TokenClassCache> shared, size_t own_budget)
    : g_(std::move(g)), vocab_(std::move(vocab)), shared_(std::move(shared)), own_(own_budget) {
  if (!shared_) shared_ = std::make_shared<TokenClassCache>(size_t(256) << 20);
}

std::shared_ptr<const TokenClass> CompiledGrammar::token_class(ConfigSpace& space, int32_t rule,
                                                               int32_t state) const {
  const Rule& r = g_.rules[size_t(rule)];
  const bool shared = !r.share_key.empty();
  const std::string key = shared ? r.share_key + "@" + std::to_string(state)
                                 : std::to_string(rule) + "@" + std::to_string(state);
  TokenClassCache& cache = shared ? *shared_ : own_;
  if (auto c = cache.find(key)) return c;
  std::shared_ptr<const TokenClass> c;
  if (r.kind == Rule::Kind::String && state != jstr::kOpen && state != jstr::kClosed) {
    auto profile = shared_->profile(*vocab_, jstr::body_sub(state), r.no_lt);
    c = classify_string(*profile, *vocab_, r.min_chars, r.max_chars, jstr::body_count(state));
  } else {
    c = classify_walk(space, *vocab_, rule, state);
  }
  cache.put(key, c);
  return c;
}

Matcher::Matcher(std::shared_ptr<const CompiledGrammar> g, std::vector<int32_t> end_tokens)
    : g_(std::move(g)), end_tokens_(std::move(end_tokens)), space_(g_->grammar()) {
  for (int32_t t : end_tokens_)
    if (t < 0 || t >= g_->vocab().mask_size())
      throw Error("grammar matcher: end token " + std::to_string(t) + " is outside the vocabulary");
  cfg_ = space_.initial(g_->grammar().root, 0);
}

const TokenClass& Matcher::class_of(int32_t rule, int32_t state) {
  const uint64_t key = (uint64_t(uint32_t(rule)) << 32) | uint32_t(state);
  auto it = classes_.find(key);
  if (it == classes_.end()) it = classes_.emplace(key, g_->token_class(space_, rule, state)).first;
  return *it->second;
}

void Matcher::walk_full(uint32_t node, int32_t cfg, uint32_t* mask) {
  const Vocabulary& v = g_->vocab();
  for (int32_t t : v.tokens_at(node)) mask[size_t(t) >> 5] |= 1u << (t & 31);
  for (const Vocabulary::Child& ch : v.children(node)) {
    const int32_t nc = space_.step(cfg, ch.byte);
    if (nc != ConfigSpace::kDead) walk_full(ch.node, nc, mask);
  }
}

void Matcher::fill_mask(std::span<uint32_t> mask) {
  if (mask.size() < mask_words()) throw Error("grammar matcher: mask buffer too small");
  std::fill(mask.begin(), mask.end(), 0u);
  auto set = [&](int32_t t) { mask[size_t(t) >> 5] |= 1u << (t & 31); };
  if (finished_) {
    for (int32_t t : end_tokens_) set(t);
    return;
  }
  const Grammar& g = g_->grammar();
  // A copy: computing classes and walking adds configurations (the pool may move).
  const std::span<const int32_t> r = space_.ready(cfg_);
  ready_.assign(r.begin(), r.end());
  for (const int32_t f : ready_) {
    const Frame fr = space_.frame(f);
    const TokenClass& tc = class_of(fr.rule, fr.state);
    tc.apply(mask.data());
    if (tc.escapes.empty()) continue;
    const int32_t after = space_.after_return(f);
    if (after == ConfigSpace::kEnded || after == ConfigSpace::kDead) continue;
    for (const auto& [sym, nodes] : tc.escapes) {
      const int32_t next = space_.step(after, sym);
      if (next == ConfigSpace::kDead) continue;
      for (uint32_t n : nodes) walk_full(n, next, mask.data());
    }
  }
  for (size_t i = 0; i < g.special_tokens.size(); ++i)
    if (space_.step(cfg_, Sym(kByteSyms + i)) != ConfigSpace::kDead) set(g.special_tokens[i]);
  if (space_.ended(cfg_))
    for (int32_t t : end_tokens_) set(t);
}

bool Matcher::is_end(int32_t t) const {
  return std::find(end_tokens_.begin(), end_tokens_.end(), t) != end_tokens_.end();
}

int32_t Matcher::advance(int32_t cfg, int32_t token) {
  const Grammar& g = g_->grammar();
  for (size_t i = 0; i < g.special_tokens.size(); ++i)
    if (g.special_tokens[i] == token) return space_.step(cfg, Sym(kByteSyms + i));
  if (!g_->vocab().usable(token)) return ConfigSpace::kDead;
  for (unsigned char b : g_->vocab().bytes(token)) {
    cfg = space_.step(cfg, b);
    if (cfg == ConfigSpace::kDead) break;
  }
  return cfg;
}

bool Matcher::allows(int32_t token) {
  if (is_end(token)) return finished_ || space_.ended(cfg_);
  if (finished_) return false;
  return advance(cfg_, token) != ConfigSpace::kDead;
}

bool Matcher::accept_token(int32_t token) {
  if (finished_) return false;
  if (is_end(token)) {
    if (!space_.ended(cfg_)) return false;
    finished_ = true;
    return true;
  }
  const int32_t next = advance(cfg_, token);
  if (next == ConfigSpace::kDead) return false;
  cfg_ = next;
  return true;
}

bool Matcher::accept_bytes(std::string_view bytes) {
  if (finished_) return false;
  int32_t cfg = cfg_;
  for (unsigned char b : bytes) {
    cfg = space_.step(cfg, b);
    if (cfg == ConfigSpace::kDead) return false;
  }
  cfg_ = cfg;
  return true;
}

std::optional<std::vector<int32_t>> Matcher::shortest_completion(size_t max_steps) {
  if (finished_ || space_.ended(cfg_)) return std::vector<int32_t>();
  const Grammar& g = g_->grammar();
  const Vocabulary& v = g_->vocab();
  // The token of each symbol: single-byte tokens, then the grammar's special tokens.
  std::vector<int32_t> token(space_.n_syms(), -1);
  for (const Vocabulary::Child& ch : v.children(0))
    if (!v.tokens_at(ch.node).empty()) token[ch.byte] = v.tokens_at(ch.node)[0];
  for (size_t i = 0; i < g.special_tokens.size(); ++i) token[kByteSyms + i] = g.special_tokens[i];
  struct From {
    int32_t prev;
    Sym sym;
    uint32_t depth;
  };
  std::unordered_map<int32_t, From> seen{{cfg_, {-1, 0, 0}}};
  std::vector<int32_t> queue{cfg_};
  for (size_t q = 0; q < queue.size(); ++q) {
    const int32_t c = queue[q];
    const uint32_t depth = seen[c].depth;
    if (depth >= max_steps) break;
    for (size_t sym = 0; sym < space_.n_syms(); ++sym) {
      if (token[sym] < 0) continue;
      const int32_t n = space_.step(c, Sym(sym));
      if (n == ConfigSpace::kDead || seen.count(n)) continue;
      seen[n] = {c, Sym(sym), depth + 1};
      if (space_.ended(n)) {
        std::vector<int32_t> out;
        for (int32_t x = n; seen[x].prev >= 0; x = seen[x].prev) out.push_back(token[seen[x].sym]);
        return std::vector<int32_t>(out.rbegin(), out.rend());
      }
      queue.push_back(n);
    }
  }
  return std::nullopt;
}

}  // namespace lilac::grammar
