/* Quantized weights (src/kernels/quant*.c): the format (mlx's rounding on hand-checked groups, the error bound of a
 * quantize -> dequantize round trip, half-precision stores), and every kernel this CPU runs, both ways, against a
 * double-precision reference. The bit-for-bit agreement with mlx.core.quantize is tests/oracle/test_quant_mlx.py. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu.h"
#include "kernels/matmul.h"
#include "kernels/quant.h"
#include "kernels/quant_many.h"
#include "test.h"

TEST(quant_format_check_names_what_is_supported) {
    ZyErr err;
    CHECK(zy_quant_format_check(8, 64, &err) == 0);
    CHECK(zy_quant_format_check(4, 32, &err) == 0);
    CHECK(zy_quant_format_check(4, 128, &err) == 0);
    CHECK(zy_quant_format_check(3, 64, &err) != 0 && strstr(err.msg, "3-bit") && strstr(err.msg, "8 or 4"));
    CHECK(zy_quant_format_check(8, 16, &err) != 0 && strstr(err.msg, "group size 16"));
}

/* Groups worked by hand from mlx's algorithm. */
TEST(quant_row_follows_mlx_on_hand_checked_groups) {
    float w[32], s, b;
    uint32_t q[8];
    /* 0..31 / 31 * 3 - 1: |min| = 1 < |max| = 2, so the max is the edge: s = -(3/15), q0 = rint(2 / -0.2) = -10,
     * s = 2 / -10 = -0.2, b = 2; w = 2 - 0.2 q, q = rint((2 - w) / 0.2) */
    for (int i = 0; i < 32; i++) w[i] = (float)i / 31.0f * 3.0f - 1.0f;
    zy_quant_row(w, 32, 4, 32, q, &s, &b);
    CHECK(s == 2.0f / -10.0f && b == 2.0f);
    for (int i = 0; i < 32; i++) {
        const unsigned code = (q[i / 8] >> (i % 8 * 4)) & 15;
        CHECK(code == (unsigned)rintf((w[i] - 2.0f) / (2.0f / -10.0f)));
    }
    CHECK((q[0] & 15) == 15 && (q[3] >> 28) == 0); /* the first column in the lowest bits */
    /* all zero: s = -1e-7 (the floor, negative as the max is the edge), q0 = 0, so b = 0 and every code 0 */
    memset(w, 0, sizeof w);
    zy_quant_row(w, 32, 8, 32, q, &s, &b);
    CHECK(s == -1e-7f && b == 0.0f);
    for (int i = 0; i < 8; i++) CHECK(q[i] == 0);
    /* 8 bits: the min is the edge (|-3| > |1|), s = 4/255 > 0, q0 = rint(-3/s) = -191, s = -3 / -191, b = -3 */
    for (int i = 0; i < 32; i++) w[i] = -3.0f + 4.0f * (float)i / 31.0f;
    zy_quant_row(w, 32, 8, 32, q, &s, &b);
    CHECK(s == -3.0f / -191.0f && b == -3.0f);
    CHECK((q[0] & 255) == 0 && (q[7] >> 24) == (unsigned)rintf((1.0f + 3.0f) / s));
}

static void random_matrix(float *w, long n, unsigned seed, float scale) {
    ZyRng rng;
    zy_rng_seed(&rng, seed);
    for (long i = 0; i < n; i++) w[i] = (float)(scale * zy_rng_normal(&rng)) + (i % 97 == 0 ? 0.3f * scale : 0.0f);
}

/* A matrix quantized into the stored layout (scales and biases in dtype). */
typedef struct {
    ZyQuantMatrix m;
    uint32_t *q;
    void *s, *b;
} Quantized;

