/* The ops' public names: each float op calls the kernel table of the process's CPU level (kernel_table.h; the
 * float instantiation of kernels.inc is kernels_isa.c, compiled once per level). The double instantiation, for
 * the finite-difference reference checks, is compiled here once. */
#include "kernels/kernels.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/attention.h"
#include "kernels/kernel_table.h"
#include "kernels/matmul.h"

/* kernels.inc marks independent loops `omp simd`; clang at -O1 (the sanitizer build) may decline to vectorise them
 * and would warn. */
#if defined(__clang__)
#pragma clang diagnostic ignored "-Wpass-failed"
#endif

/* ---- dispatch ---------------------------------------------------------------------------------------------- */
extern const ZyKernelTable zy_kernels_generic;
#if ZY_HAVE_ISA_LEVELS
extern const ZyKernelTable zy_kernels_avx2, zy_kernels_avx512;
#endif

const ZyKernelTable *zy_kernel_table(ZyCpuLevel level) {
#if ZY_HAVE_ISA_LEVELS
    if (level >= ZY_CPU_AVX512) return &zy_kernels_avx512;
    if (level == ZY_CPU_AVX2) return &zy_kernels_avx2;
#endif
    (void)level;
    return &zy_kernels_generic;
}

const ZyKernelTable *zy_kernels(void) { return zy_kernel_table(zy_cpu_level()); }

#define ZY_KERNEL_DISPATCH_void(name, params, args) \
    void name params { zy_kernels()->name args; }
#define ZY_KERNEL_DISPATCH_double(name, params, args) \
    double name params { return zy_kernels()->name args; }
#define ZY_KERNEL_DISPATCH_size_t(name, params, args) \
    size_t name params { return zy_kernels()->name args; }
#define ZY_KERNEL_DISPATCH(ret, name, params, args) ZY_KERNEL_DISPATCH_##ret(name, params, args)
ZY_KERNEL_OPS(ZY_KERNEL_DISPATCH)
#undef ZY_KERNEL_DISPATCH

/* ---- double instantiation ---------------------------------------------------------------------------------- */

#define real double
#define K(name) name##_f64
#define ROW_PRODUCTS(rows, out, in, X, ldx, W, at, Y, ldy) zy_gemm_f64(0, 1, rows, out, in, 1, X, ldx, (W) + (at), in, 0, Y, ldy)
#define GEMM zy_gemm_f64
#define GEMM_CTX(ctx, ...) zy_gemm_f64(__VA_ARGS__)
#define GEMM_CTX_W(ctx, ...) zy_gemm_f64(__VA_ARGS__)
#define GEMM_CTX_EX(ctx, ta, tb, M, N, K, al, A, lda, ak, B, ldb, bk, be, C, ldc) \
    zy_gemm_f64(ta, tb, M, N, K, al, A, lda, B, ldb, be, C, ldc)
/* bf16 copies exist for float weights only: a weight matrix is its double values */
#define WEIGHTS const double *
#define WEIGHTS_OF(p) (p)
#define MATMUL_WT_GROUPS(ctx, G, off, out, in, X, ldx, W, Y, ldy)                                                      \
    for (int g_ = 0; g_ < (G); g_++)                                                                                   \
    zy_gemm_f64(0, 1, (off)[g_ + 1] - (off)[g_], out, in, 1, (X) + (long)(off)[g_] * (ldx), ldx,                       \
                (W) + (long)g_ * (out) * (in), in, 0, (Y) + (long)(off)[g_] * (ldy), ldy)
#define EXP exp
#define VEXP exp
#define VERFC erfc
#define FABS fabs
#define COPYSIGN copysign
#define ERFC erfc
#include "kernels/kernels.inc"

void rope_tables(float *cosv, float *sinv, int T, int rd, float theta) {
    /* Built in fp32 exactly like the reference (inv_freq, angle, then cos/sin), not in double: the two differ
     * by ~1e-3 at position 32768. */
    const int half = rd / 2;
    for (int i = 0; i < half; i++) {
        float inv_freq = 1.0f / powf(theta, (float)(2 * i) / (float)rd);
        for (int t = 0; t < T; t++) {
            float a = (float)t * inv_freq;
            cosv[(long)t * half + i] = cosf(a);
            sinv[(long)t * half + i] = sinf(a);
        }
    }
}

void rope_tables_f64(double *cosv, double *sinv, int T, int rd, double theta) {
    const int half = rd / 2;
    for (int i = 0; i < half; i++) {
        double inv_freq = 1.0 / pow(theta, (double)(2 * i) / rd);
        for (int t = 0; t < T; t++) {
            cosv[(long)t * half + i] = cos(t * inv_freq);
            sinv[(long)t * half + i] = sin(t * inv_freq);
        }
    }
}

/* embed_forward with a bf16 embedding table (bf16 inference weights). */
void embed_forward_bf16(float *x, const uint16_t *emb, const int32_t *tokens, const float *bias, const float *scale,
                        int rows, int dim) {
#pragma omp parallel for schedule(static) if (ZY_PAR((long)rows * dim))
    for (int r = 0; r < rows; r++) {
        const uint16_t *e = emb + (long)tokens[r] * dim;
#pragma omp simd
        for (int i = 0; i < dim; i++) x[(long)r * dim + i] = (zy_bf16_to_f32(e[i]) + bias[i]) * scale[i];
    }
}
