/* The GPU test harness (make test-gpu): each gk_ op against its CPU namesake on fresh random inputs, then the
 * whole model. Comparisons are relative L2 errors ‖gpu − cpu‖ / ‖cpu‖ (NaN never passes); outputs are poisoned
 * before a launch so an unwritten element shows. Each group lives in its own file. */
#ifndef ZAYA_GPU_TEST_H
#define ZAYA_GPU_TEST_H

#include <stddef.h>
#include <stdint.h>

#include "model/config.h"
#include "gpu/gpu.h"
#include "model/model.h"
#include "util/util.h"

typedef struct {
    GpuCtx *g;
    ZyRng rng;
    int passed, failed;
    void *host[512], *dev[512]; /* allocations of the current group, freed by gt_reset */
    int n_host, n_dev;
    const char *group;
    int emulated; /* the device is tests/gpu/emu's CPU emulation (GPU_EMU=1 builds) */
} GpuTest;

/* Host arrays (freed by gt_reset): normal(0, scale) values; uniform integers in [lo, hi). */
float *gt_rand(GpuTest *t, size_t n, float scale);
int32_t *gt_rand_int(GpuTest *t, size_t n, int lo, int hi);
float *gt_host(GpuTest *t, size_t n); /* zeroed host floats */
float *gt_copy(GpuTest *t, const float *h, size_t n); /* host duplicate */
/* Device copies of host arrays (freed by gt_reset). */
float *gt_up(GpuTest *t, const float *h, size_t n);
int32_t *gt_up_i(GpuTest *t, const int32_t *h, size_t n);
/* A device array of n floats filled with NaN (poison: an element the kernel fails to write fails the check). */
float *gt_poison(GpuTest *t, size_t n);
void *gt_dev(GpuTest *t, size_t bytes); /* zeroed device memory */
/* Device → new host array (freed by gt_reset); waits for the stream. */
float *gt_down(GpuTest *t, const float *d, size_t n);
int32_t *gt_down_i(GpuTest *t, const int32_t *d, size_t n);
/* Records a pass or a failure (printed): rel L2 error of the device array vs the host reference within tol. */
int gt_check(GpuTest *t, const char *name, const float *dev, const float *ref, size_t n, double tol);
int gt_check_i(GpuTest *t, const char *name, const int32_t *dev, const int32_t *ref, size_t n);
/* A plain condition (printed with the formatted detail when it fails). */
int gt_assert(GpuTest *t, int ok, const char *name, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
double gt_rel_err(const float *a, const float *ref, size_t n); /* host arrays; INFINITY when a has a NaN */
void gt_reset(GpuTest *t);
/* 1 on a GPU. On the CPU emulator 0, with a line naming the case: a case sized for a GPU (a benchmark's shapes, a
 * throughput probe) would take the emulator hours, and runs in make test-gpu; the smaller cases beside it cover the
 * same code there. */
int gt_gpu_sized(GpuTest *t, const char *what);

/* An environment switch a check sets (value NULL: unset) and gt_env_restore puts back as the run found it, so a
 * rerun with the switch exported (ZAYA_GPU_PDL=off make test-gpu) keeps it for the checks after. */
typedef struct {
    const char *name;
    char *outer; /* the value before gt_env_set (NULL: unset) */
} GtEnv;
GtEnv gt_env_set(const char *name, const char *value);
void gt_env_restore(GtEnv *e); /* also a zeroed GtEnv: nothing set, nothing to do */

/* The small ZAYA1 config the model-level groups start from (V 97, D 64, 3 layers, 4 experts, head_dim 16). */
ZayaConfig gt_small_config(void);
/* Random weights for a model-level check: the spec's init, matrices scaled to std 0.1 (outputs of order one), every
 * vector (norms, biases, scales, temperatures) moved off its constant so each gradient path carries signal. */
void gt_randomise_model(GpuTest *t, Model *m);
/* model_create of cfg into m, then gt_randomise_model; -1 (a failed check named `label`, with the reason) when it
 * cannot be made. */
int gt_random_model(GpuTest *t, Model *m, const ZayaConfig *cfg, const char *label);

/* The groups (each in tests/gpu/test_gpu_<group>.c). */
void test_gpu_gemm(GpuTest *t);
void test_gpu_norms(GpuTest *t);
void test_gpu_moe(GpuTest *t);
void test_gpu_cca(GpuTest *t);
void test_gpu_attention(GpuTest *t);
void test_gpu_optim(GpuTest *t);
void test_gpu_model(GpuTest *t);
void test_gpu_decode(GpuTest *t);
void test_gpu_pool(GpuTest *t); /* in test_gpu_decode.c: the ragged block pool behind zaya serve */

#endif
