/* Tool calls (src/serve/serve_tools.c): the formats' parsers on complete calls, several calls, text around them,
 * malformed calls left as content byte for byte, forced openings; fed whole, split at every byte and byte by byte,
 * with the same result; and the request checks of tools and tool_choice (a 400 naming the field). */
#include <stdlib.h>
#include <string.h>

#include "serve/serve_request.h"
#include "serve/serve_tools.h"
#include "test.h"
#include "util/util.h"

static const char *TOOLS = "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":"
                           "\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"},"
                           "\"code\":{\"type\":\"string\"},\"opts\":{\"type\":\"object\"}}}}},"
                           "{\"type\":\"function\",\"function\":{\"name\":\"now\"}}]";

/* Appends the events to a summary: content merged ("C[...]"), each call "T<index>(<id> <name> <arguments>)". */
static void summarize(const ToolEvents *ev, char *out, size_t cap, int *in_content) {
    for (int k = 0; k < ev->n; k++) {
        const ToolEvent *x = &ev->ev[k];
        size_t l = strlen(out);
        if (x->is_call) {
            snprintf(out + l, cap - l, "%sT%d(%s %s %s)", *in_content ? "]" : "", x->index, x->call.id, x->call.name,
                     x->call.arguments);
            *in_content = 0;
        } else {
            snprintf(out + l, cap - l, "%s%.*s", *in_content ? "" : "C[", (int)x->len, x->text);
            *in_content = 1;
        }
    }
}

/* The text fed in pieces cut at the given positions (ascending, within the text). */
static void parse_cut(const ToolFormat *f, const char *forced, const char *text, const size_t *cuts, int n_cuts,
                      char *out, size_t cap) {
    ToolParser *p = tool_parser_new(f, TOOLS, forced, "call_x");
    out[0] = 0;
    int in_content = 0;
    size_t at = 0, len = strlen(text);
    for (int i = 0; i <= n_cuts; i++) {
        const size_t to = i < n_cuts ? cuts[i] : len;
        ToolEvents ev = {0};
        tool_parser_feed(p, text + at, to - at, i == n_cuts, &ev);
        summarize(&ev, out, cap, &in_content);
        tool_events_free(&ev);
        at = to;
    }
    if (in_content) strncat(out, "]", cap - strlen(out) - 1);
    tool_parser_free(p);
}

/* Whole, then split at every byte and byte by byte: every way must give want. */
static int parses_as(const ToolFormat *f, const char *forced, const char *text, const char *want) {
    char got[4096];
    int ok = 1;
    parse_cut(f, forced, text, NULL, 0, got, sizeof got);
    if (strcmp(got, want) != 0) {
        fprintf(stderr, "    %s: whole\n      got  %s\n      want %s\n", f->name, got, want);
        return 0;
    }
    const size_t len = strlen(text);
    for (size_t k = 0; k <= len && ok; k++) {
        parse_cut(f, forced, text, &k, 1, got, sizeof got);
        if (strcmp(got, want) != 0) {
            fprintf(stderr, "    %s: split at byte %zu\n      got  %s\n      want %s\n", f->name, k, got, want);
            ok = 0;
        }
    }
    size_t *every = calloc(len + 1, sizeof *every);
    for (size_t k = 0; k < len; k++) every[k] = k;
    parse_cut(f, forced, text, every, (int)len, got, sizeof got);
    free(every);
    if (ok && strcmp(got, want) != 0) {
        fprintf(stderr, "    %s: byte by byte\n      got  %s\n      want %s\n", f->name, got, want);
        ok = 0;
    }
    return ok;
}

