// lilac's Jinja subset: Python value semantics the interpreter and the filters share: slices, str
// helpers (case mapping, strip, split, replace), iteration, len / in, % and str.format formatting,
// arithmetic and comparison operators, item and attribute access, and the read-only methods of str,
// dict and list that jinja2's immutable sandbox allows.
#include <cmath>
#include <functional>
#include <optional>

#include <utf8proc.h>

#include "text/jinja_ast.h"
#include "text/jinja_builtins.h"

namespace lilac::jinja::detail {

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

namespace {

using Binder = std::function<Value(std::function<Value(const Value&, Args&)>)>;

// str methods (split, strip, startswith, ...): a bound method, or undefined.
Value str_method(const std::string& name, const Binder& bind) {
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

// dict methods (get, items, keys, values).
Value dict_method(const std::string& name, const Binder& bind) {
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

// list methods (index, count).
Value list_method(const std::string& name, const Binder& bind) {
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
  return Value::undefined();
}

}  // namespace

// Bound methods of str, dict and list (the read-only ones jinja2's immutable sandbox allows).
Value method(const Value& self, const std::string& name) {
  const std::string fname = std::string(self.type_name()) + "." + name;
  Binder bind = [&](std::function<Value(const Value&, Args&)> f) {
    Value s = self;
    std::string fn = fname;
    return Value::function(fname, [s, f, fn](CallArgs& a) {
      Args args{a, fn.c_str()};
      return f(s, args);
    });
  };
  if (self.is_string()) return str_method(name, bind);
  if (self.is_dict()) return dict_method(name, bind);
  if (self.is_list()) return list_method(name, bind);
  return Value::undefined();
}

}  // namespace lilac::jinja::detail
