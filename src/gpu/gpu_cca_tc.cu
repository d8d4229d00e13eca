/* gpu_cca_tc: the CCA grouped convolution's two products on tensor cores, for bf16 runs (gk_cca_conv_gemm_tc,
 * gpu_kernels.h; gpu_cca.cu's gk_cca_conv_forward_bf16 / gk_cca_conv_backward_bf16 call it). The same products as
 * gpu_cca.cu's fp32 conv_gemm_kernel, with bf16 operands (rounded nearest-even as they are staged) and fp32 sums:
 *   forward : Y[b·T+t][g·dh+n] = b1[g·dh+n] + Σ_j Σ_d M[e+j][g·dh+d] · w1[g·dh+n, d, j]       (e = b·TM + t, t < T)
 *   backward: dM[e][g·dh+i]    = Σ_j Σ_o dE[e−j][g·dh+o] · w1[g·dh+o, i, j]   (dE[b·TM + t] = dY[b·T + t], t < T; else 0)
 * Both are a GEMM over (channel, tap) whose A rows are the source rows shifted by the tap: a block stages the source
 * rows of its 128 output rows plus the K1 − 1 halo rows once per 16 channels, and each tap's fragments start that many
 * rows further down the same staged tile. Block: 128 rows × 128 channels of one group, 8 warps (4 × 2; 4 × 1 with
 * 64-lane wavefronts). Fixed summation order: the same bits on every run. */
#include <stdint.h>

#include "gpu_common.cuh"
#include "gpu_kernels.h"
#include "gpu_tc.cuh"

