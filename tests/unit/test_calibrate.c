/* Activation-aware quantization (src/infer/calibrate.c, zaya quantize --calibration): the importance it gathers is
 * each matrix input's squared columns (checked against a forward run here for the head, o_proj and one expert; the
 * Gram matrices' diagonals for GPTQ), and q4 weights fitted with it reproduce the unquantized model's logits more
 * closely than weights fitted without it — and GPTQ's more closely still — on a model whose normalised activations
 * have outlier channels (as trained models' do). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "infer/calibrate.h"
#include "io/model_io.h"
#include "io/quant_io.h"
#include "io/shards.h"
#include "model/model.h"
#include "test.h"

enum { V = 96, D = 64, SEQ = 32, CALIB_TOKENS = 8 * SEQ };

/* A model whose RMSNorm weights have outlier channels: every 8th column 8x, so its inputs' squares vary 64x. */
static int make_model(Model *m, ZyErr *err) {
    ZayaConfig c = {.vocab_size = V, .hidden_size = D, .num_layers = 2, .num_heads = 4, .num_kv_heads = 2,
                    .head_dim = 16, .num_experts = 3, .moe_intermediate_size = 64, .router_hidden_size = 64,
                    .cca_time0 = 2, .cca_time1 = 2, .rms_norm_eps = 1e-5f, .tie_word_embeddings = 1,
                    .max_position_embeddings = 64, .rope_theta = 10000.0f, .partial_rotary_factor = 0.5f,
                    .initializer_range = 0.02f, .bos_token_id = 1, .eos_token_id = 2, .pad_token_id = 0};
    if (model_create(m, &c, err)) return -1;
    model_init_weights(m, 4242);
    for (int i = 0; i < m->params.count; i++) {
        const ParamInfo *p = &m->params.info[i];
        if (!strstr(p->name, "layernorm") && strcmp(p->name, "model.norm.weight")) continue;
        for (size_t j = 0; j < p->numel; j++) m->params.data[p->offset + j] = j % 8 == 5 ? 8.0f : 1.0f;
    }
    return 0;
}

static int write_tokens(const char *dir, int n, uint64_t seed, ZyErr *err) {
    ShardWriterOptions o = {V, 0, 0, NULL, 0};
    ShardWriter *w;
    if (shardwriter_open(&w, dir, &o, err)) return -1;
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)n);
    ZyRng r;
    zy_rng_seed(&r, seed);
    for (int i = 0; i < n; i++) tok[i] = (int32_t)(zy_rng_next(&r) % V);
    int rc = shardwriter_add_document(w, SHARD_TRAIN, tok, (size_t)n, err) || shardwriter_finish(w, err);
    shardwriter_close(w);
    free(tok);
    return rc ? -1 : 0;
}

static int index_of(const Model *m, const char *name) {
    for (int i = 0; i < m->params.count; i++)
        if (!strcmp(m->params.info[i].name, name)) return i;
    return -1;
}

/* The calibration's sums, recomputed from forwards over the same windows (all the windows: CALIB_TOKENS fill the
 * train split exactly, so the windows are its consecutive pieces). */
