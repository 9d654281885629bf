// Sensitive-data detectors: one pass over the bytes, hand-written validators (see detectors.h).
#include "router/detectors.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace lilac::router {

namespace {

inline bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
inline bool is_upper(unsigned char c) { return c >= 'A' && c <= 'Z'; }
inline bool is_lower(unsigned char c) { return c >= 'a' && c <= 'z'; }
inline bool is_alpha(unsigned char c) { return is_upper(c) || is_lower(c); }
inline bool is_alnum(unsigned char c) { return is_digit(c) || is_alpha(c); }
inline bool is_hex(unsigned char c) {
  return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}
// Characters of a secret-like token (base64url alphabet without padding).
inline bool is_tok(unsigned char c) { return is_alnum(c) || c == '_' || c == '-'; }
// Characters of an e-mail local part (dot-atom subset).
inline bool is_local(unsigned char c) {
  return is_alnum(c) || c == '.' || c == '_' || c == '%' || c == '+' || c == '-';
}

// Character classes for the main loop.
constexpr uint8_t kDigit = 1, kUpper = 2, kLower = 4, kHex = 8, kApiFirst = 16, kSpecial = 32;
constexpr uint8_t kAlnum = kDigit | kUpper | kLower;
constexpr std::array<uint8_t, 256> make_class_table() {
  std::array<uint8_t, 256> t{};
  for (int c = '0'; c <= '9'; ++c) t[c] = kDigit | kHex;
  for (int c = 'A'; c <= 'Z'; ++c) t[c] = kUpper;
  for (int c = 'a'; c <= 'z'; ++c) t[c] = kLower;
  for (int c = 'a'; c <= 'f'; ++c) t[c] |= kHex;
  for (int c = 'A'; c <= 'F'; ++c) t[c] |= kHex;
  // First letters of the API-key prefixes (api_key below) and JWT / SendGrid forms.
  for (char c : {'s', 'r', 'g', 'x', 'h', 'n', 'A', 'd', 'p', 'e', 'S'}) t[static_cast<unsigned char>(c)] |= kApiFirst;
  for (char c : {'@', '+', '(', '-', ':'}) t[static_cast<unsigned char>(c)] |= kSpecial;
  return t;
}
constexpr std::array<uint8_t, 256> kClass = make_class_table();

// The end of the word (a run of ASCII letters and digits) that begins at p[i], and in *seen the kAlnum classes of its
// bytes: with SSE2, 16 bytes at a time (one unpredictable branch per word instead of one per byte); without, a byte at a
// time through kClass.
inline size_t word_end(const unsigned char* p, size_t i, size_t n, uint8_t* seen) {
  uint8_t s = 0;
#if defined(__SSE2__)
  auto in_range = [](__m128i v, char lo, char span) {  // the bytes of v in [lo, lo + span], as bits
    const __m128i x = _mm_sub_epi8(v, _mm_set1_epi8(lo));
    return unsigned(_mm_movemask_epi8(_mm_cmpeq_epi8(_mm_min_epu8(x, _mm_set1_epi8(span)), x)));
  };
  for (; n - i >= 16; i += 16) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i));
    const unsigned digit = in_range(v, '0', 9), upper = in_range(v, 'A', 25), lower = in_range(v, 'a', 25);
    const unsigned stop = ~(digit | upper | lower) & 0xFFFFu;  // the bytes that are not in a word
    const unsigned in_word = stop ? (stop & (0u - stop)) - 1 : 0xFFFFu;  // those before the first of them
    s |= uint8_t((digit & in_word ? kDigit : 0) | (upper & in_word ? kUpper : 0) | (lower & in_word ? kLower : 0));
    if (stop) {
      *seen = s;
      return i + size_t(std::countr_zero(stop));
    }
  }
#endif
  while (i < n && (kClass[p[i]] & kAlnum)) s |= kClass[p[i++]] & kAlnum;
  *seen = s;
  return i;
}

struct Scanner {
  std::string_view t;
  size_t n;

  unsigned char at(size_t i) const { return i < n ? static_cast<unsigned char>(t[i]) : 0; }

  // A number may start at i: not glued to a word, a decimal or a dash-joined number before it.
  bool num_start_ok(size_t i) const {
    if (i == 0) return true;
    unsigned char p = at(i - 1);
    return !(is_alnum(p) || p == '_' || p == '.' || p == '-' || p == '+' || p == '@');
  }
  // A number may end at j (exclusive): not followed by a word char or by .digit / -digit.
  bool num_end_ok(size_t j) const {
    if (j >= n) return true;
    unsigned char c = at(j);
    if (is_alnum(c) || c == '_' || c == '@') return false;
    if ((c == '.' || c == '-') && is_digit(at(j + 1))) return false;
    return true;
  }

