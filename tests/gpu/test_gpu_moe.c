/* GPU tests, group "moe": the router and expert ops of src/gpu/gpu_moe.cu against their CPU namesakes
 * (src/kernels/kernels.h; group_by_expert, gather, scatter and combine against the plain loops of src/model/model.c and
 * kernels.inc, written out here). Every output is poisoned first; every gradient is preloaded with random values on
 * both sides so the accumulation (or the overwrite, where the CPU overwrites) is checked. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_test.h"
#include "kernels/kernels.h"

#define TOL 1e-5 /* fp32 row / elementwise ops: libm vs CUDA erfc/exp, FMA contraction */

static char nm_buf[160];
static const char *nm(const char *op, const char *what, long a, long b) {
    snprintf(nm_buf, sizeof nm_buf, "%s %s %ldx%ld", op, what, a, b);
    return nm_buf;
}

static int32_t *poison_i(GpuTest *t, size_t n) { return (int32_t *)gt_poison(t, n); } /* 0xffffffff = -1 */

static int same_bits(const void *a, const void *b, size_t bytes) { return memcmp(a, b, bytes) == 0; }

/* The CPU grouping of src/model/model.c (stable counting sort, choice >= E left out); returns the routed count. */
static int cpu_group_by_expert(int32_t *off, int32_t *sorted, const int32_t *choice, int N, int E) {
    int32_t *cursor = malloc((size_t)(E + 1) * sizeof *cursor);
    memset(off, 0, (size_t)(E + 1) * sizeof *off);
    for (int r = 0; r < N; r++)
        if (choice[r] < E) off[choice[r] + 1]++;
    for (int e = 0; e < E; e++) off[e + 1] += off[e];
    memcpy(cursor, off, (size_t)E * sizeof *off);
    for (int r = 0; r < N; r++)
        if (choice[r] < E) sorted[cursor[choice[r]]++] = r;
    free(cursor);
    return off[E];
}

/* ---- router state ------------------------------------------------------------------------------------------ */
static void test_state_rmsnorm(GpuTest *t, int rows, int dim, int with_prev) {
    const size_t n = (size_t)rows * dim;
    const char *op = with_prev ? "state_rmsnorm_fwd+r" : "state_rmsnorm_fwd";
    float *z = gt_rand(t, n, 1), *bias = gt_rand(t, dim, 0.1f), *gamma = gt_rand(t, dim, 0.5f);
    float *w = gt_rand(t, dim, 1), *rp = with_prev ? gt_rand(t, n, 1) : NULL;
    float *d_z = gt_up(t, z, n), *d_zn = gt_poison(t, n), *d_rstd = gt_poison(t, rows);
    gk_state_rmsnorm_forward(t->g->stream, d_z, d_zn, d_rstd, gt_up(t, bias, dim), rp ? gt_up(t, rp, n) : NULL,
                             gt_up(t, gamma, dim), gt_up(t, w, dim), rows, dim, 1e-6f);
    float *zc = gt_copy(t, z, n), *zn = gt_host(t, n), *rstd = gt_host(t, rows);
    state_rmsnorm_forward(zc, zn, rstd, bias, rp, gamma, w, rows, dim, 1e-6f);
    gt_check(t, nm(op, "z", rows, dim), d_z, zc, n, TOL);
    gt_check(t, nm(op, "zn", rows, dim), d_zn, zn, n, TOL);
    gt_check(t, nm(op, "rstd", rows, dim), d_rstd, rstd, rows, TOL);
    gt_reset(t);
}

/* With r_prev: dr_prev overwritten, dgamma and dbias accumulate. Without: only dbias (dgamma, dr_prev untouched). */
static void test_state_backward(GpuTest *t, int rows, int dim, int with_prev, int determinism) {
    const size_t n = (size_t)rows * dim;
    const char *op = with_prev ? "state_bwd+r" : "state_bwd";
    float *dz = gt_rand(t, n, 1), *rp = gt_rand(t, n, 1), *gamma = gt_rand(t, dim, 0.5f);
    float *drp0 = gt_rand(t, n, 1), *dg0 = gt_rand(t, dim, 1), *db0 = gt_rand(t, dim, 1);
    float *d_dz = gt_up(t, dz, n), *d_rp = with_prev ? gt_up(t, rp, n) : NULL, *d_gamma = gt_up(t, gamma, dim);
    float *d_drp = gt_up(t, drp0, n), *d_dg = gt_up(t, dg0, dim), *d_db = gt_up(t, db0, dim);
    gk_state_backward(t->g->stream, d_drp, d_dg, d_db, d_dz, d_rp, d_gamma, rows, dim);
    float *drp = gt_copy(t, drp0, n), *dg = gt_copy(t, dg0, dim), *db = gt_copy(t, db0, dim);
    state_backward(drp, dg, db, dz, with_prev ? rp : NULL, gamma, rows, dim);
    gt_check(t, nm(op, "dr_prev", rows, dim), d_drp, drp, n, with_prev ? TOL : 0);
    gt_check(t, nm(op, "dgamma", rows, dim), d_dg, dg, dim, with_prev ? TOL : 0);
    gt_check(t, nm(op, "dbias", rows, dim), d_db, db, dim, TOL);
    if (determinism) { /* a second run from the same starting gradients gives the same bits */
        float *d_drp2 = gt_up(t, drp0, n), *d_dg2 = gt_up(t, dg0, dim), *d_db2 = gt_up(t, db0, dim);
        gk_state_backward(t->g->stream, d_drp2, d_dg2, d_db2, d_dz, d_rp, d_gamma, rows, dim);
        const int same = same_bits(gt_down(t, d_dg, dim), gt_down(t, d_dg2, dim), dim * sizeof(float)) &&
                         same_bits(gt_down(t, d_db, dim), gt_down(t, d_db2, dim), dim * sizeof(float)) &&
                         same_bits(gt_down(t, d_drp, n), gt_down(t, d_drp2, n), n * sizeof(float));
        gt_assert(t, same, nm(op, "deterministic", rows, dim), "two runs %s", same ? "bit-identical" : "differ");
    }
    gt_reset(t);
}

