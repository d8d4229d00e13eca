/* tokenizer.json: the writer (tokenizer_to_json, tokenizer_save) and the reader (tokenizer_load, tokenizer_load_json),
 * tokenizer_config.json (tokenizer_apply_config_json, tokenizer_special_id). See tokenizer.c. */
#define _POSIX_C_SOURCE 200809L
#include "tokenizer/tokenizer_internal.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---------------------------------------------------------------------------------------------------------
 * tokenizer.json writer */

static int buf_printf(Buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int buf_printf(Buf *b, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (k < 0 || (size_t)k >= sizeof tmp) return -1;
    return buf_put(b, tmp, (size_t)k);
}

static int json_string(Buf *b, const char *s, size_t n) {
    if (buf_puts(b, "\"")) return -1;
    for (size_t i = 0; i < n; i++) {
        uint8_t c = (uint8_t)s[i];
        int rc;
        if (c == '"')
            rc = buf_puts(b, "\\\"");
        else if (c == '\\')
            rc = buf_puts(b, "\\\\");
        else if (c == '\n')
            rc = buf_puts(b, "\\n");
        else if (c == '\t')
            rc = buf_puts(b, "\\t");
        else if (c == '\r')
            rc = buf_puts(b, "\\r");
        else if (c < 0x20 || c == 0x7F)
            rc = buf_printf(b, "\\u%04x", c);
        else
            rc = buf_put(b, &c, 1);
        if (rc) return -1;
    }
    return buf_puts(b, "\"");
}

/* A JSON value on one line, with ", " and ": " as HF's files (and zaya's) space them. */
static int json_inline(Buf *b, const cJSON *v, int depth) {
    if (depth > 64) return -1;
    if (cJSON_IsNull(v) || !v) return buf_puts(b, "null");
    if (cJSON_IsTrue(v)) return buf_puts(b, "true");
    if (cJSON_IsFalse(v)) return buf_puts(b, "false");
    if (cJSON_IsNumber(v)) {
        double d = v->valuedouble;
        if (d == floor(d) && fabs(d) < 9007199254740992.0) return buf_printf(b, "%.0f", d);
        return buf_printf(b, "%.17g", d);
    }
    if (cJSON_IsString(v)) return json_string(b, v->valuestring, strlen(v->valuestring));
    int obj = cJSON_IsObject(v);
    if (!obj && !cJSON_IsArray(v)) return -1;
    if (buf_puts(b, obj ? "{" : "[")) return -1;
    for (const cJSON *c = v->child; c; c = c->next) {
        if (c != v->child && buf_puts(b, ", ")) return -1;
        if (obj && (json_string(b, c->string ? c->string : "", c->string ? strlen(c->string) : 0) || buf_puts(b, ": ")))
            return -1;
        if (json_inline(b, c, depth + 1)) return -1;
    }
    return buf_puts(b, obj ? "}" : "]");
}

static char *inline_string(const cJSON *v) {
    Buf b = {0};
    if (json_inline(&b, v, 0) || buf_put(&b, "", 1)) {
        free(b.p);
        return NULL;
    }
    return (char *)b.p;
}

int tokenizer_to_json(const Tokenizer *t, char **json, size_t *len, ZyErr *err) {
    Buf b = {0};
    const char *js[4];
    for (int i = 0; i < 4; i++) js[i] = t->js[i] ? t->js[i] : "null";
    int rc = buf_puts(&b, "{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n  \"added_tokens\": [");
    for (int i = 0; i < t->n_added && !rc; i++) {
        const AddedTok *a = &t->added[i];
        rc = buf_printf(&b, "%s\n    {\"id\": %d, \"content\": ", i ? "," : "", a->id) || json_string(&b, a->text, a->len) ||
             buf_printf(&b, ", \"single_word\": %s, \"lstrip\": %s, \"rstrip\": %s, \"normalized\": %s, \"special\": %s}",
                        a->single_word ? "true" : "false", a->lstrip ? "true" : "false", a->rstrip ? "true" : "false",
                        a->normalized ? "true" : "false", a->special ? "true" : "false");
    }
    rc = rc || buf_puts(&b, "\n  ],\n  \"normalizer\": ") || buf_puts(&b, js[0]) || buf_puts(&b, ",\n  \"pre_tokenizer\": ") ||
         buf_puts(&b, js[1]) || buf_puts(&b, ",\n  \"post_processor\": ") || buf_puts(&b, js[2]) ||
         buf_puts(&b, ",\n  \"decoder\": ") || buf_puts(&b, js[3]) ||
         buf_puts(&b, ",\n  \"model\": {\n    \"type\": \"BPE\",\n    \"dropout\": null,\n    \"unk_token\": ");
    rc = rc || (t->unk_id >= 0 ? json_string(&b, t->tok[t->unk_id], t->tok_len[t->unk_id]) : buf_puts(&b, "null"));
    rc = rc || buf_printf(&b, ",\n    \"continuing_subword_prefix\": null,\n    \"end_of_word_suffix\": null,\n"
                              "    \"fuse_unk\": %s,\n    \"byte_fallback\": %s,\n    \"ignore_merges\": %s,\n    \"vocab\": {",
                          t->fuse_unk ? "true" : "false", t->byte_fallback ? "true" : "false", t->ignore_merges ? "true" : "false");
    int first = 1;
    for (int32_t id = 0; id < t->n_ids && !rc; id++) {
        if (!t->tok[id] || !t->in_model[id]) continue;
        rc = buf_puts(&b, first ? "\n      " : ",\n      ") || json_string(&b, t->tok[id], t->tok_len[id]) ||
             buf_printf(&b, ": %d", id);
        first = 0;
    }
    rc = rc || buf_puts(&b, "\n    },\n    \"merges\": [");
    for (int32_t r = 0; r < t->n_merges && !rc; r++) {
        int32_t a = t->merge_list[r][0], c = t->merge_list[r][1];
        rc = buf_puts(&b, r ? ",\n      [" : "\n      [") || json_string(&b, t->tok[a], t->tok_len[a]) ||
             buf_puts(&b, ", ") || json_string(&b, t->tok[c], t->tok_len[c]) || buf_puts(&b, "]");
    }
    rc = rc || buf_puts(&b, "\n    ]\n  }\n}\n") || buf_put(&b, "", 1);
    if (rc) {
        free(b.p);
        return zy_fail(err, "tokenizer: out of memory writing JSON");
    }
    *json = (char *)b.p;
    *len = b.n - 1;
    return 0;
}

int tokenizer_save(const Tokenizer *t, const char *path, ZyErr *err) {
    char *json;
    size_t len;
    if (tokenizer_to_json(t, &json, &len, err)) return zy_wrap(err, "%s", path);
    int rc = zy_write_file_atomic(path, json, len, err);
    free(json);
    return rc;
}

/* ---------------------------------------------------------------------------------------------------------
 * tokenizer.json reader. Errors read "<file>: <field path>: <reason>". */

/* A token's text for an error message: at most 40 bytes, control characters escaped. */
const char *tok_shown(const char *s, char buf[200]) {
    size_t k = 0, i = 0;
    for (; s[i] && k < 160 && i < 40; i++) {
        uint8_t c = (uint8_t)s[i];
        if (c < 0x20 || c == '"' || c == '\\')
            k += (size_t)snprintf(buf + k, 200 - k, "\\x%02x", c);
        else
            buf[k++] = (char)c;
    }
    if (s[i]) k += (size_t)snprintf(buf + k, 200 - k, "...");
    buf[k] = '\0';
    return buf;
}

/* What a JSON value is, for error messages. */
static const char *kind_of(const cJSON *x, char buf[200]) {
    if (cJSON_IsObject(x)) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(x, "type");
        if (cJSON_IsString(ty)) {
            char tmp[200];
            snprintf(buf, 200, "type \"%s\"", tok_shown(ty->valuestring, tmp));
            return buf;
        }
        return "an object";
    }
    if (cJSON_IsArray(x)) return "an array";
    if (cJSON_IsString(x)) return "a string";
    if (cJSON_IsNumber(x)) return "a number";
    if (cJSON_IsBool(x)) return "a boolean";
    if (cJSON_IsNull(x)) return "null";
    return "an invalid value";
}

