/* Token shards: write/read round trips across shard boundaries (u16 and u32), I/O page accounting, every
 * corruption class rejected with its message, a deterministic mutation fuzz loop over real shard dirs; and
 * data_prepare (documents, malformed lines, strict, force, val split) with a byte-level stand-in tokenizer. */
#define _POSIX_C_SOURCE 200809L
#include <cjson/cJSON.h>
#include <dirent.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/data_prepare.h"
#include "io/shards.h"
#include "test.h"

static int write_bytes(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = fwrite(data, 1, len, f);
    return (fclose(f) == 0 && w == len) ? 0 : -1;
}

typedef struct {
    int32_t *tok[SHARD_NUM_SPLITS];
    size_t n[SHARD_NUM_SPLITS];
    uint64_t docs[SHARD_NUM_SPLITS];
} Corpus;

/* Writes random documents (1..max_doc tokens) until each split holds at least want[split] tokens. */
static int build_dir(const char *dir, int vocab, uint64_t max_shard, const size_t want[2], int max_doc, uint64_t seed,
                     Corpus *c, ZyErr *err) {
    memset(c, 0, sizeof *c);
    ShardWriterOptions o = {vocab, 0, max_shard, "tok.json", 0xdeadbeefu};
    ShardWriter *w;
    if (shardwriter_open(&w, dir, &o, err)) return -1;
    ZyRng r;
    zy_rng_seed(&r, seed);
    for (int s = 0; s < SHARD_NUM_SPLITS; s++) {
        c->tok[s] = malloc((want[s] + (size_t)max_doc + 1) * sizeof(int32_t));
        while (c->n[s] < want[s]) {
            size_t len = 1 + zy_rng_next(&r) % (uint64_t)max_doc;
            int32_t *d = c->tok[s] + c->n[s];
            for (size_t i = 0; i < len; i++) d[i] = (int32_t)(zy_rng_next(&r) % (uint64_t)vocab);
            if (len > 1 && zy_rng_next(&r) % 2) { /* exercise append + end_document */
                if (shardwriter_append(w, (ShardSplit)s, d, len / 2, err) ||
                    shardwriter_append(w, (ShardSplit)s, d + len / 2, len - len / 2, err) ||
                    shardwriter_end_document(w, (ShardSplit)s, err))
                    goto fail;
            } else if (shardwriter_add_document(w, (ShardSplit)s, d, len, err)) {
                goto fail;
            }
            c->n[s] += len;
            c->docs[s]++;
        }
    }
    if (shardwriter_finish(w, err)) goto fail;
    shardwriter_close(w);
    return 0;
fail:
    shardwriter_close(w);
    return -1;
}

static void corpus_free(Corpus *c) {
    for (int s = 0; s < SHARD_NUM_SPLITS; s++) free(c->tok[s]);
}

static void check_roundtrip(int vocab, int *zy_test_failed_) {
    char dir[64];
    REQUIRE(zy_test_tmpdir(dir, sizeof dir, "shards") == 0);
    Corpus c;
    ZyErr err = {{0}};
    const size_t want[2] = {1234, 321};
    REQUIRE(build_dir(dir, vocab, 100, want, 37, 7, &c, &err) == 0);
    for (int s = 0; s < SHARD_NUM_SPLITS; s++) {
        ShardSet *set;
        int rc = shardset_open(&set, dir, shard_split_name((ShardSplit)s), 1, &err);
        CHECK_MSG(rc == 0, "%s", err.msg);
        if (rc) continue;
        CHECK(shardset_num_tokens(set) == c.n[s]);
        CHECK(shardset_num_documents(set) == c.docs[s]);
        CHECK(shardset_vocab_size(set) == vocab);
        CHECK(shardset_token_width(set) == (vocab <= 65536 ? 2 : 4));
        int32_t *buf = malloc((c.n[s] + 1) * sizeof *buf);
        /* whole stream in one read (crosses every shard boundary), then many odd-sized windows */
        CHECK(shardset_read(set, 0, c.n[s], buf, &err) == 0);
        CHECK(memcmp(buf, c.tok[s], c.n[s] * sizeof *buf) == 0);
        ZyRng r;
        zy_rng_seed(&r, 99);
        int bad = 0;
        for (int it = 0; it < 300; it++) {
            uint64_t off = zy_rng_next(&r) % c.n[s];
            size_t n = (size_t)(zy_rng_next(&r) % (c.n[s] - off + 1));
            if (shardset_read(set, off, n, buf, &err) != 0 || memcmp(buf, c.tok[s] + off, n * sizeof *buf) != 0) bad++;
        }
        CHECK(bad == 0);
        CHECK(shardset_read(set, c.n[s], 0, buf, &err) == 0);
        err.msg[0] = 0;
        CHECK(shardset_read(set, c.n[s] - 2, 3, buf, &err) != 0);
        CHECK(strstr(err.msg, "past the end") != NULL);
        CHECK(shardset_read(set, UINT64_MAX, 2, buf, &err) != 0);
        free(buf);
        shardset_close(set);
    }
    /* meta.json: one entry per shard, 100 tokens each except the last */
    char path[128], *text;
    size_t len;
    snprintf(path, sizeof path, "%s/meta.json", dir);
    REQUIRE(zy_read_file(path, &text, &len, &err) == 0);
    ShardMeta m;
    CHECK(shard_meta_parse(text, len, path, &m, &err) == 0);
    free(text);
    CHECK(m.split[SHARD_TRAIN].n_shards == 13 && m.split[SHARD_VAL].n_shards == 4);
    CHECK(m.has_tokenizer && strcmp(m.tokenizer_file, "tok.json") == 0 && m.tokenizer_crc == 0xdeadbeefu);
    CHECK(m.split[SHARD_TRAIN].shards[0].tokens == 100 && strcmp(m.split[SHARD_TRAIN].shards[12].file, "train-00012.bin") == 0);
    CHECK(m.split[SHARD_TRAIN].shards[12].tokens == c.n[SHARD_TRAIN] - 1200);
    shard_meta_free(&m);
    corpus_free(&c);
    zy_test_rmtree(dir);
}

