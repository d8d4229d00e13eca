#include "io/quant_io.h"

#include "io/model_io.h"
#include "io/safetensors.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io/quant_plan.h"
#include "kernels/quant.h"
#include "kernels/quant_gptq.h"

int quant_holds(const ParamInfo *p) { return model_holds_bf16(p); }

void quant_base_name(char *out, size_t cap, const char *name) {
    const size_t n = strlen(name), w = strlen(".weight");
    snprintf(out, cap, "%.*s", (int)(n > w && strcmp(name + n - w, ".weight") == 0 ? n - w : n), name);
}

static int load_config(const char *dir, ZayaConfig *cfg, ZyErr *err) {
    char path[4096];
    return zy_path_join(path, sizeof path, dir, "config.json", err) || config_load(cfg, path, err) ? -1 : 0;
}

int quant_dir_refuse(const char *dir, const char *what, ZyErr *err) {
    ZayaConfig cfg;
    char path[4096];
    struct stat st;
    /* not a model folder: the command's own reading says what is wrong */
    if (zy_path_join(path, sizeof path, dir, "config.json", err) || stat(path, &st) != 0) return 0;
    if (load_config(dir, &cfg, err)) return -1;
    if (!cfg.quant_bits) return 0;
    return zy_fail(err, "%s: %s holds %d-bit quantized weights (config.json \"quantization\": bits %d, group_size %d): "
                   "%s needs the bf16 or fp32 weights it was quantized from", what, dir, cfg.quant_bits,
                   cfg.quant_bits, cfg.quant_group_size, what);
}

/* ---- the source's tensors, from the mapped files ---- */

typedef struct {
    StFile *st;
    int n_st;
    const StFile **file; /* [param] the file holding it */
    const StEntry **entry; /* [param] its entry there */
} Source;

static void source_close(Source *s) {
    for (int f = 0; f < s->n_st; f++) st_close(&s->st[f]);
    free(s->st), free(s->file), free(s->entry);
    memset(s, 0, sizeof *s);
}

static void shape_text(char *out, size_t cap, const int64_t *shape, int ndim) {
    out[0] = '\0';
    for (int k = 0; k < ndim; k++) snprintf(out + strlen(out), cap - strlen(out), "%s%lld", k ? ", " : "", (long long)shape[k]);
}

/* Opens DIR's weight files and finds each tensor of t (a float dtype, the config's shape, once); a tied model's copy
 * of the head is ignored, any other stranger is an error. */
static int source_open(Source *s, const char *dir, const ParamTable *t, int tied, ZyErr *err) {
    memset(s, 0, sizeof *s);
    char **files;
    int n_files, rc = 0;
    if (model_weight_files(dir, &files, &n_files, err)) return -1;
    s->st = calloc((size_t)n_files, sizeof *s->st);
    s->file = calloc((size_t)t->count, sizeof *s->file);
    s->entry = calloc((size_t)t->count, sizeof *s->entry);
    if (!s->st || !s->file || !s->entry) rc = zy_fail(err, "out of memory");
    for (int f = 0; f < n_files && !rc; f++, s->n_st++) rc = st_open(&s->st[f], files[f], err);
    for (int f = 0; f < s->n_st && !rc; f++)
        for (int e = 0; e < s->st[f].n_entries && !rc; e++) {
            const StEntry *en = &s->st[f].entries[e];
            const int i = params_find(t, en->name);
            if (i < 0) {
                if (tied && strcmp(en->name, "lm_head.weight") == 0) continue;
                rc = zy_fail(err, "%s: unexpected tensor \"%s\" (not part of this ZAYA config)", files[f], en->name);
                break;
            }
            const ParamInfo *p = &t->info[i];
            int same = en->ndim == p->ndim;
            for (int k = 0; same && k < p->ndim; k++) same = en->shape[k] == p->shape[k];
            if (s->entry[i]) rc = zy_fail(err, "%s: tensor \"%s\" appears more than once", files[f], en->name);
            else if (en->dtype != ZY_DT_F32 && en->dtype != ZY_DT_BF16 && en->dtype != ZY_DT_F16)
                rc = zy_fail(err, "%s: tensor \"%s\" has dtype %s; expected F32, BF16 or F16", files[f], en->name,
                             zy_dtype_name(en->dtype));
            else if (!same) {
                char want[96], got[96];
                shape_text(want, sizeof want, p->shape, p->ndim);
                shape_text(got, sizeof got, en->shape, en->ndim);
                rc = zy_fail(err, "%s: tensor \"%s\" has shape [%s], the config needs [%s]", files[f], en->name, got, want);
            }
            s->file[i] = &s->st[f], s->entry[i] = en;
        }
    for (int i = 0; i < t->count && !rc; i++)
        if (!s->entry[i]) rc = zy_fail(err, "%s: missing tensor \"%s\"", dir, t->info[i].name);
    model_weight_files_free(files, n_files);
    if (rc) source_close(s);
    return rc;
}

