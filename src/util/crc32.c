/* CRC-32 (zlib's: reflected polynomial 0xEDB88320, pre- and post-inverted) at memory speed. zlib's table code runs
 * ~0.6 GB/s on a core, below a disk's bandwidth, so checksumming a checkpoint while it is written would slow the
 * write; folding 64 bytes per step with carry-less multiplies (PCLMULQDQ, Intel's "Fast CRC Computation for
 * Generic Polynomials Using PCLMULQDQ Instruction", the constants of Linux's crc32-pclmul) runs ~10x faster.
 * CPUs without PCLMULQDQ (x86-64-v2 does not imply it) and other architectures take zlib's code. */
#include <string.h>
#include <zlib.h>

#include "util/util.h"

static uint32_t crc32_zlib(uint32_t crc, const uint8_t *p, size_t len) {
    uLong c = crc;
    while (len > 0) { /* zlib takes an unsigned int length */
        uInt chunk = len > (1u << 30) ? (1u << 30) : (uInt)len;
        c = crc32(c, p, chunk);
        p += chunk;
        len -= chunk;
    }
    return (uint32_t)c;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>

#define CRC_TARGET __attribute__((target("pclmul,sse4.1")))

/* One 128-bit fold: x's two halves multiplied by the two constants of k, plus the next 16 bytes. */
CRC_TARGET static inline __m128i fold(__m128i x, __m128i k, __m128i next) {
    const __m128i lo = _mm_clmulepi64_si128(x, k, 0x00), hi = _mm_clmulepi64_si128(x, k, 0x11);
    return _mm_xor_si128(_mm_xor_si128(lo, hi), next);
}

/* The next 16 bytes, also stored at dst when there is one (the copy fused into the checksum's single pass). */
CRC_TARGET static inline __m128i load16(const uint8_t *p, uint8_t *dst) {
    const __m128i x = _mm_loadu_si128((const __m128i *)p);
    if (dst) _mm_storeu_si128((__m128i *)dst, x);
    return x;
}

/* The un-inverted CRC register over len bytes (len >= 64, a multiple of 16), copying them to dst if non-NULL. */
CRC_TARGET static inline __attribute__((always_inline)) uint32_t crc32_fold(uint32_t crc, const uint8_t *p, size_t len,
                                                                            uint8_t *dst) {
    const __m128i k1k2 = _mm_set_epi64x(0x1c6e41596, 0x154442bd4); /* x^(4*128+32), x^(4*128-32) mod P */
    const __m128i k3k4 = _mm_set_epi64x(0x0ccaa009e, 0x1751997d0); /* x^(128+32), x^(128-32) mod P */
    const __m128i k5 = _mm_set_epi64x(0, 0x163cd6124);             /* x^64 mod P */
    const __m128i poly = _mm_set_epi64x(0x1f7011641, 0x1db710641); /* Barrett: floor(x^64 / P), P */
    const __m128i mask32 = _mm_set_epi32(0, 0, 0, -1);
    __m128i x0 = _mm_xor_si128(load16(p, dst), _mm_cvtsi32_si128((int)crc));
    __m128i x1 = load16(p + 16, dst ? dst + 16 : NULL);
    __m128i x2 = load16(p + 32, dst ? dst + 32 : NULL);
    __m128i x3 = load16(p + 48, dst ? dst + 48 : NULL);
    p += 64, len -= 64, dst = dst ? dst + 64 : NULL;
    for (; len >= 64; p += 64, len -= 64, dst = dst ? dst + 64 : NULL) {
        x0 = fold(x0, k1k2, load16(p, dst));
        x1 = fold(x1, k1k2, load16(p + 16, dst ? dst + 16 : NULL));
        x2 = fold(x2, k1k2, load16(p + 32, dst ? dst + 32 : NULL));
        x3 = fold(x3, k1k2, load16(p + 48, dst ? dst + 48 : NULL));
    }
    x0 = fold(fold(fold(x0, k3k4, x1), k3k4, x2), k3k4, x3);
    for (; len >= 16; p += 16, len -= 16, dst = dst ? dst + 16 : NULL) x0 = fold(x0, k3k4, load16(p, dst));
    /* 128 -> 64 bits (appending 32 zero bits), 64 -> 32, then the Barrett reduction */
    x0 = _mm_xor_si128(_mm_srli_si128(x0, 8), _mm_clmulepi64_si128(k3k4, x0, 0x01));
    x0 = _mm_xor_si128(_mm_srli_si128(x0, 4), _mm_clmulepi64_si128(_mm_and_si128(x0, mask32), k5, 0x00));
    __m128i t = _mm_and_si128(_mm_clmulepi64_si128(_mm_and_si128(x0, mask32), poly, 0x10), mask32);
    t = _mm_clmulepi64_si128(t, poly, 0x00);
    return (uint32_t)_mm_extract_epi32(_mm_xor_si128(x0, t), 1);
}

CRC_TARGET static uint32_t crc32_fold_only(uint32_t crc, const uint8_t *p, size_t len) {
    return crc32_fold(crc, p, len, NULL);
}

CRC_TARGET static uint32_t crc32_fold_copy(uint32_t crc, const uint8_t *p, size_t len, uint8_t *dst) {
    return crc32_fold(crc, p, len, dst);
}

static int have_pclmul(void) {
    static int cached = -1; /* a race sets it to the same value twice */
    if (cached < 0) {
        unsigned a, b, c, d;
        cached = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_PCLMUL) && (c & bit_SSE4_1);
    }
    return cached;
}

uint32_t zy_crc32(uint32_t crc, const void *data, size_t len) {
    const uint8_t *p = data;
    if (len < 256 || !have_pclmul()) return crc32_zlib(crc, p, len);
    const size_t body = len & ~(size_t)15;
    crc = ~crc32_fold_only(~crc, p, body);
    return crc32_zlib(crc, p + body, len - body);
}

uint32_t zy_crc32_copy(uint32_t crc, void *dst, const void *src, size_t len) {
    const uint8_t *p = src;
    if (len < 256 || !have_pclmul()) {
        memcpy(dst, src, len);
        return crc32_zlib(crc, p, len);
    }
    const size_t body = len & ~(size_t)15;
    crc = ~crc32_fold_copy(~crc, p, body, dst);
    memcpy((uint8_t *)dst + body, p + body, len - body);
    return crc32_zlib(crc, p + body, len - body);
}
#else
uint32_t zy_crc32(uint32_t crc, const void *data, size_t len) { return crc32_zlib(crc, data, len); }

uint32_t zy_crc32_copy(uint32_t crc, void *dst, const void *src, size_t len) {
    memcpy(dst, src, len);
    return crc32_zlib(crc, src, len);
}
#endif

uint32_t zy_crc32_combine(uint32_t crc1, uint32_t crc2, uint64_t len2) {
    return (uint32_t)crc32_combine(crc1, crc2, (z_off_t)len2); /* z_off_t: 64 bits on LP64 */
}
