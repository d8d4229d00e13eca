/* gpu_norms: RMSNorm, the residual merge fused with it and the input embedding on the GPU (gpu_kernels.h; the
 * cross-entropy is gpu_xent.cu). Each op computes its CPU namesake's maths (src/kernels/kernels.inc) with the same
 * layouts. Layout of the work: the norms give a block to a row (the row is read twice, the second time from L1), the
 * embedding ops a warp to a row; column sums (parameter gradients) use col_sums below, whose summation order
 * depends only on the shape. No float atomics anywhere: every run gives the same bits. */
#include <math.h>
#include <string.h>

#include "gpu_common.cuh"
#include "gpu_kernels.h"
#include "gpu_norms.cuh"

/* ---- shared pieces ---------------------------------------------------------------------------------------- */

#define ROW_THREADS 256 /* warp-per-row kernels (embedding): 8 rows a block, 4 on a 64-wide AMD warp */
#define ROWS_PER_BLOCK (ROW_THREADS / GPU_WARP)

/* Warp-per-row loop: every lane of a warp walks the same rows (the warp reductions need all lanes). */
#define FOR_EACH_ROW_OF_WARP(r, rows)                                                                            \
    for (long r = (long)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / GPU_WARP; r < (rows);                       \
         r += (long)gridDim.x * ROWS_PER_BLOCK)

static inline int row_blocks(long rows) { return gk_blocks(rows, ROWS_PER_BLOCK); }

/* The norms give a block to a row (gpu_norms.cuh's norm_threads threads). */
using norms::NORM_MAX_THREADS;
using norms::norm_threads;
static inline int norm_blocks(long rows) { return rows < 65535L * 16 ? (int)rows : 65535 * 16; }
#define FOR_EACH_ROW_OF_BLOCK(r, rows) for (long r = blockIdx.x; r < (rows); r += gridDim.x)
#define FOR_EACH_PACK_OF_ROW(i, dim) for (int i = threadIdx.x * W; i < (dim); i += blockDim.x * W)

/* Column sums of several quantities at once: for each column c, acc[a] = Σ_r term_a(r, c) in double, then
 * F::finish(c, acc) adds them into the gradients. A block owns F::cols adjacent columns (32 or 64 bytes of a row)
 * and F::row_threads thread rows split the rows in a fixed stride, each loading F::rows_ahead rows before using any
 * (loads in flight even where F also writes elementwise outputs); the partial sums are then added in thread-row
 * order. The order depends only on `rows`: deterministic. The shape is per functor (measured on an H100 at 2048 x
 * 1536: narrow tiles give more blocks, wider ones fuller memory transactions). F provides: a Row type (the values
 * of one element), column(c) (per-column constants), load(r, c), use(r, c, Row, acc) (may write element (r, c):
 * only this thread touches it) and finish(c, acc). */
template <int NACC, class F>
__global__ void __launch_bounds__(F::cols *F::row_threads) col_sums_kernel(F f, long rows, int dim) {
    constexpr int CW = F::cols, CR = F::row_threads, CU = F::rows_ahead;
    __shared__ double part[NACC][CR][CW];
    const int tx = threadIdx.x % CW, ty = threadIdx.x / CW;
    const int c = blockIdx.x * CW + tx;
    double acc[NACC];
#pragma unroll
    for (int a = 0; a < NACC; a++) acc[a] = 0;
    if (c < dim) {
        F g = f;
        g.column(c);
        for (long r0 = ty; r0 < rows; r0 += CR * CU) {
            typename F::Row v[CU] = {};
#pragma unroll
            for (int u = 0; u < CU; u++)
                if (r0 + u * CR < rows) v[u] = g.load(r0 + u * CR, c);
#pragma unroll
            for (int u = 0; u < CU; u++)
                if (r0 + u * CR < rows) g.use(r0 + u * CR, c, v[u], acc);
        }
    }
#pragma unroll
    for (int a = 0; a < NACC; a++) part[a][ty][tx] = acc[a];
    __syncthreads();
    if (ty == 0 && c < dim) {
        double tot[NACC];
#pragma unroll
        for (int a = 0; a < NACC; a++) {
            tot[a] = 0;
            for (int i = 0; i < CR; i++) tot[a] += part[a][i][tx];
        }
        f.finish(c, tot);
    }
}

