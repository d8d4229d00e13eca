/* Products with quantized weights (quant.h): which kernel runs, the activations prepared once per call (group sums;
 * for the int8 way the rounding to int8 blocks), the outputs split over the threads, and the plain C kernels the
 * others are tested against. */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "kernels/cpu.h"
#include "kernels/matmul.h"
#include "kernels/quant.h"
#include "kernels/quant_many.h"
#if defined(__SSE4_1__)
#include <immintrin.h>
#endif

#if ZY_HAVE_ISA_LEVELS
extern const ZyQuantTable zy_quant_table_generic, zy_quant_table_avx2, zy_quant_table_avx512,
    zy_quant_table_avxvnni, zy_quant_table_avx512vnni;
#endif

static const char *const kernel_names[ZY_QK_COUNT] = {"plain", "generic", "avx2", "avxvnni", "avx512", "avx512vnni"};

const char *zy_quant_kernel_name(ZyQuantKernel k) { return k >= 0 && k < ZY_QK_COUNT ? kernel_names[k] : "?"; }

/* Where column k's activation lies in the kernels' order: as is for 8-bit codes; for 4-bit ones, per block of 32,
 * the even columns then the odd ones (the low and high nibbles of the block's bytes). */
static inline int act_pos(int k, int bits) { return bits == 8 ? k : (k & ~31) + (k & 1) * 16 + (k & 31) / 2; }
/* Where column k's int8 activation lies (nb blocks of 32 in a row): for 4-bit codes by pairs of blocks, the even
 * columns of both blocks, then the odd ones of both (quant.h); a last unpaired block as act_pos. */
static inline int xq_pos(int k, int bits, int nb) {
    const int b = k / 32, w = act_pos(k, bits) - 32 * b; /* w: 0-15 the even columns, 16-31 the odd ones */
    if (bits == 8 || (b | 1) >= nb) return 32 * b + w;
    return 32 * (b & ~1) + (w / 16) * 32 + (b & 1) * 16 + w % 16;
}

/* ---- the plain kernels: scalar C, the vector ones' arithmetic (per group, then the tail) ---- */
static void plain_kernel(const ZyQuantActs *a, const ZyQuantMatrix *W, long o0, long o1, float *Y, int ldy, int int8) {
    const int G = W->group_size;
    for (long o = o0; o < o1; o++)
        for (int r = 0; r < a->nr; r++) {
            float acc = 0, tail = 0;
            for (int g = 0; g < a->ng; g++) {
                const size_t at = (size_t)o * a->ng + g;
                const float s = zy_quant_load(W->scale_dtype, W->scales, at), b = zy_quant_load(W->scale_dtype, W->biases, at);
                float t;
                if (int8) {
                    float gsum = 0;
                    for (int b = g * G / 32; b < (g + 1) * G / 32; b++) {
                        int32_t p = 0;
                        for (int k = 32 * b; k < 32 * b + 32; k++)
                            p += (int32_t)zy_quant_code(W, o, k) * a->xq[(long)r * a->in + xq_pos(k, W->bits, a->nb)];
                        const float pd = (float)p * a->d[r * a->nb + b];
                        gsum += pd;
                    }
                    t = gsum * s;
                } else {
                    float dot = 0;
                    for (int k = g * G; k < (g + 1) * G; k++) {
                        const float w = (float)zy_quant_code(W, o, k) * s;
                        dot += w * a->X[(long)r * a->ldx + act_pos(k, W->bits)];
                    }
                    t = dot;
                }
                const float sc = s * a->corr[r * a->ng + g], bx = b * a->xsum[r * a->ng + g];
                acc += t;
                tail += sc + bx;
            }
            Y[(long)r * ldy + o] = acc + tail;
        }
}
static void plain_widen(const ZyQuantActs *a, const ZyQuantMatrix *W, long o0, long o1, float *Y, int ldy, float *work) {
    (void)work;
    plain_kernel(a, W, o0, o1, Y, ldy, 0);
}
static void plain_int8(const ZyQuantActs *a, const ZyQuantMatrix *W, long o0, long o1, float *Y, int ldy, float *work) {
    (void)work;
    plain_kernel(a, W, o0, o1, Y, ldy, 1);
}
static const ZyQuantTable plain_table = {.name = "plain", .widen = plain_widen, .int8 = plain_int8, .centered8 = 0};

