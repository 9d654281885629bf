// Token masks on the real Qwen3 vocabulary: exact (equal to stepping every token's bytes), sound
// (random walks that pick uniformly among allowed tokens always yield documents that parse and
// validate) and complete (every valid document is reachable under any tokenization).
#include <gtest/gtest.h>

#include <random>

#include "grammar_corpus.h"
#include "grammar_test_util.h"
#include "schema_validator.h"

namespace lilac::grammar::test {
namespace {

// Schemas for the walks: the corpus plus one per keyword family.
std::vector<std::pair<std::string, std::string>> walk_schemas() {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& c : corpus::cases()) out.push_back({c.name, c.schema});
  const std::vector<std::pair<std::string, std::string>> more = {
      {"scalars", R"({"type":"array","prefixItems":[{"type":"null"},{"type":"boolean"},{"type":"integer"},{"type":"number"},{"type":"string"}],"items":false,"minItems":5})"},
      {"lengths", R"({"type":"object","properties":{"a":{"type":"string","minLength":3,"maxLength":6},"b":{"type":"string","maxLength":1},"c":{"type":"string","minLength":2}},"required":["a","b","c"]})"},
      {"int_ranges", R"({"type":"array","items":{"anyOf":[{"type":"integer","minimum":-50,"maximum":-7},{"type":"integer","exclusiveMinimum":999,"maximum":1003}]},"minItems":1,"maxItems":4})"},
      {"enum_mix", R"({"type":"object","properties":{"e":{"enum":["a\"b","\u00e9",null,12.5,[1,2],{"k":false}]},"c":{"const":"fixed"}},"required":["e","c"]})"},
      {"extra_props", R"({"type":"object","properties":{"id":{"type":"integer"}},"additionalProperties":{"type":"string","maxLength":4},"required":["id"]})"},
      {"pattern_unicode", R"({"type":"object","properties":{"p":{"type":"string","pattern":"^[\u00e0-\u00ff]{2}[a-z]?x$"},"q":{"type":"string","pattern":"ab"}},"required":["p","q"]})"},
      {"all_of", R"({"allOf":[{"type":"object","properties":{"a":{"type":"boolean"}},"required":["a"]},{"properties":{"b":{"type":"array","items":{"type":"integer"},"maxItems":3}}}]})"},
      {"one_of_tagged", R"({"type":"array","items":{"oneOf":[{"type":"object","properties":{"t":{"const":"x"},"v":{"type":"integer"}},"required":["t","v"]},{"type":"object","properties":{"t":{"const":"y"},"w":{"type":"boolean"}},"required":["t","w"]}]},"maxItems":3})"},
      {"date_formats", R"({"type":"array","prefixItems":[{"type":"string","format":"date"},{"type":"string","format":"time"},{"type":"string","format":"date-time"},{"type":"string","format":"uuid"},{"type":"string","format":"email"}],"items":false,"minItems":5})"},
      {"any_object_typed", R"({"type":"object"})"},
  };
  out.insert(out.end(), more.begin(), more.end());
  return out;
}

Grammar compile_case(const std::string& schema) {
  return schema.empty() ? json_object_grammar() : compile_json_schema_text(schema);
}

std::vector<int32_t> allowed_list(const std::vector<uint32_t>& mask) {
  std::vector<int32_t> out;
  for (size_t w = 0; w < mask.size(); ++w)
    for (uint32_t bits = mask[w]; bits; bits &= bits - 1) out.push_back(int32_t(w * 32 + size_t(__builtin_ctz(bits))));
  return out;
}

// The full mask against stepping every token; also no bit beyond the tokenizer and no added token
// except the end token exactly when the document is complete.
void expect_exact(Matcher& m, const std::vector<uint32_t>& mask, const std::string& where) {
  const auto& v = *qwen3_vocab();
  size_t bad = 0;
  for (int32_t t = 0; t < int32_t(v.mask_size()); ++t) {
    const bool want = t < v.n_tokens() ? m.allows(t) : false;
    if (bit(mask, t) != want && ++bad <= 5)
      ADD_FAILURE() << where << ": token " << t << " '" << (t < v.n_tokens() ? v.bytes(t) : "") << "' mask " << bit(mask, t)
                    << " stepping " << want;
  }
  for (int32_t t = 0; t < int32_t(v.n_tokens()); ++t)
    if (qwen3().is_added(t)) EXPECT_EQ(bit(mask, t), t == qwen3_im_end() && m.can_end()) << where << " added token " << t;
}

TEST(GrammarMasks, ExactAlongCorpusDocuments) {
  std::vector<uint32_t> mask(qwen3_vocab()->mask_words());
  for (const auto& c : corpus::cases()) {
    auto g = compiled(compile_case(c.schema));
    for (const auto& doc : c.docs) {
      Matcher m(g, {qwen3_im_end()});
      const auto ids = qwen3().encode(doc);
      for (size_t i = 0; i <= ids.size(); ++i) {
        m.fill_mask(mask);
        if (i % 16 == 0 || i + 2 >= ids.size()) expect_exact(m, mask, c.name + " step " + std::to_string(i));
        const int32_t t = i < ids.size() ? ids[i] : qwen3_im_end();
        ASSERT_TRUE(bit(mask, t)) << c.name << " step " << i << " token '" << qwen3().token_bytes(t) << "'";
        ASSERT_TRUE(m.accept_token(t)) << c.name << " step " << i;
      }
      EXPECT_TRUE(m.finished());
    }
  }
}

