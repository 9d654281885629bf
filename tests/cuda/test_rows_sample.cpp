// Token choice for M rows (rows_mm.h: sample_rows, sample_token_masked): each row, with its slot's
// parameters, penalty counts and prompt mask, chooses what sample_token chooses for it alone, bit for bit
// (token, logprob, top logprobs, counts, step) over several steps — greedy and seeded sampling with filters
// and penalties, at the model's vocabulary and an odd one; padding rows touch nothing; the allowed-token
// bitmask restricts greedy and sampled choices without changing the raw logprobs; a row with no choice (no allowed
// logit above -inf, no allowed token) says which, alone, in a batch and as one sequence's row.
#include <algorithm>
#include <gtest/gtest.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/kernels/sampling/sampling.h"
#include "cuda/kernels/rows/rows_mm.h"
#include "model/weights.h"
#include "decode_test_util.h"
#include "rows_test_util.h"

using namespace lilac;
namespace lc = lilac::cuda;
namespace lr = lilac::cuda::rows;
using namespace lilac::cuda::testing;

namespace {

lc::SampleParamsDev params(float t, int top_k, float top_p, float min_p, float pres, float freq, float rep, int top_lp,
                           unsigned long long seed, unsigned long long step) {
  lc::SampleParamsDev p{};
  p.temperature = t;
  p.top_k = top_k;
  p.top_p = top_p;
  p.min_p = min_p;
  p.presence = pres;
  p.frequency = freq;
  p.repetition = rep;
  p.logprobs = 1;
  p.top_logprobs = top_lp;
  p.seed = seed;
  p.step = step;
  return p;
}

void expect_same_result(const lc::SampleResult& a, const lc::SampleResult& b, const std::string& what) {
  EXPECT_EQ(a.token, b.token) << what;
  EXPECT_EQ(std::memcmp(&a.logprob, &b.logprob, sizeof(float)), 0) << what << ": logprob " << a.logprob << " vs " << b.logprob;
  ASSERT_EQ(a.n_top, b.n_top) << what;
  for (int i = 0; i < a.n_top; ++i) {
    EXPECT_EQ(a.top_ids[i], b.top_ids[i]) << what << ": top " << i;
    EXPECT_EQ(std::memcmp(&a.top_lp[i], &b.top_lp[i], sizeof(float)), 0) << what << ": top lp " << i;
  }
}

// Today's sample_token on one row with copies of its state; returns the result and updates the state.
lc::SampleResult today(const float* dlogits, int64_t vocab, lc::SampleParamsDev& p, std::vector<int32_t>& counts,
                       const std::vector<uint8_t>& mask) {
  Dev<lc::SampleParamsDev> dp(std::vector<lc::SampleParamsDev>{p});
  Dev<int32_t> dc(counts), tok(1);
  Dev<uint8_t> dm(mask);
  Dev<char> scratch(lc::sample_scratch_bytes(vocab));
  Dev<lc::SampleResult> res(1);
  lc::sample_token(dlogits, vocab, dp.p, dc.p, dm.p, scratch.p, tok.p, res.p, nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  p = dp.get()[0];
  counts = dc.get();
  const int32_t t = res.get()[0].token;
  EXPECT_EQ(tok.get()[0], t >= 0 ? t : 0) << "the next token (a row with no choice: 0)";
  return res.get()[0];
}

TEST(RowsSample, EachRowChoosesWhatSampleTokenChooses) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng r(seed);
  for (int64_t vocab : {int64_t(248320), int64_t(1001)}) {
    SCOPED_TRACE("vocab " + std::to_string(vocab));
    const int M = 8, slots_n = 10;
    const std::vector<int32_t> row_slot = {3, -1, 0, 7, 1, -1, 9, 4};
    std::vector<lc::SampleParamsDev> prm(slots_n);
    prm[3] = params(0.f, 0, 1.f, 0.f, 0.f, 0.f, 1.f, 5, 1, 0);                   // greedy + top 5
    prm[0] = params(0.8f, 40, 0.9f, 0.f, 0.5f, 0.2f, 1.1f, 20, 7, 3);            // filters + penalties
    prm[7] = params(1.2f, 0, 0.5f, 0.05f, 0.f, 0.f, 1.f, 0, 12345, 0);          // top-p + min-p
    prm[1] = params(0.7f, 0, 1.f, 0.f, 0.f, 0.f, 1.f, 3, 99, 11);                // plain sampling
    prm[9] = params(0.f, 0, 1.f, 0.f, 0.3f, 0.f, 1.3f, 0, 5, 0);                 // greedy + penalties
    prm[4] = params(1.f, 1, 1.f, 0.f, 0.f, 0.f, 1.f, 1, 77, 2);                  // top-k 1
    std::vector<int32_t> counts(size_t(slots_n * vocab), 0);
    std::vector<uint8_t> mask(size_t(slots_n * vocab), 0);
    for (auto& c : counts) c = (r.word() % 50u) == 0 ? int32_t(1 + r.word() % 3u) : 0;
    for (auto& m : mask) m = (r.word() % 40u) == 0;
    Dev<lc::SampleParamsDev> dprm(prm);
    Dev<int32_t> dcounts(counts), dslot(row_slot), tokens(std::vector<int32_t>(slots_n, -5));
    Dev<uint8_t> dmask(mask);
    Dev<char> scratch(lr::sample_rows_scratch_bytes(vocab, M));
    Dev<lc::SampleResult> res(M);
    for (int step = 0; step < 3; ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      const auto logits = randv(r, size_t(M * vocab), 3.f);
      Dev<float> dl(logits);
      std::vector<lc::SampleResult> init(M);
      std::memset(init.data(), 0xAB, sizeof(lc::SampleResult) * M);
      res.set(init);
      lr::SampleRowsArgs a;
      a.logits = dl.p;
      a.vocab = vocab;
      a.M = M;
      a.row_slot = dslot.p;
      a.params = dprm.p;
      a.counts = dcounts.p;
      a.prompt_mask = dmask.p;
      a.token_by_slot = tokens.p;
      a.results = res.p;
      a.scratch = scratch.p;
      lr::sample_rows(a, nullptr);
      CK(cudaDeviceSynchronize());
      const auto got = res.get();
      const auto got_tok = tokens.get();
      for (int m = 0; m < M; ++m) {
        const int s = row_slot[size_t(m)];
        if (s < 0) {
          EXPECT_EQ(std::memcmp(&got[size_t(m)], &init[size_t(m)], sizeof(lc::SampleResult)), 0) << "padding row " << m;
          continue;
        }
        std::vector<int32_t> c(counts.begin() + s * vocab, counts.begin() + (s + 1) * vocab);
        const std::vector<uint8_t> mk(mask.begin() + s * vocab, mask.begin() + (s + 1) * vocab);
        const auto want = today(dl.p + m * vocab, vocab, prm[size_t(s)], c, mk);
        expect_same_result(got[size_t(m)], want, "row " + std::to_string(m));
        EXPECT_EQ(got_tok[size_t(s)], want.token);
        std::copy(c.begin(), c.end(), counts.begin() + s * vocab);
      }
      EXPECT_EQ(dcounts.get(), counts) << "penalty counts";
      const auto gp = dprm.get();
      for (int s = 0; s < slots_n; ++s) EXPECT_EQ(gp[size_t(s)].step, prm[size_t(s)].step) << "slot " << s;
      for (int s : {2, 5, 6, 8}) EXPECT_EQ(got_tok[size_t(s)], -5) << "unused slot " << s << " written";
    }
  }
}

// raw log-softmax of one row (double)
double lse(const std::vector<float>& l) {
  double m = -INFINITY, s = 0;
  for (float v : l) m = std::max(m, double(v));
  for (float v : l) s += std::exp(double(v) - m);
  return m + std::log(s);
}

// sample_rows over M rows with their slots' allowed-token masks (allowed_on: whether a slot's mask applies), waited.
void sample_masked(const float* logits, int64_t vocab, int M, lc::SampleParamsDev* params, int32_t* counts,
                   const uint8_t* prompt_mask, const uint32_t* allowed, const int32_t* allowed_on, int32_t* tokens,
                   lc::SampleResult* results, char* scratch) {
  lr::SampleRowsArgs a;
  a.logits = logits;
  a.vocab = vocab;
  a.M = M;
  a.params = params;
  a.counts = counts;
  a.prompt_mask = prompt_mask;
  a.allowed = allowed;
  a.allowed_on = allowed_on;
  a.token_by_slot = tokens;
  a.results = results;
  a.scratch = scratch;
  lr::sample_rows(a, nullptr);
  CK(cudaDeviceSynchronize());
}

TEST(RowsSample, AllowedMaskRestrictsTheChoice) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng r(seed);
  const int64_t vocab = 5003, W = lr::allowed_words(vocab);
  const int M = 4;
  std::vector<lc::SampleParamsDev> prm = {params(0.f, 0, 1.f, 0.f, 0.f, 0.f, 1.f, 4, 1, 0),
                                          params(1.f, 0, 1.f, 0.f, 0.f, 0.f, 1.f, 0, 3, 0),
                                          params(0.f, 0, 1.f, 0.f, 0.f, 0.f, 1.f, 0, 1, 0),
                                          params(0.9f, 50, 0.95f, 0.f, 0.2f, 0.f, 1.f, 2, 8, 1)};
  std::vector<uint32_t> allowed(size_t(M * W), 0u);
  std::vector<int32_t> on = {1, 1, 1, 0};  // slot 3: mask present but off
  auto allow = [&](int s, int64_t t) { allowed[size_t(s * W + t / 32)] |= 1u << (t % 32); };
  std::vector<char> ok0(size_t(vocab), 0), ok1(size_t(vocab), 0);
  for (int64_t t = 0; t < vocab; ++t) {
    if (r.word() % 7u == 0) allow(0, t), ok0[size_t(t)] = 1;
    if (r.word() % 3u == 0) allow(1, t), ok1[size_t(t)] = 1;
    allow(3, t);  // would allow everything anyway
  }
  // slot 2 allows nothing: no choice (kNoAllowedToken; it took the raw argmax)
  Dev<lc::SampleParamsDev> dprm(prm);
  Dev<int32_t> dcounts(std::vector<int32_t>(size_t(M * vocab), 0)), don(on), tokens(M);
  Dev<uint8_t> dmask(std::vector<uint8_t>(size_t(M * vocab), 0));
  Dev<uint32_t> dallowed(allowed);
  Dev<char> scratch(lr::sample_rows_scratch_bytes(vocab, M));
  Dev<lc::SampleResult> res(M);
  lc::SampleParamsDev p3 = prm[3];
  std::vector<int32_t> c3(static_cast<size_t>(vocab), 0);
  for (int step = 0; step < 20; ++step) {
    auto logits = randv(r, size_t(M * vocab), 2.f);
    // make row 0's raw argmax a disallowed token
    int64_t bad = 0;
    while (ok0[size_t(bad)]) ++bad;
    logits[size_t(bad)] = 50.f;
    Dev<float> dl(logits);
    sample_masked(dl.p, vocab, M, dprm.p, dcounts.p, dmask.p, dallowed.p, don.p, tokens.p, res.p, scratch.p);
    const auto got = res.get();
    std::vector<std::vector<float>> row(M);
    for (int m = 0; m < M; ++m) row[size_t(m)].assign(logits.begin() + m * vocab, logits.begin() + (m + 1) * vocab);
    // row 0: the best allowed token; its logprob is the raw distribution's
    int64_t best = -1;
    for (int64_t t = 0; t < vocab; ++t)
      if (ok0[size_t(t)] && (best < 0 || row[0][size_t(t)] > row[0][size_t(best)])) best = t;
    EXPECT_EQ(got[0].token, best);
    EXPECT_NEAR(got[0].logprob, row[0][size_t(best)] - lse(row[0]), 1e-4);
    ASSERT_EQ(got[0].n_top, 4);
    EXPECT_EQ(got[0].top_ids[0], bad) << "top logprobs come from the raw distribution";
    // row 1: sampled, always allowed
    EXPECT_TRUE(got[1].token >= 0 && got[1].token < vocab && ok1[size_t(got[1].token)]) << "step " << step;
    // row 2: nothing allowed → no choice, the slot's next token in range
    EXPECT_EQ(got[2].token, lc::kNoAllowedToken);
    EXPECT_EQ(tokens.get()[2], 0);
    // row 3: mask off → exactly sample_token
    const auto want = today(dl.p + 3 * vocab, vocab, p3, c3, std::vector<uint8_t>(size_t(vocab), 0));
    expect_same_result(got[3], want, "unmasked row, step " + std::to_string(step));
  }
}

