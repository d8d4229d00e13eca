/* JSON Schema → node graph → byte-level pushdown automaton (see json_grammar.h). */
#include "infer/json_grammar.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { K_UNION, K_OBJECT, K_GOBJECT, K_ARRAY, K_STRING, K_NUMBER, K_INTEGER, K_LITERALS };
/* The free-form nodes every grammar has (json_object, {} and schemas without properties or items use them). */
enum { N_ANY, N_GOBJECT, N_GARRAY, N_STRING, N_NUMBER, N_INTEGER, N_BOOL, N_NULL, N_FIXED };

typedef struct {
    int kind;
    long min_len;      /* bytes of the shortest value */
    uint8_t first[32]; /* the bytes a value can start with */
    int items, min_items, max_items; /* array */
    int n;             /* properties, literals or alternatives */
    char **text;       /* property names as JSON strings ("name", quotes included), or the literals as JSON */
    int *text_len;
    int *child;        /* properties' value nodes, or the alternatives */
    uint8_t *required;
    long *req_from;    /* [n + 1]: bytes of the required properties from k on, each "key":value at its shortest */
    int *nreq_from;    /* [n + 1]: how many */
    long *opt_from;    /* [n + 1]: the cheapest property from k on (LONG_MAX / 4: none) */
} Node;

struct JsonGrammar {
    Node *nodes;
    int n_nodes, cap;
    int root;
};

#define NONE (LONG_MAX / 4)

static int first_has(const uint8_t *set, uint8_t c) { return set[c >> 3] >> (c & 7) & 1; }
static void first_add(uint8_t *set, uint8_t c) { set[c >> 3] |= (uint8_t)(1u << (c & 7)); }
static void first_add_str(uint8_t *set, const char *s) {
    for (; *s; s++) first_add(set, (uint8_t)*s);
}

static void node_free(Node *n) {
    for (int i = 0; n->text && i < n->n; i++) free(n->text[i]);
    free(n->text);
    free(n->text_len);
    free(n->child);
    free(n->required);
    free(n->req_from);
    free(n->nreq_from);
    free(n->opt_from);
}

void json_grammar_free(JsonGrammar *g) {
    if (!g) return;
    for (int i = 0; i < g->n_nodes; i++) node_free(&g->nodes[i]);
    free(g->nodes);
    free(g);
}

static int new_node(JsonGrammar *g, int kind, ZyErr *err) {
    if (g->n_nodes == JG_MAX_NODES) return zy_fail(err, "the schema is too large (more than %d nodes)", JG_MAX_NODES);
    if (g->n_nodes == g->cap) {
        int cap = g->cap ? 2 * g->cap : 32;
        Node *nn = realloc(g->nodes, sizeof *nn * (size_t)cap);
        if (!nn) return zy_fail(err, "out of memory");
        g->nodes = nn;
        g->cap = cap;
    }
    Node *n = &g->nodes[g->n_nodes];
    memset(n, 0, sizeof *n);
    n->kind = kind;
    return g->n_nodes++;
}

/* Sizes a node's per-entry arrays for n entries. */
static int node_entries(Node *n, int count, int with_props) {
    n->n = count;
    n->text = calloc((size_t)count + 1, sizeof *n->text);
    n->text_len = calloc((size_t)count + 1, sizeof *n->text_len);
    n->child = calloc((size_t)count + 1, sizeof *n->child);
    if (!n->text || !n->text_len || !n->child) return -1;
    if (!with_props) return 0;
    n->required = calloc((size_t)count + 1, 1);
    n->req_from = calloc((size_t)count + 1, sizeof *n->req_from);
    n->nreq_from = calloc((size_t)count + 1, sizeof *n->nreq_from);
    n->opt_from = calloc((size_t)count + 1, sizeof *n->opt_from);
    return n->required && n->req_from && n->nreq_from && n->opt_from ? 0 : -1;
}

/* A literal set node over values already written as JSON. */
static int literal_node(JsonGrammar *g, const char *const *lits, int count, ZyErr *err) {
    int id = new_node(g, K_LITERALS, err);
    if (id < 0) return -1;
    Node *n = &g->nodes[id];
    if (node_entries(n, count, 0)) return zy_fail(err, "out of memory");
    n->min_len = NONE;
    for (int i = 0; i < count; i++) {
        if (!(n->text[i] = strdup(lits[i]))) return zy_fail(err, "out of memory");
        n->text_len[i] = (int)strlen(lits[i]);
        if (n->text_len[i] < n->min_len) n->min_len = n->text_len[i];
        first_add(n->first, (uint8_t)lits[i][0]);
    }
    return id;
}

