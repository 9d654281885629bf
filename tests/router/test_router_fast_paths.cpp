// The routing decision's fast paths (bench/BENCHMARKS.md "Hybrid router": buffers kept per thread, the seam windows read
// in place, long runs found without reading every byte, the detectors' word loop) against the straightforward
// definitions they replace (router_reference.h), on many generated texts and bodies full of what the scan looks for:
// digit separators, base64 (text and binary, short and past the opaque threshold, with line breaks and padding),
// Unicode look-alikes, invisible characters and digits of other scripts, escapes, whitespace runs, e-mails, cards,
// phones, IBANs, keys. A fast path that decides differently fails here, whichever way it errs.
#include <gtest/gtest.h>

#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "router/detectors.h"
#include "router/normalize.h"
#include "router/route_policy.h"
#include "router/router.h"
#include "router/router_reference.h"
#include "router/scan.h"
#include "text/json_dump.h"

using namespace lilac::router;
using json = nlohmann::ordered_json;

namespace {

class Gen {
 public:
  explicit Gen(uint64_t seed) : rng_(seed) {}
  size_t below(size_t n) { return n ? size_t(rng_() % n) : 0; }
  bool one_in(size_t n) { return below(n) == 0; }
  template <size_t N>
  const char* pick(const char* const (&a)[N]) { return a[below(N)]; }
  const char* pick(std::initializer_list<const char*> a) { return a.begin()[below(a.size())]; }

