/* GPU group "cca": the CCA pre-processing ops (the two causal convolutions, the q-k mean skip, the delayed values,
 * QK L2 norm + partial RoPE, plain RoPE) against their CPU namesakes (src/kernels/kernels.h) on random inputs. Gradient
 * buffers start from the same random values on both sides, so the += is checked too; outputs the CPU overwrites
 * start poisoned on the GPU. Every shape family includes odd sizes, B = 1 / T = 1, k0 and k1 in {1, 2, 3} (plus
 * 4 and the k > 4 fallback) and one realistic size (B = 2, T = 2048, C = 768, dh = 128).
 * Tolerances (relative L2):
 *   1e-6  ops whose GPU arithmetic repeats the CPU's operation by operation (unfused fp32; double sums that differ
 *         only in order): expected to agree to the last bit or nearly;
 *   1e-5  the grouped convolution and everything downstream of it: fp32 sums of dh·k1 products (forward / dM) or
 *         of up to B·T row products (dw1, db0, dw0) accumulated in a different order than OpenBLAS (the GPU keeps
 *         fp32 partials over at most a few thousand rows and adds the splits in double), ~1e-6 observed scale. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "gpu_test.h"
#include "kernels/kernels.h"

#define TOL_EXACT 1e-6
#define TOL_SUM 1e-5
#define TOL_BF16 1e-2 /* bf16 operands (8 significant bits) against the CPU's fp32 ones */

/* 1 when the device arrays a and b hold the same bits. */
static int same_bits(GpuTest *t, const float *a, const float *b, size_t n) {
    const float *ha = gt_down(t, a, n), *hb = gt_down(t, b, n);
    return memcmp(ha, hb, n * sizeof *ha) == 0;
}

/* ---- the two causal convolutions ---------------------------------------------------------------------------- */

typedef struct {
    int B, T, groups, dh, k0, k1;
} ConvShape;

/* One form of the convolution: its two launchers and its tolerance against the CPU's fp32. */
typedef struct {
    const char *name;
    void (*fwd)(GkStream, float *, float *, const float *, const float *, const float *, const float *, const float *,
                int, int, int, int, int, int);
    void (*bwd)(GkStream, float *, float *, float *, float *, float *, float *, const float *, const float *,
                const float *, const float *, const float *, int, int, int, int, int, int);
    double tol;
} ConvForm;

