/* cuBLASLt products (gpu_gemm) against the CPU's zy_gemm: every transpose pair, odd shapes, row strides wider than
 * the matrix, beta = 1 accumulation; fp32 (no TF32) and bf16 operands with fp32 sums. The grouped expert products
 * (gk_expert_mm, gk_expert_mm_wgrad) against zy_gemm per expert. Strided batches
 * (gpu_gemm_batched) against a loop of zy_gemm: batch 1, 3, 16, strides with gaps (odd and aligned), the gaps and
 * row padding of C never written. Decoding's few-row products (gk_skinny_*) against zy_gemm. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>

#include "gpu_test.h"
#include "kernels/matmul.h"

/* Rounds a host array to bf16 values in place (what the GPU's bf16 operands hold). */
static void round_bf16(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = zy_round_bf16(x[i]);
}

static void one_case(GpuTest *t, int bf16, int ta, int tb, int M, int N, int K, int pad, float beta) {
    const int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
    const size_t na = (size_t)(ta ? K : M) * lda, nb = (size_t)(tb ? N : K) * ldb, nc = (size_t)M * ldc;
    float *A = gt_rand(t, na, 1.0f), *B = gt_rand(t, nb, 1.0f), *C = gt_rand(t, nc, 1.0f);
    float *dA = gt_up(t, A, na), *dB = gt_up(t, B, nb), *dC = gt_up(t, C, nc);
    if (bf16) round_bf16(A, na), round_bf16(B, nb);
    zy_gemm(ta, tb, M, N, K, 0.5f, A, lda, B, ldb, beta, C, ldc);
    t->g->bf16 = bf16;
    ZyErr err = {{0}};
    int rc = gpu_gemm(t->g, ta, tb, M, N, K, 0.5f, dA, NULL, lda, dB, NULL, ldb, beta, dC, ldc, &err);
    t->g->bf16 = 0;
    char name[160];
    snprintf(name, sizeof name, "%s ta%d tb%d %dx%dx%d pad %d beta %g", bf16 ? "bf16" : "fp32", ta, tb, M, N, K, pad,
             beta);
    if (!gt_assert(t, rc == 0, name, "%s", rc ? err.msg : "launched")) return;
    /* both sides sum exact products (bf16 × bf16 fits fp32) in fp32: only the order differs */
    gt_check(t, name, dC, C, nc, 2e-5);
}

static int bits_same(float a, float b) {
    uint32_t x, y;
    memcpy(&x, &a, sizeof x);
    memcpy(&y, &b, sizeof y);
    return x == y;
}

/* batch products, matrix i of A / B / C at i·stride_a / stride_b / stride_c: the strides leave gaps of ga, gb, gc
 * elements after each matrix (its rows × ld block), the row strides are `pad` wider than the rows. A16 (bf16 only):
 * pass a ready bf16 copy of A's whole span instead of letting the product round it. */
static void batched_case(GpuTest *t, int bf16, int ta, int tb, int M, int N, int K, int batch, int pad, int ga, int gb,
                         int gc, float beta, int ready_a16) {
    const int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
    const long long sa = (long long)(ta ? K : M) * lda + ga, sb = (long long)(tb ? N : K) * ldb + gb,
                    sc = (long long)M * ldc + gc;
    const size_t na = (size_t)(batch - 1) * (size_t)sa + (size_t)(ta ? K : M) * lda,
                 nb = (size_t)(batch - 1) * (size_t)sb + (size_t)(tb ? N : K) * ldb,
                 nc = (size_t)(batch - 1) * (size_t)sc + (size_t)M * ldc;
    float *A = gt_rand(t, na, 1.0f), *B = gt_rand(t, nb, 1.0f), *C = gt_rand(t, nc, 1.0f), *C0 = gt_copy(t, C, nc);
    float *dA = gt_up(t, A, na), *dB = gt_up(t, B, nb), *dC = gt_up(t, C, nc);
    uint16_t *A16 = NULL;
    if (bf16 && ready_a16) {
        A16 = gt_dev(t, na * sizeof(uint16_t));
        gk_f32_to_bf16(t->g->stream, A16, dA, (long)na);
    }
    if (bf16) round_bf16(A, na), round_bf16(B, nb);
    for (int i = 0; i < batch; i++)
        zy_gemm(ta, tb, M, N, K, 0.5f, A + (size_t)i * sa, lda, B + (size_t)i * sb, ldb, beta, C + (size_t)i * sc, ldc);
    t->g->bf16 = bf16;
    ZyErr err = {{0}};
    int rc = gpu_gemm_batched(t->g, ta, tb, M, N, K, 0.5f, A16 ? NULL : dA, A16, lda, sa, dB, NULL, ldb, sb, beta, dC,
                              ldc, sc, batch, &err);
    t->g->bf16 = 0;
    char name[160];
    snprintf(name, sizeof name, "batched %s%s ta%d tb%d %dx%dx%d x%d gaps %d/%d/%d", bf16 ? "bf16" : "fp32",
             A16 ? " (A16)" : "", ta, tb, M, N, K, batch, ga, gb, gc);
    if (!gt_assert(t, rc == 0, name, "%s", rc ? err.msg : "launched")) return;
    /* inside the C_i: within tolerance of the loop (only the summation order differs); outside them (gaps, row
     * padding): the start's bits */
    float *h = gt_down(t, dC, nc);
    size_t touched = 0;
    for (size_t e = 0; e < nc; e++) {
        const size_t i = e / (size_t)sc, in_m = e % (size_t)sc;
        const int inside = i < (size_t)batch && in_m < (size_t)M * ldc && (int)(in_m % (size_t)ldc) < N;
        if (!inside) touched += !bits_same(h[e], C0[e]);
    }
    const double rel = gt_rel_err(h, C, nc);
    gt_assert(t, rel <= 2e-5 && touched == 0, name, "rel err %.2e (tol 2e-5), %zu elements outside the C_i written",
              rel, touched);
}

