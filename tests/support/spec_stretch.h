// Long plain stretches under the adaptive draft policy, at the session level (what Sequence::decode_alone
// does: SpecPolicy::choose, speculative_step, on_round / on_plain), for the CPU and CUDA tests of the MTP
// head: drafts are injected wrong before `easy_from` (the policy decodes plainly, probing at gaps up to 256
// steps: longer than the CPU head's 64-row passes and the CUDA head's 128-row ring) and right from there
// (it drafts again). Next to it, a session whose head drafts at every step. The tests check that the
// tokens are plain decoding's and that after every stretch the head drafts exactly what the head that
// drafted at every step drafts at the same place.
#pragma once
#include <algorithm>
#include <cstdint>
#include <map>
#include <vector>

#include <gtest/gtest.h>

#include "engine/backend.h"
#include "engine/spec_policy.h"
#include "engine/speculative.h"

namespace lilac::testutil {

struct StretchRun {
  std::vector<int32_t> tokens;                   // the adaptive run's output (first choice included)
  std::map<int64_t, int> asked;                  // pending index -> drafts asked
  std::map<int64_t, std::vector<int32_t>> head;  // pending index -> the head's drafts (adaptive run)
  std::map<int64_t, std::vector<int32_t>> every; // pending index -> the head's drafts, drafting every step
  int64_t longest_plain = 0;                     // the longest run of plain steps
  int64_t rounds_after_easy = 0;                 // rounds at pending index >= easy_from
};

// Plain greedy decoding after `prompt`: n tokens, the first from sample(), in a session of capacity max_len.
inline std::vector<int32_t> plain_greedy_tokens(Backend& be, const std::vector<int32_t>& prompt, size_t n,
                                                int64_t max_len) {
  std::vector<int32_t> t;
  auto s = be.new_session(max_len);
  s->prefill(prompt);
  s->begin_generation(SamplingParams{}, prompt);
  t.push_back(s->sample().token);
  while (t.size() < n) t.push_back(s->decode_step().token);
  return t;
}

// `truth`: plain greedy decoding after `prompt` (truth[0] the first choice); the runs produce truth.size()
// tokens with at most K drafts per step.
inline StretchRun run_plain_stretches(Backend& be, const std::vector<int32_t>& prompt,
                                      const std::vector<int32_t>& truth, int64_t easy_from, int K) {
  StretchRun r;
  const int64_t n = int64_t(truth.size()), V = be.config().vocab_size;
  const int64_t max_len = int64_t(prompt.size()) + n + K + 8;
  {
    auto s = be.new_session(max_len);
    s->enable_drafting(true);
    s->prefill(prompt);
    s->begin_generation(SamplingParams{}, prompt);
    s->sample();
    for (int64_t i = 0; i + 1 < n; ++i) {
      r.every[i] = s->draft(2);
      s->decode_step();
    }
  }
  auto s = be.new_session(max_len);
  s->enable_drafting(true);
  s->prefill(prompt);
  s->begin_generation(SamplingParams{}, prompt);
  r.tokens.push_back(s->sample().token);
  SpecPolicy::Options o;
  o.measure = false;
  o.probe_max = 256;
  SpecPolicy pol(o);
  pol.set_cost_hint({0.12, 0.4});
  pol.begin(K, SpecPolicyKind::Adaptive);
  const DraftHook hook = [&](int64_t i, int k, std::vector<int32_t>& d) {
    r.asked[i] = k;
    r.head[i] = d;
    d.clear();
    for (int j = 0; j < k; ++j) {
      const int64_t at = i + 1 + j;
      const int32_t t = truth[size_t(at)];
      d.push_back(at >= easy_from ? t : int32_t((t + 3) % V));
    }
  };
  int64_t plain_run = 0;
  SpecStats stats;
  while (int64_t(r.tokens.size()) < n) {
    const int64_t i = int64_t(r.tokens.size()) - 1;  // the pending token's index
    const int k = int(std::min<int64_t>(pol.choose(), n - 2 - i));
    SpecRound round;
    for (const TokenChoice& c : speculative_step(*s, k, i, {}, hook, stats, &round)) r.tokens.push_back(c.token);
    if (round.drafted > 0) {
      pol.on_round(round.drafted, round.accepted, -1, -1);
      r.longest_plain = std::max(r.longest_plain, plain_run);
      plain_run = 0;
      r.rounds_after_easy += i >= easy_from;
    } else {
      pol.on_plain(-1);
      ++plain_run;
    }
  }
  r.longest_plain = std::max(r.longest_plain, plain_run);
  r.tokens.resize(size_t(n));
  return r;
}

// What both backends' tests check of a run: plain decoding's tokens, long plain stretches, drafting again once
// the drafts are right, and the head drafting after every stretch exactly what the always-drafting head drafts.
inline void expect_head_exact_after_stretches(const StretchRun& r, const std::vector<int32_t>& truth) {
  EXPECT_EQ(r.tokens, truth);
  EXPECT_GE(r.longest_plain, 255);  // probes 4, 8, .. 128, 256 plain steps apart
  EXPECT_GE(r.rounds_after_easy, 10);
  int compared = 0;
  for (const auto& [i, d] : r.head) {
    ASSERT_EQ(int(d.size()), r.asked.at(i)) << "the head stopped drafting at " << i;
    const auto& e = r.every.at(i);
    const size_t m = std::min(e.size(), d.size());
    EXPECT_TRUE(std::equal(d.begin(), d.begin() + long(m), e.begin())) << "head drafts differ at " << i;
    compared += m > 0;
  }
  EXPECT_GE(compared, 15);
}

}  // namespace lilac::testutil
