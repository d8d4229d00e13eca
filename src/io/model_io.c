#include "io/model_io.h"

#include "model/legacy.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/quant_io.h"
#include "io/safetensors.h"

static int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* The shard files to read: model.safetensors, or the distinct files named by the index's weight_map. With an index,
 * *index gets its weight_map (tensor name -> file, cJSON; the caller deletes it) for the consistency checks. */
static int list_weight_files(const char *dir, char ***files, int *n_files, cJSON **index, char *index_path,
                             size_t index_cap, ZyErr *err) {
    char path[4096];
    *files = NULL;
    *n_files = 0;
    *index = NULL;
    if (zy_path_join(path, sizeof path, dir, "model.safetensors", err)) return -1;
    if (file_exists(path)) {
        *files = calloc(1, sizeof(char *));
        if (!*files || !((*files)[0] = strdup(path))) return zy_fail(err, "out of memory");
        *n_files = 1;
        return 0;
    }
    if (zy_path_join(path, sizeof path, dir, "model.safetensors.index.json", err)) return -1;
    if (!file_exists(path))
        return zy_fail(err, "%s: neither model.safetensors nor model.safetensors.index.json found", dir);
    snprintf(index_path, index_cap, "%s", path);
    char *text;
    size_t len;
    if (zy_read_file(path, &text, &len, err)) return -1;
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    const cJSON *map = root ? cJSON_GetObjectItemCaseSensitive(root, "weight_map") : NULL;
    if (!map || !cJSON_IsObject(map)) {
        cJSON_Delete(root);
        return zy_fail(err, "%s: invalid index (expected a JSON object with \"weight_map\")", path);
    }
    int cap = cJSON_GetArraySize(map);
    char **list = calloc((size_t)(cap > 0 ? cap : 1), sizeof(char *));
    int n = 0, rc = list ? 0 : zy_fail(err, "out of memory");
    const cJSON *it;
    cJSON_ArrayForEach(it, map) {
        if (rc) break;
        if (!cJSON_IsString(it) || strchr(it->valuestring, '/') || it->valuestring[0] == '.') {
            rc = zy_fail(err, "%s: weight_map[\"%s\"] must be a plain file name", path, it->string);
            break;
        }
        char full[4096];
        if ((rc = zy_path_join(full, sizeof full, dir, it->valuestring, err))) break;
        int seen = 0;
        for (int i = 0; i < n && !seen; i++) seen = strcmp(list[i], full) == 0;
        if (seen) continue;
        if (!file_exists(full)) {
            rc = zy_fail(err, "%s: weight_map[\"%s\"] names shard \"%s\", which does not exist", path, it->string,
                         it->valuestring);
            break;
        }
        if (!(list[n++] = strdup(full))) {
            rc = zy_fail(err, "out of memory");
            break;
        }
    }
    if (!rc && n == 0) rc = zy_fail(err, "%s: weight_map is empty", path);
    if (rc) {
        cJSON_Delete(root);
        for (int i = 0; i < n; i++) free(list[i]);
        free(list);
        return -1;
    }
    *files = list;
    *n_files = n;
    *index = root;
    return 0;
}

/* The parameter a checkpoint tensor fills: its native name (legacy names and the old router-norm alias mapped,
 * legacy.h) and, for a legacy per-expert tensor, which expert of the stack (else -1). -1 idx: not in this model. */
static int tensor_target(const Model *m, const char *name, int *idx, int *expert, ZyErr *err) {
    char mapped[256];
    *expert = -1;
    if (m->cfg.legacy_layout) {
        if (legacy_tensor_name(name, m->cfg.num_layers, mapped, sizeof mapped, expert, err)) return -1;
        name = mapped;
    } else if (native_alias_name(name, mapped, sizeof mapped)) {
        name = mapped;
    }
    *idx = params_find(&m->params, name);
    return 0;
}

static void shape_text(char *out, size_t cap, const int64_t *shape, int ndim) {
    out[0] = '\0';
    for (int k = 0; k < ndim; k++)
        snprintf(out + strlen(out), cap - strlen(out), "%s%lld", k ? ", " : "", (long long)shape[k]);
}

