/* The fused / grouped ops in kernels.inc against compositions of the plain ops they replace, in float on random
 * inputs and several shapes (N = 1, odd widths, experts with no tokens, every token on one expert, every token
 * skipped). Each test prints its worst relative error: max |fast - ref| / max(1, |ref|). */
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "test.h"
#include "util/util.h"

static float *rnd(ZyRng *rng, long n, double scale) {
    float *p = malloc((size_t)(n ? n : 1) * sizeof *p);
    for (long i = 0; i < n; i++) p[i] = (float)(scale * zy_rng_normal(rng));
    return p;
}

static float *dup(const float *p, long n) {
    float *q = malloc((size_t)(n ? n : 1) * sizeof *q);
    memcpy(q, p, (size_t)n * sizeof *q);
    return q;
}

static double max_err(const float *a, const float *b, long n) {
    double worst = 0;
    for (long i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]) / fmax(1.0, fabs((double)b[i]));
        if (!(e <= worst)) worst = e; /* NaN propagates as a failure */
    }
    return worst;
}

/* Normwise: max |a - b| / max |b|, for outputs that are long fp32 sums (GEMMs blocked differently). */
static double norm_err(const float *a, const float *b, long n) {
    double worst = 0, scale = 0;
    for (long i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]);
        if (!(e <= worst)) worst = e;
        scale = fmax(scale, fabs((double)b[i]));
    }
    return scale > 0 ? worst / scale : worst;
}

/* fp32 tolerance: both sides round differently (vectorised reductions, fused passes) by a few ulps. */
#define TOL 2e-6

static const int SHAPES[][2] = {{1, 8}, {1, 128}, {7, 33}, {64, 128}, {300, 96}};
#define NSHAPES (int)(sizeof SHAPES / sizeof SHAPES[0])

TEST(merge_rmsnorm_forward_matches_merge_then_rmsnorm) {
    ZyRng rng;
    zy_rng_seed(&rng, 11);
    double worst = 0;
    for (int s = 0; s < NSHAPES; s++) {
        const int N = SHAPES[s][0], D = SHAPES[s][1];
        const long n = (long)N * D;
        float *h = rnd(&rng, n, 1), *res = rnd(&rng, n, 1), *hs = rnd(&rng, D, 1), *hb = rnd(&rng, D, 0.1);
        float *rs = rnd(&rng, D, 1), *rb = rnd(&rng, D, 0.1), *w = rnd(&rng, D, 1);
        float *out = rnd(&rng, n, 1), *y = rnd(&rng, n, 1), *rstd = rnd(&rng, N, 1);
        float *out_r = rnd(&rng, n, 1), *y_r = rnd(&rng, n, 1), *rstd_r = rnd(&rng, N, 1);
        merge_rmsnorm_forward(out, y, rstd, h, res, hs, hb, rs, rb, w, N, D, 1e-5f);
        residual_merge_forward(out_r, h, res, hs, hb, rs, rb, N, D);
        rmsnorm_forward(y_r, rstd_r, out_r, w, N, D, 1e-5f);
        worst = fmax(worst, fmax(max_err(out, out_r, n), fmax(max_err(y, y_r, n), max_err(rstd, rstd_r, N))));
        free(h), free(res), free(hs), free(hb), free(rs), free(rb), free(w), free(out), free(y), free(rstd);
        free(out_r), free(y_r), free(rstd_r);
    }
    printf("    max rel error %.3g\n", worst);
    CHECK(worst < TOL);
}

