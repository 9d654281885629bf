// Text variants for the sensitivity scan (see normalize.h).
#include "router/normalize.h"

#include <array>
#include <bit>
#include <cstdint>
#include <cstring>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "router/long_runs.h"
#include "text/unicode.h"

namespace lilac::router {

namespace {

using unicode::append_utf8;
using unicode::decode_utf8;
using unicode::Decoded;

int hexv(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool ieq(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  return true;
}

// Where the ';' of an HTML reference opened by the '&' at s[i] is, or npos: named references are short, numeric ones
// may carry leading zeros (&#0000000064;). Only those max_len bytes are searched: a search to the end of the text made
// a text of '&'s quadratic (2 MB of them: 22 s of one request's scan).
size_t reference_end(std::string_view s, size_t i) {
  const size_t max_len = i + 1 < s.size() && s[i + 1] == '#' ? 32 : 10;
  const size_t at = s.substr(i + 1, max_len).find(';');
  return at == std::string_view::npos ? std::string_view::npos : i + 1 + at;
}

// One pass of %XX, &#NN; &#xHH; &name; (a few names), \\, \xHH, \u{H..} and \uXXXX (with surrogate pairs) decoding.
std::string decode_escapes(std::string_view s, bool* changed) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '%' && i + 2 < s.size() && hexv(s[i + 1]) >= 0 && hexv(s[i + 2]) >= 0) {
      out.push_back(static_cast<char>(hexv(s[i + 1]) * 16 + hexv(s[i + 2])));
      i += 2;
      *changed = true;
      continue;
    }
    if (c == '&') {
      if (const size_t semi = reference_end(s, i); semi != std::string_view::npos) {
        std::string_view ent = s.substr(i + 1, semi - i - 1);
        long cp = -1;
        if (ent.size() > 1 && ent[0] == '#') {
          const bool hex = ent[1] == 'x' || ent[1] == 'X';
          char* end = nullptr;
          std::string num(ent.substr(hex ? 2 : 1));
          cp = num.empty() ? -1 : std::strtol(num.c_str(), &end, hex ? 16 : 10);
          if (!end || *end) cp = -1;
        } else if (ieq(ent, "commat")) cp = '@';
        else if (ieq(ent, "period")) cp = '.';
        else if (ieq(ent, "amp")) cp = '&';
        else if (ieq(ent, "nbsp")) cp = ' ';
        else if (ieq(ent, "hyphen") || ieq(ent, "dash")) cp = '-';
        else if (ieq(ent, "lowbar")) cp = '_';
        else if (ieq(ent, "plus")) cp = '+';
        else if (ieq(ent, "colon")) cp = ':';
        else if (ieq(ent, "sol")) cp = '/';
        else if (ieq(ent, "comma")) cp = ',';
        else if (ieq(ent, "num")) cp = '#';
        else if (ieq(ent, "equals")) cp = '=';
        if (cp > 0 && cp < 0x110000) {
          append_utf8(out, char32_t(cp));
          i = semi;
          *changed = true;
          continue;
        }
      }
    }
    if (c == '\\' && i + 1 < s.size() && s[i + 1] == '\\') {  // an escaped backslash: \\u0040 is \u0040 next pass
      out.push_back('\\');
      ++i;
      *changed = true;
      continue;
    }
    if (c == '\\' && i + 3 < s.size() && (s[i + 1] == 'x' || s[i + 1] == 'X') && hexv(s[i + 2]) >= 0 &&
        hexv(s[i + 3]) >= 0 && hexv(s[i + 2]) < 8) {  // \x40 (an ASCII byte)
      out.push_back(static_cast<char>(hexv(s[i + 2]) * 16 + hexv(s[i + 3])));
      i += 3;
      *changed = true;
      continue;
    }
    if (c == '\\' && i + 3 < s.size() && (s[i + 1] == 'u' || s[i + 1] == 'U') && s[i + 2] == '{') {  // \u{40}
      size_t j = i + 3;
      long v = 0;
      while (j < s.size() && j < i + 9 && hexv(s[j]) >= 0) v = v * 16 + hexv(s[j++]);
      if (j > i + 3 && j < s.size() && s[j] == '}' && v > 0 && v < 0x110000 && (v < 0xD800 || v >= 0xE000)) {
        append_utf8(out, char32_t(v));
        i = j;
        *changed = true;
        continue;
      }
    }
    if (c == '\\' && i + 5 < s.size() && (s[i + 1] == 'u' || s[i + 1] == 'U')) {
      int v = 0;
      bool ok = true;
      for (int k = 2; k < 6; ++k) {
        int h = hexv(s[i + size_t(k)]);
        ok &= h >= 0;
        v = v * 16 + std::max(h, 0);
      }
      if (ok) {
        char32_t cp = char32_t(v);
        size_t used = 6;
        if (v >= 0xD800 && v < 0xDC00 && i + 11 < s.size() && s[i + 6] == '\\' && s[i + 7] == 'u') {
          int lo = 0;
          bool ok2 = true;
          for (int k = 8; k < 12; ++k) {
            int h = hexv(s[i + size_t(k)]);
            ok2 &= h >= 0;
            lo = lo * 16 + std::max(h, 0);
          }
          if (ok2 && lo >= 0xDC00 && lo < 0xE000) {
            cp = char32_t(0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00));
            used = 12;
          }
        }
        if (cp < 0xD800 || cp >= 0xE000) {
          append_utf8(out, cp);
          i += used - 1;
          *changed = true;
          continue;
        }
      }
    }
    out.push_back(c);
  }
  return out;
}

