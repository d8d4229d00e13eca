/* gpu_skinny.cuh: the few-row products' block bodies (gpu_skinny.cu launches them one kernel each; gpu_decode_layer.cu
 * runs them as phases of a decoding layer's persistent kernel). A body computes one "virtual block" (blk) with the
 * first `threads` threads of the real block, the thread count its own launch would have, so both give the same bits;
 * every thread of the real block calls it (its barriers), shared memory comes from the caller. */
#ifndef ZAYA_GPU_SKINNY_CUH
#define ZAYA_GPU_SKINNY_CUH

#include <stdint.h>

#include "gpu_common.cuh"
#include "gpu_kernels.h"
#include "gpu_router.cuh"

namespace skinny {

constexpr int SK_THREADS = 256; /* most threads a block: 2,048 elements of K a pass */
constexpr int SK_WARPS = SK_THREADS / GPU_WARP;

enum SkinnyMode { SK_PLAIN, SK_SWIGLU, SK_DOWN };

template <int MODE>
struct SkinnyShape {
    static constexpr int U = MODE == SK_SWIGLU ? 2 : 4;  /* units a block */
    static constexpr int NV = MODE == SK_SWIGLU ? 2 : 1; /* weight rows a unit (gate and up) */
    static constexpr int S = U * NV;                     /* weight rows a block */
};

struct SkinnyArgs {
    const float *x;
    long ldx;
    int rows, K, n_units;
    /* SK_PLAIN: the products, units numbered through them in order */
    GkSkinnyOut outs[GK_SKINNY_OUTS];
    int n_outs;
    /* SK_SWIGLU / SK_DOWN: row r's weights W + choice[r] w_stride (choice outside [0, E): the skip expert) */
    const int32_t *choice;
    const float *gate;
    const uint16_t *w;
    long w_stride;
    int E, I;
    float *y;
    long ldy;
};

/* Threads of a product over K: enough whole warps to cover K once in 8-element pieces, at most SK_THREADS. */
__host__ __device__ inline int skinny_threads(int K) {
    const int t = (K / 8 + GPU_WARP - 1) / GPU_WARP * GPU_WARP;
    return t > SK_THREADS ? SK_THREADS : t;
}
template <int MODE> __host__ __device__ inline int skinny_blocks(int n_units) {
    return (n_units + SkinnyShape<MODE>::U - 1) / SkinnyShape<MODE>::U;
}
/* Shared floats a body needs (part). */
template <int ROWS, int MODE> __host__ __device__ constexpr int skinny_smem_floats() {
    return SK_WARPS * ROWS * SkinnyShape<MODE>::S;
}

/* 8 consecutive x values rounded to bf16 (as the products' operand copies are), as floats. */
__device__ __forceinline__ void load_x8(float (&v)[8], const float *p) {
    const float4 a = *reinterpret_cast<const float4 *>(p), b = *reinterpret_cast<const float4 *>(p + 4);
    v[0] = gk_bf16_round(a.x), v[1] = gk_bf16_round(a.y), v[2] = gk_bf16_round(a.z), v[3] = gk_bf16_round(a.w);
    v[4] = gk_bf16_round(b.x), v[5] = gk_bf16_round(b.y), v[6] = gk_bf16_round(b.z), v[7] = gk_bf16_round(b.w);
}
/* 8 consecutive bf16 weights (one 16-byte load; the lower half of each word is the earlier element), as floats. */
__device__ __forceinline__ uint4 load_w16(const uint16_t *p) { return *reinterpret_cast<const uint4 *>(p); }
__device__ __forceinline__ void widen_w8(float (&v)[8], const uint4 t) {
    const unsigned u[4] = {t.x, t.y, t.z, t.w};
#pragma unroll
    for (int i = 0; i < 4; i++) v[2 * i] = __uint_as_float(u[i] << 16), v[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
}

/* A block's weight rows and the first pass's pieces of them. SK_PLAIN's weights do not depend on the step, so they
 * may be loaded before waiting for the writer of x (programmatic launch; a persistent kernel's barrier); the experts'
 * rows are chosen by the router and are found after the wait (skinny_block). */
template <int MODE> struct SkinnyPre {
    const uint16_t *wrow[SkinnyShape<MODE>::S];
    long woff[SkinnyShape<MODE>::S];
    uint4 wfirst[SkinnyShape<MODE>::S];
};
template <int MODE>
__device__ __forceinline__ SkinnyPre<MODE> skinny_prefetch(const SkinnyArgs &a, int blk, int threads) {
    constexpr int U = SkinnyShape<MODE>::U, NV = SkinnyShape<MODE>::NV, S = SkinnyShape<MODE>::S;
    SkinnyPre<MODE> p;
    const int unit0 = blk * U;
    const long K = a.K, k0 = (long)threadIdx.x * 8;
    /* slot s = u·NV + v: its weight row's offset from the row's weight base (SK_PLAIN: the row itself, or NULL) */
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int g = unit0 + u;
#pragma unroll
        for (int v = 0; v < NV; v++) {
            p.wrow[u * NV + v] = nullptr, p.woff[u * NV + v] = -1;
            if (g >= a.n_units) continue;
            if (MODE == SK_PLAIN) {
                int j = 0, c = g;
                while (c >= a.outs[j].n) c -= a.outs[j].n, j++;
                p.wrow[u] = a.outs[j].w + (long)c * K;
            } else {
                p.woff[u * NV + v] = ((long)g + (long)v * a.I) * K; /* SwiGLU: gate row g, up row I + g */
            }
        }
    }
#pragma unroll
    for (int s = 0; s < S; s++) p.wfirst[s] = make_uint4(0, 0, 0, 0);
    if (MODE == SK_PLAIN && (int)threadIdx.x < threads && k0 < K)
#pragma unroll
        for (int s = 0; s < S; s++)
            if (p.wrow[s]) p.wfirst[s] = load_w16(p.wrow[s] + k0);
    return p;
}

/* Virtual block blk's weight rows asked of the L2 cache (gk_prefetch_l2) ahead of the phase that reads them: for
 * SK_DOWN (the experts' rows, chosen by the router) only once choice is known. The block's threads share the lines. */
template <int MODE> __device__ __forceinline__ void skinny_prefetch_l2(const SkinnyArgs &a, int blk) {
    constexpr int U = SkinnyShape<MODE>::U;
    static_assert(MODE != SK_SWIGLU, "the gate and up rows are read as soon as the router has chosen");
    const long bytes = (long)a.K * 2;
    for (int u = 0; u < U; u++) {
        const int g = blk * U + u;
        if (g >= a.n_units) break;
        if (MODE == SK_PLAIN) {
            int j = 0, c = g;
            while (c >= a.outs[j].n) c -= a.outs[j].n, j++;
            gk_prefetch_l2(a.outs[j].w + (long)c * a.K, bytes);
        } else {
            for (int r = 0; r < a.rows; r++) {
                const int e = a.choice[r];
                if (e >= 0 && e < a.E) gk_prefetch_l2(a.w + (long)e * a.w_stride + (long)g * a.K, bytes);
            }
        }
    }
}

/* Units blk·U.. of every row: the threads split K in 8-element pieces, each applies its piece of the rows' x to all
 * U units, a warp butterfly, then the warps' partials added in warp order (part: skinny_smem_floats). x: a.x, or the
 * same rows elsewhere (a persistent kernel's copy in shared memory), at a.ldx. Ends with a barrier: part may be reused
 * right after. */
template <int ROWS, int MODE>
__device__ __forceinline__ void skinny_block(const SkinnyArgs &a, const float *x, int blk, int threads, float *part,
                                             const SkinnyPre<MODE> &p) {
    constexpr int U = SkinnyShape<MODE>::U, NV = SkinnyShape<MODE>::NV, S = SkinnyShape<MODE>::S;
    const int lane = threadIdx.x % GPU_WARP, wid = threadIdx.x / GPU_WARP, nw = threads / GPU_WARP;
    const int unit0 = blk * U;
    const bool active = (int)threadIdx.x < threads;
    const long K = a.K, k0 = (long)threadIdx.x * 8;

    const uint16_t *wbase[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        wbase[r] = nullptr;
        if (MODE != SK_PLAIN && r < a.rows) {
            const int e = a.choice[r];
            if (e >= 0 && e < a.E) wbase[r] = a.w + (long)e * a.w_stride;
        }
    }

    float acc[ROWS][S];
#pragma unroll
    for (int r = 0; r < ROWS; r++)
#pragma unroll
        for (int s = 0; s < S; s++) acc[r][s] = 0.0f;
    for (long k = k0; active && k < K; k += (long)threads * 8) {
        float xv[ROWS][8];
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            if (r < a.rows && (MODE == SK_PLAIN || wbase[r]))
                load_x8(xv[r], x + r * a.ldx + k);
            else
#pragma unroll
                for (int q = 0; q < 8; q++) xv[r][q] = 0.0f;
        }
        float w[8];
        if (MODE == SK_PLAIN) { /* one weight row for every row of x */
#pragma unroll
            for (int s = 0; s < S; s++) {
                if (!p.wrow[s]) continue;
                widen_w8(w, k == k0 ? p.wfirst[s] : load_w16(p.wrow[s] + k));
#pragma unroll
                for (int r = 0; r < ROWS; r++)
#pragma unroll
                    for (int q = 0; q < 8; q++) acc[r][s] = fmaf(xv[r][q], w[q], acc[r][s]);
            }
        } else { /* each row its expert's */
#pragma unroll
            for (int r = 0; r < ROWS; r++) {
                if (!wbase[r]) continue;
#pragma unroll
                for (int s = 0; s < S; s++) {
                    if (p.woff[s] < 0) continue;
                    widen_w8(w, load_w16(wbase[r] + p.woff[s] + k));
#pragma unroll
                    for (int q = 0; q < 8; q++) acc[r][s] = fmaf(xv[r][q], w[q], acc[r][s]);
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < ROWS; r++)
#pragma unroll
        for (int s = 0; s < S; s++) {
            const float t = warp_sum(acc[r][s]);
            if (lane == 0 && wid < nw) part[wid * ROWS * S + r * S + s] = t;
        }
    __syncthreads();
    /* thread t < ROWS·U finishes unit t % U of row t / U: the warps' partials in order, then the epilogue */
    const int t = threadIdx.x, r = t / U, u = t % U, g = unit0 + u;
    if (t < ROWS * U && r < a.rows && g < a.n_units) {
        float sum[NV];
#pragma unroll
        for (int v = 0; v < NV; v++) {
            float z = part[r * S + u * NV + v];
            for (int i = 1; i < nw; i++) z += part[i * ROWS * S + r * S + u * NV + v];
            sum[v] = z;
        }
        if (MODE == SK_PLAIN) {
            int j = 0, c = g;
            while (c >= a.outs[j].n) c -= a.outs[j].n, j++;
            float z = sum[0];
            if (a.outs[j].bias) z = gk_gelu(z + a.outs[j].bias[c]); /* gk_bias_gelu_forward's: the sum, then GELU */
            a.outs[j].y[(long)r * a.outs[j].ldy + c] = z;
        } else {
            const int e = a.choice[r];
            const bool routed = e >= 0 && e < a.E;
            if (MODE == SK_SWIGLU) { /* gk_swiglu_forward's formula; skip-expert rows are left alone */
                if (routed) a.y[r * a.ldy + g] = sum[0] / (1.0f + expf(-sum[0])) * sum[NV - 1];
            } else { /* gk_moe_combine's: gate · y, 0 for the skip expert */
                a.y[r * a.ldy + g] = routed ? a.gate[r] * sum[0] : 0.0f;
            }
        }
    }
    __syncthreads();
}

/* ---- the router's tail: one block for the state norm, the two hidden layers, the class logits and the choice of
 * every row. Each product is skinny_block<ROWS, SK_PLAIN>'s sum at K <= 8 lanes of a warp (its one-warp case): lane
 * l's chain over elements 8l..8l+7, then the warp butterfly, so the tail gives those launches' bits. */
constexpr int RT_THREADS = 512;
constexpr int RT_WARPS = RT_THREADS / GPU_WARP;
constexpr int RT_MAX_R = 8 * GPU_WARP < 256 ? 8 * GPU_WARP : 256; /* K a warp covers in one pass; the unit cap */
constexpr int RT_UPW = (RT_MAX_R + RT_WARPS - 1) / RT_WARPS;     /* units a warp, at most */

/* GkRouterTail's shapes (gk_skinny_router_tail's refusals). */
inline bool router_tail_fits(const GkRouterTail &a) {
    const auto al16 = [](const void *p) { return ((uintptr_t)p & 15u) == 0; };
    if (a.rows < 1 || a.rows > GK_SKINNY_ROWS || a.R < 8 || a.R % 8 || a.R > RT_MAX_R || a.classes < 1 ||
        a.classes > RT_MAX_R)
        return false;
    for (const void *p : {(const void *)a.z, (const void *)a.bias, (const void *)a.norm_w, (const void *)a.w1,
                          (const void *)a.w2, (const void *)a.w_out})
        if (!p || !al16(p)) return false;
    return a.b1 && a.b2 && a.logits && a.probs && a.choice && a.gate && a.balance_bias &&
           (!a.r_prev || (al16(a.r_prev) && a.gamma && al16(a.gamma)));
}

/* y[r, u] = Σ_k bf16(x[r, k]) W[u, k] (+ b[u], then GELU) for u < n, K <= RT_MAX_R; x rows in shared memory. Warp w
 * takes units w, w + RT_WARPS, ...; pre: those units' weight pieces already loaded (or nullptr). */
template <int ROWS>
__device__ __forceinline__ void tail_products(float *y, int ldy, const float (*x)[RT_MAX_R], const uint16_t *W,
                                              const float *b, int n, int K, int rows, const uint4 *pre) {
    const int lane = threadIdx.x % GPU_WARP, warp = threadIdx.x / GPU_WARP;
    const int k = lane * 8;
    const bool mine = k < K;
#pragma unroll
    for (int i = 0; i < RT_UPW; i++) {
        const int u = warp + i * RT_WARPS;
        if (u >= n) break; /* uniform over the warp */
        float acc[ROWS];
#pragma unroll
        for (int r = 0; r < ROWS; r++) acc[r] = 0.0f;
        if (mine) {
            float w[8];
            widen_w8(w, pre ? pre[i] : load_w16(W + (long)u * K + k));
#pragma unroll
            for (int r = 0; r < ROWS; r++) /* x re-read from shared memory for each unit: registers hold the weights */
                if (r < rows)
#pragma unroll
                    for (int q = 0; q < 8; q++) acc[r] = fmaf(gk_bf16_round(x[r][k + q]), w[q], acc[r]);
        }
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            const float t = warp_sum(acc[r]);
            if (lane == 0 && r < rows) y[(long)r * ldy + u] = b ? t + b[u] : t;
        }
    }
    if (b) { /* GELU of the warp's outputs, a lane each: one copy of erfcf's code, not one a unit and row */
        gk_syncwarp();
        for (int j = lane; j < RT_UPW * rows; j += GPU_WARP) {
            const int u = warp + j / rows * RT_WARPS, r = j % rows;
            if (u < n) y[(long)r * ldy + u] = gk_gelu(y[(long)r * ldy + u]);
        }
    }
}

/* The first hidden layer's weight pieces of this thread (loaded before the wait for the down projection). */
struct RouterTailPre {
    uint4 w1[RT_UPW];
};
__device__ __forceinline__ RouterTailPre router_tail_prefetch(const GkRouterTail &a) {
    const int lane = threadIdx.x % GPU_WARP, warp = threadIdx.x / GPU_WARP, R = a.R;
    RouterTailPre p;
#pragma unroll
    for (int i = 0; i < RT_UPW; i++) {
        const int u = warp + i * RT_WARPS;
        p.w1[i] = warp < RT_WARPS && lane * 8 < R && u < R ? load_w16(a.w1 + (long)u * R + lane * 8)
                                                            : make_uint4(0, 0, 0, 0);
    }
    return p;
}
/* Shared floats the tail needs (xs, hs). */
template <int ROWS> __host__ __device__ constexpr int router_tail_smem_floats() { return 2 * ROWS * RT_MAX_R; }

/* The tail on RT_THREADS threads of the block (more may call it: they only pass the barriers); sm: 16-byte aligned,
 * router_tail_smem_floats. Ends with a barrier. */
template <int ROWS>
__device__ __forceinline__ void router_tail_block(const GkRouterTail &a, float *sm, const RouterTailPre &p) {
    float(*xs)[RT_MAX_R] = reinterpret_cast<float(*)[RT_MAX_R]>(sm);
    float(*hs)[RT_MAX_R] = reinterpret_cast<float(*)[RT_MAX_R]>(sm + ROWS * RT_MAX_R);
    const int warp = threadIdx.x / GPU_WARP, R = a.R;
    const bool in = warp < RT_WARPS;
    if (warp < a.rows) /* z += bias (+ r_prev ⊙ γ) in place, its norm into xs */
        state_rmsnorm_row<4>(a.z + (long)warp * R, xs[warp], nullptr, a.bias,
                             a.r_prev ? a.r_prev + (long)warp * R : nullptr, a.gamma, a.norm_w, R, a.eps);
    __syncthreads();
    if (in) tail_products<ROWS>(&hs[0][0], RT_MAX_R, xs, a.w1, a.b1, R, R, a.rows, p.w1);
    __syncthreads();
    if (in) tail_products<ROWS>(&xs[0][0], RT_MAX_R, hs, a.w2, a.b2, R, R, a.rows, nullptr);
    __syncthreads();
    if (in) tail_products<ROWS>(a.logits, a.classes, xs, a.w_out, nullptr, a.classes, R, a.rows, nullptr);
    __syncthreads(); /* the block's logits writes, visible to its warps */
    if (warp < a.rows)
        router_choice_row(a.probs + (long)warp * a.classes, a.choice + warp, a.gate + warp,
                          a.logits + (long)warp * a.classes, a.balance_bias, a.classes);
    __syncthreads();
}

} // namespace skinny

#endif