static int quantize_matrix(Quantized *out, const float *w, long rows, int cols, int bits, int G, ZyDtype dt) {
    const int words = zy_quant_row_words(cols, bits), groups = cols / G;
    const size_t es = zy_dtype_size(dt);
    out->q = malloc((size_t)rows * words * 4);
    out->s = malloc((size_t)rows * groups * es);
    out->b = malloc((size_t)rows * groups * es);
    float *fs = malloc((size_t)groups * 4), *fb = malloc((size_t)groups * 4);
    if (!out->q || !out->s || !out->b || !fs || !fb) return -1;
    for (long o = 0; o < rows; o++) {
        zy_quant_row(w + o * cols, cols, bits, G, out->q + o * words, fs, fb);
        for (int g = 0; g < groups; g++) {
            zy_quant_store(dt, fs[g], out->s, (size_t)o * groups + g);
            zy_quant_store(dt, fb[g], out->b, (size_t)o * groups + g);
        }
    }
    free(fs), free(fb);
    out->m = (ZyQuantMatrix){.bits = bits, .group_size = G, .rows = rows, .cols = cols, .q = out->q, .scales = out->s,
                             .biases = out->b, .scale_dtype = dt};
    return 0;
}
static void quantized_free(Quantized *q) { free(q->q), free(q->s), free(q->b); }

/* quantize -> dequantize, against the format's bound: a value inside the group's grid [b, b + n·s] is within half a
 * step |s|/2; mlx moves s so that 0 lies on the grid (s = edge/q0), which can leave the far extreme outside it, clamped
 * to the last code: within one step of the unmoved grid, (max - min)/n. Plus what rounding the stored scale and bias
 * to bf16 / f16 moves a code's value (q·|Δs| + |Δb|). */
TEST(quant_round_trip_error_within_the_format_bound) {
    enum { R = 24, C = 256 };
    float *w = malloc(sizeof(float) * R * C), *back = malloc(sizeof(float) * C);
    REQUIRE(w && back);
    random_matrix(w, (long)R * C, 7, 0.05f);
    const ZyDtype dts[] = {ZY_DT_F32, ZY_DT_BF16, ZY_DT_F16};
    for (int bits = 4; bits <= 8; bits += 4)
        for (int G = 32; G <= 128; G *= 2)
            for (size_t di = 0; di < ZY_ARRAY_LEN(dts); di++) {
                Quantized qm;
                REQUIRE(quantize_matrix(&qm, w, R, C, bits, G, dts[di]) == 0);
                const double unit = dts[di] == ZY_DT_F32 ? 0x1p-24 : dts[di] == ZY_DT_BF16 ? 0x1p-8 : 0x1p-11;
                double worst = 0;
                for (long o = 0; o < R; o++) {
                    zy_quant_dequant_row(&qm.m, o, back);
                    float fs[C / 32], fb[C / 32];
                    uint32_t qq[C / 4];
                    zy_quant_row(w + o * C, C, bits, G, qq, fs, fb);
                    for (int k = 0; k < C; k++) {
                        const int g = k / G;
                        const double s = fabs(fs[g]), code = zy_quant_code(&qm.m, o, k), n = (1 << bits) - 1;
                        const double lo = fmin(fb[g], fb[g] + n * fs[g]), hi = fmax(fb[g], fb[g] + n * fs[g]);
                        double wmin = INFINITY, wmax = -INFINITY;
                        for (int j = g * G; j < (g + 1) * G; j++)
                            wmin = fmin(wmin, w[o * C + j]), wmax = fmax(wmax, w[o * C + j]);
                        const double x = w[o * C + k], inside = x >= lo - 1e-7 && x <= hi + 1e-7;
                        const double step = inside ? 0.5 * s : (wmax - wmin) / n;
                        const double bound = step * (1 + 1e-5) + unit * (code * s + fabs(fb[g])) + 1e-9;
                        const double e = fabs((double)back[k] - w[o * C + k]);
                        if (e / bound > worst) worst = e / bound;
                    }
                }
                CHECK_MSG(worst <= 1.0, "%d-bit group %d %s: error %.3g of the bound", bits, G,
                          zy_dtype_name(dts[di]), worst);
                quantized_free(&qm);
            }
    free(w), free(back);
}