template <int NACC, class F>
static void col_sums(gpuStream_t s, long rows, int dim, const F &f) {
    if (dim <= 0) return;
    GK_LAUNCH((col_sums_kernel<NACC, F>), (dim + F::cols - 1) / F::cols, F::cols * F::row_threads, 0, s, f, rows, dim);
    GK_LAUNCH_CHECK();
}

/* ---- RMSNorm ---------------------------------------------------------------------------------------------- */

/* y = w ⊙ x · rstd, rstd = 1 / sqrt(mean(x²) + eps): gpu_norms.cuh's row body, a block a row. */
template <int W>
__global__ void __launch_bounds__(NORM_MAX_THREADS)
    rmsnorm_forward_kernel(float *y, float *rstd, const float *x, const float *w, int rows, int dim, float eps) {
    gk_pdl_enter();
    __shared__ double red[32];
    FOR_EACH_ROW_OF_BLOCK(r, rows) norms::rmsnorm_row<W>(y, rstd, x + r * dim, w, r, dim, eps, blockDim.x, red);
}

/* out = base + rstd·(w⊙dy) − x·rstd³·mean(x⊙w⊙dy), per row in double as the CPU. out == base for the plain
 * backward (dx +=); the fused merge backward writes dx + that into separate scratch. */
template <int W>
__global__ void __launch_bounds__(NORM_MAX_THREADS)
    rmsnorm_dx_kernel(float *out, const float *base, const float *dy, const float *x, const float *w,
                      const float *rstd, int rows, int dim) {
    __shared__ double red[32];
    FOR_EACH_ROW_OF_BLOCK(r, rows) {
        const long o = r * dim;
        double dot = 0;
#pragma unroll 4
        FOR_EACH_PACK_OF_ROW(i, dim) {
            const Pack<W> g = load_pack<W>(dy + o + i), a = load_pack<W>(x + o + i), wv = load_pack<W>(w + i);
#pragma unroll
            for (int k = 0; k < W; k++) dot += (double)g.v[k] * wv.v[k] * a.v[k];
        }
        dot = block_sum_d(dot, red);
        const double s = rstd[r], c = dot * s * s * s / dim;
        FOR_EACH_PACK_OF_ROW(i, dim) {
            const Pack<W> g = load_pack<W>(dy + o + i), a = load_pack<W>(x + o + i), wv = load_pack<W>(w + i);
            Pack<W> b = load_pack<W>(base + o + i);
#pragma unroll
            for (int k = 0; k < W; k++) b.v[k] += (float)(s * g.v[k] * wv.v[k] - c * a.v[k]);
            store_pack<W>(out + o + i, b);
        }
    }
}

/* dw[c] += Σ_r dy·x·rstd[r]. */
struct RmsnormDw {
    static constexpr int cols = 8, row_threads = 64, rows_ahead = 8;
    float *dw;
    const float *dy, *x, *rstd;
    int dim;
    struct Row {
        float dy, x, s;
    };
    __device__ void column(int) {}
    __device__ Row load(long r, int c) const {
        const long j = r * dim + c;
        return Row{dy[j], x[j], rstd[r]};
    }
    __device__ void use(long, int, const Row &v, double *acc) const { acc[0] += (double)v.dy * v.x * v.s; }
    __device__ void finish(int c, const double *t) const { dw[c] += (float)t[0]; }
};