static void check_importance(int *zy_test_failed_, Model *m, const QuantImportance *imp) {
    ZyErr err = {{0}};
    Activations a;
    REQUIRE(acts_create(&a, &m->cfg, 1, SEQ, &err) == 0);
    static double head[D], o_proj[D], expert1[D];
    int32_t tok[SEQ];
    ZyRng r;
    zy_rng_seed(&r, 99);
    int32_t all[CALIB_TOKENS];
    for (int i = 0; i < CALIB_TOKENS; i++) all[i] = (int32_t)(zy_rng_next(&r) % V);
    for (int w = 0; w < CALIB_TOKENS / SEQ; w++) {
        memcpy(tok, all + w * SEQ, sizeof tok);
        model_forward(m, &a, tok);
        const LayerActs *L = &a.layers[1];
        for (int n = 0; n < SEQ; n++)
            for (int j = 0; j < D; j++) {
                head[j] += (double)a.final_normed[n * D + j] * a.final_normed[n * D + j];
                o_proj[j] += (double)L->attn_out[n * D + j] * L->attn_out[n * D + j];
            }
        for (int k = L->expert_offset[1]; k < L->expert_offset[2]; k++)
            for (int j = 0; j < D; j++) expert1[j] += (double)L->expert_in[k * D + j] * L->expert_in[k * D + j];
    }
    acts_free(&a);
    const struct {
        const char *name;
        const double *sums;
        int block;
    } want[] = {{"model.embed_tokens.weight", head, 0},
                {"model.layers.1.self_attn.o_proj.weight", o_proj, 0},
                {"model.layers.1.mlp.experts.gate_up_proj", expert1, 1}};
    for (size_t k = 0; k < ZY_ARRAY_LEN(want); k++) {
        const int i = index_of(m, want[k].name);
        REQUIRE(i >= 0 && imp->of_tensor[i]);
        const float *got = imp->of_tensor[i] + (size_t)want[k].block * D;
        double mean = 0, worst = 0;
        for (int j = 0; j < D; j++) mean += want[k].sums[j] / D;
        for (int j = 0; j < D; j++) {
            const double e = want[k].sums[j] + QUANT_IMPORTANCE_FLOOR * mean;
            const double rel = fabs(got[j] - e) / e;
            worst = rel > worst ? rel : worst;
        }
        CHECK_MSG(mean > 0 && worst < 1e-4, "%s: importance off by %.3g (relative)", want[k].name, worst);
    }
    /* the outlier channels weigh ~64x the others at the head's input */
    const float *h = imp->of_tensor[index_of(m, "model.embed_tokens.weight")];
    CHECK(h[5] > 20 * h[4] && h[13] > 20 * h[12]);
}

/* Relative RMS error of the logits of q against m's over one window of held-out tokens. */
static double logit_error(Model *m, Model *q) {
    ZyErr err = {{0}};
    Activations a, b;
    if (acts_create(&a, &m->cfg, 1, SEQ, &err) || acts_create(&b, &q->cfg, 1, SEQ, &err)) return INFINITY;
    int32_t tok[SEQ];
    ZyRng r;
    zy_rng_seed(&r, 1234);
    for (int i = 0; i < SEQ; i++) tok[i] = (int32_t)(zy_rng_next(&r) % V);
    model_forward(m, &a, tok);
    model_forward(q, &b, tok);
    double num = 0, den = 0;
    for (int i = 0; i < SEQ * V; i++) num += (a.logits[i] - b.logits[i]) * (double)(a.logits[i] - b.logits[i]),
                                      den += (double)a.logits[i] * a.logits[i];
    acts_free(&a), acts_free(&b);
    return sqrt(num / den);
}

