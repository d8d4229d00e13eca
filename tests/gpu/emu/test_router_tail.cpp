/* gk_skinny_router_tail (src/gpu/gpu_skinny.cu) run on the CPU (cuda_emu.h): the router's tail for decoding's few rows
 * in one launch against the launches it replaces — the state norm and the choice (gpu_router.cuh's row functions, as
 * gpu_moe.cu's kernels run them: one warp a row) and the three few-row products (gk_skinny_mm, the hidden layers with
 * their bias and GELU) — bit for bit in z, the logits, the probabilities, the choice and the gate; the logits also
 * against a double-precision reference of the same bf16 roundings. 1 to 8 rows, ZAYA1's width (256) and narrower ones,
 * the first layer (no r_prev) and the others, the refusals (too many rows, a width past one warp's reach or not a
 * multiple of 8, an unaligned matrix) launching nothing. Prints "gpu-emu: N passed, N failed". */
#define ZAYA_GPU_EMU 1
#include "gpu_skinny.cu"
#include "emu_check.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "util/util.h"

/* gpu_moe.cu's state-norm and choice kernels, one warp a row (their loop over rows is the only difference) */
__global__ void state_ref_kernel(float *z, float *zn, float *rstd, const float *bias, const float *r_prev,
                                 const float *gamma, const float *w, int dim, float eps) {
    const int r = threadIdx.x / GPU_WARP;
    state_rmsnorm_row<4>(z + (long)r * dim, zn + (long)r * dim, rstd + r, bias, r_prev ? r_prev + (long)r * dim : nullptr,
                         gamma, w, dim, eps);
}
__global__ void choice_ref_kernel(float *probs, int32_t *choice, float *gate, const float *logits, const float *bias,
                                  int nc) {
    const int r = threadIdx.x / GPU_WARP;
    router_choice_row(probs + (long)r * nc, choice + r, gate + r, logits + (long)r * nc, bias, nc);
}

static std::vector<uint16_t> random_bf16(size_t n, float scale) {
    std::vector<uint16_t> w(n);
    for (auto &v : w) v = zy_f32_to_bf16(scale * urand());
    return w;
}
static std::vector<float> random_f32(size_t n, float scale) {
    std::vector<float> v(n);
    for (auto &x : v) x = scale * urand();
    return v;
}
static double bf(double x) { return zy_bf16_to_f32(zy_f32_to_bf16((float)x)); }
static double gelu(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }

struct Router {
    int rows, R, classes;
    bool depth; /* r_prev and γ (every layer but the first) */
    std::vector<float> z0, bias, r_prev, gamma, norm_w, b1, b2, balance;
    std::vector<uint16_t> w1, w2, w_out;
    Router(int rows_, int R_, int classes_, bool depth_) : rows(rows_), R(R_), classes(classes_), depth(depth_) {
        z0 = random_f32((size_t)rows * R, 2.0f), bias = random_f32(R, 0.5f), r_prev = random_f32((size_t)rows * R, 1.0f);
        gamma = random_f32(R, 0.7f), norm_w = random_f32(R, 1.0f), b1 = random_f32(R, 0.3f), b2 = random_f32(R, 0.3f);
        balance = random_f32(classes, 0.05f);
        const float s = 2.0f / std::sqrt((float)R);
        w1 = random_bf16((size_t)R * R, s), w2 = random_bf16((size_t)R * R, s), w_out = random_bf16((size_t)classes * R, s);
    }
};
struct Outputs {
    std::vector<float> z, logits, probs, gate;
    std::vector<int32_t> choice;
    Outputs(const Router &r)
        : z(r.z0), logits((size_t)r.rows * r.classes, -7.0f), probs(logits.size(), -7.0f), gate(r.rows, -7.0f),
          choice(r.rows, -7) {}
};
static GkRouterTail tail_args(const Router &r, Outputs &o) {
    GkRouterTail t = {};
    t.z = o.z.data(), t.bias = r.bias.data(), t.r_prev = r.depth ? r.r_prev.data() : nullptr;
    t.gamma = r.gamma.data(), t.norm_w = r.norm_w.data(), t.eps = 1e-6f;
    t.w1 = r.w1.data(), t.w2 = r.w2.data(), t.w_out = r.w_out.data(), t.b1 = r.b1.data(), t.b2 = r.b2.data();
    t.balance_bias = r.balance.data(), t.logits = o.logits.data(), t.probs = o.probs.data(), t.gate = o.gate.data();
    t.choice = o.choice.data(), t.rows = r.rows, t.R = r.R, t.classes = r.classes;
    return t;
}

/* The five launches the tail replaces, as gpu_moe_forward queues them at decoding's few rows. */
static void unfused(const Router &r, Outputs &o) {
    const int R = r.R;
    std::vector<float> zn((size_t)r.rows * R), rstd(r.rows), h1((size_t)r.rows * R), h2((size_t)r.rows * R);
    GK_LAUNCH(state_ref_kernel, dim3(1), dim3(r.rows * GPU_WARP), 0, nullptr, o.z.data(), zn.data(), rstd.data(),
              r.bias.data(), r.depth ? r.r_prev.data() : nullptr, r.gamma.data(), r.norm_w.data(), R, 1e-6f);
    GkSkinnyOut p1 = {r.w1.data(), h1.data(), R, R, r.b1.data()}, p2 = {r.w2.data(), h2.data(), R, R, r.b2.data()},
                po = {r.w_out.data(), o.logits.data(), r.classes, r.classes, nullptr};
    const int rc = gk_skinny_mm(nullptr, zn.data(), R, r.rows, R, &p1, 1) | gk_skinny_mm(nullptr, h1.data(), R, r.rows, R, &p2, 1) |
                   gk_skinny_mm(nullptr, h2.data(), R, r.rows, R, &po, 1);
    if (rc) std::printf("note: a few-row product refused the shape\n");
    GK_LAUNCH(choice_ref_kernel, dim3(1), dim3(r.rows * GPU_WARP), 0, nullptr, o.probs.data(), o.choice.data(),
              o.gate.data(), o.logits.data(), r.balance.data(), r.classes);
}

