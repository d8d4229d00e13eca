/* The fp32 bit patterns every f32 → bf16 rounding check starts with (nearest even, as zy_f32_to_bf16): the GPU's
 * (test_gpu_optim.c) and the CPU emulator's (emu/test_optim.cpp) alike. C and C++. */
#ifndef ZAYA_TESTS_BF16_SPECIALS_H
#define ZAYA_TESTS_BF16_SPECIALS_H

#include <stdint.h>

static const uint32_t bf16_specials[] = {
    0x00000000u, 0x80000000u,              /* ±0 */
    0x7f800000u, 0xff800000u,              /* ±inf */
    0x7fc00000u, 0xffc00000u,              /* quiet NaNs */
    0x7f800001u, 0xff800001u, 0x7fbfffffu, /* signalling NaNs: made quiet, top bits kept */
    0x7fffffffu, 0xffffffffu,              /* NaN, all ones */
    0x3f808000u, 0x3f818000u,              /* exactly halfway: even below (stays), odd below (rounds up) */
    0xbf808000u, 0xbf818000u,              /* the same, negative */
    0x3f807fffu, 0x3f808001u,              /* just below / above halfway */
    0x7f7fffffu, 0x7f7f8000u, 0x7f7f7fffu, /* FLT_MAX rounds to inf; halfway at the top (odd: inf); below */
    0xff7fffffu,                           /* −FLT_MAX → −inf */
    0x00000001u, 0x00008000u, 0x00018000u, 0x807fffffu, /* subnormals, halfway ones */
    0x00800000u, 0x3f800000u, 0xc0490fdbu, /* FLT_MIN, 1, −π */
};
static const size_t n_bf16_specials = sizeof bf16_specials / sizeof bf16_specials[0];

#endif