static const ZyQuantTable *table_of(ZyQuantKernel k) {
#if ZY_HAVE_ISA_LEVELS
    const ZyQuantTable *t[ZY_QK_COUNT] = {&plain_table,           &zy_quant_table_generic, &zy_quant_table_avx2,
                                          &zy_quant_table_avxvnni, &zy_quant_table_avx512,  &zy_quant_table_avx512vnni};
    if (k >= 0 && k < ZY_QK_COUNT && t[k]->name) return t[k];
#endif
    return k == ZY_QK_PLAIN || k == ZY_QK_GENERIC ? &plain_table : NULL;
}

static int runs_here(ZyQuantKernel k) {
    if (k == ZY_QK_PLAIN || k == ZY_QK_GENERIC) return 1;
    if (!table_of(k)) return 0;
    ZyCpuInfo ci;
    zy_cpu_detect(&ci);
    switch (k) {
    case ZY_QK_AVX2: return zy_cpu_supports(&ci, ZY_CPU_AVX2);
    case ZY_QK_AVXVNNI: return zy_cpu_supports(&ci, ZY_CPU_AVX2) && ci.avxvnni;
    case ZY_QK_AVX512: return zy_cpu_supports(&ci, ZY_CPU_AVX512);
    case ZY_QK_AVX512VNNI: return zy_cpu_supports(&ci, ZY_CPU_AVX512) && ci.avx512vnni;
    default: return 0;
    }
}

int zy_quant_kernel_available(ZyQuantKernel k) {
    /* CPUID once: in a VM each one traps to the hypervisor (a third of a small product's time, measured) */
    static atomic_int known = -1; /* bit k: kernel k runs here */
    int bits = atomic_load_explicit(&known, memory_order_relaxed);
    if (bits < 0) {
        bits = 0;
        for (int i = 0; i < ZY_QK_COUNT; i++) bits |= runs_here((ZyQuantKernel)i) << i;
        atomic_store(&known, bits);
    }
    return k >= 0 && k < ZY_QK_COUNT && (bits >> k & 1);
}

ZyQuantKernel zy_quant_kernel_for_level(void) {
    const ZyCpuLevel level = zy_cpu_level();
    if (level == ZY_CPU_GENERIC || !table_of(ZY_QK_AVX2)) return ZY_QK_GENERIC;
    if (level == ZY_CPU_AVX2) return zy_quant_kernel_available(ZY_QK_AVXVNNI) ? ZY_QK_AVXVNNI : ZY_QK_AVX2;
    return zy_quant_kernel_available(ZY_QK_AVX512VNNI) ? ZY_QK_AVX512VNNI : ZY_QK_AVX512;
}

/* ---- the process's way ---- */
static atomic_int process_way = ZY_QUANT_INT8;

int zy_quant_way_set(const char *name, ZyErr *err) {
    if (!name || !*name || strcasecmp(name, "auto") == 0 || strcasecmp(name, "int8") == 0)
        atomic_store(&process_way, ZY_QUANT_INT8);
    else if (strcasecmp(name, "widen") == 0)
        atomic_store(&process_way, ZY_QUANT_WIDEN);
    else
        return zy_fail(err, "ZAYA_QUANT_WAY=%s: not a way (auto, widen or int8)", name);
    return 0;
}

ZyQuantWay zy_quant_way(void) { return (ZyQuantWay)atomic_load(&process_way); }

const char *zy_quant_way_describe(ZyQuantWay w) {
    return w == ZY_QUANT_WIDEN ? "widen: codes widened to fp32, fp32 activations"
                               : "int8: activations rounded to int8 per block of 32, integer dot products";
}

/* ---- the product ---- */

/* A block of 32 activations rounded to int8 (d = max|x|/127, xq = rint(x/d) clamped to ±127), stored in the
 * kernels' order for `bits`: positions 0-15 of that order at xq, 16-31 at xq_hi (xq + 16 but in a pair of 4-bit
 * blocks); returns d and adds d·Σxq to *rounded. Run for every block of every call (decoding makes hundreds of calls
 * a token), so vectorised where SSE4.1 is: the same values as the scalar loop. */
