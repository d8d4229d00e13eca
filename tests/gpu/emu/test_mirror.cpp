/* src/gpu/gpu_mirror.cu run on the CPU (cuda_emu.h): the mirror that completes Newton–Schulz's banded symmetric
 * products. A batch of matrices whose upper triangles hold random values and whose lower triangles and the gaps
 * between them hold a poison: every entry below the diagonal must come out as its mirror above, bit for bit, and
 * the upper triangles, the diagonals and the gaps must keep their bits; sizes below, at and past a 32 × 32 tile, in
 * fp32 and bf16. Prints "gpu-emu: N passed, N failed". */
#define ZAYA_GPU_EMU 1
#include "gpu_mirror.cu"
#include "emu_check.h"

#include <cstdio>
#include <cstring>
#include <vector>

template <typename T> static T poison();
template <> float poison<float>() { return 12345.0f; }
template <> uint16_t poison<uint16_t>() { return 0xffff; }

template <typename T> static T random_value() {
    const float f = urand();
    if constexpr (sizeof(T) == 4) return f;
    else {
        uint32_t u;
        std::memcpy(&u, &f, 4);
        return (T)(u >> 16);
    }
}

template <typename T> static void run_case(const char *type, int r, int batch) {
    const long stride = (long)r * r + 7; /* a gap after each matrix */
    std::vector<T> m((size_t)(batch * stride), poison<T>());
    for (int z = 0; z < batch; z++)
        for (int i = 0; i < r; i++)
            for (int j = i; j < r; j++) m[(size_t)(z * stride + (long)i * r + j)] = random_value<T>();
    const std::vector<T> before = m;
    if constexpr (sizeof(T) == 4) gk_mirror_upper_f32(nullptr, m.data(), r, stride, batch);
    else gk_mirror_upper_bf16(nullptr, m.data(), r, stride, batch);
    long bad = 0;
    for (int z = 0; z < batch; z++) {
        const size_t base = (size_t)(z * stride);
        for (int i = 0; i < r; i++)
            for (int j = 0; j < r; j++) {
                const T want = i > j ? before[base + (size_t)j * r + i] : before[base + (size_t)i * r + j];
                bad += std::memcmp(&m[base + (size_t)i * r + j], &want, sizeof(T)) != 0;
            }
        for (long g = (long)r * r; g < stride; g++) bad += std::memcmp(&m[base + g], &before[base + g], sizeof(T)) != 0;
    }
    char what[128];
    std::snprintf(what, sizeof what, "mirror %s r %d batch %d: %ld entries wrong", type, r, batch, bad);
    report(bad == 0, what);
}

int main() {
    emu_rng() = 0x6d6972726f72ull;
    for (int r : {1, 2, 31, 32, 33, 70}) {
        run_case<float>("fp32", r, 3);
        run_case<uint16_t>("bf16", r, 2);
    }
    std::printf("gpu-emu: %d passed, %d failed\n", emu_passed(), emu_failed());
    return emu_failed() != 0;
}
