/* gpu_cca: the CCA pre-processing ops on the GPU (gpu_kernels.h): the two causal convolutions, the q-k mean skip,
 * the delayed values, the fused QK L2 norm + partial RoPE and plain RoPE. Each computes its CPU namesake's maths
 * (src/kernels/kernels.inc) with the same layouts; elementwise ops use explicitly rounded fp32 operations (__fmul_rn,
 * __fadd_rn: no fused multiply-add), so they give the CPU's bits wherever the CPU's order of operations is kept.
 *
 * The grouped convolution is a per-group matmul over (dh x k1) inputs: Y_g[e] = Σ_j M_g[e+j] W_gjᵀ in M's row
 * space (e = b·TM + t, TM = T+k1-1; rows with t >= T mix two sequences and are never stored). A register-tiled
 * fp32 GEMM (128 rows x 128 outputs a block, 8x8 a thread) loads each M tile once into shared memory with its
 * k1-1 halo rows and applies all k1 taps from it (a thread keeps 8+k1-1 rows of a channel in registers, tap j
 * reads them shifted by j). The backward's dM is the same kernel run the other way (dE rows shifted by -j).
 *
 * No float atomics anywhere. The reductions over all B·T rows (grouped weight gradient, biases, depthwise weight
 * gradient, temperature gradient) split the rows in a way fixed by the shapes alone, keep per-split partials in the
 * caller's scratch (dM, or dy for the temperature: both documented as scratch), and sum the splits in order: the
 * same inputs give the same bits on every run (the split does not depend on the device's size either). */
#include <stdint.h>

#include "gpu_common.cuh"
#include "gpu_cca_rows.cuh"
#include "gpu_kernels.h"

namespace {

/* ---- small helpers ------------------------------------------------------------------------------------------ */

constexpr int EW_THREADS = 256; /* elementwise kernels */
constexpr int MAX_GRID_Y = 65535;

inline bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }
inline int grid_y(long rows) { return (int)(rows < MAX_GRID_Y ? rows : MAX_GRID_Y); }

/* A double partial kept in two floats (hi + lo carries ~48 bits), so partials parked in float scratch lose
 * nothing that matters before they are summed in double. */
__device__ __forceinline__ void put_split(float *hi, float *lo, double v) {
    const float h = (float)v;
    *hi = h;
    *lo = (float)(v - (double)h);
}

/* ---- depthwise convolution (forward): M [B*TM, C] ------------------------------------------------------------
 * M(τ)[c] = b0[c] + Σ_j w0[c,j] · X(τ-(k0-1)+j)[c], τ = i-(k1-1), accumulated in the CPU's order, unfused.
 * Block: 32 channels x 8 thread rows, each thread a run of DEPTH_RUN consecutive M rows (one division a run; the
 * X rows a run re-reads hit L1). */
constexpr int DEPTH_RUN = 16, DEPTH_ROWS = 8 * DEPTH_RUN; /* M rows a block */

template <int K0> /* 0: k0 at run time */
__global__ void __launch_bounds__(256)
    depthwise_fwd_kernel(float *__restrict__ M, const float *__restrict__ X, const float *__restrict__ w0,
                         const float *__restrict__ b0, int B, int T, int C, int k0_rt, int k1, int ncb) {
    gk_pdl_enter();
    const int k0 = K0 ? K0 : k0_rt;
    const int c = (int)(blockIdx.x % ncb) * 32 + threadIdx.x % 32;
    const int TM = T + k1 - 1;
    const long R = (long)B * TM;
    long e = (long)(blockIdx.x / ncb) * DEPTH_ROWS + (long)(threadIdx.x / 32) * DEPTH_RUN;
    if (c >= C || e >= R) return;
    const float bias = b0[c];
    float w[K0 ? K0 : 1];
#pragma unroll
    for (int j = 0; j < (K0 ? K0 : 1); j++) w[j] = K0 ? w0[(long)c * K0 + j] : 0.0f;
    int b = (int)(e / TM), i = (int)(e - (long)b * TM);
    /* x index of the first tap's X row (time t0 = i-(k1-1)-(k0-1), may be negative: only t >= 0 is read) */
    long xi = ((long)b * T + i - (k1 - 1) - (k0 - 1)) * C + c;
    for (int r = 0; r < DEPTH_RUN && e < R; r++, e++) {
        const int t0 = i - (k1 - 1) - (k0 - 1);
        float m = bias;
#pragma unroll
        for (int j = 0; j < k0; j++) { /* unrolled, weights in registers, when K0 > 0 */
            if (t0 + j < 0) continue;
            m = __fadd_rn(m, __fmul_rn(K0 ? w[K0 ? j : 0] : w0[(long)c * k0 + j], X[xi + (long)j * C]));
        }
        M[e * C + c] = m;
        xi += C;
        if (++i == TM) i = 0, b++, xi = ((long)b * T - (k1 - 1) - (k0 - 1)) * C + c;
    }
}

/* ---- the grouped convolution as a tiled GEMM (forward Y, backward dM) ------------------------------------------
 * Block: 128 output rows (M-layout rows e) x 128 output channels of one group, 256 threads, 8x8 outputs a thread.
 * Reduction over the group's dh input channels in steps of 4, each step with all K1 taps. Shared A tile: the source
 * rows [e0+base, e0+base+128+K1-1) of 4 channels (base 0 forward: M rows e+j; base -(K1-1) backward: dE rows e-j);
 * shared B tile: the weights of those 4 channels, K1 taps, 128 outputs. The next step's global loads are in flight
 * in registers during the products (one barrier a step).
 *   forward : out = Y, src = M,  w(kidx, d, n) = w1[g·dh+n, kidx, d],        Y(t)[n] = b1[n] + acc (t < T only)
 *   backward: out = dM, src = dY (dE: zero where t >= T or before row 0),
 *             w(kidx=o, d, n=ii) = w1[g·dh+o, ii, K1-1-d],                  dM[e][n] = acc (overwritten) */
constexpr int CG_BM = 128, CG_BN = 128, CG_BK = 4, CG_THREADS = 256, CG_LD = 132; /* 132: rows + halo, 16B rows */

