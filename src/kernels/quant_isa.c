/* The quantized-weight kernels (quant.h), compiled once per CPU level with its -march (Makefile: -DZY_ISA=generic,
 * avx2, avx512, and avxvnni / avx512vnni: those levels plus the VNNI instructions), names suffixed _ZY_ISA, each
 * compilation filling one ZyQuantTable.
 *
 * A kernel walks an output's packed row once, a block of 32 codes (16 or 32 bytes) at a time, and each block meets
 * every row of the call's activations (up to 4), so a weight byte is loaded once per call. 8-bit codes are used as
 * stored; 4-bit ones as the block's low nibbles then its high nibbles, which the activations' order matches
 * (quant.h). Per output, its scales and biases are widened once into the thread's scratch, and the terms outside
 * the dot products (b·Σx, s·corr) are one short dot product over the groups. The row count and the code width are
 * constants in each kernel body (always_inline + a switch), so its sums stay in registers. */
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
#define INLINE static inline __attribute__((always_inline))

#if defined(__SSSE3__) && defined(__SSE4_1__)
#include <immintrin.h>

/* ---- per output: its scales, d·s per row (int8), and the terms outside the dot products ---- */
typedef float v8f __attribute__((vector_size(32)));

INLINE void widen_stored(ZyDtype dt, const void *src, size_t at, int n, float *out) {
    if (dt == ZY_DT_F32) {
        memcpy(out, (const float *)src + at, sizeof(float) * (size_t)n);
    } else if (dt == ZY_DT_BF16) {
        const uint16_t *h = (const uint16_t *)src + at;
        for (int i = 0; i < n; i++) {
            const uint32_t u = (uint32_t)h[i] << 16;
            memcpy(out + i, &u, sizeof u);
        }
    } else {
        for (int i = 0; i < n; i++) out[i] = zy_f16_to_f32(((const uint16_t *)src)[at + i]);
    }
}

/* Σ a·b + c·e over n */
INLINE float dot2(const float *a, const float *b, const float *c, const float *e, int n) {
    v8f acc = {0};
    int g = 0;
    for (; g + 8 <= n; g += 8) {
        v8f va, vb, vc, ve;
        memcpy(&va, a + g, 32), memcpy(&vb, b + g, 32), memcpy(&vc, c + g, 32), memcpy(&ve, e + g, 32);
        acc += va * vb + vc * ve;
    }
    float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (; g < n; g++) s += a[g] * b[g] + c[g] * e[g];
    return s;
}

/* The codes 2 KB past the start of this output's row, a row's worth: requested ahead of the hardware's own stream
 * (which likely stops at each 4 KB page). Measured on Zen 3 (q8 and q4 ZAYA1-8B decoding steps with and without it,
 * alternating step by step in one run, medians of the pairs' ratios): steps 3-4% faster; 4 KB ahead and more gave
 * nothing measurable. A prefetch never faults, so the lines past the matrix's end need no guard. */
INLINE void prefetch_codes_ahead(const uint8_t *q, int rowbytes) {
    for (int i = 0; i < rowbytes; i += 64) __builtin_prefetch(q + 2048 + i);
}

/* work: sf [ng] (the scales), bf [ng] (the biases) */
INLINE void output_groups(const int nr, const ZyQuantActs *a, const ZyQuantMatrix *W, long o, float *work, float *tail) {
    const int ng = a->ng;
    float *sf = work, *bf = work + ng;
    widen_stored(W->scale_dtype, W->scales, (size_t)o * ng, ng, sf);
    widen_stored(W->scale_dtype, W->biases, (size_t)o * ng, ng, bf);
    for (int r = 0; r < nr; r++) tail[r] = dot2(sf, a->corr + r * ng, bf, a->xsum + r * ng, ng);
}

#if defined(__AVX2__)
/* ---- 256 bits (avx2, avxvnni; avx512 and avx512vnni for the int8 way, with 32 registers) ---- */

/* AVX-VNNI's vpdpbusd: acc + per int32 lane the sum of its 4 unsigned bytes of a times the signed bytes of b. The unit
 * tests also compile this file with -DZY_EMULATE_AVXVNNI on plain AVX2 (the Makefile's avxvnni_emulated level, not
 * in the kernel table), the instruction done exactly in AVX2 (bytes widened to 16 bits, pairs multiplied and summed
 * into 32, pairs of those summed), so that the VNNI kernels' arithmetic is checked on a CPU without VNNI. */
