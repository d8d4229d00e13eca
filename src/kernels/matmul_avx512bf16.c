/* bf16 products on CPUs with AVX512-BF16 (Zen 4/5, Cooper Lake, Sapphire Rapids and later): vdpbf16ps multiplies
 * 32 pairs of bf16 values exactly and adds them into 16 fp32 sums. Compiled with -march=x86-64-v4 -mavx512bf16
 * (Makefile) and called only when the process's level is avx512bf16 (cpu.h). Both operands must be bf16, so the
 * activations are rounded to bf16 (nearest even) once per call; every sum stays fp32. */
#include <stdlib.h>

#include "kernels/matmul.h"
#include "util/util.h"

#if defined(__AVX512BF16__) && defined(__AVX512BW__)
#include <immintrin.h>

static inline __m512 dp(__m512 acc, const uint16_t *a, const uint16_t *b) {
    return _mm512_dpbf16_ps(acc, (__m512bh)_mm512_loadu_si512(a), (__m512bh)_mm512_loadu_si512(b));
}
static inline __m512 dp_tail(__m512 acc, const uint16_t *a, const uint16_t *b, __mmask32 m) {
    return _mm512_dpbf16_ps(acc, (__m512bh)_mm512_maskz_loadu_epi16(m, a), (__m512bh)_mm512_maskz_loadu_epi16(m, b));
}

/* Rows r < nr (<= ZY_BF16_ROW_BLOCK) of Xb [nr, in] (bf16, contiguous) against outputs [o0, o1). */
static void block(int nr, int o0, int o1, int in, const uint16_t *Xb, const uint16_t *W16, float *Y, int ldy) {
    const int in32 = in & ~31, in128 = in & ~127;
    const __mmask32 tail = in - in32 ? (__mmask32)((1ull << (in - in32)) - 1) : 0;
    for (int o = o0; o < o1; o++) {
        const uint16_t *w = W16 + (long)o * in;
        if (nr == 1) { /* decoding one token: four chains keep the dot-product latency off the memory stream */
            __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            int k = 0;
            for (; k < in128; k += 128) {
                a0 = dp(a0, w + k, Xb + k), a1 = dp(a1, w + k + 32, Xb + k + 32);
                a2 = dp(a2, w + k + 64, Xb + k + 64), a3 = dp(a3, w + k + 96, Xb + k + 96);
            }
            for (; k < in32; k += 32) a0 = dp(a0, w + k, Xb + k);
            if (tail) a1 = dp_tail(a1, w + in32, Xb + in32, tail);
            Y[o] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
            continue;
        }
        __m512 acc[ZY_BF16_ROW_BLOCK];
        for (int r = 0; r < ZY_BF16_ROW_BLOCK; r++) acc[r] = _mm512_setzero_ps();
        for (int k = 0; k < in32; k += 32) {
            const __m512bh wv = (__m512bh)_mm512_loadu_si512(w + k); /* one load of the weights feeds every row */
            for (int r = 0; r < nr; r++)
                acc[r] = _mm512_dpbf16_ps(acc[r], wv, (__m512bh)_mm512_loadu_si512(Xb + (long)r * in + k));
        }
        if (tail)
            for (int r = 0; r < nr; r++) acc[r] = dp_tail(acc[r], w + in32, Xb + (long)r * in + in32, tail);
        for (int r = 0; r < nr; r++) Y[(long)r * ldy + o] = _mm512_reduce_add_ps(acc[r]);
    }
}

int zy_matmul_bf16_dpbf16(int rows, int out, int in, const float *X, int ldx, const uint16_t *W16, float *Y, int ldy) {
    uint16_t *Xb = malloc((size_t)rows * in * sizeof *Xb);
    if (!Xb) return -1;
    for (int r = 0; r < rows; r++)
        for (int k = 0; k < in; k++) Xb[(long)r * in + k] = zy_f32_to_bf16(X[(long)r * ldx + k]);
    for (int r0 = 0; r0 < rows; r0 += ZY_BF16_ROW_BLOCK) {
        const int nr = rows - r0 < ZY_BF16_ROW_BLOCK ? rows - r0 : ZY_BF16_ROW_BLOCK;
        const uint16_t *xb = Xb + (long)r0 * in;
        float *y = Y + (long)r0 * ldy;
        /* fixed chunks of outputs over the threads: each sum is the same whatever the thread count */
#pragma omp parallel for schedule(static) if ((long)out * in >= 65536L)
        for (int o0 = 0; o0 < out; o0 += 16) block(nr, o0, o0 + 16 < out ? o0 + 16 : out, in, xb, W16, y, ldy);
    }
    free(Xb);
    return 0;
}

#else /* a build without the AVX512-BF16 kernel (not x86-64, or a compiler without -mavx512bf16) */

int zy_matmul_bf16_dpbf16(int rows, int out, int in, const float *X, int ldx, const uint16_t *W16, float *Y, int ldy) {
    (void)rows, (void)out, (void)in, (void)X, (void)ldx, (void)W16, (void)Y, (void)ldy;
    return -1;
}

#endif
