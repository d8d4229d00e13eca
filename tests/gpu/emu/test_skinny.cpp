/* src/gpu/gpu_skinny.cu run on the CPU (cuda_emu.h): the few-row products of decoding's steps against a
 * double-precision reference of the bf16 product (x rounded to bf16 nearest-even, bf16 weights): several products of
 * the same rows in one launch (units that straddle two products, a last block with fewer units, K short of a warp's
 * reach and K past one pass of the block), 1 to 8 rows (each instantiation), the experts' SwiGLU and gate-and-combine
 * forms with rows on different experts and on the skip expert; every element outside the outputs left as it was, the
 * same bits on a second run, the router's bias-and-GELU epilogue, and the refusals (too many rows, K not a multiple of 8, unaligned x) launching nothing.
 * Prints "gpu-emu: N passed, N failed". */
#define ZAYA_GPU_EMU 1
#include "gpu_skinny.cu"
#include "emu_check.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "util/util.h"

static const float POISON = 12345.0f;

static std::vector<uint16_t> random_bf16(size_t n) {
    std::vector<uint16_t> w(n);
    for (auto &v : w) v = zy_f32_to_bf16(urand());
    return w;
}
/* Σ_k bf16(x[k]) w[k] in double, and Σ |·| (the scale of the fp32 sum's rounding) */
static double dot_ref(const float *x, const uint16_t *w, int K, double *mag) {
    double s = 0, m = 0;
    for (int k = 0; k < K; k++) {
        const double p = (double)zy_bf16_to_f32(zy_f32_to_bf16(x[k])) * zy_bf16_to_f32(w[k]);
        s += p, m += std::fabs(p);
    }
    *mag = m;
    return s;
}

static void plain_case(int rows, int K, std::vector<int> ns, int gelu_out = -1) {
    const int ldx = K + 4, n_outs = (int)ns.size();
    std::vector<float> x((size_t)rows * ldx);
    for (auto &v : x) v = 3.0f * urand();
    std::vector<std::vector<uint16_t>> w(n_outs);
    std::vector<std::vector<float>> y(n_outs), y2(n_outs), bias(n_outs);
    GkSkinnyOut outs[GK_SKINNY_OUTS];
    for (int j = 0; j < n_outs; j++) {
        const int ldy = ns[j] + 3;
        w[j] = random_bf16((size_t)ns[j] * K);
        y[j].assign((size_t)(rows + 1) * ldy, POISON); /* one row more than written */
        outs[j] = GkSkinnyOut{w[j].data(), y[j].data(), ns[j], ldy, nullptr};
        if (j == gelu_out) { /* y = gelu(sum + bias) */
            bias[j].resize(ns[j]);
            for (auto &b : bias[j]) b = urand();
            outs[j].bias = bias[j].data();
        }
    }
    const int rc = gk_skinny_mm(nullptr, x.data(), ldx, rows, K, outs, n_outs);
    double worst = 0;
    bool untouched = true;
    for (int j = 0; j < n_outs; j++) {
        const int ldy = outs[j].ldy;
        for (int r = 0; r <= rows; r++)
            for (int c = 0; c < ldy; c++) {
                const float got = y[j][(size_t)r * ldy + c];
                if (r == rows || c >= ns[j]) {
                    untouched = untouched && got == POISON;
                    continue;
                }
                double mag;
                double want = dot_ref(&x[(size_t)r * ldx], &w[j][(size_t)c * K], K, &mag);
                if (j == gelu_out) {
                    want += bias[j][c];
                    want = 0.5 * want * (1.0 + std::erf(want / std::sqrt(2.0)));
                }
                worst = std::fmax(worst, std::fabs(got - want) / (mag + 1e-30));
            }
    }
    for (int j = 0; j < n_outs; j++) { /* a second run into fresh outputs: the same bits */
        y2[j].assign(y[j].size(), POISON);
        outs[j].y = y2[j].data();
    }
    gk_skinny_mm(nullptr, x.data(), ldx, rows, K, outs, n_outs);
    bool same = true;
    for (int j = 0; j < n_outs; j++) same = same && std::memcmp(y[j].data(), y2[j].data(), y[j].size() * 4) == 0;
    char what[200];
    std::snprintf(what, sizeof what, "products of %d rows, K %d, %d outputs%s: worst err %.1e of sum |x w| (tol 1e-6), "
                  "nothing else written, a rerun bit-identical", rows, K, n_outs,
                  gelu_out >= 0 ? " (one with bias and GELU)" : "", worst);
    report(rc == 0 && worst < 1e-6 && untouched && same, what);
}

