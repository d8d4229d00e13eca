/* gpu_optim: the element-wise ops of gpu_kernels.h (bf16 rounding, scaling, sum of squares) and the GPU optimizer
 * (gpu_optim.h): Muon with Newton–Schulz 5 through gpu_gemm_batched, one launch per step of a whole group of
 * same-shape matrices, AdamW in one launch over every owned AdamW tensor (gk_adamw, gpu_adamw.cu), global-norm
 * clipping computed on the device; with params16 set, the AdamW pass and the Muon update also write the bf16 copy of
 * the weights they change.
 *
 * Launches per Muon group: momentum + per-chunk norms, per-matrix norm sums, then fp32: 5 × (prep, X Xᵀ, B init,
 * A², B X) and the update, 28; bf16: the rounded start, 5 × (X Xᵀ, bA + cA², aX + B X: the iterates stay bf16, the
 * coefficients in the products' alpha / beta, no elementwise pass), the widened result and the update, 20 (33 before
 * 2026-11-30, when bf16 runs kept fp32 iterates and rounded them before each product). The 1.0B bench-gpu
 * model's 738 Muon matrices form 35 groups (13 of 24–25 [1024, 1024]: q, o, expert down; 17 of 16–17 [2048, 1024]
 * expert gate_up; k; v_current + v_delayed; the router's down_proj, fc1 + fc2, out_proj): 701 launches per step
 * with bf16 products (24,355 before grouping), 981 in fp32 (20,665), ~510 MiB of scratch instead of ~30.
 *
 * Exactness: the element-wise arithmetic is written with the _rn intrinsics, one IEEE operation per C operation of
 * src/optim/optim.c in the same order, so the compiler cannot contract a product and a sum into an FMA: the momentum, the
 * AdamW moments and the AdamW weights come out with the CPU's bits (the CPU build has no contraction: ISO C mode).
 * Determinism: every sum is over fixed chunks (their count fixed by the table, not the device), each chunk reduced
 * in a fixed tree (block_sum_d), the chunks' sums then added in order by one block. No atomics.
 * Every launch goes through GK_LAUNCH, so the CPU emulator runs this source (tests/gpu/emu/test_optim.cpp). */
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_common.cuh"
#include "gpu/gpu_optim.h" /* before gpu.h: see there */
#include "gpu/gpu.h"
#include "gpu/gpu_kernels.h"

/* Elements per AdamW chunk (a block of gk_adamw), per partial sum of the gradient norm, per partial sum of a Muon
 * matrix's norm. */
#define GO_ADAMW_CHUNK 16384
#define GO_SUM_CHUNK 65536
#define GO_NS_CHUNK 16384
#define GO_THREADS 256

/* ---- elementwise (gpu_kernels.h) ---- */

__global__ void go_f32_to_bf16_kernel(uint16_t *dst, const float *src, long n) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        dst[i] = gk_bf16_bits(src[i]);
}

/* The same four values at a time (src 16-byte, dst 8-byte aligned): one 128-bit load and one 64-bit store a thread
 * instead of four 32-bit loads and four 16-bit stores; block 0 also does the n % 4 tail. Same bits. */
__global__ void go_f32_to_bf16_vec4_kernel(uint16_t *dst, const float *src, long n) {
    const long n4 = n / 4;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n4; i += (long)gridDim.x * blockDim.x) {
        const float4 v = reinterpret_cast<const float4 *>(src)[i];
        ushort4 o;
        o.x = gk_bf16_bits(v.x), o.y = gk_bf16_bits(v.y), o.z = gk_bf16_bits(v.z), o.w = gk_bf16_bits(v.w);
        reinterpret_cast<ushort4 *>(dst)[i] = o;
    }
    if (blockIdx.x == 0 && threadIdx.x < n - n4 * 4) dst[n4 * 4 + threadIdx.x] = gk_bf16_bits(src[n4 * 4 + threadIdx.x]);
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
    if (((uintptr_t)src & 15u) == 0 && ((uintptr_t)dst & 7u) == 0 && n >= 4)
        GK_LAUNCH(go_f32_to_bf16_vec4_kernel, gk_blocks(n / 4, GO_THREADS), GO_THREADS, 0, s, dst, src, n);
    else
        GK_LAUNCH(go_f32_to_bf16_kernel, gk_blocks(n, GO_THREADS), GO_THREADS, 0, s, dst, src, n);
    GK_LAUNCH_CHECK();
}

