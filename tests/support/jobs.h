// Scheduler tests' helpers: a job's events collected until it ends (and fixtures.h's Qwen3 tokenizer).
#pragma once
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "server/scheduler.h"
#include "support/fixtures.h"  // qwen3_tokenizer
#include "text/tokenizer.h"

namespace lilac::testutil {

// What a job streamed: its token ids and choices (logprobs included), text, final stats or error.
struct JobResult {
  std::vector<int32_t> ids;
  std::string text;
  std::vector<TokenChoice> choices;
  GenerationStats stats;
  int error = 0;  // the HTTP status of an Error event
  std::string message;
};

inline JobResult wait_job(server::Job& j) {
  JobResult r;
  for (;;) {
    std::vector<server::JobEvent> evs;
    j.pop_all(evs, std::chrono::milliseconds(1000));
    for (auto& e : evs) {
      if (e.kind == server::JobEvent::Token) {
        if (e.token.id >= 0) {
          r.ids.push_back(e.token.id);
          r.choices.push_back(e.token.choice);
        }
        r.text += e.token.text;
      } else if (e.kind == server::JobEvent::Done) {
        r.stats = e.stats;
        return r;
      } else {
        r.error = e.status;
        r.message = e.message;
        return r;
      }
    }
  }
}

// Each request served alone (a scheduler with one session, o's other options), one after the other.
inline std::vector<JobResult> run_one_by_one(std::shared_ptr<Backend> be, const std::vector<GenerationRequest>& reqs,
                                             server::SchedulerOptions o) {
  o.max_batch = 1;
  server::Scheduler s(std::move(be), qwen3_tokenizer(), o);
  std::vector<JobResult> out;
  for (const auto& r : reqs) {
    auto j = std::make_shared<server::Job>(r);
    EXPECT_TRUE(s.submit(j));
    out.push_back(wait_job(*j));
  }
  return out;
}

}  // namespace lilac::testutil
