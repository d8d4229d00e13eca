/* src/gpu/gpu_expert_gemm.cu run on the CPU (cuda_emu.h): the grouped expert products against a double-precision
 * reference on random bf16 operands, for the row-grouped forms (C = A W_eᵀ, C = A W_e) and the per-expert weight
 * gradient, with empty experts, rows past the last expert, partial tiles, both load paths (16-byte and element by
 * element) and beta 0 / 1; every element outside the product is checked untouched. Both forms of the 16-byte path
 * run each case on the same inputs (GK_EXPERT_STAGED, then GK_EXPERT_ASYNC: cp.async into a ring of shared tiles) and
 * must give the same bits. Prints "gpu-emu: N passed, N failed". */
#define ZAYA_GPU_EMU 1
#include "gpu_expert_gemm.cu"
#include "emu_check.h"

#include <cmath>
#include <cstdio>
#include <vector>

static uint16_t bf16_bits(float x) { /* nearest even */
    uint32_t u;
    std::memcpy(&u, &x, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static double bf(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
static std::vector<uint16_t> rand16(size_t n) {
    std::vector<uint16_t> v(n);
    for (auto &x : v) x = bf16_bits(urand());
    return v;
}

static const float SENTINEL = 12345.0f;

/* C[r, :] = A[r, :] op(W_e) + beta C for the rows of each expert (counts[e]), max_rows >= their sum. */
static void rows_case(const char *name, std::vector<int> counts, int max_rows, int N, int K, int lda, int trans_w,
                      float beta) {
    const int E = (int)counts.size();
    std::vector<int32_t> off(E + 1, 0);
    for (int e = 0; e < E; e++) off[e + 1] = off[e] + counts[e];
    const int ldw = trans_w ? K : N, ldc = N + 3;
    const long w_stride = (long)N * K;
    std::vector<uint16_t> A = rand16((size_t)max_rows * lda), W = rand16((size_t)E * w_stride);
    std::vector<float> C((size_t)max_rows * ldc), C0;
    for (int r = 0; r < max_rows; r++)
        for (int c = 0; c < ldc; c++) C[(size_t)r * ldc + c] = r < off[E] && c < N ? urand() : SENTINEL;
    C0 = C;
    std::vector<float> Cs = C;
    gk_expert_kernel(GK_EXPERT_STAGED);
    gk_expert_mm(nullptr, off.data(), E, max_rows, N, K, A.data(), lda, W.data(), w_stride, trans_w, beta, Cs.data(),
                 ldc);
    gk_expert_kernel(GK_EXPERT_ASYNC);
    gk_expert_mm(nullptr, off.data(), E, max_rows, N, K, A.data(), lda, W.data(), w_stride, trans_w, beta, C.data(),
                 ldc);
    const bool same_bits = std::memcmp(C.data(), Cs.data(), C.size() * sizeof(float)) == 0;
    double worst = 0;
    bool ok = true;
    for (int e = 0; e < E; e++)
        for (int r = off[e]; r < off[e + 1]; r++)
            for (int n = 0; n < N; n++) {
                double s = 0, mag = 0;
                for (int k = 0; k < K; k++) {
                    const double w = bf(trans_w ? W[e * w_stride + (long)n * ldw + k] : W[e * w_stride + (long)k * ldw + n]);
                    s += bf(A[(size_t)r * lda + k]) * w;
                    mag += std::fabs(bf(A[(size_t)r * lda + k]) * w);
                }
                const double c0 = C0[(size_t)r * ldc + n], ref = s + (beta != 0 ? beta * c0 : 0.0);
                const double err = std::fabs(C[(size_t)r * ldc + n] - ref) / (mag + std::fabs(c0) + 1e-6);
                worst = err > worst ? err : worst;
            }
    ok = worst < 1e-5 && same_bits;
    for (int r = 0; r < max_rows; r++)
        for (int c = 0; c < ldc; c++)
            if ((r >= off[E] || c >= N) && C[(size_t)r * ldc + c] != SENTINEL) ok = false;
    char what[256];
    std::snprintf(what, sizeof what,
                  "%s (E %d, rows %d of %d, N %d, K %d, lda %d, trans_w %d, beta %g): worst %.2e, forms %s", name, E,
                  off[E], max_rows, N, K, lda, trans_w, beta, worst, same_bits ? "bit-identical" : "DIFFER");
    report(ok, what);
}

/* G_e = Σ_{r in e} A[r, :]ᵀ B[r, :] + beta G_e. */
static void wgrad_case(const char *name, std::vector<int> counts, int M, int N, int lda, int ldb, float beta) {
    const int E = (int)counts.size();
    std::vector<int32_t> off(E + 1, 0);
    for (int e = 0; e < E; e++) off[e + 1] = off[e] + counts[e];
    const int rows = off[E] + 5, ldg = N + 2;
    const long g_stride = (long)(M + 1) * ldg; /* a spare row between experts */
    std::vector<uint16_t> A = rand16((size_t)rows * lda), B = rand16((size_t)rows * ldb);
    std::vector<float> G((size_t)E * g_stride), G0;
    for (int e = 0; e < E; e++)
        for (int m = 0; m <= M; m++)
            for (int n = 0; n < ldg; n++) G[e * g_stride + (long)m * ldg + n] = m < M && n < N ? urand() : SENTINEL;
    G0 = G;
    std::vector<float> Gs = G;
    gk_expert_kernel(GK_EXPERT_STAGED);
    gk_expert_mm_wgrad(nullptr, off.data(), E, M, N, A.data(), lda, B.data(), ldb, beta, Gs.data(), g_stride, ldg);
    gk_expert_kernel(GK_EXPERT_ASYNC);
    gk_expert_mm_wgrad(nullptr, off.data(), E, M, N, A.data(), lda, B.data(), ldb, beta, G.data(), g_stride, ldg);
    const bool same_bits = std::memcmp(G.data(), Gs.data(), G.size() * sizeof(float)) == 0;
    double worst = 0;
    bool ok = true;
    for (int e = 0; e < E; e++)
        for (int m = 0; m <= M; m++)
            for (int n = 0; n < ldg; n++) {
                const long o = e * g_stride + (long)m * ldg + n;
                if (m == M || n >= N) {
                    if (G[o] != SENTINEL) ok = false;
                    continue;
                }
                double s = 0, mag = 0;
                for (int r = off[e]; r < off[e + 1]; r++) {
                    const double p = bf(A[(size_t)r * lda + m]) * bf(B[(size_t)r * ldb + n]);
                    s += p, mag += std::fabs(p);
                }
                const double ref = s + (beta != 0 ? beta * G0[o] : 0.0);
                const double err = std::fabs(G[o] - ref) / (mag + std::fabs(G0[o]) + 1e-6);
                worst = err > worst ? err : worst;
            }
    ok = ok && worst < 1e-5 && same_bits;
    char what[256];
    std::snprintf(what, sizeof what, "%s (E %d, rows %d, M %d, N %d, lda %d, ldb %d, beta %g): worst %.2e, forms %s",
                  name, E, off[E], M, N, lda, ldb, beta, worst, same_bits ? "bit-identical" : "DIFFER");
    report(ok, what);
}

int main() {
    emu_rng() = 0x9e3779b97f4a7c15ull;
    /* 16-byte loads: K, N, lda multiples of 8 */
    rows_case("forward C = A W_e^T", {150, 0, 37, 200}, 420, 136, 64, 64, 1, 0.0f);
    rows_case("input gradient C = A W_e", {150, 0, 37, 200}, 420, 136, 64, 72, 0, 0.0f);
    rows_case("accumulate", {129, 1, 0}, 140, 200, 40, 40, 1, 1.0f);
    rows_case("one expert, whole tiles", {256}, 256, 128, 32, 32, 0, 0.0f);
    rows_case("deep k: 5 k-steps through the 3-slot ring", {130, 7}, 140, 136, 160, 168, 1, 0.0f);
    rows_case("deep k, input gradient", {130, 7}, 140, 144, 160, 160, 0, 1.0f);
    /* element loads: odd sizes and strides */
    rows_case("forward, odd sizes", {70, 3, 0, 64}, 150, 45, 37, 39, 1, 0.0f);
    rows_case("input gradient, odd sizes", {70, 3, 0, 64}, 150, 45, 37, 41, 0, 1.0f);
    rows_case("no rows", {0, 0}, 64, 40, 16, 16, 1, 0.0f);
    wgrad_case("weight gradient", {70, 0, 300}, 136, 72, 136, 72, 1.0f);
    wgrad_case("weight gradient, beta 0 (an empty expert zeroed)", {40, 0, 130}, 24, 40, 24, 40, 0.0f);
    wgrad_case("weight gradient, odd sizes", {33, 90}, 30, 50, 33, 51, 1.0f);
    wgrad_case("weight gradient, 1 and 2 k-steps (shorter than the ring)", {17, 40}, 16, 24, 16, 24, 0.0f);
    std::printf("gpu-emu: %d passed, %d failed (warp of %d lanes)\n", emu_passed(), emu_failed(), GPU_WARP);
    return emu_failed() != 0;
}
