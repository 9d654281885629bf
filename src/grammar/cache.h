// Compiled grammars by key (a schema's text), bounded (least recently used out), thread-safe; one
// per vocabulary, with the token-class cache all its grammars share.
#pragma once
#include <cstddef>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include "grammar/matcher.h"
#include "grammar/schema.h"

namespace lilac::grammar {

class GrammarCache {
 public:
  explicit GrammarCache(std::shared_ptr<const Vocabulary> vocab, size_t max_grammars = 64,
                        size_t shared_class_budget = size_t(256) << 20);

  // A JSON Schema (compiled once per distinct text; SchemaError when it cannot be compiled).
  std::shared_ptr<const CompiledGrammar> json_schema(const OrderedJson& schema, const SchemaLimits& lim = {});
  std::shared_ptr<const CompiledGrammar> json_schema_text(std::string_view text, const SchemaLimits& lim = {});
  // response_format json_object.
  std::shared_ptr<const CompiledGrammar> json_object();
  // Any other grammar, built by `build` unless `key` is cached (keys of different kinds must differ).
  std::shared_ptr<const CompiledGrammar> get(const std::string& key, const std::function<Grammar()>& build);

  // Computes the token classes every schema shares (strings, numbers, whitespace, any value) by
  // following a small JSON object, so that the first request does not pay for them (~20 ms of CPU
  // on the Qwen3 vocabulary). Call once at startup.
  void warm();

  const std::shared_ptr<const Vocabulary>& vocab() const { return vocab_; }
  size_t size() const;

 private:
  std::shared_ptr<const Vocabulary> vocab_;
  std::shared_ptr<TokenClassCache> classes_;
  size_t max_;
  mutable std::mutex mu_;
  std::list<std::pair<std::string, std::shared_ptr<const CompiledGrammar>>> lru_;  // most recent first
  std::unordered_map<std::string, decltype(lru_)::iterator> index_;
};

}  // namespace lilac::grammar
