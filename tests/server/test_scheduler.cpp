// The continuous-batching scheduler: streams served together give token for token (and logprob for
// logprob) what each gives alone, on the CPU backend with fixtures tiny and tiny2 (greedy, seeded
// sampling with penalties, stop ids, stop strings, logprobs), with prefill chunks interleaved with
// batched decode steps; the prefix cache serves every sequence; cancellation during prefill and decode
// frees the session; a failing step fails only its own sequences; the pool's size.
#include <gtest/gtest.h>

#include <algorithm>
#include <mutex>
#include <thread>
#include <chrono>
#include <cstring>
#include <map>
#include <random>
#include <regex>

#include "../engine/fake_session.h"
#include "cpu/cpu_backend.h"
#include "engine/backend.h"
#include "model/weights.h"
#include "server/metrics.h"
#include "server/scheduler.h"
#include "text/tokenizer.h"
#include "support/fixtures.h"
#include "support/jobs.h"

using namespace lilac;
using testutil::random_tokens;
using namespace lilac::server;

namespace {

std::shared_ptr<const Tokenizer> tokenizer() { return testutil::qwen3_tokenizer(); }

std::shared_ptr<Backend> cpu_backend(const std::string& fx) {
  static std::map<std::string, std::shared_ptr<const ModelWeights>> w;
  auto& m = w[fx];
  if (!m) m = load_model(std::string(LILAC_SHARED_DIR) + "/fixtures/" + fx + "/mlx4", LoadOptions{.progress = false});
  return std::shared_ptr<Backend>(make_cpu_backend(m, 2));
}

using Result = testutil::JobResult;
Result wait(Job& j) { return testutil::wait_job(j); }

void expect_same(const Result& a, const Result& b, const std::string& where) {
  EXPECT_EQ(a.error, b.error) << where;
  EXPECT_EQ(a.ids, b.ids) << where;
  EXPECT_EQ(a.text, b.text) << where;
  EXPECT_EQ(a.stats.finish, b.stats.finish) << where;
  EXPECT_EQ(a.stats.completion_tokens, b.stats.completion_tokens) << where;
  EXPECT_EQ(a.stats.stop_string, b.stats.stop_string) << where;
  EXPECT_EQ(a.stats.cached_tokens, b.stats.cached_tokens) << where;
  ASSERT_EQ(a.choices.size(), b.choices.size()) << where;
  for (size_t i = 0; i < a.choices.size(); ++i) {
    EXPECT_EQ(std::memcmp(&a.choices[i].logprob, &b.choices[i].logprob, sizeof(float)), 0) << where << " token " << i;
    ASSERT_EQ(a.choices[i].top.size(), b.choices[i].top.size()) << where;
    for (size_t k = 0; k < a.choices[i].top.size(); ++k) {
      EXPECT_EQ(a.choices[i].top[k].token, b.choices[i].top[k].token) << where;
      EXPECT_EQ(std::memcmp(&a.choices[i].top[k].logprob, &b.choices[i].top[k].logprob, sizeof(float)), 0) << where;
    }
  }
}

int64_t metric(const Metrics& m, const std::string& name) {
  std::smatch mt;
  const std::string text = m.render();
  if (!std::regex_search(text, mt, std::regex("\n" + std::regex_replace(name, std::regex(R"([{}+"])"), R"(\$&)") +
                                              R"( ([0-9.]+)\n)")))
    ADD_FAILURE() << "no metric " << name;
  return mt.empty() ? -1 : std::stoll(mt[1]);
}

// Six requests of different shapes: lengths, sampling, penalties, logprobs, stop ids, max_tokens.
std::vector<GenerationRequest> mixed_requests(int64_t vocab) {
  std::vector<GenerationRequest> rs;
  const int64_t lens[] = {23, 5, 41, 12, 60, 8};
  for (int i = 0; i < 6; ++i) {
    GenerationRequest r;
    r.prompt = random_tokens(lens[i], vocab, 300 + uint32_t(i));
    r.max_tokens = 14 + 3 * i;
    r.sampling.seed = 77 + uint64_t(i);
    if (i % 2 == 1) {
      r.sampling.temperature = 0.9f;
      r.sampling.top_p = 0.95f;
      r.sampling.presence_penalty = 0.4f;
      r.sampling.frequency_penalty = 0.3f;
      r.sampling.repetition_penalty = 1.15f;
    }
    if (i % 3 == 2) {
      r.sampling.logprobs = true;
      r.sampling.top_logprobs = 2;
    }
    if (i == 4) r.stop_ids = {int32_t(r.prompt[3])};  // some id that may come up
    rs.push_back(std::move(r));
  }
  return rs;
}

std::vector<Result> run_alone(std::shared_ptr<Backend> be, const std::vector<GenerationRequest>& reqs,
                              int64_t chunk) {
  SchedulerOptions o;
  o.max_seq = 256;
  o.prefill_chunk = chunk;
  return testutil::run_one_by_one(std::move(be), reqs, o);
}

}  // namespace

