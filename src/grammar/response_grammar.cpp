#include "grammar/response_grammar.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <set>
#include <vector>

#include "grammar/regex.h"
#include "grammar/schema_internal.h"
#include "text/tokenizer.h"

namespace lilac::grammar {

namespace {

using detail::Json;
using detail::SchemaCompiler;

bool is_strict(const Json& tool) {
  const Json& f = tool["function"];
  return f.is_object() && f.contains("strict") && f["strict"].is_boolean() && f["strict"].get<bool>();
}

constexpr char kContentParam[] = "response_format.json_schema.schema";

// A schema whose automata pass their bounds, as the schema error of the request field `param` that holds it.
SchemaError too_large(const SizeError& e, const std::string& param) {
  return SchemaError(std::string("schema too large: ") + e.what(), "", "#", param);
}

// The types the output parser reads a parameter value as (output_parser.cpp: `type`, a string or a
// list, and the types of anyOf / oneOf branches, recursively).
void parser_types(const Json& s, std::set<std::string>& out) {
  if (!s.is_object()) return;
  if (auto t = s.find("type"); t != s.end()) {
    if (t->is_string()) out.insert(t->get<std::string>());
    if (t->is_array())
      for (const auto& x : *t)
        if (x.is_string()) out.insert(x.get<std::string>());
  }
  for (const char* k : {"anyOf", "oneOf"})
    if (auto a = s.find(k); a != s.end() && a->is_array())
      for (const auto& sub : *a) parser_types(sub, out);
}

// States a call of free arguments adds to a grammar at most (its own rule, and the rules of any parameter or any
// object it shares with the other free calls), for the estimate of what leaving a tool's call free saves.
constexpr size_t kFreeCallStates = 256;

class Builder {
 public:
  // `freed`: the tools that are not strict whose calls are left free (their arguments any parameters or any object)
  // though the call is forced, because a grammar that constrained them could not be built (see build_response_grammar).
  Builder(const ResponseSpec& spec, const FormatMarkup& mk, const Tokenizer& tok, const SchemaLimits& lim,
          const std::vector<uint8_t>& freed)
      : spec_(spec), mk_(mk), tok_(tok), sc_(empty_, lim), freed_(freed), loose_work_(lim.max_automaton_work),
        loose_expansion_(lim.max_expansion) {
    const size_t n = spec_.tools.is_array() ? spec_.tools.size() : 0;
    bodies_.assign(n, -1);
    for (size_t i = 0; i < n; ++i) loose_tools_ += loose(i);
  }

  // The grammar; nullopt when it fails as a whole (past SchemaLimits::max_states, or a root that matches nothing)
  // because of forced calls of tools that are not strict, or when such a call matches nothing beside others (it would
  // be left out of the choice): build again with those of to_free() freed.
  std::optional<Grammar> build();
  const std::vector<size_t>& to_free() const { return to_free_; }

 private:
  // Markup: its added token when the tokenizer has one, else its bytes.
  void markup(Nfa& nfa, int32_t from, std::string_view text, int32_t to);
  int32_t chain(Nfa& nfa, int32_t from, std::string_view bytes) { return nfa.add_literal(from, bytes); }
  int32_t call(Nfa& nfa, int32_t from, int32_t rule) {
    const int32_t s = nfa.add_state();
    nfa.add_call(from, rule, s);
    return s;
  }
  int32_t rule(const Nfa& nfa, const std::string& name) { return sc_.add_rule(nfa, name); }

