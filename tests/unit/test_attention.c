/* The fused flash attention (src/kernels/attention.c) against the reference attention_forward/attention_backward of
 * kernels.inc, in fp32 on random inputs over many shapes: T across tile boundaries, head sizes 8..128, GQA groups,
 * one and several threads (which takes the one-pass and the two-pass backward), extreme logits, and the +=
 * semantics of the gradients; with a sliding window, against the definition in double. Errors are measured relative to the largest magnitude of each reference tensor. */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/attention.h"
#include "kernels/cpu.h"
#include "kernels/kernel_table.h"
#include "kernels/kernels.h"
#include "test.h"
#include "util/util.h"

/* fp32 through different summation orders (tiles, FMA, polynomial exp) over up to 257 keys. */
#define ATTN_TOL 1e-5
/* Logits of magnitude ~100 carry ~100·2^-24 ≈ 6e-6 rounding each (reference and flash alike), amplified a little
 * through exp and the products: measured up to ~1.1e-5. */
#define ATTN_TOL_EXTREME 5e-5

static float *randnf(ZyRng *rng, size_t n, double scale) {
    float *p = malloc((n ? n : 1) * sizeof *p);
    for (size_t i = 0; i < n; i++) p[i] = (float)(scale * zy_rng_normal(rng));
    return p;
}

static float *copyf(const float *x, size_t n) {
    float *p = malloc((n ? n : 1) * sizeof *p);
    memcpy(p, x, n * sizeof *p);
    return p;
}

/* max |a - b| / max(1, max |b|) */
static double rel_err(const float *a, const float *b, size_t n) {
    double worst = 0, big = 1;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]);
        if (!(e <= worst)) worst = e; /* NaN sticks */
        big = fmax(big, fabs((double)b[i]));
    }
    return worst / big;
}

typedef struct {
    double o, lse, dq, dk, dv;
} AttnErrs;

/* One shape: forward O/LSE and backward dQ/dK/dV (accumulated onto random gradients) vs the reference. */
static AttnErrs compare(int B, int T, int Hq, int Hkv, int dh, double q_scale, int threads, uint64_t seed) {
    ZyRng rng;
    zy_rng_seed(&rng, seed);
    const size_t nq = (size_t)B * T * Hq * dh, nk = (size_t)B * T * Hkv * dh;
    float *Q = randnf(&rng, nq, q_scale), *K = randnf(&rng, nk, 1), *V = randnf(&rng, nk, 1);
    float *dO = randnf(&rng, nq, 1);
    float *dQ0 = randnf(&rng, nq, 1), *dK0 = randnf(&rng, nk, 1), *dV0 = randnf(&rng, nk, 1);
    float *P = malloc((size_t)B * Hq * T * T * sizeof *P), *dP = malloc((size_t)T * T * sizeof *dP);
    float *O_ref = malloc(nq * sizeof *O_ref), *O = malloc(nq * sizeof *O), *LSE = malloc((size_t)B * Hq * T * 4);
    float *dQ_ref = copyf(dQ0, nq), *dK_ref = copyf(dK0, nk), *dV_ref = copyf(dV0, nk);
    float *dQ = copyf(dQ0, nq), *dK = copyf(dK0, nk), *dV = copyf(dV0, nk);
    float *work = malloc(flash_attention_workspace_floats(dh, threads) * sizeof *work);
    attention_forward(O_ref, P, Q, K, V, B, T, Hq, Hkv, dh);
    attention_backward(dQ_ref, dK_ref, dV_ref, dP, dO, P, Q, K, V, B, T, Hq, Hkv, dh);
    flash_attention_forward(O, LSE, Q, K, V, B, T, Hq, Hkv, dh, 0, work, threads);
    flash_attention_backward(dQ, dK, dV, dO, O, LSE, Q, K, V, B, T, Hq, Hkv, dh, 0, work, threads);
    /* LSE in double from the definition, on query rows of the first and last batch entries */
    const int G = Hq / Hkv, ldq = Hq * dh, ldk = Hkv * dh;
    double lse_err = 0;
    for (int b = 0; b < B; b += B > 1 ? B - 1 : 1)
        for (int h = 0; h < Hq; h++)
            for (int t = 0; t < T; t++) {
                const float *q = Q + ((long)b * T + t) * ldq + h * dh;
                double mx = -INFINITY, *sc = malloc((size_t)(t + 1) * sizeof *sc), sum = 0;
                for (int s = 0; s <= t; s++) {
                    const float *k = K + ((long)b * T + s) * ldk + (h / G) * dh;
                    double dot = 0;
                    for (int d = 0; d < dh; d++) dot += (double)q[d] * k[d];
                    sc[s] = dot / sqrt((double)dh);
                    mx = fmax(mx, sc[s]);
                }
                for (int s = 0; s <= t; s++) sum += exp(sc[s] - mx);
                const double want = mx + log(sum), got = LSE[((long)b * Hq + h) * T + t];
                const double e = fabs(got - want) / fmax(1.0, fabs(want));
                if (!(e <= lse_err)) lse_err = e;
                free(sc);
            }
    AttnErrs r = {rel_err(O, O_ref, nq), lse_err, rel_err(dQ, dQ_ref, nq), rel_err(dK, dK_ref, nk),
                  rel_err(dV, dV_ref, nk)};
    free(Q), free(K), free(V), free(dO), free(dQ0), free(dK0), free(dV0), free(P), free(dP), free(O_ref), free(O);
    free(LSE), free(dQ_ref), free(dK_ref), free(dV_ref), free(dQ), free(dK), free(dV), free(work);
    return r;
}

