/* Least-squared-error scales and biases for the affine layout (kernels/quant_mse.h). Dequantized values are computed
 * as the kernels compute them, s·q rounded then + b rounded (one rounding per statement: no fused multiply-add), so
 * the error minimised is the error the kernels see. */
#include "kernels/quant_mse.h"

#include <math.h>
#include <string.h>

#include "kernels/quant.h"

int zy_quant_method_parse(const char *name) {
    if (name && !strcmp(name, "mlx")) return ZY_QUANT_MLX;
    if (name && !strcmp(name, "mse")) return ZY_QUANT_MSE;
    if (name && !strcmp(name, "gptq")) return ZY_QUANT_GPTQ;
    return -1;
}

const char *zy_quant_method_name(ZyQuantMethod m) {
    return m == ZY_QUANT_MSE ? "mse" : m == ZY_QUANT_GPTQ ? "gptq" : "mlx";
}

/* Trial scales: n/(max-min) · (1 + k·TRIAL_STEP/n) for k in -TRIALS..TRIALS (llama.cpp's rdelta 0.1, rmin -1 span
 * the same ±1 code width). */
enum { TRIALS = 10 };
#define TRIAL_STEP 0.1f

static float rounded(ZyDtype dt, float v) {
    uint32_t tmp;
    zy_quant_store(dt, v, &tmp, 0);
    return zy_quant_load(dt, &tmp, 0);
}

/* Squared error of x ≈ s·code + b over the group, each value's weighted by wt[k] (NULL: 1). */
static double group_error(const float *x, const float *wt, int G, const uint8_t *code, float s, float b) {
    double e = 0;
    for (int k = 0; k < G; k++) {
        const float p = s * (float)code[k];
        const float y = p + b;
        const double d = (double)x[k] - (double)y;
        e += (wt ? wt[k] : 1.0) * d * d;
    }
    return e;
}

/* The nearest code to each value for (s, b) (nearest whatever the weights: each value's error is its own), and the
 * weighted squared error. */
static double nearest_codes(const float *x, const float *wt, int G, float n_bins, float s, float b, uint8_t *code) {
    for (int k = 0; k < G; k++) {
        float v = rintf((x[k] - b) / s);
        v = v < 0 ? 0 : v > n_bins ? n_bins : v;
        code[k] = (uint8_t)v;
    }
    return group_error(x, wt, G, code, s, b);
}

/* The weighted least-squares (s, b) for fixed codes: 0 when no scale fits (the codes all equal where wt > 0). */
static int least_squares(const float *x, const float *wt, int G, const uint8_t *code, float *s, float *b) {
    double sw = 0, sl = 0, sl2 = 0, sx = 0, slx = 0;
    for (int k = 0; k < G; k++) {
        const double l = code[k], v = wt ? wt[k] : 1.0;
        sw += v, sl += v * l, sl2 += v * l * l, sx += v * x[k], slx += v * l * x[k];
    }
    const double d = sw * sl2 - sl * sl;
    if (!(d > 0)) return 0;
    *s = (float)((sw * slx - sl * sx) / d);
    *b = (float)((sl2 * sx - sl * slx) / d);
    return *s != 0 && isfinite(*s) && isfinite(*b);
}

static void pack_codes(const uint8_t *code, int G, int bits, uint32_t *out) {
    const int per_word = 32 / bits;
    for (int j = 0; j < G / per_word; j++) {
        uint32_t word = 0;
        for (int k = 0; k < per_word; k++) word |= (uint32_t)code[j * per_word + k] << (k * bits);
        out[j] = word;
    }
}

void zy_quant_row_mse(const float *w, const float *importance, int cols, int bits, int group_size,
                      ZyDtype scale_dtype, uint32_t *q, float *scales, float *biases) {
    const int G = group_size, per_word = 32 / bits, mask = (1 << bits) - 1;
    const float n_bins = (float)mask;
    uint8_t best[128], trial[128];
    for (int g = 0; g < cols / G; g++) {
        const float *x = w + (long)g * G, *wt = importance ? importance + (long)g * G : NULL;
        uint32_t *out = q + (long)g * G / per_word;
        /* mlx's choice as stored: its codes, its (s, b) rounded to the storage dtype */
        float s_mlx, b_mlx;
        zy_quant_row(x, G, bits, G, out, &s_mlx, &b_mlx);
        for (int k = 0; k < G; k++) best[k] = (uint8_t)((out[k / per_word] >> (k % per_word * bits)) & (uint32_t)mask);
        float best_s = rounded(scale_dtype, s_mlx), best_b = rounded(scale_dtype, b_mlx);
        double best_e = group_error(x, wt, G, best, best_s, best_b);
        /* rounding s and b moves the grid: the nearest codes for the stored values (mlx keeps those for fp32's) */
        const double e_near = nearest_codes(x, wt, G, n_bins, best_s, best_b, trial);
        if (e_near < best_e) best_e = e_near, memcpy(best, trial, (size_t)G);
        float lo = x[0], hi = x[0];
        for (int k = 1; k < G; k++) lo = x[k] < lo ? x[k] : lo, hi = x[k] > hi ? x[k] : hi;
        if (hi > lo) {
            for (int t = -TRIALS; t <= TRIALS; t++) {
                /* codes for a trial scale from the group's min, then the (s, b) that fit them best, rounded to the
                 * storage dtype, then the nearest codes for the rounded values */
                const float inv = (n_bins + TRIAL_STEP * (float)t) / (hi - lo);
                for (int k = 0; k < G; k++) {
                    float v = rintf(inv * (x[k] - lo));
                    trial[k] = (uint8_t)(v < 0 ? 0 : v > n_bins ? n_bins : v);
                }
                float s, b;
                if (!least_squares(x, wt, G, trial, &s, &b)) continue;
                for (int refit = 0; refit < 2; refit++) {
                    s = rounded(scale_dtype, s), b = rounded(scale_dtype, b);
                    if (s == 0 || !isfinite(s) || !isfinite(b)) break;
                    const double e = nearest_codes(x, wt, G, n_bins, s, b, trial);
                    if (e < best_e) best_e = e, best_s = s, best_b = b, memcpy(best, trial, (size_t)G);
                    if (!least_squares(x, wt, G, trial, &s, &b)) break;
                }
            }
        }
        pack_codes(best, G, bits, out);
        scales[g] = best_s;
        biases[g] = best_b;
    }
}