static void check_conv(GpuTest *t, ConvShape sh, int twice) {
    const int B = sh.B, T = sh.T, dh = sh.dh, C = sh.groups * sh.dh, k0 = sh.k0, k1 = sh.k1, TM = T + k1 - 1;
    const size_t nx = (size_t)B * T * C, nm = (size_t)B * TM * C, nw1 = (size_t)C * dh * k1, nw0 = (size_t)C * k0;
    char nm_[128], tag[64];
    snprintf(tag, sizeof tag, "B%d T%d C%d dh%d k%d,%d", B, T, C, dh, k0, k1);
    const float *X = gt_rand(t, nx, 1.0f), *w0 = gt_rand(t, nw0, 0.7f), *b0 = gt_rand(t, C, 0.5f);
    const float *w1 = gt_rand(t, nw1, (float)(1.0 / sqrt((double)dh * k1))), *b1 = gt_rand(t, C, 0.5f);
    float *Y = gt_host(t, nx), *M = gt_host(t, nm);
    const ZyConvShape shape = {B, T, C, dh, k0, k1}; /* the CPU reference's */
    float *wp = gt_host(t, (size_t)cca_conv_work_floats(shape));
    float *dwp = gt_host(t, (size_t)cca_conv_grad_work_floats(shape));
    cca_conv_forward(Y, M, wp, X, w0, b0, w1, b1, shape);

    /* the backward from the CPU's M, gradients preloaded with random values on both sides */
    const float *dY = gt_rand(t, nx, 1.0f);
    const float *dX0 = gt_rand(t, nx, 1.0f), *dw00 = gt_rand(t, nw0, 1.0f), *db00 = gt_rand(t, C, 1.0f);
    const float *dw10 = gt_rand(t, nw1, 1.0f), *db10 = gt_rand(t, C, 1.0f);
    float *dX = gt_copy(t, dX0, nx), *dw0 = gt_copy(t, dw00, nw0), *db0 = gt_copy(t, db00, C);
    float *dw1 = gt_copy(t, dw10, nw1), *db1 = gt_copy(t, db10, C), *dM = gt_host(t, nm);
    cca_conv_backward(dX, dw0, db0, dw1, db1, dM, wp, dwp, dY, X, M, w0, w1, shape);

    const float *d_X = gt_up(t, X, nx), *d_w0 = gt_up(t, w0, nw0), *d_b0 = gt_up(t, b0, C);
    const float *d_w1 = gt_up(t, w1, nw1), *d_b1 = gt_up(t, b1, C);
    const float *d_dY = gt_up(t, dY, nx), *d_Mc = gt_up(t, M, nm);
    /* decoding's form: the outputs at the last rows of each sequence only (its first P = (k0 - 1) + (k1 - 1) rows as
     * the cached columns), the rows before left as they were */
    const int P = (k0 - 1) + (k1 - 1);
    if (T > P && k1 <= 4 && dh <= 256 && B * (T - P) <= 4096) {
        float *d_Yd = gt_poison(t, nx);
        const int rc = gk_cca_conv_decode(t->g->stream, d_Yd, d_X, d_w0, d_b0, d_w1, d_b1, B, T, P, C, dh, k0, k1);
        const float *Yd = gt_down(t, d_Yd, nx);
        const size_t nn = (size_t)B * (T - P) * C, row = (size_t)(T - P) * C;
        float *got = gt_host(t, nn), *want = gt_host(t, nn);
        int untouched = 1;
        for (int b = 0; b < B; b++) {
            memcpy(got + b * row, Yd + ((size_t)b * T + P) * C, row * sizeof(float));
            memcpy(want + b * row, Y + ((size_t)b * T + P) * C, row * sizeof(float));
            for (size_t i = 0; i < (size_t)P * C; i++) {
                uint32_t u;
                memcpy(&u, Yd + (size_t)b * T * C + i, 4);
                untouched = untouched && u == 0xffffffffu;
            }
        }
        snprintf(nm_, sizeof nm_, "conv decode Y at rows %d.. %s", P, tag);
        gt_check(t, nm_, gt_up(t, got, nn), want, nn, rc == 0 ? TOL_SUM : -1.0);
        snprintf(nm_, sizeof nm_, "conv decode leaves rows 0..%d alone %s", P - 1, tag);
        gt_assert(t, rc == 0 && untouched, nm_, "launcher returned %d", rc);
    }
    /* the fp32 kernels, then bf16 runs' (the grouped products, Y and dM, on tensor cores with bf16 operands, where the
     * shape allows: the depthwise M exact, the grouped weight gradients the fp32 form's bits) */
    const ConvForm forms[2] = {{"", gk_cca_conv_forward, gk_cca_conv_backward, TOL_SUM},
                               {"bf16 (tensor cores) ", gk_cca_conv_forward_bf16, gk_cca_conv_backward_bf16, TOL_BF16}};
    const float *fp32_dw1 = NULL, *fp32_db1 = NULL;
    for (int f = 0; f < (dh % 16 == 0 && k1 <= 4 ? 2 : 1); f++) {
        const ConvForm *cf = &forms[f];
        float *d_Y = gt_poison(t, nx), *d_M = gt_poison(t, nm);
        cf->fwd(t->g->stream, d_Y, d_M, d_X, d_w0, d_b0, d_w1, d_b1, B, T, C, dh, k0, k1);
        snprintf(nm_, sizeof nm_, "conv fwd %sY %s", cf->name, tag);
        gt_check(t, nm_, d_Y, Y, nx, cf->tol);
        snprintf(nm_, sizeof nm_, "conv fwd %sM (all B*(T+k1-1) rows) %s", cf->name, tag);
        gt_check(t, nm_, d_M, M, nm, TOL_EXACT);

        float *d_dX = gt_up(t, dX0, nx), *d_dw0 = gt_up(t, dw00, nw0), *d_db0 = gt_up(t, db00, C);
        float *d_dw1 = gt_up(t, dw10, nw1), *d_db1 = gt_up(t, db10, C);
        float *d_dM = gt_poison(t, nm); /* scratch: poisoned, must not leak into any gradient */
        cf->bwd(t->g->stream, d_dX, d_dw0, d_db0, d_dw1, d_db1, d_dM, d_dY, d_X, d_Mc, d_w0, d_w1, B, T, C, dh, k0, k1);
        snprintf(nm_, sizeof nm_, "conv bwd %sdX += %s", cf->name, tag);
        gt_check(t, nm_, d_dX, dX, nx, cf->tol);
        snprintf(nm_, sizeof nm_, "conv bwd %sdw0 += %s", cf->name, tag);
        gt_check(t, nm_, d_dw0, dw0, nw0, cf->tol);
        snprintf(nm_, sizeof nm_, "conv bwd %sdb0 += %s", cf->name, tag);
        gt_check(t, nm_, d_db0, db0, C, cf->tol);
        if (f == 0) {
            snprintf(nm_, sizeof nm_, "conv bwd dw1 += %s", tag);
            gt_check(t, nm_, d_dw1, dw1, nw1, TOL_SUM);
            snprintf(nm_, sizeof nm_, "conv bwd db1 += %s", tag);
            gt_check(t, nm_, d_db1, db1, C, TOL_SUM);
            fp32_dw1 = d_dw1, fp32_db1 = d_db1;
        } else {
            const int same_w = same_bits(t, d_dw1, fp32_dw1, nw1) && same_bits(t, d_db1, fp32_db1, C);
            snprintf(nm_, sizeof nm_, "conv bwd %sdw1, db1 (fp32 kernels) %s", cf->name, tag);
            gt_assert(t, same_w, nm_, "%s", same_w ? "the fp32 form's bits" : "differ from the fp32 form's");
        }

        if (twice) { /* determinism: the same backward again (fresh scratch, same preloads) gives the same bits */
            float *e_dX = gt_up(t, dX0, nx), *e_dw0 = gt_up(t, dw00, nw0), *e_db0 = gt_up(t, db00, C);
            float *e_dw1 = gt_up(t, dw10, nw1), *e_db1 = gt_up(t, db10, C), *e_dM = gt_poison(t, nm);
            cf->bwd(t->g->stream, e_dX, e_dw0, e_db0, e_dw1, e_db1, e_dM, d_dY, d_X, d_Mc, d_w0, d_w1, B, T, C, dh, k0,
                    k1);
            const int same = same_bits(t, e_dX, d_dX, nx) && same_bits(t, e_dw0, d_dw0, nw0) &&
                             same_bits(t, e_db0, d_db0, C) && same_bits(t, e_dw1, d_dw1, nw1) &&
                             same_bits(t, e_db1, d_db1, C);
            snprintf(nm_, sizeof nm_, "conv bwd %sdeterministic %s", cf->name, tag);
            gt_assert(t, same, nm_, "%s", same ? "two runs bit-identical" : "two runs differ");
            float *e_Y = gt_poison(t, nx), *e_M = gt_poison(t, nm);
            cf->fwd(t->g->stream, e_Y, e_M, d_X, d_w0, d_b0, d_w1, d_b1, B, T, C, dh, k0, k1);
            const int same_f = same_bits(t, e_Y, d_Y, nx) && same_bits(t, e_M, d_M, nm);
            snprintf(nm_, sizeof nm_, "conv fwd %sdeterministic %s", cf->name, tag);
            gt_assert(t, same_f, nm_, "%s", same_f ? "two runs bit-identical" : "two runs differ");
        }
    }
    gt_reset(t);
}

