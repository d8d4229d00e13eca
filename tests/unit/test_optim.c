/* Schedules, clipping, and the fast optimizer step against the simple reference path
 * (the steps themselves are checked against torch in tests/oracle/test_optim.py). */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/matmul.h"
#include "optim/optim.h"
#include "test.h"

TEST(schedule_warmup_wsd_and_cosine) {
    Schedule s = {.type = SCHEDULE_WSD, .peak_lr = 1.0, .warmup_steps = 10, .total_steps = 100,
                  .decay_fraction = 0.2, .min_ratio = 0.1};
    CHECK_NEAR(schedule_lr(&s, 0), 0.1, 1e-12);
    CHECK_NEAR(schedule_lr(&s, 9), 1.0, 1e-12);
    CHECK_NEAR(schedule_lr(&s, 79), 1.0, 1e-12);   /* stable until the last 20 steps */
    CHECK_NEAR(schedule_lr(&s, 99), 0.1, 1e-12);   /* decayed to min at the last step */
    CHECK(schedule_lr(&s, 90) < 1.0 && schedule_lr(&s, 90) > 0.1);
    s.type = SCHEDULE_COSINE;
    CHECK_NEAR(schedule_lr(&s, 10), 1.0, 1e-12);
    CHECK_NEAR(schedule_lr(&s, 99), 0.1, 1e-12);
    CHECK_NEAR(schedule_lr(&s, 10 + 89 / 2.0), 0.55, 0.02);
}

TEST(newton_schulz_orthogonalises) {
    /* NS5's fixed point is approximately orthogonal: singular values land in ~[0.7, 1.2]. */
    ZyRng rng;
    zy_rng_seed(&rng, 5);
    const int m = 12, n = 20;
    float G[12 * 20], O[12 * 20], A[12 * 12];
    float *work = malloc(muon_workspace_floats(m, n) * sizeof(float));
    for (int i = 0; i < m * n; i++) G[i] = (float)zy_rng_normal(&rng);
    newton_schulz5(O, G, m, n, 5, work);
    for (int i = 0; i < m; i++)
        for (int j = 0; j < m; j++) {
            double s = 0;
            for (int k = 0; k < n; k++) s += (double)O[i * n + k] * O[j * n + k];
            A[i * m + j] = (float)s;
        }
    for (int i = 0; i < m; i++) CHECK_MSG(A[i * m + i] > 0.4 && A[i * m + i] < 1.5, "diag %g", A[i * m + i]);
    free(work);
}

TEST(clip_scales_to_max_norm) {
    ParamTable t = {0};
    ZyErr err = {{0}};
    int64_t shape[1] = {4};
    REQUIRE(params_add(&t, "a", PARAM_ADAMW, INIT_ZERO, 1, shape, &err) >= 0);
    REQUIRE(params_add(&t, "buf", PARAM_BUFFER, INIT_ZERO, 1, shape, &err) >= 0);
    REQUIRE(params_alloc(&t, &err) == 0);
    float *g = t.grad + t.info[0].offset;
    g[0] = 3, g[1] = 4;
    t.grad[t.info[1].offset] = 100; /* buffers do not count */
    double n = grad_global_norm(&t);
    CHECK_NEAR(n, 5.0, 1e-12);
    CHECK_NEAR(grad_clip(&t, 1.0, n), 1.0 / (5.0 + 1e-6), 1e-12);
    CHECK_NEAR(grad_global_norm(&t), 1.0, 1e-6);
    CHECK(grad_clip(&t, 10.0, 1.0) == 1.0);
    params_free(&t);
}

/* ---- the fast optimizer step against the simple reference path ---- */

static void fill_normal(float *x, size_t n, ZyRng *rng, double scale) {
    for (size_t i = 0; i < n; i++) x[i] = (float)(zy_rng_normal(rng) * scale);
}

/* ‖a − b‖ / ‖b‖ (double) */
static double rel_err(const float *a, const float *b, size_t n) {
    double d = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        s += (double)b[i] * b[i];
    }
    return sqrt(d) / fmax(sqrt(s), 1e-30);
}

