/* gpu_moe: the router and the experts' elementwise / data-movement ops on the GPU, the same maths as their CPU
 * namesakes in src/kernels/kernels.inc and src/model/model.c (group_by_expert). Deterministic: no float atomics; column sums are
 * per-thread double partials over a fixed row split, summed in a fixed tree; row sums are fixed warp trees; the
 * expert grouping is a stable counting sort in one block (integer counts only, each written by one lane). */
#include "gpu_common.cuh"
#include "gpu_kernels.h"
#include "gpu_router.cuh"

/* ---- small helpers ---------------------------------------------------------------------------------------- */

/* Warp primitives not in gpu_common.cuh, with the same CUDA / HIP split. */
#ifdef ZAYA_HIP
typedef unsigned long long gk_lanemask_t;
__device__ __forceinline__ gk_lanemask_t moe_ballot(int p) { return __ballot(p); }
__device__ __forceinline__ int moe_popc(gk_lanemask_t m) { return __popcll(m); }
__device__ __forceinline__ int moe_lowest(gk_lanemask_t m) { return __ffsll((unsigned long long)m) - 1; }
template <class T> __device__ __forceinline__ T moe_shfl(T v, int src) { return __shfl(v, src); }
__device__ __forceinline__ int moe_shfl_up(int v, int d) { return __shfl_up(v, d); }
#else
typedef unsigned gk_lanemask_t;
__device__ __forceinline__ gk_lanemask_t moe_ballot(int p) { return __ballot_sync(0xffffffffu, p); }
__device__ __forceinline__ int moe_popc(gk_lanemask_t m) { return __popc(m); }
__device__ __forceinline__ int moe_lowest(gk_lanemask_t m) { return __ffs((int)m) - 1; }
template <class T> __device__ __forceinline__ T moe_shfl(T v, int src) { return __shfl_sync(0xffffffffu, v, src); }
__device__ __forceinline__ int moe_shfl_up(int v, int d) { return __shfl_up_sync(0xffffffffu, v, d); }
#endif

static inline bool al16(const void *p) { return ((uintptr_t)p & 15u) == 0; }
/* Whether an output takes 4-wide stores: 16-byte aligned fp32, or (OUT16) 8-byte aligned bf16 bits. */
template <bool OUT16>
static inline bool out_wide(const float *p, const uint16_t *p16) {
    return OUT16 ? ((uintptr_t)p16 & 7u) == 0 : al16(p);
}

/* The same store as bf16 bits (nearest even, gk_bf16_bits): the products' operand, no rounding pass after. */
template <int V>
__device__ __forceinline__ void stv16(uint16_t *p, const float (&d)[V]) {
    if constexpr (V == 4)
        *reinterpret_cast<ushort4 *>(p) = make_ushort4(gk_bf16_bits(d[0]), gk_bf16_bits(d[1]), gk_bf16_bits(d[2]),
                                                       gk_bf16_bits(d[3]));
    else
        *p = gk_bf16_bits(d[0]);
}

#define EW_THREADS 256
#define ROW_THREADS 256 /* warp-per-row kernels: ROW_THREADS / GPU_WARP rows per block */

static inline int row_blocks(long rows) { return gk_blocks(rows, ROW_THREADS / GPU_WARP); }

/* i / d for an element index: 32-bit division (far cheaper) when every index fits (small, uniform per launch). */
__device__ __forceinline__ long idx_div(long i, int d, bool small) {
    return small ? (long)((unsigned)i / (unsigned)d) : i / d;
}
static inline bool fits32(long n) { return n <= 0xffffffffL; }

/* A row count that may live on the device: n_dev (e.g. gk_group_by_expert's off[E]) when set, at most n (the launch's
 * upper bound); n itself otherwise. Lets the experts' row ops run without the host knowing the count. */
__device__ __forceinline__ long dev_count(long n, const int32_t *n_dev) {
    if (!n_dev) return n;
    const long c = *n_dev;
    return c < n ? (c > 0 ? c : 0) : n;
}

/* ---- router state: z += bias (+ r_prev ⊙ γ), zn = RMSNorm(z; w) — one warp per row (gpu_router.cuh) --------- */
template <int V>
__global__ void __launch_bounds__(ROW_THREADS)
state_rmsnorm_fwd_kernel(float *z, float *zn, float *rstd, const float *bias, const float *r_prev,
                         const float *gamma, const float *w, int rows, int dim, float eps) {
    gk_pdl_enter();
    for (long r = (long)blockIdx.x * (blockDim.x / GPU_WARP) + threadIdx.x / GPU_WARP; r < rows;
         r += (long)gridDim.x * (blockDim.x / GPU_WARP))
        state_rmsnorm_row<V>(z + r * dim, zn + r * dim, rstd + r, bias, r_prev ? r_prev + r * dim : nullptr, gamma, w,
                             dim, eps);
}

