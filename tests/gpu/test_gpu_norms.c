/* GPU group "norms": RMSNorm, the merge + RMSNorm pair, the embedding, cross-entropy and gk_sum against their CPU
 * namesakes (src/kernels/kernels.h) on random inputs. Gradient buffers start from the same random values on both sides, so
 * the += is checked too. Tolerances are relative L2: 1e-5 where CPU and GPU differ only in summation order or a
 * fused multiply-add. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_test.h"
#include "kernels/kernels.h"

#define NORM_EPS 1e-5f
#define TOL 1e-5

/* A device copy of h placed `offset` floats into its allocation: offset 1 breaks 16-byte alignment, which sends
 * the kernels down their scalar path even when the width is a multiple of 4. */
static float *up_at(GpuTest *t, const float *h, size_t n, size_t offset) {
    float *d = (float *)gt_dev(t, (n + offset) * sizeof *d) + offset;
    ZyErr e;
    if (n && gpu_upload(t->g, d, h, n * sizeof *d, &e)) fprintf(stderr, "gpu tests: %s\n", e.msg);
    return d;
}

/* 1 when the device arrays a and b hold the same bits. */
static int same_bits(GpuTest *t, const float *a, const float *b, size_t n) {
    const float *ha = gt_down(t, a, n), *hb = gt_down(t, b, n);
    return memcmp(ha, hb, n * sizeof *ha) == 0;
}

static int32_t *host_ints(GpuTest *t, size_t n) { return gt_rand_int(t, n, 0, 1); /* zeroed, owned by the harness */ }

/* ---- RMSNorm ---------------------------------------------------------------------------------------------- */

static void check_rmsnorm(GpuTest *t, int rows, int dim, size_t misalign) {
    const size_t n = (size_t)rows * dim;
    char nm[96];
    const float *x = gt_rand(t, n, 1.5f), *w = gt_rand(t, dim, 1.0f), *dy = gt_rand(t, n, 1.0f);
    const float *dx0 = gt_rand(t, n, 1.0f), *dw0 = gt_rand(t, dim, 1.0f);
    float *y = gt_host(t, n), *rstd = gt_host(t, rows);
    float *dx = gt_copy(t, dx0, n), *dw = gt_copy(t, dw0, dim), *dx_only = gt_copy(t, dx0, n);
    rmsnorm_forward(y, rstd, x, w, rows, dim, NORM_EPS);
    rmsnorm_backward(dx, dw, dy, x, w, rstd, rows, dim);
    rmsnorm_backward(dx_only, NULL, dy, x, w, rstd, rows, dim);

    const float *d_x = up_at(t, x, n, misalign), *d_w = gt_up(t, w, dim), *d_dy = up_at(t, dy, n, misalign);
    float *d_y = gt_poison(t, n), *d_rstd = gt_poison(t, rows);
    gk_rmsnorm_forward(t->g->stream, d_y, d_rstd, d_x, d_w, rows, dim, NORM_EPS);
    snprintf(nm, sizeof nm, "rmsnorm fwd y %dx%d%s", rows, dim, misalign ? " unaligned" : "");
    gt_check(t, nm, d_y, y, n, TOL);
    snprintf(nm, sizeof nm, "rmsnorm fwd rstd %dx%d", rows, dim);
    gt_check(t, nm, d_rstd, rstd, rows, TOL);

    /* the backward takes the CPU's rstd: it is checked on its own */
    const float *d_rstd_ref = gt_up(t, rstd, rows);
    float *d_dx = up_at(t, dx0, n, misalign), *d_dw = gt_up(t, dw0, dim), *d_dx_only = gt_up(t, dx0, n);
    gk_rmsnorm_backward(t->g->stream, d_dx, d_dw, d_dy, d_x, d_w, d_rstd_ref, rows, dim);
    gk_rmsnorm_backward(t->g->stream, d_dx_only, NULL, d_dy, d_x, d_w, d_rstd_ref, rows, dim);
    snprintf(nm, sizeof nm, "rmsnorm bwd dx += %dx%d", rows, dim);
    gt_check(t, nm, d_dx, dx, n, TOL);
    snprintf(nm, sizeof nm, "rmsnorm bwd dw += %dx%d", rows, dim);
    gt_check(t, nm, d_dw, dw, dim, TOL);
    snprintf(nm, sizeof nm, "rmsnorm bwd dx, dw NULL %dx%d", rows, dim);
    gt_check(t, nm, d_dx_only, dx_only, n, TOL);
    gt_reset(t);
}

