// Byte-level BPE tokenizer loaded from a Hugging Face tokenizer.json (+ tokenizer_config.json).
//
// Supported tokenizer.json (anything else is rejected at load with a lilac::Error naming the file
// and field): model.type "BPE" (or absent) with byte-level vocabulary (all 256 byte tokens present),
// merges as "a b" strings or ["a", "b"] pairs, optional ignore_merges; normalizer null, NFC, NFD,
// NFKC, NFKD or a Sequence of them; pre_tokenizer a ByteLevel step (use_regex applies GPT-2's
// regex) optionally preceded by Split steps (Regex via PCRE2 UTF+UCP+JIT, or String; behaviors
// Removed/Isolated/MergedWithPrevious/MergedWithNext/Contiguous; invert) and Digits, possibly in a
// Sequence; added_tokens with special/single_word/lstrip/rstrip/normalized flags.
// encode() is thread-safe (a shared cache of BPE results per pre-token).
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
  // regex, byte-level BPE. Invalid UTF-8 is replaced by U+FFFD (documented behaviour): each maximal
  // ill-formed subpart (Unicode 3.9) becomes one U+FFFD, so encode never throws on text.
  // Added tokens: leftmost-longest match; those with normalized=false are matched on the raw text,
  // those with normalized=true on the normalized text. parse_special=false treats added tokens
  // flagged "special" (e.g. <|im_end|>) as plain text; non-special added tokens (e.g. <think>,
  // <tool_call>) are still matched, as Hugging Face does. lstrip/rstrip swallow adjacent (Unicode)
  // whitespace; single_word requires no letter/digit/_ on either side.
  virtual std::vector<int32_t> encode(std::string_view text, bool parse_special = true) const = 0;
  // Ids -> text (bytes joined; may end in a partial UTF-8 sequence, which is kept as-is).
  // Throws lilac::InputError for an id outside [0, vocab_size()).
  virtual std::string decode(std::span<const int32_t> ids, bool skip_special = false) const = 0;
  // Raw bytes of one token (the byte-level alphabet mapped back; special tokens as their text).
  // Empty for an id that has no token (out of range, or a gap in the vocabulary); never throws.
  virtual const std::string& token_bytes(int32_t id) const = 0;
  // Id of a token given as its vocabulary string (byte-level form, e.g. "Ġworld") or added-token
  // content (e.g. "<|im_end|>"); nullopt if none.
  virtual std::optional<int32_t> token_id(std::string_view token) const = 0;
  virtual bool is_special(int32_t id) const = 0;
  // Added tokens (special or not: <|im_end|>, <tool_call>, <think>, ...): markup, never plain text.
  virtual bool is_added(int32_t id) const = 0;
  virtual int64_t vocab_size() const = 0;  // largest id + 1
  // From tokenizer_config.json where given (e.g. "<|im_end|>"), else empty.
  virtual std::string eos_token() const = 0;
  virtual std::string bos_token() const = 0;
};

}  // namespace lilac
