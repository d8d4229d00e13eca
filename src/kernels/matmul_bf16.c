/* Products with bf16 weights (matmul.h): a few rows (decoding) read the bf16 values directly through the kernel of
 * the process's CPU level; more rows widen panels of the weights to fp32 for sgemm. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef ZY_HAVE_DNNL
#include <dnnl.h>
#endif

#include "kernels/kernel_table.h"
#include "kernels/matmul.h"
#include "util/util.h"

/* ---- bf16 weights: y = X W16ᵀ, fp32 accumulation ---------------------------------------------------------- */

/* Plain C, one row block: the reference the level kernels are tested against. */
static void bf16_block_plain(int nr, int o0, int o1, int in, const float *X, int ldx, const uint16_t *W16, float *Y,
                             int ldy) {
    for (int o = o0; o < o1; o++) {
        const uint16_t *w = W16 + (long)o * in;
        for (int r = 0; r < nr; r++) {
            const float *x = X + (long)r * ldx;
            float acc = 0;
            for (int k = 0; k < in; k++) acc += zy_bf16_to_f32(w[k]) * x[k];
            Y[(long)r * ldy + o] = acc;
        }
    }
}

void zy_matmul_bf16(int impl, int rows, int out, int in, const float *X, int ldx, const uint16_t *W16, float *Y,
                    int ldy) {
    if (rows <= 0 || out <= 0) return;
    const ZyCpuLevel level = impl == ZY_BF16_PLAIN ? ZY_CPU_GENERIC : impl < 0 ? zy_cpu_level() : (ZyCpuLevel)impl;
    if (level >= ZY_CPU_AVX512BF16 && impl != ZY_BF16_PLAIN && in > 0 && zy_matmul_bf16_dpbf16(rows, out, in, X, ldx,
                                                                                              W16, Y, ldy) == 0)
        return;
    const ZyKernelTable *kt = zy_kernel_table(level);
    for (int r0 = 0; r0 < rows; r0 += ZY_BF16_ROW_BLOCK) {
        const int nr = rows - r0 < ZY_BF16_ROW_BLOCK ? rows - r0 : ZY_BF16_ROW_BLOCK;
        const float *x = X + (long)r0 * ldx;
        float *y = Y + (long)r0 * ldy;
        /* outputs split in fixed chunks over the threads: each output's sum is the same whatever the thread count */
#pragma omp parallel for schedule(static) if ((long)out * in >= 65536L)
        for (int o0 = 0; o0 < out; o0 += 16) {
            const int o1 = o0 + 16 < out ? o0 + 16 : out;
            if (impl == ZY_BF16_PLAIN)
                bf16_block_plain(nr, o0, o1, in, x, ldx, W16, y, ldy);
            else
                kt->matmul_bf16_block(nr, o0, o1, in, x, ldx, W16, y, ldy);
        }
    }
}

/* Many rows against bf16 weights (prefill, a full forward): widen a panel of output rows to fp32, then sgemm. The
 * widening reads each weight once per call, against rows x 2 FLOPs per weight for the product. */
void zy_matmul_bf16_panels(int rows, int out, int in, const float *X, int ldx, const uint16_t *W16, float *Y,
                           int ldy) {
    const int panel = out < ZY_BF16_PANEL ? out : ZY_BF16_PANEL;
    float *wp = malloc((size_t)panel * in * sizeof *wp);
    if (!wp) { /* no room for a panel: the matrix-vector kernel handles any number of rows, only slower */
        zy_matmul_bf16(-1, rows, out, in, X, ldx, W16, Y, ldy);
        return;
    }
    for (int o0 = 0; o0 < out; o0 += panel) {
        const int np = out - o0 < panel ? out - o0 : panel;
        const uint16_t *src = W16 + (long)o0 * in;
#pragma omp parallel for schedule(static) if ((long)np * in >= 65536L)
        for (long i = 0; i < (long)np * in; i++) wp[i] = zy_bf16_to_f32(src[i]);
        zy_gemm(0, 1, rows, np, in, 1, X, ldx, wp, in, 0, Y + o0, ldy);
    }
    free(wp);
}

/* ---- which way bf16 weights run (process-wide) ---- */
static atomic_int bf16_weights = ZY_BF16W_AUTO;

ZyBf16Weights zy_bf16_weights(void) {
    const int w = atomic_load_explicit(&bf16_weights, memory_order_relaxed);
    if (w != ZY_BF16W_AUTO) return (ZyBf16Weights)w;
    return zy_cpu_level() >= ZY_CPU_AVX512BF16 ? ZY_BF16W_DOT : ZY_BF16W_WIDEN;
}

