#include "grammar/regex.h"

#include <vector>

namespace lilac::grammar {

namespace {

constexpr int kMaxRepeat = 1000;
constexpr int kMaxDepth = 64;

struct Node {
  enum Kind { Set, Concat, Alt, Repeat, Bol, Eol } kind = Concat;
  CharSet set;
  std::vector<Node> kids;
  int min = 0, max = 0;  // Repeat; max -1 = unbounded
};

CharSet digit_set() { return CharSet::range('0', '9'); }
CharSet word_set() {
  CharSet s = CharSet::range('a', 'z');
  s.add('A', 'Z');
  s.add('0', '9');
  s.add('_', '_');
  return s;
}
CharSet space_set() {  // ECMAScript WhiteSpace + LineTerminator
  CharSet s;
  for (uint32_t c : {0x09u, 0x0Au, 0x0Bu, 0x0Cu, 0x0Du, 0x20u, 0xA0u, 0x1680u, 0x2028u, 0x2029u, 0x202Fu,
                     0x205Fu, 0x3000u, 0xFEFFu})
    s.add(c, c);
  s.add(0x2000, 0x200A);
  return s;
}
CharSet dot_set() {
  CharSet s;
  s.add('\n', '\n');
  s.add('\r', '\r');
  s.add(0x2028, 0x2029);
  return s.negated();
}

class Parser {
 public:
  explicit Parser(std::string_view p) : p_(p) {}

  Node parse() {
    Node n = parse_alt(0);
    if (i_ < p_.size()) fail(p_[i_] == ')' ? "unbalanced ')'" : "unexpected character");
    return n;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw PatternError("pattern \"" + std::string(p_) + "\": " + what + " at offset " + std::to_string(i_));
  }
  bool at_end() const { return i_ >= p_.size(); }
  char peek() const { return at_end() ? '\0' : p_[i_]; }

  uint32_t take_cp() {
    const unsigned char c = static_cast<unsigned char>(p_[i_]);
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || i_ + size_t(len) > p_.size()) fail("invalid UTF-8");
    uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
    for (int k = 1; k < len; ++k) {
      const unsigned char d = static_cast<unsigned char>(p_[i_ + size_t(k)]);
      if ((d & 0xC0) != 0x80) fail("invalid UTF-8");
      cp = (cp << 6) | (d & 0x3F);
    }
    i_ += size_t(len);
    return cp;
  }

  int hex_digit(char c) const {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
  uint32_t take_hex(int n) {
    uint32_t v = 0;
    for (int k = 0; k < n; ++k) {
      const int d = at_end() ? -1 : hex_digit(p_[i_]);
      if (d < 0) fail("expected a hex digit");
      v = v * 16 + uint32_t(d);
      ++i_;
    }
    return v;
  }
  uint32_t take_u_escape() {  // after "\u"
    if (peek() == '{') {
      ++i_;
      uint32_t v = 0;
      int n = 0;
      while (!at_end() && p_[i_] != '}') {
        const int d = hex_digit(p_[i_]);
        if (d < 0 || ++n > 6) fail("bad \\u{...} escape");
        v = v * 16 + uint32_t(d);
        ++i_;
      }
      if (at_end() || n == 0 || v > kMaxCodePoint) fail("bad \\u{...} escape");
      ++i_;
      return v;
    }
    uint32_t v = take_hex(4);
    if (v >= 0xD800 && v <= 0xDBFF && p_.substr(i_, 2) == "\\u") {
      const size_t save = i_;
      i_ += 2;
      const uint32_t lo = take_hex(4);
      if (lo >= 0xDC00 && lo <= 0xDFFF) return 0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00);
      i_ = save;
    }
    if (v >= 0xD800 && v <= 0xDFFF) fail("lone surrogate escape");
    return v;
  }