/* ---- router MLP bias + GELU ------------------------------------------------------------------------------------ */
static void test_bias_gelu(GpuTest *t, int rows, int dim, int alias) {
    const size_t n = (size_t)rows * dim;
    const char *op = alias ? "bias_gelu_fwd(y=pre)" : "bias_gelu_fwd";
    float *pre = gt_rand(t, n, 4), *bias = gt_rand(t, dim, 0.5f); /* some |x| > 12: the CPU's libm branch */
    pre[0] = 20;
    pre[n - 1] = -15;
    float *d_pre = gt_up(t, pre, n), *d_y = alias ? d_pre : gt_poison(t, n);
    gk_bias_gelu_forward(t->g->stream, d_pre, d_y, gt_up(t, bias, dim), rows, dim);
    float *pc = gt_copy(t, pre, n), *yc = alias ? pc : gt_host(t, n);
    bias_gelu_forward(pc, yc, bias, rows, dim);
    if (!alias) gt_check(t, nm(op, "pre", rows, dim), d_pre, pc, n, TOL);
    gt_check(t, nm(op, "y", rows, dim), d_y, yc, n, TOL);
    gt_reset(t);
}

/* dpre overwritten, dbias accumulates. */
static void test_gelu_bias_backward(GpuTest *t, int rows, int dim, int determinism) {
    const size_t n = (size_t)rows * dim;
    const char *op = "gelu_bias_bwd";
    float *dy = gt_rand(t, n, 1), *pre = gt_rand(t, n, 4), *db0 = gt_rand(t, dim, 1);
    pre[0] = 14;
    float *d_dy = gt_up(t, dy, n), *d_pre = gt_up(t, pre, n), *d_dpre = gt_poison(t, n), *d_db = gt_up(t, db0, dim);
    gk_gelu_bias_backward(t->g->stream, d_dpre, d_db, d_dy, d_pre, rows, dim);
    float *dpre = gt_host(t, n), *db = gt_copy(t, db0, dim);
    gelu_bias_backward(dpre, db, dy, pre, rows, dim);
    gt_check(t, nm(op, "dpre", rows, dim), d_dpre, dpre, n, TOL);
    gt_check(t, nm(op, "dbias", rows, dim), d_db, db, dim, TOL);
    if (determinism) {
        float *d_dpre2 = gt_poison(t, n), *d_db2 = gt_up(t, db0, dim);
        gk_gelu_bias_backward(t->g->stream, d_dpre2, d_db2, d_dy, d_pre, rows, dim);
        const int same = same_bits(gt_down(t, d_db, dim), gt_down(t, d_db2, dim), dim * sizeof(float)) &&
                         same_bits(gt_down(t, d_dpre, n), gt_down(t, d_dpre2, n), n * sizeof(float));
        gt_assert(t, same, nm(op, "deterministic", rows, dim), "two runs %s", same ? "bit-identical" : "differ");
    }
    gt_reset(t);
}

/* ---- router choice ------------------------------------------------------------------------------------------- */
/* ties = 1: small integer logits and a zero bias, so rows hold exact ties (the first class must win, as on the
 * CPU, also across lanes when nc > 32); else random logits (no ties). */
