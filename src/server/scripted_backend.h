// A scripted Backend for tests and benchmarks: instead of a model it "generates" replies chosen by a
// script, token by token through the real tokenizer, so the whole server (detokenizer, output parser,
// HTTP layer, prefix cache) is exercised with outputs a random-weight model never produces (tool
// calls, reasoning). `lilac serve --backend scripted:FILE`.
//
// Script (JSON):
//   {"rules": [{"match": "weather", "reply": "<tool_call>...", "delay_ms": 0, "repeat": false}, ...],
//    "default": {"reply": "Hello!"}, "prefill_delay_ms": 0, "logit_bias": true}
// The first rule whose `match` occurs in the prompt text after the last "<|im_start|>user" (the whole
// prompt when there is none) gives the reply; else `default`. The reply is tokenized and emitted, then
// <|im_end|>; `repeat` loops the reply forever instead (for max_tokens / cancellation tests);
// `delay_ms` sleeps before each decode step. A prompt whose assistant turn already holds the first
// tokens of the chosen reply (a generation resumed by the generation core) gets the rest of it.
// Logprobs are synthetic but well formed: the chosen token gets log(0.75), alternatives follow with
// smaller values. logit_bias is accepted and ignored (false: the backend says it does not support it).
#pragma once
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/backend.h"

namespace lilac {
class Tokenizer;
}

namespace lilac::server {

std::unique_ptr<Backend> make_scripted_backend(const nlohmann::json& script,
                                               std::shared_ptr<const Tokenizer> tokenizer);
// Reads the script from a file (throws lilac::InputError naming it).
std::unique_ptr<Backend> make_scripted_backend_from_file(const std::string& path,
                                                         std::shared_ptr<const Tokenizer> tokenizer);

}  // namespace lilac::server
