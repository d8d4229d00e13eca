/* jinja_value: the engine's values and the context they live in, for the engine's files and for a caller that
 * builds a render's variables itself (tokenizer/chat_template.c: the messages, the special tokens, --set values).
 *
 * A context (R) is one render or one JSON read: an arena that owns every value made in it (so error paths leak
 * nothing and cyclic namespaces cost nothing), the limits and the error. Values are Python's (Val: a kind and a
 * payload in the arena); strings are valid UTF-8; functions that fail set the context's error and return -1 (or
 * NULL). */
#ifndef ZAYA_JINJA_VALUE_H
#define ZAYA_JINJA_VALUE_H

#include <locale.h>
#include <stddef.h>
#include <stdint.h>

#include "jinja/jinja.h"
#include "util/util.h"

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

void ar_init(Arena *a, size_t limit);
void *ar_alloc(Arena *a, size_t n);
void *ar_zalloc(Arena *a, size_t n);
void *ar_realloc(Arena *a, void *p, size_t n);
void ar_free(Arena *a, void *p);
void ar_destroy(Arena *a);

/* UTF-8. Every string inside the engine is valid UTF-8: inputs are checked where they enter. */

int u8_valid(const char *s, size_t n, size_t *bad); /* 1 if valid, else 0 and *bad: the first bad byte's offset */
uint32_t u8_dec(const char *s, size_t *i);          /* the (valid) character at s[*i]; advances *i */
size_t u8_enc(uint32_t c, char *o);                 /* writes c's 1 to 4 bytes, returns how many */
size_t u8_count(const char *s, size_t n);           /* code points */
int py_isspace(uint32_t c);                         /* Python's str.isspace() (and the regex \s of str patterns) */

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

static inline Val v_none(void) { return (Val){.kind = V_NONE}; }
static inline Val v_bool(int b) { return (Val){.kind = V_BOOL, .u.i = b != 0}; }
static inline Val v_int(int64_t i) { return (Val){.kind = V_INT, .u.i = i}; }
static inline Val v_float(double f) { return (Val){.kind = V_FLOAT, .u.f = f}; }
static inline Val v_ptr(int kind, void *p) { return (Val){.kind = kind, .u.p = p}; }
static inline Val v_undef(Str *hint) { return (Val){.kind = V_UNDEF, .u.p = hint}; }
static inline Val v_markup(Str *s, int markup) { return (Val){.kind = V_STR, .markup = markup, .u.p = s}; }

int oom(R *r);                 /* the error for a failed allocation (the memory limit, or malloc); -1 */
void *ralloc(R *r, size_t n);  /* arena memory; NULL and the error if it fails */
/* The step budget also pays for bulk work inside one step: charges units of it; -1 and the error past the limit. */
int charge(R *r, size_t units);
Str *str_new(Arena *a, const char *s, size_t n);
Str *rstr(R *r, const char *s, size_t n);
Str *rstrz(R *r, const char *s);
List *list_new(R *r, size_t n, int kind_flavor);

/* String buffers (arena memory): the output, captured blocks, built strings. */
int sb_reserve(R *r, SBuf *b, size_t extra);
int sb_put(R *r, SBuf *b, const char *s, size_t n);
int sb_puts(R *r, SBuf *b, const char *s);
int sb_putc(R *r, SBuf *b, char c);
int sb_cp(R *r, SBuf *b, uint32_t c);
Str *sb_take(R *r, SBuf *b); /* the buffer's text as a string; the buffer is released */

/* Type names (Python's), truthiness, numbers */
const char *type_name(Val v);
int truthy(Val v);
static inline int is_num(Val v) { return v.kind == V_BOOL || v.kind == V_INT || v.kind == V_FLOAT; }
static inline double num_f(Val v) { return v.kind == V_FLOAT ? v.u.f : (double)v.u.i; }
int num_cmp(Val a, Val b); /* exact three-way comparison of two numbers; 2 = unordered (NaN) */

/* Dicts: insertion-ordered, keys compared and hashed as Python does */
Dict *dict_new(R *r);
long dict_find(R *r, const Dict *d, Val key); /* index of key in d, or -1 (not found), or -2 (error: unhashable) */
int dict_set(R *r, Dict *d, Val key, Val val);
Val *dict_get_s(const Dict *d, const char *k, size_t n); /* lookup by a C string key; NULL if absent */

/* Equality and ordering, Python's (1 / 0, or -1 and the error) */
int val_eq(R *r, Val a, Val b, int depth);
int val_lt(R *r, Val a, Val b, int *lt, int depth);

/* str() and repr(), appended to b; to_str: str(v) as a string value (no copy for strings) */
int str_val(R *r, Val v, SBuf *b, int depth);
int repr_val(R *r, Val v, SBuf *b, int depth);
Str *to_str(R *r, Val v);

/* json.dumps (transformers' tojson: ensure_ascii=False by default; indent, separators, sort_keys) */
typedef struct {
    int ensure_ascii, sort_keys, has_indent;
    Str *indent, *item_sep, *key_sep;
} JsonOpts;
int json_dump(R *r, Val v, SBuf *b, const JsonOpts *o, int level, int depth);
/* Reads one JSON document as Python's json.loads (valid UTF-8, nothing but white space after it); label names it in
 * errors. */
int json_parse(R *r, const char *s, size_t n, const char *label, Val *out);

/* A context for one render or one JSON read (opts NULL: the defaults), and its end: everything made in it goes. */
void r_init(R *r, const JinjaOpts *o, ZyErr *err);
void r_free(R *r);

/* Renders t with vars, a dict made in r, as the template's variables (jinja_eval.c). *out is malloc'ed and
 * NUL-terminated; *out_len excludes the NUL. */
int jinja_render_vars(const JinjaTemplate *t, R *r, Dict *vars, char **out, size_t *out_len);

#endif
