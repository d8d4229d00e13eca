/* data_prepare: walks the inputs, splits them into documents, tokenizes batches of documents in parallel and
 * appends them in input order to a shard writer (so the output does not depend on the thread count). */
#include "data/data_prepare.h"
#include "util/lines.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define PATH_CAP 4096
#define BATCH_DOCS 1024
#define BATCH_BYTES (8u << 20)
#define EOT_LINE "<|endoftext|>"
#define MAX_WARNINGS_PER_FILE 20

int data_prepare_is_val(uint64_t seed, uint64_t doc_index, double val_fraction) {
    if (val_fraction <= 0) return 0;
    if (val_fraction >= 1) return 1;
    /* splitmix64 finaliser of (seed, index): an independent uniform draw per document */
    uint64_t z = seed ^ (doc_index * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double)(z >> 11) * (1.0 / 9007199254740992.0) < val_fraction;
}

/* ------------------------------------------------------------------------------------------- input files */

typedef struct {
    char **paths;
    int n, cap;
} PathList;

static void paths_free(PathList *l) {
    for (int i = 0; i < l->n; i++) free(l->paths[i]);
    free(l->paths);
    memset(l, 0, sizeof *l);
}

static int paths_add(PathList *l, const char *p, ZyErr *err) {
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 64;
        char **np = realloc(l->paths, (size_t)cap * sizeof *np);
        if (!np) return zy_fail(err, "out of memory");
        l->paths = np;
        l->cap = cap;
    }
    if (!(l->paths[l->n] = strdup(p))) return zy_fail(err, "out of memory");
    l->n++;
    return 0;
}

static int has_ext(const char *p, const char *ext) {
    size_t n = strlen(p), e = strlen(ext);
    return n > e && strcmp(p + n - e, ext) == 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int walk(const char *dir, int depth, PathList *out, ZyErr *err) {
    if (depth > 64) return zy_fail(err, "%s: directories nested too deep (a symlink loop?)", dir);
    DIR *d = opendir(dir);
    if (!d) return zy_fail(err, "%s: cannot open directory: %s", dir, strerror(errno));
    PathList names = {0};
    struct dirent *e;
    int rc = 0;
    while (!rc && (e = readdir(d)))
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) rc = paths_add(&names, e->d_name, err);
    closedir(d);
    if (!rc) qsort(names.paths, (size_t)names.n, sizeof *names.paths, cmp_str);
    for (int i = 0; i < names.n && !rc; i++) {
        char p[PATH_CAP];
        struct stat st;
        if ((rc = zy_path_join(p, sizeof p, dir, names.paths[i], err))) break;
        if (stat(p, &st) != 0) continue; /* dangling link */
        if (S_ISDIR(st.st_mode))
            rc = walk(p, depth + 1, out, err);
        else if (S_ISREG(st.st_mode) && (has_ext(p, ".txt") || has_ext(p, ".jsonl")))
            rc = paths_add(out, p, err);
    }
    paths_free(&names);
    return rc;
}

static int collect_inputs(const PrepareOptions *o, PathList *out, ZyErr *err) {
    for (int i = 0; i < o->n_inputs; i++) {
        struct stat st;
        const char *p = o->inputs[i];
        if (stat(p, &st) != 0) return zy_fail(err, "%s: cannot read input: %s", p, strerror(errno));
        if (S_ISDIR(st.st_mode)) {
            if (walk(p, 0, out, err)) return -1;
        } else if (has_ext(p, ".txt") || has_ext(p, ".jsonl")) {
            if (paths_add(out, p, err)) return -1;
        } else {
            return zy_fail(err, "%s: unsupported input (expected a .txt or .jsonl file, or a directory)", p);
        }
    }
    if (out->n == 0) return zy_fail(err, "no .txt or .jsonl files in the inputs");
    return 0;
}

/* -------------------------------------------------------------------------------------------- batching */

typedef struct {
    char *text;
    size_t len;
    const char *file;
    uint64_t line;
    ShardSplit split;
    int32_t *ids;
    size_t n_ids;
    int rc;
    double seconds;
    char *error; /* malloc'ed message when rc != 0 */
} Doc;

typedef struct {
    const PrepareOptions *opt;
    const PrepareEncoder *enc;
    PrepareReport *rep;
    ShardWriter *w;
    Doc docs[BATCH_DOCS];
    int n;
    size_t bytes;
    uint64_t next_index; /* documents accepted so far, for the val draw */
    uint64_t file_malformed; /* in the current file: only the first few are printed */
    int32_t *buf;        /* ids + eos */
    size_t buf_cap;
} Prep;

static void doc_clear(Doc *d) {
    free(d->text);
    free(d->ids);
    free(d->error);
    memset(d, 0, sizeof *d);
}

