// Python semantics for Jinja values: str/repr, equality, ordering, truthiness, json.dumps.
#include "text/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace lilac::jinja {

Value Value::undefined(std::string hint) {
  Value v;
  v.kind = kUndefined;
  v.s = std::move(hint);
  return v;
}
Value Value::none() {
  Value v;
  v.kind = kNone;
  return v;
}
Value Value::boolean(bool x) {
  Value v;
  v.kind = kBool;
  v.b = x;
  return v;
}
Value Value::integer(int64_t x) {
  Value v;
  v.kind = kInt;
  v.i = x;
  return v;
}
Value Value::real(double x) {
  Value v;
  v.kind = kFloat;
  v.f = x;
  return v;
}
Value Value::string(std::string x) {
  Value v;
  v.kind = kString;
  v.s = std::move(x);
  return v;
}
Value Value::new_list(std::vector<Value> items, bool tuple) {
  Value v;
  v.kind = kList;
  v.list = std::make_shared<ListData>();
  v.list->items = std::move(items);
  v.list->tuple = tuple;
  return v;
}
Value Value::new_dict() {
  Value v;
  v.kind = kDict;
  v.dict = std::make_shared<DictData>();
  return v;
}
Value Value::new_namespace() {
  Value v;
  v.kind = kNamespace;
  v.dict = std::make_shared<DictData>();
  return v;
}
Value Value::function(std::string name, std::function<Value(CallArgs&)> call) {
  Value v;
  v.kind = kFunction;
  v.fn = std::make_shared<FuncData>();
  v.fn->name = std::move(name);
  v.fn->call = std::move(call);
  return v;
}

Value Value::from_json(const nlohmann::ordered_json& j, int depth) {
  using nlohmann::ordered_json;
  if (depth > kMaxDepth) throw ValueError("template variables nested too deeply");
  switch (j.type()) {
    case ordered_json::value_t::null: return none();
    case ordered_json::value_t::boolean: return boolean(j.get<bool>());
    case ordered_json::value_t::number_integer: return integer(j.get<int64_t>());
    case ordered_json::value_t::number_unsigned: {
      uint64_t u = j.get<uint64_t>();
      if (u <= static_cast<uint64_t>(INT64_MAX)) return integer(static_cast<int64_t>(u));
      return real(static_cast<double>(u));
    }
    case ordered_json::value_t::number_float: return real(j.get<double>());
    case ordered_json::value_t::string: return string(j.get<std::string>());
    case ordered_json::value_t::array: {
      Value v = new_list();
      v.list->items.reserve(j.size());
      for (const auto& e : j) v.list->items.push_back(from_json(e, depth + 1));
      return v;
    }
    case ordered_json::value_t::object: {
      Value v = new_dict();
      v.dict->items.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it) v.dict->items.emplace_back(it.key(), from_json(it.value(), depth + 1));
      return v;
    }
    default: return undefined("unsupported JSON value");
  }
}

const Value* DictData::find(const std::string& key) const {
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}
Value* DictData::find(const std::string& key) {
  for (auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}
void DictData::set(const std::string& key, Value v) {
  if (Value* p = find(key)) {
    *p = std::move(v);
    return;
  }
  items.emplace_back(key, std::move(v));
}

bool Value::truthy() const {
  switch (kind) {
    case kUndefined:
    case kNone: return false;
    case kBool: return b;
    case kInt: return i != 0;
    case kFloat: return f != 0.0;
    case kString: return !s.empty();
    case kList: return !list->items.empty();
    case kDict: return !dict->items.empty();
    case kNamespace:
    case kFunction: return true;
  }
  return false;
}

const char* Value::type_name() const {
  switch (kind) {
    case kUndefined: return "Undefined";
    case kNone: return "NoneType";
    case kBool: return "bool";
    case kInt: return "int";
    case kFloat: return "float";
    case kString: return "str";
    case kList: return list->tuple ? "tuple" : "list";
    case kDict: return "dict";
    case kNamespace: return "Namespace";
    case kFunction: return "function";
  }
  return "?";
}

double Value::as_double() const {
  if (kind == kInt) return static_cast<double>(i);
  if (kind == kFloat) return f;
  if (kind == kBool) return b ? 1.0 : 0.0;
  throw ValueError(std::string("expected a number, got ") + type_name());
}

std::string float_repr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  if (v == 0) return std::signbit(v) ? "-0.0" : "0.0";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  bool neg = false;
  size_t p = 0;
  if (sci[0] == '-') {
    neg = true;
    p = 1;
  }
  size_t epos = sci.find('e');
  std::string mant = sci.substr(p, epos - p);
  int exp = std::stoi(sci.substr(epos + 1));
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string out = neg ? "-" : "";
  if (exp < -4 || exp >= 16) {
    out += digits[0];
    if (digits.size() > 1) {
      out += '.';
      out.append(digits, 1, std::string::npos);
    }
    char e[16];
    std::snprintf(e, sizeof e, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    out += e;
  } else if (exp >= 0) {
    size_t int_len = static_cast<size_t>(exp) + 1;
    if (digits.size() <= int_len) {
      out += digits + std::string(int_len - digits.size(), '0') + ".0";
    } else {
      out.append(digits, 0, int_len);
      out += '.';
      out.append(digits, int_len, std::string::npos);
    }
  } else {
    out += "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
  }
  return out;
}

void utf8_append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::u32string utf8_decode(const std::string& s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0, n = s.size();
  while (i < n) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    char32_t cp;
    int len;
    if (c < 0x80) {
      cp = c;
      len = 1;
    } else if ((c >> 5) == 6) {
      cp = c & 0x1F;
      len = 2;
    } else if ((c >> 4) == 14) {
      cp = c & 0x0F;
      len = 3;
    } else if ((c >> 3) == 30) {
      cp = c & 0x07;
      len = 4;
    } else {
      out += U'\uFFFD';
      ++i;
      continue;
    }
    if (i + len > n) {
      out += U'\uFFFD';
      ++i;
      continue;
    }
    bool ok = true;
    for (int k = 1; k < len; ++k) {
      unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc >> 6) != 2) {
        ok = false;
        break;
      }
      cp = (cp << 6) | (cc & 0x3F);
    }
    if (!ok) {
      out += U'\uFFFD';
      ++i;
      continue;
    }
    out += cp;
    i += len;
  }
  return out;
}