/* ---- q-k mean skip ------------------------------------------------------------------------------------------ */

static void tables(GpuTest *t, int T, int rd, float **cosv, float **sinv);

/* gk_cca_decode_rows (cached decoding's CCA after the convolution, one launch) against the CPU's ops on each sequence:
 * B sequences of n new rows at rows P.. of their [P + n]-row blocks, at positions p0..: qk_mean_forward, then
 * l2norm_rope_forward (the keys with their temperature), the values with the kept vd of each slot, k̂ and v written at
 * rows b·max_len + p0.. of fp32 caches (the rest of the caches untouched), the kept vd replaced by each sequence's last
 * vd and the blocks' last P rows copied to the convolution state. */
static void check_cca_decode_rows(GpuTest *t, int B, int n, int P, int p0, int Hq, int Hkv, int dh, int rd) {
    const int C = (Hq + Hkv) * dh, Cq = Hq * dh, Ck = Hkv * dh, TE = P + n, half = Ck / 2, N = B * n, hr = rd / 2;
    const int max_len = p0 + n + 3, T = max_len;
    const size_t nc = (size_t)B * TE * C, nq = (size_t)N * Cq, ncache = (size_t)B * max_len * Ck;
    const float scale = sqrtf((float)dh), eps = 1.1920928955078125e-07f;
    char nm[160];
    const float *Y = gt_rand(t, nc, 1.0f), *X = gt_rand(t, nc, 1.0f), *vc = gt_rand(t, (size_t)N * half, 1.0f);
    const float *vd = gt_rand(t, (size_t)N * half, 1.0f), *kept0 = gt_rand(t, (size_t)B * half, 1.0f);
    const float *temp = gt_rand(t, Hkv, 1.0f), *kc0 = gt_rand(t, ncache, 1.0f), *vc0 = gt_rand(t, ncache, 1.0f);
    const float *state0 = gt_rand(t, (size_t)B * P * C + 1, 1.0f);
    float *cosv, *sinv;
    tables(t, T, rd, &cosv, &sinv);
    /* the CPU, sequence by sequence */
    float *q = gt_host(t, nq), *kcache = gt_copy(t, kc0, ncache), *vcache = gt_copy(t, vc0, ncache);
    float *kept = gt_copy(t, kept0, (size_t)B * half), *state = gt_copy(t, state0, (size_t)B * P * C + 1);
    float *qpre = gt_host(t, (size_t)n * Cq), *kpre = gt_host(t, (size_t)n * Ck), *k = gt_host(t, (size_t)n * Ck);
    float *norms = gt_host(t, (size_t)n * Hq);
    for (int b = 0; b < B; b++) {
        const size_t off = ((size_t)b * TE + P) * C;
        qk_mean_forward(qpre, kpre, Y + off, X + off, n, Hq, Hkv, dh);
        l2norm_rope_forward(q + (size_t)b * n * Cq, norms, qpre, NULL, cosv + (size_t)p0 * hr, sinv + (size_t)p0 * hr,
                            n, n, Hq, dh, rd, scale, eps);
        l2norm_rope_forward(k, norms, kpre, temp, cosv + (size_t)p0 * hr, sinv + (size_t)p0 * hr, n, n, Hkv, dh, rd,
                            scale, eps);
        for (int i = 0; i < n; i++) {
            const size_t r = (size_t)b * n + i, row = ((size_t)b * max_len + p0 + i) * Ck;
            memcpy(kcache + row, k + (size_t)i * Ck, (size_t)Ck * sizeof(float));
            for (int c = 0; c < half; c++) {
                vcache[row + c] = vc[r * half + c];
                vcache[row + half + c] = i ? vd[(r - 1) * half + c] : kept0[(size_t)b * half + c];
            }
        }
        memcpy(kept + (size_t)b * half, vd + ((size_t)b * n + n - 1) * half, (size_t)half * sizeof(float));
        memcpy(state + (size_t)b * P * C, X + ((size_t)b * TE + n) * C, (size_t)P * C * sizeof(float));
    }
    /* the GPU, one launch */
    float *d_q = gt_poison(t, nq), *d_k = gt_up(t, kc0, ncache), *d_v = gt_up(t, vc0, ncache);
    float *d_kept = gt_up(t, kept0, (size_t)B * half), *d_state = gt_up(t, state0, (size_t)B * P * C + 1);
    const float *d_X = gt_up(t, X, nc), *d_cos = gt_up(t, cosv, (size_t)T * hr), *d_sin = gt_up(t, sinv, (size_t)T * hr);
    const GkCcaDecode d = {.Xe = d_X, .Ye = gt_up(t, Y, nc), .TE = TE, .P = P, .vc = gt_up(t, vc, (size_t)N * half),
                           .vd = gt_up(t, vd, (size_t)N * half), .vd_prev = d_kept, .slot_stride = half,
                           .temp = gt_up(t, temp, Hkv), .cosv = d_cos + (size_t)p0 * hr, .sinv = d_sin + (size_t)p0 * hr,
                           .scale = scale, .eps = eps, .query = d_q, .k_cache = d_k, .v_cache = d_v, .kv_seq = max_len,
                           .kv_p0 = p0,
                           .state = {.dst = d_state, .dst_stride = (long)P * C, .src = d_X + (size_t)n * C,
                                     .src_stride = (long)TE * C, .len = (long)P * C, .n = B},
                           .N = N, .n = n, .Hq = Hq, .Hkv = Hkv, .dh = dh, .rd = rd};
    gk_cca_decode_rows(t->g->stream, &d);
    const struct {
        const char *what;
        const float *dev, *ref;
        size_t n;
    } out[] = {{"query", d_q, q, nq}, {"k cache", d_k, kcache, ncache}, {"v cache", d_v, vcache, ncache},
               {"kept vd", d_kept, kept, (size_t)B * half}, {"convolution state", d_state, state, (size_t)B * P * C + 1}};
    for (size_t i = 0; i < sizeof out / sizeof *out; i++) {
        snprintf(nm, sizeof nm, "cca decode rows, %d seqs of %d rows after %d state rows at %d: %s", B, n, P, p0,
                 out[i].what);
        gt_check(t, nm, out[i].dev, out[i].ref, out[i].n, TOL_EXACT);
    }
    gt_reset(t);
}

