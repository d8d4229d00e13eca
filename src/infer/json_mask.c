/* The token mask of structured output over a sorted vocabulary (see json_mask.h). */
#include "infer/json_mask.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct JsonVocab {
    int V;
    int n;             /* tokens that may take part at all (non-empty, not special, short enough), sorted by bytes */
    char *blob;        /* their bytes, in that order */
    size_t *off;       /* [n] */
    uint8_t *len;      /* [n] */
    uint8_t *lcp;      /* [n]: bytes shared with the token before */
    uint8_t *plain;    /* [n]: only plain string characters (see json_mask.h) */
    int32_t *id;       /* [n] */
    uint32_t *node_at; /* [n]: where token k's entries in skip start */
    uint32_t *skip;    /* for token k and d in [lcp[k], len[k]): the first token after k that does not share k's first
                        * d + 1 bytes (the end of that trie node's subtree, where a walk goes when byte d fails) */
    int *allowed_at;   /* [V]: never allowed (-1) or the sorted position */
};

struct JsonMaskScratch {
    JgState st[JSON_MASK_MAX_TOKEN + 1]; /* the state after each prefix of the token walked */
    uint64_t *bits;                      /* allowed ids */
    int V;
};

void json_vocab_free(JsonVocab *v) {
    if (!v) return;
    free(v->blob);
    free(v->off);
    free(v->len);
    free(v->lcp);
    free(v->plain);
    free(v->id);
    free(v->node_at);
    free(v->skip);
    free(v->allowed_at);
    free(v);
}

typedef struct {
    const char *const *bytes;
    const size_t *lens;
} SortSrc;

static int by_bytes(const void *a, const void *b, void *arg) {
    const SortSrc *src = arg;
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    const size_t lx = src->lens[x], ly = src->lens[y], l = lx < ly ? lx : ly;
    const int c = memcmp(src->bytes[x], src->bytes[y], l);
    if (c) return c;
    return lx < ly ? -1 : lx > ly ? 1 : (x > y) - (x < y);
}

int json_vocab_create(const char *const *bytes, const size_t *lens, int V, JsonVocab **out, ZyErr *err) {
    *out = NULL;
    JsonVocab *v = calloc(1, sizeof *v);
    int32_t *ids = malloc(sizeof *ids * ((size_t)V + 1));
    size_t total = 0;
    int n = 0;
    for (int i = 0; ids && i < V; i++)
        if (bytes[i] && lens[i] > 0 && lens[i] <= JSON_MASK_MAX_TOKEN) total += lens[i], ids[n++] = i;
    if (v) {
        v->V = V;
        v->n = n;
        v->blob = malloc(total + 1);
        v->off = malloc(sizeof *v->off * ((size_t)n + 1));
        v->len = malloc((size_t)n + 1);
        v->lcp = malloc((size_t)n + 1);
        v->plain = malloc((size_t)n + 1);
        v->node_at = malloc(sizeof *v->node_at * ((size_t)n + 1));
        v->allowed_at = malloc(sizeof *v->allowed_at * ((size_t)V + 1));
    }
    if (!v || !ids || !v->blob || !v->off || !v->len || !v->lcp || !v->plain || !v->node_at || !v->allowed_at) {
        free(ids);
        json_vocab_free(v);
        return zy_fail(err, "out of memory (the structured-output vocabulary)");
    }
    SortSrc src = {bytes, lens};
    qsort_r(ids, (size_t)n, sizeof *ids, by_bytes, &src);
    v->id = ids;
    for (int i = 0; i < V; i++) v->allowed_at[i] = -1;
    size_t at = 0, nodes = 0;
    for (int k = 0; k < n; k++) {
        const int i = ids[k];
        v->allowed_at[i] = k;
        v->off[k] = at;
        memcpy(v->blob + at, bytes[i], lens[i]);
        at += lens[i];
        v->len[k] = (uint8_t)lens[i];
        v->plain[k] = (uint8_t)jg_plain_string(bytes[i], lens[i]);
        int l = 0;
        if (k > 0)
            while (l < v->len[k - 1] && l < v->len[k] && v->blob[v->off[k - 1] + l] == v->blob[v->off[k] + l]) l++;
        v->lcp[k] = (uint8_t)l;
        v->node_at[k] = (uint32_t)nodes;
        nodes += lens[i] - (size_t)l;
    }
    if (!(v->skip = malloc(sizeof *v->skip * (nodes + 1)))) {
        json_vocab_free(v);
        return zy_fail(err, "out of memory (the structured-output vocabulary)");
    }
    /* backwards: next[d] is the first token after k whose lcp is <= d, i.e. that leaves k's node at depth d */
    uint32_t next[JSON_MASK_MAX_TOKEN + 1];
    for (int d = 0; d <= JSON_MASK_MAX_TOKEN; d++) next[d] = (uint32_t)n;
    for (int k = n - 1; k >= 0; k--) {
        for (int d = v->lcp[k]; d < v->len[k]; d++) v->skip[v->node_at[k] + (uint32_t)(d - v->lcp[k])] = next[d];
        for (int d = v->lcp[k]; d <= JSON_MASK_MAX_TOKEN; d++) next[d] = (uint32_t)k;
    }
    *out = v;
    return 0;
}

