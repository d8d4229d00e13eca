/* Tokenizer: pre-tokenizer against PCRE2 running the GPT-2 regex, byte round trips (invalid UTF-8 too),
 * special tokens, training (hand-checked merges, determinism, files vs memory vs JSONL), the merge loops
 * against a plain reference, tokenizer.json refusals with their messages, HF file variants, and a mutation
 * fuzz loop over tokenizer.json text. */
#define _POSIX_C_SOURCE 200809L
#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test.h"
#include "tokenizer/tokenizer.h"

/* ---- helpers ---- */

static const char *const WORDS[] = {"the", "of", "and", "to", "in", "is", "was", "that", "for", "it", "with", "as",
                                    "on", "be", "at", "by", "this", "had", "not", "are", "but", "from", "or", "have",
                                    "token", "tokens", "merge", "merges", "byte", "pair", "encoding", "don't", "it's",
                                    "we'll", "they're", "I've", "Hello", "World", "ZAYA", "model"};
static const char *const EXTRA[] = {"é", "ß", "Ελλάδα", "Москва", "日本語", "한국어", "नमस्ते", "مرحبا", "😀", "👨‍👩‍👧",
                                    "１２３", "٣٤", "\t", "\n", "\n\n", "  ", "\u00a0", "\u3000", "...", "?!", "(x)",
                                    "3.14159", "1000000", "#include", "{}", "=>", "--"};

static char *make_text(ZyRng *rng, size_t target, size_t *len) {
    size_t cap = target + 256, n = 0;
    char *s = malloc(cap + 1);
    while (n < target) {
        const char *w;
        double u = zy_rng_uniform(rng);
        if (u < 0.8)
            w = WORDS[zy_rng_next(rng) % ZY_ARRAY_LEN(WORDS)];
        else
            w = EXTRA[zy_rng_next(rng) % ZY_ARRAY_LEN(EXTRA)];
        size_t l = strlen(w);
        if (n + l + 2 > cap) break;
        memcpy(s + n, w, l);
        n += l;
        s[n++] = zy_rng_uniform(rng) < 0.1 ? '\n' : ' ';
    }
    s[n] = '\0';
    *len = n;
    return s;
}

/* A tokenizer trained on ~n_bytes of generated text. */
static Tokenizer *small_tokenizer(size_t n_bytes, int vocab, uint64_t seed) {
    ZyRng rng;
    zy_rng_seed(&rng, seed);
    size_t len;
    char *text = make_text(&rng, n_bytes, &len);
    const char *texts[1] = {text};
    Tokenizer *t = NULL;
    ZyErr err;
    if (tokenizer_train_texts(texts, &len, 1, vocab, 0, &t, NULL, &err)) fprintf(stderr, "    train: %s\n", err.msg);
    free(text);
    return t;
}

static int roundtrip(Tokenizer *t, const char *s, size_t n) {
    int32_t *ids;
    size_t n_ids, len;
    char *back;
    ZyErr err;
    if (tokenizer_encode(t, s, n, &ids, &n_ids, &err)) return 0;
    int ok = tokenizer_decode(t, ids, n_ids, &back, &len, &err) == 0 && len == n && memcmp(back, s, n) == 0;
    free(ids);
    if (ok) free(back);
    return ok;
}

/* noinline: GCC 12 otherwise reports a false "dangling pointer" through the out-parameter */
__attribute__((noinline)) static char *to_json(const Tokenizer *t) {
    char *json = NULL;
    size_t len;
    ZyErr err;
    if (tokenizer_to_json(t, &json, &len, &err)) return NULL;
    return json;
}

/* Replaces the first occurrence of `from` in s (a malloc'ed copy is returned; NULL if absent). */
static char *replace1(const char *s, const char *from, const char *to) {
    const char *p = strstr(s, from);
    if (!p) return NULL;
    size_t a = (size_t)(p - s), fl = strlen(from), tl = strlen(to), n = strlen(s);
    char *r = malloc(n - fl + tl + 1);
    memcpy(r, s, a);
    memcpy(r + a, to, tl);
    memcpy(r + a + tl, p + fl, n - a - fl + 1);
    return r;
}

static int same_ids(Tokenizer *a, Tokenizer *b, const char *text) {
    int32_t *x, *y;
    size_t nx, ny;
    ZyErr err;
    if (tokenizer_encode(a, text, strlen(text), &x, &nx, &err) || tokenizer_encode(b, text, strlen(text), &y, &ny, &err)) return 0;
    int ok = nx == ny && (nx == 0 || memcmp(x, y, nx * sizeof *x) == 0);
    free(x);
    free(y);
    return ok;
}

/* ---- pre-tokenizer ---- */

/* Characters whose class Unicode 14 (PCRE2) and 16 (the built-in table) agree on, plus bytes that are
 * invalid UTF-8. */
static const char *const ALPHABET[] = {
    "a", "b", "Z", "s", "t", "r", "e", "v", "l", "m", "d", "'", "'", " ", " ", " ", "  ", "\t", "\n", "\r", "\x0b", "\x0c",
    "0", "7", "!", ".", ",", "?", "-", "_", "<", "|", ">", "é", "ß", "Ω", "ж", "中", "文", "ا", "ب", "न", "ि", "्", "あ",
    "한", "ก", "ั", "٣", "१", "１", "²", "½", "Ⅻ", "😀", "\u200d", "🏽", "\u00a0", "\u3000", "\u2028", "\u2029", "\x85",
    "\u1680", "\u2009", "\u200b", "\ufeff", "©", "€", "—", "“", "\x80", "\xff", "\xc3", "\xe2\x82", "\xed\xa0\x80", "\xf4\x90"};

static char *random_text(ZyRng *rng, size_t n_chars, size_t *len) {
    char *s = malloc(n_chars * 4 + 1);
    size_t n = 0;
    for (size_t i = 0; i < n_chars; i++) {
        const char *c = ALPHABET[zy_rng_next(rng) % ZY_ARRAY_LEN(ALPHABET)];
        size_t l = strlen(c);
        memcpy(s + n, c, l);
        n += l;
    }
    s[n] = '\0';
    *len = n;
    return s;
}

TEST(tok_pretokenize_matches_pcre2_regex) {
    ZyRng rng;
    zy_rng_seed(&rng, 11);
    ZyErr err;
    int checked = 0;
    for (int it = 0; it < 400; it++) {
        size_t len;
        char *s = random_text(&rng, 1 + zy_rng_next(&rng) % 60, &len);
        size_t *a, *b, na, nb;
        REQUIRE(tokenizer_pretokenize(s, len, &a, &na, &err) == 0);
        int rc = tokenizer_pretokenize_pcre2(s, len, &b, &nb, &err);
        CHECK_MSG(rc == 0, "PCRE2 reference: rc %d (%s)", rc, rc < 0 ? err.msg : "class mismatch");
        int same = na == nb && memcmp(a, b, na * sizeof *a) == 0;
        CHECK_MSG(same, "split differs on \"%s\" (%zu vs %zu pieces)", s, na, nb);
        checked += same;
        free(a);
        free(b);
        free(s);
    }
    CHECK(checked == 400);
}

TEST(tok_pretokenize_examples) {
    struct {
        const char *text;
        size_t ends[12];
    } cases[] = {
        {"Hello  world's 123", {5, 6, 12, 14, 18}},
        {"a\xff" "b", {1, 2, 3}},           /* an invalid byte is its own piece */
        {"  \xff", {2, 3}},                 /* and ends the white-space run like the end of the text */
        {"\xe2\x82", {1, 2}},               /* a truncated character: two invalid bytes */
        {"a\t\tb", {1, 2, 3, 4}},
        {"x   ", {1, 4}},
        {" 's", {2, 3}},
        {"'ll've", {3, 6}},
        {"?'s", {2, 3}},
        {"1½ ٣", {3, 6}},                   /* ½ is a number (No) */
        {"\xc2\x85\xc2\x85" "x", {2, 4, 5}}, /* U+0085 is white space for Oniguruma */
    };
    ZyErr err;
    for (size_t c = 0; c < ZY_ARRAY_LEN(cases); c++) {
        size_t *e, n, want = 0;
        while (want < 12 && cases[c].ends[want]) want++;
        REQUIRE(tokenizer_pretokenize(cases[c].text, strlen(cases[c].text), &e, &n, &err) == 0);
        int ok = n == want && memcmp(e, cases[c].ends, n * sizeof *e) == 0;
        CHECK_MSG(ok, "case %zu \"%s\": %zu pieces, want %zu", c, cases[c].text, n, want);
        free(e);
    }
}

/* ---- encode / decode ---- */

TEST(tok_roundtrip_any_bytes) {
    Tokenizer *t = small_tokenizer(40000, 500, 1);
    REQUIRE(t);
    ZyRng rng;
    zy_rng_seed(&rng, 5);
    int bad = 0;
    for (int it = 0; it < 300 && bad < 5; it++) {
        size_t n = zy_rng_next(&rng) % 200;
        char *s = malloc(n + 1);
        for (size_t i = 0; i < n; i++) s[i] = (char)(zy_rng_next(&rng) & 0xFF);
        if (!roundtrip(t, s, n)) bad++;
        free(s);
        size_t len;
        char *u = random_text(&rng, zy_rng_next(&rng) % 80, &len);
        if (!roundtrip(t, u, len)) bad++;
        free(u);
    }
    CHECK(bad == 0);
    CHECK(roundtrip(t, "", 0));
    CHECK(roundtrip(t, "\0\0a\0", 4));
    tokenizer_free(t);
}

TEST(tok_special_tokens) {
    Tokenizer *t = small_tokenizer(20000, 400, 2);
    REQUIRE(t);
    CHECK(tokenizer_token_id(t, "<|pad|>") == TOK_PAD_ID && tokenizer_token_id(t, "<|bos|>") == TOK_BOS_ID &&
          tokenizer_token_id(t, "<|eos|>") == TOK_EOS_ID);
    const char *text = "a<|bos|>b <|eos|><|pad|><|bos";
    int32_t *ids;
    size_t n;
    ZyErr err;
    REQUIRE(tokenizer_encode(t, text, strlen(text), &ids, &n, &err) == 0);
    int n_special = 0;
    for (size_t i = 0; i < n; i++) n_special += ids[i] <= 2;
    CHECK(n_special == 3);
    REQUIRE(n >= 6);
    CHECK(ids[1] == TOK_BOS_ID);
    char *back;
    size_t len;
    REQUIRE(tokenizer_decode(t, ids, n, &back, &len, &err) == 0);
    CHECK(len == strlen(text) && memcmp(back, text, len) == 0);
    free(back);
    free(ids);
    int32_t one = TOK_EOS_ID;
    REQUIRE(tokenizer_decode(t, &one, 1, &back, &len, &err) == 0);
    CHECK(strcmp(back, "<|eos|>") == 0);
    free(back);
    int32_t bad[2] = {5, tokenizer_vocab_size(t)};
    CHECK(tokenizer_decode(t, bad, 2, &back, &len, &err) != 0 && strstr(err.msg, "outside the vocabulary"));
    bad[1] = -1;
    CHECK(tokenizer_decode(t, bad, 2, &back, &len, &err) != 0 && strstr(err.msg, "id -1 at position 1"));
    REQUIRE(tokenizer_encode(t, "", 0, &ids, &n, &err) == 0);
    CHECK(n == 0 && ids == NULL);
    tokenizer_free(t);
}