static int flush_batch(Prep *p, ZyErr *err) {
    const PrepareEncoder *enc = p->enc;
    int n = p->n, threads = p->rep->threads;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (int i = 0; i < n; i++) {
        Doc *d = &p->docs[i];
        ZyErr e = {{0}};
        double t0 = zy_now_seconds();
        d->rc = enc->encode(enc->ctx, omp_get_thread_num(), d->text, d->len, &d->ids, &d->n_ids, &e);
        d->seconds = zy_now_seconds() - t0;
        if (d->rc) d->error = strdup(e.msg);
    }
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        Doc *d = &p->docs[i];
        if (d->rc) {
            rc = zy_fail(err, "%s:%llu: tokenizer: %s", d->file, (unsigned long long)d->line,
                         d->error ? d->error : "failed");
            break;
        }
        double t0 = zy_now_seconds();
        size_t lead = enc->bos_id >= 0, need = lead + d->n_ids + 1;
        if (need > p->buf_cap) {
            int32_t *nb = realloc(p->buf, need * sizeof *nb);
            if (!nb) {
                rc = zy_fail(err, "out of memory");
                break;
            }
            p->buf = nb;
            p->buf_cap = need;
        }
        if (lead) p->buf[0] = enc->bos_id;
        if (d->n_ids) memcpy(p->buf + lead, d->ids, d->n_ids * sizeof *p->buf);
        p->buf[need - 1] = enc->eos_id;
        if (shardwriter_add_document(p->w, d->split, p->buf, need, err)) {
            rc = zy_wrap(err, "%s:%llu", d->file, (unsigned long long)d->line);
            break;
        }
        p->rep->documents[d->split]++;
        p->rep->tokens[d->split] += need;
        p->rep->bytes[d->split] += d->len;
        p->rep->seconds[d->split] += d->seconds + (zy_now_seconds() - t0);
    }
    for (int i = 0; i < n; i++) doc_clear(&p->docs[i]);
    p->n = 0;
    p->bytes = 0;
    return rc;
}

/* Takes ownership of text. */
static int add_doc(Prep *p, char *text, size_t len, const char *file, uint64_t line, ZyErr *err) {
    if (len == 0) {
        free(text);
        p->rep->empty_documents++;
        return 0;
    }
    Doc *d = &p->docs[p->n++];
    d->text = text;
    d->len = len;
    d->file = file;
    d->line = line;
    d->split = data_prepare_is_val(p->opt->seed, p->next_index++, p->opt->val_fraction) ? SHARD_VAL : SHARD_TRAIN;
    p->bytes += len;
    if (p->n == BATCH_DOCS || p->bytes >= BATCH_BYTES) return flush_batch(p, err);
    return 0;
}

/* A line that is no document: what (naming file:line and why) fails the run under --strict, else is warned about
 * and the line skipped. */
static int malformed(Prep *p, const ZyLines *r, const char *what, ZyErr *err) {
    if (p->opt->strict) return zy_fail(err, "%s (--strict)", what);
    p->rep->malformed_lines++;
    p->file_malformed++;
    if (p->opt->warn && p->file_malformed <= MAX_WARNINGS_PER_FILE)
        fprintf(p->opt->warn, "zaya: warning: %s; line skipped\n", what);
    if (p->opt->warn && p->file_malformed == MAX_WARNINGS_PER_FILE + 1)
        fprintf(p->opt->warn, "zaya: warning: %s: more malformed lines, not shown (counted in the summary)\n", r->path);
    return 0;
}

static void strip_eol(char *s, size_t *n) {
    if (*n && s[*n - 1] == '\n') s[--*n] = '\0';
    if (*n && s[*n - 1] == '\r') s[--*n] = '\0';
}

static int read_jsonl(Prep *p, ZyLines *r, ZyErr *err) {
    int rc = 0, got = 0;
    while (!rc && (got = zy_lines_next(r, err)) > 0) {
        ZyErr why;
        cJSON *j = zy_lines_json(r, "a JSON object with a \"text\" string", &why);
        const cJSON *t = cJSON_IsObject(j) ? cJSON_GetObjectItemCaseSensitive(j, "text") : NULL;
        if (!cJSON_IsString(t) || !t->valuestring) {
            if (j)
                zy_lines_fail(r, &why, "%s", !cJSON_IsObject(j) ? "not a JSON object" : !t ? "missing \"text\""
                                                                                     : "\"text\" is not a string");
            rc = malformed(p, r, why.msg, err);
        } else {
            size_t len = strlen(t->valuestring);
            char *text = malloc(len + 1);
            if (!text)
                rc = zy_fail(err, "out of memory");
            else {
                memcpy(text, t->valuestring, len + 1);
                rc = add_doc(p, text, len, r->path, (uint64_t)r->lineno, err);
            }
        }
        cJSON_Delete(j);
    }
    if (!rc && got < 0) rc = -1;
    return rc;
}

