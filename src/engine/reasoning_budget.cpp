#include "engine/reasoning_budget.h"

#include <algorithm>
#include <limits>

#include "core/error.h"
#include "text/tokenizer.h"

namespace lilac {

ReasoningBudgetConstraint::ReasoningBudgetConstraint(const Tokenizer& tok, int64_t vocab_size, int64_t budget,
                                                     std::vector<int32_t> close_ids, std::string marker,
                                                     std::shared_ptr<TokenConstraint> inner, std::string open_marker,
                                                     int64_t max_choices)
    : tok_(tok), words_((vocab_size + 31) / 32), budget_(std::max<int64_t>(0, budget)), close_ids_(std::move(close_ids)),
      marker_(std::move(marker)), open_marker_(std::move(open_marker)), inner_(std::move(inner)) {
  awaiting_ = !open_marker_.empty();
  open_ = !awaiting_;
  if (close_ids_.empty() || marker_.empty()) throw Error("ReasoningBudgetConstraint: no closing markup");
  for (int32_t t : close_ids_)
    if (t < 0 || t >= vocab_size) throw Error("ReasoningBudgetConstraint: closing token " + std::to_string(t) + " out of range");
  // The forced markup ends by the last choice (a max_choices shorter than the markup: forced from the first).
  budget_ = std::min(budget_, std::max<int64_t>(0, max_choices - int64_t(close_ids_.size())));
  forcing_ = open_ && budget_ == 0;
}

const uint32_t* ReasoningBudgetConstraint::allowed() {
  const uint32_t* inner = inner_ ? inner_->allowed() : nullptr;
  if (!forcing_) return inner;
  const int32_t t = close_ids_[forced_];
  const uint32_t bit = 1u << (t & 31);
  // A grammar that does not allow the closing token here (none of lilac's does: the reasoning block's rule takes
  // any text, then the marker): its mask stands and the model closes the block itself.
  if (inner && !(inner[t >> 5] & bit)) return inner;
  mask_.assign(size_t(words_), 0u);
  mask_[size_t(t >> 5)] = bit;
  return mask_.data();
}

void ReasoningBudgetConstraint::accept(int32_t token) {
  if (inner_) inner_->accept(token);
  ++chosen_;
  std::string bytes = tok_.token_bytes(token);
  if (awaiting_) {  // the output's first bytes: the open marker (then what follows it is the block's), or not
    head_ += bytes;
    if (head_.compare(0, open_marker_.size(), open_marker_) == 0) {
      awaiting_ = false;
      open_ = true;
      bytes = head_.substr(open_marker_.size());
    } else if (open_marker_.compare(0, head_.size(), head_) != 0) {
      awaiting_ = false;  // not a reasoning block: nothing to budget
    }
  }
  if (open_) {  // the marker may span tokens: look for it in the last bytes kept plus this token's
    std::string text = tail_ + bytes;
    if (text.find(marker_) != std::string::npos) {
      open_ = false;
      tail_.clear();
    } else {
      const size_t keep = marker_.size() - 1;
      tail_ = text.size() > keep ? text.substr(text.size() - keep) : std::move(text);
    }
  }
  if (forcing_) {
    if (token == close_ids_[forced_] && ++forced_ < close_ids_.size()) return;
    forcing_ = false;  // the markup is complete, or the grammar let the model choose (allowed()): forced once only
    spent_ = true;
    return;
  }
  if (open_ && !spent_ && chosen_ >= budget_) forcing_ = true;
}

int64_t ReasoningBudgetConstraint::free_choices() const {
  const int64_t inner = inner_ ? inner_->free_choices() : std::numeric_limits<int64_t>::max();
  if (forcing_) return 0;
  if ((!open_ && !awaiting_) || spent_) return inner;
  return std::min(inner, budget_ - chosen_);
}

}  // namespace lilac
