/* chat_template: a Jinja-subset template engine for Hugging Face chat templates (see chat_template.h).
 *
 * Layout: an arena that owns every value made while rendering (so error paths leak nothing and cyclic
 * namespaces cost nothing); Python-like values with str()/repr()/json.dumps; a JSON reader; the lexer (jinja2's
 * rules with trim_blocks and lstrip_blocks); a recursive-descent parser that follows jinja2's grammar; the
 * evaluator (scopes, filters, tests, methods, globals); the model-folder loader and the chat entry points.
 * Semantics are jinja2 3.1's as transformers configures it; where Python would print a memory address (a bound
 * method, a generator) rendering fails instead. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "tokenizer/chat_template.h"

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
#include <sys/stat.h>
#include <time.h>
#include <wctype.h>

#define MAX_PARSE_DEPTH 200   /* nested blocks + expressions while parsing */
#define MAX_EVAL_DEPTH 1000   /* nested evaluation (expressions, statements, macro calls) */
#define MAX_VALUE_DEPTH 500   /* nesting of values walked by repr / tojson / == / hash */
#define MAX_JSON_DEPTH 500    /* nesting of JSON input (Python's json gives up near 1000) */
#define MAX_CALL_ARGS 32
#define MAX_RANGE 100000      /* jinja2's sandbox refuses larger range() */
#define DEFAULT_MAX_OUTPUT ((size_t)64 << 20)
#define DEFAULT_MAX_MEMORY ((size_t)1 << 30)
#define DEFAULT_MAX_STEPS ((int64_t)100000000)

/* ------------------------------------------------------------------------------------------------------------ */
/* Arena: every block is linked so a render frees all of it at once, whatever path it ends on. */

typedef struct ArBlk {
    struct ArBlk *prev, *next;
    size_t size;
    size_t pad_; /* keeps the payload 16-byte aligned */
} ArBlk;

typedef struct {
    ArBlk head;
    size_t used, limit;
    int over; /* the last failure was the limit, not malloc */
} Arena;

static void ar_init(Arena *a, size_t limit) {
    a->head.prev = a->head.next = &a->head;
    a->used = 0;
    a->limit = limit;
    a->over = 0;
}

