// How many drafts a speculative decode step makes (engine/speculative.h): the adaptive draft-length policy.
// A fixed depth K pays the head's drafts and the verify of K + 1 rows even when the drafts are wrong; real
// text alternates between stretches where most drafts are accepted (code, quotes) and stretches where few
// are. Each step the policy picks the k in 0..k_max that maximises the expected tokens per second from what
// it measured; k = 0 is a plain decode step. It only picks k: whatever it picks, the tokens that come out
// are plain decoding's (speculative_step's contract), so it can never change the output.
//
// Model. Drafts are checked left to right; with a per-draft acceptance a (the chance that a draft is
// accepted when the drafts before it were), a round of k drafts emits E(k) = 1 + a + ... + a^k =
// (1 - a^(k+1)) / (1 - a) tokens and costs C(k) = k * draft + verify(k + 1 rows); a plain step emits one
// token and costs `step`. best_k() = argmax over k of E(k) / C(k) (C(0) = step; ties to the smaller k).
//
// Acceptance (per sequence: begin() restarts it from the prior). A round of n drafts with A accepted tried
// A + (A < n ? 1 : 0) positions and won A of them; the estimate is (wins + prior_accept * prior_weight) /
// (tries + prior_weight) over evidence that decays by accept_decay each round (the prior too), so it
// follows the text's easy and hard stretches within a few rounds.
//
// Costs (seconds; kept across sequences, they belong to the session and its backend): running averages
// (EMA, weight cost_alpha) of the times the caller measures with now(). Until something is timed they are
// the backend's prior (Session::spec_cost_hint, in plain steps); the first timed observation fixes the
// scale (and the first timed plain step, when faster than the step cost that scale gave, replaces it). A verify of a row count never timed is predicted from the prior, scaled by how far the timed
// verifies were from their prior. The first observation of each kind and size is not used (a CUDA graph
// is captured then), and an observation is clamped to [estimate / 4, estimate * 1.5]: noise and bursts
// (the MTP head's catch-up runs inside some plain steps: 64 rows at once on the CPU, up to 127 on CUDA) only
// ever make a step slower, and a plain step estimated too slow would make drafting look cheap. While
// drafts win, no plain step is timed; so that a stale step cost cannot keep the policy drafting, every
// remeasure_rounds rounds in a row it makes one plain step (with measured costs only).
//
// Probing: while k = 0 wins, after probe_gap() plain steps in a row choose() returns a probe of probe_k
// drafts, so that the policy notices when acceptance returns. A probe that accepts nothing doubles the gap
// (up to probe_max); one that accepts something, and every round that was not a probe, resets it to
// probe_min.
//
// Exploration (when costs are measured): while the best k is below k_max and the verify of k + 2 rows has
// never been timed, choose() returns k + 1 (until it is timed), so that the costs of deeper rounds are
// measured rather than left to the prior.
//
// Fixed policy (--spec-policy fixed): choose() is always k_max (the observations still update the
// estimates). Deterministic: the choices depend only on the observations (tests inject them, or set
// measure = false and a cost hint, or a clock).
#pragma once
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/backend.h"

namespace lilac {

enum class SpecPolicyKind { Adaptive, Fixed };

// Speculation and batching: a driver of several sequences (the server's scheduler) lets them draft only
// while at most this many decode (`serve --spec-max-batch`); above it they all take the batched plain step.
// The default, 1, is measured on the H200 (bench/BENCHMARKS.md, issues 11 and 14): one stream with K = 3
// MTP drafts decodes at 0.99-1.57x of 457 tok/s (acceptance 0 .. 0.9), while the batched step of 2 streams
// already gives 584 tok/s in all (4 streams 863): a second stream gains more from batching than from
// drafting, so speculation is for a stream decoding alone.
constexpr int kDefaultSpecMaxBatch = 1;
const char* spec_policy_name(SpecPolicyKind k);
// "adaptive" | "fixed"; anything else: InputError naming `what`.
SpecPolicyKind parse_spec_policy(std::string_view s, const char* what = "--spec-policy");

class SpecPolicy {
 public:
  struct Options {
    double prior_accept = 0.6;  // the acceptance a sequence starts from (optimistic: it drafts, then learns)
    double prior_weight = 2;    // ... worth this many tried positions
    double accept_decay = 0.8;  // weight of the earlier evidence after each round
    double cost_alpha = 0.25;   // weight of a new time in the cost averages
    int probe_min = 4, probe_max = 64;  // plain steps before a probe
    int probe_k = 1;                    // drafts of a probe
    int remeasure_rounds = 32;          // rounds in a row after which one plain step is timed
    bool measure = true;                // false: the costs stay the hint's (no timing is used)
  };
  using Clock = std::function<double()>;  // seconds, monotonic