static void worst_of(AttnErrs *w, AttnErrs e) {
    w->o = fmax(w->o, e.o), w->lse = fmax(w->lse, e.lse), w->dq = fmax(w->dq, e.dq);
    w->dk = fmax(w->dk, e.dk), w->dv = fmax(w->dv, e.dv);
}

static int errs_ok(AttnErrs e, double tol) {
    return e.o <= tol && e.lse <= tol && e.dq <= tol && e.dk <= tol && e.dv <= tol;
}

TEST(flash_attention_matches_reference_over_shapes) {
    static const int Ts[] = {1, 2, 3, 17, 63, 64, 65, 130, 257};
    static const int dhs[] = {8, 16, 32, 64, 128};
    static const int heads[][2] = {{1, 1}, {4, 2}, {6, 3}, {8, 1}};
    const int nthreads[] = {1, omp_get_max_threads() > 1 ? omp_get_max_threads() : 2};
    AttnErrs worst = {0};
    int cases = 0;
    for (int ti = 0; ti < 9; ti++)
        for (int di = 0; di < 5; di++) {
            /* every T meets every head size; head layouts, batch sizes and thread counts rotate through */
            const int *hv = heads[(ti + di) % 4], B = 1 + (ti * 5 + di) % 3, threads = nthreads[(ti + di / 2) % 2];
            if (Ts[ti] >= 130 && dhs[di] == 128 && B * hv[0] > 8) continue; /* keeps the sanitizer build quick */
            AttnErrs e = compare(B, Ts[ti], hv[0], hv[1], dhs[di], 1.0, threads, 100 + cases);
            CHECK_MSG(errs_ok(e, ATTN_TOL), "B=%d T=%d Hq=%d Hkv=%d dh=%d threads=%d: O %.3g LSE %.3g dQ %.3g dK %.3g dV %.3g",
                      B, Ts[ti], hv[0], hv[1], dhs[di], threads, e.o, e.lse, e.dq, e.dk, e.dv);
            worst_of(&worst, e);
            cases++;
        }
    printf("    %d shapes, worst relative error: O %.2g LSE %.2g dQ %.2g dK %.2g dV %.2g\n", cases, worst.o, worst.lse,
           worst.dq, worst.dk, worst.dv);
}

TEST(flash_attention_one_and_two_pass_backward_agree_with_reference) {
    /* B*Hkv = 1 group with several threads splits the backward by key tile plus a dQ pass; 1 thread does one pass */
    const int many = omp_get_max_threads() > 1 ? omp_get_max_threads() : 2;
    AttnErrs a = compare(1, 200, 4, 1, 32, 1.0, many, 7), b = compare(1, 200, 4, 1, 32, 1.0, 1, 7);
    CHECK_MSG(errs_ok(a, ATTN_TOL), "split: dQ %.3g dK %.3g dV %.3g", a.dq, a.dk, a.dv);
    CHECK_MSG(errs_ok(b, ATTN_TOL), "one pass: dQ %.3g dK %.3g dV %.3g", b.dq, b.dk, b.dv);
}

TEST(flash_attention_is_stable_for_extreme_logits) {
    /* query norms ~30x: logits of order ±100-300, near one-hot rows; the LSE keeps exp from overflowing */
    AttnErrs worst = {0};
    static const int shapes[][5] = {{2, 130, 4, 2, 32}, {1, 65, 8, 1, 64}, {3, 17, 6, 3, 16}};
    for (int i = 0; i < 3; i++) {
        const int *s = shapes[i];
        AttnErrs e = compare(s[0], s[1], s[2], s[3], s[4], 30.0, omp_get_max_threads(), 40 + i);
        CHECK_MSG(errs_ok(e, ATTN_TOL_EXTREME), "shape %d: O %.3g LSE %.3g dQ %.3g dK %.3g dV %.3g", i, e.o, e.lse, e.dq,
                  e.dk, e.dv);
        worst_of(&worst, e);
    }
    printf("    extreme logits, worst relative error: O %.2g LSE %.2g dQ %.2g dK %.2g dV %.2g\n", worst.o, worst.lse,
           worst.dq, worst.dk, worst.dv);
}