TEST(serve_tools_zaya_xml) {
    const ToolFormat *f = tool_format_find("zaya_xml");
    REQUIRE(f);
    /* one call after text: the declared string stays text, the integer is read as JSON */
    CHECK(parses_as(f, NULL, "Let me check.\n<zyphra_tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
                             "</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</zyphra_tool_call>",
                    "C[Let me check.]T0(call_x0 get_weather {\"city\":\"Paris\",\"days\":3})"));
    /* several calls, text after; a declared string that looks like JSON stays a string; an undeclared value and an
     * object are read as JSON; text that is not JSON stays text; multi-line values keep their inner newlines */
    CHECK(parses_as(f, NULL, "<zyphra_tool_call>\n<function=get_weather>\n<parameter=code>\ntrue\n</parameter>\n"
                             "<parameter=opts>\n{\"a\": [1, 2]}\n</parameter>\n<parameter=x>\n\"zaya cache\"\n"
                             "</parameter>\n</function>\n</zyphra_tool_call>\n<zyphra_tool_call>\n<function=now>\n"
                             "<parameter=note>\nline 1\nline 2\n</parameter>\n</function>\n</zyphra_tool_call>\n"
                             "Done: 🎉",
                    "T0(call_x0 get_weather {\"code\":\"true\",\"opts\":{\"a\":[1,2]},\"x\":\"zaya cache\"})"
                    "T1(call_x1 now {\"note\":\"line 1\\nline 2\"})C[Done: 🎉]"));
    /* no parameters; no closing tag at the end (the generation stopped at its eos) */
    CHECK(parses_as(f, NULL, "<zyphra_tool_call>\n<function=now>\n</function>", "T0(call_x0 now {})"));
    /* malformed: a parameter never closed, a missing function, junk after the function: the text, byte for byte */
    const char *bad[] = {
        ("Hi \n<zyphra_tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</function>\n</zyphra_tool_call>"
         " after"),
        "<zyphra_tool_call>\nget_weather(city=Paris)\n</zyphra_tool_call>",
        "<zyphra_tool_call>\n<function=now>\n</function>\njunk\n</zyphra_tool_call>",
        "<zyphra_tool_call>\n<function=two words>\n</function>\n</zyphra_tool_call>",
        "text that ends like an opening <zyphra_tool", "plain text, no calls at all \n\n", "",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char want[512];
        snprintf(want, sizeof want, bad[i][0] ? "C[%s]" : "%s", bad[i]);
        CHECK_MSG(parses_as(f, NULL, bad[i], want), "malformed %zu", i);
    }
    /* a malformed call, then a good one */
    CHECK(parses_as(f, NULL, "<zyphra_tool_call>oops</zyphra_tool_call> and <zyphra_tool_call><function=now>"
                             "</function></zyphra_tool_call>",
                    "C[<zyphra_tool_call>oops</zyphra_tool_call> and]T0(call_x0 now {})"));
}

TEST(serve_tools_qwen3_coder_and_hermes) {
    const ToolFormat *q = tool_format_find("qwen3_coder"), *h = tool_format_find("hermes");
    REQUIRE(q && h && !tool_format_find("nope"));
    CHECK(parses_as(q, NULL, "Sure.\n\n<tool_call>\n<function=get_weather>\n<parameter=days>\n2\n</parameter>\n"
                             "</function>\n</tool_call>",
                    "C[Sure.]T0(call_x0 get_weather {\"days\":2})"));
    CHECK(parses_as(h, NULL, "I'll call it.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
                             "\"Zürich\", \"days\": 2}}\n</tool_call>\n<tool_call>\n{\"arguments\": {}, \"name\": "
                             "\"now\"}\n</tool_call>",
                    "C[I'll call it.]T0(call_x0 get_weather {\"city\":\"Zürich\",\"days\":2})T1(call_x1 now {})"));
    /* arguments given as a string, and "parameters" (vLLM's hermes parser reads both); no closing tag at the end */
    CHECK(parses_as(h, NULL, "<tool_call>{\"name\": \"now\", \"arguments\": \"{}\"}</tool_call><tool_call>{\"name\": "
                             "\"get_weather\", \"parameters\": {\"days\": 1}}",
                    "T0(call_x0 now {})T1(call_x1 get_weather {\"days\":1})"));
    const char *bad[] = {
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": }\n</tool_call>",
        "x <tool_call>\n{\"arguments\": {}}\n</tool_call> y",
        "<tool_call>[1, 2]</tool_call>",
        "<tool_call>\n{\"name\": \"f\"",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char want[512];
        snprintf(want, sizeof want, "C[%s]", bad[i]);
        CHECK_MSG(parses_as(h, NULL, bad[i], want), "malformed %zu", i);
    }
}