static int fixed_nodes(JsonGrammar *g, ZyErr *err) {
    static const int kinds[N_FIXED] = {K_UNION, K_GOBJECT, K_ARRAY, K_STRING, K_NUMBER, K_INTEGER, -1, -1};
    for (int i = 0; i < N_BOOL; i++)
        if (new_node(g, kinds[i], err) < 0) return -1;
    if (literal_node(g, (const char *[]){"true", "false"}, 2, err) < 0) return -1;
    if (literal_node(g, (const char *[]){"null"}, 1, err) < 0) return -1;
    Node *nd = g->nodes;
    nd[N_GOBJECT].min_len = 2;
    first_add(nd[N_GOBJECT].first, '{');
    nd[N_GARRAY].min_len = 2;
    nd[N_GARRAY].items = N_ANY;
    nd[N_GARRAY].max_items = INT_MAX;
    first_add(nd[N_GARRAY].first, '[');
    nd[N_STRING].min_len = 2;
    first_add(nd[N_STRING].first, '"');
    for (int i = N_NUMBER; i <= N_INTEGER; i++) {
        nd[i].min_len = 1;
        first_add_str(nd[i].first, "-0123456789");
    }
    static const int any[] = {N_GOBJECT, N_GARRAY, N_STRING, N_NUMBER, N_BOOL, N_NULL};
    Node *a = &nd[N_ANY];
    if (node_entries(a, 6, 0)) return zy_fail(err, "out of memory");
    a->min_len = 1;
    for (int i = 0; i < 6; i++) {
        a->child[i] = any[i];
        for (int b = 0; b < 32; b++) a->first[b] |= nd[any[i]].first[b];
    }
    return 0;
}

/* ---- compiling a schema ------------------------------------------------------------------------------------ */

typedef struct {
    JsonGrammar *g;
    const cJSON *root;
    int ref_depth;
} Compiler;

static int compile(Compiler *cx, const cJSON *s, const char *path, int depth, ZyErr *err);

static const char *at(const char *path) { return *path ? path : "the top level"; }

static int is_key(const char *k, const char *const *list) {
    for (; *list; list++)
        if (strcmp(k, *list) == 0) return 1;
    return 0;
}

static char *json_text(const cJSON *v) {
    return cJSON_PrintUnformatted(v);
}

/* The alternatives of a union must start with different bytes, so the first byte picks one. */
static int union_node(Compiler *cx, const int *alts, int count, const char *path, const char *what, ZyErr *err) {
    if (count == 1) return alts[0];
    int id = new_node(cx->g, K_UNION, err);
    if (id < 0) return -1;
    Node *n = &cx->g->nodes[id];
    if (node_entries(n, count, 0)) return zy_fail(err, "out of memory");
    n->min_len = NONE;
    for (int i = 0; i < count; i++) {
        const Node *c = &cx->g->nodes[alts[i]];
        for (int b = 0; b < 256; b++)
            if (first_has(c->first, (uint8_t)b) && first_has(n->first, (uint8_t)b))
                return zy_fail(err, "%s: two alternatives can start with '%c'; zaya needs the alternatives of a union to "
                               "start differently (e.g. different types) (at %s)", what, b, at(path));
        for (int b = 0; b < 32; b++) n->first[b] |= c->first[b];
        n->child[i] = alts[i];
        if (c->min_len < n->min_len) n->min_len = c->min_len;
    }
    return id;
}

static int get_count(const cJSON *v, const char *key, const char *path, int *out, ZyErr *err) {
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 1e9 || v->valuedouble != (int)v->valuedouble)
        return zy_fail(err, "'%s' must be a non-negative integer (at %s)", key, at(path));
    *out = (int)v->valuedouble;
    return 0;
}

