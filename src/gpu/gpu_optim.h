/* gpu_optim: the optimizer of src/optim/optim.h on the GPU: Muon (Newton–Schulz 5 on every 2-D matrix and on each matrix
 * of a 3-D expert stack) for the PARAM_MUON tensors, AdamW (decoupled weight decay, bias correction) for the rest,
 * router_lr_scale for the router's tensors, and global-norm clipping, with the same maths as optim_step.
 *
 * Like the CPU Optimizer it owns one contiguous block [begin, end) of the parameter arena (whole tensors) and its
 * state covers only that block, in the arena's layout: exp_avg (AdamW m, Muon momentum) and exp_avg_sq (AdamW v;
 * zero for Muon tensors, as the CPU step leaves it), so gpu_optim_download/upload read and write the CPU
 * checkpoint's arrays unchanged and a ZeRO-1 shard is a block. The parameter table is HOST metadata (names,
 * shapes, offsets); the device arenas (parameters, gradients: the table's layout, t->total floats each) are passed
 * to each call. Everything a step needs (Newton–Schulz scratch for the largest Muon group, the per-chunk tables) is
 * allocated at create: a step only launches work on g->stream, never synchronises and never allocates.
 *
 * Muon groups: the owned Muon matrices of one shape [m, n] and one learning rate (router or not) are updated
 * together, whichever tensors they come from (the E matrices of an expert stack, the same projection of every
 * layer), at most GPU_OPTIM_GROUP_BYTES of scratch per group (a longer list is cut into near-equal groups, in table
 * order). Every launch of a Muon step covers a whole group: the momentum, the per-matrix Frobenius norms (one block
 * per matrix over fixed chunks: the same bits as one matrix alone), the Newton–Schulz iterations as strided-batched
 * products (gpu_gemm_batched) over the group's scratch copies, and the weight update. A bench-gpu step (18 layers,
 * 738 Muon matrices) is 35 groups: ~1,150 launches instead of ~24,000 (bf16 products; see gpu_optim.cu), before the
 * symmetric products' bands (matrices of 1,024 rows or more: 4 bands at 1,024 rows, 8 more launches an iteration of
 * a group and 37.5% fewer of those two products' FLOPs; 8 at ZAYA1-8B's 2,048, 16 more and ~44% fewer).
 *
 * Precision: fp32 products (g->bf16 = 0), or, with g->bf16 = 1 (set by the caller), Newton–Schulz's products take
 * bf16-rounded operands with fp32 sums, as optim_set_bf16 on the CPU; the momentum, the moments and the weights
 * stay fp32. The element-wise arithmetic is the CPU's, operation for operation (no fused multiply-adds), so the
 * AdamW tensors and both moment arrays match a gcc-built CPU step bit for bit; Muon's updates differ only by the
 * products' summation order (which may also depend on the batch count cuBLASLt is given, so a matrix's bits can
 * differ between groupings: per-matrix vs batched, or ZeRO-1 blocks that split a shape's list differently).
 * Deterministic: the same inputs, table and block give the same bits on every run. */