// sample_masked on host data (row m on slot m; allowed: the slots' mask words; on: whether each slot's mask applies):
// the rows' results, the slots' next tokens and the counts afterwards.
struct MaskedRun {
  std::vector<lc::SampleResult> results;
  std::vector<int32_t> tokens, counts;
};
MaskedRun run_masked(int64_t vocab, const std::vector<lc::SampleParamsDev>& prm, const std::vector<float>& logits,
                     const std::vector<uint32_t>& allowed, const std::vector<int32_t>& on) {
  const int M = int(prm.size());
  Dev<lc::SampleParamsDev> dprm(prm);
  Dev<int32_t> dcounts(std::vector<int32_t>(size_t(M * vocab), 0)), don(on), tokens(M);
  Dev<uint8_t> dmask(std::vector<uint8_t>(size_t(M * vocab), 0));
  Dev<uint32_t> dallowed(allowed);
  Dev<char> scratch(lr::sample_rows_scratch_bytes(vocab, M));
  Dev<lc::SampleResult> res(M);
  Dev<float> dl(logits);
  sample_masked(dl.p, vocab, M, dprm.p, dcounts.p, dmask.p, dallowed.p, don.p, tokens.p, res.p, scratch.p);
  return {res.get(), tokens.get(), dcounts.get()};
}

