/* The element-wise ops (bf16 rounding bit for bit, scaling, sum of squares) and the GPU optimizer against the CPU
 * one (src/optim/optim.c): three Muon + AdamW steps from the same start, the moments, clipping, determinism, and the
 * checkpoint state round trip; the batched Muon groups on a small ZAYA model's table (expert stacks, the same
 * projection across layers) against the CPU, the unbatched step and themselves; and a timing print of one step of
 * the 1.0B bench-gpu model, unbatched vs batched. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/config.h"
#include "gpu/gpu_optim.h"
#include "bf16_specials.h"
#include "gpu_test.h"
#include "model/model.h"
#include "optim/optim.h"
#include "model/params.h"

static uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}
static float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ---- gk_f32_to_bf16: bit for bit zy_f32_to_bf16 ----
 * n values from d_src + src_off into d_dst + dst_off: aligned bases take the four-at-a-time kernel (n % 4 its tail),
 * an unaligned one the one-at-a-time kernel. */
static void test_bf16_round_case(GpuTest *t, size_t n, size_t src_off, size_t dst_off);
static void test_bf16_round(GpuTest *t) {
    test_bf16_round_case(t, 200000, 0, 0);  /* four at a time */
    test_bf16_round_case(t, 200003, 0, 0);  /* four at a time and a tail of 3 */
    test_bf16_round_case(t, 7, 0, 0);       /* one float4 and the tail */
    test_bf16_round_case(t, 3, 0, 0);       /* tail only: the one-at-a-time kernel */
    test_bf16_round_case(t, 200001, 1, 0);  /* unaligned source: one at a time */
    test_bf16_round_case(t, 200000, 0, 1);  /* unaligned destination: one at a time */
    test_bf16_round_case(t, (size_t)8192 * 1024, 0, 0); /* an [N, D] activation at bench-gpu's size */
}
static void test_bf16_round_case(GpuTest *t, size_t n, size_t src_off, size_t dst_off) {
    float *src = gt_host(t, n);
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        if (i < n_bf16_specials)
            u = bf16_specials[i];
        else if (i % 4 == 0) /* any bit pattern: NaNs, infs, subnormals included */
            u = (uint32_t)zy_rng_next(&t->rng);
        else if (i % 4 == 1) /* exact halfway cases, even and odd upper halves */
            u = ((uint32_t)zy_rng_next(&t->rng) & 0xffff0000u) | 0x8000u;
        else if (i % 4 == 2) /* within one step of halfway */
            u = ((uint32_t)zy_rng_next(&t->rng) & 0xffff0000u) | (0x7fffu + (uint32_t)(zy_rng_next(&t->rng) % 3));
        else
            u = f2u((float)zy_rng_normal(&t->rng) * 3.0f);
        memcpy(&src[i], &u, sizeof u); /* no float arithmetic on the patterns */
    }
    float *d_src = (float *)gt_dev(t, (n + src_off) * sizeof(float)) + src_off;
    ZyErr err = {{0}};
    if (gpu_upload(t->g, d_src, src, n * sizeof(float), &err)) fprintf(stderr, "  %s\n", err.msg);
    uint16_t *d_dst = (uint16_t *)gt_dev(t, (n + dst_off) * sizeof(uint16_t)) + dst_off;
    gpu_memset_async(t->g, d_dst, 0x5a, n * sizeof(uint16_t)); /* poison */
    gk_f32_to_bf16(t->g->stream, d_dst, d_src, (long)n);
    uint16_t *h = (uint16_t *)gt_host(t, n / 2 + 1);
    size_t bad = 0, first = 0;
    if (gpu_download(t->g, h, d_dst, n * sizeof(uint16_t), &err)) {
        bad = n;
        fprintf(stderr, "  %s\n", err.msg);
    } else {
        for (size_t i = 0; i < n; i++) {
            float f;
            memcpy(&f, &src[i], sizeof f);
            if (h[i] != zy_f32_to_bf16(f) && !bad++) first = i;
        }
    }
    uint32_t fu;
    memcpy(&fu, &src[first], sizeof fu);
    char name[120];
    snprintf(name, sizeof name, "gk_f32_to_bf16 bit-exact n %zu, offsets %zu/%zu", n, src_off, dst_off);
    gt_assert(t, bad == 0, name, "%zu of %zu differ (first %08x: %04x vs %04x)", bad, n, fu, bad ? h[first] : 0,
              bad ? zy_f32_to_bf16(u2f(fu)) : 0);
}

/* ---- gk_bf16_to_f32: every one of the 65536 bf16 patterns widened bit for bit as zy_bf16_to_f32, at an odd
 * offset (the mapped upload widens tensors wherever the table puts them) ---- */
static void test_bf16_widen(GpuTest *t) {
    const size_t n = 65536 + 3;
    uint16_t *src = (uint16_t *)gt_host(t, n / 2 + 1);
    for (size_t i = 0; i < n; i++) src[i] = (uint16_t)(i * 40503u); /* an odd multiplier: every pattern once */
    uint16_t *d_src = (uint16_t *)gt_dev(t, (n + 1) * sizeof(uint16_t)) + 1;
    float *d_dst = (float *)gt_dev(t, (n + 1) * sizeof(float)) + 1;
    ZyErr err = {{0}};
    size_t bad = n;
    gpu_memset_async(t->g, d_dst, 0x5a, n * sizeof(float)); /* poison */
    if (gpu_upload(t->g, d_src, src, n * sizeof(uint16_t), &err) == 0) {
        gk_bf16_to_f32(t->g->stream, d_dst, d_src, (long)n);
        float *h = gt_down(t, d_dst, n);
        bad = 0;
        for (size_t i = 0; i < n; i++) bad += f2u(h[i]) != f2u(zy_bf16_to_f32(src[i]));
    }
    gt_assert(t, bad == 0, "gk_bf16_to_f32 bit-exact, all 65536 patterns", "%zu of %zu differ %s", bad, n, err.msg);
}

/* ---- gk_add_bf16_to_f32: dst += widened src (cuDNN's attention backward adds its bf16 gradients so), bit for bit
 * the CPU's fp32 sum of dst and zy_bf16_to_f32(src) ---- */
