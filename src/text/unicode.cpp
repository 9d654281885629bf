#include "text/unicode.h"

#include <cstdlib>
#include <memory>

#include <utf8proc.h>

#include "core/error.h"

namespace lilac::unicode {

bool is_invisible(char32_t cp) {
  // C0 and C1 controls but the whitespace ones (tab, line feed, vertical tab, form feed, carriage return), and the
  // blank fillers of Hangul and Braille, which show nothing but are letters or symbols, not format characters
  if (cp < 0x20) return cp < 0x09 || cp > 0x0D;
  if (cp >= 0x7F && cp <= 0x9F) return true;
  if (cp == 0x115F || cp == 0x1160 || cp == 0x3164 || cp == 0xFFA0 || cp == 0x2800) return true;
  if (cp < 0xAD) return false;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_ME:
      return true;
    default:
      return false;
  }
}

int decimal_digit_value(char32_t cp) {
  if (cp >= '0' && cp <= '9') return int(cp - '0');
  if (cp < 0x660) return -1;
  auto is_nd = [](char32_t c) { return utf8proc_category(static_cast<utf8proc_int32_t>(c)) == UTF8PROC_CATEGORY_ND; };
  if (!is_nd(cp)) return -1;
  // Nd characters come in runs of ten, 0 to 9 (some scripts have several runs in a row).
  char32_t start = cp;
  while (start > 0 && is_nd(start - 1) && cp - start < 100) --start;
  return int((cp - start) % 10);
}

namespace {
inline bool cont(uint8_t b) { return (b & 0xC0) == 0x80; }
}  // namespace

Decoded decode_utf8(std::string_view s, size_t pos) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data()) + pos;
  const size_t avail = s.size() - pos;
  const uint8_t b0 = p[0];
  if (b0 < 0x80) return {Decoded::Ok, b0, 1};
  size_t need;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  char32_t cp;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2, cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3, cp = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;  // no overlongs
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4, cp = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;  // <= U+10FFFF
  } else {
    return {Decoded::Invalid, 0, 1};
  }
  for (size_t i = 1; i < need; ++i) {
    if (i >= avail) return {Decoded::Incomplete, 0, i};
    const uint8_t b = p[i];
    const bool ok = (i == 1) ? (b >= lo && b <= hi) : cont(b);
    if (!ok) return {Decoded::Invalid, 0, i};
    cp = (cp << 6) | (b & 0x3F);
  }
  return {Decoded::Ok, cp, need};
}

bool is_valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<uint8_t>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    Decoded d = decode_utf8(s, i);
    if (d.status != Decoded::Ok) return false;
    i += d.len;
  }
  return true;
}

std::string sanitize_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<uint8_t>(s[i]) < 0x80) {
      out.push_back(s[i++]);
      continue;
    }
    Decoded d = decode_utf8(s, i);
    if (d.status == Decoded::Ok)
      out.append(s.substr(i, d.len));
    else
      out.append("\xEF\xBF\xBD");
    i += d.len;
  }
  return out;
}

size_t utf8_chars(std::string_view s) {
  size_t n = 0;
  for (char c : s) n += !cont(static_cast<uint8_t>(c));
  return n;
}

size_t incomplete_utf8_tail(std::string_view s) {
  // A lead byte can be at most 3 bytes before the end.
  const size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const uint8_t b = static_cast<uint8_t>(s[n - back]);
    if (cont(b)) continue;
    if (b < 0x80) return 0;
    Decoded d = decode_utf8(s, n - back);
    return d.status == Decoded::Incomplete && d.len == back ? back : 0;
  }
  return 0;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string normalize(std::string_view s, NormForm form) {
  // Every code point below U+0300 is its own NFC and NFD form (lead bytes < 0xCC). The
  // compatibility forms change some Latin-1 characters (e.g. U+00BD), so they need ASCII only.
  const uint8_t limit = (form == NormForm::NFC || form == NormForm::NFD) ? 0xCC : 0x80;
  bool trivial = true;
  for (char c : s)
    if (static_cast<uint8_t>(c) >= limit) {
      trivial = false;
      break;
    }
  if (trivial) return std::string(s);
  int opts = UTF8PROC_STABLE;
  switch (form) {
    case NormForm::NFC: opts |= UTF8PROC_COMPOSE; break;
    case NormForm::NFD: opts |= UTF8PROC_DECOMPOSE; break;
    case NormForm::NFKC: opts |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    case NormForm::NFKD: opts |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
  }
  utf8proc_uint8_t* out = nullptr;
  utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                    static_cast<utf8proc_ssize_t>(s.size()), &out,
                                    static_cast<utf8proc_option_t>(opts));
  if (n < 0) {
    throw Error(std::string("unicode normalization failed: ") + utf8proc_errmsg(n));
  }
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> guard(out, &std::free);
  return std::string(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
}

bool is_whitespace(char32_t cp) {
  switch (cp) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x20: case 0x85: case 0xA0:
    case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

bool is_word_char(char32_t cp) {
  if (cp < 0x80) return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || cp == '_';
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_NO:
      return true;
    default:
      return false;
  }
}

namespace {
struct ByteLevelTables {
  std::array<char32_t, 256> to_cp{};
  std::array<int16_t, 512> from_cp{};  // every alphabet code point is < 512
  ByteLevelTables() {
    from_cp.fill(-1);
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      to_cp[b] = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + extra++);
      from_cp[to_cp[b]] = static_cast<int16_t>(b);
    }
  }
};
const ByteLevelTables& tables() {
  static const ByteLevelTables t;
  return t;
}
}  // namespace

char32_t byte_to_unicode(uint8_t b) { return tables().to_cp[b]; }

int unicode_to_byte(char32_t cp) { return cp < 512 ? tables().from_cp[cp] : -1; }

std::string bytes_to_byte_level(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) append_utf8(out, byte_to_unicode(static_cast<uint8_t>(c)));
  return out;
}

std::optional<std::string> byte_level_to_bytes(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    Decoded d = decode_utf8(s, i);
    if (d.status != Decoded::Ok) return std::nullopt;
    const int b = unicode_to_byte(d.cp);
    if (b < 0) return std::nullopt;
    out.push_back(static_cast<char>(b));
    i += d.len;
  }
  return out;
}

}  // namespace lilac::unicode
