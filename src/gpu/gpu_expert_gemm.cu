/* gpu_expert_gemm: the experts' products as grouped GEMMs on the tensor cores, sized on the device.
 *
 * Why: dropless top-1 routing gives every expert a different row count each step. One cuBLASLt product per expert
 * needs the counts on the host (a wait per layer and pass) and costs a launch and a plan lookup per expert and
 * product (~1,700 a step at bench-gpu). Here each product is one launch over all experts: every block reads the
 * expert offsets (gk_group_by_expert's E + 1 integers) on the device and finds its expert and tile, so nothing waits
 * on the host and the launch sizes depend only on the batch (max_rows) and the expert count.
 *
 * Operands are bf16 bits (the op16 copies and the weights' bf16 view), accumulation and output fp32, as gpu_gemm's bf16
 * products: the same values up to the fp32 summation order. Deterministic: each output element is summed by one
 * thread in a fixed k order, no atomics.
 *
 * Tiles: 128 x 128 outputs a block, k in steps of 32, 8 warps as 2 x 4, each warp 64 x 32 (4 x 2 WMMA 16 x 16
 * fragments). Global tiles are read into registers (16-byte loads when rows and bases allow, else element by element
 * with bounds), stored to shared memory (rows padded by 8 bf16) and the next tile's loads are in flight during the
 * products. The epilogue goes through a per-warp 16 x 16 fp32 scratch, so edges, beta and any accumulator layout are
 * handled by plain per-element stores.
 *
 * The 16-byte path's default form (gk_expert_kernel: GK_EXPERT_ASYNC) copies the tiles with cp.async straight into
 * a ring of XSTAGES shared tiles instead: no registers stage the data, the copies of the next two k-steps are in
 * flight during the products, and one barrier a k-step instead of two. Same fragments, same k order: the same bits
 * as the staged form. On an H200 (2026-11-29, bench gemm's expert probe at bench-gpu's shapes) 95.2 TFLOP/s against
 * the staged form's 82.1 (per-expert cuBLASLt products: 165.7), and a bench-gpu MoE layer's experts 32.3 ms a step
 * against 37.0.
 *
 * On an sm_90 GPU the default form is neither: gk_expert_mm_sm90 (gpu_expert_gemm_sm90.cu, CUTLASS's wgmma + TMA
 * grouped GEMM) runs the same products where it can, and these kernels where it cannot (other GPUs, other shapes).
 *
 * The same source runs on the CPU in `make test` (tests/gpu/emu: a thread per CUDA thread, a reference WMMA), so the
 * tiling, bounds and expert lookup are checked without a GPU; tests/gpu/test_gpu_gemm.c checks it on the device. */
#include "gpu_common.cuh"
#include "gpu_kernels.h"
#include "gpu_tc.cuh"

namespace {

constexpr int XBM = 128, XBN = 128, XBK = 32, XPAD = 8;
constexpr int XWM = 2, XWN = 4, XWARPS = XWM * XWN, XNT = XWARPS * GPU_WARP;
constexpr int XFM = XBM / (16 * XWM), XFN = XBN / (16 * XWN); /* fragments a warp: 4 x 2 */

/* How an operand lies in global memory, with i its non-reduced index (a row of C, or a column) and k the reduced one:
 * IK: element (i, k) at p[i * ld + k] (k contiguous); KI: at p[k * ld + i] (i contiguous). Shared tiles keep the
 * same orientation: IK as [I][XBK + XPAD], KI as [XBK][I + XPAD]. */
enum { IK = 0, KI = 1 };

template <int L, int I>
struct Smem {
    static constexpr int rows = L == IK ? I : XBK, cols = L == IK ? XBK : I, ld = cols + XPAD;
    __device__ static int at(int i, int k) { return L == IK ? i * ld + k : k * ld + i; }
};

/* One operand's share of a tile: global -> registers (load), registers -> shared (store). VEC: 16-byte loads of 8
 * consecutive elements (the launcher checks: contiguous extent, ld and base multiples of 8 elements). */
template <int L, int I, bool VEC>
struct Stage {
    using S = Smem<L, I>;
    static constexpr int PER = S::rows * S::cols / XNT; /* elements a thread */
    static constexpr int NV = VEC ? PER / 8 : PER;       /* loads a thread */
    static constexpr int CV = VEC ? S::cols / 8 : S::cols;
    static_assert(S::rows * S::cols % (XNT * 8) == 0, "tile split");
    uint4 v[VEC ? NV : 1];
    uint16_t e[VEC ? 1 : PER];