static void check_qk_mean(GpuTest *t, int rows, int Hq, int Hkv, int dh) {
    const int C = (Hq + Hkv) * dh, Cq = Hq * dh, Ck = Hkv * dh;
    const size_t nc = (size_t)rows * C, nq = (size_t)rows * Cq, nk = (size_t)rows * Ck;
    char nm[128], tag[64];
    snprintf(tag, sizeof tag, "rows%d Hq%d Hkv%d dh%d", rows, Hq, Hkv, dh);
    const float *Y = gt_rand(t, nc, 1.0f), *X = gt_rand(t, nc, 1.0f);
    float *q = gt_host(t, nq), *k = gt_host(t, nk);
    qk_mean_forward(q, k, Y, X, rows, Hq, Hkv, dh);
    float *d_q = gt_poison(t, nq), *d_k = gt_poison(t, nk);
    gk_qk_mean_forward(t->g->stream, d_q, d_k, gt_up(t, Y, nc), gt_up(t, X, nc), rows, Hq, Hkv, dh);
    snprintf(nm, sizeof nm, "qk_mean fwd query %s", tag);
    gt_check(t, nm, d_q, q, nq, TOL_EXACT);
    snprintf(nm, sizeof nm, "qk_mean fwd key %s", tag);
    gt_check(t, nm, d_k, k, nk, TOL_EXACT);

    const float *dq = gt_rand(t, nq, 1.0f), *dk = gt_rand(t, nk, 1.0f);
    const float *dY0 = gt_rand(t, nc, 1.0f), *dX0 = gt_rand(t, nc, 1.0f);
    float *dY = gt_copy(t, dY0, nc), *dX = gt_copy(t, dX0, nc);
    qk_mean_backward(dY, dX, dq, dk, rows, Hq, Hkv, dh);
    float *d_dY = gt_up(t, dY0, nc), *d_dX = gt_up(t, dX0, nc);
    gk_qk_mean_backward(t->g->stream, d_dY, d_dX, gt_up(t, dq, nq), gt_up(t, dk, nk), rows, Hq, Hkv, dh);
    snprintf(nm, sizeof nm, "qk_mean bwd dY += %s", tag);
    gt_check(t, nm, d_dY, dY, nc, TOL_EXACT);
    snprintf(nm, sizeof nm, "qk_mean bwd dX += %s", tag);
    gt_check(t, nm, d_dX, dX, nc, TOL_EXACT);
    gt_reset(t);
}

