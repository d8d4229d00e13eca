/* Kernels of cached decoding on the GPU (gpu_decode.c): attention of a few new queries over the KV cache, the
 * strided row copies that move rows in and out of the cache and the convolution state (two in one launch where a
 * step moves two), and a step's CCA after the convolution in one launch (gk_cca_decode_rows). The cache holds k̂ / v
 * as fp32 or as bf16 (--kv-dtype bf16: rounded nearest-even when appended, widened exactly when read; scores, softmax
 * and sums stay fp32), one template each. Launched through GK_LAUNCH_PDL (a decoding step's chain of small kernels), so
 * tests/gpu/emu runs this file on the CPU. */
#include "gpu_common.cuh"
#include "gpu_cca_rows.cuh"
#include "gpu_kernels.h"

#define DA_WARPS 4
#define DA_MAX_PER_LANE (256 / GPU_WARP) /* head_dim <= 256 */

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

/* One query row of one head (a block of DA_WARPS warps) over keys first..last: each warp walks every DA_WARPS-th
 * key with an online softmax (its own max, sum and output accumulator); the warps' partial results are then combined
 * in a fixed order, so the result does not depend on scheduling. Lane l holds output dims l, l+GPU_WARP, ... (32 on
 * NVIDIA, 64 on AMD). */
/* A cached k̂ / v element as fp32: as stored, or a bf16 one widened. */
__device__ __forceinline__ float kv_value(const float *p) { return *p; }
__device__ __forceinline__ float kv_value(const uint16_t *p) { return gk_bf16_float(*p); }

template <class Keys, class KV>
__device__ __forceinline__ void attend_query(float *orow, const float *qrow, const KV *K, const KV *V, Keys key,
                                             int first, int last, int dh, float scale) {
    const int lane = threadIdx.x % GPU_WARP, warp = threadIdx.x / GPU_WARP;
    __shared__ float q[256];
    __shared__ float wm[DA_WARPS], wl[DA_WARPS];
    __shared__ float wo[DA_WARPS][256];
    for (int i = threadIdx.x; i < dh; i += blockDim.x) q[i] = qrow[i];
    __syncthreads();
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
    {
        int k = 0;
        for (int i = lane; i < dh; i += GPU_WARP, k++) wo[warp][i] = acc[k];
    }
    __syncthreads();
    float M = -INFINITY;
    for (int w = 0; w < DA_WARPS; w++) M = fmaxf(M, wm[w]);
    float L = 0.0f;
    for (int w = 0; w < DA_WARPS; w++) L += wm[w] == -INFINITY ? 0.0f : wl[w] * expf(wm[w] - M);
    for (int i = threadIdx.x; i < dh; i += blockDim.x) {
        float o = 0.0f;
        for (int w = 0; w < DA_WARPS; w++)
            if (wm[w] != -INFINITY) o += wo[w][i] * expf(wm[w] - M);
        orow[i] = o / L;
    }
}

/* One block per (new query t, head h, sequence b) of the same-length cache [B, max_len, Hkv·dh]. */
template <class KV>
__global__ void decode_attention_kernel(float *O, const float *Q, const KV *Kc, const KV *Vc, int n, int p0,
                                        int max_len, int Hq, int Hkv, int dh, float scale, int window) {
    gk_pdl_enter();
    const int t = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int G = Hq / Hkv, j = h / G, Cq = Hq * dh, Ck = Hkv * dh;
    const int last = p0 + t; /* sees keys 0..last, or last-window+1..last in a sliding layer */
    const int first = window > 0 && last - window + 1 > 0 ? last - window + 1 : 0;
    const long row = (long)b * n + t;
    attend_query(O + row * Cq + (long)h * dh, Q + row * Cq + (long)h * dh, Kc, Vc,
                 ContiguousKeys{(long)b * max_len * Ck + (long)j * dh, Ck}, first, last, dh, scale);
}

