// Speculative decoding under continuous batching (server::SchedulerOptions::spec_tokens, spec_max_batch), for
// any backend with tiny-mtp (tests/server/test_scheduler_spec.cpp: the CPU reference; tests/cuda: CUDA):
// streams served together give token for token (and logprob for logprob) what each gives alone without
// speculation (greedy and seeded sampling); while more sequences decode than spec_max_batch none drafts
// (they all take the batched step, which keeps their MTP heads fed), and a stream drafts again once the
// others have finished. Drafts are injected (the random head is almost never right): the stream's own
// plain continuation with an error at a place that moves every round, so acceptance lengths 0..K all happen.
#pragma once
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <regex>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "server/metrics.h"
#include "server/scheduler.h"
#include "support/fixtures.h"
#include "support/jobs.h"
#include "text/tokenizer.h"

namespace lilac::testutil::schedspec {

using namespace lilac::server;

inline std::shared_ptr<const Tokenizer> tokenizer() { return qwen3_tokenizer(); }
using Result = JobResult;
inline Result wait(Job& j) { return wait_job(j); }

inline void expect_same(const Result& a, const Result& b, const std::string& where) {
  EXPECT_EQ(a.error, b.error) << where;
  EXPECT_EQ(a.ids, b.ids) << where;
  ASSERT_EQ(a.choices.size(), b.choices.size()) << where;
  for (size_t i = 0; i < a.choices.size(); ++i)
    EXPECT_EQ(0, std::memcmp(&a.choices[i].logprob, &b.choices[i].logprob, sizeof(float))) << where << " token " << i;
  EXPECT_EQ(a.text, b.text) << where;
  EXPECT_EQ(a.stats.finish, b.stats.finish) << where;
  EXPECT_EQ(a.stats.completion_tokens, b.stats.completion_tokens) << where;
}

inline int64_t metric(const Metrics& m, const std::string& name) {
  std::smatch mt;
  const std::string text = m.render();
  if (!std::regex_search(text, mt, std::regex("\n" + name + R"( ([0-9.]+)\n)"))) ADD_FAILURE() << "no metric " << name;
  return mt.empty() ? -1 : std::stoll(mt[1]);
}

// Three streams: a long greedy one, a short seeded-sampling one with logprobs, a middle greedy one.
inline std::vector<GenerationRequest> requests(int64_t vocab) {
  std::vector<GenerationRequest> rs;
  const int64_t lens[] = {17, 9, 26};
  const int64_t max_tokens[] = {64, 12, 22};
  for (int i = 0; i < 3; ++i) {
    GenerationRequest r;
    r.prompt = random_tokens(lens[i], vocab, 500 + uint32_t(i));
    r.max_tokens = max_tokens[i];
    r.sampling.logprobs = true;
    if (i == 1) {
      r.sampling.temperature = 0.8f;
      r.sampling.seed = 91;
      r.sampling.presence_penalty = 0.3f;
    }
    r.use_cache = false;
    rs.push_back(std::move(r));
  }
  return rs;
}

// Each request alone without speculation.
inline std::vector<Result> run_alone(std::shared_ptr<Backend> be, const std::vector<GenerationRequest>& reqs) {
  SchedulerOptions o;
  o.max_seq = 128;
  return run_one_by_one(std::move(be), reqs, o);
}

// What the injected drafts saw, per stream: the pending index of each draft call and the acceptance length
// each call planned (its error's place, or k when all its drafts are right).
struct Drafted {
  std::mutex mu;
  std::map<size_t, std::vector<int64_t>> at;
  std::map<size_t, std::vector<int>> planned;
};

// The hook of stream i (found by its prompt): its plain continuation `truth`, wrong at place round % (K + 2).
inline std::function<DraftHook(const GenerationRequest&)> hooks(const std::vector<GenerationRequest>& reqs,
                                                         const std::vector<Result>& truth, int K,
                                                         std::shared_ptr<Drafted> seen) {
  return [=](const GenerationRequest& r) -> DraftHook {
    size_t i = 0;
    while (i < reqs.size() && reqs[i].prompt != r.prompt) ++i;
    if (i == reqs.size()) return {};
    auto round = std::make_shared<int>(0);
    const std::vector<int32_t> t = truth[i].ids;
    return [=](int64_t pending, int k, std::vector<int32_t>& drafts) {
      drafts.clear();
      for (int j = 0; j < k; ++j) {
        const size_t at = size_t(pending + 1 + j);
        drafts.push_back(at < t.size() ? t[at] : 0);
      }
      const int e = (*round)++ % (K + 2);
      if (e < k) drafts[size_t(e)] = (drafts[size_t(e)] + 3) % 1000;
      std::lock_guard lk(seen->mu);
      seen->at[i].push_back(pending);
      seen->planned[i].push_back(std::min(e, k));
    };
  };
}

struct Batched {
  std::vector<Result> results;
  std::shared_ptr<Drafted> seen = std::make_shared<Drafted>();
  int64_t suppressed_metric = 0, rounds_metric = 0;
};

inline Batched run_batched(std::shared_ptr<Backend> be, const std::vector<GenerationRequest>& reqs,
                    const std::vector<Result>& truth, int K, int spec_max_batch, SpecPolicyKind policy) {
  Batched b;
  Metrics m;
  SchedulerOptions o;
  o.max_batch = 3;
  o.max_seq = 128;
  o.spec_tokens = K;
  o.spec_policy = policy;
  o.spec_max_batch = spec_max_batch;
  o.draft_hook = hooks(reqs, truth, K, b.seen);
  {
    Scheduler s(be, tokenizer(), o, &m);
    std::vector<std::shared_ptr<Job>> jobs;
    for (auto r : reqs) {
      r.draft_tokens = K;  // what the server's generation core sets from spec_tokens
      r.spec_policy = policy;
      jobs.push_back(std::make_shared<Job>(r));
    }
    EXPECT_TRUE(s.submit_all(jobs));  // admitted together: the scheduler's steps are deterministic
    for (auto& j : jobs) b.results.push_back(wait(*j));
  }
  b.suppressed_metric = metric(m, "lilac_spec_suppressed_steps_total");
  b.rounds_metric = metric(m, "lilac_spec_rounds_total");
  return b;
}

// spec_max_batch 1 (the default): while two or three streams decode, none drafts; the long stream drafts
// when it decodes alone (its first step, before the others finished their prefill, and after they end), at
// every acceptance length (fixed policy); every stream's tokens and logprobs are its own plain ones.
inline void expect_suppressed_above_spec_max_batch_and_resumed(std::shared_ptr<Backend> be) {
  const auto reqs = requests(be->config().vocab_size);
  const auto alone = run_alone(be, reqs);
  ASSERT_EQ(alone[0].ids.size(), 64u);
  ASSERT_EQ(alone[2].ids.size(), 22u);
  const int K = 3;
  for (auto policy : {SpecPolicyKind::Fixed, SpecPolicyKind::Adaptive}) {
    const std::string p = spec_policy_name(policy);
    const Batched b = run_batched(be, reqs, alone, K, kDefaultSpecMaxBatch, policy);
    for (size_t i = 0; i < reqs.size(); ++i) expect_same(b.results[i], alone[i], p + " stream " + std::to_string(i));
    const GenerationStats& a = b.results[0].stats;
    // the short streams never decode alone: no drafts, steps suppressed
    for (size_t i : {size_t(1), size_t(2)}) {
      EXPECT_EQ(b.results[i].stats.spec_rounds, 0) << p << " stream " << i;
      EXPECT_GT(b.results[i].stats.spec_suppressed, 0) << p << " stream " << i;
      EXPECT_EQ(b.seen->at.count(i), 0u) << p << " stream " << i << " drafted";
    }
    // the long stream: suppressed while the others decode, drafting after they finished (stream 2 ends
    // after 22 tokens of its own, so stream 0 is past its index 20 by then), every acceptance length
    EXPECT_GT(a.spec_suppressed, 10) << p;
    ASSERT_EQ(b.seen->at.count(0), 1u) << p << ": the long stream never drafted";
    const auto& at = b.seen->at.at(0);
    int late = 0;
    for (int64_t i : at) {
      EXPECT_TRUE(i <= 1 || i >= 20) << p << ": drafted at " << i << " while the others were decoding";
      late += i >= 20;
    }
    EXPECT_EQ(a.spec_rounds, int64_t(at.size())) << p;
    // (the adaptive policy times the CPU reference's steps, where drafting does not pay: how often it
    // probes after the others end depends on those times, so only the fixed policy's rounds are counted)
    if (policy == SpecPolicyKind::Fixed) {
      EXPECT_GE(late, 5) << p;
      std::vector<int> lengths(K + 1, 0);
      for (int e : b.seen->planned.at(0)) lengths[size_t(e)]++;
      for (int n = 0; n <= K; ++n) EXPECT_GT(lengths[size_t(n)], 0) << "acceptance length " << n;
      EXPECT_EQ(a.spec_accepted, std::accumulate(b.seen->planned.at(0).begin(), b.seen->planned.at(0).end(), 0));
    }
    // /metrics: the suppressed steps of all streams, the rounds of the long one
    EXPECT_EQ(b.suppressed_metric,
              a.spec_suppressed + b.results[1].stats.spec_suppressed + b.results[2].stats.spec_suppressed)
        << p;
    EXPECT_EQ(b.rounds_metric, a.spec_rounds) << p;
  }
}

// spec_max_batch 3: every stream's policy decides as when alone; all three draft (each verifies on its own),
// none is suppressed, and the tokens are still each stream's plain ones.
inline void expect_every_stream_drafts_at_or_below_spec_max_batch(std::shared_ptr<Backend> be) {
  const auto reqs = requests(be->config().vocab_size);
  const auto alone = run_alone(be, reqs);
  const Batched b = run_batched(be, reqs, alone, 3, 3, SpecPolicyKind::Fixed);
  for (size_t i = 0; i < reqs.size(); ++i) {
    expect_same(b.results[i], alone[i], "stream " + std::to_string(i));
    EXPECT_EQ(b.results[i].stats.spec_suppressed, 0) << i;
    EXPECT_GT(b.results[i].stats.spec_rounds, 0) << i;
    EXPECT_GT(b.results[i].stats.spec_accepted, 0) << i;
  }
  EXPECT_EQ(b.suppressed_metric, 0);
}

}  // namespace lilac::testutil::schedspec
