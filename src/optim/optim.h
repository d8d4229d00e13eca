/* optim: Muon for the 2-D matrices inside the blocks, AdamW for everything else (docs/system.md), global-norm
 * gradient clipping, learning-rate schedules, and the expert-balancing controller. */
#ifndef ZAYA_OPTIM_H
#define ZAYA_OPTIM_H

#include <stdint.h>

#include "kernels/matmul.h"
#include "model/params.h"
#include "util/util.h"

typedef struct {
    double weight_decay;   /* decoupled; shared by Muon and AdamW thanks to Muon's RMS matching */
    double beta1, beta2, eps; /* AdamW */
    double muon_momentum;  /* μ = 0.95 */
    int muon_ns_steps;     /* 5 */
    int adamw_only;        /* every trainable tensor on AdamW (to compare with AdamW-only stacks; not ZAYA's recipe) */
    double router_lr_scale; /* the router's tensors (mlp.gate.*) learn at lr × this (docs/training.md: routing health) */
} OptimConfig;

/* Inline: the run-config parser (and its fuzz target) needs the defaults without the optimizer. */
static inline void optim_config_default(OptimConfig *c) {
    *c = (OptimConfig){.weight_decay = 0.0, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .muon_momentum = 0.95,
                       .muon_ns_steps = 5, .adamw_only = 0, .router_lr_scale = 1.0};
}

/* The router's tensors: everything under a layer's "mlp.gate." (down_proj, EDA scale, router MLP, out_proj, or the
 * linear router's weight); they learn at lr × router_lr_scale. */
int param_is_router(const ParamInfo *p);

/* One independent piece of a step (a Muon matrix, or a chunk of an AdamW tensor); defined in optim.c. */
typedef struct OptimJob OptimJob;

/* The optimizer owns one contiguous block [begin, end) of the parameter arena (whole tensors): all of it in one
 * process, a ZeRO-1 shard under MPI (see zero1_partition). Its state covers only that block, in the arena's
 * layout: exp_avg (AdamW m, or Muon momentum) and exp_avg_sq (AdamW v; unused by Muon tensors, scratch for the
 * reference step). Everything a step needs is allocated here: optim_step allocates nothing. */
typedef struct {
    OptimConfig cfg;
    int64_t step;          /* optimizer steps taken (AdamW bias correction) */
    size_t begin, end;     /* the owned arena block, in floats */
    float *exp_avg, *exp_avg_sq; /* [end - begin] each */
    unsigned char *owned;  /* [params count]: tensor inside the block */
    OptimJob *jobs;        /* the step's work, largest first */
    int n_jobs;
    int n_workers;         /* threads that may run jobs at once (OpenMP max threads at create) */
    float *ns_work;        /* n_workers Newton–Schulz workspaces, each sized for the largest owned matrix */
    size_t ns_work_floats; /* per worker */
    ZyGemmCtx *ns_gemm;    /* [n_workers]: the Newton–Schulz products' precision (optim_set_bf16) and scratch */
} Optimizer;

/* State of tensor p (which = 0: exp_avg, 1: exp_avg_sq); p must be owned. */
static inline float *optim_state(const Optimizer *o, const ParamInfo *p, int which) {
    return (which ? o->exp_avg_sq : o->exp_avg) + (p->offset - o->begin);
}

/* Owns the whole table. */
int optim_create(Optimizer *o, const ParamTable *t, const OptimConfig *cfg, ZyErr *err);
/* "precision": "bf16": Muon's Newton–Schulz products take bf16-rounded inputs with fp32 sums (as Muon's reference
 * implementation runs them in bf16); the momentum, the AdamW moments and the weights stay fp32. A bf16 step
 * allocates its products' scratch on first use. products: how (ZyBf16Products; FP32 for fp32 products). */
void optim_set_bf16(Optimizer *o, ZyBf16Products products);
/* Owns the tensors inside [begin, end) (block boundaries from zero1_partition). */
int optim_create_block(Optimizer *o, const ParamTable *t, const OptimConfig *cfg, size_t begin, size_t end,
                       ZyErr *err);
/* ZeRO-1: cuts the table, in arena order, into n contiguous blocks of whole tensors with about equal optimizer
 * work (Muon: Newton–Schulz FLOPs; AdamW: ~10 per element), so each rank updates one block. bounds[n+1] are arena
 * offsets (bounds[0] = 0, bounds[n] = total); a block may be empty when there are more ranks than tensors. */
