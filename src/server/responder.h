// Turns a job's events into OpenAI responses: SSE chunks for streaming, one JSON body otherwise.
// Chat responses go through the OutputParser (reasoning_content, tool_calls, content); legacy
// completions are plain text.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/scheduler.h"
#include "text/output_parser.h"

namespace lilac {
class Tokenizer;
}

namespace lilac::server {

struct ResponseMeta {
  std::string id;       // "chatcmpl-..." / "cmpl-..."
  std::string model;
  int64_t created = 0;
  bool chat = true;
  bool include_usage = false;
  bool logprobs = false;
  int top_logprobs = 0;
  bool route_field = false;  // add "lilac_route": "local"
};

class Responder {
 public:
  // `in_reasoning`: the prompt opened <think>. `tools`: the request's tools (null if none).
  // `forced_prefix`: generation-side text the server appended to the prompt (tool_choice
  // required / named); it is fed to the parser first and never streamed.
  Responder(ResponseMeta meta, const Tokenizer& tok, bool in_reasoning, const nlohmann::json& tools,
            const std::string& forced_prefix = "");

  // Streaming: the SSE text to send for these events (empty if nothing yet). Sets finished() after a
  // Done or Error event; the text then ends with "data: [DONE]\n\n".
  std::string first_sse();  // the role chunk (chat) — send before any event
  std::string sse(const JobEvent& ev);

  // Non-streaming: feed every event, then build the body.
  void consume(const JobEvent& ev);
  nlohmann::json body() const;

  bool finished() const { return finished_; }
  bool failed() const { return error_status_ != 0; }
  int error_status() const { return error_status_; }
  const std::string& error_message() const { return error_message_; }
  const GenerationStats& stats() const { return stats_; }
  std::string finish_reason() const;

 private:
  nlohmann::json chunk_base() const;
  nlohmann::json logprob_entry(const TokenChoice& c) const;
  nlohmann::json usage() const;
  void add_logprobs(const GeneratedToken& t);
  std::string delta_chunk(const OutputDelta& d);
  std::string text_chunk(const std::string& text);
  std::string logprob_tail();  // pending logprobs in an empty-delta chunk
  void accumulate(const OutputDelta& d);

  ResponseMeta meta_;
  const Tokenizer& tok_;
  OutputParser parser_;
  bool finished_ = false;
  int error_status_ = 0;
  std::string error_message_;
  GenerationStats stats_;
  // accumulated (non-streaming) / pending (streaming)
  std::string content_, reasoning_;
  nlohmann::json tool_calls_ = nlohmann::json::array();
  nlohmann::json logprobs_ = nlohmann::json::array();          // chat: entries; all (non-streaming)
  nlohmann::json pending_logprobs_ = nlohmann::json::array();  // streaming: not yet sent
  // legacy completions logprobs
  nlohmann::json lp_tokens_ = nlohmann::json::array(), lp_values_ = nlohmann::json::array(),
                 lp_top_ = nlohmann::json::array(), lp_offsets_ = nlohmann::json::array();
  int64_t text_offset_ = 0;
};

// SSE framing of one JSON value ("data: ...\n\n"), invalid UTF-8 replaced.
std::string sse_data(const nlohmann::json& j);
// JSON text with invalid UTF-8 replaced by U+FFFD (never throws on bytes).
std::string dump_json(const nlohmann::json& j);

}  // namespace lilac::server
