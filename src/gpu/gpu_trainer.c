/* A training step's work on a GPU (gpu_trainer.h). */
#include "gpu/gpu_trainer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/gpu.h"
#include "gpu/gpu_comm.h"
#include "gpu/gpu_model.h"
#include "gpu/gpu_optim.h"

struct GpuTrainer {
    GpuModel *model;
    GpuCtx *g;           /* the model's context */
    GpuOptimizer opt;
    int have_opt;
    const Model *host;   /* the table */
    double *d_sumsq;     /* device double */
    /* every layer's routing statistics ([L, E + 1] counts, [L, 2] sums) of up to ROUTE_SLOTS micro-batches, left on the
     * device until the step's reduce (or a full buffer) copies them up in one wait and adds them in order */
    int32_t *d_route_counts, *route_counts;
    double *d_route_sums, *route_sums;
    int routes_pending;
    RoutingCounts *routes_into;
    int B, T;
    GpuComm *comm;       /* NCCL between the ranks' GPUs; NULL: one rank, or the host-staged MPI path */
    char collectives[200];
};

#define ROUTE_SLOTS 16

static int stage_routing(GpuTrainer *gt, ZyErr *err) { /* sized by the config: once, at create */
    const ZayaConfig *c = &gt->host->cfg;
    const size_t counts = (size_t)ROUTE_SLOTS * c->num_layers * (c->num_experts + 1);
    const size_t sums = (size_t)ROUTE_SLOTS * c->num_layers * 2;
    gt->route_counts = malloc(counts * sizeof(int32_t));
    gt->route_sums = malloc(sums * sizeof(double));
    if (!gt->route_counts || !gt->route_sums) return zy_fail(err, "out of memory");
    if (!(gt->d_route_counts = gpu_alloc(counts * sizeof(int32_t), "routing counts", err)) ||
        !(gt->d_route_sums = gpu_alloc(sums * sizeof(double), "routing sums", err)))
        return -1;
    return 0;
}

/* The pending micro-batches' routing statistics to the host (one wait), added to routes_into in their order: the
 * same sums, in the same order, as when each micro-batch copied its own. */
static int flush_routing(GpuTrainer *gt, ZyErr *err) {
    const ZayaConfig *c = &gt->host->cfg;
    const int L = c->num_layers, E1 = c->num_experts + 1, n = gt->routes_pending;
    if (!n) return 0;
    gt->routes_pending = 0;
    if (gpu_download(gt->g, gt->route_counts, gt->d_route_counts, (size_t)n * L * E1 * sizeof(int32_t), err) ||
        gpu_download(gt->g, gt->route_sums, gt->d_route_sums, (size_t)n * L * 2 * sizeof(double), err))
        return -1;
    RoutingCounts *routes = gt->routes_into;
    for (int k = 0; k < n; k++) {
        const int32_t *counts = gt->route_counts + (size_t)k * L * E1;
        const double *sums = gt->route_sums + (size_t)k * L * 2;
        for (int l = 0; l < L; l++) {
            for (int e = 0; e < E1; e++) routes->counts[(size_t)l * E1 + e] += counts[(size_t)l * E1 + e];
            routes->sums[2 * l] += sums[2 * l];
            routes->sums[2 * l + 1] += sums[2 * l + 1];
        }
    }
    return 0;
}

int gpu_trainer_create(GpuTrainer **out, const Model *m, const Optimizer *opt, const Dist *d, int device, int bf16,
                       int B, int T, ZyErr *err) {
    *out = NULL;
    GpuTrainer *gt = calloc(1, sizeof *gt);
    if (!gt) return zy_fail(err, "out of memory");
    gt->host = m;
    gt->B = B, gt->T = T;
    if (gpu_model_create(&gt->model, m, device, B, T, bf16, 1, err)) goto fail;
    gt->g = gpu_model_ctx(gt->model);
    if (gpu_optim_create_block(&gt->opt, gt->g, &m->params, &opt->cfg, opt->begin, opt->end, err)) goto fail;
    gt->have_opt = 1;
    gt->opt.step = opt->step;
    if (gpu_optim_upload(&gt->opt, gt->g, opt->exp_avg, opt->exp_avg_sq, err)) goto fail;
    /* one rank updates every weight: the update writes the bf16 products' copy as it goes (no rounding pass over the
     * arena each step); with ZeRO-1 the others' blocks arrive in fp32, so the copy is rebuilt whole then */
    if (!(d && d->size > 1)) gt->opt.params16 = gpu_model_params16(gt->model);
    if (!(gt->d_sumsq = gpu_alloc(sizeof(double), "the gradient norm", err))) goto fail;
    if (stage_routing(gt, err)) goto fail;
    snprintf(gt->collectives, sizeof gt->collectives, "none (one rank)");
    if (d && d->size > 1) { /* every rank decides the same way (gpu_comm_decide), so all take the same path */
        int use = 0;
        char why[160];
        if (gpu_comm_decide(d, gt->g, 0, &use, why, sizeof why, err)) goto fail;
        if (use) {
            if (gpu_comm_create(&gt->comm, d, gt->g, err)) goto fail;
            snprintf(gt->collectives, sizeof gt->collectives, "%s on the GPUs (ZeRO-1 blocks: grouped ncclReduce / "
                     "ncclBroadcast)", gpu_comm_describe(gt->comm));
        } else {
            snprintf(gt->collectives, sizeof gt->collectives, "host-staged through MPI (%s)", why);
        }
    }
    *out = gt;
    return 0;
fail:
    gpu_trainer_free(gt);
    return -1;
}