#if defined(ZY_EMULATE_AVXVNNI)
#define ZY_AVXVNNI 1
INLINE __m256i dpbusd256(__m256i acc, __m256i a, __m256i b) {
    const __m256i zero = _mm256_setzero_si256();
    const __m256i a_lo = _mm256_unpacklo_epi8(a, zero), a_hi = _mm256_unpackhi_epi8(a, zero);
    const __m256i b_lo = _mm256_srai_epi16(_mm256_unpacklo_epi8(b, b), 8), b_hi = _mm256_srai_epi16(_mm256_unpackhi_epi8(b, b), 8);
    /* per 128-bit lane: bytes 0-7 and 8-15 as pairs' sums; hadd pairs them again, in dword order */
    return _mm256_add_epi32(acc, _mm256_hadd_epi32(_mm256_madd_epi16(a_lo, b_lo), _mm256_madd_epi16(a_hi, b_hi)));
}
#elif defined(__AVXVNNI__) && !(defined(__AVX512VNNI__) && defined(__AVX512VL__)) /* else the AVX-512 form serves */
#define ZY_AVXVNNI 1
INLINE __m256i dpbusd256(__m256i acc, __m256i a, __m256i b) { return _mm256_dpbusd_avx_epi32(acc, a, b); }
#endif

/* 32 codes: 8-bit as stored, 4-bit as [low nibbles | high nibbles] */
INLINE __m256i load_codes(const uint8_t *p, const int bits) {
    if (bits == 8) return _mm256_loadu_si256((const __m256i *)(const void *)p);
    const __m128i b = _mm_loadu_si128((const __m128i *)(const void *)p);
    const __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(b), _mm_srli_epi16(b, 4), 1);
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0f));
}

INLINE float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* acc + Σ over 4 adjacent pairs of (code, int8 value), 8 int32 lanes; without VNNI, 8-bit codes as (code - 128) */
INLINE __m256i dot_acc(__m256i acc, __m256i c, __m256i x, const int bits) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    (void)bits;
    return _mm256_dpbusd_epi32(acc, c, x);
#elif defined(ZY_AVXVNNI)
    (void)bits;
    return dpbusd256(acc, c, x);
#else
    const __m256i ones = _mm256_set1_epi16(1);
    if (bits == 4) return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(c, x), ones)); /* 2·15·127 */
    /* 2·255·127 does not fit int16: (code - 128) in [-128, 127], its magnitude (<= 128, as unsigned) against x with
     * the code's sign: pairs of at most 2·128·127 */
    const __m256i cs = _mm256_xor_si256(c, _mm256_set1_epi8((char)0x80));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(cs), _mm256_sign_epi8(x, cs)), ones));
#endif
}
#if defined(__AVX512VNNI__) || defined(ZY_AVXVNNI)
#define CENTERED8 0
#else
#define CENTERED8 1
#endif

/* each row's sum over group g's blocks of the block's integer dot product times its d */
INLINE void int8_group(const int nr, const int bits, const ZyQuantActs *a, const uint8_t *q, int g, int bpg, __m256 *gs) {
    for (int r = 0; r < nr; r++) gs[r] = _mm256_setzero_ps();
    for (int j = 0; j < bpg; j++) {
        const int b = g * bpg + j;
        const __m256i c = load_codes(q + (long)b * 4 * bits, bits);
        /* 4-bit: block b's even columns, then 16 (32 in a pair of blocks) bytes on, its odd ones (quant.h) */
        const int paired = bits == 4 && (b | 1) < a->nb;
        const long lo = paired ? 32L * (b & ~1) + 16 * (b & 1) : 32L * b, hi = paired ? 32 : 16;
        for (int r = 0; r < nr; r++) {
            const int8_t *xr = a->xq + (long)r * a->in + lo;
            const __m256i x = _mm256_loadu2_m128i((const __m128i *)(const void *)(xr + hi), (const __m128i *)(const void *)xr);
            const __m256 p = _mm256_cvtepi32_ps(dot_acc(_mm256_setzero_si256(), c, x, bits));
            gs[r] = _mm256_fmadd_ps(p, _mm256_broadcast_ss(a->d + r * a->nb + b), gs[r]);
        }
    }
}

