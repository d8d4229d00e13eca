/* Schedules, clipping and the balancing controller (the optimizer steps themselves are checked against torch
 * in tests/oracle/test_optim.py). */
#include <stdlib.h>
#include <string.h>

#include "optim.h"
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

TEST(balancer_pushes_overused_experts_down) {
    Balancer b;
    ZyErr err = {{0}};
    REQUIRE(balancer_create(&b, 1, 4, 1e-3, &err) == 0);
    float bias[5] = {0, 0, 0, 0, -1};
    float *biases[1] = {bias};
    int64_t counts[5] = {70, 10, 10, 0, 10}; /* expert 0 over-used, 3 idle, 10% skipped */
    for (int i = 0; i < 10; i++) balancer_update(&b, counts, biases);
    CHECK(bias[0] < 0 && bias[3] > 0);
    CHECK(bias[4] == -1.0f); /* skip expert held */
    CHECK_NEAR(bias[3], 10 * 1e-3, 1e-4); /* Adam's normalised steps are ~lr each */
    int64_t even[4] = {5, 5, 5, 5}, one[4] = {20, 0, 0, 0};
    CHECK_NEAR(routing_entropy(even, 4), 1.0, 1e-12);
    CHECK_NEAR(routing_entropy(one, 4), 0.0, 1e-12);
    balancer_free(&b);
}
