#include "engine/speculative.h"

#include <algorithm>

namespace lilac {

std::vector<TokenChoice> SpecStep::next(int64_t pending_index, int64_t budget, std::span<const int32_t> stop_ids) {
  const int64_t room = s_.max_length() - s_.length() - 1;  // a verify feeds the pending token + the drafts
  const int k = int(std::min<int64_t>({int64_t(k_), budget - 1, room}));
  if (k <= 0 || (!s_.can_draft() && !hook_)) return {s_.decode_step()};
  std::vector<int32_t> drafts = s_.draft(k);
  if (hook_) hook_(pending_index, k, drafts);
  if (int64_t(drafts.size()) > k) drafts.resize(static_cast<size_t>(k));
  const auto stop = std::find_first_of(drafts.begin(), drafts.end(), stop_ids.begin(), stop_ids.end());
  drafts.erase(stop, drafts.end());
  if (drafts.empty()) return {s_.decode_step()};
  std::vector<TokenChoice> out = s_.verify(drafts);
  ++stats_.rounds;
  stats_.drafted += int64_t(drafts.size());
  stats_.accepted += int64_t(out.size()) - 1;
  return out;
}

}  // namespace lilac