/* the fp32 vectors the int8 way sums in */
typedef __m256 Vf;
INLINE Vf vf_zero(void) { return _mm256_setzero_ps(); }
INLINE Vf vf_fma(Vf a, Vf b, Vf c) { return _mm256_fmadd_ps(a, b, c); }
INLINE Vf vf_bcast(const float *p) { return _mm256_broadcast_ss(p); }
INLINE float vf_sum2(Vf a, Vf b) { return hsum8(_mm256_add_ps(a, b)); }

#if defined(__AVX512F__)
/* the fp32 way on 512 bits: 16 codes widened at a time, scaled by s, one multiply-add per row */
INLINE void widen_rows(const int nr, const int bits, const ZyQuantActs *a, const ZyQuantMatrix *W, long o0, long o1,
                       float *Y, int ldy, float *work) {
    const int ng = a->ng, bpg = W->group_size / 32, rowbytes = W->cols / 8 * bits;
    const int NA = nr == 1 ? 2 : 1; /* independent sums per row */
    for (long o = o0; o < o1; o++) {
        float tail[ZY_QUANT_ROW_BLOCK];
        output_groups(nr, a, W, o, work, tail);
        const uint8_t *q = (const uint8_t *)W->q + o * rowbytes;
        __m512 acc[2][ZY_QUANT_ROW_BLOCK];
        for (int r = 0; r < nr; r++) acc[0][r] = acc[1][r] = _mm512_setzero_ps();
        for (int g = 0; g < ng; g++) {
            const __m512 s = _mm512_set1_ps(work[g]);
            for (int j = 0; j < bpg; j++) {
                const int b = g * bpg + j;
                __m128i lo, hi;
                if (bits == 8) {
                    lo = _mm_loadu_si128((const __m128i *)(const void *)(q + 32L * b));
                    hi = _mm_loadu_si128((const __m128i *)(const void *)(q + 32L * b + 16));
                } else {
                    const __m128i v = _mm_loadu_si128((const __m128i *)(const void *)(q + 16L * b)), m = _mm_set1_epi8(0x0f);
                    lo = _mm_and_si128(v, m), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m);
                }
                const __m512 w0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(lo)), s);
                const __m512 w1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(hi)), s);
                for (int r = 0; r < nr; r++) {
                    const float *x = a->X + (long)r * a->ldx + 32 * b;
                    acc[0][r] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x), acc[0][r]);
                    acc[NA - 1][r] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + 16), acc[NA - 1][r]);
                }
            }
        }
        for (int r = 0; r < nr; r++)
            Y[(long)r * ldy + o] = _mm512_reduce_add_ps(NA == 2 ? _mm512_add_ps(acc[0][r], acc[1][r]) : acc[0][r]) + tail[r];
    }
}
#else
/* the fp32 way on 256 bits: 8 codes widened at a time, scaled by s, one multiply-add per row */
INLINE void widen_rows(const int nr, const int bits, const ZyQuantActs *a, const ZyQuantMatrix *W, long o0, long o1,
                       float *Y, int ldy, float *work) {
    const int ng = a->ng, bpg = W->group_size / 32, rowbytes = W->cols / 8 * bits;
    const int NA = nr == 1 ? 4 : nr == 2 ? 2 : 1; /* independent sums per row */
    for (long o = o0; o < o1; o++) {
        float tail[ZY_QUANT_ROW_BLOCK];
        output_groups(nr, a, W, o, work, tail);
        const uint8_t *q = (const uint8_t *)W->q + o * rowbytes;
        __m256 acc[4][ZY_QUANT_ROW_BLOCK];
        for (int i = 0; i < NA; i++)
            for (int r = 0; r < nr; r++) acc[i][r] = _mm256_setzero_ps();
        for (int g = 0; g < ng; g++) {
            const __m256 s = _mm256_broadcast_ss(work + g);
            for (int j = 0; j < bpg; j++) {
                const int b = g * bpg + j;
                const __m256i c = load_codes(q + (long)b * 4 * bits, bits);
                const __m128i lo = _mm256_castsi256_si128(c), hi = _mm256_extracti128_si256(c, 1);
                const __m256 w[4] = {_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)), s),
                                     _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8))), s),
                                     _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)), s),
                                     _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8))), s)};
                for (int r = 0; r < nr; r++) {
                    const float *x = a->X + (long)r * a->ldx + 32 * b;
                    for (int i = 0; i < 4; i++)
                        acc[i % NA][r] = _mm256_fmadd_ps(w[i], _mm256_loadu_ps(x + 8 * i), acc[i % NA][r]);
                }
            }
        }
        for (int r = 0; r < nr; r++) {
            __m256 t = acc[0][r];
            for (int i = 1; i < NA; i++) t = _mm256_add_ps(t, acc[i][r]);
            Y[(long)r * ldy + o] = hsum8(t) + tail[r];
        }
    }
}
#endif

