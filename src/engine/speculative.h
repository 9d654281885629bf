// One decode step of a sequence with speculative decoding (../shared/MODEL_MTP.md): draft up to K tokens
// with the session's MTP head, verify them in one multi-row step, and hand back the 1..K+1 choices that
// follow the pending token -- exactly those plain decode_step() calls would have produced one by one
// (Session::verify), to be consumed one by one by the caller's stop / detokenizer logic.
//
// The step never feeds a token that plain decoding would not feed before its stop: drafts are limited to
// budget - 1 (so no round ends past max_tokens), to the context left, and are cut before the first stop id
// (an end-of-turn token is never fed; when the model chooses it, it is the round's last choice). Only a stop
// *string* can end the generation inside a round, after tokens past it were fed; the caller's record of
// the session's context (Generator::context()) includes them.
//
// K = 0, a session that cannot draft (no MTP head, drafting off or out of step) or budget 1: one
// decode_step(). A draft hook (tests, `lilac bench --draft-accept`) may replace the drafts.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "engine/backend.h"

namespace lilac {

// Called with the index (in the generation's output) of the pending token, the number of drafts wanted
// and the head's drafts (possibly empty); may replace them (at most k are used).
using DraftHook = std::function<void(int64_t pending_index, int k, std::vector<int32_t>& drafts)>;

struct SpecStats {
  int64_t rounds = 0;    // verify steps with at least one draft
  int64_t drafted = 0;   // drafts verified
  int64_t accepted = 0;  // drafts accepted
};

class SpecStep {
 public:
  SpecStep(Session& s, int draft_tokens, DraftHook hook = nullptr) : s_(s), k_(draft_tokens), hook_(std::move(hook)) {}

  // The choices after the pending token (index `pending_index` of the output); `budget` = tokens the
  // generation may still produce (>= 1); `stop_ids`: end-of-turn ids.
  std::vector<TokenChoice> next(int64_t pending_index, int64_t budget, std::span<const int32_t> stop_ids);
  const SpecStats& stats() const { return stats_; }

 private:
  Session& s_;
  int k_;
  DraftHook hook_;
  SpecStats stats_;
};

}  // namespace lilac
