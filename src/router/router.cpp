// The hybrid router's decision (Router): message-prefix hashing for stickiness, the sensitivity scan, and
// the rule order of router.h.
#include "router/router.h"

#include <algorithm>
#include <cstring>

#include "router/detectors.h"

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
      hs.bytes(it.v->dump());  // a number, boolean or null
    }
  }
}

void hash_string_field(Hasher& hs, const ojson& m, const char* key, char tag) {
  auto it = m.find(key);
  if (it == m.end() || !it->is_string()) return;
  hs.tag(tag);
  hs.bytes(it->get_ref<const std::string&>());
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
  auto c = m.find("content");
  hs.tag('c');
  if (c != m.end()) {
    if (c->is_string()) {
      hs.bytes(c->get_ref<const std::string&>());
    } else if (c->is_array()) {
      // Text parts hash like their concatenation as one string would not: keep parts distinct but make
      // a single text part equal to the plain string (clients switch between the two forms).
      if (c->size() == 1 && (*c)[0].is_object() && (*c)[0].value("type", "") == "text" && (*c)[0].contains("text") &&
          (*c)[0]["text"].is_string()) {
        hs.bytes((*c)[0]["text"].get_ref<const std::string&>());
      } else {
        for (const auto& part : *c) {
          if (part.is_object() && part.value("type", "") == "text" && part.contains("text") && part["text"].is_string()) {
            hs.tag('t');
            hs.bytes(part["text"].get_ref<const std::string&>());
          } else {
            hs.tag('p');
            hash_value(hs, part);
          }
        }
      }
    } else if (!c->is_null()) {
      hash_value(hs, *c);
    } else {
      hs.bytes("");
    }
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
      auto args = fn->find("arguments");
      if (args != fn->end()) {
        hs.tag('A');
        if (args->is_string()) hs.bytes(args->get_ref<const std::string&>());
        else hash_value(hs, *args);
      }
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

bool Router::text_sensitive(std::string_view text, std::vector<std::string>* matched, std::string& fold_buf) const {
  if (text.empty()) return false;
  std::vector<Finding> f;
  if (!policy_.detectors.empty()) {
    scan_sensitive(text, policy_.detectors, f, 1);
    if (!f.empty()) {
      if (matched) matched->push_back(detector_name(f[0].kind));
      return true;
    }
  }
  if (policy_.rules.empty()) return false;
  bool folded = false;
  for (const auto& r : policy_.rules) {
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

namespace {

// Calls fn(text) for every text of the request that may carry user data; stops when fn returns true.
// Returns whether fn returned true. `bytes` accumulates the size of what was visited.
template <class Fn>
bool visit_texts(const ojson& body, bool chat, Fn&& fn, uint64_t* bytes) {
  auto visit = [&](const ojson& v) -> bool {
    if (v.is_string()) {
      const auto& s = v.get_ref<const std::string&>();
      *bytes += s.size();
      return fn(std::string_view(s));
    }
    if (v.is_null() || v.is_number() || v.is_boolean()) return false;
    std::string d = v.dump();  // objects (tool-call arguments given as objects), odd content types
    *bytes += d.size();
    return fn(std::string_view(d));
  };
  if (chat) {
    auto ms = body.find("messages");
    if (ms == body.end() || !ms->is_array()) return false;
    for (const auto& m : *ms) {
      if (!m.is_object()) {
        if (visit(m)) return true;
        continue;
      }
      auto c = m.find("content");
      if (c != m.end()) {
        if (c->is_array()) {
          for (const auto& part : *c) {
            if (part.is_object()) {
              auto t = part.find("text");
              if (t != part.end() && t->is_string()) {
                if (visit(*t)) return true;
                continue;
              }
            }
            if (visit(part)) return true;
          }
        } else if (visit(*c)) {
          return true;
        }
      }
      auto rc = m.find("reasoning_content");
      if (rc != m.end() && visit(*rc)) return true;
      auto tc = m.find("tool_calls");
      if (tc != m.end() && tc->is_array()) {
        for (const auto& call : *tc) {
          if (!call.is_object()) continue;
          auto fnj = call.find("function");
          if (fnj == call.end() || !fnj->is_object()) continue;
          auto args = fnj->find("arguments");
          if (args != fnj->end() && visit(*args)) return true;
        }
      }
    }
    return false;
  }
  for (const char* key : {"prompt", "suffix"}) {
    auto p = body.find(key);
    if (p == body.end()) continue;
    if (p->is_array()) {
      for (const auto& x : *p)
        if (x.is_string() && visit(x)) return true;
    } else if (p->is_string() && visit(*p)) {
      return true;
    }
  }
  return false;
}

}  // namespace

bool Router::scan_body(const ojson& body, bool chat, std::vector<std::string>* matched) const {
  std::string fold;
  uint64_t bytes = 0;
  return visit_texts(body, chat, [&](std::string_view t) { return text_sensitive(t, matched, fold); }, &bytes);
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
  if (!policy_.sticky || !body.is_object()) return;
  auto ms = body.find("messages");
  if (ms == body.end() || !ms->is_array() || ms->empty()) return;
  auto hs = message_prefix_hashes(*ms);
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
  if (!policy_.sticky || !body.is_object()) return false;
  auto ms = body.find("messages");
  if (ms == body.end() || !ms->is_array() || ms->empty()) return false;
  {
    std::lock_guard lk(mu_);
    if (sticky_.empty()) return false;
  }
  auto hs = message_prefix_hashes(*ms);
  std::lock_guard lk(mu_);
  for (uint64_t h : hs)
    if (sticky_.count(h)) return true;
  return false;
}

size_t Router::sticky_entries() const {
  std::lock_guard lk(mu_);
  return sticky_.size();
}

RouteDecision Router::decide(const ojson& body, bool chat, std::string_view header_route, bool local_busy) const {
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
    // 2. Sensitivity (and the prompt size, measured on the way).
    std::string fold;
    uint64_t bytes = 0;
    bool any_check = !policy_.detectors.empty() || !policy_.rules.empty();
    d.sensitive = visit_texts(
        body, chat, [&](std::string_view t) { return any_check && text_sensitive(t, &d.matched, fold); }, &bytes);
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