int zy_bf16_weights_set(const char *name, ZyErr *err) {
    static const char *const names[] = {"auto", "widen", "dot", "dot-emulated"};
    if (!name || !*name) name = "auto";
    for (int i = 0; i < 4; i++) {
        if (strcmp(name, names[i]) != 0) continue;
        if (i == ZY_BF16W_DOT && zy_cpu_level() < ZY_CPU_AVX512BF16)
            return zy_fail(err, "ZAYA_BF16_WEIGHTS=dot: vdpbf16ps needs the avx512bf16 kernel level (this process runs %s)",
                           zy_cpu_level_name(zy_cpu_level()));
        atomic_store(&bf16_weights, i);
        return 0;
    }
    return zy_fail(err, "ZAYA_BF16_WEIGHTS=%s: not a way to run bf16 weights (auto, widen, dot, dot-emulated)", name);
}

const char *zy_bf16_weights_describe(ZyBf16Weights w) {
    switch (w) {
    case ZY_BF16W_DOT: return "dot: activations rounded to bf16, vdpbf16ps dot products (AVX512-BF16), fp32 sums";
    case ZY_BF16W_DOT_EMULATED:
        return "dot-emulated: activations rounded to bf16 as vdpbf16ps would, plain C products, fp32 sums (for tests)";
    case ZY_BF16W_WIDEN: return "widen: bf16 weights widened to fp32 and multiplied in fp32 (fp32 activations)";
    default: return "auto";
    }
}

/* The avx512bf16 path's numbers on any CPU: the rows rounded to bf16, products of bf16 values (exact in fp32) summed in
 * fp32 by the plain kernel. */
static void matmul_dot_emulated(int rows, int out, int in, const float *X, int ldx, const uint16_t *W16, float *Y,
                                int ldy) {
    float *xr = malloc(sizeof *xr * (size_t)rows * in);
    if (!xr) { /* no room for the rounded rows: fp32 activations (only the rounding is lost) */
        zy_matmul_bf16(ZY_BF16_PLAIN, rows, out, in, X, ldx, W16, Y, ldy);
        return;
    }
    for (int r = 0; r < rows; r++)
        for (int k = 0; k < in; k++) xr[(long)r * in + k] = zy_round_bf16(X[(long)r * ldx + k]);
    zy_matmul_bf16(ZY_BF16_PLAIN, rows, out, in, xr, in, W16, Y, ldy);
    free(xr);
}

void zy_matmul_wt(int rows, int out, int in, const float *X, int ldx, ZyWeights W, float *Y, int ldy) {
    if (W.quant.q) {
        zy_matmul_quant_wt(rows, out, in, X, ldx, &W.quant, Y, ldy);
        return;
    }
    const uint16_t *W16 = W.bf16;
    if (W16 && rows > 0 && out > 0 && in > 0) {
        const ZyBf16Weights way = zy_bf16_weights();
        /* AVX512-BF16: the tiled dot-product kernel for any number of rows (bf16 dot products run at twice sgemm's
         * rate, and the weights are read as they are stored: no widened panel) */
        if (way == ZY_BF16W_DOT && zy_matmul_bf16_dpbf16(rows, out, in, X, ldx, W16, Y, ldy) == 0) return;
        if (way == ZY_BF16W_DOT_EMULATED) {
            matmul_dot_emulated(rows, out, in, X, ldx, W16, Y, ldy);
            return;
        }
        if (rows <= ZY_BF16_MAX_ROWS) {
            zy_matmul_bf16(-1, rows, out, in, X, ldx, W16, Y, ldy);
            return;
        }
        zy_matmul_bf16_panels(rows, out, in, X, ldx, W16, Y, ldy);
        return;
    }
    zy_matmul_f32(rows, out, in, X, ldx, W.f32, Y, ldy);
}

void zy_matmul_wt_shared(int rows, int in, const float *X, int ldx, int n, const ZyWeights *W, const int *out,
                         float *const *Y, const int *ldy) {
    enum { MAX = 8 };
    ZyQuantMatrix q[MAX];
    int quant = n <= MAX && rows <= ZY_QUANT_MAX_ROWS;
    for (int i = 0; quant && i < n; i++)
        if ((quant = W[i].quant.q != NULL)) q[i] = zy_quant_rows(&W[i].quant, 0, out[i]);
    if (quant && zy_matmul_quant_shared(-1, -1, rows, X, ldx, n, q, Y, ldy) == 0) return;
    for (int i = 0; i < n; i++) zy_matmul_wt(rows, out[i], in, X, ldx, W[i], Y[i], ldy[i]);
}

/* ---- bf16 GEMM: both inputs rounded to bf16, fp32 accumulation ---------------------------------------------- */

