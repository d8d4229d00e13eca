/* gpu_xent: the cross-entropy loss and its gradient on the GPU (gk_cross_entropy, gpu_kernels.h), the CPU's
 * cross_entropy maths (src/kernels/kernels.inc). Its own file so the CPU emulator (tests/gpu/emu/test_xent.cpp) runs
 * this source against the CPU's, and its bf16 gradient against zy_f32_to_bf16 of its fp32 one. No float atomics:
 * every run gives the same bits. */
#include <math.h>

#include "gpu_common.cuh"
#include "gpu_kernels.h"

/* One block a row. Pass 1 (the only full read for the loss): each thread keeps a running max m and
 * s = Σ exp(l − m) over its elements, rescaling s when m grows (once per W-chunk); the block then combines
 * (m, s) into the row max M and Σ exp(l − M) in double. Pass 2 (when dlogits) reads the logits again and writes
 * (softmax − onehot)·dl_scale, in fp32 (dlogits) or as its bf16 bits (dlogits16: the head's backward products read
 * nothing else in bf16 runs, so the same value rounded here spares the fp32 gradient's write and the rounding pass
 * each product made of it). A chunk that is all −inf adds nothing (exp(−inf − −inf) would be NaN); NaN logits
 * still make the loss NaN, as on the CPU. */
template <int W>
__device__ __forceinline__ void store_bf16_pack(uint16_t *p, const Pack<W> &a) {
    if constexpr (W == 4)
        *reinterpret_cast<ushort4 *>(p) =
            make_ushort4(gk_bf16_bits(a.v[0]), gk_bf16_bits(a.v[1]), gk_bf16_bits(a.v[2]), gk_bf16_bits(a.v[3]));
    else
        *p = gk_bf16_bits(a.v[0]);
}

template <int W>
__global__ void cross_entropy_kernel(float *dlogits, uint16_t *dlogits16, float *row_loss, const float *logits,
                                     const int32_t *targets, int rows, int V, const float *dl_scale_at) {
    __shared__ float red_max[32];
    __shared__ double red_sum[32];
    const float dl_scale = dl_scale_at ? *dl_scale_at : 0.0f; /* on the device: set by gk_loss_scale */
    for (long r = blockIdx.x; r < rows; r += gridDim.x) { /* r is block-uniform: the barriers below are safe */
        const float *l = logits + r * V;
        float *dl = dlogits ? dlogits + r * V : nullptr;
        uint16_t *dl16 = dlogits16 ? dlogits16 + r * V : nullptr;
        const int t = targets[r];
        if (t < 0) { /* ignored row: loss 0, gradient 0 */
            if (threadIdx.x == 0 && row_loss) row_loss[r] = 0;
            const Pack<W> zero = {};
            for (int i = threadIdx.x * W; (dl || dl16) && i < V; i += blockDim.x * W) {
                if (dl) store_pack<W>(dl + i, zero);
                if (dl16) store_bf16_pack<W>(dl16 + i, zero);
            }
            continue;
        }
        /* the target's logit read before the barriers below: dlogits may alias logits (pass 2 then overwrites it) */
        const float target_logit = threadIdx.x == 0 && t < V ? l[t] : 0.0f;
        float m = -INFINITY, sum = 0;
        for (int i = threadIdx.x * W; i < V; i += blockDim.x * W) {
            const Pack<W> a = load_pack<W>(l + i);
            float cm = a.v[0];
#pragma unroll
            for (int k = 1; k < W; k++) cm = fmaxf(cm, a.v[k]);
            if (cm > m) {
                sum *= expf(m - cm);
                m = cm;
            }
            if (cm != -INFINITY) {
#pragma unroll
                for (int k = 0; k < W; k++) sum += expf(a.v[k] - m);
            }
        }
        const float M = block_max(m, red_max);
        const double part = m == -INFINITY ? 0.0 : (double)sum * (double)expf(m - M);
        const double total = block_sum_d(part, red_sum);
        if (threadIdx.x == 0 && row_loss) {
            const double lse = (double)M + log(total);
            row_loss[r] = t < V ? (float)(lse - target_logit) : NAN; /* a target past the vocabulary: a NaN */
        }
        if (dl || dl16) {
            const float scale = (float)((double)dl_scale / total);
            for (int i = threadIdx.x * W; i < V; i += blockDim.x * W) {
                const Pack<W> a = load_pack<W>(l + i);
                Pack<W> p;
#pragma unroll
                for (int k = 0; k < W; k++) {
                    p.v[k] = expf(a.v[k] - M) * scale;
                    if (i + k == t) p.v[k] -= dl_scale;
                }
                if (dl) store_pack<W>(dl + i, p);
                if (dl16) store_bf16_pack<W>(dl16 + i, p);
            }
        }
    }
}

extern "C" void gk_cross_entropy(GkStream s, float *dlogits, uint16_t *dlogits16, float *row_loss,
                                 const float *logits, const int32_t *targets, int rows, int V, const float *dl_scale) {
    if (rows <= 0 || V <= 0) return;
    /* enough threads to keep a long row's loads in flight, few for a short row (multiples of 64: any warp size) */
    const int threads = V >= 32768 ? 512 : V >= 4096 ? 256 : V >= 512 ? 128 : 64;
    const int blocks = rows < 65535 * 16 ? rows : 65535 * 16;
    /* 4-wide: every fp32 row 16-byte aligned, every bf16 row 8-byte aligned (V % 4 == 0 and aligned bases) */
    void (*k)(float *, uint16_t *, float *, const float *, const int32_t *, int, int, const float *) =
        can_vec4(V, {logits, dlogits, dlogits16}) ? cross_entropy_kernel<4> : cross_entropy_kernel<1>;
    GK_LAUNCH(k, blocks, threads, 0, s, dlogits, dlogits16, row_loss, logits, targets, rows, V, dl_scale);
    GK_LAUNCH_CHECK();
}
