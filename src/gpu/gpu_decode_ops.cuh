/* gpu_decode_ops.cuh: cached decoding's block and warp bodies (gpu_decode_kernels.cu launches them one kernel each;
 * gpu_decode_layer.cu runs them as phases of a layer's persistent kernel). Each body takes its block's coordinates as
 * arguments and its shared memory from the caller, and uses only the threads its own launch has (the others pass its
 * barriers), so both forms give the same bits. The cache holds k̂ / v as fp32 or as bf16 (rounded nearest-even when
 * appended, widened exactly when read; scores, softmax and sums stay fp32), one template each. */
#ifndef ZAYA_GPU_DECODE_OPS_CUH
#define ZAYA_GPU_DECODE_OPS_CUH

#include "gpu_cca_rows.cuh"
#include "gpu_common.cuh"
#include "gpu_kernels.h"

namespace decode_ops {

constexpr int DA_WARPS = 4;
constexpr int DA_MAX_DH = 256;
constexpr int DA_MAX_PER_LANE = DA_MAX_DH / GPU_WARP;
/* Shared floats attend_query needs: the query, each warp's max and sum, each warp's output. */
constexpr int DA_SMEM_FLOATS = DA_MAX_DH + 2 * DA_WARPS + DA_WARPS * DA_MAX_DH;

/* Where a sequence's key s sits (its k̂ and v rows share the offset): contiguous rows of the same-length cache, or
 * row table[s / bt]·bt + s % bt of a block pool. */
struct ContiguousKeys {
    long base;
    int Ck;
    __device__ long operator()(int s) const { return base + (long)s * Ck; }
};
struct PagedKeys {
    const int32_t *tab;
    int bt, Ck;
    long off;
    __device__ long operator()(int s) const { return ((long)tab[s / bt] * bt + s % bt) * Ck + off; }
};

/* A cached k̂ / v element as fp32: as stored, or a bf16 one widened. */
__device__ __forceinline__ float kv_value(const float *p) { return *p; }
__device__ __forceinline__ float kv_value(const uint16_t *p) { return gk_bf16_float(*p); }
/* A row element stored as the destination holds it: fp32 as is, bf16 rounded nearest-even (zy_f32_to_bf16). */
__device__ __forceinline__ void kv_store(float *d, float x) { *d = x; }
__device__ __forceinline__ void kv_store(uint16_t *d, float x) { *d = gk_bf16_bits(x); }

/* One query row of one head (DA_WARPS warps of the block) over keys first..last: each warp walks every DA_WARPS-th
 * key with an online softmax (its own max, sum and output accumulator); the warps' partial results are then combined
 * in a fixed order, so the result does not depend on scheduling. Lane l holds output dims l, l+GPU_WARP, ... (32 on
 * NVIDIA, 64 on AMD). sm: DA_SMEM_FLOATS. Ends with a barrier. */
template <class Keys, class KV>
__device__ __forceinline__ void attend_query(float *orow, const float *qrow, const KV *K, const KV *V, Keys key,
                                             int first, int last, int dh, float scale, float *sm) {
    const int lane = threadIdx.x % GPU_WARP, warp = threadIdx.x / GPU_WARP;
    float *q = sm, *wm = q + DA_MAX_DH, *wl = wm + DA_WARPS, *wo = wl + DA_WARPS; /* wo [DA_WARPS][DA_MAX_DH] */
    for (int i = threadIdx.x; i < dh; i += blockDim.x) q[i] = qrow[i];
    __syncthreads();
    if (warp < DA_WARPS) {
        float m = -INFINITY, l = 0.0f, acc[DA_MAX_PER_LANE];
        for (int k = 0; k < DA_MAX_PER_LANE; k++) acc[k] = 0.0f;
        for (int s = first + warp; s <= last; s += DA_WARPS) {
            const long at = key(s);
            const KV *kr = K + at;
            float dot = 0.0f;
            for (int i = lane; i < dh; i += GPU_WARP) dot += q[i] * kv_value(kr + i);
            dot = warp_sum(dot) * scale;
            const float m_new = fmaxf(m, dot);
            const float corr = expf(m - m_new), p = expf(dot - m_new);
            l = l * corr + p;
            const KV *vr = V + at;
            int k = 0;
            for (int i = lane; i < dh; i += GPU_WARP, k++) acc[k] = acc[k] * corr + p * kv_value(vr + i);
            m = m_new;
        }
        if (lane == 0) wm[warp] = m, wl[warp] = l;
        int k = 0;
        for (int i = lane; i < dh; i += GPU_WARP, k++) wo[warp * DA_MAX_DH + i] = acc[k];
    }
    __syncthreads();
    float M = -INFINITY;
    for (int w = 0; w < DA_WARPS; w++) M = fmaxf(M, wm[w]);
    float L = 0.0f;
    for (int w = 0; w < DA_WARPS; w++) L += wm[w] == -INFINITY ? 0.0f : wl[w] * expf(wm[w] - M);
    for (int i = threadIdx.x; i < dh; i += blockDim.x) {
        float o = 0.0f;
        for (int w = 0; w < DA_WARPS; w++)
            if (wm[w] != -INFINITY) o += wo[w * DA_MAX_DH + i] * expf(wm[w] - M);
        orow[i] = o / L;
    }
    __syncthreads();
}

/* Query t of sequence b, head h, of the same-length cache [B, max_len, Hkv·dh] (n new rows a sequence at p0..). */
template <class KV>
__device__ __forceinline__ void attend_contiguous(float *O, const float *Q, const KV *Kc, const KV *Vc, int t, int h,
                                                  int b, int n, int p0, int max_len, int Hq, int Hkv, int dh,
                                                  float scale, int window, float *sm) {
    const int G = Hq / Hkv, j = h / G, Cq = Hq * dh, Ck = Hkv * dh;
    const int last = p0 + t; /* sees keys 0..last, or last-window+1..last in a sliding layer */
    const int first = window > 0 && last - window + 1 > 0 ? last - window + 1 : 0;
    const long row = (long)b * n + t;
    attend_query(O + row * Cq + (long)h * dh, Q + row * Cq + (long)h * dh, Kc, Vc,
                 ContiguousKeys{(long)b * max_len * Ck + (long)j * dh, Ck}, first, last, dh, scale, sm);
}
/* Row r of a ragged batch, head h: its sequence row_seq[r] at position row_pos[r]; key s of that sequence is row
 * table[seq, s / bt]·bt + s % bt of the pool's Kp / Vp [n_blocks·bt, Hkv·dh]. */
template <class KV>
__device__ __forceinline__ void attend_paged(float *O, const float *Q, const KV *Kp, const KV *Vp,
                                             const int32_t *row_seq, const int32_t *row_pos, const int32_t *table,
                                             int max_blocks, int bt, int r, int h, int Hq, int Hkv, int dh, float scale,
                                             int window, float *sm) {
    const int G = Hq / Hkv, j = h / G, Cq = Hq * dh, Ck = Hkv * dh;
    const int last = row_pos[r];
    const int first = window > 0 && last - window + 1 > 0 ? last - window + 1 : 0;
    attend_query(O + (long)r * Cq + (long)h * dh, Q + (long)r * Cq + (long)h * dh, Kp, Vp,
                 PagedKeys{table + (long)row_seq[r] * max_blocks, bt, Ck, (long)j * dh}, first, last, dh, scale, sm);
}

/* Element k of a GkRowCopy (rows through optional index lists; row k / len, column k % len). */
template <class T> __device__ __forceinline__ void copy_row_element(const GkRowCopy &c, long k) {
    const long r = k / c.len, i = k % c.len;
    const long d = c.dst_idx ? c.dst_idx[r] : r, o = c.src_idx ? c.src_idx[r] : r;
    kv_store((T *)c.dst + d * c.dst_stride + i, c.src[o * c.src_stride + i]);
}
__host__ __device__ inline long row_copy_total(const GkRowCopy &c) { return c.len > 0 && c.n > 0 ? c.len * c.n : 0; }
/* Elements first, first + stride, ... of a then b as one range. */
template <class T>
__device__ __forceinline__ void copy_rows_range(const GkRowCopy &a, const GkRowCopy &b, long total_a, long total,
                                                long first, long stride) {
    for (long k = first; k < total; k += stride) {
        if (k < total_a)
            copy_row_element<T>(a, k);
        else
            copy_row_element<T>(b, k - total_a);
    }
}

/* The CCA convolution's output channel c at new row t of block b (of T rows, C channels), by one warp: the k1
 * depthwise rows it reads for c's group, M(t + d) for d < k1, into the warp's shared slice m [k1][dh] (each as
 * depthwise_fwd_kernel sums it: b0, then the taps in order, positions before the block's start skipped), then the
 * group's dh·k1 products split over the lanes in w1's order, a warp butterfly, + b1. */
constexpr int CD_WARPS = 8, CD_MAX_TAPS = 4;
__device__ __forceinline__ void conv_decode_channel(float *Y, const float *X, const float *w0, const float *b0,
                                                    const float *w1, const float *b1, int c, int b, int t, int T,
                                                    int C, int dh, int k0, int k1, float *m) {
    const int lane = threadIdx.x % GPU_WARP, g0 = c / dh * dh;
    for (int d = 0; d < k1; d++) {
        const int t0 = t + d - (k1 - 1) - (k0 - 1); /* M row t + d is time t + d - (k1 - 1) */
        for (int i = lane; i < dh; i += GPU_WARP) {
            const int ch = g0 + i;
            float v = b0[ch];
            for (int j = 0; j < k0; j++)
                if (t0 + j >= 0) v = __fadd_rn(v, __fmul_rn(w0[(long)ch * k0 + j], X[((long)b * T + t0 + j) * C + ch]));
            m[d * dh + i] = v;
        }
    }
    gk_syncwarp();
    const float *w = w1 + (long)c * dh * k1; /* [kidx][d] */
    float acc = 0.0f;
    for (int e = lane; e < dh * k1; e += GPU_WARP) acc = fmaf(w[e], m[(e % k1) * dh + e / k1], acc);
    acc = warp_sum(acc);
    if (lane == 0) Y[((long)b * T + t) * C + c] = __fadd_rn(b1[c], acc);
    gk_syncwarp(); /* m may be refilled right after */
}

/* Shared floats cca_rows_block needs: [G query heads | key] before the norm, then the key after it. */
__host__ __device__ inline int cca_rows_smem_floats(const GkCcaDecode &a) { return (a.Hq / a.Hkv + 2) * a.dh; }
/* Threads cca_rows_block's own launch has: G + 1 warps (it takes more: the element loops are per element). */
__host__ __device__ inline int cca_rows_threads(const GkCcaDecode &a) { return (a.Hq / a.Hkv + 1) * GPU_WARP; }

/* Row r, kv head j of gk_cca_decode_rows (the convolution state's copy apart: cca_state_copy): the q-k mean of j's
 * group into shared memory, then warp g < G norms and rotates query head j·G + g into the output and warp G the key
 * into shared memory, then the block appends k̂ and v (columns j·dh..) to the cache. Ends with a barrier. */
template <class KV> __device__ __forceinline__ void cca_rows_block(const GkCcaDecode &a, int r, int j, float *sm) {
    const int G = a.Hq / a.Hkv, dh = a.dh, warp = threadIdx.x / GPU_WARP;
    const int Cq = a.Hq * dh, Ck = a.Hkv * dh, C = Cq + Ck, half = Ck / 2, hr = a.rd / 2;
    float *qpre = sm, *kpre = sm + (long)G * dh, *khat = kpre + dh;
    const long in = a.xrow ? (long)a.xrow[r] : (long)(r / a.n) * a.TE + a.P + r % a.n;
    for (int i = threadIdx.x; i < dh; i += blockDim.x)
        qk_mean_at(a.Xe + in * C, a.Ye + in * C, j, i, G, dh, Cq, qpre, dh, kpre + i);
    __syncthreads();
    const long at = a.pos ? (long)a.pos[r] : r % a.n;
    const float *cs = a.cosv + at * hr, *sn = a.sinv + at * hr;
    if (warp < G)
        l2norm_rope_head(a.query + (long)r * Cq + (long)(j * G + warp) * dh, nullptr, qpre + (long)warp * dh, nullptr,
                         cs, sn, dh, hr, a.scale, a.eps);
    else if (warp == G)
        l2norm_rope_head(khat, nullptr, kpre, a.temp ? a.temp + j : nullptr, cs, sn, dh, hr, a.scale, a.eps);
    __syncthreads();
    const long kr = a.kv_row ? (long)a.kv_row[r] : (long)(r / a.n) * a.kv_seq + a.kv_p0 + r % a.n;
    KV *kd = (KV *)a.k_cache + kr * Ck + (long)j * dh, *vdst = (KV *)a.v_cache + kr * Ck + (long)j * dh;
    const int si = a.row_seq ? a.row_seq[r] : r / a.n;
    const long first = a.row_seq ? (long)a.seq_first[si] : (long)si * a.n;
    for (int i = threadIdx.x; i < dh; i += blockDim.x) {
        kv_store(kd + i, khat[i]);
        const int c = j * dh + i; /* value column: [vc | delayed vd] */
        float v;
        if (c < half) {
            v = a.vc[(long)r * half + c];
        } else if (r == first) { /* the slot's kept vd, read before this same thread replaces it */
            float *kept = a.vd_prev + (long)(a.row_seq ? a.seq_slot[si] : si) * a.slot_stride + (c - half);
            const long last = a.row_seq ? (long)a.seq_last[si] : first + a.n - 1;
            v = *kept;
            *kept = a.vd[last * half + (c - half)];
        } else {
            v = a.vd[(long)(r - 1) * half + (c - half)];
        }
        kv_store(vdst + i, v);
    }
    __syncthreads();
}
/* The convolution state's copy of gk_cca_decode_rows: elements first, first + stride, ... */
__device__ __forceinline__ void cca_state_copy(const GkCcaDecode &a, long first, long stride) {
    const long total = row_copy_total(a.state);
    for (long k = first; k < total; k += stride) copy_row_element<float>(a.state, k);
}

} // namespace decode_ops

#endif