TEST(rmsnorm_merge_backward_matches_rmsnorm_then_merge_backward) {
    ZyRng rng;
    zy_rng_seed(&rng, 12);
    double worst = 0;
    for (int s = 0; s < NSHAPES; s++) {
        const int N = SHAPES[s][0], D = SHAPES[s][1];
        const long n = (long)N * D;
        float *du = rnd(&rng, n, 1), *x = rnd(&rng, n, 1), *w = rnd(&rng, D, 1), *h = rnd(&rng, n, 1);
        float *res = rnd(&rng, n, 1), *hs = rnd(&rng, D, 1), *hb = rnd(&rng, D, 0.1), *rs = rnd(&rng, D, 1);
        float *rb = rnd(&rng, D, 0.1), *rstd = rnd(&rng, N, 0.5), *dx = rnd(&rng, n, 1), *dx_r = dup(dx, n);
        float *dh = rnd(&rng, n, 1), *dh_r = calloc((size_t)n, 4), *dres_r = calloc((size_t)n, 4);
        float *g = rnd(&rng, 5 * D, 1), *g_r = dup(g, 5 * D); /* dw, dhs, dhb, drs, drb accumulate onto these */
        rmsnorm_merge_backward(dx, dh, g, g + D, g + 2 * D, g + 3 * D, g + 4 * D, du, x, w, rstd, h, res, hs, hb, rs,
                               rb, N, D);
        rmsnorm_backward(dx_r, g_r, du, x, w, rstd, N, D);
        residual_merge_backward(dh_r, dres_r, g_r + D, g_r + 2 * D, g_r + 3 * D, g_r + 4 * D, dx_r, h, res, hs, hb, rs,
                                rb, N, D);
        worst = fmax(worst, fmax(max_err(dx, dres_r, n), fmax(max_err(dh, dh_r, n), max_err(g, g_r, 5 * D))));
        free(du), free(x), free(w), free(h), free(res), free(hs), free(hb), free(rs), free(rb), free(rstd), free(dx);
        free(dx_r), free(dh), free(dh_r), free(dres_r), free(g), free(g_r);
    }
    printf("    max rel error %.3g\n", worst);
    CHECK(worst < TOL);
}

TEST(router_state_fusions_match_plain_ops) {
    ZyRng rng;
    zy_rng_seed(&rng, 13);
    double worst = 0;
    for (int s = 0; s < NSHAPES; s++)
        for (int with_prev = 0; with_prev < 2; with_prev++) {
            const int N = SHAPES[s][0], D = SHAPES[s][1];
            const long n = (long)N * D;
            float *z = rnd(&rng, n, 1), *b = rnd(&rng, D, 0.1), *r = rnd(&rng, n, 1), *gam = rnd(&rng, D, 1);
            float *w = rnd(&rng, D, 1), *zn = rnd(&rng, n, 1), *rstd = rnd(&rng, N, 1), *z_r = dup(z, n);
            float *zn_r = rnd(&rng, n, 1), *rstd_r = rnd(&rng, N, 1);
            const float *rp = with_prev ? r : NULL;
            /* forward: z + b (+ r ⊙ γ), RMSNorm */
            state_rmsnorm_forward(z, zn, rstd, b, rp, gam, w, N, D, 1e-5f);
            for (long i = 0; i < n; i++) {
                z_r[i] += b[i % D];
                if (rp) z_r[i] += rp[i] * gam[i % D];
            }
            rmsnorm_forward(zn_r, rstd_r, z_r, w, N, D, 1e-5f);
            worst = fmax(worst, fmax(max_err(z, z_r, n), fmax(max_err(zn, zn_r, n), max_err(rstd, rstd_r, N))));
            /* backward past the norm: dbias, dγ, dr_prev */
            float *dz = rnd(&rng, n, 1), *dr = rnd(&rng, n, 1), *dg = rnd(&rng, 2 * D, 1), *dg_r = dup(dg, 2 * D);
            float *dr_r = dup(dr, n);
            state_backward(dr, dg, dg + D, dz, rp, gam, N, D);
            for (int i = 0; i < D; i++) {
                double ab = 0, ag = 0;
                for (int q = 0; q < N; q++) {
                    ab += dz[(long)q * D + i];
                    if (rp) ag += (double)dz[(long)q * D + i] * rp[(long)q * D + i];
                }
                dg_r[D + i] += (float)ab;
                if (rp) dg_r[i] += (float)ag;
            }
            if (rp)
                for (long i = 0; i < n; i++) dr_r[i] = dz[i] * gam[i % D];
            worst = fmax(worst, fmax(max_err(dr, dr_r, n), max_err(dg, dg_r, 2 * D)));
            free(z), free(b), free(r), free(gam), free(w), free(zn), free(rstd), free(z_r), free(zn_r), free(rstd_r);
            free(dz), free(dr), free(dg), free(dg_r), free(dr_r);
        }
    printf("    max rel error %.3g\n", worst);
    CHECK(worst < TOL);
}

