// lilac's Jinja subset: lexer (jinja2's whitespace rules), parser (jinja2's grammar) and a tree-walking
// interpreter with Python value semantics (text/jinja_value.h).
#include "text/jinja.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <optional>
#include <functional>
#include <unordered_map>
#include <unordered_set>

#include <utf8proc.h>

#include "core/error.h"
#include "text/jinja_value.h"

namespace lilac::jinja {

namespace {

// ------------------------------------------------------------------------------------------------
// Tokens

enum class Tok { Data, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, Eof };

struct Token {
  Tok t;
  std::string v;  // Data text, Name, String value, Op text
  int64_t iv = 0;
  double fv = 0;
  size_t pos = 0;
};

// ------------------------------------------------------------------------------------------------
// AST

struct Expr;
using ExprP = std::unique_ptr<Expr>;

struct Expr {
  enum K { Lit, Name, ListLit, TupleLit, DictLit, Attr, Item, Slice, Call, Filter, Test, Not, Neg, Pos, Bin, And, Or,
           Cond, Concat, Cmp };
  K k;
  size_t pos = 0;
  Value lit;
  std::string name;  // Name / Attr / Filter / Test name, Bin operator
  ExprP a, b, c;     // target (a); Item index (b); Cond: a = value, b = condition, c = else
  std::vector<ExprP> args;  // list items, dict keys and values interleaved, call args, Concat parts, Cmp operands,
                            // Slice start/stop/step (may be null)
  std::vector<std::pair<std::string, ExprP>> kwargs;
  std::vector<std::string> ops;  // Cmp operators
  bool negated = false;          // Test
};

struct Stmt;
using StmtP = std::unique_ptr<Stmt>;
using Body = std::vector<StmtP>;

struct Stmt {
  enum K { Text, Output, If, For, Set, SetBlock, Macro, Break, Continue, FilterBlock, Scope };
  K k;
  size_t pos = 0;
  std::string text;
  ExprP expr;  // Output value, Set value, For iterable
  std::vector<std::pair<ExprP, Body>> branches;
  Body body, else_body;
  std::vector<std::string> targets;  // For / Set names
  std::string attr;                  // Set: targets[0].attr = ...
  ExprP cond;                        // For filter
  std::string name;                  // Macro name
  std::vector<std::pair<std::string, ExprP>> params;
  std::vector<ExprP> filters;  // Filter exprs with a == nullptr
};

const std::unordered_set<std::string>& known_filters() {
  static const std::unordered_set<std::string> s = {
      "length", "count", "trim", "tojson", "items", "default", "d", "join", "list", "first", "last",
      "string", "safe", "upper", "lower", "int", "float", "abs", "reverse", "unique", "map", "select",
      "reject", "selectattr", "rejectattr", "capitalize", "title", "replace", "round", "sort", "min",
      "max", "sum", "indent", "escape", "e", "format", "attr", "wordcount", "center", "dictsort"};
  return s;
}

const std::unordered_set<std::string>& known_tests() {
  static const std::unordered_set<std::string> s = {
      "defined", "undefined", "none", "string", "mapping", "iterable", "sequence", "number", "integer",
      "float", "boolean", "true", "false", "in", "eq", "equalto", "==", "ne", "!=", "lt", "lessthan", "<",
      "le", "<=", "gt", "greaterthan", ">", "ge", ">=", "odd", "even", "divisibleby", "lower", "upper",
      "sameas", "callable", "escaped"};
  return s;
}

}  // namespace

struct Template::Impl {
  std::string origin;
  Options options;
  std::string source;               // newline-normalised
  std::vector<size_t> line_starts;  // offsets of line starts in `source`
  Body body;

  std::string where(size_t pos) const {
    size_t line = std::upper_bound(line_starts.begin(), line_starts.end(), pos) - line_starts.begin();
    if (line == 0) line = 1;
    size_t col = pos - line_starts[line - 1] + 1;
    return origin + ":" + std::to_string(line) + ":" + std::to_string(col);
  }
  [[noreturn]] void fail(size_t pos, const std::string& msg) const { throw Error(where(pos) + ": " + msg); }
};

namespace {

using Impl = Template::Impl;

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || (c >= '0' && c <= '9'); }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

// ------------------------------------------------------------------------------------------------
// Lexer: follows jinja2's lexer (OptionalLStrip rules, trim_blocks, `-`/`+` markers, raw blocks).

class Lexer {
 public:
  explicit Lexer(const Impl& impl) : impl_(impl), src_(impl.source), n_(src_.size()) {}

  std::vector<Token> run() {
    size_t pos = 0;
    bool line_starting = true;
    while (pos < n_) {
      size_t t = find_tag(pos);
      if (t == std::string::npos) {
        data(src_.substr(pos), pos);
        break;
      }
      std::string text = src_.substr(pos, t - pos);
      char kind = src_[t + 1];
      size_t p = t + 2;
      char sign = 0;
      if (p < n_ && (src_[p] == '-' || src_[p] == '+')) sign = src_[p++];
      size_t raw_end = 0;
      if (kind == '%') raw_end = match_raw_begin(p);
      lstrip(text, sign, kind == '{', line_starting);
      data(std::move(text), pos);
      if (raw_end) {
        pos = lex_raw(raw_end, t, line_starting);
        continue;
      }
      if (kind == '#') {
        size_t q = src_.find("#}", p);
        if (q == std::string::npos) impl_.fail(t, "missing end of comment tag");
        size_t end = q + 2;
        if (q > p && src_[q - 1] == '-') {
          while (end < n_ && is_ws(src_[end])) ++end;
        } else if (!(q > p && src_[q - 1] == '+')) {
          if (impl_.options.trim_blocks && end < n_ && src_[end] == '\n') ++end;
        }
        line_starting = src_[end - 1] == '\n';
        pos = end;
        continue;
      }
      pos = lex_tag(kind == '%', t, p);
      line_starting = src_[pos - 1] == '\n';
    }
    toks_.push_back({Tok::Eof, "", 0, 0, n_});
    return std::move(toks_);
  }

 private:
  const Impl& impl_;
  const std::string& src_;
  size_t n_;
  std::vector<Token> toks_;

  size_t find_tag(size_t from) const {
    while (true) {
      size_t t = src_.find('{', from);
      if (t == std::string::npos || t + 1 >= n_) return std::string::npos;
      char c = src_[t + 1];
      if (c == '{' || c == '%' || c == '#') return t;
      from = t + 1;
    }
  }

  void data(std::string text, size_t pos) {
    if (!text.empty()) toks_.push_back({Tok::Data, std::move(text), 0, 0, pos});
  }

  void lstrip(std::string& text, char sign, bool is_var, bool line_starting) const {
    if (sign == '-') {
      size_t e = text.size();
      while (e > 0 && is_ws(text[e - 1])) --e;
      text.resize(e);
    } else if (sign != '+' && impl_.options.lstrip_blocks && !is_var) {
      size_t l = text.rfind('\n');
      l = l == std::string::npos ? 0 : l + 1;
      if (l > 0 || line_starting) {
        bool all_ws = l < text.size();
        for (size_t k = l; k < text.size(); ++k)
          if (!is_ws(text[k])) all_ws = false;
        if (all_ws) text.resize(l);
      }
    }
  }

  // `{%[-+]? raw [-]?%}`: returns the offset after the tag, 0 if this is no raw tag.
  size_t match_raw_begin(size_t p) const {
    size_t q = p;
    while (q < n_ && is_ws(src_[q])) ++q;
    if (src_.compare(q, 3, "raw") != 0 || (q + 3 < n_ && is_name_char(src_[q + 3]))) return 0;
    q += 3;
    while (q < n_ && is_ws(src_[q])) ++q;
    if (src_.compare(q, 3, "-%}") == 0) {
      q += 3;
      while (q < n_ && is_ws(src_[q])) ++q;
      return q;
    }
    if (src_.compare(q, 2, "%}") == 0) return q + 2;
    return 0;
  }

  size_t lex_raw(size_t from, size_t tag_pos, bool& line_starting) {
    line_starting = src_[from - 1] == '\n';
    size_t search = from;
    while (true) {
      size_t r = src_.find("{%", search);
      if (r == std::string::npos) impl_.fail(tag_pos, "missing end of raw directive");
      size_t q = r + 2;
      char sign = 0;
      if (q < n_ && (src_[q] == '-' || src_[q] == '+')) sign = src_[q++];
      while (q < n_ && is_ws(src_[q])) ++q;
      if (src_.compare(q, 6, "endraw") != 0 || (q + 6 < n_ && is_name_char(src_[q + 6]))) {
        search = r + 2;
        continue;
      }
      q += 6;
      while (q < n_ && is_ws(src_[q])) ++q;
      size_t end;
      if (src_.compare(q, 3, "+%}") == 0) {
        end = q + 3;
      } else if (src_.compare(q, 3, "-%}") == 0) {
        end = q + 3;
        while (end < n_ && is_ws(src_[end])) ++end;
      } else if (src_.compare(q, 2, "%}") == 0) {
        end = q + 2;
        if (impl_.options.trim_blocks && end < n_ && src_[end] == '\n') ++end;
      } else {
        search = r + 2;
        continue;
      }
      std::string text = src_.substr(from, r - from);
      lstrip(text, sign, false, line_starting);
      data(std::move(text), from);
      line_starting = src_[end - 1] == '\n';
      return end;
    }
  }

  size_t lex_tag(bool block, size_t tag_pos, size_t p) {
    toks_.push_back({block ? Tok::BlockBegin : Tok::VarBegin, "", 0, 0, tag_pos});
    int depth = 0;
    while (true) {
      while (p < n_ && is_ws(src_[p])) ++p;
      if (p >= n_) impl_.fail(tag_pos, std::string("unexpected end of template, expected '") + (block ? "%}" : "}}") + "'");
      if (depth == 0) {
        if (block) {
          if (src_.compare(p, 3, "-%}") == 0) {
            toks_.push_back({Tok::BlockEnd, "", 0, 0, p});
            p += 3;
            while (p < n_ && is_ws(src_[p])) ++p;
            return p;
          }
          if (src_.compare(p, 3, "+%}") == 0) {
            toks_.push_back({Tok::BlockEnd, "", 0, 0, p});
            return p + 3;
          }
          if (src_.compare(p, 2, "%}") == 0) {
            toks_.push_back({Tok::BlockEnd, "", 0, 0, p});
            p += 2;
            if (impl_.options.trim_blocks && p < n_ && src_[p] == '\n') ++p;
            return p;
          }
        } else {
          if (src_.compare(p, 3, "-}}") == 0) {
            toks_.push_back({Tok::VarEnd, "", 0, 0, p});
            p += 3;
            while (p < n_ && is_ws(src_[p])) ++p;
            return p;
          }
          if (src_.compare(p, 2, "}}") == 0) {
            toks_.push_back({Tok::VarEnd, "", 0, 0, p});
            return p + 2;
          }
        }
      }
      p = lex_token(p, depth);
    }
  }

  size_t lex_token(size_t p, int& depth) {
    char c = src_[p];
    if (is_name_start(c)) {
      size_t e = p;
      while (e < n_ && is_name_char(src_[e])) ++e;
      toks_.push_back({Tok::Name, src_.substr(p, e - p), 0, 0, p});
      return e;
    }
    if (is_digit(c)) return lex_number(p);
    if (c == '\'' || c == '"') return lex_string(p);
    static const char* ops2[] = {"//", "**", "==", "!=", "<=", ">="};
    for (const char* op : ops2)
      if (src_.compare(p, 2, op) == 0) {
        toks_.push_back({Tok::Op, op, 0, 0, p});
        return p + 2;
      }
    static const std::string ops1 = "+-*/%~()[]{},.:|=<>";
    if (ops1.find(c) != std::string::npos) {
      if (c == '(' || c == '[' || c == '{') ++depth;
      if (c == ')' || c == ']' || c == '}') {
        if (depth == 0) impl_.fail(p, std::string("unexpected '") + c + "'");
        --depth;
      }
      toks_.push_back({Tok::Op, std::string(1, c), 0, 0, p});
      return p + 1;
    }
    impl_.fail(p, std::string("unexpected character '") + c + "'");
  }