void gpu_trainer_free(GpuTrainer *gt) {
    if (!gt) return;
    gpu_comm_free(gt->comm);
    if (gt->have_opt) gpu_optim_free(&gt->opt);
    gpu_free(gt->d_sumsq), gpu_free(gt->d_route_counts), gpu_free(gt->d_route_sums);
    gpu_model_free(gt->model);
    free(gt->route_counts), free(gt->route_sums);
    free(gt);
}

const char *gpu_trainer_device(const GpuTrainer *gt) { return gpu_model_device(gt->model); }
const char *gpu_trainer_collectives(const GpuTrainer *gt) { return gt->collectives; }

int gpu_trainer_set_shape(GpuTrainer *gt, int B, int T, ZyErr *err) {
    if (gt->B == B && gt->T == T) return 0;
    if (gpu_model_set_shape(gt->model, B, T, err)) return -1;
    gt->B = B, gt->T = T;
    return 0;
}

void gpu_trainer_begin(GpuTrainer *gt) { gpu_model_zero_grads(gt->model); }

int gpu_trainer_micro(GpuTrainer *gt, const int32_t *inputs, const int32_t *targets, RoutingCounts *routes,
                      ZyErr *err) {
    if (gpu_model_train_micro(gt->model, inputs, targets, err)) return -1;
    const ZayaConfig *c = &gt->host->cfg;
    if (!cfg_router_classes(c)) return 0;
    /* summed on the device into this micro-batch's slot (not the rows' choices, gates and probabilities of every
     * layer), copied up by the step's reduce: no wait between micro-batches */
    if (gt->routes_pending && routes != gt->routes_into && flush_routing(gt, err)) return -1;
    if (gt->routes_pending == ROUTE_SLOTS && flush_routing(gt, err)) return -1;
    const size_t k = (size_t)gt->routes_pending++, L = (size_t)c->num_layers;
    gt->routes_into = routes;
    gpu_model_routing_stats(gt->model, gt->d_route_counts + k * L * (c->num_experts + 1), gt->d_route_sums + k * L * 2);
    return 0;
}

int gpu_trainer_reduce(GpuTrainer *gt, Model *host, const Dist *d, const size_t *bounds, float *scratch, int n_micro,
                       int nan_fault, double *loss, double *sumsq, ZyErr *err) {
    GpuCtx *g = gt->g;
    float *grads = gpu_model_grads(gt->model);
    const size_t total = host->params.total;
    if (flush_routing(gt, err) || gpu_model_take_loss(gt->model, loss, err)) return -1;
    *loss /= n_micro;
    if (nan_fault) {
        const float nan = NAN;
        *loss = NAN;
        if (gpu_upload(g, grads, &nan, sizeof nan, err)) return -1;
    }
    if (n_micro > 1) gk_scale(g->stream, grads, 1.0f / n_micro, (long)total);
    if (d->size > 1 && gt->comm) { /* ZeRO-1 reduce-scatter on the devices, then the mean (CPU: grad_scale_owned) */
        const size_t b0 = bounds[d->rank], b1 = bounds[d->rank + 1];
        if (b0 != gt->opt.begin || b1 != gt->opt.end)
            return zy_fail(err, "ZeRO-1 block [%zu, %zu) differs from the GPU optimizer's [%zu, %zu)", b0, b1,
                           gt->opt.begin, gt->opt.end);
        if (gpu_comm_reduce_scatter_f32(gt->comm, grads, bounds, err)) return -1;
        if (b1 > b0) gk_scale(g->stream, grads + b0, (float)(1.0 / d->size), (long)(b1 - b0));
    } else if (d->size > 1) { /* host-staged ZeRO-1 reduce-scatter: ranks sharing a GPU, or ZAYA_NCCL=0 */
        const size_t b0 = bounds[d->rank], b1 = bounds[d->rank + 1];
        if (gpu_model_download_grads(gt->model, host, err) ||
            dist_reduce_scatter_f32(d, host->params.grad, bounds, scratch, err))
            return -1;
        const float mean = (float)(1.0 / d->size); /* × 1/ranks, as the CPU's grad_scale_owned and the NCCL path */
        for (size_t i = b0; i < b1; i++) host->params.grad[i] *= mean;
        if (b1 > b0 && gpu_upload(g, grads + b0, host->params.grad + b0, (b1 - b0) * sizeof(float), err)) return -1;
    }
    gpu_grad_sumsq(&gt->opt, g, grads, gt->d_sumsq);
    /* NCCL: the wait that reports an asynchronous error (a plain one would hang on it); the download then finds the
     * stream done */
    if (gt->comm && gpu_comm_wait(gt->comm, "the reduce-scatter of the ZeRO-1 gradient blocks", err)) return -1;
    return gpu_download(g, sumsq, gt->d_sumsq, sizeof *sumsq, err);
}

