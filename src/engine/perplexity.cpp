#include "engine/perplexity.h"

#include <chrono>
#include <cmath>
#include <string>

#include "core/error.h"
#include "engine/generator.h"

namespace lilac {

double PerplexityResult::ppl() const { return scored > 0 ? std::exp(nll / double(scored)) : std::nan(""); }

PerplexityResult perplexity(Backend& backend, const Tokenizer& tokenizer, std::span<const int32_t> tokens,
                            const PerplexityOptions& opts,
                            const std::function<void(const PerplexityWindow&, const PerplexityResult&)>& on_window) {
  if (opts.ctx < 2) throw InputError("perplexity: the window (--ctx) must hold at least 2 tokens");
  const int64_t first = opts.first_scored();
  if (first < 1 || first >= opts.ctx)
    throw InputError("perplexity: the first scored position must be in [1, " + std::to_string(opts.ctx - 1) + "]");
  const int64_t n = int64_t(tokens.size());
  if (n <= first) throw InputError("perplexity: " + std::to_string(n) + " tokens leave nothing to score after position " +
                                   std::to_string(first));
  auto session = backend.new_session(opts.ctx + 1);
  Generator gen(*session, tokenizer, nullptr);
  PerplexityResult res;
  double sum_sq = 0;  // of the per-token NLLs (for the standard error)
  const auto t_all = std::chrono::steady_clock::now();
  for (int64_t start = 0; start + first < n; start += opts.ctx) {
    if (opts.max_windows > 0 && int64_t(res.windows.size()) >= opts.max_windows) break;
    const int64_t len = std::min(opts.ctx, n - start);
    GenerationRequest req;
    req.prompt.assign(tokens.begin() + start, tokens.begin() + start + len);
    req.max_tokens = 0;
    req.prompt_logprobs = 0;
    req.use_cache = false;
    req.prefill_chunk = len;
    std::vector<TokenChoice> scores;
    req.on_prompt_logprobs = [&](std::vector<TokenChoice>&& s) { scores = std::move(s); };
    const auto t0 = std::chrono::steady_clock::now();
    gen.run(req, [](const GeneratedToken&) { return true; });
    PerplexityWindow w;
    w.start = start;
    w.tokens = len;
    w.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // scores[i] is position i + 1's
    for (int64_t pos = first; pos < len; ++pos) {
      const double nll = -double(scores.at(size_t(pos - 1)).logprob);
      w.nll += nll;
      sum_sq += nll * nll;
      ++w.scored;
    }
    res.windows.push_back(w);
    res.tokens += w.tokens;
    res.scored += w.scored;
    res.nll += w.nll;
    if (on_window) on_window(res.windows.back(), res);
  }
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_all).count();
  if (res.scored > 1) {
    const double mean = res.nll / double(res.scored);
    const double var = std::max(0.0, sum_sq / double(res.scored) - mean * mean);
    res.stderr_ppl = res.ppl() * std::sqrt(var / double(res.scored - 1));
  }
  return res;
}

}  // namespace lilac
