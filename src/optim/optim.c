#include "optim/optim.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/matmul.h"
#include "optim/adamw_elem.h"

/* AdamW tensors are cut into chunks of this many elements so that they share out over the threads like the Muon
 * matrices do (64 KB per array: streams through L2). */
#define ADAMW_CHUNK ((size_t)1 << 14)

enum { JOB_MUON, JOB_ADAMW };

struct OptimJob {
    size_t off;   /* arena offset of the matrix / chunk */
    size_t len;   /* elements */
    int kind;     /* JOB_MUON, JOB_ADAMW */
    int m, n;     /* Muon: the matrix shape */
    int decay;    /* AdamW: weight decay applies (2+ dims) */
    int router;   /* a router tensor: learns at lr × router_lr_scale */
    double cost;  /* estimated work (FLOPs or their equivalent), for the schedule */
};

/* A Muon tensor is one matrix [m, n], or a stack of them (experts: [E, m, n]). */
static void matrix_shape(const ParamInfo *p, int *count, int *m, int *n) {
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

size_t muon_workspace_floats(int m, int n) {
    size_t r = (size_t)(m < n ? m : n), c = (size_t)(m < n ? n : m);
    return 2 * r * c + 2 * r * r;
}

/* Work of one Muon matrix: 5 iterations of syrk X Xᵀ (r²c), syrk A² (r³) and gemm B X (2r²c), plus the
 * element-wise passes. An AdamW element streams 7 floats: weighted like ~30 FLOPs. */
static double muon_job_cost(int m, int n, int steps) {
    double r = m < n ? m : n, c = m < n ? n : m;
    return steps * (3.0 * r * r * c + r * r * r) + 20.0 * r * c;
}

static int job_cmp(const void *pa, const void *pb) {
    const OptimJob *a = pa, *b = pb;
    if (a->cost != b->cost) return a->cost > b->cost ? -1 : 1; /* largest first */
    return (a->off > b->off) - (a->off < b->off);
}

/* Fills jobs (when non-NULL) with the step's work and returns how many there are. */
int param_is_router(const ParamInfo *p) { return strstr(p->name, ".mlp.gate.") != NULL; }

static int build_jobs(const Optimizer *o, const ParamTable *t, OptimJob *jobs) {
    int n = 0;
    for (int i = 0; i < t->count; i++) {
        const ParamInfo *p = &t->info[i];
        if (!param_trainable(p) || !o->owned[i]) continue;
        const int router = param_is_router(p);
        if (p->kind == PARAM_MUON && !o->cfg.adamw_only) {
            int count, rows, cols;
            matrix_shape(p, &count, &rows, &cols);
            const size_t len = (size_t)rows * cols;
            for (int k = 0; k < count; k++, n++)
                if (jobs)
                    jobs[n] = (OptimJob){.off = p->offset + k * len, .len = len, .kind = JOB_MUON, .m = rows,
                                         .n = cols, .router = router,
                                         .cost = muon_job_cost(rows, cols, o->cfg.muon_ns_steps)};
        } else {
            for (size_t s = 0; s < p->numel; s += ADAMW_CHUNK, n++) {
                const size_t len = p->numel - s < ADAMW_CHUNK ? p->numel - s : ADAMW_CHUNK;
                if (jobs)
                    jobs[n] = (OptimJob){.off = p->offset + s, .len = len, .kind = JOB_ADAMW, .decay = p->ndim >= 2,
                                         .router = router, .cost = 30.0 * (double)len};
            }
        }
    }
    return n;
}

int optim_create_block(Optimizer *o, const ParamTable *t, const OptimConfig *cfg, size_t begin, size_t end,
                       ZyErr *err) {
    memset(o, 0, sizeof *o);
    o->cfg = *cfg;
    o->begin = begin;
    o->end = end;
    o->owned = calloc((size_t)(t->count > 0 ? t->count : 1), 1);
    if (!o->owned) return zy_fail(err, "out of memory");
    size_t ws = 0;
    for (int i = 0; i < t->count; i++) {
        const ParamInfo *p = &t->info[i];
        o->owned[i] = p->offset >= begin && p->offset + p->numel <= end;
        if (!o->owned[i] || p->kind != PARAM_MUON || cfg->adamw_only) continue;
        int count, m, n;
        matrix_shape(p, &count, &m, &n);
        size_t need = muon_workspace_floats(m, n);
        if (need > ws) ws = need;
    }
    ws = (ws + 15) & ~(size_t)15; /* whole cache lines per worker: no false sharing, 64-byte aligned */
    o->ns_work_floats = ws;
    o->n_workers = omp_get_max_threads() > 0 ? omp_get_max_threads() : 1;
    o->n_jobs = build_jobs(o, t, NULL);
    o->jobs = malloc((size_t)(o->n_jobs > 0 ? o->n_jobs : 1) * sizeof *o->jobs);
    size_t len = end > begin ? end - begin : 0, work_bytes;
    if (zy_mul_size(ws ? ws : 1, (size_t)o->n_workers * sizeof(float), &work_bytes)) {
        optim_free(o);
        return zy_fail(err, "Newton–Schulz workspace size overflows");
    }
    o->exp_avg = zy_calloc_resident((len ? len : 1) * sizeof(float)); /* read before written: see util.h */
    o->exp_avg_sq = zy_calloc_resident((len ? len : 1) * sizeof(float));
    o->ns_work = zy_calloc(work_bytes);
    o->ns_gemm = calloc((size_t)o->n_workers, sizeof *o->ns_gemm); /* fp32 until optim_set_bf16 */
    if (!o->exp_avg || !o->exp_avg_sq || !o->ns_work || !o->jobs || !o->ns_gemm) {
        optim_free(o);
        return zy_fail(err, "out of memory allocating optimizer state (%zu MB)",
                       (2 * len * sizeof(float) + work_bytes) >> 20);
    }
    build_jobs(o, t, o->jobs);
    qsort(o->jobs, (size_t)o->n_jobs, sizeof *o->jobs, job_cmp);
    return 0;
}

int optim_create(Optimizer *o, const ParamTable *t, const OptimConfig *cfg, ZyErr *err) {
    return optim_create_block(o, t, cfg, 0, t->total, err);
}

/* Optimizer work of one tensor, for balancing the ZeRO-1 blocks. */
static double update_cost(const ParamInfo *p) {
    if (p->kind == PARAM_BUFFER) return 0;
    if (p->kind == PARAM_ADAMW) return 10.0 * (double)p->numel;
    int count, m, n;
    matrix_shape(p, &count, &m, &n);
    double r = m < n ? m : n, c = m < n ? n : m;
    return count * (5.0 * (4.0 * r * r * c + 2.0 * r * r * r) + 10.0 * r * c);
}

void zero1_partition(const ParamTable *t, int n, size_t *bounds) {
    double total = 0;
    for (int i = 0; i < t->count; i++) total += update_cost(&t->info[i]);
    bounds[0] = 0;
    int block = 1;
    double acc = 0;
    for (int i = 0; i < t->count && block < n; i++) {
        acc += update_cost(&t->info[i]);
        /* block k ends after the first tensor that takes the running cost to k/n of the total */
        size_t end = i + 1 < t->count ? t->info[i + 1].offset : t->total;
        while (block < n && acc >= total * block / n) bounds[block++] = end;
    }
    while (block <= n) bounds[block++] = t->total;
}

/* Sum of squares in double with four independent accumulators (vectorisable, no serial dependency chain). */
static double sumsq_f32(const float *x, size_t n) {
    double a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        a0 += (double)x[i] * x[i];
        a1 += (double)x[i + 1] * x[i + 1];
        a2 += (double)x[i + 2] * x[i + 2];
        a3 += (double)x[i + 3] * x[i + 3];
    }
    for (; i < n; i++) a0 += (double)x[i] * x[i];
    return (a0 + a1) + (a2 + a3);
}