/* ---- delayed values ----------------------------------------------------------------------------------------- */

static void check_delayed_value(GpuTest *t, int B, int T, int half) {
    const size_t nh = (size_t)B * T * half, nv = 2 * nh;
    char nm[128], tag[64];
    snprintf(tag, sizeof tag, "B%d T%d half%d", B, T, half);
    const float *vc = gt_rand(t, nh, 1.0f), *vd = gt_rand(t, nh, 1.0f);
    float *v = gt_host(t, nv);
    delayed_value_forward(v, vc, vd, B, T, half);
    float *d_v = gt_poison(t, nv);
    gk_delayed_value_forward(t->g->stream, d_v, gt_up(t, vc, nh), gt_up(t, vd, nh), B, T, half);
    snprintf(nm, sizeof nm, "delayed_value fwd %s", tag);
    gt_check(t, nm, d_v, v, nv, TOL_EXACT);

    const float *dv = gt_rand(t, nv, 1.0f), *dvc0 = gt_rand(t, nh, 1.0f), *dvd0 = gt_rand(t, nh, 1.0f);
    float *dvc = gt_copy(t, dvc0, nh), *dvd = gt_copy(t, dvd0, nh);
    delayed_value_backward(dvc, dvd, dv, B, T, half);
    float *d_dvc = gt_up(t, dvc0, nh), *d_dvd = gt_up(t, dvd0, nh);
    gk_delayed_value_backward(t->g->stream, d_dvc, d_dvd, gt_up(t, dv, nv), B, T, half);
    snprintf(nm, sizeof nm, "delayed_value bwd dvc += %s", tag);
    gt_check(t, nm, d_dvc, dvc, nh, TOL_EXACT);
    snprintf(nm, sizeof nm, "delayed_value bwd dvd += %s", tag);
    gt_check(t, nm, d_dvd, dvd, nh, TOL_EXACT);
    gt_reset(t);
}

