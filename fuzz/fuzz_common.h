// What several fuzz targets share: the fixtures they load once (from ../shared, as the tests do).
#pragma once
#include <memory>
#include <string>

#include "text/tokenizer.h"

namespace lilac::fuzz {

inline std::string shared_path(const std::string& rel) { return std::string(LILAC_SHARED_DIR) + "/" + rel; }

// The real Qwen3 tokenizer (../shared/fixtures/qwen3-tokenizer), loaded once.
inline std::shared_ptr<const Tokenizer> qwen3_tokenizer() {
  static auto tok = std::shared_ptr<const Tokenizer>(Tokenizer::load(shared_path("fixtures/qwen3-tokenizer")));
  return tok;
}

}  // namespace lilac::fuzz
