/* Ablation planning, result collection and the report (ablate.h). */
#include "train/ablate.h"

#include "train/report.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---- the spec ------------------------------------------------------------------------------------------------ */

/* dst ← src key by key; objects on both sides merge recursively, anything else is replaced. */
static int json_merge(cJSON *dst, const cJSON *src) {
    const cJSON *it;
    cJSON_ArrayForEach(it, src) {
        cJSON *old = cJSON_GetObjectItemCaseSensitive(dst, it->string);
        if (old && cJSON_IsObject(old) && cJSON_IsObject(it)) {
            if (json_merge(old, it)) return -1;
            continue;
        }
        cJSON *copy = cJSON_Duplicate(it, 1);
        if (!copy) return -1;
        if (old)
            cJSON_ReplaceItemInObjectCaseSensitive(dst, it->string, copy);
        else
            cJSON_AddItemToObject(dst, it->string, copy);
    }
    return 0;
}

static int check_keys(const cJSON *obj, const char *const *allowed, const char *label, const char *path, ZyErr *err) {
    const cJSON *it;
    cJSON_ArrayForEach(it, obj) {
        int ok = 0;
        for (int i = 0; allowed[i] && !ok; i++) ok = strcmp(it->string, allowed[i]) == 0;
        if (!ok) return zy_fail(err, "%s: unknown key \"%s%s\"", label, path, it->string);
    }
    return 0;
}

static int name_ok(const char *s) {
    if (!*s || !strcmp(s, ".") || !strcmp(s, "..")) return 0;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || *s == '-' ||
              *s == '_' || *s == '.'))
            return 0;
    return 1;
}

static int read_text(const char *path, const char *what, const char *label, char **text, ZyErr *err) {
    size_t n;
    if (zy_read_file(path, text, &n, err)) return zy_wrap(err, "%s: %s", label, what);
    return 0;
}