    /* elements (i, k) of i in [i0, i_end), k in [k0, k_end); the rest zero */
    __device__ __forceinline__ void load(const uint16_t *p, long ld, int i0, int i_end, int k0, int k_end) {
#pragma unroll
        for (int q = 0; q < NV; q++) {
            const int idx = q * XNT + (int)threadIdx.x, r = idx / CV, c = (idx % CV) * (VEC ? 8 : 1);
            const int i = i0 + (L == IK ? r : c), k = k0 + (L == IK ? c : r);
            const bool ok = i < i_end && k < k_end;
            const long o = L == IK ? (long)i * ld + k : (long)k * ld + i;
            if (VEC)
                v[q] = ok ? *reinterpret_cast<const uint4 *>(p + o) : make_uint4(0u, 0u, 0u, 0u);
            else
                e[q] = ok ? p[o] : (uint16_t)0;
        }
    }
    __device__ __forceinline__ void store(uint16_t *s) const {
#pragma unroll
        for (int q = 0; q < NV; q++) {
            const int idx = q * XNT + (int)threadIdx.x, r = idx / CV, c = (idx % CV) * (VEC ? 8 : 1);
            if (VEC)
                *reinterpret_cast<uint4 *>(s + r * S::ld + c) = v[q];
            else
                s[r * S::ld + c] = e[q];
        }
    }
};

/* The fragment types for an operand orientation: the product reads A as [m x k] and B as [k x n]. */
template <int L> struct FragA;
template <> struct FragA<IK> { using T = tc::A; };  /* A(m, k) at s[m * ld + k]: row-major */
template <> struct FragA<KI> { using T = tc::At; }; /* at s[k * ld + m]: column-major */
template <int L> struct FragB;
template <> struct FragB<IK> { using T = tc::Bt; }; /* B(k, n) at s[n * ld + k]: column-major */
template <> struct FragB<KI> { using T = tc::B; };  /* at s[k * ld + n]: row-major */

/* bf16 elements of one operand's shared tile, either orientation (XBM = XBN) */
constexpr int XTILE = XBK * (XBM + XPAD) > XBM * (XBK + XPAD) ? XBK * (XBM + XPAD) : XBM * (XBK + XPAD);
static_assert(XBM == XBN, "one tile size for both operands");
typedef float Scratch[256]; /* a warp's epilogue scratch: one 16 x 16 fp32 fragment */

struct Shared {
    alignas(128) uint16_t a[XTILE];
    alignas(128) uint16_t b[XTILE];
    alignas(128) Scratch c[XWARPS];
};

__device__ __forceinline__ void zero_acc(tc::C (&acc)[XFM][XFN]) {
#pragma unroll
    for (int i = 0; i < XFM; i++)
#pragma unroll
        for (int j = 0; j < XFN; j++) tc::zero(acc[i][j]);
}

/* acc += this warp's share of one k-step: the shared tiles sa (A) and sb (B), in 16-deep fragments, k ascending. */
template <int LA, int LB>
__device__ __forceinline__ void warp_tile_mma(tc::C (&acc)[XFM][XFN], const uint16_t *sa, const uint16_t *sb) {
    using SA = Smem<LA, XBM>;
    using SB = Smem<LB, XBN>;
    const int warp = (int)threadIdx.x / GPU_WARP, wm = warp / XWN, wn = warp % XWN;
#pragma unroll
    for (int kk = 0; kk < XBK; kk += 16) {
        typename FragA<LA>::T fa[XFM];
        typename FragB<LB>::T fb[XFN];
#pragma unroll
        for (int i = 0; i < XFM; i++) tc::load(fa[i], sa + SA::at((wm * XFM + i) * 16, kk), SA::ld);
#pragma unroll
        for (int j = 0; j < XFN; j++) tc::load(fb[j], sb + SB::at((wn * XFN + j) * 16, kk), SB::ld);
#pragma unroll
        for (int i = 0; i < XFM; i++)
#pragma unroll
            for (int j = 0; j < XFN; j++) tc::mma(acc[i][j], fa[i], fb[j]);
    }
}

/* acc (this warp's 64 x 32 of the block's tile) = Σ_k A(m, k) B(k, n) over k in [k_beg, k_end), for m in [m0, m_end)
 * and n in [n0, n_end) (outside: zero). A's i is m, B's i is n. */
template <int LA, int LB, bool VEC>
__device__ __forceinline__ void tile_product(tc::C (&acc)[XFM][XFN], Shared &sh, const uint16_t *A, long lda, int m0,
                                             int m_end, const uint16_t *B, long ldb, int n0, int n_end, int k_beg,
                                             int k_end) {
    zero_acc(acc);
    Stage<LA, XBM, VEC> sa;
    Stage<LB, XBN, VEC> sb;
    if (k_beg < k_end) {
        sa.load(A, lda, m0, m_end, k_beg, k_end);
        sb.load(B, ldb, n0, n_end, k_beg, k_end);
    }
    for (int k0 = k_beg; k0 < k_end; k0 += XBK) {
        __syncthreads(); /* every warp is done reading the previous tile */
        sa.store(sh.a);
        sb.store(sh.b);
        __syncthreads();
        if (k0 + XBK < k_end) { /* the next tile's loads overlap this tile's products */
            sa.load(A, lda, m0, m_end, k0 + XBK, k_end);
            sb.load(B, ldb, n0, n_end, k0 + XBK, k_end);
        }
        warp_tile_mma<LA, LB>(acc, sh.a, sh.b);
    }
}

/* The async form: the ring of XSTAGES (A, B) shared tiles, then the warps' scratch; dynamic shared memory. */
constexpr int XSTAGES = 3;
constexpr size_t XASYNC_SMEM = (size_t)XSTAGES * 2 * XTILE * sizeof(uint16_t) + XWARPS * sizeof(Scratch);

/* Issues this thread's 16-byte copies of one operand's tile (elements (i, k), i in [i0, i_end), k in [k0, k_end); the
 * rest zero) into s, laid out as Stage::store lays it. */
template <int L, int I>
__device__ __forceinline__ void issue_tile(uint16_t *s, const uint16_t *p, long ld, int i0, int i_end, int k0,
                                           int k_end) {
    using S = Smem<L, I>;
    constexpr int CV = S::cols / 8, NV = S::rows * S::cols / (XNT * 8);
#pragma unroll
    for (int q = 0; q < NV; q++) {
        const int idx = q * XNT + (int)threadIdx.x, r = idx / CV, c = (idx % CV) * 8;
        const int i = i0 + (L == IK ? r : c), k = k0 + (L == IK ? c : r);
        const bool ok = i < i_end && k < k_end;
        const long o = L == IK ? (long)i * ld + k : (long)k * ld + i;
        gk_copy16_async(s + r * S::ld + c, ok ? p + o : p, ok);
    }
}

/* tile_product's 16-byte path with cp.async into the ring (ring: XSTAGES x (A tile, B tile)). Tile t lands in slot
 * t % XSTAGES; at step t the thread waits for its copies of tile t, the barrier makes everyone's visible and also
 * says every warp is done with tile t - 1, whose slot the copies of tile t + XSTAGES - 1 then overwrite. Every
 * step commits a group (empty near the end), so "at most XSTAGES - 2 groups in flight" always means tile t is in. */
template <int LA, int LB>
__device__ __forceinline__ void tile_product_async(tc::C (&acc)[XFM][XFN], uint16_t *ring, const uint16_t *A,
                                                   long lda, int m0, int m_end, const uint16_t *B, long ldb, int n0,
                                                   int n_end, int k_beg, int k_end) {
    zero_acc(acc);
    const int nk = k_beg < k_end ? (k_end - k_beg + XBK - 1) / XBK : 0;
#pragma unroll
    for (int t = 0; t < XSTAGES - 1; t++) {
        if (t < nk) {
            uint16_t *slot = ring + (size_t)t * 2 * XTILE;
            issue_tile<LA, XBM>(slot, A, lda, m0, m_end, k_beg + t * XBK, k_end);
            issue_tile<LB, XBN>(slot + XTILE, B, ldb, n0, n_end, k_beg + t * XBK, k_end);
        }
        gk_async_commit();
    }
    for (int t = 0; t < nk; t++) {
        gk_async_wait<XSTAGES - 2>();
        __syncthreads();
        const int tn = t + XSTAGES - 1;
        if (tn < nk) {
            uint16_t *slot = ring + (size_t)(tn % XSTAGES) * 2 * XTILE;
            issue_tile<LA, XBM>(slot, A, lda, m0, m_end, k_beg + tn * XBK, k_end);
            issue_tile<LB, XBN>(slot + XTILE, B, ldb, n0, n_end, k_beg + tn * XBK, k_end);
        }
        gk_async_commit();
        const uint16_t *sa = ring + (size_t)(t % XSTAGES) * 2 * XTILE, *sb = sa + XTILE;
        warp_tile_mma<LA, LB>(acc, sa, sb);
    }
}

/* C[m, n] = acc + beta C[m, n] for m < m_end, n < n_end (beta 0: C is not read). m0, n0: the block tile's corner. */
__device__ __forceinline__ void tile_store(const tc::C (&acc)[XFM][XFN], Scratch *scratch, float *C, long ldc, int m0,
                                           int m_end, int n0, int n_end, float beta) {
    const int warp = (int)threadIdx.x / GPU_WARP, lane = (int)threadIdx.x % GPU_WARP;
    const int wm = warp / XWN, wn = warp % XWN;
    float *scr = scratch[warp];
#pragma unroll
    for (int i = 0; i < XFM; i++)
#pragma unroll
        for (int j = 0; j < XFN; j++) {
            tc::store(scr, acc[i][j], 16);
            gk_syncwarp();
            const int mb = m0 + (wm * XFM + i) * 16, nb = n0 + (wn * XFN + j) * 16;
            for (int t = lane; t < 256; t += GPU_WARP) {
                const int m = mb + t / 16, n = nb + t % 16;
                if (m < m_end && n < n_end) {
                    float *p = C + (long)m * ldc + n;
                    *p = beta != 0.0f ? scr[t] + beta * *p : scr[t];
                }
            }
            gk_syncwarp(); /* the scratch is rewritten by the next fragment */
        }
}

/* Rows grouped by expert: C[r, :] = A[r, :] op(W_e) + beta C[r, :] for r in [off[e], off[e + 1]). Block x: a tile of
 * one expert's rows, counted over the experts in order (x beyond the last tile: nothing to do); block y: 128
 * columns. W_e = W + e w_stride, element (n, k) at W_e[n ldw + k] (LB = IK: C = A W_eᵀ) or W_e[k ldw + n] (KI: C =
 * A W_e). */
/* The block's expert and row tile [m0, m_end) (the same walk in every thread); E when blockIdx.x is past the last
 * expert's tiles. */
__device__ __forceinline__ int block_expert(const int32_t *off, int E, int *m0, int *m_end) {
    int t = (int)blockIdx.x, e = 0;
    for (; e < E; e++) {
        const int r0 = off[e], r1 = off[e + 1], tiles = (r1 - r0 + XBM - 1) / XBM;
        if (t < tiles) {
            *m0 = r0 + t * XBM, *m_end = r1;
            break;
        }
        t -= tiles;
    }
    return e;
}

template <int LB, bool VEC>
__global__ void __launch_bounds__(XNT, VEC ? 2 : 1) /* the 16-byte path: 2 blocks an SM (<= 128 registers) */
expert_rows_kernel(const int32_t *off, int E, int N, int K, const uint16_t *A, int lda, const uint16_t *W,
                   long w_stride, int ldw, float beta, float *C, int ldc) {
#if TC_ARCH_OK
    __shared__ Shared sh;
    int m0 = 0, m_end = 0;
    const int e = block_expert(off, E, &m0, &m_end);
    if (e == E) return; /* uniform over the block */
    const int n0 = (int)blockIdx.y * XBN;
    tc::C acc[XFM][XFN];
    tile_product<IK, LB, VEC>(acc, sh, A, lda, m0, m_end, W + (long)e * w_stride, ldw, n0, N, 0, K);
    tile_store(acc, sh.c, C, ldc, m0, m_end, n0, N, beta);
#endif
}

/* expert_rows_kernel's 16-byte path in the async form (XASYNC_SMEM bytes of dynamic shared memory). */
template <int LB>
__global__ void __launch_bounds__(XNT, 2)
expert_rows_async_kernel(const int32_t *off, int E, int N, int K, const uint16_t *A, int lda, const uint16_t *W,
                         long w_stride, int ldw, float beta, float *C, int ldc) {
#if TC_ARCH_OK
    GK_DYNAMIC_SMEM(smem);
    uint16_t *ring = reinterpret_cast<uint16_t *>(smem);
    Scratch *scratch = reinterpret_cast<Scratch *>(smem + (size_t)XSTAGES * 2 * XTILE * sizeof(uint16_t));
    int m0 = 0, m_end = 0;
    const int e = block_expert(off, E, &m0, &m_end);
    if (e == E) return; /* uniform over the block */
    const int n0 = (int)blockIdx.y * XBN;
    tc::C acc[XFM][XFN];
    tile_product_async<IK, LB>(acc, ring, A, lda, m0, m_end, W + (long)e * w_stride, ldw, n0, N, 0, K);
    tile_store(acc, scratch, C, ldc, m0, m_end, n0, N, beta);
#endif
}

/* Per expert, the reduction over its rows: G_e[m, n] = Σ_{r in e} A[r, m] B[r, n] + beta G_e[m, n], G_e = G + e
 * g_stride. Block (x, y, z) = (128 columns, 128 rows, expert). */
template <bool VEC>
__global__ void __launch_bounds__(XNT, VEC ? 2 : 1) /* the 16-byte path: 2 blocks an SM (<= 128 registers) */
expert_wgrad_kernel(const int32_t *off, int M, int N, const uint16_t *A, int lda, const uint16_t *B, int ldb,
                    float beta, float *G, long g_stride, int ldg) {
#if TC_ARCH_OK
    __shared__ Shared sh;
    const int e = (int)blockIdx.z, m0 = (int)blockIdx.y * XBM, n0 = (int)blockIdx.x * XBN;
    const int r0 = off[e], r1 = off[e + 1];
    if (r1 <= r0 && beta == 1.0f) return; /* nothing to add (uniform over the block) */
    tc::C acc[XFM][XFN];
    tile_product<KI, KI, VEC>(acc, sh, A, lda, m0, M, B, ldb, n0, N, r0, r1);
    tile_store(acc, sh.c, G + (long)e * g_stride, ldg, m0, M, n0, N, beta);
#endif
}

/* expert_wgrad_kernel's 16-byte path in the async form. */
__global__ void __launch_bounds__(XNT, 2)
expert_wgrad_async_kernel(const int32_t *off, int M, int N, const uint16_t *A, int lda, const uint16_t *B, int ldb,
                          float beta, float *G, long g_stride, int ldg) {
#if TC_ARCH_OK
    GK_DYNAMIC_SMEM(smem);
    uint16_t *ring = reinterpret_cast<uint16_t *>(smem);
    Scratch *scratch = reinterpret_cast<Scratch *>(smem + (size_t)XSTAGES * 2 * XTILE * sizeof(uint16_t));
    const int e = (int)blockIdx.z, m0 = (int)blockIdx.y * XBM, n0 = (int)blockIdx.x * XBN;
    const int r0 = off[e], r1 = off[e + 1];
    if (r1 <= r0 && beta == 1.0f) return; /* nothing to add (uniform over the block) */
    tc::C acc[XFM][XFN];
    tile_product_async<KI, KI>(acc, ring, A, lda, m0, M, B, ldb, n0, N, r0, r1);
    tile_store(acc, scratch, G + (long)e * g_stride, ldg, m0, M, n0, N, beta);
#endif
}

/* Below this many rows (decoding's steps) the row products keep the WMMA kernels: CUTLASS's per-call host work (its
 * parameters and TMA descriptors, a few microseconds) would lengthen launch-bound steps for tiles that are mostly
 * empty either way. */
constexpr int SM90_MIN_ROWS = 256;

int expert_kernel = GK_EXPERT_SM90; /* gk_expert_kernel; GK_EXPERT_SM90 falls back to the async form where it cannot run */

/* The async form where it (or the sm90 one, which falls back to it) was chosen and the device gives its shared memory
 * (above 48 KB needs the opt-in, asked at each launch as the attention kernels do); else the staged form. */
template <class Kern>
bool use_async(Kern *kernel) {
    if (expert_kernel == GK_EXPERT_STAGED) return false;
    if (gpuFuncSetAttribute((const void *)kernel, gpuFuncAttributeMaxDynamicSharedMemorySize, (int)XASYNC_SMEM) ==
        gpuSuccess)
        return true;
#ifndef ZAYA_GPU_EMU
    (void)gpuGetLastError(); /* clear it: the staged form runs instead */
#endif
    return false;
}

} // namespace

