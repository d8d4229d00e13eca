#include "io/checkpoint.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "dist/distributed.h"
#include "io/ckpt_io.h"
#include "io/manifest.h"
#include "io/model_io.h"
#include "io/safetensors.h"


int file_crc32(const char *path, uint32_t *crc, uint64_t *size, ZyErr *err) {
    struct stat st;
    if (stat(path, &st) != 0) return zy_fail(err, "%s: cannot open: %s", path, strerror(errno));
    CkptFileIn in = {.path = path, .lo = 0, .hi = (uint64_t)st.st_size};
    if (ckpt_read_files(&in, 1, err)) return -1;
    *size = (uint64_t)st.st_size;
    *crc = in.crc;
    return 0;
}

static int fsync_path(const char *path, ZyErr *err) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return zy_fail(err, "%s: cannot open for fsync: %s", path, strerror(errno));
    int rc = fsync(fd);
    close(fd);
    if (rc != 0 && errno != EINVAL) return zy_fail(err, "%s: fsync failed: %s", path, strerror(errno));
    return 0;
}

static int step_of(const char *name, long long *step) {
    char tail;
    return sscanf(name, "step-%lld%c", step, &tail) == 1;
}

/* The tensors of a rank's optimizer shard, their data in o's state (names: NAME_CAP bytes each). */
enum { NAME_CAP = 160 };
static int optimizer_tensors(const Model *m, const Optimizer *o, StWriteTensor *ts, char (*names)[NAME_CAP]) {
    const ParamTable *t = &m->params;
    int n = 0;
    for (int i = 0; i < t->count; i++) {
        const ParamInfo *p = &t->info[i];
        if (!param_trainable(p) || !o->owned[i]) continue;
        for (int which = 0; which < 2; which++) {
            if (which == 1 && p->kind == PARAM_MUON) continue; /* Muon keeps one moment; that slot is scratch */
            snprintf(names[n], NAME_CAP, "%s/%s", which ? "exp_avg_sq" : "exp_avg", p->name);
            ts[n] = (StWriteTensor){.name = names[n], .ndim = p->ndim, .src_dtype = ZY_DT_F32, .out_dtype = ZY_DT_F32,
                                    .data = optim_state(o, p, which)};
            memcpy(ts[n].shape, p->shape, sizeof p->shape);
            n++;
        }
    }
    return n;
}

/* model.safetensors as model_save_dir writes it in float32 (loadable by transformers as it is). */
static int model_tensors(const Model *m, StWriteTensor *ts) {
    const ParamTable *t = &m->params;
    for (int i = 0; i < t->count; i++) {
        const ParamInfo *p = &t->info[i];
        ts[i] = (StWriteTensor){.name = p->name, .ndim = p->ndim, .src_dtype = ZY_DT_F32, .out_dtype = ZY_DT_F32,
                                .data = t->data + p->offset};
        memcpy(ts[i].shape, p->shape, sizeof p->shape);
    }
    return t->count;
}
static const char *const model_metadata[] = {"format", "pt", NULL};

/* A file of the snapshot: its image (header and data, byte for byte the file) and the pieces of the live arenas the
 * snapshot copies into it. */
typedef struct {
    CkptImage image;
    size_t len;
    CkptCopy *pieces;
    int n_pieces;
} SnapFile;

/* Lays f out for the tensors (data: the live arenas): the header goes into the image now, the pieces are noted. */
static int snap_layout(SnapFile *f, const char *label, const StWriteTensor *ts, int n, const char *const *meta,
                       ZyErr *err) {
    uint8_t *header = NULL;
    uint64_t *off = malloc((size_t)(n > 0 ? n : 1) * sizeof *off);
    CkptCopy *pieces = realloc(f->pieces, (size_t)(n > 0 ? n : 1) * sizeof *pieces);
    size_t header_len;
    if (pieces) f->pieces = pieces;
    int rc = !off || !pieces ? zy_fail(err, "out of memory") : st_header(label, ts, n, meta, &header, &header_len, off, err);
    if (!rc) {
        f->len = header_len;
        for (int i = 0; i < n; i++) {
            size_t bytes = zy_dtype_size(ts[i].out_dtype);
            for (int k = 0; k < ts[i].ndim; k++) bytes *= (size_t)ts[i].shape[k];
            f->pieces[i] = (CkptCopy){.src = ts[i].data, .len = bytes};
            f->len = off[i] + bytes;
        }
        rc = ckpt_image_reserve(&f->image, f->len, err);
    }
    if (!rc) {
        memcpy(f->image.data, header, header_len);
        for (int i = 0; i < n; i++) f->pieces[i].dst = f->image.data + off[i];
        f->n_pieces = n;
    }
    free(header);
    free(off);
    return rc;
}