static int json_id(const cJSON *v, int32_t *id) {
    if (!cJSON_IsNumber(v)) return -1;
    double d = v->valuedouble;
    if (!(d >= 0 && d < TOK_MAX_VOCAB) || d != floor(d)) return -1;
    *id = (int32_t)d;
    return 0;
}

/* Optional boolean field: absent -> dflt. */
static int opt_bool(const cJSON *obj, const char *name, int dflt, int *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
    if (!v) {
        *out = dflt;
        return 0;
    }
    if (!cJSON_IsBool(v)) return -1;
    *out = cJSON_IsTrue(v);
    return 0;
}

static int is_absent_or_null(const cJSON *v) { return !v || cJSON_IsNull(v); }

#define FAIL(...) return zy_fail(err, __VA_ARGS__)
#define GET(obj, name) cJSON_GetObjectItemCaseSensitive(obj, name)

/* The "type" of a component object at path. */
static int component_type(const cJSON *v, const char *label, const char *path, const char **type, ZyErr *err) {
    char b1[200];
    if (!cJSON_IsObject(v)) FAIL("%s: %s: expected an object, got %s", label, path, kind_of(v, b1));
    const cJSON *ty = GET(v, "type");
    if (!cJSON_IsString(ty)) FAIL("%s: %s.type: missing or not a string", label, path);
    *type = ty->valuestring;
    return 0;
}

/* A field holding exactly one character (serde's char). */
static int char_field(const cJSON *obj, const char *name, const char *label, const char *path, uint32_t *cp, ZyErr *err) {
    const cJSON *v = GET(obj, name);
    if (!cJSON_IsString(v)) FAIL("%s: %s.%s: missing or not a string", label, path, name);
    size_t n = strlen(v->valuestring);
    if (!n || utf8_char((const uint8_t *)v->valuestring, n, cp) != (int)n)
        FAIL("%s: %s.%s: must be exactly one character", label, path, name);
    return 0;
}

static int size_field(const cJSON *obj, const char *name, const char *label, const char *path, size_t *out, ZyErr *err) {
    const cJSON *v = GET(obj, name);
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0 && v->valuedouble < 1e9) || v->valuedouble != floor(v->valuedouble))
        FAIL("%s: %s.%s: missing or not a non-negative integer", label, path, name);
    *out = (size_t)v->valuedouble;
    return 0;
}

/* Metaspace's prepend_scheme, with the legacy add_prefix_space checked as HF checks it. */
static int prepend_scheme(const cJSON *obj, const char *label, const char *path, int *scheme, ZyErr *err) {
    const cJSON *v = GET(obj, "prepend_scheme");
    *scheme = PREPEND_ALWAYS;
    if (v) {
        if (!cJSON_IsString(v)) FAIL("%s: %s.prepend_scheme: not a string", label, path);
        if (strcmp(v->valuestring, "first") == 0)
            *scheme = PREPEND_FIRST;
        else if (strcmp(v->valuestring, "never") == 0)
            *scheme = PREPEND_NEVER;
        else if (strcmp(v->valuestring, "always") != 0)
            FAIL("%s: %s.prepend_scheme: must be \"first\", \"always\" or \"never\"", label, path);
    }
    int aps;
    if (opt_bool(obj, "add_prefix_space", 1, &aps)) FAIL("%s: %s.add_prefix_space: not a boolean", label, path);
    if (!aps) {
        if (*scheme != PREPEND_NEVER)
            FAIL("%s: %s.add_prefix_space: false does not match prepend_scheme (HF refuses it too)", label, path);
        *scheme = PREPEND_NEVER;
    }
    return 0;
}