  // After a backslash. Returns true and sets `set` for class escapes (\d ...); else sets `cp`.
  bool take_escape(CharSet& set, uint32_t& cp, bool in_class) {
    if (at_end()) fail("pattern ends with a backslash");
    const char c = p_[i_++];
    switch (c) {
      case 'd': set = digit_set(); return true;
      case 'D': set = digit_set().negated(); return true;
      case 'w': set = word_set(); return true;
      case 'W': set = word_set().negated(); return true;
      case 's': set = space_set(); return true;
      case 'S': set = space_set().negated(); return true;
      case 't': cp = '\t'; return false;
      case 'n': cp = '\n'; return false;
      case 'r': cp = '\r'; return false;
      case 'f': cp = '\f'; return false;
      case 'v': cp = '\v'; return false;
      case '0':
        if (!at_end() && p_[i_] >= '0' && p_[i_] <= '9') fail("octal escapes are not supported");
        cp = 0;
        return false;
      case 'x': cp = take_hex(2); return false;
      case 'u': cp = take_u_escape(); return false;
      case 'b':
        if (in_class) {
          cp = '\b';
          return false;
        }
        fail("word boundaries (\\b) are not supported");
      case 'B': fail("word boundaries (\\B) are not supported");
      case 'p':
      case 'P': fail("Unicode property escapes (\\p{...}) are not supported");
      case 'c': fail("control escapes (\\cX) are not supported");
      case 'k': fail("named back-references are not supported");
      default: break;
    }
    if (c >= '1' && c <= '9') fail("back-references are not supported");
    if (std::string_view("^$\\.*+?()[]{}|/").find(c) != std::string_view::npos || (c == '-' && in_class)) {
      cp = uint32_t(c);
      return false;
    }
    --i_;
    fail(std::string("unsupported escape \\") + c);
  }

  Node parse_alt(int depth) {
    if (depth > kMaxDepth) fail("nesting too deep");
    Node first = parse_concat(depth);
    if (peek() != '|') return first;
    Node alt;
    alt.kind = Node::Alt;
    alt.kids.push_back(std::move(first));
    while (peek() == '|') {
      ++i_;
      alt.kids.push_back(parse_concat(depth));
    }
    return alt;
  }

  Node parse_concat(int depth) {
    Node cat;
    cat.kind = Node::Concat;
    while (!at_end() && peek() != '|' && peek() != ')') {
      Node atom = parse_atom(depth);
      if (atom.kind == Node::Bol || atom.kind == Node::Eol) {
        cat.kids.push_back(std::move(atom));
        continue;
      }
      cat.kids.push_back(parse_quantifiers(std::move(atom)));
    }
    return cat;
  }

  // At most one quantifier per atom (and its lazy '?'): ECMAScript refuses "a**" or "a{2}{3}" ("nothing to repeat"),
  // and each stacked one was a level of the node tree, which the builder and the anchor check recurse through (a
  // pattern of 200,000 '*' overflowed the stack).
  Node parse_quantifiers(Node atom) {
    int lo = 0, hi = 0;
    const char c = peek();
    if (c == '*') {
      lo = 0, hi = -1;
      ++i_;
    } else if (c == '+') {
      lo = 1, hi = -1;
      ++i_;
    } else if (c == '?') {
      lo = 0, hi = 1;
      ++i_;
    } else if (c == '{') {
      ++i_;
      lo = take_int();
      hi = lo;
      if (peek() == ',') {
        ++i_;
        hi = peek() == '}' ? -1 : take_int();
      }
      if (peek() != '}') fail("bad {n,m} quantifier");
      ++i_;
      if (hi >= 0 && hi < lo) fail("quantifier {n,m} with m < n");
    } else {
      return atom;
    }
    if (peek() == '?') ++i_;  // lazy: same language
    if (const char q = peek(); q == '*' || q == '+' || q == '?' || q == '{')
      fail("nothing to repeat (a quantifier after a quantifier)");
    Node rep;
    rep.kind = Node::Repeat;
    rep.min = lo;
    rep.max = hi;
    rep.kids.push_back(std::move(atom));
    return rep;
  }

  int take_int() {
    if (at_end() || p_[i_] < '0' || p_[i_] > '9') fail("expected a number in a quantifier");
    long v = 0;
    while (!at_end() && p_[i_] >= '0' && p_[i_] <= '9') {
      v = v * 10 + (p_[i_++] - '0');
      if (v > kMaxRepeat) fail("repetition count above " + std::to_string(kMaxRepeat));
    }
    return int(v);
  }