static float round_block(const float *x, int8_t *xq, int8_t *xq_hi, int bits, float *rounded) {
#if defined(__SSE4_1__)
    const __m128 sign = _mm_set1_ps(-0.0f);
    __m128 m = _mm_setzero_ps();
    for (int k = 0; k < 32; k += 4) m = _mm_max_ps(m, _mm_andnot_ps(sign, _mm_loadu_ps(x + k)));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    const float amax = _mm_cvtss_f32(m), d = amax / 127.0f, id = d > 0 ? 1.0f / d : 0.0f;
    const __m128 vid = _mm_set1_ps(id), hi = _mm_set1_ps(127.0f), lo = _mm_set1_ps(-127.0f);
    __m128i half[2], isum = _mm_setzero_si128();
    for (int h = 0; h < 2; h++) {
        __m128i q[4];
        for (int i = 0; i < 4; i++) {
            const __m128 v = _mm_round_ps(_mm_mul_ps(_mm_loadu_ps(x + 16 * h + 4 * i), vid), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            q[i] = _mm_cvtps_epi32(_mm_max_ps(_mm_min_ps(v, hi), lo));
            isum = _mm_add_epi32(isum, q[i]);
        }
        half[h] = _mm_packs_epi16(_mm_packs_epi32(q[0], q[1]), _mm_packs_epi32(q[2], q[3]));
    }
    if (bits == 4) { /* the even columns, then the odd ones (act_pos) */
        const __m128i evens_odds = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
        const __m128i s0 = _mm_shuffle_epi8(half[0], evens_odds), s1 = _mm_shuffle_epi8(half[1], evens_odds);
        half[0] = _mm_unpacklo_epi64(s0, s1), half[1] = _mm_unpackhi_epi64(s0, s1);
    }
    _mm_storeu_si128((__m128i *)(void *)xq, half[0]);
    _mm_storeu_si128((__m128i *)(void *)xq_hi, half[1]);
    isum = _mm_add_epi32(isum, _mm_shuffle_epi32(isum, _MM_SHUFFLE(1, 0, 3, 2)));
    isum = _mm_add_epi32(isum, _mm_shuffle_epi32(isum, _MM_SHUFFLE(2, 3, 0, 1)));
    *rounded += d * (float)_mm_cvtsi128_si32(isum);
    return d;
#else
    float amax = 0;
    for (int k = 0; k < 32; k++) amax = fmaxf(amax, fabsf(x[k]));
    const float d = amax / 127.0f, id = d > 0 ? 1.0f / d : 0.0f;
    int32_t isum = 0;
    for (int k = 0; k < 32; k++) {
        const float v = rintf(x[k] * id);
        const int8_t i8 = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v); /* |x·id| <= 127 up to rounding */
        const int at = act_pos(k, bits);
        (at < 16 ? xq : xq_hi - 16)[at] = i8;
        isum += i8;
    }
    *rounded += d * (float)isum;
    return d;
#endif
}

/* Σ x[0..n) for n a multiple of 8, in eight running sums where SSE is (a call prepares hundreds of groups: one
 * running sum's chain of dependent adds took a microsecond or more per call, serially, while the other threads wait). */
static float group_sum(const float *x, int n) {
#if defined(__SSE4_1__)
    __m128 a = _mm_setzero_ps(), b = _mm_setzero_ps();
    for (int k = 0; k < n; k += 8) a = _mm_add_ps(a, _mm_loadu_ps(x + k)), b = _mm_add_ps(b, _mm_loadu_ps(x + k + 4));
    a = _mm_add_ps(a, b);
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    return _mm_cvtss_f32(_mm_add_ss(a, _mm_shuffle_ps(a, a, 1)));
#else
    float s[8] = {0};
    for (int k = 0; k < n; k += 8)
        for (int i = 0; i < 8; i++) s[i] += x[k + i];
    return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
#endif
}

/* Rows [0, nr) of X prepared for the kernels (a->X, a->xq, ... point into the caller's scratch; xsrc, ldx: X). */
static void prepare_rows(ZyQuantActs *a, const float *xsrc, int ldx, const ZyQuantTable *t, int bits, int int8) {
    const int G = a->in / a->ng, c = 1 << (bits - 1), centered = bits == 8 && t->centered8;
    for (int r = 0; r < a->nr; r++) {
        const float *x = xsrc + (long)r * ldx;
        float *xsum = (float *)a->xsum + r * a->ng, *corr = (float *)a->corr + r * a->ng;
        if (bits == 4 && !int8) /* the widen kernels' order (a->X is then the caller's copy, ldx = in) */
            for (int k = 0; k < a->in; k++) ((float *)a->X)[(long)r * a->in + act_pos(k, 4)] = x[k];
        for (int g = 0; g < a->ng; g++) {
            const float s = group_sum(x + g * G, G);
            xsum[g] = s;
            corr[g] = 0;
            if (!int8) continue;
            float rounded = 0; /* Σ d·xq over the group: what the dot products of the uncentered codes carry */
            for (int b = g * G / 32; b < (g + 1) * G / 32; b++) {
                int8_t *xq = (int8_t *)a->xq + (long)r * a->in + 32 * b, *xq_hi = xq + 16;
                if (bits == 4 && (b | 1) < a->nb) /* a pair of blocks (xq_pos) */
                    xq = (int8_t *)a->xq + (long)r * a->in + 32 * (b & ~1) + 16 * (b & 1), xq_hi = xq + 32;
                const float d = round_block(x + 32 * b, xq, xq_hi, bits, &rounded);
                ((float *)a->d)[r * a->nb + b] = d;
                if (bits == 4)
                    for (int i = 0; i < 4; i++) ((float *)a->d8)[(long)r * 4 * a->nb + 4 * b + i] = d;
            }
            corr[g] = (float)c * (centered ? s : s - rounded); /* the offset's share, against the exact sum */
        }
    }
}

