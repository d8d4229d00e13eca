/* Byte-level BPE tokenizer, file-compatible with Hugging Face `tokenizers` (tokenizer.json, BPE model,
 * ByteLevel pre-tokenizer and decoder).
 *
 * Pre-tokenization implements the GPT-2 regex
 *     's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * as a hand-written scanner over a Unicode class table (letter / number / white space / other). HF runs the
 * regex with Oniguruma, whose tables are Unicode 16; PCRE2 10.42 (Debian 12) knows only Unicode 14 and would
 * split 9,392 newer letters differently, so the scanner carries its own table, generated from HF itself
 * (tests/oracle/test_tokenizer.py --gen-unicode-table, and checked for every code point by that suite).
 * PCRE2 (UTF + UCP) running the regex itself stays as the reference the unit tests and the fuzzer compare
 * the scanner with. Onig's \s is the White_Space property (U+0085 included, unlike PCRE2's \s).
 *
 * Invalid UTF-8: the text is cut into maximal valid runs; each byte that does not start a valid character
 * (Rust's definition: no overlongs, surrogates or code points above U+10FFFF) is a pre-token of its own and
 * acts like the end of the text for the regex next to it. Every byte has a token, so decode(encode(x)) == x.
 *
 * BPE encoding applies merges exactly as HF's Word::merge_all: repeatedly the adjacent pair of lowest rank,
 * leftmost first. Encoded pre-tokens are cached per Tokenizer (or per TokenizerCache). */
#define _POSIX_C_SOURCE 200809L
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* ---------------------------------------------------------------------------------------------------------
 * Small containers */

typedef struct {
    uint8_t *p;
    size_t n, cap;
} Buf;

static int buf_reserve(Buf *b, size_t extra) {
    if (extra <= b->cap - b->n) return 0;
    size_t need = b->n + extra, cap = b->cap ? b->cap : 256;
    if (need < b->n) return -1;
    while (cap < need) {
        if (cap > SIZE_MAX / 2) return -1;
        cap *= 2;
    }
    uint8_t *q = realloc(b->p, cap);
    if (!q) return -1;
    b->p = q;
    b->cap = cap;
    return 0;
}

static int buf_put(Buf *b, const void *d, size_t n) {
    if (buf_reserve(b, n)) return -1;
    if (n) memcpy(b->p + b->n, d, n);
    b->n += n;
    return 0;
}

static int buf_puts(Buf *b, const char *s) { return buf_put(b, s, strlen(s)); }

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

typedef struct {
    int32_t *p;
    size_t n, cap;
} IdBuf;

static int ids_reserve(IdBuf *b, size_t extra) {
    if (extra <= b->cap - b->n) return 0;
    size_t need = b->n + extra, cap = b->cap ? b->cap : 64;
    if (need < b->n) return -1;
    while (cap < need) {
        if (cap > SIZE_MAX / 8) return -1;
        cap *= 2;
    }
    int32_t *q = realloc(b->p, cap * sizeof *q);
    if (!q) return -1;
    b->p = q;
    b->cap = cap;
    return 0;
}

static int ids_push(IdBuf *b, int32_t id) {
    if (b->n == b->cap && ids_reserve(b, 1)) return -1;
    b->p[b->n++] = id;
    return 0;
}

static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

static uint64_t hash_bytes(const uint8_t *p, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ ((uint64_t)n * 0x100000001B3ULL);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdULL;
        h ^= h >> 29;
        p += 8;
        n -= 8;
    }
    uint64_t w = 0;
    if (n) memcpy(&w, p, n);
    return mix64(h ^ w);
}

/* String -> int64 map, open addressing; keys are copied into an arena. */
typedef struct {
    uint64_t hash;
    uint64_t off;  /* into keys.p */
    uint32_t len;
    uint32_t used;
    int64_t val;
} SmSlot;

typedef struct {
    SmSlot *slots;
    size_t cap, count;
    Buf keys;
} StrMap;

static void sm_free(StrMap *m) {
    free(m->slots);
    free(m->keys.p);
    memset(m, 0, sizeof *m);
}

static SmSlot *sm_find(const StrMap *m, const void *key, size_t len, uint64_t h) {
    if (!m->cap) return NULL;
    size_t mask = m->cap - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
        SmSlot *s = &m->slots[i];
        if (!s->used) return NULL;
        if (s->hash == h && s->len == len && memcmp(m->keys.p + s->off, key, len) == 0) return s;
    }
}

static int sm_grow(StrMap *m) {
    size_t cap = m->cap ? m->cap * 2 : 1024;
    SmSlot *ns = calloc(cap, sizeof *ns);
    if (!ns) return -1;
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->slots[i].used) continue;
        size_t j = m->slots[i].hash & (cap - 1);
        while (ns[j].used) j = (j + 1) & (cap - 1);
        ns[j] = m->slots[i];
    }
    free(m->slots);
    m->slots = ns;
    m->cap = cap;
    return 0;
}

/* Finds or inserts key; *is_new tells which. NULL when out of memory. */
static SmSlot *sm_put(StrMap *m, const void *key, size_t len, uint64_t h, int *is_new) {
    if (len > UINT32_MAX) return NULL;
    if ((m->count + 1) * 2 > m->cap && sm_grow(m)) return NULL;
    size_t mask = m->cap - 1, i = h & mask;
    for (;; i = (i + 1) & mask) {
        SmSlot *s = &m->slots[i];
        if (!s->used) break;
        if (s->hash == h && s->len == len && memcmp(m->keys.p + s->off, key, len) == 0) {
            *is_new = 0;
            return s;
        }
    }
    size_t off = m->keys.n;
    if (buf_put(&m->keys, key, len)) return NULL;
    SmSlot *s = &m->slots[i];
    s->hash = h;
    s->off = off;
    s->len = (uint32_t)len;
    s->used = 1;
    s->val = 0;
    m->count++;
    *is_new = 1;
    return s;
}

/* (uint32, uint32) -> int64 map. */
#define PM_EMPTY UINT64_MAX
typedef struct {
    uint64_t key;
    int64_t val;
} PmSlot;

typedef struct {
    PmSlot *slots;
    size_t cap, count;
} PairMap;

static inline uint64_t pair_key(uint32_t a, uint32_t b) { return (uint64_t)a << 32 | b; }

static void pm_free(PairMap *m) {
    free(m->slots);
    memset(m, 0, sizeof *m);
}

static inline int64_t *pm_get(const PairMap *m, uint64_t key) {
    if (!m->cap) return NULL;
    size_t mask = m->cap - 1;
    for (size_t i = mix64(key) & mask;; i = (i + 1) & mask) {
        if (m->slots[i].key == key) return &m->slots[i].val;
        if (m->slots[i].key == PM_EMPTY) return NULL;
    }
}

static int pm_grow(PairMap *m) {
    size_t cap = m->cap ? m->cap * 2 : 1024;
    PmSlot *ns = malloc(cap * sizeof *ns);
    if (!ns) return -1;
    for (size_t i = 0; i < cap; i++) ns[i].key = PM_EMPTY;
    for (size_t i = 0; i < m->cap; i++) {
        if (m->slots[i].key == PM_EMPTY) continue;
        size_t j = mix64(m->slots[i].key) & (cap - 1);
        while (ns[j].key != PM_EMPTY) j = (j + 1) & (cap - 1);
        ns[j] = m->slots[i];
    }
    free(m->slots);
    m->slots = ns;
    m->cap = cap;
    return 0;
}

/* Finds or inserts (value 0); NULL when out of memory. */
static int64_t *pm_put(PairMap *m, uint64_t key, int *is_new) {
    if ((m->count + 1) * 2 > m->cap && pm_grow(m)) return NULL;
    size_t mask = m->cap - 1, i = mix64(key) & mask;
    for (;; i = (i + 1) & mask) {
        if (m->slots[i].key == key) {
            *is_new = 0;
            return &m->slots[i].val;
        }
        if (m->slots[i].key == PM_EMPTY) break;
    }
    m->slots[i].key = key;
    m->slots[i].val = 0;
    m->count++;
    *is_new = 1;
    return &m->slots[i].val;
}

/* ---------------------------------------------------------------------------------------------------------
 * UTF-8, character classes, the pre-tokenizer */

enum { C_O = 'O', C_L = 'L', C_N = 'N', C_S = 'S', C_X = 'X' /* a byte that starts no valid character */ };

static const char ascii_class[129] =
    "OOOOOOOOOSSSSSOOOOOOOOOOOOOOOOOOSOOOOOOOOOOOOOOONNNNNNNNNNOOOOOOOLLLLLLLLLLLLLLLLLLLLLLLLLLOOOOOO"
    "LLLLLLLLLLLLLLLLLLLLLLLLLLOOOOO";

/* Class of a code point (C_L, C_N, C_S or C_O): the sets of Oniguruma's \p{L}, \p{N} and \s under
 * Unicode 16; defined with its table at the end of the file. */
static int unicode_class(uint32_t cp);

/* Length (1-4) of the valid UTF-8 character at s[0..n), and its code point; 0 if s[0] starts none. */
static inline int utf8_char(const uint8_t *s, size_t n, uint32_t *cp) {
    uint8_t c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    if (c < 0xC2) return 0;
    if (c < 0xE0) {
        if (n < 2 || (s[1] & 0xC0) != 0x80) return 0;
        *cp = (uint32_t)(c & 0x1F) << 6 | (s[1] & 0x3F);
        return 2;
    }
    if (c < 0xF0) {
        if (n < 3) return 0;
        uint8_t lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
        if (s[1] < lo || s[1] > hi || (s[2] & 0xC0) != 0x80) return 0;
        *cp = (uint32_t)(c & 0x0F) << 12 | (uint32_t)(s[1] & 0x3F) << 6 | (s[2] & 0x3F);
        return 3;
    }
    if (c < 0xF5) {
        if (n < 4) return 0;
        uint8_t lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
        if (s[1] < lo || s[1] > hi || (s[2] & 0xC0) != 0x80 || (s[3] & 0xC0) != 0x80) return 0;
        *cp = (uint32_t)(c & 0x07) << 18 | (uint32_t)(s[1] & 0x3F) << 12 | (uint32_t)(s[2] & 0x3F) << 6 | (s[3] & 0x3F);
        return 4;
    }
    return 0;
}

static inline int char_at(const uint8_t *s, size_t n, size_t i, int *len) {
    if (s[i] < 0x80) {
        *len = 1;
        return ascii_class[s[i]];
    }
    uint32_t cp;
    int l = utf8_char(s + i, n - i, &cp);
    if (!l) {
        *len = 1;
        return C_X;
    }
    *len = l;
    return unicode_class(cp);
}

/* End of the pre-token starting at i: the regex's alternatives tried in order, leftmost-first, as a
 * backtracking engine runs them. */
static size_t piece_end(const uint8_t *s, size_t n, size_t i) {
    int l;
    int k = char_at(s, n, i, &l);
    if (k == C_X) return i + 1;
    uint8_t c = s[i];
    if (c == '\'' && i + 1 < n) { /* 's 't 're 've 'm 'll 'd */
        uint8_t d = s[i + 1];
        if (d == 's' || d == 't' || d == 'm' || d == 'd') return i + 2;
        if (i + 2 < n) {
            uint8_t e = s[i + 2];
            if ((d == 'r' && e == 'e') || (d == 'v' && e == 'e') || (d == 'l' && e == 'l')) return i + 3;
        }
    }
    size_t j = i;
    if (c == ' ' && i + 1 < n) { /* " ?" joins a following letter, number or other run */
        int k1 = char_at(s, n, i + 1, &l);
        if (k1 == C_L || k1 == C_N || k1 == C_O) {
            k = k1;
            j = i + 1;
        }
    }
    if (k != C_S) {
        while (j < n && char_at(s, n, j, &l) == k) j += (size_t)l;
        return j;
    }
    /* \s+(?!\S): the whole run if it ends the text (or a valid run), else all but its last character;
     * a single white space before a non-space falls to \s+. */
    size_t last = i;
    while (j < n) {
        if (char_at(s, n, j, &l) != C_S) break;
        last = j;
        j += (size_t)l;
    }
    if (j == n || char_at(s, n, j, &l) == C_X) return j;
    return last > i ? last : j;
}

int tokenizer_pretokenize(const char *text, size_t len, size_t **ends, size_t *n, ZyErr *err) {
    *ends = NULL;
    *n = 0;
    const uint8_t *s = (const uint8_t *)text;
    size_t cap = 0, cnt = 0, *e = NULL;
    for (size_t i = 0; i < len;) {
        size_t j = piece_end(s, len, i);
        if (cnt == cap) {
            size_t nc = cap ? cap * 2 : 64;
            size_t *q = realloc(e, nc * sizeof *q);
            if (!q) {
                free(e);
                return zy_fail(err, "pretokenize: out of memory");
            }
            e = q;
            cap = nc;
        }
        e[cnt++] = j;
        i = j;
    }
    *ends = e;
    *n = cnt;
    return 0;
}

/* GPT-2's byte <-> printable character map: printable Latin-1 bytes stand for themselves, the other 68 bytes
 * for U+0100.. in byte order. */
static uint32_t byte_to_cp(uint8_t b) {
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE) return b;
    if (b <= 0x20) return 0x100u + b;
    if (b <= 0xA0) return b + 162u; /* 0x7F..0xA0 -> U+0121..U+0142 */
    return 0x143;                   /* 0xAD */
}