static void test_router(GpuTest *t, int rows, int nc, int ties) {
    const size_t n = (size_t)rows * nc;
    const char *op = ties ? "router_fwd(ties)" : "router_fwd";
    float *logits = gt_rand(t, n, 2), *bias = gt_rand(t, nc, 0.05f);
    if (ties) {
        int32_t *li = gt_rand_int(t, n, 0, 3);
        for (size_t i = 0; i < n; i++) logits[i] = (float)li[i];
        for (int e = 0; e < nc; e++) bias[e] = 0;
    }
    float *d_probs = gt_poison(t, n), *d_gate = gt_poison(t, rows);
    int32_t *d_choice = poison_i(t, rows);
    gk_router_choice_forward(t->g->stream, d_probs, d_choice, d_gate, gt_up(t, logits, n), gt_up(t, bias, nc), rows,
                             nc);
    float *probs = gt_host(t, n), *gate = gt_host(t, rows);
    int32_t *choice = gt_rand_int(t, rows, 0, 1);
    router_choice_forward(probs, choice, gate, logits, bias, rows, nc);
    gt_check(t, nm(op, "probs", rows, nc), d_probs, probs, n, TOL);
    gt_check_i(t, nm(op, "choice", rows, nc), d_choice, choice, rows);
    gt_check(t, nm(op, "gate", rows, nc), d_gate, gate, rows, TOL);

    /* backward from the CPU's probs and choice; every fourth row has dgate = 0 (a skip-expert row) */
    op = "router_bwd";
    float *dgate = gt_rand(t, rows, 1), *dl0 = gt_rand(t, n, 1);
    for (int r = 1; r < rows; r += 4) dgate[r] = 0;
    float *d_dl = gt_up(t, dl0, n);
    gk_router_choice_backward(t->g->stream, d_dl, gt_up(t, dgate, rows), gt_up(t, probs, n),
                              gt_up_i(t, choice, rows), rows, nc);
    float *dl = gt_copy(t, dl0, n);
    router_choice_backward(dl, dgate, probs, choice, rows, nc);
    gt_check(t, nm(op, "dlogits", rows, nc), d_dl, dl, n, TOL);
    gt_reset(t);
}

static void test_route_all_to_one(GpuTest *t, int rows) {
    int32_t *d_choice = poison_i(t, rows);
    float *d_gate = gt_poison(t, rows);
    gk_route_all_to_one(t->g->stream, d_choice, d_gate, rows);
    int32_t *zeros = gt_rand_int(t, rows, 0, 1);
    float *ones = gt_host(t, rows);
    for (int r = 0; r < rows; r++) ones[r] = 1;
    gt_check_i(t, nm("route_all_to_one", "choice", rows, 1), d_choice, zeros, rows);
    gt_check(t, nm("route_all_to_one", "gate", rows, 1), d_gate, ones, rows, 0);
    gt_reset(t);
}

/* ---- grouping by expert ---------------------------------------------------------------------------------------
 * mode 0: choices in [0, E] (E = skip); 1: also beyond E (skip too); 2: all to expert 0; 3: all skipped; 4: skewed
 * (most rows to the last expert). */
static void test_group_by_expert(GpuTest *t, int N, int E, int mode) {
    int32_t *choice = gt_rand_int(t, N, 0, mode == 1 ? E + 3 : E + 1);
    for (int r = 0; r < N; r++) {
        if (mode == 2) choice[r] = 0;
        if (mode == 3) choice[r] = E;
        if (mode == 4 && r % 8) choice[r] = E - 1;
    }
    int32_t *d_off = poison_i(t, E + 1), *d_sorted = poison_i(t, N);
    gk_group_by_expert(t->g->stream, d_off, d_sorted, gt_up_i(t, choice, N), N, E);
    int32_t *off = gt_rand_int(t, E + 1, 0, 1), *sorted = gt_rand_int(t, N, 0, 1);
    const int routed = cpu_group_by_expert(off, sorted, choice, N, E);
    char what[32];
    snprintf(what, sizeof what, "off (mode %d)", mode);
    gt_check_i(t, nm("group_by_expert", what, N, E), d_off, off, E + 1);
    snprintf(what, sizeof what, "sorted (mode %d)", mode);
    gt_check_i(t, nm("group_by_expert", what, N, E), d_sorted, sorted, routed);
    gt_reset(t);
}

/* ---- row movement ------------------------------------------------------------------------------------------- */
/* misalign: the destination starts one float into its buffer (the 128-bit path must step aside). */
static void test_gather(GpuTest *t, int n, int M, int D, int misalign) {
    const size_t nd = (size_t)n * D;
    float *src = gt_rand(t, (size_t)M * D, 1);
    int32_t *idx = gt_rand_int(t, n, 0, M);
    float *d_buf = gt_poison(t, nd + 1), *d_dst = d_buf + (misalign ? 1 : 0);
    gk_gather_rows(t->g->stream, d_dst, gt_up(t, src, (size_t)M * D), gt_up_i(t, idx, n), n, NULL, D);
    float *ref = gt_host(t, nd);
    for (int k = 0; k < n; k++) memcpy(ref + (size_t)k * D, src + (size_t)idx[k] * D, (size_t)D * sizeof(float));
    gt_check(t, nm(misalign ? "gather_rows(unaligned)" : "gather_rows", "dst", n, D), d_dst, ref, nd, 0);
    gt_reset(t);
}

static void shuffle_prefix(GpuTest *t, int32_t *perm, int M) {
    for (int i = 0; i < M; i++) perm[i] = i;
    for (int i = M - 1; i > 0; i--) {
        const int j = (int)(zy_rng_next(&t->rng) % (uint64_t)(i + 1));
        const int32_t tmp = perm[i];
        perm[i] = perm[j];
        perm[j] = tmp;
    }
}

