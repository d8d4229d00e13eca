/* A GPU's StepBackend (step.h): the step's work on the device through gpu/gpu_trainer.h; the host model and
 * optimizer are the checkpoint's copy, brought up to date by to_host. */
#include "train/step.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/gpu_model.h"
#include "gpu/gpu_trainer.h"

typedef struct {
    StepHost h;
    GpuTrainer *gt;
    int host_stale; /* the GPU has updated the weights since the host copy was last brought up to date */
} GpuStep;

static int gpu_set_shape(void *x, int B, int T, ZyErr *err) {
    /* the GPU holds the activations */
    return gpu_trainer_set_shape(((GpuStep *)x)->gt, B, T, err);
}

static void gpu_begin(void *x) { gpu_trainer_begin(((GpuStep *)x)->gt); }

static int gpu_micro(void *x, const int32_t *inputs, const int32_t *targets, RoutingCounts *routes, ZyErr *err) {
    return gpu_trainer_micro(((GpuStep *)x)->gt, inputs, targets, routes, err);
}

static int gpu_reduce(void *x, int n_micro, int nan_fault, double *loss, double *sumsq, double *comm_seconds,
                      ZyErr *err) {
    GpuStep *s = x;
    const double t0 = zy_now_seconds(); /* the exchange waits for the queued backward: the time holds both */
    if (gpu_trainer_reduce(s->gt, s->h.model, s->h.dist, s->h.zero_bounds, s->h.grad_scratch, n_micro, nan_fault,
                           loss, sumsq, err))
        return -1;
    *comm_seconds = zy_now_seconds() - t0;
    return 0;
}

static int gpu_apply(void *x, double clip, double lr, double *comm_seconds, ZyErr *err) {
    GpuStep *s = x;
    *comm_seconds = 0; /* the all-gather is queued with the update */
    if (gpu_trainer_apply(s->gt, s->h.model, s->h.dist, s->h.zero_bounds, clip, lr, err)) return -1;
    s->host_stale = 1;
    return 0;
}

static int gpu_biases_changed(void *x, ZyErr *err) {
    GpuStep *s = x;
    return gpu_trainer_upload_biases(s->gt, s->h.model, err);
}

static int gpu_eval_loss(void *x, const int32_t *inputs, const int32_t *targets, double *loss, ZyErr *err) {
    return gpu_trainer_eval_loss(((GpuStep *)x)->gt, inputs, targets, loss, err);
}

static int gpu_to_host(void *x, ZyErr *err) {
    GpuStep *s = x;
    if (!s->host_stale) return 0;
    if (gpu_trainer_to_host(s->gt, s->h.model, s->h.opt, err)) return -1;
    s->host_stale = 0;
    return 0;
}

static int gpu_step_sync(void *x, ZyErr *err) { return gpu_trainer_sync(((GpuStep *)x)->gt, err); }

static void gpu_step_set_timing(void *x, double *phase_seconds) {
    gpu_model_set_timing(gpu_trainer_model(((GpuStep *)x)->gt), phase_seconds);
}

static void gpu_step_free(void *x) {
    GpuStep *s = x;
    gpu_trainer_free(s->gt);
    free(s);
}

int step_backend_gpu(StepBackend *be, const StepHost *h, int device, int bf16, int B, int T, ZyErr *err) {
    *be = (StepBackend){0};
    GpuStep *s = calloc(1, sizeof *s);
    if (!s) return zy_fail(err, "out of memory");
    s->h = *h;
    if (gpu_trainer_create(&s->gt, h->model, h->opt, h->dist, device, bf16, B, T, err)) {
        free(s);
        return -1;
    }
    *be = (StepBackend){.ctx = s, .set_shape = gpu_set_shape, .begin = gpu_begin, .micro = gpu_micro,
                        .reduce = gpu_reduce, .apply = gpu_apply, .biases_changed = gpu_biases_changed,
                        .eval_loss = gpu_eval_loss, .to_host = gpu_to_host, .sync = gpu_step_sync,
                        .set_timing = gpu_step_set_timing, .free = gpu_step_free};
    snprintf(be->note, sizeof be->note, "device: GPU %s; %s products, fp32 master weights and optimizer state; "
             "collectives: %s", gpu_trainer_device(s->gt), bf16 ? "bf16" : "fp32", gpu_trainer_collectives(s->gt));
    int kernels;
    long replays;
    const char *refused;
    if (gpu_model_graphs(gpu_trainer_model(s->gt), &kernels, &replays, &refused) || refused) { /* ZAYA_GPU_GRAPHS=1 */
        const size_t len = strlen(be->note);
        snprintf(be->note + len, sizeof be->note - len, "; CUDA graphs: %s%s",
                 refused ? "asked for, not used: " : "each micro-batch's forward, loss and backward as one graph",
                 refused ? refused : "");
    }
    return 0;
}

GpuTrainer *step_backend_gpu_trainer(const StepBackend *be) { return ((GpuStep *)be->ctx)->gt; }
