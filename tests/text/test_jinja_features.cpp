// Jinja language features, each case checked against the output of Python jinja2 3.1.6 configured the way
// Hugging Face renders chat templates (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
// loopcontrols, tojson = json.dumps(ensure_ascii=False)). Expected strings were produced by jinja2.
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/jinja.h"

namespace {

struct Case {
  const char* name;
  const char* tmpl;
  const char* vars;
  const char* expected;
};

const Case kCases[] = {
    {"ws_dash",
     R"J(a  {{- 'x' -}}  b
{%- if true -%}  c  {%- endif -%}
 d)J",
     R"J({})J",
     R"J(axbcd)J"},
    {"trim_blocks",
     R"J({% if true %}
yes
{% endif %}
end)J",
     R"J({})J",
     R"J(yes
end)J"},
    {"lstrip_blocks",
     R"J(<ul>
    {% for x in xs %}
    <li>{{ x }}</li>
    {% endfor %}
</ul>
)J",
     R"J({"xs": [1, 2]})J",
     R"J(<ul>
    <li>1</li>
    <li>2</li>
</ul>)J"},
    {"lstrip_not_for_vars",
     R"J(  {{ 'v' }}
  {% if true %}t{% endif %})J",
     R"J({})J",
     R"J(  v
t)J"},
    {"lstrip_text_before_tag",
     R"J(x {% if true %}y{% endif %}
	{% if true %}z{% endif %})J",
     R"J({})J",
     R"J(x yz)J"},
    {"plus_markers",
     R"J(  {%+ if true %}x{% endif +%}
y)J",
     R"J({})J",
     R"J(  x
