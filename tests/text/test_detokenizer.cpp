// StreamDetokenizer: UTF-8 safety, stop strings across tokens, flushing.
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "text/detokenizer.h"
#include "text/tokenizer.h"
#include "text/unicode.h"

namespace {

const lilac::Tokenizer& qwen3() {
  static auto tok = lilac::Tokenizer::load(std::string(LILAC_SHARED_DIR) + "/fixtures/qwen3-tokenizer");
  return *tok;
}

int32_t id_of_bytes(const std::string& bytes) {
  for (int32_t id = 0; id < qwen3().vocab_size(); ++id)
    if (qwen3().token_bytes(id) == bytes) return id;
  ADD_FAILURE() << "no token for bytes";
  return -1;
}

// Streams `ids`, checking every chunk is valid UTF-8; returns the chunks.
std::vector<std::string> stream(lilac::StreamDetokenizer& d, const std::vector<int32_t>& ids) {
  std::vector<std::string> out;
  for (int32_t id : ids) {
    out.push_back(d.push(id));
    EXPECT_TRUE(lilac::unicode::is_valid_utf8(out.back()));
  }
  out.push_back(d.finish());
  EXPECT_TRUE(lilac::unicode::is_valid_utf8(out.back()));
  return out;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (auto& x : v) s += x;
  return s;
}

}  // namespace

TEST(Detokenizer, MultiByteCharacterSplitAcrossTokens) {
  // " 🤖" is three byte-level tokens: the emoji's 4 bytes are split 2 + 1 + 1.
  const std::vector<int32_t> ids = {11162, 97, 244};
  ASSERT_EQ(qwen3().encode(" \xF0\x9F\xA4\x96"), ids);
  lilac::StreamDetokenizer d(qwen3());
  EXPECT_EQ(d.push(ids[0]), " ");
  EXPECT_EQ(d.push(ids[1]), "");
  EXPECT_EQ(d.push(ids[2]), "\xF0\x9F\xA4\x96");
  EXPECT_EQ(d.finish(), "");
  EXPECT_FALSE(d.stopped());
}

TEST(Detokenizer, WholeGoldenTextsStreamBackExactly) {
  std::ifstream f(std::string(LILAC_SHARED_DIR) + "/fixtures/qwen3-tokenizer/encode_golden.json");
  const auto golden = nlohmann::json::parse(f);
  for (const auto& c : golden) {
    const std::string text = c["text"];
    lilac::StreamDetokenizer d(qwen3());
    EXPECT_EQ(join(stream(d, c["ids"].get<std::vector<int32_t>>())), lilac::unicode::nfc(text));
  }
}

TEST(Detokenizer, StopStringSpanningThreeTokens) {
  // "Hello, world!" = ["Hello", ",", " world", "!"]; the stop "o, wor" spans the first three.
  const std::vector<int32_t> ids = {9707, 11, 1879, 0};
  lilac::StreamDetokenizer d(qwen3(), {"o, wor"});
  EXPECT_EQ(d.push(ids[0]), "Hell");  // "o" could start the stop string: held back
  EXPECT_EQ(d.push(ids[1]), "");      // "o," still could
  EXPECT_FALSE(d.stopped());
  EXPECT_EQ(d.push(ids[2]), "");      // match: nothing after "Hell" is emitted
  EXPECT_TRUE(d.stopped());
  EXPECT_EQ(d.matched_stop(), "o, wor");
  EXPECT_EQ(d.push(ids[3]), "");
  EXPECT_EQ(d.finish(), "");
}

TEST(Detokenizer, HeldTextReleasedWhenRuledOut) {
  const std::vector<int32_t> ids = {9707, 11, 1879, 0};
  lilac::StreamDetokenizer d(qwen3(), {"o, x", "!!"});
  EXPECT_EQ(d.push(ids[0]), "Hell");
  EXPECT_EQ(d.push(ids[1]), "");
  EXPECT_EQ(d.push(ids[2]), "o, world");  // " w" rules "o, x" out
  EXPECT_EQ(d.push(ids[3]), "");          // "!" may start "!!"
  EXPECT_EQ(d.finish(), "!");
  EXPECT_FALSE(d.stopped());
}

