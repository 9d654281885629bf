// Route policy parsing and user rules (keywords + PCRE2 regexes).
#include "router/route_policy.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <bit>
#include <cstring>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <fstream>
#include <sstream>

#include "core/error.h"
#include "text/json_dump.h"

namespace lilac::router {

using json = nlohmann::json;

const char* route_name(Route r) {
  switch (r) {
    case Route::local: return "local";
    case Route::cloud: return "cloud";
    default: return "auto";
  }
}

bool parse_route(std::string_view s, Route* out) {
  std::string l(s);
  for (auto& c : l) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (l == "local") *out = Route::local;
  else if (l == "cloud") *out = Route::cloud;
  else if (l == "auto") *out = Route::auto_;
  else return false;
  return true;
}

// ---------------------------------------------------------------------------------------------- rules

struct UserRule::Regex {
  pcre2_code* code = nullptr;
  ~Regex() {
    if (code) pcre2_code_free(code);
  }
};

namespace {
std::string fold(std::string_view s) {
  std::string r(s);
  for (auto& c : r)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return r;
}
}  // namespace

UserRule::UserRule(std::string name, std::vector<std::string> keywords, std::vector<std::string> regexes,
                   bool case_insensitive)
    : name_(std::move(name)), ci_(case_insensitive) {
  for (auto& k : keywords) {
    if (k.empty()) throw InputError("route policy: rule '" + name_ + "': empty keyword");
    keywords_.push_back(ci_ ? fold(k) : k);
  }
  for (const auto& re : regexes) {
    int err = 0;
    PCRE2_SIZE off = 0;
    uint32_t flags = PCRE2_UTF | PCRE2_MATCH_INVALID_UTF | (ci_ ? PCRE2_CASELESS : 0);
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(re.data()), re.size(), flags, &err, &off, nullptr);
    if (!code) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      throw InputError("route policy: rule '" + name_ + "': bad regex /" + re + "/ at offset " +
                       std::to_string(off) + ": " + reinterpret_cast<const char*>(msg));
    }
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter when JIT is unavailable
    auto r = std::make_unique<Regex>();
    r->code = code;
    regexes_.push_back(std::move(r));
  }
}

UserRule::~UserRule() = default;
UserRule::UserRule(UserRule&&) noexcept = default;
UserRule& UserRule::operator=(UserRule&&) noexcept = default;

namespace detail {

bool contains(std::string_view hay, std::string_view needle) {
#if defined(__SSE2__)
  // 16 places at a time: where the needle's first and last bytes both are, the bytes between are compared.
  const size_t m = needle.size(), n = hay.size();
  if (m >= 2 && n >= m + 16) {
    const __m128i first = _mm_set1_epi8(needle[0]), last = _mm_set1_epi8(needle[m - 1]);
    size_t pos = 0;
    for (; pos + m - 1 + 16 <= n; pos += 16) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(hay.data() + pos));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(hay.data() + pos + m - 1));
      for (unsigned mask = unsigned(_mm_movemask_epi8(_mm_and_si128(_mm_cmpeq_epi8(a, first), _mm_cmpeq_epi8(b, last))));
           mask; mask &= mask - 1) {
        const size_t at = pos + size_t(std::countr_zero(mask));
        if (std::memcmp(hay.data() + at + 1, needle.data() + 1, m - 2) == 0) return true;
      }
    }
    return hay.substr(pos).find(needle) != std::string_view::npos;  // the places left
  }
#endif
  return hay.find(needle) != std::string_view::npos;
}

}  // namespace detail

bool UserRule::matches(std::string_view text, std::string_view lowered) const {
  std::string_view hay = ci_ ? lowered : text;
  for (const auto& k : keywords_)
    if (detail::contains(hay, k)) return true;
  if (regexes_.empty()) return false;
  for (const auto& r : regexes_) {
    pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
    int rc = pcre2_match(r->code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), 0, 0, md, nullptr);
    pcre2_match_data_free(md);
    // Only "no match" shows the text clean. An error (the JIT stack, match or heap limit of a backtracking pattern
    // on a long text) counted as no match before, and the text went upstream unchecked: it counts as a match.
    if (rc != PCRE2_ERROR_NOMATCH) return true;
  }
  return false;
}

// ---------------------------------------------------------------------------------------------- policy