/* The plain definition of BPE: merge the lowest-rank adjacent pair (leftmost on ties) until none is left. */
static size_t reference_bpe(const Tokenizer *t, const int *rank_of, int V, int32_t *sym, size_t m) {
    for (;;) {
        int best_rank = -1;
        size_t best = 0;
        for (size_t k = 0; k + 1 < m; k++) {
            int r = rank_of[(size_t)sym[k] * (size_t)V + (size_t)sym[k + 1]];
            if (r >= 0 && (best_rank < 0 || r < best_rank)) {
                best_rank = r;
                best = k;
            }
        }
        if (best_rank < 0) return m;
        int l, r;
        tokenizer_merge(t, best_rank, &l, &r);
        char merged[512];
        snprintf(merged, sizeof merged, "%s%s", tokenizer_token_text(t, l), tokenizer_token_text(t, r));
        sym[best] = tokenizer_token_id(t, merged);
        memmove(sym + best + 1, sym + best + 2, (m - best - 2) * sizeof *sym);
        m--;
    }
}

TEST(tok_merges_match_reference_bpe) {
    Tokenizer *t = small_tokenizer(40000, 520, 3);
    REQUIRE(t);
    int V = tokenizer_vocab_size(t);
    int *rank_of = malloc((size_t)V * (size_t)V * sizeof *rank_of);
    for (size_t i = 0; i < (size_t)V * (size_t)V; i++) rank_of[i] = -1;
    for (int r = tokenizer_n_merges(t) - 1; r >= 0; r--) {
        int a, b;
        tokenizer_merge(t, r, &a, &b);
        rank_of[(size_t)a * (size_t)V + (size_t)b] = r;
    }
    ZyRng rng;
    zy_rng_seed(&rng, 9);
    const char *letters = "theorkanswmdil";
    int bad = 0;
    for (int it = 0; it < 120; it++) { /* one long letter run = one pre-token; long ones take the heap path */
        size_t n = 1 + zy_rng_next(&rng) % (it < 60 ? 40 : 400);
        char s[401];
        for (size_t i = 0; i < n; i++) s[i] = letters[zy_rng_next(&rng) % strlen(letters)];
        s[n] = '\0';
        int32_t *ids, sym[400];
        size_t n_ids;
        ZyErr err;
        REQUIRE(tokenizer_encode(t, s, n, &ids, &n_ids, &err) == 0);
        for (size_t i = 0; i < n; i++) {
            char one[2] = {s[i], 0};
            sym[i] = tokenizer_token_id(t, one);
        }
        size_t m = reference_bpe(t, rank_of, V, sym, n);
        if (m != n_ids || memcmp(sym, ids, m * sizeof *ids) != 0) bad++;
        free(ids);
    }
    CHECK(bad == 0);
    free(rank_of);
    tokenizer_free(t);
}

TEST(tok_cache_variants_agree) {
    Tokenizer *t = small_tokenizer(30000, 450, 4);
    Tokenizer *u = small_tokenizer(30000, 300, 5);
    REQUIRE(t && u);
    ZyRng rng;
    zy_rng_seed(&rng, 6);
    size_t len;
    char *text = make_text(&rng, 20000, &len);
    int32_t *a, *b, *c, *d;
    size_t na, nb, nc, nd;
    ZyErr err;
    TokenizerCache *cache = tokenizer_cache_new();
    REQUIRE(tokenizer_encode(t, text, len, &a, &na, &err) == 0);
    REQUIRE(tokenizer_encode_with(t, NULL, text, len, &b, &nb, &err) == 0);
    REQUIRE(tokenizer_encode_with(u, cache, text, len, &d, &nd, &err) == 0); /* the cache then moves to t */
    REQUIRE(tokenizer_encode_with(t, cache, text, len, &c, &nc, &err) == 0);
    CHECK(na == nb && na == nc && memcmp(a, b, na * 4) == 0 && memcmp(a, c, na * 4) == 0);
    CHECK(nd > na); /* the smaller vocabulary needs more tokens */
    free(a);
    free(b);
    free(c);
    free(d);
    tokenizer_cache_free(cache);
    free(text);
    tokenizer_free(t);
    tokenizer_free(u);
}

/* ---- training ---- */

TEST(tok_train_hand_checked_merges) {
    /* "ab ab ab cd": pre-tokens ab, Ġab x2, Ġcd. Pairs: (a,b) 3, (Ġ,a) 2, (Ġ,c) 1, (c,d) 1. Merges: a b; then
     * Ġ ab (2); then the tie (Ġ,c)/(c,d) goes to the smaller ids: 'c' (69) < 'Ġ' (223), so c d; then Ġ cd. */
    const char *text = "ab ab ab cd";
    size_t len = strlen(text);
    const char *texts[1] = {text};
    Tokenizer *t = NULL;
    TokenizerTrainStats st;
    ZyErr err;
    REQUIRE(tokenizer_train_texts(texts, &len, 1, 300, 0, &t, &st, &err) == 0);
    CHECK(st.merges == 4 && tokenizer_n_merges(t) == 4 && tokenizer_vocab_size(t) == 263 && st.words == 3);
    const char *want[4][2] = {{"a", "b"}, {"Ġ", "ab"}, {"c", "d"}, {"Ġ", "cd"}};
    for (int r = 0; r < 4 && r < tokenizer_n_merges(t); r++) {
        int a, b;
        tokenizer_merge(t, r, &a, &b);
        CHECK_MSG(strcmp(tokenizer_token_text(t, a), want[r][0]) == 0 && strcmp(tokenizer_token_text(t, b), want[r][1]) == 0,
                  "merge %d is %s %s", r, tokenizer_token_text(t, a), tokenizer_token_text(t, b));
    }
    CHECK(tokenizer_token_id(t, "!") == 3 && tokenizer_token_id(t, "c") == 69 && tokenizer_token_id(t, "Ġ") == 223 &&
          tokenizer_token_id(t, "ab") == 259 && tokenizer_token_id(t, "Ġcd") == 262);
    int32_t *ids;
    size_t n;
    REQUIRE(tokenizer_encode(t, "cd ab", 5, &ids, &n, &err) == 0);
    CHECK(n == 2 && ids[0] == 261 && ids[1] == 260);
    free(ids);
    tokenizer_free(t);
}

static char *path_in(const char *dir, const char *name) {
    char *p = malloc(strlen(dir) + strlen(name) + 2);
    sprintf(p, "%s/%s", dir, name);
    return p;
}

static char *write_tmp(const char *dir, const char *name, const char *data, size_t len) {
    char *p = path_in(dir, name);
    FILE *f = fopen(p, "wb");
    if (f) {
        fwrite(data, 1, len, f);
        fclose(f);
    }
    return p;
}

TEST(tok_train_deterministic_files_memory_jsonl) {
    ZyRng rng;
    zy_rng_seed(&rng, 7);
    size_t l1, l2;
    char *t1 = make_text(&rng, 30000, &l1), *t2 = make_text(&rng, 20000, &l2);
    char dir[] = "/tmp/zy_tok_XXXXXX";
    REQUIRE(mkdtemp(dir));
    char *p1 = write_tmp(dir, "a.txt", t1, l1), *p2 = write_tmp(dir, "b.txt", t2, l2);
    /* the same two texts as JSONL records */
    cJSON *r1 = cJSON_CreateObject(), *r2 = cJSON_CreateObject();
    cJSON_AddStringToObject(r1, "text", t1);
    cJSON_AddNumberToObject(r2, "id", 2);
    cJSON_AddStringToObject(r2, "text", t2);
    char *j1 = cJSON_PrintUnformatted(r1), *j2 = cJSON_PrintUnformatted(r2);
    size_t jl = strlen(j1) + strlen(j2) + 4;
    char *jsonl = malloc(jl + 1);
    snprintf(jsonl, jl + 1, "%s\n\n%s\n", j1, j2);
    char *p3 = write_tmp(dir, "c.jsonl", jsonl, strlen(jsonl));
    const char *files[2] = {p1, p2}, *texts[2] = {t1, t2}, *jfiles[1] = {p3};
    size_t lens[2] = {l1, l2};
    Tokenizer *a = NULL, *b = NULL, *c = NULL, *d = NULL;
    TokenizerTrainStats st;
    ZyErr err;
    REQUIRE(tokenizer_train(files, 2, 700, 0, &a, &st, &err) == 0);
    /* the text runs out of pairs before 700 tokens: training stops there */
    CHECK(st.input_mb > 0.049 && st.input_mb < 0.051 && st.merges > 100 && st.seconds >= 0);
    CHECK(tokenizer_vocab_size(a) == 259 + st.merges && tokenizer_vocab_size(a) < 700);
    REQUIRE(tokenizer_train(files, 2, 700, 0, &b, NULL, &err) == 0);
    REQUIRE(tokenizer_train_texts(texts, lens, 2, 700, 0, &c, NULL, &err) == 0);
    REQUIRE(tokenizer_train(jfiles, 1, 700, 0, &d, NULL, &err) == 0);
    char *ja = to_json(a), *jb = to_json(b), *jc = to_json(c), *jd = to_json(d);
    REQUIRE(ja && jb && jc && jd);
    CHECK(strcmp(ja, jb) == 0);
    CHECK(strcmp(ja, jc) == 0);
    CHECK(strcmp(ja, jd) == 0);
    /* save -> load -> save is the identity, and the loaded copy encodes the same */
    char *tp = path_in(dir, "tok.json");
    REQUIRE(tokenizer_save(a, tp, &err) == 0);
    Tokenizer *e = NULL;
    REQUIRE(tokenizer_load(tp, &e, &err) == 0);
    char *je = to_json(e);
    CHECK(je && strcmp(ja, je) == 0);
    CHECK(same_ids(a, e, t2));
    free(je);
    tokenizer_free(e);
    unlink(tp);
    free(tp);
    /* errors */
    const char *missing[1] = {"/nonexistent/zy.txt"};
    CHECK(tokenizer_train(missing, 1, 700, 0, &e, NULL, &err) != 0 && strstr(err.msg, "/nonexistent/zy.txt: cannot open"));
    CHECK(tokenizer_train(files, 2, 259, 0, &e, NULL, &err) != 0 && strstr(err.msg, "too small"));
    CHECK(tokenizer_train(files, 2, TOK_MAX_VOCAB + 1, 0, &e, NULL, &err) != 0 && strstr(err.msg, "too large"));
    char *bad1 = write_tmp(dir, "d.jsonl", "{\"text\": \"ok\"}\n{\"txt\": \"no\"}\n", 30);
    const char *bf1[1] = {bad1};
    CHECK(tokenizer_train(bf1, 1, 700, 0, &e, NULL, &err) != 0 && strstr(err.msg, "d.jsonl:2: no \"text\" string"));
    char *bad2 = write_tmp(dir, "e.jsonl", "{\"text\": \"ok\"\n", 14);
    const char *bf2[1] = {bad2};
    CHECK(tokenizer_train(bf2, 1, 700, 0, &e, NULL, &err) != 0 && strstr(err.msg, "e.jsonl:1: invalid JSON at column"));
    const char *all[5] = {p1, p2, p3, bad1, bad2};
    for (int i = 0; i < 5; i++) unlink(all[i]);
    rmdir(dir);
    free(ja), free(jb), free(jc), free(jd);
    free(p1), free(p2), free(p3), free(bad1), free(bad2);
    cJSON_Delete(r1), cJSON_Delete(r2);
    cJSON_free(j1), cJSON_free(j2);
    free(jsonl), free(t1), free(t2);
    tokenizer_free(a), tokenizer_free(b), tokenizer_free(c), tokenizer_free(d);
}

