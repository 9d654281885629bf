#include "engine/grammar_constraint.h"

#include <string>

#include "core/error.h"

namespace lilac {

GrammarConstraint::GrammarConstraint(std::shared_ptr<const grammar::CompiledGrammar> g, std::vector<int32_t> end_tokens)
    : m_(std::move(g), std::move(end_tokens)), mask_(m_.mask_words()) {}

const uint32_t* GrammarConstraint::allowed() {
  m_.fill_mask(mask_);
  return mask_.data();
}

void GrammarConstraint::accept(int32_t token) {
  if (!m_.accept_token(token))
    throw Error("constrained decoding: token " + std::to_string(token) +
                " was chosen although the grammar does not allow it (the backend ignored the token mask)");
}

}  // namespace lilac
