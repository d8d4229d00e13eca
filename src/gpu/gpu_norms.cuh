/* gpu_norms.cuh: RMSNorm and the residual merge fused with it, one row a block, and the embedding's values
 * (gpu_norms.cu launches them over rows; gpu_decode_layer.cu runs them as phases of a decoding step's persistent
 * kernel). The thread count is the launch's
 * (norm_threads: it depends on dim only, so the summation order does too); a caller with more threads passes that
 * count, and its other threads pass the barriers only. */
#ifndef ZAYA_GPU_NORMS_CUH
#define ZAYA_GPU_NORMS_CUH

#include <math.h>

#include "gpu_common.cuh"

namespace norms {

/* Row ops with a reduction (the norms) give a block to a row, about 4 W-packs a thread: at 2048 rows a warp per
 * row leaves the H100 at ~16 warps an SM (measured: merge_rmsnorm_forward at 2048 x 1536 ~10% slower that way). */
constexpr int NORM_MAX_THREADS = 512;
__host__ __device__ inline int norm_threads(int dim, int W) {
    const int packs = (dim + W - 1) / W, t = ((packs + 3) / 4 + 63) / 64 * 64; /* ~4 packs a thread */
    return t < 64 ? 64 : t > NORM_MAX_THREADS ? NORM_MAX_THREADS : t;
}

/* v = (h + hb) ⊙ hs + (res + rb) ⊙ rs with every product rounded (no fused multiply-add, as the CPU build): the
 * second pass recomputes it from the inputs (still in L1) bit for bit instead of reading `out` back. */
template <int W>
__device__ __forceinline__ Pack<W> merge_value(const float *h, const float *res, const float *hs, const float *hb,
                                               const float *rs, const float *rb, long o, int i) {
    const Pack<W> a = load_pack<W>(h + o + i), b = load_pack<W>(res + o + i);
    const Pack<W> hsv = load_pack<W>(hs + i), hbv = load_pack<W>(hb + i);
    const Pack<W> rsv = load_pack<W>(rs + i), rbv = load_pack<W>(rb + i);
    Pack<W> v;
#pragma unroll
    for (int k = 0; k < W; k++)
        v.v[k] = __fadd_rn(__fmul_rn(a.v[k] + hbv.v[k], hsv.v[k]), __fmul_rn(b.v[k] + rbv.v[k], rsv.v[k]));
    return v;
}

/* Row r: out = (h + hb) ⊙ hs + (res + rb) ⊙ rs, then y = RMSNorm(out; w), by the block's first `threads` threads
 * (Σ in double; red: 32 doubles of shared scratch). The first pass only loads (many loads in flight), the second
 * recomputes v and writes out and y. Threads past `threads` add +0.0 to the sum of squares: the same bits. out, y and
 * rstd may be NULL (not written); y2, when given, gets y's values too (a copy in shared memory, say: row r at
 * y2 + r·dim). */
template <int W>
__device__ __forceinline__ void merge_rmsnorm_row(float *out, float *y, float *rstd, const float *h, const float *res,
                                                  const float *hs, const float *hb, const float *rs, const float *rb,
                                                  const float *w, long r, int dim, float eps, int threads,
                                                  double *red, float *y2 = nullptr) {
    const long o = r * dim;
    const int first = (int)threadIdx.x < threads ? (int)threadIdx.x * W : dim;
    double ss = 0;
#pragma unroll 4
    for (int i = first; i < dim; i += threads * W) {
        const Pack<W> v = merge_value<W>(h, res, hs, hb, rs, rb, o, i);
#pragma unroll
        for (int k = 0; k < W; k++) ss += (double)v.v[k] * v.v[k];
    }
    ss = block_sum_d(ss, red);
    const float s = (float)(1.0 / sqrt(ss / dim + eps));
    if (threadIdx.x == 0 && rstd) rstd[r] = s;
    for (int i = first; i < dim; i += threads * W) {
        const Pack<W> v = merge_value<W>(h, res, hs, hb, rs, rb, o, i), wv = load_pack<W>(w + i);
        Pack<W> z;
#pragma unroll
        for (int k = 0; k < W; k++) z.v[k] = wv.v[k] * (v.v[k] * s);
        if (out) store_pack<W>(out + o + i, v);
        if (y) store_pack<W>(y + o + i, z);
        if (y2) store_pack<W>(y2 + o + i, z);
    }
}

/* Row r: y = RMSNorm(x; w), rstd = 1 / sqrt(mean(x²) + eps) (Σx² in double, as the CPU), xr being the row's values
 * (x's row r, or a copy in shared memory), by the block's first `threads` threads as merge_rmsnorm_row. The second
 * pass re-reads x (from L1). y and rstd may be NULL; y2, when given, gets y's values too (row r at y2 + r·dim). */
template <int W>
__device__ __forceinline__ void rmsnorm_row(float *y, float *rstd, const float *xr, const float *w, long r, int dim,
                                            float eps, int threads, double *red, float *y2 = nullptr) {
    const long o = r * dim;
    const int first = (int)threadIdx.x < threads ? (int)threadIdx.x * W : dim;
    double ss = 0;
#pragma unroll 4
    for (int i = first; i < dim; i += threads * W) {
        const Pack<W> a = load_pack<W>(xr + i);
#pragma unroll
        for (int k = 0; k < W; k++) ss += (double)a.v[k] * a.v[k];
    }
    ss = block_sum_d(ss, red);
    const float s = (float)(1.0 / sqrt(ss / dim + eps));
    if (threadIdx.x == 0 && rstd) rstd[r] = s;
    for (int i = first; i < dim; i += threads * W) {
        const Pack<W> a = load_pack<W>(xr + i), wv = load_pack<W>(w + i);
        Pack<W> z;
#pragma unroll
        for (int k = 0; k < W; k++) z.v[k] = wv.v[k] * (a.v[k] * s);
        if (y) store_pack<W>(y + o + i, z);
        if (y2) store_pack<W>(y2 + o + i, z);
    }
}

/* The embedding's values at [i, i + W) of a row: (emb_row + bias) ⊙ scale; from the row's bf16 copy where emb16_row
 * is set (bf16 inference: widened exactly, so a row that came as bf16 gives the fp32 row's values; its loads are
 * element by element, so only bias and scale set the vector form). */
template <int W>
__device__ __forceinline__ Pack<W> embed_value(const float *emb_row, const uint16_t *emb16_row, const float *bias,
                                               const float *scale, int i) {
    Pack<W> a;
    if (emb16_row) {
#pragma unroll
        for (int k = 0; k < W; k++) a.v[k] = gk_bf16_float(emb16_row[i + k]);
    } else {
        a = load_pack<W>(emb_row + i);
    }
    const Pack<W> b = load_pack<W>(bias + i), sc = load_pack<W>(scale + i);
    Pack<W> o;
#pragma unroll
    for (int k = 0; k < W; k++) o.v[k] = (a.v[k] + b.v[k]) * sc.v[k];
    return o;
}

} // namespace norms

#endif
