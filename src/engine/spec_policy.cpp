#include "engine/spec_policy.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"

namespace lilac {

const char* spec_policy_name(SpecPolicyKind k) { return k == SpecPolicyKind::Fixed ? "fixed" : "adaptive"; }

SpecPolicyKind parse_spec_policy(std::string_view s, const char* what) {
  if (s == "adaptive") return SpecPolicyKind::Adaptive;
  if (s == "fixed") return SpecPolicyKind::Fixed;
  throw InputError(std::string(what) + ": '" + std::string(s) + "' is not a policy (adaptive or fixed)");
}

SpecPolicy::SpecPolicy() : SpecPolicy(Options{}) {}

SpecPolicy::SpecPolicy(Options o) : o_(o) {
  clock_ = [] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  };
  begin(0, SpecPolicyKind::Adaptive);
}

void SpecPolicy::begin(int k_max, SpecPolicyKind kind) {
  k_max_ = std::max(0, k_max);
  kind_ = kind;
  wins_ = o_.prior_accept * o_.prior_weight;
  tries_ = o_.prior_weight;
  plain_run_ = round_run_ = 0;
  head_behind_ = false;
  probe_gap_ = std::max(1, o_.probe_min);
  grow(k_max_ + 1);
}

void SpecPolicy::grow(int rows) {
  const size_t n = size_t(std::max(rows, 1)) + 1;
  if (verify_.size() >= n) return;
  verify_.resize(n, 0.0);
  verify_timed_.resize(n, 0);
  verify_seen_.resize(n, 0);
  draft_seen_.resize(n, 0);
}

double SpecPolicy::acceptance() const { return tries_ > 0 ? std::clamp(wins_ / tries_, 0.0, 1.0) : 0.0; }

double SpecPolicy::expected_tokens(int k, double a) {
  double e = 0, p = 1;
  for (int i = 0; i <= k; ++i, p *= a) e += p;
  return e;
}

double SpecPolicy::verify_cost(int rows) const {
  if (timed_ && rows >= 0 && size_t(rows) < verify_timed_.size() && verify_timed_[size_t(rows)] > 0)
    return verify_[size_t(rows)];
  return step_ * prior_verify(rows) * verify_scale_;
}

double SpecPolicy::round_cost(int k) const {
  if (k <= 0) return step_;
  return double(k) * (timed_ ? draft_ : hint_.draft) + verify_cost(k + 1);
}

int SpecPolicy::best_k() const {
  const double a = acceptance();
  int best = 0;
  double best_rate = 1.0 / step_;
  for (int k = 1; k <= k_max_; ++k) {
    const double rate = expected_tokens(k, a) / round_cost(k);
    if (rate > best_rate * (1 + 1e-9)) best = k, best_rate = rate;
  }
  return best;
}

int SpecPolicy::choose() const {
  if (kind_ == SpecPolicyKind::Fixed || k_max_ <= 0) return k_max_;
  const int b = best_k();
  if (b > 0) {
    if (o_.measure && round_run_ >= std::max(1, o_.remeasure_rounds)) return 0;  // time a plain step again
    const size_t rows = size_t(b) + 2;  // a round of b + 1 drafts
    if (o_.measure && b < k_max_ && rows < verify_timed_.size() && verify_timed_[rows] == 0) return b + 1;
    return b;
  }
  if (plain_run_ >= probe_gap_) return std::clamp(o_.probe_k, 1, k_max_);
  return 0;
}

// The first timed observation: `unit_seconds` is what one plain step costs by the prior.
void SpecPolicy::first_time(double unit_seconds) {
  timed_ = true;
  step_ = unit_seconds;
  draft_ = hint_.draft * unit_seconds;
  verify_scale_ = 1;
}

void SpecPolicy::observe(double& est, double seconds) const {
  const double x = std::clamp(seconds, est / 4, est * 1.5);
  est += o_.cost_alpha * (x - est);
}

void SpecPolicy::on_plain(double seconds) {
  ++plain_run_;
  round_run_ = 0;
  if (!o_.measure || !(seconds > 0)) return;
  if (!plain_seen_) {  // the session's first decode step (a CUDA graph capture)
    plain_seen_ = true;
    return;
  }
  if (!timed_) first_time(seconds);
  // The first plain step timed: if the scale came from a draft or a verify (first_time), step_ is that
  // observation over the hint's ratio, and one stall in it (a graph captured inside a timed draft) would make
  // plain steps look dear for as long as drafting then wins (a plain step is re-timed only every
  // remeasure_rounds rounds). A measured step faster than that estimate replaces it; slower ones are averaged
  // with the clamp as always (bursts only ever make a step slower).
  if (!step_timed_) {
    step_timed_ = true;
    if (seconds < step_) {
      step_ = seconds;
      return;
    }
  }
  observe(step_, seconds);
}

void SpecPolicy::on_round(int drafted, int accepted, double draft_seconds, double verify_seconds) {
  if (drafted <= 0) return;
  accepted = std::clamp(accepted, 0, drafted);
  const bool probe = kind_ == SpecPolicyKind::Adaptive && best_k() == 0;
  const bool after_plain = plain_run_ > 0 || head_behind_;
  head_behind_ = false;
  // acceptance
  const int tried = accepted + (accepted < drafted ? 1 : 0);
  wins_ = o_.accept_decay * wins_ + accepted;
  tries_ = o_.accept_decay * tries_ + tried;
  // probes
  if (probe && accepted == 0)
    probe_gap_ = std::min(std::max(1, o_.probe_max), probe_gap_ * 2);
  else
    probe_gap_ = std::max(1, o_.probe_min);
  plain_run_ = 0;
  ++round_run_;
  if (!o_.measure) return;
  // costs
  grow(drafted + 1);
  // draft(): per draft; not after plain or suppressed steps (it caught up with the rows they fed)
  if (draft_seconds > 0 && !after_plain) {
    if (!draft_seen_[size_t(drafted)]) {
      draft_seen_[size_t(drafted)] = 1;
    } else {
      const double per = draft_seconds / drafted;
      if (!timed_) first_time(per / std::max(hint_.draft, 1e-6));
      observe(draft_, per);
    }
  }
  // verify() of drafted + 1 rows
  const size_t rows = size_t(drafted) + 1;
  if (verify_seconds > 0) {
    if (!verify_seen_[rows]) {
      verify_seen_[rows] = 1;
    } else {
      if (!timed_) first_time(verify_seconds / prior_verify(int(rows)));
      const double prior = step_ * prior_verify(int(rows));
      observe(verify_scale_, verify_seconds / prior);
      double& v = verify_[rows];
      if (verify_timed_[rows] == 0)
        v = std::clamp(verify_seconds, prior * verify_scale_ / 4, prior * verify_scale_ * 4);
      else
        observe(v, verify_seconds);
      ++verify_timed_[rows];
    }
  }
}

}  // namespace lilac