/* Grouped expert products (gk_expert_mm / gk_expert_mm_wgrad, gpu_expert_gemm.cu) against zy_gemm per expert on the
 * same bf16 values: rows grouped by counts[e] (zero counts, rows past the last expert), max_rows >= their sum; the rows
 * and columns outside the experts' products keep their values. wgrad: G_e = A_eᵀ B_e (+ beta G_e) with M = N_out.
 * Both forms of the 16-byte path (gk_expert_kernel: staged, async) run on the same operands: each against the
 * reference, and the two bit for bit. On an sm_90 GPU with the CUTLASS build, the wgmma + TMA form (gk_expert_mm_sm90,
 * called directly) runs them too: against the reference, twice bit for bit, and it must refuse (-1, nothing written)
 * exactly the cases whose bases or leading dimensions are not 16-byte multiples. */
static uint16_t *bf16_up(GpuTest *t, float *h, size_t n) { /* rounds h in place; its bf16 bits on the device */
    round_bf16(h, n);
    uint16_t *d16 = gt_dev(t, n * sizeof(uint16_t));
    gk_f32_to_bf16(t->g->stream, d16, gt_up(t, h, n), (long)n);
    return d16;
}
/* the async form's output (d_async) bit for bit the staged form's (d_staged) */
static void same_forms(GpuTest *t, const char *name, const float *d_staged, const float *d_async, size_t n) {
    float *a = gt_down(t, d_staged, n), *b = gt_down(t, d_async, n);
    size_t differ = 0;
    for (size_t i = 0; i < n; i++) differ += !bits_same(a[i], b[i]);
    char what[200];
    snprintf(what, sizeof what, "%s: async form", name);
    gt_assert(t, differ == 0, what, "%zu of %zu values differ from the staged form's", differ, n);
}
/* The sm90 form's run of a case: d_out its output buffer (a copy of the starting values), ref the reference, n
 * elements; rc the launcher's return, aligned whether the case meets its 16-byte rules. */
