/* GPU group "attention": gk_flash_attention_forward / _backward against the CPU flash attention
 * (src/kernels/attention.h, one thread) on random inputs, from T = 1 to a full T = 2048 sequence, over the head sizes that
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
 * orders below what a wrong index, mask or tile boundary produces (>= 1e-2).
 *
 * The tensor-core path (gk_flash_attention_forward_bf16 / _backward_bf16, gpu_attention_tc.cu; bf16 runs): see
 * tc_case below for what it is compared with and why its tolerances are what they are. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/attention.h"
#include "gpu_test.h"
#include "util/util.h"

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
                            size_t n, double tol_inc, double tol_zero) {
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
        gt_assert(t, e <= tol_inc, name, "increment rel err %.2e (tol %.0e)", e, tol_inc);
    } else {
        const double e = base > 0 ? sqrt(num / base) : sqrt(num);
        gt_assert(t, e <= tol_zero, name, "zero gradient: |gpu - cpu| / |preload| %.2e (tol %.0e)", e, tol_zero);
    }
}

/* window > 0: a sliding-window layer (query q sees keys q-window+1 .. q), through the _window entry points */
static void attention_case_w(GpuTest *t, int B, int T, int Hq, int Hkv, int dh, size_t misalign, int window) {
    const size_t nq = (size_t)B * T * Hq * dh, nk = (size_t)B * T * Hkv * dh, nl = (size_t)B * Hq * T;
    char tag[80], nm[160];
    snprintf(tag, sizeof tag, "B%d T%d Hq%d Hkv%d dh%d%s", B, T, Hq, Hkv, dh, misalign ? " unal" : "");
    if (window > 0) snprintf(tag + strlen(tag), sizeof tag - strlen(tag), " window %d", window);

    /* CPU reference, one thread */
    const float *Q = gt_rand(t, nq, 1.0f), *K = gt_rand(t, nk, 1.0f), *V = gt_rand(t, nk, 1.0f);
    const float *dO = gt_rand(t, nq, 1.0f);
    const float *dQ0 = gt_rand(t, nq, 0.5f), *dK0 = gt_rand(t, nk, 0.5f), *dV0 = gt_rand(t, nk, 0.5f);
    float *O = gt_host(t, nq), *L = gt_host(t, nl), *ws = gt_host(t, flash_attention_workspace_floats(dh, 1));
    float *dQ = gt_copy(t, dQ0, nq), *dK = gt_copy(t, dK0, nk), *dV = gt_copy(t, dV0, nk);
    flash_attention_forward(O, L, Q, K, V, B, T, Hq, Hkv, dh, window, ws, 1);
    flash_attention_backward(dQ, dK, dV, dO, O, L, Q, K, V, B, T, Hq, Hkv, dh, window, ws, 1);

    /* forward */
    const float *d_Q = up_at(t, Q, nq, misalign), *d_K = gt_up(t, K, nk), *d_V = gt_up(t, V, nk);
    float *d_O = gt_poison(t, nq), *d_L = gt_poison(t, nl);
    if (window > 0)
        gk_flash_attention_forward_window(t->g->stream, d_O, d_L, d_Q, d_K, d_V, B, T, Hq, Hkv, dh, window);
    else
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
        if (window > 0)
            gk_flash_attention_backward_window(t->g->stream, g[rep][0], g[rep][1], g[rep][2], d_dO, d_Oc, d_Lc, d_Q,
                                               d_K, d_V, B, T, Hq, Hkv, dh, work, window);
        else
            gk_flash_attention_backward(t->g->stream, g[rep][0], g[rep][1], g[rep][2], d_dO, d_Oc, d_Lc, d_Q, d_K, d_V,
                                        B, T, Hq, Hkv, dh, work);
    }
    snprintf(nm, sizeof nm, "bwd dQ += %s", tag);
    gt_check(t, nm, g[0][0], dQ, nq, TOL);
    snprintf(nm, sizeof nm, "bwd dK += %s", tag);
    gt_check(t, nm, g[0][1], dK, nk, TOL);
    snprintf(nm, sizeof nm, "bwd dV += %s", tag);
    gt_check(t, nm, g[0][2], dV, nk, TOL);
    snprintf(nm, sizeof nm, "bwd dQ increment %s", tag);
    check_increment(t, nm, g[0][0], dQ, dQ0, nq, TOL_INC, TOL_ZERO);
    snprintf(nm, sizeof nm, "bwd dK increment %s", tag);
    check_increment(t, nm, g[0][1], dK, dK0, nk, TOL_INC, TOL_ZERO);
    snprintf(nm, sizeof nm, "bwd dV increment %s", tag);
    check_increment(t, nm, g[0][2], dV, dV0, nk, TOL_INC, TOL_ZERO);

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

