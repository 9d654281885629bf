// A TokenConstraint (engine/generator.h) that follows a grammar (grammar/matcher.h): before every
// choice the mask of the tokens that can continue a complete document (the end-of-turn ids exactly
// when it is complete), after every choice the grammar advances by the chosen token.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/generator.h"
#include "grammar/matcher.h"

namespace lilac {

class GrammarConstraint final : public TokenConstraint {
 public:
  // `end_tokens`: the generation's end-of-turn ids. The grammar's vocabulary must cover the model's
  // vocabulary (Vocabulary::mask_size() == the model's vocab_size).
  GrammarConstraint(std::shared_ptr<const grammar::CompiledGrammar> g, std::vector<int32_t> end_tokens);

  const uint32_t* allowed() override;
  // Throws lilac::Error for a token outside the last mask (a backend that ignored it).
  void accept(int32_t token) override;

  const grammar::Matcher& matcher() const { return m_; }

 private:
  grammar::Matcher m_;
  std::vector<uint32_t> mask_;
};

}  // namespace lilac