TEST(shards_roundtrip_u16) { check_roundtrip(1000, zy_test_failed_); }
TEST(shards_roundtrip_u32) { check_roundtrip(70000, zy_test_failed_); }

TEST(shards_empty_split_and_writer_errors) {
    char dir[64];
    REQUIRE(zy_test_tmpdir(dir, sizeof dir, "shards") == 0);
    ZyErr err;
    ShardWriterOptions o = {50, 0, 0, NULL, 0};
    ShardWriter *w;
    REQUIRE(shardwriter_open(&w, dir, &o, &err) == 0);
    int32_t bad[2] = {3, 50};
    CHECK(shardwriter_add_document(w, SHARD_TRAIN, bad, 2, &err) != 0);
    CHECK(strstr(err.msg, "token id 50 is outside the vocabulary") != NULL);
    int32_t neg = -1;
    CHECK(shardwriter_append(w, SHARD_TRAIN, &neg, 1, &err) != 0);
    CHECK(shardwriter_end_document(w, SHARD_VAL, &err) != 0);
    CHECK(strstr(err.msg, "empty document") != NULL);
    int32_t ok[3] = {1, 2, 3};
    CHECK(shardwriter_append(w, SHARD_TRAIN, ok, 3, &err) == 0);
    CHECK(shardwriter_finish(w, &err) != 0); /* inside a document */
    CHECK(strstr(err.msg, "inside a document") != NULL);
    CHECK(shardwriter_end_document(w, SHARD_TRAIN, &err) == 0);
    CHECK(shardwriter_finish(w, &err) == 0);
    shardwriter_close(w);
    ShardSet *s;
    REQUIRE(shardset_open(&s, dir, "val", 1, &err) == 0);
    CHECK(shardset_num_tokens(s) == 0 && shardset_num_documents(s) == 0);
    int32_t t;
    CHECK(shardset_read(s, 0, 1, &t, &err) != 0);
    shardset_close(s);
    CHECK(shardset_open(&s, dir, "test", 1, &err) != 0);
    CHECK(strstr(err.msg, "unknown split") != NULL);
    REQUIRE(shardset_open(&s, dir, "train", 1, &err) == 0);
    int32_t got[3];
    CHECK(shardset_read(s, 0, 3, got, &err) == 0 && got[0] == 1 && got[2] == 3);
    shardset_close(s);
    /* an unfinished writer leaves no temporary files and no meta.json behind */
    char dir2[64];
    REQUIRE(zy_test_tmpdir(dir2, sizeof dir2, "shards") == 0);
    REQUIRE(shardwriter_open(&w, dir2, &o, &err) == 0);
    CHECK(shardwriter_add_document(w, SHARD_TRAIN, ok, 3, &err) == 0);
    shardwriter_close(w);
    DIR *d = opendir(dir2);
    int entries = 0;
    for (struct dirent *e; d && (e = readdir(d));) entries += e->d_name[0] != '.';
    if (d) closedir(d);
    CHECK(entries == 0);
    zy_test_rmtree(dir2);
    ShardWriterOptions o16 = {70000, 2, 0, NULL, 0};
    CHECK(shardwriter_open(&w, dir, &o16, &err) != 0);
    zy_test_rmtree(dir);
}

TEST(shards_io_stats_scatter_factor) {
    char dir[64];
    REQUIRE(zy_test_tmpdir(dir, sizeof dir, "shards") == 0);
    ZyErr err;
    ShardWriterOptions o = {1000, 0, 0, NULL, 0};
    ShardWriter *w;
    REQUIRE(shardwriter_open(&w, dir, &o, &err) == 0);
    int32_t *t = malloc(10000 * sizeof *t);
    for (int i = 0; i < 10000; i++) t[i] = i % 1000;
    CHECK(shardwriter_add_document(w, SHARD_TRAIN, t, 10000, &err) == 0);
    CHECK(shardwriter_finish(w, &err) == 0);
    shardwriter_close(w);
    ShardSet *s;
    REQUIRE(shardset_open(&s, dir, "train", 0, &err) == 0);
    /* sequential: 20000 payload bytes at file offsets 64..20063 span pages 0..4, and need 5 */
    for (int i = 0; i < 10000; i += 100) CHECK(shardset_read(s, (uint64_t)i, 100, t, &err) == 0);
    uint64_t pr, pn, br;
    shardset_io_stats(s, &pr, &pn, &br);
    CHECK(pr == 5 && pn == 5 && br == 20000);
    /* scattered single tokens: each touches a page, the bytes need one */
    shardset_reset_io_stats(s);
    CHECK(shardset_read(s, 0, 1, t, &err) == 0 && t[0] == 0);
    CHECK(shardset_read(s, 5000, 1, t, &err) == 0 && t[0] == 0);
    CHECK(shardset_read(s, 9999, 1, t, &err) == 0 && t[0] == 999);
    shardset_io_stats(s, &pr, &pn, &br);
    CHECK(pr == 3 && pn == 1 && br == 6);
    shardset_close(s);
    free(t);
    zy_test_rmtree(dir);
}