/* ctx->scratch[i] with at least `bytes` bytes (grown, never shrunk: a run's products repeat their shapes). */
static void *scratch(ZyGemmCtx *ctx, int i, size_t bytes) {
    if (ctx->scratch_bytes[i] >= bytes) return ctx->scratch[i];
    free(ctx->scratch[i]);
    ctx->scratch[i] = malloc(bytes);
    ctx->scratch_bytes[i] = ctx->scratch[i] ? bytes : 0;
    return ctx->scratch[i];
}

#ifdef ZY_HAVE_DNNL /* only the oneDNN path packs */
/* Stored matrix [rows, cols] (leading dimension ld) rounded to bf16, written [prows, pcols] (zeros beyond). */
static void pack_bf16(uint16_t *dst, const float *src, int rows, int cols, int ld, int prows, int pcols) {
    const ZyKernelTable *kt = zy_kernels(); /* the rounding loop vectorised for this CPU */
#pragma omp parallel for schedule(static) if ((long)prows * pcols >= 65536L)
    for (int i = 0; i < prows; i++) {
        uint16_t *d = dst + (long)i * pcols;
        if (i >= rows) {
            memset(d, 0, sizeof *d * (size_t)pcols);
            continue;
        }
        kt->f32_to_bf16_row(d, src + (long)i * ld, cols);
        for (int j = cols; j < pcols; j++) d[j] = 0;
    }
}
#endif

/* The same rounding kept in fp32, unpadded: the inputs of the sgemm fallback. */
static void round_f32(float *dst, const float *src, int rows, int cols, int ld) {
#pragma omp parallel for schedule(static) if ((long)rows * cols >= 65536L)
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++) dst[(long)i * cols + j] = zy_round_bf16(src[(long)i * ld + j]);
}

#ifdef ZY_HAVE_DNNL
/* oneDNN matmul primitives, one per (transposes, padded sizes, strides, alpha, beta): creating one costs 0.2-1.4 ms,
 * running a cached one nothing. Sizes that change every step (rows per expert) are rounded up to buckets so a run
 * needs a few dozen primitives, not one per row count; the padding is zeros (in K) or rows never read (in M, N). */
typedef struct {
    int ta, tb, M, N, K, lda, ldb, ldc;
    float alpha, beta;
    dnnl_primitive_t prim;
    dnnl_memory_t ma, mb, mc, ms; /* ms: the primitive's scratchpad (NULL if it needs none) */
    size_t scratch_bytes;
} DnnlEntry;

typedef struct {
    dnnl_engine_t eng;
    dnnl_stream_t strm;
    DnnlEntry *e;
    int n, cap;
    int broken; /* set after any oneDNN error: the run continues on the sgemm fallback */
    /* One scratchpad for every primitive (they run one at a time), grown as needed. oneDNN's default mode allocates
     * and frees it inside every call: with AMX that was a third of a bf16 training step in page faults. */
    void *scratch;
    size_t scratch_bytes;
    /* bf16 copies of the operands passed as ZY_MM_STABLE (weights, a forward's saved activations), packed once per
     * generation (zy_gemm_ctx_weights_changed, at every forward) and reused by every product that reads them: the
     * q, k and v projections read one input, and the backward's weight gradients read the forward's inputs again. */
    struct PackedOperand {
        const float *src;
        int rows, cols, ld;
        unsigned gen;
        uint16_t *packed;
        size_t cap; /* elements of packed */
    } *w;
    int nw, wcap;
    /* the last temporary operand packed into each scratch slot (A, B): what ZY_MM_AGAIN may reuse */
    struct {
        const float *src;
        int rows, cols, ld;
    } last[2];
} Dnnl;

/* 1 if this oneDNN runs bf16 matmuls with native instructions here (AVX512-BF16 or AMX); on other CPUs it
 * emulates them, 4-5x slower than sgemm (measured), or has no kernel at all (AVX2). */
static int dnnl_native_bf16(void) {
    const unsigned isa = (unsigned)dnnl_get_effective_cpu_isa(), need = (unsigned)dnnl_cpu_isa_avx512_core_bf16;
    return (isa & need) == need;
}

static int bucket(int x) {
    if (x <= 64) return (x + 15) / 16 * 16;
    int step = 64;
    while (step * 16 <= x) step *= 2; /* steps of at most 1/8 of the size: <= 12.5% padding */
    return (x + step - 1) / step * step;
}