/* ---- tokenizer.json ---- */

TEST(tok_load_refusals_name_the_field) {
    Tokenizer *t = small_tokenizer(20000, 300, 8);
    REQUIRE(t);
    char *base = to_json(t);
    REQUIRE(base);
    struct {
        const char *from, *to, *msg;
    } cases[] = {
        {"\"type\": \"BPE\"", "\"type\": \"WordPiece\"", "model.type: \"WordPiece\" is not supported"},
        {"\"pre_tokenizer\": {\"type\": \"ByteLevel\"", "\"pre_tokenizer\": {\"type\": \"Whitespace\"", "pre_tokenizer: type \"Whitespace\""},
        {"\"pre_tokenizer\": {", "\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": 3}, \"x\": {", "pre_tokenizer.pretokenizers: expected an array"},
        {"\"add_prefix_space\": false", "\"add_prefix_space\": true", "pre_tokenizer.add_prefix_space: true"},
        {"\"add_prefix_space\": false, ", "", "pre_tokenizer.add_prefix_space: missing"},
        {"\"use_regex\": true", "\"use_regex\": 1", "pre_tokenizer.use_regex: not a boolean"},
        {"\"normalizer\": null", "\"normalizer\": {\"type\": \"Nmt\"}", "normalizer: type \"Nmt\" is not supported"},
        {"\"truncation\": null", "\"truncation\": {\"max_length\": 5}", "truncation: only null"},
        {"\"post_processor\": null", "\"post_processor\": {\"type\": \"TemplateProcessing\"}", "post_processor.special_tokens: missing"},
        {"\"post_processor\": null", "\"post_processor\": {\"type\": \"BertProcessing\"}", "post_processor: type \"BertProcessing\" is not supported"},
        {"\"decoder\": {\"type\": \"ByteLevel\"", "\"decoder\": {\"type\": \"WordPiece\"", "decoder: type \"WordPiece\""},
        {"\"model\": {", "\"modelx\": {", "model: missing"},
        {"\"vocab\": {", "\"vocabx\": {", "model.vocab: missing"},
        {"\"vocab\": {", "\"vocab\": [], \"v\": {", "model.vocab: expected an object, got an array"},
        {"\"<|pad|>\": 0,", "\"<|pad|>\": -1,", "model.vocab[\"<|pad|>\"]: id must be an integer"},
        {"\"<|pad|>\": 0,", "\"<|pad|>\": 0.5,", "model.vocab[\"<|pad|>\"]: id must be an integer"},
        {"\"<|bos|>\": 1,", "\"<|bos|>\": 0,", "model.vocab[\"<|bos|>\"]: id 0 is already \"<|pad|>\""},
        {"\"<|bos|>\": 1,", "\"<|bos|>\": 1, \"<|bos|>\": 9999,", "model.vocab: token \"<|bos|>\" appears twice"},
        {"\"<|pad|>\": 0,", "\"\": 0,", "model.vocab: empty token"},
        {"\"merges\": [", "\"mergesx\": [", "model.merges: missing"},
        {"\"merges\": [", "\"merges\": 5, \"m\": [", "model.merges: expected an array, got a number"},
        {"\"merges\": [", "\"merges\": [[\"zzunknown\", \"a\"],", "model.merges[0]: token \"zzunknown\" is not in model.vocab"},
        {"\"merges\": [", "\"merges\": [[\"~\", \"~\"],", "model.merges[0]: merged token \"~~\" is not in model.vocab"},
        {"\"merges\": [", "\"merges\": [\"a b c\",", "model.merges[0]: \"a b c\" is not two tokens"},
        {"\"merges\": [", "\"merges\": [\"ab\",", "model.merges[0]: \"ab\" is not two tokens"},
        {"\"merges\": [", "\"merges\": [[\"a\"],", "model.merges[0]: expected [\"left\", \"right\"]"},
        {"\"merges\": [", "\"merges\": [7,", "model.merges[0]: expected"},
        {"\"dropout\": null", "\"dropout\": 0.1", "model.dropout: only null"},
        {"\"byte_fallback\": false", "\"byte_fallback\": \"yes\"", "model.byte_fallback: not a boolean"},
        {"\"continuing_subword_prefix\": null", "\"continuing_subword_prefix\": \"##\"", "model.continuing_subword_prefix"},
        {"\"end_of_word_suffix\": null", "\"end_of_word_suffix\": \"</w>\"", "model.end_of_word_suffix"},
        {"\"unk_token\": null", "\"unk_token\": \"<nope>\"", "model.unk_token: \"<nope>\" is not in model.vocab"},
        {"\"fuse_unk\": false", "\"fuse_unk\": 0", "model.fuse_unk: not a boolean"},
        {"\"added_tokens\": [", "\"added_tokens\": {}, \"a\": [", "added_tokens: expected an array"},
        {"\"lstrip\": false", "\"lstrip\": null", "added_tokens[0].lstrip: not a boolean"},
        {"\"single_word\": false", "\"single_word\": 1", "added_tokens[0].single_word: not a boolean"},
        {"{\"id\": 0, \"content\": \"<|pad|>\"", "{\"id\": 7, \"content\": \"<|pad|>\"", "added_tokens[0]: \"<|pad|>\" has id 7 but model.vocab gives it 0"},
        {"\"content\": \"<|pad|>\"", "\"content\": \"\"", "added_tokens[0].content: missing or empty"},
        {"{\"id\": 0,", "{\"id\": \"0\",", "added_tokens[0].id: missing or not an integer"},
        {"{\"id\": 0, \"content\": \"<|pad|>\"", "{\"id\": 1, \"content\": \"<|new|>\"", "added_tokens[0]: id 1 of \"<|new|>\" is already \"<|bos|>\""},
        {"\n}\n", "\n}\nx", "unexpected data after the top-level value"},
        {"\"version\"", "\"version\" \"", "invalid JSON near byte"},
    };
    ZyErr err;
    for (size_t c = 0; c < ZY_ARRAY_LEN(cases); c++) {
        char *j = replace1(base, cases[c].from, cases[c].to);
        if (!j) {
            CHECK_MSG(0, "case %zu: \"%s\" not found in the JSON", c, cases[c].from);
            continue;
        }
        Tokenizer *u = NULL;
        err.msg[0] = '\0';
        int rc = tokenizer_load_json(j, strlen(j), "cfg/tok.json", &u, &err);
        CHECK_MSG(rc != 0 && u == NULL && strncmp(err.msg, "cfg/tok.json: ", 14) == 0 && strstr(err.msg, cases[c].msg),
                  "case %zu: rc %d, message \"%s\", expected \"%s\"", c, rc, err.msg, cases[c].msg);
        tokenizer_free(u);
        free(j);
    }
    Tokenizer *u = NULL;
    CHECK(tokenizer_load_json("[1]", 3, "arr.json", &u, &err) != 0 && strstr(err.msg, "arr.json: expected a JSON object"));
    CHECK(tokenizer_load_json(base, strlen(base) / 2, "half.json", &u, &err) != 0 && strstr(err.msg, "half.json: invalid JSON"));
    CHECK(tokenizer_load("/nonexistent/tok.json", &u, &err) != 0 && strstr(err.msg, "/nonexistent/tok.json: cannot open"));
    free(base);
    tokenizer_free(t);
}

/* Variants HF writes or accepts: "a b" merges, optional fields left out, GPT-2's "" affixes and ByteLevel
 * post-processor, an added token outside model.vocab, ignore_merges, unk_token with fuse_unk. */
TEST(tok_load_hf_variants) {
    Tokenizer *t = small_tokenizer(30000, 400, 10);
    REQUIRE(t);
    char *base = to_json(t);
    cJSON *root = cJSON_Parse(base);
    REQUIRE(root);
    cJSON *model = cJSON_GetObjectItem(root, "model");
    cJSON *merges = cJSON_GetObjectItem(model, "merges");
    cJSON *legacy = cJSON_CreateArray();
    for (cJSON *m = merges->child; m; m = m->next) {
        char s[256];
        snprintf(s, sizeof s, "%s %s", m->child->valuestring, m->child->next->valuestring);
        cJSON_AddItemToArray(legacy, cJSON_CreateString(s));
    }
    cJSON_ReplaceItemInObject(model, "merges", legacy);
    cJSON_DeleteItemFromObject(model, "ignore_merges");
    cJSON_DeleteItemFromObject(model, "dropout");
    cJSON_ReplaceItemInObject(model, "continuing_subword_prefix", cJSON_CreateString(""));
    cJSON_ReplaceItemInObject(model, "end_of_word_suffix", cJSON_CreateString(""));
    cJSON_DeleteItemFromObject(cJSON_GetObjectItem(root, "pre_tokenizer"), "use_regex");
    cJSON_ReplaceItemInObject(root, "post_processor", cJSON_Parse("{\"type\": \"ByteLevel\", \"trim_offsets\": false}"));
    cJSON_ReplaceItemInObject(root, "decoder", cJSON_CreateNull());
    cJSON *extra = cJSON_Parse("{\"id\": 400, \"content\": \"[MASK]\", \"special\": true}");
    cJSON_AddItemToArray(cJSON_GetObjectItem(root, "added_tokens"), extra);
    char *variant = cJSON_PrintUnformatted(root);
    Tokenizer *u = NULL;
    ZyErr err;
    REQUIRE(tokenizer_load_json(variant, strlen(variant), "variant.json", &u, &err) == 0);
    const char *text = "the token merges don't encoding é 日本語 1000000\n\n  (x)";
    CHECK(same_ids(t, u, text));
    CHECK(tokenizer_vocab_size(u) == 401 && tokenizer_token_id(u, "[MASK]") == 400);
    int32_t *ids;
    size_t n;
    REQUIRE(tokenizer_encode(u, "a[MASK]b", 8, &ids, &n, &err) == 0);
    CHECK(n == 3 && ids[1] == 400);
    free(ids);
    char *back;
    size_t len;
    int32_t hole = 399; /* ids 259 + merges < 399 < 400 have no token here? only if the vocab stopped early */
    if (!tokenizer_token_text(u, hole)) CHECK(tokenizer_decode(u, &hole, 1, &back, &len, &err) != 0 && strstr(err.msg, "has no token"));
    tokenizer_free(u);
    cJSON_free(variant);
    cJSON_Delete(root);
    free(base);
    tokenizer_free(t);

    /* a hand-made vocabulary: bytes 'a', 'b' only, unk, one merge; ignore_merges and fuse_unk */
    const char *mini =
        "{\"added_tokens\": [], \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false},"
        " \"model\": {\"type\": \"BPE\", \"unk_token\": \"<unk>\", \"fuse_unk\": %s, \"ignore_merges\": %s,"
        " \"vocab\": {\"<unk>\": 0, \"a\": 1, \"b\": 2, \"ab\": 3, \"bab\": 4, \"ba\": 5}, \"merges\": [\"a b\", \"b a\"]}}";
    char js[600];
    struct {
        const char *fuse, *ignore, *text;
        int n, ids[6];
    } cases[] = {
        {"false", "false", "abxxb", 4, {3, 0, 0, 2}},
        {"true", "false", "abxxb", 3, {3, 0, 2}},
        {"false", "false", "bab", 2, {2, 3}},   /* (a,b) ranks before (b,a) */
        {"false", "true", "bab", 1, {4}},       /* the whole word is in the vocab */
        {"true", "true", "xab", 2, {0, 3}},
    };
    for (size_t c = 0; c < ZY_ARRAY_LEN(cases); c++) {
        snprintf(js, sizeof js, mini, cases[c].fuse, cases[c].ignore);
        REQUIRE(tokenizer_load_json(js, strlen(js), "mini.json", &u, &err) == 0);
        REQUIRE(tokenizer_encode(u, cases[c].text, strlen(cases[c].text), &ids, &n, &err) == 0);
        CHECK_MSG((int)n == cases[c].n && memcmp(ids, cases[c].ids, n * sizeof *ids) == 0, "case %zu: %zu ids", c, n);
        free(ids);
        tokenizer_free(u);
    }
}

