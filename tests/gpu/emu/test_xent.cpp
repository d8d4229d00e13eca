/* src/gpu/gpu_xent.cu run on the CPU (cuda_emu.h): the cross-entropy's row losses and gradient against a
 * double-precision reference (the softmax minus the one-hot target, times dloss / n_valid; ignored rows 0), on the
 * 4-wide and the scalar paths, with ignored rows and rows holding -inf logits; its bf16 gradient, written alone and
 * beside the fp32 one, equal to zy_f32_to_bf16 of the fp32 one bit for bit, every element written. Prints
 * "gpu-emu: N passed, N failed". */
#define ZAYA_GPU_EMU 1
#include "gpu_xent.cu"
#include "emu_check.h"

#include <cmath>
#include <cstdio>
#include <vector>

#include "util/util.h"

static void run_case(const char *name, int rows, int V) {
    const size_t n = (size_t)rows * V;
    std::vector<float> logits(n);
    std::vector<int32_t> targets(rows);
    for (auto &x : logits) x = 4.0f * urand();
    for (int r = 0; r < rows; r++) targets[r] = (int)((urand() + 1.0f) * 0.5f * V) % V;
    targets[1] = -1; /* an ignored row */
    for (int i = 0; i < V; i += 3) logits[(size_t)2 * V + i] = -INFINITY; /* a row with -inf logits */
    int valid = 0;
    for (int t : targets) valid += t >= 0;
    const float dl_scale = 0.75f / valid;
    const float POISON = 12345.0f;
    std::vector<float> dl(n, POISON), dl_b(n, POISON), loss(rows, POISON);
    std::vector<uint16_t> d16(n, 0xffff), d16_b(n, 0xffff);
    gk_cross_entropy(nullptr, dl.data(), nullptr, loss.data(), logits.data(), targets.data(), rows, V, &dl_scale);
    gk_cross_entropy(nullptr, nullptr, d16.data(), nullptr, logits.data(), targets.data(), rows, V, &dl_scale);
    gk_cross_entropy(nullptr, dl_b.data(), d16_b.data(), nullptr, logits.data(), targets.data(), rows, V, &dl_scale);
    double worst_l = 0, worst_g = 0;
    for (int r = 0; r < rows; r++) {
        const float *l = &logits[(size_t)r * V];
        double m = -INFINITY, s = 0;
        for (int i = 0; i < V; i++) m = l[i] > m ? l[i] : m;
        for (int i = 0; i < V; i++) s += std::exp((double)l[i] - m);
        const int t = targets[r];
        const double want_loss = t < 0 ? 0.0 : m + std::log(s) - l[t];
        worst_l = std::fmax(worst_l, std::fabs(loss[r] - want_loss) / (std::fabs(want_loss) + 1e-6));
        for (int i = 0; i < V; i++) {
            const double p = t < 0 ? 0.0 : (std::exp((double)l[i] - m) / s - (i == t)) * dl_scale;
            worst_g = std::fmax(worst_g, std::fabs(dl[(size_t)r * V + i] - p) / dl_scale);
        }
    }
    char what[200];
    std::snprintf(what, sizeof what, "%s (%d x %d): row losses, worst rel err %.1e", name, rows, V, worst_l);
    report(worst_l < 1e-6, what);
    std::snprintf(what, sizeof what, "%s: fp32 gradient, worst err %.1e of dloss / n_valid", name, worst_g);
    report(worst_g < 1e-5, what);
    size_t wrong = 0, wrong_b = 0;
    for (size_t i = 0; i < n; i++) {
        wrong += d16[i] != zy_f32_to_bf16(dl[i]);
        wrong_b += d16_b[i] != zy_f32_to_bf16(dl[i]);
    }
    const bool same_fp32 = std::memcmp(dl.data(), dl_b.data(), n * sizeof(float)) == 0;
    std::snprintf(what, sizeof what, "%s: bf16 gradient = zy_f32_to_bf16(fp32), alone (%zu differ) and beside it (%zu)",
                  name, wrong, wrong_b);
    report(wrong == 0 && wrong_b == 0 && same_fp32, what);
}

int main() {
    emu_rng() = 0x853c49e6748fea9bull;
    run_case("4-wide path", 6, 4096);
    run_case("scalar path (V odd)", 5, 4099);
    run_case("short rows", 7, 100);
    std::printf("gpu-emu: %d passed, %d failed\n", emu_passed(), emu_failed());
    return emu_failed() != 0;
}