template <int K1, bool BWD>
__global__ void __launch_bounds__(CG_THREADS, 2)
    conv_gemm_kernel(float *__restrict__ out, const float *__restrict__ src, const float *__restrict__ w1,
                     const float *__restrict__ b1, int B, int T, int C, int dh, int ntn, int vec) {
    gk_pdl_enter();
    static_assert(K1 >= 1 && CG_BM + K1 - 1 <= CG_LD, "K1 out of range");
    /* __align__ before __shared__: on the CPU emulator they become alignas and static, in that order only */
    __align__(16) __shared__ float As[2][CG_BK][CG_LD];
    __align__(16) __shared__ float Bs[2][CG_BK * K1][CG_LD];
    constexpr int AROWS = CG_BM + K1 - 1;
    constexpr int APER = (AROWS * CG_BK + CG_THREADS - 1) / CG_THREADS; /* A elements a thread loads */
    constexpr int AW = 8 + K1 - 1;                                        /* source rows a thread keeps */

    const int TM = T + K1 - 1;
    const long R = (long)B * TM;
    const int groups = C / dh, gnt = groups * ntn;
    /* thread (tx, ty) of a 16 x 16 grid, a warp covering 8 x 4 of it; rows ty*8 + [0, 8), columns tx*4 + [0, 4) and
     * 64 + tx*4 + [0, 4): every shared-memory read of the products is conflict-free */
    const int tid = threadIdx.x, tx = (tid / 32 % 2) * 8 + tid % 8, ty = (tid / 64) * 4 + tid % 32 / 8;
    const int gn = (int)(blockIdx.x % gnt), g = gn / ntn, n0 = (gn % ntn) * CG_BN;
    const long e0 = (long)(blockIdx.x / gnt) * CG_BM;
    const long col0 = (long)g * dh;

    /* Loaders, with little state kept across the loop (the 8x8 tile needs most registers).
     * A: thread owns channel akl of the step and tile rows q = tid/4 + 64·s; the source row of each (an M row, or
     * the dY row of a dE row; -1 = zero) is fixed for the block.
     * B: thread owns output n = tid/2 (forward) or n = tid % 128 (backward) and two of the step's four channels
     * (kl = 2·bh, 2·bh+1), all K1 taps: 2·K1 loads from one base pointer at fixed offsets. */
    static_assert(CG_BK == 4 && CG_THREADS == 2 * CG_BN, "loader mapping assumes 4 channels a step, 2 threads an output");
    const int akl = tid % CG_BK;
    int arow[APER];
#pragma unroll
    for (int s = 0; s < APER; s++) {
        const int q = tid / CG_BK + s * (CG_THREADS / CG_BK);
        arow[s] = -1;
        if (q < AROWS) {
            if (!BWD) {
                const long e = e0 + q;
                if (e < R) arow[s] = (int)e;
            } else {
                const long e = e0 - (K1 - 1) + q;
                if (e >= 0 && e < R) {
                    const int b = (int)(e / TM), t = (int)(e - (long)b * TM);
                    if (t < T) arow[s] = b * T + t;
                }
            }
        }
    }
    const float *pa = src + col0 + akl;
    const int bn = BWD ? tid % CG_BN : tid / 2, bh = BWD ? tid / CG_BN : tid % 2;
    const bool bn_ok = n0 + bn < dh;
    /* forward: w1[g·dh+n0+bn, kb+2bh+u/K1, u%K1] = pb[kb·K1 + u]; backward: w1[g·dh+kb+2bh+c, n0+bn, j] =
     * pb[(kb+c)·dh·K1 + j] */
    const float *pb = BWD ? w1 + (col0 + 2 * bh) * dh * K1 + (long)(n0 + bn) * K1
                          : w1 + (col0 + n0 + bn) * dh * K1 + 2 * bh * K1;
    float ra[APER], rb[2 * K1];

    auto load_global = [&](int kb) {
#pragma unroll
        for (int s = 0; s < APER; s++)
            ra[s] = (arow[s] >= 0 && kb + akl < dh) ? pa[(long)arow[s] * C + kb] : 0.0f;
        const int lim = dh - kb - 2 * bh; /* channels 2bh + c of the step exist while c < lim */
#pragma unroll
        for (int u = 0; u < 2 * K1; u++) {
            const int c = u / K1, j = u % K1;
            const bool ok = bn_ok && c < lim;
            if (!BWD)
                rb[u] = ok ? pb[(long)kb * K1 + u] : 0.0f;
            else
                rb[u] = ok ? pb[((long)kb + c) * dh * K1 + j] : 0.0f;
        }
    };
    auto store_shared = [&](int buf) {
#pragma unroll
        for (int s = 0; s < APER; s++) {
            const int q = tid / CG_BK + s * (CG_THREADS / CG_BK);
            if (q < AROWS) As[buf][akl][q] = ra[s];
        }
#pragma unroll
        for (int u = 0; u < 2 * K1; u++) {
            const int c = u / K1, j = u % K1;
            Bs[buf][(2 * bh + c) * K1 + (BWD ? K1 - 1 - j : j)][bn] = rb[u]; /* row = channel·K1 + tap offset d */
        }
    };

    float acc[8][8];
#pragma unroll
    for (int m = 0; m < 8; m++)
#pragma unroll
        for (int n = 0; n < 8; n++) acc[m][n] = 0.0f;

    const int nst = (dh + CG_BK - 1) / CG_BK;
    load_global(0);
    store_shared(0);
    __syncthreads();
    for (int st = 0; st < nst; st++) {
        const int buf = st & 1;
        if (st + 1 < nst) load_global((st + 1) * CG_BK); /* in flight during the products below */
#pragma unroll
        for (int k = 0; k < CG_BK; k++) {
            float a[AW];
#pragma unroll
            for (int v = 0; v < 2; v++) {
                const float4 t4 = *reinterpret_cast<const float4 *>(&As[buf][k][ty * 8 + 4 * v]);
                a[4 * v] = t4.x, a[4 * v + 1] = t4.y, a[4 * v + 2] = t4.z, a[4 * v + 3] = t4.w;
            }
#pragma unroll
            for (int v = 8; v < AW; v++) a[v] = As[buf][k][ty * 8 + v]; /* the halo rows of the later taps */
#pragma unroll
            for (int d = 0; d < K1; d++) {
                const float4 u0 = *reinterpret_cast<const float4 *>(&Bs[buf][k * K1 + d][tx * 4]);
                const float4 u1 = *reinterpret_cast<const float4 *>(&Bs[buf][k * K1 + d][64 + tx * 4]);
                const float bv[8] = {u0.x, u0.y, u0.z, u0.w, u1.x, u1.y, u1.z, u1.w};
#pragma unroll
                for (int m = 0; m < 8; m++)
#pragma unroll
                    for (int n = 0; n < 8; n++) acc[m][n] = fmaf(a[m + d], bv[n], acc[m][n]);
            }
        }
        if (st + 1 < nst) store_shared(buf ^ 1);
        __syncthreads();
    }

    /* epilogue: forward adds the bias and stores rows with t < T into Y's layout; backward stores every dM row.
     * Column n of the thread is channel nb[n / 4] + n % 4 of the group. */
    const int nb[2] = {n0 + tx * 4, n0 + 64 + tx * 4};
    float bias[8];
#pragma unroll
    for (int n = 0; n < 8; n++) {
        const int ch = nb[n / 4] + n % 4;
        bias[n] = (!BWD && ch < dh) ? b1[col0 + ch] : 0.0f;
    }
#pragma unroll
    for (int m = 0; m < 8; m++) {
        const long e = e0 + ty * 8 + m;
        if (e >= R) continue;
        long orow = e;
        if (!BWD) {
            const int b = (int)(e / TM), t = (int)(e - (long)b * TM);
            if (t >= T) continue;
            orow = (long)b * T + t;
        }
        float *o = out + orow * C + col0;
        float v[8];
#pragma unroll
        for (int n = 0; n < 8; n++) v[n] = BWD ? acc[m][n] : bias[n] + acc[m][n];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            if (vec) { /* dh % 4 == 0: each float4 is wholly inside or outside the group */
                if (nb[h] < dh)
                    *reinterpret_cast<float4 *>(o + nb[h]) = make_float4(v[4 * h], v[4 * h + 1], v[4 * h + 2], v[4 * h + 3]);
            } else {
#pragma unroll
                for (int n = 0; n < 4; n++)
                    if (nb[h] + n < dh) o[nb[h] + n] = v[4 * h + n];
            }
        }
    }
}

/* ---- grouped weight gradient: dw1[o, ii, j] += Σ_rows dE[e][o] · M[e+j][ii] (per group), and db1 ------------------
 * A GEMM over the rows, split-K: block = (group, 128 o, 128 kk = ii·K1 + j, i.e. w1's own layout) x one split of the
 * rows (8 a step). Each split writes its fp32 partial sums (at most a few thousand rows each) into scratch (part,
 * [splits][C·dh·K1]); conv_dw1_reduce_kernel adds them to dw1 in split order, in double. With one split the block adds straight into dw1. Blocks with kk tile 0 also sum the
 * dE tiles' columns (db1), in double, parked as hi/lo pairs in partb [splits][2][C]. */