#define ZY_QUANT_CHUNK 32

int zy_matmul_quant(int k, int w, int rows, const float *X, int ldx, const ZyQuantMatrix *W, float *Y, int ldy) {
    return zy_matmul_quant_shared(k, w, rows, X, ldx, 1, W, &Y, &ldy);
}

static int shared_by(const ZyQuantTable *t, int w, int rows, const float *X, int ldx, int n, const ZyQuantMatrix *W,
                     float *const *Y, const int *ldy);

int zy_matmul_quant_shared(int k, int w, int rows, const float *X, int ldx, int n, const ZyQuantMatrix *W,
                           float *const *Y, const int *ldy) {
    const ZyQuantTable *t = table_of(k < 0 ? zy_quant_kernel_for_level() : (ZyQuantKernel)k);
    if (!t || (k >= 0 && !zy_quant_kernel_available((ZyQuantKernel)k))) return -1;
    return shared_by(t, w, rows, X, ldx, n, W, Y, ldy);
}

int zy_matmul_quant_by(const ZyQuantTable *t, int w, int rows, const float *X, int ldx, const ZyQuantMatrix *W,
                       float *Y, int ldy) {
    return t && t->int8 && t->widen ? shared_by(t, w, rows, X, ldx, 1, W, &Y, &ldy) : -1;
}

static int shared_by(const ZyQuantTable *t, int w, int rows, const float *X, int ldx, int n, const ZyQuantMatrix *W,
                     float *const *Y, const int *ldy) {
    for (int i = 1; i < n; i++)
        if (W[i].bits != W[0].bits || W[i].group_size != W[0].group_size || W[i].cols != W[0].cols) return -1;
    if (rows <= 0 || n <= 0) return 0;
    const int int8 = (w < 0 ? zy_quant_way() : (ZyQuantWay)w) == ZY_QUANT_INT8;
    const int in = W->cols, ng = in / W->group_size, nb = in / 32, bits = W->bits;
    /* scratch for every row: sums, corrections, block scales (4-bit int8: also as pairs' lanes); the reordered fp32
     * rows (4-bit widen); the int8 values */
    const int reorder = bits == 4 && !int8; /* the widen kernels read a reordered fp32 copy of X */
    const size_t lanes = bits == 4 && int8 ? (size_t)rows * 4 * nb : 0;
    const size_t floats = (size_t)rows * (2 * ng + nb) + lanes + (reorder ? (size_t)rows * in : 0);
    float *scratch = malloc(floats * sizeof(float) + (int8 ? (size_t)rows * in : 0) + 64);
    if (!scratch) return -1;
    int8_t *xq = (int8_t *)(scratch + floats);
    float *d8 = scratch + (size_t)rows * (2 * ng + nb), *xcopy = d8 + lanes;
    ZyQuantActs all = {.nr = rows, .in = in, .ng = ng, .nb = nb, .X = reorder ? xcopy : X, .ldx = reorder ? in : ldx,
                       .xsum = scratch, .corr = scratch + (size_t)rows * ng, .d = scratch + (size_t)rows * 2 * ng,
                       .d8 = d8, .xq = xq};
    prepare_rows(&all, X, ldx, t, bits, int8);
    const ZyQuantKernelFn kernel = int8 ? t->int8 : t->widen;
    long chunks = 0, outputs = 0; /* over the n products, in order */
    for (int i = 0; i < n; i++) chunks += (W[i].rows + ZY_QUANT_CHUNK - 1) / ZY_QUANT_CHUNK, outputs += W[i].rows;
    int failed = 0;
    /* chunks of outputs handed out as the threads free up, in runs that shrink as the work does (guided: first
     * 1/threads of what is left, down to one chunk at the end), so each thread reads long runs and a thread held up by
     * its neighbours on the memory bus or by the host does not leave the others waiting at the join. Measured on q4
     * ZAYA1-8B steps (two schedules alternating step by step in one run, the median of the pairs' ratios): static
     * halves left each thread ~7% of a step at the join; guided steps were 2.5-7% faster than runs of 4 chunks, and
     * runs of 2 and of 1 chunk 2% and 8% slower than runs of 4. A chunk's packed rows stay in cache while every row
     * block passes. */
#pragma omp parallel if (outputs * in >= 65536L)
    {
        float *work = malloc(sizeof(float) * zy_quant_work_floats(ng));
        if (!work) failed = 1;
#pragma omp for schedule(guided)
        for (long c = 0; c < chunks; c++) {
            if (!work) continue;
            int i = 0; /* the product chunk c falls in, and its first chunk */
            long first = 0;
            for (long nc; c >= first + (nc = (W[i].rows + ZY_QUANT_CHUNK - 1) / ZY_QUANT_CHUNK); i++) first += nc;
            const ZyQuantMatrix *Wi = &W[i];
            const long o0 = (c - first) * ZY_QUANT_CHUNK, o1 = o0 + ZY_QUANT_CHUNK < Wi->rows ? o0 + ZY_QUANT_CHUNK : Wi->rows;
            for (int r0 = 0; r0 < rows; r0 += ZY_QUANT_ROW_BLOCK) {
                const int nr = rows - r0 < ZY_QUANT_ROW_BLOCK ? rows - r0 : ZY_QUANT_ROW_BLOCK;
                const ZyQuantActs a = {.nr = nr, .in = in, .ng = ng, .nb = nb, .X = all.X + (long)r0 * all.ldx, .ldx = all.ldx,
                                       .xsum = all.xsum + (size_t)r0 * ng, .corr = all.corr + (size_t)r0 * ng,
                                       .d = all.d + (size_t)r0 * nb, .d8 = d8 + (lanes ? (size_t)r0 * 4 * nb : 0),
                                       .xq = int8 ? xq + (size_t)r0 * in : NULL};
                kernel(&a, Wi, o0, o1, Y[i] + (long)r0 * ldy[i], ldy[i], work);
            }
        }
        free(work);
    }
    free(scratch);
    return failed ? -1 : 0;
}