/* ---- residual merge + RMSNorm -------------------------------------------------------------------------------- */

typedef struct {
    int rows, dim;
    const float *h, *res, *hs, *hb, *rs, *rb, *w; /* forward inputs */
    const float *out, *rstd;                      /* forward results (CPU) */
    const float *du, *dx0, *dw0, *dhs0, *dhb0, *drs0, *drb0; /* backward inputs and gradient preloads */
} MergeCase;

typedef struct {
    float *dx, *dh, *dw, *dhs, *dhb, *drs, *drb;
} MergeGrads;

/* Uploads the case and runs the GPU backward; returns the device gradients. */
static MergeGrads gpu_merge_backward(GpuTest *t, const MergeCase *c) {
    const size_t n = (size_t)c->rows * c->dim, d = (size_t)c->dim;
    MergeGrads g = {gt_up(t, c->dx0, n), gt_poison(t, n),       gt_up(t, c->dw0, d), gt_up(t, c->dhs0, d),
                    gt_up(t, c->dhb0, d), gt_up(t, c->drs0, d), gt_up(t, c->drb0, d)};
    gk_rmsnorm_merge_backward(t->g->stream, g.dx, g.dh, g.dw, g.dhs, g.dhb, g.drs, g.drb, gt_up(t, c->du, n),
                              gt_up(t, c->out, n), gt_up(t, c->w, d), gt_up(t, c->rstd, c->rows), gt_up(t, c->h, n),
                              gt_up(t, c->res, n), gt_up(t, c->hs, d), gt_up(t, c->hb, d), gt_up(t, c->rs, d),
                              gt_up(t, c->rb, d), c->rows, c->dim);
    return g;
}