/* NS5 of SYSTEM.md in double precision: the ground truth both float paths are measured against. */
static void ns5_f64(float *out, const float *G, int m, int n) {
    const int tr = m > n, r = tr ? n : m, c = tr ? m : n;
    double *X = calloc((size_t)r * c, sizeof *X), *Xn = calloc((size_t)r * c, sizeof *Xn);
    double *A = calloc((size_t)r * r, sizeof *A), *B = calloc((size_t)r * r, sizeof *B), ss = 0;
    for (size_t i = 0; i < (size_t)m * n; i++) ss += (double)G[i] * G[i];
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double v = G[(size_t)i * n + j] / (sqrt(ss) + 1e-7);
            if (tr)
                X[(size_t)j * c + i] = v;
            else
                X[(size_t)i * c + j] = v;
        }
    for (int it = 0; it < 5; it++) {
        zy_gemm_f64(0, 1, r, r, c, 1.0, X, c, X, c, 0.0, A, r);
        for (size_t i = 0; i < (size_t)r * r; i++) B[i] = -4.7750 * A[i];
        zy_gemm_f64(0, 0, r, r, r, 2.0315, A, r, A, r, 1.0, B, r);
        for (size_t i = 0; i < (size_t)r * c; i++) Xn[i] = 3.4445 * X[i];
        zy_gemm_f64(0, 0, r, c, r, 1.0, B, r, X, c, 1.0, Xn, c);
        double *t = X;
        X = Xn, Xn = t;
    }
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) out[(size_t)i * n + j] = (float)(tr ? X[(size_t)j * c + i] : X[(size_t)i * c + j]);
    free(X), free(Xn), free(A), free(B);
}

TEST(newton_schulz_fast_matches_reference) {
    /* square, wide, tall, vectors both ways, odd sizes, the demo's expert shapes */
    static const int shapes[][2] = {{1, 1},  {1, 9},    {9, 1},    {2, 3},   {5, 64},  {64, 5},  {12, 20},
                                    {20, 12}, {33, 33}, {64, 64}, {37, 101}, {101, 37}, {128, 256}, {512, 128}};
    ZyRng rng;
    zy_rng_seed(&rng, 11);
    for (size_t s = 0; s < ZY_ARRAY_LEN(shapes); s++) {
        const int m = shapes[s][0], n = shapes[s][1];
        const size_t len = (size_t)m * n;
        float *G = malloc(len * sizeof *G), *fast = malloc(len * sizeof *fast), *ref = malloc(len * sizeof *ref);
        float *truth = malloc(len * sizeof *truth), *work = malloc(muon_workspace_floats(m, n) * sizeof *work);
        REQUIRE(G && fast && ref && truth && work);
        /* Gaussian, then ill-conditioned (rank 2 plus 1e-3 noise, like a gradient from few tokens): the float
         * paths drift further from the double result there (~3e-5), both alike. */
        for (int kind = 0; kind < 2; kind++) {
            fill_normal(G, len, &rng, kind ? 1e-3 : 0.3);
            if (kind) {
                float u[2 * 512], v[2 * 512];
                fill_normal(u, 2 * (size_t)m, &rng, 1.0);
                fill_normal(v, 2 * (size_t)n, &rng, 1.0);
                for (int i = 0; i < m; i++)
                    for (int j = 0; j < n; j++) G[(size_t)i * n + j] += u[2 * i] * v[2 * j] + u[2 * i + 1] * v[2 * j + 1];
            }
            newton_schulz5(fast, G, m, n, 5, work);
            newton_schulz5_reference(ref, G, m, n, 5, work);
            ns5_f64(truth, G, m, n);
            const double e_fast = rel_err(fast, truth, len), e_ref = rel_err(ref, truth, len);
            const double e = rel_err(fast, ref, len);
            /* float rounding only: no worse than the reference's own distance to the double result */
            CHECK_MSG(e_fast <= 2 * e_ref + 1e-6 && e <= (kind ? 1e-4 : 1e-5),
                      "%dx%d %s: fast-f64 %.2e, ref-f64 %.2e, fast-ref %.2e", m, n, kind ? "low-rank" : "gaussian",
                      e_fast, e_ref, e);
        }
        newton_schulz5(G, G, m, n, 5, work); /* in place (out == G) */
        CHECK(memcmp(G, fast, len * sizeof *G) == 0);
        free(G), free(fast), free(ref), free(truth), free(work);
    }
}