TEST(quant_f16_store_rounds_to_nearest_even) {
    int bad = 0;
    for (uint32_t h = 0; h < 0x10000u; h++) { /* every half survives f32 and back */
        if ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu)) continue; /* NaN */
        if (zy_f32_to_f16(zy_f16_to_f32((uint16_t)h)) != h) bad++;
    }
    CHECK_MSG(bad == 0, "%d halves change", bad);
    /* halfway between 1 and its neighbour 1 + 2^-10: to even (1); a little more: up */
    CHECK(zy_f32_to_f16(1.0f + 0x1p-11f) == 0x3c00u);
    CHECK(zy_f32_to_f16(1.0f + 0x1p-11f + 0x1p-20f) == 0x3c01u);
    CHECK(zy_f32_to_f16(1.0f + 3 * 0x1p-11f) == 0x3c02u); /* 1 + 1.5 ulp: tie, to the even 2 ulp */
    CHECK(zy_f32_to_f16(65504.0f) == 0x7bffu && zy_f32_to_f16(65519.0f) == 0x7bffu && zy_f32_to_f16(65520.0f) == 0x7c00u);
    CHECK(zy_f32_to_f16(0x1p-25f) == 0 && zy_f32_to_f16(0x1.001p-25f) == 1 && zy_f32_to_f16(0x1.8p-24f) == 2);
    CHECK(zy_f32_to_f16(-0x1p-14f) == 0x8400u && zy_f32_to_f16(0x1.ff8p-15f) == 0x3ffu && zy_f32_to_f16(0x1.ffcp-15f) == 0x400u);
}

/* The int8 way's activations, as quant_matmul.c rounds them: per block of G = 32, d = max|x| / 127. */
static void round_int8(const float *x, int n, int G, double *xr) {
    for (int g = 0; g < n / G; g++) {
        float amax = 0;
        for (int k = G * g; k < G * g + G; k++) amax = fmaxf(amax, fabsf(x[k]));
        const float d = amax / 127.0f, id = d > 0 ? 1.0f / d : 0.0f;
        for (int k = G * g; k < G * g + G; k++) {
            const float v = rintf(x[k] * id);
            xr[k] = (double)d * (v > 127 ? 127 : v < -127 ? -127 : v);
        }
    }
}

/* y[r, o] in double: Σ_g s Σ x̃ (q - c) + (c s + b) Σ x, with x̃ the activations the way multiplies (x itself for
 * widen: then it is Σ x (s q + b) exactly). */
static void reference(const ZyQuantMatrix *m, int rows, const float *X, int ldx, int int8, double *Y, double *mag) {
    const int C = m->cols, G = m->group_size, c = 1 << (m->bits - 1);
    double *xr = malloc(sizeof(double) * C);
    for (int r = 0; r < rows; r++) {
        const float *x = X + (long)r * ldx;
        if (int8) round_int8(x, C, 32, xr);
        else
            for (int k = 0; k < C; k++) xr[k] = x[k];
        for (long o = 0; o < m->rows; o++) {
            double y = 0, a = 0;
            for (int g = 0; g < C / G; g++) {
                const double s = zy_quant_load(m->scale_dtype, m->scales, (size_t)o * (C / G) + g);
                const double b = zy_quant_load(m->scale_dtype, m->biases, (size_t)o * (C / G) + g);
                double dot = 0, sum = 0;
                for (int k = g * G; k < (g + 1) * G; k++) {
                    const double q = zy_quant_code(m, o, k);
                    dot += xr[k] * (q - c);
                    sum += x[k];
                    a += fabs(x[k]) * fabs(s * q + b);
                }
                y += s * dot + (c * s + b) * sum;
            }
            Y[(long)r * m->rows + o] = y;
            mag[(long)r * m->rows + o] = a;
        }
    }
    free(xr);
}

#if ZY_HAVE_ISA_LEVELS
extern const ZyQuantTable zy_quant_table_avxvnni_emulated;
#endif
/* The kernels checked: the kernel table's (k < ZY_QK_COUNT) where this CPU runs them, then (k = ZY_QK_COUNT) the
 * AVX-VNNI kernels with the instruction emulated in AVX2 (the Makefile's test-only level): no CPU here need have VNNI
 * for their arithmetic (uncentered 8-bit codes, the 4-bit pairs by vpdpbusd) to be checked. */
#define CHECKED_KERNELS (ZY_QK_COUNT + 1)
static const ZyQuantTable *emulated_vnni(void) {
#if ZY_HAVE_ISA_LEVELS
    if (zy_quant_kernel_available(ZY_QK_AVX2)) return &zy_quant_table_avxvnni_emulated;
#endif
    return NULL;
}
static int kernel_runs(int k) { return k < ZY_QK_COUNT ? zy_quant_kernel_available((ZyQuantKernel)k) : emulated_vnni() != NULL; }
static const char *kernel_label(int k) { return k < ZY_QK_COUNT ? zy_quant_kernel_name((ZyQuantKernel)k) : "avxvnni (emulated)"; }
static int run_kernel(int k, int way, int rows, const float *X, int ldx, const ZyQuantMatrix *W, float *Y, int ldy) {
    return k < ZY_QK_COUNT ? zy_matmul_quant(k, way, rows, X, ldx, W, Y, ldy)
                           : zy_matmul_quant_by(emulated_vnni(), way, rows, X, ldx, W, Y, ldy);
}

