// The CUDA backend's batched decode (decode_batch over the sequence pool and the rows step) against each
// session decoded alone: choices (token, logprob, top logprobs) and logits compared bit for bit, over
// mixed sampling parameters, sessions of different lengths, batch membership and order changing every
// step, B = 1..9 and B = 40 (two pools); token masks; snapshots restored across pools; what decode_batch and the pool
// reject; a session whose own step fails gets its error in its row, the others their choices. Skips without a GPU.
//
// Where the rows step is bitwise the single-row step (rows_step_exact: a real-width synthetic model, MoE
// expert width 512) decode_batch runs it and must equal decode_step exactly. The tiny fixtures' expert
// widths (64, 128) are not multiples of 256, so by default their batches step session by session (still
// checked exactly); with LILAC_CUDA_BATCH=rows they run the rows step, which must then be batch invariant:
// a session's results the same bits in any batch (checked against its twin stepped in other batches).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"
#include "cuda/cuda_backend.h"
#include "cuda/batch_step.h"
#include "cuda/cuda_session.h"
#include "gpu_test.h"
#include "model/weights.h"
#include "support/fixtures.h"
#include "support/session_no_choice.h"

using namespace lilac;
using testutil::same_bits;

namespace {

std::string fixture(const std::string& name) { return std::string(LILAC_SHARED_DIR) + "/fixtures/" + name + "/mlx4"; }

// A CUDA backend over a fixture; batch_env (if not null) is LILAC_CUDA_BATCH while it is made.
std::unique_ptr<Backend> fixture_backend(const std::string& name, const char* batch_env = nullptr) {
  auto w = load_model(fixture(name), LoadOptions{false});
  if (batch_env) setenv("LILAC_CUDA_BATCH", batch_env, 1);
  auto b = cuda::make_cuda_backend(w);
  unsetenv("LILAC_CUDA_BATCH");
  return b;
}

void expect_same_choice(const TokenChoice& x, const TokenChoice& y, const std::string& what) {
  EXPECT_EQ(x.token, y.token) << what;
  EXPECT_TRUE(same_bits(x.logprob, y.logprob)) << what << ": logprob " << x.logprob << " vs " << y.logprob;
  ASSERT_EQ(x.top.size(), y.top.size()) << what;
  for (size_t i = 0; i < x.top.size(); ++i) {
    EXPECT_EQ(x.top[i].token, y.top[i].token) << what << " top " << i;
    EXPECT_TRUE(same_bits(x.top[i].logprob, y.top[i].logprob)) << what << " top " << i;
  }
}

void expect_same_logits(Session& x, Session& y, const std::string& what) {
  const std::vector<float> a = x.logits(), b = y.logits();
  ASSERT_EQ(a.size(), b.size());
  size_t diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff += same_bits(a[i], b[i]) ? 0 : 1;
  EXPECT_EQ(diff, 0u) << what << ": " << diff << " of " << a.size() << " logits differ in their bits";
}

// Mixed generations: greedy; seeded sampling with every penalty and truncation; greedy with top logprobs;
// seeded sampling with logprobs; seeded sampling with a presence penalty and logit_bias (bans and a boost).
SamplingParams params_for(int i) {
  SamplingParams p;
  switch (i % 5) {
    case 0:
      break;
    case 1:
      p.temperature = 0.9f;
      p.top_p = 0.95f;
      p.top_k = 40;
      p.min_p = 0.01f;
      p.presence_penalty = 0.3f;
      p.frequency_penalty = 0.2f;
      p.repetition_penalty = 1.1f;
      p.seed = 1000 + uint64_t(i);
      break;
    case 2:
      p.logprobs = true;
      p.top_logprobs = 5;
      break;
    case 3:
      p.temperature = 0.7f;
      p.seed = 77 + uint64_t(i);
      p.logprobs = true;
      p.top_logprobs = 3;
      break;
    default:
      p.temperature = 0.8f;
      p.seed = 5 + uint64_t(i);
      p.presence_penalty = 0.5f;
      p.logprobs = true;
      p.logit_bias = {{int32_t(i + 1), -100.f}, {int32_t(3 + 7 * i), 4.f}, {int32_t(100 + i), -3.5f}};
      break;
  }
  return p;
}

struct Gen {
  std::unique_ptr<Session> s;
  TokenChoice first;
};

// Starts n generations of capacity cap with prompts of different lengths (the same for seed `seed`).
std::vector<Gen> start(Backend& b, int n, int64_t cap, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<Gen> g;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> prompt(size_t(1 + (i * 7 + 3) % 29));
    for (auto& t : prompt) t = int32_t(rng() % uint64_t(std::min<int64_t>(b.config().vocab_size, 2000)));
    Gen x;
    x.s = b.new_session(cap);
    x.s->prefill(prompt);
    x.s->begin_generation(params_for(i), prompt);
    x.first = x.s->sample();
    g.push_back(std::move(x));
  }
  return g;
}

