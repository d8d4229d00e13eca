#include "aegis/supervisor.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "io/checkpoint.h"
#include "train/heartbeat.h"
#include "train/loader.h"
#include "train/runconfig.h"

static const char *const event_names[SUP_EVENT_COUNT] = {"crash",   "hang",    "nonfinite", "spike", "bad_checkpoint",
                                                         "preempted", "restart", "giveup",    "done"};

const char *sup_event_name(SupEventKind k) { return k >= 0 && k < SUP_EVENT_COUNT ? event_names[k] : "?"; }

void supervisor_defaults(SupervisorOptions *o) {
    memset(o, 0, sizeof *o);
    o->hang_floor = 30;
    o->start_timeout = 300;
    o->grace = 30;
    o->backoff = 1;
    o->backoff_max = 60;
    o->max_restarts = 5;
    o->skip_width = 1;
    o->spike_z = 0;
    o->spike_window = 50;
    o->poll = 0.2;
}

/* ---- pure pieces ------------------------------------------------------------------------------------------ */

int spike_init(SpikeDetector *d, int window, double threshold, int min_samples, ZyErr *err) {
    if (window < 2 || window > SPIKE_MAX_WINDOW)
        return zy_fail(err, "spike window %d: must be between 2 and %d losses", window, SPIKE_MAX_WINDOW);
    if (!(threshold > 0)) return zy_fail(err, "spike threshold %g: must be positive", threshold);
    if (min_samples < 2 || min_samples > window)
        return zy_fail(err, "spike detector: min_samples %d must be between 2 and the window %d", min_samples, window);
    memset(d, 0, sizeof *d);
    d->window = window;
    d->threshold = threshold;
    d->min_samples = min_samples;
    return 0;
}