TEST(Scheduler, BatchedStreamsEqualTheirAnswersAlone) {
  for (const char* fx : {"tiny", "tiny2"}) {
    auto be = cpu_backend(fx);
    auto reqs = mixed_requests(be->config().vocab_size);
    // Stop strings: cut two of the streams on a piece of their own text.
    const auto free_run = run_alone(be, {reqs[0], reqs[3]}, 7);
    for (int k : {0, 1}) {
      ASSERT_GE(free_run[k].text.size(), 8u) << fx;
      reqs[k * 3].stop_strings = {free_run[k].text.substr(free_run[k].text.size() / 2, 3)};
    }
    const auto alone = run_alone(be, reqs, 7);
    EXPECT_EQ(alone[0].stats.finish, FinishReason::Stop);
    EXPECT_FALSE(alone[0].stats.stop_string.empty());

    Metrics m;
    SchedulerOptions o;
    o.max_batch = 4;  // six jobs: two wait for a free session
    o.max_seq = 256;
    o.prefill_chunk = 7;
    Scheduler s(be, tokenizer(), o, &m);
    EXPECT_EQ(s.capacity(), 4);
    std::vector<std::shared_ptr<Job>> jobs;
    for (const auto& r : reqs) jobs.push_back(std::make_shared<Job>(r));
    ASSERT_TRUE(s.submit_all(jobs));
    for (size_t i = 0; i < jobs.size(); ++i)
      expect_same(wait(*jobs[i]), alone[i], std::string(fx) + " request " + std::to_string(i));
    // It really batched, and prefill chunks ran between decode steps.
    EXPECT_LT(metric(m, "lilac_decode_batch_size_bucket{le=\"1\"}"), metric(m, "lilac_decode_steps_total"));
    EXPECT_LT(metric(m, "lilac_decode_batch_size_bucket{le=\"2\"}"), metric(m, "lilac_decode_steps_total"));
    EXPECT_GT(metric(m, "lilac_mixed_steps_total"), 0);
    EXPECT_GT(metric(m, "lilac_prefill_chunks_total"), 6);
    EXPECT_EQ(metric(m, "lilac_sequence_pool_capacity"), 4);
    EXPECT_EQ(metric(m, "lilac_sequence_pool_in_use"), 0);
    EXPECT_EQ(s.depth(), 0);
  }
}

TEST(Scheduler, PrefixCacheServesEverySequence) {
  auto be = cpu_backend("tiny");
  const int32_t boundary = 7;
  std::vector<GenerationRequest> reqs;
  const std::vector<int32_t> system = {11, 200, 300, 400, 500, 600, boundary};
  for (int i = 0; i < 3; ++i) {
    GenerationRequest r;
    r.prompt = system;
    for (int32_t t : random_tokens(9 + i, 1000, 40 + uint32_t(i))) r.prompt.push_back(t + 20);
    r.prompt.push_back(boundary);
    r.prompt.push_back(12);
    r.max_tokens = 10;
    r.boundary_token = boundary;
    reqs.push_back(r);
  }
  auto alone = run_alone(be, reqs, 4);
  SchedulerOptions o;
  o.max_batch = 3;
  o.max_seq = 256;
  o.prefill_chunk = 4;
  Scheduler s(be, tokenizer(), o);
  std::vector<std::shared_ptr<Job>> jobs;
  for (const auto& r : reqs) jobs.push_back(std::make_shared<Job>(r));
  ASSERT_TRUE(s.submit_all(jobs));
  for (size_t i = 0; i < jobs.size(); ++i) {
    Result r = wait(*jobs[i]);
    // The first prefills everything; the others resume after the shared system message, which the
    // first one's sequence put in the cache.
    EXPECT_EQ(r.stats.cached_tokens, i == 0 ? 0 : int64_t(system.size())) << i;
    expect_same(r, alone[i], "request " + std::to_string(i));
  }
  EXPECT_GE(s.cache().entries(), 4u);
}