TEST(bias_gelu_fusions_match_plain_ops) {
    ZyRng rng;
    zy_rng_seed(&rng, 14);
    double worst = 0;
    for (int s = 0; s < NSHAPES; s++) {
        const int N = SHAPES[s][0], D = SHAPES[s][1];
        const long n = (long)N * D;
        float *pre = rnd(&rng, n, 2), *b = rnd(&rng, D, 0.5), *y = rnd(&rng, n, 1), *pre_r = dup(pre, n);
        float *y_r = rnd(&rng, n, 1);
        bias_gelu_forward(pre, y, b, N, D);
        for (long i = 0; i < n; i++) pre_r[i] += b[i % D];
        gelu_forward(y_r, pre_r, n);
        worst = fmax(worst, fmax(max_err(pre, pre_r, n), max_err(y, y_r, n)));
        float *dy = rnd(&rng, n, 1), *dpre = rnd(&rng, n, 1), *dpre_r = calloc((size_t)n, 4);
        float *db = rnd(&rng, D, 1), *db_r = dup(db, D);
        gelu_bias_backward(dpre, db, dy, pre, N, D);
        gelu_backward(dpre_r, dy, pre_r, n);
        linear_backward(NULL, NULL, db_r, dpre_r, NULL, NULL, N, 0, D, NULL);
        worst = fmax(worst, fmax(max_err(dpre, dpre_r, n), max_err(db, db_r, D)));
        /* y may alias pre (decoding keeps no pre-activation) */
        float *al = dup(pre_r, n);
        for (long i = 0; i < n; i++) al[i] -= b[i % D];
        bias_gelu_forward(al, al, b, N, D);
        worst = fmax(worst, max_err(al, y_r, n));
        free(pre), free(b), free(y), free(pre_r), free(y_r), free(dy), free(dpre), free(dpre_r), free(db), free(db_r);
        free(al);
    }
    printf("    max rel error %.3g\n", worst);
    CHECK(worst < TOL);
}

/* ---- experts: the grouped path against the per-expert loop it replaced (gather rows, linear, swiglu, linear,
 * scale by the gate; backward through the same plain ops). The grouped path runs its GEMMs on row blocks, which
 * OpenBLAS sums in another order: errors are normwise (max |fast - ref| / max |ref| per output tensor). --------- */
typedef enum { ROUTE_RANDOM, ROUTE_SOME_EMPTY, ROUTE_ONE_EXPERT, ROUTE_ALL_SKIP } Routing;

static void group(const int32_t *choice, int N, int E, int32_t *off, int32_t *sorted) {
    memset(off, 0, (size_t)(E + 1) * sizeof *off);
    for (int r = 0; r < N; r++)
        if (choice[r] < E) off[choice[r] + 1]++;
    for (int e = 0; e < E; e++) off[e + 1] += off[e];
    int32_t *cur = malloc((size_t)(E + 1) * sizeof *cur);
    memcpy(cur, off, (size_t)(E + 1) * sizeof *cur);
    for (int r = 0; r < N; r++)
        if (choice[r] < E) sorted[cur[choice[r]]++] = r;
    free(cur);
}