bool glob_match(std::string_view p, std::string_view t) {
  size_t pi = 0, ti = 0, star = std::string_view::npos, mark = 0;
  while (ti < t.size()) {
    if (pi < p.size() && p[pi] == '*') {
      star = pi++;
      mark = ti;
    } else if (pi < p.size() && p[pi] == t[ti]) {
      ++pi, ++ti;
    } else if (star != std::string_view::npos) {
      pi = star + 1;
      ti = ++mark;
    } else {
      return false;
    }
  }
  while (pi < p.size() && p[pi] == '*') ++pi;
  return pi == p.size();
}

const ModelRule* RoutePolicy::model_rule(std::string_view model) const {
  for (const auto& r : models)
    if (glob_match(r.match, model)) return &r;
  return nullptr;
}

namespace {

struct Reader {
  const json& obj;
  std::string where;

  void only(std::initializer_list<const char*> keys) const {
    if (!obj.is_object()) throw InputError(where + ": must be a JSON object");
    for (auto it = obj.begin(); it != obj.end(); ++it) {
      bool ok = false;
      for (const char* k : keys) ok |= it.key() == k;
      if (!ok) throw InputError(where + ": unknown key '" + it.key() + "'");
    }
  }
  bool has(const char* k) const { return obj.contains(k); }
  std::string field(const char* k) const { return where + "." + k; }
  bool boolean(const char* k, bool def) const {
    if (!has(k)) return def;
    if (!obj[k].is_boolean()) throw InputError(field(k) + ": must be true or false");
    return obj[k].get<bool>();
  }
  uint64_t uint(const char* k, uint64_t def) const {
    if (!has(k)) return def;
    const auto& v = obj[k];
    if (!v.is_number_integer() || v.get<int64_t>() < 0) throw InputError(field(k) + ": must be a non-negative integer");
    return v.get<uint64_t>();
  }
  std::string str(const char* k, const std::string& def) const {
    if (!has(k)) return def;
    if (!obj[k].is_string()) throw InputError(field(k) + ": must be a string");
    return obj[k].get<std::string>();
  }
  std::vector<std::string> strings(const char* k) const {
    std::vector<std::string> out;
    if (!has(k)) return out;
    const auto& v = obj[k];
    if (!v.is_array()) throw InputError(field(k) + ": must be an array of strings");
    for (const auto& s : v) {
      if (!s.is_string()) throw InputError(field(k) + ": must be an array of strings");
      out.push_back(s.get<std::string>());
    }
    return out;
  }
  Route route(const char* k, Route def, bool allow_auto) const {
    if (!has(k)) return def;
    Route r;
    if (!obj[k].is_string() || !parse_route(obj[k].get<std::string>(), &r) || (!allow_auto && r == Route::auto_))
      throw InputError(field(k) + (allow_auto ? ": must be \"local\", \"cloud\" or \"auto\"" : ": must be \"local\" or \"cloud\""));
    return r;
  }
};

}  // namespace