static void attention_case(GpuTest *t, int B, int T, int Hq, int Hkv, int dh, size_t misalign) {
    attention_case_w(t, B, T, Hq, Hkv, dh, misalign, 0);
}

static void test_gpu_attention_tc(GpuTest *t);
static void test_gpu_attention_cudnn(GpuTest *t);

void test_gpu_attention(GpuTest *t) {
    attention_case(t, 1, 1, 2, 1, 4, 0);       /* one token: O = V, dQ = dK = 0 */
    attention_case(t, 2, 37, 4, 2, 12, 0);     /* one partial tile, small odd-sized heads */
    attention_case(t, 2, 130, 4, 1, 64, 0);    /* three tiles (the last partial), a group of 4 */
    attention_case(t, 1, 300, 2, 2, 128, 0);   /* dh 128, no GQA */
    attention_case(t, 2, 65, 2, 2, 33, 0);     /* odd dh: scalar loads */
    attention_case(t, 1, 100, 3, 1, 96, 0);    /* dh below its padded size, a group of 3 */
    attention_case(t, 1, 70, 2, 1, 256, 0);    /* the largest heads, smaller tiles */
    attention_case(t, 1, 129, 4, 2, 64, 1);    /* unaligned pointers: scalar path at dh 64 */
    if (gt_gpu_sized(t, "fp32 B1 T2048 Hq8 Hkv2 dh128")) /* a full sequence at the benchmark's head shape */
        attention_case(t, 1, 2048, 8, 2, 128, 0);
    /* sliding windows: inside one tile, across tile edges (64-query / 32-key blocks), each query alone (1), wider
     * than the sequence (the full causal result), GQA, odd heads, the largest heads, unaligned */
    attention_case_w(t, 2, 40, 4, 2, 8, 0, 5);
    attention_case_w(t, 1, 200, 4, 2, 64, 0, 66);  /* W ≡ 2 mod 32 and 64: the skipped blocks end on block edges */
    attention_case_w(t, 1, 100, 2, 1, 256, 0, 34); /* the same at the 32 / 16 tiles */
    attention_case_w(t, 1, 17, 4, 2, 8, 0, 1);
    attention_case_w(t, 2, 150, 4, 2, 16, 0, 70);
    attention_case_w(t, 2, 130, 4, 1, 64, 0, 64);
    attention_case_w(t, 1, 300, 8, 2, 128, 0, 33);
    attention_case_w(t, 2, 33, 6, 3, 8, 0, 4096);
    attention_case_w(t, 1, 100, 2, 1, 256, 0, 40);
    attention_case_w(t, 1, 129, 4, 2, 12, 1, 31);
    test_gpu_attention_tc(t);
    test_gpu_attention_cudnn(t);
}