constexpr int DW_BO = 128, DW_BN = 128, DW_BK = 8, DW_THREADS = 256, DW_LD = 132;

template <int K1>
__global__ void __launch_bounds__(DW_THREADS, 2)
    conv_dw1_kernel(float *__restrict__ part, float *__restrict__ partb, float *__restrict__ dw1, float *__restrict__ db1,
                    const float *__restrict__ dY, const float *__restrict__ M, int B, int T, int C, int dh, int nto,
                    int ntk, int splits, int vec) {
    __align__(16) __shared__ float As[2][DW_BK][DW_LD];
    __align__(16) __shared__ float Bs[2][DW_BK][DW_LD];
    const int TM = T + K1 - 1, NK = dh * K1;
    const long ER = (long)B * TM - (K1 - 1); /* rows of dE (the rest of the last sequence's tail is zero) */
    const int tid = threadIdx.x, tx = (tid / 32 % 2) * 8 + tid % 8, ty = (tid / 64) * 4 + tid % 32 / 8; /* as above */
    const int bid = blockIdx.x, kt = bid % ntk, ot = (bid / ntk) % nto, g = bid / (ntk * nto);
    const int o0 = ot * DW_BO, kk0 = kt * DW_BN, s = blockIdx.y;
    const long rb = (long)s * ER / splits, re = (long)(s + 1) * ER / splits;
    const long col0 = (long)g * dh;
    const bool with_db1 = kt == 0;

    /* Loaders: thread owns step row k = tid / 32 and four consecutive tile columns c4 + [0, 4) of both tiles.
     * A (dE): channels o0 + c4 + i of that row; its (t, b·T) advance by 8 rows a step without a division.
     * B (M shifted by the tap): kk = kk0 + c4 + i, i.e. M row e + kk % K1, channel kk / K1. */
    const int lk = tid / 32, c4 = tid % 32 * 4;
    int at, abT; /* t and b·T of the thread's dE row (B·T rows fit an int) */
    {
        const long e = rb + lk;
        const int b = (int)(e / TM);
        at = (int)(e - (long)b * TM);
        abT = b * T;
    }
    const float *pdy = dY + col0 + o0 + c4, *pm = M + col0;
    float ra[4], rbv[4];
    double dbacc = 0; /* db1: threads tid < 128 sum column tid of every A tile */

    auto load_global = [&](long ebase) {
        const long e = ebase + lk;
        const bool row_ok = e < re && at < T;
#pragma unroll
        for (int i = 0; i < 4; i++)
            ra[i] = (row_ok && o0 + c4 + i < dh) ? pdy[(long)(abT + at) * C + i] : 0.0f;
        at += DW_BK; /* next step's row */
        while (at >= TM) at -= TM, abT += T;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int kk = kk0 + c4 + i;
            rbv[i] = (e < re && kk < NK) ? pm[(e + kk % K1) * C + kk / K1] : 0.0f;
        }
    };
    auto store_shared = [&](int buf) {
        *reinterpret_cast<float4 *>(&As[buf][lk][c4]) = make_float4(ra[0], ra[1], ra[2], ra[3]);
        *reinterpret_cast<float4 *>(&Bs[buf][lk][c4]) = make_float4(rbv[0], rbv[1], rbv[2], rbv[3]);
    };

    float acc[8][8];
#pragma unroll
    for (int m = 0; m < 8; m++)
#pragma unroll
        for (int n = 0; n < 8; n++) acc[m][n] = 0.0f;

    const long nst = (re - rb + DW_BK - 1) / DW_BK;
    if (nst > 0) {
        load_global(rb);
        store_shared(0);
    }
    __syncthreads();
    for (long st = 0; st < nst; st++) {
        const int buf = (int)(st & 1);
        if (st + 1 < nst) load_global(rb + (st + 1) * DW_BK);
#pragma unroll
        for (int k = 0; k < DW_BK; k++) {
            const float4 a0 = *reinterpret_cast<const float4 *>(&As[buf][k][ty * 8]);
            const float4 a1 = *reinterpret_cast<const float4 *>(&As[buf][k][ty * 8 + 4]);
            const float4 b0 = *reinterpret_cast<const float4 *>(&Bs[buf][k][tx * 4]);
            const float4 b1 = *reinterpret_cast<const float4 *>(&Bs[buf][k][64 + tx * 4]);
            const float av[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
            const float bv[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
            for (int m = 0; m < 8; m++)
#pragma unroll
                for (int n = 0; n < 8; n++) acc[m][n] = fmaf(av[m], bv[n], acc[m][n]);
        }
        if (with_db1 && tid < DW_BO)
#pragma unroll
            for (int k = 0; k < DW_BK; k++) dbacc += (double)As[buf][k][tid]; /* rows in order */
        if (st + 1 < nst) store_shared(buf ^ 1);
        __syncthreads();
    }

    const int kb[2] = {kk0 + tx * 4, kk0 + 64 + tx * 4}; /* column n of the thread: kk = kb[n / 4] + n % 4 */
    float *dst = splits == 1 ? dw1 : part + (long)s * C * NK;
#pragma unroll
    for (int m = 0; m < 8; m++) {
        const int o = o0 + ty * 8 + m;
        if (o >= dh) continue;
        float *p = dst + (col0 + o) * NK;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            if (vec) { /* NK % 4 == 0 */
                if (kb[h] >= NK) continue;
                float4 v = make_float4(acc[m][4 * h], acc[m][4 * h + 1], acc[m][4 * h + 2], acc[m][4 * h + 3]);
                if (splits == 1) {
                    const float4 old = *reinterpret_cast<const float4 *>(p + kb[h]);
                    v.x += old.x, v.y += old.y, v.z += old.z, v.w += old.w;
                }
                *reinterpret_cast<float4 *>(p + kb[h]) = v;
            } else {
#pragma unroll
                for (int n = 0; n < 4; n++)
                    if (kb[h] + n < NK) p[kb[h] + n] = splits == 1 ? p[kb[h] + n] + acc[m][4 * h + n] : acc[m][4 * h + n];
            }
        }
    }
    if (with_db1 && tid < DW_BO && o0 + tid < dh) {
        const long c = col0 + o0 + tid;
        if (splits == 1)
            db1[c] += (float)dbacc;
        else
            put_split(partb + (long)s * 2 * C + c, partb + (long)s * 2 * C + C + c, dbacc);
    }
}

/* dw1[i] += Σ_s part[s][i], db1[c] += Σ_s partb[s][c] (hi + lo), splits in order, in double. */
__global__ void conv_dw1_reduce_kernel(float *__restrict__ dw1, float *__restrict__ db1, const float *__restrict__ part,
                                       const float *__restrict__ partb, long n1, int C, int splits) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n1 + C; i += (long)gridDim.x * blockDim.x) {
        double v = 0;
        if (i < n1) {
            for (int s = 0; s < splits; s++) v += (double)part[(long)s * n1 + i];
            dw1[i] += (float)v;
        } else {
            const long c = i - n1;
            for (int s = 0; s < splits; s++)
                v += (double)partb[(long)s * 2 * C + c] + (double)partb[(long)s * 2 * C + C + c];
            db1[c] += (float)v;
        }
    }
}

