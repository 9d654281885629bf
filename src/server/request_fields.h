// Reading request fields with errors that name them, for every protocol adapter: absent or null is
// "not given"; a wrong type or an out-of-range value is an ApiError 400 naming the parameter
// (`param`, or the key itself when `param` is empty).
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/backend.h"
#include "model/config.h"
#include "server/api_error.h"

namespace lilac::server::fields {

using ojson = nlohmann::ordered_json;


[[noreturn]] void bad(const std::string& param, const std::string& msg, const std::string& code = "invalid_value");
const char* type_name(const ojson& v);  // "a string", "an array", ...
[[noreturn]] void wrong_type(const std::string& param, const char* want, const ojson& v);
[[noreturn]] void missing(const std::string& param);

const ojson* field(const ojson& obj, const char* key);  // nullptr when absent or null
std::optional<double> get_number(const ojson& obj, const char* key, double lo, double hi, const std::string& param = "");
std::optional<int64_t> get_int(const ojson& obj, const char* key, int64_t lo, int64_t hi, const std::string& param = "");
std::optional<bool> get_bool(const ojson& obj, const char* key, const std::string& param = "");
std::optional<std::string> get_string(const ojson& obj, const char* key, const std::string& param = "");
// A string field that must be there.
std::string need_string(const ojson& obj, const char* key, const std::string& param);

// OpenAI's `metadata` (Responses, chat completions, Conversations): an object of at most kMaxMetadataPairs pairs, each
// key at most kMaxMetadataKeyChars characters (code points) and each value a string of at most kMaxMetadataValueChars.
// Returns the object (absent or null: an empty one); else a 400 naming `metadata` (not an object, too many pairs, a key
// too long) or `metadata.<key>` (a value that is not a string, or too long).
constexpr size_t kMaxMetadataPairs = 16, kMaxMetadataKeyChars = 64, kMaxMetadataValueChars = 512;
ojson checked_metadata(const ojson& body);

// A tool's parameters schema (OpenAI's `parameters`, Anthropic's `input_schema`; `ps` an object), as the chat template
// and the output parser read it: `properties` an object whose values are schemas (objects or booleans), `required` an
// array of strings. Else a 400 invalid_function_parameters naming `param`, the message naming the tool `name`.
void check_tool_parameters(const ojson& ps, const std::string& param, const std::string& name);

// The stop strings a request may give (OpenAI's stop, Anthropic's stop_sequences): the detokenizer compares its
// held-back text with every stop's prefixes at each token, so unbounded ones let one request cost a worker seconds.
// Each at most kMaxStopBytes, together at most kMaxStopTotalBytes; a stop string of `n` bytes adds to `total`, past a
// bound a 400 naming `param`.
constexpr size_t kMaxStopBytes = 4096, kMaxStopTotalBytes = 16384;
void check_stop_bytes(size_t n, size_t& total, const std::string& param);

// A conversation that ends with an assistant message is continued from that message (a prefill). The
// chat template trims a message's content, so a final assistant text that ends with whitespace could not
// be continued from where it ends: 400 (param "messages", code invalid_last_message), as Anthropic answers.
void check_prefill_text(const std::string& text, const std::string& param = "messages");

// Sampling when the request says nothing: the model's generation_config.json values, else
// temperature 1, top_p 1, no top_k / min_p / penalties; `seed` as given.
SamplingParams sampling_defaults(const ModelConfig& cfg, uint64_t seed);

}  // namespace lilac::server::fields
