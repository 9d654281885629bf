#include "engine/speculative.h"

#include <algorithm>

namespace lilac {

std::vector<TokenChoice> speculative_step(Session& s, int k, int64_t pending_index, std::span<const int32_t> stop_ids,
                                          const DraftHook& hook, SpecStats& stats, SpecRound* round,
                                          const std::function<double()>* clock) {
  SpecRound local;
  SpecRound& r = round ? *round : local;
  r = SpecRound{};
  const bool timed = clock && *clock;
  const double t0 = timed ? (*clock)() : 0;
  auto plain = [&] {
    TokenChoice c = s.decode_step();
    if (timed) r.plain_seconds = (*clock)() - t0;
    return std::vector<TokenChoice>{std::move(c)};
  };
  const int64_t room = s.max_length() - s.length() - 1;  // a verify feeds the pending token + the drafts
  k = int(std::min<int64_t>(k, room));
  if (k <= 0 || (!s.can_draft() && !hook)) return plain();
  std::vector<int32_t> drafts = s.draft(k);
  if (hook) hook(pending_index, k, drafts);
  if (int64_t(drafts.size()) > k) drafts.resize(static_cast<size_t>(k));
  const auto stop = std::find_first_of(drafts.begin(), drafts.end(), stop_ids.begin(), stop_ids.end());
  drafts.erase(stop, drafts.end());
  if (drafts.empty()) return plain();  // (the time of draft() counts as the plain step's)
  const double t1 = timed ? (*clock)() : 0;
  std::vector<TokenChoice> out = s.verify(drafts);
  if (timed) {
    r.draft_seconds = t1 - t0;
    r.verify_seconds = (*clock)() - t1;
  }
  r.drafted = int(drafts.size());
  r.accepted = int(out.size()) - 1;
  ++stats.rounds;
  stats.drafted += int64_t(drafts.size());
  stats.accepted += int64_t(out.size()) - 1;
  return out;
}

}  // namespace lilac