/* ---- mapped bf16 inference weights --------------------------------------------------------------------------
 * The matrices stay where the mapped shards hold them when they are stored bf16 (no copy: the page cache backs
 * them, and only the pages a token touches become resident); a matrix stored in another dtype, split into per-expert
 * parts (legacy) or at an odd address gets a bf16 copy of its own. Vectors and the convolution kernels are read into
 * one small fp32 arena. */
typedef struct {
    StFile *st;
    int n_st;
    float *small;                 /* fp32 tensors, packed */
    float **t32;                  /* [count] fp32 view per tensor (NULL for bf16 matrices) */
    const uint16_t **t16;         /* [count] bf16 view per bf16 matrix */
    uint16_t **owned;             /* [count] bf16 copies made here (NULL where the view is the mapped file) */
    int count;
} MappedWeights;

static void mapped_free(void *p) {
    MappedWeights *mw = p;
    if (!mw) return;
    for (int f = 0; f < mw->n_st; f++) st_close(&mw->st[f]);
    for (int i = 0; mw->owned && i < mw->count; i++) zy_free(mw->owned[i]);
    free(mw->st), zy_free(mw->small), free(mw->t32), free(mw->t16), free(mw->owned);
    free(mw);
}

static MappedWeights *mapped_create(const Model *m, ZyErr *err) {
    MappedWeights *mw = calloc(1, sizeof *mw);
    const int n = m->params.count;
    if (!mw) return zy_fail(err, "out of memory"), NULL;
    mw->count = n;
    mw->t32 = calloc((size_t)n, sizeof *mw->t32);
    mw->t16 = calloc((size_t)n, sizeof *mw->t16);
    mw->owned = calloc((size_t)n, sizeof *mw->owned);
    size_t floats = 0;
    for (int i = 0; i < n; i++)
        if (!model_holds_bf16(&m->params.info[i])) floats += (m->params.info[i].numel + 15) & ~(size_t)15;
    mw->small = zy_calloc((floats ? floats : 1) * sizeof(float));
    if (!mw->t32 || !mw->t16 || !mw->owned || !mw->small) {
        mapped_free(mw);
        return zy_fail(err, "out of memory"), NULL;
    }
    floats = 0;
    for (int i = 0; i < n; i++) {
        const ParamInfo *p = &m->params.info[i];
        if (model_holds_bf16(p)) continue;
        mw->t32[i] = mw->small + floats; /* 64-byte aligned, like the fp32 arena */
        floats += (p->numel + 15) & ~(size_t)15;
    }
    return mw;
}

/* Puts one checkpoint tensor (or one expert's part of a stack, ex >= 0 with `slice` values) in place. */
static int mapped_place(MappedWeights *mw, const ParamInfo *p, int idx, int ex, size_t slice, const StFile *f,
                        const StEntry *en, ZyErr *err) {
    if (!model_holds_bf16(p))
        return st_read_f32(f, en, mw->t32[idx] + (ex >= 0 ? (size_t)ex * slice : 0), err);
    const uint8_t *at = f->data + en->offset;
    if (ex < 0 && en->dtype == ZY_DT_BF16 && ((uintptr_t)at & 1) == 0) {
        mw->t16[idx] = (const uint16_t *)(const void *)at; /* zero copy */
        return 0;
    }
    if (!mw->owned[idx] && !(mw->owned[idx] = zy_calloc(p->numel * sizeof(uint16_t))))
        return zy_fail(err, "out of memory for a bf16 copy of \"%s\" (%zu MB)", p->name, p->numel * 2 >> 20);
    mw->t16[idx] = mw->owned[idx];
    return st_read_bf16(f, en, mw->owned[idx] + (ex >= 0 ? (size_t)ex * slice : 0), err);
}

/* Reads every tensor of the files in dir into m: fp32 into m's arena (mw NULL), or as mapped bf16 inference weights
 * (mw: the files then stay open in mw). */
