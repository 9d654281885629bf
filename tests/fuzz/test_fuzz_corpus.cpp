// Replays every fuzz target (fuzz/targets_*.cpp) over its checked-in inputs, fuzz/corpus/<target>/: seeds
// and every input that once broke a target's property (named regress-*), so what the fuzzer found stays
// fixed. A broken property aborts with its message ("fuzz target T: property violated: ...").
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "fuzz/fuzz_target.h"

namespace fs = std::filesystem;

namespace {

const fs::path kCorpus = fs::path(LILAC_SOURCE_DIR) / "fuzz" / "corpus";

std::string read_all(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

class FuzzCorpus : public ::testing::TestWithParam<std::string> {};

TEST_P(FuzzCorpus, EveryInputKeepsTheProperty) {
  const lilac::fuzz::Target* t = lilac::fuzz::find_target(GetParam());
  ASSERT_NE(t, nullptr);
  const fs::path dir = kCorpus / GetParam();
  ASSERT_TRUE(fs::is_directory(dir)) << "no corpus for target " << GetParam() << " in " << dir;
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string bytes = read_all(e.path());
    SCOPED_TRACE(e.path().string());
    t->fn(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    ++n;
  }
  EXPECT_GT(n, 0);
}

std::vector<std::string> target_names() {
  std::vector<std::string> v;
  for (const auto& t : lilac::fuzz::targets()) v.push_back(t.name);
  return v;
}

INSTANTIATE_TEST_SUITE_P(Targets, FuzzCorpus, ::testing::ValuesIn(target_names()),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

// Every target has a corpus, and every corpus a target.
TEST(FuzzCorpus, CorporaMatchTargets) {
  for (const auto& t : lilac::fuzz::targets()) EXPECT_TRUE(fs::is_directory(kCorpus / t.name)) << t.name;
  for (const auto& e : fs::directory_iterator(kCorpus))
    EXPECT_NE(lilac::fuzz::find_target(e.path().filename().string()), nullptr) << e.path();
}

}  // namespace