/* ---- corruption classes ---- */

static void load(const char *path, char **data, size_t *len) {
    ZyErr err;
    if (zy_read_file(path, data, len, &err) != 0) {
        *data = NULL;
        *len = 0;
    }
}

static int open_err(const char *dir, const char *split, int verify, ZyErr *err) {
    ShardSet *s = NULL;
    err->msg[0] = '\0';
    int rc = shardset_open(&s, dir, split, verify, err);
    if (rc == 0) shardset_close(s);
    return rc;
}

#define EXPECT_OPEN_ERR(dir, verify, needle1, needle2)                                                          \
    do {                                                                                                       \
        ZyErr e_;                                                                                              \
        int rc_ = open_err(dir, "train", verify, &e_);                                                         \
        CHECK_MSG(rc_ != 0 && strstr(e_.msg, needle1) && strstr(e_.msg, needle2), "got rc %d \"%s\"", rc_,    \
                  e_.msg);                                                                                     \
    } while (0)

/* Rewrites a header field and recomputes the header CRC, so only the field itself is wrong. */
static void patch_header(const char *path, int off, uint32_t v, int fix_crc) {
    char *d;
    size_t n;
    load(path, &d, &n);
    if (!d || n < 64) {
        free(d);
        return;
    }
    uint8_t *p = (uint8_t *)d;
    for (int i = 0; i < 4; i++) p[off + i] = (uint8_t)(v >> (8 * i));
    if (fix_crc) {
        uint32_t c = zy_crc32(0, p, 60);
        for (int i = 0; i < 4; i++) p[60 + i] = (uint8_t)(c >> (8 * i));
    }
    write_bytes(path, d, n);
    free(d);
}

/* Applies edit(root) to meta.json. */
static void patch_meta(const char *dir, void (*edit)(cJSON *)) {
    char path[128], *d;
    size_t n;
    snprintf(path, sizeof path, "%s/meta.json", dir);
    load(path, &d, &n);
    cJSON *root = d ? cJSON_Parse(d) : NULL;
    free(d);
    if (!root) return;
    edit(root);
    char *t = cJSON_Print(root);
    write_bytes(path, t, strlen(t));
    free(t);
    cJSON_Delete(root);
}

static cJSON *train_shard0(cJSON *root) {
    cJSON *sp = cJSON_GetObjectItem(cJSON_GetObjectItem(root, "splits"), "train");
    return cJSON_GetArrayItem(cJSON_GetObjectItem(sp, "shards"), 0);
}
static void edit_vocab(cJSON *root) { cJSON_SetNumberValue(cJSON_GetObjectItem(root, "vocab_size"), 999); }
static void edit_crc(cJSON *root) { cJSON_SetNumberValue(cJSON_GetObjectItem(train_shard0(root), "crc32"), 12345); }
static void edit_docs(cJSON *root) {
    cJSON *sp = cJSON_GetObjectItem(cJSON_GetObjectItem(root, "splits"), "train");
    cJSON *e = cJSON_GetObjectItem(train_shard0(root), "documents");
    cJSON *tot = cJSON_GetObjectItem(sp, "documents");
    cJSON_SetNumberValue(e, e->valuedouble + 1);
    cJSON_SetNumberValue(tot, tot->valuedouble + 1);
}
static void edit_sum(cJSON *root) {
    cJSON *sp = cJSON_GetObjectItem(cJSON_GetObjectItem(root, "splits"), "train");
    cJSON *tot = cJSON_GetObjectItem(sp, "tokens");
    cJSON_SetNumberValue(tot, tot->valuedouble + 1);
}
static void edit_name(cJSON *root) {
    cJSON_ReplaceItemInObject(train_shard0(root), "file", cJSON_CreateString("../train-00000.bin"));
}
static void edit_dtype(cJSON *root) { cJSON_ReplaceItemInObject(root, "dtype", cJSON_CreateString("uint32")); }
static void edit_version(cJSON *root) { cJSON_SetNumberValue(cJSON_GetObjectItem(root, "format_version"), 2); }

