#include "grammar/cache.h"

#include "text/json_dump.h"

namespace lilac::grammar {

GrammarCache::GrammarCache(std::shared_ptr<const Vocabulary> vocab, size_t max_grammars, size_t shared_class_budget)
    : vocab_(std::move(vocab)),
      classes_(std::make_shared<TokenClassCache>(shared_class_budget)),
      max_(max_grammars ? max_grammars : 1) {}

std::shared_ptr<const CompiledGrammar> GrammarCache::get(const std::string& key, const std::function<Grammar()>& build) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = index_.find(key);
    if (it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      return it->second->second;
    }
  }
  // Compiled outside the lock (two threads may both compile a new key; one result is kept).
  auto g = std::make_shared<const CompiledGrammar>(build(), vocab_, classes_);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(key);
  if (it != index_.end()) return it->second->second;
  lru_.emplace_front(key, g);
  index_[key] = lru_.begin();
  while (lru_.size() > max_) {
    index_.erase(lru_.back().first);
    lru_.pop_back();
  }
  return g;
}

std::shared_ptr<const CompiledGrammar> GrammarCache::json_schema(const OrderedJson& schema, const SchemaLimits& lim) {
  return get("json_schema:" + dump_json(schema), [&] { return compile_json_schema(schema, lim); });
}

std::shared_ptr<const CompiledGrammar> GrammarCache::json_schema_text(std::string_view text, const SchemaLimits& lim) {
  OrderedJson j;
  try {
    j = OrderedJson::parse(text);
  } catch (const std::exception& e) {
    throw SchemaError(std::string("schema is not valid JSON: ") + e.what(), "", "#");
  }
  return json_schema(j, lim);
}

std::shared_ptr<const CompiledGrammar> GrammarCache::json_object() {
  return get("json_object", [] { return json_object_grammar(); });
}

void GrammarCache::warm() {
  // A JSON object with every shared kind of value, and the formats, byte by byte.
  auto follow = [](const std::shared_ptr<const CompiledGrammar>& g, std::string_view doc) {
    Matcher m(g, {});
    std::vector<uint32_t> mask(m.mask_words());
    for (size_t i = 0; i <= doc.size(); ++i) {
      m.fill_mask(mask);
      if (i < doc.size()) m.accept_bytes(doc.substr(i, 1));
    }
  };
  follow(json_object(), R"({"key": "text \u00e9 \n", "n": [0, -12.5e3, true, false, null], "o": {}})");
  follow(json_schema_text(R"({"type":"array","prefixItems":[{"type":"string","format":"date-time"},)"
                          R"({"type":"string","format":"date"},{"type":"string","format":"time"},)"
                          R"({"type":"string","format":"uuid"},{"type":"string","format":"email"}]})"),
         R"(["2024-01-02T03:04:05Z", "2024-01-02", "03:04:05+01:00", "123e4567-e89b-12d3-a456-426614174000", "a.b@c.de"])");
}

size_t GrammarCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lru_.size();
}

}  // namespace lilac::grammar