/* A table with every kind of tensor the step sees: Muon matrices of many shapes and expert stacks, AdamW
 * tensors with and without decay (one larger than an AdamW chunk, taking the total past grad_walk's parallel
 * threshold), and a buffer. */
static int optim_test_table(ParamTable *t, ZyErr *err) {
    static const struct {
        const char *name;
        ParamKind kind;
        int ndim;
        int64_t shape[3];
    } specs[] = {{"adamw_embed", PARAM_ADAMW, 2, {10, 6}},  {"muon_wide", PARAM_MUON, 2, {16, 24}},
                 {"muon_tall", PARAM_MUON, 2, {40, 12}},    {"adamw_norm", PARAM_ADAMW, 1, {7}},
                 {"muon_row", PARAM_MUON, 2, {1, 32}},      {"muon_col", PARAM_MUON, 2, {32, 1}},
                 {"muon_experts", PARAM_MUON, 3, {3, 8, 12}}, {"buffer", PARAM_BUFFER, 1, {4}},
                 {"muon_experts_tall", PARAM_MUON, 3, {4, 96, 32}}, {"adamw_big", PARAM_ADAMW, 1, {70000}},
                 {"muon_square", PARAM_MUON, 2, {64, 64}},   {"adamw_conv", PARAM_ADAMW, 3, {5, 1, 2}},
                 {"muon_odd", PARAM_MUON, 2, {37, 101}}};
    memset(t, 0, sizeof *t);
    for (size_t i = 0; i < ZY_ARRAY_LEN(specs); i++)
        if (params_add(t, specs[i].name, specs[i].kind, INIT_ZERO, specs[i].ndim, specs[i].shape, err) < 0) return -1;
    return params_alloc(t, err);
}

/* Runs `steps` steps (fresh random gradients each) of the fast or the reference path on the owned block. */
static void run_steps_p(ParamTable *t, const float *w0, size_t begin, size_t end, int reference, int steps, int bf16,
                        int *failed) {
    ZyErr err = {{0}};
    Optimizer o;
    OptimConfig cfg;
    optim_config_default(&cfg);
    cfg.weight_decay = 0.1;
    memcpy(t->data, w0, t->total * sizeof(float));
    if (optim_create_block(&o, t, &cfg, begin, end, &err)) {
        fprintf(stderr, "    optim_create_block: %s\n", err.msg);
        *failed = 1;
        return;
    }
    optim_set_bf16(&o, bf16 ? ZY_BF16_PRODUCTS_ONEDNN : ZY_BF16_PRODUCTS_FP32);
    ZyRng rng;
    zy_rng_seed(&rng, 99);
    for (int s = 0; s < steps; s++) {
        for (int i = 0; i < t->count; i++)
            if (param_trainable(&t->info[i]))
                fill_normal(t->grad + t->info[i].offset, t->info[i].numel, &rng, 0.1 * (s + 1));
        if (reference)
            optim_step_reference(&o, t, 0.02);
        else
            optim_step(&o, t, 0.02);
    }
    optim_free(&o);
}

static void run_steps(ParamTable *t, const float *w0, size_t begin, size_t end, int reference, int steps, int *failed) {
    run_steps_p(t, w0, begin, end, reference, steps, 0, failed);
}