/* Row r (cols values) of a float tensor, as fp32. */
static void source_row(const StFile *f, const StEntry *e, long r, int cols, float *out) {
    const uint8_t *p = f->data + e->offset + (size_t)r * cols * zy_dtype_size(e->dtype);
    for (int k = 0; k < cols; k++) {
        uint16_t h;
        if (e->dtype == ZY_DT_F32) {
            memcpy(out + k, p + 4 * (size_t)k, 4);
            continue;
        }
        memcpy(&h, p + 2 * (size_t)k, 2);
        out[k] = e->dtype == ZY_DT_BF16 ? zy_bf16_to_f32(h) : zy_f16_to_f32(h);
    }
}

/* ---- zaya quantize ---- */

/* One quantized tensor on its way out: made whole when its codes are first asked for, handed out as codes, scales,
 * biases (written in that order, one after the other), freed after the last byte of the biases. */
typedef struct {
    const StFile *f;
    const StEntry *e;
    const char *name;
    long rows;
    int cols, bits, group_size;
    ZyQuantMethod method;
    const float *importance; /* [blocks][cols] or NULL (QuantImportance) */
    const double *gram;      /* [blocks][cols][cols] for GPTQ (QuantImportance) */
    long rows_per_block;
    uint8_t *part[3];   /* codes, scales, biases */
    size_t bytes[3];
    char error[256];    /* why making it failed */
} QuantJob;
typedef struct {
    QuantJob *job;
    int which;
} QuantPart;

static int quant_job_make(QuantJob *j) {
    const ZyDtype sdt = j->e->dtype;
    const int words = zy_quant_row_words(j->cols, j->bits), groups = j->cols / j->group_size;
    j->bytes[0] = (size_t)j->rows * words * 4;
    j->bytes[1] = j->bytes[2] = (size_t)j->rows * groups * zy_dtype_size(sdt);
    for (int i = 0; i < 3; i++)
        if (!(j->part[i] = malloc(j->bytes[i] ? j->bytes[i] : 1))) {
            snprintf(j->error, sizeof j->error, "out of memory for its %zu MB of codes", j->bytes[0] >> 20);
            return -1;
        }
    /* GPTQ: each block's U (kernels/quant_gptq.h), from its inputs' Gram matrix */
    const size_t cc = (size_t)j->cols * j->cols;
    const long blocks = j->rows / j->rows_per_block;
    double *u = NULL;
    if (j->method == ZY_QUANT_GPTQ) {
        if (!j->gram || !(u = malloc((size_t)blocks * cc * sizeof *u))) {
            snprintf(j->error, sizeof j->error, j->gram ? "out of memory for GPTQ's factors" : "no calibration inputs for GPTQ");
            return -1;
        }
        memcpy(u, j->gram, (size_t)blocks * cc * sizeof *u);
        for (long b = 0; b < blocks; b++)
            if (zy_gptq_factor(u + b * cc, j->cols)) {
                snprintf(j->error, sizeof j->error, "block %ld's calibration inputs give no positive definite Σ x xᵀ", b);
                free(u);
                return -1;
            }
    }
    long bad_row = -1;
#pragma omp parallel
    {
        float *w = malloc(sizeof(float) * ((size_t)j->cols + 2 * (size_t)groups));
        double *work = u ? malloc(sizeof(double) * (size_t)j->cols) : NULL;
        float *fs = w ? w + j->cols : NULL, *fb = fs ? fs + groups : NULL;
#pragma omp for schedule(static)
        for (long r = 0; r < j->rows; r++) {
            if (!w || (u && !work)) {
#pragma omp critical
                if (bad_row < 0 || r < bad_row) bad_row = r;
                continue;
            }
            source_row(j->f, j->e, r, j->cols, w);
            for (int k = 0; k < j->cols; k++)
                if (!isfinite(w[k])) {
#pragma omp critical
                    if (bad_row < 0 || r < bad_row) bad_row = r;
                    break;
                }
            uint32_t *codes = (uint32_t *)(void *)j->part[0] + (size_t)r * words;
            const float *imp = j->importance ? j->importance + r / j->rows_per_block * j->cols : NULL;
            if (u)
                zy_quant_row_gptq(w, u + r / j->rows_per_block * cc, imp, j->cols, j->bits, j->group_size, sdt, work,
                                  codes, fs, fb);
            else if (j->method == ZY_QUANT_MSE)
                zy_quant_row_mse(w, imp, j->cols, j->bits, j->group_size, sdt, codes, fs, fb);
            else
                zy_quant_row(w, j->cols, j->bits, j->group_size, codes, fs, fb);
            for (int g = 0; g < groups; g++) {
                zy_quant_store(sdt, fs[g], j->part[1], (size_t)r * groups + g);
                zy_quant_store(sdt, fb[g], j->part[2], (size_t)r * groups + g);
            }
        }
        free(w), free(work);
    }
    free(u);
    if (bad_row >= 0) {
        snprintf(j->error, sizeof j->error, "row %ld holds a value that is not finite (or memory ran out)", bad_row);
        return -1;
    }
    return 0;
}