static int parse_pat(const cJSON *obj, const char *label, const char *path, Pat *p, ZyErr *err) {
    char b1[200];
    const cJSON *v = GET(obj, "pattern");
    if (!cJSON_IsObject(v) || !v->child || v->child->next)
        FAIL("%s: %s.pattern: expected {\"String\": ...} or {\"Regex\": ...}, got %s", label, path, v ? kind_of(v, b1) : "nothing");
    const cJSON *c = v->child;
    int regex = strcmp(c->string, "Regex") == 0;
    if (!regex && strcmp(c->string, "String") != 0)
        FAIL("%s: %s.pattern: \"%s\" is not String or Regex", label, path, tok_shown(c->string, b1));
    if (!cJSON_IsString(c)) FAIL("%s: %s.pattern.%s: not a string", label, path, c->string);
    const char *s = c->valuestring;
    if (!regex) {
        size_t n = strlen(s);
        p->lit = malloc(n + 1);
        if (!p->lit) FAIL("%s: out of memory", label);
        memcpy(p->lit, s, n + 1);
        p->lit_len = n;
        return 0;
    }
    int ec;
    PCRE2_SIZE eo;
    p->re = pcre2_compile((PCRE2_SPTR)s, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &ec, &eo, NULL);
    if (!p->re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(ec, msg, sizeof msg);
        FAIL("%s: %s.pattern.Regex: invalid regex at offset %zu: %s", label, path, (size_t)eo, (const char *)msg);
    }
    (void)pcre2_jit_compile(p->re, PCRE2_JIT_COMPLETE); /* the interpreter runs it when JIT is unavailable */
    return 0;
}

static int dup_string(const cJSON *obj, const char *name, const char *label, const char *path, char **out, size_t *len,
                      ZyErr *err) {
    const cJSON *v = GET(obj, name);
    if (!cJSON_IsString(v)) FAIL("%s: %s.%s: missing or not a string", label, path, name);
    *len = strlen(v->valuestring);
    *out = malloc(*len + 1);
    if (!*out) FAIL("%s: out of memory", label);
    memcpy(*out, v->valuestring, *len + 1);
    return 0;
}

#define MAX_DEPTH 8 /* nested Sequences */

/* Elements of a Sequence component: the array `field`, each parsed by fn. */
typedef int (*ParseFn)(Tokenizer *t, const cJSON *v, const char *label, const char *path, int depth, ZyErr *err);

static int parse_sequence(Tokenizer *t, const cJSON *v, const char *field, ParseFn fn, const char *label,
                          const char *path, int depth, ZyErr *err) {
    char b1[200], sub[256];
    if (depth >= MAX_DEPTH) FAIL("%s: %s: Sequences nested more than %d deep", label, path, MAX_DEPTH);
    const cJSON *arr = GET(v, field);
    if (!cJSON_IsArray(arr)) FAIL("%s: %s.%s: expected an array, got %s", label, path, field, arr ? kind_of(arr, b1) : "nothing");
    int i = 0;
    for (const cJSON *c = arr->child; c; c = c->next, i++) {
        snprintf(sub, sizeof sub, "%s.%s[%d]", path, field, i);
        if (fn(t, c, label, sub, depth + 1, err)) return -1;
    }
    return 0;
}

static int parse_normalizer(Tokenizer *t, const cJSON *v, const char *label, const char *path, int depth, ZyErr *err) {
    char b1[200];
    const char *ty = NULL;
    if (component_type(v, label, path, &ty, err)) return -1;
    if (strcmp(ty, "Sequence") == 0) return parse_sequence(t, v, "normalizers", parse_normalizer, label, path, depth, err);
    static const char *const names[] = {"Replace", "Prepend", "NFD", "NFKD", "NFC", "NFKC", "Lowercase", "Strip", "StripAccents"};
    int kind = -1;
    for (int k = 0; k < (int)ZY_ARRAY_LEN(names); k++)
        if (strcmp(ty, names[k]) == 0) kind = k; /* names[] is in NORM_* order */
    if (kind < 0)
        FAIL("%s: %s: type \"%s\" is not supported (zaya supports Replace, Prepend, NFD, NFKD, NFC, NFKC, Lowercase, Strip, "
             "StripAccents and Sequence)", label, path, tok_shown(ty, b1));
    if (t->n_norm == MAX_STEPS) FAIL("%s: %s: more than %d normalizers", label, path, MAX_STEPS);
    NormStep *st = &t->norm[t->n_norm];
    memset(st, 0, sizeof *st);
    t->n_norm++; /* counted before parsing, so tokenizer_free frees what was parsed */
    st->kind = kind;
    if (kind == NORM_REPLACE)
        return parse_pat(v, label, path, &st->pat, err) || dup_string(v, "content", label, path, &st->text, &st->len, err) ? -1 : 0;
    if (kind == NORM_PREPEND) return dup_string(v, "prepend", label, path, &st->text, &st->len, err);
    if (kind == NORM_STRIP) {
        static const char *const sides[2] = {"strip_left", "strip_right"};
        int *dst[2] = {&st->left, &st->right};
        for (int k = 0; k < 2; k++) {
            const cJSON *b = GET(v, sides[k]);
            if (!cJSON_IsBool(b)) FAIL("%s: %s.%s: missing or not a boolean", label, path, sides[k]);
            *dst[k] = cJSON_IsTrue(b);
        }
    }
    return 0;
}