#else
/* ---- 128 bits (generic: x86-64-v2 has SSSE3 and SSE4.1, no FMA) ---- */

INLINE float hsum4(__m128 s) {
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* codes 0-15 and 16-31 of a block (4-bit: the low nibbles, then the high ones) */
INLINE void load_codes2(const uint8_t *p, const int bits, __m128i *c0, __m128i *c1) {
    if (bits == 8) {
        *c0 = _mm_loadu_si128((const __m128i *)(const void *)p);
        *c1 = _mm_loadu_si128((const __m128i *)(const void *)(p + 16));
        return;
    }
    const __m128i v = _mm_loadu_si128((const __m128i *)(const void *)p), m = _mm_set1_epi8(0x0f);
    *c0 = _mm_and_si128(v, m), *c1 = _mm_and_si128(_mm_srli_epi16(v, 4), m);
}

INLINE __m128i dot16_acc(__m128i acc, __m128i c, __m128i x, const int bits) {
    const __m128i ones = _mm_set1_epi16(1);
    if (bits == 4) return _mm_add_epi32(acc, _mm_madd_epi16(_mm_maddubs_epi16(c, x), ones));
    const __m128i cs = _mm_xor_si128(c, _mm_set1_epi8((char)0x80));
    return _mm_add_epi32(acc, _mm_madd_epi16(_mm_maddubs_epi16(_mm_abs_epi8(cs), _mm_sign_epi8(x, cs)), ones));
}
#define CENTERED8 1

INLINE void int8_group(const int nr, const int bits, const ZyQuantActs *a, const uint8_t *q, int g, int bpg, __m128 *gs) {
    for (int r = 0; r < nr; r++) gs[r] = _mm_setzero_ps();
    for (int j = 0; j < bpg; j++) {
        const int b = g * bpg + j;
        __m128i c0, c1;
        load_codes2(q + (long)b * 4 * bits, bits, &c0, &c1);
        /* 4-bit: block b's even columns, then 16 (32 in a pair of blocks) bytes on, its odd ones (quant.h) */
        const int paired = bits == 4 && (b | 1) < a->nb;
        const long lo = paired ? 32L * (b & ~1) + 16 * (b & 1) : 32L * b, hi = paired ? 32 : 16;
        for (int r = 0; r < nr; r++) {
            const int8_t *x = a->xq + (long)r * a->in + lo;
            __m128i p = dot16_acc(_mm_setzero_si128(), c0, _mm_loadu_si128((const __m128i *)(const void *)x), bits);
            p = dot16_acc(p, c1, _mm_loadu_si128((const __m128i *)(const void *)(x + hi)), bits);
            gs[r] = _mm_add_ps(gs[r], _mm_mul_ps(_mm_cvtepi32_ps(p), _mm_set1_ps(a->d[r * a->nb + b])));
        }
    }
}

typedef __m128 Vf;
INLINE Vf vf_zero(void) { return _mm_setzero_ps(); }
INLINE Vf vf_fma(Vf a, Vf b, Vf c) { return _mm_add_ps(_mm_mul_ps(a, b), c); }
INLINE Vf vf_bcast(const float *p) { return _mm_set1_ps(*p); }
INLINE float vf_sum2(Vf a, Vf b) { return hsum4(_mm_add_ps(a, b)); }

INLINE void widen_rows(const int nr, const int bits, const ZyQuantActs *a, const ZyQuantMatrix *W, long o0, long o1,
                       float *Y, int ldy, float *work) {
    const int ng = a->ng, bpg = W->group_size / 32, rowbytes = W->cols / 8 * bits;
    for (long o = o0; o < o1; o++) {
        float tail[ZY_QUANT_ROW_BLOCK];
        output_groups(nr, a, W, o, work, tail);
        const uint8_t *q = (const uint8_t *)W->q + o * rowbytes;
        __m128 acc[2][ZY_QUANT_ROW_BLOCK];
        for (int r = 0; r < nr; r++) acc[0][r] = acc[1][r] = _mm_setzero_ps();
        for (int g = 0; g < ng; g++) {
            const __m128 s = _mm_set1_ps(work[g]);
            for (int j = 0; j < bpg; j++) {
                const int b = g * bpg + j;
                __m128i c[2];
                load_codes2(q + (long)b * 4 * bits, bits, &c[0], &c[1]);
                for (int i = 0; i < 8; i++) {
                    const __m128i part = c[i / 4];
                    __m128i sh = part;
                    switch (i % 4) { /* byte shifts take constants */
                    case 1: sh = _mm_srli_si128(part, 4); break;
                    case 2: sh = _mm_srli_si128(part, 8); break;
                    case 3: sh = _mm_srli_si128(part, 12); break;
                    default: break;
                    }
                    const __m128 w = _mm_mul_ps(_mm_cvtepi32_ps(_mm_cvtepu8_epi32(sh)), s);
                    for (int r = 0; r < nr; r++)
                        acc[i & 1][r] = _mm_add_ps(acc[i & 1][r], _mm_mul_ps(w, _mm_loadu_ps(a->X + (long)r * a->ldx + 32 * b + 4 * i)));
                }
            }
        }
        for (int r = 0; r < nr; r++) Y[(long)r * ldy + o] = hsum4(_mm_add_ps(acc[0][r], acc[1][r])) + tail[r];
    }
}
#endif

/* The int8 way at any width (int8_group, Vf: the width's own): per output, its groups two at a time in two chains,
 * each group's sum of d-scaled block products multiplied by the group's s once. */
INLINE void int8_any_rows(const int nr, const int bits, const ZyQuantActs *a, const ZyQuantMatrix *W, long o0, long o1,
                      float *Y, int ldy, float *work) {
    const int ng = a->ng, bpg = a->nb / ng, rowbytes = W->cols / 8 * bits;
    for (long o = o0; o < o1; o++) {
        float tail[ZY_QUANT_ROW_BLOCK];
        output_groups(nr, a, W, o, work, tail);
        const uint8_t *q = (const uint8_t *)W->q + o * rowbytes;
        prefetch_codes_ahead(q, rowbytes);
        Vf acc0[ZY_QUANT_ROW_BLOCK], acc1[ZY_QUANT_ROW_BLOCK], g0[ZY_QUANT_ROW_BLOCK], g1[ZY_QUANT_ROW_BLOCK];
        for (int r = 0; r < nr; r++) acc0[r] = acc1[r] = vf_zero();
        int g = 0;
        for (; g + 2 <= ng; g += 2) {
            int8_group(nr, bits, a, q, g, bpg, g0);
            int8_group(nr, bits, a, q, g + 1, bpg, g1);
            const Vf s0 = vf_bcast(work + g), s1 = vf_bcast(work + g + 1);
            for (int r = 0; r < nr; r++) acc0[r] = vf_fma(g0[r], s0, acc0[r]), acc1[r] = vf_fma(g1[r], s1, acc1[r]);
        }
        if (g < ng) {
            int8_group(nr, bits, a, q, g, bpg, g0);
            for (int r = 0; r < nr; r++) acc0[r] = vf_fma(g0[r], vf_bcast(work + g), acc0[r]);
        }
        for (int r = 0; r < nr; r++) Y[(long)r * ldy + o] = vf_sum2(acc0[r], acc1[r]) + tail[r];
    }
}

#if defined(__AVX2__)
/* scales or biases widened to fp32, 8 at a time where they are bf16 (the common case: a bf16 release's) */
INLINE void widen_stored_fast(ZyDtype dt, const void *src, size_t at, int n, float *out) {
    if (dt != ZY_DT_BF16) {
        widen_stored(dt, src, at, n, out);
        return;
    }
    const uint16_t *h = (const uint16_t *)src + at;
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m128i v = _mm_loadu_si128((const __m128i *)(const void *)(h + i));
        _mm256_storeu_si256((__m256i *)(void *)(out + i), _mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
    }
    for (; i < n; i++) {
        const uint32_t u = (uint32_t)h[i] << 16;
        memcpy(out + i, &u, sizeof u);
    }
}

/* One row of activations (decoding), the group's block count a constant. Each output's arithmetic is
 * int8_any_rows's, operation for operation (same sums in the same order): only the loop around it differs. */
INLINE void int8_one_row(const int bits, const int bpg, const ZyQuantActs *a, const ZyQuantMatrix *W, long o0, long o1,
                         float *Y, float *work) {
    const int ng = a->ng, rowbytes = W->cols / 8 * bits;
    for (long o = o0; o < o1; o++) {
        widen_stored_fast(W->scale_dtype, W->scales, (size_t)o * ng, ng, work);
        widen_stored_fast(W->scale_dtype, W->biases, (size_t)o * ng, ng, work + ng);
        const float tail = dot2(work, a->corr, work + ng, a->xsum, ng);
        const uint8_t *q = (const uint8_t *)W->q + o * rowbytes;
        prefetch_codes_ahead(q, rowbytes);
        __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
        int g = 0;
        for (; g + 2 <= ng; g += 2) {
            __m256 t[2];
            for (int h = 0; h < 2; h++) {
                t[h] = _mm256_setzero_ps();
                for (int j = 0; j < bpg; j++) {
                    const int b = (g + h) * bpg + j;
                    const __m256i x = _mm256_loadu_si256((const __m256i *)(const void *)(a->xq + 32L * b));
                    const __m256i p = dot_acc(_mm256_setzero_si256(), load_codes(q + (long)b * 4 * bits, bits), x, bits);
                    t[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_broadcast_ss(a->d + b), t[h]);
                }
            }
            acc0 = _mm256_fmadd_ps(t[0], _mm256_broadcast_ss(work + g), acc0);
            acc1 = _mm256_fmadd_ps(t[1], _mm256_broadcast_ss(work + g + 1), acc1);
        }
        if (g < ng) {
            __m256 t0 = _mm256_setzero_ps();
            for (int j = 0; j < bpg; j++) {
                const int b = g * bpg + j;
                const __m256i x = _mm256_loadu_si256((const __m256i *)(const void *)(a->xq + 32L * b));
                const __m256i p = dot_acc(_mm256_setzero_si256(), load_codes(q + (long)b * 4 * bits, bits), x, bits);
                t0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_broadcast_ss(a->d + b), t0);
            }
            acc0 = _mm256_fmadd_ps(t0, _mm256_broadcast_ss(work + g), acc0);
        }
        Y[o] = hsum8(_mm256_add_ps(acc0, acc1)) + tail;
    }
}
#define ZY_ONE_ROW_FAST 1

