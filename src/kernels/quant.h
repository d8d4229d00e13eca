/* quant: weights quantized group-wise to 8 or 4 bits, in MLX's affine layout, and the products that read them.
 *
 * The format (mlx.core.quantize, mode "affine", as mlx-lm writes quantized models in safetensors): a matrix W
 * [rows, cols] is cut, row by row, into groups of G consecutive columns (G = 32, 64 or 128, dividing cols); each
 * group has a scale s and a bias b and each value an unsigned B-bit code q (B = 8 or 4): W[o, k] ≈ s·q + b.
 *  - the codes are packed into uint32 words, 32/B per word, the first column in the lowest bits (little-endian
 *    words: as bytes, 8-bit codes are in column order and a 4-bit pair shares a byte, the even column in the low
 *    nibble); a row is cols·B/32 words, shape [rows, cols·B/32] (a stack [E, rows, cols] keeps its leading dims);
 *  - scales and biases are [rows, cols/G] in the dtype of the matrix mlx was given (BF16 for a bf16 release, F32,
 *    F16).
 * Quantizing a group (mlx's CPU code, fp32 throughout): max and min of the group; n = 2^B - 1; the value of larger
 * magnitude is the edge (min when |min| > |max|, else max), s = ±max((max - min)/n, 1e-7) with the sign that puts
 * the edge at code 0; q0 = rint(edge/s); if q0 != 0 then s = edge/q0 and b = edge (0.0 then lies on the grid, at
 * code -q0), else b = 0; q = clamp(rint((w - b)/s), 0, n). The codes are chosen with the fp32 s and b;
 * the s and b stored are those rounded to the output dtype (nearest even), as mlx stores them. */
#ifndef ZAYA_QUANT_H
#define ZAYA_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "util/util.h"

/* 1 with bits 8 or 4 and group_size 32, 64 or 128 (what zaya reads and writes); else 0 and an error saying what
 * is supported. mlx has 2, 3, 5 and 6 bits too: their codes straddle words, and no kernel here reads them. */
int zy_quant_format_check(int bits, int group_size, ZyErr *err);
/* The uint32 words of one packed row, and its groups. */
static inline int zy_quant_row_words(int cols, int bits) { return cols / 32 * bits; }
static inline int zy_quant_row_groups(int cols, int group_size) { return cols / group_size; }

/* One row of cols values (cols a multiple of group_size) quantized as mlx does: codes packed into q
 * [zy_quant_row_words], and each group's fp32 scale and bias (before rounding to a storage dtype). */
void zy_quant_row(const float *w, int cols, int bits, int group_size, uint32_t *q, float *scales, float *biases);
/* A stored scale or bias: fp32 -> dtype (F32, BF16, F16; nearest even), and back. */
void zy_quant_store(ZyDtype dtype, float v, void *dst, size_t i);
float zy_quant_load(ZyDtype dtype, const void *src, size_t i);
/* fp32 -> IEEE half, nearest even (overflow to infinity, subnormals kept, NaN quiet): mlx's float16 stores. */
uint16_t zy_f32_to_f16(float f);

/* A quantized matrix as it lies in memory (the packed file data, mapped): rows x cols, row o's codes at
 * q + o·zy_quant_row_words(cols, bits), its scales and biases at element o·cols/group_size of their arrays. */
typedef struct {
    int bits, group_size;
    long rows;
    int cols;
    const uint32_t *q;
    const void *scales, *biases;
    ZyDtype scale_dtype; /* F32, BF16 or F16 */
} ZyQuantMatrix;
/* Rows [first, first + n) of m as a matrix of their own (one expert of a stack [E, rows, cols]). */
ZyQuantMatrix zy_quant_rows(const ZyQuantMatrix *m, long first, long n);
/* Code of W[o, k]. */
static inline unsigned zy_quant_code(const ZyQuantMatrix *m, long o, int k) {
    const uint32_t w = m->q[o * zy_quant_row_words(m->cols, m->bits) + k / (32 / m->bits)];
    return (w >> (k % (32 / m->bits) * m->bits)) & ((1u << m->bits) - 1);
}
/* Row o dequantized in fp32: out[k] = s·q + b with the stored s and b widened to fp32 (a product, rounded, then a
 * sum, rounded: the value every kernel here multiplies by, and mlx's dequantize for F32 scales). */
