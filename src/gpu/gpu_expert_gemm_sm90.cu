/* gpu_expert_gemm_sm90: the experts' grouped products on Hopper's wgmma + TMA, through CUTLASS's sm90 grouped GEMM.
 *
 * Why: gpu_expert_gemm.cu's WMMA kernels (mma.sync) reach ~95 TFLOP/s on an H200, ~12% of cuBLASLt's dense bf16
 * rate; Hopper's rate needs wgmma (warpgroup products from shared memory) fed by TMA copies, warp-specialised
 * producers and a multi-stage pipeline. CUTLASS's ptr-array grouped kernel (KernelPtrArrayTmaWarpSpecialized-
 * Cooperative) is exactly the experts' problem: one persistent launch for every expert's product, each group's
 * shape, pointers and strides read on the device (its TMA descriptors rewritten in place per group), so the sizes
 * never go to the host. A small kernel (expert_groups) turns gk_group_by_expert's offsets into those per-expert
 * arguments on the device, ahead of each product.
 *
 * Same contract as gk_expert_mm / gk_expert_mm_wgrad (gpu_kernels.h): bf16 operands, fp32 accumulation, fp32 output
 * with beta. Deterministic: every output tile is summed by one CTA in a fixed k order (no split-k, no atomics); the
 * order differs from the WMMA kernels', so the bits do too (tests/gpu/test_gpu_gemm.c checks both against the CPU).
 *
 * Only for NVIDIA sm_90 (H100/H200): the Makefile compiles this file for sm_90a alone (wgmma/TMA are arch-specific
 * instructions) when CUTLASS's headers are there (PyPI's nvidia-cutlass, see the Makefile); the launchers
 * return -1 on any other device, or shape they do not take, and the WMMA kernels run instead. Not in the HIP build
 * nor the CPU emulator (neither can express wgmma/TMA). */
#include <stdint.h>
#include <stdio.h>

#include "gpu_kernels.h"
#include <cuda_runtime.h>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"

namespace experts_sm90 { /* named: an anonymous one collides with cute's under nvcc's host stub */

using namespace cute;
using Problem = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>; /* (M, N, K) a group */
using bf16 = cutlass::bfloat16_t;
using RowMajor = cutlass::layout::RowMajor;
using ColMajor = cutlass::layout::ColumnMajor;

using Tile = Shape<_128, _128, _64>;
using Cluster = Shape<_1, _1, _1>;
/* D = A B + beta C, fp32 row-major, stored by TMA (the same for every product kind). */
using Epilogue = cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, Cluster, cutlass::epilogue::collective::EpilogueTileAuto,
    float, float, float, RowMajor *, 4, float, RowMajor *, 4, cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
    cutlass::epilogue::fusion::LinearCombination<float, float>>::CollectiveOp;
constexpr int EPILOGUE_SMEM = static_cast<int>(sizeof(Epilogue::SharedStorage));

/* One grouped product: A (M x K) in LA, B (K x N) in LB, bf16, 16-byte aligned rows. Tiles of 128 x 128 x 64 over two
 * consumer warpgroups (the cooperative schedule), one CTA a cluster, as many pipeline stages as the shared memory
 * holds beside the epilogue's. */
template <class LA, class LB>
struct Grouped {
    using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
        cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, bf16, LA *, 8, bf16, LB *, 8, float, Tile, Cluster,
        cutlass::gemm::collective::StageCountAutoCarveout<EPILOGUE_SMEM>,
        cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>::CollectiveOp;
    using Kernel = cutlass::gemm::kernel::GemmUniversal<Problem, Mainloop, Epilogue>;
    using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
    using SA = typename Kernel::InternalStrideA;
    using SB = typename Kernel::InternalStrideB;
    using SC = typename Kernel::InternalStrideC;
    using SD = typename Kernel::InternalStrideD;