std::string utf8_encode(const std::u32string& s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) utf8_append(out, c);
  return out;
}

bool py_isspace(char32_t c) {
  return (c >= 9 && c <= 13) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

static bool py_printable(char32_t c) {
  if (c < 0x20 || c == 0x7F) return false;
  if (c >= 0x80 && c < 0xA0) return false;
  if (c == 0xAD) return false;
  if (py_isspace(c) && c != U' ') return false;
  if (c >= 0xD800 && c < 0xE000) return false;
  return true;
}

std::string string_repr(const std::string& s) {
  bool has_single = s.find('\'') != std::string::npos;
  bool has_double = s.find('"') != std::string::npos;
  char q = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, q);
  for (char32_t c : utf8_decode(s)) {
    if (c == static_cast<char32_t>(q) || c == U'\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == U'\n') {
      out += "\\n";
    } else if (c == U'\r') {
      out += "\\r";
    } else if (c == U'\t') {
      out += "\\t";
    } else if (!py_printable(c)) {
      char buf[16];
      if (c < 0x100)
        std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(c));
      else if (c < 0x10000)
        std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      else
        std::snprintf(buf, sizeof buf, "\\U%08x", static_cast<unsigned>(c));
      out += buf;
    } else {
      utf8_append(out, c);
    }
  }
  out += q;
  return out;
}

std::string Value::repr() const {
  switch (kind) {
    case kUndefined: return "Undefined";  // jinja2's Undefined.__repr__ (str() of it is "")
    case kString: return string_repr(s);
    case kList: {
      std::string out = list->tuple ? "(" : "[";
      for (size_t k = 0; k < list->items.size(); ++k) {
        if (k) out += ", ";
        out += list->items[k].repr();
      }
      if (list->tuple && list->items.size() == 1) out += ",";
      out += list->tuple ? ")" : "]";
      return out;
    }
    case kDict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, v] : dict->items) {
        if (!first) out += ", ";
        first = false;
        out += string_repr(k) + ": " + v.repr();
      }
      return out + "}";
    }
    default: return str();
  }
}

std::string Value::str() const {
  switch (kind) {
    case kUndefined: return "";
    case kNone: return "None";
    case kBool: return b ? "True" : "False";
    case kInt: return std::to_string(i);
    case kFloat: return float_repr(f);
    case kString: return s;
    case kList:
    case kDict: return repr();
    case kNamespace: {
      Value d;
      d.kind = kDict;
      d.dict = dict;
      return "<Namespace " + d.repr() + ">";
    }
    case kFunction: return "<function " + fn->name + ">";
  }
  return "";
}

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind != Value::kFloat && b.kind != Value::kFloat) {
      int64_t x = a.kind == Value::kBool ? a.b : a.i;
      int64_t y = b.kind == Value::kBool ? b.b : b.i;
      return x == y;
    }
    return a.as_double() == b.as_double();
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Value::kUndefined:
    case Value::kNone: return true;
    case Value::kString: return a.s == b.s;
    case Value::kList: {
      if (a.list->tuple != b.list->tuple) return false;
      if (a.list->items.size() != b.list->items.size()) return false;
      for (size_t k = 0; k < a.list->items.size(); ++k)
        if (!equals(a.list->items[k], b.list->items[k])) return false;
      return true;
    }
    case Value::kDict: {
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [k, v] : a.dict->items) {
        const Value* o = b.dict->find(k);
        if (!o || !equals(v, *o)) return false;
      }
      return true;
    }
    case Value::kNamespace: return a.dict == b.dict;
    case Value::kFunction: return a.fn == b.fn;
    default: return false;
  }
}