extern "C" void gk_state_rmsnorm_forward(GkStream s, float *z, float *zn, float *rstd, const float *bias,
                                         const float *r_prev, const float *gamma, const float *w, int rows, int dim,
                                         float eps) {
    if (rows <= 0 || dim <= 0) return;
    const bool vec = dim % 4 == 0 && al16(z) && al16(zn) && al16(bias) && al16(w) &&
                     (!r_prev || (al16(r_prev) && al16(gamma)));
    if (vec)
        GK_LAUNCH_PDL((state_rmsnorm_fwd_kernel<4>), row_blocks(rows), ROW_THREADS, 0, s, z, zn, rstd, bias, r_prev,
                      gamma, w, rows, dim, eps);
    else
        GK_LAUNCH_PDL((state_rmsnorm_fwd_kernel<1>), row_blocks(rows), ROW_THREADS, 0, s, z, zn, rstd, bias, r_prev,
                      gamma, w, rows, dim, eps);
    GK_LAUNCH_CHECK();
}

/* ---- fused column-reduction backwards ------------------------------------------------------------------------
 * One block per CW columns, COL_THREADS / CW threads down the rows (thread ty takes rows ty, ty + RT, ...): each
 * writes its elementwise outputs and keeps double partial sums, then the block sums the partials in a fixed tree.
 * No cross-block reduction, so no scratch and no atomics; CW = 8 makes one warp load 4 full 32-byte sectors. A
 * narrow CW (4) for narrow matrices keeps more SMs busy (dim / CW blocks). */
#define COL_THREADS 1024

template <int CW>
__device__ __forceinline__ double col_tree_sum(double v, double *part) {
    /* part[COL_THREADS]; thread t = ty * CW + tx. Threads t < CW get Σ_ty for column tx (fixed pairing order);
     * they read only their own slot, so a second call may reuse part without another barrier. */
    const int t = threadIdx.x;
    part[t] = v;
    __syncthreads();
    for (int h = COL_THREADS / 2; h >= CW; h >>= 1) {
        if (t < h) part[t] += part[t + h];
        __syncthreads();
    }
    return t < CW ? part[t] : 0.0;
}

/* dpre = dy ⊙ gelu'(pre) (overwritten), dbias += Σ_rows dpre. */
template <int CW>
__global__ void __launch_bounds__(COL_THREADS)
gelu_bias_bwd_kernel(float *dpre, float *dbias, const float *dy, const float *pre, int rows, int dim) {
    __shared__ double part[COL_THREADS];
    const int tx = threadIdx.x % CW, ty = threadIdx.x / CW, RT = COL_THREADS / CW;
    const int c = blockIdx.x * CW + tx;
    double acc = 0;
    if (c < dim) {
#pragma unroll 4
        for (long r = ty; r < rows; r += RT) {
            const long o = r * dim + c;
            const float d = dy[o] * gk_gelu_grad(pre[o]);
            dpre[o] = d;
            acc += d;
        }
    }
    if (!dbias) return; /* uniform over the block */
    const double t = col_tree_sum<CW>(acc, part);
    if (threadIdx.x < CW && c < dim) dbias[c] += (float)t;
}

extern "C" void gk_gelu_bias_backward(GkStream s, float *dpre, float *dbias, const float *dy, const float *pre,
                                      int rows, int dim) {
    if (rows <= 0 || dim <= 0) return;
    if (dim >= 1024)
        GK_LAUNCH(gelu_bias_bwd_kernel<8>, (dim + 7) / 8, COL_THREADS, 0, s, dpre, dbias, dy, pre, rows, dim);
    else
        GK_LAUNCH(gelu_bias_bwd_kernel<4>, (dim + 3) / 4, COL_THREADS, 0, s, dpre, dbias, dy, pre, rows, dim);
    GK_LAUNCH_CHECK();
}

/* dbias += Σ dz; with r_prev: dgamma += Σ dz ⊙ r_prev (products in double, as the CPU) and dr_prev = dz ⊙ γ. */
template <int CW>
__global__ void __launch_bounds__(COL_THREADS)
state_bwd_kernel(float *dr_prev, float *dgamma, float *dbias, const float *dz, const float *r_prev,
                 const float *gamma, int rows, int dim) {
    __shared__ double part[COL_THREADS];
    const int tx = threadIdx.x % CW, ty = threadIdx.x / CW, RT = COL_THREADS / CW;
    const int c = blockIdx.x * CW + tx;
    double a_b = 0, a_g = 0;
    if (c < dim) {
        if (r_prev) {
            const float g = gamma[c];
#pragma unroll 4
            for (long r = ty; r < rows; r += RT) {
                const long o = r * dim + c;
                const float d = dz[o];
                a_b += d;
                a_g += (double)d * r_prev[o];
                if (dr_prev) dr_prev[o] = d * g;
            }
        } else {
#pragma unroll 4
            for (long r = ty; r < rows; r += RT) a_b += dz[r * dim + c];
        }
    }
    if (dbias) {
        const double t = col_tree_sum<CW>(a_b, part);
        if (threadIdx.x < CW && c < dim) dbias[c] += (float)t;
    }
    if (r_prev && dgamma) {
        const double t = col_tree_sum<CW>(a_g, part);
        if (threadIdx.x < CW && c < dim) dgamma[c] += (float)t;
    }
}