extern "C" void gk_rmsnorm_forward(GkStream s, float *y, float *rstd, const float *x, const float *w, int rows,
                                   int dim, float eps) {
    if (rows <= 0 || dim <= 0) return;
    if (can_vec4(dim, {y, x, w}))
        GK_LAUNCH_PDL((rmsnorm_forward_kernel<4>), norm_blocks(rows), norm_threads(dim, 4), 0, s, y, rstd, x, w, rows,
                      dim, eps);
    else
        GK_LAUNCH_PDL((rmsnorm_forward_kernel<1>), norm_blocks(rows), norm_threads(dim, 1), 0, s, y, rstd, x, w, rows,
                      dim, eps);
    GK_LAUNCH_CHECK();
}

extern "C" void gk_rmsnorm_backward(GkStream s, float *dx, float *dw, const float *dy, const float *x, const float *w,
                                    const float *rstd, int rows, int dim) {
    if (rows <= 0 || dim <= 0) return;
    if (dx) {
        if (can_vec4(dim, {dx, dy, x, w}))
            GK_LAUNCH(rmsnorm_dx_kernel<4>, norm_blocks(rows), norm_threads(dim, 4), 0, s, dx, dx, dy, x, w, rstd,
                      rows, dim);
        else
            GK_LAUNCH(rmsnorm_dx_kernel<1>, norm_blocks(rows), norm_threads(dim, 1), 0, s, dx, dx, dy, x, w, rstd,
                      rows, dim);
        GK_LAUNCH_CHECK();
    }
    if (dw) col_sums<1>(s, rows, dim, RmsnormDw{dw, dy, x, rstd, dim});
}

/* ---- residual merge fused with RMSNorm ---------------------------------------------------------------------- */

/* out = (h + hb) ⊙ hs + (res + rb) ⊙ rs, then y = RMSNorm(out; w): gpu_norms.cuh's row body, a block a row. */
template <int W>
__global__ void __launch_bounds__(NORM_MAX_THREADS)
    merge_rmsnorm_forward_kernel(float *out, float *y, float *rstd, const float *h, const float *res,
                                 const float *hs, const float *hb, const float *rs, const float *rb, const float *w,
                                 int rows, int dim, float eps) {
    gk_pdl_enter();
    __shared__ double red[32];
    FOR_EACH_ROW_OF_BLOCK(r, rows)
    norms::merge_rmsnorm_row<W>(out, y, rstd, h, res, hs, hb, rs, rb, w, r, dim, eps, blockDim.x, red);
}

/* The column pass of rmsnorm_merge_backward: dh holds dout = dL/dx (total) from the row pass. Sums dw, dhs, dhb,
 * drs, drb and writes dh = dout ⊙ hs, dx = dout ⊙ rs (each element read and written by one thread). */
struct MergeBackwardCols {
    static constexpr int cols = 16, row_threads = 32, rows_ahead = 8;
    float *dx, *dh, *dw, *dhs, *dhb, *drs, *drb;
    const float *du, *x, *rstd, *h, *res, *hs, *hb, *rs, *rb;
    int dim;
    float hs_c, hb_c, rs_c, rb_c;
    struct Row {
        float dout, du, x, s, h, res;
    };
    __device__ void column(int c) { hs_c = hs[c], hb_c = hb[c], rs_c = rs[c], rb_c = rb[c]; }
    __device__ Row load(long r, int c) const {
        const long j = r * dim + c;
        return Row{dh[j], du[j], x[j], rstd[r], h[j], res[j]};
    }
    __device__ void use(long r, int c, const Row &v, double *acc) const {
        const long j = r * dim + c;
        acc[0] += (double)v.du * v.x * v.s;
        acc[1] += (double)v.dout * (v.h + hb_c);
        acc[2] += v.dout;
        acc[3] += (double)v.dout * (v.res + rb_c);
        acc[4] += v.dout;
        dh[j] = v.dout * hs_c;
        dx[j] = v.dout * rs_c;
    }
    __device__ void finish(int c, const double *t) const {
        if (dw) dw[c] += (float)t[0];
        if (dhs) dhs[c] += (float)t[1];
        if (dhb) dhb[c] += (float)(t[2] * hs[c]);
        if (drs) drs[c] += (float)t[3];
        if (drb) drb[c] += (float)(t[4] * rs[c]);
    }
};

