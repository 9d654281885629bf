// The golden comparison's thresholds (synthetic reports) and `lilac check-golden` failing on a
// perturbed golden file.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <unistd.h>
#include <vector>

#include "core/mapped_file.h"
#include "engine/golden.h"
#include "model/safetensors.h"

using namespace lilac;

namespace {

GoldenReport clean_report() {
  GoldenReport r;
  GoldenSeqResult s;
  s.name = "seq0";
  s.length = 100;
  s.max_abs = 1e-4;
  s.rel_l2 = 1e-5;
  s.top1_agree = 100;
  s.confident = 80;
  s.confident_agree = 80;
  s.ppl_engine = 100.0;
  s.ppl_oracle = 100.0;
  r.seqs.push_back(s);
  GoldenGenResult g;
  g.name = "gen0";
  g.expected = {1, 2, 3, 4};
  g.got = g.expected;
  g.margin = {1.f, 0.5f, 0.05f, 1.f};
  g.first_low_margin = 2;
  r.gens.push_back(g);
  return r;
}

}  // namespace

TEST(GoldenThresholds, CpuIsExact) {
  const auto t = GoldenThresholds::for_backend("cpu-ref");
  EXPECT_TRUE(t.exact);
  GoldenReport r = clean_report();
  EXPECT_TRUE(golden_failures(r, t).empty());
  r.seqs[0].max_abs = 2.5e-3;
  auto f = golden_failures(r, t);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_NE(f[0].find("seq0: max |dlogit| 2.500e-03"), std::string::npos) << f[0];
  r = clean_report();
  r.gens[0].got[3] = 9;  // after the low-margin step: still a failure for the fp32 reference
  r.gens[0].first_mismatch = 3;
  f = golden_failures(r, t);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_NE(f[0].find("gen0: differs at step 3"), std::string::npos) << f[0];
}

// BF16 reference logits: the exact rule applies to the part of |dlogit| beyond their own rounding.
TEST(GoldenThresholds, CpuWithBf16ReferenceUsesTheExcessOverRounding) {
  const auto t = GoldenThresholds::for_backend("cpu-ref");
  GoldenReport r = clean_report();
  r.seqs[0].ref_bf16 = true;
  r.seqs[0].max_abs = 1.56e-2;  // half a bf16 ulp of a logit in [4, 8)
  r.seqs[0].max_abs_beyond_rounding = 1e-5;
  EXPECT_TRUE(golden_failures(r, t).empty());
  r.seqs[0].max_abs_beyond_rounding = 2.5e-3;
  auto f = golden_failures(r, t);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_NE(f[0].find("beyond the BF16 reference's rounding 2.500e-03"), std::string::npos) << f[0];
}

TEST(GoldenThresholds, GpuRules) {
  const auto t = GoldenThresholds::for_backend("cuda");
  EXPECT_FALSE(t.exact);
  EXPECT_FALSE(GoldenThresholds::for_backend("cpu").exact);  // the fast CPU path is reduced precision too
  GoldenReport r = clean_report();
  r.seqs[0].max_abs = 0.05;  // no max-abs bound for reduced precision
  r.seqs[0].rel_l2 = 0.02;
  r.seqs[0].ppl_engine = 100.9;
  EXPECT_TRUE(golden_failures(r, t).empty());
  // A generation may differ from the first low-margin step (2) on, not before.
  r.gens[0].first_mismatch = 2;
  EXPECT_TRUE(golden_failures(r, t).empty());
  r.gens[0].first_mismatch = 1;
  EXPECT_EQ(golden_failures(r, t).size(), 1u);
  r = clean_report();
  r.seqs[0].confident_agree = 79;  // 98.75% < 99%
  r.seqs[0].rel_l2 = 0.031;
  r.seqs[0].ppl_engine = 98.9;  // -1.1%
  EXPECT_EQ(golden_failures(r, t).size(), 3u);
}

// check-golden exits 1 and prints FAIL when the golden file disagrees with the engine.
TEST(GoldenCli, FailsOnPerturbedGolden) {
  namespace fs = std::filesystem;
  const std::string fx = std::string(LILAC_SHARED_DIR) + "/fixtures/tiny2";
  const fs::path dir = fs::temp_directory_path() / ("lilac_golden_perturbed_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  fs::copy_file(fx + "/golden.json", dir / "golden.json", fs::copy_options::overwrite_existing);
  TensorSet ts = TensorSet::open_file(fx + "/golden.safetensors");
  std::vector<std::vector<uint8_t>> bufs;
  std::vector<TensorToWrite> out;
  for (const auto& [name, t] : ts.tensors()) {
    bufs.emplace_back(t.data, t.data + t.nbytes);
    if (name == "seq1.logits") {  // +0.01 on one logit
      float v;
      std::memcpy(&v, bufs.back().data() + 4 * 100, 4);
      v += 0.01f;
      std::memcpy(bufs.back().data() + 4 * 100, &v, 4);
    }
    if (name == "gen0.output") {  // another token at step 5
      int32_t v;
      std::memcpy(&v, bufs.back().data() + 4 * 5, 4);
      v = (v + 1) % 777;
      std::memcpy(bufs.back().data() + 4 * 5, &v, 4);
    }
    out.push_back(TensorToWrite{name, t.dtype, t.shape, bufs.back().data(), t.nbytes});
  }
  write_safetensors((dir / "golden.safetensors").string(), out);
  const std::string cmd = std::string(LILAC_BINARY) + " check-golden --backend cpu-ref --threads 1 --model " + fx +
                          "/mlx4 --golden " + (dir / "golden.safetensors").string() + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string text;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) text.append(buf.data(), n);
  const int status = pclose(p);
  fs::remove_all(dir);
  EXPECT_EQ(WEXITSTATUS(status), 1) << text;
  EXPECT_NE(text.find("failed: seq1: max |dlogit| 1.0"), std::string::npos) << text;
  EXPECT_NE(text.find("failed: gen0: differs at step 5"), std::string::npos) << text;
  EXPECT_EQ(text.find("failed: seq0"), std::string::npos) << text;
  EXPECT_NE(text.find("\nFAIL "), std::string::npos) << text;
}
