// One decode step of a sequence with speculative decoding (../shared/MODEL_MTP.md): draft up to k tokens
// with the session's MTP head, verify them in one multi-row step, and hand back the 1..k+1 choices that
// follow the pending token -- exactly those plain decode_step() calls would have produced one by one
// (Session::verify) -- for the sequence to consume one by one through its stop / detokenizer logic
// (Sequence::decode_alone calls it with k = Sequence::draft_budget(), which keeps every step within
// max_tokens).
//
// The step never feeds a token that plain decoding would not feed before its stop: drafts are limited to
// k and to the context left, and are cut before the first stop id (an end-of-turn token is never fed; when
// the model chooses it, it is the step's last choice). Only a stop *string* can end the generation inside
// a step, after tokens past it were fed; the generator's record of the session's context includes them.
//
// k <= 0 or a session that cannot draft (no MTP head, drafting off or out of step): one decode_step().
// A draft hook (tests, `lilac bench --draft-accept`) may replace the drafts, and makes sessions without
// a head speculate.
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

// What one step did, for the draft policy (engine/spec_policy.h): `drafted` drafts verified (0: it was a
// plain decode step), `accepted` of them accepted; the seconds draft() and verify() took (a plain step's
// in plain_seconds), measured with `clock` (< 0 when no clock was given).
struct SpecRound {
  int drafted = 0, accepted = 0;
  double draft_seconds = -1, verify_seconds = -1, plain_seconds = -1;
};

// The choices after the pending token (index `pending_index` of the output); `stop_ids`: end-of-turn ids.
// `round` (optional) receives what the step did, timed with `clock` (seconds; optional).
std::vector<TokenChoice> speculative_step(Session& s, int k, int64_t pending_index, std::span<const int32_t> stop_ids,
                                          const DraftHook& hook, SpecStats& stats, SpecRound* round = nullptr,
                                          const std::function<double()>* clock = nullptr);

}  // namespace lilac