static void sm90_case(GpuTest *t, const char *name, int rc, int aligned, float *d_out, const float *ref,
                      const float *start, size_t n) {
    char what[200];
    snprintf(what, sizeof what, "%s: sm90 form", name);
    if (!aligned) {
        float *h = gt_down(t, d_out, n);
        size_t changed = 0;
        for (size_t i = 0; i < n; i++) changed += !bits_same(h[i], start[i]);
        gt_assert(t, rc == -1 && changed == 0, what, "unaligned: returned %d, %zu values written", rc, changed);
        return;
    }
    gt_assert(t, rc == 0, what, "launcher returned %d", rc);
    if (rc == 0) gt_check(t, what, d_out, ref, n, 2e-5);
}
static void expert_case(GpuTest *t, const int *counts, int E, int extra_rows, int N, int K, int pad, int wgrad,
                        int trans_w, float beta) {
    int32_t off[65] = {0};
    for (int e = 0; e < E; e++) off[e + 1] = off[e] + counts[e];
    const int rows = off[E] + extra_rows;
    char name[160];
    if (!wgrad) { /* C[rows, N] (ldc N + pad) = A[rows, K] (lda K + pad) op(W_e) */
        const int lda = K + pad, ldc = N + pad, ldw = trans_w ? K : N;
        const long ws = (long)N * K;
        float *A = gt_rand(t, (size_t)rows * lda, 1), *W = gt_rand(t, (size_t)E * ws, 1);
        float *C = gt_rand(t, (size_t)rows * ldc, 1);
        const uint16_t *A16 = bf16_up(t, A, (size_t)rows * lda), *W16 = bf16_up(t, W, (size_t)E * ws);
        float *dC = gt_up(t, C, (size_t)rows * ldc), *dCa = gt_up(t, C, (size_t)rows * ldc);
        float *dCs = gt_up(t, C, (size_t)rows * ldc), *C0 = malloc((size_t)rows * ldc * sizeof(float));
        if (C0) memcpy(C0, C, (size_t)rows * ldc * sizeof(float));
        const int32_t *doff = gt_up_i(t, off, (size_t)E + 1);
        const int form = gk_expert_kernel(-1);
        gk_expert_kernel(GK_EXPERT_STAGED);
        gk_expert_mm(t->g->stream, doff, E, rows, N, K, A16, lda, W16, ws, trans_w, beta, dC, ldc);
        gk_expert_kernel(GK_EXPERT_ASYNC);
        gk_expert_mm(t->g->stream, doff, E, rows, N, K, A16, lda, W16, ws, trans_w, beta, dCa, ldc);
        gk_expert_kernel(form);
        const int sm90 = gk_expert_sm90_ready();
        const int rc90 = sm90 ? gk_expert_mm_sm90(t->g->stream, doff, E, N, K, A16, lda, W16, ws, trans_w, beta, dCs,
                                                  ldc)
                              : -1;
        for (int e = 0; e < E; e++)
            if (counts[e])
                zy_gemm(0, trans_w, counts[e], N, K, 1.0f, A + (size_t)off[e] * lda, lda, W + e * ws, ldw, beta,
                        C + (size_t)off[e] * ldc, ldc);
        snprintf(name, sizeof name, "expert_mm %s E %d rows %d (+%d) N %d K %d pad %d beta %g",
                 trans_w ? "A W_e^T" : "A W_e", E, off[E], extra_rows, N, K, pad, beta);
        gt_check(t, name, dC, C, (size_t)rows * ldc, 2e-5);
        same_forms(t, name, dC, dCa, (size_t)rows * ldc);
        if (sm90 && C0)
            sm90_case(t, name, rc90, lda % 8 == 0 && ldw % 8 == 0 && ws % 8 == 0 && ldc % 4 == 0, dCs, C, C0,
                      (size_t)rows * ldc);
        free(C0);
    } else { /* G_e[N_out = N, K] (ldg K + pad) = A_eᵀ B_e, A [rows, N] (lda N + pad), B [rows, K] (ldb K + pad) */
        const int lda = N + pad, ldb = K + pad, ldg = K + pad;
        const long gs = (long)N * ldg + pad;
        float *A = gt_rand(t, (size_t)rows * lda, 1), *B = gt_rand(t, (size_t)rows * ldb, 1);
        float *G = gt_rand(t, (size_t)E * gs, 1);
        const uint16_t *A16 = bf16_up(t, A, (size_t)rows * lda), *B16 = bf16_up(t, B, (size_t)rows * ldb);
        float *dG = gt_up(t, G, (size_t)E * gs), *dG2 = gt_up(t, G, (size_t)E * gs), *dGa = gt_up(t, G, (size_t)E * gs);
        float *dGs = gt_up(t, G, (size_t)E * gs), *dGs2 = gt_up(t, G, (size_t)E * gs);
        float *G0 = malloc((size_t)E * gs * sizeof(float));
        if (G0) memcpy(G0, G, (size_t)E * gs * sizeof(float));
        const int32_t *doff = gt_up_i(t, off, (size_t)E + 1);
        const int form = gk_expert_kernel(-1);
        gk_expert_kernel(GK_EXPERT_STAGED);
        gk_expert_mm_wgrad(t->g->stream, doff, E, N, K, A16, lda, B16, ldb, beta, dG, gs, ldg);
        gk_expert_mm_wgrad(t->g->stream, doff, E, N, K, A16, lda, B16, ldb, beta, dG2, gs, ldg);
        gk_expert_kernel(GK_EXPERT_ASYNC);
        gk_expert_mm_wgrad(t->g->stream, doff, E, N, K, A16, lda, B16, ldb, beta, dGa, gs, ldg);
        gk_expert_kernel(form);
        const int sm90 = gk_expert_sm90_ready();
        int rc90 = -1;
        if (sm90) {
            rc90 = gk_expert_mm_wgrad_sm90(t->g->stream, doff, E, N, K, A16, lda, B16, ldb, beta, dGs, gs, ldg);
            if (rc90 == 0) rc90 = gk_expert_mm_wgrad_sm90(t->g->stream, doff, E, N, K, A16, lda, B16, ldb, beta, dGs2,
                                                          gs, ldg);
        }
        for (int e = 0; e < E; e++) {
            if (counts[e])
                zy_gemm(1, 0, N, K, counts[e], 1.0f, A + (size_t)off[e] * lda, lda, B + (size_t)off[e] * ldb, ldb,
                        beta, G + e * gs, ldg);
            else if (beta == 0.0f)
                for (int m = 0; m < N; m++) memset(G + e * gs + (size_t)m * ldg, 0, (size_t)K * sizeof(float));
        }
        snprintf(name, sizeof name, "expert_mm_wgrad E %d rows %d M %d N %d pad %d beta %g", E, off[E], N, K, pad,
                 beta);
        gt_check(t, name, dG, G, (size_t)E * gs, 2e-5);
        float *g1 = gt_down(t, dG, (size_t)E * gs), *g2 = gt_down(t, dG2, (size_t)E * gs);
        int same = 1;
        for (size_t i = 0; i < (size_t)E * gs; i++) same &= bits_same(g1[i], g2[i]);
        gt_assert(t, same, name, "two runs %s", same ? "bit-identical" : "differ");
        same_forms(t, name, dG, dGa, (size_t)E * gs);
        if (sm90 && G0) {
            const int aligned = lda % 8 == 0 && ldb % 8 == 0 && ldg % 4 == 0 && gs % 4 == 0;
            sm90_case(t, name, rc90, aligned, dGs, G, G0, (size_t)E * gs);
            if (aligned && rc90 == 0) {
                float *s1 = gt_down(t, dGs, (size_t)E * gs), *s2 = gt_down(t, dGs2, (size_t)E * gs);
                int same90 = 1;
                for (size_t i = 0; i < (size_t)E * gs; i++) same90 &= bits_same(s1[i], s2[i]);
                gt_assert(t, same90, name, "sm90 form: two runs %s", same90 ? "bit-identical" : "differ");
            }
        }
        free(G0);
    }
    gt_reset(t);
}