enum class Twin { Alone, OtherBatch };

// n generations decoded with decode_batch in changing batches, each against its twin (the same prompt and
// parameters) decoded alone (decode_step) or inside other batches (reversed order, other members).
// Batch sizes cycle through `sizes` (capped at n). In OtherBatch mode no batch may have one row: a group of
// one steps alone (the single-row path), which is not the rows step's bits on a model where
// rows_step_exact does not hold.
// Rows steps run so far by the pool of session s.
uint64_t rows_steps(Session& s) {
  auto* c = dynamic_cast<cuda::CudaSession*>(&s);
  return c ? c->pool().batch().steps() : 0;
}

void batch_vs_twins(Backend& b, int n, Twin twin, const std::vector<int>& sizes, int steps, bool rows) {
  const int64_t cap = 96;
  std::vector<Gen> bat = start(b, n, cap, 42);
  std::vector<Gen> ref = start(b, n, cap, 42);  // created after bat's prefill: the pool grows under live state
  for (int i = 0; i < n; ++i) expect_same_choice(bat[size_t(i)].first, ref[size_t(i)].first, "first choice");
  std::mt19937_64 rng(7);
  for (int t = 0; t < steps; ++t) {
    const int B = std::min(n, sizes[size_t(t) % sizes.size()]);
    std::vector<int> idx(static_cast<size_t>(n), 0);
    for (int i = 0; i < n; ++i) idx[size_t(i)] = i;
    std::shuffle(idx.begin(), idx.end(), rng);
    idx.resize(size_t(B));
    std::vector<Session*> ss;
    for (int i : idx) ss.push_back(bat[size_t(i)].s.get());
    const std::vector<TokenChoice> got = b.decode_batch(ss);
    ASSERT_EQ(got.size(), size_t(B));
    std::vector<TokenChoice> want(static_cast<size_t>(B));
    if (twin == Twin::Alone) {
      for (int k = 0; k < B; ++k) want[size_t(k)] = ref[size_t(idx[size_t(k)])].s->decode_step();
    } else {
      // the twins in reverse order, split into two batches of >= 2 rows from B = 4 on (other rows, other M)
      std::vector<Session*> rs;
      for (int k = B - 1; k >= 0; --k) rs.push_back(ref[size_t(idx[size_t(k)])].s.get());
      const size_t half = B >= 4 ? size_t(B / 2) : size_t(B);
      std::vector<TokenChoice> r = b.decode_batch(std::span<Session* const>(rs.data(), half));
      if (half < rs.size()) {
        const std::vector<TokenChoice> r2 = b.decode_batch(std::span<Session* const>(rs.data() + half, rs.size() - half));
        r.insert(r.end(), r2.begin(), r2.end());
      }
      for (int k = 0; k < B; ++k) want[size_t(k)] = r[size_t(B - 1 - k)];
    }
    for (int k = 0; k < B; ++k) {
      const int i = idx[size_t(k)];
      const std::string what = "step " + std::to_string(t) + " batch " + std::to_string(B) + " session " +
                               std::to_string(i) + " (params " + std::to_string(i % 5) + ")";
      expect_same_choice(got[size_t(k)], want[size_t(k)], what);
      EXPECT_EQ(bat[size_t(i)].s->length(), ref[size_t(i)].s->length()) << what;
      expect_same_logits(*bat[size_t(i)].s, *ref[size_t(i)].s, what);
    }
    if (::testing::Test::HasFailure()) return;
  }
  if (rows)
    EXPECT_GT(rows_steps(*bat[0].s), 0u) << "the batches did not run as rows steps";
  else
    EXPECT_EQ(rows_steps(*bat[0].s), 0u) << "rows steps ran where they are not bitwise single steps";
}

