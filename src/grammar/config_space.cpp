#include "grammar/config_space.h"

#include <algorithm>

namespace lilac::grammar {

namespace {
// Bounds against pathological grammars (e.g. deeply nested ambiguous anyOf): one configuration
// with this many stacks is an error rather than a slowdown without end. Grammars come from requests (schemas,
// tools), so meeting a bound is the request's error (InputError: a 400), not the server's (an anyOf of 4,200
// string branches was a 500 "internal error").
constexpr size_t kMaxStacks = 4096;
constexpr size_t kMaxClosure = 1 << 20;
}  // namespace

ConfigSpace::ConfigSpace(const Grammar& g) : g_(g), nsym_(kByteSyms + g.special_tokens.size()) {
  off_.push_back(0);
  std::vector<int32_t> none;
  intern(none, false);  // kDead
  intern(none, true);   // kEnded
}

int32_t ConfigSpace::frame_id(int32_t rule, int32_t state, int32_t parent) {
  const Frame f{rule, state, parent};
  auto [it, fresh] = frame_ids_.try_emplace(f, int32_t(frames_.size()));
  if (fresh) {
    frames_.push_back(f);
    ret_.push_back(-2);
    stamp_.push_back(0);
  }
  return it->second;
}

int32_t ConfigSpace::intern(std::vector<int32_t>& ready, bool ended) {
  ready.push_back(ended ? 1 : 0);
  auto [it, fresh] = config_ids_.try_emplace(ready, int32_t(ended_.size()));
  ready.pop_back();
  if (fresh) {
    pool_.insert(pool_.end(), ready.begin(), ready.end());
    off_.push_back(uint32_t(pool_.size()));
    ended_.push_back(ended ? 1 : 0);
    trans_.emplace_back();
  }
  return it->second;
}

int32_t ConfigSpace::close(std::vector<int32_t>& seeds) {
  if (++cur_stamp_ == 0) {
    std::fill(stamp_.begin(), stamp_.end(), 0);
    cur_stamp_ = 1;
  }
  work_.assign(seeds.begin(), seeds.end());
  ready_scratch_.clear();
  bool ended = false;
  size_t visited = 0;
  while (!work_.empty()) {
    const int32_t f = work_.back();
    work_.pop_back();
    if (stamp_[size_t(f)] == cur_stamp_) continue;
    stamp_[size_t(f)] = cur_stamp_;
    if (++visited > kMaxClosure) throw InputError("grammar: closure of a configuration too large (schema too ambiguous)");
    const Frame fr = frames_[size_t(f)];
    if (g_.has_symbols(fr.rule, fr.state)) ready_scratch_.push_back(f);
    for (const CallEdge& c : g_.calls(fr.rule, fr.state)) {
      const int32_t ret = frame_id(fr.rule, c.to, fr.parent);
      work_.push_back(frame_id(c.rule, 0, ret));
    }
    if (g_.accepting(fr.rule, fr.state)) {
      if (fr.parent < 0)
        ended = true;
      else
        work_.push_back(fr.parent);
    }
  }
  if (ready_scratch_.size() > kMaxStacks)
    throw InputError("grammar: more than " + std::to_string(kMaxStacks) +
                     " parses at once (schema too ambiguous: e.g. many anyOf branches that match the same text)");
  std::sort(ready_scratch_.begin(), ready_scratch_.end());
  return intern(ready_scratch_, ended);
}

int32_t ConfigSpace::initial(int32_t rule, int32_t state) {
  seeds_.assign(1, frame_id(rule, state, -1));
  return close(seeds_);
}

int32_t ConfigSpace::single(int32_t rule, int32_t state) {
  seeds_.assign(1, frame_id(rule, state, -1));
  return intern(seeds_, false);
}

int32_t ConfigSpace::step(int32_t cfg, Sym sym) {
  int32_t* t = trans_[size_t(cfg)].get();
  if (!t) {
    trans_[size_t(cfg)].reset(new int32_t[nsym_]);
    t = trans_[size_t(cfg)].get();
    std::fill(t, t + nsym_, -2);
  }
  if (t[sym] != -2) return t[sym];
  std::vector<int32_t> seeds;
  for (int32_t f : ready(cfg)) {
    const Frame fr = frames_[size_t(f)];
    const int32_t s = g_.step(fr.rule, fr.state, sym);
    if (s >= 0) seeds.push_back(frame_id(fr.rule, s, fr.parent));
  }
  const int32_t next = seeds.empty() ? kDead : close(seeds);
  t[sym] = next;
  return next;
}

int32_t ConfigSpace::after_return(int32_t f) {
  if (ret_[size_t(f)] != -2) return ret_[size_t(f)];
  const int32_t parent = frames_[size_t(f)].parent;
  int32_t c = kEnded;
  if (parent >= 0) {
    seeds_.assign(1, parent);
    c = close(seeds_);
  }
  ret_[size_t(f)] = c;
  return c;
}

}  // namespace lilac::grammar