static void test_scatter_add(GpuTest *t, int n, int M, int D, int misalign) {
    const size_t md = (size_t)M * D;
    float *src = gt_rand(t, (size_t)n * D, 1), *dst0 = gt_rand(t, md + 1, 1);
    int32_t *idx = gt_rand_int(t, M, 0, 1);
    shuffle_prefix(t, idx, M); /* the first n are distinct */
    float *d_buf = gt_up(t, dst0, md + 1), *d_dst = d_buf + (misalign ? 1 : 0);
    gk_scatter_add_rows(t->g->stream, d_dst, gt_up(t, src, (size_t)n * D), gt_up_i(t, idx, n), n, NULL, D);
    float *ref = gt_copy(t, dst0 + (misalign ? 1 : 0), md);
    for (int k = 0; k < n; k++)
        for (int i = 0; i < D; i++) ref[(size_t)idx[k] * D + i] += src[(size_t)k * D + i];
    gt_check(t, nm(misalign ? "scatter_add_rows(unaligned)" : "scatter_add_rows", "dst", n, D), d_dst, ref, md, 0);
    gt_reset(t);
}

/* ---- combine and the gate backward over a grouping ------------------------------------------------------------ */
/* skip_all: every row to the skip expert (n = 0: out must be all zeros). */
static void test_combine_and_gate(GpuTest *t, int rows, int D, int E, int skip_all, int determinism) {
    const size_t rd = (size_t)rows * D;
    int32_t *choice = gt_rand_int(t, rows, 0, E + 2); /* E and E + 1: skipped */
    if (skip_all)
        for (int r = 0; r < rows; r++) choice[r] = E;
    int32_t *off = gt_rand_int(t, E + 1, 0, 1), *sorted = gt_rand_int(t, rows, 0, 1);
    const int n = cpu_group_by_expert(off, sorted, choice, rows, E);
    const size_t nd = (size_t)n * D;
    float *y = gt_rand(t, nd, 1), *gate = gt_rand(t, rows, 1);
    int32_t *d_sorted = gt_up_i(t, sorted, rows), *d_choice = gt_up_i(t, choice, rows);
    float *d_y = gt_up(t, y, nd), *d_gate = gt_up(t, gate, rows);

    /* combine: out[sorted[k]] = gate · y[k]; skipped rows zeroed */
    float *d_out = gt_poison(t, rd);
    gk_moe_combine(t->g->stream, d_out, d_y, d_gate, d_sorted, d_choice, rows, n, NULL, D, E);
    float *out = gt_host(t, rd); /* zeros: the skipped rows */
    for (int k = 0; k < n; k++)
        for (int i = 0; i < D; i++) out[(size_t)sorted[k] * D + i] = gate[sorted[k]] * y[(size_t)k * D + i];
    gt_check(t, nm(skip_all ? "moe_combine(all skipped)" : "moe_combine", "out", rows, D), d_out, out, rd, 0);

    /* gate backward: dgate accumulates over the routed rows, dy overwritten */
    if (n > 0) {
        float *dout = gt_rand(t, rd, 1), *dg0 = gt_rand(t, rows, 1);
        float *d_dout = gt_up(t, dout, rd), *d_dg = gt_up(t, dg0, rows), *d_dy = gt_poison(t, nd);
        gk_moe_gate_backward(t->g->stream, d_dg, d_dy, d_dout, d_y, d_gate, d_sorted, n, NULL, D);
        float *dg = gt_copy(t, dg0, rows), *dy = gt_host(t, nd);
        moe_gate_backward(dg, dy, dout, y, gate, sorted, n, D);
        gt_check(t, nm("moe_gate_bwd", "dgate", rows, D), d_dg, dg, rows, TOL);
        gt_check(t, nm("moe_gate_bwd", "dy", rows, D), d_dy, dy, nd, 0);
        if (determinism) {
            float *d_dg2 = gt_up(t, dg0, rows), *d_dy2 = gt_poison(t, nd);
            gk_moe_gate_backward(t->g->stream, d_dg2, d_dy2, d_dout, d_y, d_gate, d_sorted, n, NULL, D);
            const int same = same_bits(gt_down(t, d_dg, rows), gt_down(t, d_dg2, rows), rows * sizeof(float));
            gt_assert(t, same, nm("moe_gate_bwd", "deterministic", rows, D), "two runs %s",
                      same ? "bit-identical" : "differ");
        }
    }
    gt_reset(t);
}

/* ---- SwiGLU ---------------------------------------------------------------------------------------------------- */
/* The bf16 forms (the grouped experts' operands) against the fp32 kernels' results rounded nearest-even: act16 =
 * bf16(act), dgu16 = bf16(the gradient added to a zeroed dgu), as values (a zero's sign may differ), the first `count`
 * rows written and the rest of `rows` left alone. */