static void snap_free(SnapFile *f) {
    ckpt_image_free(&f->image);
    free(f->pieces);
    memset(f, 0, sizeof *f);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* A file whose CRC the writer knows from memory. */
typedef struct {
    char name[64];
    uint32_t crc;
    uint64_t bytes;
} KnownFile;

/* manifest.json: size and CRC-32 of every other file in the directory (model, config, optimizer shards, state); the
 * ones in known[] from the writer's own count, the small rest read back. */
static int write_manifest(const char *dir, int64_t step, int world_size, const KnownFile *known, int n_known,
                          ZyErr *err) {
    DIR *dh = opendir(dir);
    if (!dh) return zy_fail(err, "%s: cannot list: %s", dir, strerror(errno));
    char *names[256];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(dh)) && n < 256)
        if (e->d_name[0] != '.' && strcmp(e->d_name, "manifest.json") != 0 && !strstr(e->d_name, ".tmp."))
            names[n++] = strdup(e->d_name);
    closedir(dh);
    qsort(names, (size_t)n, sizeof *names, cmp_str);
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "format", "zaya-checkpoint");
    cJSON_AddNumberToObject(root, "version", 1);
    cJSON_AddNumberToObject(root, "step", (double)step);
    cJSON_AddNumberToObject(root, "world_size", world_size);
    cJSON *arr = cJSON_AddArrayToObject(root, "files");
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        char path[4096];
        uint32_t crc = 0;
        uint64_t size = 0;
        int k = 0;
        while (k < n_known && strcmp(known[k].name, names[i]) != 0) k++;
        if (k < n_known)
            crc = known[k].crc, size = known[k].bytes;
        else if ((rc = zy_path_join(path, sizeof path, dir, names[i], err)) || (rc = file_crc32(path, &crc, &size, err)))
            break;
        cJSON *f = cJSON_CreateObject();
        cJSON_AddStringToObject(f, "name", names[i]);
        cJSON_AddNumberToObject(f, "bytes", (double)size);
        cJSON_AddNumberToObject(f, "crc32", (double)crc);
        cJSON_AddItemToArray(arr, f);
    }
    for (int i = 0; i < n; i++) free(names[i]);
    char *text = rc ? NULL : cJSON_Print(root);
    cJSON_Delete(root);
    if (rc) return -1;
    char path[4096];
    rc = zy_path_join(path, sizeof path, dir, "manifest.json", err);
    if (!rc) rc = zy_write_file_atomic(path, text, strlen(text), err);
    free(text);
    return rc;
}

int ckpt_list(const char *root, char dirs[][512], int max, ZyErr *err) {
    DIR *d = opendir(root);
    if (!d) {
        if (errno == ENOENT) return 0;
        return zy_fail(err, "%s: cannot list checkpoints: %s", root, strerror(errno));
    }
    long long steps[1024];
    char names[1024][64];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 1024) {
        long long s;
        if (!step_of(e->d_name, &s) || strlen(e->d_name) >= sizeof names[0]) continue;
        steps[n] = s;
        snprintf(names[n], sizeof names[n], "%s", e->d_name);
        n++;
    }
    closedir(d);
    for (int i = 1; i < n; i++) /* newest first */
        for (int j = i; j > 0 && steps[j] > steps[j - 1]; j--) {
            long long ts = steps[j];
            steps[j] = steps[j - 1];
            steps[j - 1] = ts;
            char tn[64];
            memcpy(tn, names[j], sizeof tn);
            memcpy(names[j], names[j - 1], sizeof tn);
            memcpy(names[j - 1], tn, sizeof tn);
        }
    int out = n < max ? n : max;
    for (int i = 0; i < out; i++)
        if (zy_path_join(dirs[i], 512, root, names[i], err)) return -1;
    return out;
}

static void remove_stale_temporaries(const char *root, const char *keep_name) {
    DIR *d = opendir(root);
    if (!d) return;
    struct dirent *e;
    char path[4096];
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, ".tmp-step-", 10) != 0 || strcmp(e->d_name, keep_name) == 0) continue;
        if (snprintf(path, sizeof path, "%s/%s", root, e->d_name) < (int)sizeof path) zy_remove_tree(path);
    }
    closedir(d);
}

/* Every rank learns whether any rank failed (so all take the same branch and nobody waits in a collective). */
static int agree(const Dist *d, int failed, const char *doing, ZyErr *err) {
    int64_t f = failed;
    ZyErr e2;
    if (d && dist_allreduce_max_i64(d, &f, 1, &e2)) return zy_fail(err, "%s", e2.msg);
    if (f && !failed) return zy_fail(err, "another rank failed while %s", doing);
    return f ? -1 : 0;
}

/* An asynchronous save: the main thread snapshots what is saved into the file images (rank 0 model.safetensors,
 * every rank its optimizer shard) and a writer thread per rank writes them while training goes on. No MPI call is
 * made off the main thread: a rank's shard appears under its final name by an atomic rename, then its CRC-32 in a
 * dot-file next to it (or a .failed marker); rank 0's writer waits for those, writes the manifest and publishes.
 * ckpt_wait joins and makes every rank agree on the outcome. The writer and its images outlive a save: the next
 * one reuses them, so a snapshot is a copy into memory that is already there. */
struct CkptWriter {
    pthread_t thread;
    int running;
    int rank, size, keep;
    int64_t step;
    SnapFile model_file; /* rank 0 */
    SnapFile optim_file;
    ZayaConfig cfg;
    char *trainer_state_json, *run_json;
    char root[4096], tmp[4096], final[4096], final_name[64];
    double t_start, seconds;
    int rc;
    ZyErr err;
};

static void shard_name(char *out, size_t cap, int rank, int size) {
    snprintf(out, cap, "optimizer-%05d-of-%05d.safetensors", rank, size);
}

/* Lays out this rank's images for m and o (rank 0 also the model's), reserving their memory. */
static int writer_layout(CkptWriter *w, const Model *m, const Optimizer *o, ZyErr *err) {
    const int count = m->params.count;
    StWriteTensor *ts = calloc((size_t)2 * count + 1, sizeof *ts);
    char(*names)[NAME_CAP] = calloc((size_t)2 * count + 1, sizeof *names);
    char name[64];
    shard_name(name, sizeof name, w->rank, w->size);
    int rc = !ts || !names ? zy_fail(err, "out of memory")
                           : snap_layout(&w->optim_file, name, ts, optimizer_tensors(m, o, ts, names), NULL, err);
    if (!rc && w->rank == 0)
        rc = snap_layout(&w->model_file, "model.safetensors", ts, model_tensors(m, ts), model_metadata, err);
    free(ts);
    free(names);
    return rc;
}

