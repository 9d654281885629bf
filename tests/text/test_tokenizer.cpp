// Tokenizer: goldens from an independent implementation, round trips, bad input, bad files.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/tokenizer.h"
#include "text/unicode.h"

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

const std::string kQwen3Dir = std::string(LILAC_SHARED_DIR) + "/fixtures/qwen3-tokenizer";

const lilac::Tokenizer& qwen3() {
  static std::unique_ptr<lilac::Tokenizer> tok = lilac::Tokenizer::load(kQwen3Dir);
  return *tok;
}

json read_json(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << path;
  return json::parse(f);
}

// A temporary directory holding a tokenizer.json written by the test.
struct TempTokDir {
  fs::path dir;
  explicit TempTokDir(const std::string& tokenizer_json, const std::string& config = "") {
    static int counter = 0;
    dir = fs::temp_directory_path() /
          ("lilac_tok_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::create_directories(dir);
    std::ofstream(dir / "tokenizer.json") << tokenizer_json;
    if (!config.empty()) std::ofstream(dir / "tokenizer_config.json") << config;
  }
  ~TempTokDir() { fs::remove_all(dir); }
};

// A small byte-level BPE tokenizer.json: the 256 byte tokens, a few merges, given options.
json tiny_tokenizer_json() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[lilac::unicode::bytes_to_byte_level(std::string(1, char(b)))] = b;
  int id = 256;
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {"Ġ", "w"}, {"o", "r"}, {"Ġw", "or"}, {"l", "d"},
      {"Ġwor", "ld"}};
  json m = json::array();
  for (auto& [a, b] : merges) {
    if (!vocab.contains(a + b)) vocab[a + b] = id++;
    m.push_back(a + " " + b);
  }
  json j;
  j["version"] = "1.0";
  j["added_tokens"] = json::array({
      {{"id", 300}, {"content", "<|end|>"}, {"special", true}, {"normalized", false}, {"single_word", false},
       {"lstrip", false}, {"rstrip", false}},
      {{"id", 301}, {"content", "<x>"}, {"special", false}, {"normalized", false}, {"single_word", false},
       {"lstrip", false}, {"rstrip", false}},
  });
  j["normalizer"] = {{"type", "NFC"}};
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers",
                         json::array({{{"type", "Split"},
                                       {"pattern", {{"Regex", R"( ?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+|\s+)"}}},
                                       {"behavior", "Isolated"},
                                       {"invert", false}},
                                      {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}};
  j["decoder"] = {{"type", "ByteLevel"}};
  j["model"] = {{"type", "BPE"}, {"vocab", vocab}, {"merges", m}};
  return j;
}

}  // namespace