static int parse_pre_tokenizer(Tokenizer *t, const cJSON *v, const char *label, const char *path, int depth, ZyErr *err) {
    char b1[200];
    const char *ty = NULL;
    if (component_type(v, label, path, &ty, err)) return -1;
    if (strcmp(ty, "Sequence") == 0) return parse_sequence(t, v, "pretokenizers", parse_pre_tokenizer, label, path, depth, err);
    int kind = strcmp(ty, "Split") == 0 ? PRE_SPLIT : strcmp(ty, "Metaspace") == 0 ? PRE_METASPACE
               : strcmp(ty, "ByteLevel") == 0 ? PRE_BYTELEVEL : -1;
    if (kind < 0)
        FAIL("%s: %s: type \"%s\" is not supported (zaya supports Split, Metaspace, ByteLevel and Sequence)", label, path,
             tok_shown(ty, b1));
    if (t->n_pre == MAX_STEPS) FAIL("%s: %s: more than %d pre-tokenizers", label, path, MAX_STEPS);
    PreStep *st = &t->pre[t->n_pre];
    memset(st, 0, sizeof *st);
    st->kind = kind;
    t->n_pre++;
    if (kind == PRE_SPLIT) {
        static const char *const names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
        if (parse_pat(v, label, path, &st->pat, err)) return -1;
        const cJSON *bh = GET(v, "behavior");
        if (!cJSON_IsString(bh)) FAIL("%s: %s.behavior: missing or not a string", label, path);
        st->behavior = -1;
        for (int k = 0; k < 5; k++)
            if (strcmp(bh->valuestring, names[k]) == 0) st->behavior = k;
        if (st->behavior < 0)
            FAIL("%s: %s.behavior: \"%s\" is not one of Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous",
                 label, path, tok_shown(bh->valuestring, b1));
        const cJSON *inv = GET(v, "invert");
        if (!cJSON_IsBool(inv)) FAIL("%s: %s.invert: missing or not a boolean", label, path);
        st->invert = cJSON_IsTrue(inv);
        return 0;
    }
    if (kind == PRE_METASPACE) {
        uint32_t cp;
        if (char_field(v, "replacement", label, path, &cp, err) || prepend_scheme(v, label, path, &st->scheme, err)) return -1;
        if (opt_bool(v, "split", 1, &st->split)) FAIL("%s: %s.split: not a boolean", label, path);
        const char *r = GET(v, "replacement")->valuestring;
        st->pat.lit_len = strlen(r);
        st->pat.lit = malloc(st->pat.lit_len + 1);
        if (!st->pat.lit) FAIL("%s: out of memory", label);
        memcpy(st->pat.lit, r, st->pat.lit_len + 1);
        return 0;
    }
    const cJSON *aps = GET(v, "add_prefix_space");
    if (!cJSON_IsBool(aps)) FAIL("%s: %s.add_prefix_space: missing or not a boolean", label, path);
    if (cJSON_IsTrue(aps)) FAIL("%s: %s.add_prefix_space: true is not supported (must be false)", label, path);
    if (opt_bool(v, "use_regex", 1, &st->use_regex)) FAIL("%s: %s.use_regex: not a boolean", label, path);
    return 0;
}

static int parse_decoder(Tokenizer *t, const cJSON *v, const char *label, const char *path, int depth, ZyErr *err) {
    char b1[200];
    const char *ty = NULL;
    if (component_type(v, label, path, &ty, err)) return -1;
    if (strcmp(ty, "Sequence") == 0) return parse_sequence(t, v, "decoders", parse_decoder, label, path, depth, err);
    static const char *const names[] = {"Replace", "ByteFallback", "Fuse", "Strip", "Metaspace", "ByteLevel"};
    int kind = -1;
    for (int k = 0; k < 6; k++)
        if (strcmp(ty, names[k]) == 0) kind = k;
    if (kind < 0)
        FAIL("%s: %s: type \"%s\" is not supported (zaya supports Replace, ByteFallback, Fuse, Strip, Metaspace, ByteLevel "
             "and Sequence)", label, path, tok_shown(ty, b1));
    if (t->n_dec == MAX_STEPS) FAIL("%s: %s: more than %d decoders", label, path, MAX_STEPS);
    DecStep *st = &t->decs[t->n_dec];
    memset(st, 0, sizeof *st);
    st->kind = kind;
    t->n_dec++;
    switch (kind) {
    case DEC_REPLACE:
        return parse_pat(v, label, path, &st->pat, err) || dup_string(v, "content", label, path, &st->text, &st->len, err) ? -1 : 0;
    case DEC_STRIP:
        return char_field(v, "content", label, path, &st->ch, err) || size_field(v, "start", label, path, &st->start, err) ||
                       size_field(v, "stop", label, path, &st->stop, err) ? -1 : 0;
    case DEC_METASPACE:
        return char_field(v, "replacement", label, path, &st->ch, err) || prepend_scheme(v, label, path, &st->scheme, err) ? -1 : 0;
    default:
        return 0;
    }
}

/* A TemplateProcessing template (single or pair) into items: $A, special tokens' ids ($B only in pair). */
static int parse_template(const cJSON *v, const char *field, const cJSON *specials, const char *label, const char *path,
                          Template *out, ZyErr *err) {
    char b1[200];
    const cJSON *arr = GET(v, field);
    if (!cJSON_IsArray(arr)) FAIL("%s: %s.%s: missing or not an array", label, path, field);
    int i = 0, has_a = 0, has_b = 0;
    for (const cJSON *p = arr->child; p; p = p->next, i++) {
        const cJSON *c = cJSON_IsObject(p) ? p->child : NULL;
        if (!c || c->next || !cJSON_IsObject(c) || (strcmp(c->string, "SpecialToken") != 0 && strcmp(c->string, "Sequence") != 0))
            FAIL("%s: %s.%s[%d]: expected {\"SpecialToken\": {...}} or {\"Sequence\": {...}}", label, path, field, i);
        const cJSON *id = GET(c, "id");
        if (!cJSON_IsString(id)) FAIL("%s: %s.%s[%d].%s.id: missing or not a string", label, path, field, i, c->string);
        const cJSON *ti = GET(c, "type_id");
        if (!cJSON_IsNumber(ti)) FAIL("%s: %s.%s[%d].%s.type_id: missing or not a number", label, path, field, i, c->string);
        if (strcmp(c->string, "Sequence") == 0) {
            int is_a = strcmp(id->valuestring, "A") == 0, is_b = strcmp(id->valuestring, "B") == 0;
            if (!is_a && !is_b) FAIL("%s: %s.%s[%d].Sequence.id: must be \"A\" or \"B\"", label, path, field, i);
            if (is_b && !out) {
                has_b = 1;
                continue;
            }
            if (is_b) FAIL("%s: %s.%s[%d]: the single template cannot use sequence B", label, path, field, i);
            has_a = 1;
            if (out) {
                int32_t *q = realloc(out->items, (out->n + 1) * sizeof *q);
                if (!q) FAIL("%s: out of memory", label);
                out->items = q;
                out->items[out->n++] = TPL_A;
            }
            continue;
        }
        const cJSON *sp = cJSON_IsObject(specials) ? GET(specials, id->valuestring) : NULL;
        if (!sp) FAIL("%s: %s.%s[%d]: special token \"%s\" is missing from special_tokens", label, path, field, i, tok_shown(id->valuestring, b1));
        const cJSON *ids = GET(sp, "ids"), *toks = GET(sp, "tokens");
        if (!cJSON_IsArray(ids) || !cJSON_IsArray(toks) || cJSON_GetArraySize(ids) != cJSON_GetArraySize(toks))
            FAIL("%s: %s.special_tokens[\"%s\"]: ids and tokens must be arrays of the same length", label, path, tok_shown(id->valuestring, b1));
        for (const cJSON *x = ids->child; x; x = x->next) {
            int32_t tid;
            if (json_id(x, &tid)) FAIL("%s: %s.special_tokens[\"%s\"].ids: not an id", label, path, tok_shown(id->valuestring, b1));
            if (out) {
                int32_t *q = realloc(out->items, (out->n + 1) * sizeof *q);
                if (!q) FAIL("%s: out of memory", label);
                out->items = q;
                out->items[out->n++] = tid;
            }
        }
    }
    if (!out && !(has_a && has_b)) FAIL("%s: %s.pair: must use both sequences A and B", label, path);
    return 0;
}

