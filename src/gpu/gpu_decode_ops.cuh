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

constexpr int DA_WARPS = 8;
constexpr int DA_THREADS = DA_WARPS * GPU_WARP;
constexpr int DA_MAX_DH = 256;
constexpr int DA_MAX_PER_LANE = DA_MAX_DH / GPU_WARP;
constexpr int DA_PER_LANE_128 = 128 / GPU_WARP; /* head dims up to 128 take the form with fewer registers */
/* Shared floats attend_query needs: the query, each warp's max and sum, each warp's output, the last-piece flag. */
constexpr int DA_SMEM_FLOATS = DA_MAX_DH + 2 * DA_WARPS + DA_WARPS * DA_MAX_DH + 4;

/* How a (row, head)'s keys are cut into pieces (gpu_kernels.h, GkAttnPieces): `size` keys a piece (the last may have
 * fewer), the smallest multiple of GK_ATTN_PIECE_KEYS that leaves at most GK_ATTN_PIECES pieces; one piece of all of
 * them without the scratch. A function of the key count alone, so every launch form cuts alike. */
struct KeyPieces {
    int size, n;
};
__host__ __device__ inline KeyPieces cut_keys(int keys, bool pieces) {
    if (!pieces || keys <= GK_ATTN_PIECE_KEYS) return {keys, 1};
    const int unit = GK_ATTN_PIECE_KEYS * GK_ATTN_PIECES, size = GK_ATTN_PIECE_KEYS * ((keys + unit - 1) / unit);
    return {size, (keys + size - 1) / size};
}

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

/* Keys a warp loads at once with PL dims a lane (its k̂ and v values: 2·KEYS·PL registers). */
template <int PL> struct WarpKeys {
    static constexpr int AT_ONCE = 16 / PL < 1 ? 1 : 16 / PL > 4 ? 4 : 16 / PL;
};

/* This warp's share of keys [first, end) for one query q (shared memory): keys first + warp·KEYS + j·DA_WARPS·KEYS and
 * the KEYS - 1 after each, their k̂ and v rows loaded together (a round costs one memory latency, not one a key), into
 * an online softmax: the warp's running max m, sum l and output acc (lane l holds dims l, l + GPU_WARP, ...). */
template <int PL, class Keys, class KV>
__device__ __forceinline__ void warp_keys(const float *q, const KV *K, const KV *V, Keys key, int first, int end,
                                          int dh, float scale, float &m, float &l, float (&acc)[PL]) {
    constexpr int KEYS = WarpKeys<PL>::AT_ONCE;
    const int lane = threadIdx.x % GPU_WARP, warp = threadIdx.x / GPU_WARP;
    float qv[PL];
#pragma unroll
    for (int p = 0; p < PL; p++) qv[p] = lane + p * GPU_WARP < dh ? q[lane + p * GPU_WARP] : 0.0f;
    for (int base = first + warp * KEYS; base < end; base += DA_WARPS * KEYS) {
        float kx[KEYS][PL], vx[KEYS][PL];
#pragma unroll
        for (int k = 0; k < KEYS; k++) {
            const bool valid = base + k < end;
            const long at = valid ? key(base + k) : 0;
#pragma unroll
            for (int p = 0; p < PL; p++) {
                const int i = lane + p * GPU_WARP;
                kx[k][p] = valid && i < dh ? kv_value(K + at + i) : 0.0f;
                vx[k][p] = valid && i < dh ? kv_value(V + at + i) : 0.0f;
            }
        }
        float dot[KEYS];
#pragma unroll
        for (int k = 0; k < KEYS; k++) {
            float d = 0.0f;
#pragma unroll
            for (int p = 0; p < PL; p++) d += qv[p] * kx[k][p];
            dot[k] = d;
        }
#pragma unroll
        for (int k = 0; k < KEYS; k++) dot[k] = warp_sum(dot[k]) * scale;
        float m_new = m;
#pragma unroll
        for (int k = 0; k < KEYS; k++)
            if (base + k < end) m_new = fmaxf(m_new, dot[k]);
        const float corr = expf(m - m_new); /* base < end: key base is there, m_new is finite */
        l *= corr;
#pragma unroll
        for (int p = 0; p < PL; p++) acc[p] *= corr;
#pragma unroll
        for (int k = 0; k < KEYS; k++)
            if (base + k < end) {
                const float e = expf(dot[k] - m_new);
                l += e;
#pragma unroll
                for (int p = 0; p < PL; p++) acc[p] += e * vx[k][p];
            }
        m = m_new;
    }
}