TEST(flash_attention_first_row_is_its_value_and_gradients_accumulate) {
    ZyRng rng;
    zy_rng_seed(&rng, 3);
    const int B = 2, T = 70, Hq = 4, Hkv = 2, dh = 16, nq = B * T * Hq * dh, nk = B * T * Hkv * dh;
    float *Q = randnf(&rng, nq, 1), *K = randnf(&rng, nk, 1), *V = randnf(&rng, nk, 1), *dO = randnf(&rng, nq, 1);
    float *O = malloc(nq * 4), *LSE = malloc(B * Hq * T * 4), *work = malloc(flash_attention_workspace_floats(dh, 2) * 4);
    float *g1[3] = {calloc(nq, 4), calloc(nk, 4), calloc(nk, 4)}, *g2[3] = {calloc(nq, 4), calloc(nk, 4), calloc(nk, 4)};
    flash_attention_forward(O, LSE, Q, K, V, B, T, Hq, Hkv, dh, 0, work, 2);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < Hq; h++)
            for (int d = 0; d < dh; d++) /* causality: token 0 attends only to itself */
                CHECK_NEAR(O[(long)b * T * Hq * dh + h * dh + d], V[(long)b * T * Hkv * dh + (h / 2) * dh + d], 1e-6);
    flash_attention_backward(g1[0], g1[1], g1[2], dO, O, LSE, Q, K, V, B, T, Hq, Hkv, dh, 0, work, 2);
    for (int rep = 0; rep < 2; rep++)
        flash_attention_backward(g2[0], g2[1], g2[2], dO, O, LSE, Q, K, V, B, T, Hq, Hkv, dh, 0, work, 2);
    const int n[3] = {nq, nk, nk};
    double worst = 0;
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < n[k]; i++) worst = fmax(worst, fabs(g2[k][i] - 2 * g1[k][i]) / fmax(1.0, fabs(g1[k][i])));
    CHECK_MSG(worst < 1e-6, "two backward calls give twice one: %.3g", worst);
    free(Q), free(K), free(V), free(dO), free(O), free(LSE), free(work);
    for (int k = 0; k < 3; k++) free(g1[k]), free(g2[k]);
}

/* ---- sliding windows ------------------------------------------------------------------------------------------
 * Query t sees keys t-W+1..t (transformers' sliding_window mask, config.h). The reference is the definition in
 * double, independent of both kernels: per (b, h, t) the scores over the window, softmax, O, LSE, and the gradients
 * of Σ O·dO: dV_s += P_ts dO_t, dS_ts = P_ts (dO_t·V_s - Σ_s' P_ts' dO_t·V_s'), dQ_t += dS_ts K_s / √dh,
 * dK_s += dS_ts Q_t / √dh. */

typedef struct {
    double *O, *LSE, *dQ, *dK, *dV;
} NaiveOut;

static NaiveOut naive_window_attention(const float *Q, const float *K, const float *V, const float *dO, int B, int T,
                                       int Hq, int Hkv, int dh, int W) {
    const int G = Hq / Hkv, ldq = Hq * dh, ldk = Hkv * dh;
    const size_t nq = (size_t)B * T * ldq, nk = (size_t)B * T * ldk;
    NaiveOut r = {calloc(nq, 8), calloc((size_t)B * Hq * T, 8), calloc(nq, 8), calloc(nk, 8), calloc(nk, 8)};
    const double scale = 1.0 / sqrt((double)dh);
    double *p = malloc(sizeof(double) * (size_t)T), *dp = malloc(sizeof(double) * (size_t)T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < Hq; h++)
            for (int t = 0; t < T; t++) {
                const int s0 = W > 0 && t - W + 1 > 0 ? t - W + 1 : 0;
                const float *q = Q + ((long)b * T + t) * ldq + h * dh, *g = dO + ((long)b * T + t) * ldq + h * dh;
                double mx = -INFINITY, sum = 0, dot_pdp = 0;
                for (int s = s0; s <= t; s++) {
                    const float *k = K + ((long)b * T + s) * ldk + (h / G) * dh;
                    double d = 0;
                    for (int i = 0; i < dh; i++) d += (double)q[i] * k[i];
                    p[s] = d * scale;
                    mx = fmax(mx, p[s]);
                }
                for (int s = s0; s <= t; s++) sum += (p[s] = exp(p[s] - mx));
                r.LSE[((long)b * Hq + h) * T + t] = mx + log(sum);
                double *o = r.O + ((long)b * T + t) * ldq + h * dh;
                for (int s = s0; s <= t; s++) {
                    p[s] /= sum;
                    const float *v = V + ((long)b * T + s) * ldk + (h / G) * dh;
                    double d = 0;
                    for (int i = 0; i < dh; i++) o[i] += p[s] * v[i], d += (double)g[i] * v[i];
                    dp[s] = d;
                    dot_pdp += p[s] * d;
                }
                for (int s = s0; s <= t; s++) {
                    const long ko = ((long)b * T + s) * ldk + (h / G) * dh;
                    const double ds = p[s] * (dp[s] - dot_pdp) * scale;
                    double *dq = r.dQ + ((long)b * T + t) * ldq + h * dh;
                    for (int i = 0; i < dh; i++) {
                        dq[i] += ds * K[ko + i];
                        r.dK[ko + i] += ds * q[i];
                        r.dV[ko + i] += p[s] * g[i];
                    }
                }
            }
    free(p), free(dp);
    return r;
}

static void naive_free(NaiveOut *r) { free(r->O), free(r->LSE), free(r->dQ), free(r->dK), free(r->dV); }

/* max |a - b| / max(1, max |b|), b in double */
static double rel_err_d(const float *a, const double *b, size_t n) {
    double worst = 0, big = 1;
    for (size_t i = 0; i < n; i++) {
        const double e = fabs((double)a[i] - b[i]);
        if (!(e <= worst)) worst = e;
        big = fmax(big, fabs(b[i]));
    }
    return worst / big;
}

