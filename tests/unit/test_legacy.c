/* Legacy ZAYA1 checkpoints: a native model written out in the legacy layout (by the inverse of RELEASES.md's
 * mapping, spelled out here independently of src/model/legacy.c) loads back bit for bit; both legacy config schemas
 * (scalar, and ZAYA1-base's per-layer lists) read as the native config; unsupported settings are refused by name;
 * the old native router-norm alias loads. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/config.h"
#include "model/model.h"
#include "io/model_io.h"
#include "io/safetensors.h"
#include "test.h"

static const char *legacy_cfg_json =
    "{\"model_type\": \"zaya\", \"activation_func\": \"swiglu\", \"add_bias_linear\": false, \"cca\": true,"
    " \"ffn_hidden_size\": 24, \"gated_linear_unit\": true, \"hidden_size\": 16, \"head_dim\": 8, \"kv_channels\": 8,"
    " \"max_position_embeddings\": 64, \"moe_router_topk\": 1, \"norm_epsilon\": 1e-05, \"normalization\": \"RMSNorm\","
    " \"num_attention_heads\": 4, \"num_experts\": 3, \"num_hidden_layers\": 6, \"num_key_value_heads\": 2,"
    " \"num_query_groups\": 2, \"partial_rotary_factor\": 0.5, \"residual_in_fp32\": true, \"rope_scaling\": false,"
    " \"rope_theta\": 10000, \"scale_residual_merge\": true, \"sliding_window\": null, \"tie_word_embeddings\": %s,"
    " \"vocab_size\": 53, \"zaya_mlp_expansion\": 8, \"zaya_use_eda\": true, \"bos_token_id\": 2, \"eos_token_id\": 1,"
    " \"pad_token_id\": 0}";

/* The legacy name(s) of a native tensor: the inverse mapping. Returns the number of names (E for an expert stack,
 * written as "...local_experts.%d..." patterns with the expert filled in by the caller). */
static int legacy_name_of(const char *native, int L, char *out, size_t cap, int *per_expert) {
    int k;
    char rest[200];
    *per_expert = 0;
    if (!strcmp(native, "model.norm.weight")) return snprintf(out, cap, "model.final_norm.weight"), 1;
    if (!strncmp(native, "model.input_hidden_states_", 26))
        return snprintf(out, cap, "model.layers.0.res_scale.%s", native + 12), 1;
    if (sscanf(native, "model.layers.%d.%199s", &k, rest) != 2) return snprintf(out, cap, "%s", native), 1;
    static const struct {
        const char *native, *legacy;
        int moe_block;
    } map[] = {
        {"input_layernorm.", "input_norm.", 0},
        {"self_attn.qkv_proj.q_proj.", "self_attn.qkv.linear_q.", 0},
        {"self_attn.qkv_proj.k_proj.", "self_attn.qkv.linear_k.", 0},
        {"self_attn.qkv_proj.v_proj_current.", "self_attn.qkv.val_proj1.", 0},
        {"self_attn.qkv_proj.v_proj_delayed.", "self_attn.qkv.val_proj2.", 0},
        {"self_attn.qkv_proj.conv_qk_depthwise.", "self_attn.qkv.conv_qk.0.", 0},
        {"self_attn.qkv_proj.conv_qk_grouped.", "self_attn.qkv.conv_qk.1.", 0},
        {"self_attn.qk_norm.temp", "self_attn.qkv.temp", 0},
        {"self_attn.o_proj.", "self_attn.o_proj.", 0},
        {"post_attention_residual_scale.", "res_scale.", 1},
        {"post_attention_layernorm.", "input_norm.", 1},
        {"mlp.gate.router_mlp.norm.", "zaya_block.router.rmsnorm_eda.", 1},
        {"mlp.gate.router_mlp.fc1.", "zaya_block.router.router_mlp.0.", 1},
        {"mlp.gate.router_mlp.fc2.", "zaya_block.router.router_mlp.2.", 1},
        {"mlp.gate.router_mlp.out_proj.", "zaya_block.router.router_mlp.4.", 1},
        {"mlp.gate.", "zaya_block.router.", 1},
        {"mlp.experts.gate_up_proj", "zaya_block.experts.local_experts.%d.linear_fc1.weight", 1},
        {"mlp.experts.down_proj", "zaya_block.experts.local_experts.%d.linear_fc2.weight", 1},
    };
    if (!strncmp(rest, "post_mlp_residual_scale.", 24)) {
        if (k == L - 1) return snprintf(out, cap, "model.res_scale.%s", rest + 24), 1;
        return snprintf(out, cap, "model.layers.%d.res_scale.%s", 2 * (k + 1), rest + 24), 1;
    }
    for (size_t i = 0; i < sizeof map / sizeof *map; i++) {
        const size_t n = strlen(map[i].native);
        if (strncmp(rest, map[i].native, n)) continue;
        *per_expert = strstr(map[i].legacy, "%d") != NULL;
        snprintf(out, cap, "model.layers.%d.%s%s", 2 * k + map[i].moe_block, map[i].legacy, rest + n);
        return 1;
    }
    return 0;
}