static void test_bf16_add(GpuTest *t) {
    const size_t n = 100003;
    float *dst = gt_rand(t, n, 2.0f), *ref = gt_copy(t, dst, n), *vals = gt_rand(t, n, 0.5f);
    uint16_t *src = (uint16_t *)gt_host(t, n / 2 + 1);
    for (size_t i = 0; i < n; i++) {
        src[i] = zy_f32_to_bf16(vals[i]);
        ref[i] += zy_bf16_to_f32(src[i]);
    }
    float *d_dst = gt_up(t, dst, n);
    uint16_t *d_src = (uint16_t *)gt_dev(t, n * sizeof(uint16_t));
    ZyErr err = {{0}};
    size_t bad = n;
    if (gpu_upload(t->g, d_src, src, n * sizeof(uint16_t), &err) == 0) {
        gk_add_bf16_to_f32(t->g->stream, d_dst, d_src, (long)n);
        float *h = gt_down(t, d_dst, n);
        bad = 0;
        for (size_t i = 0; i < n; i++) bad += f2u(h[i]) != f2u(ref[i]);
    }
    gt_assert(t, bad == 0, "gk_add_bf16_to_f32 bit-exact against the CPU's sums", "%zu of %zu differ %s", bad, n,
              err.msg);
}

/* ---- gk_scale, gk_sumsq ---- */
static void test_scale_sumsq(GpuTest *t) {
    const size_t n = 100003;
    const float a = -1.37f;
    float *x = gt_rand(t, n, 2.0f), *ref = gt_copy(t, x, n);
    for (size_t i = 0; i < n; i++) ref[i] *= a;
    float *d = gt_up(t, x, n);
    gk_scale(t->g->stream, d, a, (long)n);
    float *h = gt_down(t, d, n);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += f2u(h[i]) != f2u(ref[i]);
    gt_assert(t, bad == 0, "gk_scale bit-exact", "%zu of %zu differ", bad, n);

    /* *out += Σ x²: from a non-zero start, twice (a sub-range the second time), against a double host sum */
    const size_t m = 3000017;
    float *y = gt_rand(t, m, 1.5f);
    float *d_y = gt_up(t, y, m);
    double *d_out = gt_dev(t, 2 * sizeof(double));
    const double start[2] = {0.25, 0.25};
    ZyErr err = {{0}};
    double got[2] = {0, 0};
    int ok = gpu_upload(t->g, d_out, start, sizeof start, &err) == 0;
    gk_sumsq(t->g->stream, d_out, d_y, (long)m);
    gk_sumsq(t->g->stream, d_out + 1, d_y, (long)m);
    gk_sumsq(t->g->stream, d_out + 1, d_y + 5, (long)(m - 9));
    ok = ok && gpu_download(t->g, got, d_out, sizeof got, &err) == 0;
    double s_all = 0, s_sub = 0;
    for (size_t i = 0; i < m; i++) s_all += (double)y[i] * y[i];
    for (size_t i = 5; i < m - 4; i++) s_sub += (double)y[i] * y[i];
    const double want0 = 0.25 + s_all, want1 = 0.25 + s_all + s_sub;
    const double e0 = fabs(got[0] - want0) / want0, e1 = fabs(got[1] - want1) / want1;
    gt_assert(t, ok && e0 <= 1e-12 && e1 <= 1e-12, "gk_sumsq (accumulates) vs double host sum",
              "rel err %.2e, %.2e (tol 1e-12)", e0, e1);
    /* the same inputs, the same bits (fixed order) */
    double again = 0;
    ok = gpu_upload(t->g, d_out, start, sizeof(double), &err) == 0;
    gk_sumsq(t->g->stream, d_out, d_y, (long)m);
    ok = ok && gpu_download(t->g, &again, d_out, sizeof again, &err) == 0;
    gt_assert(t, ok && memcmp(&again, &got[0], sizeof again) == 0, "gk_sumsq deterministic", "%.17g vs %.17g", again,
              got[0]);
}

/* ---- the optimizer ---- */

/* Every kind of tensor a step sees: Muon matrices wide, tall, square, odd, row, column and expert stacks (tall
 * ones and some larger than one partial-sum chunk), router tensors (".mlp.gate.": lr × router_lr_scale) on Muon and
 * AdamW, AdamW tensors with decay (2+ dims) and without, one spanning several AdamW chunks, and a buffer. */
static int optim_table(ParamTable *t, ZyErr *err) {
    static const struct {
        const char *name;
        ParamKind kind;
        int ndim;
        int64_t shape[3];
    } specs[] = {{"model.embed_tokens.weight", PARAM_ADAMW, 2, {10, 6}},
                 {"model.layers.0.mlp.gate.down_proj.weight", PARAM_MUON, 2, {16, 24}},
                 {"muon_tall", PARAM_MUON, 2, {40, 12}},
                 {"norm.weight", PARAM_ADAMW, 1, {7}},
                 {"muon_row", PARAM_MUON, 2, {1, 32}},
                 {"muon_col", PARAM_MUON, 2, {32, 1}},
                 {"model.layers.0.mlp.gate.bias", PARAM_ADAMW, 1, {5}},
                 {"muon_experts", PARAM_MUON, 3, {3, 8, 12}},
                 {"buffer", PARAM_BUFFER, 1, {4}},
                 {"muon_experts_tall", PARAM_MUON, 3, {4, 96, 32}},
                 {"adamw_big", PARAM_ADAMW, 1, {70000}},
                 {"model.layers.0.mlp.gate.router_mlp.weight", PARAM_ADAMW, 2, {9, 33}},
                 {"muon_square", PARAM_MUON, 2, {64, 64}},
                 {"adamw_conv", PARAM_ADAMW, 3, {5, 1, 2}},
                 {"muon_odd", PARAM_MUON, 2, {37, 101}},
                 {"muon_big_tall", PARAM_MUON, 2, {300, 128}},
                 {"muon_big_wide", PARAM_MUON, 2, {96, 400}}};
    memset(t, 0, sizeof *t);
    for (size_t i = 0; i < ZY_ARRAY_LEN(specs); i++)
        if (params_add(t, specs[i].name, specs[i].kind, INIT_ZERO, specs[i].ndim, specs[i].shape, err) < 0) return -1;
    return params_alloc(t, err);
}

#define STEPS 3

typedef struct {
    ParamTable tab;
    OptimConfig cfg;
    double lr;
    float *w0;             /* start weights [total] */
    float *grads[STEPS];   /* each step's gradients [total] (zero on buffers and padding) */
} OptimCase;

/* Runs the STEPS GPU steps from w0 on a fresh optimizer with at most max_batch matrices per Muon group (0: the
 * default grouping, 1: unbatched) and Newton–Schulz's symmetric products in bands of band_rows (0: the default
 * choice, -1: as created, which keeps the run's ZAYA_GPU_NS_BANDS);
 * leaves the weights in d_w and the optimizer open. */