/* One shape and window through a kernel table: flash forward and backward (onto zeroed gradients) vs the
 * reference. */
static AttnErrs compare_window(const ZyKernelTable *kt, int B, int T, int Hq, int Hkv, int dh, int W, double q_scale,
                               int threads, uint64_t seed) {
    ZyRng rng;
    zy_rng_seed(&rng, seed);
    const size_t nq = (size_t)B * T * Hq * dh, nk = (size_t)B * T * Hkv * dh;
    float *Q = randnf(&rng, nq, q_scale), *K = randnf(&rng, nk, 1), *V = randnf(&rng, nk, 1), *dO = randnf(&rng, nq, 1);
    float *O = malloc(nq * 4), *LSE = malloc((size_t)B * Hq * T * 4), *dQ = calloc(nq, 4), *dK = calloc(nk, 4);
    float *dV = calloc(nk, 4), *work = malloc(kt->flash_attention_workspace_floats(dh, threads) * sizeof *work);
    kt->flash_attention_forward(O, LSE, Q, K, V, B, T, Hq, Hkv, dh, W, work, threads);
    kt->flash_attention_backward(dQ, dK, dV, dO, O, LSE, Q, K, V, B, T, Hq, Hkv, dh, W, work, threads);
    NaiveOut r = naive_window_attention(Q, K, V, dO, B, T, Hq, Hkv, dh, W);
    AttnErrs e = {rel_err_d(O, r.O, nq), rel_err_d(LSE, r.LSE, (size_t)B * Hq * T), rel_err_d(dQ, r.dQ, nq),
                  rel_err_d(dK, r.dK, nk), rel_err_d(dV, r.dV, nk)};
    naive_free(&r);
    free(Q), free(K), free(V), free(dO), free(O), free(LSE), free(dQ), free(dK), free(dV), free(work);
    return e;
}

TEST(flash_attention_sliding_window_matches_the_definition) {
    /* windows of 1 (only itself), inside a tile, one tile (64) and either side of it, several tiles, and W >= T
     * (plain causal); T on and off tile boundaries; MHA, GQA and MQA heads; 1 and several threads (the one- and
     * two-pass backward) */
    static const int Ts[] = {1, 5, 63, 64, 65, 130, 200, 257};
    static const int Ws[] = {1, 2, 7, 63, 64, 65, 100, 129, 256, 300};
    static const int heads[][2] = {{2, 2}, {4, 2}, {6, 3}, {4, 1}};
    static const int dhs[] = {8, 16, 32, 64};
    const int many = omp_get_max_threads() > 1 ? omp_get_max_threads() : 2;
    AttnErrs worst = {0};
    int cases = 0;
    for (size_t ti = 0; ti < ZY_ARRAY_LEN(Ts); ti++)
        for (size_t wi = 0; wi < ZY_ARRAY_LEN(Ws); wi++) {
            const int T = Ts[ti], W = Ws[wi], k = (int)(ti * 3 + wi);
            if (W > T + 64) continue; /* far past T is the W >= T case again */
            const int *hv = heads[k % 4], dh = dhs[(k / 4) % 4], B = 1 + k % 2, threads = k % 3 ? many : 1;
            AttnErrs e = compare_window(zy_kernels(), B, T, hv[0], hv[1], dh, W, 1.0, threads, 500 + k);
            CHECK_MSG(errs_ok(e, ATTN_TOL), "B=%d T=%d W=%d Hq=%d Hkv=%d dh=%d threads=%d: O %.3g LSE %.3g dQ %.3g dK "
                      "%.3g dV %.3g", B, T, W, hv[0], hv[1], dh, threads, e.o, e.lse, e.dq, e.dk, e.dv);
            worst_of(&worst, e);
            cases++;
        }
    /* extreme logits: near one-hot rows inside the window */
    AttnErrs x = compare_window(zy_kernels(), 2, 150, 4, 2, 32, 40, 30.0, many, 77);
    CHECK_MSG(errs_ok(x, ATTN_TOL_EXTREME), "extreme: O %.3g LSE %.3g dQ %.3g dK %.3g dV %.3g", x.o, x.lse, x.dq, x.dk,
              x.dv);
    /* the one-pass backward on one group with several threads goes two-pass */
    AttnErrs y = compare_window(zy_kernels(), 1, 200, 4, 1, 32, 70, 1.0, many, 78);
    CHECK_MSG(errs_ok(y, ATTN_TOL), "two-pass: dQ %.3g dK %.3g dV %.3g", y.dq, y.dk, y.dv);
    printf("    %d shapes and windows, worst relative error: O %.2g LSE %.2g dQ %.2g dK %.2g dV %.2g\n", cases, worst.o,
           worst.lse, worst.dq, worst.dk, worst.dv);
}

TEST(flash_attention_sliding_window_at_every_cpu_level) {
    ZyCpuInfo ci;
    zy_cpu_detect(&ci);
    int levels = 0;
    for (int l = 0; l < ZY_CPU_LEVELS; l++) {
        if (!zy_cpu_supports(&ci, (ZyCpuLevel)l)) continue;
        const ZyKernelTable *kt = zy_kernel_table((ZyCpuLevel)l);
        AttnErrs e = compare_window(kt, 2, 141, 6, 2, 24, 67, 1.0, 2, 90 + l);
        CHECK_MSG(errs_ok(e, ATTN_TOL), "%s: O %.3g LSE %.3g dQ %.3g dK %.3g dV %.3g", kt->level, e.o, e.lse, e.dq, e.dk,
                  e.dv);
        levels++;
    }
    CHECK(levels >= 1);
}

