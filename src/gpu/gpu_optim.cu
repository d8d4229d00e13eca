/* gpu_optim: the element-wise ops of gpu_kernels.h (bf16 rounding, scaling, sum of squares) and the GPU optimizer
 * (gpu_optim.h): Muon with Newton–Schulz 5 through gpu_gemm, AdamW in one launch over every owned AdamW tensor,
 * global-norm clipping computed on the device.
 *
 * Exactness: the element-wise arithmetic is written with the _rn intrinsics, one IEEE operation per C operation of
 * src/optim.c in the same order, so the compiler cannot contract a product and a sum into an FMA: the momentum, the
 * AdamW moments and the AdamW weights come out with the CPU's bits (the CPU build has no contraction: ISO C mode).
 * Determinism: every sum is over fixed chunks (their count fixed by the table, not the device), each chunk reduced
 * in a fixed tree (block_sum_d), the chunks' sums then added in order by one block. No atomics. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_runtime.h"
#include "gpu_common.cuh"
#include "gpu/gpu_optim.h" /* before gpu.h: see there */
#include "gpu/gpu.h"
#include "gpu/gpu_kernels.h"

/* Elements per AdamW block, per partial sum of the gradient norm, per partial sum of a Muon matrix's norm. */
#define GO_ADAMW_CHUNK 16384
#define GO_SUM_CHUNK 65536
#define GO_NS_CHUNK 16384
#define GO_THREADS 256

/* zy_f32_to_bf16 (util.h), bit for bit: nearest even; a NaN keeps its top bits and is made quiet. Inf stays inf;
 * a finite value that rounds past the largest bf16 becomes inf, as on the CPU. */
__device__ __forceinline__ uint16_t go_bf16_bits(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* ---- elementwise (gpu_kernels.h) ---- */

__global__ void go_f32_to_bf16_kernel(uint16_t *dst, const float *src, long n) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        dst[i] = go_bf16_bits(src[i]);
}

__global__ void go_scale_kernel(float *x, float a, long n) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        x[i] = __fmul_rn(x[i], a);
}

/* One block: each thread a fixed stride of x, then the block's fixed tree; *out += the sum. */
__global__ void go_sumsq_block_kernel(double *out, const float *x, long n) {
    __shared__ double sh[32];
    double acc = 0;
    for (long i = threadIdx.x; i < n; i += blockDim.x) {
        const double v = (double)x[i];
        acc += v * v;
    }
    const double s = block_sum_d(acc, sh);
    if (threadIdx.x == 0) *out += s;
}

extern "C" void gk_f32_to_bf16(GkStream s, uint16_t *dst, const float *src, long n) {
    if (n <= 0) return;
    go_f32_to_bf16_kernel<<<gk_blocks(n, GO_THREADS), GO_THREADS, 0, s>>>(dst, src, n);
    GK_LAUNCH_CHECK();
}

extern "C" void gk_scale(GkStream s, float *x, float a, long n) {
    if (n <= 0) return;
    go_scale_kernel<<<gk_blocks(n, GO_THREADS), GO_THREADS, 0, s>>>(x, a, n);
    GK_LAUNCH_CHECK();
}

extern "C" void gk_sumsq(GkStream s, double *out, const float *x, long n) {
    if (n <= 0) return;
    go_sumsq_block_kernel<<<1, 1024, 0, s>>>(out, x, n);
    GK_LAUNCH_CHECK();
}

/* ---- optimizer kernels ---- */

/* The step's constants, as step_consts in optim.c (k[0] at lr, k[1] at lr × router_lr_scale). */
typedef struct {
    float mu, muon_decay;
    float step_size, eps, b1, b2, inv_bc2, adam_decay;
    double lr;
} GoStep;

