/* quant_many: the many-row product with quantized weights (prefill, eval, forward: more than ZY_QUANT_MAX_ROWS rows),
 * Y[rows, out] (ldy) = X[rows, in] (ldx) Wᵀ, by one of three paths, one for the whole process (ZAYA_QUANT_MANY):
 *  - panels: panels of ZY_QUANT_PANEL weight rows dequantized to fp32 for OpenBLAS sgemm (zy_matmul_quant_panels);
 *  - bf16: the same panels rounded to bf16 and X rounded to bf16 once, oneDNN's bf16 matmul (bf16 x bf16 -> fp32
 *    sums) where oneDNN runs it natively (AVX512-BF16 or AMX at the avx512bf16 level); elsewhere the same rounded
 *    values widened back to fp32 for sgemm (the same products, summed in another order: emulated, for tests);
 *  - int8: oneDNN's int8 matmul, one product per group of columns (a batch of in/G products of depth G: oneDNN 2.6
 *    scales an int8 product per output column at most, never per group along its depth), codes x activations
 *    rounded to int8 per row and group -> int32, then the groups' sums scaled in fp32. Without VNNI oneDNN sums
 *    byte pairs in int16 (vpmaddubsw) and saturates, so against 8-bit codes the activations get 7 bits (|x| <= 64).
 * auto: bf16 where oneDNN runs it on AMX tiles (the avx512bf16 level of an AMX CPU), panels everywhere else
 * (measured: docs/quantization.md). */
#ifndef ZAYA_QUANT_MANY_H
#define ZAYA_QUANT_MANY_H

#include "kernels/quant.h"
#include "util/util.h"

typedef enum {
    ZY_QMANY_PANELS, /* fp32 panels, sgemm */
    ZY_QMANY_BF16,   /* bf16 panels, oneDNN bf16 matmul (or sgemm on the rounded values where oneDNN can't) */
    ZY_QMANY_INT8,   /* oneDNN int8 matmul batched over groups, fp32 scaling of the groups' sums */
    ZY_QMANY_COUNT
} ZyQuantMany;
const char *zy_quant_many_name(ZyQuantMany m);
/* 1 if path m runs here (bf16: always, natively or emulated; int8: a oneDNN build whose int8 matmul this CPU runs);
 * else 0 and why (one clause). */
int zy_quant_many_available(ZyQuantMany m, char *why, size_t cap);
/* 1 if path bf16 runs on oneDNN's native bf16 kernels here (not emulated). */
int zy_quant_many_bf16_native(void);
/* The int8 path's activation levels against codes of `bits` bits: x ≈ d·xq with |xq| <= the levels (127; 64 against
 * 8-bit codes where oneDNN's int8 sums are not exact in int16 pairs: without VNNI). */
int zy_quant_many_int8_levels(int bits);
/* Sets the process's path (ZAYA_QUANT_MANY: auto, panels, bf16, int8; NULL or "" = auto); an unknown name, or int8
 * where it cannot run, is an error naming the variable. */
int zy_quant_many_set(const char *name, ZyErr *err);
/* The path in force (auto resolved for this CPU and kernel level). */
ZyQuantMany zy_quant_many(void);
/* One line: the path, what runs it, and why it is the one (for zaya info and the start-up lines). */
void zy_quant_many_describe(ZyQuantMany m, char *out, size_t cap);
/* Y = X Wᵀ by path m (W->cols = in, W's first `out` rows); -1 (nothing written) when m cannot run here or memory
 * for its buffers cannot be had. */
int zy_matmul_quant_many(ZyQuantMany m, int rows, int out, int in, const float *X, int ldx, const ZyQuantMatrix *W,
                         float *Y, int ldy);

#endif