static int load_weights(Model *m, const char *dir, MappedWeights *mw, ZyErr *err) {
    char **files, index_path[4096] = "";
    int n_files;
    cJSON *index;
    if (list_weight_files(dir, &files, &n_files, &index, index_path, sizeof index_path, err)) return -1;
    const cJSON *weight_map = index ? cJSON_GetObjectItemCaseSensitive(index, "weight_map") : NULL;
    StFile *st = calloc((size_t)n_files, sizeof *st);
    /* parts[i]: how many parts of tensor i arrived (1, or one per expert for a legacy checkpoint's stacks) */
    const int E = m->cfg.num_experts;
    int *parts = calloc((size_t)m->params.count, sizeof *parts);
    uint8_t *expert_seen = calloc((size_t)m->params.count * (size_t)(E > 0 ? E : 1), 1);
    int rc = 0, opened = 0;
    if (!st || !parts || !expert_seen) rc = zy_fail(err, "out of memory");
    for (int f = 0; f < n_files && !rc; f++, opened++)
        if ((rc = st_open(&st[f], files[f], err)) && index) zy_wrap(err, "shard named by %s", index_path);
    for (int f = 0; f < opened && !rc; f++) {
        const char *base = strrchr(files[f], '/') ? strrchr(files[f], '/') + 1 : files[f];
        for (int e = 0; e < st[f].n_entries && !rc; e++) {
            const StEntry *en = &st[f].entries[e];
            if (weight_map) { /* the index must say where each tensor is, and say it right */
                const cJSON *where = cJSON_GetObjectItemCaseSensitive(weight_map, en->name);
                if (!where) {
                    rc = zy_fail(err, "%s: tensor \"%s\" is not in %s's weight_map", files[f], en->name, index_path);
                    break;
                }
                if (strcmp(where->valuestring, base) != 0) {
                    rc = zy_fail(err, "%s: tensor \"%s\" is in shard %s, but the index puts it in %s", index_path,
                                 en->name, base, where->valuestring);
                    break;
                }
            }
            int idx, ex;
            if (tensor_target(m, en->name, &idx, &ex, err)) {
                rc = zy_wrap(err, "%s", files[f]);
                break;
            }
            if (idx < 0) {
                /* A tied model may still carry a copy of the head; it is the embedding by definition. */
                if (m->cfg.tie_word_embeddings && strcmp(en->name, "lm_head.weight") == 0) continue;
                rc = zy_fail(err, "%s: unexpected tensor \"%s\" (not part of this ZAYA config)", files[f], en->name);
                break;
            }
            const ParamInfo *p = &m->params.info[idx];
            /* a per-expert tensor is one [2I, D] or [D, I] slice of the stack [E, ...] */
            const int part = ex >= 0;
            if (part && (p->ndim != 3 || ex >= p->shape[0])) {
                rc = zy_fail(err, "%s: tensor \"%s\": expert %d, the config has %d experts", files[f], en->name, ex,
                             p->ndim == 3 ? (int)p->shape[0] : 0);
                break;
            }
            if (part ? expert_seen[(size_t)idx * E + ex] : parts[idx] > 0) {
                rc = zy_fail(err, "%s: tensor \"%s\" appears more than once%s", files[f], en->name,
                             n_files > 1 ? " (in two shards, or twice in one)" : "");
                break;
            }
            const int want_ndim = part ? p->ndim - 1 : p->ndim;
            const int64_t *want_shape = part ? p->shape + 1 : p->shape;
            int same = en->ndim == want_ndim;
            for (int k = 0; same && k < want_ndim; k++) same = en->shape[k] == want_shape[k];
            if (!same) {
                char want[96], got[96];
                shape_text(want, sizeof want, want_shape, want_ndim);
                shape_text(got, sizeof got, en->shape, en->ndim);
                rc = zy_fail(err, "%s: tensor \"%s\" has shape [%s], the config needs [%s]", files[f], en->name, got, want);
                break;
            }
            if (en->dtype != ZY_DT_F32 && en->dtype != ZY_DT_BF16 && en->dtype != ZY_DT_F16) {
                rc = zy_fail(err, "%s: tensor \"%s\" has dtype %s; expected F32, BF16 or F16", files[f], en->name,
                             zy_dtype_name(en->dtype));
                break;
            }
            const size_t slice = part ? p->numel / (size_t)p->shape[0] : 0;
            if (mw)
                rc = mapped_place(mw, p, idx, ex, slice, &st[f], en, err);
            else
                rc = st_read_f32(&st[f], en, m->params.data + p->offset + (part ? (size_t)ex * slice : 0), err);
            if (part) expert_seen[(size_t)idx * E + ex] = 1;
            parts[idx]++;
        }
    }
    if (!rc && weight_map) { /* and every tensor it lists must be where it says */
        const cJSON *it;
        cJSON_ArrayForEach(it, weight_map) {
            int found = 0;
            for (int f = 0; f < opened && !found; f++) {
                const char *base = strrchr(files[f], '/') ? strrchr(files[f], '/') + 1 : files[f];
                found = strcmp(base, it->valuestring) == 0 && st_find(&st[f], it->string);
            }
            if (!found) {
                rc = zy_fail(err, "%s: weight_map puts tensor \"%s\" in %s, which does not hold it", index_path,
                             it->string, it->valuestring);
                break;
            }
        }
    }
    for (int i = 0; i < m->params.count && !rc; i++) {
        const ParamInfo *p = &m->params.info[i];
        if (!parts[i]) rc = zy_fail(err, "%s: missing tensor \"%s\"", dir, p->name);
        else if (m->cfg.legacy_layout && p->ndim == 3 && strstr(p->name, ".mlp.experts.") && parts[i] != p->shape[0])
            rc = zy_fail(err, "%s: \"%s\" has %d of its %lld experts", dir, p->name, parts[i], (long long)p->shape[0]);
    }
    if (!rc && mw) { /* the files stay mapped for as long as the model lives */
        mw->st = st, mw->n_st = opened;
        st = NULL, opened = 0;
    }
    for (int f = 0; f < opened; f++) st_close(&st[f]);
    for (int f = 0; f < n_files; f++) free(files[f]);
    cJSON_Delete(index);
    free(files);
    free(st);
    free(parts);
    free(expert_seen);
    return rc;
}