/* ---- depthwise backward: dX, db0, dw0 from dM ----------------------------------------------------------------------
 * Block = 32 channels x one chunk of dM rows (8 thread rows striding it). For dM row e = (b, i):
 *   db0 += dM[e];  when i >= k1-1 it also handles X row t = i-(k1-1), whose gradient reads the dM rows i+d,
 *   d = K0-1-j (< TM): dX[t] += dM[i+d]·w0[j] (the CPU's order, unfused) and dw0[j] += dM[i+d]·X[t].
 * So a chunk [r0, r1) reads dM rows [r0, r1+K0-1); rows [r0+K0-1, r1) are read by this block alone, and after its
 * barrier the block parks its double partials there (hi/lo, 2·(K0+1) rows; chunks have >= 3·K0+1 rows).
 * conv_dcol_reduce sums the chunks in order. With a single chunk the block adds straight into db0/dw0. */
constexpr int DC_THREADS = 256, DC_COLS = 32, DC_TROWS = DC_THREADS / DC_COLS, DC_CHUNK = 256;

template <int K0>
__global__ void __launch_bounds__(DC_THREADS)
    conv_dcol_kernel(float *__restrict__ dX, float *__restrict__ db0, float *__restrict__ dw0, float *__restrict__ dM,
                     const float *__restrict__ X, const float *__restrict__ w0, int B, int T, int C, int k1, int nslab,
                     int nchunks) {
    __shared__ double red[K0 + 1][DC_THREADS];
    const int TM = T + k1 - 1;
    const long R = (long)B * TM;
    const int tx = threadIdx.x % DC_COLS, ty = threadIdx.x / DC_COLS;
    const int slab = (int)(blockIdx.x % nslab), chunk = (int)(blockIdx.x / nslab);
    const int c = slab * DC_COLS + tx;
    const long r0 = (long)chunk * R / nchunks, r1 = (long)(chunk + 1) * R / nchunks;
    double acc[K0 + 1];
#pragma unroll
    for (int q = 0; q <= K0; q++) acc[q] = 0;
    if (c < C) {
        float w[K0];
#pragma unroll
        for (int j = 0; j < K0; j++) w[j] = w0[(long)c * K0 + j];
        long e = r0 + ty;
        int b = (int)(e / TM), i = (int)(e - (long)b * TM);
        for (; e < r1; e += DC_TROWS) {
            const float dm = dM[e * C + c];
            acc[0] += (double)dm;
            if (i >= k1 - 1) {
                const long xr = ((long)b * T + (i - (k1 - 1))) * C + c;
                const float x = X[xr];
                float dx = dX[xr];
#pragma unroll
                for (int j = 0; j < K0; j++) {
                    const int d = K0 - 1 - j;
                    if (i + d >= TM) continue;
                    const float dmj = d ? dM[(e + d) * C + c] : dm;
                    dx = __fadd_rn(dx, __fmul_rn(dmj, w[j]));
                    acc[1 + j] += (double)dmj * (double)x;
                }
                dX[xr] = dx;
            }
            i += DC_TROWS;
            while (i >= TM) i -= TM, b++;
        }
    }
#pragma unroll
    for (int q = 0; q <= K0; q++) red[q][threadIdx.x] = acc[q];
    __syncthreads(); /* also: every read of this chunk's dM rows is done */
    if (ty == 0 && c < C) {
#pragma unroll
        for (int q = 0; q <= K0; q++) {
            double v = 0;
            for (int y = 0; y < DC_TROWS; y++) v += red[q][y * DC_COLS + tx];
            float *dst = q == 0 ? db0 + c : dw0 + (long)c * K0 + (q - 1);
            if (nchunks == 1) {
                *dst += (float)v;
            } else {
                const long p = r0 + K0 - 1 + 2 * q;
                put_split(dM + p * C + c, dM + (p + 1) * C + c, v);
            }
        }
    }
}

__global__ void conv_dcol_reduce_kernel(float *__restrict__ db0, float *__restrict__ dw0, const float *__restrict__ dM,
                                        int B, int T, int C, int k0, int k1, int nchunks) {
    const long R = (long)B * (T + k1 - 1);
    for (long idx = blockIdx.x * (long)blockDim.x + threadIdx.x; idx < (long)C * (k0 + 1);
         idx += (long)gridDim.x * blockDim.x) {
        const int q = (int)(idx / C), c = (int)(idx % C);
        double v = 0;
        for (int s = 0; s < nchunks; s++) {
            const long p = (long)s * R / nchunks + k0 - 1 + 2 * q;
            v += (double)dM[p * C + c] + (double)dM[(p + 1) * C + c];
        }
        if (q == 0)
            db0[c] += (float)v;
        else
            dw0[(long)c * k0 + q - 1] += (float)v;
    }
}

/* ---- fallbacks for k0 or k1 above 4 (no model uses them: correct, deterministic, not fast) ------------------------ */
__global__ void naive_y_kernel(float *__restrict__ Y, const float *__restrict__ M, const float *__restrict__ w1,
                               const float *__restrict__ b1, int B, int T, int C, int dh, int k1) {
    gk_pdl_enter();
    const int TM = T + k1 - 1;
    for (long idx = blockIdx.x * (long)blockDim.x + threadIdx.x; idx < (long)B * T * C;
         idx += (long)gridDim.x * blockDim.x) {
        const long row = idx / C;
        const int o = (int)(idx % C), g = o / dh, b = (int)(row / T), t = (int)(row % T);
        const long e = (long)b * TM + t;
        float acc = 0;
        for (int j = 0; j < k1; j++)
            for (int ii = 0; ii < dh; ii++)
                acc = fmaf(M[(e + j) * C + (long)g * dh + ii], w1[((long)o * dh + ii) * k1 + j], acc);
        Y[idx] = b1[o] + acc;
    }
}

__global__ void naive_dm_kernel(float *__restrict__ dM, const float *__restrict__ dY, const float *__restrict__ w1,
                                int B, int T, int C, int dh, int k1) {
    const int TM = T + k1 - 1;
    for (long idx = blockIdx.x * (long)blockDim.x + threadIdx.x; idx < (long)B * TM * C;
         idx += (long)gridDim.x * blockDim.x) {
        const long e = idx / C;
        const int c = (int)(idx % C), g = c / dh, ii = c % dh;
        float acc = 0;
        for (int j = 0; j < k1; j++) {
            const long er = e - j;
            if (er < 0) continue;
            const int b = (int)(er / TM), t = (int)(er % TM);
            if (t >= T) continue;
            for (int o = 0; o < dh; o++)
                acc = fmaf(dY[((long)b * T + t) * C + (long)g * dh + o], w1[(((long)g * dh + o) * dh + ii) * k1 + j],
                           acc);
        }
        dM[idx] = acc;
    }
}

__global__ void naive_dw1_kernel(float *__restrict__ dw1, const float *__restrict__ dY, const float *__restrict__ M,
                                 int B, int T, int C, int dh, int k1) {
    const int TM = T + k1 - 1;
    for (long idx = blockIdx.x * (long)blockDim.x + threadIdx.x; idx < (long)C * dh * k1;
         idx += (long)gridDim.x * blockDim.x) {
        const int o = (int)(idx / ((long)dh * k1)), ii = (int)(idx / k1 % dh), j = (int)(idx % k1), g = o / dh;
        double acc = 0;
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++)
                acc += (double)dY[((long)b * T + t) * C + o] * M[((long)b * TM + t + j) * C + (long)g * dh + ii];
        dw1[idx] += (float)acc;
    }
}

