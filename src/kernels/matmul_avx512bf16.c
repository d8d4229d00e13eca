/* bf16 products on CPUs with AVX512-BF16 (Zen 4/5, Cooper Lake, Sapphire Rapids and later): vdpbf16ps multiplies
 * 32 pairs of bf16 values exactly and adds them into 16 fp32 sums. Compiled with -march=x86-64-v4 -mavx512bf16
 * (Makefile) and called only when the process's level is avx512bf16 (cpu.h). Both operands must be bf16, so the
 * activations are rounded to bf16 (nearest even) once per call; every sum stays fp32. */
#include <omp.h>
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

/* The work of one call in items, each the same sums whatever thread takes it: a weight chunk of ZY_BF16_CHUNK
 * outputs against a panel of up to ZY_BF16_ROW_PANEL rows in tiles (the chunk's weights stay in cache while the panel's
 * row blocks pass over them), or, for a group of 1-4 rows (memory-bound: the weights in memory order, measured
 * 1.3-1.6x the tiles at 2-4 rows), 16 outputs. */
#define ZY_BF16_CHUNK 32
#define ZY_BF16_ROW_PANEL 64
#define ZY_BF16_SEQ_CHUNK 16

typedef struct {
    int r0, r1, o0, o1; /* rows [r0, r1) of one group against outputs [o0, o1) */
    const uint16_t *w;  /* the group's weights */
} Item;

static void run_item(const Item *it, int in, const uint16_t *Xb, float *Y, int ldy) {
    const int nr = it->r1 - it->r0;
    const uint16_t *x = Xb + (long)it->r0 * in;
    float *y = Y + (long)it->r0 * ldy;
    switch (nr) { /* the row count as a constant: its sums stay in registers */
    case 1:
        for (int o = it->o0; o < it->o1; o++) y[o] = dot_row(in, x, it->w + (long)o * in);
        return;
    case 2: seq_rows(2, it->o0, it->o1, in, x, it->w, y, ldy); return;
    case 3: seq_rows(3, it->o0, it->o1, in, x, it->w, y, ldy); return;
    case 4: seq_rows(4, it->o0, it->o1, in, x, it->w, y, ldy); return;
    default:
        for (int r = 0; r < nr; r += 4)
            row_block(nr - r < 4 ? nr - r : 4, it->o0, it->o1, in, x + (long)r * in, it->w, y + (long)r * ldy, ldy);
    }
}

/* An item's share of the work: reading its weights (from memory, for a few rows; again for each 64-row panel) costs
 * about what 16 rows of dot products on them do. */
static long item_cost(const Item *it) { return (long)(it->o1 - it->o0) * (16 + it->r1 - it->r0); }

/* Groups of rows against their own weights (a MoE layer's experts, or one matrix: G = 1), every group's items in one
 * parallel region. Each thread takes a contiguous run of items of about equal cost: it streams its weights in memory
 * order, which the hardware prefetches (items handed out one by one, interleaved between the threads, measured
 * 1.2x slower), and groups of different sizes still share out evenly. */
static int grouped(int G, const int32_t *off, int out, int in, const float *X, int ldx, const uint16_t *W16,
                   long w_stride, float *Y, int ldy) {
    const int n = off[G], seq_chunks = (out + ZY_BF16_SEQ_CHUNK - 1) / ZY_BF16_SEQ_CHUNK;
    const int tile_chunks = (out + ZY_BF16_CHUNK - 1) / ZY_BF16_CHUNK;
    if (n <= 0) return 0;
    long n_items = 0;
    for (int g = 0; g < G; g++) {
        const int ng = off[g + 1] - off[g];
        n_items += ng <= 0   ? 0
                   : ng <= 4 ? seq_chunks
                             : (long)(ng + ZY_BF16_ROW_PANEL - 1) / ZY_BF16_ROW_PANEL * tile_chunks;
    }
    uint16_t *Xb = malloc((size_t)n * in * sizeof *Xb);
    Item *items = malloc((size_t)n_items * sizeof *items);
    long *cum = malloc((size_t)(n_items + 1) * sizeof *cum); /* cum[i]: the cost of items before i */
    if (!Xb || !items || !cum) {
        free(Xb), free(items), free(cum);
        return -1;
    }
    long k = 0;
    for (int g = 0; g < G; g++) {
        const int s = off[g], ng = off[g + 1] - s;
        const uint16_t *w = W16 + g * w_stride;
        if (ng <= 0) continue;
        if (ng <= 4) {
            for (int o = 0; o < out; o += ZY_BF16_SEQ_CHUNK)
                items[k++] = (Item){s, s + ng, o, o + ZY_BF16_SEQ_CHUNK < out ? o + ZY_BF16_SEQ_CHUNK : out, w};
            continue;
        }
        for (int p = s; p < s + ng; p += ZY_BF16_ROW_PANEL)
            for (int o = 0; o < out; o += ZY_BF16_CHUNK)
                items[k++] = (Item){p, p + ZY_BF16_ROW_PANEL < s + ng ? p + ZY_BF16_ROW_PANEL : s + ng, o,
                                    o + ZY_BF16_CHUNK < out ? o + ZY_BF16_CHUNK : out, w};
    }
    cum[0] = 0;
    for (long i = 0; i < n_items; i++) cum[i + 1] = cum[i] + item_cost(&items[i]);
    const ZyKernelTable *kt = zy_kernels(); /* the vectorised rounding */
#pragma omp parallel if ((long)out * in >= 65536L)
    {
#pragma omp for schedule(static)
        for (int r = 0; r < n; r++) kt->f32_to_bf16_row(Xb + (long)r * in, X + (long)r * ldx, in);
        const int nt = omp_get_num_threads(), t = omp_get_thread_num();
        const long from = cum[n_items] * t / nt, to = cum[n_items] * (t + 1) / nt;
        long i = 0;
        while (cum[i] < from) i++; /* the first item starting at or after this thread's share */
        for (; i < n_items && cum[i] < to; i++) run_item(&items[i], in, Xb, Y, ldy);
    }
    free(Xb), free(items), free(cum);
    return 0;
}

int zy_matmul_bf16_dpbf16(int rows, int out, int in, const float *X, int ldx, const uint16_t *W16, float *Y, int ldy) {
    const int32_t off[2] = {0, rows};
    return grouped(1, off, out, in, X, ldx, W16, 0, Y, ldy);
}

int zy_matmul_bf16_dpbf16_groups(int G, const int32_t *off, int out, int in, const float *X, int ldx,
                                 const uint16_t *W16, float *Y, int ldy) {
    return grouped(G, off, out, in, X, ldx, W16, (long)out * in, Y, ldy);
}

#else /* a build without the AVX512-BF16 kernel (not x86-64, or a compiler without -mavx512bf16) */

int zy_matmul_bf16_dpbf16(int rows, int out, int in, const float *X, int ldx, const uint16_t *W16, float *Y, int ldy) {
    (void)rows, (void)out, (void)in, (void)X, (void)ldx, (void)W16, (void)Y, (void)ldy;
    return -1;
}

int zy_matmul_bf16_dpbf16_groups(int G, const int32_t *off, int out, int in, const float *X, int ldx,
                                 const uint16_t *W16, float *Y, int ldy) {
    (void)G, (void)off, (void)out, (void)in, (void)X, (void)ldx, (void)W16, (void)Y, (void)ldy;
    return -1;
}

#endif