  // ---- e-mail: called at '@' (position a); returns [start, end) or false.
  bool email(size_t a, size_t floor, size_t* s_out, size_t* e_out) const {
    size_t s = a;
    while (s > floor && is_local(at(s - 1)) && a - s < 64) --s;
    // Local part: 1..64 chars, no leading/trailing dot.
    while (s < a && (at(s) == '.' || at(s) == '-' || at(s) == '+')) ++s;
    if (s == a || at(a - 1) == '.') return false;
    // Domain: labels of [A-Za-z0-9-] separated by single dots; the last label (TLD) alphabetic, >= 2.
    size_t j = a + 1;
    size_t labels = 0, last_label_start = j, last_label_end = j;
    while (j < n) {
      size_t ls = j;
      while (j < n && (is_alnum(at(j)) || at(j) == '-') && j - ls < 63) ++j;
      if (j == ls || at(ls) == '-' || at(j - 1) == '-') {
        j = ls;
        break;
      }
      ++labels;
      last_label_start = ls;
      last_label_end = j;
      if (at(j) == '.' && is_alnum(at(j + 1))) {
        ++j;
        continue;
      }
      break;
    }
    if (labels < 2) return false;
    j = last_label_end;
    size_t tld_len = last_label_end - last_label_start;
    if (tld_len < 2) return false;
    for (size_t k = last_label_start; k < last_label_end; ++k)
      if (!is_alpha(at(k))) return false;
    *s_out = s;
    *e_out = j;
    return true;
  }

  // ---- payment card: 13-19 digits, optionally in groups of 3-6 joined by one kind of separator.
  // A candidate with a card's shape whose Luhn check fails sets *shape to its length (the caller skips it).
  size_t card(size_t i, size_t* shape) const {
    if (!num_start_ok(i)) return 0;
    unsigned char first = at(i);
    if (first < '2' || first > '6') return 0;
    char digits[20];
    size_t nd = 0, j = i, group = 0, end = 0;
    unsigned char sep = 0;
    bool bad_group = false;
    int group_count = 0;
    while (j < n) {
      unsigned char c = at(j);
      if (is_digit(c)) {
        if (nd == 19) return 0;  // longer runs are not card numbers
        digits[nd++] = static_cast<char>(c);
        ++group;
        ++j;
        end = j;
      } else if ((c == ' ' || c == '-') && is_digit(at(j + 1)) && group > 0) {
        if (sep == 0) sep = c;
        else if (sep != c) break;
        // Would the next group overflow 19 digits? Then the card ends here.
        size_t k = j + 1, next = 0;
        while (k < n && is_digit(at(k))) ++k, ++next;
        if (nd + next > 19) break;
        if (group < 3 || group > 6 || (group_count == 0 && group != 4)) bad_group = true;
        ++group_count;
        group = 0;
        ++j;
      } else {
        break;
      }
    }
    if (sep && (group < 3 || group > 6)) bad_group = true;  // formats: 4-4-4-4(-3), 4-6-5, 4-6-4
    if (bad_group || nd < 13 || !num_end_ok(end)) return 0;
    if (!luhn_valid(std::string_view(digits, nd))) {
      *shape = end - i;
      return 0;
    }
    return end - i;
  }

  // ---- a payment card inside a longer run of digit groups: "4111 1111 1111 1111 12/27" (a card and its
  // expiry), "5555555555554444 1", "ref 4111 4111 1111 1111 1111". card() reads the run as one number,
  // which then fails its shape or Luhn check, so the card in it went unseen (found by the `detectors` fuzz
  // target). Here: windows of whole consecutive groups, earliest first and longest first, with a card's
  // shape (13-19 digits, the first 2-6; several groups: the first of 4, the others 3-6) and a valid Luhn sum.
  bool card_in_run(size_t i, size_t* s_out, size_t* len_out) const {
    if (!num_start_ok(i)) return false;
    size_t gb[16], ge[16];
    int ng = 0;
    unsigned char sep = 0;
    for (size_t j = i; ng < 16;) {
      const size_t b = j;
      while (j < n && is_digit(at(j))) ++j;
      if (j - b > 19) {  // a longer number holds no card of its own; the run ends before it
        if (ng == 0) return false;
        break;
      }
      gb[ng] = b;
      ge[ng++] = j;
      const unsigned char c = j < n ? at(j) : 0;
      if (!((c == ' ' || c == '-') && (sep == 0 || sep == c) && is_digit(at(j + 1)))) break;
      sep = c;
      ++j;
    }
    char digits[20];
    for (int a = 0; a < ng; ++a) {
      if (at(gb[a]) < '2' || at(gb[a]) > '6') continue;
      for (int b = ng - 1; b >= a; --b) {
        size_t nd = 0;
        bool shape = b == a || ge[a] - gb[a] == 4;
        for (int k = a; k <= b && shape; ++k) {
          const size_t len = ge[k] - gb[k];
          if (b > a && k > a && (len < 3 || len > 6)) shape = false;
          nd += len;
        }
        if (!shape || nd < 13 || nd > 19 || (b == ng - 1 && !num_end_ok(ge[b]))) continue;
        nd = 0;
        for (int k = a; k <= b; ++k)
          for (size_t q = gb[k]; q < ge[k]; ++q) digits[nd++] = static_cast<char>(at(q));
        if (luhn_valid(std::string_view(digits, nd))) {
          *s_out = gb[a];
          *len_out = ge[b] - gb[a];
          return true;
        }
      }
    }
    return false;
  }

