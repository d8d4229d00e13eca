/* BPE training as HF's BpeTrainer: pre-tokens counted in parallel over files or texts, then merges learned until the
 * vocabulary is full (tokenizer_train, tokenizer_train_texts). See tokenizer.c. */
#define _POSIX_C_SOURCE 200809L
#include "tokenizer/tokenizer_internal.h"
#include "util/lines.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

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
            size_t b = tok_piece_end(s, p, a);
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
        char ca = tok_ascii_class[a], cb = tok_ascii_class[b];
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
    ZyLines r;
    if (zy_lines_open(&r, path, ZY_LINES_SKIP_BLANK, err)) return -1;
    Batch bt = {0};
    int rc = 0, got = 0;
    while (!rc && (got = zy_lines_next(&r, err)) > 0) {
        cJSON *o = zy_lines_json(&r, "a JSON object with a \"text\" string", err);
        const cJSON *tx = cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, "text") : NULL;
        if (!o)
            rc = -1;
        else if (!cJSON_IsString(tx))
            rc = zy_lines_fail(&r, err, "no \"text\" string");
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
    if (!rc && got < 0) rc = -1;
    if (!rc && count_batch(cn, &bt)) rc = zy_fail(err, "%s: out of memory counting words", path);
    free(bt.text.p);
    free(bt.end);
    zy_lines_close(&r);
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
    tok_byte_token_order(order);
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
    int rc = tok_load_pipeline(root, "tokenizer", t, err);
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
            rc = tok_put_bytelevel(&bl, p, n);
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