static int cp_to_byte(uint32_t cp) {
    if ((cp >= 0x21 && cp <= 0x7E) || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF)) return (int)cp;
    if (cp >= 0x100 && cp <= 0x120) return (int)(cp - 0x100);
    if (cp >= 0x121 && cp <= 0x142) return (int)(cp - 162);
    if (cp == 0x143) return 0xAD;
    return -1;
}

/* Appends the byte-level spelling of raw bytes (1 or 2 UTF-8 bytes per byte). */
static int put_bytelevel(Buf *b, const uint8_t *s, size_t n) {
    if (buf_reserve(b, 2 * n)) return -1;
    for (size_t i = 0; i < n; i++) {
        uint32_t cp = byte_to_cp(s[i]);
        if (cp < 0x80) {
            b->p[b->n++] = (uint8_t)cp;
        } else {
            b->p[b->n++] = (uint8_t)(0xC0 | cp >> 6);
            b->p[b->n++] = (uint8_t)(0x80 | (cp & 0x3F));
        }
    }
    return 0;
}

/* Bytes a token's text decodes to, as HF's ByteLevel decoder: each character through the map, or, if any
 * character is outside it, the text's own UTF-8. */
static int token_bytes(const char *text, size_t n, Buf *out) {
    size_t start = out->n;
    const uint8_t *s = (const uint8_t *)text;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int l = utf8_char(s + i, n - i, &cp);
        int b = l ? cp_to_byte(cp) : -1;
        if (b < 0) {
            out->n = start;
            return buf_put(out, text, n);
        }
        uint8_t byte = (uint8_t)b;
        if (buf_put(out, &byte, 1)) return -1;
        i += (size_t)l;
    }
    return 0;
}

/* HF's trainer numbers the byte tokens in the order of their characters' code points. */
static void byte_token_order(int order[256]) {
    int r = 0;
    for (uint32_t cp = 0; cp <= 0x143; cp++) {
        int b = cp_to_byte(cp);
        if (b >= 0) order[b] = r++;
    }
}

/* ---------------------------------------------------------------------------------------------------------
 * The tokenizer */

typedef struct {
    char *text;
    size_t len;
    int32_t id;
    uint8_t special, normalized;
} AddedTok;

struct TokenizerCache {
    const Tokenizer *owner; /* entries are only valid for the tokenizer that made them */
    StrMap map;             /* raw pre-token bytes -> (offset << 16 | count) into ids */
    IdBuf ids;
};

struct Tokenizer {
    int32_t n_ids;      /* largest id + 1 */
    size_t ids_cap;
    char **tok;         /* id -> text (NUL-terminated), NULL for a hole */
    uint32_t *tok_len;
    uint8_t *in_model;  /* id is in model.vocab (not only an added token) */
    Buf dec;            /* decoded bytes of every id, concatenated */
    size_t *dec_off;    /* [n_ids + 1] */
    StrMap vocab;       /* model.vocab text -> id */
    int32_t byte_id[256];
    PairMap merges;     /* (left, right) -> rank << 32 | new id; a repeated pair keeps its last rank, like HF */
    int32_t (*merge_list)[2];
    int32_t n_merges, merges_cap;
    AddedTok *added;
    int n_added;
    int *pass_idx[2];   /* added tokens matched on the raw text (0) then on the "normalized" text (1), longest first */
    int pass_n[2];
    uint8_t first_byte[2][256];
    int32_t unk_id;
    uint8_t fuse_unk, ignore_merges;
    TokenizerCache *cache;
};

#define CACHE_MAX_PIECE 256     /* longer pre-tokens are not cached (as HF) */
#define CACHE_MAX_ENTRIES (1u << 20)

TokenizerCache *tokenizer_cache_new(void) { return calloc(1, sizeof(TokenizerCache)); }

static void cache_clear(TokenizerCache *c) {
    sm_free(&c->map);
    c->ids.n = 0;
}

void tokenizer_cache_free(TokenizerCache *c) {
    if (!c) return;
    sm_free(&c->map);
    free(c->ids.p);
    free(c);
}

void tokenizer_free(Tokenizer *t) {
    if (!t) return;
    for (int32_t i = 0; i < t->n_ids; i++) free(t->tok[i]);
    free(t->tok);
    free(t->tok_len);
    free(t->in_model);
    free(t->dec.p);
    free(t->dec_off);
    sm_free(&t->vocab);
    pm_free(&t->merges);
    free(t->merge_list);
    for (int i = 0; i < t->n_added; i++) free(t->added[i].text);
    free(t->added);
    free(t->pass_idx[0]);
    free(t->pass_idx[1]);
    tokenizer_cache_free(t->cache);
    free(t);
}

static Tokenizer *tok_new(void) {
    Tokenizer *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->unk_id = -1;
    return t;
}

static int tok_reserve_ids(Tokenizer *t, int32_t id) {
    if ((size_t)id < t->ids_cap) return 0;
    size_t cap = t->ids_cap ? t->ids_cap : 512;
    while (cap <= (size_t)id) cap *= 2;
    char **tk = realloc(t->tok, cap * sizeof *tk);
    if (!tk) return -1;
    t->tok = tk;
    uint32_t *tl = realloc(t->tok_len, cap * sizeof *tl);
    if (!tl) return -1;
    t->tok_len = tl;
    uint8_t *im = realloc(t->in_model, cap);
    if (!im) return -1;
    t->in_model = im;
    for (size_t i = t->ids_cap; i < cap; i++) {
        tk[i] = NULL;
        tl[i] = 0;
        im[i] = 0;
    }
    t->ids_cap = cap;
    return 0;
}

/* Sets the text of id (the caller checked it is free). */
static int tok_set_text(Tokenizer *t, int32_t id, const char *text, size_t len, int in_model) {
    if (tok_reserve_ids(t, id)) return -1;
    char *c = malloc(len + 1);
    if (!c) return -1;
    memcpy(c, text, len);
    c[len] = '\0';
    t->tok[id] = c;
    t->tok_len[id] = (uint32_t)len;
    t->in_model[id] |= (uint8_t)in_model;
    if (id >= t->n_ids) t->n_ids = id + 1;
    return 0;
}

static int tok_add_vocab(Tokenizer *t, const char *text, size_t len, int32_t id) {
    int is_new;
    SmSlot *s = sm_put(&t->vocab, text, len, hash_bytes((const uint8_t *)text, len), &is_new);
    if (!s) return -1;
    s->val = id;
    return tok_set_text(t, id, text, len, 1);
}

static int tok_add_merge(Tokenizer *t, int32_t a, int32_t b, int32_t new_id) {
    if (t->n_merges == t->merges_cap) {
        int32_t cap = t->merges_cap ? t->merges_cap * 2 : 1024;
        void *q = realloc(t->merge_list, (size_t)cap * sizeof *t->merge_list);
        if (!q) return -1;
        t->merge_list = q;
        t->merges_cap = cap;
    }
    int32_t rank = t->n_merges++;
    t->merge_list[rank][0] = a;
    t->merge_list[rank][1] = b;
    int is_new;
    int64_t *v = pm_put(&t->merges, pair_key((uint32_t)a, (uint32_t)b), &is_new);
    if (!v) return -1;
    *v = (int64_t)rank << 32 | (uint32_t)new_id;
    return 0;
}

static int tok_add_added(Tokenizer *t, const char *text, size_t len, int32_t id, int special, int normalized) {
    void *q = realloc(t->added, (size_t)(t->n_added + 1) * sizeof *t->added);
    if (!q) return -1;
    t->added = q;
    AddedTok *a = &t->added[t->n_added];
    a->text = malloc(len + 1);
    if (!a->text) return -1;
    memcpy(a->text, text, len);
    a->text[len] = '\0';
    a->len = len;
    a->id = id;
    a->special = (uint8_t)special;
    a->normalized = (uint8_t)normalized;
    t->n_added++;
    if (!t->tok[id] && tok_set_text(t, id, text, len, 0)) return -1;
    return 0;
}

/* Derived tables, once every token and merge is in. */
static int tok_finish(Tokenizer *t) {
    for (int b = 0; b < 256; b++) {
        uint8_t byte = (uint8_t)b;
        Buf bl = {0};
        if (put_bytelevel(&bl, &byte, 1)) return -1;
        SmSlot *s = sm_find(&t->vocab, bl.p, bl.n, hash_bytes(bl.p, bl.n));
        t->byte_id[b] = s ? (int32_t)s->val : -1;
        free(bl.p);
    }
    t->dec_off = malloc(((size_t)t->n_ids + 1) * sizeof *t->dec_off);
    if (!t->dec_off) return -1;
    for (int32_t i = 0; i < t->n_ids; i++) {
        t->dec_off[i] = t->dec.n;
        if (t->tok[i] && token_bytes(t->tok[i], t->tok_len[i], &t->dec)) return -1;
    }
    t->dec_off[t->n_ids] = t->dec.n;
    for (int p = 0; p < 2; p++) {
        t->pass_idx[p] = malloc((size_t)(t->n_added + 1) * sizeof(int));
        if (!t->pass_idx[p]) return -1;
        t->pass_n[p] = 0;
        for (int i = 0; i < t->n_added; i++)
            if (t->added[i].normalized == p) t->pass_idx[p][t->pass_n[p]++] = i;
        for (int i = 1; i < t->pass_n[p]; i++) /* insertion sort, longest first, stable */
            for (int j = i; j > 0 && t->added[t->pass_idx[p][j]].len > t->added[t->pass_idx[p][j - 1]].len; j--) {
                int x = t->pass_idx[p][j];
                t->pass_idx[p][j] = t->pass_idx[p][j - 1];
                t->pass_idx[p][j - 1] = x;
            }
        for (int i = 0; i < t->pass_n[p]; i++) t->first_byte[p][(uint8_t)t->added[t->pass_idx[p][i]].text[0]] = 1;
    }
    t->cache = tokenizer_cache_new();
    return t->cache ? 0 : -1;
}

int tokenizer_vocab_size(const Tokenizer *t) { return t->n_ids; }

int tokenizer_token_id(const Tokenizer *t, const char *token) {
    size_t n = strlen(token);
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].len == n && memcmp(t->added[i].text, token, n) == 0) return t->added[i].id;
    SmSlot *s = sm_find(&t->vocab, token, n, hash_bytes((const uint8_t *)token, n));
    return s ? (int)s->val : -1;
}

const char *tokenizer_token_text(const Tokenizer *t, int id) {
    return id >= 0 && id < t->n_ids ? t->tok[id] : NULL;
}

int tokenizer_n_merges(const Tokenizer *t) { return t->n_merges; }

int tokenizer_merge(const Tokenizer *t, int rank, int *left, int *right) {
    if (rank < 0 || rank >= t->n_merges) return -1;
    *left = t->merge_list[rank][0];
    *right = t->merge_list[rank][1];
    return 0;
}

/* ---------------------------------------------------------------------------------------------------------
 * Encoding */

typedef struct {
    IdBuf sym;      /* symbols of the pre-token being merged */
    IdBuf aux;      /* naive merge: pair values; heap merge: prev/next links */
    Buf heap;       /* heap merge: entries */
    Buf text;       /* byte-level spelling (ignore_merges lookups) */
} Scratch;

static void scratch_free(Scratch *s) {
    free(s->sym.p);
    free(s->aux.p);
    free(s->heap.p);
    free(s->text.p);
}

#define NO_MERGE INT64_MAX

static inline int64_t merge_of(const Tokenizer *t, int32_t a, int32_t b) {
    const int64_t *v = pm_get(&t->merges, pair_key((uint32_t)a, (uint32_t)b));
    return v ? *v : NO_MERGE;
}

/* Short words: rescan for the lowest (rank, position) pair after every merge, keeping each pair's merge. */
static int merge_naive(const Tokenizer *t, int32_t *sym, size_t m, Scratch *sc, size_t *out_m) {
    sc->aux.n = 0;
    if (m > 1 && ids_reserve(&sc->aux, 2 * (m - 1))) return -1;
    int64_t *v = (int64_t *)(void *)sc->aux.p;
    for (size_t k = 0; k + 1 < m; k++) v[k] = merge_of(t, sym[k], sym[k + 1]);
    while (m > 1) {
        size_t best = 0;
        for (size_t k = 1; k + 1 < m; k++)
            if (v[k] < v[best]) best = k;
        if (v[best] == NO_MERGE) break;
        sym[best] = (int32_t)(uint32_t)(v[best] & 0xFFFFFFFF);
        if (m >= best + 3) memmove(sym + best + 1, sym + best + 2, (m - best - 2) * sizeof *sym);
        if (m >= best + 4) memmove(v + best + 1, v + best + 2, (m - best - 3) * sizeof *v);
        m--;
        if (best > 0) v[best - 1] = merge_of(t, sym[best - 1], sym[best]);
        if (best + 1 < m) v[best] = merge_of(t, sym[best], sym[best + 1]);
    }
    *out_m = m;
    return 0;
}

/* Long words: HF's Word::merge_all, a heap of (rank, position) with stale entries skipped. */
typedef struct {
    uint32_t rank, new_id;
    size_t pos;
} HeapEnt;