static void check_merge(GpuTest *t, int rows, int dim, int determinism) {
    const size_t n = (size_t)rows * dim;
    char nm[96];
    MergeCase c = {.rows = rows, .dim = dim};
    c.h = gt_rand(t, n, 1.0f), c.res = gt_rand(t, n, 1.0f), c.w = gt_rand(t, dim, 1.0f);
    c.hs = gt_rand(t, dim, 1.0f), c.hb = gt_rand(t, dim, 0.3f), c.rs = gt_rand(t, dim, 1.0f);
    c.rb = gt_rand(t, dim, 0.3f);
    float *out = gt_host(t, n), *y = gt_host(t, n), *rstd = gt_host(t, rows);
    merge_rmsnorm_forward(out, y, rstd, c.h, c.res, c.hs, c.hb, c.rs, c.rb, c.w, rows, dim, NORM_EPS);
    c.out = out, c.rstd = rstd;

    float *d_out = gt_poison(t, n), *d_y = gt_poison(t, n), *d_rstd = gt_poison(t, rows);
    gk_merge_rmsnorm_forward(t->g->stream, d_out, d_y, d_rstd, gt_up(t, c.h, n), gt_up(t, c.res, n),
                             gt_up(t, c.hs, dim), gt_up(t, c.hb, dim), gt_up(t, c.rs, dim), gt_up(t, c.rb, dim),
                             gt_up(t, c.w, dim), rows, dim, NORM_EPS);
    snprintf(nm, sizeof nm, "merge_rmsnorm fwd out %dx%d", rows, dim);
    gt_check(t, nm, d_out, out, n, TOL);
    snprintf(nm, sizeof nm, "merge_rmsnorm fwd y %dx%d", rows, dim);
    gt_check(t, nm, d_y, y, n, TOL);
    snprintf(nm, sizeof nm, "merge_rmsnorm fwd rstd %dx%d", rows, dim);
    gt_check(t, nm, d_rstd, rstd, rows, TOL);

    c.du = gt_rand(t, n, 1.0f), c.dx0 = gt_rand(t, n, 1.0f), c.dw0 = gt_rand(t, dim, 1.0f);
    c.dhs0 = gt_rand(t, dim, 1.0f), c.dhb0 = gt_rand(t, dim, 1.0f), c.drs0 = gt_rand(t, dim, 1.0f);
    c.drb0 = gt_rand(t, dim, 1.0f);
    float *dx = gt_copy(t, c.dx0, n), *dh = gt_host(t, n), *dw = gt_copy(t, c.dw0, dim);
    float *dhs = gt_copy(t, c.dhs0, dim), *dhb = gt_copy(t, c.dhb0, dim), *drs = gt_copy(t, c.drs0, dim);
    float *drb = gt_copy(t, c.drb0, dim);
    rmsnorm_merge_backward(dx, dh, dw, dhs, dhb, drs, drb, c.du, out, c.w, rstd, c.h, c.res, c.hs, c.hb, c.rs, c.rb,
                           rows, dim);
    const MergeGrads g = gpu_merge_backward(t, &c);
    const struct {
        const char *what;
        const float *dev, *ref;
        size_t n;
    } outs[] = {{"dx", g.dx, dx, n},           {"dh", g.dh, dh, n},         {"dw +=", g.dw, dw, dim},
                {"dhs +=", g.dhs, dhs, dim},   {"dhb +=", g.dhb, dhb, dim}, {"drs +=", g.drs, drs, dim},
                {"drb +=", g.drb, drb, dim}};
    for (size_t k = 0; k < sizeof outs / sizeof outs[0]; k++) {
        snprintf(nm, sizeof nm, "rmsnorm_merge bwd %s %dx%d", outs[k].what, rows, dim);
        gt_check(t, nm, outs[k].dev, outs[k].ref, outs[k].n, TOL);
    }
    if (determinism) { /* the column sums must not depend on scheduling: a second run gives the same bits */
        const MergeGrads g2 = gpu_merge_backward(t, &c);
        const int same = same_bits(t, g.dx, g2.dx, n) && same_bits(t, g.dh, g2.dh, n) &&
                         same_bits(t, g.dw, g2.dw, dim) && same_bits(t, g.dhs, g2.dhs, dim) &&
                         same_bits(t, g.dhb, g2.dhb, dim) && same_bits(t, g.drs, g2.drs, dim) &&
                         same_bits(t, g.drb, g2.drb, dim);
        snprintf(nm, sizeof nm, "rmsnorm_merge bwd deterministic %dx%d", rows, dim);
        gt_assert(t, same, nm, "%s", same ? "two runs bit-identical" : "two runs differ");
    }
    gt_reset(t);
}

/* ---- embedding -------------------------------------------------------------------------------------------- */

/* The plan must group every row exactly once, tokens ascending, rows ascending within a token. */
static int plan_ok(const int32_t *tokens, int rows, const int32_t *plan_rows, const int32_t *plan_start,
                   const int32_t *plan_tok, int n_uniq) {
    if (plan_start[0] != 0 || plan_start[n_uniq] != rows) return 0;
    for (int u = 0; u < n_uniq; u++) {
        if (u && plan_tok[u] <= plan_tok[u - 1]) return 0;
        if (plan_start[u + 1] <= plan_start[u]) return 0;
        for (int k = plan_start[u]; k < plan_start[u + 1]; k++) {
            if (tokens[plan_rows[k]] != plan_tok[u]) return 0;
            if (k > plan_start[u] && plan_rows[k] <= plan_rows[k - 1]) return 0;
        }
    }
    return 1; /* rows distinct within groups, groups disjoint by token, the total = rows: each row once */
}

typedef struct {
    float *demb, *dbias, *dscale;
} EmbedGrads;

static EmbedGrads gpu_embed_backward(GpuTest *t, const float *demb0, const float *dbias0, const float *dscale0,
                                     const float *d_dx, const float *d_emb, const int32_t *d_tok, const float *d_bias,
                                     const float *d_scale, int rows, int dim, int V, int pad_id,
                                     const int32_t *d_plan_rows, const int32_t *d_plan_start,
                                     const int32_t *d_plan_tok, const int32_t *d_plan_count) {
    EmbedGrads g = {gt_up(t, demb0, (size_t)V * dim), gt_up(t, dbias0, dim), gt_up(t, dscale0, dim)};
    gk_embed_backward(t->g->stream, g.demb, g.dbias, g.dscale, d_dx, d_emb, d_tok, d_bias, d_scale, rows, dim, pad_id,
                      d_plan_rows, d_plan_start, d_plan_tok, d_plan_count);
    return g;
}

