// The hybrid router's scan as it was defined before its fast paths (src/router at e11006d: normalize.cpp's variants,
// opaque.cpp's pass, the opaque merge of scan_sensitive, scan.cpp's joined copies, collapse_whitespace, the rule fold of
// Router::text_sensitive): the straightforward definitions that tests/router/test_router_fast_paths.cpp compares the
// fast paths with. Kept as they were, byte for byte where possible; not to be "fixed" along with the library (a change
// of behaviour there must show here as a failing comparison). The detectors' own loop is the library's
// detail::scan_sensitive_plain.
#pragma once
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <string>
#include <string_view>
#include <vector>

#include "router/detectors.h"
#include "router/normalize.h"
#include "router/route_policy.h"
#include "router/scan.h"
#include "text/bounded_json.h"
#include "text/json_dump.h"
#include "text/unicode.h"

namespace router_reference {

using lilac::router::base64_digit;
using lilac::router::base64_decodes_to_text;
using lilac::router::canonical_text;
using lilac::router::DetectorKind;
using lilac::router::DetectorSet;
using lilac::router::Finding;
using lilac::router::kOpaqueMinChars;
using lilac::router::ScanOptions;
using lilac::router::ScanOutcome;
using lilac::router::TextCheck;
using lilac::unicode::decode_utf8;
using lilac::unicode::Decoded;
namespace unicode = lilac::unicode;
using ojson = nlohmann::ordered_json;
using lilac::JsonParseResult;
using lilac::JsonLimits;
using lilac::parse_bounded_json;
using lilac::dump_json;

// ------------------------------------------------------------------------------------ normalize.cpp (variants)

inline int hexv(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

inline bool ieq(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  return true;
}

inline size_t reference_end(std::string_view s, size_t i) {
  const size_t max_len = i + 1 < s.size() && s[i + 1] == '#' ? 32 : 10;
  const size_t at = s.substr(i + 1, max_len).find(';');
  return at == std::string_view::npos ? std::string_view::npos : i + 1 + at;
}

inline bool is_sep(char c) { return std::strchr(" -._/\\|,~*", c) != nullptr && c != 0; }

inline bool is_digit(char c) { return c >= '0' && c <= '9'; }

inline std::string digit_separators(std::string_view s, char with) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    out.push_back(s[i]);
    if (!is_digit(s[i])) continue;
    size_t j = i + 1;
    while (j < s.size() && j - i <= 3 && is_sep(s[j])) ++j;
    if (j > i + 1 && j - i <= 4 && j < s.size() && is_digit(s[j])) {
      const bool plain = j == i + 2 && (s[i + 1] == ' ' || s[i + 1] == '-' || s[i + 1] == '.');
      if (with && plain) out.push_back(s[i + 1]);
      else if (with) out.push_back(with);
      i = j - 1;
    }
  }
  return out;
}

inline bool has_split_long_number(std::string_view s) {
  size_t digits = 0, seps = 0;
  for (size_t i = 0; i <= s.size(); ++i) {
    const char c = i < s.size() ? s[i] : '\0';
    if (is_digit(c)) {
      ++digits;
    } else if (digits > 0 && is_sep(c) && i + 1 < s.size() && (is_digit(s[i + 1]) || is_sep(s[i + 1]))) {
      ++seps;
    } else {
      if (digits >= 13 && seps > 0) return true;
      digits = seps = 0;
    }
  }
  return false;
}

inline bool needs_canonical(std::string_view s) {
  const size_t n = s.size();
  for (size_t i = 0; i < n; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80 || unicode::is_invisible(c)) return true;  // (an ASCII control inside a word is dropped)
    switch (c) {
      case '%':
        if (i + 2 < n && hexv(s[i + 1]) >= 0 && hexv(s[i + 2]) >= 0) return true;
        break;
      case '&':
        if (reference_end(s, i) != std::string_view::npos) return true;
        break;
      case '\\':
        if (i + 1 < n && (s[i + 1] == 'u' || s[i + 1] == 'U' || s[i + 1] == 'x' || s[i + 1] == 'X' || s[i + 1] == '\\'))
          return true;
        break;
      case '[': case '(': case '{': case '<': {
        size_t j = i + 1;
        while (j < n && s[j] == ' ') ++j;
        if (j + 2 <= n && (ieq(s.substr(j, 2), "at") || (j + 3 <= n && ieq(s.substr(j, 3), "dot")))) return true;
        break;
      }
      case ' ':
        if (i + 5 <= n && ieq(s.substr(i, 5), " dot ")) return true;
        break;
      default: break;
    }
  }
  return false;
}