static inline int he_less(const HeapEnt *a, const HeapEnt *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static int heap_push(Buf *h, HeapEnt e) {
    if (buf_reserve(h, sizeof e)) return -1;
    HeapEnt *a = (HeapEnt *)(void *)h->p;
    size_t i = h->n / sizeof e;
    h->n += sizeof e;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!he_less(&e, &a[p])) break;
        a[i] = a[p];
        i = p;
    }
    a[i] = e;
    return 0;
}

static HeapEnt heap_pop(Buf *h) {
    HeapEnt *a = (HeapEnt *)(void *)h->p;
    size_t n = h->n / sizeof *a - 1;
    HeapEnt top = a[0], last = a[n];
    h->n -= sizeof *a;
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && he_less(&a[c + 1], &a[c])) c++;
        if (!he_less(&a[c], &last)) break;
        a[i] = a[c];
        i = c;
    }
    if (n) a[i] = last;
    return top;
}

static int heap_push_pair(const Tokenizer *t, Buf *h, const int32_t *sym, size_t pos, size_t nxt) {
    int64_t v = merge_of(t, sym[pos], sym[nxt]);
    if (v == NO_MERGE) return 0;
    HeapEnt e = {(uint32_t)(v >> 32), (uint32_t)(v & 0xFFFFFFFF), pos};
    return heap_push(h, e);
}

static int merge_heap(const Tokenizer *t, int32_t *sym, size_t m, Scratch *sc, size_t *out_m) {
    /* links: prev[i] = aux[2i], next[i] = aux[2i+1]; -1 = none; a merged-away symbol gets sym = -1 */
    sc->aux.n = 0;
    sc->heap.n = 0;
    if (ids_reserve(&sc->aux, 2 * m)) return -1;
    int32_t *link = sc->aux.p;
    for (size_t i = 0; i < m; i++) {
        link[2 * i] = (int32_t)i - 1;
        link[2 * i + 1] = i + 1 < m ? (int32_t)i + 1 : -1;
    }
    for (size_t i = 0; i + 1 < m; i++)
        if (heap_push_pair(t, &sc->heap, sym, i, i + 1)) return -1;
    while (sc->heap.n) {
        HeapEnt e = heap_pop(&sc->heap);
        size_t pos = e.pos;
        if (sym[pos] < 0 || link[2 * pos + 1] < 0) continue;
        size_t nxt = (size_t)link[2 * pos + 1];
        int64_t v = merge_of(t, sym[pos], sym[nxt]);
        if (v == NO_MERGE || (uint32_t)(v & 0xFFFFFFFF) != e.new_id) continue; /* stale */
        sym[pos] = (int32_t)e.new_id;
        sym[nxt] = -1;
        int32_t after = link[2 * nxt + 1];
        link[2 * pos + 1] = after;
        if (after >= 0) link[2 * (size_t)after] = (int32_t)pos;
        if (link[2 * pos] >= 0 && heap_push_pair(t, &sc->heap, sym, (size_t)link[2 * pos], pos)) return -1;
        if (after >= 0 && heap_push_pair(t, &sc->heap, sym, pos, (size_t)after)) return -1;
    }
    size_t k = 0;
    for (size_t i = 0; i < m; i++)
        if (sym[i] >= 0) sym[k++] = sym[i];
    *out_m = k;
    return 0;
}

#define NAIVE_MAX 48

/* Ids of one pre-token. */
static int bpe_piece(const Tokenizer *t, TokenizerCache *c, Scratch *sc, const uint8_t *s, size_t n, IdBuf *out) {
    if (t->ignore_merges) { /* HF: a pre-token that is itself in the vocabulary is taken whole */
        sc->text.n = 0;
        if (put_bytelevel(&sc->text, s, n)) return -1;
        SmSlot *hit = sm_find(&t->vocab, sc->text.p, sc->text.n, hash_bytes(sc->text.p, sc->text.n));
        if (hit) return ids_push(out, (int32_t)hit->val);
    }
    uint64_t h = 0;
    if (c && n <= CACHE_MAX_PIECE) {
        h = hash_bytes(s, n);
        SmSlot *hit = sm_find(&c->map, s, n, h);
        if (hit) {
            size_t off = (size_t)(hit->val >> 16), cnt = (size_t)(hit->val & 0xFFFF);
            if (ids_reserve(out, cnt)) return -1;
            memcpy(out->p + out->n, c->ids.p + off, cnt * sizeof(int32_t));
            out->n += cnt;
            return 0;
        }
    }
    sc->sym.n = 0;
    if (ids_reserve(&sc->sym, n)) return -1;
    int32_t *sym = sc->sym.p;
    size_t m = 0;
    int unk_pending = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_id[s[i]];
        if (id >= 0) {
            if (unk_pending) sym[m++] = t->unk_id;
            unk_pending = 0;
            sym[m++] = id;
        } else if (t->unk_id >= 0) { /* HF: unknown characters become unk (fused if asked), or vanish */
            if (unk_pending && !t->fuse_unk) sym[m++] = t->unk_id;
            unk_pending = 1;
        }
    }
    if (unk_pending) sym[m++] = t->unk_id;
    if (m > 1 && (m <= NAIVE_MAX ? merge_naive(t, sym, m, sc, &m) : merge_heap(t, sym, m, sc, &m))) return -1;
    if (ids_reserve(out, m)) return -1;
    memcpy(out->p + out->n, sym, m * sizeof *sym);
    out->n += m;
    if (c && n <= CACHE_MAX_PIECE) {
        if (c->map.count >= CACHE_MAX_ENTRIES) cache_clear(c);
        int is_new;
        size_t off = c->ids.n;
        SmSlot *slot = sm_put(&c->map, s, n, h, &is_new);
        if (!slot || ids_reserve(&c->ids, m)) return -1;
        memcpy(c->ids.p + off, sym, m * sizeof *sym);
        c->ids.n += m;
        slot->val = (int64_t)off << 16 | (int64_t)m;
    }
    return 0;
}

static int encode_plain(const Tokenizer *t, TokenizerCache *c, Scratch *sc, const uint8_t *s, size_t n, IdBuf *out) {
    for (size_t i = 0; i < n;) {
        size_t j = piece_end(s, n, i);
        if (bpe_piece(t, c, sc, s + i, j - i, out)) return -1;
        i = j;
    }
    return 0;
}

/* Length of the longest added token of this pass that starts s (0 if none). */
static size_t added_at(const Tokenizer *t, int pass, const uint8_t *s, size_t n, int32_t *id) {
    for (int k = 0; k < t->pass_n[pass]; k++) {
        const AddedTok *a = &t->added[t->pass_idx[pass][k]];
        if (a->len <= n && memcmp(a->text, s, a->len) == 0) {
            *id = a->id;
            return a->len;
        }
    }
    return 0;
}

/* HF's AddedVocabulary: tokens with normalized=false are split out of the raw text first (leftmost, then
 * longest), then those with normalized=true out of what is left; the pieces between go to the model. */
static int encode_added(const Tokenizer *t, TokenizerCache *c, Scratch *sc, int pass, const uint8_t *s, size_t n,
                        IdBuf *out) {
    if (pass == 2) return encode_plain(t, c, sc, s, n, out);
    if (!t->pass_n[pass]) return encode_added(t, c, sc, pass + 1, s, n, out);
    size_t seg = 0;
    for (size_t p = 0; p < n;) {
        int32_t id;
        size_t len;
        if (!t->first_byte[pass][s[p]] || !(len = added_at(t, pass, s + p, n - p, &id))) {
            p++;
            continue;
        }
        if (encode_added(t, c, sc, pass + 1, s + seg, p - seg, out) || ids_push(out, id)) return -1;
        p += len;
        seg = p;
    }
    return encode_added(t, c, sc, pass + 1, s + seg, n - seg, out);
}

int tokenizer_encode_with(const Tokenizer *t, TokenizerCache *cache, const char *text, size_t len, int32_t **ids,
                          size_t *n_ids, ZyErr *err) {
    *ids = NULL;
    *n_ids = 0;
    if (cache && cache->owner != t) {
        cache_clear(cache);
        cache->owner = t;
    }
    IdBuf out = {0};
    Scratch sc = {0};
    if (len && ids_reserve(&out, len / 3 + 16)) return zy_fail(err, "encode: out of memory");
    int rc = encode_added(t, cache, &sc, 0, (const uint8_t *)text, len, &out);
    scratch_free(&sc);
    if (rc) {
        free(out.p);
        if (cache) cache_clear(cache);
        return zy_fail(err, "encode: out of memory (%zu bytes of text)", len);
    }
    if (!out.n) {
        free(out.p);
        out.p = NULL;
    }
    *ids = out.p;
    *n_ids = out.n;
    return 0;
}

int tokenizer_encode(const Tokenizer *t, const char *text, size_t len, int32_t **ids, size_t *n_ids, ZyErr *err) {
    return tokenizer_encode_with(t, t->cache, text, len, ids, n_ids, err);
}

int tokenizer_decode(const Tokenizer *t, const int32_t *ids, size_t n, char **bytes, size_t *len, ZyErr *err) {
    *bytes = NULL;
    *len = 0;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t->n_ids) return zy_fail(err, "decode: id %d at position %zu is outside the vocabulary [0, %d)", id, i, t->n_ids);
        if (!t->tok[id]) return zy_fail(err, "decode: id %d at position %zu has no token", id, i);
        total += t->dec_off[id + 1] - t->dec_off[id];
    }
    char *b = malloc(total + 1);
    if (!b) return zy_fail(err, "decode: out of memory (%zu bytes)", total);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        size_t a = t->dec_off[ids[i]], e = t->dec_off[ids[i] + 1];
        memcpy(b + k, t->dec.p + a, e - a);
        k += e - a;
    }
    b[k] = '\0';
    *bytes = b;
    *len = k;
    return 0;
}

/* ---------------------------------------------------------------------------------------------------------
 * tokenizer.json writer */

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

int tokenizer_to_json(const Tokenizer *t, char **json, size_t *len, ZyErr *err) {
    Buf b = {0};
    int rc = buf_puts(&b, "{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n  \"added_tokens\": [");
    for (int i = 0; i < t->n_added && !rc; i++) {
        const AddedTok *a = &t->added[i];
        rc = buf_printf(&b, "%s\n    {\"id\": %d, \"content\": ", i ? "," : "", a->id) || json_string(&b, a->text, a->len) ||
             buf_printf(&b, ", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, \"normalized\": %s, \"special\": %s}",
                        a->normalized ? "true" : "false", a->special ? "true" : "false");
    }
    rc = rc || buf_puts(&b, "\n  ],\n  \"normalizer\": null,\n"
                            "  \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": true, "
                            "\"use_regex\": true},\n  \"post_processor\": null,\n"
                            "  \"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": true, "
                            "\"use_regex\": true},\n  \"model\": {\n    \"type\": \"BPE\",\n    \"dropout\": null,\n    \"unk_token\": ");
    rc = rc || (t->unk_id >= 0 ? json_string(&b, t->tok[t->unk_id], t->tok_len[t->unk_id]) : buf_puts(&b, "null"));
    rc = rc || buf_printf(&b, ",\n    \"continuing_subword_prefix\": null,\n    \"end_of_word_suffix\": null,\n"
                              "    \"fuse_unk\": %s,\n    \"byte_fallback\": false,\n    \"ignore_merges\": %s,\n    \"vocab\": {",
                          t->fuse_unk ? "true" : "false", t->ignore_merges ? "true" : "false");
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
 * tokenizer.json reader */

/* A token's text for an error message: at most 40 bytes, control characters escaped. */
static const char *shown(const char *s, char buf[200]) {
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
            snprintf(buf, 200, "type \"%s\"", shown(ty->valuestring, tmp));
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

static int is_bytelevel(const cJSON *v) {
    const cJSON *ty = cJSON_IsObject(v) ? cJSON_GetObjectItemCaseSensitive(v, "type") : NULL;
    return cJSON_IsString(ty) && strcmp(ty->valuestring, "ByteLevel") == 0;
}

#define FAIL(...) return zy_fail(err, __VA_ARGS__)

static int load_pipeline(const cJSON *root, const char *label, ZyErr *err) {
    char b1[200];
    static const char *const must_be_null[] = {"truncation", "padding", "normalizer"};
    for (size_t i = 0; i < ZY_ARRAY_LEN(must_be_null); i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, must_be_null[i]);
        if (!is_absent_or_null(v)) FAIL("%s: %s: only null is supported (got %s)", label, must_be_null[i], kind_of(v, b1));
    }
    const cJSON *pt = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    if (is_absent_or_null(pt)) FAIL("%s: pre_tokenizer: missing (expected ByteLevel)", label);
    if (!is_bytelevel(pt)) FAIL("%s: pre_tokenizer: %s is not supported (expected type \"ByteLevel\")", label, kind_of(pt, b1));
    const cJSON *aps = cJSON_GetObjectItemCaseSensitive(pt, "add_prefix_space");
    if (!cJSON_IsBool(aps)) FAIL("%s: pre_tokenizer.add_prefix_space: missing or not a boolean", label);
    if (cJSON_IsTrue(aps)) FAIL("%s: pre_tokenizer.add_prefix_space: true is not supported (must be false)", label);
    int use_regex;
    if (opt_bool(pt, "use_regex", 1, &use_regex)) FAIL("%s: pre_tokenizer.use_regex: not a boolean", label);
    if (!use_regex) FAIL("%s: pre_tokenizer.use_regex: false is not supported (must be true)", label);
    static const char *const null_or_bytelevel[] = {"post_processor", "decoder"};
    for (size_t i = 0; i < ZY_ARRAY_LEN(null_or_bytelevel); i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, null_or_bytelevel[i]);
        if (!is_absent_or_null(v) && !is_bytelevel(v))
            FAIL("%s: %s: %s is not supported (only null or type \"ByteLevel\")", label, null_or_bytelevel[i], kind_of(v, b1));
    }
    return 0;
}

