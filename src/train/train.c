#include "train/train.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "io/checkpoint.h"
#include "model/config.h"
#include "infer/eval.h"
#include "train/faultinject.h"
#include "train/heartbeat.h"
#include "train/loader.h"
#include "kernels/matmul.h"
#include "model/model.h"
#include "io/model_io.h"
#include "io/quant_io.h"
#include "optim/optim.h"
#include "model/routing.h"
#include "train/balancer.h"
#include "train/report.h"
#include "train/runconfig.h"
#include "train/step.h"
#include "io/shards.h"

typedef struct {
    const Dist *dist;      /* never NULL inside the trainer: a group of one when not launched by mpirun */
    Dist solo;
    size_t *zero_bounds;   /* ZeRO-1 blocks of the parameter arena, [size + 1] */
    float *grad_scratch;   /* one block, for the reduce-scatter */
    RunConfig rc;
    char *run_json;
    Model model;
    int have_model;
    Optimizer opt;
    int have_opt;
    Balancer bal;
    int have_bal;
    Loader loader;
    int have_loader;
    ShardSet *val[RUN_MAX_DATASETS];
    StepBackend be;  /* what the step runs on: the CPU, or "device": "cuda" a GPU (the host model and optimizer are
                      * then the checkpoint's copy) */
    int acts_T; /* sequence length the activations and token buffers are sized for (0 = none) */
    BatchRow *rows;
    int32_t *window, *inputs, *targets;
    RoutingCounts routes;        /* this step's (all ranks after the all-reduce) */
    RoutingWindow routes_window; /* since the last routing report */
    float **biases;              /* [L]: each layer's balancing_biases */
    double *entropy;             /* [L]: this step's routing entropy */
    int64_t step;          /* optimizer steps completed */
    int64_t data_index;    /* the next data batch to plan; runs ahead of step by the batches skipped */
    SkipWindows skips;     /* data batches planned but not trained on */
    FaultPlan faults;      /* ZAYA_FAULT (empty unless set) */
    int heartbeat_failed;  /* warned once already */
    char resume_note[2048]; /* how the resume checkpoint was chosen, for the event log */
    double tokens_seen;
    Tokenizer *tokenizer; /* for eval tasks */
    CkptWriter *writer;   /* the checkpoint writer and its snapshot images, reused by every save */
    int pending;          /* a checkpoint is being written in the background */
    char ckpt_root[RUN_PATH + 32];
    Report report;
    int have_report;
    ZyBf16Products products;  /* what the CPU products compute (fp32 unless "precision": "bf16"; pick_bf16_products) */
    char products_note[512];  /* why, for the event log */
} Trainer;

static void trainer_free(Trainer *t) {
    ckpt_writer_free(t->writer); /* an error path may leave a write going: finished locally, without collectives */
    if (t->be.free) t->be.free(t->be.ctx);
    if (t->have_loader) loader_close(&t->loader);
    for (int i = 0; i < RUN_MAX_DATASETS; i++)
        if (t->val[i]) shardset_close(t->val[i]);
    if (t->have_bal) balancer_free(&t->bal);
    if (t->have_opt) optim_free(&t->opt);
    if (t->have_model) model_free(&t->model);
    if (t->have_report) report_close(&t->report);
    tokenizer_free(t->tokenizer);
    free(t->rows), free(t->window), free(t->inputs), free(t->targets);
    routing_counts_free(&t->routes), routing_window_free(&t->routes_window);
    free(t->biases), free(t->entropy);
    free(t->zero_bounds), zy_free(t->grad_scratch);
    free(t->run_json);
}

/* Activations are sized per phase (its sequence length), so allocation happens at phase boundaries only. */
static int ensure_acts(Trainer *t, int T, ZyErr *err) {
    if (t->acts_T == T) return 0;
    t->acts_T = 0;
    if (t->be.set_shape(t->be.ctx, t->rc.micro_batch, T, err)) return -1; /* the backend holds the activations */
    t->acts_T = T;
    free(t->window), free(t->inputs), free(t->targets);
    size_t rows = (size_t)t->rc.micro_batch;
    t->window = malloc(rows * (T + 1) * sizeof(int32_t));
    t->inputs = malloc(rows * T * sizeof(int32_t));
    t->targets = malloc(rows * T * sizeof(int32_t));
    if (!t->window || !t->inputs || !t->targets) return zy_fail(err, "out of memory");
    return 0;
}

/* ---- trainer state (JSON) --------------------------------------------------------------------------------- */

static char *state_to_json(const Trainer *t) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "format", "zaya-trainer-state");
    cJSON_AddNumberToObject(root, "step", (double)t->step);
    cJSON_AddNumberToObject(root, "optimizer_step", (double)t->opt.step);
    cJSON_AddNumberToObject(root, "data_index", (double)t->data_index);
    cJSON *skips = cJSON_AddArrayToObject(root, "skip_windows");
    for (int i = 0; i < t->skips.count; i++) {
        double w[2] = {(double)t->skips.w[i].first, (double)t->skips.w[i].last};
        cJSON_AddItemToArray(skips, cJSON_CreateDoubleArray(w, 2));
    }
    cJSON_AddNumberToObject(root, "tokens_seen", t->tokens_seen);
    cJSON_AddNumberToObject(root, "seed", (double)t->rc.seed);
    cJSON_AddNumberToObject(root, "phase", runconfig_phase_of(&t->rc, t->step));
    cJSON *ld = cJSON_AddObjectToObject(root, "loader");
    for (int d = 0; d < t->loader.n_datasets; d++) {
        cJSON *o = cJSON_AddObjectToObject(ld, t->loader.names[d]);
        cJSON_AddNumberToObject(o, "cursor", (double)t->loader.cursor[d]);
        cJSON_AddNumberToObject(o, "epoch", (double)t->loader.epoch[d]);
    }
    cJSON *b = cJSON_AddObjectToObject(root, "balancer");
    cJSON_AddNumberToObject(b, "step", (double)t->bal.step);
    size_t n = (size_t)t->bal.num_layers * (t->bal.num_experts + 1); /* [L, E+1], skip last */
    cJSON_AddItemToObject(b, "exp_avg", cJSON_CreateDoubleArray(t->bal.exp_avg, (int)n));
    cJSON_AddItemToObject(b, "exp_avg_sq", cJSON_CreateDoubleArray(t->bal.exp_avg_sq, (int)n));
    char *s = cJSON_Print(root);
    cJSON_Delete(root);
    return s;
}

