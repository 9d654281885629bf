// lilac's Jinja subset: the filters and tests (jinja2's, with Hugging Face's tojson) and the globals of
// chat templates (range, namespace, dict, raise_exception, strftime_now).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <optional>

#include <utf8proc.h>

#include "text/jinja_ast.h"
#include "text/jinja_builtins.h"

namespace lilac::jinja::detail {

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

void install_globals(std::unordered_map<std::string, Value>& g) {
  g["range"] = Value::function("range", [](CallArgs& a) {
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
  g["namespace"] = Value::function("namespace", [](CallArgs& a) {
    Value ns = Value::new_namespace();
    for (auto& p : a.pos) {
      if (!p.is_dict()) throw ValueError("namespace() positional argument must be a mapping");
      for (auto& [k, v] : p.dict->items) ns.dict->set(k, v);
    }
    for (auto& [k, v] : a.kw) ns.dict->set(k, v);
    return ns;
  });
  g["dict"] = Value::function("dict", [](CallArgs& a) {
    Value d = Value::new_dict();
    for (auto& p : a.pos) {
      if (!p.is_dict()) throw ValueError("dict() positional argument must be a mapping");
      for (auto& [k, v] : p.dict->items) d.dict->set(k, v);
    }
    for (auto& [k, v] : a.kw) d.dict->set(k, v);
    return d;
  });
  g["raise_exception"] = Value::function("raise_exception", [](CallArgs& a) -> Value {
    std::string msg = a.pos.empty() ? std::string("raise_exception() called") : a.pos[0].str();
    throw RaisedError{msg};
  });
  g["strftime_now"] = Value::function("strftime_now", [](CallArgs& a) {
    if (a.pos.size() != 1 || !a.pos[0].is_string()) throw ValueError("strftime_now expects a format string");
    std::time_t now = std::time(nullptr);
    std::tm tm{};
    localtime_r(&now, &tm);
    char buf[256];
    size_t n = std::strftime(buf, sizeof buf, a.pos[0].s.c_str(), &tm);
    return Value::string(std::string(buf, n));
  });
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

namespace {

// Filters on text: length, trim, case, escape, tojson, replace, indent, format, wordcount, center.
std::optional<Value> text_filter(const std::string& name, const Value& in, const Args& a, CallArgs& ca) {
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
  return std::nullopt;
}

// int, float, abs, round.
std::optional<Value> number_filter(const std::string& name, const Value& in, const Args& a, CallArgs& ca) {
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
  return std::nullopt;
}

// Filters over a sequence: join, list, first / last, reverse, unique, map, select / reject(attr), sort, min / max, sum.
std::optional<Value> list_filter(const std::string& name, const Value& in, const Args& a, CallArgs& ca) {
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
  return std::nullopt;
}

// Filters on mappings and attributes: items, default, attr, dictsort.
std::optional<Value> object_filter(const std::string& name, const Value& in, const Args& a, CallArgs& ca) {
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
  if (name == "attr") {
    const Value* n = a.get(0, "name");
    if (!n) throw ValueError("attr() expects a name");
    return get_attr(in, n->str());
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
  return std::nullopt;
}

}  // namespace

Value apply_filter(const std::string& name, const Value& in, CallArgs& ca) {
  Args a{ca, name.c_str()};
  for (auto* group : {text_filter, number_filter, list_filter, object_filter})
    if (std::optional<Value> v = group(name, in, a, ca)) return *v;
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

}  // namespace lilac::jinja::detail
