// lilac's Jinja subset, internal: the Python-compatible builtins the interpreter calls — value operations
// and str / dict / list methods (jinja_pyops.cpp), filters, tests and globals (jinja_filters.cpp).
// They work on Values only (no scopes, no syntax tree); errors are ValueErrors that the interpreter turns
// into lilac::Error with the template position.
#pragma once
#include <cstdint>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "text/jinja_value.h"

namespace lilac::jinja::detail {

// raise_exception(msg) in a template: carries the template's message to the interpreter.
struct RaisedError {
  std::string msg;
};

[[noreturn]] void undefined_error(const Value& v);

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

// ---- Python semantics (jinja_pyops.cpp)
std::vector<int64_t> slice_indices(int64_t len, const Value* start, const Value* stop, const Value* step);
std::string upper(const std::string& s);
std::string lower(const std::string& s);
bool is_cased(char32_t c);
std::string py_title(const std::string& s);
std::string py_capitalize(const std::string& s);
std::string jinja_title(const std::string& s);
std::string py_strip(const std::string& s, const Value* chars, bool left, bool right);
std::vector<std::string> py_split(const std::string& s, const Value* sep, int64_t maxsplit, bool from_right);
std::string py_replace(const std::string& s, const std::string& from, const std::string& to, int64_t count);
std::string html_escape(const std::string& s);
int64_t to_int(const Value& v, const char* what);
std::vector<Value> iterate(const Value& v);
int64_t length(const Value& v);
bool contains(const Value& container, const Value& item);
std::string percent_format(const std::string& fmt, const Value& args);  // "%s" % x
std::string brace_format(const std::string& fmt, CallArgs& a);          // str.format
bool compare_op(const std::string& op, const Value& l, const Value& r);  // ==, !=, in, notin, <, <=, >, >=
Value binop(const std::string& op, const Value& l, const Value& r);      // + - * / // % **
Value slice(const Value& obj, const Value* start, const Value* stop, const Value* step);
Value get_item(const Value& obj, const Value& key);
Value get_attr(const Value& obj, const std::string& name);
Value method(const Value& self, const std::string& name);  // bound method, or undefined

// ---- filters, tests, globals (jinja_filters.cpp)
const std::unordered_set<std::string>& known_filters();
const std::unordered_set<std::string>& known_tests();
Value attr_path(const Value& v, const std::string& path);  // "a.b" / "0.name" (map / sort attribute=)
Value apply_filter(const std::string& name, const Value& in, CallArgs& ca);
bool apply_test(const std::string& name, const Value& v, CallArgs& ca);
void install_globals(std::unordered_map<std::string, Value>& vars);

}  // namespace lilac::jinja::detail
