/* BPE tokenizer, file-compatible with Hugging Face `tokenizers` (tokenizer.json): the byte-level pipelines
 * zaya trains and GPT-2/Llama-3 style files, and SentencePiece-converted pipelines as released (Gemma 3:
 * Replace normalizer, Split pre-tokenizer, byte_fallback BPE, Replace/ByteFallback/Fuse decoders,
 * TemplateProcessing). Every component follows HF's implementation step for step, so that for valid UTF-8
 * the ids equal HF's Tokenizer.encode(text).ids and decode equals HF's decode.
 *
 * Encoding runs HF's stages: added tokens with normalized=false are split out of the raw text
 * (leftmost-longest, with their single_word / lstrip / rstrip rules), each remaining piece is normalized,
 * added tokens with normalized=true are split out of the normalized text, the pre-tokenizers cut the rest
 * into pieces, the BPE model encodes each piece, and the post-processor adds special tokens.
 *
 * Pre-tokenization for ByteLevel(use_regex) implements the GPT-2 regex
 *     's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * as a hand-written scanner over a Unicode class table (letter / number / white space / other). HF runs the
 * regex with Oniguruma, whose tables are Unicode 16; PCRE2 10.42 (Debian 12) knows only Unicode 14 and would
 * split 9,392 newer letters differently, so the scanner carries its own table, generated from HF itself
 * (tests/oracle/test_tokenizer.py --gen-unicode-table, and checked for every code point by that suite).
 * PCRE2 (UTF + UCP) running the regex itself stays as the reference the unit tests and the fuzzer compare
 * the scanner with. Onig's \s is the White_Space property (U+0085 included, unlike PCRE2's \s).
 * Regex patterns of other components (Split, Replace) run on PCRE2 (JIT when available): the patterns in
 * released files (character classes, alternations, lookahead) mean the same there as in Oniguruma, but
 * Unicode properties follow PCRE2's Unicode version.
 *
 * Invalid UTF-8 (which a Python string cannot hold, so HF never sees it), defined by zaya:
 *  - byte-level pipelines (the pre-tokenizer ends with ByteLevel): the text is cut into maximal valid runs;
 *    each byte that does not start a valid character (Rust's definition: no overlongs, surrogates or code
 *    points above U+10FFFF) is a model piece of its own and acts like an added token between the runs (the
 *    end of the text for the regex next to it). Every byte has a token, so decode(encode(x)) == x.
 *  - every other pipeline: each maximal invalid sequence becomes U+FFFD first (Python's errors="replace",
 *    Rust's from_utf8_lossy), so encode(x) == HF encode(x.decode("utf-8", errors="replace")); with
 *    byte_fallback, U+FFFD encodes as its vocabulary token or as <0xEF><0xBF><0xBD>.
 *
 * BPE encoding applies merges exactly as HF's Word::merge_all: repeatedly the adjacent pair of lowest rank,
 * leftmost first. A long piece (Gemma 3's pre-tokenizer leaves a whole text in one piece) is cut between
 * two symbols that no merge can ever join (no merge's left part ends with the left symbol while its right
 * part starts with the right one), which gives the same ids and lets the parts use the cache. Encoded
 * pieces are cached per Tokenizer (or per TokenizerCache). */
#define _POSIX_C_SOURCE 200809L
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/tokenizer.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <utf8proc.h>
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