int spike_observe(SpikeDetector *d, double loss, double *z) {
    *z = 0;
    if (!isfinite(loss)) {
        *z = INFINITY;
        return 1;
    }
    if (d->count >= d->min_samples) {
        double mean = 0, var = 0;
        for (int i = 0; i < d->count; i++) mean += d->values[i];
        mean /= d->count;
        for (int i = 0; i < d->count; i++) var += (d->values[i] - mean) * (d->values[i] - mean);
        double sd = sqrt(var / (d->count - 1));
        /* a floor on the spread: a perfectly flat history must not turn rounding noise into a spike */
        double floor_sd = 1e-3 * fmax(fabs(mean), 1e-6);
        *z = (loss - mean) / fmax(sd, floor_sd);
        if (*z > d->threshold) return 1;
    }
    d->values[d->next] = loss;
    d->next = (d->next + 1) % d->window;
    if (d->count < d->window) d->count++;
    return 0;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double supervisor_hang_timeout(const double *step_seconds, int n, double floor, double factor) {
    if (n <= 0) return floor;
    double *v = malloc((size_t)n * sizeof *v);
    if (!v) return floor;
    memcpy(v, step_seconds, (size_t)n * sizeof *v);
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    double median = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
    free(v);
    return fmax(floor, factor * median);
}

/* ---- run directory from the command ----------------------------------------------------------------------- */

int supervisor_run_dir_from_command(char *const *cmd, int n, char *out, size_t cap, ZyErr *err) {
    int run_at = -1;
    for (int i = 0; i + 1 < n && run_at < 0; i++)
        if (strcmp(cmd[i], "train") == 0)
            for (int j = i + 1; j < n && run_at < 0; j++) {
                size_t len = strlen(cmd[j]);
                if (cmd[j][0] == '-') {
                    if (strcmp(cmd[j], "--override") == 0) j++; /* its value */
                    continue;
                }
                if (len > 5 && strcmp(cmd[j] + len - 5, ".json") == 0) run_at = j;
            }
    if (run_at < 0)
        return zy_fail(err, "cannot find `train RUN.json` in the launch command: give the run directory with --run-dir");
    const char **overrides = calloc((size_t)n, sizeof *overrides);
    RunConfig *rc = calloc(1, sizeof *rc);
    int n_over = 0, r = -1;
    if (!overrides || !rc) {
        zy_fail(err, "out of memory");
        goto done;
    }
    for (int i = run_at + 1; i < n; i++) {
        if (strcmp(cmd[i], "--override") == 0 && i + 1 < n)
            overrides[n_over++] = cmd[++i];
        else if (strncmp(cmd[i], "--override=", 11) == 0)
            overrides[n_over++] = cmd[i] + 11;
    }
    if (runconfig_load(rc, cmd[run_at], overrides, n_over, NULL, err)) {
        zy_wrap(err, "reading the run directory from the launch command");
        goto done;
    }
    if (snprintf(out, cap, "%s", rc->out_dir) >= (int)cap) {
        zy_fail(err, "%s: out_dir too long", cmd[run_at]);
        goto done;
    }
    r = 0;
done:
    free(overrides);
    free(rc);
    return r;
}

/* ---- the supervisor --------------------------------------------------------------------------------------- */

#define MAX_RANKS 1024
#define MAX_PIDS 4096

typedef struct {
    const SupervisorOptions *o;
    SupervisorSummary *sum;
    char run_dir[RUN_PATH], ckpt_root[RUN_PATH + 32], host[64];
    FILE *faults;
    SkipWindows skips;    /* accumulated over the whole supervised run */
    double t_start;
    double *step_times;   /* every step time seen in heartbeats, for the derived hang timeout */
    int n_step_times, cap_step_times;
} Sup;

/* What one launch ended with. */
typedef enum { END_DONE, END_STOPPED, END_PREEMPTED, END_CRASH, END_HANG, END_NONFINITE, END_SPIKE } EndKind;

typedef struct {
    EndKind kind;
    int rank;             /* -1 when unknown */
    int64_t step;         /* the event's step: the spiking step, else the highest step any rank reported */
    int64_t reached;      /* the highest step any rank reported */
    int64_t data_index;   /* for non-finite / spike: the offending data batch */
    int64_t start_step;   /* the step the launch started from (first heartbeat) */
    char detail[1024];
} LaunchEnd;

static void say(const Sup *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(const Sup *s, const char *fmt, ...) {
    if (!s->o->log) return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(s->o->log, "zaya supervise: ");
    vfprintf(s->o->log, fmt, ap);
    fprintf(s->o->log, "\n");
    fflush(s->o->log);
    va_end(ap);
}

static void log_event(Sup *s, SupEventKind kind, int rank, int64_t step, const char *action, const char *detail,
                      const DataWindow *skip) {
    s->sum->events[kind]++;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "time", heartbeat_unix_time());
    cJSON_AddStringToObject(o, "kind", event_names[kind]);
    if (rank >= 0)
        cJSON_AddNumberToObject(o, "rank", rank);
    else
        cJSON_AddNullToObject(o, "rank");
    if (step >= 0)
        cJSON_AddNumberToObject(o, "step", (double)step);
    else
        cJSON_AddNullToObject(o, "step");
    cJSON_AddStringToObject(o, "action", action);
    cJSON_AddStringToObject(o, "detail", detail);
    if (skip) {
        double w[2] = {(double)skip->first, (double)skip->last};
        cJSON_AddItemToObject(o, "skip", cJSON_CreateDoubleArray(w, 2));
    }
    cJSON_AddNumberToObject(o, "launch", s->sum->launches);
    char *line = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (line && s->faults) {
        fprintf(s->faults, "%s\n", line);
        fflush(s->faults);
    }
    free(line);
    char where[64] = "";
    if (rank >= 0 && step >= 0)
        snprintf(where, sizeof where, " [rank %d, step %lld]", rank, (long long)step);
    else if (step >= 0)
        snprintf(where, sizeof where, " [step %lld]", (long long)step);
    say(s, "%s%s: %s%s%s", event_names[kind], where, detail, detail[0] ? " -> " : "", action);
}

static void sleep_seconds(double s) {
    if (s <= 0) return;
    struct timespec ts = {(time_t)s, (long)((s - floor(s)) * 1e9)};
    nanosleep(&ts, NULL);
}

/* ---- processes -------------------------------------------------------------------------------------------- */

/* Whether pid is a live (not zombie) process on this machine. */
static int pid_alive(long pid) {
    if (pid <= 0) return 0;
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return kill((pid_t)pid, 0) == 0 || errno == EPERM;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *close_paren = strrchr(buf, ')');
    return !(close_paren && close_paren[1] == ' ' && (close_paren[2] == 'Z' || close_paren[2] == 'X'));
}

/* Every descendant of root (mpirun's ranks live in their own process groups, so the group alone misses them). */
static int descendants(pid_t root, pid_t *out, int max) {
    static const int cap = 32768;
    pid_t *pids = malloc((size_t)cap * sizeof *pids), *ppids = malloc((size_t)cap * sizeof *ppids);
    int n = 0, count = 0;
    DIR *d = opendir("/proc");
    if (d && pids && ppids) {
        struct dirent *e;
        while ((e = readdir(d)) && n < cap) {
            char *end;
            long pid = strtol(e->d_name, &end, 10);
            if (*end || pid <= 0) continue;
            char path[64], buf[512];
            snprintf(path, sizeof path, "/proc/%ld/stat", pid);
            FILE *f = fopen(path, "r");
            if (!f) continue;
            size_t got = fread(buf, 1, sizeof buf - 1, f);
            fclose(f);
            buf[got] = '\0';
            const char *p = strrchr(buf, ')');
            long ppid;
            char state;
            if (!p || sscanf(p + 1, " %c %ld", &state, &ppid) != 2) continue;
            pids[n] = (pid_t)pid, ppids[n] = (pid_t)ppid, n++;
        }
    }
    if (d) closedir(d);
    if (pids && ppids) {
        /* breadth-first: out[] doubles as the queue */
        int head = 0;
        pid_t cur = root;
        for (;;) {
            for (int i = 0; i < n && count < max; i++)
                if (ppids[i] == cur) out[count++] = pids[i];
            if (head >= count) break;
            cur = out[head++];
        }
    }
    free(pids);
    free(ppids);
    return count;
}

typedef struct {
    pid_t launcher;      /* the launched command (its own process group) */
    int exited;          /* launcher reaped */
    int status;          /* its wait status */
    long rank_pids[MAX_RANKS];
    int n_rank_pids;
} Job;

static void reap_nowait(Job *j) {
    if (j->exited) return;
    int st;
    pid_t r = waitpid(j->launcher, &st, WNOHANG);
    if (r == j->launcher) j->exited = 1, j->status = st;
}

static void signal_job(Job *j, int sig, const pid_t *extra, int n_extra) {
    if (!j->exited) kill(-j->launcher, sig);
    for (int i = 0; i < n_extra; i++) kill(extra[i], sig);
    for (int i = 0; i < j->n_rank_pids; i++)
        if (pid_alive(j->rank_pids[i])) kill((pid_t)j->rank_pids[i], sig);
}

static int job_gone(Job *j) {
    reap_nowait(j);
    if (!j->exited) return 0;
    for (int i = 0; i < j->n_rank_pids; i++)
        if (pid_alive(j->rank_pids[i])) return 0;
    return 1;
}

/* Stops the whole job: SIGTERM and SIGCONT (a stopped process only handles SIGTERM once continued) to the
 * launcher's group, its descendants and the ranks; SIGKILL after `grace`; returns once everything is gone. */
static void stop_job(Sup *s, Job *j, double grace) {
    pid_t *tree = malloc(MAX_PIDS * sizeof *tree);
    int n_tree = tree && !j->exited ? descendants(j->launcher, tree, MAX_PIDS) : 0;
    signal_job(j, SIGTERM, tree, n_tree);
    signal_job(j, SIGCONT, tree, n_tree);
    const double deadline = zy_now_seconds() + grace;
    while (!job_gone(j) && zy_now_seconds() < deadline) sleep_seconds(0.05);
    if (!job_gone(j)) {
        say(s, "the job did not stop within %.1f s of SIGTERM: SIGKILL", grace);
        if (tree && !j->exited) {
            int more = descendants(j->launcher, tree + n_tree, MAX_PIDS - n_tree);
            n_tree += more;
        }
        signal_job(j, SIGKILL, tree, n_tree);
    }
    if (!j->exited) {
        int st;
        if (waitpid(j->launcher, &st, 0) == j->launcher) j->exited = 1, j->status = st;
    }
    /* ranks reparented to init after their launcher died: wait until they are gone, killing stragglers */
    for (int tries = 0; tries < 200 && !job_gone(j); tries++) {
        if (tries == 20) signal_job(j, SIGKILL, tree, n_tree);
        sleep_seconds(0.05);
    }
    free(tree);
}

/* ---- heartbeats and metrics ------------------------------------------------------------------------------- */

static void clear_heartbeats(const Sup *s) {
    char dir[RUN_PATH + 32];
    snprintf(dir, sizeof dir, "%s/heartbeat", s->run_dir);
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[RUN_PATH + 320];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(d);
}

/* Reads every rank's heartbeat; returns the count (files being replaced are skipped). */
static int read_heartbeats(const Sup *s, Heartbeat *hb, int max) {
    char dir[RUN_PATH + 32];
    snprintf(dir, sizeof dir, "%s/heartbeat", s->run_dir);
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < max) {
        int rank;
        char tail[16];
        if (sscanf(e->d_name, "rank-%d.jso%15s", &rank, tail) != 2 || strcmp(tail, "n") != 0) continue;
        char path[RUN_PATH + 320];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        ZyErr ignore;
        if (heartbeat_read(path, &hb[n], &ignore) == 0) n++;
    }
    closedir(d);
    return n;
}

