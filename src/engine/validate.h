// Token and length validation, in one place. The server (before it queues a generation), the generator
// (before it prefills) and the backends' sessions (on prefill) all judge prompts by these rules and
// describe a problem in the same words: ids inside the vocabulary, prompt + max_tokens within the
// context, a session's capacity. Each check returns the problem (nullopt when there is none) so a caller
// can answer it its own way (the server: an HTTP 400 naming the field); require() throws it as
// lilac::InputError.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string>

namespace lilac {

struct Invalid {
  enum Kind {
    EmptyPrompt,        // "The prompt has no tokens."
    BadMaxTokens,       // "max_tokens must be at least 1"
    PromptTooLong,      // the prompt alone fills the context
    TotalTooLong,       // prompt + max_tokens exceed the context
    TokenOutOfVocab,    // "token id N is outside the vocabulary (size V)"
    SessionFull,        // "context of N tokens exceeds the session's max_length M"
  } kind;
  std::string message;
};
using Check = std::optional<Invalid>;

// The first id outside [0, vocab_size).
Check check_token_ids(std::span<const int32_t> tokens, int64_t vocab_size);
// A generation of `prompt_tokens` then up to `max_tokens` in a context of `limit` tokens: the prompt is
// not empty, max_tokens >= 1, the prompt leaves room, and prompt + max_tokens <= limit.
Check check_context(int64_t prompt_tokens, int64_t max_tokens, int64_t limit);
// A session holding `length` tokens takes `added` more within `max_length`.
Check check_session_capacity(int64_t length, int64_t added, int64_t max_length);

// Throws lilac::InputError(c->message) when `c` holds a problem.
void require(const Check& c);

}  // namespace lilac
