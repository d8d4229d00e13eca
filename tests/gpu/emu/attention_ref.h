/* The emulator tests' attention reference (test_attention_tc.cpp, test_attention_fp32.cpp): causal GQA softmax
 * attention and its gradients in double, from given Q, K, V, dO, with an optional sliding window (query t sees keys
 * t - window + 1 .. t; 0: all keys up to t). Layouts as gpu_kernels.h: Q, O, dQ, dO [B*T, Hq*dh]; K, V, dK, dV
 * [B*T, Hkv*dh]; LSE [B, Hq, T]. Also the tests' random vectors and relative error (the rest: emu_check.h). */
#ifndef ZAYA_EMU_ATTENTION_REF_H
#define ZAYA_EMU_ATTENTION_REF_H

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "emu_check.h"

struct AttnRef {
    std::vector<double> O, L, dQ, dK, dV;
};

inline AttnRef attention_reference(const std::vector<float> &Q, const std::vector<float> &K,
                                   const std::vector<float> &V, const std::vector<float> &dO, int B, int T, int Hq,
                                   int Hkv, int dh, int window) {
    const int G = Hq / Hkv;
    const size_t nq = (size_t)B * T * Hq * dh, nk = (size_t)B * T * Hkv * dh;
    AttnRef r{std::vector<double>(nq), std::vector<double>((size_t)B * Hq * T), std::vector<double>(nq, 0.0),
              std::vector<double>(nk, 0.0), std::vector<double>(nk, 0.0)};
    const double sc = 1.0 / std::sqrt((double)dh);
    auto qi = [&](int b, int t, int h, int d) { return ((size_t)b * T + t) * Hq * dh + (size_t)h * dh + d; };
    auto ki = [&](int b, int t, int j, int d) { return ((size_t)b * T + t) * Hkv * dh + (size_t)j * dh + d; };
    std::vector<double> p(T), dp(T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < Hq; h++) {
            const int j = h / G;
            for (int t = 0; t < T; t++) {
                const int u0 = window > 0 && t - window + 1 > 0 ? t - window + 1 : 0;
                double mx = -INFINITY, sum = 0;
                for (int u = u0; u <= t; u++) {
                    double s = 0;
                    for (int d = 0; d < dh; d++) s += (double)Q[qi(b, t, h, d)] * K[ki(b, u, j, d)];
                    p[u] = s * sc, mx = std::fmax(mx, p[u]);
                }
                for (int u = u0; u <= t; u++) sum += (p[u] = std::exp(p[u] - mx));
                for (int u = u0; u <= t; u++) p[u] /= sum;
                r.L[((size_t)b * Hq + h) * T + t] = mx + std::log(sum);
                for (int d = 0; d < dh; d++) {
                    double o = 0;
                    for (int u = u0; u <= t; u++) o += p[u] * V[ki(b, u, j, d)];
                    r.O[qi(b, t, h, d)] = o;
                }
                double D = 0;
                for (int u = u0; u <= t; u++) {
                    double s = 0;
                    for (int d = 0; d < dh; d++) s += (double)dO[qi(b, t, h, d)] * V[ki(b, u, j, d)];
                    dp[u] = s, D += p[u] * s;
                }
                for (int u = u0; u <= t; u++) {
                    const double ds = p[u] * (dp[u] - D) * sc;
                    for (int d = 0; d < dh; d++) {
                        r.dV[ki(b, u, j, d)] += p[u] * dO[qi(b, t, h, d)];
                        r.dK[ki(b, u, j, d)] += ds * Q[qi(b, t, h, d)];
                        r.dQ[qi(b, t, h, d)] += ds * K[ki(b, u, j, d)];
                    }
                }
            }
        }
    return r;
}

inline std::vector<float> rand_vec(size_t n, float scale) {
    std::vector<float> v(n);
    for (auto &x : v) x = scale * urand();
    return v;
}
/* ‖a − ref‖ / ‖ref‖ (INFINITY when a has a non-finite value) */
inline double rel_err(const float *a, const double *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!std::isfinite(a[i])) return INFINITY;
        num += (a[i] - ref[i]) * (a[i] - ref[i]), den += ref[i] * ref[i];
    }
    return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

/* The backward's result: g[run][0..2] = dQ, dK, dV of two runs from the same preloads pre[0..2]. Each increment
 * (result − preload) against the reference within tol, and the two runs bit-identical. */
inline void check_increments(const char *tag, const std::vector<float> (&g)[2][3], const std::vector<float> *const pre[3],
                             const AttnRef &ref, double tol) {
    const char *names[3] = {"dQ", "dK", "dV"};
    const std::vector<double> *refs[3] = {&ref.dQ, &ref.dK, &ref.dV};
    char what[240];
    for (int i = 0; i < 3; i++) {
        std::vector<float> inc(g[0][i].size());
        for (size_t e = 0; e < inc.size(); e++) inc[e] = g[0][i][e] - (*pre[i])[e];
        const double ei = rel_err(inc.data(), refs[i]->data(), inc.size());
        const bool same = std::memcmp(g[0][i].data(), g[1][i].data(), inc.size() * sizeof(float)) == 0;
        std::snprintf(what, sizeof what, "backward %s: %s increment rel err %.2e (tol %.0e), two runs %s", tag,
                      names[i], ei, tol, same ? "bit-identical" : "DIFFER");
        report(ei <= tol && same, what);
    }
}

#endif