TEST(Tokenizer, EncodeGoldenQwen3) {
  const json golden = read_json(kQwen3Dir + "/encode_golden.json");
  ASSERT_GE(golden.size(), 30u);
  for (const auto& c : golden) {
    const std::string text = c["text"];
    const std::vector<int32_t> want = c["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(qwen3().encode(text), want) << "text: " << json(text).dump();
  }
}

TEST(Tokenizer, DecodeRoundTripIsNfc) {
  const json golden = read_json(kQwen3Dir + "/encode_golden.json");
  for (const auto& c : golden) {
    const std::string text = c["text"];
    const auto ids = qwen3().encode(text);
    EXPECT_EQ(qwen3().decode(ids), lilac::unicode::nfc(text)) << json(text).dump();
    // Decoding the golden ids gives the same text.
    EXPECT_EQ(qwen3().decode(c["ids"].get<std::vector<int32_t>>()), lilac::unicode::nfc(text));
  }
}

TEST(Tokenizer, NfcNormalizes) {
  // "e" + combining acute accent becomes U+00E9 before BPE.
  EXPECT_EQ(qwen3().encode("cafe\xCC\x81"), qwen3().encode("caf\xC3\xA9"));
  EXPECT_EQ(qwen3().decode(qwen3().encode("cafe\xCC\x81")), "caf\xC3\xA9");
}

TEST(Tokenizer, SpecialTokensAndMetadata) {
  const auto& t = qwen3();
  EXPECT_EQ(t.vocab_size(), 151669);
  EXPECT_EQ(t.token_id("<|im_start|>"), 151644);
  EXPECT_EQ(t.token_id("<think>"), 151667);
  EXPECT_EQ(t.token_id("Hello"), 9707);
  EXPECT_EQ(t.token_id("Ġworld"), 1879);  // vocabulary form of " world"
  EXPECT_FALSE(t.token_id("definitely-not-a-token-xyz").has_value());
  EXPECT_TRUE(t.is_special(151644));
  EXPECT_FALSE(t.is_special(151667));  // <think> is an added, non-special token
  EXPECT_FALSE(t.is_special(9707));
  EXPECT_FALSE(t.is_special(-1));
  EXPECT_EQ(t.token_bytes(1879), " world");
  EXPECT_EQ(t.token_bytes(151645), "<|im_end|>");
  EXPECT_EQ(t.token_bytes(-5), "");
  EXPECT_EQ(t.token_bytes(1 << 30), "");
  EXPECT_EQ(t.eos_token(), "<|im_end|>");
  EXPECT_EQ(t.bos_token(), "");
}

TEST(Tokenizer, ParseSpecialFalseTreatsSpecialAsText) {
  const auto& t = qwen3();
  const auto ids = t.encode("<|im_end|>", /*parse_special=*/false);
  EXPECT_GT(ids.size(), 1u);
  for (int32_t id : ids) EXPECT_LT(id, 151643);
  EXPECT_EQ(t.decode(ids), "<|im_end|>");
  // Non-special added tokens (<think>) are still matched.
  EXPECT_EQ(t.encode("<think>", false), std::vector<int32_t>{151667});
}

TEST(Tokenizer, DecodeSkipSpecial) {
  const auto& t = qwen3();
  const auto ids = t.encode("<|im_start|>user\nhi<|im_end|><think>");
  EXPECT_EQ(t.decode(ids, /*skip_special=*/true), "user\nhi<think>");
  EXPECT_EQ(t.decode(ids), "<|im_start|>user\nhi<|im_end|><think>");
}

TEST(Tokenizer, DecodeRejectsOutOfRangeIds) {
  const std::vector<int32_t> bad = {9707, 151669};
  EXPECT_THROW(qwen3().decode(bad), lilac::InputError);
  const std::vector<int32_t> neg = {-1};
  EXPECT_THROW(qwen3().decode(neg), lilac::InputError);
}

TEST(Tokenizer, DecodeKeepsPartialUtf8) {
  // " 🤖" is three byte-level tokens (see encode_golden.json); the first alone ends mid-character.
  const auto ids = qwen3().encode(" \xF0\x9F\xA4\x96");
  ASSERT_EQ(ids, (std::vector<int32_t>{11162, 97, 244}));
  const std::vector<int32_t> first(ids.begin(), ids.begin() + 1);
  EXPECT_EQ(qwen3().decode(first), " \xF0\x9F");
}

TEST(Tokenizer, InvalidUtf8BecomesReplacementChar) {
  const auto& t = qwen3();
  const std::string fffd = "\xEF\xBF\xBD";
  struct Case {
    std::string in, out;
  };
  const std::vector<Case> cases = {
      {"a\xFF" "b", "a" + fffd + "b"},
      {"\xC3", fffd},                               // truncated 2-byte sequence at the end
      {"x\xE4\xBD", "x" + fffd},                    // truncated 3-byte sequence: one U+FFFD
      {"\xED\xA0\x80", fffd + fffd + fffd},         // surrogate: each byte is its own subpart
      {"\xC0\xAF", fffd + fffd},                    // overlong
      {"\xF4\x90\x80\x80", fffd + fffd + fffd + fffd},  // > U+10FFFF
      {"ok\x80\x80 fine", "ok" + fffd + fffd + " fine"},
      {std::string("nul\0byte", 8), std::string("nul\0byte", 8)},
  };
  for (const auto& c : cases) {
    const auto ids = t.encode(c.in);
    EXPECT_EQ(t.decode(ids), c.out) << json(c.out).dump();
    EXPECT_EQ(ids, t.encode(c.out));
  }
}

TEST(Tokenizer, RandomBytesNeverCrashAndRoundTripSanitized) {
  const auto& t = qwen3();
  std::mt19937 rng(1234);
  for (int iter = 0; iter < 300; ++iter) {
    std::string s(rng() % 64, '\0');
    for (auto& ch : s) ch = static_cast<char>(rng() % 256);
    const auto ids = t.encode(s);
    EXPECT_EQ(t.decode(ids), lilac::unicode::nfc(lilac::unicode::sanitize_utf8(s)));
  }
}

TEST(Tokenizer, LongInputs) {
  const auto& t = qwen3();
  // A 256 KB run of one letter (one pre-token) and of spaces: BPE must not be quadratic or overflow.
  const std::string letters(1 << 18, 'a');
  const auto ids = t.encode(letters);
  EXPECT_EQ(t.decode(ids), letters);
  EXPECT_LT(ids.size(), letters.size() / 4);
  const std::string spaces(1 << 18, ' ');
  EXPECT_EQ(t.decode(t.encode(spaces)), spaces);
}

TEST(Tokenizer, ConcurrentEncodeIsConsistent) {
  const auto& t = qwen3();
  const std::string text = "The quick brown fox jumps over the lazy dog. 你好, мир! 12345 ";
  const auto want = t.encode(text);
  std::vector<std::thread> th;
  std::atomic<int> bad{0};
  for (int k = 0; k < 4; ++k)
    th.emplace_back([&] {
      for (int i = 0; i < 200; ++i)
        if (t.encode(text + std::to_string(i % 7)) != t.encode(text + std::to_string(i % 7)) ||
            t.encode(text) != want)
          ++bad;
    });
  for (auto& x : th) x.join();
  EXPECT_EQ(bad.load(), 0);
}

// ---- a small tokenizer.json written by the test -------------------------------------------------

TEST(Tokenizer, TinyBpeMergesInRankOrder) {
  TempTokDir d(tiny_tokenizer_json().dump());
  auto t = lilac::Tokenizer::load(d.dir.string());
  const int32_t hello = *t->token_id("hello");
  const int32_t world = *t->token_id("Ġworld");
  EXPECT_EQ(t->encode("hello world"), (std::vector<int32_t>{hello, world}));
  EXPECT_EQ(t->encode("hello<|end|> world<x>"),
            (std::vector<int32_t>{hello, 300, world, 301}));
  EXPECT_EQ(t->decode(t->encode("hello<|end|> world<x>")), "hello<|end|> world<x>");
  EXPECT_EQ(t->vocab_size(), 302);
  EXPECT_EQ(t->eos_token(), "");
}

TEST(Tokenizer, TinyMergesAsPairsAndIgnoreMerges) {
  json j = tiny_tokenizer_json();
  json pairs = json::array();
  for (const auto& m : j["model"]["merges"]) {
    std::string s = m;
    pairs.push_back({s.substr(0, s.find(' ')), s.substr(s.find(' ') + 1)});
  }
  j["model"]["merges"] = pairs;
  {
    TempTokDir d(j.dump());
    auto t = lilac::Tokenizer::load(d.dir.string());
    EXPECT_EQ(t->encode("hello"), (std::vector<int32_t>{*t->token_id("hello")}));
  }
  // A vocabulary entry not reachable by merges: ignore_merges picks it whole.
  j["model"]["vocab"]["xyz"] = 302;
  j["model"]["ignore_merges"] = true;
  {
    TempTokDir d(j.dump());
    auto t = lilac::Tokenizer::load(d.dir.string());
    EXPECT_EQ(t->encode("xyz"), (std::vector<int32_t>{302}));
  }
  j["model"]["ignore_merges"] = false;
  {
    TempTokDir d(j.dump());
    auto t = lilac::Tokenizer::load(d.dir.string());
    EXPECT_EQ(t->encode("xyz"), (std::vector<int32_t>{'x', 'y', 'z'}));
  }
}

TEST(Tokenizer, TinyAddedTokenFlags) {
  json j = tiny_tokenizer_json();
  j["added_tokens"].push_back({{"id", 302}, {"content", "<m>"}, {"special", true}, {"normalized", false},
                               {"single_word", false}, {"lstrip", true}, {"rstrip", true}});
  j["added_tokens"].push_back({{"id", 303}, {"content", "cat"}, {"special", false}, {"normalized", true},
                               {"single_word", true}, {"lstrip", false}, {"rstrip", false}});
  j["added_tokens"].push_back({{"id", 304}, {"content", "<x>y"}, {"special", false}, {"normalized", false},
                               {"single_word", false}, {"lstrip", false}, {"rstrip", false}});
  TempTokDir d(j.dump());
  auto t = lilac::Tokenizer::load(d.dir.string());
  // lstrip/rstrip swallow the spaces around <m>.
  EXPECT_EQ(t->encode("a  <m>  b"), (std::vector<int32_t>{'a', 302, 'b'}));
  EXPECT_EQ(t->encode("a\xE3\x80\x80\n<m>\xC2\xA0" "b"), (std::vector<int32_t>{'a', 302, 'b'}));  // U+3000, NBSP
  // single_word: "cat" alone matches, inside "concatenate" it does not.
  EXPECT_EQ(t->encode("cat"), (std::vector<int32_t>{303}));
  const auto inside = t->encode("concatenate");
  EXPECT_EQ(std::count(inside.begin(), inside.end(), 303), 0);
  // Longest match wins: "<x>y" over "<x>".
  EXPECT_EQ(t->encode("<x>y<x>"), (std::vector<int32_t>{304, 301}));
}

TEST(Tokenizer, TinySplitBehaviors) {
  auto with_split = [](const std::string& behavior, bool invert) {
    json j = tiny_tokenizer_json();
    j["pre_tokenizer"]["pretokenizers"][0] = {
        {"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", behavior}, {"invert", invert}};
    return j.dump();
  };
  // With no merges involving '-' or letters a..c, ids are bytes; pre-token boundaries are visible
  // through a merge "a b" that only applies inside one pre-token.
  auto ids_of = [&](const std::string& behavior, const std::string& text) {
    json j = json::parse(with_split(behavior, false));
    j["model"]["vocab"]["-a"] = 310;
    j["model"]["vocab"]["a-"] = 311;
    j["model"]["merges"].push_back("- a");
    j["model"]["merges"].push_back("a -");
    j["model"]["vocab"]["--"] = 312;
    j["model"]["merges"].push_back("- -");
    TempTokDir d(j.dump());
    return lilac::Tokenizer::load(d.dir.string())->encode(text);
  };
  EXPECT_EQ(ids_of("Isolated", "a-a"), (std::vector<int32_t>{'a', '-', 'a'}));
  EXPECT_EQ(ids_of("Removed", "a-a"), (std::vector<int32_t>{'a', 'a'}));
  EXPECT_EQ(ids_of("MergedWithPrevious", "a-a"), (std::vector<int32_t>{311, 'a'}));
  EXPECT_EQ(ids_of("MergedWithNext", "a-a"), (std::vector<int32_t>{'a', 310}));
  // Consecutive matches: each merges with its own neighbour only (as Hugging Face tokenizers do).
  EXPECT_EQ(ids_of("MergedWithPrevious", "a--a"), (std::vector<int32_t>{311, '-', 'a'}));
  EXPECT_EQ(ids_of("MergedWithNext", "a--a"), (std::vector<int32_t>{'a', '-', 310}));
  EXPECT_EQ(ids_of("Isolated", "a--a"), (std::vector<int32_t>{'a', '-', '-', 'a'}));
  EXPECT_EQ(ids_of("Contiguous", "a--a"), (std::vector<int32_t>{'a', 312, 'a'}));
}

TEST(Tokenizer, Gpt2StyleByteLevelWithRegexAndPrefixSpace) {
  // ByteLevel alone (use_regex, add_prefix_space): "hello world" is encoded as " hello world".
  json j = tiny_tokenizer_json();
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}};
  j["model"]["vocab"]["Ġhello"] = 310;
  j["model"]["merges"].push_back("Ġ hello");
  TempTokDir d(j.dump());
  auto t = lilac::Tokenizer::load(d.dir.string());
  EXPECT_EQ(t->encode("hello world"), (std::vector<int32_t>{310, *t->token_id("Ġworld")}));
  EXPECT_EQ(t->encode(" hello"), (std::vector<int32_t>{310}));
}

