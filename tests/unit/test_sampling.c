/* Sampling: greedy is argmax, top-k=1 is greedy, top-p keeps the smallest set reaching p, a seed fixes the
 * draws, and the empirical distribution over many draws matches the intended one. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "infer/sampling.h"
#include "test.h"

/* Draws n tokens and checks each frequency against want[] within 5 standard deviations. */
static int freq_ok(Sampler *s, const SamplingParams *p, const float *logits, const double *want, int V, int n,
                   uint64_t seed) {
    ZyRng rng;
    zy_rng_seed(&rng, seed);
    int *count = calloc((size_t)V, sizeof *count), ok = 1;
    for (int i = 0; i < n; i++) count[sample_next(s, p, logits, &rng)]++;
    for (int v = 0; v < V; v++) {
        double f = (double)count[v] / n, sd = sqrt(want[v] * (1 - want[v]) / n);
        if (want[v] == 0 ? count[v] != 0 : fabs(f - want[v]) > 5 * sd + 1e-12) {
            fprintf(stderr, "    token %d: frequency %.4f, expected %.4f\n", v, f, want[v]);
            ok = 0;
        }
    }
    free(count);
    return ok;
}

TEST(sampling_greedy_is_argmax) {
    ZyErr err = {{0}};
    Sampler s;
    REQUIRE(sampler_create(&s, 100, &err) == 0);
    ZyRng rng, before;
    zy_rng_seed(&rng, 1);
    float lg[100];
    for (int trial = 0; trial < 50; trial++) {
        for (int i = 0; i < 100; i++) lg[i] = (float)(3 * zy_rng_normal(&rng));
        int best = 0;
        for (int i = 1; i < 100; i++)
            if (lg[i] > lg[best]) best = i;
        before = rng;
        SamplingParams greedy = {0.0, 0, 1.0, 0}, k1 = {1.0, 1, 1.0, 0}, k1_hot = {5.0, 1, 0.3, 0};
        CHECK(sample_next(&s, &greedy, lg, &rng) == best);
        CHECK(memcmp(&before, &rng, sizeof rng) == 0); /* greedy draws nothing */
        CHECK(sample_next(&s, &k1, lg, &rng) == best);
        CHECK(sample_next(&s, &k1_hot, lg, &rng) == best);
        CHECK(sample_argmax(lg, 100) == best);
    }
    float tie[4] = {1, 3, 3, 2};
    CHECK(sample_argmax(tie, 4) == 1); /* first of equals */
    float nan_first[3] = {NAN, -1, 0};
    CHECK(sample_argmax(nan_first, 3) == 2);
    sampler_free(&s);
}

TEST(sampling_top_p_keeps_the_smallest_set_reaching_p) {
    ZyErr err = {{0}};
    Sampler s;
    REQUIRE(sampler_create(&s, 4, &err) == 0);
    const double prob[4] = {0.15, 0.5, 0.05, 0.3}; /* sorted: 1 (0.5), 3 (0.3), 0 (0.15), 2 (0.05) */
    float lg[4];
    for (int i = 0; i < 4; i++) lg[i] = (float)log(prob[i]);
    SamplingParams p = {1.0, 0, 0.45, 0};
    const double only_top[4] = {0, 1, 0, 0}, two[4] = {0, 0.5 / 0.8, 0, 0.3 / 0.8},
                 three[4] = {0.15 / 0.95, 0.5 / 0.95, 0, 0.3 / 0.95};
    CHECK(freq_ok(&s, &p, lg, only_top, 4, 2000, 1));
    p.top_p = 0.75;
    CHECK(freq_ok(&s, &p, lg, two, 4, 20000, 2));
    p.top_p = 0.85;
    CHECK(freq_ok(&s, &p, lg, three, 4, 20000, 3));
    p.top_p = 1.0;
    CHECK(freq_ok(&s, &p, lg, prob, 4, 20000, 4));
    /* top-k then top-p on what top-k kept: k=2 leaves {1: 0.625, 3: 0.375}; p=0.6 keeps token 1 only */
    SamplingParams kp = {1.0, 2, 0.6, 0};
    CHECK(freq_ok(&s, &kp, lg, only_top, 4, 2000, 5));
    kp.top_p = 0.7;
    CHECK(freq_ok(&s, &kp, lg, two, 4, 20000, 6));
    sampler_free(&s);
}

/* A large vocabulary exercises the growing sorted prefix of top-p; compare against a brute-force nucleus. */
static int cmp_desc(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x < y) - (x > y);
}