/* Makes room for n entries in all (grow: double). */
static int sm_resize(StrMap *m, size_t n) {
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
static SmSlot *sm_put(StrMap *m, const void *key, size_t len, uint64_t h, int *is_new) {
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

/* Makes room for n entries in all. */
static int pm_resize(PairMap *m, size_t n) {
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
static int64_t *pm_put(PairMap *m, uint64_t key, int *is_new) {
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
 * More UTF-8: white space, character boundaries, invalid sequences */

/* The White_Space property: Rust's \s, which HF's added tokens use for lstrip / rstrip. */
static int is_white_space(uint32_t cp) {
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

/* Start of the last character of s[0..n) (n > 0), and its code point (NOT_A_CHAR for an invalid byte). */
static size_t last_char(const uint8_t *s, size_t n, uint32_t *cp) {
    for (size_t l = 1; l <= 4 && l <= n; l++)
        if (utf8_char(s + n - l, l, cp) == (int)l) return n - l;
    *cp = NOT_A_CHAR;
    return n - 1;
}

static int utf8_valid(const uint8_t *s, size_t n) {
    uint32_t cp;
    for (size_t i = 0; i < n;) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        int l = utf8_char(s + i, n - i, &cp);
        if (!l) return 0;
        i += (size_t)l;
    }
    return 1;
}

/* Bytes that one U+FFFD replaces when s[0] starts no valid character: the maximal prefix of a valid
 * sequence (at least one byte), as Python's errors="replace" and Rust's from_utf8_lossy count them. */
static size_t invalid_len(const uint8_t *s, size_t n) {
    uint8_t c = s[0], lo = 0x80, hi = 0xBF;
    size_t need;
    if (c >= 0xC2 && c <= 0xDF) {
        need = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 2;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else {
        return 1;
    }
    size_t k = 1;
    if (k < n && s[k] >= lo && s[k] <= hi) {
        k++;
        while (k <= need && k < n && (s[k] & 0xC0) == 0x80) k++;
    }
    return k;
}

/* Appends s with every maximal invalid sequence replaced by U+FFFD. */
static int put_lossy(Buf *b, const uint8_t *s, size_t n) {
    uint32_t cp;
    for (size_t i = 0; i < n;) {
        size_t j = i;
        while (j < n) {
            int l = s[j] < 0x80 ? 1 : utf8_char(s + j, n - j, &cp);
            if (!l) break;
            j += (size_t)l;
        }
        if (buf_put(b, s + i, j - i)) return -1;
        if (j == n) break;
        if (buf_put(b, "\xEF\xBF\xBD", 3)) return -1;
        i = j + invalid_len(s + j, n - j);
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------------------
 * Patterns (Replace, Split): a literal string or a regex, matched as HF's find_matches does */

typedef struct {
    char *lit;      /* String pattern, NUL-terminated; NULL for a Regex */
    size_t lit_len;
    pcre2_code *re; /* Regex pattern */
} Pat;

static void pat_free(Pat *p) {
    free(p->lit);
    if (p->re) pcre2_code_free(p->re);
    memset(p, 0, sizeof *p);
}

/* A piece [a, b) of a string; m: a pattern match (find_segments) or a delimiter to drop. */
typedef struct {
    size_t a, b;
    int m;
} Seg;

typedef struct {
    Seg *p;
    size_t n, cap;
} SegBuf;

static int seg_push(SegBuf *s, size_t a, size_t b, int m) {
    if (s->n == s->cap) {
        size_t nc = s->cap ? s->cap * 2 : 64;
        Seg *q = realloc(s->p, nc * sizeof *q);
        if (!q) return -1;
        s->p = q;
        s->cap = nc;
    }
    s->p[s->n++] = (Seg){a, b, m};
    return 0;
}

#define PAT_ERROR (-2)

/* Leftmost match of p in s[0..n) starting at or after `from` (<= n): 1 with [*a, *b), 0 for none,
 * PAT_ERROR when PCRE2 gives up (match limit). */
static int pat_next(const Pat *p, pcre2_match_data *md, const uint8_t *s, size_t n, size_t from, size_t *a, size_t *b) {
    if (!p->re) {
        if (!p->lit_len) { /* the empty string matches everywhere */
            *a = *b = from;
            return 1;
        }
        if (p->lit_len > n || from > n - p->lit_len) return 0;
        const uint8_t *q = s + from, *end = s + n - p->lit_len + 1;
        uint8_t c0 = (uint8_t)p->lit[0];
        while (q < end) {
            q = memchr(q, c0, (size_t)(end - q));
            if (!q) return 0;
            if (memcmp(q, p->lit, p->lit_len) == 0) {
                *a = (size_t)(q - s);
                *b = *a + p->lit_len;
                return 1;
            }
            q++;
        }
        return 0;
    }
    int rc = pcre2_match(p->re, s, n, from, 0, md, NULL);
    if (rc == PCRE2_ERROR_NOMATCH) return 0;
    if (rc < 0) return PAT_ERROR;
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    if (ov[1] < ov[0]) return PAT_ERROR; /* \K in a lookaround can do that; no tokenizer needs it */
    *a = ov[0];
    *b = ov[1];
    return 1;
}

/* HF's Pattern::find_matches: s[0..n) cut into matches and the gaps between them, covering it all (nothing
 * for an empty string). Matches come as Oniguruma's find_iter gives them: leftmost, not overlapping, and an
 * empty match right where the previous match ended is skipped. invert flips which segments are matches. */
static int find_segments(const Pat *p, pcre2_match_data *md, const uint8_t *s, size_t n, int invert, SegBuf *out) {
    out->n = 0;
    if (!n) return 0;
    size_t from = 0, prev = 0, last_end = 0;
    int have = 0;
    while (from <= n) {
        size_t a, b;
        int r = pat_next(p, md, s, n, from, &a, &b);
        if (r == PAT_ERROR) return PAT_ERROR;
        if (!r) break;
        if (a == b && have && last_end == b) {
            uint32_t cp;
            from += from < n ? char_at_cp(s, n, from, &cp) : 1;
            continue;
        }
        from = last_end = b;
        have = 1;
        if (prev != a && seg_push(out, prev, a, invert)) return -1;
        if (seg_push(out, a, b, !invert)) return -1;
        prev = b;
    }
    if (prev != n && seg_push(out, prev, n, invert)) return -1;
    return 0;
}

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

#define CACHE_MAX_PIECE 256     /* longer pieces are not cached (as HF) */
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

static void trie_free(Trie *tr) {
    pm_free(&tr->edges);
    free(tr->tok);
}

static void templates_free(Tokenizer *t) {
    for (int i = 0; i < t->n_post; i++) free(t->post[i].items);
    t->n_post = 0;
}

void tokenizer_free(Tokenizer *t) {
    if (!t) return;
    for (TextBlock *b = t->texts, *nx; b; b = nx) {
        nx = b->next;
        free(b);
    }
    free(t->tok);
    free(t->tok_len);
    free(t->in_model);
    free(t->dec.p);
    free(t->dec_off);
    sm_free(&t->vocab);
    pm_free(&t->merges);
    pm_free(&t->cross);
    free(t->merge_list);
    for (int i = 0; i < t->n_added; i++) {
        free(t->added[i].text);
        free(t->added[i].norm);
    }
    free(t->added);
    trie_free(&t->trie[0]);
    trie_free(&t->trie[1]);
    free(t->added_of);
    free(t->bmp_id);
    sm_free(&t->special_text);
    if (t->word_re) pcre2_code_free(t->word_re);
    for (int i = 0; i < t->n_norm; i++) {
        pat_free(&t->norm[i].pat);
        free(t->norm[i].text);
    }
    for (int i = 0; i < t->n_pre; i++) pat_free(&t->pre[i].pat);
    for (int i = 0; i < t->n_dec; i++) {
        pat_free(&t->decs[i].pat);
        free(t->decs[i].text);
    }
    templates_free(t);
    for (int i = 0; i < 4; i++) free(t->js[i]);
    for (int i = 0; i < 2; i++) free(t->cfg_special[i]);
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
static char *text_alloc(Tokenizer *t, size_t n) {
    TextBlock *b = t->texts;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > (1u << 20) ? n : (1u << 20);
        TextBlock *nb = malloc(sizeof *nb + cap);
        if (!nb) return NULL;
        nb->next = b;
        nb->used = 0;
        nb->cap = cap;
        t->texts = b = nb;
    }
    char *p = b->data + b->used;
    b->used += n;
    return p;
}

static int tok_set_text(Tokenizer *t, int32_t id, const char *text, size_t len, int in_model) {
    if (tok_reserve_ids(t, id)) return -1;
    char *c = text_alloc(t, len + 1);
    if (!c) return -1;
    memcpy(c, text, len);
    c[len] = '\0';
    t->tok[id] = c;
    t->tok_len[id] = (uint32_t)len;
    t->in_model[id] |= (uint8_t)in_model;
    if (id >= t->n_ids) t->n_ids = id + 1;
    return 0;
}

/* 0: added; 1: the text is in the vocabulary already; -1: out of memory. */
static int tok_add_vocab(Tokenizer *t, const char *text, size_t len, int32_t id) {
    int is_new;
    SmSlot *s = sm_put(&t->vocab, text, len, hash_bytes((const uint8_t *)text, len), &is_new);
    if (!s) return -1;
    if (!is_new) return 1;
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

typedef struct {
    int special, normalized, single_word, lstrip, rstrip;
} AddedFlags;

static int tok_add_added(Tokenizer *t, const char *text, size_t len, int32_t id, AddedFlags f) {
    void *q = realloc(t->added, (size_t)(t->n_added + 1) * sizeof *t->added);
    if (!q) return -1;
    t->added = q;
    AddedTok *a = &t->added[t->n_added];
    memset(a, 0, sizeof *a);
    a->text = malloc(len + 1);
    if (!a->text) return -1;
    memcpy(a->text, text, len);
    a->text[len] = '\0';
    a->len = len;
    a->id = id;
    a->special = (uint8_t)f.special;
    a->normalized = (uint8_t)f.normalized;
    a->single_word = (uint8_t)f.single_word;
    a->lstrip = (uint8_t)f.lstrip;
    a->rstrip = (uint8_t)f.rstrip;
    t->n_added++;
    if (((size_t)id >= t->ids_cap || !t->tok[id]) && tok_set_text(t, id, text, len, 0)) return -1;
    return 0;
}

/* The token string HF's decoder receives for id: a normalized added token's normalized content, else the text. */
static const char *dtext(const Tokenizer *t, int32_t id, size_t *len) {
    int32_t a = t->added_of ? t->added_of[id] : -1;
    if (a >= 0 && t->added[a].norm) {
        *len = t->added[a].norm_len;
        return t->added[a].norm;
    }
    *len = t->tok_len[id];
    return t->tok[id];
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
 * Added tokens: tries, matching */

static int trie_node(Trie *tr) {
    if (tr->n == tr->cap) {
        int32_t cap = tr->cap ? tr->cap * 2 : 64;
        int32_t *q = realloc(tr->tok, (size_t)cap * sizeof *q);
        if (!q) return -1;
        tr->tok = q;
        tr->cap = cap;
    }
    tr->tok[tr->n] = -1;
    return tr->n++;
}

/* Adds pattern s -> added index k; returns the index already there for the same pattern (or -1), -2 when out
 * of memory. */
static int trie_add(Trie *tr, const uint8_t *s, size_t n, int32_t k) {
    if (!tr->n) {
        for (int b = 0; b < 256; b++) tr->root[b] = -1;
        if (trie_node(tr) < 0) return -2;
    }
    if (n >= 2) tr->pair2[(s[0] << 8 | s[1]) >> 3] |= (uint8_t)(1u << (s[1] & 7));
    int32_t node = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t child;
        if (node == 0) {
            child = tr->root[s[i]];
        } else {
            int64_t *v = pm_get(&tr->edges, (uint64_t)node << 8 | s[i]);
            child = v ? (int32_t)*v : -1;
        }
        if (child < 0) {
            child = trie_node(tr);
            if (child < 0) return -2;
            if (node == 0) {
                tr->root[s[i]] = child;
            } else {
                int is_new;
                int64_t *v = pm_put(&tr->edges, (uint64_t)node << 8 | s[i], &is_new);
                if (!v) return -2;
                *v = child;
            }
        }
        node = child;
    }
    int32_t old = tr->tok[node];
    tr->tok[node] = k;
    return old;
}

/* The longest pattern starting at s[p]: its added index and length, or -1. */
static int32_t trie_longest(const Trie *tr, const uint8_t *s, size_t n, size_t p, size_t *len) {
    int32_t node = tr->root[s[p]], best = -1;
    for (size_t i = p; node >= 0;) {
        if (tr->tok[node] >= 0) {
            best = tr->tok[node];
            *len = i + 1 - p;
        }
        if (++i >= n) break;
        const int64_t *v = pm_get(&tr->edges, (uint64_t)node << 8 | s[i]);
        node = v ? (int32_t)*v : -1;
    }
    return best;
}

/* Rust's \w on the character at s[i] (none: 0). */
static int is_word_at(const Tokenizer *t, pcre2_match_data *md, const uint8_t *s, size_t n, size_t i) {
    uint32_t cp;
    size_t l = char_at_cp(s, n, i, &cp);
    if (cp == NOT_A_CHAR) return 0;
    return pcre2_match(t->word_re, s + i, l, 0, PCRE2_ANCHORED, md, NULL) >= 0;
}

/* ---------------------------------------------------------------------------------------------------------
 * Encoding: scratch space, normalizers */

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
    SegBuf seg;           /* find_segments output */
    SegBuf pieces[MAX_STEPS]; /* each pre-tokenizer step's pieces */
    pcre2_match_data *md;
} Scratch;

static int scratch_init(Scratch *s) {
    memset(s, 0, sizeof *s);
    s->md = pcre2_match_data_create(1, NULL); /* only the whole match is read */
    return s->md ? 0 : -1;
}

static void scratch_free(Scratch *s) {
    free(s->sym.p);
    free(s->pos);
    free(s->aux.p);
    free(s->heap.p);
    free(s->text.p);
    free(s->lossy.p);
    for (int i = 0; i < 2; i++) {
        free(s->norm[i].p);
        free(s->uc[i]);
    }
    for (int i = 0; i < MAX_STEPS; i++) {
        free(s->lvl[i].p);
        free(s->pieces[i].p);
    }
    free(s->seg.p);
    if (s->md) pcre2_match_data_free(s->md);
}

/* zp, carried with every piece: how many of its leading bytes HF aligns to byte 0 of the original text.
 * Only Metaspace's prepend_scheme "first" reads it (HF asks whether the piece's original offset is 0); it
 * follows HF's alignment rules through Replace and Prepend. */

/* Replace: s with every match of pat replaced by content, into out. HF aligns the content of a match [a, b)
 * with byte b - 1 (with the start of the text for an empty match at 0). */
static int apply_replace(const Pat *pat, const char *content, size_t clen, Scratch *sc, const uint8_t *s, size_t n,
                         size_t *zp, Buf *out) {
    out->n = 0;
    int rc = find_segments(pat, sc->md, s, n, 0, &sc->seg);
    if (rc) return rc;
    size_t z = *zp, nz = 0;
    int open = 1;
    for (size_t k = 0; k < sc->seg.n; k++) {
        Seg g = sc->seg.p[k];
        if (!g.m) {
            if (buf_put(out, s + g.a, g.b - g.a)) return -1;
            if (open) {
                size_t e = g.b < z ? g.b : z;
                if (e > g.a) nz += e - g.a;
                if (z < g.b) open = 0;
            }
        } else {
            if (buf_put(out, content, clen)) return -1;
            if (open) {
                if (g.b == 0 || g.b - 1 < z)
                    nz += clen;
                else
                    open = 0;
            }
        }
    }
    *zp = nz;
    return 0;
}

/* Prepend (HF: only on a non-empty string; the new bytes share the first character's alignment). */
static int apply_prepend(const char *p, size_t pl, const uint8_t *s, size_t n, size_t *zp, Buf *out) {
    out->n = 0;
    if (!n) {
        *zp = 0;
        return 0;
    }
    if (buf_put(out, p, pl) || buf_put(out, s, n)) return -1;
    if (*zp) *zp += pl;
    return 0;
}

/* ---------------------------------------------------------------------------------------------------------
 * Unicode normalizers: NFD, NFKD, NFC, NFKC, Lowercase, Strip, StripAccents
 *
 * The character data (decompositions, combining classes, compositions, lower case, general category) comes
 * from utf8proc; the algorithms are those of HF's crates step for step, because HF's alignments (all zaya
 * keeps of them is zp) follow each output character's "change". HF's NFx is unicode-normalization-alignments
 * 0.1, whose tables are Unicode 9.0; its Lowercase is Rust's char::to_lowercase (the Unicode of the Rust that
 * built it); StripAccents drops the Unicode 9.0 marks. The tables below hold where those differ from
 * utf8proc's: generated by `tests/oracle/test_tokenizer_normalizers.py --gen-tables` (HF against utf8proc),
 * and that suite checks every code point against HF. */

typedef struct {
    uint32_t lo, hi;
} CpRange;
typedef struct {
    uint32_t lo, hi;
    int32_t delta;
} CaseRange;

/* generated against utf8proc 15.0.0 and tokenizers 0.23.3 */
/* Characters HF's NFx do not know (newer than Unicode 9.0): no decomposition, combining class 0, and they
 * compose with nothing (U+11930 is the second half of U+11938). */
static const CpRange norm_inert[] = {
    {0x7FD, 0x7FD}, {0x898, 0x89F}, {0x8CA, 0x8D3}, {0x9FE, 0x9FE}, {0xC3C, 0xC3C}, {0xD3B, 0xD3C},
    {0xEBA, 0xEBA}, {0x1715, 0x1715}, {0x1ABF, 0x1ACE}, {0x1DF6, 0x1DFA}, {0x32FF, 0x32FF}, {0xA7F2, 0xA7F4},
    {0xA82C, 0xA82C}, {0xAB69, 0xAB69}, {0x10781, 0x10785}, {0x10787, 0x107B0}, {0x107B2, 0x107BA}, {0x10D24, 0x10D27},
    {0x10EAB, 0x10EAC}, {0x10EFD, 0x10EFF}, {0x10F46, 0x10F50}, {0x10F82, 0x10F85}, {0x11070, 0x11070}, {0x1133B, 0x1133B},
    {0x1145E, 0x1145E}, {0x11839, 0x1183A}, {0x11930, 0x11930}, {0x11938, 0x11938}, {0x1193D, 0x1193E}, {0x11943, 0x11943},
    {0x119E0, 0x119E0}, {0x11A34, 0x11A34}, {0x11A47, 0x11A47}, {0x11A99, 0x11A99}, {0x11D42, 0x11D42}, {0x11D44, 0x11D45},
    {0x11D97, 0x11D97}, {0x11F41, 0x11F42}, {0x16FF0, 0x16FF1}, {0x1E030, 0x1E06D}, {0x1E08F, 0x1E08F}, {0x1E130, 0x1E136},
    {0x1E2AE, 0x1E2AE}, {0x1E2EC, 0x1E2EF}, {0x1E4EC, 0x1E4EF}, {0x1F16C, 0x1F16C}, {0x1FBF0, 0x1FBF9},
};
/* Marks (general category M) for utf8proc but not for HF's StripAccents, or the other way round. */
static const CpRange mark_flip[] = {
    {0x7FD, 0x7FD}, {0x898, 0x89F}, {0x8CA, 0x8D3}, {0x9FE, 0x9FE}, {0xAFA, 0xAFF}, {0xB55, 0xB55},
    {0xC04, 0xC04}, {0xC3C, 0xC3C}, {0xCF3, 0xCF3}, {0xD00, 0xD00}, {0xD3B, 0xD3C}, {0xD81, 0xD81},
    {0xEBA, 0xEBA}, {0xECE, 0xECE}, {0x1715, 0x1715}, {0x180F, 0x180F}, {0x1ABF, 0x1ACE}, {0x1CF2, 0x1CF3},
    {0x1CF7, 0x1CF7}, {0x1DF6, 0x1DFA}, {0xA82C, 0xA82C}, {0xA8FF, 0xA8FF}, {0x10D24, 0x10D27}, {0x10EAB, 0x10EAC},
    {0x10EFD, 0x10EFF}, {0x10F46, 0x10F50}, {0x10F82, 0x10F85}, {0x11070, 0x11070}, {0x11073, 0x11074}, {0x110C2, 0x110C2},
    {0x11145, 0x11146}, {0x111C9, 0x111C9}, {0x111CE, 0x111CF}, {0x11241, 0x11241}, {0x1133B, 0x1133B}, {0x1145E, 0x1145E},
    {0x1182C, 0x1183A}, {0x11930, 0x11935}, {0x11937, 0x11938}, {0x1193B, 0x1193E}, {0x11940, 0x11940}, {0x11942, 0x11943},
    {0x119D1, 0x119D7}, {0x119DA, 0x119E0}, {0x119E4, 0x119E4}, {0x11A01, 0x11A0A}, {0x11A33, 0x11A39}, {0x11A3B, 0x11A3E},
    {0x11A47, 0x11A47}, {0x11A51, 0x11A5B}, {0x11A8A, 0x11A99}, {0x11D31, 0x11D36}, {0x11D3A, 0x11D3A}, {0x11D3C, 0x11D3D},
    {0x11D3F, 0x11D45}, {0x11D47, 0x11D47}, {0x11D8A, 0x11D8E}, {0x11D90, 0x11D91}, {0x11D93, 0x11D97}, {0x11EF3, 0x11EF6},
    {0x11F00, 0x11F01}, {0x11F03, 0x11F03}, {0x11F34, 0x11F3A}, {0x11F3E, 0x11F42}, {0x13440, 0x13440}, {0x13447, 0x13455},
    {0x16F4F, 0x16F4F}, {0x16F7F, 0x16F87}, {0x16FE4, 0x16FE4}, {0x16FF0, 0x16FF1}, {0x1CF00, 0x1CF2D}, {0x1CF30, 0x1CF46},
    {0x1E08F, 0x1E08F}, {0x1E130, 0x1E136}, {0x1E2AE, 0x1E2AE}, {0x1E2EC, 0x1E2EF}, {0x1E4EC, 0x1E4EF},
};
/* Lower-case mappings Rust has and utf8proc lacks (newer letters): cp -> cp + delta. */
static const CaseRange lower_extra[] = {
    {0x1C89, 0x1C89, 1}, {0xA7CB, 0xA7CB, -42343}, {0xA7CC, 0xA7CC, 1}, {0xA7CE, 0xA7CE, 1}, {0xA7D2, 0xA7D2, 1},
    {0xA7D4, 0xA7D4, 1}, {0xA7DA, 0xA7DA, 1}, {0xA7DC, 0xA7DC, -42561}, {0x10D50, 0x10D65, 32}, {0x16EA0, 0x16EB8, 27},
};

static int in_ranges(uint32_t cp, const CpRange *r, size_t n) {
    if (cp < r[0].lo || cp > r[n - 1].hi) return 0;
    size_t a = 0, b = n;
    while (a < b) {
        size_t m = (a + b) / 2;
        if (cp > r[m].hi)
            a = m + 1;
        else if (cp < r[m].lo)
            b = m;
        else
            return 1;
    }
    return 0;
}

static int put_cp(Buf *b, uint32_t cp) {
    if (buf_reserve(b, 4)) return -1;
    uint8_t *q = b->p + b->n;
    if (cp < 0x80) {
        q[0] = (uint8_t)cp;
        b->n += 1;
    } else if (cp < 0x800) {
        q[0] = (uint8_t)(0xC0 | cp >> 6);
        q[1] = (uint8_t)(0x80 | (cp & 0x3F));
        b->n += 2;
    } else if (cp < 0x10000) {
        q[0] = (uint8_t)(0xE0 | cp >> 12);
        q[1] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
        q[2] = (uint8_t)(0x80 | (cp & 0x3F));
        b->n += 3;
    } else {
        q[0] = (uint8_t)(0xF0 | cp >> 18);
        q[1] = (uint8_t)(0x80 | (cp >> 12 & 0x3F));
        q[2] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
        q[3] = (uint8_t)(0x80 | (cp & 0x3F));
        b->n += 4;
    }
    return 0;
}

/* The next character of valid UTF-8 (normalizers only see valid text; a stray byte would read as U+FFFD). */
static size_t next_cp(const uint8_t *s, size_t n, size_t i, uint32_t *cp) {
    size_t l = char_at_cp(s, n, i, cp);
    if (*cp == NOT_A_CHAR) *cp = 0xFFFD;
    return l;
}

/* HF's NormalizedString::transform, reduced to what zaya keeps of the alignments (zp: how many leading bytes
 * are aligned with byte 0 of the original text). Each output character comes with HF's change: 0 replaces the
 * next input character, 1 is inserted (aligned with the byte before), -k replaces the next and removes k more.
 * The output characters aligned with byte 0 are a prefix, as the input's are. */
typedef struct {
    Buf *out;
    const uint8_t *s;
    size_t n, idx; /* the input, and how many of its bytes the changes have consumed (HF's offset) */
    size_t zp_in, zp;
    int open;
} Xf;

static void xf_init(Xf *x, Buf *out, const uint8_t *s, size_t n, size_t zp_in, size_t skip) {
    out->n = 0;
    *x = (Xf){out, s, n, 0, zp_in, 0, zp_in > 0};
    uint32_t cp;
    for (size_t k = 0; k < skip && x->idx < n; k++) x->idx += next_cp(s, n, x->idx, &cp);
}

static int xf_emit(Xf *x, uint32_t cp, long change) {
    size_t before = x->out->n;
    if (put_cp(x->out, cp)) return -1;
    if (x->open) {
        if (change > 0 ? x->idx <= x->zp_in : x->idx < x->zp_in)
            x->zp += x->out->n - before;
        else
            x->open = 0;
    }
    uint32_t c;
    for (long k = 0; change <= 0 && k <= -change && x->idx < x->n; k++) x->idx += next_cp(x->s, x->n, x->idx, &c);
    return 0;
}

typedef struct UChar {
    uint32_t cp;
    int32_t change;
    uint8_t ccc;
} UChar;

static int uc_reserve(Scratch *sc, int k, size_t need) {
    if (need <= sc->uc_cap[k]) return 0;
    size_t cap = sc->uc_cap[k] ? sc->uc_cap[k] : 64;
    while (cap < need) {
        if (cap > SIZE_MAX / 2 / sizeof(UChar)) return -1;
        cap *= 2;
    }
    UChar *q = realloc(sc->uc[k], cap * sizeof *q);
    if (!q) return -1;
    sc->uc[k] = q;
    sc->uc_cap[k] = cap;
    return 0;
}

/* Canonical combining class as HF sees it (0 below U+0300 and for what HF does not know). */
static uint8_t ccc_of(uint32_t cp) {
    if (cp < 0x300) return 0;
    int c = utf8proc_get_property((utf8proc_int32_t)cp)->combining_class;
    return c && !in_ranges(cp, norm_inert, ZY_ARRAY_LEN(norm_inert)) ? (uint8_t)c : 0;
}

#define HANGUL_S 0xAC00u
#define HANGUL_L 0x1100u
#define HANGUL_V 0x1161u
#define HANGUL_T 0x11A7u

/* The primary composite of a + b, 0 for none. Hangul is arithmetic (as HF's crate: an LV syllable takes
 * U+11A8..U+11C2, not U+11A7, which utf8proc 2.8 would swallow); the rest asks utf8proc about the pair. */
static uint32_t compose_pair(uint32_t a, uint32_t b) {
    if (a - HANGUL_L < 19) return b - HANGUL_V < 21 ? HANGUL_S + ((a - HANGUL_L) * 21 + (b - HANGUL_V)) * 28 : 0;
    if (a - HANGUL_S < 11172) return (a - HANGUL_S) % 28 == 0 && b - (HANGUL_T + 1) < 27 ? a + (b - HANGUL_T) : 0;
    if (b < 0x300 || in_ranges(a, norm_inert, ZY_ARRAY_LEN(norm_inert)) ||
        in_ranges(b, norm_inert, ZY_ARRAY_LEN(norm_inert)))
        return 0; /* every composition's second character is at U+0300 or above */
    utf8proc_int32_t pair[2] = {(utf8proc_int32_t)a, (utf8proc_int32_t)b};
    return utf8proc_normalize_utf32(pair, 2, UTF8PROC_COMPOSE | UTF8PROC_STABLE) == 1 ? (uint32_t)pair[0] : 0;
}

/* Stable sort of a run of non-starters by combining class (insertion sort; counting sort for long runs, which
 * only adversarial text has). */
static int sort_marks(Scratch *sc, UChar *u, size_t n) {
    if (n <= 32) {
        for (size_t i = 1; i < n; i++) {
            UChar x = u[i];
            size_t j = i;
            while (j > 0 && u[j - 1].ccc > x.ccc) {
                u[j] = u[j - 1];
                j--;
            }
            u[j] = x;
        }
        return 0;
    }
    if (uc_reserve(sc, 1, n)) return -1;
    size_t count[257] = {0};
    for (size_t i = 0; i < n; i++) count[u[i].ccc + 1]++;
    for (int c = 1; c < 257; c++) count[c] += count[c - 1];
    UChar *tmp = sc->uc[1];
    for (size_t i = 0; i < n; i++) tmp[count[u[i].ccc]++] = u[i];
    memcpy(u, tmp, n * sizeof *u);
    return 0;
}

/* unicode-normalization-alignments' Decompositions: each character's full decomposition (its first character
 * replaces it, the others are inserted), then each run of non-starters stably sorted by combining class. */
static int decompose(Scratch *sc, const uint8_t *s, size_t n, int compat, size_t *m_out) {
    size_t m = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        i += next_cp(s, n, i, &cp);
        utf8proc_int32_t d[32];
        utf8proc_ssize_t k = 1;
        d[0] = (utf8proc_int32_t)cp;
        if (cp >= 0x80 && !in_ranges(cp, norm_inert, ZY_ARRAY_LEN(norm_inert))) {
            k = utf8proc_decompose_char((utf8proc_int32_t)cp, d, 32, UTF8PROC_DECOMPOSE | (compat ? UTF8PROC_COMPAT : 0), NULL);
            if (k < 1 || k > 32) return -1; /* no decomposition is longer than 18 */
        }
        if (uc_reserve(sc, 0, m + (size_t)k)) return -1;
        for (utf8proc_ssize_t j = 0; j < k; j++)
            sc->uc[0][m++] = (UChar){(uint32_t)d[j], j ? 1 : 0, ccc_of((uint32_t)d[j])};
    }
    UChar *u = sc->uc[0];
    for (size_t a = 0; a < m;) {
        if (!u[a].ccc) {
            a++;
            continue;
        }
        size_t b = a;
        while (b < m && u[b].ccc) b++;
        if (b - a > 1 && sort_marks(sc, u + a, b - a)) return -1;
        u = sc->uc[0];
        a = b;
    }
    *m_out = m;
    return 0;
}

/* unicode-normalization-alignments' Recompositions over the decomposed characters, into uc[1]: a composite
 * replaces its starter with change = starter's + mark's - 1; blocked marks wait and follow their starter. */
static int recompose(Scratch *sc, size_t m, size_t *m_out) {
    if (uc_reserve(sc, 1, m)) return -1;
    const UChar *in = sc->uc[0];
    UChar *out = sc->uc[1];
    /* out[0..o): emitted; the composee k goes to out[o] and the nb waiting marks sit at out[o + 1 ..] (o does not
     * move while marks wait, and o + 1 + nb never passes the input consumed) */
    size_t o = 0, nb = 0;
    UChar k = {0, 0, 0};
    int have = 0, last = -1; /* a composee; the class of the last waiting mark (-1: none) */
    for (size_t i = 0; i < m; i++) {
        UChar ch = in[i];
        if (!have) {
            if (ch.ccc)
                out[o++] = ch;
            else
                k = ch, have = 1;
            continue;
        }
        if (last < ch.ccc) { /* not blocked (no waiting mark, or the last one has a lower class) */
            uint32_t r = compose_pair(k.cp, ch.cp);
            if (r) {
                k = (UChar){r, k.change + ch.change - 1, 0};
                continue;
            }
        }
        if (!ch.ccc) { /* a starter: the composee, the waiting marks, then the starter is the composee */
            out[o] = k;
            o += 1 + nb;
            nb = 0;
            k = ch;
            last = -1;
            continue;
        }
        out[o + 1 + nb++] = ch;
        last = ch.ccc;
    }
    if (have) {
        out[o] = k;
        o += 1 + nb;
    }
    *m_out = o;
    return 0;
}

/* NFD / NFKD / NFC / NFKC: HF's nfd() etc. */
static int apply_nf(int kind, Scratch *sc, const uint8_t *s, size_t n, size_t *zp, Buf *out) {
    size_t m;
    int compat = kind == NORM_NFKD || kind == NORM_NFKC;
    if (decompose(sc, s, n, compat, &m)) return -1;
    const UChar *u = sc->uc[0];
    if (kind == NORM_NFC || kind == NORM_NFKC) {
        if (recompose(sc, m, &m)) return -1;
        u = sc->uc[1];
    }
    Xf x;
    xf_init(&x, out, s, n, *zp, 0);
    for (size_t i = 0; i < m; i++)
        if (xf_emit(&x, u[i].cp, u[i].change)) return -1;
    *zp = x.zp;
    return 0;
}

/* Lowercase: Rust's char::to_lowercase per character; U+0130 is its one mapping to two characters. */
static int apply_lowercase(const uint8_t *s, size_t n, size_t *zp, Buf *out) {
    Xf x;
    xf_init(&x, out, s, n, *zp, 0);
    for (size_t i = 0; i < n;) {
        uint32_t cp, lo;
        i += next_cp(s, n, i, &cp);
        if (cp < 0x80) {
            lo = cp - 'A' < 26 ? cp + 32 : cp;
        } else if (cp == 0x130) {
            if (xf_emit(&x, 'i', 0) || xf_emit(&x, 0x307, 1)) return -1;
            continue;
        } else {
            lo = (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp);
            for (size_t k = 0; k < ZY_ARRAY_LEN(lower_extra); k++)
                if (cp >= lower_extra[k].lo && cp <= lower_extra[k].hi) lo = (uint32_t)((int32_t)cp + lower_extra[k].delta);
        }
        if (xf_emit(&x, lo, 0)) return -1;
    }
    *zp = x.zp;
    return 0;
}

/* Strip: HF's lrstrip (Rust's char::is_whitespace). HF gives the removed trailing characters to the character
 * at char index len - trailing - 1 with len in bytes; only the leading ones move alignments that zp sees. */
static int apply_strip(int left, int right, const uint8_t *s, size_t n, size_t *zp, Buf *out) {
    size_t chars = 0, lead = 0, trail = 0, i;
    uint32_t cp;
    int in_lead = left;
    for (i = 0; i < n;) {
        i += next_cp(s, n, i, &cp);
        chars++;
        if (in_lead && is_white_space(cp))
            lead++;
        else
            in_lead = 0;
        trail = right && is_white_space(cp) ? trail + 1 : 0;
    }
    if (!lead && !trail) {
        out->n = 0;
        return buf_put(out, s, n);
    }
    Xf x;
    xf_init(&x, out, s, n, *zp, lead);
    size_t ci = 0;
    for (i = 0; i < n; ci++) {
        i += next_cp(s, n, i, &cp);
        if (ci < lead || ci >= chars - trail) continue;
        long change = (long)ci == (long)n - (long)trail - 1 ? -(long)trail : 0;
        if (xf_emit(&x, cp, change)) return -1;
    }
    *zp = x.zp;
    return 0;
}

static int is_mark(uint32_t cp) {
    if (cp < 0x300) return 0;
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    int m = c == UTF8PROC_CATEGORY_MN || c == UTF8PROC_CATEGORY_MC || c == UTF8PROC_CATEGORY_ME;
    return m != in_ranges(cp, mark_flip, ZY_ARRAY_LEN(mark_flip));
}

/* StripAccents: HF's filter(!is_combining_mark): a kept character takes the removed ones after it. */
static int apply_strip_accents(const uint8_t *s, size_t n, size_t *zp, Buf *out) {
    size_t lead = 0, i = 0;
    uint32_t cp;
    while (i < n) {
        size_t l = next_cp(s, n, i, &cp);
        if (!is_mark(cp)) break;
        i += l;
        lead++;
    }
    Xf x;
    xf_init(&x, out, s, n, *zp, lead);
    while (i < n) {
        i += next_cp(s, n, i, &cp);
        long removed = 0;
        uint32_t c2;
        while (i < n) {
            size_t l = next_cp(s, n, i, &c2);
            if (!is_mark(c2)) break;
            i += l;
            removed++;
        }
        if (xf_emit(&x, cp, -removed)) return -1;
    }
    *zp = x.zp;
    return 0;
}

/* The normalizers on s[0..n): *out is the result (s itself when there are none). */
static int normalize(const Tokenizer *t, Scratch *sc, const uint8_t *s, size_t n, const uint8_t **out, size_t *out_n,
                     size_t *zp) {
    const uint8_t *cur = s;
    size_t cn = n;
    for (int k = 0; k < t->n_norm; k++) {
        Buf *dst = &sc->norm[k & 1];
        const NormStep *st = &t->norm[k];
        int rc;
        switch (st->kind) {
        case NORM_REPLACE: rc = apply_replace(&st->pat, st->text, st->len, sc, cur, cn, zp, dst); break;
        case NORM_PREPEND: rc = apply_prepend(st->text, st->len, cur, cn, zp, dst); break;
        case NORM_LOWERCASE: rc = apply_lowercase(cur, cn, zp, dst); break;
        case NORM_STRIP: rc = apply_strip(st->left, st->right, cur, cn, zp, dst); break;
        case NORM_STRIP_ACCENTS: rc = apply_strip_accents(cur, cn, zp, dst); break;
        default: rc = apply_nf(st->kind, sc, cur, cn, zp, dst); break;
        }
        if (rc) return rc;
        cur = dst->p;
        cn = dst->n;
    }
    *out = cur;
    *out_n = cn;
    return 0;
}

/* HF's NormalizedString::split: the pieces of segs under a SplitDelimiterBehavior (m set: a removed delimiter). */
static int split_behavior(const SegBuf *segs, int behavior, SegBuf *out) {
    out->n = 0;
    int prev = 0;
    if (behavior == SPLIT_NEXT) { /* HF folds from the end */
        for (size_t k = segs->n; k-- > 0;) {
            Seg g = segs->p[k];
            if (g.m && !prev && out->n)
                out->p[out->n - 1].a = g.a;
            else if (seg_push(out, g.a, g.b, 0))
                return -1;
            prev = g.m;
        }
        for (size_t i = 0, j = out->n ? out->n - 1 : 0; i < j; i++, j--) {
            Seg x = out->p[i];
            out->p[i] = out->p[j];
            out->p[j] = x;
        }
        return 0;
    }
    for (size_t k = 0; k < segs->n; k++) {
        Seg g = segs->p[k];
        int grow = 0;
        switch (behavior) {
        case SPLIT_REMOVED: if (seg_push(out, g.a, g.b, g.m)) return -1; continue;
        case SPLIT_ISOLATED: break;
        case SPLIT_PREVIOUS: grow = g.m && !prev; break;
        case SPLIT_CONTIGUOUS: grow = g.m == prev; break;
        }
        if (grow && out->n)
            out->p[out->n - 1].b = g.b;
        else if (seg_push(out, g.a, g.b, 0))
            return -1;
        prev = g.m;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------------------
 * Encoding: the BPE model */

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
    if (m > INT32_MAX / 2 || ids_reserve(&sc->aux, 2 * m)) return -1;
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
#define CHUNK_MIN 8 /* pieces of more symbols are cut where possible */

/* HF's BPE::merge_word before merging: a symbol per character (byte-level pipelines: per byte, whose
 * character is its byte-level one), its bytes' <0xNN> tokens under byte_fallback, else unk, fused with the
 * unk before it under fuse_unk. As in HF, an unk waits until the next known character (or the end), so
 * byte-fallback symbols in between come before it. Sets sc->sym (m symbols), sc->pos, *has_unk. */
static int piece_symbols(const Tokenizer *t, Scratch *sc, const uint8_t *s, size_t n, size_t *m_out, int *has_unk) {
    sc->sym.n = 0;
    if (ids_reserve(&sc->sym, 2 * n + 1)) return -1; /* at most two fallback bytes per byte, or an unk per char */
    if (sc->pos_cap < 2 * n + 1) {
        size_t *q = realloc(sc->pos, (2 * n + 1) * sizeof *q);
        if (!q) return -1;
        sc->pos = q;
        sc->pos_cap = 2 * n + 1;
    }
    int32_t *sym = sc->sym.p;
    size_t *pos = sc->pos, m = 0;
    int pending = 0;
    *has_unk = 0;
    for (size_t i = 0; i < n;) {
        int32_t id;
        size_t l = 1;
        uint8_t fb[4];
        size_t nfb = 0;
        if (t->byte_level) {
            id = t->byte_id[s[i]];
            if (id < 0) { /* fallback on the UTF-8 of the byte's byte-level character */
                uint32_t cp = byte_to_cp(s[i]);
                if (cp < 0x80) {
                    fb[nfb++] = (uint8_t)cp;
                } else {
                    fb[nfb++] = (uint8_t)(0xC0 | cp >> 6);
                    fb[nfb++] = (uint8_t)(0x80 | (cp & 0x3F));
                }
            }
        } else if (s[i] < 0x80) {
            id = t->bmp_id[s[i]];
            if (id < 0) fb[nfb++] = s[i];
        } else {
            uint32_t cp;
            l = char_at_cp(s, n, i, &cp);
            if (cp < 0x10000) {
                id = t->bmp_id[cp];
            } else {
                SmSlot *hit = sm_find(&t->vocab, s + i, l, hash_bytes(s + i, l));
                id = hit ? (int32_t)hit->val : -1;
            }
            if (id < 0)
                for (size_t k = 0; k < l; k++) fb[nfb++] = s[i + k];
        }
        if (id >= 0) {
            if (pending) {
                pos[m] = SIZE_MAX;
                sym[m++] = t->unk_id;
                pending = 0;
            }
            pos[m] = i;
            sym[m++] = id;
        } else {
            int all = t->byte_fallback;
            for (size_t k = 0; k < nfb && all; k++) all = t->byte_fb[fb[k]] >= 0;
            if (all) {
                for (size_t k = 0; k < nfb; k++) {
                    pos[m] = k ? SIZE_MAX : i;
                    sym[m++] = t->byte_fb[fb[k]];
                }
            } else if (t->unk_id >= 0) {
                if (pending && !t->fuse_unk) {
                    pos[m] = SIZE_MAX;
                    sym[m++] = t->unk_id;
                }
                pending = 1;
                *has_unk = 1;
            } /* no unk token: HF drops the character */
        }
        i += l;
    }
    if (pending) {
        pos[m] = SIZE_MAX;
        sym[m++] = t->unk_id;
    }
    *m_out = m;
    return 0;
}

static int cache_get(TokenizerCache *c, const uint8_t *s, size_t n, uint64_t h, IdBuf *out) {
    SmSlot *hit = sm_find(&c->map, s, n, h);
    if (!hit) return 0;
    size_t off = (size_t)(hit->val >> 16), cnt = (size_t)(hit->val & 0xFFFF);
    if (!cnt) return 1; /* a piece of characters that all vanished (no unk token) */
    if (ids_reserve(out, cnt)) return -1;
    memcpy(out->p + out->n, c->ids.p + off, cnt * sizeof(int32_t));
    out->n += cnt;
    return 1;
}

static int cache_put(TokenizerCache *c, const uint8_t *s, size_t n, uint64_t h, const int32_t *ids, size_t m) {
    if (c->map.count >= CACHE_MAX_ENTRIES) cache_clear(c);
    int is_new;
    size_t off = c->ids.n;
    SmSlot *slot = sm_put(&c->map, s, n, h, &is_new);
    if (!slot || ids_reserve(&c->ids, m)) return -1;
    if (m) memcpy(c->ids.p + off, ids, m * sizeof *ids);
    c->ids.n += m;
    slot->val = (int64_t)off << 16 | (int64_t)m;
    return 0;
}

/* Merges the m symbols of s[0..n) and appends them; caches the result (looked: the cache was just asked). */
static int bpe_chunk(const Tokenizer *t, TokenizerCache *c, Scratch *sc, const uint8_t *s, size_t n, int32_t *sym,
                     size_t m, int looked, IdBuf *out) {
    int cacheable = c && n <= CACHE_MAX_PIECE && m < 0xFFFF;
    uint64_t h = cacheable ? hash_bytes(s, n) : 0;
    if (cacheable && !looked) {
        int hit = cache_get(c, s, n, h, out);
        if (hit) return hit < 0 ? -1 : 0;
    }
    if (m > 1 && (m <= NAIVE_MAX ? merge_naive(t, sym, m, sc, &m) : merge_heap(t, sym, m, sc, &m))) return -1;
    if (ids_reserve(out, m)) return -1;
    if (m) memcpy(out->p + out->n, sym, m * sizeof *sym);
    out->n += m;
    return cacheable ? cache_put(c, s, n, h, sym, m) : 0;
}

/* Ids of one piece (HF's BPE::tokenize). */
static int bpe_piece(const Tokenizer *t, TokenizerCache *c, Scratch *sc, const uint8_t *s, size_t n, IdBuf *out) {
    if (!n) return 0;
    if (t->ignore_merges) { /* HF: a piece that is itself in the vocabulary is taken whole */
        const uint8_t *key = s;
        size_t kn = n;
        if (t->byte_level) {
            sc->text.n = 0;
            if (put_bytelevel(&sc->text, s, n)) return -1;
            key = sc->text.p;
            kn = sc->text.n;
        }
        SmSlot *hit = sm_find(&t->vocab, key, kn, hash_bytes(key, kn));
        if (hit) return ids_push(out, (int32_t)hit->val);
    }
    int looked = c && n <= CACHE_MAX_PIECE;
    if (looked) {
        int hit = cache_get(c, s, n, hash_bytes(s, n), out);
        if (hit) return hit < 0 ? -1 : 0;
    }
    size_t m;
    int has_unk;
    if (piece_symbols(t, sc, s, n, &m, &has_unk)) return -1;
    int32_t *sym = sc->sym.p;
    if (m <= CHUNK_MIN || !t->chunk_ok || has_unk) return bpe_chunk(t, c, sc, s, n, sym, m, looked, out);
    /* cut where no merge can ever join the two sides: short parts merge fast and repeat (the cache) */
    const size_t *pos = sc->pos;
    size_t i0 = 0;
    for (size_t i = 1; i <= m; i++) {
        if (i < m && (pos[i] == SIZE_MAX || pm_get(&t->cross, pair_key((uint32_t)sym[i - 1], (uint32_t)sym[i]))))
            continue;
        size_t a = pos[i0], b = i < m ? pos[i] : n;
        if (bpe_chunk(t, c, sc, s + a, b - a, sym + i0, i - i0, 0, out)) return -1;
        i0 = i;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------------------
 * Encoding: the stages */

typedef struct {
    const Tokenizer *t;
    TokenizerCache *cache;
    Scratch *sc;
    IdBuf *out;
} Enc;

static int pretok(Enc *e, int level, const uint8_t *s, size_t n, size_t zp);

static int pretok_pieces(Enc *e, int level, const uint8_t *s, size_t zp) {
    const SegBuf *pc = &e->sc->pieces[level];
    for (size_t k = 0; k < pc->n; k++) {
        Seg g = pc->p[k];
        if (g.m || g.b == g.a) continue; /* a removed delimiter; HF drops empty pieces */
        int rc = pretok(e, level + 1, s + g.a, g.b - g.a, zp > g.a ? zp - g.a : 0);
        if (rc) return rc;
    }
    return 0;
}

/* Pre-tokenizer step `level` on one piece, then the next steps, then the model. */
static int pretok(Enc *e, int level, const uint8_t *s, size_t n, size_t zp) {
    const Tokenizer *t = e->t;
    Scratch *sc = e->sc;
    if (level == t->n_pre) return bpe_piece(t, e->cache, sc, s, n, e->out);
    const PreStep *st = &t->pre[level];
    int rc;
    switch (st->kind) {
    case PRE_BYTELEVEL: /* always the last step */
        if (!st->use_regex) return bpe_piece(t, e->cache, sc, s, n, e->out);
        for (size_t i = 0; i < n;) {
            size_t j = piece_end(s, n, i);
            if (bpe_piece(t, e->cache, sc, s + i, j - i, e->out)) return -1;
            i = j;
        }
        return 0;
    case PRE_SPLIT:
        rc = find_segments(&st->pat, sc->md, s, n, st->invert, &sc->seg);
        if (rc) return rc;
        if (split_behavior(&sc->seg, st->behavior, &sc->pieces[level])) return -1;
        return pretok_pieces(e, level, s, zp);
    default: { /* Metaspace: spaces become the replacement, which may be prepended, then splits */
        Buf *b = &sc->lvl[level];
        Pat space = {(char *)" ", 1, NULL};
        size_t z = zp;
        rc = apply_replace(&space, st->pat.lit, st->pat.lit_len, sc, s, n, &z, b);
        if (rc) return rc;
        size_t rl = st->pat.lit_len;
        int starts = b->n >= rl && memcmp(b->p, st->pat.lit, rl) == 0;
        if (b->n && !starts && (st->scheme == PREPEND_ALWAYS || (st->scheme == PREPEND_FIRST && zp > 0))) {
            if (buf_reserve(b, rl)) return -1;
            memmove(b->p + rl, b->p, b->n);
            memcpy(b->p, st->pat.lit, rl);
            b->n += rl;
            if (z) z += rl;
        }
        SegBuf *pc = &sc->pieces[level];
        if (st->split) {
            rc = find_segments(&st->pat, sc->md, b->p, b->n, 0, &sc->seg);
            if (rc) return rc;
            if (split_behavior(&sc->seg, SPLIT_NEXT, pc)) return -1;
        } else {
            pc->n = 0;
            if (seg_push(pc, 0, b->n, 0)) return -1;
        }
        return pretok_pieces(e, level, b->p, z);
    }
    }
}

static int split_added(Enc *e, int pass, const uint8_t *s, size_t n, size_t zp);

/* A valid piece of the original text: normalizers, then the normalized=true added tokens, then the rest. */
static int enc_valid(Enc *e, const uint8_t *s, size_t n, size_t zp) {
    const uint8_t *ns;
    size_t nn;
    int rc = normalize(e->t, e->sc, s, n, &ns, &nn, &zp);
    if (rc) return rc;
    if (e->t->trie[1].n) return split_added(e, 1, ns, nn, zp);
    return pretok(e, 0, ns, nn, zp);
}

/* A piece of the original text between added tokens. Byte-level pipelines encode each invalid byte alone. */
static int enc_seg(Enc *e, const uint8_t *s, size_t n, size_t zp) {
    if (!e->t->byte_level) return enc_valid(e, s, n, zp);
    for (size_t i = 0; i < n;) {
        size_t j = i;
        uint32_t cp;
        while (j < n) {
            int l = s[j] < 0x80 ? 1 : utf8_char(s + j, n - j, &cp);
            if (!l) break;
            j += (size_t)l;
        }
        int rc = j > i ? enc_valid(e, s + i, j - i, zp > i ? zp - i : 0) : 0;
        if (rc) return rc;
        if (j < n && bpe_piece(e->t, e->cache, e->sc, s + j, 1, e->out)) return -1;
        i = j + 1;
    }
    return 0;
}

static int next_stage(Enc *e, int pass, const uint8_t *s, size_t n, size_t zp) {
    return pass == 0 ? enc_seg(e, s, n, zp) : pretok(e, 0, s, n, zp);
}

/* HF's AddedVocabulary::find_matches: leftmost-longest matches of this pass's tokens (the search goes on after
 * a match even when single_word drops it); lstrip takes the white space before the token (not before the
 * previous match's end), rstrip the white space after it. The pieces between go to the next stage. */
static int split_added(Enc *e, int pass, const uint8_t *s, size_t n, size_t zp) {
    const Tokenizer *t = e->t;
    const Trie *tr = &t->trie[pass];
    size_t done = 0; /* HF's start_offset */
    int rc;
    for (size_t p = 0; p < n;) {
        size_t len = 0;
        int32_t k, r = tr->root[s[p]];
        if (r < 0 || (tr->tok[r] < 0 && (p + 1 == n || !(tr->pair2[(s[p] << 8 | s[p + 1]) >> 3] & (1u << (s[p + 1] & 7))))) ||
            (k = trie_longest(tr, s, n, p, &len)) < 0) {
            p++;
            continue;
        }
        const AddedTok *a = &t->added[k];
        size_t start = p, stop = p + len;
        p = stop;
        uint32_t cp;
        if (a->single_word && ((start > 0 && is_word_at(t, e->sc->md, s, n, last_char(s, start, &cp))) ||
                               (stop < n && is_word_at(t, e->sc->md, s, n, stop))))
            continue;
        if (a->lstrip) {
            size_t ws = start;
            while (ws > 0) {
                size_t c = last_char(s, ws, &cp);
                if (cp == NOT_A_CHAR || !is_white_space(cp)) break;
                ws = c;
            }
            start = ws > done ? ws : done;
        }
        if (a->rstrip)
            while (stop < n) {
                size_t l = char_at_cp(s, n, stop, &cp);
                if (cp == NOT_A_CHAR || !is_white_space(cp)) break;
                stop += l;
            }
        if (done < start && (rc = next_stage(e, pass, s + done, start - done, zp > done ? zp - done : 0))) return rc;
        if (ids_push(e->out, a->id)) return -1;
        done = stop;
    }
    if (done < n) return next_stage(e, pass, s + done, n - done, zp > done ? zp - done : 0);
    return 0;
}

static int encode_text(const Tokenizer *t, TokenizerCache *cache, Scratch *sc, const uint8_t *s, size_t n, IdBuf *out) {
    if (!t->byte_level && !utf8_valid(s, n)) {
        sc->lossy.n = 0;
        if (put_lossy(&sc->lossy, s, n)) return -1;
        s = sc->lossy.p;
        n = sc->lossy.n;
    }
    Enc e = {t, cache, sc, out};
    uint32_t cp;
    size_t zp = n ? char_at_cp(s, n, 0, &cp) : 0; /* the first character is aligned with offset 0 */
    if (t->trie[0].n) return split_added(&e, 0, s, n, zp);
    return enc_seg(&e, s, n, zp);
}

/* The post-processors' templates on the ids of one sequence (specials only with add_special). */
static int post_process(const Tokenizer *t, int add_special, IdBuf *ids) {
    for (int k = 0; k < t->n_post; k++) {
        const Template *tp = &t->post[k];
        IdBuf nb = {0};
        for (size_t i = 0; i < tp->n; i++) {
            int32_t it = tp->items[i];
            if (it == TPL_A) {
                if (ids_reserve(&nb, ids->n)) goto oom;
                if (ids->n) memcpy(nb.p + nb.n, ids->p, ids->n * sizeof *ids->p);
                nb.n += ids->n;
            } else if (add_special && ids_push(&nb, it)) {
                goto oom;
            }
        }
        free(ids->p);
        *ids = nb;
        continue;
    oom:
        free(nb.p);
        return -1;
    }
    return 0;
}

int tokenizer_encode_ex(const Tokenizer *t, TokenizerCache *cache, const char *text, size_t len, unsigned flags,
                        int32_t **ids, size_t *n_ids, ZyErr *err) {
    *ids = NULL;
    *n_ids = 0;
    if (cache && cache->owner != t) {
        cache_clear(cache);
        cache->owner = t;
    }
    IdBuf out = {0};
    Scratch sc;
    if (scratch_init(&sc) || (len && ids_reserve(&out, len / 3 + 16))) {
        scratch_free(&sc);
        return zy_fail(err, "encode: out of memory");
    }
    int rc = encode_text(t, cache, &sc, (const uint8_t *)text, len, &out);
    scratch_free(&sc);
    if (!rc && post_process(t, (flags & TOK_ENCODE_ADD_SPECIAL) != 0, &out)) rc = -1;
    if (rc) {
        free(out.p);
        if (cache) cache_clear(cache);
        if (rc == PAT_ERROR) return zy_fail(err, "encode: a regex pattern failed to match (PCRE2 match limit)");
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

int tokenizer_encode_with(const Tokenizer *t, TokenizerCache *cache, const char *text, size_t len, int32_t **ids,
                          size_t *n_ids, ZyErr *err) {
    return tokenizer_encode_ex(t, cache, text, len, 0, ids, n_ids, err);
}

int tokenizer_encode(const Tokenizer *t, const char *text, size_t len, int32_t **ids, size_t *n_ids, ZyErr *err) {
    return tokenizer_encode_ex(t, t->cache, text, len, 0, ids, n_ids, err);
}

/* ---------------------------------------------------------------------------------------------------------
 * Decoding: HF's decoders on the list of token strings */

typedef struct {
    Buf text;
    size_t *end; /* token k is text[k ? end[k - 1] : 0, end[k]) */
    size_t n, cap;
} Toks;

static void toks_free(Toks *l) {
    free(l->text.p);
    free(l->end);
}

/* Ends the current token (its bytes were appended to text). */
static int toks_close(Toks *l) {
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 64;
        size_t *q = realloc(l->end, nc * sizeof *q);
        if (!q) return -1;
        l->end = q;
        l->cap = nc;
    }
    l->end[l->n++] = l->text.n;
    return 0;
}

static int toks_add(Toks *l, const void *s, size_t n) { return buf_put(&l->text, s, n) || toks_close(l); }

static const uint8_t *tok_at(const Toks *l, size_t k, size_t *n) {
    size_t a = k ? l->end[k - 1] : 0;
    *n = l->end[k] - a;
    return l->text.p ? l->text.p + a : (const uint8_t *)""; /* every token so far empty */
}

/* HF's ByteFallback: "<0xNN>" (u8::from_str_radix on NN, so "+F" counts) or -1. */
static int byte_token(const uint8_t *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return -1;
    int v = 0, digits = 0;
    for (int i = 3; i < 5; i++) {
        int c = s[i], d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) {
            if (i == 3 && c == '+') continue;
            return -1;
        }
        v = v * 16 + d;
        digits++;
    }
    return digits ? v : -1;
}

static int flush_bytes(Toks *out, Buf *run, size_t count, int lossy) {
    if (!count) return 0;
    int rc;
    if (!lossy || utf8_valid(run->p, run->n)) {
        rc = toks_add(out, run->p, run->n);
    } else {
        rc = 0;
        for (size_t k = 0; k < count && !rc; k++) rc = toks_add(out, "\xEF\xBF\xBD", 3);
    }
    run->n = 0;
    return rc;
}

/* One decoder on in -> out. lossy: invalid UTF-8 becomes U+FFFD as in HF (ByteLevel, ByteFallback). */
static int decode_step(const DecStep *st, Scratch *sc, int lossy, const Toks *in, Toks *out) {
    out->text.n = 0;
    out->n = 0;
    int rc = 0;
    if (st->kind == DEC_FUSE) return toks_add(out, in->text.p, in->text.n);
    if (st->kind == DEC_BYTELEVEL) {
        Buf raw = {0};
        for (size_t k = 0; k < in->n && !rc; k++) {
            size_t n;
            const uint8_t *s = tok_at(in, k, &n);
            rc = token_bytes((const char *)s, n, &raw);
        }
        if (!rc) rc = lossy ? (put_lossy(&out->text, raw.p, raw.n) || toks_close(out)) : toks_add(out, raw.p, raw.n);
        free(raw.p);
        return rc ? -1 : 0;
    }
    if (st->kind == DEC_BYTEFALLBACK) {
        Buf run = {0};
        size_t count = 0;
        for (size_t k = 0; k < in->n && !rc; k++) {
            size_t n;
            const uint8_t *s = tok_at(in, k, &n);
            int b = byte_token(s, n);
            if (b >= 0) {
                uint8_t byte = (uint8_t)b;
                rc = buf_put(&run, &byte, 1);
                count++;
            } else {
                rc = flush_bytes(out, &run, count, lossy) || toks_add(out, s, n);
                count = 0;
            }
        }
        if (!rc) rc = flush_bytes(out, &run, count, lossy);
        free(run.p);
        return rc ? -1 : 0;
    }
    for (size_t k = 0; k < in->n && !rc; k++) {
        size_t n;
        const uint8_t *s = tok_at(in, k, &n);
        uint32_t cp;
        switch (st->kind) {
        case DEC_REPLACE:
            rc = find_segments(&st->pat, sc->md, s, n, 0, &sc->seg);
            for (size_t g = 0; g < sc->seg.n && !rc; g++) {
                Seg x = sc->seg.p[g];
                rc = x.m ? buf_put(&out->text, st->text, st->len) : buf_put(&out->text, s + x.a, x.b - x.a);
            }
            break;
        case DEC_STRIP: { /* up to `start` leading and `stop` trailing content characters (HF panics if they overlap) */
            size_t a = 0, b = n;
            for (size_t i = 0; i < st->start && a < n; i++) {
                size_t l = char_at_cp(s, n, a, &cp);
                if (cp != st->ch) break;
                a += l;
            }
            for (size_t i = 0; i < st->stop && b > 0; i++) {
                size_t c = last_char(s, b, &cp);
                if (cp != st->ch) break;
                b = c;
            }
            if (b > a) rc = buf_put(&out->text, s + a, b - a);
            break;
        }
        default: /* Metaspace: the replacement becomes a space, or goes in the first token */
            for (size_t i = 0; i < n && !rc;) {
                size_t l = char_at_cp(s, n, i, &cp);
                if (cp != st->ch)
                    rc = buf_put(&out->text, s + i, l);
                else if (k != 0 || st->scheme == PREPEND_NEVER)
                    rc = buf_put(&out->text, " ", 1);
                i += l;
            }
            break;
        }
        if (!rc) rc = toks_close(out);
    }
    return rc;
}

int tokenizer_decode_ex(const Tokenizer *t, const int32_t *ids, size_t n, unsigned flags, char **bytes, size_t *len,
                        ZyErr *err) {
    *bytes = NULL;
    *len = 0;
    int skip = (flags & TOK_DECODE_SKIP_SPECIAL) != 0, lossy = (flags & TOK_DECODE_LOSSY) != 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t->n_ids)
            return zy_fail(err, "decode: id %d at position %zu is outside the vocabulary [0, %d)", id, i, t->n_ids);
        if (!t->tok[id]) return zy_fail(err, "decode: id %d at position %zu has no token", id, i);
    }
    Toks a = {0}, b = {0};
    int rc = 0;
    size_t kept = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        size_t l;
        const char *s = dtext(t, ids[i], &l);
        if (skip && sm_find(&t->special_text, s, l, hash_bytes((const uint8_t *)s, l))) continue;
        if (t->dec_bytelevel_only && !lossy) { /* the common case: bytes precomputed per id */
            size_t off = t->dec_off[ids[i]], dn = t->dec_off[ids[i] + 1] - off;
            rc = dn ? buf_put(&a.text, t->dec.p + off, dn) : 0;
        } else if (!t->has_decoder) { /* HF joins the tokens with spaces */
            rc = (kept && buf_put(&a.text, " ", 1)) || buf_put(&a.text, s, l);
        } else {
            rc = toks_add(&a, s, l);
        }
        kept++;
    }
    if (!rc && t->has_decoder && !(t->dec_bytelevel_only && !lossy)) {
        Scratch sc;
        rc = scratch_init(&sc);
        for (int k = 0; k < t->n_dec && !rc; k++) {
            rc = decode_step(&t->decs[k], &sc, lossy, &a, &b);
            Toks x = a;
            a = b;
            b = x;
        }
        scratch_free(&sc);
    }
    if (!rc) rc = buf_put(&a.text, "", 1);
    toks_free(&b);
    free(a.end);
    if (rc) {
        free(a.text.p);
        return zy_fail(err, "decode: %s", rc == PAT_ERROR ? "a regex pattern failed to match" : "out of memory");
    }
    *bytes = (char *)a.text.p;
    *len = a.text.n - 1;
    return 0;
}

int tokenizer_decode(const Tokenizer *t, const int32_t *ids, size_t n, char **bytes, size_t *len, ZyErr *err) {
    return tokenizer_decode_ex(t, ids, n, 0, bytes, len, err);
}

/* ---------------------------------------------------------------------------------------------------------
 * Derived tables, once every token, merge and component is in */

/* Long pieces may be cut between symbols x and y when no merge (l, r) has l ending with x and r starting
 * with y: the pair across the cut never forms, so the merges on the two sides never interact. A merged
 * token's first and last symbols come from its merge; a token made by two merges that disagree, or a
 * symbol that can start a piece (a byte-fallback or unk token) that is also a merge's result, turn the
 * cutting off. */
typedef struct {
    uint32_t len;
    int32_t rank;
} ByLen;

static int cmp_bylen(const void *x, const void *y) {
    const ByLen *a = x, *b = y;
    if (a->len != b->len) return a->len < b->len ? -1 : 1;
    return (a->rank > b->rank) - (a->rank < b->rank);
}

static int build_cross(Tokenizer *t) {
    t->chunk_ok = 0;
    if (!t->n_merges) return 0;
    size_t nid = (size_t)t->n_ids;
    int32_t *fk = malloc(nid * sizeof *fk), *lk = malloc(nid * sizeof *lk);
    uint8_t *made = calloc(nid, 1);
    ByLen *order = malloc((size_t)t->n_merges * sizeof *order);
    int rc = -1, ok = 1;
    if (!fk || !lk || !made || !order) goto done;
    for (size_t i = 0; i < nid; i++) fk[i] = lk[i] = (int32_t)i;
    for (int32_t r = 0; r < t->n_merges; r++) {
        int64_t v = merge_of(t, t->merge_list[r][0], t->merge_list[r][1]);
        order[r] = (ByLen){t->tok_len[(uint32_t)(v & 0xFFFFFFFF)], r};
    }
    qsort(order, (size_t)t->n_merges, sizeof *order, cmp_bylen);
    for (int32_t k = 0; k < t->n_merges && ok; k++) {
        int32_t a = t->merge_list[order[k].rank][0], b = t->merge_list[order[k].rank][1];
        int32_t c = (int32_t)(uint32_t)(merge_of(t, a, b) & 0xFFFFFFFF);
        if (!made[c]) {
            fk[c] = fk[a];
            lk[c] = lk[b];
            made[c] = 1;
        } else if (fk[c] != fk[a] || lk[c] != lk[b]) {
            ok = 0;
        }
    }
    for (int b = 0; b < 256 && ok; b++)
        if (t->byte_fb[b] >= 0 && made[t->byte_fb[b]]) ok = 0;
    if (t->unk_id >= 0 && made[t->unk_id]) ok = 0;
    if (ok && pm_resize(&t->cross, (size_t)t->n_merges)) goto done;
    for (int32_t r = 0; r < t->n_merges && ok; r++) {
        int is_new;
        int32_t a = t->merge_list[r][0], b = t->merge_list[r][1];
        if (!pm_put(&t->cross, pair_key((uint32_t)lk[a], (uint32_t)fk[b]), &is_new)) goto done;
    }
    t->chunk_ok = (uint8_t)ok;
    rc = 0;
done:
    free(fk);
    free(lk);
    free(made);
    free(order);
    return rc;
}

/* Rust regex's \w: Alphabetic, marks, decimal digits, connector punctuation, joiners. */
static const char word_pattern[] = "[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}]";

static const char *shown(const char *s, char buf[200]);

#define OOM_FAIL(label) zy_fail(err, "%s: out of memory", label)

static int tok_finish(Tokenizer *t, const char *label, ZyErr *err) {
    char b1[200];
    for (int b = 0; b < 256; b++) {
        uint8_t byte = (uint8_t)b;
        Buf bl = {0};
        if (put_bytelevel(&bl, &byte, 1)) return OOM_FAIL(label);
        SmSlot *s = sm_find(&t->vocab, bl.p, bl.n, hash_bytes(bl.p, bl.n));
        t->byte_id[b] = s ? (int32_t)s->val : -1;
        free(bl.p);
        char fb[8];
        snprintf(fb, sizeof fb, "<0x%02X>", b);
        s = sm_find(&t->vocab, fb, 6, hash_bytes((const uint8_t *)fb, 6));
        t->byte_fb[b] = s ? (int32_t)s->val : -1;
    }
    if (!t->byte_level) { /* the model sees characters: a table for the BMP, the vocabulary for the rest */
        t->bmp_id = malloc(0x10000 * sizeof *t->bmp_id);
        if (!t->bmp_id) return OOM_FAIL(label);
        for (uint32_t cp = 0; cp < 0x10000; cp++) t->bmp_id[cp] = -1;
        for (int32_t id = 0; id < t->n_ids; id++) {
            uint32_t cp = 0;
            if (t->tok[id] && t->in_model[id] &&
                utf8_char((const uint8_t *)t->tok[id], t->tok_len[id], &cp) == (int)t->tok_len[id] && cp < 0x10000)
                t->bmp_id[cp] = id;
        }
    }
    /* added tokens: normalized forms, tries, the special set */
    t->added_of = malloc(((size_t)t->n_ids + 1) * sizeof *t->added_of);
    if (!t->added_of) return OOM_FAIL(label);
    for (int32_t i = 0; i < t->n_ids; i++) t->added_of[i] = -1;
    Scratch sc;
    if (scratch_init(&sc)) {
        scratch_free(&sc);
        return OOM_FAIL(label);
    }
    int rc = 0;
    for (int i = 0; i < t->n_added && !rc; i++) {
        AddedTok *a = &t->added[i];
        t->added_of[a->id] = i;
        const uint8_t *pat = (const uint8_t *)a->text;
        size_t pl = a->len;
        if (a->normalized && t->n_norm) { /* HF matches (and decodes) the normalized content */
            const uint8_t *ns;
            size_t nn, zp = 0;
            rc = normalize(t, &sc, pat, pl, &ns, &nn, &zp);
            if (rc) {
                rc = rc == PAT_ERROR ? zy_fail(err, "%s: added_tokens[%d]: the normalizer's regex failed on it", label, i)
                                     : OOM_FAIL(label);
                break;
            }
            if (nn != pl || memcmp(ns, pat, pl) != 0) {
                if (!nn) {
                    rc = zy_fail(err, "%s: added_tokens[%d]: \"%s\" normalizes to the empty string", label, i, shown(a->text, b1));
                    break;
                }
                a->norm = malloc(nn + 1);
                if (!a->norm) {
                    rc = OOM_FAIL(label);
                    break;
                }
                memcpy(a->norm, ns, nn);
                a->norm[nn] = '\0';
                a->norm_len = nn;
                pat = (const uint8_t *)a->norm;
                pl = nn;
            }
        }
        /* the same text twice in a pass: the later token wins (HF's choice depends on hash order) */
        if (trie_add(&t->trie[a->normalized ? 1 : 0], pat, pl, i) == -2) rc = OOM_FAIL(label);
        int is_new;
        if (!rc && a->special) {
            SmSlot *s = sm_put(&t->special_text, a->text, a->len, hash_bytes((const uint8_t *)a->text, a->len), &is_new);
            if (!s) rc = OOM_FAIL(label);
        }
        if (!rc && a->single_word && !t->word_re) {
            int ec;
            PCRE2_SIZE eo;
            t->word_re = pcre2_compile((PCRE2_SPTR)word_pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &ec, &eo, NULL);
            if (!t->word_re) rc = zy_fail(err, "%s: cannot compile the \\w class for single_word tokens", label);
        }
    }
    scratch_free(&sc);
    if (rc) return rc;
    for (int k = 0; k < t->n_post; k++)
        for (size_t i = 0; i < t->post[k].n; i++) {
            int32_t id = t->post[k].items[i];
            if (id != TPL_A && (id >= t->n_ids || !t->tok[id]))
                return zy_fail(err, "%s: post_processor: special token id %d is not in the vocabulary", label, id);
        }
    /* decoding: every id's decoder text through the ByteLevel decoder (used when that is the decoder) */
    t->dec.n = 0;
    free(t->dec_off);
    t->dec_off = malloc(((size_t)t->n_ids + 1) * sizeof *t->dec_off);
    if (!t->dec_off) return OOM_FAIL(label);
    for (int32_t i = 0; i < t->n_ids; i++) {
        t->dec_off[i] = t->dec.n;
        if (!t->tok[i] || !t->dec_bytelevel_only) continue;
        size_t l;
        const char *d = dtext(t, i, &l);
        if (token_bytes(d, l, &t->dec)) return OOM_FAIL(label);
    }
    t->dec_off[t->n_ids] = t->dec.n;
    if (build_cross(t)) return OOM_FAIL(label);
    if (!t->cache && !(t->cache = tokenizer_cache_new())) return OOM_FAIL(label);
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
        FAIL("%s: %s.pattern: \"%s\" is not String or Regex", label, path, shown(c->string, b1));
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
             "StripAccents and Sequence)", label, path, shown(ty, b1));
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
             shown(ty, b1));
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
                 label, path, shown(bh->valuestring, b1));
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
             "and Sequence)", label, path, shown(ty, b1));
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
        if (!sp) FAIL("%s: %s.%s[%d]: special token \"%s\" is missing from special_tokens", label, path, field, i, shown(id->valuestring, b1));
        const cJSON *ids = GET(sp, "ids"), *toks = GET(sp, "tokens");
        if (!cJSON_IsArray(ids) || !cJSON_IsArray(toks) || cJSON_GetArraySize(ids) != cJSON_GetArraySize(toks))
            FAIL("%s: %s.special_tokens[\"%s\"]: ids and tokens must be arrays of the same length", label, path, shown(id->valuestring, b1));
        for (const cJSON *x = ids->child; x; x = x->next) {
            int32_t tid;
            if (json_id(x, &tid)) FAIL("%s: %s.special_tokens[\"%s\"].ids: not an id", label, path, shown(id->valuestring, b1));
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
             shown(ty, b1));
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

static int load_pipeline(const cJSON *root, const char *label, Tokenizer *t, ZyErr *err) {
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
        FAIL("%s: model.type: \"%s\" is not supported (expected \"BPE\")", label, shown(ty->valuestring, b1));
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
            FAIL("%s: model.vocab[\"%s\"]: id must be an integer in [0, %d)", label, shown(text, b1), TOK_MAX_VOCAB);
        if ((size_t)id < t->ids_cap && t->tok[id])
            FAIL("%s: model.vocab[\"%s\"]: id %d is already \"%s\"", label, shown(text, b1), id, shown(t->tok[id], b2));
        int rc = tok_add_vocab(t, text, len, id);
        if (rc < 0) FAIL("%s: out of memory", label);
        if (rc) FAIL("%s: model.vocab: token \"%s\" appears twice", label, shown(text, b1));
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

    v = GET(m, "unk_token");
    if (!is_absent_or_null(v)) {
        if (!cJSON_IsString(v)) FAIL("%s: model.unk_token: expected a string or null, got %s", label, kind_of(v, b1));
        size_t len = strlen(v->valuestring);
        SmSlot *s = sm_find(&t->vocab, v->valuestring, len, hash_bytes((const uint8_t *)v->valuestring, len));
        if (!s) FAIL("%s: model.unk_token: \"%s\" is not in model.vocab", label, shown(v->valuestring, b1));
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
            FAIL("%s: added_tokens[%d]: \"%s\" has id %d but model.vocab gives it %d", label, i, shown(text, b1), id, (int)s->val);
        if (earlier >= 0) { /* HF keeps the first id and takes the later flags */
            if (t->added[earlier].id != id)
                FAIL("%s: added_tokens[%d]: \"%s\" has id %d but an earlier entry gives it %d", label, i, shown(text, b1),
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
            FAIL("%s: added_tokens[%d]: id %d of \"%s\" is already \"%s\"", label, i, id, shown(text, b1), shown(t->tok[id], b2));
        if (!s && id != next_new)
            FAIL("%s: added_tokens[%d].id: %d, but tokenizers numbers the new token \"%s\" %d (model.vocab's size plus "
                 "the new added tokens before it)", label, i, id, shown(text, b1), next_new);
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
        rc = load_pipeline(root, label, t, err) || load_model(root, label, t, err) || load_added(root, label, t, err) ||
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
            rc = zy_fail(err, "%s: %s: \"%s\" is not in the vocabulary", label, names[k], shown(tok, b1));
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
            templates_free(t);
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
                       shown(t->cfg_special[which], b1));
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

/* The pipeline of the tokenizers zaya trains: byte-level BPE as GPT-2's. */
static const char trained_pipeline[] =
    "{\"normalizer\": null, \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": true, "
    "\"use_regex\": true}, \"post_processor\": null, \"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, "
    "\"trim_offsets\": true, \"use_regex\": true}}";

static int set_trained_pipeline(Tokenizer *t, ZyErr *err) {
    cJSON *root = cJSON_Parse(trained_pipeline);
    if (!root) return zy_fail(err, "tokenizer: out of memory");
    int rc = load_pipeline(root, "tokenizer", t, err);
    cJSON_Delete(root);
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
    AddedFlags special = {1, 0, 0, 0, 0};
    for (int k = 0; k < 3 && !rc; k++) rc = tok_add_added(t, train_specials[k], strlen(train_specials[k]), k, special);
    ZyErr e;
    rc = rc || set_trained_pipeline(t, &e) || tok_finish(t, "tokenizer", &e);
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