/* ---- the tensor-core path: gk_flash_attention_forward_bf16 / gk_flash_attention_backward_bf16 ------------------
 * Reference: the CPU flash attention above run on bf16-ROUNDED Q, K, V, dO (zy_round_bf16). The kernels are given
 * the raw fp32 values and round them themselves (nearest even), so both sides multiply the same numbers; what
 * remains is what the tensor-core path rounds on purpose: P before P V (forward) and Pᵀ dO, dS before dSᵀ Q and
 * dS K (backward), each to bf16 (8 significant bits: relative error <= 2^-8 = 3.9e-3 per element, rms 1.66e-3
 * for a rounding error uniform in half an ulp over log-uniform mantissas). An output is a sum of such terms with
 * independent errors, so its relative L2 error is the rms of the per-term errors: about 1.6e-3 for dQ, dK, dV
 * and 1e-3 for O (each row's largest P is exp(0) = 1, exact). A CPU emulation of these kernels (the real kernel
 * source, a mock WMMA) measured 0.9e-3 to 1.1e-3 for O and 1.5e-3 to 1.75e-3 for the gradient increments over
 * the shapes below, and 1e-7 against a reference that rounds P and dS the same way. Tolerance TOL_TC = 5e-3:
 * 3x the expected error and above the per-element bound 2^-8, while a wrong index, mask, tile edge or scale gives
 * >= 3e-2.
 * LSE never sees a rounded P (the row sums are fp32): it differs only by fp32 summation order and exp2f vs expf,
 * as in the fp32 tests, so the fp32 tolerance TOL applies. The gradients' totals (preload + increment) are
 * checked with TOL_TC too (their error is the increment's, relative to a larger norm).
 * Exact checks at T = 1: P = 1 exactly, so O must equal bf16(V) bit for bit and, without GQA, dV must equal the
 * preload + bf16(dO) (one fp32 add); this pins down the kernels' own input rounding (truncation or a lost rounding
 * would show in about half the elements). Determinism: the forward and the backward run twice, bit-identical.
 * Head sizes other than 64 and 128 fall back to the fp32 kernels: those cases are given the rounded inputs and
 * held to the fp32 tolerances (so they also prove the fallback ran the fp32 path). */
#define TOL_TC 5e-3

/* n floats of a device array equal to host ref bit for bit. */
static void check_bits(GpuTest *t, const char *name, const float *dev, const float *ref, size_t n) {
    const float *h = gt_down(t, dev, n);
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (memcmp(&h[i], &ref[i], sizeof *h) != 0 && !bad++) first = i;
    if (bad)
        gt_assert(t, 0, name, "%zu of %zu differ (first at %zu: %.9g vs %.9g)", bad, n, first, h[first], ref[first]);
    else
        gt_assert(t, 1, name, "%zu values bit-identical", n);
}

static float *rounded_copy(GpuTest *t, const float *x, size_t n) {
    float *r = gt_copy(t, x, n);
    for (size_t i = 0; i < n; i++) r[i] = zy_round_bf16(r[i]);
    return r;
}

static int same_bits(GpuTest *t, const float *a, const float *b, size_t n) {
    const float *x = gt_down(t, a, n), *y = gt_down(t, b, n);
    return memcmp(x, y, n * sizeof *x) == 0;
}

/* A bf16 case: raw random inputs and preloads, their bf16 roundings, and the CPU flash attention's O, LSE and
 * accumulated gradients on the roundings (one thread; window as flash_attention_forward's). */
typedef struct {
    const float *Q, *K, *V, *dO, *dQ0, *dK0, *dV0, *Qr, *Kr, *Vr, *dOr;
    float *O, *L, *dQ, *dK, *dV;
} RoundedCase;
static void rounded_case(GpuTest *t, RoundedCase *c, int B, int T, int Hq, int Hkv, int dh, int window) {
    const size_t nq = (size_t)B * T * Hq * dh, nk = (size_t)B * T * Hkv * dh, nl = (size_t)B * Hq * T;
    c->Q = gt_rand(t, nq, 1.0f), c->K = gt_rand(t, nk, 1.0f), c->V = gt_rand(t, nk, 1.0f);
    c->dO = gt_rand(t, nq, 1.0f);
    c->dQ0 = gt_rand(t, nq, 0.5f), c->dK0 = gt_rand(t, nk, 0.5f), c->dV0 = gt_rand(t, nk, 0.5f);
    c->Qr = rounded_copy(t, c->Q, nq), c->Kr = rounded_copy(t, c->K, nk), c->Vr = rounded_copy(t, c->V, nk);
    c->dOr = rounded_copy(t, c->dO, nq);
    c->O = gt_host(t, nq), c->L = gt_host(t, nl);
    float *ws = gt_host(t, flash_attention_workspace_floats(dh, 1));
    c->dQ = gt_copy(t, c->dQ0, nq), c->dK = gt_copy(t, c->dK0, nk), c->dV = gt_copy(t, c->dV0, nk);
    flash_attention_forward(c->O, c->L, c->Qr, c->Kr, c->Vr, B, T, Hq, Hkv, dh, window, ws, 1);
    flash_attention_backward(c->dQ, c->dK, c->dV, c->dOr, c->O, c->L, c->Qr, c->Kr, c->Vr, B, T, Hq, Hkv, dh, window,
                             ws, 1);
}