/* db0 (q = 0) and dw0[., q-1] from dM, one thread per (channel, q), rows in order. */
__global__ void naive_dcol_kernel(float *__restrict__ db0, float *__restrict__ dw0, const float *__restrict__ dM,
                                  const float *__restrict__ X, int B, int T, int C, int k0, int k1) {
    const int TM = T + k1 - 1;
    for (long idx = blockIdx.x * (long)blockDim.x + threadIdx.x; idx < (long)C * (k0 + 1);
         idx += (long)gridDim.x * blockDim.x) {
        const int q = (int)(idx / C), c = (int)(idx % C);
        double acc = 0;
        for (int b = 0; b < B; b++)
            for (int i = 0; i < TM; i++) {
                const float dm = dM[((long)b * TM + i) * C + c];
                if (q == 0) {
                    acc += dm;
                } else {
                    const int t = i - (k1 - 1) - (k0 - 1) + (q - 1);
                    if (t >= 0) acc += (double)dm * X[((long)b * T + t) * C + c];
                }
            }
        if (q == 0)
            db0[c] += (float)acc;
        else
            dw0[(long)c * k0 + q - 1] += (float)acc;
    }
}

__global__ void naive_dx_kernel(float *__restrict__ dX, const float *__restrict__ dM, const float *__restrict__ w0,
                                int B, int T, int C, int k0, int k1) {
    const int TM = T + k1 - 1;
    for (long idx = blockIdx.x * (long)blockDim.x + threadIdx.x; idx < (long)B * T * C;
         idx += (long)gridDim.x * blockDim.x) {
        const long row = idx / C;
        const int c = (int)(idx % C), b = (int)(row / T), t = (int)(row % T);
        float dx = dX[idx];
        for (int j = 0; j < k0; j++) {
            const int i = t + (k0 - 1) - j + (k1 - 1);
            if (i >= TM) continue;
            dx = __fadd_rn(dx, __fmul_rn(dM[((long)b * TM + i) * C + c], w0[(long)c * k0 + j]));
        }
        dX[idx] = dx;
    }
}

struct RowSum { /* db1 in the fallback: column sums of dY */
    const float *x;
    int C;
    __device__ float operator()(long r, int c) const { return x[r * C + c]; }
};

/* ---- launch helpers ---------------------------------------------------------------------------------------------- */
template <int K1>
void launch_conv_gemm(gpuStream_t s, bool bwd, float *out, const float *src, const float *w1, const float *b1, int B,
                      int T, int C, int dh) {
    const long R = (long)B * (T + K1 - 1);
    const int ntn = (dh + CG_BN - 1) / CG_BN, groups = C / dh;
    const long blocks = (R + CG_BM - 1) / CG_BM * groups * ntn;
    const int vec = dh % 4 == 0 && aligned16(out);
    if (bwd)
        GK_LAUNCH_PDL((conv_gemm_kernel<K1, true>), (unsigned)blocks, CG_THREADS, 0, s, out, src, w1, b1, B, T, C, dh,
                      ntn, vec);
    else
        GK_LAUNCH_PDL((conv_gemm_kernel<K1, false>), (unsigned)blocks, CG_THREADS, 0, s, out, src, w1, b1, B, T, C, dh,
                      ntn, vec);
}

template <int K1>
void launch_conv_dw1(gpuStream_t s, float *dw1, float *db1, float *scratch, const float *dY, const float *M, int B,
                     int T, int C, int dh) {
    const long R = (long)B * (T + K1 - 1), ER = R - (K1 - 1), NK = (long)dh * K1;
    const int nto = (dh + DW_BO - 1) / DW_BO, ntk = (int)((NK + DW_BN - 1) / DW_BN);
    const long tiles = (long)(C / dh) * nto * ntk;
    /* splits: ~512 blocks, >= 64 rows a split, partials must fit the scratch (R·C floats); shapes alone decide */
    long splits = (512 + tiles - 1) / tiles;
    if (splits > ER / 64) splits = ER / 64;
    if (splits > R / (NK + 2)) splits = R / (NK + 2);
    if (splits > 256) splits = 256;
    if (splits < 1) splits = 1;
    float *part = scratch, *partb = scratch + splits * C * NK;
    const int vec = NK % 4 == 0 && aligned16(splits == 1 ? dw1 : part);
    dim3 grid((unsigned)tiles, (unsigned)splits);
    GK_LAUNCH(conv_dw1_kernel<K1>, grid, DW_THREADS, 0, s, part, partb, dw1, db1, dY, M, B, T, C, dh, nto, ntk,
              (int)splits, vec);
    if (splits > 1) {
        const long n1 = (long)C * NK;
        GK_LAUNCH(conv_dw1_reduce_kernel, gk_blocks(n1 + C, EW_THREADS), EW_THREADS, 0, s, dw1, db1, part, partb, n1,
                  C, (int)splits);
    }
}

template <int K0>
void launch_conv_dcol(gpuStream_t s, float *dX, float *db0, float *dw0, float *dM, const float *X, const float *w0,
                      int B, int T, int C, int k1) {
    const long R = (long)B * (T + k1 - 1);
    const int nslab = (C + DC_COLS - 1) / DC_COLS;
    const long chunk = DC_CHUNK > 3 * K0 + 1 ? DC_CHUNK : 3 * K0 + 1;
    long nchunks = R / chunk;
    if (nchunks > 65535) nchunks = 65535;
    if (nchunks < 1) nchunks = 1;
    GK_LAUNCH(conv_dcol_kernel<K0>, (unsigned)(nslab * nchunks), DC_THREADS, 0, s, dX, db0, dw0, dM, X, w0, B, T, C, k1,
              nslab, (int)nchunks);
    if (nchunks > 1)
        GK_LAUNCH(conv_dcol_reduce_kernel, gk_blocks((long)C * (K0 + 1), EW_THREADS), EW_THREADS, 0, s, db0, dw0, dM, B,
                  T, C, K0, k1, (int)nchunks);
}

/* ---- q-k mean skip ---------------------------------------------------------------------------------------------
 * One thread per (row, kv head j, channel i): the G query heads of the group and the key, the CPU's arithmetic
 * (gpu_cca_rows.cuh's qk_mean_at; cached decoding runs it inside gk_cca_decode_rows). */
__global__ void qk_mean_fwd_kernel(float *__restrict__ query, float *__restrict__ key, const float *__restrict__ Y,
                                   const float *__restrict__ X, int rows, int Hq, int Hkv, int dh) {
    gk_pdl_enter();
    const int G = Hq / Hkv, C = (Hq + Hkv) * dh, Cq = Hq * dh, nk = Hkv * dh;
    const int el = blockIdx.x * blockDim.x + threadIdx.x;
    if (el >= nk) return;
    const int j = el / dh, i = el - j * dh;
    for (long r = blockIdx.y; r < rows; r += gridDim.y)
        qk_mean_at(X + r * C, Y + r * C, j, i, G, dh, Cq, query + r * Cq + (long)j * G * dh, dh, key + r * nk + el);
}

__global__ void qk_mean_bwd_kernel(float *__restrict__ dY, float *__restrict__ dX, const float *__restrict__ dquery,
                                   const float *__restrict__ dkey, int rows, int Hq, int Hkv, int dh) {
    const int G = Hq / Hkv, C = (Hq + Hkv) * dh, Cq = Hq * dh, nk = Hkv * dh;
    const int el = blockIdx.x * blockDim.x + threadIdx.x;
    if (el >= nk) return;
    const int j = el / dh, i = el - j * dh;
    for (long r = blockIdx.y; r < rows; r += gridDim.y) {
        float *dx = dX + r * C, *dy = dY + r * C;
        const float *dq = dquery + r * Cq;
        const float dkj = dkey[r * nk + el], dkg = __fdiv_rn(dkj, (float)G);
        double dqm_sum = 0;
        for (int g = 0; g < G; g++) {
            const int h = j * G + g;
            const float dqh = dq[h * dh + i], dqm = __fadd_rn(dqh, dkg); /* the gradient reaching qm[h] */
            dy[h * dh + i] = __fadd_rn(dy[h * dh + i], dqh);
            dx[h * dh + i] = __fadd_rn(dx[h * dh + i], __fmul_rn(dqm, 0.5f));
            dqm_sum += dqm;
        }
        dy[Cq + el] = __fadd_rn(dy[Cq + el], dkj);
        dx[Cq + el] = __fadd_rn(dx[Cq + el], (float)(dqm_sum * 0.5));
    }
}

