/* The research variants (zaya_attention mha, zaya_router linear, zaya_moe noskip/dense, zaya_residual_scaling
 * false) have no transformers oracle, so each is checked on its own terms: its layout (names, shapes, counts), every
 * tensor's gradient against central finite differences of the loss, cached decoding against the full forward, and
 * where a variant is ZAYA1 with something taken out, exact agreement with ZAYA1 carrying the neutral values. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/config.h"
#include "infer/decode.h"
#include "model/model.h"
#include "model/model_stats.h"
#include "test.h"

typedef struct {
    const char *name;
    ZyAttentionKind attention;
    ZyRouterKind router;
    ZyMoeKind moe;
    int no_residual_scaling, Hq, Hkv;
    int window, sliding_mask; /* sliding-window layers (bit l: layer l slides, window keys), their RoPE of its own */
} Variant;

static const Variant variants[] = {
    {"zaya1", ZY_ATTN_CCA, ZY_ROUTER_MLP, ZY_MOE_SKIP, 0, 4, 2, 0, 0},
    {"mha", ZY_ATTN_MHA, ZY_ROUTER_MLP, ZY_MOE_SKIP, 0, 4, 4, 0, 0},
    {"gqa", ZY_ATTN_MHA, ZY_ROUTER_MLP, ZY_MOE_SKIP, 0, 4, 2, 0, 0},
    {"linear-router", ZY_ATTN_CCA, ZY_ROUTER_LINEAR, ZY_MOE_SKIP, 0, 4, 2, 0, 0},
    {"noskip", ZY_ATTN_CCA, ZY_ROUTER_MLP, ZY_MOE_NOSKIP, 0, 4, 2, 0, 0},
    {"linear-noskip", ZY_ATTN_CCA, ZY_ROUTER_LINEAR, ZY_MOE_NOSKIP, 0, 4, 2, 0, 0},
    {"dense", ZY_ATTN_CCA, ZY_ROUTER_MLP, ZY_MOE_DENSE, 0, 4, 2, 0, 0},
    {"no-residual-scaling", ZY_ATTN_CCA, ZY_ROUTER_MLP, ZY_MOE_SKIP, 1, 4, 2, 0, 0},
    {"everything-else", ZY_ATTN_MHA, ZY_ROUTER_LINEAR, ZY_MOE_NOSKIP, 1, 4, 1, 0, 0},
    /* sliding windows (transformers checks ZAYA1's in the oracle; these also cover the MHA variant) */
    {"zaya1-sliding", ZY_ATTN_CCA, ZY_ROUTER_MLP, ZY_MOE_SKIP, 0, 4, 2, 3, 1},
    {"gqa-sliding", ZY_ATTN_MHA, ZY_ROUTER_MLP, ZY_MOE_SKIP, 0, 4, 2, 5, 3},
};

static ZayaConfig variant_config(const Variant *v) {
    ZayaConfig c = {.vocab_size = 53, .hidden_size = 16, .num_layers = 2, .num_heads = v->Hq,
                    .num_kv_heads = v->Hkv, .head_dim = 8, .num_experts = 3, .moe_intermediate_size = 12,
                    .router_hidden_size = 8, .cca_time0 = 2, .cca_time1 = 2, .rms_norm_eps = 1e-5f,
                    .tie_word_embeddings = 0, .max_position_embeddings = 64, .rope_theta = 10000.0f,
                    .partial_rotary_factor = 0.5f, .initializer_range = 0.02f, .bos_token_id = 1,
                    .eos_token_id = 2, .pad_token_id = 0, .attention = v->attention, .router = v->router,
                    .moe = v->moe, .no_residual_scaling = v->no_residual_scaling};
    if (v->sliding_mask) { /* a rotary dim and theta of their own, so a mix-up of the tables shows */
        c.sliding_window = v->window, c.rope_theta_sliding = 500.0f, c.partial_rotary_factor_sliding = 1.0f;
        for (int l = 0; l < c.num_layers; l++) cfg_set_layer_sliding(&c, l, v->sliding_mask >> l & 1);
    }
    return c;
}

/* Weights moved off their init (no term hides behind a 0 or a 1); routing confident, so that the finite-difference
 * steps below do not flip a top-1 choice. */
