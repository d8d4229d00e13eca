/* src/gpu/gpu_attention_tc.cu run on the CPU (cuda_emu.h): the tensor-core flash attention, forward and backward,
 * against a double-precision reference on the same bf16-rounded Q, K, V, dO, as tests/gpu/test_gpu_attention.c does
 * on a GPU (and with its tolerance: TOL_TC = 5e-3 relative L2 for O and the gradient increments, what rounding P and
 * dS to bf16 leaves; 1e-5 for LSE). Shapes: one and several key tiles with a partial last one, head sizes 64 and 128,
 * 1, 2 and 4 query heads a kv head (the dK/dV kernel then splits them over 1, 2 and 4 blocks and sums the partials).
 * Sliding windows (query t sees keys t-window+1 .. t) of 1, of a fragment (16), of a dK/dV query tile (32), of a
 * key tile (64), off them (17, 40, 66: 66 ≡ 2 mod 32 and 64 ends the windows on tile edges), over two tiles (130),
 * and of T or more, which must give plain causal's bits.
 * The backward accumulates into preloaded gradients; two runs give the same bits.
 * Prints "gpu-emu: N passed, N failed". */
#define ZAYA_GPU_EMU 1
#include "gpu_attention_tc.cu"

#include <cstring>
#include <vector>

#include "attention_ref.h"

/* the fp32 kernels (gpu_attention.cu) are the fallback for other head sizes: never reached here */
extern "C" void gk_flash_attention_forward_window(GkStream, float *, float *, const float *, const float *,
                                                  const float *, int, int, int, int, int, int) {
    std::fprintf(stderr, "the fp32 fallback was reached\n");
    std::abort();
}
extern "C" void gk_flash_attention_backward_window(GkStream, float *, float *, float *, const float *, const float *,
                                                   const float *, const float *, const float *, const float *, int, int,
                                                   int, int, int, float *, int) {
    std::fprintf(stderr, "the fp32 fallback was reached\n");
    std::abort();
}
extern "C" long gk_flash_attention_work_floats(int, int, int) { return 1; }

static float round_bf16(float x) {
    uint32_t u = __float_as_uint(x);
    u += 0x7fffu + ((u >> 16) & 1u);
    return __uint_as_float(u & 0xffff0000u);
}
static std::vector<float> rounded(const std::vector<float> &x) {
    std::vector<float> r(x);
    for (auto &v : r) v = round_bf16(v);
    return r;
}

/* layouts as gpu_kernels.h: Q, O, dQ, dO [B*T, Hq*dh]; K, V, dK, dV [B*T, Hkv*dh]; LSE [B, Hq, T]. window 0: plain
 * causal; a window of T or more is also run as window 0, every output compared bit for bit. */