TEST(shards_corruption_classes) {
    char dir[64], shard0[128], shard1[128], shard2[128], meta[128];
    REQUIRE(zy_test_tmpdir(dir, sizeof dir, "shards") == 0);
    snprintf(shard0, sizeof shard0, "%s/train-00000.bin", dir);
    snprintf(shard1, sizeof shard1, "%s/train-00001.bin", dir);
    snprintf(shard2, sizeof shard2, "%s/train-00002.bin", dir);
    snprintf(meta, sizeof meta, "%s/meta.json", dir);
    Corpus c;
    ZyErr err;
    const size_t want[2] = {300, 50};
    REQUIRE(build_dir(dir, 1000, 128, want, 20, 3, &c, &err) == 0);
    char *orig0, *orig1, *orig2, *origm;
    size_t n0, n1, n2, nm;
    load(shard0, &orig0, &n0);
    load(shard1, &orig1, &n1);
    load(shard2, &orig2, &n2);
    load(meta, &origm, &nm);
    REQUIRE(orig0 && orig1 && orig2 && origm && n0 == 64 + 256);
#define RESTORE()                                 \
    do {                                          \
        write_bytes(shard0, orig0, n0);           \
        write_bytes(shard1, orig1, n1);           \
        write_bytes(shard2, orig2, n2);           \
        write_bytes(meta, origm, nm);             \
    } while (0)

    CHECK(open_err(dir, "train", 1, &err) == 0);

    unlink(meta);
    EXPECT_OPEN_ERR(dir, 1, "meta.json", "cannot open");
    RESTORE();

    unlink(shard1);
    EXPECT_OPEN_ERR(dir, 1, "train-00001.bin", "cannot open shard");
    RESTORE();

    char *m = malloc(n0);
    memcpy(m, orig0, n0);
    m[0] = 'X';
    write_bytes(shard0, m, n0);
    EXPECT_OPEN_ERR(dir, 1, "train-00000.bin", "bad magic");
    RESTORE();

    patch_header(shard0, 8, 2, 1);
    EXPECT_OPEN_ERR(dir, 1, "train-00000.bin", "unsupported shard format version 2");
    RESTORE();

    patch_header(shard0, 12, 3, 1);
    EXPECT_OPEN_ERR(dir, 1, "train-00000.bin", "unsupported token width 3");
    RESTORE();

    patch_header(shard0, 16, 127, 0);
    EXPECT_OPEN_ERR(dir, 1, "train-00000.bin", "header CRC mismatch");
    RESTORE();

    patch_header(shard0, 44, 1, 1);
    EXPECT_OPEN_ERR(dir, 1, "train-00000.bin", "reserved header byte 44");
    RESTORE();

    write_bytes(shard1, orig1, n1 - 2);
    EXPECT_OPEN_ERR(dir, 1, "train-00001.bin", "truncated");
    RESTORE();

    write_bytes(shard1, orig1, 10);
    EXPECT_OPEN_ERR(dir, 1, "train-00001.bin", "truncated");
    RESTORE();

    memcpy(m, orig0, n0);
    m[n0 - 1] ^= 1;
    write_bytes(shard0, m, n0);
    EXPECT_OPEN_ERR(dir, 1, "train-00000.bin", "payload CRC mismatch");
    CHECK(open_err(dir, "train", 0, &err) == 0); /* only a full verification reads the payload */
    RESTORE();

    patch_meta(dir, edit_vocab);
    EXPECT_OPEN_ERR(dir, 1, "disagrees with", "vocab size");
    RESTORE();
    patch_meta(dir, edit_crc);
    EXPECT_OPEN_ERR(dir, 1, "disagrees with", "payload CRC");
    RESTORE();
    patch_meta(dir, edit_docs);
    EXPECT_OPEN_ERR(dir, 1, "disagrees with", "document count");
    RESTORE();
    patch_header(shard0, 28, 1001, 1); /* vocab in one header only */
    EXPECT_OPEN_ERR(dir, 1, "disagrees with", "vocab size");
    RESTORE();
    patch_meta(dir, edit_sum);
    EXPECT_OPEN_ERR(dir, 1, "meta.json", "but its shards hold");
    RESTORE();
    patch_meta(dir, edit_name);
    EXPECT_OPEN_ERR(dir, 1, "meta.json", "\"file\" must be a name like");
    RESTORE();
    patch_meta(dir, edit_dtype);
    EXPECT_OPEN_ERR(dir, 1, "disagrees with", "token width");
    RESTORE();
    patch_meta(dir, edit_version);
    EXPECT_OPEN_ERR(dir, 1, "meta.json", "unsupported format_version 2");
    RESTORE();
    write_bytes(meta, "{\"format\": ", 11);
    EXPECT_OPEN_ERR(dir, 1, "meta.json", "not valid JSON");
    RESTORE();

    /* a token id past the vocabulary: shrink the declared vocabulary everywhere, then read */
    patch_header(shard0, 28, 10, 1);
    patch_header(shard1, 28, 10, 1);
    patch_header(shard2, 28, 10, 1);
    {
        char *d;
        size_t n;
        load(meta, &d, &n);
        cJSON *root = cJSON_Parse(d);
        free(d);
        cJSON_SetNumberValue(cJSON_GetObjectItem(root, "vocab_size"), 10);
        char *t = cJSON_Print(root);
        write_bytes(meta, t, strlen(t));
        free(t);
        cJSON_Delete(root);
    }
    ShardSet *s = NULL;
    CHECK_MSG(shardset_open(&s, dir, "train", 1, &err) == 0, "%s", err.msg);
    if (s) {
        int32_t *buf = malloc(c.n[0] * sizeof *buf);
        uint64_t first_bad = 0;
        while (first_bad < c.n[0] && c.tok[0][first_bad] < 10) first_bad++;
        REQUIRE(first_bad < c.n[0]);
        CHECK(shardset_read(s, 0, c.n[0], buf, &err) != 0);
        char want_msg[96];
        snprintf(want_msg, sizeof want_msg, "(stream offset %llu) is outside the vocabulary (size 10)",
                 (unsigned long long)first_bad);
        CHECK_MSG(strstr(err.msg, want_msg) && strstr(err.msg, first_bad < 128 ? "train-00000.bin" : "train-00001.bin"),
                  "%s", err.msg);
        free(buf);
        shardset_close(s);
    }
    RESTORE();
    CHECK(open_err(dir, "train", 1, &err) == 0);
    free(m);
    free(orig0);
    free(orig1);
    free(orig2);
    free(origm);
    corpus_free(&c);
    zy_test_rmtree(dir);
#undef RESTORE
}