/* The trainable gradients (only the owned ones when owned is non-NULL), concatenated in table order and cut into
 * GRAD_PARTS equal parts fixed by the table alone: the parts run on the threads, their sums are added in order,
 * so the result is the same for every thread count and every run. scale != 1: multiplies instead (returns 0). */
#define GRAD_PARTS 64
static double grad_walk(const ParamTable *t, const unsigned char *owned, float scale, int do_scale) {
    size_t total = 0;
    for (int i = 0; i < t->count; i++)
        if (param_trainable(&t->info[i]) && (!owned || owned[i])) total += t->info[i].numel;
    double part[GRAD_PARTS];
#pragma omp parallel for schedule(static) if (total >= ((size_t)1 << 16))
    for (int k = 0; k < GRAD_PARTS; k++) {
        const size_t lo = total / GRAD_PARTS * k + total % GRAD_PARTS * k / GRAD_PARTS;
        const size_t hi = total / GRAD_PARTS * (k + 1) + total % GRAD_PARTS * (k + 1) / GRAD_PARTS;
        double acc = 0;
        size_t base = 0;
        for (int i = 0; i < t->count && base < hi; i++) {
            const ParamInfo *p = &t->info[i];
            if (!param_trainable(p) || (owned && !owned[i])) continue;
            const size_t a = lo > base ? lo : base, b = hi < base + p->numel ? hi : base + p->numel;
            if (a < b) {
                float *g = t->grad + p->offset + (a - base);
                if (do_scale)
                    for (size_t j = 0; j < b - a; j++) g[j] *= scale;
                else
                    acc += sumsq_f32(g, b - a);
            }
            base += p->numel;
        }
        part[k] = acc;
    }
    double ss = 0;
    for (int k = 0; k < GRAD_PARTS; k++) ss += part[k];
    return ss;
}