static int gpu_run_banded(GpuTest *t, const OptimCase *c, GpuOptimizer *o, float *d_w, float *d_g, int max_batch,
                          int band_rows) {
    ZyErr err = {{0}};
    const size_t bytes = c->tab.total * sizeof(float);
    if (gpu_upload(t->g, d_w, c->w0, bytes, &err) ||
        gpu_optim_create_grouped(o, t->g, &c->tab, &c->cfg, 0, c->tab.total, max_batch, &err)) {
        fprintf(stderr, "  %s\n", err.msg);
        return -1;
    }
    if (band_rows >= 0) o->ns_band_rows = band_rows;
    for (int s = 0; s < STEPS; s++)
        if (gpu_upload(t->g, d_g, c->grads[s], bytes, &err) ||
            gpu_optim_step(o, t->g, &c->tab, d_w, d_g, c->lr, 1.0f, &err)) {
            fprintf(stderr, "  %s\n", err.msg);
            return -1;
        }
    if (gpu_sync(t->g, "optimizer steps", &err)) {
        fprintf(stderr, "  %s\n", err.msg);
        return -1;
    }
    return 0;
}

static int gpu_run(GpuTest *t, const OptimCase *c, GpuOptimizer *o, float *d_w, float *d_g, int max_batch) {
    return gpu_run_banded(t, c, o, d_w, d_g, max_batch, -1);
}

/* The CPU optimizer's STEPS steps from w0 (bf16: optim_set_bf16). Weights into w, state into m, v. */
static int cpu_run(OptimCase *c, int bf16, float *w, float *m, float *v) {
    ZyErr err = {{0}};
    Optimizer o;
    ParamTable *tab = &c->tab;
    memcpy(tab->data, c->w0, tab->total * sizeof(float));
    if (optim_create(&o, tab, &c->cfg, &err)) {
        fprintf(stderr, "  optim_create: %s\n", err.msg);
        return -1;
    }
    optim_set_bf16(&o, bf16 ? ZY_BF16_PRODUCTS_ONEDNN : ZY_BF16_PRODUCTS_FP32);
    for (int s = 0; s < STEPS; s++) {
        memcpy(tab->grad, c->grads[s], tab->total * sizeof(float));
        optim_step(&o, tab, c->lr);
    }
    memcpy(w, tab->data, tab->total * sizeof(float));
    memcpy(m, o.exp_avg, tab->total * sizeof(float));
    memcpy(v, o.exp_avg_sq, tab->total * sizeof(float));
    optim_free(&o);
    return 0;
}

static size_t bits_equal(const float *a, const float *b, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += f2u(a[i]) == f2u(b[i]);
    return k;
}

/* The GPU's bf16 Newton–Schulz keeps its iterates X, A = XXᵀ and B = bA + cA² in bf16 (Muon's reference form; the
 * coefficients in the products' alpha / beta), where the CPU's bf16 mode rounds only the products' operands and
 * keeps the iterates fp32. Both are held to the CPU's fp32 step. Five iterations on a random matrix, simulated in
 * numpy with nearest-even rounding at each form's points: the GPU's form lands 0.9-1.5e-2 from fp32, the CPU's bf16
 * 1.3-3.6e-2, and the two 1.6-3.7e-2 from each other (the 3.8e-2 this test's bar of 2e-2 against the CPU's bf16
 * mode met on the CPU emulator); the GPU's form under two summation orders 0-5e-3 apart. A wrong coefficient,
 * transpose or band is off by O(1). */
#define BF16_MUON_TOL 3e-2

/* Per tensor: Muon by the relative error of its update (w − w0), within mu_tol; AdamW by the weights (the CPU's
 * arithmetic, operation for operation: bit-identical with a gcc build) within 1e-6; buffers untouched. */
static void compare_weights(GpuTest *t, const OptimCase *c, const float *gw, const float *cw, double mu_tol,
                            const char *label) {
    const ParamTable *tab = &c->tab;
    double worst_mu = 0, worst_aw = 0;
    const char *worst_mu_name = "-", *worst_aw_name = "-";
    size_t aw_n = 0, aw_eq = 0;
    int buffers_ok = 1;
    for (int i = 0; i < tab->count; i++) {
        const ParamInfo *p = &tab->info[i];
        const size_t n = p->numel, off = p->offset;
        if (p->kind == PARAM_BUFFER) {
            buffers_ok &= memcmp(gw + off, c->w0 + off, n * sizeof(float)) == 0;
        } else if (p->kind == PARAM_MUON && !c->cfg.adamw_only) {
            float *du_g = malloc(n * sizeof *du_g), *du_c = malloc(n * sizeof *du_c);
            if (!du_g || !du_c) {
                free(du_g), free(du_c);
                worst_mu = INFINITY;
                continue;
            }
            for (size_t j = 0; j < n; j++) du_g[j] = gw[off + j] - c->w0[off + j], du_c[j] = cw[off + j] - c->w0[off + j];
            const double e = gt_rel_err(du_g, du_c, n);
            if (!(e <= worst_mu) && !isnan(worst_mu)) worst_mu = e, worst_mu_name = p->name; /* a NaN sticks */
            free(du_g), free(du_c);
        } else {
            const double e = gt_rel_err(gw + off, cw + off, n);
            if (!(e <= worst_aw) && !isnan(worst_aw)) worst_aw = e, worst_aw_name = p->name;
            aw_n += n;
            aw_eq += bits_equal(gw + off, cw + off, n);
        }
    }
    char name[96];
    snprintf(name, sizeof name, "%s Muon updates vs CPU", label);
    gt_assert(t, worst_mu <= mu_tol, name, "worst rel err %.2e (%s; tol %.0e)", worst_mu, worst_mu_name, mu_tol);
    snprintf(name, sizeof name, "%s AdamW weights vs CPU", label);
    gt_assert(t, worst_aw <= 1e-6, name, "worst rel err %.2e (%s), %zu of %zu bit-identical", worst_aw, worst_aw_name,
              aw_eq, aw_n);
    snprintf(name, sizeof name, "%s buffers untouched", label);
    gt_assert(t, buffers_ok, name, "%s", buffers_ok ? "bit-identical to the start" : "a buffer changed");
}

/* Random start weights and STEPS gradients (zero on buffers and padding) for c->tab. */
static void fill_case(GpuTest *t, OptimCase *c) {
    const size_t total = c->tab.total;
    c->w0 = gt_rand(t, total, 0.5f);
    for (int s = 0; s < STEPS; s++) {
        c->grads[s] = gt_host(t, total);
        for (int i = 0; i < c->tab.count; i++) {
            const ParamInfo *p = &c->tab.info[i];
            if (!param_trainable(p)) continue;
            for (size_t j = 0; j < p->numel; j++)
                c->grads[s][p->offset + j] = (float)(0.1 * (s + 1) * zy_rng_normal(&t->rng));
        }
    }
}