// A row with no choice (engine/sampler.h's rule, the CPU sampler's errors): allowed logits all -inf or NaN, or every
// logit NaN or -inf without a mask, give kNoFiniteLogit; a mask that allows no token of the vocabulary gives
// kNoAllowedToken — greedy and sampled, in a batch beside a row that chooses, and alone (sample_token_masked, the
// single-row sampler). Such a row counts nothing and leaves its slot's token in range; its step moves on. Before:
// allowed -inf or NaN logits gave the first allowed id, every id allowed with every logit NaN gave id 0, no mask with
// every logit -inf gave id 0, a mask allowing nothing gave the raw argmax (or -1 when every logit was -inf).
TEST(RowsSample, RowsWithNoChoiceSayWhy) {
  NEED_GPU();
  const int64_t vocab = 5003, W = lr::allowed_words(vocab);
  struct Row {
    const char* what;
    float temperature;
    int mask;      // 0: none (mask off), 1: tokens 2 and 3, 2: tokens 1283 and 1285, 3: every id, 4: none allowed,
                   // 5: only bits past the vocabulary, 6: token 5
    float fill;    // every logit but those set below
    int32_t want;  // the result's token
  };
  const std::vector<Row> rows = {
      {"allowed at -inf, greedy", 0.f, 1, -INFINITY, lc::kNoFiniteLogit},
      {"allowed at -inf, sampled", 1.f, 1, -INFINITY, lc::kNoFiniteLogit},
      {"allowed NaN, greedy", 0.f, 2, NAN, lc::kNoFiniteLogit},
      {"allowed NaN, sampled", 1.f, 2, NAN, lc::kNoFiniteLogit},
      {"every logit NaN, no mask", 0.f, 0, NAN, lc::kNoFiniteLogit},
      {"every logit NaN, every id allowed", 0.f, 3, NAN, lc::kNoFiniteLogit},
      {"every logit -inf, no mask, sampled", 0.7f, 0, -INFINITY, lc::kNoFiniteLogit},
      {"nothing allowed, every logit -inf, sampled", 1.f, 4, -INFINITY, lc::kNoAllowedToken},
      {"nothing allowed, finite logits, greedy", 0.f, 5, 0.5f, lc::kNoAllowedToken},
      {"token 5 allowed, finite logits", 0.f, 6, 0.5f, 5},
  };
  const int M = int(rows.size());
  std::vector<uint32_t> allowed(size_t(M * W), 0u);
  std::vector<int32_t> on(size_t(M), 1);
  std::vector<float> logits(size_t(M * vocab));
  std::vector<lc::SampleParamsDev> prm;
  for (int m = 0; m < M; ++m) {
    const Row& r = rows[size_t(m)];
    uint32_t* a = allowed.data() + m * W;
    switch (r.mask) {
      case 0: on[size_t(m)] = 0; break;
      case 1: a[0] = 0b1100u; break;
      case 2: a[40] = 0b101000u; break;
      case 3: std::fill(a, a + W, ~0u); break;
      case 4: break;
      case 5: a[W - 1] = ~((1u << (vocab % 32)) - 1u); break;
      default: a[0] = 1u << 5; break;
    }
    std::fill(logits.begin() + m * vocab, logits.begin() + (m + 1) * vocab, r.fill);
    if (r.mask == 1 || r.mask == 2) logits[size_t(m * vocab + 7)] = 3.f;  // finite, not allowed
    prm.push_back(params(r.temperature, 0, 1.f, 0.f, 0.f, 0.f, 1.f, 0, 5 + uint64_t(m), 2));
  }
  const MaskedRun got = run_masked(vocab, prm, logits, allowed, on);
  Dev<float> dl(logits);
  for (int m = 0; m < M; ++m) {
    const Row& r = rows[size_t(m)];
    SCOPED_TRACE(r.what);
    EXPECT_EQ(got.results[size_t(m)].token, r.want);
    const bool none = r.want < 0;
    EXPECT_EQ(got.tokens[size_t(m)], none ? 0 : r.want) << "the slot's next token";
    EXPECT_EQ(std::count(got.counts.begin() + m * vocab, got.counts.begin() + (m + 1) * vocab, 0),
              none ? vocab : vocab - 1)
        << "counted tokens";
    // alone: the single-row sampler
    Dev<lc::SampleParamsDev> dp(std::vector<lc::SampleParamsDev>{prm[size_t(m)]});
    Dev<int32_t> dc(std::vector<int32_t>(size_t(vocab), 0)), tok(std::vector<int32_t>{-5});
    Dev<uint8_t> dm(std::vector<uint8_t>(size_t(vocab), 0));
    Dev<uint32_t> da(std::vector<uint32_t>(allowed.begin() + m * W, allowed.begin() + (m + 1) * W));
    Dev<char> scratch(lr::sample_rows_scratch_bytes(vocab, 1));
    Dev<lc::SampleResult> res(1);
    lr::sample_token_masked(dl.p + m * vocab, vocab, dp.p, dc.p, dm.p, r.mask == 0 ? nullptr : da.p, scratch.p, tok.p,
                            res.p, nullptr);
    CK(cudaDeviceSynchronize());
    EXPECT_EQ(res.get()[0].token, r.want) << "alone";
    EXPECT_EQ(tok.get()[0], none ? 0 : r.want) << "alone: the next token";
    EXPECT_EQ(dp.get()[0].step, prm[size_t(m)].step + 1) << "alone: the step";
  }
}