double grad_sumsq_owned(const Optimizer *o, const ParamTable *t) { return grad_walk(t, o->owned, 1.0f, 0); }

void grad_scale_owned(const Optimizer *o, ParamTable *t, double s) { grad_walk(t, o->owned, (float)s, 1); }

void optim_set_bf16(Optimizer *o, ZyBf16Products products) {
    for (int i = 0; i < o->n_workers && o->ns_gemm; i++) o->ns_gemm[i].bf16 = products;
}

void optim_free(Optimizer *o) {
    for (int i = 0; i < o->n_workers && o->ns_gemm; i++) zy_gemm_ctx_free(&o->ns_gemm[i]);
    free(o->ns_gemm);
    zy_free(o->exp_avg);
    zy_free(o->exp_avg_sq);
    zy_free(o->ns_work);
    free(o->jobs);
    free(o->owned);
    memset(o, 0, sizeof *o);
}

void newton_schulz5_reference(float *out, const float *G, int m, int n, int steps, float *work) {
    const float a = 3.4445f, b = -4.7750f, c = 2.0315f;
    const int transposed = m > n, r = transposed ? n : m, cols = transposed ? m : n;
    float *X = work, *Xn = X + (size_t)r * cols, *A = Xn + (size_t)r * cols, *B = A + (size_t)r * r;
    double ss = 0;
    for (size_t i = 0; i < (size_t)m * n; i++) ss += (double)G[i] * G[i];
    const float inv = (float)(1.0 / (sqrt(ss) + 1e-7));
    if (transposed) {
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++) X[(size_t)j * cols + i] = G[(size_t)i * n + j] * inv;
    } else {
        for (size_t i = 0; i < (size_t)m * n; i++) X[i] = G[i] * inv;
    }
    for (int it = 0; it < steps; it++) {
        zy_gemm(0, 1, r, r, cols, 1.0f, X, cols, X, cols, 0.0f, A, r); /* A = X Xᵀ */
        for (size_t i = 0; i < (size_t)r * r; i++) B[i] = b * A[i];
        zy_gemm(0, 0, r, r, r, c, A, r, A, r, 1.0f, B, r); /* B = bA + cA² */
        for (size_t i = 0; i < (size_t)r * cols; i++) Xn[i] = a * X[i];
        zy_gemm(0, 0, r, cols, r, 1.0f, B, r, X, cols, 1.0f, Xn, cols); /* X = aX + BX */
        float *tmp = X;
        X = Xn;
        Xn = tmp;
    }
    if (transposed) {
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++) out[(size_t)i * n + j] = X[(size_t)j * cols + i];
    } else {
        memcpy(out, X, (size_t)m * n * sizeof(float));
    }
}