/* One query row (qrow) of one head over keys first..last, pieces z, z + Z, ... of their cut (cut_keys; part NULL: one
 * piece, which block z 0 takes). Each piece by the block's first DA_WARPS warps (warp_keys), their results combined in warp
 * order. One piece: the output row itself. Several: each piece's unnormalised output, max and sum into part
 * [n][dh + 2]; the block whose release add on *count completes the n-th piece combines them, in piece order, into
 * orow and leaves *count zero. sm: DA_SMEM_FLOATS. Ends with a barrier (the block's threads all take it, or none). */
template <int PL, class Keys, class KV>
__device__ __forceinline__ void attend_query(float *orow, const float *qrow, const KV *K, const KV *V, Keys key,
                                             int first, int last, int dh, float scale, float *part, unsigned *count,
                                             int z, int Z, float *sm) {
    const int lane = threadIdx.x % GPU_WARP, warp = threadIdx.x / GPU_WARP;
    float *q = sm, *wm = q + DA_MAX_DH, *wl = wm + DA_WARPS, *wo = wl + DA_WARPS; /* wo [DA_WARPS][DA_MAX_DH] */
    unsigned *combine = reinterpret_cast<unsigned *>(wo + DA_WARPS * DA_MAX_DH);
    const KeyPieces cut = cut_keys(last - first + 1, part != nullptr);
    if (z >= cut.n) return;
    for (int i = threadIdx.x; i < dh; i += blockDim.x) q[i] = qrow[i];
    __syncthreads();
    for (int piece = z; piece < cut.n; piece += Z) {
        const int from = first + piece * cut.size, end = min(last + 1, from + cut.size);
        if (warp < DA_WARPS) {
            float m = -INFINITY, l = 0.0f, acc[PL];
#pragma unroll
            for (int p = 0; p < PL; p++) acc[p] = 0.0f;
            warp_keys<PL>(q, K, V, key, from, end, dh, scale, m, l, acc);
            if (lane == 0) wm[warp] = m, wl[warp] = l;
#pragma unroll
            for (int p = 0; p < PL; p++)
                if (lane + p * GPU_WARP < dh) wo[warp * DA_MAX_DH + lane + p * GPU_WARP] = acc[p];
        }
        __syncthreads();
        float M = -INFINITY;
        for (int w = 0; w < DA_WARPS; w++) M = fmaxf(M, wm[w]);
        float L = 0.0f;
        for (int w = 0; w < DA_WARPS; w++) L += wm[w] == -INFINITY ? 0.0f : wl[w] * expf(wm[w] - M);
        float *out = cut.n == 1 ? orow : part + (long)piece * (dh + 2);
        for (int i = threadIdx.x; i < dh; i += blockDim.x) {
            float o = 0.0f;
            for (int w = 0; w < DA_WARPS; w++)
                if (wm[w] != -INFINITY) o += wo[w * DA_MAX_DH + i] * expf(wm[w] - M);
            out[i] = cut.n == 1 ? o / L : o;
        }
        if (cut.n > 1 && threadIdx.x == 0) out[dh] = M, out[dh + 1] = L;
        __syncthreads(); /* the piece is written; wm, wl, wo are free again */
        if (cut.n == 1) continue;
        if (threadIdx.x == 0) {
            const bool done = gk_atomic_add_release(count, 1u) == (unsigned)cut.n - 1;
            if (done) { /* every piece's release add is before this acquire: their writes are visible */
                (void)gk_load_acquire(count);
                *count = 0u;
            }
            *combine = done;
        }
        __syncthreads();
        if (!*combine) continue;
        float MP = -INFINITY, LP = 0.0f;
        for (int p = 0; p < cut.n; p++) MP = fmaxf(MP, part[(long)p * (dh + 2) + dh]);
        for (int p = 0; p < cut.n; p++)
            LP += part[(long)p * (dh + 2) + dh + 1] * expf(part[(long)p * (dh + 2) + dh] - MP);
        for (int i = threadIdx.x; i < dh; i += blockDim.x) {
            float o = 0.0f;
            for (int p = 0; p < cut.n; p++)
                o += part[(long)p * (dh + 2) + i] * expf(part[(long)p * (dh + 2) + dh] - MP);
            orow[i] = o / LP;
        }
    }
    __syncthreads();
}

