// UTF-8 helpers, Unicode normalization (utf8proc) and the GPT-2 byte-level alphabet.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace lilac::unicode {

// Result of decoding one UTF-8 sequence at a position.
struct Decoded {
  enum Status { Ok, Invalid, Incomplete } status = Ok;
  char32_t cp = 0;  // the code point when Ok
  size_t len = 0;   // bytes consumed (>= 1). Invalid: the maximal subpart (Unicode 3.9, U+FFFD
                    // substitution of maximal subparts); Incomplete: the valid-so-far tail up to the end.
};
Decoded decode_utf8(std::string_view s, size_t pos);

bool is_valid_utf8(std::string_view s);
// Replaces each maximal ill-formed subpart (and an incomplete sequence at the end) by U+FFFD.
std::string sanitize_utf8(std::string_view s);
// Number of bytes at the end of `s` that form a valid but incomplete UTF-8 sequence (0..3):
// they may become a character once more bytes arrive.
size_t incomplete_utf8_tail(std::string_view s);
// Characters (code points) of UTF-8 text: the bytes that do not continue a character.
size_t utf8_chars(std::string_view s);
void append_utf8(std::string& out, char32_t cp);

enum class NormForm { NFC, NFD, NFKC, NFKD };
// Normalizes valid UTF-8 (sanitize first). Fast path: text that is already trivially normalized
// (all code points below U+0300 for NFC/NFD) is returned unchanged.
std::string normalize(std::string_view s, NormForm form);
inline std::string nfc(std::string_view s) { return normalize(s, NormForm::NFC); }

// Unicode White_Space property.
bool is_whitespace(char32_t cp);
// Letter, number or '_' (a "word" character, for added tokens with single_word).
bool is_word_char(char32_t cp);
// Invisible in text: format characters (Cf: zero-width space / joiners, soft hyphen, bidi controls,
// word joiner, BOM), combining marks (Mn, Me), C0 / C1 controls other than tab, line feed, vertical tab,
// form feed and carriage return, and the blank fillers U+115F, U+1160, U+3164, U+FFA0 (Hangul), U+2800 (Braille).
bool is_invisible(char32_t cp);
// The value 0-9 of a decimal digit of any script (category Nd: Arabic-Indic, Devanagari, fullwidth,
// ...), -1 for anything else.
int decimal_digit_value(char32_t cp);

// GPT-2 byte-level alphabet: every byte maps to a printable code point.
char32_t byte_to_unicode(uint8_t b);
int unicode_to_byte(char32_t cp);  // -1 when cp is not in the alphabet
std::string bytes_to_byte_level(std::string_view bytes);
// Byte-level string (as in tokenizer.json's vocabulary) -> raw bytes; nullopt when a character
// is outside the alphabet or the text is not valid UTF-8.
std::optional<std::string> byte_level_to_bytes(std::string_view s);

}  // namespace lilac::unicode
