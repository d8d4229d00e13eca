/* The quantized-weight kernels (quant.h), compiled once per CPU level with its -march (Makefile: -DZY_ISA=generic,
 * avx2, avx512, and avxvnni / avx512vnni: those levels plus the VNNI instructions), names suffixed _ZY_ISA, each
 * compilation filling one ZyQuantTable.
 *
 * Both ways walk an output's packed row once, a block of 32 codes at a time (a group is 1, 2 or 4 blocks), with the
 * block's codes in one register in column order: 8-bit codes are the bytes as stored; 4-bit ones are split into low
 * and high nibbles (the even and odd columns) and interleaved back. Each block's codes then meet every row of the
 * call's activations (up to 4), so a weight byte is loaded once per call. */
#include <string.h>

#include "kernels/quant.h"

#ifndef ZY_ISA
#error "quant_isa.c is compiled once per CPU level, with -DZY_ISA=<level> (see the Makefile)"
#endif
#define ZY_PASTE_(a, b) a##_##b
#define ZY_PASTE(a, b) ZY_PASTE_(a, b)
#define ZY_ISA_NAME(name) ZY_PASTE(name, ZY_ISA)
#define ZY_STR_(x) #x
#define ZY_STR(x) ZY_STR_(x)

/* A stored scale or bias in fp32 (bf16 by a shift; F16 rarely: through util). */
static inline float stored(ZyDtype dt, const void *p, size_t i) {
    if (dt == ZY_DT_BF16) {
        uint16_t h;
        memcpy(&h, (const uint16_t *)p + i, sizeof h);
        return zy_bf16_to_f32(h);
    }
    if (dt == ZY_DT_F32) {
        float v;
        memcpy(&v, (const float *)p + i, sizeof v);
        return v;
    }
    uint16_t h;
    memcpy(&h, (const uint16_t *)p + i, sizeof h);
    return zy_f16_to_f32(h);
}

/* The group's terms outside the dot products, for every row: s·corr + b·xsum. */
static inline void group_tail(const ZyQuantActs *a, const ZyQuantMatrix *W, long o, int g, float s, float *tail) {
    const float b = stored(W->scale_dtype, W->biases, (size_t)o * a->ng + g);
    for (int r = 0; r < a->nr; r++) {
        const float sc = s * a->corr[r * a->ng + g], bx = b * a->xsum[r * a->ng + g];
        tail[r] += sc + bx;
    }
}

#if defined(__SSSE3__) && defined(__SSE4_1__)
#include <immintrin.h>

#if defined(__AVX2__)
/* ---- 256 bits (avx2, avxvnni; avx512 and avx512vnni for the int8 way, with 32 registers) ---- */
typedef __m256i Codes; /* 32 codes, column order */

static inline Codes load_codes(const uint8_t *p, int bits) {
    if (bits == 8) return _mm256_loadu_si256((const __m256i *)(const void *)p);
    const __m128i b = _mm_loadu_si128((const __m128i *)(const void *)p), m = _mm_set1_epi8(0x0f);
    const __m128i lo = _mm_and_si128(b, m), hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
    return _mm256_set_m128i(_mm_unpackhi_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi));
}

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Σ over 4 adjacent pairs of (code, int8 value), 8 int32 lanes; centered: (code - 128) for 8-bit codes */
static inline __m256i dot_block(Codes c, __m256i x, int bits) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    (void)bits;
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), c, x);
#elif defined(__AVXVNNI__)
    (void)bits;
    return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), c, x);
#else
    const __m256i ones = _mm256_set1_epi16(1);
    if (bits == 4) return _mm256_madd_epi16(_mm256_maddubs_epi16(c, x), ones); /* 2·15·127 fits int16 */
    /* 2·255·127 does not: (code - 128) in [-128, 127], its magnitude (<= 128, unsigned) against x's sign-moved
     * value: pairs of at most 2·128·127 */
    const __m256i cs = _mm256_xor_si256(c, _mm256_set1_epi8((char)0x80));
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(cs), _mm256_sign_epi8(x, cs)), ones);
#endif
}
#if defined(__AVX512VNNI__) || defined(__AVXVNNI__)
#define CENTERED8 0
#else
#define CENTERED8 1
#endif