// Latin look-alikes (Cyrillic, Greek, a few others) -> ASCII.
char32_t confusable(char32_t cp) {
  struct M {
    char32_t from;
    char to;
  };
  static constexpr M kMap[] = {
      {0x0430, 'a'}, {0x0435, 'e'}, {0x043E, 'o'}, {0x0440, 'p'}, {0x0441, 'c'}, {0x0443, 'y'}, {0x0445, 'x'},
      {0x0456, 'i'}, {0x0458, 'j'}, {0x0455, 's'}, {0x0501, 'd'}, {0x04BB, 'h'}, {0x04CF, 'l'}, {0x051B, 'q'},
      {0x051D, 'w'}, {0x0261, 'g'}, {0x0410, 'A'}, {0x0412, 'B'}, {0x0415, 'E'}, {0x041A, 'K'}, {0x041C, 'M'},
      {0x041D, 'H'}, {0x041E, 'O'}, {0x0420, 'P'}, {0x0421, 'C'}, {0x0422, 'T'}, {0x0425, 'X'}, {0x0423, 'Y'},
      {0x0406, 'I'}, {0x0408, 'J'}, {0x0405, 'S'}, {0x03B1, 'a'}, {0x03BF, 'o'}, {0x03BD, 'v'}, {0x03B9, 'i'},
      {0x03BA, 'k'}, {0x03C1, 'p'}, {0x03C5, 'u'}, {0x0391, 'A'}, {0x0392, 'B'}, {0x0395, 'E'}, {0x0396, 'Z'},
      {0x0397, 'H'}, {0x0399, 'I'}, {0x039A, 'K'}, {0x039C, 'M'}, {0x039D, 'N'}, {0x039F, 'O'}, {0x03A1, 'P'},
      {0x03A4, 'T'}, {0x03A5, 'Y'}, {0x03A7, 'X'}, {0x3002, '.'}, {0xFF61, '.'}, {0x2024, '.'}, {0x2010, '-'},
      {0x2011, '-'}, {0x2012, '-'}, {0x2013, '-'}, {0x2014, '-'}, {0x2212, '-'}, {0xFE6B, '@'}, {0xFF20, '@'},
  };
  for (const M& m : kMap)
    if (m.from == cp) return char32_t(m.to);
  return cp;
}

// Invisible characters dropped, look-alikes and digits of any script mapped to ASCII.
std::string map_code_points(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const unsigned char b = static_cast<unsigned char>(s[i]);
    if (b < 0x80) {
      if (!unicode::is_invisible(b)) out.push_back(char(b));
      ++i;
      continue;
    }
    Decoded d = decode_utf8(s, i);
    i += d.len;
    if (d.status != Decoded::Ok) continue;
    if (unicode::is_invisible(d.cp)) continue;
    if (int v = unicode::decimal_digit_value(d.cp); v >= 0) {
      out.push_back(char('0' + v));
      continue;
    }
    append_utf8(out, confusable(d.cp));
  }
  return out;
}