static int parse_post_processor(Tokenizer *t, const cJSON *v, const char *label, const char *path, int depth, ZyErr *err) {
    char b1[200];
    const char *ty = NULL;
    if (component_type(v, label, path, &ty, err)) return -1;
    if (strcmp(ty, "Sequence") == 0) return parse_sequence(t, v, "processors", parse_post_processor, label, path, depth, err);
    if (strcmp(ty, "ByteLevel") == 0) return 0; /* it only trims offsets */
    if (strcmp(ty, "TemplateProcessing") != 0)
        FAIL("%s: %s: type \"%s\" is not supported (zaya supports TemplateProcessing, ByteLevel and Sequence)", label, path,
             tok_shown(ty, b1));
    if (t->n_post == MAX_STEPS) FAIL("%s: %s: more than %d post-processors", label, path, MAX_STEPS);
    const cJSON *specials = GET(v, "special_tokens");
    if (!cJSON_IsObject(specials)) FAIL("%s: %s.special_tokens: missing or not an object", label, path);
    Template *tp = &t->post[t->n_post];
    memset(tp, 0, sizeof *tp);
    t->n_post++;
    return parse_template(v, "single", specials, label, path, tp, err) ||
                   (GET(v, "pair") && parse_template(v, "pair", specials, label, path, NULL, err))
               ? -1
               : 0;
}

static const char *const pipeline_fields[4] = {"normalizer", "pre_tokenizer", "post_processor", "decoder"};

int tok_load_pipeline(const cJSON *root, const char *label, Tokenizer *t, ZyErr *err) {
    char b1[200];
    static const char *const must_be_null[] = {"truncation", "padding"};
    for (size_t i = 0; i < ZY_ARRAY_LEN(must_be_null); i++) {
        const cJSON *v = GET(root, must_be_null[i]);
        if (!is_absent_or_null(v)) FAIL("%s: %s: only null is supported (got %s)", label, must_be_null[i], kind_of(v, b1));
    }
    static const ParseFn fns[4] = {parse_normalizer, parse_pre_tokenizer, parse_post_processor, parse_decoder};
    for (int k = 0; k < 4; k++) {
        const cJSON *v = GET(root, pipeline_fields[k]);
        if (!is_absent_or_null(v) && fns[k](t, v, label, pipeline_fields[k], 0, err)) return -1;
        if (!(t->js[k] = inline_string(v))) FAIL("%s: %s: out of memory", label, pipeline_fields[k]);
    }
    for (int i = 0; i + 1 < t->n_pre; i++)
        if (t->pre[i].kind == PRE_BYTELEVEL)
            FAIL("%s: pre_tokenizer: ByteLevel must be the last pre-tokenizer (zaya feeds its raw bytes to the model)", label);
    t->byte_level = t->n_pre > 0 && t->pre[t->n_pre - 1].kind == PRE_BYTELEVEL;
    t->has_decoder = !is_absent_or_null(GET(root, "decoder"));
    t->dec_bytelevel_only = t->n_dec == 1 && t->decs[0].kind == DEC_BYTELEVEL;
    return 0;
}

