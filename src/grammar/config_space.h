// Runtime states of a grammar: configurations of its pushdown automaton, interned and with their
// transitions memoized (a lazily built DFA over configurations).
//
// A frame is (rule, state, parent frame); a stack is its top frame (frames are shared, so stacks
// are persistent). A configuration is the set of stacks the input so far can be in, closed under
// calls (the callee's start is pushed) and returns (an accepting top is popped): every top left in
// it reads a symbol next ("ready" frames). `ended` says a stack was popped empty: the root rule
// (or, for a configuration started from one frame, that frame's rule) has matched.
// Config ids: kDead = nothing can follow, kEnded = only "the end" (no frame left).
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "grammar/grammar.h"

namespace lilac::grammar {

struct Frame {
  int32_t rule, state, parent;  // parent -1: bottom of the stack
};

class ConfigSpace {
 public:
  static constexpr int32_t kDead = 0, kEnded = 1;

  explicit ConfigSpace(const Grammar& g);

  // Closure of {(rule, state)} on an empty stack.
  int32_t initial(int32_t rule, int32_t state);
  // A configuration holding the single frame (rule, state) on an empty stack, *not* closed: only
  // that frame's own symbol edges are read by the next step. (rule, state) must read symbols.
  int32_t single(int32_t rule, int32_t state);
  // The configuration after reading `sym` (memoized).
  int32_t step(int32_t cfg, Sym sym);
  // After the rule of ready frame `f` has matched: the closure of its parent (kEnded without one).
  int32_t after_return(int32_t f);

  bool ended(int32_t cfg) const { return ended_[size_t(cfg)] != 0; }
  std::span<const int32_t> ready(int32_t cfg) const {
    return {pool_.data() + off_[size_t(cfg)], pool_.data() + off_[size_t(cfg) + 1]};
  }
  const Frame& frame(int32_t f) const { return frames_[size_t(f)]; }
  size_t n_configs() const { return ended_.size(); }
  size_t n_frames() const { return frames_.size(); }
  size_t n_syms() const { return nsym_; }
  const Grammar& grammar() const { return g_; }

 private:
  int32_t frame_id(int32_t rule, int32_t state, int32_t parent);
  int32_t close(std::vector<int32_t>& seeds);
  int32_t intern(std::vector<int32_t>& ready, bool ended);

  struct FrameHash {
    size_t operator()(const Frame& f) const {
      uint64_t h = uint64_t(uint32_t(f.rule)) * 0x9E3779B97F4A7C15ull;
      h ^= uint64_t(uint32_t(f.state)) + 0x7F4A7C159E3779B9ull + (h << 6) + (h >> 2);
      h ^= uint64_t(uint32_t(f.parent)) * 0xC2B2AE3D27D4EB4Full + (h << 6) + (h >> 2);
      return size_t(h);
    }
  };
  struct FrameEq {
    bool operator()(const Frame& a, const Frame& b) const {
      return a.rule == b.rule && a.state == b.state && a.parent == b.parent;
    }
  };
  struct VecHash {
    size_t operator()(const std::vector<int32_t>& v) const {
      uint64_t h = 1469598103934665603ull;
      for (int32_t x : v) h = (h ^ uint32_t(x)) * 1099511628211ull;
      return size_t(h ^ (h >> 31));
    }
  };

  const Grammar& g_;
  size_t nsym_;
  std::vector<Frame> frames_;
  std::unordered_map<Frame, int32_t, FrameHash, FrameEq> frame_ids_;
  std::vector<int32_t> ret_;  // after_return memo per frame (-2 unknown)
  // Configurations: ready frames pool_[off_[c] .. off_[c+1]), sorted; ended_[c].
  std::vector<int32_t> pool_;
  std::vector<uint32_t> off_;
  std::vector<uint8_t> ended_;
  std::unordered_map<std::vector<int32_t>, int32_t, VecHash> config_ids_;  // key: ready + [ended]
  std::vector<std::unique_ptr<int32_t[]>> trans_;  // per config, nsym_ entries (-2 unknown)
  // Closure scratch.
  std::vector<uint32_t> stamp_;
  uint32_t cur_stamp_ = 0;
  std::vector<int32_t> work_, ready_scratch_, seeds_;
};

}  // namespace lilac::grammar