/* bf16 → fp32 is exact: the bits move up 16 places (NaN payloads included). */
__global__ void go_bf16_to_f32_kernel(float *dst, const uint16_t *src, long n) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        dst[i] = gk_bf16_float(src[i]);
}

extern "C" void gk_bf16_to_f32(GkStream s, float *dst, const uint16_t *src, long n) {
    if (n <= 0) return;
    GK_LAUNCH(go_bf16_to_f32_kernel, gk_blocks(n, GO_THREADS), GO_THREADS, 0, s, dst, src, n);
    GK_LAUNCH_CHECK();
}

/* dst += widened src: cuDNN's attention backward adds its bf16 gradients into the caller's fp32 ones. */
__global__ void go_add_bf16_to_f32_kernel(float *dst, const uint16_t *src, long n) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        dst[i] += gk_bf16_float(src[i]);
}

extern "C" void gk_add_bf16_to_f32(GkStream s, float *dst, const uint16_t *src, long n) {
    if (n <= 0) return;
    GK_LAUNCH(go_add_bf16_to_f32_kernel, gk_blocks(n, GO_THREADS), GO_THREADS, 0, s, dst, src, n);
    GK_LAUNCH_CHECK();
}

extern "C" void gk_scale(GkStream s, float *x, float a, long n) {
    if (n <= 0) return;
    GK_LAUNCH(go_scale_kernel, gk_blocks(n, GO_THREADS), GO_THREADS, 0, s, x, a, n);
    GK_LAUNCH_CHECK();
}

extern "C" void gk_sumsq(GkStream s, double *out, const float *x, long n) {
    if (n <= 0) return;
    GK_LAUNCH(go_sumsq_block_kernel, 1, 1024, 0, s, out, x, n);
    GK_LAUNCH_CHECK();
}

/* ---- optimizer kernels ---- */

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

/* Block y: out[y] = Σ partial[y·n, y·n + n), fixed order (one block per Muon matrix of a group; one block for the
 * gradient norm). */
__global__ void go_sum_partials_kernel(double *out, const double *partial, int n) {
    __shared__ double sh[32];
    const double *p = partial + (long)blockIdx.x * n;
    double acc = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) acc += p[i];
    const double s = block_sum_d(acc, sh);
    if (threadIdx.x == 0) out[blockIdx.x] = s;
}

/* The Muon kernels below run over a group of matrices at once: blockIdx.y is the matrix (its arena offset offs[y];
 * its scratch copies at y·ls floats in X / X' / X16 and y·rs in A / B / A16), blockIdx.x a piece of it. Each
 * matrix's arithmetic is the one-matrix step's, element for element, whatever the group. */

/* Muon's momentum and Nesterov vector (muon_job): M ← μM + G, X = G + μM; partial[y·gridDim.x + b] = Σ X² over
 * chunk b (GO_NS_CHUNK elements) of matrix y. */
__global__ void go_muon_momentum_kernel(float *exp_avg, uint64_t begin, const float *grads, const uint64_t *offs,
                                        float *Xs, long ls, long len, float mu, float grad_scale,
                                        double *partial) {
    __shared__ double sh[32];
    const uint64_t off = offs[blockIdx.y];
    float *mom = exp_avg + (off - begin), *X = Xs + (long)blockIdx.y * ls;
    const float *g = grads + off;
    const long lo = blockIdx.x * (long)GO_NS_CHUNK, hi = lo + GO_NS_CHUNK < len ? lo + GO_NS_CHUNK : len;
    double acc = 0;
    for (long i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        const float gi = __fmul_rn(g[i], grad_scale); /* the clipping multiply (GkOptimStep.grad_scale) */
        const float mi = __fadd_rn(__fmul_rn(mu, mom[i]), gi);
        const float x = __fadd_rn(gi, __fmul_rn(mu, mi));
        mom[i] = mi;
        X[i] = x;
        const double xd = (double)x;
        acc += xd * xd;
    }
    const double s = block_sum_d(acc, sh);
    if (threadIdx.x == 0) partial[(long)blockIdx.y * gridDim.x + blockIdx.x] = s;
}

/* The start of one fp32 Newton–Schulz iteration: X' = a·X (the sum the product B X adds onto), or, for bf16
 * products (X' NULL), the bf16 start X16 = bf16(X). With sumsq (the first iteration), X is first normalised:
 * X *= 1 / (‖X‖_F + 1e-7), the factor computed from matrix y's device double sumsq[y] exactly as newton_schulz5 does
 * on the host. */