static void quant_job_free(QuantJob *j) {
    for (int i = 0; i < 3; i++) free(j->part[i]), j->part[i] = NULL;
}

static int quant_part_fill(void *ctx, size_t first, size_t n, void *out) {
    const QuantPart *qp = ctx;
    QuantJob *j = qp->job;
    if (qp->which == 0 && first == 0 && quant_job_make(j)) return -1;
    if (!j->part[qp->which]) return -1;
    memcpy(out, j->part[qp->which] + first, n);
    if (qp->which == 2 && first + n == j->bytes[2]) quant_job_free(j);
    return 0;
}

/* OUT/config.json: SRC's, keys and order kept, with "quantization" (and mlx-lm's copy "quantization_config"): the
 * plan's defaults, and mlx-lm's per-module entry for each matrix of t whose format differs (false: unquantized). */
static int write_config(const char *src, const char *out, const QuantPlan *plan, const ParamTable *t, ZyErr *err) {
    char path[4096];
    char *text;
    size_t len;
    if (zy_path_join(path, sizeof path, src, "config.json", err) || zy_read_file(path, &text, &len, err)) return -1;
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    if (!root) return zy_fail(err, "%s: invalid JSON", path);
    cJSON *q = cJSON_CreateObject();
    cJSON_AddNumberToObject(q, "group_size", plan->defaults.group_size);
    cJSON_AddNumberToObject(q, "bits", plan->defaults.bits);
    cJSON_AddStringToObject(q, "mode", "affine");
    for (int i = 0; i < t->count; i++) {
        const QuantFormat f = quant_plan_format(plan, t->info[i].name, (int)t->info[i].shape[t->info[i].ndim - 1]);
        char base[160];
        if (!quant_holds(&t->info[i]) || (f.bits == plan->defaults.bits && f.group_size == plan->defaults.group_size))
            continue;
        quant_base_name(base, sizeof base, t->info[i].name);
        cJSON *own = f.bits ? cJSON_AddObjectToObject(q, base) : cJSON_AddFalseToObject(q, base);
        if (f.bits) cJSON_AddNumberToObject(own, "group_size", f.group_size), cJSON_AddNumberToObject(own, "bits", f.bits);
    }
    cJSON_DeleteItemFromObjectCaseSensitive(root, "quantization");
    cJSON_DeleteItemFromObjectCaseSensitive(root, "quantization_config");
    cJSON_AddItemToObject(root, "quantization_config", cJSON_Duplicate(q, 1));
    cJSON_AddItemToObject(root, "quantization", q);
    char *s = cJSON_Print(root);
    cJSON_Delete(root);
    char *with_nl = s ? malloc(strlen(s) + 2) : NULL;
    int rc = with_nl ? zy_path_join(path, sizeof path, out, "config.json", err) : zy_fail(err, "out of memory");
    if (!rc) {
        snprintf(with_nl, strlen(s) + 2, "%s\n", s);
        rc = zy_write_file_atomic(path, with_nl, strlen(with_nl), err);
    }
    free(s), free(with_nl);
    return rc;
}

