/* gpu_trainer: a training step's work on a GPU for train/step_gpu.c (the GPU's step backend) — the model
 * (gpu_model.h) and the optimizer (gpu_optim.h) on the device, the host Model and Optimizer kept as the
 * checkpointable copy (synchronised at checkpoints, evaluations and the end), so checkpoints have the CPU format and
 * a run moves between CPU and GPU.
 *
 * One step: micro-batches (forward + backward, gradients accumulating on the device), then gpu_trainer_reduce (the
 * mean over micro-batches and, with several ranks, the ZeRO-1 reduce-scatter), gpu_trainer_apply (clipping and
 * the optimizer update on the device; with several ranks the updated blocks are all-gathered). With several ranks
 * the exchange runs over NCCL on the devices (gpu_comm.h) when every rank has its own GPU and ZAYA_NCCL is not 0,
 * else host-staged: device -> host, MPI, host -> device (ranks sharing a GPU, builds without NCCL).
 * Host waits per step: the routing statistics of the step's micro-batches, copied up together at the reduce (for the
 * balancing controller and the routing report), each MoE layer's expert offsets in fp32 runs, and the loss and
 * gradient norm that the step prints. */
#ifndef ZAYA_GPU_TRAINER_H
#define ZAYA_GPU_TRAINER_H

#include <stdint.h>

#include "dist/distributed.h"
#include "model/model.h"
#include "optim/optim.h"
#include "model/routing.h"
#include "util/util.h"

typedef struct GpuTrainer GpuTrainer;

/* Uploads m's parameters and opt's state (its owned block and step), for micro-batches [B, T]. d (NULL: one rank):
 * with several ranks, a collective call that chooses NCCL or the host-staged path (gpu_comm_decide; ZAYA_NCCL=1 on
 * ranks sharing a GPU is an error) and sets up the NCCL communicator. */
int gpu_trainer_create(GpuTrainer **out, const Model *m, const Optimizer *opt, const Dist *d, int device, int bf16,
                       int B, int T, ZyErr *err);
void gpu_trainer_free(GpuTrainer *gt);
const char *gpu_trainer_device(const GpuTrainer *gt);
/* How the ranks exchange gradients and parameters: "none (one rank)", "NCCL 2.28.9, 2 ranks on the GPUs (...)" or
 * "host-staged through MPI (why)". */
const char *gpu_trainer_collectives(const GpuTrainer *gt);
int gpu_trainer_set_shape(GpuTrainer *gt, int B, int T, ZyErr *err);

/* Starts a step: zeroes the gradients. */
void gpu_trainer_begin(GpuTrainer *gt);
/* Forward + backward of one micro-batch (host tokens and targets [B, T], checked), queued without a wait; the routing
 * decisions are added to routes (host) by gpu_trainer_reduce (every micro-batch of a step passes the same routes). */
int gpu_trainer_micro(GpuTrainer *gt, const int32_t *inputs, const int32_t *targets, RoutingCounts *routes,
                      ZyErr *err);
/* Makes the step's gradient: the mean over n_micro micro-batches, then (d->size > 1) summed over ranks into this
 * rank's ZeRO-1 block [begin, end) (NCCL on the devices, or through host memory) and divided by the ranks. *loss = the step's mean loss on
 * this rank (the caller all-reduces it); *sumsq = Σ g² over the owned block (the caller all-reduces it). host: the
 * host Model whose gradient arena stages the reduction. nan_fault: make the first gradient NaN (ZAYA_FAULT). */
int gpu_trainer_reduce(GpuTrainer *gt, Model *host, const Dist *d, const size_t *bounds, float *scratch, int n_micro,
                       int nan_fault, double *loss, double *sumsq, ZyErr *err);
/* Scales the gradients by clip (< 1 clips), runs the optimizer with lr, and (d->size > 1) all-gathers the updated
 * blocks (NCCL on the devices, or through host memory). */
int gpu_trainer_apply(GpuTrainer *gt, Model *host, const Dist *d, const size_t *bounds, double clip, double lr,
                      ZyErr *err);
/* The balancing biases the host controller updated go to the device. */
int gpu_trainer_upload_biases(GpuTrainer *gt, const Model *host, ZyErr *err);
/* Mean loss of one batch (forward only) into *loss. */
int gpu_trainer_eval_loss(GpuTrainer *gt, const int32_t *inputs, const int32_t *targets, double *loss, ZyErr *err);
/* Device → host: the parameters (whole arena) and the optimizer's state and step (its block), so the host Model and
 * Optimizer are what a checkpoint writes. */
int gpu_trainer_to_host(GpuTrainer *gt, Model *m, Optimizer *opt, ZyErr *err);
/* Device memory in use on the GPU (bytes; all processes). */
size_t gpu_trainer_memory_used(GpuTrainer *gt);
/* Waits for the GPU's queued work (timing); reports a fault. */
int gpu_trainer_sync(GpuTrainer *gt, ZyErr *err);
/* The model on this GPU (forward, loss, logits), e.g. for evaluation. */
struct GpuModel *gpu_trainer_model(GpuTrainer *gt);

#endif