TEST(quant_kernels_match_double_reference_at_every_level) {
    enum { OUT = 72, IN = 512, ROWS = 6 };
    float *w = malloc(sizeof(float) * OUT * IN), *X = malloc(sizeof(float) * ROWS * (IN + 8));
    float *Y = malloc(sizeof(float) * ROWS * OUT);
    double *ref = malloc(sizeof(double) * ROWS * OUT), *mag = malloc(sizeof(double) * ROWS * OUT);
    double *wide = malloc(sizeof(double) * ROWS * OUT);
    REQUIRE(w && X && Y && ref && mag && wide);
    random_matrix(w, (long)OUT * IN, 11, 0.04f);
    random_matrix(X, (long)ROWS * (IN + 8), 12, 1.0f);
    for (int i = 0; i < 40; i++) X[(i * 131) % (ROWS * (IN + 8))] *= 9.0f; /* outliers: blocks with large d */
    memset(X + IN + 8 + 64, 0, 32 * sizeof(float));                        /* an all-zero block: d = 0 */
    int ran = 0;
    const ZyDtype dts[] = {ZY_DT_BF16, ZY_DT_F32, ZY_DT_F16};
    for (int bits = 8; bits >= 4; bits -= 4)
        for (int G = 32; G <= 128; G *= 2)
            for (size_t di = 0; di < ZY_ARRAY_LEN(dts); di++) {
                if (di > 0 && G != 64) continue; /* the other dtypes at one group size */
                Quantized qm;
                REQUIRE(quantize_matrix(&qm, w, OUT, IN, bits, G, dts[di]) == 0);
                for (int way = 0; way < 2; way++) {
                    reference(&qm.m, ROWS, X, IN + 8, way, ref, mag);
                    if (way == 0) memcpy(wide, ref, sizeof(double) * ROWS * OUT);
                    for (int k = 0; k < CHECKED_KERNELS; k++) {
                        if (!kernel_runs(k)) continue;
                        for (int rows = 1; rows <= ROWS; rows++) {
                            memset(Y, 0xff, sizeof(float) * ROWS * OUT);
                            REQUIRE(run_kernel(k, way, rows, X, IN + 8, &qm.m, Y, OUT) == 0);
                            double worst = 0;
                            for (long i = 0; i < (long)rows * OUT; i++) {
                                const double e = fabs(Y[i] - ref[i]) / (mag[i] + 1e-30);
                                worst = e > worst ? e : worst;
                            }
                            CHECK_MSG(worst < 2e-6, "%s %s %d-bit G%d %s rows %d: %.3g", kernel_label(k),
                                      way ? "int8" : "widen", bits, G, zy_dtype_name(dts[di]), rows, worst);
                            ran++;
                        }
                    }
                    if (way == 1) { /* the int8 rounding itself: close to the fp32 activations' product */
                        double num = 0, den = 0;
                        for (long i = 0; i < (long)ROWS * OUT; i++)
                            num += (ref[i] - wide[i]) * (ref[i] - wide[i]), den += wide[i] * wide[i];
                        CHECK_MSG(sqrt(num / den) < 0.01, "int8 rounding %d-bit G%d: %.3g", bits, G, sqrt(num / den));
                        if (di == 0) printf("    %d-bit group %d: int8 activations move the product by %.2g (normwise)\n",
                                            bits, G, sqrt(num / den));
                    }
                }
                quantized_free(&qm);
            }
    int levels = 0;
    for (int k = 0; k < ZY_QK_COUNT; k++) levels += zy_quant_kernel_available((ZyQuantKernel)k);
    printf("    %d kernels of %d run here, %s (%d products checked); the process's: %s\n", levels, (int)ZY_QK_COUNT,
           emulated_vnni() ? "and the AVX-VNNI ones emulated" : "no emulated AVX-VNNI (no AVX2)", ran,
           zy_quant_kernel_name(zy_quant_kernel_for_level()));
    free(w), free(X), free(Y), free(ref), free(mag), free(wide);
}