/* Largest relative error of a Muon tensor's update (w − w0) between two GPU runs. */
static double muon_update_err(const OptimCase *c, const float *wa, const float *wb) {
    double worst = 0;
    for (int i = 0; i < c->tab.count; i++) {
        const ParamInfo *p = &c->tab.info[i];
        if (p->kind != PARAM_MUON) continue;
        float *da = malloc(p->numel * sizeof *da), *db = malloc(p->numel * sizeof *db);
        if (!da || !db) {
            free(da), free(db);
            return INFINITY;
        }
        for (size_t j = 0; j < p->numel; j++)
            da[j] = wa[p->offset + j] - c->w0[p->offset + j], db[j] = wb[p->offset + j] - c->w0[p->offset + j];
        const double e = gt_rel_err(da, db, p->numel);
        free(da), free(db);
        if (!(e <= worst)) worst = e;
    }
    return worst;
}

/* A small ZAYA1 (2 layers, 8 experts): expert stacks tall ([8, 320, 96]: two norm chunks per matrix) and wide
 * ([8, 96, 160]), square and wide attention projections, router matrices (router_lr_scale) down to [9, 40]. */
static const char SMALL_ZAYA_JSON[] =
    "{\"model_type\": \"zaya\", \"vocab_size\": 256, \"hidden_size\": 96, \"num_hidden_layers\": 2, "
    "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 24, \"moe_intermediate_size\": 160, "
    "\"num_experts\": 8, \"num_experts_per_tok\": 1, \"router_hidden_size\": 40, \"cca_time0\": 2, \"cca_time1\": 2, "
    "\"rms_norm_eps\": 1e-5, \"tie_word_embeddings\": true, \"max_position_embeddings\": 256, "
    "\"rope_parameters\": {\"hybrid\": {\"rope_type\": \"default\", \"rope_theta\": 10000.0, "
    "\"partial_rotary_factor\": 0.5}}}";

/* The batched Muon groups on a model's table: the 16 experts of both layers' stacks in one group per stack shape,
 * q/o of both layers in one, v_current/v_delayed of both layers in one, and so on. Against the CPU (the same
 * tolerances as above), against themselves (bit-identical reruns), against the unbatched step (max_batch 1) and a
 * split grouping (max_batch 3): the momentum depends on no product, so it matches to the bit; the updates match to
 * the products' summation order; with no Newton–Schulz iteration (no product at all) the batched and unbatched
 * weights match to the bit, so every per-matrix norm is the one-matrix norm, bit for bit. */
