/* Tool-call formats and their incremental parser (see serve_tools.h). */
#include "serve/serve_tools.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/util.h"

static const ToolFormat FORMATS[] = {
    {"zaya_xml", "<zyphra_tool_call>", "</zyphra_tool_call>", 1},
    {"qwen3_coder", "<tool_call>", "</tool_call>", 1},
    {"hermes", "<tool_call>", "</tool_call>", 0},
};
#define N_FORMATS ((int)(sizeof FORMATS / sizeof *FORMATS))

const ToolFormat *tool_format_find(const char *name) {
    for (int i = 0; name && i < N_FORMATS; i++)
        if (strcmp(FORMATS[i].name, name) == 0) return &FORMATS[i];
    return NULL;
}

const char *tool_format_names(void) { return "zaya_xml, qwen3_coder, hermes"; }

/* By the tags the template writes: ZAYA1's wrapper; the <function=...> body; hermes' JSON body (its instructions
 * name "name" and "arguments": GLM's <tool_call> holds neither and matches nothing). */
const ToolFormat *tool_format_of_template(const char *src) {
    if (!src) return NULL;
    if (strstr(src, "<zyphra_tool_call>")) return &FORMATS[0];
    if (!strstr(src, "<tool_call>")) return NULL;
    if (strstr(src, "<function=")) return &FORMATS[1];
    if (strstr(src, "\"name\"") && strstr(src, "\"arguments\"")) return &FORMATS[2];
    return NULL;
}

char *tool_format_forced_opening(const ToolFormat *f, const char *name) {
    const char *mid = f->xml ? "\n<function=" : "\n{\"name\": \"";
    const char *end = !name ? "" : f->xml ? ">\n" : "\", \"arguments\": ";
    size_t n = strlen(f->open) + strlen(mid) + (name ? strlen(name) : 0) + strlen(end) + 1;
    char *s = malloc(n);
    if (s) snprintf(s, n, "%s%s%s%s", f->open, mid, name ? name : "", end);
    return s;
}

void tool_events_free(ToolEvents *e) {
    for (int i = 0; i < e->n; i++) {
        free(e->ev[i].text);
        free(e->ev[i].call.id);
        free(e->ev[i].call.name);
        free(e->ev[i].call.arguments);
    }
    free(e->ev);
    *e = (ToolEvents){0};
}

static ToolEvent *event_add(ToolEvents *e) {
    if (e->n == e->cap) {
        int cap = e->cap ? 2 * e->cap : 8;
        ToolEvent *g = realloc(e->ev, sizeof *g * (size_t)cap);
        if (!g) return NULL;
        e->ev = g;
        e->cap = cap;
    }
    e->ev[e->n] = (ToolEvent){0};
    return &e->ev[e->n++];
}

/* A growing byte string. */
typedef struct {
    char *s;
    size_t len, cap;
} Buf;

static int buf_add(Buf *b, const char *s, size_t n) { return zy_str_append(&b->s, &b->len, &b->cap, s, n); }

static void buf_drop(Buf *b, size_t n) { /* the first n bytes */
    memmove(b->s, b->s + n, b->len - n);
    b->len -= n;
    b->s[b->len] = 0;
}

struct ToolParser {
    const ToolFormat *f;
    cJSON *tools;
    char id_prefix[80];
    Buf buf;          /* outside a call: content not yet handed out; inside: the call's body so far */
    Buf pre;          /* inside: the whitespace before the opening tag (content again if the call does not parse) */
    int inside;
    int after_call;   /* whitespace right after a call is its framing, not content */
    size_t forced;    /* inside a forced call: the body bytes the prompt put there (0: not forced) */
    int forced_named; /* that call's name was forced too */
    int n_calls;
};