/* One block per chunk: adamw_elem of optim.c, operation for operation. */
__global__ void go_adamw_kernel(float *w, const float *g, float *m, float *v, uint64_t begin,
                                const GpuOptimChunk *chunks, GoStep k0, GoStep k1) {
    const GpuOptimChunk c = chunks[blockIdx.x];
    const GoStep k = (c.flags & GPU_OPTIM_ROUTER) ? k1 : k0;
    const float decay = (c.flags & GPU_OPTIM_DECAY) ? k.adam_decay : 1.0f;
    const float omb1 = __fsub_rn(1.0f, k.b1), omb2 = __fsub_rn(1.0f, k.b2);
    for (uint32_t i = threadIdx.x; i < c.len; i += blockDim.x) {
        const uint64_t o = c.off + i, s = o - begin;
        const float gi = g[o];
        float wi = w[o], mi = m[s], vi = v[s];
        wi = __fmul_rn(wi, decay);                                                 /* w *= decay */
        mi = __fadd_rn(mi, __fmul_rn(__fsub_rn(gi, mi), omb1));                    /* m += (g − m)(1 − β1) */
        vi = __fadd_rn(__fmul_rn(k.b2, vi), __fmul_rn(__fmul_rn(omb2, gi), gi));  /* v = β2 v + (1 − β2) g g */
        const float denom = __fadd_rn(__fmul_rn(__fsqrt_rn(vi), k.inv_bc2), k.eps);
        wi = __fsub_rn(wi, __fmul_rn(k.step_size, __fdiv_rn(mi, denom)));         /* w −= step · m / denom */
        w[o] = wi;
        m[s] = mi;
        v[s] = vi;
    }
}

/* One block per chunk of the owned trainable gradients: partial[b] = Σ g² over chunk b. */
__global__ void go_chunk_sumsq_kernel(double *partial, const float *g, const GpuOptimChunk *chunks) {
    __shared__ double sh[32];
    const GpuOptimChunk c = chunks[blockIdx.x];
    double acc = 0;
    for (uint32_t i = threadIdx.x; i < c.len; i += blockDim.x) {
        const double v = (double)g[c.off + i];
        acc += v * v;
    }
    const double s = block_sum_d(acc, sh);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

/* One block: *out = Σ partial[0, n), fixed order. */
__global__ void go_sum_partials_kernel(double *out, const double *partial, int n) {
    __shared__ double sh[32];
    double acc = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) acc += partial[i];
    const double s = block_sum_d(acc, sh);
    if (threadIdx.x == 0) *out = s;
}

/* Muon's momentum and Nesterov vector (muon_job): M ← μM + G, X = G + μM; partial[b] = Σ X² over chunk b of
 * GO_NS_CHUNK elements. */
__global__ void go_muon_momentum_kernel(float *mom, const float *g, float *X, long len, float mu, double *partial) {
    __shared__ double sh[32];
    const long lo = blockIdx.x * (long)GO_NS_CHUNK, hi = lo + GO_NS_CHUNK < len ? lo + GO_NS_CHUNK : len;
    double acc = 0;
    for (long i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        const float gi = g[i];
        const float mi = __fadd_rn(__fmul_rn(mu, mom[i]), gi);
        const float x = __fadd_rn(gi, __fmul_rn(mu, mi));
        mom[i] = mi;
        X[i] = x;
        const double xd = (double)x;
        acc += xd * xd;
    }
    const double s = block_sum_d(acc, sh);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

/* The start of one Newton–Schulz iteration: Xn = a·X (the sum the product B X adds onto) and, for bf16 products,
 * X16 = bf16(X). With sumsq (the first iteration), X is first normalised: X *= 1 / (‖X‖_F + 1e-7), the factor
 * computed from the device double exactly as newton_schulz5 does on the host. */
__global__ void go_ns_prep_kernel(float *X, float *Xn, uint16_t *X16, long len, float a, const double *sumsq) {
    const float inv = sumsq ? (float)(1.0 / (sqrt(*sumsq) + 1e-7)) : 1.0f;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < len; i += (long)gridDim.x * blockDim.x) {
        float x = X[i];
        if (sumsq) {
            x = __fmul_rn(x, inv);
            X[i] = x;
        }
        Xn[i] = __fmul_rn(a, x);
        if (X16) X16[i] = go_bf16_bits(x);
    }
}

/* B = b·A (the sum c·A² adds onto) and, for bf16 products, A16 = bf16(A). */
__global__ void go_ns_b_kernel(float *B, const float *A, uint16_t *A16, long n, float b) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        const float x = A[i];
        B[i] = __fmul_rn(b, x);
        if (A16) A16[i] = go_bf16_bits(x);
    }
}

