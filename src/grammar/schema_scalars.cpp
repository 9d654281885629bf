// Shared rules: whitespace, any JSON value, strings (length, pattern, format), numbers, integer ranges.
#include <cmath>
#include <map>
#include <optional>
#include <tuple>

#include "grammar/charset.h"
#include "grammar/regex.h"
#include "grammar/schema_internal.h"

namespace lilac::grammar::detail {

namespace {

constexpr int kMaxIndentSpaces = 32, kMaxIndentTabs = 8;
constexpr int kMaxDigits = 19;

}  // namespace

// Formats as patterns (regex.h syntax, whole-string match). Each generates a subset of what
// ajv-formats' "full" mode accepts (dates check the days of each month and leap years).
std::string format_pattern(const std::string& f) {
  const std::string date =
      "(?:\\d{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\\d|30)|02-(?:0[1-9]|1\\d|2[0-8]))"
      "|(?:\\d\\d(?:0[48]|[2468][048]|[13579][26])|(?:[02468][048]|[13579][26])00)-02-29)";
  const std::string time = "(?:[01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d(?:\\.\\d{1,9})?(?:Z|[+-](?:[01]\\d|2[0-3]):[0-5]\\d)";
  if (f == "date") return date;
  if (f == "time") return time;
  if (f == "date-time") return date + "T" + time;
  if (f == "uuid") return "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}";
  if (f == "email")
    return "[a-zA-Z0-9!#$%&'*+/=?^_`{|}~-]+(?:\\.[a-zA-Z0-9!#$%&'*+/=?^_`{|}~-]+)*@"
           "(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?\\.)+[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?";
  throw Error("internal: unknown format " + f);
}

namespace {

// Integers in [a, b] (decimal strings, a <= b, no sign) without leading zeros, as an automaton.
// State (digits read, comparison of the prefix with a's and b's prefixes of that length).
std::vector<RuleState> magnitude_range(const std::string& a, const std::string& b) {
  enum Cmp { Lt, Eq, Gt };
  const int la = int(a.size()), lb = int(b.size());
  std::vector<RuleState> out(2);  // 0: start, 1: "0"
  out[1].accept = a == "0";
  std::map<std::tuple<int, int, int>, int32_t> ids;
  std::vector<std::tuple<int, int, int>> todo;
  auto id_of = [&](int len, int ca, int cb) {
    auto key = std::make_tuple(len, ca, cb);
    auto [it, fresh] = ids.try_emplace(key, int32_t(out.size()));
    if (fresh) {
      out.emplace_back();
      out.back().accept = (len > la || (len == la && ca != Lt)) && (len < lb || (len == lb && cb != Gt));
      todo.push_back(key);
    }
    return it->second;
  };
  auto cmp = [](char d, char ref) { return d < ref ? Lt : d == ref ? Eq : Gt; };
  auto next = [&](int len, int ca, int cb, char d, int32_t& to) {
    const int nl = len + 1;
    if (nl > lb) return false;
    const int nca = nl > la ? Gt : ca != Eq ? ca : cmp(d, a[size_t(len)]);
    const int ncb = cb != Eq ? cb : cmp(d, b[size_t(len)]);
    if (nl == lb && ncb == Gt) return false;
    to = id_of(nl, nca, ncb);
    return true;
  };
  out[0].ranges.push_back({'0', '0', 1});
  for (char d = '1'; d <= '9'; ++d) {
    int32_t to;
    if (next(0, Eq, Eq, d, to)) out[0].ranges.push_back({Sym(d), Sym(d), to});
  }
  while (!todo.empty()) {
    auto [len, ca, cb] = todo.back();
    todo.pop_back();
    const int32_t s = ids[{len, ca, cb}];
    for (char d = '0'; d <= '9'; ++d) {
      int32_t to;
      if (next(len, ca, cb, d, to)) out[size_t(s)].ranges.push_back({Sym(d), Sym(d), to});
    }
  }
  for (RuleState& st : out) {  // merge adjacent digits with the same target
    std::vector<SymRange> merged;
    for (const SymRange& r : st.ranges)
      if (!merged.empty() && merged.back().to == r.to && merged.back().hi + 1 == r.lo)
        merged.back().hi = r.hi;
      else
        merged.push_back(r);
    st.ranges = std::move(merged);
  }
  trim(out);
  return out;
}

// Bound of an integer schema: minimum / exclusiveMinimum (lower) or maximum / exclusiveMaximum.
std::optional<int64_t> bound(const Json& node, const std::string& path, bool lower) {
  const char* inc = lower ? "minimum" : "maximum";
  const char* exc = lower ? "exclusiveMinimum" : "exclusiveMaximum";
  std::optional<int64_t> out;
  auto take = [&](const char* key, double v, bool exclusive) {
    if (!(std::fabs(v) <= 1e18)) fail(child_path(path, key), key, std::string("\"") + key + "\" beyond ±1e18 is not supported");
    double r = lower ? std::ceil(v) : std::floor(v);
    if (exclusive && r == v) r += lower ? 1 : -1;
    const int64_t x = int64_t(r);
    if (!out || (lower ? x > *out : x < *out)) out = x;
  };
  const bool draft4 = node.contains(exc) && node[exc].is_boolean();
  if (auto it = node.find(inc); it != node.end()) take(inc, it->get<double>(), draft4 && node[exc].get<bool>());
  if (auto it = node.find(exc); it != node.end() && it->is_number()) take(exc, it->get<double>(), true);
  return out;
}

}  // namespace

int32_t SchemaCompiler::ws_rule() {
  if (int32_t id = shared("ws"); id >= 0) return id;
  Nfa nfa;
  nfa.set_accept(nfa.start());
  const int32_t space = nfa.add_state(), nl = nfa.add_state();
  nfa.add_range(nfa.start(), ' ', ' ', space);
  nfa.add_range(nfa.start(), '\n', '\n', nl);
  nfa.set_accept(space);
  nfa.set_accept(nl);
  int32_t cur = nl;
  for (int i = 0; i < kMaxIndentSpaces; ++i) {
    const int32_t s = nfa.add_state();
    nfa.add_range(cur, ' ', ' ', s);
    nfa.set_accept(s);
    cur = s;
  }
  cur = nl;
  for (int i = 0; i < kMaxIndentTabs; ++i) {
    const int32_t s = nfa.add_state();
    nfa.add_range(cur, '\t', '\t', s);
    nfa.set_accept(s);
    cur = s;
  }
  return shared_["ws"] = add_rule(nfa, "whitespace", "ws");
}

int32_t SchemaCompiler::string_rule(int64_t min_chars, int64_t max_chars) {
  const std::string key = mode_key("str:" + std::to_string(min_chars) + ":" + std::to_string(max_chars));
  if (int32_t id = shared(key); id >= 0) return id;
  Rule r;
  r.kind = Rule::Kind::String;
  r.name = "a string of " + std::to_string(min_chars) + ".." + (max_chars < 0 ? "" : std::to_string(max_chars)) + " characters";
  r.share_key = key;
  r.min_chars = min_chars;
  r.max_chars = max_chars;
  r.no_lt = xml_safe_;
  return shared_[key] = g_.add_rule(std::move(r));
}

// Any value: the three rules refer to each other (reserved first). They are shared once all three are built: a
// compile that fails midway (a forced call's tool that is not strict, past its budget, falls back) leaves them
// abandoned, matching nothing, and later users build them again.
int32_t SchemaCompiler::any_value_rule() {
  if (int32_t id = shared(mode_key("any")); id >= 0) return id;
  const int32_t value = reserve("any JSON value"), obj = reserve("any JSON object"), arr = reserve("any JSON array");
  const int32_t ws = ws_rule(), str = string_rule(0, -1), num = number_rule();
  {
    Nfa nfa;
    const int32_t end = nfa.add_state();
    nfa.set_accept(end);
    for (int32_t r : {str, num, obj, arr}) nfa.add_call(nfa.start(), r, end);
    for (const char* lit : {"true", "false", "null"}) nfa.add_literal_to(nfa.start(), lit, end);
    g_.rules[size_t(value)].states = determinize(nfa, lim_.max_automaton, &work_);
  }
  // Containers: OPEN ws (CLOSE | item ws (',' ws item ws)* CLOSE), item = [key ws ':' ws] value.
  auto container = [&](int32_t id, char open, char close, bool keys) {
    Nfa nfa;
    const int32_t end = nfa.add_state(), a = nfa.add_state(), first = nfa.add_state(), item = nfa.add_state(),
                  after = nfa.add_state(), comma = nfa.add_state();
    nfa.set_accept(end);
    nfa.add_range(nfa.start(), Sym(open), Sym(open), a);
    nfa.add_call(a, ws, first);
    nfa.add_range(first, Sym(close), Sym(close), end);
    nfa.add_eps(first, item);
    int32_t v = item;
    if (keys) {
      const int32_t k = nfa.add_state(), k2 = nfa.add_state(), colon = nfa.add_state();
      nfa.add_call(item, str, k);
      nfa.add_call(k, ws, k2);
      nfa.add_range(k2, ':', ':', colon);
      v = nfa.add_state();
      nfa.add_call(colon, ws, v);
    }
    const int32_t vv = nfa.add_state();
    nfa.add_call(v, value, vv);
    nfa.add_call(vv, ws, after);
    nfa.add_range(after, Sym(close), Sym(close), end);
    nfa.add_range(after, ',', ',', comma);
    nfa.add_call(comma, ws, item);
    g_.rules[size_t(id)].states = determinize(nfa, lim_.max_automaton, &work_);
  };
  container(obj, '{', '}', true);
  container(arr, '[', ']', false);
  g_.rules[size_t(value)].share_key = mode_key("any");
  g_.rules[size_t(obj)].share_key = mode_key("any-object");
  g_.rules[size_t(arr)].share_key = mode_key("any-array");
  shared_[mode_key("any")] = value;
  shared_[mode_key("any-object")] = obj;
  return value;
}

int32_t SchemaCompiler::any_object_rule() {
  any_value_rule();
  return shared(mode_key("any-object"));
}

int32_t SchemaCompiler::number_rule() {
  if (int32_t id = shared("num"); id >= 0) return id;
  Nfa nfa;
  const int32_t end = nfa.add_state();
  nfa.set_accept(end);
  const std::string d = std::to_string(kMaxDigits);
  add_pattern(nfa, nfa.start(), "-?(?:0|[1-9][0-9]{0," + std::to_string(kMaxDigits - 1) + "})(?:\\.[0-9]{1," + d +
                                    "})?(?:[eE][+-]?[0-9]{1,2})?",
              Encoding::Utf8, end, false);
  Rule r;
  r.name = "a number";
  r.share_key = "num";
  r.states = determinize(nfa, lim_.max_automaton, &work_);
  minimize(r.states);
  return shared_["num"] = g_.add_rule(std::move(r));
}

int32_t SchemaCompiler::integer_rule(const Json& node, const std::string& path) {
  const std::optional<int64_t> lo = bound(node, path, true), hi = bound(node, path, false);
  if (lo && hi && *lo > *hi) fail(path, "minimum", "no integer lies between the bounds: the schema matches nothing");
  return integer_range_rule(lo, hi);
}

int32_t SchemaCompiler::integer_range_rule(std::optional<int64_t> lo, std::optional<int64_t> hi) {
  const std::string key = "int:" + (lo ? std::to_string(*lo) : "") + ":" + (hi ? std::to_string(*hi) : "");
  if (int32_t id = shared(key); id >= 0) return id;
  const std::string nines(size_t(kMaxDigits), '9');
  Nfa nfa;
  const int32_t end = nfa.add_state();
  nfa.set_accept(end);
  if (!hi || *hi >= 0) {  // 0 .. hi
    const std::string a = std::to_string(lo && *lo > 0 ? *lo : 0), b = hi ? std::to_string(*hi) : nines;
    nfa.add_eps(nfa.start(), nfa.add_automaton(magnitude_range(a, b), end));
  }
  if (!lo || *lo < 0) {  // -(magnitudes)
    const std::string a = std::to_string(hi && *hi < 0 ? -*hi : 1), b = lo ? std::to_string(-*lo) : nines;
    const int32_t minus = nfa.add_state();
    nfa.add_range(nfa.start(), '-', '-', minus);
    nfa.add_eps(minus, nfa.add_automaton(magnitude_range(a, b), end));
  }
  std::string name = "an integer";
  if (lo) name += " >= " + std::to_string(*lo);
  if (hi) name += std::string(lo ? " and" : "") + " <= " + std::to_string(*hi);
  return shared_[key] = add_rule(nfa, name, key);
}

int32_t SchemaCompiler::string_value_rule(const Json& node, const std::string& path) {
  const int64_t lo = node.contains("minLength") ? count_value(node["minLength"]) : 0;
  const int64_t hi = node.contains("maxLength") ? count_value(node["maxLength"]) : -1;
  if (hi >= 0 && lo > hi) fail(path, "minLength", "minLength > maxLength: the schema matches nothing");
  const bool has_pattern = node.contains("pattern"), has_format = node.contains("format");
  if (!has_pattern && !has_format) return string_rule(lo, hi);
  const std::string pattern = has_pattern ? node["pattern"].get<std::string>() : "";
  const std::string format = has_format ? node["format"].get<std::string>() : "";
  const std::string key = mode_key("text:" + std::to_string(lo) + ":" + std::to_string(hi) + ":" + format + ":" + pattern);
  const Encoding enc = string_encoding();
  if (int32_t id = shared(key); id >= 0) return id;
  // `"` body `"` for each constraint, intersected.
  auto quoted = [&](auto&& body) {
    Nfa nfa(lim_.max_automaton * 4);
    const int32_t open = nfa.add_state(), close = nfa.add_state(), end = nfa.add_state();
    nfa.add_range(nfa.start(), '"', '"', open);
    body(nfa, open, close);
    nfa.add_range(close, '"', '"', end);
    nfa.set_accept(end);
    return determinize(nfa, lim_.max_automaton, &work_);
  };
  std::vector<RuleState> dfa;
  auto meet = [&](std::vector<RuleState> d) { dfa = dfa.empty() ? std::move(d) : intersect(dfa, d, lim_.max_automaton); };
  try {
    if (has_pattern)
      meet(quoted([&](Nfa& n, int32_t a, int32_t b) { add_pattern(n, a, pattern, enc, b); }));
    if (has_format)
      meet(quoted([&](Nfa& n, int32_t a, int32_t b) {
        add_pattern(n, a, format_pattern(format), enc, b, false);
      }));
    if (lo > 0 || hi >= 0) {
      if (std::max(lo, hi) > lim_.max_pattern_length)
        fail(path, hi >= 0 ? "maxLength" : "minLength",
             "minLength / maxLength above " + std::to_string(lim_.max_pattern_length) +
                 " together with a pattern or format is not supported");
      meet(quoted([&](Nfa& n, int32_t a, int32_t b) {
        int32_t cur = a;
        const CharSet any = CharSet::any();
        for (int64_t i = 0; i < lo; ++i) {
          const int32_t s = n.add_state();
          add_charset(n, cur, any, enc, s);
          cur = s;
        }
        if (hi < 0) {
          add_charset(n, cur, any, enc, cur);
        } else {
          for (int64_t i = lo; i < hi; ++i) {
            n.add_eps(cur, b);
            const int32_t s = n.add_state();
            add_charset(n, cur, any, enc, s);
            cur = s;
          }
        }
        n.add_eps(cur, b);
      }));
    }
  } catch (const SizeError& e) {
    fail(path, has_pattern ? "pattern" : "format",
         std::string("pattern / format with these lengths is too large (") + e.what() + ")");
  }
  // Patterns repeat sub-automata ({n,m}, +): merging equivalent states means one token class per
  // distinct state instead of one per copy.
  minimize(dfa);
  Rule r;
  r.name = "a string matching the constraints at " + path;
  r.share_key = key;
  r.states = std::move(dfa);
  return shared_[key] = g_.add_rule(std::move(r));
}

}  // namespace lilac::grammar::detail