static void tc_case(GpuTest *t, int B, int T, int Hq, int Hkv, int dh, int window, size_t misalign) {
    const int tc = dh == 64 || dh == 128; /* else the fp32 fallback */
    const double tol = tc ? TOL_TC : TOL, tol_inc = tc ? TOL_TC : TOL_INC;
    const size_t nq = (size_t)B * T * Hq * dh, nk = (size_t)B * T * Hkv * dh, nl = (size_t)B * Hq * T;
    char tag[96], nm[180];
    snprintf(tag, sizeof tag, "bf16 B%d T%d Hq%d Hkv%d dh%d window %d%s%s", B, T, Hq, Hkv, dh, window,
             misalign ? " unal" : "", tc ? "" : " (fp32 fallback)");

    /* raw inputs, their bf16 roundings, and the CPU reference on the roundings (one thread) */
    RoundedCase ref;
    rounded_case(t, &ref, B, T, Hq, Hkv, dh, window);
    const float *Q = ref.Q, *K = ref.K, *V = ref.V, *dO = ref.dO, *dQ0 = ref.dQ0, *dK0 = ref.dK0, *dV0 = ref.dV0;
    const float *Qr = ref.Qr, *Kr = ref.Kr, *Vr = ref.Vr, *dOr = ref.dOr, *O = ref.O, *L = ref.L;
    const float *dQ = ref.dQ, *dK = ref.dK, *dV = ref.dV;

    /* forward, twice */
    const float *d_Q = up_at(t, tc ? Q : Qr, nq, misalign), *d_K = gt_up(t, tc ? K : Kr, nk);
    const float *d_V = gt_up(t, tc ? V : Vr, nk);
    float *d_O[2], *d_L[2];
    for (int rep = 0; rep < 2; rep++) {
        d_O[rep] = gt_poison(t, nq), d_L[rep] = gt_poison(t, nl);
        gk_flash_attention_forward_bf16(t->g->stream, d_O[rep], d_L[rep], d_Q, d_K, d_V, B, T, Hq, Hkv, dh, window);
    }
    snprintf(nm, sizeof nm, "fwd O %s", tag);
    gt_check(t, nm, d_O[0], O, nq, tol);
    snprintf(nm, sizeof nm, "fwd LSE %s", tag);
    gt_check(t, nm, d_L[0], L, nl, TOL);
    const int fsame = same_bits(t, d_O[0], d_O[1], nq) && same_bits(t, d_L[0], d_L[1], nl);
    snprintf(nm, sizeof nm, "fwd deterministic %s", tag);
    gt_assert(t, fsame, nm, "%s", fsame ? "two runs bit-identical" : "two runs differ");
    if (T == 1 && tc) { /* O = bf16(V) of the head's kv head, exactly */
        float *want = gt_host(t, nq);
        for (size_t r = 0; r < (size_t)B; r++)
            for (int h = 0; h < Hq; h++)
                for (int d = 0; d < dh; d++)
                    want[(r * Hq + h) * dh + d] = Vr[(r * Hkv + h / (Hq / Hkv)) * dh + d];
        snprintf(nm, sizeof nm, "fwd T=1: O == bf16(V) %s", tag);
        check_bits(t, nm, d_O[0], want, nq);
    }

    /* backward from the CPU's O and LSE, twice into fresh preloaded gradients */
    const float *d_dO = up_at(t, tc ? dO : dOr, nq, misalign), *d_Oc = gt_up(t, O, nq), *d_Lc = gt_up(t, L, nl);
    const long wf = gk_flash_attention_bf16_work_floats(B, T, Hq, Hkv, dh);
    snprintf(nm, sizeof nm, "bwd work size %s", tag);
    gt_assert(t, wf >= gk_flash_attention_work_floats(B, T, Hq), nm, "%ld floats (covers the fp32 kernels' need)", wf);
    float *work = gt_dev(t, (size_t)wf * sizeof(float));
    float *g[2][3];
    for (int rep = 0; rep < 2; rep++) {
        g[rep][0] = up_at(t, dQ0, nq, misalign), g[rep][1] = gt_up(t, dK0, nk), g[rep][2] = gt_up(t, dV0, nk);
        gk_flash_attention_backward_bf16(t->g->stream, g[rep][0], g[rep][1], g[rep][2], d_dO, d_Oc, d_Lc, d_Q, d_K,
                                         d_V, B, T, Hq, Hkv, dh, work, window);
    }
    snprintf(nm, sizeof nm, "bwd dQ += %s", tag);
    gt_check(t, nm, g[0][0], dQ, nq, tol);
    snprintf(nm, sizeof nm, "bwd dK += %s", tag);
    gt_check(t, nm, g[0][1], dK, nk, tol);
    snprintf(nm, sizeof nm, "bwd dV += %s", tag);
    gt_check(t, nm, g[0][2], dV, nk, tol);
    snprintf(nm, sizeof nm, "bwd dQ increment %s", tag);
    check_increment(t, nm, g[0][0], dQ, dQ0, nq, tol_inc, TOL_ZERO);
    snprintf(nm, sizeof nm, "bwd dK increment %s", tag);
    check_increment(t, nm, g[0][1], dK, dK0, nk, tol_inc, TOL_ZERO);
    snprintf(nm, sizeof nm, "bwd dV increment %s", tag);
    check_increment(t, nm, g[0][2], dV, dV0, nk, tol_inc, TOL_ZERO);
    if (T == 1 && tc && Hq == Hkv) { /* dV = preload + 1 · bf16(dO), exactly */
        float *want = gt_host(t, nk);
        for (size_t i = 0; i < nk; i++) want[i] = dV0[i] + dOr[i];
        snprintf(nm, sizeof nm, "bwd T=1: dV == pre + bf16(dO) %s", tag);
        check_bits(t, nm, g[0][2], want, nk);
    }
    const size_t n[3] = {nq, nk, nk};
    int same = 1;
    for (int k = 0; k < 3; k++) same &= same_bits(t, g[0][k], g[1][k], n[k]);
    snprintf(nm, sizeof nm, "bwd deterministic %s", tag);
    gt_assert(t, same, nm, "%s", same ? "two runs bit-identical" : "two runs differ");
    gt_reset(t);
}