  int32_t reasoning();
  int32_t document();
  int32_t call_body();              // after "<tool_call>\n", up to </tool_call>
  int32_t call_of(size_t i);        // function_body(i) or arguments(i), built once per grammar
  int32_t function_body(size_t i);  // XML: after "<function=NAME>\n", up to </tool_call>
  int32_t arguments(size_t i);      // JSON form: the arguments object, then "}\n</tool_call>"
  void parameters(size_t i, Nfa& nfa, int32_t from, int32_t end);
  int32_t close_call(Nfa& nfa, int32_t at, const std::string& name);  // </tool_call>, accept
  // Any number of parameters with any names and values (from -> end, looping).
  void free_parameters(Nfa& nfa, int32_t from, int32_t end);
  // What a raw parameter value never contains (the markup that would end it early).
  std::vector<std::string> forbidden_in_values() const;
  bool constrains(size_t i) const {
    return (spec_.calls == ResponseSpec::Calls::Forced && !freed_[i]) || is_strict(tool(i));
  }
  bool loose(size_t i) const { return constrains(i) && !is_strict(tool(i)); }  // constrained, may be freed
  const Json& tool(size_t i) const { return spec_.tools[i]; }
  std::string tool_name(size_t i) const { return tool(i)["function"]["name"].get<std::string>(); }
  std::string param_of(size_t i) const { return "tools[" + std::to_string(i) + "].function.parameters"; }
  size_t tool_index(const std::string& name) const;
  int32_t rules_now() { return int32_t(sc_.grammar().rules.size()); }
  // The request field a failure of the whole grammar (finish_grammar) concerns: that of the rule that matches nothing,
  // or (rule -1) that of the states past SchemaLimits::max_states.
  std::string param_of_failure(int32_t rule);
  // The tools that are not strict to free for such a failure (none: the failure is the request's).
  std::vector<size_t> tools_to_free(int32_t rule);
  void more_calls(Nfa& nfa, int32_t after_call);
  // Throws the SchemaError of strict tool i, whose call matches nothing: its call alone is built (forced by name, one
  // call) and fails as its root, naming the deepest schema that matches nothing.
  [[noreturn]] void unsatisfiable(size_t i);

  const ResponseSpec& spec_;
  const FormatMarkup& mk_;
  const Tokenizer& tok_;
  const Json empty_ = Json::object();
  SchemaCompiler sc_;
  const std::vector<uint8_t>& freed_;
  std::vector<size_t> to_free_;
  int32_t call_body_ = -1;
  int32_t name_rule_ = -1;
  // A tool's call once built (call_of): a forced call by name builds it first, the calls after it again; a second
  // compile of a schema that failed would find the rules the first reserved and abandoned (matching nothing).
  std::vector<int32_t> bodies_;
  // Where the rules came from, for the errors of the whole grammar: the request field of the JSON document's schema or
  // of a tool's call, and the rules [first, last) built for it (a rule shared with a later one counts as the first's).
  struct Source {
    std::string param;
    int32_t first, last;
    size_t tool = SIZE_MAX;  // a tool's call: the tool's index
  };
  // The states of a source's rules, as Grammar::finalize counts them.
  size_t states_of(const Source& s) { return sc_.grammar().states(size_t(s.first), size_t(s.last)); }
  std::vector<Source> sources_;

  // Tools that are not strict are constrained only in a forced call, and fall back to free arguments when their schema
  // cannot be compiled. Their compiles spend from a pool of their own, as large as the grammar's budget
  // (SchemaLimits::max_automaton_work, max_expansion), each at most its share of it: what is left of the pool over the
  // number of such tools still to compile. One that passes its share falls back alone, and the strict tools,
  // response_format and the other tools that are not strict keep their budgets (a grammar's compile spends at most
  // twice the limits).
  uint64_t loose_work_;
  size_t loose_expansion_;
  size_t loose_tools_ = 0;  // tools that are not strict and are constrained, still to compile
  // While alive, the compiler spends from the share of the next tool that is not strict.
  class LooseShare {
   public:
    explicit LooseShare(Builder& b)
        : b_(b), share_{WorkBudget(b.loose_work_ / std::max<size_t>(b.loose_tools_, 1)),
                        b.loose_expansion_ / std::max<size_t>(b.loose_tools_, 1)},
          expansion_(share_.expansion) {
      b_.sc_.swap_budget(share_);
    }
    ~LooseShare() {
      b_.sc_.swap_budget(share_);
      b_.loose_work_ -= share_.work.spent();
      b_.loose_expansion_ -= expansion_ - share_.expansion;
      if (b_.loose_tools_ > 0) --b_.loose_tools_;
    }
    LooseShare(const LooseShare&) = delete;
    LooseShare& operator=(const LooseShare&) = delete;

