/* gpu: the GPU backend's C interface (device selection, streams, cuBLASLt products). Built into zaya when nvcc is
 * found (make CUDA=0 leaves it out); without it every entry point returns a clear error (gpu_none.c). */
#ifndef ZAYA_GPU_H
#define ZAYA_GPU_H

#include <stddef.h>
#include <stdint.h>

#include "gpu/gpu_kernels.h"

#ifdef __cplusplus
extern "C" {
#endif
#include "util/util.h"

/* 1 when this binary has GPU support compiled in. */
int gpu_compiled(void);
/* One line naming the kernels this build and the current GPU run the experts and the attention with (zaya info). */
void gpu_kernel_paths(char *line, size_t n);

/* One device, one stream, one cuBLASLt handle and its workspace; bf16 scratch for products whose operands have no
 * bf16 copy. Not shared between threads. */
typedef struct {
    int device;
    GkStream stream;
    void *lt;              /* cublasLtHandle_t */
    void *lt_work;         /* cuBLASLt workspace */
    size_t lt_work_bytes;
    uint16_t *scratch[2];  /* bf16 copies of fp32 operands */
    size_t scratch_elems[2];
    int bf16;              /* products take bf16 operands (fp32 accumulation); 0 = fp32 (no TF32) */
    char name[256];        /* device name */
    int sm_count, cc_major, cc_minor;
    size_t mem_total;
    void *plans;           /* cached cuBLASLt product descriptors and algorithms */
    long plan_builds;      /* products whose shape missed the cache (descriptors built) ... */
    long plan_heuristics;  /* ... of them, those that ran cuBLASLt's heuristic (the rest reused a checked algorithm) */
    double plan_seconds;   /* host time spent building plans */
} GpuCtx;

/* Opens device `device` (-1: the rank-local choice: ZAYA_GPU, else local MPI rank modulo device count). Errors: no
 * GPU support built in, no device, driver too old. */
int gpu_open(GpuCtx *g, int device, ZyErr *err);
void gpu_close(GpuCtx *g);
/* Makes g's device the calling thread's current one: a thread other than the one that opened g (a server's engine
 * thread) must call it before using g. */
int gpu_use(GpuCtx *g, ZyErr *err);
/* Waits for the stream and reports any failed launch or asynchronous fault, naming `what`. */
int gpu_sync(GpuCtx *g, const char *what, ZyErr *err);
/* Device memory (zeroed); NULL with an error naming `what` and the size when it does not fit. */
void *gpu_alloc(size_t bytes, const char *what, ZyErr *err);
void gpu_free(void *p);
int gpu_upload(GpuCtx *g, void *dst, const void *src, size_t bytes, ZyErr *err);   /* stream-ordered, then waits */
int gpu_download(GpuCtx *g, void *dst, const void *src, size_t bytes, ZyErr *err); /* waits for the stream first */
/* Asynchronous host-to-device copy (host memory must stay valid until the stream reaches it). */
void gpu_upload_async(GpuCtx *g, void *dst, const void *src, size_t bytes);
void gpu_memset_async(GpuCtx *g, void *dst, int value, size_t bytes);
void gpu_copy_async(GpuCtx *g, void *dst, const void *src, size_t bytes); /* device to device */
/* Sizes the bf16 operand scratch for products of up to `elems` elements per operand, so that no step allocates. */
int gpu_reserve_scratch(GpuCtx *g, size_t elems, ZyErr *err);
/* A device address range of `bytes` with memory only where gpu_sparse_commit puts it (CUDA's virtual memory
 * management: cuMemAddressReserve, then cuMemCreate + cuMemMap per committed piece), so an arena can keep its layout
 * while holding only some of its tensors (gpu_model.c's lean fp32 arena). The driver's functions are looked up at run
 * time (cudaGetDriverEntryPointByVersion): nothing links libcuda. NULL with err set where the driver or build has no
 * such memory (HIP builds, old drivers): the caller allocates the whole range instead. A read or write outside the
 * committed pieces is an illegal address. */
typedef struct GpuSparse GpuSparse;
GpuSparse *gpu_sparse_reserve(GpuCtx *g, size_t bytes, ZyErr *err);
void *gpu_sparse_base(const GpuSparse *s);
/* The commit granularity (bytes; a power of two): gpu_sparse_commit's offset and size are multiples of it. */
size_t gpu_sparse_granularity(const GpuSparse *s);
/* Backs [offset, offset + bytes) with zeroed device memory. */
int gpu_sparse_commit(GpuSparse *s, size_t offset, size_t bytes, ZyErr *err);
size_t gpu_sparse_committed(const GpuSparse *s); /* bytes backed so far */
void gpu_sparse_free(GpuSparse *s);
/* CUDA graphs of a stream's work (gpu_decode.c's ZAYA_GPU_GRAPHS): begin captures what is queued on g's stream from
 * then on (nothing runs; a wait on the stream fails the capture); end instantiates it into *exec (NULL with an error
 * when the capture was refused) and counts its kernels into *kernels (NULL: not asked); launch replays it on g's
 * stream (same kernels, arguments and pointers). */
int gpu_graph_begin(GpuCtx *g, ZyErr *err);
int gpu_graph_end(GpuCtx *g, void **exec, int *kernels, ZyErr *err);
int gpu_graph_launch(GpuCtx *g, void *exec, ZyErr *err);
void gpu_graph_free(void *exec);
/* Stream-ordered wall time: start returns a timer, stop waits for the stream and returns the seconds between. */
void *gpu_timer_start(GpuCtx *g);
double gpu_timer_stop(GpuCtx *g, void *timer);
/* Device memory in use (all processes) and the total, in bytes. */
int gpu_memory_used(GpuCtx *g, size_t *used, size_t *total);

/* Row-major C = alpha op(A) op(B) + beta C, as zy_gemm (matmul.h): op(A) M×K, op(B) K×N. fp32 mode: fp32 products
 * (no TF32). bf16 mode: both operands in bf16 (A16 / B16 when given: ready bf16 copies with the same layout; else
 * rounded into scratch here), fp32 accumulation and output. Returns 0 or -1 (cuBLASLt error in err). */
int gpu_gemm(GpuCtx *g, int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A,
             const uint16_t *A16, int lda, const float *B, const uint16_t *B16, int ldb, float beta, float *C, int ldc,
             ZyErr *err);

/* The datasheet's dense bf16 tensor-core peak of this GPU (TFLOP/s; 0 when the model is not known). */
double gpu_dense_bf16_peak_tflops(const GpuCtx *g);

/* Measured dense GEMM throughput (TFLOP/s) of cuBLASLt on n×n×n products in the ctx's precision. */
double gpu_gemm_probe_tflops(GpuCtx *g, int n, int reps);

/* The persistent decoding layer's grid barrier (gk_grid_sync_probe) over one block an SM, as that kernel runs: reps
 * rounds of two barriers, the stale stamps seen into *stale (0 for a sound barrier) and the microseconds a barrier
 * (timed against a launch of 1 round: launch cost apart) into *us. -1 (err set) if the launch was refused. */
int gpu_grid_sync_probe(GpuCtx *g, int reps, double *us, long *stale, int *blocks, ZyErr *err);

/* The experts' six products of a MoE layer (E experts over `rows` routed rows, hidden and intermediate sizes, bf16):
 * grouped on the device (gk_expert_mm) in each form (staged, async, sm90: gk_expert_kernel's; sm90 only where it can
 * run, else -1) and one cuBLASLt product per expert (loop), TFLOP/s of each over `reps` layers into tflops[form].
 * Returns 0 or -1 (err). */
enum { GPU_EXPERT_PROBE_STAGED, GPU_EXPERT_PROBE_ASYNC, GPU_EXPERT_PROBE_SM90, GPU_EXPERT_PROBE_LOOP,
       GPU_EXPERT_PROBE_FORMS };
int gpu_expert_gemm_probe(GpuCtx *g, int E, int rows, int hidden, int inter, int reps,
                          double tflops[GPU_EXPERT_PROBE_FORMS], ZyErr *err);

/* A strided batch of gpu_gemm products in one launch: for i in [0, batch), C_i = alpha op(A_i) op(B_i) + beta C_i with
 * A_i = A + i·stride_a (and A16 + i·stride_a), B_i = B + i·stride_b, C_i = C + i·stride_c (elements), each one
 * row-major as in gpu_gemm, same precision rules. Strides >= 0 and the C_i must not overlap; the gaps between the
 * C_i are never written. bf16 mode without a ready copy rounds the whole span of the batch, (batch − 1)·stride +
 * one matrix, into scratch. batch 1 is gpu_gemm (strides ignored); batch <= 0: nothing. Returns 0 or -1 (err). */
int gpu_gemm_batched(GpuCtx *g, int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A,
                     const uint16_t *A16, int lda, long long stride_a, const float *B, const uint16_t *B16, int ldb,
                     long long stride_b, float beta, float *C, int ldc, long long stride_c, int batch, ZyErr *err);
/* The same with bf16 in and out: D_i = alpha op(A_i) op(B_i) + beta C_i, A, B, C, D bf16 bits, fp32 accumulation and
 * scaling, D rounded to bf16 (nearest even) once. C may be D (an update in place, where D is not also A or B) or NULL
 * when beta is 0; C and D share ldc and stride_c. For Newton–Schulz (gpu_optim.cu), whose iterates stay bf16. Returns 0 or -1 (err). */
int gpu_gemm_batched_bf16(GpuCtx *g, int trans_a, int trans_b, int M, int N, int K, float alpha, const uint16_t *A16,
                          int lda, long long stride_a, const uint16_t *B16, int ldb, long long stride_b, float beta,
                          const uint16_t *C16, uint16_t *D16, int ldc, long long stride_c, int batch, ZyErr *err);

#ifdef __cplusplus
}
#endif
#endif
