/* The float ops of kernels.inc (the model's), compiled once per CPU level with that level's -march (Makefile:
 * -DZY_ISA=generic|avx2|avx512), names suffixed _ZY_ISA, and gathered into that level's kernel table
 * (kernel_table.h). The vectoriser does the per-level work: the source is the same for every level. */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/attention.h"
#include "kernels/kernel_table.h"
#include "kernels/kernels.h"
#include "kernels/matmul.h"
#if defined(__AVX512F__)
#include "kernels/reduce16.h" /* 16-lane vectors: AVX-512 only */
#endif

#ifndef ZY_ISA
#error "kernels_isa.c is compiled once per CPU level, with -DZY_ISA=<level> (see the Makefile)"
#endif

/* kernels.inc marks independent loops `omp simd` (GCC cannot prove the many pointers distinct); clang at -O1
 * (the sanitizer build) declines to vectorise them and would warn. */
#if defined(__clang__)
#pragma clang diagnostic ignored "-Wpass-failed"
#endif

/* exp and erfc in float for the elementwise activations, written so GCC vectorises them (no calls; the only
 * selects are plain min/max: -ftrapping-math keeps GCC from if-converting selects between computed values).
 * zy_vexpf: Cephes expf (2^n by the exponent bits times a degree-6 polynomial on the reduced argument), relative
 * error < 1e-7 on [-87, 88] (outside it the result is garbage: kernels.inc checks the range per row).
 * zy_verfcf: Numerical Recipes erfcc for z >= 0, fractional error < 1.2e-7. */
typedef union {
    int32_t i;
    float f;
} ZyBits;

static inline float zy_vexpf(float x) { /* x in [-87, 88]: callers check (a clamp here defeats vectorisation) */
    const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to nearest */
    const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const ZyBits b = {.i = ((int32_t)n + 127) * (1 << 23)};
    return p * b.f;
}

static inline float zy_verfcf(float z) {
    const float t = 1.0f / (1.0f + 0.5f * z);
    float p = 0.17087277f;
    p = p * t - 0.82215223f;
    p = p * t + 1.48851587f;
    p = p * t - 1.13520398f;
    p = p * t + 0.27886807f;
    p = p * t - 0.18628806f;
    p = p * t + 0.09678418f;
    p = p * t + 0.37409196f;
    p = p * t + 1.00002368f;
    p = p * t - 1.26551223f;
    return t * zy_vexpf(p - z * z);
}


/* The grouped conv's products (kernels.inc): the level's tiles of dot products over every row, never the BLAS, on
 * W's bf16 view where it has one, else its fp32 view (from element `at`). */
static void tile_rows(int rows, int out, int in, const float *X, int ldx, ZyWeights W, long at, float *Y, int ldy);

#define real float
#define K(name) ZY_ISA_NAME(name)
#define ROW_PRODUCTS tile_rows
#define GEMM zy_gemm
#define GEMM_CTX zy_gemm_ctx
#define GEMM_CTX_W zy_gemm_ctx_w /* B is a weight: its bf16 copy is reused */
#define GEMM_CTX_EX zy_gemm_ctx_ex
#define MATMUL_WT_GROUPS zy_matmul_wt_groups_ctx
#define WEIGHTS ZyWeights /* fp32 or bf16 views */
#define WEIGHTS_OF(p) ((ZyWeights){.f32 = (p)})
#define EXP expf
#define VEXP zy_vexpf
#define VERFC zy_verfcf
#define FABS fabsf
#define COPYSIGN copysignf
#define ERFC erfcf
#include "kernels/kernels.inc"


/* ---- bf16 weights: Y = X W16ᵀ for a few rows, fp32 accumulation --------------------------------------------------
 * The weights are widened to fp32 (a 16-bit shift) in vectors of the level's width and multiplied in fp32: one load
 * of the weights feeds every row of the block, and four independent sums per row keep the FMA latency off the
 * memory stream. */
#if defined(__AVX512F__)
#define BW 16
#elif defined(__AVX__)
#define BW 8
#else
#define BW 4
#endif
typedef float bvec __attribute__((vector_size(BW * sizeof(float))));
typedef uint32_t bvec_u32 __attribute__((vector_size(BW * sizeof(uint32_t))));
typedef uint16_t bvec_u16 __attribute__((vector_size(BW * sizeof(uint16_t))));