extern "C" void gk_merge_rmsnorm_forward(GkStream s, float *out, float *y, float *rstd, const float *h,
                                         const float *res, const float *hs, const float *hb, const float *rs,
                                         const float *rb, const float *w, int rows, int dim, float eps) {
    if (rows <= 0 || dim <= 0) return;
    if (can_vec4(dim, {out, y, h, res, hs, hb, rs, rb, w}))
        GK_LAUNCH_PDL((merge_rmsnorm_forward_kernel<4>), norm_blocks(rows), norm_threads(dim, 4), 0, s, out, y, rstd, h,
                      res, hs, hb, rs, rb, w, rows, dim, eps);
    else
        GK_LAUNCH_PDL((merge_rmsnorm_forward_kernel<1>), norm_blocks(rows), norm_threads(dim, 1), 0, s, out, y, rstd, h,
                      res, hs, hb, rs, rb, w, rows, dim, eps);
    GK_LAUNCH_CHECK();
}

/* As the CPU: on entry dx = dL/dx from the residual path, du = dL/du; on exit dx = dL/dres, dh = dL/dh
 * (overwritten), dw, dhs, dhb, drs, drb accumulate. Two passes: per row the RMSNorm gradient added to dx, kept in
 * dh (overwritten anyway, so it serves as the scratch), then per column the sums and the final dh, dx. */
extern "C" void gk_rmsnorm_merge_backward(GkStream s, float *dx, float *dh, float *dw, float *dhs, float *dhb,
                                          float *drs, float *drb, const float *du, const float *x, const float *w,
                                          const float *rstd, const float *h, const float *res, const float *hs,
                                          const float *hb, const float *rs, const float *rb, int rows, int dim) {
    if (rows <= 0 || dim <= 0) return;
    if (can_vec4(dim, {dh, dx, du, x, w}))
        GK_LAUNCH(rmsnorm_dx_kernel<4>, norm_blocks(rows), norm_threads(dim, 4), 0, s, dh, dx, du, x, w, rstd, rows,
                  dim);
    else
        GK_LAUNCH(rmsnorm_dx_kernel<1>, norm_blocks(rows), norm_threads(dim, 1), 0, s, dh, dx, du, x, w, rstd, rows,
                  dim);
    GK_LAUNCH_CHECK();
    MergeBackwardCols f{dx, dh, dw, dhs, dhb, drs, drb, du, x, rstd, h, res, hs, hb, rs, rb, dim, 0, 0, 0, 0};
    col_sums<5>(s, rows, dim, f);
}

/* ---- input embedding: x = (Emb[tok] + b) ⊙ s ---------------------------------------------------------------- */

template <int W>
__global__ void __launch_bounds__(ROW_THREADS)
    embed_forward_kernel(float *x, const float *emb, const uint16_t *emb16, const int32_t *tokens, const float *bias,
                         const float *scale, int rows, int dim) {
    gk_pdl_enter();
    const int lane = threadIdx.x % GPU_WARP;
    FOR_EACH_ROW_OF_WARP(r, rows) {
        const long at = (long)tokens[r] * dim;
        const float *e = emb16 ? nullptr : emb + at;
        const uint16_t *e16 = emb16 ? emb16 + at : nullptr;
        float *xr = x + r * dim;
        for (int i = lane * W; i < dim; i += GPU_WARP * W)
            store_pack<W>(xr + i, norms::embed_value<W>(e, e16, bias, scale, i));
    }
}

/* demb[tok] += Σ dx[row] ⊙ scale over the rows of each distinct token, one warp a token, the rows in their order
 * (the CPU's order too: it walks all rows in order). The product is rounded before the add (__fmul_rn keeps the
 * compiler from fusing it), as on the CPU. The pad token's row gets nothing. */