/* An odd number of blocks of 32 (groups of 32: the 4-bit kernels take blocks in pairs, the last one alone), and a
 * row's product the same bits alone as beside other rows (decoding one sequence or several in a step). */
TEST(quant_kernels_odd_block_count_and_rows_alone) {
    enum { OUT = 40, IN = 544, ROWS = 6 }; /* 17 blocks */
    float *w = malloc(sizeof(float) * OUT * IN), *X = malloc(sizeof(float) * ROWS * IN);
    float *Y = malloc(sizeof(float) * ROWS * OUT), *Y1 = malloc(sizeof(float) * OUT);
    double *ref = malloc(sizeof(double) * ROWS * OUT), *mag = malloc(sizeof(double) * ROWS * OUT);
    REQUIRE(w && X && Y && Y1 && ref && mag);
    random_matrix(w, (long)OUT * IN, 21, 0.04f);
    random_matrix(X, (long)ROWS * IN, 22, 1.0f);
    for (int i = 0; i < 30; i++) X[(i * 97) % (ROWS * IN)] *= 9.0f;
    int ran = 0;
    for (int bits = 8; bits >= 4; bits -= 4) {
        Quantized qm;
        REQUIRE(quantize_matrix(&qm, w, OUT, IN, bits, 32, ZY_DT_BF16) == 0);
        reference(&qm.m, ROWS, X, IN, 1, ref, mag);
        for (int k = 0; k < CHECKED_KERNELS; k++) {
            if (!kernel_runs(k)) continue;
            REQUIRE(run_kernel(k, ZY_QUANT_INT8, ROWS, X, IN, &qm.m, Y, OUT) == 0);
            double worst = 0;
            for (long i = 0; i < (long)ROWS * OUT; i++) {
                const double e = fabs(Y[i] - ref[i]) / (mag[i] + 1e-30);
                worst = e > worst ? e : worst;
            }
            CHECK_MSG(worst < 2e-6, "%s %d-bit, 17 blocks: %.3g", kernel_label(k), bits, worst);
            for (int r = 0; r < ROWS; r++) {
                REQUIRE(run_kernel(k, ZY_QUANT_INT8, 1, X + (long)r * IN, IN, &qm.m, Y1, OUT) == 0);
                CHECK_MSG(memcmp(Y1, Y + (long)r * OUT, sizeof(float) * OUT) == 0, "%s %d-bit: row %d alone differs",
                          kernel_label(k), bits, r);
            }
            ran++;
        }
        quantized_free(&qm);
    }
    CHECK(ran >= 4);
    free(w), free(X), free(Y), free(Y1), free(ref), free(mag);
}

/* A layer's projections of one input in one pass (zy_matmul_wt_shared: X rounded once, one parallel region) give
 * each product's zy_matmul_wt bits: one format (the shared pass), mixed formats and fp32 weights (one call each). */
TEST(quant_shared_products_equal_separate_ones) {
    enum { IN = 256, ROWS = 3 };
    const int outs[] = {96, 40, 64};
    float *w = malloc(sizeof(float) * 96 * IN), *X = malloc(sizeof(float) * ROWS * IN);
    float *got[3], *want[3];
    REQUIRE(w && X);
    random_matrix(w, 96L * IN, 31, 0.05f);
    random_matrix(X, (long)ROWS * IN, 32, 1.0f);
    for (int i = 0; i < 3; i++) REQUIRE((got[i] = malloc(sizeof(float) * ROWS * 96)) && (want[i] = malloc(sizeof(float) * ROWS * 96)));
    for (int mixed = 0; mixed < 3; mixed++) { /* 0: all 4-bit; 1: one 8-bit; 2: fp32 weights */
        Quantized qm[3];
        ZyWeights W[3];
        for (int i = 0; i < 3; i++) {
            REQUIRE(quantize_matrix(&qm[i], w + i * 7, outs[i], IN, mixed == 1 && i == 1 ? 8 : 4, 64, ZY_DT_BF16) == 0);
            W[i] = mixed == 2 ? (ZyWeights){.f32 = w + i * 7} : (ZyWeights){.quant = qm[i].m};
        }
        for (int rows = 1; rows <= ROWS; rows++) {
            const int ld[] = {96, 41, 64};
            for (int i = 0; i < 3; i++) {
                memset(got[i], 0, sizeof(float) * ROWS * 96);
                zy_matmul_wt(rows, outs[i], IN, X, IN, W[i], want[i], ld[i]);
            }
            zy_matmul_wt_shared(rows, IN, X, IN, 3, W, outs, got, ld);
            for (int i = 0; i < 3; i++)
                for (int r = 0; r < rows; r++)
                    CHECK_MSG(memcmp(got[i] + (long)r * ld[i], want[i] + (long)r * ld[i], sizeof(float) * outs[i]) == 0,
                              "case %d rows %d product %d row %d differs", mixed, rows, i, r);
        }
        for (int i = 0; i < 3; i++) quantized_free(&qm[i]);
    }
    for (int i = 0; i < 3; i++) free(got[i]), free(want[i]);
    free(w), free(X);
}