int ablation_parse(AblationSpec *s, const char *text, const char *label, ZyErr *err) {
    memset(s, 0, sizeof *s);
    snprintf(s->label, sizeof s->label, "%s", label);
    cJSON *root = cJSON_Parse(text), *run = NULL, *model = NULL;
    char *run_text = NULL, *model_text = NULL;
    int rc = -1;
    if (!root || !cJSON_IsObject(root)) {
        zy_fail(err, "%s: invalid JSON (an object is expected)", label);
        goto done;
    }
    static const char *const keys[] = {"run", "out_dir", "seeds", "run_overrides", "variants", "comment", NULL};
    if (check_keys(root, keys, label, "", err)) goto done;
    const cJSON *run_path = cJSON_GetObjectItemCaseSensitive(root, "run");
    const cJSON *out = cJSON_GetObjectItemCaseSensitive(root, "out_dir");
    if (!cJSON_IsString(run_path) || !run_path->valuestring[0]) {
        zy_fail(err, "%s: key \"run\" must name the base run config (a string)", label);
        goto done;
    }
    if (!cJSON_IsString(out) || !out->valuestring[0] || strlen(out->valuestring) >= RUN_PATH - 200) {
        zy_fail(err, "%s: key \"out_dir\" must be a non-empty string (a directory)", label);
        goto done;
    }
    snprintf(s->out_dir, sizeof s->out_dir, "%s", out->valuestring);
    /* the base run config, with the overrides every variant shares */
    if (read_text(run_path->valuestring, "key \"run\"", label, &run_text, err)) goto done;
    run = cJSON_Parse(run_text);
    if (!run || !cJSON_IsObject(run)) {
        zy_fail(err, "%s: key \"run\": %s is not a JSON object", label, run_path->valuestring);
        goto done;
    }
    const cJSON *over = cJSON_GetObjectItemCaseSensitive(root, "run_overrides");
    if (over && !cJSON_IsObject(over)) {
        zy_fail(err, "%s: key \"run_overrides\" must be an object (run config keys)", label);
        goto done;
    }
    if (over && json_merge(run, over)) {
        zy_fail(err, "out of memory");
        goto done;
    }
    s->run_json = cJSON_Print(run);
    if (!s->run_json) {
        zy_fail(err, "out of memory");
        goto done;
    }
    char run_label[RUN_PATH + 64];
    snprintf(run_label, sizeof run_label, "%s (with %s's run_overrides)", run_path->valuestring, label);
    if (runconfig_parse(&s->run, s->run_json, run_label, NULL, 0, NULL, err)) goto done;
    if (!s->run.model_config[0] || s->run.init_from[0]) {
        zy_fail(err, "%s: the base run must train from scratch from a \"model\" config (not \"init_from\"): the "
                     "variants change the model's shape", label);
        goto done;
    }
    /* seeds */
    const cJSON *seeds = cJSON_GetObjectItemCaseSensitive(root, "seeds");
    if (!seeds) {
        s->n_seeds = 1;
        s->seeds[0] = s->run.seed;
    } else {
        if (!cJSON_IsArray(seeds) || cJSON_GetArraySize(seeds) < 1 || cJSON_GetArraySize(seeds) > ABL_MAX_SEEDS) {
            zy_fail(err, "%s: key \"seeds\" must be a list of 1 to %d seeds", label, ABL_MAX_SEEDS);
            goto done;
        }
        const cJSON *it;
        cJSON_ArrayForEach(it, seeds) {
            const double d = cJSON_IsNumber(it) ? it->valuedouble : -1;
            if (!(d >= 0 && d <= 999999999999999.0 && d == floor(d))) {
                zy_fail(err, "%s: key \"seeds[%d]\" must be a non-negative integer", label, s->n_seeds);
                goto done;
            }
            for (int k = 0; k < s->n_seeds; k++)
                if (s->seeds[k] == (uint64_t)d) {
                    zy_fail(err, "%s: key \"seeds\": seed %.0f is listed twice", label, d);
                    goto done;
                }
            s->seeds[s->n_seeds++] = (uint64_t)d;
        }
    }
    /* the base model and the variants */
    if (read_text(s->run.model_config, "the base run's \"model\"", label, &model_text, err)) goto done;
    model = cJSON_Parse(model_text);
    if (!model || !cJSON_IsObject(model)) {
        zy_fail(err, "%s: the base run's model config %s is not a JSON object", label, s->run.model_config);
        goto done;
    }
    const cJSON *vars = cJSON_GetObjectItemCaseSensitive(root, "variants");
    if (!cJSON_IsArray(vars) || cJSON_GetArraySize(vars) < 1 || cJSON_GetArraySize(vars) > ABL_MAX_VARIANTS) {
        zy_fail(err, "%s: key \"variants\" must be a list of 1 to %d variants", label, ABL_MAX_VARIANTS);
        goto done;
    }
    const cJSON *vj;
    cJSON_ArrayForEach(vj, vars) {
        const int i = s->n_variants;
        char path[64];
        snprintf(path, sizeof path, "variants[%d].", i);
        static const char *const vkeys[] = {"name", "model", "comment", NULL};
        if (!cJSON_IsObject(vj)) {
            zy_fail(err, "%s: key \"variants[%d]\" must be an object", label, i);
            goto done;
        }
        if (check_keys(vj, vkeys, label, path, err)) goto done;
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(vj, "name");
        const cJSON *mo = cJSON_GetObjectItemCaseSensitive(vj, "model");
        const cJSON *cm = cJSON_GetObjectItemCaseSensitive(vj, "comment");
        AblationVariant *v = &s->variants[i];
        if (!cJSON_IsString(name) || strlen(name->valuestring) >= sizeof v->name || !name_ok(name->valuestring)) {
            zy_fail(err, "%s: key \"variants[%d].name\" must be a short name of letters, digits, '-', '_' and '.' "
                         "(it names a directory)", label, i);
            goto done;
        }
        for (int j = 0; j < i; j++)
            if (!strcmp(s->variants[j].name, name->valuestring)) {
                zy_fail(err, "%s: key \"variants[%d].name\": \"%s\" is used twice", label, i, name->valuestring);
                goto done;
            }
        if (mo && !cJSON_IsObject(mo)) {
            zy_fail(err, "%s: key \"variants[%d].model\" must be an object (model config keys)", label, i);
            goto done;
        }
        if (cm && !cJSON_IsString(cm)) {
            zy_fail(err, "%s: key \"variants[%d].comment\" must be a string", label, i);
            goto done;
        }
        snprintf(v->name, sizeof v->name, "%s", name->valuestring);
        if (cm) snprintf(v->comment, sizeof v->comment, "%s", cm->valuestring);
        s->n_variants++;
        cJSON *merged = cJSON_Duplicate(model, 1);
        if (!merged || (mo && json_merge(merged, mo))) {
            cJSON_Delete(merged);
            zy_fail(err, "out of memory");
            goto done;
        }
        v->model_json = cJSON_Print(merged);
        cJSON_Delete(merged);
        if (!v->model_json) {
            zy_fail(err, "out of memory");
            goto done;
        }
        char vlabel[RUN_PATH + 128];
        snprintf(vlabel, sizeof vlabel, "%s: variant \"%s\" (%s with its \"model\" keys)", label, v->name,
                 s->run.model_config);
        if (config_parse(&v->cfg, v->model_json, vlabel, err)) goto done;
        if (model_stats_of(&v->stats, &v->cfg, s->run.phases[0].seq_len, err)) goto done;
    }
    rc = 0;
done:
    cJSON_Delete(root);
    cJSON_Delete(run);
    cJSON_Delete(model);
    free(run_text);
    free(model_text);
    if (rc) ablation_free(s);
    return rc;
}

