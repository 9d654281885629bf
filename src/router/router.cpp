// The hybrid router's decision (Router): message-prefix hashing for stickiness, the sensitivity scan, and
// the rule order of router.h.
#include "router/router.h"

#include <algorithm>
#include <cstring>

#include "router/detectors.h"
#include "router/normalize.h"
#include "router/scan.h"
#include "text/bounded_json.h"
#include "text/json_dump.h"

namespace lilac::router {

using ojson = nlohmann::ordered_json;

// ------------------------------------------------------------------------------------------- hashing

namespace {

constexpr uint64_t kK1 = 0x9E3779B97F4A7C15ull, kK2 = 0xC2B2AE3D27D4EB4Full, kK3 = 0x165667B19E3779F9ull;

inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
inline uint64_t fmix(uint64_t h) {
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  return h;
}

// A streaming 64-bit hash: fields are length-prefixed so ("ab","c") != ("a","bc").
struct Hasher {
  uint64_t h = kK3;
  void word(uint64_t w) { h = rotl(h ^ (w * kK1), 31) * kK2; }
  void bytes(std::string_view s) {
    word(s.size());
    const char* p = s.data();
    size_t n = s.size();
    while (n >= 8) {
      uint64_t w;
      std::memcpy(&w, p, 8);
      word(w);
      p += 8;
      n -= 8;
    }
    uint64_t w = 0;
    std::memcpy(&w, p, n);
    word(w ^ (uint64_t(n) << 56));
  }
  void tag(char c) { word(static_cast<unsigned char>(c) | 0xA500ull << 8); }
  uint64_t done() const { return fmix(h); }
};

// Hashes a JSON value independently of its objects' key order (clients re-serialise them freely).
// Iterative: request bodies come from clients.
void hash_value(Hasher& hs, const ojson& root) {
  struct Item {
    const ojson* v = nullptr;
    const std::string* key = nullptr;
    char close = 0;
  };
  std::vector<Item> st{{&root}};
  std::vector<std::pair<const std::string*, const ojson*>> kv;
  while (!st.empty()) {
    const Item it = st.back();
    st.pop_back();
    if (it.close) {
      hs.tag(it.close);
    } else if (it.key) {
      hs.tag(':');
      hs.bytes(*it.key);
    } else if (it.v->is_object()) {
      hs.tag('{');
      st.push_back({nullptr, nullptr, '}'});
      kv.clear();
      for (auto i = it.v->begin(); i != it.v->end(); ++i) kv.emplace_back(&i.key(), &i.value());
      std::sort(kv.begin(), kv.end(), [](const auto& a, const auto& b) { return *a.first > *b.first; });
      for (const auto& [k, v] : kv) {  // largest key pushed first: popped in ascending order
        st.push_back({v});
        st.push_back({nullptr, k});
      }
    } else if (it.v->is_array()) {
      hs.tag('[');
      st.push_back({nullptr, nullptr, ']'});
      for (auto i = it.v->rbegin(); i != it.v->rend(); ++i) st.push_back({&*i});
    } else if (it.v->is_string()) {
      hs.tag('s');
      hs.bytes(it.v->get_ref<const std::string&>());
    } else {
      hs.tag('v');
      hs.bytes(dump_json(*it.v));  // a number, boolean or null
    }
  }
}

void hash_string_field(Hasher& hs, const ojson& m, const char* key, char tag) {
  auto it = m.find(key);
  if (it == m.end() || !it->is_string()) return;
  hs.tag(tag);
  hs.bytes(it->get_ref<const std::string&>());
}

// Text as the stickiness hash sees it: whitespace-insensitive. (The buffer is the thread's: a 100 KB string allocated
// and freed per message cost page faults each time; one grown for a huge text is not kept.)
void hash_text(Hasher& hs, std::string_view t) {
  thread_local std::string collapsed;
  collapse_whitespace(t, collapsed);
  hs.bytes(collapsed);
  release_if_large(collapsed);
}

// A tool call's arguments: a JSON string hashes as its parsed value ('{"a": 1}' and '{"a":1}' alike), other text
// whitespace-insensitively, a JSON value as itself.
void hash_arguments(Hasher& hs, const ojson& args) {
  hs.tag('A');
  if (!args.is_string()) return hash_value(hs, args);
  JsonParseResult p = parse_bounded_json(args.get_ref<const std::string&>(), kRequestJsonLimits);
  if (p.ok()) hash_value(hs, p.value);
  else hash_text(hs, args.get_ref<const std::string&>());
}

uint64_t hash_message(const ojson& m) {
  Hasher hs;
  if (!m.is_object()) {
    hs.tag('?');
    hash_value(hs, m);
    return hs.done();
  }
  hash_string_field(hs, m, "role", 'r');
  hash_string_field(hs, m, "name", 'n');
  hash_string_field(hs, m, "tool_call_id", 'i');
  // Responses items other than messages (function_call, function_call_output, reasoning) have no role or content:
  // their type, call id and output tell them apart (they all hashed alike, so one conversation's calls matched
  // another's); their arguments hash as a chat tool call's.
  if (auto t = m.find("type"); t != m.end() && t->is_string() && *t != "message") {
    hash_string_field(hs, m, "type", 't');
    hash_string_field(hs, m, "call_id", 'k');
    if (auto o = m.find("output"); o != m.end()) {
      hs.tag('o');
      if (o->is_string()) hash_text(hs, o->get_ref<const std::string&>());
      else hash_value(hs, *o);
    }
    if (auto a = m.find("arguments"); a != m.end()) hash_arguments(hs, *a);
    if (auto sm = m.find("summary"); sm != m.end()) {
      hs.tag('s');
      hash_value(hs, *sm);
    }
  }
  auto c = m.find("content");
  hs.tag('c');
  if (c != m.end() && c->is_string()) {
    hash_text(hs, c->get_ref<const std::string&>());
  } else if (c != m.end() && c->is_array()) {
    // Text parts hash like their concatenation (what the chat template gets: a single text part and the
    // plain string are the same); other parts by value.
    std::string text;
    bool all_text = true;
    for (const auto& part : *c) {
      // Responses' parts are "input_text" / "output_text": the same text as chat's "text" parts.
      const auto t = part.is_object() ? part.find("type") : part.end();
      const std::string type = t != part.end() && t->is_string() ? t->get<std::string>() : "";
      if ((type == "text" || type == "input_text" || type == "output_text") && part.contains("text") &&
          part["text"].is_string())
        text += part["text"].get_ref<const std::string&>();
      else
        all_text = false;
    }
    if (all_text) hash_text(hs, text);
    else hash_value(hs, *c);
  } else if (c != m.end() && !c->is_null()) {
    hash_value(hs, *c);
  } else {
    hs.bytes("");
  }
  auto tc = m.find("tool_calls");
  if (tc != m.end() && tc->is_array()) {
    for (const auto& call : *tc) {
      hs.tag('f');
      if (!call.is_object()) {
        hash_value(hs, call);
        continue;
      }
      auto fn = call.find("function");
      if (fn == call.end() || !fn->is_object()) continue;
      hash_string_field(hs, *fn, "name", 'N');
      if (auto args = fn->find("arguments"); args != fn->end()) hash_arguments(hs, *args);
    }
  }
  return hs.done();
}

}  // namespace

std::vector<uint64_t> message_prefix_hashes(const ojson& messages) {
  std::vector<uint64_t> out;
  if (!messages.is_array()) return out;
  out.reserve(messages.size());
  uint64_t h = kK2;
  for (const auto& m : messages) {
    h = fmix(rotl(h, 17) ^ (hash_message(m) * kK1) ^ kK3);
    out.push_back(h);
  }
  return out;
}

// ------------------------------------------------------------------------------------------- Router

Router::Router(RoutePolicy policy, RouterConfig config) : policy_(std::move(policy)), config_(std::move(config)) {}

bool Router::text_sensitive(std::string_view text, bool is_id, std::vector<std::string>* matched,
                            std::string& fold_buf) const {
  if (text.empty()) return false;
  std::vector<Finding> f;
  DetectorSet detectors = policy_.detectors;
  if (is_id) detectors.set(DetectorKind::high_entropy, false);  // ids are random by design
  if (!detectors.empty()) {
    scan_sensitive(text, detectors, f, 1);
    if (!f.empty()) {
      if (matched) matched->push_back(detector_name(f[0].kind));
      return true;
    }
  }
  if (policy_.rules.empty()) return false;
  bool folded = false;
  for (const auto& r : policy_.rules) {
    if (r.case_insensitive() && !folded) {
      fold_buf.resize(text.size());
      const unsigned char* in = reinterpret_cast<const unsigned char*>(text.data());
      char* out = fold_buf.data();
      for (size_t i = 0; i < text.size(); ++i)  // (branch-free: vectorised)
        out[i] = static_cast<char>(in[i] + (static_cast<unsigned char>(in[i] - 'A') < 26 ? 'a' - 'A' : 0));
      folded = true;
    }
    if (r.matches(text, fold_buf)) {
      if (matched) matched->push_back("rule:" + r.name());
      return true;
    }
  }
  return false;
}

Api api_for_path(std::string_view path) {
  if (path.find("/chat/completions") != std::string_view::npos) return Api::chat;
  if (path.find("/messages") != std::string_view::npos) return Api::messages;
  if (path.find("/responses") != std::string_view::npos) return Api::responses;
  return Api::completions;
}

const char* upstream_path(Api api) {
  switch (api) {
    case Api::chat: return "/chat/completions";
    case Api::messages: return "/messages";
    case Api::responses: return "/responses";
    case Api::completions: break;
  }
  return "/completions";
}

namespace {

// The prefix hashes of a request's conversation (stickiness): its messages, or a Responses request's input items --
// a string input is one user message, so that the next turn, which sends it back as its first item, matches it (a
// conversation begun locally with a string input was not remembered, and its second turn went to the cloud).
std::vector<uint64_t> conversation_hashes(const ojson& body) {
  if (!body.is_object()) return {};
  for (const char* key : {"messages", "input"}) {
    auto it = body.find(key);
    if (it == body.end()) continue;
    if (it->is_array() && !it->empty()) return message_prefix_hashes(*it);
    if (std::string_view(key) == "input" && it->is_string())
      return message_prefix_hashes(ojson::array({ojson{{"role", "user"}, {"content", *it}}}));
  }
  return {};
}

}  // namespace

ScanOutcome Router::scan(const ojson& body) const {
  // The folded copy of each text for case-insensitive rules: a buffer of the thread's, kept from one request to the
  // next (not re-entered: text_sensitive scans no body), unless a huge text grew it.
  thread_local std::string fold;
  struct Release {
    ~Release() {
      release_if_large(fold);
    }
  } release;
  const bool any_check = !policy_.detectors.empty() || !policy_.rules.empty();
  if (!any_check)  // nothing can fire: the walk only measures the size
    return router::scan_body(body, [](std::string_view, bool, std::vector<std::string>*) { return false; });
  return router::scan_body(body, [&](std::string_view t, bool is_id, std::vector<std::string>* m) {
    return text_sensitive(t, is_id, m, fold);
  });
}

bool Router::scan_body(const ojson& body, bool, std::vector<std::string>* matched) const {
  ScanOutcome o = scan(body);
  if (matched) matched->insert(matched->end(), o.matched.begin(), o.matched.end());
  return o.sensitive || o.unscannable;
}

bool Router::is_upstream_model(const std::string& model) const {
  if (model.empty() || model == config_.local_model_id) return false;
  if (model.rfind(policy_.model_prefix, 0) == 0) return true;
  if (!config_.upstream_model.empty() && model == config_.upstream_model) return true;
  std::lock_guard lk(mu_);
  for (const auto& id : upstream_ids_)
    if (id == model) return true;
  return false;
}

std::string Router::upstream_model_for(const std::string& model) const {
  if (!model.empty() && model != config_.local_model_id) {
    if (model.rfind(policy_.model_prefix, 0) == 0) return model.substr(policy_.model_prefix.size());
    if (model == config_.upstream_model) return model;
    std::lock_guard lk(mu_);
    for (const auto& id : upstream_ids_)
      if (id == model) return model;
  }
  if (!config_.upstream_model.empty()) return config_.upstream_model;
  std::lock_guard lk(mu_);
  return upstream_ids_.empty() ? std::string() : upstream_ids_.front();
}

void Router::set_upstream_model_ids(std::vector<std::string> ids) {
  std::lock_guard lk(mu_);
  upstream_ids_ = std::move(ids);
}

std::vector<std::string> Router::upstream_model_ids() const {
  std::lock_guard lk(mu_);
  return upstream_ids_;
}

void Router::remember_local(const ojson& body) {
  if (!policy_.sticky) return;
  const auto hs = conversation_hashes(body);
  if (hs.empty()) return;
  std::lock_guard lk(mu_);
  if (sticky_.insert(hs.back()).second) {
    sticky_order_.push_back(hs.back());
    while (sticky_order_.size() > policy_.sticky_max_entries) {
      sticky_.erase(sticky_order_.front());
      sticky_order_.pop_front();
    }
  }
}

bool Router::is_sticky(const ojson& body) const {
  if (!policy_.sticky) return false;
  {
    std::lock_guard lk(mu_);
    if (sticky_.empty()) return false;
  }
  const auto hs = conversation_hashes(body);
  std::lock_guard lk(mu_);
  for (uint64_t h : hs)
    if (sticky_.count(h)) return true;
  return false;
}

size_t Router::sticky_entries() const {
  std::lock_guard lk(mu_);
  return sticky_.size();
}

// A request the local server refuses (400) is answered by it, never forwarded: a /v1/completions
// prompt that is not a string, strings or token ids; messages that are not a list. Returns what is
// wrong, or nullptr.
const char* Router::invalid_shape(const ojson& body, bool chat) {
  if (!body.is_object()) return "invalid_body";
  if (chat) {
    auto m = body.find("messages");
    return m != body.end() && !m->is_array() ? "invalid_messages" : nullptr;
  }
  auto p = body.find("prompt");
  if (p == body.end() || p->is_string()) return nullptr;
  if (!p->is_array()) return "invalid_prompt";
  for (const auto& x : *p)
    if (!x.is_string() && !x.is_number_integer() && !x.is_array()) return "invalid_prompt";
  return nullptr;
}

RouteDecision Router::decide(const ojson& body, Api api, std::string_view header_route, bool local_busy) const {
  const bool chat = api != Api::completions;
  RouteDecision d;
  // 1. Explicit choice.
  Route explicit_route = Route::auto_;
  if (body.is_object() && body.contains("lilac")) {
    const auto& l = body["lilac"];
    if (!l.is_object()) {
      d.error_status = 400;
      d.error_message = "'lilac' must be an object such as {\"route\": \"local\"}.";
      d.error_param = "lilac";
      d.error_code = "invalid_route";
      return d;
    }
    if (l.contains("route")) {
      if (!l["route"].is_string() || !parse_route(l["route"].get<std::string>(), &explicit_route)) {
        d.error_status = 400;
        d.error_message = "'lilac.route' must be \"local\", \"cloud\" or \"auto\".";
        d.error_param = "lilac.route";
        d.error_code = "invalid_route";
        return d;
      }
    }
  }
  if (explicit_route == Route::auto_ && !header_route.empty() &&
      !(body.is_object() && body.contains("lilac") && body["lilac"].contains("route"))) {
    if (!parse_route(header_route, &explicit_route)) {
      d.error_status = 400;
      d.error_message = "The x-lilac-route header must be local, cloud or auto.";
      d.error_param = "x-lilac-route";
      d.error_code = "invalid_route";
      return d;
    }
  }
  std::string model;
  if (body.is_object() && body.contains("model") && body["model"].is_string()) model = body["model"].get<std::string>();
  d.model_is_upstream = is_upstream_model(model);

  if (explicit_route == Route::local) {
    d.route = Route::local;
    d.reason = "explicit";
  } else {
    // 2. Sensitivity: everything in the body (router/scan.h); a body that cannot be shown clean counts
    // as sensitive. The prompt size is measured on the way.
    ScanOutcome scanned = scan(body);
    const uint64_t bytes = scanned.text_bytes;
    d.sensitive = scanned.sensitive || scanned.unscannable;
    d.matched = std::move(scanned.matched);
    const char* invalid = invalid_shape(body, chat);
    // A /v1/completions prompt given as token ids cannot be scanned (and means nothing to another
    // tokenizer): it is treated as sensitive.
    if (!d.sensitive && !chat && body.is_object()) {
      auto p = body.find("prompt");
      if (p != body.end() && p->is_array())
        for (const auto& x : *p)
          if (x.is_number() || x.is_array()) {
            d.sensitive = true;
            d.matched.push_back("token_ids");
            break;
          }
    }
    if (d.sensitive) {
      if (explicit_route == Route::cloud && policy_.allow_explicit_cloud_for_sensitive) {
        d.route = Route::cloud;
        d.reason = "explicit";
      } else {
        d.route = Route::local;
        d.reason = "sensitive";
      }
    } else if (invalid) {  // the local server answers 400; never forwarded
      d.route = Route::local;
      d.reason = "invalid";
      d.matched.push_back(invalid);
    } else if (explicit_route == Route::cloud) {
      d.route = Route::cloud;
      d.reason = "explicit";
    } else if (is_sticky(body)) {  // 3.
      d.route = Route::local;
      d.reason = "sticky";
    } else if (d.model_is_upstream) {  // 4.
      d.route = Route::cloud;
      d.reason = "model";
    } else if ((policy_.max_local_prompt_bytes && bytes > policy_.max_local_prompt_bytes) ||
               (policy_.max_local_prompt_tokens && (bytes + 3) / 4 > policy_.max_local_prompt_tokens)) {  // 5.
      d.route = Route::cloud;
      d.reason = "size";
    } else if (local_busy && policy_.local_busy_to_cloud) {  // 6.
      d.route = Route::cloud;
      d.reason = "busy";
    } else {  // 7.
      d.route = policy_.default_route == Route::cloud ? Route::cloud : Route::local;
      d.reason = "default";
    }
  }

  // Model rules veto.
  const std::string& rule_model = model.empty() ? config_.local_model_id : model;
  if (const ModelRule* mr = policy_.model_rule(rule_model)) {
    if (d.route == Route::cloud && !mr->allow_cloud) {
      // Local is always safe, and the rule must allow it (a rule allows at least one route).
      d.route = Route::local;
      d.reason = "model_rule";
    } else if (d.route == Route::local && !mr->allow_local) {
      if (d.reason == "default" && mr->allow_cloud) {
        d.route = Route::cloud;
        d.reason = "model_rule";
      } else {
        d.error_status = 403;
        d.error_code = "route_forbidden";
        d.error_param = "model";
        d.error_message = "The route policy lets model '" + rule_model + "' run only upstream, but this request must stay local (" +
                          d.reason + (d.matched.empty() ? std::string() : ": " + d.matched.front()) +
                          "). Name the local model '" + config_.local_model_id + "' instead.";
        return d;
      }
    }
  }
  if (d.route == Route::cloud) d.upstream_model = upstream_model_for(model);
  return d;
}

}  // namespace lilac::router
