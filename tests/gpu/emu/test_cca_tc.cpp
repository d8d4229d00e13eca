/* src/gpu/gpu_cca_tc.cu run on the CPU (cuda_emu.h): the CCA grouped convolution's products on tensor cores
 * against a double-precision reference on the bf16-rounded operands: the forward Y (bias added, only rows t < T of each
 * sequence written) and the backward dM (every row, the taps reading dY rows shifted back, zero before a sequence and
 * past its T rows), for every tap count 1-4, several groups, a head size past one 128-channel tile, row tiles that
 * cross sequences (every output element checked: one left unwritten is the poison, far off); a rerun bit-identical,
 * and the shapes it refuses (head size not a multiple of 16, 5 taps, channels not whole groups) launching nothing. Prints "gpu-emu: N passed, N failed". */
#define ZAYA_GPU_EMU 1
#include "gpu_cca_tc.cu"
#include "emu_check.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "util/util.h"

static double r16(float x) { return zy_bf16_to_f32(zy_f32_to_bf16(x)); }

static const float POISON = 12345.0f;

static void run_case(int B, int T, int groups, int dh, int K1) {
    const int C = groups * dh, TM = T + K1 - 1;
    const long R = (long)B * TM;
    std::vector<float> M((size_t)R * C), dY((size_t)B * T * C), w1((size_t)C * dh * K1), b1(C);
    for (auto &v : M) v = urand();
    for (auto &v : dY) v = urand();
    for (auto &v : w1) v = 0.2f * urand();
    for (auto &v : b1) v = urand();
    std::vector<float> Y((size_t)B * T * C, POISON), dM((size_t)R * C, POISON);
    const int rf = gk_cca_conv_gemm_tc(nullptr, 0, Y.data(), M.data(), w1.data(), b1.data(), B, T, C, dh, K1);
    const int rb = gk_cca_conv_gemm_tc(nullptr, 1, dM.data(), dY.data(), w1.data(), nullptr, B, T, C, dh, K1);
    double worst_y = 0, worst_m = 0;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int g = 0; g < groups; g++)
                for (int n = 0; n < dh; n++) {
                    double s = 0, mag = 0;
                    for (int j = 0; j < K1; j++)
                        for (int d = 0; d < dh; d++) {
                            const double p = r16(M[((size_t)b * TM + t + j) * C + g * dh + d]) *
                                             r16(w1[(((size_t)g * dh + n) * dh + d) * K1 + j]);
                            s += p, mag += std::fabs(p);
                        }
                    const double got = Y[((size_t)b * T + t) * C + g * dh + n];
                    worst_y = std::fmax(worst_y, std::fabs(got - b1[g * dh + n] - s) / (mag + 1e-30));
                }
    for (long e = 0; e < R; e++)
        for (int g = 0; g < groups; g++)
            for (int i = 0; i < dh; i++) {
                double s = 0, mag = 0;
                for (int j = 0; j < K1; j++) {
                    const long es = e - j; /* dE row */
                    if (es < 0) continue;
                    const long b = es / TM, t = es - b * TM;
                    if (t >= T) continue;
                    for (int o = 0; o < dh; o++) {
                        const double p = r16(dY[((size_t)b * T + t) * C + g * dh + o]) *
                                         r16(w1[(((size_t)g * dh + o) * dh + i) * K1 + j]);
                        s += p, mag += std::fabs(p);
                    }
                }
                const double got = dM[(size_t)e * C + g * dh + i];
                worst_m = std::fmax(worst_m, std::fabs(got - s) / (mag + 1e-30));
            }
    /* a rerun: the same bits */
    std::vector<float> Y2((size_t)B * T * C, POISON), dM2((size_t)R * C, POISON);
    gk_cca_conv_gemm_tc(nullptr, 0, Y2.data(), M.data(), w1.data(), b1.data(), B, T, C, dh, K1);
    gk_cca_conv_gemm_tc(nullptr, 1, dM2.data(), dY.data(), w1.data(), nullptr, B, T, C, dh, K1);
    const bool same = std::memcmp(Y.data(), Y2.data(), Y.size() * 4) == 0 &&
                      std::memcmp(dM.data(), dM2.data(), dM.size() * 4) == 0;
    char what[240];
    std::snprintf(what, sizeof what, "B %d T %d, %d groups of %d, %d taps: Y worst err %.1e, dM worst err %.1e of "
                  "sum |a b| (tol 1e-6), a rerun bit-identical", B, T, groups, dh, K1, worst_y, worst_m);
    report(rf == 0 && rb == 0 && worst_y < 1e-6 && worst_m < 1e-6 && same, what);
}

static void refusals() {
    std::vector<float> buf(4096, POISON), w(4096, 0.5f);
    const int odd_dh = gk_cca_conv_gemm_tc(nullptr, 0, buf.data(), w.data(), w.data(), w.data(), 1, 8, 24, 24, 2);
    const int five = gk_cca_conv_gemm_tc(nullptr, 0, buf.data(), w.data(), w.data(), w.data(), 1, 8, 32, 16, 5);
    const int groups = gk_cca_conv_gemm_tc(nullptr, 1, buf.data(), w.data(), w.data(), nullptr, 1, 8, 40, 16, 2);
    bool untouched = true;
    for (float v : buf) untouched = untouched && v == POISON;
    report(odd_dh == -1 && five == -1 && groups == -1 && untouched,
           "refused: head size 24, 5 taps, channels not whole groups; nothing written");
}

int main(int argc, char **argv) {
    emu_rng() = 0x6a09e667f3bcc909ull;
    const bool quick = argc > 1 && !std::strcmp(argv[1], "--quick");
    run_case(2, 37, 2, 16, 2); /* ZAYA's two taps; the sequences' rows in one tile */
    run_case(3, 50, 1, 32, 1);
    run_case(1, 20, 3, 16, 3);
    if (!quick) {
        run_case(2, 70, 2, 16, 4);  /* 4 taps; a row tile crossing sequences */
        run_case(1, 9, 1, 144, 2);  /* a head past one 128-channel tile */
    }
    refusals();
    std::printf("gpu-emu: %d passed, %d failed\n", emu_passed(), emu_failed());
    return emu_failed() ? 1 : 0;
}