ToolParser *tool_parser_new(const ToolFormat *f, const char *tools_json, const char *forced_opening,
                            const char *id_prefix) {
    ToolParser *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->f = f;
    p->tools = tools_json ? cJSON_Parse(tools_json) : NULL;
    snprintf(p->id_prefix, sizeof p->id_prefix, "%s", id_prefix ? id_prefix : "call_");
    const size_t ol = strlen(f->open);
    if (forced_opening && strncmp(forced_opening, f->open, ol) == 0) {
        const char *body = forced_opening + ol;
        p->inside = 1;
        p->forced = strlen(body);
        p->forced_named = p->forced && body[p->forced - 1] != (f->xml ? '=' : '"'); /* "=" / "\"": the name is next */
        if (buf_add(&p->buf, body, p->forced)) {
            tool_parser_free(p);
            return NULL;
        }
    }
    return p;
}

void tool_parser_free(ToolParser *p) {
    if (!p) return;
    cJSON_Delete(p->tools);
    free(p->buf.s);
    free(p->pre.s);
    free(p);
}

int tool_parser_calls(const ToolParser *p) { return p->n_calls; }

static int is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

static int emit_content(ToolEvents *out, const char *s, size_t n) {
    if (!n) return 0;
    ToolEvent *ev = event_add(out);
    if (!ev || !(ev->text = malloc(n + 1))) return -1;
    memcpy(ev->text, s, n);
    ev->text[n] = 0;
    ev->len = n;
    return 0;
}

/* The declared JSON type of a function's parameter ("" if the tools do not say). */
static const char *param_type(const cJSON *tools, const char *fn, const char *param) {
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(f, "name");
        if (!cJSON_IsString(name) || strcmp(name->valuestring, fn) != 0) continue;
        const cJSON *props = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(f, "parameters"),
                                                              "properties");
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(props, param), "type");
        if (cJSON_IsString(ty)) return ty->valuestring;
        if (cJSON_IsArray(ty) && cJSON_IsString(ty->child)) return ty->child->valuestring;
        return "";
    }
    return "";
}

/* A parameter's text as a JSON value: a declared string stays text; anything else is JSON where it parses. */
static cJSON *param_value(const char *type, const char *v, size_t n) {
    if (strcmp(type, "string") != 0) {
        const char *end = NULL;
        cJSON *j = cJSON_ParseWithLengthOpts(v, n, &end, 0);
        while (j && end < v + n && is_space(*end)) end++;
        if (j && end == v + n) return j;
        cJSON_Delete(j);
    }
    char *s = malloc(n + 1);
    if (!s) return NULL;
    memcpy(s, v, n);
    s[n] = 0;
    cJSON *j = cJSON_CreateString(s);
    free(s);
    return j;
}

static int starts(const char *s, const char *end, const char *lit) {
    size_t n = strlen(lit);
    return (size_t)(end - s) >= n && memcmp(s, lit, n) == 0;
}

static const char *find(const char *s, const char *end, const char *lit) {
    const size_t n = strlen(lit);
    for (const char *q = s; q + n <= end; q++)
        if (*q == *lit && memcmp(q, lit, n) == 0) return q;
    return NULL;
}

/* <function=NAME>\n(<parameter=P>\nVALUE\n</parameter>\n)*</function> (the newlines next to a value are framing).
 * lenient (a forced call): the call is what parsed before anything that does not fit. */
static int parse_xml(const ToolParser *p, const char *s, size_t n, int lenient, ToolCall *c) {
    const char *q = s, *end = s + n;
    while (q < end && is_space(*q)) q++;
    if (!starts(q, end, "<function=")) return -1;
    q += strlen("<function=");
    const char *name = q;
    while (q < end && *q != '>' && !is_space(*q) && *q != '<') q++;
    if (q == end || *q != '>' || q == name || q - name > 128) return -1;
    if (!(c->name = strndup(name, (size_t)(q - name)))) return -1;
    q++;
    cJSON *args = cJSON_CreateObject();
    int ok = args != NULL;
    while (ok) {
        while (q < end && is_space(*q)) q++;
        if (q == end || starts(q, end, "</function>")) {
            if (q < end) q += strlen("</function>");
            while (q < end && is_space(*q)) q++;
            ok = lenient || q == end;
            break;
        }
        const char *pn = q + strlen("<parameter="), *pe, *ve;
        if (!starts(q, end, "<parameter=") || !(pe = memchr(pn, '>', (size_t)(end - pn))) ||
            !(ve = find(pe + 1, end, "</parameter>"))) {
            ok = lenient;
            break;
        }
        const char *v = pe + 1;
        if (v < ve && *v == '\n') v++;
        const char *vend = ve;
        if (vend > v && vend[-1] == '\n') vend--;
        char *pname = strndup(pn, (size_t)(pe - pn));
        cJSON *val = pname ? param_value(param_type(p->tools, c->name, pname), v, (size_t)(vend - v)) : NULL;
        if (!val) {
            free(pname);
            ok = 0;
            break;
        }
        cJSON_DeleteItemFromObjectCaseSensitive(args, pname); /* a repeated parameter: the last one counts */
        cJSON_AddItemToObject(args, pname, val);
        free(pname);
        q = ve + strlen("</parameter>");
    }
    if (ok) ok = (c->arguments = cJSON_PrintUnformatted(args)) != NULL;
    cJSON_Delete(args);
    return ok ? 0 : -1;
}