TEST(serve_tools_forced_openings) {
    const ToolFormat *z = tool_format_find("zaya_xml"), *h = tool_format_find("hermes");
    char *named = tool_format_forced_opening(z, "get_weather"), *any = tool_format_forced_opening(z, NULL);
    char *hnamed = tool_format_forced_opening(h, "get_weather"), *hany = tool_format_forced_opening(h, NULL);
    REQUIRE(named && any && hnamed && hany);
    CHECK(strcmp(named, "<zyphra_tool_call>\n<function=get_weather>\n") == 0);
    CHECK(strcmp(any, "<zyphra_tool_call>\n<function=") == 0);
    CHECK(strcmp(hnamed, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": ") == 0);
    CHECK(strcmp(hany, "<tool_call>\n{\"name\": \"") == 0);
    /* a named call: whatever the model writes is that call, its arguments what parsed */
    CHECK(parses_as(z, named, "<parameter=city>\nRome\n</parameter>\n</function>\n</zyphra_tool_call>\nok",
                    "T0(call_x0 get_weather {\"city\":\"Rome\"})C[ok]"));
    CHECK(parses_as(z, named, "random tokens <parameter=city no end", "T0(call_x0 get_weather {})"));
    CHECK(parses_as(h, hnamed, "{\"city\": \"Rome\"}}\n</tool_call>", "T0(call_x0 get_weather {\"city\":\"Rome\"})"));
    CHECK(parses_as(h, hnamed, "{\"city\": Rome}}", "T0(call_x0 get_weather {\"city\": Rome})"));
    /* "required": the model names the function; if it does not, its text is content (the forced opening is not) */
    CHECK(parses_as(z, any, "now>\n</function>\n</zyphra_tool_call>", "T0(call_x0 now {})"));
    CHECK(parses_as(z, any, "no name at all", "C[no name at all]"));
    CHECK(parses_as(h, hany, "now\", \"arguments\": {}}</tool_call>", "T0(call_x0 now {})"));
    CHECK(parses_as(h, hany, "garbage", "C[garbage]"));
    free(named);
    free(any);
    free(hnamed);
    free(hany);
}

TEST(serve_tools_format_of_template) {
    CHECK(tool_format_of_template("x<zyphra_tool_call>\\n<function=") == tool_format_find("zaya_xml"));
    CHECK(tool_format_of_template("<tool_call>\\n<function=example>") == tool_format_find("qwen3_coder"));
    CHECK(tool_format_of_template("<tool_call>\\n{\"name\": <function-name>, \"arguments\": <args>}") ==
          tool_format_find("hermes"));
    CHECK(tool_format_of_template("<tool_call>{{ tc.name }}<arg_key>") == NULL); /* GLM's: not a format here */
    CHECK(tool_format_of_template("{{ messages }}") == NULL);
    CHECK(tool_format_of_template(NULL) == NULL);
    /* released templates (tests/oracle/chat_templates/): the format each one's instructions and tool_calls write */
    static const struct {
        const char *file, *format;
    } real[] = {
        {"Qwen3-Coder", "qwen3_coder"}, {"Qwen3.5-4B", "qwen3_coder"}, {"Qwen-Qwen2.5-7B-Instruct", "hermes"},
        {"Qwen-Qwen3-0.6B", "hermes"}, {"NousResearch-Hermes-3-Llama-3.1-8B-tool_use", "hermes"},
        {"GLM-4.6", NULL}, {"meta-llama-Llama-3.1-8B-Instruct", NULL}, {"mistralai-Mistral-Nemo-Instruct-2407", NULL},
        {"google-gemma-3-it", NULL},
    };
    for (size_t i = 0; i < sizeof real / sizeof *real; i++) {
        char path[256], *text = NULL;
        ZyErr err;
        snprintf(path, sizeof path, "tests/oracle/chat_templates/%s.jinja", real[i].file);
        REQUIRE(zy_read_text_file(path, &text, &err) == 0);
        const ToolFormat *f = tool_format_of_template(text);
        CHECK_MSG(real[i].format ? f && strcmp(f->name, real[i].format) == 0 : f == NULL, "%s: %s", real[i].file,
                  f ? f->name : "none");
        free(text);
    }
}

