// Undoing the simple encodings and obfuscations a text can carry before the sensitivity detectors run
// (router/scan.h scans each text and its variants). A variant is a whole text; only variants that differ
// from their source are produced.
//
//   canonical  NFKC (fullwidth and mathematical forms, compatibility characters), invisible characters
//              removed (zero-width space / joiners, soft hyphen, bidi controls, combining marks),
//              common Latin look-alikes mapped to Latin (Cyrillic / Greek letters such as а е о р с),
//              decimal digits of any script mapped to 0-9, ideographic full stops to '.', URL escapes
//              (%40) and HTML character references (&#64; &commat; &period;) and \uXXXX escapes decoded,
//              "[at]" "(at)" " at " and "[dot]" "(dot)" " dot " written out as '@' and '.', and any run
//              of up to three separators between two digits (space, '-', '.', '_', '/', '|', ',', ...)
//              made a single '-' (so 4111_1111_1111_1111 and 555.123.4567 read as a card and a phone);
//   digits     the canonical text with the separators between digits removed (4 1 1 1 ... 1 -> one run);
//   decoded    what base64 / base64url runs of 16 characters or more decode to, when that is text
//              (mostly printable UTF-8), itself canonicalised; one piece per run, newline-separated.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace lilac::router {

// The variants of `text` to scan besides `text` itself (0 to 4 strings). `budget` caps the bytes of the
// variants together (they are cut at it).
std::vector<std::string> text_variants(std::string_view text, size_t budget = size_t(1) << 26);

// The same variants, in buffers that a caller keeps from one text to the next: a routing decision builds them for
// every text it scans, and allocating and freeing a 100 KB string per variant (the heap's top given back to the
// system and faulted in again) was about half of a decision's cost (bench/BENCHMARKS.md "Hybrid router").
// A buffer kept from one text to the next (a thread's) is freed once it grew past kKeepBytes (a huge text).
constexpr size_t kKeepBytes = size_t(4) << 20;
void release_if_large(std::string& buf);

class TextVariants {
 public:
  const std::string_view* begin() const { return views_; }
  const std::string_view* end() const { return views_ + count_; }
  size_t size() const { return count_; }
  // Frees the buffers that grew past kKeepBytes (the views are invalid after).
  void release_large();

 private:
  friend void text_variants(std::string_view text, size_t budget, TextVariants& out);
  std::string canon_, dashed_, joined_, decoded_;
  std::string_view views_[4];
  size_t count_ = 0;
};
// Fills `out` (the views are valid until its next use); the same variants as above, in the same order.
void text_variants(std::string_view text, size_t budget, TextVariants& out);

// The canonical form alone (exposed for tests).
std::string canonical_text(std::string_view text);
// Base64 runs of `text` decoded to text (exposed for tests); "" when none decodes to text.
std::string decode_base64_runs(std::string_view text);

// The value of a base64 digit of either alphabet ("+/" or "-_"); -1 for any other character. Inline through a table:
// the opaque detector and the base64 variant call it for every byte of a prompt (a call per byte was ~12 % of a
// 100 KB routing decision, bench/BENCHMARKS.md "Hybrid router").
namespace detail {
struct Base64Digits {
  signed char v[256];
  constexpr Base64Digits() : v() {
    for (int c = 0; c < 256; ++c) {
      int d = -1;
      if (c >= 'A' && c <= 'Z') d = c - 'A';
      else if (c >= 'a' && c <= 'z') d = c - 'a' + 26;
      else if (c >= '0' && c <= '9') d = c - '0' + 52;
      else if (c == '+' || c == '-') d = 62;
      else if (c == '/' || c == '_') d = 63;
      v[c] = static_cast<signed char>(d);
    }
  }
};
inline constexpr Base64Digits kBase64Digits{};
}  // namespace detail
inline int base64_digit(char c) { return detail::kBase64Digits.v[static_cast<unsigned char>(c)]; }

// Whether the base64 characters `run` (either alphabet; line breaks and '=' skipped) decode to bytes that read as
// text (valid UTF-8, at least 90 % printable), judged on their first 288 bytes.
bool base64_decodes_to_text(std::string_view run);

// Whitespace-insensitive form for stickiness hashes: runs of (Unicode) whitespace become one space,
// none at the ends.
std::string collapse_whitespace(std::string_view text);
// The same into `out` (replaced), so that a caller can keep the buffer.
void collapse_whitespace(std::string_view text, std::string& out);

}  // namespace lilac::router