static CkptWriter *writer_new(const Dist *d) {
    CkptWriter *w = calloc(1, sizeof *w);
    if (w) w->rank = d ? d->rank : 0, w->size = d ? d->size : 1;
    return w;
}

int ckpt_writer_prepare(CkptWriter **out, const Model *m, const Optimizer *o, const Dist *d, ZyErr *err) {
    if (!*out && !(*out = writer_new(d))) return zy_fail(err, "out of memory");
    return writer_layout(*out, m, o, err);
}

static int write_small_files(CkptWriter *w) {
    char path[4096];
    int rc = zy_path_join(path, sizeof path, w->tmp, "config.json", &w->err);
    if (!rc) rc = config_save(&w->cfg, path, "float32", &w->err);
    if (!rc) rc = zy_path_join(path, sizeof path, w->tmp, "trainer_state.json", &w->err);
    if (!rc) rc = zy_write_file_atomic(path, w->trainer_state_json, strlen(w->trainer_state_json), &w->err);
    if (!rc && w->run_json) rc = zy_path_join(path, sizeof path, w->tmp, "run.json", &w->err);
    if (!rc && w->run_json) rc = zy_write_file_atomic(path, w->run_json, strlen(w->run_json), &w->err);
    return rc;
}

/* Rank 0: every other rank's shard CRC (its dot-file, written after the shard's rename), or its failure marker;
 * bounded wait. The dot-files go: the published directory holds what it always held. */
static int wait_for_shards(CkptWriter *w, KnownFile *known) {
    const double deadline = zy_now_seconds() + 600.0;
    for (int r = 1; r < w->size; r++) {
        char name[64], path[4200], failed[4300];
        shard_name(name, sizeof name, r, w->size);
        snprintf(path, sizeof path, "%s/.%s.crc32", w->tmp, name);
        snprintf(failed, sizeof failed, "%s/%s.failed", w->tmp, name);
        for (;;) {
            struct stat st;
            if (stat(path, &st) == 0) break;
            if (stat(failed, &st) == 0) return zy_fail(&w->err, "rank %d failed to write its optimizer shard", r);
            if (zy_now_seconds() > deadline) return zy_fail(&w->err, "rank %d's optimizer shard did not appear within 600 s", r);
            struct timespec ts = {0, 2000000};
            nanosleep(&ts, NULL);
        }
        char *text;
        size_t len;
        unsigned crc;
        unsigned long long bytes;
        if (zy_read_file(path, &text, &len, &w->err)) return -1;
        int ok = sscanf(text, "%u %llu", &crc, &bytes) == 2;
        free(text);
        unlink(path);
        if (!ok) return zy_fail(&w->err, "%s: unreadable", path);
        known[r] = (KnownFile){.crc = crc, .bytes = bytes};
        snprintf(known[r].name, sizeof known[r].name, "%s", name);
    }
    return 0;
}

static int publish(CkptWriter *w, const KnownFile *known, int n_known) {
    char path[4096];
    int rc = write_manifest(w->tmp, w->step, w->size, known, n_known, &w->err);
    if (!rc) rc = fsync_path(w->tmp, &w->err);
    struct stat st;
    if (!rc && stat(w->final, &st) == 0) {
        /* never overwrite a published checkpoint: move the old one aside (kept, not deleted) */
        char aside[4200];
        snprintf(aside, sizeof aside, "%s.replaced-%lld", w->final, (long long)time(NULL));
        if (rename(w->final, aside) != 0)
            rc = zy_fail(&w->err, "%s exists and cannot be moved aside: %s", w->final, strerror(errno));
    }
    if (!rc && rename(w->tmp, w->final) != 0) rc = zy_fail(&w->err, "publishing %s failed: %s", w->final, strerror(errno));
    if (!rc) rc = fsync_path(w->root, &w->err);
    if (rc) return rc;
    char line[128];
    int n = snprintf(line, sizeof line, "%s\n", w->final_name);
    if (zy_path_join(path, sizeof path, w->root, "latest", &w->err) || zy_write_file_atomic(path, line, (size_t)n, &w->err))
        return -1;
    w->seconds = zy_now_seconds() - w->t_start; /* written and published; what follows is housekeeping */
    if (w->keep > 0) {
        char dirs[256][512];
        ZyErr ignore;
        int count = ckpt_list(w->root, dirs, 256, &ignore);
        for (int i = w->keep; i < count; i++)
            if (strcmp(dirs[i], w->final) != 0) zy_remove_tree(dirs[i]);
    }
    return 0;
}

