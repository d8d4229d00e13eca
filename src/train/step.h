/* step: what one training step runs on. train.c's train_step does a step's orchestration once — the data, the
 * all-reduces of the loss, routing counts and gradient norm, the non-finite check, the clipping coefficient, the
 * schedule, the balancing controller — and calls a StepBackend for the work itself: the CPU's (step_cpu.c: the
 * model and optimizer in host memory) or a GPU's (step_gpu.c over gpu/gpu_trainer.h, the host copy kept for the
 * checkpoints), as serve/ reaches the GPU through infer/decode.h's DecodeBackend. */
#ifndef ZAYA_TRAIN_STEP_H
#define ZAYA_TRAIN_STEP_H

#include <stddef.h>
#include <stdint.h>

#include "dist/distributed.h"
#include "kernels/matmul.h"
#include "model/model.h"
#include "model/routing.h"
#include "optim/optim.h"
#include "train/loader.h"
#include "util/util.h"

/* The trainer's state a backend works on (all outlive it): the host model (the checkpoint's copy) and this rank's
 * optimizer, the data-parallel group, the ZeRO-1 blocks of the parameter arena [size + 1] and one block of scratch
 * for the reduce-scatter. */
typedef struct {
    Model *model;
    Optimizer *opt;
    const Dist *dist;
    const size_t *zero_bounds;
    float *grad_scratch;
} StepHost;

/* One step is begin, micro per micro-batch, reduce, apply (and biases_changed after the balancing controller moved
 * the host's biases). biases_changed and to_host are NULL where there is nothing to do (the CPU's). */
typedef struct {
    void *ctx;
    /* Sizes the activations for micro-batches [B, T] (a phase boundary). */
    int (*set_shape)(void *ctx, int B, int T, ZyErr *err);
    /* Starts a step: zeroes the gradients. */
    void (*begin)(void *ctx);
    /* Forward + backward of one micro-batch (tokens and targets [B, T], checked), gradients and loss accumulating;
     * the routing decisions are added to routes by the time reduce returns (a GPU copies a step's up at once). */
    int (*micro)(void *ctx, const int32_t *inputs, const int32_t *targets, RoutingCounts *routes, ZyErr *err);
    /* Makes this rank's share of the step's gradient: the mean over n_micro micro-batches, then (several ranks) the
     * ZeRO-1 reduce-scatter and the mean over ranks. *loss = this rank's mean loss, *sumsq = Σ g² over its block
     * (the caller all-reduces both). nan_fault: make the loss and the first gradient NaN (ZAYA_FAULT).
     * *comm_seconds: the time of the exchange with the other ranks (the step's comm_seconds adds it up). */
    int (*reduce)(void *ctx, int n_micro, int nan_fault, double *loss, double *sumsq, double *comm_seconds,
                  ZyErr *err);
    /* Scales this rank's block of the gradient by clip (< 1 clips), runs the optimizer with lr and (several ranks)
     * all-gathers the updated blocks; *comm_seconds as for reduce (0 where the all-gather is not timed apart from
     * the update). */
    int (*apply)(void *ctx, double clip, double lr, double *comm_seconds, ZyErr *err);
    /* The balancing biases of the host model changed. */
    int (*biases_changed)(void *ctx, ZyErr *err);
    /* Mean loss of one batch [B, T] (forward only) into *loss. */
    int (*eval_loss)(void *ctx, const int32_t *inputs, const int32_t *targets, double *loss, ZyErr *err);
    /* Brings the host model and optimizer up to date (before a checkpoint, an evaluation, the end). */
    int (*to_host)(void *ctx, ZyErr *err);
    /* Timing hooks for zaya bench train (training never calls them). sync waits for the queued work (NULL: the
     * work is done when a call returns, the CPU's); set_timing adds each model phase's time into
     * phase_seconds[MODEL_PHASES] from the next micro-batch on (NULL: stop). */
    int (*sync)(void *ctx, ZyErr *err);
    void (*set_timing)(void *ctx, double *phase_seconds);
    void (*free)(void *ctx);
    char note[1024]; /* the event log's line on where the step runs ("" for the CPU) */
} StepBackend;

/* Where a step's micro-batches come from: read puts micro-batch k of the step into inputs and targets [B, T],
 * checked against the model's vocabulary. */
typedef struct {
    void *ctx;
    int (*read)(void *ctx, int k, int32_t *inputs, int32_t *targets, ZyErr *err);
} StepData;

/* Training's data source: the micro-batches of one planned global batch (loader_plan's rows), this rank's share
 * starting at row first_row, each read into window [micro_batch, T + 1] and split into inputs and targets. */
typedef struct {
    Loader *loader;
    const BatchRow *rows;
    int first_row, micro_batch, T;
    int32_t *window;
    const Model *model;
    int64_t step; /* for the error message */
} StepLoaderData;
StepData step_data_loader(StepLoaderData *src);

/* The gradient accumulation of one optimizer step, the same for zaya train and zaya bench train: begin, n_micro
 * micro-batches read from data into inputs/targets and run (their routing decisions added to routes), then
 * reduce (its arguments as StepBackend.reduce's). fwd_bwd_seconds (NULL: not timed) gets the micro-batches'
 * time, the queue drained by be->sync first. */
int step_accumulate(const StepBackend *be, const StepData *data, int n_micro, int32_t *inputs, int32_t *targets,
                    RoutingCounts *routes, int nan_fault, double *loss, double *sumsq, double *comm_seconds,
                    double *fwd_bwd_seconds, ZyErr *err);

/* The CPU backend: the step on h's model and optimizer in host memory; products: what the activations' products
 * compute (kernels/matmul.h). */
int step_backend_cpu(StepBackend *be, const StepHost *h, ZyBf16Products products, ZyErr *err);
/* The GPU backend (gpu/gpu_trainer.h): h's model and optimizer state go to GPU `device` for micro-batches [B, T]
 * (bf16: bf16 products); with several ranks a collective call (how the ranks exchange is decided there). */
int step_backend_gpu(StepBackend *be, const StepHost *h, int device, int bf16, int B, int T, ZyErr *err);
/* The GpuTrainer under a backend made by step_backend_gpu (bench train's device figures). */
struct GpuTrainer *step_backend_gpu_trainer(const StepBackend *be);

#endif