/* ---- QK L2 norm + partial RoPE ------------------------------------------------------------------------------ */

typedef struct {
    int rows, T, H, dh, rd, with_temp;
} NormShape;

/* rope tables for T positions (rd / 2 columns; at least one float so an empty table still has an address) */
static void tables(GpuTest *t, int T, int rd, float **cosv, float **sinv) {
    const size_t n = (size_t)T * (rd / 2);
    *cosv = gt_host(t, n ? n : 1);
    *sinv = gt_host(t, n ? n : 1);
    rope_tables(*cosv, *sinv, T, rd, 10000.0f);
}

static void check_l2norm_rope(GpuTest *t, NormShape sh) {
    const int rows = sh.rows, T = sh.T, H = sh.H, dh = sh.dh, rd = sh.rd;
    const size_t n = (size_t)rows * H * dh, nn = (size_t)rows * H, nt = (size_t)T * (rd / 2);
    const float scale = sqrtf((float)dh), eps = 1.1920928955078125e-07f;
    char nm[128], tag[80];
    snprintf(tag, sizeof tag, "rows%d T%d H%d dh%d rd%d%s", rows, T, H, dh, rd, sh.with_temp ? " temp" : "");
    float *x = gt_rand(t, n, 1.0f);
    if (rows > 1) memset(x + (size_t)1 * H * dh, 0, (size_t)dh * sizeof *x); /* a zero head: the norm clamp */
    const float *temp = sh.with_temp ? gt_rand(t, H, 1.0f) : NULL;
    float *cosv, *sinv;
    tables(t, T, rd, &cosv, &sinv);
    float *y = gt_host(t, n), *norm = gt_host(t, nn);
    l2norm_rope_forward(y, norm, x, temp, cosv, sinv, rows, T, H, dh, rd, scale, eps);

    const float *d_x = gt_up(t, x, n), *d_temp = temp ? gt_up(t, temp, H) : NULL;
    const float *d_cos = gt_up(t, cosv, nt ? nt : 1), *d_sin = gt_up(t, sinv, nt ? nt : 1);
    float *d_y = gt_poison(t, n), *d_norm = gt_poison(t, nn);
    gk_l2norm_rope_forward(t->g->stream, d_y, d_norm, d_x, d_temp, d_cos, d_sin, rows, T, H, dh, rd, scale, eps);
    snprintf(nm, sizeof nm, "l2norm_rope fwd y %s", tag);
    gt_check(t, nm, d_y, y, n, TOL_EXACT);
    snprintf(nm, sizeof nm, "l2norm_rope fwd norm %s", tag);
    gt_check(t, nm, d_norm, norm, nn, TOL_EXACT);

    /* backward: dx is overwritten (GPU starts poisoned), dtemp accumulates (random preload); dy is scratch */
    const float *dy = gt_rand(t, n, 1.0f), *dtemp0 = gt_rand(t, H, 1.0f);
    float *dy_cpu = gt_copy(t, dy, n), *dx = gt_host(t, n), *dtemp = gt_copy(t, dtemp0, H);
    rope_l2norm_backward(dx, dtemp, dy_cpu, x, norm, temp, cosv, sinv, rows, T, H, dh, rd, scale, eps);
    const float *d_normc = gt_up(t, norm, nn);
    float *d_dy = gt_up(t, dy, n), *d_dx = gt_poison(t, n), *d_dtemp = gt_up(t, dtemp0, H);
    gk_rope_l2norm_backward(t->g->stream, d_dx, d_dtemp, d_dy, d_x, d_normc, d_temp, d_cos, d_sin, rows, T, H, dh, rd,
                            scale, eps);
    snprintf(nm, sizeof nm, "rope_l2norm bwd dx (overwritten) %s", tag);
    gt_check(t, nm, d_dx, dx, n, TOL_EXACT);
    snprintf(nm, sizeof nm, "rope_l2norm bwd dtemp += %s", tag);
    gt_check(t, nm, d_dtemp, dtemp, H, TOL_EXACT);

    /* again with dtemp NULL (the query path): the same dx */
    float *d_dy2 = gt_up(t, dy, n), *d_dx2 = gt_poison(t, n);
    gk_rope_l2norm_backward(t->g->stream, d_dx2, NULL, d_dy2, d_x, d_normc, d_temp, d_cos, d_sin, rows, T, H, dh, rd,
                            scale, eps);
    snprintf(nm, sizeof nm, "rope_l2norm bwd dx, dtemp NULL %s", tag);
    gt_check(t, nm, d_dx2, dx, n, TOL_EXACT);

    /* determinism of the dtemp reduction */
    float *d_dy3 = gt_up(t, dy, n), *d_dx3 = gt_poison(t, n), *d_dtemp3 = gt_up(t, dtemp0, H);
    gk_rope_l2norm_backward(t->g->stream, d_dx3, d_dtemp3, d_dy3, d_x, d_normc, d_temp, d_cos, d_sin, rows, T, H, dh,
                            rd, scale, eps);
    const int same = same_bits(t, d_dx3, d_dx, n) && same_bits(t, d_dtemp3, d_dtemp, H);
    snprintf(nm, sizeof nm, "rope_l2norm bwd deterministic %s", tag);
    gt_assert(t, same, nm, "%s", same ? "two runs bit-identical" : "two runs differ");
    gt_reset(t);
}