/* Copies the upper triangle of the symmetric M [r, r] onto the lower one (32×32 tiles: the column writes stay
 * in cache). */
static void mirror_upper(float *M, int r) {
    for (int ib = 0; ib < r; ib += 32)
        for (int jb = ib; jb < r; jb += 32) {
            const int ie = ib + 32 < r ? ib + 32 : r, je = jb + 32 < r ? jb + 32 : r;
            for (int i = ib; i < ie; i++)
                for (int j = jb > i + 1 ? jb : i + 1; j < je; j++) M[(size_t)j * r + i] = M[(size_t)i * r + j];
        }
}

int ns_symmetric_bands(int r, int band_rows, NsBand bands[NS_MAX_BANDS]) {
    int h = band_rows;
    if (h <= 0 && r < NS_BAND_MIN_R) h = r;
    if (h <= 0) { /* at most 8 bands of whole 128-row tiles, at least 256 rows: a band's GEMM must still fill the SMs */
        h = ((r + 7) / 8 + 127) / 128 * 128;
        if (h < 256) h = 256;
    }
    if (h > r) h = r; /* one band (any band_rows >= r, INT_MAX included) */
    if (h < 1) h = 1;
    if ((r + h - 1) / h > NS_MAX_BANDS) h = (r + NS_MAX_BANDS - 1) / NS_MAX_BANDS;
    int n = 0;
    for (int r0 = 0; r0 < r; r0 += h) bands[n++] = (NsBand){r0, r - r0 < h ? r - r0 : h};
    return n;
}

/* The Newton–Schulz iterations on the normalised X, kept in G's own layout [m, n]: when tall (m > n) the wide
 * orientation is its transpose, and NS5's X Xᵀ, B X become Xᵀ X, X B (B symmetric) with BLAS reading the
 * transposes, so no copy is ever transposed. Xn [m, n], A, B [r, r] (r = min(m, n)) are scratch. A = X Xᵀ and
 * A² = A Aᵀ are symmetric: syrk computes their upper triangles at half the gemm FLOPs, a mirror completes them
 * for the next product. Returns the buffer holding the result (X or Xn). */
