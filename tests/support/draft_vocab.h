// Session::set_draft_vocab on a backend whose sessions draft with the MTP head (the CPU and CUDA tests): with the
// draft vocabulary cut below the head's own first draft, every draft lies below the cut; the first draft is the
// argmax, over the ids below the cut, of the row the sink receives (whole rows: the head computes the whole
// vocabulary while a sink is set); the drafts equal those of that session, whose head computed whole rows; and
// speculative decoding with the cut head's drafts gives plain greedy decoding's tokens; and the backend's setting
// (Backend::set_draft_vocab) reaches the sessions it creates afterwards.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "engine/backend.h"
#include "engine/sampler.h"
#include "support/spec_stretch.h"

namespace lilac::testutil {

// 24 tokens after `prompt`; the sessions' capacity is prompt + 40.
inline void expect_draft_vocab_cut(Backend& be, const std::vector<int32_t>& prompt) {
  const int64_t V = be.config().vocab_size, max_len = int64_t(prompt.size()) + 40;
  const std::vector<int32_t> truth = plain_greedy_tokens(be, prompt, 24, max_len);
  auto start = [&](int64_t n, LogitsSink sink) {
    auto s = be.new_session(max_len);
    if (sink) s->set_draft_logits_sink(std::move(sink));
    if (n > 0) s->set_draft_vocab(n);  // else the backend's setting
    s->enable_drafting(true);
    s->prefill(prompt);
    s->begin_generation(SamplingParams{}, prompt);
    EXPECT_EQ(s->sample().token, truth[0]);
    return s;
  };
  const std::vector<int32_t> whole = start(0, {})->draft(3);
  ASSERT_EQ(whole.size(), 3u);
  const int64_t n = whole[0] > 0 ? whole[0] : V / 2;  // the head's own first choice is cut off
  SCOPED_TRACE("draft vocabulary " + std::to_string(n) + " of " + std::to_string(V));
  std::vector<float> last;  // the sink's last row: the first draft row's logits
  auto sunk = start(n, [&](int64_t, int64_t rows, const float* lg) {
    last.assign(lg + (rows - 1) * V, lg + rows * V);
  });
  auto cut = start(n, {});
  const std::vector<int32_t> ds = sunk->draft(3), dc = cut->draft(3);
  ASSERT_EQ(dc.size(), 3u);
  for (int32_t t : dc) EXPECT_TRUE(t >= 0 && t < n) << t;
  EXPECT_EQ(dc, ds) << "drafts from the cut head's rows differ from those of whole rows";
  ASSERT_EQ(int64_t(last.size()), V);
  EXPECT_EQ(ds[0], argmax(std::span<const float>(last.data(), static_cast<size_t>(n))));
  // Lossless: verify the cut head's drafts round after round.
  std::vector<int32_t> got{truth[0]}, drafts = dc;
  while (got.size() < truth.size()) {
    for (const TokenChoice& c : cut->verify(drafts)) got.push_back(c.token);
    const int k = int(std::min<size_t>(3, truth.size() - std::min(truth.size(), got.size() + 1)));
    drafts = k > 0 ? cut->draft(k) : std::vector<int32_t>{};
    for (int32_t t : drafts) EXPECT_TRUE(t >= 0 && t < n) << t;
  }
  got.resize(truth.size());
  EXPECT_EQ(got, truth);
  be.set_draft_vocab(3);
  const std::vector<int32_t> d = start(0, {})->draft(3);
  be.set_draft_vocab(0);
  ASSERT_FALSE(d.empty());
  for (int32_t t : d) EXPECT_TRUE(t >= 0 && t < 3) << t;
}

}  // namespace lilac::testutil