/* The files beside the weights that a model folder's users read: tokenizer, chat template, generation defaults. */
static int copy_side_files(const char *src, const char *out, ZyErr *err) {
    static const char *const names[] = {"tokenizer.json",         "tokenizer_config.json", "special_tokens_map.json",
                                        "generation_config.json", "chat_template.jinja",   "chat_template.json",
                                        "tokenizer.model"};
    for (size_t i = 0; i < ZY_ARRAY_LEN(names); i++) {
        char from[4096], to[4096];
        struct stat st;
        if (zy_path_join(from, sizeof from, src, names[i], err) || zy_path_join(to, sizeof to, out, names[i], err))
            return -1;
        if (stat(from, &st) != 0) continue;
        char *text;
        size_t len;
        if (zy_read_file(from, &text, &len, err)) return -1;
        const int rc = zy_write_file_atomic(to, text, len, err);
        free(text);
        if (rc) return -1;
    }
    return 0;
}

void quant_importance_free(QuantImportance *imp) {
    for (int i = 0; i < imp->count; i++) {
        if (imp->of_tensor) free(imp->of_tensor[i]);
        if (imp->gram) free(imp->gram[i]);
    }
    free(imp->of_tensor), free(imp->gram);
    imp->of_tensor = NULL, imp->gram = NULL, imp->count = 0;
}

int quant_calibration_check(ZyQuantMethod method, int have_importance, int have_gram, ZyErr *err) {
    if (have_importance && method == ZY_QUANT_MLX)
        return zy_fail(err, "quantize: --calibration weights the mse and gptq methods' error; --method mlx does not use it");
    if (method == ZY_QUANT_GPTQ && !have_gram)
        return zy_fail(err, "quantize: --method gptq needs calibration data (--calibration DATA)");
    return 0;
}