  Node parse_atom(int depth) {
    Node n;
    n.kind = Node::Set;
    const char c = peek();
    switch (c) {
      case '^': ++i_; n.kind = Node::Bol; return n;
      case '$': ++i_; n.kind = Node::Eol; return n;
      case '.': ++i_; n.set = dot_set(); return n;
      case '[': ++i_; n.set = parse_class(); return n;
      case '(': {
        ++i_;
        if (peek() == '?') {
          ++i_;
          if (peek() == ':') {
            ++i_;
          } else if (peek() == '<' && i_ + 1 < p_.size() && p_[i_ + 1] != '=' && p_[i_ + 1] != '!') {
            while (!at_end() && p_[i_] != '>') ++i_;
            if (at_end()) fail("unterminated group name");
            ++i_;
          } else {
            fail("lookaround and group flags are not supported");
          }
        }
        Node inner = parse_alt(depth + 1);
        if (peek() != ')') fail("missing ')'");
        ++i_;
        return inner;
      }
      case '*': case '+': case '?': fail("quantifier without an operand");
      case '{': fail("a literal '{' must be escaped");
      case '}': fail("a literal '}' must be escaped");
      case ']': fail("a literal ']' must be escaped");
      case '\\': {
        ++i_;
        uint32_t cp = 0;
        if (!take_escape(n.set, cp, false)) n.set = CharSet::single(cp);
        return n;
      }
      default: n.set = CharSet::single(take_cp()); return n;
    }
  }

  CharSet parse_class() {  // after '['
    bool negate = false;
    if (peek() == '^') {
      negate = true;
      ++i_;
    }
    // The class's ranges, made one set at the end: adding them one by one sorted the set each time, quadratic in
    // a class of thousands of code points (20,000 took 3 s).
    std::vector<std::pair<uint32_t, uint32_t>> ranges;
    while (!at_end() && peek() != ']') {
      CharSet cls;
      uint32_t lo = 0;
      const bool is_cls = take_class_atom(cls, lo);
      if (!is_cls && peek() == '-' && i_ + 1 < p_.size() && p_[i_ + 1] != ']') {
        ++i_;
        CharSet cls2;
        uint32_t hi = 0;
        if (take_class_atom(cls2, hi)) fail("a class escape cannot end a range");
        if (hi < lo) fail("range out of order in a character class");
        ranges.push_back({lo, hi});
        continue;
      }
      if (is_cls) {
        if (peek() == '-' && i_ + 1 < p_.size() && p_[i_ + 1] != ']') fail("a class escape cannot start a range");
        ranges.insert(ranges.end(), cls.ranges().begin(), cls.ranges().end());
      } else {
        ranges.push_back({lo, lo});
      }
    }
    if (at_end()) fail("unterminated character class");
    ++i_;
    const CharSet set = CharSet::of(std::move(ranges));
    // Surrogates are never characters.
    CharSet clean = set.negated().negated();
    return negate ? clean.negated() : clean;
  }

  bool take_class_atom(CharSet& cls, uint32_t& cp) {
    if (peek() == '\\') {
      ++i_;
      return take_escape(cls, cp, true);
    }
    cp = take_cp();
    return false;
  }

  std::string_view p_;
  size_t i_ = 0;
};

class Builder {
 public:
  Builder(Nfa& nfa, Encoding enc) : nfa_(nfa), enc_(enc) {}