static int object_node(Compiler *cx, const cJSON *s, const char *path, int depth, ZyErr *err) {
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
    const cJSON *addl = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    if (addl && !cJSON_IsBool(addl))
        return zy_fail(err, "'additionalProperties' must be true or false (a schema there is not supported) (at %s)",
                       at(path));
    if (props && !cJSON_IsObject(props)) return zy_fail(err, "'properties' must be an object (at %s)", at(path));
    if (req && !cJSON_IsArray(req)) return zy_fail(err, "'required' must be a list of names (at %s)", at(path));
    const int count = props ? cJSON_GetArraySize(props) : 0;
    if (!props && !req && !cJSON_IsFalse(addl)) return N_GOBJECT; /* any object */
    if (count > JG_MAX_PROPS)
        return zy_fail(err, "'properties' has %d entries; at most %d are supported (at %s)", count, JG_MAX_PROPS,
                       at(path));
    const cJSON *r;
    cJSON_ArrayForEach(r, req) {
        if (!cJSON_IsString(r)) return zy_fail(err, "'required' must be a list of names (at %s)", at(path));
        if (!props || !cJSON_GetObjectItemCaseSensitive(props, r->valuestring))
            return zy_fail(err, "'required' names \"%s\", which is not in 'properties' (at %s)", r->valuestring,
                           at(path));
    }
    int kids[JG_MAX_PROPS];
    int k = 0;
    const cJSON *p;
    cJSON_ArrayForEach(p, props) {
        char sub[512];
        snprintf(sub, sizeof sub, "%s%sproperties.%s", path, *path ? "." : "", p->string);
        for (const cJSON *q = props->child; q != p; q = q->next)
            if (strcmp(q->string, p->string) == 0)
                return zy_fail(err, "'properties' names \"%s\" twice (at %s)", p->string, at(path));
        if ((kids[k++] = compile(cx, p, sub, depth + 1, err)) < 0) return -1;
    }
    int id = new_node(cx->g, K_OBJECT, err);
    if (id < 0) return -1;
    Node *n = &cx->g->nodes[id];
    if (node_entries(n, count, 1)) return zy_fail(err, "out of memory");
    first_add(n->first, '{');
    k = 0;
    cJSON_ArrayForEach(p, props) {
        cJSON *name = cJSON_CreateString(p->string);
        n->text[k] = name ? json_text(name) : NULL;
        cJSON_Delete(name);
        if (!n->text[k]) return zy_fail(err, "out of memory");
        n->text_len[k] = (int)strlen(n->text[k]);
        if (n->text_len[k] > JG_MAX_LITERAL)
            return zy_fail(err, "a property name is longer than %d bytes (at %s)", JG_MAX_LITERAL, at(path));
        n->child[k] = kids[k];
        cJSON_ArrayForEach(r, req) n->required[k] |= strcmp(r->valuestring, p->string) == 0;
        k++;
    }
    n->opt_from[count] = NONE;
    for (int i = count - 1; i >= 0; i--) {
        const long cost = n->text_len[i] + 1 + cx->g->nodes[n->child[i]].min_len; /* "key":value */
        n->req_from[i] = n->req_from[i + 1] + (n->required[i] ? cost : 0);
        n->nreq_from[i] = n->nreq_from[i + 1] + n->required[i];
        n->opt_from[i] = cost < n->opt_from[i + 1] ? cost : n->opt_from[i + 1];
    }
    n->min_len = 2 + (n->nreq_from[0] ? n->req_from[0] + n->nreq_from[0] - 1 : 0);
    return id;
}

static int array_node(Compiler *cx, const cJSON *s, const char *path, int depth, ZyErr *err) {
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
    const cJSON *mn = cJSON_GetObjectItemCaseSensitive(s, "minItems");
    const cJSON *mx = cJSON_GetObjectItemCaseSensitive(s, "maxItems");
    int min_items = 0, max_items = INT_MAX;
    if (mn && get_count(mn, "minItems", path, &min_items, err)) return -1;
    if (mx && get_count(mx, "maxItems", path, &max_items, err)) return -1;
    if (min_items > max_items)
        return zy_fail(err, "'minItems' (%d) is above 'maxItems' (%d) (at %s)", min_items, max_items, at(path));
    if (min_items > 4096) return zy_fail(err, "'minItems' above 4096 is not supported (at %s)", at(path));
    int it = N_ANY;
    if (items) {
        if (!cJSON_IsObject(items)) return zy_fail(err, "'items' must be a schema (at %s)", at(path));
        char sub[512];
        snprintf(sub, sizeof sub, "%s%sitems", path, *path ? "." : "");
        if ((it = compile(cx, items, sub, depth + 1, err)) < 0) return -1;
    }
    if (it == N_ANY && !mn && !mx) return N_GARRAY;
    int id = new_node(cx->g, K_ARRAY, err);
    if (id < 0) return -1;
    Node *n = &cx->g->nodes[id];
    n->items = it;
    n->min_items = min_items;
    n->max_items = max_items;
    const long mv = cx->g->nodes[it].min_len;
    n->min_len = 2 + (min_items ? min_items * mv + min_items - 1 : 0);
    first_add(n->first, '[');
    return id;
}