y)J"},
    {"comments",
     R"J(a
  {# comment #}
b {#- c -#}  c
{#- x #})J",
     R"J({})J",
     R"J(a
bc)J"},
    {"raw",
     R"J({% raw %}{{ not parsed }}{% if %}{% endraw %}|{%- raw -%}  a  {%- endraw -%}  |)J",
     R"J({})J",
     R"J({{ not parsed }}{% if %}|a|)J"},
    {"trailing_newline",
     R"J(x
)J",
     R"J({})J",
     R"J(x)J"},
    {"crlf",
     "a\r\n{% if true %}\r\nb\r\n{% endif %}\r\nc\r\n",
     R"J({})J",
     R"J(a
b
c)J"},
    {"qwen_style_indent",
     R"J({%- for m in ms %}
    {{- m }}
    {%- if not loop.last %}
        {{- ', ' }}
    {%- endif %}
{%- endfor %}
)J",
     R"J({"ms": ["a", "b", "c"]})J",
     R"J(a, b, c)J"},
    {"mixed_whitespace",
     R"J(  {%- set x = 1 -%}  
  {{ x }}  
  {%- if x %} yes {% endif -%}  
end)J",
     R"J({})J",
     R"J(1 yes end)J"},
    {"loop_vars",
     R"J({% for x in xs %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.revindex0 }}/{{ loop.first }}/{{ loop.last }}/{{ loop.length }}/{{ loop.previtem }}/{{ loop.nextitem }};{% endfor %})J",
     R"J({"xs": ["a", "b", "c"]})J",
     R"J(1/0/3/2/True/False/3//b;2/1/2/1/False/False/3/a/c;3/2/1/0/False/True/3/b/;)J"},
    {"loop_previtem_undefined",
     R"J({% for x in xs %}{{ loop.previtem is defined }}{{ loop.nextitem is defined }},{% endfor %})J",
     R"J({"xs": [1, 2]})J",
     R"J(FalseTrue,TrueFalse,)J"},
    {"for_filter_else",
     R"J({% for x in xs if x > 1 %}{{ x }}:{{ loop.length }},{% else %}none{% endfor %}|{% for x in [] %}x{% else %}empty{% endfor %}|{% for x in xs if x > 9 %}x{% else %}filtered{% endfor %})J",
     R"J({"xs": [1, 2, 3]})J",
     R"J(2:2,3:2,|empty|filtered)J"},
    {"for_unpack",
     R"J({% for k, v in d|items %}{{ k }}={{ v }};{% endfor %}{% for k, v in d.items() %}{{ k }}{% endfor %}{% for k in d %}{{ k }}{% endfor %}{% for a, b in [[1, 2], (3, 4)] %}{{ a + b }}{% endfor %})J",
     R"J({"d": {"b": 1, "a": 2}})J",
     R"J(b=1;a=2;baba37)J"},
    {"break_continue",
     R"J({% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %})J",
     R"J({})J",
     R"J(0134)J"},
    {"nested_loops",
     R"J({% for a in [1, 2] %}{% for b in 'xy' %}{{ loop.index }}{{ b }}{% endfor %}{{ loop.index }};{% endfor %})J",
     R"J({})J",
     R"J(1x2y1;1x2y2;)J"},
    {"loop_cycle",
     R"J({% for i in range(3) %}{{ loop.cycle('a', 'b') }}{% endfor %})J",
     R"J({})J",
     R"J(aba)J"},
    {"scoping",
     R"J({% set x = 1 %}{% for i in [1, 2] %}{% set x = i %}{{ x }}{% endfor %}{{ x }}{% if true %}{% set y = 5 %}{% endif %}{{ y }})J",
     R"J({})J",
     R"J(1215)J"},
    {"namespace_macro",
     R"J({% set ns = namespace(n=0, s='') %}{% macro bump(k) %}{% set ns.n = ns.n + k %}{% endmacro %}{{ bump(2) }}{{ bump(3) }}{% for i in range(3) %}{% set ns.s = ns.s ~ i %}{% endfor %}{{ ns.n }} {{ ns.s }})J",
     R"J({})J",
     R"J(5 012)J"},
    {"macro_args",
     R"J({% macro m(a, b='B', c=none) %}[{{ a }}|{{ b }}|{{ c }}]{% endmacro %}{{ m(1) }}{{ m(1, 2) }}{{ m(1, c=3) }}{{ m('  x  ')|trim }}{{ (m('q')|upper) ~ '!' }}{% set r = m(5)|length %}{{ r }})J",
     R"J({})J",
     R"J([1|B|None][1|2|None][1|B|3][  x  |B|None][Q|B|NONE]!10)J"},
    {"macro_sees_later_globals",
     R"J({% macro m() %}{{ z }}{% endmacro %}{% set z = 3 %}{{ m() }})J",
     R"J({})J",
     R"J(3)J"},
    {"set_block",
     R"J({% set x %}  hello {{ 1 + 1 }}  {% endset %}[{{ x }}]{% set y | trim %}  z  {% endset %}[{{ y }}])J",
     R"J({})J",
     R"J([  hello 2  ][z])J"},
    {"set_tuple",
     R"J({% set a, b = 1, 2 %}{{ a }}{{ b }}{% set t = (1, 'x') %}{{ t }}{{ t[1] }})J",
     R"J({})J",
     R"J(12(1, 'x')x)J"},
    {"slicing",
     R"J({{ xs[::-1] }}{{ xs[1:] }}{{ xs[:-1] }}{{ xs[::2] }}{{ 'héllo'[::-1] }}{{ 'abcdef'[1:4] }}{{ xs[-1] }}[{{ 'abc'[5:] }}]{{ xs[-2:] }}{{ 'héllo'[1] }})J",
     R"J({"xs": [1, 2, 3, 4]})J",
     R"J([4, 3, 2, 1][2, 3, 4][1, 2, 3][1, 3]olléhbcd4[][3, 4]é)J"},
    {"in_operator",
     R"J({{ 'a' in 'cat' }}{{ 'z' not in 'cat' }}{{ 2 in [1, 2] }}{{ 'k' in {'k': 1} }}{{ 'v' in {'k': 'v'} }}{{ 'x' in u }}{{ 3 not in [1] }})J",
     R"J({})J",
     R"J(TrueTrueTrueTrueFalseFalseTrue)J"},
    {"and_or_operands",
     R"J({{ 0 or 'b' }}|{{ 'a' and 'b' }}|{{ '' and 'b' }}|{{ none or [] }}|{{ not 0 }}|{{ not 'x' }}|{{ u or 'fallback' }})J",
     R"J({})J",
     R"J(b|b||[]|True|False|fallback)J"},
    {"arithmetic",
     R"J({{ 7 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7.5 // 2 }} {{ 2 ** 10 }} {{ 1 + 2.0 }} {{ 3 * 'ab' }} {{ [1] + [2] }} {{ 10 - 3 * 2 }} {{ (1 + 2) * 3 }} {{ 0.1 + 0.2 }} {{ 2 ** -1 }} {{ 6 / 3 }} {{ -7.5 % 2 }} {{ xs|length - 1 }} {{ 1 + xs|length }})J",
     R"J({"xs": [1, 2, 3]})J",
     R"J(3.5 3 -4 1 2 3.0 1024 3.0 ababab [1, 2] 4 9 0.30000000000000004 0.5 2.0 0.5 2 4)J"},
    {"concat",
     R"J({{ 'a' ~ 1 ~ none ~ true ~ u ~ 1.0 ~ [1] }})J",
     R"J({})J",
     R"J(a1NoneTrue1.0[1])J"},
    {"comparison",
     R"J({{ 1 < 2 < 3 }}{{ 3 > 2 > 2 }}{{ 1 == 1.0 }}{{ 'a' < 'b' }}{{ [1, 2] == [1, 2] }}{{ 1 != 2 }}{{ true == 1 }}{{ u == u }}{{ u == none }}{{ 'b' >= 'a' }})J",
     R"J({})J",
     R"J(TrueFalseTrueTrueTrueTrueTrueTrueFalseTrue)J"},
    {"ternary",
     R"J({{ 'y' if x else 'n' }}{{ 'y' if not x else 'n' }}[{{ 'only' if false }}]{{ 'a' if false else 'b' if true else 'c' }})J",
     R"J({"x": 1})J",
     R"J(yn[]b)J"},
    {"attr_and_item",
     R"J({{ d.a }}{{ d['a'] }}[{{ d.missing }}][{{ d.missing is defined }}]{{ l[0].k }}{{ l.0.k }}{{ d.get('a') }}{{ d.get('zz', 'dflt') }}{{ d.get('zz') }}{{ d.missing|default('zz') }}[{{ none.x }}][{{ l[9] }}])J",
     R"J({"d": {"a": 1}, "l": [{"k": "x", "flag": true}, {"k": "y", "flag": false}, {"k": "a", "flag": 1}]})J",
     R"J(11[][False]xx1dfltNonezz[][])J"},
    {"string_methods",
     R"J({{ ' a b '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ '  a'.lstrip() }}|{{ 'a  '.rstrip() }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a b c'.split(' ', 1) }}|{{ 'a b c'.rsplit(' ', 1) }}|{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith('bc') }}{{ 'abc'.startswith(('x', 'a')) }}|{{ 'aXa'.replace('a', 'b') }}|{{ 'hi'.upper() }}{{ 'HI'.lower() }}|{{ 'hello wORLD'.title() }}|{{ 'hELLO'.capitalize() }}|{{ '{} and {x} {{}}'.format(1, x=2) }}|{{ 'a-b'.find('-') }}|{{ ','.join(['a', 'b']) }}|{{ 'a\nb'.splitlines() }})J",
     R"J({})J",
     R"J(a b|a|a|a|['a', 'b', '', 'c']|['a', 'b']|['a', 'b c']|['a b', 'c']|TrueTrueTrue|bXb|HIhi|Hello World|Hello|1 and 2 {}|1|a,b|['a', 'b'])J"},
    {"dict_methods",
     R"J({% for k in d.keys() %}{{ k }}{% endfor %}|{% for v in d.values() %}{{ v }}{% endfor %}|{{ d.items()|list }}|{{ d.items()|length }})J",
     R"J({"d": {"b": 1, "a": "x"}})J",
     R"J(ba|1x|[('b', 1), ('a', 'x')]|2)J"},
    {"python_printing",
     R"J({{ [1, 'a', none, true, 1.5, {'k': 'v'}, (1,), (1, 2), "it's", 'q"', 'both\'"', 'nl\n'] }}|{{ d }})J",
     R"J({"d": {"a": [1, {"b": null}], "c": false}})J",
     R"J([1, 'a', None, True, 1.5, {'k': 'v'}, (1,), (1, 2), "it's", 'q"', 'both\'"', 'nl\n']|{'a': [1, {'b': None}], 'c': False})J"},
    {"float_printing",
     R"J({{ 1.0 }} {{ 100.0 }} {{ 1e16 }} {{ 1e15 }} {{ 123456789012345678.0 }} {{ 0.0001 }} {{ 0.00001 }} {{ -0.0 }} {{ 1/3 }} {{ 2/3 }} {{ 1e20 }} {{ 1.5e-7 }} {{ f }})J",
     R"J({"f": 3.25})J",
     R"J(1.0 100.0 1e+16 1000000000000000.0 1.2345678901234568e+17 0.0001 1e-05 -0.0 0.3333333333333333 0.6666666666666666 1e+20 1.5e-07 3.25)J"},
    {"string_escapes",
     R"J({{ 'a\tb\\c\u00e9\x41\'"' }}{{ "d\"q" }}{{ 'x' 'y' }})J",
     R"J({})J",
     R"J(a	b\céA'"d"qxy)J"},
    {"tests",
     R"J({{ u is defined }}{{ u is undefined }}{{ none is none }}{{ 'a' is string }}{{ {} is mapping }}{{ [] is iterable }}{{ 'a' is iterable }}{{ 1 is iterable }}{{ {} is sequence }}{{ 1 is number }}{{ true is number }}{{ 1 is integer }}{{ true is integer }}{{ 1.0 is float }}{{ true is boolean }}{{ 1 is boolean }}{{ 2 is in [1, 2] }}{{ 2 is eq 2 }}{{ u is iterable }}{{ x is not none }}{{ x is not string }}{{ not x is none }}{{ 3 is odd }}{{ 4 is even }}{{ 9 is divisibleby 3 }}{{ 'ab' is lower }}{{ range is callable }}{{ none is mapping }})J",
     R"J({"x": 1})J",
     R"J(FalseTrueTrueTrueTrueTrueTrueFalseTrueTrueTrueTrueFalseTrueTrueFalseTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueFalse)J"},
    {"is_true_false_strict",
     R"J({{ 1 is true }}{{ true is true }}{{ 'x' is true }}{{ 0 is false }}{{ false is false }}{{ none is false }}{{ x is true }}{{ y is false }}{{ u is false }})J",
     R"J({"x": true, "y": 0})J",
     R"J(FalseTrueFalseFalseTrueFalseTrueFalseFalse)J"},
    {"filters_basic",
     R"J({{ 'héllo'|length }}{{ [1, 2, 3]|count }}{{ '  x  '|trim }}|{{ u|default('d') }}{{ ''|default('e') }}{{ ''|default('f', true) }}{{ 0|default('g', boolean=true) }}{{ none|default('h') }}|{{ [1, 2]|join(',') }}{{ 'abc'|list }}{{ [1, 2]|first }}{{ [1, 2]|last }}{{ 'ab'|first }}{{ 1|string }}{{ 'x'|safe }}{{ 'ab'|upper }}{{ 'AB'|lower }}{{ u|length }}{{ {'a': 1}|length }}{{ 'hello world-x'|title }}{{ 'xyz'|trim('xz') }})J",
     R"J({})J",
     R"J(53x|dfgNone|1,2['a', 'b', 'c']12a1xABab01Hello World-Xy)J"},
    {"filters_numbers",
     R"J({{ '42'|int }}{{ '4.7'|int }}{{ 'x'|int }}{{ 'x'|int(7) }}{{ 3|float }}{{ '2.5'|float }}{{ -3|abs }}{{ (-3.5)|abs }}{{ [1, 2, 3]|reverse|list }}{{ 'abc'|reverse }}{{ ['a', 'A', 'b', 'a']|unique|list }}{{ 2.5|round }}{{ 3.5|round }}{{ 3.14159|round(2) }}{{ true|int }})J",
     R"J({})J",
     R"J(424073.02.533.5[3, 2, 1]cba['a', 'b']2.04.03.141)J"},
    {"filters_map_select",
     R"J({{ l|map(attribute='k')|list }}{{ l|map(attribute='k')|join(',') }}{{ ['a', 'b']|map('upper')|list }}{{ l|selectattr('k', 'equalto', 'x')|list|length }}{{ l|rejectattr('k', 'equalto', 'x')|map(attribute='k')|list }}{{ [1, 2, 3, 4]|select('even')|list }}{{ [1, 2, 3, 4]|reject('odd')|list }}{{ [0, 1, '', 2]|select|list }}{{ l|selectattr('flag')|map(attribute='k')|list }}{{ l|selectattr('k', 'in', ['a', 'y'])|map(attribute='k')|join }})J",
     R"J({"l": [{"k": "x", "flag": true}, {"k": "y", "flag": false}, {"k": "a", "flag": 1}]})J",
     R"J(['x', 'y', 'a']x,y,a['A', 'B']1['y', 'a'][2, 4][2, 4][1, 2]['x', 'a']ya)J"},
    {"filters_sort_min_max",
     R"J({{ [3, 1, 2]|sort }}{{ ['b', 'A', 'a']|sort }}{{ l|sort(attribute='k')|map(attribute='k')|list }}{{ [3, 1]|sort(reverse=true) }}{{ [3, 1, 2]|min }}{{ [3, 1, 2]|max }}{{ [1, 2, 3]|sum }})J",
     R"J({"l": [{"k": "x", "flag": true}, {"k": "y", "flag": false}, {"k": "a", "flag": 1}]})J",
     R"J([1, 2, 3]['A', 'a', 'b']['a', 'x', 'y'][3, 1]136)J"},
    {"tojson",
     R"J({{ d|tojson }}|{{ d|tojson(indent=2) }}|{{ s|tojson }}|{{ [1.0, 2, none, true, 1e20, 0.1]|tojson }}|{{ {}|tojson }}|{{ []|tojson(indent=2) }}|{{ d|tojson(separators=(',', ':')) }}|{{ {'b': 1, 'a': 2}|tojson(sort_keys=true) }}|{{ 'é🤖'|tojson(ensure_ascii=true) }}|{{ (1, 'a')|tojson }})J",
     R"J({"d": {"z": 1, "a": [1, {"x": "é"}], "e": {}}, "s": "é\"\\\n\t<\u0001/"})J",
     R"J({"z": 1, "a": [1, {"x": "é"}], "e": {}}|{
  "z": 1,
  "a": [
    1,
    {
      "x": "é"
    }
  ],
  "e": {}
}|"é\"\\\n\t<\u0001/"|[1.0, 2, null, true, 1e+20, 0.1]|{}|[]|{"z":1,"a":[1,{"x":"é"}],"e":{}}|{"a": 2, "b": 1}|"\u00e9\ud83e\udd16"|[1, "a"])J"},
    {"filter_block",
     R"J({% filter upper %}abc {{ 'd' }}{% endfilter %})J",
     R"J({})J",
     R"J(ABC D)J"},
    {"dict_literal",
     R"J({% set d = {'a': 1, 'b': [1, 2]} %}{{ d.b[1] }}{{ d|length }}{{ d['a'] + 1 }}{{ d }})J",
     R"J({})J",
     R"J(222{'a': 1, 'b': [1, 2]})J"},
    {"percent_format",
     R"J({{ '%s=%d' % ('a', 3) }}{{ '%s' % 'x' }}{{ '%d%%'|format(5) }}{{ '%s-%s'|format('a', 'b') }})J",
     R"J({})J",
     R"J(a=3x5%a-b)J"},
    {"range",
     R"J({{ range(3)|list }}{{ range(1, 7, 2)|list }}{{ range(3, 0, -1)|list }})J",
     R"J({})J",
     R"J([0, 1, 2][1, 3, 5][3, 2, 1])J"},
    {"escape_indent",
     R"J({{ '<a href="x">&'|e }}|{{ 'a\nb\n\nc'|indent(2) }}|{{ 'a\nb'|indent(2, true) }})J",
     R"J({})J",
     R"J(&lt;a href=&#34;x&#34;&gt;&amp;|a
  b

  c|  a
  b)J"},
    {"undefined_is_lenient",
     R"J([{{ u }}]{% for x in u %}{{ x }}{% endfor %}{% for k, v in u|items %}x{% else %}none{% endfor %}{{ u|join }}{{ u|list }}{{ u|trim }}{% if u %}t{% else %}f{% endif %}{{ u is none }})J",
     R"J({})J",
     R"J([]none[]fFalse)J"},
    {"generation_block",
     R"J(a{% generation %}gen{{ 1 }}{% endgeneration %}b)J",
     R"J({})J",
     R"J(agen1b)J"},
    {"dict_order_and_none_vars",
     R"J({% for k, v in d.items() %}{{ k }}:{{ v }},{% endfor %}{{ n }}{{ n is none }})J",
     R"J({"d": {"z": 1, "a": 2, "m": 3}, "n": null})J",
     R"J(z:1,a:2,m:3,NoneTrue)J"},
    {"args_value_qwen",
     R"J({% for args_name, args_value in a|items %}<{{ args_name }}>{% set args_value = args_value | string if args_value is string else args_value | tojson | safe %}{{ args_value }}{% endfor %})J",
     R"J({"a": {"s": "str", "n": 3, "b": true, "l": [1, "x"], "o": {"k": null}, "f": 1.5}})J",
     R"J(<s>str<n>3<b>true<l>[1, "x"]<o>{"k": null}<f>1.5)J"},
    {"qwen35_args_value",
     R"J({% for n, v in a|items %}{% set v = v | tojson | safe if v is mapping or (v is sequence and v is not string) else v | string %}{{ n }}={{ v }};{% endfor %})J",
     R"J({"a": {"s": "str", "n": 3, "b": true, "l": [1, "x"], "o": {"k": null}}})J",
     R"J(s=str;n=3;b=True;l=[1, "x"];o={"k": null};)J"},
    {"llama31_style",
     R"J({{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if builtin_tools is defined or tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ (message['content'] if message['content'] is string else message['content'][0]['text']) | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
)J",
     R"J({"messages": [{"role": "system", "content": "Sys prompt"}, {"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello!", "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1, "b": "x"}}}]}, {"role": "tool", "content": "res"}, {"role": "user", "content": [{"type": "text", "text": "part"}, {"type": "image"}]}], "tools": [{"type": "function", "function": {"name": "f", "description": "desc ü", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}], "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"})J",
     R"J(<s><|start_header_id|>system<|end_header_id|>