// "[at]" "(at)" "{at}" "<at>" -> '@', the same with dot -> '.'; and " at " / " dot " when the text spells
// an address that way (an " at " with a " dot " after it).
std::string spelled_out(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  auto word_at = [&](size_t i, std::string_view w) { return i + w.size() <= s.size() && ieq(s.substr(i, w.size()), w); };
  size_t last_dot = std::string_view::npos;
  for (size_t i = s.size() >= 5 ? s.size() - 5 + 1 : 0; i-- > 0;)
    if (word_at(i, " dot ")) {
      last_dot = i;
      break;
    }
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '[' || c == '(' || c == '{' || c == '<') {
      size_t j = i + 1;
      while (j < s.size() && s[j] == ' ') ++j;
      const bool at = word_at(j, "at"), dot = word_at(j, "dot");
      if (at || dot) {
        size_t k = j + (at ? 2 : 3);
        while (k < s.size() && s[k] == ' ') ++k;
        if (k < s.size() && (s[k] == ']' || s[k] == ')' || s[k] == '}' || s[k] == '>')) {
          while (!out.empty() && out.back() == ' ') out.pop_back();
          out.push_back(at ? '@' : '.');
          i = k;
          while (i + 1 < s.size() && s[i + 1] == ' ') ++i;
          continue;
        }
      }
    }
    if (last_dot != std::string_view::npos && c == ' ') {
      if (i < last_dot && word_at(i, " at ")) {
        out.push_back('@');
        i += 3;
        continue;
      }
      if (word_at(i, " dot ")) {
        out.push_back('.');
        i += 4;
        continue;
      }
    }
    out.push_back(c);
  }
  return out;
}

// The separators that may split a number (see normalize.h), as a table: strchr per byte was ~2 % of a 100 KB decision.
constexpr detail::ByteSet make_set(std::string_view chars) {
  detail::ByteSet t{};
  for (char c : chars) t[static_cast<unsigned char>(c)] = true;
  return t;
}
constexpr detail::ByteSet kSep = make_set(" -._/\\|,~*");
inline bool is_sep(char c) { return kSep[static_cast<unsigned char>(c)]; }
inline bool is_digit(char c) { return static_cast<unsigned char>(c - '0') < 10; }