  // ---- US SSN: AAA-GG-SSSS (or with spaces), area not 000/666/9xx, group not 00, serial not 0000.
  size_t ssn(size_t i) const {
    if (i + 11 > n || !num_start_ok(i)) return 0;
    unsigned char sep = at(i + 3);
    if (sep != '-' && sep != ' ') return 0;
    if (at(i + 6) != sep) return 0;
    static constexpr int pos[9] = {0, 1, 2, 4, 5, 7, 8, 9, 10};
    int d[9];
    for (int k = 0; k < 9; ++k) {
      unsigned char c = at(i + pos[k]);
      if (!is_digit(c)) return 0;
      d[k] = c - '0';
    }
    if (!num_end_ok(i + 11)) return 0;
    int area = d[0] * 100 + d[1] * 10 + d[2];
    int group = d[3] * 10 + d[4];
    int serial = d[5] * 1000 + d[6] * 100 + d[7] * 10 + d[8];
    if (area == 0 || area == 666 || area >= 900 || group == 0 || serial == 0) return 0;
    return 11;
  }

  // ---- IPv4: four decimal octets <= 255, no leading zeros.
  size_t ipv4(size_t i) const { return num_start_ok(i) ? ipv4_tail(i) : 0; }

  // ---- IPv6: hex groups with ':' and at most one '::', optionally ending in a dotted IPv4.
  // To keep code like `a::b` out, it needs a decimal digit and at least two explicit groups.
  size_t ipv6(size_t i) const {
    if (i > 0) {
      unsigned char p = at(i - 1);
      if (is_alnum(p) || p == ':' || p == '_' || p == '.') return 0;
    }
    size_t j = i, end = i;
    int groups = 0;
    bool dbl = false, digit = false;
    if (at(j) == ':') {
      if (at(j + 1) != ':') return 0;
      dbl = true;
      j += 2;
      end = j;
    }
    while (groups < 8) {
      size_t s = j;
      while (j < n && is_hex(at(j)) && j - s <= 4) {
        if (is_digit(at(j))) digit = true;
        ++j;
      }
      size_t len = j - s;
      if (len == 0) break;
      if (at(j) == '.') {
        // Embedded IPv4 tail (e.g. ::ffff:192.0.2.1).
        size_t v4 = (groups <= 6 && (dbl || groups == 6)) ? ipv4_tail(s) : 0;
        if (!v4) return 0;
        groups += 2;
        end = s + v4;
        digit = true;
        break;
      }
      if (len > 4) return 0;
      ++groups;
      end = j;
      if (at(j) == ':' && at(j + 1) == ':') {
        if (dbl) return 0;
        dbl = true;
        j += 2;
        end = j;
        continue;
      }
      if (at(j) == ':' && is_hex(at(j + 1))) {
        ++j;
        continue;
      }
      break;
    }
    if (!digit || groups < 2) return 0;
    if (dbl ? groups > 7 : groups != 8) return 0;
    if (end < n && (is_alnum(at(end)) || at(end) == '_')) return 0;
    if (at(end) == ':' && is_hex(at(end + 1))) return 0;  // more groups than an address has
    return end - i;
  }
  // Dotted IPv4 with no boundary check before it (also the tail of an IPv6 address).
  size_t ipv4_tail(size_t i) const {
    size_t j = i;
    for (int oct = 0; oct < 4; ++oct) {
      if (oct > 0) {
        if (at(j) != '.') return 0;
        ++j;
      }
      size_t s = j;
      int v = 0;
      while (j < n && is_digit(at(j)) && j - s < 3) v = v * 10 + (at(j++) - '0');
      if (j == s || is_digit(at(j)) || v > 255 || (j - s > 1 && at(s) == '0')) return 0;
    }
    return num_end_ok(j) ? j - i : 0;
  }