/* One expert of a stack: zy_quant_rows is the same as quantizing that expert alone. */
TEST(quant_rows_view_is_one_expert_of_a_stack) {
    enum { E = 3, OUT = 8, IN = 64 };
    float w[E * OUT * IN], x[IN], y_all[E * OUT], y_one[OUT];
    random_matrix(w, E * OUT * IN, 5, 0.1f);
    random_matrix(x, IN, 6, 1.0f);
    Quantized stack, one;
    REQUIRE(quantize_matrix(&stack, w, E * OUT, IN, 4, 32, ZY_DT_BF16) == 0);
    REQUIRE(quantize_matrix(&one, w + 2 * OUT * IN, OUT, IN, 4, 32, ZY_DT_BF16) == 0);
    const ZyQuantMatrix e2 = zy_quant_rows(&stack.m, 2 * OUT, OUT);
    REQUIRE(zy_matmul_quant(-1, -1, 1, x, IN, &e2, y_one, OUT) == 0);
    REQUIRE(zy_matmul_quant(-1, -1, 1, x, IN, &stack.m, y_all, E * OUT) == 0);
    CHECK(memcmp(y_one, y_all + 2 * OUT, sizeof y_one) == 0);
    REQUIRE(zy_matmul_quant(-1, -1, 1, x, IN, &one.m, y_all, OUT) == 0);
    CHECK(memcmp(y_one, y_all, sizeof y_one) == 0);
    quantized_free(&stack), quantized_free(&one);
}

/* ---- the many-row paths (quant_many.h) ---- */

/* y[r, o] in double for path m: panels Σ x·w with w = s·q + b as fp32 dequantizes it; bf16 the same with x and w
 * rounded to bf16; int8 Σ_g s·d·Σ xq·(q − c) + (c·s + b)·Σx with x rounded per row and group to the path's levels.
 * mag: Σ |x·w|, the scale of an fp32 sum's error. */
static void many_reference(ZyQuantMany m, const ZyQuantMatrix *W, int rows, const float *X, int ldx, double *Y,
                           double *mag) {
    const int C = W->cols, G = W->group_size, c = 1 << (W->bits - 1), L = zy_quant_many_int8_levels(W->bits);
    float *w = malloc(sizeof(float) * C);
    double *xr = malloc(sizeof(double) * C);
    for (int r = 0; r < rows; r++) {
        const float *x = X + (long)r * ldx;
        for (int g = 0; g < C / G; g++) {
            float amax = 0;
            for (int k = g * G; k < (g + 1) * G; k++) amax = fmaxf(amax, fabsf(x[k]));
            const float d = amax / (float)L, id = d > 0 ? 1.0f / d : 0.0f;
            for (int k = g * G; k < (g + 1) * G; k++) {
                const float v = rintf(x[k] * id);
                xr[k] = m == ZY_QMANY_INT8 ? (double)d * (v > L ? L : v < -L ? -L : v)
                        : m == ZY_QMANY_BF16 ? zy_round_bf16(x[k]) : x[k];
            }
        }
        for (long o = 0; o < W->rows; o++) {
            zy_quant_dequant_row(W, o, w);
            double y = 0, a = 0;
            for (int g = 0; g < C / G; g++) {
                const double s = zy_quant_load(W->scale_dtype, W->scales, (size_t)o * (C / G) + g);
                const double b = zy_quant_load(W->scale_dtype, W->biases, (size_t)o * (C / G) + g);
                double dot = 0, sum = 0;
                for (int k = g * G; k < (g + 1) * G; k++) {
                    a += fabs((double)x[k] * w[k]);
                    if (m == ZY_QMANY_INT8)
                        dot += xr[k] * ((double)zy_quant_code(W, o, k) - c), sum += x[k];
                    else
                        y += xr[k] * (m == ZY_QMANY_BF16 ? (double)zy_round_bf16(w[k]) : (double)w[k]);
                }
                if (m == ZY_QMANY_INT8) y += s * dot + (c * s + b) * sum;
            }
            Y[(long)r * W->rows + o] = y;
            mag[(long)r * W->rows + o] = a;
        }
    }
    free(w), free(xr);
}

