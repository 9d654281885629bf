#include "server/metrics.h"

#include <cstdio>

namespace lilac::server {

void Metrics::count_request(const std::string& endpoint, int status) {
  std::lock_guard lk(mu_);
  ++requests_[{endpoint, status}];
}

void Metrics::add_generation(int64_t prompt_tokens, int64_t cached_tokens, int64_t completion_tokens,
                             double prefill_seconds, double decode_seconds, bool cache_hit) {
  std::lock_guard lk(mu_);
  ++generations_;
  prompt_tokens_ += prompt_tokens;
  cached_tokens_ += cached_tokens;
  completion_tokens_ += completion_tokens;
  int64_t computed = prompt_tokens - cached_tokens;
  prefilled_tokens_ += computed;
  prefill_seconds_ += prefill_seconds;
  decode_seconds_ += decode_seconds;
  if (prefill_seconds > 0 && computed > 0) last_prefill_tps_ = double(computed) / prefill_seconds;
  // The first token comes from the prefill's logits; decode steps made the others.
  if (decode_seconds > 0 && completion_tokens > 1) last_decode_tps_ = double(completion_tokens - 1) / decode_seconds;
  (cache_hit ? cache_hits_ : cache_misses_)++;
}

void Metrics::add_speculation(int64_t steps, int64_t rounds, int64_t drafted, int64_t accepted) {
  std::lock_guard lk(mu_);
  spec_steps_ += steps;
  spec_rounds_ += rounds;
  spec_drafted_ += drafted;
  spec_accepted_ += accepted;
}

void Metrics::observe_step(int64_t decoded, bool prefilled) {
  if (decoded > 0) batch_size = decoded;
  std::lock_guard lk(mu_);
  if (decoded > 0) {
    size_t b = 0;
    while (b < kBatchBounds.size() && decoded > kBatchBounds[b]) ++b;
    ++batch_hist_[b];
    ++batch_steps_;
    batch_sum_ += decoded;
  }
  if (prefilled) ++prefill_steps_;
  if (prefilled && decoded > 0) ++mixed_steps_;
}

std::string Metrics::render() const {
  std::string out;
  char buf[512];
  auto line = [&](const char* fmt, auto... args) {
    std::snprintf(buf, sizeof buf, fmt, args...);
    out += buf;
  };
  std::lock_guard lk(mu_);
  out += "# HELP lilac_requests_total HTTP requests by endpoint and status.\n# TYPE lilac_requests_total counter\n";
  for (auto& [k, v] : requests_)
    line("lilac_requests_total{endpoint=\"%s\",status=\"%d\"} %lld\n", k.first.c_str(), k.second, (long long)v);
  out += "# HELP lilac_generations_total Generations run by the engine.\n# TYPE lilac_generations_total counter\n";
  line("lilac_generations_total %lld\n", (long long)generations_);
  out += "# HELP lilac_prompt_tokens_total Prompt tokens of all generations.\n# TYPE lilac_prompt_tokens_total counter\n";
  line("lilac_prompt_tokens_total %lld\n", (long long)prompt_tokens_);
  out += "# HELP lilac_prompt_tokens_cached_total Prompt tokens restored from the prefix cache (not recomputed).\n# TYPE lilac_prompt_tokens_cached_total counter\n";
  line("lilac_prompt_tokens_cached_total %lld\n", (long long)cached_tokens_);
  out += "# HELP lilac_generated_tokens_total Tokens generated.\n# TYPE lilac_generated_tokens_total counter\n";
  line("lilac_generated_tokens_total %lld\n", (long long)completion_tokens_);
  out += "# HELP lilac_prefill_seconds_total Time spent in prefill.\n# TYPE lilac_prefill_seconds_total counter\n";
  line("lilac_prefill_seconds_total %.6f\n", prefill_seconds_);
  out += "# HELP lilac_decode_seconds_total Time spent decoding.\n# TYPE lilac_decode_seconds_total counter\n";
  line("lilac_decode_seconds_total %.6f\n", decode_seconds_);
  out += "# HELP lilac_prefill_tokens_per_second Prefill throughput of the last generation.\n# TYPE lilac_prefill_tokens_per_second gauge\n";
  line("lilac_prefill_tokens_per_second %.3f\n", last_prefill_tps_);
  out += "# HELP lilac_decode_tokens_per_second Decode throughput of the last generation.\n# TYPE lilac_decode_tokens_per_second gauge\n";
  line("lilac_decode_tokens_per_second %.3f\n", last_decode_tps_);
  out += "# HELP lilac_queue_depth Generations queued or running.\n# TYPE lilac_queue_depth gauge\n";
  line("lilac_queue_depth %lld\n", (long long)queue_depth.load());
  out += "# HELP lilac_running Generations running now.\n# TYPE lilac_running gauge\n";
  line("lilac_running %lld\n", (long long)running.load());
  out += "# HELP lilac_sequence_pool_capacity Sessions in the pool (generations that can run at once).\n# TYPE lilac_sequence_pool_capacity gauge\n";
  line("lilac_sequence_pool_capacity %lld\n", (long long)pool_capacity.load());
  out += "# HELP lilac_sequence_pool_in_use Sessions of the pool running a generation.\n# TYPE lilac_sequence_pool_in_use gauge\n";
  line("lilac_sequence_pool_in_use %lld\n", (long long)running.load());
  out += "# HELP lilac_batch_size Sequences in the last batched decode step.\n# TYPE lilac_batch_size gauge\n";
  line("lilac_batch_size %lld\n", (long long)batch_size.load());
  out += "# HELP lilac_decode_batch_size Sequences per batched decode step.\n# TYPE lilac_decode_batch_size histogram\n";
  {
    int64_t cum = 0;
    for (size_t b = 0; b < kBatchBounds.size(); ++b) {
      cum += batch_hist_[b];
      line("lilac_decode_batch_size_bucket{le=\"%lld\"} %lld\n", (long long)kBatchBounds[b], (long long)cum);
    }
    cum += batch_hist_[kBatchBounds.size()];
    line("lilac_decode_batch_size_bucket{le=\"+Inf\"} %lld\n", (long long)cum);
    line("lilac_decode_batch_size_sum %lld\n", (long long)batch_sum_);
    line("lilac_decode_batch_size_count %lld\n", (long long)batch_steps_);
  }
  out += "# HELP lilac_decode_steps_total Batched decode steps run.\n# TYPE lilac_decode_steps_total counter\n";
  line("lilac_decode_steps_total %lld\n", (long long)batch_steps_);
  out += "# HELP lilac_prefill_chunks_total Prefill steps run (at most --prefill-chunk prompt tokens each).\n# TYPE lilac_prefill_chunks_total counter\n";
  line("lilac_prefill_chunks_total %lld\n", (long long)prefill_steps_);
  out += "# HELP lilac_mixed_steps_total Scheduler iterations that ran a prefill chunk and a decode step.\n# TYPE lilac_mixed_steps_total counter\n";
  line("lilac_mixed_steps_total %lld\n", (long long)mixed_steps_);
  out += "# HELP lilac_cancelled_total Generations stopped because the client went away.\n# TYPE lilac_cancelled_total counter\n";
  line("lilac_cancelled_total %lld\n", (long long)cancelled.load());
  out += "# HELP lilac_prefix_cache_hits_total Generations that resumed from a cached prefix.\n# TYPE lilac_prefix_cache_hits_total counter\n";
  line("lilac_prefix_cache_hits_total %lld\n", (long long)cache_hits_);
  out += "# HELP lilac_prefix_cache_misses_total Generations that prefilled from scratch.\n# TYPE lilac_prefix_cache_misses_total counter\n";
  line("lilac_prefix_cache_misses_total %lld\n", (long long)cache_misses_);
  out += "# HELP lilac_prefix_cache_entries Snapshots held by the prefix cache.\n# TYPE lilac_prefix_cache_entries gauge\n";
  line("lilac_prefix_cache_entries %lld\n", (long long)cache_entries.load());
  out += "# HELP lilac_prefix_cache_bytes Memory held by the prefix cache.\n# TYPE lilac_prefix_cache_bytes gauge\n";
  line("lilac_prefix_cache_bytes %lld\n", (long long)cache_bytes.load());
  out += "# HELP lilac_spec_decode_steps_total Decode steps of generations with speculative decoding on.\n# TYPE lilac_spec_decode_steps_total counter\n";
  line("lilac_spec_decode_steps_total %lld\n", (long long)spec_steps_);
  out += "# HELP lilac_spec_rounds_total Speculative steps (the draft policy chose drafts: verified in one multi-row step).\n# TYPE lilac_spec_rounds_total counter\n";
  line("lilac_spec_rounds_total %lld\n", (long long)spec_rounds_);
  out += "# HELP lilac_spec_drafts_total MTP drafts verified.\n# TYPE lilac_spec_drafts_total counter\n";
  line("lilac_spec_drafts_total %lld\n", (long long)spec_drafted_);
  out += "# HELP lilac_spec_drafts_accepted_total MTP drafts accepted.\n# TYPE lilac_spec_drafts_accepted_total counter\n";
  line("lilac_spec_drafts_accepted_total %lld\n", (long long)spec_accepted_);
  out += "# HELP lilac_spec_drafts_per_round Mean drafts per speculative step (the adaptive policy's depth).\n# TYPE lilac_spec_drafts_per_round gauge\n";
  line("lilac_spec_drafts_per_round %.3f\n", spec_rounds_ ? double(spec_drafted_) / double(spec_rounds_) : 0.0);
  out += "# HELP lilac_spec_drafts_per_step Mean drafts per decode step of speculating generations (plain steps count 0).\n# TYPE lilac_spec_drafts_per_step gauge\n";
  line("lilac_spec_drafts_per_step %.3f\n", spec_steps_ ? double(spec_drafted_) / double(spec_steps_) : 0.0);
  return out;
}

}  // namespace lilac::server
