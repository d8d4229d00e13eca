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

#define real float
#define K(name) name
#define GEMM zy_gemm
#define EXP expf
#include "kernels.inc"
#undef real
#undef K
#undef GEMM
#undef EXP

#define real double
#define K(name) name##_f64
#define GEMM zy_gemm_f64
#define EXP exp
#include "kernels.inc"
#undef real
#undef K
#undef GEMM
#undef EXP

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
