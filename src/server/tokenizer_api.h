// The tokenizer over HTTP, in the shape vLLM's server gives it and evaluation harnesses probe for
// (lm-evaluation-harness's remote tokenizer: GET /tokenizer_info, POST /tokenize and /detokenize), so a client can
// send the model token ids it computed with the server's own tokenizer (completions' `prompt` as ids, `echo`).
//   GET  /tokenizer_info  {"eos_token", "bos_token", "pad_token", "model_max_length", "vocab_size", "chat_template", ...}
//   POST /tokenize        {"prompt": TEXT, "add_special_tokens"?: bool} -> {"tokens": [ids], "count", "max_model_len"},
//                         or {"messages": [...], tools?, ...: a chat completions body} -> the ids of the prompt
//                         /v1/chat/completions would feed for it (template, reasoning, forced call: the same path)
//   POST /detokenize      {"tokens": [ids]} -> {"prompt": TEXT}
// /tokenize reads special-token text ("<|im_start|>") as those tokens, as Hugging Face tokenizers do (a chat
// template rendered by the client tokenizes as the server's would); a completions text prompt never does (send
// its ids). The Qwen tokenizers add no special tokens, so add_special_tokens changes nothing. Errors are OpenAI's
// shape (400 naming the field; 503 while the model loads).
#pragma once

namespace lilac::server {

class HttpServer;
struct ServerContext;

void add_tokenizer_routes(HttpServer& http, ServerContext& ctx);

}  // namespace lilac::server
