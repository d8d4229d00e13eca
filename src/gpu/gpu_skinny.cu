/* gpu_skinny: products of a few rows (decoding's steps, gpu_kernels.h gk_skinny_*), where a tiled GEMM's tiles are
 * mostly padding and each product is a launch or two of its own. The bf16 runs' product, read at memory speed:
 * x rounded to bf16 (nearest even) as it is loaded, bf16 weights, fp32 sums; one launch for several products of the
 * same rows, and the experts with their SwiGLU and gate-and-combine done in the same launch as their products.
 *
 * A block computes U output units (a column of one product; for SwiGLU the gate and up columns of one unit) for
 * every row: its threads split the reduction dimension K in 8-element pieces (one 16-byte weight load each), each
 * thread applies its piece of the rows' x to all U units, then the sums go through a warp butterfly and the warps'
 * partials are added in warp order in shared memory: fixed order, the same bits on every run. */
#include <stdint.h>

#include "gpu_common.cuh"
#include "gpu_kernels.h"
#include "gpu_router.cuh"

namespace {

constexpr int SK_THREADS = 256; /* most threads a block: 2,048 elements of K a pass */
constexpr int SK_WARPS = SK_THREADS / GPU_WARP;

enum SkinnyMode { SK_PLAIN, SK_SWIGLU, SK_DOWN };

template <int MODE>
struct SkinnyShape {
    static constexpr int U = MODE == SK_SWIGLU ? 2 : 4;  /* units a block */
    static constexpr int NV = MODE == SK_SWIGLU ? 2 : 1; /* weight rows a unit (gate and up) */
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

template <int ROWS, int MODE>
__global__ void __launch_bounds__(SK_THREADS) skinny_kernel(SkinnyArgs a) {
    constexpr int U = SkinnyShape<MODE>::U, NV = SkinnyShape<MODE>::NV, S = U * NV;
    __shared__ float part[SK_WARPS][ROWS * S];
    const int lane = threadIdx.x % GPU_WARP, wid = threadIdx.x / GPU_WARP, nw = blockDim.x / GPU_WARP;
    const int unit0 = blockIdx.x * U;
    const long K = a.K, k0 = (long)threadIdx.x * 8;

    /* slot s = u·NV + v: its weight row's offset from the row's weight base (SK_PLAIN: the row itself, or NULL) */
    const uint16_t *wrow[S];
    long woff[S];
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int g = unit0 + u;
#pragma unroll
        for (int v = 0; v < NV; v++) {
            wrow[u * NV + v] = nullptr, woff[u * NV + v] = -1;
            if (g >= a.n_units) continue;
            if (MODE == SK_PLAIN) {
                int j = 0, c = g;
                while (c >= a.outs[j].n) c -= a.outs[j].n, j++;
                wrow[u] = a.outs[j].w + (long)c * K;
            } else {
                woff[u * NV + v] = ((long)g + (long)v * a.I) * K; /* SwiGLU: gate row g, up row I + g */
            }
        }
    }
    /* SK_PLAIN's weights do not depend on the step: the first pass's pieces are loaded before waiting for the kernel
     * that writes x (programmatic launch, gpu_common.cuh), so they stream in while it finishes. The experts' rows are
     * chosen by the router's kernel: they wait. */
    uint4 wfirst[S];
#pragma unroll
    for (int s = 0; s < S; s++) wfirst[s] = make_uint4(0, 0, 0, 0);
    if (MODE == SK_PLAIN && k0 < K)
#pragma unroll
        for (int s = 0; s < S; s++)
            if (wrow[s]) wfirst[s] = load_w16(wrow[s] + k0);
    gk_pdl_enter();

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
    for (long k = k0; k < K; k += (long)blockDim.x * 8) {
        float xv[ROWS][8];
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            if (r < a.rows && (MODE == SK_PLAIN || wbase[r]))
                load_x8(xv[r], a.x + r * a.ldx + k);
            else
#pragma unroll
                for (int q = 0; q < 8; q++) xv[r][q] = 0.0f;
        }
        float w[8];
        if (MODE == SK_PLAIN) { /* one weight row for every row of x */
#pragma unroll
            for (int s = 0; s < S; s++) {
                if (!wrow[s]) continue;
                widen_w8(w, k == k0 ? wfirst[s] : load_w16(wrow[s] + k));
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
                    if (woff[s] < 0) continue;
                    widen_w8(w, load_w16(wbase[r] + woff[s] + k));
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
            if (lane == 0) part[wid][r * S + s] = t;
        }
    __syncthreads();
    /* thread t < ROWS·U finishes unit t % U of row t / U: the warps' partials in order, then the epilogue */
    const int t = threadIdx.x;
    if (t >= ROWS * U) return;
    const int r = t / U, u = t % U, g = unit0 + u;
    if (r >= a.rows || g >= a.n_units) return;
    float sum[NV];
#pragma unroll
    for (int v = 0; v < NV; v++) {
        float z = part[0][r * S + u * NV + v];
        for (int i = 1; i < nw; i++) z += part[i][r * S + u * NV + v];
        sum[v] = z;
    }
    if (MODE == SK_PLAIN) {
        int j = 0, c = g;
        while (c >= a.outs[j].n) c -= a.outs[j].n, j++;
        float z = sum[0];
        if (a.outs[j].bias) z = gk_gelu(z + a.outs[j].bias[c]); /* gk_bias_gelu_forward's: the sum, then GELU */
        a.outs[j].y[(long)r * a.outs[j].ldy + c] = z;
        return;
    }
    const int e = a.choice[r];
    const bool routed = e >= 0 && e < a.E;
    if (MODE == SK_SWIGLU) { /* gk_swiglu_forward's formula; skip-expert rows are left alone */
        if (routed) a.y[r * a.ldy + g] = sum[0] / (1.0f + expf(-sum[0])) * sum[NV - 1];
    } else { /* gk_moe_combine's: gate · y, 0 for the skip expert */
        a.y[r * a.ldy + g] = routed ? a.gate[r] * sum[0] : 0.0f;
    }
}

inline bool al16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* Shapes every form needs: rows in range, K whole 16-byte pieces, x's rows on 16-byte boundaries. */
bool skinny_fits(const float *x, long ldx, int rows, int K) {
    return rows >= 1 && rows <= GK_SKINNY_ROWS && K >= 8 && K % 8 == 0 && ldx >= K && ldx % 4 == 0 && al16(x);
}

template <int MODE>
void skinny_launch(GkStream s, const SkinnyArgs &a) {
    constexpr int U = SkinnyShape<MODE>::U;
    const int blocks = (a.n_units + U - 1) / U;
    /* enough whole warps to cover K once in 8-element pieces, at most SK_THREADS */
    int threads = (a.K / 8 + GPU_WARP - 1) / GPU_WARP * GPU_WARP;
    threads = threads > SK_THREADS ? SK_THREADS : threads;
    if (a.rows <= 1)
        GK_LAUNCH_PDL((skinny_kernel<1, MODE>), dim3(blocks), dim3(threads), 0, s, a);
    else if (a.rows <= 2)
        GK_LAUNCH_PDL((skinny_kernel<2, MODE>), dim3(blocks), dim3(threads), 0, s, a);
    else if (a.rows <= 4)
        GK_LAUNCH_PDL((skinny_kernel<4, MODE>), dim3(blocks), dim3(threads), 0, s, a);
    else
        GK_LAUNCH_PDL((skinny_kernel<8, MODE>), dim3(blocks), dim3(threads), 0, s, a);
    GK_LAUNCH_CHECK();
}

/* ---- the router's tail (gk_skinny_router_tail): one block for the state norm, the two hidden layers, the class
 * logits and the choice of every row, which as separate launches are five. Each product is skinny_kernel<ROWS,
 * SK_PLAIN>'s sum at K <= 8 lanes of a warp (its one-warp case): lane l's chain over elements 8l..8l+7, then the warp
 * butterfly, so the tail gives those launches' bits. */
constexpr int RT_THREADS = 512;
constexpr int RT_WARPS = RT_THREADS / GPU_WARP;
constexpr int RT_MAX_R = 8 * GPU_WARP < 256 ? 8 * GPU_WARP : 256;     /* K a warp covers in one pass; the unit cap */
constexpr int RT_UPW = (RT_MAX_R + RT_WARPS - 1) / RT_WARPS;         /* units a warp, at most */

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
            if (lane == 0 && r < rows) y[(long)r * ldy + u] = b ? gk_gelu(t + b[u]) : t;
        }
    }
}