TEST(CudaBatch, RowsStepEqualsDecodeStepOnRealWidthModel) {
  NEED_GPU();
  auto b = cuda::make_synthetic_cuda_backend(cuda::synthetic_config(4), 3);
  EXPECT_EQ(b->max_batch(), 64);
  batch_vs_twins(*b, 9, Twin::Alone, {2, 9, 1, 5, 3, 8, 4, 7, 6}, 12, true);
}

TEST(CudaBatch, TinyFixturesEqualDecodeStep) {
  NEED_GPU();
  for (const char* name : {"tiny", "tiny2"}) {
    SCOPED_TRACE(name);
    auto b = fixture_backend(name);
    batch_vs_twins(*b, 9, Twin::Alone, {1, 2, 3, 4, 5, 6, 7, 8, 9}, 10, false);
  }
}

TEST(CudaBatch, RowsStepIsBatchInvariantOnTinyFixtures) {
  NEED_GPU();
  for (const char* name : {"tiny", "tiny2"}) {
    SCOPED_TRACE(name);
    auto b = fixture_backend(name, "rows");
    batch_vs_twins(*b, 9, Twin::OtherBatch, {2, 9, 3, 5, 4, 8, 6, 7}, 10, true);
  }
}

TEST(CudaBatch, LargeBatchAcrossTwoPools) {
  NEED_GPU();
  // 40 + 40 sessions of one capacity: the twins fill the first pool's last 24 slots and a second pool
  auto b = cuda::make_synthetic_cuda_backend(cuda::synthetic_config(4), 4);
  batch_vs_twins(*b, 40, Twin::Alone, {40, 33, 17, 64, 2}, 6, true);
}

