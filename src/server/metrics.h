// Server counters, exported as Prometheus text by GET /metrics.
#pragma once
#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

namespace lilac::server {

struct Metrics {
  void count_request(const std::string& endpoint, int status);
  void add_generation(int64_t prompt_tokens, int64_t cached_tokens, int64_t completion_tokens,
                      double prefill_seconds, double decode_seconds, bool cache_hit);

  // Speculative decoding of one finished generation (GenerationStats): its decode steps, the steps with
  // drafts (rounds), drafts verified and accepted.
  void add_speculation(int64_t steps, int64_t rounds, int64_t drafted, int64_t accepted);

  // One scheduler iteration: `decoded` sequences in its batched decode step (0: no decode step),
  // `prefilled`: whether it ran a prefill step, `spec_suppressed`: sequences whose draft policy chose
  // drafts but that stepped without them (more sequences decoding than --spec-max-batch).
  // burst_held: sequences that waited this iteration for their burst's prefill (SchedulerOptions::burst_prefill).
  void observe_step(int64_t decoded, bool prefilled, int64_t spec_suppressed = 0, int64_t burst_held = 0);

  std::atomic<int64_t> queue_depth{0};  // queued + running generations
  std::atomic<int64_t> running{0};      // generations in the session pool (in use)
  std::atomic<int64_t> pool_capacity{0};  // sessions in the pool
  std::atomic<int64_t> batch_size{0};   // sequences in the last decode step
  std::atomic<int64_t> cancelled{0};
  std::atomic<int64_t> cache_entries{0}, cache_bytes{0};

  // Prometheus exposition text.
  std::string render() const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, int64_t> requests_;
  int64_t prompt_tokens_ = 0, cached_tokens_ = 0, completion_tokens_ = 0;
  int64_t prefilled_tokens_ = 0;  // prompt tokens actually computed
  double prefill_seconds_ = 0, decode_seconds_ = 0;
  double last_prefill_tps_ = 0, last_decode_tps_ = 0;
  int64_t generations_ = 0, cache_hits_ = 0, cache_misses_ = 0;
  // Batch-size histogram (upper bounds 1, 2, 4, ..., 128, then +Inf) and the interleaving counters.
  static constexpr std::array<int64_t, 8> kBatchBounds{1, 2, 4, 8, 16, 32, 64, 128};
  std::array<int64_t, kBatchBounds.size() + 1> batch_hist_{};
  int64_t batch_steps_ = 0, batch_sum_ = 0;
  int64_t prefill_steps_ = 0, mixed_steps_ = 0;
  int64_t spec_steps_ = 0, spec_rounds_ = 0, spec_drafted_ = 0, spec_accepted_ = 0;
  int64_t spec_suppressed_ = 0, burst_held_ = 0;
};

}  // namespace lilac::server
