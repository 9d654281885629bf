#include "engine/generator.h"

#include <algorithm>

#include "core/error.h"
#include "engine/sequence.h"
#include "engine/validate.h"
#include "text/tokenizer.h"

namespace lilac {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Cancelled: return "cancelled";
  }
  return "stop";
}

Generator::Generator(Session& session, const Tokenizer& tokenizer, PrefixCache* cache)
    : s_(session), tok_(tokenizer), cache_(cache) {
  policy_.set_cost_hint(s_.spec_cost_hint());
}

bool exact_resume_point(std::span<const int32_t> prompt, int64_t k, int32_t boundary_token, int64_t chunk) {
  if (k <= 0) return k == 0;
  if (k > int64_t(prompt.size())) return false;
  if (boundary_token >= 0 && prompt[size_t(k - 1)] == boundary_token) return true;  // a segment end
  int64_t seg = k - 1;  // the start of the segment holding token k - 1
  while (seg > 0 && !(boundary_token >= 0 && prompt[size_t(seg - 1)] == boundary_token)) --seg;
  return (k - seg) % std::max<int64_t>(1, chunk) == 0;  // a piece boundary inside it
}

int64_t Generator::reusable_prefix(std::span<const int32_t> p, int32_t boundary_token, int64_t prefill_chunk) const {
  const int64_t max_reuse = int64_t(p.size()) - 1;  // the last prompt token is always recomputed (logits)
  const int64_t n = int64_t(context_.size());
  if (context_valid_ && context_prefilled_ && n > 0 && n <= max_reuse && s_.length() == n &&
      std::equal(context_.begin(), context_.end(), p.begin()) &&
      exact_resume_point(p, n, boundary_token, prefill_chunk))
    return n;
  return 0;
}

// Restore the best starting point and return how many prompt tokens it already holds.
int64_t Generator::prepare(const GenerationRequest& req, GenerationStats& st) {
  const auto& p = req.prompt;
  const int64_t max_reuse = int64_t(p.size()) - 1;
  int64_t start = req.prompt_logprobs >= 0 ? 0 : reusable_prefix(req);  // scoring: every position's logits
  if (cache_ && req.use_cache && req.prompt_logprobs < 0) {
    // Snapshots are taken at exact resume points only (Sequence::prefill_step), but of prompts whose boundary token
    // or piece size may differ from this one's: the longest that is exact for this prompt.
    auto hit = cache_->lookup(p, max_reuse);
    while (hit && hit->length > start && !exact_resume_point(p, hit->length, req.boundary_token, req.prefill_chunk))
      hit = cache_->lookup(p, hit->length - 1);
    if (hit && hit->length > start) {
      try {
        s_.restore(*hit->snapshot);
        start = hit->length;
        st.cache_hit = true;
        context_.assign(p.begin(), p.begin() + start);
        context_valid_ = true;
        context_prefilled_ = true;
        return start;
      } catch (const std::exception&) {
        // Unusable snapshot: fall through to a fresh prefill.
        start = 0;
      }
    }
  }
  if (start == 0) {
    s_.reset();
    context_.clear();
    context_prefilled_ = true;
  } else {
    st.cache_hit = true;  // continued from the session's own context
  }
  context_valid_ = true;
  return start;
}

std::unique_ptr<Sequence> Generator::start(GenerationRequest req, TokenCallback on_token,
                                           const std::atomic<bool>* cancel) {
  const auto& p = req.prompt;
  if (req.prompt_logprobs > 20) throw InputError("prompt_logprobs must be in [-1, 20]");
  // Scoring only (max_tokens 0): the prompt must fit as it would with one token to generate.
  const bool score_only = req.prompt_logprobs >= 0 && req.max_tokens == 0;
  require(check_context(int64_t(p.size()), score_only ? 1 : req.max_tokens, s_.max_length()));
  if (req.draft_tokens < 0) throw InputError("draft_tokens must be >= 0");
  if (req.draft_tokens > 0 && !drafting_ && s_.can_draft()) {
    // The head must follow the context from its start: a context it did not see is not reused.
    s_.enable_drafting(true);
    drafting_ = true;
    context_valid_ = false;
  }
  policy_.begin(req.draft_tokens, req.spec_policy);
  return std::unique_ptr<Sequence>(new Sequence(*this, std::move(req), std::move(on_token), cancel));
}

GenerationStats Generator::run(const GenerationRequest& req, const TokenCallback& on_token,
                               const std::atomic<bool>* cancel) {
  auto seq = start(req, on_token, cancel);
  seq->run_to_end();
  return seq->stats();
}

}  // namespace lilac