int gpu_trainer_apply(GpuTrainer *gt, Model *host, const Dist *d, const size_t *bounds, double clip, double lr,
                      ZyErr *err) {
    GpuCtx *g = gt->g;
    float *params = gpu_model_params(gt->model), *grads = gpu_model_grads(gt->model);
    const size_t b0 = gt->opt.begin, b1 = gt->opt.end;
    /* clipping (clip < 1) happens as the step reads each gradient: no pass of its own over the arena */
    if (gpu_optim_step(&gt->opt, g, &host->params, params, grads, lr, clip < 1.0 ? (float)clip : 1.0f, err)) return -1;
    if (!gt->opt.params16) gpu_model_weights_changed(gt->model); /* else the step wrote the bf16 copy too */
    if (d->size > 1 && gt->comm) { /* every rank gets the others' updated blocks, device to device */
        /* waited for here, not by the next step's first plain stream wait (which would hang on an asynchronous
         * error) */
        if (gpu_comm_allgather_f32(gt->comm, params, bounds, err) ||
            gpu_comm_wait(gt->comm, "the all-gather of the ZeRO-1 parameter blocks", err))
            return -1;
        gpu_model_weights_changed(gt->model);
    } else if (d->size > 1) { /* every rank gets the others' updated blocks, through the host */
        if ((b1 > b0 && gpu_download(g, host->params.data + b0, params + b0, (b1 - b0) * sizeof(float), err)) ||
            dist_allgather_f32(d, host->params.data, bounds, err) || gpu_model_upload(gt->model, host, err))
            return -1;
    }
    return 0;
}

int gpu_trainer_upload_biases(GpuTrainer *gt, const Model *host, ZyErr *err) {
    const ParamTable *t = &host->params;
    for (int i = 0; i < t->count; i++)
        if (t->info[i].kind == PARAM_BUFFER &&
            gpu_model_upload_range(gt->model, host, t->info[i].offset, t->info[i].numel, err))
            return -1;
    return 0;
}

int gpu_trainer_eval_loss(GpuTrainer *gt, const int32_t *inputs, const int32_t *targets, double *loss, ZyErr *err) {
    double pending;
    /* the accumulator may hold a step's losses not taken yet: keep them apart */
    if (gpu_model_take_loss(gt->model, &pending, err)) return -1;
    if (gpu_model_forward(gt->model, inputs, err) || gpu_model_loss(gt->model, targets, err) ||
        gpu_model_take_loss(gt->model, loss, err))
        return -1;
    return 0;
}

int gpu_trainer_to_host(GpuTrainer *gt, Model *m, Optimizer *opt, ZyErr *err) {
    if (gpu_model_download(gt->model, m, err) || gpu_optim_download(&gt->opt, gt->g, opt->exp_avg, opt->exp_avg_sq, err))
        return -1;
    opt->step = gt->opt.step;
    return 0;
}

size_t gpu_trainer_memory_used(GpuTrainer *gt) {
    size_t used = 0, total = 0;
    return gpu_memory_used(gt->g, &used, &total) ? 0 : used;
}

int gpu_trainer_sync(GpuTrainer *gt, ZyErr *err) { return gpu_sync(gt->g, "a training step", err); }

GpuModel *gpu_trainer_model(GpuTrainer *gt) { return gt->model; }