Environment: ipython
Today Date: 26 Jul 2024

Sys prompt<|eot_id|><|start_header_id|>user<|end_header_id|>

Hi there<|eot_id|><|start_header_id|>assistant<|end_header_id|>

{"name": "f", "parameters": {"a": 1, "b": "x"}}<|eot_id|><|start_header_id|>ipython<|end_header_id|>

"res"<|eot_id|><|start_header_id|>user<|end_header_id|>

part<|eot_id|><|start_header_id|>assistant<|end_header_id|>

)J"},
    {"mistral_style",
     R"J({{ bos_token }}{% for message in messages if message.role != 'tool' %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 1) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + (message['content'] if message.content is string else message.content|map(attribute='text')|select|join(' ')) + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% endif %}{% endfor %})J",
     R"J({"messages": [{"role": "system", "content": "Sys prompt"}, {"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello!", "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1, "b": "x"}}}]}, {"role": "tool", "content": "res"}, {"role": "user", "content": [{"type": "text", "text": "part"}, {"type": "image"}]}], "tools": [{"type": "function", "function": {"name": "f", "description": "desc ü", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}], "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"})J",
     R"J(<s>[INST] Hi there [/INST]Hello!</s>[INST] part [/INST])J"},
    {"gemma_style",
     R"J({{ bos_token }}{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% else %}{% set loop_messages = messages %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '
' + (message['content'] if message['content'] is string else message['content'][0]['text']) | trim + '<end_of_turn>
' }}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model
'}}{% endif %})J",
     R"J({"messages": [{"role": "system", "content": "Sys prompt"}, {"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello!", "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1, "b": "x"}}}]}, {"role": "tool", "content": "res"}, {"role": "user", "content": [{"type": "text", "text": "part"}, {"type": "image"}]}], "tools": [{"type": "function", "function": {"name": "f", "description": "desc ü", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}], "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"})J",
     R"J(<s><start_of_turn>user
