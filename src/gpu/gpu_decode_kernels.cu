/* Kernels of cached decoding on the GPU (gpu_decode.c): attention of a few new queries over the KV cache, the
 * strided row copies that move rows in and out of the cache and the convolution state (two in one launch where a
 * step moves two), the convolution at the new rows only, and a step's CCA after the convolution in one launch
 * (gk_cca_decode_rows). Their bodies are gpu_decode_ops.cuh's, shared with the layer's persistent kernel
 * (gpu_decode_layer.cu). Launched through GK_LAUNCH_PDL (a decoding step's chain of small kernels), so tests/gpu/emu
 * runs this file on the CPU. */
#include "gpu_common.cuh"
#include "gpu_decode_ops.cuh"
#include "gpu_kernels.h"

namespace {
using namespace decode_ops;

/* Blocks a (row, head) that share its key pieces: every piece its own block where the (row, head)s leave room on the
 * GPU, fewer (each taking several in turn) as they fill it. Which block takes a piece does not change a bit. */
int piece_blocks(long rows_heads, int max_pieces) {
    long z = GK_ATTN_PIECE_ROWS_HEADS / (rows_heads > 0 ? rows_heads : 1);
    if (z > max_pieces) z = max_pieces;
    return z < 1 ? 1 : (int)z;
}

/* Block (row, head h, z) of the same-length cache's n new rows a sequence (row = b·n + t): pieces z, z + gridDim.z,
 * ... of the row's keys. */
template <class KV>
__global__ void __launch_bounds__(DA_THREADS)
    decode_attention_kernel(float *O, const float *Q, const KV *Kc, const KV *Vc, int n, int p0, int max_len, int Hq,
                            int Hkv, int dh, float scale, int window, GkAttnPieces ap) {
    __shared__ float sm[DA_SMEM_FLOATS];
    gk_pdl_enter();
    attend_contiguous(O, Q, Kc, Vc, blockIdx.x % n, blockIdx.y, blockIdx.x / n, n, p0, max_len, Hq, Hkv, dh, scale,
                      window, ap, blockIdx.z, gridDim.z, sm);
}

template <class KV>
void decode_attention(GkStream s, float *O, const float *Q, const KV *Kc, const KV *Vc, int B, int n, int p0,
                      int max_len, int Hq, int Hkv, int dh, int window, GkAttnPieces ap) {
    if (B <= 0 || n <= 0 || dh <= 0 || dh > DA_MAX_DH || Hkv <= 0 || Hq % Hkv) return;
    const float scale = (float)(1.0 / sqrt((double)dh)); /* as cached_attention */
    if ((long)B * n * Hq > GK_ATTN_PIECE_ROWS_HEADS) ap = GkAttnPieces{}; /* the (row, head)s fill the GPU */
    const int keys = window > 0 && window < p0 + n ? window : p0 + n;   /* the last row's, the most */
    const int pieces = cut_keys(keys, ap.partial != nullptr).n;
    dim3 grid((unsigned)(B * n), Hq, piece_blocks((long)B * n * Hq, pieces));
    GK_LAUNCH_PDL((decode_attention_kernel<KV>), grid, DA_THREADS, 0, s, O, Q, Kc, Vc, n, p0, max_len, Hq, Hkv, dh,
                  scale, window, ap);
}

/* Copies a, then b, as one grid over both; every destination element is written by one thread. */
template <class T> __global__ void copy_rows_kernel(GkRowCopy a, GkRowCopy b, long total_a, long total) {
    gk_pdl_enter();
    copy_rows_range<T>(a, b, total_a, total, (long)blockIdx.x * blockDim.x + threadIdx.x, (long)gridDim.x * blockDim.x);
}

template <class T> void copy_rows2(GkStream s, GkRowCopy a, GkRowCopy b) {
    const long total_a = row_copy_total(a), total = total_a + row_copy_total(b);
    if (total <= 0) return;
    GK_LAUNCH_PDL((copy_rows_kernel<T>), gk_blocks(total, 256), 256, 0, s, a, b, total_a, total);
}
GkRowCopy row_copy(void *dst, long dst_stride, const int32_t *dst_idx, const float *src, long src_stride,
                   const int32_t *src_idx, long len, int n) {
    return GkRowCopy{dst, dst_stride, dst_idx, src, src_stride, src_idx, len, n};
}

/* decode_attention_kernel for one row of a ragged batch: block (row r, head h, z). The rows' lengths are on the
 * device (and a captured graph replays other lengths), so the grid takes the most pieces any row can have. */
template <class KV>
__global__ void __launch_bounds__(DA_THREADS)
    paged_attention_kernel(float *O, const float *Q, const KV *Kp, const KV *Vp, const int32_t *row_seq,
                           const int32_t *row_pos, const int32_t *table, int max_blocks, int bt, int Hq, int Hkv,
                           int dh, float scale, int window, GkAttnPieces ap) {
    __shared__ float sm[DA_SMEM_FLOATS];
    gk_pdl_enter();
    attend_paged(O, Q, Kp, Vp, row_seq, row_pos, table, max_blocks, bt, blockIdx.x, blockIdx.y, Hq, Hkv, dh, scale,
                 window, ap, blockIdx.z, gridDim.z, sm);
}

template <class KV>
void paged_attention(GkStream s, float *O, const float *Q, const KV *Kp, const KV *Vp, const int32_t *row_seq,
                     const int32_t *row_pos, const int32_t *table, int max_blocks, int block_tokens, int N, int Hq,
                     int Hkv, int dh, int window, GkAttnPieces ap) {
    if (N <= 0 || dh <= 0 || dh > DA_MAX_DH || Hkv <= 0 || Hq % Hkv || block_tokens <= 0) return;
    const float scale = (float)(1.0 / sqrt((double)dh)); /* as cached_attention */
    if ((long)N * Hq > GK_ATTN_PIECE_ROWS_HEADS) ap = GkAttnPieces{}; /* the (row, head)s fill the GPU */
    const long most = (long)max_blocks * block_tokens;                /* a sequence's keys at most */
    const int keys = window > 0 && window < most ? window : (int)(most < (1L << 30) ? most : 1L << 30);
    dim3 grid(N, Hq, piece_blocks((long)N * Hq, cut_keys(keys, ap.partial != nullptr).n));
    GK_LAUNCH_PDL((paged_attention_kernel<KV>), grid, DA_THREADS, 0, s, O, Q, Kp, Vp, row_seq, row_pos, table,
                  max_blocks, block_tokens, Hq, Hkv, dh, scale, window, ap);
}

/* One warp an output channel of one new row (b, t). */
__global__ void __launch_bounds__(CD_WARPS *GPU_WARP)
    conv_decode_kernel(float *Y, const float *X, const float *w0, const float *b0, const float *w1, const float *b1,
                       int T, int P, int C, int dh, int k0, int k1) {
    GK_DYNAMIC_SMEM_T(float, sm); /* [warp][k1][dh] */
    gk_pdl_enter();
    const int warp = threadIdx.x / GPU_WARP, n_new = T - P;
    const int c = blockIdx.x * CD_WARPS + warp, b = blockIdx.y / n_new, t = P + blockIdx.y % n_new;
    if (c < C) /* the whole warp */
        conv_decode_channel(Y, X, w0, b0, w1, b1, c, b, t, T, C, dh, k0, k1, sm + (long)warp * k1 * dh);
}

/* One block a (row r, kv head j), G + 1 warps; the convolution state's copy spread over the whole grid. */
template <class KV> __global__ void cca_decode_rows_kernel(GkCcaDecode a) {
    GK_DYNAMIC_SMEM_T(float, sm);
    gk_pdl_enter();
    cca_rows_block<KV>(a, blockIdx.x, blockIdx.y, sm);
    cca_state_copy(a, ((long)blockIdx.y * gridDim.x + blockIdx.x) * blockDim.x + threadIdx.x,
                   (long)gridDim.x * gridDim.y * blockDim.x);
}

} // namespace