namespace {

// HashSessions whose prefill and decode steps call the test's hooks (on the worker thread).
class HookedSession : public HashSession {
 public:
  HookedSession(int64_t max, int32_t eos, Counters* c, class HookedBackend* be) : HashSession(max, eos, c), be_(be) {}
  void prefill(std::span<const int32_t> tokens, const LogitsSink* sink) override;
  TokenChoice decode_step() override;
  int32_t first = -1;  // first prompt token of the current generation (identifies the job)
 private:
  class HookedBackend* be_;
};

class HookedBackend : public Backend {
 public:
  std::string name() const override { return "hooked"; }
  const ModelConfig& config() const override { return cfg; }
  std::unique_ptr<Session> new_session(int64_t max) override {
    return std::make_unique<HookedSession>(max, 5, &counters, this);
  }
  int max_batch() const override { return batch; }  // Backend's decode_batch: the sessions' decode_step in turn
  int batch = 1;
  ModelConfig cfg;
  Counters counters;
  std::function<void(HookedSession&, std::span<const int32_t>)> on_prefill;
  std::function<void(HookedSession&)> on_decode;
};

void HookedSession::prefill(std::span<const int32_t> tokens, const LogitsSink* sink) {
  if (length() == 0) first = tokens[0];
  if (be_->on_prefill) be_->on_prefill(*this, tokens);
  HashSession::prefill(tokens, sink);
}

TokenChoice HookedSession::decode_step() {
  if (be_->on_decode) be_->on_decode(*this);
  return HashSession::decode_step();
}

GenerationRequest hash_request(int32_t first, int64_t len, int64_t max_tokens) {
  GenerationRequest r;
  r.prompt.push_back(first);
  for (int64_t i = 1; i < len; ++i) r.prompt.push_back(int32_t(100 + i));
  r.max_tokens = max_tokens;
  r.use_cache = false;
  return r;
}

}  // namespace

TEST(Scheduler, CancellationDuringPrefillAndDecodeFreesTheSession) {
  auto be = std::make_shared<HookedBackend>();
  auto a = std::make_shared<Job>(hash_request(1000, 40, 50));  // cancelled during its prefill
  auto b = std::make_shared<Job>(hash_request(2000, 6, 30));   // cancelled after 3 decode steps
  auto c = std::make_shared<Job>(hash_request(3000, 9, 12));   // waits for a free session, then runs
  int64_t a_prefilled = 0;
  be->on_prefill = [&](HookedSession& s, std::span<const int32_t> t) {
    if (s.first == 1000) {
      a_prefilled += int64_t(t.size());
      a->cancel = true;  // the client goes away during the first chunk
    }
  };
  std::map<int32_t, int> steps;
  be->on_decode = [&](HookedSession& s) {
    if (++steps[s.first] == 3 && s.first == 2000) b->cancel = true;
  };
  Metrics m;
  SchedulerOptions o;
  o.max_batch = 2;
  o.max_seq = 512;
  o.prefill_chunk = 4;
  Scheduler sched(be, tokenizer(), o, &m);
  ASSERT_TRUE(sched.submit_all({a, b, c}));
  Result ra = wait(*a), rb = wait(*b), rc = wait(*c);
  EXPECT_EQ(ra.stats.finish, FinishReason::Cancelled);
  EXPECT_TRUE(ra.ids.empty());
  EXPECT_EQ(a_prefilled, 4);  // one chunk, not the whole prompt
  EXPECT_EQ(rb.stats.finish, FinishReason::Cancelled);
  EXPECT_EQ(steps[2000], 3);  // no step after the cancellation
  EXPECT_EQ(rb.ids.size(), 3u);  // the first choice and those of steps 1 and 2
  EXPECT_EQ(rc.stats.finish, FinishReason::Length);
  EXPECT_EQ(rc.ids.size(), 12u);
  EXPECT_EQ(sched.in_use(), 0);
  EXPECT_EQ(sched.depth(), 0);
  EXPECT_EQ(metric(m, "lilac_cancelled_total"), 2);
  // c's tokens are those it gets alone.
  be->on_prefill = nullptr;
  be->on_decode = nullptr;
  auto c2 = std::make_shared<Job>(hash_request(3000, 9, 12));
  ASSERT_TRUE(sched.submit(c2));
  expect_same(wait(*c2), rc, "c alone");
}