int model_load_weights(Model *m, const char *dir, ZyErr *err) { return load_weights(m, dir, NULL, err); }

int model_weight_files(const char *dir, char ***files, int *n_files, ZyErr *err) {
    char index_path[4096];
    cJSON *index;
    if (list_weight_files(dir, files, n_files, &index, index_path, sizeof index_path, err)) return -1;
    cJSON_Delete(index);
    return 0;
}

void model_weight_files_free(char **files, int n_files) {
    for (int f = 0; f < n_files; f++) free(files[f]);
    free(files);
}

void model_shard_name(char *out, size_t cap, int shard, int n_shards) {
    if (n_shards == 1)
        snprintf(out, cap, "model.safetensors");
    else
        snprintf(out, cap, "model-%05d-of-%05d.safetensors", shard + 1, n_shards);
}

int model_write_index(const char *dir, const char *const *names, const int *shard_of, int n, int n_shards,
                      double total_bytes, ZyErr *err) {
    if (n_shards <= 1) return 0;
    char path[4096], name[64];
    cJSON *root = cJSON_CreateObject(), *meta = cJSON_AddObjectToObject(root, "metadata");
    cJSON_AddNumberToObject(meta, "total_size", total_bytes);
    cJSON *map = cJSON_AddObjectToObject(root, "weight_map");
    for (int i = 0; i < n; i++) {
        model_shard_name(name, sizeof name, shard_of[i], n_shards);
        cJSON_AddStringToObject(map, names[i], name);
    }
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    int rc = text ? zy_path_join(path, sizeof path, dir, "model.safetensors.index.json", err)
                  : zy_fail(err, "out of memory");
    if (!rc) rc = zy_write_file_atomic(path, text, strlen(text), err);
    free(text);
    /* a model.safetensors left from before would be read in the shards' place */
    if (!rc && zy_path_join(path, sizeof path, dir, "model.safetensors", err) == 0) unlink(path);
    return rc;
}

