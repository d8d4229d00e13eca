/* Which matrices zaya quantize gives which format (src/io/quant_plan.c): the classes by tensor name, the default plan
 * (at 4 bits the router at 8 bits in groups of 64, as mlx-lm's quant_predicate keeps MoE gates), --router-bits and
 * --keep-float, their errors; and a folder written with a plan: config.json's per-module entries and each matrix read
 * back in place in its own format. mlx's reading of such a folder is tests/oracle/test_quant_mlx.py. */
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "io/model_io.h"
#include "io/quant_io.h"
#include "io/quant_plan.h"
#include "model/model.h"
#include "test.h"

TEST(quant_plan_classes_by_tensor_name) {
    CHECK(quant_class_of("model.layers.3.self_attn.qkv_proj.q_proj.weight") == QUANT_CLASS_ATTENTION);
    CHECK(quant_class_of("model.layers.3.self_attn.o_proj.weight") == QUANT_CLASS_ATTENTION);
    CHECK(quant_class_of("model.layers.0.mlp.gate.down_proj.weight") == QUANT_CLASS_ROUTER);
    CHECK(quant_class_of("model.layers.0.mlp.gate.router_mlp.out_proj.weight") == QUANT_CLASS_ROUTER);
    CHECK(quant_class_of("model.layers.0.mlp.gate.weight") == QUANT_CLASS_ROUTER); /* linear-router variant */
    CHECK(quant_class_of("model.layers.0.mlp.experts.gate_up_proj") == QUANT_CLASS_EXPERTS);
    CHECK(quant_class_of("model.layers.0.mlp.gate_up_proj.weight") == QUANT_CLASS_EXPERTS); /* dense MLP, not the gate */
    CHECK(quant_class_of("model.embed_tokens.weight") == QUANT_CLASS_EMBEDDING);
    CHECK(quant_class_of("lm_head.weight") == QUANT_CLASS_EMBEDDING);
}

TEST(quant_plan_default_keeps_the_router_at_8_bits_at_4) {
    ZyErr err = {{0}};
    QuantPlan p;
    char text[256];
    REQUIRE(quant_plan_make(&p, 4, 32, QUANT_ROUTER_BITS, NULL, &err) == 0);
    CHECK(p.defaults.bits == 4 && p.defaults.group_size == 32);
    CHECK(p.of_class[QUANT_CLASS_ROUTER].bits == 8 && p.of_class[QUANT_CLASS_ROUTER].group_size == 64);
    CHECK(p.of_class[QUANT_CLASS_EXPERTS].bits == 4 && p.of_class[QUANT_CLASS_EXPERTS].group_size == 32);
    CHECK(p.of_class[QUANT_CLASS_EMBEDDING].bits == 4 && p.of_class[QUANT_CLASS_ATTENTION].bits == 4);
    QuantFormat f = quant_plan_format(&p, "model.layers.1.mlp.gate.router_mlp.fc2.weight", 256);
    CHECK(f.bits == 8 && f.group_size == 64);
    /* a router 32 wide: 8 bits in the folder's groups of 32 (64 does not divide it) */
    f = quant_plan_format(&p, "model.layers.1.mlp.gate.router_mlp.fc2.weight", 32);
    CHECK(f.bits == 8 && f.group_size == 32);
    f = quant_plan_format(&p, "model.layers.1.self_attn.o_proj.weight", 96);
    CHECK(f.bits == 4 && f.group_size == 32);
    quant_plan_describe(&p, text, sizeof text);
    CHECK_MSG(strcmp(text, "router 8-bit in groups of 64") == 0, "%s", text);
    /* 8 bits: the router is like the rest, in the folder's groups */
    REQUIRE(quant_plan_make(&p, 8, 128, QUANT_ROUTER_BITS, "", &err) == 0);
    for (int c = 0; c < QUANT_CLASS_COUNT; c++) CHECK(p.of_class[c].bits == 8 && p.of_class[c].group_size == 128);
    quant_plan_describe(&p, text, sizeof text);
    CHECK(text[0] == '\0');
    /* --router-bits 4: all 4-bit */
    REQUIRE(quant_plan_make(&p, 4, 64, 4, NULL, &err) == 0);
    CHECK(p.of_class[QUANT_CLASS_ROUTER].bits == 4 && p.of_class[QUANT_CLASS_ROUTER].group_size == 64);
    /* --keep-float */
    REQUIRE(quant_plan_make(&p, 4, 64, 8, "embedding,attention", &err) == 0);
    CHECK(p.of_class[QUANT_CLASS_EMBEDDING].bits == 0 && p.of_class[QUANT_CLASS_ATTENTION].bits == 0);
    CHECK(p.of_class[QUANT_CLASS_EXPERTS].bits == 4 && p.of_class[QUANT_CLASS_ROUTER].bits == 8);
    quant_plan_describe(&p, text, sizeof text);
    CHECK_MSG(strcmp(text, "attention unquantized, router 8-bit in groups of 64, embedding unquantized") == 0, "%s", text);
}

