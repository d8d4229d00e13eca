/* Token shards: header codec, meta.json, streaming writer, pread-based reader with I/O accounting. */
#include "io/shards.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define PATH_CAP 4096

const char *shard_split_name(ShardSplit s) { return s == SHARD_VAL ? "val" : "train"; }

static int split_from_name(const char *name) {
    if (strcmp(name, "train") == 0) return SHARD_TRAIN;
    if (strcmp(name, "val") == 0) return SHARD_VAL;
    return -1;
}

static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get_u64(const uint8_t *p) { return (uint64_t)get_u32(p) | (uint64_t)get_u32(p + 4) << 32; }

void shard_header_encode(const ShardHeader *h, uint8_t out[SHARD_HEADER_SIZE]) {
    memset(out, 0, SHARD_HEADER_SIZE);
    memcpy(out, SHARD_MAGIC, 8);
    put_u32(out + 8, h->version);
    put_u32(out + 12, h->width);
    put_u64(out + 16, h->tokens);
    put_u32(out + 24, h->payload_crc);
    put_u32(out + 28, h->vocab_size);
    put_u64(out + 32, h->documents);
    put_u32(out + 60, zy_crc32(0, out, 60));
}

int shard_header_parse(const void *buf, size_t len, const char *label, ShardHeader *out, ZyErr *err) {
    const uint8_t *p = buf;
    if (len < SHARD_HEADER_SIZE)
        return zy_fail(err, "%s: truncated: %zu bytes, shorter than the %d-byte shard header", label, len,
                       SHARD_HEADER_SIZE);
    if (memcmp(p, SHARD_MAGIC, 8) != 0) return zy_fail(err, "%s: bad magic (not a zaya token shard)", label);
    uint32_t stored = get_u32(p + 60), computed = zy_crc32(0, p, 60);
    if (stored != computed)
        return zy_fail(err, "%s: header CRC mismatch (stored 0x%08x, computed 0x%08x): corrupt header", label, stored,
                       computed);
    ShardHeader h;
    h.version = get_u32(p + 8);
    h.width = get_u32(p + 12);
    h.tokens = get_u64(p + 16);
    h.payload_crc = get_u32(p + 24);
    h.vocab_size = get_u32(p + 28);
    h.documents = get_u64(p + 32);
    if (h.version != SHARD_VERSION)
        return zy_fail(err, "%s: unsupported shard format version %u (this build reads version %d)", label, h.version,
                       SHARD_VERSION);
    if (h.width != 2 && h.width != 4)
        return zy_fail(err, "%s: unsupported token width %u bytes (expected 2 or 4)", label, h.width);
    for (int i = 40; i < 60; i++)
        if (p[i] != 0) return zy_fail(err, "%s: reserved header byte %d is not zero", label, i);
    if (h.vocab_size == 0 || h.vocab_size > (uint32_t)INT32_MAX)
        return zy_fail(err, "%s: invalid vocabulary size %u", label, h.vocab_size);
    if (h.width == 2 && h.vocab_size > 65536)
        return zy_fail(err, "%s: vocabulary size %u does not fit 2-byte tokens", label, h.vocab_size);
    if (h.tokens > (UINT64_MAX - SHARD_HEADER_SIZE) / h.width)
        return zy_fail(err, "%s: token count %llu is impossibly large", label, (unsigned long long)h.tokens);
    if (h.documents > h.tokens)
        return zy_fail(err, "%s: %llu documents in %llu tokens (every document has at least one token)", label,
                       (unsigned long long)h.documents, (unsigned long long)h.tokens);
    *out = h;
    return 0;
}

/* ---------------------------------------------------------------------------------------------- meta.json */

/* JSON numbers are doubles: counts must be integers in [0, 2^53]. */
static int json_u64(const cJSON *obj, const char *key, uint64_t max, uint64_t *out, const char *label,
                    const char *where, ZyErr *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v) return zy_fail(err, "%s: %s: missing \"%s\"", label, where, key);
    if (!cJSON_IsNumber(v)) return zy_fail(err, "%s: %s: \"%s\" must be a number", label, where, key);
    double d = v->valuedouble;
    if (!(d >= 0) || d > 9007199254740992.0 || d != (double)(uint64_t)d || (uint64_t)d > max)
        return zy_fail(err, "%s: %s: \"%s\" must be an integer in [0, %llu]", label, where, key,
                       (unsigned long long)(max > 9007199254740992ull ? 9007199254740992ull : max));
    *out = (uint64_t)d;
    return 0;
}

