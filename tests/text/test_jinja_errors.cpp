// Jinja errors: syntax and runtime errors name the template origin, line and column;
// raise_exception's message is carried; undefined values follow jinja2's default Undefined.
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/jinja.h"

namespace {

using lilac::jinja::Template;
using nlohmann::ordered_json;

std::string error_of(const std::string& src, const ordered_json& vars = ordered_json::object()) {
  try {
    Template t(src, "tmpl.jinja");
    t.render(vars);
  } catch (const lilac::Error& e) {
    return e.what();
  }
  return "<no error>";
}

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }

TEST(JinjaErrors, SyntaxErrorsHaveLineAndColumn) {
  std::string e = error_of("{% if x %}\n  {{ x + }}\n{% endif %}");
  EXPECT_TRUE(starts_with(e, "tmpl.jinja:2:10: ")) << e;
  e = error_of("line1\n{% foo %}");
  EXPECT_TRUE(starts_with(e, "tmpl.jinja:2:4: ")) << e;
  EXPECT_NE(e.find("foo"), std::string::npos) << e;
  e = error_of("{% for x in y %}\nabc");
  EXPECT_NE(e.find("endfor"), std::string::npos) << e;
  EXPECT_TRUE(starts_with(e, "tmpl.jinja:2:")) << e;
  e = error_of("a\nb {{ x | nosuchfilter }}");
  EXPECT_TRUE(starts_with(e, "tmpl.jinja:2:10: ")) << e;
  EXPECT_NE(e.find("nosuchfilter"), std::string::npos) << e;
  e = error_of("{{ x is nosuchtest }}");
  EXPECT_TRUE(starts_with(e, "tmpl.jinja:1:9: ")) << e;
  e = error_of("{{ 'unterminated }}");
  EXPECT_TRUE(starts_with(e, "tmpl.jinja:1:4: ")) << e;
  e = error_of("{# never closed");
  EXPECT_TRUE(starts_with(e, "tmpl.jinja:1:1: ")) << e;
  e = error_of("{% break %}");
  EXPECT_TRUE(starts_with(e, "tmpl.jinja:1:4: ")) << e;
  e = error_of("{{ a ? b }}");
  EXPECT_TRUE(starts_with(e, "tmpl.jinja:1:6: ")) << e;
  e = error_of("{% include 'x' %}");
  EXPECT_NE(e.find("include"), std::string::npos) << e;
}

TEST(JinjaErrors, RaiseException) {
  std::string e = error_of("ok\n  {{- raise_exception('Bad role: ' ~ role) }}", {{"role", "robot"}});
  EXPECT_EQ(e, "tmpl.jinja:2:7: Bad role: robot");
  // Raised from inside a macro called in a loop.
  e = error_of("{% macro m(x) %}{% if x > 1 %}{{ raise_exception('too big') }}{% endif %}{% endmacro %}"
               "{% for i in range(3) %}{{ m(i) }}{% endfor %}");
  EXPECT_NE(e.find("too big"), std::string::npos) << e;
}

TEST(JinjaErrors, RuntimeErrorsHaveLocation) {
  // jinja2's default Undefined: attribute access on an undefined value is an error...
  std::string e = error_of("\n{{ missing.attr }}");
  EXPECT_TRUE(starts_with(e, "tmpl.jinja:2:11: ")) << e;
  EXPECT_NE(e.find("'missing' is undefined"), std::string::npos) << e;
  // ... a missing attribute of a defined value is undefined, and one level further is an error.
  EXPECT_EQ(Template("[{{ d.x }}]").render({{"d", ordered_json::object()}}), "[]");
  e = error_of("{{ d.x.y }}", {{"d", ordered_json::object()}});
  EXPECT_NE(e.find("'dict object' has no attribute 'x'"), std::string::npos) << e;
  e = error_of("{{ 'a' + 1 }}");
  EXPECT_TRUE(starts_with(e, "tmpl.jinja:1:8: ")) << e;
  e = error_of("{{ u + 'a' }}");
  EXPECT_NE(e.find("'u' is undefined"), std::string::npos) << e;
  e = error_of("{{ nofn() }}");
  EXPECT_NE(e.find("'nofn' is undefined"), std::string::npos) << e;
  e = error_of("{% set x = 1 %}{% set x.a = 2 %}");
  EXPECT_NE(e.find("non-namespace"), std::string::npos) << e;
  e = error_of("{% for x in 5 %}{% endfor %}");
  EXPECT_NE(e.find("not iterable"), std::string::npos) << e;
  e = error_of("{{ 1 // 0 }}");
  EXPECT_NE(e.find("division"), std::string::npos) << e;
  e = error_of("{{ 'x'|items }}");
  EXPECT_NE(e.find("Can only get item pairs from a mapping"), std::string::npos) << e;
  e = error_of("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}");
  EXPECT_NE(e.find("takes not more than 1 argument"), std::string::npos) << e;
  e = error_of("{{ u|int }}");  // int(Undefined) raises in jinja2
  EXPECT_NE(e.find("'u' is undefined"), std::string::npos) << e;
  e = error_of("{{ 0 ** -1 }}");
  EXPECT_NE(e.find("negative power"), std::string::npos) << e;
  e = error_of("{{ u|tojson }}");
  EXPECT_NE(e.find("not JSON serializable"), std::string::npos) << e;
}

TEST(JinjaErrors, OptionsCanBeTurnedOff) {
  lilac::jinja::Options o;
  o.trim_blocks = false;
  o.lstrip_blocks = false;
  o.keep_trailing_newline = true;
  EXPECT_EQ(Template("  {% if true %}\nx\n  {% endif %}\n", "t", o).render(ordered_json::object()), "  \nx\n  \n");
}

}  // namespace
