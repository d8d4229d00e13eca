/* jinja_value: the arena, UTF-8, Python's values (str() and repr(), hashing, equality and ordering, float repr),
 * json.dumps and json.loads, and the context a render or a JSON read runs in (see jinja_value.h). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "jinja/jinja_value.h"

#include <errno.h>
#include <locale.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja/jinja_internal.h"

/* ------------------------------------------------------------------------------------------------------------ */
/* Arena: every block is linked so a render frees all of it at once, whatever path it ends on. */

void ar_init(Arena *a, size_t limit) {
    a->head.prev = a->head.next = &a->head;
    a->used = 0;
    a->limit = limit;
    a->over = 0;
}

void *ar_alloc(Arena *a, size_t n) {
    if (n > a->limit - a->used) {
        a->over = 1;
        return NULL;
    }
    ArBlk *b = malloc(sizeof *b + n);
    if (!b) {
        a->over = 0;
        return NULL;
    }
    b->size = n;
    b->next = a->head.next;
    b->prev = &a->head;
    a->head.next->prev = b;
    a->head.next = b;
    a->used += n;
    return b + 1;
}

void *ar_zalloc(Arena *a, size_t n) {
    void *p = ar_alloc(a, n);
    if (p) memset(p, 0, n);
    return p;
}

void *ar_realloc(Arena *a, void *p, size_t n) {
    if (!p) return ar_alloc(a, n);
    ArBlk *b = (ArBlk *)p - 1;
    if (n > b->size && n - b->size > a->limit - a->used) {
        a->over = 1;
        return NULL;
    }
    ArBlk *prev = b->prev, *next = b->next;
    size_t old = b->size;
    ArBlk *nb = realloc(b, sizeof *nb + n);
    if (!nb) {
        a->over = 0;
        return NULL;
    }
    prev->next = nb;
    next->prev = nb;
    a->used = a->used - old + n;
    nb->size = n;
    return nb + 1;
}

void ar_free(Arena *a, void *p) {
    if (!p) return;
    ArBlk *b = (ArBlk *)p - 1;
    b->prev->next = b->next;
    b->next->prev = b->prev;
    a->used -= b->size;
    free(b);
}

void ar_destroy(Arena *a) {
    ArBlk *b = a->head.next;
    while (b != &a->head) {
        ArBlk *n = b->next;
        free(b);
        b = n;
    }
    a->head.prev = a->head.next = &a->head;
    a->used = 0;
}

/* ------------------------------------------------------------------------------------------------------------ */
/* UTF-8. Every string inside the engine is valid UTF-8: inputs are checked where they enter. */

int u8_valid(const char *s, size_t n, size_t *bad) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        unsigned c = p[i];
        size_t k;
        uint32_t cp, min;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xE0) == 0xC0) {
            k = 1, cp = c & 0x1F, min = 0x80;
        } else if ((c & 0xF0) == 0xE0) {
            k = 2, cp = c & 0x0F, min = 0x800;
        } else if ((c & 0xF8) == 0xF0) {
            k = 3, cp = c & 0x07, min = 0x10000;
        } else {
            goto fail;
        }
        if (n - i <= k) goto fail;
        for (size_t j = 1; j <= k; j++) {
            if ((p[i + j] & 0xC0) != 0x80) goto fail;
            cp = cp << 6 | (p[i + j] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) goto fail;
        i += k + 1;
    }
    return 1;
fail:
    if (bad) *bad = i;
    return 0;
}

/* Decodes the (valid) character at s[*i] and advances *i. */
uint32_t u8_dec(const char *s, size_t *i) {
    const unsigned char *p = (const unsigned char *)s + *i;
    if (p[0] < 0x80) {
        *i += 1;
        return p[0];
    }
    if (p[0] < 0xE0) {
        *i += 2;
        return (uint32_t)(p[0] & 0x1F) << 6 | (p[1] & 0x3F);
    }
    if (p[0] < 0xF0) {
        *i += 3;
        return (uint32_t)(p[0] & 0x0F) << 12 | (uint32_t)(p[1] & 0x3F) << 6 | (p[2] & 0x3F);
    }
    *i += 4;
    return (uint32_t)(p[0] & 0x07) << 18 | (uint32_t)(p[1] & 0x3F) << 12 | (uint32_t)(p[2] & 0x3F) << 6 | (p[3] & 0x3F);
}