  // ---- phone numbers. Groups of digits joined by single separators (space, '-', '.'), a group may be
  // parenthesised. International: '+' then 8-15 digits in total. National: US/NANP (1) AAA BBB CCCC with
  // area and exchange starting 2-9; or a leading-0 trunk prefix with 9-12 digits in groups of >= 2
  // (00-prefixed international: 10-17). A plain run of digits is never a phone number here.
  size_t phone(size_t i) const {
    unsigned char c0 = at(i);
    const bool intl = c0 == '+';
    if (i > 0) {
      unsigned char p = at(i - 1);
      if (is_alnum(p) || p == '_' || p == '.' || p == '-' || p == '+' || p == '/' || p == '@') return 0;
      if (p == '(' && !intl) return 0;  // "(555) ..." is parsed from the '('
    }
    size_t j = intl ? i + 1 : i;
    if (intl && !(is_digit(at(j)) && at(j) != '0')) return 0;
    constexpr int kMaxGroups = 10;
    int glen[kMaxGroups];
    unsigned char gfirst[kMaxGroups];
    size_t gend[kMaxGroups];
    int ng = 0;
    while (j < n && j - i < 32 && ng < kMaxGroups) {
      bool paren = false;
      if (at(j) == '(') {
        paren = true;
        ++j;
      }
      size_t s = j;
      while (j < n && is_digit(at(j)) && j - s < 16) ++j;
      size_t len = j - s;
      if (len == 0 || len > 15 || (paren && at(j) != ')')) break;  // not a group: the number ended before it
      if (paren) ++j;
      glen[ng] = static_cast<int>(len);
      gfirst[ng] = at(s);
      gend[ng++] = j;
      unsigned char c = at(j);
      if (paren && (is_digit(c) || c == '(')) continue;  // "(555)123-4567"
      if ((c == ' ' || c == '-' || c == '.') && (is_digit(at(j + 1)) || at(j + 1) == '(')) {
        ++j;
        continue;
      }
      break;
    }
    // The longest run of whole groups with a phone number's shape. A number followed by more digit groups
    // ("+44 20 7946 0958 390973623", "415 555 2671 12") or by a '(' that opens no group was missed when the
    // whole run had to be the number (found by the `detectors` fuzz target). Only the whole run must end
    // clear of a word; a shorter one ends at a separator.
    for (int m = ng; m >= 1; --m) {
      const size_t end = gend[m - 1];
      if (m == ng && !num_end_ok(end)) continue;
      int total = 0;
      for (int k = 0; k < m; ++k) total += glen[k];
      if (intl) {
        if (total >= 8 && total <= 15) return end - i;
        continue;
      }
      if (m < 2) break;
      if (m == 3 && glen[0] == 3 && glen[1] == 3 && glen[2] == 4 && gfirst[0] >= '2' && gfirst[1] >= '2')
        return end - i;
      if (m == 4 && glen[0] == 1 && gfirst[0] == '1' && glen[1] == 3 && glen[2] == 3 && glen[3] == 4 &&
          gfirst[1] >= '2' && gfirst[2] >= '2')
        return end - i;
      if (gfirst[0] == '0' && glen[0] >= 2) {
        const size_t d0 = c0 == '(' ? i + 1 : i;
        const bool intl00 = at(d0 + 1) == '0';
        const int lo = intl00 ? 10 : 9, hi = intl00 ? 17 : 12;
        bool groups_ok = total >= lo && total <= hi;
        for (int k = 1; k < m && groups_ok; ++k) groups_ok = glen[k] >= 2;
        if (groups_ok) return end - i;
      }
    }
    return 0;
  }

  // ---- IBAN: CCkk + BBAN, length from the country table, optional spaces every 4 chars, mod-97 == 1.
  // An IBAN-shaped candidate whose checksum fails sets *shape to its length (the caller skips it, so its
  // digit groups are not taken for phone or card numbers).
  size_t iban(size_t i, size_t* shape) const {
    if (i > 0 && (is_alnum(at(i - 1)) || at(i - 1) == '_')) return 0;
    if (!is_upper(at(i)) || !is_upper(at(i + 1)) || !is_digit(at(i + 2)) || !is_digit(at(i + 3))) return 0;
    int len = iban_country_length(static_cast<char>(at(i)), static_cast<char>(at(i + 1)));
    if (len == 0) return 0;
    char buf[40];
    int nb = 0;
    size_t j = i;
    bool spaced = false;
    while (nb < len && j < n) {
      unsigned char c = at(j);
      if (is_upper(c) || is_digit(c)) {
        buf[nb++] = static_cast<char>(c);
        ++j;
      } else if (c == ' ' && nb % 4 == 0 && nb > 0 && (is_upper(at(j + 1)) || is_digit(at(j + 1)))) {
        if (!spaced && nb != 4) return 0;
        spaced = true;
        ++j;
      } else {
        return 0;
      }
      if (spaced && nb < len && nb % 4 != 0 && at(j) == ' ') return 0;
    }
    if (nb != len) return 0;
    if (j < n && (is_alnum(at(j)) || at(j) == '_')) return 0;
    if (!iban_checksum_valid(std::string_view(buf, nb))) {
      *shape = j - i;
      return 0;
    }
    return j - i;
  }

