/* Products with bf16 weights (matmul.h): a few rows (decoding) read the bf16 values directly through the kernel of
 * the process's CPU level; more rows widen panels of the weights to fp32 for sgemm. */
#include <stdlib.h>

#include "kernel_table.h"
#include "matmul.h"
#include "util.h"

/* ---- bf16 weights: y = X W16ᵀ, fp32 accumulation ---------------------------------------------------------- */

/* Plain C, one row block: the reference the level kernels are tested against. */
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

void zy_matmul_bf16(int impl, int rows, int out, int in, const float *X, int ldx, const uint16_t *W16, float *Y,
                    int ldy) {
    if (rows <= 0 || out <= 0) return;
    const ZyCpuLevel level = impl == ZY_BF16_PLAIN ? ZY_CPU_GENERIC : impl < 0 ? zy_cpu_level() : (ZyCpuLevel)impl;
    if (level >= ZY_CPU_AVX512BF16 && impl != ZY_BF16_PLAIN && in > 0 && zy_matmul_bf16_dpbf16(rows, out, in, X, ldx,
                                                                                              W16, Y, ldy) == 0)
        return;
    const ZyKernelTable *kt = zy_kernel_table(level);
    for (int r0 = 0; r0 < rows; r0 += ZY_BF16_ROW_BLOCK) {
        const int nr = rows - r0 < ZY_BF16_ROW_BLOCK ? rows - r0 : ZY_BF16_ROW_BLOCK;
        const float *x = X + (long)r0 * ldx;
        float *y = Y + (long)r0 * ldy;
        /* outputs split in fixed chunks over the threads: each output's sum is the same whatever the thread count */
#pragma omp parallel for schedule(static) if ((long)out * in >= 65536L)
        for (int o0 = 0; o0 < out; o0 += 16) {
            const int o1 = o0 + 16 < out ? o0 + 16 : out;
            if (impl == ZY_BF16_PLAIN)
                bf16_block_plain(nr, o0, o1, in, x, ldx, W16, y, ldy);
            else
                kt->matmul_bf16_block(nr, o0, o1, in, x, ldx, W16, y, ldy);
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
        if (rows <= ZY_BF16_MAX_ROWS) {
            zy_matmul_bf16(-1, rows, out, in, X, ldx, W16, Y, ldy);
            return;
        }
        /* At avx512bf16 the few-row kernel rounds X to bf16 (vdpbf16ps takes bf16 pairs); many rows round it too,
         * so decoding and a full forward compute the same products. */
        float *xr = NULL;
        if (zy_cpu_level() >= ZY_CPU_AVX512BF16 && (xr = malloc((size_t)rows * in * sizeof *xr))) {
#pragma omp parallel for schedule(static) if ((long)rows * in >= 65536L)
            for (long i = 0; i < (long)rows * in; i++) xr[i] = zy_round_bf16(X[i / in * ldx + i % in]);
            X = xr, ldx = in;
        }
        bf16_panels_gemm(rows, out, in, X, ldx, W16, Y, ldy);
        free(xr);
        return;
    }
    zy_gemm(0, 1, rows, out, in, 1, X, ldx, W, in, 0, Y, ldy);
}


/* ---- bf16 GEMM: both inputs rounded to bf16, fp32 accumulation ---------------------------------------------- */

/* A stored matrix [rows, cols] (leading dimension ld) rounded to bf16 values, kept as fp32, contiguous. */
static float *rounded_copy(const float *A, int rows, int cols, int ld) {
    float *r = malloc((size_t)rows * cols * sizeof *r);
    if (!r) return NULL;
#pragma omp parallel for schedule(static) if ((long)rows * cols >= 65536L)
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++) r[(long)i * cols + j] = zy_round_bf16(A[(long)i * ld + j]);
    return r;
}

const char *zy_gemm_bf16_backend(void) { return "inputs rounded to bf16, then OpenBLAS sgemm (fp32 products)"; }

int zy_gemm_bf16(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                 int ldb, float beta, float *C, int ldc) {
    if (M <= 0 || N <= 0 || K <= 0) {
        zy_gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return 0;
    }
    const int ar = trans_a ? K : M, ac = trans_a ? M : K, br = trans_b ? N : K, bc = trans_b ? K : N;
    float *a = rounded_copy(A, ar, ac, lda), *b = a ? rounded_copy(B, br, bc, ldb) : NULL;
    if (!a || !b) {
        free(a), free(b);
        return -1;
    }
    zy_gemm(trans_a, trans_b, M, N, K, alpha, a, ac, b, bc, beta, C, ldc);
    free(a), free(b);
    return 0;
}
