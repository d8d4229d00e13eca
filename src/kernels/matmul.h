/* matmul: the one seam every matrix product goes through (OpenBLAS today; the GPU backend plugs in here).
 * Row-major C = alpha * op(A) op(B) + beta * C with op = transpose when trans_* is non-zero;
 * op(A) is M x K, op(B) is K x N. */
#ifndef ZAYA_MATMUL_H
#define ZAYA_MATMUL_H

#include <stdint.h>

#include "kernels/quant.h"
#include "util/util.h"

void zy_gemm(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
             int ldb, float beta, float *C, int ldc);
/* zy_gemm without its matrix-vector shortcuts (always sgemm): the reference in tests. */
void zy_gemm_reference(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda,
                       const float *B, int ldb, float beta, float *C, int ldc);
/* The upper triangle (row-major: j >= i) of the symmetric C [N, N] = alpha * op(A) op(A)ᵀ + beta * C, with
 * op(A) = A [N, K] (trans = 0) or Aᵀ (A [K, N], trans = 1); the strictly lower triangle is left as it was. Half
 * the FLOPs of the gemm (Muon's Newton–Schulz: X Xᵀ and A²). */
void zy_syrk_upper(int trans, int N, int K, float alpha, const float *A, int lda, float beta, float *C, int ldc);
/* Double precision, for the finite-difference reference checks. */
void zy_gemm_f64(int trans_a, int trans_b, int M, int N, int K, double alpha, const double *A, int lda,
                 const double *B, int ldb, double beta, double *C, int ldc);

/* Y[rows, out] (ldy) = X[rows, in] (ldx) Wᵀ, W [out, in] fp32 row-major (a layer's weight): up to
 * ZY_F32_TILE_MAX_ROWS rows (decoding, the experts' few rows) as tiles of dot products that read W as stored (the
 * level's matmul_f32_block); one row or more go to sgemv / sgemm. Each output's sum is independent of the thread
 * count. */
#define ZY_F32_TILE_MAX_ROWS 16
#define ZY_F32_TILE_CHUNK 32
void zy_matmul_f32(int rows, int out, int in, const float *X, int ldx, const float *W, float *Y, int ldy);

/* ---- bf16 weights (inference) ----
 * bfloat16 = the top 16 bits of a float32 (8-bit exponent, 8-bit significand). Weights may be bf16; activations
 * and every accumulation stay fp32 (conversions: util.h). */
/* Below avx512bf16: rows up to which zy_matmul_wt reads the bf16 weights directly (one pass per ZY_BF16_ROW_BLOCK
 * rows); more rows go to sgemm on panels of ZY_BF16_PANEL output rows widened to fp32. */
#define ZY_BF16_MAX_ROWS 8
#define ZY_BF16_ROW_BLOCK 4
#define ZY_BF16_PANEL 256

/* A layer's weight matrix [out, in] (row-major) as the model holds it: fp32 values, bf16 ones (bf16 inference
 * weights: read instead of the fp32 view, which is then NULL), or group-quantized codes (quant.q non-NULL: a quantized
 * folder read in place; the other views are then NULL). Any view may be absent. */
typedef struct {
    const float *f32;
    const uint16_t *bf16;
    ZyQuantMatrix quant;
} ZyWeights;
/* The matrix `elements` values into w's (the next expert's of a stack [E, out, in]): each view moved, NULL kept. */
static inline ZyWeights zy_weights_offset(ZyWeights w, long elements) {
    ZyWeights o = {.f32 = w.f32 ? w.f32 + elements : NULL, .bf16 = w.bf16 ? w.bf16 + elements : NULL, .quant = w.quant};
    if (w.quant.q) o.quant = zy_quant_rows(&w.quant, elements / w.quant.cols, w.quant.rows - elements / w.quant.cols);
    return o;
}

/* A layer's weight applied to rows of activations: Y[rows, out] (row stride ldy) = X[rows, in] (ldx) Wᵀ, from W's
 * quantized view where it has one (zy_matmul_quant_wt), else its bf16 view where it has one (its fp32 view is then
 * not read), else its fp32 view (zy_matmul_f32). bf16 at
 * avx512bf16: zy_matmul_bf16_dpbf16 for any number of rows; below it, a few rows (decoding) read the bf16 values
 * directly, half the bytes of a memory-bound product, and more rows widen them in panels. */
void zy_matmul_wt(int rows, int out, int in, const float *X, int ldx, ZyWeights W, float *Y, int ldy);
/* zy_matmul_wt of one X with n weights W[i] [out[i], in] into Y[i] (ldy[i]): a layer's projections of one input. Where
 * all n are quantized in one format and the rows few, one pass of the quantized kernels (zy_matmul_quant_shared: one
 * parallel region, X rounded once); else one zy_matmul_wt each. Each output is zy_matmul_wt's, bit for bit. */