static int number_at(const cJSON *o, const char *key, double *out, const char *label, ZyErr *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(v)) return zy_fail(err, "%s: missing or non-numeric \"%s\"", label, key);
    *out = v->valuedouble;
    return 0;
}

/* A counter (step, cursor, seed, ...): a whole number in [0, 2^53), so the conversion is exact and defined. */
static int count_at(const cJSON *o, const char *key, double *out, const char *label, ZyErr *err) {
    if (number_at(o, key, out, label, err)) return -1;
    if (!(*out >= 0 && *out < 9007199254740992.0) || *out != floor(*out))
        return zy_fail(err, "%s: \"%s\" must be a whole number in [0, 2^53), not %g", label, key, *out);
    return 0;
}

static int state_from_json(Trainer *t, const char *text, const char *label, ZyErr *err) {
    cJSON *root = cJSON_Parse(text);
    if (!root) return zy_fail(err, "%s: invalid JSON", label);
    int rc = -1;
    double d = 0;
    if (count_at(root, "step", &d, label, err)) goto done;
    t->step = (int64_t)d;
    if (count_at(root, "optimizer_step", &d, label, err)) goto done;
    t->opt.step = (int64_t)d;
    /* data_index and skip_windows are absent from checkpoints written before data skipping existed */
    t->data_index = t->step;
    if (cJSON_GetObjectItemCaseSensitive(root, "data_index")) {
        if (count_at(root, "data_index", &d, label, err)) goto done;
        if (d < (double)t->step) {
            zy_fail(err, "%s: data_index %.0f is behind step %lld", label, d, (long long)t->step);
            goto done;
        }
        t->data_index = (int64_t)d;
    }
    const cJSON *skips = cJSON_GetObjectItemCaseSensitive(root, "skip_windows"), *win;
    if (skips && !cJSON_IsArray(skips)) {
        zy_fail(err, "%s: skip_windows must be a list of [first, last] pairs", label);
        goto done;
    }
    cJSON_ArrayForEach(win, skips) {
        const cJSON *a = cJSON_GetArrayItem(win, 0), *b = cJSON_GetArrayItem(win, 1);
        if (!cJSON_IsArray(win) || cJSON_GetArraySize(win) != 2 || !cJSON_IsNumber(a) || !cJSON_IsNumber(b) ||
            a->valuedouble < 0 || b->valuedouble < a->valuedouble || b->valuedouble >= 9007199254740992.0 ||
            a->valuedouble != floor(a->valuedouble) || b->valuedouble != floor(b->valuedouble)) {
            zy_fail(err, "%s: skip_windows must be a list of [first, last] pairs with 0 <= first <= last", label);
            goto done;
        }
        if (skip_windows_add(&t->skips, (DataWindow){(uint64_t)a->valuedouble, (uint64_t)b->valuedouble}, err)) {
            zy_wrap(err, "%s", label);
            goto done;
        }
    }
    if (number_at(root, "tokens_seen", &t->tokens_seen, label, err)) goto done;
    if (count_at(root, "seed", &d, label, err)) goto done;
    if ((uint64_t)d != t->rc.seed) {
        zy_fail(err, "%s: the checkpoint was trained with seed %.0f, the run config says %llu", label, d,
                (unsigned long long)t->rc.seed);
        goto done;
    }
    const cJSON *ld = cJSON_GetObjectItemCaseSensitive(root, "loader");
    for (int i = 0; i < t->loader.n_datasets; i++) {
        const cJSON *o = ld ? cJSON_GetObjectItemCaseSensitive(ld, t->loader.names[i]) : NULL;
        if (!o) {
            zy_fail(err, "%s: no loader state for dataset \"%s\"", label, t->loader.names[i]);
            goto done;
        }
        if (count_at(o, "cursor", &d, label, err)) goto done;
        t->loader.cursor[i] = (uint64_t)d;
        if (count_at(o, "epoch", &d, label, err)) goto done;
        t->loader.epoch[i] = (uint64_t)d;
    }
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(root, "balancer");
    if (!b || count_at(b, "step", &d, label, err)) {
        if (!b) zy_fail(err, "%s: no balancer state", label);
        goto done;
    }
    t->bal.step = (int64_t)d;
    /* [L, E+1] (skip slot last); checkpoints written before the skip expert could be balanced hold [L, E] */
    const int L = t->bal.num_layers, E = t->bal.num_experts, n = L * (E + 1), n_old = L * E;
    const char *keys[2] = {"exp_avg", "exp_avg_sq"};
    double *dst[2] = {t->bal.exp_avg, t->bal.exp_avg_sq};
    for (int k = 0; k < 2; k++) {
        const cJSON *arr = cJSON_GetObjectItemCaseSensitive(b, keys[k]);
        const int size = cJSON_IsArray(arr) ? cJSON_GetArraySize(arr) : -1;
        if (size != n && size != n_old) {
            zy_fail(err, "%s: balancer.%s must be a list of %d numbers", label, keys[k], n);
            goto done;
        }
        const int stride = size == n ? E + 1 : E;
        memset(dst[k], 0, (size_t)n * sizeof(double));
        int i = 0;
        const cJSON *v;
        cJSON_ArrayForEach(v, arr) {
            if (!cJSON_IsNumber(v)) {
                zy_fail(err, "%s: balancer.%s[%d] must be a number", label, keys[k], i);
                goto done;
            }
            dst[k][(size_t)(i / stride) * (E + 1) + i % stride] = v->valuedouble;
            i++;
        }
    }
    rc = 0;
done:
    cJSON_Delete(root);
    return rc;
}

