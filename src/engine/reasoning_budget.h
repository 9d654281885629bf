// A reasoning budget (Anthropic's thinking.budget_tokens, GenerationSpec::reasoning_budget) as a TokenConstraint
// (engine/generator.h) of the one generation: the first `budget` choices are free; if the reasoning block is still
// open then, the next choices are forced to the closing markup's tokens, one by one (a mask with one token), and the
// generation goes on with its answer. Everything else is the generation's own, unchanged by the cut: its sampler and
// seed, penalties, stop strings, detokenizer, prefix-cache snapshots, logprobs and max_tokens (the closing tokens
// are generated tokens and count), and any other constraint (`inner`, e.g. the response grammar, which sees and
// accepts the forced tokens like any other choice).
//
// Whether the reasoning is still open is read from the chosen tokens' bytes: the block is closed once the text
// since the start holds the closing marker (e.g. "</think>"), however the model spelled it in tokens.
//
// The markup is forced early enough to end within the generation's `max_choices` (its max_tokens): the budget is
// at most max_choices minus the markup's tokens. A budget closer to the limit (e.g. max_tokens - 1, the most
// Anthropic's thinking.budget_tokens may be) had the forced markup cut by max_tokens and the block left open.
#pragma once
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "engine/generator.h"

namespace lilac {

class Tokenizer;

class ReasoningBudgetConstraint final : public TokenConstraint {
 public:
  // `budget` >= 0 choices inside the reasoning; `close_ids` the tokens forced when it runs out (the closing markup,
  // e.g. "\n</think>\n\n"); `marker` the text that closes the block (e.g. "</think>"); `vocab_size` the model's.
  // `open_marker` non-empty: the prompt does not open the block (a template that lets the model write "<think>"
  // itself): it is open only if the output begins with that text (the output parser's rule), else nothing is forced.
  // `max_choices`: the generation's max_tokens (the budget leaves the closing markup room before it).
  ReasoningBudgetConstraint(const Tokenizer& tok, int64_t vocab_size, int64_t budget, std::vector<int32_t> close_ids,
                            std::string marker, std::shared_ptr<TokenConstraint> inner, std::string open_marker = "",
                            int64_t max_choices = std::numeric_limits<int64_t>::max());

  const uint32_t* allowed() override;
  void accept(int32_t token) override;
  int64_t free_choices() const override;

  bool open() const { return open_; }        // the reasoning block has not been closed
  bool forcing() const { return forcing_; }  // the budget ran out: the closing markup is being forced

 private:
  const Tokenizer& tok_;
  int64_t words_;  // mask words
  int64_t budget_;  // at most max_choices - close_ids_.size()
  std::vector<int32_t> close_ids_;
  std::string marker_;
  std::string open_marker_;  // awaited at the output's start (empty: the prompt opened the block)
  std::string head_;         // the output's first bytes while the open marker is awaited
  std::shared_ptr<TokenConstraint> inner_;
  int64_t chosen_ = 0;   // choices accepted so far
  size_t forced_ = 0;    // closing tokens accepted so far (while forcing)
  bool open_ = true;
  bool awaiting_ = false;  // the open marker may still begin the output
  bool forcing_ = false;
  bool spent_ = false;   // the closing markup was forced (it is forced once)
  std::string tail_;     // the last marker.size() - 1 bytes of the text so far (the marker may span tokens)
  std::vector<uint32_t> mask_;
};

}  // namespace lilac
