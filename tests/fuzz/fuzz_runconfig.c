/* libFuzzer target for the training run config parser (runconfig_parse), overrides included: leading lines
 * "@dotted.key=value" are --override arguments (at most 4), the rest is the run JSON. Invariants: a rejected input
 * fails with a message naming the file (or the override); an accepted config is consistent (phases, steps,
 * mixture, batch sizes) and its effective JSON parses again, without overrides, to the same RunConfig and the
 * same JSON. Build and run: `make fuzz` or
 *   make build-fuzz/fuzz_runconfig && build-fuzz/fuzz_runconfig -max_total_time=60 /tmp/new tests/fuzz/corpus/runconfig
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/runconfig.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_OVERRIDES 4

static void fail(const char *what, const char *detail) {
    fprintf(stderr, "fuzz_runconfig: %s: %s\n", what, detail);
    abort();
}

/* Real numbers survive the effective JSON to within an ulp: cJSON prints 15 significant digits whenever they read
 * back within DBL_EPSILON (0.30000000000000004 is written 0.3). Integers must survive exactly. */
static int near(double a, double b) {
    double m = fabs(a) > fabs(b) ? fabs(a) : fabs(b);
    return fabs(a - b) <= m * DBL_EPSILON;
}

/* strings in fixed buffers are NUL-terminated and their tails zero (the parser memsets the struct) */
static int same_str(const char *a, const char *b, size_t cap) {
    return memchr(a, 0, cap) && memchr(b, 0, cap) && memcmp(a, b, cap) == 0;
}

static int same(const RunConfig *a, const RunConfig *b) {
    if (!same_str(a->model_config, b->model_config, RUN_PATH) || !same_str(a->init_from, b->init_from, RUN_PATH) ||
        !same_str(a->tokenizer, b->tokenizer, RUN_PATH) || !same_str(a->out_dir, b->out_dir, RUN_PATH))
        return 0;
    if (a->n_datasets != b->n_datasets || a->n_phases != b->n_phases || a->n_tasks != b->n_tasks) return 0;
    for (int i = 0; i < a->n_datasets; i++)
        if (!same_str(a->dataset_names[i], b->dataset_names[i], 64) ||
            !same_str(a->dataset_dirs[i], b->dataset_dirs[i], RUN_PATH))
            return 0;
    for (int i = 0; i < a->n_phases; i++) {
        const PhaseConfig *p = &a->phases[i], *q = &b->phases[i];
        if (!same_str(p->name, q->name, sizeof p->name) || p->tokens != q->tokens || p->seq_len != q->seq_len ||
            p->steps != q->steps || p->first_step != q->first_step)
            return 0;
        for (int d = 0; d < RUN_MAX_DATASETS; d++)
            if (!near(p->mixture[d], q->mixture[d])) return 0;
    }
    for (int i = 0; i < a->n_tasks; i++)
        if (!same_str(a->tasks[i], b->tasks[i], RUN_PATH)) return 0;
    const OptimConfig *o = &a->optim, *r = &b->optim;
    const Schedule *s = &a->schedule, *t = &b->schedule;
    return a->batch_size == b->batch_size && a->micro_batch == b->micro_batch && near(o->weight_decay, r->weight_decay) &&
           near(o->beta1, r->beta1) && near(o->beta2, r->beta2) && near(o->eps, r->eps) &&
           near(o->muon_momentum, r->muon_momentum) && o->muon_ns_steps == r->muon_ns_steps && near(a->lr, b->lr) &&
           near(a->grad_clip, b->grad_clip) && s->type == t->type && near(s->peak_lr, t->peak_lr) &&
           s->warmup_steps == t->warmup_steps && s->total_steps == t->total_steps &&
           near(s->decay_fraction, t->decay_fraction) && near(s->min_ratio, t->min_ratio) &&
           a->balancing == b->balancing && near(a->balancing_lr, b->balancing_lr) && a->ckpt_interval == b->ckpt_interval &&
           a->ckpt_keep == b->ckpt_keep && a->ckpt_async == b->ckpt_async && a->eval_interval == b->eval_interval &&
           a->val_batches == b->val_batches && a->eval_limit == b->eval_limit && a->log_interval == b->log_interval &&
           a->seed == b->seed && a->total_steps == b->total_steps;
}

