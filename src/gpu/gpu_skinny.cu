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
#include "gpu_skinny.cuh"

namespace {
using namespace skinny;

template <int ROWS, int MODE>
__global__ void __launch_bounds__(SK_THREADS) skinny_kernel(SkinnyArgs a) {
    __shared__ float part[skinny_smem_floats<ROWS, MODE>()];
    /* the weights' first pieces stream in while the kernel that writes x finishes (programmatic launch) */
    const SkinnyPre<MODE> pre = skinny_prefetch<MODE>(a, blockIdx.x, blockDim.x);
    gk_pdl_enter();
    skinny_block<ROWS, MODE>(a, a.x, blockIdx.x, blockDim.x, part, pre);
}

inline bool al16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* Shapes every form needs: rows in range, K whole 16-byte pieces, x's rows on 16-byte boundaries. */
bool skinny_fits(const float *x, long ldx, int rows, int K) {
    return rows >= 1 && rows <= GK_SKINNY_ROWS && K >= 8 && K % 8 == 0 && ldx >= K && ldx % 4 == 0 && al16(x);
}

template <int MODE>
void skinny_launch(GkStream s, const SkinnyArgs &a) {
    const int blocks = skinny_blocks<MODE>(a.n_units), threads = skinny_threads(a.K);
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

template <int ROWS>
__global__ void __launch_bounds__(RT_THREADS, 1) router_tail_kernel(GkRouterTail a) {
    __align__(16) __shared__ float sm[router_tail_smem_floats<ROWS>()];
    /* the first hidden layer's weights stream in while the down projection before this kernel finishes */
    const RouterTailPre pre = router_tail_prefetch(a);
    gk_pdl_enter();
    router_tail_block<ROWS>(a, sm, pre);
}

} // namespace

extern "C" int gk_skinny_router_tail(GkStream s, const GkRouterTail *t) {
    const GkRouterTail &a = *t;
    if (!router_tail_fits(a)) return -1;
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