TEST(calibrate_importance_and_calibrated_q4_is_closer) {
    ZyErr err = {{0}};
    char dir[64], mdir[80], ddir[80], q_plain[80], q_cal[80], q_gptq[80];
    REQUIRE(zy_test_tmpdir(dir, sizeof dir, "calib") == 0);
    snprintf(mdir, sizeof mdir, "%s/model", dir), snprintf(ddir, sizeof ddir, "%s/data", dir);
    snprintf(q_plain, sizeof q_plain, "%s/q4", dir), snprintf(q_cal, sizeof q_cal, "%s/q4cal", dir);
    snprintf(q_gptq, sizeof q_gptq, "%s/q4gptq", dir);
    REQUIRE(zy_mkdirs(ddir, &err) == 0);
    Model m, q1, q2, q3;
    REQUIRE(make_model(&m, &err) == 0);
    REQUIRE(model_save_dir(&m, mdir, ZY_DT_F32, &err) == 0);
    REQUIRE(write_tokens(ddir, CALIB_TOKENS, 99, &err) == 0);

    ShardSet *data;
    REQUIRE(shardset_open(&data, ddir, "train", 1, &err) == 0);
    QuantImportance imp;
    CalibrationReport rep;
    CHECK_MSG(calibrate_importance(&m, data, SEQ, CALIB_TOKENS, 0, &imp, &rep, &err) == 0, "%s", err.msg);
    CHECK(rep.windows == CALIB_TOKENS / SEQ && rep.tokens == CALIB_TOKENS && imp.count == m.params.count);
    check_importance(zy_test_failed_, &m, &imp);
    /* bad input: a window longer than the model's positions */
    QuantImportance none;
    CHECK(calibrate_importance(&m, data, 65, CALIB_TOKENS, 0, &none, &rep, &err) != 0 && strstr(err.msg, "65"));
    /* with Gram matrices (--method gptq): the same importance, and diag Σ x xᵀ = the sums it was floored from */
    QuantImportance full;
    CHECK_MSG(calibrate_importance(&m, data, SEQ, CALIB_TOKENS, 1, &full, &rep, &err) == 0, "%s", err.msg);
    shardset_close(data);
    {
        const int i = index_of(&m, "model.layers.1.self_attn.o_proj.weight");
        REQUIRE(full.gram && full.gram[i]);
        double mean = 0, worst = 0;
        for (int j = 0; j < D; j++) mean += full.gram[i][j * D + j] / D;
        for (int j = 0; j < D; j++) {
            const double e = full.gram[i][j * D + j] + QUANT_IMPORTANCE_FLOOR * mean;
            worst = fmax(worst, fabs(full.of_tensor[i][j] - e) / e + fabs(full.of_tensor[i][j] - imp.of_tensor[i][j]));
            for (int k = 0; k < D; k++) worst = fmax(worst, fabs(full.gram[i][j * D + k] - full.gram[i][k * D + j]));
        }
        CHECK_MSG(worst < 1e-4, "Gram diagonal / symmetry off by %.3g", worst);
    }

    QuantPlan plan;
    QuantizeReport qr;
    REQUIRE(quant_plan_make(&plan, 4, 32, 4, NULL, &err) == 0);
    plan.method = ZY_QUANT_MSE;
    CHECK_MSG(quant_model_dir(mdir, q_plain, &plan, NULL, 0, &qr, &err) == 0, "%s", err.msg);
    CHECK_MSG(quant_model_dir(mdir, q_cal, &plan, &imp, 0, &qr, &err) == 0, "%s", err.msg);
    plan.method = ZY_QUANT_MLX; /* the importance weights only mse's and gptq's fits */
    CHECK(quant_model_dir(mdir, q_cal, &plan, &imp, 0, &qr, &err) != 0 && strstr(err.msg, "mlx"));
    plan.method = ZY_QUANT_GPTQ; /* GPTQ needs the Gram matrices */
    CHECK(quant_model_dir(mdir, q_gptq, &plan, &imp, 0, &qr, &err) != 0 && strstr(err.msg, "gptq"));
    CHECK_MSG(quant_model_dir(mdir, q_gptq, &plan, &full, 0, &qr, &err) == 0, "%s", err.msg);
    quant_importance_free(&imp);
    quant_importance_free(&full);
    REQUIRE(model_load_dir_as(&q1, q_plain, MODEL_DTYPE_Q4, &err) == 0);
    REQUIRE(model_load_dir_as(&q2, q_cal, MODEL_DTYPE_Q4, &err) == 0);
    REQUIRE(model_load_dir_as(&q3, q_gptq, MODEL_DTYPE_Q4, &err) == 0);
    const double e_plain = logit_error(&m, &q1), e_cal = logit_error(&m, &q2), e_gptq = logit_error(&m, &q3);
    printf("    q4 g32 logits, relative RMS error vs fp32: uncalibrated mse %.4g, calibrated mse %.4g, gptq %.4g\n",
           e_plain, e_cal, e_gptq);
    CHECK(e_cal < 0.85 * e_plain);
    CHECK(e_gptq < e_cal);
    model_free(&q1), model_free(&q2), model_free(&q3), model_free(&m);
}
