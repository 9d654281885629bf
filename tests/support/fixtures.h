// Helpers the backend, session and scheduler tests share: the shared fixtures' weights (loaded once per
// test binary), random prompts, and bitwise comparisons of logits and sampled choices.
#pragma once
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "model/weights.h"

namespace lilac::testutil {

// The weights of ../shared/fixtures/<name>/mlx4, loaded on first use and kept for the test binary's life.
inline std::shared_ptr<const ModelWeights> fixture(const std::string& name) {
  static std::map<std::string, std::shared_ptr<const ModelWeights>> cache;
  auto& w = cache[name];
  if (!w) w = load_model(std::string(LILAC_SHARED_DIR) + "/fixtures/" + name + "/mlx4", LoadOptions{.progress = false});
  return w;
}

// n token ids uniform in [0, vocab), deterministic in seed.
inline std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(0, int32_t(vocab - 1));
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = d(rng);
  return t;
}

inline bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The same token, logprob and top logprobs, bit for bit.
inline bool same_choice(const TokenChoice& a, const TokenChoice& b) {
  if (a.token != b.token || !same_bits(a.logprob, b.logprob) || a.top.size() != b.top.size()) return false;
  for (size_t i = 0; i < a.top.size(); ++i)
    if (a.top[i].token != b.top[i].token || !same_bits(a.top[i].logprob, b.top[i].logprob)) return false;
  return true;
}

}  // namespace lilac::testutil