static void swiglu_bf16_case(GpuTest *t, const char *label, const float *d_gu, const float *d_dact, int rows, int count,
                             const int32_t *n_dev, int I) {
    const size_t n = (size_t)rows * I, nc = (size_t)count * I;
    float *d_act = gt_poison(t, n), *d_dgu = gt_poison(t, 2 * n);
    gpu_memset_async(t->g, d_dgu, 0, 2 * n * sizeof(float));
    gk_swiglu_forward(t->g->stream, d_act, d_gu, rows, n_dev, I);
    gk_swiglu_backward(t->g->stream, d_dgu, d_dact, d_gu, rows, n_dev, I);
    /* the two forward forms side by side: at + 1 (the element-wide path) and at the first 16-byte boundary past
     * that one's n elements (the vector path) */
    const size_t second = (n + 1 + 7) / 8 * 8;
    uint16_t *d16 = gt_dev(t, (second + n) * sizeof(uint16_t)), *g16 = gt_dev(t, 4 * n * sizeof(uint16_t));
    gpu_memset_async(t->g, d16, 0xff, (second + n) * sizeof(uint16_t)); /* 0xffff: a NaN no kernel writes */
    gpu_memset_async(t->g, g16, 0xff, 4 * n * sizeof(uint16_t));
    gk_swiglu_forward_bf16(t->g->stream, d16 + 1, d_gu, rows, n_dev, I);
    gk_swiglu_forward_bf16(t->g->stream, d16 + second, d_gu, rows, n_dev, I);
    gk_swiglu_backward_bf16(t->g->stream, g16 + 2 * n, d_dact, d_gu, rows, n_dev, I);
    float *act = gt_down(t, d_act, n), *dgu = gt_down(t, d_dgu, 2 * n);
    uint16_t *h16 = malloc((second + 5 * n) * sizeof(uint16_t)), *hg16 = h16 ? h16 + second + n : NULL;
    ZyErr err;
    int ok = h16 && gpu_sync(t->g, "swiglu bf16", &err) == 0 &&
             gpu_download(t->g, h16, d16, (second + n) * sizeof(uint16_t), &err) == 0 &&
             gpu_download(t->g, hg16, g16, 4 * n * sizeof(uint16_t), &err) == 0;
    size_t wrong = 0, stray = 0;
    for (size_t i = 0; ok && i < n; i++) {
        const float want = zy_bf16_to_f32(zy_f32_to_bf16(act[i]));
        for (int form = 0; form < 2; form++) {
            const uint16_t got = h16[form ? second + i : 1 + i];
            if (i < nc) wrong += zy_bf16_to_f32(got) != want;
            else stray += got != 0xffff;
        }
    }
    for (size_t i = 0; ok && i < 2 * n; i++) {
        const uint16_t got = hg16[2 * n + i];
        if (i < 2 * nc) wrong += zy_bf16_to_f32(got) != zy_bf16_to_f32(zy_f32_to_bf16(dgu[i]));
        else stray += got != 0xffff;
    }
    free(h16);
    char what[160];
    snprintf(what, sizeof what, "swiglu bf16 forms (%s, %d of %d rows, I %d)", label, count, rows, I);
    gt_assert(t, ok && wrong == 0 && stray == 0, what, "%zu values not the fp32 ones rounded, %zu written past the rows",
              wrong, stray);
}

static void test_swiglu(GpuTest *t, int rows, int I) {
    const size_t n = (size_t)rows * I, n2 = 2 * n;
    float *gu = gt_rand(t, n2, 3);
    gu[0] = -100; /* exp(100) overflows: the CPU's libm branch, silu → -0 */
    if (I > 1) gu[1] = 95;
    float *d_gu = gt_up(t, gu, n2), *d_act = gt_poison(t, n);
    gk_swiglu_forward(t->g->stream, d_act, d_gu, rows, NULL, I);
    float *act = gt_host(t, n);
    swiglu_forward(act, gu, rows, I);
    gt_check(t, nm("swiglu_fwd", "act", rows, I), d_act, act, n, TOL);

    float *dact = gt_rand(t, n, 1), *dgu0 = gt_rand(t, n2, 1);
    float *d_dgu = gt_up(t, dgu0, n2);
    gk_swiglu_backward(t->g->stream, d_dgu, gt_up(t, dact, n), d_gu, rows, NULL, I);
    float *dgu = gt_copy(t, dgu0, n2);
    swiglu_backward(dgu, dact, gu, rows, I);
    gt_check(t, nm("swiglu_bwd", "dgu", rows, I), d_dgu, dgu, n2, TOL);
    swiglu_bf16_case(t, "host count", d_gu, gt_up(t, dact, n), rows, rows, NULL, I);
    gt_reset(t);
}

/* The row ops with their count on the device (n_dev = gk_group_by_expert's off + E, the launch bounded by all rows),
 * as bf16 training runs them next to the grouped expert products: the routed rows as with a host count, the rows past
 * the count untouched (still the NaN poison). */