static int load_model(const cJSON *root, const char *label, Tokenizer *t, ZyErr *err) {
    char b1[200], b2[200];
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!m) FAIL("%s: model: missing", label);
    if (!cJSON_IsObject(m)) FAIL("%s: model: expected an object, got %s", label, kind_of(m, b1));
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(m, "type");
    if (!cJSON_IsString(ty)) FAIL("%s: model.type: missing or not a string (expected \"BPE\")", label);
    if (strcmp(ty->valuestring, "BPE") != 0)
        FAIL("%s: model.type: \"%s\" is not supported (expected \"BPE\")", label, shown(ty->valuestring, b1));
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(m, "dropout");
    if (!is_absent_or_null(v) && !(cJSON_IsNumber(v) && v->valuedouble == 0))
        FAIL("%s: model.dropout: only null is supported", label);
    static const char *const affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (size_t i = 0; i < ZY_ARRAY_LEN(affixes); i++) {
        v = cJSON_GetObjectItemCaseSensitive(m, affixes[i]);
        if (!is_absent_or_null(v) && !(cJSON_IsString(v) && v->valuestring[0] == '\0'))
            FAIL("%s: model.%s: only null or \"\" is supported", label, affixes[i]);
    }
    int fuse_unk, byte_fallback, ignore_merges;
    if (opt_bool(m, "fuse_unk", 0, &fuse_unk)) FAIL("%s: model.fuse_unk: not a boolean", label);
    if (opt_bool(m, "byte_fallback", 0, &byte_fallback)) FAIL("%s: model.byte_fallback: not a boolean", label);
    if (byte_fallback) FAIL("%s: model.byte_fallback: true is not supported", label);
    if (opt_bool(m, "ignore_merges", 0, &ignore_merges)) FAIL("%s: model.ignore_merges: not a boolean", label);
    t->fuse_unk = (uint8_t)fuse_unk;
    t->ignore_merges = (uint8_t)ignore_merges;

    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(m, "vocab");
    if (!vocab) FAIL("%s: model.vocab: missing", label);
    if (!cJSON_IsObject(vocab)) FAIL("%s: model.vocab: expected an object, got %s", label, kind_of(vocab, b1));
    for (const cJSON *e = vocab->child; e; e = e->next) {
        const char *text = e->string ? e->string : "";
        size_t len = strlen(text);
        int32_t id;
        if (!len) FAIL("%s: model.vocab: empty token", label);
        if (json_id(e, &id))
            FAIL("%s: model.vocab[\"%s\"]: id must be an integer in [0, %d)", label, shown(text, b1), TOK_MAX_VOCAB);
        if (sm_find(&t->vocab, text, len, hash_bytes((const uint8_t *)text, len)))
            FAIL("%s: model.vocab: token \"%s\" appears twice", label, shown(text, b1));
        if ((size_t)id < t->ids_cap && t->tok[id])
            FAIL("%s: model.vocab[\"%s\"]: id %d is already \"%s\"", label, shown(text, b1), id, shown(t->tok[id], b2));
        if (tok_add_vocab(t, text, len, id)) FAIL("%s: out of memory", label);
    }

    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(m, "merges");
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
                rc = zy_fail(err, "%s: model.merges[%d]: \"%s\" is not two tokens separated by one space", label, i, shown(s, b1));
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
                rc = zy_fail(err, "%s: model.merges[%d]: token \"%s\" is not in model.vocab", label, i, shown(tmp, b1));
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
                         shown((const char *)cat.p, b1));
            break;
        }
        if (tok_add_merge(t, pid[0], pid[1], (int32_t)s->val)) rc = zy_fail(err, "%s: out of memory", label);
    }
    free(cat.p);
    if (rc) return rc;

    v = cJSON_GetObjectItemCaseSensitive(m, "unk_token");
    if (!is_absent_or_null(v)) {
        if (!cJSON_IsString(v)) FAIL("%s: model.unk_token: expected a string or null, got %s", label, kind_of(v, b1));
        size_t len = strlen(v->valuestring);
        SmSlot *s = sm_find(&t->vocab, v->valuestring, len, hash_bytes((const uint8_t *)v->valuestring, len));
        if (!s) FAIL("%s: model.unk_token: \"%s\" is not in model.vocab", label, shown(v->valuestring, b1));
        t->unk_id = (int32_t)s->val;
    }
    return 0;
}

static int load_added(const cJSON *root, const char *label, Tokenizer *t, ZyErr *err) {
    char b1[200], b2[200];
    const cJSON *at = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (is_absent_or_null(at)) return 0;
    if (!cJSON_IsArray(at)) FAIL("%s: added_tokens: expected an array, got %s", label, kind_of(at, b1));
    int i = 0;
    for (const cJSON *e = at->child; e; e = e->next, i++) {
        if (!cJSON_IsObject(e)) FAIL("%s: added_tokens[%d]: expected an object, got %s", label, i, kind_of(e, b1));
        int32_t id;
        if (json_id(cJSON_GetObjectItemCaseSensitive(e, "id"), &id))
            FAIL("%s: added_tokens[%d].id: missing or not an integer in [0, %d)", label, i, TOK_MAX_VOCAB);
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(e, "content");
        if (!cJSON_IsString(c) || !c->valuestring[0]) FAIL("%s: added_tokens[%d].content: missing or empty", label, i);
        static const char *const must_be_false[] = {"single_word", "lstrip", "rstrip"};
        for (size_t k = 0; k < ZY_ARRAY_LEN(must_be_false); k++) {
            int x;
            if (opt_bool(e, must_be_false[k], 0, &x)) FAIL("%s: added_tokens[%d].%s: not a boolean", label, i, must_be_false[k]);
            if (x) FAIL("%s: added_tokens[%d].%s: true is not supported", label, i, must_be_false[k]);
        }
        int special, normalized;
        if (opt_bool(e, "special", 0, &special)) FAIL("%s: added_tokens[%d].special: not a boolean", label, i);
        if (opt_bool(e, "normalized", !special, &normalized)) FAIL("%s: added_tokens[%d].normalized: not a boolean", label, i);
        const char *text = c->valuestring;
        size_t len = strlen(text);
        SmSlot *s = sm_find(&t->vocab, text, len, hash_bytes((const uint8_t *)text, len));
        if (s && s->val != id)
            FAIL("%s: added_tokens[%d]: \"%s\" has id %d but model.vocab gives it %d", label, i, shown(text, b1), id, (int)s->val);
        if (!s && (size_t)id < t->ids_cap && t->tok[id])
            FAIL("%s: added_tokens[%d]: id %d of \"%s\" is already \"%s\"", label, i, id, shown(text, b1), shown(t->tok[id], b2));
        for (int k = 0; k < t->n_added; k++)
            if (t->added[k].id == id) FAIL("%s: added_tokens[%d]: id %d appears twice", label, i, id);
        if (tok_add_added(t, text, len, id, special, normalized)) FAIL("%s: out of memory", label);
    }
    return 0;
}

int tokenizer_load_json(const char *json, size_t len, const char *label, Tokenizer **out, ZyErr *err) {
    *out = NULL;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, 0);
    if (!root) return zy_fail(err, "%s: invalid JSON near byte %zu", label, end ? (size_t)(end - json) : (size_t)0);
    size_t at = (size_t)(end - json);
    while (at < len && (json[at] == ' ' || json[at] == '\n' || json[at] == '\r' || json[at] == '\t')) at++;
    Tokenizer *t = tok_new();
    int rc;
    if (at < len)
        rc = zy_fail(err, "%s: invalid JSON: unexpected data after the top-level value at byte %zu", label, at);
    else if (!t)
        rc = zy_fail(err, "%s: out of memory", label);
    else if (!cJSON_IsObject(root))
        rc = zy_fail(err, "%s: expected a JSON object at the top level", label);
    else
        rc = load_pipeline(root, label, err) || load_model(root, label, t, err) || load_added(root, label, t, err);
    if (!rc && tok_finish(t)) rc = zy_fail(err, "%s: out of memory", label);
    cJSON_Delete(root);
    if (rc) {
        tokenizer_free(t);
        return -1;
    }
    *out = t;
    return 0;
}

int tokenizer_load(const char *path, Tokenizer **out, ZyErr *err) {
    *out = NULL;
    char *data;
    size_t len;
    if (zy_read_file(path, &data, &len, err)) return -1;
    int rc = tokenizer_load_json(data, len, path, out, err);
    free(data);
    return rc;
}

/* ---------------------------------------------------------------------------------------------------------
 * Training: counting pre-tokens */

static const char *const train_specials[3] = {TOK_PAD_TEXT, TOK_BOS_TEXT, TOK_EOS_TEXT};

static size_t special_at(const uint8_t *s, size_t n) {
    for (int k = 0; k < 3; k++) {
        size_t l = strlen(train_specials[k]);
        if (n >= l && memcmp(s, train_specials[k], l) == 0) return l;
    }
    return 0;
}

/* Adds the pre-tokens of one text to m; special-token strings are cut out and not counted. */
static int count_text(StrMap *m, const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        size_t p = i, sl = 0;
        for (;;) {
            const uint8_t *lt = memchr(s + p, '<', n - p);
            if (!lt) {
                p = n;
                break;
            }
            p = (size_t)(lt - s);
            if ((sl = special_at(s + p, n - p))) break;
            p++;
        }
        for (size_t a = i; a < p;) {
            size_t b = piece_end(s, p, a);
            int is_new;
            SmSlot *slot = sm_put(m, s + a, b - a, hash_bytes(s + a, b - a), &is_new);
            if (!slot) return -1;
            slot->val++;
            a = b;
        }
        i = p + sl;
    }
    return 0;
}

/* A place to cut a text so that both sides pre-tokenize as in the whole: between two ASCII characters of
 * different classes, neither white space, the left one not an apostrophe (contractions), and no '<' just
 * before (special tokens). Searches [lo, hi) from the end (backward) or the start. */
static size_t find_cut(const uint8_t *s, size_t lo, size_t hi, int backward) {
    if (lo < 8) lo = 8;
    for (size_t k = lo; k < hi; k++) {
        size_t p = backward ? hi - 1 - (k - lo) : k;
        uint8_t a = s[p - 1], b = s[p];
        if (a >= 0x80 || b >= 0x80 || a == '\'') continue;
        char ca = ascii_class[a], cb = ascii_class[b];
        if (ca == C_S || cb == C_S || ca == cb || memchr(s + p - 7, '<', 7)) continue;
        return p;
    }
    return 0;
}

typedef struct {
    int nt;          /* parts counted in parallel, one map each */
    StrMap *maps;
    double bytes;
} Counter;

/* Counts s[0..n) split into up to nt parts at safe cuts, in parallel. */
static int count_block(Counter *cn, const uint8_t *s, size_t n) {
    size_t cut[17];
    int parts = 0;
    cut[0] = 0;
    for (int k = 1; k < cn->nt; k++) {
        size_t c = find_cut(s, n / (size_t)cn->nt * (size_t)k, n, 0);
        if (c > cut[parts]) cut[++parts] = c;
    }
    cut[++parts] = n;
    int rc[16] = {0};
#pragma omp parallel for schedule(static, 1) num_threads(parts) if (parts > 1)
    for (int k = 0; k < parts; k++) rc[k] = count_text(&cn->maps[k], s + cut[k], cut[k + 1] - cut[k]);
    for (int k = 0; k < parts; k++)
        if (rc[k]) return -1;
    cn->bytes += (double)n;
    return 0;
}

#define TRAIN_BLOCK ((size_t)16 << 20)

static int count_plain_file(Counter *cn, const char *path, ZyErr *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return zy_fail(err, "%s: cannot open: %s", path, strerror(errno));
    Buf b = {0};
    int rc = 0, eof = 0;
    while (!eof && !rc) {
        if (buf_reserve(&b, TRAIN_BLOCK)) {
            rc = zy_fail(err, "%s: out of memory", path);
            break;
        }
        size_t got = fread(b.p + b.n, 1, TRAIN_BLOCK, f);
        b.n += got;
        if (got < TRAIN_BLOCK) {
            if (ferror(f)) {
                rc = zy_fail(err, "%s: read error: %s", path, strerror(errno));
                break;
            }
            eof = 1;
        }
        size_t cut = eof ? b.n : find_cut(b.p, b.n > TRAIN_BLOCK ? b.n - TRAIN_BLOCK : 0, b.n, 1);
        if (!cut) continue; /* no safe place yet: read more */
        if (count_block(cn, b.p, cut)) {
            rc = zy_fail(err, "%s: out of memory counting words", path);
            break;
        }
        memmove(b.p, b.p + cut, b.n - cut);
        b.n -= cut;
    }
    fclose(f);
    free(b.p);
    return rc;
}

/* Texts of a JSONL batch, counted in parallel (texts never share a pre-token). */
typedef struct {
    Buf text;
    size_t *end;
    size_t n, cap;
} Batch;