  std::string digits(size_t n, bool first_nonzero = false) {
    std::string s;
    for (size_t i = 0; i < n; ++i) s.push_back(char('0' + (i == 0 && first_nonzero ? 1 + below(9) : below(10))));
    return s;
  }
  // A Luhn-valid card number of `len` digits beginning with 2-6.
  std::string card(size_t len) {
    std::string s = std::to_string(2 + below(5)) + digits(len - 2);
    for (int check = 0; check < 10; ++check)
      if (lilac::router::luhn_valid(s + char('0' + check))) return s + char('0' + check);
    return s + "0";
  }
  std::string separators() {
    static const char* const kSeps[] = {" ", "-", ".", "_", "/", "\\", "|", ",", "~", "*", "  ", " - ", "--", "...",
                                        "_ _", "    ", ":", "\t", "\u00a0", "\u2013"};
    return one_in(4) ? "" : pick(kSeps);
  }
  // Groups of digits joined by separators, as cards, phones and ids are written (and mistyped).
  std::string number() {
    std::string s;
    const size_t groups = 1 + below(6);
    for (size_t g = 0; g < groups; ++g) {
      if (g) s += separators();
      s += digits(1 + below(6));
    }
    return s;
  }
  // `bytes` of text or of random bytes in base64 (or base64url), padded or not, with a line break every `line`
  // characters (none for 0).
  std::string base64(size_t bytes, bool text, bool url, size_t line) {
    static const char* kStd = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    static const char* kUrl = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    std::string raw;
    while (raw.size() < bytes) raw += text ? std::string(pick(kWords)) + " " : std::string(1, char(below(256)));
    raw.resize(bytes);
    const char* al = url ? kUrl : kStd;
    std::string enc;
    for (size_t i = 0; i < raw.size(); i += 3) {
      const size_t have = std::min<size_t>(3, raw.size() - i);
      uint32_t v = 0;
      for (size_t k = 0; k < 3; ++k) v = (v << 8) | (k < have ? uint32_t(uint8_t(raw[i + k])) : 0u);
      for (size_t k = 0; k < 4; ++k) enc += k <= have ? al[(v >> (18 - 6 * k)) & 63] : '=';
    }
    if (one_in(3))
      while (!enc.empty() && enc.back() == '=') enc.pop_back();
    if (!line) return enc;
    std::string out;
    for (size_t i = 0; i < enc.size(); i += line) out += enc.substr(i, line) + (i + line < enc.size() ? (one_in(3) ? "\r\n" : "\n") : "");
    return out;
  }
  std::string unicode_piece() {
    static const char* const kU[] = {
        "\uff14\uff11\uff11\uff11",  // fullwidth 4111
        "\u0664\u0661\u0661\u0661",  // Arabic-Indic 4111
        "\u0430\u0435\u043e\u0440\u0441", "\u03bf\u03b1", "\u200b", "\u00ad", "e\u0301", "\u00a0", "\u3000", "\u2003",
        "\u3002", "\uff20", "\ufe6b", "\xff", "\xc3", "\xe2\x82", "\U0001F600", "\u00e9t\u00e9", "\u2028", "\u0085",
        "\uff05\uff14\uff10", "\u202e", "\u2060", "\u0007", "\x7f",
    };
    return pick(kU);
  }
  std::string secretish() {
    static const char* const kS[] = {
        "john.doe@example.com", "jane [at] example (dot) org", "a%40b.com", "x&#64;y.io", "q\\u0040w.de", "me at host dot com",
        "&commat;", "%2540", "&#x40;", "\\x40", "\\u{40}", "\\\\u0040", "4111 1111 1111 1111", "5555555555554444",
        "4111_1111_1111_1111", "4 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1", "555.123.4567", "+44 20 7946 0958", "(555) 123-4567",
        "020 7946 0958", "123-45-6789", "DE89 3704 0044 0532 0130 00", "GB82WEST12345698765432",
        "DE33 5555555555554444 44", "192.168.1.20", "2001:db8::1", "::ffff:192.0.2.1", "AKIAIOSFODNN7EXAMPLE",
        "ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789", "sk-proj-4fJ9aQ2LmZx8TtR1vB6nW3yK",
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.c2lnbmF0dXJl", "xoxb-1234567890-abcdefghij",
        "-----BEGIN RSA PRIVATE KEY-----\nMIIBOgIBAAJBAKj34GkxFhD9\n-----END RSA PRIVATE KEY-----",
        "-----BEGIN PUBLIC KEY-----", "aZ3kQ9mP2xW7vL4nR8tY1uE6", "project falcon", "Internal Only", "EMP-123456",
    };
    return pick(kS);
  }
  // In mild mode, no piece is a secret by itself (whitespace, words, numbers, Unicode, base64 of text): most texts are
  // clean, and every pass runs over all of them.
  bool mild = false;
  std::string piece() {
    if (mild) {
      static const int kMild[] = {0, 1, 2, 3, 5, 7, 11};
      const int k = kMild[below(7)];
      if (k == 11) return base64(8 + below(60), true, one_in(3), 0);
      if (k == 3) return digits(1 + below(4)) + pick({".", ",", " ", "-", "_", ":"}) + digits(1 + below(4));
      return piece_of(k);
    }
    return piece_of(int(below(12)));
  }
  std::string piece_of(int kind) {
    switch (kind) {
      case 0: case 1: case 2: return pick(kWords);
      case 3: return number();
      case 4: return card(13 + below(7));
      case 5: return unicode_piece();
      case 6: return secretish();
      case 7: {
        static const char* const kWs[] = {"\n", "\t", "  ", "\r\n", " \n\t ", "\n\n\n", "\u00a0\u00a0", " \u3000 "};
        return pick(kWs);
      }
      case 8: {
        const bool big = one_in(4);
        return base64(big ? 700 + below(900) : 8 + below(60), one_in(2), one_in(3), one_in(2) ? 64 + 12 * below(2) : 0);
      }
      case 9: {
        std::string s;
        for (size_t i = 0, n = 1 + below(30); i < n; ++i) s.push_back(char(32 + below(95)));
        return s;
      }
      case 10: {
        std::string s;
        for (size_t i = 0, n = 1 + below(40); i < n; ++i) {
          static const char* kTok = "abcdefABCDEF0123456789xyzXYZ_-";
          s.push_back(kTok[below(30)]);
        }
        return s;
      }
      default: return digits(1 + below(24));
    }
  }
  std::string text(size_t max_pieces) {
    std::string s;
    for (size_t i = 0, n = 1 + below(max_pieces); i < n; ++i) {
      if (i) s += one_in(3) ? separators() : " ";
      s += piece();
    }
    if (one_in(20)) s = std::string(below(3), ' ') + s + std::string(below(3), '\n');
    return s;
  }

  static constexpr const char* kWords[] = {
      "The",   "quick", "brown", "fox",  "jumps", "over", "the", "lazy", "dog.", "Meeting", "at", "10:30,", "room", "4.2;",
      "$1,250.00", "2024-01-15", "(v1.2.3)", "getUserAccountBalance2024ByRegion", "std::vector<int>", "x = a[i] + b[j];",
      "https://example.org/docs/page", "release 10.0.19041.1", "3f786850e387550fdab836ed7e6dc881de23001b",
      "123e4567-e89b-12d3-a456-426614174000", "@mention", "C++20", "--", "user_name", "dot", "at", "[at]", "(dot)",
      "a&b;", "50%", "\\n", "<at>", "{dot}", "aGVsbG8gd29ybGQgaGVsbG8=", "SGVsbG8sIFdvcmxkIQ",
  };