    /* The per-group arguments on the device, E entries each (see Scratch). */
    struct Groups {
        Problem::UnderlyingProblemShape *shape;
        const bf16 **a;
        const bf16 **b;
        const float **c;
        float **d;
        SA *sa;
        SB *sb;
        SC *sc;
        SD *sd;
    };
    static size_t group_bytes() {
        return sizeof(Problem::UnderlyingProblemShape) + 2 * sizeof(void *) + 2 * sizeof(void *) + sizeof(SA) +
               sizeof(SB) + sizeof(SC) + sizeof(SD);
    }
};

/* A ptr-array stride has one dynamic entry, the leading dimension, among its first two (the other is _1, the third
 * _0): set it. */
template <class S>
__device__ __forceinline__ S stride_with_ld(int64_t ld) {
    S s{};
    if constexpr (cute::is_static<cute::remove_cvref_t<decltype(cute::get<0>(s))>>::value)
        cute::get<1>(s) = ld;
    else
        cute::get<0>(s) = ld;
    return s;
}

/* Group e: D = A B + beta D (C is D) of shape (m, n, k), the operands' bases and leading dimensions. */
template <class G>
__device__ __forceinline__ void set_group(const typename G::Groups &g, int e, int m, int n, int k, const uint16_t *a,
                                          int lda, const uint16_t *b, int ldb, float *d, int ldd) {
    g.shape[e] = {m, n, k};
    g.a[e] = reinterpret_cast<const bf16 *>(a);
    g.b[e] = reinterpret_cast<const bf16 *>(b);
    g.c[e] = d;
    g.d[e] = d;
    g.sa[e] = stride_with_ld<typename G::SA>(lda);
    g.sb[e] = stride_with_ld<typename G::SB>(ldb);
    g.sc[e] = stride_with_ld<typename G::SC>(ldd);
    g.sd[e] = stride_with_ld<typename G::SD>(ldd);
}

/* The row products' groups: expert e's rows [off[e], off[e + 1]) of A and C times W_e (shape rows x N x K). */
template <class G>
__global__ void rows_groups(typename G::Groups g, const int32_t *off, int E, int N, int K, const uint16_t *A, int lda,
                            const uint16_t *W, long w_stride, int ldw, float *C, int ldc) {
    const int e = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (e >= E) return;
    const int r0 = off[e];
    set_group<G>(g, e, off[e + 1] - r0, N, K, A + (long)r0 * lda, lda, W + (long)e * w_stride, ldw, C + (long)r0 * ldc,
                 ldc);
}

/* The weight gradients' groups: G_e (M x N) = A[rows of e]ᵀ B[rows of e], the reduction over expert e's rows. An
 * expert without rows gets no tiles (M = 0: the mainloop would leave its accumulators unset at K = 0);
 * empty_experts_scale gives it beta G_e instead. */
template <class G>
__global__ void wgrad_groups(typename G::Groups g, const int32_t *off, int E, int M, int N, const uint16_t *A, int lda,
                             const uint16_t *B, int ldb, float *Gw, long g_stride, int ldg) {
    const int e = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (e >= E) return;
    const int r0 = off[e], rows = off[e + 1] - r0;
    set_group<G>(g, e, rows > 0 ? M : 0, N, rows, A + (long)r0 * lda, lda, B + (long)r0 * ldb, ldb,
                 Gw + (long)e * g_stride, ldg);
}

/* G_e = beta G_e for the experts without rows (beta 0 writes zeros, so no NaN survives); blocks of experts with rows
 * return at once. Grid (M x N elements, E). */
__global__ void empty_experts_scale(const int32_t *off, int M, int N, float beta, float *Gw, long g_stride, int ldg) {
    const int e = (int)blockIdx.y;
    if (off[e + 1] > off[e] || beta == 1.0f) return;
    float *g = Gw + (long)e * g_stride;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < (long)M * N; i += (long)gridDim.x * blockDim.x) {
        float *p = g + (i / N) * ldg + i % N;
        *p = beta == 0.0f ? 0.0f : beta * *p;
    }
}

/* Per stream (the products of one stream run in its order, so one set of per-group arguments and one CUTLASS
 * workspace a stream and product kind is enough): device memory reserved ahead (gk_expert_sm90_reserve, at model
 * creation) or grown on demand, never while a graph is captured, so that whether a product runs here never depends
 * on what ran before a capture. */
struct Scratch {
    GkStream stream;
    int kind, cap_groups;
    void *groups;
    void *workspace;
    size_t workspace_bytes;
};
constexpr int MAX_SCRATCH = 16;
Scratch scratch[MAX_SCRATCH];

/* Buffers outgrown on a stream: a graph captured before the growth may still replay with them, so they are freed
 * with the stream's scratch (gk_expert_sm90_release), not when outgrown. */
struct Retired {
    GkStream stream;
    void *ptr;
};
constexpr int MAX_RETIRED = 64;
Retired retired[MAX_RETIRED];

bool retire(GkStream s, void *p) {
    if (!p) return true;
    for (int i = 0; i < MAX_RETIRED; i++)
        if (!retired[i].ptr) {
            retired[i] = Retired{s, p};
            return true;
        }
    return false;
}

/* Per device (a process may switch devices): -1 unknown, 0 not sm_90, 1 sm_90, and its SM count for the grid. */
constexpr int MAX_DEVICES = 64;
signed char sm90_device[MAX_DEVICES];
int sm_count[MAX_DEVICES];
bool device_known[MAX_DEVICES];

/* The current device's id, its entry read on first use; -1 when the id cannot be read or is out of range. */
int current_device() {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= MAX_DEVICES) return -1;
    if (!device_known[dev]) {
        int major = 0, minor = 0, sms = 0;
        sm90_device[dev] = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
                                   cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess &&
                                   cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess &&
                                   major == 9 && minor == 0
                               ? 1
                               : 0;
        sm_count[dev] = sms;
        device_known[dev] = true;
    }
    return dev;
}

