/* zaya train RUN.json [--override key=value ...] [--resume | --resume-from DIR] [--skip-data A:B ...]
 *                    [--stop-after N] [--quiet] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_signals.h"
#include "commands.h"
#include "dist/distributed.h"
#include "train/train.h"

static void usage(FILE *f) {
    fprintf(f, "usage: zaya train RUN.json [--override key=value ...] [--resume | --resume-from DIR]\n"
               "                  [--skip-data A:B ...] [--stop-after N] [--device cpu|cuda|cuda:N] [--quiet]\n"
               "  --override k=v   edit the run config (dotted keys, list indices: phases.0.tokens=1e6)\n"
               "  --resume         continue from OUT_DIR/checkpoints/latest (verified first; if it fails, from the\n"
               "                   newest checkpoint that verifies)\n"
               "  --resume-from D  continue from checkpoint directory D (verified first)\n"
               "  --skip-data A:B  plan data batches A..B (inclusive) but do not train on them; repeatable; kept in\n"
               "                   the checkpoints' trainer state\n"
               "  --stop-after N   stop after N steps in total, saving a checkpoint\n"
               "  --device D       cpu (default), cuda (the rank-local GPU) or cuda:N: the run config's \"device\";\n"
               "                   checkpoints are the same on both, so a run resumes on either\n"
               "  --quiet          no progress line\n"
               "exit status: 0 finished or stopped (SIGTERM/SIGINT: checkpoint, then exit), 1 error,\n"
               "             %d non-finite loss or gradient norm (the update was not applied)\n", TRAIN_EXIT_NONFINITE);
}

int cmd_train_model(int argc, char **argv) {
    TrainOptions o = {0};
    const char **overrides = calloc((size_t)argc, sizeof *overrides);
    DataWindow *skips = calloc((size_t)argc, sizeof *skips);
    int n_over = 0, n_skips = 0;
    char device_override[64];
    if (!overrides || !skips) {
        free(overrides);
        free(skips);
        return 1;
    }
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            free(overrides);
            free(skips);
            return 0;
        } else if (strcmp(a, "--override") == 0 && i + 1 < argc) {
            overrides[n_over++] = argv[++i];
        } else if (strncmp(a, "--override=", 11) == 0) {
            overrides[n_over++] = a + 11;
        } else if (strcmp(a, "--resume") == 0) {
            o.resume = 1;
        } else if (strcmp(a, "--resume-from") == 0 && i + 1 < argc) {
            o.resume_from = argv[++i];
        } else if (strcmp(a, "--skip-data") == 0 && i + 1 < argc) {
            ZyErr err;
            if (skip_window_parse(argv[++i], &skips[n_skips++], &err)) {
                fprintf(stderr, "zaya: train: --skip-data: %s\n", err.msg);
                free(overrides);
                free(skips);
                return 1;
            }
        } else if (strcmp(a, "--device") == 0 && i + 1 < argc) {
            snprintf(device_override, sizeof device_override, "device=%s", argv[++i]);
            overrides[n_over++] = device_override;
        } else if (strcmp(a, "--quiet") == 0) {
            o.quiet = 1;
        } else if (strcmp(a, "--stop-after") == 0 && i + 1 < argc) {
            char *end;
            long long v = strtoll(argv[++i], &end, 10);
            if (*end || v <= 0) {
                fprintf(stderr, "zaya: train: --stop-after expects a positive integer, got \"%s\"\n", argv[i]);
                free(overrides);
                free(skips);
                return 1;
            }
            o.stop_after = v;
        } else if (a[0] == '-' ) {
            fprintf(stderr, "zaya: train: unknown or incomplete option \"%s\"\n", a);
            usage(stderr);
            free(overrides);
            free(skips);
            return 1;
        } else if (!o.run_path) {
            o.run_path = a;
        } else {
            fprintf(stderr, "zaya: train: unexpected argument \"%s\"\n", a);
            free(overrides);
            free(skips);
            return 1;
        }
    }
    if (!o.run_path) {
        usage(stderr);
        free(overrides);
        free(skips);
        return 1;
    }
    o.overrides = overrides;
    o.n_overrides = n_over;
    o.skip_windows = skips;
    o.n_skip_windows = n_skips;
    /* SIGTERM/SIGINT: the trainer saves a checkpoint at the next step boundary and exits 0 (preemption). */
    o.stop_flag = cli_catch_stop_signals();
    ZyErr err = {{0}};
    Dist dist;
    if (dist_init(&dist, &err)) {
        fprintf(stderr, "zaya: %s\n", err.msg);
        free(overrides);
        free(skips);
        return 1;
    }
    o.dist = &dist;
    int rc = train_run(&o, &err);
    if (rc == TRAIN_NONFINITE) { /* every rank saw it (all-reduced values) and stopped cleanly: no abort needed */
        if (dist.rank == 0) fprintf(stderr, "zaya: %s\n", err.msg);
        dist_finalize(&dist);
        free(overrides);
        free(skips);
        return TRAIN_EXIT_NONFINITE;
    }
    if (rc) {
        if (dist.size > 1) {
            fprintf(stderr, "zaya: rank %d: %s\n", dist.rank, err.msg);
            dist_abort(&dist, 1); /* the other ranks may be waiting in a collective: end them all */
        }
        fprintf(stderr, "zaya: %s\n", err.msg);
    }
    dist_finalize(&dist);
    free(overrides);
    free(skips);
    return rc ? 1 : 0;
}