/* A pair of 4-bit blocks (2p, 2p+1): their 32 bytes of codes, split into low and high nibbles, against the pair's
 * int8 activations (quant.h's order: x the even columns of both blocks, x + 32 the odd ones); int32 lanes 0-3 hold
 * block 2p's sums, lanes 4-7 block 2p+1's. One load and one pair of products for two blocks: the one-block way
 * (load_codes + dot_acc) spends nearly as many instructions on each block, and at 4 bits those instructions, not
 * the memory, bound a product on two cores. */
INLINE __m256i dot_pair4(const uint8_t *q, const int8_t *x) {
    const __m256i c = _mm256_loadu_si256((const __m256i *)(const void *)q), m = _mm256_set1_epi8(0x0f);
    const __m256i lo = _mm256_and_si256(c, m), hi = _mm256_and_si256(_mm256_srli_epi16(c, 4), m);
    const __m256i xlo = _mm256_loadu_si256((const __m256i *)(const void *)x);
    const __m256i xhi = _mm256_loadu_si256((const __m256i *)(const void *)(x + 32));
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), lo, xlo), hi, xhi);
#elif defined(ZY_AVXVNNI)
    return dpbusd256(dpbusd256(_mm256_setzero_si256(), lo, xlo), hi, xhi);
#else /* pairs of at most 2·15·127, two of them summed: within int16 */
    const __m256i s = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xlo), _mm256_maddubs_epi16(hi, xhi));
    return _mm256_madd_epi16(s, _mm256_set1_epi16(1));