extern "C" int gk_expert_kernel(int which) {
    if (which == GK_EXPERT_STAGED || which == GK_EXPERT_ASYNC || which == GK_EXPERT_SM90) expert_kernel = which;
    return expert_kernel;
}

extern "C" int gk_expert_sm90_built(void) {
#ifdef ZAYA_CUTLASS
    return 1;
#else
    return 0;
#endif
}

#ifndef ZAYA_CUTLASS /* built without CUTLASS's headers (and in the HIP build and the CPU emulator): no sm90 form */
extern "C" int gk_expert_sm90_ready(void) { return 0; }
extern "C" int gk_expert_sm90_reserve(GkStream, int) { return -1; }
extern "C" void gk_expert_sm90_release(GkStream) {}
extern "C" int gk_expert_mm_sm90(GkStream, const int32_t *, int, int, int, const uint16_t *, int, const uint16_t *,
                                 long, int, float, float *, int) {
    return -1;
}
extern "C" int gk_expert_mm_wgrad_sm90(GkStream, const int32_t *, int, int, int, const uint16_t *, int,
                                       const uint16_t *, int, float, float *, long, int) {
    return -1;
}
#endif

extern "C" void gk_expert_mm(GkStream s, const int32_t *off, int E, int max_rows, int N, int K, const uint16_t *A,
                             int lda, const uint16_t *W, long w_stride, int trans_w, float beta, float *C, int ldc) {
    if (E <= 0 || max_rows <= 0 || N <= 0 || K <= 0) return;
    if (expert_kernel == GK_EXPERT_SM90 && max_rows >= SM90_MIN_ROWS &&
        gk_expert_mm_sm90(s, off, E, N, K, A, lda, W, w_stride, trans_w, beta, C, ldc) == 0)
        return;
    const int ldw = trans_w ? K : N;
    const bool vec = K % 8 == 0 && lda % 8 == 0 && ldw % 8 == 0 && w_stride % 8 == 0 && (trans_w || N % 8 == 0) &&
                     aligned16(A) && aligned16(W);
    const dim3 grid((unsigned)((max_rows + XBM - 1) / XBM + E), (unsigned)((N + XBN - 1) / XBN)), block(XNT);
    void (*k)(const int32_t *, int, int, int, const uint16_t *, int, const uint16_t *, long, int, float, float *, int);
    if (vec && use_async(trans_w ? expert_rows_async_kernel<IK> : expert_rows_async_kernel<KI>)) {
        k = trans_w ? expert_rows_async_kernel<IK> : expert_rows_async_kernel<KI>;
        GK_LAUNCH(k, grid, block, XASYNC_SMEM, s, off, E, N, K, A, lda, W, w_stride, ldw, beta, C, ldc);
        GK_LAUNCH_CHECK();
        return;
    }
    if (trans_w)
        k = vec ? expert_rows_kernel<IK, true> : expert_rows_kernel<IK, false>;
    else
        k = vec ? expert_rows_kernel<KI, true> : expert_rows_kernel<KI, false>;
    GK_LAUNCH(k, grid, block, 0, s, off, E, N, K, A, lda, W, w_stride, ldw, beta, C, ldc);
    GK_LAUNCH_CHECK();
}