/* One type's node, from the keywords that type reads. */
static int typed_node(Compiler *cx, const cJSON *s, const char *type, const char *path, int depth, ZyErr *err) {
    if (strcmp(type, "object") == 0) return object_node(cx, s, path, depth, err);
    if (strcmp(type, "array") == 0) return array_node(cx, s, path, depth, err);
    if (strcmp(type, "string") == 0) return N_STRING;
    if (strcmp(type, "number") == 0) return N_NUMBER;
    if (strcmp(type, "integer") == 0) return N_INTEGER;
    if (strcmp(type, "boolean") == 0) return N_BOOL;
    if (strcmp(type, "null") == 0) return N_NULL;
    return zy_fail(err, "'type' \"%s\" is not a JSON Schema type (at %s)", type, at(path));
}

static int ref_node(Compiler *cx, const char *ref, const char *path, int depth, ZyErr *err) {
    const char *name = NULL, *where = NULL;
    if (strncmp(ref, "#/$defs/", 8) == 0) name = ref + 8, where = "$defs";
    else if (strncmp(ref, "#/definitions/", 14) == 0) name = ref + 14, where = "definitions";
    if (!name || strchr(name, '/') || strchr(name, '~'))
        return zy_fail(err, "'$ref' \"%s\": only \"#/$defs/NAME\" and \"#/definitions/NAME\" are supported (at %s)", ref,
                       at(path));
    const cJSON *defs = cJSON_GetObjectItemCaseSensitive(cx->root, where);
    const cJSON *target = cJSON_GetObjectItemCaseSensitive(defs, name);
    if (!target) return zy_fail(err, "'$ref' \"%s\" names nothing in the schema (at %s)", ref, at(path));
    if (cx->ref_depth >= 16)
        return zy_fail(err, "'$ref' \"%s\": recursive schemas are not supported (at %s)", ref, at(path));
    cx->ref_depth++;
    int id = compile(cx, target, ref + 2, depth, err);
    cx->ref_depth--;
    return id;
}

static int compile(Compiler *cx, const cJSON *s, const char *path, int depth, ZyErr *err) {
    static const char *const known[] = {"type", "properties", "required", "additionalProperties", "items", "minItems",
                                        "maxItems", "enum", "const", "anyOf", "oneOf", "$ref", "$defs", "definitions",
                                        NULL};
    static const char *const descriptive[] = {"title", "description", "$schema", "$id", "$comment", "default",
                                              "examples", "deprecated", "readOnly", "writeOnly", NULL};
    if (depth > JG_MAX_DEPTH - 1) return zy_fail(err, "the schema nests deeper than %d (at %s)", JG_MAX_DEPTH, at(path));
    if (cJSON_IsTrue(s)) return N_ANY;
    if (!cJSON_IsObject(s)) return zy_fail(err, "a schema must be an object (at %s)", at(path));
    const cJSON *k;
    cJSON_ArrayForEach(k, s) {
        if (is_key(k->string, known) || is_key(k->string, descriptive)) continue;
        return zy_fail(err, "'%s' is not supported (at %s)", k->string, at(path));
    }
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(s, "$ref");
    if (ref) {
        if (!cJSON_IsString(ref)) return zy_fail(err, "'$ref' must be a string (at %s)", at(path));
        return ref_node(cx, ref->valuestring, path, depth, err);
    }
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum"), *cn = cJSON_GetObjectItemCaseSensitive(s, "const");
    if (en || cn) { /* the values themselves (type, if given, is theirs to match) */
        if (en && (!cJSON_IsArray(en) || cJSON_GetArraySize(en) == 0 || cJSON_GetArraySize(en) > JG_MAX_ENUM))
            return zy_fail(err, "'enum' must be a list of 1 to %d values (at %s)", JG_MAX_ENUM, at(path));
        const int count = en ? cJSON_GetArraySize(en) : 1;
        char *lits[JG_MAX_ENUM];
        int ok = 1, got = 0;
        const cJSON *v = en ? en->child : cn;
        for (; ok == 1 && got < count; v = v->next) {
            ok = (lits[got] = json_text(v)) != NULL;
            got += ok;
            if (ok && strlen(lits[got - 1]) > JG_MAX_LITERAL) ok = -1;
        }
        int id = ok == 1 ? literal_node(cx->g, (const char *const *)lits, count, err)
                         : zy_fail(err, ok < 0 ? "'%s' holds a value longer than 4096 bytes as JSON (at %s)"
                                               : "out of memory ('%s', at %s)", en ? "enum" : "const", at(path));
        for (int i = 0; i < got; i++) free(lits[i]);
        return id;
    }
    const cJSON *any = cJSON_GetObjectItemCaseSensitive(s, "anyOf");
    const char *which = "anyOf";
    if (!any) any = cJSON_GetObjectItemCaseSensitive(s, "oneOf"), which = "oneOf";
    if (any) {
        if (!cJSON_IsArray(any) || cJSON_GetArraySize(any) == 0 || cJSON_GetArraySize(any) > 16)
            return zy_fail(err, "'%s' must be a list of 1 to 16 schemas (at %s)", which, at(path));
        int alts[16], n = 0;
        const cJSON *a;
        cJSON_ArrayForEach(a, any) {
            char sub[512];
            snprintf(sub, sizeof sub, "%s%s%s[%d]", path, *path ? "." : "", which, n);
            if ((alts[n++] = compile(cx, a, sub, depth + 1, err)) < 0) return -1;
        }
        return union_node(cx, alts, n, path, which, err);
    }
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(s, "type");
    if (cJSON_IsString(type)) return typed_node(cx, s, type->valuestring, path, depth, err);
    if (cJSON_IsArray(type) && cJSON_GetArraySize(type) > 0 && cJSON_GetArraySize(type) <= 7) {
        int alts[7], n = 0;
        const cJSON *t;
        cJSON_ArrayForEach(t, type) {
            if (!cJSON_IsString(t)) return zy_fail(err, "'type' must be a type name or a list of them (at %s)", at(path));
            if ((alts[n++] = typed_node(cx, s, t->valuestring, path, depth, err)) < 0) return -1;
        }
        return union_node(cx, alts, n, path, "type", err);
    }
    if (type) return zy_fail(err, "'type' must be a type name or a list of them (at %s)", at(path));
    if (cJSON_GetObjectItemCaseSensitive(s, "properties") || cJSON_GetObjectItemCaseSensitive(s, "required"))
        return object_node(cx, s, path, depth, err);
    if (cJSON_GetObjectItemCaseSensitive(s, "items")) return array_node(cx, s, path, depth, err);
    return N_ANY;
}