Hi there<end_of_turn>
<start_of_turn>model
Hello!<end_of_turn>
<start_of_turn>tool
res<end_of_turn>
<start_of_turn>user
part<end_of_turn>
<start_of_turn>model
)J"},
    {"deepseek_style",
     R"J({% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}{% set ns = namespace(is_first=false, is_tool=false, is_output_first=true, system_prompt='') %}{%- for message in messages %}{%- if message['role'] == 'system' %}{% set ns.system_prompt = message['content'] %}{%- endif %}{%- endfor %}{{bos_token}}{{ns.system_prompt}}{%- for message in messages %}{%- if message['role'] == 'user' %}{%- set ns.is_tool = false -%}{{'<｜User｜>' + (message['content'] if message.content is string else 'parts')}}{%- endif %}{%- if message['role'] == 'assistant' and 'tool_calls' in message %}{%- set ns.is_tool = false -%}{%- for tool in message['tool_calls']%}{%- if not ns.is_first %}{{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type']|default('function') + '<｜tool▁sep｜>' + tool['function']['name'] + '\n' + '```json' + '\n' + tool['function']['arguments']|tojson + '\n' + '```' + '<｜tool▁call▁end｜>'}}{%- set ns.is_first = true -%}{%- else %}{{'\n' + '<｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\n' + '```json' + '\n' + tool['function']['arguments']|tojson + '\n' + '```' + '<｜tool▁call▁end｜>'}}{{'<｜tool▁calls▁end｜><｜end▁of▁sentence｜>'}}{%- endif %}{%- endfor %}{%- endif %}{%- if message['role'] == 'tool' %}{%- set ns.is_tool = true -%}{%- if ns.is_output_first %}{{'<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}{%- set ns.is_output_first = false %}{%- endif %}{%- endif %}{%- endfor -%}{% if ns.is_tool %}{{'<｜tool▁outputs▁end｜>'}}{% endif %}{% if add_generation_prompt and not ns.is_tool %}{{'<｜Assistant｜>'}}{% endif %})J",
     R"J({"messages": [{"role": "system", "content": "Sys prompt"}, {"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello!", "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1, "b": "x"}}}]}, {"role": "tool", "content": "res"}, {"role": "user", "content": [{"type": "text", "text": "part"}, {"type": "image"}]}], "tools": [{"type": "function", "function": {"name": "f", "description": "desc ü", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}], "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"})J",
     R"J(<s>Sys prompt<｜User｜>Hi there<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f