static void randomize(Model *m, uint64_t seed) {
    ZyRng rng;
    zy_rng_seed(&rng, seed);
    for (int i = 0; i < m->params.count; i++) {
        const ParamInfo *p = &m->params.info[i];
        float *x = m->params.data + p->offset;
        const double fan_in = (double)p->shape[p->ndim - 1];
        for (size_t j = 0; j < p->numel; j++) {
            const double g = zy_rng_normal(&rng), u = zy_rng_uniform(&rng);
            if (strstr(p->name, "balancing_biases"))
                x[j] = (float)(0.05 * g);
            else if (strstr(p->name, "qk_norm.temp"))
                x[j] = (float)(0.5 + 1.5 * u);
            else if (strstr(p->name, "conv_qk") && p->ndim == 3)
                x[j] = (float)(0.3 * g);
            else if (strstr(p->name, "out_proj") || strstr(p->name, "mlp.gate.weight"))
                x[j] = (float)(3.0 * g / sqrt(fan_in));
            else if (p->init == INIT_ONE)
                x[j] = (float)(0.5 + u);
            else if (p->init == INIT_ZERO)
                x[j] = (float)(0.1 * g);
            else
                x[j] = (float)(g / sqrt(fan_in));
        }
    }
}

static int make_variant(Model *m, const Variant *v, uint64_t seed, ZyErr *err) {
    ZayaConfig c = variant_config(v);
    if (model_create(m, &c, err)) return -1;
    randomize(m, seed);
    return 0;
}

TEST(variant_layouts_name_what_each_variant_has) {
    ZyErr err = {{0}};
    Model m;
    /* MHA / GQA: plain projections, no CCA tensors */
    REQUIRE(make_variant(&m, &variants[2], 1, &err) == 0);
    int q = params_find(&m.params, "model.layers.0.self_attn.q_proj.weight");
    int k = params_find(&m.params, "model.layers.1.self_attn.k_proj.weight");
    int v = params_find(&m.params, "model.layers.1.self_attn.v_proj.weight");
    REQUIRE(q >= 0 && k >= 0 && v >= 0);
    CHECK(m.params.info[q].shape[0] == 32 && m.params.info[q].shape[1] == 16);
    CHECK(m.params.info[k].shape[0] == 16 && m.params.info[v].shape[0] == 16); /* Hkv·dh */
    CHECK(params_find(&m.params, "model.layers.0.self_attn.qkv_proj.conv_qk_depthwise.weight") < 0);
    CHECK(params_find(&m.params, "model.layers.0.self_attn.qk_norm.temp") < 0);
    CHECK(params_find(&m.params, "model.layers.0.self_attn.o_proj.weight") >= 0);
    model_free(&m);
    /* linear router: one matrix over E + 1 classes on D, no router MLP or depth state */
    REQUIRE(make_variant(&m, &variants[3], 1, &err) == 0);
    int g = params_find(&m.params, "model.layers.1.mlp.gate.weight");
    REQUIRE(g >= 0);
    CHECK(m.params.info[g].shape[0] == 4 && m.params.info[g].shape[1] == 16 && m.params.info[g].kind == PARAM_MUON);
    CHECK(params_find(&m.params, "model.layers.1.mlp.gate.router_states_scale") < 0);
    CHECK(params_find(&m.params, "model.layers.0.mlp.gate.down_proj.weight") < 0);
    model_free(&m);
    /* noskip: E classes, biases start at 0 */
    REQUIRE(make_variant(&m, &variants[4], 1, &err) == 0);
    int o = params_find(&m.params, "model.layers.0.mlp.gate.router_mlp.out_proj.weight");
    int b = params_find(&m.params, "model.layers.0.mlp.gate.balancing_biases");
    REQUIRE(o >= 0 && b >= 0);
    CHECK(m.params.info[o].shape[0] == 3 && m.params.info[b].numel == 3);
    model_init_weights(&m, 5);
    for (int e = 0; e < 3; e++) CHECK(m.w.layers[0].balancing_bias[e] == 0.0f);
    model_free(&m);
    /* dense: one SwiGLU MLP, no router, no biases */
    REQUIRE(make_variant(&m, &variants[6], 1, &err) == 0);
    int gu = params_find(&m.params, "model.layers.0.mlp.gate_up_proj.weight");
    int dn = params_find(&m.params, "model.layers.0.mlp.down_proj.weight");
    REQUIRE(gu >= 0 && dn >= 0);
    CHECK(m.params.info[gu].ndim == 2 && m.params.info[gu].shape[0] == 24 && m.params.info[dn].shape[1] == 12);
    CHECK(params_find(&m.params, "model.layers.0.mlp.gate.balancing_biases") < 0);
    CHECK(params_find(&m.params, "model.layers.0.mlp.experts.gate_up_proj") < 0);
    CHECK(m.w.layers[0].balancing_bias == NULL);
    model_free(&m);
    /* no residual scaling: none of the eight residual tensors per layer */
    REQUIRE(make_variant(&m, &variants[7], 1, &err) == 0);
    for (int i = 0; i < m.params.count; i++) CHECK(strstr(m.params.info[i].name, "residual_scale") == NULL);
    model_free(&m);
}

