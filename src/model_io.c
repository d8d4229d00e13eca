#include "model_io.h"

#include "legacy.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "safetensors.h"

static int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* The shard files to read: model.safetensors, or the distinct files named by the index's weight_map. */
static int list_weight_files(const char *dir, char ***files, int *n_files, ZyErr *err) {
    char path[4096];
    *files = NULL;
    *n_files = 0;
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
    char *text;
    size_t len;
    if (zy_read_file(path, &text, &len, err)) return -1;
    cJSON *root = cJSON_Parse(text);
    free(text);
    const cJSON *map = root ? cJSON_GetObjectItemCaseSensitive(root, "weight_map") : NULL;
    if (!map || !cJSON_IsObject(map)) {
        cJSON_Delete(root);
        return zy_fail(err, "%s: invalid index (expected a JSON object with \"weight_map\")", path);
    }
    int cap = cJSON_GetArraySize(map);
    char **list = calloc((size_t)(cap > 0 ? cap : 1), sizeof(char *));
    int n = 0, rc = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, map) {
        if (!cJSON_IsString(it) || strchr(it->valuestring, '/') || it->valuestring[0] == '.') {
            rc = zy_fail(err, "%s: weight_map[\"%s\"] must be a plain file name", path, it->string);
            break;
        }
        char full[4096];
        if ((rc = zy_path_join(full, sizeof full, dir, it->valuestring, err))) break;
        int seen = 0;
        for (int i = 0; i < n && !seen; i++) seen = strcmp(list[i], full) == 0;
        if (!seen && !(list[n++] = strdup(full))) {
            rc = zy_fail(err, "out of memory");
            break;
        }
    }
    cJSON_Delete(root);
    if (rc) {
        for (int i = 0; i < n; i++) free(list[i]);
        free(list);
        return -1;
    }
    *files = list;
    *n_files = n;
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

static int load_weights(Model *m, const char *dir, int bf16, ZyErr *err) {
    char **files;
    int n_files;
    if (list_weight_files(dir, &files, &n_files, err)) return -1;
    StFile *st = calloc((size_t)n_files, sizeof *st);
    /* parts[i]: how many parts of tensor i arrived (1, or one per expert for a legacy checkpoint's stacks) */
    const int E = m->cfg.num_experts;
    int *parts = calloc((size_t)m->params.count, sizeof *parts);
    uint8_t *expert_seen = calloc((size_t)m->params.count * (size_t)(E > 0 ? E : 1), 1);
    int rc = 0, opened = 0;
    if (!st || !parts || !expert_seen) rc = zy_fail(err, "out of memory");
    for (int f = 0; f < n_files && !rc; f++, opened++) rc = st_open(&st[f], files[f], err);
    for (int f = 0; f < opened && !rc; f++) {
        for (int e = 0; e < st[f].n_entries && !rc; e++) {
            const StEntry *en = &st[f].entries[e];
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
                rc = zy_fail(err, "%s: tensor \"%s\" appears more than once", files[f], en->name);
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
            rc = st_read_f32(&st[f], en, m->params.data + p->offset + (part ? (size_t)ex * slice : 0), err);
            if (part) expert_seen[(size_t)idx * E + ex] = 1;
            parts[idx]++;
            const int complete = part ? parts[idx] == p->shape[0] : 1;
            if (!rc && bf16 && complete) model_bf16_convert(m, idx); /* one tensor in fp32 at a time */
        }
    }
    for (int i = 0; i < m->params.count && !rc; i++) {
        const ParamInfo *p = &m->params.info[i];
        if (!parts[i]) rc = zy_fail(err, "%s: missing tensor \"%s\"", dir, p->name);
        else if (m->cfg.legacy_layout && p->ndim == 3 && strstr(p->name, ".mlp.experts.") && parts[i] != p->shape[0])
            rc = zy_fail(err, "%s: \"%s\" has %d of its %lld experts", dir, p->name, parts[i], (long long)p->shape[0]);
    }
    for (int f = 0; f < opened; f++) st_close(&st[f]);
    for (int f = 0; f < n_files; f++) free(files[f]);
    free(files);
    free(st);
    free(parts);
    free(expert_seen);
    return rc;
}

int model_load_weights(Model *m, const char *dir, ZyErr *err) { return load_weights(m, dir, 0, err); }

int model_load_dir_as(Model *m, const char *dir, int bf16, ZyErr *err) {
    char path[4096];
    ZayaConfig cfg;
    if (zy_path_join(path, sizeof path, dir, "config.json", err) || config_load(&cfg, path, err)) return -1;
    if (model_create(m, &cfg, err)) return -1;
    if ((bf16 && model_bf16_begin(m, err)) || load_weights(m, dir, bf16, err)) {
        model_free(m);
        return -1;
    }
    if (bf16) model_bf16_finish(m);
    return 0;
}

int model_load_dir(Model *m, const char *dir, ZyErr *err) { return model_load_dir_as(m, dir, 0, err); }

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
