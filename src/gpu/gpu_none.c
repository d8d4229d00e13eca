/* A build without GPU support (no nvcc, or make CUDA=0): the GPU entry points the rest of zaya calls exist and say
 * clearly why they cannot run. Nothing here is reachable once gpu_model_create / gpu_open has failed. */
#include <stddef.h>
#include <stdio.h>

#include "gpu/gpu.h"
#include "gpu/gpu_decode.h"
#include "gpu/gpu_eval.h"
#include "gpu/gpu_model.h"
#include "gpu/gpu_trainer.h"

#define NO_GPU "--device cuda: this zaya was built without GPU support (build on a machine with CUDA's nvcc, e.g. /usr/local/cuda/bin/nvcc, and without CUDA=0)"

int gpu_compiled(void) { return 0; }
void gpu_kernel_paths(char *line, size_t n) { snprintf(line, n, "%s", NO_GPU); }
int gpu_open(GpuCtx *g, int device, ZyErr *err) { return zy_fail(err, NO_GPU); }
void gpu_close(GpuCtx *g) {}
int gpu_use(GpuCtx *g, ZyErr *err) { return zy_fail(err, NO_GPU); }
int gpu_sync(GpuCtx *g, const char *what, ZyErr *err) { return zy_fail(err, NO_GPU); }
double gpu_gemm_probe_tflops(GpuCtx *g, int n, int reps) { return -1; }
int gpu_grid_sync_probe(GpuCtx *g, int reps, double *us, long *stale, int *blocks, ZyErr *err) {
    return zy_fail(err, "this zaya was built without GPU support");
}
int gpu_expert_gemm_probe(GpuCtx *g, int E, int rows, int hidden, int inter, int reps,
                          double tflops[GPU_EXPERT_PROBE_FORMS], ZyErr *err) {
    for (int f = 0; f < GPU_EXPERT_PROBE_FORMS; f++) tflops[f] = -1;
    return zy_fail(err, NO_GPU);
}
int gpu_memory_used(GpuCtx *g, size_t *used, size_t *total) { return -1; }

int gpu_model_create(GpuModel **out, const Model *m, int device, int B, int T, int bf16, int train, ZyErr *err) {
    *out = NULL;
    return zy_fail(err, NO_GPU);
}
void gpu_model_free(GpuModel *gm) {}
const char *gpu_model_device(const GpuModel *gm) { return "none"; }
int gpu_model_upload(GpuModel *gm, const Model *m, ZyErr *err) { return zy_fail(err, NO_GPU); }
int gpu_model_download(GpuModel *gm, Model *m, ZyErr *err) { return zy_fail(err, NO_GPU); }
int gpu_model_download_grads(GpuModel *gm, Model *m, ZyErr *err) { return zy_fail(err, NO_GPU); }
int gpu_model_upload_grads(GpuModel *gm, const Model *m, ZyErr *err) { return zy_fail(err, NO_GPU); }
int gpu_model_upload_range(GpuModel *gm, const Model *m, size_t offset, size_t count, ZyErr *err) {
    return zy_fail(err, NO_GPU);
}
void gpu_model_weights_changed(GpuModel *gm) {}
int gpu_model_forward(GpuModel *gm, const int32_t *tokens, ZyErr *err) { return zy_fail(err, NO_GPU); }
int gpu_model_backward(GpuModel *gm, const int32_t *targets, ZyErr *err) { return zy_fail(err, NO_GPU); }
int gpu_model_train_micro(GpuModel *gm, const int32_t *tokens, const int32_t *targets, ZyErr *err) {
    return zy_fail(err, NO_GPU);
}
int gpu_model_graphs(const GpuModel *gm, int *kernels, long *replays, const char **refused) {
    *kernels = 0, *replays = 0, *refused = NULL;
    return 0;
}
int gpu_model_loss(GpuModel *gm, const int32_t *targets, ZyErr *err) { return zy_fail(err, NO_GPU); }
int gpu_model_take_loss(GpuModel *gm, double *sum, ZyErr *err) { return zy_fail(err, NO_GPU); }
void gpu_model_zero_grads(GpuModel *gm) {}
int gpu_model_logits(GpuModel *gm, float *logits, ZyErr *err) { return zy_fail(err, NO_GPU); }
int gpu_model_experts_grouped(const GpuModel *gm) { return 0; }
const char *gpu_model_attention_path(const GpuModel *gm) { return NO_GPU; }
int gpu_model_few_rows(const GpuModel *gm) { return 0; }
int gpu_model_programmatic_launch(const GpuModel *gm) { return 0; }
int gpu_model_decode_layer_persistent(const GpuModel *gm) { return 0; }
long gpu_model_decode_layer_runs(const GpuModel *gm) { return 0; }
int gpu_model_routing(GpuModel *gm, int layer, int32_t *choice, float *gate, float *probs, ZyErr *err) {
    return zy_fail(err, NO_GPU);
}
float *gpu_model_params(GpuModel *gm) { return NULL; }
uint16_t *gpu_model_params16(GpuModel *gm) { return NULL; }
float *gpu_model_grads(GpuModel *gm) { return NULL; }
void *gpu_model_ctx(GpuModel *gm) { return NULL; }
size_t gpu_model_bytes(const GpuModel *gm) { return 0; }
size_t gpu_model_fp32_weight_bytes(const GpuModel *gm) { return 0; }
int gpu_model_set_shape(GpuModel *gm, int B, int T, ZyErr *err) { return zy_fail(err, NO_GPU); }

