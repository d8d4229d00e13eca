/* gpu_attention_tc: causal GQA flash attention on the tensor cores, for bf16 runs (GpuCtx.bf16 / GpuModel.bf16),
 * with an optional sliding window (window > 0: query q sees keys q-window+1 .. q; 0 or >= T: plain causal).
 * The same layouts and semantics as gk_flash_attention_forward/backward_window (gpu_attention.cu, fp32 on the CUDA
 * cores, kept for fp32 runs): Q, O, dQ, dO [B*T, Hq*dh] (row = b*T + t), K, V, dK, dV [B*T, Hkv*dh], LSE [B, Hq, T];
 * query head h reads kv head h / (Hq/Hkv); scores scaled by 1/sqrt(dh); the backward ACCUMULATES (+=) into dQ,
 * dK, dV; deterministic (no atomics, fixed loop orders, every output element added once by one thread).
 *
 * Precision (FlashAttention-2 on bf16 tensors): the products S = Q Kᵀ, O = P V, dP = dO Vᵀ, dV = Pᵀ dO,
 * dK = dSᵀ Q, dQ = dS K run on the matrix units with bf16 operands and fp32 accumulation. Q, K, V, dO are rounded
 * to bf16 (nearest even, as zy_round_bf16); P (for P V and Pᵀ dO) and dS (for dSᵀ Q and dS K) are rounded to bf16
 * before their products. Everything else is fp32: the scores, the softmax statistics (running max, row sum, LSE),
 * the online rescaling, P itself where dS is formed, Dlt = rowsum(bf16(dO) ⊙ O) and every accumulator; inputs and
 * outputs stay fp32 in memory. So the result is the exact attention of the bf16-rounded Q, K, V, dO up to the
 * rounding of P and dS (8 significant bits: relative error <= 2^-8 per element) and fp32 summation order.
 *
 * Tensor cores through WMMA (16x16x16 bf16 fragments, fp32 accumulators) behind the tc:: wrapper below, no inline
 * PTX. The accumulator's element-to-(row, column) layout is unspecified by the API, so it is read at run time:
 * each warp loads an accumulator fragment from a table holding r*16 + c at (r, c) (AccMap), after which masking,
 * exponentials and the per-row rescaling are done in registers on any layout. Row reductions (the forward's max and
 * sum) go through shared memory in a known layout.
 *
 * Kernels, 4 warps (128 threads) a block, every warp owning 16 rows of the block's tile (its "rows" below):
 *   forward   one block per (b, h, 64 queries), longest first; key tiles of 64 from 0 to the diagonal (tiles above
 *             it are never visited; the diagonal one is masked, and key fragments wholly above a warp's rows are
 *             skipped in O += P V). Q, K, V tiles are converted fp32 -> bf16 while staged in shared memory (the
 *             forward has no scratch argument). S goes to a per-warp fp32 tile; two lanes a row (four on wave64)
 *             take the max / exp2 / sum (base 2, scores times log2 e) and write P as bf16 over it; O is rescaled
 *             in registers.
 *   backward  1. prep: bf16 copies of Q, K, V, dO in `work` and Dlt = rowsum(bf16(dO) ⊙ O) (fp32);
 *             2. one block per (b, kv head, 64 keys, split): dK, dV over the split's query heads of the group
 *                (outer loop) and the 32-query tiles from the diagonal on (inner), Sᵀ = K Qᵀ and dPᵀ = V dOᵀ
 *                recomputed, P from LSE; Pᵀ and dSᵀ formed in registers, staged as bf16 for dV += Pᵀ dO,
 *                dK += dSᵀ Q. Causal work falls from the first key tile (every query) to the last (its own), so with
 *                few blocks the step waits on the first tiles: the group's G query heads are split over S blocks
 *                (dkdv_splits: until there are ~1,024 blocks), each writing its own partial dK, dV in `work`, and
 *             2b. the partials are summed in split order into dK, dV (S = 1: the block adds straight into them);
 *             3. one block per (b, h, 64 queries), longest first: dQ over the 64-key tiles up to the diagonal.
 * Per kernel at dh 128 (dh 64), sm_90, from ptxas and the launch sizes; no spills on sm_80 or sm_90:
 *   forward  70.3 KB (46.3 KB) shared, 156 (122) registers: 3 (4) blocks an SM on an H100, 2 on an A100;
 *   dK/dV    62.3 KB (38.3 KB), 246 (162) registers: 2 (3) blocks an SM;
 *   dQ       78.0 KB (46.0 KB), 252 (212) registers: 2 blocks an SM.
 * A window skips the key tiles wholly before a block's first query's window (forward, dQ) and the query tiles past
 * a key tile's last key's window (dK/dV), and within a tile the fragments wholly outside a warp's rows' windows; the
 * window's start is masked like the diagonal (a row may see none of a warp's first tiles: its running max stays -inf).
 * Written without a GPU: checked on the emulator (tests/gpu/emu) against the double reference.
 * Head sizes 64 and 128 (a template on dh); any other dh, or a device that refuses the shared memory, falls back
 * to the fp32 kernels. `make test` runs this source on the CPU (tests/gpu/emu: a thread per CUDA thread, a WMMA with a
 * pseudo-random fragment layout, ThreadSanitizer) against a double-precision reference; tests/gpu/test_gpu_attention.c
 * is the on-device check. */
#include <math.h>
#include <stdint.h>

#include "gpu_common.cuh"
#include "gpu_kernels.h"

#include "gpu_tc.cuh" /* tc::, the matrix-unit wrapper every tensor-core use goes through */