/* attend_query in the form dh takes. */
template <class Keys, class KV>
__device__ __forceinline__ void attend_query_dh(float *orow, const float *qrow, const KV *K, const KV *V, Keys key,
                                                int first, int last, int dh, float scale, float *part,
                                                unsigned *count, int z, int Z, float *sm) {
    if (dh <= DA_PER_LANE_128 * GPU_WARP)
        attend_query<DA_PER_LANE_128>(orow, qrow, K, V, key, first, last, dh, scale, part, count, z, Z, sm);
    else
        attend_query<DA_MAX_PER_LANE>(orow, qrow, K, V, key, first, last, dh, scale, part, count, z, Z, sm);
}
/* Row `slot`'s (row·Hq + h) piece scratch, or NULL without it. */
__device__ __forceinline__ float *piece_part(const GkAttnPieces &ap, long slot, int dh) {
    return ap.partial ? ap.partial + slot * GK_ATTN_PIECES * (dh + 2) : nullptr;
}

/* Query t of sequence b, head h, of the same-length cache [B, max_len, Hkv·dh] (n new rows a sequence at p0..):
 * pieces z, z + Z, ... of its keys. */
template <class KV>
__device__ __forceinline__ void attend_contiguous(float *O, const float *Q, const KV *Kc, const KV *Vc, int t, int h,
                                                  int b, int n, int p0, int max_len, int Hq, int Hkv, int dh,
                                                  float scale, int window, const GkAttnPieces &ap, int z, int Z,
                                                  float *sm) {
    const int G = Hq / Hkv, j = h / G, Cq = Hq * dh, Ck = Hkv * dh;
    const int last = p0 + t; /* sees keys 0..last, or last-window+1..last in a sliding layer */
    const int first = window > 0 && last - window + 1 > 0 ? last - window + 1 : 0;
    const long row = (long)b * n + t, slot = row * Hq + h;
    attend_query_dh(O + row * Cq + (long)h * dh, Q + row * Cq + (long)h * dh, Kc, Vc,
                    ContiguousKeys{(long)b * max_len * Ck + (long)j * dh, Ck}, first, last, dh, scale,
                    piece_part(ap, slot, dh), ap.count ? ap.count + slot : nullptr, z, Z, sm);
}
/* Row r of a ragged batch, head h: its sequence row_seq[r] at position row_pos[r]; key s of that sequence is row
 * table[seq, s / bt]·bt + s % bt of the pool's Kp / Vp [n_blocks·bt, Hkv·dh]. Pieces z, z + Z, ... of its keys. */
template <class KV>
__device__ __forceinline__ void attend_paged(float *O, const float *Q, const KV *Kp, const KV *Vp,
                                             const int32_t *row_seq, const int32_t *row_pos, const int32_t *table,
                                             int max_blocks, int bt, int r, int h, int Hq, int Hkv, int dh, float scale,
                                             int window, const GkAttnPieces &ap, int z, int Z, float *sm) {
    const int G = Hq / Hkv, j = h / G, Cq = Hq * dh, Ck = Hkv * dh;
    const int last = row_pos[r];
    const int first = window > 0 && last - window + 1 > 0 ? last - window + 1 : 0;
    const long slot = (long)r * Hq + h;
    attend_query_dh(O + (long)r * Cq + (long)h * dh, Q + (long)r * Cq + (long)h * dh, Kp, Vp,
                    PagedKeys{table + (long)row_seq[r] * max_blocks, bt, Ck, (long)j * dh}, first, last, dh, scale,
                    piece_part(ap, slot, dh), ap.count ? ap.count + slot : nullptr, z, Z, sm);
}

/* Element k of a GkRowCopy (rows through optional index lists; row k / len, column k % len; a row whose destination
 * index is negative is skipped). */
template <class T> __device__ __forceinline__ void copy_row_element(const GkRowCopy &c, long k) {
    const long r = k / c.len, i = k % c.len;
    const long d = c.dst_idx ? c.dst_idx[r] : r, o = c.src_idx ? c.src_idx[r] : r;
    if (d >= 0) kv_store((T *)c.dst + d * c.dst_stride + i, c.src[o * c.src_stride + i]);
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