TEST(quant_plan_bad_options_are_named) {
    ZyErr err = {{0}};
    QuantPlan p;
    CHECK_MSG(quant_plan_make(&p, 4, 64, 3, NULL, &err) != 0 && strstr(err.msg, "--router-bits 3"), "%s", err.msg);
    CHECK_MSG(quant_plan_make(&p, 4, 64, 8, "experts,mlp", &err) != 0 && strstr(err.msg, "--keep-float") &&
                  strstr(err.msg, "\"mlp\" is not a class") && strstr(err.msg, "attention, router"), "%s", err.msg);
    CHECK_MSG(quant_plan_make(&p, 3, 64, 8, NULL, &err) != 0 && strstr(err.msg, "3-bit"), "%s", err.msg);
    CHECK_MSG(quant_plan_make(&p, 4, 48, 8, NULL, &err) != 0 && strstr(err.msg, "group size 48"), "%s", err.msg);
}

/* The per-module entry config.json has for base (NULL: none). */
static const cJSON *module_entry(const cJSON *root, const char *base) {
    return cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(root, "quantization"), base);
}

TEST(quant_plan_folder_has_per_module_entries_read_in_place) {
    ZyErr err = {{0}};
    char dir[64], qdir[80], path[128];
    REQUIRE(zy_test_tmpdir(dir, sizeof dir, "qplan") == 0);
    snprintf(qdir, sizeof qdir, "%s/q", dir);
    ZayaConfig c = {.vocab_size = 64, .hidden_size = 128, .num_layers = 2, .num_heads = 4, .num_kv_heads = 2,
                    .head_dim = 32, .num_experts = 3, .moe_intermediate_size = 64, .router_hidden_size = 64,
                    .cca_time0 = 2, .cca_time1 = 2, .rms_norm_eps = 1e-5f, .tie_word_embeddings = 1,
                    .max_position_embeddings = 64, .rope_theta = 10000.0f, .partial_rotary_factor = 0.5f,
                    .initializer_range = 0.02f, .bos_token_id = 1, .eos_token_id = 2, .pad_token_id = 0};
    Model src, q;
    REQUIRE(model_create(&src, &c, &err) == 0);
    model_init_weights(&src, 3);
    REQUIRE(model_save_dir(&src, dir, ZY_DT_F32, &err) == 0);
    for (int keep = 0; keep < 2; keep++) {
        QuantPlan plan;
        QuantizeReport rep;
        REQUIRE(quant_plan_make(&plan, 4, 32, QUANT_ROUTER_BITS, keep ? "embedding" : NULL, &err) == 0);
        CHECK_MSG(quant_model_dir(dir, qdir, &plan, NULL, 0, &rep, &err) == 0, "%s", err.msg);
        if (*zy_test_failed_) break;
        char *text;
        size_t len;
        snprintf(path, sizeof path, "%s/config.json", qdir);
        REQUIRE(zy_read_file(path, &text, &len, &err) == 0);
        cJSON *root = cJSON_ParseWithLength(text, len);
        free(text);
        REQUIRE(root);
        const cJSON *r = module_entry(root, "model.layers.1.mlp.gate.router_mlp.fc1");
        CHECK(cJSON_IsObject(r) && cJSON_GetObjectItem(r, "bits")->valueint == 8 &&
              cJSON_GetObjectItem(r, "group_size")->valueint == 64);
        CHECK(cJSON_IsObject(module_entry(root, "model.layers.0.mlp.gate.down_proj")));
        CHECK(module_entry(root, "model.layers.0.self_attn.o_proj") == NULL); /* the default: no entry */
        CHECK(module_entry(root, "model.layers.0.mlp.experts.down_proj") == NULL);
        CHECK(keep ? cJSON_IsFalse(module_entry(root, "model.embed_tokens")) : !module_entry(root, "model.embed_tokens"));
        cJSON_Delete(root);
        CHECK_MSG(model_load_dir_as(&q, qdir, MODEL_DTYPE_Q4, &err) == 0, "%s", err.msg);
        if (*zy_test_failed_) break;
        for (int l = 0; l < c.num_layers; l++) {
            const LayerWeights *L = &q.w.layers[l];
            const ZyQuantMatrix *router[] = {&L->router_down_w_quant, &L->router_fc1_w_quant, &L->router_fc2_w_quant,
                                             &L->router_out_w_quant};
            for (int i = 0; i < 4; i++) CHECK(router[i]->q && router[i]->bits == 8 && router[i]->group_size == 64);
            CHECK(L->w_o_quant.q && L->w_o_quant.bits == 4 && L->w_o_quant.group_size == 32);
            CHECK(L->expert_down_quant.q && L->expert_down_quant.bits == 4);
        }
        CHECK(keep ? !q.w.embed_quant.q : q.w.embed_quant.q && q.w.embed_quant.bits == 4);
        model_free(&q);
        zy_test_rmtree(qdir);
    }
    model_free(&src);
    zy_test_rmtree(dir);
}