/* Writes dir/config.json (legacy schema) and dir/model.safetensors (legacy names, per-expert tensors). */
static int write_legacy(const Model *m, const char *dir, int tied, ZyErr *err) {
    const ParamTable *t = &m->params;
    const int E = m->cfg.num_experts, L = m->cfg.num_layers;
    StWriteTensor *ts = calloc((size_t)t->count * E, sizeof *ts);
    char (*names)[256] = calloc((size_t)t->count * E, sizeof *names);
    int n = 0, rc = 0;
    for (int i = 0; i < t->count && !rc; i++) {
        const ParamInfo *p = &t->info[i];
        char pattern[256];
        int per_expert;
        if (!legacy_name_of(p->name, L, pattern, sizeof pattern, &per_expert)) {
            rc = zy_fail(err, "test: no legacy name for %s", p->name);
            break;
        }
        for (int e = 0; e < (per_expert ? E : 1); e++) {
            StWriteTensor *w = &ts[n];
            if (per_expert)
                snprintf(names[n], sizeof names[n], pattern, e);
            else
                snprintf(names[n], sizeof names[n], "%s", pattern);
            w->name = names[n];
            w->ndim = per_expert ? p->ndim - 1 : p->ndim;
            for (int d = 0; d < w->ndim; d++) w->shape[d] = p->shape[per_expert ? d + 1 : d];
            w->src_dtype = ZY_DT_F32;
            w->out_dtype = ZY_DT_F32;
            w->data = t->data + p->offset + (per_expert ? (size_t)e * (p->numel / E) : 0);
            n++;
        }
    }
    char path[512], cfg[4096];
    if (!rc) snprintf(path, sizeof path, "%s/model.safetensors", dir), rc = st_write(path, ts, n, NULL, err);
    if (!rc) {
        snprintf(cfg, sizeof cfg, legacy_cfg_json, tied ? "true" : "false");
        snprintf(path, sizeof path, "%s/config.json", dir);
        rc = zy_write_file_atomic(path, cfg, strlen(cfg), err);
    }
    free(ts);
    free(names);
    return rc;
}

static void randomize(Model *m, uint64_t seed) {
    ZyRng rng;
    zy_rng_seed(&rng, seed);
    for (int i = 0; i < m->params.count; i++) {
        const ParamInfo *p = &m->params.info[i];
        for (size_t j = 0; j < p->numel; j++) m->params.data[p->offset + j] = (float)(0.2 * zy_rng_normal(&rng));
    }
}

/* Tensors (not the alignment padding between them) that differ. */
static int tensors_differ(const Model *a, const Model *b) {
    int n = 0;
    for (int i = 0; i < a->params.count; i++) {
        const ParamInfo *p = &a->params.info[i];
        n += memcmp(a->params.data + p->offset, b->params.data + p->offset, p->numel * sizeof(float)) != 0;
    }
    return n;
}

