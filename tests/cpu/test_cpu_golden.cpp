// The CPU backend against the oracle's goldens (../shared/fixtures/{tiny,tiny2,tiny-mtp}): teacher-forced
// logits of every sequence, per-layer hidden states, greedy generations through the session; with
// tiny-mtp the MTP head's teacher-forced logits and speculative generations too.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <unistd.h>

#include "cpu/cpu_backend.h"
#include "engine/golden.h"
#include "model/hf_writer.h"
#include "model/weights.h"

using namespace lilac;

namespace {

GoldenReport run_golden_on(std::shared_ptr<const ModelWeights> w, const std::string& fixture, int64_t chunk) {
  const std::string dir = std::string(LILAC_SHARED_DIR) + "/fixtures/" + fixture;
  auto be = make_cpu_backend(w, 2);
  GoldenOptions opts;
  opts.activations = true;
  opts.install_tap = [chunk](Session& s, HiddenTap tap) {
    auto* c = dynamic_cast<cpu::CpuSession*>(&s);
    if (!c) return false;
    c->set_prefill_chunk(chunk);
    c->set_activation_tap(tap);
    return true;
  };
  return run_golden(*be, dir + "/golden.safetensors", opts);
}

GoldenReport run_fixture(const std::string& fixture, int64_t chunk) {
  const std::string dir = std::string(LILAC_SHARED_DIR) + "/fixtures/" + fixture;
  return run_golden_on(load_model(dir + "/mlx4", LoadOptions{.progress = false}), fixture, chunk);
}

void expect_matches_oracle(const GoldenReport& r, size_t n_seqs, size_t n_gens) {
  ASSERT_EQ(r.seqs.size(), n_seqs);
  ASSERT_EQ(r.gens.size(), n_gens);
  for (const auto& s : r.seqs) {
    EXPECT_LE(s.max_abs, 2e-3) << s.name;
    EXPECT_EQ(s.top1_agree, s.length) << s.name;
    if (s.length >= 2) EXPECT_LT(std::abs(s.ppl_rel_pct()), 0.01) << s.name;
  }
  for (const auto& g : r.gens) {
    EXPECT_EQ(g.first_mismatch, -1) << g.name;
    EXPECT_EQ(g.got, g.expected) << g.name;
  }
  ASSERT_TRUE(r.activations_available);
  // embed, every layer, final_norm.
  EXPECT_GE(r.activations.size(), 3u);
  for (const auto& a : r.activations) EXPECT_LE(a.max_abs, 1e-4 * std::max(1.0, a.ref_max_abs)) << a.seq << "." << a.name;
  EXPECT_TRUE(golden_failures(r, GoldenThresholds::for_backend("cpu-ref")).empty()) << format_golden_report(r);
}

}  // namespace

TEST(CpuGolden, TinyMatchesOracle) {
  GoldenReport r = run_fixture("tiny", 128);
  expect_matches_oracle(r, 6, 3);
}

TEST(CpuGolden, Tiny2MatchesOracle) {
  GoldenReport r = run_fixture("tiny2", 128);
  expect_matches_oracle(r, 4, 2);
}

// The MTP head (MODEL_MTP.md): every row of seqK.mtp_logits within the fp32 threshold, the same top-1 as
// the oracle where it is confident, and speculative greedy generation (k = 3) reproducing the oracle's tokens
// and its drafts accepted per round. Odd prefill chunks: the head's rows run in passes of other sizes.
TEST(CpuGolden, TinyMtpHeadMatchesOracle) {
  for (int64_t chunk : {int64_t(128), int64_t(37)}) {
    GoldenReport r = run_fixture("tiny-mtp", chunk);
    expect_matches_oracle(r, 4, 2);
    ASSERT_TRUE(r.golden_has_mtp);
    EXPECT_TRUE(r.mtp_unchecked.empty()) << r.mtp_unchecked;
    for (const auto& s : r.seqs) {
      ASSERT_TRUE(s.mtp) << s.name;
      EXPECT_EQ(s.mtp_rows, s.length) << s.name;
      EXPECT_TRUE(s.mtp_next_token_agrees) << s.name;
      EXPECT_LE(s.mtp_max_abs, 2e-3) << s.name;
      EXPECT_EQ(s.mtp_confident_agree, s.mtp_confident) << s.name;
      EXPECT_GT(s.mtp_confident, s.length / 2) << s.name;
    }
    for (const auto& g : r.gens) {
      ASSERT_TRUE(g.spec) << g.name;
      EXPECT_EQ(g.spec_got, g.expected) << g.name;
      EXPECT_EQ(g.accepted_got, g.accepted_expected) << g.name;
      EXPECT_EQ(g.accepted_got.size(), 23u) << g.name;
    }
  }
}

// Other prefill chunk sizes give the same function (chunk boundaries inside the GDN's 64-blocks).
TEST(CpuGolden, Tiny2WithOddPrefillChunks) {
  GoldenReport r = run_fixture("tiny2", 37);
  expect_matches_oracle(r, 4, 2);
}

// The Hugging Face layout of tiny (written by write_hf_checkpoint to a temporary folder, quantized
// again on load) reproduces the goldens: embeddings, fused experts, conv layout, norms without the +1
// all go through the HF path, the 8-bit router and shared_expert_gate included.
TEST(CpuGolden, TinyHfLayoutCopyMatchesOracle) {
  namespace fs = std::filesystem;
  const std::string src = std::string(LILAC_SHARED_DIR) + "/fixtures/tiny/mlx4";
  const fs::path tmp = fs::temp_directory_path() / ("lilac_cpu_hf_tiny_" + std::to_string(::getpid()));
  fs::remove_all(tmp);
  auto mlx = load_model(src, LoadOptions{.progress = false});
  write_hf_checkpoint(*mlx, tmp.string());
  ASSERT_TRUE(fs::exists(tmp / "config.json"));
  auto hf = load_model(tmp.string(), LoadOptions{.progress = false});
  fs::remove_all(tmp);
  ASSERT_EQ(hf->layers.size(), mlx->layers.size());
  GoldenReport r = run_golden_on(hf, "tiny", 128);
  expect_matches_oracle(r, 6, 3);
}