static void test_model_table(GpuTest *t) {
    OptimCase c;
    ZyErr err = {{0}};
    ZayaConfig zc;
    int ok = config_parse(&zc, SMALL_ZAYA_JSON, "small ZAYA config", &err) == 0;
    ok = ok && model_param_table(&c.tab, &zc, &err) == 0;
    if (ok && params_alloc(&c.tab, &err)) {
        params_free(&c.tab);
        ok = 0;
    }
    if (!gt_assert(t, ok, "model table (2 layers, 8 experts)", "%s", ok ? "built" : err.msg)) return;
    optim_config_default(&c.cfg);
    c.cfg.weight_decay = 0.1;
    c.cfg.router_lr_scale = 0.5;
    c.lr = 0.02;
    const size_t total = c.tab.total, bytes = total * sizeof(float);
    fill_case(t, &c);
    float *cw = gt_host(t, total), *cm = gt_host(t, total), *cv = gt_host(t, total);
    ok = cpu_run(&c, 0, cw, cm, cv) == 0;
    if (!gt_assert(t, ok, "model table: CPU reference steps", "%s", ok ? "done" : "failed")) {
        params_free(&c.tab);
        return;
    }
    t->g->bf16 = 0;
    float *d_w = gt_dev(t, bytes), *d_g = gt_dev(t, bytes);
    GpuOptimizer go;
    ok = gpu_run(t, &c, &go, d_w, d_g, 0) == 0;
    if (!gt_assert(t, ok, "model table: batched GPU steps (fp32)", "%s", ok ? "done" : "failed")) {
        params_free(&c.tab);
        return;
    }
    gt_assert(t, go.max_batch == 2 * 8 && go.n_groups < go.n_muon, "model table: Muon matrices grouped",
              "%d matrices in %d groups, the largest %d (want 16: both layers' experts)", go.n_muon, go.n_groups,
              go.max_batch);
    float *gw = gt_down(t, d_w, total), *gm = gt_host(t, total), *gv = gt_host(t, total);
    ok = gpu_optim_download(&go, t->g, gm, gv, &err) == 0;
    gpu_optim_free(&go);
    gt_assert(t, ok, "model table: state download", "%s", ok ? "done" : err.msg);
    compare_weights(t, &c, gw, cw, 1e-5, "model fp32");
    const double em = gt_rel_err(gm, cm, total), ev = gt_rel_err(gv, cv, total);
    gt_assert(t, em <= 1e-6 && ev <= 1e-6, "model table: exp_avg / exp_avg_sq vs CPU",
              "rel err %.2e / %.2e, %zu / %zu of %zu bit-identical", em, ev, bits_equal(gm, cm, total),
              bits_equal(gv, cv, total), total);

    /* bit-identical reruns */
    {
        GpuOptimizer go2;
        float *d_w2 = gt_dev(t, bytes);
        int ran = gpu_run(t, &c, &go2, d_w2, d_g, 0) == 0;
        float *gw2 = gt_down(t, d_w2, total), *gm2 = gt_host(t, total), *gv2 = gt_host(t, total);
        ran = ran && gpu_optim_download(&go2, t->g, gm2, gv2, &err) == 0;
        if (ran) gpu_optim_free(&go2);
        gt_assert(t, ran && memcmp(gw2, gw, bytes) == 0 && memcmp(gm2, gm, bytes) == 0 && memcmp(gv2, gv, bytes) == 0,
                  "model table: batched steps deterministic", "%zu / %zu / %zu of %zu bit-identical",
                  bits_equal(gw2, gw, total), bits_equal(gm2, gm, total), bits_equal(gv2, gv, total), total);
    }

    /* unbatched (max_batch 1: every matrix on its own, the step before batching) and split groups (max_batch 3) */
    const int limits[] = {1, 3};
    for (size_t li = 0; li < ZY_ARRAY_LEN(limits); li++) {
        GpuOptimizer gu;
        float *d_w2 = gt_dev(t, bytes);
        char name[96];
        snprintf(name, sizeof name, "model table: max_batch %d steps", limits[li]);
        int ran = gpu_run(t, &c, &gu, d_w2, d_g, limits[li]) == 0;
        if (!gt_assert(t, ran && gu.max_batch <= limits[li], name, "%s: %d groups, the largest %d",
                       ran ? "done" : "failed", ran ? gu.n_groups : 0, ran ? gu.max_batch : 0))
            continue;
        float *uw = gt_down(t, d_w2, total), *um = gt_host(t, total), *uv = gt_host(t, total);
        ran = gpu_optim_download(&gu, t->g, um, uv, &err) == 0;
        gpu_optim_free(&gu);
        snprintf(name, sizeof name, "model max_batch %d", limits[li]);
        compare_weights(t, &c, uw, cw, 1e-5, name);
        const double e = muon_update_err(&c, uw, gw);
        snprintf(name, sizeof name, "model table: max_batch %d vs batched", limits[li]);
        gt_assert(t, ran && memcmp(um, gm, bytes) == 0 && memcmp(uv, gv, bytes) == 0 && e <= 1e-5, name,
                  "moments %zu / %zu of %zu bit-identical; Muon updates rel err %.2e (tol 1e-5), %zu of %zu weights "
                  "bit-identical", bits_equal(um, gm, total), bits_equal(uv, gv, total), total, e,
                  bits_equal(uw, gw, total), total);
    }

    /* no Newton–Schulz iteration: momentum, per-matrix norm, normalisation and update only; batched = unbatched to
     * the bit */
    {
        OptimCase z = c;
        z.cfg.muon_ns_steps = 0;
        GpuOptimizer ga, gu;
        float *d_wa = gt_dev(t, bytes), *d_wu = gt_dev(t, bytes);
        int ran = gpu_run(t, &z, &ga, d_wa, d_g, 0) == 0;
        if (ran) gpu_optim_free(&ga);
        ran = ran && gpu_run(t, &z, &gu, d_wu, d_g, 1) == 0;
        if (ran) gpu_optim_free(&gu);
        float *wa = gt_down(t, d_wa, total), *wu = gt_down(t, d_wu, total);
        size_t changed = 0;
        for (size_t i = 0; i < total; i++) changed += f2u(wa[i]) != f2u(z.w0[i]);
        gt_assert(t, ran && memcmp(wa, wu, bytes) == 0 && changed > 0,
                  "model table: no NS iteration, batched = unbatched", "%zu of %zu weights bit-identical (%zu moved)",
                  bits_equal(wa, wu, total), total, changed);
    }

    /* bf16 products, batched, against the CPU's fp32 step (BF16_MUON_TOL), and a rerun bit for bit */
    {
        float *bw = gt_host(t, total), *bm = gt_host(t, total), *bv = gt_host(t, total);
        ok = cpu_run(&c, 0, bw, bm, bv) == 0;
        t->g->bf16 = 1;
        GpuOptimizer gb, gb2;
        float *d_w2 = gt_dev(t, bytes);
        ok = ok && gpu_run(t, &c, &gb, d_w, d_g, 0) == 0;
        const int rerun = ok && gpu_run(t, &c, &gb2, d_w2, d_g, 0) == 0;
        if (rerun) gpu_optim_free(&gb2);
        t->g->bf16 = 0;
        if (gt_assert(t, ok, "model table: batched GPU steps (bf16)", "%s", ok ? "done" : "failed")) {
            gpu_optim_free(&gb);
            float *w1 = gt_down(t, d_w, total), *w2 = gt_down(t, d_w2, total);
            compare_weights(t, &c, w1, bw, BF16_MUON_TOL, "model bf16");
            gt_assert(t, rerun && memcmp(w1, w2, bytes) == 0, "model table: bf16 steps deterministic",
                      "%zu of %zu weights bit-identical", bits_equal(w1, w2, total), total);
        }
    }

    /* Newton–Schulz's symmetric products in bands of 8 rows, every Muon matrix here cut into several (at the real
     * sizes, >= 1,024 rows, the default cuts them too), fp32 and bf16: against the CPU's step (fp32: its syrk; bf16:
     * its whole products) and against the GPU's whole products, to the tolerances above (bf16: an fp32-level
     * difference that moves an entry of A across a bf16 rounding boundary is carried on by the iterations: 8e-3
     * when the CPU's bf16 step was given the same bands), and a rerun bit for bit */
    for (int bf = 0; bf <= 1; bf++) {
        float *bw = gt_host(t, total), *bm = gt_host(t, total), *bv = gt_host(t, total);
        ok = cpu_run(&c, 0, bw, bm, bv) == 0; /* bf16: against fp32, as above */
        t->g->bf16 = bf;
        GpuOptimizer gb, gb2, gw0;
        float *d_w2 = gt_dev(t, bytes), *d_w3 = gt_dev(t, bytes);
        ok = ok && gpu_run_banded(t, &c, &gb, d_w, d_g, 0, 8) == 0;
        const int rerun = ok && gpu_run_banded(t, &c, &gb2, d_w2, d_g, 0, 8) == 0;
        const int whole = ok && gpu_run_banded(t, &c, &gw0, d_w3, d_g, 0, 0) == 0;
        if (rerun) gpu_optim_free(&gb2);
        if (whole) gpu_optim_free(&gw0);
        t->g->bf16 = 0;
        char name[96];
        snprintf(name, sizeof name, "model table: Newton-Schulz in 8-row bands (%s)", bf ? "bf16" : "fp32");
        if (!gt_assert(t, ok && rerun && whole, name, "%s", ok && rerun && whole ? "done" : "failed")) continue;
        gpu_optim_free(&gb);
        float *w1 = gt_down(t, d_w, total), *w2 = gt_down(t, d_w2, total), *w3 = gt_down(t, d_w3, total);
        compare_weights(t, &c, w1, bw, bf ? BF16_MUON_TOL : 1e-5, bf ? "model bf16 banded" : "model fp32 banded");
        const double e = muon_update_err(&c, w1, w3);
        snprintf(name, sizeof name, "model table: banded vs whole products (%s)", bf ? "bf16" : "fp32");
        gt_assert(t, e <= (bf ? 2e-2 : 1e-5), name, "Muon updates rel err %.2e (tol %.0e)", e, bf ? 2e-2 : 1e-5);
        snprintf(name, sizeof name, "model table: banded steps deterministic (%s)", bf ? "bf16" : "fp32");
        gt_assert(t, memcmp(w1, w2, bytes) == 0, name, "%zu of %zu weights bit-identical", bits_equal(w1, w2, total),
                  total);
    }
    params_free(&c.tab);
}

/* Launches of one gpu_optim_step (go_muon_group's count per group, + 1 AdamW): fp32 3 + steps × (2·nb + 3), bf16
 * 5 + steps × (2·nb + 1) (the rounded start and the widened result), 2 mirrors an iteration when the group's
 * symmetric products are cut into nb > 1 bands; no iteration: 4 (momentum, norms, normalisation, update). */
