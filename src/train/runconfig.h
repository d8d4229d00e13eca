/* runconfig: the training run's JSON file (`zaya train RUN.json`) — model, data, curriculum phases,
 * optimizer, schedule, balancing, checkpoints, evaluation. Unknown keys and bad values are errors naming the
 * key path; `--override a.b.c=value` edits the JSON before it is read. */
#ifndef ZAYA_RUNCONFIG_H
#define ZAYA_RUNCONFIG_H

#include <stdint.h>

#include "optim/optim.h"
#include "util/util.h"

#define RUN_MAX_DATASETS 16
#define RUN_MAX_PHASES 16
#define RUN_MAX_TASKS 16
#define RUN_PATH 1024

typedef struct {
    char name[64];
    int64_t tokens;                    /* this phase's length in tokens */
    int seq_len;                       /* its sequence length */
    double mixture[RUN_MAX_DATASETS];  /* weight per dataset (index as in RunConfig.datasets) */
    int64_t steps;                     /* derived: ceil(tokens / (batch_size * seq_len)) */
    int64_t first_step;                /* derived: global index of its first step */
} PhaseConfig;

typedef struct {
    char model_config[RUN_PATH]; /* model config.json (when training from scratch) */
    char init_from[RUN_PATH];    /* or a model directory to start from ("" = none) */
    char tokenizer[RUN_PATH];    /* tokenizer.json ("" = none; needed for eval tasks and samples) */
    int n_datasets;
    char dataset_names[RUN_MAX_DATASETS][64];
    char dataset_dirs[RUN_MAX_DATASETS][RUN_PATH];
    int n_phases;
    PhaseConfig phases[RUN_MAX_PHASES];
    int batch_size, micro_batch;
    OptimConfig optim;
    double lr, grad_clip;
    Schedule schedule;           /* total_steps filled from the phases */
    int balancing;
    double balancing_lr;
    double skip_rate; /* balancing.skip_rate: the skip expert's target share of tokens; < 0 (null): bias held */
    int ckpt_interval, ckpt_keep;
    int ckpt_async;              /* write checkpoints in the background (default true) */
    int eval_interval, val_batches, eval_limit;
    int n_tasks;
    char tasks[RUN_MAX_TASKS][RUN_PATH];
    int log_interval;
    int bf16;                    /* "precision": "bf16" (bf16 inputs to the matrix products), else fp32 */
    int bf16_products;           /* "bf16_products": a ZyBf16Products (kernels/matmul.h), ZY_BF16_PRODUCTS_AUTO unless
                                  * set; a run resolves it per CPU and records the result in its run.json */
    int gpu;                     /* "device": "cuda" or "cuda:N" (1), "cpu" (0, the default) */
    int gpu_index;               /* N of "cuda:N"; -1: the rank-local GPU (ZAYA_GPU, else local rank) */
    uint64_t seed;
    char out_dir[RUN_PATH];
    int64_t total_steps;
} RunConfig;

/* Parses the file, applies overrides ("dotted.key=value"; value read as JSON, else as a string), validates.
 * *json_out (optional) receives the effective JSON (malloc'ed), as stored in checkpoints. */
int runconfig_load(RunConfig *rc, const char *path, const char *const *overrides, int n_overrides, char **json_out,
                   ZyErr *err);
int runconfig_parse(RunConfig *rc, const char *text, const char *label, const char *const *overrides, int n_overrides,
                    char **json_out, ZyErr *err);
/* A device name ("cpu", "cuda", "cuda:N") as the run config and --device take it: *gpu = 1 for a GPU, *index its
 * number (-1: the rank-local one). */
int runconfig_parse_device(const char *s, int *gpu, int *index, ZyErr *err);
/* The phase of a global step (clamped to the last phase). */
int runconfig_phase_of(const RunConfig *rc, int64_t step);

#endif