void zy_quant_dequant_row(const ZyQuantMatrix *m, long o, float *out);

/* ---- products: Y[rows, out] (ldy) = X[rows, in] (ldx) Wᵀ with W a ZyQuantMatrix [out, in] ----
 * Written for decoding (a few rows): each kernel reads the packed rows once, as stored, and turns codes into values
 * in registers. Σ_k x_k (s q_k + b) = s Σ x_k q_k + b Σ x_k: the group sums of X are made once per call, so a group
 * costs its dot product of codes and activations and one multiply-add by s; the b Σ x terms of an output are one
 * short dot product over its groups. Two ways to multiply:
 *  - widen: codes widened to fp32 and multiplied with the fp32 activations (fp32 sums);
 *  - int8: each row's activations rounded to int8 per block of 32 (d = max|x|/127, x ≈ d·round(x/d): llama.cpp's Q8_0
 *    blocks), exact integer dot products of a block's codes and int8 values (pmaddubsw, or vpdpbusd where the CPU
 *    has VNNI), then one fp32 multiply-add by d·s per block. The codes' offset 2^(B-1) is taken against the exact
 *    fp32 group sums, so the rounding error of x weighs by |q - 2^(B-1)| <= 2^(B-1), not by q. (Blocks as large as
 *    the group, summed in int32, save one multiply-add per 32 codes but measured 1.1-1.5% output error against
 *    0.6-0.7% on activations with outliers: tests/unit/test_quant.c.)
 * For 4-bit codes the activations are laid out per block of 32 as the even columns, then the odd ones (the low and
 * high nibbles of the block's 16 bytes), so a kernel never reorders codes. */
typedef enum {
    ZY_QUANT_WIDEN, /* fp32 activations */
    ZY_QUANT_INT8,  /* int8-rounded activations, integer dot products */
} ZyQuantWay;
/* The kernels, each a compilation of quant_isa.c (names as zaya info prints them): */
typedef enum {
    ZY_QK_PLAIN,      /* scalar C, any CPU: the tests' reference (both ways) */
    ZY_QK_GENERIC,    /* x86-64-v2: 128-bit SSSE3/SSE4.1 */
    ZY_QK_AVX2,       /* x86-64-v3: 256-bit, pmaddubsw */
    ZY_QK_AVXVNNI,    /* x86-64-v3 + AVX-VNNI (Alder Lake and later cores): vpdpbusd on 256 bits */
    ZY_QK_AVX512,     /* x86-64-v4: fp32 on 512 bits, int8 on 256 bits with 32 registers */
    ZY_QK_AVX512VNNI, /* x86-64-v4 + AVX512-VNNI (Cascade Lake, Ice Lake, Zen 4/5, Sapphire Rapids) */
    ZY_QK_COUNT
} ZyQuantKernel;
const char *zy_quant_kernel_name(ZyQuantKernel k);
/* Whether this build has kernel k and this CPU runs it. */
int zy_quant_kernel_available(ZyQuantKernel k);
/* The kernel for the process's CPU level (zy_cpu_level(), ZAYA_CPU): its own, with VNNI where the CPU has it. */
ZyQuantKernel zy_quant_kernel_for_level(void);

/* The process's way (ZAYA_QUANT_WAY: auto, widen, int8; NULL or "" = auto): an unknown name is an error naming the
 * variable. auto = int8 (measured faster at every level this was timed on: docs/quantization.md). */
int zy_quant_way_set(const char *name, ZyErr *err);
ZyQuantWay zy_quant_way(void);
const char *zy_quant_way_describe(ZyQuantWay w);

/* Y = X Wᵀ by kernel k (-1: the process's kernel) and way w (-1: the process's way), for any number of rows (in
 * blocks of 4, outputs split over the threads in fixed chunks: each output's sum is independent of the thread
 * count). W->cols is `in`; W->rows is `out`. Returns -1 (nothing done) when k cannot run here or scratch memory
 * for the activations cannot be had. */
int zy_matmul_quant(int k, int w, int rows, const float *X, int ldx, const ZyQuantMatrix *W, float *Y, int ldy);
/* zy_matmul_quant of one X with n matrices W[i] (each W[i].cols = in; one bits and group size for all) into Y[i]
 * (row stride ldy[i]): X prepared once, every product's output chunks split over the threads in one parallel region
 * (a layer's projections of one input: one fork/join and one rounding of X instead of n). Each output's sum is
 * zy_matmul_quant's. Returns -1 (nothing done) where zy_matmul_quant would, or when the formats differ. */