template <class KV>
static void decode_attention(GkStream s, float *O, const float *Q, const KV *Kc, const KV *Vc, int B, int n, int p0,
                             int max_len, int Hq, int Hkv, int dh, int window) {
    if (B <= 0 || n <= 0 || dh <= 0 || dh > 256 || Hkv <= 0 || Hq % Hkv) return;
    const float scale = (float)(1.0 / sqrt((double)dh)); /* as cached_attention */
    dim3 grid(n, Hq, B);
    GK_LAUNCH_PDL((decode_attention_kernel<KV>), grid, DA_WARPS * GPU_WARP, 0, s, O, Q, Kc, Vc, n, p0, max_len, Hq, Hkv,
                  dh, scale, window);
}
extern "C" void gk_decode_attention(GkStream s, float *O, const float *Q, const float *Kc, const float *Vc, int B,
                                    int n, int p0, int max_len, int Hq, int Hkv, int dh, int window) {
    decode_attention(s, O, Q, Kc, Vc, B, n, p0, max_len, Hq, Hkv, dh, window);
}
extern "C" void gk_decode_attention_bf16(GkStream s, float *O, const float *Q, const uint16_t *Kc, const uint16_t *Vc,
                                         int B, int n, int p0, int max_len, int Hq, int Hkv, int dh, int window) {
    decode_attention(s, O, Q, Kc, Vc, B, n, p0, max_len, Hq, Hkv, dh, window);
}

/* A row element stored as the destination holds it: fp32 as is, bf16 rounded nearest-even (zy_f32_to_bf16). */
__device__ __forceinline__ void kv_store(float *d, float x) { *d = x; }
__device__ __forceinline__ void kv_store(uint16_t *d, float x) { *d = gk_bf16_bits(x); }

/* Copies a, then b (GkRowCopy: rows through optional index lists), as one grid over both; every destination element
 * is written by one thread. */
template <class T> __device__ __forceinline__ void copy_row_element(const GkRowCopy &c, long k) {
    const long r = k / c.len, i = k % c.len;
    const long d = c.dst_idx ? c.dst_idx[r] : r, o = c.src_idx ? c.src_idx[r] : r;
    kv_store((T *)c.dst + d * c.dst_stride + i, c.src[o * c.src_stride + i]);
}
template <class T> __global__ void copy_rows_kernel(GkRowCopy a, GkRowCopy b, long total_a, long total) {
    gk_pdl_enter();
    for (long k = (long)blockIdx.x * blockDim.x + threadIdx.x; k < total; k += (long)gridDim.x * blockDim.x) {
        if (k < total_a)
            copy_row_element<T>(a, k);
        else
            copy_row_element<T>(b, k - total_a);
    }
}

template <class T> static void copy_rows2(GkStream s, GkRowCopy a, GkRowCopy b) {
    const long total_a = a.len > 0 && a.n > 0 ? a.len * a.n : 0;
    const long total = total_a + (b.len > 0 && b.n > 0 ? b.len * b.n : 0);
    if (total <= 0) return;
    GK_LAUNCH_PDL((copy_rows_kernel<T>), gk_blocks(total, 256), 256, 0, s, a, b, total_a, total);
}
static GkRowCopy row_copy(void *dst, long dst_stride, const int32_t *dst_idx, const float *src, long src_stride,
                          const int32_t *src_idx, long len, int n) {
    return GkRowCopy{dst, dst_stride, dst_idx, src, src_stride, src_idx, len, n};
}

extern "C" void gk_copy_rows(GkStream s, float *dst, long dst_stride, const float *src, long src_stride, long len,
                             int rows) {
    copy_rows2<float>(s, row_copy(dst, dst_stride, nullptr, src, src_stride, nullptr, len, rows), GkRowCopy{});
}

/* ---- a ragged batch over a block pool (gpu_model_decode_step) ------------------------------------------------ */

/* decode_attention_kernel for one row of a ragged batch: one block per (row r, head h). Row r belongs to the step's
 * sequence row_seq[r] and sits at position row_pos[r]; key s of that sequence is row table[seq, s / bt]·bt + s % bt
 * of the pool's Kp / Vp [n_blocks·bt, Hkv·dh]. Same arithmetic and fixed combining order (attend_query). */