static void check_embed(GpuTest *t, int rows, int dim, int V, int determinism) {
    const size_t n = (size_t)rows * dim, ne = (size_t)V * dim;
    char nm[96];
    int32_t *tokens = gt_rand_int(t, rows, 0, V);
    const int pad_id = tokens[rows / 2]; /* a token that occurs: its embedding row must get no gradient */
    const float *emb = gt_rand(t, ne, 1.0f), *bias = gt_rand(t, dim, 0.3f), *scale = gt_rand(t, dim, 1.0f);
    const float *dx = gt_rand(t, n, 1.0f), *demb0 = gt_rand(t, ne, 1.0f), *dbias0 = gt_rand(t, dim, 1.0f);
    const float *dscale0 = gt_rand(t, dim, 1.0f);
    float *x = gt_host(t, n), *demb = gt_copy(t, demb0, ne), *dbias = gt_copy(t, dbias0, dim);
    float *dscale = gt_copy(t, dscale0, dim);
    embed_forward(x, emb, tokens, bias, scale, rows, dim);
    embed_backward(demb, dbias, dscale, dx, emb, tokens, bias, scale, rows, dim, pad_id);

    int32_t *plan_rows = host_ints(t, rows), *plan_start = host_ints(t, rows + 1), *plan_tok = host_ints(t, rows);
    int32_t *work = host_ints(t, V);
    const int n_uniq = gk_embed_plan(tokens, rows, V, plan_rows, plan_start, plan_tok, work);
    snprintf(nm, sizeof nm, "embed plan %d rows V %d", rows, V);
    gt_assert(t, n_uniq >= 1 && n_uniq <= rows && plan_ok(tokens, rows, plan_rows, plan_start, plan_tok, n_uniq), nm,
              "%d distinct tokens", n_uniq);

    const float *d_emb = gt_up(t, emb, ne), *d_bias = gt_up(t, bias, dim), *d_scale = gt_up(t, scale, dim);
    const int32_t *d_tok = gt_up_i(t, tokens, rows);
    float *d_x = gt_poison(t, n);
    gk_embed_forward(t->g->stream, d_x, d_emb, NULL, d_tok, d_bias, d_scale, rows, dim);
    snprintf(nm, sizeof nm, "embed fwd x %dx%d V %d", rows, dim, V);
    gt_check(t, nm, d_x, x, n, TOL);
    { /* from the bf16 copy (bf16 inference): the fp32 gather of the rounded rows, bit for bit */
        uint16_t *h16 = malloc(ne * sizeof *h16);
        float *wide = gt_host(t, ne);
        for (size_t i = 0; h16 && i < ne; i++) h16[i] = zy_f32_to_bf16(emb[i]), wide[i] = zy_bf16_to_f32(h16[i]);
        uint16_t *d16 = gt_dev(t, ne * sizeof *d16);
        ZyErr e;
        const int up = h16 && gpu_upload(t->g, d16, h16, ne * sizeof *h16, &e) == 0;
        float *d_x16 = gt_poison(t, n), *d_xw = gt_poison(t, n);
        gk_embed_forward(t->g->stream, d_x16, NULL, d16, d_tok, d_bias, d_scale, rows, dim);
        gk_embed_forward(t->g->stream, d_xw, gt_up(t, wide, ne), NULL, d_tok, d_bias, d_scale, rows, dim);
        snprintf(nm, sizeof nm, "embed fwd from bf16 rows %dx%d = the widened rows' (bit for bit)", rows, dim);
        gt_assert(t, up && same_bits(t, d_x16, d_xw, n), nm, "%s", up ? "" : "upload failed");
        free(h16);
    }

    const float *d_dx = gt_up(t, dx, n);
    const int32_t *d_pr = gt_up_i(t, plan_rows, rows), *d_ps = gt_up_i(t, plan_start, n_uniq + 1);
    const int32_t *d_pt = gt_up_i(t, plan_tok, n_uniq), *d_pc = gt_up_i(t, &n_uniq, 1);
    const EmbedGrads g = gpu_embed_backward(t, demb0, dbias0, dscale0, d_dx, d_emb, d_tok, d_bias, d_scale, rows, dim,
                                            V, pad_id, d_pr, d_ps, d_pt, d_pc);
    snprintf(nm, sizeof nm, "embed bwd demb += %dx%d V %d", rows, dim, V);
    gt_check(t, nm, g.demb, demb, ne, TOL);
    snprintf(nm, sizeof nm, "embed bwd dbias += %dx%d", rows, dim);
    gt_check(t, nm, g.dbias, dbias, dim, TOL);
    snprintf(nm, sizeof nm, "embed bwd dscale += %dx%d", rows, dim);
    gt_check(t, nm, g.dscale, dscale, dim, TOL);
    { /* the pad row untouched, exactly */
        const float *h = gt_down(t, g.demb + (size_t)pad_id * dim, dim);
        const int same = memcmp(h, demb0 + (size_t)pad_id * dim, (size_t)dim * sizeof *h) == 0;
        snprintf(nm, sizeof nm, "embed bwd pad row untouched %dx%d", rows, dim);
        gt_assert(t, same, nm, "pad id %d", pad_id);
    }
    if (determinism) {
        const EmbedGrads g2 = gpu_embed_backward(t, demb0, dbias0, dscale0, d_dx, d_emb, d_tok, d_bias, d_scale, rows,
                                                 dim, V, pad_id, d_pr, d_ps, d_pt, d_pc);
        const int same = same_bits(t, g.demb, g2.demb, ne) && same_bits(t, g.dbias, g2.dbias, dim) &&
                         same_bits(t, g.dscale, g2.dscale, dim);
        snprintf(nm, sizeof nm, "embed bwd deterministic %dx%d", rows, dim);
        gt_assert(t, same, nm, "%s", same ? "two runs bit-identical" : "two runs differ");
    }
    gt_reset(t);
}