  // ---- API keys with a known prefix.
  size_t api_key(size_t i) const {
    if (i > 0 && is_tok(at(i - 1))) return 0;
    struct Prefix {
      std::string_view p;
      size_t min_body;
      int charset;  // 0: [A-Za-z0-9], 1: [A-Za-z0-9_-], 2: [A-Z0-9] exact length, 3: [A-Za-z0-9_], 4: [a-f0-9]
      size_t exact;
    };
    static constexpr Prefix kPrefixes[] = {
        {"sk_live_", 16, 0, 0}, {"sk_test_", 16, 0, 0}, {"rk_live_", 16, 0, 0}, {"rk_test_", 16, 0, 0},
        {"sk-", 20, 1, 0},      {"ghp_", 30, 0, 0},     {"gho_", 30, 0, 0},     {"ghu_", 30, 0, 0},
        {"ghs_", 30, 0, 0},     {"ghr_", 30, 0, 0},     {"github_pat_", 22, 3, 0},
        {"xoxa-", 10, 1, 0},    {"xoxb-", 10, 1, 0},    {"xoxp-", 10, 1, 0},    {"xoxr-", 10, 1, 0},
        {"xoxs-", 10, 1, 0},    {"glpat-", 20, 1, 0},   {"hf_", 30, 0, 0},      {"npm_", 36, 0, 0},
        {"AKIA", 16, 2, 16},    {"ASIA", 16, 2, 16},    {"AIza", 35, 1, 0},     {"shpat_", 32, 4, 0},
        {"shpss_", 32, 4, 0},   {"dop_v1_", 64, 4, 0},  {"pypi-AgE", 50, 1, 0},
    };
    unsigned char c = at(i);
    for (const auto& p : kPrefixes) {
      if (static_cast<unsigned char>(p.p[0]) != c) continue;
      const size_t pl = p.p.size();
      if (pl > n - i || std::memcmp(t.data() + i, p.p.data(), pl) != 0) continue;
      size_t j = i + pl;
      auto ok = [&](unsigned char ch) {
        switch (p.charset) {
          case 0: return is_alnum(ch);
          case 1: return is_tok(ch);
          case 2: return is_upper(ch) || is_digit(ch);
          case 3: return is_alnum(ch) || ch == '_';
          default: return is_digit(ch) || (ch >= 'a' && ch <= 'f');
        }
      };
      while (j < n && ok(at(j))) ++j;
      size_t body = j - (i + pl);
      if (body < p.min_body) continue;
      if (p.exact && body != p.exact) continue;
      if (j < n && is_tok(at(j))) continue;  // glued to more token chars of another alphabet
      return j - i;
    }
    // JSON Web Token: eyJ<header>.eyJ<payload>.<signature>
    if (c == 'e' && t.compare(i, 3, "eyJ") == 0) {
      size_t j = i + 3;
      while (j < n && is_tok(at(j))) ++j;
      if (j - i < 13 || at(j) != '.' || t.compare(j + 1, 3, "eyJ") != 0) return 0;
      size_t s = j + 1;
      j = s + 3;
      while (j < n && is_tok(at(j))) ++j;
      if (j - s < 13) return 0;
      if (at(j) == '.') {
        ++j;
        while (j < n && is_tok(at(j))) ++j;
      }
      return j - i;
    }
    // SendGrid: SG.<22>.<43>
    if (c == 'S' && t.compare(i, 3, "SG.") == 0) {
      size_t j = i + 3, s = j;
      while (j < n && is_tok(at(j))) ++j;
      if (j - s != 22 || at(j) != '.') return 0;
      s = ++j;
      while (j < n && is_tok(at(j))) ++j;
      if (j - s != 43) return 0;
      return j - i;
    }
    return 0;
  }

