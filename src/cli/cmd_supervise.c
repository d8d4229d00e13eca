/* zaya supervise [options] -- <launch command...>: runs a training job and heals it (src/aegis/supervisor.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_signals.h"
#include "commands.h"
#include "aegis/supervisor.h"

static void usage(FILE *f) {
    SupervisorOptions d;
    supervisor_defaults(&d);
    fprintf(f,
            "usage: zaya supervise [options] -- <launch command...>\n"
            "  e.g. zaya supervise -- mpirun -np 2 build/zaya train RUN.json\n"
            "  --run-dir DIR        the run's out_dir (default: read from `train RUN.json` in the command)\n"
            "  --max-restarts N     restarts before giving up (default %d)\n"
            "  --hang-timeout S     seconds without a heartbeat before the job counts as hung\n"
            "                       (default: max(%g, 10 x median step time))\n"
            "  --start-timeout S    seconds a launch may take to its first step (default %g)\n"
            "  --grace S            SIGTERM to SIGKILL when stopping the job (default %g)\n"
            "  --backoff S          first restart delay, doubled per restart (default %g)\n"
            "  --backoff-max S      longest restart delay (default %g)\n"
            "  --skip-width N       data batches skipped after a non-finite or spiking step (default %d)\n"
            "  --spike-z Z          loss spike threshold in standard deviations (default off)\n"
            "  --spike-window N     losses in the spike detector's window (default %d)\n"
            "  --poll S             seconds between checks (default %g)\n"
            "  --quiet              no progress messages\n"
            "writes RUN_DIR/faults.jsonl (one event per line) and RUN_DIR/supervisor_summary.json\n"
            "exit status: 0 the run finished or was stopped (SIGTERM/SIGINT), 1 gave up or failed, 2 usage error\n",
            d.max_restarts, d.hang_floor, d.start_timeout, d.grace, d.backoff, d.backoff_max, d.skip_width,
            d.spike_window, d.poll);
}

/* A number >= min (an integer if asked) for a flag, or an error naming the flag. */
static int number_arg(const char *flag, const char *text, double min, int integer, double *out) {
    char *end;
    double v = strtod(text, &end);
    if (end == text || *end || !(v >= min) || v > 1e9 || (integer && v != (double)(long)v)) {
        fprintf(stderr, "zaya: supervise: %s expects %s >= %g, got \"%s\"\n", flag, integer ? "an integer" : "a number",
                min, text);
        return -1;
    }
    *out = v;
    return 0;
}

int cmd_supervise(int argc, char **argv) {
    SupervisorOptions o;
    supervisor_defaults(&o);
    const char *run_dir = NULL;
    int quiet = 0, i = 2;
    for (; i < argc; i++) {
        const char *a = argv[i];
        double v = 0;
        if (strcmp(a, "--") == 0) {
            i++;
            break;
        }
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        }
        if (strcmp(a, "--quiet") == 0) {
            quiet = 1;
            continue;
        }
        if (a[0] != '-') {
            fprintf(stderr, "zaya: supervise: unexpected argument \"%s\" (the launch command goes after --)\n", a);
            return 2;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "zaya: supervise: unknown or incomplete option \"%s\"\n", a);
            usage(stderr);
            return 2;
        }
        const char *val = argv[++i];
        int bad = 0;
        if (strcmp(a, "--run-dir") == 0) run_dir = val;
        else if (strcmp(a, "--max-restarts") == 0) bad = number_arg(a, val, 0, 1, &v), o.max_restarts = (int)v;
        else if (strcmp(a, "--hang-timeout") == 0) bad = number_arg(a, val, 0.1, 0, &o.hang_timeout);
        else if (strcmp(a, "--start-timeout") == 0) bad = number_arg(a, val, 0.1, 0, &o.start_timeout);
        else if (strcmp(a, "--grace") == 0) bad = number_arg(a, val, 0, 0, &o.grace);
        else if (strcmp(a, "--backoff") == 0) bad = number_arg(a, val, 0, 0, &o.backoff);
        else if (strcmp(a, "--backoff-max") == 0) bad = number_arg(a, val, 0, 0, &o.backoff_max);
        else if (strcmp(a, "--skip-width") == 0) bad = number_arg(a, val, 1, 1, &v), o.skip_width = (int)v;
        else if (strcmp(a, "--spike-z") == 0) bad = number_arg(a, val, 0, 0, &o.spike_z);
        else if (strcmp(a, "--spike-window") == 0) {
            bad = number_arg(a, val, 2, 1, &v), o.spike_window = (int)v;
            if (!bad && v > SPIKE_MAX_WINDOW) {
                fprintf(stderr, "zaya: supervise: --spike-window: at most %d losses\n", SPIKE_MAX_WINDOW);
                bad = 1;
            }
        } else if (strcmp(a, "--poll") == 0) bad = number_arg(a, val, 0.01, 0, &o.poll);
        else {
            fprintf(stderr, "zaya: supervise: unknown option \"%s\"\n", a);
            usage(stderr);
            return 2;
        }
        if (bad) return 2;
    }
    if (i >= argc) {
        fprintf(stderr, "zaya: supervise: no launch command (put it after --)\n");
        usage(stderr);
        return 2;
    }
    o.command = argv + i;
    o.n_command = argc - i;
    ZyErr err = {{0}};
    char derived[1024];
    if (!run_dir) {
        if (supervisor_run_dir_from_command(o.command, o.n_command, derived, sizeof derived, &err)) {
            fprintf(stderr, "zaya: supervise: %s\n", err.msg);
            return 2;
        }
        run_dir = derived;
    }
    o.run_dir = run_dir;
    o.log = quiet ? NULL : stderr;
    /* SIGTERM/SIGINT: forward the stop to the job (it checkpoints and exits 0), then exit 0 without relaunch. */
    o.stop_flag = cli_catch_stop_signals();
    SupervisorSummary sum;
    if (supervise(&o, &sum, &err)) {
        fprintf(stderr, "zaya: supervise: %s\n", err.msg);
        return 1;
    }
    if (sum.outcome == SUP_OUTCOME_GAVE_UP) {
        fprintf(stderr, "zaya: supervise: %s\n", sum.reason);
        return 1;
    }
    return 0;
}