int ablation_load(AblationSpec *s, const char *path, ZyErr *err) {
    char *text;
    size_t n;
    memset(s, 0, sizeof *s);
    if (zy_read_file(path, &text, &n, err)) return -1;
    int rc = ablation_parse(s, text, path, err);
    free(text);
    return rc;
}

void ablation_free(AblationSpec *s) {
    for (int i = 0; i < ABL_MAX_VARIANTS; i++) free(s->variants[i].model_json);
    free(s->run_json);
    memset(s, 0, sizeof *s);
}

/* ---- one run ---------------------------------------------------------------------------------------------- */

int ablation_run_dir(const AblationSpec *s, int v, int k, char *out, size_t cap, ZyErr *err) {
    int n = snprintf(out, cap, "%s/%s/seed-%llu", s->out_dir, s->variants[v].name, (unsigned long long)s->seeds[k]);
    if (n < 0 || (size_t)n >= cap) return zy_fail(err, "%s: out_dir too long", s->label);
    return 0;
}

static int write_text(const char *path, const char *text, ZyErr *err) {
    return zy_write_file_atomic(path, text, strlen(text), err);
}

int ablation_prepare(const AblationSpec *s, int v, int k, char *run_json_path, size_t cap, ZyErr *err) {
    char vdir[RUN_PATH + 128], model_path[RUN_PATH + 160], run_dir[RUN_PATH + 128];
    snprintf(vdir, sizeof vdir, "%s/%s", s->out_dir, s->variants[v].name);
    snprintf(model_path, sizeof model_path, "%s/model.json", vdir);
    if (ablation_run_dir(s, v, k, run_dir, sizeof run_dir, err) || zy_mkdirs(run_dir, err) ||
        write_text(model_path, s->variants[v].model_json, err))
        return -1;
    cJSON *run = cJSON_Parse(s->run_json);
    if (!run) return zy_fail(err, "out of memory");
    cJSON_ReplaceItemInObjectCaseSensitive(run, "model", cJSON_CreateString(model_path));
    if (cJSON_GetObjectItemCaseSensitive(run, "out_dir"))
        cJSON_ReplaceItemInObjectCaseSensitive(run, "out_dir", cJSON_CreateString(run_dir));
    else
        cJSON_AddStringToObject(run, "out_dir", run_dir);
    cJSON_DeleteItemFromObjectCaseSensitive(run, "seed");
    cJSON_AddNumberToObject(run, "seed", (double)s->seeds[k]);
    cJSON_DeleteItemFromObjectCaseSensitive(run, "comment");
    char comment[RUN_PATH + 200];
    snprintf(comment, sizeof comment, "written by zaya ablate %s: variant \"%s\", seed %llu", s->label,
             s->variants[v].name, (unsigned long long)s->seeds[k]);
    cJSON_AddStringToObject(run, "comment", comment);
    char *text = cJSON_Print(run);
    cJSON_Delete(run);
    if (!text) return zy_fail(err, "out of memory");
    int n = snprintf(run_json_path, cap, "%s/run.json", run_dir);
    int rc = (n < 0 || (size_t)n >= cap) ? zy_fail(err, "%s: path too long", run_dir) : write_text(run_json_path, text, err);
    free(text);
    return rc;
}

/* ---- results ----------------------------------------------------------------------------------------------- */