inline bool looks_like_text(std::string_view d) {
  if (d.empty() || !unicode::is_valid_utf8(d)) return false;
  size_t bad = 0, n = 0;
  for (size_t i = 0; i < d.size();) {
    Decoded c = decode_utf8(d, i);
    i += c.len;
    ++n;
    if (c.cp < 0x20 && c.cp != '\n' && c.cp != '\r' && c.cp != '\t') ++bad;
    if (c.cp == 0x7F || c.cp == 0xFFFD) ++bad;
  }
  return bad * 10 <= n;
}

inline std::string decode_runs(std::string_view s, int depth) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    if (base64_digit(s[i]) < 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < s.size() && base64_digit(s[j]) >= 0) ++j;
    const size_t len = j - i;
    if (len >= 16 && len % 4 != 1) {
      std::string d;
      d.reserve(len * 3 / 4);
      uint32_t acc = 0;
      int bits = 0;
      for (size_t k = i; k < j; ++k) {
        acc = (acc << 6) | uint32_t(base64_digit(s[k]));
        bits += 6;
        if (bits >= 8) {
          bits -= 8;
          d.push_back(char((acc >> bits) & 0xFF));
        }
        if (d.size() == 256) {  // binary: stop early
          std::string_view head(d);
          head.remove_suffix(unicode::incomplete_utf8_tail(head));
          if (!looks_like_text(head)) break;
        }
      }
      if (looks_like_text(d)) {
        out += canonical_text(d);
        out.push_back('\n');
        if (depth > 0) {
          std::string inner = decode_runs(d, depth - 1);
          if (!inner.empty()) out += inner;
        }
      }
    }
    i = j;
  }
  return out;
}

inline std::vector<std::string> text_variants(std::string_view text, size_t budget) {
  std::vector<std::string> out;
  size_t used = 0;
  auto add = [&](std::string v, std::string_view than) {
    if (v.empty() || v == than || used >= budget) return;
    if (v.size() > budget - used) v.resize(budget - used);
    used += v.size();
    out.push_back(std::move(v));
  };
  std::string canon_buf;
  std::string_view canon = text;
  if (needs_canonical(text)) {
    canon_buf = canonical_text(text);
    canon = canon_buf;
    add(canon_buf, text);
  }
  size_t digits = 0;
  for (char c : canon) digits += is_digit(c);
  if (digits >= 7) {
    add(digit_separators(canon, '-'), canon);
    if (has_split_long_number(canon)) add(digit_separators(canon, '\0'), canon);
  }
  add(decode_runs(canon, 1), "");
  return out;
}

inline std::string collapse_whitespace(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  bool pending = false;
  for (size_t i = 0; i < text.size();) {
    if (const unsigned char b = static_cast<unsigned char>(text[i]); b < 0x80) {  // ASCII: what the general path does
      if (b == ' ' || (b >= 0x09 && b <= 0x0D)) {
        pending = !out.empty();
      } else {
        if (pending) out.push_back(' ');
        pending = false;
        out.push_back(static_cast<char>(b));
      }
      ++i;
      continue;
    }
    Decoded d = decode_utf8(text, i);
    if (d.status == Decoded::Ok && unicode::is_whitespace(d.cp)) {
      pending = !out.empty();
      i += d.len;
      continue;
    }
    if (pending) out.push_back(' ');
    pending = false;
    out.append(text.substr(i, d.len));
    i += d.len;
  }
  return out;
}

// ------------------------------------------------------------------------------------ opaque.cpp

inline void find_opaque(std::string_view text, std::vector<Finding>& found) {
  const size_t n = text.size();
  for (size_t i = 0; i < n;) {
    if (base64_digit(text[i]) < 0) {
      ++i;
      continue;
    }
    size_t j = i, chars = 0;
    unsigned classes = 0;  // 1 upper, 2 lower, 4 digit
    while (j < n) {
      if (const int d = base64_digit(text[j]); d >= 0) {
        classes |= d < 26 ? 1u : d < 52 ? 2u : d < 62 ? 4u : 0u;
        ++chars;
        ++j;
      } else if ((text[j] == '\n' || text[j] == '\r') && j + 1 < n &&
                 (base64_digit(text[j + 1]) >= 0 || text[j + 1] == '\n')) {
        ++j;
      } else {
        break;
      }
    }
    for (int pad = 0; pad < 2 && j < n && text[j] == '='; ++pad) ++j;
    if (chars >= kOpaqueMinChars && classes == 7u && !base64_decodes_to_text(text.substr(i, j - i)))
      found.push_back({DetectorKind::opaque, i, j - i});
    i = j;
  }
}


// ------------------------------------------------------------------------------------ detectors.cpp (opaque merge)

