/* report: what a person watching a run sees — a live progress line (step/total, phase, loss, lr, tokens/s, MFU,
 * ETA), OUT_DIR/metrics.jsonl (one JSON object per step and per evaluation), OUT_DIR/events.log, and PNG plots
 * (loss curves with the phases marked, routing entropy per layer) drawn with gnuplot. */
#ifndef ZAYA_REPORT_H
#define ZAYA_REPORT_H

#include <stdint.h>
#include <stdio.h>

#include "model/config.h"
#include "model/routing.h"
#include "train/runconfig.h"
#include "util/util.h"

typedef struct {
    int64_t step;          /* steps completed, this one included */
    int phase;
    double loss, lr, grad_norm;
    double tokens_seen;    /* in the whole run */
    double step_seconds, step_tokens;
    int seq_len;
    const double *entropy; /* [n_layers] normalised routing entropy */
    int n_layers;
    double elapsed;        /* seconds since this process started training */
    double tokens_run;     /* tokens this process trained */
    int64_t steps_run;     /* steps this process trained */
    int64_t end_step;      /* where this process will stop */
    double scatter;        /* loader scatter factor */
    double comm_seconds;   /* time in this step's collectives (gradient reduce-scatter, norm, parameter all-gather) */
    int64_t data_index;    /* the data batch this step trained on (ahead of step - 1 by the batches skipped) */
} StepMetrics;

typedef struct {
    int enabled;           /* 0 on data-parallel ranks other than 0: they report nothing */
    const RunConfig *rc;
    ZayaConfig cfg;
    double peak_gflops;
    FILE *metrics, *events;
    int quiet, tty;
    double tokens_per_s;   /* smoothed */
    double last_print;
    char out_dir[RUN_PATH];
    /* the last routing window, summarised on the progress line */
    int have_routing;
    double route_min_entropy, route_max_skip;
    int route_min_layer, route_max_skip_layer;
} Report;

/* Opens OUT_DIR/metrics.jsonl and events.log. When resuming from step `resume_step` (>= 0), metrics lines of
 * later steps (work that is about to be redone) are dropped first, so the file shows every step once. */
int report_open(Report *r, const RunConfig *rc, const ZayaConfig *cfg, double peak_gflops, int64_t resume_step,
                int quiet, ZyErr *err);
void report_step(Report *r, const StepMetrics *m);
/* Data batches [first, last] were planned but not trained on, before step `step`: a metrics line
 * {"kind": "skip", "step", "data_first", "data_last"} and an event. */
void report_skip(Report *r, int64_t step, int64_t first, int64_t last);
/* Routing health over a window of steps ending at `step` (routing.h says how): one metrics line {"kind":
 * "routing", "step", "phase", "tokens": [L], "entropy": [L], "skip_rate": [L], "max_load": [L], "gate": [L],
 * "p_skip": [L], "load": [L][E] (each real expert's share of the layer's tokens), "bias": [L][classes]}; the
 * progress line shows the worst layer's entropy and skip rate. */
void report_routing(Report *r, int64_t step, int phase, const RoutingWindow *window, const float *const *biases,
                    int classes);
void report_eval(Report *r, int64_t step, int phase, const char *name, double value);
void report_event(Report *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Draws OUT_DIR/loss.png, OUT_DIR/routing.png (per-layer entropy and skip rate over the steps) and, when there
 * are task metrics, OUT_DIR/eval_tasks.png from metrics.jsonl (needs gnuplot; a missing gnuplot is reported, not
 * fatal). */
int report_plot(const char *out_dir, const RunConfig *rc, ZyErr *err);
void report_close(Report *r);
/* Runs gnuplot on a script; its first line of output names the failure (a missing gnuplot included). */
int report_run_gnuplot(const char *script_path, ZyErr *err);

#endif