TEST(variant_parameter_counts_follow_the_layout) {
    ZyErr err = {{0}};
    ModelStats base, dense, mha, lin;
    ZayaConfig c = variant_config(&variants[0]);
    REQUIRE(model_stats_of(&base, &c, 32, &err) == 0);
    c = variant_config(&variants[6]);
    REQUIRE(model_stats_of(&dense, &c, 32, &err) == 0);
    c = variant_config(&variants[1]);
    REQUIRE(model_stats_of(&mha, &c, 32, &err) == 0);
    c = variant_config(&variants[3]);
    REQUIRE(model_stats_of(&lin, &c, 32, &err) == 0);
    const int64_t D = 16, I = 12, E = 3, L = 2, V = 53, R = 8;
    const int64_t expert = 3 * I * D; /* gate_up + down of one expert */
    /* every trained tensor of the model it builds, summed: the counts agree with the live table */
    Model m;
    REQUIRE(make_variant(&m, &variants[0], 1, &err) == 0);
    CHECK(base.total == (int64_t)params_count(&m.params, 1));
    model_free(&m);
    CHECK(base.embedding == 2 * V * D); /* untied */
    CHECK(base.total - base.active == L * (E - 1) * expert);
    CHECK(dense.total == dense.active);
    /* dense = ZAYA1 without the router (MLP: down R·D + b, γ at l>0, norm, 2 fc, out (E+1)·R) and E-1 experts */
    const int64_t router = R * D + R + R + 2 * (R * R + R) + (E + 1) * R;
    CHECK(base.total - dense.total == L * (router + (E - 1) * expert) + (L - 1) * R);
    CHECK(lin.total == base.total - L * router - (L - 1) * R + L * (E + 1) * D);
    CHECK(base.kv_bytes_per_token == 2 * L * 2 * 8 * 2 && mha.kv_bytes_per_token == 2 * L * 4 * 8 * 2);
    CHECK(dense.train_flops_per_token < base.train_flops_per_token);
}

/* Loss at the model's current weights; the routing choices of every layer land in route (if given). */
static double loss_of(Model *m, Activations *a, const int32_t *tok, const int32_t *tgt, int32_t *route) {
    model_forward(m, a, tok);
    const int N = a->B * a->T;
    if (route)
        for (int l = 0; l < m->cfg.num_layers; l++) memcpy(route + (long)l * N, a->layers[l].choice, N * sizeof *route);
    return model_loss(m, a, tgt);
}

/* The smallest gap between a token's chosen class and the runner-up (probability + balancing bias) over all
 * layers of the last forward: top-1 routing is a step function, so finite differences need margins. */
static double routing_margin(const Model *m, const Activations *a) {
    const int K = cfg_router_classes(&m->cfg), N = a->B * a->T;
    double margin = INFINITY;
    for (int l = 0; K && l < m->cfg.num_layers; l++)
        for (int r = 0; r < N; r++) {
            const float *p = a->layers[l].router_probs + (long)r * K, *b = m->w.layers[l].balancing_bias;
            const int c = a->layers[l].choice[r];
            for (int e = 0; e < K; e++)
                if (e != c) margin = fmin(margin, (double)(p[c] + b[c]) - (p[e] + b[e]));
        }
    return margin;
}

/* Every trained tensor's gradient against a central difference along a random direction of that tensor:
 * dL/dε of L(w + εv) vs Σ g·v. The forward is fp32, so a step too small drowns in rounding and one too large in
 * curvature; each tensor gets six steps (and their Richardson extrapolations) and must agree to 2% (of the larger of the two, or of 1e-3 for the few
 * directional gradients smaller than that, where the loss's fp32 rounding is the limit) at one of them, with no top-1
 * choice flipped by the step. A wrong or missing gradient term is off by far more at every step. */
