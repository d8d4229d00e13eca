#include "matmul.h"

#include <cblas.h>
#include <stdlib.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define ZY_X86 1
#endif

#include "util.h"

void zy_gemm(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
             int ldb, float beta, float *C, int ldc) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) { /* BLAS leaves C untouched for K = 0 only when beta = 1; make it explicit. */
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) C[(long)i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[(long)i * ldc + j];
        return;
    }
    /* One output row or column (decoding one token, a single-row batch): a matrix-vector product. OpenBLAS's
     * sgemm would pack the whole weight matrix for it on every call, reading it twice over. */
    if (M == 1) { /* C[0, :] = op(A)[0, :] · op(B) */
        const int incx = trans_a ? lda : 1;
        if (trans_b)
            cblas_sgemv(CblasRowMajor, CblasNoTrans, N, K, alpha, B, ldb, A, incx, beta, C, 1);
        else
            cblas_sgemv(CblasRowMajor, CblasTrans, K, N, alpha, B, ldb, A, incx, beta, C, 1);
        return;
    }
    if (N == 1) { /* C[:, 0] = op(A) · op(B)[:, 0] */
        const int incx = trans_b ? 1 : ldb;
        if (trans_a)
            cblas_sgemv(CblasRowMajor, CblasTrans, K, M, alpha, A, lda, B, incx, beta, C, ldc);
        else
            cblas_sgemv(CblasRowMajor, CblasNoTrans, M, K, alpha, A, lda, B, incx, beta, C, ldc);
        return;
    }
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, N, K,
                alpha, A, lda, B, ldb, beta, C, ldc);
}

/* The plain sgemm, whatever the shape (the reference the matrix-vector paths are tested against). */
void zy_gemm_reference(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda,
                       const float *B, int ldb, float beta, float *C, int ldc) {
    if (M <= 0 || N <= 0 || K <= 0) {
        zy_gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, N, K,
                alpha, A, lda, B, ldb, beta, C, ldc);
}

void zy_syrk_upper(int trans, int N, int K, float alpha, const float *A, int lda, float beta, float *C, int ldc) {
    if (N <= 0) return;
    if (K <= 0) {
        for (int i = 0; i < N; i++)
            for (int j = i; j < N; j++) C[(long)i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[(long)i * ldc + j];
        return;
    }
    cblas_ssyrk(CblasRowMajor, CblasUpper, trans ? CblasTrans : CblasNoTrans, N, K, alpha, A, lda, beta, C, ldc);
}

void zy_gemm_f64(int trans_a, int trans_b, int M, int N, int K, double alpha, const double *A, int lda,
                 const double *B, int ldb, double beta, double *C, int ldc) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) C[(long)i * ldc + j] = beta == 0.0 ? 0.0 : beta * C[(long)i * ldc + j];
        return;
    }
    cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, N, K,
                alpha, A, lda, B, ldb, beta, C, ldc);
}

/* ---- bf16 weights: y = X W16ᵀ, fp32 activations and accumulation ------------------------------------------ */

/* Plain C: rows r0..r0+nr-1 (nr <= ZY_BF16_ROW_BLOCK), outputs o of [o0, o1). */
static void bf16_block_plain(int nr, int o0, int o1, int in, const float *X, int ldx, const uint16_t *W16, float *Y,
                             int ldy) {
    for (int o = o0; o < o1; o++) {
        const uint16_t *w = W16 + (long)o * in;
        for (int r = 0; r < nr; r++) {
            const float *x = X + (long)r * ldx;
            float acc = 0;
            for (int k = 0; k < in; k++) acc += zy_bf16_to_f32(w[k]) * x[k];
            Y[(long)r * ldy + o] = acc;
        }
    }
}

#ifdef ZY_X86
int zy_cpu_has_avx2_fma(void) { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }

__attribute__((target("avx2,fma"))) static inline __m256 bf16x8_load(const uint16_t *p) {
    /* bf16 -> fp32 is a 16-bit left shift: widen 8 halves to 32 bits, shift, reinterpret */
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

__attribute__((target("avx2,fma"))) static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

__attribute__((target("avx2,fma"))) static void bf16_block_avx2(int nr, int o0, int o1, int in, const float *X,
                                                                int ldx, const uint16_t *W16, float *Y, int ldy) {
    const int in8 = in & ~7, in32 = in & ~31;
    for (int o = o0; o < o1; o++) {
        const uint16_t *w = W16 + (long)o * in;
        if (nr == 1) { /* decoding one token: four chains keep the FMA latency off the memory stream */
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            int k = 0;
            for (; k < in32; k += 32) {
                a0 = _mm256_fmadd_ps(bf16x8_load(w + k), _mm256_loadu_ps(X + k), a0);
                a1 = _mm256_fmadd_ps(bf16x8_load(w + k + 8), _mm256_loadu_ps(X + k + 8), a1);
                a2 = _mm256_fmadd_ps(bf16x8_load(w + k + 16), _mm256_loadu_ps(X + k + 16), a2);
                a3 = _mm256_fmadd_ps(bf16x8_load(w + k + 24), _mm256_loadu_ps(X + k + 24), a3);
            }
            for (; k < in8; k += 8) a0 = _mm256_fmadd_ps(bf16x8_load(w + k), _mm256_loadu_ps(X + k), a0);
            float acc = hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
            for (; k < in; k++) acc += zy_bf16_to_f32(w[k]) * X[k];
            Y[o] = acc;
            continue;
        }
        __m256 acc[ZY_BF16_ROW_BLOCK];
        for (int r = 0; r < ZY_BF16_ROW_BLOCK; r++) acc[r] = _mm256_setzero_ps();
        int k = 0;
        for (; k < in8; k += 8) {
            const __m256 wv = bf16x8_load(w + k); /* one load of the weights feeds every row */
            for (int r = 0; r < nr; r++) acc[r] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(X + (long)r * ldx + k), acc[r]);
        }
        for (int r = 0; r < nr; r++) {
            const float *x = X + (long)r * ldx;
            float a = hsum8(acc[r]);
            for (int j = k; j < in; j++) a += zy_bf16_to_f32(w[j]) * x[j];
            Y[(long)r * ldy + o] = a;
        }
    }
}
#else
int zy_cpu_has_avx2_fma(void) { return 0; }
#endif