TEST(RowsSample, SingleRowWithoutMaskIsSampleToken) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng r(seed);
  const int64_t vocab = 248320;
  for (float temp : {0.f, 0.9f}) {
    const auto logits = randv(r, size_t(vocab), 2.f);
    Dev<float> dl(logits);
    lc::SampleParamsDev p = params(temp, 20, 0.9f, 0.f, 0.1f, 0.f, 1.05f, 5, 42, 6);
    std::vector<int32_t> counts(static_cast<size_t>(vocab), 0);
    for (int i = 0; i < 100; ++i) counts[r.word() % vocab] = 1;
    const std::vector<uint8_t> mask(static_cast<size_t>(vocab), 0);
    Dev<lc::SampleParamsDev> dp(std::vector<lc::SampleParamsDev>{p});
    Dev<int32_t> dc(counts), tok(1);
    Dev<uint8_t> dm(mask);
    Dev<char> scratch(lr::sample_rows_scratch_bytes(vocab, 1));
    Dev<lc::SampleResult> res(1);
    lr::sample_token_masked(dl.p, vocab, dp.p, dc.p, dm.p, nullptr, scratch.p, tok.p, res.p, nullptr);
    CK(cudaDeviceSynchronize());
    const auto want = today(dl.p, vocab, p, counts, mask);
    expect_same_result(res.get()[0], want, "temperature " + std::to_string(temp));
    EXPECT_EQ(tok.get()[0], want.token);
    EXPECT_EQ(dc.get(), counts);
    EXPECT_EQ(dp.get()[0].step, p.step);
  }
}

}  // namespace

