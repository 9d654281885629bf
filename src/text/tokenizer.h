// Byte-level BPE tokenizer loaded from a Hugging Face tokenizer.json (+ tokenizer_config.json).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace lilac {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Loads DIR/tokenizer.json and DIR/tokenizer_config.json (if present). Throws lilac::Error.
  static std::unique_ptr<Tokenizer> load(const std::string& dir);

  // Text -> ids: NFC, added/special tokens matched first (when parse_special), pre-tokenizer
  // regex, byte-level BPE. Invalid UTF-8 is replaced by U+FFFD (documented behaviour).
  virtual std::vector<int32_t> encode(std::string_view text, bool parse_special = true) const = 0;
  // Ids -> text (bytes joined; may end in a partial UTF-8 sequence, which is kept as-is).
  virtual std::string decode(std::span<const int32_t> ids, bool skip_special = false) const = 0;
  // Raw bytes of one token (the byte-level alphabet mapped back; special tokens as their text).
  virtual const std::string& token_bytes(int32_t id) const = 0;
  // Id of a token given as its vocabulary string or added-token content; nullopt if none.
  virtual std::optional<int32_t> token_id(std::string_view token) const = 0;
  virtual bool is_special(int32_t id) const = 0;
  virtual int64_t vocab_size() const = 0;  // largest id + 1
  // From tokenizer_config.json where given (e.g. "<|im_end|>"), else empty.
  virtual std::string eos_token() const = 0;
  virtual std::string bos_token() const = 0;
};

}  // namespace lilac
