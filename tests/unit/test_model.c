/* Model-level checks that need no oracle: layout, initialisation, token validation, backward accumulation. */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "model/config.h"
#include "model/model.h"
#include "test.h"

static int tiny_model(Model *m, int tied, ZyErr *err) {
    ZayaConfig c = {.vocab_size = 50, .hidden_size = 16, .num_layers = 2, .num_heads = 4, .num_kv_heads = 2,
                    .head_dim = 4, .num_experts = 3, .moe_intermediate_size = 8, .router_hidden_size = 8,
                    .cca_time0 = 2, .cca_time1 = 2, .rms_norm_eps = 1e-5f, .tie_word_embeddings = tied,
                    .max_position_embeddings = 32, .rope_theta = 10000.0f, .partial_rotary_factor = 0.5f,
                    .initializer_range = 0.02f, .bos_token_id = 2, .eos_token_id = 1, .pad_token_id = 0};
    return model_create(m, &c, err);
}

TEST(model_layout_uses_hf_names_and_shapes) {
    Model m;
    ZyErr err = {{0}};
    REQUIRE(tiny_model(&m, 1, &err) == 0);
    int i = params_find(&m.params, "model.layers.1.mlp.experts.gate_up_proj");
    REQUIRE(i >= 0);
    CHECK(m.params.info[i].ndim == 3 && m.params.info[i].shape[0] == 3 && m.params.info[i].shape[1] == 16 &&
          m.params.info[i].shape[2] == 16);
    CHECK(params_find(&m.params, "model.layers.0.mlp.gate.router_states_scale") < 0); /* no EDA at layer 0 */
    CHECK(params_find(&m.params, "model.layers.1.mlp.gate.router_states_scale") >= 0);
    CHECK(params_find(&m.params, "lm_head.weight") < 0); /* tied */
    int bb = params_find(&m.params, "model.layers.0.mlp.gate.balancing_biases");
    REQUIRE(bb >= 0);
    CHECK(!param_trainable(&m.params.info[bb]));
    CHECK(m.w.lm_head == m.w.embed && m.g.lm_head == m.g.embed);
    for (int k = 0; k < m.params.count; k++) CHECK(m.params.info[k].offset % 16 == 0);
    model_free(&m);
    REQUIRE(tiny_model(&m, 0, &err) == 0);
    CHECK(params_find(&m.params, "lm_head.weight") >= 0 && m.w.lm_head != m.w.embed);
    model_free(&m);
}

TEST(model_init_follows_the_spec) {
    Model m;
    ZyErr err = {{0}};
    REQUIRE(tiny_model(&m, 1, &err) == 0);
    model_init_weights(&m, 7);
    const LayerWeights *L = &m.w.layers[1];
    CHECK(L->temp[0] == 1.0f && L->temp[1] == 1.0f);                  /* [zaya] T = 1 */
    CHECK(L->balancing_bias[3] == -1.0f && L->balancing_bias[0] == 0.0f); /* skip expert held at -1 */
    CHECK(L->conv_dw_b[0] == 0.0f && L->attn_rb[3] == 0.0f && L->mlp_rs[2] == 1.0f && L->router_state_scale[0] == 1.0f);
    double ss = 0;
    size_t n = (size_t)50 * 16;
    for (size_t i = 0; i < n; i++) ss += (double)m.w.embed[i] * m.w.embed[i];
    CHECK_NEAR(sqrt(ss / n), 0.02, 0.1); /* within 10% of initializer_range */
    /* deterministic */
    float first = m.w.embed[5];
    model_init_weights(&m, 7);
    CHECK(m.w.embed[5] == first);
    model_init_weights(&m, 8);
    CHECK(m.w.embed[5] != first);
    model_free(&m);
}

/* The chunked, multi-threaded initialisation draws the numbers one zy_rng_normal after another would, in the table's
 * order, whatever the thread count: a vocabulary of 70,000 makes the embedding 1.12 M values, past one 1 M chunk. */
