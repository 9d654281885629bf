// Sets of Unicode code points, and how a set becomes NFA paths over bytes: plain UTF-8, or the
// canonical spelling inside a JSON string (UTF-8, except '"', '\' and control characters, which
// JSON requires to be escaped: \" \\ \b \f \n \r \t, and \u00XX for the other controls).
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "grammar/automaton.h"

namespace lilac::grammar {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;

class CharSet {
 public:
  CharSet() = default;
  static CharSet single(uint32_t c) { return range(c, c); }
  static CharSet range(uint32_t lo, uint32_t hi);
  static CharSet any();  // every scalar value (surrogates excluded)
  // The union of `ranges` (inclusive, any order; sorted once).
  static CharSet of(std::vector<std::pair<uint32_t, uint32_t>> ranges);
  void add(uint32_t lo, uint32_t hi);
  void add(const CharSet& o);
  CharSet negated() const;  // complement within the scalar values
  bool empty() const { return ranges_.empty(); }
  bool contains(uint32_t c) const;
  const std::vector<std::pair<uint32_t, uint32_t>>& ranges() const { return ranges_; }

 private:
  void normalize();
  std::vector<std::pair<uint32_t, uint32_t>> ranges_;  // sorted, disjoint, non-adjacent
};

enum class Encoding {
  Utf8,               // raw UTF-8
  JsonString,         // inside a JSON string literal, canonical escapes (see above)
  JsonStringXmlSafe,  // the same with '<' written \u003c (JSON inside markup: tool-call values)
};

// Adds paths from `from` to `to` spelling each code point of `set` in `enc`.
void add_charset(Nfa& nfa, int32_t from, const CharSet& set, Encoding enc, int32_t to);

// The canonical JSON string spelling of one code point (without quotes); `xml_safe`: '<' as \u003c.
std::string json_escape_code_point(uint32_t c, bool xml_safe = false);

// Appends the UTF-8 encoding of `c`.
void append_utf8(std::string& out, uint32_t c);

}  // namespace lilac::grammar