static float *ns5_iterate(float *X, float *Xn, float *A, float *B, int m, int n, int steps, ZyGemmCtx *gemm) {
    const float a = 3.4445f, b = -4.7750f, c = 2.0315f;
    const int tall = m > n, r = tall ? n : m, k = tall ? m : n;
    const size_t len = (size_t)m * n;
    /* bf16 products: whole GEMMs (no bf16 syrk), each on bf16-rounded inputs. Not ns_symmetric_bands' row bands, as
     * the GPU runs them: each of these GEMMs rounds its fp32 operands again, so 8 bands round X ~4.5 times a product,
     * and on a Zen 3 with 2 threads (bf16-rounded operands through sgemm) the banded step took 1.25-1.5x the whole
     * one, though the bands' GEMMs alone took 0.61x */
    if (gemm && gemm->bf16) {
        for (int it = 0; it < steps; it++) {
            if (tall)
                zy_gemm_ctx(gemm, 1, 0, r, r, k, 1.0f, X, n, X, n, 0.0f, A, r); /* A = Xᵀ X */
            else
                zy_gemm_ctx(gemm, 0, 1, r, r, k, 1.0f, X, n, X, n, 0.0f, A, r); /* A = X Xᵀ */
            for (size_t i = 0; i < (size_t)r * r; i++) B[i] = b * A[i];
            zy_gemm_ctx(gemm, 0, 0, r, r, r, c, A, r, A, r, 1.0f, B, r); /* B = bA + cA² */
            for (size_t i = 0; i < len; i++) Xn[i] = a * X[i];
            if (tall)
                zy_gemm_ctx(gemm, 0, 0, m, n, n, 1.0f, X, n, B, r, 1.0f, Xn, n); /* Xᵀ = aXᵀ + Xᵀ B */
            else
                zy_gemm_ctx(gemm, 0, 0, m, n, m, 1.0f, B, r, X, n, 1.0f, Xn, n); /* X = aX + BX */
            float *tmp = X;
            X = Xn;
            Xn = tmp;
        }
        return X;
    }
    for (int it = 0; it < steps; it++) {
        zy_syrk_upper(tall, r, k, 1.0f, X, n, 0.0f, A, r); /* A = X Xᵀ (wide orientation) */
        mirror_upper(A, r);
        for (int i = 0; i < r; i++)
            for (int j = i; j < r; j++) B[(size_t)i * r + j] = b * A[(size_t)i * r + j];
        zy_syrk_upper(0, r, r, c, A, r, 1.0f, B, r); /* B = bA + cA² */
        mirror_upper(B, r);
        for (size_t i = 0; i < len; i++) Xn[i] = a * X[i];
        if (tall)
            zy_gemm(0, 0, m, n, n, 1.0f, X, n, B, r, 1.0f, Xn, n); /* Xᵀ = aXᵀ + Xᵀ B */
        else
            zy_gemm(0, 0, m, n, m, 1.0f, B, r, X, n, 1.0f, Xn, n); /* X = aX + BX */
        float *tmp = X;
        X = Xn;
        Xn = tmp;
    }
    return X;
}

void newton_schulz5(float *out, const float *G, int m, int n, int steps, float *work) {
    const int r = m < n ? m : n;
    const size_t len = (size_t)m * n;
    float *X = work, *Xn = X + len, *A = Xn + len, *B = A + (size_t)r * r;
    const float inv = (float)(1.0 / (sqrt(sumsq_f32(G, len)) + 1e-7));
    for (size_t i = 0; i < len; i++) X[i] = G[i] * inv;
    X = ns5_iterate(X, Xn, A, B, m, n, steps, NULL);
    memcpy(out, X, len * sizeof(float));
}

/* Per-step constants shared by every job. */
typedef struct {
    float mu, muon_decay;                                      /* Muon: momentum, lr·wd */
    float step_size, eps, b1, b2, inv_bc2, adam_decay;         /* AdamW */
    double lr;
    int ns_steps;
} StepConsts;

static StepConsts step_consts(const Optimizer *o, double lr) {
    const double b1 = o->cfg.beta1, b2 = o->cfg.beta2;
    const double bc1 = 1.0 - pow(b1, (double)o->step), bc2_sqrt = sqrt(1.0 - pow(b2, (double)o->step));
    return (StepConsts){.mu = (float)o->cfg.muon_momentum, .muon_decay = (float)(lr * o->cfg.weight_decay),
                        .step_size = (float)(lr / bc1), .eps = (float)o->cfg.eps, .b1 = (float)b1, .b2 = (float)b2,
                        .inv_bc2 = (float)(1.0 / bc2_sqrt), .adam_decay = (float)(1.0 - lr * o->cfg.weight_decay),
                        .lr = lr, .ns_steps = o->cfg.muon_ns_steps};
}

/* Muon (Moonlight's AdamW-RMS matching): M ← μM + G; N = G + μM; W ← W − lr·(0.2·√max(m,n)·NS5(N) + wd·W).
 * The Nesterov vector N is built in the Newton–Schulz output buffer's place (`update`). */
static void muon_update_reference(Optimizer *o, float *w, const float *g, float *mom, int m, int n, double lr,
                                  float *update) {
    const float mu = (float)o->cfg.muon_momentum;
    const size_t len = (size_t)m * n;
    for (size_t i = 0; i < len; i++) {
        mom[i] = mu * mom[i] + g[i];
        update[i] = g[i] + mu * mom[i];
    }
    newton_schulz5_reference(update, update, m, n, o->cfg.muon_ns_steps, o->ns_work);
    const float scale = (float)(0.2 * sqrt((double)(m > n ? m : n)) * lr), decay = (float)(lr * o->cfg.weight_decay);
    for (size_t i = 0; i < len; i++) w[i] -= scale * update[i] + decay * w[i];
}