static void test_expert_products(GpuTest *t) {
    const int small[] = {150, 0, 37, 200}, odd[] = {70, 3, 0, 64}, one[] = {256};
    int many[16], few[16];
    for (int e = 0; e < 16; e++) many[e] = e == 5 ? 0 : 200 + 37 * e % 300; /* bench-gpu-like: 16 experts */
    for (int e = 0; e < 16; e++) few[e] = e == 5 ? 0 : 3 + 7 * e % 40;      /* 16 experts, one empty, fewer rows */
    const int big = gt_gpu_sized(t, "expert products at bench-gpu's sizes (16 experts, 5,155 rows)");
    for (int tw = 0; tw < 2; tw++) {
        expert_case(t, small, 4, 33, 136, 64, 0, 0, tw, 0.0f);
        expert_case(t, small, 4, 0, 200, 40, 8, 0, tw, 1.0f);
        expert_case(t, odd, 4, 13, 45, 37, 3, 0, tw, tw ? 0.0f : 1.0f); /* element loads */
        expert_case(t, one, 1, 0, 128, 32, 0, 0, tw, 0.0f);
        expert_case(t, few, 16, 9, 96, 80, 0, 0, tw, 1.0f);
        if (!big) continue;
        expert_case(t, many, 16, 100, 512, 256, 0, 0, tw, 0.0f);
        expert_case(t, many, 16, 0, 1024, 1024, 0, 0, tw, 1.0f); /* bench-gpu's sizes: 32 k-steps through the ring */
    }
    expert_case(t, small, 4, 5, 136, 72, 0, 1, 0, 1.0f);
    expert_case(t, small, 4, 5, 24, 40, 0, 1, 0, 0.0f); /* an empty expert's gradient zeroed */
    expert_case(t, odd, 4, 5, 30, 50, 3, 1, 0, 1.0f);    /* element loads */
    expert_case(t, few, 16, 0, 96, 80, 0, 1, 0, 0.0f);
    if (!big) return;
    expert_case(t, many, 16, 0, 512, 256, 0, 1, 0, 1.0f);
    expert_case(t, many, 16, 0, 1024, 2048, 0, 1, 0, 0.0f);
}