namespace {

constexpr int WL = GPU_WARP;  /* lanes per warp */
constexpr int LPR = WL / 16;  /* lanes per row when a warp walks its 16 rows in shared memory */
constexpr int NW = 4;         /* warps per block */
constexpr int NT = NW * WL;   /* threads per block */
constexpr int ROWS = 16 * NW; /* rows of a block's tile (queries, or keys in the dK/dV kernel) */
constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.6931471805599453f;
constexpr int MAP_BYTES = 256 * 4; /* the layout table */

/* fp32 -> bf16 bits, nearest even (as zy_f32_to_bf16 for finite values). */
__device__ __forceinline__ uint32_t bf16x2(float lo, float hi) {
#if defined(ZAYA_HIP) || defined(ZAYA_GPU_EMU)
    return (__float_as_uint(gk_bf16_round(lo)) >> 16) | (__float_as_uint(gk_bf16_round(hi)) & 0xffff0000u);
#else
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return (uint32_t)__bfloat16_as_ushort(v.x) | ((uint32_t)__bfloat16_as_ushort(v.y) << 16);
#endif
}
__device__ __forceinline__ uint16_t bf16_bits(float x) {
#if defined(ZAYA_HIP) || defined(ZAYA_GPU_EMU)
    return (uint16_t)(__float_as_uint(gk_bf16_round(x)) >> 16);
#else
    return __bfloat16_as_ushort(__float2bfloat16_rn(x));
#endif
}

/* Over the LPR lanes of a row: a fixed butterfly, every lane ends with the same bits. */
__device__ __forceinline__ float row_max(float v) { return lane_group_max<LPR>(v); }
__device__ __forceinline__ float row_sum(float v) { return lane_group_sum<LPR>(v); }

/* The accumulator layout: element i of this lane's part of a 16 x 16 accumulator is (rc[i] >> 4, rc[i] & 15).
 * tab: 256 floats holding 0..255 in shared memory (every thread done writing it). */
struct AccMap {
    int rc[tc::CN];
    __device__ __forceinline__ int row(int i) const { return rc[i] >> 4; }
    __device__ __forceinline__ int col(int i) const { return rc[i] & 15; }
};
__device__ __forceinline__ void acc_map(AccMap &m, const float *tab) {
    tc::C f;
    tc::load(f, tab, 16);
#pragma unroll
    for (int i = 0; i < tc::CN; i++) m.rc[i] = (int)f.x[i];
}
__device__ __forceinline__ void fill_map_table(float *tab) {
    for (int i = threadIdx.x; i < 256; i += NT) tab[i] = (float)i;
}

/* Tiles in shared memory: R rows of D bf16 with row stride D + 8 (16 bytes of padding: consecutive rows start 4
 * banks apart, so fragment loads of 8 rows x 16 bytes hit every bank once). */
template <int D>
struct Tile {
    static constexpr int LD = D + 8;
    static constexpr size_t bytes(int rows) { return (size_t)rows * LD * 2; }
};

/* Rows [0, R) of two fp32 [*, D] slices (row stride ld floats) into bf16 tiles, rows >= nvalid zero. vec: 16-byte
 * aligned rows (float4 loads, D/4 consecutive threads a row). All loads of a thread are issued before its stores. */
template <int D, int R>
__device__ __forceinline__ void load_cvt2(uint16_t *s0, uint16_t *s1, const float *__restrict__ g0,
                                          const float *__restrict__ g1, long ld, int nvalid, bool vec) {
    constexpr int G = D / 4, LD = Tile<D>::LD, N = R * G / NT;
    static_assert(R * G % NT == 0, "tile load split");
#pragma unroll 4 /* 8 float4 loads in flight a thread (8 spills under the 3-block cap) */
    for (int k = 0; k < N; k++) {
        const int i = threadIdx.x + k * NT, r = i / G, c = (i % G) * 4;
        float4 a = make_float4(0.f, 0.f, 0.f, 0.f), b = a;
        if (r < nvalid) {
            const float *p0 = g0 + (long)r * ld + c, *p1 = g1 + (long)r * ld + c;
            if (vec) {
                a = *reinterpret_cast<const float4 *>(p0);
                b = *reinterpret_cast<const float4 *>(p1);
            } else {
                a = make_float4(p0[0], p0[1], p0[2], p0[3]);
                b = make_float4(p1[0], p1[1], p1[2], p1[3]);
            }
        }
        *reinterpret_cast<uint2 *>(s0 + r * LD + c) = make_uint2(bf16x2(a.x, a.y), bf16x2(a.z, a.w));
        *reinterpret_cast<uint2 *>(s1 + r * LD + c) = make_uint2(bf16x2(b.x, b.y), bf16x2(b.z, b.w));
    }
}
template <int D, int R>
__device__ __forceinline__ void load_cvt(uint16_t *s, const float *__restrict__ g, long ld, int nvalid, bool vec) {
    constexpr int G = D / 4, LD = Tile<D>::LD, N = R * G / NT;
    static_assert(R * G % NT == 0, "tile load split");
#pragma unroll 4
    for (int k = 0; k < N; k++) {
        const int i = threadIdx.x + k * NT, r = i / G, c = (i % G) * 4;
        float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
        if (r < nvalid) {
            const float *p = g + (long)r * ld + c;
            a = vec ? *reinterpret_cast<const float4 *>(p) : make_float4(p[0], p[1], p[2], p[3]);
        }
        *reinterpret_cast<uint2 *>(s + r * LD + c) = make_uint2(bf16x2(a.x, a.y), bf16x2(a.z, a.w));
    }
}
/* Rows [0, R) of two bf16 [*, D] slices (row stride ld elements, 16-byte aligned rows) into tiles, 16 bytes a
 * thread (D/8 consecutive threads a row); rows >= nvalid zero. */
template <int D, int R>
__device__ __forceinline__ void load_bf2(uint16_t *s0, uint16_t *s1, const uint16_t *__restrict__ g0,
                                         const uint16_t *__restrict__ g1, long ld, int nvalid) {
    constexpr int G = D / 8, LD = Tile<D>::LD, N = R * G / NT;
    static_assert(R * G % NT == 0, "tile load split");
#pragma unroll /* every load of the tile in flight at once */
    for (int k = 0; k < N; k++) {
        const int i = threadIdx.x + k * NT, r = i / G, c = (i % G) * 8;
        uint4 a = make_uint4(0u, 0u, 0u, 0u), b = a;
        if (r < nvalid) {
            a = *reinterpret_cast<const uint4 *>(g0 + (long)r * ld + c);
            b = *reinterpret_cast<const uint4 *>(g1 + (long)r * ld + c);
        }
        *reinterpret_cast<uint4 *>(s0 + r * LD + c) = a;
        *reinterpret_cast<uint4 *>(s1 + r * LD + c) = b;
    }
}

/* ---- forward ------------------------------------------------------------------------------------------------ */

/* Shared memory: layout table | Qs [ROWS][D+8], Ks, Vs [BC][D+8] bf16 | per warp Ss [16][BC+8] fp32 (scores; P
 * [16][BC+8] bf16 overwrites its first half once the warp's lanes have read the scores), al [16] fp32. */
template <int D, int BC>
struct Fwd {
    static constexpr int LD = Tile<D>::LD, LDS = BC + 8, LDP = BC + 8, KD = D / 16, NF = BC / 16;
    static constexpr int NG = BC / (4 * LPR); /* float4 groups of a row per lane */
    static constexpr size_t WS = (size_t)16 * LDS * 4 + 16 * 4;
    static constexpr size_t QB = Tile<D>::bytes(ROWS), KV = Tile<D>::bytes(BC);
    static constexpr size_t SMEM = MAP_BYTES + QB + 2 * KV + NW * WS;
    static_assert(QB % 32 == 0 && KV % 32 == 0 && WS % 32 == 0 && (16 * LDS * 4) % 32 == 0 && LDP * 2 <= LDS * 4,
                  "fragment pointers must stay 32-byte aligned");
    static_assert(BC % (4 * LPR) == 0 && BC % 16 == 0, "key tile");
};

template <int D, int BC>
__global__ void __launch_bounds__(NT, 3)
    tc_fwd_kernel(float *__restrict__ O, float *__restrict__ LSE, const float *__restrict__ Q,
                  const float *__restrict__ K, const float *__restrict__ V, int B, int T, int Hq, int Hkv, int nq,
                  float sl2, int vec, int window) {
#if TC_ARCH_OK
    using F = Fwd<D, BC>;
    constexpr int LD = F::LD, LDS = F::LDS, LDP = F::LDP, KD = F::KD, NF = F::NF, NG = F::NG;
    GK_DYNAMIC_SMEM(tc_smem);
    float *tab = reinterpret_cast<float *>(tc_smem);
    uint16_t *Qs = reinterpret_cast<uint16_t *>(tc_smem + MAP_BYTES), *Ks = Qs + ROWS * LD, *Vs = Ks + BC * LD;
    unsigned char *un = tc_smem + MAP_BYTES + F::QB + 2 * F::KV;
    const int warp = threadIdx.x / WL, lane = threadIdx.x % WL;
    float *Ss = reinterpret_cast<float *>(un + warp * F::WS);
    uint16_t *Ps = reinterpret_cast<uint16_t *>(Ss);
    float *al = reinterpret_cast<float *>(un + warp * F::WS + 16 * LDS * 4);

    /* the longest query tiles (most key tiles) first */
    const int BH = B * Hq, bh = (int)(blockIdx.x % BH), qb = nq - 1 - (int)(blockIdx.x / BH);
    const int b = bh / Hq, h = bh % Hq, j = h / (Hq / Hkv);
    const long ldq = (long)Hq * D, ldk = (long)Hkv * D;
    const int q0 = qb * ROWS, qn = min(ROWS, T - q0), kend = min(T, q0 + ROWS);
    const int wq0 = q0 + 16 * warp;                 /* the warp's first query */
    const int r = lane / LPR, sub = lane % LPR, q = wq0 + r; /* row mode: this lane's row */
    const long qoff = ((long)b * T + q0) * ldq + (long)h * D;

    fill_map_table(tab);
    load_cvt<D, ROWS>(Qs, Q + qoff, ldq, qn, vec);
    __syncthreads();
    AccMap mp;
    acc_map(mp, tab);
    tc::C o[KD];
#pragma unroll
    for (int f = 0; f < KD; f++) tc::zero(o[f]);
    float m = -INFINITY, l = 0.f; /* running max (base 2) and sum of row r; the same bits in its LPR lanes */

    /* a sliding window (window > 0: query q sees keys q-window+1 .. q): the key tiles wholly before the block's first
     * query's window are skipped */
    const int kbeg = window > 0 ? max(0, q0 - window + 1) / BC * BC : 0;
    for (int k0 = kbeg; k0 < kend; k0 += BC) {
        const long koff = ((long)b * T + k0) * ldk + (long)j * D;
        __syncthreads(); /* the previous tile's readers of Ks, Vs, Ss, Ps, al are done */
        load_cvt2<D, BC>(Ks, Vs, K + koff, V + koff, ldk, min(BC, T - k0), vec);
        __syncthreads();
        /* key fragments [kf0, nf): from the first holding a key in the window of the warp's first query to the last
         * holding a key <= the warp's last query */
        const int nf = wq0 + 15 < k0 ? 0 : min(NF, (wq0 + 15 - k0) / 16 + 1);
        const int kf0 = window > 0 ? min(NF, max(0, wq0 - window + 1 - k0) / 16) : 0;
        if (kf0 >= nf) continue; /* warp-uniform */
        /* S = Q Kᵀ (all NF fragments: independent accumulators; the masked ones are discarded below) */
        {
            tc::C s[NF];
#pragma unroll
            for (int f = 0; f < NF; f++) tc::zero(s[f]);
#pragma unroll 1
            for (int k = 0; k < KD; k++) {
                tc::A qa;
                tc::load(qa, Qs + 16 * warp * LD + 16 * k, LD);
#pragma unroll
                for (int f = 0; f < NF; f++) {
                    tc::Bt kb;
                    tc::load(kb, Ks + 16 * f * LD + 16 * k, LD);
                    tc::mma(s[f], qa, kb);
                }
            }
#pragma unroll
            for (int f = 0; f < NF; f++) tc::store(Ss + 16 * f, s[f], LDS);
        }
        gk_syncwarp();
        /* row mode: lane (r, sub) takes float4 groups sub, sub + LPR, ... of row r: scale, causal mask (also keys
         * past T, which sit above every valid query) and window mask, max, exp2, sum; P as bf16 */
        {
            float v[NG][4], mx = -INFINITY;
#pragma unroll
            for (int t = 0; t < NG; t++) {
                const int c = 4 * (sub + LPR * t);
                const float4 x = *reinterpret_cast<const float4 *>(Ss + r * LDS + c);
                const float xs[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    const int key = k0 + c + u;
                    v[t][u] = key > q || (window > 0 && key <= q - window) ? -INFINITY : xs[u] * sl2;
                    mx = fmaxf(mx, v[t][u]);
                }
            }
            mx = row_max(mx);
            gk_syncwarp(); /* every lane holds its scores: P may overwrite them */
            /* causal, key 0 is in every row and tile 0 is every warp's first, so mn is finite: alpha = 0 the first
             * time. A window can leave a row none of the warp's first tiles: its max stays -inf and is taken as 0
             * (P = 0, alpha = 0, no -inf - -inf) */
            const float mn = fmaxf(m, mx), mr = mn == -INFINITY ? 0.f : mn, alpha = exp2f(m - mr);
            float ps = 0.f;
#pragma unroll
            for (int t = 0; t < NG; t++) {
                const int c = 4 * (sub + LPR * t);
                float p[4];
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    p[u] = exp2f(v[t][u] - mr);
                    ps += p[u];
                }
                *reinterpret_cast<uint2 *>(Ps + r * LDP + c) = make_uint2(bf16x2(p[0], p[1]), bf16x2(p[2], p[3]));
            }
            ps = row_sum(ps);
            l = l * alpha + ps;
            m = mn;
            if (sub == 0) al[r] = alpha;
        }
        gk_syncwarp();
        /* O = alpha O + P V; P fragments before kf0 and from nf on are zero */
#pragma unroll
        for (int i = 0; i < tc::CN; i++) {
            const float a = al[mp.row(i)];
#pragma unroll
            for (int f = 0; f < KD; f++) o[f].x[i] *= a;
        }
#pragma unroll 1
        for (int kf = 0; kf < NF; kf++) {
            if (kf >= nf) break;
            if (kf < kf0) continue;
            tc::A pa;
            tc::load(pa, Ps + 16 * kf, LDP);
#pragma unroll
            for (int f = 0; f < KD; f++) {
                tc::B vb;
                tc::load(vb, Vs + 16 * kf * LD + 16 * f, LD);
                tc::mma(o[f], pa, vb);
            }
        }
    }
    /* O / l and LSE (natural log, as on the CPU) */
    gk_syncwarp(); /* every lane is done reading al */
    if (sub == 0) {
        al[r] = 1.0f / l;
        if (q < T) LSE[(long)bh * T + q] = m * LN2 + logf(l);
    }
    gk_syncwarp();
#pragma unroll
    for (int i = 0; i < tc::CN; i++) {
        const int qq = wq0 + mp.row(i);
        if (qq >= T) continue;
        const float inv = al[mp.row(i)];
        float *dst = O + ((long)b * T + qq) * ldq + (long)h * D + mp.col(i);
#pragma unroll
        for (int f = 0; f < KD; f++) dst[16 * f] = o[f].x[i] * inv;
    }
#endif
}