/* ---- validation ------------------------------------------------------------------------------------------- */

/* Mean next-token loss over the first val_batches micro-batches of each dataset's val split (the same
 * windows every time), averaged over the datasets that have one; *out = NAN if none has. */
static int validation_loss(Trainer *t, int T, double *out, ZyErr *err) {
    double sum = 0;
    int n = 0;
    for (int d = 0; d < t->rc.n_datasets; d++) {
        ShardSet *v = t->val[d];
        if (!v) continue;
        uint64_t window = (uint64_t)T + 1, avail = shardset_num_tokens(v) / window;
        int rows = t->rc.micro_batch;
        for (int b = 0; b < t->rc.val_batches; b++) {
            if ((uint64_t)(b + 1) * rows > avail) break;
            for (int r = 0; r < rows; r++)
                if (shardset_read(v, ((uint64_t)b * rows + r) * window, window, t->window + (size_t)r * window, err))
                    return zy_wrap(err, "validation data of \"%s\"", t->rc.dataset_names[d]);
            loader_split_windows(t->window, rows, T, t->inputs, t->targets);
            if (model_check_tokens(&t->model, t->inputs, rows, T, err) ||
                model_check_tokens(&t->model, t->targets, rows, T, err))
                return zy_wrap(err, "validation data of \"%s\"", t->rc.dataset_names[d]);
            double l;
            if (t->be.eval_loss(t->be.ctx, t->inputs, t->targets, &l, err)) return -1;
            sum += l;
            n++;
        }
    }
    *out = n ? sum / n : NAN;
    return 0;
}

/* ---- one optimizer step ----------------------------------------------------------------------------------- */

/* Brings the host model and optimizer up to date with the backend's (before a checkpoint, an evaluation, the end). */
static int sync_host(Trainer *t, ZyErr *err) { return t->be.to_host ? t->be.to_host(t->be.ctx, err) : 0; }

/* One optimizer step on t->be, the same data, order and arithmetic on every backend. Returns 0, -1 (error) or
 * TRAIN_NONFINITE (nothing applied; err says which step and data batch). */
static int train_step(Trainer *t, double *loss_out, double *gnorm_out, double *lr_out, double *comm_out, ZyErr *err) {
    const RunConfig *rc = &t->rc;
    const PhaseConfig *ph = &rc->phases[runconfig_phase_of(rc, t->step)];
    const Dist *d = t->dist;
    const StepBackend *be = &t->be;
    const int T = ph->seq_len, mb = rc->micro_batch, rows_here = rc->batch_size / d->size, n_micro = rows_here / mb;
    const int L = t->model.cfg.num_layers, E = t->model.cfg.num_experts;
    if (ensure_acts(t, T, err)) return -1;
    if (loader_plan(&t->loader, (uint64_t)t->data_index, rc->batch_size, T, ph->mixture, t->rows, err)) return -1;
    /* this rank's share of the global batch: rows [rank·rows_here, (rank+1)·rows_here) */
    StepLoaderData src = {.loader = &t->loader, .rows = t->rows, .first_row = d->rank * rows_here, .micro_batch = mb,
                          .T = T, .window = t->window, .model = &t->model, .step = t->step};
    const StepData data = step_data_loader(&src);
    /* ZAYA_FAULT=nan@S: this rank's loss and gradients */
    const int nan_fault = fault_claim(&t->faults, FAULT_NAN, t->step + 1);
    double loss = 0, sumsq = 0, reduce_s = 0, apply_s = 0;
    if (step_accumulate(be, &data, n_micro, t->inputs, t->targets, &t->routes, nan_fault, &loss, &sumsq, &reduce_s,
                        NULL, err))
        return -1;
    const double t_comm = zy_now_seconds();
    if (d->size > 1) {
        if (dist_allreduce_f64(d, &loss, 1, err) ||
            dist_allreduce_i64(d, t->routes.counts, (size_t)L * (E + 1), err) ||
            dist_allreduce_f64(d, t->routes.sums, (size_t)L * 2, err))
            return -1;
        loss /= d->size;
    }
    if (dist_allreduce_f64(d, &sumsq, 1, err)) return -1;
    const double allreduce_s = zy_now_seconds() - t_comm;
    const double gnorm = sqrt(sumsq);
    if (!isfinite(loss) || !isfinite(gnorm)) { /* every rank sees the same all-reduced values: all stop here */
        zy_fail(err, "non-finite loss (%g) or gradient norm (%g) at step %lld (data index %lld): the update was not applied",
                loss, gnorm, (long long)t->step + 1, (long long)t->data_index);
        *loss_out = loss;
        return TRAIN_NONFINITE;
    }
    const double clip = clip_coefficient(rc->grad_clip, gnorm), lr = schedule_lr(&rc->schedule, t->step);
    if (be->apply(be->ctx, clip, lr, &apply_s, err)) return -1;
    *comm_out = d->size > 1 ? reduce_s + allreduce_s + apply_s : 0; /* the collectives only; one rank has none */
    if (rc->balancing) {
        balancer_update(&t->bal, t->routes.counts, t->biases);
        if (be->biases_changed && be->biases_changed(be->ctx, err)) return -1;
    }
    t->step++;
    t->data_index++;
    t->tokens_seen += (double)rc->batch_size * T;
    *loss_out = loss;
    *gnorm_out = gnorm;
    *lr_out = lr;
    return 0;
}

