/* src/gpu/gpu_norms.cu's RMSNorm run on the CPU (cuda_emu.h) against double-precision sums on the host: the forward
 * (y, rstd), the backward's dx (added to what dx held) and dw through col_sums (the column sums every parameter
 * gradient of a norm uses: a block a few columns, thread rows over the rows in a fixed stride, their partials added in
 * order), at widths taking the 4-wide and 1-wide paths and with enough rows for several strides; and gk_sum. Within
 * 1e-6 (the host sums in another order). Prints "gpu-emu: N passed, N failed". */
#define ZAYA_GPU_EMU 1
#include "gpu_norms.cu"
#include "emu_check.h"

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

static std::vector<float> rnd(size_t n, float scale = 1.0f) {
    std::vector<float> v(n);
    for (float &x : v) x = scale * urand();
    return v;
}
static bool close(double got, double want) { return std::fabs(got - want) <= 1e-6 * (1.0 + std::fabs(want)); }

static void rmsnorm_case(int rows, int dim) {
    const float eps = 1e-5f;
    const std::vector<float> x = rnd((size_t)rows * dim, 2.0f), w = rnd((size_t)dim), dy = rnd((size_t)rows * dim);
    std::vector<float> y((size_t)rows * dim), rstd((size_t)rows);
    gk_rmsnorm_forward(nullptr, y.data(), rstd.data(), x.data(), w.data(), rows, dim, eps);
    long bad = 0;
    for (int r = 0; r < rows; r++) {
        double ss = 0;
        for (int i = 0; i < dim; i++) ss += (double)x[(size_t)r * dim + i] * x[(size_t)r * dim + i];
        const double s = 1.0 / std::sqrt(ss / dim + eps);
        bad += !close(rstd[(size_t)r], s);
        for (int i = 0; i < dim; i++) bad += !close(y[(size_t)r * dim + i], w[(size_t)i] * x[(size_t)r * dim + i] * s);
    }
    const std::string shape = std::to_string(rows) + " x " + std::to_string(dim);
    report(bad == 0, ("RMSNorm forward " + shape + ": " + std::to_string(bad) + " wrong").c_str());
    /* backward, from the forward's rstd as the model runs it: dx and dw add to what they held */
    std::vector<float> dx = rnd((size_t)rows * dim), dw = rnd((size_t)dim);
    std::vector<double> want_dx(dx.begin(), dx.end()), want_dw(dw.begin(), dw.end());
    for (int r = 0; r < rows; r++) {
        const size_t o = (size_t)r * dim;
        double dot = 0;
        for (int i = 0; i < dim; i++) dot += (double)dy[o + i] * w[(size_t)i] * x[o + i];
        const double s = rstd[(size_t)r], c = dot * s * s * s / dim;
        for (int i = 0; i < dim; i++) {
            want_dx[o + i] += s * dy[o + i] * w[(size_t)i] - c * x[o + i];
            want_dw[(size_t)i] += (double)dy[o + i] * x[o + i] * s;
        }
    }
    gk_rmsnorm_backward(nullptr, dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), rows, dim);
    bad = 0;
    for (size_t i = 0; i < dx.size(); i++) bad += !close(dx[i], want_dx[i]);
    long bad_dw = 0;
    for (int i = 0; i < dim; i++) bad_dw += !close(dw[(size_t)i], want_dw[(size_t)i]);
    report(bad == 0 && bad_dw == 0, ("RMSNorm backward " + shape + ": " + std::to_string(bad) + " dx and " +
                                     std::to_string(bad_dw) + " dw wrong")
                                        .c_str());
}

static void sum_case(long n) {
    const std::vector<float> x = rnd((size_t)n);
    double want = 0, got = -7;
    for (float v : x) want += v;
    gk_sum(nullptr, &got, x.data(), n);
    report(close(got, want), ("gk_sum of " + std::to_string(n) + ": " + std::to_string(got) + " vs " +
                              std::to_string(want))
                                 .c_str());
}

int main(int argc, char **argv) {
    const bool quick = argc > 1 && std::string(argv[1]) == "--quick";
    emu_rng() = 0x6e6f726d73ull;
    rmsnorm_case(5, 30);  /* 1-wide */
    rmsnorm_case(37, 64); /* 4-wide */
    rmsnorm_case(3, 1);
    if (!quick) rmsnorm_case(700, 24); /* col_sums: 3 blocks of 8 columns, 700 rows over 64 thread rows, 8 ahead */
    sum_case(1);
    sum_case(100003);
    std::printf("gpu-emu: %d passed, %d failed (RMSNorm, warp of %d lanes)\n", emu_passed(), emu_failed(), GPU_WARP);
    return emu_failed() != 0;
}
