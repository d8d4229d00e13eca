/* The least-squared-error quantizer (src/kernels/quant_mse.c): group by group no worse than mlx's rule on the values
 * as stored, clearly better on average at 4 bits, its stored scales and biases the ones the error was minimised for,
 * and its codes the nearest ones for them. That mlx loads and dequantizes its folders alike:
 * tests/oracle/test_quant_mlx.py. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/quant.h"
#include "kernels/quant_mse.h"
#include "test.h"

enum { ROWS = 24, COLS = 256 };

/* Gaussian rows; with outliers, one value in 13 is 8x larger (the heavy tails that stretch a min/max grid). */
static void test_rows(float *w, unsigned seed, int outliers) {
    ZyRng rng;
    zy_rng_seed(&rng, seed);
    for (int i = 0; i < ROWS * COLS; i++) {
        w[i] = (float)(0.02 * zy_rng_normal(&rng));
        if (outliers && i % 13 == 5) w[i] *= 8.0f;
    }
    for (int k = 0; k < COLS; k++) w[3 * COLS + k] = 0.0f;        /* a row of zeros */
    for (int k = 0; k < COLS; k++) w[4 * COLS + k] = 0.5f;        /* a constant row */
    for (int k = 0; k < COLS; k++) w[5 * COLS + k] = k % 2 ? 1e-3f : -7e-4f; /* two values */
}

typedef struct {
    uint32_t q[ROWS * COLS / 4];
    uint16_t s16[ROWS * COLS / 32], b16[ROWS * COLS / 32];
    float s32[ROWS * COLS / 32], b32[ROWS * COLS / 32];
    ZyQuantMatrix m;
} Stored;

/* Quantized by METHOD, scales and biases stored in dt, as zaya quantize writes them; returns how many groups' returned
 * scale or bias differs from the one stored (mse returns the stored values: the error was minimised for these). */
static int quantize(Stored *st, const float *w, int bits, int G, ZyDtype dt, ZyQuantMethod method) {
    const int words = zy_quant_row_words(COLS, bits), groups = COLS / G;
    void *s = dt == ZY_DT_F32 ? (void *)st->s32 : (void *)st->s16;
    void *b = dt == ZY_DT_F32 ? (void *)st->b32 : (void *)st->b16;
    int unstored = 0;
    for (int o = 0; o < ROWS; o++) {
        float fs[8], fb[8];
        if (method == ZY_QUANT_MSE)
            zy_quant_row_mse(w + o * COLS, NULL, COLS, bits, G, dt, st->q + o * words, fs, fb);
        else
            zy_quant_row(w + o * COLS, COLS, bits, G, st->q + o * words, fs, fb);
        for (int g = 0; g < groups; g++) {
            zy_quant_store(dt, fs[g], s, (size_t)o * groups + g);
            zy_quant_store(dt, fb[g], b, (size_t)o * groups + g);
            unstored += zy_quant_load(dt, s, (size_t)o * groups + g) != fs[g] ||
                        zy_quant_load(dt, b, (size_t)o * groups + g) != fb[g];
        }
    }
    st->m = (ZyQuantMatrix){.bits = bits, .group_size = G, .rows = ROWS, .cols = COLS, .q = st->q, .scales = s,
                            .biases = b, .scale_dtype = dt};
    return unstored;
}

/* Squared error of each group of the dequantized matrix. */
static void group_errors(const Stored *st, const float *w, double *err) {
    const int G = st->m.group_size;
    float y[COLS];
    for (int o = 0; o < ROWS; o++) {
        zy_quant_dequant_row(&st->m, o, y);
        for (int g = 0; g < COLS / G; g++) {
            double e = 0;
            for (int k = g * G; k < (g + 1) * G; k++) {
                const double d = (double)w[o * COLS + k] - y[k];
                e += d * d;
            }
            err[o * (COLS / G) + g] = e;
        }
    }
}

TEST(quant_mse_no_group_worse_than_mlx_and_better_at_4_bits) {
    static float w[ROWS * COLS];
    static Stored a, b;
    static double ea[ROWS * COLS / 32], eb[ROWS * COLS / 32];
    const ZyDtype dts[] = {ZY_DT_BF16, ZY_DT_F16, ZY_DT_F32};
    for (int outliers = 0; outliers < 2; outliers++)
        for (int bits = 4; bits <= 8; bits += 4)
            for (int G = 32; G <= 128; G *= 2)
                for (int d = 0; d < 3; d++) {
                    test_rows(w, 11u + (unsigned)(bits * G + d), outliers);
                    quantize(&a, w, bits, G, dts[d], ZY_QUANT_MLX);
                    CHECK(quantize(&b, w, bits, G, dts[d], ZY_QUANT_MSE) == 0);
                    group_errors(&a, w, ea);
                    group_errors(&b, w, eb);
                    double ta = 0, tb = 0;
                    int worse = 0;
                    for (int i = 0; i < ROWS * (COLS / G); i++) {
                        worse += eb[i] > ea[i] * (1 + 1e-12) + 1e-30;
                        ta += ea[i], tb += eb[i];
                    }
                    CHECK(worse == 0);
                    /* at 4 bits the search must buy something (test_quant_mlx.py measures 0.73-0.80 of mlx's
                     * error on zaya init weights) */
                    if (bits == 4) CHECK(tb < 0.9 * ta);
                    if (worse || (bits == 4 && !(tb < 0.9 * ta)))
                        printf("    bits %d G %d dtype %d outliers %d: %d groups worse, error %.4g vs mlx %.4g\n",
                               bits, G, (int)dts[d], outliers, worse, tb, ta);
                }
}

