// The sensitivity scan of a whole body (see scan.h). Iterative: bodies come from clients.
#include "router/scan.h"

#include <algorithm>
#include <deque>

#include "router/normalize.h"
#include "text/bounded_json.h"
#include "text/json_dump.h"

namespace lilac::router {

using ojson = nlohmann::ordered_json;

namespace {

bool is_id_key(std::string_view k) { return k == "id" || k == "tool_call_id" || k == "call_id"; }
// Keys under which the values are the user's data, whatever their own keys say: a tool call's input or arguments,
// metadata, and what a schema lists as examples or values.
bool is_user_data_key(std::string_view k) {
  return k == "input" || k == "arguments" || k == "metadata" || k == "examples" || k == "default" || k == "enum" ||
         k == "const" || k == "properties";
}
// Keys whose string values are what the model reads (message text, prompts, tool inputs and results): also joined
// apart from the other values, so that a setting between two text blocks (a cache_control ttl) does not hide a secret
// split across them.
bool is_content_key(std::string_view k) {
  return k == "text" || k == "content" || k == "prompt" || k == "input" || k == "output" || k == "arguments" ||
         k == "thinking";
}
// Values that name protocol structure, not content: checked alone, left out of the joined text.
bool is_structural_key(std::string_view k) { return k == "role" || k == "type" || k == "object" || k == "model"; }

bool looks_like_json(std::string_view s) {
  size_t i = s.find_first_not_of(" \t\r\n");
  return i != std::string_view::npos && (s[i] == '{' || s[i] == '[') && s.size() >= 2;
}

// A secret split across values lies within this many bytes of a seam between them (the longest
// detector matches: e-mail addresses, IBANs, keys; a PEM block's header alone counts).
constexpr size_t kSeamWindow = 1024;

// String values joined (with or without a space between them), kept as the values' places in the body rather than
// copied: only the text around the seams is ever read, and copying three times a 100 KB prompt to read 2 KB of it was
// a tenth of a decision (bench/BENCHMARKS.md "Hybrid router").
struct Joined {
  std::vector<size_t> at;                // where each part starts in the joined text
  std::vector<std::string_view> parts;   // the values, and the spaces between them
  std::vector<size_t> seams;             // where each value after the first starts
  size_t size = 0;

  bool empty() const { return size == 0; }
  void append(std::string_view s) {
    at.push_back(size);
    parts.push_back(s);
    size += s.size();
  }
  // Copies the joined text's bytes [b, e) to `out`.
  void copy(size_t b, size_t e, std::string& out) const {
    out.clear();
    size_t k = size_t(std::upper_bound(at.begin(), at.end(), b) - at.begin()) - 1;  // the part holding b
    for (; b < e; ++k) {
      const size_t from = b - at[k], len = std::min(parts[k].size() - from, e - b);
      out.append(parts[k].data() + from, len);
      b += len;
    }
  }
};

struct Scanner {
  const TextCheck& check;
  const ScanOptions& opts;
  ScanOutcome out;
  uint64_t budget_used = 0;
  Joined joined, spaced;  // the string values in order, without / with a space between
  Joined content;         // the values under is_content_key only, in order
  std::deque<ojson> parsed;  // JSON found inside strings (stable addresses: `joined` holds views of its strings)
  std::string window;        // the text around a seam

  // The text around the seams of `all` (windows merged where they overlap).
  bool seams(const Joined& all) {
    const std::vector<size_t>& at = all.seams;
    size_t b = 0, e = 0;
    bool open = false;
    for (size_t k = 0; k <= at.size(); ++k) {
      const bool last = k == at.size();
      const size_t wb = last ? 0 : (at[k] > kSeamWindow ? at[k] - kSeamWindow : 0);
      const size_t we = last ? 0 : std::min(all.size, at[k] + kSeamWindow);
      if (open && (last || wb > e)) {
        all.copy(b, e, window);
        if (text(window, false)) return true;
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
    // The variants' buffers are the thread's, kept from one text and one request to the next (unless a check scans
    // another body meanwhile), but not when they grew for a huge text.
    thread_local TextVariants kept;
    thread_local bool kept_in_use = false;
    TextVariants own;
    TextVariants& variants = kept_in_use ? own : kept;
    struct Release {
      TextVariants& v;
      bool& in_use;
      bool was;
      ~Release() {
        v.release_large();
        in_use = was;
      }
    } release{variants, kept_in_use, kept_in_use};
    kept_in_use = true;
    text_variants(t, opts.max_bytes - std::min(opts.max_bytes, budget_used) + 1, variants);
    for (std::string_view v : variants) {
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
        if (!protocol_id && !is_structural_key(it.key) && !s.empty() && joined.size < opts.max_bytes) {
          out.text_bytes += s.size();
          if (!joined.empty()) {
            joined.seams.push_back(joined.size);
            spaced.append(" ");
            spaced.seams.push_back(spaced.size);
          }
          joined.append(s);
          spaced.append(s);
          if (is_content_key(it.key)) {
            if (!content.empty()) content.seams.push_back(content.size);
            content.append(s);
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

}  // namespace

ScanOutcome scan_body(const ojson& body, const TextCheck& check, const ScanOptions& opts) {
  Scanner sc{check, opts, {}, 0, {}, {}, {}, {}, {}};
  // Secrets split across values: the joined texts around each seam, without and with a space, and the content values
  // alone.
  if (!sc.walk(body) && !sc.seams(sc.joined) && !sc.seams(sc.spaced)) sc.seams(sc.content);
  return std::move(sc.out);
}

}  // namespace lilac::router