/* ---- backward ----------------------------------------------------------------------------------------------- */

/* dst = bf16(src), n floats (n % 4 == 0 when vec). */
__global__ void tc_cvt_kernel(uint16_t *__restrict__ dst, const float *__restrict__ src, long n, int vec) {
    const long stride = (long)gridDim.x * blockDim.x;
    if (vec) {
        const float4 *s4 = reinterpret_cast<const float4 *>(src);
        uint2 *d2 = reinterpret_cast<uint2 *>(dst);
        for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n / 4; i += stride) {
            const float4 v = s4[i];
            d2[i] = make_uint2(bf16x2(v.x, v.y), bf16x2(v.z, v.w));
        }
    } else {
        for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) dst[i] = bf16_bits(src[i]);
    }
}

/* One warp per (token, head) row of dh: dO16 = bf16(dO), Dlt[b, h, t] = Σ_d bf16(dO) · O in a fixed order (the
 * rowsum of P ⊙ dP for the dP the kernels form from bf16 dO). */
__global__ void tc_do_delta_kernel(uint16_t *__restrict__ dO16, float *__restrict__ Dlt, const float *__restrict__ dO,
                                   const float *__restrict__ O, int T, int Hq, int dh, long rows, int vec) {
    const int lane = threadIdx.x % WL;
    const long row = (long)blockIdx.x * (blockDim.x / WL) + threadIdx.x / WL;
    if (row >= rows) return; /* whole warps leave together */
    const float *a = dO + row * dh, *o = O + row * dh;
    uint16_t *d = dO16 + row * dh;
    float acc = 0.f;
    if (vec) {
        for (int c = 4 * lane; c < dh; c += 4 * WL) {
            const float4 x = *reinterpret_cast<const float4 *>(a + c), y = *reinterpret_cast<const float4 *>(o + c);
            const uint32_t lo = bf16x2(x.x, x.y), hi = bf16x2(x.z, x.w);
            *reinterpret_cast<uint2 *>(d + c) = make_uint2(lo, hi);
            acc = fmaf(__uint_as_float(lo << 16), y.x, acc);
            acc = fmaf(__uint_as_float(lo & 0xffff0000u), y.y, acc);
            acc = fmaf(__uint_as_float(hi << 16), y.z, acc);
            acc = fmaf(__uint_as_float(hi & 0xffff0000u), y.w, acc);
        }
    } else {
        for (int c = lane; c < dh; c += WL) {
            const uint16_t v = bf16_bits(a[c]);
            d[c] = v;
            acc = fmaf(__uint_as_float((uint32_t)v << 16), o[c], acc);
        }
    }
    acc = warp_sum(acc);
    if (lane == 0) {
        const long bt = row / Hq, bb = bt / T, t = bt % T;
        const int h = (int)(row % Hq);
        Dlt[(bb * Hq + h) * T + t] = acc;
    }
}

