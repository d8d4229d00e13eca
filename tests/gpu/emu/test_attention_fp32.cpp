/* src/gpu/gpu_attention.cu run on the CPU (cuda_emu.h): the fp32 flash attention (fp32 runs, and bf16 runs' sliding
 * window layers with ZAYA_GPU_WINDOW_TC=off), forward and backward, against a double-precision reference, with the tolerances of
 * tests/gpu/test_gpu_attention.c (relative L2: 1e-5 for O and LSE, 5e-5 for the gradient increments). Sliding
 * windows of 1, inside one tile, across tile edges, ending exactly on the query blocks' edges (W ≡ 2 mod 32), and
 * none (plain causal); head sizes that take the
 * padded tiles with element loads (dh 12), the hot sizes (64) and the 256 tiles; 1, 2 and 4 query heads a kv head.
 * The backward accumulates into preloaded gradients; two runs give the same bits. Prints "gpu-emu: N passed, N
 * failed". */
#define ZAYA_GPU_EMU 1
#include "gpu_attention.cu"

#include <cstring>
#include <vector>

#include "attention_ref.h"

static void window_case(int B, int T, int Hq, int Hkv, int dh, int window) {
    const size_t nq = (size_t)B * T * Hq * dh, nk = (size_t)B * T * Hkv * dh, nl = (size_t)B * Hq * T;
    std::vector<float> Q = rand_vec(nq, 1), K = rand_vec(nk, 1), V = rand_vec(nk, 1), dO = rand_vec(nq, 1);
    std::vector<float> dQ0 = rand_vec(nq, 0.5f), dK0 = rand_vec(nk, 0.5f), dV0 = rand_vec(nk, 0.5f);
    const AttnRef ref = attention_reference(Q, K, V, dO, B, T, Hq, Hkv, dh, window < T ? window : 0);
    char tag[96], what[220];
    std::snprintf(tag, sizeof tag, "B%d T%d Hq%d Hkv%d dh%d window %d", B, T, Hq, Hkv, dh, window);

    std::vector<float> O(nq, NAN), L(nl, NAN);
    gk_flash_attention_forward_window(nullptr, O.data(), L.data(), Q.data(), K.data(), V.data(), B, T, Hq, Hkv, dh,
                                      window);
    const double eo = rel_err(O.data(), ref.O.data(), nq), el = rel_err(L.data(), ref.L.data(), nl);
    std::snprintf(what, sizeof what, "forward %s: O rel err %.2e, LSE %.2e (tol 1e-5)", tag, eo, el);
    report(eo <= 1e-5 && el <= 1e-5, what);

    /* backward from the reference's O and LSE (as fp32), twice into preloaded gradients */
    std::vector<float> Of(ref.O.begin(), ref.O.end()), Lf(ref.L.begin(), ref.L.end());
    std::vector<float> work((size_t)gk_flash_attention_work_floats(B, T, Hq) + 64);
    std::vector<float> g[2][3];
    for (int rep = 0; rep < 2; rep++) {
        g[rep][0] = dQ0, g[rep][1] = dK0, g[rep][2] = dV0;
        gk_flash_attention_backward_window(nullptr, g[rep][0].data(), g[rep][1].data(), g[rep][2].data(), dO.data(),
                                           Of.data(), Lf.data(), Q.data(), K.data(), V.data(), B, T, Hq, Hkv, dh,
                                           work.data(), window);
    }
    const std::vector<float> *pre[3] = {&dQ0, &dK0, &dV0};
    check_increments(tag, g, pre, ref, 5e-5);
}

int main(int argc, char **argv) {
    const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0; /* the sanitizer run */
    window_case(2, 40, 4, 2, 64, 5);   /* a window inside one tile; 2 query heads a kv head */
    window_case(1, 130, 4, 1, 12, 70); /* across tile edges; padded head, element loads; 4 a kv head */
    if (!quick) {
        window_case(1, 200, 4, 2, 64, 66);  /* W ≡ 2 mod 32 and 64: the windows end on the query blocks' edges */
        window_case(1, 100, 2, 1, 256, 34); /* the same at the 256 tiles' 32 / 16 */
        window_case(1, 17, 2, 2, 64, 1);    /* each query sees itself only */
        window_case(1, 100, 2, 1, 64, 64);  /* a window of exactly one 64-row tile */
        window_case(1, 70, 2, 1, 256, 33);  /* the 256 tiles (32 rows) */
        window_case(2, 65, 2, 1, 64, 0);    /* plain causal (window 0) over a tile and one row */
        window_case(1, 50, 2, 2, 64, 4096); /* a window past T: plain causal */
    }
    std::printf("gpu-emu: %d passed, %d failed (fp32 attention, warp of %d lanes)\n", emu_passed(), emu_failed(),
                GPU_WARP);
    return emu_failed() != 0;
}