#endif
}

/* The int8 way for 4-bit codes, nr rows, bpg blocks a group (both constants): blocks taken in pairs (dot_pair4), each
 * pair's lanes times their blocks' d (a->d8); a group's sum times its s. Groups of 64 or 128 are whole pairs; groups
 * of 32 pair up, so a pair's lanes take two groups' s, and an odd last group is one block on its own. Every row count
 * runs this same arithmetic: a row's result does not depend on the rows beside it. */
INLINE void int8_q4_rows(const int nr, const int bpg, const ZyQuantActs *a, const ZyQuantMatrix *W, long o0, long o1,
                         float *Y, int ldy, float *work) {
    const int ng = a->ng, nb = a->nb, rowbytes = W->cols / 2;
    for (long o = o0; o < o1; o++) {
        widen_stored_fast(W->scale_dtype, W->scales, (size_t)o * ng, ng, work);
        widen_stored_fast(W->scale_dtype, W->biases, (size_t)o * ng, ng, work + ng);
        float tail[ZY_QUANT_ROW_BLOCK];
        for (int r = 0; r < nr; r++) tail[r] = dot2(work, a->corr + r * ng, work + ng, a->xsum + r * ng, ng);
        const uint8_t *q = (const uint8_t *)W->q + o * rowbytes;
        prefetch_codes_ahead(q, rowbytes);
        __m256 acc0[ZY_QUANT_ROW_BLOCK], acc1[ZY_QUANT_ROW_BLOCK];
        for (int r = 0; r < nr; r++) acc0[r] = acc1[r] = _mm256_setzero_ps();
        int g = 0;
        if (bpg >= 2) { /* two groups at a time, in two chains */
            for (; g + 2 <= ng; g += 2) {
                __m256 t[2][ZY_QUANT_ROW_BLOCK];
                for (int h = 0; h < 2; h++) {
                    for (int r = 0; r < nr; r++) t[h][r] = _mm256_setzero_ps();
                    for (int j = 0; j < bpg / 2; j++) {
                        const long p = (long)(g + h) * (bpg / 2) + j;
                        for (int r = 0; r < nr; r++) {
                            const __m256i d = dot_pair4(q + 32 * p, a->xq + (long)r * a->in + 64 * p);
                            t[h][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), _mm256_loadu_ps(a->d8 + (long)r * 4 * nb + 8 * p),
                                                      t[h][r]);
                        }
                    }
                }
                const __m256 s0 = _mm256_broadcast_ss(work + g), s1 = _mm256_broadcast_ss(work + g + 1);
                for (int r = 0; r < nr; r++)
                    acc0[r] = _mm256_fmadd_ps(t[0][r], s0, acc0[r]), acc1[r] = _mm256_fmadd_ps(t[1][r], s1, acc1[r]);
            }
            if (g < ng) {
                for (int r = 0; r < nr; r++) {
                    __m256 t = _mm256_setzero_ps();
                    for (int j = 0; j < bpg / 2; j++) {
                        const long p = (long)g * (bpg / 2) + j;
                        const __m256i d = dot_pair4(q + 32 * p, a->xq + (long)r * a->in + 64 * p);
                        t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), _mm256_loadu_ps(a->d8 + (long)r * 4 * nb + 8 * p), t);
                    }
                    acc0[r] = _mm256_fmadd_ps(t, _mm256_broadcast_ss(work + g), acc0[r]);
                }
            }
        } else { /* groups of 32: pair p is groups 2p and 2p+1 */
            for (; g + 2 <= ng; g += 2) {
                const long p = g / 2;
                const __m256 s = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_broadcast_ss(work + g)),
                                                      _mm_broadcast_ss(work + g + 1), 1);
                for (int r = 0; r < nr; r++) {
                    const __m256i d = dot_pair4(q + 32 * p, a->xq + (long)r * a->in + 64 * p);
                    const __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(d), _mm256_loadu_ps(a->d8 + (long)r * 4 * nb + 8 * p));
                    acc0[r] = _mm256_fmadd_ps(t, s, acc0[r]);
                }
            }
            if (g < ng) /* the unpaired last block: even columns then odd ones, as load_codes gives the codes */
                for (int r = 0; r < nr; r++) {
                    const __m256i x = _mm256_loadu_si256((const __m256i *)(const void *)(a->xq + (long)r * a->in + 32L * g));
                    const __m256i d = dot_acc(_mm256_setzero_si256(), load_codes(q + 16L * g, 4), x, 4);
                    const __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(d), _mm256_broadcast_ss(a->d + r * nb + g));
                    acc1[r] = _mm256_fmadd_ps(t, _mm256_broadcast_ss(work + g), acc1[r]);
                }
        }
        for (int r = 0; r < nr; r++) Y[(long)r * ldy + o] = hsum8(_mm256_add_ps(acc0[r], acc1[r])) + tail[r];
    }
}
#endif

