/* supervisor ("Aegis"): runs a training job, watches it and heals it.
 *
 * `zaya supervise [options] -- <launch command>` starts the command in its own process group and watches the
 * job's exit status, the per-rank heartbeats (heartbeat.h) and metrics.jsonl. It detects a crash (non-zero exit
 * or signal of the launcher, or a rank process that vanished), a hang (no heartbeat rewritten within the hang
 * timeout), a non-finite step (heartbeat state "nonfinite" or exit status 3), a loss spike (rolling z-score), and
 * checkpoints that fail verification. It then stops the whole job (SIGTERM + SIGCONT, SIGKILL after the grace
 * period), moves damaged checkpoints (and, for a rollback, newer ones) to checkpoints/quarantine/, points `latest`
 * at the newest checkpoint that verifies and relaunches the command with `--resume-from DIR` and every
 * `--skip-data A:B` window accumulated so far (a non-finite or spiking step at data index i adds [i, i+width-1]).
 * Restarts are bounded and backed off exponentially. Every event goes to RUN_DIR/faults.jsonl; a summary to
 * RUN_DIR/supervisor_summary.json. */
#ifndef ZAYA_SUPERVISOR_H
#define ZAYA_SUPERVISOR_H

#include <signal.h>
#include <stdint.h>
#include <stdio.h>

#include "util/util.h"

/* Kinds of events in faults.jsonl. */
typedef enum {
    SUP_CRASH, SUP_HANG, SUP_NONFINITE, SUP_SPIKE, SUP_BAD_CHECKPOINT, SUP_PREEMPTED, SUP_RESTART, SUP_GIVEUP, SUP_DONE,
    SUP_EVENT_COUNT
} SupEventKind;
const char *sup_event_name(SupEventKind k);

typedef struct {
    char *const *command;    /* the launch command (argv, without a terminating NULL) */
    int n_command;
    const char *run_dir;     /* the run's out_dir */
    double hang_timeout;     /* seconds without a heartbeat rewrite; 0 = max(hang_floor, 10 x median step time) */
    double hang_floor;       /* lower bound of the derived hang timeout */
    double start_timeout;    /* seconds a launch may take to its first heartbeat after starting */
    double grace;            /* SIGTERM (or a non-finite step's own exit) to SIGKILL */
    double backoff;          /* first restart delay; doubles per restart */
    double backoff_max;
    int max_restarts;
    int skip_width;          /* data batches skipped after a non-finite or spiking step */
    double spike_z;          /* z-score threshold of the loss spike detector; 0 = off */
    int spike_window;        /* losses in the rolling window */
    double poll;             /* seconds between checks */
    volatile sig_atomic_t *stop_flag; /* SIGTERM/SIGINT to the supervisor: forward, wait, exit without relaunch */
    FILE *log;               /* progress messages (NULL: none) */
} SupervisorOptions;

/* Defaults for every field but command, run_dir, stop_flag. */
void supervisor_defaults(SupervisorOptions *o);

typedef enum { SUP_OUTCOME_DONE, SUP_OUTCOME_STOPPED, SUP_OUTCOME_GAVE_UP } SupOutcome;

typedef struct {
    SupOutcome outcome;
    int launches, restarts;
    int events[SUP_EVENT_COUNT];
    int64_t steps_redone;     /* updates done before a fault and lost by the rollback */
    int64_t final_steps;      /* train lines in the final metrics.jsonl */
    double wall_seconds;      /* the supervisor's whole run */
    double productive_seconds; /* sum of step_seconds in the final metrics.jsonl */
    double goodput;           /* productive / wall */
    char reason[1024];        /* why it gave up */
} SupervisorSummary;

/* Runs the job to completion (restarting it as needed). Returns 0 with the summary filled (outcome done, stopped or
 * gave up), -1 on an error of the supervisor itself (err). */
int supervise(const SupervisorOptions *o, SupervisorSummary *summary, ZyErr *err);

/* The run directory of a launch command: finds `train RUN.json` in it and reads out_dir from the run config, with
 * the command's --override arguments applied. */
int supervisor_run_dir_from_command(char *const *command, int n, char *out, size_t cap, ZyErr *err);

/* ---- pure pieces (unit-tested) ---------------------------------------------------------------------------- */

#define SPIKE_MAX_WINDOW 4096

/* Loss spike detector: a loss whose z-score against the last `window` accepted losses exceeds the threshold
 * (upward only) is a spike; spikes are not added to the window, so one spike does not hide the next. Needs at
 * least min_samples losses first. */
typedef struct {
    int window, min_samples, count, next;
    double threshold;
    double values[SPIKE_MAX_WINDOW];
} SpikeDetector;

int spike_init(SpikeDetector *d, int window, double threshold, int min_samples, ZyErr *err);
/* 1 if loss is a spike (z in *z), else 0 (and loss joins the window). A non-finite loss is always a spike. */
int spike_observe(SpikeDetector *d, double loss, double *z);

/* The derived hang timeout: max(floor, factor x median of the step times); floor when there are none. */
double supervisor_hang_timeout(const double *step_seconds, int n, double floor, double factor);

#endif