/* dK / dV: layout table | Ks, Vs [ROWS][D+8] | Qs, dOs [BQ][D+8] (bf16) | per warp Ps, dSs [16][BQ+8] (bf16) |
 * ls, dl [BQ] fp32 (LSE in base 2, Dlt of the query tile). */
template <int D, int BQ>
struct Dkv {
    static constexpr int LD = Tile<D>::LD, LDP = BQ + 8, KD = D / 16, NQF = BQ / 16;
    static constexpr size_t KV = Tile<D>::bytes(ROWS), QD = Tile<D>::bytes(BQ), WS = (size_t)2 * 16 * LDP * 2;
    static constexpr size_t SMEM = MAP_BYTES + 2 * KV + 2 * QD + NW * WS + 2 * (size_t)BQ * 4;
    static_assert(KV % 32 == 0 && QD % 32 == 0 && WS % 64 == 0 && BQ % 16 == 0 && ROWS % BQ == 0,
                  "fragment pointers must stay 32-byte aligned; query tiles must start at the key tile");
};

template <int D, int BQ>
__global__ void __launch_bounds__(NT, 2)
    tc_dkdv_kernel(float *__restrict__ dK, float *__restrict__ dV, float *__restrict__ dKp, float *__restrict__ dVp,
                   int S, const uint16_t *__restrict__ dO16,
                   const float *__restrict__ LSE, const float *__restrict__ Dlt, const uint16_t *__restrict__ Q16,
                   const uint16_t *__restrict__ K16, const uint16_t *__restrict__ V16, int B, int T, int Hq, int Hkv,
                   float sl2, float scale, int window) {
#if TC_ARCH_OK
    using F = Dkv<D, BQ>;
    constexpr int LD = F::LD, LDP = F::LDP, KD = F::KD, NQF = F::NQF;
    GK_DYNAMIC_SMEM(tc_smem);
    float *tab = reinterpret_cast<float *>(tc_smem);
    uint16_t *Ks = reinterpret_cast<uint16_t *>(tc_smem + MAP_BYTES), *Vs = Ks + ROWS * LD;
    uint16_t *Qs = Vs + ROWS * LD, *dOs = Qs + BQ * LD;
    const int warp = threadIdx.x / WL;
    uint16_t *Ps = dOs + BQ * LD + warp * 2 * 16 * LDP, *dSs = Ps + 16 * LDP;
    float *ls = reinterpret_cast<float *>(dOs + BQ * LD + NW * 2 * 16 * LDP), *dl = ls + BQ;

    /* the first key tile meets every query: the heaviest blocks first; then (b, kv head), then the split */
    const int BJS = B * Hkv * S, u = (int)(blockIdx.x % BJS), kb = (int)(blockIdx.x / BJS);
    const int bj = u / S, sp = u % S, b = bj / Hkv, j = bj % Hkv, G = Hq / Hkv, HS = G / S;
    const long ldq = (long)Hq * D, ldk = (long)Hkv * D;
    const int k0 = kb * ROWS, kn = min(ROWS, T - k0), wk0 = k0 + 16 * warp; /* the warp's first key */
    const long koff = ((long)b * T + k0) * ldk + (long)j * D;

    fill_map_table(tab);
    load_bf2<D, ROWS>(Ks, Vs, K16 + koff, V16 + koff, ldk, kn);
    __syncthreads();
    AccMap mp;
    acc_map(mp, tab);
    tc::C dk[KD], dv[KD];
#pragma unroll
    for (int f = 0; f < KD; f++) tc::zero(dk[f]), tc::zero(dv[f]);

    /* a sliding window: the tile's last key is seen by queries up to it + window - 1 */
    const int qend = window > 0 ? min(T, k0 + ROWS - 1 + window) : T;
    for (int h = j * G + sp * HS; h < j * G + (sp + 1) * HS; h++) {
        const long bh = (long)b * Hq + h;
        for (int q0 = k0; q0 < qend; q0 += BQ) {
            const int qn = min(BQ, T - q0);
            const long qoff = ((long)b * T + q0) * ldq + (long)h * D;
            __syncthreads(); /* the previous tile's readers of Qs, dOs, ls, dl, Ps, dSs are done */
            load_bf2<D, BQ>(Qs, dOs, Q16 + qoff, dO16 + qoff, ldq, qn);
            for (int i = threadIdx.x; i < BQ; i += NT) { /* queries past T: P = exp2(-inf) = 0 */
                ls[i] = i < qn ? LSE[bh * T + q0 + i] * LOG2E : INFINITY;
                dl[i] = i < qn ? Dlt[bh * T + q0 + i] : 0.f;
            }
            __syncthreads();
            /* query fragments [f0, f1) see a key of the warp: those before f0 end before its first key, those from
             * f1 on start after its last key's window */
            const int f0 = wk0 > q0 ? (wk0 - q0) / 16 : 0;
            const int qlast = wk0 + 15 + window - 1; /* the last query that sees a key of the warp */
            const int f1 = window == 0 ? NQF : qlast < q0 ? 0 : min(NQF, (qlast - q0) / 16 + 1);
            if (f0 >= f1) continue; /* warp-uniform */
            /* Sᵀ = K Qᵀ, dPᵀ = V dOᵀ for the warp's 16 keys x BQ queries */
            tc::C st[NQF], dpt[NQF];
#pragma unroll
            for (int f = 0; f < NQF; f++) tc::zero(st[f]), tc::zero(dpt[f]);
#pragma unroll 1
            for (int k = 0; k < KD; k++) {
                tc::A ka, va;
                tc::load(ka, Ks + 16 * warp * LD + 16 * k, LD);
                tc::load(va, Vs + 16 * warp * LD + 16 * k, LD);
#pragma unroll
                for (int f = 0; f < NQF; f++) {
                    tc::Bt qb, ob;
                    tc::load(qb, Qs + 16 * f * LD + 16 * k, LD);
                    tc::load(ob, dOs + 16 * f * LD + 16 * k, LD);
                    tc::mma(st[f], ka, qb);
                    tc::mma(dpt[f], va, ob);
                }
            }
            /* Pᵀ = exp2(Sᵀ·scale·log2 e − LSE₂[query]) (0 where key > query or key <= query - window), dSᵀ = Pᵀ
             * (dPᵀ − Dlt[query]) · scale */
#pragma unroll
            for (int f = 0; f < NQF; f++)
#pragma unroll
                for (int i = 0; i < tc::CN; i++) {
                    const int kr = mp.row(i), qc = 16 * f + mp.col(i), key = wk0 + kr, q = q0 + qc;
                    const float p = key > q || (window > 0 && key <= q - window) ? 0.f
                                                                                 : exp2f(st[f].x[i] * sl2 - ls[qc]);
                    const float ds = p * (dpt[f].x[i] - dl[qc]) * scale;
                    Ps[kr * LDP + qc] = bf16_bits(p);
                    dSs[kr * LDP + qc] = bf16_bits(ds);
                }
            gk_syncwarp();
            /* dV += Pᵀ dO, dK += dSᵀ Q over the query fragments [f0, f1) */
#pragma unroll 1
            for (int kq = 0; kq < NQF; kq++) {
                if (kq >= f1) break;
                if (kq < f0) continue;
                tc::A pa, sa;
                tc::load(pa, Ps + 16 * kq, LDP);
                tc::load(sa, dSs + 16 * kq, LDP);
#pragma unroll
                for (int f = 0; f < KD; f++) {
                    tc::B ob, qb;
                    tc::load(ob, dOs + 16 * kq * LD + 16 * f, LD);
                    tc::load(qb, Qs + 16 * kq * LD + 16 * f, LD);
                    tc::mma(dv[f], pa, ob);
                    tc::mma(dk[f], sa, qb);
                }
            }
        }
    }
    /* each element of the warp's 16 x D slices of dK, dV: one lane, one += (or, split, one store of the partial) */
    const long part = (long)sp * B * T * ldk;
#pragma unroll
    for (int i = 0; i < tc::CN; i++) {
        const int kk = wk0 + mp.row(i);
        if (kk >= T) continue;
        const long off = ((long)b * T + kk) * ldk + (long)j * D + mp.col(i);
#pragma unroll
        for (int f = 0; f < KD; f++) {
            if (S == 1) {
                dK[off + 16 * f] += dk[f].x[i];
                dV[off + 16 * f] += dv[f].x[i];
            } else {
                dKp[part + off + 16 * f] = dk[f].x[i];
                dVp[part + off + 16 * f] = dv[f].x[i];
            }
        }
    }
#endif
}