#define ZY_QUANT_DISPATCH(name)                                                                                        \
    static void name(const ZyQuantActs *a, const ZyQuantMatrix *W, long o0, long o1, float *Y, int ldy, float *work) { \
        switch (a->nr * 16 + W->bits) {                                                                                \
        case 1 * 16 + 8: name##_rows(1, 8, a, W, o0, o1, Y, ldy, work); break;                                        \
        case 2 * 16 + 8: name##_rows(2, 8, a, W, o0, o1, Y, ldy, work); break;                                        \
        case 3 * 16 + 8: name##_rows(3, 8, a, W, o0, o1, Y, ldy, work); break;                                        \
        case 4 * 16 + 8: name##_rows(4, 8, a, W, o0, o1, Y, ldy, work); break;                                        \
        case 1 * 16 + 4: name##_rows(1, 4, a, W, o0, o1, Y, ldy, work); break;                                        \
        case 2 * 16 + 4: name##_rows(2, 4, a, W, o0, o1, Y, ldy, work); break;                                        \
        case 3 * 16 + 4: name##_rows(3, 4, a, W, o0, o1, Y, ldy, work); break;                                        \
        default: name##_rows(4, 4, a, W, o0, o1, Y, ldy, work); break;                                                 \
        }                                                                                                              \
    }