/* ---- delayed values ------------------------------------------------------------------------------------------- */
__global__ void delayed_value_fwd_kernel(float *__restrict__ value, const float *__restrict__ vc,
                                         const float *__restrict__ vd, long rows, int T, int half) {
    const int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= 2 * half) return;
    for (long r = blockIdx.y; r < rows; r += gridDim.y) {
        float v;
        if (col < half)
            v = vc[r * half + col];
        else
            v = r % T > 0 ? vd[(r - 1) * half + col - half] : 0.0f;
        value[r * 2 * half + col] = v;
    }
}

__global__ void delayed_value_bwd_kernel(float *__restrict__ dvc, float *__restrict__ dvd,
                                         const float *__restrict__ dvalue, long rows, int T, int half) {
    const int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= half) return;
    for (long r = blockIdx.y; r < rows; r += gridDim.y) {
        dvc[r * half + col] = __fadd_rn(dvc[r * half + col], dvalue[r * 2 * half + col]);
        if (r % T + 1 < T) dvd[r * half + col] = __fadd_rn(dvd[r * half + col], dvalue[(r + 1) * 2 * half + half + col]);
    }
}

/* ---- RoPE (in place) ------------------------------------------------------------------------------------------ */
/* Row r rotates at position r % T, or pos[r] when pos (device [rows]) is given (a ragged batch's rows). */
template <bool BACK>
__global__ void rope_kernel(float *__restrict__ x, const float *__restrict__ cosv, const float *__restrict__ sinv,
                            long rows, int T, int H, int dh, int half, const int32_t *__restrict__ pos) {
    gk_pdl_enter();
    const int el = blockIdx.x * blockDim.x + threadIdx.x;
    if (el >= H * half) return;
    const int h = el / half, k = el - h * half;
    for (long r = blockIdx.y; r < rows; r += gridDim.y) {
        const long p = (pos ? (long)pos[r] : r % T) * half + k;
        const float c = cosv[p], s = sinv[p];
        float *v = x + (r * H + h) * dh;
        const float a = v[k], b = v[k + half];
        if (!BACK) {
            v[k] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
            v[k + half] = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
        } else {
            v[k] = __fadd_rn(__fmul_rn(a, c), __fmul_rn(b, s));
            v[k + half] = __fsub_rn(__fmul_rn(b, c), __fmul_rn(a, s));
        }
    }
}

/* ---- QK L2 norm + partial RoPE ----------------------------------------------------------------------------------
 * One warp per (row, head): the sum of squares in double (warp tree), then the rotated pairs (k, k+half) and the
 * channels >= 2·half as they are. The head's dh values are read twice (the second read hits L1). */
constexpr int NR_THREADS = 256, NR_WARPS = NR_THREADS / GPU_WARP;

/* f·(dy − cc·x) in double, unfused like the CPU (cc = 0 below the norm clamp gives f·dy exactly) */
__device__ __forceinline__ float grad_x(float dyv, float xv, double f, double cc) {
    return (float)__dmul_rn(f, __dsub_rn((double)dyv, __dmul_rn(cc, (double)xv)));
}

/* The items of both parts (q's rows × Hq heads, then k's rows × Hkv): one launch normalises and rotates both. */
__global__ void __launch_bounds__(NR_THREADS)
    l2norm_rope_fwd_kernel(GkNormRopePart qp, GkNormRopePart kp, long q_items, long items,
                           const float *__restrict__ cosv, const float *__restrict__ sinv, int T, int dh, int half,
                           float scale, float eps, const int32_t *__restrict__ pos) {
    gk_pdl_enter();
    for (long item = (long)blockIdx.x * NR_WARPS + threadIdx.x / GPU_WARP; item < items;
         item += (long)gridDim.x * NR_WARPS) {
        const bool is_q = item < q_items; /* each field chosen alone: a chosen struct would go to local memory */
        const int H = is_q ? qp.H : kp.H;
        const long it = is_q ? item : item - q_items, r = it / H;
        const int h = (int)(it - r * H);
        const float *temp = is_q ? qp.temp : kp.temp;
        const long at = pos ? (long)pos[r] : r % T; /* per-row positions: a ragged batch */
        l2norm_rope_head((is_q ? qp.y : kp.y) + it * dh, (is_q ? qp.norm : kp.norm) + it,
                         (is_q ? qp.x : kp.x) + it * dh, temp ? temp + h : nullptr, cosv + at * half, sinv + at * half,
                         dh, half, scale, eps);
    }
}

/* The backward: dx (overwritten) = l2norm'ᵀ (rope'ᵀ dy). The rotated dy is recomputed on each read rather than
 * stored. With dtemp, each (row, head) parks its dtemp term dot·scale/max(n, eps) (double, as hi/lo) in the first
 * two floats of its own dy segment once the whole block is past its reads (dy is scratch by contract); the warps of
 * a block walk the items in lockstep so the barrier is uniform. rope_dtemp_reduce then sums the rows in order. */
__global__ void __launch_bounds__(NR_THREADS)
    rope_l2norm_bwd_kernel(float *__restrict__ dx, float *__restrict__ dy, const float *__restrict__ x,
                           const float *__restrict__ norm, const float *__restrict__ temp,
                           const float *__restrict__ cosv, const float *__restrict__ sinv, long items, int T, int H,
                           int dh, int half, float scale, float eps, int want_dtemp) {
    const int lane = threadIdx.x % GPU_WARP;
    for (long base = (long)blockIdx.x * NR_WARPS; base < items; base += (long)gridDim.x * NR_WARPS) {
        const long it = base + threadIdx.x / GPU_WARP;
        double term = 0;
        if (it < items) {
            const long r = it / H;
            const int h = (int)(it - r * H);
            const float *xv = x + it * dh, *dyv = dy + it * dh;
            float *dxv = dx + it * dh;
            const float *cs = cosv + (r % T) * half, *sn = sinv + (r % T) * half;
            double dot = 0;
            for (int k = lane; k < half; k += GPU_WARP) {
                const float a = dyv[k], b = dyv[k + half], c = cs[k], s = sn[k];
                const float ra = __fadd_rn(__fmul_rn(a, c), __fmul_rn(b, s)), rb = __fsub_rn(__fmul_rn(b, c), __fmul_rn(a, s));
                dot += (double)ra * xv[k] + (double)rb * xv[k + half];
            }
            for (int k = 2 * half + lane; k < dh; k += GPU_WARP) dot += (double)dyv[k] * xv[k];
            dot = warp_sum_d(dot);
            const double t = temp ? (double)temp[h] : 1.0;
            const float n = norm[it];
            const bool live = n > eps;
            const double f = live ? t * scale / n : t * scale / eps, cc = live ? dot / ((double)n * n) : 0.0;
            for (int k = lane; k < half; k += GPU_WARP) {
                const float a = dyv[k], b = dyv[k + half], c = cs[k], s = sn[k];
                const float ra = __fadd_rn(__fmul_rn(a, c), __fmul_rn(b, s)), rb = __fsub_rn(__fmul_rn(b, c), __fmul_rn(a, s));
                dxv[k] = grad_x(ra, xv[k], f, cc);
                dxv[k + half] = grad_x(rb, xv[k + half], f, cc);
            }
            for (int k = 2 * half + lane; k < dh; k += GPU_WARP) dxv[k] = grad_x(dyv[k], xv[k], f, cc);
            term = dot * (double)(scale / (n > eps ? n : eps)); /* the CPU's f here is a float quotient */
        }
        if (want_dtemp) {
            __syncthreads(); /* every lane of the block is past its reads of dy */
            if (it < items && lane == 0) {
                float *p = dy + it * dh;
                if (dh >= 2)
                    put_split(p, p + 1, term);
                else
                    p[0] = (float)term;
            }
        }
    }
}