__global__ void go_ns_prep_kernel(float *Xs, float *Xns, uint16_t *X16s, long ls, long len, float a,
                                  const double *sumsq) {
    const float inv = sumsq ? (float)(1.0 / (sqrt(sumsq[blockIdx.y]) + 1e-7)) : 1.0f;
    const long base = (long)blockIdx.y * ls;
    float *X = Xs + base, *Xn = Xns ? Xns + base : NULL;
    uint16_t *X16 = X16s ? X16s + base : NULL;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < len; i += (long)gridDim.x * blockDim.x) {
        float x = X[i];
        if (sumsq) {
            x = __fmul_rn(x, inv);
            X[i] = x;
        }
        if (Xn) Xn[i] = __fmul_rn(a, x);
        if (X16) X16[i] = gk_bf16_bits(x);
    }
}

/* B = b·A (the sum c·A² adds onto): the fp32 iteration's elementwise step. */
__global__ void go_ns_b_kernel(float *Bs, const float *As, long rs, long n, float b) {
    const long base = (long)blockIdx.y * rs;
    float *B = Bs + base;
    const float *A = As + base;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        B[i] = __fmul_rn(b, A[i]);
}

/* W ← W − (scale·O + decay·W) */
__global__ void go_muon_apply_kernel(float *params, uint16_t *params16, const uint64_t *offs, const float *Os,
                                     long ls, long len, float scale, float decay) {
    float *w = params + offs[blockIdx.y];
    uint16_t *w16 = params16 ? params16 + offs[blockIdx.y] : NULL;
    const float *O = Os + (long)blockIdx.y * ls;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < len; i += (long)gridDim.x * blockDim.x) {
        const float wi = w[i], wn = __fsub_rn(wi, __fadd_rn(__fmul_rn(scale, O[i]), __fmul_rn(decay, wi)));
        w[i] = wn;
        if (w16) w16[i] = gk_bf16_bits(wn); /* the bf16 products' copy (GpuOptimizer.params16) */
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

static GkOptimStep go_step_consts(const GpuOptimizer *o, double lr, float grad_scale) {
    const double b1 = o->cfg.beta1, b2 = o->cfg.beta2;
    const double bc1 = 1.0 - pow(b1, (double)o->step), bc2_sqrt = sqrt(1.0 - pow(b2, (double)o->step));
    GkOptimStep k;
    k.mu = (float)o->cfg.muon_momentum;
    k.muon_decay = (float)(lr * o->cfg.weight_decay);
    k.step_size = (float)(lr / bc1);
    k.eps = (float)o->cfg.eps;
    k.b1 = (float)b1;
    k.b2 = (float)b2;
    k.inv_bc2 = (float)(1.0 / bc2_sqrt);
    k.adam_decay = (float)(1.0 - lr * o->cfg.weight_decay);
    k.grad_scale = grad_scale;
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

/* Scratch stride of a group's matrices: whole 256-byte lines, so every matrix of a batched product starts aligned. */
static size_t go_pad(size_t floats) { return (floats + 63) & ~(size_t)63; }

/* Newton–Schulz scratch bytes of one [m, n] matrix in a group: X, X' (fp32) and X16, A, B (fp32) and A16, and its
 * partial sums. */
static size_t go_matrix_scratch(int m, int n) {
    const size_t r = (size_t)(m < n ? m : n), len = (size_t)m * n;
    const size_t per_elem = 2 * sizeof(float) + sizeof(uint16_t);
    return (go_pad(len) + go_pad(r * r)) * per_elem + (len + GO_NS_CHUNK - 1) / GO_NS_CHUNK * sizeof(double);
}

/* Most matrices one group may hold: the scratch budget, grid limits, and max_batch (> 0). */
#define GO_MAX_BATCH 4096 /* well inside the grid's y limit (65535) */
static int go_group_limit(int m, int n, int max_batch) {
    size_t cap = GPU_OPTIM_GROUP_BYTES / go_matrix_scratch(m, n);
    if (cap > GO_MAX_BATCH) cap = GO_MAX_BATCH;
    if (max_batch > 0 && cap > (size_t)max_batch) cap = (size_t)max_batch;
    return cap < 1 ? 1 : (int)cap;
}

/* Sorts the Muon matrices (table order in `in`) into groups: the matrices of one key (shape, router) in table order,
 * in near-equal groups of at most go_group_limit, the keys in order of first appearance. Fills out (group order) and
 * groups (when non-NULL); returns the group count. */
static int go_group(const GpuMuonMatrix *in, int nm, int max_batch, GpuMuonMatrix *out, GpuMuonGroup *groups,
                    unsigned char *taken) {
    int ng = 0, placed = 0;
    memset(taken, 0, (size_t)(nm > 0 ? nm : 1));
    for (int i = 0; i < nm; i++) {
        if (taken[i]) continue;
        const GpuMuonMatrix *key = &in[i];
        int count = 0;
        for (int j = i; j < nm; j++)
            count += !taken[j] && in[j].m == key->m && in[j].n == key->n && in[j].router == key->router;
        const int limit = go_group_limit(key->m, key->n, max_batch), parts = (count + limit - 1) / limit;
        int j = i;
        for (int p = 0; p < parts; p++, ng++) {
            const int size = count / parts + (p < count % parts); /* near-equal sizes: few distinct batch counts */
            if (groups) {
                groups[ng].first = placed;
                groups[ng].count = size;
                groups[ng].m = key->m;
                groups[ng].n = key->n;
                groups[ng].router = key->router;
            }
            for (int k = 0; k < size; j++) {
                if (taken[j] || in[j].m != key->m || in[j].n != key->n || in[j].router != key->router) continue;
                taken[j] = 1;
                if (out) out[placed] = in[j];
                placed++, k++;
            }
        }
    }
    return ng;
}

static void *go_alloc(size_t n, size_t elem, const char *what, int *failed, ZyErr *err) {
    if (*failed) return NULL;
    void *p = gpu_alloc((n ? n : 1) * elem, what, err);
    if (!p) *failed = 1;
    return p;
}

extern "C" int gpu_optim_create_grouped(GpuOptimizer *o, GpuCtx *g, const ParamTable *t, const OptimConfig *cfg,
                                        size_t begin, size_t end, int max_batch, ZyErr *err) {
    memset(o, 0, sizeof *o);
    /* on (default) | off: Newton–Schulz's symmetric products in bands (ns_symmetric_bands) or whole */
    const char *bands = getenv("ZAYA_GPU_NS_BANDS");
    if (bands && strcmp(bands, "on") && strcmp(bands, "off"))
        return zy_fail(err, "ZAYA_GPU_NS_BANDS=%s: expected on (Newton-Schulz's symmetric products X X^T and A^2 as "
                       "row bands of their upper triangle and a mirror, from %d rows) or off (whole products)", bands,
                       (int)NS_BAND_MIN_R);
    o->ns_band_rows = bands && !strcmp(bands, "off") ? INT_MAX : 0; /* one band taller than any matrix: whole */
    o->cfg = *cfg;
    o->begin = begin;
    o->end = end > begin ? end : begin;
    int nm, na, ng;
    go_build(o, t, NULL, NULL, NULL, &nm, &na, &ng);
    GpuMuonMatrix *table_order = (GpuMuonMatrix *)calloc((size_t)(nm > 0 ? nm : 1), sizeof *table_order);
    unsigned char *taken = (unsigned char *)calloc((size_t)(nm > 0 ? nm : 1), 1);
    o->muon = (GpuMuonMatrix *)calloc((size_t)(nm > 0 ? nm : 1), sizeof *o->muon);
    GpuOptimChunk *adamw = (GpuOptimChunk *)calloc((size_t)(na > 0 ? na : 1), sizeof *adamw);
    GpuOptimChunk *grad = (GpuOptimChunk *)calloc((size_t)(ng > 0 ? ng : 1), sizeof *grad);
    uint64_t *offs = (uint64_t *)calloc((size_t)(nm > 0 ? nm : 1), sizeof *offs);
    int n_groups = 0;
    if (table_order && taken && o->muon && adamw && grad && offs) {
        go_build(o, t, table_order, adamw, grad, &o->n_muon, &o->n_adamw_chunks, &o->n_grad_chunks);
        n_groups = go_group(table_order, o->n_muon, max_batch, NULL, NULL, taken);
        o->groups = (GpuMuonGroup *)calloc((size_t)(n_groups > 0 ? n_groups : 1), sizeof *o->groups);
    }
    if (!o->groups) {
        free(table_order), free(taken), free(adamw), free(grad), free(offs);
        gpu_optim_free(o);
        return zy_fail(err, "out of memory building the GPU optimizer's tables");
    }
    o->n_groups = go_group(table_order, o->n_muon, max_batch, o->muon, o->groups, taken);
    free(table_order);
    free(taken);
    size_t ns_len = 0, ns_rr = 0, parts_max = 0;
    for (int j = 0; j < o->n_groups; j++) {
        const GpuMuonGroup *gr = &o->groups[j];
        const size_t m = (size_t)gr->m, n = (size_t)gr->n, r = m < n ? m : n, cnt = (size_t)gr->count;
        const size_t len = (cnt - 1) * go_pad(m * n) + m * n, rr = (cnt - 1) * go_pad(r * r) + r * r;
        const size_t parts = cnt * ((m * n + GO_NS_CHUNK - 1) / GO_NS_CHUNK);
        if (len > ns_len) ns_len = len;
        if (rr > ns_rr) ns_rr = rr;
        if (parts > parts_max) parts_max = parts;
        if (gr->count > o->max_batch) o->max_batch = gr->count;
    }
    for (int j = 0; j < o->n_muon; j++) offs[j] = (uint64_t)o->muon[j].off;
    o->ns_len = ns_len;
    o->ns_rr = ns_rr;
    o->n_partial = (int)(parts_max > (size_t)o->n_grad_chunks ? parts_max : (size_t)o->n_grad_chunks);
    const size_t len = o->end - o->begin;
    int failed = 0;
    o->exp_avg = (float *)go_alloc(len, sizeof(float), "optimizer exp_avg", &failed, err);
    o->exp_avg_sq = (float *)go_alloc(len, sizeof(float), "optimizer exp_avg_sq", &failed, err);
    o->adamw_chunks = (GpuOptimChunk *)go_alloc((size_t)o->n_adamw_chunks, sizeof *adamw, "AdamW chunks", &failed, err);
    o->grad_chunks = (GpuOptimChunk *)go_alloc((size_t)o->n_grad_chunks, sizeof *grad, "gradient chunks", &failed, err);
    o->muon_off = (uint64_t *)go_alloc((size_t)o->n_muon, sizeof *offs, "Muon matrix offsets", &failed, err);
    o->ns_x = (float *)go_alloc(ns_len, sizeof(float), "Newton-Schulz X", &failed, err);
    o->ns_xn = (float *)go_alloc(ns_len, sizeof(float), "Newton-Schulz X'", &failed, err);
    o->ns_a = (float *)go_alloc(ns_rr, sizeof(float), "Newton-Schulz A", &failed, err);
    o->ns_b = (float *)go_alloc(ns_rr, sizeof(float), "Newton-Schulz B", &failed, err);
    o->ns_x16 = (uint16_t *)go_alloc(ns_len, sizeof(uint16_t), "Newton-Schulz bf16 X", &failed, err);
    o->ns_m16 = (uint16_t *)go_alloc(ns_rr, sizeof(uint16_t), "Newton-Schulz bf16 A", &failed, err);
    o->partial = (double *)go_alloc((size_t)o->n_partial, sizeof(double), "optimizer partial sums", &failed, err);
    o->ns_sumsq = (double *)go_alloc((size_t)(o->max_batch > 0 ? o->max_batch : 1), sizeof(double),
                                     "Newton-Schulz norms", &failed, err);
    if (!failed && o->n_adamw_chunks &&
        gpu_upload(g, o->adamw_chunks, adamw, (size_t)o->n_adamw_chunks * sizeof *adamw, err))
        failed = 1;
    if (!failed && o->n_grad_chunks &&
        gpu_upload(g, o->grad_chunks, grad, (size_t)o->n_grad_chunks * sizeof *grad, err))
        failed = 1;
    if (!failed && o->n_muon && gpu_upload(g, o->muon_off, offs, (size_t)o->n_muon * sizeof *offs, err)) failed = 1;
    free(adamw);
    free(grad);
    free(offs);
    if (failed) {
        gpu_optim_free(o);
        return zy_wrap(err, "GPU optimizer");
    }
    return 0;
}

extern "C" int gpu_optim_create_block(GpuOptimizer *o, GpuCtx *g, const ParamTable *t, const OptimConfig *cfg,
                                      size_t begin, size_t end, ZyErr *err) {
    return gpu_optim_create_grouped(o, g, t, cfg, begin, end, 0, err);
}

extern "C" int gpu_optim_create(GpuOptimizer *o, GpuCtx *g, const ParamTable *t, const OptimConfig *cfg,
                                ZyErr *err) {
    return gpu_optim_create_block(o, g, t, cfg, 0, t->total, err);
}

extern "C" void gpu_optim_free(GpuOptimizer *o) {
    void *dev[] = {o->exp_avg, o->exp_avg_sq, o->adamw_chunks, o->grad_chunks, o->muon_off, o->ns_x,    o->ns_xn,
                   o->ns_a,    o->ns_b,       o->ns_x16,       o->ns_m16,      o->partial,  o->ns_sumsq};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        if (dev[i]) gpu_free(dev[i]);
    free(o->muon);
    free(o->groups);
    memset(o, 0, sizeof *o);
}

/* The group's batched product in either precision: fp32 (gpu_gemm_batched; C must be D) or bf16 in and out. */
static int ns_gemm(GpuCtx *g, int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, long sa,
                   const float *B, int ldb, long sb, float beta, const float *C, float *D, int ldc, long sc, int batch,
                   ZyErr *err) {
    (void)C;
    return gpu_gemm_batched(g, ta, tb, M, N, K, alpha, A, NULL, lda, sa, B, NULL, ldb, sb, beta, D, ldc, sc, batch,
                            err);
}
static int ns_gemm(GpuCtx *g, int ta, int tb, int M, int N, int K, float alpha, const uint16_t *A, int lda, long sa,
                   const uint16_t *B, int ldb, long sb, float beta, const uint16_t *C, uint16_t *D, int ldc, long sc,
                   int batch, ZyErr *err) {
    return gpu_gemm_batched_bf16(g, ta, tb, M, N, K, alpha, A, lda, sa, B, ldb, sb, beta, C, D, ldc, sc, batch, err);
}
static void ns_mirror(gpuStream_t s, float *M, int r, long stride, int batch) {
    gk_mirror_upper_f32(s, M, r, stride, batch);
}
static void ns_mirror(gpuStream_t s, uint16_t *M, int r, long stride, int batch) {
    gk_mirror_upper_bf16(s, M, r, stride, batch);
}

/* D = alpha op(P) op(Q) + beta C, a symmetric r × r product of every matrix in the group (inputs `stride_in` apart,
 * outputs rs apart), as ns_symmetric_bands' row bands of its upper triangle, then mirrored (what the CPU's fp32 step
 * gets from syrk). Band [row0, row0 + rows) reads P from step_p·row0 and Q from step_q·row0 (the
 * element one row, or one column, of the operand further on) and writes columns [row0, r) of its rows. */
template <typename T>
static int ns_symmetric(GpuCtx *g, const NsBand *bands, int nb, int ta, int tb, int r, int K, float alpha, const T *P,
                        int ld_p, long step_p, const T *Q, int ld_q, long step_q, long stride_in, float beta,
                        const T *C, T *D, long rs, int batch, ZyErr *err) {
    for (int i = 0; i < nb; i++) {
        const long r0 = bands[i].row0, at = r0 * r + r0;
        if (ns_gemm(g, ta, tb, bands[i].rows, r - (int)r0, K, alpha, P + r0 * step_p, ld_p, stride_in,
                    Q + r0 * step_q, ld_q, stride_in, beta, C ? C + at : NULL, D + at, r, rs, batch, err))
            return -1;
    }
    if (nb > 1) ns_mirror(g->stream, D, r, rs, batch);
    return 0;
}

/* A = X Xᵀ (tall: Xᵀ X) over the group, in bands: the band rows are X's rows (tall: its columns). */
template <typename T>
static int ns_gram(GpuCtx *g, const NsBand *bands, int nb, int tall, int r, int kk, int n, const T *X, long ls, T *A,
                   long rs, int batch, ZyErr *err) {
    const long step = tall ? 1 : n;
    return ns_symmetric(g, bands, nb, tall, !tall, r, kk, 1.0f, X, n, step, X, n, step, ls, 0.0f, (const T *)NULL, A,
                        rs, batch, err);
}

/* B = beta·C + c·A² over the group, in bands: band rows of A times A's columns from row0 on. */
template <typename T>
static int ns_square(GpuCtx *g, const NsBand *bands, int nb, int r, float c, const T *A, float beta, const T *C, T *B,
                     long rs, int batch, ZyErr *err) {
    return ns_symmetric(g, bands, nb, 0, 0, r, r, c, A, r, (long)r, A, r, 1, rs, beta, C, B, rs, batch, err);
}

/* One Muon group (muon_job of optim.c on each of its matrices), every launch over the whole group: momentum and
 * Nesterov vector with the per-matrix norms, Newton–Schulz on the normalised X in each matrix's own layout [m, n]
 * (ns5_iterate's whole-GEMM form: when tall, the wide orientation is Xᵀ, so X Xᵀ, B X become Xᵀ X, X B, B
 * symmetric) as batched products over the scratch copies, then W ← W − (0.2·√max(m,n)·lr·O + lr·wd·W). The two
 * symmetric products are computed as nb row bands of their upper triangle and a mirror (ns_symmetric_bands: at
 * ZAYA1-8B's r = 2048, 8 bands, 56% of their FLOPs; below 1,024 rows one band, the whole product). A group of one
 * is the unbatched step: gpu_gemm_batched with batch 1 is gpu_gemm.
 * Launches: 3 + steps × (2·nb + 3) (fp32; bf16: 5 + steps × (2·nb + 1), the rounded start and the widened result
 * besides), plus 2 mirrors an iteration when nb > 1, whatever the group's size. */
static int go_muon_group(GpuOptimizer *o, GpuCtx *g, float *d_params, const float *d_grads, const GpuMuonGroup *gr,
                         const GkOptimStep *k, ZyErr *err) {
    const float a = 3.4445f, b = -4.7750f, c = 2.0315f;
    const int m = gr->m, n = gr->n, tall = m > n, r = tall ? n : m, kk = tall ? m : n, batch = gr->count;
    const long len = (long)m * n, rr = (long)r * r, ls = (long)go_pad((size_t)len), rs = (long)go_pad((size_t)rr);
    if (len <= 0 || batch <= 0) return 0;
    gpuStream_t s = g->stream;
    const uint64_t *offs = o->muon_off + gr->first;
    float *X = o->ns_x, *Xn = o->ns_xn, *A = o->ns_a, *B = o->ns_b;
    const int bf = g->bf16 != 0;
    uint16_t *X16 = bf ? o->ns_x16 : NULL, *M16 = bf ? o->ns_m16 : NULL;
    const int parts = (int)((len + GO_NS_CHUNK - 1) / GO_NS_CHUNK);
    const dim3 g_parts((unsigned)parts, (unsigned)batch), g_len((unsigned)gk_blocks(len, GO_THREADS), (unsigned)batch),
        g_rr((unsigned)gk_blocks(rr, GO_THREADS), (unsigned)batch);
    NsBand bands[NS_MAX_BANDS];
    const int nb = ns_symmetric_bands(r, o->ns_band_rows, bands);
    GK_LAUNCH(go_muon_momentum_kernel, g_parts, GO_THREADS, 0, s, o->exp_avg, (uint64_t)o->begin, d_grads, offs, X,
              ls, len, k->mu, k->grad_scale, o->partial);
    GK_LAUNCH(go_sum_partials_kernel, batch, 1024, 0, s, o->ns_sumsq, o->partial, parts); /* one block per matrix */
    const int steps = o->cfg.muon_ns_steps;
    if (steps <= 0) /* no iteration: the output is the normalised input */
        GK_LAUNCH(go_ns_prep_kernel, g_len, GO_THREADS, 0, s, X, Xn, NULL, ls, len, a, o->ns_sumsq);
    if (bf && steps > 0) {
        /* bf16 products: the iterates stay bf16 (as Muon's reference implementation runs them), so an iteration is
         * three products with the coefficients in their alpha / beta and no elementwise pass: A = X Xᵀ,
         * B = b·A + c·A² (C = A, D = B), X' = a·X + B X (C = X, D = X'); X and X' alternate between X16 and Xn's
         * storage, B lives in B's. Only the normalised start is rounded (prep) and the result widened (once). */
        uint16_t *Xa = X16, *Xb = (uint16_t *)Xn, *A16 = M16, *B16 = (uint16_t *)B;
        GK_LAUNCH(go_ns_prep_kernel, g_len, GO_THREADS, 0, s, X, NULL, Xa, ls, len, a, o->ns_sumsq);
        for (int it = 0; it < steps; it++) {
            /* A = X Xᵀ (tall: Xᵀ X), B = bA + cA², X' = aX + B X (tall: Xᵀ' = aXᵀ + Xᵀ B) */
            const int rc =
                ns_gram(g, bands, nb, tall, r, kk, n, (const uint16_t *)Xa, ls, A16, rs, batch, err) ||
                ns_square(g, bands, nb, r, c, (const uint16_t *)A16, b, (const uint16_t *)A16, B16, rs, batch, err) ||
                (tall ? gpu_gemm_batched_bf16(g, 0, 0, m, n, n, 1.0f, Xa, n, ls, B16, r, rs, a, Xa, Xb, n, ls, batch,
                                              err)
                      : gpu_gemm_batched_bf16(g, 0, 0, m, n, m, 1.0f, B16, r, rs, Xa, n, ls, a, Xa, Xb, n, ls, batch,
                                              err));
            if (rc) return -1;
            uint16_t *tmp = Xa;
            Xa = Xb;
            Xb = tmp;
        }
        gk_bf16_to_f32(s, X, Xa, (long)((batch - 1) * ls + len)); /* the result, widened for the update */
    }
    for (int it = 0; it < (bf ? 0 : steps); it++) { /* fp32 products: the iterates fp32, as on the CPU */
        GK_LAUNCH(go_ns_prep_kernel, g_len, GO_THREADS, 0, s, X, Xn, NULL, ls, len, a, it == 0 ? o->ns_sumsq : NULL);
        if (ns_gram(g, bands, nb, tall, r, kk, n, (const float *)X, ls, A, rs, batch, err)) return -1; /* A = X Xᵀ */
        GK_LAUNCH(go_ns_b_kernel, g_rr, GO_THREADS, 0, s, B, A, rs, rr, b);
        if (ns_square(g, bands, nb, r, c, (const float *)A, 1.0f, (const float *)B, B, rs, batch, err))
            return -1; /* B = bA + cA² */
        int rc;
        if (tall) /* Xᵀ = aXᵀ + Xᵀ B */
            rc = gpu_gemm_batched(g, 0, 0, m, n, n, 1.0f, X, NULL, n, ls, B, NULL, r, rs, 1.0f, Xn, n, ls, batch, err);
        else /* X = aX + B X */
            rc = gpu_gemm_batched(g, 0, 0, m, n, m, 1.0f, B, NULL, r, rs, X, NULL, n, ls, 1.0f, Xn, n, ls, batch, err);
        if (rc) return rc;
        float *tmp = X;
        X = Xn;
        Xn = tmp;
    }
    const float scale = (float)(0.2 * sqrt((double)(m > n ? m : n)) * k->lr);
    GK_LAUNCH(go_muon_apply_kernel, g_len, GO_THREADS, 0, s, d_params, o->params16, offs, X, ls, len, scale,
              k->muon_decay);
    return 0;
}

extern "C" int gpu_optim_step(GpuOptimizer *o, GpuCtx *g, const ParamTable *t, float *d_params, const float *d_grads,
                              double lr, float grad_scale, ZyErr *err) {
    (void)t; /* create's table: its layout is in o's lists already */
    o->step++;
    const GkOptimStep k[2] = {go_step_consts(o, lr, grad_scale),
                              go_step_consts(o, lr * o->cfg.router_lr_scale, grad_scale)};
    gpuStream_t s = g->stream;
    gk_adamw(s, d_params, o->params16, d_grads, o->exp_avg, o->exp_avg_sq, (uint64_t)o->begin, o->adamw_chunks,
             o->n_adamw_chunks, k[0], k[1]);
    for (int j = 0; j < o->n_groups; j++) {
        const GpuMuonGroup *gr = &o->groups[j];
        if (go_muon_group(o, g, d_params, d_grads, gr, &k[gr->router], err))
            return zy_wrap(err, "Muon step, group %d of %d (%d matrices %dx%d)", j, o->n_groups, gr->count, gr->m,
                           gr->n);
    }
    return 0;
}

extern "C" int gpu_grad_sumsq(GpuOptimizer *o, GpuCtx *g, const float *d_grads, double *d_out) {
    gpuStream_t s = g->stream;
    if (o->n_grad_chunks <= 0) {
        gpu_memset_async(g, d_out, 0, sizeof(double));
        return 0;
    }
    GK_LAUNCH(go_chunk_sumsq_kernel, o->n_grad_chunks, GO_THREADS, 0, s, o->partial, d_grads, o->grad_chunks);
    GK_LAUNCH(go_sum_partials_kernel, 1, 1024, 0, s, d_out, o->partial, o->n_grad_chunks);
    return 0;
}

extern "C" void gpu_grad_clip(GpuCtx *g, float *d_grads, size_t n, const double *d_sumsq, double max_norm) {
    if (max_norm <= 0 || n == 0) return; /* clip_coefficient: 1 */
    GK_LAUNCH(go_clip_kernel, gk_blocks((long)n, GO_THREADS), GO_THREADS, 0, g->stream, d_grads, (long)n, d_sumsq,
              max_norm);
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
