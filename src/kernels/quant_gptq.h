/* quant_gptq: GPTQ (Frantar et al., "GPTQ: Accurate Post-Training Quantization for Generative Pre-trained
 * Transformers", 2022) for the affine group layout of kernels/quant.h. A row's columns are quantized one after
 * another, and each one's rounding error is pushed onto the columns not yet quantized in the proportions that keep the
 * product with the calibration inputs closest: with H = Σ x xᵀ over those inputs (plus a small damping), the error
 * e_j / U_jj times row j of U, U the upper Cholesky factor of H⁻¹. A group's scale and bias are fitted (quant_mse,
 * weighted by diag H) when its first column is reached, to the row as updated so far (the paper's grouping). The
 * stored values are what the kernels read; only the choice of codes, scales and biases differs. */
#ifndef ZAYA_QUANT_GPTQ_H
#define ZAYA_QUANT_GPTQ_H

#include <stdint.h>

#include "util/util.h"

/* GPTQ's damping: this share of the mean of diag H added to the diagonal (the paper's 0.01). */
#define ZY_GPTQ_DAMP 0.01

/* H [cols, cols] (row-major, symmetric, Σ x xᵀ) in place into U, the upper Cholesky factor of (H + damp)⁻¹, with
 * columns no input reached (H_jj = 0) given H_jj = 1 first. -1 when H + damp is not positive definite (no finite
 * inputs), else 0. */
int zy_gptq_factor(double *h, int cols);

/* One row w [cols] quantized as zy_quant_row lays it out, by GPTQ with u = zy_gptq_factor's U; importance = diag H
 * (cols values, as quant_io's importance) weights each group's fit. work: cols doubles. */
void zy_quant_row_gptq(const float *w, const double *u, const float *importance, int cols, int bits, int group_size,
                       ZyDtype scale_dtype, double *work, uint32_t *q, float *scales, float *biases);

#endif