static double check_experts(int N, int D, int I, int E, Routing routing, uint64_t seed) {
    ZyRng rng;
    zy_rng_seed(&rng, seed);
    int32_t *choice = malloc((size_t)N * 4), *off = malloc((size_t)(E + 1) * 4), *sorted = malloc((size_t)N * 4);
    for (int r = 0; r < N; r++) {
        int c = (int)(zy_rng_next(&rng) % (uint64_t)(E + 1));
        if (routing == ROUTE_SOME_EMPTY) c = c % 2 ? E : (E > 1 ? 1 : 0); /* experts 0 and 2.. get nothing */
        if (routing == ROUTE_ONE_EXPERT) c = E - 1;
        if (routing == ROUTE_ALL_SKIP) c = E;
        choice[r] = c;
    }
    group(choice, N, E, off, sorted);
    const long nD = (long)N * D;
    float *u = rnd(&rng, nD, 1), *gate = rnd(&rng, N, 1), *wgu = rnd(&rng, (long)E * 2 * I * D, 0.2);
    float *wd = rnd(&rng, (long)E * D * I, 0.2);
    float *out = rnd(&rng, nD, 1), *xin = calloc((size_t)nD + 1, 4), *gu = calloc((size_t)N * 2 * I + 1, 4);
    float *act = calloc((size_t)N * I + 1, 4), *y = calloc((size_t)nD + 1, 4);
    moe_experts_forward(out, xin, gu, act, y, u, gate, choice, sorted, off, (ZyWeights){.f32 = wgu},
                        (ZyWeights){.f32 = wd}, N, D, I, E, NULL);
    /* reference forward */
    float *out_r = calloc((size_t)nD + 1, 4), *rx = calloc((size_t)nD + 1, 4), *rgu = calloc((size_t)N * 2 * I + 1, 4);
    float *ract = calloc((size_t)N * I + 1, 4), *ry = calloc((size_t)nD + 1, 4);
    for (int e = 0; e < E; e++) {
        const int s = off[e], n = off[e + 1] - off[e];
        if (!n) continue;
        for (int k = 0; k < n; k++) memcpy(rx + (long)(s + k) * D, u + (long)sorted[s + k] * D, (size_t)D * 4);
        linear_forward(rgu + (long)s * 2 * I, rx + (long)s * D, wgu + (long)e * 2 * I * D, NULL, n, D, 2 * I, NULL);
        swiglu_forward(ract + (long)s * I, rgu + (long)s * 2 * I, n, I);
        linear_forward(ry + (long)s * D, ract + (long)s * I, wd + (long)e * D * I, NULL, n, I, D, NULL);
        for (int k = 0; k < n; k++)
            for (int i = 0; i < D; i++) out_r[(long)sorted[s + k] * D + i] = gate[sorted[s + k]] * ry[(long)(s + k) * D + i];
    }
    const int nr = off[E];
    double worst = fmax(norm_err(out, out_r, nD), fmax(norm_err(act, ract, (long)nr * I), norm_err(y, ry, (long)nr * D)));
    /* backward */
    float *dout = rnd(&rng, nD, 1), *dgate = rnd(&rng, N, 1), *dgate_r = dup(dgate, N);
    float *du = rnd(&rng, nD, 1), *du_r = dup(du, nD);
    float *dwgu = rnd(&rng, (long)E * 2 * I * D, 1), *dwgu_r = dup(dwgu, (long)E * 2 * I * D);
    float *dwd = rnd(&rng, (long)E * D * I, 1), *dwd_r = dup(dwd, (long)E * D * I);
    float *dy = calloc((size_t)nD + 1, 4), *dact = calloc((size_t)N * I + 1, 4), *dgu = calloc((size_t)N * 2 * I + 1, 4);
    float *dxin = calloc((size_t)nD + 1, 4);
    moe_gate_backward(dgate, dy, dout, y, gate, sorted, nr, D);
    moe_experts_backward(du, dwgu, dwd, dact, dgu, dxin, dy, xin, gu, act, sorted, off, wgu, wd, D, I, E, NULL);
    float *rdy = calloc((size_t)D + 1, 4);
    for (int e = 0; e < E; e++) {
        const int s = off[e], n = off[e + 1] - off[e];
        if (!n) continue;
        float *ddy = calloc((size_t)n * D, 4), *ddact = calloc((size_t)n * I, 4), *ddgu = calloc((size_t)n * 2 * I, 4);
        float *ddx = calloc((size_t)n * D, 4);
        for (int k = 0; k < n; k++) {
            const int row = sorted[s + k];
            double dg = 0;
            for (int i = 0; i < D; i++) {
                dg += (double)dout[(long)row * D + i] * ry[(long)(s + k) * D + i];
                ddy[(long)k * D + i] = gate[row] * dout[(long)row * D + i];
            }
            dgate_r[row] += (float)dg;
        }
        linear_backward(ddact, dwd_r + (long)e * D * I, NULL, ddy, ract + (long)s * I, wd + (long)e * D * I, n, I, D,
                        NULL);
        swiglu_backward(ddgu, ddact, rgu + (long)s * 2 * I, n, I);
        linear_backward(ddx, dwgu_r + (long)e * 2 * I * D, NULL, ddgu, rx + (long)s * D, wgu + (long)e * 2 * I * D, n,
                        D, 2 * I, NULL);
        for (int k = 0; k < n; k++)
            for (int i = 0; i < D; i++) du_r[(long)sorted[s + k] * D + i] += ddx[(long)k * D + i];
        free(ddy), free(ddact), free(ddgu), free(ddx);
    }
    worst = fmax(worst, fmax(norm_err(dgate, dgate_r, N), norm_err(du, du_r, nD)));
    worst = fmax(worst, fmax(norm_err(dwgu, dwgu_r, (long)E * 2 * I * D), norm_err(dwd, dwd_r, (long)E * D * I)));
    free(choice), free(off), free(sorted), free(u), free(gate), free(wgu), free(wd), free(out), free(xin), free(gu);
    free(act), free(y), free(out_r), free(rx), free(rgu), free(ract), free(ry), free(dout), free(dgate), free(dgate_r);
    free(du), free(du_r), free(dwgu), free(dwgu_r), free(dwd), free(dwd_r), free(dy), free(dact), free(dgu);
    free(dxin), free(rdy);
    return worst;
}