static int load_model(const cJSON *root, const char *label, Tokenizer *t, ZyErr *err) {
    char b1[200], b2[200];
    const cJSON *m = GET(root, "model");
    if (!m) FAIL("%s: model: missing", label);
    if (!cJSON_IsObject(m)) FAIL("%s: model: expected an object, got %s", label, kind_of(m, b1));
    const cJSON *ty = GET(m, "type");
    if (!cJSON_IsString(ty)) FAIL("%s: model.type: missing or not a string (expected \"BPE\")", label);
    if (strcmp(ty->valuestring, "BPE") != 0)
        FAIL("%s: model.type: \"%s\" is not supported (expected \"BPE\")", label, tok_shown(ty->valuestring, b1));
    const cJSON *v = GET(m, "dropout");
    if (!is_absent_or_null(v) && !(cJSON_IsNumber(v) && v->valuedouble == 0))
        FAIL("%s: model.dropout: only null is supported", label);
    static const char *const affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (size_t i = 0; i < ZY_ARRAY_LEN(affixes); i++) {
        v = GET(m, affixes[i]);
        if (!is_absent_or_null(v) && !(cJSON_IsString(v) && v->valuestring[0] == '\0'))
            FAIL("%s: model.%s: only null or \"\" is supported", label, affixes[i]);
    }
    int fuse_unk, byte_fallback, ignore_merges;
    if (opt_bool(m, "fuse_unk", 0, &fuse_unk)) FAIL("%s: model.fuse_unk: not a boolean", label);
    if (opt_bool(m, "byte_fallback", 0, &byte_fallback)) FAIL("%s: model.byte_fallback: not a boolean", label);
    if (opt_bool(m, "ignore_merges", 0, &ignore_merges)) FAIL("%s: model.ignore_merges: not a boolean", label);
    t->fuse_unk = (uint8_t)fuse_unk;
    t->byte_fallback = (uint8_t)byte_fallback;
    t->ignore_merges = (uint8_t)ignore_merges;

    const cJSON *vocab = GET(m, "vocab");
    if (!vocab) FAIL("%s: model.vocab: missing", label);
    if (!cJSON_IsObject(vocab)) FAIL("%s: model.vocab: expected an object, got %s", label, kind_of(vocab, b1));
    const cJSON *merges = GET(m, "merges");
    size_t n_vocab = 0, n_merges = 0;
    for (const cJSON *e = vocab->child; e; e = e->next) n_vocab++;
    for (const cJSON *e = cJSON_IsArray(merges) ? merges->child : NULL; e; e = e->next) n_merges++;
    if (sm_resize(&t->vocab, n_vocab) || pm_resize(&t->merges, n_merges)) FAIL("%s: out of memory", label);
    for (const cJSON *e = vocab->child; e; e = e->next) {
        const char *text = e->string ? e->string : "";
        size_t len = strlen(text);
        int32_t id;
        if (!len) FAIL("%s: model.vocab: empty token", label);
        if (json_id(e, &id))
            FAIL("%s: model.vocab[\"%s\"]: id must be an integer in [0, %d)", label, tok_shown(text, b1), TOK_MAX_VOCAB);
        if ((size_t)id < t->ids_cap && t->tok[id])
            FAIL("%s: model.vocab[\"%s\"]: id %d is already \"%s\"", label, tok_shown(text, b1), id, tok_shown(t->tok[id], b2));
        int rc = tok_add_vocab(t, text, len, id);
        if (rc < 0) FAIL("%s: out of memory", label);
        if (rc) FAIL("%s: model.vocab: token \"%s\" appears twice", label, tok_shown(text, b1));
    }

    if (!merges) FAIL("%s: model.merges: missing", label);
    if (!cJSON_IsArray(merges)) FAIL("%s: model.merges: expected an array, got %s", label, kind_of(merges, b1));
    Buf cat = {0};
    int i = 0, rc = 0;
    for (const cJSON *e = merges->child; e && !rc; e = e->next, i++) {
        const char *part[2];
        size_t plen[2];
        if (cJSON_IsString(e)) { /* legacy "left right" */
            const char *s = e->valuestring, *sp = strchr(s, ' ');
            if (!sp || sp == s || !sp[1] || strchr(sp + 1, ' ')) {
                rc = zy_fail(err, "%s: model.merges[%d]: \"%s\" is not two tokens separated by one space", label, i, tok_shown(s, b1));
                break;
            }
            part[0] = s;
            plen[0] = (size_t)(sp - s);
            part[1] = sp + 1;
            plen[1] = strlen(sp + 1);
        } else if (cJSON_IsArray(e) && cJSON_GetArraySize(e) == 2 && cJSON_IsString(e->child) && cJSON_IsString(e->child->next)) {
            part[0] = e->child->valuestring;
            part[1] = e->child->next->valuestring;
            plen[0] = strlen(part[0]);
            plen[1] = strlen(part[1]);
        } else {
            rc = zy_fail(err, "%s: model.merges[%d]: expected [\"left\", \"right\"] or \"left right\", got %s", label, i, kind_of(e, b1));
            break;
        }
        int32_t pid[2];
        for (int k = 0; k < 2 && !rc; k++) {
            SmSlot *s = sm_find(&t->vocab, part[k], plen[k], hash_bytes((const uint8_t *)part[k], plen[k]));
            if (!s) {
                char tmp[200];
                snprintf(tmp, sizeof tmp, "%.*s", (int)(plen[k] < 100 ? plen[k] : 100), part[k]);
                rc = zy_fail(err, "%s: model.merges[%d]: token \"%s\" is not in model.vocab", label, i, tok_shown(tmp, b1));
            } else {
                pid[k] = (int32_t)s->val;
            }
        }
        if (rc) break;
        cat.n = 0;
        if (buf_put(&cat, part[0], plen[0]) || buf_put(&cat, part[1], plen[1]) || buf_put(&cat, "", 1)) {
            rc = zy_fail(err, "%s: out of memory", label);
            break;
        }
        SmSlot *s = sm_find(&t->vocab, cat.p, cat.n - 1, hash_bytes(cat.p, cat.n - 1));
        if (!s) {
            rc = zy_fail(err, "%s: model.merges[%d]: merged token \"%s\" is not in model.vocab", label, i,
                         tok_shown((const char *)cat.p, b1));
            break;
        }
        if (tok_add_merge(t, pid[0], pid[1], (int32_t)s->val)) rc = zy_fail(err, "%s: out of memory", label);
    }
    free(cat.p);
    if (rc) return rc;

    v = GET(m, "unk_token");
    if (!is_absent_or_null(v)) {
        if (!cJSON_IsString(v)) FAIL("%s: model.unk_token: expected a string or null, got %s", label, kind_of(v, b1));
        size_t len = strlen(v->valuestring);
        SmSlot *s = sm_find(&t->vocab, v->valuestring, len, hash_bytes((const uint8_t *)v->valuestring, len));
        if (!s) FAIL("%s: model.unk_token: \"%s\" is not in model.vocab", label, tok_shown(v->valuestring, b1));
        t->unk_id = (int32_t)s->val;
    }
    return 0;
}

/* HF does not take added tokens' ids from the file: an added token gets its model.vocab id, or the id of an
 * earlier added token with the same content, or else the next id after the model's vocabulary (its size
 * plus the new tokens before it). A file whose ids disagree is refused, so zaya's ids are HF's. */
