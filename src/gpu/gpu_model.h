/* gpu_model: the ZAYA1 model on a GPU — the same parameter layout, activations and maths as src/model/model.c, every op
 * a gk_ kernel or a cuBLASLt product. The host Model keeps the table (names, shapes, offsets) and is the copy that
 * checkpoints read and write; the GPU holds its own parameter and gradient arenas with the same layout, so moving a
 * run between CPU and GPU is a copy of one arena. */
#ifndef ZAYA_GPU_MODEL_H
#define ZAYA_GPU_MODEL_H

#include <stdint.h>

#include "model/model.h"
#include "util/util.h"

typedef struct GpuModel GpuModel;

/* Opens the GPU (device -1: the rank-local choice, gpu.h), allocates parameters (uploaded from m: its fp32 arena in
 * one copy, or tensor by tensor from where m holds them, bf16 matrices widened on the device: gpu_weight_upload.h;
 * training needs the fp32 arena), gradients when
 * `train`, and activations for batches [B, T]. bf16: the products take bf16 operands with fp32 accumulation (the
 * weights' bf16 copies are refreshed by gpu_model_weights_changed); 0: fp32 throughout (no TF32). Errors: no GPU
 * support built in (gpu_none.c), no device, out of GPU memory (naming the size). */
int gpu_model_create(GpuModel **out, const Model *m, int device, int B, int T, int bf16, int train, ZyErr *err);
void gpu_model_free(GpuModel *gm);
/* Human-readable device line ("NVIDIA H100 80GB HBM3, sm_90, 132 SMs, 79.1 GiB"). */
const char *gpu_model_device(const GpuModel *gm);

/* Parameters host <-> device (the whole arena; waits). Upload marks the bf16 copies stale. */
int gpu_model_upload(GpuModel *gm, const Model *m, ZyErr *err);
int gpu_model_download(GpuModel *gm, Model *m, ZyErr *err);
/* Gradients device -> host arena m->params.grad (tests, host-staged reductions). */
int gpu_model_download_grads(GpuModel *gm, Model *m, ZyErr *err);
int gpu_model_upload_grads(GpuModel *gm, const Model *m, ZyErr *err);
/* Uploads the tensors [first, last] of the table (e.g. the balancing biases the host controller updated). */
int gpu_model_upload_range(GpuModel *gm, const Model *m, size_t offset, size_t count, ZyErr *err);
/* The parameters changed on the device (an optimizer step): bf16 copies are rebuilt before the next product. */
void gpu_model_weights_changed(GpuModel *gm);

/* Forward for host tokens [B, T] (checked by the caller, model_check_tokens); logits stay on the device. */
int gpu_model_forward(GpuModel *gm, const int32_t *tokens, ZyErr *err);
/* Backward of the mean cross-entropy against host targets [B, T] (-1 = ignored) after gpu_model_forward;
 * ACCUMULATES the gradients; the loss is added to a device accumulator (gpu_model_take_loss). No host sync. */
int gpu_model_backward(GpuModel *gm, const int32_t *targets, ZyErr *err);
/* A training micro-batch: gpu_model_forward then gpu_model_backward for host tokens and targets [B, T], the same bits.
 * With ZAYA_GPU_GRAPHS=1 (read at create) their launches are captured as one CUDA graph at the first micro-batch of
 * a shape and replayed by the later ones, where they can be (bf16 runs with grouped experts, no phase timing, the own
 * attention kernels); elsewhere, or where a capture is refused, they run as launches. */
int gpu_model_train_micro(GpuModel *gm, const int32_t *tokens, const int32_t *targets, ZyErr *err);
/* Whether the micro-batches may run as a graph (ZAYA_GPU_GRAPHS=1 and no capture refused so far); *kernels = the
 * kernel nodes of the current graph (0: none captured), *replays = micro-batches replayed so far, *refused = why
 * graphs are not used (NULL: nothing refused them). */