int ablation_read_metrics(const char *run_dir, AblationResult *r, ZyErr *err) {
    memset(r, 0, sizeof *r);
    r->val_loss = NAN;
    char path[RUN_PATH + 160];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run_dir);
    char *text;
    size_t n;
    if (zy_read_file(path, &text, &n, err)) return -1;
    /* per step (the last record of a step wins: a resumed run repeats the steps after its checkpoint) */
    typedef struct {
        double loss, tps, secs;
    } StepRec;
    int64_t cap = 0, max_step = 0;
    StepRec *rec = NULL;
    double *tps = NULL;
    int64_t task_step[ABL_MAX_TASKS];
    int rc = -1;
    char *line = text;
    int lineno = 0;
    while (line && *line) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = '\0';
        lineno++;
        if (*line) {
            cJSON *o = cJSON_Parse(line);
            if (!o) { /* a line cut short by a kill is the last one; anything else is damage */
                if (nl && nl[1]) {
                    zy_fail(err, "%s: line %d is not JSON", path, lineno);
                    goto done;
                }
                break;
            }
            const cJSON *kind = cJSON_GetObjectItemCaseSensitive(o, "kind");
            const cJSON *step = cJSON_GetObjectItemCaseSensitive(o, "step");
            const int64_t st = cJSON_IsNumber(step) ? (int64_t)step->valuedouble : -1;
            if (cJSON_IsString(kind) && st >= 0 && st < 100000000) {
                if (!strcmp(kind->valuestring, "train")) {
                    if (st >= cap) {
                        int64_t nc = cap ? cap : 1024;
                        while (nc <= st) nc *= 2;
                        StepRec *grown = realloc(rec, sizeof *rec * (size_t)nc);
                        if (!grown) {
                            cJSON_Delete(o);
                            zy_fail(err, "out of memory");
                            goto done;
                        }
                        rec = grown;
                        for (int64_t i = cap; i < nc; i++) rec[i] = (StepRec){NAN, NAN, NAN};
                        cap = nc;
                    }
                    const cJSON *l = cJSON_GetObjectItemCaseSensitive(o, "loss");
                    const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "tokens_per_s");
                    const cJSON *s = cJSON_GetObjectItemCaseSensitive(o, "step_seconds");
                    rec[st] = (StepRec){cJSON_IsNumber(l) ? l->valuedouble : NAN, cJSON_IsNumber(t) ? t->valuedouble : NAN,
                                        cJSON_IsNumber(s) ? s->valuedouble : NAN};
                    if (st > max_step) max_step = st;
                } else if (!strcmp(kind->valuestring, "eval")) {
                    const cJSON *name = cJSON_GetObjectItemCaseSensitive(o, "name");
                    const cJSON *val = cJSON_GetObjectItemCaseSensitive(o, "value");
                    if (cJSON_IsString(name) && cJSON_IsNumber(val)) {
                        if (!strcmp(name->valuestring, "val_loss")) {
                            int j = 0;
                            while (j < r->n_evals && r->eval_steps[j] != st) j++;
                            if (j == r->n_evals && r->n_evals < ABL_MAX_EVALS) r->eval_steps[r->n_evals++] = st;
                            if (j < ABL_MAX_EVALS) r->eval_val[j] = val->valuedouble;
                        } else {
                            int j = 0;
                            while (j < r->n_tasks && strcmp(r->task_names[j], name->valuestring)) j++;
                            if (j == r->n_tasks && r->n_tasks < ABL_MAX_TASKS) {
                                snprintf(r->task_names[j], sizeof r->task_names[j], "%s", name->valuestring);
                                task_step[j] = -1;
                                r->n_tasks++;
                            }
                            if (j < r->n_tasks && st >= task_step[j]) task_step[j] = st, r->task_scores[j] = val->valuedouble;
                        }
                    }
                }
            }
            cJSON_Delete(o);
        }
        line = nl ? nl + 1 : NULL;
    }
    if (max_step == 0) {
        zy_fail(err, "%s: no training steps recorded", path);
        goto done;
    }
    r->steps = max_step;
    /* the validation curve in step order (a resume may have appended an earlier step after a later one) */
    for (int i = 1; i < r->n_evals; i++)
        for (int j = i; j > 0 && r->eval_steps[j - 1] > r->eval_steps[j]; j--) {
            int64_t ts = r->eval_steps[j];
            double tv = r->eval_val[j];
            r->eval_steps[j] = r->eval_steps[j - 1], r->eval_val[j] = r->eval_val[j - 1];
            r->eval_steps[j - 1] = ts, r->eval_val[j - 1] = tv;
        }
    if (r->n_evals) r->val_loss = r->eval_val[r->n_evals - 1];
    const int64_t tail = max_step / 10 > 0 ? max_step / 10 : 1;
    double sum = 0;
    int64_t cnt = 0;
    for (int64_t st = max_step - tail + 1; st <= max_step; st++)
        if (!isnan(rec[st].loss)) sum += rec[st].loss, cnt++;
    r->train_loss = cnt ? sum / cnt : NAN;
    tps = malloc(sizeof *tps * (size_t)(max_step + 1));
    if (!tps) {
        zy_fail(err, "out of memory");
        goto done;
    }
    int64_t m = 0;
    for (int64_t st = 1; st <= max_step; st++) {
        if (!isnan(rec[st].secs)) r->train_seconds += rec[st].secs;
        if (st > 5 && !isnan(rec[st].tps)) tps[m++] = rec[st].tps;
    }
    if (m) r->tokens_per_s = zy_median(tps, m);
    r->done = 1;
    rc = 0;