inline void scan_sensitive(std::string_view text, DetectorSet en, std::vector<Finding>& out, size_t max_findings) {
  if (en.empty()) return;
  if (en.has(DetectorKind::opaque)) {
    if (max_findings && out.size() >= max_findings) return;
    std::vector<Finding> opaque;
    router_reference::find_opaque(text, opaque);
    DetectorSet rest = en;
    rest.set(DetectorKind::opaque, false);
    if (opaque.empty()) return router_reference::scan_sensitive(text, rest, out, max_findings);
    const size_t first = out.size();
    router_reference::scan_sensitive(text, rest, out, 0);
    std::vector<Finding> all(out.begin() + std::ptrdiff_t(first), out.end());
    out.resize(first);
    all.insert(all.end(), opaque.begin(), opaque.end());
    std::stable_sort(all.begin(), all.end(), [](const Finding& a, const Finding& b) { return a.offset < b.offset; });
    for (const Finding& f : all) {
      if (out.size() > first && out.back().offset + out.back().length > f.offset) {
        if (f.length > out.back().length) out.back() = f;
        continue;
      }
      out.push_back(f);
    }
    if (max_findings && out.size() > max_findings) out.resize(max_findings);
    return;
  }
  lilac::router::detail::scan_sensitive_plain(text, en, out, max_findings);
}

// ------------------------------------------------------------------------------------ router.cpp (text_sensitive)

inline bool text_sensitive(const lilac::router::RoutePolicy& policy, std::string_view text, bool is_id,
                           std::vector<std::string>* matched) {
  if (text.empty()) return false;
  std::vector<Finding> f;
  DetectorSet detectors = policy.detectors;
  if (is_id) detectors.set(DetectorKind::high_entropy, false);
  if (!detectors.empty()) {
    router_reference::scan_sensitive(text, detectors, f, 1);
    if (!f.empty()) {
      if (matched) matched->push_back(lilac::router::detector_name(f[0].kind));
      return true;
    }
  }
  if (policy.rules.empty()) return false;
  std::string fold_buf;
  bool folded = false;
  for (const auto& r : policy.rules) {
    if (r.case_insensitive() && !folded) {
      fold_buf.assign(text);
      for (auto& c : fold_buf)
        if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
      folded = true;
    }
    if (r.matches(text, fold_buf)) {
      if (matched) matched->push_back("rule:" + r.name());
      return true;
    }
  }
  return false;
}

// ------------------------------------------------------------------------------------ scan.cpp

inline bool is_id_key(std::string_view k) { return k == "id" || k == "tool_call_id" || k == "call_id"; }
// Keys under which the values are the user's data, whatever their own keys say: a tool call's input or arguments,
// metadata, and what a schema lists as examples or values.
inline bool is_user_data_key(std::string_view k) {
  return k == "input" || k == "arguments" || k == "metadata" || k == "examples" || k == "default" || k == "enum" ||
         k == "const" || k == "properties";
}
// Keys whose string values are what the model reads (message text, prompts, tool inputs and results): also joined
// apart from the other values, so that a setting between two text blocks (a cache_control ttl) does not hide a secret
// split across them.
inline bool is_content_key(std::string_view k) {
  return k == "text" || k == "content" || k == "prompt" || k == "input" || k == "output" || k == "arguments" ||
         k == "thinking";
}
// Values that name protocol structure, not content: checked alone, left out of the joined text.
inline bool is_structural_key(std::string_view k) { return k == "role" || k == "type" || k == "object" || k == "model"; }

inline bool looks_like_json(std::string_view s) {
  size_t i = s.find_first_not_of(" \t\r\n");
  return i != std::string_view::npos && (s[i] == '{' || s[i] == '[') && s.size() >= 2;
}

// A secret split across values lies within this many bytes of a seam between them (the longest
// detector matches: e-mail addresses, IBANs, keys; a PEM block's header alone counts).
constexpr size_t kSeamWindow = 1024;

struct Scanner {
  const TextCheck& check;
  const ScanOptions& opts;
  ScanOutcome out;
  uint64_t budget_used = 0;
  std::string joined, spaced;             // the string values in order, without / with a space between
  std::vector<size_t> seams_j, seams_s;   // where each value after the first starts in them
  std::string content;                    // the values under is_content_key only, in order
  std::vector<size_t> seams_c;

  // The text around the seams of `all` (windows merged where they overlap).
  bool seams(const std::string& all, const std::vector<size_t>& at) {
    size_t b = 0, e = 0;
    bool open = false;
    for (size_t k = 0; k <= at.size(); ++k) {
      const bool last = k == at.size();
      const size_t wb = last ? 0 : (at[k] > kSeamWindow ? at[k] - kSeamWindow : 0);
      const size_t we = last ? 0 : std::min(all.size(), at[k] + kSeamWindow);
      if (open && (last || wb > e)) {
        if (text(std::string_view(all).substr(b, e - b), false)) return true;
        open = false;
      }
      if (last) break;
      if (!open) {
        b = wb;
        open = true;
      }
      e = we;
    }
    return false;
  }