/* ---- cuDNN's fused SDPA: gk_cudnn_attention_forward / _backward (gpu_attention_cudnn.cpp, ZAYA_GPU_ATTENTION) ------
 * Reference: the CPU flash attention on bf16-rounded Q, K, V, dO, as for the tensor-core path, with a sliding window
 * where the case has one. cuDNN rounds what the tensor-core path rounds (P, dS) and, in addition, its results: O and
 * dQ, dK, dV come back as bf16 (relative error <= 2^-9 each, rms ~1.1e-3), which adds to the ~1.6e-3 of the internal
 * roundings: ~2e-3 expected for O and the increments. Tolerance TOL_CUDNN = 8e-3 (4x), still below what a wrong
 * mask, window edge, GQA mapping or layout gives (>= 3e-2). LSE is cuDNN's softmax statistics, fp32: it must match the
 * CPU's natural-log LSE to TOL_TC (the backward reads it back; a base-2 or unscaled convention would be ~0.3 off).
 * The backward runs from cuDNN's own O and LSE (its path is fwd and bwd together), twice: bit-identical (the
 * deterministic algorithm). Runs where the library loads; with ZAYA_GPU_ATTENTION=cudnn set, not loading fails. */
#define TOL_CUDNN 8e-3

static void cudnn_case(GpuTest *t, int B, int T, int Hq, int Hkv, int dh, int window) {
    const size_t nq = (size_t)B * T * Hq * dh, nk = (size_t)B * T * Hkv * dh, nl = (size_t)B * Hq * T;
    char tag[96], nm[180];
    snprintf(tag, sizeof tag, "cuDNN B%d T%d Hq%d Hkv%d dh%d window %d", B, T, Hq, Hkv, dh, window);
    snprintf(nm, sizeof nm, "plan %s", tag);
    const int planned = gk_cudnn_attention_plan(B, T, Hq, Hkv, dh, window);
    gt_assert(t, planned, nm, "%s", planned ? "both passes' graphs built" : gk_cudnn_attention_status());
    if (!planned) return;
    RoundedCase cpu;
    rounded_case(t, &cpu, B, T, Hq, Hkv, dh, window);
    const float *Q = cpu.Q, *K = cpu.K, *V = cpu.V, *dO = cpu.dO, *dQ0 = cpu.dQ0, *dK0 = cpu.dK0, *dV0 = cpu.dV0;
    const float *O = cpu.O, *L = cpu.L, *dQ = cpu.dQ, *dK = cpu.dK, *dV = cpu.dV;

    const float *d_Q = gt_up(t, Q, nq), *d_K = gt_up(t, K, nk), *d_V = gt_up(t, V, nk), *d_dO = gt_up(t, dO, nq);
    float *d_O = gt_poison(t, nq), *d_L = gt_poison(t, nl);
    int rc = gk_cudnn_attention_forward(t->g->stream, d_O, d_L, d_Q, d_K, d_V, B, T, Hq, Hkv, dh, window);
    snprintf(nm, sizeof nm, "fwd ran %s", tag);
    gt_assert(t, rc == 0, nm, "returned %d: %s", rc, gk_cudnn_attention_status());
    snprintf(nm, sizeof nm, "fwd O %s", tag);
    gt_check(t, nm, d_O, O, nq, TOL_CUDNN);
    snprintf(nm, sizeof nm, "fwd LSE %s", tag);
    gt_check(t, nm, d_L, L, nl, TOL_TC);
    float *g[2][3];
    for (int rep = 0; rep < 2; rep++) {
        g[rep][0] = gt_up(t, dQ0, nq), g[rep][1] = gt_up(t, dK0, nk), g[rep][2] = gt_up(t, dV0, nk);
        rc |= gk_cudnn_attention_backward(t->g->stream, g[rep][0], g[rep][1], g[rep][2], d_dO, d_O, d_L, d_Q, d_K, d_V,
                                          B, T, Hq, Hkv, dh, window);
    }
    snprintf(nm, sizeof nm, "bwd ran %s", tag);
    gt_assert(t, rc == 0, nm, "returned %d: %s", rc, gk_cudnn_attention_status());
    const char *what[3] = {"dQ", "dK", "dV"};
    const float *ref[3] = {dQ, dK, dV}, *pre[3] = {dQ0, dK0, dV0};
    const size_t n[3] = {nq, nk, nk};
    int same = 1;
    for (int k = 0; k < 3; k++) {
        snprintf(nm, sizeof nm, "bwd %s += %s", what[k], tag);
        gt_check(t, nm, g[0][k], ref[k], n[k], TOL_CUDNN);
        snprintf(nm, sizeof nm, "bwd %s increment %s", what[k], tag);
        check_increment(t, nm, g[0][k], ref[k], pre[k], n[k], TOL_CUDNN, TOL_ZERO);
        same &= same_bits(t, g[0][k], g[1][k], n[k]);
    }
    snprintf(nm, sizeof nm, "bwd deterministic %s", tag);
    gt_assert(t, same, nm, "%s", same ? "two runs bit-identical" : "two runs differ");
    gt_reset(t);
}