  int32_t build(const Node& n, int32_t from) {
    switch (n.kind) {
      case Node::Set: {
        const int32_t to = nfa_.add_state();
        add_charset(nfa_, from, n.set, enc_, to);
        return to;
      }
      case Node::Concat: {
        int32_t cur = from;
        for (const Node& k : n.kids) cur = build(k, cur);
        return cur;
      }
      case Node::Alt: {
        const int32_t to = nfa_.add_state();
        for (const Node& k : n.kids) {
          const int32_t s = nfa_.add_state();
          nfa_.add_eps(from, s);
          nfa_.add_eps(build(k, s), to);
        }
        return to;
      }
      case Node::Repeat: {
        // Each repetition is a copy of the operand. After the first, the size of the rest is known: when they
        // cannot fit the NFA's bounds, stop now rather than after building hundreds of copies of a large class.
        const size_t copies = size_t(n.max < 0 ? n.min + 1 : n.max);
        size_t made = 0;
        auto copy = [&](int32_t at) {
          const size_t states = nfa_.size(), edges = nfa_.edges();
          const int32_t end = build(n.kids[0], at);
          if (made++ == 0 && copies > 1) {
            const size_t more = copies - 1;
            if ((nfa_.size() - states) * more > nfa_.max_states() - nfa_.size() ||
                (nfa_.edges() - edges) * more > nfa_.max_edges() - nfa_.edges())
              throw SizeError("a repetition {" + std::to_string(copies) + "} exceeds the automaton's " +
                              std::to_string(nfa_.max_states()) + " states or " + std::to_string(nfa_.max_edges()) +
                              " edges");
          }
          return end;
        };
        int32_t cur = from;
        for (int k = 0; k < n.min; ++k) cur = copy(cur);
        if (n.max < 0) {
          const int32_t loop = nfa_.add_state();
          nfa_.add_eps(cur, loop);
          nfa_.add_eps(copy(loop), loop);
          return loop;
        }
        const int32_t to = nfa_.add_state();
        for (int k = n.min; k < n.max; ++k) {
          nfa_.add_eps(cur, to);
          cur = copy(cur);
        }
        nfa_.add_eps(cur, to);
        return to;
      }
      case Node::Bol:
      case Node::Eol: break;
    }
    throw PatternError("internal: anchor in pattern body");
  }

  int32_t any_text(int32_t from) {
    const int32_t loop = nfa_.add_state();
    nfa_.add_eps(from, loop);
    add_charset(nfa_, loop, CharSet::any(), enc_, loop);
    return loop;
  }

 private:
  Nfa& nfa_;
  Encoding enc_;
};

// Anchors may only open / close a top-level alternative.
void check_anchors(const Node& n, bool top, std::string_view pattern) {
  auto bad = [&] {
    throw PatternError("pattern \"" + std::string(pattern) +
                       "\": ^ and $ are supported only at the start and end of the pattern (or of a "
                       "top-level alternative)");
  };
  if (n.kind == Node::Bol || n.kind == Node::Eol) bad();
  for (size_t k = 0; k < n.kids.size(); ++k) {
    const Node& c = n.kids[k];
    if (top && n.kind == Node::Concat && c.kind == Node::Bol && k == 0) continue;
    if (top && n.kind == Node::Concat && c.kind == Node::Eol && k + 1 == n.kids.size()) continue;
    check_anchors(c, false, pattern);
  }
}

}  // namespace

void add_pattern(Nfa& nfa, int32_t from, std::string_view pattern, Encoding enc, int32_t to, bool search) {
  Node root = Parser(pattern).parse();
  std::vector<Node> alts;
  if (root.kind == Node::Alt)
    alts = std::move(root.kids);
  else
    alts.push_back(std::move(root));
  Builder b(nfa, enc);
  for (Node& alt : alts) {
    if (alt.kind != Node::Concat) {
      Node cat;
      cat.kind = Node::Concat;
      cat.kids.push_back(std::move(alt));
      alt = std::move(cat);
    }
    check_anchors(alt, true, pattern);
    bool bol = !alt.kids.empty() && alt.kids.front().kind == Node::Bol;
    if (bol) alt.kids.erase(alt.kids.begin());
    bool eol = !alt.kids.empty() && alt.kids.back().kind == Node::Eol;
    if (eol) alt.kids.pop_back();
    int32_t cur = nfa.add_state();
    nfa.add_eps(from, cur);
    if (search && !bol) cur = b.any_text(cur);
    cur = b.build(alt, cur);
    if (search && !eol) cur = b.any_text(cur);
    nfa.add_eps(cur, to);
  }
}

}  // namespace lilac::grammar
