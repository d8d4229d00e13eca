/* Cached decoding against the full forward: the same logits (1e-5 relative per position) and the same routing,
 * token by token and in prefill chunks of any size, on small random models with every norm, scale, bias,
 * temperature and balancing bias moved away from its init. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/config.h"
#include "infer/decode.h"
#include "infer/prefix_cache.h"
#include "kernels/matmul.h"
#include "model/model.h"
#include "io/model_io.h"
#include "io/quant_io.h"
#include "kernels/quant.h"
#include "test.h"

typedef struct {
    int k0, k1, Hq, Hkv, dh, L, tied;
    float rot;
    int D, I, R; /* hidden, expert and router widths (0: 24, 12, 8) */
} Shape;

static const Shape shapes[] = {
    {2, 2, 4, 2, 8, 2, 1, 0.5f, 0, 0, 0},  /* ZAYA1-like */
    {3, 2, 4, 1, 8, 2, 0, 1.0f, 0, 0, 0},  /* MQA, longer depthwise kernel */
    {2, 3, 4, 4, 8, 3, 1, 0.5f, 0, 0, 0},  /* MHA (Hkv = Hq), longer grouped kernel */
    {3, 3, 2, 2, 8, 2, 0, 1.0f, 0, 0, 0},  /* P = 4 */
    {2, 2, 6, 3, 8, 2, 0, 0.25f, 0, 0, 0}, /* odd Hkv: a value head straddles the current/delayed halves */
};