/* Random mutations of a valid tokenizer.json: loading must fail cleanly or give a tokenizer that works. */
TEST(tok_load_mutation_fuzz) {
    Tokenizer *t = small_tokenizer(8000, 280, 12);
    REQUIRE(t);
    char *base = to_json(t);
    REQUIRE(base);
    size_t blen = strlen(base);
    tokenizer_free(t);
    ZyRng rng;
    zy_rng_seed(&rng, 13);
    static const char pool[] = "{}[]\":,0123456789-.e \\nulltrufaseBPEByteLevel";
    char *buf = malloc(2 * blen + 64);
    int loaded = 0, refused = 0, bad_msg = 0;
    for (int it = 0; it < 1500; it++) {
        memcpy(buf, base, blen);
        size_t n = blen;
        int edits = 1 + (int)(zy_rng_next(&rng) % 4);
        for (int e = 0; e < edits && n > 0; e++) {
            size_t at = zy_rng_next(&rng) % n;
            switch (zy_rng_next(&rng) % 6) {
            case 0: buf[at] = (char)(zy_rng_next(&rng) & 0xFF); break;
            case 1: buf[at] = pool[zy_rng_next(&rng) % (sizeof pool - 1)]; break;
            case 2: { /* delete a range */
                size_t k = 1 + zy_rng_next(&rng) % 40;
                if (k > n - at) k = n - at;
                memmove(buf + at, buf + at + k, n - at - k);
                n -= k;
                break;
            }
            case 3: { /* duplicate a range */
                size_t k = 1 + zy_rng_next(&rng) % 40;
                if (k > n - at) k = n - at;
                if (n + k <= 2 * blen) {
                    memmove(buf + at + k, buf + at, n - at);
                    n += k;
                }
                break;
            }
            case 4: n = at; break; /* truncate */
            default: buf[at] = "0123456789"[zy_rng_next(&rng) % 10]; break;
            }
        }
        Tokenizer *u = NULL;
        ZyErr err;
        err.msg[0] = '\0';
        if (tokenizer_load_json(buf, n, "fuzz.json", &u, &err) != 0) {
            refused++;
            if (u || strncmp(err.msg, "fuzz.json: ", 11) != 0) bad_msg++;
            continue;
        }
        loaded++;
        const char *text = "the model's tokens\n\n 123 é\xff";
        int32_t *ids;
        size_t n_ids, len;
        char *back;
        if (tokenizer_encode(u, text, strlen(text), &ids, &n_ids, &err) == 0) {
            if (tokenizer_decode(u, ids, n_ids, &back, &len, &err) == 0) free(back);
            else bad_msg++; /* ids it made itself must decode */
            free(ids);
        }
        tokenizer_free(u);
    }
    CHECK_MSG(bad_msg == 0, "%d bad outcomes", bad_msg);
    CHECK(loaded > 0 && refused > 0);
    free(buf);
    free(base);
}

/* --split-digits: no token holds two digits, numbers encode one token per digit, and the rest still merges. */
static int max_digits_in_vocab(const Tokenizer *t) {
    int worst = 0;
    for (int id = 0; id < tokenizer_vocab_size(t); id++) {
        const char *s = tokenizer_token_text(t, id);
        int d = 0;
        for (size_t k = 0; s && s[k]; k++) d += s[k] >= '0' && s[k] <= '9';
        if (d > worst) worst = d;
    }
    return worst;
}

TEST(tokenizer_split_digits_keeps_numbers_one_token_per_digit) {
    static const char text[] = "12+34=46\n12+34=46\n99+1=100\n1000 apples and 2024 pears, 12 12 12 34 34 46 46 100\n"
                               "the cat sat on the mat; the cat sat on the mat again and again\n";
    const char *texts[1] = {text};
    size_t len = sizeof text - 1;
    Tokenizer *plain = NULL, *split = NULL;
    ZyErr err = {{0}};
    REQUIRE(tokenizer_train_texts(texts, &len, 1, 330, 0, &plain, NULL, &err) == 0);
    REQUIRE(tokenizer_train_texts(texts, &len, 1, 330, 1, &split, NULL, &err) == 0);
    CHECK(max_digits_in_vocab(plain) >= 2);
    CHECK(max_digits_in_vocab(split) == 1);
    int32_t *ids = NULL;
    size_t n = 0;
    REQUIRE(tokenizer_encode(split, "2024", 4, &ids, &n, &err) == 0);
    CHECK(n == 4);
    free(ids);
    REQUIRE(tokenizer_encode(split, "the cat", 7, &ids, &n, &err) == 0);
    CHECK(n == 2); /* words still merge */
    free(ids);
    tokenizer_free(plain);
    tokenizer_free(split);
}

/* ---- released pipelines (Gemma 3 and others): each component against ids and strings from HF tokenizers ---- */

typedef struct {
    char *p;
    size_t n, cap;
} Str;

static void str_add(Str *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void str_add(Str *s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (k < 0) return;
    if (s->n + (size_t)k + 1 > s->cap) {
        s->cap = (s->n + (size_t)k + 1) * 2;
        s->p = realloc(s->p, s->cap);
    }
    va_start(ap, fmt);
    vsnprintf(s->p + s->n, (size_t)k + 1, fmt, ap);
    va_end(ap);
    s->n += (size_t)k;
}

static void str_json(Str *s, const char *t) {
    str_add(s, "\"");
    for (; *t; t++) {
        unsigned char c = (unsigned char)*t;
        if (c == '"' || c == '\\')
            str_add(s, "\\%c", c);
        else if (c < 0x20)
            str_add(s, "\\u%04x", c);
        else
            str_add(s, "%c", c);
    }
    str_add(s, "\"");
}

/* HF's defaults written out (tokenizers requires every added-token field). */
#define MINI_SPECIALS                                                                                           \
    "{\"id\": 0, \"content\": \"<pad>\", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, "        \
    "\"normalized\": false, \"special\": true}, {\"id\": 1, \"content\": \"<eos>\", \"single_word\": false, "   \
    "\"lstrip\": false, \"rstrip\": false, \"normalized\": false, \"special\": true}, {\"id\": 2, \"content\": " \
    "\"<bos>\", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, \"normalized\": false, "          \
    "\"special\": true}, {\"id\": 3, \"content\": \"<unk>\", \"single_word\": false, \"lstrip\": false, "       \
    "\"rstrip\": false, \"normalized\": false, \"special\": true}"

typedef struct {
    const char *normalizer, *pre, *post, *decoder, *added, *model_extra;
    int no_bytes;              /* leave out the 256 <0xNN> tokens */
    const char *extra[8];      /* more vocabulary, after the characters */
    const char *merges[8][2];
} Mini;

/* A small tokenizer.json: <pad> <eos> <bos> <unk> (0-3), <0x00>..<0xFF> (4-259), a b c d - ▁ ' ' x y é (260-269),
 * the extra tokens, the merges' results; unk_token <unk>. */
static char *mini_json(const Mini *m) {
    static const char *const chars[] = {"a", "b", "c", "d", "-", "\u2581", " ", "x", "y", "\u00e9"};
    const char *names[600];
    char bytes[256][8];
    int n = 0;
    names[n++] = "<pad>", names[n++] = "<eos>", names[n++] = "<bos>", names[n++] = "<unk>";
    for (int b = 0; b < 256 && !m->no_bytes; b++) {
        snprintf(bytes[b], sizeof bytes[b], "<0x%02X>", b);
        names[n++] = bytes[b];
    }
    for (size_t i = 0; i < ZY_ARRAY_LEN(chars); i++) names[n++] = chars[i];
    for (int i = 0; i < 8 && m->extra[i]; i++) names[n++] = m->extra[i];
    char merged[8][64];
    for (int i = 0; i < 8 && m->merges[i][0]; i++) {
        snprintf(merged[i], sizeof merged[i], "%s%s", m->merges[i][0], m->merges[i][1]);
        int dup = 0;
        for (int k = 0; k < n; k++) dup |= strcmp(names[k], merged[i]) == 0;
        if (!dup) names[n++] = merged[i];
    }
    Str s = {0};
    str_add(&s, "{\"added_tokens\": [%s], \"normalizer\": %s, \"pre_tokenizer\": %s, \"post_processor\": %s, \"decoder\": %s, "
                "\"model\": {\"type\": \"BPE\", \"unk_token\": \"<unk>\", %s, \"vocab\": {",
            m->added ? m->added : "", m->normalizer ? m->normalizer : "null", m->pre ? m->pre : "null",
            m->post ? m->post : "null", m->decoder ? m->decoder : "null",
            m->model_extra ? m->model_extra : "\"byte_fallback\": true, \"fuse_unk\": true");
    for (int i = 0; i < n; i++) {
        str_add(&s, i ? ", " : "");
        str_json(&s, names[i]);
        str_add(&s, ": %d", i);
    }
    str_add(&s, "}, \"merges\": [");
    for (int i = 0; i < 8 && m->merges[i][0]; i++) {
        str_add(&s, i ? ", [" : "[");
        str_json(&s, m->merges[i][0]);
        str_add(&s, ", ");
        str_json(&s, m->merges[i][1]);
        str_add(&s, "]");
    }
    str_add(&s, "]}}");
    return s.p;
}

static Tokenizer *mini(const Mini *m) {
    char *j = mini_json(m);
    Tokenizer *t = NULL;
    ZyErr err;
    if (tokenizer_load_json(j, strlen(j), "mini.json", &t, &err)) fprintf(stderr, "    mini: %s\n", err.msg);
    free(j);
    return t;
}

/* The ids of text (specials added when add_special) equal want[0..n), n < 0 ending the list at the first -1. */
static int ids_are(const Tokenizer *t, const char *text, size_t len, int add_special, const int *want) {
    int32_t *ids;
    size_t n;
    ZyErr err;
    if (tokenizer_encode_ex(t, NULL, text, len, add_special ? TOK_ENCODE_ADD_SPECIAL : 0, &ids, &n, &err)) {
        fprintf(stderr, "    encode: %s\n", err.msg);
        return 0;
    }
    size_t w = 0;
    while (want[w] >= 0) w++;
    int ok = n == w;
    for (size_t i = 0; ok && i < n; i++) ok = ids[i] == want[i];
    if (!ok) {
        fprintf(stderr, "    \"%s\": got", text);
        for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
        fprintf(stderr, "\n");
    }
    free(ids);
    return ok;
}

static int decodes_to(const Tokenizer *t, const int *ids, unsigned flags, const char *want) {
    size_t n = 0;
    while (ids[n] >= 0) n++;
    char *b;
    size_t len;
    ZyErr err;
    if (tokenizer_decode_ex(t, (const int32_t *)ids, n, flags, &b, &len, &err)) {
        fprintf(stderr, "    decode: %s\n", err.msg);
        return 0;
    }
    int ok = len == strlen(want) && memcmp(b, want, len) == 0;
    if (!ok) fprintf(stderr, "    decode: got \"%.*s\" want \"%s\"\n", (int)len, b, want);
    free(b);
    return ok;
}

#define GEMMA_NORMALIZER "{\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"\u2581\"}"
#define GEMMA_PRE "{\"type\": \"Split\", \"pattern\": {\"String\": \" \"}, \"behavior\": \"MergedWithPrevious\", \"invert\": false}"
#define GEMMA_DECODER                                                                                           \
    "{\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Replace\", \"pattern\": {\"String\": \"\u2581\"}, "  \
    "\"content\": \" \"}, {\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"}]}"