TEST(legacy_checkpoint_loads_as_the_native_model) {
    for (int tied = 0; tied <= 1; tied++) {
        ZyErr err = {{0}};
        char dir[256], native_dir[300];
        REQUIRE(zy_test_tmpdir(dir, sizeof dir, "legacy") == 0);
        ZayaConfig c;
        char text[4096];
        snprintf(text, sizeof text, legacy_cfg_json, tied ? "true" : "false");
        REQUIRE(config_parse(&c, text, "legacy config", &err) == 0);
        CHECK(c.legacy_layout == 1);
        CHECK(c.num_layers == 3 && c.moe_intermediate_size == 12 && c.router_hidden_size == 8 && c.num_experts == 3);
        CHECK(c.cca_time0 == 2 && c.cca_time1 == 2 && c.num_kv_heads == 2 && c.tie_word_embeddings == tied);
        Model ref;
        REQUIRE(model_create(&ref, &c, &err) == 0);
        randomize(&ref, 10 + tied);
        REQUIRE(write_legacy(&ref, dir, tied, &err) == 0);
        Model m;
        CHECK_MSG(model_load_dir(&m, dir, &err) == 0, "%s", err.msg);
        if (m.params.data) {
            const int differ = tensors_differ(&ref, &m);
            CHECK_MSG(differ == 0, "%d tensors differ after the legacy round trip", differ);
            /* written again, it is a native model directory (what `zaya convert` does) */
            snprintf(native_dir, sizeof native_dir, "%s/native", dir);
            CHECK(model_save_dir(&m, native_dir, ZY_DT_F32, &err) == 0);
            Model n2;
            CHECK_MSG(model_load_dir(&n2, native_dir, &err) == 0, "%s", err.msg);
            CHECK(n2.cfg.legacy_layout == 0);
            if (n2.params.data) {
                CHECK(tensors_differ(&ref, &n2) == 0);
                model_free(&n2);
            }
            model_free(&m);
        }
        model_free(&ref);
        zy_test_rmtree(dir);
    }
}

TEST(legacy_checkpoint_errors_name_the_tensor) {
    ZyErr err = {{0}};
    char dir[256], path[300];
    REQUIRE(zy_test_tmpdir(dir, sizeof dir, "legacy_bad") == 0);
    ZayaConfig c;
    char text[4096];
    snprintf(text, sizeof text, legacy_cfg_json, "true");
    REQUIRE(config_parse(&c, text, "legacy config", &err) == 0);
    Model ref;
    REQUIRE(model_create(&ref, &c, &err) == 0);
    REQUIRE(write_legacy(&ref, dir, 1, &err) == 0);
    /* an expert missing: rewrite the file without expert 2 of layer 3's fc2 */
    StFile f;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    REQUIRE(st_open(&f, path, &err) == 0);
    StWriteTensor *ts = calloc((size_t)f.n_entries, sizeof *ts);
    float **bufs = calloc((size_t)f.n_entries, sizeof *bufs);
    int n = 0;
    for (int i = 0; i < f.n_entries; i++) {
        const StEntry *e = &f.entries[i];
        if (!strcmp(e->name, "model.layers.3.zaya_block.experts.local_experts.2.linear_fc2.weight")) continue;
        bufs[n] = malloc(e->numel * sizeof(float));
        st_read_f32(&f, e, bufs[n], &err);
        ts[n] = (StWriteTensor){.name = e->name, .ndim = e->ndim, .src_dtype = ZY_DT_F32, .out_dtype = ZY_DT_F32,
                                .data = bufs[n]};
        memcpy(ts[n].shape, e->shape, sizeof e->shape);
        n++;
    }
    char tmp[300];
    snprintf(tmp, sizeof tmp, "%s/model2.tmp", dir);
    REQUIRE(st_write(tmp, ts, n, NULL, &err) == 0);
    st_close(&f);
    REQUIRE(rename(tmp, path) == 0);
    Model m;
    CHECK(model_load_dir(&m, dir, &err) == -1);
    CHECK_MSG(strstr(err.msg, "mlp.experts.down_proj") && strstr(err.msg, "2 of its 3 experts"), "%s", err.msg);
    for (int i = 0; i < n; i++) free(bufs[i]);
    free(bufs);
    free(ts);
    model_free(&ref);
    zy_test_rmtree(dir);
}