// A sequence waiting for its prefill while an older one prefills a long prompt: its client goes away during the
// older one's first chunk. It ends, and its session is free for the queued job, at that step, not after the older
// prompt's 100 chunks (it kept its slot until then before).
TEST(Scheduler, ACancelledSequenceWaitingForItsPrefillFreesItsSessionAtOnce) {
  auto be = std::make_shared<HookedBackend>();
  auto a = std::make_shared<Job>(hash_request(1000, 400, 4));  // prefilled 4 tokens per step
  auto b = std::make_shared<Job>(hash_request(2000, 8, 4));    // waits behind a; cancelled during a's first chunk
  auto c = std::make_shared<Job>(hash_request(3000, 8, 4));    // queued: no free session until b's is
  int64_t a_prefilled = 0, a_when_c_starts = -1;  // a's prompt tokens prefilled when c got a session
  be->on_prefill = [&](HookedSession& s, std::span<const int32_t> t) {
    if (s.first != 1000) return;
    if (c->started && a_when_c_starts < 0) a_when_c_starts = a_prefilled;
    a_prefilled += int64_t(t.size());
    b->cancel = true;
  };
  SchedulerOptions o;
  o.max_batch = 2;
  o.max_seq = 512;
  o.prefill_chunk = 4;
  Scheduler sched(be, tokenizer(), o);
  ASSERT_TRUE(sched.submit_all({a, b, c}));
  Result ra = wait(*a), rb = wait(*b), rc = wait(*c);
  EXPECT_EQ(rb.stats.finish, FinishReason::Cancelled);
  EXPECT_TRUE(rb.ids.empty());
  EXPECT_EQ(ra.stats.finish, FinishReason::Length);
  EXPECT_EQ(rc.stats.finish, FinishReason::Length);
  EXPECT_GE(a_when_c_starts, 4) << "c got no session before the older prompt was prefilled (-1: never during it)";
  EXPECT_LE(a_when_c_starts, 8);
  EXPECT_EQ(sched.in_use(), 0);
}

namespace {
// A constraint whose mask cannot be computed after its first token (as a grammar that meets too many parses at once
// throws from Matcher::fill_mask).
struct ThrowingConstraint : TokenConstraint {
  int calls = 0;
  const uint32_t* allowed() override {
    if (++calls > 1) throw Error("grammar: more than 4096 parses at once");
    return nullptr;
  }
  void accept(int32_t) override {}
};
}  // namespace