// Short prompt chunks (2 .. prefill_rows_max() tokens) run as one rows step (CudaSession::prefill_chunk_rows):
// the state, logits and choices must be bit for bit those of feeding the chunk token by token through the
// decode step (a logits sink forces that path), from an empty session and after a context, at the largest
// chunk the rule takes and just past it, and the next chunk after it; LILAC_PREFILL_ROWS=0 turns it off.
TEST(CudaBatch, ShortPrefillOnRowsEqualsDecodeSteps) {
  NEED_GPU();
  auto b = cuda::make_synthetic_cuda_backend(cuda::synthetic_config(4), 5);
  const int R = cuda::prefill_rows_max();
  ASSERT_GE(R, 2);
  std::mt19937_64 rng(11);
  auto tokens = [&](size_t n) {
    std::vector<int32_t> t(n);
    for (auto& x : t) x = int32_t(rng() % 5000);
    return t;
  };
  LogitsSink none = [](int64_t, int64_t, const float*) {};
  struct Case {
    size_t context;
    std::vector<size_t> chunks;
  };
  for (const Case& cs : {Case{0, {2}}, Case{0, {size_t(R)}}, Case{9, {5, 3}}, Case{30, {size_t(R), 7}},
                         Case{3, {size_t(R) + 1}}}) {
    const std::string what = "context " + std::to_string(cs.context) + ", first chunk " + std::to_string(cs.chunks[0]);
    SCOPED_TRACE(what);
    auto r = b->new_session(256), t = b->new_session(256);
    auto* rc = dynamic_cast<cuda::CudaSession*>(r.get());
    ASSERT_NE(rc, nullptr);
    std::vector<int32_t> all = tokens(cs.context);
    if (!all.empty()) {
      r->prefill(all, &none);
      t->prefill(all, &none);
    }
    int64_t expect_rows = 0;
    for (size_t n : cs.chunks) {
      const std::vector<int32_t> c = tokens(n);
      r->prefill(c);        // rows step when 2 <= n <= R
      t->prefill(c, &none);  // token by token
      all.insert(all.end(), c.begin(), c.end());
      expect_rows += n <= size_t(R) ? 1 : 0;
    }
    EXPECT_EQ(rc->rows_prefills(), expect_rows);
    ASSERT_EQ(r->length(), int64_t(all.size()));
    if (expect_rows == 0) continue;  // past the rule: the prefill kernels, not the same bits
    expect_same_logits(*r, *t, "after the prompt");
    SamplingParams p = params_for(3);
    r->begin_generation(p, all);
    t->begin_generation(p, all);
    for (int step = 0; step < 4; ++step) {
      const std::string at = "step " + std::to_string(step);
      expect_same_choice(step == 0 ? r->sample() : r->decode_step(), step == 0 ? t->sample() : t->decode_step(), at);
      expect_same_logits(*r, *t, at);
      if (::testing::Test::HasFailure()) return;
    }
  }
  // The MTP head follows a rows chunk as it follows decode steps (the same hiddens): the same drafts.
  if (b->new_session(8)->can_draft()) {
    SCOPED_TRACE("drafting");
    auto r = b->new_session(128), t = b->new_session(128);
    r->enable_drafting(true);
    t->enable_drafting(true);
    std::vector<int32_t> all;
    for (size_t n : {size_t(R), size_t(6)}) {
      const std::vector<int32_t> c = tokens(n);
      r->prefill(c);
      t->prefill(c, &none);
      all.insert(all.end(), c.begin(), c.end());
    }
    EXPECT_EQ(dynamic_cast<cuda::CudaSession*>(r.get())->rows_prefills(), 2);
    r->begin_generation(SamplingParams{}, all);
    t->begin_generation(SamplingParams{}, all);
    EXPECT_EQ(r->sample().token, t->sample().token);
    const auto d = r->draft(3);
    EXPECT_EQ(d.size(), 3u);
    EXPECT_EQ(d, t->draft(3));
  }
  setenv("LILAC_PREFILL_ROWS", "0", 1);
  auto off = b->new_session(64);
  off->prefill(tokens(4));
  unsetenv("LILAC_PREFILL_ROWS");
  EXPECT_EQ(dynamic_cast<cuda::CudaSession*>(off.get())->rows_prefills(), 0);
}

// A mask restricts the next choice only, alone and batched, with the same result.
TEST(CudaBatch, TokenMasks) {
  NEED_GPU();
  auto b = cuda::make_synthetic_cuda_backend(cuda::synthetic_config(4), 5);
  const int64_t V = b->config().vocab_size;
  std::vector<Gen> bat = start(*b, 4, 64, 9), ref = start(*b, 4, 64, 9);
  std::mt19937_64 rng(11);
  for (int t = 0; t < 4; ++t) {
    std::vector<std::vector<uint32_t>> masks(4, std::vector<uint32_t>(size_t((V + 31) / 32), 0));
    std::vector<std::vector<int32_t>> allowed(4);
    for (int i = 0; i < 4; ++i) {
      if ((i + t) % 2) continue;  // half the sessions masked each step
      for (int k = 0; k < 5; ++k) {
        const int32_t tok = int32_t(rng() % uint64_t(V));
        masks[size_t(i)][size_t(tok / 32)] |= 1u << (tok % 32);
        allowed[size_t(i)].push_back(tok);
      }
      bat[size_t(i)].s->set_token_mask(masks[size_t(i)].data());
      ref[size_t(i)].s->set_token_mask(masks[size_t(i)].data());
    }
    std::vector<Session*> ss;
    for (auto& g : bat) ss.push_back(g.s.get());
    const std::vector<TokenChoice> got = b->decode_batch(ss);
    for (int i = 0; i < 4; ++i) {
      const TokenChoice want = ref[size_t(i)].s->decode_step();
      const std::string what = "step " + std::to_string(t) + " session " + std::to_string(i);
      expect_same_choice(got[size_t(i)], want, what);
      if (!allowed[size_t(i)].empty()) {
        EXPECT_NE(std::find(allowed[size_t(i)].begin(), allowed[size_t(i)].end(), got[size_t(i)].token),
                  allowed[size_t(i)].end())
            << what << ": token " << got[size_t(i)].token << " is not allowed";
      }
    }
  }
  EXPECT_GT(rows_steps(*bat[0].s), 0u);
  // a mask that allows nothing is refused, with the CPU sampler's error for it (engine/sampler.h)
  std::vector<uint32_t> none(size_t((V + 31) / 32), 0);
  try {
    bat[0].s->set_token_mask(none.data());
    ADD_FAILURE() << "a mask that allows no token was taken";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("allows no token"), std::string::npos) << e.what();
  }
}