int json_vocab_from_tokenizer(const Tokenizer *t, int V, JsonVocab **out, ZyErr *err) {
    const int nt = tokenizer_vocab_size(t);
    char **bytes = calloc((size_t)V + 1, sizeof *bytes);
    size_t *lens = calloc((size_t)V + 1, sizeof *lens);
    int rc = 0;
    if (!bytes || !lens) rc = zy_fail(err, "out of memory (the structured-output vocabulary)");
    for (int32_t i = 0; rc == 0 && i < V && i < nt; i++) {
        ZyErr e2;
        char *b = NULL, *skipped = NULL;
        size_t bl = 0, sl = 0;
        if (tokenizer_decode(t, &i, 1, &b, &bl, &e2) == 0 &&
            tokenizer_decode_ex(t, &i, 1, TOK_DECODE_SKIP_SPECIAL, &skipped, &sl, &e2) == 0 && sl == bl) {
            bytes[i] = b; /* special tokens (gone with skip_special) never take part in a document */
            lens[i] = bl;
            b = NULL;
        }
        free(b);
        free(skipped);
    }
    if (rc == 0) rc = json_vocab_create((const char *const *)bytes, lens, V, out, err);
    for (int i = 0; bytes && i < V; i++) free(bytes[i]);
    free(bytes);
    free(lens);
    return rc;
}

JsonMaskScratch *json_mask_scratch(const JsonVocab *v) {
    JsonMaskScratch *x = malloc(sizeof *x);
    if (x) x->bits = calloc((size_t)v->V / 64 + 1, sizeof *x->bits), x->V = v->V;
    if (x && !x->bits) {
        free(x);
        x = NULL;
    }
    return x;
}

void json_mask_scratch_free(JsonMaskScratch *x) {
    if (x) free(x->bits);
    free(x);
}

int json_mask_apply(const JsonVocab *v, const JsonGrammar *g, const JgState *s, long tokens_left,
                    const int32_t *end_ids, int n_end, JsonMaskScratch *x, float *logits, int n_logits) {
    const long after = tokens_left - 1; /* tokens left once this one is written */
    /* in a string's characters, plain tokens keep the state: they only need the budget */
    const int in_chars = jg_in_string_chars(g, s) && jg_min_close(g, s) <= after;
    uint64_t *bits = x->bits;
    memset(bits, 0, sizeof *bits * ((size_t)v->V / 64 + 1));
    JgState *st = x->st;
    jg_copy(&st[0], s);
    int valid = 0; /* st[0 .. valid] hold the states after the first bytes of the token walked last */
    for (int k = 0; k < v->n;) {
        const int L = v->lcp[k], n = v->len[k];
        if (valid > L) valid = L;
        if (in_chars && v->plain[k]) {
            bits[v->id[k] >> 6] |= 1ull << (v->id[k] & 63);
            k++;
            continue;
        }
        const char *p = v->blob + v->off[k];
        int fail = -1;
        for (; valid < n; valid++) {
            jg_copy(&st[valid + 1], &st[valid]);
            if (jg_step(g, &st[valid + 1], (uint8_t)p[valid])) {
                fail = valid;
                break;
            }
        }
        if (fail >= L) { /* every token under this prefix fails too */
            k = (int)v->skip[v->node_at[k] + (uint32_t)(fail - L)];
            continue;
        }
        if (fail < 0 && jg_min_close(g, &st[n]) <= after) bits[v->id[k] >> 6] |= 1ull << (v->id[k] & 63);
        k++;
    }
    const int complete = jg_complete(g, s);
    for (int i = 0; i < n_end; i++) /* an end token: only where the document is complete */
        if (end_ids[i] >= 0 && end_ids[i] < v->V) {
            if (complete) bits[end_ids[i] >> 6] |= 1ull << (end_ids[i] & 63);
            else bits[end_ids[i] >> 6] &= ~(1ull << (end_ids[i] & 63));
        }
    int allowed = 0;
    for (int i = 0; i < n_logits; i++) {
        const int on = i < v->V && (bits[i >> 6] >> (i & 63) & 1);
        if (!on) logits[i] = -INFINITY;
        allowed += on;
    }
    return allowed;
}

int json_mask_advance(const JsonVocab *v, const JsonGrammar *g, JgState *s, int32_t id) {
    const int k = id >= 0 && id < v->V ? v->allowed_at[id] : -1;
    if (k < 0) return -1;
    return jg_feed(g, s, v->blob + v->off[k], v->len[k]);
}
