#include "train/runconfig.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Rejects any key of obj not in allowed (NULL-terminated); path names the object in messages. */
static int check_keys(const cJSON *obj, const char *const *allowed, const char *label, const char *path, ZyErr *err) {
    const cJSON *it;
    cJSON_ArrayForEach(it, obj) {
        int ok = 0;
        for (int i = 0; allowed[i] && !ok; i++) ok = strcmp(it->string, allowed[i]) == 0;
        if (!ok) return zy_fail(err, "%s: unknown key \"%s%s%s\"", label, path, *path ? "." : "", it->string);
    }
    return 0;
}

static const cJSON *get(const cJSON *obj, const char *key) { return cJSON_GetObjectItemCaseSensitive(obj, key); }

static int read_string(const cJSON *obj, const char *key, int required, char *out, size_t cap, const char *label,
                       const char *path, ZyErr *err) {
    const cJSON *v = get(obj, key);
    if (!v || cJSON_IsNull(v)) {
        if (required) return zy_fail(err, "%s: missing key \"%s%s%s\"", label, path, *path ? "." : "", key);
        out[0] = '\0';
        return 0;
    }
    if (!cJSON_IsString(v)) return zy_fail(err, "%s: key \"%s%s%s\" must be a string", label, path, *path ? "." : "", key);
    if (required && !v->valuestring[0])
        return zy_fail(err, "%s: key \"%s%s%s\" must not be empty", label, path, *path ? "." : "", key);
    if (strlen(v->valuestring) >= cap) return zy_fail(err, "%s: key \"%s%s%s\" is too long", label, path, *path ? "." : "", key);
    strcpy(out, v->valuestring);
    return 0;
}

static int read_number(const cJSON *obj, const char *key, int required, double def, double lo, double hi, int integer,
                       double *out, const char *label, const char *path, ZyErr *err) {
    const cJSON *v = get(obj, key);
    const char *dot = *path ? "." : "";
    if (!v || cJSON_IsNull(v)) {
        if (required) return zy_fail(err, "%s: missing key \"%s%s%s\"", label, path, dot, key);
        *out = def;
        return 0;
    }
    if (!cJSON_IsNumber(v)) return zy_fail(err, "%s: key \"%s%s%s\" must be a number", label, path, dot, key);
    double d = v->valuedouble;
    if (integer && d != floor(d)) return zy_fail(err, "%s: key \"%s%s%s\" must be an integer (got %g)", label, path, dot, key, d);
    if (!(d >= lo && d <= hi))
        return zy_fail(err, "%s: key \"%s%s%s\" = %g is out of range [%g, %g]", label, path, dot, key, d, lo, hi);
    *out = d;
    return 0;
}

static int read_bool(const cJSON *obj, const char *key, int def, int *out, const char *label, const char *path, ZyErr *err) {
    const cJSON *v = get(obj, key);
    if (!v || cJSON_IsNull(v)) {
        *out = def;
        return 0;
    }
    if (!cJSON_IsBool(v)) return zy_fail(err, "%s: key \"%s.%s\" must be true or false", label, path, key);
    *out = cJSON_IsTrue(v);
    return 0;
}

/* Sets root[a][b]...=value for a dotted path; array elements by index; creates missing object keys. */
static int apply_override(cJSON *root, const char *spec, const char *label, ZyErr *err) {
    const char *eq = strchr(spec, '=');
    if (!eq || eq == spec) return zy_fail(err, "--override \"%s\": expected key=value", spec);
    char key[512];
    size_t klen = (size_t)(eq - spec);
    if (klen >= sizeof key) return zy_fail(err, "--override \"%s\": key too long", spec);
    memcpy(key, spec, klen);
    key[klen] = '\0';
    cJSON *value = cJSON_Parse(eq + 1);
    if (!value) value = cJSON_CreateString(eq + 1);
    cJSON *node = root;
    char *save = NULL, *part = strtok_r(key, ".", &save);
    while (part) {
        char *next = strtok_r(NULL, ".", &save);
        if (cJSON_IsArray(node)) {
            char *end;
            long idx = strtol(part, &end, 10);
            if (*end || idx < 0 || idx >= cJSON_GetArraySize(node)) {
                cJSON_Delete(value);
                return zy_fail(err, "--override \"%s\": no element %s in a list of %d (%s)", spec, part,
                               cJSON_GetArraySize(node), label);
            }
            if (!next) {
                cJSON_ReplaceItemInArray(node, (int)idx, value);
                return 0;
            }
            node = cJSON_GetArrayItem(node, (int)idx);
        } else if (cJSON_IsObject(node)) {
            if (!next) {
                if (get(node, part))
                    cJSON_ReplaceItemInObjectCaseSensitive(node, part, value);
                else
                    cJSON_AddItemToObject(node, part, value);
                return 0;
            }
            cJSON *child = cJSON_GetObjectItemCaseSensitive(node, part);
            if (!child) child = cJSON_AddObjectToObject(node, part);
            node = child;
        } else {
            cJSON_Delete(value);
            return zy_fail(err, "--override \"%s\": \"%s\" is not an object or list", spec, part);
        }
        part = next;
    }
    cJSON_Delete(value);
    return zy_fail(err, "--override \"%s\": empty key", spec);
}

