/* Internal to src/tokenizer/: what the tokenizer's files share (the public API is tokenizer.h). tokenizer.c holds
 * the Tokenizer, encoding and decoding; tokenizer_normalize.c the normalizers; tokenizer_json.c tokenizer.json
 * reading and writing; tokenizer_train.c BPE training; tokenizer_pretok.c the GPT-2 scanner, its PCRE2 reference
 * and the Unicode class table. The small containers and UTF-8 helpers are static inline here, compiled into each
 * file that calls them as they were into the one file before; every other shared function is defined once, in
 * the file named above its declaration below. */
#ifndef ZAYA_TOKENIZER_INTERNAL_H
#define ZAYA_TOKENIZER_INTERNAL_H

#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8
#endif
#include <pcre2.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"

/* ---------------------------------------------------------------------------------------------------------
 * Small containers */

typedef struct {
    uint8_t *p;
    size_t n, cap;
} Buf;

static inline int buf_reserve(Buf *b, size_t extra) {
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

static inline int buf_put(Buf *b, const void *d, size_t n) {
    if (buf_reserve(b, n)) return -1;
    if (n) memcpy(b->p + b->n, d, n);
    b->n += n;
    return 0;
}

static inline int buf_puts(Buf *b, const char *s) { return buf_put(b, s, strlen(s)); }

typedef struct {
    int32_t *p;
    size_t n, cap;
} IdBuf;

static inline int ids_reserve(IdBuf *b, size_t extra) {
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

static inline int ids_push(IdBuf *b, int32_t id) {
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

static inline uint64_t hash_bytes(const uint8_t *p, size_t n) {
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

static inline void sm_free(StrMap *m) {
    free(m->slots);
    free(m->keys.p);
    memset(m, 0, sizeof *m);
}

static inline SmSlot *sm_find(const StrMap *m, const void *key, size_t len, uint64_t h) {
    if (!m->cap) return NULL;
    size_t mask = m->cap - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
        SmSlot *s = &m->slots[i];
        if (!s->used) return NULL;
        if (s->hash == h && s->len == len && memcmp(m->keys.p + s->off, key, len) == 0) return s;
    }
}

/* Makes room for n entries in all (grow: double). */
static inline int sm_resize(StrMap *m, size_t n) {
    size_t cap = m->cap ? m->cap : 1024;
    while (cap < 2 * n) cap *= 2;
    if (cap == m->cap) return 0;
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
static inline SmSlot *sm_put(StrMap *m, const void *key, size_t len, uint64_t h, int *is_new) {
    if (len > UINT32_MAX) return NULL;
    if ((m->count + 1) * 2 > m->cap && sm_resize(m, m->count + 1)) return NULL;
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

static inline void pm_free(PairMap *m) {
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

/* Makes room for n entries in all. */
static inline int pm_resize(PairMap *m, size_t n) {
    size_t cap = m->cap ? m->cap : 1024;
    while (cap < 2 * n) cap *= 2;
    if (cap == m->cap) return 0;
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
static inline int64_t *pm_put(PairMap *m, uint64_t key, int *is_new) {
    if ((m->count + 1) * 2 > m->cap && pm_resize(m, m->count + 1)) return NULL;
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
 * UTF-8, character classes (tokenizer_pretok.c has the class table and the scanner) */

enum { C_O = 'O', C_L = 'L', C_N = 'N', C_S = 'S', C_X = 'X' /* a byte that starts no valid character */ };

/* The class of each ASCII character (tokenizer_pretok.c). */
extern const char tok_ascii_class[129];

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

/* The White_Space property: Rust's \s, which HF's added tokens use for lstrip / rstrip. */
static inline int is_white_space(uint32_t cp) {
    return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
           cp == 0x3000;
}

#define NOT_A_CHAR UINT32_MAX /* the "code point" of a byte that starts no valid character */

/* The character at s[i] (i < n): its length, 1 for an invalid byte (then *cp = NOT_A_CHAR). */
static inline size_t char_at_cp(const uint8_t *s, size_t n, size_t i, uint32_t *cp) {
    int l = utf8_char(s + i, n - i, cp);
    if (l) return (size_t)l;
    *cp = NOT_A_CHAR;
    return 1;
}

/* ---------------------------------------------------------------------------------------------------------
 * Patterns (Replace, Split; tokenizer.c) */

typedef struct {
    char *lit;      /* String pattern, NUL-terminated; NULL for a Regex */
    size_t lit_len;
    pcre2_code *re; /* Regex pattern */
} Pat;

/* A piece [a, b) of a string; m: a pattern match (tok_find_segments) or a delimiter to drop. */
typedef struct {
    size_t a, b;
    int m;
} Seg;

typedef struct {
    Seg *p;
    size_t n, cap;
} SegBuf;

#define PAT_ERROR (-2)

/* ---------------------------------------------------------------------------------------------------------
 * Pipeline components */

#define MAX_STEPS 16 /* normalizers, pre-tokenizers, decoders or post-processors in one pipeline */

enum { NORM_REPLACE, NORM_PREPEND, NORM_NFD, NORM_NFKD, NORM_NFC, NORM_NFKC, NORM_LOWERCASE, NORM_STRIP, NORM_STRIP_ACCENTS };
typedef struct {
    int kind;
    Pat pat;    /* Replace */
    char *text; /* Replace: content; Prepend: prepend */
    size_t len;
    int left, right; /* Strip */
} NormStep;

enum { PRE_SPLIT, PRE_METASPACE, PRE_BYTELEVEL };
enum { SPLIT_REMOVED, SPLIT_ISOLATED, SPLIT_PREVIOUS, SPLIT_NEXT, SPLIT_CONTIGUOUS };
enum { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER };
typedef struct {
    int kind;
    Pat pat;            /* Split: pattern (Metaspace: its replacement, as a literal) */
    int behavior, invert;
    int scheme, split;  /* Metaspace */
    int use_regex;      /* ByteLevel */
} PreStep;

enum { DEC_REPLACE, DEC_BYTEFALLBACK, DEC_FUSE, DEC_STRIP, DEC_METASPACE, DEC_BYTELEVEL };
typedef struct {
    int kind;
    Pat pat;        /* Replace */
    char *text;     /* Replace: content */
    size_t len;
    uint32_t ch;    /* Strip: content; Metaspace: replacement */
    size_t start, stop; /* Strip */
    int scheme;     /* Metaspace */
} DecStep;

#define TPL_A (-1) /* a template item: sequence A (else a special token's id) */
typedef struct {
    int32_t *items;
    size_t n;
} Template;

/* ---------------------------------------------------------------------------------------------------------
 * The tokenizer */

typedef struct {
    char *text;      /* content */
    size_t len;
    char *norm;      /* normalized=true and the normalizer changes the content: what HF matches and decodes */
    size_t norm_len;
    int32_t id;
    uint8_t special, normalized, single_word, lstrip, rstrip;
} AddedTok;

/* Byte trie over the added tokens of one pass (matched on raw text: normalized=false; on normalized text:
 * normalized=true). */
typedef struct {
    int32_t root[256]; /* child of the root per byte, -1 for none */
    uint8_t pair2[8192]; /* bit (b0 << 8 | b1): some pattern starts with the bytes b0 b1 (a cheap first test) */
    PairMap edges;     /* (node << 8 | byte) -> child, below the root */
    int32_t *tok;      /* node -> index into Tokenizer.added, -1 */
    int32_t n, cap;
} Trie;

struct TokenizerCache {
    const Tokenizer *owner; /* entries are only valid for the tokenizer that made them */
    StrMap map;             /* piece bytes -> (offset << 16 | count) into ids */
    IdBuf ids;
};

/* Token texts live in blocks that never move (one allocation per block, not per token). */
typedef struct TextBlock {
    struct TextBlock *next;
    size_t used, cap;
    char data[];
} TextBlock;

struct Tokenizer {
    TextBlock *texts;
    int32_t n_ids;      /* largest id + 1 */
    size_t ids_cap;
    char **tok;         /* id -> text (NUL-terminated), NULL for a hole */
    uint32_t *tok_len;
    uint8_t *in_model;  /* id is in model.vocab (not only an added token) */
    Buf dec;            /* ByteLevel decoding of every id's decoder text, concatenated */
    size_t *dec_off;    /* [n_ids + 1] */
    StrMap vocab;       /* model.vocab text -> id */
    int32_t byte_id[256];  /* token of each byte's byte-level character (byte-level pipelines) */
    int32_t *bmp_id;       /* token of each character U+0000..U+FFFF, -1 (other pipelines) */
    int32_t byte_fb[256];  /* token "<0xNN>" (byte_fallback), -1 */
    PairMap merges;     /* (left, right) -> rank << 32 | new id; a repeated pair keeps its last rank, like HF */
    int32_t (*merge_list)[2];
    int32_t n_merges, merges_cap;
    PairMap cross;      /* (last symbol of a merge's left part, first symbol of its right part) */
    uint8_t chunk_ok;   /* long pieces may be cut where `cross` says no merge can join */
    AddedTok *added;
    int n_added;
    Trie trie[2];
    int32_t *added_of;  /* id -> index into added, -1 */
    StrMap special_text; /* texts decode skips with skip_special (HF compares the token string) */
    pcre2_code *word_re; /* Rust's \w, for single_word added tokens */
    int32_t unk_id;
    uint8_t fuse_unk, ignore_merges, byte_fallback;
    uint8_t byte_level;  /* the pre-tokenizer ends with ByteLevel: the model sees raw bytes */
    NormStep norm[MAX_STEPS];
    int n_norm;
    PreStep pre[MAX_STEPS];
    int n_pre;
    DecStep decs[MAX_STEPS];
    int n_dec;
    uint8_t has_decoder, dec_bytelevel_only;
    Template post[MAX_STEPS];
    int n_post;
    char *js[4];        /* normalizer, pre_tokenizer, post_processor, decoder: JSON for tokenizer_to_json */
    char *cfg_special[2]; /* tokenizer_config.json's bos_token, eos_token (NULL: none) */
    TokenizerCache *cache;
};

typedef struct {
    int special, normalized, single_word, lstrip, rstrip;
} AddedFlags;

/* ---------------------------------------------------------------------------------------------------------
 * Encoding: scratch space */

typedef struct {
    IdBuf sym;            /* symbols of the piece being merged */
    size_t *pos;          /* byte offset of each symbol that starts a character (SIZE_MAX inside one) */
    size_t pos_cap;
    IdBuf aux;            /* naive merge: pair values; heap merge: prev/next links */
    Buf heap;             /* heap merge: entries */
    Buf text;             /* byte-level spelling (ignore_merges lookups) */
    Buf lossy;            /* the text with invalid UTF-8 replaced */
    Buf norm[2];          /* normalizer output, alternately */
    struct UChar *uc[2];  /* Unicode normalizers: decomposed, then recomposed characters */
    size_t uc_cap[2];
    Buf lvl[MAX_STEPS];   /* a Metaspace pre-tokenizer's output, per step */
    SegBuf seg;           /* tok_find_segments output */
    SegBuf pieces[MAX_STEPS]; /* each pre-tokenizer step's pieces */
    pcre2_match_data *md;
} Scratch;

/* ---------------------------------------------------------------------------------------------------------
 * Functions the files share (their comments are at their definitions) */

/* tokenizer.c */
int tok_put_bytelevel(Buf *b, const uint8_t *s, size_t n);
void tok_byte_token_order(int order[256]);
int tok_find_segments(const Pat *p, pcre2_match_data *md, const uint8_t *s, size_t n, int invert, SegBuf *out);
Tokenizer *tok_new(void);
int tok_add_vocab(Tokenizer *t, const char *text, size_t len, int32_t id);
int tok_add_merge(Tokenizer *t, int32_t a, int32_t b, int32_t new_id);
int tok_add_added(Tokenizer *t, const char *text, size_t len, int32_t id, AddedFlags f);
void tok_templates_free(Tokenizer *t);
int tok_finish(Tokenizer *t, const char *label, ZyErr *err);

/* tokenizer_normalize.c */
int tok_apply_replace(const Pat *pat, const char *content, size_t clen, Scratch *sc, const uint8_t *s, size_t n,
                      size_t *zp, Buf *out);
int tok_normalize(const Tokenizer *t, Scratch *sc, const uint8_t *s, size_t n, const uint8_t **out, size_t *out_n,
                  size_t *zp);

/* tokenizer_json.c */
struct cJSON;
const char *tok_shown(const char *s, char buf[200]);
int tok_load_pipeline(const struct cJSON *root, const char *label, Tokenizer *t, ZyErr *err);

/* tokenizer_pretok.c */
size_t tok_piece_end(const uint8_t *s, size_t n, size_t i);

#endif