static int optim_step_launches(const GpuOptimizer *o, int bf16) {
    const int steps = o->cfg.muon_ns_steps;
    int launches = 1;
    for (int j = 0; j < o->n_groups; j++) {
        const GpuMuonGroup *gr = &o->groups[j];
        NsBand bands[NS_MAX_BANDS];
        const int nb = ns_symmetric_bands(gr->m < gr->n ? gr->m : gr->n, o->ns_band_rows, bands);
        const int per_it = 2 * nb + (bf16 ? 1 : 3) + (nb > 1 ? 2 : 0);
        launches += steps <= 0 ? 4 : (bf16 ? 5 : 3) + steps * per_it;
    }
    return launches;
}

/* One optimizer step of the 1.0B bench-gpu model (configs/bench-gpu.json: 18 layers, 16 experts [2048, 1024] and
 * [1024, 1024] per layer, 738 Muon matrices), unbatched (max_batch 1: the step before batching) and batched, in
 * bf16 and fp32 products, on random weights and gradients. Prints the times (the mean of 3 steps after a warm-up
 * step that builds the product plans); asserts only that the steps ran. Needs ~18 GB of GPU memory. */
static void test_bench_timing(GpuTest *t) {
    if (!gt_gpu_sized(t, "bench-gpu optimizer step timing")) return;
    ZyErr err = {{0}};
    ZayaConfig zc;
    ParamTable tab;
    memset(&tab, 0, sizeof tab);
    int ok = config_load(&zc, "configs/bench-gpu.json", &err) == 0 && model_param_table(&tab, &zc, &err) == 0;
    if (!gt_assert(t, ok, "bench-gpu optimizer step timing (prints only)", "%s",
                   ok ? "table built" : err.msg)) /* run from the repository root */
        return;
    const size_t total = tab.total, tile = ((size_t)1 << 24) + 7; /* not a power of two: matrices differ */
    float *d_w = gt_dev(t, total * sizeof(float)), *d_g = gt_dev(t, total * sizeof(float));
    float *hw = gt_rand(t, tile, 0.02f), *hg = gt_rand(t, tile, 1e-3f);
    for (size_t off = 0; ok && off < total; off += tile) {
        const size_t n = total - off < tile ? total - off : tile;
        ok = gpu_upload(t->g, d_w + off, hw, n * sizeof(float), &err) == 0 &&
             gpu_upload(t->g, d_g + off, hg, n * sizeof(float), &err) == 0;
    }
    if (!gt_assert(t, ok, "bench-gpu random weights and gradients", "%s", ok ? "uploaded" : err.msg)) {
        params_free(&tab);
        gt_reset(t);
        return;
    }
    OptimConfig cfg;
    optim_config_default(&cfg);
    cfg.weight_decay = 0.1;
    const int reps = 3;
    for (int bf16 = 1; bf16 >= 0; bf16--) {
        ok = 1;
        double sec[2] = {0, 0};
        int groups[2] = {0, 0}, launches[2] = {0, 0}, n_muon = 0;
        for (int batched = 0; ok && batched < 2; batched++) {
            GpuOptimizer o;
            t->g->bf16 = bf16;
            ok = gpu_optim_create_grouped(&o, t->g, &tab, &cfg, 0, total, batched ? 0 : 1, &err) == 0;
            if (!ok) break;
            ok = gpu_optim_step(&o, t->g, &tab, d_w, d_g, 1e-4, 1.0f, &err) == 0 && gpu_sync(t->g, "warm-up step", &err) == 0;
            void *timer = gpu_timer_start(t->g);
            for (int r = 0; ok && r < reps; r++) ok = gpu_optim_step(&o, t->g, &tab, d_w, d_g, 1e-4, 1.0f, &err) == 0;
            const double s = gpu_timer_stop(t->g, timer);
            ok = ok && gpu_sync(t->g, "timed steps", &err) == 0 && s > 0;
            sec[batched] = s / reps;
            groups[batched] = o.n_groups;
            launches[batched] = optim_step_launches(&o, bf16);
            n_muon = o.n_muon;
            gpu_optim_free(&o);
        }
        t->g->bf16 = 0;
        char name[96];
        snprintf(name, sizeof name, "bench-gpu optimizer step, %s (timing only)", bf16 ? "bf16" : "fp32");
        gt_assert(t, ok, name,
                  "%s%d Muon matrices: unbatched %.4f s (%d launches), batched %.4f s (%d groups, %d launches): %.2fx",
                  ok ? "" : err.msg, n_muon, sec[0], launches[0], sec[1], groups[1], launches[1],
                  sec[1] > 0 ? sec[0] / sec[1] : 0.0);
    }
    params_free(&tab);
    gt_reset(t);
}