extern "C" void gk_decode_attention(GkStream s, float *O, const float *Q, const float *Kc, const float *Vc, int B,
                                    int n, int p0, int max_len, int Hq, int Hkv, int dh, int window, GkAttnPieces ap) {
    decode_attention(s, O, Q, Kc, Vc, B, n, p0, max_len, Hq, Hkv, dh, window, ap);
}
extern "C" void gk_decode_attention_bf16(GkStream s, float *O, const float *Q, const uint16_t *Kc, const uint16_t *Vc,
                                         int B, int n, int p0, int max_len, int Hq, int Hkv, int dh, int window,
                                         GkAttnPieces ap) {
    decode_attention(s, O, Q, Kc, Vc, B, n, p0, max_len, Hq, Hkv, dh, window, ap);
}

extern "C" void gk_copy_rows(GkStream s, float *dst, long dst_stride, const float *src, long src_stride, long len,
                             int rows) {
    copy_rows2<float>(s, row_copy(dst, dst_stride, nullptr, src, src_stride, nullptr, len, rows), GkRowCopy{});
}
extern "C" void gk_copy_rows_idx(GkStream s, float *dst, long dst_stride, const int32_t *dst_idx, const float *src,
                                 long src_stride, const int32_t *src_idx, long len, int n) {
    copy_rows2<float>(s, row_copy(dst, dst_stride, dst_idx, src, src_stride, src_idx, len, n), GkRowCopy{});
}
extern "C" void gk_copy_rows_idx2(GkStream s, GkRowCopy a, GkRowCopy b) { copy_rows2<float>(s, a, b); }
extern "C" void gk_copy_rows_idx2_bf16(GkStream s, GkRowCopy a, GkRowCopy b) { copy_rows2<uint16_t>(s, a, b); }