static void test_gpu_attention_cudnn(GpuTest *t) {
    const char *want = getenv("ZAYA_GPU_ATTENTION");
    if (!gk_cudnn_attention_available()) {
        if (want && !strcmp(want, "cudnn"))
            gt_assert(t, 0, "cuDNN attention loads (ZAYA_GPU_ATTENTION=cudnn)", "%s", gk_cudnn_attention_status());
        else
            printf("  note cuDNN attention not checked here: %s\n", gk_cudnn_attention_status());
        return;
    }
    printf("  note cuDNN attention: %s\n", gk_cudnn_attention_status());
    cudnn_case(t, 1, 37, 4, 2, 64, 0);    /* one partial tile, GQA */
    cudnn_case(t, 2, 300, 8, 2, 128, 0);  /* the benchmark's heads, two sequences */
    cudnn_case(t, 1, 2048, 8, 2, 128, 0); /* a full sequence */
    cudnn_case(t, 2, 200, 4, 1, 64, 0);   /* a group of 4 query heads */
    cudnn_case(t, 2, 200, 4, 1, 64, 200); /* a window of T: plain causal (the graph above, no new build) */
    cudnn_case(t, 1, 300, 8, 2, 128, 64); /* a sliding-window layer: the window's edge */
    cudnn_case(t, 2, 100, 4, 2, 64, 1);   /* window 1: each query sees itself only */
}