/* Decoding's few-row products (gk_skinny_*) against the CPU on bf16-rounded operands: several products of the same
 * rows in one launch at 1, 3 and 8 rows, and the experts' SwiGLU and gate-and-combine forms with rows on different
 * experts and on the skip expert (whose act rows stay as they were and whose outputs are 0). */
static void skinny_case(GpuTest *t, int rows, int K, const int *ns, int n_outs, int gelu_out) {
    const int ldx = K + 8;
    float *x = gt_rand(t, (size_t)rows * ldx, 1.0f);
    float *dx = gt_up(t, x, (size_t)rows * ldx);
    round_bf16(x, (size_t)rows * ldx);
    GkSkinnyOut outs[GK_SKINNY_OUTS];
    float *ref[GK_SKINNY_OUTS];
    for (int j = 0; j < n_outs; j++) {
        float *w = gt_rand(t, (size_t)ns[j] * K, 1.0f);
        ref[j] = gt_host(t, (size_t)rows * ns[j]);
        outs[j] = (GkSkinnyOut){.w = bf16_up(t, w, (size_t)ns[j] * K), .y = gt_poison(t, (size_t)rows * ns[j]),
                                .n = ns[j], .ldy = ns[j]};
        zy_gemm(0, 1, rows, ns[j], K, 1.0f, x, ldx, w, K, 0.0f, ref[j], ns[j]);
        if (j == gelu_out) { /* the router's hidden layer: y = gelu(x Wᵀ + b) */
            float *b = gt_rand(t, (size_t)ns[j], 1.0f);
            outs[j].bias = gt_up(t, b, (size_t)ns[j]);
            for (int r = 0; r < rows; r++)
                for (int c = 0; c < ns[j]; c++) {
                    const double z = (double)ref[j][(size_t)r * ns[j] + c] + b[c];
                    ref[j][(size_t)r * ns[j] + c] = (float)(0.5 * z * (1.0 + erf(z / sqrt(2.0))));
                }
        }
    }
    const int rc = gk_skinny_mm(t->g->stream, dx, ldx, rows, K, outs, n_outs);
    char name[160];
    snprintf(name, sizeof name, "few-row products: %d rows, K %d, %d products%s", rows, K, n_outs,
             gelu_out >= 0 ? " (one with bias and GELU)" : "");
    if (!gt_assert(t, rc == 0, name, "launcher returned %d", rc)) return;
    for (int j = 0; j < n_outs; j++) {
        char what[200];
        snprintf(what, sizeof what, "%s: product %d (%d columns)", name, j, ns[j]);
        gt_check(t, what, outs[j].y, ref[j], (size_t)rows * ns[j], 2e-5);
    }
    gt_reset(t);
}
static void skinny_experts_case(GpuTest *t, int D, int I, int E, const int32_t *choice, int rows) {
    float *x = gt_rand(t, (size_t)rows * D, 1.0f), *gate = gt_rand(t, (size_t)rows, 0.5f);
    float *wgu = gt_rand(t, (size_t)E * 2 * I * D, 0.1f), *wd = gt_rand(t, (size_t)E * D * I, 0.1f);
    float *dx = gt_up(t, x, (size_t)rows * D), *dgate = gt_up(t, gate, (size_t)rows);
    round_bf16(x, (size_t)rows * D);
    uint16_t *dgu = bf16_up(t, wgu, (size_t)E * 2 * I * D), *ddown = bf16_up(t, wd, (size_t)E * D * I);
    int32_t *dchoice = gt_up_i(t, choice, (size_t)rows);
    float *act = gt_host(t, (size_t)rows * I), *out = gt_host(t, (size_t)rows * D), *gu = gt_host(t, 2 * (size_t)I);
    float *act16 = gt_host(t, (size_t)I);
    float *dact = gt_up(t, act, (size_t)rows * I), *dout = gt_poison(t, (size_t)rows * D); /* act: zeros */
    for (int r = 0; r < rows; r++) {
        const int e = choice[r];
        if (e < 0 || e >= E) continue; /* act row stays 0, out row 0 */
        zy_gemm(0, 1, 1, 2 * I, D, 1.0f, x + (size_t)r * D, D, wgu + (size_t)e * 2 * I * D, D, 0.0f, gu, 2 * I);
        for (int i = 0; i < I; i++) {
            const float g = gu[i];
            act[(size_t)r * I + i] = g / (1.0f + expf(-g)) * gu[I + i];
            act16[i] = zy_round_bf16(act[(size_t)r * I + i]);
        }
        zy_gemm(0, 1, 1, D, I, gate[r], act16, I, wd + (size_t)e * D * I, I, 0.0f, out + (size_t)r * D, D);
    }
    const int rc1 = gk_skinny_expert_swiglu(t->g->stream, dact, dx, dchoice, dgu, rows, D, I, E);
    const int rc2 = gk_skinny_expert_down(t->g->stream, dout, dact, dchoice, dgate, ddown, rows, I, D, E);
    char name[160];
    snprintf(name, sizeof name, "few-row experts: %d rows, D %d, I %d, E %d", rows, D, I, E);
    if (!gt_assert(t, rc1 == 0 && rc2 == 0, name, "launchers returned %d, %d", rc1, rc2)) return;
    char what[200];
    snprintf(what, sizeof what, "%s: SwiGLU (skip rows untouched)", name);
    gt_check(t, what, dact, act, (size_t)rows * I, 2e-5);
    snprintf(what, sizeof what, "%s: gate and combine (skip rows 0)", name);
    gt_check(t, what, dout, out, (size_t)rows * D, 2e-5);
    gt_reset(t);
}
/* The router's tail in one launch (gk_skinny_router_tail) against the five launches it replaces at decoding's few
 * rows (gk_state_rmsnorm_forward, gk_skinny_mm for both hidden layers and the logits, gk_router_choice_forward): the
 * same bits in z, logits, probabilities, choice and gate. */