static void *writer_main(void *arg) {
    CkptWriter *w = arg;
    char name[64], shard[4200], model[4200];
    shard_name(name, sizeof name, w->rank, w->size);
    snprintf(shard, sizeof shard, "%s/%s", w->tmp, name);
    snprintf(model, sizeof model, "%s/model.safetensors", w->tmp);
    CkptFileOut out[2] = {{.path = shard, .data = w->optim_file.image.data, .len = w->optim_file.len},
                          {.path = model, .data = w->model_file.image.data, .len = w->model_file.len}};
    int rc = ckpt_write_files(out, w->rank == 0 ? 2 : 1, &w->err);
    char side[4300], line[64];
    if (!rc && w->rank > 0) { /* the shard's CRC for rank 0's manifest */
        snprintf(side, sizeof side, "%s/.%s.crc32", w->tmp, name);
        int n = snprintf(line, sizeof line, "%u %llu\n", out[0].crc, (unsigned long long)out[0].len);
        rc = zy_write_file_atomic(side, line, (size_t)n, &w->err);
    }
    if (rc) { /* tell rank 0 at once rather than letting it time out */
        ZyErr ignore;
        snprintf(side, sizeof side, "%s.failed", shard);
        zy_write_file_atomic(side, "", 0, &ignore);
    }
    KnownFile *known = w->rank == 0 ? calloc((size_t)w->size + 1, sizeof *known) : NULL;
    if (!rc && w->rank == 0 && !known) rc = zy_fail(&w->err, "out of memory");
    if (!rc && w->rank == 0) {
        known[0] = (KnownFile){.crc = out[0].crc, .bytes = out[0].len};
        known[w->size] = (KnownFile){.name = "model.safetensors", .crc = out[1].crc, .bytes = out[1].len};
        snprintf(known[0].name, sizeof known[0].name, "%s", name);
        rc = write_small_files(w);
    }
    if (!rc && w->rank == 0) rc = wait_for_shards(w, known);
    if (!rc && w->rank == 0) rc = publish(w, known, w->size + 1);
    if (rc && w->rank == 0) zy_remove_tree(w->tmp);
    free(known);
    w->rc = rc;
    if (w->rank > 0 || rc) w->seconds = zy_now_seconds() - w->t_start;
    return NULL;
}

void ckpt_writer_free(CkptWriter *w) {
    if (!w) return;
    if (w->running) pthread_join(w->thread, NULL); /* an error path: finish the write locally, no collectives */
    snap_free(&w->model_file);
    snap_free(&w->optim_file);
    free(w->trainer_state_json);
    free(w->run_json);
    free(w);
}

int ckpt_save_async(CkptWriter **out, const char *root, int64_t step, const CheckpointContent *c, const Dist *d,
                    int keep, ZyErr *err) {
    if (!*out && !(*out = writer_new(d))) return zy_fail(err, "out of memory");
    CkptWriter *w = *out;
    if (w->running) return zy_fail(err, "ckpt_save_async: the previous save was not waited for");
    w->keep = keep;
    w->step = step;
    w->rc = 0;
    w->cfg = c->model->cfg;
    snprintf(w->final_name, sizeof w->final_name, "step-%08lld", (long long)step);
    char tmp_name[64];
    snprintf(tmp_name, sizeof tmp_name, ".tmp-step-%08lld", (long long)step); /* one name for all ranks */
    int rc = snprintf(w->root, sizeof w->root, "%s", root) >= (int)sizeof w->root ||
             zy_path_join(w->tmp, sizeof w->tmp, root, tmp_name, err) ||
             zy_path_join(w->final, sizeof w->final, root, w->final_name, err);
    if (!rc && w->rank == 0) {
        rc = zy_mkdirs(root, err);
        if (!rc) {
            remove_stale_temporaries(root, "");
            rc = zy_mkdirs(w->tmp, err);
        }
    }
    /* the snapshot: the headers (the same every time) and a copy of the arenas into the images, by every thread */
    if (!rc) rc = writer_layout(w, c->model, c->optim, err);
    const int n_opt = w->optim_file.n_pieces, n_model = w->rank == 0 ? w->model_file.n_pieces : 0;
    CkptCopy *pieces = rc ? NULL : malloc((size_t)(n_opt + n_model + 1) * sizeof *pieces);
    if (!rc && !pieces) rc = zy_fail(err, "out of memory");
    if (!rc) { /* one parallel copy of both files' pieces */
        memcpy(pieces, w->optim_file.pieces, (size_t)n_opt * sizeof *pieces);
        if (n_model) memcpy(pieces + n_opt, w->model_file.pieces, (size_t)n_model * sizeof *pieces);
        ckpt_copy_all(pieces, n_opt + n_model);
    }
    free(pieces);
    if (!rc) {
        free(w->trainer_state_json);
        free(w->run_json);
        w->trainer_state_json = strdup(c->trainer_state_json);
        w->run_json = c->run_json ? strdup(c->run_json) : NULL;
        if (!w->trainer_state_json || (c->run_json && !w->run_json)) rc = zy_fail(err, "out of memory for the checkpoint snapshot");
    }
    if (agree(d, rc, "saving the checkpoint", err)) return -1; /* every rank has its snapshot, rank 0 made the directory */
    w->t_start = zy_now_seconds();
    if (pthread_create(&w->thread, NULL, writer_main, w) != 0) return zy_fail(err, "cannot start the checkpoint writer thread");
    w->running = 1;
    return 0;
}

int ckpt_wait(CkptWriter *w, const Dist *d, char *out_dir, size_t cap, double *seconds, ZyErr *err) {
    int rc = 0;
    if (w && w->running) {
        pthread_join(w->thread, NULL);
        w->running = 0;
        rc = w->rc;
        if (rc) *err = w->err;
        if (out_dir) snprintf(out_dir, cap, "%s", w->final);
        if (seconds) *seconds = w->seconds;
    }
    if (agree(d, rc, "saving the checkpoint", err)) return rc ? zy_wrap(err, "saving checkpoint") : -1;
    return 0;
}

int ckpt_save(const char *root, int64_t step, const CheckpointContent *c, const Dist *d, int keep, char *out_dir,
              size_t cap, ZyErr *err) {
    CkptWriter *w = NULL;
    int rc = ckpt_save_async(&w, root, step, c, d, keep, err);
    if (!rc) rc = ckpt_wait(w, d, out_dir, cap, NULL, err);
    ckpt_writer_free(w);
    return rc;
}