#define BOS_TEMPLATE                                                                                            \
    "{\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<bos>\", \"type_id\": 0}}, " \
    "{\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}], \"pair\": [{\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}, " \
    "{\"Sequence\": {\"id\": \"B\", \"type_id\": 1}}], \"special_tokens\": {\"<bos>\": {\"id\": \"<bos>\", "    \
    "\"ids\": [2], \"tokens\": [\"<bos>\"]}}}"
#define MINI_MERGES {{"\u2581", "a"}, {"\u2581a", "b"}, {"c", "d"}, {"a", "b"}} /* ▁a 270, ▁ab 271, cd 272, ab 273 */

#define IDS(...) ((const int[]){__VA_ARGS__, -1})

/* Gemma 3's pipeline: Replace(" " -> "▁"), Split(" ", MergedWithPrevious), byte_fallback + fuse_unk BPE,
 * TemplateProcessing(<bos> $A), decoders Replace / ByteFallback / Fuse. Expected values from tokenizers 0.23. */
TEST(tok_gemma_pipeline) {
    Mini m = {GEMMA_NORMALIZER, GEMMA_PRE, BOS_TEMPLATE, GEMMA_DECODER, MINI_SPECIALS, NULL, 0, {NULL}, MINI_MERGES};
    Tokenizer *t = mini(&m);
    REQUIRE(t);
    CHECK(ids_are(t, "ab cd", 5, 1, IDS(2, 273, 265, 272)));
    CHECK(ids_are(t, "ab cd", 5, 0, IDS(273, 265, 272)));
    CHECK(ids_are(t, " ab", 3, 1, IDS(2, 271)));
    CHECK(ids_are(t, "\u00e9\u20ac", 5, 1, IDS(2, 269, 230, 134, 176))); /* € falls back to its bytes */
    CHECK(ids_are(t, "x\ty", 3, 1, IDS(2, 267, 13, 268)));
    CHECK(ids_are(t, "", 0, 1, IDS(2)));
    CHECK(ids_are(t, "\u2581", 3, 1, IDS(2, 265)));
    CHECK(ids_are(t, "<bos>a", 6, 1, IDS(2, 2, 260)));
    CHECK(ids_are(t, "ab  ab", 6, 1, IDS(2, 273, 265, 271)));
    /* invalid UTF-8 is its U+FFFD replacement: EF BF BD falls back to bytes */
    CHECK(ids_are(t, "a\xff" "b\xe2\x82", 5, 0, IDS(260, 243, 195, 193, 261, 243, 195, 193)));
    CHECK(decodes_to(t, IDS(2, 260, 261), 0, "<bos>ab"));
    CHECK(decodes_to(t, IDS(2, 260, 261), TOK_DECODE_SKIP_SPECIAL, "ab"));
    CHECK(decodes_to(t, IDS(230, 134, 176), 0, "\u20ac"));
    CHECK(decodes_to(t, IDS(230), 0, "\xe2"));                      /* the byte itself ... */
    CHECK(decodes_to(t, IDS(230), TOK_DECODE_LOSSY, "\ufffd"));     /* ... or HF's U+FFFD */
    CHECK(decodes_to(t, IDS(230, 260), TOK_DECODE_LOSSY, "\ufffd" "a"));
    CHECK(decodes_to(t, IDS(271, 265, 266), 0, " ab  "));
    tokenizer_free(t);
}

/* byte_fallback needs every byte's token, else unk; as in HF an unk waits for the next known character, so
 * fallback bytes in between come first; fuse_unk joins neighbouring unks. */
TEST(tok_byte_fallback_and_unk) {
    Mini m = {NULL, NULL, NULL, NULL, MINI_SPECIALS, NULL, 1, {"<0xE2>", "<0x82>", "<0xAC>"}, {{NULL, NULL}}};
    Tokenizer *t = mini(&m);
    REQUIRE(t);
    CHECK(ids_are(t, "q\u20acqa", 6, 1, IDS(14, 15, 16, 3, 4)));
    CHECK(ids_are(t, "qq\u20ac", 5, 1, IDS(14, 15, 16, 3)));
    CHECK(ids_are(t, "\u20ac", 3, 1, IDS(14, 15, 16)));
    tokenizer_free(t);
    m.model_extra = "\"byte_fallback\": true, \"fuse_unk\": false";
    t = mini(&m);
    REQUIRE(t);
    CHECK(ids_are(t, "q\u20acqa", 6, 1, IDS(14, 15, 16, 3, 3, 4)));
    CHECK(ids_are(t, "qq\u20ac", 5, 1, IDS(3, 14, 15, 16, 3)));
    CHECK(ids_are(t, "qqa", 3, 1, IDS(3, 3, 4)));
    tokenizer_free(t);
}

/* Split: every behavior, with and without invert. ignore_merges makes each piece in the vocabulary one id, so
 * the ids show the pieces: a=260 b=261 c=262 -=264 a-=270 b-=271 -c=272 -b=273 --=274. */
TEST(tok_split_behaviors) {
    static const struct {
        const char *behavior;
        int invert;
        int want[8];
    } cases[] = {
        {"Removed", 0, {260, 261, 262, -1}},
        {"Removed", 1, {264, 264, 264, -1}},
        {"Isolated", 0, {260, 264, 261, 264, 264, 262, -1}},
        {"Isolated", 1, {260, 264, 261, 264, 264, 262, -1}},
        {"MergedWithPrevious", 0, {270, 271, 264, 262, -1}},
        {"MergedWithPrevious", 1, {260, 273, 264, 272, -1}},
        {"MergedWithNext", 0, {260, 273, 264, 272, -1}},
        {"MergedWithNext", 1, {270, 271, 264, 262, -1}},
        {"Contiguous", 0, {260, 264, 261, 274, 262, -1}},
        {"Contiguous", 1, {260, 264, 261, 274, 262, -1}},
    };
    for (size_t c = 0; c < ZY_ARRAY_LEN(cases); c++) {
        char pre[200];
        snprintf(pre, sizeof pre, "{\"type\": \"Split\", \"pattern\": {\"String\": \"-\"}, \"behavior\": \"%s\", \"invert\": %s}",
                 cases[c].behavior, cases[c].invert ? "true" : "false");
        Mini m = {NULL, pre, NULL, NULL, NULL, "\"ignore_merges\": true", 0, {"a-", "b-", "-c", "-b", "--"}, {{NULL, NULL}}};
        Tokenizer *t = mini(&m);
        REQUIRE(t);
        CHECK_MSG(ids_are(t, "a-b--c", 6, 0, cases[c].want), "%s invert %d", cases[c].behavior, cases[c].invert);
        tokenizer_free(t);
    }
}

/* Metaspace: prepend_scheme first (only at the start of the text: not after an added token), always, never;
 * split or not; its decoder drops the first token's replacement unless never. */
TEST(tok_metaspace) {
    static const struct {
        const char *scheme, *split;
        int want[4][6];
        const char *dec;
    } cases[] = {
        {"first", "true", {{270, 265, 261, -1}, {2, 260, 265, 261, -1}, {271, 2, 271, -1}, {271, 265, 272, -1}}, "a b "},
        {"first", "false", {{270, 265, 261, -1}, {2, 260, 265, 261, -1}, {271, 2, 271, -1}, {271, 265, 272, -1}}, "a b "},
        {"always", "true", {{270, 265, 261, -1}, {2, 270, 265, 261, -1}, {271, 2, 271, -1}, {271, 265, 272, -1}}, "a b "},
        {"always", "false", {{270, 265, 261, -1}, {2, 270, 265, 261, -1}, {271, 2, 271, -1}, {271, 265, 272, -1}}, "a b "},
        {"never", "true", {{270, 265, 261, -1}, {2, 260, 265, 261, -1}, {273, 2, 271, -1}, {273, 265, 272, -1}}, " a b "},
        {"never", "false", {{270, 265, 261, -1}, {2, 260, 265, 261, -1}, {273, 2, 271, -1}, {273, 265, 272, -1}}, " a b "},
    };
    static const char *const texts[4] = {" a b", "<bos>a b", "ab<bos> ab", "ab cd"};
    for (size_t c = 0; c < ZY_ARRAY_LEN(cases); c++) {
        char ms[200];
        snprintf(ms, sizeof ms, "{\"type\": \"Metaspace\", \"replacement\": \"\u2581\", \"prepend_scheme\": \"%s\", \"split\": %s}",
                 cases[c].scheme, cases[c].split);
        Mini m = {NULL, ms, NULL, ms, MINI_SPECIALS, NULL, 0, {NULL}, MINI_MERGES};
        Tokenizer *t = mini(&m);
        REQUIRE(t);
        for (int k = 0; k < 4; k++)
            CHECK_MSG(ids_are(t, texts[k], strlen(texts[k]), 0, cases[c].want[k]), "%s %s", cases[c].scheme, cases[c].split);
        CHECK(decodes_to(t, IDS(265, 260, 265, 261, 265), 0, cases[c].dec));
        CHECK(decodes_to(t, IDS(2, 265, 260), 0, "<bos> a"));
        tokenizer_free(t);
    }
}

/* Added tokens: lstrip / rstrip take the white space around them, single_word needs non-word characters (or
 * the text's ends) around it, a normalized token matches its normalized form (and decodes from it), specials
 * go with skip_special. Ids: <l> 274, <r> 275, [w] 276, "a b" 277, <s> 278. */
