#include "engine/validate.h"

#include "core/error.h"

namespace lilac {

Check check_token_ids(std::span<const int32_t> tokens, int64_t vocab_size) {
  for (int32_t t : tokens)
    if (t < 0 || t >= vocab_size)
      return Invalid{Invalid::TokenOutOfVocab, "token id " + std::to_string(t) + " is outside the vocabulary (size " +
                                                   std::to_string(vocab_size) + ")"};
  return std::nullopt;
}

Check check_context(int64_t prompt_tokens, int64_t max_tokens, int64_t limit) {
  if (prompt_tokens <= 0) return Invalid{Invalid::EmptyPrompt, "The prompt has no tokens."};
  if (prompt_tokens >= limit)
    return Invalid{Invalid::PromptTooLong, "This model's maximum context length is " + std::to_string(limit) +
                                               " tokens; the prompt has " + std::to_string(prompt_tokens) + " tokens."};
  if (max_tokens < 1) return Invalid{Invalid::BadMaxTokens, "max_tokens must be at least 1"};
  if (max_tokens > limit - prompt_tokens)  // (prompt + max_tokens would overflow for max_tokens near 2^63)
    return Invalid{Invalid::TotalTooLong, "This model's maximum context length is " + std::to_string(limit) +
                                              " tokens; the prompt (" + std::to_string(prompt_tokens) +
                                              " tokens) + max_tokens (" + std::to_string(max_tokens) + ") exceeds it."};
  return std::nullopt;
}

Check check_session_capacity(int64_t length, int64_t added, int64_t max_length) {
  if (length + added > max_length)
    return Invalid{Invalid::SessionFull, "context of " + std::to_string(length + added) +
                                             " tokens exceeds the session's max_length " + std::to_string(max_length)};
  return std::nullopt;
}

void require(const Check& c) {
  if (c) throw InputError(c->message);
}

}  // namespace lilac
