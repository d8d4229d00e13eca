/* gpu_attention: causal GQA flash attention on the GPU, fp32 on the CUDA cores (no matrix units in this version).
 * The same maths and layouts as flash_attention_forward/backward (src/kernels/attention.h): Q, O, dQ, dO [B*T, Hq*dh]
 * (row = b*T + t), K, V, dK, dV [B*T, Hkv*dh], LSE [B, Hq, T]; query head h reads kv head h / (Hq/Hkv); scores
 * scaled by 1/sqrt(dh); the [T, T] scores are never stored.
 *
 * Every kernel is the same pattern on tiles staged in shared memory: a block owns BR "rows" (queries, or keys in
 * the dK/dV kernel) and walks blocks of BC "columns" (keys, or queries). 128 threads as TY x TX = 16 x 8:
 *   - score tile S[BR][BC] in registers, thread (ty, tx) holding rows row(ty, i) (i < RQ) x columns tx + 8*j
 *     (j < CK); a row's scores sit in 8 consecutive lanes (row max / sum: 3 xor shuffles). A warp's rows are one
 *     contiguous band (its diagonal work can be skipped warp-uniformly) with its 4 thread rows interleaved, so
 *     the float4 reads of the padded rows (stride D + 4) and of the P / dS tile (stride BC + 8) hit 4 different
 *     bank groups: no conflicts, 12 shared-memory wavefronts per 128 FMAs;
 *   - accumulators [BR][D] (O, dQ, dK, dV): the same rows x head columns 4*tx + 32*k (+0..3), so a read of a
 *     P / dS row feeds 4·D/8 FMAs and global stores are coalesced float4s.
 * Large per-thread tiles (4 x 8 scores, 4 x 16 accumulators at dh = 128) keep shared-memory traffic under the
 * FMA rate; two blocks fit an SM at dh <= 128. Column blocks entirely above the diagonal are never visited; the
 * blocks that cross it are masked (key > query). A sliding window (window > 0, "hybrid_sliding" layers: query q
 * sees keys q-window+1 .. q) also skips the blocks wholly before the window and masks every visited one.
 *
 * Forward: one block per (b, h, 64 queries), online softmax in registers in base 2 (exp2f, scores times log2 e),
 * LSE stored in natural log as on the CPU.
 * Backward, deterministic without atomics, three kernels with fixed loop orders:
 *   1. Dlt[b, h, t] = Σ_d dO ⊙ O (into `work`, laid out as LSE), one warp per (token, head);
 *   2. one block per (b, kv head, 64 keys): dK, dV of those keys over the group's query heads (outer loop) and the
 *      32-query blocks at or below the diagonal (inner), Sᵀ = K Qᵀ and dPᵀ = V dOᵀ recomputed per block;
 *   3. one block per (b, h, 64 queries): dQ over the 32-key blocks at or below the diagonal.
 * Each gradient element is owned by one thread of one block, summed in a fixed order, then added (+=) once.
 *
 * Head sizes: templated on a padded head size D in {32, 64, 128, 256} (smaller tiles at 256 to fit shared memory);
 * any dh <= 256 runs with the next D up, the extra columns zero-filled (they add nothing to the dot products). */
#include <stdint.h>

#include "gpu_common.cuh"
#include "gpu_kernels.h"