static int tail_poisoned(GpuTest *t, const float *d, size_t from, size_t n) {
    float *h = gt_down(t, d, n);
    for (size_t i = from; i < n; i++)
        if (!isnan(h[i])) return 0;
    return 1;
}
/* A bf16 form's output (d16, total values, 0xffff before the launch) against the fp32 form's (want, host): the first
 * count values nearest-even roundings of it, bit for bit, the rest untouched. */
static void bf16_rows_match(GpuTest *t, const char *what, const uint16_t *d16, const float *want, size_t count,
                            size_t total) {
    uint16_t *h = malloc(total * sizeof(uint16_t));
    ZyErr err;
    const int ok = h && gpu_download(t->g, h, d16, total * sizeof(uint16_t), &err) == 0;
    size_t wrong = 0, stray = 0;
    for (size_t i = 0; ok && i < total; i++) {
        if (i < count) wrong += h[i] != zy_f32_to_bf16(want[i]);
        else stray += h[i] != 0xffff;
    }
    free(h);
    gt_assert(t, ok && wrong == 0 && stray == 0, what, "%zu values not the fp32 form's rounded, %zu written past them",
              wrong, stray);
}
static uint16_t *poisoned16(GpuTest *t, size_t n) {
    uint16_t *d = gt_dev(t, n * sizeof(uint16_t));
    gpu_memset_async(t->g, d, 0xff, n * sizeof(uint16_t));
    return d;
}

static void test_counted_rows(GpuTest *t, int rows, int D, int E) {
    int32_t *choice = gt_rand_int(t, rows, 0, E + 1); /* E: the skip expert */
    int32_t *off = gt_rand_int(t, E + 1, 0, 1), *sorted = gt_rand_int(t, rows, 0, 1);
    const int n = cpu_group_by_expert(off, sorted, choice, rows, E);
    const size_t rd = (size_t)rows * D, nd = (size_t)n * D;
    int32_t *d_off = gt_up_i(t, off, E + 1), *d_sorted = gt_up_i(t, sorted, rows), *d_choice = gt_up_i(t, choice, rows);
    const int32_t *n_dev = d_off + E;
    float *src = gt_rand(t, rd, 1), *gate = gt_rand(t, rows, 1), *y = gt_rand(t, rd, 1);
    float *d_src = gt_up(t, src, rd), *d_gate = gt_up(t, gate, rows), *d_y = gt_up(t, y, rd);

    float *d_g = gt_poison(t, rd); /* gather */
    gk_gather_rows(t->g->stream, d_g, d_src, d_sorted, rows, n_dev, D);
    float *ref = gt_host(t, nd);
    for (int k = 0; k < n; k++) memcpy(ref + (size_t)k * D, src + (size_t)sorted[k] * D, (size_t)D * sizeof(float));
    gt_check(t, nm("gather_rows(device count)", "dst", n, D), d_g, ref, nd, 0);
    gt_assert(t, tail_poisoned(t, d_g, nd, rd), nm("gather_rows(device count)", "rows past the count", n, D), "%s",
              "untouched");
    uint16_t *d_g16 = poisoned16(t, rd);
    gk_gather_rows_bf16(t->g->stream, d_g16, d_src, d_sorted, rows, n_dev, D);
    bf16_rows_match(t, nm("gather_rows_bf16(device count)", "dst", n, D), d_g16, ref, nd, rd);

    float *d_out = gt_poison(t, rd); /* combine: every row written, y read for the routed ones */
    gk_moe_combine(t->g->stream, d_out, d_y, d_gate, d_sorted, d_choice, rows, rows, n_dev, D, E);
    float *out = gt_host(t, rd);
    for (int k = 0; k < n; k++)
        for (int i = 0; i < D; i++) out[(size_t)sorted[k] * D + i] = gate[sorted[k]] * y[(size_t)k * D + i];
    gt_check(t, nm("moe_combine(device count)", "out", n, D), d_out, out, rd, 0);

    float *dout = gt_rand(t, rd, 1), *dg0 = gt_rand(t, rows, 1); /* gate backward */
    float *d_dg = gt_up(t, dg0, rows), *d_dy = gt_poison(t, rd);
    gk_moe_gate_backward(t->g->stream, d_dg, d_dy, gt_up(t, dout, rd), d_y, d_gate, d_sorted, rows, n_dev, D);
    float *dg = gt_copy(t, dg0, rows), *dy = gt_host(t, nd + 1);
    moe_gate_backward(dg, dy, dout, y, gate, sorted, n, D);
    gt_check(t, nm("moe_gate_bwd(device count)", "dgate", n, D), d_dg, dg, rows, TOL);
    { /* the bf16 form: the same dgate bits, dy rounded */
        float *d_dg2 = gt_up(t, dg0, rows);
        uint16_t *d_dy16 = poisoned16(t, rd);
        gk_moe_gate_backward_bf16(t->g->stream, d_dg2, d_dy16, gt_up(t, dout, rd), d_y, d_gate, d_sorted, rows, n_dev,
                                  D);
        float *dg_a = gt_down(t, d_dg, rows), *dg_b = gt_down(t, d_dg2, rows), *dy_gpu = gt_down(t, d_dy, rd);
        gt_assert(t, memcmp(dg_a, dg_b, (size_t)rows * sizeof(float)) == 0,
                  nm("moe_gate_bwd_bf16(device count)", "dgate", n, D), "%s", "the fp32 form's bits");
        bf16_rows_match(t, nm("moe_gate_bwd_bf16(device count)", "dy", n, D), d_dy16, dy_gpu, nd, rd);
    }
    gt_check(t, nm("moe_gate_bwd(device count)", "dy", n, D), d_dy, dy, nd, 0);
    gt_assert(t, tail_poisoned(t, d_dy, nd, rd), nm("moe_gate_bwd(device count)", "rows past the count", n, D), "%s",
              "untouched");

    const int I = D; /* SwiGLU over gu [rows, 2I] */
    float *gu = gt_rand(t, 2 * rd, 2), *d_gu = gt_up(t, gu, 2 * rd), *d_act = gt_poison(t, rd);
    gk_swiglu_forward(t->g->stream, d_act, d_gu, rows, n_dev, I);
    float *act = gt_host(t, nd + 1);
    swiglu_forward(act, gu, n, I);
    gt_check(t, nm("swiglu_fwd(device count)", "act", n, I), d_act, act, nd, TOL);
    gt_assert(t, tail_poisoned(t, d_act, nd, rd), nm("swiglu_fwd(device count)", "rows past the count", n, I), "%s",
              "untouched");
    float *dact = gt_rand(t, rd, 1), *d_dgu = gt_poison(t, 2 * rd);
    gpu_memset_async(t->g, d_dgu, 0, 2 * nd * sizeof(float));
    gk_swiglu_backward(t->g->stream, d_dgu, gt_up(t, dact, rd), d_gu, rows, n_dev, I);
    float *dgu = gt_host(t, 2 * nd + 1);
    swiglu_backward(dgu, dact, gu, n, I);
    gt_check(t, nm("swiglu_bwd(device count)", "dgu", n, I), d_dgu, dgu, 2 * nd, TOL);
    gt_assert(t, tail_poisoned(t, d_dgu, 2 * nd, 2 * rd), nm("swiglu_bwd(device count)", "rows past the count", n, I),
              "%s", "untouched");
    swiglu_bf16_case(t, "device count", d_gu, gt_up(t, dact, rd), rows, n, n_dev, I);

    float *dst0 = gt_rand(t, rd, 1), *d_dst = gt_up(t, dst0, rd); /* scatter-add */
    gk_scatter_add_rows(t->g->stream, d_dst, d_y, d_sorted, rows, n_dev, D);
    float *sref = gt_copy(t, dst0, rd);
    for (int k = 0; k < n; k++)
        for (int i = 0; i < D; i++) sref[(size_t)sorted[k] * D + i] += y[(size_t)k * D + i];
    gt_check(t, nm("scatter_add_rows(device count)", "dst", n, D), d_dst, sref, rd, 0);
    gt_reset(t);
}