extern "C" void gk_paged_decode_attention(GkStream s, float *O, const float *Q, const float *Kp, const float *Vp,
                                          const int32_t *row_seq, const int32_t *row_pos, const int32_t *table,
                                          int max_blocks, int block_tokens, int N, int Hq, int Hkv, int dh,
                                          int window, GkAttnPieces ap) {
    paged_attention(s, O, Q, Kp, Vp, row_seq, row_pos, table, max_blocks, block_tokens, N, Hq, Hkv, dh, window, ap);
}
extern "C" void gk_paged_decode_attention_bf16(GkStream s, float *O, const float *Q, const uint16_t *Kp,
                                               const uint16_t *Vp, const int32_t *row_seq, const int32_t *row_pos,
                                               const int32_t *table, int max_blocks, int block_tokens, int N, int Hq,
                                               int Hkv, int dh, int window, GkAttnPieces ap) {
    paged_attention(s, O, Q, Kp, Vp, row_seq, row_pos, table, max_blocks, block_tokens, N, Hq, Hkv, dh, window, ap);
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

extern "C" void gk_cca_decode_rows(GkStream s, const GkCcaDecode *a) {
    if (a->N <= 0 || a->dh <= 0 || a->Hkv <= 0 || a->Hq % a->Hkv || a->Hq / a->Hkv > 31 ||
        (!a->row_seq && a->n <= 0))
        return;
    const dim3 grid((unsigned)a->N, (unsigned)a->Hkv);
    const int threads = cca_rows_threads(*a);
    const size_t smem = (size_t)cca_rows_smem_floats(*a) * sizeof(float);
    if (a->kv_bf16)
        GK_LAUNCH_PDL(cca_decode_rows_kernel<uint16_t>, grid, threads, smem, s, *a);
    else
        GK_LAUNCH_PDL(cca_decode_rows_kernel<float>, grid, threads, smem, s, *a);
    GK_LAUNCH_CHECK();
}