TEST(sampling_top_p_large_vocabulary) {
    ZyErr err = {{0}};
    const int V = 5000;
    Sampler s;
    REQUIRE(sampler_create(&s, V, &err) == 0);
    float *lg = malloc(sizeof(float) * V);
    double *p = malloc(sizeof(double) * V), *sorted = malloc(sizeof(double) * V);
    ZyRng rng;
    zy_rng_seed(&rng, 9);
    for (int i = 0; i < V; i++) lg[i] = (float)(0.5 * zy_rng_normal(&rng)); /* flat: the nucleus is wide */
    double mx = -INFINITY, sum = 0;
    for (int i = 0; i < V; i++) mx = fmax(mx, lg[i]);
    for (int i = 0; i < V; i++) sum += (p[i] = exp(lg[i] - mx));
    for (int i = 0; i < V; i++) sorted[i] = p[i] / sum;
    qsort(sorted, (size_t)V, sizeof *sorted, cmp_desc);
    double acc = 0, cut = 0;
    int n = 0;
    while (acc < 0.9) {
        acc += sorted[n];
        cut = sorted[n++];
    }
    CHECK(n > 1000); /* a wide nucleus: many histogram buckets, a crowded crossing bucket */
    SamplingParams sp = {1.0, 0, 0.9, 0};
    int below = 0;
    for (int i = 0; i < 500; i++) {
        int32_t t = sample_next(&s, &sp, lg, &rng);
        below += p[t] / sum < cut * (1 - 1e-6);
    }
    CHECK_MSG(below == 0, "%d draws outside the nucleus", below);
    free(lg);
    free(p);
    free(sorted);
    sampler_free(&s);
}

TEST(sampling_is_deterministic_and_matches_the_distribution) {
    ZyErr err = {{0}};
    Sampler s;
    REQUIRE(sampler_create(&s, 6, &err) == 0);
    const float lg[6] = {1.0f, 2.0f, 0.5f, -1.0f, 2.0f, 0.0f};
    SamplingParams p = {1.0, 0, 1.0, 0};
    int32_t a[64], b[64], c[64];
    ZyRng r1, r2, r3;
    zy_rng_seed(&r1, 42);
    zy_rng_seed(&r2, 42);
    zy_rng_seed(&r3, 43);
    for (int i = 0; i < 64; i++) {
        a[i] = sample_next(&s, &p, lg, &r1);
        b[i] = sample_next(&s, &p, lg, &r2);
        c[i] = sample_next(&s, &p, lg, &r3);
    }
    CHECK(memcmp(a, b, sizeof a) == 0);
    CHECK(memcmp(a, c, sizeof a) != 0);
    for (int ti = 0; ti < 3; ti++) {
        const double T[3] = {1.0, 0.5, 2.0};
        double want[6], sum = 0;
        for (int i = 0; i < 6; i++) sum += (want[i] = exp(lg[i] / T[ti]));
        for (int i = 0; i < 6; i++) want[i] /= sum;
        p.temperature = T[ti];
        CHECK(freq_ok(&s, &p, lg, want, 6, 40000, 100 + ti));
    }
    /* top-k = 3 keeps tokens 1, 4 (tied, 2.0) and 0 (1.0) */
    SamplingParams k3 = {1.0, 3, 1.0, 0};
    double want[6] = {0}, sum = exp(1.0) + 2 * exp(2.0);
    want[0] = exp(1.0) / sum;
    want[1] = want[4] = exp(2.0) / sum;
    CHECK(freq_ok(&s, &k3, lg, want, 6, 40000, 7));
    sampler_free(&s);
}

TEST(sampling_rejects_bad_parameters) {
    ZyErr err = {{0}};
    SamplingParams ok = {0.7, 40, 0.95, 0}, neg_t = {-1, 0, 1, 0}, nan_t = {NAN, 0, 1, 0}, neg_k = {1, -1, 1, 0},
                   zero_p = {1, 0, 0, 0}, big_p = {1, 0, 1.5, 0}, big_min_p = {1, 0, 1, 1.5};
    CHECK(sampling_validate(&ok, &err) == 0);
    CHECK(sampling_validate(&neg_t, &err) == -1 && strstr(err.msg, "--temperature"));
    CHECK(sampling_validate(&nan_t, &err) == -1);
    CHECK(sampling_validate(&neg_k, &err) == -1 && strstr(err.msg, "--top-k"));
    CHECK(sampling_validate(&zero_p, &err) == -1 && strstr(err.msg, "--top-p"));
    CHECK(sampling_validate(&big_p, &err) == -1);
    CHECK(sampling_validate(&big_min_p, &err) == -1 && strstr(err.msg, "--min-p"));
    Sampler s;
    CHECK(sampler_create(&s, 0, &err) == -1);
}