static int grammar_new(JsonGrammar **out, ZyErr *err) {
    *out = NULL;
    JsonGrammar *g = calloc(1, sizeof *g);
    if (!g) return zy_fail(err, "out of memory");
    if (fixed_nodes(g, err)) {
        json_grammar_free(g);
        return -1;
    }
    *out = g;
    return 0;
}

int json_grammar_compile(const cJSON *schema, JsonGrammar **out, ZyErr *err) {
    JsonGrammar *g;
    if (grammar_new(&g, err)) return -1;
    Compiler cx = {.g = g, .root = schema};
    if ((g->root = compile(&cx, schema, "", 0, err)) < 0) {
        json_grammar_free(g);
        return -1;
    }
    *out = g;
    return 0;
}

int json_grammar_any_object(JsonGrammar **out, ZyErr *err) {
    if (grammar_new(out, err)) return -1;
    (*out)->root = N_GOBJECT;
    return 0;
}

/* ---- the automaton ------------------------------------------------------------------------------------------ */

enum { P_START = 0 };
enum { S_CHARS = 1, S_ESC, S_UHEX, S_UTF8 };                                  /* strings */
enum { U_MINUS = 1, U_ZERO, U_INT, U_DOT, U_FRAC, U_EXP, U_EXPSIGN, U_EXPDIG }; /* numbers */
enum { O_OPEN = 1, O_KEY, O_COLON, O_VALUE, O_AFTER, O_COMMA };              /* objects and arrays */

enum { CONSUMED = 0, REJECT = -1, RETRY = 1 };