TEST(variant_gradients_match_finite_differences) {
    const int B = 2, T = 12, N = B * T;
    for (size_t vi = 0; vi < ZY_ARRAY_LEN(variants); vi++) {
        ZyErr err = {{0}};
        Model m;
        Activations a;
        int32_t tok[24], tgt[24];
        ZyRng rng;
        zy_rng_seed(&rng, 7 + vi);
        for (int i = 0; i < N; i++) tok[i] = 3 + (int32_t)(zy_rng_next(&rng) % 50);
        make_next_token_targets(tgt, tok, B, T);
        /* the first weights (by seed) whose routing decisions are all at least 2e-3 from a tie */
        int tries = 0;
        for (;; tries++) {
            REQUIRE(tries < 50);
            REQUIRE(make_variant(&m, &variants[vi], 40 + vi + 1000 * (uint64_t)tries, &err) == 0);
            REQUIRE(acts_create(&a, &m.cfg, B, T, &err) == 0);
            model_forward(&m, &a, tok);
            if (routing_margin(&m, &a) >= 2e-3) break;
            acts_free(&a);
            model_free(&m);
        }
        const int L = m.cfg.num_layers;
        int32_t *route0 = malloc(sizeof(int32_t) * L * N), *route1 = malloc(sizeof(int32_t) * L * N);
        params_zero_grad(&m.params);
        loss_of(&m, &a, tok, tgt, route0);
        model_backward(&m, &a, tgt);
        int checked = 0, bad = 0;
        double worst = 0;
        for (int i = 0; i < m.params.count; i++) {
            const ParamInfo *p = &m.params.info[i];
            if (!param_trainable(p)) continue;
            float *w = m.params.data + p->offset, *gw = m.params.grad + p->offset;
            float *w0 = malloc(sizeof(float) * p->numel), *dir = malloc(sizeof(float) * p->numel);
            memcpy(w0, w, sizeof(float) * p->numel);
            double analytic = 0, wn = 0;
            for (size_t j = 0; j < p->numel; j++) {
                dir[j] = (float)zy_rng_normal(&rng);
                analytic += (double)gw[j] * dir[j];
                wn += (double)w0[j] * w0[j];
            }
            const double wrms = fmax(sqrt(wn / p->numel), 0.1);
            double best = INFINITY, best_fd = 0;
            /* steps halving from 4% of the tensor's scale; each difference and each Richardson extrapolation of
             * two neighbours ((4 fd(h/2) - fd(h)) / 3, which cancels the h² curvature term) is a candidate */
            double prev_fd = NAN;
            for (int s = 0; s < 6; s++) {
                const double eps = wrms * 4e-2 / (double)(1 << s);
                int flipped = 0;
                for (size_t j = 0; j < p->numel; j++) w[j] = (float)(w0[j] + eps * dir[j]);
                const double lp = loss_of(&m, &a, tok, tgt, route1);
                flipped |= memcmp(route0, route1, sizeof(int32_t) * L * N) != 0;
                for (size_t j = 0; j < p->numel; j++) w[j] = (float)(w0[j] - eps * dir[j]);
                const double lm = loss_of(&m, &a, tok, tgt, route1);
                flipped |= memcmp(route0, route1, sizeof(int32_t) * L * N) != 0;
                if (flipped) {
                    prev_fd = NAN;
                    continue;
                }
                const double fd = (lp - lm) / (2 * eps), cand[2] = {fd, (4 * fd - prev_fd) / 3};
                for (int k = 0; k < 2; k++) {
                    const double rel = fabs(cand[k] - analytic) / fmax(fmax(fabs(cand[k]), fabs(analytic)), 1e-3);
                    if (rel < best) best = rel, best_fd = cand[k]; /* a NaN candidate never wins */
                }
                prev_fd = fd;
            }
            memcpy(w, w0, sizeof(float) * p->numel);
            checked++;
            if (!(best < 2e-2)) {
                bad++;
                fprintf(stderr, "    %s: %s: directional gradient %.6g vs finite difference %.6g (rel %.3g)\n",
                        variants[vi].name, p->name, analytic, best_fd, best);
            } else if (best > worst) {
                worst = best;
            }
            free(w0);
            free(dir);
        }
        printf("    %-20s %3d tensors, worst relative disagreement %.2g\n", variants[vi].name, checked, worst);
        CHECK_MSG(bad == 0, "%s: %d tensors' gradients disagree", variants[vi].name, bad);
        free(route0);
        free(route1);
        acts_free(&a);
        model_free(&m);
    }
}