TEST(model_init_draws_one_stream_at_any_thread_count) {
    Model m;
    ZyErr err = {{0}};
    ZayaConfig c = {.vocab_size = 70000, .hidden_size = 16, .num_layers = 1, .num_heads = 4, .num_kv_heads = 2,
                    .head_dim = 4, .num_experts = 3, .moe_intermediate_size = 8, .router_hidden_size = 8,
                    .cca_time0 = 2, .cca_time1 = 2, .rms_norm_eps = 1e-5f, .tie_word_embeddings = 0,
                    .max_position_embeddings = 32, .rope_theta = 10000.0f, .partial_rotary_factor = 0.5f,
                    .initializer_range = 0.02f, .bos_token_id = 2, .eos_token_id = 1, .pad_token_id = 0};
    REQUIRE(model_create(&m, &c, &err) == 0);
    float *want = malloc(m.params.total * sizeof(float));
    REQUIRE(want != NULL);
    memset(want, 0, m.params.total * sizeof(float));
    ZyRng rng;
    zy_rng_seed(&rng, 11);
    size_t normal = 0;
    for (int i = 0; i < m.params.count; i++) {
        const ParamInfo *p = &m.params.info[i];
        if (p->init != INIT_NORMAL) continue;
        for (size_t j = 0; j < p->numel; j++) want[p->offset + j] = (float)(0.02f * zy_rng_normal(&rng));
        normal += p->numel;
    }
    CHECK(normal > ((size_t)1 << 20));
    const int threads = omp_get_max_threads();
    for (int t = 1; t <= 3; t++) {
        omp_set_num_threads(t);
        memset(m.params.data, 0xff, m.params.total * sizeof(float));
        model_init_weights(&m, 11);
        size_t differ = 0;
        for (int i = 0; i < m.params.count; i++) {
            const ParamInfo *p = &m.params.info[i];
            if (p->init == INIT_NORMAL)
                differ += memcmp(m.params.data + p->offset, want + p->offset, p->numel * sizeof(float)) != 0;
        }
        CHECK_MSG(differ == 0, "%zu tensors differ at %d threads", differ, t);
    }
    omp_set_num_threads(threads);
    free(want);
    model_free(&m);
}

TEST(model_rejects_out_of_range_tokens) {
    Model m;
    ZyErr err = {{0}};
    REQUIRE(tiny_model(&m, 1, &err) == 0);
    int32_t ok[4] = {0, 1, 49, 3}, bad[4] = {0, 50, 1, 2}, neg[4] = {0, 1, -1, 2};
    CHECK(model_check_tokens(&m, ok, 2, 2, &err) == 0);
    CHECK(model_check_tokens(&m, bad, 2, 2, &err) == -1 && strstr(err.msg, "token id 50 at [0, 1]"));
    CHECK(model_check_tokens(&m, neg, 2, 2, &err) == -1 && strstr(err.msg, "token id -1 at [1, 0]"));
    int32_t long_seq[33] = {0};
    CHECK(model_check_tokens(&m, long_seq, 1, 33, &err) == -1 && strstr(err.msg, "max_position_embeddings"));
    model_free(&m);
}

/* Backward accumulates: two backward passes give twice the gradient; the forward is deterministic. */
TEST(model_backward_accumulates_and_is_deterministic) {
    Model m;
    Activations a;
    ZyErr err = {{0}};
    REQUIRE(tiny_model(&m, 0, &err) == 0);
    model_init_weights(&m, 3);
    REQUIRE(acts_create(&a, &m.cfg, 2, 5, &err) == 0);
    int32_t tokens[10] = {1, 4, 9, 0, 3, 7, 7, 2, 49, 11}, targets[10];
    make_next_token_targets(targets, tokens, 2, 5);
    CHECK(targets[4] == -1 && targets[3] == 3 && targets[9] == -1);
    model_forward(&m, &a, tokens);
    double l1 = model_loss(&m, &a, targets);
    CHECK_NEAR(l1, log(50.0), 0.05); /* near-uniform predictions at init */
    params_zero_grad(&m.params);
    double l2 = model_backward(&m, &a, targets);
    CHECK(l1 == l2);
    size_t n = m.params.total;
    float *g1 = malloc(n * sizeof *g1);
    memcpy(g1, m.params.grad, n * sizeof *g1);
    model_forward(&m, &a, tokens);
    model_backward(&m, &a, targets);
    double worst = 0, norm = 0;
    for (size_t i = 0; i < n; i++) {
        worst = fmax(worst, fabs(m.params.grad[i] - 2 * g1[i]));
        norm += (double)g1[i] * g1[i];
    }
    CHECK(norm > 0);
    CHECK_MSG(worst < 1e-6, "second backward is not an exact accumulation (%.3g)", worst);
    free(g1);
    acts_free(&a);
    model_free(&m);
}