TEST(grouped_experts_match_per_expert_reference) {
    static const struct {
        int N, D, I, E;
        Routing routing;
    } cases[] = {
        {1, 8, 16, 4, ROUTE_RANDOM},       {1, 8, 16, 4, ROUTE_ONE_EXPERT}, {1, 8, 16, 4, ROUTE_ALL_SKIP},
        {37, 16, 24, 4, ROUTE_RANDOM},     {37, 16, 24, 4, ROUTE_SOME_EMPTY}, {37, 16, 24, 4, ROUTE_ONE_EXPERT},
        {37, 16, 24, 4, ROUTE_ALL_SKIP},   {256, 64, 96, 8, ROUTE_RANDOM},  {300, 33, 20, 1, ROUTE_RANDOM},
        {2048, 128, 256, 4, ROUTE_RANDOM},
    };
    double worst = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        double e = check_experts(cases[i].N, cases[i].D, cases[i].I, cases[i].E, cases[i].routing, 100 + i);
        CHECK_MSG(e < 1e-5, "case %zu (N=%d D=%d I=%d E=%d routing %d): max rel error %.3g", i, cases[i].N, cases[i].D,
                  cases[i].I, cases[i].E, (int)cases[i].routing, e);
        worst = fmax(worst, e);
    }
    printf("    max normwise error %.3g\n", worst);
}

/* ---- the vectorised float exp/erfc paths (kernels.c) against the double (libm) ops, inside their range and
 * across the fallback boundary (rows with |x| beyond it take libm) ---------------------------------------------- */
TEST(vectorised_activations_match_double_reference) {
    ZyRng rng;
    zy_rng_seed(&rng, 15);
    const int rows = 9, I = 300; /* row 0: small, rows 1..: up to ±4^r, so later rows take the libm path */
    const long n = (long)rows * 2 * I;
    float *gu = malloc((size_t)n * 4), *act = malloc((size_t)rows * I * 4), *dact = malloc((size_t)rows * I * 4);
    float *dgu = calloc((size_t)n, 4), *y = malloc((size_t)n * 4), *dx = calloc((size_t)n, 4), *dy = malloc((size_t)n * 4);
    double *gu_d = malloc((size_t)n * 8), *act_d = malloc((size_t)rows * I * 8), *dact_d = malloc((size_t)rows * I * 8);
    double *dgu_d = calloc((size_t)n, 8), *y_d = malloc((size_t)n * 8), *dx_d = calloc((size_t)n, 8);
    double *dy_d = malloc((size_t)n * 8);
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < 2 * I; i++) {
            long j = (long)r * 2 * I + i;
            gu[j] = (float)(zy_rng_normal(&rng) * (r == 0 ? 1.0 : pow(4.0, r - 1)));
            gu_d[j] = gu[j];
            dy[j] = (float)zy_rng_normal(&rng);
            dy_d[j] = dy[j];
        }
    for (long i = 0; i < (long)rows * I; i++) dact_d[i] = dact[i] = (float)zy_rng_normal(&rng);
    swiglu_forward(act, gu, rows, I);
    swiglu_forward_f64(act_d, gu_d, rows, I);
    swiglu_backward(dgu, dact, gu, rows, I);
    swiglu_backward_f64(dgu_d, dact_d, gu_d, rows, I);
    gelu_forward(y, gu, n);
    gelu_forward_f64(y_d, gu_d, n);
    gelu_backward(dx, dy, gu, n);
    gelu_backward_f64(dx_d, dy_d, gu_d, n);
    double e_silu = 0, e_gelu = 0;
    for (long i = 0; i < (long)rows * I; i++) e_silu = fmax(e_silu, fabs(act[i] - act_d[i]) / fmax(1, fabs(act_d[i])));
    for (long i = 0; i < n; i++) {
        e_silu = fmax(e_silu, fabs(dgu[i] - dgu_d[i]) / fmax(1, fabs(dgu_d[i])));
        e_gelu = fmax(e_gelu, fabs(y[i] - y_d[i]) / fmax(1, fabs(y_d[i])));
        e_gelu = fmax(e_gelu, fabs(dx[i] - dx_d[i]) / fmax(1, fabs(dx_d[i])));
    }
    /* cross-entropy: logit spreads inside and beyond the fast exp's range */
    const int R = 6, V = 257;
    float *logits = malloc((size_t)R * V * 4), *dl = malloc((size_t)R * V * 4), *rl = malloc((size_t)R * 4);
    double *logits_d = malloc((size_t)R * V * 8), *dl_d = malloc((size_t)R * V * 8), *rl_d = malloc((size_t)R * 8);
    int32_t targets[6] = {0, 5, 256, -1, 17, 100};
    for (int r = 0; r < R; r++)
        for (int v = 0; v < V; v++) logits_d[r * V + v] = logits[r * V + v] = (float)(zy_rng_normal(&rng) * pow(5.0, r));
    double loss = cross_entropy(dl, rl, logits, targets, R, V, 1.0);
    double loss_d = cross_entropy_f64(dl_d, rl_d, logits_d, targets, R, V, 1.0);
    double e_ce = fabs(loss - loss_d) / fmax(1, fabs(loss_d));
    for (long i = 0; i < (long)R * V; i++) e_ce = fmax(e_ce, fabs(dl[i] - dl_d[i]));
    printf("    max rel error: silu %.3g, gelu %.3g, cross-entropy %.3g\n", e_silu, e_gelu, e_ce);
    CHECK(e_silu < 2e-6);
    CHECK(e_gelu < 2e-6);
    CHECK(e_ce < 2e-6);
    free(gu), free(act), free(dact), free(dgu), free(y), free(dx), free(dy), free(gu_d), free(act_d), free(dact_d);
    free(dgu_d), free(y_d), free(dx_d), free(dy_d), free(logits), free(dl), free(rl), free(logits_d), free(dl_d);
    free(rl_d);
}