TEST(flash_attention_window_of_t_or_more_is_the_causal_path_bit_for_bit) {
    ZyRng rng;
    zy_rng_seed(&rng, 11);
    const int B = 2, T = 130, Hq = 4, Hkv = 2, dh = 16;
    const size_t nq = (size_t)B * T * Hq * dh, nk = (size_t)B * T * Hkv * dh, nl = (size_t)B * Hq * T;
    float *Q = randnf(&rng, nq, 1), *K = randnf(&rng, nk, 1), *V = randnf(&rng, nk, 1), *dO = randnf(&rng, nq, 1);
    float *work = malloc(flash_attention_workspace_floats(dh, 2) * sizeof *work);
    float *out[3][5];
    const int Ws[3] = {0, T, 1 << 30};
    for (int w = 0; w < 3; w++) {
        float **o = out[w];
        o[0] = malloc(nq * 4), o[1] = malloc(nl * 4), o[2] = calloc(nq, 4), o[3] = calloc(nk, 4), o[4] = calloc(nk, 4);
        flash_attention_forward(o[0], o[1], Q, K, V, B, T, Hq, Hkv, dh, Ws[w], work, 2);
        flash_attention_backward(o[2], o[3], o[4], dO, o[0], o[1], Q, K, V, B, T, Hq, Hkv, dh, Ws[w], work, 2);
    }
    const size_t n[5] = {nq, nl, nq, nk, nk};
    for (int w = 1; w < 3; w++)
        for (int i = 0; i < 5; i++) CHECK_MSG(memcmp(out[w][i], out[0][i], n[i] * 4) == 0, "W=%d output %d", Ws[w], i);
    /* and W = 1: each query its own value, gradients only to its own key's value (dQ, dK are 0 up to the rounding
     * of dO·V - dO·O, summed in two orders) */
    float *O = malloc(nq * 4), *L = malloc(nl * 4), *dQ = calloc(nq, 4), *dK = calloc(nk, 4), *dV = calloc(nk, 4);
    flash_attention_forward(O, L, Q, K, V, B, T, Hq, Hkv, dh, 1, work, 2);
    flash_attention_backward(dQ, dK, dV, dO, O, L, Q, K, V, B, T, Hq, Hkv, dh, 1, work, 2);
    double e = 0, z = 0;
    for (int r = 0; r < B * T; r++)
        for (int h = 0; h < Hq; h++)
            for (int d = 0; d < dh; d++) {
                e = fmax(e, fabs(O[(long)r * Hq * dh + h * dh + d] - V[(long)r * Hkv * dh + (h / 2) * dh + d]));
                z = fmax(z, fabs(dQ[(long)r * Hq * dh + h * dh + d]));
            }
    for (size_t i = 0; i < nk; i++) z = fmax(z, fabs(dK[i]));
    CHECK_MSG(e < 1e-6 && z < 1e-5, "W=1: |O - V| %.3g, |dQ|,|dK| %.3g", e, z);
    for (int w = 0; w < 3; w++)
        for (int i = 0; i < 5; i++) free(out[w][i]);
    free(Q), free(K), free(V), free(dO), free(work), free(O), free(L), free(dQ), free(dK), free(dV);
}

/* The reference's gradients against central differences of its own forward (in double, so they agree to ~1e-8),
 * which makes the comparisons above a gradient check of the kernel: Σ O·dO moved along Q, K and V one entry at a
 * time over a window crossing the sequence start, with GQA. */
TEST(sliding_window_reference_gradients_match_finite_differences) {
    ZyRng rng;
    zy_rng_seed(&rng, 5);
    const int B = 1, T = 9, Hq = 4, Hkv = 2, dh = 4, W = 3;
    const size_t nq = (size_t)B * T * Hq * dh, nk = (size_t)B * T * Hkv * dh;
    float *Q = randnf(&rng, nq, 1), *K = randnf(&rng, nk, 1), *V = randnf(&rng, nk, 1), *dO = randnf(&rng, nq, 1);
    NaiveOut r = naive_window_attention(Q, K, V, dO, B, T, Hq, Hkv, dh, W);
    float *X[3] = {Q, K, V};
    const double *grad[3] = {r.dQ, r.dK, r.dV};
    const size_t n[3] = {nq, nk, nk};
    double worst = 0;
    for (int which = 0; which < 3; which++)
        for (size_t i = 0; i < n[which]; i += 3) {
            const float x0 = X[which][i];
            const float h = 1.0f / 256; /* exact in float, so x ± h is exactly that */
            double f[2];
            for (int sgn = 0; sgn < 2; sgn++) {
                X[which][i] = x0 + (sgn ? -h : h);
                NaiveOut p = naive_window_attention(Q, K, V, dO, B, T, Hq, Hkv, dh, W);
                f[sgn] = 0;
                for (size_t j = 0; j < nq; j++) f[sgn] += p.O[j] * dO[j];
                naive_free(&p);
            }
            X[which][i] = x0;
            const double fd = (f[0] - f[1]) / (2.0 * h);
            worst = fmax(worst, fabs(fd - grad[which][i]) / fmax(1.0, fabs(grad[which][i])));
        }
    CHECK_MSG(worst < 1e-4, "reference gradient vs central difference: %.3g", worst);
    naive_free(&r);
    free(Q), free(K), free(V), free(dO);
}