/* "<split>-" then at least 5 digits then ".bin": no path separators can sneak in. */
static int valid_shard_name(const char *name, const char *split) {
    size_t sl = strlen(split), n = strlen(name);
    if (n < sl + 1 + 5 + 4 || n >= sizeof(((ShardMetaEntry *)0)->file)) return 0;
    if (strncmp(name, split, sl) != 0 || name[sl] != '-' || strcmp(name + n - 4, ".bin") != 0) return 0;
    for (size_t i = sl + 1; i < n - 4; i++)
        if (name[i] < '0' || name[i] > '9') return 0;
    return 1;
}

void shard_meta_free(ShardMeta *m) {
    if (!m) return;
    for (int s = 0; s < SHARD_NUM_SPLITS; s++) {
        free(m->split[s].shards);
        m->split[s].shards = NULL;
        m->split[s].n_shards = 0;
    }
}

static int parse_split(const cJSON *sj, const char *split, ShardMetaSplit *out, const char *label, ZyErr *err) {
    char where[64];
    snprintf(where, sizeof where, "split \"%s\"", split);
    if (!cJSON_IsObject(sj)) return zy_fail(err, "%s: %s must be an object", label, where);
    if (json_u64(sj, "tokens", UINT64_MAX, &out->tokens, label, where, err) ||
        json_u64(sj, "documents", UINT64_MAX, &out->documents, label, where, err))
        return -1;
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(sj, "shards");
    if (!cJSON_IsArray(arr)) return zy_fail(err, "%s: %s: \"shards\" must be an array", label, where);
    int n = cJSON_GetArraySize(arr);
    if (n < 0 || n > 10000000) return zy_fail(err, "%s: %s: too many shards", label, where);
    out->shards = calloc((size_t)n + 1, sizeof *out->shards);
    if (!out->shards) return zy_fail(err, "%s: out of memory", label);
    uint64_t tok_sum = 0, doc_sum = 0;
    int i = 0;
    for (const cJSON *e = arr->child; e; e = e->next, i++) {
        ShardMetaEntry *m = &out->shards[i];
        snprintf(where, sizeof where, "split \"%s\" shard %d", split, i);
        if (!cJSON_IsObject(e)) return zy_fail(err, "%s: %s must be an object", label, where);
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(e, "file");
        if (!cJSON_IsString(f) || !valid_shard_name(f->valuestring, split))
            return zy_fail(err, "%s: %s: \"file\" must be a name like \"%s-00000.bin\"", label, where, split);
        snprintf(m->file, sizeof m->file, "%s", f->valuestring);
        for (int k = 0; k < i; k++)
            if (strcmp(out->shards[k].file, m->file) == 0)
                return zy_fail(err, "%s: %s: shard \"%s\" listed twice", label, where, m->file);
        uint64_t crc;
        if (json_u64(e, "tokens", UINT64_MAX, &m->tokens, label, where, err) ||
            json_u64(e, "documents", UINT64_MAX, &m->documents, label, where, err) ||
            json_u64(e, "crc32", UINT32_MAX, &crc, label, where, err))
            return -1;
        m->crc32 = (uint32_t)crc;
        if (m->tokens == 0) return zy_fail(err, "%s: %s: a shard must hold at least one token", label, where);
        if (m->documents > m->tokens) return zy_fail(err, "%s: %s: more documents than tokens", label, where);
        tok_sum += m->tokens;
        doc_sum += m->documents;
        if (tok_sum < m->tokens) return zy_fail(err, "%s: split \"%s\": token count overflows", label, split);
    }
    out->n_shards = n;
    if (tok_sum != out->tokens)
        return zy_fail(err, "%s: split \"%s\": \"tokens\" is %llu but its shards hold %llu", label, split,
                       (unsigned long long)out->tokens, (unsigned long long)tok_sum);
    if (doc_sum != out->documents)
        return zy_fail(err, "%s: split \"%s\": \"documents\" is %llu but its shards hold %llu", label, split,
                       (unsigned long long)out->documents, (unsigned long long)doc_sum);
    return 0;
}