/* A layer's routing statistics on the device against the host sums of routing_counts_add_layer (src/model/routing.c):
 * counts exact, the double sums to 1e-12 (another order). classes = E: no skip class (its sum 0). */
static void test_routing_stats(GpuTest *t, int N, int E, int classes) {
    int32_t *choice = gt_rand_int(t, N, 0, classes > E ? E + 1 : E);
    float *gate = gt_rand(t, N, 1), *probs = gt_rand(t, (size_t)N * classes + 1, 1);
    int32_t *d_counts = gt_up_i(t, gt_rand_int(t, E + 1, 5, 9), E + 1); /* overwritten */
    double *d_sums = gt_dev(t, 2 * sizeof(double));
    gk_routing_stats(t->g->stream, d_counts, d_sums, gt_up_i(t, choice, N), gt_up(t, gate, N),
                     gt_up(t, probs, (size_t)N * classes + 1), N, classes, E);
    int32_t *counts = gt_rand_int(t, E + 1, 0, 1);
    memset(counts, 0, (size_t)(E + 1) * sizeof *counts);
    double g = 0, p = 0;
    for (int r = 0; r < N; r++) {
        counts[choice[r]]++;
        if (choice[r] < E) g += gate[r];
        if (classes > E) p += probs[(size_t)r * classes + E];
    }
    gt_check_i(t, nm("routing_stats", "counts", N, E), d_counts, counts, E + 1);
    double sums[2] = {NAN, NAN};
    ZyErr e;
    const int rc = gpu_download(t->g, sums, d_sums, sizeof sums, &e);
    const int ok = !rc && fabs(sums[0] - g) <= 1e-12 * (fabs(g) + N) && fabs(sums[1] - p) <= 1e-12 * (fabs(p) + N);
    gt_assert(t, ok, nm("routing_stats", "sums", N, E), "gate %.17g vs %.17g, skip %.17g vs %.17g", sums[0], g,
              sums[1], p);
    gt_reset(t);
}