/* Waits for the checkpoint being written in the background, if any. */
static int finish_pending_save(Trainer *t, ZyErr *err) {
    if (!t->pending) return 0;
    char dir[600];
    double seconds;
    t->pending = 0;
    if (ckpt_wait(t->writer, t->dist, dir, sizeof dir, &seconds, err)) return -1;
    report_event(&t->report, "checkpoint %s published (written in the background in %.2f s, %d rank%s)", dir, seconds,
                 t->dist->size, t->dist->size > 1 ? "s" : "");
    long long step;
    const char *base = strrchr(dir, '/');
    if (sscanf(base ? base + 1 : dir, "step-%lld", &step) == 1 && fault_after_publish(&t->faults, step, dir, err)) return -1;
    return 0;
}

/* Snapshots the state and saves it in the background (rc.ckpt_async), or waits for it (sync, or the last save). */
static int save_checkpoint(Trainer *t, int wait, ZyErr *err) {
    if (finish_pending_save(t, err) || sync_host(t, err)) return -1;
    char *state = state_to_json(t);
    if (!state) return zy_fail(err, "out of memory");
    CheckpointContent c = {.model = &t->model, .optim = &t->opt, .trainer_state_json = state, .run_json = t->run_json};
    double t0 = zy_now_seconds();
    int rc = ckpt_save_async(&t->writer, t->ckpt_root, t->step, &c, t->dist, t->rc.ckpt_keep, err);
    free(state);
    if (rc) return -1;
    t->pending = 1;
    report_event(&t->report, "checkpoint of step %lld: training stalled %.3f s for the snapshot", (long long)t->step,
                 zy_now_seconds() - t0);
    return wait || !t->rc.ckpt_async ? finish_pending_save(t, err) : 0;
}

/* ---- heartbeat and data skipping --------------------------------------------------------------------------- */

static void write_heartbeat(Trainer *t, HeartbeatState state, double loss, double step_seconds) {
    Heartbeat hb = {.rank = t->dist->rank, .world_size = t->dist->size, .pid = (long)getpid(), .step = t->step,
                    .data_index = t->data_index, .loss = loss, .step_seconds = step_seconds,
                    .time = heartbeat_unix_time(), .state = state};
    heartbeat_host(hb.host, sizeof hb.host);
    ZyErr e;
    if (heartbeat_write(t->rc.out_dir, &hb, &e) && !t->heartbeat_failed) { /* liveness only: never fatal */
        fprintf(stderr, "zaya: rank %d: warning: %s (heartbeat not updated)\n", t->dist->rank, e.msg);
        t->heartbeat_failed = 1;
    }
}

/* Plans the batches of the skip window the data index is in (the cursors advance as if they were trained on) and
 * moves past them; logs each window once. */
static int skip_data_windows(Trainer *t, ZyErr *err) {
    if (!skip_windows_contains(&t->skips, (uint64_t)t->data_index)) return 0;
    const RunConfig *rc = &t->rc;
    const PhaseConfig *ph = &rc->phases[runconfig_phase_of(rc, t->step)];
    const int64_t first = t->data_index;
    while (skip_windows_contains(&t->skips, (uint64_t)t->data_index)) {
        if (loader_plan(&t->loader, (uint64_t)t->data_index, rc->batch_size, ph->seq_len, ph->mixture, t->rows, err))
            return -1;
        t->data_index++;
    }
    report_skip(&t->report, t->step + 1, first, t->data_index - 1);
    return 0;
}

/* Rank 0 picks the checkpoint to resume from: --resume-from DIR (must verify), or `latest`, or, when `latest`
 * fails verification, the newest step directory that verifies. */
static int choose_resume_dir(Trainer *t, const TrainOptions *o, char *dir, size_t cap, ZyErr *err) {
    if (o->resume_from) {
        if (snprintf(dir, cap, "%s", o->resume_from) >= (int)cap) return zy_fail(err, "--resume-from: path too long");
        if (ckpt_verify(dir, err)) return zy_wrap(err, "--resume-from %s", o->resume_from);
        snprintf(t->resume_note, sizeof t->resume_note, "resuming from %s (--resume-from, verified)", dir);
        return 0;
    }
    ZyErr first;
    char latest[600] = "";
    if (ckpt_latest(t->ckpt_root, latest, sizeof latest, &first) == 0 && ckpt_verify(latest, &first) == 0) {
        snprintf(dir, cap, "%s", latest);
        snprintf(t->resume_note, sizeof t->resume_note, "resuming from %s (latest, verified)", dir);
        return 0;
    }
    char (*dirs)[512] = malloc(256 * sizeof *dirs);
    if (!dirs) return zy_fail(err, "out of memory");
    int n = ckpt_list(t->ckpt_root, dirs, 256, err);
    int found = -1;
    for (int i = 0; i < n && found < 0; i++) {
        ZyErr why;
        if (strcmp(dirs[i], latest) == 0) continue;
        if (ckpt_verify(dirs[i], &why) == 0)
            found = i;
        else
            fprintf(stderr, "zaya: checkpoint %s fails verification too: %s\n", dirs[i], why.msg);
    }
    if (found < 0) {
        free(dirs);
        if (n < 0) return -1;
        *err = first;
        return n == 0 ? -1 : zy_wrap(err, "no checkpoint under %s verifies", t->ckpt_root);
    }
    snprintf(dir, cap, "%s", dirs[found]);
    free(dirs);
    snprintf(t->resume_note, sizeof t->resume_note, "latest checkpoint unusable (%s); resuming from %s, the newest that verifies",
             first.msg, dir);
    fprintf(stderr, "zaya: %s\n", t->resume_note);
    return 0;
}

