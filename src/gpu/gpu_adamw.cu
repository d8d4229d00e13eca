/* gpu_adamw: the optimizer's multi-tensor AdamW pass (gk_adamw, gpu_kernels.h): one launch over every owned AdamW
 * tensor, a block per chunk, each gradient clipped as read (k.grad_scale), each element's update adamw_elem of src/optim/adamw_elem.h operation for operation (the
 * _rn intrinsics: one IEEE operation per C operation, never contracted into an FMA, so the weights and both moments
 * come out with the CPU's bits), and, where asked, the bf16 copy of each updated weight written in the same pass
 * (ZAYA1 issue 30 item 5: no separate rounding kernel reading the whole arena again). Its own file so the CPU
 * emulator (tests/gpu/emu/test_adamw.cpp) runs this source against adamw_elem. */
#include <stdint.h>

#include "gpu_common.cuh"
#include "gpu_kernels.h"

#define GA_THREADS 256

__global__ void ga_adamw_kernel(float *w, uint16_t *w16, const float *g, float *m, float *v, uint64_t begin,
                                const GpuOptimChunk *chunks, GkOptimStep k0, GkOptimStep k1) {
    const GpuOptimChunk c = chunks[blockIdx.x];
    const GkOptimStep k = (c.flags & GPU_OPTIM_ROUTER) ? k1 : k0;
    const float decay = (c.flags & GPU_OPTIM_DECAY) ? k.adam_decay : 1.0f;
    const float omb1 = __fsub_rn(1.0f, k.b1), omb2 = __fsub_rn(1.0f, k.b2);
    for (uint32_t i = threadIdx.x; i < c.len; i += blockDim.x) {
        const uint64_t o = c.off + i, s = o - begin;
        const float gi = __fmul_rn(g[o], k.grad_scale); /* the clipping multiply */
        float wi = w[o], mi = m[s], vi = v[s];
        wi = __fmul_rn(wi, decay);                                                 /* w *= decay */
        mi = __fadd_rn(mi, __fmul_rn(__fsub_rn(gi, mi), omb1));                    /* m += (g − m)(1 − β1) */
        vi = __fadd_rn(__fmul_rn(k.b2, vi), __fmul_rn(__fmul_rn(omb2, gi), gi));  /* v = β2 v + (1 − β2) g g */
        const float denom = __fadd_rn(__fmul_rn(__fsqrt_rn(vi), k.inv_bc2), k.eps);
        wi = __fsub_rn(wi, __fmul_rn(k.step_size, __fdiv_rn(mi, denom)));         /* w −= step · m / denom */
        w[o] = wi;
        m[s] = mi;
        v[s] = vi;
        if (w16) w16[o] = gk_bf16_bits(wi);
    }
}

extern "C" void gk_adamw(GkStream s, float *w, uint16_t *w16, const float *g, float *m, float *v, uint64_t begin,
                         const GpuOptimChunk *chunks, int n_chunks, GkOptimStep k0, GkOptimStep k1) {
    if (n_chunks <= 0) return;
    GK_LAUNCH(ga_adamw_kernel, dim3((unsigned)n_chunks), dim3(GA_THREADS), 0, s, w, w16, g, m, v, begin, chunks, k0,
              k1);
    GK_LAUNCH_CHECK();
}