  // ---- high-entropy token: run of [A-Za-z0-9_-] at a token start, >= 24 chars, upper + lower + digit,
  // Shannon entropy >= 3.5 bits/char and short case/digit chunks (random text switches case and digits
  // every ~2 chars; identifiers like getUserAccountBalance2024 have word-long chunks). Returns the run length
  // in *run (so the caller can skip it) and whether it counts.
  bool high_entropy(size_t i, size_t* run) const {
    size_t j = i;
    uint8_t seen = 0;
    while (j < n) {
      uint8_t k = kClass[at(j)];
      if (!(k & kAlnum) && at(j) != '_' && at(j) != '-') break;
      seen |= k;
      ++j;
    }
    *run = j - i;
    if (*run < 24) return false;
    if (*run > 4096) return false;  // a blob, not a key; keeps the cost linear and bounded
    if ((seen & kAlnum) != kAlnum) return false;  // needs upper, lower and digits (git SHAs, UUIDs: no)
    int counts[64] = {0};
    bool up = false, lo = false, dg = false;
    size_t chunks = 0, alnum = 0;
    int prev = -1;  // 0 lower, 1 upper, 2 digit
    for (size_t k = i; k < j; ++k) {
      unsigned char c = at(k);
      int cls, idx;
      if (is_lower(c)) cls = 0, idx = c - 'a', lo = true;
      else if (is_upper(c)) cls = 1, idx = 26 + c - 'A', up = true;
      else if (is_digit(c)) cls = 2, idx = 52 + c - '0', dg = true;
      else {
        counts[62 + (c == '-')]++;
        prev = -1;
        continue;
      }
      counts[idx]++;
      ++alnum;
      // Chunks: [A-Z]?[a-z]+ | [A-Z]+ | [0-9]+
      bool new_chunk;
      if (prev == -1) new_chunk = true;
      else if (cls == 0) new_chunk = prev == 2;           // lower continues lower or an upper
      else if (cls == 1) new_chunk = prev != 1;           // upper starts a chunk unless after upper
      else new_chunk = prev != 2;
      // An upper run followed by lower: the last upper starts a new word ("HTTPServer" = HTTP, Server),
      // which does not change the count: the lower joins the word.
      if (new_chunk) ++chunks;
      prev = cls;
    }
    if (!(up && lo && dg) || chunks == 0) return false;
    if (static_cast<double>(alnum) / static_cast<double>(chunks) > 3.25) return false;
    double len = static_cast<double>(*run), h = 0;
    for (int c : counts)
      if (c) {
        double p = c / len;
        h -= p * std::log2(p);
      }
    return h >= 3.5;
  }

  // ---- private keys: -----BEGIN <label> PRIVATE KEY----- (or PRIVATE KEY BLOCK), up to the END line.
  size_t private_key(size_t i, size_t* no_end_after) const {
    static constexpr std::string_view kBegin = "-----BEGIN ";
    if (t.compare(i, kBegin.size(), kBegin) != 0) return 0;
    size_t j = i + kBegin.size();
    size_t label_end = t.substr(0, std::min(n, j + 80)).find("-----", j);
    if (label_end == std::string_view::npos) return 0;
    std::string_view label = t.substr(j, label_end - j);
    if (label.find("PRIVATE KEY") == std::string_view::npos) return 0;
    size_t hdr_end = label_end + 5;
    if (i >= *no_end_after) return hdr_end - i;
    size_t e = t.find("-----END ", hdr_end);
    if (e == std::string_view::npos) {
      *no_end_after = i;  // no END anywhere after here: later BEGINs need not look again
      return hdr_end - i;
    }
    size_t e2 = t.find("-----", e + 9);
    if (e2 == std::string_view::npos) return hdr_end - i;
    return e2 + 5 - i;
  }
};

}  // namespace

const char* detector_name(DetectorKind k) {
  switch (k) {
    case DetectorKind::email: return "email";
    case DetectorKind::phone: return "phone";
    case DetectorKind::card: return "card";
    case DetectorKind::iban: return "iban";
    case DetectorKind::ssn: return "ssn";
    case DetectorKind::ipv4: return "ipv4";
    case DetectorKind::ipv6: return "ipv6";
    case DetectorKind::private_key: return "private_key";
    case DetectorKind::api_key: return "api_key";
    case DetectorKind::high_entropy: return "high_entropy";
    case DetectorKind::opaque: return "opaque";
    default: return "unknown";
  }
}

bool detector_from_name(std::string_view name, DetectorKind* out) {
  for (int k = 0; k < kDetectorKindCount; ++k) {
    if (name == detector_name(static_cast<DetectorKind>(k))) {
      *out = static_cast<DetectorKind>(k);
      return true;
    }
  }
  return false;
}