TEST(variant_decoding_matches_the_full_forward) {
    const int B = 2, T = 19;
    for (size_t vi = 0; vi < ZY_ARRAY_LEN(variants); vi++) {
        ZyErr err = {{0}};
        Model m;
        REQUIRE(make_variant(&m, &variants[vi], 70 + vi, &err) == 0);
        const int V = m.cfg.vocab_size, L = m.cfg.num_layers;
        int32_t tok[38];
        ZyRng rng;
        zy_rng_seed(&rng, 90 + vi);
        for (int i = 0; i < B * T; i++) tok[i] = (int32_t)(zy_rng_next(&rng) % V);
        Activations a;
        REQUIRE(acts_create(&a, &m.cfg, B, T, &err) == 0);
        model_forward(&m, &a, tok);
        KVCache c;
        REQUIRE(kvcache_create(&c, &m.cfg, B, T, &err) == 0);
        float *lg = malloc(sizeof(float) * B * T * V);
        int32_t *route = malloc(sizeof(int32_t) * L * B * T), piece[2 * 19];
        double worst = 0;
        int mismatched = 0;
        /* a prefill of 7 tokens, then one at a time */
        for (int t0 = 0; t0 < T;) {
            const int n = t0 == 0 ? 7 : 1;
            for (int b = 0; b < B; b++) memcpy(piece + b * n, tok + b * T + t0, sizeof(int32_t) * n);
            REQUIRE(model_decode_ex(&m, &c, piece, n, lg, 0, route, &err) == 0);
            for (int b = 0; b < B; b++)
                for (int t = 0; t < n; t++) {
                    const float *x = lg + ((long)b * n + t) * V, *ref = a.logits + ((long)b * T + t0 + t) * V;
                    double d = 0, r = 0;
                    for (int i = 0; i < V; i++) d += (x[i] - ref[i]) * (double)(x[i] - ref[i]), r += ref[i] * (double)ref[i];
                    worst = fmax(worst, sqrt(d / r));
                    for (int l = 0; l < L; l++)
                        mismatched += route[((long)l * B + b) * n + t] != a.layers[l].choice[(long)b * T + t0 + t];
                }
            t0 += n;
        }
        CHECK_MSG(worst < 1e-5, "%s: decode vs forward rel err %.3g", variants[vi].name, worst);
        CHECK_MSG(mismatched == 0, "%s: %d routing decisions differ", variants[vi].name, mismatched);
        free(lg);
        free(route);
        kvcache_free(&c);
        acts_free(&a);
        model_free(&m);
    }
}

/* Copies every tensor of src that dst also has (same name and size). */
static void copy_shared(Model *dst, const Model *src) {
    for (int i = 0; i < dst->params.count; i++) {
        const ParamInfo *p = &dst->params.info[i];
        int j = params_find(&src->params, p->name);
        if (j >= 0 && src->params.info[j].numel == p->numel)
            memcpy(dst->params.data + p->offset, src->params.data + src->params.info[j].offset, p->numel * sizeof(float));
    }
}

TEST(variants_reduce_to_zaya1_where_they_only_take_something_out) {
    ZyErr err = {{0}};
    const int B = 1, T = 16;
    int32_t tok[16];
    for (int i = 0; i < T; i++) tok[i] = (int32_t)((i * 7 + 3) % 53);
    /* no residual scaling == ZAYA1 with every residual scale 1 and bias 0 (plain adds), bit for bit */
    Model z, v;
    REQUIRE(make_variant(&z, &variants[0], 3, &err) == 0);
    REQUIRE(make_variant(&v, &variants[7], 4, &err) == 0);
    for (int i = 0; i < z.params.count; i++) {
        const ParamInfo *p = &z.params.info[i];
        if (strstr(p->name, "residual_scale"))
            for (size_t j = 0; j < p->numel; j++)
                z.params.data[p->offset + j] = strstr(p->name, "_scale") && !strstr(p->name, "bias") ? 1.0f : 0.0f;
    }
    copy_shared(&v, &z);
    Activations az, av;
    REQUIRE(acts_create(&az, &z.cfg, B, T, &err) == 0 && acts_create(&av, &v.cfg, B, T, &err) == 0);
    model_forward(&z, &az, tok);
    model_forward(&v, &av, tok);
    CHECK(memcmp(az.logits, av.logits, sizeof(float) * T * 53) == 0);
    acts_free(&av);
    model_free(&v);
    /* the linear router's logits are u Wᵀ on the MoE input */
    REQUIRE(make_variant(&v, &variants[3], 5, &err) == 0);
    REQUIRE(acts_create(&av, &v.cfg, B, T, &err) == 0);
    model_forward(&v, &av, tok);
    double worst = 0;
    for (int l = 0; l < 2; l++)
        for (int r = 0; r < T; r++)
            for (int k = 0; k < 4; k++) {
                double ref = 0;
                for (int i = 0; i < 16; i++)
                    ref += (double)av.layers[l].u_mlp[r * 16 + i] * v.w.layers[l].router_w[k * 16 + i];
                worst = fmax(worst, fabs(ref - av.layers[l].router_logits[r * 4 + k]));
            }
    CHECK_MSG(worst < 1e-5, "linear router logits off by %.3g", worst);
    acts_free(&av);
    acts_free(&az);
    model_free(&v);
    model_free(&z);
}