 private:
  std::mt19937_64 rng_;
};

TEST(RouterFastPaths, TextVariantsAgreeWithTheirDefinition) {
  Gen g(1);
  TextVariants kept;  // one object for all texts: nothing of one text may stay in the next one's variants
  size_t with[5] = {0, 0, 0, 0, 0};
  for (int iter = 0; iter < 6000; ++iter) {
    const std::string t = g.text(iter % 10 == 0 ? 200 : 25);
    const size_t budget = g.one_in(4) ? g.below(t.size() * 3 + 2) : size_t(1) << 26;
    const std::vector<std::string> want = router_reference::text_variants(t, budget);
    ASSERT_EQ(text_variants(t, budget), want) << "text: " << t << "\nbudget " << budget;
    text_variants(t, budget, kept);
    ASSERT_EQ(std::vector<std::string>(kept.begin(), kept.end()), want) << "text: " << t << "\nbudget " << budget;
    ++with[std::min<size_t>(want.size(), 4)];
    if (g.one_in(50)) kept.release_large();
    EXPECT_EQ(decode_base64_runs(t), router_reference::decode_runs(t, 1)) << t;
  }
  // The texts reached every number of variants (each kind is in them: canonical, dashed, joined, decoded).
  for (size_t k = 0; k < 4; ++k) EXPECT_GT(with[k], 20u) << k << " variants";
}

TEST(RouterFastPaths, OpaqueAndDetectorLoopsAgreeWithTheirDefinitions) {
  Gen g(2);
  const DetectorSet sets[] = {DetectorSet::all(), DetectorSet{DetectorSet::all().bits & ~(1u << int(DetectorKind::high_entropy))},
                              DetectorSet{1u << int(DetectorKind::opaque)}, DetectorSet{1u << int(DetectorKind::card)}};
  size_t opaque_found = 0, found = 0;
  for (int iter = 0; iter < 6000; ++iter) {
    std::string t = g.text(iter % 10 == 0 ? 120 : 30);
    if (g.one_in(6)) t += " " + g.base64(768 + g.below(400), g.one_in(3), g.one_in(2), g.one_in(2) ? 76 : 0) + " ";
    std::vector<Finding> want, got;
    router_reference::find_opaque(t, want);
    find_opaque(t, got);
    ASSERT_EQ(got, want) << t;
    opaque_found += !want.empty();
    DetectorSet en = sets[iter % 4];
    if (g.one_in(5)) en = DetectorSet{uint32_t(g.below(1u << kDetectorKindCount))};
    for (size_t max : {size_t(0), size_t(1), size_t(2)}) {
      want.clear();
      got.clear();
      router_reference::scan_sensitive(t, en, want, max);
      scan_sensitive(t, en, got, max);
      ASSERT_EQ(got, want) << "text: " << t << "\ndetectors " << en.bits << ", at most " << max;
      found += !want.empty();
    }
  }
  EXPECT_GT(opaque_found, 100u);
  EXPECT_GT(found, 3000u);
}

TEST(RouterFastPaths, CollapseWhitespaceAgreesWithItsDefinition) {
  Gen g(3);
  std::string kept;
  for (int iter = 0; iter < 4000; ++iter) {
    const std::string t = g.text(40);
    const std::string want = router_reference::collapse_whitespace(t);
    ASSERT_EQ(collapse_whitespace(t), want) << t;
    collapse_whitespace(t, kept);
    ASSERT_EQ(kept, want) << t;
  }
}

TEST(RouterFastPaths, KeywordSearchAgreesWithFind) {
  Gen g(6);
  for (int iter = 0; iter < 4000; ++iter) {
    const std::string hay = g.text(g.one_in(3) ? 60 : 8);
    std::string needle;
    if (g.one_in(2) && !hay.empty()) {  // a piece of the text itself, or that piece with a byte changed
      const size_t at = g.below(hay.size()), len = 1 + g.below(std::min<size_t>(hay.size() - at, 40));
      needle = hay.substr(at, len);
      if (g.one_in(3)) needle[g.below(needle.size())] ^= char(1 + g.below(3));
    } else {
      needle = g.one_in(2) ? std::string(g.piece()).substr(0, 1 + g.below(20)) : g.pick({"ab", "project falcon", "  ", "00"});
    }
    ASSERT_EQ(detail::contains(hay, needle), hay.find(needle) != std::string::npos) << hay << "\n" << needle;
  }
}

// A request body of chat messages, content parts, tool calls with JSON arguments, ids, numbers and metadata.
json body(Gen& g) {
  json msgs = json::array();
  for (size_t m = 0, n = 1 + g.below(4); m < n; ++m) {
    json msg = {{"role", m == 0 && g.one_in(2) ? "system" : (m % 2 ? "assistant" : "user")}};
    if (g.one_in(4)) {
      json parts = json::array();
      for (size_t k = 0, np = 1 + g.below(3); k < np; ++k) {
        json part = {{"type", "text"}, {"text", g.text(12)}};
        if (g.one_in(4)) part["cache_control"] = {{"type", "ephemeral"}, {"ttl", "5m"}};
        parts.push_back(part);
      }
      msg["content"] = parts;
    } else {
      msg["content"] = g.text(g.one_in(8) ? 300 : 20);
    }
    if (g.one_in(5)) {
      json args = {{"query", g.text(6)}, {"id", g.piece()}, {"n", int(g.below(100000))}};
      msg["tool_calls"] = json::array({{{"id", "call_" + g.piece()},
                                        {"type", "function"},
                                        {"function", {{"name", "search"}, {"arguments", lilac::dump_json(args)}}}}});
    }
    msgs.push_back(msg);
  }
  json b = {{"model", "lilac"}, {"messages", msgs}};
  if (g.one_in(4)) b["metadata"] = {{"user", g.piece()}, {"id", g.piece()}};
  if (g.one_in(4)) b["temperature"] = double(g.below(100)) / 50;
  return b;
}

TEST(RouterFastPaths, TheScanOfABodyAgreesWithItsDefinition) {
  const char* const policies[] = {
      "{}",
      R"({"rules": [{"name": "projects", "keywords": ["project falcon", "internal only", "do not share"]},
                    {"name": "ids", "regex": ["\\bEMP-[0-9]{6}\\b"], "case_insensitive": false}]})",
      R"({"detectors": {"high_entropy": false, "opaque": false},
          "rules": [{"name": "k", "keywords": ["Falcon"], "case_insensitive": false}]})",
      R"({"detectors": {"email": false, "phone": false, "card": false}})",
  };
  Gen g(4);
  size_t sensitive = 0, clean = 0, unscannable = 0;
  for (const char* pj : policies) {
    RoutePolicy policy = parse_route_policy(nlohmann::json::parse(pj));
    Router r(parse_route_policy(nlohmann::json::parse(pj)), RouterConfig{"lilac", "gpt-up"});
    const TextCheck ref_check = [&](std::string_view t, bool is_id, std::vector<std::string>* m) {
      return router_reference::text_sensitive(policy, t, is_id, m);
    };
    for (int iter = 0; iter < 600; ++iter) {
      g.mild = iter % 2;
      const json b = body(g);
      const ScanOutcome want = router_reference::scan_body(b, ref_check, ScanOptions{});
      const ScanOutcome got = r.scan(b);
      ASSERT_EQ(got.sensitive, want.sensitive) << lilac::dump_json(b);
      ASSERT_EQ(got.unscannable, want.unscannable) << lilac::dump_json(b);
      ASSERT_EQ(got.matched, want.matched) << lilac::dump_json(b);
      ASSERT_EQ(got.text_bytes, want.text_bytes) << lilac::dump_json(b);
      (want.sensitive ? sensitive : clean)++;
      // With a small budget the texts, variants and seam windows are cut and charged in the same order.
      ScanOptions small;
      small.max_bytes = 1 + g.below(4000);
      const ScanOutcome want_s = router_reference::scan_body(b, ref_check, small);
      const ScanOutcome got_s = scan_body(b, ref_check, small);
      ASSERT_EQ(got_s.sensitive, want_s.sensitive) << lilac::dump_json(b) << "\nmax_bytes " << small.max_bytes;
      ASSERT_EQ(got_s.unscannable, want_s.unscannable) << lilac::dump_json(b) << "\nmax_bytes " << small.max_bytes;
      ASSERT_EQ(got_s.matched, want_s.matched) << lilac::dump_json(b) << "\nmax_bytes " << small.max_bytes;
      ASSERT_EQ(got_s.text_bytes, want_s.text_bytes) << lilac::dump_json(b) << "\nmax_bytes " << small.max_bytes;
      unscannable += want_s.unscannable;
    }
  }
  EXPECT_GT(sensitive, 200u);
  EXPECT_GT(clean, 400u);
  EXPECT_GT(unscannable, 100u);
}

// The texts each check is handed, in order: the joined values around the seams are the same text, whether copied out
// of whole joined strings or out of the values in place.
TEST(RouterFastPaths, TheScanHandsTheSameTextsToTheCheckInTheSameOrder) {
  Gen g(5);
  for (int iter = 0; iter < 600; ++iter) {
    g.mild = iter % 2;
    const json b = body(g);
    std::vector<std::string> want, got;
    const size_t hit_at = g.below(40);  // the check answers "sensitive" at its hit_at-th call (0: never)
    auto recorder = [&](std::vector<std::string>& seen) {
      return [&seen, hit_at](std::string_view t, bool is_id, std::vector<std::string>* m) {
        seen.push_back(std::string(is_id ? "id:" : "") + std::string(t));
        if (hit_at && seen.size() == hit_at) {
          m->push_back("hit");
          return true;
        }
        return false;
      };
    };
    router_reference::scan_body(b, recorder(want), ScanOptions{});
    scan_body(b, recorder(got), ScanOptions{});
    ASSERT_EQ(got, want) << lilac::dump_json(b);
  }
}

}  // namespace