int gpu_trainer_create(GpuTrainer **out, const Model *m, const Optimizer *opt, const Dist *d, int device, int bf16,
                       int B, int T, ZyErr *err) {
    *out = NULL;
    return zy_fail(err, NO_GPU);
}
void gpu_trainer_free(GpuTrainer *gt) {}
const char *gpu_trainer_device(const GpuTrainer *gt) { return "none"; }
int gpu_trainer_set_shape(GpuTrainer *gt, int B, int T, ZyErr *err) { return zy_fail(err, NO_GPU); }
void gpu_trainer_begin(GpuTrainer *gt) {}
int gpu_trainer_micro(GpuTrainer *gt, const int32_t *inputs, const int32_t *targets, RoutingCounts *routes,
                      ZyErr *err) {
    return zy_fail(err, NO_GPU);
}
int gpu_trainer_reduce(GpuTrainer *gt, Model *host, const Dist *d, const size_t *bounds, float *scratch, int n_micro,
                       int nan_fault, double *loss, double *sumsq, ZyErr *err) {
    return zy_fail(err, NO_GPU);
}
int gpu_trainer_apply(GpuTrainer *gt, Model *host, const Dist *d, const size_t *bounds, double clip, double lr,
                      ZyErr *err) {
    return zy_fail(err, NO_GPU);
}
int gpu_trainer_upload_biases(GpuTrainer *gt, const Model *host, ZyErr *err) { return zy_fail(err, NO_GPU); }
int gpu_trainer_eval_loss(GpuTrainer *gt, const int32_t *inputs, const int32_t *targets, double *loss, ZyErr *err) {
    return zy_fail(err, NO_GPU);
}
int gpu_trainer_to_host(GpuTrainer *gt, Model *m, Optimizer *opt, ZyErr *err) { return zy_fail(err, NO_GPU); }
size_t gpu_trainer_memory_used(GpuTrainer *gt) { return 0; }
int gpu_trainer_sync(GpuTrainer *gt, ZyErr *err) { return zy_fail(err, NO_GPU); }
GpuModel *gpu_trainer_model(GpuTrainer *gt) { return NULL; }
double gpu_dense_bf16_peak_tflops(const GpuCtx *g) { return 0; }
void gpu_model_set_timing(GpuModel *gm, double *phase_seconds) {}

int gpu_kvcache_create(GpuKVCache **out, GpuModel *gm, int batch, int max_len, int chunk, ZyErr *err) {
    *out = NULL;
    return zy_fail(err, NO_GPU);
}
int gpu_kvcache_create_kv(GpuKVCache **out, GpuModel *gm, int batch, int max_len, int chunk, int kv_bf16,
                          ZyErr *err) {
    return gpu_kvcache_create(out, gm, batch, max_len, chunk, err);
}
void gpu_kvcache_free(GpuKVCache *c) {}
void gpu_kvcache_reset(GpuKVCache *c) {}
int gpu_kvcache_len(const GpuKVCache *c) { return 0; }
int gpu_kvcache_max_len(const GpuKVCache *c) { return 0; }
size_t gpu_kvcache_bytes(const GpuKVCache *c) { return 0; }
int gpu_model_decode(GpuModel *gm, GpuKVCache *c, const int32_t *tokens, int n, float *logits, int last_only,
                     ZyErr *err) {
    return zy_fail(err, NO_GPU);
}
int gpu_kvpool_create(GpuKVPool **out, GpuModel *gm, int max_seqs, int max_len, int n_blocks, int block_tokens,
                      int max_rows, int chunk, ZyErr *err) {
    *out = NULL;
    return zy_fail(err, NO_GPU);
}
int gpu_kvpool_create_kv(GpuKVPool **out, GpuModel *gm, int max_seqs, int max_len, int n_blocks, int block_tokens,
                         int max_rows, int chunk, int kv_bf16, ZyErr *err) {
    return gpu_kvpool_create(out, gm, max_seqs, max_len, n_blocks, block_tokens, max_rows, chunk, err);
}
void gpu_kvpool_free(GpuKVPool *p) {}
void gpu_kvpool_seq_reset(GpuKVPool *p, int slot) {}
void gpu_kvpool_seq_release(GpuKVPool *p, int slot) {}
int gpu_kvpool_reserve(GpuKVPool *p, int slot, int tokens) { return -1; }
int gpu_kvpool_fork(GpuKVPool *p, int parent, int child) { return -1; }
int gpu_kvpool_keep_block_states(GpuKVPool *p, ZyErr *err) { return zy_fail(err, NO_GPU); }
int gpu_kvpool_seq_share(GpuKVPool *p, int slot, const int32_t *blocks, int n) { return -1; }
int gpu_kvpool_download_block_states(GpuKVPool *p, float *out, ZyErr *err) { return zy_fail(err, NO_GPU); }
KVBlocks *gpu_kvpool_blocks(GpuKVPool *p) { return NULL; }
int gpu_kvpool_len(const GpuKVPool *p, int slot) { return 0; }
int gpu_kvpool_free_blocks(const GpuKVPool *p) { return 0; }
size_t gpu_kvpool_bytes(const GpuKVPool *p) { return 0; }
int gpu_kvpool_graphs(const GpuKVPool *p) { return 0; }
int gpu_kvpool_graph_kernels(const GpuKVPool *p) { return 0; }
int gpu_model_decode_step(GpuModel *gm, GpuKVPool *p, const DecodeSeq *seqs, int n_seqs, const int32_t *tokens,
                          float *logits, ZyErr *err) {
    return zy_fail(err, NO_GPU);
}
int gpu_generate(GpuModel *gm, GpuKVCache *c, Sampler *s, const SamplingParams *p, ZyRng *rng, const int32_t *prompt,
                 int n_prompt, int max_new, const int32_t *stop_ids, int n_stop, GenerateTokenFn fn, void *ctx,
                 GenerateStats *st, ZyErr *err) {
    return zy_fail(err, NO_GPU);
}

