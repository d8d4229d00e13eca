/* zaya ablate SPEC.json [--dry-run] [--report]: trains every variant × seed of an ablation spec (ablate.h) as its
 * own `zaya train` process (this binary, /proc/self/exe), one after another; skips the runs already finished,
 * resumes the half-done ones from their checkpoints; then writes OUT/ablation.md, ablation.json, ablation.png. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "train/ablate.h"
#include "cli_signals.h"
#include "commands.h"

static void usage(FILE *f) {
    fprintf(f, "usage: zaya ablate SPEC.json [--dry-run] [--report]\n"
               "  trains each variant of SPEC once per seed (OUT/<variant>/seed-<s>/, a plain zaya train run with its\n"
               "  run.json, train.log, metrics and plots), then writes OUT/ablation.md (the table), ablation.json and\n"
               "  ablation.png (validation-loss curves). Run it again to resume: finished runs are skipped, a run\n"
               "  stopped half-way continues from its last checkpoint.\n"
               "  --dry-run   check the spec, write every run's configs and print the plan; train nothing\n"
               "  --report    only rewrite the report from the runs finished so far\n"
               "exit status: 0 done, 1 error (bad spec, a run failed), 130 interrupted (SIGINT/SIGTERM: the running\n"
               "             training saves a checkpoint first; run the same command again to go on)\n");
}

static int exists(const char *path) {
    struct stat st;
    return lstat(path, &st) == 0;
}

/* The last lines of a log, for an error message. */
static void print_tail(const char *path, int lines) {
    FILE *f = fopen(path, "r");
    if (!f) return;
    char ring[8][512];
    int n = 0;
    while (fgets(ring[n % 8], sizeof ring[0], f)) n++;
    fclose(f);
    const int first = n > lines ? n - lines : 0;
    for (int i = first; i < n; i++) fprintf(stderr, "    | %s", ring[i % 8]);
}

typedef enum { RUN_OK, RUN_FAILED, RUN_INTERRUPTED } RunOutcome;

/* zaya train RUN_JSON [--resume], output appended to LOG; waits, forwarding a stop request. */
static RunOutcome train_child(const char *run_json, int resume, const char *log, volatile sig_atomic_t *stop,
                              int *exit_code) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "zaya: ablate: fork failed: %s\n", strerror(errno));
        return RUN_FAILED;
    }
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd < 0) _exit(127);
        dup2(fd, STDOUT_FILENO);
        dup2(fd, STDERR_FILENO);
        close(fd);
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        char *argv[] = {"zaya", "train", (char *)run_json, resume ? "--resume" : NULL, NULL};
        execv("/proc/self/exe", argv);
        fprintf(stderr, "zaya: ablate: cannot run /proc/self/exe: %s\n", strerror(errno));
        _exit(127);
    }
    int forwarded = 0, status = 0;
    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) break;
        if (r < 0 && errno != EINTR) {
            fprintf(stderr, "zaya: ablate: waitpid: %s\n", strerror(errno));
            return RUN_FAILED;
        }
        if (*stop && !forwarded) { /* a terminal's Ctrl-C reached the trainer too; a kill of ours alone did not */
            kill(pid, SIGTERM);
            forwarded = 1;
        }
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    *exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    if (*stop) return RUN_INTERRUPTED;
    return *exit_code == 0 ? RUN_OK : RUN_FAILED;
}

static int write_report(const AblationSpec *s, const AblationResult *res, const char *spec_path) {
    char command[1200], note[1200] = "";
    snprintf(command, sizeof command, "zaya ablate %s", spec_path);
    ZyErr err = {{0}};
    if (ablation_write_report(s, res, command, note, sizeof note, &err)) {
        fprintf(stderr, "zaya: ablate: %s\n", err.msg);
        return -1;
    }
    printf("[ablate] report: %s/ablation.md, %s/ablation.json; %s\n", s->out_dir, s->out_dir, note);
    return 0;
}

