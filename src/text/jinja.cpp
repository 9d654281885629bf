// lilac's Jinja subset: the tree-walking interpreter (statements, expressions, scopes, macros) over the
// syntax tree of jinja_ast.h, with Python value semantics (text/jinja_value.h, jinja_builtins.h), and
// the Template class.
#include "text/jinja.h"

#include <unordered_map>

#include "text/jinja_ast.h"
#include "text/jinja_builtins.h"

namespace lilac::jinja {

namespace {

using namespace detail;

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

class Interp {
 public:
  explicit Interp(const Impl& t) : t_(t) {}

  std::string render(const nlohmann::ordered_json& vars) {
    auto globals = std::make_shared<Scope>();
    install_globals(globals->vars);
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

  Value apply_filters(const std::vector<ExprP>& filters, Value v, const ScopeP& sc) {
    for (const auto& f : filters) {
      CallArgs args = eval_args(*f, sc);
      pos_ = f->pos;
      v = apply_filter(f->name, v, args);
    }
    return v;
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
  impl_->body = detail::parse(*impl_, detail::lex(*impl_));
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