/* A sliding layer whose RoPE equals the full layers' differs from full attention only through the window: with W >= T
 * the models are the same bit for bit (logits and every gradient), and with W < T the logits of the first W positions
 * (which see their whole past either way) agree to rounding (the experts' grouped products see other rows, routed
 * differently), while later ones differ. CCA and the MHA variant. */
TEST(sliding_layers_reduce_to_full_attention_inside_the_window) {
    const int B = 2, T = 70, N = B * T;
    for (int vi = 9; vi <= 10; vi++) {
        ZyErr err = {{0}};
        Variant full = variants[vi];
        full.sliding_mask = 0;
        Model f, s;
        REQUIRE(make_variant(&f, &full, 31, &err) == 0);
        int32_t tok[140], tgt[140];
        for (int i = 0; i < N; i++) tok[i] = (int32_t)((i * 13 + 5) % 53);
        make_next_token_targets(tgt, tok, B, T);
        Activations af, as;
        REQUIRE(acts_create(&af, &f.cfg, B, T, &err) == 0);
        model_forward(&f, &af, tok);
        params_zero_grad(&f.params);
        model_backward(&f, &af, tgt);
        const int V = f.cfg.vocab_size;
        for (int w = 0; w < 2; w++) {
            const int W = w ? 20 : T;
            ZayaConfig c = f.cfg;
            c.sliding_window = W, c.rope_theta_sliding = c.rope_theta;
            c.partial_rotary_factor_sliding = c.partial_rotary_factor;
            cfg_set_layer_sliding(&c, 0, 1), cfg_set_layer_sliding(&c, 1, 1);
            REQUIRE(model_create(&s, &c, &err) == 0);
            memcpy(s.params.data, f.params.data, f.params.total * sizeof(float));
            REQUIRE(acts_create(&as, &s.cfg, B, T, &err) == 0);
            model_forward(&s, &as, tok);
            params_zero_grad(&s.params);
            model_backward(&s, &as, tgt);
            if (W >= T) {
                CHECK_MSG(!memcmp(as.logits, af.logits, sizeof(float) * N * V), "%s: W = T logits differ from full "
                          "attention", variants[vi].name);
                CHECK_MSG(!memcmp(s.params.grad, f.params.grad, f.params.total * sizeof(float)),
                          "%s: W = T gradients differ from full attention", variants[vi].name);
            } else {
                double early = 0, late = INFINITY;
                for (int b = 0; b < B; b++)
                    for (int t = 0; t < T; t++) {
                        const float *x = as.logits + ((long)b * T + t) * V, *y = af.logits + ((long)b * T + t) * V;
                        double d = 0, r = 0;
                        for (int i = 0; i < V; i++) d += (x[i] - y[i]) * (double)(x[i] - y[i]), r += (double)y[i] * y[i];
                        const double e = sqrt(d / r);
                        if (t < W) early = fmax(early, e);
                        else late = fmin(late, e);
                    }
                CHECK_MSG(early < 1e-5, "%s: logits of positions < W differ from full attention by %.3g",
                          variants[vi].name, early);
                CHECK_MSG(late > 1e-4, "%s: a later position differs by only %.3g", variants[vi].name, late);
            }
            acts_free(&as);
            model_free(&s);
        }
        acts_free(&af);
        model_free(&f);
    }
}