TEST(tok_added_token_flags) {
    Mini m = {GEMMA_NORMALIZER, GEMMA_PRE, NULL, GEMMA_DECODER,
              MINI_SPECIALS ", {\"id\": 274, \"content\": \"<l>\", \"lstrip\": true, \"special\": true, \"normalized\": false}, "
              "{\"id\": 275, \"content\": \"<r>\", \"rstrip\": true, \"special\": false, \"normalized\": false}, "
              "{\"id\": 276, \"content\": \"[w]\", \"single_word\": true, \"special\": false, \"normalized\": false}, "
              "{\"id\": 277, \"content\": \"a b\", \"special\": false, \"normalized\": true}, "
              "{\"id\": 278, \"content\": \"<s>\", \"special\": true, \"normalized\": false, \"lstrip\": true, \"rstrip\": true}",
              NULL, 0, {NULL}, MINI_MERGES};
    Tokenizer *t = mini(&m);
    REQUIRE(t);
    static const struct {
        const char *text;
        int want[8];
    } cases[] = {
        {"x  <l>y", {267, 274, 268, -1}},   {"x<r>   y", {267, 275, 268, -1}},   {"a[w]b", {260, 95, 123, 97, 261, -1}},
        {" [w] ", {265, 276, 265, -1}},     {"[w]", {276, -1}},                 {"ca bd", {262, 277, 263, -1}},
        {"a b", {277, -1}},                 {"x <s>  y", {267, 278, 268, -1}},  {"<l><l>", {274, 274, -1}},
        {"<r>  <l>", {275, 274, -1}},       {"\u00e9[w]", {269, 95, 123, 97, -1}}, {"_[w]", {99, 95, 123, 97, -1}},
    };
    for (size_t c = 0; c < ZY_ARRAY_LEN(cases); c++) CHECK(ids_are(t, cases[c].text, strlen(cases[c].text), 1, cases[c].want));
    CHECK(decodes_to(t, IDS(267, 278, 262, 277, 263, 274), 0, "x<s>ca bd<l>"));
    CHECK(decodes_to(t, IDS(267, 278, 262, 277, 263, 274), TOK_DECODE_SKIP_SPECIAL, "xca bd"));
    tokenizer_free(t);
}

/* Decoders: Strip and a Regex Replace after Fuse; no decoder joins tokens with spaces; Replace(Regex) and
 * Prepend normalizers (an empty match inserts the content everywhere, as Oniguruma's find_iter gives it). */
TEST(tok_decoders_and_normalizers) {
    Mini m = {NULL, NULL, NULL,
              "{\"type\": \"Sequence\", \"decoders\": [{\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"}, {\"type\": \"Strip\", "
              "\"content\": \"x\", \"start\": 2, \"stop\": 1}, {\"type\": \"Replace\", \"pattern\": {\"Regex\": \"a+\"}, \"content\": \"A\"}]}",
              NULL, NULL, 0, {NULL}, MINI_MERGES};
    Tokenizer *t = mini(&m);
    REQUIRE(t);
    CHECK(decodes_to(t, IDS(267, 267, 267, 260, 267), 0, "xA"));
    CHECK(decodes_to(t, IDS(267, 260, 260, 261, 267, 267), 0, "Abx"));
    CHECK(decodes_to(t, IDS(260, 199, 173, 267), 0, "A\u00e9"));
    tokenizer_free(t);
    Mini n = {NULL, NULL, NULL, NULL, NULL, NULL, 0, {NULL}, MINI_MERGES};
    t = mini(&n);
    REQUIRE(t);
    CHECK(decodes_to(t, IDS(260, 261, 270, 4), 0, "a b \u2581a <0x00>"));
    tokenizer_free(t);
    Mini g = {"{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Replace\", \"pattern\": {\"Regex\": \"q*\"}, \"content\": \"-\"}, "
              "{\"type\": \"Prepend\", \"prepend\": \"\u2581\"}]}",
              NULL, NULL, NULL, NULL, NULL, 0, {NULL}, MINI_MERGES};
    t = mini(&g);
    REQUIRE(t);
    CHECK(ids_are(t, "ab", 2, 1, IDS(265, 264, 260, 264, 261, 264)));
    CHECK(ids_are(t, "qqa", 3, 1, IDS(265, 264, 260, 264)));
    CHECK(ids_are(t, "a b", 3, 1, IDS(265, 264, 260, 264, 266, 264, 261, 264)));
    int32_t *ids;
    size_t k;
    ZyErr err;
    CHECK(tokenizer_encode_ex(t, NULL, "", 0, TOK_ENCODE_ADD_SPECIAL, &ids, &k, &err) == 0 && k == 0 && !ids);
    tokenizer_free(t);
}

/* Unicode normalizers (utf8proc's data, HF's algorithms and Unicode versions). Ids from tokenizers 0.23 on this
 * vocabulary (a character outside it falls back to its bytes, id = byte + 4): composition and decomposition,
 * canonical reordering, Hangul (an LV syllable does not take U+11A7), characters newer than HF's Unicode 9.0
 * tables left alone (U+0898, U+1E030, U+11935 U+11930), Rust's lower case (U+0130 -> i U+0307, Garay U+10D50
 * from Unicode 16), StripAccents with HF's marks (U+1CF2 was one in 9.0), Strip. Metaspace(first) asks
 * whether the piece starts at the original's offset 0, which a stripped start or a dropped mark moves. */
TEST(tok_unicode_normalizers) {
#define NF(t) "{\"type\": \"" t "\"}"
#define STRIP(l, r) "{\"type\": \"Strip\", \"strip_left\": " l ", \"strip_right\": " r "}"
    static const struct {
        const char *norm, *text;
        int want[12];
    } cases[] = {
        {NF("NFC"), "e\u0301", {269, -1}},
        {NF("NFD"), "\u00e9", {105, 208, 133, -1}},
        {NF("NFKC"), "\ufb01", {106, 109, -1}},
        {NF("NFKD"), "\u00bd", {53, 230, 133, 136, 54, -1}},
        {NF("NFC"), "q\u0307\u0323", {117, 208, 167, 208, 139, -1}},
        {NF("NFC"), "\u1100\u1161\u11a8", {238, 180, 133, -1}},
        {NF("NFC"), "\uac00\u11a7", {238, 180, 132, 229, 138, 171, -1}},
        {NF("NFD"), "a\u0301\u0898\u0334", {260, 208, 133, 228, 166, 156, 208, 184, -1}},
        {NF("NFKC"), "\U0001e030", {244, 162, 132, 180, -1}},
        {NF("NFC"), "\U00011935\U00011930", {244, 149, 168, 185, 244, 149, 168, 180, -1}},
        {NF("Lowercase"), "\u0130STANBUL", {109, 208, 139, 119, 120, 260, 114, 261, 121, 112, -1}},
        {NF("Lowercase"), "\U00010d50", {244, 148, 185, 180, -1}},
        {NF("Lowercase"), "\u03a3\u0391\u03a3", {211, 135, 210, 181, 211, 135, -1}},
        {NF("StripAccents"), "e\u0301a\u0898", {105, 260, 228, 166, 156, -1}},
        {NF("StripAccents"), "\u1cf2", {-1}},
        {STRIP("true", "true"), "  a b \u3000", {260, 266, 261, -1}},
        {STRIP("true", "false"), " a ", {260, 266, -1}},
        {NF("NFC"), "", {-1}},
    };
    for (size_t c = 0; c < ZY_ARRAY_LEN(cases); c++) {
        Mini m = {cases[c].norm, NULL, NULL, NULL, MINI_SPECIALS, NULL, 0, {NULL}, MINI_MERGES};
        Tokenizer *t = mini(&m);
        REQUIRE(t);
        CHECK_MSG(ids_are(t, cases[c].text, strlen(cases[c].text), 0, cases[c].want), "case %zu (%s)", c, cases[c].norm);
        tokenizer_free(t);
    }
    static const struct {
        const char *norm, *text;
        int want[6];
    } first[] = {
        {STRIP("true", "true"), " ab", {273, -1}}, /* "ab": the stripped start is not offset 0 */
        {STRIP("true", "true"), "ab", {271, -1}},  /* "▁ab" */
        {NF("StripAccents"), "\u0301ab", {273, -1}},
        {NF("NFD"), "\u0301ab", {265, 208, 133, 273, -1}},
        {"{\"type\": \"Sequence\", \"normalizers\": [" NF("NFKD") ", {\"type\": \"Replace\", \"pattern\": {\"String\": \"\u2002\"}, "
         "\"content\": \" \"}]}", "\u2002ab", {271, -1}},
    };
    for (size_t c = 0; c < ZY_ARRAY_LEN(first); c++) {
        Mini m = {first[c].norm, "{\"type\": \"Metaspace\", \"replacement\": \"\u2581\", \"prepend_scheme\": \"first\", \"split\": true}",
                  NULL, NULL, MINI_SPECIALS, NULL, 0, {NULL}, MINI_MERGES};
        Tokenizer *t = mini(&m);
        REQUIRE(t);
        CHECK_MSG(ids_are(t, first[c].text, strlen(first[c].text), 0, first[c].want), "Metaspace first, case %zu", c);
        tokenizer_free(t);
    }
    /* a normalized=true added token is matched on its normalized form: "ﬁx" is "fix" under NFKC */
    Mini a = {NF("NFKC"), NULL, NULL, NULL,
              MINI_SPECIALS ", {\"id\": 274, \"content\": \"\ufb01x\", \"special\": false, \"normalized\": true}", NULL, 0,
              {NULL}, MINI_MERGES};
    Tokenizer *t = mini(&a);
    REQUIRE(t);
    CHECK(ids_are(t, "afix", 4, 0, IDS(260, 274)));
    CHECK(ids_are(t, "\ufb01x", 4, 0, IDS(274)));
    CHECK(decodes_to(t, IDS(274), 0, "fix"));
    tokenizer_free(t);
#undef NF
#undef STRIP
}

/* BOS / EOS by name, as transformers finds them: tokenizer_config.json's bos_token / eos_token (string or
 * {"content"}), else the template's special token before / after $A, else a special added token with a usual name
 * (<bos> <eos> <s> </s> ...), else zaya's <|bos|> / <|eos|>; an unknown configured name or nothing is an error. */