// The constraint's mask for a batched decode step throws: that request fails (500) and the others in the batch go on.
// It escaped the worker thread before (std::terminate: the whole server gone).
TEST(Scheduler, AConstraintThatThrowsBeforeABatchedStepFailsOnlyItsRequest) {
  auto be = std::make_shared<HookedBackend>();
  GenerationRequest rq = hash_request(1000, 6, 20);
  rq.constraint = std::make_shared<ThrowingConstraint>();
  auto a = std::make_shared<Job>(rq);
  auto b = std::make_shared<Job>(hash_request(2000, 6, 20));
  SchedulerOptions o;
  o.max_batch = 2;
  o.max_seq = 512;
  o.prefill_chunk = 8;
  Scheduler sched(be, tokenizer(), o);
  ASSERT_TRUE(sched.submit_all({a, b}));
  Result ra = wait(*a), rb = wait(*b);
  EXPECT_EQ(ra.error, 500);
  EXPECT_EQ(rb.error, 0);
  EXPECT_EQ(rb.stats.finish, FinishReason::Length);
  EXPECT_EQ(rb.ids.size(), 20u);
  EXPECT_EQ(sched.in_use(), 0);
  // the scheduler still serves
  auto c = std::make_shared<Job>(hash_request(3000, 6, 5));
  ASSERT_TRUE(sched.submit(c));
  EXPECT_EQ(wait(*c).ids.size(), 5u);
}

