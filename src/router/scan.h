// The hybrid router's sensitivity scan of a whole request body: everything that would leave the machine
// is looked at, in any protocol (OpenAI chat / completions, Anthropic Messages, Responses: no list of
// fields).
//
//   - every object key and every string value anywhere (messages, tools and their schemas, enums, names,
//     ids, user, metadata, stop, response_format, unknown fields, ...), and the JSON text of every number;
//   - strings that hold JSON (tool-call arguments) are parsed (bounded) and walked too, so escapes such as
//     \u0040 are undone;
//   - each text is checked as is and in its variants (router/normalize.h: URL / HTML / \u escapes,
//     base64, Unicode look-alikes and invisible characters, digit separators);
//   - then all string values joined in document order, without a separator and with a space, and
//     their variants: a secret split across messages or text parts is found;
//   - ids (keys "id", "tool_call_id", "call_id") are checked without the high-entropy detector (they
//     are random by design).
// When the body cannot be shown clean (more text than ScanOptions::max_bytes), the outcome says so and
// the router keeps the request local.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace lilac::router {

struct ScanOutcome {
  bool sensitive = false;    // a detector or user rule fired
  bool unscannable = false;  // too much text to scan: not shown clean
  std::vector<std::string> matched;  // what fired (detector / rule names, never the text)
  uint64_t text_bytes = 0;   // bytes of the body's string values (for the size rule)
};

// Checks one text: true (and the detector or rule name appended to `matched`) when something fires.
// `is_id`: the text is an id (no high-entropy detector).
using TextCheck = std::function<bool(std::string_view text, bool is_id, std::vector<std::string>* matched)>;

struct ScanOptions {
  uint64_t max_bytes = uint64_t(64) << 20;  // text looked at, variants and joined texts included
  int max_embedded = 3;                     // levels of JSON-in-a-string that are parsed and walked
};

ScanOutcome scan_body(const nlohmann::ordered_json& body, const TextCheck& check, const ScanOptions& opts = {});

}  // namespace lilac::router
