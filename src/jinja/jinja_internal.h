/* jinja_internal: what the engine's files share; not for callers (they have jinja.h, and jinja_value.h for the
 * values). The limits, the syntax tree, and the functions one file of the engine calls in another. */
#ifndef ZAYA_JINJA_INTERNAL_H
#define ZAYA_JINJA_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "jinja/jinja.h"
#include "jinja/jinja_value.h"
#include "util/util.h"

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

struct JinjaTemplate {
    Arena ar; /* the tree and its constants */
    Node *root;
};

/* ------------------------------------------------------------------------------------------------------------ */
/* jinja_parse.c: Python white space in (valid UTF-8) text, which the lexer and str.split / str.strip share */

size_t ws_at(const char *s, size_t n, size_t i);  /* the byte length of the white space at s[i], or 0 */
size_t skip_ws(const char *s, size_t n, size_t i); /* the position after the white space at s[i] */
size_t rstrip_len(const char *s, size_t n);        /* the length of s without its trailing white space */

/* ------------------------------------------------------------------------------------------------------------ */
/* jinja_eval.c */

/* Errors: rfail at a node's line:column (at NULL: the innermost node's, added on the way up by add_pos); -1 */
int rfail(R *r, const Node *at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int add_pos(R *r, const Node *at);
int undef_fail(R *r, const Node *at, Val u);                                    /* jinja2's UndefinedError */
Val mk_undef(R *r, const char *fmt, ...) __attribute__((format(printf, 2, 3))); /* an Undefined with its message */
const char *obj_type_repr(Val v);

/* Case mapping and character classes */
int cp_alpha(R *r, uint32_t c);
int cp_digit(R *r, uint32_t c);
enum { CASE_UPPER, CASE_LOWER, CASE_CAPITALIZE, CASE_TITLE_FILTER, CASE_TITLE_METHOD };
Str *str_case(R *r, const Str *s, int mode);

/* Sequences */
int iterate(R *r, const Node *at, Val v, Val **items, size_t *n); /* the items a for loop (or list()) sees */
Val mk_list(R *r, const Val *items, size_t n, int flavor);        /* kind -1 if it fails */
int py_len(R *r, const Node *at, Val v, int64_t *n);
size_t *cp_offsets(R *r, const Str *s); /* byte offsets of each code point of s (plus the end) */

/* Attribute and item access; the methods */
enum {
    M_STRIP, M_LSTRIP, M_RSTRIP, M_SPLIT, M_RSPLIT, M_SPLITLINES, M_STARTSWITH, M_ENDSWITH, M_UPPER, M_LOWER, M_TITLE,
    M_CAPITALIZE, M_REPLACE, M_FIND, M_RFIND, M_INDEX, M_COUNT, M_JOIN, M_ISDIGIT, M_ISALPHA, M_ISALNUM, M_ISSPACE,
    M_ISUPPER, M_ISLOWER, M_REMOVEPREFIX, M_REMOVESUFFIX, M_GET, M_ITEMS, M_KEYS, M_VALUES, M_COPY, M_LINDEX,
    M_LCOUNT, M_CYCLE, M_UNSUPPORTED
};
int py_attr(R *r, Val v, const Str *name, Val *out); /* a Python attribute of v: 1 found, 0 not, -1 error */
int attr_path_d(R *r, const Node *at, Val obj, Val attr, const Val *def, Val *out); /* jinja2's make_attrgetter */
int attr_path(R *r, const Node *at, Val obj, Val attr, Val *out);

/* Operators */
int html_escape(R *r, const Str *s, SBuf *b); /* markupsafe.escape */
int arith(R *r, const Node *at, int op, Val a, Val b, Val *out);
int contains(R *r, const Node *at, Val needle, Val hay, int *res); /* needle in hay */
int compare(R *r, const Node *at, int op, Val a, Val b, int *res);
int merge_sort(R *r, Val *v, Val *keys, size_t n, int reverse); /* stable sort of v by keys (Python's sorted) */
int fold_key(R *r, Val v, int case_sensitive, Val *out);         /* jinja2's ignore_case */

/* Calls: arguments */
typedef struct {
    Val *pos;
    int npos;
    Str **kwn;
    Val *kwv;
    int nkw;
} Args;

/* Binds arguments to named parameters ("a,b,c"): slot[k] / have[k]. */
int jinja_bind(R *r, const Node *at, const char *what, const char *params, const Args *a, Val *slot, int *have,
               int max);

/* An int (or bool) / a string argument, else the error naming what wanted it. Not inlined: inlined, gcc warns that
 * *out may be read unset after a call (it cannot tell that rfail never returns 0). */
int want_int(R *r, const Node *at, Val v, const char *what, int64_t *out) __attribute__((noinline));
int want_str(R *r, const Node *at, Val v, const char *what, Str **out) __attribute__((noinline));

/* String methods, and the pieces the filters share */
Str *str_strip(R *r, Str *s, const Str *chars, int left, int right); /* chars NULL = white space */
int list_push(R *r, Val **items, size_t *n, size_t *cap, Val v);
int str_split(R *r, const Node *at, Str *s, const Str *sep, int64_t maxsplit, int from_right, Val *out);
int str_splitlines(R *r, const Node *at, Str *s, int keepends, Val *out);
Str *str_replace(R *r, Str *s, const Str *old, const Str *rep, int64_t count);
int call_method(R *r, const Node *at, Method *m, const Args *a, Val *out);

/* ------------------------------------------------------------------------------------------------------------ */
/* jinja_filters.c */

int filter_lookup(const char *name);      /* the filter's index in the table, or -1 */
int test_lookup(const char *name);        /* the test's index in the table, or -1 */
int filter_unsupported(const char *name); /* a jinja2 filter this engine lacks */
int ret_str(R *r, const Node *at, Str *s, Val *out);
int do_filter(R *r, const Node *at, int fid, Val in, const Args *a, Val *out);
int do_test(R *r, const Node *at, int tid, Val v, const Args *a, int *res);

#endif
