/* src/gpu/gpu_moe.cu's routing bookkeeping run on the CPU (cuda_emu.h): gk_group_by_expert, the stable counting sort
 * of rows by expert in one block (per-warp ballots over the key bits find each row's rank among equal keys, the warps'
 * counts are scanned per expert), against a plain stable sort: every offset and every sorted row exactly, for skip and
 * out-of-range choices, one expert or many, several tiles, block sizes cut down by a large expert count, and the
 * one-thread fallback past shared memory; and gk_routing_stats (the counts by an integer atomic in shared memory, the
 * gate and skip-probability sums in a fixed tree) against the same numbers summed on the host. At 64 lanes it is the
 * HIP build's form (ZAYA_HIP: 64-bit lane masks, HIP's intrinsics). Prints "gpu-emu: N passed, N failed". */
#define ZAYA_GPU_EMU 1
#if GPU_WARP == 64
#define ZAYA_HIP 1
#endif
#include "gpu_moe.cu"
#include "emu_check.h"

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

/* choices: mostly experts 0..E-1, some the skip expert (E), some out of range (-1, E + 3): both left out */
static std::vector<int32_t> choices(int N, int E, int one_expert) {
    std::vector<int32_t> c((size_t)N);
    for (int r = 0; r < N; r++) {
        const float u = 0.5f * (urand() + 1.0f);
        if (one_expert >= 0) c[(size_t)r] = one_expert;
        else if (u < 0.08f) c[(size_t)r] = E;
        else if (u < 0.10f) c[(size_t)r] = r % 2 ? -1 : E + 3;
        else c[(size_t)r] = (int32_t)(0.5f * (urand() + 1.0f) * (float)E) % E;
    }
    return c;
}

static void group_case(int N, int E, int one_expert = -1) {
    const std::vector<int32_t> c = choices(N, E, one_expert);
    std::vector<int32_t> want_off((size_t)E + 1, 0), want_sorted;
    for (int e = 0; e < E; e++) {
        want_off[(size_t)e] = (int32_t)want_sorted.size();
        for (int r = 0; r < N; r++)
            if (c[(size_t)r] == e) want_sorted.push_back(r);
    }
    want_off[(size_t)E] = (int32_t)want_sorted.size();
    std::vector<int32_t> off((size_t)E + 1, -7), sorted((size_t)N + 1, -7);
    gk_group_by_expert(nullptr, off.data(), sorted.data(), c.data(), N, E);
    long bad = 0;
    for (int e = 0; e <= E; e++) bad += off[(size_t)e] != want_off[(size_t)e];
    for (size_t i = 0; i < want_sorted.size(); i++) bad += sorted[i] != want_sorted[i];
    for (size_t i = want_sorted.size(); i < sorted.size(); i++) bad += sorted[i] != -7; /* nothing past the routed */
    report(bad == 0, ("group by expert, " + std::to_string(N) + " rows, " + std::to_string(E) + " experts" +
                      (one_expert >= 0 ? ", all to one" : "") + ": " + std::to_string(bad) + " entries wrong")
                         .c_str());
}

static void stats_case(int N, int E, bool skip_class) {
    const int classes = skip_class ? E + 1 : E;
    const std::vector<int32_t> c = choices(N, E, -1);
    std::vector<float> gate((size_t)N), probs((size_t)N * classes);
    for (float &g : gate) g = 0.5f * (urand() + 1.0f);
    for (float &p : probs) p = 0.5f * (urand() + 1.0f);
    std::vector<int32_t> want((size_t)E + 1, 0), counts((size_t)E + 1, -7);
    double want_g = 0, want_p = 0;
    for (int r = 0; r < N; r++) {
        const int k = c[(size_t)r];
        if (k >= 0 && k <= E) want[(size_t)k]++;
        if (k >= 0 && k < E) want_g += gate[(size_t)r];
        if (skip_class) want_p += probs[(size_t)r * classes + E];
    }
    double sums[2] = {-7, -7};
    gk_routing_stats(nullptr, counts.data(), sums, c.data(), gate.data(), probs.data(), N, classes, E);
    long bad = 0;
    for (int e = 0; e <= E; e++) bad += counts[(size_t)e] != want[(size_t)e];
    const bool sums_ok = std::fabs(sums[0] - want_g) <= 1e-12 * (1 + want_g) &&
                         std::fabs(sums[1] - want_p) <= 1e-12 * (1 + want_p);
    report(bad == 0 && sums_ok, ("routing statistics, " + std::to_string(N) + " rows, " + std::to_string(E) +
                                 " experts" + (skip_class ? " + skip" : "") + ": " + std::to_string(bad) +
                                 " counts wrong, sums " + (sums_ok ? "right" : "wrong"))
                                    .c_str());
}

int main(int argc, char **argv) {
    const bool quick = argc > 1 && std::string(argv[1]) == "--quick";
    emu_rng() = 0x6d6f65726f757465ull;
    group_case(0, 4);
    group_case(1, 1);
    group_case(100, 16);
    group_case(777, 3, 2);
    group_case(3000, 64);
    group_case(2500, 2000); /* 128 threads: the per-warp tables of 1024 would not fit */
    group_case(300, 7000);  /* past shared memory at any block size: the one-thread fallback */
    if (!quick) {
        group_case(20000, 16); /* three tiles of 1024 x 8 */
        group_case(9000, 1);
        group_case(5000, 128);
    }
    stats_case(0, 4, true);
    stats_case(1000, 16, true);
    stats_case(3000, 64, false);
    std::printf("gpu-emu: %d passed, %d failed (MoE routing, warp of %d lanes)\n", emu_passed(), emu_failed(),
                GPU_WARP);
    return emu_failed() != 0;
}
