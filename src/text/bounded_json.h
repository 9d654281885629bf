// Parsing JSON that comes from outside (request bodies, tool-call arguments, model output, an upstream's
// answers) with bounds: nesting depth and number of values are limited before anything recursive
// (copies, dumps, template conversion) sees the document, and the time is linear in the text's size.
//
// nlohmann's own parse into ordered_json finds each new key by a linear search of its object, so one
// object with n keys costs O(n^2) (400,000 keys: minutes). parse_bounded_json builds the same
// ordered_json (keys in document order; a repeated key keeps its first position and its last value, as
// nlohmann does) through a SAX handler that indexes the keys of large objects by hash.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace lilac {

struct JsonLimits {
  size_t max_depth = 64;          // nested arrays / objects (the root container is level 1)
  size_t max_values = 1u << 20;   // values of any kind in the document (each key counts as one too)
  size_t max_object_keys = 1u << 20;  // distinct keys in any one object (TooManyValues past it)
};

struct JsonParseResult {
  enum Status { Ok, Invalid, TooDeep, TooManyValues };
  Status status = Ok;
  std::string message;  // not Ok: what is wrong and where (byte offset)
  nlohmann::ordered_json value;
  // Key comparisons made to detect repeated keys (linear in the number of keys; exposed for tests).
  uint64_t key_compares = 0;
  bool ok() const { return status == Ok; }
};

// Never throws on bad input: the result says what was wrong.
JsonParseResult parse_bounded_json(std::string_view text, const JsonLimits& limits = {});

// Takes an element of the array parse_bounded_json_handing hands out: its index and the value (to move from).
using JsonElementTaker = std::function<void(size_t index, nlohmann::ordered_json& element)>;

// parse_bounded_json, except that the elements of one array, the value of the root object's key `key`, are handed to
// `take` one at a time, in order, as soon as each is complete, and the array keeps a null in each one's place: a
// document of many such elements (a Message Batches create: up to 10,000 requests in 8 MB) is never held as JSON
// values all at once, only as the result with one element in it at most. The limits count the whole document. A
// repeated key hands the elements of each array under it (the indexes start again at 0; the result keeps the last
// value). Exceptions from `take` end the parse and propagate.
JsonParseResult parse_bounded_json_handing(std::string_view text, const JsonLimits& limits, std::string_view key,
                                           const JsonElementTaker& take);

// The limits request bodies get (the README documents them). 16,384 keys per object: no field of the APIs takes
// more (metadata 16 pairs, logit_bias 1,024 tokens; OpenAI allows 5,000 properties in a whole structured-output
// schema), and a wide object is what costs most memory per byte of text (~60 bytes per 9-byte `"123":1` member,
// ~80 MB of RSS for a 4.3 MB body of 400,000 keys while it was parsed and freed).
inline constexpr JsonLimits kRequestJsonLimits{64, 1u << 20, 16384};

}  // namespace lilac