static void attention_case(int B, int T, int Hq, int Hkv, int dh, int window = 0) {
    const size_t nq = (size_t)B * T * Hq * dh, nk = (size_t)B * T * Hkv * dh, nl = (size_t)B * Hq * T;
    std::vector<float> Q = rand_vec(nq, 1), K = rand_vec(nk, 1), V = rand_vec(nk, 1), dO = rand_vec(nq, 1);
    std::vector<float> dQ0 = rand_vec(nq, 0.5f), dK0 = rand_vec(nk, 0.5f), dV0 = rand_vec(nk, 0.5f);
    /* the reference on the bf16 roundings of the inputs the kernels round themselves */
    const AttnRef ref = attention_reference(rounded(Q), rounded(K), rounded(V), rounded(dO), B, T, Hq, Hkv, dh,
                                            window < T ? window : 0);
    const std::vector<double> &Or = ref.O, &Lr = ref.L;
    char tag[112], what[220];
    std::snprintf(tag, sizeof tag, "B%d T%d Hq%d Hkv%d dh%d window %d (dK/dV in %d split%s)", B, T, Hq, Hkv, dh,
                  window, dkdv_splits(B, T, Hq, Hkv), dkdv_splits(B, T, Hq, Hkv) > 1 ? "s" : "");

    std::vector<float> O(nq, NAN), L(nl, NAN);
    gk_flash_attention_forward_bf16(nullptr, O.data(), L.data(), Q.data(), K.data(), V.data(), B, T, Hq, Hkv, dh,
                                    window);
    const double eo = rel_err(O.data(), Or.data(), nq), el = rel_err(L.data(), Lr.data(), nl);
    std::snprintf(what, sizeof what, "forward %s: O rel err %.2e (tol 5e-3), LSE %.2e (tol 1e-5)", tag, eo, el);
    report(eo <= 5e-3 && el <= 1e-5, what);

    /* backward from the reference's O and LSE (as fp32), twice into preloaded gradients */
    std::vector<float> Of(Or.begin(), Or.end()), Lf(Lr.begin(), Lr.end());
    const long wf = gk_flash_attention_bf16_work_floats(B, T, Hq, Hkv, dh);
    float *work = static_cast<float *>(std::aligned_alloc(256, ((size_t)wf * 4 + 255) / 256 * 256));
    std::vector<float> g[2][3];
    for (int rep = 0; rep < 2; rep++) {
        g[rep][0] = dQ0, g[rep][1] = dK0, g[rep][2] = dV0;
        gk_flash_attention_backward_bf16(nullptr, g[rep][0].data(), g[rep][1].data(), g[rep][2].data(), dO.data(),
                                         Of.data(), Lf.data(), Q.data(), K.data(), V.data(), B, T, Hq, Hkv, dh, work,
                                         window);
    }
    const std::vector<float> *pre[3] = {&dQ0, &dK0, &dV0};
    check_increments(tag, g, pre, ref, 5e-3);

    if (window >= T) { /* plain causal's bits: the forward and the backward once more with window 0 */
        std::vector<float> Oc(nq, NAN), Lc(nl, NAN), gc[3] = {dQ0, dK0, dV0};
        gk_flash_attention_forward_bf16(nullptr, Oc.data(), Lc.data(), Q.data(), K.data(), V.data(), B, T, Hq, Hkv,
                                        dh, 0);
        gk_flash_attention_backward_bf16(nullptr, gc[0].data(), gc[1].data(), gc[2].data(), dO.data(), Of.data(),
                                         Lf.data(), Q.data(), K.data(), V.data(), B, T, Hq, Hkv, dh, work, 0);
        bool same = Oc == O && Lc == L;
        for (int i = 0; i < 3; i++) same = same && gc[i] == g[0][i];
        std::snprintf(what, sizeof what, "%s: O, LSE, dQ, dK, dV those of window 0 bit for bit", tag);
        report(same, what);
    }
    std::free(work);
}

int main(int argc, char **argv) {
    /* --quick, the sanitizer run: the two GQA cases and a window */
    const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
    if (!quick) {
        attention_case(1, 1, 2, 1, 64);  /* one query */
        attention_case(1, 64, 2, 2, 64); /* one whole tile, no GQA */
    }
    attention_case(2, 130, 4, 2, 64);  /* three key tiles, the last partial; 2 query heads a kv head */
    attention_case(1, 100, 4, 1, 128); /* dh 128, 4 query heads a kv head */
    attention_case(1, 150, 2, 1, 64, 40); /* a window off the tile sizes across tile edges */
    if (!quick) {
        attention_case(1, 200, 2, 1, 64, 1);    /* each query sees itself only */
        attention_case(1, 160, 2, 2, 128, 16);  /* a fragment */
        attention_case(1, 150, 4, 1, 128, 17);  /* a fragment and one */
        attention_case(1, 160, 2, 1, 64, 32);   /* a dK/dV query tile */
        attention_case(1, 200, 4, 2, 128, 64);  /* a key tile */
        attention_case(1, 260, 2, 1, 64, 66);   /* ≡ 2 mod 32 and 64: the windows end on tile edges */
        attention_case(1, 230, 2, 1, 128, 130); /* over two key tiles */
        attention_case(2, 100, 2, 2, 64, 100);  /* a window of T: plain causal */
        attention_case(1, 70, 4, 1, 128, 4096); /* past T */
    }
    std::printf("gpu-emu: %d passed, %d failed (attention, warp of %d lanes)\n", emu_passed(), emu_failed(), GPU_WARP);
    return emu_failed() != 0;
}
