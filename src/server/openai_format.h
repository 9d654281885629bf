// The OpenAI adapters' output side: chat/completions (reasoning_content, tool_calls, content) and legacy
// completions (plain text) responses, as SSE chunks or one JSON body, from a generation's OutputEvents.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/http_response.h"

namespace lilac {
class Tokenizer;
}

namespace lilac::server {

struct ResponseMeta {
  std::string id;  // "chatcmpl-..." / "cmpl-..."
  std::string model;
  int64_t created = 0;
  bool include_usage = false;
  bool logprobs = false;
  int top_logprobs = 0;
  bool route_field = false;  // add "lilac_route": "local"
  int index = 0;             // the choice's index (`n` > 1: one formatter per choice)
  bool stream_tail = true;   // end the stream with the usage chunk and [DONE] (false: the join does, once)
  // Completions' `echo`: the prompt's tokens come before the completion (text, and with logprobs their entries
  // from the generation's prompt scores, OutputEvent::prompt_scores; the first token's logprob is null).
  bool echo = false;
  std::vector<int32_t> echo_ids;
};

// Several generations (`n` > 1, or several completions prompts): the choices' bodies as one (their choices in order,
// usage counting each prompt once — choices [k·n, (k+1)·n) are prompt k's — and every choice's completion), and
// the end of the stream once every choice finished.
ChoicesJoin openai_choices_join(const ResponseMeta& meta, bool chat, int n);

// /v1/chat/completions and /v1/completions. `tok` gives the bytes of tokens (logprobs).
std::shared_ptr<ResponseFormatter> make_chat_formatter(ResponseMeta meta, const Tokenizer& tok);
std::shared_ptr<ResponseFormatter> make_completion_formatter(ResponseMeta meta, const Tokenizer& tok);

}  // namespace lilac::server
