// dump_json (text/json_dump.h): JSON as text with bytes that are not UTF-8 written as U+FFFD, never a throw; and the
// rule that from text/ up every JSON becomes text through it (nlohmann's plain dump() threw on a model's partial
// characters in the Responses store, and on an upstream's bytes in the router's errors).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/json_dump.h"

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

TEST(JsonDump, BytesThatAreNotUtf8AreReplacedWhereDumpThrows) {
  // A lone lead byte (a token that is the first of a 4-byte character), a character cut after its lead, a stray
  // continuation byte, Latin-1.
  const json j = {{"text", "ok \xf4"}, {"cut", "x\xc3"}, {"stray", "\x80y"}, {"latin1", "caf\xe9 au lait"}};
  EXPECT_THROW((void)j.dump(), json::type_error);
  const std::string fffd = "\xEF\xBF\xBD";
  const json back = json::parse(lilac::dump_json(j));
  EXPECT_EQ(back["text"], "ok " + fffd);
  EXPECT_EQ(back["cut"], "x" + fffd);
  EXPECT_EQ(back["stray"], fffd + "y");
  EXPECT_EQ(back["latin1"], "caf" + fffd + " au lait");
  const ojson o = {{"b", "\xf4"}, {"a", 1}};  // ordered: the keys stay in their order
  EXPECT_EQ(lilac::dump_json(o), "{\"b\":\"" + fffd + "\",\"a\":1}");
}

TEST(JsonDump, ValidTextIsThePlainDump) {
  const ojson o = ojson::parse(R"({"z": "caf\u00e9 \ud83d\ude00", "a": [1, 2.5, null, true, "<tool_call>"], "k": {}})");
  EXPECT_EQ(lilac::dump_json(o), o.dump());
  EXPECT_EQ(lilac::dump_json(o, 2), o.dump(2));
  const json j(o);
  EXPECT_EQ(lilac::dump_json(j), j.dump());
}

// The rule of text/json_dump.h over the sources: outside model/ (below text/, which only reads and writes config and
// checkpoint files) no call of nlohmann's dump() but dump_json's own.
TEST(JsonDump, EveryDumpFromTextUpGoesThroughDumpJson) {
  namespace fs = std::filesystem;
  const fs::path src = fs::path(LILAC_SOURCE_DIR) / "src";
  ASSERT_TRUE(fs::is_directory(src)) << src;
  size_t files = 0;
  for (const auto& e : fs::recursive_directory_iterator(src)) {
    if (!e.is_regular_file()) continue;
    const fs::path rel = fs::relative(e.path(), src);
    const std::string ext = rel.extension().string();
    if (ext != ".cpp" && ext != ".h" && ext != ".cu" && ext != ".cuh") continue;
    if (*rel.begin() == "model" || rel == fs::path("text/json_dump.h")) continue;
    ++files;
    std::ifstream in(e.path());
    std::string line;
    for (int n = 1; std::getline(in, line); ++n)
      for (const char* call : {".dump(", "->dump("})
        EXPECT_EQ(line.find(call), std::string::npos) << rel.string() << ":" << n << ": " << line;
  }
  EXPECT_GT(files, 100u);
}