/* Each stored code is the nearest one to its value for the stored scale and bias (no neighbour code is closer), so
 * the codes, scales and biases are consistent: re-quantizing the values with the stored (s, b) gives them back. */
TEST(quant_mse_codes_are_nearest_for_the_stored_scale_and_bias) {
    static float w[ROWS * COLS];
    static Stored st;
    for (int bits = 4; bits <= 8; bits += 4) {
        const int G = 64, n = (1 << bits) - 1;
        test_rows(w, 5u + (unsigned)bits, 1);
        CHECK(quantize(&st, w, bits, G, ZY_DT_BF16, ZY_QUANT_MSE) == 0);
        int far = 0;
        for (int o = 0; o < ROWS; o++)
            for (int k = 0; k < COLS; k++) {
                const size_t at = (size_t)o * (COLS / G) + (size_t)(k / G);
                const float s = zy_quant_load(ZY_DT_BF16, st.m.scales, at);
                const float b = zy_quant_load(ZY_DT_BF16, st.m.biases, at);
                const int q = (int)zy_quant_code(&st.m, o, k);
                const double x = w[o * COLS + k], d = fabs(x - ((double)(s * (float)q) + b));
                for (int nb = q - 1; nb <= q + 1; nb += 2)
                    if (nb >= 0 && nb <= n && fabs(x - ((double)(s * (float)nb) + b)) < d - 1e-3 * fabs((double)s))
                        far++;
            }
        CHECK(far == 0);
    }
}

TEST(quant_mse_method_names) {
    CHECK(zy_quant_method_parse("mlx") == ZY_QUANT_MLX && zy_quant_method_parse("mse") == ZY_QUANT_MSE);
    CHECK(zy_quant_method_parse("MSE") == -1 && zy_quant_method_parse("") == -1 && zy_quant_method_parse(NULL) == -1);
    CHECK(!strcmp(zy_quant_method_name(ZY_QUANT_MSE), "mse") && !strcmp(zy_quant_method_name(ZY_QUANT_MLX), "mlx"));
}

/* Importance-weighted (activation-aware) fitting: all-ones weights change nothing, bit for bit; heavy-tailed weights
 * (a column in 8 weighing 100x, as inputs with outlier channels make them) buy a clearly smaller weighted error than
 * the unweighted fit, with the big columns' own error smaller; columns of weight 0 are fitted around. */
TEST(quant_mse_importance_weights_the_fit) {
    static float w[ROWS * COLS], ones[COLS], wt[COLS];
    static Stored plain, weighted;
    for (int k = 0; k < COLS; k++) ones[k] = 1.0f, wt[k] = k % 8 == 3 ? 100.0f : k % 8 == 6 ? 0.0f : 1.0f;
    const int bits = 4, G = 32, words = zy_quant_row_words(COLS, bits);
    test_rows(w, 77u, 1);
    quantize(&plain, w, bits, G, ZY_DT_BF16, ZY_QUANT_MSE);
    static uint32_t q1[ROWS * COLS / 8];
    float s1[COLS / 32], b1[COLS / 32], s2[COLS / 32], b2[COLS / 32];
    int same = 1;
    for (int o = 0; o < ROWS; o++) {
        zy_quant_row_mse(w + o * COLS, NULL, COLS, bits, G, ZY_DT_BF16, q1 + o * words, s1, b1);
        zy_quant_row_mse(w + o * COLS, ones, COLS, bits, G, ZY_DT_BF16, weighted.q + o * words, s2, b2);
        same &= !memcmp(q1 + o * words, weighted.q + o * words, (size_t)words * 4) && !memcmp(s1, s2, sizeof s1) &&
                !memcmp(b1, b2, sizeof b1);
    }
    CHECK(same);
    /* the weighted fit, stored as zaya quantize stores it */
    for (int o = 0; o < ROWS; o++) {
        zy_quant_row_mse(w + o * COLS, wt, COLS, bits, G, ZY_DT_BF16, weighted.q + o * words, s2, b2);
        for (int g = 0; g < COLS / G; g++) {
            zy_quant_store(ZY_DT_BF16, s2[g], weighted.s16, (size_t)o * (COLS / G) + g);
            zy_quant_store(ZY_DT_BF16, b2[g], weighted.b16, (size_t)o * (COLS / G) + g);
        }
    }
    weighted.m = plain.m;
    weighted.m.q = weighted.q, weighted.m.scales = weighted.s16, weighted.m.biases = weighted.b16;
    double e_plain = 0, e_weighted = 0, big_plain = 0, big_weighted = 0;
    float y1[COLS], y2[COLS];
    for (int o = 0; o < ROWS; o++) {
        zy_quant_dequant_row(&plain.m, o, y1);
        zy_quant_dequant_row(&weighted.m, o, y2);
        for (int k = 0; k < COLS; k++) {
            const double d1 = (double)w[o * COLS + k] - y1[k], d2 = (double)w[o * COLS + k] - y2[k];
            e_plain += wt[k] * d1 * d1, e_weighted += wt[k] * d2 * d2;
            if (wt[k] > 1) big_plain += d1 * d1, big_weighted += d2 * d2;
        }
    }
    printf("    weighted error %.4g vs unweighted fit %.4g; the heavy columns' own %.4g vs %.4g\n", e_weighted, e_plain,
           big_weighted, big_plain);
    CHECK(e_weighted < 0.8 * e_plain);
    CHECK(big_weighted < 0.8 * big_plain);
}
