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

void Metrics::observe_step(int64_t decoded, bool prefilled, int64_t spec_suppressed, int64_t burst_held) {
  if (decoded > 0) batch_size = decoded;
  std::lock_guard lk(mu_);
  spec_suppressed_ += spec_suppressed;
  burst_held_ += burst_held;
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
  // A metric's HELP and TYPE lines, then its one sample (an integer, or a real with `decimals` digits).
  auto head = [&](const char* name, const char* type, const char* help) {
    line("# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
  };
  auto count = [&](const char* name, const char* type, const char* help, int64_t v) {
    head(name, type, help);
    line("%s %lld\n", name, (long long)v);
  };
  auto real = [&](const char* name, const char* type, const char* help, double v, int decimals) {
    head(name, type, help);
    line("%s %.*f\n", name, decimals, v);
  };
  std::lock_guard lk(mu_);
  head("lilac_requests_total", "counter", "HTTP requests by endpoint and status.");
  for (auto& [k, v] : requests_)
    line("lilac_requests_total{endpoint=\"%s\",status=\"%d\"} %lld\n", k.first.c_str(), k.second, (long long)v);
  count("lilac_generations_total", "counter", "Generations run by the engine.", generations_);
  count("lilac_prompt_tokens_total", "counter", "Prompt tokens of all generations.", prompt_tokens_);
  count("lilac_prompt_tokens_cached_total", "counter", "Prompt tokens restored from the prefix cache (not recomputed).", cached_tokens_);
  count("lilac_generated_tokens_total", "counter", "Tokens generated.", completion_tokens_);
  real("lilac_prefill_seconds_total", "counter", "Time spent in prefill.", prefill_seconds_, 6);
  real("lilac_decode_seconds_total", "counter", "Time spent decoding.", decode_seconds_, 6);
  real("lilac_prefill_tokens_per_second", "gauge", "Prefill throughput of the last generation.", last_prefill_tps_, 3);
  real("lilac_decode_tokens_per_second", "gauge", "Decode throughput of the last generation.", last_decode_tps_, 3);
  count("lilac_queue_depth", "gauge", "Generations queued or running.", queue_depth.load());
  count("lilac_running", "gauge", "Generations running now.", running.load());
  count("lilac_sequence_pool_capacity", "gauge", "Sessions in the pool (generations that can run at once).", pool_capacity.load());
  count("lilac_sequence_pool_in_use", "gauge", "Sessions of the pool running a generation.", running.load());
  count("lilac_batch_size", "gauge", "Sequences in the last batched decode step.", batch_size.load());
  head("lilac_decode_batch_size", "histogram", "Sequences per batched decode step.");
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
  count("lilac_decode_steps_total", "counter", "Batched decode steps run.", batch_steps_);
  count("lilac_prefill_chunks_total", "counter", "Prefill steps run (at most --prefill-chunk prompt tokens each).", prefill_steps_);
  count("lilac_mixed_steps_total", "counter", "Scheduler iterations that ran a prefill chunk and a decode step.", mixed_steps_);
  count("lilac_burst_held_total", "counter", "Sequence-iterations in which a sequence whose prefill had ended waited for the prefill of the requests that arrived with it (--burst-prefill).", burst_held_);
  count("lilac_cancelled_total", "counter", "Generations stopped because the client went away.", cancelled.load());
  count("lilac_prefix_cache_hits_total", "counter", "Generations that resumed from a cached prefix.", cache_hits_);
  count("lilac_prefix_cache_misses_total", "counter", "Generations that prefilled from scratch.", cache_misses_);
  count("lilac_prefix_cache_entries", "gauge", "Snapshots held by the prefix cache.", cache_entries.load());
  count("lilac_prefix_cache_bytes", "gauge", "Memory held by the prefix cache.", cache_bytes.load());
  count("lilac_spec_decode_steps_total", "counter", "Decode steps of generations with speculative decoding on.", spec_steps_);
  count("lilac_spec_rounds_total", "counter", "Speculative steps (the draft policy chose drafts: verified in one multi-row step).", spec_rounds_);
  count("lilac_spec_drafts_total", "counter", "MTP drafts verified.", spec_drafted_);
  count("lilac_spec_drafts_accepted_total", "counter", "MTP drafts accepted.", spec_accepted_);
  count("lilac_spec_suppressed_steps_total", "counter", "Decode steps of sequences whose draft policy chose drafts, run without them because more sequences were decoding than --spec-max-batch.", spec_suppressed_);
  real("lilac_spec_drafts_per_round", "gauge", "Mean drafts per speculative step (the adaptive policy's depth).", spec_rounds_ ? double(spec_drafted_) / double(spec_rounds_) : 0.0, 3);
  real("lilac_spec_drafts_per_step", "gauge", "Mean drafts per decode step of speculating generations (plain steps count 0).", spec_steps_ ? double(spec_drafted_) / double(spec_steps_) : 0.0, 3);
  return out;
}

}  // namespace lilac::server