// A snapshot taken in one pool restores into sessions of the same and of another capacity, which then
// decode (batched and alone) exactly as the original.
TEST(CudaBatch, SnapshotsAcrossPools) {
  NEED_GPU();
  auto b = cuda::make_synthetic_cuda_backend(cuda::synthetic_config(4), 7);
  std::vector<int32_t> prompt(37);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t((i * 7919) % 5000);
  auto a = b->new_session(128);
  a->prefill(prompt);
  auto snap = a->snapshot();
  auto same = b->new_session(128), other = b->new_session(200), filler = b->new_session(128);
  same->restore(*snap);
  other->restore(*snap);
  filler->prefill(std::vector<int32_t>{5, 6, 7});
  SamplingParams p = params_for(1);
  for (Session* s : {a.get(), same.get(), other.get(), filler.get()}) s->begin_generation(p, prompt);
  TokenChoice ca = a->sample(), cs = same->sample(), co = other->sample();
  filler->sample();
  expect_same_choice(cs, ca, "first, same capacity");
  expect_same_choice(co, ca, "first, other capacity");
  for (int t = 0; t < 5; ++t) {
    std::vector<Session*> ss = {filler.get(), same.get(), other.get()};  // two pools: {filler, same}, {other}
    const std::vector<TokenChoice> got = b->decode_batch(ss);
    const TokenChoice want = a->decode_step();
    expect_same_choice(got[1], want, "same capacity, step " + std::to_string(t));
    expect_same_choice(got[2], want, "other capacity, step " + std::to_string(t));
    expect_same_logits(*same, *a, "same capacity");
    expect_same_logits(*other, *a, "other capacity");
  }
  EXPECT_GT(rows_steps(*same), 0u);
}

// decode_batch checks every session before it changes any state; the pool refuses what does not fit.
TEST(CudaBatch, RejectsBadBatchesAndOversizedSessions) {
  NEED_GPU();
  auto b = fixture_backend("tiny2", "rows");
  auto b2 = fixture_backend("tiny2");
  std::vector<Gen> g = start(*b, 3, 32, 1);
  const int64_t len0 = g[0].s->length();
  auto fresh = b->new_session(32);  // no sampled token pending
  auto foreign = b2->new_session(32);
  foreign->prefill(std::vector<int32_t>{1, 2});
  foreign->begin_generation(SamplingParams{}, {});
  foreign->sample();
  Session* s0 = g[0].s.get();
  Session* s1 = g[1].s.get();
  EXPECT_THROW(b->decode_batch(std::vector<Session*>{s0, s1, s0}), Error);
  EXPECT_THROW(b->decode_batch(std::vector<Session*>{s0, s1, fresh.get()}), Error);
  EXPECT_THROW(b->decode_batch(std::vector<Session*>{s0, foreign.get()}), Error);
  EXPECT_EQ(g[0].s->length(), len0) << "a rejected batch changed a session";
  // a full context
  auto full = b->new_session(4);
  full->prefill(std::vector<int32_t>{1, 2, 3, 4});
  full->begin_generation(SamplingParams{}, {});
  full->sample();
  EXPECT_THROW(b->decode_batch(std::vector<Session*>{s0, full.get()}), InputError);
  EXPECT_EQ(g[0].s->length(), len0);
  // a capacity no device holds: a clear error, and the backend keeps working
  try {
    b->new_session(int64_t(1) << 40);
    ADD_FAILURE() << "a session of 2^40 tokens was created";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no device memory"), std::string::npos) << e.what();
  }
  const std::vector<TokenChoice> r = b->decode_batch(std::vector<Session*>{s0, s1});
  EXPECT_EQ(r.size(), 2u);
  EXPECT_EQ(g[0].s->length(), len0 + 1);
}