ZY_QUANT_DISPATCH(int8_any)
ZY_QUANT_DISPATCH(widen)

/* int8: 4-bit codes by pairs of blocks (int8_q4_rows) at the 256-bit levels; 8-bit one row (decoding) by
 * int8_one_row where the group's block count is one it is compiled for */
static void int8(const ZyQuantActs *a, const ZyQuantMatrix *W, long o0, long o1, float *Y, int ldy, float *work) {
#ifdef ZY_ONE_ROW_FAST
    const int bpg = W->group_size / 32;
    if (W->bits == 4) {
#define ZY_Q4_CASE(nr)                                                                                                 \
    case nr * 8 + 1: int8_q4_rows(nr, 1, a, W, o0, o1, Y, ldy, work); return;                                         \
    case nr * 8 + 2: int8_q4_rows(nr, 2, a, W, o0, o1, Y, ldy, work); return;                                         \
    case nr * 8 + 4: int8_q4_rows(nr, 4, a, W, o0, o1, Y, ldy, work); return;
        switch (a->nr * 8 + bpg) {
            ZY_Q4_CASE(1)
            ZY_Q4_CASE(2)
            ZY_Q4_CASE(3)
            ZY_Q4_CASE(4)
        default: break;
        }
#undef ZY_Q4_CASE
    }
    if (a->nr == 1) {
        switch (bpg) {
        case 1: int8_one_row(8, 1, a, W, o0, o1, Y, work); return;
        case 2: int8_one_row(8, 2, a, W, o0, o1, Y, work); return;
        case 4: int8_one_row(8, 4, a, W, o0, o1, Y, work); return;
        default: break;
        }
    }
#endif
    int8_any(a, W, o0, o1, Y, ldy, work);
}

const ZyQuantTable ZY_ISA_NAME(zy_quant_table) = {
    .name = ZY_STR(ZY_ISA), .widen = widen, .int8 = int8, .centered8 = CENTERED8};

#else
/* Not x86 (or a baseline without SSSE3): no table; quant_matmul.c runs the plain kernels for this level. */
const ZyQuantTable ZY_ISA_NAME(zy_quant_table) = {.name = NULL};
#endif