size_t u8_enc(uint32_t c, char *o) {
    if (c < 0x80) {
        o[0] = (char)c;
        return 1;
    }
    if (c < 0x800) {
        o[0] = (char)(0xC0 | c >> 6);
        o[1] = (char)(0x80 | (c & 0x3F));
        return 2;
    }
    if (c < 0x10000) {
        o[0] = (char)(0xE0 | c >> 12);
        o[1] = (char)(0x80 | (c >> 6 & 0x3F));
        o[2] = (char)(0x80 | (c & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | c >> 18);
    o[1] = (char)(0x80 | (c >> 12 & 0x3F));
    o[2] = (char)(0x80 | (c >> 6 & 0x3F));
    o[3] = (char)(0x80 | (c & 0x3F));
    return 4;
}

size_t u8_count(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

/* Python's str.isspace() (and the regex \s of str patterns). */
int py_isspace(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* Python's str.isprintable() for one character, without the unassigned code points. */
static int py_isprintable(uint32_t c) {
    if (c < 0x20 || (c >= 0x7F && c <= 0xA0) || c == 0xAD) return 0;
    if (c < 0x300) return 1;
    if (py_isspace(c) || (c >= 0xD800 && c <= 0xDFFF) || (c >= 0xE000 && c <= 0xF8FF) || c >= 0xF0000) return 0;
    if ((c >= 0x600 && c <= 0x605) || c == 0x61C || c == 0x6DD || c == 0x70F || c == 0x180E || c == 0x8E2 ||
        (c >= 0x200B && c <= 0x200F) || (c >= 0x202A && c <= 0x202E) || (c >= 0x2060 && c <= 0x2064) ||
        (c >= 0x2066 && c <= 0x206F) || c == 0xFEFF || (c >= 0xFFF9 && c <= 0xFFFB) || c == 0x110BD ||
        c == 0x110CD || (c >= 0x1D173 && c <= 0x1D17A) || c == 0xE0001 || (c >= 0xE0020 && c <= 0xE007F) ||
        (c & 0xFFFE) == 0xFFFE)
        return 0;
    return 1;
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Values */

int oom(R *r) {
    if (r->ar.over)
        zy_fail(r->err, "the template needs more than %zu MiB of memory", r->ar.limit >> 20);
    else
        zy_fail(r->err, "out of memory");
    r->need_pos = 1;
    return -1;
}

void *ralloc(R *r, size_t n) {
    void *p = ar_alloc(&r->ar, n);
    if (!p) oom(r);
    return p;
}

/* The step budget also pays for bulk work inside one step (elements compared or copied, bytes built), so that no
 * single expression can spin for long within the limit. */
int charge(R *r, size_t units) {
    r->steps += (int64_t)(units > (size_t)INT64_MAX / 2 ? INT64_MAX / 2 : units);
    if (r->steps <= r->max_steps) return 0;
    zy_fail(r->err, "the template ran too long (more than %lld steps)", (long long)r->max_steps);
    r->need_pos = 1;
    return -1;
}

Str *str_new(Arena *a, const char *s, size_t n) {
    if (n > SIZE_MAX / 2) return NULL;
    Str *x = ar_alloc(a, sizeof *x + n + 1);
    if (!x) return NULL;
    x->len = n;
    x->ncp = u8_count(s, n);
    if (n) memcpy(x->s, s, n);
    x->s[n] = '\0';
    return x;
}

Str *rstr(R *r, const char *s, size_t n) {
    Str *x = str_new(&r->ar, s, n);
    if (!x) oom(r);
    return x;
}

Str *rstrz(R *r, const char *s) { return rstr(r, s, strlen(s)); }

List *list_new(R *r, size_t n, int kind_flavor) {
    if (n > (SIZE_MAX - sizeof(List)) / sizeof(Val)) {
        oom(r);
        return NULL;
    }
    if (charge(r, n / 8)) return NULL;
    List *l = ralloc(r, sizeof *l + n * sizeof(Val));
    if (!l) return NULL;
    l->n = n;
    l->pos = 0;
    l->flavor = kind_flavor;
    return l;
}

/* String buffers (arena memory): the output, captured blocks, built strings. */
int sb_reserve(R *r, SBuf *b, size_t extra) {
    if (extra > r->max_output || b->n > r->max_output - extra) {
        zy_fail(r->err, "the rendered text would exceed %zu bytes", r->max_output);
        r->need_pos = 1;
        return -1;
    }
    if (charge(r, extra / 64)) return -1;
    if (b->n + extra + 1 <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->n + extra + 1) cap = cap > SIZE_MAX / 2 ? b->n + extra + 1 : cap * 2;
    char *p = ar_realloc(&r->ar, b->p, cap);
    if (!p) return oom(r);
    b->p = p;
    b->cap = cap;
    return 0;
}

int sb_put(R *r, SBuf *b, const char *s, size_t n) {
    if (sb_reserve(r, b, n)) return -1;
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
    return 0;
}

int sb_puts(R *r, SBuf *b, const char *s) { return sb_put(r, b, s, strlen(s)); }
int sb_putc(R *r, SBuf *b, char c) { return sb_put(r, b, &c, 1); }

int sb_cp(R *r, SBuf *b, uint32_t c) {
    char o[4];
    return sb_put(r, b, o, u8_enc(c, o));
}

static int sb_printf(R *r, SBuf *b, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int sb_printf(R *r, SBuf *b, const char *fmt, ...) {
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) n = 0;
    if ((size_t)n >= sizeof tmp) n = (int)sizeof tmp - 1;
    return sb_put(r, b, tmp, (size_t)n);
}

/* The buffer's text as a string; the buffer is released. */
Str *sb_take(R *r, SBuf *b) {
    Str *s = rstr(r, b->p ? b->p : "", b->n);
    ar_free(&r->ar, b->p);
    b->p = NULL;
    b->n = b->cap = 0;
    return s;
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Python's repr(float): the shortest digits that read back, fixed notation for exponents in [-4, 16). */

static void fmt_float(double x, char *out, size_t cap) {
    if (isnan(x)) {
        snprintf(out, cap, "nan");
        return;
    }
    if (isinf(x)) {
        snprintf(out, cap, x < 0 ? "-inf" : "inf");
        return;
    }
    if (x == 0) {
        snprintf(out, cap, signbit(x) ? "-0.0" : "0.0");
        return;
    }
    char tmp[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, x);
        if (strtod(tmp, NULL) == x) break;
    }
    /* tmp: [-]d[.ddd]e[+-]XX */
    char digits[24];
    int nd = 0, neg = tmp[0] == '-';
    const char *p = tmp + neg;
    for (; *p && *p != 'e'; p++)
        if (*p != '.') digits[nd++] = *p;
    digits[nd] = '\0';
    int e = atoi(p + 1);
    char *o = out;
    size_t left = cap;
#define PUT(...)                                           \
    do {                                                   \
        int w_ = snprintf(o, left, __VA_ARGS__);           \
        if (w_ < 0 || (size_t)w_ >= left) return;         \
        o += w_;                                           \
        left -= (size_t)w_;                                \
    } while (0)
    if (neg) PUT("-");
    if (e >= -4 && e < 16) {
        if (e >= 0) {
            for (int i = 0; i <= e; i++) PUT("%c", i < nd ? digits[i] : '0');
            PUT(".");
            if (nd > e + 1)
                PUT("%s", digits + e + 1);
            else
                PUT("0");
        } else {
            PUT("0.");
            for (int i = 0; i < -e - 1; i++) PUT("0");
            PUT("%s", digits);
        }
    } else {
        PUT("%c", digits[0]);
        if (nd > 1) PUT(".%s", digits + 1);
        PUT("e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
    }
#undef PUT
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Type names (Python's), truthiness */

const char *type_name(Val v) {
    switch (v.kind) {
    case V_UNDEF: return "Undefined";
    case V_NONE: return "NoneType";
    case V_BOOL: return "bool";
    case V_INT: return "int";
    case V_FLOAT: return "float";
    case V_STR: return "str";
    case V_LIST:
        switch (((List *)v.u.p)->flavor) {
        case LF_GEN: return "generator";
        case LF_KEYS: return "dict_keys";
        case LF_VALUES: return "dict_values";
        case LF_ITEMS: return "dict_items";
        }
        return "list";
    case V_TUPLE: return "tuple";
    case V_DICT: return "dict";
    case V_NS: return "Namespace";
    case V_MACRO: return "Macro";
    case V_FUNC: return "function";
    case V_METHOD: return "builtin_function_or_method";
    case V_LOOP: return "LoopContext";
    }
    return "object";
}

int truthy(Val v) {
    switch (v.kind) {
    case V_UNDEF:
    case V_NONE: return 0;
    case V_BOOL:
    case V_INT: return v.u.i != 0;
    case V_FLOAT: return v.u.f != 0;
    case V_STR: return ((Str *)v.u.p)->len != 0;
    case V_LIST: {
        List *l = v.u.p;
        return l->flavor == LF_GEN || l->n != 0;
    }
    case V_TUPLE: return ((List *)v.u.p)->n != 0;
    case V_DICT: return ((Dict *)v.u.p)->n != 0;
    }
    return 1;
}

/* Exact three-way comparison of two numbers (Python compares int and float exactly); 2 = unordered (NaN). */
int num_cmp(Val a, Val b) {
    if (a.kind != V_FLOAT && b.kind != V_FLOAT) return a.u.i < b.u.i ? -1 : a.u.i > b.u.i;
    if (a.kind == V_FLOAT && b.kind == V_FLOAT) {
        if (isnan(a.u.f) || isnan(b.u.f)) return 2;
        return a.u.f < b.u.f ? -1 : a.u.f > b.u.f;
    }
    int flip = a.kind == V_FLOAT;
    int64_t i = flip ? b.u.i : a.u.i;
    double f = flip ? a.u.f : b.u.f;
    int c; /* sign of i - f */
    if (isnan(f))
        return 2;
    else if (f >= 9223372036854775808.0)
        c = -1;
    else if (f < -9223372036854775808.0)
        c = 1;
    else {
        double fl = floor(f);
        int64_t fi = (int64_t)fl;
        if (i != fi)
            c = i < fi ? -1 : 1;
        else
            c = fl == f ? 0 : -1;
    }
    return flip ? -c : c;
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Dicts */

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    return x ^ (x >> 33);
}

/* Python hash: equal values (1, 1.0, True) hash alike; lists and dicts are unhashable (-1 and an error). */
static int val_hash(R *r, Val v, uint64_t *h, int depth) {
    switch (v.kind) {
    case V_UNDEF: *h = 0x5bd1e995u; return 0;
    case V_NONE: *h = 0x27d4eb2fu; return 0;
    case V_BOOL:
    case V_INT: *h = mix64((uint64_t)v.u.i); return 0;
    case V_FLOAT: {
        double f = v.u.f;
        if (f == floor(f) && f >= -9223372036854775808.0 && f < 9223372036854775808.0)
            *h = mix64((uint64_t)(int64_t)f);
        else {
            uint64_t bits;
            memcpy(&bits, &f, sizeof bits);
            *h = mix64(bits ^ 0x9e3779b97f4a7c15ULL);
        }
        return 0;
    }
    case V_STR: {
        Str *s = v.u.p;
        uint64_t x = 1469598103934665603ULL;
        for (size_t i = 0; i < s->len; i++) x = (x ^ (unsigned char)s->s[i]) * 1099511628211ULL;
        *h = mix64(x);
        return 0;
    }
    case V_TUPLE: {
        if (depth > MAX_VALUE_DEPTH) return zy_fail(r->err, "a value is nested too deeply"), r->need_pos = 1, -1;
        List *l = v.u.p;
        uint64_t x = 0x345678;
        for (size_t i = 0; i < l->n; i++) {
            uint64_t e;
            if (val_hash(r, l->v[i], &e, depth + 1)) return -1;
            x = mix64(x ^ e) + i;
        }
        *h = x;
        return 0;
    }
    case V_LIST:
    case V_DICT:
        zy_fail(r->err, "unhashable type: '%s'", type_name(v));
        r->need_pos = 1;
        return -1;
    }
    *h = mix64((uint64_t)(uintptr_t)v.u.p);
    return 0;
}

Dict *dict_new(R *r) {
    Dict *d = ralloc(r, sizeof *d);
    if (d) memset(d, 0, sizeof *d);
    return d;
}

static int dict_reindex(R *r, Dict *d, size_t cap) {
    uint32_t *ix = ar_zalloc(&r->ar, cap * sizeof *ix);
    if (!ix) return oom(r);
    for (size_t e = 0; e < d->n; e++) {
        uint64_t h;
        if (val_hash(r, d->k[e], &h, 0)) return -1;
        size_t s = (size_t)h & (cap - 1);
        while (ix[s]) s = (s + 1) & (cap - 1);
        ix[s] = (uint32_t)(e + 1);
    }
    ar_free(&r->ar, d->ix);
    d->ix = ix;
    d->ixcap = cap;
    return 0;
}

/* Index of key in d, or -1 (not found), or -2 (error: unhashable). */
long dict_find(R *r, const Dict *d, Val key) {
    if (!d->ix) {
        for (size_t e = 0; e < d->n; e++) {
            int eq = val_eq(r, d->k[e], key, 0);
            if (eq < 0) return -2;
            if (eq) return (long)e;
        }
        if (key.kind == V_LIST || key.kind == V_DICT) {
            uint64_t h;
            if (val_hash(r, key, &h, 0)) return -2;
        }
        return -1;
    }
    uint64_t h;
    if (val_hash(r, key, &h, 0)) return -2;
    for (size_t s = (size_t)h & (d->ixcap - 1);; s = (s + 1) & (d->ixcap - 1)) {
        if (!d->ix[s]) return -1;
        size_t e = d->ix[s] - 1;
        int eq = val_eq(r, d->k[e], key, 0);
        if (eq < 0) return -2;
        if (eq) return (long)e;
    }
}

int dict_set(R *r, Dict *d, Val key, Val val) {
    long e = dict_find(r, d, key);
    if (e == -2) return -1;
    if (e >= 0) {
        d->v[e] = val;
        return 0;
    }
    if (d->n >= UINT32_MAX - 1) return oom(r);
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 4;
        Val *k = ar_realloc(&r->ar, d->k, cap * sizeof *k);
        if (!k) return oom(r);
        d->k = k;
        Val *v = ar_realloc(&r->ar, d->v, cap * sizeof *v);
        if (!v) return oom(r);
        d->v = v;
        d->cap = cap;
    }
    d->k[d->n] = key;
    d->v[d->n] = val;
    d->n++;
    if (d->n > 8 && d->n * 2 > d->ixcap) {
        size_t cap = 16;
        while (cap < d->n * 2) cap *= 2;
        return dict_reindex(r, d, cap);
    }
    if (d->ix) {
        uint64_t h;
        if (val_hash(r, key, &h, 0)) return -1;
        size_t s = (size_t)h & (d->ixcap - 1);
        while (d->ix[s]) s = (s + 1) & (d->ixcap - 1);
        d->ix[s] = (uint32_t)d->n;
    }
    return 0;
}

/* Lookup by a C string key (names, fixed keys); NULL if absent. */
Val *dict_get_s(const Dict *d, const char *k, size_t n) {
    for (size_t e = 0; e < d->n; e++) {
        if (d->k[e].kind != V_STR) continue;
        Str *s = d->k[e].u.p;
        if (s->len == n && memcmp(s->s, k, n) == 0) return &d->v[e];
    }
    return NULL;
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Equality and ordering, Python's */

int val_eq(R *r, Val a, Val b, int depth) {
    if (++r->steps > r->max_steps && charge(r, 0)) return -1;
    if (depth > MAX_VALUE_DEPTH) {
        zy_fail(r->err, "a value is nested too deeply");
        r->need_pos = 1;
        return -1;
    }
    if (is_num(a) && is_num(b)) return num_cmp(a, b) == 0;
    if (a.kind != b.kind) return 0;
    switch (a.kind) {
    case V_UNDEF:
    case V_NONE: return 1;
    case V_STR: {
        Str *x = a.u.p, *y = b.u.p;
        return x == y || (x->len == y->len && memcmp(x->s, y->s, x->len) == 0);
    }
    case V_LIST:
    case V_TUPLE: {
        List *x = a.u.p, *y = b.u.p;
        if (x == y) return 1;
        if (x->flavor == LF_GEN || y->flavor == LF_GEN || x->n != y->n) return 0;
        if ((x->flavor == LF_PLAIN) != (y->flavor == LF_PLAIN)) return 0;
        for (size_t i = 0; i < x->n; i++) {
            int e = val_eq(r, x->v[i], y->v[i], depth + 1);
            if (e <= 0) return e;
        }
        return 1;
    }
    case V_DICT: {
        Dict *x = a.u.p, *y = b.u.p;
        if (x == y) return 1;
        if (x->n != y->n) return 0;
        for (size_t i = 0; i < x->n; i++) {
            long j = dict_find(r, y, x->k[i]);
            if (j == -2) return -1;
            if (j < 0) return 0;
            int e = val_eq(r, x->v[i], y->v[j], depth + 1);
            if (e <= 0) return e;
        }
        return 1;
    }
    case V_FUNC: return a.u.i == b.u.i;
    case V_METHOD: {
        Method *x = a.u.p, *y = b.u.p;
        return x == y || (x->id == y->id && x->self.kind == y->self.kind && x->self.u.p == y->self.u.p);
    }
    }
    return a.u.p == b.u.p;
}

/* Python's a < b: numbers, strings (code point order = UTF-8 byte order), lists and tuples lexicographically;
 * anything else is a TypeError. *lt receives the answer. */
int val_lt(R *r, Val a, Val b, int *lt, int depth) {
    if (++r->steps > r->max_steps && charge(r, 0)) return -1;
    if (depth > MAX_VALUE_DEPTH) {
        zy_fail(r->err, "a value is nested too deeply");
        r->need_pos = 1;
        return -1;
    }
    if (a.kind == V_UNDEF || b.kind == V_UNDEF) {
        Str *h = a.kind == V_UNDEF ? a.u.p : b.u.p;
        zy_fail(r->err, "%s", h ? h->s : "undefined value");
        r->need_pos = 1;
        return -1;
    }
    if (is_num(a) && is_num(b)) {
        *lt = num_cmp(a, b) == -1;
        return 0;
    }
    if (a.kind == V_STR && b.kind == V_STR) {
        Str *x = a.u.p, *y = b.u.p;
        size_t m = x->len < y->len ? x->len : y->len;
        int c = memcmp(x->s, y->s, m);
        *lt = c < 0 || (c == 0 && x->len < y->len);
        return 0;
    }
    if ((a.kind == V_LIST || a.kind == V_TUPLE) && a.kind == b.kind && ((List *)a.u.p)->flavor == LF_PLAIN &&
        ((List *)b.u.p)->flavor == LF_PLAIN) {
        List *x = a.u.p, *y = b.u.p;
        size_t m = x->n < y->n ? x->n : y->n;
        for (size_t i = 0; i < m; i++) {
            int e = val_eq(r, x->v[i], y->v[i], depth + 1);
            if (e < 0) return -1;
            if (!e) return val_lt(r, x->v[i], y->v[i], lt, depth + 1);
        }
        *lt = x->n < y->n;
        return 0;
    }
    zy_fail(r->err, "'<' not supported between instances of '%s' and '%s'", type_name(a), type_name(b));
    r->need_pos = 1;
    return -1;
}

/* ------------------------------------------------------------------------------------------------------------ */
/* str() and repr() */

static int repr_str(R *r, const Str *s, SBuf *b) {
    char q = '\'';
    if (memchr(s->s, '\'', s->len) && !memchr(s->s, '"', s->len)) q = '"';
    if (sb_reserve(r, b, s->len + 2)) return -1;
    if (sb_putc(r, b, q)) return -1;
    for (size_t i = 0; i < s->len;) {
        size_t at = i;
        uint32_t c = u8_dec(s->s, &i);
        int rc;
        if (c == (uint32_t)q || c == '\\')
            rc = sb_putc(r, b, '\\') || sb_putc(r, b, (char)c);
        else if (c == '\t')
            rc = sb_puts(r, b, "\\t");
        else if (c == '\n')
            rc = sb_puts(r, b, "\\n");
        else if (c == '\r')
            rc = sb_puts(r, b, "\\r");
        else if (!py_isprintable(c))
            rc = c < 0x100 ? sb_printf(r, b, "\\x%02x", c) : c < 0x10000 ? sb_printf(r, b, "\\u%04x", c)
                                                                          : sb_printf(r, b, "\\U%08x", c);
        else
            rc = sb_put(r, b, s->s + at, i - at);
        if (rc) return -1;
    }
    return sb_putc(r, b, q);
}

static int repr_seq(R *r, const Val *v, size_t n, SBuf *b, int depth) {
    for (size_t i = 0; i < n; i++) {
        if (i && sb_puts(r, b, ", ")) return -1;
        if (repr_val(r, v[i], b, depth + 1)) return -1;
    }
    return 0;
}

static int repr_dict(R *r, const Dict *d, SBuf *b, int depth) {
    if (sb_putc(r, b, '{')) return -1;
    for (size_t i = 0; i < d->n; i++) {
        if (i && sb_puts(r, b, ", ")) return -1;
        if (repr_val(r, d->k[i], b, depth + 1) || sb_puts(r, b, ": ") || repr_val(r, d->v[i], b, depth + 1)) return -1;
    }
    return sb_putc(r, b, '}');
}

/* Python's str(v) appended to b. */
int str_val(R *r, Val v, SBuf *b, int depth) {
    if (depth > MAX_VALUE_DEPTH) {
        zy_fail(r->err, "a value is nested too deeply");
        r->need_pos = 1;
        return -1;
    }
    switch (v.kind) {
    case V_UNDEF: return 0;
    case V_NONE: return sb_puts(r, b, "None");
    case V_BOOL: return sb_puts(r, b, v.u.i ? "True" : "False");
    case V_INT: return sb_printf(r, b, "%lld", (long long)v.u.i);
    case V_FLOAT: {
        char t[40];
        fmt_float(v.u.f, t, sizeof t);
        return sb_puts(r, b, t);
    }
    case V_STR: {
        Str *s = v.u.p;
        return sb_put(r, b, s->s, s->len);
    }
    case V_LIST: {
        List *l = v.u.p;
        static const char *const open[] = {"[", "", "dict_keys([", "dict_values([", "dict_items(["};
        if (l->flavor == LF_GEN) break;
        return sb_puts(r, b, open[l->flavor]) || repr_seq(r, l->v, l->n, b, depth) ||
               sb_puts(r, b, l->flavor == LF_PLAIN ? "]" : "])");
    }
    case V_TUPLE: {
        List *l = v.u.p;
        return sb_putc(r, b, '(') || repr_seq(r, l->v, l->n, b, depth) || sb_puts(r, b, l->n == 1 ? ",)" : ")");
    }
    case V_DICT: return repr_dict(r, v.u.p, b, depth);
    case V_NS: return sb_puts(r, b, "<Namespace ") || repr_dict(r, v.u.p, b, depth) || sb_putc(r, b, '>');
    case V_MACRO: return sb_puts(r, b, "<Macro ") || repr_str(r, ((Macro *)v.u.p)->name, b) || sb_putc(r, b, '>');
    }
    zy_fail(r->err, "cannot print a %s (Python would print its memory address)", type_name(v));
    r->need_pos = 1;
    return -1;
}

int repr_val(R *r, Val v, SBuf *b, int depth) {
    if (v.kind == V_STR && v.markup) return sb_puts(r, b, "Markup(") || repr_str(r, v.u.p, b) || sb_putc(r, b, ')');
    if (v.kind == V_STR) return repr_str(r, v.u.p, b);
    if (v.kind == V_UNDEF) return sb_puts(r, b, "Undefined");
    return str_val(r, v, b, depth);
}

/* str(v) as a string value (no copy for strings). */
Str *to_str(R *r, Val v) {
    if (v.kind == V_STR) return v.u.p;
    SBuf b = {0};
    if (str_val(r, v, &b, 0)) {
        ar_free(&r->ar, b.p);
        return NULL;
    }
    return sb_take(r, &b);
}

/* ------------------------------------------------------------------------------------------------------------ */
/* json.dumps (transformers' tojson: ensure_ascii=False by default; indent, separators, sort_keys) */

static int json_str(R *r, const char *s, size_t n, SBuf *b, int ascii) {
    if (sb_reserve(r, b, n + 2) || sb_putc(r, b, '"')) return -1;
    for (size_t i = 0; i < n;) {
        size_t at = i;
        uint32_t c = u8_dec(s, &i);
        int rc;
        switch (c) {
        case '"': rc = sb_puts(r, b, "\\\""); break;
        case '\\': rc = sb_puts(r, b, "\\\\"); break;
        case '\n': rc = sb_puts(r, b, "\\n"); break;
        case '\r': rc = sb_puts(r, b, "\\r"); break;
        case '\t': rc = sb_puts(r, b, "\\t"); break;
        case '\b': rc = sb_puts(r, b, "\\b"); break;
        case '\f': rc = sb_puts(r, b, "\\f"); break;
        default:
            if (c < 0x20 || (ascii && c >= 0x7F && c < 0x10000))
                rc = sb_printf(r, b, "\\u%04x", c);
            else if (ascii && c >= 0x10000)
                rc = sb_printf(r, b, "\\u%04x\\u%04x", 0xD800 + ((c - 0x10000) >> 10), 0xDC00 + ((c - 0x10000) & 0x3FF));
            else
                rc = sb_put(r, b, s + at, i - at);
        }
        if (rc) return -1;
    }
    return sb_putc(r, b, '"');
}

static int json_newline(R *r, SBuf *b, const JsonOpts *o, int level) {
    if (sb_putc(r, b, '\n')) return -1;
    for (int i = 0; i < level; i++)
        if (sb_put(r, b, o->indent->s, o->indent->len)) return -1;
    return 0;
}

static int json_float(R *r, double f, SBuf *b) {
    if (isnan(f)) return sb_puts(r, b, "NaN");
    if (isinf(f)) return sb_puts(r, b, f < 0 ? "-Infinity" : "Infinity");
    char t[40];
    fmt_float(f, t, sizeof t);
    return sb_puts(r, b, t);
}

int json_dump(R *r, Val v, SBuf *b, const JsonOpts *o, int level, int depth) {
    if (depth > MAX_VALUE_DEPTH) {
        zy_fail(r->err, "a value is nested too deeply for tojson");
        r->need_pos = 1;
        return -1;
    }
    switch (v.kind) {
    case V_NONE: return sb_puts(r, b, "null");
    case V_BOOL: return sb_puts(r, b, v.u.i ? "true" : "false");
    case V_INT: return sb_printf(r, b, "%lld", (long long)v.u.i);
    case V_FLOAT: return json_float(r, v.u.f, b);
    case V_STR: {
        Str *s = v.u.p;
        return json_str(r, s->s, s->len, b, o->ensure_ascii);
    }
    case V_LIST:
    case V_TUPLE: {
        List *l = v.u.p;
        if (l->flavor != LF_PLAIN) break;
        if (l->n == 0) return sb_puts(r, b, "[]");
        if (sb_putc(r, b, '[')) return -1;
        for (size_t i = 0; i < l->n; i++) {
            if (i && sb_put(r, b, o->item_sep->s, o->item_sep->len)) return -1;
            if (o->has_indent && json_newline(r, b, o, level + 1)) return -1;
            if (json_dump(r, l->v[i], b, o, level + 1, depth + 1)) return -1;
        }
        if (o->has_indent && json_newline(r, b, o, level)) return -1;
        return sb_putc(r, b, ']');
    }
    case V_DICT: {
        Dict *d = v.u.p;
        if (d->n == 0) return sb_puts(r, b, "{}");
        size_t *order = ralloc(r, d->n * sizeof *order);
        if (!order) return -1;
        for (size_t i = 0; i < d->n; i++) order[i] = i;
        if (o->sort_keys) { /* Python sorts the items, i.e. by key (keys are unique) */
            Val *idx = ralloc(r, d->n * sizeof *idx), *keys = ralloc(r, d->n * sizeof *keys);
            if (!idx || !keys) return -1;
            for (size_t i = 0; i < d->n; i++) idx[i] = v_int((int64_t)i), keys[i] = d->k[i];
            if (merge_sort(r, idx, keys, d->n, 0)) return -1;
            for (size_t i = 0; i < d->n; i++) order[i] = (size_t)idx[i].u.i;
        }
        if (sb_putc(r, b, '{')) return -1;
        for (size_t j = 0; j < d->n; j++) {
            size_t i = order[j];
            Val k = d->k[i];
            if (j && sb_put(r, b, o->item_sep->s, o->item_sep->len)) return -1;
            if (o->has_indent && json_newline(r, b, o, level + 1)) return -1;
            int rc;
            if (k.kind == V_STR) {
                Str *s = k.u.p;
                rc = json_str(r, s->s, s->len, b, o->ensure_ascii);
            } else if (k.kind == V_FLOAT) {
                SBuf t = {0};
                rc = json_float(r, k.u.f, &t) || json_str(r, t.p, t.n, b, 0);
                ar_free(&r->ar, t.p);
            } else if (k.kind == V_BOOL) {
                rc = sb_puts(r, b, k.u.i ? "\"true\"" : "\"false\"");
            } else if (k.kind == V_INT) {
                rc = sb_printf(r, b, "\"%lld\"", (long long)k.u.i);
            } else if (k.kind == V_NONE) {
                rc = sb_puts(r, b, "\"null\"");
            } else {
                zy_fail(r->err, "tojson: keys must be str, int, float, bool or None, not %s", type_name(k));
                r->need_pos = 1;
                return -1;
            }
            if (rc || sb_put(r, b, o->key_sep->s, o->key_sep->len) || json_dump(r, d->v[i], b, o, level + 1, depth + 1))
                return -1;
        }
        ar_free(&r->ar, order);
        if (o->has_indent && json_newline(r, b, o, level)) return -1;
        return sb_putc(r, b, '}');
    }
    }
    zy_fail(r->err, "tojson: Object of type %s is not JSON serializable", type_name(v));
    r->need_pos = 1;
    return -1;
}

/* ------------------------------------------------------------------------------------------------------------ */
/* JSON reader (Python's json.loads: ordered objects, last duplicate wins in the first one's place, NaN and
 * Infinity accepted, ints kept apart from floats). */

typedef struct {
    R *r;
    const char *s;
    size_t n, i;
    const char *label;
} JsonIn;

static int jfail(JsonIn *J, const char *what) {
    size_t line = 1, col = 1;
    for (size_t k = 0; k < J->i && k < J->n; k++) {
        if (J->s[k] == '\n')
            line++, col = 1;
        else if (((unsigned char)J->s[k] & 0xC0) != 0x80)
            col++;
    }
    zy_fail(J->r->err, "%s: invalid JSON at line %zu column %zu: %s", J->label, line, col, what);
    return -1;
}

static void jws(JsonIn *J) {
    while (J->i < J->n && (J->s[J->i] == ' ' || J->s[J->i] == '\t' || J->s[J->i] == '\n' || J->s[J->i] == '\r')) J->i++;
}

static int jhex4(JsonIn *J, uint32_t *out) {
    if (J->n - J->i < 4) return jfail(J, "truncated \\u escape");
    uint32_t v = 0;
    for (int k = 0; k < 4; k++) {
        char c = J->s[J->i + (size_t)k];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return jfail(J, "invalid \\u escape");
        v = v * 16 + (uint32_t)d;
    }
    J->i += 4;
    *out = v;
    return 0;
}

static int jstring(JsonIn *J, Str **out) {
    R *r = J->r;
    SBuf b = {0};
    J->i++; /* opening quote */
    for (;;) {
        size_t start = J->i;
        while (J->i < J->n && J->s[J->i] != '"' && J->s[J->i] != '\\' && (unsigned char)J->s[J->i] >= 0x20) J->i++;
        if (J->i > start && sb_put(r, &b, J->s + start, J->i - start)) return -1;
        if (J->i >= J->n) return jfail(J, "unterminated string");
        char c = J->s[J->i];
        if (c == '"') {
            J->i++;
            break;
        }
        if (c != '\\') return jfail(J, "control character in a string");
        J->i++;
        if (J->i >= J->n) return jfail(J, "unterminated string");
        c = J->s[J->i++];
        const char *rep = NULL;
        switch (c) {
        case '"': rep = "\""; break;
        case '\\': rep = "\\"; break;
        case '/': rep = "/"; break;
        case 'b': rep = "\b"; break;
        case 'f': rep = "\f"; break;
        case 'n': rep = "\n"; break;
        case 'r': rep = "\r"; break;
        case 't': rep = "\t"; break;
        case 'u': {
            uint32_t cp;
            if (jhex4(J, &cp)) return -1;
            if (cp >= 0xD800 && cp <= 0xDBFF && J->n - J->i >= 6 && J->s[J->i] == '\\' && J->s[J->i + 1] == 'u') {
                uint32_t lo;
                J->i += 2;
                if (jhex4(J, &lo)) return -1;
                if (lo >= 0xDC00 && lo <= 0xDFFF)
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                else
                    return jfail(J, "unpaired surrogate in a \\u escape");
            }
            if (cp >= 0xD800 && cp <= 0xDFFF) return jfail(J, "unpaired surrogate in a \\u escape");
            if (sb_cp(r, &b, cp)) return -1;
            continue;
        }
        default: return jfail(J, "invalid escape");
        }
        if (sb_puts(r, &b, rep)) return -1;
    }
    *out = sb_take(r, &b);
    return *out ? 0 : -1;
}

static int jvalue(JsonIn *J, Val *out, int depth) {
    R *r = J->r;
    if (depth > MAX_JSON_DEPTH) return jfail(J, "nested too deeply");
    jws(J);
    if (J->i >= J->n) return jfail(J, "expected a value");
    char c = J->s[J->i];
    if (c == '{') {
        Dict *d = dict_new(r);
        if (!d) return -1;
        J->i++;
        jws(J);
        if (J->i < J->n && J->s[J->i] == '}') {
            J->i++;
            *out = v_ptr(V_DICT, d);
            return 0;
        }
        for (;;) {
            jws(J);
            if (J->i >= J->n || J->s[J->i] != '"') return jfail(J, "expected a string key");
            Str *k;
            Val v;
            if (jstring(J, &k)) return -1;
            jws(J);
            if (J->i >= J->n || J->s[J->i] != ':') return jfail(J, "expected ':'");
            J->i++;
            if (jvalue(J, &v, depth + 1) || dict_set(r, d, v_ptr(V_STR, k), v)) return -1;
            jws(J);
            if (J->i < J->n && J->s[J->i] == ',') {
                J->i++;
                continue;
            }
            if (J->i < J->n && J->s[J->i] == '}') {
                J->i++;
                break;
            }
            return jfail(J, "expected ',' or '}'");
        }
        *out = v_ptr(V_DICT, d);
        return 0;
    }
    if (c == '[') {
        Val *items = NULL;
        size_t n = 0, cap = 0;
        J->i++;
        jws(J);
        if (J->i < J->n && J->s[J->i] == ']') {
            J->i++;
        } else {
            for (;;) {
                if (n == cap) {
                    cap = cap ? cap * 2 : 8;
                    Val *p = ar_realloc(&r->ar, items, cap * sizeof *p);
                    if (!p) return oom(r);
                    items = p;
                }
                if (jvalue(J, &items[n], depth + 1)) return -1;
                n++;
                jws(J);
                if (J->i < J->n && J->s[J->i] == ',') {
                    J->i++;
                    continue;
                }
                if (J->i < J->n && J->s[J->i] == ']') {
                    J->i++;
                    break;
                }
                return jfail(J, "expected ',' or ']'");
            }
        }
        List *l = list_new(r, n, LF_PLAIN);
        if (!l) return -1;
        if (n) memcpy(l->v, items, n * sizeof *items);
        ar_free(&r->ar, items);
        *out = v_ptr(V_LIST, l);
        return 0;
    }
    if (c == '"') {
        Str *s;
        if (jstring(J, &s)) return -1;
        *out = v_ptr(V_STR, s);
        return 0;
    }
    static const struct {
        const char *word;
        int kind;
        double f;
    } words[] = {{"true", V_BOOL, 1}, {"false", V_BOOL, 0}, {"null", V_NONE, 0},
                 {"NaN", V_FLOAT, NAN}, {"Infinity", V_FLOAT, INFINITY}, {"-Infinity", V_FLOAT, -INFINITY}};
    for (size_t w = 0; w < ZY_ARRAY_LEN(words); w++) {
        size_t len = strlen(words[w].word);
        if (J->n - J->i >= len && memcmp(J->s + J->i, words[w].word, len) == 0) {
            J->i += len;
            *out = words[w].kind == V_FLOAT ? v_float(words[w].f) : words[w].kind == V_BOOL ? v_bool(words[w].f != 0) : v_none();
            return 0;
        }
    }
    /* -?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)? */
    size_t st = J->i, p = J->i;
    int is_float = 0;
    if (p < J->n && J->s[p] == '-') p++;
    if (p < J->n && J->s[p] == '0')
        p++;
    else if (p < J->n && J->s[p] >= '1' && J->s[p] <= '9')
        while (p < J->n && J->s[p] >= '0' && J->s[p] <= '9') p++;
    else
        return jfail(J, "expected a value");
    if (p + 1 < J->n && J->s[p] == '.' && J->s[p + 1] >= '0' && J->s[p + 1] <= '9') {
        is_float = 1;
        p++;
        while (p < J->n && J->s[p] >= '0' && J->s[p] <= '9') p++;
    }
    if (p < J->n && (J->s[p] == 'e' || J->s[p] == 'E')) {
        size_t q = p + 1;
        if (q < J->n && (J->s[q] == '+' || J->s[q] == '-')) q++;
        if (q < J->n && J->s[q] >= '0' && J->s[q] <= '9') {
            is_float = 1;
            p = q;
            while (p < J->n && J->s[p] >= '0' && J->s[p] <= '9') p++;
        }
    }
    char tmp[64];
    size_t len = p - st;
    J->i = p;
    if (len >= sizeof tmp) { /* an integer this long is beyond 64 bits: read as a float, like the rest below */
        char *big = ralloc(r, len + 1);
        if (!big) return -1;
        memcpy(big, J->s + st, len);
        big[len] = '\0';
        *out = v_float(strtod(big, NULL));
        ar_free(&r->ar, big);
        return 0;
    }
    memcpy(tmp, J->s + st, len);
    tmp[len] = '\0';
    if (is_float) {
        *out = v_float(strtod(tmp, NULL));
        return 0;
    }
    errno = 0;
    long long v = strtoll(tmp, NULL, 10);
    /* Python's ints are unbounded; one beyond 64 bits (tokenizer_config.json's model_max_length = 1e30) is kept
     * as the nearest float */
    *out = errno == ERANGE ? v_float(strtod(tmp, NULL)) : v_int(v);
    return 0;
}

/* Reads one JSON document (valid UTF-8, nothing but white space after it). */
int json_parse(R *r, const char *s, size_t n, const char *label, Val *out) {
    size_t bad;
    if (!u8_valid(s, n, &bad)) return zy_fail(r->err, "%s: not valid UTF-8 (byte %zu)", label, bad);
    JsonIn J = {r, s, n, 0, label};
    if (n >= 3 && memcmp(s, "\xEF\xBB\xBF", 3) == 0) return jfail(&J, "unexpected UTF-8 BOM");
    if (jvalue(&J, out, 0)) return -1;
    jws(&J);
    if (J.i != n) return jfail(&J, "extra data after the value");
    return 0;
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Contexts */

void r_init(R *r, const JinjaOpts *o, ZyErr *err) {
    memset(r, 0, sizeof *r);
    ar_init(&r->ar, o && o->max_memory ? o->max_memory : DEFAULT_MAX_MEMORY);
    r->err = err;
    r->max_output = o && o->max_output ? o->max_output : DEFAULT_MAX_OUTPUT;
    r->max_steps = o && o->max_steps > 0 ? o->max_steps : DEFAULT_MAX_STEPS;
    r->have_now = o ? o->have_now : 0;
    r->now = o ? o->now : 0;
    r->loc = newlocale(LC_CTYPE_MASK, "C.UTF-8", (locale_t)0);
}

void r_free(R *r) {
    ar_destroy(&r->ar);
    if (r->loc) freelocale(r->loc);
}
