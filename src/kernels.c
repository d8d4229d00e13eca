/* Instantiates the ops in kernels.inc for float (model) and double (reference checks). */
#include "kernels.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "matmul.h"

/* kernels.inc marks independent loops `omp simd` (GCC cannot prove the many pointers distinct); clang at -O1
 * (the sanitizer build) declines to vectorise them and would warn. */
#if defined(__clang__)
#pragma clang diagnostic ignored "-Wpass-failed"
#endif

/* exp and erfc in float for the elementwise activations, written so GCC vectorises them (no calls; the only
 * selects are plain min/max: -ftrapping-math keeps GCC from if-converting selects between computed values).
 * zy_vexpf: Cephes expf (2^n by the exponent bits times a degree-6 polynomial on the reduced argument), relative
 * error < 1e-7 on [-87, 88] (outside it the result is garbage: kernels.inc checks the range per row).
 * zy_verfcf: Numerical Recipes erfcc for z >= 0, fractional error < 1.2e-7. */
typedef union {
    int32_t i;
    float f;
} ZyBits;

static inline float zy_vexpf(float x) { /* x in [-87, 88]: callers check (a clamp here defeats vectorisation) */
    const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to nearest */
    const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const ZyBits b = {.i = ((int32_t)n + 127) * (1 << 23)};
    return p * b.f;
}

static inline float zy_verfcf(float z) {
    const float t = 1.0f / (1.0f + 0.5f * z);
    float p = 0.17087277f;
    p = p * t - 0.82215223f;
    p = p * t + 1.48851587f;
    p = p * t - 1.13520398f;
    p = p * t + 0.27886807f;
    p = p * t - 0.18628806f;
    p = p * t + 0.09678418f;
    p = p * t + 0.37409196f;
    p = p * t + 1.00002368f;
    p = p * t - 1.26551223f;
    return t * zy_vexpf(p - z * z);
}

#define real float
#define K(name) name
#define GEMM zy_gemm
#define MATMUL_WT zy_matmul_wt
#define EXP expf
#define VEXP zy_vexpf
#define VERFC zy_verfcf
#define FABS fabsf
#define COPYSIGN copysignf
#define ERFC erfcf
#include "kernels.inc"
#undef real
#undef K
#undef GEMM
#undef MATMUL_WT
#undef EXP
#undef VEXP
#undef VERFC
#undef FABS
#undef COPYSIGN
#undef ERFC

#define real double
#define K(name) name##_f64
#define GEMM zy_gemm_f64
/* bf16 copies exist for float weights only */
#define MATMUL_WT(rows, out, in, X, ldx, W, W16, Y, ldy) zy_gemm_f64(0, 1, rows, out, in, 1, X, ldx, W, in, 0, Y, ldy)
#define EXP exp
#define VEXP exp
#define VERFC erfc
#define FABS fabs
#define COPYSIGN copysign
#define ERFC erfc
#include "kernels.inc"
#undef real
#undef K
#undef GEMM
#undef MATMUL_WT
#undef EXP
#undef VEXP
#undef VERFC
#undef FABS
#undef COPYSIGN
#undef ERFC

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