/* W ← W − (scale·O + decay·W) */
__global__ void go_muon_apply_kernel(float *w, const float *O, long len, float scale, float decay) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < len; i += (long)gridDim.x * blockDim.x) {
        const float wi = w[i];
        w[i] = __fsub_rn(wi, __fadd_rn(__fmul_rn(scale, O[i]), __fmul_rn(decay, wi)));
    }
}

/* d_grads *= clip_coefficient(max_norm, sqrt(*sumsq)) when that is below 1 (a NaN norm: no scaling, as the CPU). */
__global__ void go_clip_kernel(float *x, long n, const double *sumsq, double max_norm) {
    const double coef = max_norm / (sqrt(*sumsq) + 1e-6);
    if (!(coef < 1.0)) return;
    const float s = (float)coef;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        x[i] = __fmul_rn(x[i], s);
}

/* ---- host side ---- */

/* matrix_shape of optim.c: one matrix [m, n], or a stack of them (experts: [E, m, n]). */
static void go_matrix_shape(const ParamInfo *p, int *count, int *m, int *n) {
    if (p->ndim == 3) {
        *count = (int)p->shape[0];
        *m = (int)p->shape[1];
        *n = (int)p->shape[2];
    } else {
        *count = 1;
        *m = (int)p->shape[0];
        *n = p->ndim > 1 ? (int)p->shape[1] : 1;
    }
}

static GoStep go_step_consts(const GpuOptimizer *o, double lr) {
    const double b1 = o->cfg.beta1, b2 = o->cfg.beta2;
    const double bc1 = 1.0 - pow(b1, (double)o->step), bc2_sqrt = sqrt(1.0 - pow(b2, (double)o->step));
    GoStep k;
    k.mu = (float)o->cfg.muon_momentum;
    k.muon_decay = (float)(lr * o->cfg.weight_decay);
    k.step_size = (float)(lr / bc1);
    k.eps = (float)o->cfg.eps;
    k.b1 = (float)b1;
    k.b2 = (float)b2;
    k.inv_bc2 = (float)(1.0 / bc2_sqrt);
    k.adam_decay = (float)(1.0 - lr * o->cfg.weight_decay);
    k.lr = lr;
    return k;
}

/* Appends the chunks of [off, off + numel) (chunk elements each) to list (when non-NULL); returns the new count. */
static int go_add_chunks(GpuOptimChunk *list, int n, size_t off, size_t numel, size_t chunk, uint32_t flags) {
    for (size_t s = 0; s < numel; s += chunk, n++)
        if (list) {
            list[n].off = (uint64_t)(off + s);
            list[n].len = (uint32_t)(numel - s < chunk ? numel - s : chunk);
            list[n].flags = flags;
        }
    return n;
}

/* Fills the host lists (when non-NULL) and the counts. */
static void go_build(GpuOptimizer *o, const ParamTable *t, GpuMuonMatrix *muon, GpuOptimChunk *adamw,
                     GpuOptimChunk *grad, int *n_muon, int *n_adamw, int *n_grad) {
    int nm = 0, na = 0, ng = 0;
    for (int i = 0; i < t->count; i++) {
        const ParamInfo *p = &t->info[i];
        if (!param_trainable(p) || p->numel == 0) continue;
        if (!(p->offset >= o->begin && p->offset + p->numel <= o->end)) continue;
        const int router = param_is_router(p);
        ng = go_add_chunks(grad, ng, p->offset, p->numel, GO_SUM_CHUNK, 0);
        if (p->kind == PARAM_MUON && !o->cfg.adamw_only) {
            int count, rows, cols;
            go_matrix_shape(p, &count, &rows, &cols);
            const size_t len = (size_t)rows * cols;
            for (int k = 0; k < count; k++, nm++)
                if (muon) {
                    muon[nm].off = p->offset + (size_t)k * len;
                    muon[nm].m = rows;
                    muon[nm].n = cols;
                    muon[nm].router = router;
                }
        } else {
            const uint32_t flags = (p->ndim >= 2 ? GPU_OPTIM_DECAY : 0) | (router ? GPU_OPTIM_ROUTER : 0);
            na = go_add_chunks(adamw, na, p->offset, p->numel, GO_ADAMW_CHUNK, flags);
        }
    }
    *n_muon = nm;
    *n_adamw = na;
    *n_grad = ng;
}