TEST(Tokenizer, Qwen36StyleRegexWithMarks) {
  // Qwen3.5/3.6 add \p{M} to the letter classes: the regex is read from the file, not assumed.
  json j = tiny_tokenizer_json();
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  j["normalizer"] = nullptr;  // keep the combining mark separate
  const std::string text = "ka\xE0\xA4\x82ti";  // a Devanagari combining mark inside a word
  TempTokDir d(j.dump());
  auto t = lilac::Tokenizer::load(d.dir.string());
  EXPECT_EQ(t->decode(t->encode(text)), text);
}

TEST(Tokenizer, LoadErrorsAreClear) {
  auto expect_error = [](const std::string& content, const std::string& needle) {
    TempTokDir d(content);
    try {
      lilac::Tokenizer::load(d.dir.string());
      ADD_FAILURE() << "no error for: " << needle;
    } catch (const lilac::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("tokenizer.json"), std::string::npos) << e.what();
    }
  };
  expect_error("{ not json", "invalid JSON");
  expect_error("[1,2]", "expected a JSON object");
  json j = tiny_tokenizer_json();
  json k = j;
  k["model"]["type"] = "WordPiece";
  expect_error(k.dump(), "'WordPiece' is not supported");
  k = j;
  k["model"]["type"] = "Unigram";
  expect_error(k.dump(), "'Unigram' is not supported");
  k = j;
  k.erase("model");
  expect_error(k.dump(), "model: missing field");
  k = j;
  k["model"].erase("merges");
  expect_error(k.dump(), "model.merges: missing field");
  k = j;
  k["model"]["merges"].push_back("q zzz");
  expect_error(k.dump(), "not in the vocabulary");
  k = j;
  k["model"]["merges"].push_back(42);
  expect_error(k.dump(), "model.merges[");
  k = j;
  k["normalizer"] = {{"type", "Lowercase"}};
  expect_error(k.dump(), "normalizer 'Lowercase' is not supported");
  k = j;
  k["pre_tokenizer"] = {{"type", "Metaspace"}};
  expect_error(k.dump(), "pre-tokenizer 'Metaspace' is not supported");
  k = j;
  k["pre_tokenizer"]["pretokenizers"].erase(1);  // no ByteLevel
  expect_error(k.dump(), "only byte-level BPE");
  k = j;
  k["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = true;
  expect_error(k.dump(), "add_prefix_space: true after a Split");
  k = j;
  k["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  expect_error(k.dump(), "cannot compile regex");
  k = j;
  k["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Sideways";
  expect_error(k.dump(), "unknown behavior");
  k = j;
  k["added_tokens"][0].erase("content");
  expect_error(k.dump(), "added_tokens[0].content: missing field");
  k = j;
  k["model"]["vocab"].erase("a");
  expect_error(k.dump(), "no token for byte 0x61");
  k = j;
  k["model"]["vocab"]["a"] = "x";
  expect_error(k.dump(), "expected an integer id");
}

TEST(Tokenizer, MissingDirIsAnError) {
  EXPECT_THROW(lilac::Tokenizer::load("/nonexistent/lilac/tokenizer/dir"), lilac::Error);
}

TEST(Tokenizer, ConfigEosAsObject) {
  TempTokDir d(tiny_tokenizer_json().dump(),
               R"({"eos_token": {"content": "<|end|>", "lstrip": false}, "bos_token": "<s>"})");
  auto t = lilac::Tokenizer::load(d.dir.string());
  EXPECT_EQ(t->eos_token(), "<|end|>");
  EXPECT_EQ(t->bos_token(), "<s>");
}

// ---- unicode helpers ----------------------------------------------------------------------------

TEST(Unicode, IncompleteTail) {
  using lilac::unicode::incomplete_utf8_tail;
  EXPECT_EQ(incomplete_utf8_tail(""), 0u);
  EXPECT_EQ(incomplete_utf8_tail("abc"), 0u);
  EXPECT_EQ(incomplete_utf8_tail("a\xE4"), 1u);
  EXPECT_EQ(incomplete_utf8_tail("a\xE4\xBD"), 2u);
  EXPECT_EQ(incomplete_utf8_tail("a\xE4\xBD\xA0"), 0u);
  EXPECT_EQ(incomplete_utf8_tail("\xF0\x9F\xA4"), 3u);
  EXPECT_EQ(incomplete_utf8_tail("\xFF"), 0u);      // invalid, not incomplete
  EXPECT_EQ(incomplete_utf8_tail("\xED\xA0"), 0u);  // surrogate can never complete
  EXPECT_EQ(incomplete_utf8_tail("\x80"), 0u);
}

TEST(Unicode, ByteLevelAlphabet) {
  using namespace lilac::unicode;
  for (int b = 0; b < 256; ++b) EXPECT_EQ(unicode_to_byte(byte_to_unicode(uint8_t(b))), b);
  EXPECT_EQ(bytes_to_byte_level(" "), "\xC4\xA0");  // Ġ
  EXPECT_EQ(bytes_to_byte_level("\n"), "\xC4\x8A");  // Ċ
  EXPECT_EQ(byte_level_to_bytes("\xC4\xA0hi"), std::optional<std::string>(" hi"));
  EXPECT_FALSE(byte_level_to_bytes("\xE4\xBD\xA0").has_value());
}