/* The same Muon update with the element-wise work in a few contiguous passes: momentum + Nesterov straight into
 * the Newton–Schulz input, its norm and scaling, and the weight update from the Newton–Schulz result. Same
 * arithmetic per element as the reference. */
static void muon_job(const Optimizer *o, ParamTable *t, const OptimJob *j, const StepConsts *k, float *work,
                     ZyGemmCtx *gemm) {
    const int m = j->m, n = j->n, r = m < n ? m : n;
    const size_t len = j->len;
    float *w = t->data + j->off, *mom = o->exp_avg + (j->off - o->begin);
    const float *g = t->grad + j->off;
    float *X = work, *Xn = X + len, *A = Xn + len, *B = A + (size_t)r * r;
    const float mu = k->mu;
    for (size_t i = 0; i < len; i++) {
        mom[i] = mu * mom[i] + g[i];
        X[i] = g[i] + mu * mom[i];
    }
    /* ‖N‖² in its own pass: four accumulators instead of one serial double chain (a third of the element-wise
     * time otherwise); the summation order differs from the reference's only in rounding. */
    const float inv = (float)(1.0 / (sqrt(sumsq_f32(X, len)) + 1e-7));
    for (size_t i = 0; i < len; i++) X[i] *= inv;
    const float *O = ns5_iterate(X, Xn, A, B, m, n, k->ns_steps, gemm);
    const float scale = (float)(0.2 * sqrt((double)(m > n ? m : n)) * k->lr), decay = k->muon_decay;
    for (size_t i = 0; i < len; i++) w[i] -= scale * O[i] + decay * w[i];
}

/* One AdamW element exactly as torch.optim.AdamW orders it: decay, moments, bias-corrected step. Shared by the
 * fast and the reference step, so both give the same bits. */
/* Weight decay applies to tensors with 2+ dims (embedding, head, conv kernels), not to vectors (norms, biases,
 * scales, temp, γ). */
static void adamw_update_reference(const Optimizer *o, const ParamInfo *p, float *w, const float *g, float *m, float *v,
                                   const StepConsts *k) {
    const float decay = p->ndim >= 2 ? k->adam_decay : 1.0f;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < p->numel; i++)
        adamw_elem(&w[i], &g[i], &m[i], &v[i], k->step_size, k->eps, k->b1, k->b2, k->inv_bc2, decay);
}

static void adamw_job(const Optimizer *o, ParamTable *t, const OptimJob *j, const StepConsts *k) {
    const size_t s = j->off - o->begin;
    float *w = t->data + j->off, *m = o->exp_avg + s, *v = o->exp_avg_sq + s;
    const float *g = t->grad + j->off;
    const float decay = j->decay ? k->adam_decay : 1.0f;
    for (size_t i = 0; i < j->len; i++)
        adamw_elem(&w[i], &g[i], &m[i], &v[i], k->step_size, k->eps, k->b1, k->b2, k->inv_bc2, decay);
}

/* k[0]: the step's constants at lr, k[1]: at lr × router_lr_scale. */
static void run_job(const Optimizer *o, ParamTable *t, const OptimJob *j, const StepConsts *kk, int worker) {
    const StepConsts *k = &kk[j->router];
    float *work = o->ns_work + (size_t)worker * o->ns_work_floats;
    if (j->kind == JOB_MUON)
        muon_job(o, t, j, k, work, &o->ns_gemm[worker]);
    else
        adamw_job(o, t, j, k);
}