/* The logits in double, with the products' bf16 roundings of zn, h1 and h2; worst |got − want| / Σ|terms|. */
static double logits_error(const Router &r, const Outputs &o) {
    const int R = r.R;
    double worst = 0;
    for (int i = 0; i < r.rows; i++) {
        std::vector<double> z(R), a(R), h(R);
        double ss = 0;
        for (int k = 0; k < R; k++) {
            z[k] = (double)r.z0[(size_t)i * R + k] + r.bias[k] + (r.depth ? (double)r.r_prev[(size_t)i * R + k] * r.gamma[k] : 0);
            ss += z[k] * z[k];
        }
        const double s = 1.0 / std::sqrt(ss / R + 1e-6);
        for (int k = 0; k < R; k++) a[k] = bf(r.norm_w[k] * z[k] * s);
        for (int layer = 0; layer < 2; layer++) {
            const std::vector<uint16_t> &w = layer ? r.w2 : r.w1;
            const std::vector<float> &b = layer ? r.b2 : r.b1;
            for (int u = 0; u < R; u++) {
                double t = b[u];
                for (int k = 0; k < R; k++) t += a[k] * zy_bf16_to_f32(w[(size_t)u * R + k]);
                h[u] = bf(gelu(t));
            }
            a = h;
        }
        for (int c = 0; c < r.classes; c++) {
            double t = 0, mag = 0;
            for (int k = 0; k < R; k++) {
                const double p = a[k] * zy_bf16_to_f32(r.w_out[(size_t)c * R + k]);
                t += p, mag += std::fabs(p);
            }
            worst = std::fmax(worst, std::fabs(o.logits[(size_t)i * r.classes + c] - t) / (mag + 1e-30));
        }
    }
    return worst;
}

static void same_case(int rows, int R, int classes, bool depth) {
    Router r(rows, R, classes, depth);
    Outputs fused(r), ref(r);
    GkRouterTail t = tail_args(r, fused);
    const int rc = gk_skinny_router_tail(nullptr, &t);
    unfused(r, ref);
    const bool bits = rc == 0 && fused.z == ref.z && !std::memcmp(fused.logits.data(), ref.logits.data(), fused.logits.size() * 4) &&
                      !std::memcmp(fused.probs.data(), ref.probs.data(), fused.probs.size() * 4) &&
                      !std::memcmp(fused.gate.data(), ref.gate.data(), fused.gate.size() * 4) && fused.choice == ref.choice;
    bool chosen = true;
    for (int i = 0; i < rows; i++) chosen = chosen && fused.choice[i] >= 0 && fused.choice[i] < classes;
    const double err = logits_error(r, fused);
    char what[240];
    std::snprintf(what, sizeof what,
                  "%d row%s, R %d, %d classes, %s: the five launches' bits (z, logits, probabilities, choice, gate), "
                  "logits vs double %.2e", rows, rows > 1 ? "s" : "", R, classes, depth ? "r_prev" : "first layer", err);
    report(bits && chosen && err < 1e-4, what);
}

static void refused(const char *why, int rows, int R, int classes, bool misalign) {
    Router r(rows, R, classes, true);
    Outputs o(r);
    GkRouterTail t = tail_args(r, o);
    std::vector<uint16_t> shifted(r.w1.size() + 8);
    if (misalign) {
        uint16_t *p = shifted.data() + 1;
        if (((uintptr_t)p & 15u) == 0) p++;
        t.w1 = p;
    }
    const int rc = gk_skinny_router_tail(nullptr, &t);
    const bool untouched = o.z == r.z0 && o.choice == std::vector<int32_t>(rows, -7);
    char what[200];
    std::snprintf(what, sizeof what, "refused: %s; nothing written", why);
    report(rc == -1 && untouched, what);
}

int main(int argc, char **argv) {
    if (argc > 1 && !std::strcmp(argv[1], "--quick")) { /* under the thread sanitizer: the narrow cases */
        same_case(3, 64, 5, true);
        same_case(1, 40, 9, false);
        std::printf("gpu-emu: %d passed, %d failed\n", emu_passed(), emu_failed());
        return emu_failed() ? 1 : 0;
    }
    for (int rows : {1, 2, 3, 5, 8}) same_case(rows, 256, 17, true);
    same_case(1, 256, 17, false);
    same_case(4, 64, 5, true);
    same_case(2, 40, 9, false);
    same_case(8, 8, 3, true);
    refused("9 rows", 9, 64, 5, false);
    refused("R 264 (past one warp's reach)", 1, 264, 5, false);
    refused("R 36 (not a multiple of 8)", 1, 36, 5, false);
    refused("W1 not on 16 bytes", 2, 64, 5, true);
    std::printf("gpu-emu: %d passed, %d failed\n", emu_passed(), emu_failed());
    return emu_failed() ? 1 : 0;
}