/* ---- plain partial RoPE (in place) ------------------------------------------------------------------------ */

static void check_rope(GpuTest *t, int rows, int T, int H, int dh, int rd) {
    const size_t n = (size_t)rows * H * dh, nt = (size_t)T * (rd / 2);
    char nm[128], tag[64];
    snprintf(tag, sizeof tag, "rows%d T%d H%d dh%d rd%d", rows, T, H, dh, rd);
    const float *x0 = gt_rand(t, n, 1.0f);
    float *cosv, *sinv;
    tables(t, T, rd, &cosv, &sinv);
    const float *d_cos = gt_up(t, cosv, nt ? nt : 1), *d_sin = gt_up(t, sinv, nt ? nt : 1);
    float *x = gt_copy(t, x0, n);
    rope_forward(x, cosv, sinv, rows, T, H, dh, rd);
    float *d_x = gt_up(t, x0, n);
    gk_rope_forward(t->g->stream, d_x, d_cos, d_sin, rows, T, H, dh, rd);
    snprintf(nm, sizeof nm, "rope fwd %s", tag);
    gt_check(t, nm, d_x, x, n, TOL_EXACT);

    float *dx = gt_copy(t, x0, n);
    rope_backward(dx, cosv, sinv, rows, T, H, dh, rd);
    float *d_dx = gt_up(t, x0, n);
    gk_rope_backward(t->g->stream, d_dx, d_cos, d_sin, rows, T, H, dh, rd);
    snprintf(nm, sizeof nm, "rope bwd %s", tag);
    gt_check(t, nm, d_dx, dx, n, TOL_EXACT);
    gt_reset(t);
}

/* ---- empty launches ------------------------------------------------------------------------------------------ */

/* rows = 0 (B = 0) launches nothing and leaves the buffers alone */
static void check_empty(GpuTest *t) {
    const float *h = gt_rand(t, 64, 1.0f);
    float *d = gt_up(t, h, 64);
    gk_cca_conv_forward(t->g->stream, d, d, d, d, d, d, d, 0, 4, 8, 4, 2, 2);
    gk_cca_conv_backward(t->g->stream, d, d, d, d, d, d, d, d, d, d, d, 0, 4, 8, 4, 2, 2);
    gk_qk_mean_forward(t->g->stream, d, d, d, d, 0, 2, 1, 4);
    gk_qk_mean_backward(t->g->stream, d, d, d, d, 0, 2, 1, 4);
    gk_delayed_value_forward(t->g->stream, d, d, d, 0, 4, 4);
    gk_delayed_value_backward(t->g->stream, d, d, d, 2, 0, 4);
    gk_l2norm_rope_forward(t->g->stream, d, d, d, d, d, d, 0, 4, 2, 4, 4, 2.0f, 1e-7f);
    gk_rope_l2norm_backward(t->g->stream, d, d, d, d, d, d, d, d, 0, 4, 2, 4, 4, 2.0f, 1e-7f);
    gk_rope_forward(t->g->stream, d, d, d, 0, 4, 2, 4, 4);
    gk_rope_backward(t->g->stream, d, d, d, 0, 4, 2, 4, 4);
    const float *back = gt_down(t, d, 64);
    const int same = memcmp(back, h, 64 * sizeof *h) == 0;
    gt_assert(t, same, "empty launches (rows 0) touch nothing", "%s", same ? "buffer unchanged" : "buffer changed");
    gt_reset(t);
}

