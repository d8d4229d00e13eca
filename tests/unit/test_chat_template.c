/* chat_template: the Jinja subset against outputs jinja2 gave (transformers' sandboxed environment with trim_blocks
 * and lstrip_blocks: the table below was generated with it), errors with their line:column, the limits that keep
 * untrusted templates bounded, and the model-folder loader / apply_chat_template normalisation. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/chat_template.h"
#include "test.h"

static const char vars_json[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"Hi <there> & \\\"you\\\"\"}, {\"role\": \"assistant\", \"content\": \"Hello!\", \"tool_calls\": [{\"function\": {\"name\": \"f\", \"arguments\": {\"x\": 1.5, \"y\": [true, null]}}}]}], \"d\": {\"b\": 2, \"a\": 1, \"B\": 3}, \"n\": 7, \"f\": 2.5, \"s\": \"  Mixed Case  \", \"u\": \"h\303\251llo w\303\266rld \360\237\230\200\", \"e\": [], \"t\": true}";

static const struct {
    const char *name, *tpl, *want;
} render_cases[] = {
    {"ws_trim_lstrip",
     "a\n  {% if t %}\n  b\n  {% endif %}\nc",
     "a\n  b\nc"},
    {"ws_minus",
     "a  {%- if t -%}  b  {%- endif -%}  c\n{{- ' d ' -}}\n e",
     "abc d e"},
    {"ws_plus",
     "a\n  {%+ if t %}x{% endif +%}\ny",
     "a\n  x\ny"},
    {"ws_comment",
     "a\n  {# note #}\nb {#- x -#} c",
     "a\nbc"},
    {"ws_raw",
     "{% raw %}{{ not evaluated }}{% endraw %}",
     "{{ not evaluated }}"},
    {"ws_var_no_trim",
     "{{ 'x' }}\n{{ 'y' }}\n",
     "x\ny"},
    {"ws_crlf",
     "a\r\n{% if t %}\r\nb\r\n{% endif %}\r\nc\r\n",
     "a\nb\nc"},
    {"for_loopvars",
     "{% for m in messages %}{{ loop.index }}/{{ loop.length }}:{{ m.role }}{{ ',' if not loop.last }}{% endfor %}",
     "1/3:system,2/3:user,3/3:assistant"},
    {"for_index0_first_rev",
     "{% for x in 'abc' %}{{ loop.index0 }}{{ loop.first }}{{ loop.revindex }}{{ loop.revindex0 }} {% endfor %}",
     "0True32 1False21 2False10 "},
    {"for_prev_next",
     "{% for x in [1,2,3] %}[{{ loop.previtem }}|{{ loop.nextitem }}]{% endfor %}",
     "[|2][1|3][2|]"},
    {"for_else",
     "{% for x in e %}{{ x }}{% else %}empty{% endfor %}",
     "empty"},
    {"for_filter",
     "{% for m in messages if m.role != 'system' %}{{ loop.index }}{{ m.role }}{% endfor %}",
     "1user2assistant"},
    {"for_items_unpack",
     "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}",
     "b=2;a=1;B=3;"},
    {"for_dictsort",
     "{% for k, v in d|dictsort %}{{ k }}{{ v }}{% endfor %}",
     "a1b2B3"},
    {"for_break_continue",
     "{% for i in range(10) %}{% if i is odd %}{% continue %}{% endif %}{% if i > 6 %}{% break %}{% endif %}{{ i }}{% endfor %}",
     "0246"},
    {"for_cycle",
     "{% for i in range(4) %}{{ loop.cycle('x', 'y') }}{% endfor %}",
     "xyxy"},
    {"for_scope",
     "{% set x = 1 %}{% for i in [1, 2] %}{{ x }}{% set x = x + 10 %}{{ x }} {% endfor %}{{ x }}",
     "111 111 1"},
    {"if_elif_else",
     "{% for n in [1, 2, 3] %}{% if n == 1 %}one{% elif n == 2 %}two{% else %}many{% endif %} {% endfor %}",
     "one two many "},
    {"set_namespace",
     "{% set ns = namespace(count=0, last='') %}{% for m in messages %}{% set ns.count = ns.count + 1 %}{% set ns.last = m.role %}{% endfor %}{{ ns.count }} {{ ns.last }}",
     "3 assistant"},
    {"set_block",
     "{% set body %}[{{ n }}]{% endset %}{{ body ~ body }}",
     "[7][7]"},
    {"set_block_filter",
     "{% set body | upper %}x{{ n }}{% endset %}{{ body }}",
     "X7"},
    {"set_tuple",
     "{% set a, b = 'xy' %}{{ b }}{{ a }}",
     "yx"},
    {"filter_block",
     "{% filter trim %}   padded   {% endfilter %}|",
     "padded|"},
    {"with_block",
     "{% with a = 5 %}{{ a }}{% endwith %}{{ a is defined }}",
     "5False"},
    {"macro_defaults",
     "{% macro m(a, b='B', c=none) %}{{ a }}{{ b }}{{ c }}{% endmacro %}{{ m(1) }} {{ m(1, 2) }} {{ m(c=3, a=0) }}",
     "1BNone 12None 0B3"},
    {"macro_outer_scope",
     "{% set g = 'G' %}{% macro m() %}{{ g }}{% endmacro %}{% set g = 'H' %}{{ m() }}",
     "H"},
    {"macro_varargs",
     "{% macro m(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, k=3) }}",
     "1(2,){'k': 3}"},
    {"macro_recursive",
     "{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * (fact(n - 1)|int) }}{% endif %}{% endmacro %}{{ fact(10) }}",
     "3628800"},
    {"arith",
     "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 2 ** -2 }} {{ 1 + 2.5 }} {{ n * f }} {{ -n }}",
     "3 -4 1 2 3.5 1024 0.25 3.5 17.5 -7"},
    {"float_repr",
     "{{ 0.1 + 0.2 }} {{ 1e16 }} {{ 1e15 }} {{ 1e-5 }} {{ 0.0001 }} {{ 100.0 }} {{ -0.0 }} {{ 1/3 }} {{ 2.5e-10 }} {{ 123456789.125 }}",
     "0.30000000000000004 1e+16 1000000000000000.0 1e-05 0.0001 100.0 -0.0 0.3333333333333333 2.5e-10 123456789.125"},
    {"compare_chain",
     "{{ 1 < 2 < 3 }} {{ 1 < 3 < 2 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 1 == 1.0 }} {{ 1 == true }} {{ 'a' != 'b' }}",
     "True False True True True True True"},
    {"in_notin",
     "{{ 'ell' in 'hello' }} {{ 'a' in d }} {{ 2 in [1, 2] }} {{ 'z' not in d }} {{ 1 in x|default([]) }}",
     "True True True True False"},
    {"logic",
     "{{ none or 'x' }} {{ 'a' and 'b' }} {{ not e }} {{ 0 or '' or 'last' }} {{ 'y' if n > 5 else 'n' }}",
     "x b True last y"},
    {"concat",
     "{{ 'a' ~ 1 ~ none ~ true ~ 2.0 ~ [1] }}",
     "a1NoneTrue2.0[1]"},
    {"strings",
     "{{ 'It''s' }} {{ \"say \\\"hi\\\"\" }} {{ 'tab\\tnl\\n' }} {{ '\\u00e9\\x41\\101' }} {{ 'a' 'b' }}",
     "Its say \"hi\" tab\tnl\n \303\251AA ab"},
    {"index_slice",
     "{{ messages[0].role }} {{ messages[-1]['role'] }} {{ u[0] }} {{ u[-1] }} {{ u[1:4] }} {{ u[::-1] }} {{ [1,2,3,4][::2] }} {{ messages[1:]|length }}",
     "system assistant h \360\237\230\200 \303\251ll \360\237\230\200 dlr\303\266w oll\303\251h [1, 3] 2"},
    {"literals",
     "{{ [1, 'a', none, true, 2.5] }} {{ {'k': 'v', 'n': [1, (2, 3)]} }} {{ (1,) }} {{ () }}",
     "[1, 'a', None, True, 2.5] {'k': 'v', 'n': [1, (2, 3)]} (1,) ()"},
    {"repr_strings",
     "{{ [\"it's\", 'say \"x\"', 'both \\' \"', 'nl\\n', '\303\251\360\237\230\200'] }}",
     "[\"it's\", 'say \"x\"', 'both \\' \"', 'nl\\n', '\303\251\360\237\230\200']"},
    {"tests",
     "{{ n is number }} {{ n is integer }} {{ f is float }} {{ s is string }} {{ d is mapping }} {{ e is iterable }} {{ e is sequence }} {{ t is boolean }} {{ none is none }} {{ x is defined }} {{ x is undefined }} {{ n is odd }} {{ 10 is divisibleby 5 }} {{ t is true }} {{ n is gt 3 }} {{ 'a' is in 'abc' }}",
     "True True True True True True True True True False True True True True True True"},
    {"f_trim_case",
     "[{{ s|trim }}] [{{ s|upper }}] [{{ s|lower }}] [{{ s|trim|capitalize }}] [{{ 'hello big-world'|title }}] [{{ '--x--'|trim('-') }}]",
     "[Mixed Case] [  MIXED CASE  ] [  mixed case  ] [Mixed case] [Hello Big-World] [x]"},
    {"f_tojson",
     "{{ messages[2]|tojson }}\n{{ d|tojson(indent=2) }}\n{{ u|tojson }} {{ u|tojson(ensure_ascii=true) }} {{ d|tojson(sort_keys=true) }} {{ [1,2]|tojson(separators=(',', ':')) }}",
     "{\"role\": \"assistant\", \"content\": \"Hello!\", \"tool_calls\": [{\"function\": {\"name\": \"f\", \"arguments\": {\"x\": 1.5, \"y\": [true, null]}}}]}\n{\n  \"b\": 2,\n  \"a\": 1,\n  \"B\": 3\n}\n\"h\303\251llo w\303\266rld \360\237\230\200\" \"h\\u00e9llo w\\u00f6rld \\ud83d\\ude00\" {\"B\": 3, \"a\": 1, \"b\": 2} [1,2]"},
    {"f_tojson_escapes",
     "{{ 'q\"b\\\\n\\n\\t\\x01\\x7f'|tojson }} {{ [1.0, 1e100, -0.0, none, false]|tojson }}",
     "\"q\\\"b\\\\n\\n\\t\\u0001\177\" [1.0, 1e+100, -0.0, null, false]"},
    {"f_length_default",
     "{{ messages|length }} {{ u|length }} {{ d|length }} {{ x|length }} {{ x|default('D') }} {{ none|default('D') }} {{ ''|default('D', true) }} {{ x|d }}",
     "3 13 3 0 D None D "},
    {"f_first_last_join",
     "{{ messages|first|tojson }} {{ [1,2,3]|last }} {{ 'abc'|first }} {{ [1,2,3]|join(', ') }} {{ messages|join('|', attribute='role') }}",
     "{\"role\": \"system\", \"content\": \"Be brief.\"} 3 a 1, 2, 3 system|user|assistant"},
    {"f_list_items_string",
     "{{ 'ab'|list }} {{ d|items|list }} {{ 5|string ~ 'x' }} {{ none|string }} {{ '42'|int + 1 }} {{ '4.5'|int }} {{ 'x'|int(7) }} {{ 3.9|int }} {{ '2.5'|float * 2 }}",
     "['a', 'b'] [('b', 2), ('a', 1), ('B', 3)] 5x None 43 4 7 3 5.0"},
    {"f_select_map",
     "{{ messages|selectattr('role', 'equalto', 'user')|map(attribute='content')|list }} {{ messages|rejectattr('role', 'in', ['system', 'user'])|map(attribute='role')|first }} {{ [1,2,3,4]|select('even')|list }} {{ ['a','b']|map('upper')|join }} {{ messages|selectattr('tool_calls')|list|length }}",
     "['Hi <there> & \"you\"'] assistant [2, 4] AB 1"},
    {"f_sort_unique",
     "{{ ['b', 'A', 'c']|sort }} {{ [3, 1, 2]|sort(reverse=true) }} {{ messages|sort(attribute='role')|map(attribute='role')|join(',') }} {{ ['a', 'A', 'b']|unique|list }} {{ [3, 1]|max }} {{ [3, 1]|min }} {{ [1, 2.5]|sum }}",
     "['A', 'b', 'c'] [3, 2, 1] assistant,system,user ['a', 'b'] 3 1 3.5"},
    {"f_replace_indent_round",
     "{{ 'aXbX'|replace('X', '-') }} {{ 'aXbX'|replace('X', '', 1) }}\n{{ 'l1\nl2\n\nl4'|indent(2) }}\n{{ 'l1\nl2'|indent('> ', first=true) }}\n{{ 2.5|round }} {{ 3.14159|round(2) }} {{ 2.1|round(0, 'ceil') }} {{ 1250|round(-2) }}",
     "a-b- abX\nl1\n  l2\n\n  l4\n> l1\n> l2\n2.0 3.14 3.0 1200"},
    {"f_safe_escape",
     "{{ '<b>'|safe + '<i>' }} {{ '<&>'|e }} {{ ('x'|safe).upper() + '<' }} {{ '<' ~ '<'|safe }}",
     "<b>&lt;i&gt; &lt;&amp;&gt; X&lt; <<"},
    {"m_str",
     "{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a,b,c'.rsplit(',', 1) }}|{{ 'x\\ny'.splitlines() }}|{{ 'abc'.startswith('ab') }}|{{ 'abc'.endswith(('x', 'c')) }}|{{ 'aXa'.replace('a', 'b') }}|{{ u.find('w') }}|{{ 'aaa'.count('a') }}|{{ '-'.join(['a', 'b']) }}|{{ \"they're\".title() }}|{{ 'abc'.upper() }}|{{ '12'.isdigit() }}",
     "Mixed Case|Mixed Case  |  Mixed Case|['a', 'b', '', 'c']|['a', 'b']|['a,b', 'c']|['x', 'y']|True|True|bXb|6|3|a-b|They'Re|ABC|True"},
    {"m_dict",
     "{{ d.get('a') }} {{ d.get('z') }} {{ d.get('z', 0) }} {{ d.keys()|list }} {{ d.values()|list }} {{ d.items() }} {{ d.keys() }}",
     "1 None 0 ['b', 'a', 'B'] [2, 1, 3] dict_items([('b', 2), ('a', 1), ('B', 3)]) dict_keys(['b', 'a', 'B'])"},
    {"m_list",
     "{{ [1, 2, 2].count(2) }} {{ ['a', 'b'].index('b') }}",
     "2 1"},
    {"undefined",
     "[{{ x }}] [{{ x ~ 'a' }}] [{{ x|length }}] [{{ x is defined }}] [{{ d.zz }}] [{{ d['zz'] is defined }}] [{{ messages[9] }}] [{{ 'abc'[5] }}] [{% for i in x %}no{% else %}empty{% endfor %}] [{{ not x }}] [{{ x == y }}]",
     "[] [a] [0] [False] [] [False] [] [] [empty] [True] [True]"},
    {"globals",
     "{{ range(3)|list }} {{ range(1, 10, 4)|list }} {{ dict(a=1, b=[2]) }} {{ namespace(a=1) }} {{ strftime_now is defined }} {{ raise_exception is defined }}",
     "[0, 1, 2] [1, 5, 9] {'a': 1, 'b': [2]} <Namespace {'a': 1}> True True"},
    {"generation_tag",
     "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}{% endif %}{% endfor %}",
     "Hello!"},
    {"unicode_case",
     "{{ u|upper }} {{ 'STRASSE \303\237'|lower }} {{ '\303\237'|upper }} {{ '\303\211COLE'|lower }}",
     "H\303\211LLO W\303\226RLD \360\237\230\200 strasse \303\237 SS \303\251cole"},
};

/* Renders tpl with vars (JSON object); returns the text (malloc'ed) or NULL with err filled. */
static char *render(const char *tpl, const char *vars, const ChatRenderOpts *opts, ZyErr *err) {
    ChatTemplate *t;
    char *out = NULL;
    size_t len;
    err->msg[0] = '\0';
    if (chat_template_parse(tpl, strlen(tpl), &t, err)) return NULL;
    if (chat_template_render(t, vars, strlen(vars), opts, &out, &len, err)) out = NULL;
    chat_template_free(t);
    if (out && strlen(out) != len) { /* embedded NULs are not expected here */
        free(out);
        return NULL;
    }
    return out;
}