/* dtemp[h] += Σ_r term(r, h), one block a head, a fixed row split and block tree. */
__global__ void rope_dtemp_reduce_kernel(float *__restrict__ dtemp, const float *__restrict__ dy, long rows, int H,
                                         int dh) {
    __shared__ double sh[32];
    const int h = blockIdx.x;
    double v = 0;
#pragma unroll 8
    for (long r = threadIdx.x; r < rows; r += blockDim.x) {
        const float *p = dy + (r * H + h) * dh;
        v += (double)p[0] + (dh >= 2 ? (double)p[1] : 0.0);
    }
    v = block_sum_d(v, sh);
    if (threadIdx.x == 0) dtemp[h] += (float)v;
}

} /* namespace */

/* ================================================================================================================ */

/* tc: the grouped product on tensor cores (bf16 operands) where gk_cca_conv_gemm_tc takes the shape */
static void conv_forward(GkStream s, bool tc, float *Y, float *M, const float *X, const float *w0, const float *b0,
                         const float *w1, const float *b1, int B, int T, int C, int dh, int k0, int k1) {
    if (B <= 0 || T <= 0 || C <= 0 || dh <= 0 || k0 <= 0 || k1 <= 0) return;
    const long R = (long)B * (T + k1 - 1);
    const int ncb = (C + 31) / 32;
    const unsigned dblocks = (unsigned)(ncb * ((R + DEPTH_ROWS - 1) / DEPTH_ROWS));
    switch (k0) {
    case 1: GK_LAUNCH_PDL((depthwise_fwd_kernel<1>), dblocks, 256, 0, s, M, X, w0, b0, B, T, C, k0, k1, ncb); break;
    case 2: GK_LAUNCH_PDL((depthwise_fwd_kernel<2>), dblocks, 256, 0, s, M, X, w0, b0, B, T, C, k0, k1, ncb); break;
    case 3: GK_LAUNCH_PDL((depthwise_fwd_kernel<3>), dblocks, 256, 0, s, M, X, w0, b0, B, T, C, k0, k1, ncb); break;
    case 4: GK_LAUNCH_PDL((depthwise_fwd_kernel<4>), dblocks, 256, 0, s, M, X, w0, b0, B, T, C, k0, k1, ncb); break;
    default: GK_LAUNCH_PDL((depthwise_fwd_kernel<0>), dblocks, 256, 0, s, M, X, w0, b0, B, T, C, k0, k1, ncb);
    }
    if (tc && gk_cca_conv_gemm_tc(s, 0, Y, M, w1, b1, B, T, C, dh, k1) == 0) return;
    switch (k1) {
    case 1: launch_conv_gemm<1>(s, false, Y, M, w1, b1, B, T, C, dh); break;
    case 2: launch_conv_gemm<2>(s, false, Y, M, w1, b1, B, T, C, dh); break;
    case 3: launch_conv_gemm<3>(s, false, Y, M, w1, b1, B, T, C, dh); break;
    case 4: launch_conv_gemm<4>(s, false, Y, M, w1, b1, B, T, C, dh); break;
    default:
        GK_LAUNCH_PDL(naive_y_kernel, gk_blocks((long)B * T * C, EW_THREADS), EW_THREADS, 0, s, Y, M, w1, b1, B, T, C,
                      dh, k1);
    }
}

extern "C" void gk_cca_conv_forward(GkStream s, float *Y, float *M, const float *X, const float *w0, const float *b0,
                                    const float *w1, const float *b1, int B, int T, int C, int dh, int k0, int k1) {
    conv_forward(s, false, Y, M, X, w0, b0, w1, b1, B, T, C, dh, k0, k1);
}
extern "C" void gk_cca_conv_forward_bf16(GkStream s, float *Y, float *M, const float *X, const float *w0,
                                         const float *b0, const float *w1, const float *b1, int B, int T, int C, int dh,
                                         int k0, int k1) {
    conv_forward(s, true, Y, M, X, w0, b0, w1, b1, B, T, C, dh, k0, k1);
}

/* Order: the grouped weight / bias gradients first (they use dM as split-K scratch), then dM itself (on tensor cores
 * where tc and the shape allow), then the depthwise gradients from dM (which park their chunk partials in dM's own
 * rows). */
static void conv_backward(GkStream s, bool tc, float *dX, float *dw0, float *db0, float *dw1, float *db1, float *dM,
                          const float *dY, const float *X, const float *M, const float *w0, const float *w1, int B,
                          int T, int C, int dh, int k0, int k1) {
    if (B <= 0 || T <= 0 || C <= 0 || dh <= 0 || k0 <= 0 || k1 <= 0) return;
    /* tensor cores for dM: the weight gradient stays the fp32 split-K kernel (its split needs dM as scratch first) */
    const bool dm_tc = tc && dh % 16 == 0 && C % dh == 0 && k1 <= 4;
    switch (k1) {
    case 1:
        launch_conv_dw1<1>(s, dw1, db1, dM, dY, M, B, T, C, dh);
        if (!dm_tc || gk_cca_conv_gemm_tc(s, 1, dM, dY, w1, nullptr, B, T, C, dh, 1))
            launch_conv_gemm<1>(s, true, dM, dY, w1, nullptr, B, T, C, dh);
        break;
    case 2:
        launch_conv_dw1<2>(s, dw1, db1, dM, dY, M, B, T, C, dh);
        if (!dm_tc || gk_cca_conv_gemm_tc(s, 1, dM, dY, w1, nullptr, B, T, C, dh, 2))
            launch_conv_gemm<2>(s, true, dM, dY, w1, nullptr, B, T, C, dh);
        break;
    case 3:
        launch_conv_dw1<3>(s, dw1, db1, dM, dY, M, B, T, C, dh);
        if (!dm_tc || gk_cca_conv_gemm_tc(s, 1, dM, dY, w1, nullptr, B, T, C, dh, 3))
            launch_conv_gemm<3>(s, true, dM, dY, w1, nullptr, B, T, C, dh);
        break;
    case 4:
        launch_conv_dw1<4>(s, dw1, db1, dM, dY, M, B, T, C, dh);
        if (!dm_tc || gk_cca_conv_gemm_tc(s, 1, dM, dY, w1, nullptr, B, T, C, dh, 4))
            launch_conv_gemm<4>(s, true, dM, dY, w1, nullptr, B, T, C, dh);
        break;
    default:
        GK_LAUNCH(naive_dw1_kernel, gk_blocks((long)C * dh * k1, EW_THREADS), EW_THREADS, 0, s, dw1, dY, M, B, T, C, dh,
                  k1);
        col_reduce(s, db1, (long)B * T, C, RowSum{dY, C});
        GK_LAUNCH(naive_dm_kernel, gk_blocks((long)B * (T + k1 - 1) * C, EW_THREADS), EW_THREADS, 0, s, dM, dY, w1, B,
                  T, C, dh, k1);
    }
    switch (k0) {
    case 1: launch_conv_dcol<1>(s, dX, db0, dw0, dM, X, w0, B, T, C, k1); break;
    case 2: launch_conv_dcol<2>(s, dX, db0, dw0, dM, X, w0, B, T, C, k1); break;
    case 3: launch_conv_dcol<3>(s, dX, db0, dw0, dM, X, w0, B, T, C, k1); break;
    case 4: launch_conv_dcol<4>(s, dX, db0, dw0, dM, X, w0, B, T, C, k1); break;
    default:
        GK_LAUNCH(naive_dcol_kernel, gk_blocks((long)C * (k0 + 1), EW_THREADS), EW_THREADS, 0, s, db0, dw0, dM, X, B, T,
                  C, k0, k1);
        GK_LAUNCH(naive_dx_kernel, gk_blocks((long)B * T * C, EW_THREADS), EW_THREADS, 0, s, dX, dM, w0, B, T, C, k0,
                  k1);
    }
}

