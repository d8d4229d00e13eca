/* bf16 products on CPUs with AVX512-BF16 (Zen 4/5, Cooper Lake, Sapphire Rapids and later): vdpbf16ps multiplies
 * 32 pairs of bf16 values exactly and adds them into 16 fp32 sums. Compiled with -march=x86-64-v4 -mavx512bf16
 * (Makefile) and called only when the process's level is avx512bf16 (cpu.h). Both operands must be bf16, so the
 * activations are rounded to bf16 (nearest even) once per call; every sum stays fp32. */
#include <stdlib.h>

#include "kernels/kernel_table.h"
#include "kernels/matmul.h"
#include "util/util.h"

#if defined(__AVX512BF16__) && defined(__AVX512BW__)
#include "kernels/reduce16.h"
#include <immintrin.h>

static inline __m512 dp(__m512 acc, const uint16_t *a, const uint16_t *b) {
    return _mm512_dpbf16_ps(acc, (__m512bh)_mm512_loadu_si512(a), (__m512bh)_mm512_loadu_si512(b));
}
static inline __m512 dp_tail(__m512 acc, const uint16_t *a, const uint16_t *b, __mmask32 m) {
    return _mm512_dpbf16_ps(acc, (__m512bh)_mm512_maskz_loadu_epi16(m, a), (__m512bh)_mm512_maskz_loadu_epi16(m, b));
}

/* One output of one row (decoding one token): four chains keep the dot-product latency off the memory stream. */
static float dot_row(int in, const uint16_t *x, const uint16_t *w) {
    const int in32 = in & ~31, in128 = in & ~127;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int k = 0;
    for (; k < in128; k += 128) {
        a0 = dp(a0, w + k, x + k), a1 = dp(a1, w + k + 32, x + k + 32);
        a2 = dp(a2, w + k + 64, x + k + 64), a3 = dp(a3, w + k + 96, x + k + 96);
    }
    for (; k < in32; k += 32) a0 = dp(a0, w + k, x + k);
    if (in - in32) a1 = dp_tail(a1, w + in32, x + in32, (__mmask32)((1ull << (in - in32)) - 1));
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

/* A tile: NR rows of Xb [.., in] (bf16) against the 4 weight rows o..o+3 (only the first `no` stored: a partial
 * tile repeats its last weight row), one 16-lane sum per (row, output) over k. 4 weight and NR activation loads feed
 * 4 NR dot products, so the tile runs at the dot-product rate from cache, and each weight row is read from memory
 * once per call (the tiles of a chunk of outputs take every row block while those weights sit in L1/L2). */
static inline __attribute__((always_inline)) void tile(const int NR, int no, int in, const uint16_t *Xb,
                                                      const uint16_t *W16, int o, float *Y, int ldy) {
    const int in32 = in & ~31;
    const __mmask32 tail = in - in32 ? (__mmask32)((1ull << (in - in32)) - 1) : 0;
    const uint16_t *w[4];
    for (int j = 0; j < 4; j++) w[j] = W16 + (long)(o + (j < no ? j : no - 1)) * in;
    __m512 acc[4][4];
    for (int r = 0; r < NR; r++)
        for (int j = 0; j < 4; j++) acc[r][j] = _mm512_setzero_ps();
    for (int k = 0; k < in32; k += 32) {
        const __m512bh w0 = (__m512bh)_mm512_loadu_si512(w[0] + k), w1 = (__m512bh)_mm512_loadu_si512(w[1] + k);
        const __m512bh w2 = (__m512bh)_mm512_loadu_si512(w[2] + k), w3 = (__m512bh)_mm512_loadu_si512(w[3] + k);
        for (int j = 0; j < 4; j++) /* two tiles ahead: four short streams the hardware finds late */
            __builtin_prefetch(w[j] + 8 * (long)in + k);
        for (int r = 0; r < NR; r++) {
            const __m512bh x = (__m512bh)_mm512_loadu_si512(Xb + (long)r * in + k);
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], w0, x), acc[r][1] = _mm512_dpbf16_ps(acc[r][1], w1, x);
            acc[r][2] = _mm512_dpbf16_ps(acc[r][2], w2, x), acc[r][3] = _mm512_dpbf16_ps(acc[r][3], w3, x);
        }
    }
    if (tail)
        for (int r = 0; r < NR; r++)
            for (int j = 0; j < 4; j++) acc[r][j] = dp_tail(acc[r][j], w[j] + in32, Xb + (long)r * in + in32, tail);
    zy_f32x16 v[16];
    for (int i = 0; i < 16; i++) v[i] = i / 4 < NR ? (zy_f32x16)acc[i / 4][i % 4] : (zy_f32x16){0};
    const zy_f32x16 sums = zy_reduce16(v); /* lane 4 r + j: the sum of acc[r][j] */
    for (int r = 0; r < NR; r++)
        for (int j = 0; j < no; j++) Y[(long)r * ldy + o + j] = sums[4 * r + j];
}

/* NR rows (<= 4) against outputs [o0, o1) one weight row at a time: the weights stream through in memory order, which
 * the hardware prefetches best, for products of a few rows that wait on memory rather than on the dot products. */