extern "C" void gk_state_backward(GkStream s, float *dr_prev, float *dgamma, float *dbias, const float *dz,
                                  const float *r_prev, const float *gamma, int rows, int dim) {
    if (rows <= 0 || dim <= 0) return;
    if (!dbias && !r_prev) return;
    if (dim >= 1024)
        GK_LAUNCH(state_bwd_kernel<8>, (dim + 7) / 8, COL_THREADS, 0, s, dr_prev, dgamma, dbias, dz, r_prev, gamma,
                  rows, dim);
    else
        GK_LAUNCH(state_bwd_kernel<4>, (dim + 3) / 4, COL_THREADS, 0, s, dr_prev, dgamma, dbias, dz, r_prev, gamma,
                  rows, dim);
    GK_LAUNCH_CHECK();
}

/* ---- pre += bias; y = gelu(pre) (y may alias pre: each element's pre is stored before its y) --------------- */
template <int V>
__global__ void bias_gelu_fwd_kernel(float *pre, float *y, const float *bias, long n_units, int dim_units, bool small) {
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n_units; i += (long)gridDim.x * blockDim.x) {
        const int c = (int)(i - idx_div(i, dim_units, small) * dim_units);
        float p[V], b[V];
        ldv<V>(p, pre + i * V);
        ldv<V>(b, bias + (long)c * V);
#pragma unroll
        for (int k = 0; k < V; k++) p[k] += b[k];
        stv<V>(pre + i * V, p);
#pragma unroll
        for (int k = 0; k < V; k++) p[k] = gk_gelu(p[k]);
        stv<V>(y + i * V, p);
    }
}

extern "C" void gk_bias_gelu_forward(GkStream s, float *pre, float *y, const float *bias, int rows, int dim) {
    if (rows <= 0 || dim <= 0) return;
    const long n = (long)rows * dim;
    const bool small = fits32(n);
    if (dim % 4 == 0 && al16(pre) && al16(y) && al16(bias))
        GK_LAUNCH(bias_gelu_fwd_kernel<4>, gk_blocks(n / 4, EW_THREADS), EW_THREADS, 0, s, pre, y, bias, n / 4,
                  dim / 4, small);
    else
        GK_LAUNCH(bias_gelu_fwd_kernel<1>, gk_blocks(n, EW_THREADS), EW_THREADS, 0, s, pre, y, bias, n, dim, small);
    GK_LAUNCH_CHECK();
}

/* ---- router choice: p = softmax(logits), e* = argmax(p + bias) (first on ties), gate = p[e*] --------------
 * One warp per row, each lane a strided subset of the classes. As the CPU: exp in double of the float difference,
 * rounded to float, summed in double; inv = (float)(1 / sum). */

__global__ void __launch_bounds__(ROW_THREADS)
router_choice_fwd_kernel(float *probs, int32_t *choice, float *gate, const float *logits, const float *bias,
                         int rows, int nc) {
    gk_pdl_enter();
    for (long r = (long)blockIdx.x * (blockDim.x / GPU_WARP) + threadIdx.x / GPU_WARP; r < rows;
         r += (long)gridDim.x * (blockDim.x / GPU_WARP))
        router_choice_row(probs + r * nc, choice + r, gate + r, logits + r * nc, bias, nc);
}

extern "C" void gk_router_choice_forward(GkStream s, float *probs, int32_t *choice, float *gate, const float *logits,
                                         const float *bias, int rows, int n_classes) {
    if (rows <= 0 || n_classes <= 0) return;
    GK_LAUNCH_PDL(router_choice_fwd_kernel, row_blocks(rows), ROW_THREADS, 0, s, probs, choice, gate, logits, bias,
                  rows, n_classes);
    GK_LAUNCH_CHECK();
}

/* dlogit_e += p_e (δ_{e,c} − p_c) · dgate, rows with dgate = 0 untouched (as the CPU); elementwise. */
__global__ void router_choice_bwd_kernel(float *dlogits, const float *dgate, const float *probs,
                                         const int32_t *choice, int rows, int nc, bool small) {
    const long n = (long)rows * nc;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        const long r = idx_div(i, nc, small);
        const int e = (int)(i - r * nc);
        const float g = dgate[r];
        if (g == 0) continue;
        const int c = choice[r];
        const float pc = probs[r * nc + c];
        dlogits[i] += probs[i] * ((e == c ? 1.0f : 0.0f) - pc) * g;
    }
}

extern "C" void gk_router_choice_backward(GkStream s, float *dlogits, const float *dgate, const float *probs,
                                          const int32_t *choice, int rows, int n_classes) {
    if (rows <= 0 || n_classes <= 0) return;
    const long n = (long)rows * n_classes;
    GK_LAUNCH(router_choice_bwd_kernel, gk_blocks(n, EW_THREADS), EW_THREADS, 0, s, dlogits, dgate, probs, choice,
              rows, n_classes, fits32(n));
    GK_LAUNCH_CHECK();
}

__global__ void route_all_to_one_kernel(int32_t *choice, float *gate, int rows) {
    gk_pdl_enter();
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < rows; i += (long)gridDim.x * blockDim.x) {
        choice[i] = 0;
        gate[i] = 1.0f;
    }
}

extern "C" void gk_route_all_to_one(GkStream s, int32_t *choice, float *gate, int rows) {
    if (rows <= 0) return;
    GK_LAUNCH_PDL(route_all_to_one_kernel, gk_blocks(rows, EW_THREADS), EW_THREADS, 0, s, choice, gate, rows);
    GK_LAUNCH_CHECK();
}