/* {"name": NAME, "arguments": {...}} ("parameters" too, as vLLM's hermes parser reads it). lenient (a forced call
 * whose JSON does not parse): the name forced, and the arguments as the model wrote them. */
static int parse_json(const char *s, size_t n, size_t forced, const char *forced_name, ToolCall *c) {
    cJSON *j = cJSON_ParseWithLength(s, n);
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(j, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(j, "arguments");
    if (!args) args = cJSON_GetObjectItemCaseSensitive(j, "parameters");
    int rc = -1;
    if (cJSON_IsString(name) && name->valuestring[0] && (!args || cJSON_IsObject(args) || cJSON_IsString(args))) {
        c->name = strdup(name->valuestring);
        c->arguments = !args ? strdup("{}") : cJSON_IsString(args) ? strdup(args->valuestring)
                                                                   : cJSON_PrintUnformatted(args);
        rc = c->name && c->arguments ? 0 : -1;
    } else if (forced_name) {
        const char *a = s + (forced < n ? forced : n), *e = s + n; /* what the model wrote after "arguments": */
        while (a < e && is_space(*a)) a++;
        while (e > a && is_space(e[-1])) e--;
        int depth = 0;
        for (const char *q = a; q < e; q++) depth += (*q == '{') - (*q == '}');
        if (depth < 0 && e > a && e[-1] == '}') e--; /* the brace that closes the call's object */
        while (e > a && is_space(e[-1])) e--;
        c->name = strdup(forced_name);
        c->arguments = strndup(a, (size_t)(e - a));
        rc = c->name && c->arguments ? 0 : -1;
    }
    cJSON_Delete(j);
    return rc;
}

/* The forced name in a forced call's body prefix: the text after the last "=" or ": \"" up to the delimiter. */
static char *forced_name_of(const ToolParser *p) {
    const char *b = p->buf.s, *e = b + p->forced;
    const char *key = p->f->xml ? "<function=" : "{\"name\": \"";
    const char *k = find(b, e, key);
    if (!k) return NULL;
    k += strlen(key);
    const char *stop = memchr(k, p->f->xml ? '>' : '"', (size_t)(e - k));
    return stop ? strndup(k, (size_t)(stop - k)) : NULL;
}

/* The call whose body is buf[0, n): a ToolEvent, or content again if it does not parse. */
static int finish_call(ToolParser *p, size_t n, int closed, ToolEvents *out) {
    ToolCall c = {0};
    const int lenient = p->forced && p->forced_named;
    char *fname = lenient ? forced_name_of(p) : NULL;
    int ok = p->f->xml ? parse_xml(p, p->buf.s, n, lenient, &c) == 0
                       : parse_json(p->buf.s, n, p->forced, fname, &c) == 0;
    free(fname);
    int rc = 0;
    if (ok) {
        char id[128];
        snprintf(id, sizeof id, "%s%d", p->id_prefix, p->n_calls);
        ToolEvent *ev = event_add(out);
        if (!ev || !(c.id = strdup(id))) {
            rc = -1;
        } else {
            ev->is_call = 1;
            ev->call = c;
            ev->index = p->n_calls++;
            c = (ToolCall){0};
            p->after_call = 1;
        }
    } else { /* the text as it came: the whitespace before, the tags (not a forced opening: the prompt's), the body */
        const size_t skip = p->forced < n ? p->forced : n;
        rc = emit_content(out, p->pre.s ? p->pre.s : "", p->pre.len);
        if (!rc && !p->forced) rc = emit_content(out, p->f->open, strlen(p->f->open));
        if (!rc) rc = emit_content(out, p->buf.s + skip, n - skip);
        if (!rc && closed) rc = emit_content(out, p->f->close, strlen(p->f->close));
    }
    free(c.id);
    free(c.name);
    free(c.arguments);
    buf_drop(&p->buf, n + (closed ? strlen(p->f->close) : 0));
    p->pre.len = 0;
    p->inside = 0;
    p->forced = 0;
    p->forced_named = 0;
    return rc;
}

int tool_parser_feed(ToolParser *p, const char *s, size_t n, int final, ToolEvents *out) {
    if (buf_add(&p->buf, s, n)) return -1;
    const char *open = p->f->open, *close = p->f->close;
    const size_t ol = strlen(open);
    for (;;) {
        char *b = p->buf.s;
        if (p->inside) {
            const char *k = find(b, b + p->buf.len, close);
            if (!k && !final) return 0;
            if (finish_call(p, k ? (size_t)(k - b) : p->buf.len, k != NULL, out)) return -1;
            continue;
        }
        if (p->after_call) {
            size_t w = 0;
            while (w < p->buf.len && is_space(b[w])) w++;
            buf_drop(&p->buf, w);
            if (!p->buf.len) return 0;
            p->after_call = 0;
        }
        const char *k = find(b, b + p->buf.len, open);
        if (k) { /* content up to the call, less the whitespace before it (held until the call parses) */
            size_t w = (size_t)(k - b);
            while (w > 0 && is_space(b[w - 1])) w--;
            p->pre.len = 0;
            if (emit_content(out, b, w) || buf_add(&p->pre, b + w, (size_t)(k - b) - w)) return -1;
            buf_drop(&p->buf, (size_t)(k - b) + ol);
            p->inside = 1;
            continue;
        }
        size_t cut = p->buf.len;
        if (!final) { /* hold back what may begin an opening tag, and the whitespace before it */
            for (size_t h = ol - 1; h > 0; h--)
                if (h <= p->buf.len && memcmp(b + p->buf.len - h, open, h) == 0) {
                    cut = p->buf.len - h;
                    break;
                }
            while (cut > 0 && is_space(b[cut - 1])) cut--;
        }
        if (emit_content(out, b, cut)) return -1;
        buf_drop(&p->buf, cut);
        return 0;
    }
}

cJSON *tool_call_json(const ToolCall *c, int index, ToolJsonPart part) {
    cJSON *o = cJSON_CreateObject();
    if (part != TOOL_JSON_WHOLE) cJSON_AddNumberToObject(o, "index", index);
    if (part != TOOL_JSON_STREAM_ARGUMENTS) {
        cJSON_AddStringToObject(o, "id", c->id);
        cJSON_AddStringToObject(o, "type", "function");
    }
    cJSON *f = cJSON_AddObjectToObject(o, "function");
    if (part != TOOL_JSON_STREAM_ARGUMENTS) cJSON_AddStringToObject(f, "name", c->name);
    cJSON_AddStringToObject(f, "arguments", part == TOOL_JSON_STREAM_FIRST ? "" : c->arguments);
    return o;
}

#define BAD(param, ...) serve_error(e, 400, "invalid_request_error", param, __VA_ARGS__)

/* OpenAI's function names ([A-Za-z0-9_-]{1,64}; '.' too): safe inside the forced opening's tag or JSON string. */
static int good_name(const cJSON *v) {
    if (!cJSON_IsString(v)) return 0;
    const char *s = v->valuestring;
    size_t n = strlen(s);
    if (n < 1 || n > 64) return 0;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || *s == '_' ||
              *s == '-' || *s == '.'))
            return 0;
    return 1;
}