TEST(shards_header_parse_direct) {
    ShardHeader h = {1, 2, 0x1234u, 500, 77, 3}, g;
    uint8_t b[64];
    ZyErr err;
    shard_header_encode(&h, b);
    CHECK(memcmp(b, "ZAYASHRD", 8) == 0 && b[8] == 1 && b[12] == 2 && b[16] == 77 && b[28] == 0xf4 && b[29] == 1);
    REQUIRE(shard_header_parse(b, 64, "h", &g, &err) == 0);
    CHECK(g.version == 1 && g.width == 2 && g.tokens == 77 && g.payload_crc == 0x1234u && g.vocab_size == 500 &&
          g.documents == 3);
    CHECK(shard_header_parse(b, 63, "h", &g, &err) != 0 && strstr(err.msg, "h: truncated"));
    h.vocab_size = 70000;
    shard_header_encode(&h, b);
    CHECK(shard_header_parse(b, 64, "h", &g, &err) != 0 && strstr(err.msg, "does not fit 2-byte tokens"));
    h.vocab_size = 500;
    h.documents = 78;
    shard_header_encode(&h, b);
    CHECK(shard_header_parse(b, 64, "h", &g, &err) != 0 && strstr(err.msg, "documents in"));
    h.documents = 1;
    h.tokens = UINT64_MAX / 2;
    shard_header_encode(&h, b);
    CHECK(shard_header_parse(b, 64, "h", &g, &err) != 0 && strstr(err.msg, "impossibly large"));
    h.tokens = 5;
    h.vocab_size = 0;
    shard_header_encode(&h, b);
    CHECK(shard_header_parse(b, 64, "h", &g, &err) != 0 && strstr(err.msg, "invalid vocabulary size"));
    /* meta texts that must not parse */
    const char *bad[] = {
        "[]",
        "{\"format\": \"zaya-shards\", \"format_version\": 1, \"vocab_size\": 70000, \"dtype\": \"uint16\", \"splits\": {}}",
        "{\"format\": \"zaya-shards\", \"format_version\": 1, \"vocab_size\": 7, \"dtype\": \"uint8\", \"splits\": {}}",
        "{\"format\": \"zaya-shards\", \"format_version\": 1.5, \"vocab_size\": 7, \"dtype\": \"uint16\", \"splits\": {}}",
        "{\"format\": \"zaya-shards\", \"format_version\": 1, \"vocab_size\": 7, \"dtype\": \"uint16\", \"splits\": {\"test\": {}}}",
        "{\"format\": \"zaya-shards\", \"format_version\": 1, \"vocab_size\": 7, \"dtype\": \"uint16\", \"splits\": "
        "{\"train\": {\"tokens\": 1, \"documents\": 1, \"shards\": [{\"file\": \"val-00000.bin\", \"tokens\": 1, "
        "\"documents\": 1, \"crc32\": 0}]}}}",
        "{\"format\": \"zaya-shards\", \"format_version\": 1, \"vocab_size\": 7, \"dtype\": \"uint16\", \"splits\": "
        "{\"train\": {\"tokens\": 2, \"documents\": 2, \"shards\": [{\"file\": \"train-00000.bin\", \"tokens\": 1, "
        "\"documents\": 1, \"crc32\": 0}, {\"file\": \"train-00000.bin\", \"tokens\": 1, \"documents\": 1, \"crc32\": 0}]}}}",
        "{\"format\": \"zaya-shards\", \"format_version\": 1, \"vocab_size\": 7, \"dtype\": \"uint16\", \"splits\": "
        "{\"train\": {\"tokens\": 1, \"documents\": 1, \"shards\": [{\"file\": \"train-00000.bin\", \"tokens\": 1, "
        "\"documents\": 1, \"crc32\": 4294967296}]}}}",
    };
    const char *needle[] = {"must be a JSON object", "does not fit dtype uint16", "\"dtype\" must be",
                            "\"format_version\" must be an integer", "unknown split \"test\"", "\"file\" must be a name",
                            "listed twice", "\"crc32\" must be an integer"};
    for (size_t i = 0; i < ZY_ARRAY_LEN(bad); i++) {
        ShardMeta m;
        err.msg[0] = 0;
        int rc = shard_meta_parse(bad[i], strlen(bad[i]), "m.json", &m, &err);
        CHECK_MSG(rc != 0 && strstr(err.msg, needle[i]) && strncmp(err.msg, "m.json: ", 8) == 0, "case %zu: %s", i,
                  err.msg);
        if (rc == 0) shard_meta_free(&m);
    }
}

