// Helpers of the grammar tests: byte-level acceptance, vocabularies, brute-force masks.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "grammar/config_space.h"
#include "grammar/matcher.h"
#include "grammar/schema.h"
#include "grammar/vocabulary.h"
#include "text/tokenizer.h"

namespace lilac::grammar::test {

// Whether `text` is a complete document of `g` (byte level, no tokens involved).
inline bool accepts(const Grammar& g, std::string_view text) {
  ConfigSpace sp(g);
  int32_t c = sp.initial(g.root, 0);
  for (unsigned char b : text) {
    c = sp.step(c, b);
    if (c == ConfigSpace::kDead) return false;
  }
  return sp.ended(c);
}

// Whether `text` can be continued to a complete document.
inline bool is_prefix(const Grammar& g, std::string_view text) {
  ConfigSpace sp(g);
  int32_t c = sp.initial(g.root, 0);
  for (unsigned char b : text) {
    c = sp.step(c, b);
    if (c == ConfigSpace::kDead) return false;
  }
  return true;
}

inline bool schema_accepts(std::string_view schema, std::string_view text) {
  return accepts(compile_json_schema_text(schema), text);
}

// The real Qwen3 tokenizer (loaded once) and its vocabulary with masks over 248320 ids (the
// Qwen3.6 model's vocabulary is larger than the tokenizer's).
inline const Tokenizer& qwen3() {
  static auto tok = Tokenizer::load(std::string(LILAC_SHARED_DIR) + "/fixtures/qwen3-tokenizer");
  return *tok;
}
inline std::shared_ptr<const Vocabulary> qwen3_vocab() {
  static auto v = Vocabulary::from_tokenizer(qwen3(), 248320);
  return v;
}
inline int32_t qwen3_im_end() { return *qwen3().token_id("<|im_end|>"); }

inline std::shared_ptr<TokenClassCache> shared_cache() {
  static auto c = std::make_shared<TokenClassCache>(size_t(512) << 20);
  return c;
}

inline std::shared_ptr<const CompiledGrammar> compiled(Grammar g, std::shared_ptr<const Vocabulary> v = qwen3_vocab()) {
  return std::make_shared<CompiledGrammar>(std::move(g), std::move(v), shared_cache());
}

// The single-byte token of each byte value (byte-level BPE has all 256).
inline const std::vector<int32_t>& byte_tokens() {
  static const std::vector<int32_t> out = [] {
    std::vector<int32_t> m(256, -1);
    const auto& v = *qwen3_vocab();
    for (int32_t t = 0; t < v.n_tokens(); ++t)
      if (v.usable(t) && v.bytes(t).size() == 1) m[uint8_t(v.bytes(t)[0])] = t;
    return m;
  }();
  return out;
}

inline bool bit(const std::vector<uint32_t>& m, int32_t t) { return (m[size_t(t) >> 5] >> (t & 31)) & 1u; }
inline size_t allowed_count(const std::vector<uint32_t>& m) {
  size_t n = 0;
  for (uint32_t w : m) n += size_t(__builtin_popcount(w));
  return n;
}

}  // namespace lilac::grammar::test