static void router_tail_case(GpuTest *t, int rows, int R, int classes, int depth) {
    const size_t zr = (size_t)rows * R, lc = (size_t)rows * classes;
    float *z0 = gt_rand(t, zr, 2.0f), *rp = gt_rand(t, zr, 1.0f), *w1 = gt_rand(t, (size_t)R * R, 0.1f);
    float *w2 = gt_rand(t, (size_t)R * R, 0.1f), *wo = gt_rand(t, (size_t)classes * R, 0.1f);
    float *bias = gt_up(t, gt_rand(t, R, 0.5f), R), *gamma = gt_up(t, gt_rand(t, R, 0.7f), R);
    float *norm_w = gt_up(t, gt_rand(t, R, 1.0f), R), *b1 = gt_up(t, gt_rand(t, R, 0.3f), R);
    float *b2 = gt_up(t, gt_rand(t, R, 0.3f), R), *bal = gt_up(t, gt_rand(t, classes, 0.05f), classes);
    float *d_rp = depth ? gt_up(t, rp, zr) : NULL;
    const uint16_t *w1h = bf16_up(t, w1, (size_t)R * R), *w2h = bf16_up(t, w2, (size_t)R * R);
    const uint16_t *woh = bf16_up(t, wo, (size_t)classes * R);
    /* the five launches */
    float *za = gt_up(t, z0, zr), *zn = gt_dev(t, zr * 4), *rstd = gt_dev(t, (size_t)rows * 4), *h1 = gt_dev(t, zr * 4);
    float *h2 = gt_dev(t, zr * 4), *la = gt_poison(t, lc), *pa = gt_poison(t, lc), *ga = gt_poison(t, (size_t)rows);
    int32_t *ca = gt_dev(t, (size_t)rows * 4);
    GkStream s = t->g->stream;
    gk_state_rmsnorm_forward(s, za, zn, rstd, bias, d_rp, gamma, norm_w, rows, R, 1e-6f);
    const GkSkinnyOut o1 = {.w = w1h, .y = h1, .n = R, .ldy = R, .bias = b1},
                      o2 = {.w = w2h, .y = h2, .n = R, .ldy = R, .bias = b2},
                      oo = {.w = woh, .y = la, .n = classes, .ldy = classes};
    const int rc5 = gk_skinny_mm(s, zn, R, rows, R, &o1, 1) | gk_skinny_mm(s, h1, R, rows, R, &o2, 1) |
                    gk_skinny_mm(s, h2, R, rows, R, &oo, 1);
    gk_router_choice_forward(s, pa, ca, ga, la, bal, rows, classes);
    /* the one */
    float *zb = gt_up(t, z0, zr), *lb = gt_poison(t, lc), *pb = gt_poison(t, lc), *gb = gt_poison(t, (size_t)rows);
    int32_t *cb = gt_dev(t, (size_t)rows * 4);
    const GkRouterTail tail = {.z = zb, .bias = bias, .r_prev = d_rp, .gamma = gamma, .norm_w = norm_w, .eps = 1e-6f,
                               .w1 = w1h, .w2 = w2h, .w_out = woh, .b1 = b1, .b2 = b2, .balance_bias = bal,
                               .logits = lb, .probs = pb, .gate = gb, .choice = cb, .rows = rows, .R = R,
                               .classes = classes};
    const int rc1 = gk_skinny_router_tail(s, &tail);
    char name[160];
    snprintf(name, sizeof name, "router tail in one launch: %d rows, R %d, %d classes%s", rows, R, classes,
             depth ? "" : ", first layer");
    if (!gt_assert(t, rc1 == 0 && rc5 == 0, name, "launchers returned %d, %d", rc1, rc5)) return;
    const struct {
        const char *what;
        const float *a, *b;
        size_t n;
    } f[] = {{"z", za, zb, zr}, {"logits", la, lb, lc}, {"probabilities", pa, pb, lc}, {"gate", ga, gb, (size_t)rows}};
    for (size_t i = 0; i < sizeof f / sizeof *f; i++) {
        char what[200];
        snprintf(what, sizeof what, "%s: %s as the five launches', bit for bit", name, f[i].what);
        gt_check(t, what, f[i].b, gt_down(t, f[i].a, f[i].n), f[i].n, 0.0);
    }
    char what[200];
    snprintf(what, sizeof what, "%s: choice as the five launches'", name);
    gt_check_i(t, what, cb, gt_down_i(t, ca, (size_t)rows), (size_t)rows);
    gt_reset(t);
}

