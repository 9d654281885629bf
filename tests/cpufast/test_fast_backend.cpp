// The fast CPU backend (src/cpufast) as a Backend: the oracle's goldens at the reduced-precision
// thresholds (best kernels and the portable ones), decode_batch bit-identical to decode_step per
// session, prefill chunking, snapshots, errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "avx512_emu.h"
#include "core/error.h"
#include "cpu/cpu_backend.h"
#include "cpufast/fast_backend.h"
#include "cpufast/isa.h"
#include "engine/golden.h"
#include "model/weights.h"
#include "cpufast/synthetic.h"
#include "support/fixtures.h"
#include "support/session_no_choice.h"
#include "support/step_bytes.h"

using namespace lilac;
using testutil::fixture;
using testutil::random_tokens;

namespace {

double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

GoldenReport golden(const std::string& fx, const std::string& isa, int threads, int64_t chunk,
                    const cpufast::KernelSet* kernels = nullptr) {
  auto be = cpufast::make_fast_cpu_backend(fixture(fx), {.threads = threads, .isa = isa, .kernels = kernels});
  GoldenOptions opts;
  opts.activations = true;
  opts.install_tap = [chunk](Session& s, HiddenTap tap) {
    auto* c = dynamic_cast<cpu::CpuSession*>(&s);
    if (!c) return false;
    c->set_prefill_chunk(chunk);
    c->set_activation_tap(tap);
    return true;
  };
  return run_golden(*be, std::string(LILAC_SHARED_DIR) + "/fixtures/" + fx + "/golden.safetensors", opts);
}

}  // namespace

// check-golden's reduced-precision rules (those the CUDA backend meets) with the best kernels here and
// prefill chunks that split the sequences (tests/cli/golden_cpu.cmake runs check-golden with the
// default chunk on the best and the portable kernels).
// Also with the avx512-vnni set's arithmetic emulated (avx512_emu.h): the code before the centred products
// failed tiny there (seq2: one confident top-1 of 47 lost, 2.6e-2) as on the Xeon.
TEST(CpuFastBackend, GoldensAtReducedPrecision) {
  for (const cpufast::KernelSet* k : {static_cast<const cpufast::KernelSet*>(nullptr), &cpufast::emu::avx512_emulated()}) {
    const std::string name = k ? k->name : "best";
    for (const char* fx : {"tiny", "tiny2"}) {
      const GoldenReport r = golden(fx, "", 2, 48, k);
      const auto fails = golden_failures(r, GoldenThresholds::for_backend("cpu"));
      EXPECT_TRUE(fails.empty()) << name << " " << fx << "\n" << format_golden_report(r);
      ASSERT_TRUE(r.activations_available);
      for (const auto& s : r.seqs) EXPECT_LT(s.rel_l2, 3e-2) << name << " " << fx << " " << s.name;
    }
  }
}

// decode_batch: every session's token and logits equal (bit for bit) what decode_step gives it alone,
// for any batch composition.
TEST(CpuFastBackend, DecodeBatchIsBitIdenticalToDecodeStep) {
  for (const char* fx : {"tiny", "tiny2"}) {
    auto be = cpufast::make_fast_cpu_backend(fixture(fx), {.threads = 2});
    const int64_t V = be->config().vocab_size;
    const int B = 5, steps = 4;
    auto start = [&](std::vector<std::unique_ptr<Session>>& ss) {
      ss.clear();
      for (int b = 0; b < B; ++b) {
        ss.push_back(be->new_session(64));
        const auto p = random_tokens(3 + 7 * b, V, uint32_t(b + 1));
        ss.back()->prefill(p);
        SamplingParams sp;
        sp.temperature = b % 2 ? 0.8f : 0.f;
        sp.seed = uint64_t(b);
        ss.back()->begin_generation(sp, p);
        ss.back()->sample();
      }
    };
    std::vector<std::unique_ptr<Session>> alone, batched;
    start(alone);
    start(batched);
    for (int s = 0; s < steps; ++s) {
      // Batch compositions change every step: all, then a subset in another order.
      std::vector<Session*> group;
      std::vector<int> idx;
      for (int b = 0; b < B; ++b)
        if (s % 2 == 0 || b % 2 == 1) idx.push_back(s % 2 ? B - 1 - b : b);
      for (int b : idx) group.push_back(batched[static_cast<size_t>(b)].get());
      const auto got = be->decode_batch(group);
      ASSERT_EQ(got.size(), idx.size());
      for (size_t i = 0; i < idx.size(); ++i) {
        const TokenChoice want = alone[static_cast<size_t>(idx[i])]->decode_step();
        EXPECT_EQ(got[i].token, want.token) << fx << " step " << s << " session " << idx[i];
        const auto la = alone[static_cast<size_t>(idx[i])]->logits(), lb = batched[static_cast<size_t>(idx[i])]->logits();
        EXPECT_EQ(0, std::memcmp(la.data(), lb.data(), la.size() * sizeof(float))) << fx << " step " << s;
      }
    }
  }
}

TEST(CpuFastBackend, DecodeBatchRejectsBadBatches) {
  auto be = cpufast::make_fast_cpu_backend(fixture("tiny"), {.threads = 1});
  auto ref = make_cpu_backend(fixture("tiny"), 1);
  auto a = be->new_session(16), b = ref->new_session(16), c = be->new_session(16);
  const std::vector<int32_t> p{1, 2, 3};
  for (Session* s : {a.get(), b.get(), c.get()}) {
    s->prefill(p);
    s->begin_generation({}, p);
    if (s != c.get()) s->sample();  // c has no pending token
  }
  std::vector<Session*> foreign{a.get(), b.get()}, twice{a.get(), a.get()}, unsampled{a.get(), c.get()};
  EXPECT_THROW(be->decode_batch(foreign), Error);
  EXPECT_THROW(be->decode_batch(twice), Error);
  const auto l_before = a->logits();
  EXPECT_THROW(be->decode_batch(unsampled), Error);
  EXPECT_EQ(a->length(), 3);  // a rejected batch changes no session
  EXPECT_EQ(a->logits(), l_before);
  EXPECT_EQ(be->decode_batch(std::vector<Session*>{a.get()}).size(), 1u);
}