/* Rank 0's pick, sent to every rank. first: `latest` or --resume-from as they are (the load verifies them); else, or
 * when there is no `latest`, choose_resume_dir's verified pick. */
typedef struct {
    int64_t failed, verified;
    char dir[600];
    char msg[sizeof ((ZyErr *)0)->msg];
} ResumeChoice;

static int share_resume_choice(Trainer *t, const TrainOptions *o, int first, ResumeChoice *c, ZyErr *err) {
    memset(c, 0, sizeof *c);
    if (t->dist->rank == 0) {
        ZyErr why = {{0}};
        if (first && o->resume_from) {
            if (snprintf(c->dir, sizeof c->dir, "%s", o->resume_from) >= (int)sizeof c->dir)
                c->failed = 1, zy_fail(&why, "--resume-from: path too long");
        } else if (!first || ckpt_latest(t->ckpt_root, c->dir, sizeof c->dir, &why) != 0) {
            c->failed = choose_resume_dir(t, o, c->dir, sizeof c->dir, &why) != 0;
            c->verified = 1;
        }
        if (c->failed) snprintf(c->msg, sizeof c->msg, "%s", why.msg);
    }
    if (dist_bcast(t->dist, c, sizeof *c, 0, err)) return -1;
    return c->failed ? zy_fail(err, "%s", c->msg) : 0;
}

/* ---- set-up ----------------------------------------------------------------------------------------------- */

/* The "bf16_products" a checkpoint's run.json recorded (AUTO if none: an older checkpoint, or an fp32 run). */
static ZyBf16Products recorded_bf16_products(const char *ckpt_dir) {
    char path[700], *text = NULL;
    size_t len;
    ZyErr ignore;
    ZyBf16Products p = ZY_BF16_PRODUCTS_AUTO;
    if (snprintf(path, sizeof path, "%s/run.json", ckpt_dir) >= (int)sizeof path ||
        zy_read_file(path, &text, &len, &ignore))
        return p;
    cJSON *root = cJSON_Parse(text);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "bf16_products");
    if (!cJSON_IsString(v) || zy_bf16_products_parse(v->valuestring, &p, path, &ignore)) p = ZY_BF16_PRODUCTS_AUTO;
    cJSON_Delete(root);
    free(text);
    return p;
}

/* "precision": "bf16" on a CPU: which products the run computes (kernels/matmul.h). Rank 0 decides — the config's
 * value; on a resume the checkpoint's recorded one, so the products (and the run) continue bit for bit; else the
 * CPU's own answer, timed where it must be — and every rank takes its decision. The concrete value goes into the
 * effective run config, which every checkpoint stores as run.json. */
static int pick_bf16_products(Trainer *t, const char *ckpt_dir, ZyErr *err) {
    const RunConfig *rc = &t->rc;
    struct {
        int64_t failed, pick;
        char note[sizeof t->products_note];
    } dec;
    memset(&dec, 0, sizeof dec);
    if (t->dist->rank == 0) {
        const ZyBf16Products recorded = ckpt_dir && rc->bf16_products == ZY_BF16_PRODUCTS_AUTO
                                            ? recorded_bf16_products(ckpt_dir) : ZY_BF16_PRODUCTS_AUTO;
        char why[300] = "";
        ZyBf16Products pick = rc->bf16_products;
        /* where the CPU leaves it open, timed on the experts' gate/up product, the largest of a step */
        const ZayaConfig *c = &t->model.cfg;
        const int T = rc->phases[runconfig_phase_of(rc, t->step)].seq_len;
        const int M = rc->micro_batch * T / (c->num_experts > 0 ? c->num_experts : 1), N = 2 * c->moe_intermediate_size;
        if (recorded != ZY_BF16_PRODUCTS_AUTO && zy_bf16_products_available(recorded, why, sizeof why)) {
            pick = recorded;
            snprintf(why, sizeof why, "as %s/run.json recorded (a resume computes the same products)", ckpt_dir);
        } else if (recorded != ZY_BF16_PRODUCTS_AUTO) {
            char auto_why[300];
            pick = zy_bf16_products_resolve(ZY_BF16_PRODUCTS_AUTO, M, N, c->hidden_size, auto_why, sizeof auto_why);
            snprintf(dec.note, sizeof dec.note, "%s/run.json recorded bf16 products \"%s\", which cannot run here "
                     "(%s): resumed with \"%s\", so this resume is not bit-exact", ckpt_dir,
                     zy_bf16_products_name(recorded), why, zy_bf16_products_name(pick));
            fprintf(stderr, "zaya: %s\n", dec.note);
            why[0] = 0;
        } else if (pick != ZY_BF16_PRODUCTS_AUTO) {
            if (!zy_bf16_products_available(pick, why, sizeof why)) {
                dec.failed = 1;
                snprintf(dec.note, sizeof dec.note, "key \"bf16_products\": \"%s\" cannot run here: %s",
                         zy_bf16_products_name(pick), why);
            }
            snprintf(why, sizeof why, "as the run config asks");
        } else {
            pick = zy_bf16_products_resolve(ZY_BF16_PRODUCTS_AUTO, M, N, c->hidden_size, why, sizeof why);
        }
        dec.pick = pick;
        if (!dec.failed && why[0]) {
            char backend[256];
            zy_gemm_bf16_backend(pick, backend, sizeof backend);
            snprintf(dec.note, sizeof dec.note, "precision bf16 on this CPU: %s products, %s (%s)",
                     zy_bf16_products_name(pick), backend, why);
        }
    }
    if (dist_bcast(t->dist, &dec, sizeof dec, 0, err)) return -1;
    if (dec.failed) return zy_fail(err, "%s", dec.note);
    t->products = (ZyBf16Products)dec.pick;
    snprintf(t->products_note, sizeof t->products_note, "%s", dec.note);
    cJSON *root = cJSON_Parse(t->run_json);
    if (!root) return zy_fail(err, "out of memory");
    cJSON_DeleteItemFromObjectCaseSensitive(root, "bf16_products");
    cJSON_AddStringToObject(root, "bf16_products", zy_bf16_products_name(t->products));
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    if (!text) return zy_fail(err, "out of memory");
    free(t->run_json);
    t->run_json = text;
    return 0;
}