TEST(optim_step_fast_matches_reference) {
    ParamTable t;
    ZyErr err = {{0}};
    REQUIRE(optim_test_table(&t, &err) == 0);
    ZyRng rng;
    zy_rng_seed(&rng, 4);
    float *w0 = malloc(t.total * sizeof *w0), *ref = malloc(t.total * sizeof *ref);
    float *fast = malloc(t.total * sizeof *fast);
    REQUIRE(w0 && ref && fast);
    fill_normal(w0, t.total, &rng, 0.5);
    int failed = 0;
    run_steps(&t, w0, 0, t.total, 1, 3, &failed);
    memcpy(ref, t.data, t.total * sizeof *ref);
    run_steps(&t, w0, 0, t.total, 0, 3, &failed);
    memcpy(fast, t.data, t.total * sizeof *fast);
    REQUIRE(!failed);
    for (int i = 0; i < t.count; i++) {
        const ParamInfo *p = &t.info[i];
        const size_t n = p->numel, off = p->offset;
        if (p->kind == PARAM_MUON) {
            float *du_f = malloc(n * sizeof *du_f), *du_r = malloc(n * sizeof *du_r);
            for (size_t j = 0; j < n; j++) du_f[j] = fast[off + j] - w0[off + j], du_r[j] = ref[off + j] - w0[off + j];
            const double e = rel_err(du_f, du_r, n);
            CHECK_MSG(e <= 1e-5, "%s: update rel err %.2e", p->name, e);
            free(du_f), free(du_r);
        } else { /* AdamW shares the per-element code: the same bits; buffers stay untouched */
            CHECK_MSG(memcmp(fast + off, ref + off, n * sizeof(float)) == 0, "%s differs", p->name);
            if (p->kind == PARAM_BUFFER) CHECK(memcmp(fast + off, w0 + off, n * sizeof(float)) == 0);
        }
    }
    /* deterministic: the same step again gives the same bits */
    run_steps(&t, w0, 0, t.total, 0, 3, &failed);
    CHECK(memcmp(t.data, fast, t.total * sizeof *fast) == 0);
    free(w0), free(ref), free(fast);
    params_free(&t);
}

TEST(optim_step_zero1_blocks_match_whole) {
    /* Each ZeRO-1 block updates only its own tensors, exactly as the whole-table optimizer does. */
    ParamTable t;
    ZyErr err = {{0}};
    REQUIRE(optim_test_table(&t, &err) == 0);
    ZyRng rng;
    zy_rng_seed(&rng, 8);
    float *w0 = malloc(t.total * sizeof *w0), *whole = malloc(t.total * sizeof *whole);
    REQUIRE(w0 && whole);
    fill_normal(w0, t.total, &rng, 0.5);
    int failed = 0;
    run_steps(&t, w0, 0, t.total, 0, 2, &failed);
    memcpy(whole, t.data, t.total * sizeof *whole);
    size_t bounds[4];
    zero1_partition(&t, 3, bounds);
    for (int b = 0; b < 3; b++) {
        run_steps(&t, w0, bounds[b], bounds[b + 1], 0, 2, &failed);
        for (int i = 0; i < t.count; i++) {
            const ParamInfo *p = &t.info[i];
            const int inside = p->offset >= bounds[b] && p->offset + p->numel <= bounds[b + 1];
            const float *want = (inside && param_trainable(p) ? whole : w0) + p->offset;
            const double e = rel_err(t.data + p->offset, want, p->numel);
            CHECK_MSG(inside ? e <= 1e-6 : e == 0, "block %d, %s (%s): rel err %.2e", b, p->name,
                      inside ? "owned" : "not owned", e);
        }
    }
    CHECK(!failed);
    free(w0), free(whole);
    params_free(&t);
}

TEST(grad_norm_and_scale_cover_every_trainable_element) {
    ParamTable t;
    ZyErr err = {{0}};
    REQUIRE(optim_test_table(&t, &err) == 0);
    ZyRng rng;
    zy_rng_seed(&rng, 21);
    fill_normal(t.grad, t.total, &rng, 1.0);
    long double want = 0, want_owned = 0;
    size_t bounds[3];
    zero1_partition(&t, 2, bounds);
    for (int i = 0; i < t.count; i++) {
        const ParamInfo *p = &t.info[i];
        if (!param_trainable(p)) continue;
        for (size_t j = 0; j < p->numel; j++) {
            long double g = t.grad[p->offset + j];
            want += g * g;
            if (p->offset >= bounds[1] && p->offset + p->numel <= bounds[2]) want_owned += g * g;
        }
    }
    CHECK_NEAR(grad_global_norm(&t), sqrt((double)want), 1e-12);
    Optimizer o;
    OptimConfig cfg;
    optim_config_default(&cfg);
    REQUIRE(optim_create_block(&o, &t, &cfg, bounds[1], bounds[2], &err) == 0);
    CHECK_NEAR(grad_sumsq_owned(&o, &t), (double)want_owned, 1e-12);
    const float buf = t.grad[t.info[7].offset];
    grad_scale(&t, 0.5);
    CHECK_NEAR(grad_global_norm(&t), 0.5 * sqrt((double)want), 1e-12);
    CHECK(t.grad[t.info[7].offset] == buf); /* the buffer's slot is not a gradient */
    grad_scale_owned(&o, &t, 2.0);
    CHECK_NEAR(grad_sumsq_owned(&o, &t), (double)want_owned, 1e-12);
    optim_free(&o);
    params_free(&t);
}