static int count_batch(Counter *cn, Batch *bt) {
    if (!bt->n) return 0;
    size_t first[17];
    int parts = 0;
    first[0] = 0;
    for (size_t i = 0, k = 1; i < bt->n && (int)k < cn->nt; i++)
        if (bt->end[i] >= bt->text.n / (size_t)cn->nt * k) {
            if (i + 1 > first[parts] && i + 1 < bt->n) first[++parts] = i + 1;
            k++;
        }
    first[++parts] = bt->n;
    int rc[16] = {0};
#pragma omp parallel for schedule(static, 1) num_threads(parts) if (parts > 1)
    for (int k = 0; k < parts; k++)
        for (size_t i = first[k]; i < first[k + 1] && !rc[k]; i++) {
            size_t a = i ? bt->end[i - 1] : 0;
            rc[k] = count_text(&cn->maps[k], bt->text.p + a, bt->end[i] - a);
        }
    for (int k = 0; k < parts; k++)
        if (rc[k]) return -1;
    cn->bytes += (double)bt->text.n;
    bt->text.n = 0;
    bt->n = 0;
    return 0;
}

static int count_jsonl_file(Counter *cn, const char *path, ZyErr *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return zy_fail(err, "%s: cannot open: %s", path, strerror(errno));
    Batch bt = {0};
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    long lineno = 0;
    int rc = 0;
    while (!rc && (got = getline(&line, &cap, f)) >= 0) {
        lineno++;
        size_t k = 0;
        while (k < (size_t)got && (line[k] == ' ' || line[k] == '\t' || line[k] == '\r' || line[k] == '\n')) k++;
        if (k == (size_t)got) continue;
        cJSON *o = cJSON_ParseWithLength(line, (size_t)got);
        const cJSON *tx = cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, "text") : NULL;
        if (!o)
            rc = zy_fail(err, "%s: line %ld: invalid JSON", path, lineno);
        else if (!cJSON_IsString(tx))
            rc = zy_fail(err, "%s: line %ld: no \"text\" string", path, lineno);
        else {
            if (bt.n == bt.cap) {
                size_t nc = bt.cap ? bt.cap * 2 : 1024;
                size_t *q = realloc(bt.end, nc * sizeof *q);
                if (!q) rc = zy_fail(err, "%s: out of memory", path);
                else {
                    bt.end = q;
                    bt.cap = nc;
                }
            }
            if (!rc && buf_puts(&bt.text, tx->valuestring)) rc = zy_fail(err, "%s: out of memory", path);
            if (!rc) bt.end[bt.n++] = bt.text.n;
        }
        cJSON_Delete(o);
        if (!rc && bt.text.n >= TRAIN_BLOCK && count_batch(cn, &bt)) rc = zy_fail(err, "%s: out of memory counting words", path);
    }
    if (!rc && ferror(f)) rc = zy_fail(err, "%s: read error: %s", path, strerror(errno));
    if (!rc && count_batch(cn, &bt)) rc = zy_fail(err, "%s: out of memory counting words", path);
    free(line);
    free(bt.text.p);
    free(bt.end);
    fclose(f);
    return rc;
}

/* ---------------------------------------------------------------------------------------------------------
 * Training: merges, as HF's BpeTrainer computes them. A max-heap of (count, pair) entries, each with the
 * words the pair was seen in when the entry was made; an entry whose count went stale is re-queued with the
 * current count; merging a pair touches only its words, whose changed neighbour pairs update the counts and
 * become new entries. Ties go to the smallest (left id, right id), ids numbered as HF's trainer does. */

typedef struct {
    const uint8_t *key; /* the pre-token's bytes (in the counter's arena) */
    uint32_t len;
    uint32_t n;         /* symbols now */
    size_t off;         /* into Trainer.sym */
    int64_t count;
} Word;

typedef struct {
    int64_t count;
    uint32_t a, b;
    int32_t *pos;
    uint32_t npos;
} Entry;

typedef struct {
    uint64_t pair;
    int32_t *pos;
    uint32_t n, cap;
} PosList;

typedef struct {
    Word *words;
    size_t n_words;
    int32_t *sym;
    int split_digits;    /* never merge two pieces that both hold a digit: numbers stay one token per digit */
    PairMap counts;      /* pair -> occurrences weighted by word counts */
    Entry *heap;
    size_t heap_n, heap_cap;
    PairMap wtu_idx;     /* pair -> index into wtu: pairs that gained words this round */
    PosList *wtu;
    size_t wtu_n, wtu_cap;
    Buf tok_bytes;       /* raw bytes of every token, concatenated */
    size_t *tok_off;     /* [n_tok + 1] */
    size_t n_tok, tok_cap;
    StrMap tok_map;      /* raw bytes -> id */
} Trainer;

static int entry_better(const Entry *x, const Entry *y) {
    if (x->count != y->count) return x->count > y->count;
    return x->a != y->a ? x->a < y->a : x->b < y->b;
}

static int heap_push_entry(Trainer *tr, Entry e) {
    if (tr->heap_n == tr->heap_cap) {
        size_t nc = tr->heap_cap ? tr->heap_cap * 2 : 4096;
        Entry *q = realloc(tr->heap, nc * sizeof *q);
        if (!q) return -1;
        tr->heap = q;
        tr->heap_cap = nc;
    }
    size_t i = tr->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!entry_better(&e, &tr->heap[p])) break;
        tr->heap[i] = tr->heap[p];
        i = p;
    }
    tr->heap[i] = e;
    return 0;
}

static Entry heap_pop_entry(Trainer *tr) {
    Entry top = tr->heap[0], last = tr->heap[--tr->heap_n];
    size_t n = tr->heap_n, i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && entry_better(&tr->heap[c + 1], &tr->heap[c])) c++;
        if (!entry_better(&tr->heap[c], &last)) break;
        tr->heap[i] = tr->heap[c];
        i = c;
    }
    if (n) tr->heap[i] = last;
    return top;
}

static int wtu_add(Trainer *tr, uint64_t pair, int32_t w) {
    int is_new;
    int64_t *ix = pm_put(&tr->wtu_idx, pair, &is_new);
    if (!ix) return -1;
    if (is_new) {
        if (tr->wtu_n == tr->wtu_cap) {
            size_t nc = tr->wtu_cap ? tr->wtu_cap * 2 : 1024;
            PosList *q = realloc(tr->wtu, nc * sizeof *q);
            if (!q) return -1;
            tr->wtu = q;
            tr->wtu_cap = nc;
        }
        *ix = (int64_t)tr->wtu_n;
        tr->wtu[tr->wtu_n++] = (PosList){pair, NULL, 0, 0};
    }
    PosList *l = &tr->wtu[*ix];
    if (l->n && l->pos[l->n - 1] == w) return 0; /* a word's changes arrive together */
    if (l->n == l->cap) {
        uint32_t nc = l->cap ? l->cap * 2 : 4;
        int32_t *q = realloc(l->pos, (size_t)nc * sizeof *q);
        if (!q) return -1;
        l->pos = q;
        l->cap = nc;
    }
    l->pos[l->n++] = w;
    return 0;
}

/* Queues every pair that gained words (with its current count, if positive) and empties the set. */
static int wtu_drain(Trainer *tr) {
    int rc = 0;
    for (size_t i = 0; i < tr->wtu_n; i++) {
        PosList *l = &tr->wtu[i];
        const int64_t *c = pm_get(&tr->counts, l->pair);
        if (!rc && c && *c > 0) {
            Entry e = {*c, (uint32_t)(l->pair >> 32), (uint32_t)l->pair, l->pos, l->n};
            if (heap_push_entry(tr, e)) rc = -1;
            else l->pos = NULL;
        }
        free(l->pos);
    }
    /* empty the index: find every slot first, then clear them, so no probe chain breaks midway */
    size_t mask = tr->wtu_idx.cap - 1;
    for (size_t i = 0; i < tr->wtu_n; i++) {
        size_t j = mix64(tr->wtu[i].pair) & mask;
        while (tr->wtu_idx.slots[j].key != tr->wtu[i].pair) j = (j + 1) & mask;
        tr->wtu[i].n = (uint32_t)j; /* the list is gone: n keeps the slot */
    }
    for (size_t i = 0; i < tr->wtu_n; i++) tr->wtu_idx.slots[tr->wtu[i].n].key = PM_EMPTY;
    tr->wtu_idx.count = 0;
    tr->wtu_n = 0;
    return rc;
}

static int change(Trainer *tr, uint32_t a, uint32_t b, int delta, int32_t w) {
    int is_new;
    uint64_t pair = pair_key(a, b);
    int64_t *c = pm_put(&tr->counts, pair, &is_new);
    if (!c) return -1;
    *c += delta * tr->words[w].count;
    return delta > 0 ? wtu_add(tr, pair, w) : 0;
}

/* HF's Word::merge, change for change. */
static int word_merge(Trainer *tr, int32_t w, uint32_t c1, uint32_t c2, uint32_t rep) {
    Word *wd = &tr->words[w];
    int32_t *s = tr->sym + wd->off;
    uint32_t n = wd->n;
    for (uint32_t i = 0; i < n; i++) {
        if ((uint32_t)s[i] != c1 || i + 1 >= n || (uint32_t)s[i + 1] != c2) continue;
        if (i > 0 && (change(tr, (uint32_t)s[i - 1], c1, -1, w) || change(tr, (uint32_t)s[i - 1], rep, 1, w))) return -1;
        s[i] = (int32_t)rep;
        memmove(s + i + 1, s + i + 2, (size_t)(n - i - 2) * sizeof *s);
        n--;
        if (i + 1 < n && (change(tr, c2, (uint32_t)s[i + 1], -1, w) || change(tr, rep, (uint32_t)s[i + 1], 1, w))) return -1;
    }
    wd->n = n;
    return 0;
}

static int add_token(Trainer *tr, const uint8_t *bytes, size_t len) {
    if (tr->n_tok + 1 >= tr->tok_cap) {
        size_t nc = tr->tok_cap ? tr->tok_cap * 2 : 1024;
        size_t *q = realloc(tr->tok_off, nc * sizeof *q);
        if (!q) return -1;
        tr->tok_off = q;
        tr->tok_cap = nc;
    }
    int is_new;
    SmSlot *s = sm_put(&tr->tok_map, bytes, len, hash_bytes(bytes, len), &is_new);
    if (!s) return -1;
    s->val = (int64_t)tr->n_tok;
    if (tr->n_tok == 0) tr->tok_off[0] = 0;
    if (buf_put(&tr->tok_bytes, bytes, len)) return -1;
    tr->tok_off[++tr->n_tok] = tr->tok_bytes.n;
    return 0;
}

static void trainer_free(Trainer *tr) {
    free(tr->words);
    free(tr->sym);
    pm_free(&tr->counts);
    for (size_t i = 0; i < tr->heap_n; i++) free(tr->heap[i].pos);
    free(tr->heap);
    pm_free(&tr->wtu_idx);
    for (size_t i = 0; i < tr->wtu_n; i++) free(tr->wtu[i].pos);
    free(tr->wtu);
    free(tr->tok_bytes.p);
    free(tr->tok_off);
    sm_free(&tr->tok_map);
}

static int cmp_words(const void *x, const void *y) {
    const Word *a = x, *b = y;
    size_t n = a->len < b->len ? a->len : b->len;
    int c = n ? memcmp(a->key, b->key, n) : 0;
    return c ? c : (a->len > b->len) - (a->len < b->len);
}

typedef struct {
    int32_t (*list)[3]; /* left, right, new id */
    size_t n, cap;
} MergeOut;

static int has_digit(const Trainer *tr, uint32_t id) {
    for (size_t k = tr->tok_off[id]; k < tr->tok_off[id + 1]; k++)
        if (tr->tok_bytes.p[k] >= '0' && tr->tok_bytes.p[k] <= '9') return 1;
    return 0;
}