TEST(GrammarMasks, RandomWalksYieldValidDocuments) {
  const auto& v = *qwen3_vocab();
  const std::vector<int32_t>& byte_token = byte_tokens();
  std::vector<uint32_t> mask(v.mask_words());
  size_t walks = 0, natural = 0;
  for (const auto& [name, schema] : walk_schemas()) {
    auto g = compiled(compile_case(schema));
    const VJson root = schema.empty() ? VJson::parse(R"({"type":"object"})") : VJson::parse(schema);
    const Validator validator(root);
    for (uint64_t seed = 1; seed <= 4; ++seed) {
      std::mt19937_64 rng(seed * 7919 + std::hash<std::string>()(name));
      Matcher m(g, {qwen3_im_end()});
      std::string text;
      bool ended = false;
      for (int step = 0; step < 120 && !ended; ++step) {
        m.fill_mask(mask);
        const std::vector<int32_t> allowed = allowed_list(mask);
        ASSERT_FALSE(allowed.empty()) << name << " seed " << seed << " after: " << text;
        // Spot-check the mask against stepping, on allowed and random tokens.
        for (int k = 0; k < 24; ++k) {
          const int32_t t = k % 2 ? allowed[rng() % allowed.size()] : int32_t(rng() % uint64_t(v.n_tokens()));
          ASSERT_EQ(bit(mask, t), m.allows(t)) << name << " token " << t << " after: " << text;
        }
        const int32_t t = allowed[rng() % allowed.size()];
        ASSERT_TRUE(m.accept_token(t));
        if (t == qwen3_im_end()) ended = true;
        else text += v.bytes(t);
      }
      natural += ended;
      if (!ended) {  // finish along the shortest completion, one byte token at a time
        auto rest = m.shortest_completion();
        ASSERT_TRUE(rest.has_value()) << name;
        for (int32_t t : *rest) {
          m.fill_mask(mask);
          ASSERT_EQ(v.bytes(t).size(), 1u);
          ASSERT_EQ(t, byte_token[uint8_t(v.bytes(t)[0])]);
          ASSERT_TRUE(bit(mask, t)) << name << " completion token " << t << " after: " << text;
          ASSERT_TRUE(m.accept_token(t));
          text += v.bytes(t);
        }
        m.fill_mask(mask);
        ASSERT_TRUE(bit(mask, qwen3_im_end())) << name;
      }
      ++walks;
      VJson doc;
      try {
        doc = VJson::parse(text);
      } catch (const std::exception& e) {
        FAIL() << name << " seed " << seed << ": not JSON (" << e.what() << "): " << text;
      }
      EXPECT_EQ(validator.check(doc), "") << name << " seed " << seed << ": " << text;
      if (schema.empty()) EXPECT_TRUE(doc.is_object());
    }
  }
  EXPECT_EQ(walks, walk_schemas().size() * 4);
  RecordProperty("natural_endings", int(natural));
}

// A random way of splitting `doc` into vocabulary tokens.
std::vector<int32_t> random_tokenization(const std::string& doc, std::mt19937_64& rng) {
  const auto& v = *qwen3_vocab();
  std::vector<int32_t> out;
  size_t pos = 0;
  while (pos < doc.size()) {
    std::vector<std::pair<int32_t, size_t>> options;  // (token, length)
    uint32_t node = 0;
    for (size_t len = 1; pos + len <= doc.size(); ++len) {
      uint32_t next = 0;
      for (const Vocabulary::Child& ch : v.children(node))
        if (ch.byte == uint8_t(doc[pos + len - 1])) next = ch.node;
      if (!next) break;
      node = next;
      for (int32_t t : v.tokens_at(node)) options.push_back({t, len});
    }
    const auto& pick = options[rng() % options.size()];
    out.push_back(pick.first);
    pos += pick.second;
  }
  return out;
}

void expect_reachable(const std::shared_ptr<const CompiledGrammar>& g, const std::vector<int32_t>& ids, const std::string& what) {
  Matcher m(g, {qwen3_im_end()});
  std::vector<uint32_t> mask(m.mask_words());
  for (size_t i = 0; i < ids.size(); ++i) {
    m.fill_mask(mask);
    ASSERT_TRUE(bit(mask, ids[i])) << what << " token " << i << " '" << qwen3().token_bytes(ids[i]) << "'";
    ASSERT_TRUE(m.accept_token(ids[i]));
  }
  m.fill_mask(mask);
  EXPECT_TRUE(bit(mask, qwen3_im_end())) << what;
}