  size_t lex_number(size_t p) {
    size_t e = p;
    auto digits = [&]() {
      while (e < n_ && (is_digit(src_[e]) || (src_[e] == '_' && e + 1 < n_ && is_digit(src_[e + 1])))) ++e;
    };
    digits();
    bool after_dot = !toks_.empty() && toks_.back().t == Tok::Op && toks_.back().v == ".";
    bool is_float = false;
    if (!after_dot && e + 1 < n_ && src_[e] == '.' && is_digit(src_[e + 1])) {
      ++e;
      digits();
      is_float = true;
    }
    if (!after_dot && e < n_ && (src_[e] == 'e' || src_[e] == 'E')) {
      size_t f = e + 1;
      if (f < n_ && (src_[f] == '+' || src_[f] == '-')) ++f;
      if (f < n_ && is_digit(src_[f])) {
        e = f;
        digits();
        is_float = true;
      }
    }
    std::string text;
    for (size_t k = p; k < e; ++k)
      if (src_[k] != '_') text += src_[k];
    Token t{is_float ? Tok::Float : Tok::Int, text, 0, 0, p};
    try {
      if (is_float)
        t.fv = std::stod(text);
      else
        t.iv = std::stoll(text);
    } catch (const std::exception&) {
      impl_.fail(p, "number out of range: " + text);
    }
    toks_.push_back(t);
    return e;
  }

  size_t lex_string(size_t p) {
    char q = src_[p];
    size_t e = p + 1;
    std::string out;
    while (true) {
      if (e >= n_) impl_.fail(p, "unterminated string");
      char c = src_[e];
      if (c == q) break;
      if (c != '\\') {
        out += c;
        ++e;
        continue;
      }
      if (e + 1 >= n_) impl_.fail(p, "unterminated string");
      char d = src_[e + 1];
      e += 2;
      auto hex = [&](int count) -> char32_t {
        if (e + count > n_) impl_.fail(p, "truncated escape in string");
        char32_t v = 0;
        for (int k = 0; k < count; ++k) {
          char h = src_[e + k];
          int dv = is_digit(h) ? h - '0' : (h >= 'a' && h <= 'f') ? h - 'a' + 10 : (h >= 'A' && h <= 'F') ? h - 'A' + 10 : -1;
          if (dv < 0) impl_.fail(p, "bad escape in string");
          v = v * 16 + static_cast<char32_t>(dv);
        }
        e += count;
        return v;
      };
      switch (d) {
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'v': out += '\v'; break;
        case '\n': break;
        case 'x': utf8_append(out, hex(2)); break;
        case 'u': utf8_append(out, hex(4)); break;
        case 'U': utf8_append(out, hex(8)); break;
        default:
          if (d >= '0' && d <= '7') {
            char32_t v = static_cast<char32_t>(d - '0');
            for (int k = 0; k < 2 && e < n_ && src_[e] >= '0' && src_[e] <= '7'; ++k) v = v * 8 + (src_[e++] - '0');
            utf8_append(out, v);
          } else {
            out += '\\';
            out += d;
          }
      }
    }
    toks_.push_back({Tok::String, std::move(out), 0, 0, p});
    return e + 1;
  }
};

// ------------------------------------------------------------------------------------------------
// Parser: jinja2's grammar.

class Parser {
 public:
  Parser(const Impl& impl, std::vector<Token> toks) : impl_(impl), toks_(std::move(toks)) {}

  Body parse_template() {
    std::string end;
    Body b = parse_body({}, &end);
    return b;
  }

 private:
  const Impl& impl_;
  std::vector<Token> toks_;
  size_t i_ = 0;
  int loop_depth_ = 0;

  const Token& cur() const { return toks_[i_]; }
  const Token& peek(size_t k = 1) const { return toks_[std::min(i_ + k, toks_.size() - 1)]; }
  void next() {
    if (i_ + 1 < toks_.size()) ++i_;
  }
  bool is_op(const char* op) const { return cur().t == Tok::Op && cur().v == op; }
  bool is_name(const char* n) const { return cur().t == Tok::Name && cur().v == n; }
  [[noreturn]] void fail(const std::string& msg) const { impl_.fail(cur().pos, msg); }
  std::string describe(const Token& t) const {
    switch (t.t) {
      case Tok::Data: return "template data";
      case Tok::VarBegin: return "'{{'";
      case Tok::VarEnd: return "end of print statement";
      case Tok::BlockBegin: return "'{%'";
      case Tok::BlockEnd: return "end of statement block";
      case Tok::Name: return "'" + t.v + "'";
      case Tok::String: return "string";
      case Tok::Int:
      case Tok::Float: return "number";
      case Tok::Op: return "'" + t.v + "'";
      case Tok::Eof: return "end of template";
    }
    return "token";
  }
  void expect_op(const char* op) {
    if (!is_op(op)) fail(std::string("expected '") + op + "', got " + describe(cur()));
    next();
  }
  std::string expect_name() {
    if (cur().t != Tok::Name) fail("expected a name, got " + describe(cur()));
    std::string n = cur().v;
    next();
    return n;
  }
  void expect_block_end() {
    if (cur().t != Tok::BlockEnd) fail("expected end of statement block, got " + describe(cur()));
    next();
  }
  ExprP node(Expr::K k, size_t pos) {
    auto e = std::make_unique<Expr>();
    e->k = k;
    e->pos = pos;
    return e;
  }

