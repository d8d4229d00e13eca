/* What the emulator tests share: their random inputs (a xorshift, uniform in [-1, 1); a test may seed it through
 * emu_rng()) and the "ok" / "FAIL" lines with their counts, which each test closes with "gpu-emu: N passed, N failed"
 * (run.sh sums them). */
#ifndef ZAYA_EMU_CHECK_H
#define ZAYA_EMU_CHECK_H

#include <cstdint>
#include <cstdio>

inline uint64_t &emu_rng() {
    static uint64_t s = 0x243f6a8885a308d3ull;
    return s;
}
inline float urand() { /* [-1, 1) */
    uint64_t &s = emu_rng();
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    return (float)((s >> 40) * (1.0 / (1ull << 23))) - 1.0f;
}

inline int &emu_passed() {
    static int n = 0;
    return n;
}
inline int &emu_failed() {
    static int n = 0;
    return n;
}
inline void report(bool ok, const char *what) {
    (ok ? emu_passed() : emu_failed())++;
    std::printf("%s %s\n", ok ? "ok  " : "FAIL", what);
}

#endif