/* A whole file is a document; a line holding only <|endoftext|> ends one. The newline before it is not part of
 * the document. */
static int read_txt(Prep *p, ZyLines *r, ZyErr *err) {
    char *doc = NULL;
    size_t dlen = 0, dcap = 0;
    uint64_t start = 1;
    int rc = 0, got = 0;
    while (!rc && (got = zy_lines_next(r, err)) > 0) {
        if (r->len == sizeof EOT_LINE - 1 && memcmp(r->line, EOT_LINE, r->len) == 0) {
            if (doc) strip_eol(doc, &dlen);
            rc = add_doc(p, doc, dlen, r->path, start, err);
            doc = NULL;
            dlen = dcap = 0;
            start = (uint64_t)r->lineno + 1;
            continue;
        }
        const size_t eol = strlen(r->eol), n = r->len + eol; /* the line as it stands in the file */
        if (dlen + n + 1 > dcap) {
            size_t nc = dcap ? dcap : 4096;
            while (nc < dlen + n + 1) nc *= 2;
            char *nd = realloc(doc, nc);
            if (!nd) {
                rc = zy_fail(err, "out of memory");
                break;
            }
            doc = nd;
            dcap = nc;
        }
        memcpy(doc + dlen, r->line, r->len);
        memcpy(doc + dlen + r->len, r->eol, eol);
        dlen += n;
        doc[dlen] = '\0';
    }
    if (!rc && got < 0) rc = -1;
    if (!rc && (dlen > 0 || start == 1)) { /* nothing after a final separator is not an empty document */
        if (doc) strip_eol(doc, &dlen);
        rc = add_doc(p, doc, dlen, r->path, start, err);
        doc = NULL;
    }
    free(doc);
    return rc;
}

/* ------------------------------------------------------------------------------------------ output dir */

static int is_our_file(const char *name) {
    if (strcmp(name, "meta.json") == 0) return 1;
    const char *rest = strncmp(name, "train-", 6) == 0 ? name + 6 : strncmp(name, "val-", 4) == 0 ? name + 4 : NULL;
    return rest && (has_ext(rest, ".bin") || has_ext(rest, ".bin.tmp"));
}

/* -1: error, 0: missing or empty, 1: has entries */
static int dir_state(const char *dir, ZyErr *err) {
    struct stat st;
    if (stat(dir, &st) != 0) {
        if (errno == ENOENT) return 0;
        return zy_fail(err, "%s: %s", dir, strerror(errno));
    }
    if (!S_ISDIR(st.st_mode)) return zy_fail(err, "%s: exists and is not a directory", dir);
    DIR *d = opendir(dir);
    if (!d) return zy_fail(err, "%s: cannot open directory: %s", dir, strerror(errno));
    int any = 0;
    for (struct dirent *e; !any && (e = readdir(d));) any = strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(d);
    return any;
}

/* Removes every file of a directory made by this run, then the directory. */
static void remove_tmp_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (d) {
        for (struct dirent *e; (e = readdir(d));) {
            char p[PATH_CAP];
            if (is_our_file(e->d_name) && zy_path_join(p, sizeof p, dir, e->d_name, NULL) == 0) unlink(p);
        }
        closedir(d);
    }
    rmdir(dir);
}

/* Moves the finished shards from tmp into out: a missing or empty out is replaced by tmp in one rename; a
 * non-empty out (allowed by --force) loses its old meta.json first, then its old shards, and gets the new
 * shards and, last, the new meta.json. */
static int publish(const char *tmp, const char *out, ZyErr *err) {
    int state = dir_state(out, err);
    if (state < 0) return -1;
    if (state == 0) {
        rmdir(out);
        if (rename(tmp, out) != 0) return zy_fail(err, "%s: cannot move shards into place: %s", out, strerror(errno));
        return 0;
    }
    char p[PATH_CAP], q[PATH_CAP];
    if (zy_path_join(p, sizeof p, out, "meta.json", err)) return -1;
    if (unlink(p) != 0 && errno != ENOENT) return zy_fail(err, "%s: cannot remove: %s", p, strerror(errno));
    DIR *d = opendir(out);
    if (!d) return zy_fail(err, "%s: cannot open directory: %s", out, strerror(errno));
    for (struct dirent *e; (e = readdir(d));)
        if (is_our_file(e->d_name) && zy_path_join(p, sizeof p, out, e->d_name, NULL) == 0) unlink(p);
    closedir(d);
    PathList names = {0};
    d = opendir(tmp);
    if (!d) return zy_fail(err, "%s: cannot open directory: %s", tmp, strerror(errno));
    int rc = 0;
    for (struct dirent *e; !rc && (e = readdir(d));)
        if (is_our_file(e->d_name) && strcmp(e->d_name, "meta.json") != 0) rc = paths_add(&names, e->d_name, err);
    closedir(d);
    if (!rc) rc = paths_add(&names, "meta.json", err);
    for (int i = 0; i < names.n && !rc; i++) {
        if (zy_path_join(p, sizeof p, tmp, names.paths[i], err) || zy_path_join(q, sizeof q, out, names.paths[i], err))
            rc = -1;
        else if (rename(p, q) != 0)
            rc = zy_fail(err, "%s: cannot move into place: %s", q, strerror(errno));
    }
    paths_free(&names);
    if (!rc) rmdir(tmp);
    return rc;
}