/* dK += Σ_s dKp[s], dV += Σ_s dVp[s] over the S partials of n values each, in split order. */
__global__ void tc_dkdv_sum_kernel(float *__restrict__ dK, float *__restrict__ dV, const float *__restrict__ dKp,
                                   const float *__restrict__ dVp, long n, int S) {
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        float k = dKp[i], v = dVp[i];
        for (int sp = 1; sp < S; sp++) k += dKp[sp * n + i], v += dVp[sp * n + i];
        dK[i] += k, dV[i] += v;
    }
}

/* dQ: layout table | Qs, dOs [ROWS][D+8] | Ks, Vs [BC][D+8] (bf16) | per warp dSs [16][BC+8] (bf16). */
template <int D, int BC>
struct Dq {
    static constexpr int LD = Tile<D>::LD, LDP = BC + 8, KD = D / 16, NF = BC / 16;
    static constexpr size_t QD = Tile<D>::bytes(ROWS), KV = Tile<D>::bytes(BC), WS = (size_t)16 * LDP * 2;
    static constexpr size_t SMEM = MAP_BYTES + 2 * QD + 2 * KV + NW * WS;
    static_assert(KV % 32 == 0 && QD % 32 == 0 && WS % 32 == 0 && BC % 16 == 0, "fragment alignment");
};