// A session whose own step fails in a batch (fed a token whose embedding row is NaN: every logit NaN, so its sampler
// has no choice, engine/sampler.h) gets the error in its row (TokenChoice::error: the CPU sampler's Error naming the
// logits), and the other sessions their choices, those of their twins decoded in a batch of their own, in that step
// and the next: on the rows step (LILAC_CUDA_BATCH=rows: BatchStep results) and session by session ("loop"). Before,
// its row made to_choice throw out of decode_batch, and the whole batch failed. The twins never choose the NaN token
// (a bias).
TEST(CudaBatch, ASessionsOwnFailureIsItsRowsErrorOnly) {
  NEED_GPU();
  const int64_t V = testutil::fixture("tiny2")->config.vocab_size;
  const int32_t poison = int32_t(V - 1);
  for (const char* mode : {"rows", "loop"}) {
    SCOPED_TRACE(mode);
    setenv("LILAC_CUDA_BATCH", mode, 1);
    auto b = cuda::make_cuda_backend(testutil::with_nan_embedding_row("tiny2", poison));
    unsetenv("LILAC_CUDA_BATCH");
    std::vector<std::unique_ptr<Session>> bat, ref;
    for (int i = 0; i < 3; ++i) {
      std::vector<int32_t> prompt(size_t(4 + 5 * i));
      for (size_t k = 0; k < prompt.size(); ++k) prompt[k] = int32_t((k * 131 + size_t(i) * 17 + 3) % size_t(V - 1));
      SamplingParams p = params_for(i);
      p.logit_bias.push_back({poison, -100.f});
      for (auto* v : {&bat, &ref}) {
        v->push_back(b->new_session(64));
        v->back()->prefill(prompt);
        v->back()->begin_generation(p, prompt);
      }
      expect_same_choice(bat.back()->sample(), ref.back()->sample(), "first choice");
    }
    auto bad = b->new_session(64);
    const std::vector<int32_t> prompt = {5, 6, 7};
    bad->prefill(prompt);
    bad->begin_generation(SamplingParams{}, prompt);
    std::vector<uint32_t> only(size_t((V + 31) / 32), 0);
    only[size_t(poison) / 32] |= 1u << (poison % 32);
    bad->set_token_mask(only.data());
    ASSERT_EQ(bad->sample().token, poison);  // fed by the batched step: NaN logits
    std::vector<TokenChoice> got;
    ASSERT_NO_THROW(got = b->decode_batch(std::vector<Session*>{bat[0].get(), bad.get(), bat[1].get(), bat[2].get()}));
    ASSERT_EQ(got.size(), 4u);
    const testutil::RowError err = testutil::row_error(got[1]);
    EXPECT_FALSE(err.input);
    EXPECT_NE(err.message.find("finite logit"), std::string::npos) << err.message;
    // The twins step in a batch of their own: on the rows step its bits are those of any batch (on the tiny
    // fixtures not those of decode_step: the file's header), session by session those of decode_step.
    auto expect_twins = [&](const std::vector<TokenChoice>& mine, const std::string& step) {
      ASSERT_EQ(mine.size(), 3u);
      const std::vector<TokenChoice> want =
          b->decode_batch(std::vector<Session*>{ref[0].get(), ref[1].get(), ref[2].get()});
      for (size_t i = 0; i < 3; ++i) {
        const std::string what = step + ", session " + std::to_string(i);
        EXPECT_FALSE(mine[i].error) << what << ": " << testutil::row_error(mine[i]).message;
        EXPECT_FALSE(want[i].error) << what << ": " << testutil::row_error(want[i]).message;
        expect_same_choice(mine[i], want[i], what);
        expect_same_logits(*bat[i], *ref[i], what);
      }
    };
    expect_twins({got[0], got[2], got[3]}, "beside the failing session");
    expect_twins(b->decode_batch(std::vector<Session*>{bat[0].get(), bat[1].get(), bat[2].get()}), "the next step");
    if (std::string(mode) == "rows")
      EXPECT_GT(rows_steps(*bat[0]), 0u) << "the batches did not run as rows steps";
    else
      EXPECT_EQ(rows_steps(*bat[0]), 0u);
  }
}