// The arguments of sample_rows over M rows of one sequence (a speculative verify's rows): one parameter set, the rows'
// tokens by row.
static lr::SampleRowsArgs one_sequence_args(const float* logits, int64_t vocab, int M, lc::SampleParamsDev* params,
                                            int32_t* counts, const uint8_t* mask, int32_t* token_by_row,
                                            lc::SampleResult* results, char* scratch) {
  lr::SampleRowsArgs a;
  a.logits = logits;
  a.vocab = vocab;
  a.M = M;
  a.one_sequence = true;
  a.params = params;
  a.counts = counts;
  a.prompt_mask = mask;
  a.token_by_row = token_by_row;
  a.results = results;
  a.scratch = scratch;
  return a;
}

// One sequence's next M choices in one pass (one_sequence: the verify's rows without penalties): row r is what
// sample_token chooses after r choices (its step + r) — greedy and seeded sampling with filters, logprobs —
// and the sequence's counts and step are left to the caller.
TEST(RowsSample, OneSequenceRowsAreTheChoicesInTurn) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng r(seed);
  for (int64_t vocab : {int64_t(248320), int64_t(1001)}) {
    for (float temp : {0.f, 1.1f}) {
      SCOPED_TRACE("vocab " + std::to_string(vocab) + ", temperature " + std::to_string(temp));
      const int M = 5;
      const lc::SampleParamsDev p0 = params(temp, 30, 0.9f, 0.01f, 0.f, 0.f, 1.f, 3, 17, 4);
      std::vector<int32_t> counts(static_cast<size_t>(vocab), 0);
      for (int i = 0; i < 50; ++i) counts[r.word() % vocab] = 2;
      const std::vector<uint8_t> mask(static_cast<size_t>(vocab), 0);
      const auto logits = randv(r, size_t(M * vocab), 2.f);
      Dev<float> dl(logits);
      Dev<lc::SampleParamsDev> dp(std::vector<lc::SampleParamsDev>{p0});
      Dev<int32_t> dc(counts), tok(std::vector<int32_t>(M, -1));
      Dev<uint8_t> dm(mask);
      Dev<char> scratch(lr::sample_rows_scratch_bytes(vocab, M));
      Dev<lc::SampleResult> res(M);
      lr::sample_rows(one_sequence_args(dl.p, vocab, M, dp.p, dc.p, dm.p, tok.p, res.p, scratch.p), nullptr);
      CK(cudaDeviceSynchronize());
      const auto got = res.get();
      const auto got_tok = tok.get();
      EXPECT_EQ(dc.get(), counts) << "one_sequence wrote the counts";
      EXPECT_EQ(dp.get()[0].step, p0.step) << "one_sequence moved the step";
      lc::SampleParamsDev p = p0;  // sample_token row by row: each choice moves the step
      std::vector<int32_t> c = counts;
      for (int m = 0; m < M; ++m) {
        const auto want = today(dl.p + m * vocab, vocab, p, c, mask);
        expect_same_result(got[size_t(m)], want, "row " + std::to_string(m));
        EXPECT_EQ(got_tok[size_t(m)], want.token) << "row " << m;
      }
      EXPECT_EQ(p.step, p0.step + M);
    }
  }
}

