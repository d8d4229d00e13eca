/* quant_mse: the same affine layout as kernels/quant.h (codes, a scale and a bias per group), each group's scale and
 * bias chosen to minimise the squared error of the values it dequantizes to, instead of mlx's min/max rule. The
 * search is llama.cpp's for its K-quants (ggml-quants.c make_qkx2_quants): a few trial scales around (max-min)/n,
 * the nearest codes for each, the least-squares scale and bias for those codes, the best kept. mlx and mlx-lm load the
 * result and dequantize it to the same values (tests/oracle/test_quant_mlx.py); only the chosen values differ. */
#ifndef ZAYA_QUANT_MSE_H
#define ZAYA_QUANT_MSE_H

#include <stdint.h>

#include "util/util.h"

/* How `zaya quantize` chooses a group's scale and bias. */
typedef enum {
    ZY_QUANT_MLX, /* mx.quantize's, bit for bit (zy_quant_row) */
    ZY_QUANT_MSE, /* least squared error (zy_quant_row_mse) */
    ZY_QUANT_GPTQ, /* GPTQ's error compensation over calibration inputs (kernels/quant_gptq.h) */
} ZyQuantMethod;

/* "mlx" / "mse" / "gptq" -> the method; -1 for anything else. */
int zy_quant_method_parse(const char *name);
const char *zy_quant_method_name(ZyQuantMethod m);

/* One row as zy_quant_row lays it out, each group's (s, b) the least-squared-error one found, measured on the values
 * as stored: s and b rounded to scale_dtype (the returned scales and biases are those rounded values, so storing
 * them again changes nothing) and the codes the nearest ones for them. mlx's own choice is one of the candidates,
 * so no group's error exceeds mx.quantize's. importance (cols values, or NULL for all 1) weights each column's squared
 * error: activation-aware quantization passes the mean square of the column's input (llama.cpp's importance matrix),
 * so the error lands where the inputs are small. */
void zy_quant_row_mse(const float *w, const float *importance, int cols, int bits, int group_size,
                      ZyDtype scale_dtype, uint32_t *q, float *scales, float *biases);

#endif