template <int ROWS>
__global__ void __launch_bounds__(RT_THREADS, 1) router_tail_kernel(GkRouterTail a) {
    __align__(16) __shared__ float xs[ROWS][RT_MAX_R];
    __align__(16) __shared__ float hs[ROWS][RT_MAX_R];
    const int lane = threadIdx.x % GPU_WARP, warp = threadIdx.x / GPU_WARP, R = a.R;
    /* the first hidden layer's weights stream in while the down projection before this kernel finishes */
    uint4 w1[RT_UPW];
#pragma unroll
    for (int i = 0; i < RT_UPW; i++) {
        const int u = warp + i * RT_WARPS;
        w1[i] = lane * 8 < R && u < R ? load_w16(a.w1 + (long)u * R + lane * 8) : make_uint4(0, 0, 0, 0);
    }
    gk_pdl_enter();
    if (warp < a.rows) /* z += bias (+ r_prev ⊙ γ) in place, its norm into xs */
        state_rmsnorm_row<4>(a.z + (long)warp * R, xs[warp], nullptr, a.bias,
                             a.r_prev ? a.r_prev + (long)warp * R : nullptr, a.gamma, a.norm_w, R, a.eps);
    __syncthreads();
    tail_products<ROWS>(&hs[0][0], RT_MAX_R, xs, a.w1, a.b1, R, R, a.rows, w1);
    __syncthreads();
    tail_products<ROWS>(&xs[0][0], RT_MAX_R, hs, a.w2, a.b2, R, R, a.rows, nullptr);
    __syncthreads();
    tail_products<ROWS>(a.logits, a.classes, xs, a.w_out, nullptr, a.classes, R, a.rows, nullptr);
    __syncthreads(); /* the block's logits writes, visible to its warps */
    if (warp < a.rows)
        router_choice_row(a.probs + (long)warp * a.classes, a.choice + warp, a.gate + warp,
                          a.logits + (long)warp * a.classes, a.balance_bias, a.classes);
}

} // namespace