TEST(chat_template_renders_like_jinja2) {
    for (size_t i = 0; i < ZY_ARRAY_LEN(render_cases); i++) {
        ZyErr err;
        char *got = render(render_cases[i].tpl, vars_json, NULL, &err);
        CHECK_MSG(got && strcmp(got, render_cases[i].want) == 0, "%s: got [%s] (%s), want [%s]", render_cases[i].name,
                  got ? got : "(error)", got ? "" : err.msg, render_cases[i].want);
        free(got);
    }
}

/* The template fails (to parse or to render) with a message containing every piece of want. */
static void expect_error(int *zy_test_failed_, const char *tpl, const char *vars, const ChatRenderOpts *opts,
                         const char *want1, const char *want2) {
    ZyErr err;
    char *got = render(tpl, vars, opts, &err);
    CHECK_MSG(got == NULL, "[%s] rendered [%s], expected an error", tpl, got ? got : "");
    if (got) {
        free(got);
        return;
    }
    CHECK_MSG(strstr(err.msg, want1) != NULL, "[%s]: message [%s] lacks [%s]", tpl, err.msg, want1);
    if (want2) CHECK_MSG(strstr(err.msg, want2) != NULL, "[%s]: message [%s] lacks [%s]", tpl, err.msg, want2);
}