/* ---- a layer's product: few rows by the kernels, many by dequantized panels ---- */

void zy_matmul_quant_panels(int rows, int out, int in, const float *X, int ldx, const ZyQuantMatrix *W, float *Y,
                            int ldy) {
    const int panel = out < ZY_QUANT_PANEL ? out : ZY_QUANT_PANEL;
    float *wp = malloc((size_t)panel * in * sizeof *wp);
    if (!wp) { /* no room for a panel: the few-row kernels take any number of rows, only slower */
        ZyQuantMatrix m = zy_quant_rows(W, 0, out);
        if (zy_matmul_quant(-1, -1, rows, X, ldx, &m, Y, ldy) == 0) return;
        for (int r = 0; r < rows; r++) /* nothing could run: NaN, which the callers' non-finite checks report */
            for (int o = 0; o < out; o++) Y[(long)r * ldy + o] = NAN;
        return;
    }
    for (int o0 = 0; o0 < out; o0 += panel) {
        const int np = out - o0 < panel ? out - o0 : panel;
#pragma omp parallel for schedule(static) if ((long)np * in >= 65536L)
        for (int o = 0; o < np; o++) zy_quant_dequant_row(W, o0 + o, wp + (long)o * in);
        zy_gemm(0, 1, rows, np, in, 1, X, ldx, wp, in, 0, Y + o0, ldy);
    }
    free(wp);
}

void zy_matmul_quant_wt(int rows, int out, int in, const float *X, int ldx, const ZyQuantMatrix *W, float *Y, int ldy) {
    if (rows <= 0 || out <= 0 || in <= 0) return;
    const ZyQuantMatrix m = zy_quant_rows(W, 0, out);
    if (rows <= ZY_QUANT_MAX_ROWS && zy_matmul_quant(-1, -1, rows, X, ldx, &m, Y, ldy) == 0) return;
    if (zy_matmul_quant_many(zy_quant_many(), rows, out, in, X, ldx, &m, Y, ldy) == 0) return;
    zy_matmul_quant_panels(rows, out, in, X, ldx, &m, Y, ldy);
}

void zy_quant_embed(float *x, const ZyQuantMatrix *emb, const int32_t *tokens, const float *bias, const float *scale,
                    int rows, int dim) {
#pragma omp parallel for schedule(static) if ((long)rows * dim >= 65536L)
    for (int r = 0; r < rows; r++) {
        float *row = x + (long)r * dim;
        zy_quant_dequant_row(emb, tokens[r], row);
        for (int i = 0; i < dim; i++) row[i] = (row[i] + bias[i]) * scale[i];
    }
}
