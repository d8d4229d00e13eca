/* jinja_eval: the evaluator. Errors with their line:column; case mapping; sequences; jinja2's sandboxed attribute
 * and item access; Python's operators; call arguments; the string, list and dict methods; the globals (range, dict,
 * namespace, raise_exception, strftime_now), macros and scopes; expressions and statements; rendering. Semantics
 * are jinja2 3.1's as transformers configures it; where Python would print a memory address (a bound method, a
 * generator) rendering fails instead. The filters and tests are in jinja_filters.c. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "jinja/jinja.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <locale.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <wctype.h>

#include "jinja/jinja_internal.h"

/* ------------------------------------------------------------------------------------------------------------ */
/* Evaluation: errors */

int rfail(R *r, const Node *at, const char *fmt, ...) {
    char msg[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (at) {
        zy_fail(r->err, "chat template line %d:%d: %s", at->line, at->col, msg);
        r->need_pos = 0;
    } else {
        zy_fail(r->err, "%s", msg);
        r->need_pos = 1;
    }
    return -1;
}

/* An error raised below without a position gets the innermost node's. */
int add_pos(R *r, const Node *at) {
    if (r->need_pos) {
        char old[sizeof r->err->msg];
        memcpy(old, r->err->msg, sizeof old);
        snprintf(r->err->msg, sizeof r->err->msg, "chat template line %d:%d: %.960s", at->line, at->col, old);
        r->need_pos = 0;
    }
    return -1;
}

/* jinja2's UndefinedError for an operation on an undefined value. */
int undef_fail(R *r, const Node *at, Val u) {
    Str *h = u.u.p;
    return rfail(r, at, "%s", h ? h->s : "undefined value");
}

Val mk_undef(R *r, const char *fmt, ...) {
    char msg[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    Str *h = str_new(&r->ar, msg, strlen(msg)); /* on failure the hint is just missing */
    return v_undef(h);
}

/* Python's repr of a key for messages, shortened. */
static const char *key_repr(R *r, Val k, char *buf, size_t cap) {
    SBuf b = {0};
    ZyErr keep = *r->err;
    int need = r->need_pos;
    if (repr_val(r, k, &b, 0)) {
        *r->err = keep;
        r->need_pos = need;
        snprintf(buf, cap, "?");
    } else {
        snprintf(buf, cap, "%.100s%s", b.p, b.n > 100 ? "..." : "");
    }
    ar_free(&r->ar, b.p);
    return buf;
}

const char *obj_type_repr(Val v) { return v.kind == V_NONE ? "None" : type_name(v); }

/* ------------------------------------------------------------------------------------------------------------ */
/* Case mapping and character classes: ASCII by hand, the rest through the C.UTF-8 locale's tables. */

static uint32_t cp_upper(R *r, uint32_t c) {
    if (c < 0x80) return c >= 'a' && c <= 'z' ? c - 32 : c;
    return r->loc ? (uint32_t)towupper_l((wint_t)c, r->loc) : c;
}

static uint32_t cp_lower(R *r, uint32_t c) {
    if (c < 0x80) return c >= 'A' && c <= 'Z' ? c + 32 : c;
    return r->loc ? (uint32_t)towlower_l((wint_t)c, r->loc) : c;
}

static int cp_cased(R *r, uint32_t c) { return cp_upper(r, c) != c || cp_lower(r, c) != c; }

int cp_alpha(R *r, uint32_t c) {
    if (c < 0x80) return (c | 0x20) >= 'a' && (c | 0x20) <= 'z';
    return r->loc ? iswalpha_l((wint_t)c, r->loc) != 0 : 0;
}

/* Python's str.isdigit(): the decimal digits of every script (Unicode Nd, runs of ten) and the super/subscripts */
int cp_digit(R *r, uint32_t c) {
    static const uint32_t nd[] = {
        0x30, 0x660, 0x6F0, 0x7C0, 0x966, 0x9E6, 0xA66, 0xAE6, 0xB66, 0xBE6, 0xC66, 0xCE6, 0xD66, 0xDE6, 0xE50, 0xED0,
        0xF20, 0x1040, 0x1090, 0x17E0, 0x1810, 0x1946, 0x19D0, 0x1A80, 0x1A90, 0x1B50, 0x1BB0, 0x1C40, 0x1C50,
        0xA620, 0xA8D0, 0xA900, 0xA9D0, 0xA9F0, 0xAA50, 0xABF0, 0xFF10, 0x104A0, 0x10D30, 0x11066, 0x110F0, 0x11136,
        0x111D0, 0x112F0, 0x11450, 0x114D0, 0x11650, 0x116C0, 0x11730, 0x118E0, 0x11950, 0x11C50, 0x11D50, 0x11DA0,
        0x16A60, 0x16AC0, 0x16B50, 0x1D7CE, 0x1D7D8, 0x1D7E2, 0x1D7EC, 0x1D7F6, 0x1E140, 0x1E2F0, 0x1E950, 0x1FBF0};
    (void)r;
    for (size_t k = 0; k < ZY_ARRAY_LEN(nd); k++)
        if (c >= nd[k] && c < nd[k] + 10) return 1;
    return c == 0xB2 || c == 0xB3 || c == 0xB9 || c == 0x2070 || (c >= 0x2074 && c <= 0x2079) ||
           (c >= 0x2080 && c <= 0x2089) || (c >= 0x2460 && c <= 0x2468) || (c >= 0x2474 && c <= 0x247C) ||
           (c >= 0x2488 && c <= 0x2490) || c == 0x24EA || (c >= 0x24F5 && c <= 0x24FD) || c == 0x24FF ||
           (c >= 0x2776 && c <= 0x277E) || (c >= 0x2780 && c <= 0x2788) || (c >= 0x278A && c <= 0x2792);
}

static int sb_upper(R *r, SBuf *b, uint32_t c) {
    /* Python's full mappings where they differ from the one-to-one ones (the common ones) */
    static const struct {
        uint32_t c;
        const char *up;
    } full[] = {{0xDF, "SS"}, {0x149, "\xCA\xBCN"}, {0xFB00, "FF"}, {0xFB01, "FI"}, {0xFB02, "FL"}, {0xFB03, "FFI"},
                {0xFB04, "FFL"}, {0xFB05, "ST"}, {0xFB06, "ST"}, {0x1E9E, "\xE1\xBA\x9E"}};
    for (size_t k = 0; k < ZY_ARRAY_LEN(full); k++)
        if (full[k].c == c) return sb_puts(r, b, full[k].up);
    return sb_cp(r, b, cp_upper(r, c));
}

/* final: a capital sigma ending a word lowers to the final form, as Python's Final_Sigma rule does */
static int sb_lower(R *r, SBuf *b, uint32_t c, int final) {
    if (c == 0x130) return sb_puts(r, b, "i\xCC\x87");
    if (c == 0x3A3 && final) return sb_cp(r, b, 0x3C2);
    return sb_cp(r, b, cp_lower(r, c));
}

Str *str_case(R *r, const Str *s, int mode) {
    SBuf b = {0};
    int first = 1, prev_cased = 0;
    if (sb_reserve(r, &b, s->len)) return NULL;
    for (size_t i = 0; i < s->len;) {
        size_t cstart = i;
        uint32_t c = u8_dec(s->s, &i);
        int up;
        switch (mode) {
        case CASE_UPPER: up = 1; break;
        case CASE_LOWER: up = 0; break;
        case CASE_CAPITALIZE: up = first; break;
        case CASE_TITLE_FILTER: { /* jinja2: words split at runs of - white space ( { [ < */
            int sep = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || py_isspace(c);
            up = first && !sep;
            first = sep;
            break;
        }
        default: /* str.title(): upper after an uncased character */
            up = !prev_cased;
            prev_cased = cp_cased(r, c);
            break;
        }
        if (mode != CASE_TITLE_FILTER) first = 0;
        int final = 0;
        if (c == 0x3A3 && !up && cstart > 0) { /* preceded by a cased letter, not followed by one */
            size_t p = cstart - 1, j = i;
            while (p > 0 && ((unsigned char)s->s[p] & 0xC0) == 0x80) p--;
            final = cp_cased(r, u8_dec(s->s, &p)) && !(j < s->len && cp_cased(r, u8_dec(s->s, &j)));
        }
        if (up ? sb_upper(r, &b, c) : sb_lower(r, &b, c, final)) return NULL;
    }
    return sb_take(r, &b);
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Sequences */

/* The items a for loop (or list()) sees. Pointers into the value itself where possible; a generator is used up. */
static int iterate_raw(R *r, const Node *at, Val v, Val **items, size_t *n);

int iterate(R *r, const Node *at, Val v, Val **items, size_t *n) {
    if (iterate_raw(r, at, v, items, n)) return -1;
    return charge(r, *n / 4) ? add_pos(r, at) : 0;
}

static int iterate_raw(R *r, const Node *at, Val v, Val **items, size_t *n) {
    switch (v.kind) {
    case V_UNDEF:
        *items = NULL;
        *n = 0;
        return 0;
    case V_LIST:
    case V_TUPLE: {
        List *l = v.u.p;
        *items = l->v + l->pos;
        *n = l->n - l->pos;
        if (l->flavor == LF_GEN) l->pos = l->n;
        return 0;
    }
    case V_DICT: {
        Dict *d = v.u.p;
        *items = d->k;
        *n = d->n;
        return 0;
    }
    case V_STR: {
        Str *s = v.u.p;
        Val *out = ralloc(r, (s->ncp ? s->ncp : 1) * sizeof *out);
        if (!out) return add_pos(r, at);
        size_t k = 0;
        for (size_t i = 0; i < s->len;) {
            size_t st = i;
            uint32_t cp = u8_dec(s->s, &i);
            Str *c = cp < 128 ? r->ascii[cp] : NULL;
            if (!c && !(c = rstr(r, s->s + st, i - st))) return add_pos(r, at);
            if (cp < 128) r->ascii[cp] = c;
            out[k++] = v_ptr(V_STR, c);
        }
        *items = out;
        *n = k;
        return 0;
    }
    }
    return rfail(r, at, "'%s' object is not iterable", type_name(v));
}

Val mk_list(R *r, const Val *items, size_t n, int flavor) {
    List *l = list_new(r, n, flavor);
    if (!l) return (Val){.kind = -1};
    if (n) memcpy(l->v, items, n * sizeof *items);
    return v_ptr(V_LIST, l);
}

/* Python len(); -1 with an error for a type without one. */
int py_len(R *r, const Node *at, Val v, int64_t *n) {
    switch (v.kind) {
    case V_UNDEF: *n = 0; return 0;
    case V_STR: *n = (int64_t)((Str *)v.u.p)->ncp; return 0;
    case V_LIST:
    case V_TUPLE: {
        List *l = v.u.p;
        if (l->flavor == LF_GEN) break;
        *n = (int64_t)l->n;
        return 0;
    }
    case V_DICT: *n = (int64_t)((Dict *)v.u.p)->n; return 0;
    }
    return rfail(r, at, "object of type '%s' has no len()", type_name(v));
}

/* Byte offsets of each code point of s (plus the end), for indexing and slicing by character. */
size_t *cp_offsets(R *r, const Str *s) {
    size_t *off = ralloc(r, (s->ncp + 1) * sizeof *off);
    if (!off) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < s->len;) {
        off[k++] = i;
        u8_dec(s->s, &i);
    }
    off[k] = s->len;
    return off;
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Attribute and item access (jinja2's sandboxed getattr / getitem) */

enum { RK_STR = 1, RK_DICT = 2, RK_LIST = 4, RK_TUPLE = 8, RK_LOOP = 16 };

static const struct {
    int recv;
    const char *name;
    int id;
} method_table[] = {
    {RK_STR, "strip", M_STRIP}, {RK_STR, "lstrip", M_LSTRIP}, {RK_STR, "rstrip", M_RSTRIP}, {RK_STR, "split", M_SPLIT},
    {RK_STR, "rsplit", M_RSPLIT}, {RK_STR, "splitlines", M_SPLITLINES}, {RK_STR, "startswith", M_STARTSWITH},
    {RK_STR, "endswith", M_ENDSWITH}, {RK_STR, "upper", M_UPPER}, {RK_STR, "lower", M_LOWER}, {RK_STR, "title", M_TITLE},
    {RK_STR, "capitalize", M_CAPITALIZE}, {RK_STR, "replace", M_REPLACE}, {RK_STR, "find", M_FIND},
    {RK_STR, "rfind", M_RFIND}, {RK_STR, "index", M_INDEX}, {RK_STR, "count", M_COUNT}, {RK_STR, "join", M_JOIN},
    {RK_STR, "isdigit", M_ISDIGIT}, {RK_STR, "isalpha", M_ISALPHA}, {RK_STR, "isalnum", M_ISALNUM},
    {RK_STR, "isspace", M_ISSPACE}, {RK_STR, "isupper", M_ISUPPER}, {RK_STR, "islower", M_ISLOWER},
    {RK_STR, "removeprefix", M_REMOVEPREFIX}, {RK_STR, "removesuffix", M_REMOVESUFFIX},
    {RK_DICT, "get", M_GET}, {RK_DICT, "items", M_ITEMS}, {RK_DICT, "keys", M_KEYS}, {RK_DICT, "values", M_VALUES},
    {RK_DICT | RK_LIST, "copy", M_COPY}, {RK_LIST | RK_TUPLE, "index", M_LINDEX}, {RK_LIST | RK_TUPLE, "count", M_LCOUNT},
    {RK_LOOP, "cycle", M_CYCLE},
    /* Python has these; this engine does not */
    {RK_STR, "format", M_UNSUPPORTED}, {RK_STR, "format_map", M_UNSUPPORTED}, {RK_STR, "center", M_UNSUPPORTED},
    {RK_STR, "ljust", M_UNSUPPORTED}, {RK_STR, "rjust", M_UNSUPPORTED}, {RK_STR, "zfill", M_UNSUPPORTED},
    {RK_STR, "partition", M_UNSUPPORTED}, {RK_STR, "rpartition", M_UNSUPPORTED}, {RK_STR, "casefold", M_UNSUPPORTED},
    {RK_STR, "swapcase", M_UNSUPPORTED}, {RK_STR, "expandtabs", M_UNSUPPORTED}, {RK_STR, "encode", M_UNSUPPORTED},
    {RK_STR, "rindex", M_UNSUPPORTED}, {RK_STR, "istitle", M_UNSUPPORTED}, {RK_STR, "isnumeric", M_UNSUPPORTED},
    {RK_STR, "isdecimal", M_UNSUPPORTED}, {RK_STR, "isidentifier", M_UNSUPPORTED}, {RK_STR, "isprintable", M_UNSUPPORTED},
    {RK_STR, "isascii", M_UNSUPPORTED}, {RK_STR, "translate", M_UNSUPPORTED}, {RK_STR, "maketrans", M_UNSUPPORTED},
    {RK_DICT, "fromkeys", M_UNSUPPORTED}, {RK_LOOP, "changed", M_UNSUPPORTED},
};
/* methods that change their object: jinja2's ImmutableSandboxedEnvironment hands back an undefined that fails when
 * called */
static const struct {
    int recv;
    const char *name;
} unsafe_table[] = {
    {RK_LIST, "append"}, {RK_LIST, "extend"}, {RK_LIST, "insert"}, {RK_LIST, "pop"}, {RK_LIST, "remove"},
    {RK_LIST, "reverse"}, {RK_LIST, "sort"}, {RK_LIST, "clear"}, {RK_DICT, "pop"}, {RK_DICT, "popitem"},
    {RK_DICT, "setdefault"}, {RK_DICT, "update"}, {RK_DICT, "clear"},
};

/* A Python attribute of v (a method, a namespace member, a loop property); 1 found, 0 not. */
int py_attr(R *r, Val v, const Str *name, Val *out) {
    int recv = v.kind == V_STR ? RK_STR : v.kind == V_DICT ? RK_DICT : v.kind == V_TUPLE ? RK_TUPLE
             : v.kind == V_LOOP ? RK_LOOP
             : v.kind == V_LIST && ((List *)v.u.p)->flavor == LF_PLAIN ? RK_LIST : 0;
    if (v.kind == V_NS) {
        Val *x = dict_get_s(v.u.p, name->s, name->len);
        if (x) *out = *x;
        return x != NULL;
    }
    if (v.kind == V_LOOP) {
        Loop *l = v.u.p;
        const char *s = name->s;
        int64_t i = (int64_t)l->i, n = (int64_t)l->n;
        if (!strcmp(s, "index")) *out = v_int(i + 1);
        else if (!strcmp(s, "index0")) *out = v_int(i);
        else if (!strcmp(s, "revindex")) *out = v_int(n - i);
        else if (!strcmp(s, "revindex0")) *out = v_int(n - i - 1);
        else if (!strcmp(s, "first")) *out = v_bool(i == 0);
        else if (!strcmp(s, "last")) *out = v_bool(i == n - 1);
        else if (!strcmp(s, "length")) *out = v_int(n);
        else if (!strcmp(s, "depth")) *out = v_int(1);
        else if (!strcmp(s, "depth0")) *out = v_int(0);
        else if (!strcmp(s, "previtem")) *out = i > 0 && l->items ? l->items[i - 1] : mk_undef(r, "there is no previous item");
        else if (!strcmp(s, "nextitem")) *out = i + 1 < n && l->items ? l->items[i + 1] : mk_undef(r, "there is no next item");
        else goto methods;
        return 1;
    }
methods:
    if (!recv) return 0;
    for (size_t k = 0; k < ZY_ARRAY_LEN(method_table); k++)
        if ((method_table[k].recv & recv) && !strcmp(method_table[k].name, name->s)) {
            Method *m = ralloc(r, sizeof *m);
            if (!m) return -1;
            m->self = v;
            m->id = method_table[k].id;
            *out = v_ptr(V_METHOD, m);
            return 1;
        }
    for (size_t k = 0; k < ZY_ARRAY_LEN(unsafe_table); k++)
        if ((unsafe_table[k].recv & recv) && !strcmp(unsafe_table[k].name, name->s)) {
            *out = mk_undef(r, "access to attribute '%s' of '%s' object is unsafe.", name->s, type_name(v));
            return 1;
        }
    return 0;
}

static int get_item(R *r, const Node *at, Val obj, Val key, Val *out);

/* obj.name: the Python attribute, else obj[name]. */
static int get_attr(R *r, const Node *at, Val obj, const Str *name, Val *out) {
    if (obj.kind == V_UNDEF) return undef_fail(r, at, obj);
    if (obj.kind == V_DICT) {
        int f = py_attr(r, obj, name, out);
        if (f < 0) return add_pos(r, at);
        if (f) return 0;
        Val *x = dict_get_s(obj.u.p, name->s, name->len);
        if (x) {
            *out = *x;
            return 0;
        }
    } else {
        int f = py_attr(r, obj, name, out);
        if (f < 0) return add_pos(r, at);
        if (f) return 0;
    }
    *out = mk_undef(r, "'%s object' has no attribute '%.100s'", obj_type_repr(obj), name->s);
    return 0;
}

static int index_of(int64_t i, size_t n, size_t *out) {
    if (i < 0) i += (int64_t)n;
    if (i < 0 || (uint64_t)i >= n) return 0;
    *out = (size_t)i;
    return 1;
}

/* obj[key]: the item, else (for a string key) the attribute, else undefined. */
static int get_item(R *r, const Node *at, Val obj, Val key, Val *out) {
    if (obj.kind == V_UNDEF) return undef_fail(r, at, obj);
    int ikey = key.kind == V_INT || key.kind == V_BOOL;
    switch (obj.kind) {
    case V_DICT: {
        long e = dict_find(r, obj.u.p, key);
        if (e == -2) {
            if (key.kind != V_STR) { /* unhashable: TypeError, which jinja2 turns into undefined */
                r->need_pos = 0;
                goto undefined;
            }
            return add_pos(r, at);
        }
        if (e >= 0) {
            *out = ((Dict *)obj.u.p)->v[e];
            return 0;
        }
        break;
    }
    case V_LIST:
    case V_TUPLE: {
        List *l = obj.u.p;
        size_t i;
        if (l->flavor == LF_PLAIN && ikey && index_of(key.u.i, l->n, &i)) {
            *out = l->v[i];
            return 0;
        }
        break;
    }
    case V_STR: {
        Str *s = obj.u.p;
        size_t i;
        if (ikey && index_of(key.u.i, s->ncp, &i)) {
            size_t b = 0;
            for (size_t k = 0; k < i; k++) u8_dec(s->s, &b);
            size_t e = b;
            u8_dec(s->s, &e);
            Str *c = rstr(r, s->s + b, e - b);
            if (!c) return add_pos(r, at);
            *out = v_markup(c, obj.markup);
            return 0;
        }
        break;
    }
    }
    if (key.kind == V_STR) {
        int f = py_attr(r, obj, key.u.p, out);
        if (f < 0) return add_pos(r, at);
        if (f) return 0;
    }
undefined:;
    char kb[128];
    *out = mk_undef(r, "%s object has no element %s", obj_type_repr(obj), key_repr(r, key, kb, sizeof kb));
    return 0;
}

/* Python's slice of a list, tuple or string; anything else (or non-int bounds) gives undefined, as jinja2's
 * getitem turns the TypeError into one. */
static int get_slice(R *r, const Node *at, Val obj, const Val *bound, const int *given, Val *out) {
    if (obj.kind == V_UNDEF) return undef_fail(r, at, obj);
    int64_t v[3];
    for (int k = 0; k < 3; k++) {
        if (!given[k] || bound[k].kind == V_NONE) continue;
        if (bound[k].kind != V_INT && bound[k].kind != V_BOOL) goto undefined;
        v[k] = bound[k].u.i;
    }
    int64_t step = given[2] && bound[2].kind != V_NONE ? v[2] : 1;
    if (step == 0) return rfail(r, at, "slice step cannot be zero");
    int64_t len;
    if (obj.kind == V_STR)
        len = (int64_t)((Str *)obj.u.p)->ncp;
    else if ((obj.kind == V_LIST || obj.kind == V_TUPLE) && ((List *)obj.u.p)->flavor == LF_PLAIN)
        len = (int64_t)((List *)obj.u.p)->n;
    else
        goto undefined;
    int64_t se[2];
    for (int k = 0; k < 2; k++) {
        if (!given[k] || bound[k].kind == V_NONE) {
            se[k] = step > 0 ? (k == 0 ? 0 : len) : (k == 0 ? len - 1 : -1);
            continue;
        }
        int64_t x = v[k];
        if (x < 0) {
            x += len;
            if (x < 0) x = step < 0 ? -1 : 0;
        } else if (x >= len) {
            x = step < 0 ? len - 1 : len;
        }
        se[k] = x;
    }
    int64_t cnt = 0;
    if (step > 0 && se[1] > se[0]) cnt = (se[1] - se[0] - 1) / step + 1;
    if (step < 0 && se[0] > se[1]) cnt = (se[0] - se[1] - 1) / (-step) + 1;
    if (obj.kind == V_STR) {
        Str *s = obj.u.p;
        size_t *off = cp_offsets(r, s);
        if (!off) return add_pos(r, at);
        SBuf b = {0};
        for (int64_t k = 0, i = se[0]; k < cnt; k++, i += step)
            if (sb_put(r, &b, s->s + off[i], off[i + 1] - off[i])) return add_pos(r, at);
        ar_free(&r->ar, off);
        Str *x = sb_take(r, &b);
        if (!x) return add_pos(r, at);
        *out = v_markup(x, obj.markup);
        return 0;
    }
    List *l = obj.u.p, *x = list_new(r, (size_t)cnt, LF_PLAIN);
    if (!x) return add_pos(r, at);
    for (int64_t k = 0, i = se[0]; k < cnt; k++, i += step) x->v[k] = l->v[i];
    *out = v_ptr(obj.kind, x);
    return 0;
undefined:
    *out = mk_undef(r, "%s object is not subscriptable with that slice", obj_type_repr(obj));
    return 0;
}

/* jinja2's make_attrgetter: "a.b.0" walks items (then attributes) of the parts. */
int attr_path_d(R *r, const Node *at, Val obj, Val attr, const Val *def, Val *out) {
    if (attr.kind != V_STR) {
        if (get_item(r, at, obj, attr, out)) return -1;
        if (def && out->kind == V_UNDEF) *out = *def;
        return 0;
    }
    Str *a = attr.u.p;
    const char *s = a->s;
    Val cur = obj;
    for (;;) {
        const char *dot = memchr(s, '.', a->len - (size_t)(s - a->s));
        size_t len = dot ? (size_t)(dot - s) : a->len - (size_t)(s - a->s);
        int digits = len > 0;
        for (size_t k = 0; k < len; k++) digits &= s[k] >= '0' && s[k] <= '9';
        Val key;
        if (digits && len < 18)
            key = v_int(strtoll(s, NULL, 10));
        else {
            Str *part = rstr(r, s, len);
            if (!part) return add_pos(r, at);
            key = v_ptr(V_STR, part);
        }
        if (get_item(r, at, cur, key, &cur)) return -1;
        if (def && cur.kind == V_UNDEF) cur = *def;
        if (!dot) break;
        s = dot + 1;
    }
    *out = cur;
    return 0;
}

int attr_path(R *r, const Node *at, Val obj, Val attr, Val *out) { return attr_path_d(r, at, obj, attr, NULL, out); }

/* ------------------------------------------------------------------------------------------------------------ */
/* Operators */

/* markupsafe.escape */
int html_escape(R *r, const Str *s, SBuf *b) {
    for (size_t k = 0; k < s->len; k++) {
        char c = s->s[k];
        int rc = c == '&' ? sb_puts(r, b, "&amp;") : c == '<' ? sb_puts(r, b, "&lt;") : c == '>' ? sb_puts(r, b, "&gt;")
               : c == '"' ? sb_puts(r, b, "&#34;") : c == '\'' ? sb_puts(r, b, "&#39;") : sb_putc(r, b, c);
        if (rc) return -1;
    }
    return 0;
}

int arith(R *r, const Node *at, int op, Val a, Val b, Val *out) {
    static const char *const sym[] = {"+", "-", "*", "/", "//", "%", "**"};
    if (a.kind == V_UNDEF) return undef_fail(r, at, a);
    if (b.kind == V_UNDEF) return undef_fail(r, at, b);
    if (is_num(a) && is_num(b)) {
        if (a.kind != V_FLOAT && b.kind != V_FLOAT) {
            int64_t x = a.u.i, y = b.u.i, z;
            switch (op) {
            case OP_ADD:
                if (__builtin_add_overflow(x, y, &z)) goto overflow;
                *out = v_int(z);
                return 0;
            case OP_SUB:
                if (__builtin_sub_overflow(x, y, &z)) goto overflow;
                *out = v_int(z);
                return 0;
            case OP_MUL:
                if (__builtin_mul_overflow(x, y, &z)) goto overflow;
                *out = v_int(z);
                return 0;
            case OP_DIV:
                if (y == 0) return rfail(r, at, "division by zero");
                *out = v_float((double)x / (double)y);
                return 0;
            case OP_FLOORDIV:
            case OP_MOD: {
                if (y == 0) return rfail(r, at, "integer division or modulo by zero");
                if (x == INT64_MIN && y == -1) {
                    if (op == OP_MOD) {
                        *out = v_int(0);
                        return 0;
                    }
                    goto overflow;
                }
                int64_t q = x / y, m = x % y;
                if (m != 0 && ((m < 0) != (y < 0))) q--, m += y;
                *out = v_int(op == OP_FLOORDIV ? q : m);
                return 0;
            }
            case OP_POW: {
                if (y < 0) {
                    if (x == 0) return rfail(r, at, "0.0 cannot be raised to a negative power");
                    *out = v_float(pow((double)x, (double)y));
                    return 0;
                }
                int64_t acc = 1, base = x;
                uint64_t e = (uint64_t)y;
                if (x == 0 || x == 1) {
                    *out = v_int(y == 0 ? 1 : x);
                    return 0;
                }
                if (x == -1) {
                    *out = v_int(e & 1 ? -1 : 1);
                    return 0;
                }
                while (e) {
                    if (e & 1 && __builtin_mul_overflow(acc, base, &acc)) goto overflow;
                    e >>= 1;
                    if (e && __builtin_mul_overflow(base, base, &base)) goto overflow;
                }
                *out = v_int(acc);
                return 0;
            }
            }
        }
        double x = num_f(a), y = num_f(b);
        switch (op) {
        case OP_ADD: *out = v_float(x + y); return 0;
        case OP_SUB: *out = v_float(x - y); return 0;
        case OP_MUL: *out = v_float(x * y); return 0;
        case OP_DIV:
            if (y == 0) return rfail(r, at, "float division by zero");
            *out = v_float(x / y);
            return 0;
        case OP_FLOORDIV:
        case OP_MOD: { /* CPython's float_divmod */
            if (y == 0) return rfail(r, at, "float %s by zero", op == OP_MOD ? "modulo" : "floor division");
            double mod = fmod(x, y), div = (x - mod) / y, fl;
            if (mod != 0) {
                if ((y < 0) != (mod < 0)) mod += y, div -= 1.0;
            } else {
                mod = copysign(0.0, y);
            }
            if (div != 0) {
                fl = floor(div);
                if (div - fl > 0.5) fl += 1.0;
            } else {
                fl = copysign(0.0, x / y);
            }
            *out = v_float(op == OP_MOD ? mod : fl);
            return 0;
        }
        case OP_POW: {
            if (x == 0 && y < 0) return rfail(r, at, "0.0 cannot be raised to a negative power");
            if (x < 0 && y != floor(y)) return rfail(r, at, "unsupported: a negative number to a fractional power (complex)");
            double z = pow(x, y);
            if (isinf(z) && !isinf(x) && !isinf(y)) return rfail(r, at, "numerical result out of range");
            *out = v_float(z);
            return 0;
        }
        }
    }
    if (op == OP_ADD && a.kind == b.kind && (a.kind == V_STR || a.kind == V_LIST || a.kind == V_TUPLE)) {
        if (a.kind == V_STR) { /* with a Markup operand, the other one is escaped and the result is Markup */
            Str *x = a.u.p, *y = b.u.p;
            int mk = a.markup || b.markup;
            SBuf s = {0};
            if ((mk && !a.markup ? html_escape(r, x, &s) : sb_put(r, &s, x->s, x->len)) ||
                (mk && !b.markup ? html_escape(r, y, &s) : sb_put(r, &s, y->s, y->len)))
                return add_pos(r, at);
            Str *z = sb_take(r, &s);
            if (!z) return add_pos(r, at);
            *out = v_markup(z, mk);
            return 0;
        }
        List *x = a.u.p, *y = b.u.p;
        if (x->flavor == LF_PLAIN && y->flavor == LF_PLAIN) {
            List *z = list_new(r, x->n + y->n, LF_PLAIN);
            if (!z) return add_pos(r, at);
            if (x->n) memcpy(z->v, x->v, x->n * sizeof(Val));
            if (y->n) memcpy(z->v + x->n, y->v, y->n * sizeof(Val));
            *out = v_ptr(a.kind, z);
            return 0;
        }
    }
    if (op == OP_MUL) {
        Val seq = a, cnt = b;
        if (a.kind == V_INT || a.kind == V_BOOL) seq = b, cnt = a;
        if ((cnt.kind == V_INT || cnt.kind == V_BOOL) && (seq.kind == V_STR || seq.kind == V_LIST || seq.kind == V_TUPLE)) {
            int64_t k = cnt.u.i < 0 ? 0 : cnt.u.i;
            size_t unit = seq.kind == V_STR ? ((Str *)seq.u.p)->len : ((List *)seq.u.p)->n;
            if (unit == 0) k = 0; /* '' * 10**18 is '' at once, not 10**18 empty appends */
            if (seq.kind == V_STR) {
                Str *s = seq.u.p;
                if (s->len && (uint64_t)k > r->max_output / s->len)
                    return rfail(r, at, "the string would exceed %zu bytes", r->max_output);
                SBuf o = {0};
                for (int64_t i = 0; i < k; i++)
                    if (sb_put(r, &o, s->s, s->len)) return add_pos(r, at);
                Str *z = sb_take(r, &o);
                if (!z) return add_pos(r, at);
                *out = v_markup(z, seq.markup);
                return 0;
            }
            List *l = seq.u.p;
            if (l->flavor == LF_PLAIN) {
                if (l->n && (uint64_t)k > (r->ar.limit / sizeof(Val)) / l->n) return oom(r), add_pos(r, at);
                List *z = list_new(r, l->n * (size_t)k, LF_PLAIN);
                if (!z) return add_pos(r, at);
                for (int64_t i = 0; i < k; i++)
                    if (l->n) memcpy(z->v + (size_t)i * l->n, l->v, l->n * sizeof(Val));
                *out = v_ptr(seq.kind, z);
                return 0;
            }
        }
    }
    if (op == OP_MOD && a.kind == V_STR) return rfail(r, at, "unsupported: %% string formatting");
    return rfail(r, at, "unsupported operand type(s) for %s: '%s' and '%s'", sym[op], type_name(a), type_name(b));
overflow:
    return rfail(r, at, "integer overflow (Python's integers are unbounded; this engine's are 64-bit)");
}

/* needle in haystack */
int contains(R *r, const Node *at, Val needle, Val hay, int *res) {
    *res = 0;
    if (hay.kind == V_STR) {
        if (needle.kind != V_STR)
            return rfail(r, at, "'in <string>' requires string as left operand, not %s", type_name(needle));
        Str *h = hay.u.p, *n = needle.u.p;
        *res = n->len == 0 || memmem(h->s, h->len, n->s, n->len) != NULL;
        return 0;
    }
    if (hay.kind == V_DICT) {
        long e = dict_find(r, hay.u.p, needle);
        if (e == -2) return add_pos(r, at);
        *res = e >= 0;
        return 0;
    }
    if (hay.kind == V_UNDEF || hay.kind == V_LIST || hay.kind == V_TUPLE) {
        Val *items;
        size_t n;
        if (hay.kind == V_LIST && ((List *)hay.u.p)->flavor == LF_GEN) { /* consumed up to the match, like Python */
            List *l = hay.u.p;
            while (l->pos < l->n) {
                int e = val_eq(r, l->v[l->pos++], needle, 0);
                if (e < 0) return add_pos(r, at);
                if (e) {
                    *res = 1;
                    return 0;
                }
            }
            return 0;
        }
        if (iterate(r, at, hay, &items, &n)) return -1;
        for (size_t i = 0; i < n; i++) {
            int e = val_eq(r, items[i], needle, 0);
            if (e < 0) return add_pos(r, at);
            if (e) {
                *res = 1;
                return 0;
            }
        }
        return 0;
    }
    return rfail(r, at, "argument of type '%s' is not iterable", type_name(hay));
}

int compare(R *r, const Node *at, int op, Val a, Val b, int *res) {
    switch (op) {
    case CMP_EQ:
    case CMP_NE: {
        int e = val_eq(r, a, b, 0);
        if (e < 0) return add_pos(r, at);
        *res = op == CMP_EQ ? e : !e;
        return 0;
    }
    case CMP_IN:
    case CMP_NOTIN:
        if (contains(r, at, a, b, res)) return -1;
        if (op == CMP_NOTIN) *res = !*res;
        return 0;
    }
    if (is_num(a) && is_num(b)) {
        int c = num_cmp(a, b);
        *res = c == 2 ? 0 : op == CMP_LT ? c < 0 : op == CMP_LE ? c <= 0 : op == CMP_GT ? c > 0 : c >= 0;
        return 0;
    }
    int lt;
    if (op == CMP_LT || op == CMP_GE) {
        if (val_lt(r, a, b, &lt, 0)) return add_pos(r, at);
        *res = op == CMP_LT ? lt : !lt;
    } else {
        if (val_lt(r, b, a, &lt, 0)) return add_pos(r, at);
        *res = op == CMP_GT ? lt : !lt;
    }
    return 0;
}

/* Stable sort of v by keys (Python's sorted; reverse keeps equal items in order). */
int merge_sort(R *r, Val *v, Val *keys, size_t n, int reverse) {
    if (n < 2) return 0;
    Val *tv = ralloc(r, n * sizeof *tv), *tk = ralloc(r, n * sizeof *tk);
    if (!tv || !tk) return -1;
    for (size_t w = 1; w < n; w *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * w) {
            size_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n, i = lo, j = mid, k = lo;
            while (i < mid && j < hi) {
                int take_right;
                if (reverse ? val_lt(r, keys[i], keys[j], &take_right, 0) : val_lt(r, keys[j], keys[i], &take_right, 0))
                    return -1;
                if (take_right)
                    tv[k] = v[j], tk[k++] = keys[j++];
                else
                    tv[k] = v[i], tk[k++] = keys[i++];
            }
            while (i < mid) tv[k] = v[i], tk[k++] = keys[i++];
            while (j < hi) tv[k] = v[j], tk[k++] = keys[j++];
        }
        memcpy(v, tv, n * sizeof *v);
        memcpy(keys, tk, n * sizeof *keys);
    }
    ar_free(&r->ar, tv);
    ar_free(&r->ar, tk);
    return 0;
}

/* jinja2's ignore_case: strings compare lower-cased. */
int fold_key(R *r, Val v, int case_sensitive, Val *out) {
    if (case_sensitive || v.kind != V_STR) {
        *out = v;
        return 0;
    }
    Str *s = str_case(r, v.u.p, CASE_LOWER);
    if (!s) return -1;
    *out = v_ptr(V_STR, s);
    return 0;
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Calls: arguments */

static int ev(R *r, const Node *e, Val *out);

static int ev_args(R *r, const Node *e, Args *a) {
    a->npos = e->nkids;
    a->nkw = e->nnames;
    a->kwn = e->names;
    a->pos = ralloc(r, (size_t)(e->nkids + e->nnames + 1) * sizeof(Val));
    if (!a->pos) return add_pos(r, e);
    a->kwv = a->pos + e->nkids;
    for (int k = 0; k < e->nkids; k++)
        if (ev(r, e->kids[k], &a->pos[k])) return -1;
    for (int k = 0; k < e->nnames; k++)
        if (ev(r, e->kids2[k], &a->kwv[k])) return -1;
    return 0;
}

/* Binds arguments to named parameters ("a,b,c"): slot[k] / have[k]. */
int jinja_bind(R *r, const Node *at, const char *what, const char *params, const Args *a, Val *slot, int *have,
               int max) {
    const char *names[8];
    size_t lens[8];
    int np = 0;
    for (const char *p = params; *p && np < 8;) {
        const char *c = strchr(p, ',');
        names[np] = p;
        lens[np++] = c ? (size_t)(c - p) : strlen(p);
        if (!c) break;
        p = c + 1;
    }
    for (int k = 0; k < max; k++) have[k] = 0;
    if (a->npos > np) return rfail(r, at, "%s takes at most %d argument(s) (%d given)", what, np, a->npos);
    for (int k = 0; k < a->npos; k++) slot[k] = a->pos[k], have[k] = 1;
    for (int j = 0; j < a->nkw; j++) {
        int k;
        for (k = 0; k < np; k++)
            if (lens[k] == a->kwn[j]->len && !memcmp(names[k], a->kwn[j]->s, lens[k])) break;
        if (k == np) return rfail(r, at, "%s got an unexpected keyword argument '%s'", what, a->kwn[j]->s);
        if (have[k]) return rfail(r, at, "%s got multiple values for argument '%s'", what, a->kwn[j]->s);
        slot[k] = a->kwv[j], have[k] = 1;
    }
    return 0;
}

int want_int(R *r, const Node *at, Val v, const char *what, int64_t *out) {
    if (v.kind == V_INT || v.kind == V_BOOL) {
        *out = v.u.i;
        return 0;
    }
    if (v.kind == V_UNDEF) return undef_fail(r, at, v);
    return rfail(r, at, "%s: an integer is required, got '%s'", what, type_name(v));
}

int want_str(R *r, const Node *at, Val v, const char *what, Str **out) {
    if (v.kind == V_STR) {
        *out = v.u.p;
        return 0;
    }
    if (v.kind == V_UNDEF) return undef_fail(r, at, v);
    return rfail(r, at, "%s: a string is required, got '%s'", what, type_name(v));
}

/* ------------------------------------------------------------------------------------------------------------ */
/* String methods */

static int in_chars(const Str *chars, uint32_t c) {
    if (!chars) return py_isspace(c);
    for (size_t i = 0; i < chars->len;)
        if (u8_dec(chars->s, &i) == c) return 1;
    return 0;
}

/* strip / lstrip / rstrip; chars NULL = white space */
Str *str_strip(R *r, Str *s, const Str *chars, int left, int right) {
    size_t b = 0, e = s->len;
    if (left)
        while (b < e) {
            size_t j = b;
            if (!in_chars(chars, u8_dec(s->s, &j))) break;
            b = j;
        }
    if (right)
        while (e > b) {
            size_t st = e - 1;
            while (st > b && ((unsigned char)s->s[st] & 0xC0) == 0x80) st--;
            size_t j = st;
            if (!in_chars(chars, u8_dec(s->s, &j))) break;
            e = st;
        }
    if (b == 0 && e == s->len) return s;
    return rstr(r, s->s + b, e - b);
}

int list_push(R *r, Val **items, size_t *n, size_t *cap, Val v) {
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 8;
        Val *p = ar_realloc(&r->ar, *items, c * sizeof *p);
        if (!p) return oom(r);
        *items = p;
        *cap = c;
    }
    (*items)[(*n)++] = v;
    return 0;
}

static int push_piece(R *r, Val **items, size_t *n, size_t *cap, const char *s, size_t len) {
    Str *x = rstr(r, s, len);
    return x ? list_push(r, items, n, cap, v_ptr(V_STR, x)) : -1;
}

/* str.split / str.rsplit */
int str_split(R *r, const Node *at, Str *s, const Str *sep, int64_t maxsplit, int from_right, Val *out) {
    Val *items = NULL;
    size_t n = 0, cap = 0;
    if (sep && sep->len == 0) return rfail(r, at, "empty separator");
    if (!from_right) {
        size_t i = 0;
        if (!sep) {
            for (;;) {
                i = skip_ws(s->s, s->len, i);
                if (i >= s->len) break;
                size_t st = i;
                if (maxsplit >= 0 && (int64_t)n >= maxsplit) { /* the rest as it is, trailing white space too */
                    if (push_piece(r, &items, &n, &cap, s->s + st, s->len - st)) return add_pos(r, at);
                    break;
                }
                while (i < s->len && !ws_at(s->s, s->len, i)) u8_dec(s->s, &i);
                if (push_piece(r, &items, &n, &cap, s->s + st, i - st)) return add_pos(r, at);
            }
        } else {
            for (;;) {
                const char *hit = maxsplit >= 0 && (int64_t)n >= maxsplit ? NULL : memmem(s->s + i, s->len - i, sep->s, sep->len);
                size_t e = hit ? (size_t)(hit - s->s) : s->len;
                if (push_piece(r, &items, &n, &cap, s->s + i, e - i)) return add_pos(r, at);
                if (!hit) break;
                i = e + sep->len;
            }
        }
    } else { /* from the right: collect reversed, then flip */
        size_t e = s->len;
        if (!sep) {
            for (;;) {
                e = rstrip_len(s->s, e);
                if (e == 0) break;
                if (maxsplit >= 0 && (int64_t)n >= maxsplit) { /* the rest as it is, leading white space too */
                    if (push_piece(r, &items, &n, &cap, s->s, e)) return add_pos(r, at);
                    break;
                }
                size_t b = e;
                while (b > 0) {
                    size_t st = b - 1;
                    while (st > 0 && ((unsigned char)s->s[st] & 0xC0) == 0x80) st--;
                    if (ws_at(s->s, s->len, st)) break;
                    b = st;
                }
                if (push_piece(r, &items, &n, &cap, s->s + b, e - b)) return add_pos(r, at);
                e = b;
            }
        } else {
            for (;;) {
                size_t hit = SIZE_MAX;
                if (!(maxsplit >= 0 && (int64_t)n >= maxsplit) && e >= sep->len)
                    for (size_t k = e - sep->len + 1; k-- > 0;)
                        if (!memcmp(s->s + k, sep->s, sep->len)) {
                            hit = k;
                            break;
                        }
                size_t b = hit == SIZE_MAX ? 0 : hit + sep->len;
                if (push_piece(r, &items, &n, &cap, s->s + b, e - b)) return add_pos(r, at);
                if (hit == SIZE_MAX) break;
                e = hit;
            }
        }
        for (size_t k = 0; k < n / 2; k++) {
            Val t = items[k];
            items[k] = items[n - 1 - k];
            items[n - 1 - k] = t;
        }
    }
    *out = mk_list(r, items, n, LF_PLAIN);
    return out->kind < 0 ? add_pos(r, at) : 0;
}

/* str.splitlines(): \n \r \r\n \v \f \x1c-\x1e \x85 \u2028 \u2029 */
int str_splitlines(R *r, const Node *at, Str *s, int keepends, Val *out) {
    Val *items = NULL;
    size_t n = 0, cap = 0, st = 0;
    for (size_t i = 0; i < s->len;) {
        size_t at_i = i;
        uint32_t c = u8_dec(s->s, &i);
        if (c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || (c >= 0x1C && c <= 0x1E) || c == 0x85 || c == 0x2028 ||
            c == 0x2029) {
            if (c == '\r' && i < s->len && s->s[i] == '\n') i++;
            if (push_piece(r, &items, &n, &cap, s->s + st, (keepends ? i : at_i) - st)) return add_pos(r, at);
            st = i;
        }
    }
    if (st < s->len && push_piece(r, &items, &n, &cap, s->s + st, s->len - st)) return add_pos(r, at);
    *out = mk_list(r, items, n, LF_PLAIN);
    return out->kind < 0 ? add_pos(r, at) : 0;
}

/* str.replace(old, new, count) */
Str *str_replace(R *r, Str *s, const Str *old, const Str *rep, int64_t count) {
    SBuf b = {0};
    int64_t done = 0;
    if (old->len == 0) { /* Python inserts rep before every character and at the end */
        for (size_t i = 0; i <= s->len;) {
            if ((count < 0 || done < count) && sb_put(r, &b, rep->s, rep->len)) return NULL;
            done++;
            if (i == s->len) break;
            size_t st = i;
            u8_dec(s->s, &i);
            if (sb_put(r, &b, s->s + st, i - st)) return NULL;
        }
        return sb_take(r, &b);
    }
    size_t i = 0;
    for (;;) {
        const char *hit = count >= 0 && done >= count ? NULL : memmem(s->s + i, s->len - i, old->s, old->len);
        size_t e = hit ? (size_t)(hit - s->s) : s->len;
        if (sb_put(r, &b, s->s + i, e - i)) return NULL;
        if (!hit) break;
        if (sb_put(r, &b, rep->s, rep->len)) return NULL;
        done++;
        i = e + old->len;
    }
    return sb_take(r, &b);
}

static int str_affix(const Str *s, const Str *p, int end) {
    if (p->len > s->len) return 0;
    return memcmp(s->s + (end ? s->len - p->len : 0), p->s, p->len) == 0;
}

static int call_method_raw(R *r, const Node *at, Method *m, const Args *a, Val *out) {
    Val self = m->self, slot[4];
    int have[4];
    Str *s = self.kind == V_STR ? self.u.p : NULL, *x;
    const char *mname = "method";
    for (size_t k = 0; k < ZY_ARRAY_LEN(method_table); k++)
        if (method_table[k].id == m->id) {
            mname = method_table[k].name;
            break;
        }
    switch (m->id) {
    case M_STRIP:
    case M_LSTRIP:
    case M_RSTRIP: {
        if (jinja_bind(r, at, mname, "chars", a, slot, have, 4)) return -1;
        Str *chars = NULL;
        if (have[0] && slot[0].kind != V_NONE && want_str(r, at, slot[0], mname, &chars)) return -1;
        if (!(x = str_strip(r, s, chars, m->id != M_RSTRIP, m->id != M_LSTRIP))) return add_pos(r, at);
        *out = v_ptr(V_STR, x);
        return 0;
    }
    case M_SPLIT:
    case M_RSPLIT: {
        if (jinja_bind(r, at, mname, "sep,maxsplit", a, slot, have, 4)) return -1;
        Str *sep = NULL;
        int64_t maxsplit = -1;
        if (have[0] && slot[0].kind != V_NONE && want_str(r, at, slot[0], mname, &sep)) return -1;
        if (have[1] && want_int(r, at, slot[1], mname, &maxsplit)) return -1;
        return str_split(r, at, s, sep, maxsplit, m->id == M_RSPLIT, out);
    }
    case M_SPLITLINES:
        if (jinja_bind(r, at, mname, "keepends", a, slot, have, 4)) return -1;
        return str_splitlines(r, at, s, have[0] && truthy(slot[0]), out);
    case M_STARTSWITH:
    case M_ENDSWITH: {
        if (jinja_bind(r, at, mname, "prefix", a, slot, have, 4)) return -1;
        if (!have[0]) return rfail(r, at, "%s() takes at least 1 argument", mname);
        int end = m->id == M_ENDSWITH, hit = 0;
        if (slot[0].kind == V_TUPLE) {
            List *l = slot[0].u.p;
            for (size_t k = 0; k < l->n && !hit; k++) {
                if (want_str(r, at, l->v[k], mname, &x)) return -1;
                hit = str_affix(s, x, end);
            }
        } else {
            if (want_str(r, at, slot[0], mname, &x)) return -1;
            hit = str_affix(s, x, end);
        }
        *out = v_bool(hit);
        return 0;
    }
    case M_UPPER:
    case M_LOWER:
    case M_TITLE:
    case M_CAPITALIZE:
        if (jinja_bind(r, at, mname, "", a, slot, have, 4)) return -1;
        x = str_case(r, s, m->id == M_UPPER   ? CASE_UPPER
                           : m->id == M_LOWER ? CASE_LOWER
                           : m->id == M_TITLE ? CASE_TITLE_METHOD
                                              : CASE_CAPITALIZE);
        if (!x) return add_pos(r, at);
        *out = v_ptr(V_STR, x);
        return 0;
    case M_REPLACE: {
        Str *old, *rep;
        int64_t count = -1;
        if (jinja_bind(r, at, mname, "old,new,count", a, slot, have, 4)) return -1;
        if (!have[0] || !have[1]) return rfail(r, at, "replace() takes at least 2 arguments");
        if (want_str(r, at, slot[0], mname, &old) || want_str(r, at, slot[1], mname, &rep)) return -1;
        if (have[2] && want_int(r, at, slot[2], mname, &count)) return -1;
        if (!(x = str_replace(r, s, old, rep, count))) return add_pos(r, at);
        *out = v_ptr(V_STR, x);
        return 0;
    }
    case M_FIND:
    case M_RFIND:
    case M_INDEX:
    case M_COUNT: {
        Str *sub;
        if (jinja_bind(r, at, mname, "sub", a, slot, have, 4)) return -1;
        if (!have[0]) return rfail(r, at, "%s() takes at least 1 argument", mname);
        if (want_str(r, at, slot[0], mname, &sub)) return -1;
        if (m->id == M_COUNT) {
            int64_t c = 0;
            if (sub->len == 0)
                c = (int64_t)s->ncp + 1;
            else
                for (const char *p = s->s; (p = memmem(p, s->len - (size_t)(p - s->s), sub->s, sub->len)) != NULL;
                     p += sub->len)
                    c++;
            *out = v_int(c);
            return 0;
        }
        const char *hit = NULL;
        if (m->id == M_RFIND) {
            for (size_t k = s->len - (sub->len <= s->len ? sub->len : s->len) + 1; k-- > 0;)
                if (sub->len <= s->len - k && !memcmp(s->s + k, sub->s, sub->len)) {
                    hit = s->s + k;
                    break;
                }
        } else {
            hit = sub->len ? memmem(s->s, s->len, sub->s, sub->len) : s->s;
        }
        if (!hit && m->id == M_INDEX) return rfail(r, at, "substring not found");
        *out = v_int(hit ? (int64_t)u8_count(s->s, (size_t)(hit - s->s)) : -1);
        return 0;
    }
    case M_JOIN: {
        Val *items;
        size_t n;
        if (jinja_bind(r, at, mname, "iterable", a, slot, have, 4)) return -1;
        if (!have[0]) return rfail(r, at, "join() takes exactly one argument");
        if (iterate(r, at, slot[0], &items, &n)) return -1;
        SBuf b = {0};
        for (size_t k = 0; k < n; k++) {
            if (items[k].kind != V_STR)
                return rfail(r, at, "sequence item %zu: expected str instance, %s found", k, type_name(items[k]));
            Str *it = items[k].u.p;
            if ((k && sb_put(r, &b, s->s, s->len)) || sb_put(r, &b, it->s, it->len)) return add_pos(r, at);
        }
        if (!(x = sb_take(r, &b))) return add_pos(r, at);
        *out = v_ptr(V_STR, x);
        return 0;
    }
    case M_ISDIGIT:
    case M_ISALPHA:
    case M_ISALNUM:
    case M_ISSPACE:
    case M_ISUPPER:
    case M_ISLOWER: {
        if (jinja_bind(r, at, mname, "", a, slot, have, 4)) return -1;
        int ok = s->len > 0, cased = 0;
        for (size_t i = 0; i < s->len && ok;) {
            uint32_t c = u8_dec(s->s, &i);
            switch (m->id) {
            case M_ISDIGIT: ok = cp_digit(r, c); break;
            case M_ISALPHA: ok = cp_alpha(r, c); break;
            case M_ISALNUM: ok = cp_alpha(r, c) || cp_digit(r, c); break;
            case M_ISSPACE: ok = py_isspace(c); break;
            case M_ISUPPER:
                if (cp_cased(r, c)) cased = 1, ok = cp_upper(r, c) == c;
                break;
            default:
                if (cp_cased(r, c)) cased = 1, ok = cp_lower(r, c) == c;
            }
        }
        if (m->id == M_ISUPPER || m->id == M_ISLOWER) ok = ok && cased;
        *out = v_bool(ok);
        return 0;
    }
    case M_REMOVEPREFIX:
    case M_REMOVESUFFIX: {
        Str *p;
        if (jinja_bind(r, at, mname, "affix", a, slot, have, 4)) return -1;
        if (!have[0]) return rfail(r, at, "%s() takes exactly one argument", mname);
        if (want_str(r, at, slot[0], mname, &p)) return -1;
        int end = m->id == M_REMOVESUFFIX;
        if (p->len && str_affix(s, p, end)) {
            if (!(x = rstr(r, s->s + (end ? 0 : p->len), s->len - p->len))) return add_pos(r, at);
            *out = v_ptr(V_STR, x);
        } else {
            *out = self;
        }
        return 0;
    }
    case M_GET: {
        if (jinja_bind(r, at, mname, "key,default", a, slot, have, 4)) return -1;
        if (!have[0]) return rfail(r, at, "get expected at least 1 argument, got 0");
        long e = dict_find(r, self.u.p, slot[0]);
        if (e == -2) return add_pos(r, at);
        *out = e >= 0 ? ((Dict *)self.u.p)->v[e] : have[1] ? slot[1] : v_none();
        return 0;
    }
    case M_ITEMS:
    case M_KEYS:
    case M_VALUES: {
        if (jinja_bind(r, at, mname, "", a, slot, have, 4)) return -1;
        Dict *d = self.u.p;
        List *l = list_new(r, d->n, m->id == M_ITEMS ? LF_ITEMS : m->id == M_KEYS ? LF_KEYS : LF_VALUES);
        if (!l) return add_pos(r, at);
        for (size_t k = 0; k < d->n; k++) {
            if (m->id == M_ITEMS) {
                List *t = list_new(r, 2, LF_PLAIN);
                if (!t) return add_pos(r, at);
                t->v[0] = d->k[k];
                t->v[1] = d->v[k];
                l->v[k] = v_ptr(V_TUPLE, t);
            } else {
                l->v[k] = m->id == M_KEYS ? d->k[k] : d->v[k];
            }
        }
        *out = v_ptr(V_LIST, l);
        return 0;
    }
    case M_COPY:
        if (jinja_bind(r, at, mname, "", a, slot, have, 4)) return -1;
        *out = self; /* values are immutable here, so a copy is the same value */
        return 0;
    case M_LINDEX:
    case M_LCOUNT: {
        if (jinja_bind(r, at, mname, "value", a, slot, have, 4)) return -1;
        if (!have[0]) return rfail(r, at, "%s() takes exactly one argument", mname);
        List *l = self.u.p;
        int64_t c = 0;
        for (size_t k = 0; k < l->n; k++) {
            int e = val_eq(r, l->v[k], slot[0], 0);
            if (e < 0) return add_pos(r, at);
            if (e && m->id == M_LINDEX) {
                *out = v_int((int64_t)k);
                return 0;
            }
            c += e;
        }
        if (m->id == M_LINDEX) return rfail(r, at, "value is not in list");
        *out = v_int(c);
        return 0;
    }
    case M_CYCLE: {
        Loop *l = self.u.p;
        if (a->nkw) return rfail(r, at, "loop.cycle() takes no keyword arguments");
        if (a->npos == 0) return rfail(r, at, "no items for cycling given");
        *out = a->pos[l->i % (size_t)a->npos];
        return 0;
    }
    }
    return rfail(r, at, "unsupported method %s.%s()", type_name(self), mname);
}

/* Methods of a Markup string give Markup back (markupsafe wraps them); join escapes what it joins. */
int call_method(R *r, const Node *at, Method *m, const Args *a, Val *out) {
    if (!(m->self.kind == V_STR && m->self.markup)) return call_method_raw(r, at, m, a, out);
    if (m->id == M_JOIN && a->npos == 1 && !a->nkw) {
        Val *items;
        size_t n;
        Str *sep = m->self.u.p;
        SBuf b = {0};
        if (iterate(r, at, a->pos[0], &items, &n)) return -1;
        for (size_t k = 0; k < n; k++) {
            if (items[k].kind != V_STR)
                return rfail(r, at, "sequence item %zu: expected str instance, %s found", k, type_name(items[k]));
            Str *it = items[k].u.p;
            if ((k && sb_put(r, &b, sep->s, sep->len)) ||
                (items[k].markup ? sb_put(r, &b, it->s, it->len) : html_escape(r, it, &b)))
                return add_pos(r, at);
        }
        Str *x = sb_take(r, &b);
        if (!x) return add_pos(r, at);
        *out = v_markup(x, 1);
        return 0;
    }
    if (call_method_raw(r, at, m, a, out)) return -1;
    switch (m->id) {
    case M_STRIP: case M_LSTRIP: case M_RSTRIP: case M_UPPER: case M_LOWER: case M_TITLE: case M_CAPITALIZE:
    case M_REPLACE:
        out->markup = out->kind == V_STR;
        break;
    case M_SPLIT: case M_RSPLIT: case M_SPLITLINES: {
        List *l = out->u.p;
        for (size_t k = 0; k < l->n; k++) l->v[k].markup = 1;
        break;
    }
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Names, globals, macros */

enum { G_RANGE, G_DICT, G_NAMESPACE, G_RAISE, G_STRFTIME, G_LIPSUM, G_CYCLER, G_JOINER };
static const char *const global_names[] = {"range", "dict", "namespace", "raise_exception", "strftime_now",
                                           "lipsum", "cycler", "joiner"};

static Frame *frame_new(R *r, Frame *parent) {
    Frame *f = ralloc(r, sizeof *f);
    if (!f) return NULL;
    f->parent = parent;
    if (!(f->vars = dict_new(r))) return NULL;
    return f;
}

/* Gives a frame back once nothing can refer to it (no macro was defined in it). */
static void frame_free(R *r, Frame *f) {
    if (!f) return;
    ar_free(&r->ar, f->vars->ix);
    ar_free(&r->ar, f->vars->k);
    ar_free(&r->ar, f->vars->v);
    ar_free(&r->ar, f->vars);
    ar_free(&r->ar, f);
}

static void frame_clear(R *r, Frame *f) {
    ar_free(&r->ar, f->vars->ix);
    f->vars->ix = NULL;
    f->vars->ixcap = 0;
    f->vars->n = 0;
}

static int frame_set(R *r, Frame *f, Str *name, Val v) { return dict_set(r, f->vars, v_ptr(V_STR, name), v); }

static int lookup(R *r, const Str *name, Val *out) {
    for (Frame *f = r->frame; f; f = f->parent) {
        Val *x = dict_get_s(f->vars, name->s, name->len);
        if (x) {
            *out = *x;
            return 1;
        }
    }
    Val *x = dict_get_s(r->vars, name->s, name->len);
    if (x) {
        *out = *x;
        return 1;
    }
    for (size_t k = 0; k < ZY_ARRAY_LEN(global_names); k++)
        if (!strcmp(global_names[k], name->s)) {
            *out = (Val){.kind = V_FUNC, .u.i = (int64_t)k};
            return 1;
        }
    return 0;
}

/* dict(...) and namespace(...): an optional mapping or list of pairs, then keyword arguments */
static int build_dict(R *r, const Node *at, const Args *a, int is_ns, Val *out) {
    Dict *d = dict_new(r);
    if (!d) return add_pos(r, at);
    if (a->npos > 1) return rfail(r, at, "%s expected at most 1 argument, got %d", is_ns ? "namespace" : "dict", a->npos);
    if (a->npos == 1) {
        Val src = a->pos[0];
        if (src.kind == V_DICT || src.kind == V_NS) {
            Dict *s = src.u.p;
            for (size_t k = 0; k < s->n; k++)
                if (dict_set(r, d, s->k[k], s->v[k])) return add_pos(r, at);
        } else {
            Val *items;
            size_t n;
            if (iterate(r, at, src, &items, &n)) return -1;
            for (size_t k = 0; k < n; k++) {
                Val *pair;
                size_t pn;
                if (items[k].kind == V_DICT || iterate(r, at, items[k], &pair, &pn) || pn != 2)
                    return rfail(r, at, "dictionary update sequence element #%zu has the wrong length", k);
                if (dict_set(r, d, pair[0], pair[1])) return add_pos(r, at);
            }
        }
    }
    for (int k = 0; k < a->nkw; k++)
        if (dict_set(r, d, v_ptr(V_STR, a->kwn[k]), a->kwv[k])) return add_pos(r, at);
    if (is_ns)
        for (size_t k = 0; k < d->n; k++)
            if (d->k[k].kind == V_STR && ((Str *)d->k[k].u.p)->s[0] == '_')
                return rfail(r, at, "Chat templates cannot store underscore-prefixed attributes on a namespace, but got '%s'.",
                             ((Str *)d->k[k].u.p)->s);
    *out = v_ptr(is_ns ? V_NS : V_DICT, d);
    return 0;
}

static int call_global(R *r, const Node *at, int g, const Args *a, Val *out) {
    switch (g) {
    case G_RANGE: {
        int64_t v[3] = {0, 0, 1};
        if (a->nkw) return rfail(r, at, "range() takes no keyword arguments");
        if (a->npos < 1 || a->npos > 3) return rfail(r, at, "range expected 1 to 3 arguments, got %d", a->npos);
        for (int k = 0; k < a->npos; k++)
            if (want_int(r, at, a->pos[k], "range()", &v[a->npos == 1 ? 1 : k])) return -1;
        if (v[2] == 0) return rfail(r, at, "range() arg 3 must not be zero");
        int64_t cnt = 0;
        if (v[2] > 0 && v[1] > v[0]) cnt = (int64_t)(((uint64_t)v[1] - (uint64_t)v[0] - 1) / (uint64_t)v[2] + 1);
        if (v[2] < 0 && v[0] > v[1]) cnt = (int64_t)(((uint64_t)v[0] - (uint64_t)v[1] - 1) / (uint64_t)(-(v[2] + 1) + 1) + 1);
        if (cnt > MAX_RANGE)
            return rfail(r, at, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (%d).", MAX_RANGE);
        List *l = list_new(r, (size_t)cnt, LF_PLAIN);
        if (!l) return add_pos(r, at);
        for (int64_t k = 0; k < cnt; k++) l->v[k] = v_int(v[0] + k * v[2]);
        *out = v_ptr(V_LIST, l);
        return 0;
    }
    case G_DICT:
    case G_NAMESPACE: return build_dict(r, at, a, g == G_NAMESPACE, out);
    case G_RAISE: {
        if (a->npos != 1 || a->nkw) return rfail(r, at, "raise_exception() takes exactly one argument");
        Str *s = to_str(r, a->pos[0]);
        if (!s) return add_pos(r, at);
        return rfail(r, at, "raise_exception: %s", s->s);
    }
    case G_STRFTIME: {
        Str *fmt;
        if (a->npos != 1 || a->nkw) return rfail(r, at, "strftime_now() takes exactly one argument");
        if (want_str(r, at, a->pos[0], "strftime_now", &fmt)) return -1;
        struct tm tm;
        time_t t = r->have_now ? (time_t)r->now : time(NULL);
        if (!(r->have_now ? gmtime_r(&t, &tm) : localtime_r(&t, &tm))) return rfail(r, at, "strftime_now: no clock");
        size_t cap = fmt->len * 8 + 64;
        char *buf = ralloc(r, cap);
        if (!buf) return add_pos(r, at);
        size_t n = fmt->len ? strftime(buf, cap, fmt->s, &tm) : 0;
        if (n == 0 && fmt->len) return rfail(r, at, "strftime_now: the formatted date is too long");
        return ret_str(r, at, rstr(r, buf, n), out);
    }
    }
    return rfail(r, at, "unsupported global function '%s'", global_names[g]);
}

static int exec_body(R *r, Node *const *kids, int n);
#define X_BREAK 1
#define X_CONTINUE 2

/* Runs body with output captured into a string. */
static int capture(R *r, const Node *at, Node *const *kids, int n, Str **out) {
    SBuf *saved = r->out, buf = {0};
    r->out = &buf;
    int rc = exec_body(r, kids, n);
    r->out = saved;
    if (rc < 0) return -1;
    if (!(*out = sb_take(r, &buf))) return add_pos(r, at);
    return 0;
}

static int call_macro(R *r, const Node *at, Macro *m, const Args *a, Val *out) {
    const Node *def = m->def;
    int np = def->nnames - 1;
    const char *name = def->names[0]->s;
    if (a->npos > np && !(def->op & 1)) return rfail(r, at, "macro '%s' takes not more than %d argument(s)", name, np);
    Frame *f = frame_new(r, m->closure), *saved = r->frame;
    Dict *extra_kw = def->op & 2 ? dict_new(r) : NULL;
    List *extra_pos = def->op & 1 ? list_new(r, a->npos > np ? (size_t)(a->npos - np) : 0, LF_PLAIN) : NULL;
    if (!f || (def->op & 2 && !extra_kw) || (def->op & 1 && !extra_pos)) return add_pos(r, at);
    for (int k = np; k < a->npos; k++) extra_pos->v[k - np] = a->pos[k];
    for (int j = 0; j < a->nkw; j++) {
        int k;
        for (k = 0; k < np; k++)
            if (!strcmp(def->names[k + 1]->s, a->kwn[j]->s)) break;
        if (k == np) {
            if (!(def->op & 2)) return rfail(r, at, "macro '%s' takes no keyword argument '%s'", name, a->kwn[j]->s);
            if (dict_set(r, extra_kw, v_ptr(V_STR, a->kwn[j]), a->kwv[j])) return add_pos(r, at);
        } else if (k < a->npos) {
            return rfail(r, at, "macro '%s' got multiple values for argument '%s'", name, a->kwn[j]->s);
        }
    }
    if (def->op & 1) {
        Str *vn = rstrz(r, "varargs");
        if (!vn || frame_set(r, f, vn, v_ptr(V_TUPLE, extra_pos))) return add_pos(r, at);
    }
    if (def->op & 2) {
        Str *kn = rstrz(r, "kwargs");
        if (!kn || frame_set(r, f, kn, v_ptr(V_DICT, extra_kw))) return add_pos(r, at);
    }
    r->frame = f;
    for (int k = 0; k < np; k++) {
        Str *pname = def->names[k + 1];
        Val v;
        int found = k < a->npos;
        if (found) v = a->pos[k];
        for (int j = 0; j < a->nkw && !found; j++)
            if (!strcmp(pname->s, a->kwn[j]->s)) v = a->kwv[j], found = 1;
        if (!found) {
            if (def->kids2[k]) {
                if (ev(r, def->kids2[k], &v)) return r->frame = saved, -1;
            } else {
                v = mk_undef(r, "parameter '%s' was not provided", pname->s);
            }
        }
        if (frame_set(r, f, pname, v)) return r->frame = saved, add_pos(r, at);
    }
    Str *s;
    int rc = capture(r, at, def->kids, def->nkids, &s);
    r->frame = saved;
    if (rc) return -1;
    if (!(def->op & 4)) frame_free(r, f);
    *out = v_ptr(V_STR, s);
    return 0;
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Expressions */

static int ev_filter(R *r, const Node *e, const Val *block, Val *out) {
    Val in;
    if (e->id < 0)
        return rfail(r, e, e->id == -1 ? "No filter named '%s' found." : "unsupported filter '%s'", ((Str *)e->v.u.p)->s);
    if (!e->a)
        in = *block;
    else if (block && e->a->kind == E_FILTER) {
        if (ev_filter(r, e->a, block, &in)) return -1;
    } else if (ev(r, e->a, &in))
        return -1;
    Args a;
    if (ev_args(r, e, &a)) return -1;
    int rc = do_filter(r, e, e->id, in, &a, out);
    ar_free(&r->ar, a.pos);
    return rc;
}

static int ev_inner(R *r, const Node *e, Val *out) {
    Val a, b;
    switch (e->kind) {
    case E_CONST: *out = e->v; return 0;
    case E_NAME:
        if (!lookup(r, e->names[0], out)) *out = mk_undef(r, "'%.100s' is undefined", e->names[0]->s);
        return 0;
    case E_GETATTR:
        if (ev(r, e->a, &a)) return -1;
        return get_attr(r, e, a, e->names[0], out);
    case E_GETITEM:
        if (ev(r, e->a, &a) || ev(r, e->b, &b)) return -1;
        return get_item(r, e, a, b, out);
    case E_SLICE: {
        Val bound[3];
        int given[3];
        if (ev(r, e->a, &a)) return -1;
        for (int k = 0; k < 3; k++) {
            given[k] = e->kids[k] != NULL;
            if (given[k] && ev(r, e->kids[k], &bound[k])) return -1;
        }
        return get_slice(r, e, a, bound, given, out);
    }
    case E_CALL: {
        Val f;
        Args args;
        if (ev(r, e->a, &f) || ev_args(r, e, &args)) return -1;
        int rc;
        switch (f.kind) {
        case V_FUNC: rc = call_global(r, e, (int)f.u.i, &args, out); break;
        case V_MACRO: rc = call_macro(r, e, f.u.p, &args, out); break;
        case V_METHOD: rc = call_method(r, e, f.u.p, &args, out); break;
        case V_UNDEF: return undef_fail(r, e, f);
        default: return rfail(r, e, "'%s' object is not callable", type_name(f));
        }
        ar_free(&r->ar, args.pos);
        return rc;
    }
    case E_FILTER: return ev_filter(r, e, NULL, out);
    case E_TEST: {
        Args args;
        int res;
        if (e->id < 0) return rfail(r, e, "No test named '%s' found.", ((Str *)e->v.u.p)->s);
        if (ev(r, e->a, &a) || ev_args(r, e, &args) || do_test(r, e, e->id, a, &args, &res)) return -1;
        ar_free(&r->ar, args.pos);
        *out = v_bool(res);
        return 0;
    }
    case E_NOT:
        if (ev(r, e->a, &a)) return -1;
        *out = v_bool(!truthy(a));
        return 0;
    case E_NEG:
    case E_POS:
        if (ev(r, e->a, &a)) return -1;
        if (a.kind == V_UNDEF) return undef_fail(r, e, a);
        if (a.kind == V_FLOAT) {
            *out = v_float(e->kind == E_NEG ? -a.u.f : a.u.f);
            return 0;
        }
        if (a.kind == V_INT || a.kind == V_BOOL) {
            if (e->kind == E_NEG && a.u.i == INT64_MIN) return rfail(r, e, "integer overflow");
            *out = v_int(e->kind == E_NEG ? -a.u.i : a.u.i);
            return 0;
        }
        return rfail(r, e, "bad operand type for unary %c: '%s'", e->kind == E_NEG ? '-' : '+', type_name(a));
    case E_BIN:
        if (ev(r, e->a, &a) || ev(r, e->b, &b)) return -1;
        return arith(r, e, e->op, a, b, out);
    case E_CONCAT: {
        SBuf s = {0};
        for (int k = 0; k < e->nkids; k++) {
            if (ev(r, e->kids[k], &a)) return -1;
            if (str_val(r, a, &s, 0)) return add_pos(r, e);
        }
        return ret_str(r, e, sb_take(r, &s), out);
    }
    case E_AND:
    case E_OR:
        if (ev(r, e->a, &a)) return -1;
        if (truthy(a) == (e->kind == E_OR)) {
            *out = a;
            return 0;
        }
        return ev(r, e->b, out);
    case E_CMP: {
        if (ev(r, e->a, &a)) return -1;
        for (int k = 0; k < e->nkids; k++) {
            int res;
            if (ev(r, e->kids[k], &b) || compare(r, e, e->ops[k], a, b, &res)) return -1;
            if (!res) {
                *out = v_bool(0);
                return 0;
            }
            a = b;
        }
        *out = v_bool(1);
        return 0;
    }
    case E_COND:
        if (ev(r, e->a, &a)) return -1;
        if (truthy(a)) return ev(r, e->b, out);
        if (e->c) return ev(r, e->c, out);
        *out = mk_undef(r, "the inline if-expression on line %d evaluated to false and no else section was defined.", e->line);
        return 0;
    case E_LIST:
    case E_TUPLE: {
        List *l = list_new(r, (size_t)e->nkids, LF_PLAIN);
        if (!l) return add_pos(r, e);
        for (int k = 0; k < e->nkids; k++)
            if (ev(r, e->kids[k], &l->v[k])) return -1;
        *out = v_ptr(e->kind == E_LIST ? V_LIST : V_TUPLE, l);
        return 0;
    }
    case E_DICT: {
        Dict *d = dict_new(r);
        if (!d) return add_pos(r, e);
        for (int k = 0; k < e->nkids; k++) {
            if (ev(r, e->kids[k], &a) || ev(r, e->kids2[k], &b)) return -1;
            if (dict_set(r, d, a, b)) return add_pos(r, e);
        }
        *out = v_ptr(V_DICT, d);
        return 0;
    }
    }
    return rfail(r, e, "internal error: unknown expression");
}

static int ev(R *r, const Node *e, Val *out) {
    if (++r->steps > r->max_steps)
        return rfail(r, e, "the template ran too long (more than %lld steps)", (long long)r->max_steps);
    if (++r->depth > MAX_EVAL_DEPTH) return rfail(r, e, "the template nests or recurses too deeply");
    int rc = ev_inner(r, e, out);
    r->depth--;
    if (rc < 0) add_pos(r, e);
    return rc;
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Statements */

static int assign(R *r, const Node *at, Frame *f, Str *const *names, int nnames, int unpack, Val v) {
    if (!unpack) return frame_set(r, f, names[0], v) ? add_pos(r, at) : 0;
    Val *items;
    size_t n;
    if (v.kind == V_UNDEF) return undef_fail(r, at, v);
    if (iterate(r, at, v, &items, &n)) return -1;
    if (n < (size_t)nnames) return rfail(r, at, "not enough values to unpack (expected %d, got %zu)", nnames, n);
    if (n > (size_t)nnames) return rfail(r, at, "too many values to unpack (expected %d)", nnames);
    for (int k = 0; k < nnames; k++)
        if (frame_set(r, f, names[k], items[k])) return add_pos(r, at);
    return 0;
}

static int exec_for(R *r, const Node *s) {
    Val it;
    Val *items;
    size_t n;
    if (ev(r, s->a, &it) || iterate(r, s->a, it, &items, &n)) return -1;
    Frame *outer = r->frame, *f = frame_new(r, outer);
    Loop *lp = ralloc(r, sizeof *lp);
    Str *loop_name = r->s_loop ? r->s_loop : (r->s_loop = rstrz(r, "loop"));
    if (!f || !lp || !loop_name) return add_pos(r, s);
    if (s->b) { /* {% for x in xs if cond %}: loop.* counts the kept items */
        Val *kept = ralloc(r, (n + 1) * sizeof *kept);
        size_t nk = 0;
        if (!kept) return add_pos(r, s);
        for (size_t i = 0; i < n; i++) {
            Val c;
            frame_clear(r, f);
            if (assign(r, s, f, s->names, s->nnames, s->op, items[i])) return -1;
            r->frame = f;
            int rc = ev(r, s->b, &c);
            r->frame = outer;
            if (rc) return -1;
            if (truthy(c)) kept[nk++] = items[i];
        }
        items = kept;
        n = nk;
    }
    lp->items = items;
    lp->n = n;
    if (n == 0) {
        frame_clear(r, f);
        r->frame = f;
        int rc = exec_body(r, s->kids2, s->nkids2);
        r->frame = outer;
        return rc < 0 ? -1 : 0;
    }
    for (size_t i = 0; i < n; i++) {
        lp->i = i;
        frame_clear(r, f);
        if (assign(r, s, f, s->names, s->nnames, s->op, items[i])) return -1;
        if (frame_set(r, f, loop_name, v_ptr(V_LOOP, lp))) return add_pos(r, s);
        r->frame = f;
        int rc = exec_body(r, s->kids, s->nkids);
        r->frame = outer;
        if (rc < 0) return -1;
        if (rc == X_BREAK) break;
    }
    /* what only this loop held goes back (the items themselves live on where they are referenced). A `loop` the
     * body kept stays valid: it forgets its items instead of pointing at freed memory. */
    if (s->b || it.kind == V_STR) {
        ar_free(&r->ar, items);
        lp->items = NULL;
    }
    if (!s->id) frame_free(r, f);
    return 0;
}

static int exec_inner(R *r, const Node *s) {
    Val v;
    switch (s->kind) {
    case S_TEXT: {
        Str *t = s->v.u.p;
        return sb_put(r, r->out, t->s, t->len) ? add_pos(r, s) : 0;
    }
    case S_OUT:
        if (ev(r, s->a, &v)) return -1;
        return str_val(r, v, r->out, 0) ? add_pos(r, s) : 0;
    case S_IF:
        if (ev(r, s->a, &v)) return -1;
        return truthy(v) ? exec_body(r, s->kids, s->nkids) : exec_body(r, s->kids2, s->nkids2);
    case S_FOR: return exec_for(r, s);
    case S_SET:
        if (ev(r, s->a, &v)) return -1;
        return assign(r, s, r->frame, s->names, s->nnames, s->op, v);
    case S_SETATTR: {
        Val ns;
        if (ev(r, s->a, &v)) return -1;
        if (!lookup(r, s->names[0], &ns) || ns.kind != V_NS)
            return rfail(r, s, "cannot assign attribute on non-namespace object");
        if (s->names[1]->s[0] == '_')
            return rfail(r, s, "Chat templates cannot store underscore-prefixed attributes on a namespace, but got '%s'.",
                         s->names[1]->s);
        return dict_set(r, ns.u.p, v_ptr(V_STR, s->names[1]), v) ? add_pos(r, s) : 0;
    }
    case S_SETBLOCK:
    case S_FILTERBLOCK: {
        Str *body;
        if (capture(r, s, s->kids, s->nkids, &body)) return -1;
        v = v_ptr(V_STR, body);
        if (s->b) {
            Val in = v;
            if (ev_filter(r, s->b, &in, &v)) return -1;
        }
        if (s->kind == S_SETBLOCK) return frame_set(r, r->frame, s->names[0], v) ? add_pos(r, s) : 0;
        return str_val(r, v, r->out, 0) ? add_pos(r, s) : 0;
    }
    case S_MACRO: {
        Macro *m = ralloc(r, sizeof *m);
        if (!m) return add_pos(r, s);
        m->def = s;
        m->closure = r->frame;
        m->name = s->names[0];
        return frame_set(r, r->frame, s->names[0], v_ptr(V_MACRO, m)) ? add_pos(r, s) : 0;
    }
    case S_WITH: {
        Frame *f = frame_new(r, r->frame), *outer = r->frame;
        if (!f) return add_pos(r, s);
        for (int k = 0; k < s->nnames; k++) {
            if (ev(r, s->kids2[k], &v)) return -1;
            if (frame_set(r, f, s->names[k], v)) return add_pos(r, s);
        }
        r->frame = f;
        int rc = exec_body(r, s->kids, s->nkids);
        r->frame = outer;
        return rc;
    }
    case S_BODY: return exec_body(r, s->kids, s->nkids);
    case S_BREAK: return X_BREAK;
    case S_CONTINUE: return X_CONTINUE;
    }
    return rfail(r, s, "internal error: unknown statement");
}

static int exec_stmt(R *r, const Node *s) {
    if (++r->steps > r->max_steps)
        return rfail(r, s, "the template ran too long (more than %lld steps)", (long long)r->max_steps);
    if (++r->depth > MAX_EVAL_DEPTH) return rfail(r, s, "the template nests or recurses too deeply");
    int rc = exec_inner(r, s);
    r->depth--;
    if (rc < 0) add_pos(r, s);
    return rc;
}

static int exec_body(R *r, Node *const *kids, int n) {
    for (int k = 0; k < n; k++) {
        int rc = exec_stmt(r, kids[k]);
        if (rc) return rc;
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Rendering */

int jinja_render_vars(const JinjaTemplate *t, R *r, Dict *vars, char **out, size_t *out_len) {
    SBuf o = {0};
    r->vars = vars;
    r->out = &o;
    if (!(r->frame = frame_new(r, NULL))) return -1;
    if (exec_body(r, t->root->kids, t->root->nkids) < 0) return -1;
    char *s = malloc(o.n + 1);
    if (!s) return zy_fail(r->err, "out of memory");
    if (o.n) memcpy(s, o.p, o.n);
    s[o.n] = '\0';
    *out = s;
    if (out_len) *out_len = o.n;
    return 0;
}

int jinja_render_json(const JinjaTemplate *t, const char *vars_json, size_t vars_len, const JinjaOpts *opts,
                      char **out, size_t *out_len, ZyErr *err) {
    R r;
    Val vars;
    *out = NULL;
    if (out_len) *out_len = 0;
    r_init(&r, opts, err);
    int rc = json_parse(&r, vars_json, vars_len, "template variables", &vars);
    if (!rc && vars.kind != V_DICT) rc = zy_fail(err, "template variables: a JSON object is required");
    if (!rc) rc = jinja_render_vars(t, &r, vars.u.p, out, out_len);
    r_free(&r);
    return rc;
}