/* rows = 0: nothing launched, nothing touched. */
static void test_empty(GpuTest *t) {
    float *g0 = gt_rand(t, 8, 1);
    float *d_a = gt_up(t, g0, 8), *d_b = gt_up(t, g0, 8);
    int32_t *d_i = gt_up_i(t, gt_rand_int(t, 8, 0, 4), 8);
    gk_gelu_bias_backward(t->g->stream, d_b, d_a, d_b, d_b, 0, 8);
    gk_state_backward(t->g->stream, d_b, d_a, d_a, d_b, d_b, d_a, 0, 8);
    gk_moe_gate_backward(t->g->stream, d_a, d_b, d_b, d_b, d_b, d_i, 0, NULL, 8);
    gk_router_choice_backward(t->g->stream, d_a, d_b, d_b, d_i, 0, 4);
    gk_swiglu_backward(t->g->stream, d_a, d_b, d_b, 0, NULL, 4);
    gk_scatter_add_rows(t->g->stream, d_a, d_b, d_i, 0, NULL, 8);
    gt_check(t, "zero rows leave gradients untouched", d_a, g0, 8, 0);
    gt_check(t, "zero rows leave inputs untouched", d_b, g0, 8, 0);
    gt_reset(t);
}

void test_gpu_moe(GpuTest *t) {
    static const int rd[][2] = {{1, 1}, {7, 13}, {33, 256}, {130, 67}, {5, 1029}, {16384, 256}};
    const int n_rd = (int)(sizeof rd / sizeof rd[0]);
    for (int i = 0; i < n_rd; i++) {
        const int rows = rd[i][0], dim = rd[i][1], big = rows >= 16384;
        test_state_rmsnorm(t, rows, dim, 0);
        test_state_rmsnorm(t, rows, dim, 1);
        test_state_backward(t, rows, dim, 0, 0);
        test_state_backward(t, rows, dim, 1, big);
        test_bias_gelu(t, rows, dim, 0);
        test_bias_gelu(t, rows, dim, 1);
        test_gelu_bias_backward(t, rows, dim, big);
    }
    test_gelu_bias_backward(t, 3000, 1536, 1); /* the 8-column blocks */

    static const int rc[][2] = {{1, 1}, {1, 2}, {9, 17}, {100, 33}, {77, 65}, {40, 100}, {16384, 17}};
    for (int i = 0; i < (int)(sizeof rc / sizeof rc[0]); i++) {
        test_router(t, rc[i][0], rc[i][1], 0);
        test_router(t, rc[i][0], rc[i][1], 1);
    }
    test_route_all_to_one(t, 1);
    test_route_all_to_one(t, 16384);

    static const int ge[][2] = {{0, 4},       {1, 1},        {1, 16},    {37, 3},       {1000, 16}, {16384, 16},
                                {16384, 256}, {100003, 255}, {20000, 1500}, {3000, 5000}, {1 << 20, 16}};
    for (int i = 0; i < (int)(sizeof ge / sizeof ge[0]); i++) {
        test_group_by_expert(t, ge[i][0], ge[i][1], 0);
        test_group_by_expert(t, ge[i][0], ge[i][1], 1);
    }
    for (int mode = 2; mode <= 4; mode++) {
        test_group_by_expert(t, 1, 16, mode);
        test_group_by_expert(t, 50000, 16, mode);
        test_group_by_expert(t, 50000, 1, mode);
    }

    test_routing_stats(t, 1, 4, 5);
    test_routing_stats(t, 8192, 16, 17);
    test_routing_stats(t, 5000, 16, 16);
    test_routing_stats(t, 100003, 64, 65);
    test_counted_rows(t, 300, 64, 5);
    test_counted_rows(t, 257, 13, 3);
    test_counted_rows(t, 8192, 256, 16);
    test_gather(t, 1, 1, 1, 0);
    test_gather(t, 37, 50, 13, 0);
    test_gather(t, 100, 64, 8, 1);
    test_gather(t, 16384, 16384, 1536, 0);
    test_scatter_add(t, 1, 1, 1, 0);
    test_scatter_add(t, 37, 50, 13, 0);
    test_scatter_add(t, 60, 64, 8, 1);
    test_scatter_add(t, 12000, 16384, 1536, 0);

    test_combine_and_gate(t, 1, 1, 1, 0, 0);
    test_combine_and_gate(t, 37, 13, 3, 0, 0);
    test_combine_and_gate(t, 200, 64, 16, 0, 0);
    test_combine_and_gate(t, 5, 8, 4, 1, 0);
    test_combine_and_gate(t, 16384, 1536, 16, 0, 1);

    test_swiglu(t, 1, 1);
    test_swiglu(t, 7, 13);
    test_swiglu(t, 33, 64);
    test_swiglu(t, 16384, 1024);

    test_empty(t);
}