// Bursts (SchedulerOptions::burst_prefill): requests that arrive together are prefilled before any of them takes
// a decode step, while a stream that was already decoding keeps its decode step between every two chunks; off,
// the burst's first streams decode between the others' chunks. The tokens are the same either way.
TEST(Scheduler, ABurstIsPrefilledBeforeItDecodesAndRunningStreamsAreNotHeld) {
  struct Ev {
    int32_t job;
    char kind;  // 'P': a prefill chunk, 'D': a decode step
  };
  for (const bool burst : {true, false}) {
    SCOPED_TRACE(burst ? "burst_prefill on" : "burst_prefill off");
    auto be = std::make_shared<HookedBackend>();
    std::mutex mu;
    std::vector<Ev> log;
    be->on_prefill = [&](HookedSession& s, std::span<const int32_t>) {
      std::lock_guard lk(mu);
      log.push_back({s.first, 'P'});
    };
    be->on_decode = [&](HookedSession& s) {
      if (s.first == 9000) std::this_thread::sleep_for(std::chrono::milliseconds(2));  // x outlasts the burst
      std::lock_guard lk(mu);
      log.push_back({s.first, 'D'});
    };
    Metrics m;
    SchedulerOptions o;
    o.max_batch = 4;
    o.max_seq = 512;
    o.prefill_chunk = 4;
    o.burst_prefill = burst;
    Scheduler sched(be, tokenizer(), o, &m);
    // x decodes alone first; the burst (a, b, c: 5 chunks each) arrives while it does.
    auto x = std::make_shared<Job>(hash_request(9000, 3, 80));
    ASSERT_TRUE(sched.submit(x));
    for (int i = 0; i < 2000; ++i) {
      {
        std::lock_guard lk(mu);
        if (std::count_if(log.begin(), log.end(), [](const Ev& e) { return e.kind == 'D'; }) >= 2) break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::vector<std::shared_ptr<Job>> burst_jobs;
    for (int32_t f : {1000, 2000, 3000}) burst_jobs.push_back(std::make_shared<Job>(hash_request(f, 20, 6)));
    ASSERT_TRUE(sched.submit_all(burst_jobs));
    std::vector<Result> got;
    for (auto& j : burst_jobs) got.push_back(wait(*j));
    const Result rx = wait(*x);
    ASSERT_EQ(rx.ids.size(), 80u) << "x must outlast the burst's prefill";
    std::vector<Ev> ev;
    {
      std::lock_guard lk(mu);
      ev = log;
    }
    // The burst's chunks: from its first to its last; x decodes between every two of them.
    size_t first_p = ev.size(), last_p = 0;
    for (size_t i = 0; i < ev.size(); ++i)
      if (ev[i].kind == 'P' && ev[i].job != 9000) first_p = std::min(first_p, i), last_p = i;
    ASSERT_LT(first_p, last_p);
    int chunks = 0;
    bool x_between = true;
    for (size_t i = first_p + 1; i <= last_p; ++i) {
      if (ev[i].kind != 'P') continue;
      ++chunks;
      bool x_stepped = false;
      for (size_t k = i; k-- > 0 && !(ev[k].kind == 'P');)
        x_stepped |= ev[k].job == 9000 && ev[k].kind == 'D';
      x_between &= x_stepped;
    }
    EXPECT_EQ(chunks + 1, 15);
    EXPECT_TRUE(x_between) << "a running stream waited more than one chunk";
    // A burst stream's decode steps before the burst's last chunk: none with burst_prefill on.
    int early = 0;
    for (size_t i = 0; i < last_p; ++i) early += ev[i].kind == 'D' && ev[i].job != 9000;
    if (burst) {
      EXPECT_EQ(early, 0);
      EXPECT_GT(metric(m, "lilac_burst_held_total"), 0);
    } else {
      EXPECT_GT(early, 0);
      EXPECT_EQ(metric(m, "lilac_burst_held_total"), 0);
    }
    // The same tokens as alone.
    be->on_prefill = nullptr;
    be->on_decode = nullptr;
    for (size_t i = 0; i < burst_jobs.size(); ++i) {
      auto j = std::make_shared<Job>(burst_jobs[i]->req);
      ASSERT_TRUE(sched.submit(j));
      expect_same(wait(*j), got[i], "burst request " + std::to_string(i) + " alone");
    }
  }
}

// A step that fails for one sequence fails that request only, stepped alone or in a batch (decode_batch gives the
// error in its row: TokenChoice::error). In a batch, it failed the whole batch before.
TEST(Scheduler, AFailingStepFailsOnlyItsSequence) {
  for (int batch : {1, 2}) {
    SCOPED_TRACE("batch " + std::to_string(batch));
    auto be = std::make_shared<HookedBackend>();
    be->batch = batch;
    be->on_decode = [](HookedSession& s) {
      if (s.first == 1000) throw Error("device fault");
    };
    SchedulerOptions o;
    o.max_batch = 2;
    o.max_seq = 512;
    Scheduler sched(be, tokenizer(), o);
    auto bad = std::make_shared<Job>(hash_request(1000, 5, 20));
    auto good = std::make_shared<Job>(hash_request(2000, 5, 20));
    auto too_long = std::make_shared<Job>(hash_request(3000, 600, 20));  // does not fit max_seq
    ASSERT_TRUE(sched.submit_all({bad, good, too_long}));
    Result rbad = wait(*bad), rgood = wait(*good), rlong = wait(*too_long);
    EXPECT_EQ(rbad.error, 500);
    EXPECT_NE(rbad.message.find("device fault"), std::string::npos);
    EXPECT_EQ(rgood.error, 0) << rgood.message;
    EXPECT_EQ(rgood.ids.size(), 20u);
    EXPECT_EQ(rlong.error, 400);
    EXPECT_EQ(sched.in_use(), 0);
    EXPECT_EQ(sched.depth(), 0);
  }
}

TEST(Scheduler, PoolSize) {
  auto be = cpu_backend("tiny2");
  SchedulerOptions o;
  o.max_seq = 1000;
  EXPECT_EQ(Scheduler::pool_size(*be, o), be->default_sessions(1000));
  EXPECT_EQ(be->default_sessions(1000), 4);
  EXPECT_EQ(be->default_sessions(int64_t(1) << 40), 1);  // far more than the RAM holds: one session
  o.max_batch = 7;
  EXPECT_EQ(Scheduler::pool_size(*be, o), 7);
  const size_t per = be->session_bytes(1000);
  ASSERT_GT(per, 0u);
  EXPECT_GT(be->session_bytes(2000), per);
  o.seq_memory_bytes = 2.5 * double(per);
  EXPECT_EQ(Scheduler::pool_size(*be, o), 2);  // the budget caps --max-batch
  o.max_batch = 0;
  EXPECT_EQ(Scheduler::pool_size(*be, o), 2);
  o.seq_memory_bytes = 0.5 * double(per);
  EXPECT_THROW(Scheduler::pool_size(*be, o), InputError);
  // A backend that does not report its session size: the budget is ignored.
  HookedBackend hb;
  o.max_batch = 0;
  EXPECT_EQ(Scheduler::pool_size(hb, o), 1);
  o.max_batch = 3;
  EXPECT_EQ(Scheduler::pool_size(hb, o), 3);
}