/* ---- group by expert: stable counting sort in one block ----------------------------------------------------
 * Key of a row: its choice when 0 <= choice < E, else E (the skip expert, left out; a negative choice is treated
 * as skipped too). Pass 1 counts per expert, the scan gives off. Pass 2 walks the rows in tiles of
 * blockDim × GBE_ITEMS; warp w owns a contiguous segment of the tile and finds each row's rank among the equal
 * keys before it in that segment with ballots over the key bits (peers = lanes with the same key, rank = earlier
 * peers + the warp's running count); the warps' counts are then scanned per expert (warp order), giving each row
 * its sorted position: the order of rows within an expert is the row order, so the sort is stable. Per-warp counts
 * wc[w][e] are written by one lane at a time (the group leader; distinct keys in one ballot round have distinct
 * leaders), so no atomics at all. */
#define GBE_ITEMS 8
#define GBE_MAX_SMEM (48 * 1024)

__device__ __forceinline__ int gbe_key(int32_t c, int E) { return (c >= 0 && c < E) ? c : E; }

/* Lanes of the warp holding the same key (keys < 2^nbits); every lane of the warp must call it. */
__device__ __forceinline__ gk_lanemask_t gbe_peers(int key, int nbits) {
    gk_lanemask_t m = ~(gk_lanemask_t)0;
    for (int b = 0; b < nbits; b++) {
        const int bit = (key >> b) & 1;
        const gk_lanemask_t bl = moe_ballot(bit);
        m &= bit ? bl : ~bl;
    }
    return m;
}

/* Exclusive prefix sum of v over the block in thread order; *total = the sum. wsum: blockDim / GPU_WARP ints. */
__device__ __forceinline__ int block_excl_scan(int v, int *wsum, int *total) {
    const int lane = threadIdx.x % GPU_WARP, w = threadIdx.x / GPU_WARP, nw = blockDim.x / GPU_WARP;
    int x = v;
    for (int d = 1; d < GPU_WARP; d <<= 1) {
        const int t = moe_shfl_up(x, d);
        if (lane >= d) x += t;
    }
    if (lane == GPU_WARP - 1) wsum[w] = x;
    __syncthreads();
    int pre = 0, tot = 0;
    for (int i = 0; i < nw; i++) {
        const int t = wsum[i];
        pre += i < w ? t : 0;
        tot += t;
    }
    __syncthreads();
    *total = tot;
    return pre + x - v;
}

__global__ void __launch_bounds__(1024)
group_by_expert_kernel(int32_t *off, int32_t *sorted, const int32_t *choice, int N, int E, int nbits) {
    GK_DYNAMIC_SMEM_T(int, gbe_smem);
    const int bd = blockDim.x, tid = threadIdx.x, nw = bd / GPU_WARP, lane = tid % GPU_WARP, w = tid / GPU_WARP;
    int *wc = gbe_smem;       /* [nw][E] per-warp counts */
    int *base = wc + nw * E;  /* [E] next free sorted position of each expert */
    int *wsum = base + E;     /* [nw] scan scratch */
    int *mywc = wc + w * E;
    const gk_lanemask_t lt = ((gk_lanemask_t)1 << lane) - 1;

    for (int i = tid; i < nw * E; i += bd) wc[i] = 0;
    __syncthreads();

    /* pass 1: counts (any order; each warp into its own row of wc) */
    for (long r0 = (long)w * GPU_WARP; r0 < N; r0 += (long)bd * 4) {
        int key[4];
#pragma unroll
        for (int j = 0; j < 4; j++) { /* loads first, so four are in flight */
            const long r = r0 + (long)j * bd + lane;
            key[j] = r < N ? gbe_key(choice[r], E) : E;
        }
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const gk_lanemask_t peers = gbe_peers(key[j], nbits);
            if (key[j] < E && lane == moe_lowest(peers)) mywc[key[j]] += moe_popc(peers);
            gk_syncwarp(); /* the next round's leader may be another lane */
        }
    }
    __syncthreads();

    /* offsets: thread t scans a contiguous run of experts; base[e] = off[e] */
    {
        const int per = (E + bd - 1) / bd, e0 = min(E, tid * per), e1 = min(E, e0 + per);
        int sum = 0;
        for (int e = e0; e < e1; e++) {
            int c = 0;
            for (int i = 0; i < nw; i++) c += wc[i * E + e];
            base[e] = c;
            sum += c;
        }
        int total;
        int run = block_excl_scan(sum, wsum, &total); /* its barriers also order the wc reads before the zeroing */
        for (int e = e0; e < e1; e++) {
            const int c = base[e];
            base[e] = run;
            off[e] = run;
            run += c;
        }
        if (tid == 0) off[E] = total;
        for (int i = tid; i < nw * E; i += bd) wc[i] = 0;
        __syncthreads();
    }

    /* pass 2: stable scatter, tile by tile */
    const long tile = (long)bd * GBE_ITEMS;
    for (long t0 = 0; t0 < N; t0 += tile) {
        const long seg = t0 + (long)w * GPU_WARP * GBE_ITEMS;
        int key[GBE_ITEMS], loc[GBE_ITEMS];
#pragma unroll
        for (int j = 0; j < GBE_ITEMS; j++) {
            const long r = seg + (long)j * GPU_WARP + lane;
            key[j] = r < N ? gbe_key(choice[r], E) : E;
        }
#pragma unroll
        for (int j = 0; j < GBE_ITEMS; j++) {
            const gk_lanemask_t peers = gbe_peers(key[j], nbits);
            const int leader = moe_lowest(peers);
            int v = 0;
            if (key[j] < E && lane == leader) {
                v = mywc[key[j]];
                mywc[key[j]] = v + moe_popc(peers);
            }
            v = moe_shfl(v, leader);
            loc[j] = v + moe_popc(peers & lt);
            gk_syncwarp();
        }
        __syncthreads();
        /* per expert: the warps' counts → each warp's first position in this tile (warp order = row order) */
        for (int e = tid; e < E; e += bd) {
            int run = base[e];
            for (int i = 0; i < nw; i++) {
                const int c = wc[i * E + e];
                wc[i * E + e] = run;
                run += c;
            }
            base[e] = run;
        }
        __syncthreads();
#pragma unroll
        for (int j = 0; j < GBE_ITEMS; j++)
            if (key[j] < E) sorted[mywc[key[j]] + loc[j]] = (int32_t)(seg + (long)j * GPU_WARP + lane);
        gk_syncwarp(); /* only this warp reads its row of wc: it may clear it for the next tile now */
        for (int e = lane; e < E; e += GPU_WARP) mywc[e] = 0;
        gk_syncwarp();
    }
}