/* ---- NCCL collectives (gpu_comm.h): no GPU support, so no NCCL either -------------------------------------- */
#include "gpu/gpu_comm.h"

#define NO_GPU_NCCL "NCCL: this zaya was built without GPU support (build on a machine with CUDA's nvcc and NCCL, without CUDA=0)"

const char *gpu_trainer_collectives(const GpuTrainer *gt) { return "none"; }
int gpu_comm_compiled(void) { return 0; }
const char *gpu_comm_version(void) { return "no NCCL (built without GPU support)"; }
int gpu_comm_decide(const Dist *d, const GpuCtx *g, int required, int *use, char *why, size_t cap, ZyErr *err) {
    *use = 0;
    return zy_fail(err, NO_GPU_NCCL);
}
int gpu_comm_create(GpuComm **out, const Dist *d, GpuCtx *g, ZyErr *err) {
    *out = NULL;
    return zy_fail(err, NO_GPU_NCCL);
}
void gpu_comm_free(GpuComm *c) {}
const char *gpu_comm_describe(const GpuComm *c) { return "none"; }
int gpu_comm_reduce_scatter_f32(GpuComm *c, float *d_arena, const size_t *bounds, ZyErr *err) {
    return zy_fail(err, NO_GPU_NCCL);
}
int gpu_comm_allgather_f32(GpuComm *c, float *d_arena, const size_t *bounds, ZyErr *err) {
    return zy_fail(err, NO_GPU_NCCL);
}
int gpu_comm_bench_open(GpuCommBench **out, const Dist *d, size_t bytes, ZyErr *err) {
    *out = NULL;
    zy_fail(err, "bench comm --backend nccl: this zaya was built without GPU support (build on a machine with CUDA's "
                 "nvcc and NCCL, without CUDA=0), so only --backend mpi runs");
    return d->rank == 0 ? -1 : -2; /* the same on every rank: rank 0 reports it */
}
void gpu_comm_bench_close(GpuCommBench *b) {}
const char *gpu_comm_bench_describe(const GpuCommBench *b) { return "none"; }
int gpu_comm_bench_put(GpuCommBench *b, int which, const void *host, size_t bytes, ZyErr *err) {
    return zy_fail(err, NO_GPU_NCCL);
}
int gpu_comm_bench_get(GpuCommBench *b, int which, void *host, size_t bytes, ZyErr *err) {
    return zy_fail(err, NO_GPU_NCCL);
}
int gpu_comm_bench_run(GpuCommBench *b, GpuCollective op, int inplace, int bf16, size_t count, int root, int reps,
                       double *seconds, ZyErr *err) {
    return zy_fail(err, NO_GPU_NCCL);
}
double gpu_comm_bench_memcpy(GpuCommBench *b, size_t bytes, int warmup, int iters) { return -1; }

int gpu_eval_runner_create(GpuEvalRunner **out, EvalRunner *run, const Model *m, int device, int bf16, ZyErr *err) {
    *out = NULL;
    return zy_fail(err, NO_GPU);
}
void gpu_eval_runner_free(GpuEvalRunner *r) {}
const char *gpu_eval_runner_device(const GpuEvalRunner *r) { return "none"; }
