#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/error.h"

namespace lilac {

int32_t argmax(std::span<const float> x) {
  int32_t best = -1;
  for (size_t i = 0; i < x.size(); ++i)
    if (!std::isnan(x[i]) && (best < 0 || x[i] > x[size_t(best)])) best = int32_t(i);
  return best;
}

namespace {

double log_sum_exp(std::span<const float> x) {
  float mx = -std::numeric_limits<float>::infinity();
  for (float v : x) mx = std::max(mx, v);
  double s = 0;
  for (float v : x) s += std::exp(double(v) - double(mx));
  return double(mx) + std::log(s);
}

// Indices sorted by descending value, ties to the lower index; only the first n are ordered.
std::vector<int32_t> top_indices(std::span<const float> x, size_t n) {
  std::vector<int32_t> idx(x.size());
  std::iota(idx.begin(), idx.end(), 0);
  n = std::min(n, idx.size());
  auto cmp = [&](int32_t a, int32_t b) { return x[size_t(a)] > x[size_t(b)] || (x[size_t(a)] == x[size_t(b)] && a < b); };
  std::partial_sort(idx.begin(), idx.begin() + ptrdiff_t(n), idx.end(), cmp);
  idx.resize(n);
  return idx;
}

// top_indices' first n for n far below the size, in one pass: a small sorted array (ids arrive in increasing order,
// so a value equal to one already kept goes after it: ties to the lower id). No index array of the vocabulary.
std::vector<int32_t> largest(std::span<const float> x, int n) {
  const size_t k = size_t(std::clamp(n, 0, int(x.size())));
  std::vector<int32_t> best;
  best.reserve(k + 1);
  for (size_t i = 0; i < x.size() && k > 0; ++i) {
    const float v = x[i];
    if (best.size() == k && !(v > x[size_t(best.back())])) continue;
    size_t at = best.size();
    while (at > 0 && v > x[size_t(best[at - 1])]) --at;
    best.insert(best.begin() + ptrdiff_t(at), int32_t(i));
    if (best.size() > k) best.pop_back();
  }
  return best;
}

// The n most likely with their logprobs, log_sum_exp(logits) given.
std::vector<TokenLogprob> top_with(std::span<const float> logits, int n, double lse) {
  std::vector<TokenLogprob> out;
  for (int32_t id : largest(logits, n)) out.push_back({id, float(double(logits[size_t(id)]) - lse)});
  return out;
}

}  // namespace

float token_logprob(std::span<const float> logits, int32_t token) {
  return float(double(logits[size_t(token)]) - log_sum_exp(logits));
}

std::vector<TokenLogprob> top_logprobs(std::span<const float> logits, int n) {
  if (n <= 0) return {};
  return top_with(logits, n, log_sum_exp(logits));
}

TokenChoice score_token(std::span<const float> logits, int32_t token, int n) {
  const double lse = log_sum_exp(logits);
  TokenChoice c;
  c.token = token;
  c.logprob = float(double(logits[size_t(token)]) - lse);
  c.top = top_with(logits, n, lse);
  return c;
}

void apply_penalties(std::span<float> logits, const SamplingParams& p, std::span<const int32_t> seen,
                     const std::unordered_map<int32_t, int>& counts) {
  if (p.repetition_penalty != 1.f) {
    for (int32_t t : seen) {
      float& l = logits[size_t(t)];
      l = l > 0 ? l / p.repetition_penalty : l * p.repetition_penalty;
    }
  }
  if (p.presence_penalty != 0.f || p.frequency_penalty != 0.f) {
    for (const auto& [t, c] : counts)
      logits[size_t(t)] -= p.presence_penalty * (c > 0 ? 1.f : 0.f) + p.frequency_penalty * float(c);
  }
}

std::vector<Candidate> truncated_distribution(std::span<const float> logits, const SamplingParams& p) {
  const float inv_t = 1.f / p.temperature;
  const size_t V = logits.size();
  // top-k: the k largest (all when off), ordered.
  const size_t k = p.top_k > 0 ? std::min<size_t>(size_t(p.top_k), V) : V;
  std::vector<int32_t> idx = top_indices(logits, k);
  // Masked tokens (-inf) are never kept; when every logit is -inf the first id stands alone.
  while (idx.size() > 1 && std::isinf(logits[size_t(idx.back())]) && logits[size_t(idx.back())] < 0) idx.pop_back();
  if (std::isinf(logits[size_t(idx[0])]) && logits[size_t(idx[0])] < 0) return {{idx[0], 1.f}};
  // Probabilities of the kept set under temperature (softmax over the kept logits only: the
  // normalisation cancels out of top-p / min-p comparisons within the set after top-k, as in HF).
  std::vector<double> pr(idx.size());
  const double mx = double(logits[size_t(idx[0])]) * inv_t;
  double sum = 0;
  for (size_t i = 0; i < idx.size(); ++i) sum += (pr[i] = std::exp(double(logits[size_t(idx[i])]) * inv_t - mx));
  for (double& v : pr) v /= sum;
  size_t keep = idx.size();
  if (p.top_p < 1.f) {
    double cum = 0;
    for (size_t i = 0; i < idx.size(); ++i) {
      cum += pr[i];
      if (cum >= double(p.top_p)) {
        keep = i + 1;
        break;
      }
    }
  }
  if (p.min_p > 0.f) {
    const double thr = double(p.min_p) * pr[0];
    size_t i = 1;
    while (i < keep && pr[i] >= thr) ++i;
    keep = i;
  }
  double kept = 0;
  for (size_t i = 0; i < keep; ++i) kept += pr[i];
  std::vector<Candidate> out(keep);
  for (size_t i = 0; i < keep; ++i) out[i] = {idx[i], float(pr[i] / kept)};
  return out;
}

void HostSampler::begin(const SamplingParams& params, std::span<const int32_t> context) {
  if (!(params.temperature >= 0.f) || !std::isfinite(params.temperature))
    throw InputError("temperature must be a finite number >= 0");
  if (!(params.top_p > 0.f && params.top_p <= 1.f)) throw InputError("top_p must be in (0, 1]");
  if (params.top_k < 0) throw InputError("top_k must be >= 0");
  if (!(params.min_p >= 0.f && params.min_p <= 1.f)) throw InputError("min_p must be in [0, 1]");
  if (!(params.repetition_penalty > 0.f) || !std::isfinite(params.repetition_penalty))
    throw InputError("repetition_penalty must be > 0");
  if (params.top_logprobs < 0 || params.top_logprobs > 20) throw InputError("top_logprobs must be in [0, 20]");
  check_logit_bias(params, vocab_);
  params_ = effective_sampling(params);
  rng_.seed(params.seed);
  seen_.clear();
  counts_.clear();
  seen_mask_.assign(size_t(vocab_), 0);
  for (int32_t t : context)
    if (t >= 0 && t < vocab_ && !seen_mask_[size_t(t)]) {
      seen_mask_[size_t(t)] = 1;
      seen_.push_back(t);
    }
}

void check_logit_bias(const SamplingParams& p, int64_t vocab) {
  for (const auto& [t, b] : p.logit_bias) {
    if (t < 0 || t >= vocab) throw InputError("logit_bias: token id " + std::to_string(t) + " is outside the vocabulary");
    if (!(b >= -100.f && b <= 100.f)) throw InputError("logit_bias: a bias must be in [-100, 100]");
  }
}

InputError no_allowed_token_error() {
  return InputError("sampler: the token constraint allows no token of the vocabulary");
}

Error no_finite_logit_error() {
  return Error("sampler: no allowed token has a finite logit (every one is NaN or -inf: the model's weights or "
               "activations are not finite)");
}

TokenChoice HostSampler::sample(std::span<const float> logits, const uint32_t* allowed) {
  if (int64_t(logits.size()) != vocab_) throw Error("sampler: logits row has the wrong size");
  TokenChoice choice;
  const SamplingParams& p = params_;
  const bool penalise = p.repetition_penalty != 1.f || p.presence_penalty != 0.f || p.frequency_penalty != 0.f;
  std::span<const float> z = logits;
  if (allowed) {
    work_.assign(logits.begin(), logits.end());
    bool any = false;
    for (size_t i = 0; i < work_.size(); ++i) {
      if ((allowed[i >> 5] >> (i & 31)) & 1u)
        any = true;
      else
        work_[i] = -std::numeric_limits<float>::infinity();
    }
    if (!any) throw no_allowed_token_error();
    z = work_;
  }
  if (penalise) {
    if (!allowed) work_.assign(logits.begin(), logits.end());
    apply_penalties(work_, p, seen_, counts_);
    z = work_;
  }
  if (!p.logit_bias.empty()) {  // after the penalties (a masked token's -inf stays -inf)
    if (!allowed && !penalise) work_.assign(logits.begin(), logits.end());
    for (const auto& [t, b] : p.logit_bias) work_[size_t(t)] += b;
    z = work_;
  }
  // The greedy choice; none when no allowed logit is above -inf (masked ids are -inf here, NaNs never win).
  const int32_t top = argmax(z);
  if (top < 0 || !(z[size_t(top)] > -std::numeric_limits<float>::infinity())) throw no_finite_logit_error();
  if (p.temperature == 0.f) {
    choice.token = top;
  } else {
    // NaN logits are never drawn (as argmax skips them): -inf here, which also keeps the sort's order strict.
    std::vector<float> finite;
    if (std::any_of(z.begin(), z.end(), [](float v) { return std::isnan(v); })) {
      finite.assign(z.begin(), z.end());
      for (float& v : finite)
        if (std::isnan(v)) v = -std::numeric_limits<float>::infinity();
      z = finite;
    }
    std::vector<Candidate> cand = truncated_distribution(z, p);
    // Uniform in [0, 1) from the top 53 bits.
    const double u = double(rng_() >> 11) * (1.0 / 9007199254740992.0);
    double cum = 0;
    choice.token = cand.back().token;
    for (const Candidate& c : cand) {
      cum += c.prob;
      if (u < cum) {
        choice.token = c.token;
        break;
      }
    }
  }
  if (p.logprobs || p.top_logprobs > 0) {  // one log-sum-exp for both
    TokenChoice scored = score_token(logits, choice.token, p.top_logprobs);
    choice.logprob = scored.logprob;
    choice.top = std::move(scored.top);
  }
  // Record as generated.
  if (int64_t(seen_mask_.size()) != vocab_) seen_mask_.assign(static_cast<size_t>(vocab_), 0);  // no begin() yet
  counts_[choice.token]++;
  if (choice.token >= 0 && choice.token < vocab_ && !seen_mask_[size_t(choice.token)]) {
    seen_mask_[size_t(choice.token)] = 1;
    seen_.push_back(choice.token);
  }
  return choice;
}

}  // namespace lilac