/* ---- CCA steps 5-6: l2norm (with and without temperature) then partial RoPE, fused, forward and backward ---- */
TEST(l2norm_rope_fusions_match_plain_ops) {
    ZyRng rng;
    zy_rng_seed(&rng, 16);
    static const int shapes[][5] = {/* rows, T, H, dh, rd */ {1, 1, 2, 8, 4}, {6, 3, 4, 16, 16}, {64, 32, 2, 32, 16}};
    double worst = 0;
    for (int sh = 0; sh < 3; sh++)
        for (int with_temp = 0; with_temp < 2; with_temp++) {
            const int rows = shapes[sh][0], T = shapes[sh][1], H = shapes[sh][2], dh = shapes[sh][3], rd = shapes[sh][4];
            const long n = (long)rows * H * dh;
            float *x = rnd(&rng, n, 1), *temp = rnd(&rng, H, 1), *cosv = malloc((size_t)T * rd / 2 * 4);
            float *sinv = malloc((size_t)T * rd / 2 * 4);
            rope_tables(cosv, sinv, T, rd, 10000.0f);
            x[0] = 0; /* a zero head hits the eps clamp */
            for (int i = 1; i < dh; i++) x[i] = 1e-9f;
            const float *tp = with_temp ? temp : NULL, scale = sqrtf((float)dh), eps = 1.1920928955078125e-07f;
            float *y = rnd(&rng, n, 1), *norm = rnd(&rng, (long)rows * H, 1), *y_r = rnd(&rng, n, 1);
            float *norm_r = rnd(&rng, (long)rows * H, 1);
            l2norm_rope_forward(y, norm, x, tp, cosv, sinv, rows, T, H, dh, rd, scale, eps);
            l2norm_forward(y_r, norm_r, x, tp, rows, H, dh, scale, eps);
            rope_forward(y_r, cosv, sinv, rows, T, H, dh, rd);
            worst = fmax(worst, fmax(max_err(y, y_r, n), max_err(norm, norm_r, (long)rows * H)));
            float *dy = rnd(&rng, n, 1), *dy_r = dup(dy, n), *dx = rnd(&rng, n, 1), *dx_r = calloc((size_t)n, 4);
            float *dt = rnd(&rng, H, 1), *dt_r = dup(dt, H);
            rope_l2norm_backward(dx, with_temp ? dt : NULL, dy, x, norm, tp, cosv, sinv, rows, T, H, dh, rd, scale, eps);
            rope_backward(dy_r, cosv, sinv, rows, T, H, dh, rd);
            l2norm_backward(dx_r, with_temp ? dt_r : NULL, dy_r, x, norm_r, tp, rows, H, dh, scale, eps);
            worst = fmax(worst, fmax(max_err(dx, dx_r, n), max_err(dt, dt_r, H)));
            free(x), free(temp), free(cosv), free(sinv), free(y), free(norm), free(y_r), free(norm_r), free(dy), free(dy_r);
            free(dx), free(dx_r), free(dt), free(dt_r);
        }
    printf("    max rel error %.3g\n", worst);
    CHECK(worst < TOL);
}