static int trainer_open(Trainer *t, const TrainOptions *o, ZyErr *err) {
    RunConfig *rc = &t->rc;
    t->solo = (Dist){.rank = 0, .size = 1};
    t->dist = o->dist ? o->dist : &t->solo;
    const Dist *d = t->dist;
    if (runconfig_load(rc, o->run_path, o->overrides, o->n_overrides, &t->run_json, err)) return -1;
    /* every rank must run the same config: compare a checksum of the effective run config with rank 0's */
    int64_t crc = (int64_t)zy_crc32(0, t->run_json, strlen(t->run_json)), crc0 = crc;
    if (dist_bcast(d, &crc0, sizeof crc0, 0, err)) return -1;
    int64_t mismatch = crc != crc0;
    if (dist_allreduce_max_i64(d, &mismatch, 1, err)) return -1;
    if (mismatch) return zy_fail(err, "%s: the run config differs between ranks (rank %d's differs from rank 0's)", o->run_path, d->rank);
    if (rc->batch_size % (d->size * rc->micro_batch) != 0)
        return zy_fail(err, "%s: batch_size (%d) must be a multiple of ranks x micro_batch (%d x %d)", o->run_path,
                       rc->batch_size, d->size, rc->micro_batch);
    if (snprintf(t->ckpt_root, sizeof t->ckpt_root, "%s/checkpoints", rc->out_dir) >= (int)sizeof t->ckpt_root)
        return zy_fail(err, "out_dir too long");
    if (zy_mkdirs(rc->out_dir, err)) return -1;
    /* model */
    if (rc->init_from[0]) {
        if (quant_dir_refuse(rc->init_from, "train", err) || model_load_dir(&t->model, rc->init_from, err)) return -1;
    } else {
        ZayaConfig cfg;
        if (config_load(&cfg, rc->model_config, err)) return -1;
        if (cfg.quant_bits)
            return zy_fail(err, "train: %s asks for %d-bit quantized weights (\"quantization\"): training needs bf16 or "
                           "fp32 weights", rc->model_config, cfg.quant_bits);
        if (model_create(&t->model, &cfg, err)) return -1;
        model_init_weights(&t->model, rc->seed);
    }
    t->have_model = 1;
    const ZayaConfig *c = &t->model.cfg;
    for (int i = 0; i < rc->n_phases; i++)
        if (rc->phases[i].seq_len > c->max_position_embeddings)
            return zy_fail(err, "%s: phase \"%s\" seq_len %d exceeds the model's max_position_embeddings %d",
                           o->run_path, rc->phases[i].name, rc->phases[i].seq_len, c->max_position_embeddings);
    /* ZeRO-1: this rank updates (and keeps optimizer state for) one contiguous block of whole tensors */
    t->zero_bounds = calloc((size_t)d->size + 1, sizeof *t->zero_bounds);
    if (!t->zero_bounds) return zy_fail(err, "out of memory");
    zero1_partition(&t->model.params, d->size, t->zero_bounds);
    size_t max_block = 0;
    for (int r = 0; r < d->size; r++)
        if (t->zero_bounds[r + 1] - t->zero_bounds[r] > max_block) max_block = t->zero_bounds[r + 1] - t->zero_bounds[r];
    t->grad_scratch = zy_calloc((max_block ? max_block : 1) * sizeof(float));
    if (!t->grad_scratch) return zy_fail(err, "out of memory");
    if (optim_create_block(&t->opt, &t->model.params, &rc->optim, t->zero_bounds[d->rank], t->zero_bounds[d->rank + 1],
                           err))
        return -1;
    t->have_opt = 1;
    /* a model without the skip expert has no skip bias to drive */
    const double skip_rate = c->moe == ZY_MOE_SKIP ? rc->skip_rate : -1;
    if (balancer_create(&t->bal, c->num_layers, c->num_experts, rc->balancing_lr, skip_rate, err)) return -1;
    t->have_bal = 1;
    /* data */
    const char *names[RUN_MAX_DATASETS], *dirs[RUN_MAX_DATASETS];
    for (int i = 0; i < rc->n_datasets; i++) names[i] = rc->dataset_names[i], dirs[i] = rc->dataset_dirs[i];
    if (loader_open(&t->loader, rc->n_datasets, names, dirs, rc->seed, 1, err)) return -1;
    t->have_loader = 1;
    for (int i = 0; i < rc->n_datasets; i++) {
        if (shardset_vocab_size(t->loader.train[i]) > c->vocab_size)
            return zy_fail(err, "dataset \"%s\": token vocabulary %d is larger than the model's vocab_size %d", names[i],
                           shardset_vocab_size(t->loader.train[i]), c->vocab_size);
        ZyErr ignore;
        if (shardset_open(&t->val[i], dirs[i], "val", 1, &ignore) != 0 || shardset_num_tokens(t->val[i]) == 0) {
            if (t->val[i]) shardset_close(t->val[i]);
            t->val[i] = NULL; /* no val split: validation skips this dataset */
        }
    }
    if (rc->n_tasks > 0) {
        if (tokenizer_load(rc->tokenizer, &t->tokenizer, err)) return -1;
        if (tokenizer_vocab_size(t->tokenizer) > c->vocab_size)
            return zy_fail(err, "%s: tokenizer vocabulary %d is larger than the model's vocab_size %d", rc->tokenizer,
                           tokenizer_vocab_size(t->tokenizer), c->vocab_size);
    }
    t->rows = calloc((size_t)rc->batch_size, sizeof *t->rows);
    t->biases = calloc((size_t)c->num_layers, sizeof *t->biases);
    t->entropy = calloc((size_t)c->num_layers, sizeof *t->entropy);
    if (!t->rows || !t->biases || !t->entropy) return zy_fail(err, "out of memory");
    for (int l = 0; l < c->num_layers; l++) t->biases[l] = t->model.w.layers[l].balancing_bias;
    if (routing_counts_create(&t->routes, c->num_layers, c->num_experts, err) ||
        routing_window_create(&t->routes_window, c->num_layers, c->num_experts, err))
        return -1;
    if (fault_plan_from_env(&t->faults, rc->out_dir, d->rank, err)) return -1;
    for (int i = 0; i < o->n_skip_windows; i++)
        if (skip_windows_add(&t->skips, o->skip_windows[i], err)) return zy_wrap(err, "--skip-data");
    /* resume: rank 0 chooses the checkpoint, every rank loads it */
    if (o->resume || o->resume_from) {
        ResumeChoice choice;
        char *state = NULL;
        /* at once `latest` (or --resume-from): the load checks every byte against the manifest as it reads it */
        if (share_resume_choice(t, o, 1, &choice, err)) return -1;
        int loaded = ckpt_load(choice.dir, &t->model, &t->opt, &state, d, err) == 0;
        if (!loaded && o->resume_from) return zy_wrap(err, "--resume-from %s", o->resume_from);
        if (!loaded && !choice.verified) { /* `latest` failed: the newest checkpoint that verifies (and a note why) */
            if (share_resume_choice(t, o, 0, &choice, err)) return -1;
            loaded = ckpt_load(choice.dir, &t->model, &t->opt, &state, d, err) == 0;
        }
        if (!loaded) return -1;
        if (!t->resume_note[0])
            snprintf(t->resume_note, sizeof t->resume_note, "resuming from %s (%s, verified)", choice.dir,
                     o->resume_from ? "--resume-from" : "latest");
        int r = state_from_json(t, state, choice.dir, err);
        free(state);
        if (r) return -1;
        if (d->rank == 0) fprintf(stderr, "resumed from %s at step %lld\n", choice.dir, (long long)t->step);
        if (rc->bf16 && !rc->gpu && pick_bf16_products(t, choice.dir, err)) return zy_wrap(err, "%s", o->run_path);
    } else if (rc->bf16 && !rc->gpu && pick_bf16_products(t, NULL, err)) {
        return zy_wrap(err, "%s", o->run_path);
    }
    optim_set_bf16(&t->opt, t->products);
    const StepHost host = {.model = &t->model, .opt = &t->opt, .dist = d, .zero_bounds = t->zero_bounds,
                           .grad_scratch = t->grad_scratch};
    if (rc->gpu) { /* the model and optimizer state (fresh or resumed) go to the GPU; the step runs there */
        const int T = rc->phases[runconfig_phase_of(rc, t->step)].seq_len;
        if (step_backend_gpu(&t->be, &host, rc->gpu_index, rc->bf16, rc->micro_batch, T, err))
            return zy_wrap(err, "%s: \"device\": \"cuda\"", o->run_path);
    } else if (step_backend_cpu(&t->be, &host, t->products, err)) {
        return -1;
    }
    /* the checkpoint images, allocated and faulted in now rather than in the first checkpoint's stall */
    return ckpt_writer_prepare(&t->writer, &t->model, &t->opt, d, err);
}