/* ---- cross-entropy ---------------------------------------------------------------------------------------- */

/* ignore_every k > 0: every k-th row has target -1 (k = 1: all rows ignored). */
static void check_cross_entropy(GpuTest *t, int rows, int V, int ignore_every, int with_grad, int determinism) {
    const size_t n = (size_t)rows * V;
    char nm[96];
    const float *logits = gt_rand(t, n, 3.0f);
    int32_t *targets = gt_rand_int(t, rows, 0, V);
    int n_valid = 0;
    for (int r = 0; r < rows; r++) {
        if (ignore_every > 0 && r % ignore_every == ignore_every - 1) targets[r] = -1;
        n_valid += targets[r] >= 0;
    }
    const double dloss = 0.75;
    const float dl_scale = n_valid ? (float)(dloss / n_valid) : 0.0f;
    float *dl = with_grad ? gt_host(t, n) : NULL, *row_loss = gt_host(t, rows);
    cross_entropy(dl, row_loss, logits, targets, rows, V, dloss);

    const float *d_scale = gt_up(t, &dl_scale, 1); /* the kernel reads its scale on the device */
    const float *d_logits = gt_up(t, logits, n);
    const int32_t *d_targets = gt_up_i(t, targets, rows);
    float *d_dl = with_grad ? gt_poison(t, n) : NULL, *d_loss = gt_poison(t, rows);
    gk_cross_entropy(t->g->stream, d_dl, NULL, d_loss, d_logits, d_targets, rows, V, d_scale);
    snprintf(nm, sizeof nm, "xent row_loss %dx%d%s", rows, V, with_grad ? "" : " (no grad)");
    gt_check(t, nm, d_loss, row_loss, rows, TOL);
    { /* the loss pass's device arithmetic: the valid count and 1/count (the host's former), then two passes' means
       * added in double in order (the host's former sum of parts / count) */
        ZyErr e;
        float *d_inv = gt_dev(t, sizeof(float)), inv = NAN;
        int32_t *d_valid = gt_dev(t, sizeof(int32_t)), valid = -1;
        double *d_acc = gt_dev(t, sizeof(double)), acc = NAN, sum = NAN;
        double *d_sum = gt_dev(t, sizeof(double));
        gk_loss_scale(t->g->stream, d_inv, d_valid, d_targets, rows);
        gk_loss_add(t->g->stream, d_acc, d_loss, rows, d_valid);
        gk_loss_add(t->g->stream, d_acc, d_loss, rows, d_valid);
        gk_sum(t->g->stream, d_sum, d_loss, rows);
        const int ran = gpu_download(t->g, &inv, d_inv, sizeof inv, &e) == 0 &&
                        gpu_download(t->g, &valid, d_valid, sizeof valid, &e) == 0 &&
                        gpu_download(t->g, &acc, d_acc, sizeof acc, &e) == 0 &&
                        gpu_download(t->g, &sum, d_sum, sizeof sum, &e) == 0;
        const float want_inv = n_valid ? 1.0f / (float)n_valid : 0.0f;
        double want_acc = 0;
        for (int k = 0; k < 2; k++) want_acc += n_valid ? sum / n_valid : 0.0;
        snprintf(nm, sizeof nm, "loss pass on the device %dx%d valid %d", rows, V, n_valid);
        gt_assert(t, ran && valid == n_valid && memcmp(&inv, &want_inv, sizeof inv) == 0 && acc == want_acc, nm,
                  "%s; valid %d, 1/valid %.9g (want %.9g), Σ of two means %.17g (want %.17g)", ran ? "ran" : e.msg,
                  valid, inv, want_inv, acc, want_acc);
    }
    if (!with_grad) {
        gt_reset(t);
        return;
    }
    snprintf(nm, sizeof nm, "xent dlogits %dx%d valid %d", rows, V, n_valid);
    gt_check(t, nm, d_dl, dl, n, TOL);
    /* The -dl_scale at each target dominates the norm above; the softmax part alone (targets zeroed on both
     * sides) must match too, or a large-V error in the sum would hide. */
    float *got = gt_down(t, d_dl, n), *want = gt_copy(t, dl, n);
    for (int r = 0; r < rows; r++)
        if (targets[r] >= 0) got[(size_t)r * V + targets[r]] = want[(size_t)r * V + targets[r]] = 0;
    const double e = gt_rel_err(got, want, n);
    snprintf(nm, sizeof nm, "xent softmax part %dx%d", rows, V);
    gt_assert(t, e <= TOL, nm, "rel err %.2e (tol %.0e)", e, TOL);
    if (determinism) {
        float *d_dl2 = gt_poison(t, n), *d_loss2 = gt_poison(t, rows);
        gk_cross_entropy(t->g->stream, d_dl2, NULL, d_loss2, d_logits, d_targets, rows, V, d_scale);
        const int same = same_bits(t, d_dl, d_dl2, n) && same_bits(t, d_loss, d_loss2, rows);
        snprintf(nm, sizeof nm, "xent deterministic %dx%d", rows, V);
        gt_assert(t, same, nm, "%s", same ? "two runs bit-identical" : "two runs differ");
    }
    /* the bf16 gradient (the head's products in bf16 runs read only it): zy_f32_to_bf16 of the fp32 one, bit for
     * bit, written alone and beside the fp32 one; every element written (the buffer starts as 0xffff, a NaN) */
    {
        ZyErr e;
        uint16_t *d16 = gt_dev(t, n * sizeof(uint16_t)), *d16b = gt_dev(t, n * sizeof(uint16_t));
        uint16_t *h16 = malloc(n * sizeof *h16), *h16b = malloc(n * sizeof *h16b);
        float *d_dl3 = gt_poison(t, n);
        gpu_memset_async(t->g, d16, 0xff, n * sizeof(uint16_t));
        gpu_memset_async(t->g, d16b, 0xff, n * sizeof(uint16_t));
        gk_cross_entropy(t->g->stream, NULL, d16, NULL, d_logits, d_targets, rows, V, d_scale);
        gk_cross_entropy(t->g->stream, d_dl3, d16b, NULL, d_logits, d_targets, rows, V, d_scale);
        size_t wrong = 0, wrong_b = 0;
        int ran = h16 && h16b && gpu_download(t->g, h16, d16, n * sizeof *h16, &e) == 0 &&
                  gpu_download(t->g, h16b, d16b, n * sizeof *h16b, &e) == 0;
        const float *f32 = gt_down(t, d_dl, n);
        for (size_t i = 0; ran && i < n; i++) {
            wrong += h16[i] != zy_f32_to_bf16(f32[i]);
            wrong_b += h16b[i] != zy_f32_to_bf16(f32[i]);
        }
        snprintf(nm, sizeof nm, "xent bf16 dlogits %dx%d = bf16(fp32 dlogits)", rows, V);
        gt_assert(t, ran && wrong == 0 && wrong_b == 0 && same_bits(t, d_dl, d_dl3, n), nm,
                  "%s; %zu / %zu of %zu differ (alone / beside the fp32)", ran ? "ran" : e.msg, wrong, wrong_b, n);
        free(h16), free(h16b);
    }
    gt_reset(t);
}