void zy_matmul_bf16(int impl, int rows, int out, int in, const float *X, int ldx, const uint16_t *W16, float *Y,
                    int ldy) {
    if (impl < 0) impl = zy_cpu_has_avx2_fma();
    for (int r0 = 0; r0 < rows; r0 += ZY_BF16_ROW_BLOCK) {
        const int nr = rows - r0 < ZY_BF16_ROW_BLOCK ? rows - r0 : ZY_BF16_ROW_BLOCK;
        const float *x = X + (long)r0 * ldx;
        float *y = Y + (long)r0 * ldy;
        /* outputs split in fixed chunks over the threads: each output's sum is the same whatever the thread count */
#pragma omp parallel for schedule(static) if ((long)out * in >= 65536L)
        for (int o0 = 0; o0 < out; o0 += 16) {
            const int o1 = o0 + 16 < out ? o0 + 16 : out;
#ifdef ZY_X86
            if (impl == 1) {
                bf16_block_avx2(nr, o0, o1, in, x, ldx, W16, y, ldy);
                continue;
            }
#endif
            bf16_block_plain(nr, o0, o1, in, x, ldx, W16, y, ldy);
        }
    }
}

/* Many rows against bf16 weights (prefill, a full forward): widen a panel of output rows to fp32, then sgemm. The
 * widening reads each weight once per call, against rows x 2 FLOPs per weight for the product. */
static void bf16_panels_gemm(int rows, int out, int in, const float *X, int ldx, const uint16_t *W16, float *Y,
                             int ldy) {
    const int panel = out < ZY_BF16_PANEL ? out : ZY_BF16_PANEL;
    float *wp = malloc((size_t)panel * in * sizeof *wp);
    if (!wp) { /* no room for a panel: the matrix-vector kernel handles any number of rows, only slower */
        zy_matmul_bf16(-1, rows, out, in, X, ldx, W16, Y, ldy);
        return;
    }
    for (int o0 = 0; o0 < out; o0 += panel) {
        const int np = out - o0 < panel ? out - o0 : panel;
        const uint16_t *src = W16 + (long)o0 * in;
#pragma omp parallel for schedule(static) if ((long)np * in >= 65536L)
        for (long i = 0; i < (long)np * in; i++) wp[i] = zy_bf16_to_f32(src[i]);
        zy_gemm(0, 1, rows, np, in, 1, X, ldx, wp, in, 0, Y + o0, ldy);
    }
    free(wp);
}

void zy_matmul_wt(int rows, int out, int in, const float *X, int ldx, const float *W, const uint16_t *W16, float *Y,
                  int ldy) {
    if (W16 && rows > 0 && out > 0 && in > 0) {
        if (rows <= ZY_BF16_MAX_ROWS)
            zy_matmul_bf16(-1, rows, out, in, X, ldx, W16, Y, ldy);
        else
            bf16_panels_gemm(rows, out, in, X, ldx, W16, Y, ldy);
        return;
    }
    zy_gemm(0, 1, rows, out, in, 1, X, ldx, W, in, 0, Y, ldy);
}

double zy_sgemm_probe_gflops(int n, double seconds) {
    float *a = zy_calloc((size_t)n * n * sizeof(float)), *b = zy_calloc((size_t)n * n * sizeof(float));
    float *c = zy_calloc((size_t)n * n * sizeof(float));
    if (!a || !b || !c) {
        zy_free(a), zy_free(b), zy_free(c);
        return 0.0;
    }
    for (size_t i = 0; i < (size_t)n * n; i++) a[i] = b[i] = (float)((i % 7) - 3) * 0.01f;
    zy_gemm(0, 0, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n); /* warm-up: threads, caches */
    /* The best of several short slices: a peak, so a slice slowed by another process sharing the cores does not
     * lower it (and inflate the MFU quoted against it). */
    const double flops = 2.0 * n * (double)n * n, start = zy_now_seconds();
    double best = 0;
    do {
        int reps = 0;
        double t0 = zy_now_seconds(), t;
        do {
            zy_gemm(0, 0, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
            reps++;
            t = zy_now_seconds() - t0;
        } while (t < seconds / 8);
        if (flops * reps / t / 1e9 > best) best = flops * reps / t / 1e9;
    } while (zy_now_seconds() - start < seconds);
    zy_free(a), zy_free(b), zy_free(c);
    return best;
}
