/* GPTQ for the affine layout (src/kernels/quant_gptq.c): the factor is the upper Cholesky factor of the damped
 * inverse, and on inputs with correlated columns GPTQ's codes give a clearly smaller product error ‖X (W − Q)ᵀ‖ than
 * the best per-group fit weighted by the same inputs (quant_mse with diag XᵀX), at 4 and 8 bits. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/quant.h"
#include "kernels/quant_gptq.h"
#include "kernels/quant_mse.h"
#include "test.h"

enum { N = 512, COLS = 64, ROWS = 16, RANK = 8 };

/* X [N, COLS]: a rank-RANK signal plus noise, a few columns 6x (outlier channels), so columns correlate. */
static void inputs(float *x, unsigned seed) {
    ZyRng rng;
    zy_rng_seed(&rng, seed);
    static float basis[RANK * COLS];
    for (int i = 0; i < RANK * COLS; i++) basis[i] = (float)zy_rng_normal(&rng);
    for (int n = 0; n < N; n++) {
        float c[RANK];
        for (int r = 0; r < RANK; r++) c[r] = (float)zy_rng_normal(&rng);
        for (int j = 0; j < COLS; j++) {
            double v = 0.3 * zy_rng_normal(&rng);
            for (int r = 0; r < RANK; r++) v += c[r] * basis[r * COLS + j];
            x[n * COLS + j] = (float)(v * (j % 16 == 3 ? 6 : 1));
        }
    }
}

static void gram(double *h, const float *x) {
    memset(h, 0, sizeof(double) * COLS * COLS);
    for (int n = 0; n < N; n++)
        for (int i = 0; i < COLS; i++)
            for (int j = 0; j < COLS; j++) h[i * COLS + j] += (double)x[n * COLS + i] * x[n * COLS + j];
}

TEST(quant_gptq_factor_is_the_damped_inverse_cholesky) {
    static float x[N * COLS];
    static double h[COLS * COLS], u[COLS * COLS];
    inputs(x, 3);
    gram(h, x);
    h[5 * COLS + 5] = 0; /* a dead column is given H_jj = 1 */
    for (int k = 0; k < COLS; k++) h[5 * COLS + k] = h[k * COLS + 5] = 0;
    memcpy(u, h, sizeof h);
    REQUIRE(zy_gptq_factor(u, COLS) == 0);
    double mean = 0;
    h[5 * COLS + 5] = 1;
    for (int j = 0; j < COLS; j++) mean += h[j * COLS + j] / COLS;
    for (int j = 0; j < COLS; j++) h[j * COLS + j] += ZY_GPTQ_DAMP * mean;
    /* upper triangular, and (H + damp) · Uᵀ U = I */
    double worst = 0, lower = 0;
    for (int i = 0; i < COLS; i++)
        for (int j = 0; j < i; j++) lower = fmax(lower, fabs(u[i * COLS + j]));
    for (int i = 0; i < COLS; i++)
        for (int j = 0; j < COLS; j++) {
            double s = 0;
            for (int k = 0; k < COLS; k++) {
                double utu = 0; /* (Uᵀ U)_kj */
                for (int m = 0; m < COLS; m++) utu += u[m * COLS + k] * u[m * COLS + j];
                s += h[i * COLS + k] * utu;
            }
            worst = fmax(worst, fabs(s - (i == j)));
        }
    CHECK_MSG(lower == 0 && worst < 1e-9, "lower part %.3g, |H U^T U - I| %.3g", lower, worst);
    /* no inputs at all: every column dead, H = I, still factors */
    memset(u, 0, sizeof u);
    CHECK(zy_gptq_factor(u, COLS) == 0 && u[0] > 0);
}

/* ‖X (W − Q)ᵀ‖² over the rows quantized by GPTQ or by the diag-weighted fit. */
TEST(quant_gptq_beats_the_weighted_fit_on_the_product) {
    static float x[N * COLS], w[ROWS * COLS], diag[COLS], deq[COLS];
    static double h[COLS * COLS], u[COLS * COLS], work[COLS];
    static uint32_t q[ROWS * COLS / 4];
    inputs(x, 7);
    gram(h, x);
    for (int j = 0; j < COLS; j++) diag[j] = (float)h[j * COLS + j];
    memcpy(u, h, sizeof h);
    REQUIRE(zy_gptq_factor(u, COLS) == 0);
    ZyRng rng;
    zy_rng_seed(&rng, 9);
    for (int i = 0; i < ROWS * COLS; i++) w[i] = (float)(0.05 * zy_rng_normal(&rng));
    for (int bits = 4; bits <= 8; bits += 4) {
        const int G = 32;
        double err[2] = {0, 0};
        for (int method = 0; method < 2; method++)
            for (int r = 0; r < ROWS; r++) {
                float s[COLS / 32], b[COLS / 32];
                if (method)
                    zy_quant_row_gptq(w + r * COLS, u, diag, COLS, bits, G, ZY_DT_BF16, work, q, s, b);
                else
                    zy_quant_row_mse(w + r * COLS, diag, COLS, bits, G, ZY_DT_BF16, q, s, b);
                uint16_t s16[COLS / 32], b16[COLS / 32];
                for (int g = 0; g < COLS / G; g++) {
                    zy_quant_store(ZY_DT_BF16, s[g], s16, (size_t)g), zy_quant_store(ZY_DT_BF16, b[g], b16, (size_t)g);
                    CHECK(zy_quant_load(ZY_DT_BF16, s16, (size_t)g) == s[g]); /* returned as stored */
                }
                const ZyQuantMatrix m = {.bits = bits, .group_size = G, .rows = 1, .cols = COLS, .q = q,
                                         .scales = s16, .biases = b16, .scale_dtype = ZY_DT_BF16};
                zy_quant_dequant_row(&m, 0, deq);
                for (int n = 0; n < N; n++) {
                    double d = 0;
                    for (int j = 0; j < COLS; j++) d += (double)x[n * COLS + j] * (w[r * COLS + j] - deq[j]);
                    err[method] += d * d;
                }
            }
        printf("    %d bits: product error GPTQ %.4g, weighted fit %.4g (%.2fx)\n", bits, err[1], err[0], err[1] / err[0]);
        CHECK(err[1] < 0.8 * err[0]);
    }
}