bool device_is_sm90() {
    const int dev = current_device();
    return dev >= 0 && sm90_device[dev] == 1;
}

cutlass::KernelHardwareInfo hw_info() {
    cutlass::KernelHardwareInfo hw;
    hw.device_id = current_device();
    hw.sm_count = hw.device_id >= 0 ? sm_count[hw.device_id] : 0;
    return hw;
}

} // namespace experts_sm90
using namespace experts_sm90;

extern "C" int gk_expert_sm90_ready(void) { return device_is_sm90() ? 1 : 0; }

namespace experts_sm90 {

bool capturing(GkStream s) {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    return cudaStreamIsCapturing(s, &st) != cudaSuccess || st != cudaStreamCaptureStatusNone;
}

/* The scratch of (stream, kind) with room for E groups and `ws` workspace bytes; NULL when it cannot be had. */
Scratch *scratch_for(GkStream s, int kind, int E, size_t group_bytes, size_t ws) {
    Scratch *free_slot = NULL, *x = NULL;
    for (int i = 0; i < MAX_SCRATCH && !x; i++) {
        if (scratch[i].groups && scratch[i].stream == s && scratch[i].kind == kind) x = &scratch[i];
        else if (!scratch[i].groups && !free_slot) free_slot = &scratch[i];
    }
    if (x && x->cap_groups >= E && x->workspace_bytes >= ws) return x;
    if (capturing(s)) return NULL;
    if (!x) {
        if (!free_slot) return NULL;
        x = free_slot;
    } else {
        /* kept until the stream's release: its queued work or a graph captured earlier may still read them */
        if (!retire(s, x->groups) || !retire(s, x->workspace)) return NULL;
        *x = Scratch{};
    }
    const int cap = E < 64 ? 64 : E;
    void *g = NULL, *w = NULL;
    if (cudaMalloc(&g, (size_t)cap * group_bytes + 256) != cudaSuccess ||
        (ws && cudaMalloc(&w, ws) != cudaSuccess)) {
        if (g) cudaFree(g);
        (void)cudaGetLastError();
        return NULL;
    }
    *x = Scratch{s, kind, cap, g, w, ws};
    return x;
}

/* Carves E entries of each per-group array out of the scratch, each array 16-byte aligned. */
template <class G>
typename G::Groups carve(void *base, int cap) {
    char *p = static_cast<char *>(base);
    auto take = [&](size_t elem) {
        char *q = p;
        p += ((size_t)cap * elem + 15) / 16 * 16;
        return q;
    };
    typename G::Groups g;
    g.shape = reinterpret_cast<Problem::UnderlyingProblemShape *>(take(sizeof(Problem::UnderlyingProblemShape)));
    g.a = reinterpret_cast<const bf16 **>(take(sizeof(void *)));
    g.b = reinterpret_cast<const bf16 **>(take(sizeof(void *)));
    g.c = reinterpret_cast<const float **>(take(sizeof(void *)));
    g.d = reinterpret_cast<float **>(take(sizeof(void *)));
    g.sa = reinterpret_cast<typename G::SA *>(take(sizeof(typename G::SA)));
    g.sb = reinterpret_cast<typename G::SB *>(take(sizeof(typename G::SB)));
    g.sc = reinterpret_cast<typename G::SC *>(take(sizeof(typename G::SC)));
    g.sd = reinterpret_cast<typename G::SD *>(take(sizeof(typename G::SD)));
    return g;
}

template <class G>
typename G::Gemm::Arguments arguments(const typename G::Groups &g, int E, float beta) {
    typename G::Gemm::Arguments args{}; /* value-initialised: every field CUTLASS gives no default is zero */
    args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
    args.problem_shape = {E, g.shape, nullptr}; /* sizes on the device only: the grid is one CTA an SM */
    args.mainloop = {g.a, g.sa, g.b, g.sb};
    args.epilogue.thread.alpha = 1.0f;
    args.epilogue.thread.beta = beta;
    args.epilogue.ptr_C = g.c;
    args.epilogue.dC = g.sc;
    args.epilogue.ptr_D = g.d;
    args.epilogue.dD = g.sd;
    args.hw_info = hw_info();
    return args;
}

/* The scratch of one product kind for E groups on stream s. The workspace (per-CTA TMA descriptors) depends on the SM
 * count and E only: sized with placeholder groups. */
template <class G>
Scratch *scratch_of(GkStream s, int kind, int E) {
    if (E <= 0 || E > 1024 || !device_is_sm90()) return NULL;
    typename G::Groups probe{};
    typename G::Gemm::Arguments sizing = arguments<G>(probe, E, 0.0f);
    return scratch_for(s, kind, E, G::group_bytes(), G::Gemm::get_workspace_size(sizing));
}

/* Builds the groups with `prep` (a one-block kernel launch given the Groups) and runs the grouped product. */
template <class G, class Prep>
int run_grouped(GkStream s, int kind, int E, float beta, Prep prep) {
    Scratch *x = scratch_of<G>(s, kind, E);
    if (!x) return -1;
    const typename G::Groups g = carve<G>(x->groups, x->cap_groups);
    typename G::Gemm gemm;
    typename G::Gemm::Arguments args = arguments<G>(g, E, beta);
    /* initialize reads only the arrays' addresses, so it comes first: a refusal then leaves nothing queued */
    if (gemm.initialize(args, x->workspace, s) != cutlass::Status::kSuccess) return -1;
    prep(g);
    if (cudaPeekAtLastError() != cudaSuccess) return -1;
    return gemm.run(s) == cutlass::Status::kSuccess ? 0 : -1;
}

using RowsNT = Grouped<RowMajor, ColMajor>; /* C = A W_eᵀ: W_e [N, K], k contiguous */
using RowsNN = Grouped<RowMajor, RowMajor>; /* C = A W_e: W_e [K, N], n contiguous */
using Wgrad = Grouped<ColMajor, RowMajor>;  /* G_e = Aᵀ B over the expert's rows: both m/n contiguous */
enum { KIND_NT, KIND_NN, KIND_WGRAD };

bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

} // namespace experts_sm90
using namespace experts_sm90;