/* Fallback for an expert count whose per-warp tables do not fit in shared memory: one thread, off as the cursor
 * (after the scatter off[e] is where e's rows end, i.e. the old off[e + 1]; shifted back after). */
__global__ void group_by_expert_serial_kernel(int32_t *off, int32_t *sorted, const int32_t *choice, int N, int E) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    for (int e = 0; e <= E; e++) off[e] = 0;
    for (int r = 0; r < N; r++) {
        const int k = gbe_key(choice[r], E);
        if (k < E) off[k + 1]++;
    }
    for (int e = 0; e < E; e++) off[e + 1] += off[e];
    for (int r = 0; r < N; r++) {
        const int k = gbe_key(choice[r], E);
        if (k < E) sorted[off[k]++] = r;
    }
    for (int e = E - 1; e >= 1; e--) off[e] = off[e - 1];
    off[0] = 0;
}

extern "C" void gk_group_by_expert(GkStream s, int32_t *off, int32_t *sorted, const int32_t *choice, int N, int E) {
    if (E <= 0) return;
    if (N < 0) N = 0; /* N = 0 still writes off = 0 */
    int nbits = 0;
    while ((E >> nbits) != 0) nbits++; /* keys 0..E */
    int threads = 1024;
    size_t smem = 0;
    for (;; threads /= 2) {
        const int nw = threads / GPU_WARP;
        smem = ((size_t)nw * E + E + nw) * sizeof(int);
        if (smem <= GBE_MAX_SMEM || threads <= GPU_WARP) break;
    }
    if (smem <= GBE_MAX_SMEM)
        GK_LAUNCH(group_by_expert_kernel, 1, threads, smem, s, off, sorted, choice, N, E, nbits);
    else
        GK_LAUNCH(group_by_expert_serial_kernel, 1, 1, 0, s, off, sorted, choice, N, E);
    GK_LAUNCH_CHECK();
}

/* ---- routing statistics of a layer (routing_counts_add_layer's numbers, summed on the device) ---------------- */
#define RS_THREADS 1024
__global__ void __launch_bounds__(RS_THREADS)
routing_stats_kernel(int32_t *counts, double *sums, const int32_t *choice, const float *gate, const float *probs,
                     int N, int classes, int E) {
    GK_DYNAMIC_SMEM_T(int, rs_count); /* [E + 1]: integer counts, so the atomics' order does not matter */
    __shared__ double part[32];
    for (int i = threadIdx.x; i <= E; i += blockDim.x) rs_count[i] = 0;
    __syncthreads();
    double g = 0, p = 0; /* each thread's rows in a fixed stride, then a fixed tree: deterministic */
    for (int r = threadIdx.x; r < N; r += blockDim.x) {
        const int c = choice[r];
        if (c >= 0 && c <= E) atomicAdd(&rs_count[c], 1);
        if (c >= 0 && c < E) g += gate[r];
        if (probs) p += probs[(long)r * classes + E];
    }
    g = block_sum_d(g, part);
    p = block_sum_d(p, part); /* its barriers also order the counts before the reads below */
    for (int i = threadIdx.x; i <= E; i += blockDim.x) counts[i] = rs_count[i];
    if (threadIdx.x == 0) sums[0] = g, sums[1] = p;
}

extern "C" void gk_routing_stats(GkStream s, int32_t *counts, double *sums, const int32_t *choice, const float *gate,
                                 const float *probs, int N, int classes, int E) {
    if (E <= 0) return;
    if (classes <= E) probs = nullptr; /* no skip class: its probability sum stays 0 */
    GK_LAUNCH(routing_stats_kernel, 1, RS_THREADS, (size_t)(E + 1) * sizeof(int), s, counts, sums, choice, gate,
              probs, N < 0 ? 0 : N, classes, E);
    GK_LAUNCH_CHECK();
}