template <int D, int BC>
__global__ void __launch_bounds__(NT, 2)
    tc_dq_kernel(float *__restrict__ dQ, const uint16_t *__restrict__ dO16, const float *__restrict__ LSE,
                 const float *__restrict__ Dlt, const uint16_t *__restrict__ Q16, const uint16_t *__restrict__ K16,
                 const uint16_t *__restrict__ V16, int B, int T, int Hq, int Hkv, int nq, float sl2, float scale,
                 int window) {
#if TC_ARCH_OK
    using F = Dq<D, BC>;
    constexpr int LD = F::LD, LDP = F::LDP, KD = F::KD, NF = F::NF;
    GK_DYNAMIC_SMEM(tc_smem);
    float *tab = reinterpret_cast<float *>(tc_smem);
    uint16_t *Qs = reinterpret_cast<uint16_t *>(tc_smem + MAP_BYTES), *dOs = Qs + ROWS * LD;
    uint16_t *Ks = dOs + ROWS * LD, *Vs = Ks + BC * LD;
    const int warp = threadIdx.x / WL;
    uint16_t *dSs = Vs + BC * LD + warp * 16 * LDP;

    const int BH = B * Hq, bh = (int)(blockIdx.x % BH), qb = nq - 1 - (int)(blockIdx.x / BH);
    const int b = bh / Hq, h = bh % Hq, j = h / (Hq / Hkv);
    const long ldq = (long)Hq * D, ldk = (long)Hkv * D;
    const int q0 = qb * ROWS, qn = min(ROWS, T - q0), kend = min(T, q0 + ROWS), wq0 = q0 + 16 * warp;
    const long qoff = ((long)b * T + q0) * ldq + (long)h * D;

    fill_map_table(tab);
    load_bf2<D, ROWS>(Qs, dOs, Q16 + qoff, dO16 + qoff, ldq, qn);
    __syncthreads();
    AccMap mp;
    acc_map(mp, tab);
    /* the rows' LSE (base 2) and Dlt in registers, per accumulator element; queries past T get P = 0 */
    float lse2[tc::CN], dlt[tc::CN];
#pragma unroll
    for (int i = 0; i < tc::CN; i++) {
        const int qq = wq0 + mp.row(i);
        lse2[i] = qq < T ? LSE[(long)bh * T + qq] * LOG2E : INFINITY;
        dlt[i] = qq < T ? Dlt[(long)bh * T + qq] : 0.f;
    }
    tc::C dq[KD];
#pragma unroll
    for (int f = 0; f < KD; f++) tc::zero(dq[f]);

    const int kbeg = window > 0 ? max(0, q0 - window + 1) / BC * BC : 0; /* as in the forward */
    for (int k0 = kbeg; k0 < kend; k0 += BC) {
        const long koff = ((long)b * T + k0) * ldk + (long)j * D;
        __syncthreads(); /* the previous tile's readers of Ks, Vs, dSs are done */
        load_bf2<D, BC>(Ks, Vs, K16 + koff, V16 + koff, ldk, min(BC, T - k0));
        __syncthreads();
        const int nf = wq0 + 15 < k0 ? 0 : min(NF, (wq0 + 15 - k0) / 16 + 1);
        const int kf0 = window > 0 ? min(NF, max(0, wq0 - window + 1 - k0) / 16) : 0;
        if (kf0 >= nf) continue; /* warp-uniform */
        /* S = Q Kᵀ, dP = dO Vᵀ for the warp's 16 queries x BC keys */
        tc::C s[NF], dp[NF];
#pragma unroll
        for (int f = 0; f < NF; f++) tc::zero(s[f]), tc::zero(dp[f]);
#pragma unroll 1
        for (int k = 0; k < KD; k++) {
            tc::A qa, da;
            tc::load(qa, Qs + 16 * warp * LD + 16 * k, LD);
            tc::load(da, dOs + 16 * warp * LD + 16 * k, LD);
#pragma unroll
            for (int f = 0; f < NF; f++) {
                tc::Bt kb, vb;
                tc::load(kb, Ks + 16 * f * LD + 16 * k, LD);
                tc::load(vb, Vs + 16 * f * LD + 16 * k, LD);
                tc::mma(s[f], qa, kb);
                tc::mma(dp[f], da, vb);
            }
        }
        /* dS = P (dP − Dlt) · scale, P = exp2(S·scale·log2 e − LSE₂) (0 where key > query or key <= query - window) */
#pragma unroll
        for (int f = 0; f < NF; f++)
#pragma unroll
            for (int i = 0; i < tc::CN; i++) {
                const int qr = mp.row(i), kc = 16 * f + mp.col(i), key = k0 + kc, q = wq0 + qr;
                const float p = key > q || (window > 0 && key <= q - window) ? 0.f
                                                                             : exp2f(s[f].x[i] * sl2 - lse2[i]);
                dSs[qr * LDP + kc] = bf16_bits(p * (dp[f].x[i] - dlt[i]) * scale);
            }
        gk_syncwarp();
        /* dQ += dS K over the key fragments [kf0, nf) (the rest of dS is zero) */
#pragma unroll 1
        for (int kf = 0; kf < NF; kf++) {
            if (kf >= nf) break;
            if (kf < kf0) continue;
            tc::A sa;
            tc::load(sa, dSs + 16 * kf, LDP);
#pragma unroll
            for (int f = 0; f < KD; f++) {
                tc::B kb;
                tc::load(kb, Ks + 16 * kf * LD + 16 * f, LD);
                tc::mma(dq[f], sa, kb);
            }
        }
    }
#pragma unroll
    for (int i = 0; i < tc::CN; i++) {
        const int qq = wq0 + mp.row(i);
        if (qq >= T) continue;
        float *dst = dQ + ((long)b * T + qq) * ldq + (long)h * D + mp.col(i);
#pragma unroll
        for (int f = 0; f < KD; f++) dst[16 * f] += dq[f].x[i];
    }
#endif
}