/* ------------------------------------------------------------------------------------------------ driver */

int data_prepare(const PrepareOptions *opt, const PrepareEncoder *enc, PrepareReport *rep, ZyErr *err) {
    double t0 = zy_now_seconds();
    memset(rep, 0, sizeof *rep);
    if (!(opt->val_fraction >= 0 && opt->val_fraction <= 1))
        return zy_fail(err, "prepare: --val-fraction must be in [0, 1], got %g", opt->val_fraction);
    if (enc->vocab_size < 1 || enc->eos_id < 0 || enc->eos_id >= enc->vocab_size || enc->bos_id >= enc->vocab_size)
        return zy_fail(err, "prepare: tokenizer has vocabulary size %d, end-of-sequence id %d, bos id %d",
                       enc->vocab_size, enc->eos_id, enc->bos_id);
    char out[PATH_CAP - 32], tmp[PATH_CAP];
    size_t ol = strlen(opt->out_dir);
    while (ol > 1 && opt->out_dir[ol - 1] == '/') ol--;
    if (ol == 0 || ol >= sizeof out) return zy_fail(err, "prepare: invalid output directory \"%s\"", opt->out_dir);
    memcpy(out, opt->out_dir, ol);
    out[ol] = '\0';
    int state = dir_state(out, err);
    if (state < 0) return -1;
    if (state > 0 && !opt->force)
        return zy_fail(err, "%s: output directory is not empty (use --force to replace its shards)", out);
    PathList files = {0};
    if (collect_inputs(opt, &files, err)) {
        paths_free(&files);
        return -1;
    }
    snprintf(tmp, sizeof tmp, "%s.tmp-%ld", out, (long)getpid());
    if (dir_state(tmp, NULL) != 0) {
        paths_free(&files);
        return zy_fail(err, "%s: temporary directory already exists (left by a crashed run?)", tmp);
    }
    if (zy_mkdirs(tmp, err)) {
        paths_free(&files);
        return -1;
    }
    Prep *p = calloc(1, sizeof *p);
    if (!p) {
        paths_free(&files);
        rmdir(tmp);
        return zy_fail(err, "out of memory");
    }
    p->opt = opt;
    p->enc = enc;
    p->rep = rep;
    rep->threads = opt->threads > 0 ? opt->threads : omp_get_max_threads();
    ShardWriterOptions wo = {enc->vocab_size, 0, opt->max_shard_tokens, opt->tokenizer_file, opt->tokenizer_crc};
    int rc = shardwriter_open(&p->w, tmp, &wo, err);
    for (int i = 0; i < files.n && !rc; i++) {
        const int jsonl = has_ext(files.paths[i], ".jsonl");
        ZyLines r;
        if ((rc = zy_lines_open(&r, files.paths[i], ZY_LINES_SKIP_BOM | (jsonl ? ZY_LINES_SKIP_BLANK : 0), err))) break;
        rep->files++;
        p->file_malformed = 0;
        rc = jsonl ? read_jsonl(p, &r, err) : read_txt(p, &r, err);
        zy_lines_close(&r);
        /* the batch holds pointers to this file's name, which stays valid until paths_free */
    }
    if (!rc) rc = flush_batch(p, err);
    if (!rc && rep->documents[SHARD_TRAIN] + rep->documents[SHARD_VAL] == 0)
        rc = zy_fail(err, "prepare: the inputs hold no documents");
    if (!rc) rc = shardwriter_finish(p->w, err);
    if (!rc)
        for (int s = 0; s < SHARD_NUM_SPLITS; s++) shardwriter_counts(p->w, (ShardSplit)s, NULL, NULL, &rep->shards[s]);
    for (int i = 0; i < p->n; i++) doc_clear(&p->docs[i]);
    shardwriter_close(p->w);
    free(p->buf);
    free(p);
    paths_free(&files);
    if (!rc) rc = publish(tmp, out, err);
    if (rc) remove_tmp_dir(tmp);
    rep->wall_seconds = zy_now_seconds() - t0;
    return rc;
}
