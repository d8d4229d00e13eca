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
#include <zlib.h>

#include "dist/distributed.h"
#include "io/manifest.h"
#include "io/model_io.h"
#include "io/safetensors.h"


int file_crc32(const char *path, uint32_t *crc, uint64_t *size, ZyErr *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return zy_fail(err, "%s: cannot open: %s", path, strerror(errno));
    enum { CHUNK = 1 << 20 };
    unsigned char *buf = malloc(CHUNK);
    if (!buf) {
        fclose(f);
        return zy_fail(err, "out of memory");
    }
    uLong c = crc32(0L, Z_NULL, 0);
    uint64_t n = 0;
    size_t got;
    while ((got = fread(buf, 1, CHUNK, f)) > 0) {
        c = crc32(c, buf, (uInt)got);
        n += got;
    }
    int bad = ferror(f);
    fclose(f);
    free(buf);
    if (bad) return zy_fail(err, "%s: read error", path);
    *crc = (uint32_t)c;
    *size = n;
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

static int write_optimizer(const char *path, const Model *m, const Optimizer *o, ZyErr *err) {
    const ParamTable *t = &m->params;
    StWriteTensor *ts = calloc((size_t)2 * t->count, sizeof *ts);
    char(*names)[160] = calloc((size_t)2 * t->count, sizeof *names);
    if (!ts || !names) {
        free(ts);
        free(names);
        return zy_fail(err, "out of memory");
    }
    int n = 0;
    for (int i = 0; i < t->count; i++) {
        const ParamInfo *p = &t->info[i];
        if (!param_trainable(p) || !o->owned[i]) continue;
        for (int which = 0; which < 2; which++) {
            if (which == 1 && p->kind == PARAM_MUON) continue; /* Muon keeps one moment; that slot is scratch */
            snprintf(names[n], sizeof names[n], "%s/%s", which ? "exp_avg_sq" : "exp_avg", p->name);
            ts[n].name = names[n];
            ts[n].ndim = p->ndim;
            memcpy(ts[n].shape, p->shape, sizeof p->shape);
            ts[n].src_dtype = ts[n].out_dtype = ZY_DT_F32;
            ts[n].data = optim_state(o, p, which);
            n++;
        }
    }
    int rc = st_write(path, ts, n, NULL, err);
    free(ts);
    free(names);
    return rc;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* manifest.json: size and CRC-32 of every other file in the directory (model, config, optimizer shards, state). */
static int write_manifest(const char *dir, int64_t step, int world_size, ZyErr *err) {
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
        uint32_t crc;
        uint64_t size;
        if ((rc = zy_path_join(path, sizeof path, dir, names[i], err)) || (rc = file_crc32(path, &crc, &size, err))) break;
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
static int agree(const Dist *d, int failed, ZyErr *err) {
    int64_t f = failed;
    ZyErr e2;
    if (d && dist_allreduce_max_i64(d, &f, 1, &e2)) return zy_fail(err, "%s", e2.msg);
    if (f && !failed) return zy_fail(err, "another rank failed while saving the checkpoint");
    return f ? -1 : 0;
}

/* An asynchronous save: the main thread snapshots what is saved (rank 0 the parameters, every rank its
 * optimizer block) and a writer thread per rank writes from the snapshot while training goes on. No MPI call is made
 * off the main thread: rank 0's writer learns that the other ranks' shards are durable from the shared checkpoint
 * directory (each shard appears under its final name by an atomic rename, or a .failed marker), then writes the
 * manifest and publishes. ckpt_wait joins and makes every rank agree on the outcome. */
struct CkptWriter {
    pthread_t thread;
    int rank, size, keep;
    int64_t step;
    Model model;          /* shallow copy whose params.data is the snapshot (rank 0) */
    Optimizer optim;      /* shallow copy whose state points at the snapshot */
    float *param_snapshot, *state_snapshot;
    char *trainer_state_json, *run_json;
    char root[4096], tmp[4096], final[4096], final_name[64];
    double t_start, seconds;
    int rc;
    ZyErr err;
};

static int write_rank0_files(CkptWriter *w) {
    char path[4096];
    int rc = model_save_dir(&w->model, w->tmp, ZY_DT_F32, &w->err);
    if (!rc) rc = zy_path_join(path, sizeof path, w->tmp, "trainer_state.json", &w->err);
    if (!rc) rc = zy_write_file_atomic(path, w->trainer_state_json, strlen(w->trainer_state_json), &w->err);
    if (!rc && w->run_json) rc = zy_path_join(path, sizeof path, w->tmp, "run.json", &w->err);
    if (!rc && w->run_json) rc = zy_write_file_atomic(path, w->run_json, strlen(w->run_json), &w->err);
    return rc;
}

/* Rank 0: every shard under its final name, or a rank's failure marker; bounded wait. */
static int wait_for_shards(CkptWriter *w) {
    const double deadline = zy_now_seconds() + 600.0;
    for (int r = 0; r < w->size; r++) {
        char path[4200], failed[4300];
        snprintf(path, sizeof path, "%s/optimizer-%05d-of-%05d.safetensors", w->tmp, r, w->size);
        snprintf(failed, sizeof failed, "%s.failed", path);
        for (;;) {
            struct stat st;
            if (stat(path, &st) == 0) break;
            if (stat(failed, &st) == 0) return zy_fail(&w->err, "rank %d failed to write its optimizer shard", r);
            if (zy_now_seconds() > deadline) return zy_fail(&w->err, "rank %d's optimizer shard did not appear within 600 s", r);
            struct timespec ts = {0, 2000000};
            nanosleep(&ts, NULL);
        }
    }
    return 0;
}

static int publish(CkptWriter *w) {
    char path[4096];
    int rc = write_manifest(w->tmp, w->step, w->size, &w->err);
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
    char path[4200];
    snprintf(path, sizeof path, "%s/optimizer-%05d-of-%05d.safetensors", w->tmp, w->rank, w->size);
    int rc = write_optimizer(path, &w->model, &w->optim, &w->err);
    if (rc) { /* tell rank 0 at once rather than letting it time out */
        char failed[4300];
        snprintf(failed, sizeof failed, "%s.failed", path);
        ZyErr ignore;
        zy_write_file_atomic(failed, "", 0, &ignore);
    }
    if (!rc && w->rank == 0) rc = write_rank0_files(w);
    if (!rc && w->rank == 0) rc = wait_for_shards(w);
    if (!rc && w->rank == 0) rc = publish(w);
    if (rc && w->rank == 0) zy_remove_tree(w->tmp);
    w->rc = rc;
    w->seconds = zy_now_seconds() - w->t_start;
    return NULL;
}

static void writer_free(CkptWriter *w) {
    if (!w) return;
    zy_free(w->param_snapshot);
    zy_free(w->state_snapshot);
    free(w->trainer_state_json);
    free(w->run_json);
    free(w);
}

int ckpt_save_async(CkptWriter **out, const char *root, int64_t step, const CheckpointContent *c, const Dist *d,
                    int keep, ZyErr *err) {
    *out = NULL;
    const int rank = d ? d->rank : 0, size = d ? d->size : 1;
    CkptWriter *w = calloc(1, sizeof *w);
    if (!w) return zy_fail(err, "out of memory");
    w->rank = rank;
    w->size = size;
    w->keep = keep;
    w->step = step;
    w->t_start = zy_now_seconds();
    snprintf(w->final_name, sizeof w->final_name, "step-%08lld", (long long)step);
    char tmp_name[64];
    snprintf(tmp_name, sizeof tmp_name, ".tmp-step-%08lld", (long long)step); /* one name for all ranks */
    int rc = snprintf(w->root, sizeof w->root, "%s", root) >= (int)sizeof w->root ||
             zy_path_join(w->tmp, sizeof w->tmp, root, tmp_name, err) ||
             zy_path_join(w->final, sizeof w->final, root, w->final_name, err);
    if (!rc && rank == 0) {
        rc = zy_mkdirs(root, err);
        if (!rc) {
            remove_stale_temporaries(root, "");
            rc = zy_mkdirs(w->tmp, err);
        }
    }
    /* snapshot: rank 0 the parameters, every rank its optimizer block */
    const ParamTable *t = &c->model->params;
    const Optimizer *o = c->optim;
    const size_t block = o->end - o->begin;
    w->model = *c->model;
    w->optim = *o;
    if (!rc && rank == 0) {
        w->param_snapshot = malloc(t->total * sizeof(float)); /* filled at once: no zeroing pass */
        if (!w->param_snapshot) rc = zy_fail(err, "out of memory for the checkpoint snapshot");
        else memcpy(w->param_snapshot, t->data, t->total * sizeof(float));
        w->model.params.data = w->param_snapshot;
    }
    if (!rc) {
        w->state_snapshot = malloc((2 * block + 1) * sizeof(float));
        w->trainer_state_json = strdup(c->trainer_state_json);
        w->run_json = c->run_json ? strdup(c->run_json) : NULL;
        if (!w->state_snapshot || !w->trainer_state_json || (c->run_json && !w->run_json)) {
            rc = zy_fail(err, "out of memory for the checkpoint snapshot");
        } else {
            memcpy(w->state_snapshot, o->exp_avg, block * sizeof(float));
            memcpy(w->state_snapshot + block, o->exp_avg_sq, block * sizeof(float));
            w->optim.exp_avg = w->state_snapshot;
            w->optim.exp_avg_sq = w->state_snapshot + block;
        }
    }
    if (agree(d, rc, err)) { /* every rank has its snapshot and rank 0 made the directory */
        writer_free(w);
        return -1;
    }
    if (pthread_create(&w->thread, NULL, writer_main, w) != 0) {
        writer_free(w);
        return zy_fail(err, "cannot start the checkpoint writer thread");
    }
    *out = w;
    return 0;
}

int ckpt_wait(CkptWriter *w, const Dist *d, char *out_dir, size_t cap, double *seconds, ZyErr *err) {
    pthread_join(w->thread, NULL);
    int rc = w->rc;
    if (rc) *err = w->err;
    if (out_dir) snprintf(out_dir, cap, "%s", w->final);
    if (seconds) *seconds = w->seconds;
    writer_free(w);
    if (agree(d, rc, err)) return rc ? zy_wrap(err, "saving checkpoint") : -1;
    return 0;
}

int ckpt_save(const char *root, int64_t step, const CheckpointContent *c, const Dist *d, int keep, char *out_dir,
              size_t cap, ZyErr *err) {
    CkptWriter *w;
    if (ckpt_save_async(&w, root, step, c, d, keep, err)) return -1;
    return ckpt_wait(w, d, out_dir, cap, NULL, err);
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

int ckpt_verify(const char *dir, ZyErr *err) {
    char path[4096];
    CkptManifest m;
    if (read_manifest(dir, path, &m, err)) return -1;
    int rc = 0;
    for (int i = 0; i < m.n_files && !rc; i++) {
        const CkptManifestFile *f = &m.files[i];
        char fp[4096];
        uint32_t got_crc;
        uint64_t got_size;
        if ((rc = zy_path_join(fp, sizeof fp, dir, f->name, err))) break;
        if ((rc = file_crc32(fp, &got_crc, &got_size, err)))
            zy_wrap(err, "checkpoint %s", dir);
        else if (got_size != f->bytes)
            rc = zy_fail(err, "%s: size %llu, manifest says %llu (truncated or corrupt)", fp, (unsigned long long)got_size,
                         (unsigned long long)f->bytes);
        else if (got_crc != f->crc32)
            rc = zy_fail(err, "%s: CRC-32 %08x, manifest says %08x (corrupt)", fp, got_crc, f->crc32);
    }
    ckpt_manifest_free(&m);
    return rc;
}

int ckpt_load(const char *dir, Model *model, Optimizer *optim, char **trainer_state_json, ZyErr *err) {
    char path[4096];
    ZayaConfig saved;
    if (zy_path_join(path, sizeof path, dir, "config.json", err) || config_load(&saved, path, err)) return -1;
    if (memcmp(&saved, &model->cfg, sizeof saved) != 0)
        return zy_fail(err, "%s: the checkpoint's model config differs from the run's model config", path);
    if (model_load_weights(model, dir, err)) return -1;
    /* Optimizer state by tensor name from whichever shard holds it, so a checkpoint saved by N ranks resumes on M. */
    const ParamTable *t = &model->params;
    unsigned char *found = calloc((size_t)t->count * 2, 1);
    if (!found) return zy_fail(err, "out of memory");
    /* the shards are the optimizer-* files the manifest lists (a stray file in the directory is ignored) */
    CkptManifest manifest = {0};
    int rc = read_manifest(dir, path, &manifest, err);
    for (int k = 0; !rc && k < manifest.n_files; k++) {
        const char *fname = manifest.files[k].name;
        if (strncmp(fname, "optimizer", 9) != 0) continue; /* also a one-file "optimizer.safetensors" */
        StFile f;
        if ((rc = zy_path_join(path, sizeof path, dir, fname, err)) || (rc = st_open(&f, path, err))) break;
        for (int i = 0; i < t->count && !rc; i++) {
            const ParamInfo *p = &t->info[i];
            if (!param_trainable(p) || !optim->owned[i]) continue;
            for (int which = 0; which < 2 && !rc; which++) {
                if (which == 1 && p->kind == PARAM_MUON) continue;
                char name[160];
                snprintf(name, sizeof name, "%s/%s", which ? "exp_avg_sq" : "exp_avg", p->name);
                const StEntry *e = st_find(&f, name);
                if (!e) continue;
                if (e->numel != p->numel || e->dtype != ZY_DT_F32)
                    rc = zy_fail(err, "%s: optimizer tensor %s has the wrong shape or dtype", path, name);
                else if (!(rc = st_read_f32(&f, e, optim_state(optim, p, which), err)))
                    found[2 * i + which] = 1;
            }
        }
        st_close(&f);
    }
    ckpt_manifest_free(&manifest);
    for (int i = 0; i < t->count && !rc; i++) {
        const ParamInfo *p = &t->info[i];
        if (!param_trainable(p) || !optim->owned[i]) continue;
        for (int which = 0; which < (p->kind == PARAM_MUON ? 1 : 2) && !rc; which++)
            if (!found[2 * i + which])
                rc = zy_fail(err, "%s: no optimizer shard holds %s/%s (missing shard?)", dir, which ? "exp_avg_sq" : "exp_avg",
                             p->name);
    }
    free(found);
    if (rc) return -1;
    size_t len;
    if (zy_path_join(path, sizeof path, dir, "trainer_state.json", err) || zy_read_file(path, trainer_state_json, &len, err))
        return -1;
    return 0;
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