#if defined(__SSE2__)
// 16 bytes as a bit mask: the bytes equal to c.
inline unsigned eq_mask(__m128i v, char c) { return unsigned(_mm_movemask_epi8(_mm_cmpeq_epi8(v, _mm_set1_epi8(c)))); }
// The bytes of v in [lo, lo + span].
inline unsigned range_mask(__m128i v, char lo, char span) {
  const __m128i x = _mm_sub_epi8(v, _mm_set1_epi8(lo));
  return unsigned(_mm_movemask_epi8(_mm_cmpeq_epi8(_mm_min_epu8(x, _mm_set1_epi8(span)), x)));
}
inline __m128i load16(const char* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
#endif

// Separators (1 to 3 of them) between two digits: replaced by `with` ('\0' = removed). With '-', a single
// ' ', '-' or '.' is left as is (the detectors read those already). The result goes to `out` only when it differs from
// `s` (the return value says whether it does); the unchanged stretches are copied whole.
bool digit_separators(std::string_view s, char with, std::string& out) {
  const size_t n = s.size();
  size_t copied = 0;  // s[0, copied) is in `out`, rewritten
  bool changed = false;
  // At a digit s[i]: the separators after it and the digit after them, if any, rewritten; where to go on from.
  auto at_digit = [&](size_t i) {
    size_t j = i + 1;
    while (j < n && j - i <= 3 && is_sep(s[j])) ++j;
    if (!(j > i + 1 && j - i <= 4 && j < n && is_digit(s[j]))) return i + 1;
    const bool plain = j == i + 2 && (s[i + 1] == ' ' || s[i + 1] == '-' || s[i + 1] == '.');
    if (!(with && plain)) {  // (a plain separator kept is the same byte: nothing to rewrite)
      if (!changed) {
        out.clear();
        out.reserve(n);
        changed = true;
      }
      out.append(s.data() + copied, i + 1 - copied);
      if (with) out.push_back(with);
      copied = j;
    }
    return j;
  };
  size_t i = 0;
#if defined(__SSE2__)
  // Only a digit followed by a separator can begin a rewrite: found 16 at a time. (The bytes skipped after a rewrite
  // are separators, never such a digit.)
  for (size_t base = 0; base + 17 <= n; base += 16) {
    const __m128i v = load16(s.data() + base), w = load16(s.data() + base + 1);
    unsigned m = range_mask(v, '0', 9);
    if (m) {
      unsigned sep = 0;
      for (char c : {' ', '-', '.', '_', '/', '\\', '|', ',', '~', '*'}) sep |= eq_mask(w, c);
      m &= sep;
    }
    for (; m; m &= m - 1) {
      const size_t k = base + size_t(std::countr_zero(m));
      if (k >= i) i = at_digit(k);
    }
    i = std::max(i, base + 16);
  }
#endif
  while (i < n) i = is_digit(s[i]) ? at_digit(i) : i + 1;
  if (changed) out.append(s.data() + copied, n - copied);
  return changed;
}

// Whether some run of digits and separators holds 13+ digits split by separators (a card written in
// odd groups: only then is the digits-joined variant worth scanning). Such a run is at least 14 bytes of digits and
// separators, so only those runs are read (the count starts afresh at each: the byte before one is neither).
bool has_split_long_number(std::string_view s) {
  static constexpr detail::ByteSet kDigitOrSep = [] {
    detail::ByteSet t = kSep;
    for (int c = '0'; c <= '9'; ++c) t[size_t(c)] = true;
    return t;
  }();
  bool found = false;
  detail::for_each_long_run(s, kDigitOrSep, 14, [&](size_t b, size_t e) {
    if (found) return;
    size_t digits = 0, seps = 0;
    for (size_t i = b; i <= e; ++i) {  // s[e], when there is one, is neither: it ends the count
      const char c = i < s.size() ? s[i] : '\0';
      if (is_digit(c)) {
        ++digits;
      } else if (digits > 0 && is_sep(c) && i + 1 < s.size() && (is_digit(s[i + 1]) || is_sep(s[i + 1]))) {
        ++seps;
      } else {
        if (digits >= 13 && seps > 0) found = true;
        digits = seps = 0;
      }
    }
  });
  return found;
}

// What needs_canonical does at a byte: kCanonNo (nothing), kCanonYes (the form differs: non-ASCII, an ASCII control
// that is dropped) or kCanonLook (an escape or a spelled-out "at" / "dot" may begin here).
constexpr uint8_t kCanonNo = 0, kCanonYes = 1, kCanonLook = 2;
constexpr std::array<uint8_t, 256> make_canon_table() {
  std::array<uint8_t, 256> t{};
  for (int c = 0; c < 256; ++c)
    if (c >= 0x80 || (c < 0x20 && (c < 0x09 || c > 0x0D)) || c == 0x7F) t[size_t(c)] = kCanonYes;  // unicode::is_invisible
  for (char c : {'%', '&', '\\', '[', '(', '{', '<', ' '}) t[static_cast<unsigned char>(c)] = kCanonLook;
  return t;
}
constexpr std::array<uint8_t, 256> kCanon = make_canon_table();

// Whether the canonical form can differ from the text (else it is not computed): non-ASCII, an escape
// (%XX, &...;, \u), a bracketed or spaced-out "at" / "dot".
bool needs_canonical(std::string_view s) {
  const size_t n = s.size();
  // Whether the form differs because of what begins at s[i] (each byte on its own: any order will do).
  auto at = [&](size_t i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const uint8_t what = kCanon[c];
    if (what == kCanonNo) return false;
    if (what == kCanonYes) return true;  // (an ASCII control inside a word is dropped)
    switch (c) {
      case '%':
        if (i + 2 < n && hexv(s[i + 1]) >= 0 && hexv(s[i + 2]) >= 0) return true;
        break;
      case '&':
        if (reference_end(s, i) != std::string_view::npos) return true;
        break;
      case '\\':
        if (i + 1 < n && (s[i + 1] == 'u' || s[i + 1] == 'U' || s[i + 1] == 'x' || s[i + 1] == 'X' || s[i + 1] == '\\'))
          return true;
        break;
      case '[': case '(': case '{': case '<': {
        size_t j = i + 1;
        while (j < n && s[j] == ' ') ++j;
        if (j + 2 <= n && (ieq(s.substr(j, 2), "at") || (j + 3 <= n && ieq(s.substr(j, 3), "dot")))) return true;
        break;
      }
      case ' ':  // (a space before every word: the 'd' is looked at before the comparison)
        if (i + 5 <= n && (s[i + 1] | 0x20) == 'd' && ieq(s.substr(i, 5), " dot ")) return true;
        break;
      default: break;
    }
    return false;
  };
  size_t i = 0;
#if defined(__SSE2__)
  // 16 bytes at a time, only the bytes at which `at` can hold looked at: non-ASCII, the controls that are dropped, the
  // first bytes of escapes and brackets, a space before a 'd'.
  for (; i + 17 <= n; i += 16) {
    const __m128i v = load16(s.data() + i), w = load16(s.data() + i + 1);
    unsigned m = unsigned(_mm_movemask_epi8(v)) | range_mask(v, 0x00, 0x08) | range_mask(v, 0x0E, 0x11) | eq_mask(v, 0x7F);
    for (char c : {'%', '&', '\\', '[', '(', '{', '<'}) m |= eq_mask(v, c);
    m |= eq_mask(v, ' ') & eq_mask(_mm_or_si128(w, _mm_set1_epi8(0x20)), 'd');
    for (; m; m &= m - 1)
      if (at(i + size_t(std::countr_zero(m)))) return true;
  }
#endif
  for (; i < n; ++i)
    if (at(i)) return true;
  return false;
}

// Whether decoded bytes read as text: valid UTF-8, at least 90% printable.
bool looks_like_text(std::string_view d) {
  if (d.empty() || !unicode::is_valid_utf8(d)) return false;
  size_t bad = 0, n = 0;
  for (size_t i = 0; i < d.size();) {
    Decoded c = decode_utf8(d, i);
    i += c.len;
    ++n;
    if (c.cp < 0x20 && c.cp != '\n' && c.cp != '\r' && c.cp != '\t') ++bad;
    if (c.cp == 0x7F || c.cp == 0xFFFD) ++bad;
  }
  return bad * 10 <= n;
}

constexpr detail::ByteSet kBase64Set = [] {
  detail::ByteSet t{};
  for (int c = 0; c < 256; ++c) t[size_t(c)] = detail::kBase64Digits.v[c] >= 0;
  return t;
}();

// Appends to `out` what the base64 runs of `s` decode to (see decode_base64_runs). Only runs of 16 or more are decoded:
// they are found without reading the short runs' every byte (long_runs.h).
void decode_runs(std::string_view s, int depth, std::string& out) {
  auto run = [&](size_t i, size_t j) {
    const size_t len = j - i;
    if (len % 4 == 1) return;
    std::string d;
    d.reserve(len * 3 / 4);
    uint32_t acc = 0;
    int bits = 0;
    for (size_t k = i; k < j; ++k) {
      acc = (acc << 6) | uint32_t(base64_digit(s[k]));
      bits += 6;
      if (bits >= 8) {
        bits -= 8;
        d.push_back(char((acc >> bits) & 0xFF));
      }
      if (d.size() == 256) {  // binary: stop early
        std::string_view head(d);
        head.remove_suffix(unicode::incomplete_utf8_tail(head));
        if (!looks_like_text(head)) break;
      }
    }
    if (looks_like_text(d)) {
      out += canonical_text(d);
      out.push_back('\n');
      if (depth > 0) decode_runs(d, depth - 1, out);
    }
  };
#if defined(__SSE2__)
  detail::for_each_long_run(s, kBase64Set, 16, run, [](const unsigned char* q) {
    const __m128i v = load16(reinterpret_cast<const char*>(q));
    return range_mask(v, 'A', 25) | range_mask(v, 'a', 25) | range_mask(v, '0', 9) | eq_mask(v, '+') | eq_mask(v, '/') |
           eq_mask(v, '-') | eq_mask(v, '_');
  });
#else
  detail::for_each_long_run(s, kBase64Set, 16, run);
#endif
}

}  // namespace

