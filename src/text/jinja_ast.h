// lilac's Jinja subset, internal: tokens, the syntax tree, the parsed template (Template::Impl), and the
// lexer and parser entry points. Only src/text/jinja*.cpp include this.
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "text/jinja.h"
#include "text/jinja_value.h"

namespace lilac::jinja {

namespace detail {

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

inline bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
inline bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
inline bool is_name_char(char c) { return is_name_start(c) || (c >= '0' && c <= '9'); }
inline bool is_digit(char c) { return c >= '0' && c <= '9'; }

}  // namespace detail

struct Template::Impl {
  std::string origin;
  Options options;
  std::string source;               // newline-normalised
  std::vector<size_t> line_starts;  // offsets of line starts in `source`
  detail::Body body;

  std::string where(size_t pos) const {
    size_t line = std::upper_bound(line_starts.begin(), line_starts.end(), pos) - line_starts.begin();
    if (line == 0) line = 1;
    size_t col = pos - line_starts[line - 1] + 1;
    return origin + ":" + std::to_string(line) + ":" + std::to_string(col);
  }
  [[noreturn]] void fail(size_t pos, const std::string& msg) const { throw Error(where(pos) + ": " + msg); }
};

namespace detail {

using Impl = Template::Impl;

// Tokens of a template (jinja_lexer.cpp): jinja2's lexer with trim_blocks / lstrip_blocks.
std::vector<Token> lex(const Impl& impl);
// The syntax tree (jinja_parser.cpp): jinja2's grammar. Throws lilac::Error naming line and column.
Body parse(const Impl& impl, std::vector<Token> tokens);

}  // namespace detail
}  // namespace lilac::jinja