void zero1_partition(const ParamTable *t, int n, size_t *bounds);
/* Sum of squares of the owned trainable gradients (table order, double). */
double grad_sumsq_owned(const Optimizer *o, const ParamTable *t);
/* Multiplies the owned trainable gradients by s. */
void grad_scale_owned(const Optimizer *o, ParamTable *t, double s);
void optim_free(Optimizer *o);
/* One update of every owned trainable tensor with learning rate lr (gradients already clipped/averaged).
 * Independent matrices and AdamW chunks run in parallel on the OpenMP threads (single-threaded BLAS inside), the
 * few matrices too large to share out run alone on threaded BLAS. Deterministic: each job's arithmetic does not
 * depend on which thread runs it; the result may depend on the thread count only through that split. */
void optim_step(Optimizer *o, ParamTable *t, double lr);
/* The same update done the simple way, one tensor after the other (gemm-only Newton–Schulz): the reference the
 * fast path is tested against. Equal up to float rounding (AdamW tensors: bit-identical). */
void optim_step_reference(Optimizer *o, ParamTable *t, double lr);

/* Muon's orthogonalisation: X ← NS5(G / (‖G‖_F + 1e-7)) on the wide orientation, written into out [m, n]
 * (out may be G). work: at least muon_workspace_floats(m, n) floats. The fast version builds X Xᵀ and A² with
 * syrk (half the FLOPs of those products); the reference is three gemms per iteration, as docs/system.md writes it. */
void newton_schulz5(float *out, const float *G, int m, int n, int steps, float *work);
void newton_schulz5_reference(float *out, const float *G, int m, int n, int steps, float *work);
size_t muon_workspace_floats(int m, int n);

/* Newton–Schulz's symmetric products (A = X Xᵀ and A² = A Aᵀ, r × r) where no syrk serves: on the GPU
 * (gpu_optim.cu), as cuBLASLt has none. The upper triangle is computed as row bands of whole GEMMs, band
 * [row0, row0 + rows) × columns [row0, r), and mirrored after; b equal bands cost (b + 1) / 2b of the whole product
 * (8 bands: 56%). (The CPU's fp32 step has syrk; its bf16 step keeps whole products: see ns5_iterate.)
 * band_rows <= 0 chooses: one band (the whole product, nothing to mirror) below NS_BAND_MIN_R rows, else at most 8
 * bands of a multiple of 128 rows and at least 256 (a band's GEMM must still fill the GPU: at r = 1,024, 4 bands,
 * 62.5%; at 2,048, 8 bands of 256, 56%); a band_rows that would need more than
 * NS_MAX_BANDS bands is widened to fit. Fills bands and returns their count (1: the whole product; 0 when r <= 0). */
enum { NS_MAX_BANDS = 64, NS_BAND_MIN_R = 1024 };
typedef struct {
    int row0, rows;
} NsBand;
int ns_symmetric_bands(int r, int band_rows, NsBand bands[NS_MAX_BANDS]);

/* Global L2 norm of all trainable gradients (accumulated in double, in table order: deterministic). */
double grad_global_norm(const ParamTable *t);
/* min(1, max_norm / (norm + 1e-6)), as torch.nn.utils.clip_grad_norm_ (1 when max_norm <= 0). */
double clip_coefficient(double max_norm, double norm);
/* Scales gradients by clip_coefficient(max_norm, norm). Returns the scale. */
double grad_clip(ParamTable *t, double max_norm, double norm);
/* Multiplies every trainable gradient by s (averaging over micro-batches). */
void grad_scale(ParamTable *t, double s);

/* Learning-rate schedules: linear warmup to peak, then WSD (stable, then a linear decay over the last
 * decay_fraction of the steps to min_ratio·peak) or cosine (from peak down to min_ratio·peak). */
typedef enum { SCHEDULE_WSD, SCHEDULE_COSINE, SCHEDULE_CONSTANT } ScheduleType;
typedef struct {
    ScheduleType type;
    double peak_lr;
    int64_t warmup_steps, total_steps;
    double decay_fraction; /* WSD */
    double min_ratio;
} Schedule;
double schedule_lr(const Schedule *s, int64_t step); /* step counts from 0 */

#endif