int zy_matmul_quant_shared(int k, int w, int rows, const float *X, int ldx, int n, const ZyQuantMatrix *W,
                           float *const *Y, const int *ldy);

/* A layer's quantized weight applied to rows (zy_matmul_wt's quantized case; W->cols = in, W's first `out` rows):
 * up to ZY_QUANT_MAX_ROWS rows (decoding: a sequence's row, an expert's handful) by the process's few-row kernel;
 * more rows (prefill, eval, forward) by the process's many-row path (quant_many.h: fp32 panels unless oneDNN runs bf16
 * natively here; measured: docs/quantization.md). */
#define ZY_QUANT_MAX_ROWS 32
#define ZY_QUANT_PANEL 256
void zy_matmul_quant_wt(int rows, int out, int in, const float *X, int ldx, const ZyQuantMatrix *W, float *Y, int ldy);
/* Y = X Wᵀ with panels of ZY_QUANT_PANEL weight rows dequantized to fp32 (zy_quant_dequant_row's values) for sgemm:
 * the many-row product. */
void zy_matmul_quant_panels(int rows, int out, int in, const float *X, int ldx, const ZyQuantMatrix *W, float *Y,
                            int ldy);
/* The embedding gathered from a quantized table: x[r] = (row tokens[r] of emb, dequantized, + bias) · scale, as
 * embed_forward does; only the rows used are dequantized. */
void zy_quant_embed(float *x, const ZyQuantMatrix *emb, const int32_t *tokens, const float *bias, const float *scale,
                    int rows, int dim);

/* ---- what the kernels see (quant_isa.c): the activations prepared once per call ----
 * For a block of nr <= 4 rows, with ng = in/group_size groups and nb = in/32 blocks: X the fp32 activations (row r
 * at r·ldx; for 4-bit codes and the widen way a copy in the even/odd order), xsum[r·ng + g] the sum of row r's values in group g; for
 * int8, xq (row r at r·in) the int8 values, d[r·nb + b] block b's scale, and corr[r·ng + g]
 * what the group's s multiplies besides the dot products: 2^(B-1)·(xsum - Σ_b d·Σ xq), or 2^(B-1)·xsum for a
 * kernel whose 8-bit dot products already subtract the offset from the codes (ZyQuantTable.centered8). Widen:
 * corr = 0. With 4-bit codes xq is laid out by pairs of blocks (2p, 2p+1), 64 bytes: the even columns of 2p, of
 * 2p+1, then the odd columns of 2p, of 2p+1 — the order of 32 bytes of codes split into low and high nibbles, so one
 * 256-bit load of codes meets two blocks (a last unpaired block: its even columns, then its odd ones); d8[r·4nb +
 * 8p ...] holds d of 2p four times, then d of 2p+1 four times (the int32 lanes of a pair's dot products). */
typedef struct {
    int nr, in, ng, nb;
    const float *X;
    int ldx;
    const float *xsum, *corr, *d, *d8;
    const int8_t *xq;
} ZyQuantActs;
#define ZY_QUANT_ROW_BLOCK 4
/* A kernel's scratch, per thread: floats for two outputs' scales and biases in fp32. */
static inline size_t zy_quant_work_floats(int ng) { return 4 * (size_t)ng + 64; }
typedef void (*ZyQuantKernelFn)(const ZyQuantActs *a, const ZyQuantMatrix *W, long o0, long o1, float *Y, int ldy,
                                float *work);
typedef struct {
    const char *name;
    /* Y[r, o] (ldy) for r < a->nr, o in [o0, o1); work: zy_quant_work_floats(a->ng) */
    ZyQuantKernelFn widen, int8;
    int centered8; /* its 8-bit int8 dot products are Σ (q - 128)·x (pmaddubsw cannot take 255·127 pairs) */
} ZyQuantTable;
/* zy_matmul_quant by the kernels of table t, which the caller knows this CPU runs: the tests' way to a compilation
 * of quant_isa.c outside the kernel table (the VNNI kernels with the instruction emulated in AVX2). */
int zy_matmul_quant_by(const ZyQuantTable *t, int w, int rows, const float *X, int ldx, const ZyQuantMatrix *W,
                       float *Y, int ldy);

#endif