extern "C" void gk_cca_conv_backward(GkStream s, float *dX, float *dw0, float *db0, float *dw1, float *db1, float *dM,
                                     const float *dY, const float *X, const float *M, const float *w0, const float *w1,
                                     int B, int T, int C, int dh, int k0, int k1) {
    conv_backward(s, false, dX, dw0, db0, dw1, db1, dM, dY, X, M, w0, w1, B, T, C, dh, k0, k1);
}
extern "C" void gk_cca_conv_backward_bf16(GkStream s, float *dX, float *dw0, float *db0, float *dw1, float *db1,
                                          float *dM, const float *dY, const float *X, const float *M, const float *w0,
                                          const float *w1, int B, int T, int C, int dh, int k0, int k1) {
    conv_backward(s, true, dX, dw0, db0, dw1, db1, dM, dY, X, M, w0, w1, B, T, C, dh, k0, k1);
}

extern "C" void gk_qk_mean_forward(GkStream s, float *query, float *key, const float *Y, const float *X, int rows,
                                   int Hq, int Hkv, int dh) {
    if (rows <= 0 || Hkv <= 0 || dh <= 0) return;
    dim3 grid((unsigned)((Hkv * dh + EW_THREADS - 1) / EW_THREADS), (unsigned)grid_y(rows));
    GK_LAUNCH_PDL(qk_mean_fwd_kernel, grid, EW_THREADS, 0, s, query, key, Y, X, rows, Hq, Hkv, dh);
}

extern "C" void gk_qk_mean_backward(GkStream s, float *dY, float *dX, const float *dquery, const float *dkey, int rows,
                                    int Hq, int Hkv, int dh) {
    if (rows <= 0 || Hkv <= 0 || dh <= 0) return;
    dim3 grid((unsigned)((Hkv * dh + EW_THREADS - 1) / EW_THREADS), (unsigned)grid_y(rows));
    GK_LAUNCH(qk_mean_bwd_kernel, grid, EW_THREADS, 0, s, dY, dX, dquery, dkey, rows, Hq, Hkv, dh);
}

extern "C" void gk_delayed_value_forward(GkStream s, float *value, const float *vc, const float *vd, int B, int T,
                                         int half) {
    const long rows = (long)B * T;
    if (rows <= 0 || half <= 0) return;
    dim3 grid((unsigned)((2 * half + EW_THREADS - 1) / EW_THREADS), (unsigned)grid_y(rows));
    GK_LAUNCH(delayed_value_fwd_kernel, grid, EW_THREADS, 0, s, value, vc, vd, rows, T, half);
}

extern "C" void gk_delayed_value_backward(GkStream s, float *dvc, float *dvd, const float *dvalue, int B, int T,
                                          int half) {
    const long rows = (long)B * T;
    if (rows <= 0 || half <= 0) return;
    dim3 grid((unsigned)((half + EW_THREADS - 1) / EW_THREADS), (unsigned)grid_y(rows));
    GK_LAUNCH(delayed_value_bwd_kernel, grid, EW_THREADS, 0, s, dvc, dvd, dvalue, rows, T, half);
}

extern "C" void gk_l2norm_rope_qk_forward(GkStream s, GkNormRopePart q, GkNormRopePart k, const float *cosv,
                                          const float *sinv, const int32_t *pos, int rows, int T, int dh, int rd,
                                          float scale, float eps) {
    const long q_items = q.y ? (long)rows * q.H : 0, items = q_items + (k.y ? (long)rows * k.H : 0);
    if (items <= 0 || dh <= 0) return;
    GK_LAUNCH_PDL(l2norm_rope_fwd_kernel, gk_blocks(items, NR_WARPS), NR_THREADS, 0, s, q, k, q_items, items, cosv,
                  sinv, T, dh, rd / 2, scale, eps, pos);
}

extern "C" void gk_l2norm_rope_forward(GkStream s, float *y, float *norm, const float *x, const float *temp,
                                       const float *cosv, const float *sinv, int rows, int T, int H, int dh, int rd,
                                       float scale, float eps) {
    gk_l2norm_rope_qk_forward(s, GkNormRopePart{y, norm, x, temp, H}, GkNormRopePart{}, cosv, sinv, nullptr, rows, T,
                              dh, rd, scale, eps);
}

extern "C" void gk_rope_l2norm_backward(GkStream s, float *dx, float *dtemp, float *dy, const float *x,
                                        const float *norm, const float *temp, const float *cosv, const float *sinv,
                                        int rows, int T, int H, int dh, int rd, float scale, float eps) {
    const long items = (long)rows * H;
    if (items <= 0 || dh <= 0) return;
    GK_LAUNCH(rope_l2norm_bwd_kernel, gk_blocks(items, NR_WARPS), NR_THREADS, 0, s, dx, dy, x, norm, temp, cosv, sinv,
              items, T, H, dh, rd / 2, scale, eps, dtemp != nullptr);
    if (dtemp) GK_LAUNCH(rope_dtemp_reduce_kernel, H, 1024, 0, s, dtemp, dy, rows, H, dh);
}

extern "C" void gk_rope_forward(GkStream s, float *x, const float *cosv, const float *sinv, int rows, int T, int H,
                                int dh, int rd) {
    const int half = rd / 2;
    if (rows <= 0 || H <= 0 || half <= 0) return;
    dim3 grid((unsigned)((H * half + EW_THREADS - 1) / EW_THREADS), (unsigned)grid_y(rows));
    GK_LAUNCH_PDL((rope_kernel<false>), grid, EW_THREADS, 0, s, x, cosv, sinv, rows, T, H, dh, half, nullptr);
}

extern "C" void gk_rope_forward_pos(GkStream s, float *x, const float *cosv, const float *sinv, const int32_t *pos,
                                    int rows, int H, int dh, int rd) {
    const int half = rd / 2;
    if (rows <= 0 || H <= 0 || half <= 0) return;
    dim3 grid((unsigned)((H * half + EW_THREADS - 1) / EW_THREADS), (unsigned)grid_y(rows));
    GK_LAUNCH_PDL((rope_kernel<false>), grid, EW_THREADS, 0, s, x, cosv, sinv, rows, 1, H, dh, half, pos);
}

extern "C" void gk_rope_backward(GkStream s, float *dx, const float *cosv, const float *sinv, int rows, int T, int H,
                                 int dh, int rd) {
    const int half = rd / 2;
    if (rows <= 0 || H <= 0 || half <= 0) return;
    dim3 grid((unsigned)((H * half + EW_THREADS - 1) / EW_THREADS), (unsigned)grid_y(rows));
    GK_LAUNCH_PDL((rope_kernel<true>), grid, EW_THREADS, 0, s, dx, cosv, sinv, rows, T, H, dh, half, nullptr);
}