static void *go_alloc(size_t n, size_t elem, const char *what, int *failed, ZyErr *err) {
    if (*failed) return NULL;
    void *p = gpu_alloc((n ? n : 1) * elem, what, err);
    if (!p) *failed = 1;
    return p;
}

extern "C" int gpu_optim_create_block(GpuOptimizer *o, GpuCtx *g, const ParamTable *t, const OptimConfig *cfg,
                                      size_t begin, size_t end, ZyErr *err) {
    memset(o, 0, sizeof *o);
    o->cfg = *cfg;
    o->begin = begin;
    o->end = end > begin ? end : begin;
    int nm, na, ng;
    go_build(o, t, NULL, NULL, NULL, &nm, &na, &ng);
    o->muon = (GpuMuonMatrix *)calloc((size_t)(nm > 0 ? nm : 1), sizeof *o->muon);
    GpuOptimChunk *adamw = (GpuOptimChunk *)calloc((size_t)(na > 0 ? na : 1), sizeof *adamw);
    GpuOptimChunk *grad = (GpuOptimChunk *)calloc((size_t)(ng > 0 ? ng : 1), sizeof *grad);
    if (!o->muon || !adamw || !grad) {
        free(adamw);
        free(grad);
        gpu_optim_free(o);
        return zy_fail(err, "out of memory building the GPU optimizer's tables");
    }
    go_build(o, t, o->muon, adamw, grad, &o->n_muon, &o->n_adamw_chunks, &o->n_grad_chunks);
    size_t ns_len = 0, ns_rr = 0;
    for (int j = 0; j < o->n_muon; j++) {
        const size_t m = (size_t)o->muon[j].m, n = (size_t)o->muon[j].n, r = m < n ? m : n;
        if (m * n > ns_len) ns_len = m * n;
        if (r * r > ns_rr) ns_rr = r * r;
    }
    o->ns_len = ns_len;
    o->ns_rr = ns_rr;
    const size_t ns_parts = (ns_len + GO_NS_CHUNK - 1) / GO_NS_CHUNK;
    o->n_partial = (int)(ns_parts > (size_t)o->n_grad_chunks ? ns_parts : (size_t)o->n_grad_chunks);
    const size_t len = o->end - o->begin;
    int failed = 0;
    o->exp_avg = (float *)go_alloc(len, sizeof(float), "optimizer exp_avg", &failed, err);
    o->exp_avg_sq = (float *)go_alloc(len, sizeof(float), "optimizer exp_avg_sq", &failed, err);
    o->adamw_chunks = (GpuOptimChunk *)go_alloc((size_t)o->n_adamw_chunks, sizeof *adamw, "AdamW chunks", &failed, err);
    o->grad_chunks = (GpuOptimChunk *)go_alloc((size_t)o->n_grad_chunks, sizeof *grad, "gradient chunks", &failed, err);
    o->ns_x = (float *)go_alloc(ns_len, sizeof(float), "Newton-Schulz X", &failed, err);
    o->ns_xn = (float *)go_alloc(ns_len, sizeof(float), "Newton-Schulz X'", &failed, err);
    o->ns_a = (float *)go_alloc(ns_rr, sizeof(float), "Newton-Schulz A", &failed, err);
    o->ns_b = (float *)go_alloc(ns_rr, sizeof(float), "Newton-Schulz B", &failed, err);
    o->ns_x16 = (uint16_t *)go_alloc(ns_len, sizeof(uint16_t), "Newton-Schulz bf16 X", &failed, err);
    o->ns_m16 = (uint16_t *)go_alloc(ns_rr, sizeof(uint16_t), "Newton-Schulz bf16 A", &failed, err);
    o->partial = (double *)go_alloc((size_t)o->n_partial, sizeof(double), "optimizer partial sums", &failed, err);
    o->ns_sumsq = (double *)go_alloc(1, sizeof(double), "Newton-Schulz norm", &failed, err);
    if (!failed && o->n_adamw_chunks &&
        gpu_upload(g, o->adamw_chunks, adamw, (size_t)o->n_adamw_chunks * sizeof *adamw, err))
        failed = 1;
    if (!failed && o->n_grad_chunks &&
        gpu_upload(g, o->grad_chunks, grad, (size_t)o->n_grad_chunks * sizeof *grad, err))
        failed = 1;
    free(adamw);
    free(grad);
    if (failed) {
        gpu_optim_free(o);
        return zy_wrap(err, "GPU optimizer");
    }
    return 0;
}