TEST(legacy_config_schemas_and_refusals) {
    ZyErr err = {{0}};
    ZayaConfig c;
    /* ZAYA1-base's per-layer lists: the list wins over num_hidden_layers */
    const char *base =
        "{\"model_type\": \"zaya\", \"zaya_layers\": [\"a\", 4, \"a\", 4, \"a\", 4, \"a\", 4], \"num_hidden_layers\": 40,"
        " \"cca_num_q_heads\": 4, \"num_query_groups_list\": [2, 2, 2, 2], \"ffn_hidden_size_list\": [32, 32, 32, 32],"
        " \"zaya_mlp_expansion\": [8, 8, 8, 8], \"hidden_size\": 16, \"kv_channels\": 8, \"vocab_size\": 40,"
        " \"max_position_embeddings\": 32, \"norm_epsilon\": 1e-6}";
    REQUIRE(config_parse(&c, base, "base.json", &err) == 0);
    CHECK(c.legacy_layout && c.num_layers == 4 && c.num_experts == 4 && c.num_heads == 4 && c.num_kv_heads == 2);
    CHECK(c.moe_intermediate_size == 16 && c.router_hidden_size == 8 && c.head_dim == 8 && c.rope_theta == 5e6f);
    struct {
        const char *json, *expect;
    } bad[] = {
        {"{\"model_type\": \"zaya\", \"ffn_hidden_size\": 8, \"zaya_use_eda\": false}", "zaya_use_eda"},
        {"{\"model_type\": \"zaya\", \"ffn_hidden_size\": 8, \"activation_func\": \"gelu\"}", "activation_func"},
        {"{\"model_type\": \"zaya\", \"ffn_hidden_size\": 8, \"vocab_size\": 40, \"hidden_size\": 16, "
         "\"max_position_embeddings\": 8, \"num_hidden_layers\": 3, \"num_attention_heads\": 4, \"num_experts\": 4,"
         " \"zaya_mlp_expansion\": 8, \"num_query_groups\": 2}", "even"},
        {"{\"model_type\": \"zaya\", \"zaya_layers\": [\"a\", 4, \"a\", 8], \"hidden_size\": 16, \"vocab_size\": 40,"
         " \"max_position_embeddings\": 8}", "zaya_layers[3]"},
        {"{\"model_type\": \"zaya\", \"zaya_layers\": [\"a\", 4, 4, \"a\"], \"hidden_size\": 16, \"vocab_size\": 40,"
         " \"max_position_embeddings\": 8}", "zaya_layers[2]"},
        {"{\"model_type\": \"zaya\", \"zaya_layers\": [\"a\", 4], \"num_query_groups_list\": [2, 1], "
         "\"cca_num_q_heads\": 4, \"hidden_size\": 16, \"vocab_size\": 40, \"max_position_embeddings\": 8}",
         "num_query_groups_list"},
        {"{\"model_type\": \"zaya\", \"ffn_hidden_size\": 8, \"vocab_size\": 40}", "missing key \"hidden_size\""},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ZyErr e = {{0}};
        CHECK_MSG(config_parse(&c, bad[i].json, "legacy.json", &e) == -1, "case %zu accepted", i);
        CHECK_MSG(strstr(e.msg, bad[i].expect) && !strncmp(e.msg, "legacy.json: ", 13), "case %zu: \"%s\" lacks \"%s\"",
                  i, e.msg, bad[i].expect);
    }
}

/* legacy_cfg_json (3 native layers, 6 legacy) with `extra` keys spliced in before the closing brace. */
static int parse_legacy_with(ZayaConfig *c, const char *extra, ZyErr *err) {
    char text[4096];
    snprintf(text, sizeof text, legacy_cfg_json, "true");
    char *end = strrchr(text, '}');
    snprintf(end, sizeof text - (size_t)(end - text), "%s}", extra);
    return config_parse(c, text, "legacy.json", err);
}

