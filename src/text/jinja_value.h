// Values of lilac's Jinja subset interpreter, with Python semantics (str/repr, ==, ordering,
// truthiness) and Python's json.dumps for the tojson filter. Used by the interpreter (text/jinja.cpp) and its builtins.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace lilac::jinja {

struct Value;
struct ListData;
struct DictData;
struct FuncData;

struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
};

// A failure inside a value operation; the interpreter adds the template origin, line and column.
struct ValueError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Value {
  enum Kind : uint8_t { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kNamespace, kFunction };
  Kind kind = kUndefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;  // kString: the text; kUndefined: what was undefined (for error messages)
  std::shared_ptr<ListData> list;
  std::shared_ptr<DictData> dict;  // kDict and kNamespace
  std::shared_ptr<FuncData> fn;

  static Value undefined(std::string hint = "");
  static Value none();
  static Value boolean(bool v);
  static Value integer(int64_t v);
  static Value real(double v);
  static Value string(std::string v);
  static Value new_list(std::vector<Value> items = {}, bool tuple = false);
  static Value new_dict();
  static Value new_namespace();
  static Value function(std::string name, std::function<Value(CallArgs&)> call);
  // Throws ValueError past kMaxDepth levels of nesting.
  static Value from_json(const nlohmann::ordered_json& j, int depth = 0);
  static constexpr int kMaxDepth = 512;

  bool is_undefined() const { return kind == kUndefined; }
  bool is_none() const { return kind == kNone; }
  bool is_string() const { return kind == kString; }
  bool is_number() const { return kind == kInt || kind == kFloat || kind == kBool; }
  bool is_list() const { return kind == kList; }
  bool is_dict() const { return kind == kDict; }

  bool truthy() const;
  std::string str() const;   // Python str(); undefined prints as ""
  std::string repr() const;  // Python repr()
  const char* type_name() const;
  double as_double() const;  // numbers only
};

struct ListData {
  std::vector<Value> items;
  bool tuple = false;
};

struct DictData {
  std::vector<std::pair<std::string, Value>> items;  // insertion order
  const Value* find(const std::string& key) const;
  Value* find(const std::string& key);
  void set(const std::string& key, Value v);
};

struct FuncData {
  std::string name;
  std::function<Value(CallArgs&)> call;
};

// Python ==.
bool equals(const Value& a, const Value& b);
// Python ordering (<0, 0, >0); throws ValueError when the values do not order.
int compare(const Value& a, const Value& b);

// Python's json.dumps options (Hugging Face's tojson: ensure_ascii=False, separators ", " / ": ").
struct DumpOptions {
  int indent = -1;  // <0: no indent
  std::string item_sep = ", ";
  std::string key_sep = ": ";
  bool ensure_ascii = false;
  bool sort_keys = false;
};
std::string dumps(const Value& v, const DumpOptions& opt = {});

// repr(float) as Python prints it: shortest round trip, "1.0", "1e-05", "1e+16", "inf", "nan".
std::string float_repr(double v);
// repr(str) as Python prints it.
std::string string_repr(const std::string& s);

// UTF-8 helpers (invalid bytes decode as U+FFFD).
std::u32string utf8_decode(const std::string& s);
std::string utf8_encode(const std::u32string& s);
void utf8_append(std::string& out, char32_t cp);
bool py_isspace(char32_t c);

}  // namespace lilac::jinja