static inline __attribute__((always_inline)) void seq_rows(const int NR, int o0, int o1, int in, const uint16_t *Xb,
                                                          const uint16_t *W16, float *Y, int ldy) {
    const int in32 = in & ~31;
    const __mmask32 tail = in - in32 ? (__mmask32)((1ull << (in - in32)) - 1) : 0;
    for (int o = o0; o < o1; o++) {
        const uint16_t *w = W16 + (long)o * in;
        __m512 acc[4], acc2[4]; /* two chains per row (even and odd steps): dot-product latency, not memory, bound one */
        for (int r = 0; r < NR; r++) acc[r] = acc2[r] = _mm512_setzero_ps();
        int k = 0;
        for (; k + 64 <= in32; k += 64) {
            const __m512bh w0 = (__m512bh)_mm512_loadu_si512(w + k), w1 = (__m512bh)_mm512_loadu_si512(w + k + 32);
            for (int r = 0; r < NR; r++) {
                acc[r] = _mm512_dpbf16_ps(acc[r], w0, (__m512bh)_mm512_loadu_si512(Xb + (long)r * in + k));
                acc2[r] = _mm512_dpbf16_ps(acc2[r], w1, (__m512bh)_mm512_loadu_si512(Xb + (long)r * in + k + 32));
            }
        }
        for (; k < in32; k += 32) {
            const __m512bh wv = (__m512bh)_mm512_loadu_si512(w + k);
            for (int r = 0; r < NR; r++)
                acc[r] = _mm512_dpbf16_ps(acc[r], wv, (__m512bh)_mm512_loadu_si512(Xb + (long)r * in + k));
        }
        if (tail)
            for (int r = 0; r < NR; r++) acc2[r] = dp_tail(acc2[r], w + in32, Xb + (long)r * in + in32, tail);
        for (int r = 0; r < NR; r++) Y[(long)r * ldy + o] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r], acc2[r]));
    }
}

/* Rows [0, nr) (nr <= 4: a row block) against outputs [o0, o1). */
static void row_block(int nr, int o0, int o1, int in, const uint16_t *Xb, const uint16_t *W16, float *Y, int ldy) {
    for (int o = o0; o < o1; o += 4) {
        const int no = o1 - o < 4 ? o1 - o : 4;
        switch (nr) { /* the row count as a constant: each case keeps its 4 x nr sums in registers */
        case 1: tile(1, no, in, Xb, W16, o, Y, ldy); break;
        case 2: tile(2, no, in, Xb, W16, o, Y, ldy); break;
        case 3: tile(3, no, in, Xb, W16, o, Y, ldy); break;
        default: tile(4, no, in, Xb, W16, o, Y, ldy); break;
        }
    }
}

/* Outputs go to the threads in fixed chunks (each sum is the same whatever the thread count); a chunk's weights
 * (ZY_BF16_CHUNK rows) stay in cache while every row block of a panel of ZY_BF16_ROW_PANEL rows passes over them. */
#define ZY_BF16_CHUNK 32
#define ZY_BF16_ROW_PANEL 64

int zy_matmul_bf16_dpbf16(int rows, int out, int in, const float *X, int ldx, const uint16_t *W16, float *Y, int ldy) {
    uint16_t *Xb = malloc((size_t)rows * in * sizeof *Xb);
    if (!Xb) return -1;
    const ZyKernelTable *kt = zy_kernels(); /* the vectorised rounding */
#pragma omp parallel for schedule(static) if ((long)rows * in >= 65536L)
    for (int r = 0; r < rows; r++) kt->f32_to_bf16_row(Xb + (long)r * in, X + (long)r * ldx, in);
    if (rows == 1) {
#pragma omp parallel for schedule(static) if ((long)out * in >= 65536L)
        for (int o = 0; o < out; o++) Y[o] = dot_row(in, Xb, W16 + (long)o * in);
        free(Xb);
        return 0;
    }
    if (rows <= 4) { /* memory-bound: the weights in memory order (measured 1.3-1.6x the tiles at 2-4 rows) */
#pragma omp parallel for schedule(static) if ((long)out * in >= 65536L)
        for (int o0 = 0; o0 < out; o0 += 16) {
            const int o1 = o0 + 16 < out ? o0 + 16 : out;
            switch (rows) { /* the row count as a constant: its sums stay in registers */
            case 2: seq_rows(2, o0, o1, in, Xb, W16, Y, ldy); break;
            case 3: seq_rows(3, o0, o1, in, Xb, W16, Y, ldy); break;
            default: seq_rows(4, o0, o1, in, Xb, W16, Y, ldy); break;
            }
        }
        free(Xb);
        return 0;
    }
    const int chunks = (out + ZY_BF16_CHUNK - 1) / ZY_BF16_CHUNK;
#pragma omp parallel if ((long)out * in >= 65536L)
    for (int p0 = 0; p0 < rows; p0 += ZY_BF16_ROW_PANEL) {
        const int p1 = rows - p0 < ZY_BF16_ROW_PANEL ? rows : p0 + ZY_BF16_ROW_PANEL;
#pragma omp for schedule(static)
        for (int c = 0; c < chunks; c++) {
            const int o0 = c * ZY_BF16_CHUNK, o1 = o0 + ZY_BF16_CHUNK < out ? o0 + ZY_BF16_CHUNK : out;
            for (int r0 = p0; r0 < p1; r0 += 4)
                row_block(p1 - r0 < 4 ? p1 - r0 : 4, o0, o1, in, Xb + (long)r0 * in, W16, Y + (long)r0 * ldy, ldy);
        }
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