/* Cached decoding's score kernel (decode_attn_scores) at every CPU level against a double-precision reference:
 * head sizes below, at and off the vector widths, key counts around the vector widths and the 2-vector blocks, query
 * rows around the 6- and 4-row blocks, strided rows, keys stored transposed (channel d of key s at KT[d ldkt + s])
 * with and without readable columns past cnt; the score buffer's columns past cnt untouched. */
TEST(decode_attention_scores_at_every_cpu_level) {
    ZyCpuInfo ci;
    zy_cpu_detect(&ci);
    ZyRng rng;
    zy_rng_seed(&rng, 77);
    const int dhs[] = {4, 8, 16, 24, 64, 72}, cnts[] = {1, 7, 15, 16, 17, 33, 64}, ns[] = {1, 2, 4, 5, 8};
    double worst = 0;
    int levels = 0, cases = 0;
    for (int l = 0; l < ZY_CPU_LEVELS; l++) {
        if (!zy_cpu_supports(&ci, (ZyCpuLevel)l)) continue;
        const ZyKernelTable *kt = zy_kernel_table((ZyCpuLevel)l);
        levels++;
        for (size_t a = 0; a < ZY_ARRAY_LEN(dhs); a++)
            for (size_t b = 0; b < ZY_ARRAY_LEN(cnts); b++)
                for (size_t c = 0; c < ZY_ARRAY_LEN(ns) * 2; c++) {
                    /* the keys' rows end at cnt, or run on (a block's unused columns) */
                    const int dh = dhs[a], cnt = cnts[b], n = ns[c / 2], ldkt = (cnt + 31) / 32 * 32 + 9;
                    const int avail = c % 2 ? ldkt : cnt, ldq = dh + 3, lds = cnt + 5;
                    float *Q = randnf(&rng, (size_t)n * ldq, 1), *KT = randnf(&rng, (size_t)dh * ldkt, 1);
                    float *S = malloc(sizeof(float) * n * lds);
                    for (int i = 0; i < n * lds; i++) S[i] = -9.0f;
                    const float scale = 0.3f;
                    kt->decode_attn_scores(S, lds, Q, ldq, KT, ldkt, n, cnt, avail, dh, scale);
                    for (int t = 0; t < n; t++)
                        for (int j = 0; j < lds; j++) {
                            if (j >= cnt) {
                                CHECK(S[t * lds + j] == -9.0f);
                                continue;
                            }
                            double ref = 0, mag = 0;
                            for (int d = 0; d < dh; d++) {
                                ref += (double)Q[t * ldq + d] * KT[d * ldkt + j];
                                mag += fabs((double)Q[t * ldq + d] * KT[d * ldkt + j]);
                            }
                            const double err = fabs(S[t * lds + j] - scale * ref) / (scale * mag + 1e-30);
                            if (!(err <= worst)) worst = err;
                        }
                    free(Q), free(KT), free(S);
                    cases++;
                }
    }
    printf("    %d cases over %d levels, worst error / scale sum |q k| %.3g\n", cases, levels, worst);
    CHECK(levels >= 1);
    CHECK_MSG(worst < 1e-6, "worst %.3g", worst);
}

/* One query row of cached decoding through the decoding kernels, keys 0..t of head 0 (scores against the transposed
 * keys KT [dh, T] in blocks of bt keys, the softmax step per forward key tile, P V per tile piece, the division):
 * the decoder's order of calls (decode.c's attend_seq_heads) on one row. */
static void decode_row(const ZyKernelTable *kt, float *o, const float *q, const float *KT, const float *V, int T,
                       int t, int W, int dh, int bt, float *s) {
    const int lo = W > 0 && t - W + 1 > 0 ? t - W + 1 : 0, hi = t + 1;
    for (int s0 = lo; s0 < hi;) {
        const int cnt = bt - s0 % bt < hi - s0 ? bt - s0 % bt : hi - s0;
        kt->decode_attn_scores(s + (s0 - lo), hi - lo, q, dh, KT + s0, T, 1, cnt, T - s0, dh,
                               (float)(1.0 / sqrt((double)dh)));
        s0 += cnt;
    }
    float m = -INFINITY;
    double l = 0;
    memset(o, 0, sizeof(float) * (size_t)dh);
    for (int k0 = lo / ZY_ATTN_KEY_TILE * ZY_ATTN_KEY_TILE; k0 < hi; k0 += ZY_ATTN_KEY_TILE) {
        const int c0 = k0 > lo ? k0 : lo, c1 = k0 + ZY_ATTN_KEY_TILE < hi ? k0 + ZY_ATTN_KEY_TILE : hi;
        kt->decode_attn_softmax_tile(s + (c0 - lo), k0, c0, c1, lo, t, &m, &l, o, dh);
        for (int s0 = c0; s0 < c1;) {
            const int cnt = bt - s0 % bt < c1 - s0 ? bt - s0 % bt : c1 - s0;
            kt->decode_attn_values(o, dh, s + (s0 - lo), hi - lo, V + (size_t)s0 * dh, dh, 1, cnt, dh, 1);
            s0 += cnt;
        }
    }
    kt->decode_attn_normalise(o, dh, l);
}