int quant_model_dir(const char *src, const char *out, const QuantPlan *plan, const QuantImportance *importance,
                    size_t shard_bytes, QuantizeReport *rep, ZyErr *err) {
    memset(rep, 0, sizeof *rep);
    if (quant_calibration_check(plan->method, importance != NULL, importance && importance->gram, err)) return -1;
    ZayaConfig cfg;
    if (load_config(src, &cfg, err)) return -1;
    if (cfg.quant_bits)
        return zy_fail(err, "quantize: %s is quantized already (%d-bit, groups of %d)", src, cfg.quant_bits,
                       cfg.quant_group_size);
    if (cfg.legacy_layout)
        return zy_fail(err, "quantize: %s is a legacy checkpoint; convert it to the native layout first (zaya convert "
                       "--model %s --out DIR --dtype bf16)", src, src);
    ParamTable t;
    Source s;
    if (model_param_table(&t, &cfg, err)) return -1;
    if (source_open(&s, src, &t, cfg.tie_word_embeddings, err)) {
        params_free(&t);
        return -1;
    }
    const int n = t.count;
    if (importance && importance->count != n) {
        source_close(&s);
        params_free(&t);
        return zy_fail(err, "quantize: the calibration has %d tensors, the model %d", importance->count, n);
    }
    /* up to three outputs per tensor */
    StWriteTensor *ts = calloc((size_t)3 * n, sizeof *ts);
    QuantJob *jobs = calloc((size_t)n, sizeof *jobs);
    QuantPart *parts = calloc((size_t)3 * n, sizeof *parts);
    int *shard_of = calloc((size_t)3 * n, sizeof *shard_of), *first_of_shard = calloc((size_t)3 * n + 1, sizeof(int));
    char(*names)[192] = calloc((size_t)3 * n, sizeof *names);
    int rc = ts && jobs && parts && shard_of && first_of_shard && names ? 0 : zy_fail(err, "out of memory");
    int nt = 0, n_shards = 1;
    size_t in_shard = 0;
    for (int i = 0; i < n && !rc; i++) {
        const ParamInfo *p = &t.info[i];
        const StEntry *e = s.entry[i];
        const int cols = (int)p->shape[p->ndim - 1];
        const QuantFormat f = quant_plan_format(plan, p->name, cols);
        const int quantized = quant_holds(p) && f.bits;
        const int bits = f.bits, group_size = f.group_size;
        if (quantized && cols % group_size != 0) {
            rc = zy_fail(err, "quantize: tensor \"%s\" [%lld x %d]: its width %d is not a multiple of the group size %d "
                         "(choose --group-size dividing every matrix's width)", p->name,
                         (long long)(p->numel / (size_t)cols), cols, cols, group_size);
            break;
        }
        const int first = nt;
        size_t bytes = 0;
        if (!quantized) { /* as it is */
            ts[nt] = (StWriteTensor){.name = p->name, .ndim = p->ndim, .src_dtype = e->dtype, .out_dtype = e->dtype,
                                     .data = s.file[i]->data + e->offset};
            for (int k = 0; k < p->ndim; k++) ts[nt].shape[k] = p->shape[k];
            bytes = e->nbytes;
            nt++;
        } else {
            QuantJob *j = &jobs[i];
            *j = (QuantJob){.f = s.file[i], .e = e, .name = p->name, .rows = (long)(p->numel / (size_t)cols),
                            .cols = cols, .bits = bits, .group_size = group_size, .method = plan->method,
                            .importance = importance ? importance->of_tensor[i] : NULL,
                            .gram = importance && importance->gram ? importance->gram[i] : NULL};
            j->rows_per_block = j->rows / (p->ndim == 3 ? p->shape[0] : 1);
            char base[160];
            quant_base_name(base, sizeof base, p->name);
            snprintf(names[nt], sizeof names[nt], "%s", p->name);
            snprintf(names[nt + 1], sizeof names[nt + 1], "%s.scales", base);
            snprintf(names[nt + 2], sizeof names[nt + 2], "%s.biases", base);
            for (int part = 0; part < 3; part++, nt++) {
                StWriteTensor *w = &ts[nt];
                const ZyDtype dt = part == 0 ? ZY_DT_U32 : e->dtype;
                *w = (StWriteTensor){.name = names[nt], .ndim = p->ndim, .src_dtype = dt, .out_dtype = dt,
                                     .fill_bytes = quant_part_fill, .fill_ctx = &parts[nt]};
                parts[nt] = (QuantPart){.job = j, .which = part};
                for (int k = 0; k < p->ndim; k++) w->shape[k] = p->shape[k];
                w->shape[p->ndim - 1] = part == 0 ? zy_quant_row_words(cols, bits) : cols / group_size;
                size_t numel = 1;
                for (int k = 0; k < p->ndim; k++) numel *= (size_t)w->shape[k];
                bytes += numel * zy_dtype_size(dt);
            }
            rep->matrices++;
            rep->values += (double)p->numel;
            rep->quant_bytes += (double)bytes;
        }
        if (shard_bytes && in_shard > 0 && in_shard + bytes > shard_bytes) first_of_shard[n_shards++] = first, in_shard = 0;
        for (int k = first; k < nt; k++) shard_of[k] = n_shards - 1;
        in_shard += bytes;
        rep->bytes_in += (double)e->nbytes;
        rep->bytes_out += (double)bytes;
    }
    first_of_shard[n_shards] = nt;
    if (!rc) rc = zy_mkdirs(out, err);
    static const char *const metadata[] = {"format", "mlx", NULL};
    for (int sh = 0; sh < n_shards && !rc; sh++) {
        char path[4096], name[64];
        model_shard_name(name, sizeof name, sh, n_shards);
        rc = zy_path_join(path, sizeof path, out, name, err);
        if (!rc && (rc = st_write(path, ts + first_of_shard[sh], first_of_shard[sh + 1] - first_of_shard[sh], metadata, err)))
            for (int i = 0; i < n; i++)
                if (jobs[i].error[0]) zy_fail(err, "quantize: tensor \"%s\": %s", jobs[i].name, jobs[i].error);
    }
    if (!rc) {
        const char **list = calloc((size_t)nt + 1, sizeof *list);
        for (int k = 0; list && k < nt; k++) list[k] = ts[k].name;
        rc = list ? model_write_index(out, list, shard_of, nt, n_shards, rep->bytes_out, err) : zy_fail(err, "out of memory");
        free(list);
    }
    if (!rc) rc = write_config(src, out, plan, &t, err);
    if (!rc) rc = copy_side_files(src, out, err);
    rep->shards = n_shards;
    for (int i = 0; jobs && i < n; i++) quant_job_free(&jobs[i]);
    free(ts), free(jobs), free(parts), free(shard_of), free(first_of_shard), free(names);
    source_close(&s);
    params_free(&t);
    return rc;
}