typedef struct {
    long offset;        /* bytes of metrics.jsonl consumed */
    SpikeDetector det;
    int enabled;
} MetricsWatch;

/* Feeds new complete train lines of metrics.jsonl to the spike detector; 1 (with step, data index and detail) on a
 * spike. */
static int watch_metrics(const Sup *s, MetricsWatch *w, LaunchEnd *end) {
    if (!w->enabled) return 0;
    char path[RUN_PATH + 32];
    snprintf(path, sizeof path, "%s/metrics.jsonl", s->run_dir);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    if (fseek(f, 0, SEEK_END) != 0 || ftell(f) < w->offset) w->offset = 0; /* rewritten (a resume truncated it) */
    fseek(f, w->offset, SEEK_SET);
    char line[16384];
    int spike = 0;
    while (!spike && fgets(line, sizeof line, f)) {
        size_t len = strlen(line);
        if (len == 0 || line[len - 1] != '\n') break; /* incomplete: read it next time */
        w->offset += (long)len;
        cJSON *o = cJSON_Parse(line);
        const cJSON *kind = o ? cJSON_GetObjectItemCaseSensitive(o, "kind") : NULL;
        if (cJSON_IsString(kind) && strcmp(kind->valuestring, "train") == 0) {
            const cJSON *loss = cJSON_GetObjectItemCaseSensitive(o, "loss"), *step = cJSON_GetObjectItemCaseSensitive(o, "step");
            const cJSON *di = cJSON_GetObjectItemCaseSensitive(o, "data_index");
            double z;
            if (cJSON_IsNumber(loss) && cJSON_IsNumber(step) && spike_observe(&w->det, loss->valuedouble, &z)) {
                spike = 1;
                end->kind = END_SPIKE;
                end->step = (int64_t)step->valuedouble;
                end->data_index = cJSON_IsNumber(di) ? (int64_t)di->valuedouble : end->step - 1;
                snprintf(end->detail, sizeof end->detail, "loss %.4f at step %lld is %.1f standard deviations above the last %d",
                         loss->valuedouble, (long long)end->step, z, w->det.count);
            }
        }
        cJSON_Delete(o);
    }
    fclose(f);
    return spike;
}

