// Automata, character sets, the JSON string automaton and the regex subset, at the byte level.
#include <gtest/gtest.h>

#include <random>

#include "grammar/automaton.h"
#include "grammar/charset.h"
#include "grammar/json_string.h"
#include "grammar/regex.h"

namespace lilac::grammar {
namespace {

bool run(const std::vector<RuleState>& dfa, std::string_view s) {
  int32_t st = 0;
  for (unsigned char c : s) {
    st = step(dfa[size_t(st)], c);
    if (st < 0) return false;
  }
  return dfa[size_t(st)].accept;
}

std::vector<RuleState> pattern_dfa(std::string_view p, Encoding enc = Encoding::Utf8, bool search = true) {
  Nfa nfa;
  const int32_t end = nfa.add_state();
  nfa.set_accept(end);
  add_pattern(nfa, nfa.start(), p, enc, end, search);
  return determinize(nfa, 100000);
}

std::string utf8(uint32_t c) {
  std::string s;
  append_utf8(s, c);
  return s;
}

TEST(Automaton, DeterminizeLiteralsAndAlternation) {
  Nfa nfa;
  const int32_t end = nfa.add_state();
  nfa.set_accept(end);
  for (const char* w : {"cat", "car", "dog", "do"}) nfa.add_literal_to(nfa.start(), w, end);
  auto dfa = determinize(nfa, 100);
  for (const char* w : {"cat", "car", "dog", "do"}) EXPECT_TRUE(run(dfa, w)) << w;
  for (const char* w : {"", "ca", "cats", "d", "dot", "cad"}) EXPECT_FALSE(run(dfa, w)) << w;
  // Shared prefixes are merged: start, c, ca, d, do, one final (cat/car/dog all end in one state? no:
  // "do" is final and continues) -> at most 7 states.
  EXPECT_LE(dfa.size(), 7u);
}

TEST(Automaton, DeterminizeKeepsCallsPerCallee) {
  Nfa nfa;
  const int32_t a = nfa.add_state(), b = nfa.add_state(), end = nfa.add_state();
  nfa.set_accept(end);
  nfa.add_eps(nfa.start(), a);
  nfa.add_eps(nfa.start(), b);
  nfa.add_call(a, 7, end);
  nfa.add_call(b, 7, end);
  nfa.add_call(b, 9, end);
  auto dfa = determinize(nfa, 100);
  ASSERT_EQ(dfa[0].calls.size(), 2u);
  EXPECT_EQ(dfa[0].calls[0].rule, 7);
  EXPECT_EQ(dfa[0].calls[1].rule, 9);
  EXPECT_EQ(dfa[0].calls[0].to, dfa[0].calls[1].to);
}

TEST(Automaton, IntersectComplementTrim) {
  auto digits = pattern_dfa("^[0-9]+$");
  auto three = pattern_dfa("^...$");
  auto both = intersect(digits, three, 1000);
  EXPECT_TRUE(run(both, "123"));
  EXPECT_FALSE(run(both, "12"));
  EXPECT_FALSE(run(both, "12a"));
  auto not_digits = complement(digits);
  EXPECT_TRUE(run(not_digits, ""));
  EXPECT_TRUE(run(not_digits, "1a"));
  EXPECT_FALSE(run(not_digits, "42"));
  auto none = intersect(digits, pattern_dfa("^[a-z]+$"), 1000);
  EXPECT_EQ(none.size(), 1u);  // trimmed to the empty language
  EXPECT_FALSE(none[0].accept);
  EXPECT_TRUE(none[0].ranges.empty());
}

TEST(Automaton, SizeLimitThrows) {
  Nfa nfa(1000);
  const int32_t end = nfa.add_state();
  nfa.set_accept(end);
  EXPECT_THROW(add_pattern(nfa, nfa.start(), "^(a|b){0,1000}(a|b){0,1000}$", Encoding::Utf8, end), SizeError);
}

TEST(CharSet, Utf8EncodingIsExactOnBoundaries) {
  std::vector<uint32_t> probes = {0, 0x7F, 0x80, 0x7FF, 0x800, 0xFFF, 0x1000, 0xD7FF, 0xE000, 0xFFFF,
                                  0x10000, 0x3FFFF, 0x40000, 0xFFFFF, 0x100000, 0x10FFFF};
  std::mt19937 rng(7);
  for (int i = 0; i < 300; ++i) {
    uint32_t c = rng() % 0x110000;
    if (c >= 0xD800 && c <= 0xDFFF) continue;
    probes.push_back(c);
  }
  // Sets with boundaries in the middle of UTF-8 lead-byte ranges.
  const std::vector<std::pair<uint32_t, uint32_t>> sets = {{0x41, 0x5A},    {0x90, 0x7FF},      {0x7F0, 0x850},
                                                           {0xFF0, 0x10010}, {0x12345, 0x10FFFF}, {0x0, 0x10FFFF}};
  for (const auto& [lo, hi] : sets) {
    Nfa nfa;
    const int32_t end = nfa.add_state();
    nfa.set_accept(end);
    add_charset(nfa, nfa.start(), CharSet::range(lo, hi), Encoding::Utf8, end);
    auto dfa = determinize(nfa, 10000);
    for (uint32_t c : probes) {
      if (c >= 0xD800 && c <= 0xDFFF) continue;
      EXPECT_EQ(run(dfa, utf8(c)), c >= lo && c <= hi) << std::hex << c << " in [" << lo << "," << hi << "]";
    }
    EXPECT_FALSE(run(dfa, "\xED\xA0\x80"));  // a surrogate in UTF-8 is never a character
    EXPECT_FALSE(run(dfa, "\xC0\x80"));      // overlong
  }
}

TEST(CharSet, JsonStringEncodingEscapesWhatJsonRequires) {
  Nfa nfa;
  const int32_t end = nfa.add_state();
  nfa.set_accept(end);
  add_charset(nfa, nfa.start(), CharSet::any(), Encoding::JsonString, end);
  auto dfa = determinize(nfa, 10000);
  EXPECT_TRUE(run(dfa, "a"));
  EXPECT_TRUE(run(dfa, "\\\""));
  EXPECT_TRUE(run(dfa, "\\\\"));
  EXPECT_TRUE(run(dfa, "\\n"));
  EXPECT_TRUE(run(dfa, "\\u001f"));
  EXPECT_TRUE(run(dfa, "/"));
  EXPECT_TRUE(run(dfa, utf8(0x1F600)));
  EXPECT_FALSE(run(dfa, "\""));
  EXPECT_FALSE(run(dfa, "\\"));
  EXPECT_FALSE(run(dfa, "\n"));
  EXPECT_FALSE(run(dfa, "\\u0041"));  // canonical spelling only: 'A' is written raw
  EXPECT_EQ(json_escape_code_point(0x01), "\\u0001");
  EXPECT_EQ(json_escape_code_point('\t'), "\\t");
  CharSet neg = CharSet::range('a', 'z').negated();
  EXPECT_FALSE(neg.contains('q'));
  EXPECT_TRUE(neg.contains('A'));
  EXPECT_FALSE(neg.contains(0xD800));
  EXPECT_TRUE(neg.contains(0x10FFFF));
}

// Runs the String rule from the opening quote; returns the final state or -1.
int32_t string_run(int64_t lo, int64_t hi, std::string_view s) {
  int32_t st = jstr::kOpen;
  for (unsigned char c : s) {
    st = jstr::string_step(lo, hi, false, st, c);
    if (st < 0) return -1;
  }
  return st;
}

TEST(JsonString, AcceptsExactlyValidStringLiterals) {
  auto ok = [](std::string_view s) { return string_run(0, -1, s) == jstr::kClosed; };
  EXPECT_TRUE(ok("\"\""));
  EXPECT_TRUE(ok("\"plain ascii ~\x7f\""));
  EXPECT_TRUE(ok("\"caf\xC3\xA9 \xE4\xB8\x96 \xF0\x9F\x98\x80\""));
  EXPECT_TRUE(ok("\"\\\" \\\\ \\/ \\b \\f \\n \\r \\t \\u00e9 \\uFFFF\""));
  EXPECT_TRUE(ok("\"\\ud83d\\ude00\""));  // surrogate pair
  EXPECT_FALSE(ok("\"\\ud83d\""));          // lone high surrogate
  EXPECT_FALSE(ok("\"\\ude00\""));          // lone low surrogate
  EXPECT_FALSE(ok("\"\\ud83d\\u0041\""));   // high followed by a non-low
  EXPECT_FALSE(ok("\"\\x41\""));
  EXPECT_FALSE(ok("\"tab\tinside\""));
  EXPECT_FALSE(ok("\"\xC3\""));              // truncated
  EXPECT_FALSE(ok("\"\xC0\xAF\""));          // overlong
  EXPECT_FALSE(ok("\"\xED\xA0\x80\""));      // UTF-8 surrogate
  EXPECT_FALSE(ok("\"\xF4\x90\x80\x80\""));  // above U+10FFFF
  EXPECT_FALSE(ok("\"\x80\""));              // stray continuation
  EXPECT_FALSE(ok("\"abc"));
  EXPECT_EQ(string_run(0, -1, "\"a\"x"), -1);
}

TEST(JsonString, CountsCharactersNotBytes) {
  auto ok = [](int64_t lo, int64_t hi, std::string_view s) { return string_run(lo, hi, s) == jstr::kClosed; };
  EXPECT_TRUE(ok(2, 2, "\"\xC3\xA9\xF0\x9F\x98\x80\""));  // é + emoji = 2
  EXPECT_TRUE(ok(1, 1, "\"\\ud83d\\ude00\""));           // one character
  EXPECT_TRUE(ok(1, 1, "\"\\u00e9\""));
  EXPECT_TRUE(ok(3, 3, "\"\\n\\t\\\\\""));
  EXPECT_FALSE(ok(0, 2, "\"abc\""));
  EXPECT_FALSE(ok(4, -1, "\"abc\""));
  EXPECT_TRUE(ok(3, -1, "\"abcdef\""));
  // A character that cannot be finished within maxLength is refused at its first byte.
  EXPECT_EQ(string_run(0, 1, "\"a\xC3"), -1);
  EXPECT_EQ(string_run(0, 1, "\"a\\"), -1);
  EXPECT_NE(string_run(0, 2, "\"a\xC3"), -1);
}

TEST(Regex, SubsetSemantics) {
  struct Case {
    const char* pattern;
    const char* yes;
    const char* no;
  };
  const Case cases[] = {
      {"^abc$", "abc", "xabc"},
      {"abc", "xxabcxx", "ab"},                  // unanchored: anywhere
      {"^a|b$", "ax", "xa"},                     // anchors per top-level alternative
      {"^[A-Z]{2,3}-\\d+$", "AB-12", "A-1"},
      {"^[^0-9]*$", "hello", "h3llo"},
      {"^(?:ab|cd)*$", "abcdab", "abc"},
      {"^(?<year>\\d{4})$", "2024", "24"},
      {"^\\w+@\\w+\\.com$", "a_b@c.com", "a-b@c.com"},
      {"^\\s?x$", " x", "  x"},
      {"^.$", "\xC3\xA9", "\n"},                 // . is one character, never a newline
      {"^[\\u00e0-\\u00ff]$", "\xC3\xA9", "e"},
      {"^\\u{1F600}$", "\xF0\x9F\x98\x80", "x"},
      {"^a+?b*?$", "aab", "b"},                   // lazy quantifiers: same strings
      {"^[a\\-z]$", "-", "b"},
      {"^\\$\\.\\*\\(\\)$", "$.*()", "x"},
      {"^x[]?$", "x", "xa"},
      {"", "anything", nullptr},
  };
  for (const Case& c : cases) {
    auto dfa = pattern_dfa(c.pattern);
    EXPECT_TRUE(run(dfa, c.yes)) << c.pattern << " on " << c.yes;
    if (c.no) EXPECT_FALSE(run(dfa, c.no)) << c.pattern << " on " << c.no;
  }
}

TEST(Regex, JsonStringEncodingOfMatches) {
  auto dfa = pattern_dfa("^a\"b\\\\c\\nd$", Encoding::JsonString);
  EXPECT_TRUE(run(dfa, "a\\\"b\\\\c\\nd"));
  EXPECT_FALSE(run(dfa, "a\"b\\c\nd"));
}

TEST(Regex, UnsupportedFeaturesAreErrors) {
  for (const char* p : {"(?=a)", "(?!a)", "(?<=a)b", "(a)\\1", "\\bword", "\\p{L}", "a{2,1}", "(ab", "ab)", "[a-",
                        "x^", "a$b", "*a", "a{1001}", "\\cA", "\\q", "(?i)a", "[z-a]"}) {
    Nfa nfa;
    EXPECT_THROW(add_pattern(nfa, nfa.start(), p, Encoding::Utf8, nfa.add_state()), PatternError) << p;
  }
}

}  // namespace
}  // namespace lilac::grammar