/* Every many-row path this CPU runs (bf16 on oneDNN where it is native, else emulated through sgemm; int8 where this
 * oneDNN has an int8 matmul), at every kernel level this CPU runs, against its double reference: more than a panel of
 * outputs (the last one partial), strided X and Y, 8 and 4 bits, groups of 32 and 128, BF16 and F32 scales. Row 0 of
 * X and W are made to saturate int16 pair sums (x all equal: every int8 value at the levels; codes mostly 2^B − 1). */
TEST(quant_many_paths_match_their_references_at_every_level) {
    enum { OUT = 300, IN = 256, ROWS = 45, LDX = IN + 8, LDY = OUT + 5 };
    float *w = malloc(sizeof(float) * OUT * IN), *X = malloc(sizeof(float) * ROWS * LDX);
    float *Y = malloc(sizeof(float) * ROWS * LDY);
    double *ref = malloc(sizeof(double) * ROWS * OUT), *mag = malloc(sizeof(double) * ROWS * OUT);
    REQUIRE(w && X && Y && ref && mag);
    random_matrix(w, (long)OUT * IN, 21, 0.04f);
    random_matrix(X, (long)ROWS * LDX, 22, 1.0f);
    for (int i = 0; i < 40; i++) X[(i * 131) % (ROWS * LDX)] *= 9.0f; /* outliers */
    /* the max is the edge (|min| = |max|): 0.05 at code 0, -0.05 at the last code */
    for (int k = 0; k < IN; k++) X[k] = 0.75f, w[k] = k % 16 == 0 ? 0.05f : -0.05f;
    ZyCpuInfo ci;
    zy_cpu_detect(&ci);
    const ZyCpuLevel was = zy_cpu_level();
    int ran[ZY_QMANY_COUNT] = {0};
    const ZyDtype dts[] = {ZY_DT_BF16, ZY_DT_F32};
    for (int bits = 8; bits >= 4; bits -= 4)
        for (int G = 32; G <= 128; G *= 4) {
            Quantized qm;
            REQUIRE(quantize_matrix(&qm, w, OUT, IN, bits, G, dts[G == 128]) == 0);
            for (int m = 0; m < ZY_QMANY_COUNT; m++) {
                char why[160];
                if (!zy_quant_many_available((ZyQuantMany)m, why, sizeof why)) continue;
                many_reference((ZyQuantMany)m, &qm.m, ROWS, X, LDX, ref, mag);
                for (int l = 0; l < ZY_CPU_LEVELS; l++) {
                    if (!zy_cpu_supports(&ci, (ZyCpuLevel)l)) continue;
                    zy_cpu_set_level((ZyCpuLevel)l);
                    for (long i = 0; i < (long)ROWS * LDY; i++) Y[i] = NAN;
                    REQUIRE(zy_matmul_quant_many((ZyQuantMany)m, ROWS, OUT, IN, X, LDX, &qm.m, Y, LDY) == 0);
                    double worst = 0;
                    for (int r = 0; r < ROWS; r++)
                        for (int o = 0; o < OUT; o++) {
                            const double e = fabs(Y[(long)r * LDY + o] - ref[(long)r * OUT + o]) / (mag[(long)r * OUT + o] + 1e-30);
                            worst = e > worst || isnan(e) ? e : worst;
                        }
                    CHECK_MSG(worst < 1e-5, "%s at %s: %d-bit G%d: %.3g of sum |x w|", zy_quant_many_name((ZyQuantMany)m),
                              zy_cpu_level_name((ZyCpuLevel)l), bits, G, worst);
                    ran[m]++;
                }
                zy_cpu_set_level(was);
            }
            quantized_free(&qm);
        }
    CHECK(ran[ZY_QMANY_PANELS] > 0 && ran[ZY_QMANY_BF16] > 0);
    printf("    products checked: panels %d, bf16 %d (%s), int8 %d (activation levels against 8-bit codes: %d)\n",
           ran[ZY_QMANY_PANELS], ran[ZY_QMANY_BF16], zy_quant_many_bf16_native() ? "oneDNN" : "emulated through sgemm",
           ran[ZY_QMANY_INT8], zy_quant_many_int8_levels(8));
    free(w), free(X), free(Y), free(ref), free(mag);
}