/* Cached decoding's softmax step (decode_attn_softmax_tile, decode_attn_normalise) and value kernel
 * (decode_attn_values) at every CPU level. Decoding one row at a time through them gives the full forward's
 * output bit for bit (the decoder's promise, test_decode.c): sequences across several key tiles, head sizes on and
 * off the vector widths, KV blocks smaller than, equal to and straddling the tiles, plain causal and sliding
 * windows that start on and off the tiles and vectors. The value products alone (1 to 64 rows: a head's prefill
 * queries or a query's heads) against a double-precision reference, with head sizes off the vector widths, strided
 * rows, overwrite and accumulate, the output's columns past dh untouched. */
TEST(decode_attention_softmax_and_values_at_every_cpu_level) {
    ZyCpuInfo ci;
    zy_cpu_detect(&ci);
    ZyRng rng;
    zy_rng_seed(&rng, 78);
    const int dhs[] = {4, 8, 24, 64, 72}, cnts[] = {1, 5, 16}, ns[] = {1, 4, 7, 64};
    const int T = 150, Ws[] = {0, 1, 37, 64, 100}, bts[] = {16, 64, 100};
    double worst_o = 0;
    long rows = 0, rows_differ = 0;
    int levels = 0;
    for (int l = 0; l < ZY_CPU_LEVELS; l++) {
        if (!zy_cpu_supports(&ci, (ZyCpuLevel)l)) continue;
        const ZyKernelTable *kt = zy_kernel_table((ZyCpuLevel)l);
        levels++;
        for (size_t a = 0; a < ZY_ARRAY_LEN(dhs); a++)
            for (size_t w = 0; w < ZY_ARRAY_LEN(Ws); w++) {
                const int dh = dhs[a], W = Ws[w];
                /* queries of size ~3: scores over a few orders of magnitude, rescaled as the max moves */
                float *Q = randnf(&rng, (size_t)T * dh, 3), *K = randnf(&rng, (size_t)T * dh, 1);
                float *V = randnf(&rng, (size_t)T * dh, 1), *O = malloc(sizeof(float) * T * dh);
                float *LSE = malloc(sizeof(float) * T), *KT = malloc(sizeof(float) * T * dh);
                float *o = malloc(sizeof(float) * dh), *s = malloc(sizeof(float) * T);
                float *work = malloc(kt->flash_attention_workspace_floats(dh, 1) * sizeof *work);
                for (int c = 0; c < T; c++)
                    for (int d = 0; d < dh; d++) KT[(size_t)d * T + c] = K[(size_t)c * dh + d];
                kt->flash_attention_forward(O, LSE, Q, K, V, 1, T, 1, 1, dh, W, work, 1);
                for (size_t b = 0; b < ZY_ARRAY_LEN(bts); b++)
                    for (int t = 0; t < T; t++) {
                        decode_row(kt, o, Q + (size_t)t * dh, KT, V, T, t, W, dh, bts[b], s);
                        rows++;
                        rows_differ += memcmp(o, O + (size_t)t * dh, sizeof(float) * (size_t)dh) != 0;
                    }
                free(Q), free(K), free(V), free(O), free(LSE), free(KT), free(o), free(s), free(work);
            }
        for (size_t a = 0; a < ZY_ARRAY_LEN(dhs); a++)
            for (size_t b = 0; b < ZY_ARRAY_LEN(cnts); b++)
                for (size_t c = 0; c < ZY_ARRAY_LEN(ns); c++)
                    for (int acc = 0; acc < 2; acc++) {
                        const int dh = dhs[a], cnt = cnts[b], n = ns[c], ldo = dh + 3, ldp = cnt + 2, ldv = 2 * dh + 1;
                        float *P = randnf(&rng, (size_t)n * ldp, 1), *V = randnf(&rng, (size_t)cnt * ldv, 1);
                        float *O = randnf(&rng, (size_t)n * ldo, 1), *O0 = malloc(sizeof(float) * n * ldo);
                        memcpy(O0, O, sizeof(float) * n * ldo);
                        kt->decode_attn_values(O, ldo, P, ldp, V, ldv, n, cnt, dh, acc);
                        for (int t = 0; t < n; t++)
                            for (int d = 0; d < ldo; d++) {
                                if (d >= dh) {
                                    CHECK(O[t * ldo + d] == O0[t * ldo + d]);
                                    continue;
                                }
                                double r = acc ? O0[t * ldo + d] : 0, mag = fabs(r);
                                for (int s = 0; s < cnt; s++) {
                                    r += (double)P[t * ldp + s] * V[s * ldv + d];
                                    mag += fabs((double)P[t * ldp + s] * V[s * ldv + d]);
                                }
                                worst_o = fmax(worst_o, fabs(O[t * ldo + d] - r) / (mag + 1e-30));
                            }
                        free(P), free(V), free(O), free(O0);
                    }
    }
    printf("    %d levels: %ld decoded rows, %ld differ from the full forward's; values worst error / sum |p v| %.3g\n",
           levels, rows, rows_differ, worst_o);
    CHECK(levels >= 1);
    CHECK_MSG(rows_differ == 0, "%ld of %ld rows differ", rows_differ, rows);
    CHECK_MSG(worst_o < 1e-6, "values %.3g", worst_o);
}