/* The convolution kernels bf16 inference reads as fp32 rounded to bf16 values (model_use_bf16 does the same). */
static void round_conv_kernels(const Model *m, MappedWeights *mw) {
    for (int i = 0; i < m->params.count; i++) {
        const ParamInfo *p = &m->params.info[i];
        if (p->ndim >= 2 && !model_holds_bf16(p))
            for (size_t j = 0; j < p->numel; j++) mw->t32[i][j] = zy_round_bf16(mw->t32[i][j]);
    }
}

int model_load_dir_as(Model *m, const char *dir, int dtype, ZyErr *err) {
    char path[4096];
    ZayaConfig cfg;
    if (zy_path_join(path, sizeof path, dir, "config.json", err) || config_load(&cfg, path, err)) return -1;
    const int bf16 = dtype == MODEL_DTYPE_BF16, bits = dtype == MODEL_DTYPE_Q8 || dtype == MODEL_DTYPE_Q4 ? dtype : 0;
    if (bits && !cfg.quant_bits)
        return zy_fail(err, "%s is not quantized (its config.json has no \"quantization\"): --dtype q%d reads a folder "
                       "that zaya quantize wrote (zaya quantize --model %s --out QDIR --bits %d)", dir, bits, dir, bits);
    if (cfg.quant_bits) { /* a quantized folder (io/quant_io.c) */
        if (bf16)
            return zy_fail(err, "%s: %d-bit quantized weights: they do not load as bf16 (--dtype q%d or auto reads "
                           "them in place, f32 dequantized)", dir, cfg.quant_bits, cfg.quant_bits);
        if (bits && bits != cfg.quant_bits)
            return zy_fail(err, "%s holds %d-bit quantized weights, not %d-bit ones (--dtype q%d or auto)", dir,
                           cfg.quant_bits, bits, cfg.quant_bits);
        return quant_load(m, dir, bits != 0, err);
    }
    if (!bf16) {
        if (model_create(m, &cfg, err)) return -1;
        if (load_weights(m, dir, NULL, err)) {
            model_free(m);
            return -1;
        }
        return 0;
    }
    if (model_create_views(m, &cfg, err)) return -1;
    MappedWeights *mw = mapped_create(m, err);
    if (!mw) {
        model_free(m);
        return -1;
    }
    m->owner = mw, m->owner_free = mapped_free;
    if (load_weights(m, dir, mw, err)) {
        model_free(m);
        return -1;
    }
    round_conv_kernels(m, mw);
    st_populate(mw->st, mw->n_st); /* decoding reads every page: no faults in its steps */
    if (model_bind_views(m, mw->t32, mw->t16, NULL, err)) {
        model_free(m);
        return -1;
    }
    return 0;
}

int model_load_dir(Model *m, const char *dir, ZyErr *err) { return model_load_dir_as(m, dir, 0, err); }

int model_dir_bf16_share(const char *dir, double *share, ZyErr *err) {
    char path[4096];
    ZayaConfig cfg;
    Model m;
    *share = 0;
    if (zy_path_join(path, sizeof path, dir, "config.json", err) || config_load(&cfg, path, err) ||
        model_create_views(&m, &cfg, err))
        return -1;
    char **files, index_path[4096];
    int n_files;
    cJSON *index;
    if (list_weight_files(dir, &files, &n_files, &index, index_path, sizeof index_path, err)) {
        model_free(&m);
        return -1;
    }
    double held = 0, held_bf16 = 0;
    int rc = 0;
    for (int f = 0; f < n_files && !rc; f++) {
        StFile st;
        if ((rc = st_open(&st, files[f], err))) break;
        for (int e = 0; e < st.n_entries && !rc; e++) {
            int idx, ex;
            if ((rc = tensor_target(&m, st.entries[e].name, &idx, &ex, err))) break;
            if (idx < 0 || !model_holds_bf16(&m.params.info[idx])) continue;
            held += (double)st.entries[e].numel;
            if (st.entries[e].dtype == ZY_DT_BF16) held_bf16 += (double)st.entries[e].numel;
        }
        st_close(&st);
    }
    for (int f = 0; f < n_files; f++) free(files[f]);
    free(files);
    cJSON_Delete(index);
    model_free(&m);
    if (!rc) *share = held > 0 ? held_bf16 / held : 0;
    return rc;
}