int ckpt_latest(const char *root, char *dir, size_t cap, ZyErr *err) {
    char path[4096], *text;
    size_t len;
    if (zy_path_join(path, sizeof path, root, "latest", err)) return -1;
    if (zy_read_file(path, &text, &len, err)) return zy_fail(err, "%s: no checkpoint to resume from (no 'latest' file)", root);
    while (len > 0 && (text[len - 1] == '\n' || text[len - 1] == ' ')) text[--len] = '\0';
    long long s;
    int ok = step_of(text, &s) && !strchr(text, '/');
    int rc = ok ? zy_path_join(dir, cap, root, text, err) : zy_fail(err, "%s: invalid content \"%.40s\"", path, text);
    free(text);
    return rc;
}

/* Reads and parses dir/manifest.json (path receives its name). */
static int read_manifest(const char *dir, char path[4096], CkptManifest *m, ZyErr *err) {
    char *text;
    size_t len;
    if (zy_path_join(path, 4096, dir, "manifest.json", err)) return -1;
    if (zy_read_file(path, &text, &len, err)) return zy_wrap(err, "checkpoint %s is incomplete", dir);
    int rc = ckpt_manifest_parse(text, len, path, m, err);
    free(text);
    return rc;
}

/* A manifest entry against the bytes found: errors name the file and the mismatch. */
static int check_size(const char *path, const CkptManifestFile *f, ZyErr *err) {
    struct stat st;
    if (stat(path, &st) != 0) return zy_fail(err, "%s: cannot open: %s", path, strerror(errno));
    if ((uint64_t)st.st_size != f->bytes)
        return zy_fail(err, "%s: size %llu, manifest says %llu (truncated or corrupt)", path,
                       (unsigned long long)st.st_size, (unsigned long long)f->bytes);
    return 0;
}

static int check_crc(const char *path, const CkptManifestFile *f, uint32_t got, ZyErr *err) {
    if (got != f->crc32) return zy_fail(err, "%s: CRC-32 %08x, manifest says %08x (corrupt)", path, got, f->crc32);
    return 0;
}

/* Size and CRC-32 of one file against its manifest entry (every byte read). */
static int verify_file(const char *dir, const CkptManifestFile *f, ZyErr *err) {
    char path[4096];
    uint32_t crc = 0;
    uint64_t size = 0;
    if (zy_path_join(path, sizeof path, dir, f->name, err) || check_size(path, f, err) || file_crc32(path, &crc, &size, err))
        return -1;
    return check_crc(path, f, crc, err);
}

int ckpt_verify(const char *dir, ZyErr *err) {
    char path[4096];
    CkptManifest m;
    if (read_manifest(dir, path, &m, err)) return -1;
    /* every size first, then all files' bytes through one queue of readers */
    char(*paths)[4096] = malloc((size_t)m.n_files * sizeof *paths);
    CkptFileIn *in = calloc((size_t)m.n_files, sizeof *in);
    int rc = paths && in ? 0 : zy_fail(err, "out of memory");
    for (int i = 0; i < m.n_files && !rc; i++) {
        rc = zy_path_join(paths[i], sizeof paths[i], dir, m.files[i].name, err) || check_size(paths[i], &m.files[i], err);
        in[i] = (CkptFileIn){.path = paths[i], .lo = 0, .hi = m.files[i].bytes};
    }
    if (!rc) rc = ckpt_read_files(in, m.n_files, err);
    for (int i = 0; i < m.n_files && !rc; i++) rc = check_crc(paths[i], &m.files[i], in[i].crc, err);
    free(paths);
    free(in);
    ckpt_manifest_free(&m);
    return rc;
}

/* ---- loading: every rank reads its part of the files straight into its arenas, every byte checked once ---- */

/* What one rank reads of one file: a contiguous range (its tensors, and what lies between them), the tensors' spans. */
typedef struct {
    char path[4096];
    uint64_t lo, hi;
    CkptSpan *spans;
    long n_spans;
} FilePart;

static int cmp_span(const void *a, const void *b) {
    const CkptSpan *x = a, *y = b;
    return (x->offset > y->offset) - (x->offset < y->offset);
}

/* Spans sorted, the range around them. */
static void part_close(FilePart *fp) {
    qsort(fp->spans, (size_t)fp->n_spans, sizeof *fp->spans, cmp_span);
    fp->lo = fp->n_spans ? fp->spans[0].offset : 0;
    fp->hi = fp->n_spans ? fp->spans[fp->n_spans - 1].offset + fp->spans[fp->n_spans - 1].len : 0;
}

/* model.safetensors as this checkpoint writer lays it out (every tensor of the table, float32, in the table's order,
 * back to back)? Then the spans of the tensors in the arena block [begin, end) go to fp. Else 0: the general
 * loader reads it. */
static int model_part(const StFile *f, const ParamTable *t, size_t begin, size_t end, FilePart *fp) {
    if (f->n_entries != t->count) return 0;
    const uint64_t data_start = (uint64_t)(f->data - (const uint8_t *)f->map);
    size_t next = 0;
    for (int i = 0; i < t->count; i++) {
        const ParamInfo *p = &t->info[i];
        const StEntry *e = st_find(f, p->name);
        if (!e || e->dtype != ZY_DT_F32 || e->ndim != p->ndim || e->offset != next) return 0;
        for (int k = 0; k < p->ndim; k++)
            if (e->shape[k] != p->shape[k]) return 0;
        next += e->nbytes;
    }
    for (int i = 0; i < t->count; i++) {
        const ParamInfo *p = &t->info[i];
        if (p->offset < begin || p->offset >= end) continue;
        const StEntry *e = st_find(f, p->name);
        fp->spans[fp->n_spans++] = (CkptSpan){.offset = data_start + e->offset, .len = e->nbytes, .dst = t->data + p->offset};
    }
    return 1;
}

