/* Products with quantized weights (quant.h): which kernel runs, the activations prepared once per call (group sums;
 * for the int8 way the rounding to int8 blocks), the outputs split over the threads, and the plain C kernels the
 * others are tested against. */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "kernels/cpu.h"
#include "kernels/quant.h"

#if ZY_HAVE_ISA_LEVELS
extern const ZyQuantTable zy_quant_table_generic, zy_quant_table_avx2, zy_quant_table_avx512,
    zy_quant_table_avxvnni, zy_quant_table_avx512vnni;
#endif

static const char *const kernel_names[ZY_QK_COUNT] = {"plain", "generic", "avx2", "avxvnni", "avx512", "avx512vnni"};

const char *zy_quant_kernel_name(ZyQuantKernel k) { return k >= 0 && k < ZY_QK_COUNT ? kernel_names[k] : "?"; }

/* ---- the plain kernels: scalar C, the order of the vector ones' arithmetic (per block, per group, then the tail) ---- */
static void plain_kernel(const ZyQuantActs *a, const ZyQuantMatrix *W, long o0, long o1, float *Y, int ldy, int int8) {
    const int bpg = W->group_size / 32;
    for (long o = o0; o < o1; o++)
        for (int r = 0; r < a->nr; r++) {
            float acc = 0, tail = 0;
            for (int g = 0; g < a->ng; g++) {
                float gacc = 0;
                for (int j = 0; j < bpg; j++) {
                    const int b = g * bpg + j;
                    if (int8) {
                        int32_t p = 0;
                        for (int k = 32 * b; k < 32 * b + 32; k++)
                            p += (int32_t)zy_quant_code(W, o, k) * a->xq[(long)r * a->in + k];
                        gacc += (float)p * a->d[r * a->nb + b];
                    } else {
                        for (int k = 32 * b; k < 32 * b + 32; k++)
                            gacc += (float)zy_quant_code(W, o, k) * a->X[(long)r * a->ldx + k];
                    }
                }
                const size_t at = (size_t)o * a->ng + g;
                const float s = zy_quant_load(W->scale_dtype, W->scales, at), b = zy_quant_load(W->scale_dtype, W->biases, at);
                const float sg = s * gacc, sc = s * a->corr[r * a->ng + g], bx = b * a->xsum[r * a->ng + g];
                acc += sg;
                tail += sc + bx;
            }
            Y[(long)r * ldy + o] = acc + tail;
        }
}
static void plain_widen(const ZyQuantActs *a, const ZyQuantMatrix *W, long o0, long o1, float *Y, int ldy) {
    plain_kernel(a, W, o0, o1, Y, ldy, 0);
}
static void plain_int8(const ZyQuantActs *a, const ZyQuantMatrix *W, long o0, long o1, float *Y, int ldy) {
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

int zy_quant_kernel_available(ZyQuantKernel k) {
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

/* Rows [0, nr) of X prepared for the kernels (scratch laid out by the caller). */
static void prepare_rows(ZyQuantActs *a, const ZyQuantTable *t, int bits, int int8) {
    const int G = a->in / a->ng, c = 1 << (bits - 1), centered = bits == 8 && t->centered8;
    for (int r = 0; r < a->nr; r++) {
        const float *x = a->X + (long)r * a->ldx;
        float *xsum = (float *)a->xsum + r * a->ng, *corr = (float *)a->corr + r * a->ng;
        for (int g = 0; g < a->ng; g++) {
            float s = 0;
            for (int k = g * G; k < (g + 1) * G; k++) s += x[k];
            xsum[g] = s;
            corr[g] = 0;
        }
        if (!int8) continue;
        int8_t *xq = (int8_t *)a->xq + (long)r * a->in;
        float *d = (float *)a->d + r * a->nb;
        for (int b = 0; b < a->nb; b++) {
            float amax = 0;
            for (int k = 32 * b; k < 32 * b + 32; k++) amax = fmaxf(amax, fabsf(x[k]));
            const float db = amax / 127.0f, id = db > 0 ? 1.0f / db : 0.0f;
            int32_t isum = 0;
            for (int k = 32 * b; k < 32 * b + 32; k++) {
                const float v = rintf(x[k] * id);
                xq[k] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v); /* |x·id| <= 127 up to rounding */
                isum += xq[k];
            }
            d[b] = db;
            /* the rounded values' share of the group's sum, which the codes' offset multiplies */
            corr[b / (G / 32)] -= db * (float)isum;
        }
        for (int g = 0; g < a->ng; g++) corr[g] = (float)c * (centered ? xsum[g] : xsum[g] + corr[g]);
    }
}

#define ZY_QUANT_CHUNK 32

int zy_matmul_quant(int k, int w, int rows, const float *X, int ldx, const ZyQuantMatrix *W, float *Y, int ldy) {
    const ZyQuantTable *t = table_of(k < 0 ? zy_quant_kernel_for_level() : (ZyQuantKernel)k);
    if (!t || (k >= 0 && !zy_quant_kernel_available((ZyQuantKernel)k))) return -1;
    if (rows <= 0 || W->rows <= 0) return 0;
    const int int8 = (w < 0 ? zy_quant_way() : (ZyQuantWay)w) == ZY_QUANT_INT8;
    const int in = W->cols, ng = in / W->group_size, nb = in / 32;
    /* scratch for every row: sums and corrections, block scales, int8 values */
    const size_t floats = (size_t)rows * (2 * ng + nb);
    float *scratch = malloc(floats * sizeof(float) + (int8 ? (size_t)rows * in : 0) + 64);
    if (!scratch) return -1;
    int8_t *xq = (int8_t *)(scratch + floats);
    ZyQuantActs all = {.nr = rows, .in = in, .ng = ng, .nb = nb, .X = X, .ldx = ldx, .xsum = scratch,
                       .corr = scratch + (size_t)rows * ng, .d = scratch + (size_t)rows * 2 * ng, .xq = xq};
    prepare_rows(&all, t, W->bits, int8);
    void (*kernel)(const ZyQuantActs *, const ZyQuantMatrix *, long, long, float *, int) = int8 ? t->int8 : t->widen;
    const long chunks = (W->rows + ZY_QUANT_CHUNK - 1) / ZY_QUANT_CHUNK;
    /* fixed chunks of outputs over the threads; a chunk's packed rows stay in cache while every row block passes */
#pragma omp parallel for schedule(static) if (W->rows * (long)in >= 65536L)
    for (long c = 0; c < chunks; c++) {
        const long o0 = c * ZY_QUANT_CHUNK, o1 = o0 + ZY_QUANT_CHUNK < W->rows ? o0 + ZY_QUANT_CHUNK : W->rows;
        for (int r0 = 0; r0 < rows; r0 += ZY_QUANT_ROW_BLOCK) {
            const int nr = rows - r0 < ZY_QUANT_ROW_BLOCK ? rows - r0 : ZY_QUANT_ROW_BLOCK;
            const ZyQuantActs a = {.nr = nr, .in = in, .ng = ng, .nb = nb, .X = X + (long)r0 * ldx, .ldx = ldx,
                                   .xsum = all.xsum + (size_t)r0 * ng, .corr = all.corr + (size_t)r0 * ng,
                                   .d = all.d + (size_t)r0 * nb, .xq = int8 ? xq + (size_t)r0 * in : NULL};
            kernel(&a, W, o0, o1, Y + (long)r0 * ldy, ldy);
        }
    }
    free(scratch);
    return 0;
}