static void test_skinny_products(GpuTest *t) {
    const int qkvv[] = {1024, 256, 128, 128}, odd[] = {67, 5, 300}, router[] = {256};
    skinny_case(t, 1, 1024, qkvv, 4, -1); /* bench-gpu's CCA projections at batch 1 */
    skinny_case(t, 3, 264, odd, 3, 2);
    skinny_case(t, 8, 2048, qkvv, 2, -1);
    skinny_case(t, 2, 4104, odd, 1, -1); /* K past one pass of the block */
    skinny_case(t, 1, 256, router, 1, 0); /* the router's hidden layer at batch 1 */
    const int32_t one[] = {2}, mixed[] = {0, 3, 4, 1, 3, -1, 2, 0};
    skinny_experts_case(t, 256, 128, 4, one, 1);
    skinny_experts_case(t, 1024, 512, 4, mixed, 8);
    router_tail_case(t, 1, 256, 17, 1); /* ZAYA1's router at batch 1 */
    router_tail_case(t, 1, 256, 17, 0);
    router_tail_case(t, 8, 256, 17, 1);
    router_tail_case(t, 3, 64, 5, 1);
}

void test_gpu_gemm(GpuTest *t) {
    test_skinny_products(t);
    test_expert_products(t);
    const int shapes[][3] = {{1, 1, 1}, {7, 5, 3}, {33, 65, 17}, {128, 96, 64}, {257, 129, 300}, {1024, 1536, 512}};
    for (int bf16 = 0; bf16 < 2; bf16++)
        for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
            for (int ta = 0; ta < 2; ta++)
                for (int tb = 0; tb < 2; tb++)
                    one_case(t, bf16, ta, tb, shapes[s][0], shapes[s][1], shapes[s][2], s % 2 ? 3 : 0,
                             (ta + tb) % 2 ? 1.0f : 0.0f);
    gt_reset(t);
    /* given bf16 copies are used as they are (the weights' copies in training) */
    {
        const int M = 64, N = 48, K = 40;
        float *A = gt_rand(t, (size_t)M * K, 1), *B = gt_rand(t, (size_t)N * K, 1), *C = gt_host(t, (size_t)M * N);
        round_bf16(A, (size_t)M * K), round_bf16(B, (size_t)N * K);
        float *dA = gt_up(t, A, (size_t)M * K), *dB = gt_up(t, B, (size_t)N * K), *dC = gt_poison(t, (size_t)M * N);
        uint16_t *B16 = gt_dev(t, (size_t)N * K * 2);
        gk_f32_to_bf16(t->g->stream, B16, dB, (long)N * K);
        zy_gemm(0, 1, M, N, K, 1, A, K, B, K, 0, C, N);
        t->g->bf16 = 1;
        ZyErr err;
        int rc = gpu_gemm(t->g, 0, 1, M, N, K, 1, dA, NULL, K, NULL, B16, K, 0, dC, N, &err);
        t->g->bf16 = 0;
        gt_assert(t, rc == 0, "bf16 with a ready bf16 operand", "%s", rc ? err.msg : "launched");
        gt_check(t, "bf16 with a ready bf16 operand", dC, C, (size_t)M * N, 2e-5);
    }
    /* strided batches: every transpose pair, fp32 and bf16, batch 1 / 3 / 16; gaps odd (misaligned matrices) and
     * aligned, none at all (packed) for some */
    {
        const int bshapes[][3] = {{1, 1, 1}, {7, 5, 3}, {33, 65, 17}, {128, 96, 64}};
        const int batches[] = {1, 3, 16};
        for (int bf16 = 0; bf16 < 2; bf16++) {
            for (size_t s = 0; s < sizeof bshapes / sizeof *bshapes; s++)
                for (size_t bi = 0; bi < sizeof batches / sizeof *batches; bi++)
                    for (int ta = 0; ta < 2; ta++)
                        for (int tb = 0; tb < 2; tb++) {
                            const int packed = s % 2 == 0 && bi == 1, pad = s % 2 ? 3 : 0;
                            batched_case(t, bf16, ta, tb, bshapes[s][0], bshapes[s][1], bshapes[s][2], batches[bi],
                                         pad, packed ? 0 : 3 + 2 * (int)s, packed ? 0 : 16, packed ? 0 : 7 + (int)s,
                                         (ta + tb + (int)bi) % 2 ? 1.0f : 0.0f, 0);
                        }
            gt_reset(t);
        }
        /* a ready bf16 copy of the whole batch of A (the optimizer's X16), and a Newton-Schulz-like batch: A = X Xᵀ
         * over matrices 256-byte aligned */
        batched_case(t, 1, 0, 1, 48, 48, 80, 5, 0, 64, 64, 64, 0.0f, 1);
        batched_case(t, 1, 1, 0, 40, 24, 96, 16, 0, 0, 0, 0, 1.0f, 1);
        batched_case(t, 0, 1, 0, 96, 96, 256, 7, 0, 64, 64, 0, 0.0f, 0);
        gt_reset(t);
    }
    /* an MoE's per-expert products: the same weights against row counts that change every step, M varying (forward,
     * input gradient) and K varying (weight gradient); a new count in a size class already seen reuses that class's
     * checked algorithm instead of running the heuristic, and every product is still right */
    {
        const int counts[] = {300, 301, 280, 511, 257, 260, 3, 4, 97, 120, 65};
        const long heur0 = t->g->plan_heuristics, builds0 = t->g->plan_builds;
        for (size_t i = 0; i < sizeof counts / sizeof *counts; i++) {
            one_case(t, 1, 0, 1, counts[i], 96, 64, 0, 0.0f);  /* y = x Wᵀ: M = rows */
            one_case(t, 1, 1, 0, 96, 64, counts[i], 0, 1.0f);  /* dW += dyᵀ x: K = rows */
        }
        const long builds = t->g->plan_builds - builds0, heur = t->g->plan_heuristics - heur0;
        gt_assert(t, builds == 2 * (long)(sizeof counts / sizeof *counts) && heur < builds,
                  "per-expert row counts reuse checked algorithms", "%ld new shapes, %ld heuristic queries", builds,
                  heur);
        gt_reset(t);
    }
    if (!gt_gpu_sized(t, "GEMM probe (4096^3)")) return;
    double tf = gpu_gemm_probe_tflops(t->g, 4096, 10);
    t->g->bf16 = 1;
    double tf16 = gpu_gemm_probe_tflops(t->g, 4096, 10);
    t->g->bf16 = 0;
    gt_assert(t, tf > 0 && tf16 > tf, "GEMM probe", "fp32 %.1f TFLOP/s, bf16 %.1f TFLOP/s (4096^3)", tf, tf16);
}