/* The same two products against a cache of bf16 keys and values (decode_attn_scores_bf16, decode_attn_values_bf16)
 * at every CPU level, against double-precision references on the bf16 values: head sizes off the vector widths, key
 * counts around them with and without readable columns past cnt, 1-9 rows (a query's heads in groups of 4, a prefill
 * piece's queries), strided rows, overwrite and accumulate; the outputs' columns past cnt / dh untouched. */
TEST(decode_attention_bf16_cache_at_every_cpu_level) {
    ZyCpuInfo ci;
    zy_cpu_detect(&ci);
    ZyRng rng;
    zy_rng_seed(&rng, 79);
    const int dhs[] = {4, 24, 32, 64, 72}, cnts[] = {1, 7, 16, 17, 40}, ns[] = {1, 3, 4, 9};
    double worst_s = 0, worst_o = 0;
    int levels = 0, cases = 0;
    for (int l = 0; l < ZY_CPU_LEVELS; l++) {
        if (!zy_cpu_supports(&ci, (ZyCpuLevel)l)) continue;
        const ZyKernelTable *kt = zy_kernel_table((ZyCpuLevel)l);
        levels++;
        for (size_t a = 0; a < ZY_ARRAY_LEN(dhs); a++)
            for (size_t b = 0; b < ZY_ARRAY_LEN(cnts); b++)
                for (size_t c = 0; c < ZY_ARRAY_LEN(ns) * 2; c++) {
                    const int dh = dhs[a], cnt = cnts[b], n = ns[c / 2], acc = c % 2;
                    const int ldkt = (cnt + 31) / 32 * 32 + 5, avail = acc ? ldkt : cnt; /* readable columns or not */
                    const int ldq = dh + 3, lds = cnt + 5, ldo = dh + 2, ldv = 2 * dh + 1;
                    float *Q = randnf(&rng, (size_t)n * ldq, 1), *P = randnf(&rng, (size_t)n * lds, 1);
                    float *O = randnf(&rng, (size_t)n * ldo, 1), *O0 = malloc(sizeof(float) * n * ldo);
                    float *S = malloc(sizeof(float) * n * lds);
                    uint16_t *KT = malloc(sizeof(uint16_t) * dh * ldkt), *V = malloc(sizeof(uint16_t) * cnt * ldv);
                    for (int i = 0; i < dh * ldkt; i++) KT[i] = zy_f32_to_bf16((float)zy_rng_normal(&rng));
                    for (int i = 0; i < cnt * ldv; i++) V[i] = zy_f32_to_bf16((float)zy_rng_normal(&rng));
                    for (int i = 0; i < n * lds; i++) S[i] = -9.0f;
                    memcpy(O0, O, sizeof(float) * n * ldo);
                    kt->decode_attn_scores_bf16(S, lds, Q, ldq, KT, ldkt, n, cnt, avail, dh, 0.3f);
                    kt->decode_attn_values_bf16(O, ldo, P, lds, V, ldv, n, cnt, dh, acc);
                    for (int t = 0; t < n; t++) {
                        for (int j = 0; j < lds; j++) {
                            if (j >= cnt) {
                                CHECK(S[t * lds + j] == -9.0f);
                                continue;
                            }
                            double r = 0, mag = 0;
                            for (int d = 0; d < dh; d++) {
                                const double x = (double)Q[t * ldq + d] * zy_bf16_to_f32(KT[d * ldkt + j]);
                                r += x, mag += fabs(x);
                            }
                            worst_s = fmax(worst_s, fabs(S[t * lds + j] - 0.3 * r) / (0.3 * mag + 1e-30));
                        }
                        for (int d = 0; d < ldo; d++) {
                            if (d >= dh) {
                                CHECK(O[t * ldo + d] == O0[t * ldo + d]);
                                continue;
                            }
                            double r = acc ? O0[t * ldo + d] : 0, mag = fabs(r);
                            for (int s = 0; s < cnt; s++) {
                                const double x = (double)P[t * lds + s] * zy_bf16_to_f32(V[s * ldv + d]);
                                r += x, mag += fabs(x);
                            }
                            worst_o = fmax(worst_o, fabs(O[t * ldo + d] - r) / (mag + 1e-30));
                        }
                    }
                    free(Q), free(P), free(O), free(O0), free(S), free(KT), free(V);
                    cases++;
                }
    }
    printf("    %d cases over %d levels: scores worst error / scale sum |q k| %.3g, values / sum |p v| %.3g\n", cases,
           levels, worst_s, worst_o);
    CHECK(levels >= 1);
    CHECK_MSG(worst_s < 1e-6, "scores %.3g", worst_s);
    CHECK_MSG(worst_o < 1e-6, "values %.3g", worst_o);
}