// One sequence's rows (a speculative verify without penalties) with rows that have no choice (every logit NaN, every
// logit -inf): those rows give kNoFiniteLogit and the stand-in token 0 (the verify's acceptance stops at such a row:
// verify_step.cu), and each row is what sample_token gives it in turn, the rows after them included.
TEST(RowsSample, OneSequenceRowsWithNoChoice) {
  NEED_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng r(seed);
  const int64_t vocab = 1001;
  const int M = 4;
  for (float temp : {0.f, 1.1f}) {
    SCOPED_TRACE("temperature " + std::to_string(temp));
    const lc::SampleParamsDev p0 = params(temp, 0, 1.f, 0.f, 0.f, 0.f, 1.f, 2, 23, 1);
    const std::vector<int32_t> counts(static_cast<size_t>(vocab), 0);
    const std::vector<uint8_t> mask(static_cast<size_t>(vocab), 0);
    auto logits = randv(r, size_t(M * vocab), 2.f);
    std::fill(logits.begin() + vocab, logits.begin() + 2 * vocab, NAN);
    std::fill(logits.begin() + 2 * vocab, logits.begin() + 3 * vocab, -INFINITY);
    Dev<float> dl(logits);
    Dev<lc::SampleParamsDev> dp(std::vector<lc::SampleParamsDev>{p0});
    Dev<int32_t> dc(counts), tok(std::vector<int32_t>(M, -5));
    Dev<uint8_t> dm(mask);
    Dev<char> scratch(lr::sample_rows_scratch_bytes(vocab, M));
    Dev<lc::SampleResult> res(M);
    lr::sample_rows(one_sequence_args(dl.p, vocab, M, dp.p, dc.p, dm.p, tok.p, res.p, scratch.p), nullptr);
    CK(cudaDeviceSynchronize());
    const auto got = res.get();
    const auto got_tok = tok.get();
    EXPECT_EQ(got[1].token, lc::kNoFiniteLogit);
    EXPECT_EQ(got[2].token, lc::kNoFiniteLogit);
    lc::SampleParamsDev p = p0;
    std::vector<int32_t> c = counts;
    for (int m = 0; m < M; ++m) {
      const auto want = today(dl.p + m * vocab, vocab, p, c, mask);
      EXPECT_EQ(got[size_t(m)].token, want.token) << "row " << m;
      if (want.token >= 0) expect_same_result(got[size_t(m)], want, "row " + std::to_string(m));
      EXPECT_EQ(got_tok[size_t(m)], want.token >= 0 ? want.token : 0) << "row " << m;
    }
    EXPECT_EQ(dc.get(), counts) << "one_sequence wrote the counts";
  }
}
