/* GPU group "attention": gk_flash_attention_forward / _backward against the CPU flash attention
 * (src/attention.h, one thread) on random inputs, from T = 1 to a full T = 2048 sequence, over the head sizes that
 * take different GPU paths (dh 4, 12, 33: padded tiles and scalar loads; 64, 128: the hot sizes; 96: dh below its
 * padded size; 256: the smaller tiles) and GQA groups of 1 to 4 query heads.
 *
 * Forward: O and LSE, poisoned before the launch. Backward: run from the CPU's O and LSE (so it is checked on its
 * own), with dQ, dK, dV preloaded with the same random values on both sides: the totals check the +=, and the
 * increments (total − preload, whose error is that of the gradient alone) are checked more strictly than the
 * totals would show. The backward runs twice into fresh copies: the two results must be bit-identical.
 *
 * Tolerances (relative L2): both sides compute in fp32 and differ only in summation order, FMA contraction and the
 * exponential (a Cephes polynomial on the CPU, exp2f on the GPU); observed errors are <= 1e-6 for O, LSE and the
 * totals. The dQ increment carries cancellation (Σ_k dS = 0 over each row), which amplifies rounding: up to 5e-6
 * observed at T = 2048. So 1e-5 for O, LSE and totals, 5e-5 for increments: 10x headroom over rounding, still
 * orders below what a wrong index, mask or tile boundary produces (>= 1e-2). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "attention.h"
#include "gpu_test.h"

#define TOL 1e-5
#define TOL_INC 5e-5
#define TOL_ZERO 1e-5

/* A device copy of h placed `offset` floats into its allocation: offset 1 breaks 16-byte alignment, which sends
 * the kernels down their scalar load / store path even when dh is a multiple of 4. */
static float *up_at(GpuTest *t, const float *h, size_t n, size_t offset) {
    float *d = (float *)gt_dev(t, (n + offset) * sizeof *d) + offset;
    ZyErr e;
    if (n && gpu_upload(t->g, d, h, n * sizeof *d, &e)) fprintf(stderr, "gpu tests: %s\n", e.msg);
    return d;
}

/* The increment the GPU added to a preloaded gradient against the CPU's: ‖gpu − cpu‖ / ‖cpu − pre‖ (the two
 * totals differ exactly by the increments' difference). Where the true gradient is zero up to rounding (T = 1:
 * dS = P (dP − D) with P = 1, dP = D), the check is instead that the GPU added nothing beyond rounding:
 * ‖gpu − cpu‖ / ‖pre‖. */
static void check_increment(GpuTest *t, const char *name, const float *dev, const float *ref, const float *pre,
                            size_t n) {
    const float *h = gt_down(t, dev, n);
    double num = 0, inc = 0, base = 0;
    int finite = 1;
    for (size_t i = 0; i < n; i++) {
        finite &= isfinite(h[i]) != 0;
        num += ((double)h[i] - ref[i]) * ((double)h[i] - ref[i]);
        inc += ((double)ref[i] - pre[i]) * ((double)ref[i] - pre[i]);
        base += (double)pre[i] * pre[i];
    }
    if (!finite) {
        gt_assert(t, 0, name, "non-finite values");
    } else if (inc >= 1e-6 * base) {
        const double e = sqrt(num / inc);
        gt_assert(t, e <= TOL_INC, name, "increment rel err %.2e (tol %.0e)", e, TOL_INC);
    } else {
        const double e = base > 0 ? sqrt(num / base) : sqrt(num);
        gt_assert(t, e <= TOL_ZERO, name, "zero gradient: |gpu - cpu| / |preload| %.2e (tol %.0e)", e, TOL_ZERO);
    }
}