/* The entries of an optimizer shard that hold state of tensors o owns go to fp; found[2i + which] marks them (the
 * first shard that holds one wins). State is found by tensor name, so a checkpoint saved by N ranks resumes on M. */
static int shard_part(const StFile *f, const ParamTable *t, Optimizer *o, unsigned char *found, FilePart *fp, ZyErr *err) {
    const uint64_t data_start = (uint64_t)(f->data - (const uint8_t *)f->map);
    for (int k = 0; k < f->n_entries; k++) {
        const StEntry *e = &f->entries[k];
        const int which = strncmp(e->name, "exp_avg_sq/", 11) == 0 ? 1 : strncmp(e->name, "exp_avg/", 8) == 0 ? 0 : -1;
        if (which < 0) continue;
        const int i = params_find(t, e->name + (which ? 11 : 8));
        if (i < 0) continue;
        const ParamInfo *p = &t->info[i];
        if (!param_trainable(p) || !o->owned[i] || (which == 1 && p->kind == PARAM_MUON) || found[2 * i + which]) continue;
        if (e->numel != p->numel || e->dtype != ZY_DT_F32)
            return zy_fail(err, "%s: optimizer tensor %s has the wrong shape or dtype", f->label, e->name);
        fp->spans[fp->n_spans++] = (CkptSpan){.offset = data_start + e->offset, .len = e->nbytes, .dst = optim_state(o, p, which)};
        found[2 * i + which] = 1;
    }
    return 0;
}

/* The exchange: per file, every rank's range and its CRC, and (slot `size`) rank 0's of the header. */
enum { X_LO, X_HI, X_CRC, X_N };

/* Whether the ranges of a file tile it exactly; if so *crc is the file's CRC-32. */
static int tiled_crc(const int64_t *x, int slots, uint64_t bytes, uint32_t *crc) {
    uint64_t at = 0;
    *crc = 0;
    for (;;) { /* the next range starts where the last ended */
        int s = 0;
        while (s < slots && !(x[s * X_N + X_HI] > x[s * X_N + X_LO] && (uint64_t)x[s * X_N + X_LO] == at)) s++;
        if (s == slots) return at == bytes && bytes > 0;
        const uint64_t len = (uint64_t)(x[s * X_N + X_HI] - x[s * X_N + X_LO]);
        *crc = zy_crc32_combine(*crc, (uint32_t)x[s * X_N + X_CRC], len);
        at += len;
    }
}

typedef struct {
    CkptManifest man;
    size_t *zb;           /* [size + 1]: the ranks' arena blocks (ZeRO-1) */
    int64_t *x;           /* [files][size + 1][X_N]: the exchange */
    FilePart *parts;      /* [files]: this rank's */
    unsigned char *found; /* [2 * tensors]: optimizer state found */
    int model_whole;      /* model.safetensors is not this writer's layout: every rank reads all of it */
    CkptFileIn *in;       /* [n_in]: this rank's reads, its model part first (n_model: 0 or 1) */
    int *file_of;         /* [n_in]: their manifest entries */
    int n_in, n_model;
} Load;

static void load_free(Load *l) {
    for (int k = 0; l->parts && k < l->man.n_files; k++) free(l->parts[k].spans);
    free(l->parts), free(l->x), free(l->zb), free(l->found), free(l->in), free(l->file_of);
    ckpt_manifest_free(&l->man);
}

/* The model config, the manifest, every file's size. */
static int load_begin(Load *l, const char *dir, const Model *model, int size, ZyErr *err) {
    char path[4096];
    ZayaConfig saved;
    if (zy_path_join(path, sizeof path, dir, "config.json", err) || config_load(&saved, path, err)) return -1;
    if (memcmp(&saved, &model->cfg, sizeof saved) != 0)
        return zy_fail(err, "%s: the checkpoint's model config differs from the run's model config", path);
    if (read_manifest(dir, path, &l->man, err)) return -1;
    for (int k = 0; k < l->man.n_files; k++)
        if (zy_path_join(path, sizeof path, dir, l->man.files[k].name, err) || check_size(path, &l->man.files[k], err))
            return -1;
    const size_t n = (size_t)l->man.n_files;
    l->zb = calloc((size_t)size + 1, sizeof *l->zb);
    l->x = calloc(n * ((size_t)size + 1) * X_N, sizeof *l->x);
    l->parts = calloc(n, sizeof *l->parts);
    l->found = calloc((size_t)model->params.count * 2 + 1, 1);
    return l->zb && l->x && l->parts && l->found ? 0 : zy_fail(err, "out of memory");
}

/* Every rank learns every rank's arena block. */
static int load_blocks(Load *l, const Optimizer *o, const Dist *d, ZyErr *err) {
    const int rank = d ? d->rank : 0, size = d ? d->size : 1;
    int64_t *b = calloc((size_t)size + 1, sizeof *b);
    if (!b) return zy_fail(err, "out of memory");
    b[rank] = (int64_t)o->begin;
    if (rank == size - 1) b[size] = (int64_t)o->end;
    int rc = d ? dist_allreduce_max_i64(d, b, (size_t)size + 1, err) : 0;
    for (int r = 0; r <= size; r++) l->zb[r] = (size_t)b[r];
    free(b);
    return rc;
}

/* This rank's part of file k (model.safetensors or an optimizer shard): its spans in the arenas and the range
 * around them; rank 0 also checksums the header. */