static int parse(const char *body, ServeRequest *r, ServeError *e) {
    return serve_request_parse(body, strlen(body), SERVE_CHAT, r, e);
}

TEST(serve_tools_request_checks) {
    ServeRequest r;
    ServeError e;
    const char *msgs = "\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]";
    char body[2048];
    snprintf(body, sizeof body, "{%s,\"tools\":%s,\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":"
             "\"now\"}}}", msgs, TOOLS);
    REQUIRE(parse(body, &r, &e) == 0);
    CHECK(r.tool_choice == TOOL_CHOICE_NAMED && strcmp(r.tool_name, "now") == 0 && r.n_tools == 2 && r.tools_json);
    CHECK(strstr(r.chat_json, "\"tools\"") != NULL); /* still rendered by the template */
    serve_request_free(&r);
    snprintf(body, sizeof body, "{\"tool_choice\":\"required\",%s,\"tools\":%s}", msgs, TOOLS); /* either order */
    REQUIRE(parse(body, &r, &e) == 0);
    CHECK(r.tool_choice == TOOL_CHOICE_REQUIRED);
    serve_request_free(&r);
    snprintf(body, sizeof body, "{%s,\"tools\":%s}", msgs, TOOLS);
    REQUIRE(parse(body, &r, &e) == 0);
    CHECK(r.tool_choice == TOOL_CHOICE_UNSET);
    serve_request_free(&r);
    /* an assistant's tool call sent back with arguments as a JSON string: the template gets the object */
    snprintf(body, sizeof body, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":"
             "\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\",\"function\":"
             "{\"name\":\"now\",\"arguments\":\"{\\\"tz\\\": \\\"UTC\\\"}\"}}]},{\"role\":\"tool\",\"tool_call_id\":"
             "\"call_1\",\"content\":\"12:00\"}]}");
    REQUIRE(parse(body, &r, &e) == 0);
    CHECK(strstr(r.chat_json, "\"arguments\":{\"tz\":\"UTC\"}") != NULL);
    serve_request_free(&r);
    struct {
        const char *fields, *param, *says;
    } bad[] = {
        {"\"tools\":{}", "tools", "must be a list"},
        {"\"tools\":[1]", "tools[0]", "must be an object"},
        {"\"tools\":[{\"type\":\"code\",\"function\":{\"name\":\"f\"}}]", "tools[0].type", "\"function\""},
        {"\"tools\":[{\"type\":\"function\"}]", "tools[0].function", "must be an object"},
        {"\"tools\":[{\"type\":\"function\",\"function\":{}}]", "tools[0].function.name", "is required"},
        {"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a b\"}}]", "tools[0].function.name", "letters"},
        {"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":7}}]", "tools[0].function.name", "letters"},
        {"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}},{\"type\":\"function\",\"function\":"
         "{\"name\":\"f\"}}]", "tools[1].function.name", "a second function"},
        {"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":[]}}]",
         "tools[0].function.parameters", "JSON schema object"},
        {"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"description\":1}}]",
         "tools[0].function.description", "must be a string"},
        {"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"params\":{}}}]", "tools[0].function.params",
         "unknown field 'params'"},
        {"\"tool_choice\":\"always\"", "tool_choice", "(got \"always\")"},
        {"\"tool_choice\":5", "tool_choice", "must be \"none\""},
        {"\"tool_choice\":\"required\"", "tool_choice", "needs a non-empty 'tools'"},
        {"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],\"tool_choice\":{\"type\":\"function\","
         "\"function\":{\"name\":\"g\"}}", "tool_choice", "'g', which is not in 'tools'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(body, sizeof body, "{%s,%s}", msgs, bad[i].fields);
        const int rc = parse(body, &r, &e);
        CHECK_MSG(rc != 0 && e.status == 400 && strcmp(e.param, bad[i].param) == 0 && strstr(e.message, bad[i].says),
                  "%s -> %d %s: %s", bad[i].fields, e.status, e.param, e.message);
        if (rc == 0) serve_request_free(&r);
    }
    snprintf(body, sizeof body, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\",\"tool_calls\":"
             "[]}]}");
    CHECK(parse(body, &r, &e) != 0 && strcmp(e.param, "messages[0].tool_calls") == 0);
    snprintf(body, sizeof body, "{\"model\":\"m\",\"messages\":[{\"role\":\"assistant\",\"content\":\"\","
             "\"tool_calls\":[{\"function\":{\"arguments\":\"{}\"}}]}]}");
    CHECK(parse(body, &r, &e) != 0 && strcmp(e.param, "messages[0].tool_calls[0].function") == 0);
}