  // Parses statements until `{% <one of ends> ...`; consumes `{%` and the end name, sets *end.
  Body parse_body(std::initializer_list<const char*> ends, std::string* end) {
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.t == Tok::Eof) {
        if (ends.size() == 0) return body;
        std::string want;
        for (const char* e : ends) want += std::string(want.empty() ? "" : " or ") + "'" + e + "'";
        fail("unexpected end of template, expected " + want);
      }
      if (t.t == Tok::Data) {
        auto s = std::make_unique<Stmt>();
        s->k = Stmt::Text;
        s->pos = t.pos;
        s->text = t.v;
        body.push_back(std::move(s));
        next();
        continue;
      }
      if (t.t == Tok::VarBegin) {
        auto s = std::make_unique<Stmt>();
        s->k = Stmt::Output;
        s->pos = t.pos;
        next();
        s->expr = parse_tuple(true);
        if (cur().t != Tok::VarEnd) fail("expected end of print statement, got " + describe(cur()));
        next();
        body.push_back(std::move(s));
        continue;
      }
      if (t.t == Tok::BlockBegin) {
        const Token& nt = peek();
        if (nt.t == Tok::Name)
          for (const char* e : ends)
            if (nt.v == e) {
              *end = nt.v;
              next();
              next();
              return body;
            }
        next();
        body.push_back(parse_statement());
        continue;
      }
      fail("unexpected " + describe(t));
    }
  }

  StmtP parse_statement() {
    if (cur().t != Tok::Name) fail("expected a statement name, got " + describe(cur()));
    std::string kw = cur().v;
    size_t pos = cur().pos;
    auto s = std::make_unique<Stmt>();
    s->pos = pos;
    next();
    std::string end;
    if (kw == "if") {
      s->k = Stmt::If;
      ExprP c = parse_expression();
      expect_block_end();
      while (true) {
        Body b = parse_body({"elif", "else", "endif"}, &end);
        s->branches.emplace_back(std::move(c), std::move(b));
        if (end == "elif") {
          c = parse_expression();
          expect_block_end();
          continue;
        }
        if (end == "else") {
          expect_block_end();
          s->else_body = parse_body({"endif"}, &end);
        }
        expect_block_end();
        break;
      }
      return s;
    }
    if (kw == "for") {
      s->k = Stmt::For;
      bool paren = false;
      if (is_op("(")) {
        paren = true;
        next();
      }
      s->targets.push_back(expect_name());
      while (is_op(",")) {
        next();
        if (cur().t != Tok::Name || cur().v == "in") break;
        s->targets.push_back(expect_name());
      }
      if (paren) expect_op(")");
      if (!is_name("in")) fail("expected 'in', got " + describe(cur()));
      next();
      s->expr = parse_tuple(false);
      if (is_name("if")) {
        next();
        s->cond = parse_expression();
      }
      if (is_name("recursive")) fail("recursive loops are not supported");
      expect_block_end();
      ++loop_depth_;
      s->body = parse_body({"else", "endfor"}, &end);
      --loop_depth_;
      if (end == "else") {
        expect_block_end();
        s->else_body = parse_body({"endfor"}, &end);
      }
      expect_block_end();
      return s;
    }
    if (kw == "set") {
      std::string first = expect_name();
      s->targets.push_back(first);
      if (is_op(".")) {
        next();
        s->attr = expect_name();
      } else {
        while (is_op(",")) {
          next();
          s->targets.push_back(expect_name());
        }
      }
      if (is_op("=")) {
        next();
        s->k = Stmt::Set;
        s->expr = parse_tuple(true);
        expect_block_end();
        return s;
      }
      if (!s->attr.empty() || s->targets.size() != 1) fail("expected '='");
      s->k = Stmt::SetBlock;
      parse_filter_chain(s->filters);
      expect_block_end();
      s->body = parse_body({"endset"}, &end);
      expect_block_end();
      return s;
    }
    if (kw == "macro") {
      s->k = Stmt::Macro;
      s->name = expect_name();
      expect_op("(");
      while (!is_op(")")) {
        std::string pn = expect_name();
        ExprP def;
        if (is_op("=")) {
          next();
          def = parse_expression();
        }
        s->params.emplace_back(pn, std::move(def));
        if (!is_op(")")) expect_op(",");
      }
      next();
      expect_block_end();
      int saved = loop_depth_;
      loop_depth_ = 0;
      s->body = parse_body({"endmacro"}, &end);
      loop_depth_ = saved;
      if (cur().t == Tok::Name) next();  // optional macro name
      expect_block_end();
      return s;
    }
    if (kw == "break" || kw == "continue") {
      if (loop_depth_ == 0) impl_.fail(pos, "'" + kw + "' outside of a loop");
      s->k = kw == "break" ? Stmt::Break : Stmt::Continue;
      expect_block_end();
      return s;
    }
    if (kw == "filter") {
      s->k = Stmt::FilterBlock;
      parse_filter_chain(s->filters, true);
      expect_block_end();
      s->body = parse_body({"endfilter"}, &end);
      expect_block_end();
      return s;
    }
    if (kw == "generation") {
      s->k = Stmt::Scope;
      expect_block_end();
      s->body = parse_body({"endgeneration"}, &end);
      expect_block_end();
      return s;
    }
    impl_.fail(pos, "unknown or unsupported tag '" + kw + "'");
  }

  // `| f(args) | g` (or `f | g` when `leading_bare`), into filter exprs with no target.
  void parse_filter_chain(std::vector<ExprP>& out, bool leading_bare = false) {
    bool first = true;
    while (true) {
      if (!(first && leading_bare)) {
        if (!is_op("|")) break;
        next();
      }
      first = false;
      out.push_back(parse_filter_tail(nullptr));
    }
  }

  ExprP parse_filter_tail(ExprP target) {
    size_t pos = cur().pos;
    std::string name = expect_name();
    while (is_op(".")) {
      next();
      name += "." + expect_name();
    }
    if (!known_filters().count(name)) impl_.fail(pos, "no filter named '" + name + "'");
    auto e = node(Expr::Filter, pos);
    e->name = name;
    e->a = std::move(target);
    if (is_op("(")) parse_call_args(*e);
    return e;
  }

  ExprP parse_tuple(bool with_condexpr) {
    size_t pos = cur().pos;
    auto parse1 = [&]() { return with_condexpr ? parse_expression() : parse_or(); };
    ExprP first = parse1();
    if (!is_op(",")) return first;
    auto t = node(Expr::TupleLit, pos);
    t->args.push_back(std::move(first));
    while (is_op(",")) {
      next();
      if (cur().t == Tok::VarEnd || cur().t == Tok::BlockEnd || is_op(")") || is_name("if")) break;
      t->args.push_back(parse1());
    }
    return t;
  }

  ExprP parse_expression() {
    ExprP e = parse_or();
    while (is_name("if")) {
      size_t pos = cur().pos;
      next();
      auto c = node(Expr::Cond, pos);
      c->b = parse_or();
      if (is_name("else")) {
        next();
        c->c = parse_expression();
      }
      c->a = std::move(e);
      e = std::move(c);
    }
    return e;
  }

  ExprP parse_or() {
    ExprP e = parse_and();
    while (is_name("or")) {
      auto o = node(Expr::Or, cur().pos);
      next();
      o->a = std::move(e);
      o->b = parse_and();
      e = std::move(o);
    }
    return e;
  }

  ExprP parse_and() {
    ExprP e = parse_not();
    while (is_name("and")) {
      auto o = node(Expr::And, cur().pos);
      next();
      o->a = std::move(e);
      o->b = parse_not();
      e = std::move(o);
    }
    return e;
  }

  ExprP parse_not() {
    if (is_name("not")) {
      auto o = node(Expr::Not, cur().pos);
      next();
      o->a = parse_not();
      return o;
    }
    return parse_compare();
  }

  ExprP parse_compare() {
    size_t pos = cur().pos;
    ExprP e = parse_math1();
    ExprP cmp;
    while (true) {
      std::string op;
      if (cur().t == Tok::Op &&
          (cur().v == "==" || cur().v == "!=" || cur().v == "<" || cur().v == "<=" || cur().v == ">" || cur().v == ">=")) {
        op = cur().v;
        next();
      } else if (is_name("in")) {
        op = "in";
        next();
      } else if (is_name("not") && peek().t == Tok::Name && peek().v == "in") {
        op = "notin";
        next();
        next();
      } else {
        break;
      }
      if (!cmp) {
        cmp = node(Expr::Cmp, pos);
        cmp->args.push_back(std::move(e));
      }
      cmp->ops.push_back(op);
      cmp->args.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(e);
  }

  ExprP binary(const char* op, ExprP l, ExprP r, size_t pos) {
    auto b = node(Expr::Bin, pos);
    b->name = op;
    b->a = std::move(l);
    b->b = std::move(r);
    return b;
  }

  ExprP parse_math1() {
    ExprP e = parse_concat();
    while (is_op("+") || is_op("-")) {
      std::string op = cur().v;
      size_t pos = cur().pos;
      next();
      e = binary(op.c_str(), std::move(e), parse_concat(), pos);
    }
    return e;
  }

  ExprP parse_concat() {
    size_t pos = cur().pos;
    ExprP e = parse_math2();
    if (!is_op("~")) return e;
    auto c = node(Expr::Concat, pos);
    c->args.push_back(std::move(e));
    while (is_op("~")) {
      next();
      c->args.push_back(parse_math2());
    }
    return c;
  }

  ExprP parse_math2() {
    ExprP e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      std::string op = cur().v;
      size_t pos = cur().pos;
      next();
      e = binary(op.c_str(), std::move(e), parse_pow(), pos);
    }
    return e;
  }

  ExprP parse_pow() {
    ExprP e = parse_unary(true);
    while (is_op("**")) {
      size_t pos = cur().pos;
      next();
      e = binary("**", std::move(e), parse_unary(true), pos);
    }
    return e;
  }

  ExprP parse_unary(bool with_filter) {
    ExprP e;
    if (is_op("-") || is_op("+")) {
      auto u = node(is_op("-") ? Expr::Neg : Expr::Pos, cur().pos);
      next();
      u->a = parse_unary(false);
      e = std::move(u);
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  ExprP parse_primary() {
    const Token& t = cur();
    size_t pos = t.pos;
    if (t.t == Tok::Name) {
      auto e = node(Expr::Lit, pos);
      if (t.v == "true" || t.v == "True") {
        e->lit = Value::boolean(true);
      } else if (t.v == "false" || t.v == "False") {
        e->lit = Value::boolean(false);
      } else if (t.v == "none" || t.v == "None") {
        e->lit = Value::none();
      } else {
        e->k = Expr::Name;
        e->name = t.v;
      }
      next();
      return e;
    }
    if (t.t == Tok::String) {
      std::string s;
      while (cur().t == Tok::String) {
        s += cur().v;
        next();
      }
      auto e = node(Expr::Lit, pos);
      e->lit = Value::string(std::move(s));
      return e;
    }
    if (t.t == Tok::Int || t.t == Tok::Float) {
      auto e = node(Expr::Lit, pos);
      e->lit = t.t == Tok::Int ? Value::integer(t.iv) : Value::real(t.fv);
      next();
      return e;
    }
    if (is_op("(")) {
      next();
      if (is_op(")")) {
        next();
        return node(Expr::TupleLit, pos);
      }
      ExprP e = parse_tuple(true);
      expect_op(")");
      return e;
    }
    if (is_op("[")) {
      next();
      auto e = node(Expr::ListLit, pos);
      while (!is_op("]")) {
        e->args.push_back(parse_expression());
        if (!is_op("]")) expect_op(",");
      }
      next();
      return e;
    }
    if (is_op("{")) {
      next();
      auto e = node(Expr::DictLit, pos);
      while (!is_op("}")) {
        e->args.push_back(parse_expression());
        expect_op(":");
        e->args.push_back(parse_expression());
        if (!is_op("}")) expect_op(",");
      }
      next();
      return e;
    }
    fail("unexpected " + describe(t));
  }

  ExprP parse_postfix(ExprP e) {
    while (true) {
      if (is_op(".")) {
        size_t pos = cur().pos;
        next();
        if (cur().t == Tok::Name) {
          auto a = node(Expr::Attr, pos);
          a->name = cur().v;
          a->a = std::move(e);
          next();
          e = std::move(a);
        } else if (cur().t == Tok::Int) {
          auto a = node(Expr::Item, pos);
          a->a = std::move(e);
          a->b = node(Expr::Lit, cur().pos);
          a->b->lit = Value::integer(cur().iv);
          next();
          e = std::move(a);
        } else {
          fail("expected an attribute name, got " + describe(cur()));
        }
      } else if (is_op("[")) {
        e = parse_subscript(std::move(e));
      } else if (is_op("(")) {
        auto c = node(Expr::Call, e->pos);
        c->a = std::move(e);
        parse_call_args(*c);
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  ExprP parse_subscript(ExprP target) {
    size_t pos = cur().pos;
    next();  // [
    ExprP start, stop, step;
    bool slice = false;
    if (!is_op(":")) start = parse_expression();
    if (is_op(":")) {
      slice = true;
      next();
      if (!is_op("]") && !is_op(":")) stop = parse_expression();
      if (is_op(":")) {
        next();
        if (!is_op("]")) step = parse_expression();
      }
    }
    expect_op("]");
    if (!slice) {
      auto e = node(Expr::Item, pos);
      e->a = std::move(target);
      e->b = std::move(start);
      return e;
    }
    auto e = node(Expr::Slice, pos);
    e->a = std::move(target);
    e->args.push_back(std::move(start));
    e->args.push_back(std::move(stop));
    e->args.push_back(std::move(step));
    return e;
  }

  void parse_call_args(Expr& e) {
    expect_op("(");
    while (!is_op(")")) {
      if (is_op("*") || is_op("**")) fail("*args / **kwargs in calls are not supported");
      if (cur().t == Tok::Name && peek().t == Tok::Op && peek().v == "=") {
        std::string k = cur().v;
        next();
        next();
        e.kwargs.emplace_back(k, parse_expression());
      } else {
        if (!e.kwargs.empty()) fail("positional argument after keyword argument");
        e.args.push_back(parse_expression());
      }
      if (!is_op(")")) expect_op(",");
    }
    next();
  }

  ExprP parse_filter_expr(ExprP e) {
    while (true) {
      if (is_op("|")) {
        next();
        e = parse_filter_tail(std::move(e));
      } else if (is_name("is")) {
        e = parse_test(std::move(e));
      } else if (is_op("(")) {
        auto c = node(Expr::Call, cur().pos);
        c->a = std::move(e);
        parse_call_args(*c);
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  ExprP parse_test(ExprP target) {
    size_t pos = cur().pos;
    next();  // is
    auto t = node(Expr::Test, pos);
    t->a = std::move(target);
    if (is_name("not")) {
      t->negated = true;
      next();
    }
    size_t npos = cur().pos;
    t->name = expect_name();
    while (is_op(".")) {
      next();
      t->name += "." + expect_name();
    }
    if (!known_tests().count(t->name)) impl_.fail(npos, "no test named '" + t->name + "'");
    if (is_op("(")) {
      parse_call_args(*t);
    } else if ((cur().t == Tok::Name || cur().t == Tok::String || cur().t == Tok::Int || cur().t == Tok::Float ||
                is_op("(") || is_op("[") || is_op("{")) &&
               !is_name("else") && !is_name("or") && !is_name("and")) {
      if (is_name("is")) fail("you cannot chain multiple tests with is");
      t->args.push_back(parse_postfix(parse_primary()));
    }
    return t;
  }
};

// ------------------------------------------------------------------------------------------------
// Interpreter

struct Scope {
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Scope> parent;
  Value* lookup(const std::string& k) {
    for (Scope* s = this; s; s = s->parent.get()) {
      auto it = s->vars.find(k);
      if (it != s->vars.end()) return &it->second;
    }
    return nullptr;
  }
};
using ScopeP = std::shared_ptr<Scope>;

ScopeP child(const ScopeP& parent) {
  auto s = std::make_shared<Scope>();
  s->parent = parent;
  return s;
}

enum class Flow { Normal, Break, Continue };

// raise_exception(): carries the template's message.
struct RaisedError {
  std::string msg;
};

[[noreturn]] void undefined_error(const Value& v) {
  throw ValueError(v.s.empty() ? std::string("value is undefined") : v.s);
}

// Python slice index adjustment (PySlice_AdjustIndices).
std::vector<int64_t> slice_indices(int64_t len, const Value* start, const Value* stop, const Value* step) {
  auto as_int = [](const Value* v, const char* what) -> std::optional<int64_t> {
    if (!v || v->is_none() || v->is_undefined()) return std::nullopt;
    if (v->kind == Value::kInt) return v->i;
    if (v->kind == Value::kBool) return v->b ? 1 : 0;
    throw ValueError(std::string("slice ") + what + " must be an integer");
  };
  int64_t st = as_int(step, "step").value_or(1);
  if (st == 0) throw ValueError("slice step cannot be zero");
  auto adjust = [&](std::optional<int64_t> v, int64_t def) {
    if (!v) return def;
    int64_t x = *v;
    if (x < 0) {
      x += len;
      if (x < 0) x = st < 0 ? -1 : 0;
    } else if (x >= len) {
      x = st < 0 ? len - 1 : len;
    }
    return x;
  };
  int64_t b = adjust(as_int(start, "start"), st < 0 ? len - 1 : 0);
  int64_t e = adjust(as_int(stop, "stop"), st < 0 ? -1 : len);
  std::vector<int64_t> idx;
  if (st > 0)
    for (int64_t k = b; k < e; k += st) idx.push_back(k);
  else
    for (int64_t k = b; k > e; k += st) idx.push_back(k);
  return idx;
}

std::u32string map_case(const std::u32string& s, bool upper) {
  std::u32string out;
  out.reserve(s.size());
  for (char32_t c : s)
    out += static_cast<char32_t>(upper ? utf8proc_toupper(static_cast<utf8proc_int32_t>(c))
                                       : utf8proc_tolower(static_cast<utf8proc_int32_t>(c)));
  return out;
}
std::string upper(const std::string& s) { return utf8_encode(map_case(utf8_decode(s), true)); }
std::string lower(const std::string& s) { return utf8_encode(map_case(utf8_decode(s), false)); }
bool is_cased(char32_t c) {
  auto ci = static_cast<utf8proc_int32_t>(c);
  return utf8proc_toupper(ci) != ci || utf8proc_tolower(ci) != ci;
}

std::string py_title(const std::string& s) {
  std::u32string in = utf8_decode(s), out;
  bool prev_cased = false;
  for (char32_t c : in) {
    if (is_cased(c)) {
      auto ci = static_cast<utf8proc_int32_t>(c);
      out += static_cast<char32_t>(prev_cased ? utf8proc_tolower(ci) : utf8proc_totitle(ci));
      prev_cased = true;
    } else {
      out += c;
      prev_cased = false;
    }
  }
  return utf8_encode(out);
}

std::string py_capitalize(const std::string& s) {
  std::u32string in = utf8_decode(s);
  if (in.empty()) return "";
  std::u32string out = map_case(in, false);
  out[0] = static_cast<char32_t>(utf8proc_totitle(static_cast<utf8proc_int32_t>(in[0])));
  return utf8_encode(out);
}

// jinja2's title filter: words start after runs of -, whitespace, ( { [ <.
std::string jinja_title(const std::string& s) {
  std::u32string in = utf8_decode(s), out;
  bool start = true;
  for (char32_t c : in) {
    bool sep = c == U'-' || c == U'(' || c == U'{' || c == U'[' || c == U'<' || py_isspace(c);
    if (sep) {
      out += c;
      start = true;
    } else if (start) {
      out += static_cast<char32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(c)));
      start = false;
    } else {
      out += static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c)));
    }
  }
  return utf8_encode(out);
}

std::string py_strip(const std::string& s, const Value* chars, bool left, bool right) {
  std::u32string in = utf8_decode(s);
  std::u32string set;
  bool ws = !chars || chars->is_none() || chars->is_undefined();
  if (!ws) {
    if (!chars->is_string()) throw ValueError("strip arg must be None or str");
    set = utf8_decode(chars->s);
  }
  auto strip_it = [&](char32_t c) { return ws ? py_isspace(c) : set.find(c) != std::u32string::npos; };
  size_t b = 0, e = in.size();
  if (left)
    while (b < e && strip_it(in[b])) ++b;
  if (right)
    while (e > b && strip_it(in[e - 1])) --e;
  return utf8_encode(in.substr(b, e - b));
}

std::vector<std::string> py_split(const std::string& s, const Value* sep, int64_t maxsplit, bool from_right) {
  std::vector<std::string> out;
  if (!sep || sep->is_none()) {
    std::u32string in = utf8_decode(s);
    std::vector<std::pair<size_t, size_t>> words;
    size_t k = 0;
    while (k < in.size()) {
      while (k < in.size() && py_isspace(in[k])) ++k;
      if (k >= in.size()) break;
      size_t b = k;
      while (k < in.size() && !py_isspace(in[k])) ++k;
      words.emplace_back(b, k);
    }
    if (maxsplit >= 0 && static_cast<int64_t>(words.size()) > maxsplit + 1) {
      if (!from_right) {
        size_t b = words[maxsplit].first;
        size_t e = in.size();
        while (e > b && py_isspace(in[e - 1])) --e;
        words.resize(maxsplit);
        words.emplace_back(b, e);
      } else {
        size_t keep = words.size() - maxsplit;
        size_t b = 0;
        while (b < in.size() && py_isspace(in[b])) ++b;
        std::vector<std::pair<size_t, size_t>> w2;
        w2.emplace_back(b, words[keep - 1].second);
        for (size_t j = keep; j < words.size(); ++j) w2.push_back(words[j]);
        words = w2;
      }
    }
    for (auto [b, e] : words) out.push_back(utf8_encode(in.substr(b, e - b)));
    return out;
  }
  if (!sep->is_string()) throw ValueError("split separator must be str or None");
  const std::string& d = sep->s;
  if (d.empty()) throw ValueError("empty separator");
  if (!from_right) {
    size_t p = 0;
    int64_t n = 0;
    while (maxsplit < 0 || n < maxsplit) {
      size_t q = s.find(d, p);
      if (q == std::string::npos) break;
      out.push_back(s.substr(p, q - p));
      p = q + d.size();
      ++n;
    }
    out.push_back(s.substr(p));
  } else {
    size_t e = s.size();
    int64_t n = 0;
    std::vector<std::string> rev;
    while (maxsplit < 0 || n < maxsplit) {
      if (e < d.size()) break;
      size_t q = s.rfind(d, e - d.size());
      if (q == std::string::npos) break;
      rev.push_back(s.substr(q + d.size(), e - q - d.size()));
      e = q;
      ++n;
    }
    rev.push_back(s.substr(0, e));
    out.assign(rev.rbegin(), rev.rend());
  }
  return out;
}

std::string py_replace(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  std::string out;
  if (from.empty()) {
    std::u32string in = utf8_decode(s);
    int64_t n = 0;
    for (size_t k = 0; k <= in.size(); ++k) {
      if (count < 0 || n < count) {
        out += to;
        ++n;
      }
      if (k < in.size()) utf8_append(out, in[k]);
    }
    return out;
  }
  size_t p = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    size_t q = s.find(from, p);
    if (q == std::string::npos) break;
    out += s.substr(p, q - p) + to;
    p = q + from.size();
    ++n;
  }
  return out + s.substr(p);
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

// Argument access for builtins: positional index or keyword name.
struct Args {
  CallArgs& a;
  const char* fname;
  const Value* get(size_t idx, const char* kw) const {
    if (idx < a.pos.size()) return &a.pos[idx];
    for (auto& [k, v] : a.kw)
      if (k == kw) return &v;
    return nullptr;
  }
  Value value(size_t idx, const char* kw, Value def) const {
    const Value* v = get(idx, kw);
    return v ? *v : def;
  }
  void max_positional(size_t n) const {
    if (a.pos.size() > n)
      throw ValueError(std::string(fname) + "() takes at most " + std::to_string(n) + " positional argument(s)");
  }
};

int64_t to_int(const Value& v, const char* what) {
  if (v.kind == Value::kInt) return v.i;
  if (v.kind == Value::kBool) return v.b;
  if (v.kind == Value::kFloat) return static_cast<int64_t>(v.f);
  throw ValueError(std::string(what) + " must be an integer, got " + v.type_name());
}

std::vector<Value> iterate(const Value& v) {
  switch (v.kind) {
    case Value::kList: return v.list->items;
    case Value::kDict: {
      std::vector<Value> out;
      for (auto& [k, x] : v.dict->items) out.push_back(Value::string(k));
      return out;
    }
    case Value::kString: {
      std::vector<Value> out;
      for (char32_t c : utf8_decode(v.s)) {
        std::string one;
        utf8_append(one, c);
        out.push_back(Value::string(one));
      }
      return out;
    }
    case Value::kUndefined: return {};
    default: throw ValueError(std::string("'") + v.type_name() + "' object is not iterable");
  }
}

int64_t length(const Value& v) {
  switch (v.kind) {
    case Value::kString: return static_cast<int64_t>(utf8_decode(v.s).size());
    case Value::kList: return static_cast<int64_t>(v.list->items.size());
    case Value::kDict:
    case Value::kNamespace: return static_cast<int64_t>(v.dict->items.size());
    case Value::kUndefined: return 0;
    default: throw ValueError(std::string("object of type '") + v.type_name() + "' has no len()");
  }
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind) {
    case Value::kString:
      if (!item.is_string())
        throw ValueError(std::string("'in <string>' requires string as left operand, not ") + item.type_name());
      return container.s.find(item.s) != std::string::npos;
    case Value::kList:
      for (const auto& x : container.list->items)
        if (equals(x, item)) return true;
      return false;
    case Value::kDict:
    case Value::kNamespace: return item.is_string() && container.dict->find(item.s) != nullptr;
    case Value::kUndefined: return false;
    default: throw ValueError(std::string("argument of type '") + container.type_name() + "' is not iterable");
  }
}

// printf-style formatting for `"%s" % x` and the format filter.
std::string percent_format(const std::string& fmt, const Value& args) {
  std::vector<Value> vals;
  if (args.is_list() && args.list->tuple)
    vals = args.list->items;
  else
    vals.push_back(args);
  size_t next = 0;
  std::string out;
  for (size_t k = 0; k < fmt.size(); ++k) {
    if (fmt[k] != '%') {
      out += fmt[k];
      continue;
    }
    if (k + 1 >= fmt.size()) throw ValueError("incomplete format");
    char c = fmt[++k];
    if (c == '%') {
      out += '%';
      continue;
    }
    if (next >= vals.size()) throw ValueError("not enough arguments for format string");
    const Value& v = vals[next++];
    if (c == 's')
      out += v.str();
    else if (c == 'r')
      out += v.repr();
    else if (c == 'd' || c == 'i')
      out += std::to_string(to_int(v, "%d format"));
    else
      throw ValueError(std::string("unsupported format character '") + c + "'");
  }
  bool mapping_like = (args.is_list() && !args.list->tuple) || args.is_dict();  // Python accepts these unused
  if (next < vals.size() && !(mapping_like && next == 0))
    throw ValueError("not all arguments converted during string formatting");
  return out;
}

// str.format with {} / {0} / {name} fields (no format specs).
std::string brace_format(const std::string& fmt, CallArgs& a) {
  std::string out;
  size_t auto_idx = 0;
  for (size_t k = 0; k < fmt.size(); ++k) {
    char c = fmt[k];
    if (c == '{') {
      if (k + 1 < fmt.size() && fmt[k + 1] == '{') {
        out += '{';
        ++k;
        continue;
      }
      size_t e = fmt.find('}', k);
      if (e == std::string::npos) throw ValueError("Single '{' encountered in format string");
      std::string field = fmt.substr(k + 1, e - k - 1);
      if (field.find(':') != std::string::npos || field.find('!') != std::string::npos)
        throw ValueError("format specs are not supported in str.format");
      const Value* v = nullptr;
      if (field.empty()) {
        if (auto_idx >= a.pos.size()) throw ValueError("Replacement index out of range for positional args tuple");
        v = &a.pos[auto_idx++];
      } else if (std::all_of(field.begin(), field.end(), is_digit)) {
        size_t idx = std::stoul(field);
        if (idx >= a.pos.size()) throw ValueError("Replacement index out of range for positional args tuple");
        v = &a.pos[idx];
      } else {
        for (auto& [kk, vv] : a.kw)
          if (kk == field) v = &vv;
        if (!v) throw ValueError("KeyError: '" + field + "'");
      }
      out += v->str();
      k = e;
    } else if (c == '}') {
      if (k + 1 < fmt.size() && fmt[k + 1] == '}') ++k;
      else throw ValueError("Single '}' encountered in format string");
      out += '}';
    } else {
      out += c;
    }
  }
  return out;
}

class Interp {
 public:
  explicit Interp(const Impl& t) : t_(t) {}

  std::string render(const nlohmann::ordered_json& vars) {
    auto globals = std::make_shared<Scope>();
    install_globals(*globals);
    auto top = child(globals);
    if (!vars.is_null()) {
      if (!vars.is_object()) throw Error(t_.origin + ": template variables must be a JSON object");
      try {
        for (auto it = vars.begin(); it != vars.end(); ++it) top->vars[it.key()] = Value::from_json(it.value());
      } catch (const ValueError& e) {
        throw Error(t_.origin + ": " + e.what());
      }
    }
    std::string out;
    try {
      exec(t_.body, top, out);
    } catch (const RaisedError& e) {
      throw Error(t_.where(pos_) + ": " + e.msg);
    } catch (const ValueError& e) {
      throw Error(t_.where(pos_) + ": " + e.what());
    }
    return out;
  }

 private:
  const Impl& t_;
  size_t pos_ = 0;
  int depth_ = 0;

  void install_globals(Scope& g) {
    g.vars["range"] = Value::function("range", [](CallArgs& a) {
      if (a.pos.empty() || a.pos.size() > 3 || !a.kw.empty()) throw ValueError("range expected 1 to 3 arguments");
      int64_t start = 0, stop, step = 1;
      if (a.pos.size() == 1) {
        stop = to_int(a.pos[0], "range()");
      } else {
        start = to_int(a.pos[0], "range()");
        stop = to_int(a.pos[1], "range()");
        if (a.pos.size() == 3) step = to_int(a.pos[2], "range()");
      }
      if (step == 0) throw ValueError("range() arg 3 must not be zero");
      std::vector<Value> items;
      for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
        if (items.size() >= 100000) throw ValueError("range too big");
        items.push_back(Value::integer(k));
      }
      return Value::new_list(std::move(items));
    });
    g.vars["namespace"] = Value::function("namespace", [](CallArgs& a) {
      Value ns = Value::new_namespace();
      for (auto& p : a.pos) {
        if (!p.is_dict()) throw ValueError("namespace() positional argument must be a mapping");
        for (auto& [k, v] : p.dict->items) ns.dict->set(k, v);
      }
      for (auto& [k, v] : a.kw) ns.dict->set(k, v);
      return ns;
    });
    g.vars["dict"] = Value::function("dict", [](CallArgs& a) {
      Value d = Value::new_dict();
      for (auto& p : a.pos) {
        if (!p.is_dict()) throw ValueError("dict() positional argument must be a mapping");
        for (auto& [k, v] : p.dict->items) d.dict->set(k, v);
      }
      for (auto& [k, v] : a.kw) d.dict->set(k, v);
      return d;
    });
    g.vars["raise_exception"] = Value::function("raise_exception", [](CallArgs& a) -> Value {
      std::string msg = a.pos.empty() ? std::string("raise_exception() called") : a.pos[0].str();
      throw RaisedError{msg};
    });
    g.vars["strftime_now"] = Value::function("strftime_now", [](CallArgs& a) {
      if (a.pos.size() != 1 || !a.pos[0].is_string()) throw ValueError("strftime_now expects a format string");
      std::time_t now = std::time(nullptr);
      std::tm tm{};
      localtime_r(&now, &tm);
      char buf[256];
      size_t n = std::strftime(buf, sizeof buf, a.pos[0].s.c_str(), &tm);
      return Value::string(std::string(buf, n));
    });
  }

  // ---- statements ----

  Flow exec(const Body& body, const ScopeP& sc, std::string& out) {
    for (const auto& s : body) {
      Flow f = exec_stmt(*s, sc, out);
      if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
  }

  Flow exec_stmt(const Stmt& s, const ScopeP& sc, std::string& out) {
    switch (s.k) {
      case Stmt::Text: out += s.text; return Flow::Normal;
      case Stmt::Output: {
        Value v = eval(*s.expr, sc);
        out += v.str();
        return Flow::Normal;
      }
      case Stmt::If:
        for (const auto& [c, b] : s.branches)
          if (eval(*c, sc).truthy()) return exec(b, sc, out);
        return exec(s.else_body, sc, out);
      case Stmt::For: return exec_for(s, sc, out);
      case Stmt::Set: {
        Value v = eval(*s.expr, sc);
        pos_ = s.pos;
        assign(s, sc, std::move(v));
        return Flow::Normal;
      }
      case Stmt::SetBlock: {
        // jinja2 compiles the capture inline: break/continue inside it act on the enclosing loop.
        std::string captured;
        if (Flow f = exec(s.body, child(sc), captured); f != Flow::Normal) return f;
        Value v = apply_filters(s.filters, Value::string(std::move(captured)), sc);
        sc->vars[s.targets[0]] = std::move(v);
        return Flow::Normal;
      }
      case Stmt::Macro: sc->vars[s.name] = make_macro(s, sc); return Flow::Normal;
      case Stmt::Break: return Flow::Break;
      case Stmt::Continue: return Flow::Continue;
      case Stmt::FilterBlock: {
        std::string captured;
        if (Flow f = exec(s.body, child(sc), captured); f != Flow::Normal) return f;
        out += apply_filters(s.filters, Value::string(std::move(captured)), sc).str();
        return Flow::Normal;
      }
      case Stmt::Scope: return exec(s.body, sc, out);
    }
    return Flow::Normal;
  }

  void assign(const Stmt& s, const ScopeP& sc, Value v) {
    if (!s.attr.empty()) {
      Value* ns = sc->lookup(s.targets[0]);
      if (!ns || ns->kind != Value::kNamespace) throw ValueError("cannot assign attribute on non-namespace object");
      ns->dict->set(s.attr, std::move(v));
      return;
    }
    if (s.targets.size() == 1) {
      sc->vars[s.targets[0]] = std::move(v);
      return;
    }
    std::vector<Value> items = iterate(v);
    if (items.size() != s.targets.size())
      throw ValueError("cannot unpack " + std::to_string(items.size()) + " values into " +
                       std::to_string(s.targets.size()) + " names");
    for (size_t k = 0; k < items.size(); ++k) sc->vars[s.targets[k]] = items[k];
  }

  void bind_targets(const Stmt& s, Scope& sc, const Value& item) {
    if (s.targets.size() == 1) {
      sc.vars[s.targets[0]] = item;
      return;
    }
    std::vector<Value> parts = iterate(item);
    if (parts.size() != s.targets.size())
      throw ValueError("cannot unpack " + std::to_string(parts.size()) + " values into " +
                       std::to_string(s.targets.size()) + " loop variables");
    for (size_t k = 0; k < parts.size(); ++k) sc.vars[s.targets[k]] = parts[k];
  }

  Flow exec_for(const Stmt& s, const ScopeP& sc, std::string& out) {
    Value seq = eval(*s.expr, sc);
    pos_ = s.expr->pos;
    if (seq.is_none()) throw ValueError("'NoneType' object is not iterable");
    std::vector<Value> items = iterate(seq);
    if (s.cond) {
      std::vector<Value> kept;
      for (auto& it : items) {
        auto fs = child(sc);
        bind_targets(s, *fs, it);
        if (eval(*s.cond, fs).truthy()) kept.push_back(it);
      }
      items = std::move(kept);
    }
    // jinja2 marks the loop as "iterated" at the end of the body, so the else block also runs when every
    // iteration ended in continue/break; a break/continue inside the else block acts on the outer loop.
    bool completed = false;
    int64_t n = static_cast<int64_t>(items.size());
    for (int64_t k = 0; k < n; ++k) {
      auto is = child(sc);
      bind_targets(s, *is, items[k]);
      Value loop = Value::new_dict();
      auto& d = *loop.dict;
      d.set("index", Value::integer(k + 1));
      d.set("index0", Value::integer(k));
      d.set("revindex", Value::integer(n - k));
      d.set("revindex0", Value::integer(n - k - 1));
      d.set("first", Value::boolean(k == 0));
      d.set("last", Value::boolean(k == n - 1));
      d.set("length", Value::integer(n));
      d.set("depth", Value::integer(1));
      d.set("depth0", Value::integer(0));
      if (k > 0) d.set("previtem", items[k - 1]);
      if (k + 1 < n) d.set("nextitem", items[k + 1]);
      d.set("cycle", Value::function("loop.cycle", [k](CallArgs& a) {
        if (a.pos.empty()) throw ValueError("no items for cycling given");
        return a.pos[static_cast<size_t>(k) % a.pos.size()];
      }));
      is->vars["loop"] = std::move(loop);
      Flow f = exec(s.body, is, out);
      if (f == Flow::Break) break;
      if (f == Flow::Normal) completed = true;
    }
    if (!completed) return exec(s.else_body, child(sc), out);
    return Flow::Normal;
  }

  Value make_macro(const Stmt& s, const ScopeP& sc) {
    const Stmt* m = &s;
    std::weak_ptr<Scope> weak = sc;  // the defining scope outlives every call made during the render
    return Value::function(s.name, [this, m, weak](CallArgs& a) -> Value {
      ScopeP def = weak.lock();
      if (!def) throw ValueError("macro '" + m->name + "' called after its scope ended");
      if (a.pos.size() > m->params.size())
        throw ValueError("macro '" + m->name + "' takes not more than " + std::to_string(m->params.size()) +
                         " argument(s)");
      auto ms = child(def);
      std::vector<bool> bound(m->params.size(), false);
      for (size_t k = 0; k < a.pos.size(); ++k) {
        ms->vars[m->params[k].first] = a.pos[k];
        bound[k] = true;
      }
      for (auto& [kname, v] : a.kw) {
        size_t k = 0;
        while (k < m->params.size() && m->params[k].first != kname) ++k;
        if (k == m->params.size()) throw ValueError("macro '" + m->name + "' takes no keyword argument '" + kname + "'");
        if (bound[k]) throw ValueError("macro '" + m->name + "' got multiple values for argument '" + kname + "'");
        ms->vars[kname] = v;
        bound[k] = true;
      }
      size_t saved = pos_;
      for (size_t k = 0; k < m->params.size(); ++k) {
        if (bound[k]) continue;
        const auto& [pname, def_expr] = m->params[k];
        ms->vars[pname] = def_expr ? eval(*def_expr, ms)
                                   : Value::undefined("parameter '" + pname + "' was not provided");
      }
      if (++depth_ > 200) throw ValueError("macro recursion too deep");
      std::string out;
      exec(m->body, ms, out);
      --depth_;
      pos_ = saved;
      return Value::string(std::move(out));
    });
  }

  // ---- expressions ----

  Value eval(const Expr& e, const ScopeP& sc) {
    switch (e.k) {
      case Expr::Lit: return e.lit;
      case Expr::Name: {
        if (Value* v = sc->lookup(e.name)) return *v;
        return Value::undefined("'" + e.name + "' is undefined");
      }
      case Expr::ListLit:
      case Expr::TupleLit: {
        std::vector<Value> items;
        for (const auto& x : e.args) items.push_back(eval(*x, sc));
        return Value::new_list(std::move(items), e.k == Expr::TupleLit);
      }
      case Expr::DictLit: {
        Value d = Value::new_dict();
        for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
          Value key = eval(*e.args[k], sc);
          Value val = eval(*e.args[k + 1], sc);
          d.dict->set(key.str(), std::move(val));
        }
        return d;
      }
      case Expr::Attr: {
        Value obj = eval(*e.a, sc);
        pos_ = e.pos;
        return get_attr(obj, e.name);
      }
      case Expr::Item: {
        Value obj = eval(*e.a, sc);
        Value key = eval(*e.b, sc);
        pos_ = e.pos;
        return get_item(obj, key);
      }
      case Expr::Slice: {
        Value obj = eval(*e.a, sc);
        Value parts[3];
        const Value* p[3] = {nullptr, nullptr, nullptr};
        for (int k = 0; k < 3; ++k)
          if (e.args[k]) {
            parts[k] = eval(*e.args[k], sc);
            p[k] = &parts[k];
          }
        pos_ = e.pos;
        return slice(obj, p[0], p[1], p[2]);
      }
      case Expr::Call: {
        Value fn = eval(*e.a, sc);
        CallArgs args = eval_args(e, sc);
        pos_ = e.pos;
        return call(fn, args);
      }
      case Expr::Filter: {
        Value in = eval(*e.a, sc);
        CallArgs args = eval_args(e, sc);
        pos_ = e.pos;
        return apply_filter(e.name, in, args);
      }
      case Expr::Test: {
        Value v = eval(*e.a, sc);
        CallArgs args = eval_args(e, sc);
        pos_ = e.pos;
        bool r = apply_test(e.name, v, args);
        return Value::boolean(e.negated ? !r : r);
      }
      case Expr::Not: return Value::boolean(!eval(*e.a, sc).truthy());
      case Expr::Neg:
      case Expr::Pos: {
        Value v = eval(*e.a, sc);
        pos_ = e.pos;
        if (v.is_undefined()) undefined_error(v);
        if (v.kind == Value::kFloat) return Value::real(e.k == Expr::Neg ? -v.f : v.f);
        if (v.kind == Value::kInt || v.kind == Value::kBool) {
          int64_t x = v.kind == Value::kBool ? v.b : v.i;
          return Value::integer(e.k == Expr::Neg ? -x : x);
        }
        throw ValueError(std::string("bad operand type for unary ") + (e.k == Expr::Neg ? "-" : "+") + ": '" +
                         v.type_name() + "'");
      }
      case Expr::Bin: {
        Value l = eval(*e.a, sc);
        Value r = eval(*e.b, sc);
        pos_ = e.pos;
        return binop(e.name, l, r);
      }
      case Expr::And: {
        Value l = eval(*e.a, sc);
        if (!l.truthy()) return l;
        return eval(*e.b, sc);
      }
      case Expr::Or: {
        Value l = eval(*e.a, sc);
        if (l.truthy()) return l;
        return eval(*e.b, sc);
      }
      case Expr::Cond: {
        if (eval(*e.b, sc).truthy()) return eval(*e.a, sc);
        if (e.c) return eval(*e.c, sc);
        return Value::undefined("the inline if-expression evaluated to false and no else section was defined");
      }
      case Expr::Concat: {
        std::string s;
        for (const auto& x : e.args) s += eval(*x, sc).str();
        return Value::string(std::move(s));
      }
      case Expr::Cmp: {
        Value l = eval(*e.args[0], sc);
        for (size_t k = 0; k < e.ops.size(); ++k) {
          Value r = eval(*e.args[k + 1], sc);
          pos_ = e.pos;
          if (!compare_op(e.ops[k], l, r)) return Value::boolean(false);
          l = std::move(r);
        }
        return Value::boolean(true);
      }
    }
    return Value::undefined();
  }

  CallArgs eval_args(const Expr& e, const ScopeP& sc) {
    CallArgs a;
    for (const auto& x : e.args) a.pos.push_back(eval(*x, sc));
    for (const auto& [k, x] : e.kwargs) a.kw.emplace_back(k, eval(*x, sc));
    return a;
  }

  Value call(const Value& fn, CallArgs& args) {
    if (fn.kind == Value::kFunction) return fn.fn->call(args);
    if (fn.is_undefined()) undefined_error(fn);
    throw ValueError(std::string("'") + fn.type_name() + "' object is not callable");
  }

  bool compare_op(const std::string& op, const Value& l, const Value& r) {
    if (op == "==") return equals(l, r);
    if (op == "!=") return !equals(l, r);
    if (op == "in") return contains(r, l);
    if (op == "notin") return !contains(r, l);
    if (l.is_undefined()) undefined_error(l);
    if (r.is_undefined()) undefined_error(r);
    int c = compare(l, r);
    if (op == "<") return c < 0;
    if (op == "<=") return c <= 0;
    if (op == ">") return c > 0;
    return c >= 0;
  }

  Value binop(const std::string& op, const Value& l, const Value& r) {
    if (l.is_undefined()) undefined_error(l);
    if (r.is_undefined()) undefined_error(r);
    auto type_err = [&]() -> Value {
      throw ValueError("unsupported operand type(s) for " + op + ": '" + l.type_name() + "' and '" + r.type_name() +
                       "'");
    };
    bool ints = (l.kind == Value::kInt || l.kind == Value::kBool) && (r.kind == Value::kInt || r.kind == Value::kBool);
    bool nums = l.is_number() && r.is_number();
    int64_t li = l.kind == Value::kBool ? l.b : l.i, ri = r.kind == Value::kBool ? r.b : r.i;
    if (op == "+") {
      if (ints) return Value::integer(li + ri);
      if (nums) return Value::real(l.as_double() + r.as_double());
      if (l.is_string() && r.is_string()) return Value::string(l.s + r.s);
      if (l.is_list() && r.is_list() && l.list->tuple == r.list->tuple) {
        std::vector<Value> items = l.list->items;
        items.insert(items.end(), r.list->items.begin(), r.list->items.end());
        return Value::new_list(std::move(items), l.list->tuple);
      }
      if (l.is_string() || r.is_string())
        throw ValueError(std::string("can only concatenate str (not \"") +
                         (l.is_string() ? r.type_name() : l.type_name()) + "\") to str");
      return type_err();
    }
    if (op == "-") {
      if (ints) return Value::integer(li - ri);
      if (nums) return Value::real(l.as_double() - r.as_double());
      return type_err();
    }
    if (op == "*") {
      if (ints) return Value::integer(li * ri);
      if (nums) return Value::real(l.as_double() * r.as_double());
      auto repeat = [&](const Value& seq, int64_t n) -> Value {
        if (seq.is_string()) {
          std::string s;
          for (int64_t k = 0; k < n; ++k) s += seq.s;
          return Value::string(s);
        }
        std::vector<Value> items;
        for (int64_t k = 0; k < n; ++k) items.insert(items.end(), seq.list->items.begin(), seq.list->items.end());
        return Value::new_list(std::move(items), seq.list->tuple);
      };
      if ((l.is_string() || l.is_list()) && (r.kind == Value::kInt || r.kind == Value::kBool)) return repeat(l, ri);
      if ((r.is_string() || r.is_list()) && (l.kind == Value::kInt || l.kind == Value::kBool)) return repeat(r, li);
      return type_err();
    }
    if (op == "/") {
      if (!nums) return type_err();
      if (r.as_double() == 0) throw ValueError("division by zero");
      return Value::real(l.as_double() / r.as_double());
    }
    if (op == "//") {
      if (!nums) return type_err();
      if (r.as_double() == 0) throw ValueError("integer division or modulo by zero");
      if (ints) {
        int64_t q = li / ri;
        if ((li % ri != 0) && ((li < 0) != (ri < 0))) --q;
        return Value::integer(q);
      }
      return Value::real(std::floor(l.as_double() / r.as_double()));
    }
    if (op == "%") {
      if (l.is_string()) return Value::string(percent_format(l.s, r));
      if (!nums) return type_err();
      if (r.as_double() == 0) throw ValueError("integer division or modulo by zero");
      if (ints) {
        int64_t m = li % ri;
        if (m != 0 && ((m < 0) != (ri < 0))) m += ri;
        return Value::integer(m);
      }
      double a = l.as_double(), b = r.as_double();
      double m = std::fmod(a, b);
      if (m != 0 && ((m < 0) != (b < 0))) m += b;
      return Value::real(m);
    }
    if (op == "**") {
      if (ints && ri >= 0) {
        int64_t res = 1;
        for (int64_t k = 0; k < ri; ++k) res *= li;
        return Value::integer(res);
      }
      if (nums) {
        if (l.as_double() == 0 && r.as_double() < 0) throw ValueError("0.0 cannot be raised to a negative power");
        return Value::real(std::pow(l.as_double(), r.as_double()));
      }
      return type_err();
    }
    return type_err();
  }

  Value slice(const Value& obj, const Value* start, const Value* stop, const Value* step) {
    if (obj.is_undefined()) undefined_error(obj);
    if (obj.is_string()) {
      std::u32string s = utf8_decode(obj.s), out;
      for (int64_t k : slice_indices(static_cast<int64_t>(s.size()), start, stop, step)) out += s[k];
      return Value::string(utf8_encode(out));
    }
    if (obj.is_list()) {
      std::vector<Value> out;
      for (int64_t k : slice_indices(static_cast<int64_t>(obj.list->items.size()), start, stop, step))
        out.push_back(obj.list->items[k]);
      return Value::new_list(std::move(out), obj.list->tuple);
    }
    if (obj.is_dict()) throw ValueError("unhashable type: 'slice'");
    return Value::undefined(std::string("'") + obj.type_name() + "' object is not subscriptable");
  }

  Value get_item(const Value& obj, const Value& key) {
    if (obj.is_undefined()) undefined_error(obj);
    switch (obj.kind) {
      case Value::kDict:
      case Value::kNamespace:
        if (key.is_string()) {
          if (const Value* v = obj.dict->find(key.s)) return *v;
        }
        break;
      case Value::kList:
        if (key.kind == Value::kInt || key.kind == Value::kBool) {
          int64_t n = static_cast<int64_t>(obj.list->items.size());
          int64_t k = key.kind == Value::kBool ? key.b : key.i;
          if (k < 0) k += n;
          if (k >= 0 && k < n) return obj.list->items[k];
        }
        break;
      case Value::kString:
        if (key.kind == Value::kInt || key.kind == Value::kBool) {
          std::u32string s = utf8_decode(obj.s);
          int64_t n = static_cast<int64_t>(s.size());
          int64_t k = key.kind == Value::kBool ? key.b : key.i;
          if (k < 0) k += n;
          if (k >= 0 && k < n) {
            std::string one;
            utf8_append(one, s[k]);
            return Value::string(one);
          }
        }
        break;
      default: break;
    }
    if (key.is_string() && obj.kind != Value::kDict && obj.kind != Value::kNamespace) return get_attr(obj, key.s);
    if (key.is_string() && obj.kind == Value::kDict) {
      Value m = method(obj, key.s);
      if (!m.is_undefined()) return m;
    }
    return Value::undefined(std::string("'") + obj.type_name() + " object' has no item " + key.repr());
  }

  Value get_attr(const Value& obj, const std::string& name) {
    if (obj.is_undefined()) undefined_error(obj);
    if (obj.kind == Value::kDict) {
      Value m = method(obj, name);
      if (!m.is_undefined()) return m;
      if (const Value* v = obj.dict->find(name)) return *v;
      return Value::undefined("'dict object' has no attribute '" + name + "'");
    }
    if (obj.kind == Value::kNamespace) {
      if (const Value* v = obj.dict->find(name)) return *v;
      return Value::undefined("'Namespace object' has no attribute '" + name + "'");
    }
    Value m = method(obj, name);
    if (!m.is_undefined()) return m;
    return Value::undefined(std::string("'") + obj.type_name() + " object' has no attribute '" + name + "'");
  }

  // Bound methods of str, dict and list (the read-only ones jinja2's immutable sandbox allows).
  Value method(const Value& self, const std::string& name) {
    std::string fname = std::string(self.type_name()) + "." + name;
    auto bind = [&](std::function<Value(const Value&, Args&)> f) {
      Value s = self;
      std::string fn = fname;
      return Value::function(fname, [s, f, fn](CallArgs& a) {
        Args args{a, fn.c_str()};
        return f(s, args);
      });
    };
    if (self.is_string()) {
      if (name == "split" || name == "rsplit") {
        bool right = name == "rsplit";
        return bind([right](const Value& s, Args& a) {
          int64_t maxsplit = to_int(a.value(1, "maxsplit", Value::integer(-1)), "maxsplit");
          std::vector<Value> items;
          for (auto& part : py_split(s.s, a.get(0, "sep"), maxsplit, right)) items.push_back(Value::string(part));
          return Value::new_list(std::move(items));
        });
      }
      if (name == "strip" || name == "lstrip" || name == "rstrip") {
        bool l = name != "rstrip", r = name != "lstrip";
        return bind([l, r](const Value& s, Args& a) { return Value::string(py_strip(s.s, a.get(0, "chars"), l, r)); });
      }
      if (name == "startswith" || name == "endswith") {
        bool starts = name == "startswith";
        return bind([starts](const Value& s, Args& a) {
          const Value* p = a.get(0, "prefix");
          if (!p) throw ValueError("startswith/endswith takes at least 1 argument");
          std::vector<Value> cands = p->is_list() ? p->list->items : std::vector<Value>{*p};
          for (auto& c : cands) {
            if (!c.is_string()) throw ValueError("startswith/endswith first arg must be str or a tuple of str");
            const std::string& x = c.s;
            if (x.size() > s.s.size()) continue;
            if (starts ? s.s.compare(0, x.size(), x) == 0 : s.s.compare(s.s.size() - x.size(), x.size(), x) == 0)
              return Value::boolean(true);
          }
          return Value::boolean(false);
        });
      }
      if (name == "replace")
        return bind([](const Value& s, Args& a) {
          const Value* o = a.get(0, "old");
          const Value* n = a.get(1, "new");
          if (!o || !n || !o->is_string() || !n->is_string()) throw ValueError("replace() expects two strings");
          return Value::string(py_replace(s.s, o->s, n->s, to_int(a.value(2, "count", Value::integer(-1)), "count")));
        });
      if (name == "upper") return bind([](const Value& s, Args&) { return Value::string(upper(s.s)); });
      if (name == "lower") return bind([](const Value& s, Args&) { return Value::string(lower(s.s)); });
      if (name == "title") return bind([](const Value& s, Args&) { return Value::string(py_title(s.s)); });
      if (name == "capitalize") return bind([](const Value& s, Args&) { return Value::string(py_capitalize(s.s)); });
      if (name == "format") return bind([](const Value& s, Args& a) { return Value::string(brace_format(s.s, a.a)); });
      if (name == "find" || name == "rfind" || name == "index" || name == "rindex") {
        bool right = name[0] == 'r';
        bool raise = name.find("index") != std::string::npos;
        return bind([right, raise](const Value& s, Args& a) {
          const Value* sub = a.get(0, "sub");
          if (!sub || !sub->is_string()) throw ValueError("find() expects a string");
          size_t p = right ? s.s.rfind(sub->s) : s.s.find(sub->s);
          if (p == std::string::npos) {
            if (raise) throw ValueError("substring not found");
            return Value::integer(-1);
          }
          return Value::integer(static_cast<int64_t>(utf8_decode(s.s.substr(0, p)).size()));
        });
      }
      if (name == "count")
        return bind([](const Value& s, Args& a) {
          const Value* sub = a.get(0, "sub");
          if (!sub || !sub->is_string()) throw ValueError("count() expects a string");
          if (sub->s.empty()) return Value::integer(static_cast<int64_t>(utf8_decode(s.s).size()) + 1);
          int64_t n = 0;
          for (size_t p = s.s.find(sub->s); p != std::string::npos; p = s.s.find(sub->s, p + sub->s.size())) ++n;
          return Value::integer(n);
        });
      if (name == "join")
        return bind([](const Value& s, Args& a) {
          const Value* seq = a.get(0, "iterable");
          if (!seq) throw ValueError("join() takes exactly one argument");
          std::string out;
          bool first = true;
          for (auto& x : iterate(*seq)) {
            if (!x.is_string()) throw ValueError(std::string("sequence item: expected str instance, ") + x.type_name() + " found");
            if (!first) out += s.s;
            first = false;
            out += x.s;
          }
          return Value::string(out);
        });
      if (name == "splitlines")
        return bind([](const Value& s, Args& a) {
          bool keep = a.value(0, "keepends", Value::boolean(false)).truthy();
          std::vector<Value> items;
          size_t p = 0;
          while (p < s.s.size()) {
            size_t q = s.s.find_first_of("\r\n", p);
            if (q == std::string::npos) {
              items.push_back(Value::string(s.s.substr(p)));
              break;
            }
            size_t e = q + ((s.s[q] == '\r' && q + 1 < s.s.size() && s.s[q + 1] == '\n') ? 2 : 1);
            items.push_back(Value::string(s.s.substr(p, (keep ? e : q) - p)));
            p = e;
          }
          return Value::new_list(std::move(items));
        });
      if (name == "removeprefix" || name == "removesuffix") {
        bool prefix = name == "removeprefix";
        return bind([prefix](const Value& s, Args& a) {
          const Value* x = a.get(0, "affix");
          if (!x || !x->is_string()) throw ValueError("removeprefix/removesuffix expects a string");
          if (prefix && s.s.compare(0, x->s.size(), x->s) == 0) return Value::string(s.s.substr(x->s.size()));
          if (!prefix && x->s.size() <= s.s.size() && s.s.compare(s.s.size() - x->s.size(), x->s.size(), x->s) == 0)
            return Value::string(s.s.substr(0, s.s.size() - x->s.size()));
          return s;
        });
      }
      if (name == "isdigit" || name == "isalpha" || name == "isalnum" || name == "isspace" || name == "islower" ||
          name == "isupper") {
        std::string n = name;
        return bind([n](const Value& s, Args&) {
          std::u32string u = utf8_decode(s.s);
          if (u.empty()) return Value::boolean(false);
          if (n == "islower" || n == "isupper") {
            bool any = false;
            for (char32_t c : u) {
              if (!is_cased(c)) continue;
              any = true;
              auto ci = static_cast<utf8proc_int32_t>(c);
              bool ok = n == "islower" ? utf8proc_tolower(ci) == ci : utf8proc_toupper(ci) == ci;
              if (!ok) return Value::boolean(false);
            }
            return Value::boolean(any);
          }
          for (char32_t c : u) {
            auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
            bool alpha = cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO;
            bool digit = cat == UTF8PROC_CATEGORY_ND;
            bool ok = n == "isdigit" ? digit : n == "isalpha" ? alpha : n == "isalnum" ? (alpha || digit) : py_isspace(c);
            if (!ok) return Value::boolean(false);
          }
          return Value::boolean(true);
        });
      }
      return Value::undefined();
    }
    if (self.is_dict()) {
      if (name == "get")
        return bind([](const Value& d, Args& a) {
          const Value* k = a.get(0, "key");
          if (!k) throw ValueError("get expected at least 1 argument");
          if (k->is_string())
            if (const Value* v = d.dict->find(k->s)) return *v;
          return a.value(1, "default", Value::none());
        });
      if (name == "items")
        return bind([](const Value& d, Args&) {
          std::vector<Value> items;
          for (auto& [k, v] : d.dict->items) items.push_back(Value::new_list({Value::string(k), v}, true));
          return Value::new_list(std::move(items));
        });
      if (name == "keys")
        return bind([](const Value& d, Args&) {
          std::vector<Value> items;
          for (auto& [k, v] : d.dict->items) items.push_back(Value::string(k));
          return Value::new_list(std::move(items));
        });
      if (name == "values")
        return bind([](const Value& d, Args&) {
          std::vector<Value> items;
          for (auto& [k, v] : d.dict->items) items.push_back(v);
          return Value::new_list(std::move(items));
        });
      return Value::undefined();
    }
    if (self.is_list()) {
      if (name == "index")
        return bind([](const Value& l, Args& a) {
          const Value* x = a.get(0, "value");
          if (!x) throw ValueError("index expected 1 argument");
          for (size_t k = 0; k < l.list->items.size(); ++k)
            if (equals(l.list->items[k], *x)) return Value::integer(static_cast<int64_t>(k));
          throw ValueError(x->repr() + " is not in list");
        });
      if (name == "count")
        return bind([](const Value& l, Args& a) {
          const Value* x = a.get(0, "value");
          if (!x) throw ValueError("count expected 1 argument");
          int64_t n = 0;
          for (auto& it : l.list->items) n += equals(it, *x);
          return Value::integer(n);
        });
    }
    return Value::undefined();
  }

  Value apply_filters(const std::vector<ExprP>& filters, Value v, const ScopeP& sc) {
    for (const auto& f : filters) {
      CallArgs args = eval_args(*f, sc);
      pos_ = f->pos;
      v = apply_filter(f->name, v, args);
    }
    return v;
  }

  // Looks up attribute paths like "a.b" (map / selectattr / sort / join attribute=).
  Value attr_path(const Value& v, const std::string& path) {
    Value cur = v;
    size_t p = 0;
    while (true) {
      size_t q = path.find('.', p);
      std::string part = path.substr(p, q == std::string::npos ? std::string::npos : q - p);
      if (cur.is_undefined()) return cur;
      if (!part.empty() && std::all_of(part.begin(), part.end(), is_digit))
        cur = get_item(cur, Value::integer(std::stoll(part)));
      else
        cur = get_item(cur, Value::string(part));
      if (q == std::string::npos) return cur;
      p = q + 1;
    }
  }

  Value apply_filter(const std::string& name, const Value& in, CallArgs& ca) {
    Args a{ca, name.c_str()};
    if (name == "length" || name == "count") return Value::integer(length(in));
    if (name == "trim") return Value::string(py_strip(in.str(), a.get(0, "chars"), true, true));
    if (name == "string") return Value::string(in.str());
    if (name == "safe") return in;
    if (name == "escape" || name == "e") return Value::string(html_escape(in.str()));
    if (name == "upper") return Value::string(upper(in.str()));
    if (name == "lower") return Value::string(lower(in.str()));
    if (name == "capitalize") return Value::string(py_capitalize(in.str()));
    if (name == "title") return Value::string(jinja_title(in.str()));
    if (name == "tojson") {
      // Hugging Face's tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False).
      DumpOptions opt;
      opt.ensure_ascii = a.value(0, "ensure_ascii", Value::boolean(false)).truthy();
      Value indent = a.value(1, "indent", Value::none());
      if (!indent.is_none()) {
        opt.indent = static_cast<int>(to_int(indent, "indent"));
        if (opt.indent < 0) opt.indent = 0;
        opt.item_sep = ",";
      }
      Value seps = a.value(2, "separators", Value::none());
      if (!seps.is_none()) {
        if (!seps.is_list() || seps.list->items.size() != 2 || !seps.list->items[0].is_string() ||
            !seps.list->items[1].is_string())
          throw ValueError("tojson separators must be a pair of strings");
        opt.item_sep = seps.list->items[0].s;
        opt.key_sep = seps.list->items[1].s;
      }
      opt.sort_keys = a.value(3, "sort_keys", Value::boolean(false)).truthy();
      return Value::string(dumps(in, opt));
    }
    if (name == "items") {
      if (in.is_undefined()) return Value::new_list();
      if (!in.is_dict()) throw ValueError("Can only get item pairs from a mapping.");
      std::vector<Value> items;
      for (auto& [k, v] : in.dict->items) items.push_back(Value::new_list({Value::string(k), v}, true));
      return Value::new_list(std::move(items));
    }
    if (name == "default" || name == "d") {
      bool boolean = a.value(1, "boolean", Value::boolean(false)).truthy();
      if (in.is_undefined() || (boolean && !in.truthy())) return a.value(0, "default_value", Value::string(""));
      return in;
    }
    if (name == "join") {
      std::string sep = a.value(0, "d", Value::string("")).str();
      const Value* attr = a.get(1, "attribute");
      std::string out;
      bool first = true;
      for (auto& x : iterate(in)) {
        if (!first) out += sep;
        first = false;
        out += (attr ? attr_path(x, attr->str()) : x).str();
      }
      return Value::string(out);
    }
    if (name == "list") return Value::new_list(iterate(in));
    if (name == "first" || name == "last") {
      std::vector<Value> items = iterate(in);
      if (items.empty()) return Value::undefined("No " + name + " item, sequence was empty.");
      return name == "first" ? items.front() : items.back();
    }
    if ((name == "int" || name == "float") && in.is_undefined()) undefined_error(in);  // int(Undefined) raises
    if (name == "int") {
      Value def = a.value(0, "default", Value::integer(0));
      int64_t base = to_int(a.value(1, "base", Value::integer(10)), "base");
      if (in.kind == Value::kInt) return in;
      if (in.kind == Value::kBool) return Value::integer(in.b);
      if (in.kind == Value::kFloat) return std::isfinite(in.f) ? Value::integer(static_cast<int64_t>(in.f)) : def;
      if (in.is_string()) {
        std::string s = py_strip(in.s, nullptr, true, true);
        try {
          size_t used = 0;
          int64_t v = std::stoll(s, &used, static_cast<int>(base));
          if (used == s.size()) return Value::integer(v);
        } catch (const std::exception&) {
        }
        try {
          size_t used = 0;
          double d = std::stod(s, &used);
          if (used == s.size() && std::isfinite(d)) return Value::integer(static_cast<int64_t>(d));
        } catch (const std::exception&) {
        }
      }
      return def;
    }
    if (name == "float") {
      Value def = a.value(0, "default", Value::real(0.0));
      if (in.is_number()) return Value::real(in.as_double());
      if (in.is_string()) {
        std::string s = py_strip(in.s, nullptr, true, true);
        try {
          size_t used = 0;
          double d = std::stod(s, &used);
          if (used == s.size()) return Value::real(d);
        } catch (const std::exception&) {
        }
      }
      return def;
    }
    if (name == "abs") {
      if (in.kind == Value::kFloat) return Value::real(std::fabs(in.f));
      if (in.kind == Value::kInt || in.kind == Value::kBool) {
        int64_t x = in.kind == Value::kBool ? in.b : in.i;
        return Value::integer(x < 0 ? -x : x);
      }
      throw ValueError(std::string("bad operand type for abs(): '") + in.type_name() + "'");
    }
    if (name == "round") {
      int64_t prec = to_int(a.value(0, "precision", Value::integer(0)), "precision");
      std::string method = a.value(1, "method", Value::string("common")).str();
      if ((method == "common" || method.empty()) && (in.kind == Value::kInt || in.kind == Value::kBool) && prec >= 0)
        return Value::integer(in.kind == Value::kBool ? in.b : in.i);  // Python's round(int, n) stays an int
      double x = in.as_double();
      double m = std::pow(10.0, static_cast<double>(prec));
      if (method == "ceil") return Value::real(std::ceil(x * m) / m);
      if (method == "floor") return Value::real(std::floor(x * m) / m);
      if (method != "common") throw ValueError("method must be common, ceil or floor");
      if (!std::isfinite(x)) return Value::real(x);
      if (prec < 0) return Value::real(std::nearbyint(x * m) / m);
      // Python's round(): correctly rounded, ties to even on the exact binary value (as printf does).
      char buf[512];
      std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(std::min<int64_t>(prec, 300)), x);
      return Value::real(std::strtod(buf, nullptr));
    }
    if (name == "reverse") {
      if (in.is_string()) {
        std::u32string s = utf8_decode(in.s);
        std::reverse(s.begin(), s.end());
        return Value::string(utf8_encode(s));
      }
      std::vector<Value> items = iterate(in);
      std::reverse(items.begin(), items.end());
      return Value::new_list(std::move(items));
    }
    if (name == "unique") {
      bool cs = a.value(0, "case_sensitive", Value::boolean(false)).truthy();
      const Value* attr = a.get(1, "attribute");
      std::vector<Value> out, keys;
      for (auto& x : iterate(in)) {
        Value key = attr ? attr_path(x, attr->str()) : x;
        if (!cs && key.is_string()) key = Value::string(lower(key.s));
        bool seen = false;
        for (auto& k : keys)
          if (equals(k, key)) seen = true;
        if (!seen) {
          keys.push_back(key);
          out.push_back(x);
        }
      }
      return Value::new_list(std::move(out));
    }
    if (name == "map") {
      std::vector<Value> out;
      const Value* attr = nullptr;
      for (auto& [k, v] : ca.kw)
        if (k == "attribute") attr = &v;
      if (attr) {
        const Value* def = nullptr;
        for (auto& [k, v] : ca.kw)
          if (k == "default") def = &v;
        for (auto& x : iterate(in)) {
          Value v = attr_path(x, attr->str());
          out.push_back(v.is_undefined() && def ? *def : v);
        }
        return Value::new_list(std::move(out));
      }
      if (ca.pos.empty() || !ca.pos[0].is_string()) throw ValueError("map() expects a filter name or attribute=");
      std::string fname = ca.pos[0].s;
      if (!known_filters().count(fname)) throw ValueError("no filter named '" + fname + "'");
      CallArgs rest;
      rest.pos.assign(ca.pos.begin() + 1, ca.pos.end());
      rest.kw = ca.kw;
      for (auto& x : iterate(in)) {
        CallArgs copy = rest;
        out.push_back(apply_filter(fname, x, copy));
      }
      return Value::new_list(std::move(out));
    }
    if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
      bool want = name == "select" || name == "selectattr";
      bool by_attr = name == "selectattr" || name == "rejectattr";
      size_t k0 = 0;
      std::string attr;
      if (by_attr) {
        if (ca.pos.empty()) throw ValueError(name + "() expects an attribute name");
        attr = ca.pos[0].str();
        k0 = 1;
      }
      std::string test;
      CallArgs targs;
      if (ca.pos.size() > k0) {
        test = ca.pos[k0].str();
        if (!known_tests().count(test)) throw ValueError("no test named '" + test + "'");
        targs.pos.assign(ca.pos.begin() + k0 + 1, ca.pos.end());
      }
      std::vector<Value> out;
      for (auto& x : iterate(in)) {
        Value v = by_attr ? attr_path(x, attr) : x;
        CallArgs copy = targs;
        bool r = test.empty() ? v.truthy() : apply_test(test, v, copy);
        if (r == want) out.push_back(x);
      }
      return Value::new_list(std::move(out));
    }
    if (name == "sort" || name == "min" || name == "max") {
      bool reverse = false;
      size_t k = 0;
      if (name == "sort") reverse = a.value(k++, "reverse", Value::boolean(false)).truthy();
      bool cs = a.value(k++, "case_sensitive", Value::boolean(false)).truthy();
      const Value* attr = a.get(k, "attribute");
      std::vector<Value> items = iterate(in);
      auto key = [&](const Value& x) {
        Value v = attr ? attr_path(x, attr->str()) : x;
        if (!cs && v.is_string()) v = Value::string(lower(v.s));
        return v;
      };
      if (name == "sort") {
        std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
          int c = compare(key(x), key(y));
          return reverse ? c > 0 : c < 0;
        });
        return Value::new_list(std::move(items));
      }
      if (items.empty()) return Value::undefined("No " + name + " item, sequence was empty.");
      size_t best = 0;
      for (size_t j = 1; j < items.size(); ++j) {
        int c = compare(key(items[j]), key(items[best]));
        if (name == "min" ? c < 0 : c > 0) best = j;
      }
      return items[best];
    }
    if (name == "sum") {
      const Value* attr = a.get(0, "attribute");
      Value total = a.value(1, "start", Value::integer(0));
      for (auto& x : iterate(in)) total = binop("+", total, attr ? attr_path(x, attr->str()) : x);
      return total;
    }
    if (name == "replace") {
      const Value* o = a.get(0, "old");
      const Value* n = a.get(1, "new");
      if (!o || !n) throw ValueError("replace() expects two arguments");
      int64_t count = -1;
      if (const Value* c = a.get(2, "count"); c && !c->is_none()) count = to_int(*c, "count");
      return Value::string(py_replace(in.str(), o->str(), n->str(), count));
    }
    if (name == "indent") {
      Value w = a.value(0, "width", Value::integer(4));
      std::string pad = w.is_string() ? w.s : std::string(static_cast<size_t>(std::max<int64_t>(0, to_int(w, "width"))), ' ');
      bool first = a.value(1, "first", Value::boolean(false)).truthy();
      bool blank = a.value(2, "blank", Value::boolean(false)).truthy();
      std::string s = in.str(), out;
      std::vector<std::string> lines;
      size_t p = 0;
      while (true) {
        size_t q = s.find('\n', p);
        if (q == std::string::npos) {
          lines.push_back(s.substr(p));
          break;
        }
        lines.push_back(s.substr(p, q - p));
        p = q + 1;
      }
      for (size_t k = 0; k < lines.size(); ++k) {
        if (k) out += "\n";
        bool do_pad = k == 0 ? first : (blank || !lines[k].empty());
        if (do_pad) out += pad;
        out += lines[k];
      }
      return Value::string(out);
    }
    if (name == "format") {
      if (ca.pos.size() == 1) return Value::string(percent_format(in.str(), ca.pos[0]));
      return Value::string(percent_format(in.str(), Value::new_list(ca.pos, true)));
    }
    if (name == "attr") {
      const Value* n = a.get(0, "name");
      if (!n) throw ValueError("attr() expects a name");
      return get_attr(in, n->str());
    }
    if (name == "wordcount") {  // jinja2: number of \w+ runs
      int64_t n = 0;
      bool in_word = false;
      for (char32_t c : utf8_decode(in.str())) {
        auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
        bool w = c == U'_' || (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
                 (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO) || cat == UTF8PROC_CATEGORY_MN ||
                 cat == UTF8PROC_CATEGORY_MC;
        if (w && !in_word) ++n;
        in_word = w;
      }
      return Value::integer(n);
    }
    if (name == "center") {
      int64_t width = to_int(a.value(0, "width", Value::integer(80)), "width");
      std::u32string s = utf8_decode(in.str());
      int64_t n = static_cast<int64_t>(s.size());
      if (width <= n) return Value::string(in.str());
      int64_t marg = width - n;
      int64_t left = marg / 2 + (marg & width & 1);
      return Value::string(std::string(left, ' ') + in.str() + std::string(marg - left, ' '));
    }
    if (name == "dictsort") {
      if (!in.is_dict()) throw ValueError("dictsort expects a mapping");
      bool cs = a.value(0, "case_sensitive", Value::boolean(false)).truthy();
      bool by_value = a.value(1, "by", Value::string("key")).str() == "value";
      bool rev = a.value(2, "reverse", Value::boolean(false)).truthy();
      std::vector<Value> items;
      for (auto& [k, v] : in.dict->items) items.push_back(Value::new_list({Value::string(k), v}, true));
      std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
        Value kx = x.list->items[by_value], ky = y.list->items[by_value];
        if (!cs && kx.is_string()) kx = Value::string(lower(kx.s));
        if (!cs && ky.is_string()) ky = Value::string(lower(ky.s));
        int c = compare(kx, ky);
        return rev ? c > 0 : c < 0;
      });
      return Value::new_list(std::move(items));
    }
    throw ValueError("no filter named '" + name + "'");
  }

  bool apply_test(const std::string& name, const Value& v, CallArgs& ca) {
    Args a{ca, name.c_str()};
    auto arg0 = [&]() -> const Value& {
      const Value* x = a.get(0, "other");
      if (!x) throw ValueError("test '" + name + "' expects an argument");
      return *x;
    };
    if (name == "defined") return !v.is_undefined();
    if (name == "undefined") return v.is_undefined();
    if (name == "none") return v.is_none();
    if (name == "string") return v.is_string();
    if (name == "mapping") return v.is_dict();
    if (name == "iterable" || name == "sequence")
      return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
    if (name == "number") return v.is_number();
    if (name == "integer") return v.kind == Value::kInt;
    if (name == "float") return v.kind == Value::kFloat;
    if (name == "boolean") return v.kind == Value::kBool;
    if (name == "true") return v.kind == Value::kBool && v.b;
    if (name == "false") return v.kind == Value::kBool && !v.b;
    if (name == "callable") return v.kind == Value::kFunction || v.is_undefined();  // jinja2's Undefined has __call__
    if (name == "escaped") return false;
    if (name == "in") return contains(arg0(), v);
    if (name == "eq" || name == "equalto" || name == "==") return equals(v, arg0());
    if (name == "ne" || name == "!=") return !equals(v, arg0());
    if (name == "lt" || name == "lessthan" || name == "<") return compare_op("<", v, arg0());
    if (name == "le" || name == "<=") return compare_op("<=", v, arg0());
    if (name == "gt" || name == "greaterthan" || name == ">") return compare_op(">", v, arg0());
    if (name == "ge" || name == ">=") return compare_op(">=", v, arg0());
    if (name == "odd") return equals(binop("%", v, Value::integer(2)), Value::integer(1));  // value % 2 == 1
    if (name == "even") return equals(binop("%", v, Value::integer(2)), Value::integer(0));
    if (name == "divisibleby") return equals(binop("%", v, arg0()), Value::integer(0));
    if (name == "lower" || name == "upper") {  // jinja2: str(value).islower() / .isupper()
      bool any = false;
      for (char32_t c : utf8_decode(v.str())) {
        if (!is_cased(c)) continue;
        any = true;
        auto ci = static_cast<utf8proc_int32_t>(c);
        if (name == "lower" ? utf8proc_tolower(ci) != ci : utf8proc_toupper(ci) != ci) return false;
      }
      return any;
    }
    if (name == "sameas") {
      const Value& o = arg0();
      if (v.kind != o.kind) return false;
      switch (v.kind) {
        case Value::kList: return v.list == o.list;
        case Value::kDict:
        case Value::kNamespace: return v.dict == o.dict;
        case Value::kFunction: return v.fn == o.fn;
        default: return equals(v, o);
      }
    }
    throw ValueError("no test named '" + name + "'");
  }
};

}  // namespace

Template::Template(const std::string& source, const std::string& origin, Options options)
    : impl_(std::make_unique<Impl>()) {
  impl_->origin = origin;
  impl_->options = options;
  // jinja2 normalises \r\n and \r to \n and (keep_trailing_newline=False) drops one trailing newline.
  std::string& src = impl_->source;
  src.reserve(source.size());
  for (size_t k = 0; k < source.size(); ++k) {
    if (source[k] == '\r') {
      src += '\n';
      if (k + 1 < source.size() && source[k + 1] == '\n') ++k;
    } else {
      src += source[k];
    }
  }
  if (!options.keep_trailing_newline && !src.empty() && src.back() == '\n') src.pop_back();
  impl_->line_starts.push_back(0);
  for (size_t k = 0; k < src.size(); ++k)
    if (src[k] == '\n') impl_->line_starts.push_back(k + 1);
  Lexer lexer(*impl_);
  Parser parser(*impl_, lexer.run());
  impl_->body = parser.parse_template();
}

Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

const std::string& Template::origin() const { return impl_->origin; }

std::string Template::render(const nlohmann::ordered_json& variables) const {
  Interp interp(*impl_);
  return interp.render(variables);
}

}  // namespace lilac::jinja