/* ---- reading a quantized folder ---- */

/* The format of one module under config.json's "quantization": its own entry (false: unquantized, *bits = 0), else
 * the defaults. */
static void module_format(const cJSON *q, const char *base, const ZayaConfig *cfg, int *bits, int *group_size) {
    const cJSON *own = q ? cJSON_GetObjectItemCaseSensitive(q, base) : NULL;
    *bits = cfg->quant_bits, *group_size = cfg->quant_group_size;
    if (cJSON_IsFalse(own)) *bits = 0;
    if (cJSON_IsObject(own)) {
        const cJSON *b = cJSON_GetObjectItemCaseSensitive(own, "bits"), *g = cJSON_GetObjectItemCaseSensitive(own, "group_size");
        *bits = (int)b->valuedouble, *group_size = (int)g->valuedouble; /* config_parse checked them */
    }
}

static const StEntry *find_in(const StFile *st, int n_st, const char *name, const StFile **file) {
    for (int f = 0; f < n_st; f++) {
        const StEntry *e = st_find(&st[f], name);
        if (e) {
            *file = &st[f];
            return e;
        }
    }
    return NULL;
}

/* Checks one quantized tensor's three parts against the parameter p (errors name the tensor) and fills m's view. */
static int check_quantized(const ParamInfo *p, const char *base, int bits, int group_size, const StFile *st, int n_st,
                           ZyQuantMatrix *m, ZyErr *err) {
    const StFile *fq = NULL, *fs = NULL, *fb = NULL;
    char name[200];
    const StEntry *q = find_in(st, n_st, p->name, &fq);
    snprintf(name, sizeof name, "%s.scales", base);
    const StEntry *s = find_in(st, n_st, name, &fs);
    snprintf(name, sizeof name, "%s.biases", base);
    const StEntry *b = find_in(st, n_st, name, &fb);
    const int cols = (int)p->shape[p->ndim - 1];
    char want[96], got[96];
    int64_t shape[4];
    memcpy(shape, p->shape, sizeof shape);
    if (!q) return zy_fail(err, "missing tensor \"%s\" (the codes of %s.scales)", p->name, base);
    if (!b) return zy_fail(err, "tensor \"%s.scales\" has no \"%s\"", base, name);
    if (q->dtype != ZY_DT_U32)
        return zy_fail(err, "tensor \"%s\" is quantized (it has \"%s.scales\") but has dtype %s; the codes are U32",
                       p->name, base, zy_dtype_name(q->dtype));
    if (cols % group_size != 0)
        return zy_fail(err, "tensor \"%s\": its width %d is not a multiple of the group size %d", p->name, cols, group_size);
    shape[p->ndim - 1] = zy_quant_row_words(cols, bits);
    int same = q->ndim == p->ndim;
    for (int k = 0; same && k < p->ndim; k++) same = q->shape[k] == shape[k];
    if (!same) {
        shape_text(want, sizeof want, shape, p->ndim);
        shape_text(got, sizeof got, q->shape, q->ndim);
        return zy_fail(err, "tensor \"%s\" has shape [%s]: %d-bit codes of %d columns need [%s] (a truncated or "
                       "differently packed weight)", p->name, got, bits, cols, want);
    }
    shape[p->ndim - 1] = cols / group_size;
    for (int part = 0; part < 2; part++) {
        const StEntry *e = part ? b : s;
        if (e->dtype != ZY_DT_F32 && e->dtype != ZY_DT_BF16 && e->dtype != ZY_DT_F16)
            return zy_fail(err, "tensor \"%s\" has dtype %s; expected F32, BF16 or F16", e->name, zy_dtype_name(e->dtype));
        same = e->ndim == p->ndim && e->dtype == s->dtype;
        for (int k = 0; same && k < p->ndim; k++) same = e->shape[k] == shape[k];
        if (!same) {
            shape_text(want, sizeof want, shape, p->ndim);
            shape_text(got, sizeof got, e->shape, e->ndim);
            return zy_fail(err, "tensor \"%s\" has shape [%s] (%s): %d columns in groups of %d need [%s]%s", e->name,
                           got, zy_dtype_name(e->dtype), cols, group_size, want,
                           e->dtype != s->dtype ? ", in the scales' dtype" : "");
        }
    }
    *m = (ZyQuantMatrix){.bits = bits, .group_size = group_size, .rows = (long)(p->numel / (size_t)cols), .cols = cols,
                         .q = (const uint32_t *)(const void *)(fq->data + q->offset), .scales = fs->data + s->offset,
                         .biases = fb->data + b->offset, .scale_dtype = s->dtype};
    return 0;
}

