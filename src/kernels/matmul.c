#include "kernels/matmul.h"

#include "kernels/kernel_table.h" /* before cblas.h, whose complex.h defines I */

#include <cblas.h>
#include <stdlib.h>

#include "util/util.h"

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

void zy_matmul_f32(int rows, int out, int in, const float *X, int ldx, const float *W, float *Y, int ldy) {
    if (rows < 2 || rows > ZY_F32_TILE_MAX_ROWS || out <= 0 || in <= 0) { /* one row: sgemv reads W once already */
        zy_gemm(0, 1, rows, out, in, 1, X, ldx, W, in, 0, Y, ldy);
        return;
    }
    const ZyKernelTable *kt = zy_kernels();
    const int chunks = (out + ZY_F32_TILE_CHUNK - 1) / ZY_F32_TILE_CHUNK;
    /* fixed chunks of outputs over the threads (each sum the same whatever the thread count); a chunk's weight rows
     * stay in cache while every row block passes over them */
#pragma omp parallel for schedule(static) if ((long)out * in >= 65536L)
    for (int c = 0; c < chunks; c++) {
        const int o0 = c * ZY_F32_TILE_CHUNK, o1 = o0 + ZY_F32_TILE_CHUNK < out ? o0 + ZY_F32_TILE_CHUNK : out;
        for (int r0 = 0; r0 < rows; r0 += 4)
            kt->matmul_f32_block(rows - r0 < 4 ? rows - r0 : 4, o0, o1, in, X + (long)r0 * ldx, ldx, W,
                                 Y + (long)r0 * ldy, ldy);
    }
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

const char *zy_blas_config(void) { return openblas_get_config(); }
const char *zy_blas_core_name(void) { return openblas_get_corename(); }
int zy_blas_threads(void) { return openblas_get_num_threads(); }

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