TEST(chat_template_syntax_errors_name_construct_and_position) {
    expect_error(zy_test_failed_, "ok\n  {% include 'x.jinja' %}", "{}", NULL, "line 2:6", "unsupported tag 'include'");
    expect_error(zy_test_failed_, "{% call m() %}x{% endcall %}", "{}", NULL, "line 1:4", "unsupported tag 'call'");
    expect_error(zy_test_failed_, "{% frobnicate %}", "{}", NULL, "line 1:4", "unknown tag 'frobnicate'");
    expect_error(zy_test_failed_, "{{ x | nosuchfilter }}", "{}", NULL, "line 1:8", "no filter named 'nosuchfilter'");
    expect_error(zy_test_failed_, "{{ x is nosuchtest }}", "{}", NULL, "line 1:6", "no test named 'nosuchtest'");
    expect_error(zy_test_failed_, "{% for x in y %}\n{{ x }}", "{}", NULL, "line 1:4", "no 'endfor' closes this 'for'");
    expect_error(zy_test_failed_, "{% if a %}{% elif b %}", "{}", NULL, "line 1:4", "no 'endif' closes this 'if'");
    expect_error(zy_test_failed_, "a\n{{ 'never closed", "{}", NULL, "line 2:4", "unterminated string");
    expect_error(zy_test_failed_, "{{ x ", "{}", NULL, "line 1:1", "never closed");
    expect_error(zy_test_failed_, "{{ (1, 2 }}", "{}", NULL, "line 1:10", "unexpected '}'");
    expect_error(zy_test_failed_, "{{ 1 + }}", "{}", NULL, "line 1:8", "unexpected end of print statement");
    expect_error(zy_test_failed_, "{# open comment", "{}", NULL, "line 1:1", "missing end of comment tag");
    expect_error(zy_test_failed_, "{% break %}", "{}", NULL, "line 1:4", "'break' outside of a loop");
    expect_error(zy_test_failed_, "{% for x in y recursive %}{% endfor %}", "{}", NULL, "line 1:15", "recursive");
    expect_error(zy_test_failed_, "{{ x is defined is none }}", "{}", NULL, "line 1:17", "chain multiple tests");
    expect_error(zy_test_failed_, "{{ '\\N{BULLET}' }}", "{}", NULL, "line 1:4", "\\N{...}");
    expect_error(zy_test_failed_, "{{ \xff }}", "{}", NULL, "not valid UTF-8", NULL);
    expect_error(zy_test_failed_, "{% macro m(a=1, b) %}{% endmacro %}", "{}", NULL, "non-default argument", NULL);
    expect_error(zy_test_failed_, "{{ café }}", "{}", NULL, "line 1:4", "non-ASCII");
}