static void check_consistent(const RunConfig *rc) {
    if (rc->n_datasets < 1 || rc->n_datasets > RUN_MAX_DATASETS || rc->n_phases < 1 || rc->n_phases > RUN_MAX_PHASES ||
        rc->n_tasks < 0 || rc->n_tasks > RUN_MAX_TASKS)
        fail("counts out of range", "datasets/phases/tasks");
    if (!rc->out_dir[0] || !!rc->model_config[0] == !!rc->init_from[0]) fail("model/init_from/out_dir", "inconsistent");
    if (rc->batch_size < 1 || rc->micro_batch < 1 || rc->batch_size % rc->micro_batch != 0)
        fail("batch sizes", "inconsistent");
    if (rc->n_tasks > 0 && !rc->tokenizer[0]) fail("eval tasks", "without a tokenizer");
    int64_t total = 0;
    for (int i = 0; i < rc->n_phases; i++) {
        const PhaseConfig *p = &rc->phases[i];
        if (p->tokens < 1 || p->seq_len < 1 || p->steps < 1 || p->first_step != total) fail("phase", p->name);
        int64_t per_step = (int64_t)rc->batch_size * p->seq_len;
        if (p->steps != p->tokens / per_step + (p->tokens % per_step != 0)) fail("phase steps", p->name);
        double w = 0;
        for (int d = 0; d < RUN_MAX_DATASETS; d++) {
            if (!(p->mixture[d] >= 0) || !isfinite(p->mixture[d]) || (d >= rc->n_datasets && p->mixture[d] != 0))
                fail("mixture weight", p->name);
            w += p->mixture[d];
        }
        if (!(w > 0)) fail("mixture without weight", p->name);
        total += p->steps;
    }
    if (rc->total_steps != total || rc->schedule.total_steps != total) fail("total_steps", "inconsistent");
    if (runconfig_phase_of(rc, 0) != 0 || runconfig_phase_of(rc, total) != rc->n_phases - 1)
        fail("runconfig_phase_of", "wrong phase");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    const char *overrides[MAX_OVERRIDES];
    int n_overrides = 0;
    char *json = text;
    while (n_overrides < MAX_OVERRIDES && json[0] == '@') {
        char *nl = strchr(json, '\n');
        if (!nl) break;
        *nl = '\0';
        overrides[n_overrides++] = json + 1;
        json = nl + 1;
    }
    RunConfig *rc = malloc(sizeof *rc), *rc2 = malloc(sizeof *rc2);
    if (!rc || !rc2) abort();
    ZyErr err;
    err.msg[0] = '\0';
    char *effective = NULL;
    if (runconfig_parse(rc, json, "fuzz.json", overrides, n_overrides, &effective, &err) != 0) {
        if (effective) fail("effective JSON returned on failure", effective);
        if ((strncmp(err.msg, "fuzz.json: ", 11) != 0 || !err.msg[11]) && strncmp(err.msg, "--override \"", 12) != 0)
            fail("error does not name the file or the override", err.msg);
        goto done;
    }
    if (!effective) fail("no effective JSON", json);
    check_consistent(rc);
    char *again = NULL;
    if (runconfig_parse(rc2, effective, "effective.json", NULL, 0, &again, &err))
        fail("effective JSON does not parse", err.msg);
    if (!same(rc, rc2)) fail("effective JSON parses differently", effective);
    if (!again || strcmp(again, effective) != 0) fail("effective JSON not stable", effective);
    free(again);
done:
    free(effective);
    free(rc);
    free(rc2);
    free(text);
    return 0;
}