/* ZAYA_QUANT_MANY picks the path a layer's many-row product takes (zy_matmul_quant_wt above ZY_QUANT_MAX_ROWS), auto
 * picks bf16 only where oneDNN runs it natively (on AMX), and a bad name is an error naming the variable. */
TEST(quant_many_path_is_picked_by_zaya_quant_many) {
    enum { OUT = 64, IN = 128, ROWS = ZY_QUANT_MAX_ROWS + 3 };
    float *w = malloc(sizeof(float) * OUT * IN), *X = malloc(sizeof(float) * ROWS * IN);
    float *Y = malloc(sizeof(float) * ROWS * OUT), *Yp = malloc(sizeof(float) * ROWS * OUT);
    REQUIRE(w && X && Y && Yp);
    random_matrix(w, (long)OUT * IN, 31, 0.04f);
    random_matrix(X, (long)ROWS * IN, 32, 1.0f);
    Quantized qm;
    REQUIRE(quantize_matrix(&qm, w, OUT, IN, 4, 64, ZY_DT_BF16) == 0);
    ZyErr err;
    const ZyQuantMany was = zy_quant_many();
    const char *forced = getenv("ZAYA_QUANT_MANY");
    REQUIRE(zy_quant_many_set("auto", &err) == 0);
    CHECK(zy_quant_many() == ZY_QMANY_PANELS || (zy_quant_many() == ZY_QMANY_BF16 && zy_quant_many_bf16_native()));
    if (!zy_quant_many_bf16_native()) CHECK(zy_quant_many() == ZY_QMANY_PANELS);
    for (int m = 0; m < ZY_QMANY_COUNT; m++) {
        char why[160];
        if (!zy_quant_many_available((ZyQuantMany)m, why, sizeof why)) {
            CHECK(zy_quant_many_set(zy_quant_many_name((ZyQuantMany)m), &err) != 0 && strstr(err.msg, "ZAYA_QUANT_MANY"));
            continue;
        }
        REQUIRE(zy_quant_many_set(zy_quant_many_name((ZyQuantMany)m), &err) == 0);
        CHECK(zy_quant_many() == (ZyQuantMany)m);
        zy_matmul_quant_wt(ROWS, OUT, IN, X, IN, &qm.m, Y, OUT);
        REQUIRE(zy_matmul_quant_many((ZyQuantMany)m, ROWS, OUT, IN, X, IN, &qm.m, Yp, OUT) == 0);
        CHECK_MSG(memcmp(Y, Yp, sizeof(float) * ROWS * OUT) == 0, "ZAYA_QUANT_MANY=%s: the layer's product took another path",
                  zy_quant_many_name((ZyQuantMany)m));
        char line[256];
        zy_quant_many_describe((ZyQuantMany)m, line, sizeof line);
        CHECK(strncmp(line, zy_quant_many_name((ZyQuantMany)m), strlen(zy_quant_many_name((ZyQuantMany)m))) == 0);
    }
    CHECK(zy_quant_many_set("fp16", &err) != 0 && strstr(err.msg, "ZAYA_QUANT_MANY=fp16") && strstr(err.msg, "panels"));
    CHECK(zy_quant_many_set(forced && *forced ? zy_quant_many_name(was) : "auto", &err) == 0);
    quantized_free(&qm);
    free(w), free(X), free(Y), free(Yp);
}