template <int W>
__global__ void __launch_bounds__(ROW_THREADS)
    embed_demb_kernel(float *demb, const float *dx, const float *scale, int dim, int pad_id,
                      const int32_t *plan_rows, const int32_t *plan_start, const int32_t *plan_tok,
                      const int32_t *plan_count) {
    const int lane = threadIdx.x % GPU_WARP;
    const int n_uniq = *plan_count; /* read on the device: a captured graph replays any batch's plan */
    FOR_EACH_ROW_OF_WARP(u, n_uniq) {
        const int tok = plan_tok[u];
        if (tok == pad_id) continue;
        const int beg = plan_start[u], end = plan_start[u + 1];
        float *de = demb + (long)tok * dim;
        for (int i = lane * W; i < dim; i += GPU_WARP * W) {
            Pack<W> acc = load_pack<W>(de + i);
            const Pack<W> sc = load_pack<W>(scale + i);
            for (int k = beg; k < end; k++) {
                const Pack<W> g = load_pack<W>(dx + (long)plan_rows[k] * dim + i);
#pragma unroll
                for (int q = 0; q < W; q++) acc.v[q] += __fmul_rn(g.v[q], sc.v[q]);
            }
            store_pack<W>(de + i, acc);
        }
    }
}

/* dbias[c] += scale[c]·Σ_r dx, dscale[c] += Σ_r dx·(Emb[tok_r] + b) over all rows (the pad's too, as the CPU). */
struct EmbedBiasScale {
    static constexpr int cols = 8, row_threads = 128, rows_ahead = 4;
    float *dbias, *dscale;
    const float *dx, *emb, *bias, *scale;
    const int32_t *tokens;
    int dim;
    float bias_c;
    struct Row {
        float g, e;
    };
    __device__ void column(int c) { bias_c = bias[c]; }
    __device__ Row load(long r, int c) const { return Row{dx[r * dim + c], emb[(long)tokens[r] * dim + c]}; }
    __device__ void use(long, int, const Row &v, double *acc) const {
        acc[0] += v.g;
        acc[1] += (double)v.g * (v.e + bias_c);
    }
    __device__ void finish(int c, const double *t) const {
        if (dbias) dbias[c] += (float)(t[0] * scale[c]);
        if (dscale) dscale[c] += (float)t[1];
    }
};

extern "C" void gk_embed_forward(GkStream s, float *x, const float *emb, const uint16_t *emb16, const int32_t *tokens,
                                 const float *bias, const float *scale, int rows, int dim) {
    if (rows <= 0 || dim <= 0) return;
    if (can_vec4(dim, {x, emb16 ? bias : emb, bias, scale}))
        GK_LAUNCH_PDL((embed_forward_kernel<4>), row_blocks(rows), ROW_THREADS, 0, s, x, emb, emb16, tokens, bias, scale,
                      rows, dim);
    else
        GK_LAUNCH_PDL((embed_forward_kernel<1>), row_blocks(rows), ROW_THREADS, 0, s, x, emb, emb16, tokens, bias, scale,
                      rows, dim);
    GK_LAUNCH_CHECK();
}

extern "C" void gk_embed_backward(GkStream s, float *demb, float *dbias, float *dscale, const float *dx,
                                  const float *emb, const int32_t *tokens, const float *bias, const float *scale,
                                  int rows, int dim, int pad_id, const int32_t *plan_rows, const int32_t *plan_start,
                                  const int32_t *plan_tok, const int32_t *plan_count) {
    if (rows <= 0 || dim <= 0) return;
    if (demb) { /* sized for every row a distinct token (the plan's bound): the blocks past its count return */
        if (can_vec4(dim, {demb, dx, scale}))
            GK_LAUNCH(embed_demb_kernel<4>, row_blocks(rows), ROW_THREADS, 0, s, demb, dx, scale, dim, pad_id,
                      plan_rows, plan_start, plan_tok, plan_count);
        else
            GK_LAUNCH(embed_demb_kernel<1>, row_blocks(rows), ROW_THREADS, 0, s, demb, dx, scale, dim, pad_id,
                      plan_rows, plan_start, plan_tok, plan_count);
        GK_LAUNCH_CHECK();
    }
    if (dbias || dscale) col_sums<2>(s, rows, dim, EmbedBiasScale{dbias, dscale, dx, emb, bias, scale, tokens, dim, 0});
}