std::string canonical_text(std::string_view text) {
  std::string s = unicode::is_valid_utf8(text) ? std::string(text) : unicode::sanitize_utf8(text);
  for (int pass = 0; pass < 2; ++pass) {  // twice: %2540 -> %40 -> @
    bool changed = false;
    std::string d = decode_escapes(s, &changed);
    if (!changed) break;
    s = unicode::sanitize_utf8(d);
  }
  // Decomposed first, so that combining marks are separate code points when map_code_points drops them (composed,
  // "A" + U+0301 was "Á", a letter kept, and "ÁKIA..." no longer began with AKIA); composed again after.
  auto fold = [](const std::string& t) {
    return unicode::normalize(map_code_points(unicode::normalize(t, unicode::NormForm::NFKD)), unicode::NormForm::NFC);
  };
  s = fold(s);
  // Escapes that only the compatibility forms spell (fullwidth "％４０" is "%40" after NFKD): decoded once more.
  bool changed = false;
  std::string d = decode_escapes(s, &changed);
  if (changed) s = fold(unicode::sanitize_utf8(d));
  return spelled_out(s);
}

std::string decode_base64_runs(std::string_view text) {
  std::string out;
  decode_runs(text, 1, out);
  return out;
}

bool base64_decodes_to_text(std::string_view run) {
  std::string d;
  uint32_t acc = 0;
  int bits = 0;
  for (size_t k = 0; k < run.size() && d.size() < 288; ++k) {
    const int v = base64_digit(run[k]);
    if (v < 0) continue;  // line breaks, padding
    acc = (acc << 6) | uint32_t(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      d.push_back(char((acc >> bits) & 0xFF));
    }
  }
  std::string_view head(d);
  head.remove_suffix(unicode::incomplete_utf8_tail(head));
  return looks_like_text(head);
}