/* "precision": "bf16": Muon's Newton–Schulz products on bf16-rounded inputs. The Muon updates stay close to the fp32
 * reference (NS5 is a fixed polynomial of the normalised momentum, insensitive to 8-bit-mantissa rounding), AdamW
 * is untouched (the same bits), and the step is deterministic. */
TEST(optim_step_bf16_newton_schulz_close_to_fp32) {
    ParamTable t;
    ZyErr err = {{0}};
    REQUIRE(optim_test_table(&t, &err) == 0);
    ZyRng rng;
    zy_rng_seed(&rng, 4);
    float *w0 = malloc(t.total * sizeof *w0), *ref = malloc(t.total * sizeof *ref), *b16 = malloc(t.total * sizeof *b16);
    REQUIRE(w0 && ref && b16);
    fill_normal(w0, t.total, &rng, 0.5);
    int failed = 0;
    run_steps_p(&t, w0, 0, t.total, 1, 3, 0, &failed);
    memcpy(ref, t.data, t.total * sizeof *ref);
    run_steps_p(&t, w0, 0, t.total, 0, 3, 1, &failed);
    memcpy(b16, t.data, t.total * sizeof *b16);
    REQUIRE(!failed);
    double worst = 0;
    for (int i = 0; i < t.count; i++) {
        const ParamInfo *p = &t.info[i];
        const size_t n = p->numel, off = p->offset;
        if (p->kind == PARAM_MUON) {
            float *du_b = malloc(n * sizeof *du_b), *du_r = malloc(n * sizeof *du_r);
            for (size_t j = 0; j < n; j++) du_b[j] = b16[off + j] - w0[off + j], du_r[j] = ref[off + j] - w0[off + j];
            const double e = rel_err(du_b, du_r, n);
            if (e > worst) worst = e;
            CHECK_MSG(e <= 6e-2, "%s: bf16 update rel err %.2e", p->name, e);
            free(du_b), free(du_r);
        } else {
            CHECK_MSG(memcmp(b16 + off, ref + off, n * sizeof(float)) == 0, "%s differs", p->name);
        }
    }
    printf("    bf16 Newton-Schulz: Muon updates within %.2g of the fp32 reference (normwise)\n", worst);
    CHECK(worst > 0); /* the bf16 products really ran */
    run_steps_p(&t, w0, 0, t.total, 0, 3, 1, &failed);
    CHECK(memcmp(t.data, b16, t.total * sizeof *b16) == 0);
    free(w0), free(ref), free(b16);
    params_free(&t);
}

/* The bands of Newton–Schulz's symmetric products on the GPU (ns_symmetric_bands): contiguous, covering [0, r), at
 * most NS_MAX_BANDS; the automatic height keeps small matrices whole and cuts large ones into at most 8 bands of a
 * multiple of 128 rows, at least 256. */
TEST(ns_symmetric_bands_cover_the_rows) {
    static const struct {
        int r, band_rows, want_bands, want_first;
    } cases[] = {{1, 0, 1, 1},      {1000, 0, 1, 1000}, {1024, 0, 4, 256}, {1100, 0, 5, 256}, {2048, 0, 8, 256},
                 {4096, 0, 8, 512}, {37, 8, 5, 8},      {37, 64, 1, 37},   {1000, 1, 63, 16}, {0, 0, 0, 0},     {2048, INT_MAX, 1, 2048}};
    for (size_t c = 0; c < ZY_ARRAY_LEN(cases); c++) {
        NsBand b[NS_MAX_BANDS];
        const int n = ns_symmetric_bands(cases[c].r, cases[c].band_rows, b);
        CHECK_MSG(n == cases[c].want_bands, "r %d band %d: %d bands, want %d", cases[c].r, cases[c].band_rows, n,
                  cases[c].want_bands);
        if (n <= 0 || n > NS_MAX_BANDS) continue;
        CHECK_MSG(b[0].row0 == 0 && b[0].rows == cases[c].want_first, "r %d: first band %d+%d", cases[c].r,
                  b[0].row0, b[0].rows);
        int next = 0;
        for (int i = 0; i < n; i++) {
            CHECK_MSG(b[i].row0 == next && b[i].rows > 0 && b[i].rows <= b[0].rows, "r %d band %d: %d+%d after %d",
                      cases[c].r, i, b[i].row0, b[i].rows, next);
            next = b[i].row0 + b[i].rows;
        }
        CHECK_MSG(next == cases[c].r, "r %d: bands end at %d", cases[c].r, next);
    }
}