static int load_plan(Load *l, int k, Model *model, Optimizer *optim, int rank, int slots, ZyErr *err) {
    const ParamTable *t = &model->params;
    FilePart *fp = &l->parts[k];
    StFile f;
    if (st_open(&f, fp->path, err)) return -1;
    int rc = 0;
    if (!(fp->spans = malloc((size_t)(f.n_entries + 1) * sizeof *fp->spans))) rc = zy_fail(err, "out of memory");
    else if (strcmp(l->man.files[k].name, "model.safetensors") != 0) rc = shard_part(&f, t, optim, l->found, fp, err);
    else if (!model_part(&f, t, l->zb[rank], l->zb[rank + 1], fp)) l->model_whole = 1;
    if (!rc && rank == 0) {
        const uint64_t hlen = (uint64_t)(f.data - (const uint8_t *)f.map);
        int64_t *h = &l->x[((size_t)k * slots + slots - 1) * X_N];
        h[X_LO] = 0, h[X_HI] = (int64_t)hlen, h[X_CRC] = zy_crc32(0, f.map, hlen);
    }
    st_close(&f);
    if (!rc) part_close(fp);
    return rc;
}

/* This rank's parts of model.safetensors (first) and of the optimizer shards. A file that cannot be read as expected
 * is checked whole first, so that a damaged one fails as damaged (its CRC), not as whatever its bytes now say. */
static int load_plans(Load *l, const char *dir, Model *model, Optimizer *optim, int rank, int slots, ZyErr *err) {
    const int n = l->man.n_files;
    if (!(l->in = calloc((size_t)n, sizeof *l->in)) || !(l->file_of = calloc((size_t)n, sizeof *l->file_of)))
        return zy_fail(err, "out of memory");
    for (int pass = 0; pass < 2; pass++) /* the model, then the shards */
        for (int k = 0; k < n; k++) {
            const CkptManifestFile *f = &l->man.files[k];
            FilePart *fp = &l->parts[k];
            if (pass == 0 ? strcmp(f->name, "model.safetensors") != 0 : strncmp(f->name, "optimizer", 9) != 0) continue;
            if (zy_path_join(fp->path, sizeof fp->path, dir, f->name, err)) return -1;
            if (load_plan(l, k, model, optim, rank, slots, err)) {
                ZyErr damaged;
                if (verify_file(dir, f, &damaged)) *err = damaged;
                return -1;
            }
            if (fp->hi <= fp->lo) continue;
            l->in[l->n_in] = (CkptFileIn){.path = fp->path, .lo = fp->lo, .hi = fp->hi, .spans = fp->spans,
                                          .n_spans = fp->n_spans};
            l->file_of[l->n_in++] = k;
            l->n_model += pass == 0;
        }
    return 0;
}

/* Reads the planned parts straight into the arenas, all files' chunks in one queue. Under ZeRO-1 the ranks then
 * swap their blocks of the model (all-gather): collective whenever d has several ranks and the model file is this
 * writer's layout (every rank calls it, whatever its reads did), overlapped with the reading of the shards. */
static int load_read(Load *l, const char *dir, Model *model, const Dist *d, int slots, ZyErr *err) {
    const int rank = d ? d->rank : 0;
    int rc;
    if (d && d->size > 1 && !l->model_whole) {
        CkptReads *shards = NULL;
        rc = ckpt_read_files(l->in, l->n_model, err);
        if (!rc) rc = ckpt_read_files_start(&shards, l->in + l->n_model, l->n_in - l->n_model, err);
        ZyErr gather_err;
        const int gathered = dist_allgather_f32(d, model->params.data, l->zb, &gather_err);
        if (shards) {
            const int waited = ckpt_read_files_wait(shards, err);
            rc = rc ? rc : waited;
        }
        if (!rc && gathered) rc = zy_fail(err, "%s", gather_err.msg);
    } else {
        rc = ckpt_read_files(l->in, l->n_in, err);
    }
    for (int i = 0; i < l->n_in && !rc; i++) {
        const FilePart *fp = &l->parts[l->file_of[i]];
        int64_t *mine = &l->x[((size_t)l->file_of[i] * slots + rank) * X_N];
        mine[X_LO] = (int64_t)fp->lo, mine[X_HI] = (int64_t)fp->hi, mine[X_CRC] = l->in[i].crc;
    }
    if (rc || !l->model_whole) return rc;
    /* not this writer's layout: every rank reads all of it, checked first */
    const CkptManifestFile *f = l->man.files;
    while (strcmp(f->name, "model.safetensors") != 0) f++; /* the manifest parser made sure it is there */
    return verify_file(dir, f, err) || model_load_weights(model, dir, err);
}

/* Every file checked once: one the ranks' ranges tile by their combined CRC (every rank reaches the same
 * verdict), the rest (the small JSON files, a file no rank read whole) read by rank 0. */
static int load_verify(const Load *l, const char *dir, int rank, int slots, ZyErr *err) {
    char path[4096];
    for (int k = 0; k < l->man.n_files; k++) {
        const CkptManifestFile *f = &l->man.files[k];
        uint32_t crc;
        if (tiled_crc(&l->x[(size_t)k * slots * X_N], slots, f->bytes, &crc)) {
            if (zy_path_join(path, sizeof path, dir, f->name, err) || check_crc(path, f, crc, err)) return -1;
        } else if (rank == 0 && verify_file(dir, f, err)) {
            return -1;
        }
    }
    return 0;
}

static int load_finish(const Load *l, const char *dir, const Model *model, const Optimizer *optim, char **state_json,
                       ZyErr *err) {
    const ParamTable *t = &model->params;
    for (int i = 0; i < t->count; i++) {
        const ParamInfo *p = &t->info[i];
        if (!param_trainable(p) || !optim->owned[i]) continue;
        for (int which = 0; which < (p->kind == PARAM_MUON ? 1 : 2); which++)
            if (!l->found[2 * i + which])
                return zy_fail(err, "%s: no optimizer shard holds %s/%s (missing shard?)", dir,
                               which ? "exp_avg_sq" : "exp_avg", p->name);
    }
    char path[4096];
    size_t len;
    return zy_path_join(path, sizeof path, dir, "trainer_state.json", err) || zy_read_file(path, state_json, &len, err);
}