TEST(CudaBatch, SessionBytesAndDefaultSessions) {
  NEED_GPU();
  auto b = fixture_backend("tiny");
  const size_t small = b->session_bytes(256), big = b->session_bytes(4096);
  EXPECT_GT(small, 0u);
  // the K/V cache grows with the capacity: 2 (K, V) x bf16 x kv_dim per attention layer and token
  const ModelConfig& c = b->config();
  int n_attn = 0;
  for (bool f : c.full_attention) n_attn += f ? 1 : 0;
  EXPECT_GE(big - small, size_t(n_attn) * 2 * 2 * size_t(c.kv_dim()) * (4096 - 256));
  const int n = b->default_sessions(256);
  EXPECT_GE(n, 1);
  EXPECT_LE(n, b->max_batch());
}

// The server's sessions (reserve_sessions before creating them) sit in pools allocated once: 64 slots,
// then the rest; creating the sessions moves nothing.
TEST(CudaBatch, ReservedPoolsHoldTheServersSessions) {
  NEED_GPU();
  auto b = fixture_backend("tiny");
  b->reserve_sessions(70, 48);
  std::vector<std::unique_ptr<Session>> ss;
  std::vector<const cuda::SeqPool*> pools;
  std::vector<uint64_t> gens;
  for (int i = 0; i < 70; ++i) {
    ss.push_back(b->new_session(48));
    auto* c = dynamic_cast<cuda::CudaSession*>(ss.back().get());
    ASSERT_NE(c, nullptr);
    if (std::find(pools.begin(), pools.end(), &c->pool()) == pools.end()) {
      pools.push_back(&c->pool());
      gens.push_back(c->pool().generation());
    }
  }
  ASSERT_EQ(pools.size(), 2u);
  EXPECT_EQ(pools[0]->capacity(), 64);
  EXPECT_EQ(pools[1]->capacity(), 6);
  EXPECT_EQ(pools[0]->used(), 64);
  EXPECT_EQ(pools[1]->used(), 6);
  for (size_t p = 0; p < 2; ++p) EXPECT_EQ(pools[p]->generation(), gens[p]) << "pool " << p << " moved";
  // they decode, batched across both pools, as they do alone
  std::vector<Session*> some;
  for (int i = 60; i < 68; ++i) {
    ss[size_t(i)]->prefill(std::vector<int32_t>{int32_t(i), 3, 4});
    ss[size_t(i)]->begin_generation(SamplingParams{}, {});
    ss[size_t(i)]->sample();
    some.push_back(ss[size_t(i)].get());
  }
  auto twin = b->new_session(48);
  twin->prefill(std::vector<int32_t>{66, 3, 4});
  twin->begin_generation(SamplingParams{}, {});
  twin->sample();
  const std::vector<TokenChoice> got = b->decode_batch(some);
  expect_same_choice(got[6], twin->decode_step(), "session 66");
  expect_same_logits(*ss[66], *twin, "session 66");
}

}  // namespace

// After a row with no choice nothing is pending: decode_step, advance and decode_batch refuse before computing (they
// fed the sampler's code -1 as a token id, row -1 of the embedding), and reset() makes the session whole
// (tests/support/session_no_choice.h; the same test for the CPU backends). Both ends of a step: the session's own
// decode_step and its row of a batched step (finish_batched).
TEST(CudaBatch, ARowWithNoChoiceLeavesNothingPending) {
  NEED_GPU();
  testutil::nochoice::expect_a_row_with_no_choice_leaves_nothing_pending(
      [](std::shared_ptr<const ModelWeights> w) { return cuda::make_cuda_backend(std::move(w)); });
}