/* ---- sum -------------------------------------------------------------------------------------------------- */

static void check_sum(GpuTest *t, long n) {
    char nm[96];
    const float *x = gt_rand(t, (size_t)n, 1.0f);
    double want = 0, mag = 0;
    for (long i = 0; i < n; i++) want += x[i], mag += fabs(x[i]);
    const float *d_x = gt_up(t, x, (size_t)n);
    double *d_out = gt_dev(t, sizeof(double)), stale = 42.0, got = NAN;
    ZyErr e;
    if (gpu_upload(t->g, d_out, &stale, sizeof stale, &e)) fprintf(stderr, "gpu tests: %s\n", e.msg);
    gk_sum(t->g->stream, d_out, d_x, n);
    if (gpu_download(t->g, &got, d_out, sizeof got, &e)) fprintf(stderr, "gpu tests: %s\n", e.msg);
    /* float terms summed in double, only the order differs: within 1e-10 of Σ|x| (n=0: exactly 0, overwritten) */
    snprintf(nm, sizeof nm, "sum n=%ld", n);
    gt_assert(t, fabs(got - want) <= 1e-10 * mag, nm, "gpu %.17g cpu %.17g", got, want);
    gt_reset(t);
}

void test_gpu_norms(GpuTest *t) {
    /* odd widths take the scalar path, multiples of 4 the float4 path; 2048 x 1536 is the model's size */
    const int shapes[][2] = {{1, 1}, {3, 7}, {5, 33}, {17, 130}, {64, 256}, {33, 1000}, {2048, 1536}};
    const int n_shapes = (int)(sizeof shapes / sizeof shapes[0]);
    for (int k = 0; k < n_shapes; k++) check_rmsnorm(t, shapes[k][0], shapes[k][1], 0);
    check_rmsnorm(t, 40, 256, 1); /* misaligned pointers: the scalar path on a width that is a multiple of 4 */
    for (int k = 0; k < n_shapes; k++) check_merge(t, shapes[k][0], shapes[k][1], k == n_shapes - 1);

    check_embed(t, 1, 1, 3, 0);
    check_embed(t, 37, 33, 5, 0);     /* many repeats per token */
    check_embed(t, 300, 128, 50, 0);
    check_embed(t, 2048, 1536, 8192, 1);

    check_cross_entropy(t, 1, 1, 0, 1, 0);
    check_cross_entropy(t, 3, 7, 2, 1, 0);
    check_cross_entropy(t, 4, 7, 1, 1, 0);         /* every row ignored: loss 0, gradient 0 */
    check_cross_entropy(t, 5, 1001, 3, 1, 0);      /* odd V */
    check_cross_entropy(t, 9, 4096, 4, 0, 0);      /* loss only */
    check_cross_entropy(t, 128, 50257, 7, 1, 0);   /* odd V, many rows */
    check_cross_entropy(t, 256, 32768, 5, 1, 0);
    check_cross_entropy(t, 4, 262144, 3, 1, 1);    /* the largest vocabulary */
    check_cross_entropy(t, 3, 262143, 0, 1, 0);

    check_sum(t, 0);
    check_sum(t, 1);
    check_sum(t, 4097);
    check_sum(t, 3000001);
}