int ckpt_load(const char *dir, Model *model, Optimizer *optim, char **trainer_state_json, const Dist *d, ZyErr *err) {
    const int rank = d ? d->rank : 0, size = d ? d->size : 1, slots = size + 1;
    Load l = {0};
    *trainer_state_json = NULL;
    /* every rank takes the same branch at each step (agree), so none waits in a collective the others skipped */
    int ok = agree(d, load_begin(&l, dir, model, size, err), "loading the checkpoint", err) == 0;
    ok = ok && load_blocks(&l, optim, d, err) == 0;
    ok = ok && agree(d, load_plans(&l, dir, model, optim, rank, slots, err), "loading the checkpoint", err) == 0;
    ok = ok && agree(d, load_read(&l, dir, model, d, slots, err), "loading the checkpoint", err) == 0;
    ok = ok && (!d || dist_allreduce_max_i64(d, l.x, (size_t)l.man.n_files * slots * X_N, err) == 0);
    ok = ok && agree(d, load_verify(&l, dir, rank, slots, err), "verifying the checkpoint", err) == 0;
    ok = ok && agree(d, load_finish(&l, dir, model, optim, trainer_state_json, err), "loading the checkpoint", err) == 0;
    load_free(&l);
    if (!ok) {
        free(*trainer_state_json);
        *trainer_state_json = NULL;
    }
    return ok ? 0 : -1;
}

int ckpt_inspect(const char *dir_in, FILE *out, ZyErr *err) {
    char dir[4096], path[4096], *text;
    size_t len;
    snprintf(dir, sizeof dir, "%s", dir_in);
    if (zy_path_join(path, sizeof path, dir, "manifest.json", err)) return -1;
    if (access(path, F_OK) != 0 && ckpt_latest(dir_in, dir, sizeof dir, err) == 0) { /* a checkpoint root */
        if (zy_path_join(path, sizeof path, dir, "manifest.json", err)) return -1;
    }
    CkptManifest m;
    if (read_manifest(dir, path, &m, err)) return -1;
    fprintf(out, "checkpoint  %s\nstep        %lld\nworld size  %d (optimizer shards; resumable on any rank count)\n", dir,
            (long long)m.step, m.world_size);
    fprintf(out, "%-44s %14s  %-10s %s\n", "file", "bytes", "crc32", "status");
    int bad = 0;
    for (int i = 0; i < m.n_files; i++) {
        const CkptManifestFile *f = &m.files[i];
        char fp[4096], status[128] = "ok";
        uint32_t got_crc = 0;
        uint64_t got_size = 0;
        ZyErr ferr;
        if (zy_path_join(fp, sizeof fp, dir, f->name, &ferr) || file_crc32(fp, &got_crc, &got_size, &ferr))
            snprintf(status, sizeof status, "MISSING or unreadable");
        else if (got_size != f->bytes)
            snprintf(status, sizeof status, "SIZE %llu, expected %llu", (unsigned long long)got_size,
                     (unsigned long long)f->bytes);
        else if (got_crc != f->crc32)
            snprintf(status, sizeof status, "CRC %08x, expected %08x", got_crc, f->crc32);
        if (strcmp(status, "ok") != 0 && !bad++) zy_fail(err, "%s: %s", fp, status);
        fprintf(out, "%-44s %14llu  %08x   %s\n", f->name, (unsigned long long)f->bytes, f->crc32, status);
    }
    ckpt_manifest_free(&m);
    /* trainer state summary */
    if (zy_path_join(path, sizeof path, dir, "trainer_state.json", err) == 0 && zy_read_file(path, &text, &len, err) == 0) {
        cJSON *st = cJSON_Parse(text);
        free(text);
        const cJSON *tok = st ? cJSON_GetObjectItemCaseSensitive(st, "tokens_seen") : NULL;
        const cJSON *ph = st ? cJSON_GetObjectItemCaseSensitive(st, "phase") : NULL;
        const cJSON *ld = st ? cJSON_GetObjectItemCaseSensitive(st, "loader") : NULL, *it;
        if (cJSON_IsNumber(tok)) fprintf(out, "tokens seen %.0f\n", tok->valuedouble);
        if (cJSON_IsNumber(ph)) fprintf(out, "phase       %.0f (0-based)\n", ph->valuedouble);
        cJSON_ArrayForEach(it, ld) {
            const cJSON *cur = cJSON_GetObjectItemCaseSensitive(it, "cursor"), *ep = cJSON_GetObjectItemCaseSensitive(it, "epoch");
            fprintf(out, "data cursor %s: token %.0f, epoch %.0f\n", it->string, cJSON_IsNumber(cur) ? cur->valuedouble : -1,
                    cJSON_IsNumber(ep) ? ep->valuedouble : -1);
        }
        cJSON_Delete(st);
    }
    ZayaConfig cfg;
    if (zy_path_join(path, sizeof path, dir, "config.json", err) == 0 && config_load(&cfg, path, err) == 0)
        fprintf(out, "model       V %d, D %d, L %d, heads %d/%d x %d, experts %d x %d, router %d\n", cfg.vocab_size,
                cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.num_experts,
                cfg.moe_intermediate_size, cfg.router_hidden_size);
    fprintf(out, "checksums   %s\n", bad ? "FAILED" : "all files verified");
    return bad ? -1 : 0;
}
