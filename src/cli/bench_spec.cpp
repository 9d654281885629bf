#include "cli/bench_spec.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <random>
#include <sstream>

#include "core/error.h"
#include "engine/speculative.h"

namespace lilac::cli {
namespace {

struct SpecResult {
  double decode_s = 0;  // the timed steps
  int64_t tokens = 0, steps = 0, rounds = 0, accepted = 0, drafted = 0;
  double draft_s = 0;       // time in draft()
  double verify_s = 0;      // time in verify() (rounds with drafts)
  int64_t head_drafts = 0;  // drafts made by the head
};

// The timed decode after `prompt` (prefilled into `s`, snapshot `snap`) with the drafts per step that `pol`
// chooses, through speculative_step as a served sequence steps: `truth` is the plain greedy continuation
// (truth[0] = the first token). Drafts: the head's (P < 0) or forced right with probability P per position.
SpecResult spec_decode(Session& s, const SessionSnapshot& snap, const std::vector<int32_t>& prompt,
                       const std::vector<int32_t>& truth, SpecPolicy& pol, double P, int64_t n, std::mt19937_64& rng) {
  SpecResult r;
  s.restore(snap);
  s.begin_generation(SamplingParams{}, prompt);
  if (s.sample().token != truth[0]) throw Error("bench: the first token differs from the plain run's");
  std::bernoulli_distribution right(std::clamp(P, 0.0, 1.0));
  const int32_t V = int32_t(s.logits().size());
  const DraftHook hook = [&](int64_t i, int k, std::vector<int32_t>& drafts) {
    r.head_drafts += int64_t(drafts.size());
    if (P < 0) return;
    drafts.resize(static_cast<size_t>(k));
    for (int j = 0; j < k; ++j) {
      const int32_t t = truth[static_cast<size_t>(i + 1 + j)];
      drafts[static_cast<size_t>(j)] = right(rng) ? t : (t + 1) % V;
    }
  };
  const std::function<double()> clock = [&pol] { return pol.now(); };
  SpecStats stats;
  int64_t i = 0;  // index of the pending token in truth
  const double t0 = pol.now();
  while (i < n) {
    const int k = int(std::min<int64_t>(pol.choose(), int64_t(truth.size()) - 2 - i));
    SpecRound round;
    const std::vector<TokenChoice> ch = speculative_step(s, k, i, {}, hook, stats, &round, &clock);
    // The rows before a failed one are checked first (a differing one is reported before the failure), then the
    // failed row's error, as the decode step that throws there.
    for (const TokenChoice& c : ch) {
      if (c.error) break;
      if (c.token != truth[static_cast<size_t>(++i)]) throw Error("bench: speculative output differs from plain decoding");
    }
    rethrow_choice_error(ch);
    ++r.steps;
    r.tokens += int64_t(ch.size());
    if (round.drafted > 0) {
      r.draft_s += round.draft_seconds;
      r.verify_s += round.verify_seconds;
      pol.on_round(round.drafted, round.accepted, round.draft_seconds, round.verify_seconds);
    } else {
      pol.on_plain(round.plain_seconds);
    }
  }
  r.decode_s = pol.now() - t0;
  r.rounds = stats.rounds;
  r.drafted = stats.drafted;
  r.accepted = stats.accepted;
  return r;
}

}  // namespace

std::vector<double> parse_accept_list(const std::string& s) {
  std::vector<double> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    double p = 0;
    try {
      size_t used = 0;
      p = std::stod(item, &used);
      if (used != item.size()) throw std::invalid_argument(item);
    } catch (const std::logic_error&) {
      throw InputError("--draft-accept: '" + item + "' is not a number");
    }
    if (!(p >= 0 && p <= 1)) throw InputError("--draft-accept must be in [0, 1] (got " + item + ")");
    v.push_back(p);
  }
  if (v.empty()) throw InputError("--draft-accept: no values given");
  return v;
}

std::vector<SpecPolicyKind> parse_bench_policies(const std::string& s) {
  if (s == "both") return {SpecPolicyKind::Fixed, SpecPolicyKind::Adaptive};
  if (s != "adaptive" && s != "fixed") throw InputError("--spec-policy: '" + s + "' is not adaptive, fixed or both");
  return {parse_spec_policy(s)};
}

