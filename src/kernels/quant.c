/* The quantized format itself: quantizing a row as mlx.core.quantize does (bit for bit: tests/oracle/test_quant_mlx.py),
 * the stored scales' dtypes, dequantizing. The arithmetic is written one rounding per statement so no compiler
 * contracts it into a fused multiply-add (mlx's does not). */
#include "kernels/quant.h"

#include <math.h>
#include <string.h>

int zy_quant_format_check(int bits, int group_size, ZyErr *err) {
    if (bits != 8 && bits != 4)
        return zy_fail(err, "%d-bit quantization is not supported (bits must be 8 or 4)", bits);
    if (group_size != 32 && group_size != 64 && group_size != 128)
        return zy_fail(err, "group size %d is not supported (32, 64 or 128)", group_size);
    return 0;
}

/* mlx's std::max / std::min (a NaN never replaces the running value) */
static inline float max_as_std(float a, float b) { return a < b ? b : a; }
static inline float min_as_std(float a, float b) { return b < a ? b : a; }

void zy_quant_row(const float *w, int cols, int bits, int group_size, uint32_t *q, float *scales, float *biases) {
    const float n_bins = (float)((1 << bits) - 1), eps = 1e-7f;
    const int per_word = 32 / bits;
    for (int g = 0; g < cols / group_size; g++) {
        const float *x = w + (long)g * group_size;
        float w_min = INFINITY, w_max = -INFINITY;
        for (int j = 0; j < group_size; j++) w_max = max_as_std(w_max, x[j]), w_min = min_as_std(w_min, x[j]);
        const int mask = fabsf(w_min) > fabsf(w_max);
        const float range = w_max - w_min;
        float scale = max_as_std(range / n_bins, eps);
        scale = mask ? scale : -scale;
        const float edge = mask ? w_min : w_max;
        const float q0 = rintf(edge / scale);
        float bias = 0;
        if (q0 != 0) {
            scale = edge / q0;
            bias = edge;
        }
        uint32_t *out = q + (long)g * group_size / per_word;
        for (int j = 0; j < group_size / per_word; j++) {
            uint32_t word = 0;
            for (int k = 0; k < per_word; k++) {
                const float shifted = x[j * per_word + k] - bias;
                float v = rintf(shifted / scale);
                v = min_as_std(max_as_std(v, 0.0f), n_bins);
                word |= (uint32_t)v << (k * bits);
            }
            out[j] = word;
        }
        scales[g] = scale;
        biases[g] = bias;
    }
}

uint16_t zy_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    const uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00u | (uint16_t)((a >> 13) & 0x3ffu); /* NaN, quiet */
    if (a >= 0x477ff000u) return sign | 0x7c00u; /* rounds to 65520 or more: infinity */
    if (a < 0x38800000u) { /* below the smallest normal half (2^-14): a subnormal, in units of 2^-24 */
        if (a < 0x33000000u) return sign; /* at most 2^-25: rounds to zero (the tie to even too) */
        const uint32_t mant = (a & 0x7fffffu) | 0x800000u, shift = 126 - (a >> 23); /* value = mant · 2^(e-150) */
        uint32_t h = mant >> shift;
        const uint32_t rest = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rest > half || (rest == half && (h & 1))) h++;
        return sign | (uint16_t)h;
    }
    uint32_t h = ((a >> 13) - ((127 - 15) << 10)); /* exponent rebased, 10 mantissa bits */
    const uint32_t rest = a & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1))) h++; /* a carry into the exponent is right */
    return sign | (uint16_t)h;
}

void zy_quant_store(ZyDtype dtype, float v, void *dst, size_t i) {
    if (dtype == ZY_DT_F32) {
        memcpy((float *)dst + i, &v, sizeof v);
    } else {
        const uint16_t h = dtype == ZY_DT_BF16 ? zy_f32_to_bf16(v) : zy_f32_to_f16(v);
        memcpy((uint16_t *)dst + i, &h, sizeof h);
    }
}

float zy_quant_load(ZyDtype dtype, const void *src, size_t i) {
    if (dtype == ZY_DT_F32) {
        float v;
        memcpy(&v, (const float *)src + i, sizeof v);
        return v;
    }
    uint16_t h;
    memcpy(&h, (const uint16_t *)src + i, sizeof h);
    return dtype == ZY_DT_BF16 ? zy_bf16_to_f32(h) : zy_f16_to_f32(h);
}

ZyQuantMatrix zy_quant_rows(const ZyQuantMatrix *m, long first, long n) {
    ZyQuantMatrix r = *m;
    const size_t esize = zy_dtype_size(m->scale_dtype), groups = (size_t)(m->cols / m->group_size);
    r.rows = n;
    r.q = m->q + first * zy_quant_row_words(m->cols, m->bits);
    r.scales = (const uint8_t *)m->scales + (size_t)first * groups * esize;
    r.biases = (const uint8_t *)m->biases + (size_t)first * groups * esize;
    return r;
}

void zy_quant_dequant_row(const ZyQuantMatrix *m, long o, float *out) {
    const int G = m->group_size, groups = m->cols / G;
    /* the codes as bytes: 8-bit ones in column order, a 4-bit pair per byte with the even column low (quant.h) */
    const uint8_t *bytes = (const uint8_t *)(m->q + o * zy_quant_row_words(m->cols, m->bits));
    for (int g = 0; g < groups; g++) {
        const size_t at = (size_t)o * groups + (size_t)g;
        const float s = zy_quant_load(m->scale_dtype, m->scales, at), b = zy_quant_load(m->scale_dtype, m->biases, at);
        float *y = out + (size_t)g * G;
        if (m->bits == 8) {
            const uint8_t *c = bytes + (size_t)g * G;
            for (int k = 0; k < G; k++) y[k] = s * (float)c[k] + b; /* a product rounded, then a sum: no FMA */
        } else {
            const uint8_t *c = bytes + (size_t)g * G / 2;
            for (int k = 0; k < G / 2; k++) {
                y[2 * k] = s * (float)(c[k] & 15) + b;
                y[2 * k + 1] = s * (float)(c[k] >> 4) + b;
            }
        }
    }
}
