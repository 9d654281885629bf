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
  return out;
}

}  // namespace lilac::server