static void attention_case(GpuTest *t, int B, int T, int Hq, int Hkv, int dh, size_t misalign) {
    const size_t nq = (size_t)B * T * Hq * dh, nk = (size_t)B * T * Hkv * dh, nl = (size_t)B * Hq * T;
    char tag[64], nm[128];
    snprintf(tag, sizeof tag, "B%d T%d Hq%d Hkv%d dh%d%s", B, T, Hq, Hkv, dh, misalign ? " unal" : "");

    /* CPU reference, one thread */
    const float *Q = gt_rand(t, nq, 1.0f), *K = gt_rand(t, nk, 1.0f), *V = gt_rand(t, nk, 1.0f);
    const float *dO = gt_rand(t, nq, 1.0f);
    const float *dQ0 = gt_rand(t, nq, 0.5f), *dK0 = gt_rand(t, nk, 0.5f), *dV0 = gt_rand(t, nk, 0.5f);
    float *O = gt_host(t, nq), *L = gt_host(t, nl), *ws = gt_host(t, flash_attention_workspace_floats(dh, 1));
    float *dQ = gt_copy(t, dQ0, nq), *dK = gt_copy(t, dK0, nk), *dV = gt_copy(t, dV0, nk);
    flash_attention_forward(O, L, Q, K, V, B, T, Hq, Hkv, dh, ws, 1);
    flash_attention_backward(dQ, dK, dV, dO, O, L, Q, K, V, B, T, Hq, Hkv, dh, ws, 1);

    /* forward */
    const float *d_Q = up_at(t, Q, nq, misalign), *d_K = gt_up(t, K, nk), *d_V = gt_up(t, V, nk);
    float *d_O = gt_poison(t, nq), *d_L = gt_poison(t, nl);
    gk_flash_attention_forward(t->g->stream, d_O, d_L, d_Q, d_K, d_V, B, T, Hq, Hkv, dh);
    snprintf(nm, sizeof nm, "fwd O %s", tag);
    gt_check(t, nm, d_O, O, nq, TOL);
    snprintf(nm, sizeof nm, "fwd LSE %s", tag);
    gt_check(t, nm, d_L, L, nl, TOL);

    /* backward from the CPU's O and LSE, twice into fresh preloaded gradients */
    const float *d_dO = up_at(t, dO, nq, misalign), *d_Oc = gt_up(t, O, nq), *d_Lc = gt_up(t, L, nl);
    float *work = gt_dev(t, (size_t)gk_flash_attention_work_floats(B, T, Hq) * sizeof(float));
    float *g[2][3];
    for (int rep = 0; rep < 2; rep++) {
        g[rep][0] = up_at(t, dQ0, nq, misalign), g[rep][1] = gt_up(t, dK0, nk), g[rep][2] = gt_up(t, dV0, nk);
        gk_flash_attention_backward(t->g->stream, g[rep][0], g[rep][1], g[rep][2], d_dO, d_Oc, d_Lc, d_Q, d_K, d_V, B,
                                    T, Hq, Hkv, dh, work);
    }
    snprintf(nm, sizeof nm, "bwd dQ += %s", tag);
    gt_check(t, nm, g[0][0], dQ, nq, TOL);
    snprintf(nm, sizeof nm, "bwd dK += %s", tag);
    gt_check(t, nm, g[0][1], dK, nk, TOL);
    snprintf(nm, sizeof nm, "bwd dV += %s", tag);
    gt_check(t, nm, g[0][2], dV, nk, TOL);
    snprintf(nm, sizeof nm, "bwd dQ increment %s", tag);
    check_increment(t, nm, g[0][0], dQ, dQ0, nq);
    snprintf(nm, sizeof nm, "bwd dK increment %s", tag);
    check_increment(t, nm, g[0][1], dK, dK0, nk);
    snprintf(nm, sizeof nm, "bwd dV increment %s", tag);
    check_increment(t, nm, g[0][2], dV, dV0, nk);

    const size_t n[3] = {nq, nk, nk};
    int same = 1;
    for (int k = 0; k < 3; k++) {
        const float *a = gt_down(t, g[0][k], n[k]), *b = gt_down(t, g[1][k], n[k]);
        same &= memcmp(a, b, n[k] * sizeof *a) == 0;
    }
    snprintf(nm, sizeof nm, "bwd deterministic %s", tag);
    gt_assert(t, same, nm, "%s", same ? "two runs bit-identical" : "two runs differ");
    gt_reset(t);
}

void test_gpu_attention(GpuTest *t) {
    attention_case(t, 1, 1, 2, 1, 4, 0);       /* one token: O = V, dQ = dK = 0 */
    attention_case(t, 2, 37, 4, 2, 12, 0);     /* one partial tile, small odd-sized heads */
    attention_case(t, 2, 130, 4, 1, 64, 0);    /* three tiles (the last partial), a group of 4 */
    attention_case(t, 1, 300, 2, 2, 128, 0);   /* dh 128, no GQA */
    attention_case(t, 2, 65, 2, 2, 33, 0);     /* odd dh: scalar loads */
    attention_case(t, 1, 100, 3, 1, 96, 0);    /* dh below its padded size, a group of 3 */
    attention_case(t, 1, 70, 2, 1, 256, 0);    /* the largest heads, smaller tiles */
    attention_case(t, 1, 129, 4, 2, 64, 1);    /* unaligned pointers: scalar path at dh 64 */
    attention_case(t, 1, 2048, 8, 2, 128, 0);  /* a full sequence at the benchmark's head shape */
}