/* Launches the command and watches it until it ends or a fault is seen; the job is gone when this returns. */
static int run_once(Sup *s, char *const *argv, LaunchEnd *end, ZyErr *err) {
    const SupervisorOptions *o = s->o;
    memset(end, 0, sizeof *end);
    end->rank = -1;
    end->step = -1;
    end->reached = -1;
    end->start_step = -1;
    clear_heartbeats(s);
    fflush(NULL);
    Job job = {0};
    job.launcher = fork();
    if (job.launcher < 0) return zy_fail(err, "fork failed: %s", strerror(errno));
    if (job.launcher == 0) {
        setpgid(0, 0); /* its own group: the supervisor signals the job, never itself */
        signal(SIGTERM, SIG_DFL);
        signal(SIGINT, SIG_DFL);
        execvp(argv[0], argv);
        fprintf(stderr, "zaya supervise: cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    setpgid(job.launcher, job.launcher);
    s->sum->launches++;
    MetricsWatch mw = {0};
    if (o->spike_z > 0) {
        int min = o->spike_window < 10 ? o->spike_window : 10;
        if (spike_init(&mw.det, o->spike_window, o->spike_z, min, err)) {
            stop_job(s, &job, 0);
            return -1;
        }
        mw.enabled = 1;
    }
    Heartbeat *hb = malloc(MAX_RANKS * sizeof *hb);
    double *last_time = calloc(MAX_RANKS, sizeof *last_time);
    int64_t *last_step = malloc(MAX_RANKS * sizeof *last_step);
    if (!hb || !last_time || !last_step) {
        free(hb), free(last_time), free(last_step);
        stop_job(s, &job, 0);
        return zy_fail(err, "out of memory");
    }
    for (int i = 0; i < MAX_RANKS; i++) last_step[i] = -1;
    const double launched = zy_now_seconds();
    double last_progress = launched;
    int seen_heartbeat = 0, stepped = 0, forwarded = 0, nonfinite = 0;
    double forwarded_at = 0, nonfinite_at = 0;
    int fault = 0; /* set when the watch decided the launch is over (the job is then stopped) */
    while (!fault) {
        reap_nowait(&job);
        if (o->stop_flag && *o->stop_flag && !forwarded) {
            say(s, "stop requested: forwarding SIGTERM to the job (it checkpoints and exits)");
            pid_t *tree = malloc(MAX_PIDS * sizeof *tree);
            int n_tree = tree && !job.exited ? descendants(job.launcher, tree, MAX_PIDS) : 0;
            signal_job(&job, SIGTERM, tree, n_tree);
            signal_job(&job, SIGCONT, tree, n_tree);
            free(tree);
            forwarded = 1;
            forwarded_at = zy_now_seconds();
        }
        if (job.exited) break;
        /* liveness of this host's ranks first, then their heartbeats: a rank that wrote its final state and exited
         * is then never mistaken for a crash */
        int dead[MAX_RANKS / 8 + 1];
        int n_dead = 0;
        for (int i = 0; i < job.n_rank_pids && n_dead < (int)ZY_ARRAY_LEN(dead); i++)
            if (!pid_alive(job.rank_pids[i])) dead[n_dead++] = (int)job.rank_pids[i];
        int n = read_heartbeats(s, hb, MAX_RANKS);
        const double now = zy_now_seconds();
        for (int i = 0; i < n; i++) {
            const Heartbeat *h = &hb[i];
            if (h->rank < 0 || h->rank >= MAX_RANKS) continue;
            seen_heartbeat = 1;
            if (end->start_step < 0) end->start_step = h->step;
            if (h->step > end->reached) end->reached = h->step;
            if (h->time != last_time[h->rank]) { /* rewritten: this rank made progress */
                /* a RUNNING heartbeat with a step time is written after a completed step, and the heartbeats are
                 * cleared before each launch: this launch has stepped even when the first one seen is already past
                 * its start (a fast job can run all its first steps between two polls) */
                if (h->state == HB_RUNNING && h->step_seconds > 0 && h->step > last_step[h->rank]) {
                    stepped = 1;
                    if (s->n_step_times == s->cap_step_times) {
                        int cap = s->cap_step_times ? 2 * s->cap_step_times : 256;
                        double *grown = realloc(s->step_times, (size_t)cap * sizeof *grown);
                        if (grown) s->step_times = grown, s->cap_step_times = cap;
                    }
                    if (s->n_step_times < s->cap_step_times) s->step_times[s->n_step_times++] = h->step_seconds;
                }
                last_time[h->rank] = h->time;
                last_step[h->rank] = h->step;
                last_progress = now;
            }
            if (strcmp(h->host, s->host) == 0) {
                int known = 0;
                for (int k = 0; k < job.n_rank_pids; k++) known |= job.rank_pids[k] == h->pid;
                if (!known && job.n_rank_pids < MAX_RANKS) job.rank_pids[job.n_rank_pids++] = h->pid;
                for (int k = 0; k < n_dead && !fault && !forwarded; k++)
                    if (dead[k] == h->pid && (h->state == HB_STARTING || h->state == HB_RUNNING)) {
                        fault = 1;
                        end->kind = END_CRASH;
                        end->rank = h->rank;
                        snprintf(end->detail, sizeof end->detail, "rank %d (pid %ld) died at step %lld", h->rank, h->pid,
                                 (long long)h->step);
                    }
            }
            if (h->state == HB_NONFINITE && !nonfinite) {
                nonfinite = 1;
                nonfinite_at = now;
                end->rank = h->rank;
                end->data_index = h->data_index;
                snprintf(end->detail, sizeof end->detail, "non-finite loss or gradient norm at step %lld (data index %lld)",
                         (long long)h->step + 1, (long long)h->data_index);
            }
        }
        if (fault) break;
        if (nonfinite && !forwarded && now - nonfinite_at > o->grace) { /* the trainer exits by itself; if it does not */
            fault = 1;
            end->kind = END_NONFINITE;
            break;
        }
        /* metrics only once this launch wrote a heartbeat: by then a resume has truncated the redone steps */
        if (!forwarded && !nonfinite && seen_heartbeat && watch_metrics(s, &mw, end)) {
            fault = 1;
            break;
        }
        /* start-up and resume until the first step of this launch, then the hang timeout */
        double timeout = !stepped ? o->start_timeout
                         : o->hang_timeout > 0 ? o->hang_timeout
                                               : supervisor_hang_timeout(s->step_times, s->n_step_times, o->hang_floor, 10);
        if (!forwarded && !nonfinite && now - last_progress > timeout) {
            fault = 1;
            end->kind = END_HANG;
            /* the rank whose heartbeat is oldest is the likeliest culprit */
            double oldest = INFINITY;
            for (int i = 0; i < n; i++)
                if (hb[i].time < oldest) oldest = hb[i].time, end->rank = hb[i].rank;
            snprintf(end->detail, sizeof end->detail, "no heartbeat for %.1f s (%s timeout %.1f s)", now - last_progress,
                     stepped ? "hang" : "start", timeout);
            break;
        }
        if (forwarded && now - forwarded_at > fmax(o->grace, 60)) break; /* stop_job below escalates */
        sleep_seconds(o->poll);
    }
    if (fault && end->kind == END_CRASH) { /* a rank died: the launcher usually ends the job itself within seconds */
        const double until = zy_now_seconds() + fmin(o->grace, 5);
        while (!job_gone(&job) && zy_now_seconds() < until) sleep_seconds(0.05);
    }
    if (!job.exited || !job_gone(&job)) stop_job(s, &job, forwarded ? 0 : o->grace);
    /* classify by what the job left behind */
    int n = read_heartbeats(s, hb, MAX_RANKS);
    int any_stopped = 0, all_done = n > 0, any_nonfinite = 0;
    for (int i = 0; i < n; i++) {
        if (hb[i].step > end->reached) end->reached = hb[i].step;
        any_stopped |= hb[i].state == HB_STOPPED;
        all_done &= hb[i].state == HB_DONE;
        if (hb[i].state == HB_NONFINITE && !any_nonfinite) {
            any_nonfinite = 1;
            if (!nonfinite) {
                end->rank = hb[i].rank;
                end->data_index = hb[i].data_index;
                snprintf(end->detail, sizeof end->detail, "non-finite loss or gradient norm at step %lld (data index %lld)",
                         (long long)hb[i].step + 1, (long long)hb[i].data_index);
            }
        }
    }
    free(hb), free(last_time), free(last_step);
    if (!(fault && end->kind == END_SPIKE)) end->step = end->reached;
    const int st = job.status;
    const int exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    char how[96];
    if (WIFEXITED(st))
        snprintf(how, sizeof how, "exit status %d", exit_code);
    else
        snprintf(how, sizeof how, "killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
    if (forwarded) {
        end->kind = END_PREEMPTED;
        snprintf(end->detail, sizeof end->detail, "stopped on request; the job ended with %s%s", how,
                 any_stopped ? " after saving a checkpoint" : "");
    } else if (fault && !(end->kind == END_CRASH && any_nonfinite)) {
        /* decided while watching: kind and detail are set */
    } else if (any_nonfinite || exit_code == 3) {
        /* also when a rank was seen dead first: after a non-finite step every rank exits, and one that the launcher
         * ended before it wrote "nonfinite" looks like a crash; the batch must still be skipped */
        end->kind = END_NONFINITE;
        if (!any_nonfinite) {
            end->data_index = -1;
            snprintf(end->detail, sizeof end->detail, "the job ended with exit status 3 (non-finite) but left no heartbeat saying where");
        }
    } else if (exit_code == 0 && any_stopped) {
        end->kind = END_STOPPED;
        snprintf(end->detail, sizeof end->detail, "the job stopped (preempted from outside) with a checkpoint at step %lld",
                 (long long)end->step);
    } else if (exit_code == 0) {
        end->kind = END_DONE;
        snprintf(end->detail, sizeof end->detail, "finished at step %lld%s", (long long)end->step,
                 all_done ? "" : " (no rank reported \"done\")");
    } else {
        end->kind = END_CRASH;
        snprintf(end->detail, sizeof end->detail, "the job ended with %s at step %lld", how, (long long)end->step);
    }
    return 0;
}

/* ---- checkpoints ------------------------------------------------------------------------------------------ */

/* Moves a checkpoint directory into ROOT/quarantine/ (out of `latest`'s and keep-pruning's sight). */
static int quarantine(const Sup *s, const char *dir, const char *why, char *moved_to, size_t cap, ZyErr *err) {
    char qdir[RUN_PATH + 64];
    snprintf(qdir, sizeof qdir, "%s/quarantine", s->ckpt_root);
    if (zy_mkdirs(qdir, err)) return -1;
    const char *base = strrchr(dir, '/');
    base = base ? base + 1 : dir;
    for (int k = 0; k < 1000; k++) {
        if (snprintf(moved_to, cap, "%s/%s.%s.%d", qdir, base, why, k) >= (int)cap)
            return zy_fail(err, "%s: path too long", qdir);
        struct stat st;
        if (stat(moved_to, &st) == 0) continue;
        if (rename(dir, moved_to) != 0) return zy_fail(err, "moving %s to %s: %s", dir, moved_to, strerror(errno));
        return 0;
    }
    return zy_fail(err, "%s: too many quarantined copies of %s", qdir, base);
}

static int64_t checkpoint_data_index(const char *dir) {
    char path[4096], *text;
    size_t len;
    ZyErr ignore;
    int64_t r = -1;
    if (zy_path_join(path, sizeof path, dir, "trainer_state.json", &ignore) || zy_read_file(path, &text, &len, &ignore))
        return -1;
    cJSON *o = cJSON_Parse(text);
    free(text);
    const cJSON *di = o ? cJSON_GetObjectItemCaseSensitive(o, "data_index") : NULL;
    const cJSON *st = o ? cJSON_GetObjectItemCaseSensitive(o, "step") : NULL;
    if (cJSON_IsNumber(di))
        r = (int64_t)di->valuedouble;
    else if (cJSON_IsNumber(st))
        r = (int64_t)st->valuedouble;
    cJSON_Delete(o);
    return r;
}

static int64_t step_of_dir(const char *dir) {
    const char *base = strrchr(dir, '/');
    long long step;
    return sscanf(base ? base + 1 : dir, "step-%lld", &step) == 1 ? step : -1;
}

/* The newest checkpoint that verifies (and, for a rollback, was saved before data batch max_data_index + 1);
 * damaged ones and (for a rollback) newer ones go to quarantine; `latest` is pointed at the choice (removed if
 * none). out = "" when there is none. */
static int choose_checkpoint(Sup *s, int64_t max_data_index, char *out, size_t cap, ZyErr *err) {
    out[0] = '\0';
    char(*dirs)[512] = malloc(1024 * sizeof *dirs);
    if (!dirs) return zy_fail(err, "out of memory");
    int n = ckpt_list(s->ckpt_root, dirs, 1024, err);
    if (n < 0) {
        free(dirs);
        return -1;
    }
    int failed = 0;
    for (int i = 0; i < n && !out[0] && !failed; i++) {
        ZyErr why;
        char moved[RUN_PATH + 700], detail[2048];
        const int64_t step = step_of_dir(dirs[i]);
        if (ckpt_verify(dirs[i], &why) != 0) {
            if (quarantine(s, dirs[i], "bad", moved, sizeof moved, err)) {
                failed = 1;
                break;
            }
            snprintf(detail, sizeof detail, "%s", why.msg);
            char action[RUN_PATH + 800];
            snprintf(action, sizeof action, "moved to %s", moved);
            log_event(s, SUP_BAD_CHECKPOINT, -1, step, action, detail, NULL);
            continue;
        }
        int64_t di = max_data_index >= 0 ? checkpoint_data_index(dirs[i]) : -1;
        if (max_data_index >= 0 && (di < 0 || di > max_data_index)) {
            if (quarantine(s, dirs[i], "rolled-back", moved, sizeof moved, err)) {
                failed = 1;
                break;
            }
            say(s, "rollback: %s was saved after data batch %lld; moved to %s", dirs[i], (long long)max_data_index, moved);
            continue;
        }
        snprintf(out, cap, "%s", dirs[i]);
    }
    free(dirs);
    if (failed) return -1;
    char latest[RUN_PATH + 64];
    snprintf(latest, sizeof latest, "%s/latest", s->ckpt_root);
    if (!out[0]) {
        unlink(latest);
        return 0;
    }
    const char *base = strrchr(out, '/');
    char line[128];
    int len = snprintf(line, sizeof line, "%s\n", base ? base + 1 : out);
    return zy_write_file_atomic(latest, line, (size_t)len, err);
}

/* ---- summary ---------------------------------------------------------------------------------------------- */

static void finish_summary(Sup *s) {
    SupervisorSummary *sum = s->sum;
    sum->wall_seconds = zy_now_seconds() - s->t_start;
    char path[RUN_PATH + 64], *text;
    size_t len;
    ZyErr ignore;
    snprintf(path, sizeof path, "%s/metrics.jsonl", s->run_dir);
    if (zy_read_file(path, &text, &len, &ignore) == 0) {
        char *save = NULL;
        for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
            cJSON *o = cJSON_Parse(line);
            const cJSON *kind = o ? cJSON_GetObjectItemCaseSensitive(o, "kind") : NULL;
            const cJSON *secs = o ? cJSON_GetObjectItemCaseSensitive(o, "step_seconds") : NULL;
            if (cJSON_IsString(kind) && strcmp(kind->valuestring, "train") == 0 && cJSON_IsNumber(secs)) {
                sum->productive_seconds += secs->valuedouble;
                sum->final_steps++;
            }
            cJSON_Delete(o);
        }
        free(text);
    }
    sum->goodput = sum->wall_seconds > 0 ? sum->productive_seconds / sum->wall_seconds : 0;
    static const char *const outcome[] = {"done", "stopped", "gave_up"};
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "outcome", outcome[sum->outcome]);
    cJSON_AddNumberToObject(o, "launches", sum->launches);
    cJSON_AddNumberToObject(o, "restarts", sum->restarts);
    cJSON *f = cJSON_AddObjectToObject(o, "faults");
    for (int k = 0; k <= SUP_BAD_CHECKPOINT; k++) cJSON_AddNumberToObject(f, event_names[k], sum->events[k]);
    cJSON_AddNumberToObject(o, "steps_redone", (double)sum->steps_redone);
    cJSON_AddNumberToObject(o, "final_steps", (double)sum->final_steps);
    cJSON_AddNumberToObject(o, "wall_seconds", sum->wall_seconds);
    cJSON_AddNumberToObject(o, "productive_seconds", sum->productive_seconds);
    cJSON_AddNumberToObject(o, "goodput", sum->goodput);
    cJSON *sk = cJSON_AddArrayToObject(o, "skip_windows");
    for (int i = 0; i < s->skips.count; i++) {
        double w[2] = {(double)s->skips.w[i].first, (double)s->skips.w[i].last};
        cJSON_AddItemToArray(sk, cJSON_CreateDoubleArray(w, 2));
    }
    if (sum->reason[0]) cJSON_AddStringToObject(o, "reason", sum->reason);
    char *json = cJSON_Print(o);
    cJSON_Delete(o);
    snprintf(path, sizeof path, "%s/supervisor_summary.json", s->run_dir);
    if (json && zy_write_file_atomic(path, json, strlen(json), &ignore)) say(s, "warning: %s", ignore.msg);
    free(json);
    say(s, "summary: %s after %d launch%s, %d restart%s; faults: %d crash, %d hang, %d nonfinite, %d spike, "
           "%d bad checkpoint; %lld steps redone; wall %.1f s, productive %.1f s, goodput %.1f%% (%s)",
        outcome[sum->outcome], sum->launches, sum->launches == 1 ? "" : "es", sum->restarts, sum->restarts == 1 ? "" : "s",
        sum->events[SUP_CRASH], sum->events[SUP_HANG], sum->events[SUP_NONFINITE], sum->events[SUP_SPIKE],
        sum->events[SUP_BAD_CHECKPOINT], (long long)sum->steps_redone, sum->wall_seconds, sum->productive_seconds,
        100 * sum->goodput, path);
}

/* The command for the next launch: the user's, without any --resume of its own (the supervisor picks the
 * checkpoint), plus --resume-from DIR and every skip window. */
static char **relaunch_argv(const Sup *s, const char *resume_dir, char (*skip_args)[48]) {
    const SupervisorOptions *o = s->o;
    char **argv = calloc((size_t)o->n_command + 3 + 2 * (size_t)s->skips.count, sizeof *argv);
    if (!argv) return NULL;
    int n = 0;
    for (int i = 0; i < o->n_command; i++)
        if (strcmp(o->command[i], "--resume") != 0) argv[n++] = o->command[i];
    if (resume_dir[0]) {
        argv[n++] = "--resume-from";
        argv[n++] = (char *)resume_dir;
    }
    for (int i = 0; i < s->skips.count; i++) {
        snprintf(skip_args[i], 48, "%llu:%llu", (unsigned long long)s->skips.w[i].first,
                 (unsigned long long)s->skips.w[i].last);
        argv[n++] = "--skip-data";
        argv[n++] = skip_args[i];
    }
    return argv;
}

int supervise(const SupervisorOptions *o, SupervisorSummary *sum, ZyErr *err) {
    memset(sum, 0, sizeof *sum);
    if (o->n_command < 1) return zy_fail(err, "no launch command");
    if (o->max_restarts < 0 || o->skip_width < 1 || !(o->poll > 0) || o->grace < 0 || o->backoff < 0)
        return zy_fail(err, "invalid supervisor options");
    Sup *s = calloc(1, sizeof *s);
    if (!s) return zy_fail(err, "out of memory");
    s->o = o;
    s->sum = sum;
    s->t_start = zy_now_seconds();
    heartbeat_host(s->host, sizeof s->host);
    int rc = -1;
    char(*skip_args)[48] = calloc(LOADER_MAX_SKIP_WINDOWS, sizeof *skip_args);
    char *resume_dir = calloc(1, 1024);
    char **argv = NULL;
    if (!skip_args || !resume_dir) {
        zy_fail(err, "out of memory");
        goto done;
    }
    if (snprintf(s->run_dir, sizeof s->run_dir, "%s", o->run_dir) >= (int)sizeof s->run_dir ||
        snprintf(s->ckpt_root, sizeof s->ckpt_root, "%s/checkpoints", o->run_dir) >= (int)sizeof s->ckpt_root) {
        zy_fail(err, "%s: run directory path too long", o->run_dir);
        goto done;
    }
    if (zy_mkdirs(s->run_dir, err)) goto done;
    char path[RUN_PATH + 32];
    snprintf(path, sizeof path, "%s/faults.jsonl", s->run_dir);
    s->faults = fopen(path, "a");
    if (!s->faults) {
        zy_fail(err, "%s: cannot open for appending: %s", path, strerror(errno));
        goto done;
    }
    int first = 1;
    for (;;) {
        free(argv);
        argv = first ? NULL : relaunch_argv(s, resume_dir, skip_args);
        if (first) {
            argv = calloc((size_t)o->n_command + 1, sizeof *argv);
            if (argv) memcpy(argv, o->command, (size_t)o->n_command * sizeof *argv);
        }
        if (!argv) {
            zy_fail(err, "out of memory");
            goto done;
        }
        first = 0;
        if (o->log) {
            fprintf(o->log, "zaya supervise: launch %d:", sum->launches + 1);
            for (char **a = argv; *a; a++) fprintf(o->log, " %s", *a);
            fprintf(o->log, "\n");
            fflush(o->log);
        }
        LaunchEnd end;
        if (run_once(s, argv, &end, err)) goto done;
        if (end.kind == END_DONE) {
            sum->outcome = SUP_OUTCOME_DONE;
            log_event(s, SUP_DONE, -1, end.step, "none: the run finished", end.detail, NULL);
            break;
        }
        if (end.kind == END_PREEMPTED || end.kind == END_STOPPED) {
            sum->outcome = SUP_OUTCOME_STOPPED;
            log_event(s, SUP_PREEMPTED, -1, end.step,
                      end.kind == END_PREEMPTED ? "stopped the job on request; not relaunched"
                                                : "treated as a stop, not a fault; not relaunched",
                      end.detail, NULL);
            break;
        }
        SupEventKind kind = end.kind == END_CRASH ? SUP_CRASH : end.kind == END_HANG ? SUP_HANG
                            : end.kind == END_NONFINITE ? SUP_NONFINITE : SUP_SPIKE;
        const int rollback = (kind == SUP_NONFINITE || kind == SUP_SPIKE) && end.data_index >= 0;
        DataWindow window = {0, 0};
        if (rollback) window = (DataWindow){(uint64_t)end.data_index, (uint64_t)end.data_index + (uint64_t)o->skip_width - 1};
        if (sum->restarts >= o->max_restarts) {
            log_event(s, kind, end.rank, end.step, "none: the restart limit is reached", end.detail, NULL);
            snprintf(sum->reason, sizeof sum->reason, "gave up after %d restart%s (--max-restarts %d); last fault: %s: %.700s",
                     sum->restarts, sum->restarts == 1 ? "" : "s", o->max_restarts, event_names[kind], end.detail);
            log_event(s, SUP_GIVEUP, end.rank, end.step, "exit non-zero", sum->reason, NULL);
            sum->outcome = SUP_OUTCOME_GAVE_UP;
            break;
        }
        char action[256];
        snprintf(action, sizeof action, "stopped the job; %s", rollback ? "roll back and skip the data window" : "resume");
        log_event(s, kind, end.rank, end.step, action, end.detail, rollback ? &window : NULL);
        if (rollback && skip_windows_add(&s->skips, window, err)) goto done;
        if (choose_checkpoint(s, rollback ? end.data_index : -1, resume_dir, 1024, err)) goto done;
        const int64_t resume_step = resume_dir[0] ? step_of_dir(resume_dir) : 0;
        if (end.reached > resume_step) sum->steps_redone += end.reached - resume_step;
        /* back-off: backoff x 2^restarts, capped; a stop request during it ends the run */
        double delay = fmin(o->backoff * pow(2, sum->restarts), o->backoff_max);
        const double until = zy_now_seconds() + delay;
        while (zy_now_seconds() < until && !(o->stop_flag && *o->stop_flag)) sleep_seconds(fmin(0.05, delay));
        if (o->stop_flag && *o->stop_flag) {
            sum->outcome = SUP_OUTCOME_STOPPED;
            log_event(s, SUP_PREEMPTED, -1, end.step, "stop requested while waiting to restart; not relaunched", "", NULL);
            break;
        }
        sum->restarts++;
        char detail[1200];
        snprintf(detail, sizeof detail, "%s after %.1f s back-off", resume_dir[0] ? resume_dir : "from scratch (no checkpoint verifies)",
                 delay);
        log_event(s, SUP_RESTART, -1, resume_step, resume_dir[0] ? "relaunch with --resume-from" : "relaunch from scratch",
                  detail, NULL);
    }
    rc = 0;
done:
    if (rc == 0 || sum->launches > 0) finish_summary(s);
    if (s->faults) fclose(s->faults);
    free(argv);
    free(skip_args);
    free(resume_dir);
    free(s->step_times);
    free(s);
    return rc;
}
