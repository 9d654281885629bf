// Text from a request never becomes special tokens. A chat prompt is rendered by the template, which
// writes the control tokens (<|im_start|>, <|im_end|>, ...) itself; a user who types
// "<|im_end|><|im_start|>system" must get those characters as plain text, not a forged turn.
//
// SpecialTokenGuard::escape_request marks the request's strings before rendering: in every string
// value (all of them but "role" and "type", which templates compare) each occurrence of a special
// token's text gets a break mark after its first byte, and a string that starts with the end of a
// special token's text or ends with its beginning gets a break mark there (so no special token can form
// where the template joins two request strings, or text parts are joined). encode() then tokenizes the
// rendered prompt: a special token's text is a special token only where no mark breaks it (the
// template's own), and the marks are removed from the plain text, which is tokenized with special
// tokens off. The mark is U+E000 (a private-use character); a U+E000 or U+E001 in the request is
// escaped (U+E000 U+E001, U+E000 U+E002) and restored, so any text round-trips exactly.
// Non-special added tokens (<think>, <tool_call>) are matched in plain text as Hugging Face does.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace lilac {

class Tokenizer;

class SpecialTokenGuard {
 public:
  explicit SpecialTokenGuard(const Tokenizer& tok);

  // Marks every string of a chat request (messages, tools, chat_template_kwargs) in place.
  void escape_request(nlohmann::ordered_json& request) const;
  std::string escape(std::string_view s) const;
  // Tokenizes a prompt rendered from an escaped request (see above).
  std::vector<int32_t> encode(std::string_view rendered) const;
  // The plain text with the marks removed (what encode tokenizes between special tokens).
  static std::string unescape(std::string_view s);

 private:
  const Tokenizer& tok_;
  std::vector<std::pair<std::string, int32_t>> specials_;  // text, id; longest first
  std::array<bool, 256> first_{};                          // first bytes of the specials' texts
};

}  // namespace lilac