done:
    free(text);
    free(rec);
    free(tps);
    return rc;
}

static cJSON *result_json(const AblationResult *r) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "steps", (double)r->steps);
    cJSON_AddNumberToObject(o, "train_loss", r->train_loss);
    if (isnan(r->val_loss))
        cJSON_AddNullToObject(o, "val_loss");
    else
        cJSON_AddNumberToObject(o, "val_loss", r->val_loss);
    cJSON *t = cJSON_AddObjectToObject(o, "tasks");
    for (int i = 0; i < r->n_tasks; i++) cJSON_AddNumberToObject(t, r->task_names[i], r->task_scores[i]);
    cJSON_AddNumberToObject(o, "tokens_per_s", r->tokens_per_s);
    cJSON_AddNumberToObject(o, "train_seconds", r->train_seconds);
    cJSON *c = cJSON_AddArrayToObject(o, "val_curve");
    for (int i = 0; i < r->n_evals; i++) {
        cJSON *p = cJSON_CreateArray();
        cJSON_AddItemToArray(p, cJSON_CreateNumber((double)r->eval_steps[i]));
        cJSON_AddItemToArray(p, cJSON_CreateNumber(r->eval_val[i]));
        cJSON_AddItemToArray(c, p);
    }
    return o;
}

int ablation_save_result(const char *run_dir, const AblationResult *r, ZyErr *err) {
    cJSON *o = result_json(r);
    char *text = o ? cJSON_Print(o) : NULL;
    cJSON_Delete(o);
    if (!text) return zy_fail(err, "out of memory");
    char path[RUN_PATH + 160];
    snprintf(path, sizeof path, "%s/result.json", run_dir);
    int rc = write_text(path, text, err);
    free(text);
    return rc;
}

int ablation_load_result(const char *run_dir, AblationResult *r, ZyErr *err) {
    /* result.json only marks the run finished; the numbers are read again from the run's own metrics */
    char path[RUN_PATH + 160];
    snprintf(path, sizeof path, "%s/result.json", run_dir);
    struct stat st;
    if (stat(path, &st) != 0) {
        memset(r, 0, sizeof *r);
        return 0;
    }
    return ablation_read_metrics(run_dir, r, err);
}

/* ---- the report ------------------------------------------------------------------------------------------ */

typedef struct {
    double mean, half_range;
    int n;
} Spread;

static Spread spread_of(const double *x, int n) {
    Spread s = {NAN, NAN, 0};
    double lo = INFINITY, hi = -INFINITY, sum = 0;
    for (int i = 0; i < n; i++)
        if (!isnan(x[i])) sum += x[i], s.n++, lo = fmin(lo, x[i]), hi = fmax(hi, x[i]);
    if (s.n) s.mean = sum / s.n, s.half_range = 0.5 * (hi - lo);
    return s;
}

static void fmt_spread(char *out, size_t cap, Spread s, int digits) {
    if (s.n == 0)
        snprintf(out, cap, "–");
    else if (s.n == 1)
        snprintf(out, cap, "%.*f", digits, s.mean);
    else
        snprintf(out, cap, "%.*f ± %.*f", digits, s.mean, digits, s.half_range);
}

static void fmt_count(char *out, size_t cap, int64_t n) {
    if (n >= 10000000)
        snprintf(out, cap, "%.1fM", n / 1e6);
    else if (n >= 1000000)
        snprintf(out, cap, "%.2fM", n / 1e6);
    else
        snprintf(out, cap, "%.0fk", n / 1e3);
}