/* optimizer.router_lr_scale: the router's tensors (".mlp.gate.") step exactly as they would at lr × scale, the
 * others at lr; on the fast and the reference path. */
static int router_table(ParamTable *t, ZyErr *err) {
    static const struct {
        const char *name;
        ParamKind kind;
        int ndim;
        int64_t shape[2];
    } specs[] = {{"model.layers.0.mlp.gate.router_mlp.out_proj.weight", PARAM_MUON, 2, {5, 16}},
                 {"model.layers.0.mlp.gate.router_mlp.fc1.bias", PARAM_ADAMW, 1, {16}},
                 {"model.layers.0.mlp.experts.down_proj", PARAM_MUON, 2, {8, 12}},
                 {"model.layers.0.post_attention_layernorm.weight", PARAM_ADAMW, 1, {8}}};
    memset(t, 0, sizeof *t);
    for (size_t i = 0; i < ZY_ARRAY_LEN(specs); i++)
        if (params_add(t, specs[i].name, specs[i].kind, INIT_ZERO, specs[i].ndim, specs[i].shape, err) < 0) return -1;
    return params_alloc(t, err);
}

static void router_steps(ParamTable *t, const float *w0, double scale, double lr, int reference, float *out) {
    ZyErr err = {{0}};
    Optimizer o;
    OptimConfig cfg;
    optim_config_default(&cfg);
    cfg.weight_decay = 0.1;
    cfg.router_lr_scale = scale;
    memcpy(t->data, w0, t->total * sizeof(float));
    if (optim_create(&o, t, &cfg, &err)) abort();
    ZyRng rng;
    zy_rng_seed(&rng, 5);
    for (int s = 0; s < 3; s++) {
        for (int i = 0; i < t->count; i++) fill_normal(t->grad + t->info[i].offset, t->info[i].numel, &rng, 0.1);
        if (reference)
            optim_step_reference(&o, t, lr);
        else
            optim_step(&o, t, lr);
    }
    memcpy(out, t->data, t->total * sizeof(float));
    optim_free(&o);
}

TEST(optim_router_lr_scale_scales_only_the_router) {
    ParamTable t;
    ZyErr err = {{0}};
    REQUIRE(router_table(&t, &err) == 0);
    CHECK(param_is_router(&t.info[0]) && param_is_router(&t.info[1]));
    CHECK(!param_is_router(&t.info[2]) && !param_is_router(&t.info[3]));
    float *w0 = malloc(t.total * sizeof(float)), *scaled = malloc(t.total * sizeof(float));
    float *full = malloc(t.total * sizeof(float)), *low = malloc(t.total * sizeof(float));
    REQUIRE(w0 && scaled && full && low);
    ZyRng rng;
    zy_rng_seed(&rng, 8);
    fill_normal(w0, t.total, &rng, 0.3);
    for (int reference = 0; reference < 2; reference++) {
        router_steps(&t, w0, 0.25, 0.02, reference, scaled);
        router_steps(&t, w0, 1.0, 0.02, reference, full);
        router_steps(&t, w0, 1.0, 0.005, reference, low); /* 0.02 × 0.25, exactly */
        for (int i = 0; i < t.count; i++) {
            const ParamInfo *p = &t.info[i];
            const float *want = i < 2 ? low : full;
            CHECK_MSG(memcmp(scaled + p->offset, want + p->offset, p->numel * sizeof(float)) == 0, "%s (%s path)",
                      p->name, reference ? "reference" : "fast");
            CHECK(memcmp(scaled + p->offset, w0 + p->offset, p->numel * sizeof(float)) != 0); /* it did move */
        }
    }
    free(w0), free(scaled), free(full), free(low);
    params_free(&t);
}