template <class KV>
__global__ void paged_attention_kernel(float *O, const float *Q, const KV *Kp, const KV *Vp,
                                       const int32_t *row_seq, const int32_t *row_pos, const int32_t *table,
                                       int max_blocks, int bt, int Hq, int Hkv, int dh, float scale, int window) {
    gk_pdl_enter();
    const int r = blockIdx.x, h = blockIdx.y;
    const int G = Hq / Hkv, j = h / G, Cq = Hq * dh, Ck = Hkv * dh;
    const int last = row_pos[r];
    const int first = window > 0 && last - window + 1 > 0 ? last - window + 1 : 0;
    attend_query(O + (long)r * Cq + (long)h * dh, Q + (long)r * Cq + (long)h * dh, Kp, Vp,
                 PagedKeys{table + (long)row_seq[r] * max_blocks, bt, Ck, (long)j * dh}, first, last, dh, scale);
}

template <class KV>
static void paged_attention(GkStream s, float *O, const float *Q, const KV *Kp, const KV *Vp, const int32_t *row_seq,
                            const int32_t *row_pos, const int32_t *table, int max_blocks, int block_tokens, int N,
                            int Hq, int Hkv, int dh, int window) {
    if (N <= 0 || dh <= 0 || dh > 256 || Hkv <= 0 || Hq % Hkv || block_tokens <= 0) return;
    const float scale = (float)(1.0 / sqrt((double)dh)); /* as cached_attention */
    dim3 grid(N, Hq);
    GK_LAUNCH_PDL((paged_attention_kernel<KV>), grid, DA_WARPS * GPU_WARP, 0, s, O, Q, Kp, Vp, row_seq, row_pos, table,
                  max_blocks, block_tokens, Hq, Hkv, dh, scale, window);
}
extern "C" void gk_paged_decode_attention(GkStream s, float *O, const float *Q, const float *Kp, const float *Vp,
                                          const int32_t *row_seq, const int32_t *row_pos, const int32_t *table,
                                          int max_blocks, int block_tokens, int N, int Hq, int Hkv, int dh,
                                          int window) {
    paged_attention(s, O, Q, Kp, Vp, row_seq, row_pos, table, max_blocks, block_tokens, N, Hq, Hkv, dh, window);
}
extern "C" void gk_paged_decode_attention_bf16(GkStream s, float *O, const float *Q, const uint16_t *Kp,
                                               const uint16_t *Vp, const int32_t *row_seq, const int32_t *row_pos,
                                               const int32_t *table, int max_blocks, int block_tokens, int N, int Hq,
                                               int Hkv, int dh, int window) {
    paged_attention(s, O, Q, Kp, Vp, row_seq, row_pos, table, max_blocks, block_tokens, N, Hq, Hkv, dh, window);
}

extern "C" void gk_copy_rows_idx(GkStream s, float *dst, long dst_stride, const int32_t *dst_idx, const float *src,
                                 long src_stride, const int32_t *src_idx, long len, int n) {
    copy_rows2<float>(s, row_copy(dst, dst_stride, dst_idx, src, src_stride, src_idx, len, n), GkRowCopy{});
}
extern "C" void gk_copy_rows_idx2(GkStream s, GkRowCopy a, GkRowCopy b) { copy_rows2<float>(s, a, b); }
extern "C" void gk_copy_rows_idx2_bf16(GkStream s, GkRowCopy a, GkRowCopy b) { copy_rows2<uint16_t>(s, a, b); }

/* The CCA convolution's outputs at the new rows only (gk_cca_conv_decode): one warp an output channel c of one new row
 * (b, t): the k1 depthwise rows it reads for c's group, M(t + d) for d < k1, into the warp's shared slice (each as
 * depthwise_fwd_kernel sums it: b0, then the taps in order, positions before the block's start skipped), then the
 * group's dh·k1 products split over the lanes in w1's order, a warp butterfly, + b1. */