static const char *attention_label(const ZayaConfig *c) {
    if (c->attention == ZY_ATTN_CCA) return c->num_kv_heads < c->num_heads ? "CCGQA" : "CCA";
    return c->num_kv_heads < c->num_heads ? "GQA" : "MHA";
}

/* The task columns: the union of the task names over all runs, in order of first appearance. */
static int task_columns(const AblationSpec *s, const AblationResult *res, char names[][64]) {
    int n = 0;
    for (int i = 0; i < s->n_variants * s->n_seeds; i++)
        for (int t = 0; t < res[i].n_tasks; t++) {
            int j = 0;
            while (j < n && strcmp(names[j], res[i].task_names[t])) j++;
            if (j == n && n < ABL_MAX_TASKS) snprintf(names[n++], 64, "%s", res[i].task_names[t]);
        }
    return n;
}

static double task_of(const AblationResult *r, const char *name) {
    for (int t = 0; t < r->n_tasks; t++)
        if (!strcmp(r->task_names[t], name)) return r->task_scores[t];
    return NAN;
}

static int write_plot(const AblationSpec *s, const AblationResult *res, char *note, size_t cap) {
    char data[RUN_PATH + 64], script[RUN_PATH + 64];
    snprintf(data, sizeof data, "%s/ablation_val.dat", s->out_dir);
    snprintf(script, sizeof script, "%s/ablation.gp", s->out_dir);
    FILE *f = fopen(data, "w");
    if (!f) return snprintf(note, cap, "plot skipped: cannot write %s", data), -1;
    /* one block per variant: step, mean over the seeds that evaluated at that step */
    for (int v = 0; v < s->n_variants; v++) {
        const AblationResult *r0 = &res[v * s->n_seeds];
        fprintf(f, "# %s\n", s->variants[v].name);
        for (int e = 0; e < r0->n_evals; e++) {
            double sum = 0;
            int n = 0;
            for (int k = 0; k < s->n_seeds; k++) {
                const AblationResult *r = &res[v * s->n_seeds + k];
                for (int j = 0; j < r->n_evals; j++)
                    if (r->eval_steps[j] == r0->eval_steps[e]) sum += r->eval_val[j], n++;
            }
            if (n) fprintf(f, "%lld %.6f\n", (long long)r0->eval_steps[e], sum / n);
        }
        fprintf(f, "%s\n\n", r0->n_evals ? "" : "0 NaN");
    }
    fclose(f);
    FILE *g = fopen(script, "w");
    if (!g) return snprintf(note, cap, "plot skipped: cannot write %s", script), -1;
    fprintf(g, "set terminal pngcairo size 1100,650 noenhanced\nset output '%s/ablation.png'\n"
               "set title 'zaya ablate: validation loss (mean over %d seed%s)'\nset xlabel 'step'\n"
               "set ylabel 'validation cross-entropy'\nset key top right\nset grid\nplot ",
            s->out_dir, s->n_seeds, s->n_seeds > 1 ? "s" : "");
    for (int v = 0; v < s->n_variants; v++)
        fprintf(g, "%s'%s' index %d using 1:2 with linespoints pt 7 ps 0.6 lw 2 title '%s'", v ? ", " : "", data, v,
                s->variants[v].name);
    fprintf(g, "\n");
    fclose(g);
    ZyErr err;
    if (report_run_gnuplot(script, &err)) return snprintf(note, cap, "plot skipped: %s", err.msg), -1;
    snprintf(note, cap, "plot: %s/ablation.png", s->out_dir);
    return 0;
}