/* Random mutations of real shard files and meta.json: every outcome is a clean error or, with CRC checks on,
 * exactly the original tokens. Runs about a second (it also runs under ASan + UBSan). */
TEST(shards_mutation_fuzz) {
    char dir[64], paths[4][128];
    REQUIRE(zy_test_tmpdir(dir, sizeof dir, "shards") == 0);
    Corpus c;
    ZyErr err;
    const size_t want[2] = {700, 60};
    REQUIRE(build_dir(dir, 300, 256, want, 30, 11, &c, &err) == 0);
    const char *names[4] = {"meta.json", "train-00000.bin", "train-00002.bin", "val-00000.bin"};
    char *orig[4];
    size_t olen[4];
    for (int i = 0; i < 4; i++) {
        snprintf(paths[i], sizeof paths[i], "%s/%s", dir, names[i]);
        load(paths[i], &orig[i], &olen[i]);
        REQUIRE(orig[i] != NULL);
    }
    ZyRng r;
    zy_rng_seed(&r, 2024);
    int32_t *buf = malloc((c.n[0] + 1) * sizeof *buf);
    uint8_t *mut = malloc(olen[0] + olen[1] + olen[2] + olen[3] + 256);
    double t0 = zy_now_seconds();
    int iters = 0, opened = 0, wrong = 0, bad_msg = 0;
    /* at least 200 mutations however loaded the machine, more while half a second lasts */
    while ((iters < 200 || zy_now_seconds() - t0 < 0.5) && iters < 20000) {
        iters++;
        int f = (int)(zy_rng_next(&r) % 4);
        size_t n = olen[f];
        memcpy(mut, orig[f], n);
        int k = 1 + (int)(zy_rng_next(&r) % 4);
        for (int j = 0; j < k; j++) {
            uint64_t x = zy_rng_next(&r);
            size_t pos = n ? (size_t)((x >> 8) % n) : 0;
            switch (x % 6) {
            case 0: if (n) mut[pos] ^= (uint8_t)(1u << ((x >> 40) % 8)); break;
            case 1: if (n) mut[pos] = (uint8_t)(x >> 48); break;
            case 2: n = pos; break; /* truncate */
            case 3: for (int q = 0; q < 16; q++) mut[n++] = (uint8_t)(x >> (q % 8)); break; /* trailing junk */
            case 4: if (n) mut[pos] = "0123456789{}[]\",:"[(x >> 32) % 17]; break; /* JSON-ish bytes */
            default: if (pos + 8 <= n) memset(mut + pos, 0xff, 8); break;
            }
        }
        write_bytes(paths[f], mut, n);
        ShardSet *s = NULL;
        int verify = (int)(zy_rng_next(&r) % 4) != 0;
        err.msg[0] = '\0';
        if (shardset_open(&s, dir, "train", verify, &err) == 0) {
            opened++;
            uint64_t total = shardset_num_tokens(s);
            int rc = total <= c.n[0] ? shardset_read(s, 0, (size_t)total, buf, &err) : -1;
            if (verify && (rc != 0 || total != c.n[0] || memcmp(buf, c.tok[0], total * sizeof *buf) != 0)) wrong++;
            shardset_close(s);
        } else if (err.msg[0] == '\0') {
            bad_msg++;
        }
        write_bytes(paths[f], orig[f], olen[f]);
    }
    CHECK(wrong == 0);
    CHECK(bad_msg == 0);
    CHECK(open_err(dir, "train", 1, &err) == 0);
    /* in memory, many more mutations per second: meta.json text and shard headers */
    t0 = zy_now_seconds();
    int parsed = 0;
    for (int i = 0; (i < 2000 || zy_now_seconds() - t0 < 0.3) && i < 200000; i++) {
        int f = i % 2 ? 0 : 1 + (int)(zy_rng_next(&r) % 3);
        size_t n = f ? 64 : olen[0];
        memcpy(mut, orig[f], n);
        int k = 1 + (int)(zy_rng_next(&r) % 3);
        for (int j = 0; j < k; j++) {
            uint64_t x = zy_rng_next(&r);
            if (n == 0) break;
            size_t pos = (size_t)((x >> 8) % n);
            if (x % 3 == 0) mut[pos] ^= (uint8_t)(1u << ((x >> 40) % 8));
            else if (x % 3 == 1) mut[pos] = "0123456789{}[]\",:-.e"[(x >> 32) % 21];
            else n = pos;
        }
        err.msg[0] = '\0';
        if (f == 0) {
            ShardMeta mm;
            if (shard_meta_parse((const char *)mut, n, "m", &mm, &err) == 0) {
                parsed++;
                shard_meta_free(&mm);
            } else if (err.msg[0] == '\0') {
                bad_msg++;
            }
        } else {
            ShardHeader h;
            if (shard_header_parse(mut, n, "h", &h, &err) == 0) parsed++;
            else if (err.msg[0] == '\0') bad_msg++;
        }
    }
    CHECK(bad_msg == 0);
    if (getenv("ZY_FUZZ_VERBOSE"))
        fprintf(stderr, "fuzz: %d directory mutations (%d opened), %d parsed in memory\n", iters, opened, parsed);
    /* the header parser on raw random bytes */
    for (int i = 0; i < 2000; i++) {
        uint8_t b[64];
        for (int j = 0; j < 64; j++) b[j] = (uint8_t)zy_rng_next(&r);
        if (i % 2) memcpy(b, "ZAYASHRD", 8);
        ShardHeader h;
        CHECK(shard_header_parse(b, (size_t)(i % 65), "rand", &h, &err) != 0);
    }
    free(buf);
    free(mut);
    for (int i = 0; i < 4; i++) free(orig[i]);
    corpus_free(&c);
    zy_test_rmtree(dir);
}