constexpr int CD_WARPS = 8, CD_MAX_TAPS = 4;
__global__ void __launch_bounds__(CD_WARPS *GPU_WARP)
    conv_decode_kernel(float *Y, const float *X, const float *w0, const float *b0, const float *w1, const float *b1,
                       int T, int P, int C, int dh, int k0, int k1) {
    GK_DYNAMIC_SMEM_T(float, sm); /* [warp][k1][dh] */
    gk_pdl_enter();
    const int lane = threadIdx.x % GPU_WARP, warp = threadIdx.x / GPU_WARP, n_new = T - P;
    const int c = blockIdx.x * CD_WARPS + warp, b = blockIdx.y / n_new, t = P + blockIdx.y % n_new;
    if (c >= C) return; /* the whole warp */
    const int g0 = c / dh * dh;
    float *m = sm + (long)warp * k1 * dh;
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
}

extern "C" int gk_cca_conv_decode(GkStream s, float *Y, const float *X, const float *w0, const float *b0,
                                  const float *w1, const float *b1, int B, int T, int P, int C, int dh, int k0, int k1) {
    if (B <= 0 || P < 0 || T <= P || C <= 0 || dh <= 0 || C % dh || k0 < 1 || k1 < 1 || k1 > CD_MAX_TAPS ||
        dh > 256 || (long)B * (T - P) > 65535)
        return -1;
    const dim3 grid((unsigned)((C + CD_WARPS - 1) / CD_WARPS), (unsigned)(B * (T - P)));
    GK_LAUNCH_PDL(conv_decode_kernel, grid, CD_WARPS * GPU_WARP, (size_t)CD_WARPS * k1 * dh * sizeof(float), s, Y, X,
                  w0, b0, w1, b1, T, P, C, dh, k0, k1);
    GK_LAUNCH_CHECK();
    return 0;
}

/* One block a (row r, kv head j), G + 1 warps: the q-k mean of j's group into shared memory, then warp g < G norms and
 * rotates query head j·G + g into the output and warp G the key into shared memory, then the block appends k̂ and v
 * (columns j·dh..) to the cache; the convolution state's copy is spread over the whole grid. */
template <class KV> __global__ void cca_decode_rows_kernel(GkCcaDecode a) {
    GK_DYNAMIC_SMEM_T(float, sm); /* [G query heads | key] before the norm, then the key after it: (G + 2)·dh */
    gk_pdl_enter();
    const int r = blockIdx.x, j = blockIdx.y, G = a.Hq / a.Hkv, dh = a.dh, warp = threadIdx.x / GPU_WARP;
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
    const long total = a.state.len > 0 && a.state.n > 0 ? a.state.len * a.state.n : 0;
    const long threads = (long)gridDim.x * gridDim.y * blockDim.x;
    for (long k = ((long)blockIdx.y * gridDim.x + blockIdx.x) * blockDim.x + threadIdx.x; k < total; k += threads)
        copy_row_element<float>(a.state, k);
}

extern "C" void gk_cca_decode_rows(GkStream s, const GkCcaDecode *a) {
    if (a->N <= 0 || a->dh <= 0 || a->Hkv <= 0 || a->Hq % a->Hkv || a->Hq / a->Hkv > 31 ||
        (!a->row_seq && a->n <= 0))
        return;
    const dim3 grid((unsigned)a->N, (unsigned)a->Hkv);
    const int threads = (a->Hq / a->Hkv + 1) * GPU_WARP;
    const size_t smem = (size_t)(a->Hq / a->Hkv + 2) * a->dh * sizeof(float);
    if (a->kv_bf16)
        GK_LAUNCH_PDL(cca_decode_rows_kernel<uint16_t>, grid, threads, smem, s, *a);
    else
        GK_LAUNCH_PDL(cca_decode_rows_kernel<float>, grid, threads, smem, s, *a);
    GK_LAUNCH_CHECK();
}