TEST(chat_template_deferred_errors_match_jinja2) {
    ZyErr err;
    /* jinja2 turns an unknown filter inside an if into a runtime error, raised only if it runs */
    char *got = render("{% if false %}{{ x | from_json }}{% endif %}ok{{ 1 if true else y|nope }}", "{}", NULL, &err);
    CHECK_MSG(got && strcmp(got, "ok1") == 0, "%s", got ? got : err.msg);
    free(got);
    expect_error(zy_test_failed_, "{% if true %}\n  {{ x | from_json }}{% endif %}", "{}", NULL, "line 2:10",
                 "No filter named 'from_json' found.");
    /* a jinja2 filter this engine lacks fails where it runs */
    got = render("{% if false %}{{ x | wordwrap(3) }}{% endif %}fine", "{}", NULL, &err);
    CHECK_MSG(got && strcmp(got, "fine") == 0, "%s", got ? got : err.msg);
    free(got);
    expect_error(zy_test_failed_, "{{ 'x' | center(9) }}", "{}", NULL, "line 1:10", "unsupported filter 'center'");
}

TEST(chat_template_runtime_errors_follow_jinja2_undefined) {
    expect_error(zy_test_failed_, "{{ x.y }}", "{}", NULL, "line 1:4", "'x' is undefined");
    expect_error(zy_test_failed_, "\n\n  {{ m.content.strip() }}", "{\"m\": {}}", NULL, "line 3:",
                 "'dict object' has no attribute 'content'");
    expect_error(zy_test_failed_, "{{ messages[5]['role'] }}", "{\"messages\": []}", NULL, "line 1:",
                 "list object has no element 5");
    expect_error(zy_test_failed_, "{{ x + 1 }}", "{}", NULL, "'x' is undefined", NULL);
    expect_error(zy_test_failed_, "{{ x|tojson }}", "{}", NULL, "not JSON serializable", NULL);
    expect_error(zy_test_failed_, "{{ raise_exception('Roles must alternate!') }}", "{}", NULL, "line 1:4",
                 "raise_exception: Roles must alternate!");
    expect_error(zy_test_failed_, "{{ 'a' + 1 }}", "{}", NULL, "unsupported operand type(s) for +: 'str' and 'int'", NULL);
    expect_error(zy_test_failed_, "{{ 1 // 0 }}", "{}", NULL, "division or modulo by zero", NULL);
    expect_error(zy_test_failed_, "{% for x in 5 %}{% endfor %}", "{}", NULL, "'int' object is not iterable", NULL);
    expect_error(zy_test_failed_, "{% set l = [] %}{{ l.append(1) }}", "{}", NULL,
                 "access to attribute 'append' of 'list' object is unsafe.", NULL);
    expect_error(zy_test_failed_, "{% set ns = namespace() %}{% set ns._x = 1 %}", "{}", NULL, "underscore-prefixed", NULL);
    expect_error(zy_test_failed_, "{% set a = 1 %}{% set a.b = 2 %}", "{}", NULL, "non-namespace object", NULL);
    expect_error(zy_test_failed_, "{{ [1, 'a']|sort }}", "{}", NULL, "'<' not supported between instances of 'str' and 'int'", NULL);
    expect_error(zy_test_failed_, "{{ range(1000000)|length }}", "{}", NULL, "Range too big", NULL);
    expect_error(zy_test_failed_, "{{ 2 ** 64 }}", "{}", NULL, "integer overflow", NULL);
    expect_error(zy_test_failed_, "{{ [1, 2]|select('odd') }}", "{}", NULL, "cannot print a generator", NULL);
    expect_error(zy_test_failed_, "{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}", "{}", NULL, "takes not more than 1", NULL);
    expect_error(zy_test_failed_, "{{ 'x' % 1 }}", "{}", NULL, "unsupported: % string formatting", NULL);
    expect_error(zy_test_failed_, "{% set a, b = [1] %}", "{}", NULL, "not enough values to unpack", NULL);
}