static int check_tool(const cJSON *t, int i, const cJSON *tools, ServeError *e) {
    char p[32], q[128];
    snprintf(p, sizeof p, "tools[%d]", i);
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(t, "type");
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
    if (!cJSON_IsObject(t)) return BAD(p, "'%s' must be an object {\"type\": \"function\", \"function\": {...}}", p);
    for (const cJSON *k = t->child; k; k = k->next)
        if (strcmp(k->string, "type") != 0 && strcmp(k->string, "function") != 0)
            return BAD(p, "'%s' has an unknown field '%.40s'", p, k->string);
    snprintf(q, sizeof q, "%s.type", p);
    if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "function") != 0)
        return BAD(q, "'%s' must be \"function\"", q);
    snprintf(q, sizeof q, "%s.function", p);
    if (!cJSON_IsObject(f)) return BAD(q, "'%s' must be an object with a name", q);
    for (const cJSON *k = f->child; k; k = k->next) {
        snprintf(q, sizeof q, "%s.function.%.40s", p, k->string);
        if (strcmp(k->string, "name") == 0) {
            if (!good_name(k))
                return BAD(q, "'%s' must be 1 to 64 letters, digits, '_', '-' or '.'", q);
            for (const cJSON *u = tools->child; u != t; u = u->next)
                if (strcmp(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(u, "function"),
                                                            "name")->valuestring, k->valuestring) == 0)
                    return BAD(q, "'%s': a second function named '%s'", q, k->valuestring);
        } else if (strcmp(k->string, "description") == 0) { /* null: not given, as in OpenAI's API */
            if (!cJSON_IsString(k) && !cJSON_IsNull(k)) return BAD(q, "'%s' must be a string", q);
        } else if (strcmp(k->string, "parameters") == 0) {
            if (!cJSON_IsObject(k) && !cJSON_IsNull(k)) return BAD(q, "'%s' must be a JSON schema object", q);
        } else if (strcmp(k->string, "strict") == 0) {
            if (!cJSON_IsBool(k) && !cJSON_IsNull(k)) return BAD(q, "'%s' must be true or false", q);
        } else {
            return BAD(q, "'%s.function' has an unknown field '%.40s'", p, k->string);
        }
    }
    if (!cJSON_GetObjectItemCaseSensitive(f, "name")) {
        snprintf(q, sizeof q, "%s.function.name", p);
        return BAD(q, "'%s' is required", q);
    }
    return 0;
}