static int dnnl_entry_create(Dnnl *d, DnnlEntry *e) {
    dnnl_memory_desc_t a_md, b_md, c_md;
    dnnl_dims_t a_dims = {e->M, e->K}, b_dims = {e->K, e->N}, c_dims = {e->M, e->N};
    /* row-major storage; a transposed operand is the same memory with its strides swapped */
    dnnl_dims_t a_str = {e->ta ? 1 : e->lda, e->ta ? e->lda : 1}, b_str = {e->tb ? 1 : e->ldb, e->tb ? e->ldb : 1};
    dnnl_dims_t c_str = {e->ldc, 1};
    dnnl_matmul_desc_t md;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_primitive_desc_t pd = NULL;
    int ok = dnnl_memory_desc_init_by_strides(&a_md, 2, a_dims, dnnl_bf16, a_str) == dnnl_success &&
             dnnl_memory_desc_init_by_strides(&b_md, 2, b_dims, dnnl_bf16, b_str) == dnnl_success &&
             dnnl_memory_desc_init_by_strides(&c_md, 2, c_dims, dnnl_f32, c_str) == dnnl_success &&
             dnnl_matmul_desc_init(&md, &a_md, &b_md, NULL, &c_md) == dnnl_success &&
             dnnl_primitive_attr_create(&attr) == dnnl_success &&
             dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) == dnnl_success;
    if (ok && e->alpha != 1.0f) ok = dnnl_primitive_attr_set_output_scales(attr, 1, 0, &e->alpha) == dnnl_success;
    if (ok && e->beta != 0.0f) { /* C = alpha op(A) op(B) + beta C as a sum post-op */
        dnnl_post_ops_t po;
        ok = dnnl_post_ops_create(&po) == dnnl_success;
        if (ok) {
            ok = dnnl_post_ops_append_sum(po, e->beta) == dnnl_success &&
                 dnnl_primitive_attr_set_post_ops(attr, po) == dnnl_success;
            dnnl_post_ops_destroy(po);
        }
    }
    ok = ok && dnnl_primitive_desc_create(&pd, &md, attr, d->eng, NULL) == dnnl_success &&
         dnnl_primitive_create(&e->prim, pd) == dnnl_success &&
         dnnl_memory_create(&e->ma, &a_md, d->eng, DNNL_MEMORY_NONE) == dnnl_success &&
         dnnl_memory_create(&e->mb, &b_md, d->eng, DNNL_MEMORY_NONE) == dnnl_success &&
         dnnl_memory_create(&e->mc, &c_md, d->eng, DNNL_MEMORY_NONE) == dnnl_success;
    if (ok) {
        const dnnl_memory_desc_t *s_md = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
        e->scratch_bytes = s_md ? dnnl_memory_desc_get_size(s_md) : 0;
        if (e->scratch_bytes) ok = dnnl_memory_create(&e->ms, s_md, d->eng, DNNL_MEMORY_NONE) == dnnl_success;
    }
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (attr) dnnl_primitive_attr_destroy(attr);
    return ok ? 0 : -1;
}

/* C = alpha op(A) op(B) + beta C on bf16 operands already packed [.., lda] / [.., ldb]. */
static int dnnl_run(Dnnl *d, int ta, int tb, int M, int N, int K, float alpha, const uint16_t *A, int lda,
                    const uint16_t *B, int ldb, float beta, float *C, int ldc) {
    DnnlEntry *e = NULL;
    for (int i = 0; i < d->n && !e; i++) {
        DnnlEntry *c = &d->e[i];
        if (c->ta == ta && c->tb == tb && c->M == M && c->N == N && c->K == K && c->lda == lda && c->ldb == ldb &&
            c->ldc == ldc && c->alpha == alpha && c->beta == beta)
            e = c;
    }
    if (!e) {
        if (d->n == d->cap) {
            const int cap = d->cap ? 2 * d->cap : 64;
            DnnlEntry *grown = realloc(d->e, sizeof *grown * (size_t)cap);
            if (!grown) return -1;
            d->e = grown, d->cap = cap;
        }
        e = &d->e[d->n];
        *e = (DnnlEntry){.ta = ta, .tb = tb, .M = M, .N = N, .K = K, .lda = lda, .ldb = ldb, .ldc = ldc,
                         .alpha = alpha, .beta = beta};
        if (dnnl_entry_create(d, e)) return -1;
        d->n++;
    }
    if (e->scratch_bytes > d->scratch_bytes) {
        free(d->scratch);
        d->scratch = aligned_alloc(64, (e->scratch_bytes + 63) / 64 * 64);
        d->scratch_bytes = d->scratch ? e->scratch_bytes : 0;
        if (!d->scratch) return -1;
    }
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, e->ma}, {DNNL_ARG_WEIGHTS, e->mb}, {DNNL_ARG_DST, e->mc},
                               {DNNL_ARG_SCRATCHPAD, e->ms}};
    if (dnnl_memory_set_data_handle(e->ma, (void *)A) != dnnl_success ||
        dnnl_memory_set_data_handle(e->mb, (void *)B) != dnnl_success ||
        dnnl_memory_set_data_handle(e->mc, C) != dnnl_success ||
        (e->ms && dnnl_memory_set_data_handle(e->ms, d->scratch) != dnnl_success) ||
        dnnl_primitive_execute(e->prim, d->strm, e->ms ? 4 : 3, args) != dnnl_success ||
        dnnl_stream_wait(d->strm) != dnnl_success)
        return -1;
    return 0;
}