int gpu_model_graphs(const GpuModel *gm, int *kernels, long *replays, const char **refused);
/* Loss of the last forward against targets, without gradients; added to the accumulator. */
int gpu_model_loss(GpuModel *gm, const int32_t *targets, ZyErr *err);
/* Reads (waits) and clears the loss accumulator: the sum of the mean losses since the last take. */
int gpu_model_take_loss(GpuModel *gm, double *sum, ZyErr *err);
void gpu_model_zero_grads(GpuModel *gm);
/* Whether this model's training passes run the experts' products grouped on the device (bf16, sm_80+, unless
 * ZAYA_GPU_EXPERTS=loop) rather than one cuBLASLt product per expert: 0 per expert, 1 grouped in the staged form
 * (ZAYA_GPU_EXPERT_KERNEL=staged), 2 grouped in the async form, 3 grouped on wgmma + TMA (CUTLASS; the default where
 * it can run: an sm_90 GPU and a build with CUTLASS's headers; gk_expert_kernel). */
int gpu_model_experts_grouped(const GpuModel *gm);
/* What runs the attention of this model's passes: "cuDNN N" (ZAYA_GPU_ATTENTION=cudnn|auto, where it loaded and takes
 * the shape), the tensor-core kernels (bf16) or the fp32 ones. */
const char *gpu_model_attention_path(const GpuModel *gm);
/* The most rows a decoding step may have for the few-row products (gk_skinny_*: bf16 runs, ZAYA_GPU_FEW_ROWS on);
 * 0 where they are off. */
int gpu_model_few_rows(const GpuModel *gm);
/* Whether the decoding step's small kernels are launched to overlap the one before them (programmatic dependent
 * launch: sm_90 and newer, ZAYA_GPU_PDL on; gk_programmatic_launch). */
int gpu_model_programmatic_launch(const GpuModel *gm);
/* Whether a decoding step of up to GK_DECODE_LAYER_ROWS sequences of one new token (bf16 CCA layers, a bf16 cache) runs
 * its layers as one persistent kernel (ZAYA_GPU_DECODE_LAYER=persistent and the few-row products on;
 * gk_decode_layers), else as their launches. */
int gpu_model_decode_layer_persistent(const GpuModel *gm);
/* The layers decoding has run (or captured into a graph) as that kernel so far: 0 where it never applied. */
long gpu_model_decode_layer_runs(const GpuModel *gm);
/* Every layer's routing statistics of the last forward, summed on the device into device memory (queued, no wait):
 * counts [L, E + 1] (rows per choice, E the skip expert), sums [L, 2] (Σ gate over routed rows, Σ skip probability),
 * as routing_counts_add_layer adds them. */
void gpu_model_routing_stats(GpuModel *gm, int32_t *counts, double *sums);
/* Host copies of the last forward's logits [B*T, V] / of layer l's routing (choice [N], gate [N], probs [N, K]). */
int gpu_model_logits(GpuModel *gm, float *logits, ZyErr *err);
int gpu_model_routing(GpuModel *gm, int layer, int32_t *choice, float *gate, float *probs, ZyErr *err);

/* Device arenas (floats, the host table's layout) for the optimizer and collectives. */
float *gpu_model_params(GpuModel *gm);
float *gpu_model_grads(GpuModel *gm);
/* The bf16 copy of the parameters that bf16 products read (NULL in an fp32 run), rebuilt whole by the next pass after
 * gpu_model_weights_changed; a writer that keeps it current itself (the optimizer's params16) need not call that. */
uint16_t *gpu_model_params16(GpuModel *gm);
void *gpu_model_ctx(GpuModel *gm); /* the GpuCtx (gpu.h) */
/* Device memory this model holds (bytes). */
size_t gpu_model_bytes(const GpuModel *gm);
/* The fp32 weights' share of it: the whole arena, or a lean arena's pieces (bf16 inference, ZAYA_GPU_ARENA=lean:
 * norms, biases, convolutions; the matrices and the embedding are in the bf16 arena alone). */
size_t gpu_model_fp32_weight_bytes(const GpuModel *gm);

/* Per-phase seconds (ModelPhase, model.h) of every later pass are added to phase_seconds (NULL: off). Drains the
 * GPU's queue at each phase boundary: for zaya bench train's breakdown, not for training. */
void gpu_model_set_timing(GpuModel *gm, double *phase_seconds);
/* Re-sizes the activations for batches [B, T] (a curriculum phase boundary); nothing happens when unchanged. */
int gpu_model_set_shape(GpuModel *gm, int B, int T, ZyErr *err);

#endif