static int has_tool(const cJSON *tools, const char *name) {
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        if (strcmp(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(t, "function"), "name")
                       ->valuestring, name) == 0)
            return 1;
    }
    return 0;
}

int serve_tools_parse_request(const cJSON *tools, const cJSON *choice, ServeRequest *r, ServeError *e) {
    if (tools) {
        if (!cJSON_IsArray(tools) || cJSON_GetArraySize(tools) > SERVE_MAX_TOOLS)
            return BAD("tools", "'tools' must be a list of at most %d {\"type\": \"function\", \"function\": {...}} "
                                "objects", SERVE_MAX_TOOLS);
        int i = 0;
        for (const cJSON *t = tools->child; t; t = t->next, i++)
            if (check_tool(t, i, tools, e)) return -1;
        r->n_tools = i;
        if (!(r->tools_json = cJSON_PrintUnformatted(tools)))
            return serve_error(e, 500, "server_error", "tools", "out of memory");
    }
    if (!choice) return 0;
    if (cJSON_IsString(choice)) {
        const char *s = choice->valuestring;
        r->tool_choice = strcmp(s, "auto") == 0       ? TOOL_CHOICE_AUTO
                         : strcmp(s, "none") == 0     ? TOOL_CHOICE_NONE
                         : strcmp(s, "required") == 0 ? TOOL_CHOICE_REQUIRED
                                                      : TOOL_CHOICE_UNSET;
        if (r->tool_choice == TOOL_CHOICE_UNSET)
            return BAD("tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": "
                                      "\"function\", \"function\": {\"name\": ...}} (got \"%.40s\")", s);
    } else {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(choice, "type");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(choice, "function"),
                                                             "name");
        if (!cJSON_IsObject(choice) || !cJSON_IsString(ty) || strcmp(ty->valuestring, "function") != 0 ||
            !cJSON_IsString(name))
            return BAD("tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": "
                                      "\"function\", \"function\": {\"name\": ...}}");
        if (!tools || !has_tool(tools, name->valuestring))
            return BAD("tool_choice", "'tool_choice' names the function '%.64s', which is not in 'tools'",
                       name->valuestring);
        r->tool_choice = TOOL_CHOICE_NAMED;
        if (!(r->tool_name = strdup(name->valuestring)))
            return serve_error(e, 500, "server_error", "tool_choice", "out of memory");
    }
    if (r->tool_choice == TOOL_CHOICE_REQUIRED && r->n_tools == 0)
        return BAD("tool_choice", "'tool_choice' \"required\" needs a non-empty 'tools' list");
    return 0;
}