void optim_step(Optimizer *o, ParamTable *t, double lr) {
    o->step++;
    const StepConsts k[2] = {step_consts(o, lr), step_consts(o, lr * o->cfg.router_lr_scale)};
    int nt = omp_get_max_threads();
    if (nt > o->n_workers) nt = o->n_workers;
    if (nt < 1) nt = 1;
    /* A matrix so large that the rest cannot keep the other threads busy meanwhile runs alone, on threaded BLAS
     * (jobs are sorted largest first); the others share out dynamically, one single-threaded job per thread
     * (OpenMP OpenBLAS runs serially inside a parallel region). */
    int first = 0;
    if (nt > 1) {
        double rest = 0;
        for (int i = 0; i < o->n_jobs; i++) rest += o->jobs[i].cost;
        while (first < o->n_jobs) {
            rest -= o->jobs[first].cost;
            if (o->jobs[first].cost * (nt - 1) <= rest) break;
            run_job(o, t, &o->jobs[first++], k, 0); /* worker 0's workspace: no job runs alongside */
        }
    }
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (nt > 1 && o->n_jobs - first > 1)
    for (int i = first; i < o->n_jobs; i++)
        run_job(o, t, &o->jobs[i], k, omp_get_thread_num());
}

void optim_step_reference(Optimizer *o, ParamTable *t, double lr) {
    o->step++;
    const StepConsts k[2] = {step_consts(o, lr), step_consts(o, lr * o->cfg.router_lr_scale)};
    /* The Nesterov/NS output buffer: reuse the second-moment slot of a Muon tensor, which Muon leaves unused. */
    for (int i = 0; i < t->count; i++) {
        const ParamInfo *p = &t->info[i];
        if (!param_trainable(p) || !o->owned[i]) continue;
        float *w = t->data + p->offset, *g = t->grad + p->offset;
        float *m = optim_state(o, p, 0), *v = optim_state(o, p, 1);
        const int router = param_is_router(p);
        if (p->kind == PARAM_MUON && !o->cfg.adamw_only) {
            int count, rows, cols;
            matrix_shape(p, &count, &rows, &cols);
            size_t len = (size_t)rows * cols;
            for (int c = 0; c < count; c++)
                muon_update_reference(o, w + c * len, g + c * len, m + c * len, rows, cols, k[router].lr, v + c * len);
        } else {
            adamw_update_reference(o, p, w, g, m, v, &k[router]);
        }
    }
}

double grad_global_norm(const ParamTable *t) { return sqrt(grad_walk(t, NULL, 1.0f, 0)); }

void grad_scale(ParamTable *t, double s) { grad_walk(t, NULL, (float)s, 1); }

double clip_coefficient(double max_norm, double norm) {
    if (max_norm <= 0) return 1.0;
    double coef = max_norm / (norm + 1e-6);
    return coef < 1.0 ? coef : 1.0;
}

double grad_clip(ParamTable *t, double max_norm, double norm) {
    double coef = clip_coefficient(max_norm, norm);
    if (coef < 1.0) grad_scale(t, coef);
    return coef;
}

double schedule_lr(const Schedule *s, int64_t step) {
    if (s->warmup_steps > 0 && step < s->warmup_steps) return s->peak_lr * (double)(step + 1) / (double)s->warmup_steps;
    const double floor_lr = s->peak_lr * s->min_ratio;
    const int64_t after = step - s->warmup_steps, span = s->total_steps - s->warmup_steps;
    switch (s->type) {
    case SCHEDULE_CONSTANT:
        return s->peak_lr;
    case SCHEDULE_COSINE: {
        if (span <= 1) return s->peak_lr;
        double progress = fmin(1.0, (double)after / (double)(span - 1));
        return floor_lr + 0.5 * (s->peak_lr - floor_lr) * (1.0 + cos(M_PI * progress));
    }
    case SCHEDULE_WSD: {
        int64_t decay_steps = (int64_t)llround(s->decay_fraction * (double)s->total_steps);
        int64_t decay_start = s->total_steps - decay_steps;
        if (step < decay_start || decay_steps <= 0) return s->peak_lr;
        double progress = (double)(step - decay_start + 1) / (double)decay_steps;
        return s->peak_lr + (floor_lr - s->peak_lr) * fmin(1.0, progress);
    }
    }
    return s->peak_lr;
}
