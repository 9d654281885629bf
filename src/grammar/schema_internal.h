// Internals of the JSON Schema compiler (schema.h), shared by schema_*.cpp.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "grammar/automaton.h"
#include "grammar/charset.h"
#include "grammar/grammar.h"
#include "grammar/schema.h"
#include "text/json_dump.h"  // a schema's values as JSON text (client text: dump_json)

namespace lilac::grammar::detail {

using Json = OrderedJson;

// Throws SchemaError "msg at path"; param: the request field, where the grammar holds several schemas.
[[noreturn]] void fail(const std::string& path, const std::string& keyword, const std::string& msg,
                       const std::string& param = "");
std::string child_path(const std::string& path, std::string_view key);
bool is_annotation(std::string_view key);
// Keywords that constrain (everything but annotations and $defs / definitions).
bool is_constraint(std::string_view key);

// Checks every keyword of the schema tree ($defs included) and the shape of its value.
void check_schema(const Json& root, const SchemaLimits& lim);

// Resolves a local reference ("#", "#/$defs/a", any JSON pointer into the root document).
const Json& resolve_ref(const Json& root, const std::string& ref, const std::string& at, std::string& target_path);

// The pattern (regex.h syntax, whole-string match) of a supported format.
std::string format_pattern(const std::string& format);

// JSON types as bits.
enum TypeBit : unsigned {
  kNull = 1,
  kBoolean = 2,
  kObject = 4,
  kArray = 8,
  kString = 16,
  kInteger = 32,
  kNumber = 64,
  kAnyType = 127,
};
// The types a node's value may take: `type` if given, else inferred from type-specific keywords,
// else kAnyType. 0 for a node that is only a combinator ($ref / anyOf / oneOf / allOf / enum / const).
unsigned declared_types(const Json& node);
bool value_has_type(const Json& v, unsigned types);
// Integer value of a count keyword (minItems ...); the checker has validated it.
int64_t count_value(const Json& v);

struct Property {
  std::string name;
  const Json* schema;  // nullptr: any value
  std::string path;
  bool required = false;
};

struct ObjectSpec {
  std::vector<Property> props;  // declared order
  bool extra = false;           // other names allowed (additionalProperties true or a schema)
  const Json* extra_schema = nullptr;  // their values (nullptr: any value)
  std::string extra_path;
};

// Builds the rules of one grammar from one or more schema roots (each root: $refs resolve inside it).
class SchemaCompiler {
 public:
  SchemaCompiler(const Json& root, const SchemaLimits& lim)
      : root_(&root), lim_(lim), expansion_left_(lim.max_expansion), work_(lim.max_automaton_work) {}

  // The document: whitespace, one value of the root, whitespace.
  Grammar document();
  // The document for response_format json_object.
  Grammar object_document();

  // ---- building blocks for other grammars (response_grammar.cpp)
  // Compile values of another schema document from now on; `scope` keeps its paths apart.
  void set_root(const Json& root, const std::string& scope) {
    root_ = &root;
    scope_ = scope;
  }
  // Finalizes the grammar with `root` as its root rule (errors as for document()). `param_of`, for a grammar of several
  // schemas (response_grammar.cpp), names the request field its SchemaError concerns: that of the rule that matches
  // nothing, or (rule -1) that of the states past SchemaLimits::max_states.
  Grammar finish_grammar(int32_t root, const std::function<std::string(int32_t rule)>& param_of = nullptr);
  Grammar& grammar() { return g_; }
  // JSON written inside markup (tool-call parameter values): '<' only as \u003c in strings, so that
  // no string can spell the markup that ends the value.
  void set_xml_safe(bool on) { xml_safe_ = on; }
  const SchemaLimits& limits() const { return lim_; }
  // Steps of determinization spent so far (of lim_.max_automaton_work).
  uint64_t work_spent() const { return work_.spent(); }
  // What compiling spends from: steps of determinization (max_automaton_work) and the subschemas oneOf's check and
  // allOf's merge may still visit (max_expansion). A builder that compiles a schema whose failure is not the grammar's
  // (a forced call's tool that is not strict falls back to free arguments) swaps in a budget of its own for it, and
  // back after, so that a schema that spends all of its budget leaves the one of the rest of the grammar untouched.
  struct Budget {
    WorkBudget work;
    size_t expansion;
  };
  void swap_budget(Budget& b) {
    std::swap(work_, b.work);
    std::swap(expansion_left_, b.expansion);
  }

  // schema_compiler.cpp
  int32_t value_rule(const Json& node, const std::string& path);
  int32_t add_rule(const Nfa& nfa, const std::string& name, const std::string& share_key = "");
  // schema_objects.cpp
  ObjectSpec object_spec(const Json& node, const std::string& path);
  // schema_scalars.cpp
  int32_t ws_rule();
  int32_t any_object_rule();
  // schema_text.cpp: text outside JSON strings (tool-call parameter values, free text).
  // A string-typed schema's values written raw (UTF-8, no escapes), never containing `forbidden`.
  int32_t raw_text_rule(const Json& node, const std::string& path, const std::vector<std::string>& forbidden);
  // Any bytes that never contain one of `forbidden`.
  int32_t free_text_rule(const std::vector<std::string>& forbidden);

 private:
  // schema_compiler.cpp
  void build_value(const Json& node, const std::string& path, Nfa& nfa, int32_t from, int32_t to);
  void build_types(const Json& node, const std::string& path, unsigned types, Nfa& nfa, int32_t from, int32_t to);
  void build_literals(const Json& node, const std::string& path, Nfa& nfa, int32_t from, int32_t to);
  void check_one_of(const Json& node, const std::string& path);
  int32_t reserve(const std::string& name);
  int32_t nothing_rule(const std::string& path);
  Grammar finish(int32_t value);

  // schema_objects.cpp
  ObjectSpec merge_all_of(const Json& node, const std::string& path);
  int32_t object_rule(const ObjectSpec& spec, const std::string& path);
  int32_t extra_key_rule(const ObjectSpec& spec, const std::string& path);
  int32_t array_rule(const Json& node, const std::string& path);

  // schema_scalars.cpp
  int32_t any_value_rule();
  int32_t string_rule(int64_t min_chars, int64_t max_chars);
  int32_t string_value_rule(const Json& node, const std::string& path);
  int32_t number_rule();
  int32_t integer_rule(const Json& node, const std::string& path);
  int32_t integer_range_rule(std::optional<int64_t> lo, std::optional<int64_t> hi);
  // Shared rule lookup: the id of the rule with this share key, or -1.
  int32_t shared(const std::string& key) const;
  // A share key of a rule whose strings depend on the xml-safe mode.
  std::string mode_key(const std::string& k) const { return xml_safe_ ? k + "!x" : k; }
  Encoding string_encoding() const { return xml_safe_ ? Encoding::JsonStringXmlSafe : Encoding::JsonString; }
  // The compact JSON text of a value, xml-safe when the mode says so.
  std::string literal(const Json& v) const;

  const Json* root_;
  std::string scope_;  // prefix of by_path_ keys (one per schema root)
  bool xml_safe_ = false;
  SchemaLimits lim_;
  size_t expansion_left_;  // of lim_.max_expansion: subschemas oneOf's check and allOf's merge may still visit
  WorkBudget work_;  // of lim_.max_automaton_work: every determinize of this compile spends from it
  Grammar g_;
  std::unordered_map<std::string, int32_t> by_path_;
  size_t active_ = 0;  // value_rule calls in progress (the recursion's depth)
  std::unordered_map<std::string, int32_t> shared_;
};

}  // namespace lilac::grammar::detail