int serve_tools_message(cJSON *msg, const char *p, ServeError *e) {
    cJSON *calls = cJSON_GetObjectItemCaseSensitive(msg, "tool_calls");
    if (!calls || cJSON_IsNull(calls)) return 0;
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(msg, "role");
    char q[96];
    snprintf(q, sizeof q, "%s.tool_calls", p);
    if (strcmp(role->valuestring, "assistant") != 0) return BAD(q, "'%s': only assistant messages have tool calls", q);
    if (!cJSON_IsArray(calls)) return BAD(q, "'%s' must be a list of {\"id\", \"type\": \"function\", \"function\": "
                                             "{\"name\", \"arguments\"}} objects", q);
    int i = 0;
    for (cJSON *c = calls->child; c; c = c->next, i++) {
        snprintf(q, sizeof q, "%s.tool_calls[%d].function", p, i);
        cJSON *f = cJSON_GetObjectItemCaseSensitive(c, "function");
        cJSON *args = cJSON_GetObjectItemCaseSensitive(f, "arguments");
        if (!cJSON_IsObject(f) || !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(f, "name")))
            return BAD(q, "'%s' must be an object with a name and arguments", q);
        if (cJSON_IsString(args)) { /* arguments that are not JSON stay the string they are */
            cJSON *obj = cJSON_Parse(args->valuestring);
            if (cJSON_IsObject(obj)) cJSON_ReplaceItemInObjectCaseSensitive(f, "arguments", obj);
            else cJSON_Delete(obj);
        }
    }
    return 0;
}

int serve_tools_plan(const ToolFormat *f, const ServeRequest *r, const ToolFormat **parse, char **forced,
                     ServeError *e) {
    *parse = NULL;
    *forced = NULL;
    const ToolChoice c = r->tool_choice;
    if (!r->tools_json || c == TOOL_CHOICE_NONE) return 0; /* "none": the tools are still rendered, as vLLM does */
    if (!f) {
        if (c == TOOL_CHOICE_UNSET) return 0; /* as before tool calls were parsed: the calls stay in the text */
        return BAD("tool_choice", "'tool_choice' needs a tool-call parser, and this model's chat template writes "
                                  "calls in no format zaya knows: start zaya serve with --tool-call-parser NAME (%s)",
                   tool_format_names());
    }
    *parse = f;
    /* "required" with one tool can only call that one: its name is forced too */
    const char *name = c == TOOL_CHOICE_NAMED ? r->tool_name : NULL;
    char *only = NULL;
    if (c == TOOL_CHOICE_REQUIRED && r->n_tools == 1) {
        cJSON *tools = cJSON_Parse(r->tools_json);
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(
            cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(tools, 0), "function"), "name");
        only = cJSON_IsString(n) ? strdup(n->valuestring) : NULL;
        cJSON_Delete(tools);
        name = only;
    }
    if ((c == TOOL_CHOICE_REQUIRED || c == TOOL_CHOICE_NAMED) && !(*forced = tool_format_forced_opening(f, name))) {
        free(only);
        return serve_error(e, 500, "server_error", "tool_choice", "out of memory");
    }
    free(only);
    return 0;
}