extern "C" int gpu_optim_create(GpuOptimizer *o, GpuCtx *g, const ParamTable *t, const OptimConfig *cfg,
                                ZyErr *err) {
    return gpu_optim_create_block(o, g, t, cfg, 0, t->total, err);
}

extern "C" void gpu_optim_free(GpuOptimizer *o) {
    void *dev[] = {o->exp_avg, o->exp_avg_sq, o->adamw_chunks, o->grad_chunks, o->ns_x,     o->ns_xn,
                   o->ns_a,    o->ns_b,       o->ns_x16,       o->ns_m16,      o->partial, o->ns_sumsq};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        if (dev[i]) gpu_free(dev[i]);
    free(o->muon);
    memset(o, 0, sizeof *o);
}

/* One Muon matrix (muon_job of optim.c): momentum and Nesterov vector with its norm, Newton–Schulz on the
 * normalised X in the matrix's own layout [m, n] (ns5_iterate's whole-GEMM form: when tall, the wide orientation
 * is Xᵀ, so X Xᵀ, B X become Xᵀ X, X B, B symmetric), then W ← W − (0.2·√max(m,n)·lr·O + lr·wd·W). */
static int go_muon_matrix(GpuOptimizer *o, GpuCtx *g, float *d_params, const float *d_grads, const GpuMuonMatrix *mx,
                          const GoStep *k, ZyErr *err) {
    const float a = 3.4445f, b = -4.7750f, c = 2.0315f;
    const int m = mx->m, n = mx->n, tall = m > n, r = tall ? n : m, kk = tall ? m : n;
    const long len = (long)m * n, rr = (long)r * r;
    if (len <= 0) return 0;
    gpuStream_t s = g->stream;
    float *w = d_params + mx->off, *mom = o->exp_avg + (mx->off - o->begin);
    const float *gr = d_grads + mx->off;
    float *X = o->ns_x, *Xn = o->ns_xn, *A = o->ns_a, *B = o->ns_b;
    const int bf = g->bf16 != 0;
    uint16_t *X16 = bf ? o->ns_x16 : NULL, *M16 = bf ? o->ns_m16 : NULL;
    const int parts = (int)((len + GO_NS_CHUNK - 1) / GO_NS_CHUNK);
    go_muon_momentum_kernel<<<parts, GO_THREADS, 0, s>>>(mom, gr, X, len, k->mu, o->partial);
    go_sum_partials_kernel<<<1, 1024, 0, s>>>(o->ns_sumsq, o->partial, parts);
    const int steps = o->cfg.muon_ns_steps;
    if (steps <= 0) /* no iteration: the output is the normalised input */
        go_ns_prep_kernel<<<gk_blocks(len, GO_THREADS), GO_THREADS, 0, s>>>(X, Xn, NULL, len, a, o->ns_sumsq);
    for (int it = 0; it < steps; it++) {
        go_ns_prep_kernel<<<gk_blocks(len, GO_THREADS), GO_THREADS, 0, s>>>(X, Xn, X16, len, a,
                                                                           it == 0 ? o->ns_sumsq : NULL);
        int rc;
        if (tall) /* A = Xᵀ X */
            rc = gpu_gemm(g, 1, 0, r, r, kk, 1.0f, X, X16, n, X, X16, n, 0.0f, A, r, err);
        else /* A = X Xᵀ */
            rc = gpu_gemm(g, 0, 1, r, r, kk, 1.0f, X, X16, n, X, X16, n, 0.0f, A, r, err);
        if (rc) return rc;
        go_ns_b_kernel<<<gk_blocks(rr, GO_THREADS), GO_THREADS, 0, s>>>(B, A, M16, rr, b);
        if (gpu_gemm(g, 0, 0, r, r, r, c, A, M16, r, A, M16, r, 1.0f, B, r, err)) return -1; /* B = bA + cA² */
        if (bf) gk_f32_to_bf16(s, M16, B, rr);
        if (tall) /* Xᵀ = aXᵀ + Xᵀ B */
            rc = gpu_gemm(g, 0, 0, m, n, n, 1.0f, X, X16, n, B, M16, r, 1.0f, Xn, n, err);
        else /* X = aX + B X */
            rc = gpu_gemm(g, 0, 0, m, n, m, 1.0f, B, M16, r, X, X16, n, 1.0f, Xn, n, err);
        if (rc) return rc;
        float *tmp = X;
        X = Xn;
        Xn = tmp;
    }
    const float scale = (float)(0.2 * sqrt((double)(m > n ? m : n)) * k->lr);
    go_muon_apply_kernel<<<gk_blocks(len, GO_THREADS), GO_THREADS, 0, s>>>(w, X, len, scale, k->muon_decay);
    return 0;
}