int train_run(const TrainOptions *o, ZyErr *err) {
    Trainer t;
    memset(&t, 0, sizeof t);
    int rc = -1;
    if (trainer_open(&t, o, err)) goto done;
    const RunConfig *r = &t.rc;
    const ZayaConfig *c = &t.model.cfg;
    double peak = zy_sgemm_probe_gflops(512, 0.3);
    const int lead = t.dist->rank == 0; /* rank 0 reports, validates, evaluates and writes the final model */
    const int resumed = o->resume || o->resume_from;
    if (lead) {
        if (report_open(&t.report, r, c, peak, resumed ? t.step : -1, o->quiet, err)) goto done;
        t.have_report = 1;
    } else {
        memset(&t.report, 0, sizeof t.report); /* disabled */
    }
    report_event(&t.report, "model: %zu parameters (%zu trainable); %lld steps in %d phases; sgemm peak %.1f GFLOP/s; "
                 "%d data-parallel rank%s (ZeRO-1: %.1f%% of the optimizer state on rank 0)",
                 params_count(&t.model.params, 0), params_count(&t.model.params, 1), (long long)r->total_steps,
                 r->n_phases, peak, t.dist->size, t.dist->size > 1 ? "s" : "",
                 100.0 * (double)(t.zero_bounds[1] - t.zero_bounds[0]) / (double)t.model.params.total);
    if (t.resume_note[0]) report_event(&t.report, "%s", t.resume_note);
    if (t.products_note[0]) report_event(&t.report, "%s", t.products_note);
    if (t.be.note[0]) report_event(&t.report, "%s", t.be.note);
    if (t.skips.count) {
        char list[600] = "";
        for (int i = 0; i < t.skips.count && strlen(list) < sizeof list - 48; i++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%llu:%llu", i ? ", " : "",
                     (unsigned long long)t.skips.w[i].first, (unsigned long long)t.skips.w[i].last);
        report_event(&t.report, "data skip windows (batches planned but not trained on): %s", list);
    }
    write_heartbeat(&t, HB_STARTING, NAN, 0); /* after the resume, so the supervisor sees where it restarts */
    int64_t end = r->total_steps;
    if (o->stop_after > 0 && o->stop_after < end) end = o->stop_after;
    const double t_start = zy_now_seconds(), tokens_at_start = t.tokens_seen;
    const int64_t step_at_start = t.step;
    while (t.step < end) {
        int phase = runconfig_phase_of(r, t.step);
        double loss = 0, gnorm = 0, lr = 0, comm = 0;
        if (skip_data_windows(&t, err)) goto done;
        const int64_t data_index = t.data_index;
        double t0 = zy_now_seconds();
        int step_rc = train_step(&t, &loss, &gnorm, &lr, &comm, err);
        if (step_rc == TRAIN_NONFINITE) {
            ZyErr nonfinite = *err;
            write_heartbeat(&t, HB_NONFINITE, loss, zy_now_seconds() - t0);
            report_event(&t.report, "%s", nonfinite.msg);
            if (finish_pending_save(&t, err)) goto done; /* a checkpoint being written is still good: publish it */
            *err = nonfinite;
            rc = TRAIN_NONFINITE;
            goto done;
        }
        if (step_rc) goto done;
        double now = zy_now_seconds();
        const int T = r->phases[phase].seq_len;
        double step_tokens = (double)r->batch_size * T;
        double *entropy = t.entropy;
        for (int l = 0; l < c->num_layers; l++)
            entropy[l] = routing_entropy(t.routes.counts + (size_t)l * (c->num_experts + 1), c->num_experts);
        StepMetrics m = {.step = t.step, .phase = phase, .loss = loss, .lr = lr, .grad_norm = gnorm,
                         .tokens_seen = t.tokens_seen, .step_seconds = now - t0, .step_tokens = step_tokens,
                         .seq_len = T, .entropy = entropy, .n_layers = c->num_layers,
                         .elapsed = now - t_start, .tokens_run = t.tokens_seen - tokens_at_start,
                         .steps_run = t.step - step_at_start, .end_step = end,
                         .scatter = loader_scatter_factor(&t.loader), .comm_seconds = comm,
                         .data_index = data_index};
        int last = t.step == end;
        routing_window_add_step(&t.routes_window, &t.routes);
        if (t.step % r->log_interval == 0 || last) { /* before the progress line, which summarises it */
            if (cfg_router_classes(&t.model.cfg))
                report_routing(&t.report, t.step, phase, &t.routes_window, (const float *const *)t.biases,
                               cfg_router_classes(&t.model.cfg));
            routing_window_reset(&t.routes_window);
        }
        report_step(&t.report, &m);
        write_heartbeat(&t, HB_RUNNING, loss, now - t0);
        if (lead && r->eval_interval > 0 && (t.step % r->eval_interval == 0 || last)) {
            double vl = NAN;
            if (validation_loss(&t, T, &vl, err)) goto done;
            if (!isnan(vl)) report_eval(&t.report, t.step, phase, "val_loss", vl);
            if (r->n_tasks && sync_host(&t, err)) goto done;
            for (int k = 0; k < r->n_tasks; k++) {
                EvalResult res;
                if (eval_task_file(&t.model, t.tokenizer, r->tasks[k], r->eval_limit, &res, err)) goto done;
                char name[160];
                snprintf(name, sizeof name, "%s/%s", res.name, res.type == EVAL_TASK_MC ? "acc" : "exact_match");
                report_eval(&t.report, t.step, phase, name, res.type == EVAL_TASK_MC ? res.acc : res.exact_match);
            }
        }
        int64_t stopping = o->stop_flag && *o->stop_flag; /* a signal may reach one rank only: all stop together */
        if (dist_allreduce_max_i64(t.dist, &stopping, 1, err)) goto done;
        if ((r->ckpt_interval > 0 && t.step % r->ckpt_interval == 0) || last || stopping) {
            if (save_checkpoint(&t, last || stopping, err)) goto done;
            write_heartbeat(&t, HB_RUNNING, loss, now - t0); /* still alive after a (possibly long) save */
        }
        if (stopping) {
            report_event(&t.report, "stop requested: checkpoint saved at step %lld; resume with --resume", (long long)t.step);
            break;
        }
        fault_after_step(&t.faults, t.step); /* ZAYA_FAULT crash/hang: after the step and its checkpoint started */
    }
    if (finish_pending_save(&t, err) || sync_host(&t, err)) goto done;
    if (lead && t.step >= r->total_steps) {
        char final_dir[RUN_PATH + 16];
        snprintf(final_dir, sizeof final_dir, "%s/final", r->out_dir);
        if (model_save_dir(&t.model, final_dir, ZY_DT_F32, err)) goto done;
        report_event(&t.report, "final model: %s", final_dir);
        write_heartbeat(&t, HB_RUNNING, NAN, 0); /* alive: the plots come next */
    }
    report_event(&t.report, "trained %lld steps in %.1f s; loader scatter factor %.3f", (long long)(t.step - step_at_start),
                 zy_now_seconds() - t_start, loader_scatter_factor(&t.loader));
    ZyErr plot_err;
    if (!lead)
        ;
    else if (report_plot(r->out_dir, r, &plot_err))
        report_event(&t.report, "plots skipped: %s", plot_err.msg);
    else
        report_event(&t.report, "plots: %s/loss.png, %s/routing.png%s%s%s", r->out_dir, r->out_dir,
                     r->n_tasks ? ", " : "", r->n_tasks ? r->out_dir : "", r->n_tasks ? "/eval_tasks.png" : "");
    write_heartbeat(&t, t.step >= r->total_steps ? HB_DONE : HB_STOPPED, NAN, 0);
    rc = 0;
done:
    trainer_free(&t);
    return rc;
}