int runconfig_parse_device(const char *s, int *gpu, int *index, ZyErr *err) {
    *gpu = 0, *index = -1;
    if (strcmp(s, "cpu") == 0) return 0;
    if (strcmp(s, "cuda") == 0 || strcmp(s, "gpu") == 0) return *gpu = 1, 0;
    if (strncmp(s, "cuda:", 5) == 0 && s[5] >= '0' && s[5] <= '9') {
        char *end;
        long v = strtol(s + 5, &end, 10);
        if (!*end && v < 1024) return *gpu = 1, *index = (int)v, 0;
    }
    return zy_fail(err, "unknown device \"%s\" (cpu, cuda, or cuda:N for GPU N)", s);
}

static int parse_tree(RunConfig *rc, const cJSON *root, const char *label, ZyErr *err) {
    static const char *const top_keys[] = {"model", "init_from", "tokenizer", "datasets", "phases", "batch_size",
                                           "micro_batch", "optimizer", "schedule", "balancing", "checkpoint", "eval",
                                           "log_interval", "seed", "out_dir", "comment", "precision", "bf16_products",
                                           "device", NULL};
    if (!cJSON_IsObject(root)) return zy_fail(err, "%s: expected a JSON object", label);
    if (check_keys(root, top_keys, label, "", err)) return -1;
    double d;
    if (read_string(root, "model", 0, rc->model_config, RUN_PATH, label, "", err) ||
        read_string(root, "init_from", 0, rc->init_from, RUN_PATH, label, "", err) ||
        read_string(root, "tokenizer", 0, rc->tokenizer, RUN_PATH, label, "", err) ||
        read_string(root, "out_dir", 1, rc->out_dir, RUN_PATH, label, "", err))
        return -1;
    if (!rc->model_config[0] && !rc->init_from[0])
        return zy_fail(err, "%s: one of \"model\" (a model config) or \"init_from\" (a model directory) is required", label);
    if (rc->model_config[0] && rc->init_from[0])
        return zy_fail(err, "%s: give either \"model\" or \"init_from\", not both", label);
    /* integers stay below 1e15: cJSON writes numbers with 15 significant digits when that reads back within an ulp,
     * so a 16-digit seed would come back changed from run.json and trainer_state.json */
    if (read_number(root, "seed", 0, 0, 0, 999999999999999.0, 1, &d, label, "", err)) return -1;
    rc->seed = (uint64_t)d;
    if (read_number(root, "batch_size", 1, 0, 1, 1 << 20, 1, &d, label, "", err)) return -1;
    rc->batch_size = (int)d;
    if (read_number(root, "micro_batch", 0, rc->batch_size, 1, 1 << 20, 1, &d, label, "", err)) return -1;
    rc->micro_batch = (int)d;
    if (rc->batch_size % rc->micro_batch != 0)
        return zy_fail(err, "%s: batch_size (%d) must be a multiple of micro_batch (%d)", label, rc->batch_size,
                       rc->micro_batch);
    if (read_number(root, "log_interval", 0, 10, 1, 1e9, 1, &d, label, "", err)) return -1;
    rc->log_interval = (int)d;
    char precision[16];
    if (read_string(root, "precision", 0, precision, sizeof precision, label, "", err)) return -1;
    if (!precision[0] || strcmp(precision, "fp32") == 0)
        rc->bf16 = 0;
    else if (strcmp(precision, "bf16") == 0)
        rc->bf16 = 1;
    else
        return zy_fail(err, "%s: key \"precision\" must be \"fp32\" or \"bf16\", not \"%s\"", label, precision);
    /* how bf16 products run on a CPU (kernels/matmul.h ZyBf16Products; names spelled here so the parser stands alone) */
    char products[16];
    static const char *const product_names[] = {"fp32", "onednn", "sgemm"}; /* ZY_BF16_PRODUCTS_FP32 .. _SGEMM */
    if (read_string(root, "bf16_products", 0, products, sizeof products, label, "", err)) return -1;
    rc->bf16_products = ZY_BF16_PRODUCTS_AUTO;
    for (int i = 0; i < 3; i++)
        if (strcmp(products, product_names[i]) == 0) rc->bf16_products = i;
    if (products[0] && strcmp(products, "auto") != 0 && rc->bf16_products == ZY_BF16_PRODUCTS_AUTO)
        return zy_fail(err, "%s: key \"bf16_products\" must be \"auto\", \"fp32\", \"onednn\" or \"sgemm\", not \"%s\"",
                       label, products);
    char device[32];
    if (read_string(root, "device", 0, device, sizeof device, label, "", err)) return -1;
    if (runconfig_parse_device(device[0] ? device : "cpu", &rc->gpu, &rc->gpu_index, err))
        return zy_wrap(err, "%s: key \"device\"", label);

    /* datasets: {"name": "shard dir", ...} */
    const cJSON *ds = get(root, "datasets");
    if (!ds || !cJSON_IsObject(ds) || cJSON_GetArraySize(ds) == 0)
        return zy_fail(err, "%s: key \"datasets\" must be a non-empty object {name: shard directory}", label);
    const cJSON *it;
    cJSON_ArrayForEach(it, ds) {
        if (rc->n_datasets == RUN_MAX_DATASETS) return zy_fail(err, "%s: at most %d datasets", label, RUN_MAX_DATASETS);
        if (!cJSON_IsString(it)) return zy_fail(err, "%s: key \"datasets.%s\" must be a directory path", label, it->string);
        if (strlen(it->string) >= 64 || strlen(it->valuestring) >= RUN_PATH)
            return zy_fail(err, "%s: key \"datasets.%s\": name or path too long", label, it->string);
        strcpy(rc->dataset_names[rc->n_datasets], it->string);
        strcpy(rc->dataset_dirs[rc->n_datasets], it->valuestring);
        rc->n_datasets++;
    }

    /* phases */
    const cJSON *ph = get(root, "phases");
    if (!ph || !cJSON_IsArray(ph) || cJSON_GetArraySize(ph) == 0)
        return zy_fail(err, "%s: key \"phases\" must be a non-empty list", label);
    static const char *const phase_keys[] = {"name", "tokens", "seq_len", "mixture", NULL};
    cJSON_ArrayForEach(it, ph) {
        if (rc->n_phases == RUN_MAX_PHASES) return zy_fail(err, "%s: at most %d phases", label, RUN_MAX_PHASES);
        PhaseConfig *p = &rc->phases[rc->n_phases];
        char path[32];
        snprintf(path, sizeof path, "phases.%d", rc->n_phases);
        if (!cJSON_IsObject(it)) return zy_fail(err, "%s: key \"%s\" must be an object", label, path);
        if (check_keys(it, phase_keys, label, path, err)) return -1;
        if (read_string(it, "name", 0, p->name, sizeof p->name, label, path, err)) return -1;
        if (!p->name[0]) snprintf(p->name, sizeof p->name, "phase%d", rc->n_phases + 1);
        if (read_number(it, "tokens", 1, 0, 1, 1e15, 1, &d, label, path, err)) return -1;
        p->tokens = (int64_t)d;
        if (read_number(it, "seq_len", 1, 0, 1, 1 << 20, 1, &d, label, path, err)) return -1;
        p->seq_len = (int)d;
        const cJSON *mix = get(it, "mixture");
        if (!mix || !cJSON_IsObject(mix) || cJSON_GetArraySize(mix) == 0)
            return zy_fail(err, "%s: key \"%s.mixture\" must be a non-empty object {dataset: weight}", label, path);
        double total = 0;
        const cJSON *w;
        cJSON_ArrayForEach(w, mix) {
            int idx = -1;
            for (int k = 0; k < rc->n_datasets; k++)
                if (strcmp(rc->dataset_names[k], w->string) == 0) idx = k;
            if (idx < 0) return zy_fail(err, "%s: key \"%s.mixture.%s\": no such dataset", label, path, w->string);
            if (!cJSON_IsNumber(w) || !(w->valuedouble >= 0) || !isfinite(w->valuedouble))
                return zy_fail(err, "%s: key \"%s.mixture.%s\" must be a non-negative number", label, path, w->string);
            p->mixture[idx] = w->valuedouble;
            total += w->valuedouble;
        }
        if (!(total > 0)) return zy_fail(err, "%s: key \"%s.mixture\" has no positive weight", label, path);
        rc->n_phases++;
    }
    int64_t per_step;
    rc->total_steps = 0;
    for (int i = 0; i < rc->n_phases; i++) {
        PhaseConfig *p = &rc->phases[i];
        per_step = (int64_t)rc->batch_size * p->seq_len;
        p->steps = (p->tokens + per_step - 1) / per_step;
        p->first_step = rc->total_steps;
        rc->total_steps += p->steps;
    }

    /* optimizer */
    optim_config_default(&rc->optim);
    rc->optim.router_lr_scale = 0.1; /* docs/training.md "Routing health": a router at the full lr outruns the controller */
    rc->lr = 0.01;
    rc->grad_clip = 1.0;
    const cJSON *opt = get(root, "optimizer");
    if (opt) {
        static const char *const k[] = {"lr",  "weight_decay", "beta1",           "beta2",
                                        "eps", "muon_momentum", "router_lr_scale", "grad_clip", NULL};
        if (!cJSON_IsObject(opt)) return zy_fail(err, "%s: key \"optimizer\" must be an object", label);
        if (check_keys(opt, k, label, "optimizer", err) ||
            read_number(opt, "lr", 0, rc->lr, 0, 10, 0, &rc->lr, label, "optimizer", err) ||
            read_number(opt, "weight_decay", 0, rc->optim.weight_decay, 0, 10, 0, &rc->optim.weight_decay, label, "optimizer", err) ||
            read_number(opt, "beta1", 0, rc->optim.beta1, 0, 0.999999, 0, &rc->optim.beta1, label, "optimizer", err) ||
            read_number(opt, "beta2", 0, rc->optim.beta2, 0, 0.999999999, 0, &rc->optim.beta2, label, "optimizer", err) ||
            read_number(opt, "eps", 0, rc->optim.eps, 0, 1, 0, &rc->optim.eps, label, "optimizer", err) ||
            read_number(opt, "muon_momentum", 0, rc->optim.muon_momentum, 0, 0.999999, 0, &rc->optim.muon_momentum, label, "optimizer", err) ||
            read_number(opt, "router_lr_scale", 0, rc->optim.router_lr_scale, 0, 10, 0, &rc->optim.router_lr_scale,
                        label, "optimizer", err) ||
            read_number(opt, "grad_clip", 0, rc->grad_clip, 0, 1e9, 0, &rc->grad_clip, label, "optimizer", err))
            return -1;
    }

    /* schedule */
    rc->schedule = (Schedule){.type = SCHEDULE_WSD, .peak_lr = rc->lr, .warmup_steps = 0, .total_steps = rc->total_steps,
                              .decay_fraction = 0.2, .min_ratio = 0.1};
    const cJSON *sch = get(root, "schedule");
    if (sch) {
        static const char *const k[] = {"type", "warmup_steps", "decay_fraction", "min_lr_ratio", NULL};
        if (!cJSON_IsObject(sch)) return zy_fail(err, "%s: key \"schedule\" must be an object", label);
        if (check_keys(sch, k, label, "schedule", err)) return -1;
        char type[16];
        if (read_string(sch, "type", 0, type, sizeof type, label, "schedule", err)) return -1;
        if (!type[0] || strcmp(type, "wsd") == 0)
            rc->schedule.type = SCHEDULE_WSD;
        else if (strcmp(type, "cosine") == 0)
            rc->schedule.type = SCHEDULE_COSINE;
        else if (strcmp(type, "constant") == 0)
            rc->schedule.type = SCHEDULE_CONSTANT;
        else
            return zy_fail(err, "%s: key \"schedule.type\" must be \"wsd\", \"cosine\" or \"constant\" (got \"%s\")", label, type);
        if (read_number(sch, "warmup_steps", 0, 0, 0, 1e12, 1, &d, label, "schedule", err)) return -1;
        rc->schedule.warmup_steps = (int64_t)d;
        if (read_number(sch, "decay_fraction", 0, 0.2, 0, 1, 0, &rc->schedule.decay_fraction, label, "schedule", err) ||
            read_number(sch, "min_lr_ratio", 0, 0.1, 0, 1, 0, &rc->schedule.min_ratio, label, "schedule", err))
            return -1;
    }

    /* balancing */
    rc->balancing = 1;
    rc->balancing_lr = 1e-3;
    rc->skip_rate = -1;
    const cJSON *bal = get(root, "balancing");
    if (bal) {
        static const char *const k[] = {"enabled", "lr", "skip_rate", NULL};
        if (!cJSON_IsObject(bal)) return zy_fail(err, "%s: key \"balancing\" must be an object", label);
        if (check_keys(bal, k, label, "balancing", err) || read_bool(bal, "enabled", 1, &rc->balancing, label, "balancing", err) ||
            read_number(bal, "lr", 0, 1e-3, 0, 1, 0, &rc->balancing_lr, label, "balancing", err))
            return -1;
        const cJSON *sr = get(bal, "skip_rate"); /* null: hold the skip bias, as the released ZAYA1 weights do */
        if (sr && !cJSON_IsNull(sr) &&
            read_number(bal, "skip_rate", 0, rc->skip_rate, 0, 0.99, 0, &rc->skip_rate, label, "balancing", err))
            return -1;
        if (sr && cJSON_IsNull(sr)) rc->skip_rate = -1;
    }

    /* checkpoint */
    rc->ckpt_interval = 0;
    rc->ckpt_keep = 3;
    rc->ckpt_async = 1;
    const cJSON *ck = get(root, "checkpoint");
    if (ck) {
        static const char *const k[] = {"interval", "keep", "async", NULL};
        if (!cJSON_IsObject(ck)) return zy_fail(err, "%s: key \"checkpoint\" must be an object", label);
        if (check_keys(ck, k, label, "checkpoint", err)) return -1;
        if (read_number(ck, "interval", 0, 0, 0, 2147483647.0, 1, &d, label, "checkpoint", err)) return -1;
        rc->ckpt_interval = (int)d;
        if (read_number(ck, "keep", 0, 3, 0, 1e6, 1, &d, label, "checkpoint", err)) return -1;
        rc->ckpt_keep = (int)d;
        if (read_bool(ck, "async", 1, &rc->ckpt_async, label, "checkpoint", err)) return -1;
    }

    /* eval */
    rc->eval_interval = 0;
    rc->val_batches = 2;
    rc->eval_limit = 0;
    const cJSON *ev = get(root, "eval");
    if (ev) {
        static const char *const k[] = {"interval", "val_batches", "tasks", "limit", NULL};
        if (!cJSON_IsObject(ev)) return zy_fail(err, "%s: key \"eval\" must be an object", label);
        if (check_keys(ev, k, label, "eval", err)) return -1;
        if (read_number(ev, "interval", 0, 0, 0, 2147483647.0, 1, &d, label, "eval", err)) return -1;
        rc->eval_interval = (int)d;
        if (read_number(ev, "val_batches", 0, 2, 0, 1e6, 1, &d, label, "eval", err)) return -1;
        rc->val_batches = (int)d;
        if (read_number(ev, "limit", 0, 0, 0, 1e9, 1, &d, label, "eval", err)) return -1;
        rc->eval_limit = (int)d;
        const cJSON *tasks = get(ev, "tasks");
        if (tasks && !cJSON_IsNull(tasks)) {
            if (!cJSON_IsArray(tasks)) return zy_fail(err, "%s: key \"eval.tasks\" must be a list of task files", label);
            cJSON_ArrayForEach(it, tasks) {
                if (rc->n_tasks == RUN_MAX_TASKS) return zy_fail(err, "%s: at most %d eval tasks", label, RUN_MAX_TASKS);
                if (!cJSON_IsString(it) || strlen(it->valuestring) >= RUN_PATH)
                    return zy_fail(err, "%s: key \"eval.tasks[%d]\" must be a file path", label, rc->n_tasks);
                strcpy(rc->tasks[rc->n_tasks++], it->valuestring);
            }
            if (rc->n_tasks && !rc->tokenizer[0])
                return zy_fail(err, "%s: key \"eval.tasks\" needs a \"tokenizer\"", label);
        }
    }
    return 0;
}

int runconfig_parse(RunConfig *rc, const char *text, const char *label, const char *const *overrides, int n_overrides,
                    char **json_out, ZyErr *err) {
    memset(rc, 0, sizeof *rc);
    cJSON *root = cJSON_Parse(text);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        return zy_fail(err, "%s: invalid JSON near \"%.20s\"", label, at ? at : "");
    }
    int r = 0;
    for (int i = 0; i < n_overrides && !r; i++) r = apply_override(root, overrides[i], label, err);
    if (!r) r = parse_tree(rc, root, label, err);
    if (!r && json_out) *json_out = cJSON_Print(root);
    cJSON_Delete(root);
    return r;
}

int runconfig_load(RunConfig *rc, const char *path, const char *const *overrides, int n_overrides, char **json_out,
                   ZyErr *err) {
    char *text;
    if (zy_read_text_file(path, &text, err)) return -1;
    int r = runconfig_parse(rc, text, path, overrides, n_overrides, json_out, err);
    free(text);
    return r;
}

int runconfig_phase_of(const RunConfig *rc, int64_t step) {
    for (int i = 0; i < rc->n_phases; i++)
        if (step < rc->phases[i].first_step + rc->phases[i].steps) return i;
    return rc->n_phases - 1;
}