/* The packed bf16 copy [bucket(rows), bucket(cols)] of a stable operand W [rows, cols] (ld) for generation gen. */
static const uint16_t *packed_stable(Dnnl *d, const float *W, int rows, int cols, int ld, int prows, int pcols,
                                     unsigned gen) {
    const size_t need = (size_t)prows * pcols;
    struct PackedOperand *e = NULL, *stale = NULL;
    for (int i = 0; i < d->nw && !e; i++) {
        struct PackedOperand *c = &d->w[i];
        if (c->src == W && c->rows == rows && c->cols == cols && c->ld == ld)
            e = c;
        else if (c->gen != gen && (!stale || (stale->cap < need && c->cap > stale->cap)))
            stale = c; /* not read in this generation: free for another operand (rows per expert change) */
    }
    if (!e && stale) {
        e = stale;
        e->src = W, e->rows = rows, e->cols = cols, e->ld = ld, e->gen = gen - 1;
    }
    if (!e) {
        if (d->nw == d->wcap) {
            const int cap = d->wcap ? 2 * d->wcap : 64;
            struct PackedOperand *grown = realloc(d->w, sizeof *grown * (size_t)cap);
            if (!grown) return NULL;
            d->w = grown, d->wcap = cap;
        }
        e = &d->w[d->nw++];
        *e = (struct PackedOperand){.src = W, .rows = rows, .cols = cols, .ld = ld, .gen = gen - 1};
    }
    if (e->cap < need) {
        free(e->packed);
        e->packed = malloc(sizeof *e->packed * need);
        e->cap = e->packed ? need : 0;
        if (!e->packed) {
            e->src = NULL;
            return NULL;
        }
    }
    if (e->gen != gen) {
        pack_bf16(e->packed, W, rows, cols, ld, prows, pcols);
        e->gen = gen;
    }
    return e->packed;
}

static void dnnl_free(Dnnl *d) {
    for (int i = 0; i < d->nw; i++) free(d->w[i].packed);
    free(d->w);
    for (int i = 0; i < d->n; i++) {
        dnnl_primitive_destroy(d->e[i].prim);
        dnnl_memory_destroy(d->e[i].ma), dnnl_memory_destroy(d->e[i].mb), dnnl_memory_destroy(d->e[i].mc);
        if (d->e[i].ms) dnnl_memory_destroy(d->e[i].ms);
    }
    free(d->e), free(d->scratch);
    if (d->strm) dnnl_stream_destroy(d->strm);
    if (d->eng) dnnl_engine_destroy(d->eng);
    free(d);
}

/* The bf16 product through oneDNN; -1 (C untouched) if it cannot run here. */
/* Operand slot (0: A, 1: B) of a product, packed to bf16 [prows, pcols] as its kind allows. */
static const uint16_t *packed_operand(ZyGemmCtx *ctx, Dnnl *d, int slot, const float *src, int rows, int cols, int ld,
                                      int prows, int pcols, int kind) {
    if (kind == ZY_MM_STABLE) return packed_stable(d, src, rows, cols, ld, prows, pcols, ctx->weights_gen);
    uint16_t *buf = scratch(ctx, slot, sizeof *buf * (size_t)prows * pcols);
    if (!buf) return NULL;
    for (int s = 0; s < 2 && kind == ZY_MM_AGAIN; s++) /* the caller's word that the contents are unchanged */
        if (d->last[s].src == src && d->last[s].rows == rows && d->last[s].cols == cols && d->last[s].ld == ld) {
            if (s != slot) memcpy(buf, ctx->scratch[s], sizeof *buf * (size_t)prows * pcols);
            goto remember;
        }
    pack_bf16(buf, src, rows, cols, ld, prows, pcols);
remember:
    d->last[slot].src = src, d->last[slot].rows = rows, d->last[slot].cols = cols, d->last[slot].ld = ld;
    return buf;
}