static inline bvec bf16_widen(const uint16_t *p) {
    bvec_u16 h;
    memcpy(&h, p, sizeof h);
    const bvec_u32 u = __builtin_convertvector(h, bvec_u32) << 16;
    bvec f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static inline bvec bvec_load(const float *p) {
    bvec v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline float bvec_sum(bvec v) {
    float s = 0;
    for (int i = 0; i < BW; i++) s += v[i];
    return s;
}

void ZY_ISA_NAME(matmul_bf16_block)(int nr, int o0, int o1, int in, const float *X, int ldx, const uint16_t *W16,
                                    float *Y, int ldy) {
    const int in_v = in / BW * BW, in_4v = in / (4 * BW) * (4 * BW);
    for (int o = o0; o < o1; o++) {
        const uint16_t *w = W16 + (long)o * in;
        if (nr == 1) { /* decoding one token */
            bvec a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
            int k = 0;
            for (; k < in_4v; k += 4 * BW) {
                a0 += bf16_widen(w + k) * bvec_load(X + k);
                a1 += bf16_widen(w + k + BW) * bvec_load(X + k + BW);
                a2 += bf16_widen(w + k + 2 * BW) * bvec_load(X + k + 2 * BW);
                a3 += bf16_widen(w + k + 3 * BW) * bvec_load(X + k + 3 * BW);
            }
            for (; k < in_v; k += BW) a0 += bf16_widen(w + k) * bvec_load(X + k);
            float acc = bvec_sum((a0 + a1) + (a2 + a3));
            for (; k < in; k++) acc += zy_bf16_to_f32(w[k]) * X[k];
            Y[o] = acc;
            continue;
        }
        bvec acc[ZY_BF16_ROW_BLOCK] = {{0}};
        int k = 0;
        for (; k < in_v; k += BW) {
            const bvec wv = bf16_widen(w + k);
            for (int r = 0; r < nr; r++) acc[r] += wv * bvec_load(X + (long)r * ldx + k);
        }
        for (int r = 0; r < nr; r++) {
            const float *x = X + (long)r * ldx;
            float a = bvec_sum(acc[r]);
            for (int j = k; j < in; j++) a += zy_bf16_to_f32(w[j]) * x[j];
            Y[(long)r * ldy + o] = a;
        }
    }
}

/* ---- fp32 weights: Y = X Wᵀ for a few rows, as tiles of dot products --------------------------------------------
 * sgemm packs the whole weight matrix into its own layout on every call: for a few rows (the experts of a decoding
 * step hold a handful each) that copy costs as much as the product. Here NR rows and 4 weight rows make a tile of
 * 4 NR vector sums over k: 4 + NR loads feed 4 NR multiply-adds, and the weights are read once, as stored. */
#if defined(__AVX512F__)
#include <immintrin.h>
static inline bvec bvec_fma(bvec a, bvec b, bvec c) { return (bvec)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c); }
#elif defined(__FMA__)
#include <immintrin.h>
static inline bvec bvec_fma(bvec a, bvec b, bvec c) { return (bvec)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c); }
#else
static inline bvec bvec_fma(bvec a, bvec b, bvec c) { return a * b + c; }
#endif

/* Weight k of a row held as fp32 (W16 = 0) or bf16 (W16 = 1, widened: the same value its fp32 copy holds). */
static inline __attribute__((always_inline)) bvec tile_load(const void *w, const int W16, int k) {
    return W16 ? bf16_widen((const uint16_t *)w + k) : bvec_load((const float *)w + k);
}
static inline __attribute__((always_inline)) float tile_at(const void *w, const int W16, int k) {
    return W16 ? zy_bf16_to_f32(((const uint16_t *)w)[k]) : ((const float *)w)[k];
}