int model_resolve_dtype(const char *s, const char *flag, const char *dir, ZyErr *err) {
    if (strcmp(s, "q8") == 0) return MODEL_DTYPE_Q8;
    if (strcmp(s, "q4") == 0) return MODEL_DTYPE_Q4;
    if (strcmp(s, "auto") != 0) {
        ZyErr ignored;
        const int d = model_parse_dtype(s, flag, &ignored);
        return d >= 0 ? d : zy_fail(err, "%s: unknown data type \"%s\" (f32, bf16, q8, q4 or auto)", flag, s);
    }
    char path[4096];
    ZayaConfig cfg;
    if (zy_path_join(path, sizeof path, dir, "config.json", err) || config_load(&cfg, path, err)) return -1;
    if (cfg.quant_bits) return cfg.quant_bits; /* MODEL_DTYPE_Q8 or Q4: a quantized folder is read as it is */
    double share;
    if (model_dir_bf16_share(dir, &share, err)) return -1;
    return share == 1.0;
}

void model_weight_bytes(const Model *m, size_t *mapped, size_t *copied) {
    *mapped = *copied = 0;
    if (quant_weight_bytes(m, mapped, copied)) return;
    const MappedWeights *mw = m->owner_free == mapped_free ? m->owner : NULL;
    for (int i = 0; mw && i < m->params.count; i++) {
        const ParamInfo *p = &m->params.info[i];
        if (mw->t16[i] && !mw->owned[i]) *mapped += p->numel * 2;
        else *copied += p->numel * (mw->owned[i] ? 2 : 4);
    }
    if (!mw) *copied = m->params.total * 4 + (m->bf16 ? m->params.total * 2 : 0);
}

int model_tensor_source(const Model *m, int i, const float **f32, const uint16_t **bf16, ZyErr *err) {
    const ParamInfo *p = &m->params.info[i];
    const MappedWeights *mw = m->owner_free == mapped_free ? m->owner : NULL;
    *f32 = NULL, *bf16 = NULL;
    if (mw) /* the mapped load: its own per-tensor views */
        *f32 = mw->t32[i], *bf16 = *f32 ? NULL : mw->t16[i];
    else if (m->bf16 && model_holds_bf16(p)) /* model_use_bf16: these fp32 pages were given back */
        *bf16 = m->bf16 + p->offset;
    else if (m->params.data)
        *f32 = m->params.data + p->offset;
    if (!*f32 && !*bf16)
        return zy_fail(err, "tensor \"%s\": this model holds it neither as fp32 nor as bf16 values (quantized weights "
                       "read in place have no copy to upload)", p->name);
    return 0;
}

/* ---- zaya init, streamed ------------------------------------------------------------------------------------ */

/* model_init_weights' draws, made tensor by tensor in table order from one generator (the writer asks for each
 * tensor's values in order, once), so they are model_init_weights' values for the same seed, bit for bit, without
 * the model ever being in memory. */
typedef struct {
    ZyRng *rng;
    double std;
    const ParamInfo *p;
} InitTensor;

static int init_fill(void *ctx, size_t first, size_t count, float *out) {
    const InitTensor *t = ctx;
    model_init_values(t->p, t->std, t->rng, first, count, out);
    return 0;
}

