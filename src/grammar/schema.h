// JSON Schema -> grammar of the JSON documents it accepts (a subset of JSON Schema 2020-12, listed
// here; README's API section repeats it for users).
//
// Keywords: type (all seven, or a list), properties, required, additionalProperties (false or a
// schema), items, prefixItems, minItems, maxItems, enum, const, anyOf, oneOf (when its branches
// are provably disjoint, else an error), allOf (of object schemas; branches that constrain nothing
// drop out), $ref / $defs / definitions (local JSON pointers, recursion allowed), minLength,
// maxLength, pattern (regex.h), format (date, time, date-time, uuid, email), minimum / maximum /
// exclusiveMinimum / exclusiveMaximum (integers).
// Annotations (title, description, default, examples, $schema, $id, $comment, deprecated,
// readOnly, writeOnly) are accepted and have no effect. Anything else is a SchemaError naming the
// keyword and its JSON pointer, as are invalid values and unsatisfiable or too large schemas.
//
// The documents generated are a subset of those the schema accepts, chosen so that generation is
// predictable and always terminates:
//  - properties appear in the order `properties` declares them (optional ones may be left out);
//    extra properties only when additionalProperties is a schema or true, after the declared ones,
//    with names that are not declared ones; absent additionalProperties = no extra properties when
//    the object declares properties or required ones, any properties when it declares nothing
//    ({"type": "object"} is any object);
//  - whitespace between tokens is bounded: nothing, one space, or one newline followed by up to 32
//    spaces or up to 8 tabs, at each place JSON allows whitespace (also before and after the value);
//  - numbers: at most 19 integer digits, 19 fraction digits and a 2-digit exponent; integers as
//    plain digits (no fraction, no exponent);
//  - strings with a pattern or format: characters raw (UTF-8) with the escapes JSON requires;
//    other strings: any escapes;
//  - property names and enum / const values are written in their compact canonical form.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "grammar/grammar.h"

namespace lilac::grammar {

using OrderedJson = nlohmann::ordered_json;

class SchemaError : public InputError {
 public:
  SchemaError(const std::string& msg, std::string keyword, std::string path, std::string param = "")
      : InputError(msg), keyword_(std::move(keyword)), path_(std::move(path)), param_(std::move(param)) {}
  const std::string& keyword() const { return keyword_; }  // may be empty
  const std::string& path() const { return path_; }        // JSON pointer, e.g. "#/properties/a"
  // Which schema of a request, when several are compiled together (e.g. "tools[1].function.parameters");
  // empty for a single schema.
  const std::string& param() const { return param_; }

 private:
  std::string keyword_, path_, param_;
};

struct SchemaLimits {
  size_t max_depth = 48;           // nesting of schema objects
  size_t max_nodes = 20000;        // schema objects in all
  size_t max_ref_depth = 256;      // subschemas compiled inside one another, through $ref included
  size_t max_states = 400000;      // grammar states in all
  size_t max_automaton = 50000;    // states of one determinized rule
  long max_items = 1024;           // minItems / maxItems / prefixItems counts
  long max_pattern_length = 1000;  // maxLength combined with a pattern or format
  // Subschemas visited again through $ref by oneOf's disjointness check and allOf's merge, in all: a few $defs whose
  // branches each name the next level many times expand exponentially.
  size_t max_expansion = 100000;
  // Steps of determinization (NFA states, edges and epsilon moves looked at) for all the automata of one compile:
  // a pattern of a few KB can make each of the 50,000 states of its automaton a set of thousands of NFA states.
  uint64_t max_automaton_work = 100'000'000;
};

// Compiles a schema (parsed keeping the order of keys: property order matters).
Grammar compile_json_schema(const OrderedJson& schema, const SchemaLimits& limits = {});
// The same from text; invalid JSON is a SchemaError.
Grammar compile_json_schema_text(std::string_view text, const SchemaLimits& limits = {});
// Any JSON object (response_format json_object).
Grammar json_object_grammar();

}  // namespace lilac::grammar