static int make_model(Model *m, const Shape *s, uint64_t seed, ZyErr *err) {
    ZayaConfig c = {.vocab_size = 61, .hidden_size = s->D ? s->D : 24, .num_layers = s->L, .num_heads = s->Hq,
                    .num_kv_heads = s->Hkv, .head_dim = s->dh, .num_experts = 3, .moe_intermediate_size = s->I ? s->I : 12,
                    .router_hidden_size = s->R ? s->R : 8, .cca_time0 = s->k0, .cca_time1 = s->k1, .rms_norm_eps = 1e-5f,
                    .tie_word_embeddings = s->tied, .max_position_embeddings = 64, .rope_theta = 10000.0f,
                    .partial_rotary_factor = s->rot, .initializer_range = 0.02f, .bos_token_id = 1,
                    .eos_token_id = 2, .pad_token_id = 0};
    if (model_create(m, &c, err)) return -1;
    model_init_weights(m, seed);
    /* Move everything off its init so no term hides behind a 0 or a 1. */
    ZyRng rng;
    zy_rng_seed(&rng, seed * 7919 + 1);
    for (int i = 0; i < m->params.count; i++) {
        const ParamInfo *p = &m->params.info[i];
        float *x = m->params.data + p->offset;
        const int64_t fan_in = p->shape[p->ndim - 1];
        for (size_t j = 0; j < p->numel; j++) {
            double g = zy_rng_normal(&rng), u = zy_rng_uniform(&rng);
            if (strstr(p->name, "balancing_biases"))
                x[j] = j + 1 == p->numel ? (float)(-0.06 + 0.08 * u) : (float)(0.05 * g);
            else if (strstr(p->name, "qk_norm.temp"))
                x[j] = (float)(0.5 + 1.5 * u);
            else if (strstr(p->name, "conv_qk") && p->ndim == 3)
                x[j] = (float)(0.3 * g);
            else if (strstr(p->name, "router_mlp.out_proj"))
                x[j] = (float)(2.0 * g / sqrt((double)fan_in)); /* confident routing: decisions far from ties */
            else if (p->init == INIT_ONE)
                x[j] = (float)(0.5 + u);
            else if (p->init == INIT_ZERO)
                x[j] = (float)(0.1 * g);
            else
                x[j] = (float)(g / sqrt((double)fan_in));
        }
    }
    return 0;
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Sets each layer's skip-expert bias so that about a quarter of the tokens skip, halfway between two tokens'
 * thresholds (no routing decided by rounding). Layers only affect deeper ones: calibrate in depth order. */
static void calibrate_skip(Model *m, Activations *a, const int32_t *tok) {
    const int N = a->B * a->T, E = m->cfg.num_experts;
    float *t = malloc(sizeof(float) * N);
    for (int l = 0; l < m->cfg.num_layers; l++) {
        model_forward(m, a, tok);
        const float *p = a->layers[l].router_probs, *bias = m->w.layers[l].balancing_bias;
        for (int i = 0; i < N; i++) { /* token i skips iff bias[E] > max_e(p_e + b_e) - p_E */
            float best = -INFINITY;
            for (int e = 0; e < E; e++) best = fmaxf(best, p[(long)i * (E + 1) + e] + bias[e]);
            t[i] = best - p[(long)i * (E + 1) + E];
        }
        qsort(t, (size_t)N, sizeof *t, cmp_float);
        const int k = N / 4 > 0 ? N / 4 : 1;
        m->w.layers[l].balancing_bias[E] = k < N ? 0.5f * (t[k - 1] + t[k]) : t[N - 1] + 0.01f;
    }
    free(t);
}

static double rel_err(const float *x, const float *ref, int n) {
    double d = 0, r = 0;
    for (int i = 0; i < n; i++) {
        d += ((double)x[i] - ref[i]) * ((double)x[i] - ref[i]);
        r += (double)ref[i] * ref[i];
    }
    return sqrt(d) / fmax(sqrt(r), 1e-30);
}

typedef struct {
    double max_err;
    int route_mismatch, positions;
} Agreement;

/* Runs the sequence through the cache in pieces of the given sizes (cycled) and compares every position's
 * logits and routing with the full forward. */
static int run_pieces(const Model *m, KVCache *c, const int32_t *tok, int B, int T, const int *sizes, int n_sizes,
                      const float *ref, const int32_t *ref_route, Agreement *ag, ZyErr *err) {
    const int V = m->cfg.vocab_size, L = m->cfg.num_layers;
    float *lg = malloc(sizeof(float) * B * T * V);
    int32_t *piece = malloc(sizeof(int32_t) * B * T), *route = malloc(sizeof(int32_t) * L * B * T);
    int rc = 0;
    kvcache_reset(c);
    for (int t0 = 0, k = 0; t0 < T && rc == 0; k++) {
        int n = sizes[k % n_sizes];
        if (n > T - t0) n = T - t0;
        for (int b = 0; b < B; b++) memcpy(piece + b * n, tok + b * T + t0, sizeof(int32_t) * n);
        rc = model_decode_ex(m, c, piece, n, lg, 0, route, err);
        for (int b = 0; b < B && rc == 0; b++)
            for (int t = 0; t < n; t++) {
                double e = rel_err(lg + ((long)b * n + t) * V, ref + ((long)b * T + t0 + t) * V, V);
                if (!(e <= ag->max_err)) ag->max_err = e; /* NaN sticks */
                ag->positions++;
                for (int l = 0; l < L; l++)
                    ag->route_mismatch += route[((long)l * B + b) * n + t] != ref_route[((long)l * B + b) * T + t0 + t];
            }
        t0 += n;
    }
    free(lg);
    free(piece);
    free(route);
    return rc;
}

TEST(decode_matches_full_forward) {
    ZyErr err = {{0}};
    Agreement ag = {0};
    int runs = 0;
    for (size_t si = 0; si < ZY_ARRAY_LEN(shapes); si++)
        for (int B = 1; B <= (si % 2 == 0 ? 2 : 1); B++) { /* B = 2 on every other shape keeps this quick */
            Model m;
            REQUIRE(make_model(&m, &shapes[si], 100 + si, &err) == 0);
            const int T = B == 1 ? 36 + (int)si : 23 + (int)si, V = m.cfg.vocab_size, L = m.cfg.num_layers;
            int32_t *tok = malloc(sizeof(int32_t) * B * T), *ref_route = malloc(sizeof(int32_t) * L * B * T);
            ZyRng rng;
            zy_rng_seed(&rng, 5 + si * 3 + B);
            for (int i = 0; i < B * T; i++) tok[i] = (int32_t)(zy_rng_next(&rng) % V);
            Activations a;
            REQUIRE(acts_create(&a, &m.cfg, B, T, &err) == 0);
            calibrate_skip(&m, &a, tok);
            model_forward(&m, &a, tok);
            /* routing as [L, B, T] */
            int skipped = 0;
            for (int l = 0; l < L; l++)
                for (int i = 0; i < B * T; i++) {
                    ref_route[(long)l * B * T + i] = a.layers[l].choice[i];
                    skipped += a.layers[l].choice[i] == m.cfg.num_experts;
                }
            CHECK_MSG(skipped > 0 && skipped < L * B * T, "skipped %d of %d", skipped, L * B * T); /* both the skip expert and real experts are exercised */
            KVCache c;
            REQUIRE(kvcache_create(&c, &m.cfg, B, T, &err) == 0);
            static const int one[] = {1}, mixed[] = {7, 1, 1, 5, 2, 1, 11, 3};
            CHECK(run_pieces(&m, &c, tok, B, T, one, 1, a.logits, ref_route, &ag, &err) == 0);
            CHECK(run_pieces(&m, &c, tok, B, T, mixed, 8, a.logits, ref_route, &ag, &err) == 0);
            kvcache_free(&c);
            /* a chunk cap smaller than the prefill: pieces split inside model_decode */
            REQUIRE(kvcache_create_ex(&c, &m.cfg, B, T, 4, &err) == 0);
            const int big[] = {T > 30 ? 30 : T, 1, 2};
            CHECK(run_pieces(&m, &c, tok, B, T, big, 3, a.logits, ref_route, &ag, &err) == 0);
            /* last_only: one prefill of all but the last token, then the last token */
            kvcache_reset(&c);
            float *lg = malloc(sizeof(float) * B * V);
            int32_t *pre = malloc(sizeof(int32_t) * B * T);
            for (int b = 0; b < B; b++) memcpy(pre + b * (T - 1), tok + b * T, sizeof(int32_t) * (T - 1));
            REQUIRE(model_decode(&m, &c, pre, T - 1, lg, 1, &err) == 0);
            for (int b = 0; b < B; b++) {
                double e = rel_err(lg + (long)b * V, a.logits + ((long)b * T + T - 2) * V, V);
                CHECK_MSG(e < 1e-5, "last_only prefill err %.3g", e);
            }
            int32_t last[2] = {tok[T - 1], B > 1 ? tok[2 * T - 1] : 0};
            REQUIRE(model_decode(&m, &c, last, 1, lg, 1, &err) == 0);
            for (int b = 0; b < B; b++) {
                double e = rel_err(lg + (long)b * V, a.logits + ((long)b * T + T - 1) * V, V);
                CHECK_MSG(e < 1e-5, "last token err %.3g", e);
            }
            CHECK(c.len == T);
            free(lg);
            free(pre);
            kvcache_free(&c);
            acts_free(&a);
            free(tok);
            free(ref_route);
            model_free(&m);
            runs++;
        }
    printf("    decode vs full forward: %d models x 3 schedules, %d positions, max rel err %.3g, %d routing "
           "mismatches\n", runs, ag.positions, ag.max_err, ag.route_mismatch);
    CHECK_MSG(ag.max_err < 1e-5, "max rel err %.3g", ag.max_err);
    CHECK(ag.route_mismatch == 0);
}

TEST(decode_errors_leave_the_cache_untouched) {
    ZyErr err = {{0}};
    Model m;
    REQUIRE(make_model(&m, &shapes[0], 3, &err) == 0);
    KVCache c;
    CHECK(kvcache_create(&c, &m.cfg, 1, 65, &err) == -1 && strstr(err.msg, "max_position_embeddings"));
    CHECK(kvcache_create(&c, &m.cfg, 0, 8, &err) == -1);
    REQUIRE(kvcache_create(&c, &m.cfg, 1, 8, &err) == 0);
    const int V = m.cfg.vocab_size;
    float lg[2 * 61], lg2[61];
    int32_t tok[9] = {3, 4, 5, 6, 7, 8, 9, 10, 11};
    REQUIRE(model_decode(&m, &c, tok, 5, lg, 1, &err) == 0);
    CHECK(model_decode(&m, &c, tok, 4, lg, 1, &err) == -1 && strstr(err.msg, "KV cache full"));
    int32_t bad[2] = {1, V};
    CHECK(model_decode(&m, &c, bad, 2, lg, 0, &err) == -1 && strstr(err.msg, "token id 61 at [0, 1]"));
    bad[1] = -1;
    CHECK(model_decode(&m, &c, bad, 2, lg, 0, &err) == -1 && strstr(err.msg, "outside the vocabulary"));
    CHECK(model_decode(&m, &c, tok, 0, lg, 0, &err) == -1);
    CHECK(c.len == 5);
    /* the failed calls changed nothing: the next token gives the same logits as in a fresh run */
    REQUIRE(model_decode(&m, &c, tok + 5, 1, lg2, 1, &err) == 0);
    kvcache_reset(&c);
    REQUIRE(model_decode(&m, &c, tok, 6, lg, 1, &err) == 0);
    CHECK(rel_err(lg2, lg, V) < 1e-6);
    /* logits may be NULL (fill the cache only) */
    kvcache_reset(&c);
    REQUIRE(model_decode(&m, &c, tok, 5, NULL, 0, &err) == 0);
    REQUIRE(model_decode(&m, &c, tok + 5, 1, lg, 1, &err) == 0);
    CHECK(rel_err(lg2, lg, V) < 1e-6);
    CHECK(kvcache_bytes_per_token(&m.cfg, 0) == (size_t)2 * 2 * 2 * 8 * sizeof(float)); /* L * 2 * Hkv*dh floats */
    CHECK(kvcache_bytes_per_token(&m.cfg, 1) == (size_t)2 * 2 * 2 * 8 * 2);             /* ... bf16 */
    kvcache_free(&c);
    model_free(&m);
}

typedef struct {
    int32_t toks[64];
    int n, stop_after;
} Collected;

static int collect(void *ctx, int32_t tok, ZyErr *err) {
    Collected *c = ctx;
    c->toks[c->n++] = tok;
    return c->n == c->stop_after;
}

/* Greedy generation: every token is the argmax of the full forward's logits over the sequence so far. */
TEST(decode_generate_greedy_matches_full_forward_argmax) {
    ZyErr err = {{0}};
    Model m;
    REQUIRE(make_model(&m, &shapes[1], 11, &err) == 0);
    const int V = m.cfg.vocab_size, n_prompt = 5, max_new = 20;
    KVCache c;
    Sampler s;
    REQUIRE(kvcache_create(&c, &m.cfg, 1, n_prompt + max_new, &err) == 0);
    REQUIRE(sampler_create(&s, V, &err) == 0);
    SamplingParams greedy = {0, 0, 1, 0};
    ZyRng rng;
    zy_rng_seed(&rng, 1);
    int32_t seq[32] = {1, 7, 3, 9, 4};
    Collected col = {.stop_after = -1};
    GenerateStats st;
    REQUIRE(generate(&m, &c, &s, &greedy, &rng, seq, n_prompt, max_new, NULL, 0, collect, &col, &st, &err) == 0);
    CHECK(st.n_generated == max_new && col.n == max_new && st.stop == GEN_STOP_MAX_TOKENS);
    memcpy(seq + n_prompt, col.toks, sizeof(int32_t) * max_new);
    Activations a;
    const int T = n_prompt + max_new - 1;
    REQUIRE(acts_create(&a, &m.cfg, 1, T, &err) == 0);
    model_forward(&m, &a, seq);
    for (int t = n_prompt - 1; t < T; t++) CHECK(sample_argmax(a.logits + (long)t * V, V) == seq[t + 1]);
    acts_free(&a);
    /* a stop id ends generation after it; the callback can stop too; the cache size bounds the length */
    int32_t stop = col.toks[3];
    Collected c2 = {.stop_after = -1};
    REQUIRE(generate(&m, &c, &s, &greedy, &rng, seq, n_prompt, max_new, &stop, 1, collect, &c2, &st, &err) == 0);
    int first = 0;
    while (col.toks[first] != stop) first++;
    CHECK(st.stop == GEN_STOP_EOS && c2.n == first + 1 && st.n_generated == first + 1);
    Collected c3 = {.stop_after = 2};
    REQUIRE(generate(&m, &c, &s, &greedy, &rng, seq, n_prompt, max_new, NULL, 0, collect, &c3, &st, &err) == 0);
    CHECK(st.stop == GEN_STOP_CALLBACK && c3.n == 2);
    kvcache_free(&c);
    REQUIRE(kvcache_create(&c, &m.cfg, 1, n_prompt + 3, &err) == 0);
    REQUIRE(generate(&m, &c, &s, &greedy, &rng, seq, n_prompt, max_new, NULL, 0, NULL, NULL, &st, &err) == 0);
    CHECK(st.stop == GEN_STOP_CACHE_FULL && st.n_generated == 4); /* 3 fed back + the last one sampled */
    CHECK(generate(&m, &c, &s, &greedy, &rng, seq, 9, max_new, NULL, 0, NULL, NULL, &st, &err) == -1);
    sampler_free(&s);
    kvcache_free(&c);
    model_free(&m);
}

/* mark/rewind: continuations of one prefilled context give the logits of a fresh run over context + continuation. */
TEST(decode_mark_and_rewind) {
    ZyErr err = {{0}};
    Model m;
    REQUIRE(make_model(&m, &shapes[3], 21, &err) == 0); /* P = 4: the conv state spans several tokens */
    const int V = m.cfg.vocab_size;
    KVCache c;
    REQUIRE(kvcache_create_ex(&c, &m.cfg, 1, 20, 3, &err) == 0);
    int32_t ctx[6] = {1, 9, 8, 7, 6, 5}, a[5] = {11, 12, 13, 14, 15}, b[2] = {21, 22}, full[11];
    float *lg = malloc(sizeof(float) * 5 * V), *ref = malloc(sizeof(float) * 5 * V);
    REQUIRE(model_decode(&m, &c, ctx, 6, NULL, 0, &err) == 0);
    kvcache_mark(&c);
    REQUIRE(model_decode(&m, &c, a, 5, lg, 0, &err) == 0);
    kvcache_rewind(&c);
    CHECK(c.len == 6);
    REQUIRE(model_decode(&m, &c, b, 2, lg, 0, &err) == 0);
    kvcache_rewind(&c);
    REQUIRE(model_decode(&m, &c, a, 1, lg + 2 * V, 0, &err) == 0);
    /* reference: fresh runs */
    memcpy(full, ctx, sizeof ctx);
    memcpy(full + 6, b, sizeof b);
    kvcache_reset(&c);
    REQUIRE(model_decode(&m, &c, full, 8, NULL, 0, &err) == 0);
    kvcache_reset(&c);
    REQUIRE(model_decode(&m, &c, full, 6, NULL, 0, &err) == 0);
    REQUIRE(model_decode(&m, &c, b, 2, ref, 0, &err) == 0);
    CHECK(rel_err(lg, ref, 2 * V) < 1e-6);
    kvcache_reset(&c);
    memcpy(full + 6, a, sizeof a);
    REQUIRE(model_decode(&m, &c, full, 7, ref, 1, &err) == 0);
    CHECK(rel_err(lg + 2 * V, ref, V) < 1e-6);
    free(lg);
    free(ref);
    kvcache_free(&c);
    model_free(&m);
}

/* bf16 weights: decoding (few-row products read the bf16 copies) agrees with the full forward of the same model
 * within `bound` per position (relative), with the same routing; the bf16 model's logits differ from the fp32
 * model's by the rounding of the weights (measured, bounded). */
static void check_bf16_decode(int *zy_test_failed_, double bound) {
    ZyErr err = {{0}};
    Agreement ag = {0};
    double worst_vs_f32 = 0;
    int same_routing = 0;
    for (size_t si = 0; si < ZY_ARRAY_LEN(shapes); si += 2) {
        Model m, m32;
        REQUIRE(make_model(&m, &shapes[si], 300 + si, &err) == 0);
        REQUIRE(make_model(&m32, &shapes[si], 300 + si, &err) == 0);
        const int B = 1, T = 30, V = m.cfg.vocab_size, L = m.cfg.num_layers;
        int32_t *tok = malloc(sizeof(int32_t) * T), *ref_route = malloc(sizeof(int32_t) * L * T);
        ZyRng rng;
        zy_rng_seed(&rng, 41 + si);
        for (int i = 0; i < T; i++) tok[i] = (int32_t)(zy_rng_next(&rng) % V);
        Activations a, a32;
        REQUIRE(acts_create(&a, &m.cfg, B, T, &err) == 0);
        REQUIRE(acts_create(&a32, &m.cfg, B, T, &err) == 0);
        REQUIRE(model_use_bf16(&m, &err) > 0);
        calibrate_skip(&m, &a, tok); /* thresholds set on the bf16 model: its own routing is far from ties */
        for (int l = 0; l < L; l++) m32.w.layers[l].balancing_bias[m.cfg.num_experts] =
                                        m.w.layers[l].balancing_bias[m.cfg.num_experts];
        model_forward(&m, &a, tok);
        model_forward(&m32, &a32, tok);
        for (int l = 0; l < L; l++)
            for (int i = 0; i < T; i++) ref_route[(long)l * T + i] = a.layers[l].choice[i];
        /* the matrices are bf16 (the fp32 model's values rounded), their fp32 pointers cleared; the conv kernels
         * are rounded in place */
        for (int l = 0; l < L; l++) {
            const LayerWeights *W = &m.w.layers[l], *W32 = &m32.w.layers[l];
            CHECK(!W->w_q && !W->w_o && !W->expert_gate_up && !W->router_out_w && W->conv_gr_w);
            for (int i = 0; i < m.cfg.hidden_size; i++) {
                CHECK(zy_bf16_to_f32(W->w_q16[i]) == zy_round_bf16(W32->w_q[i]));
                CHECK(zy_bf16_to_f32(W->expert_down16[i]) == zy_round_bf16(W32->expert_down[i]));
            }
            CHECK(W->conv_gr_w[0] == zy_round_bf16(W32->conv_gr_w[0]));
            /* ... and copied to bf16 for decoding's convolution (the full forward reads the fp32 view) */
            CHECK(W->conv_gr_w16 && zy_bf16_to_f32(W->conv_gr_w16[0]) == W->conv_gr_w[0]);
        }
        CHECK(!m.w.embed && !m.w.lm_head && m.w.embed16 && m.w.lm_head16);
        KVCache c;
        REQUIRE(kvcache_create(&c, &m.cfg, B, T, &err) == 0);
        static const int one[] = {1}, mixed[] = {5, 1, 2, 9, 1};
        CHECK(run_pieces(&m, &c, tok, B, T, one, 1, a.logits, ref_route, &ag, &err) == 0);
        CHECK(run_pieces(&m, &c, tok, B, T, mixed, 5, a.logits, ref_route, &ag, &err) == 0);
        const double e = rel_err(a.logits, a32.logits, T * V);
        int flips = 0;
        for (int l = 0; l < L; l++)
            for (int i = 0; i < T; i++) flips += a.layers[l].choice[i] != a32.layers[l].choice[i];
        printf("    shape %zu: bf16 vs fp32 logits rel err %.3g, %d of %d routing decisions differ\n", si, e, flips, L * T);
        if (flips == 0 && e > worst_vs_f32) worst_vs_f32 = e; /* a flipped routing decision moves a token more */
        same_routing += flips == 0;
        kvcache_free(&c);
        acts_free(&a);
        acts_free(&a32);
        free(tok);
        free(ref_route);
        model_free(&m);
        model_free(&m32);
    }
    printf("    bf16 decode vs bf16 full forward: %d positions, max rel err %.3g, %d routing mismatches; "
           "bf16 vs fp32 logits where routing agrees: rel err %.3g\n", ag.positions, ag.max_err, ag.route_mismatch,
           worst_vs_f32);
    CHECK_MSG(ag.max_err <= bound, "max rel err %.3g (bound %.3g)", ag.max_err, bound);
    CHECK(ag.route_mismatch == 0);
    /* weights rounded at 2^-8 relative: the logits move by about that much, not more */
    CHECK(same_routing > 0);
    CHECK_MSG(worst_vs_f32 > 1e-4 && worst_vs_f32 < 1e-2, "bf16 vs fp32 rel err %.3g", worst_vs_f32);
}

/* This process's way of running bf16 weights (zaya info's "bf16 weights"): as tightly as fp32 decoding. */
TEST(decode_bf16_weights_match_full_forward) {
    printf("    bf16 weights: %s\n", zy_bf16_weights_describe(zy_bf16_weights()));
    check_bf16_decode(zy_test_failed_, 1e-5);
}

/* The avx512bf16 level's numbers (activations rounded to bf16 before each product) on any CPU: with the products'
 * sums independent of the row count, decoding and the full forward must round the very same values, so every
 * fp32 difference upstream (a convolution summed in another order, a BLAS core's) would show here as a bf16 one.
 * Bit for bit, whatever the BLAS core (run_all.sh runs this suite under each). */
TEST(decode_bf16_rounded_activations_match_full_forward_bit_for_bit) {
    ZyErr err = {{0}};
    REQUIRE(zy_bf16_weights_set("dot-emulated", &err) == 0);
    check_bf16_decode(zy_test_failed_, 0.0);
    CHECK(zy_bf16_weights_set(getenv("ZAYA_BF16_WEIGHTS"), &err) == 0);
}

TEST(dtype_flag_parses_and_rejects) {
    ZyErr err = {{0}};
    CHECK(model_parse_dtype("f32", "--dtype", &err) == 0);
    CHECK(model_parse_dtype("fp32", "--dtype", &err) == 0);
    CHECK(model_parse_dtype("bf16", "--dtype", &err) == 1);
    CHECK(model_parse_dtype("bfloat16", "--dtype", &err) == 1);
    CHECK(model_parse_dtype("fp16", "--dtype", &err) == -1);
    CHECK(strstr(err.msg, "--dtype") && strstr(err.msg, "fp16"));
}

/* Loading straight into bf16 (no fp32 arena; an F32 file's matrices converted as they are read) gives exactly
 * model_use_bf16's weights: the same bf16 matrices, the same fp32 vectors, conv kernels rounded the same way. */
TEST(load_dir_as_bf16_matches_use_bf16) {
    ZyErr err = {{0}};
    char dir[64];
    REQUIRE(zy_test_tmpdir(dir, sizeof dir, "bf16load") == 0);
    for (size_t si = 0; si < 2; si++) { /* tied and untied */
        Model src, a, b;
        REQUIRE(make_model(&src, &shapes[si], 500 + si, &err) == 0); /* shapes[0] tied, shapes[1] untied */
        REQUIRE(model_save_dir(&src, dir, ZY_DT_F32, &err) == 0);
        REQUIRE(model_load_dir_as(&a, dir, 1, &err) == 0);
        REQUIRE(model_load_dir(&b, dir, &err) == 0);
        REQUIRE(model_use_bf16(&b, &err) > 0);
        CHECK(!a.params.data && !a.params.grad && !a.bf16); /* no arena: the views are the weights */
        const int D = a.cfg.hidden_size, V = a.cfg.vocab_size;
        size_t differ = memcmp(a.w.embed16, b.w.embed16, (size_t)V * D * 2) != 0;
        differ += memcmp(a.w.lm_head16, b.w.lm_head16, (size_t)V * D * 2) != 0;
        differ += memcmp(a.w.final_norm, b.w.final_norm, (size_t)D * 4) != 0;
        const size_t C = cfg_q_channels(&a.cfg) + cfg_k_channels(&a.cfg);
        const size_t E = a.cfg.num_experts, I = a.cfg.moe_intermediate_size;
        for (int l = 0; l < a.cfg.num_layers; l++) {
            const LayerWeights *x = &a.w.layers[l], *y = &b.w.layers[l];
            differ += memcmp(x->w_q16, y->w_q16, (size_t)cfg_q_channels(&a.cfg) * D * 2) != 0;
            differ += memcmp(x->w_o16, y->w_o16, (size_t)cfg_q_channels(&a.cfg) * D * 2) != 0;
            differ += memcmp(x->expert_gate_up16, y->expert_gate_up16, E * 2 * I * D * 2) != 0;
            differ += memcmp(x->expert_down16, y->expert_down16, E * I * D * 2) != 0;
            differ += memcmp(x->conv_gr_w, y->conv_gr_w, C * a.cfg.head_dim * a.cfg.cca_time1 * 4) != 0;
            differ += !x->conv_gr_w16 || !y->conv_gr_w16 ||
                      memcmp(x->conv_gr_w16, y->conv_gr_w16, C * a.cfg.head_dim * a.cfg.cca_time1 * 2) != 0;
            differ += memcmp(x->input_norm, y->input_norm, (size_t)D * 4) != 0;
            differ += memcmp(x->router_down_b, y->router_down_b, a.cfg.router_hidden_size * 4) != 0;
        }
        CHECK_MSG(differ == 0, "%zu tensors differ", differ);
        CHECK(!a.w.lm_head && a.w.lm_head16 && !a.w.layers[0].expert_down && a.w.layers[0].expert_down16);
        CHECK(!a.w.layers[0].w_q && a.w.layers[0].conv_gr_w && a.w.layers[0].input_norm);
        model_free(&src);
        model_free(&a);
        model_free(&b);
    }
    zy_test_rmtree(dir);
}

/* The block pool under a server's schedule: sequences of different lengths join and leave a running batch (fewer
 * slots than sequences, so slots and blocks are reused), prefill in chunks next to others' single-token steps, and
 * every piece's last logits equal the full forward of that sequence alone. Blocks are all back at the end. */
TEST(decode_pool_ragged_batch_matches_full_forward) {
    ZyErr err = {{0}};
    double worst[2] = {0, 0};
    int pieces[2] = {0, 0};
    for (int si = 0; si < 4; si++) {
        const Shape *sh = &shapes[si == 3 ? 0 : si]; /* CCA ZAYA1-like, MQA, the MHA-shaped CCA; ZAYA1-like again with */
        Model m;                                     /* sliding windows (its forward reads them from m.cfg) */
        REQUIRE(make_model(&m, sh, 300 + si, &err) == 0);
        if (si == 3) { /* layer 0 sees its last 4 keys (a window across block edges), with RoPE of its own */
            m.cfg.sliding_window = 4;
            m.cfg.rope_theta_sliding = 300.0f;
            m.cfg.partial_rotary_factor_sliding = 1.0f;
            cfg_set_layer_sliding(&m.cfg, 0, 1);
        }
        enum { NSEQ = 6, SLOTS = 3, BT = 5, CHUNK = 6, ROWS = 10 };
        const int V = m.cfg.vocab_size, lens[NSEQ] = {17, 3, 29, 1, 12, 24};
        int32_t *tok[NSEQ];
        float *ref[NSEQ];
        ZyRng rng;
        zy_rng_seed(&rng, 77 + si);
        for (int q = 0; q < NSEQ; q++) {
            tok[q] = malloc(sizeof(int32_t) * lens[q]);
            for (int t = 0; t < lens[q]; t++) tok[q][t] = (int32_t)(zy_rng_next(&rng) % V);
            Activations a;
            REQUIRE(acts_create(&a, &m.cfg, 1, lens[q], &err) == 0);
            model_forward(&m, &a, tok[q]);
            ref[q] = malloc(sizeof(float) * lens[q] * V);
            memcpy(ref[q], a.logits, sizeof(float) * lens[q] * V);
            acts_free(&a);
            if (si == 3 && q == 2) { /* the window matters: full attention gives other logits at the end */
                ZayaConfig full = m.cfg;
                full.sliding_window = 0;
                memset(full.sliding_layers, 0, sizeof full.sliding_layers);
                Model mf = m;
                mf.cfg = full;
                REQUIRE(acts_create(&a, &full, 1, lens[q], &err) == 0);
                model_forward(&mf, &a, tok[q]);
                const long last = (long)(lens[q] - 1) * V;
                CHECK_MSG(rel_err(a.logits + last, ref[q] + last, V) > 1e-3, "window changes nothing: %.3g",
                          rel_err(a.logits + last, ref[q] + last, V));
                acts_free(&a);
            }
        }
        for (int kvb = 0; kvb < 2; kvb++) { /* k̂ and v held fp32, then bf16 */
            KVPool p;
            CHECK(kvpool_create(&p, &m.cfg, SLOTS, 65, 20, BT, ROWS, CHUNK, kvb, &err) == -1 &&
                  strstr(err.msg, "max_position_embeddings"));
            REQUIRE(kvpool_create(&p, &m.cfg, SLOTS, 32, 14, BT, ROWS, CHUNK, kvb, &err) == 0);
            int slot_seq[SLOTS] = {-1, -1, -1}, done[NSEQ] = {0}, fed[NSEQ] = {0}, next = 0, finished = 0;
            float *lg = malloc(sizeof(float) * SLOTS * V);
            while (finished < NSEQ) {
                /* join: a free slot takes the next sequence if its blocks fit */
                for (int s = 0; s < SLOTS && next < NSEQ; s++)
                    if (slot_seq[s] < 0 && kvpool_reserve(&p, s, lens[next]) == 0) slot_seq[s] = next++;
                DecodeSeq ds[SLOTS];
                int32_t rows[ROWS];
                int n_ds = 0, N = 0;
                for (int s = 0; s < SLOTS; s++) { /* a ragged step: each takes what the row budget leaves */
                    const int q = slot_seq[s];
                    if (q < 0 || N == ROWS) continue;
                    int n = lens[q] - fed[q];
                    n = n < CHUNK ? n : CHUNK;
                    n = n < ROWS - N ? n : ROWS - N;
                    if (fed[q] >= 4 && n > 1) n = 1 + (fed[q] % 2); /* past a short prefill, decode-like steps of 1-2 */
                    ds[n_ds++] = (DecodeSeq){.slot = s, .n = n, .logits = 1};
                    memcpy(rows + N, tok[q] + fed[q], sizeof(int32_t) * n);
                    N += n;
                }
                REQUIRE(model_decode_step(&m, &p, ds, n_ds, rows, lg, &err) == 0);
                for (int i = 0; i < n_ds; i++) {
                    const int s = ds[i].slot, q = slot_seq[s];
                    fed[q] += ds[i].n;
                    double e = rel_err(lg + (long)i * V, ref[q] + (long)(fed[q] - 1) * V, V);
                    if (!(e <= worst[kvb])) worst[kvb] = e;
                    pieces[kvb]++;
                    CHECK(p.blocks.len[s] == fed[q]);
                    if (fed[q] == lens[q]) {
                        kvpool_seq_release(&p, s);
                        slot_seq[s] = -1;
                        done[q] = 1;
                        finished++;
                    }
                }
            }
            CHECK(p.blocks.n_free == p.blocks.n_blocks);
            /* errors change nothing */
            REQUIRE(kvpool_reserve(&p, 0, 10) == 0);
            CHECK(kvpool_reserve(&p, 1, 32) == 0 && p.blocks.n_free == 5); /* 7 blocks needed, 12 free: fits */
            CHECK(kvpool_reserve(&p, 2, 32) == -1 && p.blocks.n_held[2] == 0);   /* 7 more do not */
            int32_t two[2] = {1, 2};
            DecodeSeq dup[2] = {{0, 1, 1}, {0, 1, 1}};
            CHECK(model_decode_step(&m, &p, dup, 2, two, lg, &err) == -1 && strstr(err.msg, "twice"));
            DecodeSeq noblk = {2, 1, 1};
            CHECK(model_decode_step(&m, &p, &noblk, 1, two, lg, &err) == -1 && strstr(err.msg, "holds 0 blocks"));
            DecodeSeq big = {0, CHUNK + 1, 1};
            CHECK(model_decode_step(&m, &p, &big, 1, two, lg, &err) == -1 && strstr(err.msg, "new tokens"));
            int32_t bad = V;
            DecodeSeq one = {0, 1, 1};
            CHECK(model_decode_step(&m, &p, &one, 1, &bad, lg, &err) == -1 && strstr(err.msg, "outside the vocabulary"));
            CHECK(p.blocks.len[0] == 0);
            kvpool_seq_release(&p, 0);
            kvpool_seq_release(&p, 1);
            CHECK(p.blocks.n_free == p.blocks.n_blocks);
            for (int q = 0; q < NSEQ; q++) CHECK(done[q]);
            free(lg);
            kvpool_free(&p);
        }
        for (int q = 0; q < NSEQ; q++) {
            free(tok[q]);
            free(ref[q]);
        }
        model_free(&m);
    }
    printf("    ragged pool vs full forward: %d pieces, max rel err %.3g with k and v fp32; %d pieces, %.3g with bf16\n",
           pieces[0], worst[0], pieces[1], worst[1]);
    CHECK_MSG(worst[0] < 1e-5, "max rel err %.3g", worst[0]);
    /* bf16 k̂ and v: each rounded at 2^-9 relative; the logits move by about that, not more */
    CHECK_MSG(worst[1] > 0 && worst[1] < 2e-2, "max rel err %.3g", worst[1]);
}

/* A choice forks its parent's cache (kvpool_fork) and both go on with different tokens: each gets the logits of a
 * full forward over its own sequence (the parent's writes to the partly filled block do not reach the child, which
 * has its own copy); the full blocks are shared until both are released. The prefill asks for every row's logits
 * (DECODE_LOGITS_ALL) beside another sequence that wants only its last row's, in both orders: each lands at its place
 * (o_i = rows before it, n_j for DECODE_LOGITS_ALL, 1 for others). */
TEST(decode_pool_fork_shares_blocks_and_every_row_logits) {
    ZyErr err = {{0}};
    for (int kvb = 0; kvb < 2; kvb++) {
        Model m;
        REQUIRE(make_model(&m, &shapes[0], 900 + kvb, &err) == 0);
        enum { NP = 13, NC = 9, OTHER = 5, BT = 4, CHUNK = 6 };
        const int V = m.cfg.vocab_size;
        int32_t seq[3][NP + NC];
        ZyRng rng;
        zy_rng_seed(&rng, 31 + kvb);
        for (int t = 0; t < NP + NC; t++) seq[0][t] = (int32_t)(zy_rng_next(&rng) % V);
        memcpy(seq[1], seq[0], sizeof(int32_t) * NP); /* the same prompt, another continuation */
        for (int t = NP; t < NP + NC; t++) seq[1][t] = (int32_t)((seq[0][t] + 1 + t) % V);
        for (int t = 0; t < OTHER; t++) seq[2][t] = (int32_t)(zy_rng_next(&rng) % V);
        float *ref[3];
        for (int q = 0; q < 3; q++) {
            const int T = q == 2 ? OTHER : NP + NC;
            Activations a;
            REQUIRE(acts_create(&a, &m.cfg, 1, T, &err) == 0);
            model_forward(&m, &a, seq[q]);
            ref[q] = malloc(sizeof(float) * T * V);
            memcpy(ref[q], a.logits, sizeof(float) * T * V);
            acts_free(&a);
        }
        KVPool p;
        REQUIRE(kvpool_create(&p, &m.cfg, 3, NP + NC, 16, BT, 2 * CHUNK, CHUNK, kvb, &err) == 0);
        const int own = kvblocks_for(&p.blocks, NP + NC) - NP / BT;
        REQUIRE(kvpool_reserve(&p, 0, NP + NC) == 0 && kvpool_reserve(&p, 1, own * BT) == 0 &&
                kvpool_reserve(&p, 2, OTHER) == 0);
        float *lg = malloc(sizeof(float) * 2 * CHUNK * V);
        double worst = 0;
        /* the prompt in chunks 6, 6, 1 with every row's logits; slot 2's 5 tokens beside it (2, 2, 1), first after
         * and then before the prompt's rows */
        const int pn[3] = {6, 6, 1}, on[3] = {2, 2, 1};
        int pf = 0, of = 0;
        for (int st = 0; st < 3; st++) {
            DecodeSeq ds[2];
            int32_t rows[2 * CHUNK];
            const int all_first = st != 0;
            const DecodeSeq pseq = {.slot = 0, .n = pn[st], .logits = DECODE_LOGITS_ALL};
            const DecodeSeq oseq = {.slot = 2, .n = on[st], .logits = 1};
            ds[0] = all_first ? pseq : oseq;
            ds[1] = all_first ? oseq : pseq;
            memcpy(rows, all_first ? seq[0] + pf : seq[2] + of, sizeof(int32_t) * ds[0].n);
            memcpy(rows + ds[0].n, all_first ? seq[2] + of : seq[0] + pf, sizeof(int32_t) * ds[1].n);
            REQUIRE(model_decode_step(&m, &p, ds, 2, rows, lg, &err) == 0);
            const float *prompt_rows = lg + (size_t)(all_first ? 0 : 1) * V;
            const float *other_row = lg + (size_t)(all_first ? pn[st] : 0) * V;
            for (int r = 0; r < pn[st]; r++) {
                double e = rel_err(prompt_rows + (size_t)r * V, ref[0] + (size_t)(pf + r) * V, V);
                worst = e > worst ? e : worst;
            }
            of += on[st];
            pf += pn[st];
            double e = rel_err(other_row, ref[2] + (size_t)(of - 1) * V, V);
            worst = e > worst ? e : worst;
        }
        CHECK(p.blocks.len[0] == NP && p.blocks.len[2] == OTHER);
        kvpool_seq_release(&p, 2);
        /* the fork: the child takes the 3 full blocks (shared) and copies the partial fourth into its own */
        const int free_before = p.blocks.n_free;
        CHECK(kvpool_fork(&p, 0, 0) == -1);
        CHECK(kvpool_fork(&p, 0, 2) == -1 && p.blocks.len[2] == 0); /* no block of its own for the partial one's copy */
        REQUIRE(kvpool_fork(&p, 0, 1) == 0);
        CHECK(p.blocks.len[1] == NP && p.blocks.n_free == free_before && p.blocks.n_held[1] == NP / BT + own);
        const int32_t *row0 = kvblocks_row(&p.blocks, 0), *row1 = kvblocks_row(&p.blocks, 1);
        for (int b = 0; b < NP / BT; b++) CHECK(row1[b] == row0[b] && p.blocks.refs[row0[b]] == 2);
        CHECK(row1[NP / BT] != row0[NP / BT]);
        CHECK(kvpool_fork(&p, 0, 1) == -1); /* the child is not empty any more */
        /* both continue, one token each per step */
        for (int t = NP; t < NP + NC; t++) {
            DecodeSeq ds[2] = {{.slot = 0, .n = 1, .logits = 1}, {.slot = 1, .n = 1, .logits = 1}};
            int32_t rows[2] = {seq[0][t], seq[1][t]};
            REQUIRE(model_decode_step(&m, &p, ds, 2, rows, lg, &err) == 0);
            for (int q = 0; q < 2; q++) {
                double e = rel_err(lg + (size_t)q * V, ref[q] + (size_t)t * V, V);
                worst = e > worst ? e : worst;
            }
        }
        kvpool_seq_release(&p, 0); /* the shared blocks stay with the child */
        CHECK(p.blocks.n_blocks - p.blocks.n_free == p.blocks.n_held[1]);
        kvpool_seq_release(&p, 1);
        CHECK(p.blocks.n_free == p.blocks.n_blocks);
        printf("    fork and every-row logits vs full forward (%s k and v): max rel err %.3g\n", kvb ? "bf16" : "fp32",
               worst);
        CHECK_MSG(worst < (kvb ? 2e-2 : 1e-5), "max rel err %.3g", worst);
        free(lg);
        for (int q = 0; q < 3; q++) free(ref[q]);
        kvpool_free(&p);
        model_free(&m);
    }
}

/* ---- quantized weights read in place (--dtype q8|q4) ----
 * Widths that groups of 32 divide (the quantized products need it); tied and untied heads. The quantized model is
 * model_save_dir + quant_model_dir's output, loaded with MODEL_DTYPE_Q8/Q4; its reference is the same folder loaded
 * dequantized (fp32 values s·q + b: the very values the kernels multiply by). */
static const Shape quant_shapes[] = {
    {2, 2, 4, 2, 8, 2, 1, 0.5f, 64, 32, 64},
    {3, 2, 4, 1, 8, 2, 0, 1.0f, 64, 32, 64},
};

/* zaya quantize's default plan in groups of 32: at 4 bits the router stays at 8 bits in groups of 64 (router width 64
 * above), so the q4 models below mix 4- and 8-bit matrices. */
static int quantize_default(const char *dir, const char *qdir, int bits, QuantizeReport *rep, ZyErr *err) {
    QuantPlan plan;
    return quant_plan_make(&plan, bits, 32, QUANT_ROUTER_BITS, NULL, err) ||
           quant_model_dir(dir, qdir, &plan, NULL, 0, rep, err);
}

/* Logits of T tokens through the full forward of m. */
static float *forward_logits(Model *m, const int32_t *tok, int T, int32_t *route, ZyErr *err) {
    Activations a;
    if (acts_create(&a, &m->cfg, 1, T, err)) return NULL;
    model_forward(m, &a, tok);
    float *out = malloc(sizeof(float) * T * m->cfg.vocab_size);
    if (out) memcpy(out, a.logits, sizeof(float) * T * m->cfg.vocab_size);
    for (int l = 0; route && l < m->cfg.num_layers; l++)
        for (int i = 0; i < T; i++) route[(long)l * T + i] = a.layers[l].choice[i];
    acts_free(&a);
    return out;
}

/* For bits 8 and 4, each quant shape: decoding (one token at a time, and in pieces of 5/1/2/9/1 rows: the few-row
 * kernels) and the full forward (T = 40 rows: more than ZY_QUANT_MAX_ROWS, so the dequantized panels) of the in-place
 * model against the dequantized fp32 model's forward. Returns the worst relative error of decode and of the forward. */
static void check_quant_decode(int *zy_test_failed_, double *worst_decode, double *worst_forward, int *route_mismatch) {
    ZyErr err = {{0}};
    char dir[64], qdir[80];
    REQUIRE(zy_test_tmpdir(dir, sizeof dir, "qdecode") == 0);
    snprintf(qdir, sizeof qdir, "%s/q", dir);
    *worst_decode = *worst_forward = 0, *route_mismatch = 0;
    for (int bits = 8; bits >= 4; bits -= 4)
        for (size_t si = 0; si < ZY_ARRAY_LEN(quant_shapes); si++) {
            Model src, q, deq;
            REQUIRE(make_model(&src, &quant_shapes[si], 700 + si, &err) == 0);
            REQUIRE(model_save_dir(&src, dir, ZY_DT_F32, &err) == 0);
            QuantizeReport rep;
            CHECK_MSG(quantize_default(dir, qdir, bits, &rep, &err) == 0, "%s", err.msg);
            CHECK_MSG(model_load_dir_as(&q, qdir, bits, &err) == 0, "%s", err.msg);
            if (*zy_test_failed_) break;
            REQUIRE(model_load_dir_as(&deq, qdir, MODEL_DTYPE_F32, &err) == 0);
            /* in place: no arena, every matrix a quantized view, the fp32 views of matrices NULL */
            CHECK(!q.params.data && !q.w.embed && !q.w.lm_head && q.w.embed_quant.q && q.w.lm_head_quant.q);
            CHECK(!q.w.layers[0].expert_gate_up && q.w.layers[0].expert_gate_up_quant.bits == bits);
            CHECK(q.w.layers[1].router_out_w_quant.q && q.w.layers[0].conv_gr_w && q.w.layers[0].input_norm);
            CHECK(!q.w.layers[0].conv_gr_w16); /* an F32 folder's conv kernels are not bf16 values: no bf16 copy */
            CHECK((q.w.embed_quant.q == q.w.lm_head_quant.q) == !!q.cfg.tie_word_embeddings);
            const int T = 40, V = q.cfg.vocab_size, L = q.cfg.num_layers;
            int32_t *tok = malloc(sizeof(int32_t) * T), *ref_route = malloc(sizeof(int32_t) * L * T);
            ZyRng rng;
            zy_rng_seed(&rng, 51 + si);
            for (int i = 0; i < T; i++) tok[i] = (int32_t)(zy_rng_next(&rng) % V);
            {
                Activations a;
                REQUIRE(acts_create(&a, &q.cfg, 1, T, &err) == 0);
                calibrate_skip(&deq, &a, tok); /* on the reference: its routing far from ties */
                acts_free(&a);
                for (int l = 0; l < L; l++)
                    q.w.layers[l].balancing_bias[q.cfg.num_experts] = deq.w.layers[l].balancing_bias[q.cfg.num_experts];
            }
            float *ref = forward_logits(&deq, tok, T, ref_route, &err), *full = forward_logits(&q, tok, T, NULL, &err);
            REQUIRE(ref && full);
            const double ef = rel_err(full, ref, T * V);
            if (!(ef <= *worst_forward)) *worst_forward = ef;
            Agreement ag = {0};
            KVCache c;
            REQUIRE(kvcache_create(&c, &q.cfg, 1, T, &err) == 0);
            static const int one[] = {1}, mixed[] = {5, 1, 2, 9, 1};
            CHECK(run_pieces(&q, &c, tok, 1, T, one, 1, ref, ref_route, &ag, &err) == 0);
            CHECK(run_pieces(&q, &c, tok, 1, T, mixed, 5, ref, ref_route, &ag, &err) == 0);
            if (!(ag.max_err <= *worst_decode)) *worst_decode = ag.max_err;
            *route_mismatch += ag.route_mismatch;
            printf("    q%d shape %zu: decode vs dequantized forward rel err %.3g (%d routing mismatches), full "
                   "forward %.3g\n", bits, si, ag.max_err, ag.route_mismatch, ef);
            kvcache_free(&c);
            free(ref), free(full), free(tok), free(ref_route);
            model_free(&src), model_free(&q), model_free(&deq);
        }
    zy_test_rmtree(dir);
}

/* The widen way (codes widened to fp32, fp32 activations) computes the dequantized model's products in another
 * summation order only: decoding and the full forward match it as tightly as fp32 decoding matches fp32. */
TEST(decode_quantized_widen_matches_dequantized_forward) {
    ZyErr err = {{0}};
    const ZyQuantWay was = zy_quant_way();
    REQUIRE(zy_quant_way_set("widen", &err) == 0);
    double dec = 1, fwd = 1;
    int mismatch = -1;
    check_quant_decode(zy_test_failed_, &dec, &fwd, &mismatch);
    CHECK_MSG(dec <= 1e-5 && fwd <= 1e-5, "decode %.3g, forward %.3g", dec, fwd);
    CHECK(mismatch == 0);
    CHECK(zy_quant_way_set(was == ZY_QUANT_WIDEN ? "widen" : "int8", &err) == 0);
}

/* The int8 way (the default) rounds each row's activations to int8 per block of 32 before the few-row products, row
 * by row, so the full forward of 24 rows (every product few-row: at most ZY_QUANT_MAX_ROWS rows) rounds the same
 * values as decoding; what differs is fp32 summation order upstream (attention, convolutions), which can move an
 * activation across an int8 rounding boundary: one quantum d = max|x|/127 of one value, weighed by a code's
 * |q - 2^(B-1)|·s. In these 64-wide rows one quantum is up to ~1% of a row's norm, so one such flip moves a position's
 * logits by about that much (measured worst 0.94% over 192 positions). Bound: 3e-2 relative, a few flips, against
 * errors of 0.1-0.5 had the rounding differed between the paths (decoding int8 against the unrounded dequantized
 * forward measured that), and the same routing. (The widen way above matches at 1e-5.) */
TEST(decode_quantized_int8_matches_full_forward) {
    ZyErr err = {{0}};
    const ZyQuantWay was = zy_quant_way();
    REQUIRE(zy_quant_way_set("int8", &err) == 0);
    char dir[64], qdir[80];
    REQUIRE(zy_test_tmpdir(dir, sizeof dir, "qint8") == 0);
    snprintf(qdir, sizeof qdir, "%s/q", dir);
    Agreement ag = {0};
    for (int bits = 8; bits >= 4; bits -= 4)
        for (size_t si = 0; si < ZY_ARRAY_LEN(quant_shapes); si++) {
            Model src, q;
            QuantizeReport rep;
            REQUIRE(make_model(&src, &quant_shapes[si], 800 + si, &err) == 0);
            REQUIRE(model_save_dir(&src, dir, ZY_DT_F32, &err) == 0);
            REQUIRE(quantize_default(dir, qdir, bits, &rep, &err) == 0);
            REQUIRE(model_load_dir_as(&q, qdir, bits, &err) == 0);
            const int T = 24, V = q.cfg.vocab_size, L = q.cfg.num_layers;
            int32_t tok[24], ref_route[3 * 24];
            ZyRng rng;
            zy_rng_seed(&rng, 61 + si);
            for (int i = 0; i < T; i++) tok[i] = (int32_t)(zy_rng_next(&rng) % V);
            Activations a;
            REQUIRE(acts_create(&a, &q.cfg, 1, T, &err) == 0);
            calibrate_skip(&q, &a, tok);
            acts_free(&a);
            float *ref = forward_logits(&q, tok, T, ref_route, &err);
            REQUIRE(ref && L <= 3);
            KVCache c;
            REQUIRE(kvcache_create(&c, &q.cfg, 1, T, &err) == 0);
            static const int one[] = {1}, mixed[] = {5, 1, 2, 9, 1};
            CHECK(run_pieces(&q, &c, tok, 1, T, one, 1, ref, ref_route, &ag, &err) == 0);
            CHECK(run_pieces(&q, &c, tok, 1, T, mixed, 5, ref, ref_route, &ag, &err) == 0);
            kvcache_free(&c);
            free(ref);
            model_free(&src), model_free(&q);
        }
    printf("    int8 way: decode vs full forward of the quantized model: %d positions, max rel err %.3g, %d routing "
           "mismatches\n", ag.positions, ag.max_err, ag.route_mismatch);
    CHECK_MSG(ag.max_err <= 3e-2, "max rel err %.3g", ag.max_err);
    CHECK(ag.route_mismatch == 0);
    CHECK(zy_quant_way_set(was == ZY_QUANT_WIDEN ? "widen" : "int8", &err) == 0);
    zy_test_rmtree(dir);
}

/* --dtype's quantized values and their refusals: q8/q4 parse, auto picks a quantized folder's bits, q8 on an
 * unquantized folder (or on a 4-bit one) and bf16 on a quantized one are errors naming the folder. */
TEST(quantized_dtype_resolves_and_refuses) {
    ZyErr err = {{0}};
    char dir[64], qdir[80];
    REQUIRE(zy_test_tmpdir(dir, sizeof dir, "qdtype") == 0);
    snprintf(qdir, sizeof qdir, "%s/q4", dir);
    Model src, m;
    REQUIRE(make_model(&src, &quant_shapes[0], 9, &err) == 0);
    REQUIRE(model_save_dir(&src, dir, ZY_DT_F32, &err) == 0);
    QuantizeReport rep;
    REQUIRE(quantize_default(dir, qdir, 4, &rep, &err) == 0);
    CHECK(model_resolve_dtype("q8", "--dtype", dir, &err) == MODEL_DTYPE_Q8);
    CHECK(model_resolve_dtype("q4", "--dtype", dir, &err) == MODEL_DTYPE_Q4);
    CHECK(model_resolve_dtype("auto", "--dtype", qdir, &err) == MODEL_DTYPE_Q4);
    CHECK(model_resolve_dtype("auto", "--dtype", dir, &err) == MODEL_DTYPE_F32);
    CHECK(model_resolve_dtype("q5", "--dtype", dir, &err) == -1 && strstr(err.msg, "\"q5\"") && strstr(err.msg, "q4"));
    CHECK_MSG(model_load_dir_as(&m, dir, MODEL_DTYPE_Q8, &err) == -1 && strstr(err.msg, dir) &&
                  strstr(err.msg, "is not quantized") && strstr(err.msg, "zaya quantize"), "%s", err.msg);
    CHECK_MSG(model_load_dir_as(&m, qdir, MODEL_DTYPE_Q8, &err) == -1 && strstr(err.msg, "holds 4-bit"), "%s", err.msg);
    CHECK_MSG(model_load_dir_as(&m, qdir, MODEL_DTYPE_BF16, &err) == -1 && strstr(err.msg, "do not load as bf16"),
              "%s", err.msg);
    REQUIRE(model_load_dir_as(&m, qdir, MODEL_DTYPE_Q4, &err) == 0);
    size_t mapped, copied;
    model_weight_bytes(&m, &mapped, &copied);
    /* the codes (4 bits), scales and biases (F32 here: the source was fp32) of every matrix, mapped */
    CHECK_MSG(mapped > 0 && (double)mapped == rep.quant_bytes, "mapped %zu, quantized tensors %.0f", mapped, rep.quant_bytes);
    model_free(&m);
    model_free(&src);
    zy_test_rmtree(dir);
}

/* A prompt that starts with another's tokens takes its cached full blocks and the state kept at their end
 * (prefix_cache.h) and computes only the rest: its logits are those of the same prompt computed in full in a pool
 * without a cache, bit for bit, and within 1e-5 of the full forward (P = 2 and P = 4, fp32 and bf16 k and v). The
 * first prompt ran in chunks that do not end at block boundaries, so the kept states come from inside a step. */
TEST(decode_pool_prefix_cache_matches_uncached) {
    ZyErr err = {{0}};
    const int shape_ids[2] = {0, 3};
    for (int si = 0; si < 2; si++)
        for (int kvb = 0; kvb < 2; kvb++) {
            Model m;
            REQUIRE(make_model(&m, &shapes[shape_ids[si]], 950 + si * 2 + kvb, &err) == 0);
            enum { NA = 22, NB = 20, SHARED = 14, BT = 4, CHUNK = 12 };
            const int V = m.cfg.vocab_size;
            int32_t a[NA], b[NB];
            ZyRng rng;
            zy_rng_seed(&rng, 77 + si);
            for (int t = 0; t < NA; t++) a[t] = (int32_t)(zy_rng_next(&rng) % V);
            for (int t = 0; t < NB; t++) b[t] = t < SHARED ? a[t] : (int32_t)((a[t] + 3) % V);
            Activations act;
            REQUIRE(acts_create(&act, &m.cfg, 1, NB, &err) == 0);
            model_forward(&m, &act, b);
            KVPool p, q;
            PrefixCache c;
            REQUIRE(kvpool_create(&p, &m.cfg, 2, 32, 16, BT, CHUNK, CHUNK, kvb, &err) == 0);
            REQUIRE(kvpool_create(&q, &m.cfg, 1, 32, 16, BT, CHUNK, CHUNK, kvb, &err) == 0);
            REQUIRE(prefix_cache_init_kvpool(&c, &p, &err) == 0);
            float *lg = malloc(sizeof(float) * CHUNK * V), *ref = malloc(sizeof(float) * CHUNK * V);
            /* prompt a in chunks 6, 6, 6, 4 (block ends at 4, 8, 12, 16, 20 fall inside steps) */
            REQUIRE(kvpool_reserve(&p, 0, NA) == 0);
            for (int at = 0; at < NA; at += 6) {
                const DecodeSeq ds = {.slot = 0, .n = NA - at < 6 ? NA - at : 6, .logits = 1};
                REQUIRE(model_decode_step(&m, &p, &ds, 1, a + at, lg, &err) == 0);
                prefix_cache_insert(&c, 0, a, NA, NULL, p.blocks.len[0]);
            }
            kvpool_seq_release(&p, 0);
            CHECK(prefix_cache_stats(&c).cached == NA / BT);
            /* prompt b: the three blocks before the first difference (at 14) come from the cache */
            const int reused = prefix_cache_attach(&c, 1, b, NB - 1);
            CHECK(reused == 12);
            REQUIRE(kvpool_reserve(&p, 1, NB) == 0);
            const DecodeSeq rest = {.slot = 1, .n = NB - reused, .logits = DECODE_LOGITS_ALL};
            REQUIRE(model_decode_step(&m, &p, &rest, 1, b + reused, lg, &err) == 0);
            /* the same prompt in full without a cache: the first 12, then the same 8 rows */
            REQUIRE(kvpool_reserve(&q, 0, NB) == 0);
            const DecodeSeq first = {.slot = 0, .n = reused, .logits = 0}, last = {.slot = 0, .n = NB - reused,
                                                                                  .logits = DECODE_LOGITS_ALL};
            REQUIRE(model_decode_step(&m, &q, &first, 1, b, NULL, &err) == 0);
            REQUIRE(model_decode_step(&m, &q, &last, 1, b + reused, ref, &err) == 0);
            CHECK(memcmp(lg, ref, sizeof(float) * (NB - reused) * V) == 0);
            double worst = 0;
            for (int r = 0; r < NB - reused; r++) {
                double e = rel_err(lg + (size_t)r * V, act.logits + (size_t)(reused + r) * V, V);
                worst = e > worst ? e : worst;
            }
            CHECK_MSG(worst < (kvb ? 2e-2 : 1e-5), "max rel err %.3g", worst);
            free(lg);
            free(ref);
            acts_free(&act);
            prefix_cache_free(&c);
            kvpool_free(&q);
            kvpool_free(&p);
            model_free(&m);
        }
}

/* --kv-dtype: auto is bf16 for bf16 or quantized weights on either device (the GPU's bf16 cache measured faster than
 * fp32 on an H200), f32 for fp32 weights; bf16 and f32 are taken as asked; anything else is an error naming the flag
 * and the value. */
TEST(kv_dtype_resolve_devices) {
    ZyErr err = {{0}};
    CHECK(kv_dtype_resolve("auto", 1, "f", &err) == 1);
    CHECK(kv_dtype_resolve("auto", 0, "f", &err) == 0);
    CHECK(kv_dtype_resolve("bf16", 0, "f", &err) == 1);
    CHECK(kv_dtype_resolve("bf16", 1, "f", &err) == 1);
    CHECK(kv_dtype_resolve("fp32", 1, "f", &err) == 0);
    CHECK(kv_dtype_resolve("f32", 1, "f", &err) == 0);
    CHECK(kv_dtype_resolve("f16", 1, "serve: --kv-dtype", &err) == -1);
    CHECK_MSG(strstr(err.msg, "serve: --kv-dtype") && strstr(err.msg, "'f16'"), "%s", err.msg);
}
