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
 * pieces are cached per Tokenizer (or per TokenizerCache).
 *
 * The files: this one holds the Tokenizer (tokens, merges, added tokens), encoding, decoding and the tables
 * derived once a tokenizer is complete; tokenizer_normalize.c the normalizers; tokenizer_json.c reading and
 * writing tokenizer.json (and tokenizer_config.json); tokenizer_train.c BPE training; tokenizer_pretok.c the
 * GPT-2 scanner, its PCRE2 reference and the Unicode class table; tokenizer_internal.h what they share. */
#define _POSIX_C_SOURCE 200809L
#include "tokenizer/tokenizer_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------------------------
 * Byte-level: GPT-2's byte <-> character map */

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
int tok_put_bytelevel(Buf *b, const uint8_t *s, size_t n) {
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
void tok_byte_token_order(int order[256]) {
    int r = 0;
    for (uint32_t cp = 0; cp <= 0x143; cp++) {
        int b = cp_to_byte(cp);
        if (b >= 0) order[b] = r++;
    }
}

/* ---------------------------------------------------------------------------------------------------------
 * More UTF-8: character boundaries, invalid sequences */

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

static void pat_free(Pat *p) {
    free(p->lit);
    if (p->re) pcre2_code_free(p->re);
    memset(p, 0, sizeof *p);
}

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
int tok_find_segments(const Pat *p, pcre2_match_data *md, const uint8_t *s, size_t n, int invert, SegBuf *out) {
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
 * The tokenizer */

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

void tok_templates_free(Tokenizer *t) {
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
    tok_templates_free(t);
    for (int i = 0; i < 4; i++) free(t->js[i]);
    for (int i = 0; i < 2; i++) free(t->cfg_special[i]);
    tokenizer_cache_free(t->cache);
    free(t);
}

Tokenizer *tok_new(void) {
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
int tok_add_vocab(Tokenizer *t, const char *text, size_t len, int32_t id) {
    int is_new;
    SmSlot *s = sm_put(&t->vocab, text, len, hash_bytes((const uint8_t *)text, len), &is_new);
    if (!s) return -1;
    if (!is_new) return 1;
    s->val = id;
    return tok_set_text(t, id, text, len, 1);
}

int tok_add_merge(Tokenizer *t, int32_t a, int32_t b, int32_t new_id) {
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

int tok_add_added(Tokenizer *t, const char *text, size_t len, int32_t id, AddedFlags f) {
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
 * Encoding: scratch space */

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
            if (tok_put_bytelevel(&sc->text, s, n)) return -1;
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
            size_t j = tok_piece_end(s, n, i);
            if (bpe_piece(t, e->cache, sc, s + i, j - i, e->out)) return -1;
            i = j;
        }
        return 0;
    case PRE_SPLIT:
        rc = tok_find_segments(&st->pat, sc->md, s, n, st->invert, &sc->seg);
        if (rc) return rc;
        if (split_behavior(&sc->seg, st->behavior, &sc->pieces[level])) return -1;
        return pretok_pieces(e, level, s, zp);
    default: { /* Metaspace: spaces become the replacement, which may be prepended, then splits */
        Buf *b = &sc->lvl[level];
        Pat space = {(char *)" ", 1, NULL};
        size_t z = zp;
        rc = tok_apply_replace(&space, st->pat.lit, st->pat.lit_len, sc, s, n, &z, b);
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
            rc = tok_find_segments(&st->pat, sc->md, b->p, b->n, 0, &sc->seg);
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
    int rc = tok_normalize(e->t, e->sc, s, n, &ns, &nn, &zp);
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
            rc = tok_find_segments(&st->pat, sc->md, s, n, 0, &sc->seg);
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

#define OOM_FAIL(label) zy_fail(err, "%s: out of memory", label)

int tok_finish(Tokenizer *t, const char *label, ZyErr *err) {
    char b1[200];
    for (int b = 0; b < 256; b++) {
        uint8_t byte = (uint8_t)b;
        Buf bl = {0};
        if (tok_put_bytelevel(&bl, &byte, 1)) return OOM_FAIL(label);
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
            rc = tok_normalize(t, &sc, pat, pl, &ns, &nn, &zp);
            if (rc) {
                rc = rc == PAT_ERROR ? zy_fail(err, "%s: added_tokens[%d]: the normalizer's regex failed on it", label, i)
                                     : OOM_FAIL(label);
                break;
            }
            if (nn != pl || memcmp(ns, pat, pl) != 0) {
                if (!nn) {
                    rc = zy_fail(err, "%s: added_tokens[%d]: \"%s\" normalizes to the empty string", label, i, tok_shown(a->text, b1));
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