/* A quantized folder read in place (quant_load with in_place): the files stay mapped (the codes, scales and biases
 * are read where they lie) and the tensors left unquantized get fp32 copies; freed by model_free. */
typedef struct {
    StFile *st;
    int n_st;
    float **t32;       /* [count] fp32 copies (NULL for a quantized matrix) */
    ZyQuantMatrix *tq; /* [count] the quantized matrices' views (codes NULL for the others) */
    int count;
} QuantViews;

static void quant_views_free(void *p) {
    QuantViews *v = p;
    if (!v) return;
    for (int f = 0; f < v->n_st; f++) st_close(&v->st[f]);
    for (int i = 0; v->t32 && i < v->count; i++) zy_free(v->t32[i]);
    free(v->st), free(v->t32), free(v->tq), free(v);
}

int quant_weight_bytes(const Model *m, size_t *mapped, size_t *copied) {
    const QuantViews *v = m->owner_free == quant_views_free ? m->owner : NULL;
    if (!v) return 0;
    *mapped = *copied = 0;
    for (int i = 0; i < v->count; i++) {
        const ZyQuantMatrix *q = &v->tq[i];
        const size_t groups = (size_t)q->rows * (size_t)(q->q ? q->cols / q->group_size : 0);
        if (q->q)
            *mapped += (size_t)q->rows * zy_quant_row_words(q->cols, q->bits) * 4 + 2 * groups * zy_dtype_size(q->scale_dtype);
        else
            *copied += m->params.info[i].numel * sizeof(float);
    }
    return 1;
}