static void *ar_alloc(Arena *a, size_t n) {
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

static void *ar_zalloc(Arena *a, size_t n) {
    void *p = ar_alloc(a, n);
    if (p) memset(p, 0, n);
    return p;
}

static void *ar_realloc(Arena *a, void *p, size_t n) {
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

static void ar_free(Arena *a, void *p) {
    if (!p) return;
    ArBlk *b = (ArBlk *)p - 1;
    b->prev->next = b->next;
    b->next->prev = b->prev;
    a->used -= b->size;
    free(b);
}

static void ar_destroy(Arena *a) {
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

static int u8_valid(const char *s, size_t n, size_t *bad) {
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
static uint32_t u8_dec(const char *s, size_t *i) {
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

static size_t u8_enc(uint32_t c, char *o) {
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

static size_t u8_count(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

/* Python's str.isspace() (and the regex \s of str patterns). */
static int py_isspace(uint32_t c) {
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

typedef struct Node Node;
typedef struct Frame Frame;

enum { V_UNDEF, V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_LIST, V_TUPLE, V_DICT, V_NS, V_MACRO, V_FUNC, V_METHOD, V_LOOP };

typedef struct {
    int kind;
    int markup; /* a string marked safe (markupsafe.Markup): `Markup + str` HTML-escapes the str */
    union {
        int64_t i;
        double f;
        void *p;
    } u;
} Val;

typedef struct {
    size_t len, ncp; /* bytes, code points */
    char s[];        /* NUL-terminated */
} Str;

/* What Python type a list stands for: a list, a generator (single use, no len, always true), or a dict view. */
enum { LF_PLAIN, LF_GEN, LF_KEYS, LF_VALUES, LF_ITEMS };
typedef struct {
    size_t n, pos; /* pos: how far a generator has been consumed */
    int flavor;
    Val v[];
} List;

/* Insertion-ordered; a hash index once it holds more than a few keys. Only namespaces change after building. */
typedef struct {
    size_t n, cap, ixcap;
    Val *k, *v;
    uint32_t *ix; /* slot -> entry + 1, 0 = empty */
} Dict;

typedef struct {
    const Node *def;
    Frame *closure;
    Str *name;
} Macro;

typedef struct {
    Val self;
    int id;
} Method;

typedef struct {
    Val *items;
    size_t n, i;
} Loop;

struct Frame {
    Frame *parent;
    Dict *vars;
};

typedef struct {
    char *p;
    size_t n, cap;
} SBuf;

/* One render (or one JSON read): the arena, limits and the error. */
typedef struct {
    Arena ar;
    ZyErr *err;
    int need_pos;           /* the error still lacks a line:column */
    size_t max_output;
    int64_t steps, max_steps;
    int depth;
    int have_now;
    int64_t now;
    locale_t loc;           /* C.UTF-8 for case mapping; (locale_t)0 falls back to ASCII */
    SBuf *out;
    Frame *frame;
    Dict *vars;             /* the render's variables, below every frame */
    Str *ascii[128];        /* one-character strings, shared (iterating a string makes many) */
    Str *s_loop;
} R;

static Val v_none(void) { return (Val){.kind = V_NONE}; }
static Val v_bool(int b) { return (Val){.kind = V_BOOL, .u.i = b != 0}; }
static Val v_int(int64_t i) { return (Val){.kind = V_INT, .u.i = i}; }
static Val v_float(double f) { return (Val){.kind = V_FLOAT, .u.f = f}; }
static Val v_ptr(int kind, void *p) { return (Val){.kind = kind, .u.p = p}; }
static Val v_undef(Str *hint) { return (Val){.kind = V_UNDEF, .u.p = hint}; }
static Val v_markup(Str *s, int markup) { return (Val){.kind = V_STR, .markup = markup, .u.p = s}; }

static int oom(R *r) {
    if (r->ar.over)
        zy_fail(r->err, "the template needs more than %zu MiB of memory", r->ar.limit >> 20);
    else
        zy_fail(r->err, "out of memory");
    r->need_pos = 1;
    return -1;
}

static void *ralloc(R *r, size_t n) {
    void *p = ar_alloc(&r->ar, n);
    if (!p) oom(r);
    return p;
}

static int rfail(R *r, const Node *at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* The step budget also pays for bulk work inside one step (elements compared or copied, bytes built), so that no
 * single expression can spin for long within the limit. */
static int charge(R *r, size_t units) {
    r->steps += (int64_t)(units > (size_t)INT64_MAX / 2 ? INT64_MAX / 2 : units);
    if (r->steps <= r->max_steps) return 0;
    zy_fail(r->err, "the template ran too long (more than %lld steps)", (long long)r->max_steps);
    r->need_pos = 1;
    return -1;
}

static Str *str_new(Arena *a, const char *s, size_t n) {
    if (n > SIZE_MAX / 2) return NULL;
    Str *x = ar_alloc(a, sizeof *x + n + 1);
    if (!x) return NULL;
    x->len = n;
    x->ncp = u8_count(s, n);
    if (n) memcpy(x->s, s, n);
    x->s[n] = '\0';
    return x;
}

static Str *rstr(R *r, const char *s, size_t n) {
    Str *x = str_new(&r->ar, s, n);
    if (!x) oom(r);
    return x;
}

static Str *rstrz(R *r, const char *s) { return rstr(r, s, strlen(s)); }

static List *list_new(R *r, size_t n, int kind_flavor) {
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
static int sb_reserve(R *r, SBuf *b, size_t extra) {
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

static int sb_put(R *r, SBuf *b, const char *s, size_t n) {
    if (sb_reserve(r, b, n)) return -1;
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
    return 0;
}

static int sb_puts(R *r, SBuf *b, const char *s) { return sb_put(r, b, s, strlen(s)); }
static int sb_putc(R *r, SBuf *b, char c) { return sb_put(r, b, &c, 1); }

static int sb_cp(R *r, SBuf *b, uint32_t c) {
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
static Str *sb_take(R *r, SBuf *b) {
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

static const char *type_name(Val v) {
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

static int truthy(Val v) {
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

static int is_num(Val v) { return v.kind == V_BOOL || v.kind == V_INT || v.kind == V_FLOAT; }
static double num_f(Val v) { return v.kind == V_FLOAT ? v.u.f : (double)v.u.i; }

/* Exact three-way comparison of two numbers (Python compares int and float exactly); 2 = unordered (NaN). */
static int num_cmp(Val a, Val b) {
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

static int val_eq(R *r, Val a, Val b, int depth);

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

static Dict *dict_new(R *r) {
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
static long dict_find(R *r, const Dict *d, Val key) {
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

static int dict_set(R *r, Dict *d, Val key, Val val) {
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
static Val *dict_get_s(const Dict *d, const char *k, size_t n) {
    for (size_t e = 0; e < d->n; e++) {
        if (d->k[e].kind != V_STR) continue;
        Str *s = d->k[e].u.p;
        if (s->len == n && memcmp(s->s, k, n) == 0) return &d->v[e];
    }
    return NULL;
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Equality and ordering, Python's */

static int val_eq(R *r, Val a, Val b, int depth) {
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
static int val_lt(R *r, Val a, Val b, int *lt, int depth) {
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

static int repr_val(R *r, Val v, SBuf *b, int depth);

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
static int str_val(R *r, Val v, SBuf *b, int depth) {
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

static int repr_val(R *r, Val v, SBuf *b, int depth) {
    if (v.kind == V_STR && v.markup) return sb_puts(r, b, "Markup(") || repr_str(r, v.u.p, b) || sb_putc(r, b, ')');
    if (v.kind == V_STR) return repr_str(r, v.u.p, b);
    if (v.kind == V_UNDEF) return sb_puts(r, b, "Undefined");
    return str_val(r, v, b, depth);
}

/* str(v) as a string value (no copy for strings). */
static Str *to_str(R *r, Val v) {
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

typedef struct {
    int ensure_ascii, sort_keys, has_indent;
    Str *indent, *item_sep, *key_sep;
} JsonOpts;

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

static int merge_sort(R *r, Val *v, Val *keys, size_t n, int reverse);

static int json_dump(R *r, Val v, SBuf *b, const JsonOpts *o, int level, int depth) {
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
static int json_parse(R *r, const char *s, size_t n, const char *label, Val *out) {
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
/* Syntax tree */

enum {
    /* statements */
    S_TEXT, S_OUT, S_IF, S_FOR, S_SET, S_SETATTR, S_SETBLOCK, S_MACRO, S_FILTERBLOCK, S_WITH, S_BODY, S_BREAK,
    S_CONTINUE,
    /* expressions */
    E_CONST, E_NAME, E_GETATTR, E_GETITEM, E_SLICE, E_CALL, E_FILTER, E_TEST, E_NEG, E_POS, E_NOT, E_BIN, E_CONCAT,
    E_AND, E_OR, E_CMP, E_COND, E_LIST, E_TUPLE, E_DICT
};

enum { OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW };
enum { CMP_EQ, CMP_NE, CMP_LT, CMP_LE, CMP_GT, CMP_GE, CMP_IN, CMP_NOTIN };

/* One shape for every node; what each field holds depends on the kind (see the parser). */
struct Node {
    int kind, op, id, line, col;
    Node *a, *b, *c;
    Node **kids;  /* bodies, items, positional arguments */
    int nkids;
    Node **kids2; /* else bodies, keyword values, dict values, parameter defaults */
    int nkids2;
    Str **names;  /* targets, keyword names, macro name + parameters, attribute */
    int nnames;
    int *ops;     /* comparison operators */
    Val v;        /* constants */
};

struct ChatTemplate {
    Arena ar; /* the tree and its constants */
    Node *root;
};

/* ------------------------------------------------------------------------------------------------------------ */
/* Lexer: jinja2's, with trim_blocks (one newline after a block or comment tag goes) and lstrip_blocks (spaces and
 * tabs before a block or comment tag at the start of a line go), "-" and "+" whitespace control. */

enum { T_DATA, T_VBEGIN, T_VEND, T_BBEGIN, T_BEND, T_NAME, T_STR, T_INT, T_FLOAT, T_OP, T_EOF };
enum { /* operators; ( [ { and ) ] } pair up */
    O_ADD, O_SUB, O_DIV, O_FLOORDIV, O_MUL, O_POW, O_MOD, O_TILDE, O_LBRACKET, O_RBRACKET, O_LPAREN, O_RPAREN,
    O_LBRACE, O_RBRACE, O_EQ, O_NE, O_GT, O_GE, O_LT, O_LE, O_ASSIGN, O_DOT, O_COLON, O_PIPE, O_COMMA, O_SEMI
};

typedef struct {
    int type, op, line, col;
    Str *s; /* data, names, strings */
    int64_t i;
    double f;
} Tok;

typedef struct {
    const char *src;
    size_t len;
    size_t lc_pos; /* line/column cursor */
    int lc_line, lc_col;
    Tok *toks;
    size_t n, cap;
    Arena *ar;
    ZyErr *err;
} Lexer;

static void lc_at(Lexer *L, size_t pos, int *line, int *col) {
    if (pos < L->lc_pos) L->lc_pos = 0, L->lc_line = 1, L->lc_col = 1;
    for (; L->lc_pos < pos && L->lc_pos < L->len; L->lc_pos++) {
        unsigned char c = (unsigned char)L->src[L->lc_pos];
        if (c == '\n')
            L->lc_line++, L->lc_col = 1;
        else if ((c & 0xC0) != 0x80)
            L->lc_col++;
    }
    *line = L->lc_line;
    *col = L->lc_col;
}

static int lfail(Lexer *L, size_t pos, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int lfail(Lexer *L, size_t pos, const char *fmt, ...) {
    int line, col;
    lc_at(L, pos, &line, &col);
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return zy_fail(L->err, "chat template line %d:%d: %s", line, col, msg);
}

static Tok *lpush(Lexer *L, int type, size_t pos) {
    if (L->n == L->cap) {
        size_t cap = L->cap ? L->cap * 2 : 256;
        Tok *t = ar_realloc(L->ar, L->toks, cap * sizeof *t);
        if (!t) {
            zy_fail(L->err, "out of memory");
            return NULL;
        }
        L->toks = t;
        L->cap = cap;
    }
    Tok *t = &L->toks[L->n++];
    memset(t, 0, sizeof *t);
    t->type = type;
    lc_at(L, pos, &t->line, &t->col);
    return t;
}

static int ldata(Lexer *L, size_t pos, const char *s, size_t n) {
    if (n == 0) return 0;
    Tok *t = lpush(L, T_DATA, pos);
    if (!t || !(t->s = str_new(L->ar, s, n))) return zy_fail(L->err, "out of memory");
    return 0;
}

/* Python whitespace at s[i] (valid UTF-8); its byte length, or 0. */
static size_t ws_at(const char *s, size_t n, size_t i) {
    if (i >= n) return 0;
    size_t j = i;
    uint32_t c = u8_dec(s, &j);
    return py_isspace(c) ? j - i : 0;
}

static size_t skip_ws(const char *s, size_t n, size_t i) {
    size_t k;
    while ((k = ws_at(s, n, i)) != 0) i += k;
    return i;
}

/* Length of text without its trailing Python whitespace (str.rstrip()). */
static size_t rstrip_len(const char *s, size_t n) {
    while (n > 0) {
        size_t st = n - 1;
        while (st > 0 && ((unsigned char)s[st] & 0xC0) == 0x80) st--;
        size_t j = st;
        if (!py_isspace(u8_dec(s, &j))) break;
        n = st;
    }
    return n;
}

/* The data before a tag, with the tag's whitespace control applied. */
static int ldata_before(Lexer *L, size_t start, size_t end, char sign, int is_var, int line_starting) {
    const char *t = L->src + start;
    size_t n = end - start;
    if (sign == '-') {
        n = rstrip_len(t, n);
    } else if (sign != '+' && !is_var) {
        size_t l = n;
        while (l > 0 && t[l - 1] != '\n') l--;
        if ((l > 0 || line_starting) && l < n && skip_ws(t, n, l) == n) n = l;
    }
    return ldata(L, start, t, n);
}

static size_t scan_digits(const char *s, size_t n, size_t p) {
    if (p >= n || s[p] < '0' || s[p] > '9') return 0;
    while (p < n && s[p] >= '0' && s[p] <= '9') p++;
    while (p + 1 < n && s[p] == '_' && s[p + 1] >= '0' && s[p + 1] <= '9') {
        p++;
        while (p < n && s[p] >= '0' && s[p] <= '9') p++;
    }
    return p;
}

/* A number literal at p: 1 and *end if one is there. */
static int lnumber(Lexer *L, size_t p, size_t *end) {
    const char *s = L->src;
    size_t n = L->len, e1 = scan_digits(s, n, p);
    if (!e1) return 0;
    int is_float = 0;
    size_t stop = e1;
    if (p == 0 || s[p - 1] != '.') { /* float: not right after a '.' */
        size_t frac = (e1 < n && s[e1] == '.') ? scan_digits(s, n, e1 + 1) : 0;
        size_t after = frac ? frac : e1;
        size_t ex = 0;
        for (int attempt = 0; attempt < 2 && !ex; attempt++) {
            size_t q = attempt == 0 ? after : e1;
            if (attempt == 1 && !frac) break;
            if (q < n && (s[q] == 'e' || s[q] == 'E')) {
                size_t r = q + 1;
                if (r < n && (s[r] == '+' || s[r] == '-')) r++;
                ex = scan_digits(s, n, r);
            }
        }
        if (ex)
            is_float = 1, stop = ex;
        else if (frac)
            is_float = 1, stop = frac;
    }
    char buf[128];
    size_t k = 0;
    Tok *t;
    if (is_float) {
        for (size_t i = p; i < stop && k + 1 < sizeof buf; i++)
            if (s[i] != '_') buf[k++] = s[i];
        buf[k] = '\0';
        if (!(t = lpush(L, T_FLOAT, p))) return -1;
        t->f = strtod(buf, NULL);
        *end = stop;
        return 1;
    }
    /* integer: 0b / 0o / 0x, [1-9](_?\d)*, 0(_?0)* */
    int base = 10;
    size_t q = p;
    if (s[p] == '0' && p + 1 < n && strchr("bBoOxX", s[p + 1]) && s[p + 1]) {
        char c = (char)(s[p + 1] | 0x20);
        base = c == 'b' ? 2 : c == 'o' ? 8 : 16;
        q = p + 2;
        size_t r = q;
        for (;;) {
            size_t r2 = r < n && s[r] == '_' ? r + 1 : r;
            if (r2 >= n) break;
            char d = s[r2];
            int ok = base == 2 ? (d == '0' || d == '1') : base == 8 ? (d >= '0' && d <= '7') : isxdigit((unsigned char)d);
            if (!ok) break;
            r = r2 + 1;
        }
        if (r == q) base = 10; /* "0x" alone: the integer 0, then a name */
        else stop = r;
    }
    if (base == 10) {
        q = p;
        if (s[p] == '0') {
            stop = p + 1;
            while (stop < n && (s[stop] == '0' || (s[stop] == '_' && stop + 1 < n && s[stop + 1] == '0')))
                stop += s[stop] == '_' ? 2 : 1;
        } else {
            stop = p + 1;
            while (stop < n && ((s[stop] >= '0' && s[stop] <= '9') ||
                                (s[stop] == '_' && stop + 1 < n && s[stop + 1] >= '0' && s[stop + 1] <= '9')))
                stop += s[stop] == '_' ? 2 : 1;
        }
    }
    uint64_t v = 0;
    for (size_t i = q; i < stop; i++) {
        if (s[i] == '_') continue;
        int d = s[i] <= '9' ? s[i] - '0' : (s[i] | 0x20) - 'a' + 10;
        if (v > (UINT64_MAX - (uint64_t)d) / (uint64_t)base || v * (uint64_t)base + (uint64_t)d > (uint64_t)INT64_MAX)
            return lfail(L, p, "integer literal out of the 64-bit range");
        v = v * (uint64_t)base + (uint64_t)d;
    }
    if (!(t = lpush(L, T_INT, p))) return -1;
    t->i = (int64_t)v;
    *end = stop;
    return 1;
}

/* A string literal at p (quote at s[p]); decoded as Python's "unicode-escape" codec decodes jinja2's literals. */
static int lstring(Lexer *L, size_t p, size_t *end) {
    const char *s = L->src;
    char q = s[p];
    size_t i = p + 1;
    while (i < L->len && s[i] != q) i += s[i] == '\\' ? 2 : 1;
    if (i >= L->len) return lfail(L, p, "unexpected char %s (unterminated string)", q == '"' ? "'\"'" : "\"'\"");
    *end = i + 1;
    size_t stop = i;
    char *buf = ar_alloc(L->ar, (stop - p) * 4 + 16);
    if (!buf) return zy_fail(L->err, "out of memory");
    size_t k = 0;
    for (i = p + 1; i < stop;) {
        if (s[i] != '\\') {
            buf[k++] = s[i++];
            continue;
        }
        i++;
        char c = s[i];
        if ((unsigned char)c >= 0x80) { /* backslash + non-ASCII: Python keeps "\" and the escaped form "xe9" */
            size_t j = i;
            uint32_t cp = u8_dec(s, &j);
            k += (size_t)sprintf(buf + k, cp < 0x100 ? "\\x%02x" : cp < 0x10000 ? "\\u%04x" : "\\U%08x", cp);
            i = j;
            continue;
        }
        i++;
        uint32_t cp;
        int digits = 0;
        switch (c) {
        case '\n': continue;
        case '\\': buf[k++] = '\\'; continue;
        case '\'': buf[k++] = '\''; continue;
        case '"': buf[k++] = '"'; continue;
        case 'a': buf[k++] = '\a'; continue;
        case 'b': buf[k++] = '\b'; continue;
        case 'f': buf[k++] = '\f'; continue;
        case 'n': buf[k++] = '\n'; continue;
        case 'r': buf[k++] = '\r'; continue;
        case 't': buf[k++] = '\t'; continue;
        case 'v': buf[k++] = '\v'; continue;
        case 'x': digits = 2; break;
        case 'u': digits = 4; break;
        case 'U': digits = 8; break;
        case 'N': return lfail(L, p, "unsupported escape \\N{...} in a string literal");
        default:
            if (c >= '0' && c <= '7') {
                cp = (uint32_t)(c - '0');
                for (int m = 0; m < 2 && i < stop && s[i] >= '0' && s[i] <= '7'; m++) cp = cp * 8 + (uint32_t)(s[i++] - '0');
                k += u8_enc(cp, buf + k);
            } else { /* unknown escapes stay as written */
                buf[k++] = '\\';
                buf[k++] = c;
            }
            continue;
        }
        cp = 0;
        for (int m = 0; m < digits; m++, i++) {
            char d = i < stop ? s[i] : 0;
            int v = d >= '0' && d <= '9' ? d - '0' : (d | 0x20) >= 'a' && (d | 0x20) <= 'f' ? (d | 0x20) - 'a' + 10 : -1;
            if (v < 0) return lfail(L, p, "truncated \\%c escape in a string literal", c);
            cp = cp * 16 + (uint32_t)v;
        }
        if (cp > 0x10FFFF) return lfail(L, p, "illegal Unicode character in a string literal");
        if (cp >= 0xD800 && cp <= 0xDFFF) return lfail(L, p, "unsupported: a surrogate code point in a string literal");
        k += u8_enc(cp, buf + k);
    }
    Tok *t = lpush(L, T_STR, p);
    if (!t || !(t->s = str_new(L->ar, buf, k))) return zy_fail(L->err, "out of memory");
    ar_free(L->ar, buf);
    return 1;
}

/* The tokens of one {{ }} or {% %} tag from p (just after the opening delimiter and its sign). Returns the position
 * after the closing delimiter (with trim_blocks / "-" applied) or 0 on error; *nl: it ended on a newline. */
static size_t ltag(Lexer *L, size_t p, int is_var, size_t open_pos, int *nl) {
    const char *s = L->src;
    size_t n = L->len;
    char stack[MAX_PARSE_DEPTH];
    int depth = 0;
    for (;;) {
        if (p >= n) {
            lfail(L, open_pos, "unexpected end of template: the tag opened here is never closed");
            return 0;
        }
        if (depth == 0) {
            size_t e = 0;
            if (is_var) {
                if (n - p >= 3 && memcmp(s + p, "-}}", 3) == 0)
                    e = skip_ws(s, n, p + 3);
                else if (n - p >= 2 && memcmp(s + p, "}}", 2) == 0)
                    e = p + 2;
            } else {
                if (n - p >= 3 && memcmp(s + p, "+%}", 3) == 0)
                    e = p + 3;
                else if (n - p >= 3 && memcmp(s + p, "-%}", 3) == 0)
                    e = skip_ws(s, n, p + 3);
                else if (n - p >= 2 && memcmp(s + p, "%}", 2) == 0)
                    e = p + 2 + (p + 2 < n && s[p + 2] == '\n');
            }
            if (e) {
                if (!lpush(L, is_var ? T_VEND : T_BEND, p)) return 0;
                *nl = s[e - 1] == '\n';
                return e;
            }
        }
        size_t w = skip_ws(s, n, p);
        if (w > p) {
            p = w;
            continue;
        }
        unsigned char c = (unsigned char)s[p];
        size_t end = p;
        if (c >= '0' && c <= '9') {
            if (lnumber(L, p, &end) <= 0) return 0; /* a digit always starts a number */
            p = end;
            continue;
        }
        if (c == '_' || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z')) {
            size_t q = p;
            while (q < n && (s[q] == '_' || ((s[q] | 0x20) >= 'a' && (s[q] | 0x20) <= 'z') || (s[q] >= '0' && s[q] <= '9'))) q++;
            if (q < n && (unsigned char)s[q] >= 0x80) {
                lfail(L, p, "unsupported: a name with non-ASCII characters");
                return 0;
            }
            Tok *t = lpush(L, T_NAME, p);
            if (!t || !(t->s = str_new(L->ar, s + p, q - p))) {
                zy_fail(L->err, "out of memory");
                return 0;
            }
            p = q;
            continue;
        }
        if (c == '\'' || c == '"') {
            if (lstring(L, p, &end) != 1) return 0;
            p = end;
            continue;
        }
        static const struct {
            const char *text;
            int op;
        } ops[] = {{"//", O_FLOORDIV}, {"**", O_POW}, {"==", O_EQ}, {"!=", O_NE}, {">=", O_GE}, {"<=", O_LE},
                   {"+", O_ADD}, {"-", O_SUB}, {"/", O_DIV}, {"*", O_MUL}, {"%", O_MOD}, {"~", O_TILDE},
                   {"[", O_LBRACKET}, {"]", O_RBRACKET}, {"(", O_LPAREN}, {")", O_RPAREN}, {"{", O_LBRACE},
                   {"}", O_RBRACE}, {">", O_GT}, {"<", O_LT}, {"=", O_ASSIGN}, {".", O_DOT}, {":", O_COLON},
                   {"|", O_PIPE}, {",", O_COMMA}, {";", O_SEMI}};
        size_t k;
        for (k = 0; k < ZY_ARRAY_LEN(ops); k++) {
            size_t len = strlen(ops[k].text);
            if (n - p >= len && memcmp(s + p, ops[k].text, len) == 0) break;
        }
        if (k == ZY_ARRAY_LEN(ops)) {
            if (c >= 0x80) {
                size_t j = p;
                u8_dec(s, &j);
                lfail(L, p, "unexpected char '%.*s'", (int)(j - p), s + p);
            } else {
                lfail(L, p, "unexpected char '%c'", c);
            }
            return 0;
        }
        int op = ops[k].op;
        if (op == O_LPAREN || op == O_LBRACKET || op == O_LBRACE) {
            if (depth == MAX_PARSE_DEPTH) {
                lfail(L, p, "brackets nested too deeply");
                return 0;
            }
            stack[depth++] = op == O_LPAREN ? ')' : op == O_LBRACKET ? ']' : '}';
        } else if (op == O_RPAREN || op == O_RBRACKET || op == O_RBRACE) {
            if (depth == 0) {
                lfail(L, p, "unexpected '%c'", c);
                return 0;
            }
            if (stack[--depth] != (char)c) {
                lfail(L, p, "unexpected '%c', expected '%c'", c, stack[depth]);
                return 0;
            }
        }
        Tok *t = lpush(L, T_OP, p);
        if (!t) return 0;
        t->op = op;
        p += strlen(ops[k].text);
    }
}

/* "{%" sign? \s* "raw" \s* ("-%}" \s* | "%}") at p; the end of that, or 0. */
static size_t lraw_begin(const char *s, size_t n, size_t p, const char *word) {
    size_t q = p + 2;
    if (q < n && (s[q] == '-' || s[q] == '+')) q++;
    q = skip_ws(s, n, q);
    size_t wl = strlen(word);
    if (n - q < wl || memcmp(s + q, word, wl) != 0) return 0;
    q = skip_ws(s, n, q + wl);
    return q;
}

static int lex(Lexer *L) {
    const char *s = L->src;
    size_t n = L->len, pos = 0;
    int line_starting = 1;
    while (pos < n) {
        size_t q = pos;
        const char *hit = NULL;
        for (; q + 1 < n; q++)
            if (s[q] == '{' && (s[q + 1] == '{' || s[q + 1] == '%' || s[q + 1] == '#')) {
                hit = s + q;
                break;
            }
        if (!hit) return ldata(L, pos, s + pos, n - pos);
        char kind = s[q + 1];
        char sign = q + 2 < n && (s[q + 2] == '-' || s[q + 2] == '+') ? s[q + 2] : 0;
        size_t after = q + 2 + (sign != 0);
        if (kind == '%') { /* {% raw %}: the text up to {% endraw %} is data */
            size_t r = lraw_begin(s, n, q, "raw");
            size_t rend = 0;
            if (r && n - r >= 3 && memcmp(s + r, "-%}", 3) == 0)
                rend = skip_ws(s, n, r + 3);
            else if (r && n - r >= 2 && memcmp(s + r, "%}", 2) == 0)
                rend = r + 2;
            if (rend) {
                if (ldata_before(L, pos, q, sign, 0, line_starting)) return -1;
                int raw_ls = s[rend - 1] == '\n';
                size_t e = rend, tag_end = 0, tag_at = 0;
                char esign = 0;
                for (; e + 1 < n; e++) {
                    if (s[e] != '{' || s[e + 1] != '%') continue;
                    size_t t = lraw_begin(s, n, e, "endraw");
                    if (!t) continue;
                    if (n - t >= 3 && (memcmp(s + t, "+%}", 3) == 0)) tag_end = t + 3;
                    else if (n - t >= 3 && memcmp(s + t, "-%}", 3) == 0) tag_end = skip_ws(s, n, t + 3);
                    else if (n - t >= 2 && memcmp(s + t, "%}", 2) == 0) tag_end = t + 2 + (t + 2 < n && s[t + 2] == '\n');
                    if (tag_end) {
                        tag_at = e;
                        esign = e + 2 < n && (s[e + 2] == '-' || s[e + 2] == '+') ? s[e + 2] : 0;
                        break;
                    }
                }
                if (!tag_end) return lfail(L, q, "missing end of raw directive");
                if (ldata_before(L, rend, tag_at, esign, 0, raw_ls)) return -1;
                line_starting = s[tag_end - 1] == '\n';
                pos = tag_end;
                continue;
            }
        }
        if (ldata_before(L, pos, q, sign, kind == '{', line_starting)) return -1;
        line_starting = 0;
        if (kind == '#') {
            size_t e = after, end = 0;
            for (; e + 1 < n; e++) {
                if (s[e] == '+' && e + 2 < n && s[e + 1] == '#' && s[e + 2] == '}') {
                    end = e + 3;
                    break;
                }
                if (s[e] == '-' && e + 2 < n && s[e + 1] == '#' && s[e + 2] == '}') {
                    end = skip_ws(s, n, e + 3);
                    break;
                }
                if (s[e] == '#' && s[e + 1] == '}') {
                    end = e + 2 + (e + 2 < n && s[e + 2] == '\n');
                    break;
                }
            }
            if (!end) return lfail(L, q, "missing end of comment tag");
            line_starting = s[end - 1] == '\n';
            pos = end;
            continue;
        }
        if (!lpush(L, kind == '{' ? T_VBEGIN : T_BBEGIN, q)) return -1;
        int nl = 0;
        size_t e = ltag(L, after, kind == '{', q, &nl);
        if (!e) return -1;
        line_starting = nl;
        pos = e;
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Parser: jinja2.parser.Parser's grammar, statement by statement. */

typedef struct {
    Tok *t;
    size_t n, i;
    Arena *ar;
    ZyErr *err;
    int depth, loops;
    Tok *stmt; /* the statement whose body is being parsed, for "never closed" messages */
} Parser;

/* Filters, tests and methods are looked up by name once, at parse time (jinja2 too refuses an unknown filter when
 * it compiles). */
enum {
    F_ABS, F_ATTR, F_BATCH, F_CAPITALIZE, F_DEFAULT, F_DICTSORT, F_ESCAPE, F_FIRST, F_FLOAT, F_INDENT, F_INT, F_ITEMS,
    F_JOIN, F_LAST, F_LENGTH, F_LIST, F_LOWER, F_MAP, F_MAX, F_MIN, F_REJECT, F_REJECTATTR, F_REPLACE, F_REVERSE,
    F_ROUND, F_SAFE, F_SELECT, F_SELECTATTR, F_SORT, F_STRING, F_SUM, F_TITLE, F_TOJSON, F_TRIM, F_UNIQUE, F_UPPER,
    F_WORDCOUNT
};
/* params: the names of the positional parameters after the value; NULL: variadic (bound by the filter) */
static const struct {
    const char *name;
    int id;
    const char *params;
} filter_table[] = {
    {"abs", F_ABS, ""}, {"attr", F_ATTR, "name"}, {"batch", F_BATCH, "linecount,fill_with"},
    {"capitalize", F_CAPITALIZE, ""}, {"count", F_LENGTH, ""}, {"d", F_DEFAULT, "default_value,boolean"},
    {"default", F_DEFAULT, "default_value,boolean"}, {"dictsort", F_DICTSORT, "case_sensitive,by,reverse"},
    {"e", F_ESCAPE, ""}, {"escape", F_ESCAPE, ""}, {"first", F_FIRST, ""}, {"float", F_FLOAT, "default"},
    {"indent", F_INDENT, "width,first,blank"}, {"int", F_INT, "default,base"}, {"items", F_ITEMS, ""},
    {"join", F_JOIN, "d,attribute"}, {"last", F_LAST, ""}, {"length", F_LENGTH, ""}, {"list", F_LIST, ""},
    {"lower", F_LOWER, ""}, {"map", F_MAP, NULL}, {"max", F_MAX, "case_sensitive,attribute"},
    {"min", F_MIN, "case_sensitive,attribute"}, {"reject", F_REJECT, NULL}, {"rejectattr", F_REJECTATTR, NULL},
    {"replace", F_REPLACE, "old,new,count"}, {"reverse", F_REVERSE, ""}, {"round", F_ROUND, "precision,method"},
    {"safe", F_SAFE, ""}, {"select", F_SELECT, NULL}, {"selectattr", F_SELECTATTR, NULL},
    {"sort", F_SORT, "reverse,case_sensitive,attribute"}, {"string", F_STRING, ""}, {"sum", F_SUM, "attribute,start"},
    {"title", F_TITLE, ""}, {"tojson", F_TOJSON, "ensure_ascii,indent,separators,sort_keys"},
    {"trim", F_TRIM, "chars"}, {"unique", F_UNIQUE, "case_sensitive,attribute"}, {"upper", F_UPPER, ""},
    {"wordcount", F_WORDCOUNT, ""},
};
/* jinja2 filters this engine lacks: a template using one fails to parse with a clear message */
static const char *const filters_unsupported[] = {"center", "filesizeformat", "forceescape", "format", "groupby",
                                                  "pprint", "random", "slice", "striptags", "truncate",
                                                  "urlencode", "urlize", "wordwrap", "xmlattr"};

enum {
    T_DEFINED, T_UNDEFINED, T_NONE, T_BOOLEAN, T_FALSE, T_TRUE, T_INTEGER, T_FLOATT, T_NUMBER, T_STRING, T_MAPPING,
    T_ITERABLE, T_SEQUENCE, T_CALLABLE, T_SAMEAS, T_EQ, T_NE, T_LT, T_LE, T_GT, T_GE, T_IN, T_ODD, T_EVEN,
    T_DIVISIBLEBY, T_LOWER, T_UPPER, T_FILTER, T_TEST, T_ESCAPED
};
static const struct {
    const char *name;
    int id, nargs;
} test_table[] = {
    {"defined", T_DEFINED, 0}, {"undefined", T_UNDEFINED, 0}, {"none", T_NONE, 0}, {"boolean", T_BOOLEAN, 0},
    {"false", T_FALSE, 0}, {"true", T_TRUE, 0}, {"integer", T_INTEGER, 0}, {"float", T_FLOATT, 0},
    {"number", T_NUMBER, 0}, {"string", T_STRING, 0}, {"mapping", T_MAPPING, 0}, {"iterable", T_ITERABLE, 0},
    {"sequence", T_SEQUENCE, 0}, {"callable", T_CALLABLE, 0}, {"sameas", T_SAMEAS, 1}, {"eq", T_EQ, 1},
    {"equalto", T_EQ, 1}, {"==", T_EQ, 1}, {"ne", T_NE, 1}, {"!=", T_NE, 1}, {"lt", T_LT, 1}, {"lessthan", T_LT, 1},
    {"<", T_LT, 1}, {"le", T_LE, 1}, {"<=", T_LE, 1}, {"gt", T_GT, 1}, {"greaterthan", T_GT, 1}, {">", T_GT, 1},
    {"ge", T_GE, 1}, {">=", T_GE, 1}, {"in", T_IN, 1}, {"odd", T_ODD, 0}, {"even", T_EVEN, 0},
    {"divisibleby", T_DIVISIBLEBY, 1}, {"lower", T_LOWER, 0}, {"upper", T_UPPER, 0}, {"filter", T_FILTER, 0},
    {"test", T_TEST, 0}, {"escaped", T_ESCAPED, 0},
};

static int filter_lookup(const char *name) {
    for (size_t k = 0; k < ZY_ARRAY_LEN(filter_table); k++)
        if (strcmp(filter_table[k].name, name) == 0) return (int)k;
    return -1;
}

static int test_lookup(const char *name) {
    for (size_t k = 0; k < ZY_ARRAY_LEN(test_table); k++)
        if (strcmp(test_table[k].name, name) == 0) return (int)k;
    return -1;
}

static Tok *cur(Parser *P) { return &P->t[P->i]; }
static Tok *peek(Parser *P, size_t k) { return &P->t[P->i + k < P->n ? P->i + k : P->n - 1]; }

static int is_name(const Tok *t, const char *name) { return t->type == T_NAME && strcmp(t->s->s, name) == 0; }
static int is_op(const Tok *t, int op) { return t->type == T_OP && t->op == op; }

static const char *tok_desc(const Tok *t, char *buf, size_t cap) {
    static const char *const opnames[] = {"+", "-", "/", "//", "*", "**", "%", "~", "[", "]", "(", ")", "{", "}",
                                          "==", "!=", ">", ">=", "<", "<=", "=", ".", ":", "|", ",", ";"};
    switch (t->type) {
    case T_DATA: return "template data";
    case T_VBEGIN: return "begin of print statement";
    case T_VEND: return "end of print statement";
    case T_BBEGIN: return "begin of statement block";
    case T_BEND: return "end of statement block";
    case T_NAME: snprintf(buf, cap, "'%.60s'", t->s->s); return buf;
    case T_STR: return "string";
    case T_INT: return "integer";
    case T_FLOAT: return "float";
    case T_OP: snprintf(buf, cap, "'%s'", opnames[t->op]); return buf;
    }
    return "end of template";
}

static int pfail(Parser *P, const Tok *t, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int pfail(Parser *P, const Tok *t, const char *fmt, ...) {
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return zy_fail(P->err, "chat template line %d:%d: %s", t->line, t->col, msg);
}

static int unexpected(Parser *P, const char *expected) {
    char b[96];
    return pfail(P, cur(P), "expected %s, got %s", expected, tok_desc(cur(P), b, sizeof b));
}

static Node *nnew(Parser *P, int kind, const Tok *at) {
    Node *n = ar_zalloc(P->ar, sizeof *n);
    if (!n) {
        zy_fail(P->err, "out of memory");
        return NULL;
    }
    n->kind = kind;
    n->line = at->line;
    n->col = at->col;
    return n;
}

/* Growable arrays of children and names, in the template's arena. */
static int push_node(Parser *P, Node ***arr, int *n, Node *x) {
    if ((*n & (*n - 1)) == 0) { /* grows at powers of two */
        size_t cap = *n ? (size_t)*n * 2 : 1;
        Node **a = ar_realloc(P->ar, *arr, cap * sizeof *a);
        if (!a) return zy_fail(P->err, "out of memory");
        *arr = a;
    }
    (*arr)[(*n)++] = x;
    return 0;
}

static int push_name(Parser *P, Str ***arr, int *n, Str *x) {
    if ((*n & (*n - 1)) == 0) {
        size_t cap = *n ? (size_t)*n * 2 : 1;
        Str **a = ar_realloc(P->ar, *arr, cap * sizeof *a);
        if (!a) return zy_fail(P->err, "out of memory");
        *arr = a;
    }
    (*arr)[(*n)++] = x;
    return 0;
}

static Node *p_expr(Parser *P, int with_condexpr);
static Node *p_tuple(Parser *P, int simplified, int with_condexpr, const char *extra_end, int explicit_parens);
static Node *p_unary(Parser *P, int with_filter);
static Node *p_primary(Parser *P);
static Node *p_postfix(Parser *P, Node *n);
static Node *p_filter_expr(Parser *P, Node *n);
static Node *p_filter(Parser *P, Node *n, int start_inline);

static int enter(Parser *P) {
    if (++P->depth > MAX_PARSE_DEPTH) {
        pfail(P, cur(P), "the template nests too deeply (more than %d levels)", MAX_PARSE_DEPTH);
        return -1;
    }
    return 0;
}

/* (args..., name=value...) */
static int p_call_args(Parser *P, Node *n) {
    Tok *open = cur(P);
    P->i++; /* ( */
    int need_comma = 0;
    while (!is_op(cur(P), O_RPAREN)) {
        if (need_comma) {
            if (!is_op(cur(P), O_COMMA)) return unexpected(P, "','");
            P->i++;
            if (is_op(cur(P), O_RPAREN)) break;
        }
        if (is_op(cur(P), O_MUL) || is_op(cur(P), O_POW))
            return pfail(P, cur(P), "unsupported: *args / **kwargs in a call");
        if (n->nkids + n->nnames >= MAX_CALL_ARGS) return pfail(P, open, "too many arguments in a call");
        if (cur(P)->type == T_NAME && is_op(peek(P, 1), O_ASSIGN)) {
            Str *name = cur(P)->s;
            P->i += 2;
            Node *v = p_expr(P, 1);
            if (!v || push_name(P, &n->names, &n->nnames, name) || push_node(P, &n->kids2, &n->nkids2, v)) return -1;
        } else {
            if (n->nnames) return pfail(P, open, "invalid syntax for function call expression");
            Node *v = p_expr(P, 1);
            if (!v || push_node(P, &n->kids, &n->nkids, v)) return -1;
        }
        need_comma = 1;
    }
    P->i++; /* ) */
    return 0;
}

/* A list or tuple of constants is built once, at parse time (values are immutable, so renders can share it). */
static Node *fold_const_seq(Parser *P, Node *n) {
    for (int k = 0; k < n->nkids; k++)
        if (n->kids[k]->kind != E_CONST) return n;
    List *l = ar_alloc(P->ar, sizeof *l + (size_t)n->nkids * sizeof(Val));
    if (!l) return zy_fail(P->err, "out of memory"), NULL;
    l->n = (size_t)n->nkids;
    l->pos = 0;
    l->flavor = LF_PLAIN;
    for (int k = 0; k < n->nkids; k++) l->v[k] = n->kids[k]->v;
    n->v = v_ptr(n->kind == E_LIST ? V_LIST : V_TUPLE, l);
    n->kind = E_CONST;
    return n;
}

static Node *p_list(Parser *P) {
    Node *n = nnew(P, E_LIST, cur(P));
    if (!n) return NULL;
    P->i++;
    while (!is_op(cur(P), O_RBRACKET)) {
        if (n->nkids) {
            if (!is_op(cur(P), O_COMMA)) return unexpected(P, "','"), NULL;
            P->i++;
        }
        if (is_op(cur(P), O_RBRACKET)) break;
        Node *x = p_expr(P, 1);
        if (!x || push_node(P, &n->kids, &n->nkids, x)) return NULL;
    }
    P->i++;
    return fold_const_seq(P, n);
}

static Node *p_dict(Parser *P) {
    Node *n = nnew(P, E_DICT, cur(P));
    if (!n) return NULL;
    P->i++;
    while (!is_op(cur(P), O_RBRACE)) {
        if (n->nkids) {
            if (!is_op(cur(P), O_COMMA)) return unexpected(P, "','"), NULL;
            P->i++;
        }
        if (is_op(cur(P), O_RBRACE)) break;
        Node *k = p_expr(P, 1);
        if (!k) return NULL;
        if (!is_op(cur(P), O_COLON)) return unexpected(P, "':'"), NULL;
        P->i++;
        Node *v = p_expr(P, 1);
        if (!v || push_node(P, &n->kids, &n->nkids, k) || push_node(P, &n->kids2, &n->nkids2, v)) return NULL;
    }
    P->i++;
    return n;
}

static Node *p_primary(Parser *P) {
    Tok *t = cur(P);
    Node *n;
    if (t->type == T_NAME) {
        const char *s = t->s->s;
        n = nnew(P, E_CONST, t);
        if (!n) return NULL;
        if (!strcmp(s, "true") || !strcmp(s, "True"))
            n->v = v_bool(1);
        else if (!strcmp(s, "false") || !strcmp(s, "False"))
            n->v = v_bool(0);
        else if (!strcmp(s, "none") || !strcmp(s, "None"))
            n->v = v_none();
        else {
            n->kind = E_NAME;
            if (push_name(P, &n->names, &n->nnames, t->s)) return NULL;
        }
        P->i++;
        return n;
    }
    if (t->type == T_STR) { /* adjacent literals concatenate */
        n = nnew(P, E_CONST, t);
        if (!n) return NULL;
        Str *s = t->s;
        P->i++;
        while (cur(P)->type == T_STR) {
            Str *b = cur(P)->s, *j = ar_alloc(P->ar, sizeof *j + s->len + b->len + 1);
            if (!j) return zy_fail(P->err, "out of memory"), NULL;
            j->len = s->len + b->len;
            j->ncp = s->ncp + b->ncp;
            memcpy(j->s, s->s, s->len);
            memcpy(j->s + s->len, b->s, b->len + 1);
            s = j;
            P->i++;
        }
        n->v = v_ptr(V_STR, s);
        return n;
    }
    if (t->type == T_INT || t->type == T_FLOAT) {
        n = nnew(P, E_CONST, t);
        if (!n) return NULL;
        n->v = t->type == T_INT ? v_int(t->i) : v_float(t->f);
        P->i++;
        return n;
    }
    if (is_op(t, O_LPAREN)) {
        P->i++;
        n = p_tuple(P, 0, 1, NULL, 1);
        if (!n) return NULL;
        if (!is_op(cur(P), O_RPAREN)) return unexpected(P, "')'"), NULL;
        P->i++;
        return n;
    }
    if (is_op(t, O_LBRACKET)) return p_list(P);
    if (is_op(t, O_LBRACE)) return p_dict(P);
    char b[96];
    pfail(P, t, "unexpected %s", tok_desc(t, b, sizeof b));
    return NULL;
}

/* [a], [a:b:c], .name, .0 */
static Node *p_subscript(Parser *P, Node *obj) {
    Tok *t = cur(P);
    P->i++;
    if (t->op == O_DOT) {
        Tok *a = cur(P);
        Node *n;
        if (a->type == T_NAME) {
            if (!(n = nnew(P, E_GETATTR, t)) || push_name(P, &n->names, &n->nnames, a->s)) return NULL;
        } else if (a->type == T_INT) {
            Node *k = nnew(P, E_CONST, a);
            if (!k || !(n = nnew(P, E_GETITEM, t))) return NULL;
            k->v = v_int(a->i);
            n->b = k;
        } else {
            pfail(P, a, "expected name or number");
            return NULL;
        }
        P->i++;
        n->a = obj;
        n->line = obj->line;
        n->col = obj->col;
        return n;
    }
    Node *idx[3] = {NULL, NULL, NULL};
    int is_slice = 0, nargs = 0;
    while (!is_op(cur(P), O_RBRACKET)) {
        if (nargs++) return pfail(P, cur(P), "unsupported: a tuple as an index"), NULL;
        if (!is_op(cur(P), O_COLON)) {
            if (!(idx[0] = p_expr(P, 1))) return NULL;
            if (!is_op(cur(P), O_COLON)) continue;
        }
        is_slice = 1;
        P->i++; /* : */
        if (!is_op(cur(P), O_COLON) && !is_op(cur(P), O_RBRACKET) && !is_op(cur(P), O_COMMA))
            if (!(idx[1] = p_expr(P, 1))) return NULL;
        if (is_op(cur(P), O_COLON)) {
            P->i++;
            if (!is_op(cur(P), O_RBRACKET) && !is_op(cur(P), O_COMMA))
                if (!(idx[2] = p_expr(P, 1))) return NULL;
        }
    }
    if (!nargs) return pfail(P, cur(P), "expected an index"), NULL;
    P->i++; /* ] */
    Node *n = nnew(P, is_slice ? E_SLICE : E_GETITEM, t);
    if (!n) return NULL;
    n->a = obj;
    n->line = obj->line; /* errors point at the start of the expression */
    n->col = obj->col;
    if (is_slice) {
        for (int k = 0; k < 3; k++)
            if (push_node(P, &n->kids, &n->nkids, idx[k])) return NULL;
    } else {
        n->b = idx[0];
    }
    return n;
}

static Node *p_call(Parser *P, Node *callee) {
    Node *n = nnew(P, E_CALL, cur(P));
    if (!n) return NULL;
    n->a = callee;
    n->line = callee->line;
    n->col = callee->col;
    return p_call_args(P, n) ? NULL : n;
}

static Node *p_postfix(Parser *P, Node *n) {
    while (n) {
        if (is_op(cur(P), O_DOT) || is_op(cur(P), O_LBRACKET))
            n = p_subscript(P, n);
        else if (is_op(cur(P), O_LPAREN))
            n = p_call(P, n);
        else
            break;
    }
    return n;
}

static Node *p_filter(Parser *P, Node *n, int start_inline) {
    while (is_op(cur(P), O_PIPE) || start_inline) {
        if (!start_inline) P->i++;
        start_inline = 0;
        Tok *t = cur(P);
        if (t->type != T_NAME) return unexpected(P, "a filter name"), NULL;
        if (is_op(peek(P, 1), O_DOT)) return pfail(P, t, "unsupported: a dotted filter name"), NULL;
        /* an unknown name is an error now unless it sits in an if (checked after parsing, as jinja2 does); a jinja2
         * filter this engine lacks fails only if it runs */
        int k = filter_lookup(t->s->s);
        if (k < 0) {
            k = -1;
            for (size_t u = 0; u < ZY_ARRAY_LEN(filters_unsupported); u++)
                if (!strcmp(filters_unsupported[u], t->s->s)) k = -2;
        }
        Node *f = nnew(P, E_FILTER, t);
        if (!f) return NULL;
        f->id = k;
        f->v = v_ptr(V_STR, t->s);
        f->a = n;
        P->i++;
        if (is_op(cur(P), O_LPAREN) && p_call_args(P, f)) return NULL;
        n = f;
    }
    return n;
}

static Node *p_test(Parser *P, Node *n) {
    Tok *is = cur(P);
    P->i++;
    int negated = 0;
    if (is_name(cur(P), "not")) {
        negated = 1;
        P->i++;
    }
    Tok *t = cur(P);
    if (t->type != T_NAME) return unexpected(P, "a test name"), NULL;
    if (is_op(peek(P, 1), O_DOT)) return pfail(P, t, "unsupported: a dotted test name"), NULL;
    Node *x = nnew(P, E_TEST, is);
    if (!x) return NULL;
    x->id = test_lookup(t->s->s);
    x->v = v_ptr(V_STR, t->s);
    x->a = n;
    P->i++;
    Tok *c = cur(P);
    if (is_op(c, O_LPAREN)) {
        if (p_call_args(P, x)) return NULL;
    } else if ((c->type == T_NAME || c->type == T_STR || c->type == T_INT || c->type == T_FLOAT || is_op(c, O_LPAREN) ||
                is_op(c, O_LBRACKET) || is_op(c, O_LBRACE)) &&
               !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and")) {
        /* one argument without parentheses: `x is divisibleby 3`, `x is sameas none` */
        if (is_name(c, "is")) return pfail(P, c, "you cannot chain multiple tests with is"), NULL;
        Node *arg = p_postfix(P, p_primary(P));
        if (!arg || push_node(P, &x->kids, &x->nkids, arg)) return NULL;
    }
    if (!negated) return x;
    Node *no = nnew(P, E_NOT, is);
    if (no) no->a = x;
    return no;
}

static Node *p_filter_expr(Parser *P, Node *n) {
    while (n) {
        if (is_op(cur(P), O_PIPE))
            n = p_filter(P, n, 0);
        else if (is_name(cur(P), "is"))
            n = p_test(P, n);
        else if (is_op(cur(P), O_LPAREN))
            n = p_call(P, n);
        else
            break;
    }
    return n;
}

static Node *p_unary(Parser *P, int with_filter) {
    if (enter(P)) return NULL;
    Tok *t = cur(P);
    Node *n;
    if (is_op(t, O_SUB) || is_op(t, O_ADD)) {
        P->i++;
        Node *x = p_unary(P, 0);
        if (!x || !(n = nnew(P, t->op == O_SUB ? E_NEG : E_POS, t))) return NULL;
        n->a = x;
    } else {
        n = p_primary(P);
    }
    n = p_postfix(P, n);
    if (with_filter) n = p_filter_expr(P, n);
    P->depth--;
    return n;
}

static Node *p_bin(Parser *P, int kind, int op, Node *a, Node *b, const Tok *at) {
    if (!a || !b) return NULL;
    Node *n = nnew(P, kind, at);
    if (!n) return NULL;
    n->op = op;
    n->a = a;
    n->b = b;
    return n;
}

static Node *p_pow(Parser *P) {
    Node *n = p_unary(P, 1);
    while (n && is_op(cur(P), O_POW)) {
        Tok *t = cur(P);
        P->i++;
        n = p_bin(P, E_BIN, OP_POW, n, p_unary(P, 1), t);
    }
    return n;
}

static Node *p_math2(Parser *P) {
    Node *n = p_pow(P);
    while (n && cur(P)->type == T_OP &&
           (cur(P)->op == O_MUL || cur(P)->op == O_DIV || cur(P)->op == O_FLOORDIV || cur(P)->op == O_MOD)) {
        Tok *t = cur(P);
        int op = t->op == O_MUL ? OP_MUL : t->op == O_DIV ? OP_DIV : t->op == O_FLOORDIV ? OP_FLOORDIV : OP_MOD;
        P->i++;
        n = p_bin(P, E_BIN, op, n, p_pow(P), t);
    }
    return n;
}

static Node *p_concat(Parser *P) {
    Tok *t = cur(P);
    Node *first = p_math2(P);
    if (!first || !is_op(cur(P), O_TILDE)) return first;
    Node *n = nnew(P, E_CONCAT, t);
    if (!n || push_node(P, &n->kids, &n->nkids, first)) return NULL;
    while (is_op(cur(P), O_TILDE)) {
        P->i++;
        Node *x = p_math2(P);
        if (!x || push_node(P, &n->kids, &n->nkids, x)) return NULL;
    }
    return n;
}

static Node *p_math1(Parser *P) {
    Node *n = p_concat(P);
    while (n && (is_op(cur(P), O_ADD) || is_op(cur(P), O_SUB))) {
        Tok *t = cur(P);
        P->i++;
        n = p_bin(P, E_BIN, t->op == O_ADD ? OP_ADD : OP_SUB, n, p_concat(P), t);
    }
    return n;
}

static Node *p_compare(Parser *P) {
    Tok *t0 = cur(P);
    Node *first = p_math1(P);
    if (!first) return NULL;
    Node *n = NULL;
    for (;;) {
        Tok *t = cur(P);
        int op;
        static const int cmp_of[] = {[O_EQ] = CMP_EQ + 1, [O_NE] = CMP_NE + 1, [O_LT] = CMP_LT + 1,
                                     [O_LE] = CMP_LE + 1, [O_GT] = CMP_GT + 1, [O_GE] = CMP_GE + 1};
        if (t->type == T_OP && t->op < (int)ZY_ARRAY_LEN(cmp_of) && cmp_of[t->op]) {
            op = cmp_of[t->op] - 1;
            P->i++;
        } else if (is_name(t, "in")) {
            op = CMP_IN;
            P->i++;
        } else if (is_name(t, "not") && is_name(peek(P, 1), "in")) {
            op = CMP_NOTIN;
            P->i += 2;
        } else {
            break;
        }
        Node *x = p_math1(P);
        if (!x) return NULL;
        if (!n) {
            if (!(n = nnew(P, E_CMP, t0))) return NULL;
            n->a = first;
        }
        if (push_node(P, &n->kids, &n->nkids, x)) return NULL;
        int *ops = ar_realloc(P->ar, n->ops, (size_t)n->nkids * sizeof *ops);
        if (!ops) return zy_fail(P->err, "out of memory"), NULL;
        n->ops = ops;
        ops[n->nkids - 1] = op;
    }
    return n ? n : first;
}

static Node *p_not(Parser *P) {
    if (is_name(cur(P), "not")) {
        Tok *t = cur(P);
        if (enter(P)) return NULL;
        P->i++;
        Node *x = p_not(P), *n;
        P->depth--;
        if (!x || !(n = nnew(P, E_NOT, t))) return NULL;
        n->a = x;
        return n;
    }
    return p_compare(P);
}

static Node *p_and(Parser *P) {
    Node *n = p_not(P);
    while (n && is_name(cur(P), "and")) {
        Tok *t = cur(P);
        P->i++;
        n = p_bin(P, E_AND, 0, n, p_not(P), t);
    }
    return n;
}

static Node *p_or(Parser *P) {
    Node *n = p_and(P);
    while (n && is_name(cur(P), "or")) {
        Tok *t = cur(P);
        P->i++;
        n = p_bin(P, E_OR, 0, n, p_and(P), t);
    }
    return n;
}

static Node *p_condexpr(Parser *P) {
    Tok *t0 = cur(P);
    Node *n = p_or(P);
    while (n && is_name(cur(P), "if")) {
        P->i++;
        if (enter(P)) return NULL;
        Node *cond = p_or(P), *other = NULL;
        if (!cond) return NULL;
        if (is_name(cur(P), "else")) {
            P->i++;
            if (!(other = p_condexpr(P))) return NULL;
        }
        P->depth--;
        Node *c = nnew(P, E_COND, t0);
        if (!c) return NULL;
        c->a = cond;
        c->b = n;
        c->c = other;
        n = c;
    }
    return n;
}

static Node *p_expr(Parser *P, int with_condexpr) {
    if (enter(P)) return NULL;
    Node *n = with_condexpr ? p_condexpr(P) : p_or(P);
    P->depth--;
    return n;
}

static int tuple_end(Parser *P, const char *extra_end) {
    Tok *t = cur(P);
    if (t->type == T_VEND || t->type == T_BEND || is_op(t, O_RPAREN)) return 1;
    return extra_end && is_name(t, extra_end);
}

static Node *p_tuple(Parser *P, int simplified, int with_condexpr, const char *extra_end, int explicit_parens) {
    Tok *t0 = cur(P);
    Node *tup = NULL, *first = NULL;
    int n = 0, is_tuple = 0;
    for (;;) {
        if (n) {
            if (!is_op(cur(P), O_COMMA)) return unexpected(P, "','"), NULL;
            P->i++;
        }
        if (tuple_end(P, extra_end)) break;
        Node *x = simplified ? p_primary(P) : p_expr(P, with_condexpr);
        if (!x) return NULL;
        if (n == 0) first = x;
        if (n == 1) {
            if (!(tup = nnew(P, E_TUPLE, t0)) || push_node(P, &tup->kids, &tup->nkids, first)) return NULL;
        }
        if (n >= 1 && push_node(P, &tup->kids, &tup->nkids, x)) return NULL;
        n++;
        if (is_op(cur(P), O_COMMA))
            is_tuple = 1;
        else
            break;
    }
    if (!is_tuple) {
        if (n) return first;
        if (!explicit_parens) {
            char b[96];
            return pfail(P, cur(P), "expected an expression, got %s", tok_desc(cur(P), b, sizeof b)), NULL;
        }
    }
    if (!tup) {
        if (!(tup = nnew(P, E_TUPLE, t0))) return NULL;
        if (n == 1 && push_node(P, &tup->kids, &tup->nkids, first)) return NULL;
    }
    return simplified ? tup : fold_const_seq(P, tup);
}

/* ---- statements ---- */

static int p_body(Parser *P, Node ***kids, int *nkids, const char *const *ends, int nends, int *which);

/* "%}" after a statement's head (jinja2 allows a colon first) */
static int expect_bend(Parser *P) {
    if (is_op(cur(P), O_COLON)) P->i++;
    if (cur(P)->type != T_BEND) return unexpected(P, "end of statement block");
    P->i++;
    return 0;
}

/* target of for / set: a name or a flat tuple of names */
static int p_target(Parser *P, Node *n, const char *extra_end) {
    Tok *t = cur(P);
    Node *x = p_tuple(P, 1, 0, extra_end, 0);
    if (!x) return -1;
    if (x->kind == E_NAME) return push_name(P, &n->names, &n->nnames, x->names[0]);
    if (x->kind == E_TUPLE) {
        for (int k = 0; k < x->nkids; k++) {
            if (x->kids[k]->kind != E_NAME) return pfail(P, t, "unsupported assignment target (only names and tuples of names)");
            if (push_name(P, &n->names, &n->nnames, x->kids[k]->names[0])) return -1;
        }
        n->op = 1; /* unpack */
        return 0;
    }
    return pfail(P, t, "can't assign to this expression");
}

static Node *p_statement(Parser *P);

static int has_macro(const Node *n, int depth) {
    if (!n || depth > 4 * MAX_PARSE_DEPTH) return n != NULL;
    if (n->kind == S_MACRO) return 1;
    for (int k = 0; k < n->nkids; k++)
        if (has_macro(n->kids[k], depth + 1)) return 1;
    for (int k = 0; k < n->nkids2; k++)
        if (has_macro(n->kids2[k], depth + 1)) return 1;
    return 0;
}

static Node *p_if(Parser *P, Tok *at) {
    static const char *const ends[] = {"elif", "else", "endif"};
    Node *n = nnew(P, S_IF, at), *node = n;
    if (!n) return NULL;
    for (;;) {
        if (!(node->a = p_tuple(P, 0, 0, NULL, 0)) || expect_bend(P)) return NULL;
        int which = -1;
        if (p_body(P, &node->kids, &node->nkids, ends, 3, &which)) return NULL;
        if (which == 0) { /* elif: a nested if in the else branch */
            Node *e = nnew(P, S_IF, peek(P, (size_t)-1));
            if (!e || push_node(P, &node->kids2, &node->nkids2, e)) return NULL;
            node = e;
            continue;
        }
        if (which == 1) {
            static const char *const endif[] = {"endif"};
            if (expect_bend(P) || p_body(P, &node->kids2, &node->nkids2, endif, 1, &which)) return NULL;
        }
        return n;
    }
}

static Node *p_for(Parser *P, Tok *at) {
    Node *n = nnew(P, S_FOR, at);
    if (!n || p_target(P, n, "in")) return NULL;
    if (!is_name(cur(P), "in")) return unexpected(P, "'in'"), NULL;
    P->i++;
    if (!(n->a = p_tuple(P, 0, 0, "recursive", 0))) return NULL;
    if (is_name(cur(P), "if")) {
        P->i++;
        if (!(n->b = p_expr(P, 1))) return NULL;
    }
    if (is_name(cur(P), "recursive")) return pfail(P, cur(P), "unsupported: recursive for loops"), NULL;
    static const char *const ends[] = {"endfor", "else"}, *const endfor[] = {"endfor"};
    int which = -1;
    P->loops++;
    if (expect_bend(P) || p_body(P, &n->kids, &n->nkids, ends, 2, &which)) return NULL;
    P->loops--;
    if (which == 1 && (expect_bend(P) || p_body(P, &n->kids2, &n->nkids2, endfor, 1, &which))) return NULL;
    n->id = has_macro(n, 0); /* a macro defined inside keeps the loop's frame */
    return n;
}

static Node *p_set(Parser *P, Tok *at) {
    Node *n = nnew(P, S_SET, at);
    if (!n) return NULL;
    if (cur(P)->type == T_NAME && is_op(peek(P, 1), O_DOT)) { /* ns.attr = value */
        n->kind = S_SETATTR;
        if (push_name(P, &n->names, &n->nnames, cur(P)->s)) return NULL;
        P->i += 2;
        if (cur(P)->type != T_NAME) return unexpected(P, "an attribute name"), NULL;
        if (push_name(P, &n->names, &n->nnames, cur(P)->s)) return NULL;
        P->i++;
        if (!is_op(cur(P), O_ASSIGN)) return unexpected(P, "'='"), NULL;
    } else if (p_target(P, n, NULL)) {
        return NULL;
    }
    if (is_op(cur(P), O_ASSIGN)) {
        P->i++;
        if (!(n->a = p_tuple(P, 0, 1, NULL, 0))) return NULL;
        return n;
    }
    if (n->op) return pfail(P, at, "unsupported: a block set with several targets"), NULL;
    n->kind = S_SETBLOCK; /* {% set x %}...{% endset %}, optionally with filters */
    if (is_op(cur(P), O_PIPE) && !(n->b = p_filter(P, NULL, 0))) return NULL;
    static const char *const ends[] = {"endset"};
    int which = -1;
    if (expect_bend(P) || p_body(P, &n->kids, &n->nkids, ends, 1, &which)) return NULL;
    return n;
}

/* Whether a macro body reads a name (varargs / kwargs make a macro take extra arguments, as in jinja2). */
static int uses_name(const Node *n, const char *name, int depth) {
    if (!n || depth > 4 * MAX_PARSE_DEPTH) return 0;
    if (n->kind == E_NAME && !strcmp(n->names[0]->s, name)) return 1;
    if (uses_name(n->a, name, depth + 1) || uses_name(n->b, name, depth + 1) || uses_name(n->c, name, depth + 1)) return 1;
    for (int k = 0; k < n->nkids; k++)
        if (uses_name(n->kids[k], name, depth + 1)) return 1;
    for (int k = 0; k < n->nkids2; k++)
        if (uses_name(n->kids2[k], name, depth + 1)) return 1;
    return 0;
}

static Node *p_macro(Parser *P, Tok *at) {
    Node *n = nnew(P, S_MACRO, at);
    if (!n) return NULL;
    if (cur(P)->type != T_NAME) return unexpected(P, "a macro name"), NULL;
    if (push_name(P, &n->names, &n->nnames, cur(P)->s)) return NULL;
    P->i++;
    if (!is_op(cur(P), O_LPAREN)) return unexpected(P, "'('"), NULL;
    P->i++;
    while (!is_op(cur(P), O_RPAREN)) {
        if (n->nnames > 1) {
            if (!is_op(cur(P), O_COMMA)) return unexpected(P, "','"), NULL;
            P->i++;
        }
        Tok *pt = cur(P);
        if (pt->type != T_NAME) return unexpected(P, "a parameter name"), NULL;
        if (n->nnames > MAX_CALL_ARGS) return pfail(P, pt, "too many macro parameters"), NULL;
        if (push_name(P, &n->names, &n->nnames, pt->s)) return NULL;
        P->i++;
        Node *def = NULL;
        if (is_op(cur(P), O_ASSIGN)) {
            P->i++;
            if (!(def = p_expr(P, 1))) return NULL;
        } else if (n->nkids2 && n->kids2[n->nkids2 - 1]) {
            return pfail(P, pt, "non-default argument follows default argument"), NULL;
        }
        if (push_node(P, &n->kids2, &n->nkids2, def)) return NULL;
    }
    P->i++;
    static const char *const ends[] = {"endmacro"};
    int which = -1, loops = P->loops;
    P->loops = 0; /* break / continue do not cross a macro */
    if (expect_bend(P) || p_body(P, &n->kids, &n->nkids, ends, 1, &which)) return NULL;
    P->loops = loops;
    for (int k = 0; k < n->nkids; k++) {
        if (uses_name(n->kids[k], "varargs", 0)) n->op |= 1;
        if (uses_name(n->kids[k], "kwargs", 0)) n->op |= 2;
        if (has_macro(n->kids[k], 0)) n->op |= 4; /* a macro defined inside keeps the call's frame */
    }
    return n;
}

static Node *p_statement(Parser *P) {
    Tok *t = cur(P);
    if (t->type != T_NAME) return pfail(P, t, "tag name expected"), NULL;
    const char *s = t->s->s;
    P->i++;
    P->stmt = t;
    if (!strcmp(s, "if")) return p_if(P, t);
    if (!strcmp(s, "for")) return p_for(P, t);
    if (!strcmp(s, "set")) return p_set(P, t);
    if (!strcmp(s, "macro")) return p_macro(P, t);
    if (!strcmp(s, "print")) {
        Node *n = nnew(P, S_OUT, t);
        if (!n || !(n->a = p_tuple(P, 0, 1, NULL, 0))) return NULL;
        return n;
    }
    if (!strcmp(s, "break") || !strcmp(s, "continue")) {
        if (!P->loops) return pfail(P, t, "'%s' outside of a loop", s), NULL;
        return nnew(P, s[0] == 'b' ? S_BREAK : S_CONTINUE, t);
    }
    if (!strcmp(s, "filter")) {
        Node *n = nnew(P, S_FILTERBLOCK, t);
        static const char *const ends[] = {"endfilter"};
        int which = -1;
        if (!n || !(n->b = p_filter(P, NULL, 1)) || expect_bend(P) || p_body(P, &n->kids, &n->nkids, ends, 1, &which))
            return NULL;
        return n;
    }
    if (!strcmp(s, "generation")) { /* transformers' tag marking assistant text: renders its body */
        Node *n = nnew(P, S_BODY, t);
        static const char *const ends[] = {"endgeneration"};
        int which = -1;
        if (!n || expect_bend(P) || p_body(P, &n->kids, &n->nkids, ends, 1, &which)) return NULL;
        return n;
    }
    if (!strcmp(s, "with")) {
        Node *n = nnew(P, S_WITH, t);
        if (!n) return NULL;
        while (cur(P)->type != T_BEND) {
            if (n->nnames) {
                if (!is_op(cur(P), O_COMMA)) return unexpected(P, "','"), NULL;
                P->i++;
            }
            if (cur(P)->type != T_NAME) return unexpected(P, "a name"), NULL;
            if (push_name(P, &n->names, &n->nnames, cur(P)->s)) return NULL;
            P->i++;
            if (!is_op(cur(P), O_ASSIGN)) return unexpected(P, "'='"), NULL;
            P->i++;
            Node *v = p_expr(P, 1);
            if (!v || push_node(P, &n->kids2, &n->nkids2, v)) return NULL;
        }
        static const char *const ends[] = {"endwith"};
        int which = -1;
        if (expect_bend(P) || p_body(P, &n->kids, &n->nkids, ends, 1, &which)) return NULL;
        return n;
    }
    static const char *const unsupported[] = {"block", "extends", "include", "import", "from", "call", "autoescape", "raw"};
    for (size_t k = 0; k < ZY_ARRAY_LEN(unsupported); k++)
        if (!strcmp(s, unsupported[k])) return pfail(P, t, "unsupported tag '%s'", s), NULL;
    return pfail(P, t, "unknown tag '%.60s'", s), NULL;
}

/* Statements until one of ends (its name consumed; *which = its index) or, with nends == 0, the end. */
static int p_body(Parser *P, Node ***kids, int *nkids, const char *const *ends, int nends, int *which) {
    if (enter(P)) return -1;
    Tok *opened = P->stmt ? P->stmt : cur(P);
    for (;;) {
        Tok *t = cur(P);
        Node *n = NULL;
        if (t->type == T_EOF) {
            if (!nends) break;
            const char *end = ends[nends - 1];
            for (int k = 0; k < nends; k++)
                if (!strncmp(ends[k], "end", 3)) end = ends[k];
            return pfail(P, opened, "unexpected end of template: no '%s' closes this '%s'", end, opened->s ? opened->s->s : "");
        }
        if (t->type == T_DATA) {
            if (!(n = nnew(P, S_TEXT, t))) return -1;
            n->v = v_ptr(V_STR, t->s);
            P->i++;
        } else if (t->type == T_VBEGIN) {
            P->i++;
            if (!(n = nnew(P, S_OUT, t)) || !(n->a = p_tuple(P, 0, 1, NULL, 0))) return -1;
            if (cur(P)->type != T_VEND) return unexpected(P, "end of print statement");
            P->i++;
        } else if (t->type == T_BBEGIN) {
            Tok *name = peek(P, 1);
            for (int k = 0; k < nends; k++)
                if (is_name(name, ends[k])) {
                    P->i += 2;
                    *which = k;
                    P->depth--;
                    return 0;
                }
            P->i++;
            if (!(n = p_statement(P))) return -1;
            if (cur(P)->type != T_BEND) return unexpected(P, "end of statement block");
            P->i++;
        } else {
            char b[96];
            return pfail(P, t, "unexpected %s", tok_desc(t, b, sizeof b));
        }
        if (push_node(P, kids, nkids, n)) return -1;
    }
    P->depth--;
    return 0;
}

/* jinja2 compiles an unknown filter or test inside an if statement or an inline if into a runtime error (raised
 * only if it runs); anywhere else it refuses the template. soft: inside an if, up to the next for / macro / block. */
static int check_names(Parser *P, const Node *n, int soft, int depth) {
    if (!n) return 0;
    if ((n->kind == E_FILTER || n->kind == E_TEST) && n->id == -1 && !soft) {
        Str *name = n->v.u.p;
        return zy_fail(P->err, "chat template line %d:%d: no %s named '%.60s'", n->line, n->col,
                       n->kind == E_FILTER ? "filter" : "test", name->s);
    }
    int sa = soft, sb = soft, sk = soft, sk2 = soft;
    switch (n->kind) {
    case S_IF: sa = sk = sk2 = 1; break;
    case E_COND: sa = sb = sk = sk2 = 1; break;
    case S_FOR: sb = sk = sk2 = 0; break;
    case S_MACRO:
    case S_SETBLOCK:
    case S_FILTERBLOCK: sb = sk = sk2 = 0; break;
    case S_WITH: sk = 0; break;
    }
    if (depth > 4 * MAX_PARSE_DEPTH) return 0;
    if (check_names(P, n->a, sa, depth + 1) || check_names(P, n->b, sb, depth + 1) ||
        check_names(P, n->c, n->kind == E_COND ? 1 : soft, depth + 1))
        return -1;
    for (int k = 0; k < n->nkids; k++)
        if (check_names(P, n->kids[k], sk, depth + 1)) return -1;
    for (int k = 0; k < n->nkids2; k++)
        if (check_names(P, n->kids2[k], sk2, depth + 1)) return -1;
    return 0;
}

void chat_template_free(ChatTemplate *t) {
    if (!t) return;
    ar_destroy(&t->ar);
    free(t);
}

int chat_template_parse(const char *src, size_t len, ChatTemplate **out, ZyErr *err) {
    *out = NULL;
    size_t bad;
    if (!u8_valid(src, len, &bad)) return zy_fail(err, "chat template: not valid UTF-8 (byte %zu)", bad);
    ChatTemplate *t = calloc(1, sizeof *t);
    if (!t) return zy_fail(err, "out of memory");
    ar_init(&t->ar, SIZE_MAX);
    /* newlines normalised; one trailing newline dropped (keep_trailing_newline=False) */
    char *s = ar_alloc(&t->ar, len + 1);
    if (!s) {
        chat_template_free(t);
        return zy_fail(err, "out of memory");
    }
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            s[n++] = src[i];
        }
    }
    if (n && s[n - 1] == '\n') n--;
    s[n] = '\0';
    Lexer L = {.src = s, .len = n, .lc_line = 1, .lc_col = 1, .ar = &t->ar, .err = err};
    if (lex(&L) || !lpush(&L, T_EOF, n)) {
        chat_template_free(t);
        return -1;
    }
    Parser P = {.t = L.toks, .n = L.n, .ar = &t->ar, .err = err};
    Node *root = nnew(&P, S_BODY, &L.toks[0]);
    int which = -1;
    if (!root || p_body(&P, &root->kids, &root->nkids, NULL, 0, &which) || check_names(&P, root, 0, 0)) {
        chat_template_free(t);
        return -1;
    }
    ar_free(&t->ar, L.toks); /* the tree keeps its strings, not the token array */
    t->root = root;
    *out = t;
    return 0;
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Evaluation: errors */

static int rfail(R *r, const Node *at, const char *fmt, ...) {
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
static int add_pos(R *r, const Node *at) {
    if (r->need_pos) {
        char old[sizeof r->err->msg];
        memcpy(old, r->err->msg, sizeof old);
        snprintf(r->err->msg, sizeof r->err->msg, "chat template line %d:%d: %.960s", at->line, at->col, old);
        r->need_pos = 0;
    }
    return -1;
}

/* jinja2's UndefinedError for an operation on an undefined value. */
static int undef_fail(R *r, const Node *at, Val u) {
    Str *h = u.u.p;
    return rfail(r, at, "%s", h ? h->s : "undefined value");
}

static Val mk_undef(R *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static Val mk_undef(R *r, const char *fmt, ...) {
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

static const char *obj_type_repr(Val v) { return v.kind == V_NONE ? "None" : type_name(v); }

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

static int cp_alpha(R *r, uint32_t c) {
    if (c < 0x80) return (c | 0x20) >= 'a' && (c | 0x20) <= 'z';
    return r->loc ? iswalpha_l((wint_t)c, r->loc) != 0 : 0;
}

/* Python's str.isdigit(): the decimal digits of every script (Unicode Nd, runs of ten) and the super/subscripts */
static int cp_digit(R *r, uint32_t c) {
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

enum { CASE_UPPER, CASE_LOWER, CASE_CAPITALIZE, CASE_TITLE_FILTER, CASE_TITLE_METHOD };

static Str *str_case(R *r, const Str *s, int mode) {
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

static int iterate(R *r, const Node *at, Val v, Val **items, size_t *n) {
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

static Val mk_list(R *r, const Val *items, size_t n, int flavor) {
    List *l = list_new(r, n, flavor);
    if (!l) return (Val){.kind = -1};
    if (n) memcpy(l->v, items, n * sizeof *items);
    return v_ptr(V_LIST, l);
}

/* Python len(); -1 with an error for a type without one. */
static int py_len(R *r, const Node *at, Val v, int64_t *n) {
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
static size_t *cp_offsets(R *r, const Str *s) {
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

enum {
    M_STRIP, M_LSTRIP, M_RSTRIP, M_SPLIT, M_RSPLIT, M_SPLITLINES, M_STARTSWITH, M_ENDSWITH, M_UPPER, M_LOWER, M_TITLE,
    M_CAPITALIZE, M_REPLACE, M_FIND, M_RFIND, M_INDEX, M_COUNT, M_JOIN, M_ISDIGIT, M_ISALPHA, M_ISALNUM, M_ISSPACE,
    M_ISUPPER, M_ISLOWER, M_REMOVEPREFIX, M_REMOVESUFFIX, M_GET, M_ITEMS, M_KEYS, M_VALUES, M_COPY, M_LINDEX,
    M_LCOUNT, M_CYCLE, M_UNSUPPORTED
};
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
static int py_attr(R *r, Val v, const Str *name, Val *out) {
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
static int attr_path_d(R *r, const Node *at, Val obj, Val attr, const Val *def, Val *out) {
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

static int attr_path(R *r, const Node *at, Val obj, Val attr, Val *out) { return attr_path_d(r, at, obj, attr, NULL, out); }

/* ------------------------------------------------------------------------------------------------------------ */
/* Operators */

/* markupsafe.escape */
static int html_escape(R *r, const Str *s, SBuf *b) {
    for (size_t k = 0; k < s->len; k++) {
        char c = s->s[k];
        int rc = c == '&' ? sb_puts(r, b, "&amp;") : c == '<' ? sb_puts(r, b, "&lt;") : c == '>' ? sb_puts(r, b, "&gt;")
               : c == '"' ? sb_puts(r, b, "&#34;") : c == '\'' ? sb_puts(r, b, "&#39;") : sb_putc(r, b, c);
        if (rc) return -1;
    }
    return 0;
}

static int arith(R *r, const Node *at, int op, Val a, Val b, Val *out) {
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
static int contains(R *r, const Node *at, Val needle, Val hay, int *res) {
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

static int compare(R *r, const Node *at, int op, Val a, Val b, int *res) {
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
static int merge_sort(R *r, Val *v, Val *keys, size_t n, int reverse) {
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
static int fold_key(R *r, Val v, int case_sensitive, Val *out) {
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

typedef struct {
    Val *pos;
    int npos;
    Str **kwn;
    Val *kwv;
    int nkw;
} Args;

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
static int bind(R *r, const Node *at, const char *what, const char *params, const Args *a, Val *slot, int *have, int max) {
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

static int want_int(R *r, const Node *at, Val v, const char *what, int64_t *out) {
    if (v.kind == V_INT || v.kind == V_BOOL) {
        *out = v.u.i;
        return 0;
    }
    if (v.kind == V_UNDEF) return undef_fail(r, at, v);
    return rfail(r, at, "%s: an integer is required, got '%s'", what, type_name(v));
}

static int want_str(R *r, const Node *at, Val v, const char *what, Str **out) {
    if (v.kind == V_STR) {
        *out = v.u.p;
        return 0;
    }
    if (v.kind == V_UNDEF) return undef_fail(r, at, v);
    return rfail(r, at, "%s: a string is required, got '%s'", what, type_name(v));
}

static int do_filter(R *r, const Node *at, int fid, Val in, const Args *a, Val *out);
static int do_test(R *r, const Node *at, int tid, Val v, const Args *a, int *res);

/* ------------------------------------------------------------------------------------------------------------ */
/* String methods */

static int in_chars(const Str *chars, uint32_t c) {
    if (!chars) return py_isspace(c);
    for (size_t i = 0; i < chars->len;)
        if (u8_dec(chars->s, &i) == c) return 1;
    return 0;
}

/* strip / lstrip / rstrip; chars NULL = white space */
static Str *str_strip(R *r, Str *s, const Str *chars, int left, int right) {
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

static int list_push(R *r, Val **items, size_t *n, size_t *cap, Val v) {
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
static int str_split(R *r, const Node *at, Str *s, const Str *sep, int64_t maxsplit, int from_right, Val *out) {
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
static int str_splitlines(R *r, const Node *at, Str *s, int keepends, Val *out) {
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
static Str *str_replace(R *r, Str *s, const Str *old, const Str *rep, int64_t count) {
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
        if (bind(r, at, mname, "chars", a, slot, have, 4)) return -1;
        Str *chars = NULL;
        if (have[0] && slot[0].kind != V_NONE && want_str(r, at, slot[0], mname, &chars)) return -1;
        if (!(x = str_strip(r, s, chars, m->id != M_RSTRIP, m->id != M_LSTRIP))) return add_pos(r, at);
        *out = v_ptr(V_STR, x);
        return 0;
    }
    case M_SPLIT:
    case M_RSPLIT: {
        if (bind(r, at, mname, "sep,maxsplit", a, slot, have, 4)) return -1;
        Str *sep = NULL;
        int64_t maxsplit = -1;
        if (have[0] && slot[0].kind != V_NONE && want_str(r, at, slot[0], mname, &sep)) return -1;
        if (have[1] && want_int(r, at, slot[1], mname, &maxsplit)) return -1;
        return str_split(r, at, s, sep, maxsplit, m->id == M_RSPLIT, out);
    }
    case M_SPLITLINES:
        if (bind(r, at, mname, "keepends", a, slot, have, 4)) return -1;
        return str_splitlines(r, at, s, have[0] && truthy(slot[0]), out);
    case M_STARTSWITH:
    case M_ENDSWITH: {
        if (bind(r, at, mname, "prefix", a, slot, have, 4)) return -1;
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
        if (bind(r, at, mname, "", a, slot, have, 4)) return -1;
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
        if (bind(r, at, mname, "old,new,count", a, slot, have, 4)) return -1;
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
        if (bind(r, at, mname, "sub", a, slot, have, 4)) return -1;
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
        if (bind(r, at, mname, "iterable", a, slot, have, 4)) return -1;
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
        if (bind(r, at, mname, "", a, slot, have, 4)) return -1;
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
        if (bind(r, at, mname, "affix", a, slot, have, 4)) return -1;
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
        if (bind(r, at, mname, "key,default", a, slot, have, 4)) return -1;
        if (!have[0]) return rfail(r, at, "get expected at least 1 argument, got 0");
        long e = dict_find(r, self.u.p, slot[0]);
        if (e == -2) return add_pos(r, at);
        *out = e >= 0 ? ((Dict *)self.u.p)->v[e] : have[1] ? slot[1] : v_none();
        return 0;
    }
    case M_ITEMS:
    case M_KEYS:
    case M_VALUES: {
        if (bind(r, at, mname, "", a, slot, have, 4)) return -1;
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
        if (bind(r, at, mname, "", a, slot, have, 4)) return -1;
        *out = self; /* values are immutable here, so a copy is the same value */
        return 0;
    case M_LINDEX:
    case M_LCOUNT: {
        if (bind(r, at, mname, "value", a, slot, have, 4)) return -1;
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
static int call_method(R *r, const Node *at, Method *m, const Args *a, Val *out) {
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
/* Filters */

static int ret_str(R *r, const Node *at, Str *s, Val *out) {
    if (!s) return add_pos(r, at);
    *out = v_ptr(V_STR, s);
    return 0;
}

/* Python's float(str) / int(str) as jinja2's filters use them */
static int parse_number(const Str *s, int want_int, int base, Val *out) {
    char buf[128];
    size_t b = 0, e = s->len;
    while (b < e && py_isspace((unsigned char)s->s[b])) b++;
    while (e > b && py_isspace((unsigned char)s->s[e - 1])) e--;
    if (e - b == 0 || e - b >= sizeof buf) return 0;
    size_t k = 0;
    for (size_t i = b; i < e; i++) {
        if (s->s[i] == '_') { /* only between digits */
            unsigned char prev = i > b ? (unsigned char)s->s[i - 1] : 0;
            if (i == b || i + 1 == e || !(isdigit(prev) || (base == 16 && isxdigit(prev)))) return 0;
            continue;
        }
        buf[k++] = s->s[i];
    }
    buf[k] = '\0';
    char *end;
    errno = 0;
    if (want_int) {
        long long v = strtoll(buf, &end, base);
        if (*end || errno || end == buf) return 0;
        *out = v_int(v);
        return 1;
    }
    for (size_t i = 0; i < k; i++) /* strtod accepts hex floats and "infinity" spellings Python also accepts */
        if (buf[i] == 'x' || buf[i] == 'X' || buf[i] == 'p' || buf[i] == 'P') return 0;
    double f = strtod(buf, &end);
    if (*end || end == buf) return 0;
    *out = v_float(f);
    return 1;
}

static int call_filter_by_name(R *r, const Node *at, Val name, Val in, const Args *a, Val *out) {
    Str *s = NULL;
    if (want_str(r, at, name, "filter name", &s)) return -1;
    int k = filter_lookup(s->s);
    if (k < 0) return rfail(r, at, "no filter named '%.60s'", s->s);
    return do_filter(r, at, k, in, a, out);
}

static int call_test_by_name(R *r, const Node *at, Val name, Val in, const Args *a, int *res) {
    Str *s = NULL;
    if (want_str(r, at, name, "test name", &s)) return -1;
    int k = test_lookup(s->s);
    if (k < 0) return rfail(r, at, "no test named '%.60s'", s->s);
    return do_test(r, at, k, in, a, res);
}

static int dictsort_filter(R *r, const Node *at, Val in, const Val *slot, const int *have, Val *out) {
    if (in.kind != V_DICT) return rfail(r, at, "dictsort: a mapping is required, got '%s'", type_name(in));
    int cs = have[0] && truthy(slot[0]), by_value = 0, rev = have[2] && truthy(slot[2]);
    if (have[1]) {
        Str *by;
        if (want_str(r, at, slot[1], "dictsort", &by)) return -1;
        if (!strcmp(by->s, "value"))
            by_value = 1;
        else if (strcmp(by->s, "key"))
            return rfail(r, at, "You can only sort by either 'key' or 'value'");
    }
    Dict *d = in.u.p;
    List *l = list_new(r, d->n, LF_PLAIN);
    Val *keys = ralloc(r, (d->n + 1) * sizeof *keys);
    if (!l || !keys) return add_pos(r, at);
    for (size_t k = 0; k < d->n; k++) {
        List *t = list_new(r, 2, LF_PLAIN);
        if (!t) return add_pos(r, at);
        t->v[0] = d->k[k];
        t->v[1] = d->v[k];
        l->v[k] = v_ptr(V_TUPLE, t);
        if (fold_key(r, by_value ? d->v[k] : d->k[k], cs, &keys[k])) return add_pos(r, at);
    }
    if (merge_sort(r, l->v, keys, d->n, rev)) return add_pos(r, at);
    *out = v_ptr(V_LIST, l);
    return 0;
}

/* select / reject / selectattr / rejectattr */
static int select_filter(R *r, const Node *at, int fid, Val in, const Args *a, Val *out) {
    if (!truthy(in)) { /* jinja2: `if value:` before anything else */
        *out = mk_list(r, NULL, 0, LF_GEN);
        return out->kind < 0 ? add_pos(r, at) : 0;
    }
    int by_attr = fid == F_SELECTATTR || fid == F_REJECTATTR, want = fid == F_SELECT || fid == F_SELECTATTR, off = by_attr;
    if (by_attr && a->npos < 1) return rfail(r, at, "Missing parameter for attribute name");
    Val *items, *kept = NULL;
    size_t n, nk = 0, cap = 0;
    if (iterate(r, at, in, &items, &n)) return -1;
    Args targs = {a->pos + off + 1, a->npos - off - 1, a->kwn, a->kwv, a->nkw};
    for (size_t k = 0; k < n; k++) {
        Val item = items[k], v = item;
        if (by_attr && attr_path(r, at, item, a->pos[0], &v)) return -1;
        int res;
        if (a->npos > off) {
            if (call_test_by_name(r, at, a->pos[off], v, &targs, &res)) return -1;
        } else {
            res = truthy(v);
        }
        if (res == want && list_push(r, &kept, &nk, &cap, item)) return add_pos(r, at);
    }
    *out = mk_list(r, kept, nk, LF_GEN);
    return out->kind < 0 ? add_pos(r, at) : 0;
}

static int map_filter(R *r, const Node *at, Val in, const Args *a, Val *out) {
    if (!truthy(in)) {
        *out = mk_list(r, NULL, 0, LF_GEN);
        return out->kind < 0 ? add_pos(r, at) : 0;
    }
    Val *items;
    size_t n;
    int by_attr = a->npos == 0 && a->nkw > 0;
    Val attr = v_none(), def = v_none();
    int have_def = 0;
    if (by_attr) {
        int found = 0;
        for (int k = 0; k < a->nkw; k++) {
            if (!strcmp(a->kwn[k]->s, "attribute"))
                attr = a->kwv[k], found = 1;
            else if (!strcmp(a->kwn[k]->s, "default"))
                def = a->kwv[k], have_def = 1;
            else
                return rfail(r, at, "Unexpected keyword argument '%s'", a->kwn[k]->s);
        }
        if (!found) by_attr = 0;
    }
    if (!by_attr && a->npos == 0) return rfail(r, at, "map requires a filter argument");
    if (iterate(r, at, in, &items, &n)) return -1;
    List *l = list_new(r, n, LF_GEN);
    if (!l) return add_pos(r, at);
    Args fargs = {a->pos + 1, a->npos - 1, a->kwn, a->kwv, a->nkw};
    for (size_t k = 0; k < n; k++) {
        if (by_attr) {
            if (attr_path_d(r, at, items[k], attr, have_def && def.kind != V_NONE ? &def : NULL, &l->v[k])) return -1;
        } else if (call_filter_by_name(r, at, a->pos[0], items[k], &fargs, &l->v[k])) {
            return -1;
        }
    }
    *out = v_ptr(V_LIST, l);
    return 0;
}

static int minmax_filter(R *r, const Node *at, int is_max, Val in, const Val *slot, const int *have, Val *out) {
    Val *items;
    size_t n;
    if (iterate(r, at, in, &items, &n)) return -1;
    if (n == 0) {
        *out = mk_undef(r, "No aggregated item, sequence was empty.");
        return 0;
    }
    int cs = have[0] && truthy(slot[0]);
    size_t best = 0;
    Val bk = v_none();
    for (size_t k = 0; k < n; k++) {
        Val key = items[k];
        if (have[1] && slot[1].kind != V_NONE && attr_path(r, at, items[k], slot[1], &key)) return -1;
        if (fold_key(r, key, cs, &key)) return add_pos(r, at);
        if (k == 0) {
            bk = key;
            continue;
        }
        int better;
        if (val_lt(r, is_max ? bk : key, is_max ? key : bk, &better, 0)) return add_pos(r, at);
        if (better) best = k, bk = key;
    }
    *out = items[best];
    return 0;
}

static int indent_filter(R *r, const Node *at, Val in, const Val *slot, const int *have, Val *out) {
    Str *s = to_str(r, in), *ind;
    if (!s) return add_pos(r, at);
    SBuf ib = {0};
    if (have[0] && slot[0].kind == V_STR) {
        ind = slot[0].u.p;
    } else {
        int64_t w = 4;
        if (have[0] && want_int(r, at, slot[0], "indent", &w)) return -1;
        for (int64_t k = 0; k < w; k++)
            if (sb_putc(r, &ib, ' ')) return add_pos(r, at);
        if (!(ind = sb_take(r, &ib))) return add_pos(r, at);
    }
    int first = have[1] && truthy(slot[1]), blank = have[2] && truthy(slot[2]);
    /* s + "\n", split into lines (str.splitlines), re-joined with indentation */
    SBuf t = {0};
    if (sb_put(r, &t, s->s, s->len) || sb_putc(r, &t, '\n')) return add_pos(r, at);
    Str *ts = sb_take(r, &t);
    Val lines;
    if (!ts || str_splitlines(r, at, ts, 0, &lines)) return add_pos(r, at);
    List *l = lines.u.p;
    SBuf b = {0};
    if (first && sb_put(r, &b, ind->s, ind->len)) return add_pos(r, at);
    for (size_t k = 0; k < l->n; k++) {
        Str *line = l->v[k].u.p;
        if (k && sb_putc(r, &b, '\n')) return add_pos(r, at);
        if (k && (blank || line->len) && sb_put(r, &b, ind->s, ind->len)) return add_pos(r, at);
        if (sb_put(r, &b, line->s, line->len)) return add_pos(r, at);
    }
    return ret_str(r, at, sb_take(r, &b), out);
}

static int tojson_filter(R *r, const Node *at, Val in, const Val *slot, const int *have, Val *out) {
    JsonOpts o = {0};
    o.ensure_ascii = have[0] && truthy(slot[0]);
    o.sort_keys = have[3] && truthy(slot[3]);
    SBuf ib = {0};
    if (have[1] && slot[1].kind != V_NONE) {
        o.has_indent = 1;
        if (slot[1].kind == V_STR) {
            o.indent = slot[1].u.p;
        } else {
            int64_t w;
            if (want_int(r, at, slot[1], "tojson indent", &w)) return -1;
            for (int64_t k = 0; k < w && k < 1000; k++)
                if (sb_putc(r, &ib, ' ')) return add_pos(r, at);
            if (!(o.indent = sb_take(r, &ib))) return add_pos(r, at);
        }
    }
    Str *comma = rstrz(r, o.has_indent ? "," : ", "), *colon = rstrz(r, ": ");
    if (!comma || !colon) return add_pos(r, at);
    o.item_sep = comma;
    o.key_sep = colon;
    if (have[2] && slot[2].kind != V_NONE) {
        List *l = slot[2].kind == V_TUPLE || slot[2].kind == V_LIST ? slot[2].u.p : NULL;
        if (!l || l->n != 2 || l->v[0].kind != V_STR || l->v[1].kind != V_STR)
            return rfail(r, at, "tojson: separators must be a pair of strings");
        o.item_sep = l->v[0].u.p;
        o.key_sep = l->v[1].u.p;
    }
    SBuf b = {0};
    if (json_dump(r, in, &b, &o, 0, 0)) return add_pos(r, at);
    return ret_str(r, at, sb_take(r, &b), out);
}

static int do_filter(R *r, const Node *at, int fid, Val in, const Args *a, Val *out) {
    int id = filter_table[fid].id;
    const char *name = filter_table[fid].name;
    Val slot[8];
    int have[8];
    char what[64];
    snprintf(what, sizeof what, "filter '%s'", name);
    if (filter_table[fid].params && bind(r, at, what, filter_table[fid].params, a, slot, have, 8)) return -1;
    Val *items;
    size_t n;
    Str *s;
    switch (id) {
    case F_ABS:
        if (in.kind == V_INT || in.kind == V_BOOL) {
            if (in.u.i == INT64_MIN) return rfail(r, at, "integer overflow");
            *out = v_int(in.u.i < 0 ? -in.u.i : in.u.i);
        } else if (in.kind == V_FLOAT) {
            *out = v_float(fabs(in.u.f));
        } else {
            if (in.kind == V_UNDEF) return undef_fail(r, at, in);
            return rfail(r, at, "bad operand type for abs(): '%s'", type_name(in));
        }
        return 0;
    case F_ATTR: {
        Str *nm;
        if (!have[0]) return rfail(r, at, "attr() requires a name");
        if (in.kind == V_UNDEF) return undef_fail(r, at, in);
        if (want_str(r, at, slot[0], what, &nm)) return -1;
        int f = py_attr(r, in, nm, out);
        if (f < 0) return add_pos(r, at);
        if (!f) *out = mk_undef(r, "'%s object' has no attribute '%.100s'", obj_type_repr(in), nm->s);
        return 0;
    }
    case F_BATCH: {
        int64_t cnt;
        if (!have[0]) return rfail(r, at, "batch() requires a line count");
        if (want_int(r, at, slot[0], what, &cnt)) return -1;
        if (cnt <= 0) return rfail(r, at, "batch(): the line count must be positive");
        if (iterate(r, at, in, &items, &n)) return -1;
        size_t nb = (n + (size_t)cnt - 1) / (size_t)cnt;
        List *l = list_new(r, nb, LF_GEN);
        if (!l) return add_pos(r, at);
        for (size_t b = 0; b < nb; b++) {
            size_t st = b * (size_t)cnt, len = n - st < (size_t)cnt ? n - st : (size_t)cnt;
            size_t full = have[1] && slot[1].kind != V_NONE ? (size_t)cnt : len;
            List *x = list_new(r, full, LF_PLAIN);
            if (!x) return add_pos(r, at);
            for (size_t k = 0; k < full; k++) x->v[k] = k < len ? items[st + k] : slot[1];
            l->v[b] = v_ptr(V_LIST, x);
        }
        *out = v_ptr(V_LIST, l);
        return 0;
    }
    case F_CAPITALIZE:
    case F_LOWER:
    case F_UPPER:
    case F_TITLE:
        if (!(s = to_str(r, in))) return add_pos(r, at);
        if (ret_str(r, at,
                    str_case(r, s, id == F_CAPITALIZE ? CASE_CAPITALIZE
                                   : id == F_LOWER    ? CASE_LOWER
                                   : id == F_UPPER    ? CASE_UPPER
                                                      : CASE_TITLE_FILTER),
                    out))
            return -1;
        out->markup = in.kind == V_STR && in.markup && id != F_TITLE; /* Markup's methods keep it Markup */
        return 0;
    case F_DEFAULT:
        if (in.kind == V_UNDEF || (have[1] && truthy(slot[1]) && !truthy(in))) {
            if (have[0]) {
                *out = slot[0];
            } else {
                Str *e = rstr(r, "", 0);
                if (!e) return add_pos(r, at);
                *out = v_ptr(V_STR, e);
            }
        } else {
            *out = in;
        }
        return 0;
    case F_DICTSORT: return dictsort_filter(r, at, in, slot, have, out);
    case F_INDENT:
        if (indent_filter(r, at, in, slot, have, out)) return -1;
        out->markup = in.kind == V_STR && in.markup;
        return 0;
    case F_ESCAPE: {
        if (in.kind == V_STR && in.markup) {
            *out = in;
            return 0;
        }
        if (!(s = to_str(r, in))) return add_pos(r, at);
        SBuf b = {0};
        if (html_escape(r, s, &b) || ret_str(r, at, sb_take(r, &b), out)) return add_pos(r, at);
        out->markup = 1;
        return 0;
    }
    case F_FIRST:
        if (in.kind == V_LIST && ((List *)in.u.p)->flavor == LF_GEN) { /* next(): takes one item */
            List *l = in.u.p;
            *out = l->pos < l->n ? l->v[l->pos++] : mk_undef(r, "No first item, sequence was empty.");
            return 0;
        }
        if (iterate(r, at, in, &items, &n)) return -1;
        *out = n ? items[0] : mk_undef(r, "No first item, sequence was empty.");
        return 0;
    case F_LAST:
        if (in.kind == V_LIST && ((List *)in.u.p)->flavor == LF_GEN) return rfail(r, at, "'generator' object is not reversible");
        if (in.kind != V_UNDEF && in.kind != V_LIST && in.kind != V_TUPLE && in.kind != V_DICT && in.kind != V_STR)
            return rfail(r, at, "'%s' object is not reversible", type_name(in));
        if (iterate(r, at, in, &items, &n)) return -1;
        *out = n ? items[n - 1] : mk_undef(r, "No last item, sequence was empty.");
        return 0;
    case F_FLOAT:
        if (in.kind == V_FLOAT) *out = in;
        else if (in.kind == V_INT || in.kind == V_BOOL) *out = v_float((double)in.u.i);
        else if (in.kind == V_UNDEF) return undef_fail(r, at, in);
        else if (!(in.kind == V_STR && parse_number(in.u.p, 0, 10, out))) *out = have[0] ? slot[0] : v_float(0);
        return 0;
    case F_INT: {
        int64_t base = 10;
        if (have[1] && want_int(r, at, slot[1], what, &base)) return -1;
        if (base != 2 && base != 8 && base != 10 && base != 16)
            return rfail(r, at, "unsupported: int() base %lld", (long long)base);
        if (in.kind == V_INT || in.kind == V_BOOL) *out = v_int(in.u.i);
        else if (in.kind == V_FLOAT) {
            if (!isfinite(in.u.f) || fabs(in.u.f) >= 9.2e18) *out = have[0] ? slot[0] : v_int(0);
            else *out = v_int((int64_t)in.u.f);
        } else if (in.kind == V_UNDEF) return undef_fail(r, at, in);
        else if (in.kind == V_STR && parse_number(in.u.p, 1, (int)base, out)) ;
        else if (in.kind == V_STR && base == 10 && parse_number(in.u.p, 0, 10, out) && isfinite(out->u.f) &&
                 fabs(out->u.f) < 9.2e18)
            *out = v_int((int64_t)out->u.f); /* jinja2: "42.23"|int is 42 */
        else *out = have[0] ? slot[0] : v_int(0);
        return 0;
    }
    case F_ITEMS: {
        if (in.kind == V_UNDEF) {
            *out = mk_list(r, NULL, 0, LF_GEN);
            return out->kind < 0 ? add_pos(r, at) : 0;
        }
        if (in.kind != V_DICT) return rfail(r, at, "Can only get item pairs from a mapping.");
        Method m = {in, M_ITEMS, };
        Args none = {0};
        if (call_method(r, at, &m, &none, out)) return -1;
        ((List *)out->u.p)->flavor = LF_GEN;
        return 0;
    }
    case F_JOIN: {
        Str *d = NULL;
        if (have[0] && !(d = to_str(r, slot[0]))) return add_pos(r, at);
        if (iterate(r, at, in, &items, &n)) return -1;
        SBuf b = {0};
        for (size_t k = 0; k < n; k++) {
            Val v = items[k];
            if (have[1] && slot[1].kind != V_NONE && attr_path(r, at, v, slot[1], &v)) return -1;
            if ((k && d && sb_put(r, &b, d->s, d->len)) || str_val(r, v, &b, 0)) return add_pos(r, at);
        }
        return ret_str(r, at, sb_take(r, &b), out);
    }
    case F_LENGTH: {
        int64_t len = 0;
        if (py_len(r, at, in, &len)) return -1;
        *out = v_int(len);
        return 0;
    }
    case F_LIST:
        if (iterate(r, at, in, &items, &n)) return -1;
        *out = mk_list(r, items, n, LF_PLAIN);
        return out->kind < 0 ? add_pos(r, at) : 0;
    case F_MAP: return map_filter(r, at, in, a, out);
    case F_MAX:
    case F_MIN: return minmax_filter(r, at, id == F_MAX, in, slot, have, out);
    case F_SELECT:
    case F_REJECT:
    case F_SELECTATTR:
    case F_REJECTATTR: return select_filter(r, at, id, in, a, out);
    case F_REPLACE: {
        Str *old, *rep;
        int64_t count = -1;
        if (!have[0] || !have[1]) return rfail(r, at, "replace() needs old and new");
        if (!(s = to_str(r, in)) || !(old = to_str(r, slot[0])) || !(rep = to_str(r, slot[1]))) return add_pos(r, at);
        if (have[2] && slot[2].kind != V_NONE && want_int(r, at, slot[2], what, &count)) return -1;
        return ret_str(r, at, str_replace(r, s, old, rep, count), out);
    }
    case F_REVERSE: {
        if (in.kind == V_STR) {
            Str *x = in.u.p;
            SBuf b = {0};
            size_t *off = cp_offsets(r, x);
            if (!off) return add_pos(r, at);
            for (size_t k = x->ncp; k-- > 0;)
                if (sb_put(r, &b, x->s + off[k], off[k + 1] - off[k])) return add_pos(r, at);
            return ret_str(r, at, sb_take(r, &b), out);
        }
        int gen_in = in.kind == V_LIST && ((List *)in.u.p)->flavor == LF_GEN;
        if (iterate(r, at, in, &items, &n)) return -1;
        List *l = list_new(r, n, gen_in ? LF_PLAIN : LF_GEN); /* reversed() is an iterator; a generator becomes a list */
        if (!l) return add_pos(r, at);
        for (size_t k = 0; k < n; k++) l->v[k] = items[n - 1 - k];
        *out = v_ptr(V_LIST, l);
        return 0;
    }
    case F_ROUND: {
        int64_t prec = 0;
        int method = 0; /* 0 common, 1 ceil, 2 floor */
        if (have[0] && want_int(r, at, slot[0], what, &prec)) return -1;
        if (have[1]) {
            Str *m;
            if (want_str(r, at, slot[1], what, &m)) return -1;
            if (!strcmp(m->s, "ceil")) method = 1;
            else if (!strcmp(m->s, "floor")) method = 2;
            else if (strcmp(m->s, "common")) return rfail(r, at, "method must be common, ceil or floor");
        }
        if (in.kind == V_UNDEF) return undef_fail(r, at, in);
        if (!is_num(in)) return rfail(r, at, "type %s doesn't define __round__ method", type_name(in));
        if (method == 0 && in.kind != V_FLOAT) { /* round(int, n): an int; n < 0 rounds half to even */
            int64_t x = in.u.i, p = 1;
            for (int64_t k = 0; k < -prec && p <= INT64_MAX / 10; k++) p *= 10;
            if (prec < 0 && -prec > 18) {
                *out = v_int(0);
                return 0;
            }
            if (prec < 0) {
                int64_t q = x / p, m = x % p;
                if (m < 0) q--, m += p;
                if (2 * (uint64_t)m > (uint64_t)p || (2 * (uint64_t)m == (uint64_t)p && (q & 1))) q++;
                if (__builtin_mul_overflow(q, p, &x)) return rfail(r, at, "integer overflow");
            }
            *out = v_int(x);
            return 0;
        }
        double x = num_f(in), p10 = pow(10.0, (double)prec);
        if (method) {
            *out = v_float((method == 1 ? ceil(x * p10) : floor(x * p10)) / p10);
            return 0;
        }
        if (!isfinite(x) || prec > 300) {
            *out = v_float(x);
            return 0;
        }
        char buf[400]; /* correctly rounded, ties to even on the exact binary value: what Python's round does */
        if (prec >= 0) {
            snprintf(buf, sizeof buf, "%.*f", (int)prec, x);
            *out = v_float(strtod(buf, NULL));
        } else {
            *out = v_float(nearbyint(x / pow(10.0, (double)-prec)) * pow(10.0, (double)-prec));
        }
        return 0;
    }
    case F_SAFE:
    case F_STRING:
        if (!(s = to_str(r, in))) return add_pos(r, at);
        *out = v_markup(s, id == F_SAFE || (in.kind == V_STR && in.markup));
        return 0;
    case F_SORT: {
        int rev = have[0] && truthy(slot[0]), cs = have[1] && truthy(slot[1]);
        if (iterate(r, at, in, &items, &n)) return -1;
        List *l = list_new(r, n, LF_PLAIN);
        Val *keys = ralloc(r, (n + 1) * sizeof *keys);
        if (!l || !keys) return add_pos(r, at);
        for (size_t k = 0; k < n; k++) {
            l->v[k] = items[k];
            Val key = items[k];
            Str *attrs = have[2] && slot[2].kind == V_STR ? slot[2].u.p : NULL;
            if (attrs && memchr(attrs->s, ',', attrs->len)) { /* "age,name": a list of keys */
                Val parts;
                if (str_split(r, at, attrs, rstrz(r, ","), -1, 0, &parts)) return -1;
                List *pl = parts.u.p, *kl = list_new(r, pl->n, LF_PLAIN);
                if (!kl) return add_pos(r, at);
                for (size_t j = 0; j < pl->n; j++)
                    if (attr_path(r, at, items[k], pl->v[j], &kl->v[j]) || fold_key(r, kl->v[j], cs, &kl->v[j])) return -1;
                keys[k] = v_ptr(V_LIST, kl);
                continue;
            }
            if (have[2] && slot[2].kind != V_NONE && attr_path(r, at, items[k], slot[2], &key)) return -1;
            if (fold_key(r, key, cs, &keys[k])) return add_pos(r, at);
        }
        if (merge_sort(r, l->v, keys, n, rev)) return add_pos(r, at);
        *out = v_ptr(V_LIST, l);
        return 0;
    }
    case F_SUM: {
        Val acc = have[1] ? slot[1] : v_int(0);
        if (iterate(r, at, in, &items, &n)) return -1;
        for (size_t k = 0; k < n; k++) {
            Val v = items[k];
            if (have[0] && slot[0].kind != V_NONE && attr_path(r, at, v, slot[0], &v)) return -1;
            if (acc.kind == V_STR) return rfail(r, at, "sum() can't sum strings [use ''.join(seq) instead]");
            if (arith(r, at, OP_ADD, acc, v, &acc)) return -1;
        }
        *out = acc;
        return 0;
    }
    case F_TOJSON: return tojson_filter(r, at, in, slot, have, out);
    case F_TRIM: {
        Str *chars = NULL;
        if (have[0] && slot[0].kind != V_NONE && want_str(r, at, slot[0], what, &chars)) return -1;
        if (!(s = to_str(r, in))) return add_pos(r, at);
        if (ret_str(r, at, str_strip(r, s, chars, 1, 1), out)) return -1;
        out->markup = in.kind == V_STR && in.markup;
        return 0;
    }
    case F_UNIQUE: {
        int cs = have[0] && truthy(slot[0]);
        if (iterate(r, at, in, &items, &n)) return -1;
        Dict *seen = dict_new(r);
        Val *kept = NULL;
        size_t nk = 0, cap = 0;
        if (!seen) return add_pos(r, at);
        for (size_t k = 0; k < n; k++) {
            Val key = items[k];
            if (have[1] && slot[1].kind != V_NONE && attr_path(r, at, key, slot[1], &key)) return -1;
            if (fold_key(r, key, cs, &key)) return add_pos(r, at);
            long e = dict_find(r, seen, key);
            if (e == -2) return add_pos(r, at);
            if (e >= 0) continue;
            if (dict_set(r, seen, key, v_none()) || list_push(r, &kept, &nk, &cap, items[k])) return add_pos(r, at);
        }
        *out = mk_list(r, kept, nk, LF_GEN);
        return out->kind < 0 ? add_pos(r, at) : 0;
    }
    case F_WORDCOUNT: {
        if (!(s = to_str(r, in))) return add_pos(r, at);
        int64_t words = 0;
        int inword = 0;
        for (size_t i = 0; i < s->len;) {
            uint32_t c = u8_dec(s->s, &i);
            int w = c == '_' || cp_alpha(r, c) || cp_digit(r, c);
            words += w && !inword;
            inword = w;
        }
        *out = v_int(words);
        return 0;
    }
    }
    return rfail(r, at, "unsupported filter '%s'", name);
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Tests */

static int do_test(R *r, const Node *at, int tid, Val v, const Args *a, int *res) {
    int id = test_table[tid].id;
    if (a->nkw) return rfail(r, at, "test '%s' takes no keyword arguments", test_table[tid].name);
    if (a->npos != test_table[tid].nargs)
        return rfail(r, at, "test '%s' takes %d argument(s) (%d given)", test_table[tid].name, test_table[tid].nargs, a->npos);
    Val x = a->npos ? a->pos[0] : v_none();
    switch (id) {
    case T_DEFINED: *res = v.kind != V_UNDEF; return 0;
    case T_UNDEFINED: *res = v.kind == V_UNDEF; return 0;
    case T_NONE: *res = v.kind == V_NONE; return 0;
    case T_BOOLEAN: *res = v.kind == V_BOOL; return 0;
    case T_FALSE: *res = v.kind == V_BOOL && !v.u.i; return 0;
    case T_TRUE: *res = v.kind == V_BOOL && v.u.i; return 0;
    case T_INTEGER: *res = v.kind == V_INT; return 0;
    case T_FLOATT: *res = v.kind == V_FLOAT; return 0;
    case T_NUMBER: *res = is_num(v); return 0;
    case T_STRING: *res = v.kind == V_STR; return 0;
    case T_MAPPING: *res = v.kind == V_DICT; return 0;
    case T_ITERABLE:
        *res = v.kind == V_UNDEF || v.kind == V_STR || v.kind == V_LIST || v.kind == V_TUPLE || v.kind == V_DICT ||
               v.kind == V_LOOP;
        return 0;
    case T_SEQUENCE:
        *res = v.kind == V_UNDEF || v.kind == V_STR || v.kind == V_TUPLE || v.kind == V_DICT ||
               (v.kind == V_LIST && ((List *)v.u.p)->flavor == LF_PLAIN);
        return 0;
    case T_CALLABLE: *res = v.kind == V_MACRO || v.kind == V_FUNC || v.kind == V_METHOD; return 0;
    case T_SAMEAS: /* Python's `is`: singletons, small ints, the same object */
        if (v.kind != x.kind) *res = 0;
        else if (v.kind == V_NONE || v.kind == V_BOOL) *res = v.kind == V_NONE || v.u.i == x.u.i;
        else if (v.kind == V_INT) *res = v.u.i == x.u.i && v.u.i >= -5 && v.u.i <= 256;
        else if (v.kind == V_FLOAT || v.kind == V_UNDEF) *res = 0;
        else if (v.kind == V_FUNC) *res = v.u.i == x.u.i;
        else *res = v.u.p == x.u.p;
        return 0;
    case T_EQ: return compare(r, at, CMP_EQ, v, x, res);
    case T_NE: return compare(r, at, CMP_NE, v, x, res);
    case T_LT: return compare(r, at, CMP_LT, v, x, res);
    case T_LE: return compare(r, at, CMP_LE, v, x, res);
    case T_GT: return compare(r, at, CMP_GT, v, x, res);
    case T_GE: return compare(r, at, CMP_GE, v, x, res);
    case T_IN: return contains(r, at, v, x, res);
    case T_ODD:
    case T_EVEN:
    case T_DIVISIBLEBY: {
        Val m;
        if (arith(r, at, OP_MOD, v, id == T_DIVISIBLEBY ? x : v_int(2), &m)) return -1;
        *res = id == T_ODD ? num_cmp(m, v_int(1)) == 0 : num_cmp(m, v_int(0)) == 0;
        return 0;
    }
    case T_LOWER:
    case T_UPPER: {
        Str *s = to_str(r, v);
        if (!s) return add_pos(r, at);
        Method m = {v_ptr(V_STR, s), id == T_LOWER ? M_ISLOWER : M_ISUPPER};
        Args none = {0};
        Val out;
        if (call_method(r, at, &m, &none, &out)) return -1;
        *res = (int)out.u.i;
        return 0;
    }
    case T_FILTER:
    case T_TEST: {
        *res = 0;
        if (v.kind != V_STR) return 0;
        const char *s = ((Str *)v.u.p)->s;
        if (id == T_TEST) {
            *res = test_lookup(s) >= 0;
        } else {
            *res = filter_lookup(s) >= 0;
            for (size_t k = 0; k < ZY_ARRAY_LEN(filters_unsupported); k++) *res |= !strcmp(filters_unsupported[k], s);
        }
        return 0;
    }
    case T_ESCAPED: *res = v.kind == V_STR && v.markup; return 0;
    }
    return rfail(r, at, "unsupported test '%s'", test_table[tid].name);
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

static void r_init(R *r, const ChatRenderOpts *o, ZyErr *err) {
    memset(r, 0, sizeof *r);
    ar_init(&r->ar, o && o->max_memory ? o->max_memory : DEFAULT_MAX_MEMORY);
    r->err = err;
    r->max_output = o && o->max_output ? o->max_output : DEFAULT_MAX_OUTPUT;
    r->max_steps = o && o->max_steps > 0 ? o->max_steps : DEFAULT_MAX_STEPS;
    r->have_now = o ? o->have_now : 0;
    r->now = o ? o->now : 0;
    r->loc = newlocale(LC_CTYPE_MASK, "C.UTF-8", (locale_t)0);
}

static void r_free(R *r) {
    ar_destroy(&r->ar);
    if (r->loc) freelocale(r->loc);
}

static int render_vars(const ChatTemplate *t, R *r, Dict *vars, char **out, size_t *out_len) {
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

int chat_template_render(const ChatTemplate *t, const char *vars_json, size_t vars_len, const ChatRenderOpts *opts,
                         char **out, size_t *out_len, ZyErr *err) {
    R r;
    Val vars;
    *out = NULL;
    if (out_len) *out_len = 0;
    r_init(&r, opts, err);
    int rc = json_parse(&r, vars_json, vars_len, "template variables", &vars);
    if (!rc && vars.kind != V_DICT) rc = zy_fail(err, "template variables: a JSON object is required");
    if (!rc) rc = render_vars(t, &r, vars.u.p, out, out_len);
    r_free(&r);
    return rc;
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Model folders: where transformers finds the template and the special tokens */

const char *const chat_special_names[CHAT_N_SPECIAL] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                                        "pad_token", "cls_token", "mask_token"};

void chat_config_free(ChatConfig *cfg) {
    if (!cfg) return;
    free(cfg->source);
    free(cfg->tool_source);
    for (int k = 0; k < CHAT_N_SPECIAL; k++) free(cfg->special[k]);
    memset(cfg, 0, sizeof *cfg);
}

static int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static char *dup_str(const Str *s) {
    char *p = malloc(s->len + 1);
    if (p) memcpy(p, s->s, s->len + 1);
    return p;
}

/* Fills the special tokens still missing from a tokenizer_config.json / special_tokens_map.json image. */
static int read_specials(const Dict *d, ChatConfig *cfg, ZyErr *err) {
    for (int k = 0; k < CHAT_N_SPECIAL; k++) {
        if (cfg->special[k]) continue;
        Val *v = dict_get_s(d, chat_special_names[k], strlen(chat_special_names[k]));
        if (!v) continue;
        if (v->kind == V_DICT) v = dict_get_s(v->u.p, "content", 7); /* an AddedToken object */
        if (!v || v->kind != V_STR) continue;
        if (!(cfg->special[k] = dup_str(v->u.p))) return zy_fail(err, "out of memory");
    }
    return 0;
}

/* tokenizer_config.json's "chat_template" as a list of {name, template}: "default" and "tool_use". */
static int read_named_templates(const List *l, const char *config, ChatConfig *cfg, ZyErr *err) {
    char names[256] = "";
    for (size_t k = 0; k < l->n; k++) {
        if (l->v[k].kind != V_DICT) continue;
        Val *nm = dict_get_s(l->v[k].u.p, "name", 4), *tp = dict_get_s(l->v[k].u.p, "template", 8);
        if (!nm || nm->kind != V_STR || !tp || tp->kind != V_STR) continue;
        const char *name = ((Str *)nm->u.p)->s;
        if (strlen(names) + strlen(name) + 8 < sizeof names)
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s'%s'", names[0] ? ", " : "", name);
        char **dst = !strcmp(name, "default") ? &cfg->source : !strcmp(name, "tool_use") ? &cfg->tool_source : NULL;
        size_t *dlen = dst == &cfg->source ? &cfg->source_len : &cfg->tool_source_len;
        if (!dst || *dst) continue;
        if (!(*dst = dup_str(tp->u.p))) return zy_fail(err, "out of memory");
        *dlen = ((Str *)tp->u.p)->len;
    }
    if (!cfg->source)
        return zy_fail(err, "%s: chat_template has several templates and none named 'default' (%s)", config, names);
    snprintf(cfg->origin, sizeof cfg->origin, "%.400s: chat_template 'default'", config);
    return 0;
}

int chat_config_load(const char *path, ChatConfig *cfg, ZyErr *err) {
    memset(cfg, 0, sizeof *cfg);
    char dir[4096], file[4200], jinja[4200] = "", config[4200];
    struct stat st;
    if (stat(path, &st) != 0) return zy_fail(err, "%s: %s", path, strerror(errno));
    size_t plen = strlen(path);
    if (plen >= sizeof dir) return zy_fail(err, "%s: path too long", path);
    if (S_ISDIR(st.st_mode)) {
        memcpy(dir, path, plen + 1);
    } else {
        const char *slash = strrchr(path, '/');
        if (plen > 6 && !strcmp(path + plen - 6, ".jinja")) snprintf(jinja, sizeof jinja, "%s", path);
        if (slash) {
            memcpy(dir, path, (size_t)(slash - path));
            dir[slash - path] = '\0';
            if (!dir[0]) snprintf(dir, sizeof dir, "/");
        } else {
            snprintf(dir, sizeof dir, ".");
        }
    }
    snprintf(config, sizeof config, "%s/tokenizer_config.json", dir);
    if (!jinja[0]) {
        snprintf(file, sizeof file, "%s/chat_template.jinja", dir);
        if (file_exists(file)) snprintf(jinja, sizeof jinja, "%s", file);
    }
    R r;
    r_init(&r, NULL, err);
    int rc = -1;
    char *text = NULL;
    size_t len;
    if (jinja[0]) {
        if (zy_read_file(jinja, &cfg->source, &cfg->source_len, err)) goto done;
        snprintf(cfg->origin, sizeof cfg->origin, "%.500s", jinja);
        snprintf(file, sizeof file, "%s/additional_chat_templates/tool_use.jinja", dir);
        if (file_exists(file) && zy_read_file(file, &cfg->tool_source, &cfg->tool_source_len, err)) goto done;
    }
    const char *maps[2] = {config, NULL};
    char map2[4200];
    snprintf(map2, sizeof map2, "%s/special_tokens_map.json", dir);
    maps[1] = map2;
    for (int m = 0; m < 2; m++) {
        if (!file_exists(maps[m])) continue;
        Val v;
        if (zy_read_file(maps[m], &text, &len, err) || json_parse(&r, text, len, maps[m], &v)) goto done;
        free(text);
        text = NULL;
        if (v.kind != V_DICT) {
            zy_fail(err, "%s: a JSON object is required", maps[m]);
            goto done;
        }
        if (read_specials(v.u.p, cfg, err)) goto done;
        Val *t = m == 0 && !cfg->source ? dict_get_s(v.u.p, "chat_template", 13) : NULL;
        if (t && t->kind == V_STR) {
            if (!(cfg->source = dup_str(t->u.p))) {
                zy_fail(err, "out of memory");
                goto done;
            }
            cfg->source_len = ((Str *)t->u.p)->len;
            snprintf(cfg->origin, sizeof cfg->origin, "%.400s: chat_template", config);
        } else if (t && t->kind == V_LIST && read_named_templates(t->u.p, config, cfg, err)) {
            goto done;
        }
    }
    if (!cfg->source) {
        zy_fail(err, "%s: no chat template (neither chat_template.jinja nor a \"chat_template\" in tokenizer_config.json)", dir);
        goto done;
    }
    rc = 0;
done:
    free(text);
    r_free(&r);
    if (rc) chat_config_free(cfg);
    return rc;
}

/* ------------------------------------------------------------------------------------------------------------ */
/* apply_chat_template */

struct ChatRenderer {
    ChatTemplate *tpl, *tool_tpl; /* tool_tpl: transformers' "tool_use" template, used when tools are given */
    char origin[512];
    char *special[CHAT_N_SPECIAL];
};

void chat_renderer_free(ChatRenderer *c) {
    if (!c) return;
    chat_template_free(c->tpl);
    chat_template_free(c->tool_tpl);
    for (int k = 0; k < CHAT_N_SPECIAL; k++) free(c->special[k]);
    free(c);
}

int chat_renderer_new(const ChatConfig *cfg, ChatRenderer **out, ZyErr *err) {
    *out = NULL;
    ChatRenderer *c = calloc(1, sizeof *c);
    if (!c) return zy_fail(err, "out of memory");
    snprintf(c->origin, sizeof c->origin, "%s", cfg->origin);
    for (int k = 0; k < CHAT_N_SPECIAL; k++)
        if (cfg->special[k] && !(c->special[k] = strdup(cfg->special[k]))) {
            chat_renderer_free(c);
            return zy_fail(err, "out of memory");
        }
    if (chat_template_parse(cfg->source, cfg->source_len, &c->tpl, err) ||
        (cfg->tool_source && chat_template_parse(cfg->tool_source, cfg->tool_source_len, &c->tool_tpl, err))) {
        zy_wrap(err, "%s%s", cfg->origin, c->tpl ? " (tool_use)" : "");
        chat_renderer_free(c);
        return -1;
    }
    *out = c;
    return 0;
}

/* transformers' _normalize_chat_messages (drop None values) and _alias_reasoning_fields. */
static int normalize_messages(R *r, Val msgs, Val *out) {
    if (msgs.kind != V_LIST) return zy_fail(r->err, "messages: a JSON list of message objects is required");
    List *l = msgs.u.p, *o = list_new(r, l->n, LF_PLAIN);
    if (!o) return -1;
    if (l->n == 0) return zy_fail(r->err, "messages: the conversation is empty");
    static const char *const reasoning_keys[] = {"reasoning_content", "thinking", "reasoning"};
    for (size_t i = 0; i < l->n; i++) {
        if (l->v[i].kind != V_DICT) return zy_fail(r->err, "messages: message %zu is not a JSON object", i);
        Dict *m = l->v[i].u.p, *d = dict_new(r);
        if (!d) return -1;
        Val *reason = NULL;
        for (size_t k = 0; k < ZY_ARRAY_LEN(reasoning_keys) && !reason; k++) {
            Val *x = dict_get_s(m, reasoning_keys[k], strlen(reasoning_keys[k]));
            if (x && x->kind != V_NONE) reason = x;
        }
        Str *thinking = reason ? rstrz(r, "thinking") : NULL, *rc = reason ? rstrz(r, "reasoning_content") : NULL;
        if (reason && (!thinking || !rc || dict_set(r, d, v_ptr(V_STR, thinking), *reason))) return -1;
        for (size_t k = 0; k < m->n; k++)
            if (m->v[k].kind != V_NONE && dict_set(r, d, m->k[k], m->v[k])) return -1;
        if (reason && dict_set(r, d, v_ptr(V_STR, rc), *reason)) return -1;
        o->v[i] = v_ptr(V_DICT, d);
    }
    *out = v_ptr(V_LIST, o);
    return 0;
}

static int set_var(R *r, Dict *vars, const char *name, Val v) {
    Str *k = rstrz(r, name);
    return k ? dict_set(r, vars, v_ptr(V_STR, k), v) : -1;
}

static const char *const reserved_vars[] = {"messages", "tools", "documents", "add_generation_prompt"};

/* The variables of one apply_chat_template call: special tokens, then extra (the caller's kwargs, which win over
 * them), then messages / tools / documents / add_generation_prompt; renders with the template tools pick. */
static int render_chat(const ChatRenderer *c, R *r, Val msgs, Val tools, Val documents, Val agp, const Dict *extra,
                       char **out, size_t *out_len) {
    Dict *vars = dict_new(r);
    if (!vars) return -1;
    for (int k = 0; k < CHAT_N_SPECIAL; k++) {
        Str *s = c->special[k] ? rstrz(r, c->special[k]) : NULL;
        if (c->special[k] && (!s || set_var(r, vars, chat_special_names[k], v_ptr(V_STR, s)))) return -1;
    }
    for (size_t k = 0; extra && k < extra->n; k++) {
        Str *name = extra->k[k].u.p;
        for (size_t j = 0; j < ZY_ARRAY_LEN(reserved_vars); j++)
            if (!strcmp(name->s, reserved_vars[j]))
                return zy_fail(r->err, "the variable '%s' is set from the conversation itself", name->s);
        if (dict_set(r, vars, extra->k[k], extra->v[k])) return -1;
    }
    if (normalize_messages(r, msgs, &msgs) || set_var(r, vars, "messages", msgs)) return -1;
    if (tools.kind == V_LIST) {
        List *l = tools.u.p;
        for (size_t k = 0; k < l->n; k++)
            if (l->v[k].kind != V_DICT)
                return zy_fail(r->err, "tools: tool %zu is not a JSON object (a JSON schema is expected)", k);
    } else if (tools.kind != V_NONE) {
        return zy_fail(r->err, "tools: a JSON list of tool schemas is required");
    }
    if (documents.kind == V_LIST) {
        List *l = documents.u.p;
        for (size_t k = 0; k < l->n; k++)
            if (l->v[k].kind != V_DICT) return zy_fail(r->err, "documents: document %zu is not a JSON object", k);
    } else if (documents.kind != V_NONE) {
        return zy_fail(r->err, "documents: a JSON list of documents is required");
    }
    if (set_var(r, vars, "tools", tools) || set_var(r, vars, "documents", documents) ||
        set_var(r, vars, "add_generation_prompt", agp))
        return -1;
    r->need_pos = 0;
    const ChatTemplate *t = tools.kind != V_NONE && c->tool_tpl ? c->tool_tpl : c->tpl;
    return render_vars(t, r, vars, out, out_len);
}

int chat_renderer_render(const ChatRenderer *c, const ChatInput *in, const ChatRenderOpts *opts, char **out,
                         size_t *out_len, ZyErr *err) {
    *out = NULL;
    if (out_len) *out_len = 0;
    R r;
    r_init(&r, opts, err);
    int rc = -1;
    Val msgs, tools = v_none(), v;
    Dict *extra = dict_new(&r);
    if (!extra) goto done;
    for (int k = 0; k < in->n_sets; k++) { /* NAME=VALUE: JSON, else a string */
        const char *eq = strchr(in->sets[k], '=');
        if (!eq || eq == in->sets[k]) {
            zy_fail(err, "--set \"%s\": NAME=VALUE expected", in->sets[k]);
            goto done;
        }
        Str *name = rstr(&r, in->sets[k], (size_t)(eq - in->sets[k]));
        if (!name) goto done;
        for (size_t j = 0; j < ZY_ARRAY_LEN(reserved_vars); j++)
            if (!strcmp(name->s, reserved_vars[j])) {
                zy_fail(err, "--set %s: that variable is set from the command's own options", name->s);
                goto done;
            }
        size_t vlen = strlen(eq + 1), bad;
        if (!u8_valid(eq + 1, vlen, &bad)) {
            zy_fail(err, "--set %s: not valid UTF-8", name->s);
            goto done;
        }
        ZyErr quiet;
        r.err = &quiet;
        int not_json = json_parse(&r, eq + 1, vlen, "--set", &v);
        r.err = err;
        r.need_pos = 0;
        if (not_json) {
            Str *s = rstr(&r, eq + 1, vlen);
            if (!s) goto done;
            v = v_ptr(V_STR, s);
        }
        if (dict_set(&r, extra, v_ptr(V_STR, name), v)) goto done;
    }
    if (json_parse(&r, in->messages_json, in->messages_len, "messages", &msgs)) goto done;
    if (in->tools_json && json_parse(&r, in->tools_json, in->tools_len, "tools", &tools)) goto done;
    rc = render_chat(c, &r, msgs, tools, v_none(), v_bool(in->add_generation_prompt), extra, out, out_len);
done:
    r_free(&r);
    if (rc && !err->msg[0]) zy_fail(err, "chat template: failed");
    return rc;
}

int chat_renderer_render_json(const ChatRenderer *c, const char *json, size_t len, int add_generation_prompt,
                              const ChatRenderOpts *opts, char **out, size_t *out_len, ZyErr *err) {
    *out = NULL;
    if (out_len) *out_len = 0;
    R r;
    r_init(&r, opts, err);
    int rc = -1;
    Val obj;
    Dict *extra = dict_new(&r);
    if (!extra || json_parse(&r, json, len, "conversation", &obj)) goto done;
    if (obj.kind != V_DICT) {
        zy_fail(err, "conversation: a JSON object with \"messages\" is required");
        goto done;
    }
    Dict *d = obj.u.p;
    Val *msgs = dict_get_s(d, "messages", 8), *tools = dict_get_s(d, "tools", 5), *docs = dict_get_s(d, "documents", 9),
        *agp = dict_get_s(d, "add_generation_prompt", 21);
    if (!msgs) {
        zy_fail(err, "conversation: no \"messages\"");
        goto done;
    }
    for (size_t k = 0; k < d->n; k++) { /* every other member is a template variable */
        const Str *name = d->k[k].u.p;
        int reserved = 0;
        for (size_t j = 0; j < ZY_ARRAY_LEN(reserved_vars); j++) reserved |= !strcmp(name->s, reserved_vars[j]);
        if (!reserved && dict_set(&r, extra, d->k[k], d->v[k])) goto done;
    }
    rc = render_chat(c, &r, *msgs, tools ? *tools : v_none(), docs ? *docs : v_none(),
                     agp ? *agp : v_bool(add_generation_prompt), extra, out, out_len);
done:
    r_free(&r);
    if (rc && !err->msg[0]) zy_fail(err, "chat template: failed");
    return rc;
}

int chat_render(const ChatConfig *cfg, const ChatInput *in, const ChatRenderOpts *opts, char **out, size_t *out_len,
                ZyErr *err) {
    ChatRenderer *c;
    *out = NULL;
    if (chat_renderer_new(cfg, &c, err)) return -1;
    int rc = chat_renderer_render(c, in, opts, out, out_len, err);
    chat_renderer_free(c);
    return rc;
}

int chat_render_messages_file(const char *template_path, const char *messages_path, char **out, size_t *out_len,
                              ZyErr *err) {
    ChatConfig cfg;
    char *msgs = NULL;
    size_t len;
    *out = NULL;
    if (chat_config_load(template_path, &cfg, err)) return -1;
    if (zy_read_file(messages_path, &msgs, &len, err)) {
        chat_config_free(&cfg);
        return -1;
    }
    ChatInput in = {.messages_json = msgs, .messages_len = len, .add_generation_prompt = 1};
    int rc = chat_render(&cfg, &in, NULL, out, out_len, err);
    if (rc) zy_wrap(err, "%s", messages_path);
    free(msgs);
    chat_config_free(&cfg);
    return rc;
}