TEST(serve_tools_plan) {
    ServeRequest r;
    ServeError e;
    const ToolFormat *z = tool_format_find("zaya_xml"), *parse_as;
    char *forced, body[2048];
    const char *one = "[{\"type\":\"function\",\"function\":{\"name\":\"now\"}}]";
    struct {
        const char *tools, *choice;
        const ToolFormat *server;
        int parses;
        const char *forced;
        int status;
    } cases[] = {
        {NULL, NULL, NULL, 0, NULL, 0},
        {TOOLS, NULL, z, 1, NULL, 0},
        {TOOLS, "\"auto\"", z, 1, NULL, 0},
        {TOOLS, "\"none\"", z, 0, NULL, 0},
        {TOOLS, "\"required\"", z, 1, "<zyphra_tool_call>\n<function=", 0},
        {one, "\"required\"", z, 1, "<zyphra_tool_call>\n<function=now>\n", 0},
        {TOOLS, "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}}", z, 1,
         "<zyphra_tool_call>\n<function=get_weather>\n", 0},
        {TOOLS, NULL, NULL, 0, NULL, 0},             /* no format known: the text as before */
        {TOOLS, "\"none\"", NULL, 0, NULL, 0},
        {TOOLS, "\"auto\"", NULL, 0, NULL, 400},     /* asked for, and no format known */
        {TOOLS, "\"required\"", NULL, 0, NULL, 400},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int l = snprintf(body, sizeof body, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]");
        if (cases[i].tools) l += snprintf(body + l, sizeof body - l, ",\"tools\":%s", cases[i].tools);
        if (cases[i].choice) l += snprintf(body + l, sizeof body - l, ",\"tool_choice\":%s", cases[i].choice);
        snprintf(body + l, sizeof body - l, "}");
        REQUIRE(serve_request_parse(body, strlen(body), SERVE_CHAT, &r, &e) == 0);
        const int rc = serve_tools_plan(cases[i].server, &r, &parse_as, &forced, &e);
        if (cases[i].status) {
            CHECK_MSG(rc != 0 && e.status == 400 && strcmp(e.param, "tool_choice") == 0 &&
                      strstr(e.message, "--tool-call-parser"), "case %zu", i);
        } else {
            CHECK_MSG(rc == 0 && (parse_as != NULL) == cases[i].parses &&
                      (cases[i].forced ? forced && strcmp(forced, cases[i].forced) == 0 : !forced), "case %zu", i);
        }
        free(forced);
        serve_request_free(&r);
    }
}