TEST(tok_special_ids_by_name) {
    int32_t bos, eos;
    ZyErr err;
    Mini m = {NULL, NULL, BOS_TEMPLATE, NULL, MINI_SPECIALS, NULL, 0, {NULL}, MINI_MERGES};
    Tokenizer *t = mini(&m);
    REQUIRE(t);
    CHECK(tokenizer_special_id(t, TOK_SPECIAL_BOS, &bos, &err) == 0 && bos == 2); /* the template's <bos> */
    CHECK(tokenizer_special_id(t, TOK_SPECIAL_EOS, &eos, &err) == 0 && eos == 1); /* the special token <eos> */
    static const char cfg[] = "{\"bos_token\": {\"content\": \"<unk>\", \"special\": true}, \"eos_token\": \"<pad>\"}";
    REQUIRE(tokenizer_apply_config_json(t, cfg, strlen(cfg), "tokenizer_config.json", &err) == 0);
    CHECK(tokenizer_special_id(t, TOK_SPECIAL_BOS, &bos, &err) == 0 && bos == 3);
    CHECK(tokenizer_special_id(t, TOK_SPECIAL_EOS, &eos, &err) == 0 && eos == 0);
    static const char bad[] = "{\"eos_token\": \"<nope>\"}";
    REQUIRE(tokenizer_apply_config_json(t, bad, strlen(bad), "tokenizer_config.json", &err) == 0);
    CHECK(tokenizer_special_id(t, TOK_SPECIAL_EOS, &eos, &err) != 0 && eos == -1 &&
          strstr(err.msg, "tokenizer_config.json: eos_token \"<nope>\" is not in the vocabulary"));
    CHECK(tokenizer_special_id(t, TOK_SPECIAL_BOS, &bos, &err) == 0 && bos == 2); /* no bos_token now: the template */
    static const char worse[] = "{\"bos_token\": 7}";
    CHECK(tokenizer_apply_config_json(t, worse, strlen(worse), "cfg.json", &err) != 0 &&
          strstr(err.msg, "cfg.json: bos_token: expected a string or an object"));
    tokenizer_free(t);
    /* a template with specials on both sides wins over the usual names */
    Mini w = {NULL, NULL,
              "{\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<unk>\", \"type_id\": 0}}, "
              "{\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}, {\"SpecialToken\": {\"id\": \"<pad>\", \"type_id\": 0}}], "
              "\"special_tokens\": {\"<unk>\": {\"id\": \"<unk>\", \"ids\": [3], \"tokens\": [\"<unk>\"]}, "
              "\"<pad>\": {\"id\": \"<pad>\", \"ids\": [0], \"tokens\": [\"<pad>\"]}}}",
              NULL, MINI_SPECIALS, NULL, 0, {NULL}, MINI_MERGES};
    t = mini(&w);
    REQUIRE(t);
    CHECK(tokenizer_special_id(t, TOK_SPECIAL_BOS, &bos, &err) == 0 && bos == 3);
    CHECK(tokenizer_special_id(t, TOK_SPECIAL_EOS, &eos, &err) == 0 && eos == 0);
    tokenizer_free(t);
    /* "<bos>" only in model.vocab, not a special added token: not taken */
    Mini n = {NULL, NULL, NULL, NULL, NULL, NULL, 0, {NULL}, MINI_MERGES};
    t = mini(&n);
    REQUIRE(t);
    CHECK(tokenizer_special_id(t, TOK_SPECIAL_BOS, &bos, &err) != 0 && bos == -1 &&
          strstr(err.msg, "no beginning-of-sequence token: no bos_token in tokenizer_config.json"));
    CHECK(tokenizer_special_id(t, TOK_SPECIAL_EOS, &eos, &err) != 0 && strstr(err.msg, "no end-of-sequence token"));
    tokenizer_free(t);
    /* zaya's own: <|bos|> / <|eos|> */
    t = small_tokenizer(20000, 300, 8);
    REQUIRE(t);
    CHECK(tokenizer_special_id(t, TOK_SPECIAL_BOS, &bos, &err) == 0 && bos == TOK_BOS_ID);
    CHECK(tokenizer_special_id(t, TOK_SPECIAL_EOS, &eos, &err) == 0 && eos == TOK_EOS_ID);
    tokenizer_free(t);
}

/* Post-processors: a template with several specials and $A twice; Sequence[ByteLevel, Template];
 * tokenizer_config.json's add_bos_token / add_eos_token replace the template. */
TEST(tok_templates_and_config) {
    Mini m = {NULL, NULL,
              "{\"type\": \"Sequence\", \"processors\": [{\"type\": \"ByteLevel\", \"trim_offsets\": false}, "
              "{\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"[X]\", \"type_id\": 0}}, "
              "{\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}, {\"SpecialToken\": {\"id\": \"<eos>\", \"type_id\": 0}}, "
              "{\"Sequence\": {\"id\": \"A\", \"type_id\": 1}}], \"special_tokens\": {\"[X]\": {\"id\": \"[X]\", \"ids\": [2, 0], "
              "\"tokens\": [\"<bos>\", \"<pad>\"]}, \"<eos>\": {\"id\": \"<eos>\", \"ids\": [1], \"tokens\": [\"<eos>\"]}}}]}",
              NULL, MINI_SPECIALS, NULL, 0, {NULL}, MINI_MERGES};
    Tokenizer *t = mini(&m);
    REQUIRE(t);
    CHECK(ids_are(t, "ab", 2, 1, IDS(2, 0, 273, 1, 273)));
    CHECK(ids_are(t, "ab", 2, 0, IDS(273, 273))); /* HF still repeats $A without the specials */
    ZyErr err;
    static const char *cfg1 = "{\"add_bos_token\": false, \"add_eos_token\": true, \"bos_token\": \"<bos>\", "
                              "\"eos_token\": {\"__type\": \"AddedToken\", \"content\": \"<eos>\"}}";
    REQUIRE(tokenizer_apply_config_json(t, cfg1, strlen(cfg1), "cfg.json", &err) == 0);
    CHECK(ids_are(t, "ab", 2, 1, IDS(273, 1)));
    static const char *cfg2 = "{\"add_bos_token\": true, \"bos_token\": \"<bos>\"}";
    REQUIRE(tokenizer_apply_config_json(t, cfg2, strlen(cfg2), "cfg.json", &err) == 0);
    CHECK(ids_are(t, "ab", 2, 1, IDS(2, 273)));
    static const char *cfg3 = "{\"model_max_length\": 8}"; /* neither key: the template stays */
    REQUIRE(tokenizer_apply_config_json(t, cfg3, strlen(cfg3), "cfg.json", &err) == 0);
    CHECK(ids_are(t, "ab", 2, 1, IDS(2, 273)));
    static const struct {
        const char *json, *msg;
    } bad[] = {
        {"{\"add_bos_token\": 1}", "cfg.json: add_bos_token: expected a boolean"},
        {"{\"add_eos_token\": true}", "cfg.json: add_eos_token: true, but there is no eos_token"},
        {"{\"add_bos_token\": true, \"bos_token\": \"<nope>\"}", "cfg.json: bos_token: \"<nope>\" is not in the vocabulary"},
        {"{\"add_bos_token\": true, \"bos_token\": 5}", "cfg.json: bos_token: expected a string"},
        {"[]", "cfg.json: expected a JSON object"},
        {"{\"a\": 1", "cfg.json: invalid JSON"},
    };
    for (size_t c = 0; c < ZY_ARRAY_LEN(bad); c++) {
        err.msg[0] = '\0';
        CHECK_MSG(tokenizer_apply_config_json(t, bad[c].json, strlen(bad[c].json), "cfg.json", &err) != 0 &&
                      strstr(err.msg, bad[c].msg), "%s: \"%s\"", bad[c].json, err.msg);
    }
    CHECK(ids_are(t, "ab", 2, 1, IDS(2, 273))); /* a refused config changes nothing */
    tokenizer_free(t);
}

/* The plain definition of BPE on a whole piece: what cutting long pieces into parts must reproduce. */
static size_t reference_merge(const Tokenizer *t, int32_t *sym, size_t m) {
    for (;;) {
        int best_rank = -1;
        size_t best = 0;
        for (size_t k = 0; k + 1 < m; k++)
            for (int r = 0; r < tokenizer_n_merges(t); r++) {
                int a, b;
                tokenizer_merge(t, r, &a, &b);
                if (a == sym[k] && b == sym[k + 1] && (best_rank < 0 || r < best_rank)) {
                    best_rank = r;
                    best = k;
                }
            }
        if (best_rank < 0) return m;
        int a, b;
        tokenizer_merge(t, best_rank, &a, &b);
        char merged[256];
        snprintf(merged, sizeof merged, "%s%s", tokenizer_token_text(t, a), tokenizer_token_text(t, b));
        sym[best] = tokenizer_token_id(t, merged);
        memmove(sym + best + 1, sym + best + 2, (m - best - 2) * sizeof *sym);
        m--;
    }
}

/* Gemma's pre-tokenizer leaves a whole text in one piece; zaya cuts it where no merge can join the sides. With
 * random merges (many across "▁"), the ids must equal plain BPE on the whole piece. */
TEST(tok_long_pieces_match_whole_bpe) {
    ZyRng rng;
    zy_rng_seed(&rng, 21);
    static const char *const alpha[4] = {"a", "b", "c", "\u2581"};
    const char *tokens[64];
    char store[64][40];
    int n = 0;
    for (int i = 0; i < 4; i++) tokens[n++] = alpha[i];
    Str merges = {0}, vocab = {0};
    int n_merges = 0;
    while (n < 40) {
        const char *a = tokens[zy_rng_next(&rng) % (uint64_t)n], *b = tokens[zy_rng_next(&rng) % (uint64_t)n];
        if (strlen(a) + strlen(b) > 12) continue;
        char cat[40];
        snprintf(cat, sizeof cat, "%s%s", a, b);
        int dup = 0;
        for (int k = 0; k < n; k++) dup |= strcmp(tokens[k], cat) == 0;
        if (dup) continue;
        snprintf(store[n], sizeof store[n], "%s", cat);
        tokens[n] = store[n];
        n++;
        str_add(&merges, "%s[", n_merges++ ? ", " : "");
        str_json(&merges, a);
        str_add(&merges, ", ");
        str_json(&merges, b);
        str_add(&merges, "]");
    }
    for (int i = 0; i < n; i++) {
        str_add(&vocab, i ? ", " : "");
        str_json(&vocab, tokens[i]);
        str_add(&vocab, ": %d", i);
    }
    Str js = {0};
    str_add(&js, "{\"normalizer\": %s, \"pre_tokenizer\": %s, \"model\": {\"type\": \"BPE\", \"vocab\": {%s}, \"merges\": [%s]}}",
            GEMMA_NORMALIZER, GEMMA_PRE, vocab.p, merges.p);
    Tokenizer *t = NULL;
    ZyErr err;
    REQUIRE(tokenizer_load_json(js.p, js.n, "random.json", &t, &err) == 0);
    int bad = 0;
    for (int it = 0; it < 60 && bad < 3; it++) {
        size_t len = 20 + zy_rng_next(&rng) % 600;
        char *text = malloc(len + 1);
        for (size_t i = 0; i < len; i++) text[i] = " abc"[zy_rng_next(&rng) % 4];
        text[len] = '\0';
        int32_t *ids, *sym = malloc(len * sizeof *sym);
        size_t k;
        REQUIRE(tokenizer_encode(t, text, len, &ids, &k, &err) == 0);
        for (size_t i = 0; i < len; i++) sym[i] = text[i] == ' ' ? 3 : text[i] - 'a';
        size_t m = reference_merge(t, sym, len);
        if (m != k || memcmp(sym, ids, k * sizeof *ids) != 0) bad++;
        free(ids);
        free(sym);
        free(text);
    }
    CHECK(bad == 0);
    tokenizer_free(t);
    free(js.p);
    free(vocab.p);
    free(merges.p);
}

/* A loaded pipeline is written back as it was, loads again, and encodes the same; a model folder works as the
 * path, with its tokenizer_config.json. */