void text_variants(std::string_view text, size_t budget, TextVariants& out) {
  out.count_ = 0;
  size_t used = 0;
  // A variant that differs from its source (the caller knows, or compares), cut at the budget.
  auto add = [&](const std::string& v, bool differs) {
    if (v.empty() || !differs || used >= budget) return;
    const size_t len = std::min(v.size(), budget - used);
    used += len;
    out.views_[out.count_++] = std::string_view(v).substr(0, len);
  };
  std::string_view canon = text;
  if (needs_canonical(text)) {
    out.canon_ = canonical_text(text);
    canon = out.canon_;
    add(out.canon_, canon != text);
  }
  size_t digits = 0;  // (counted up to the 7 that matter)
  for (size_t i = 0; i < canon.size() && digits < 7; ++i) digits += is_digit(canon[i]);
  if (digits >= 7) {
    // (digit_separators leaves its buffer as it was when the variant would equal the text: not added then)
    add(out.dashed_, digit_separators(canon, '-', out.dashed_));
    if (has_split_long_number(canon)) add(out.joined_, digit_separators(canon, '\0', out.joined_));
  }
  out.decoded_.clear();
  decode_runs(canon, 1, out.decoded_);
  add(out.decoded_, true);
}

void release_if_large(std::string& buf) {
  if (buf.capacity() > kKeepBytes) std::string().swap(buf);
}

void TextVariants::release_large() {
  count_ = 0;
  for (std::string* b : {&canon_, &dashed_, &joined_, &decoded_}) release_if_large(*b);
}

std::vector<std::string> text_variants(std::string_view text, size_t budget) {
  TextVariants v;
  text_variants(text, budget, v);
  return {v.begin(), v.end()};
}

std::string collapse_whitespace(std::string_view text) {
  std::string out;
  collapse_whitespace(text, out);
  return out;
}

void collapse_whitespace(std::string_view text, std::string& out) {
  // The result is never longer than the text: written through a pointer, then cut to its length (16 bytes of room
  // after it: whole 16-byte blocks are stored, and only the bytes that belong kept).
  const size_t n = text.size();
  out.resize(n + 16);
  char* const base = out.data();
  char* o = base;
  bool pending = false;
  // One byte (ASCII) or character from text[i]; where the next begins.
  auto step = [&](size_t i) {
    if (const unsigned char b = static_cast<unsigned char>(text[i]); b < 0x80) {  // ASCII: what the general path does
      if (b == ' ' || (b >= 0x09 && b <= 0x0D)) {
        pending = o != base;
      } else {
        if (pending) *o++ = ' ';
        pending = false;
        *o++ = static_cast<char>(b);
      }
      return i + 1;
    }
    Decoded d = decode_utf8(text, i);
    if (d.status == Decoded::Ok && unicode::is_whitespace(d.cp)) {
      pending = o != base;
      return i + d.len;
    }
    if (pending) *o++ = ' ';
    pending = false;
    std::memcpy(o, text.data() + i, d.len);
    o += d.len;
    return i + d.len;
  };
  size_t i = 0;
#if defined(__SSE2__)
  // The bytes before the next one that may be whitespace (<= 0x20, or not ASCII) are copied as a block.
  while (i + 16 <= n) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(text.data() + i));
    const unsigned m = unsigned(_mm_movemask_epi8(v)) |
                       unsigned(_mm_movemask_epi8(_mm_cmpeq_epi8(_mm_min_epu8(v, _mm_set1_epi8(0x20)), v)));
    const size_t k = m ? size_t(std::countr_zero(m)) : 16;
    if (k) {
      if (pending) *o++ = ' ';
      pending = false;
      _mm_storeu_si128(reinterpret_cast<__m128i*>(o), v);
      o += k;
      i += k;
    }
    if (k < 16) i = step(i);
  }
#endif
  while (i < n) i = step(i);
  out.resize(size_t(o - base));
}

}  // namespace lilac::router