static int meta_from_json(const cJSON *root, const char *label, ShardMeta *out, ZyErr *err) {
    if (!cJSON_IsObject(root)) return zy_fail(err, "%s: must be a JSON object", label);
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, "zaya-shards") != 0)
        return zy_fail(err, "%s: \"format\" must be \"zaya-shards\"", label);
    uint64_t v;
    if (json_u64(root, "format_version", UINT32_MAX, &v, label, "meta", err)) return -1;
    if (v != SHARD_VERSION)
        return zy_fail(err, "%s: unsupported format_version %llu (this build reads version %d)", label,
                       (unsigned long long)v, SHARD_VERSION);
    out->format_version = (int)v;
    if (json_u64(root, "vocab_size", INT32_MAX, &v, label, "meta", err)) return -1;
    if (v == 0) return zy_fail(err, "%s: \"vocab_size\" must be at least 1", label);
    out->vocab_size = (int)v;
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(root, "dtype");
    if (cJSON_IsString(dt) && strcmp(dt->valuestring, "uint16") == 0)
        out->token_width = 2;
    else if (cJSON_IsString(dt) && strcmp(dt->valuestring, "uint32") == 0)
        out->token_width = 4;
    else
        return zy_fail(err, "%s: \"dtype\" must be \"uint16\" or \"uint32\"", label);
    if (out->token_width == 2 && out->vocab_size > 65536)
        return zy_fail(err, "%s: vocab_size %d does not fit dtype uint16", label, out->vocab_size);
    const cJSON *tok = cJSON_GetObjectItemCaseSensitive(root, "tokenizer");
    if (tok && !cJSON_IsNull(tok)) {
        if (!cJSON_IsObject(tok)) return zy_fail(err, "%s: \"tokenizer\" must be an object or null", label);
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(tok, "file");
        if (!cJSON_IsString(f) || strlen(f->valuestring) >= sizeof out->tokenizer_file)
            return zy_fail(err, "%s: tokenizer: \"file\" must be a string", label);
        snprintf(out->tokenizer_file, sizeof out->tokenizer_file, "%s", f->valuestring);
        if (json_u64(tok, "crc32", UINT32_MAX, &v, label, "tokenizer", err)) return -1;
        out->tokenizer_crc = (uint32_t)v;
        out->has_tokenizer = 1;
    }
    const cJSON *splits = cJSON_GetObjectItemCaseSensitive(root, "splits");
    if (!cJSON_IsObject(splits)) return zy_fail(err, "%s: \"splits\" must be an object", label);
    for (const cJSON *s = splits->child; s; s = s->next) {
        int k = s->string ? split_from_name(s->string) : -1;
        if (k < 0) return zy_fail(err, "%s: unknown split \"%s\" (expected train or val)", label, s->string ? s->string : "");
        if (out->split[k].shards) return zy_fail(err, "%s: split \"%s\" given twice", label, s->string);
        if (parse_split(s, s->string, &out->split[k], label, err)) return -1;
    }
    return 0;
}

int shard_meta_parse(const char *json, size_t len, const char *label, ShardMeta *out, ZyErr *err) {
    memset(out, 0, sizeof *out);
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root) return zy_fail(err, "%s: not valid JSON", label);
    int rc = meta_from_json(root, label, out, err);
    cJSON_Delete(root);
    if (rc) shard_meta_free(out);
    return rc;
}

/* ------------------------------------------------------------------------------------------------ writer */

#define WBUF_BYTES (1u << 20)

typedef struct {
    int fd;                      /* -1: no shard open */
    char tmp[PATH_CAP], final[PATH_CAP];
    uint64_t tokens, documents;  /* of the open shard */
    uint32_t crc;
    uint8_t *buf;
    size_t buf_len;
    uint64_t pending_doc_tokens; /* tokens of the split's current, unfinished document */
    ShardMetaSplit done;         /* completed shards */
    int cap;
} SplitWriter;

struct ShardWriter {
    char dir[PATH_CAP];
    int vocab, width;
    uint64_t max_tokens;
    char tokenizer_file[256];
    int has_tokenizer;
    uint32_t tokenizer_crc;
    int finished;
    SplitWriter sp[SHARD_NUM_SPLITS];
};