/* rows on experts `choice` (E or -1: the skip expert) through SwiGLU, then down with the gate */
static void expert_case(int D, int I, int E, std::vector<int> choice) {
    const int rows = (int)choice.size();
    std::vector<float> x((size_t)rows * D), gate(rows);
    for (auto &v : x) v = 2.0f * urand();
    for (auto &g : gate) g = 0.5f + 0.5f * urand();
    const std::vector<uint16_t> wgu = random_bf16((size_t)E * 2 * I * D), wd = random_bf16((size_t)E * D * I);
    std::vector<float> act((size_t)rows * I, POISON), out((size_t)rows * D, POISON);
    const int rc1 = gk_skinny_expert_swiglu(nullptr, act.data(), x.data(), choice.data(), wgu.data(), rows, D, I, E);
    double worst_act = 0;
    bool skip_left = true;
    std::vector<float> act_in(act); /* down reads the kernel's own act (skip rows: whatever is there) */
    for (int r = 0; r < rows; r++) {
        const int e = choice[r];
        for (int i = 0; i < I; i++) {
            const float got = act[(size_t)r * I + i];
            if (e < 0 || e >= E) {
                skip_left = skip_left && got == POISON;
                continue;
            }
            double mg, mu;
            const uint16_t *we = &wgu[(size_t)e * 2 * I * D];
            const double g = dot_ref(&x[(size_t)r * D], we + (size_t)i * D, D, &mg);
            const double u = dot_ref(&x[(size_t)r * D], we + (size_t)(I + i) * D, D, &mu);
            const double want = g / (1.0 + std::exp(-g)) * u;
            /* the error of g and u carried through silu(g)·u */
            const double scale = (std::fabs(u) + 1.0) * mg + (std::fabs(g) + 1.0) * mu + 1e-30;
            worst_act = std::fmax(worst_act, std::fabs(got - want) / scale);
        }
    }
    const int rc2 = gk_skinny_expert_down(nullptr, out.data(), act_in.data(), choice.data(), gate.data(), wd.data(),
                                          rows, I, D, E);
    double worst_out = 0;
    bool skip_zero = true;
    for (int r = 0; r < rows; r++) {
        const int e = choice[r];
        for (int c = 0; c < D; c++) {
            const float got = out[(size_t)r * D + c];
            if (e < 0 || e >= E) {
                skip_zero = skip_zero && got == 0.0f && !std::signbit(got);
                continue;
            }
            double m;
            const double want = gate[r] * dot_ref(&act_in[(size_t)r * I], &wd[(size_t)e * D * I + (size_t)c * I], I, &m);
            worst_out = std::fmax(worst_out, std::fabs(got - want) / (gate[r] * m + 1e-30));
        }
    }
    std::vector<float> out2((size_t)rows * D, POISON);
    gk_skinny_expert_down(nullptr, out2.data(), act_in.data(), choice.data(), gate.data(), wd.data(), rows, I, D, E);
    const bool same = std::memcmp(out.data(), out2.data(), out.size() * 4) == 0;
    char what[240];
    std::snprintf(what, sizeof what, "experts, %d rows, D %d, I %d, E %d: SwiGLU worst err %.1e (tol 1e-6), skip rows "
                  "untouched; gate and combine worst err %.1e (tol 1e-6), skip rows +0; a rerun bit-identical",
                  rows, D, I, E, worst_act, worst_out);
    report(rc1 == 0 && rc2 == 0 && worst_act < 1e-6 && worst_out < 1e-6 && skip_left && skip_zero && same, what);
}

static void refusals() {
    std::vector<float> x(9 * 40 + 8, 1.0f), y(9 * 40, POISON);
    const std::vector<uint16_t> w = random_bf16(40 * 40);
    GkSkinnyOut o{w.data(), y.data(), 8, 40, nullptr};
    const int too_many = gk_skinny_mm(nullptr, x.data(), 40, 9, 40, &o, 1);
    const int odd_k = gk_skinny_mm(nullptr, x.data(), 40, 2, 12, &o, 1);
    const int unaligned = gk_skinny_mm(nullptr, x.data() + 1, 40, 2, 40, &o, 1);
    const int no_outs = gk_skinny_mm(nullptr, x.data(), 40, 2, 40, &o, 0);
    bool untouched = true;
    for (float v : y) untouched = untouched && v == POISON;
    report(too_many == -1 && odd_k == -1 && unaligned == -1 && no_outs == -1 && untouched,
           "refused: 9 rows, K 12, x off 16 bytes, no products; nothing written");
}

int main() {
    emu_rng() = 0x9e3779b97f4a7c15ull;
    plain_case(1, 264, {40, 24, 9});       /* K 264: 33 pieces, two warps, the second mostly idle */
    plain_case(3, 512, {17, 6});           /* units straddling the two products, a short last block */
    plain_case(8, 2056, {12});             /* K past one pass of 256 threads; 8 rows */
    plain_case(2, 128, {5, 7, 3, 9}, 2);   /* four products, one with the router's bias and GELU */
    plain_case(1, 256, {256}, 0);          /* the router's hidden layer at batch 1 */
    expert_case(64, 24, 3, {1});           /* decoding at batch 1 */
    expert_case(96, 40, 4, {0, 2, 4, 1, 2, -1, 3}); /* rows sharing an expert, two skip rows */
    refusals();
    std::printf("gpu-emu: %d passed, %d failed\n", emu_passed(), emu_failed());
    return emu_failed() ? 1 : 0;
}