```json
{"a": 1, "b": "x"}
```<｜tool▁call▁end｜><｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>res<｜tool▁output▁end｜><｜User｜>parts<｜Assistant｜>)J"},
    {"hermes_style",
     R"J({%- macro json_to_python_type(json_spec) %}
{%- set basic_type_map = {
    "string": "str",
    "number": "float",
    "integer": "int",
    "boolean": "bool"
} %}
{%- if basic_type_map[json_spec.type] is defined %}
    {{- basic_type_map[json_spec.type] }}
{%- elif json_spec.type == "array" %}
    {{- "list[" +  json_to_python_type(json_spec|items) + "]"}}
{%- elif json_spec.type == "object" %}
    {{- "dict" }}
{%- else %}
    {{- "Any" }}
{%- endif %}
{%- endmacro %}
{%- for tool in tools %}
    {%- if tool.function is defined %}
        {%- set tool = tool.function %}
    {%- endif %}
    {{- '{"type": "function", "function": ' }}
    {{- '{"name": "' + tool.name + '", ' }}
    {{- '"description": "' + tool.name + '(' }}
    {%- for param_name, param_fields in tool.parameters.properties|items %}
        {{- param_name + ": " + json_to_python_type(param_fields) }}
        {%- if not loop.last %}
            {{- ", " }}
        {%- endif %}
    {%- endfor %}
    {{- ")" }}
    {%- if tool.return is defined %}
        {{- " -> " + json_to_python_type(tool.return) }}
    {%- endif %}
    {{- " - " + tool.description + "\n\n" }}
    {{- '"parameters": ' }}
    {{- tool.parameters|tojson }}
    {{- "}" }}
{%- endfor %}
)J",
     R"J({"messages": [{"role": "system", "content": "Sys prompt"}, {"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello!", "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1, "b": "x"}}}]}, {"role": "tool", "content": "res"}, {"role": "user", "content": [{"type": "text", "text": "part"}, {"type": "image"}]}], "tools": [{"type": "function", "function": {"name": "f", "description": "desc ü", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}], "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"})J",
     R"J({"type": "function", "function": {"name": "f", "description": "f(a: int) - desc ü

"parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}})J"},
    {"misc_statements",
     R"J({% set parts = [] %}{% for m in messages %}{% if m.content is string %}{{ m.role|upper }}:{{ m.content|length }}{% else %}{% for p in m.content %}[{{ p.type }}{% if p.text is defined %}={{ p.text }}{% endif %}]{% endfor %}{% endif %}{{ ';' if not loop.last }}{% endfor %}
{% for k, v in tools[0].function.parameters|dictsort %}{{ k }}{% endfor %}
{{ messages|selectattr('role', 'equalto', 'user')|list|length }} {{ messages|map(attribute='role')|unique|join('/') }}
{{ messages[-1].content[0].text ~ '!' }} {{ (messages|last).role }} {{ messages|first|tojson }}
{%- set x = namespace(c=0) %}{% for m in messages %}{% for t in m.tool_calls|default([]) %}{% set x.c = x.c + t.function.arguments|length %}{% endfor %}{% endfor %}
{{ x.c }})J",
     R"J({"messages": [{"role": "system", "content": "Sys prompt"}, {"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello!", "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1, "b": "x"}}}]}, {"role": "tool", "content": "res"}, {"role": "user", "content": [{"type": "text", "text": "part"}, {"type": "image"}]}], "tools": [{"type": "function", "function": {"name": "f", "description": "desc ü", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}], "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"})J",
     R"J(SYSTEM:10;USER:8;ASSISTANT:6;TOOL:3;[text=part][image]propertiestype2 system/user/assistant/tool