int quant_load(Model *m, const char *dir, int in_place, ZyErr *err) {
    ZayaConfig cfg;
    char path[4096];
    if (load_config(dir, &cfg, err)) return -1;
    if (!cfg.quant_bits) return zy_fail(err, "%s: not quantized (config.json has no \"quantization\")", dir);
    cJSON *root = NULL;
    {
        char *text;
        size_t len;
        if (zy_path_join(path, sizeof path, dir, "config.json", err) || zy_read_file(path, &text, &len, err)) return -1;
        root = cJSON_ParseWithLength(text, len);
        free(text);
    }
    const cJSON *qcfg = cJSON_GetObjectItemCaseSensitive(root, "quantization");
    if (!qcfg) qcfg = cJSON_GetObjectItemCaseSensitive(root, "quantization_config");
    char **files;
    int n_files, rc;
    QuantViews *views = NULL;
    if ((in_place ? model_create_views : model_create)(m, &cfg, err)) {
        cJSON_Delete(root);
        return -1;
    }
    if (in_place) {
        views = calloc(1, sizeof *views);
        if (views) views->count = m->params.count;
        if (views) views->t32 = calloc((size_t)m->params.count, sizeof *views->t32);
        if (views) views->tq = calloc((size_t)m->params.count, sizeof *views->tq);
        if (!views || !views->t32 || !views->tq) {
            quant_views_free(views);
            cJSON_Delete(root);
            model_free(m);
            return zy_fail(err, "out of memory");
        }
        m->owner = views, m->owner_free = quant_views_free; /* model_free closes the files */
    }
    if ((rc = model_weight_files(dir, &files, &n_files, err)) == 0) {
        StFile *st = calloc((size_t)n_files, sizeof *st);
        int opened = 0;
        if (!st) rc = zy_fail(err, "out of memory");
        for (; opened < n_files && !rc; opened++) rc = st_open(&st[opened], files[opened], err);
        if (rc) opened--;
        /* every tensor in the files must be claimed by a parameter */
        int claimed = 0, total = 0;
        for (int f = 0; f < opened; f++) total += st[f].n_entries;
        for (int i = 0; i < m->params.count && !rc; i++) {
            const ParamInfo *p = &m->params.info[i];
            char base[160], sname[200];
            quant_base_name(base, sizeof base, p->name);
            snprintf(sname, sizeof sname, "%s.scales", base);
            const StFile *f;
            int bits, group_size;
            module_format(qcfg, base, &cfg, &bits, &group_size);
            float *dst = in_place ? NULL : m->params.data + p->offset;
            if (quant_holds(p) && find_in(st, opened, sname, &f)) {
                ZyQuantMatrix qm;
                if (bits == 0) bits = cfg.quant_bits, group_size = cfg.quant_group_size; /* scales say it is */
                if ((rc = check_quantized(p, base, bits, group_size, st, opened, &qm, err))) {
                    zy_wrap(err, "%s", dir);
                    break;
                }
                if (in_place)
                    views->tq[i] = qm;
                else
#pragma omp parallel for schedule(static)
                    for (long r = 0; r < qm.rows; r++) zy_quant_dequant_row(&qm, r, dst + (size_t)r * qm.cols);
                claimed += 3;
                continue;
            }
            const StEntry *e = find_in(st, opened, p->name, &f);
            if (!e) {
                rc = zy_fail(err, "%s: missing tensor \"%s\"", dir, p->name);
                break;
            }
            int same = e->ndim == p->ndim;
            for (int k = 0; same && k < p->ndim; k++) same = e->shape[k] == p->shape[k];
            if (!same || (e->dtype != ZY_DT_F32 && e->dtype != ZY_DT_BF16 && e->dtype != ZY_DT_F16)) {
                char want[96], got[96];
                shape_text(want, sizeof want, p->shape, p->ndim);
                shape_text(got, sizeof got, e->shape, e->ndim);
                rc = zy_fail(err, "%s: tensor \"%s\" is [%s] %s: unquantized it must be [%s] F32, BF16 or F16%s", f->label,
                             p->name, got, zy_dtype_name(e->dtype), want,
                             e->dtype == ZY_DT_U32 ? " (U32 codes need their .scales and .biases)" : "");
                break;
            }
            if (in_place && !(dst = views->t32[i] = zy_calloc(p->numel * sizeof(float)))) {
                rc = zy_fail(err, "out of memory for \"%s\"", p->name);
                break;
            }
            rc = st_read_f32(f, e, dst, err);
            claimed++;
        }
        if (!rc && claimed != total) { /* name the first stranger */
            for (int f = 0; f < opened && !rc; f++)
                for (int e = 0; e < st[f].n_entries && !rc; e++) {
                    char base[200];
                    snprintf(base, sizeof base, "%s", st[f].entries[e].name);
                    char *dot = strrchr(base, '.');
                    if (dot && (!strcmp(dot, ".scales") || !strcmp(dot, ".biases"))) *dot = '\0';
                    int known = params_find(&m->params, base) >= 0;
                    if (!known) {
                        char w[210];
                        snprintf(w, sizeof w, "%s.weight", base);
                        known = params_find(&m->params, w) >= 0;
                    }
                    if (!known && !(cfg.tie_word_embeddings && strncmp(base, "lm_head", 7) == 0))
                        rc = zy_fail(err, "%s: unexpected tensor \"%s\" (not part of this ZAYA config)", st[f].label,
                                     st[f].entries[e].name);
                }
        }
        if (views && st) { /* the views point into the mapped files: they stay open until model_free */
            views->st = st, views->n_st = opened;
            if (!rc) st_populate(st, opened); /* decoding reads every page: no faults in its steps */
            st = NULL, opened = 0;
        }
        for (int f = 0; f < opened; f++) st_close(&st[f]);
        free(st);
        model_weight_files_free(files, n_files);
    }
    cJSON_Delete(root);
    if (!rc && in_place) rc = model_bind_views(m, views->t32, NULL, views->tq, err);
    if (rc) model_free(m);
    return rc;
}