TEST(chat_template_limits_bound_untrusted_templates) {
    ChatRenderOpts small = {.max_output = 1000, .max_memory = 64 << 20, .max_steps = 100000};
    expect_error(zy_test_failed_, "{% for i in range(2000) %}xx{% endfor %}", "{}", &small, "exceed 1000 bytes", NULL);
    expect_error(zy_test_failed_, "{% for i in range(100000) %}{% for j in [1, 2, 3] %}{% endfor %}{% endfor %}",
                 "{}", &small, "ran too long", NULL);
    expect_error(zy_test_failed_, "{% macro r(n) %}{{ r(n + 1) }}{% endmacro %}{{ r(0) }}", "{}", NULL,
                 "nests or recurses too deeply", NULL);
    ChatRenderOpts mem = {.max_memory = 8 << 20};
    expect_error(zy_test_failed_, "{% set s = 'x' * 100000 %}{% set l = [s] * 10000 %}{% for x in l %}{{ x ~ x }}{% endfor %}",
                 "{}", &mem, "more than 8 MiB of memory", NULL);
    /* bulk work inside one step is paid for too: comparing big lists in a loop, an empty sequence times 10**18
     * (a fuzzer's find: it looped 10**18 times) */
    expect_error(zy_test_failed_, "{% set l = range(50000)|list %}{% set m = range(50000)|list %}{% for i in range(1000) %}{% if l == m %}{% endif %}{% endfor %}",
                 "{}", &small, "ran too long", NULL);
    ZyErr err;
    char *got = render("21{{66666666666666621* e }}{{ '' * 666666666666666621 }}", "{\"e\": []}", &small, &err);
    CHECK_MSG(got && strcmp(got, "21[]") == 0, "%s", got ? got : err.msg);
    free(got);
    /* a value nested as deep as a loop can make it is refused, not a stack overflow */
    ChatRenderOpts big = {.max_steps = 10000000};
    expect_error(zy_test_failed_, "{% set ns = namespace(v=[]) %}{% for i in range(5000) %}{% set ns.v = [ns.v] %}{% endfor %}{{ ns.v }}",
                 "{}", &big, "nested too deeply", NULL);
    /* deeply nested brackets: a parse error */
    char deep[2000];
    size_t k = 0;
    k += (size_t)snprintf(deep + k, sizeof deep - k, "{{ ");
    for (int i = 0; i < 600; i++) deep[k++] = '(';
    deep[k++] = '1';
    for (int i = 0; i < 600; i++) deep[k++] = ')';
    snprintf(deep + k, sizeof deep - k, " }}");
    expect_error(zy_test_failed_, deep, "{}", NULL, "too deeply", NULL);
    /* JSON nested too deeply */
    char deepjson[3000];
    k = 0;
    k += (size_t)snprintf(deepjson, sizeof deepjson, "{\"v\": ");
    for (int i = 0; i < 1000; i++) deepjson[k++] = '[';
    for (int i = 0; i < 1000; i++) deepjson[k++] = ']';
    snprintf(deepjson + k, sizeof deepjson - k, "}");
    expect_error(zy_test_failed_, "x", deepjson, NULL, "nested too deeply", NULL);
}