void test_gpu_cca(GpuTest *t) {
    const ConvShape conv[] = {
        {1, 1, 2, 8, 2, 2},    /* B = 1, T = 1 */
        {1, 1, 1, 4, 3, 3},    /* T shorter than both kernels */
        {1, 2, 4, 8, 3, 3},    /* T = 2 under both kernels, four heads (the oracle's cfg4) */
        {1, 3, 4, 8, 3, 3},
        {1, 1, 3, 3, 1, 1},    /* no time mixing at all */
        {2, 7, 3, 5, 3, 1},    /* odd everything */
        {3, 5, 2, 12, 1, 3},   /* sequences shorter than the row tile, several per tile */
        {2, 33, 3, 20, 2, 2},  /* sequence boundaries inside tiles */
        {2, 33, 2, 16, 2, 2},  /* the tensor-core form's smallest head */
        {1, 200, 2, 130, 3, 3}, /* dh > 128: two output tiles per group, dh·k1 = 390 over four kk tiles */
        {2, 300, 2, 64, 4, 4}, /* k0 = k1 = 4, the largest fast path */
        {2, 150, 1, 256, 2, 1},
        {1, 9, 2, 6, 5, 5},    /* the k > 4 fallbacks */
        {2, 2048, 6, 128, 2, 2}, /* realistic: C = 768, dh = 128, k0 = k1 = 2 */
    };
    for (size_t i = 0; i < sizeof conv / sizeof conv[0]; i++) {
        const int realistic = conv[i].T == 2048;
        if (!realistic || gt_gpu_sized(t, "convolution at B 2, T 2048, C 768, dh 128"))
            check_conv(t, conv[i], realistic || i == 5);
    }

    check_qk_mean(t, 1, 1, 1, 1);
    check_qk_mean(t, 7, 4, 2, 5);
    check_qk_mean(t, 33, 6, 3, 16);
    check_qk_mean(t, 4096, 8, 2, 128);
    check_cca_decode_rows(t, 1, 1, 2, 0, 4, 2, 8, 4);      /* one token of one sequence */
    check_cca_decode_rows(t, 32, 1, 2, 37, 8, 2, 128, 64); /* a batch-32 decoding step at the benchmark's shape */
    check_cca_decode_rows(t, 3, 5, 3, 11, 6, 3, 16, 16);   /* prefill pieces of several rows */
    check_cca_decode_rows(t, 2, 4, 0, 6, 4, 2, 8, 8);      /* no state rows (k 1/1) */

    check_delayed_value(t, 1, 1, 1);
    check_delayed_value(t, 3, 5, 7);
    check_delayed_value(t, 2, 2048, 128);

    const NormShape norms[] = {
        {1, 1, 1, 4, 4, 1},       {10, 5, 3, 6, 4, 0},   {9, 3, 2, 7, 3, 1}, /* odd rd: the last channel stays */
        {5, 5, 2, 1, 0, 1},       {6, 3, 2, 33, 0, 0},   {64, 16, 2, 128, 64, 1},
        {4096, 2048, 2, 128, 64, 1}, /* realistic keys (temperature) */
        {4096, 2048, 8, 128, 64, 0}, /* realistic queries */
    };
    for (size_t i = 0; i < sizeof norms / sizeof norms[0]; i++) check_l2norm_rope(t, norms[i]);

    check_rope(t, 1, 1, 1, 2, 2);
    check_rope(t, 7, 3, 3, 10, 6);
    check_rope(t, 13, 4, 2, 9, 5);
    check_rope(t, 4096, 2048, 8, 128, 64);

    check_empty(t);
}