TEST(Detokenizer, StopInsideOneTokenAndAtFirstOccurrence) {
  const auto ids = qwen3().encode("alpha beta gamma beta delta");
  lilac::StreamDetokenizer d(qwen3(), {"beta"});
  const std::string out = join(stream(d, ids));
  EXPECT_EQ(out, "alpha ");
  EXPECT_TRUE(d.stopped());
}

TEST(Detokenizer, EveryStopPositionMatchesReference) {
  // For every substring-stop of a text with multibyte characters: output == text before first match.
  const std::string text = "Naïve 你好 world 🤖🔥 end, done.";
  const auto ids = qwen3().encode(text);
  for (size_t b = 0; b < text.size(); ++b) {
    for (size_t len = 1; len <= 6 && b + len <= text.size(); ++len) {
      const std::string stop = text.substr(b, len);
      lilac::StreamDetokenizer d(qwen3(), {stop});
      const std::string out = join(stream(d, ids));
      const std::string want = text.substr(0, text.find(stop));
      if (lilac::unicode::is_valid_utf8(stop)) {
        EXPECT_EQ(out, want) << "stop=" << stop;
        EXPECT_TRUE(d.stopped());
      }
    }
  }
}

TEST(Detokenizer, StopStringWithMultibyteCharacter) {
  const auto ids = qwen3().encode(" \xF0\x9F\xA4\x96 after");
  lilac::StreamDetokenizer d(qwen3(), {"\xF0\x9F\xA4\x96"});
  EXPECT_EQ(join(stream(d, ids)), " ");
  EXPECT_TRUE(d.stopped());
}

TEST(Detokenizer, FinishFlushesIncompleteUtf8AsReplacement) {
  lilac::StreamDetokenizer d(qwen3());
  EXPECT_EQ(d.push(11162), " ");
  EXPECT_EQ(d.finish(), "\xEF\xBF\xBD");
}

TEST(Detokenizer, ImpossibleBytesBecomeReplacementAtOnce) {
  const int32_t cont = id_of_bytes("\x80");  // a lone continuation byte can never be valid
  lilac::StreamDetokenizer d(qwen3());
  EXPECT_EQ(d.push(cont), "\xEF\xBF\xBD");
  EXPECT_EQ(d.push(9707), "Hello");
  EXPECT_EQ(d.finish(), "");
}

TEST(Detokenizer, SkipSpecialTokens) {
  const auto ids = qwen3().encode("<|im_start|>hi<think>x</think><|im_end|>");
  lilac::StreamDetokenizer keep(qwen3());
  EXPECT_EQ(join(stream(keep, ids)), "<|im_start|>hi<think>x</think><|im_end|>");
  lilac::StreamDetokenizer skip(qwen3(), {}, /*skip_special=*/true);
  EXPECT_EQ(join(stream(skip, ids)), "hi<think>x</think>");
}

TEST(Detokenizer, StopOnSpecialTokenText) {
  const auto ids = qwen3().encode("answer<|im_end|>junk");
  lilac::StreamDetokenizer d(qwen3(), {"<|im_end|>"});
  EXPECT_EQ(join(stream(d, ids)), "answer");
  EXPECT_EQ(d.matched_stop(), "<|im_end|>");
}

TEST(Detokenizer, UnknownIdsAreEmpty) {
  lilac::StreamDetokenizer d(qwen3());
  EXPECT_EQ(d.push(-3), "");
  EXPECT_EQ(d.push(1 << 29), "");
  EXPECT_EQ(d.push(9707), "Hello");
  EXPECT_EQ(d.finish(), "");
}
