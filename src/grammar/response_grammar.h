// The grammar of a whole model response under a request's constraints, in the model's own output
// format (text/model_format.h):
//
//   [reasoning]  free text (never the text of the closing markup) up to the </think> token, then at
//                most two newlines: only when the prompt left the model inside its reasoning block;
//                reasoning is never constrained;
//   content      response_format json_object / json_schema: one JSON document (schema.h), or free
//                text (never the text "<tool_call>") when only tool calls are constrained;
//   tool calls   <tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n...</function>\n</tool_call>
//                (or Qwen3's JSON form) for each call; with tool_choice auto they may follow free
//                content or replace the JSON document, several calls when parallel calls are allowed.
//
// Which calls are constrained: every call when the call is forced (tool_choice required / named:
// the prompt already opened the call), else the calls of tools with "strict": true. A constrained
// call's arguments follow the tool's `parameters` schema as the output parser reads them back
// (text/output_parser.h: parameter values typed by the schema's "type"):
//   - parameters in declared order, the required ones always (extra parameters are never written);
//   - a parameter whose types are all "string" (or that has no "type"): its value raw, no JSON
//     escapes, with minLength / maxLength / pattern / format / enum / const applied to the raw text,
//     never containing the markup that would end it early (</parameter>, <parameter=, </function>,
//     <tool_call>, </tool_call>); ["string", "null"]: such a text or null;
//   - other types: a JSON value of the schema (JSON strings inside write '<' as \u003c);
//   - other mixes of string and non-string types, and top-level keywords other than type (object),
//     properties, required, additionalProperties, $defs: a SchemaError for a strict tool; a forced
//     call of a tool that is not strict falls back to unconstrained arguments.
// A schema past the limits (SchemaLimits) is the same: a SchemaError for a strict tool, unconstrained arguments for
// a tool that is not strict. The tools that are not strict spend from a budget of their own (max_automaton_work,
// max_expansion), shared out between them, so that one past its share leaves the others' and the grammar's intact.
// A grammar that fails as a whole because of them is built again with them unconstrained: past max_states in all, the
// largest first until the rest fits (then all of them); a call forced by name whose parameters can never be satisfied,
// that tool (by `required`, where no tool's call can be, all of them). So is one whose parameters can never be
// satisfied beside tools whose calls can be written (it would be left out of the choice): that tool. A strict tool whose
// parameters can never be satisfied is a SchemaError naming it wherever its call is offered (tool_choice auto too, and
// the calls after one forced by name), never left out of the choice.
// Markup that the tokenizer has as a single added token (<tool_call>, </tool_call>, </think>) is
// that token; other markup is text.
#pragma once
#include <string>

#include "grammar/grammar.h"
#include "grammar/schema.h"
#include "text/model_format.h"

namespace lilac {
class Tokenizer;
}

namespace lilac::grammar {

struct ResponseSpec {
  enum class Content { Free, JsonObject, JsonSchema };
  enum class Calls { None, Auto, Forced };
  Content content = Content::Free;
  OrderedJson schema;            // JsonSchema
  OrderedJson tools;             // the request's tools array (OpenAI shape, validated); null when none
  Calls calls = Calls::None;     // Auto: the model may call tools; Forced: the prompt opened a call
  std::string forced_function;   // Forced: the prompt opened a call of this function ("": of any tool)
  bool in_reasoning = false;     // the prompt left the model inside its reasoning block
  bool xml_calls = true;         // the XML call form (else Qwen3's JSON form)
  bool parallel_calls = true;    // more than one call allowed

  // Whether anything is constrained (else generate without a grammar).
  bool constrained() const;
  // Identifies the grammar (GrammarCache key).
  std::string cache_key() const;
};

// Throws SchemaError for a schema that cannot be enforced; its param() names the request field
// ("response_format.json_schema.schema" or "tools[i].function.parameters"; "tools" for the tools' calls together: past
// SchemaLimits::max_states in all though each tool fits alone, or too many tool names to constrain).
Grammar build_response_grammar(const ResponseSpec& spec, const FormatMarkup& markup, const Tokenizer& tok,
                               const SchemaLimits& lim = {});

}  // namespace lilac::grammar
