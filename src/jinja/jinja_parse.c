/* jinja_parse: templates into syntax trees. The lexer is jinja2's (trim_blocks, lstrip_blocks, "-" and "+"
 * whitespace control, {% raw %}); the parser is a recursive descent that follows jinja2's grammar. Filters and
 * tests are looked up by name here, once (jinja_filters.c has their tables). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "jinja/jinja.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja/jinja_internal.h"

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
size_t ws_at(const char *s, size_t n, size_t i) {
    if (i >= n) return 0;
    size_t j = i;
    uint32_t c = u8_dec(s, &j);
    return py_isspace(c) ? j - i : 0;
}

size_t skip_ws(const char *s, size_t n, size_t i) {
    size_t k;
    while ((k = ws_at(s, n, i)) != 0) i += k;
    return i;
}

/* Length of text without its trailing Python whitespace (str.rstrip()). */
size_t rstrip_len(const char *s, size_t n) {
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
        if (k < 0) k = filter_unsupported(t->s->s) ? -2 : -1;
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

void jinja_free(JinjaTemplate *t) {
    if (!t) return;
    ar_destroy(&t->ar);
    free(t);
}

int jinja_parse(const char *src, size_t len, JinjaTemplate **out, ZyErr *err) {
    *out = NULL;
    size_t bad;
    if (!u8_valid(src, len, &bad)) return zy_fail(err, "chat template: not valid UTF-8 (byte %zu)", bad);
    JinjaTemplate *t = calloc(1, sizeof *t);
    if (!t) return zy_fail(err, "out of memory");
    ar_init(&t->ar, SIZE_MAX);
    /* newlines normalised; one trailing newline dropped (keep_trailing_newline=False) */
    char *s = ar_alloc(&t->ar, len + 1);
    if (!s) {
        jinja_free(t);
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
        jinja_free(t);
        return -1;
    }
    Parser P = {.t = L.toks, .n = L.n, .ar = &t->ar, .err = err};
    Node *root = nnew(&P, S_BODY, &L.toks[0]);
    int which = -1;
    if (!root || p_body(&P, &root->kids, &root->nkids, NULL, 0, &which) || check_names(&P, root, 0, 0)) {
        jinja_free(t);
        return -1;
    }
    ar_free(&t->ar, L.toks); /* the tree keeps its strings, not the token array */
    t->root = root;
    *out = t;
    return 0;
}