   private:
    Builder& b_;
    SchemaCompiler::Budget share_;
    size_t expansion_;
  };
};

void Builder::markup(Nfa& nfa, int32_t from, std::string_view text, int32_t to) {
  const auto id = tok_.token_id(text);
  if (!id || !tok_.is_added(*id)) {
    nfa.add_literal_to(from, text, to);
    return;
  }
  auto& sp = sc_.grammar().special_tokens;
  auto it = std::find(sp.begin(), sp.end(), *id);
  if (it == sp.end()) {
    sp.push_back(*id);
    it = sp.end() - 1;
  }
  const Sym sym = Sym(kByteSyms + (it - sp.begin()));
  nfa.add_range(from, sym, sym, to);
}

size_t Builder::tool_index(const std::string& name) const {
  for (size_t i = 0; i < spec_.tools.size(); ++i)
    if (tool_name(i) == name) return i;
  throw InputError("no tool named '" + name + "'");
}

int32_t Builder::reasoning() {
  Nfa nfa;
  const int32_t text = call(nfa, nfa.start(), sc_.free_text_rule({std::string(mk_.think_close)}));
  const int32_t closed = nfa.add_state(), nl = nfa.add_state(), nl2 = nfa.add_state();
  markup(nfa, text, mk_.think_close, closed);
  nfa.add_range(closed, '\n', '\n', nl);
  nfa.add_range(nl, '\n', '\n', nl2);
  for (int32_t s : {closed, nl, nl2}) nfa.set_accept(s);
  return rule(nfa, "the reasoning block");
}

int32_t Builder::document() {
  const int32_t first = rules_now();
  int32_t value;
  try {
    if (spec_.content == ResponseSpec::Content::JsonObject) {
      value = sc_.any_object_rule();
    } else {
      detail::check_schema(spec_.schema, sc_.limits());
      sc_.set_root(spec_.schema, "response_format:");
      value = sc_.value_rule(spec_.schema, "#");
    }
  } catch (const SchemaError& e) {
    throw SchemaError(e.what(), e.keyword(), e.path(), kContentParam);
  } catch (const SizeError& e) {
    throw too_large(e, kContentParam);
  }
  Nfa nfa;
  const int32_t ws = sc_.ws_rule();
  nfa.set_accept(call(nfa, call(nfa, call(nfa, nfa.start(), ws), value), ws));
  const int32_t doc = rule(nfa, "the JSON document");
  if (spec_.content == ResponseSpec::Content::JsonSchema) sources_.push_back({kContentParam, first, rules_now()});
  return doc;
}

// XML: the parameters in declared order (optional ones may be left out), then </function>.
void Builder::parameters(size_t i, Nfa& nfa, int32_t from, int32_t end) {
  const Json& f = tool(i)["function"];
  const Json& params = f.contains("parameters") && f["parameters"].is_object() ? f["parameters"] : empty_;
  detail::check_schema(params, sc_.limits());
  for (const auto& [k, v] : params.items()) {
    if (!detail::is_constraint(k) || k == "properties" || k == "required" || k == "additionalProperties") continue;
    if (k == "type" && v == "object") continue;
    detail::fail(detail::child_path("#", k), k,
                 "\"" + k + "\" at the top of a tool's parameters is not supported in the XML tool-call format");
  }
  sc_.set_root(params, "tools[" + std::to_string(i) + "]:");
  sc_.set_xml_safe(true);
  const detail::ObjectSpec os = sc_.object_spec(params, "#");
  const size_t n = os.props.size();
  const std::vector<std::string> forbidden = forbidden_in_values();
  std::vector<int32_t> entry(n), after(n);
  for (size_t j = 0; j < n; ++j) {
    const detail::Property& p = os.props[j];
    if (p.name.empty() || p.name.find_first_of(">\n\r\t ") != std::string::npos)
      detail::fail(p.path, "properties", "parameter name \"" + p.name + "\" cannot be written in the XML tool-call format");
    entry[j] = nfa.add_state();
    const int32_t open = chain(nfa, entry[j], std::string(mk_.parameter_open) + p.name + ">\n");
    const int32_t close = nfa.add_state();
    const Json any = Json::object();
    const Json& schema = p.schema ? *p.schema : any;
    std::set<std::string> types;
    parser_types(schema, types);
    const bool has_string = types.count("string") > 0;
    types.erase("string");
    if (types.empty()) {  // read as a string: written raw
      std::string tp = p.path;
      const Json* target = &schema;
      for (int hops = 0; target->is_object() && target->contains("$ref") && hops < 16; ++hops) {
        const std::string at = tp;
        target = &detail::resolve_ref(params, (*target)["$ref"].get<std::string>(), at, tp);
      }
      nfa.add_call(open, sc_.raw_text_rule(*target, tp, forbidden), close);
    } else if (!has_string) {  // read as JSON
      nfa.add_call(open, sc_.value_rule(schema, p.path), close);
    } else if (types == std::set<std::string>{"null"}) {  // a raw string, or null
      const Json* str = &schema;
      for (const char* k : {"anyOf", "oneOf"})
        if (auto a = schema.find(k); a != schema.end())
          for (const auto& b : *a)
            if (b.is_object() && b.contains("type") && b["type"] == "string") str = &b;
      nfa.add_call(open, sc_.raw_text_rule(*str, p.path, forbidden), close);
      nfa.add_literal_to(open, "null", close);
    } else {
      detail::fail(p.path, "type",
                   "a tool parameter that is a string or another type (not only null) cannot be read back from "
                   "the XML tool-call format");
    }
    after[j] = chain(nfa, close, "\n" + std::string(mk_.parameter_close) + "\n");
  }
  std::vector<size_t> next_req(n + 1, n);
  for (size_t j = n; j-- > 0;) next_req[j] = os.props[j].required ? j : next_req[j + 1];
  auto choices = [&](int32_t x, size_t first) {
    const size_t last = next_req[first] == n ? n : next_req[first] + 1;
    for (size_t k = first; k < last; ++k) nfa.add_eps(x, entry[k]);
    if (next_req[first] == n) nfa.add_eps(x, end);
  };
  choices(from, 0);
  for (size_t j = 0; j < n; ++j) choices(after[j], j + 1);
  sc_.set_xml_safe(false);
}

int32_t Builder::close_call(Nfa& nfa, int32_t at, const std::string& name) {
  const int32_t done = nfa.add_state();
  markup(nfa, at, mk_.tool_close, done);
  nfa.set_accept(done);
  return rule(nfa, name);
}

int32_t Builder::call_of(size_t i) {
  if (bodies_[i] < 0) {
    const int32_t first = rules_now();
    bodies_[i] = spec_.xml_calls ? function_body(i) : arguments(i);
    sources_.push_back({param_of(i), first, rules_now(), i});
  }
  return bodies_[i];
}

std::string Builder::param_of_failure(int32_t rule) {
  if (rule >= 0) {
    for (const Source& s : sources_)
      if (rule >= s.first && rule < s.last) return s.param;
    return "";
  }
  // Past max_states: one schema's rules alone past it name that schema; else the JSON document's and the tools' calls
  // together each fit, and the one holding more states is named ("tools": all the calls).
  size_t content = 0, tools = 0;
  for (const Source& s : sources_) {
    const size_t n = states_of(s);
    if (n > sc_.limits().max_states) return s.param;
    (s.param == kContentParam ? content : tools) += n;
  }
  if (content == 0 && tools == 0) return "";
  return tools >= content ? "tools" : kContentParam;
}

std::vector<size_t> Builder::tools_to_free(int32_t rule) {
  std::vector<size_t> out;
  if (rule >= 0) {
    // A root that matches nothing (only a forced call's can: other responses may be text) is the forced call's: by
    // name, that tool's parameters can never be satisfied, and it is freed if it is not strict; else no tool's call
    // can, and those that are not strict are freed (a strict one that matches nothing is then the request's error, as
    // it is beside any tool whose call can be written: build).
    if (!spec_.forced_function.empty()) {
      const size_t i = tool_index(spec_.forced_function);
      return loose(i) ? std::vector<size_t>{i} : std::vector<size_t>{};
    }
    for (size_t i = 0; i < bodies_.size(); ++i)
      if (loose(i)) out.push_back(i);
    return out;
  }
  // Past max_states: the largest tools that are not strict, until the states left (a free call counted as
  // kFreeCallStates) fit; none when the rest would not fit even with all of them free (the strict tools' or the
  // content schema's states: the request's error).
  std::vector<std::pair<size_t, size_t>> sizes;  // (states, tool)
  size_t loose_states = 0;
  for (const Source& s : sources_)
    if (s.tool != SIZE_MAX && loose(s.tool)) {
      sizes.emplace_back(states_of(s), s.tool);
      loose_states += sizes.back().first;
    }
  size_t total = sc_.grammar().total_states();
  if (total - loose_states > sc_.limits().max_states) return out;
  std::sort(sizes.begin(), sizes.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (const auto& [n, i] : sizes) {
    if (total <= sc_.limits().max_states) break;
    out.push_back(i);
    total = total - n + std::min(n, kFreeCallStates);
  }
  return out;
}

void Builder::unsatisfiable(size_t i) {
  ResponseSpec alone = spec_;
  alone.calls = ResponseSpec::Calls::Forced;
  alone.forced_function = tool_name(i);
  alone.parallel_calls = false;
  build_response_grammar(alone, mk_, tok_, sc_.limits());
  // (Alone it matched something: its call matched nothing only among the others' rules.)
  detail::fail("#", "", "the schema can never be satisfied (the call of " + tool_name(i) + " matches nothing)",
               param_of(i));
}

int32_t Builder::function_body(size_t i) {
  if (constrains(i)) {
    try {
      std::optional<LooseShare> share;  // (given back before the fallback below is built)
      if (!is_strict(tool(i))) share.emplace(*this);
      Nfa nfa;
      const int32_t end = nfa.add_state();
      parameters(i, nfa, nfa.start(), end);
      return close_call(nfa, chain(nfa, end, std::string(mk_.function_close) + "\n"), "the call of " + tool_name(i));
    } catch (const SchemaError& e) {
      sc_.set_xml_safe(false);
      if (is_strict(tool(i))) throw SchemaError(e.what(), e.keyword(), e.path(), param_of(i));
    } catch (const SizeError& e) {  // the tool's schema error too (as response_format's in document())
      sc_.set_xml_safe(false);
      if (is_strict(tool(i))) throw too_large(e, param_of(i));
    }
  }
  // Unconstrained arguments: any parameters with any values, in the format the parser reads.
  Nfa nfa;
  const int32_t end = nfa.add_state();
  free_parameters(nfa, nfa.start(), end);
  return close_call(nfa, chain(nfa, end, std::string(mk_.function_close) + "\n"), "the call of " + tool_name(i));
}

void Builder::free_parameters(Nfa& nfa, int32_t from, int32_t end) {
  if (name_rule_ < 0) {
    Nfa n;
    const int32_t e = n.add_state();
    n.set_accept(e);
    add_pattern(n, n.start(), "[^<>\\s]+", Encoding::Utf8, e, false);
    name_rule_ = sc_.add_rule(n, "a parameter name", "xml-parameter-name");
  }
  const int32_t value = sc_.free_text_rule(forbidden_in_values());
  nfa.add_eps(from, end);
  const int32_t open = chain(nfa, from, std::string(mk_.parameter_open));
  const int32_t named = chain(nfa, call(nfa, open, name_rule_), ">\n");
  const int32_t valued = call(nfa, named, value);
  nfa.add_literal_to(valued, "\n" + std::string(mk_.parameter_close) + "\n", from);
}

std::vector<std::string> Builder::forbidden_in_values() const {
  return {std::string(mk_.parameter_close), std::string(mk_.parameter_open), std::string(mk_.function_close),
          std::string(mk_.tool_open), std::string(mk_.tool_close)};
}

int32_t Builder::arguments(size_t i) {
  const Json& f = tool(i)["function"];
  const Json& params = f.contains("parameters") && f["parameters"].is_object() ? f["parameters"] : empty_;
  int32_t value = -1;
  sc_.set_xml_safe(true);
  if (constrains(i)) {
    try {
      std::optional<LooseShare> share;  // (given back before the fallback below is built)
      if (!is_strict(tool(i))) share.emplace(*this);
      detail::check_schema(params, sc_.limits());
      sc_.set_root(params, "tools[" + std::to_string(i) + "]:");
      value = sc_.value_rule(params, "#");
    } catch (const SchemaError& e) {
      if (is_strict(tool(i))) {
        sc_.set_xml_safe(false);
        throw SchemaError(e.what(), e.keyword(), e.path(), param_of(i));
      }
    } catch (const SizeError& e) {
      if (is_strict(tool(i))) {
        sc_.set_xml_safe(false);
        throw too_large(e, param_of(i));
      }
    }
  }
  if (value < 0) value = sc_.any_object_rule();
  sc_.set_xml_safe(false);
  Nfa nfa;
  return close_call(nfa, chain(nfa, call(nfa, nfa.start(), value), "}\n"), "the call of " + tool_name(i));
}

int32_t Builder::call_body() {
  if (call_body_ >= 0) return call_body_;
  Nfa nfa;
  const int32_t end = nfa.add_state();
  nfa.set_accept(end);
  for (size_t i = 0; i < spec_.tools.size(); ++i) {
    const std::string name = tool_name(i);
    if (spec_.xml_calls) {
      const int32_t s = chain(nfa, nfa.start(), std::string(mk_.function_open) + name + ">\n");
      nfa.add_call(s, call_of(i), end);
    } else {
      const int32_t s = chain(nfa, nfa.start(), "{\"name\": \"" + name + "\", \"arguments\": ");
      nfa.add_call(s, call_of(i), end);
    }
  }
  return call_body_ = rule(nfa, "a tool call");
}

// After a call (state `m`): more calls, each opened by <tool_call> after at most two newlines.
void Builder::more_calls(Nfa& nfa, int32_t m) {
  nfa.set_accept(m);
  if (!spec_.parallel_calls) return;
  const int32_t nl = nfa.add_state(), nl2 = nfa.add_state(), open = nfa.add_state();
  nfa.add_range(m, '\n', '\n', nl);
  nfa.add_range(nl, '\n', '\n', nl2);
  for (int32_t s : {m, nl, nl2}) markup(nfa, s, mk_.tool_open, open);
  nfa.add_call(chain(nfa, open, "\n"), call_body(), m);
}

std::optional<Grammar> Builder::build() {
  using C = ResponseSpec::Calls;
  const bool calls = spec_.calls != C::None && spec_.tools.is_array() && !spec_.tools.empty();
  Nfa nfa;
  int32_t s = nfa.start();
  if (spec_.in_reasoning && spec_.calls != C::Forced) s = call(nfa, s, reasoning());
  if (calls && spec_.calls == C::Forced) {
    int32_t body;
    if (spec_.forced_function.empty()) {
      body = call_body();
    } else {
      const size_t i = tool_index(spec_.forced_function);
      body = call_of(i);
    }
    more_calls(nfa, call(nfa, s, body));
  } else {
    int32_t before_call;  // where a call may start (-1: none)
    if (spec_.content == ResponseSpec::Content::Free) {
      const int32_t c = call(nfa, s, sc_.free_text_rule({std::string(mk_.tool_open)}));
      nfa.set_accept(c);
      before_call = c;
    } else {
      nfa.set_accept(call(nfa, s, document()));
      before_call = call(nfa, s, sc_.ws_rule());
    }
    if (calls) {
      const int32_t open = nfa.add_state();
      markup(nfa, before_call, mk_.tool_open, open);
      more_calls(nfa, call(nfa, chain(nfa, open, "\n"), call_body()));
    }
  }
  std::optional<Grammar> g;
  try {
    g = sc_.finish_grammar(rule(nfa, "the response"), [this](int32_t r) {
      to_free_ = tools_to_free(r);
      return param_of_failure(r);
    });
  } catch (const SchemaError&) {
    if (!to_free_.empty()) return std::nullopt;
    throw;
  }
  // A constrained call that matches nothing, beside calls that can be written (or free content): finalize pruned it
  // from the choice (the root still matches), so that the tool could never be called. A strict tool promises arguments
  // that conform, and none can: the request's error, naming it, wherever its call is offered (auto, a forced choice,
  // a call after one forced by name). The schema of a tool that is not strict is advice, not a constraint: free it as
  // for a root that matches nothing.
  for (size_t i = 0; i < bodies_.size(); ++i)
    if (bodies_[i] >= 0 && is_strict(tool(i)) && g->matches_nothing(bodies_[i])) unsatisfiable(i);
  for (size_t i = 0; i < bodies_.size(); ++i)
    if (bodies_[i] >= 0 && loose(i) && g->matches_nothing(bodies_[i])) to_free_.push_back(i);
  if (!to_free_.empty()) return std::nullopt;
  return g;
}

}  // namespace

bool ResponseSpec::constrained() const {
  if (content != Content::Free || calls == Calls::Forced) return true;
  if (calls == Calls::Auto && tools.is_array())
    for (const auto& t : tools)
      if (is_strict(t)) return true;
  return false;
}

std::string ResponseSpec::cache_key() const {
  std::string k = "response:" + std::to_string(int(content)) + ":" + std::to_string(int(calls)) + ":" +
                  (in_reasoning ? "r" : "") + (xml_calls ? "x" : "j") + (parallel_calls ? "p" : "") + ":" +
                  forced_function + "\x01";
  if (content == Content::JsonSchema) k += dump_json(schema);
  k += '\x01';
  if (calls != Calls::None) k += dump_json(tools);
  return k;
}

Grammar build_response_grammar(const ResponseSpec& spec, const FormatMarkup& markup, const Tokenizer& tok,
                               const SchemaLimits& lim) {
  // A forced call constrains the tools that are not strict too, and their schemas fall back to free arguments when they
  // cannot be compiled alone (Builder::function_body, arguments). A grammar that fails as a whole because of them (past
  // max_states in all, or a forced call that matches nothing), or whose forced choice left out the call of one that
  // matches nothing, is built again with the ones responsible freed: the largest first for the states, else the ones
  // whose calls match nothing. A third build, with all of them freed, only when the second still fails (the estimate of
  // the states a tool held missed rules it shared with another); what fails then is the strict tools' or the content
  // schema's, the request's error.
  const size_t n = spec.tools.is_array() ? spec.tools.size() : 0;
  std::vector<uint8_t> freed(n, 0);
  for (int round = 0;; ++round) {
    std::optional<Grammar> g;
    std::vector<size_t> more;
    try {
      Builder b(spec, markup, tok, lim, freed);
      g = b.build();
      more = b.to_free();
    } catch (const SizeError& e) {  // outside any one schema: the calls of many tools (their names)
      throw SchemaError(std::string("the tools are too many to constrain their calls: ") + e.what(), "", "#", "tools");
    }
    if (g) return std::move(*g);
    if (round == 0) {
      for (size_t i : more) freed[i] = 1;
    } else {  // (the tools freed were not enough: the rest of those not strict)
      for (size_t i = 0; i < n; ++i)
        if (!is_strict(spec.tools[i])) freed[i] = 1;
    }
  }
}

}  // namespace lilac::grammar
