#include "fuzz/json_mutator.h"

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/bounded_json.h"

// libFuzzer's own mutation (in lilac_fuzz); the corpus test never mutates.
extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size) __attribute__((weak));

namespace lilac::fuzz {

namespace {

using J = nlohmann::ordered_json;
constexpr size_t kPrefix = 2;  // the choice bytes before the document

const char* const kKeys[] = {
    "model", "messages", "role", "content", "name", "tools", "tool_choice", "tool_calls", "tool_call_id", "function",
    "arguments", "parameters", "type", "text", "stream", "stream_options", "include_usage", "max_tokens",
    "max_completion_tokens", "max_output_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "n", "stop",
    "stop_sequences", "logprobs", "top_logprobs", "tokens", "add_special_tokens", "presence_penalty",
    "frequency_penalty", "repetition_penalty",
    "logit_bias", "response_format", "json_schema", "schema", "strict", "prompt", "suffix", "echo", "best_of",
    "system", "thinking", "budget_tokens", "input", "instructions", "reasoning", "effort", "input_schema",
    "tool_use_id", "id", "is_error", "cache_control", "metadata", "user", "parallel_tool_calls", "previous_response_id",
    "background", "store", "conversation", "requests", "custom_id", "params",
    "chat_template_kwargs", "enable_thinking", "image_url", "input_text", "output_text", "function_call",
    "function_call_output", "call_id", "format", "properties", "required", "items", "enum", "$ref", "anyOf",
    "pattern", "minLength", "maxLength", "minimum", "maximum", "additionalProperties", "description"};
const char* const kStrings[] = {"user", "assistant", "system", "tool", "developer", "function", "text", "auto", "none",
                                "required", "json_object", "json_schema", "object", "string", "integer", "array",
                                "tool_use", "tool_result", "input_text", "image_url", "enabled", "disabled",
                                "local-model", "get_weather", "<tool_call>", "</think>", "<|im_end|>", "weather",
                                "json", "\xe2\x80\xae", "\xef\xbf\xbf", "{\"a\":", "^[a-z]+$", "low", "high"};

J random_value(std::mt19937& r, int depth) {
  switch (r() % 16) {
    case 0: return nullptr;
    case 1: return bool(r() & 1);
    case 2: return int64_t(r() % 7) - 3;
    case 3: return std::numeric_limits<int64_t>::max();
    case 4: return std::numeric_limits<int64_t>::min();
    case 5: return uint64_t(-1);
    case 6: return 1e308 * (r() & 1 ? 10 : -1);
    case 7: return double(r() % 100000) / 1000.0 - 20;
    case 8: return std::string(kStrings[r() % (sizeof kStrings / sizeof *kStrings)]);
    case 9: return std::string(size_t(r() % 3 == 0 ? 100000 : r() % 300), char('a' + r() % 26));
    case 10: return std::string("");
    case 11: return J::array();
    case 12: return J::object();
    case 13:
      if (depth < 3) {
        J a = J::array();
        for (int i = 0, n = int(r() % 4); i < n; ++i) a.push_back(random_value(r, depth + 1));
        return a;
      }
      return 0;
    default:
      if (depth < 3) {
        J o = J::object();
        for (int i = 0, n = int(r() % 4); i < n; ++i) o[kKeys[r() % (sizeof kKeys / sizeof *kKeys)]] = random_value(r, depth + 1);
        return o;
      }
      return "x";
  }
}

void collect(J& v, std::vector<J*>& out) {
  out.push_back(&v);
  if (v.is_structured())
    for (auto& x : v) collect(x, out);
}

void mutate(J& root, std::mt19937& r) {
  std::vector<J*> nodes;
  collect(root, nodes);
  J& v = *nodes[r() % nodes.size()];
  switch (r() % 7) {
    case 0:
    case 1:
      if (&v != &root) v = random_value(r, 0);
      break;
    case 2:
    case 3:
      if (v.is_object()) v[kKeys[r() % (sizeof kKeys / sizeof *kKeys)]] = random_value(r, 0);
      else if (v.is_array()) v.push_back(random_value(r, 0));
      break;
    case 4:  // remove a member
      if (v.is_object() && !v.empty()) {
        auto it = v.begin();
        std::advance(it, r() % v.size());
        v.erase(it.key());
      } else if (v.is_array() && !v.empty()) {
        v.erase(v.begin() + std::ptrdiff_t(r() % v.size()));
      }
      break;
    case 5:  // duplicate an element (many messages, many tools)
      if (v.is_array() && !v.empty()) {
        const J x = v[r() % v.size()];
        for (int i = 0, n = 1 + int(r() % (r() % 8 == 0 ? 200 : 3)); i < n; ++i) v.push_back(x);
      }
      break;
    default:  // wrap in an array, or a string's content as a number or vice versa
      if (&v == &root) break;
      if (v.is_string()) v = v.get<std::string>().size();
      else if (v.is_number()) v = v.dump();
      else v = J::array({v});
      break;
  }
}

}  // namespace

size_t mutate_json_body(uint8_t* data, size_t size, size_t max_size, unsigned seed) {
  std::mt19937 r(seed);
  if (size > kPrefix && (r() & 1)) {
    JsonParseResult j = parse_bounded_json(std::string_view(reinterpret_cast<const char*>(data) + kPrefix, size - kPrefix));
    if (j.ok() && j.value.is_object()) {
      for (int i = 0, n = 1 + int(r() % 3); i < n; ++i) mutate(j.value, r);
      if (r() % 8 == 0) data[r() % kPrefix] = uint8_t(r());
      const std::string out = j.value.dump(-1, ' ', false, J::error_handler_t::replace);
      if (kPrefix + out.size() <= max_size) {
        std::memcpy(data + kPrefix, out.data(), out.size());
        return kPrefix + out.size();
      }
    }
  }
  return LLVMFuzzerMutate ? LLVMFuzzerMutate(data, size, max_size) : size;
}

}  // namespace lilac::fuzz