// The server sizes its session pool by these (a fast backend used to report 0 bytes / 1 session, so
// `lilac serve --backend cpu` served one conversation at a time unless --max-batch was given).
// The bytes a step moves on this backend's layout (bench's floor): per token at the model's shape, and for B
// streams decoding together.
TEST(CpuFastBackend, StepBytesOfOneAndOfBStreams) {
  const ModelConfig c = qwen36_shape(40);
  EXPECT_NEAR(cpufast::decode_bytes_per_token(c, 512), 1803556992.0, 1.0);
  EXPECT_NEAR(cpufast::decode_step_bytes(c, 512, 16), 10498834083.5, 2.0);
  lilac::testing::check_step_bytes(
      c, [&](int64_t ctx, int64_t B) { return cpufast::decode_step_bytes(c, ctx, B); },
      [&](int64_t ctx) { return cpufast::decode_bytes_per_token(c, ctx); });
}

TEST(CpuFastBackend, SessionPoolSizing) {
  auto be = cpufast::make_fast_cpu_backend(fixture("tiny"), {.threads = 1});
  const ModelConfig& c = be->config();
  int64_t n_attn = 0;
  for (bool full : c.full_attention) n_attn += full;
  const size_t a = be->session_bytes(1000), b = be->session_bytes(2000);
  ASSERT_GT(a, 0u);
  EXPECT_EQ(b - a, size_t(1000) * size_t(n_attn) * 2 * size_t(c.kv_dim()) * 2);  // f16 K and V per token
  EXPECT_EQ(be->session_bytes(0), be->session_bytes(c.max_position_embeddings));
  const int n = be->default_sessions(1000);
  EXPECT_GE(n, 1);
  EXPECT_LE(n, 4);
  if (cpu::available_ram_bytes() > 8 * a) EXPECT_EQ(n, 4);  // a tiny model: the default count fits
}

// Chunked prefill (sink rows chunk by chunk) against single-token steps: close (the same arithmetic
// except the Gated DeltaNet's chunked form); snapshots restore exactly.
TEST(CpuFastBackend, PrefillChunksSinkAndSnapshots) {
  auto be = cpufast::make_fast_cpu_backend(fixture("tiny2"), {.threads = 2});
  const int64_t V = be->config().vocab_size, N = 90;
  const auto toks = random_tokens(N, V, 9);
  auto a = be->new_session(N);
  dynamic_cast<cpu::CpuSession&>(*a).set_prefill_chunk(32);
  std::vector<float> all(static_cast<size_t>(N * V));
  int64_t next = 0;
  LogitsSink sink = [&](int64_t first, int64_t n, const float* lg) {
    ASSERT_EQ(first, next);
    std::copy(lg, lg + n * V, all.begin() + first * V);
    next = first + n;
  };
  a->prefill(toks, &sink);
  ASSERT_EQ(next, N);
  EXPECT_EQ(a->logits(), std::vector<float>(all.end() - V, all.end()));
  auto b = be->new_session(N);
  std::shared_ptr<const SessionSnapshot> snap;
  std::vector<float> at40;
  for (int64_t i = 0; i < N; ++i) {
    b->prefill(std::span<const int32_t>(&toks[static_cast<size_t>(i)], 1));
    const auto l = b->logits();
    EXPECT_LT(rel_diff(l, std::vector<float>(all.begin() + i * V, all.begin() + (i + 1) * V)), 1e-3) << i;
    if (i == 39) {
      snap = b->snapshot();
      at40 = l;
    }
  }
  const auto end = b->logits();
  auto c = be->new_session(N);
  for (Session* s : {b.get(), c.get()}) {  // restore into itself and into another session
    s->restore(*snap);
    EXPECT_EQ(s->length(), 40);
    EXPECT_EQ(s->logits(), at40);
    for (int64_t i = 40; i < N; ++i) s->prefill(std::span<const int32_t>(&toks[static_cast<size_t>(i)], 1));
    EXPECT_EQ(s->logits(), end);  // the same steps from the same state: identical
  }
}

TEST(CpuFastBackend, Errors) {
  auto be = cpufast::make_fast_cpu_backend(fixture("tiny"), {.threads = 1});
  EXPECT_EQ(be->name(), "cpu");
  auto s = be->new_session(4);
  EXPECT_THROW(s->sample(), Error);
  const std::vector<int32_t> bad{1, 5000};
  EXPECT_THROW(s->prefill(bad), InputError);
  const std::vector<int32_t> many{1, 2, 3, 4, 5};
  EXPECT_THROW(s->prefill(many), InputError);
  EXPECT_EQ(s->length(), 0);
  EXPECT_THROW(cpufast::make_fast_cpu_backend(fixture("tiny"), {.threads = 1, .isa = "vax"}), Error);
}

// After a row with no choice nothing is pending (tests/support/session_no_choice.h; the same test for the CPU reference
// and CUDA; this backend does not speculate, so no verify case).
TEST(CpuFastBackend, ARowWithNoChoiceLeavesNothingPending) {
  testutil::nochoice::expect_a_row_with_no_choice_leaves_nothing_pending(
      [](std::shared_ptr<const ModelWeights> w) { return cpufast::make_fast_cpu_backend(std::move(w), {.threads = 1}); },
      /*verifies=*/false);
}
