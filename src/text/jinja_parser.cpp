// lilac's Jinja subset: the parser (jinja2's grammar) from tokens to the syntax tree of jinja_ast.h.
#include <optional>

#include "text/jinja_ast.h"
#include "text/jinja_builtins.h"

namespace lilac::jinja::detail {

namespace {

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

}  // namespace

Body parse(const Impl& impl, std::vector<Token> tokens) { return Parser(impl, std::move(tokens)).parse_template(); }

}  // namespace lilac::jinja::detail