extern "C" void gk_expert_mm_wgrad(GkStream s, const int32_t *off, int E, int M, int N, const uint16_t *A, int lda,
                                   const uint16_t *B, int ldb, float beta, float *G, long g_stride, int ldg) {
    if (E <= 0 || M <= 0 || N <= 0) return;
    if (expert_kernel == GK_EXPERT_SM90 &&
        gk_expert_mm_wgrad_sm90(s, off, E, M, N, A, lda, B, ldb, beta, G, g_stride, ldg) == 0)
        return;
    const bool vec = M % 8 == 0 && N % 8 == 0 && lda % 8 == 0 && ldb % 8 == 0 && aligned16(A) && aligned16(B);
    const dim3 grid((unsigned)((N + XBN - 1) / XBN), (unsigned)((M + XBM - 1) / XBM), (unsigned)E), block(XNT);
    void (*k)(const int32_t *, int, int, const uint16_t *, int, const uint16_t *, int, float, float *, long, int) =
        vec ? expert_wgrad_kernel<true> : expert_wgrad_kernel<false>;
    if (vec && use_async(expert_wgrad_async_kernel)) {
        k = expert_wgrad_async_kernel;
        GK_LAUNCH(k, grid, block, XASYNC_SMEM, s, off, M, N, A, lda, B, ldb, beta, G, g_stride, ldg);
    } else {
        GK_LAUNCH(k, grid, block, 0, s, off, M, N, A, lda, B, ldb, beta, G, g_stride, ldg);
    }
    GK_LAUNCH_CHECK();
}