static int learn_merges(Trainer *tr, const StrMap *counts, int vocab_size, MergeOut *mo) {
    /* words, sorted by their bytes so the result never depends on hashing or threads */
    tr->words = malloc((counts->count + 1) * sizeof *tr->words);
    if (!tr->words) return -1;
    size_t total = 0;
    for (size_t i = 0; i < counts->cap; i++) {
        const SmSlot *s = &counts->slots[i];
        if (!s->used) continue;
        tr->words[tr->n_words++] = (Word){counts->keys.p + s->off, s->len, s->len, 0, s->val};
        total += s->len;
    }
    qsort(tr->words, tr->n_words, sizeof *tr->words, cmp_words);
    tr->sym = malloc((total + 1) * sizeof *tr->sym);
    if (!tr->sym) return -1;
    /* the vocabulary so far: specials, then bytes in the order of their byte-level characters */
    for (int k = 0; k < 3; k++)
        if (add_token(tr, (const uint8_t *)train_specials[k], strlen(train_specials[k]))) return -1;
    int order[256], by_rank[256];
    byte_token_order(order);
    for (int b = 0; b < 256; b++) by_rank[order[b]] = b;
    for (int r = 0; r < 256; r++) {
        uint8_t byte = (uint8_t)by_rank[r];
        if (add_token(tr, &byte, 1)) return -1;
    }
    size_t off = 0;
    for (size_t w = 0; w < tr->n_words; w++) {
        Word *wd = &tr->words[w];
        wd->off = off;
        for (uint32_t k = 0; k < wd->len; k++) tr->sym[off + k] = 3 + order[wd->key[k]];
        off += wd->len;
        for (uint32_t k = 0; k + 1 < wd->n; k++) {
            uint64_t pair = pair_key((uint32_t)tr->sym[wd->off + k], (uint32_t)tr->sym[wd->off + k + 1]);
            int is_new;
            int64_t *c = pm_put(&tr->counts, pair, &is_new);
            if (!c || wtu_add(tr, pair, (int32_t)w)) return -1;
            *c += wd->count;
        }
    }
    if (wtu_drain(tr)) return -1;
    Buf cat = {0};
    int rc = 0;
    while (!rc && tr->n_tok < (size_t)vocab_size && tr->heap_n) {
        Entry top = heap_pop_entry(tr);
        int64_t cur = *pm_get(&tr->counts, pair_key(top.a, top.b));
        if (top.count != cur) {
            top.count = cur;
            if (heap_push_entry(tr, top)) {
                free(top.pos);
                rc = -1;
            }
            continue;
        }
        if (top.count < 1) {
            free(top.pos);
            break;
        }
        if (tr->split_digits && has_digit(tr, top.a) && has_digit(tr, top.b)) {
            free(top.pos); /* dropped for good: a later re-queue of this pair is dropped here again */
            continue;
        }
        cat.n = 0;
        rc = buf_put(&cat, tr->tok_bytes.p + tr->tok_off[top.a], tr->tok_off[top.a + 1] - tr->tok_off[top.a]) ||
             buf_put(&cat, tr->tok_bytes.p + tr->tok_off[top.b], tr->tok_off[top.b + 1] - tr->tok_off[top.b]);
        SmSlot *s = rc ? NULL : sm_find(&tr->tok_map, cat.p, cat.n, hash_bytes(cat.p, cat.n));
        int32_t new_id = s ? (int32_t)s->val : (int32_t)tr->n_tok; /* HF reuses an existing token's id */
        if (!rc && !s) rc = add_token(tr, cat.p, cat.n);
        if (!rc && mo->n == mo->cap) {
            size_t nc = mo->cap ? mo->cap * 2 : 1024;
            void *q = realloc(mo->list, nc * sizeof *mo->list);
            if (q) {
                mo->list = q;
                mo->cap = nc;
            } else {
                rc = -1;
            }
        }
        if (!rc) {
            mo->list[mo->n][0] = (int32_t)top.a;
            mo->list[mo->n][1] = (int32_t)top.b;
            mo->list[mo->n][2] = new_id;
            mo->n++;
        }
        for (uint32_t k = 0; k < top.npos && !rc; k++) rc = word_merge(tr, top.pos[k], top.a, top.b, (uint32_t)new_id);
        free(top.pos);
        if (!rc) rc = wtu_drain(tr);
    }
    free(cat.p);
    return rc;
}

static int build_trained(Trainer *tr, const MergeOut *mo, Tokenizer **out) {
    Tokenizer *t = tok_new();
    Buf bl = {0};
    int rc = !t;
    for (size_t id = 0; id < tr->n_tok && !rc; id++) {
        const uint8_t *p = tr->tok_bytes.p + tr->tok_off[id];
        size_t n = tr->tok_off[id + 1] - tr->tok_off[id];
        bl.n = 0;
        if (id < 3)
            rc = buf_put(&bl, p, n);
        else
            rc = put_bytelevel(&bl, p, n);
        rc = rc || tok_add_vocab(t, (const char *)bl.p, bl.n, (int32_t)id);
    }
    free(bl.p);
    for (size_t r = 0; r < mo->n && !rc; r++) rc = tok_add_merge(t, mo->list[r][0], mo->list[r][1], mo->list[r][2]);
    for (int k = 0; k < 3 && !rc; k++) rc = tok_add_added(t, train_specials[k], strlen(train_specials[k]), k, 1, 0);
    rc = rc || tok_finish(t);
    if (rc) {
        tokenizer_free(t);
        return -1;
    }
    *out = t;
    return 0;
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* files != NULL: read files; else texts/lens. */
static int train_common(const char *const *files, const char *const *texts, const size_t *lens, int n, int vocab_size,
                        int split_digits, Tokenizer **out, TokenizerTrainStats *stats, ZyErr *err) {
    *out = NULL;
    double t0 = zy_now_seconds();
    if (vocab_size < TOK_MIN_VOCAB)
        return zy_fail(err, "tokenizer train: vocab size %d is too small (at least %d: 3 special tokens, 256 bytes, 1 merge)",
                       vocab_size, TOK_MIN_VOCAB);
    if (vocab_size > TOK_MAX_VOCAB)
        return zy_fail(err, "tokenizer train: vocab size %d is too large (at most %d)", vocab_size, TOK_MAX_VOCAB);
    if (n < 1) return zy_fail(err, "tokenizer train: no input");
    Counter cn = {1, NULL, 0};
#ifdef _OPENMP
    cn.nt = omp_get_max_threads();
#endif
    if (cn.nt < 1) cn.nt = 1;
    if (cn.nt > 16) cn.nt = 16;
    cn.maps = calloc((size_t)cn.nt, sizeof *cn.maps);
    if (!cn.maps) return zy_fail(err, "tokenizer train: out of memory");
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        if (files)
            rc = ends_with(files[i], ".jsonl") ? count_jsonl_file(&cn, files[i], err) : count_plain_file(&cn, files[i], err);
        else if (count_block(&cn, (const uint8_t *)texts[i], lens[i]))
            rc = zy_fail(err, "tokenizer train: out of memory counting words");
    }
    for (int k = 1; k < cn.nt && !rc; k++) { /* fold the other parts' counts into map 0 */
        const StrMap *m = &cn.maps[k];
        for (size_t i = 0; i < m->cap && !rc; i++) {
            const SmSlot *s = &m->slots[i];
            if (!s->used) continue;
            int is_new;
            SmSlot *d = sm_put(&cn.maps[0], m->keys.p + s->off, s->len, s->hash, &is_new);
            if (!d) rc = zy_fail(err, "tokenizer train: out of memory");
            else d->val += s->val;
        }
        sm_free(&cn.maps[k]);
    }
    double t_count = zy_now_seconds() - t0;
    Trainer tr = {0};
    tr.split_digits = split_digits;
    MergeOut mo = {0};
    if (!rc && learn_merges(&tr, &cn.maps[0], vocab_size, &mo)) rc = zy_fail(err, "tokenizer train: out of memory");
    if (!rc && build_trained(&tr, &mo, out)) rc = zy_fail(err, "tokenizer train: out of memory");
    if (stats) {
        stats->seconds = zy_now_seconds() - t0;
        stats->count_seconds = t_count;
        stats->input_mb = cn.bytes / 1e6;
        stats->merges = (int)mo.n;
        stats->words = (int64_t)tr.n_words;
    }
    trainer_free(&tr);
    free(mo.list);
    for (int k = 0; k < cn.nt; k++) sm_free(&cn.maps[k]);
    free(cn.maps);
    return rc;
}

int tokenizer_train(const char *const *files, int n_files, int vocab_size, int split_digits, Tokenizer **out,
                    TokenizerTrainStats *stats, ZyErr *err) {
    return train_common(files, NULL, NULL, n_files, vocab_size, split_digits, out, stats, err);
}

int tokenizer_train_texts(const char *const *texts, const size_t *lens, int n_texts, int vocab_size, int split_digits,
                          Tokenizer **out, TokenizerTrainStats *stats, ZyErr *err) {
    return train_common(NULL, texts, lens, n_texts, vocab_size, split_digits, out, stats, err);
}

/* ---------------------------------------------------------------------------------------------------------
 * PCRE2 reference pre-tokenizer (tests and fuzzing compare the scanner with it) */

/* The GPT-2 regex with Oniguruma's \s (White_Space: PCRE2's \s plus U+0085) spelled out. */
#define WS "\\t\\n\\x0B\\f\\r\\x{85}\\p{Z}"
static const char gpt2_pattern[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" WS "\\p{L}\\p{N}]+|[" WS "]+(?![^" WS
                                   "])|[" WS "]+";
static const char class_pattern[] = "(\\p{L})|(\\p{N})|([" WS "])";
#undef WS

int tokenizer_pretokenize_pcre2(const char *text, size_t len, size_t **ends, size_t *n, ZyErr *err) {
    *ends = NULL;
    *n = 0;
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)gpt2_pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &ec, &eo, NULL);
    pcre2_code *cls = pcre2_compile((PCRE2_SPTR)class_pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP | PCRE2_ANCHORED,
                                    &ec, &eo, NULL);
    pcre2_match_data *md = re ? pcre2_match_data_create_from_pattern(re, NULL) : NULL;
    pcre2_match_data *mdc = cls ? pcre2_match_data_create_from_pattern(cls, NULL) : NULL;
    size_t *e = malloc((len + 1) * sizeof *e), cnt = 0;
    int rc = 0, differs = 0;
    if (!re || !cls || !md || !mdc || !e) rc = zy_fail(err, "pretokenize_pcre2: cannot set up PCRE2");
    const uint8_t *s = (const uint8_t *)text;
    for (size_t i = 0; i < len && !rc;) {
        size_t j = i; /* the valid UTF-8 run [i, j) */
        uint32_t cp;
        int l;
        while (j < len && (l = utf8_char(s + j, len - j, &cp))) {
            int m = pcre2_match(cls, s + j, (size_t)l, 0, PCRE2_NO_UTF_CHECK, mdc, NULL);
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(mdc);
            int c = m < 0 ? C_O : (m >= 2 && ov[2] != PCRE2_UNSET) ? C_L : (m >= 3 && ov[4] != PCRE2_UNSET) ? C_N : C_S;
            if (c != unicode_class(cp)) differs = 1;
            j += (size_t)l;
        }
        for (size_t at = i; at < j && !rc;) {
            int m = pcre2_match(re, s + i, j - i, at - i, PCRE2_NO_UTF_CHECK, md, NULL);
            if (m < 0) { /* cannot happen: some alternative matches every character */
                rc = zy_fail(err, "pretokenize_pcre2: no match at byte %zu", at);
                break;
            }
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            if (ov[0] != at - i) e[cnt++] = i + ov[0]; /* an unmatched gap is a piece (HF's Isolated split) */
            e[cnt++] = i + ov[1];
            at = i + ov[1];
        }
        if (j < len && j == i) { /* an invalid byte */
            e[cnt++] = i + 1;
            j = i + 1;
        }
        i = j;
    }
    pcre2_match_data_free(md);
    pcre2_match_data_free(mdc);
    pcre2_code_free(re);
    pcre2_code_free(cls);
    if (rc) {
        free(e);
        return rc;
    }
    *ends = e;
    *n = cnt;
    return differs;
}

/* ---------------------------------------------------------------------------------------------------------
 * Unicode 16 classes as Oniguruma (HF tokenizers) applies them. Each entry is start << 2 | class
 * (0 other, 1 letter, 2 number, 3 white space) for the code points from start to the next entry's start.
 * Generated by `python3 tests/oracle/test_tokenizer.py --gen-unicode-table` (from HF's own pre-tokenizer);
 * the oracle suite checks every code point. */