  // Checks a text and its variants; true when the scan is over (a hit, or the budget is spent).
  bool text(std::string_view t, bool is_id) {
    if (t.empty()) return false;
    if (charge(t.size())) return true;
    if (check(t, is_id, &out.matched)) return hit();
    // One byte more than what is left: a variant that does not fit whole is cut past the budget, so charge() calls
    // the body unscannable. Cut at exactly what was left it landed on the budget and passed: a text whose canonical
    // form grew past it (U+FDFA is 33 bytes in NFKC) was shown clean with its decoded end never looked at.
    for (const std::string& v : text_variants(t, opts.max_bytes - std::min(opts.max_bytes, budget_used) + 1)) {
      if (charge(v.size())) return true;
      if (check(v, is_id, &out.matched)) return hit();
    }
    return false;
  }
  bool hit() {
    out.sensitive = true;
    return true;
  }
  bool charge(uint64_t n) {
    budget_used += n;
    if (budget_used <= opts.max_bytes) return false;
    out.unscannable = true;
    out.matched.push_back("unscannable");
    return true;
  }

  bool walk(const ojson& root) {
    struct Item {
      const ojson* v;
      std::string_view key;  // the key this value sits under (arrays pass theirs on)
      int embedded;
      // A protocol id (`id`, `tool_call_id`, `call_id`: random by design, so not checked for high entropy) is one
      // that sits in a protocol object (one with a `type`, `role` or `object` member), outside the user's data (JSON
      // found in a string, or under is_user_data_key). Any key called `id` at any depth was exempt before: a secret
      // in a tool call's input as {"id": ...} went upstream unchecked for entropy.
      bool protocol_parent;
      bool user_data;
    };
    std::deque<ojson> parsed;  // JSON found inside strings (stable addresses)
    std::vector<Item> stack{{&root, "", 0, false, false}};
    while (!stack.empty()) {
      const Item it = stack.back();
      stack.pop_back();
      const ojson& v = *it.v;
      if (v.is_object()) {
        // Pushed in reverse so that values come out in document order.
        const auto& entries = v.get_ref<const ojson::object_t&>();
        const bool proto = v.contains("type") || v.contains("role") || v.contains("object");
        // (the body's own "input" is the Responses API's list of items, protocol objects with their ids)
        auto user_data = [&](std::string_view k) { return is_user_data_key(k) && !(it.v == &root && k == "input"); };
        for (auto e = entries.rbegin(); e != entries.rend(); ++e)
          stack.push_back({&e->second, e->first, it.embedded, proto, it.user_data || user_data(e->first)});
        for (const auto& e : entries)
          if (text(e.first, false)) return true;
      } else if (v.is_array()) {
        const auto& items = v.get_ref<const ojson::array_t&>();
        for (auto e = items.rbegin(); e != items.rend(); ++e)
          stack.push_back({&*e, it.key, it.embedded, it.protocol_parent, it.user_data});
      } else if (v.is_string()) {
        const std::string& s = v.get_ref<const std::string&>();
        const bool protocol_id = is_id_key(it.key) && it.protocol_parent && !it.user_data;
        if (text(s, protocol_id)) return true;
        if (!protocol_id && !is_structural_key(it.key) && !s.empty() && joined.size() < opts.max_bytes) {
          out.text_bytes += s.size();
          if (!joined.empty()) {
            seams_j.push_back(joined.size());
            spaced.push_back(' ');
            seams_s.push_back(spaced.size());
          }
          joined += s;
          spaced += s;
          if (is_content_key(it.key)) {
            if (!content.empty()) seams_c.push_back(content.size());
            content += s;
          }
        }
        if (it.embedded < opts.max_embedded && looks_like_json(s)) {
          // Not the request limits' 16,384 keys per object: JSON inside a string is scanned through its parse
          // (escapes decoded) wherever the document's own bounds allow, as before that limit.
          JsonParseResult r = parse_bounded_json(s, JsonLimits{});
          if (r.ok() && r.value.is_structured()) {
            parsed.push_back(std::move(r.value));
            stack.push_back({&parsed.back(), it.key, it.embedded + 1, false, true});
          }
        }
      } else if (v.is_number()) {
        if (text(dump_json(v), false)) return true;
      }
    }
    return false;
  }
};

inline ScanOutcome scan_body(const ojson& body, const TextCheck& check, const ScanOptions& opts) {
  Scanner sc{check, opts, {}, 0, {}, {}, {}, {}, {}, {}};
  // Secrets split across values: the joined texts around each seam, without and with a space, and the content values
  // alone.
  if (!sc.walk(body) && !sc.seams(sc.joined, sc.seams_j) && !sc.seams(sc.spaced, sc.seams_s))
    sc.seams(sc.content, sc.seams_c);
  return std::move(sc.out);
}


}  // namespace router_reference