RoutePolicy parse_route_policy(const json& doc, const std::string& origin) {
  RoutePolicy p;
  Reader top{doc, origin};
  top.only({"default_route", "detectors", "rules", "max_local_prompt_bytes", "max_local_prompt_tokens", "models",
            "allow_explicit_cloud_for_sensitive", "fallback", "sticky", "upstream", "$comment"});
  p.default_route = top.route("default_route", p.default_route, true);

  if (top.has("detectors")) {
    const auto& d = doc["detectors"];
    if (d.is_array()) {  // the list of enabled detectors
      p.detectors = DetectorSet::none();
      for (const auto& n : d) {
        DetectorKind k;
        if (!n.is_string() || !detector_from_name(n.get<std::string>(), &k))
          throw InputError(origin + ".detectors: unknown detector " + dump_json(n) + " (known: email, phone, card, iban, "
                           "ssn, ipv4, ipv6, private_key, api_key, high_entropy, opaque)");
        p.detectors.set(k, true);
      }
    } else if (d.is_object()) {  // {"name": bool}, the rest stay enabled
      for (auto it = d.begin(); it != d.end(); ++it) {
        DetectorKind k;
        if (!detector_from_name(it.key(), &k))
          throw InputError(origin + ".detectors: unknown detector '" + it.key() + "'");
        if (!it.value().is_boolean()) throw InputError(origin + ".detectors." + it.key() + ": must be true or false");
        p.detectors.set(k, it.value().get<bool>());
      }
    } else {
      throw InputError(origin + ".detectors: must be an array of names or an object {name: bool}");
    }
  }

  if (top.has("rules")) {
    const auto& rs = doc["rules"];
    if (!rs.is_array()) throw InputError(origin + ".rules: must be an array of rule objects");
    for (size_t i = 0; i < rs.size(); ++i) {
      Reader r{rs[i], origin + ".rules[" + std::to_string(i) + "]"};
      r.only({"name", "keywords", "regex", "case_insensitive"});
      std::string name = r.str("name", "rule" + std::to_string(i));
      auto kw = r.strings("keywords");
      auto re = r.strings("regex");
      if (kw.empty() && re.empty()) throw InputError(r.where + ": needs \"keywords\" or \"regex\"");
      p.rules.emplace_back(name, std::move(kw), std::move(re), r.boolean("case_insensitive", true));
    }
  }

  p.max_local_prompt_bytes = top.uint("max_local_prompt_bytes", 0);
  p.max_local_prompt_tokens = top.uint("max_local_prompt_tokens", 0);

  if (top.has("models")) {
    const auto& ms = doc["models"];
    if (!ms.is_array()) throw InputError(origin + ".models: must be an array of {\"match\", \"routes\"}");
    for (size_t i = 0; i < ms.size(); ++i) {
      Reader r{ms[i], origin + ".models[" + std::to_string(i) + "]"};
      r.only({"match", "routes"});
      ModelRule mr;
      if (!r.has("match")) throw InputError(r.where + ": needs \"match\" (a model name, '*' as wildcard)");
      mr.match = r.str("match", "");
      if (!r.has("routes")) throw InputError(r.where + ": needs \"routes\" (a subset of [\"local\", \"cloud\"])");
      mr.allow_local = mr.allow_cloud = false;
      for (const auto& s : r.strings("routes")) {
        Route rt;
        if (!parse_route(s, &rt) || rt == Route::auto_)
          throw InputError(r.field("routes") + ": unknown route '" + s + "' (local or cloud)");
        (rt == Route::local ? mr.allow_local : mr.allow_cloud) = true;
      }
      if (!mr.allow_local && !mr.allow_cloud) throw InputError(r.field("routes") + ": must allow at least one route");
      p.models.push_back(mr);
    }
  }

  p.allow_explicit_cloud_for_sensitive = top.boolean("allow_explicit_cloud_for_sensitive", false);

  if (top.has("fallback")) {
    Reader f{doc["fallback"], origin + ".fallback"};
    f.only({"upstream_failure_to_local", "local_busy_to_cloud"});
    p.upstream_failure_to_local = f.boolean("upstream_failure_to_local", p.upstream_failure_to_local);
    p.local_busy_to_cloud = f.boolean("local_busy_to_cloud", p.local_busy_to_cloud);
  }
  if (top.has("sticky")) {
    const auto& s = doc["sticky"];
    if (s.is_boolean()) {
      p.sticky = s.get<bool>();
    } else {
      Reader r{s, origin + ".sticky"};
      r.only({"enabled", "max_entries"});
      p.sticky = r.boolean("enabled", true);
      p.sticky_max_entries = r.uint("max_entries", p.sticky_max_entries);
      if (p.sticky_max_entries == 0) throw InputError(r.field("max_entries") + ": must be at least 1");
    }
  }
  if (top.has("upstream")) {
    Reader u{doc["upstream"], origin + ".upstream"};
    u.only({"model_prefix", "connect_timeout_ms", "read_timeout_ms", "models_timeout_ms", "models_cache_s",
            "drop_fields"});
    p.model_prefix = u.str("model_prefix", p.model_prefix);
    if (p.model_prefix.empty()) throw InputError(u.field("model_prefix") + ": must not be empty");
    auto ms = [&](const char* k, int def) {
      uint64_t v = u.uint(k, static_cast<uint64_t>(def));
      if (v == 0 || v > 3600000) throw InputError(u.field(k) + ": must be between 1 and 3600000");
      return static_cast<int>(v);
    };
    p.connect_timeout_ms = ms("connect_timeout_ms", p.connect_timeout_ms);
    p.read_timeout_ms = ms("read_timeout_ms", p.read_timeout_ms);
    p.models_timeout_ms = ms("models_timeout_ms", p.models_timeout_ms);
    p.models_cache_s = static_cast<int>(u.uint("models_cache_s", static_cast<uint64_t>(p.models_cache_s)));
    p.drop_fields = u.strings("drop_fields");
  }
  return p;
}

RoutePolicy load_route_policy_file(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw InputError("cannot read the route policy file " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  json doc = json::parse(ss.str(), nullptr, false, /*ignore_comments=*/true);
  if (doc.is_discarded()) throw InputError("route policy file " + path + ": not valid JSON");
  return parse_route_policy(doc, path);
}

}  // namespace lilac::router