/* ---- launchers ---------------------------------------------------------------------------------------------- */

constexpr int FWD_BC = 64; /* forward key tile */
constexpr int DKV_BQ = 32; /* dK/dV query tile (64 doubles the registers the transposed scores need) */
constexpr int DQ_BC = 64;  /* dQ key tile */

/* Above 48 KB of dynamic shared memory needs the opt-in (per device, so set at every launch); false when the
 * device refuses (too little shared memory): the caller falls back to the fp32 kernels. */
template <class Kern>
inline bool allow_smem(Kern *kernel, size_t bytes) {
    if (gpuFuncSetAttribute((const void *)kernel, gpuFuncAttributeMaxDynamicSharedMemorySize, (int)bytes) ==
        gpuSuccess)
        return true;
#ifndef ZAYA_GPU_EMU
    (void)gpuGetLastError(); /* clear it: the fallback runs instead */
#endif
    return false;
}

inline bool bad_shape(int B, int T, int Hq, int Hkv, int dh) {
    return B <= 0 || T <= 0 || Hq <= 0 || Hkv <= 0 || Hq % Hkv != 0 || dh <= 0 || dh > 256;
}
inline bool tc_head(int dh) { return dh == 64 || dh == 128; }

template <int D>
bool tc_forward(gpuStream_t s, float *O, float *LSE, const float *Q, const float *K, const float *V, int B, int T,
                int Hq, int Hkv, int window) {
    const size_t bytes = Fwd<D, FWD_BC>::SMEM;
    if (!allow_smem(tc_fwd_kernel<D, FWD_BC>, bytes)) return false;
    const int nq = (T + ROWS - 1) / ROWS;
    const float sl2 = (float)(1.0 / sqrt((double)D)) * LOG2E;
    const int vec = aligned16(Q) && aligned16(K) && aligned16(V);
    auto *k = tc_fwd_kernel<D, FWD_BC>;
    GK_LAUNCH(k, (unsigned)((long)nq * B * Hq), NT, bytes, s, O, LSE, Q, K, V, B, T, Hq, Hkv, nq, sl2, vec, window);
    return true;
}

/* How many blocks share a group's query heads in the dK/dV kernel: the smallest divisor S of G = Hq / Hkv that gives
 * ~1,024 blocks (a few waves on any GPU: the causal imbalance then averages out), G if none does. Shapes only, so the
 * work size and the launch agree. */
inline int dkdv_splits(int B, int T, int Hq, int Hkv) {
    const int G = Hq / Hkv;
    const long blocks = (long)(T + ROWS - 1) / ROWS * B * Hkv;
    for (int S = 1; S < G; S++)
        if (G % S == 0 && blocks * S >= 1024) return S;
    return G;
}

/* `work`, in floats: Dlt [B*Hq*T] | Q16 | dO16 [B*T*Hq*D bf16] | K16 | V16 [B*T*Hkv*D bf16] | with S > 1 splits, the
 * partial dK, dV [S][B*T*Hkv*D] each; every part starts on a 256-byte boundary (given an aligned `work`). */
inline long round64(long n) { return (n + 63) / 64 * 64; }
struct WorkParts {
    long dlt, q16, k16, part; /* floats taken by Dlt, by Q16 (= dO16), by K16 (= V16), by the dK (= dV) partials */
    int splits;
    long total() const { return dlt + 2 * q16 + 2 * k16 + 2 * part; }
};
inline WorkParts work_parts(int B, int T, int Hq, int Hkv, int dh) {
    const long nq = (long)B * T * Hq * dh, nk = (long)B * T * Hkv * dh;
    const int S = dkdv_splits(B, T, Hq, Hkv);
    return WorkParts{round64((long)B * Hq * T), round64((nq + 1) / 2), round64((nk + 1) / 2),
                     S > 1 ? round64((long)S * nk) : 0, S};
}