int model_init_streamed(const ZayaConfig *cfg, uint64_t seed, const char *dir, ZyDtype dtype, size_t shard_bytes,
                        int *n_shards_out, ZyErr *err) {
    if (dtype != ZY_DT_F32 && dtype != ZY_DT_BF16) return zy_fail(err, "model_init_streamed: dtype must be F32 or BF16");
    ParamTable t;
    if (model_param_table(&t, cfg, err)) return -1;
    if (zy_mkdirs(dir, err)) {
        params_free(&t);
        return -1;
    }
    const int n = t.count;
    StWriteTensor *ts = calloc((size_t)n, sizeof *ts);
    InitTensor *it = calloc((size_t)n, sizeof *it);
    int *shard_of = calloc((size_t)n, sizeof *shard_of);
    ZyRng rng;
    zy_rng_seed(&rng, seed);
    int rc = 0, n_shards = 1;
    size_t total = 0, in_shard = 0;
    if (!ts || !it || !shard_of) rc = zy_fail(err, "out of memory");
    for (int i = 0; i < n && !rc; i++) {
        const ParamInfo *p = &t.info[i];
        ts[i].name = p->name;
        ts[i].ndim = p->ndim;
        for (int k = 0; k < p->ndim; k++) ts[i].shape[k] = p->shape[k];
        ts[i].src_dtype = ZY_DT_F32;
        ts[i].out_dtype = p->kind == PARAM_BUFFER ? ZY_DT_F32 : dtype; /* balancing biases stay fp32 */
        it[i] = (InitTensor){.rng = &rng, .std = cfg->initializer_range, .p = p};
        ts[i].fill = init_fill;
        ts[i].fill_ctx = &it[i];
        const size_t bytes = p->numel * zy_dtype_size(ts[i].out_dtype);
        if (shard_bytes && in_shard > 0 && in_shard + bytes > shard_bytes) n_shards++, in_shard = 0;
        shard_of[i] = n_shards - 1;
        in_shard += bytes;
        total += bytes;
    }
    char path[4096], name[64];
    static const char *const metadata[] = {"format", "pt", NULL};
    /* shards in table order, so the generator runs through the tensors exactly as model_init_weights does */
    for (int sh = 0, first = 0; sh < n_shards && !rc; sh++) {
        int last = first;
        while (last < n && shard_of[last] == sh) last++;
        model_shard_name(name, sizeof name, sh, n_shards);
        rc = zy_path_join(path, sizeof path, dir, name, err);
        if (!rc) rc = st_write(path, ts + first, last - first, metadata, err);
        first = last;
    }
    if (!rc && n_shards > 1) { /* the index transformers reads: total_size and where each tensor is */
        const char **names = calloc((size_t)n, sizeof *names);
        for (int i = 0; names && i < n; i++) names[i] = t.info[i].name;
        rc = names ? model_write_index(dir, names, shard_of, n, n_shards, (double)total, err) : zy_fail(err, "out of memory");
        free(names);
    }
    if (!rc) rc = zy_path_join(path, sizeof path, dir, "config.json", err);
    if (!rc) rc = config_save(cfg, path, dtype == ZY_DT_BF16 ? "bfloat16" : "float32", err);
    if (!rc && n_shards_out) *n_shards_out = n_shards;
    free(ts), free(it), free(shard_of);
    params_free(&t);
    return rc;
}

int model_save_dir(const Model *m, const char *dir, ZyDtype dtype, ZyErr *err) {
    if (dtype != ZY_DT_F32 && dtype != ZY_DT_BF16) return zy_fail(err, "model_save_dir: dtype must be F32 or BF16");
    if (zy_mkdirs(dir, err)) return -1;
    char path[4096];
    const ParamTable *t = &m->params;
    StWriteTensor *ts = calloc((size_t)t->count, sizeof *ts);
    if (!ts) return zy_fail(err, "out of memory");
    for (int i = 0; i < t->count; i++) {
        const ParamInfo *p = &t->info[i];
        ts[i].name = p->name;
        ts[i].ndim = p->ndim;
        for (int k = 0; k < p->ndim; k++) ts[i].shape[k] = p->shape[k];
        ts[i].src_dtype = ZY_DT_F32;
        ts[i].out_dtype = p->kind == PARAM_BUFFER ? ZY_DT_F32 : dtype; /* balancing biases stay fp32 */
        ts[i].data = t->data + p->offset;
    }
    static const char *const metadata[] = {"format", "pt", NULL};
    int rc = zy_path_join(path, sizeof path, dir, "model.safetensors", err);
    if (!rc) rc = st_write(path, ts, t->count, metadata, err);
    free(ts);
    if (rc) return -1;
    if (zy_path_join(path, sizeof path, dir, "config.json", err)) return -1;
    return config_save(&m->cfg, path, dtype == ZY_DT_BF16 ? "bfloat16" : "float32", err);
}