static int gemm_bf16_dnnl(ZyGemmCtx *ctx, int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                          int a_kind, const float *B, int ldb, int b_kind, float beta, float *C, int ldc) {
    Dnnl *d = ctx->dnnl;
    if (!d) {
        if (!dnnl_native_bf16()) return -1;
        d = ctx->dnnl = calloc(1, sizeof *d);
        if (!d) return -1;
        if (dnnl_engine_create(&d->eng, dnnl_cpu, 0) != dnnl_success ||
            dnnl_stream_create(&d->strm, d->eng, dnnl_stream_default_flags) != dnnl_success)
            d->broken = 1;
    }
    if (d->broken) return -1;
    const int Mp = bucket(M), Np = bucket(N), Kp = bucket(K);
    const int ar = ta ? K : M, ac = ta ? M : K, arp = ta ? Kp : Mp, acp = ta ? Mp : Kp;
    const int br = tb ? N : K, bc = tb ? K : N, brp = tb ? Np : Kp, bcp = tb ? Kp : Np;
    const int direct = Mp == M && Np == N; /* C itself can take the result */
    /* B first: an A packed "again" from slot 1 must be copied out before B overwrites that slot */
    const uint16_t *a = NULL, *b = NULL;
    if (a_kind == ZY_MM_AGAIN && d->last[1].src == A) {
        a = packed_operand(ctx, d, 0, A, ar, ac, lda, arp, acp, a_kind);
        b = packed_operand(ctx, d, 1, B, br, bc, ldb, brp, bcp, b_kind);
    } else {
        b = packed_operand(ctx, d, 1, B, br, bc, ldb, brp, bcp, b_kind);
        a = b ? packed_operand(ctx, d, 0, A, ar, ac, lda, arp, acp, a_kind) : NULL;
    }
    float *c = direct ? C : scratch(ctx, 2, sizeof *c * (size_t)Mp * Np);
    if (!a || !b || !c) return -1;
    if (dnnl_run(d, ta, tb, Mp, Np, Kp, alpha, a, acp, b, bcp, direct ? beta : 0.0f, c, direct ? ldc : Np)) {
        d->broken = 1;
        return -1;
    }
    if (!direct) {
#pragma omp parallel for schedule(static) if ((long)M * N >= 65536L)
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                float *y = C + (long)i * ldc + j;
                *y = (beta == 0.0f ? 0.0f : beta * *y) + c[(long)i * Np + j];
            }
    }
    return 0;
}
#endif

void zy_gemm_ctx_free(ZyGemmCtx *ctx) {
    if (!ctx) return;
    for (int i = 0; i < 3; i++) free(ctx->scratch[i]), ctx->scratch[i] = NULL, ctx->scratch_bytes[i] = 0;
#ifdef ZY_HAVE_DNNL
    if (ctx->dnnl) dnnl_free(ctx->dnnl);
#endif
    ctx->dnnl = NULL;
}