#ifndef ZAYA_GPU_OPTIM_H
#define ZAYA_GPU_OPTIM_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* The CPU headers declare C functions without extern "C" of their own: included here first, inside the block, so a
 * C++ (.cu) includer links to them (gpu.h's later include of util.h is then a no-op). */
#ifdef __cplusplus
extern "C" {
#endif
#include "optim/optim.h"
#include "model/params.h"
#include "util/util.h"
#ifdef __cplusplus
}
#endif

#include "gpu/gpu.h"
#include "gpu/gpu_kernels.h" /* GpuOptimChunk, the AdamW pass */

#ifdef __cplusplus
extern "C" {
#endif


/* One Muon matrix [m, n] at arena offset off (an expert stack [E, m, n] is E of them). */
typedef struct {
    size_t off;
    int m, n;
    int router;
} GpuMuonMatrix;

/* Muon matrices updated together: o->muon[first, first + count), all [m, n], all router or none. */
typedef struct {
    int first, count;
    int m, n;
    int router;
} GpuMuonGroup;

/* Newton–Schulz scratch per Muon group, at most (a single matrix larger than this is a group of one). */
#define GPU_OPTIM_GROUP_BYTES ((size_t)512 << 20)

typedef struct {
    OptimConfig cfg;
    int64_t step;                /* optimizer steps taken (AdamW bias correction): plain host data */
    /* device, set by the caller (NULL: none): the bf16 copy of the parameter arena the bf16 products read; a step
     * then writes bf16(w) of every weight it updates there too (AdamW and Muon), so the copy stays current without
     * a rounding pass over the whole arena */
    uint16_t *params16;
    size_t begin, end;           /* the owned arena block, in floats */
    float *exp_avg, *exp_avg_sq; /* device [end - begin] each */
    /* host: the Muon matrices, in group order (each group's matrices in table order), and the groups */
    GpuMuonMatrix *muon;
    int n_muon;
    GpuMuonGroup *groups;
    int n_groups;
    int max_batch;               /* the most matrices in one group (create's limit, or what the budget allows) */
    /* device: the Muon matrices' arena offsets, in group order [n_muon] */
    uint64_t *muon_off;
    /* device: the AdamW chunks (one block each) and the owned trainable gradients' chunks (gpu_grad_sumsq) */
    GpuOptimChunk *adamw_chunks, *grad_chunks;
    int n_adamw_chunks, n_grad_chunks;
    /* device: Newton–Schulz scratch for the largest group: a group's matrix i sits at i·pad(m·n) in X, X', X16 and
     * at i·pad(r²) in A, B, A16 (r = min(m, n); pad: whole 256-byte lines) */
    float *ns_x, *ns_xn;         /* [ns_len] */
    float *ns_a, *ns_b;          /* [ns_rr] */
    uint16_t *ns_x16, *ns_m16;   /* bf16 copies of X and of A / B (bf16 products) */
    size_t ns_len, ns_rr;
    /* device: fixed-order partial sums (per chunk) and each group matrix's squared Newton–Schulz input norm */
    double *partial;
    int n_partial;
    double *ns_sumsq;            /* [max_batch] */
    /* Newton–Schulz's symmetric products (X Xᵀ, A²) as row bands of their upper triangle and a mirror: the bands'
     * height (create sets 0: ns_symmetric_bands chooses, or INT_MAX with ZAYA_GPU_NS_BANDS=off: whole products;
     * tests set it small to cut small matrices) */
    int ns_band_rows;
} GpuOptimizer;

/* Owns the whole table. ZeRO-1: gpu_optim_create_block owns the tensors inside [begin, end) (bounds from
 * zero1_partition), as optim_create_block. g->bf16 may be set before or after create. */
int gpu_optim_create(GpuOptimizer *o, GpuCtx *g, const ParamTable *t, const OptimConfig *cfg, ZyErr *err);
int gpu_optim_create_block(GpuOptimizer *o, GpuCtx *g, const ParamTable *t, const OptimConfig *cfg, size_t begin,
                           size_t end, ZyErr *err);
/* gpu_optim_create_block with at most max_batch matrices per Muon group (0: as many as GPU_OPTIM_GROUP_BYTES
 * allows; 1: every matrix on its own, the unbatched step, for comparisons and timings). */
int gpu_optim_create_grouped(GpuOptimizer *o, GpuCtx *g, const ParamTable *t, const OptimConfig *cfg, size_t begin,
                             size_t end, int max_batch, ZyErr *err);
void gpu_optim_free(GpuOptimizer *o);

/* One update of every owned trainable tensor with learning rate lr (gradients already averaged), as optim_step
 * after grad_clip's multiply: each gradient is read as g·grad_scale (the clip coefficient, 1 when unclipped; the
 * arena itself is left as it was). d_params, d_grads are the device arenas (t's layout); t must be the table create
 * was given. Only
 * launches (one AdamW launch for every AdamW tensor; per Muon group the momentum, the norms, Newton–Schulz's
 * products and the update). Returns -1 when a product fails to launch (err); kernel faults surface at the next
 * gpu_sync. */
int gpu_optim_step(GpuOptimizer *o, GpuCtx *g, const ParamTable *t, float *d_params, const float *d_grads, double lr,
                   float grad_scale, ZyErr *err);

/* *d_out (device double) = Σ g² over the OWNED trainable gradients, in a fixed order (grad_sumsq_owned; with the
 * whole table owned, grad_global_norm²). Launches only; uses o's scratch. Returns 0. */
int gpu_grad_sumsq(GpuOptimizer *o, GpuCtx *g, const float *d_grads, double *d_out);
/* d_grads[0, n) *= clip_coefficient(max_norm, sqrt(*d_sumsq)), the coefficient computed on the device (nothing
 * happens when it is 1; max_norm <= 0: no launch). Pass the whole arena (buffer slots and padding are zero) or the
 * owned block (d_grads + begin, end - begin). Launches only. */
void gpu_grad_clip(GpuCtx *g, float *d_grads, size_t n, const double *d_sumsq, double max_norm);

/* Checkpoints: the state as host arrays of end - begin floats each, the CPU Optimizer's layout (optim_state).
 * Download waits for the stream; upload returns once copied. o->step is host data (set it when resuming). */
int gpu_optim_download(GpuOptimizer *o, GpuCtx *g, float *exp_avg, float *exp_avg_sq, ZyErr *err);
int gpu_optim_upload(GpuOptimizer *o, GpuCtx *g, const float *exp_avg, const float *exp_avg_sq, ZyErr *err);

#ifdef __cplusplus
}
#endif
#endif
