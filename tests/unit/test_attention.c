/* The fused flash attention (src/attention.c) against the reference attention_forward/attention_backward of
 * kernels.inc, in fp32 on random inputs over many shapes: T across tile boundaries, head sizes 8..128, GQA groups,
 * one and several threads (which takes the one-pass and the two-pass backward), extreme logits, and the +=
 * semantics of the gradients. Errors are measured relative to the largest magnitude of each reference tensor. */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "kernels.h"
#include "test.h"
#include "util.h"

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
    flash_attention_forward(O, LSE, Q, K, V, B, T, Hq, Hkv, dh, work, threads);
    flash_attention_backward(dQ, dK, dV, dO, O, LSE, Q, K, V, B, T, Hq, Hkv, dh, work, threads);
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
    flash_attention_forward(O, LSE, Q, K, V, B, T, Hq, Hkv, dh, work, 2);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < Hq; h++)
            for (int d = 0; d < dh; d++) /* causality: token 0 attends only to itself */
                CHECK_NEAR(O[(long)b * T * Hq * dh + h * dh + d], V[(long)b * T * Hkv * dh + (h / 2) * dh + d], 1e-6);
    flash_attention_backward(g1[0], g1[1], g1[2], dO, O, LSE, Q, K, V, B, T, Hq, Hkv, dh, work, 2);
    for (int rep = 0; rep < 2; rep++)
        flash_attention_backward(g2[0], g2[1], g2[2], dO, O, LSE, Q, K, V, B, T, Hq, Hkv, dh, work, 2);
    const int n[3] = {nq, nk, nk};
    double worst = 0;
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < n[k]; i++) worst = fmax(worst, fabs(g2[k][i] - 2 * g1[k][i]) / fmax(1.0, fabs(g1[k][i])));
    CHECK_MSG(worst < 1e-6, "two backward calls give twice one: %.3g", worst);
    free(Q), free(K), free(V), free(dO), free(O), free(LSE), free(work);
    for (int k = 0; k < 3; k++) free(g1[k]), free(g2[k]);
}