static int load_added(const cJSON *root, const char *label, Tokenizer *t, ZyErr *err) {
    char b1[200], b2[200];
    const cJSON *at = GET(root, "added_tokens");
    if (is_absent_or_null(at)) return 0;
    if (!cJSON_IsArray(at)) FAIL("%s: added_tokens: expected an array, got %s", label, kind_of(at, b1));
    int32_t next_new = (int32_t)t->vocab.count;
    int i = 0;
    for (const cJSON *e = at->child; e; e = e->next, i++) {
        if (!cJSON_IsObject(e)) FAIL("%s: added_tokens[%d]: expected an object, got %s", label, i, kind_of(e, b1));
        int32_t id;
        if (json_id(GET(e, "id"), &id))
            FAIL("%s: added_tokens[%d].id: missing or not an integer in [0, %d)", label, i, TOK_MAX_VOCAB);
        const cJSON *c = GET(e, "content");
        if (!cJSON_IsString(c) || !c->valuestring[0]) FAIL("%s: added_tokens[%d].content: missing or empty", label, i);
        AddedFlags f;
        static const char *const names[] = {"single_word", "lstrip", "rstrip", "special"};
        int *dst[] = {&f.single_word, &f.lstrip, &f.rstrip, &f.special};
        for (size_t k = 0; k < ZY_ARRAY_LEN(names); k++)
            if (opt_bool(e, names[k], 0, dst[k])) FAIL("%s: added_tokens[%d].%s: not a boolean", label, i, names[k]);
        if (opt_bool(e, "normalized", !f.special, &f.normalized)) FAIL("%s: added_tokens[%d].normalized: not a boolean", label, i);
        const char *text = c->valuestring;
        size_t len = strlen(text);
        int earlier = -1;
        for (int k = 0; k < t->n_added && earlier < 0; k++)
            if (t->added[k].len == len && memcmp(t->added[k].text, text, len) == 0) earlier = k;
        SmSlot *s = sm_find(&t->vocab, text, len, hash_bytes((const uint8_t *)text, len));
        if (s && s->val != id)
            FAIL("%s: added_tokens[%d]: \"%s\" has id %d but model.vocab gives it %d", label, i, tok_shown(text, b1), id, (int)s->val);
        if (earlier >= 0) { /* HF keeps the first id and takes the later flags */
            if (t->added[earlier].id != id)
                FAIL("%s: added_tokens[%d]: \"%s\" has id %d but an earlier entry gives it %d", label, i, tok_shown(text, b1),
                     id, t->added[earlier].id);
            AddedTok *a = &t->added[earlier];
            a->special = (uint8_t)f.special;
            a->normalized = (uint8_t)f.normalized;
            a->single_word = (uint8_t)f.single_word;
            a->lstrip = (uint8_t)f.lstrip;
            a->rstrip = (uint8_t)f.rstrip;
            continue;
        }
        if (!s && (size_t)id < t->ids_cap && t->tok[id])
            FAIL("%s: added_tokens[%d]: id %d of \"%s\" is already \"%s\"", label, i, id, tok_shown(text, b1), tok_shown(t->tok[id], b2));
        if (!s && id != next_new)
            FAIL("%s: added_tokens[%d].id: %d, but tokenizers numbers the new token \"%s\" %d (model.vocab's size plus "
                 "the new added tokens before it)", label, i, id, tok_shown(text, b1), next_new);
        if (!s) next_new++;
        if (tok_add_added(t, text, len, id, f)) FAIL("%s: out of memory", label);
    }
    return 0;
}

/* The file as one UTF-8 string: serde_json (HF) refuses anything else. */
static int check_utf8(const char *json, size_t len, const char *label, ZyErr *err) {
    const uint8_t *s = (const uint8_t *)json;
    uint32_t cp;
    for (size_t i = 0; i < len;) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        int l = utf8_char(s + i, len - i, &cp);
        if (!l) FAIL("%s: invalid UTF-8 at byte %zu", label, i);
        i += (size_t)l;
    }
    return 0;
}

static cJSON *parse_json(const char *json, size_t len, const char *label, ZyErr *err) {
    if (check_utf8(json, len, label, err)) return NULL;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, 0);
    if (!root) {
        zy_fail(err, "%s: invalid JSON near byte %zu", label, end ? (size_t)(end - json) : (size_t)0);
        return NULL;
    }
    size_t at = (size_t)(end - json);
    while (at < len && (json[at] == ' ' || json[at] == '\n' || json[at] == '\r' || json[at] == '\t')) at++;
    if (at < len) {
        cJSON_Delete(root);
        zy_fail(err, "%s: invalid JSON: unexpected data after the top-level value at byte %zu", label, at);
        return NULL;
    }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        zy_fail(err, "%s: expected a JSON object at the top level", label);
        return NULL;
    }
    return root;
}

int tokenizer_load_json(const char *json, size_t len, const char *label, Tokenizer **out, ZyErr *err) {
    *out = NULL;
    cJSON *root = parse_json(json, len, label, err);
    if (!root) return -1;
    Tokenizer *t = tok_new();
    int rc;
    if (!t)
        rc = zy_fail(err, "%s: out of memory", label);
    else
        rc = tok_load_pipeline(root, label, t, err) || load_model(root, label, t, err) || load_added(root, label, t, err) ||
             tok_finish(t, label, err);
    cJSON_Delete(root);
    if (rc) {
        tokenizer_free(t);
        return -1;
    }
    *out = t;
    return 0;
}

/* The name of a token in tokenizer_config.json: a string, or an AddedToken object's "content"; NULL if none. */
static int config_token(const cJSON *root, const char *name, const char *label, const char **out, ZyErr *err) {
    const cJSON *v = GET(root, name);
    *out = NULL;
    if (is_absent_or_null(v)) return 0;
    if (cJSON_IsObject(v)) v = GET(v, "content");
    if (!cJSON_IsString(v)) FAIL("%s: %s: expected a string or an object with a \"content\" string", label, name);
    *out = v->valuestring;
    return 0;
}

