// lilac's Jinja interpreter: the subset of Jinja2 that real chat templates use, rendering byte for
// byte like Hugging Face's environment (jinja2 ImmutableSandboxedEnvironment with trim_blocks,
// lstrip_blocks, loopcontrols; tojson = json.dumps(ensure_ascii=False); raise_exception).
//
// Supported: {{ }}, {% %}, {# #}, whitespace control (- and +), {% raw %}; statements if/elif/else,
// for (tuple targets, `if` filter, else, loop.*, break/continue), set (names, namespace attributes,
// tuples, block set), macro (defaults, keyword arguments), filter blocks, generation blocks;
// Python-like expressions, filters, tests, string/dict/list methods (lists: jinja_filters.cpp,
// jinja_pyops.cpp). Files: jinja_lexer.cpp, jinja_parser.cpp (syntax tree: jinja_ast.h), jinja_pyops.cpp +
// jinja_filters.cpp (Python-compatible builtins: jinja_builtins.h), jinja.cpp (the interpreter).
// Template errors throw lilac::Error naming the origin, line and column.
#pragma once
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

namespace lilac::jinja {

struct Options {
  bool trim_blocks = true;             // remove the first newline after a block tag
  bool lstrip_blocks = true;           // strip spaces/tabs before a block tag at the start of a line
  bool keep_trailing_newline = false;  // jinja2's default drops one trailing newline of the source
};

class Template {
 public:
  // Parses `source`; throws lilac::Error("<origin>:<line>:<col>: ...") on syntax errors.
  explicit Template(const std::string& source, const std::string& origin = "<template>", Options options = {});
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  // Renders with the given top-level variables (a JSON object). Throws lilac::Error on template
  // errors and raise_exception() (the message included).
  std::string render(const nlohmann::ordered_json& variables) const;

  const std::string& origin() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace lilac::jinja