void zy_matmul_wt_shared(int rows, int in, const float *X, int ldx, int n, const ZyWeights *W, const int *out,
                         float *const *Y, const int *ldy);
/* The few-row bf16 kernels themselves, Y = X W16ᵀ for any number of rows: impl = a ZyCpuLevel (the CPU must have
 * it; ZY_CPU_AVX512BF16 rounds X to bf16 and runs vdpbf16ps dot products, the others widen the weights to fp32),
 * -1 = the process's level, ZY_BF16_PLAIN = plain scalar C (the reference in tests). */
#define ZY_BF16_PLAIN 100
void zy_matmul_bf16(int impl, int rows, int out, int in, const float *X, int ldx, const uint16_t *W16, float *Y,
                    int ldy);
/* The AVX512-BF16 kernel (matmul_avx512bf16.c): X rounded to bf16, vdpbf16ps, fp32 sums; 1 row along each weight
 * row, 2-4 rows with the weight rows in memory order, more in 4 x 4 tiles. Returns -1 (having done nothing) when this
 * build has no such kernel or the scratch for bf16 X cannot be allocated. */
int zy_matmul_bf16_dpbf16(int rows, int out, int in, const float *X, int ldx, const uint16_t *W16, float *Y, int ldy);
/* ... for G groups of rows at once (a MoE layer's experts): rows [off[g], off[g+1]) of X against W16 + g·out·in,
 * into the same rows of Y, each output the same sum as zy_matmul_bf16_dpbf16 on the group alone; one parallel
 * region for them all. */
int zy_matmul_bf16_dpbf16_groups(int G, const int32_t *off, int out, int in, const float *X, int ldx,
                                 const uint16_t *W16, float *Y, int ldy);
/* Y = X W16ᵀ by widening panels of ZY_BF16_PANEL weight rows to fp32 for sgemm (X as given, not rounded): the path
 * for many rows below avx512bf16, and the simple one `zaya bench gemm --weights` compares against. */
void zy_matmul_bf16_panels(int rows, int out, int in, const float *X, int ldx, const uint16_t *W16, float *Y,
                           int ldy);

/* How products with bf16 weights run (inference: zy_matmul_wt), one way for the whole process so that decoding and a
 * full forward round the same values: */
typedef enum {
    ZY_BF16W_AUTO,         /* DOT at the avx512bf16 level, WIDEN below it */
    ZY_BF16W_WIDEN,        /* weights widened to fp32 (registers for a few rows, panels for sgemm); activations fp32 */
    ZY_BF16W_DOT,          /* activations rounded to bf16 and vdpbf16ps dot products (avx512bf16 only) */
    ZY_BF16W_DOT_EMULATED, /* DOT's rounding in plain C on any CPU (exact bf16 products, fp32 sums): for tests */
} ZyBf16Weights;
/* Sets the process's way from a name (ZAYA_BF16_WEIGHTS: auto, widen, dot, dot-emulated; NULL or "" = auto); an
 * unknown name, or dot below the avx512bf16 level, is an error naming ZAYA_BF16_WEIGHTS. */
int zy_bf16_weights_set(const char *name, ZyErr *err);
/* The way in force (AUTO resolved). */
ZyBf16Weights zy_bf16_weights(void);
const char *zy_bf16_weights_describe(ZyBf16Weights w);

/* ---- bf16 products ("precision": "bf16") ----
 * How one run's matrix products compute: fp32 (bf16 = 0), or with both inputs rounded to bf16 (nearest even) and
 * fp32 accumulation. Products of bf16 values are exact in fp32, so a bf16 product differs from zy_gemm on the
 * rounded inputs only in summation order. It holds reusable scratch (the bf16 copies of the inputs) and, with
 * oneDNN, a cache of its matmul primitives: one per run (not shared between threads). Zero-initialised = fp32. */
/* Which products a run with "precision": "bf16" computes (ZyGemmCtx.bf16), chosen per CPU (zy_bf16_products_resolve)
 * and kept by a resumed run (bit-exact resume needs the same products): */
typedef enum {
    ZY_BF16_PRODUCTS_AUTO = -1, /* to be resolved: never a ZyGemmCtx value */
    ZY_BF16_PRODUCTS_FP32 = 0,  /* fp32 products: on this CPU bf16 ones would be slower (no bf16 matrix unit) */
    ZY_BF16_PRODUCTS_ONEDNN,    /* bf16-rounded inputs, oneDNN's bf16 matmul (AMX or AVX512-BF16); sgemm if it can't */
    ZY_BF16_PRODUCTS_SGEMM,     /* bf16-rounded inputs widened back to fp32 for sgemm: the same products, any CPU */
} ZyBf16Products;
/* "auto", "fp32", "onednn", "sgemm" <-> the enum; parsing errors name `what` and the value. */
int zy_bf16_products_parse(const char *s, ZyBf16Products *out, const char *what, ZyErr *err);
const char *zy_bf16_products_name(ZyBf16Products p);
/* 1 if p can run here (onednn needs the avx512bf16 level and a oneDNN with native bf16 kernels); else 0 and why. */
int zy_bf16_products_available(ZyBf16Products p, char *why, size_t cap);
/* AUTO made concrete for this CPU: oneDNN where it has AMX tiles; where it has AVX512-BF16 alone, oneDNN or fp32,
 * whichever runs an [M, K] x [K, N] product faster (timed here, ~0.2 s; oneDNN must win by 5%); fp32 everywhere
 * else. A concrete request is returned as it is. why: one sentence (the timings, when it timed). */