/* n_allowed restricts every mode to the first ids (a tokenizer smaller than the padded vocabulary). */
TEST(sampling_respects_n_allowed) {
    ZyErr err = {{0}};
    Sampler s;
    REQUIRE(sampler_create(&s, 6000, &err) == 0);
    float *lg = malloc(sizeof(float) * 6000);
    for (int i = 0; i < 6000; i++) lg[i] = i >= 5000 ? 5.0f : (float)(i % 7) * 0.1f;
    s.n_allowed = 5000;
    ZyRng rng;
    zy_rng_seed(&rng, 3);
    const SamplingParams ps[4] = {{0, 0, 1, 0}, {1, 0, 1, 0}, {1, 10, 1, 0}, {1, 0, 0.5, 0}};
    int bad = 0;
    for (int k = 0; k < 4; k++)
        for (int i = 0; i < 50; i++) bad += sample_next(&s, &ps[k], lg, &rng) >= 5000;
    CHECK(bad == 0);
    free(lg);
    sampler_free(&s);
}

/* min_p drops what is less likely than min_p x the most likely (after temperature): the rest keeps its relative
 * frequencies. logits ln(8), ln(4), ln(2), 0 at T = 1: p = 8/15, 4/15, 2/15, 1/15; min_p 0.2 keeps 8, 4, 2. */
TEST(sampling_min_p) {
    ZyErr err = {{0}};
    Sampler s;
    REQUIRE(sampler_create(&s, 4, &err) == 0);
    const float lg[4] = {logf(8), logf(4), logf(2), 0};
    const SamplingParams p = {1.0, 0, 1.0, 0.2}, with_k = {1.0, 2, 1.0, 0.2}, all = {1.0, 0, 1.0, 0.1};
    const double want[4] = {8 / 14.0, 4 / 14.0, 2 / 14.0, 0}, want_k[4] = {8 / 12.0, 4 / 12.0, 0, 0};
    const double want_all[4] = {8 / 15.0, 4 / 15.0, 2 / 15.0, 1 / 15.0};
    CHECK(freq_ok(&s, &p, lg, want, 4, 40000, 3));
    CHECK(freq_ok(&s, &with_k, lg, want_k, 4, 40000, 4));
    CHECK(freq_ok(&s, &all, lg, want_all, 4, 40000, 5)); /* below every ratio: all kept */
    const SamplingParams only_top = {2.0, 0, 1.0, 1.0}; /* min_p 1: only the most likely, whatever the temperature */
    ZyRng rng;
    zy_rng_seed(&rng, 9);
    for (int i = 0; i < 200; i++) CHECK(sample_next(&s, &only_top, lg, &rng) == 0);
    sampler_free(&s);
}

/* The penalties, value by value, as vLLM computes them: logit_bias added first; then over the prompt's and the
 * output's tokens a positive logit divided by repetition_penalty, a negative one multiplied; then frequency x count
 * and presence once subtracted for the output's tokens. The scratch counts come back zeroed. */
TEST(sampling_penalties_as_vllm) {
    enum { V = 6 };
    const int32_t prompt[3] = {0, 1, 0}, output[4] = {2, 1, 2, 2}, bias_ids[2] = {3, 5};
    const float bias[2] = {1.5f, -100};
    int32_t counts[V] = {0};
    float lg[V] = {2, -1, 3, 0.5f, -2, 4};
    LogitsPenalties none = {0};
    CHECK(!logits_penalties_active(&none));
    none.repetition = 1;
    CHECK(!logits_penalties_active(&none));
    LogitsPenalties p = {.presence = 0.5, .frequency = 0.25, .repetition = 2, .bias_ids = bias_ids, .bias = bias,
                         .n_bias = 2};
    CHECK(logits_penalties_active(&p));
    logits_apply_penalties(lg, V, &p, prompt, 3, output, 4, counts);
    /* 0: prompt only, 2 > 0 → 1. 1: prompt and output once, -1 → -2, - 0.25 - 0.5 = -2.75. 2: output 3 times, 3 → 1.5,
     * - 0.75 - 0.5 = 0.25. 3: bias 0.5 + 1.5 = 2. 4: untouched. 5: 4 - 100 = -96 */
    const float want[V] = {1, -2.75f, 0.25f, 2, -2, -96};
    for (int i = 0; i < V; i++) CHECK_MSG(fabsf(lg[i] - want[i]) < 1e-6f, "logit %d: %g, want %g", i, lg[i], want[i]);
    for (int i = 0; i < V; i++) CHECK(counts[i] == 0);
    float lg2[V] = {2, -1, 3, 0.5f, -2, 4};
    const LogitsPenalties only_bias = {.bias_ids = bias_ids, .bias = bias, .n_bias = 2};
    logits_apply_penalties(lg2, V, &only_bias, prompt, 3, output, 4, counts);
    CHECK(lg2[0] == 2 && lg2[1] == -1 && lg2[2] == 3 && lg2[3] == 2 && lg2[5] == -96);
}