/* W [out, in] as fp32 values, or (W16) as bf16 ones: the same sums either way. */
static inline __attribute__((always_inline)) void f32_tile(const int NR, const int W16, int no, int in, const float *X,
                                                          int ldx, const void *W, int o, float *Y, int ldy) {
    const size_t size = W16 ? sizeof(uint16_t) : sizeof(float);
    const char *w[4];
    for (int j = 0; j < 4; j++) /* a partial tile repeats */
        w[j] = (const char *)W + (size_t)(o + (j < no ? j : no - 1)) * in * size;
    bvec acc[4][4];
    for (int r = 0; r < NR; r++)
        for (int j = 0; j < 4; j++) acc[r][j] = (bvec){0};
    int k = 0;
    for (; k + BW <= in; k += BW) {
        const bvec w0 = tile_load(w[0], W16, k), w1 = tile_load(w[1], W16, k), w2 = tile_load(w[2], W16, k),
                   w3 = tile_load(w[3], W16, k);
        for (int j = 0; j < 4; j++) /* two tiles ahead: four short streams the hardware finds late */
            __builtin_prefetch(w[j] + (8 * (size_t)in + k) * size);
        for (int r = 0; r < NR; r++) {
            const bvec x = bvec_load(X + (long)r * ldx + k);
            acc[r][0] = bvec_fma(x, w0, acc[r][0]), acc[r][1] = bvec_fma(x, w1, acc[r][1]);
            acc[r][2] = bvec_fma(x, w2, acc[r][2]), acc[r][3] = bvec_fma(x, w3, acc[r][3]);
        }
    }
#if BW == 16
    zy_f32x16 v[16], sums;
    for (int i = 0; i < 16; i++) v[i] = i / 4 < NR ? (zy_f32x16)acc[i / 4][i % 4] : (zy_f32x16){0};
    sums = zy_reduce16(v); /* lane 4 r + j: the sum of acc[r][j] */
#endif
    for (int r = 0; r < NR; r++)
        for (int j = 0; j < no; j++) {
            const float *x = X + (long)r * ldx;
#if BW == 16
            float a = sums[4 * r + j];
#else
            float a = bvec_sum(acc[r][j]);
#endif
            for (int t = k; t < in; t++) a += x[t] * tile_at(w[j], W16, t);
            Y[(long)r * ldy + o + j] = a;
        }
}

/* Outputs o0..o1-1 of nr <= 4 rows, 4 outputs a tile; the row count and the weights' type as constants (each case
 * keeps its 4 x nr sums in registers). */
static void tile_block(int nr, int o0, int o1, int in, const float *X, int ldx, const void *W, int w16, float *Y,
                       int ldy) {
    for (int o = o0; o < o1; o += 4) {
        const int no = o1 - o < 4 ? o1 - o : 4;
        switch (nr * 2 + (w16 != 0)) {
        case 2: f32_tile(1, 0, no, in, X, ldx, W, o, Y, ldy); break;
        case 4: f32_tile(2, 0, no, in, X, ldx, W, o, Y, ldy); break;
        case 6: f32_tile(3, 0, no, in, X, ldx, W, o, Y, ldy); break;
        case 8: f32_tile(4, 0, no, in, X, ldx, W, o, Y, ldy); break;
        case 3: f32_tile(1, 1, no, in, X, ldx, W, o, Y, ldy); break;
        case 5: f32_tile(2, 1, no, in, X, ldx, W, o, Y, ldy); break;
        case 7: f32_tile(3, 1, no, in, X, ldx, W, o, Y, ldy); break;
        default: f32_tile(4, 1, no, in, X, ldx, W, o, Y, ldy); break;
        }
    }
}

void ZY_ISA_NAME(matmul_f32_block)(int nr, int o0, int o1, int in, const float *X, int ldx, const float *W, float *Y,
                                   int ldy) {
    tile_block(nr, o0, o1, in, X, ldx, W, 0, Y, ldy);
}

/* Y = X Wᵀ for any number of rows as tiles: chunks of 32 outputs (their weights stay in L1) against every block of 4
 * rows. Each output's sum is the tile's, whatever the row count and whichever view the weights come from. */
static void tile_rows(int rows, int out, int in, const float *X, int ldx, ZyWeights W, long at, float *Y, int ldy) {
    const int w16 = W.bf16 != NULL;
    const void *w = w16 ? (const void *)(W.bf16 + at) : (const void *)(W.f32 + at);
    for (int o0 = 0; o0 < out; o0 += ZY_F32_TILE_CHUNK) {
        const int o1 = o0 + ZY_F32_TILE_CHUNK < out ? o0 + ZY_F32_TILE_CHUNK : out;
        for (int r0 = 0; r0 < rows; r0 += 4)
            tile_block(rows - r0 < 4 ? rows - r0 : 4, o0, o1, in, X + (long)r0 * ldx, ldx, w, w16, Y + (long)r0 * ldy,
                       ldy);
    }
}

void ZY_ISA_NAME(f32_to_bf16_row)(uint16_t *dst, const float *src, int n) {
    /* zy_f32_to_bf16 written without branches, so it vectorises */
#pragma omp simd
    for (int i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, src + i, sizeof u);
        const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, quiet_nan = (u >> 16) | 0x40u;
        dst[i] = (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
    }
}

#define ZY_KERNEL_ENTRY(ret, name, params, args) .name = ZY_ISA_NAME(name),
#define ZY_STR_(x) #x
#define ZY_STR(x) ZY_STR_(x)
const ZyKernelTable ZY_ISA_NAME(zy_kernels) = {.level = ZY_STR(ZY_ISA), ZY_KERNEL_LIST(ZY_KERNEL_ENTRY)};