extern "C" int gk_expert_sm90_reserve(GkStream s, int E) {
    const bool ok = scratch_of<RowsNT>(s, KIND_NT, E) && scratch_of<RowsNN>(s, KIND_NN, E) &&
                    scratch_of<Wgrad>(s, KIND_WGRAD, E);
    return ok ? 0 : -1;
}

extern "C" void gk_expert_sm90_release(GkStream s) {
    for (int i = 0; i < MAX_SCRATCH; i++)
        if (scratch[i].groups && scratch[i].stream == s) {
            cudaFree(scratch[i].groups);
            if (scratch[i].workspace) cudaFree(scratch[i].workspace);
            scratch[i] = Scratch{};
        }
    for (int i = 0; i < MAX_RETIRED; i++)
        if (retired[i].ptr && retired[i].stream == s) {
            cudaFree(retired[i].ptr);
            retired[i] = Retired{};
        }
}

extern "C" int gk_expert_mm_sm90(GkStream s, const int32_t *off, int E, int N, int K, const uint16_t *A, int lda,
                                 const uint16_t *W, long w_stride, int trans_w, float beta, float *C, int ldc) {
    const int ldw = trans_w ? K : N;
    /* TMA: 16-byte aligned bases and leading dimensions, for every expert's base (hence lda, w_stride, ldc too) */
    if (N <= 0 || K <= 0 || lda % 8 || ldw % 8 || w_stride % 8 || ldc % 4 || !aligned16(A) || !aligned16(W) ||
        !aligned16(C))
        return -1;
    auto launch = [&](auto g, auto *kernel) {
        kernel<<<(E + 127) / 128, 128, 0, s>>>(g, off, E, N, K, A, lda, W, w_stride, ldw, C, ldc);
    };
    if (trans_w)
        return run_grouped<RowsNT>(s, KIND_NT, E, beta,
                                   [&](const RowsNT::Groups &g) { launch(g, rows_groups<RowsNT>); });
    return run_grouped<RowsNN>(s, KIND_NN, E, beta, [&](const RowsNN::Groups &g) { launch(g, rows_groups<RowsNN>); });
}

extern "C" int gk_expert_mm_wgrad_sm90(GkStream s, const int32_t *off, int E, int M, int N, const uint16_t *A,
                                       int lda, const uint16_t *B, int ldb, float beta, float *G, long g_stride,
                                       int ldg) {
    if (M <= 0 || N <= 0 || lda % 8 || ldb % 8 || ldg % 4 || g_stride % 4 || !aligned16(A) || !aligned16(B) ||
        !aligned16(G))
        return -1;
    const int rc = run_grouped<Wgrad>(s, KIND_WGRAD, E, beta, [&](const Wgrad::Groups &g) {
        wgrad_groups<Wgrad><<<(E + 127) / 128, 128, 0, s>>>(g, off, E, M, N, A, lda, B, ldb, G, g_stride, ldg);
    });
    if (rc == 0 && beta != 1.0f) {
        const long blocks = ((long)M * N + 255) / 256;
        empty_experts_scale<<<dim3((unsigned)(blocks < 1024 ? blocks : 1024), (unsigned)E), 256, 0, s>>>(
            off, M, N, beta, G, g_stride, ldg);
    }
    return rc;
}
