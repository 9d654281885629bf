// Helpers the backend, session and scheduler tests share: the shared fixtures' weights (loaded once per
// test binary), random prompts, and bitwise comparisons of logits and sampled choices.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/backend.h"
#include "engine/sampler.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "text/tokenizer.h"

namespace lilac::testutil {

// The weights of ../shared/fixtures/<name>/mlx4, loaded on first use and kept for the test binary's life.
inline std::shared_ptr<const ModelWeights> fixture(const std::string& name) {
  static std::map<std::string, std::shared_ptr<const ModelWeights>> cache;
  auto& w = cache[name];
  if (!w) w = load_model(std::string(LILAC_SHARED_DIR) + "/fixtures/" + name + "/mlx4", LoadOptions{.progress = false});
  return w;
}

// The fixture's weights with token `id`'s embedding row not a number (its scales NaN; its values when dense): a
// session fed that token computes NaN logits from then on, as from a broken checkpoint, and every other token is
// the fixture's. For the tests of a step whose sampler has no choice (engine/sampler.h).
inline std::shared_ptr<const ModelWeights> with_nan_embedding_row(const std::string& name, int32_t id) {
  auto w = std::make_shared<ModelWeights>(*fixture(name));
  QMatrix& e = w->embed;
  if (e.quantized()) {
    const size_t g = size_t(e.groups_per_row());
    auto scales = std::make_shared<std::vector<uint16_t>>(e.scales, e.scales + size_t(e.rows) * g);
    std::fill(scales->begin() + ptrdiff_t(size_t(id) * g), scales->begin() + ptrdiff_t(size_t(id + 1) * g),
              uint16_t(0x7fc0));  // bf16 NaN
    e.scales = scales->data();
    w->storage.push_back(scales);
  } else {
    const size_t c = size_t(e.cols);
    auto dense = std::make_shared<std::vector<float>>(e.dense, e.dense + size_t(e.rows) * c);
    std::fill(dense->begin() + ptrdiff_t(size_t(id) * c), dense->begin() + ptrdiff_t(size_t(id + 1) * c), NAN);
    e.dense = dense->data();
    w->storage.push_back(dense);
  }
  return w;
}

// The Qwen3 tokenizer of ../shared/fixtures/qwen3-tokenizer, loaded once.
inline std::shared_ptr<const Tokenizer> qwen3_tokenizer() {
  static auto t = std::shared_ptr<const Tokenizer>(
      Tokenizer::load(std::string(LILAC_SHARED_DIR) + "/fixtures/qwen3-tokenizer"));
  return t;
}

// A golden sequence of a fixture (../shared/README.md): its tokens, the oracle's logits [L, vocab], top-1 and margin.
struct GoldenSeq {
  std::vector<int32_t> tokens;
  std::vector<float> logits, margin;
  std::vector<int32_t> top1;
  int64_t vocab = 0;
  std::span<const float> row(size_t j) const { return {logits.data() + j * size_t(vocab), size_t(vocab)}; }
};

inline GoldenSeq golden_seq(const std::string& fixture, const std::string& seq) {
  const TensorSet ts = TensorSet::open_file(std::string(LILAC_SHARED_DIR) + "/fixtures/" + fixture + "/golden.safetensors");
  GoldenSeq g;
  auto ints = [&](const std::string& name) {
    const TensorInfo& t = ts.get(name);
    std::vector<int32_t> v(size_t(t.numel()));
    std::memcpy(v.data(), t.data, v.size() * 4);
    return v;
  };
  g.tokens = ints(seq + ".tokens");
  g.top1 = ints(seq + ".top1");
  g.logits = tensor_to_floats(ts.get(seq + ".logits"));
  g.margin = tensor_to_floats(ts.get(seq + ".margin"));
  g.vocab = int64_t(g.logits.size() / g.tokens.size());
  return g;
}

// The oracle's perplexity of the whole sequence (every token after the first, from its logits).
inline double oracle_perplexity(const GoldenSeq& g) {
  double nll = 0;
  for (size_t j = 0; j + 1 < g.tokens.size(); ++j) nll -= double(token_logprob(g.row(j), g.tokens[j + 1]));
  return std::exp(nll / double(g.tokens.size() - 1));
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

// The error a decode_batch row carries (TokenChoice::error): its message and whether it is an InputError; none: "".
struct RowError {
  std::string message;
  bool input = false;
};
inline RowError row_error(const TokenChoice& c) {
  if (!c.error) return {};
  try {
    std::rethrow_exception(c.error);
  } catch (const InputError& e) {
    return {e.what(), true};
  } catch (const std::exception& e) {
    return {e.what(), false};
  }
}

}  // namespace lilac::testutil
