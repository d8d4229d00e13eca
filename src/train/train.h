/* train: the single-process pretraining loop — curriculum phases, micro-batch accumulation, clipping, the
 * schedule, Muon + AdamW, the balancing controller, validation, checkpoints, bit-exact resume, metrics. */
#ifndef ZAYA_TRAIN_H
#define ZAYA_TRAIN_H

#include <signal.h>
#include <stdint.h>

#include "dist/distributed.h"
#include "train/loader.h"
#include "util/util.h"

/* train_run's results besides 0 (success, or a requested stop) and -1 (an error in err). */
enum { TRAIN_NONFINITE = 1 }; /* a step's loss or gradient norm was non-finite; the update was not applied */
/* `zaya train` exit status for TRAIN_NONFINITE (every rank), so a supervisor can tell it from a crash (1). */
#define TRAIN_EXIT_NONFINITE 3

typedef struct {
    const char *run_path;           /* RUN.json */
    const char *const *overrides;   /* "key=value" */
    int n_overrides;
    int resume;                     /* continue from OUT_DIR/checkpoints/latest (or the newest that verifies) */
    const char *resume_from;        /* continue from this checkpoint directory (verified first); wins over resume */
    const DataWindow *skip_windows; /* data-batch windows planned but not trained on (merged with the checkpoint's) */
    int n_skip_windows;
    int64_t stop_after;             /* stop (with a checkpoint) after this many steps in total; 0 = run to the end */
    int quiet;                      /* no progress line */
    volatile sig_atomic_t *stop_flag; /* set asynchronously (SIGTERM): checkpoint at the next step and return */
    const Dist *dist;               /* the data-parallel group (NULL: one process) */
} TrainOptions;

/* Runs (or resumes) a training run. On success the final weights are in OUT_DIR/final/ and the latest
 * checkpoint under OUT_DIR/checkpoints/. Every rank keeps OUT_DIR/heartbeat/rank-RRRRR.json current (heartbeat.h).
 * Returns 0, -1 (error in err) or TRAIN_NONFINITE (err names the step and the data index). */
int train_run(const TrainOptions *opts, ZyErr *err);

#endif