int cmd_ablate(int argc, char **argv) {
    const char *spec_path = NULL;
    int dry = 0, report_only = 0;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--dry-run")) {
            dry = 1;
        } else if (!strcmp(argv[i], "--report")) {
            report_only = 1;
        } else if (argv[i][0] == '-' || spec_path) {
            fprintf(stderr, "zaya: ablate: unexpected argument \"%s\"\n", argv[i]);
            usage(stderr);
            return 1;
        } else {
            spec_path = argv[i];
        }
    }
    if (!spec_path) {
        usage(stderr);
        return 1;
    }
    AblationSpec *s = calloc(1, sizeof *s);
    ZyErr err = {{0}};
    if (!s || ablation_load(s, spec_path, &err) || zy_mkdirs(s->out_dir, &err)) {
        fprintf(stderr, "zaya: ablate: %s\n", s ? err.msg : "out of memory");
        free(s);
        return 1;
    }
    const int V = s->n_variants, S = s->n_seeds;
    AblationResult *res = calloc((size_t)V * S, sizeof *res);
    if (!res) {
        ablation_free(s);
        free(s);
        fprintf(stderr, "zaya: ablate: out of memory\n");
        return 1;
    }
    printf("[ablate] %s: %d variant%s x %d seed%s, %lld steps each -> %s\n", spec_path, V, V > 1 ? "s" : "", S,
           S > 1 ? "s" : "", (long long)s->run.total_steps, s->out_dir);
    for (int v = 0; v < V; v++) {
        const AblationVariant *var = &s->variants[v];
        printf("[ablate]   %-22s %s/%s/%s%s  params %.2fM total, %.2fM active, KV %lld B/token%s\n", var->name,
               cfg_attention_name(var->cfg.attention),
               var->cfg.moe == ZY_MOE_DENSE ? "no-router" : cfg_router_name(var->cfg.router), cfg_moe_name(var->cfg.moe),
               var->cfg.no_residual_scaling ? "/plain-residual" : "", var->stats.total / 1e6, var->stats.active / 1e6,
               (long long)var->stats.kv_bytes_per_token, cfg_is_zaya1(&var->cfg) ? "" : "  (research variant)");
    }
    volatile sig_atomic_t *stop = cli_catch_stop_signals();
    int rc = 0, done = 0;
    for (int v = 0; v < V && rc == 0; v++)
        for (int k = 0; k < S && rc == 0; k++) {
            const char *name = s->variants[v].name;
            const unsigned long long seed = (unsigned long long)s->seeds[k];
            AblationResult *r = &res[v * S + k];
            char run_dir[RUN_PATH + 128], run_json[RUN_PATH + 160], path[RUN_PATH + 200];
            if (ablation_run_dir(s, v, k, run_dir, sizeof run_dir, &err) ||
                ablation_load_result(run_dir, r, &err)) {
                fprintf(stderr, "zaya: ablate: %s\n", err.msg);
                rc = 1;
                break;
            }
            if (r->done) {
                printf("[ablate] %s seed %llu: finished earlier (val loss %.4f) - skipped\n", name, seed, r->val_loss);
                done++;
                continue;
            }
            if (report_only) continue;
            if (ablation_prepare(s, v, k, run_json, sizeof run_json, &err)) {
                fprintf(stderr, "zaya: ablate: %s\n", err.msg);
                rc = 1;
                break;
            }
            snprintf(path, sizeof path, "%s/checkpoints/latest", run_dir);
            const int resume = exists(path);
            if (dry) {
                printf("[ablate] %s seed %llu: would %s (%s)\n", name, seed, resume ? "resume" : "train", run_json);
                continue;
            }
            if (!resume) { /* a run that died before its first checkpoint starts over, from a clean directory */
                static const char *const stale[] = {"metrics.jsonl", "events.log", "train.log", "heartbeat.json"};
                for (size_t i = 0; i < sizeof stale / sizeof *stale; i++) {
                    snprintf(path, sizeof path, "%s/%s", run_dir, stale[i]);
                    unlink(path);
                }
            }
            char log[RUN_PATH + 200];
            snprintf(log, sizeof log, "%s/train.log", run_dir);
            printf("[ablate] %s seed %llu: %s (log: %s)\n", name, seed, resume ? "resuming from its checkpoint" : "training",
                   log);
            fflush(stdout);
            int code = 0;
            const RunOutcome out = train_child(run_json, resume, log, stop, &code);
            snprintf(path, sizeof path, "%s/final/config.json", run_dir);
            if (out == RUN_INTERRUPTED || (out == RUN_OK && !exists(path))) {
                fprintf(stderr, "zaya: ablate: interrupted during %s seed %llu (its checkpoint is kept); run `zaya "
                                "ablate %s` again to go on\n", name, seed, spec_path);
                rc = 130;
                break;
            }
            if (out == RUN_FAILED) {
                fprintf(stderr, "zaya: ablate: %s seed %llu: zaya train failed (exit %d); the end of %s:\n", name, seed,
                        code, log);
                print_tail(log, 6);
                rc = 1;
                break;
            }
            if (ablation_read_metrics(run_dir, r, &err) || ablation_save_result(run_dir, r, &err)) {
                fprintf(stderr, "zaya: ablate: %s\n", err.msg);
                rc = 1;
                break;
            }
            done++;
            printf("[ablate] %s seed %llu: done, %lld steps in %.0f s: train loss %.4f, val loss %.4f, %.0f tokens/s\n",
                   name, seed, (long long)r->steps, r->train_seconds, r->train_loss, r->val_loss, r->tokens_per_s);
        }
    if (report_only && done == 0) printf("[ablate] no run has finished yet: no report\n");
    if (!dry && (rc == 0 || done > 0)) {
        if (write_report(s, res, spec_path)) rc = rc ? rc : 1;
        if (rc == 0 && done == V * S) {
            char md[RUN_PATH + 32];
            snprintf(md, sizeof md, "%s/ablation.md", s->out_dir);
            FILE *f = fopen(md, "r");
            char line[4096];
            while (f && fgets(line, sizeof line, f)) fputs(line, stdout);
            if (f) fclose(f);
        }
    }
    free(res);
    ablation_free(s);
    free(s);
    return rc;
}