extern "C" int gpu_optim_step(GpuOptimizer *o, GpuCtx *g, const ParamTable *t, float *d_params, const float *d_grads,
                              double lr, ZyErr *err) {
    o->step++;
    const GoStep k[2] = {go_step_consts(o, lr), go_step_consts(o, lr * o->cfg.router_lr_scale)};
    gpuStream_t s = g->stream;
    if (o->n_adamw_chunks > 0)
        go_adamw_kernel<<<o->n_adamw_chunks, GO_THREADS, 0, s>>>(d_params, d_grads, o->exp_avg, o->exp_avg_sq,
                                                                 (uint64_t)o->begin, o->adamw_chunks, k[0], k[1]);
    for (int j = 0; j < o->n_muon; j++)
        if (go_muon_matrix(o, g, d_params, d_grads, &o->muon[j], &k[o->muon[j].router], err))
            return zy_wrap(err, "Muon step, matrix %d of %d (%dx%d)", j, o->n_muon, o->muon[j].m, o->muon[j].n);
    return 0;
}

extern "C" int gpu_grad_sumsq(GpuOptimizer *o, GpuCtx *g, const float *d_grads, double *d_out) {
    gpuStream_t s = g->stream;
    if (o->n_grad_chunks <= 0) {
        gpu_memset_async(g, d_out, 0, sizeof(double));
        return 0;
    }
    go_chunk_sumsq_kernel<<<o->n_grad_chunks, GO_THREADS, 0, s>>>(o->partial, d_grads, o->grad_chunks);
    go_sum_partials_kernel<<<1, 1024, 0, s>>>(d_out, o->partial, o->n_grad_chunks);
    return 0;
}

extern "C" void gpu_grad_clip(GpuCtx *g, float *d_grads, size_t n, const double *d_sumsq, double max_norm) {
    if (max_norm <= 0 || n == 0) return; /* clip_coefficient: 1 */
    go_clip_kernel<<<gk_blocks((long)n, GO_THREADS), GO_THREADS, 0, g->stream>>>(d_grads, (long)n, d_sumsq, max_norm);
}

extern "C" int gpu_optim_download(GpuOptimizer *o, GpuCtx *g, float *exp_avg, float *exp_avg_sq, ZyErr *err) {
    const size_t bytes = (o->end - o->begin) * sizeof(float);
    if (!bytes) return 0;
    if (gpu_download(g, exp_avg, o->exp_avg, bytes, err) || gpu_download(g, exp_avg_sq, o->exp_avg_sq, bytes, err))
        return zy_wrap(err, "downloading the optimizer state");
    return 0;
}

extern "C" int gpu_optim_upload(GpuOptimizer *o, GpuCtx *g, const float *exp_avg, const float *exp_avg_sq,
                                ZyErr *err) {
    const size_t bytes = (o->end - o->begin) * sizeof(float);
    if (!bytes) return 0;
    if (gpu_upload(g, o->exp_avg, exp_avg, bytes, err) || gpu_upload(g, o->exp_avg_sq, exp_avg_sq, bytes, err))
        return zy_wrap(err, "uploading the optimizer state");
    return 0;
}
