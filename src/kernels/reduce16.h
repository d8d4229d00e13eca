/* Sixteen horizontal sums at once: the lanes of v[0..15] (16 floats each) summed into lane i of the result, by a
 * tree of 15 vector adds (halves folded pairwise) instead of 16 separate reductions of four shuffle-adds each. The
 * tiles of dot products (4 rows x 4 weights) end with exactly sixteen sums. GCC >= 12 / clang: shufflevector. */
#ifndef ZAYA_REDUCE16_H
#define ZAYA_REDUCE16_H

typedef float zy_f32x16 __attribute__((vector_size(64)));

static inline zy_f32x16 zy_reduce16(const zy_f32x16 v[16]) {
    zy_f32x16 a[8], b[4], c[2];
    /* each step halves the lanes per sum: 16 -> 8 (two sums per vector) -> 4 -> 2 -> 1 (sixteen per vector) */
    for (int i = 0; i < 8; i++)
        a[i] = __builtin_shufflevector(v[2 * i], v[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
               __builtin_shufflevector(v[2 * i], v[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30,
                                       31);
    for (int i = 0; i < 4; i++)
        b[i] = __builtin_shufflevector(a[2 * i], a[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
               __builtin_shufflevector(a[2 * i], a[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30,
                                       31);
    for (int i = 0; i < 2; i++)
        c[i] = __builtin_shufflevector(b[2 * i], b[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
               __builtin_shufflevector(b[2 * i], b[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30,
                                       31);
    return __builtin_shufflevector(c[0], c[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
           __builtin_shufflevector(c[0], c[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
}

#endif