/* ---- data prepare (with a byte-level stand-in for the tokenizer: id = byte + 3, eos 2) ---- */

static int byte_encode(void *ctx, int thread, const char *text, size_t len, int32_t **ids, size_t *n, ZyErr *err) {
    (void)ctx;
    (void)thread;
    *ids = malloc(len * sizeof **ids + 1);
    if (!*ids) return zy_fail(err, "oom");
    for (size_t i = 0; i < len; i++) (*ids)[i] = (uint8_t)text[i] + 3;
    *n = len;
    return 0;
}

static void put_file(const char *dir, const char *name, const char *text) {
    char p[256];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    write_bytes(p, text, strlen(text));
}

/* The documents of a split, decoded back from the byte ids, joined with '|'. */
static char *split_text(const char *dir, const char *split) {
    ShardSet *s;
    ZyErr err;
    if (shardset_open(&s, dir, split, 1, &err)) return NULL;
    size_t n = (size_t)shardset_num_tokens(s);
    int32_t *t = malloc((n + 1) * sizeof *t);
    char *out = malloc(n + 1);
    shardset_read(s, 0, n, t, &err);
    for (size_t i = 0; i < n; i++) out[i] = t[i] == 2 ? '|' : (char)(t[i] - 3);
    out[n] = '\0';
    free(t);
    shardset_close(s);
    return out;
}

static const PrepareEncoder BYTE_ENC = {byte_encode, NULL, 259, 2, -1};