static int is_ws(uint8_t c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }
static int is_digit(uint8_t c) { return c >= '0' && c <= '9'; }
static int is_hex(uint8_t c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

static uint64_t all_of(int n) { return n >= 64 ? ~0ull : (1ull << n) - 1; }

static int push(const JsonGrammar *g, JgState *s, int node) {
    if (s->depth == JG_MAX_DEPTH) return REJECT;
    JgFrame *f = &s->f[s->depth++];
    f->node = (uint16_t)node;
    f->phase = P_START;
    f->aux = 0;
    f->count = 0;
    f->cand = all_of(g->nodes[node].n);
    return RETRY;
}

void jg_start(const JsonGrammar *g, JgState *s) {
    s->depth = 0;
    s->space = 0;
    push(g, s, g->root);
}

static int pop_consumed(JgState *s) {
    s->depth--;
    return CONSUMED;
}

/* An object's property k may come next (from property `from` on): no required one before it is skipped. */
static uint64_t key_candidates(const Node *n, int from) {
    uint64_t m = 0;
    for (int k = from; k < n->n; k++) {
        m |= 1ull << k;
        if (n->required[k]) break;
    }
    return m;
}

static int string_step(JgFrame *f, uint8_t c) {
    switch (f->phase) {
    case P_START:
        if (c != '"') return REJECT;
        f->phase = S_CHARS;
        return CONSUMED;
    case S_CHARS:
        if (c == '"') return RETRY + 1; /* the end: popped by the caller */
        if (c == '\\') {
            f->phase = S_ESC;
            return CONSUMED;
        }
        if (c < 0x20 || c == 0x7f) return REJECT; /* control characters must be escaped (DEL: kept out of text) */
        if (c < 0x80) return CONSUMED;
        /* UTF-8: the lead byte says how many continuation bytes follow and the range of the first */
        uint8_t lo = 0x80, hi = 0xBF, more;
        if (c >= 0xC2 && c <= 0xDF) more = 1;
        else if (c == 0xE0) more = 2, lo = 0xA0;
        else if (c == 0xED) more = 2, hi = 0x9F;
        else if (c >= 0xE1 && c <= 0xEF) more = 2;
        else if (c == 0xF0) more = 3, lo = 0x90;
        else if (c >= 0xF1 && c <= 0xF3) more = 3;
        else if (c == 0xF4) more = 3, hi = 0x8F;
        else return REJECT;
        f->phase = S_UTF8;
        f->aux = more;
        f->count = lo | (uint32_t)hi << 8;
        return CONSUMED;
    case S_UTF8:
        if (c < (f->count & 0xff) || c > (f->count >> 8)) return REJECT;
        f->count = 0x80 | 0xBFu << 8;
        if (--f->aux == 0) f->phase = S_CHARS;
        return CONSUMED;
    case S_ESC:
        if (c == 'u') {
            f->phase = S_UHEX;
            f->count = 0;
            return CONSUMED;
        }
        if (!strchr("\"\\/bfnrt", c) || !c) return REJECT;
        f->phase = S_CHARS;
        return CONSUMED;
    case S_UHEX: /* \uXXXX, not a surrogate (d800-dfff) */
        if (!is_hex(c)) return REJECT;
        if (f->count == 0) f->aux = c == 'd' || c == 'D';
        else if (f->count == 1 && f->aux && !(c >= '0' && c <= '7')) return REJECT;
        if (++f->count == 4) f->phase = S_CHARS;
        return CONSUMED;
    }
    return REJECT;
}

static int number_step(JgFrame *f, int integer, uint8_t c) {
    const int complete = f->phase == U_ZERO || f->phase == U_INT || f->phase == U_FRAC || f->phase == U_EXPDIG;
    int next = -1;
    switch (f->phase) {
    case P_START:
        next = c == '-' ? U_MINUS : c == '0' ? U_ZERO : is_digit(c) ? U_INT : -1;
        break;
    case U_MINUS:
        next = c == '0' ? U_ZERO : is_digit(c) ? U_INT : -1;
        break;
    case U_ZERO:
    case U_INT:
        if (f->phase == U_INT && is_digit(c)) next = U_INT;
        else if (!integer && c == '.') next = U_DOT;
        else if (!integer && (c == 'e' || c == 'E')) next = U_EXP;
        break;
    case U_DOT:
    case U_FRAC:
        next = is_digit(c) ? U_FRAC : f->phase == U_FRAC && (c == 'e' || c == 'E') ? U_EXP : -1;
        break;
    case U_EXP:
        next = c == '+' || c == '-' ? U_EXPSIGN : is_digit(c) ? U_EXPDIG : -1;
        break;
    case U_EXPSIGN:
    case U_EXPDIG:
        next = is_digit(c) ? U_EXPDIG : -1;
        break;
    }
    /* within JG_MAX_NUMBER bytes, with room left for a digit after a '-', '.', 'e' or exponent sign */
    const int incomplete = next == U_MINUS || next == U_DOT || next == U_EXP || next == U_EXPSIGN;
    if (next >= 0 && f->count + 1 + (uint32_t)incomplete <= JG_MAX_NUMBER) {
        f->phase = (uint8_t)next;
        f->count++;
        return CONSUMED;
    }
    return complete ? RETRY + 1 : REJECT; /* complete: the byte belongs to what follows */
}

static int literal_step(const Node *n, JgFrame *f, uint8_t c) {
    const uint32_t pos = f->count;
    uint64_t next = 0, done = 0, longer = 0;
    for (uint64_t m = f->cand; m; m &= m - 1) {
        const int k = __builtin_ctzll(m);
        if ((uint32_t)n->text_len[k] == pos) done = 1;
        else if ((uint8_t)n->text[k][pos] == c) {
            next |= 1ull << k;
            longer |= (uint32_t)n->text_len[k] > pos + 1;
        }
    }
    if (!next) return done && pos > 0 ? RETRY + 1 : REJECT;
    f->phase = 1; /* under way */
    f->cand = next;
    f->count = pos + 1;
    return longer ? CONSUMED : RETRY + 2; /* every candidate ends here: the literal is complete */
}

/* An object's property name against its candidates (aux: the next property that may come). */
static int key_step(const Node *n, JgFrame *f, uint8_t c) {
    uint64_t next = 0;
    for (uint64_t m = f->cand; m; m &= m - 1) {
        const int k = __builtin_ctzll(m);
        if ((uint32_t)n->text_len[k] > f->count && (uint8_t)n->text[k][f->count] == c) next |= 1ull << k;
    }
    if (!next) return REJECT;
    f->cand = next;
    f->count++;
    const int k = __builtin_ctzll(next); /* a name ends at its unescaped quote: no other matches then */
    if ((uint32_t)n->text_len[k] == f->count) {
        f->aux = (uint8_t)(k + 1);
        f->phase = O_COLON;
    }
    return CONSUMED;
}

/* Arrays (count: items so far), objects of a schema (aux: the next property that may come) and free-form objects:
 * the brackets, the gaps' whitespace, members and separators. */
static int container_step(const JsonGrammar *g, JgState *s, JgFrame *f, const Node *n, uint8_t c) {
    const int array = n->kind == K_ARRAY, generic = n->kind == K_GOBJECT;
    if (f->phase == P_START) {
        if (c != (array ? '[' : '{')) return REJECT;
        f->phase = O_OPEN;
        return CONSUMED;
    }
    if (f->phase == O_KEY) return key_step(n, f, c);
    if (is_ws(c)) return ++s->space > JG_MAX_SPACE ? REJECT : CONSUMED;
    const uint8_t close = array ? ']' : '}';
    const int can_close = array ? f->count >= (uint32_t)n->min_items : generic || n->nreq_from[f->aux] == 0;
    const int can_more = array ? f->count < (uint32_t)n->max_items : generic || f->aux < n->n;
    switch (f->phase) {
    case O_OPEN:
    case O_COMMA:
        if (c == close && f->phase == O_OPEN && can_close) return pop_consumed(s);
        if (!can_more) return REJECT;
        if (array) {
            f->phase = O_AFTER;
            f->count++;
            return push(g, s, n->items);
        }
        if (c != '"') return REJECT;
        if (generic) {
            f->phase = O_COLON;
            return push(g, s, N_STRING);
        }
        f->phase = O_KEY;
        f->cand = key_candidates(n, f->aux);
        f->count = 1;
        return CONSUMED;
    case O_COLON:
        if (c != ':') return REJECT;
        f->phase = O_VALUE;
        return CONSUMED;
    case O_VALUE:
        f->phase = O_AFTER;
        return push(g, s, generic ? N_ANY : n->child[f->aux - 1]);
    case O_AFTER:
        if (c == ',' && can_more) {
            f->phase = O_COMMA;
            return CONSUMED;
        }
        return c == close && can_close ? pop_consumed(s) : REJECT;
    }
    return REJECT;
}

/* One byte into the top frame. CONSUMED, REJECT, or RETRY when the stack changed and the byte is still to place. */
static int frame_step(const JsonGrammar *g, JgState *s, uint8_t c) {
    JgFrame *f = &s->f[s->depth - 1];
    const Node *n = &g->nodes[f->node];
    int r;
    switch (n->kind) {
    case K_UNION:
        for (int i = 0; i < n->n; i++)
            if (first_has(g->nodes[n->child[i]].first, c)) {
                s->depth--;
                return push(g, s, n->child[i]);
            }
        return REJECT;
    case K_STRING:
        r = string_step(f, c);
        return r == RETRY + 1 ? pop_consumed(s) : r;
    case K_NUMBER:
    case K_INTEGER:
        r = number_step(f, n->kind == K_INTEGER, c);
        if (r == RETRY + 1) s->depth--;
        return r == RETRY + 1 ? RETRY : r;
    case K_LITERALS:
        r = literal_step(n, f, c);
        if (r == RETRY + 1) s->depth--;
        return r == RETRY + 2 ? pop_consumed(s) : r == RETRY + 1 ? RETRY : r;
    case K_ARRAY:
    case K_GOBJECT:
    case K_OBJECT:
        return container_step(g, s, f, n, c);
    }
    return REJECT;
}

int jg_step(const JsonGrammar *g, JgState *s, uint8_t c) {
    if (!is_ws(c)) s->space = 0; /* only the gaps between tokens count whitespace */
    for (;;) {
        if (s->depth == 0) return -1; /* the document is complete: nothing may follow */
        const int r = frame_step(g, s, c);
        if (r != RETRY) return r;
    }
}

int jg_feed(const JsonGrammar *g, JgState *s, const char *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (jg_step(g, s, (uint8_t)p[i])) return -1;
    return 0;
}

/* The fewest bytes that finish this frame's value, its children's excepted. */
static long frame_rest(const JsonGrammar *g, const JgFrame *f) {
    const Node *n = &g->nodes[f->node];
    if (f->phase == P_START) return n->min_len;
    const int i = f->aux;
    switch (n->kind) {
    case K_STRING:
        return f->phase == S_CHARS ? 1 : f->phase == S_ESC ? 2 : f->phase == S_UHEX ? 4 - (long)f->count + 1 : f->aux + 1;
    case K_NUMBER:
    case K_INTEGER:
        return f->phase == U_MINUS || f->phase == U_DOT || f->phase == U_EXP || f->phase == U_EXPSIGN;
    case K_LITERALS: {
        long best = NONE;
        for (uint64_t m = f->cand; m; m &= m - 1) {
            const long left = n->text_len[__builtin_ctzll(m)] - (long)f->count;
            if (left < best) best = left;
        }
        return best;
    }
    case K_ARRAY: {
        const long mv = g->nodes[n->items].min_len, have = f->count;
        long need = n->min_items - have;
        if (f->phase == O_OPEN) return n->min_items ? n->min_items * mv + n->min_items - 1 + 1 : 1;
        if (f->phase == O_AFTER) return (need > 0 ? need * (mv + 1) : 0) + 1;
        need = need > 1 ? need : 1;
        return need * mv + need - 1 + 1;
    }
    case K_GOBJECT:
        return f->phase == O_OPEN ? 1 : f->phase == O_COLON ? 3 : f->phase == O_VALUE ? 2 : f->phase == O_AFTER ? 1 : 5;
    case K_OBJECT: {
        /* after property i - 1: each required one left with its comma, then '}' */
#define AFTER(i) (n->req_from[i] + n->nreq_from[i] + 1)
        switch (f->phase) {
        case O_OPEN:
            return n->nreq_from[i] ? n->req_from[i] + n->nreq_from[i] - 1 + 1 : 1;
        case O_COMMA:
            return n->nreq_from[i] ? n->req_from[i] + n->nreq_from[i] - 1 + 1 : n->opt_from[i] + 1;
        case O_KEY: {
            long best = NONE;
            for (uint64_t m = f->cand; m; m &= m - 1) {
                const int k = __builtin_ctzll(m);
                const long r = n->text_len[k] - (long)f->count + 1 + g->nodes[n->child[k]].min_len + AFTER(k + 1);
                if (r < best) best = r;
            }
            return best;
        }
        case O_COLON:
            return 1 + g->nodes[n->child[i - 1]].min_len + AFTER(i);
        case O_VALUE:
            return g->nodes[n->child[i - 1]].min_len + AFTER(i);
        case O_AFTER:
            return AFTER(i);
        }
#undef AFTER
        return NONE;
    }
    }
    return NONE;
}

long jg_min_close(const JsonGrammar *g, const JgState *s) {
    long sum = 0;
    for (int i = 0; i < s->depth; i++) sum += frame_rest(g, &s->f[i]);
    return sum;
}

int jg_complete(const JsonGrammar *g, const JgState *s) {
    return s->depth == 0 || (s->depth == 1 && s->f[0].phase != P_START && jg_min_close(g, s) == 0);
}

int jg_in_string_chars(const JsonGrammar *g, const JgState *s) {
    return s->depth > 0 && g->nodes[s->f[s->depth - 1].node].kind == K_STRING && s->f[s->depth - 1].phase == S_CHARS;
}

int jg_plain_string(const char *p, size_t n) {
    JgFrame f = {.phase = S_CHARS};
    for (size_t i = 0; i < n; i++)
        if (string_step(&f, (uint8_t)p[i]) != CONSUMED || f.phase == S_ESC) return 0;
    return f.phase == S_CHARS;
}
