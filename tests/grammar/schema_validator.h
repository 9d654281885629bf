// An independent JSON Schema validator for the subset the grammar compiler supports (tests only):
// it validates parsed values, so it checks the compiler's output from the other side. Patterns
// run on PCRE2 (UTF mode, search semantics); formats as ajv-formats' "full" mode defines them.
#pragma once
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cmath>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace lilac::grammar::test {

using VJson = nlohmann::ordered_json;

inline bool regex_search(const std::string& pattern, const std::string& s) {
  int err = 0;
  PCRE2_SIZE off = 0;
  pcre2_code* re = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), pattern.size(), PCRE2_UTF, &err, &off, nullptr);
  if (!re) return false;
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(re, nullptr);
  const int rc = pcre2_match(re, reinterpret_cast<PCRE2_SPTR>(s.c_str()), s.size(), 0, 0, md, nullptr);
  pcre2_match_data_free(md);
  pcre2_code_free(re);
  return rc >= 0;
}

inline size_t code_points(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

inline bool valid_format(const std::string& f, const std::string& s) {
  auto date_ok = [](const std::string& d) {
    if (!regex_search("^\\d{4}-\\d{2}-\\d{2}$", d)) return false;
    const int y = std::stoi(d.substr(0, 4)), m = std::stoi(d.substr(5, 2)), day = std::stoi(d.substr(8, 2));
    static const int days[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    const bool leap = y % 4 == 0 && (y % 100 != 0 || y % 400 == 0);
    return m >= 1 && m <= 12 && day >= 1 && day <= (m == 2 && leap ? 29 : days[m - 1]);
  };
  auto time_ok = [](const std::string& t) {
    if (!regex_search("^(\\d\\d):(\\d\\d):(\\d\\d)(\\.\\d+)?(z|Z|[+-]\\d\\d:\\d\\d)$", t)) return false;
    const int h = std::stoi(t.substr(0, 2)), mi = std::stoi(t.substr(3, 2)), sec = std::stoi(t.substr(6, 2));
    return h <= 23 && mi <= 59 && sec <= 59;
  };
  if (f == "date") return date_ok(s);
  if (f == "time") return time_ok(s);
  if (f == "date-time") {
    const size_t t = s.find_first_of("Tt ");
    return t != std::string::npos && date_ok(s.substr(0, t)) && time_ok(s.substr(t + 1));
  }
  if (f == "uuid") return regex_search("^(?i)[0-9a-f]{8}-(?:[0-9a-f]{4}-){3}[0-9a-f]{12}$", s);
  if (f == "email")
    return regex_search(
        "^(?i)[a-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\\.[a-z0-9!#$%&'*+/=?^_`{|}~-]+)*@(?:[a-z0-9](?:[a-z0-9-]*[a-z0-9])?\\.)+"
        "[a-z0-9](?:[a-z0-9-]*[a-z0-9])?$",
        s);
  return false;
}

class Validator {
 public:
  explicit Validator(const VJson& root) : root_(root) {}

  // Empty when `v` is valid, else the reason.
  std::string check(const VJson& v) const { return check(v, root_); }

 private:
  const VJson& deref(const std::string& ref) const {
    const VJson* cur = &root_;
    size_t i = 2;
    while (i <= ref.size() && ref.size() > 1) {
      size_t j = ref.find('/', i);
      if (j == std::string::npos) j = ref.size();
      std::string tok = ref.substr(i, j - i);
      for (size_t k; (k = tok.find("~1")) != std::string::npos;) tok.replace(k, 2, "/");
      for (size_t k; (k = tok.find("~0")) != std::string::npos;) tok.replace(k, 2, "~");
      cur = cur->is_array() ? &(*cur)[std::stoul(tok)] : &(*cur)[tok];
      i = j + 1;
    }
    return *cur;
  }

  static bool is_type(const VJson& v, const std::string& t) {
    if (t == "null") return v.is_null();
    if (t == "boolean") return v.is_boolean();
    if (t == "object") return v.is_object();
    if (t == "array") return v.is_array();
    if (t == "string") return v.is_string();
    if (t == "number") return v.is_number();
    if (t == "integer")
      return v.is_number_integer() || v.is_number_unsigned() ||
             (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>() && std::isfinite(v.get<double>()));
    return false;
  }

  std::string check(const VJson& v, const VJson& s) const {
    if (s.is_boolean()) return s.get<bool>() ? "" : "false schema";
    if (auto it = s.find("$ref"); it != s.end())
      if (auto e = check(v, deref(it->get<std::string>())); !e.empty()) return e;
    if (auto it = s.find("type"); it != s.end()) {
      bool ok = false;
      if (it->is_string()) ok = is_type(v, it->get<std::string>());
      else
        for (const auto& t : *it) ok = ok || is_type(v, t.get<std::string>());
      if (!ok) return "type " + it->dump() + " of " + v.dump();
    }
    if (auto it = s.find("enum"); it != s.end()) {
      bool ok = false;
      for (const auto& e : *it) ok = ok || e == v;
      if (!ok) return "enum";
    }
    if (auto it = s.find("const"); it != s.end() && *it != v) return "const";
    for (const char* k : {"anyOf", "oneOf", "allOf"}) {
      auto it = s.find(k);
      if (it == s.end()) continue;
      size_t n = 0;
      for (const auto& b : *it) n += check(v, b).empty();
      if (std::string(k) == "anyOf" && n == 0) return "anyOf";
      if (std::string(k) == "oneOf" && n != 1) return "oneOf matched " + std::to_string(n);
      if (std::string(k) == "allOf" && n != it->size()) return "allOf";
    }
    if (v.is_string()) {
      const std::string str = v.get<std::string>();
      if (s.contains("minLength") && code_points(str) < s["minLength"].get<size_t>()) return "minLength";
      if (s.contains("maxLength") && code_points(str) > s["maxLength"].get<size_t>()) return "maxLength";
      if (s.contains("pattern") && !regex_search(s["pattern"].get<std::string>(), str)) return "pattern";
      if (s.contains("format") && !valid_format(s["format"].get<std::string>(), str)) return "format " + str;
    }
    if (v.is_number()) {
      const double d = v.get<double>();
      if (s.contains("minimum") && d < s["minimum"].get<double>()) return "minimum";
      if (s.contains("maximum") && d > s["maximum"].get<double>()) return "maximum";
      if (s.contains("exclusiveMinimum") && s["exclusiveMinimum"].is_number() && d <= s["exclusiveMinimum"].get<double>())
        return "exclusiveMinimum";
      if (s.contains("exclusiveMaximum") && s["exclusiveMaximum"].is_number() && d >= s["exclusiveMaximum"].get<double>())
        return "exclusiveMaximum";
    }
    if (v.is_array()) {
      if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) return "minItems";
      if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return "maxItems";
      size_t prefix = 0;
      if (auto it = s.find("prefixItems"); it != s.end()) {
        prefix = it->size();
        for (size_t i = 0; i < v.size() && i < prefix; ++i)
          if (auto e = check(v[i], (*it)[i]); !e.empty()) return "[" + std::to_string(i) + "] " + e;
      }
      if (auto it = s.find("items"); it != s.end())
        for (size_t i = prefix; i < v.size(); ++i)
          if (auto e = check(v[i], *it); !e.empty()) return "[" + std::to_string(i) + "] " + e;
    }
    if (v.is_object()) {
      if (auto it = s.find("required"); it != s.end())
        for (const auto& r : *it)
          if (!v.contains(r.get<std::string>())) return "required " + r.get<std::string>();
      const VJson* props = s.contains("properties") ? &s["properties"] : nullptr;
      for (const auto& [k, x] : v.items()) {
        if (props && props->contains(k)) {
          if (auto e = check(x, (*props)[k]); !e.empty()) return "." + k + " " + e;
        } else if (auto a = s.find("additionalProperties"); a != s.end()) {
          if (auto e = check(x, *a); !e.empty()) return "additional ." + k + " " + e;
        }
      }
    }
    return "";
  }

  const VJson& root_;
};

}  // namespace lilac::grammar::test