/* Sliding windows in the legacy schema (RELEASES.md): swa_layers per legacy layer (previous tokens seen; the native
 * window is one more), or legacy layer_types; the sliding layers' RoPE base from swa_rotary_base. */
TEST(legacy_sliding_window_layers) {
    ZyErr err = {{0}};
    ZayaConfig c, c2;
    /* swa_layers over the 6 legacy layers: attention blocks 0, 2, 4 are native layers 0, 1, 2 */
    REQUIRE(parse_legacy_with(&c, ", \"swa_layers\": [4, 0, 0, 0, 4, 0], \"swa_rotary_base\": 500", &err) == 0);
    CHECK(c.legacy_layout && c.num_layers == 3);
    CHECK(cfg_layer_window(&c, 0) == 5 && cfg_layer_window(&c, 1) == 0 && cfg_layer_window(&c, 2) == 5);
    CHECK(cfg_layer_rope_theta(&c, 0) == 500.0f && cfg_layer_rope_theta(&c, 1) == 10000.0f);
    CHECK(cfg_layer_rotary_dim(&c, 0) == 4 && cfg_layer_rotary_dim(&c, 1) == 4);
    /* the default sliding RoPE base is 1e4; a list per native layer reads the same */
    REQUIRE(parse_legacy_with(&c2, ", \"swa_layers\": [4, 0, 4], \"rope_theta\": 5e6", &err) == 0);
    CHECK(cfg_layer_window(&c2, 0) == 5 && cfg_layer_window(&c2, 1) == 0 && cfg_layer_window(&c2, 2) == 5);
    CHECK(c2.rope_theta_sliding == 1e4f);
    /* layer_types (either length) agreeing with swa_layers */
    REQUIRE(parse_legacy_with(&c2, ", \"swa_layers\": [4, 0, 0, 0, 4, 0], \"swa_rotary_base\": 500, \"layer_types\": "
                              "[\"sliding_attention\", \"full_attention\", \"full_attention\", \"full_attention\", "
                              "\"sliding_attention\", \"full_attention\"]", &err) == 0);
    c2.legacy_layout = c.legacy_layout;
    CHECK(memcmp(&c, &c2, sizeof c) == 0);
    REQUIRE(parse_legacy_with(&c2, ", \"swa_layers\": [4, 0, 0, 0, 4, 0], \"swa_rotary_base\": 500, \"layer_types\": "
                              "[\"sliding_attention\", \"full_attention\", \"sliding_attention\"]", &err) == 0);
    CHECK(memcmp(&c, &c2, sizeof c) == 0);
    /* all zero: no sliding layer, the config as without the key */
    REQUIRE(parse_legacy_with(&c2, ", \"swa_layers\": [0, 0, 0, 0, 0, 0], \"layer_types\": [\"full_attention\", "
                              "\"full_attention\", \"full_attention\"]", &err) == 0);
    ZayaConfig plain;
    REQUIRE(parse_legacy_with(&plain, "", &err) == 0);
    CHECK(!cfg_has_sliding(&c2) && memcmp(&c2, &plain, sizeof c2) == 0);
    /* written out (zaya convert), it is the native schema with the same windows */
    char *json = config_to_json(&c, "float32");
    REQUIRE(config_parse(&c2, json, "native.json", &err) == 0);
    CHECK(strstr(json, "\"hybrid_sliding\", \"hybrid\", \"hybrid_sliding\"") && strstr(json, "\"sliding_window\":\t5"));
    free(json);
    CHECK(c2.legacy_layout == 0);
    c2.legacy_layout = 1;
    CHECK(memcmp(&c, &c2, sizeof c) == 0);
    struct {
        const char *extra, *expect;
    } bad[] = {
        {", \"swa_layers\": [4, 0, 0, 0, 8, 0]", "windows of 4 and 8 tokens"},
        {", \"swa_layers\": [4, 0, 0, 0, 4]", "\"swa_layers\" must be a list of 6 entries"},
        {", \"swa_layers\": 4", "\"swa_layers\" must be a list"},
        {", \"swa_layers\": [4, 0, -1, 0, 0, 0]", "swa_layers[2]"},
        {", \"swa_layers\": [4, 0, 0.5, 0, 0, 0]", "swa_layers[2]"},
        {", \"layer_types\": [\"full_attention\", \"sliding_attention\", \"full_attention\"]",
         "no \"swa_layers\" gives their window"},
        {", \"layer_types\": [\"full_attention\", \"hybrid_sliding\", \"full_attention\"]",
         "layer_types[1]\": unknown layer type \"hybrid_sliding\""},
        {", \"layer_types\": [\"full_attention\", \"full_attention\"]", "\"layer_types\" must be a list of 6"},
        {", \"swa_layers\": [4, 0, 0, 0, 4, 0], \"layer_types\": [\"full_attention\", \"full_attention\", "
         "\"sliding_attention\"]", "disagree about native layer 0"},
        {", \"swa_layers\": [4, 0, 0, 0, 4, 0], \"swa_rotary_base\": \"big\"", "swa_rotary_base"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ZyErr e = {{0}};
        CHECK_MSG(parse_legacy_with(&c, bad[i].extra, &e) == -1, "case %zu accepted", i);
        CHECK_MSG(strstr(e.msg, bad[i].expect) && !strncmp(e.msg, "legacy.json: ", 13), "case %zu: \"%s\" lacks \"%s\"",
                  i, e.msg, bad[i].expect);
    }
    /* a legacy sliding_window with no layer named sliding: which layers it meant is unknown */
    char text[4096];
    snprintf(text, sizeof text, legacy_cfg_json, "true");
    char *sw = strstr(text, "\"sliding_window\": null");
    REQUIRE(sw);
    memcpy(sw + 18, "4096", 4);
    ZyErr e = {{0}};
    CHECK(config_parse(&c, text, "legacy.json", &e) == -1);
    CHECK_MSG(strstr(e.msg, "neither \"layer_types\" nor \"swa_layers\""), "%s", e.msg);
}

TEST(native_router_norm_alias_loads) {
    ZyErr err = {{0}};
    char dir[256], path[300];
    REQUIRE(zy_test_tmpdir(dir, sizeof dir, "alias") == 0);
    ZayaConfig c;
    char text[4096];
    snprintf(text, sizeof text, legacy_cfg_json, "true");
    REQUIRE(config_parse(&c, text, "cfg", &err) == 0);
    c.legacy_layout = 0;
    Model ref;
    REQUIRE(model_create(&ref, &c, &err) == 0);
    randomize(&ref, 3);
    REQUIRE(model_save_dir(&ref, dir, ZY_DT_F32, &err) == 0);
    /* rename every router norm to the pre-May-2026 alias */
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    StWriteTensor *ts = calloc((size_t)ref.params.count, sizeof *ts);
    char (*names)[160] = calloc((size_t)ref.params.count, sizeof *names);
    for (int i = 0; i < ref.params.count; i++) {
        const ParamInfo *p = &ref.params.info[i];
        const char *at = strstr(p->name, ".mlp.gate.router_mlp.norm.");
        if (at)
            snprintf(names[i], sizeof names[i], "%.*s.mlp.gate.router_mlp.rmsnorm_eda.%s", (int)(at - p->name), p->name,
                     at + strlen(".mlp.gate.router_mlp.norm."));
        else
            snprintf(names[i], sizeof names[i], "%s", p->name);
        ts[i] = (StWriteTensor){.name = names[i], .ndim = p->ndim, .src_dtype = ZY_DT_F32, .out_dtype = ZY_DT_F32,
                                .data = ref.params.data + p->offset};
        memcpy(ts[i].shape, p->shape, sizeof(int64_t) * p->ndim);
    }
    REQUIRE(st_write(path, ts, ref.params.count, NULL, &err) == 0);
    Model m;
    CHECK_MSG(model_load_dir(&m, dir, &err) == 0, "%s", err.msg);
    if (m.params.data) {
        CHECK(tensors_differ(&ref, &m) == 0);
        model_free(&m);
    }
    free(ts);
    free(names);
    model_free(&ref);
    zy_test_rmtree(dir);
}