int ablation_write_report(const AblationSpec *s, const AblationResult *res, const char *command, char *plot_note,
                          size_t note_cap, ZyErr *err) {
    const int S = s->n_seeds;
    char tasks[ABL_MAX_TASKS][64];
    const int n_tasks = task_columns(s, res, tasks);
    char path[RUN_PATH + 64];
    snprintf(path, sizeof path, "%s/ablation.md", s->out_dir);
    char *md = NULL;
    size_t md_len = 0;
    FILE *f = open_memstream(&md, &md_len);
    if (!f) return zy_fail(err, "out of memory");
    fprintf(f, "# zaya ablate: %s\n\n`%s`\n\n", s->label, command);
    fprintf(f, "Same data, token budget and seeds for every variant: %d seed%s (", S, S > 1 ? "s" : "");
    for (int k = 0; k < S; k++) fprintf(f, "%s%llu", k ? ", " : "", (unsigned long long)s->seeds[k]);
    fprintf(f, "), %lld steps of %d sequences. Losses are the mean over seeds ± half the range between seeds; train "
               "loss is the mean over the last 10%% of steps, val loss the last evaluation; task scores are the last "
               "evaluation; tokens/s is the median step. Attention is written kind Hq/Hkv×dh; train FLOPs per token are 6 × "
               "the active matrix parameters plus attention at the first phase's sequence length.\n\n",
            (long long)s->run.total_steps, s->run.batch_size);
    fprintf(f, "| variant | attention | router | MoE | residual scaling | params (total / active) | KV bytes/token "
               "(bf16) | train MFLOP/token | train loss | val loss | Δ val | ");
    for (int t = 0; t < n_tasks; t++) fprintf(f, "%s | ", tasks[t]);
    fprintf(f, "tokens/s | exports to transformers |\n|---|---|---|---|---|---|---|---|---|---|---|");
    for (int t = 0; t < n_tasks; t++) fprintf(f, "---|");
    fprintf(f, "---|---|\n");
    double base_val = NAN;
    cJSON *json = cJSON_CreateObject(), *jv = NULL;
    cJSON_AddStringToObject(json, "spec", s->label);
    cJSON_AddStringToObject(json, "command", command);
    cJSON *jseeds = cJSON_AddArrayToObject(json, "seeds");
    for (int k = 0; k < S; k++) cJSON_AddItemToArray(jseeds, cJSON_CreateNumber((double)s->seeds[k]));
    jv = cJSON_AddArrayToObject(json, "variants");
    for (int v = 0; v < s->n_variants; v++) {
        const AblationVariant *var = &s->variants[v];
        const ZayaConfig *c = &var->cfg;
        double x[ABL_MAX_SEEDS];
        for (int k = 0; k < S; k++) x[k] = res[v * S + k].done ? res[v * S + k].train_loss : NAN;
        const Spread tl = spread_of(x, S);
        for (int k = 0; k < S; k++) x[k] = res[v * S + k].done ? res[v * S + k].val_loss : NAN;
        const Spread vl = spread_of(x, S);
        for (int k = 0; k < S; k++) x[k] = res[v * S + k].done ? res[v * S + k].tokens_per_s : NAN;
        const Spread tp = spread_of(x, S);
        if (v == 0) base_val = vl.mean;
        char tot[32], act[32], tls[64], vls[64], dv[32];
        fmt_count(tot, sizeof tot, var->stats.total);
        fmt_count(act, sizeof act, var->stats.active);
        fmt_spread(tls, sizeof tls, tl, 4);
        fmt_spread(vls, sizeof vls, vl, 4);
        if (v == 0 || isnan(vl.mean) || isnan(base_val))
            snprintf(dv, sizeof dv, "–");
        else
            snprintf(dv, sizeof dv, "%+.4f", vl.mean - base_val);
        const char *router = c->moe == ZY_MOE_DENSE ? "–" : c->router == ZY_ROUTER_MLP ? "MLP + EDA" : "linear";
        const char *moe = c->moe == ZY_MOE_DENSE ? "dense MLP" : c->moe == ZY_MOE_SKIP ? "top-1 + skip" : "top-1";
        fprintf(f, "| %s | %s %d/%d×%d | %s | %s | %s | %s / %s | %lld | %.1f | %s | %s | %s | ", var->name,
                attention_label(c), c->num_heads, c->num_kv_heads, c->head_dim, router, moe,
                c->no_residual_scaling ? "off" : "on", tot, act, (long long)var->stats.kv_bytes_per_token,
                var->stats.train_flops_per_token / 1e6, tls, vls, dv);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", var->name);
        if (var->comment[0]) cJSON_AddStringToObject(o, "comment", var->comment);
        cJSON_AddStringToObject(o, "attention", attention_label(c));
        cJSON_AddNumberToObject(o, "num_attention_heads", c->num_heads);
        cJSON_AddNumberToObject(o, "num_key_value_heads", c->num_kv_heads);
        cJSON_AddNumberToObject(o, "head_dim", c->head_dim);
        cJSON_AddStringToObject(o, "router", c->moe == ZY_MOE_DENSE ? "none" : cfg_router_name(c->router));
        cJSON_AddStringToObject(o, "moe", cfg_moe_name(c->moe));
        cJSON_AddBoolToObject(o, "residual_scaling", !c->no_residual_scaling);
        cJSON_AddNumberToObject(o, "params_total", (double)var->stats.total);
        cJSON_AddNumberToObject(o, "params_active", (double)var->stats.active);
        cJSON_AddNumberToObject(o, "kv_bytes_per_token_bf16", (double)var->stats.kv_bytes_per_token);
        cJSON_AddNumberToObject(o, "train_flops_per_token", var->stats.train_flops_per_token);
        cJSON_AddBoolToObject(o, "exportable", cfg_is_zaya1(c));
        cJSON *mean = cJSON_AddObjectToObject(o, "mean"), *half = cJSON_AddObjectToObject(o, "half_range");
        const struct {
            const char *k;
            Spread s;
        } kv[] = {{"train_loss", tl}, {"val_loss", vl}, {"tokens_per_s", tp}};
        for (size_t i = 0; i < 3; i++)
            if (kv[i].s.n) {
                cJSON_AddNumberToObject(mean, kv[i].k, kv[i].s.mean);
                cJSON_AddNumberToObject(half, kv[i].k, kv[i].s.half_range);
            }
        for (int t = 0; t < n_tasks; t++) {
            for (int k = 0; k < S; k++) x[k] = res[v * S + k].done ? task_of(&res[v * S + k], tasks[t]) : NAN;
            const Spread ts = spread_of(x, S);
            char buf[64];
            fmt_spread(buf, sizeof buf, ts, 3);
            fprintf(f, "%s | ", buf);
            if (ts.n) {
                cJSON_AddNumberToObject(mean, tasks[t], ts.mean);
                cJSON_AddNumberToObject(half, tasks[t], ts.half_range);
            }
        }
        fprintf(f, "%.0f | %s |\n", tp.n ? tp.mean : 0.0, cfg_is_zaya1(c) ? "yes" : "no (research variant)");
        cJSON *runs = cJSON_AddArrayToObject(o, "runs");
        for (int k = 0; k < S; k++) {
            cJSON *r = res[v * S + k].done ? result_json(&res[v * S + k]) : cJSON_CreateObject();
            cJSON_AddNumberToObject(r, "seed", (double)s->seeds[k]);
            cJSON_AddBoolToObject(r, "done", res[v * S + k].done);
            cJSON_AddItemToArray(runs, r);
        }
        cJSON_AddItemToArray(jv, o);
    }
    /* per-seed detail */
    fprintf(f, "\nPer run:\n\n| variant | seed | steps | train loss | val loss | ");
    for (int t = 0; t < n_tasks; t++) fprintf(f, "%s | ", tasks[t]);
    fprintf(f, "tokens/s | train time (s) |\n|---|---|---|---|---|");
    for (int t = 0; t < n_tasks; t++) fprintf(f, "---|");
    fprintf(f, "---|---|\n");
    for (int v = 0; v < s->n_variants; v++)
        for (int k = 0; k < S; k++) {
            const AblationResult *r = &res[v * S + k];
            if (!r->done) {
                fprintf(f, "| %s | %llu | not run yet |\n", s->variants[v].name, (unsigned long long)s->seeds[k]);
                continue;
            }
            fprintf(f, "| %s | %llu | %lld | %.4f | %.4f | ", s->variants[v].name, (unsigned long long)s->seeds[k],
                    (long long)r->steps, r->train_loss, r->val_loss);
            for (int t = 0; t < n_tasks; t++) fprintf(f, "%.3f | ", task_of(r, tasks[t]));
            fprintf(f, "%.0f | %.0f |\n", r->tokens_per_s, r->train_seconds);
        }
    fprintf(f, "\nVariants other than ZAYA1 (CCA or CCGQA attention, the MLP router with EDA, top-1 with the skip "
               "expert, residual scaling on) are zaya research variants: zaya trains, evaluates and generates with "
               "them; `zaya ckpt export` refuses them, as transformers' ZayaForCausalLM cannot load them.\n");
    fclose(f);
    int rc = write_text(path, md, err);
    free(md);
    char *jt = cJSON_Print(json);
    cJSON_Delete(json);
    if (!rc) {
        snprintf(path, sizeof path, "%s/ablation.json", s->out_dir);
        rc = jt ? write_text(path, jt, err) : zy_fail(err, "out of memory");
    }
    free(jt);
    if (rc) return -1;
    write_plot(s, res, plot_note, note_cap);
    return 0;
}