/* ---- row movement: one warp per row, 128-bit accesses when every row is 16-byte aligned ------------------- */
template <int V, bool OUT16>
__global__ void __launch_bounds__(ROW_THREADS)
gather_rows_kernel(float *dst, uint16_t *dst16, const float *src, const int32_t *idx, int n_max, const int32_t *n_dev,
                   int D) {
    gk_pdl_enter();
    const int lane = threadIdx.x % GPU_WARP, nv = D / V;
    const long n = dev_count(n_max, n_dev);
    for (long k = (long)blockIdx.x * (blockDim.x / GPU_WARP) + threadIdx.x / GPU_WARP; k < n;
         k += (long)gridDim.x * (blockDim.x / GPU_WARP)) {
        const float *sr = src + (long)idx[k] * D;
#pragma unroll 4
        for (int j = lane; j < nv; j += GPU_WARP) {
            float v[V];
            ldv<V>(v, sr + j * V);
            if constexpr (OUT16)
                stv16<V>(dst16 + k * D + j * V, v);
            else
                stv<V>(dst + k * D + j * V, v);
        }
    }
}

template <bool OUT16>
static void launch_gather_rows(GkStream s, float *dst, uint16_t *dst16, const float *src, const int32_t *idx, int n,
                               const int32_t *n_dev, int D) {
    if (n <= 0 || D <= 0) return;
    const bool wide = out_wide<OUT16>(dst, dst16);
    if (D % 4 == 0 && wide && al16(src))
        GK_LAUNCH_PDL((gather_rows_kernel<4, OUT16>), row_blocks(n), ROW_THREADS, 0, s, dst, dst16, src, idx, n, n_dev,
                      D);
    else
        GK_LAUNCH_PDL((gather_rows_kernel<1, OUT16>), row_blocks(n), ROW_THREADS, 0, s, dst, dst16, src, idx, n, n_dev,
                      D);
    GK_LAUNCH_CHECK();
}
extern "C" void gk_gather_rows(GkStream s, float *dst, const float *src, const int32_t *idx, int n,
                               const int32_t *n_dev, int D) {
    launch_gather_rows<false>(s, dst, nullptr, src, idx, n, n_dev, D);
}
extern "C" void gk_gather_rows_bf16(GkStream s, uint16_t *dst16, const float *src, const int32_t *idx, int n,
                                    const int32_t *n_dev, int D) {
    launch_gather_rows<true>(s, nullptr, dst16, src, idx, n, n_dev, D);
}

template <int V>
__global__ void __launch_bounds__(ROW_THREADS)
scatter_add_rows_kernel(float *dst, const float *src, const int32_t *idx, int n_max, const int32_t *n_dev, int D) {
    const int lane = threadIdx.x % GPU_WARP, nv = D / V;
    const long n = dev_count(n_max, n_dev);
    for (long k = (long)blockIdx.x * (blockDim.x / GPU_WARP) + threadIdx.x / GPU_WARP; k < n;
         k += (long)gridDim.x * (blockDim.x / GPU_WARP)) {
        float *dr = dst + (long)idx[k] * D; /* idx distinct: each destination row has one writer */
        const float *sr = src + k * D;
#pragma unroll 4
        for (int j = lane; j < nv; j += GPU_WARP) {
            float a[V], b[V];
            ldv<V>(a, dr + j * V);
            ldv<V>(b, sr + j * V);
#pragma unroll
            for (int q = 0; q < V; q++) a[q] += b[q];
            stv<V>(dr + j * V, a);
        }
    }
}

extern "C" void gk_scatter_add_rows(GkStream s, float *dst, const float *src, const int32_t *idx, int n,
                                    const int32_t *n_dev, int D) {
    if (n <= 0 || D <= 0) return;
    if (D % 4 == 0 && al16(dst) && al16(src))
        GK_LAUNCH(scatter_add_rows_kernel<4>, row_blocks(n), ROW_THREADS, 0, s, dst, src, idx, n, n_dev, D);
    else
        GK_LAUNCH(scatter_add_rows_kernel<1>, row_blocks(n), ROW_THREADS, 0, s, dst, src, idx, n, n_dev, D);
    GK_LAUNCH_CHECK();
}

/* out[sorted[k]] = gate[sorted[k]] · y[k] (k < n); warp i also zeroes row i when it went to the skip expert
 * (choice outside [0, E), the rows gk_group_by_expert leaves out), so every row of out is written once. */
template <int V>
__global__ void __launch_bounds__(ROW_THREADS)
moe_combine_kernel(float *out, const float *y, const float *gate, const int32_t *sorted, const int32_t *choice,
                   int rows, int n_max, const int32_t *n_dev, int D, int E) {
    const int lane = threadIdx.x % GPU_WARP, nv = D / V;
    const long n = dev_count(n_max, n_dev);
    for (long i = (long)blockIdx.x * (blockDim.x / GPU_WARP) + threadIdx.x / GPU_WARP; i < rows;
         i += (long)gridDim.x * (blockDim.x / GPU_WARP)) {
        if (i < n) {
            const long row = sorted[i];
            const float g = gate[row];
            const float *yk = y + i * D;
            float *o = out + row * D;
#pragma unroll 4
            for (int j = lane; j < nv; j += GPU_WARP) {
                float v[V];
                ldv<V>(v, yk + j * V);
#pragma unroll
                for (int q = 0; q < V; q++) v[q] = g * v[q];
                stv<V>(o + j * V, v);
            }
        }
        const int c = choice[i];
        if (c < 0 || c >= E) {
            float *o = out + i * D;
            float zv[V];
#pragma unroll
            for (int q = 0; q < V; q++) zv[q] = 0.0f;
            for (int j = lane; j < nv; j += GPU_WARP) stv<V>(o + j * V, zv);
        }
    }
}