TEST(chat_template_variables_json) {
    ZyErr err;
    /* Python's json: int vs float kept, key order kept, last duplicate wins in the first place, NaN accepted */
    char *got = render("{{ v }} {{ d }} {{ d|tojson }}", "{\"v\": [1, 1.0, 1e2, -0, NaN, 12345678901234567890],"
                       "\"d\": {\"z\": 1, \"a\": 2, \"z\": 3, \"\\u00e9\\ud83d\\ude00\": \"\\n\"}}", NULL, &err);
    CHECK_MSG(got && strcmp(got, "[1, 1.0, 100.0, 0, nan, 1.2345678901234567e+19] {'z': 3, 'a': 2, '\xc3\xa9\xf0\x9f\x98\x80': '\\n'} "
                                 "{\"z\": 3, \"a\": 2, \"\xc3\xa9\xf0\x9f\x98\x80\": \"\\n\"}") == 0,
              "%s", got ? got : err.msg);
    free(got);
    expect_error(zy_test_failed_, "x", "[1]", NULL, "a JSON object is required", NULL);
    expect_error(zy_test_failed_, "x", "{\"a\": 1,}", NULL, "invalid JSON at line 1 column 9", NULL);
    expect_error(zy_test_failed_, "x", "{\"a\": \"\\ud800\"}", NULL, "unpaired surrogate", NULL);
    expect_error(zy_test_failed_, "x", "{\"a\": \"\xc3\"}", NULL, "not valid UTF-8", NULL);
}