static const uint32_t unicode_runs[] = {
    0x0, 0x27, 0x38, 0x83, 0x84, 0xc2, 0xe8, 0x105, 0x16c, 0x185, 0x1ec, 0x217, 0x218, 0x283, 0x284, 0x2a9, 0x2ac,
    0x2ca, 0x2d0, 0x2d5, 0x2d8, 0x2e6, 0x2e9, 0x2ec, 0x2f2, 0x2fc, 0x301, 0x35c, 0x361, 0x3dc, 0x3e1, 0xb08, 0xb19,
    0xb48, 0xb81, 0xb94, 0xbb1, 0xbb4, 0xbb9, 0xbbc, 0xdc1, 0xdd4, 0xdd9, 0xde0, 0xde9, 0xdf8, 0xdfd, 0xe00, 0xe19,
    0xe1c, 0xe21, 0xe2c, 0xe31, 0xe34, 0xe39, 0xe88, 0xe8d, 0xfd8, 0xfdd, 0x1208, 0x1229, 0x14c0, 0x14c5, 0x155c,
    0x1565, 0x1568, 0x1581, 0x1624, 0x1741, 0x17ac, 0x17bd, 0x17cc, 0x1881, 0x192c, 0x1982, 0x19a8, 0x19b9, 0x19c0,
    0x19c5, 0x1b50, 0x1b55, 0x1b58, 0x1b95, 0x1b9c, 0x1bb9, 0x1bc2, 0x1be9, 0x1bf4, 0x1bfd, 0x1c00, 0x1c41, 0x1c44,
    0x1c49, 0x1cc0, 0x1d35, 0x1e98, 0x1ec5, 0x1ec8, 0x1f02, 0x1f29, 0x1fac, 0x1fd1, 0x1fd8, 0x1fe9, 0x1fec, 0x2001,
    0x2058, 0x2069, 0x206c, 0x2091, 0x2094, 0x20a1, 0x20a4, 0x2101, 0x2164, 0x2181, 0x21ac, 0x21c1, 0x2220, 0x2225,
    0x223c, 0x2281, 0x2328, 0x2411, 0x24e8, 0x24f5, 0x24f8, 0x2541, 0x2544, 0x2561, 0x2588, 0x259a, 0x25c0, 0x25c5,
    0x2604, 0x2615, 0x2634, 0x263d, 0x2644, 0x264d, 0x26a4, 0x26a9, 0x26c4, 0x26c9, 0x26cc, 0x26d9, 0x26e8, 0x26f5,
    0x26f8, 0x2739, 0x273c, 0x2771, 0x2778, 0x277d, 0x2788, 0x279a, 0x27c1, 0x27c8, 0x27d2, 0x27e8, 0x27f1, 0x27f4,
    0x2815, 0x282c, 0x283d, 0x2844, 0x284d, 0x28a4, 0x28a9, 0x28c4, 0x28c9, 0x28d0, 0x28d5, 0x28dc, 0x28e1, 0x28e8,
    0x2965, 0x2974, 0x2979, 0x297c, 0x299a, 0x29c0, 0x29c9, 0x29d4, 0x2a15, 0x2a38, 0x2a3d, 0x2a48, 0x2a4d, 0x2aa4,
    0x2aa9, 0x2ac4, 0x2ac9, 0x2ad0, 0x2ad5, 0x2ae8, 0x2af5, 0x2af8, 0x2b41, 0x2b44, 0x2b81, 0x2b88, 0x2b9a, 0x2bc0,
    0x2be5, 0x2be8, 0x2c15, 0x2c34, 0x2c3d, 0x2c44, 0x2c4d, 0x2ca4, 0x2ca9, 0x2cc4, 0x2cc9, 0x2cd0, 0x2cd5, 0x2ce8,
    0x2cf5, 0x2cf8, 0x2d71, 0x2d78, 0x2d7d, 0x2d88, 0x2d9a, 0x2dc0, 0x2dc5, 0x2dca, 0x2de0, 0x2e0d, 0x2e10, 0x2e15,
    0x2e2c, 0x2e39, 0x2e44, 0x2e49, 0x2e58, 0x2e65, 0x2e6c, 0x2e71, 0x2e74, 0x2e79, 0x2e80, 0x2e8d, 0x2e94, 0x2ea1,
    0x2eac, 0x2eb9, 0x2ee8, 0x2f41, 0x2f44, 0x2f9a, 0x2fcc, 0x3015, 0x3034, 0x3039, 0x3044, 0x3049, 0x30a4, 0x30a9,
    0x30e8, 0x30f5, 0x30f8, 0x3161, 0x316c, 0x3175, 0x3178, 0x3181, 0x3188, 0x319a, 0x31c0, 0x31e2, 0x31fc, 0x3201,
    0x3204, 0x3215, 0x3234, 0x3239, 0x3244, 0x3249, 0x32a4, 0x32a9, 0x32d0, 0x32d5, 0x32e8, 0x32f5, 0x32f8, 0x3375,
    0x337c, 0x3381, 0x3388, 0x339a, 0x33c0, 0x33c5, 0x33cc, 0x3411, 0x3434, 0x3439, 0x3444, 0x3449, 0x34ec, 0x34f5,
    0x34f8, 0x3539, 0x353c, 0x3551, 0x355c, 0x3562, 0x357d, 0x3588, 0x359a, 0x35e4, 0x35e9, 0x3600, 0x3615, 0x365c,
    0x3669, 0x36c8, 0x36cd, 0x36f0, 0x36f5, 0x36f8, 0x3701, 0x371c, 0x379a, 0x37c0, 0x3805, 0x38c4, 0x38c9, 0x38d0,
    0x3901, 0x391c, 0x3942, 0x3968, 0x3a05, 0x3a0c, 0x3a11, 0x3a14, 0x3a19, 0x3a2c, 0x3a31, 0x3a90, 0x3a95, 0x3a98,
    0x3a9d, 0x3ac4, 0x3ac9, 0x3ad0, 0x3af5, 0x3af8, 0x3b01, 0x3b14, 0x3b19, 0x3b1c, 0x3b42, 0x3b68, 0x3b71, 0x3b80,
    0x3c01, 0x3c04, 0x3c82, 0x3cd0, 0x3d01, 0x3d20, 0x3d25, 0x3db4, 0x3e21, 0x3e34, 0x4001, 0x40ac, 0x40fd, 0x4102,
    0x4128, 0x4141, 0x4158, 0x4169, 0x4178, 0x4185, 0x4188, 0x4195, 0x419c, 0x41b9, 0x41c4, 0x41d5, 0x4208, 0x4239,
    0x423c, 0x4242, 0x4268, 0x4281, 0x4318, 0x431d, 0x4320, 0x4335, 0x4338, 0x4341, 0x43ec, 0x43f1, 0x4924, 0x4929,
    0x4938, 0x4941, 0x495c, 0x4961, 0x4964, 0x4969, 0x4978, 0x4981, 0x4a24, 0x4a29, 0x4a38, 0x4a41, 0x4ac4, 0x4ac9,
    0x4ad8, 0x4ae1, 0x4afc, 0x4b01, 0x4b04, 0x4b09, 0x4b18, 0x4b21, 0x4b5c, 0x4b61, 0x4c44, 0x4c49, 0x4c58, 0x4c61,
    0x4d6c, 0x4da6, 0x4df4, 0x4e01, 0x4e40, 0x4e81, 0x4fd8, 0x4fe1, 0x4ff8, 0x5005, 0x59b4, 0x59bd, 0x5a03, 0x5a05,
    0x5a6c, 0x5a81, 0x5bac, 0x5bba, 0x5bc5, 0x5be4, 0x5c01, 0x5c48, 0x5c7d, 0x5cc8, 0x5d01, 0x5d48, 0x5d81, 0x5db4,
    0x5db9, 0x5dc4, 0x5e01, 0x5ed0, 0x5f5d, 0x5f60, 0x5f71, 0x5f74, 0x5f82, 0x5fa8, 0x5fc2, 0x5fe8, 0x6042, 0x6068,
    0x6081, 0x61e4, 0x6201, 0x6214, 0x621d, 0x62a4, 0x62a9, 0x62ac, 0x62c1, 0x63d8, 0x6401, 0x647c, 0x651a, 0x6541,
    0x65b8, 0x65c1, 0x65d4, 0x6601, 0x66b0, 0x66c1, 0x6728, 0x6742, 0x676c, 0x6801, 0x685c, 0x6881, 0x6954, 0x6a02,
    0x6a28, 0x6a42, 0x6a68, 0x6a9d, 0x6aa0, 0x6c15, 0x6cd0, 0x6d15, 0x6d34, 0x6d42, 0x6d68, 0x6e0d, 0x6e84, 0x6eb9,
    0x6ec2, 0x6ee9, 0x6f98, 0x7001, 0x7090, 0x7102, 0x7128, 0x7135, 0x7142, 0x7169, 0x71f8, 0x7201, 0x722c, 0x7241,
    0x72ec, 0x72f5, 0x7300, 0x73a5, 0x73b4, 0x73b9, 0x73d0, 0x73d5, 0x73dc, 0x73e9, 0x73ec, 0x7401, 0x7700, 0x7801,
    0x7c58, 0x7c61, 0x7c78, 0x7c81, 0x7d18, 0x7d21, 0x7d38, 0x7d41, 0x7d60, 0x7d65, 0x7d68, 0x7d6d, 0x7d70, 0x7d75,
    0x7d78, 0x7d7d, 0x7df8, 0x7e01, 0x7ed4, 0x7ed9, 0x7ef4, 0x7ef9, 0x7efc, 0x7f09, 0x7f14, 0x7f19, 0x7f34, 0x7f41,
    0x7f50, 0x7f59, 0x7f70, 0x7f81, 0x7fb4, 0x7fc9, 0x7fd4, 0x7fd9, 0x7ff4, 0x8003, 0x802c, 0x80a3, 0x80a8, 0x80bf,
    0x80c0, 0x817f, 0x8180, 0x81c2, 0x81c5, 0x81c8, 0x81d2, 0x81e8, 0x81fd, 0x8202, 0x8228, 0x8241, 0x8274, 0x8409,
    0x840c, 0x841d, 0x8420, 0x8429, 0x8450, 0x8455, 0x8458, 0x8465, 0x8478, 0x8491, 0x8494, 0x8499, 0x849c, 0x84a1,
    0x84a4, 0x84a9, 0x84b8, 0x84bd, 0x84e8, 0x84f1, 0x8500, 0x8515, 0x8528, 0x8539, 0x853c, 0x8542, 0x860d, 0x8616,
    0x8628, 0x9182, 0x9270, 0x93aa, 0x9400, 0x9dda, 0x9e50, 0xb001, 0xb394, 0xb3ad, 0xb3bc, 0xb3c9, 0xb3d0, 0xb3f6,
    0xb3f8, 0xb401, 0xb498, 0xb49d, 0xb4a0, 0xb4b5, 0xb4b8, 0xb4c1, 0xb5a0, 0xb5bd, 0xb5c0, 0xb601, 0xb65c, 0xb681,
    0xb69c, 0xb6a1, 0xb6bc, 0xb6c1, 0xb6dc, 0xb6e1, 0xb6fc, 0xb701, 0xb71c, 0xb721, 0xb73c, 0xb741, 0xb75c, 0xb761,
    0xb77c, 0xb8bd, 0xb8c0, 0xc003, 0xc004, 0xc015, 0xc01e, 0xc020, 0xc086, 0xc0a8, 0xc0c5, 0xc0d8, 0xc0e2, 0xc0ed,
    0xc0f4, 0xc105, 0xc25c, 0xc275, 0xc280, 0xc285, 0xc3ec, 0xc3f1, 0xc400, 0xc415, 0xc4c0, 0xc4c5, 0xc63c, 0xc64a,
    0xc658, 0xc681, 0xc700, 0xc7c1, 0xc800, 0xc882, 0xc8a8, 0xc922, 0xc940, 0xc946, 0xc980, 0xca02, 0xca28, 0xcac6,
    0xcb00, 0xd001, 0x13700, 0x13801, 0x29234, 0x29341, 0x293f8, 0x29401, 0x29834, 0x29841, 0x29882, 0x298a9, 0x298b0,
    0x29901, 0x299bc, 0x299fd, 0x29a78, 0x29a81, 0x29b9a, 0x29bc0, 0x29c5d, 0x29c80, 0x29c89, 0x29e24, 0x29e2d, 0x29f38,
    0x29f41, 0x29f48, 0x29f4d, 0x29f50, 0x29f55, 0x29f74, 0x29fc9, 0x2a008, 0x2a00d, 0x2a018, 0x2a01d, 0x2a02c, 0x2a031,
    0x2a08c, 0x2a0c2, 0x2a0d8, 0x2a101, 0x2a1d0, 0x2a209, 0x2a2d0, 0x2a342, 0x2a368, 0x2a3c9, 0x2a3e0, 0x2a3ed, 0x2a3f0,
    0x2a3f5, 0x2a3fc, 0x2a402, 0x2a429, 0x2a498, 0x2a4c1, 0x2a51c, 0x2a581, 0x2a5f4, 0x2a611, 0x2a6cc, 0x2a73d, 0x2a742,
    0x2a768, 0x2a781, 0x2a794, 0x2a799, 0x2a7c2, 0x2a7e9, 0x2a7fc, 0x2a801, 0x2a8a4, 0x2a901, 0x2a90c, 0x2a911, 0x2a930,
    0x2a942, 0x2a968, 0x2a981, 0x2a9dc, 0x2a9e9, 0x2a9ec, 0x2a9f9, 0x2aac0, 0x2aac5, 0x2aac8, 0x2aad5, 0x2aadc, 0x2aae5,
    0x2aaf8, 0x2ab01, 0x2ab04, 0x2ab09, 0x2ab0c, 0x2ab6d, 0x2ab78, 0x2ab81, 0x2abac, 0x2abc9, 0x2abd4, 0x2ac05, 0x2ac1c,
    0x2ac25, 0x2ac3c, 0x2ac45, 0x2ac5c, 0x2ac81, 0x2ac9c, 0x2aca1, 0x2acbc, 0x2acc1, 0x2ad6c, 0x2ad71, 0x2ada8, 0x2adc1,
    0x2af8c, 0x2afc2, 0x2afe8, 0x2b001, 0x35e90, 0x35ec1, 0x35f1c, 0x35f2d, 0x35ff0, 0x3e401, 0x3e9b8, 0x3e9c1, 0x3eb68,
    0x3ec01, 0x3ec1c, 0x3ec4d, 0x3ec60, 0x3ec75, 0x3ec78, 0x3ec7d, 0x3eca4, 0x3eca9, 0x3ecdc, 0x3ece1, 0x3ecf4, 0x3ecf9,
    0x3ecfc, 0x3ed01, 0x3ed08, 0x3ed0d, 0x3ed14, 0x3ed19, 0x3eec8, 0x3ef4d, 0x3f4f8, 0x3f541, 0x3f640, 0x3f649, 0x3f720,
    0x3f7c1, 0x3f7f0, 0x3f9c1, 0x3f9d4, 0x3f9d9, 0x3fbf4, 0x3fc42, 0x3fc68, 0x3fc85, 0x3fcec, 0x3fd05, 0x3fd6c, 0x3fd99,
    0x3fefc, 0x3ff09, 0x3ff20, 0x3ff29, 0x3ff40, 0x3ff49, 0x3ff60, 0x3ff69, 0x3ff74, 0x40001, 0x40030, 0x40035, 0x4009c,
    0x400a1, 0x400ec, 0x400f1, 0x400f8, 0x400fd, 0x40138, 0x40141, 0x40178, 0x40201, 0x403ec, 0x4041e, 0x404d0, 0x40502,
    0x405e4, 0x4062a, 0x40630, 0x40a01, 0x40a74, 0x40a81, 0x40b44, 0x40b86, 0x40bf0, 0x40c01, 0x40c82, 0x40c90, 0x40cb5,
    0x40d06, 0x40d09, 0x40d2a, 0x40d2c, 0x40d41, 0x40dd8, 0x40e01, 0x40e78, 0x40e81, 0x40f10, 0x40f21, 0x40f40, 0x40f46,
    0x40f58, 0x41001, 0x41278, 0x41282, 0x412a8, 0x412c1, 0x41350, 0x41361, 0x413f0, 0x41401, 0x414a0, 0x414c1, 0x41590,
    0x415c1, 0x415ec, 0x415f1, 0x4162c, 0x41631, 0x4164c, 0x41651, 0x41658, 0x4165d, 0x41688, 0x4168d, 0x416c8, 0x416cd,
    0x416e8, 0x416ed, 0x416f4, 0x41701, 0x417d0, 0x41801, 0x41cdc, 0x41d01, 0x41d58, 0x41d81, 0x41da0, 0x41e01, 0x41e18,
    0x41e1d, 0x41ec4, 0x41ec9, 0x41eec, 0x42001, 0x42018, 0x42021, 0x42024, 0x42029, 0x420d8, 0x420dd, 0x420e4, 0x420f1,
    0x420f4, 0x420fd, 0x42158, 0x42162, 0x42181, 0x421dc, 0x421e6, 0x42201, 0x4227c, 0x4229e, 0x422c0, 0x42381, 0x423cc,
    0x423d1, 0x423d8, 0x423ee, 0x42401, 0x4245a, 0x42470, 0x42481, 0x424e8, 0x42601, 0x426e0, 0x426f2, 0x426f9, 0x42702,
    0x42740, 0x4274a, 0x42801, 0x42804, 0x42841, 0x42850, 0x42855, 0x42860, 0x42865, 0x428d8, 0x42902, 0x42924, 0x42981,
    0x429f6, 0x429fc, 0x42a01, 0x42a76, 0x42a80, 0x42b01, 0x42b20, 0x42b25, 0x42b94, 0x42bae, 0x42bc0, 0x42c01, 0x42cd8,
    0x42d01, 0x42d58, 0x42d62, 0x42d81, 0x42dcc, 0x42de2, 0x42e01, 0x42e48, 0x42ea6, 0x42ec0, 0x43001, 0x43124, 0x43201,
    0x432cc, 0x43301, 0x433cc, 0x433ea, 0x43401, 0x43490, 0x434c2, 0x434e8, 0x43502, 0x43529, 0x43598, 0x435bd, 0x43618,
    0x43982, 0x439fc, 0x43a01, 0x43aa8, 0x43ac1, 0x43ac8, 0x43b09, 0x43b14, 0x43c01, 0x43c76, 0x43c9d, 0x43ca0, 0x43cc1,
    0x43d18, 0x43d46, 0x43d54, 0x43dc1, 0x43e08, 0x43ec1, 0x43f16, 0x43f30, 0x43f81, 0x43fdc, 0x4400d, 0x440e0, 0x4414a,
    0x441c0, 0x441c5, 0x441cc, 0x441d5, 0x441d8, 0x4420d, 0x442c0, 0x44341, 0x443a4, 0x443c2, 0x443e8, 0x4440d, 0x4449c,
    0x444da, 0x44500, 0x44511, 0x44514, 0x4451d, 0x44520, 0x44541, 0x445cc, 0x445d9, 0x445dc, 0x4460d, 0x446cc, 0x44705,
    0x44714, 0x44742, 0x44769, 0x4476c, 0x44771, 0x44774, 0x44786, 0x447d4, 0x44801, 0x44848, 0x4484d, 0x448b0, 0x448fd,
    0x44904, 0x44a01, 0x44a1c, 0x44a21, 0x44a24, 0x44a29, 0x44a38, 0x44a3d, 0x44a78, 0x44a7d, 0x44aa4, 0x44ac1, 0x44b7c,
    0x44bc2, 0x44be8, 0x44c15, 0x44c34, 0x44c3d, 0x44c44, 0x44c4d, 0x44ca4, 0x44ca9, 0x44cc4, 0x44cc9, 0x44cd0, 0x44cd5,
    0x44ce8, 0x44cf5, 0x44cf8, 0x44d41, 0x44d44, 0x44d75, 0x44d88, 0x44e01, 0x44e28, 0x44e2d, 0x44e30, 0x44e39, 0x44e3c,
    0x44e41, 0x44ed8, 0x44edd, 0x44ee0, 0x44f45, 0x44f48, 0x44f4d, 0x44f50, 0x45001, 0x450d4, 0x4511d, 0x4512c, 0x45142,
    0x45168, 0x4517d, 0x45188, 0x45201, 0x452c0, 0x45311, 0x45318, 0x4531d, 0x45320, 0x45342, 0x45368, 0x45601, 0x456bc,
    0x45761, 0x45770, 0x45801, 0x458c0, 0x45911, 0x45914, 0x45942, 0x45968, 0x45a01, 0x45aac, 0x45ae1, 0x45ae4, 0x45b02,
    0x45b28, 0x45b42, 0x45b90, 0x45c01, 0x45c6c, 0x45cc2, 0x45cf0, 0x45d01, 0x45d1c, 0x46001, 0x460b0, 0x46281, 0x46382,
    0x463cc, 0x463fd, 0x4641c, 0x46425, 0x46428, 0x46431, 0x46450, 0x46455, 0x4645c, 0x46461, 0x464c0, 0x464fd, 0x46500,
    0x46505, 0x46508, 0x46542, 0x46568, 0x46681, 0x466a0, 0x466a9, 0x46744, 0x46785, 0x46788, 0x4678d, 0x46790, 0x46801,
    0x46804, 0x4682d, 0x468cc, 0x468e9, 0x468ec, 0x46941, 0x46944, 0x46971, 0x46a28, 0x46a75, 0x46a78, 0x46ac1, 0x46be4,
    0x46f01, 0x46f84, 0x46fc2, 0x46fe8, 0x47001, 0x47024, 0x47029, 0x470bc, 0x47101, 0x47104, 0x47142, 0x471b4, 0x471c9,
    0x47240, 0x47401, 0x4741c, 0x47421, 0x47428, 0x4742d, 0x474c4, 0x47519, 0x4751c, 0x47542, 0x47568, 0x47581, 0x47598,
    0x4759d, 0x475a4, 0x475a9, 0x47628, 0x47661, 0x47664, 0x47682, 0x476a8, 0x47b81, 0x47bcc, 0x47c09, 0x47c0c, 0x47c11,
    0x47c44, 0x47c49, 0x47cd0, 0x47d42, 0x47d68, 0x47ec1, 0x47ec4, 0x47f02, 0x47f54, 0x48001, 0x48e68, 0x49002, 0x491bc,
    0x49201, 0x49510, 0x4be41, 0x4bfc4, 0x4c001, 0x4d0c0, 0x4d105, 0x4d11c, 0x4d181, 0x50fec, 0x51001, 0x5191c, 0x58401,
    0x58478, 0x584c2, 0x584e8, 0x5a001, 0x5a8e4, 0x5a901, 0x5a97c, 0x5a982, 0x5a9a8, 0x5a9c1, 0x5aafc, 0x5ab02, 0x5ab28,
    0x5ab41, 0x5abb8, 0x5ac01, 0x5acc0, 0x5ad01, 0x5ad10, 0x5ad42, 0x5ad68, 0x5ad6e, 0x5ad88, 0x5ad8d, 0x5ade0, 0x5adf5,
    0x5ae40, 0x5b501, 0x5b5b4, 0x5b5c2, 0x5b5e8, 0x5b901, 0x5ba02, 0x5ba5c, 0x5bc01, 0x5bd2c, 0x5bd41, 0x5bd44, 0x5be4d,
    0x5be80, 0x5bf81, 0x5bf88, 0x5bf8d, 0x5bf90, 0x5c001, 0x61fe0, 0x62001, 0x63358, 0x633fd, 0x63424, 0x6bfc1, 0x6bfd0,
    0x6bfd5, 0x6bff0, 0x6bff5, 0x6bffc, 0x6c001, 0x6c48c, 0x6c4c9, 0x6c4cc, 0x6c541, 0x6c54c, 0x6c555, 0x6c558, 0x6c591,
    0x6c5a0, 0x6c5c1, 0x6cbf0, 0x6f001, 0x6f1ac, 0x6f1c1, 0x6f1f4, 0x6f201, 0x6f224, 0x6f241, 0x6f268, 0x733c2, 0x733e8,
    0x74b02, 0x74b50, 0x74b82, 0x74bd0, 0x74d82, 0x74de4, 0x75001, 0x75154, 0x75159, 0x75274, 0x75279, 0x75280, 0x75289,
    0x7528c, 0x75295, 0x7529c, 0x752a5, 0x752b4, 0x752b9, 0x752e8, 0x752ed, 0x752f0, 0x752f5, 0x75310, 0x75315, 0x75418,
    0x7541d, 0x7542c, 0x75435, 0x75454, 0x75459, 0x75474, 0x75479, 0x754e8, 0x754ed, 0x754fc, 0x75501, 0x75514, 0x75519,
    0x7551c, 0x75529, 0x75544, 0x75549, 0x75a98, 0x75aa1, 0x75b04, 0x75b09, 0x75b6c, 0x75b71, 0x75bec, 0x75bf1, 0x75c54,
    0x75c59, 0x75cd4, 0x75cd9, 0x75d3c, 0x75d41, 0x75dbc, 0x75dc1, 0x75e24, 0x75e29, 0x75ea4, 0x75ea9, 0x75f0c, 0x75f11,
    0x75f30, 0x75f3a, 0x76000, 0x77c01, 0x77c7c, 0x77c95, 0x77cac, 0x780c1, 0x781b8, 0x78401, 0x784b4, 0x784dd, 0x784f8,
    0x78502, 0x78528, 0x78539, 0x7853c, 0x78a41, 0x78ab8, 0x78b01, 0x78bb0, 0x78bc2, 0x78be8, 0x79341, 0x793b0, 0x793c2,
    0x793e8, 0x79741, 0x797b8, 0x797c1, 0x797c6, 0x797ec, 0x79f81, 0x79f9c, 0x79fa1, 0x79fb0, 0x79fb5, 0x79fbc, 0x79fc1,
    0x79ffc, 0x7a001, 0x7a314, 0x7a31e, 0x7a340, 0x7a401, 0x7a510, 0x7a52d, 0x7a530, 0x7a542, 0x7a568, 0x7b1c6, 0x7b2b0,
    0x7b2b6, 0x7b2c0, 0x7b2c6, 0x7b2d4, 0x7b406, 0x7b4b8, 0x7b4be, 0x7b4f8, 0x7b801, 0x7b810, 0x7b815, 0x7b880, 0x7b885,
    0x7b88c, 0x7b891, 0x7b894, 0x7b89d, 0x7b8a0, 0x7b8a5, 0x7b8cc, 0x7b8d1, 0x7b8e0, 0x7b8e5, 0x7b8e8, 0x7b8ed, 0x7b8f0,
    0x7b909, 0x7b90c, 0x7b91d, 0x7b920, 0x7b925, 0x7b928, 0x7b92d, 0x7b930, 0x7b935, 0x7b940, 0x7b945, 0x7b94c, 0x7b951,
    0x7b954, 0x7b95d, 0x7b960, 0x7b965, 0x7b968, 0x7b96d, 0x7b970, 0x7b975, 0x7b978, 0x7b97d, 0x7b980, 0x7b985, 0x7b98c,
    0x7b991, 0x7b994, 0x7b99d, 0x7b9ac, 0x7b9b1, 0x7b9cc, 0x7b9d1, 0x7b9e0, 0x7b9e5, 0x7b9f4, 0x7b9f9, 0x7b9fc, 0x7ba01,
    0x7ba28, 0x7ba2d, 0x7ba70, 0x7ba85, 0x7ba90, 0x7ba95, 0x7baa8, 0x7baad, 0x7baf0, 0x7c402, 0x7c434, 0x7efc2, 0x7efe8,
    0x80001, 0xa9b80, 0xa9c01, 0xadce8, 0xadd01, 0xae078, 0xae081, 0xb3a88, 0xb3ac1, 0xbaf84, 0xbafc1, 0xbb978, 0xbe001,
    0xbe878, 0xc0001, 0xc4d2c, 0xc4d41, 0xc8ec0,
};

static int unicode_class(uint32_t cp) {
    if (cp < 128) return ascii_class[cp];
    size_t lo = 0, hi = ZY_ARRAY_LEN(unicode_runs); /* start(lo) <= cp < start(hi) */
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if ((unicode_runs[mid] >> 2) <= cp)
            lo = mid;
        else
            hi = mid;
    }
    return "OLNS"[unicode_runs[lo] & 3];
}