void zy_gemm_ctx_ex(ZyGemmCtx *ctx, int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda,
                    int a_kind, const float *B, int ldb, int b_kind, float beta, float *C, int ldc) {
    if (!ctx || !ctx->bf16 || M <= 0 || N <= 0 || K <= 0) {
        zy_gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
#ifdef ZY_HAVE_DNNL
    if (ctx->bf16 == ZY_BF16_PRODUCTS_ONEDNN && zy_cpu_level() >= ZY_CPU_AVX512BF16 &&
        gemm_bf16_dnnl(ctx, trans_a, trans_b, M, N, K, alpha, A, lda, a_kind, B, ldb, b_kind, beta, C, ldc) == 0)
        return;
#else
    (void)a_kind, (void)b_kind;
#endif
    const int ar = trans_a ? K : M, ac = trans_a ? M : K, br = trans_b ? N : K, bc = trans_b ? K : N;
    float *a = scratch(ctx, 0, sizeof *a * (size_t)ar * ac), *b = scratch(ctx, 1, sizeof *b * (size_t)br * bc);
    if (!a || !b) { /* no memory for the rounded copies: the fp32 product */
        zy_gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    round_f32(a, A, ar, ac, lda);
    round_f32(b, B, br, bc, ldb);
    zy_gemm(trans_a, trans_b, M, N, K, alpha, a, ac, b, bc, beta, C, ldc);
}

void zy_gemm_ctx(ZyGemmCtx *ctx, int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda,
                 const float *B, int ldb, float beta, float *C, int ldc) {
    zy_gemm_ctx_ex(ctx, trans_a, trans_b, M, N, K, alpha, A, lda, ZY_MM_TEMP, B, ldb, ZY_MM_TEMP, beta, C, ldc);
}

void zy_gemm_ctx_w(ZyGemmCtx *ctx, int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda,
                   const float *W, int ldw, float beta, float *C, int ldc) {
    zy_gemm_ctx_ex(ctx, trans_a, trans_b, M, N, K, alpha, A, lda, ZY_MM_TEMP, W, ldw, ZY_MM_STABLE, beta, C, ldc);
}

void zy_gemm_ctx_weights_changed(ZyGemmCtx *ctx) {
    if (ctx) ctx->weights_gen++;
}

void zy_matmul_wt_ctx(ZyGemmCtx *ctx, int rows, int out, int in, const float *X, int ldx, ZyWeights W, float *Y,
                      int ldy) {
    if (ctx && ctx->bf16 && W.f32)
        zy_gemm_ctx_ex(ctx, 0, 1, rows, out, in, 1.0f, X, ldx, ZY_MM_STABLE, W.f32, in, ZY_MM_STABLE, 0.0f, Y, ldy);
    else
        zy_matmul_wt(rows, out, in, X, ldx, W, Y, ldy);
}

void zy_matmul_wt_groups_ctx(ZyGemmCtx *ctx, int G, const int32_t *off, int out, int in, const float *X, int ldx,
                             ZyWeights W, float *Y, int ldy) {
    /* bf16 weights on AVX512-BF16: every group in one parallel region (a decoding step's experts have a few rows
     * each: one region per expert would be mostly fork, join and threads waiting) */
    if (!(ctx && ctx->bf16 && W.f32) && W.bf16 && out > 0 && in > 0 && zy_bf16_weights() == ZY_BF16W_DOT &&
        zy_matmul_bf16_dpbf16_groups(G, off, out, in, X, ldx, W.bf16, Y, ldy) == 0)
        return;
    const long stride = (long)out * in;
    for (int g = 0; g < G; g++) {
        const int s = off[g], n = off[g + 1] - off[g];
        if (n > 0)
            zy_matmul_wt_ctx(ctx, n, out, in, X + (long)s * ldx, ldx, zy_weights_offset(W, g * stride),
                             Y + (long)s * ldy, ldy);
    }
}

/* ---- which products a bf16 run computes ---- */
static const char *const product_names[] = {"fp32", "onednn", "sgemm"};

const char *zy_bf16_products_name(ZyBf16Products p) {
    return p == ZY_BF16_PRODUCTS_AUTO ? "auto" : p >= 0 && p <= ZY_BF16_PRODUCTS_SGEMM ? product_names[p] : "?";
}

int zy_bf16_products_parse(const char *s, ZyBf16Products *out, const char *what, ZyErr *err) {
    if (!s || !*s || strcmp(s, "auto") == 0) {
        *out = ZY_BF16_PRODUCTS_AUTO;
        return 0;
    }
    for (int i = 0; i <= ZY_BF16_PRODUCTS_SGEMM; i++)
        if (strcmp(s, product_names[i]) == 0) {
            *out = (ZyBf16Products)i;
            return 0;
        }
    return zy_fail(err, "%s: \"%s\" is not a way to run bf16 products (auto, fp32, onednn, sgemm)", what, s);
}

/* oneDNN runs bf16 matmuls on native instructions here: 1 with AMX tiles, 2 with AVX512-BF16 alone, 0 not at all. */
static int onednn_native(void) {
#ifdef ZY_HAVE_DNNL
    if (zy_cpu_level() < ZY_CPU_AVX512BF16 || !dnnl_native_bf16()) return 0;
    const unsigned isa = (unsigned)dnnl_get_effective_cpu_isa(), amx = (unsigned)dnnl_cpu_isa_avx512_core_amx;
    return (isa & amx) == amx ? 1 : 2;
#else
    return 0;
#endif
}

int zy_bf16_products_available(ZyBf16Products p, char *why, size_t cap) {
    if (p != ZY_BF16_PRODUCTS_ONEDNN || onednn_native()) return 1;
#ifdef ZY_HAVE_DNNL
    snprintf(why, cap, "oneDNN has no native bf16 kernel here (%s)",
             zy_cpu_level() < ZY_CPU_AVX512BF16 ? "the kernel level is below avx512bf16" : "no AVX512-BF16 or AMX");
#else
    snprintf(why, cap, "this zaya is built without oneDNN");
#endif
    return 0;
}

/* Seconds for one [M, K] x [N, K]ᵀ product under p, the best of 3 after a warm-up. */
static double time_product(ZyBf16Products p, int M, int N, int K, const float *A, const float *W, float *C) {
    ZyGemmCtx ctx = {.bf16 = p};
    zy_gemm_ctx_weights_changed(&ctx);
    double best = 1e30;
    for (int i = 0; i < 4; i++) {
        const double t0 = zy_now_seconds();
        zy_gemm_ctx_w(&ctx, 0, 1, M, N, K, 1.0f, A, K, W, K, 0.0f, C, N);
        const double t = zy_now_seconds() - t0;
        if (i > 0 && t < best) best = t; /* the first is the warm-up: oneDNN builds its primitive, packs W */
    }
    zy_gemm_ctx_free(&ctx);
    return best;
}

ZyBf16Products zy_bf16_products_resolve(ZyBf16Products p, int M, int N, int K, char *why, size_t cap) {
    if (p != ZY_BF16_PRODUCTS_AUTO) {
        snprintf(why, cap, "as asked");
        return p;
    }
    const int native = onednn_native();
    if (native == 1) {
        snprintf(why, cap, "oneDNN with AMX tiles (bf16 products ~2x sgemm's rate)");
        return ZY_BF16_PRODUCTS_ONEDNN;
    }
    if (native == 0) {
        snprintf(why, cap, "this CPU has no bf16 matrix unit (AMX or AVX512-BF16 under oneDNN): bf16-rounded inputs "
                           "would run the same sgemm plus the rounding, so the products stay fp32");
        return ZY_BF16_PRODUCTS_FP32;
    }
    /* AVX512-BF16 without AMX: oneDNN's dot-product kernels win on some CPUs and lose on others (0.71x sgemm measured
     * on a Sapphire Rapids held to AVX512-BF16): timed on this run's own product shape */
    M = M < 16 ? 16 : M > 2048 ? 2048 : M;
    float *A = malloc(sizeof *A * (size_t)M * K), *W = malloc(sizeof *W * (size_t)N * K), *C = malloc(sizeof *C * (size_t)M * N);
    if (!A || !W || !C) {
        free(A), free(W), free(C);
        snprintf(why, cap, "no memory to time oneDNN against sgemm: fp32 products");
        return ZY_BF16_PRODUCTS_FP32;
    }
    ZyRng rng;
    zy_rng_seed(&rng, 1);
    for (long i = 0; i < (long)M * K; i++) A[i] = (float)zy_rng_normal(&rng);
    for (long i = 0; i < (long)N * K; i++) W[i] = (float)zy_rng_normal(&rng) * 0.02f;
    const double t_dnn = time_product(ZY_BF16_PRODUCTS_ONEDNN, M, N, K, A, W, C);
    const double t_f32 = time_product(ZY_BF16_PRODUCTS_FP32, M, N, K, A, W, C);
    free(A), free(W), free(C);
    const ZyBf16Products pick = t_dnn * 1.05 < t_f32 ? ZY_BF16_PRODUCTS_ONEDNN : ZY_BF16_PRODUCTS_FP32;
    snprintf(why, cap, "AVX512-BF16 without AMX: a [%d, %d] x [%d, %d] product took %.2f ms on oneDNN bf16, %.2f ms on "
                       "fp32 sgemm, so %s", M, K, K, N, t_dnn * 1e3, t_f32 * 1e3,
             pick == ZY_BF16_PRODUCTS_ONEDNN ? "oneDNN" : "fp32 products");
    return pick;
}

void zy_gemm_bf16_backend(ZyBf16Products p, char *out, size_t cap) {
    if (p == ZY_BF16_PRODUCTS_FP32) {
        snprintf(out, cap, "fp32 (OpenBLAS sgemm)");
        return;
    }
#ifdef ZY_HAVE_DNNL
    const dnnl_version_t *v = dnnl_version();
    const int native = onednn_native();
    if (p == ZY_BF16_PRODUCTS_ONEDNN && native) {
        snprintf(out, cap, "oneDNN %d.%d.%d matmul, %s", v->major, v->minor, v->patch,
                 native == 1 ? "AMX tiles (and AVX512-BF16)" : "AVX512-BF16 dot products");
        return;
    }
    snprintf(out, cap, "inputs rounded to bf16, widened to fp32 for OpenBLAS sgemm (%s)",
             p == ZY_BF16_PRODUCTS_SGEMM ? "as asked"
             : zy_cpu_level() < ZY_CPU_AVX512BF16 ? "oneDNN is built in but the kernel level is below avx512bf16"
                                                 : "oneDNN is built in but has no native bf16 kernel on this CPU");
#else
    snprintf(out, cap, "inputs rounded to bf16, widened to fp32 for OpenBLAS sgemm (built without oneDNN)");
#endif
}

double zy_gemm_bf16_probe_gflops(ZyBf16Products p, int n, double seconds) {
    float *a = zy_calloc((size_t)n * n * sizeof(float)), *b = zy_calloc((size_t)n * n * sizeof(float));
    float *c = zy_calloc((size_t)n * n * sizeof(float));
    ZyGemmCtx ctx = {.bf16 = p};
    double best = 0;
    if (a && b && c) {
        for (size_t i = 0; i < (size_t)n * n; i++) a[i] = b[i] = (float)((i % 7) - 3) * 0.01f;
        zy_gemm_ctx(&ctx, 0, 0, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n); /* warm-up: primitive, threads, caches */
        const double flops = 2.0 * n * (double)n * n, start = zy_now_seconds();
        do {
            int reps = 0;
            double t0 = zy_now_seconds(), t;
            do {
                zy_gemm_ctx(&ctx, 0, 0, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
                reps++;
                t = zy_now_seconds() - t0;
            } while (t < seconds / 8);
            if (flops * reps / t / 1e9 > best) best = flops * reps / t / 1e9;
        } while (zy_now_seconds() - start < seconds);
    }
    zy_gemm_ctx_free(&ctx);
    zy_free(a), zy_free(b), zy_free(c);
    return best;
}
