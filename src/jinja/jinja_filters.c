/* jinja_filters: jinja2's filters and tests, with their tables (looked up by name when a template is parsed), as
 * jinja2 3.1 and transformers define them. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "jinja/jinja.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja/jinja_internal.h"

/* ------------------------------------------------------------------------------------------------------------ */
/* Tables */

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

int filter_lookup(const char *name) {
    for (size_t k = 0; k < ZY_ARRAY_LEN(filter_table); k++)
        if (strcmp(filter_table[k].name, name) == 0) return (int)k;
    return -1;
}

int test_lookup(const char *name) {
    for (size_t k = 0; k < ZY_ARRAY_LEN(test_table); k++)
        if (strcmp(test_table[k].name, name) == 0) return (int)k;
    return -1;
}

/* Whether name is a jinja2 filter this engine lacks (a template using one fails only if it runs). */
int filter_unsupported(const char *name) {
    for (size_t u = 0; u < ZY_ARRAY_LEN(filters_unsupported); u++)
        if (!strcmp(filters_unsupported[u], name)) return 1;
    return 0;
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Filters */

int ret_str(R *r, const Node *at, Str *s, Val *out) {
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

int do_filter(R *r, const Node *at, int fid, Val in, const Args *a, Val *out) {
    int id = filter_table[fid].id;
    const char *name = filter_table[fid].name;
    Val slot[8];
    int have[8];
    char what[64];
    snprintf(what, sizeof what, "filter '%s'", name);
    if (filter_table[fid].params && jinja_bind(r, at, what, filter_table[fid].params, a, slot, have, 8)) return -1;
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

int do_test(R *r, const Node *at, int tid, Val v, const Args *a, int *res) {
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