TEST(GrammarMasks, EveryValidDocumentIsReachable) {
  std::vector<std::pair<std::string, std::vector<std::string>>> sets;
  for (const auto& c : corpus::cases()) sets.push_back({c.schema, c.docs});
  sets.push_back({R"({"type":"object","properties":{"s":{"type":"string","maxLength":12},"t":{"type":"string","minLength":1}},"required":["s","t"]})",
                  {"{\"s\":\"\xE4\xB8\x96\xE7\x95\x8C\\u00e9\\ud83d\\ude00 ok\",\"t\":\"\\\"\\\\\\/\\b\\f\\n\\r\\t\"}",
                   "{ \"s\" : \"\" ,\n \"t\" : \"\xF0\x9F\x98\x80\" }"}});
  sets.push_back({R"({"type":"array","items":{"type":"number"}})", {"[0, -0.0, 1e5, 2.5E-3, -12.75, 1234567890123456789]"}});
  std::mt19937_64 rng(42);
  for (const auto& [schema, docs] : sets) {
    auto g = compiled(compile_case(schema));
    for (const auto& doc : docs) {
      ASSERT_TRUE(accepts(g->grammar(), doc)) << doc;
      expect_reachable(g, qwen3().encode(doc), "real tokenization of " + doc);
      for (int k = 0; k < 4; ++k) expect_reachable(g, random_tokenization(doc, rng), "random tokenization of " + doc);
      std::vector<int32_t> bytes;
      for (unsigned char b : doc) bytes.push_back(byte_tokens()[b]);
      expect_reachable(g, bytes, "bytes of " + doc);
    }
  }
}

TEST(GrammarMasks, StringClassesFromProfilesEqualWalks) {
  // The fast path for strings (token profiles, per character count) against walking the trie.
  const auto& v = *qwen3_vocab();
  for (auto [lo, hi] : std::vector<std::pair<int64_t, int64_t>>{{0, -1}, {3, -1}, {0, 5}, {2, 40}}) {
    Grammar g;
    Rule r;
    r.kind = Rule::Kind::String;
    r.min_chars = lo;
    r.max_chars = hi;
    g.root = g.add_rule(r);
    ConfigSpace sp(g);
    TokenClassCache cache(size_t(1) << 30);
    for (jstr::Sub sub : {jstr::N, jstr::C1, jstr::E0, jstr::Esc, jstr::U2, jstr::HP}) {
      for (int64_t k : {int64_t(0), int64_t(2), int64_t(5)}) {
        if (hi >= 0 && k + (jstr::pending(sub) ? 1 : 0) > hi) continue;
        if (hi < 0 && k > lo) continue;
        const int32_t state = jstr::body_state(k, sub);
        auto fast = classify_string(*cache.profile(v, sub), v, lo, hi, k);
        auto walk = classify_walk(sp, v, 0, state);
        std::vector<uint32_t> a(v.token_words()), b(v.token_words());
        fast->apply(a.data());
        walk->apply(b.data());
        EXPECT_EQ(a, b) << "accepted tokens differ: lo " << lo << " hi " << hi << " sub " << int(sub) << " k " << k;
        auto nodes = [](const TokenClass& c) {
          std::vector<uint32_t> n;
          for (const auto& e : c.escapes) n.insert(n.end(), e.second.begin(), e.second.end());
          std::sort(n.begin(), n.end());
          return n;
        };
        EXPECT_EQ(nodes(*fast), nodes(*walk)) << "escapes differ: lo " << lo << " hi " << hi << " sub " << int(sub) << " k " << k;
      }
    }
  }
}


// A maxLength past 2^31 (a valid schema: counts up to 9e15 are accepted) reached the token profiles as
// int32_t(maxLength - k): 2^32 + 1 became 1, so only tokens of at most one character were allowed inside the string
// (2^31 became negative: none), far fewer documents than the schema allows.
TEST(GrammarMasks, HugeMaxLengthDoesNotWrap) {
  const auto& v = *qwen3_vocab();
  for (const int64_t hi : {int64_t(1) << 31, (int64_t(1) << 32) + 1, int64_t(8999999999999999)}) {
    Grammar g;
    Rule r;
    r.kind = Rule::Kind::String;
    r.max_chars = hi;
    g.root = g.add_rule(r);
    ConfigSpace sp(g);
    TokenClassCache cache(size_t(1) << 30);
    for (const int64_t k : {int64_t(0), int64_t(3)}) {
      auto fast = classify_string(*cache.profile(v, jstr::N), v, 0, hi, k);
      auto walk = classify_walk(sp, v, 0, jstr::body_state(k, jstr::N));
      std::vector<uint32_t> a(v.token_words()), b(v.token_words());
      fast->apply(a.data());
      walk->apply(b.data());
      EXPECT_EQ(allowed_count(a), allowed_count(b)) << "maxLength " << hi << " k " << k;
      EXPECT_EQ(a, b) << "maxLength " << hi << " k " << k;
    }
  }
}

}  // namespace
}  // namespace lilac::grammar::test