int tokenizer_apply_config_json(Tokenizer *t, const char *json, size_t len, const char *label, ZyErr *err) {
    char b1[200];
    cJSON *root = parse_json(json, len, label, err);
    if (!root) return -1;
    int rc = 0, flag[2] = {0, 0};
    static const char *const keys[2] = {"add_bos_token", "add_eos_token"}, *const names[2] = {"bos_token", "eos_token"};
    int present = 0;
    int32_t id[2] = {-1, -1};
    for (int k = 0; k < 2 && !rc; k++) {
        const char *tok;
        if (config_token(root, names[k], label, &tok, err)) {
            rc = -1;
            break;
        }
        free(t->cfg_special[k]); /* the names tokenizer_special_id gives first */
        t->cfg_special[k] = NULL;
        if (tok && !(t->cfg_special[k] = strdup(tok))) {
            rc = zy_fail(err, "%s: out of memory", label);
            break;
        }
        const cJSON *v = GET(root, keys[k]);
        if (!v) continue;
        present = 1;
        if (!cJSON_IsBool(v) && !cJSON_IsNull(v)) {
            rc = zy_fail(err, "%s: %s: expected a boolean, got %s", label, keys[k], kind_of(v, b1));
            break;
        }
        flag[k] = cJSON_IsTrue(v);
        if (flag[k] && !tok) {
            rc = zy_fail(err, "%s: %s: true, but there is no %s", label, keys[k], names[k]);
            break;
        }
        if (flag[k] && (id[k] = tokenizer_token_id(t, tok)) < 0)
            rc = zy_fail(err, "%s: %s: \"%s\" is not in the vocabulary", label, names[k], tok_shown(tok, b1));
    }
    /* transformers 4's LlamaTokenizerFast / GemmaTokenizerFast (update_post_processor): either key replaces
     * tokenizer.json's post-processor with [bos] $A [eos]. (transformers 5 drops both keys when there is a
     * tokenizer.json; released files agree with their tokenizer.json, so both read them alike.) */
    if (!rc && present) {
        Template tp = {malloc(3 * sizeof(int32_t)), 0};
        if (!tp.items) {
            rc = zy_fail(err, "%s: out of memory", label);
        } else {
            if (flag[0]) tp.items[tp.n++] = id[0];
            tp.items[tp.n++] = TPL_A;
            if (flag[1]) tp.items[tp.n++] = id[1];
            tok_templates_free(t);
            t->post[0] = tp;
            t->n_post = 1;
        }
    }
    cJSON_Delete(root);
    return rc;
}

int tokenizer_special_id(const Tokenizer *t, int which, int32_t *id, ZyErr *err) {
    static const char *const what[2] = {"beginning-of-sequence", "end-of-sequence"}, *const key[2] = {"bos_token", "eos_token"};
    static const char *const usual[2][6] = {{"<bos>", "<s>", "<|begin_of_text|>", "<|startoftext|>", NULL},
                                            {"<eos>", "</s>", "<|end_of_text|>", "<|endoftext|>", NULL}};
    char b1[200];
    which = which == TOK_SPECIAL_EOS;
    *id = -1;
    if (t->cfg_special[which]) { /* what transformers uses; a name it cannot find is an error, not a guess */
        if ((*id = tokenizer_token_id(t, t->cfg_special[which])) >= 0) return 0;
        return zy_fail(err, "tokenizer_config.json: %s \"%s\" is not in the vocabulary", key[which],
                       tok_shown(t->cfg_special[which], b1));
    }
    for (int k = 0; k < t->n_post; k++) { /* the template's special token before (after) the text: <bos> $A <eos> */
        const Template *tp = &t->post[k];
        size_t a = 0, b = tp->n;
        while (a < tp->n && tp->items[a] != TPL_A) a++;
        while (b > 0 && tp->items[b - 1] != TPL_A) b--;
        if (a == tp->n) continue;
        if (!which && a > 0) return *id = tp->items[0], 0;
        if (which && b < tp->n) return *id = tp->items[tp->n - 1], 0;
    }
    for (int k = 0; usual[which][k]; k++) {
        int32_t i = tokenizer_token_id(t, usual[which][k]);
        if (i >= 0 && t->added_of[i] >= 0 && t->added[t->added_of[i]].special) return *id = i, 0;
    }
    /* zaya's own tokenizers (and the eos zaya used before it read the names above) */
    if ((*id = tokenizer_token_id(t, which ? TOK_EOS_TEXT : TOK_BOS_TEXT)) >= 0) return 0;
    if (which && (*id = tokenizer_token_id(t, "<|endoftext|>")) >= 0) return 0;
    return zy_fail(err, "no %s token: no %s in tokenizer_config.json, none in the post-processor's template, and no "
                   "special token %s, %s, %s, %s or %s", what[which], key[which], usual[which][0], usual[which][1],
                   usual[which][2], usual[which][3], which ? TOK_EOS_TEXT : TOK_BOS_TEXT);
}

static int file_exists(const char *path, int *is_dir) {
    struct stat st;
    if (stat(path, &st) != 0) return 0;
    *is_dir = S_ISDIR(st.st_mode);
    return 1;
}

int tokenizer_load(const char *path, Tokenizer **out, ZyErr *err) {
    *out = NULL;
    int is_dir = 0;
    size_t pl = strlen(path);
    char *file = malloc(pl + 32), *cfg = malloc(pl + 32);
    if (!file || !cfg) {
        free(file);
        free(cfg);
        return zy_fail(err, "%s: out of memory", path);
    }
    if (file_exists(path, &is_dir) && is_dir) { /* a model folder */
        snprintf(file, pl + 32, "%s/tokenizer.json", path);
        snprintf(cfg, pl + 32, "%s/tokenizer_config.json", path);
    } else {
        memcpy(file, path, pl + 1);
        const char *slash = strrchr(path, '/');
        if (slash)
            snprintf(cfg, pl + 32, "%.*s/tokenizer_config.json", (int)(slash - path), path);
        else
            snprintf(cfg, pl + 32, "tokenizer_config.json");
    }
    char *data = NULL;
    size_t len;
    int rc = zy_read_file(file, &data, &len, err) || tokenizer_load_json(data, len, file, out, err);
    free(data);
    data = NULL;
    int cfg_dir = 0;
    if (!rc && file_exists(cfg, &cfg_dir) && !cfg_dir) {
        rc = zy_read_file(cfg, &data, &len, err) || tokenizer_apply_config_json(*out, data, len, cfg, err);
        free(data);
        if (rc) {
            tokenizer_free(*out);
            *out = NULL;
        }
    }
    free(file);
    free(cfg);
    return rc ? -1 : 0;
}