TEST(tok_pipeline_roundtrip_and_folder) {
    Mini m = {GEMMA_NORMALIZER, GEMMA_PRE, BOS_TEMPLATE, GEMMA_DECODER,
              MINI_SPECIALS ", {\"id\": 274, \"content\": \"<l>\", \"single_word\": false, \"lstrip\": true, \"rstrip\": false, "
              "\"normalized\": false, \"special\": true}",
              NULL, 0, {NULL}, MINI_MERGES};
    Tokenizer *a = mini(&m);
    REQUIRE(a);
    char *ja = to_json(a);
    REQUIRE(ja);
    Tokenizer *b = NULL;
    ZyErr err;
    REQUIRE(tokenizer_load_json(ja, strlen(ja), "again.json", &b, &err) == 0);
    char *jb = to_json(b);
    CHECK(jb && strcmp(ja, jb) == 0);
    CHECK(strstr(ja, "\"byte_fallback\": true") && strstr(ja, "\"lstrip\": true") && strstr(ja, "\"type\": \"Split\""));
    CHECK(same_ids(a, b, "ab cd  x <l> y \u00e9\u20ac"));
    char dir[64];
    REQUIRE(zy_test_tmpdir(dir, sizeof dir, "tokdir") == 0);
    char *tp = path_in(dir, "tokenizer.json");
    REQUIRE(tokenizer_save(a, tp, &err) == 0);
    char *cp = write_tmp(dir, "tokenizer_config.json", "{\"add_bos_token\": false, \"add_eos_token\": true, \"eos_token\": \"<eos>\"}", 69);
    Tokenizer *c = NULL, *d = NULL;
    REQUIRE(tokenizer_load(dir, &c, &err) == 0);
    REQUIRE(tokenizer_load(tp, &d, &err) == 0);
    CHECK(ids_are(c, "ab", 2, 1, IDS(273, 1)) && ids_are(d, "ab", 2, 1, IDS(273, 1)));
    tokenizer_free(c);
    free(write_tmp(dir, "tokenizer_config.json", "{\"add_eos_token\": 3}", 20));
    CHECK(tokenizer_load(dir, &c, &err) != 0 && c == NULL && strstr(err.msg, "tokenizer_config.json: add_eos_token: expected a boolean"));
    tokenizer_free(d);
    zy_test_rmtree(dir);
    free(tp);
    free(cp);
    free(ja);
    free(jb);
    tokenizer_free(a);
    tokenizer_free(b);
}

/* New components refuse bad fields with the field's path. */
TEST(tok_pipeline_refusals_name_the_field) {
    static const struct {
        const char *normalizer, *pre, *post, *decoder, *msg;
    } cases[] = {
        {"{\"type\": \"BertNormalizer\"}", NULL, NULL, NULL, "normalizer: type \"BertNormalizer\" is not supported"},
        {"{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFC\"}, {\"type\": \"Precompiled\"}]}", NULL, NULL, NULL,
         "normalizer.normalizers[1]: type \"Precompiled\" is not supported"},
        {"{\"type\": \"Strip\", \"strip_left\": 1, \"strip_right\": true}", NULL, NULL, NULL,
         "normalizer.strip_left: missing or not a boolean"},
        {"{\"type\": \"Sequence\", \"normalizers\": {}}", NULL, NULL, NULL, "normalizer.normalizers: expected an array"},
        {"{\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}}", NULL, NULL, NULL, "normalizer.content: missing"},
        {"{\"type\": \"Replace\", \"pattern\": \" \", \"content\": \"x\"}", NULL, NULL, NULL, "normalizer.pattern: expected {\"String\""},
        {"{\"type\": \"Replace\", \"pattern\": {\"Regex\": \"(\"}, \"content\": \"x\"}", NULL, NULL, NULL,
         "normalizer.pattern.Regex: invalid regex at offset 1"},
        {"{\"type\": \"Replace\", \"pattern\": {\"Glob\": \"*\"}, \"content\": \"x\"}", NULL, NULL, NULL, "\"Glob\" is not String or Regex"},
        {"{\"type\": \"Prepend\"}", NULL, NULL, NULL, "normalizer.prepend: missing"},
        {"{\"kind\": \"Prepend\"}", NULL, NULL, NULL, "normalizer.type: missing"},
        {NULL, "{\"type\": \"Split\", \"pattern\": {\"String\": \" \"}, \"behavior\": \"Merged\", \"invert\": false}", NULL, NULL,
         "pre_tokenizer.behavior: \"Merged\" is not one of"},
        {NULL, "{\"type\": \"Split\", \"pattern\": {\"String\": \" \"}, \"behavior\": \"Removed\"}", NULL, NULL,
         "pre_tokenizer.invert: missing"},
        {NULL, "{\"type\": \"Metaspace\", \"replacement\": \"ab\"}", NULL, NULL, "pre_tokenizer.replacement: must be exactly one character"},
        {NULL, "{\"type\": \"Metaspace\", \"replacement\": \"_\", \"prepend_scheme\": \"sometimes\"}", NULL, NULL,
         "pre_tokenizer.prepend_scheme: must be"},
        {NULL, "{\"type\": \"Metaspace\", \"replacement\": \"_\", \"add_prefix_space\": false}", NULL, NULL,
         "pre_tokenizer.add_prefix_space: false does not match prepend_scheme"},
        {NULL, "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"ByteLevel\", \"add_prefix_space\": false}, "
               "{\"type\": \"Metaspace\", \"replacement\": \"_\"}]}", NULL, NULL, "ByteLevel must be the last pre-tokenizer"},
        {NULL, "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Digits\"}]}", NULL, NULL,
         "pre_tokenizer.pretokenizers[0]: type \"Digits\" is not supported"},
        {NULL, NULL, "{\"type\": \"RobertaProcessing\"}", NULL, "post_processor: type \"RobertaProcessing\" is not supported"},
        {NULL, NULL, "{\"type\": \"TemplateProcessing\", \"single\": [], \"special_tokens\": []}", NULL,
         "post_processor.special_tokens: missing or not an object"},
        {NULL, NULL, "{\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<x>\", \"type_id\": 0}}], "
                     "\"special_tokens\": {}}", NULL, "post_processor.single[0]: special token \"<x>\" is missing"},
        {NULL, NULL, "{\"type\": \"TemplateProcessing\", \"single\": [{\"Sequence\": {\"id\": \"B\", \"type_id\": 0}}], "
                     "\"special_tokens\": {}}", NULL, "the single template cannot use sequence B"},
        {NULL, NULL, "{\"type\": \"TemplateProcessing\", \"single\": [{\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}], "
                     "\"pair\": [{\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}], \"special_tokens\": {}}", NULL,
         "post_processor.pair: must use both sequences A and B"},
        {NULL, NULL, "{\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<x>\", \"type_id\": 0}}], "
                     "\"special_tokens\": {\"<x>\": {\"id\": \"<x>\", \"ids\": [999], \"tokens\": [\"<x>\"]}}}", NULL,
         "post_processor: special token id 999 is not in the vocabulary"},
        {NULL, NULL, "{\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<x>\", \"type_id\": 0}}], "
                     "\"special_tokens\": {\"<x>\": {\"id\": \"<x>\", \"ids\": [1, 2], \"tokens\": [\"<x>\"]}}}", NULL,
         "ids and tokens must be arrays of the same length"},
        {NULL, NULL, NULL, "{\"type\": \"WordPiece\"}", "decoder: type \"WordPiece\" is not supported"},
        {NULL, NULL, NULL, "{\"type\": \"Strip\", \"content\": \" \", \"start\": -1, \"stop\": 0}", "decoder.start: missing or not a non-negative"},
        {NULL, NULL, NULL, "{\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Fuse\"}, {\"type\": \"Replace\", \"content\": \"x\"}]}",
         "decoder.decoders[1].pattern: expected"},
    };
    ZyErr err;
    for (size_t c = 0; c < ZY_ARRAY_LEN(cases); c++) {
        Mini m = {cases[c].normalizer, cases[c].pre, cases[c].post, cases[c].decoder, MINI_SPECIALS, NULL, 0, {NULL}, MINI_MERGES};
        char *j = mini_json(&m);
        Tokenizer *u = NULL;
        err.msg[0] = '\0';
        int rc = tokenizer_load_json(j, strlen(j), "cfg/tok.json", &u, &err);
        CHECK_MSG(rc != 0 && u == NULL && strncmp(err.msg, "cfg/tok.json: ", 14) == 0 && strstr(err.msg, cases[c].msg),
                  "case %zu: rc %d, message \"%s\", expected \"%s\"", c, rc, err.msg, cases[c].msg);
        tokenizer_free(u);
        free(j);
    }
    /* added tokens: HF numbers new ones after model.vocab, and takes a repeated content's first id */
    static const struct {
        const char *added, *msg;
    } added[] = {
        {"{\"id\": 280, \"content\": \"<new>\"}", "added_tokens[0].id: 280, but tokenizers numbers the new token \"<new>\" 274"},
        {"{\"id\": 274, \"content\": \"<new>\"}, {\"id\": 274, \"content\": \"<new2>\"}", "added_tokens[1]: id 274 of \"<new2>\" is already \"<new>\""},
        {"{\"id\": 274, \"content\": \"<new>\"}, {\"id\": 275, \"content\": \"<new>\"}", "\"<new>\" has id 275 but an earlier entry gives it 274"},
        {"{\"id\": 266, \"content\": \" \", \"normalized\": true}", NULL},
        {"{\"id\": 274, \"content\": \"x\", \"lstrip\": 1}", "added_tokens[0].lstrip: not a boolean"},
    };
    for (size_t c = 0; c < ZY_ARRAY_LEN(added); c++) {
        Mini m = {NULL, NULL, NULL, NULL, added[c].added, NULL, 0, {NULL}, MINI_MERGES};
        char *j = mini_json(&m);
        Tokenizer *u = NULL;
        err.msg[0] = '\0';
        int rc = tokenizer_load_json(j, strlen(j), "cfg/tok.json", &u, &err);
        if (added[c].msg)
            CHECK_MSG(rc != 0 && strstr(err.msg, added[c].msg), "added case %zu: \"%s\"", c, err.msg);
        else
            CHECK_MSG(rc == 0 && u && tokenizer_token_id(u, " ") == 266, "added case %zu: \"%s\"", c, err.msg); /* in model.vocab */
        tokenizer_free(u);
        free(j);
    }
    Tokenizer *u = NULL;
    CHECK(tokenizer_load_json("{\"model\": \"\xff\"}", 14, "bad.json", &u, &err) != 0 && strstr(err.msg, "bad.json: invalid UTF-8 at byte 11"));
    Str deep = {0}; /* Sequences in Sequences */
    str_add(&deep, "{\"pre_tokenizer\": ");
    for (int i = 0; i < 12; i++) str_add(&deep, "{\"type\": \"Sequence\", \"pretokenizers\": [");
    for (int i = 0; i < 12; i++) str_add(&deep, "]}");
    str_add(&deep, ", \"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}");
    CHECK(tokenizer_load_json(deep.p, deep.n, "deep.json", &u, &err) != 0 && strstr(err.msg, "nested more than 8 deep"));
    free(deep.p);
}

/* An added token right after a model vocabulary that fills the id table exactly (512 ids) once read past it. */
TEST(tok_added_token_after_a_full_id_table) {
    Str js = {0};
    str_add(&js, "{\"added_tokens\": [{\"id\": 512, \"content\": \"<new>\", \"special\": true}], \"model\": {\"type\": \"BPE\", \"vocab\": {");
    for (int i = 0; i < 512; i++) str_add(&js, "%s\"t%d\": %d", i ? ", " : "", i, i);
    str_add(&js, "}, \"merges\": []}}");
    Tokenizer *t = NULL;
    ZyErr err;
    REQUIRE(tokenizer_load_json(js.p, js.n, "full.json", &t, &err) == 0);
    CHECK(tokenizer_vocab_size(t) == 513 && tokenizer_token_id(t, "<new>") == 512);
    CHECK(ids_are(t, "t1<new>", 7, 1, IDS(512))); /* "t" and "1" are no tokens (and no unk): only <new> stays */
    CHECK(ids_are(t, "<new>", 5, 1, IDS(512)));
    CHECK(decodes_to(t, IDS(512, 7), 0, "<new> t7"));
    tokenizer_free(t);
    free(js.p);
}