TEST(prepare_documents_malformed_lines_and_order) {
    char root[64], in[128], sub[160], out[128], warn_path[128];
    snprintf(root, sizeof root, "/tmp/zy_prep_XXXXXX");
    REQUIRE(mkdtemp(root) != NULL);
    snprintf(in, sizeof in, "%s/in", root);
    snprintf(sub, sizeof sub, "%s/sub", in);
    snprintf(out, sizeof out, "%s/out", root);
    snprintf(warn_path, sizeof warn_path, "%s/warn.txt", root);
    REQUIRE(mkdir(in, 0755) == 0 && mkdir(sub, 0755) == 0);
    put_file(in, "a.jsonl",
             "{\"text\": \"one\"}\n"
             "{\"text\": \"tw\n"
             "{\"txt\": \"x\"}\n"
             "\n"
             "{\"text\": 5}\n"
             "[1, 2]\n"
             "{\"text\": \"two\\nlines\", \"id\": 3}\r\n"
             "{\"text\": \"\"}\n"
             "{\"text\": \"three\"}");
    put_file(in, "b.txt", "first doc\nsecond line\n<|endoftext|>\nsecond doc\n<|endoftext|>\r\n");
    put_file(sub, "c.txt", "whole file\n");
    put_file(in, "d.md", "ignored");
    const char *inputs[] = {in};
    FILE *warn = fopen(warn_path, "w");
    PrepareOptions o = {inputs, 1, out, 0.0, 0, 0, 0, 0, "tok.json", 7, 2, warn};
    PrepareReport rep;
    ZyErr err;
    int rc = data_prepare(&o, &BYTE_ENC, &rep, &err);
    fclose(warn);
    REQUIRE(rc == 0 || !fprintf(stderr, "    %s\n", err.msg));
    CHECK(rep.files == 3 && rep.malformed_lines == 4 && rep.empty_documents == 1);
    CHECK(rep.documents[SHARD_TRAIN] == 6 && rep.documents[SHARD_VAL] == 0);
    char *t = split_text(out, "train");
    CHECK_MSG(t && strcmp(t, "one|two\nlines|three|first doc\nsecond line|second doc|whole file|") == 0, "%s", t);
    CHECK(rep.tokens[SHARD_TRAIN] == strlen(t));
    free(t);
    char *w;
    size_t wl;
    REQUIRE(zy_read_file(warn_path, &w, &wl, &err) == 0);
    CHECK_MSG(strstr(w, "/in/a.jsonl:2: invalid JSON") && strstr(w, "/in/a.jsonl:3: missing \"text\"") &&
                  strstr(w, "/in/a.jsonl:5: \"text\" is not a string") && strstr(w, "/in/a.jsonl:6: not a JSON object"),
              "%s", w);
    free(w);

    /* --strict: fails naming the line, and leaves no output (nor temporary) directory */
    char out2[128];
    snprintf(out2, sizeof out2, "%s/out2", root);
    o.out_dir = out2;
    o.strict = 1;
    o.warn = NULL;
    CHECK(data_prepare(&o, &BYTE_ENC, &rep, &err) != 0);
    CHECK_MSG(strstr(err.msg, "/in/a.jsonl:2: invalid JSON") != NULL, "%s", err.msg);
    struct stat st;
    CHECK(stat(out2, &st) != 0);
    DIR *d = opendir(root);
    int stray = 0;
    for (struct dirent *e; d && (e = readdir(d));) stray += strstr(e->d_name, ".tmp-") != NULL;
    if (d) closedir(d);
    CHECK(stray == 0);

    /* an existing non-empty directory is refused without --force; --force replaces only the shards */
    o.strict = 0;
    o.out_dir = out;
    CHECK(data_prepare(&o, &BYTE_ENC, &rep, &err) != 0 && strstr(err.msg, "not empty"));
    put_file(out, "train-00007.bin", "stale");
    put_file(out, "notes.txt", "mine");
    const char *one[] = {sub};
    o.inputs = one;
    o.force = 1;
    CHECK(data_prepare(&o, &BYTE_ENC, &rep, &err) == 0);
    t = split_text(out, "train");
    CHECK(t && strcmp(t, "whole file|") == 0);
    free(t);
    char p[256];
    snprintf(p, sizeof p, "%s/train-00007.bin", out);
    CHECK(stat(p, &st) != 0);
    snprintf(p, sizeof p, "%s/notes.txt", out);
    CHECK(stat(p, &st) == 0);

    /* inputs that are not usable */
    char md[160];
    snprintf(md, sizeof md, "%s/d.md", in);
    const char *bad[] = {md};
    o.inputs = bad;
    CHECK(data_prepare(&o, &BYTE_ENC, &rep, &err) != 0 && strstr(err.msg, "unsupported input"));
    const char *missing[] = {"/nonexistent/x.jsonl"};
    o.inputs = missing;
    CHECK(data_prepare(&o, &BYTE_ENC, &rep, &err) != 0 && strstr(err.msg, "/nonexistent/x.jsonl"));
    o.inputs = inputs;
    o.val_fraction = 1.5;
    CHECK(data_prepare(&o, &BYTE_ENC, &rep, &err) != 0 && strstr(err.msg, "val-fraction"));
    /* with a bos id every document starts with it: [bos] "whole file" [eos] */
    o.val_fraction = 0;
    o.inputs = one;
    PrepareEncoder with_bos = BYTE_ENC;
    with_bos.bos_id = 1;
    CHECK(data_prepare(&o, &with_bos, &rep, &err) == 0);
    ShardSet *s;
    if (shardset_open(&s, out, "train", 1, &err) == 0) {
        int32_t ids[12];
        CHECK(shardset_num_tokens(s) == 12 && shardset_read(s, 0, 12, ids, &err) == 0);
        CHECK(ids[0] == 1 && ids[1] == 'w' + 3 && ids[11] == 2);
        shardset_close(s);
    } else {
        CHECK_MSG(0, "%s", err.msg);
    }
    zy_test_rmtree(root);
}

TEST(prepare_val_split_deterministic_and_thread_independent) {
    CHECK(!data_prepare_is_val(1, 5, 0.0) && data_prepare_is_val(1, 5, 1.0));
    char root[64], in[128], outs[3][128];
    snprintf(root, sizeof root, "/tmp/zy_prep_XXXXXX");
    REQUIRE(mkdtemp(root) != NULL);
    snprintf(in, sizeof in, "%s/docs.jsonl", root);
    FILE *f = fopen(in, "w");
    REQUIRE(f != NULL);
    for (int i = 0; i < 3000; i++) fprintf(f, "{\"text\": \"document number %d\"}\n", i);
    fclose(f);
    const char *inputs[] = {in};
    char *meta[3] = {0};
    for (int k = 0; k < 3; k++) {
        snprintf(outs[k], sizeof outs[k], "%s/out%d", root, k);
        PrepareOptions o = {inputs, 1, outs[k], 0.3, 42, 0, 0, 1000, NULL, 0, k == 2 ? 1 : 2, NULL};
        PrepareReport rep;
        ZyErr err;
        CHECK(data_prepare(&o, &BYTE_ENC, &rep, &err) == 0);
        CHECK_MSG(rep.documents[SHARD_VAL] > 800 && rep.documents[SHARD_VAL] < 1000, "%llu val documents",
                  (unsigned long long)rep.documents[SHARD_VAL]);
        CHECK(rep.shards[SHARD_TRAIN] > 30);
        char p[256];
        size_t n;
        snprintf(p, sizeof p, "%s/meta.json", outs[k]);
        if (zy_read_file(p, &meta[k], &n, &err) != 0) meta[k] = NULL;
    }
    /* same seed: identical shards (meta.json carries every CRC), whatever the thread count */
    CHECK(meta[0] && meta[1] && meta[2] && strcmp(meta[0], meta[1]) == 0 && strcmp(meta[0], meta[2]) == 0);
    for (int k = 0; k < 3; k++) free(meta[k]);
    char *val = split_text(outs[0], "val");
    CHECK(val && strstr(val, "document number ") == val);
    free(val);
    zy_test_rmtree(root);
}