namespace {

// The detectors other than opaque, in one pass over the bytes. kFast: the end of each word is found 16 bytes at a time,
// and a word on which no detector can begin (a letter first, no IBAN's shape, shorter than 20, followed by none of
// "_-.:") is passed over without the tests below (detail::scan_sensitive_plain is the same loop without either).
template <bool kFast>
void scan_words(std::string_view text, DetectorSet en, std::vector<Finding>& out, size_t max_findings) {
  if (en.empty()) return;
  Scanner sc{text, text.size()};
  const size_t n = text.size();
  size_t i = 0, floor = 0, no_end_after = n;
  size_t card_only_until = 0;  // inside an IBAN-shaped near miss: its digit words are tried as cards only
  bool full = max_findings && out.size() >= max_findings;
  auto emit = [&](DetectorKind k, size_t off, size_t len) {
    out.push_back({k, off, len});
    i = off + len;
    floor = i;
    full = max_findings && out.size() >= max_findings;
  };
  const bool want_email = en.has(DetectorKind::email);
  const bool want_digit = en.has(DetectorKind::card) || en.has(DetectorKind::ssn) ||
                          en.has(DetectorKind::ipv4) || en.has(DetectorKind::phone) ||
                          en.has(DetectorKind::ipv6);
  // Detectors are only called where their necessary conditions hold (checked on the word's shape: its
  // length, whether it is all digits, the character after it), so ordinary words cost a table lookup each.
  const bool want_card = en.has(DetectorKind::card), want_ssn = en.has(DetectorKind::ssn),
             want_ipv4 = en.has(DetectorKind::ipv4), want_phone = en.has(DetectorKind::phone),
             want_ipv6 = en.has(DetectorKind::ipv6), want_api = en.has(DetectorKind::api_key),
             want_iban = en.has(DetectorKind::iban), want_entropy = en.has(DetectorKind::high_entropy);
  (void)want_digit;
  const unsigned char* p = reinterpret_cast<const unsigned char*>(text.data());
  while (i < n && !full) {
    unsigned char c = p[i];
    uint8_t cls = kClass[c];
    if (cls & kAlnum) {
      // Start of a word: find its end and shape, then try the detectors that may begin here.
      size_t wend = i + 1;
      uint8_t seen = cls;
      if constexpr (kFast) {
        wend = word_end(p, i, n, &seen);
      } else {
        while (wend < n && (kClass[p[wend]] & kAlnum)) seen |= kClass[p[wend++]];
      }
      const size_t L = wend - i;
      const unsigned char nx = wend < n ? p[wend] : 0;
      if constexpr (kFast) {
        // None of the tests below holds: the digit ones need a digit first, iban an upper case letter first, 4 bytes
        // and digits as the third and fourth (so a digit in the word), api_key and high_entropy a length of 20 or a
        // '_', '-' or '.' after, ipv6 a ':' after.
        const bool iban_shape = (cls & kUpper) && L >= 4 && (seen & kDigit);
        if (!(cls & kDigit) && !iban_shape && L < 20 && nx != '_' && nx != '-' && nx != '.' && nx != ':') {
          // (and the byte after it, a space or the like, is passed over as the loop would: neither a word's nor special)
          i = wend < n && !(kClass[nx] & kSpecial) ? wend + 1 : wend;
          continue;
        }
      }
      const bool all_digits = !(seen & (kUpper | kLower));
      size_t len, shape = 0;
      if ((cls & kDigit) && all_digits) {
        if (want_card && c >= '2' && c <= '6' && (L >= 13 || (L == 4 && (nx == ' ' || nx == '-')))) {
          if ((len = sc.card(i, &shape))) { emit(DetectorKind::card, i, len); continue; }
          size_t s = 0;
          if (sc.card_in_run(i, &s, &len)) { emit(DetectorKind::card, s, len); continue; }
          if (shape) { i += shape; continue; }  // card-shaped, Luhn fails: a near miss, not its parts
        }
        if (i < card_only_until) {
          i = wend;
          continue;
        }
        if (want_ssn && L == 3 && (nx == '-' || nx == ' ') && (len = sc.ssn(i))) { emit(DetectorKind::ssn, i, len); continue; }
        if (want_ipv4 && L <= 3 && nx == '.' && (len = sc.ipv4(i))) { emit(DetectorKind::ipv4, i, len); continue; }
        if (want_phone && L <= 15 && (nx == ' ' || nx == '-' || nx == '.') && (len = sc.phone(i))) {
          emit(DetectorKind::phone, i, len);
          continue;
        }
      }
      // Every key form has its prefix end in '_', '-' or '.' right after the first word, or is one long word.
      if (want_api && (cls & kApiFirst) && (nx == '_' || nx == '-' || nx == '.' || L >= 20) && (len = sc.api_key(i))) { emit(DetectorKind::api_key, i, len); continue; }
      if (want_iban && (cls & kUpper) && L >= 4) {
        if ((len = sc.iban(i, &shape))) { emit(DetectorKind::iban, i, len); continue; }
        if (shape) {  // IBAN-shaped, checksum fails: a near miss, its digit groups are not phone numbers
          card_only_until = i + shape;  // but a card in it is still a card ("DE33 5555555555554444 44": fuzzing)
          i = wend;
          continue;
        }
      }
      if (want_ipv6 && L <= 4 && nx == ':' && (cls & kHex) && (len = sc.ipv6(i))) {
        emit(DetectorKind::ipv6, i, len);
        continue;
      }
      if (want_entropy && ((L >= 24 && (seen & kAlnum) == kAlnum) || nx == '-' || nx == '_') &&
          (i == 0 || !is_tok(p[i - 1]))) {
        size_t run = 0;
        if (sc.high_entropy(i, &run)) { emit(DetectorKind::high_entropy, i, run); continue; }
      }
      // Skip the rest of the word; '-', '_', '.', '@' after it are looked at on their own.
      i = wend;
      continue;
    }
    if (!(cls & kSpecial)) {
      ++i;
      continue;
    }
    switch (c) {
      case '@':
        if (want_email) {
          size_t s, e;
          if (sc.email(i, floor, &s, &e)) {
            emit(DetectorKind::email, s, e - s);
            continue;
          }
        }
        break;
      case '+':
      case '(':
        if (en.has(DetectorKind::phone)) {
          if (size_t len = sc.phone(i)) {
            emit(DetectorKind::phone, i, len);
            continue;
          }
        }
        break;
      case '-':
        if (en.has(DetectorKind::private_key) && i + 11 <= n && text[i + 1] == '-') {
          if (size_t len = sc.private_key(i, &no_end_after)) {
            emit(DetectorKind::private_key, i, len);
            continue;
          }
        }
        break;
      case ':':
        if (en.has(DetectorKind::ipv6) && i + 1 < n && text[i + 1] == ':') {
          if (size_t len = sc.ipv6(i)) {
            emit(DetectorKind::ipv6, i, len);
            continue;
          }
        }
        break;
      default:
        break;
    }
    ++i;
  }
}

// scan_sensitive (kFast) or detail::scan_sensitive_plain: the opaque detector's pass merged with the others'.
template <bool kFast>
void scan_all(std::string_view text, DetectorSet en, std::vector<Finding>& out, size_t max_findings) {
  if (en.empty()) return;
  if (en.has(DetectorKind::opaque)) {
    if (max_findings && out.size() >= max_findings) return;
    std::vector<Finding> opaque;
    find_opaque(text, opaque);
    DetectorSet rest = en;
    rest.set(DetectorKind::opaque, false);
    if (opaque.empty()) return scan_words<kFast>(text, rest, out, max_findings);
    // Merged in offset order; of two that overlap the longer stays: runs of random-looking text inside a payload are
    // part of it, and a PEM private key (whose base64 body is a payload) stays a private key.
    const size_t first = out.size();
    scan_words<kFast>(text, rest, out, 0);
    std::vector<Finding> all(out.begin() + std::ptrdiff_t(first), out.end());
    out.resize(first);
    all.insert(all.end(), opaque.begin(), opaque.end());
    std::stable_sort(all.begin(), all.end(), [](const Finding& a, const Finding& b) { return a.offset < b.offset; });
    for (const Finding& f : all) {
      if (out.size() > first && out.back().offset + out.back().length > f.offset) {
        if (f.length > out.back().length) out.back() = f;
        continue;
      }
      out.push_back(f);
    }
    if (max_findings && out.size() > max_findings) out.resize(max_findings);
    return;
  }
  scan_words<kFast>(text, en, out, max_findings);
}

}  // namespace

void scan_sensitive(std::string_view text, DetectorSet en, std::vector<Finding>& out, size_t max_findings) {
  scan_all<true>(text, en, out, max_findings);
}

namespace detail {
void scan_sensitive_plain(std::string_view text, DetectorSet en, std::vector<Finding>& out, size_t max_findings) {
  scan_all<false>(text, en, out, max_findings);
}
}  // namespace detail

std::vector<Finding> scan_sensitive(std::string_view text, DetectorSet enabled) {
  std::vector<Finding> out;
  scan_sensitive(text, enabled, out, 0);
  return out;
}

}  // namespace lilac::router