void run_spec_bench(const SpecBenchOptions& o, Backend& backend, nlohmann::json& out) {
  std::mt19937_64 rng(o.seed + 7);
  const int64_t real_vocab = std::min<int64_t>(backend.config().vocab_size, 248077);
  const int K = o.spec_tokens;
  const int64_t n = o.decode_tokens;
  const std::vector<double> accepts = o.accept.empty() ? std::vector<double>{-1.0} : o.accept;
  std::printf("speculative decoding: at most K = %d drafts per step, drafts %s\n", K,
              o.accept.empty() ? "from the MTP head" : "forced right with probability P");
  std::printf("%8s %5s %9s %10s %10s %8s %11s %9s %7s %13s %12s\n", "prompt", "P", "policy", "K=0 t/s", "spec t/s",
              "speedup", "accepted/rd", "tokens/rd", "mean k", "head ms/draft", "verify ms/rd");
  for (int64_t L : o.prompt_lens) {
    auto s = backend.new_session(L + n + K + 8);
    s->enable_drafting(true);
    std::vector<int32_t> prompt(static_cast<size_t>(L));
    for (auto& t : prompt) t = int32_t(rng() % uint64_t(real_vocab));
    const auto p0 = std::chrono::steady_clock::now();
    s->prefill(prompt);
    (void)s->logits();  // the prompt's logits on the host: as far as a first token needs
    const double prefill_ms = std::chrono::duration<double>(std::chrono::steady_clock::now() - p0).count() * 1e3;
    std::printf("%8lld prefill with the MTP head following: %.2f ms\n", (long long)L, prefill_ms);
    auto snap = s->snapshot();
    // Plain greedy (the truth, and K = 0's speed): one untimed step, then n + K timed ones.
    s->begin_generation(SamplingParams{}, prompt);
    std::vector<int32_t> truth{s->sample().token};
    truth.push_back(s->decode_step().token);
    const auto t0 = std::chrono::steady_clock::now();
    while (int64_t(truth.size()) < n + K + 2) truth.push_back(s->decode_step().token);
    const double plain_tok_s =
        double(n + K) / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // Warm-up: a few rounds at each k = 1..K (graph captures; the policy's first cost estimates).
    SpecPolicy pol;
    pol.set_cost_hint(s->spec_cost_hint());
    for (int k = 1; k <= K; ++k) {
      pol.begin(k, SpecPolicyKind::Fixed);
      spec_decode(*s, *snap, prompt, truth, pol, o.accept.empty() ? -1.0 : 0.5, std::min<int64_t>(8, n), rng);
    }
    for (double P : accepts) {
      for (SpecPolicyKind kind : o.policies) {
        pol.begin(K, kind);
        const SpecResult r = spec_decode(*s, *snap, prompt, truth, pol, P, n, rng);
        const double tok_s = double(r.tokens) / r.decode_s;
        const double head_ms = r.head_drafts ? r.draft_s / double(r.head_drafts) * 1e3 : 0.0;
        const double verify_ms = r.rounds ? r.verify_s / double(r.rounds) * 1e3 : 0.0;
        const double mean_k = r.steps ? double(r.drafted) / double(r.steps) : 0.0;
        nlohmann::json j;
        j["prompt_len"] = L;
        j["prefill_ms"] = prefill_ms;
        if (P >= 0) j["draft_accept"] = P;
        j["policy"] = spec_policy_name(kind);
        j["plain_decode_tok_s"] = plain_tok_s;
        j["spec_decode_tok_s"] = tok_s;
        j["speedup"] = tok_s / plain_tok_s;
        j["steps"] = r.steps;
        j["rounds"] = r.rounds;
        j["plain_steps"] = r.steps - r.rounds;
        j["mean_k"] = mean_k;
        j["accepted_per_round"] = r.rounds ? double(r.accepted) / double(r.rounds) : 0.0;
        j["tokens_per_round"] = r.rounds ? double(r.tokens - (r.steps - r.rounds)) / double(r.rounds) : 0.0;
        j["head_drafts"] = r.head_drafts;
        j["head_ms_per_draft"] = head_ms;
        j["verify_ms_per_round"] = verify_ms;
        // the policy's estimates at the end (ms; acceptance per draft)
        j["est_acceptance"] = pol.acceptance();
        j["est_step_ms"] = pol.step_cost() * 1e3;
        j["est_draft_ms"] = pol.draft_cost() * 1e3;
        for (int m = 2; m <= K + 1; ++m) j["est_verify_ms"][std::to_string(m)] = pol.verify_cost(m) * 1e3;
        out["results"].push_back(j);
        std::printf("%8lld %5s %9s %10.1f %10.1f %7.2fx %11.2f %9.2f %7.2f %13.3f %12.3f\n", (long long)L,
                    P >= 0 ? std::to_string(P).substr(0, 4).c_str() : "head", spec_policy_name(kind), plain_tok_s,
                    tok_s, tok_s / plain_tok_s, j["accepted_per_round"].get<double>(),
                    j["tokens_per_round"].get<double>(), mean_k, head_ms, verify_ms);
        std::fflush(stdout);
      }
    }
  }
  if (!backend.new_session(8)->can_draft())
    std::printf("note: the %s backend cannot draft: the MTP head's cost is not included\n", backend.name().c_str());
}

}  // namespace lilac::cli