template <int D>
bool tc_backward(gpuStream_t s, float *dQ, float *dK, float *dV, const float *dO, const float *O, const float *LSE,
                 const float *Q, const float *K, const float *V, int B, int T, int Hq, int Hkv, float *work,
                 int window) {
    const size_t b1 = Dkv<D, DKV_BQ>::SMEM, b2 = Dq<D, DQ_BC>::SMEM;
    if (!aligned16(work) || !allow_smem(tc_dkdv_kernel<D, DKV_BQ>, b1) || !allow_smem(tc_dq_kernel<D, DQ_BC>, b2))
        return false;
    const WorkParts wp = work_parts(B, T, Hq, Hkv, D);
    float *Dlt = work;
    uint16_t *Q16 = reinterpret_cast<uint16_t *>(work + wp.dlt);
    uint16_t *dO16 = reinterpret_cast<uint16_t *>(work + wp.dlt + wp.q16);
    uint16_t *K16 = reinterpret_cast<uint16_t *>(work + wp.dlt + 2 * wp.q16);
    uint16_t *V16 = reinterpret_cast<uint16_t *>(work + wp.dlt + 2 * wp.q16 + wp.k16);
    float *dKp = work + wp.dlt + 2 * wp.q16 + 2 * wp.k16, *dVp = dKp + wp.part; /* S > 1 only */
    const long nq = (long)B * T * Hq * D, nk = (long)B * T * Hkv * D, rows = (long)B * T * Hq;
    /* 1. bf16 copies (whole rows of D % 64 == 0 values: float4s whenever the base is aligned) and Dlt */
    GK_LAUNCH(tc_cvt_kernel, gk_blocks(nq / 4, 256), 256, 0, s, Q16, Q, nq, aligned16(Q));
    GK_LAUNCH(tc_cvt_kernel, gk_blocks(nk / 4, 256), 256, 0, s, K16, K, nk, aligned16(K));
    GK_LAUNCH(tc_cvt_kernel, gk_blocks(nk / 4, 256), 256, 0, s, V16, V, nk, aligned16(V));
    const int per_block = 256 / WL;
    GK_LAUNCH(tc_do_delta_kernel, (unsigned)((rows + per_block - 1) / per_block), 256, 0, s, dO16, Dlt, dO, O, T, Hq,
              D, rows, aligned16(dO) && aligned16(O));
    /* 2. dK, dV (2b. the splits' partials summed); 3. dQ */
    const float scale = (float)(1.0 / sqrt((double)D)), sl2 = scale * LOG2E;
    const int nkt = (T + ROWS - 1) / ROWS, nqt = (T + ROWS - 1) / ROWS;
    auto *kdkv = tc_dkdv_kernel<D, DKV_BQ>;
    const int S = wp.splits;
    GK_LAUNCH(kdkv, (unsigned)((long)nkt * B * Hkv * S), NT, b1, s, dK, dV, dKp, dVp, S, dO16, LSE, Dlt, Q16, K16, V16,
              B, T, Hq, Hkv, sl2, scale, window);
    if (S > 1)
        GK_LAUNCH(tc_dkdv_sum_kernel, gk_blocks(nk, 256), 256, 0, s, dK, dV, dKp, dVp, nk, S);
    auto *kdq = tc_dq_kernel<D, DQ_BC>;
    GK_LAUNCH(kdq, (unsigned)((long)nqt * B * Hq), NT, b2, s, dQ, dO16, LSE, Dlt, Q16, K16, V16, B, T, Hq, Hkv, nqt,
              sl2, scale, window);
    return true;
}

} // namespace

extern "C" long gk_flash_attention_bf16_work_floats(int B, int T, int Hq, int Hkv, int dh) {
    const long fp32 = gk_flash_attention_work_floats(B, T, Hq); /* what the fallback needs */
    if (bad_shape(B, T, Hq, Hkv, dh) || !tc_head(dh)) return fp32;
    const long w = work_parts(B, T, Hq, Hkv, dh).total();
    return w > fp32 ? w : fp32;
}

extern "C" void gk_flash_attention_forward_bf16(GkStream s, float *O, float *LSE, const float *Q, const float *K,
                                                const float *V, int B, int T, int Hq, int Hkv, int dh, int window) {
    if (bad_shape(B, T, Hq, Hkv, dh)) return;
    if (window < 0 || window >= T) window = 0; /* as the fp32 kernels: a window of T or more is plain causal */
    bool done = false;
    if (dh == 64)
        done = tc_forward<64>(s, O, LSE, Q, K, V, B, T, Hq, Hkv, window);
    else if (dh == 128)
        done = tc_forward<128>(s, O, LSE, Q, K, V, B, T, Hq, Hkv, window);
    if (!done) gk_flash_attention_forward_window(s, O, LSE, Q, K, V, B, T, Hq, Hkv, dh, window);
    GK_LAUNCH_CHECK();
}

extern "C" void gk_flash_attention_backward_bf16(GkStream s, float *dQ, float *dK, float *dV, const float *dO,
                                                 const float *O, const float *LSE, const float *Q, const float *K,
                                                 const float *V, int B, int T, int Hq, int Hkv, int dh, float *work,
                                                 int window) {
    if (bad_shape(B, T, Hq, Hkv, dh)) return;
    if (window < 0 || window >= T) window = 0; /* (and k0 + ROWS - 1 + window cannot overflow) */
    bool done = false;
    if (dh == 64)
        done = tc_backward<64>(s, dQ, dK, dV, dO, O, LSE, Q, K, V, B, T, Hq, Hkv, work, window);
    else if (dh == 128)
        done = tc_backward<128>(s, dQ, dK, dV, dO, O, LSE, Q, K, V, B, T, Hq, Hkv, work, window);
    if (!done) gk_flash_attention_backward_window(s, dQ, dK, dV, dO, O, LSE, Q, K, V, B, T, Hq, Hkv, dh, work, window);
    GK_LAUNCH_CHECK();
}

#ifndef ZAYA_CUDNN /* built without the cuDNN headers (and in the HIP build and the CPU emulator): the own kernels only */
extern "C" int gk_cudnn_attention_available(void) { return 0; }
extern "C" const char *gk_cudnn_attention_status(void) {
    return "this build has no cuDNN attention (the Makefile found no cudnn-frontend / cuDNN headers)";
}
extern "C" int gk_cudnn_attention_plan(int, int, int, int, int, int) { return 0; }
extern "C" int gk_cudnn_attention_forward(GkStream, float *, float *, const float *, const float *, const float *, int,
                                          int, int, int, int, int) {
    return -1;
}
extern "C" int gk_cudnn_attention_backward(GkStream, float *, float *, float *, const float *, const float *,
                                           const float *, const float *, const float *, const float *, int, int, int,
                                           int, int, int) {
    return -1;
}
#endif