void test_gpu_optim(GpuTest *t) {
    test_bf16_round(t);
    test_bf16_widen(t);
    test_bf16_add(t);
    test_scale_sumsq(t);

    OptimCase c;
    ZyErr err = {{0}};
    if (!gt_assert(t, optim_table(&c.tab, &err) == 0, "optimizer test table", "%s", err.msg)) return;
    optim_config_default(&c.cfg);
    c.cfg.weight_decay = 0.1;
    c.cfg.router_lr_scale = 0.5;
    c.lr = 0.02;
    const size_t total = c.tab.total, bytes = total * sizeof(float);
    fill_case(t, &c);

    /* CPU reference */
    float *cw = gt_host(t, total), *cm = gt_host(t, total), *cv = gt_host(t, total);
    const int cpu_ok = cpu_run(&c, 0, cw, cm, cv) == 0;
    if (!gt_assert(t, cpu_ok, "CPU reference steps", "%s", cpu_ok ? "done" : "failed")) {
        params_free(&c.tab);
        return;
    }

    /* GPU, fp32 products. Tolerances: the element-wise work is the CPU's operation for operation, so the AdamW
     * tensors and both moment arrays (the momentum and the moments depend on the gradients alone) agree to the bit
     * with a gcc-built CPU step (1e-6 leaves room for a CPU build that fuses multiply-adds). Muon's update goes
     * through 15 fp32 products per matrix (5 Newton–Schulz iterations) that cuBLASLt and OpenBLAS (syrk + gemm on
     * the CPU) sum in different orders: ~1e-7 relative per product, amplified by the degree-5 polynomial to ~1e-6;
     * 1e-5 is the bound the CPU's own fast-vs-reference Newton–Schulz test uses for Gaussian inputs. */
    t->g->bf16 = 0;
    float *d_w = gt_dev(t, bytes), *d_g = gt_dev(t, bytes);
    GpuOptimizer go;
    const int gpu_ok = gpu_run(t, &c, &go, d_w, d_g, 0) == 0;
    if (!gt_assert(t, gpu_ok, "GPU optimizer steps (fp32)", "%s", gpu_ok ? "done" : "failed")) {
        params_free(&c.tab);
        return;
    }
    float *gw = gt_down(t, d_w, total), *gm = gt_host(t, total), *gv = gt_host(t, total);
    int ok = gpu_optim_download(&go, t->g, gm, gv, &err) == 0;
    gt_assert(t, ok && go.step == STEPS, "GPU optimizer state download", "%s (step %lld)", ok ? "done" : err.msg,
              (long long)go.step);
    compare_weights(t, &c, gw, cw, 1e-5, "fp32");
    const double em = gt_rel_err(gm, cm, total), ev = gt_rel_err(gv, cv, total);
    gt_assert(t, em <= 1e-6 && ev <= 1e-6, "exp_avg / exp_avg_sq vs CPU",
              "rel err %.2e / %.2e, %zu / %zu of %zu bit-identical", em, ev, bits_equal(gm, cm, total),
              bits_equal(gv, cv, total), total);
    size_t muon_v_nonzero = 0;
    for (int i = 0; i < c.tab.count; i++) {
        const ParamInfo *p = &c.tab.info[i];
        if (p->kind != PARAM_MUON) continue;
        for (size_t j = 0; j < p->numel; j++) muon_v_nonzero += gv[p->offset + j] != 0.0f;
    }
    gt_assert(t, muon_v_nonzero == 0, "Muon tensors' exp_avg_sq stays zero (CPU layout)", "%zu non-zero",
              muon_v_nonzero);

    /* Determinism: the same steps from the same start give the same bits. */
    {
        GpuOptimizer go2;
        float *d_w2 = gt_dev(t, bytes);
        int ran = gpu_run(t, &c, &go2, d_w2, d_g, 0) == 0;
        float *gw2 = gt_down(t, d_w2, total), *gm2 = gt_host(t, total), *gv2 = gt_host(t, total);
        ran = ran && gpu_optim_download(&go2, t->g, gm2, gv2, &err) == 0;
        gt_assert(t,
                  ran && memcmp(gw2, gw, bytes) == 0 && memcmp(gm2, gm, bytes) == 0 && memcmp(gv2, gv, bytes) == 0,
                  "GPU steps deterministic (weights, state)", "%zu / %zu / %zu of %zu bit-identical",
                  bits_equal(gw2, gw, total), bits_equal(gm2, gm, total), bits_equal(gv2, gv, total), total);
        gpu_optim_free(&go2);
    }

    /* The bf16 copy written by the step itself (params16, issue 30 item 5): the same weights as without it, bit for
     * bit, and every AdamW and Muon weight's copy zy_f32_to_bf16 of the weight; a buffer's copy untouched. */
    {
        GpuOptimizer gc;
        const uint16_t SENT = 0xbeef;
        uint16_t *w16 = malloc(total * sizeof *w16);
        float *d_w3 = gt_dev(t, bytes), *gw3 = gt_host(t, total);
        uint16_t *d_w16 = gt_dev(t, total * sizeof *d_w16);
        int ran = w16 != NULL;
        for (size_t i = 0; ran && i < total; i++) w16[i] = SENT;
        ran = ran && gpu_upload(t->g, d_w16, w16, total * sizeof *w16, &err) == 0 &&
              gpu_upload(t->g, d_w3, c.w0, bytes, &err) == 0 &&
              gpu_optim_create_grouped(&gc, t->g, &c.tab, &c.cfg, 0, total, 0, &err) == 0;
        if (ran) {
            gc.params16 = d_w16;
            for (int s = 0; ran && s < STEPS; s++)
                ran = gpu_upload(t->g, d_g, c.grads[s], bytes, &err) == 0 &&
                      gpu_optim_step(&gc, t->g, &c.tab, d_w3, d_g, c.lr, 1.0f, &err) == 0;
            ran = ran && gpu_sync(t->g, "optimizer steps with the bf16 copy", &err) == 0 &&
                  gpu_download(t->g, gw3, d_w3, bytes, &err) == 0 &&
                  gpu_download(t->g, w16, d_w16, total * sizeof *w16, &err) == 0;
            gpu_optim_free(&gc);
        }
        size_t wrong = 0, copied = 0;
        for (int i = 0; ran && i < c.tab.count; i++) {
            const ParamInfo *p = &c.tab.info[i];
            for (size_t j = p->offset; j < p->offset + p->numel; j++) {
                const uint16_t want = p->kind == PARAM_BUFFER ? SENT : zy_f32_to_bf16(gw3[j]);
                wrong += w16[j] != want;
                copied += p->kind != PARAM_BUFFER;
            }
        }
        gt_assert(t, ran && memcmp(gw3, gw, bytes) == 0 && wrong == 0,
                  "GPU steps writing the bf16 copy (params16): same weights, copy = bf16(weights)",
                  "%s; %zu of %zu weights bit-identical; %zu of %zu copies wrong", ran ? "ran" : err.msg,
                  bits_equal(gw3, gw, total), total, wrong, copied);
        free(w16);
    }

    /* Clipping folded into the step (grad_scale): the same weights and state, bit for bit, as steps on gradients
     * clipped beforehand by grad_clip's multiply (g·scale in float, what a separate scaling pass wrote), for AdamW
     * and Muon tensors alike; the gradient arena is left as it was. */
    {
        const float scale = 0.37f;
        GpuOptimizer ga, gb;
        float *d_wa = gt_dev(t, bytes), *d_wb = gt_dev(t, bytes), *scaled = gt_host(t, total);
        float *after = gt_host(t, total);
        int ran = gpu_upload(t->g, d_wa, c.w0, bytes, &err) == 0 && gpu_upload(t->g, d_wb, c.w0, bytes, &err) == 0 &&
                  gpu_optim_create(&ga, t->g, &c.tab, &c.cfg, &err) == 0 &&
                  gpu_optim_create(&gb, t->g, &c.tab, &c.cfg, &err) == 0;
        size_t grads_changed = 0;
        for (int s = 0; ran && s < STEPS; s++) {
            for (size_t i = 0; i < total; i++) scaled[i] = c.grads[s][i] * scale;
            ran = gpu_upload(t->g, d_g, c.grads[s], bytes, &err) == 0 &&
                  gpu_optim_step(&ga, t->g, &c.tab, d_wa, d_g, c.lr, scale, &err) == 0 &&
                  gpu_download(t->g, after, d_g, bytes, &err) == 0 &&
                  gpu_upload(t->g, d_g, scaled, bytes, &err) == 0 &&
                  gpu_optim_step(&gb, t->g, &c.tab, d_wb, d_g, c.lr, 1.0f, &err) == 0;
            grads_changed += total - bits_equal(after, c.grads[s], total);
        }
        float *wa = gt_host(t, total), *wb = gt_host(t, total), *ma = gt_host(t, total), *va = gt_host(t, total);
        float *mb = gt_host(t, total), *vb = gt_host(t, total);
        ran = ran && gpu_sync(t->g, "clipped optimizer steps", &err) == 0 &&
              gpu_download(t->g, wa, d_wa, bytes, &err) == 0 && gpu_download(t->g, wb, d_wb, bytes, &err) == 0 &&
              gpu_optim_download(&ga, t->g, ma, va, &err) == 0 && gpu_optim_download(&gb, t->g, mb, vb, &err) == 0;
        gt_assert(t,
                  ran && grads_changed == 0 && memcmp(wa, wb, bytes) == 0 && memcmp(ma, mb, bytes) == 0 &&
                      memcmp(va, vb, bytes) == 0 && memcmp(wa, c.w0, bytes) != 0,
                  "GPU steps clipping as they read (grad_scale 0.37) = steps on pre-clipped gradients",
                  "%s; %zu / %zu / %zu of %zu bit-identical; %zu gradients changed", ran ? "ran" : err.msg,
                  bits_equal(wa, wb, total), bits_equal(ma, mb, total), bits_equal(va, vb, total), total,
                  grads_changed);
        gpu_optim_free(&ga), gpu_optim_free(&gb);
    }

    /* Checkpoint round trip: a fresh optimizer given the downloaded state (and the step count) takes the next step
     * exactly as the one that never stopped. */
    {
        GpuOptimizer resumed;
        float *d_w2 = gt_up(t, gw, total);
        ok = gpu_optim_create(&resumed, t->g, &c.tab, &c.cfg, &err) == 0;
        ok = ok && gpu_optim_upload(&resumed, t->g, gm, gv, &err) == 0;
        resumed.step = go.step;
        ok = ok && gpu_upload(t->g, d_g, c.grads[0], bytes, &err) == 0;
        ok = ok && gpu_optim_step(&go, t->g, &c.tab, d_w, d_g, c.lr, 1.0f, &err) == 0;
        ok = ok && gpu_optim_step(&resumed, t->g, &c.tab, d_w2, d_g, c.lr, 1.0f, &err) == 0;
        float *a = gt_down(t, d_w, total), *b = gt_down(t, d_w2, total);
        float *am = gt_host(t, total), *av = gt_host(t, total), *bm = gt_host(t, total), *bv = gt_host(t, total);
        ok = ok && gpu_optim_download(&go, t->g, am, av, &err) == 0 &&
             gpu_optim_download(&resumed, t->g, bm, bv, &err) == 0;
        gt_assert(t, ok && memcmp(a, b, bytes) == 0 && memcmp(am, bm, bytes) == 0 && memcmp(av, bv, bytes) == 0,
                  "state upload/download: resumed step identical", "%s%zu of %zu weights bit-identical",
                  ok ? "" : err.msg, bits_equal(a, b, total), total);
        gpu_optim_free(&resumed);
    }

    /* Clipping: the squared norm against grad_global_norm², the clipped gradients against grad_clip, with the
     * coefficient computed on the device. */
    {
        float *g = gt_copy(t, c.grads[1], total);
        for (size_t i = 0; i < total; i++) g[i] *= 10.0f; /* norm well above max_norm */
        memcpy(c.tab.grad, g, bytes);
        const double norm = grad_global_norm(&c.tab);
        double *d_ss = gt_dev(t, sizeof(double));
        double ss = 0;
        ok = gpu_upload(t->g, d_g, g, bytes, &err) == 0;
        gpu_grad_sumsq(&go, t->g, d_g, d_ss);
        ok = ok && gpu_download(t->g, &ss, d_ss, sizeof ss, &err) == 0;
        const double e = fabs(ss - norm * norm) / (norm * norm);
        gt_assert(t, ok && e <= 1e-12, "gpu_grad_sumsq vs grad_global_norm²", "%.17g vs %.17g, rel err %.2e", ss,
                  norm * norm, e);
        const double max_norm = 1.0;
        const double coef = grad_clip(&c.tab, max_norm, norm);
        gpu_grad_clip(t->g, d_g, total, d_ss, max_norm);
        float *h = gt_down(t, d_g, total);
        gt_assert(t, coef < 0.5 && gt_rel_err(h, c.tab.grad, total) <= 1e-7, "gpu_grad_clip vs grad_clip",
                  "coef %.6g, rel err %.2e, %zu of %zu bit-identical", coef, gt_rel_err(h, c.tab.grad, total),
                  bits_equal(h, c.tab.grad, total), total);
        /* below max_norm (and max_norm <= 0): untouched */
        ok = gpu_upload(t->g, d_g, g, bytes, &err) == 0;
        gpu_grad_sumsq(&go, t->g, d_g, d_ss);
        gpu_grad_clip(t->g, d_g, total, d_ss, 1e9);
        gpu_grad_clip(t->g, d_g, total, d_ss, 0.0);
        h = gt_down(t, d_g, total);
        const int same = ok && memcmp(h, g, bytes) == 0;
        gt_assert(t, same, "gpu_grad_clip leaves small norms alone", "%s", same ? "bit-identical" : "gradients changed");
    }
    gpu_optim_free(&go);

    /* bf16 products (the caller sets g->bf16): Newton–Schulz's iterates in bf16, against the CPU's fp32 step
     * (BF16_MUON_TOL). AdamW and the moments do not use products: the same bits as fp32. */
    {
        float *bw = gt_host(t, total), *bm = gt_host(t, total), *bv = gt_host(t, total);
        const int cpu_bf_ok = cpu_run(&c, 0, bw, bm, bv) == 0;
        if (gt_assert(t, cpu_bf_ok, "CPU reference steps (fp32, for bf16)", "%s", cpu_bf_ok ? "done" : "failed")) {
            t->g->bf16 = 1;
            GpuOptimizer gb;
            ok = gpu_run(t, &c, &gb, d_w, d_g, 0) == 0;
            t->g->bf16 = 0;
            if (gt_assert(t, ok, "GPU optimizer steps (bf16)", "%s", ok ? "done" : "failed")) {
                float *hw = gt_down(t, d_w, total);
                compare_weights(t, &c, hw, bw, BF16_MUON_TOL, "bf16");
                /* and bf16 is not secretly fp32: its Muon updates differ from the fp32 ones */
                double diff = 0;
                for (size_t i = 0; i < total; i++) diff = fmax(diff, fabs((double)hw[i] - gw[i]));
                gt_assert(t, diff > 0, "bf16 products differ from fp32", "max |Δw| %.2e", diff);
                gpu_optim_free(&gb);
            }
        }
    }
    params_free(&c.tab);
    gt_reset(t);
    test_model_table(t);
    gt_reset(t);
    test_bench_timing(t);
}