int shardwriter_open(ShardWriter **out, const char *dir, const ShardWriterOptions *opt, ZyErr *err) {
    *out = NULL;
    if (opt->vocab_size < 1) return zy_fail(err, "shard writer: vocab_size must be at least 1");
    int width = opt->token_width ? opt->token_width : (opt->vocab_size <= 65536 ? 2 : 4);
    if (width != 2 && width != 4) return zy_fail(err, "shard writer: token width must be 2 or 4");
    if (width == 2 && opt->vocab_size > 65536)
        return zy_fail(err, "shard writer: vocab_size %d does not fit 2-byte tokens", opt->vocab_size);
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) return zy_fail(err, "%s: not a directory", dir);
    if (strlen(dir) > PATH_CAP - 64) return zy_fail(err, "%s: path too long", dir);
    ShardWriter *w = calloc(1, sizeof *w);
    if (!w) return zy_fail(err, "out of memory");
    snprintf(w->dir, sizeof w->dir, "%s", dir);
    w->vocab = opt->vocab_size;
    w->width = width;
    w->max_tokens = opt->max_shard_tokens ? opt->max_shard_tokens : SHARD_DEFAULT_MAX_TOKENS;
    if (opt->tokenizer_file) {
        snprintf(w->tokenizer_file, sizeof w->tokenizer_file, "%s", opt->tokenizer_file);
        w->has_tokenizer = 1;
        w->tokenizer_crc = opt->tokenizer_crc;
    }
    for (int s = 0; s < SHARD_NUM_SPLITS; s++) {
        w->sp[s].fd = -1;
        w->sp[s].buf = malloc(WBUF_BYTES);
        if (!w->sp[s].buf) {
            shardwriter_close(w);
            return zy_fail(err, "out of memory");
        }
    }
    *out = w;
    return 0;
}

static int write_all(int fd, const void *data, size_t len, const char *path, ZyErr *err) {
    return zy_write_all(fd, data, len) ? zy_fail(err, "%s: write failed: %s", path, strerror(errno)) : 0;
}

static int flush_buf(SplitWriter *sw, ZyErr *err) {
    if (sw->buf_len == 0) return 0;
    sw->crc = zy_crc32(sw->crc, sw->buf, sw->buf_len);
    if (write_all(sw->fd, sw->buf, sw->buf_len, sw->tmp, err)) return -1;
    sw->buf_len = 0;
    return 0;
}

