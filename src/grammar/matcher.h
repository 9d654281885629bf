// Constrained decoding at run time: a compiled grammar bound to a vocabulary (shared, thread-safe,
// cached per schema), and one Matcher per generated sequence that turns the grammar's state into a
// token mask before each choice and advances by the chosen token.
//
// Mask format (Session::set_token_mask): uint32 words, bit (t % 32) of word t / 32 set = token t
// allowed, covering Vocabulary::mask_size() ids. A token is allowed iff its bytes continue a
// document the grammar can still complete; added/special tokens never (except the grammar's own
// special-token symbols); the end tokens (e.g. <|im_end|>) exactly when the document is complete.
// Because every grammar state can still complete (Grammar::finalize trims the rest), sampling only
// allowed tokens can always be carried on to a complete document.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "grammar/config_space.h"
#include "grammar/grammar.h"
#include "grammar/token_classes.h"
#include "grammar/vocabulary.h"

namespace lilac::grammar {

class CompiledGrammar {
 public:
  // `shared`: the cache of classes of rules with a share key (one per vocabulary, shared by all
  // grammars); `own_budget`: memory for this grammar's other classes.
  CompiledGrammar(Grammar g, std::shared_ptr<const Vocabulary> vocab, std::shared_ptr<TokenClassCache> shared,
                  size_t own_budget = size_t(64) << 20);

  const Grammar& grammar() const { return g_; }
  const Vocabulary& vocab() const { return *vocab_; }
  // The class of (rule, state); `space` (the caller's) is used when it must be computed.
  std::shared_ptr<const TokenClass> token_class(ConfigSpace& space, int32_t rule, int32_t state) const;

 private:
  Grammar g_;
  std::shared_ptr<const Vocabulary> vocab_;
  std::shared_ptr<TokenClassCache> shared_;
  mutable TokenClassCache own_;
};

class Matcher {
 public:
  struct State {
    int32_t config;
    bool finished;
  };

  // `end_tokens`: ids that end the document (allowed only when it is complete), e.g. <|im_end|>.
  Matcher(std::shared_ptr<const CompiledGrammar> g, std::vector<int32_t> end_tokens);

  size_t mask_words() const { return g_->vocab().mask_words(); }
  // Writes the mask of the tokens allowed next (mask_words() words).
  void fill_mask(std::span<uint32_t> mask);
  // Advances by `token`; false (and no change) if it is not allowed.
  bool accept_token(int32_t token);
  // Advances by raw text (no end token); false (and no change) if it does not continue a document.
  bool accept_bytes(std::string_view bytes);
  // Whether `token` is allowed, by stepping its bytes (the mask must agree; for tests).
  bool allows(int32_t token);
  bool can_end() const { return !finished_ && space_.ended(cfg_); }  // the document is complete
  bool finished() const { return finished_; }                        // an end token was accepted
  // Nothing but the end can follow (the document is complete and cannot be extended).
  bool must_end() const { return !finished_ && cfg_ == ConfigSpace::kEnded; }

  // The fewest tokens that complete the document from here, as single-byte tokens and the grammar's
  // special tokens (breadth-first over configurations; no end token), empty when it is already
  // complete; nullopt if none within `max_steps` (tests use it to finish random walks).
  std::optional<std::vector<int32_t>> shortest_completion(size_t max_steps = 4096);

  // Save / restore (e.g. to roll back rejected speculative tokens).
  State state() const { return {cfg_, finished_}; }
  void set_state(State s) {
    cfg_ = s.config;
    finished_ = s.finished;
  }

  const ConfigSpace& space() const { return space_; }

 private:
  const TokenClass& class_of(int32_t rule, int32_t state);
  void walk_full(uint32_t node, int32_t cfg, uint32_t* mask);
  bool is_end(int32_t t) const;
  int32_t advance(int32_t cfg, int32_t token);  // kDead if not allowed (not for end tokens)

  std::shared_ptr<const CompiledGrammar> g_;
  std::vector<int32_t> end_tokens_;
  ConfigSpace space_;
  int32_t cfg_;
  bool finished_ = false;
  std::unordered_map<uint64_t, std::shared_ptr<const TokenClass>> classes_;
  std::vector<int32_t> ready_;
};

}  // namespace lilac::grammar
