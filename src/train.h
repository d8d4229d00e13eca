/* train: the single-process pretraining loop — curriculum phases, micro-batch accumulation, clipping, the
 * schedule, Muon + AdamW, the balancing controller, validation, checkpoints, bit-exact resume, metrics. */
#ifndef ZAYA_TRAIN_H
#define ZAYA_TRAIN_H

#include <signal.h>
#include <stdint.h>

#include "distributed.h"
#include "util.h"

typedef struct {
    const char *run_path;           /* RUN.json */
    const char *const *overrides;   /* "key=value" */
    int n_overrides;
    int resume;                     /* continue from OUT_DIR/checkpoints/latest */
    int64_t stop_after;             /* stop (with a checkpoint) after this many steps in total; 0 = run to the end */
    int quiet;                      /* no progress line */
    volatile sig_atomic_t *stop_flag; /* set asynchronously (SIGTERM): checkpoint at the next step and return */
    const Dist *dist;               /* the data-parallel group (NULL: one process) */
} TrainOptions;

/* Runs (or resumes) a training run. On success the final weights are in OUT_DIR/final/ and the latest
 * checkpoint under OUT_DIR/checkpoints/. */
int train_run(const TrainOptions *opts, ZyErr *err);

#endif
