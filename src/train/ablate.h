/* ablate: `zaya ablate SPEC.json` — train variants of one base model on the same data, tokens and seeds, and
 * compare them (ablation.md, ablation.json, ablation.png). This module plans the runs (a run config and a model
 * config per variant and seed), reads each finished run's metrics back, and writes the report; the CLI runs the
 * trainings (src/cli/cmd_ablate.c).
 *
 * SPEC.json:
 *   {"run": "configs/demo-run.json",          base run config (paths in it are relative to where zaya runs)
 *    "out_dir": "runs/ablation-x",            OUT: OUT/<variant>/model.json, OUT/<variant>/seed-<s>/ (a run)
 *    "seeds": [1, 2],                         each variant trains once per seed (same data order per seed)
 *    "run_overrides": {...},                  merged into the base run config for every variant (optional)
 *    "variants": [{"name": "cca", "model": {...model config keys...}, "comment": "..."}, ...],
 *    "comment": "..."}
 * A variant's "model" object is merged key by key into the base run's model config (objects merged recursively). */
#ifndef ZAYA_ABLATE_H
#define ZAYA_ABLATE_H

#include <stdint.h>

#include "model/config.h"
#include "model/model_stats.h"
#include "train/runconfig.h"
#include "util/util.h"

#define ABL_MAX_VARIANTS 32
#define ABL_MAX_SEEDS 16
#define ABL_MAX_TASKS RUN_MAX_TASKS
#define ABL_MAX_EVALS 512

typedef struct {
    char name[64];
    char comment[256];
    ZayaConfig cfg;         /* the merged, validated model config */
    char *model_json;       /* its config.json text (malloc'ed) */
    ModelStats stats;
} AblationVariant;

typedef struct {
    char label[RUN_PATH];   /* the spec file, for messages */
    char out_dir[RUN_PATH];
    int n_seeds;
    uint64_t seeds[ABL_MAX_SEEDS];
    int n_variants;
    AblationVariant variants[ABL_MAX_VARIANTS];
    char *run_json;         /* the base run config with run_overrides merged (malloc'ed) */
    RunConfig run;          /* ... parsed (for the step count and the sequence length) */
} AblationSpec;

/* Parses and checks the spec: every key known, seeds positive and distinct, variant names unique and usable as
 * directory names, each variant's model config valid. Errors name the spec file and the key. */
int ablation_load(AblationSpec *s, const char *path, ZyErr *err);
int ablation_parse(AblationSpec *s, const char *text, const char *label, ZyErr *err);
void ablation_free(AblationSpec *s);

/* OUT/<variant>/seed-<seed> */
int ablation_run_dir(const AblationSpec *s, int v, int k, char *out, size_t cap, ZyErr *err);
/* Writes OUT/<variant>/model.json and the run's run.json (seed, out_dir and model set); *run_json_path gets its
 * path. */
int ablation_prepare(const AblationSpec *s, int v, int k, char *run_json_path, size_t cap, ZyErr *err);

/* What one finished run measured, from its metrics.jsonl (steps re-run after a resume count once: the last record
 * of a step wins). */
typedef struct {
    int done;
    int64_t steps;
    double train_loss;      /* mean training loss over the last 10% of steps */
    double val_loss;        /* the last validation loss (NAN: none) */
    int n_tasks;
    char task_names[ABL_MAX_TASKS][64];
    double task_scores[ABL_MAX_TASKS]; /* the last evaluation of each task */
    double tokens_per_s;    /* median over the steps (the first 5 left out: warm-up) */
    double train_seconds;   /* sum of step times */
    int n_evals;
    int64_t eval_steps[ABL_MAX_EVALS];
    double eval_val[ABL_MAX_EVALS]; /* the validation-loss curve */
} AblationResult;

int ablation_read_metrics(const char *run_dir, AblationResult *r, ZyErr *err);
/* result.json: the run's summary, written when it finished (its presence marks the run done for a resume). */
int ablation_save_result(const char *run_dir, const AblationResult *r, ZyErr *err);
int ablation_load_result(const char *run_dir, AblationResult *r, ZyErr *err);

/* OUT/ablation.md, OUT/ablation.json and (if gnuplot runs) OUT/ablation.png from results[v * n_seeds + k];
 * command is the line that reproduces it (for the report). Returns 0, or -1 with err (a plot failure is not an
 * error: *plot_note says what happened). */
int ablation_write_report(const AblationSpec *s, const AblationResult *results, const char *command,
                          char *plot_note, size_t note_cap, ZyErr *err);

#endif