ZyBf16Products zy_bf16_products_resolve(ZyBf16Products p, int M, int N, int K, char *why, size_t cap);

typedef struct {
    int bf16; /* a ZyBf16Products: 0 = fp32 */
    unsigned weights_gen; /* bumped by zy_gemm_ctx_weights_changed: the packed weights are stale */
    void *scratch[3];
    size_t scratch_bytes[3];
    void *dnnl; /* oneDNN engine, stream and primitive cache (matmul_bf16.c), created on first use */
} ZyGemmCtx;
void zy_gemm_ctx_free(ZyGemmCtx *ctx);

/* zy_gemm under ctx's precision (ctx NULL: fp32). ONEDNN: oneDNN's bf16 matmul (AVX512-BF16 dot products, or AMX
 * tiles where the CPU has them); SGEMM, or ONEDNN where oneDNN cannot run: the rounded inputs widened back to fp32
 * for sgemm (the same products, slower). If scratch memory runs out it falls back to fp32 (no error: the product is
 * still right, only not rounded). */
void zy_gemm_ctx(ZyGemmCtx *ctx, int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda,
                 const float *B, int ldb, float beta, float *C, int ldc);
/* Under bf16 every operand is rounded to a bf16 copy; how long a copy may be reused is the operand's kind:
 * ZY_MM_TEMP    made for this product only;
 * ZY_MM_STABLE  unchanged until the next zy_gemm_ctx_weights_changed (the weights, a forward's saved activations;
 *               model_forward calls it first): made once, reused by every product that reads it;
 * ZY_MM_AGAIN   the caller's word that this is the same memory, unchanged, as an operand of the previous product
 *               (the output gradient, read by both products of a backward): its copy is reused (made if no match).
 * zy_gemm_ctx is zy_gemm_ctx_ex with both TEMP; zy_gemm_ctx_w with B STABLE. */
enum { ZY_MM_TEMP, ZY_MM_STABLE, ZY_MM_AGAIN };
void zy_gemm_ctx_ex(ZyGemmCtx *ctx, int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda,
                    int a_kind, const float *B, int ldb, int b_kind, float beta, float *C, int ldc);
void zy_gemm_ctx_w(ZyGemmCtx *ctx, int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda,
                   const float *W, int ldw, float beta, float *C, int ldc);
void zy_gemm_ctx_weights_changed(ZyGemmCtx *ctx);
/* zy_matmul_wt under ctx's precision: bf16 rounds X and W's fp32 view, both STABLE (a forward's input and a weight;
 * without an fp32 view it is zy_matmul_wt). */
void zy_matmul_wt_ctx(ZyGemmCtx *ctx, int rows, int out, int in, const float *X, int ldx, ZyWeights W, float *Y,
                      int ldy);
/* zy_matmul_wt_ctx for each of G groups of rows against its own weights: rows [off[g], off[g+1]) of X against
 * zy_weights_offset(W, g·out·in), into the same rows of Y (a MoE layer's experts over their sorted rows). */
void zy_matmul_wt_groups_ctx(ZyGemmCtx *ctx, int G, const int32_t *off, int out, int in, const float *X, int ldx,
                             ZyWeights W, float *Y, int ldy);
/* What runs the products of a ZyBf16Products value in this process: "oneDNN <version> (<isa>)", the sgemm fallback
 * and why, or fp32. */
void zy_gemm_bf16_backend(ZyBf16Products p, char *out, size_t cap);

/* The BLAS behind zy_gemm: its build string and the core (kernel set) it runs, as OpenBLAS names them
 * (openblas_get_config, openblas_get_corename; blas_core.h decides which core that should be). */
const char *zy_blas_config(void);
const char *zy_blas_core_name(void);
int zy_blas_threads(void);

/* Measured sgemm throughput (GFLOP/s) of this process's BLAS on square matrices of size n, timed for about
 * `seconds` after a warm-up: the peak MFU is quoted against. */
double zy_sgemm_probe_gflops(int n, double seconds);
/* The same for bf16 products (zy_gemm_ctx with products p, rounding of the inputs included). */
double zy_gemm_bf16_probe_gflops(ZyBf16Products p, int n, double seconds);

#endif