part! user {"role": "system", "content": "Sys prompt"}2)J"},
    {"round_keeps_ints",
     R"J({{ 3|round }} {{ -1|round }} {{ 2.5|round }} {{ 0.125|round(2) }} {{ 2.675|round(2) }} {{ 7|round(1, 'floor') }})J",
     R"J({})J",
     R"J(3 -1 2.0 0.12 2.67 7.0)J"},
    {"wordcount_and_case_tests",
     R"J({{ 'héllo wörld 🤖'|wordcount }} {{ 'a_b c-d 1.5'|wordcount }} {{ d is lower }} {{ 'ABC' is upper }} {{ 'aB' is lower }} {{ 1 is lower }})J",
     R"J({"d": {"k": "v"}})J",
     R"J(2 5 True True False False)J"},
    {"percent_format_mapping",
     R"J([{{ 'plain' % {'a': 1} }}][{{ '%s' % {'a': 1} }}][{{ '' % [] }}])J",
     R"J({})J",
     R"J([plain][{'a': 1}][])J"},
    {"for_else_after_continue_everywhere",
     R"J({% for x in xs %}{% if x %}{% continue %}{% endif %}{{ x }}{% else %}E{% endfor %}|{% for x in xs %}{% break %}{% else %}E2{% endfor %}|{% for x in xs %}{{ x }}{% else %}E3{% endfor %})J",
     R"J({"xs": [1, 2]})J",
     R"J(E|E2|12)J"},
    {"continue_inside_set_block",
     R"J({% for i in range(3) %}{% set y %}<{{ i }}>{% if i == 1 %}{% continue %}{% endif %}{% endset %}{{ y }}{% endfor %})J",
     R"J({})J",
     R"J(<0><2>)J"},
    {"macro_scope_and_defaults",
     R"J({% set ns = namespace(a=0) %}{% macro m1(v, w=x) %}[{{ v }}|{{ w }}|{{ i }}{% set ns.a = ns.a + 1 %}{% set x = 'mx' %}{{ x }}]{% endmacro %}{% for i in [1, 2] %}{% set x = 'loop' %}{{ m1(i) }}{% endfor %}{{ x }}{{ ns.a }})J",
     R"J({"x": "X"})J",
     R"J([1|X|mx][2|X|mx]X2)J"},
    {"odd_even_divisible_py_modulo",
     R"J({{ 2.5 is even }}{{ 4.0 is even }}{{ 3 is odd }}{{ -3 is odd }}{{ 7.5 is divisibleby 2.5 }}{{ 10 is divisibleby(3) }})J",
     R"J({})J",
     R"J(FalseTrueTrueTrueTrueFalse)J"},
    {"undefined_repr_in_containers",
     R"J({{ [1, u] }}|{{ [u]|length }}|{{ u }}|{{ 'x' ~ [u] }})J",
     R"J({})J",
     R"J([1, Undefined]|1||x[Undefined])J"},
};

class JinjaFeature : public ::testing::TestWithParam<Case> {};

TEST_P(JinjaFeature, MatchesJinja2) {
  const Case& c = GetParam();
  lilac::jinja::Template t(c.tmpl, c.name);
  std::string got = t.render(nlohmann::ordered_json::parse(c.vars));
  EXPECT_EQ(got, std::string(c.expected)) << "template: " << c.tmpl;
}

INSTANTIATE_TEST_SUITE_P(Cases, JinjaFeature, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

}  // namespace
