// GrammarConstraint in the generation loop: the tiny random-weight model sampled at temperature 1
// under a JSON Schema always writes a prefix of a valid document, and a complete one when it ends
// with the end-of-turn id; a token outside the mask is an error.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "cpu/cpu_backend.h"
#include "engine/generator.h"
#include "engine/grammar_constraint.h"
#include "grammar/schema.h"
#include "model/weights.h"
#include "text/tokenizer.h"

using namespace lilac;

namespace {

// The tiny fixture's 2048 ids as text: 0..255 single bytes, some merged tokens, an end-of-turn
// markup token; the rest have no text.
class TinyTokenizer final : public Tokenizer {
 public:
  static constexpr int32_t kEnd = 2000;
  TinyTokenizer() : tokens_(2048) {
    for (int b = 0; b < 256; ++b) tokens_[size_t(b)] = std::string(1, char(b));
    const char* merged[] = {"{\"", "\":", "\"}", "\",", ", \"", "true", "false", "null", "12", "abc", " \"", "\n  "};
    int32_t id = 256;
    for (const char* m : merged) tokens_[size_t(id++)] = m;
    tokens_[kEnd] = "<|im_end|>";
  }
  std::vector<int32_t> encode(std::string_view, bool) const override { throw Error("not used"); }
  std::string decode(std::span<const int32_t> ids, bool skip_special) const override {
    std::string s;
    for (int32_t t : ids)
      if (!(skip_special && t == kEnd)) s += token_bytes(t);
    return s;
  }
  const std::string& token_bytes(int32_t id) const override {
    static const std::string none;
    return id >= 0 && id < 2048 ? tokens_[size_t(id)] : none;
  }
  std::optional<int32_t> token_id(std::string_view t) const override {
    for (size_t i = 0; i < tokens_.size(); ++i)
      if (tokens_[i] == t) return int32_t(i);
    return std::nullopt;
  }
  bool is_special(int32_t id) const override { return id == kEnd; }
  bool is_added(int32_t id) const override { return id == kEnd; }
  int64_t vocab_size() const override { return 2048; }
  std::string eos_token() const override { return "<|im_end|>"; }
  std::string bos_token() const override { return ""; }

 private:
  std::vector<std::string> tokens_;
};

std::shared_ptr<const ModelWeights> tiny() {
  static auto w = load_model(std::string(LILAC_SHARED_DIR) + "/fixtures/tiny/mlx4", LoadOptions{.progress = false});
  return w;
}

}  // namespace

TEST(GrammarConstraint, SampledOutputFollowsTheSchema) {
  TinyTokenizer tok;
  auto be = make_cpu_backend(tiny(), 2);
  ASSERT_EQ(be->config().vocab_size, 2048);
  auto vocab = grammar::Vocabulary::from_tokenizer(tok, be->config().vocab_size);
  const char* schema =
      R"({"type":"object","properties":{"name":{"type":"string","maxLength":6},"n":{"type":"integer","minimum":0,"maximum":99},"ok":{"type":"boolean"}},"required":["name","n","ok"]})";
  auto g = std::make_shared<const grammar::CompiledGrammar>(grammar::compile_json_schema_text(schema), vocab, nullptr);
  auto session = be->new_session(512);
  Generator gen(*session, tok, nullptr);
  int complete = 0;
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    GenerationRequest r;
    r.prompt = {1, 2, 3, 4};
    r.sampling.temperature = 1.f;
    r.sampling.seed = seed;
    r.max_tokens = 120;
    r.stop_ids = {TinyTokenizer::kEnd};
    auto constraint = std::make_shared<GrammarConstraint>(g, r.stop_ids);
    r.constraint = constraint;
    std::string text;
    GenerationStats st = gen.run(r, [&](const GeneratedToken& t) {
      text += t.text;
      return true;
    });
    if (st.stopped_by_eos) {
      ++complete;
      EXPECT_TRUE(constraint->matcher().finished());
      const auto doc = nlohmann::json::parse(text);  // throws (fails the test) when not JSON
      ASSERT_TRUE(doc["name"].is_string()) << text;
      size_t chars = 0;  // maxLength counts characters (code points)
      for (unsigned char c : doc["name"].get<std::string>()) chars += (c & 0xC0) != 0x80;
      EXPECT_LE(chars, 6u) << text;
      EXPECT_TRUE(doc["n"].is_number_integer() && doc["n"].get<int>() >= 0 && doc["n"].get<int>() <= 99) << text;
      EXPECT_TRUE(doc["ok"].is_boolean()) << text;
    } else {
      EXPECT_EQ(st.finish, FinishReason::Length) << text;
      grammar::Matcher m(g, {TinyTokenizer::kEnd});
      EXPECT_TRUE(m.accept_bytes(text)) << "not a prefix of a document: " << text;
    }
  }
  EXPECT_GE(complete, 3);  // random weights at temperature 1: most runs end within 120 tokens
}

TEST(GrammarConstraint, RefusesATokenOutsideTheMask) {
  TinyTokenizer tok;
  auto vocab = grammar::Vocabulary::from_tokenizer(tok, 2048);
  auto g = std::make_shared<const grammar::CompiledGrammar>(grammar::compile_json_schema_text(R"({"type":"null"})"),
                                                            vocab, nullptr);
  GrammarConstraint c(g, {TinyTokenizer::kEnd});
  const uint32_t* m = c.allowed();
  EXPECT_TRUE((m['n' >> 5] >> ('n' & 31)) & 1u);
  EXPECT_FALSE((m['x' >> 5] >> ('x' & 31)) & 1u);
  EXPECT_THROW(c.accept('x'), Error);
  c.accept('n');
}