/* Host: a stable counting sort of the rows by token (work = the per-token counts, then each token's next slot).
 * Tokens outside [0, V) are left out of the plan (the CPU op would read out of bounds; here it would write out of
 * bounds of `work`). */
extern "C" int gk_embed_plan(const int32_t *tokens, int rows, int V, int32_t *plan_rows, int32_t *plan_start,
                             int32_t *plan_tok, int32_t *work) {
    plan_start[0] = 0;
    if (rows <= 0 || V <= 0) return 0;
    memset(work, 0, (size_t)V * sizeof *work);
    for (int r = 0; r < rows; r++)
        if (tokens[r] >= 0 && tokens[r] < V) work[tokens[r]]++;
    int n_uniq = 0, pos = 0;
    for (int v = 0; v < V; v++) {
        const int count = work[v];
        if (!count) continue;
        plan_tok[n_uniq] = v;
        plan_start[n_uniq++] = pos;
        work[v] = pos;
        pos += count;
    }
    plan_start[n_uniq] = pos;
    for (int r = 0; r < rows; r++)
        if (tokens[r] >= 0 && tokens[r] < V) plan_rows[work[tokens[r]]++] = r;
    return n_uniq;
}

/* ---- sum -------------------------------------------------------------------------------------------------- */

#define SUM_THREADS 1024
/* Σ x over one block in a fixed order; valid == NULL: *out = Σ; else *out += (*valid ? Σ / *valid : 0), a pass's mean
 * loss added to a step's (the division and the sum in double, in the order the passes ran). */
__global__ void __launch_bounds__(SUM_THREADS) sum_kernel(double *out, const float *x, long n, const int32_t *valid) {
    __shared__ double red[32];
    double acc = 0;
    for (long i = threadIdx.x; i < n; i += SUM_THREADS) acc += x[i];
    acc = block_sum_d(acc, red);
    if (threadIdx.x != 0) return;
    if (!valid)
        *out = acc;
    else
        *out += *valid ? acc / *valid : 0.0;
}

/* Launched for n == 0 too: the contract is *out = Σ, so an empty sum writes 0 rather than leaving a stale value. */
extern "C" void gk_sum(GkStream s, double *out, const float *x, long n) {
    GK_LAUNCH(sum_kernel, 1, SUM_THREADS, 0, s, out, x, n < 0 ? 0 : n, (const int32_t *)nullptr);
    GK_LAUNCH_CHECK();
}

extern "C" void gk_loss_add(GkStream s, double *acc, const float *row_loss, long n, const int32_t *valid) {
    GK_LAUNCH(sum_kernel, 1, SUM_THREADS, 0, s, acc, row_loss, n < 0 ? 0 : n, valid);
    GK_LAUNCH_CHECK();
}

/* One block: the count of targets ≥ 0 (exact in int) and the gradient's scale 1/count in fp32 (0 without any), the
 * host's former arithmetic. */
__global__ void __launch_bounds__(SUM_THREADS) loss_scale_kernel(float *scale, int32_t *valid, const int32_t *targets,
                                                               int rows) {
    __shared__ double red[32];
    double count = 0; /* a block sum of whole numbers below 2^53: exact */
    for (int i = threadIdx.x; i < rows; i += SUM_THREADS) count += targets[i] >= 0;
    count = block_sum_d(count, red);
    if (threadIdx.x != 0) return;
    const int n = (int)count;
    *valid = n;
    *scale = n ? 1.0f / (float)n : 0.0f;
}

extern "C" void gk_loss_scale(GkStream s, float *scale, int32_t *valid, const int32_t *targets, int rows) {
    GK_LAUNCH(loss_scale_kernel, 1, SUM_THREADS, 0, s, scale, valid, targets, rows < 0 ? 0 : rows);
    GK_LAUNCH_CHECK();
}