extern "C" int gk_skinny_router_tail(GkStream s, const GkRouterTail *t) {
    const GkRouterTail &a = *t;
    if (a.rows < 1 || a.rows > GK_SKINNY_ROWS || a.R < 8 || a.R % 8 || a.R > RT_MAX_R || a.classes < 1 ||
        a.classes > RT_MAX_R)
        return -1;
    for (const void *p : {(const void *)a.z, (const void *)a.bias, (const void *)a.norm_w, (const void *)a.w1,
                          (const void *)a.w2, (const void *)a.w_out})
        if (!p || !al16(p))
            return -1;
    if (!a.b1 || !a.b2 || !a.logits || !a.probs || !a.choice || !a.gate || !a.balance_bias ||
        (a.r_prev && (!al16(a.r_prev) || !a.gamma || !al16(a.gamma))))
        return -1;
    if (a.rows <= 1)
        GK_LAUNCH_PDL(router_tail_kernel<1>, dim3(1), dim3(RT_THREADS), 0, s, a);
    else if (a.rows <= 2)
        GK_LAUNCH_PDL(router_tail_kernel<2>, dim3(1), dim3(RT_THREADS), 0, s, a);
    else if (a.rows <= 4)
        GK_LAUNCH_PDL(router_tail_kernel<4>, dim3(1), dim3(RT_THREADS), 0, s, a);
    else
        GK_LAUNCH_PDL(router_tail_kernel<8>, dim3(1), dim3(RT_THREADS), 0, s, a);
    GK_LAUNCH_CHECK();
    return 0;
}

extern "C" int gk_skinny_mm(GkStream s, const float *x, int ldx, int rows, int K, const GkSkinnyOut *outs,
                            int n_outs) {
    if (!skinny_fits(x, ldx, rows, K) || n_outs < 1 || n_outs > GK_SKINNY_OUTS) return -1;
    SkinnyArgs a = {};
    a.x = x, a.ldx = ldx, a.rows = rows, a.K = K, a.n_outs = n_outs;
    long units = 0;
    for (int j = 0; j < n_outs; j++) {
        if (outs[j].n < 1 || !outs[j].y || outs[j].ldy < outs[j].n || !al16(outs[j].w)) return -1;
        a.outs[j] = outs[j];
        units += outs[j].n;
    }
    if (units > (1L << 30)) return -1;
    a.n_units = (int)units;
    skinny_launch<SK_PLAIN>(s, a);
    return 0;
}

extern "C" int gk_skinny_expert_swiglu(GkStream s, float *act, const float *x, const int32_t *choice,
                                       const uint16_t *w_gate_up, int rows, int D, int I, int E) {
    if (!skinny_fits(x, D, rows, D) || I < 1 || E < 1 || !al16(w_gate_up)) return -1;
    SkinnyArgs a = {};
    a.x = x, a.ldx = D, a.rows = rows, a.K = D, a.n_units = I;
    a.choice = choice, a.w = w_gate_up, a.w_stride = 2L * I * D, a.E = E, a.I = I, a.y = act, a.ldy = I;
    skinny_launch<SK_SWIGLU>(s, a);
    return 0;
}

extern "C" int gk_skinny_expert_down(GkStream s, float *out, const float *act, const int32_t *choice,
                                     const float *gate, const uint16_t *w_down, int rows, int I, int D, int E) {
    if (!skinny_fits(act, I, rows, I) || D < 1 || E < 1 || !al16(w_down)) return -1;
    SkinnyArgs a = {};
    a.x = act, a.ldx = I, a.rows = rows, a.K = I, a.n_units = D;
    a.choice = choice, a.gate = gate, a.w = w_down, a.w_stride = (long)D * I, a.E = E, a.y = out, a.ldy = D;
    skinny_launch<SK_DOWN>(s, a);
    return 0;
}