static void quant_int8(const ZyQuantActs *a, const ZyQuantMatrix *W, long o0, long o1, float *Y, int ldy) {
    const int nr = a->nr, bits = W->bits, bpg = W->group_size / 32, rowbytes = W->cols / 8 * bits;
    for (long o = o0; o < o1; o++) {
        const uint8_t *q = (const uint8_t *)W->q + o * rowbytes;
        __m256 acc[ZY_QUANT_ROW_BLOCK];
        float tail[ZY_QUANT_ROW_BLOCK] = {0};
        for (int r = 0; r < nr; r++) acc[r] = _mm256_setzero_ps();
        for (int g = 0; g < a->ng; g++) {
            __m256 gacc[ZY_QUANT_ROW_BLOCK];
            for (int r = 0; r < nr; r++) gacc[r] = _mm256_setzero_ps();
            for (int j = 0; j < bpg; j++) {
                const int b = g * bpg + j;
                const Codes c = load_codes(q + (long)b * 4 * bits, bits);
                for (int r = 0; r < nr; r++) {
                    const __m256i x = _mm256_loadu_si256((const __m256i *)(const void *)(a->xq + (long)r * a->in + 32 * b));
                    gacc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_block(c, x, bits)), _mm256_set1_ps(a->d[r * a->nb + b]),
                                              gacc[r]);
                }
            }
            const float s = stored(W->scale_dtype, W->scales, (size_t)o * a->ng + g);
            for (int r = 0; r < nr; r++) acc[r] = _mm256_fmadd_ps(gacc[r], _mm256_set1_ps(s), acc[r]);
            group_tail(a, W, o, g, s, tail);
        }
        for (int r = 0; r < nr; r++) Y[(long)r * ldy + o] = hsum8(acc[r]) + tail[r];
    }
}

#if defined(__AVX512F__)
/* the fp32 way on 512 bits: 16 codes widened per step */
static inline float hsum16(__m512 v) { return _mm512_reduce_add_ps(v); }
static void quant_widen(const ZyQuantActs *a, const ZyQuantMatrix *W, long o0, long o1, float *Y, int ldy) {
    const int nr = a->nr, bits = W->bits, bpg = W->group_size / 32, rowbytes = W->cols / 8 * bits;
    for (long o = o0; o < o1; o++) {
        const uint8_t *q = (const uint8_t *)W->q + o * rowbytes;
        __m512 acc[ZY_QUANT_ROW_BLOCK];
        float tail[ZY_QUANT_ROW_BLOCK] = {0};
        for (int r = 0; r < nr; r++) acc[r] = _mm512_setzero_ps();
        for (int g = 0; g < a->ng; g++) {
            __m512 gacc[ZY_QUANT_ROW_BLOCK];
            for (int r = 0; r < nr; r++) gacc[r] = _mm512_setzero_ps();
            for (int j = 0; j < bpg; j++) {
                const int b = g * bpg + j;
                const Codes c = load_codes(q + (long)b * 4 * bits, bits);
                const __m512 w0 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(c)));
                const __m512 w1 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(c, 1)));
                for (int r = 0; r < nr; r++) {
                    const float *x = a->X + (long)r * a->ldx + 32 * b;
                    gacc[r] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x), gacc[r]);
                    gacc[r] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + 16), gacc[r]);
                }
            }
            const float s = stored(W->scale_dtype, W->scales, (size_t)o * a->ng + g);
            for (int r = 0; r < nr; r++) acc[r] = _mm512_fmadd_ps(gacc[r], _mm512_set1_ps(s), acc[r]);
            group_tail(a, W, o, g, s, tail);
        }
        for (int r = 0; r < nr; r++) Y[(long)r * ldy + o] = hsum16(acc[r]) + tail[r];
    }
}
#else
static void quant_widen(const ZyQuantActs *a, const ZyQuantMatrix *W, long o0, long o1, float *Y, int ldy) {
    const int nr = a->nr, bits = W->bits, bpg = W->group_size / 32, rowbytes = W->cols / 8 * bits;
    for (long o = o0; o < o1; o++) {
        const uint8_t *q = (const uint8_t *)W->q + o * rowbytes;
        __m256 acc[ZY_QUANT_ROW_BLOCK];
        float tail[ZY_QUANT_ROW_BLOCK] = {0};
        for (int r = 0; r < nr; r++) acc[r] = _mm256_setzero_ps();
        for (int g = 0; g < a->ng; g++) {
            __m256 gacc[ZY_QUANT_ROW_BLOCK];
            for (int r = 0; r < nr; r++) gacc[r] = _mm256_setzero_ps();
            for (int j = 0; j < bpg; j++) {
                const int b = g * bpg + j;
                const Codes c = load_codes(q + (long)b * 4 * bits, bits);
                const __m128i lo = _mm256_castsi256_si128(c), hi = _mm256_extracti128_si256(c, 1);
                const __m256 w[4] = {_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)),
                                     _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8))),
                                     _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)),
                                     _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)))};
                for (int r = 0; r < nr; r++) {
                    const float *x = a->X + (long)r * a->ldx + 32 * b;
                    for (int i = 0; i < 4; i++) gacc[r] = _mm256_fmadd_ps(w[i], _mm256_loadu_ps(x + 8 * i), gacc[r]);
                }
            }
            const float s = stored(W->scale_dtype, W->scales, (size_t)o * a->ng + g);
            for (int r = 0; r < nr; r++) acc[r] = _mm256_fmadd_ps(gacc[r], _mm256_set1_ps(s), acc[r]);
            group_tail(a, W, o, g, s, tail);
        }
        for (int r = 0; r < nr; r++) Y[(long)r * ldy + o] = hsum8(acc[r]) + tail[r];
    }
}
#endif