/* ---- generation_config.json ------------------------------------------------------------------------------- */

int generation_config_load(GenerationConfig *gc, const char *dir, ZyErr *err) {
    memset(gc, 0, sizeof *gc);
    char path[4096];
    if (zy_path_join(path, sizeof path, dir, "generation_config.json", err)) return -1;
    struct stat st;
    if (stat(path, &st) != 0) return 0; /* optional */
    char *text = NULL;
    size_t len = 0;
    if (zy_read_file(path, &text, &len, err)) return -1;
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return zy_fail(err, "%s: invalid JSON (expected an object)", path);
    }
    int rc = -1;
    gc->present = 1;
    const cJSON *eos = cJSON_GetObjectItemCaseSensitive(root, "eos_token_id");
    if (cJSON_IsNumber(eos)) {
        if (eos->valuedouble != (int32_t)eos->valuedouble || eos->valuedouble < 0) {
            zy_fail(err, "%s: eos_token_id must be a non-negative integer", path);
            goto done;
        }
        gc->eos[gc->n_eos++] = (int32_t)eos->valuedouble;
    } else if (cJSON_IsArray(eos)) {
        const cJSON *e;
        cJSON_ArrayForEach(e, eos) {
            if (!cJSON_IsNumber(e) || e->valuedouble != (int32_t)e->valuedouble || e->valuedouble < 0) {
                zy_fail(err, "%s: eos_token_id[%d] must be a non-negative integer", path, gc->n_eos);
                goto done;
            }
            if (gc->n_eos == GEN_MAX_EOS) {
                zy_fail(err, "%s: eos_token_id lists more than %d ids", path, GEN_MAX_EOS);
                goto done;
            }
            gc->eos[gc->n_eos++] = (int32_t)e->valuedouble;
        }
    } else if (eos && !cJSON_IsNull(eos)) {
        zy_fail(err, "%s: eos_token_id must be an integer or a list of integers", path);
        goto done;
    }
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "do_sample");
    if (v && !cJSON_IsNull(v)) {
        if (!cJSON_IsBool(v)) {
            zy_fail(err, "%s: do_sample must be true or false", path);
            goto done;
        }
        gc->has_do_sample = 1, gc->do_sample = cJSON_IsTrue(v);
    }
    v = cJSON_GetObjectItemCaseSensitive(root, "temperature");
    if (v && !cJSON_IsNull(v)) {
        if (!cJSON_IsNumber(v) || v->valuedouble < 0) {
            zy_fail(err, "%s: temperature must be a non-negative number", path);
            goto done;
        }
        gc->has_temperature = 1, gc->temperature = v->valuedouble;
    }
    v = cJSON_GetObjectItemCaseSensitive(root, "top_k");
    if (v && !cJSON_IsNull(v)) {
        if (!cJSON_IsNumber(v) || v->valuedouble != (int)v->valuedouble || v->valuedouble < 0) {
            zy_fail(err, "%s: top_k must be a non-negative integer", path);
            goto done;
        }
        gc->has_top_k = 1, gc->top_k = (int)v->valuedouble;
    }
    v = cJSON_GetObjectItemCaseSensitive(root, "top_p");
    if (v && !cJSON_IsNull(v)) {
        if (!cJSON_IsNumber(v) || !(v->valuedouble > 0 && v->valuedouble <= 1)) {
            zy_fail(err, "%s: top_p must be in (0, 1]", path);
            goto done;
        }
        gc->has_top_p = 1, gc->top_p = v->valuedouble;
    }
    rc = 0;
done:
    cJSON_Delete(root);
    return rc;
}

int generation_stop_ids(int32_t *out, int model_eos, int tokenizer_eos, const GenerationConfig *gc) {
    int n = 0;
    const int n_gc = gc ? gc->n_eos : 0;
    for (int i = -2; i < n_gc; i++) {
        const int id = i == -2 ? model_eos : i == -1 ? tokenizer_eos : gc->eos[i];
        int seen = id < 0;
        for (int k = 0; k < n && !seen; k++) seen = out[k] == id;
        if (!seen) out[n++] = id;
    }
    return n;
}