extern "C" void gk_moe_combine(GkStream s, float *out, const float *y, const float *gate, const int32_t *sorted,
                               const int32_t *choice, int rows, int n, const int32_t *n_dev, int D, int E) {
    if (rows <= 0 || D <= 0) return;
    if (n < 0) n = 0;
    if (D % 4 == 0 && al16(out) && al16(y))
        GK_LAUNCH(moe_combine_kernel<4>, row_blocks(rows), ROW_THREADS, 0, s, out, y, gate, sorted, choice, rows, n,
                  n_dev, D, E);
    else
        GK_LAUNCH(moe_combine_kernel<1>, row_blocks(rows), ROW_THREADS, 0, s, out, y, gate, sorted, choice, rows, n,
                  n_dev, D, E);
    GK_LAUNCH_CHECK();
}

/* out = gate ⊙ y backward over the routed rows: dgate[row] += Σ dout ⊙ y (double, fixed warp tree), dy[k] =
 * gate · dout[row] (overwritten, sorted order). */
template <int V, bool OUT16>
__global__ void __launch_bounds__(ROW_THREADS)
moe_gate_bwd_kernel(float *dgate, float *dy, uint16_t *dy16, const float *dout, const float *y, const float *gate,
                    const int32_t *sorted, int n_max, const int32_t *n_dev, int D) {
    const int lane = threadIdx.x % GPU_WARP, nv = D / V;
    const long n = dev_count(n_max, n_dev);
    for (long k = (long)blockIdx.x * (blockDim.x / GPU_WARP) + threadIdx.x / GPU_WARP; k < n;
         k += (long)gridDim.x * (blockDim.x / GPU_WARP)) {
        const long row = sorted[k];
        const float g = gate[row];
        const float *dr = dout + row * D, *yk = y + k * D;
        double dg = 0;
#pragma unroll 4
        for (int j = lane; j < nv; j += GPU_WARP) {
            float a[V], b[V];
            ldv<V>(a, dr + j * V);
            ldv<V>(b, yk + j * V);
#pragma unroll
            for (int q = 0; q < V; q++) {
                dg += (double)a[q] * b[q];
                a[q] = g * a[q];
            }
            if constexpr (OUT16)
                stv16<V>(dy16 + k * D + j * V, a);
            else
                stv<V>(dy + k * D + j * V, a);
        }
        dg = warp_sum_d(dg);
        if (lane == 0) dgate[row] += (float)dg;
    }
}

template <bool OUT16>
static void launch_gate_bwd(GkStream s, float *dgate, float *dy, uint16_t *dy16, const float *dout, const float *y,
                            const float *gate, const int32_t *sorted, int n_routed, const int32_t *n_dev, int D) {
    if (n_routed <= 0 || D <= 0) return;
    const bool wide = out_wide<OUT16>(dy, dy16);
    if (D % 4 == 0 && wide && al16(dout) && al16(y))
        GK_LAUNCH((moe_gate_bwd_kernel<4, OUT16>), row_blocks(n_routed), ROW_THREADS, 0, s, dgate, dy, dy16, dout, y,
                  gate, sorted, n_routed, n_dev, D);
    else
        GK_LAUNCH((moe_gate_bwd_kernel<1, OUT16>), row_blocks(n_routed), ROW_THREADS, 0, s, dgate, dy, dy16, dout, y,
                  gate, sorted, n_routed, n_dev, D);
    GK_LAUNCH_CHECK();
}
extern "C" void gk_moe_gate_backward(GkStream s, float *dgate, float *dy, const float *dout, const float *y,
                                     const float *gate, const int32_t *sorted, int n_routed, const int32_t *n_dev,
                                     int D) {
    launch_gate_bwd<false>(s, dgate, dy, nullptr, dout, y, gate, sorted, n_routed, n_dev, D);
}
extern "C" void gk_moe_gate_backward_bf16(GkStream s, float *dgate, uint16_t *dy16, const float *dout, const float *y,
                                          const float *gate, const int32_t *sorted, int n_routed,
                                          const int32_t *n_dev, int D) {
    launch_gate_bwd<true>(s, dgate, nullptr, dy16, dout, y, gate, sorted, n_routed, n_dev, D);
}

/* ---- SwiGLU on gu [rows, 2I] (gate | up): act = silu(g) ⊙ v; backward accumulates into dgu ----------------
 * OUT16 (the bf16 runs' grouped experts, whose products read bf16 operands): act, and the gradient as it would be
 * added to a zeroed dgu, are written as bf16 bits (nearest even, gk_bf16_bits) instead of fp32, so no rounding pass
 * and no zeroing follow, and the products read the same values. */