int compare(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind != Value::kFloat && b.kind != Value::kFloat) {
      int64_t x = a.kind == Value::kBool ? a.b : a.i;
      int64_t y = b.kind == Value::kBool ? b.b : b.i;
      return x < y ? -1 : (x > y ? 1 : 0);
    }
    double x = a.as_double(), y = b.as_double();
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    int c = a.s.compare(b.s);  // UTF-8 byte order == code point order
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.is_list() && b.is_list() && a.list->tuple == b.list->tuple) {
    const auto& x = a.list->items;
    const auto& y = b.list->items;
    for (size_t k = 0; k < x.size() && k < y.size(); ++k) {
      if (equals(x[k], y[k])) continue;
      return compare(x[k], y[k]);
    }
    return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
  }
  throw ValueError(std::string("'<' not supported between instances of '") + a.type_name() + "' and '" +
                   b.type_name() + "'");
}

static void dump_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  auto esc_u = [&](unsigned c) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "\\u%04x", c);
    out += buf;
  };
  if (!ensure_ascii) {
    for (char ch : s) {
      unsigned char c = static_cast<unsigned char>(ch);
      switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        case '\b': out += "\\b"; break;
        case '\f': out += "\\f"; break;
        default:
          if (c < 0x20)
            esc_u(c);
          else
            out += ch;
      }
    }
  } else {
    for (char32_t c : utf8_decode(s)) {
      switch (c) {
        case U'"': out += "\\\""; break;
        case U'\\': out += "\\\\"; break;
        case U'\n': out += "\\n"; break;
        case U'\r': out += "\\r"; break;
        case U'\t': out += "\\t"; break;
        case U'\b': out += "\\b"; break;
        case U'\f': out += "\\f"; break;
        default:
          if (c < 0x20 || c > 0x7E) {
            if (c >= 0x10000) {
              char32_t v = c - 0x10000;
              esc_u(0xD800 | static_cast<unsigned>(v >> 10));
              esc_u(0xDC00 | static_cast<unsigned>(v & 0x3FF));
            } else {
              esc_u(static_cast<unsigned>(c));
            }
          } else {
            out += static_cast<char>(c);
          }
      }
    }
  }
  out += '"';
}

static void dump_rec(std::string& out, const Value& v, const DumpOptions& opt, int level) {
  if (level > 4 * Value::kMaxDepth) throw ValueError("value nested too deeply for tojson");
  auto newline = [&](int lvl) {
    out += '\n';
    out.append(static_cast<size_t>(opt.indent) * static_cast<size_t>(lvl), ' ');
  };
  switch (v.kind) {
    case Value::kNone: out += "null"; return;
    case Value::kBool: out += v.b ? "true" : "false"; return;
    case Value::kInt: out += std::to_string(v.i); return;
    case Value::kFloat:
      if (std::isnan(v.f))
        out += "NaN";
      else if (std::isinf(v.f))
        out += v.f < 0 ? "-Infinity" : "Infinity";
      else
        out += float_repr(v.f);
      return;
    case Value::kString: dump_string(out, v.s, opt.ensure_ascii); return;
    case Value::kList: {
      const auto& items = v.list->items;
      if (items.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) out += opt.item_sep;
        if (opt.indent >= 0) newline(level + 1);
        dump_rec(out, items[k], opt, level + 1);
      }
      if (opt.indent >= 0) newline(level);
      out += ']';
      return;
    }
    case Value::kDict: {
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.dict->items) items.push_back(&kv);
      if (opt.sort_keys)
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      if (items.empty()) {
        out += "{}";
        return;
      }
      out += '{';
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) out += opt.item_sep;
        if (opt.indent >= 0) newline(level + 1);
        dump_string(out, items[k]->first, opt.ensure_ascii);
        out += opt.key_sep;
        dump_rec(out, items[k]->second, opt, level + 1);
      }
      if (opt.indent >= 0) newline(level);
      out += '}';
      return;
    }
    default:
      throw ValueError(std::string("Object of type ") + v.type_name() + " is not JSON serializable");
  }
}

std::string dumps(const Value& v, const DumpOptions& opt) {
  std::string out;
  dump_rec(out, v, opt, 0);
  return out;
}

}  // namespace lilac::jinja
