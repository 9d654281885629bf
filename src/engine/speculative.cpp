#include "engine/speculative.h"

#include <algorithm>

namespace lilac {

std::vector<TokenChoice> speculative_step(Session& s, int k, int64_t pending_index, std::span<const int32_t> stop_ids,
                                          const DraftHook& hook, SpecStats& stats) {
  const int64_t room = s.max_length() - s.length() - 1;  // a verify feeds the pending token + the drafts
  k = int(std::min<int64_t>(k, room));
  if (k <= 0 || (!s.can_draft() && !hook)) return {s.decode_step()};
  std::vector<int32_t> drafts = s.draft(k);
  if (hook) hook(pending_index, k, drafts);
  if (int64_t(drafts.size()) > k) drafts.resize(static_cast<size_t>(k));
  const auto stop = std::find_first_of(drafts.begin(), drafts.end(), stop_ids.begin(), stop_ids.end());
  drafts.erase(stop, drafts.end());
  if (drafts.empty()) return {s.decode_step()};
  std::vector<TokenChoice> out = s.verify(drafts);
  ++stats.rounds;
  stats.drafted += int64_t(drafts.size());
  stats.accepted += int64_t(out.size()) - 1;
  return out;
}

}  // namespace lilac