#else
/* ---- 128 bits (generic: x86-64-v2 has SSSE3 and SSE4.1, no FMA) ---- */
typedef struct {
    __m128i lo, hi; /* codes 0-15, 16-31 */
} Codes;

static inline Codes load_codes(const uint8_t *p, int bits) {
    if (bits == 8)
        return (Codes){_mm_loadu_si128((const __m128i *)(const void *)p),
                       _mm_loadu_si128((const __m128i *)(const void *)(p + 16))};
    const __m128i b = _mm_loadu_si128((const __m128i *)(const void *)p), m = _mm_set1_epi8(0x0f);
    const __m128i lo = _mm_and_si128(b, m), hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
    return (Codes){_mm_unpacklo_epi8(lo, hi), _mm_unpackhi_epi8(lo, hi)};
}

static inline float hsum4(__m128 s) {
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline __m128i dot16(__m128i c, __m128i x, int bits) {
    const __m128i ones = _mm_set1_epi16(1);
    if (bits == 4) return _mm_madd_epi16(_mm_maddubs_epi16(c, x), ones);
    const __m128i cs = _mm_xor_si128(c, _mm_set1_epi8((char)0x80));
    return _mm_madd_epi16(_mm_maddubs_epi16(_mm_abs_epi8(cs), _mm_sign_epi8(x, cs)), ones);
}
#define CENTERED8 1

static void quant_int8(const ZyQuantActs *a, const ZyQuantMatrix *W, long o0, long o1, float *Y, int ldy) {
    const int nr = a->nr, bits = W->bits, bpg = W->group_size / 32, rowbytes = W->cols / 8 * bits;
    for (long o = o0; o < o1; o++) {
        const uint8_t *q = (const uint8_t *)W->q + o * rowbytes;
        __m128 acc[ZY_QUANT_ROW_BLOCK];
        float tail[ZY_QUANT_ROW_BLOCK] = {0};
        for (int r = 0; r < nr; r++) acc[r] = _mm_setzero_ps();
        for (int g = 0; g < a->ng; g++) {
            __m128 gacc[ZY_QUANT_ROW_BLOCK];
            for (int r = 0; r < nr; r++) gacc[r] = _mm_setzero_ps();
            for (int j = 0; j < bpg; j++) {
                const int b = g * bpg + j;
                const Codes c = load_codes(q + (long)b * 4 * bits, bits);
                for (int r = 0; r < nr; r++) {
                    const int8_t *x = a->xq + (long)r * a->in + 32 * b;
                    const __m128i p = _mm_add_epi32(dot16(c.lo, _mm_loadu_si128((const __m128i *)(const void *)x), bits),
                                                    dot16(c.hi, _mm_loadu_si128((const __m128i *)(const void *)(x + 16)), bits));
                    gacc[r] = _mm_add_ps(gacc[r], _mm_mul_ps(_mm_cvtepi32_ps(p), _mm_set1_ps(a->d[r * a->nb + b])));
                }
            }
            const float s = stored(W->scale_dtype, W->scales, (size_t)o * a->ng + g);
            for (int r = 0; r < nr; r++) acc[r] = _mm_add_ps(acc[r], _mm_mul_ps(gacc[r], _mm_set1_ps(s)));
            group_tail(a, W, o, g, s, tail);
        }
        for (int r = 0; r < nr; r++) Y[(long)r * ldy + o] = hsum4(acc[r]) + tail[r];
    }
}

static void quant_widen(const ZyQuantActs *a, const ZyQuantMatrix *W, long o0, long o1, float *Y, int ldy) {
    const int nr = a->nr, bits = W->bits, bpg = W->group_size / 32, rowbytes = W->cols / 8 * bits;
    for (long o = o0; o < o1; o++) {
        const uint8_t *q = (const uint8_t *)W->q + o * rowbytes;
        __m128 acc[ZY_QUANT_ROW_BLOCK];
        float tail[ZY_QUANT_ROW_BLOCK] = {0};
        for (int r = 0; r < nr; r++) acc[r] = _mm_setzero_ps();
        for (int g = 0; g < a->ng; g++) {
            __m128 gacc[ZY_QUANT_ROW_BLOCK];
            for (int r = 0; r < nr; r++) gacc[r] = _mm_setzero_ps();
            for (int j = 0; j < bpg; j++) {
                const int b = g * bpg + j;
                const Codes c = load_codes(q + (long)b * 4 * bits, bits);
                __m128 w[8];
                for (int i = 0; i < 4; i++) {
                    const __m128i part = i < 2 ? c.lo : c.hi, sh = (i & 1) ? _mm_srli_si128(part, 8) : part;
                    w[2 * i] = _mm_cvtepi32_ps(_mm_cvtepu8_epi32(sh));
                    w[2 * i + 1] = _mm_cvtepi32_ps(_mm_cvtepu8_epi32(_mm_srli_si128(sh, 4)));
                }
                for (int r = 0; r < nr; r++) {
                    const float *x = a->X + (long)r * a->ldx + 32 * b;
                    for (int i = 0; i < 8; i++) gacc[r] = _mm_add_ps(gacc[r], _mm_mul_ps(w[i], _mm_loadu_ps(x + 4 * i)));
                }
            }
            const float s = stored(W->scale_dtype, W->scales, (size_t)o * a->ng + g);
            for (int r = 0; r < nr; r++) acc[r] = _mm_add_ps(acc[r], _mm_mul_ps(gacc[r], _mm_set1_ps(s)));
            group_tail(a, W, o, g, s, tail);
        }
        for (int r = 0; r < nr; r++) Y[(long)r * ldy + o] = hsum4(acc[r]) + tail[r];
    }
}
#endif

const ZyQuantTable ZY_ISA_NAME(zy_quant_table) = {
    .name = ZY_STR(ZY_ISA), .widen = quant_widen, .int8 = quant_int8, .centered8 = CENTERED8};

#else
/* Not x86 (or a baseline without SSSE3): no table; quant_matmul.c runs the plain kernels for this level. */
const ZyQuantTable ZY_ISA_NAME(zy_quant_table) = {.name = NULL};
#endif