static void test_gpu_attention_tc(GpuTest *t) {
    tc_case(t, 1, 1, 2, 2, 64, 0, 0);  /* one token: O = bf16(V), dV = bf16(dO), dQ = dK = 0 */
    tc_case(t, 1, 1, 4, 2, 128, 0, 0);  /* the same at dh 128, with GQA */
    tc_case(t, 2, 37, 4, 2, 64, 0, 0);  /* one partial tile */
    tc_case(t, 2, 37, 4, 2, 128, 0, 0);
    tc_case(t, 1, 300, 2, 1, 64, 0, 0);  /* five tiles, the last partial */
    tc_case(t, 1, 300, 8, 2, 128, 0, 0);  /* the benchmark's heads (8 query, 2 kv), a partial last tile */
    tc_case(t, 2, 130, 8, 2, 64, 0, 0);  /* bench-medium's heads, two sequences, a partial tile */
    tc_case(t, 2, 200, 4, 2, 128, 0, 0);  /* several tiles and sequences at dh 128 */
    tc_case(t, 2, 130, 4, 1, 64, 0, 0);  /* a group of 4 query heads, a 2-query last tile */
    tc_case(t, 1, 129, 2, 2, 128, 0, 1);  /* unaligned Q, dO, dQ: the scalar loads */
    tc_case(t, 1, 77, 4, 2, 64, 0, 1);  /* the same at dh 64 */
    if (gt_gpu_sized(t, "bf16 B1 T2048 Hq8 Hkv2 dh128")) /* a full sequence at the benchmark's head shape */
        tc_case(t, 1, 2048, 8, 2, 128, 0, 0);
    tc_case(t, 2, 37, 4, 2, 12, 0, 0);  /* other head sizes: the fp32 kernels */
    tc_case(t, 1, 100, 2, 1, 32, 0, 0);
    /* sliding windows (written without a GPU; ZAYA_GPU_WINDOW_TC=off takes bf16 runs back to the fp32 kernels) */
    tc_case(t, 1, 300, 8, 2, 128, 64, 0);  /* a key tile: the windows start on tile edges */
    tc_case(t, 2, 200, 4, 1, 64, 1, 0);  /* each query sees itself only: dQ, dK increments zero */
    tc_case(t, 2, 130, 4, 2, 64, 40, 1);  /* off the tile sizes; unaligned: the scalar loads */
    tc_case(t, 1, 260, 2, 2, 128, 66, 0);  /* ≡ 2 mod 32 and 64: the windows end on the dK/dV query tiles' edges */
    if (gt_gpu_sized(t, "bf16 B1 T2048 Hq8 Hkv2 dh128 window 512")) /* the same, windowed */
        tc_case(t, 1, 2048, 8, 2, 128, 512, 0);
    tc_case(t, 1, 100, 2, 1, 64, 100, 0);  /* a window of T: plain causal */
    tc_case(t, 1, 100, 2, 1, 32, 20, 0);  /* another head size: the fp32 kernels with the window */
}
