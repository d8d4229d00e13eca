/* A build without GPU support (no nvcc, or make CUDA=0): the GPU entry points the rest of zaya calls exist and say
 * clearly why they cannot run. Nothing here is reachable once gpu_model_create / gpu_open has failed. */
#include <stddef.h>

#include "gpu/gpu.h"
#include "gpu/gpu_model.h"
#include "gpu/gpu_trainer.h"

#define NO_GPU "--device cuda: this zaya was built without GPU support (build on a machine with CUDA's nvcc, e.g. /usr/local/cuda/bin/nvcc, and without CUDA=0)"

int gpu_compiled(void) { return 0; }
int gpu_open(GpuCtx *g, int device, ZyErr *err) { return zy_fail(err, NO_GPU); }
void gpu_close(GpuCtx *g) {}
int gpu_sync(GpuCtx *g, const char *what, ZyErr *err) { return zy_fail(err, NO_GPU); }
double gpu_gemm_probe_tflops(GpuCtx *g, int n, int reps) { return -1; }
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
int gpu_model_loss(GpuModel *gm, const int32_t *targets, ZyErr *err) { return zy_fail(err, NO_GPU); }
int gpu_model_take_loss(GpuModel *gm, double *sum, ZyErr *err) { return zy_fail(err, NO_GPU); }
void gpu_model_zero_grads(GpuModel *gm) {}
int gpu_model_logits(GpuModel *gm, float *logits, ZyErr *err) { return zy_fail(err, NO_GPU); }
int gpu_model_routing(GpuModel *gm, int layer, int32_t *choice, float *gate, float *probs, ZyErr *err) {
    return zy_fail(err, NO_GPU);
}
float *gpu_model_params(GpuModel *gm) { return NULL; }
float *gpu_model_grads(GpuModel *gm) { return NULL; }
void *gpu_model_ctx(GpuModel *gm) { return NULL; }
size_t gpu_model_bytes(const GpuModel *gm) { return 0; }
int gpu_model_set_shape(GpuModel *gm, int B, int T, ZyErr *err) { return zy_fail(err, NO_GPU); }

int gpu_trainer_create(GpuTrainer **out, const Model *m, const Optimizer *opt, int device, int bf16, int B, int T,
                       ZyErr *err) {
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