template <int V, bool OUT16>
__global__ void swiglu_fwd_kernel(float *act, uint16_t *act16, const float *gu, long n_max, const int32_t *rows_dev,
                                  int I_units, bool small) {
    const long n_units = rows_dev ? dev_count(n_max / I_units, rows_dev) * I_units : n_max;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n_units; i += (long)gridDim.x * blockDim.x) {
        const long r = idx_div(i, I_units, small);
        const int c = (int)(i - r * I_units);
        const float *g_row = gu + r * 2 * I_units * V;
        float g[V], v[V];
        ldv<V>(g, g_row + c * V);
        ldv<V>(v, g_row + (long)I_units * V + c * V);
#pragma unroll
        for (int q = 0; q < V; q++) g[q] = g[q] / (1.0f + expf(-g[q])) * v[q];
        if constexpr (OUT16)
            stv16<V>(act16 + i * V, g);
        else
            stv<V>(act + i * V, g);
    }
}

template <bool OUT16>
static void launch_swiglu_fwd(GkStream s, float *act, uint16_t *act16, const float *gu, int rows, const int32_t *rows_dev,
                           int I) {
    if (rows <= 0 || I <= 0) return;
    const long n = (long)rows * I;
    const bool wide = out_wide<OUT16>(act, act16);
    if (I % 4 == 0 && wide && al16(gu))
        GK_LAUNCH((swiglu_fwd_kernel<4, OUT16>), gk_blocks(n / 4, EW_THREADS), EW_THREADS, 0, s, act, act16, gu,
                  n / 4, rows_dev, I / 4, fits32(n));
    else
        GK_LAUNCH((swiglu_fwd_kernel<1, OUT16>), gk_blocks(n, EW_THREADS), EW_THREADS, 0, s, act, act16, gu, n,
                  rows_dev, I, fits32(n));
    GK_LAUNCH_CHECK();
}
extern "C" void gk_swiglu_forward(GkStream s, float *act, const float *gu, int rows, const int32_t *rows_dev, int I) {
    launch_swiglu_fwd<false>(s, act, nullptr, gu, rows, rows_dev, I);
}
extern "C" void gk_swiglu_forward_bf16(GkStream s, uint16_t *act16, const float *gu, int rows, const int32_t *rows_dev,
                                       int I) {
    launch_swiglu_fwd<true>(s, nullptr, act16, gu, rows, rows_dev, I);
}

template <int V, bool OUT16>
__global__ void swiglu_bwd_kernel(float *dgu, uint16_t *dgu16, const float *dact, const float *gu, long n_max,
                                  const int32_t *rows_dev, int I_units, bool small) {
    const long n_units = rows_dev ? dev_count(n_max / I_units, rows_dev) * I_units : n_max;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n_units; i += (long)gridDim.x * blockDim.x) {
        const long r = idx_div(i, I_units, small);
        const int c = (int)(i - r * I_units);
        const long og = r * 2 * I_units * V + (long)c * V, ov = og + (long)I_units * V;
        float g[V], v[V], d[V], dg[V], dv[V];
        ldv<V>(g, gu + og);
        ldv<V>(v, gu + ov);
        ldv<V>(d, dact + i * V);
        if constexpr (OUT16) {
#pragma unroll
            for (int q = 0; q < V; q++) dg[q] = dv[q] = 0.0f;
        } else {
            ldv<V>(dg, dgu + og);
            ldv<V>(dv, dgu + ov);
        }
#pragma unroll
        for (int q = 0; q < V; q++) {
            const float sg = 1.0f / (1.0f + expf(-g[q]));
            dg[q] += d[q] * v[q] * sg * (1.0f + g[q] * (1.0f - sg));
            dv[q] += d[q] * g[q] * sg;
        }
        if constexpr (OUT16) {
            stv16<V>(dgu16 + og, dg);
            stv16<V>(dgu16 + ov, dv);
        } else {
            stv<V>(dgu + og, dg);
            stv<V>(dgu + ov, dv);
        }
    }
}

template <bool OUT16>
static void launch_swiglu_bwd(GkStream s, float *dgu, uint16_t *dgu16, const float *dact, const float *gu, int rows,
                            const int32_t *rows_dev, int I) {
    if (rows <= 0 || I <= 0) return;
    const long n = (long)rows * I;
    const bool small = fits32(n);
    const bool wide = out_wide<OUT16>(dgu, dgu16);
    if (I % 4 == 0 && wide && al16(dact) && al16(gu))
        GK_LAUNCH((swiglu_bwd_kernel<4, OUT16>), gk_blocks(n / 4, EW_THREADS), EW_THREADS, 0, s, dgu, dgu16, dact, gu,
                  n / 4, rows_dev, I / 4, small);
    else
        GK_LAUNCH((swiglu_bwd_kernel<1, OUT16>), gk_blocks(n, EW_THREADS), EW_THREADS, 0, s, dgu, dgu16, dact, gu, n,
                  rows_dev, I, small);
    GK_LAUNCH_CHECK();
}
extern "C" void gk_swiglu_backward(GkStream s, float *dgu, const float *dact, const float *gu, int rows,
                                   const int32_t *rows_dev, int I) {
    launch_swiglu_bwd<false>(s, dgu, nullptr, dact, gu, rows, rows_dev, I);
}
extern "C" void gk_swiglu_backward_bf16(GkStream s, uint16_t *dgu16, const float *dact, const float *gu, int rows,
                                        const int32_t *rows_dev, int I) {
    launch_swiglu_bwd<true>(s, nullptr, dgu16, dact, gu, rows, rows_dev, I);
}