static int open_shard(ShardWriter *w, ShardSplit s, ZyErr *err) {
    SplitWriter *sw = &w->sp[s];
    char name[64];
    snprintf(name, sizeof name, "%s-%05d.bin", shard_split_name(s), sw->done.n_shards);
    if (zy_path_join(sw->final, sizeof sw->final - 8, w->dir, name, err)) return -1;
    size_t fl = strlen(sw->final);
    memcpy(sw->tmp, sw->final, fl);
    memcpy(sw->tmp + fl, ".tmp", 5);
    sw->fd = open(sw->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (sw->fd < 0) return zy_fail(err, "%s: cannot create: %s", sw->tmp, strerror(errno));
    sw->tokens = sw->documents = 0;
    sw->crc = 0;
    sw->buf_len = 0;
    uint8_t zero[SHARD_HEADER_SIZE] = {0}; /* placeholder until the counts and CRC are known */
    if (write_all(sw->fd, zero, sizeof zero, sw->tmp, err)) return -1;
    return 0;
}

static int close_shard(ShardWriter *w, ShardSplit s, ZyErr *err) {
    SplitWriter *sw = &w->sp[s];
    if (sw->fd < 0) return 0;
    if (flush_buf(sw, err)) return -1;
    ShardHeader h = {SHARD_VERSION, (uint32_t)w->width, sw->crc, (uint32_t)w->vocab, sw->tokens, sw->documents};
    uint8_t hdr[SHARD_HEADER_SIZE];
    shard_header_encode(&h, hdr);
    if (pwrite(sw->fd, hdr, sizeof hdr, 0) != (ssize_t)sizeof hdr)
        return zy_fail(err, "%s: header write failed: %s", sw->tmp, strerror(errno));
    if (fsync(sw->fd) != 0) return zy_fail(err, "%s: fsync failed: %s", sw->tmp, strerror(errno));
    int rc = close(sw->fd);
    sw->fd = -1;
    if (rc != 0) return zy_fail(err, "%s: close failed: %s", sw->tmp, strerror(errno));
    if (rename(sw->tmp, sw->final) != 0) return zy_fail(err, "%s: rename failed: %s", sw->final, strerror(errno));
    ShardMetaSplit *d = &sw->done;
    if (d->n_shards == sw->cap) {
        int cap = sw->cap ? 2 * sw->cap : 16;
        ShardMetaEntry *e = realloc(d->shards, (size_t)cap * sizeof *e);
        if (!e) return zy_fail(err, "out of memory");
        d->shards = e;
        sw->cap = cap;
    }
    ShardMetaEntry *e = &d->shards[d->n_shards++];
    memset(e, 0, sizeof *e);
    const char *slash = strrchr(sw->final, '/');
    snprintf(e->file, sizeof e->file, "%s", slash ? slash + 1 : sw->final);
    e->tokens = sw->tokens;
    e->documents = sw->documents;
    e->crc32 = sw->crc;
    d->tokens += sw->tokens;
    d->documents += sw->documents;
    return 0;
}

int shardwriter_append(ShardWriter *w, ShardSplit split, const int32_t *tokens, size_t n, ZyErr *err) {
    if ((unsigned)split >= SHARD_NUM_SPLITS) return zy_fail(err, "shard writer: bad split %d", (int)split);
    if (w->finished) return zy_fail(err, "shard writer: append after finish");
    SplitWriter *sw = &w->sp[split];
    for (size_t i = 0; i < n; i++) /* check first: a rejected call leaves the stream untouched */
        if (tokens[i] < 0 || tokens[i] >= w->vocab)
            return zy_fail(err, "shard writer: token id %d is outside the vocabulary (size %d)", (int)tokens[i],
                           w->vocab);
    for (size_t i = 0; i < n; i++) {
        int32_t t = tokens[i];
        if (sw->fd >= 0 && sw->tokens == w->max_tokens && close_shard(w, split, err)) return -1;
        if (sw->fd < 0 && open_shard(w, split, err)) return -1;
        if (sw->buf_len + (size_t)w->width > WBUF_BYTES && flush_buf(sw, err)) return -1;
        uint8_t *p = sw->buf + sw->buf_len;
        p[0] = (uint8_t)t;
        p[1] = (uint8_t)(t >> 8);
        if (w->width == 4) {
            p[2] = (uint8_t)(t >> 16);
            p[3] = (uint8_t)(t >> 24);
        }
        sw->buf_len += (size_t)w->width;
        sw->tokens++;
    }
    sw->pending_doc_tokens += n;
    return 0;
}

int shardwriter_end_document(ShardWriter *w, ShardSplit split, ZyErr *err) {
    if ((unsigned)split >= SHARD_NUM_SPLITS) return zy_fail(err, "shard writer: bad split %d", (int)split);
    SplitWriter *sw = &w->sp[split];
    if (sw->pending_doc_tokens == 0 || sw->fd < 0) return zy_fail(err, "shard writer: empty document");
    sw->documents++; /* counted in the shard holding its last token */
    sw->pending_doc_tokens = 0;
    return 0;
}

int shardwriter_add_document(ShardWriter *w, ShardSplit split, const int32_t *tokens, size_t n, ZyErr *err) {
    if (shardwriter_append(w, split, tokens, n, err)) return -1;
    return shardwriter_end_document(w, split, err);
}

void shardwriter_counts(const ShardWriter *w, ShardSplit split, uint64_t *tokens, uint64_t *documents,
                        int *n_shards) {
    const SplitWriter *sw = &w->sp[split];
    int open = sw->fd >= 0;
    if (tokens) *tokens = sw->done.tokens + (open ? sw->tokens : 0);
    if (documents) *documents = sw->done.documents + (open ? sw->documents : 0);
    if (n_shards) *n_shards = sw->done.n_shards + open;
}

static cJSON *split_json(const ShardMetaSplit *d) {
    cJSON *o = cJSON_CreateObject(), *arr = cJSON_CreateArray();
    if (!o || !arr) {
        cJSON_Delete(o);
        cJSON_Delete(arr);
        return NULL;
    }
    cJSON_AddNumberToObject(o, "tokens", (double)d->tokens);
    cJSON_AddNumberToObject(o, "documents", (double)d->documents);
    cJSON_AddItemToObject(o, "shards", arr);
    for (int i = 0; i < d->n_shards; i++) {
        cJSON *e = cJSON_CreateObject();
        if (!e) {
            cJSON_Delete(o);
            return NULL;
        }
        cJSON_AddStringToObject(e, "file", d->shards[i].file);
        cJSON_AddNumberToObject(e, "tokens", (double)d->shards[i].tokens);
        cJSON_AddNumberToObject(e, "documents", (double)d->shards[i].documents);
        cJSON_AddNumberToObject(e, "crc32", (double)d->shards[i].crc32);
        cJSON_AddItemToArray(arr, e);
    }
    return o;
}

int shardwriter_finish(ShardWriter *w, ZyErr *err) {
    if (w->finished) return zy_fail(err, "shard writer: finished twice");
    for (int s = 0; s < SHARD_NUM_SPLITS; s++) {
        if (w->sp[s].pending_doc_tokens)
            return zy_fail(err, "shard writer: split %s ends inside a document (missing end_document)",
                           shard_split_name((ShardSplit)s));
        if (close_shard(w, (ShardSplit)s, err)) return -1;
    }
    cJSON *root = cJSON_CreateObject();
    if (!root) return zy_fail(err, "out of memory");
    cJSON_AddStringToObject(root, "format", "zaya-shards");
    cJSON_AddNumberToObject(root, "format_version", SHARD_VERSION);
    cJSON_AddNumberToObject(root, "vocab_size", w->vocab);
    cJSON_AddStringToObject(root, "dtype", w->width == 2 ? "uint16" : "uint32");
    if (w->has_tokenizer) {
        cJSON *t = cJSON_AddObjectToObject(root, "tokenizer");
        if (t) {
            cJSON_AddStringToObject(t, "file", w->tokenizer_file);
            cJSON_AddNumberToObject(t, "crc32", (double)w->tokenizer_crc);
        }
    } else {
        cJSON_AddNullToObject(root, "tokenizer");
    }
    cJSON *splits = cJSON_AddObjectToObject(root, "splits");
    for (int s = 0; s < SHARD_NUM_SPLITS && splits; s++) {
        cJSON *sj = split_json(&w->sp[s].done);
        if (!sj) break;
        cJSON_AddItemToObject(splits, shard_split_name((ShardSplit)s), sj);
    }
    char *json = cJSON_Print(root);
    cJSON_Delete(root);
    size_t len = json ? strlen(json) : 0;
    char *text = json ? realloc(json, len + 2) : NULL;
    if (!text) {
        free(json);
        return zy_fail(err, "out of memory");
    }
    text[len++] = '\n';
    text[len] = '\0';
    char path[PATH_CAP];
    int rc = zy_path_join(path, sizeof path, w->dir, "meta.json", err);
    if (!rc) rc = zy_write_file_atomic(path, text, len, err);
    free(text);
    if (rc) return -1;
    /* make the renames durable */
    int dfd = open(w->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        (void)fsync(dfd);
        close(dfd);
    }
    w->finished = 1;
    return 0;
}

void shardwriter_close(ShardWriter *w) {
    if (!w) return;
    for (int s = 0; s < SHARD_NUM_SPLITS; s++) {
        SplitWriter *sw = &w->sp[s];
        if (sw->fd >= 0) {
            close(sw->fd);
            unlink(sw->tmp);
        }
        free(sw->buf);
        free(sw->done.shards);
    }
    free(w);
}

/* ------------------------------------------------------------------------------------------------ reader */

typedef struct {
    char path[PATH_CAP];
    int fd;
    uint64_t start, tokens;      /* position of its first token in the split's stream */
    uint64_t last_page;          /* page the previous read ended on, +1 (0: none), for the page accounting */
} ReaderShard;

struct ShardSet {
    int vocab, width;
    uint64_t tokens, documents;
    int n;
    ReaderShard *shards;
    uint64_t pages_read, bytes_requested, bytes_read; /* updated with relaxed atomics */
};

uint64_t shardset_num_tokens(const ShardSet *s) { return s->tokens; }
int shardset_vocab_size(const ShardSet *s) { return s->vocab; }
uint64_t shardset_num_documents(const ShardSet *s) { return s->documents; }
int shardset_token_width(const ShardSet *s) { return s->width; }

void shardset_close(ShardSet *s) {
    if (!s) return;
    for (int i = 0; i < s->n; i++)
        if (s->shards[i].fd >= 0) close(s->shards[i].fd);
    free(s->shards);
    free(s);
}

static int pread_all(int fd, void *buf, size_t len, uint64_t off, const char *path, ZyErr *err) {
    uint8_t *p = buf;
    while (len > 0) {
        ssize_t n = pread(fd, p, len, (off_t)off);
        if (n < 0) {
            if (errno == EINTR) continue;
            return zy_fail(err, "%s: read failed: %s", path, strerror(errno));
        }
        if (n == 0) return zy_fail(err, "%s: truncated: unexpected end of file at byte %llu", path,
                                   (unsigned long long)off);
        p += n;
        len -= (size_t)n;
        off += (uint64_t)n;
    }
    return 0;
}

static int open_shard_file(ShardSet *set, ReaderShard *rs, const ShardMeta *meta, const ShardMetaEntry *me,
                           const char *meta_path, int verify_crc, ZyErr *err) {
    rs->fd = open(rs->path, O_RDONLY | O_CLOEXEC);
    if (rs->fd < 0)
        return zy_fail(err, "%s: cannot open shard listed in %s: %s", rs->path, meta_path, strerror(errno));
    struct stat st;
    if (fstat(rs->fd, &st) != 0) return zy_fail(err, "%s: cannot stat: %s", rs->path, strerror(errno));
    if (!S_ISREG(st.st_mode)) return zy_fail(err, "%s: not a regular file", rs->path);
    uint64_t size = (uint64_t)st.st_size;
    uint8_t hb[SHARD_HEADER_SIZE];
    size_t hl = size < SHARD_HEADER_SIZE ? (size_t)size : SHARD_HEADER_SIZE;
    if (pread_all(rs->fd, hb, hl, 0, rs->path, err)) return -1;
    ShardHeader h;
    if (shard_header_parse(hb, hl, rs->path, &h, err)) return -1;
    uint64_t want = SHARD_HEADER_SIZE + h.tokens * h.width;
    if (size != want)
        return zy_fail(err, "%s: %s: header says %llu tokens (%llu bytes) but the file has %llu bytes", rs->path,
                       size < want ? "truncated" : "trailing bytes", (unsigned long long)h.tokens,
                       (unsigned long long)want, (unsigned long long)size);
#define DISAGREE(what, a, b)                                                                                  \
    zy_fail(err, "%s disagrees with %s: %s %llu in meta.json, %llu in the shard header", meta_path, rs->path, \
            what, (unsigned long long)(a), (unsigned long long)(b))
    if (h.width != (uint32_t)meta->token_width) return DISAGREE("token width", meta->token_width, h.width);
    if (h.vocab_size != (uint32_t)meta->vocab_size) return DISAGREE("vocab size", meta->vocab_size, h.vocab_size);
    if (h.tokens != me->tokens) return DISAGREE("token count", me->tokens, h.tokens);
    if (h.documents != me->documents) return DISAGREE("document count", me->documents, h.documents);
    if (h.payload_crc != me->crc32) return DISAGREE("payload CRC", me->crc32, h.payload_crc);
#undef DISAGREE
    if (verify_crc) {
        size_t cap = 1u << 20;
        uint8_t *buf = malloc(cap);
        if (!buf) return zy_fail(err, "out of memory");
        uint32_t crc = 0;
        uint64_t left = size - SHARD_HEADER_SIZE, off = SHARD_HEADER_SIZE;
        while (left > 0) {
            size_t n = left > cap ? cap : (size_t)left;
            if (pread_all(rs->fd, buf, n, off, rs->path, err)) {
                free(buf);
                return -1;
            }
            crc = zy_crc32(crc, buf, n);
            left -= n;
            off += n;
        }
        free(buf);
        if (crc != h.payload_crc)
            return zy_fail(err, "%s: payload CRC mismatch (header 0x%08x, data 0x%08x): corrupt token data", rs->path,
                           h.payload_crc, crc);
    }
    (void)set;
    return 0;
}

int shardset_open(ShardSet **out, const char *dir, const char *split, int verify_crc, ZyErr *err) {
    *out = NULL;
    int k = split ? split_from_name(split) : -1;
    if (k < 0) return zy_fail(err, "%s: unknown split \"%s\" (expected train or val)", dir, split ? split : "(null)");
    char meta_path[PATH_CAP];
    if (zy_path_join(meta_path, sizeof meta_path, dir, "meta.json", err)) return -1;
    char *text;
    size_t len;
    if (zy_read_file(meta_path, &text, &len, err)) return -1;
    ShardMeta meta;
    int rc = shard_meta_parse(text, len, meta_path, &meta, err);
    free(text);
    if (rc) return -1;
    const ShardMetaSplit *ms = &meta.split[k];
    ShardSet *s = calloc(1, sizeof *s);
    if (!s || !(s->shards = calloc((size_t)ms->n_shards + 1, sizeof *s->shards))) {
        free(s);
        shard_meta_free(&meta);
        return zy_fail(err, "out of memory");
    }
    s->vocab = meta.vocab_size;
    s->width = meta.token_width;
    s->documents = ms->documents;
    for (int i = 0; i < ms->n_shards; i++) s->shards[i].fd = -1;
    s->n = ms->n_shards;
    uint64_t start = 0;
    for (int i = 0; i < ms->n_shards; i++) {
        ReaderShard *rs = &s->shards[i];
        if (zy_path_join(rs->path, sizeof rs->path, dir, ms->shards[i].file, err) ||
            open_shard_file(s, rs, &meta, &ms->shards[i], meta_path, verify_crc, err)) {
            shardset_close(s);
            shard_meta_free(&meta);
            return -1;
        }
        rs->start = start;
        rs->tokens = ms->shards[i].tokens;
        start += rs->tokens;
    }
    s->tokens = start;
    shard_meta_free(&meta);
    *out = s;
    return 0;
}

/* Index of the shard holding stream position pos (< s->tokens). */
static int find_shard(const ShardSet *s, uint64_t pos) {
    int lo = 0, hi = s->n - 1;
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (s->shards[mid].start <= pos)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

static void account_pages(ShardSet *s, ReaderShard *rs, uint64_t byte_off, size_t len) {
    uint64_t first = byte_off / SHARD_PAGE_SIZE, last = (byte_off + len - 1) / SHARD_PAGE_SIZE;
    uint64_t pages = last - first + 1;
    if (__atomic_load_n(&rs->last_page, __ATOMIC_RELAXED) == first + 1) pages--; /* still cached */
    __atomic_store_n(&rs->last_page, last + 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&s->pages_read, pages, __ATOMIC_RELAXED);
    __atomic_fetch_add(&s->bytes_read, (uint64_t)len, __ATOMIC_RELAXED);
}

int shardset_read(ShardSet *s, uint64_t offset, size_t n, int32_t *out, ZyErr *err) {
    if (offset > s->tokens || n > s->tokens - offset)
        return zy_fail(err, "token range [%llu, %llu) is past the end of the stream (%llu tokens)",
                       (unsigned long long)offset, (unsigned long long)offset + (unsigned long long)n,
                       (unsigned long long)s->tokens);
    if (n == 0) return 0;
    __atomic_fetch_add(&s->bytes_requested, (uint64_t)n * (uint64_t)s->width, __ATOMIC_RELAXED);
    int i = find_shard(s, offset);
    size_t done = 0;
    while (done < n) {
        ReaderShard *rs = &s->shards[i];
        uint64_t local = offset + done - rs->start;
        size_t take = n - done;
        if (take > rs->tokens - local) take = (size_t)(rs->tokens - local);
        int32_t *dst = out + done;
        uint64_t byte_off = SHARD_HEADER_SIZE + local * (uint64_t)s->width;
        size_t nbytes = take * (size_t)s->width;
        /* u16 ids are read into the upper half of dst and widened front to back: each 4-byte store lands
         * below every 2-byte value not yet loaded. */
        uint8_t *raw = (uint8_t *)dst + (s->width == 2 ? take * 2 : 0);
        if (pread_all(rs->fd, raw, nbytes, byte_off, rs->path, err)) return -1;
        account_pages(s, rs, byte_off, nbytes);
        for (size_t j = 0; j < take; j++) {
            const uint8_t *p = raw + j * (size_t)s->width;
            uint32_t v = s->width == 2 ? (uint32_t)p[0] | (uint32_t)p[1] << 8 : get_u32(p);
            if (v >= (uint32_t)s->vocab)
                return zy_fail(err, "%s: token id %u at position %llu of the shard (stream offset %llu) is outside the "
                               "vocabulary (size %d)", rs->path, v, (unsigned long long)(local + j),
                               (unsigned long long)(rs->start + local + j), s->vocab);
            dst[j] = (int32_t)v;
        }
        done += take;
        i++;
    }
    return 0;
}

void shardset_io_stats(const ShardSet *s, uint64_t *pages_read, uint64_t *pages_needed, uint64_t *bytes_read) {
    uint64_t req = __atomic_load_n(&s->bytes_requested, __ATOMIC_RELAXED);
    if (pages_read) *pages_read = __atomic_load_n(&s->pages_read, __ATOMIC_RELAXED);
    if (pages_needed) *pages_needed = (req + SHARD_PAGE_SIZE - 1) / SHARD_PAGE_SIZE;
    if (bytes_read) *bytes_read = __atomic_load_n(&s->bytes_read, __ATOMIC_RELAXED);
}

void shardset_reset_io_stats(ShardSet *s) {
    __atomic_store_n(&s->pages_read, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&s->bytes_requested, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&s->bytes_read, 0, __ATOMIC_RELAXED);
    for (int i = 0; i < s->n; i++) __atomic_store_n(&s->shards[i].last_page, 0, __ATOMIC_RELAXED);
}