namespace {

constexpr int CT_BM = 128, CT_BN = 128, CT_BK = 16, CT_THREADS = 256, CT_MAX_K1 = 4;
constexpr int CT_WARPS = CT_THREADS / GPU_WARP, CT_WARPS_N = CT_WARPS / 4, CT_WN = CT_BN / CT_WARPS_N;
constexpr int CT_FM = 2, CT_FN = CT_WN / 16; /* fragments a warp: 32 rows x CT_WN channels */

template <int K1>
struct ConvTcShared {
    __align__(32) uint16_t As[(CT_BM + K1 - 1) * CT_BK]; /* source rows x 16 channels */
    __align__(32) uint16_t Bs[K1][CT_BN * CT_BK];        /* per tap offset d: [n][k] */
    __align__(32) float Cs[CT_WARPS][16 * 16];           /* a warp's fragment on its way out */
};

template <int K1, bool BWD>
__global__ void __launch_bounds__(CT_THREADS)
    conv_tc_kernel(float *__restrict__ out, const float *__restrict__ src, const float *__restrict__ w1,
                   const float *__restrict__ b1, int B, int T, int C, int dh, int ntn) {
    gk_pdl_enter();
#if TC_ARCH_OK
    constexpr int AROWS = CT_BM + K1 - 1;
    __shared__ ConvTcShared<K1> sh;
    uint16_t *As = sh.As;
    float(*Cs)[16 * 16] = sh.Cs;
    const int TM = T + K1 - 1;
    const long R = (long)B * TM;
    const int tid = threadIdx.x, lane = tid % GPU_WARP, warp = tid / GPU_WARP;
    const int wm = warp % 4, wn = warp / 4;
    const int groups = C / dh, gnt = groups * ntn;
    const int gn = (int)(blockIdx.x % gnt), g = gn / ntn, n0 = (gn % ntn) * CT_BN;
    const long e0 = (long)(blockIdx.x / gnt) * CT_BM;
    const long col0 = (long)g * dh;
    const long base = BWD ? e0 - (K1 - 1) : e0; /* staged row 0 */

    tc::C acc[CT_FM][CT_FN];
#pragma unroll
    for (int i = 0; i < CT_FM; i++)
#pragma unroll
        for (int j = 0; j < CT_FN; j++) tc::zero(acc[i][j]);

    for (int kc = 0; kc < dh; kc += CT_BK) {
        /* A: staged row r is source row base + r (forward: M, zero past the end; backward: dE) */
        for (int idx = tid; idx < AROWS * CT_BK; idx += CT_THREADS) {
            const int r = idx / CT_BK, c = idx % CT_BK;
            const long e = base + r;
            float v = 0.0f;
            if (e >= 0 && e < R) {
                if (!BWD) {
                    v = src[e * C + col0 + kc + c];
                } else {
                    const long b = e / TM;
                    const int t = (int)(e - b * TM);
                    if (t < T) v = src[(b * T + t) * C + col0 + kc + c];
                }
            }
            As[idx] = gk_bf16_bits(v);
        }
        /* B: tap offset d's tile, Bs[d][n][k]; forward w1[g·dh+n, k, d] (k and d consecutive in memory), backward
         * w1[g·dh+k, n, K1−1−d] (n and the tap consecutive) */
        for (int idx = tid; idx < K1 * CT_BN * CT_BK; idx += CT_THREADS) {
            int n, k, d;
            if (!BWD) n = idx / (CT_BK * K1), k = idx / K1 % CT_BK, d = idx % K1;
            else k = idx / (CT_BN * K1), n = idx / K1 % CT_BN, d = idx % K1;
            const int nn = n0 + n, kk = kc + k;
            float v = 0.0f;
            if (nn < dh)
                v = BWD ? w1[((col0 + kk) * dh + nn) * K1 + (K1 - 1 - d)] : w1[((col0 + nn) * dh + kk) * K1 + d];
            sh.Bs[d][n * CT_BK + k] = gk_bf16_bits(v);
        }
        __syncthreads();
#pragma unroll
        for (int d = 0; d < K1; d++) {
            tc::A a[CT_FM];
#pragma unroll
            for (int i = 0; i < CT_FM; i++) tc::load(a[i], As + (wm * 32 + i * 16 + d) * CT_BK, CT_BK);
#pragma unroll
            for (int j = 0; j < CT_FN; j++) {
                tc::Bt b;
                tc::load(b, &sh.Bs[d][(wn * CT_WN + j * 16) * CT_BK], CT_BK);
#pragma unroll
                for (int i = 0; i < CT_FM; i++) tc::mma(acc[i][j], a[i], b);
            }
        }
        __syncthreads();
    }

    /* epilogue, a fragment at a time through the warp's staging tile */
#pragma unroll
    for (int i = 0; i < CT_FM; i++)
#pragma unroll
        for (int j = 0; j < CT_FN; j++) {
            tc::store(Cs[warp], acc[i][j], 16);
            gk_syncwarp();
            for (int q = lane; q < 256; q += GPU_WARP) {
                const long e = e0 + wm * 32 + i * 16 + q / 16;
                const int n = n0 + wn * CT_WN + j * 16 + q % 16;
                if (e >= R || n >= dh) continue;
                const float v = Cs[warp][q];
                if (BWD) {
                    out[e * C + col0 + n] = v;
                } else {
                    const long b = e / TM;
                    const int t = (int)(e - b * TM);
                    if (t < T) out[(b * T + t) * C + col0 + n] = b1[col0 + n] + v;
                }
            }
            gk_syncwarp();
        }
#endif
}

template <int K1>
void launch(GkStream s, bool bwd, float *out, const float *src, const float *w1, const float *b1, int B, int T, int C,
            int dh) {
    const long R = (long)B * (T + K1 - 1);
    const int ntn = (dh + CT_BN - 1) / CT_BN;
    const long blocks = (R + CT_BM - 1) / CT_BM * (long)(C / dh) * ntn;
    if (bwd)
        GK_LAUNCH_PDL((conv_tc_kernel<K1, true>), dim3((unsigned)blocks), dim3(CT_THREADS), 0, s, out, src, w1, b1, B,
                      T, C, dh, ntn);
    else
        GK_LAUNCH_PDL((conv_tc_kernel<K1, false>), dim3((unsigned)blocks), dim3(CT_THREADS), 0, s, out, src, w1, b1, B,
                      T, C, dh, ntn);
    GK_LAUNCH_CHECK();
}

} // namespace

extern "C" int gk_cca_conv_gemm_tc(GkStream s, int bwd, float *out, const float *src, const float *w1, const float *b1,
                                   int B, int T, int C, int dh, int k1) {
    if (B <= 0 || T <= 0 || dh <= 0 || dh % CT_BK || C % dh || k1 < 1 || k1 > CT_MAX_K1) return -1;
    if ((long)B * (T + k1 - 1) / CT_BM * (C / dh) >= (1L << 31) - 1) return -1;
    switch (k1) {
    case 1: launch<1>(s, bwd, out, src, w1, b1, B, T, C, dh); break;
    case 2: launch<2>(s, bwd, out, src, w1, b1, B, T, C, dh); break;
    case 3: launch<3>(s, bwd, out, src, w1, b1, B, T, C, dh); break;
    default: launch<4>(s, bwd, out, src, w1, b1, B, T, C, dh);
    }
    return 0;
}