  SpecPolicy();  // default options, the steady clock
  explicit SpecPolicy(Options o);

  void set_options(const Options& o) { o_ = o; }
  const Options& options() const { return o_; }
  // The backend's relative costs (in plain steps), used until measured.
  void set_cost_hint(const SpecCostHint& h) { hint_ = h; }
  void set_clock(Clock c) { clock_ = std::move(c); }
  double now() const { return clock_(); }

  // A new sequence of at most k_max drafts per step: restarts the acceptance and the probe schedule (the
  // costs stay).
  void begin(int k_max, SpecPolicyKind kind);
  int k_max() const { return k_max_; }
  SpecPolicyKind kind() const { return kind_; }

  // The drafts for the next step (0: a plain step); a function of the state only (calling it twice gives
  // the same k).
  int choose() const;
  // The k that maximises expected tokens per second (no probe, no exploration).
  int best_k() const;

  // A plain decode step took `seconds` (< 0: not timed, e.g. a batched step; it counts for the probes).
  void on_plain(double seconds);
  // A plain step the policy did not choose: its driver stepped the sequence without drafts whatever
  // choose() said (the scheduler above --spec-max-batch). The acceptance, the probe schedule and the
  // remeasure count stay as they were (so choose() gives the same k once drafting is allowed again); only
  // the next round's draft() time is not used (the head catches up with the rows the step fed).
  void on_suppressed() { head_behind_ = true; }
  // A round verified `drafted` (>= 1) drafts and accepted `accepted` of them; draft() took draft_seconds and
  // verify() verify_seconds (< 0: not timed).
  void on_round(int drafted, int accepted, double draft_seconds, double verify_seconds);

  // ---- the estimates (tests, stats)
  double acceptance() const;
  static double expected_tokens(int k, double a);  // 1 + a + ... + a^k
  double step_cost() const { return step_; }       // seconds once timed, else plain steps (1)
  double draft_cost() const { return draft_; }     // per draft
  double verify_cost(int rows) const;
  double round_cost(int k) const;  // k = 0: step_cost()
  int probe_gap() const { return probe_gap_; }
  int plain_run() const { return plain_run_; }     // plain steps since the last round
  bool timed() const { return timed_; }

 private:
  double prior_verify(int rows) const { return 1.0 + hint_.verify_row * double(rows - 1); }  // in steps
  void first_time(double unit_seconds);
  void observe(double& est, double seconds) const;
  void grow(int rows);

  Options o_;
  SpecCostHint hint_;
  Clock clock_;
  SpecPolicyKind kind_ = SpecPolicyKind::Adaptive;
  int k_max_ = 0;
  double wins_ = 0, tries_ = 0;
  int plain_run_ = 0, probe_gap_ = 4;
  int round_run_ = 0;  // rounds since the last plain step
  bool head_behind_ = false;  // suppressed steps since the last round (its draft() caught up)
  // costs
  bool timed_ = false;
  double step_ = 1, draft_ = 0.5, verify_scale_ = 1;
  bool plain_seen_ = false;
  bool step_timed_ = false;  // a plain step's time has been used
  std::vector<double> verify_;        // by rows: the average (valid where verify_timed_ > 0)
  std::vector<int> verify_timed_;     // by rows: timed observations used
  std::vector<char> verify_seen_, draft_seen_;  // by rows / drafts: the first observation (not used) happened
};

}  // namespace lilac