namespace {

constexpr int NT = 128;              /* threads per block */
constexpr int TX = 8;                /* lanes along a score row and along the head dim */
constexpr int WY = GPU_WARP / TX;    /* thread rows per warp */
constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.6931471805599453f;

/* The thread layout of one kernel: BR rows per block, column blocks of BC, padded head size D. */
template <int D, int BR, int BC>
struct Lay {
    static constexpr int TY = NT / TX;
    static constexpr int RQ = BR / TY;         /* rows per thread */
    static constexpr int CK = BC / TX;         /* score columns per thread */
    static constexpr int NC = D / TX;          /* head-dim columns per thread */
    static constexpr int VW = NC < 4 ? NC : 4; /* ... as vectors of VW floats */
    static constexpr int NV = NC / VW;
    static constexpr int LDS = D + 4;  /* row stride of staged Q / K / V / dO tiles: 4 consecutive rows, 4 bank groups */
    static constexpr int LDW = BC + 8; /* row stride of the P / dS tile: conflict-free scalar writes, float4 reads */
    static_assert(TY % WY == 0 && BR % TY == 0 && BC % TX == 0 && BC % 4 == 0 && D % 32 == 0 && NC % VW == 0,
                  "tile shape");
    __device__ static int row(int ty, int i) { return (ty / WY) * (WY * RQ) + ty % WY + WY * i; }
    __device__ static int warp_row0(int ty) { return (ty / WY) * (WY * RQ); } /* the warp's rows: [r0, r0 + WY*RQ) */
};

/* Over the TX lanes of a score row; a fixed butterfly, so every lane ends with the same bits. */
__device__ __forceinline__ float row_max(float v) { return lane_group_max<TX>(v); }
__device__ __forceinline__ float row_sum(float v) { return lane_group_sum<TX>(v); }

/* N contiguous floats (N = 1, 2, 4; p aligned to N floats) to / from registers. */
template <int N>
__device__ __forceinline__ void ld_vec(float *r, const float *p) {
    if constexpr (N == 4) {
        const float4 v = *reinterpret_cast<const float4 *>(p);
        r[0] = v.x, r[1] = v.y, r[2] = v.z, r[3] = v.w;
    } else if constexpr (N == 2) {
        const float2 v = *reinterpret_cast<const float2 *>(p);
        r[0] = v.x, r[1] = v.y;
    } else {
        r[0] = p[0];
    }
}
template <int N>
__device__ __forceinline__ void st_vec(float *p, const float *r) {
    if constexpr (N == 4)
        *reinterpret_cast<float4 *>(p) = make_float4(r[0], r[1], r[2], r[3]);
    else if constexpr (N == 2)
        *reinterpret_cast<float2 *>(p) = make_float2(r[0], r[1]);
    else
        p[0] = r[0];
}

/* ROWS rows of a [*, dh] slice with row stride ld into shared s [ROWS][LD] (D columns): rows >= nvalid and
 * columns >= dh zero-filled. vec: dh % 4 == 0 and 16-byte aligned pointers, so whole float4s (coalesced: D/4
 * consecutive threads read one row). */
template <int D, int ROWS, int LD>
__device__ __forceinline__ void load_tile(float *s, const float *__restrict__ g, long ld, int nvalid, int dh,
                                          bool vec) {
    if (vec) {
        constexpr int G = D / 4;
        for (int i = threadIdx.x; i < ROWS * G; i += NT) {
            const int r = i / G, c = (i % G) * 4;
            float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
            if (r < nvalid && c < dh) v = *reinterpret_cast<const float4 *>(g + (long)r * ld + c);
            *reinterpret_cast<float4 *>(s + r * LD + c) = v;
        }
    } else {
        for (int i = threadIdx.x; i < ROWS * D; i += NT) {
            const int r = i / D, c = i % D;
            s[r * LD + c] = (r < nvalid && c < dh) ? g[(long)r * ld + c] : 0.f;
        }
    }
}

/* Per-query scalars of a tile (LSE in base 2, Dlt) into shared memory; queries past T get +inf / 0, so their
 * probabilities are exp2(-inf) = 0 and they add nothing. */
template <int N>
__device__ __forceinline__ void load_scalars(float *ls, float *dl, const float *__restrict__ lse,
                                             const float *__restrict__ dlt, int nvalid) {
    for (int i = threadIdx.x; i < N; i += NT) {
        ls[i] = i < nvalid ? lse[i] * LOG2E : INFINITY;
        dl[i] = i < nvalid ? dlt[i] : 0.f;
    }
}

/* s[i][j] = Σ_d R[row(ty, i)][d] · Cm[tx + 8*j][d] over the padded head size, fixed order in d. Per 4 d: RQ
 * float4 reads of R (4 rows a warp) and CK of Cm (8 rows a warp), one wavefront each, for 4·RQ·CK FMAs. */
template <class L>
__device__ __forceinline__ void tile_dot(float (&s)[L::RQ][L::CK], const float *R, const float *Cm, int ty, int tx) {
    constexpr int RQ = L::RQ, CK = L::CK, LDS = L::LDS;
#pragma unroll
    for (int i = 0; i < RQ; i++)
#pragma unroll
        for (int j = 0; j < CK; j++) s[i][j] = 0.f;
    const float *r0 = R + L::row(ty, 0) * LDS, *c0 = Cm + tx * LDS;
#pragma unroll 2
    for (int d = 0; d < L::NC * TX; d += 4) {
        float4 a[RQ];
#pragma unroll
        for (int i = 0; i < RQ; i++) a[i] = *reinterpret_cast<const float4 *>(r0 + WY * i * LDS + d);
#pragma unroll
        for (int j = 0; j < CK; j++) {
            const float4 b = *reinterpret_cast<const float4 *>(c0 + TX * j * LDS + d);
#pragma unroll
            for (int i = 0; i < RQ; i++) {
                float v = s[i][j];
                v = fmaf(a[i].x, b.x, v);
                v = fmaf(a[i].y, b.y, v);
                v = fmaf(a[i].z, b.z, v);
                v = fmaf(a[i].w, b.w, v);
                s[i][j] = v;
            }
        }
    }
}

/* acc[i][·] (rows row(ty, i), this thread's head columns) += Σ_{cbeg <= c < cend} W[row][c] · X[c][·], W the
 * [BR][LDW] P / dS tile, X a [BC][LDX] tile; cbeg, cend multiples of 4. */
template <class L, int LDX>
__device__ __forceinline__ void acc_rows(float (&acc)[L::RQ][L::NC], const float *W, const float *X, int cbeg,
                                         int cend, int ty, int tx) {
    constexpr int RQ = L::RQ, VW = L::VW, NV = L::NV, LDW = L::LDW;
    const float *w0 = W + L::row(ty, 0) * LDW, *x0 = X + VW * tx;
#pragma unroll 1
    for (int c = cbeg; c < cend; c += 4) {
        float w[RQ][4];
#pragma unroll
        for (int i = 0; i < RQ; i++) ld_vec<4>(w[i], w0 + WY * i * LDW + c);
#pragma unroll
        for (int cc = 0; cc < 4; cc++)
#pragma unroll
            for (int k = 0; k < NV; k++) {
                float x[VW];
                ld_vec<VW>(x, x0 + (c + cc) * LDX + TX * VW * k);
#pragma unroll
                for (int i = 0; i < RQ; i++)
#pragma unroll
                    for (int v = 0; v < VW; v++) acc[i][k * VW + v] = fmaf(w[i][cc], x[v], acc[i][k * VW + v]);
            }
    }
}

/* The score tile into W (rows row(ty, i), columns tx + 8*j). */
template <class L>
__device__ __forceinline__ void put_scores(float *W, const float (&s)[L::RQ][L::CK], int ty, int tx) {
#pragma unroll
    for (int i = 0; i < L::RQ; i++)
#pragma unroll
        for (int j = 0; j < L::CK; j++) W[L::row(ty, i) * L::LDW + tx + TX * j] = s[i][j];
}

/* Writes (or adds, when accumulate) the thread's part of a [BR, D] accumulator to rows [0, nvalid) of a global
 * slice with row stride ld, columns < dh. */
template <class L>
__device__ __forceinline__ void store_rows(float *__restrict__ g, long ld, const float (&acc)[L::RQ][L::NC],
                                           int nvalid, int dh, bool vec, bool accumulate, int ty, int tx) {
    constexpr int RQ = L::RQ, VW = L::VW, NV = L::NV;
#pragma unroll
    for (int i = 0; i < RQ; i++) {
        const int r = L::row(ty, i);
        if (r >= nvalid) continue;
        float *grow = g + (long)r * ld;
#pragma unroll
        for (int k = 0; k < NV; k++) {
            const int c = VW * tx + TX * VW * k;
            if (c >= dh) continue;
            float v[VW];
#pragma unroll
            for (int u = 0; u < VW; u++) v[u] = acc[i][k * VW + u];
            if (vec) { /* dh % 4 == 0: the whole vector lies inside the row */
                if (accumulate) {
                    float o[VW];
                    ld_vec<VW>(o, grow + c);
#pragma unroll
                    for (int u = 0; u < VW; u++) v[u] += o[u];
                }
                st_vec<VW>(grow + c, v);
            } else {
#pragma unroll
                for (int u = 0; u < VW; u++)
                    if (c + u < dh) grow[c + u] = accumulate ? grow[c + u] + v[u] : v[u];
            }
        }
    }
}

__host__ __device__ constexpr int round4(int x) { return (x + 3) & ~3; }
__host__ __device__ constexpr size_t zmax(size_t a, size_t b) { return a > b ? a : b; }

/* ---- forward ------------------------------------------------------------------------------------------------ */

/* Shared: Qs [BR][LDS]; Ks [BC][LDS], reused for P [BR][LDW] once the scores are in registers; Vs [BC][D]. */
template <int D, int BR, int BC>
constexpr size_t fwd_smem_floats() {
    using L = Lay<D, BR, BC>;
    return (size_t)BR * L::LDS + zmax((size_t)BC * L::LDS, (size_t)BR * L::LDW) + (size_t)BC * D;
}

/* One block per (b, h, query block): rows = queries, column blocks = keys 0 .. the block's last query. */
template <int D, int BR, int BC>
__global__ void __launch_bounds__(NT, 2)
    fa_fwd_kernel(float *__restrict__ O, float *__restrict__ LSE, const float *__restrict__ Q,
                  const float *__restrict__ K, const float *__restrict__ V, int B, int T, int Hq, int Hkv, int dh,
                  int nq, float sl2, int vec, int window) {
    using L = Lay<D, BR, BC>;
    constexpr int RQ = L::RQ, CK = L::CK, NC = L::NC, LDS = L::LDS;
    GK_DYNAMIC_SMEM_T(float4, smem4);
    float *Qs = reinterpret_cast<float *>(smem4), *Ks = Qs + BR * LDS, *Ws = Ks;
    float *Vs = Ks + zmax((size_t)BC * LDS, (size_t)BR * L::LDW);
    const int tx = threadIdx.x % TX, ty = threadIdx.x / TX;
    /* the longest query blocks (most key blocks) are scheduled first */
    const int BH = B * Hq, bh = (int)(blockIdx.x % BH), qb = nq - 1 - (int)(blockIdx.x / BH);
    const int b = bh / Hq, h = bh % Hq, j = h / (Hq / Hkv);
    const long ldq = (long)Hq * dh, ldk = (long)Hkv * dh;
    const int q0 = qb * BR, qn = min(BR, T - q0), kend = min(T, q0 + BR);
    const int r0 = L::warp_row0(ty);
    const long qoff = ((long)b * T + q0) * ldq + (long)h * dh;
    load_tile<D, BR, LDS>(Qs, Q + qoff, ldq, qn, dh, vec);

    float m[RQ], l[RQ], acc[RQ][NC];
#pragma unroll
    for (int i = 0; i < RQ; i++) {
        m[i] = -INFINITY, l[i] = 0.f;
#pragma unroll
        for (int c = 0; c < NC; c++) acc[i][c] = 0.f;
    }
    /* a sliding window (window > 0: query q sees keys q-window+1 .. q) starts at the first query's first key */
    const int kbeg = window > 0 ? max(0, q0 - window + 1) / BC * BC : 0;
    for (int k0 = kbeg; k0 < kend; k0 += BC) {
        const long koff = ((long)b * T + k0) * ldk + (long)j * dh;
        const bool mask = k0 + BC - 1 > q0 || window > 0; /* the block crosses the diagonal, or may leave a window */
        __syncthreads();                                  /* the previous block's P V reads are done */
        load_tile<D, BC, LDS>(Ks, K + koff, ldk, min(BC, T - k0), dh, vec);
        load_tile<D, BC, D>(Vs, V + koff, ldk, min(BC, T - k0), dh, vec);
        __syncthreads();
        float s[RQ][CK];
        tile_dot<L>(s, Qs, Ks, ty, tx);
        /* online softmax: per-thread partial row sums l, rescaled by the row-wide alpha (summed across lanes at
         * the end). Without a window key 0 is in every row, so the running max is finite after the first block; a
         * window can leave a row's first blocks all masked, and then the max stays -inf and is taken as 0 (P = 0,
         * alpha = 0) */
#pragma unroll
        for (int i = 0; i < RQ; i++) {
            const int r = L::row(ty, i);
            float mx = -INFINITY;
#pragma unroll
            for (int jj = 0; jj < CK; jj++) {
                float v = s[i][jj] * sl2;
                const int key = k0 + tx + TX * jj, q = q0 + r;
                if (mask && (key > q || (window > 0 && key <= q - window))) v = -INFINITY; /* causal (also keys past T) */
                s[i][jj] = v;
                mx = fmaxf(mx, v);
            }
            mx = row_max(mx);
            const float mn = fmaxf(m[i], mx), mr = mn == -INFINITY ? 0.f : mn;
            const float alpha = exp2f(m[i] - mr); /* 0 on the first block */
            m[i] = mn;
            float ps = 0.f;
#pragma unroll
            for (int jj = 0; jj < CK; jj++) {
                s[i][jj] = exp2f(s[i][jj] - mr);
                ps += s[i][jj];
            }
            l[i] = l[i] * alpha + ps;
#pragma unroll
            for (int c = 0; c < NC; c++) acc[i][c] *= alpha;
        }
        __syncthreads(); /* every thread is done reading Ks before P overwrites it */
        put_scores<L>(Ws, s, ty, tx);
        __syncthreads();
        /* keys past this warp's last query have P = 0 */
        acc_rows<L, D>(acc, Ws, Vs, 0, min(BC, round4(q0 + r0 + WY * RQ - k0)), ty, tx);
    }
#pragma unroll
    for (int i = 0; i < RQ; i++) {
        l[i] = row_sum(l[i]);
        const float inv = 1.0f / l[i];
#pragma unroll
        for (int c = 0; c < NC; c++) acc[i][c] *= inv;
    }
    store_rows<L>(O + qoff, ldq, acc, qn, dh, vec, false, ty, tx);
    if (tx == 0) {
        float *lse = LSE + ((long)b * Hq + h) * T + q0;
#pragma unroll
        for (int i = 0; i < RQ; i++)
            if (L::row(ty, i) < qn) lse[L::row(ty, i)] = m[i] * LN2 + logf(l[i]);
    }
}

/* ---- backward ----------------------------------------------------------------------------------------------- */

/* Dlt[b, h, t] = Σ_d dO[bt, h, d] · O[bt, h, d]: one warp per (token, head) row (contiguous dh floats). */
__global__ void fa_bwd_delta_kernel(float *__restrict__ Dlt, const float *__restrict__ dO,
                                    const float *__restrict__ O, int T, int Hq, int dh, long rows) {
    const int lane = threadIdx.x % GPU_WARP;
    const long row = (long)blockIdx.x * (blockDim.x / GPU_WARP) + threadIdx.x / GPU_WARP;
    if (row >= rows) return; /* whole warps leave together */
    const float *a = dO + row * dh, *o = O + row * dh;
    float v = 0.f;
    for (int d = lane; d < dh; d += GPU_WARP) v = fmaf(a[d], o[d], v);
    v = warp_sum(v);
    if (lane == 0) {
        const long bt = row / Hq, b = bt / T, t = bt % T;
        const int h = (int)(row % Hq);
        Dlt[(b * Hq + h) * T + t] = v;
    }
}

/* Shared: Ks, Vs [BR][LDS]; Qs, dOs [BC][LDS]; Ws [BR][LDW] (P, then dS: one buffer keeps two blocks on an SM);
 * ls, dl [BC]. */
template <int D, int BR, int BC>
constexpr size_t dkdv_smem_floats() {
    using L = Lay<D, BR, BC>;
    return 2 * (size_t)BR * L::LDS + 2 * (size_t)BC * L::LDS + (size_t)BR * L::LDW + 2 * (size_t)BC;
}

/* One block per (b, kv head j, key block): rows = keys, column blocks = queries from the diagonal on, for every
 * query head of the group (outer loop, fixed order). Pᵀ and dSᵀ come straight out of Sᵀ = K Qᵀ, dPᵀ = V dOᵀ. */
template <int D, int BR, int BC>
__global__ void __launch_bounds__(NT, 2)
    fa_bwd_dkdv_kernel(float *__restrict__ dK, float *__restrict__ dV, const float *__restrict__ dO,
                       const float *__restrict__ LSE, const float *__restrict__ Dlt, const float *__restrict__ Q,
                       const float *__restrict__ K, const float *__restrict__ V, int B, int T, int Hq, int Hkv,
                       int dh, float sl2, float scale, int vec, int window) {
    using L = Lay<D, BR, BC>;
    constexpr int RQ = L::RQ, CK = L::CK, NC = L::NC, LDS = L::LDS;
    GK_DYNAMIC_SMEM_T(float4, smem4);
    float *Ks = reinterpret_cast<float *>(smem4), *Vs = Ks + BR * LDS, *Qs = Vs + BR * LDS, *dOs = Qs + BC * LDS;
    float *Ws = dOs + BC * LDS, *ls = Ws + BR * L::LDW, *dl = ls + BC;
    const int tx = threadIdx.x % TX, ty = threadIdx.x / TX;
    /* the first key block meets every query: the heaviest blocks first */
    const int BJ = B * Hkv, bj = (int)(blockIdx.x % BJ), kb = (int)(blockIdx.x / BJ);
    const int b = bj / Hkv, j = bj % Hkv, G = Hq / Hkv;
    const long ldq = (long)Hq * dh, ldk = (long)Hkv * dh;
    const int k0 = kb * BR, kn = min(BR, T - k0), r0 = L::warp_row0(ty);
    const long koff = ((long)b * T + k0) * ldk + (long)j * dh;
    load_tile<D, BR, LDS>(Ks, K + koff, ldk, kn, dh, vec);
    load_tile<D, BR, LDS>(Vs, V + koff, ldk, kn, dh, vec);

    float dk[RQ][NC], dv[RQ][NC];
#pragma unroll
    for (int i = 0; i < RQ; i++)
#pragma unroll
        for (int c = 0; c < NC; c++) dk[i][c] = dv[i][c] = 0.f;
    /* a sliding window: the last key of the block is seen by queries up to it + window - 1 */
    const int qend = window > 0 ? min(T, k0 + BR - 1 + window) : T;
    for (int h = j * G; h < (j + 1) * G; h++) {
        const float *lse_bh = LSE + ((long)b * Hq + h) * T, *dlt_bh = Dlt + ((long)b * Hq + h) * T;
        for (int q0 = k0; q0 < qend; q0 += BC) {
            const int qn = min(BC, T - q0);
            const long qoff = ((long)b * T + q0) * ldq + (long)h * dh;
            const bool mask = q0 < k0 + BR - 1 || window > 0; /* the block crosses the diagonal, or a window edge */
            __syncthreads();                    /* the previous block's readers of Qs, dOs, Ws are done */
            load_tile<D, BC, LDS>(Qs, Q + qoff, ldq, qn, dh, vec);
            load_tile<D, BC, LDS>(dOs, dO + qoff, ldq, qn, dh, vec);
            load_scalars<BC>(ls, dl, lse_bh + q0, dlt_bh + q0, qn);
            __syncthreads();
            float p[RQ][CK], ds[RQ][CK];
            tile_dot<L>(p, Ks, Qs, ty, tx);
            tile_dot<L>(ds, Vs, dOs, ty, tx);
#pragma unroll
            for (int i = 0; i < RQ; i++) {
                const int k = k0 + L::row(ty, i);
#pragma unroll
                for (int jj = 0; jj < CK; jj++) {
                    const int qc = tx + TX * jj, q = q0 + qc;
                    const float e = (mask && (k > q || (window > 0 && k <= q - window))) ? 0.f
                                                                                      : exp2f(p[i][jj] * sl2 - ls[qc]);
                    p[i][jj] = e;
                    ds[i][jj] = e * (ds[i][jj] - dl[qc]) * scale;
                }
            }
            /* queries before this warp's first key add nothing */
            const int cbeg = min(BC, max(0, k0 + r0 - q0) & ~3);
            put_scores<L>(Ws, p, ty, tx);
            __syncthreads();
            acc_rows<L, LDS>(dv, Ws, dOs, cbeg, BC, ty, tx); /* dV += Pᵀ dO */
            __syncthreads();
            put_scores<L>(Ws, ds, ty, tx);
            __syncthreads();
            acc_rows<L, LDS>(dk, Ws, Qs, cbeg, BC, ty, tx); /* dK += dSᵀ Q */
        }
    }
    store_rows<L>(dK + koff, ldk, dk, kn, dh, vec, true, ty, tx);
    store_rows<L>(dV + koff, ldk, dv, kn, dh, vec, true, ty, tx);
}

/* Shared: Qs, dOs [BR][LDS]; Ks, Vs [BC][LDS]; Ws [BR][LDW]; ls, dl [BR]. */
template <int D, int BR, int BC>
constexpr size_t dq_smem_floats() {
    using L = Lay<D, BR, BC>;
    return 2 * (size_t)BR * L::LDS + 2 * (size_t)BC * L::LDS + (size_t)BR * L::LDW + 2 * (size_t)BR;
}

/* One block per (b, h, query block): rows = queries, column blocks = keys 0 .. the block's last query. */
template <int D, int BR, int BC>
__global__ void __launch_bounds__(NT, 2)
    fa_bwd_dq_kernel(float *__restrict__ dQ, const float *__restrict__ dO, const float *__restrict__ LSE,
                     const float *__restrict__ Dlt, const float *__restrict__ Q, const float *__restrict__ K,
                     const float *__restrict__ V, int B, int T, int Hq, int Hkv, int dh, int nq, float sl2,
                     float scale, int vec, int window) {
    using L = Lay<D, BR, BC>;
    constexpr int RQ = L::RQ, CK = L::CK, NC = L::NC, LDS = L::LDS;
    GK_DYNAMIC_SMEM_T(float4, smem4);
    float *Qs = reinterpret_cast<float *>(smem4), *dOs = Qs + BR * LDS, *Ks = dOs + BR * LDS, *Vs = Ks + BC * LDS;
    float *Ws = Vs + BC * LDS, *ls = Ws + BR * L::LDW, *dl = ls + BR;
    const int tx = threadIdx.x % TX, ty = threadIdx.x / TX;
    const int BH = B * Hq, bh = (int)(blockIdx.x % BH), qb = nq - 1 - (int)(blockIdx.x / BH);
    const int b = bh / Hq, h = bh % Hq, j = h / (Hq / Hkv);
    const long ldq = (long)Hq * dh, ldk = (long)Hkv * dh;
    const int q0 = qb * BR, qn = min(BR, T - q0), kend = min(T, q0 + BR), r0 = L::warp_row0(ty);
    const long qoff = ((long)b * T + q0) * ldq + (long)h * dh;
    load_tile<D, BR, LDS>(Qs, Q + qoff, ldq, qn, dh, vec);
    load_tile<D, BR, LDS>(dOs, dO + qoff, ldq, qn, dh, vec);
    load_scalars<BR>(ls, dl, LSE + ((long)b * Hq + h) * T + q0, Dlt + ((long)b * Hq + h) * T + q0, qn);

    float dq[RQ][NC];
#pragma unroll
    for (int i = 0; i < RQ; i++)
#pragma unroll
        for (int c = 0; c < NC; c++) dq[i][c] = 0.f;
    const int kbeg = window > 0 ? max(0, q0 - window + 1) / BC * BC : 0; /* as in the forward */
    for (int k0 = kbeg; k0 < kend; k0 += BC) {
        const long koff = ((long)b * T + k0) * ldk + (long)j * dh;
        const bool mask = k0 + BC - 1 > q0 || window > 0;
        __syncthreads(); /* the previous block's readers of Ks, Ws are done */
        load_tile<D, BC, LDS>(Ks, K + koff, ldk, min(BC, T - k0), dh, vec);
        load_tile<D, BC, LDS>(Vs, V + koff, ldk, min(BC, T - k0), dh, vec);
        __syncthreads();
        float p[RQ][CK], ds[RQ][CK];
        tile_dot<L>(p, Qs, Ks, ty, tx);
        tile_dot<L>(ds, dOs, Vs, ty, tx);
#pragma unroll
        for (int i = 0; i < RQ; i++) {
            const int r = L::row(ty, i), q = q0 + r;
            const float lq = ls[r], dlq = dl[r];
#pragma unroll
            for (int jj = 0; jj < CK; jj++) {
                const int key = k0 + tx + TX * jj;
                const float e = (mask && (key > q || (window > 0 && key <= q - window))) ? 0.f
                                                                                         : exp2f(p[i][jj] * sl2 - lq);
                ds[i][jj] = e * (ds[i][jj] - dlq) * scale;
            }
        }
        put_scores<L>(Ws, ds, ty, tx);
        __syncthreads();
        acc_rows<L, LDS>(dq, Ws, Ks, 0, min(BC, round4(q0 + r0 + WY * RQ - k0)), ty, tx); /* dQ += dS K */
    }
    store_rows<L>(dQ + qoff, ldq, dq, qn, dh, vec, true, ty, tx);
}

/* ---- launchers ---------------------------------------------------------------------------------------------- */

/* Above 48 KB of dynamic shared memory needs the opt-in (cheap; per device, so set at every launch). */
template <class K>
inline void allow_smem(K *kernel, size_t bytes) {
    (void)gpuFuncSetAttribute((const void *)kernel, gpuFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
}

template <int D, int BR, int BC>
void launch_forward(gpuStream_t s, float *O, float *LSE, const float *Q, const float *K, const float *V, int B, int T,
                    int Hq, int Hkv, int dh, int vec, int window) {
    const int nq = (T + BR - 1) / BR;
    const size_t bytes = fwd_smem_floats<D, BR, BC>() * sizeof(float);
    const float sl2 = (float)(1.0 / sqrt((double)dh)) * LOG2E;
    auto *k = fa_fwd_kernel<D, BR, BC>;
    allow_smem(k, bytes);
    GK_LAUNCH(k, (unsigned)((long)nq * B * Hq), NT, bytes, s, O, LSE, Q, K, V, B, T, Hq, Hkv, dh, nq, sl2, vec, window);
}

/* Tiles: dK/dV kernel (rows = keys) BR1 x BC1, dQ kernel (rows = queries) BR2 x BC2. */
template <int D, int BR1, int BC1, int BR2, int BC2>
void launch_backward(gpuStream_t s, float *dQ, float *dK, float *dV, const float *dO, const float *LSE,
                     const float *Dlt, const float *Q, const float *K, const float *V, int B, int T, int Hq, int Hkv,
                     int dh, int vec, int window) {
    const float scale = (float)(1.0 / sqrt((double)dh)), sl2 = scale * LOG2E;
    const size_t b1 = dkdv_smem_floats<D, BR1, BC1>() * sizeof(float), b2 = dq_smem_floats<D, BR2, BC2>() * sizeof(float);
    auto *kdkv = fa_bwd_dkdv_kernel<D, BR1, BC1>;
    auto *kdq = fa_bwd_dq_kernel<D, BR2, BC2>;
    allow_smem(kdkv, b1);
    allow_smem(kdq, b2);
    const int nk = (T + BR1 - 1) / BR1, nq = (T + BR2 - 1) / BR2;
    GK_LAUNCH(kdkv, (unsigned)((long)nk * B * Hkv), NT, b1, s, dK, dV, dO, LSE, Dlt, Q, K, V, B, T, Hq, Hkv, dh, sl2,
              scale, vec, window);
    GK_LAUNCH(kdq, (unsigned)((long)nq * B * Hq), NT, b2, s, dQ, dO, LSE, Dlt, Q, K, V, B, T, Hq, Hkv, dh, nq, sl2,
              scale, vec, window);
}

inline bool bad_shape(int B, int T, int Hq, int Hkv, int dh) {
    return B <= 0 || T <= 0 || Hq <= 0 || Hkv <= 0 || Hq % Hkv != 0 || dh <= 0 || dh > 256;
}

} // namespace

extern "C" long gk_flash_attention_work_floats(int B, int T, int Hq) {
    return (long)(B > 0 ? B : 0) * (Hq > 0 ? Hq : 0) * (T > 0 ? T : 0); /* Dlt [B, Hq, T] */
}

extern "C" void gk_flash_attention_forward_window(GkStream s, float *O, float *LSE, const float *Q, const float *K,
                                                  const float *V, int B, int T, int Hq, int Hkv, int dh, int window) {
    if (bad_shape(B, T, Hq, Hkv, dh)) return;
    if (window < 0 || window >= T) window = 0; /* as the CPU's make_shape: a window of T or more is plain causal */
    const int vec = dh % 4 == 0 && aligned16(O) && aligned16(Q) && aligned16(K) && aligned16(V);
    if (dh <= 32)
        launch_forward<32, 64, 64>(s, O, LSE, Q, K, V, B, T, Hq, Hkv, dh, vec, window);
    else if (dh <= 64)
        launch_forward<64, 64, 64>(s, O, LSE, Q, K, V, B, T, Hq, Hkv, dh, vec, window);
    else if (dh <= 128)
        launch_forward<128, 64, 64>(s, O, LSE, Q, K, V, B, T, Hq, Hkv, dh, vec, window);
    else
        launch_forward<256, 32, 32>(s, O, LSE, Q, K, V, B, T, Hq, Hkv, dh, vec, window);
    GK_LAUNCH_CHECK();
}

extern "C" void gk_flash_attention_forward(GkStream s, float *O, float *LSE, const float *Q, const float *K,
                                           const float *V, int B, int T, int Hq, int Hkv, int dh) {
    gk_flash_attention_forward_window(s, O, LSE, Q, K, V, B, T, Hq, Hkv, dh, 0);
}

extern "C" void gk_flash_attention_backward_window(GkStream s, float *dQ, float *dK, float *dV, const float *dO,
                                                   const float *O, const float *LSE, const float *Q, const float *K,
                                                   const float *V, int B, int T, int Hq, int Hkv, int dh, float *work,
                                                   int window) {
    if (bad_shape(B, T, Hq, Hkv, dh)) return;
    if (window < 0 || window >= T) window = 0; /* (and k0 + BR - 1 + window cannot overflow) */
    float *Dlt = work;
    const long rows = (long)B * T * Hq;
    const int per_block = 256 / GPU_WARP;
    GK_LAUNCH(fa_bwd_delta_kernel, (unsigned)((rows + per_block - 1) / per_block), 256, 0, s, Dlt, dO, O, T, Hq, dh,
              rows);
    const int vec = dh % 4 == 0 && aligned16(dQ) && aligned16(dK) && aligned16(dV) && aligned16(dO) &&
                    aligned16(Q) && aligned16(K) && aligned16(V);
    if (dh <= 32)
        launch_backward<32, 64, 32, 64, 32>(s, dQ, dK, dV, dO, LSE, Dlt, Q, K, V, B, T, Hq, Hkv, dh, vec, window);
    else if (dh <= 64)
        launch_backward<64, 64, 32, 64, 32>(s, dQ, dK, dV, dO, LSE, Dlt, Q, K, V, B, T, Hq, Hkv, dh, vec, window);
    else if (dh <= 128)
        launch_backward<128, 64, 32, 64, 32>(s, dQ, dK, dV, dO, LSE, Dlt, Q, K, V, B, T, Hq, Hkv, dh, vec, window);
    else
        launch_backward<256, 32, 16, 32, 32>(s, dQ, dK, dV, dO, LSE, Dlt, Q, K, V, B, T, Hq, Hkv, dh, vec, window);
    GK_LAUNCH_CHECK();
}

extern "C" void gk_flash_attention_backward(GkStream s, float *dQ, float *dK, float *dV, const float *dO,
                                            const float *O, const float *LSE, const float *Q, const float *K,
                                            const float *V, int B, int T, int Hq, int Hkv, int dh, float *work) {
    gk_flash_attention_backward_window(s, dQ, dK, dV, dO, O, LSE, Q, K, V, B, T, Hq, Hkv, dh, work, 0);
}
