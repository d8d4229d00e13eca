/* GPTQ for the affine group layout (kernels/quant_gptq.h). Dense double-precision Cholesky: H is at most a matrix's
 * width squared, factored once per matrix (per expert for a stack). */
#include "kernels/quant_gptq.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/quant.h"
#include "kernels/quant_mse.h"

/* In place: the lower Cholesky factor L of a (a = L Lᵀ; the upper triangle left as it was). -1 if not positive
 * definite. */
static int cholesky_lower(double *a, int n) {
    for (int j = 0; j < n; j++) {
        double d = a[(size_t)j * n + j];
        for (int k = 0; k < j; k++) d -= a[(size_t)j * n + k] * a[(size_t)j * n + k];
        if (!(d > 0) || !isfinite(d)) return -1;
        const double ljj = sqrt(d);
        a[(size_t)j * n + j] = ljj;
#pragma omp parallel for schedule(static) if (n >= 256)
        for (int i = j + 1; i < n; i++) {
            double s = a[(size_t)i * n + j];
            for (int k = 0; k < j; k++) s -= a[(size_t)i * n + k] * a[(size_t)j * n + k];
            a[(size_t)i * n + j] = s / ljj;
        }
    }
    return 0;
}

int zy_gptq_factor(double *h, int n) {
    double mean = 0;
    for (int j = 0; j < n; j++) {
        if (!(h[(size_t)j * n + j] > 0)) { /* a dead column: nothing to keep, no error to push from it */
            for (int k = 0; k < n; k++) h[(size_t)j * n + k] = h[(size_t)k * n + j] = 0;
            h[(size_t)j * n + j] = 1;
        }
        mean += h[(size_t)j * n + j] / n;
    }
    for (int j = 0; j < n; j++) h[(size_t)j * n + j] += ZY_GPTQ_DAMP * mean;
    /* H = L Lᵀ, so H⁻¹ = L⁻ᵀ L⁻¹: invert L, form H⁻¹, factor it as Uᵀ U */
    if (cholesky_lower(h, n)) return -1;
    double *inv = calloc((size_t)n * n, sizeof *inv);
    if (!inv) return -1;
    /* inv = L⁻¹ (lower), column by column by forward substitution */
#pragma omp parallel for schedule(dynamic, 8)
    for (int c = 0; c < n; c++) {
        inv[(size_t)c * n + c] = 1.0 / h[(size_t)c * n + c];
        for (int i = c + 1; i < n; i++) {
            double s = 0;
            for (int k = c; k < i; k++) s -= h[(size_t)i * n + k] * inv[(size_t)k * n + c];
            inv[(size_t)i * n + c] = s / h[(size_t)i * n + i];
        }
    }
    /* H⁻¹ = L⁻ᵀ L⁻¹: (H⁻¹)_ij = Σ_{k ≥ max(i,j)} inv_ki inv_kj, into h (full) */
#pragma omp parallel for schedule(dynamic, 8)
    for (int i = 0; i < n; i++)
        for (int j = i; j < n; j++) {
            double s = 0;
            for (int k = j; k < n; k++) s += inv[(size_t)k * n + i] * inv[(size_t)k * n + j];
            h[(size_t)i * n + j] = h[(size_t)j * n + i] = s;
        }
    free(inv);
    /* U = Lᵀ of H⁻¹'s lower factor: upper, Uᵀ U = H⁻¹ */
    if (cholesky_lower(h, n)) return -1;
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++) h[(size_t)i * n + j] = h[(size_t)j * n + i], h[(size_t)j * n + i] = 0;
    return 0;
}

void zy_quant_row_gptq(const float *w, const double *u, const float *importance, int cols, int bits, int group_size,
                       ZyDtype scale_dtype, double *work, uint32_t *q, float *scales, float *biases) {
    const int G = group_size, per_word = 32 / bits, n_bins = (1 << bits) - 1;
    for (int k = 0; k < cols; k++) work[k] = w[k];
    memset(q, 0, (size_t)(cols / per_word) * sizeof *q);
    float grp[128];
    uint32_t scratch[128];
    float s = 0, b = 0;
    for (int j = 0; j < cols; j++) {
        if (j % G == 0) { /* the group's scale and bias, fitted to the row as updated so far */
            for (int k = 0; k < G; k++) grp[k] = (float)work[j + k];
            zy_quant_row_mse(grp, importance ? importance + j : NULL, G, bits, G, scale_dtype, scratch, &s, &b);
            scales[j / G] = s, biases[j / G] = b;
        }
        const float v = (float)work[j];
        float c = s != 0 ? rintf((v - b) / s) : 0;
        c = c < 0 ? 0 : c > (float)n_bins ? (float)n_bins : c;
        q[j / per_word] |= (uint32_t)c << (j % per_word * bits);
        const float p = s * c;
        const float y = p + b; /* the value the kernels read (one rounding per statement) */
        const double e = (work[j] - (double)y) / u[(size_t)j * cols + j];
        const double *uj = u + (size_t)j * cols;
        for (int k = j + 1; k < cols; k++) work[k] -= e * uj[k];
    }
}