TEST(chat_template_strftime_now_fixed_date) {
    ChatRenderOpts o = {.have_now = 1, .now = 1721952000}; /* 2024-07-26 00:00 UTC */
    ZyErr err;
    char *got = render("{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%Y-%m-%d %H:%M') }}", "{}", &o, &err);
    CHECK_MSG(got && strcmp(got, "26 Jul 2024|2024-07-26 00:00") == 0, "%s", got ? got : err.msg);
    free(got);
}

/* A model folder as transformers saves one: the loader, special tokens, apply_chat_template's normalisation. */
static int write_file(const char *dir, const char *name, const char *text) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    fputs(text, f);
    return fclose(f);
}

TEST(chat_template_config_and_apply_chat_template) {
    char dir[256], path[512];
    REQUIRE(zy_test_tmpdir(dir, sizeof dir, "chat") == 0);
    ZyErr err;
    ChatConfig cfg;
    /* nothing there */
    CHECK(chat_config_load(dir, &cfg, &err) != 0 && strstr(err.msg, "no chat template"));
    /* tokenizer_config.json: the template as a string, special tokens as strings and AddedToken objects */
    REQUIRE(write_file(dir, "tokenizer_config.json",
                       "{\"bos_token\": {\"content\": \"<s>\", \"lstrip\": false}, \"eos_token\": \"</s>\", \"pad_token\": null,"
                       " \"model_max_length\": 1000000000000000019884624838656,"
                       " \"chat_template\": \"{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}"
                       "{{ m.reasoning_content }}|{{ m.thinking }}|{{ m.keys()|list|join(',') }}{% endfor %}"
                       "{{ tools|tojson }}{{ add_generation_prompt }}{{ flag }}{{ word }}{{ eos_token }}\"}") == 0);
    REQUIRE(chat_config_load(dir, &cfg, &err) == 0);
    CHECK(cfg.special[0] && strcmp(cfg.special[0], "<s>") == 0);
    CHECK(cfg.special[1] && strcmp(cfg.special[1], "</s>") == 0);
    CHECK(cfg.special[4] == NULL);
    CHECK(strstr(cfg.origin, "tokenizer_config.json") != NULL);
    const char *msgs = "[{\"role\": \"user\", \"content\": \"hi\", \"name\": null},"
                       " {\"role\": \"assistant\", \"content\": \"ok\", \"reasoning\": \"think\"}]";
    const char *sets[] = {"flag=false", "word=two words", "eos_token=\"<E>\""};
    ChatInput in = {msgs, strlen(msgs), "[{\"type\": \"function\"}]", 22, 1, sets, 3};
    char *out = NULL;
    size_t len;
    CHECK_MSG(chat_render(&cfg, &in, NULL, &out, &len, &err) == 0, "%s", err.msg);
    const char *want = "<s>[user]hi||role,content[assistant]okthink|think|thinking,role,content,reasoning,reasoning_content"
                       "[{\"type\": \"function\"}]TrueFalsetwo words<E>";
    CHECK_MSG(out && strcmp(out, want) == 0, "got [%s]", out ? out : "");
    free(out);
    /* --set of a reserved name, an empty conversation, a non-object message */
    const char *bad_set[] = {"messages=[]"};
    ChatInput in2 = {msgs, strlen(msgs), NULL, 0, 0, bad_set, 1};
    CHECK(chat_render(&cfg, &in2, NULL, &out, &len, &err) != 0 && strstr(err.msg, "--set messages"));
    ChatInput in3 = {"[]", 2, NULL, 0, 0, NULL, 0};
    CHECK(chat_render(&cfg, &in3, NULL, &out, &len, &err) != 0 && strstr(err.msg, "empty"));
    ChatInput in4 = {"[1]", 3, NULL, 0, 0, NULL, 0};
    CHECK(chat_render(&cfg, &in4, NULL, &out, &len, &err) != 0 && strstr(err.msg, "not a JSON object"));
    chat_config_free(&cfg);
    /* chat_template.jinja wins over tokenizer_config.json; a file path in the folder works too */
    REQUIRE(write_file(dir, "chat_template.jinja", "J{{ bos_token }}\n") == 0);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    REQUIRE(write_file(dir, "tokenizer.json", "{}") == 0);
    REQUIRE(chat_config_load(path, &cfg, &err) == 0);
    ChatInput in5 = {msgs, strlen(msgs), NULL, 0, 0, NULL, 0};
    CHECK_MSG(chat_render(&cfg, &in5, NULL, &out, &len, &err) == 0 && out && strcmp(out, "J<s>") == 0, "%s", out ? out : err.msg);
    free(out);
    chat_config_free(&cfg);
    /* a list of named templates: default, or tool_use when tools are given */
    REQUIRE(write_file(dir, "chat_template.jinja", "") == 0);
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    remove(path);
    REQUIRE(write_file(dir, "tokenizer_config.json",
                       "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T\"}, {\"name\": \"default\", \"template\": \"D\"}]}") == 0);
    REQUIRE(chat_config_load(dir, &cfg, &err) == 0);
    CHECK(strcmp(cfg.source, "D") == 0 && cfg.tool_source && strcmp(cfg.tool_source, "T") == 0);
    ChatRenderer *cr;
    REQUIRE(chat_renderer_new(&cfg, &cr, &err) == 0);
    const char *one = "[{\"role\": \"user\", \"content\": \"q\"}]";
    ChatInput plain = {one, strlen(one), NULL, 0, 0, NULL, 0}, tooled = {one, strlen(one), "[]", 2, 0, NULL, 0};
    CHECK(chat_renderer_render(cr, &plain, NULL, &out, &len, &err) == 0 && strcmp(out, "D") == 0);
    free(out);
    CHECK(chat_renderer_render(cr, &tooled, NULL, &out, &len, &err) == 0 && strcmp(out, "T") == 0);
    free(out);
    /* one JSON object per conversation: other members are variables */
    const char *obj = "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}], \"x\": 5}";
    CHECK(chat_renderer_render_json(cr, obj, strlen(obj), 0, NULL, &out, &len, &err) == 0 && strcmp(out, "D") == 0);
    free(out);
    CHECK(chat_renderer_render_json(cr, "{\"tools\": []}", 13, 0, NULL, &out, &len, &err) != 0 && strstr(err.msg, "no \"messages\""));
    chat_renderer_free(cr);
    chat_config_free(&cfg);
    REQUIRE(write_file(dir, "tokenizer_config.json", "{\"chat_template\": [{\"name\": \"rag\", \"template\": \"R\"}]}") == 0);
    CHECK(chat_config_load(dir, &cfg, &err) != 0 && strstr(err.msg, "none named 'default'") && strstr(err.msg, "'rag'"));
    /* the whole path generate uses */
    REQUIRE(write_file(dir, "tokenizer_config.json", "{\"bos_token\": \"<s>\", \"chat_template\": \"{{ bos_token }}"
                       "{{ messages[0].content }}{% if add_generation_prompt %}>{% endif %}\"}") == 0);
    REQUIRE(write_file(dir, "m.json", "[{\"role\": \"user\", \"content\": \"q\"}]") == 0);
    snprintf(path, sizeof path, "%s/m.json", dir);
    CHECK_MSG(chat_render_messages_file(dir, path, &out, &len, &err) == 0 && out && strcmp(out, "<s>q>") == 0 && len == 5,
              "%s", out ? out : err.msg);
    free(out);
    zy_test_rmtree(dir);
}
