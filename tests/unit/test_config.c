/* config.json parsing and validation: good configs load, every bad class is rejected naming the key. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/config.h"
#include "io/model_io.h"
#include "test.h"

static const char *GOOD =
    "{\"model_type\": \"zaya\", \"vocab_size\": 64, \"hidden_size\": 16, \"num_hidden_layers\": 2,"
    " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 8, \"moe_intermediate_size\": 8,"
    " \"num_experts\": 3, \"num_experts_per_tok\": 1, \"router_hidden_size\": 8, \"cca_time0\": 2, \"cca_time1\": 2,"
    " \"rms_norm_eps\": 1e-5, \"tie_word_embeddings\": true, \"max_position_embeddings\": 64,"
    " \"rope_parameters\": {\"hybrid\": {\"rope_type\": \"default\", \"rope_theta\": 10000.0,"
    " \"partial_rotary_factor\": 0.5}}, \"layer_types\": [\"hybrid\", \"hybrid\"], \"pad_token_id\": 0}";

/* Replaces the first occurrence of `from` in GOOD with `to` and parses the result. */
static int parse_variant(const char *from, const char *to, ZyErr *err) {
    const char *at = strstr(GOOD, from);
    if (!at) return -2;
    size_t n = strlen(GOOD) + strlen(to) + 1;
    char *s = malloc(n);
    size_t pre = (size_t)(at - GOOD);
    memcpy(s, GOOD, pre);
    strcpy(s + pre, to);
    strcat(s, at + strlen(from));
    ZayaConfig cfg;
    int rc = config_parse(&cfg, s, "cfg.json", err);
    free(s);
    return rc;
}

TEST(config_good_parses_with_all_fields) {
    ZayaConfig c;
    ZyErr err = {{0}};
    REQUIRE(config_parse(&c, GOOD, "cfg.json", &err) == 0);
    CHECK(c.vocab_size == 64 && c.hidden_size == 16 && c.num_layers == 2 && c.num_heads == 4 && c.num_kv_heads == 2);
    CHECK(c.head_dim == 8 && c.num_experts == 3 && c.cca_time0 == 2 && c.tie_word_embeddings == 1);
    CHECK(c.rope_theta == 10000.0f && c.partial_rotary_factor == 0.5f && cfg_rotary_dim(&c) == 4);
    CHECK(c.initializer_range == 0.02f); /* default */
    /* round trip through our writer */
    char *json = config_to_json(&c, "float32");
    ZayaConfig c2;
    REQUIRE(config_parse(&c2, json, "roundtrip", &err) == 0);
    free(json);
    CHECK(memcmp(&c, &c2, sizeof c) == 0);
}

TEST(config_rejects_each_bad_input_naming_the_key) {
    static const struct {
        const char *from, *to, *expect;
    } cases[] = {
        {"\"vocab_size\": 64,", "", "missing key \"vocab_size\""},
        {"\"num_hidden_layers\": 2", "\"num_hidden_layers\": 444444442", "more than zaya supports"},
        {"\"hidden_size\": 16", "\"hidden_size\": \"16\"", "\"hidden_size\" must be an integer"},
        {"\"hidden_size\": 16", "\"hidden_size\": 16.5", "\"hidden_size\" must be an integer"},
        {"\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3", "multiple of num_key_value_heads"},
        {"\"num_experts_per_tok\": 1", "\"num_experts_per_tok\": 2", "num_experts_per_tok"},
        {"\"partial_rotary_factor\": 0.5", "\"partial_rotary_factor\": 0.125", "must be an even integer"},
        {"\"partial_rotary_factor\": 0.5", "\"partial_rotary_factor\": 1.5", "partial_rotary_factor"},
        {"\"num_experts\": 3", "\"num_experts\": 0", "\"num_experts\" must be positive"},
        {"\"head_dim\": 8", "\"head_dim\": -8", "\"head_dim\" must be positive"},
        {"\"cca_time0\": 2", "\"cca_time0\": 0", "\"cca_time0\" must be positive"},
        /* sliding windows: a sliding layer needs a window and its own RoPE entry; unknown layer types are named */
        {"[\"hybrid\", \"hybrid\"]", "[\"hybrid\", \"hybrid_sliding\"]", "\"sliding_window\" is missing"},
        {"[\"hybrid\", \"hybrid\"]", "[\"hybrid\", \"hybrid_sliding\"], \"sliding_window\": null",
         "\"sliding_window\" is null"},
        {"[\"hybrid\", \"hybrid\"]", "[\"hybrid\", \"hybrid_sliding\"], \"sliding_window\": 4",
         "no \"hybrid_sliding\" entry"},
        {"[\"hybrid\", \"hybrid\"]", "[\"hybrid\", \"sliding_attention\"], \"sliding_window\": 4",
         "layer_types[1]\": unknown layer type \"sliding_attention\""},
        {"[\"hybrid\", \"hybrid\"]", "[\"hybrid\", \"local\"]", "layer_types[1]\": unknown layer type \"local\""},
        {"[\"hybrid\", \"hybrid\"]", "[\"hybrid\", 7]", "layer_types[1]\": unknown layer type (not a string)"},
        {"[\"hybrid\", \"hybrid\"]", "[\"hybrid\", \"hybrid\"], \"sliding_window\": 0", "\"sliding_window\" must be a positive"},
        {"[\"hybrid\", \"hybrid\"]", "[\"hybrid\", \"hybrid\"], \"sliding_window\": -4", "\"sliding_window\" must be a positive"},
        {"[\"hybrid\", \"hybrid\"]", "[\"hybrid\", \"hybrid\"], \"sliding_window\": 4.5", "\"sliding_window\" must be a positive"},
        {"[\"hybrid\", \"hybrid\"]", "[\"hybrid\", \"hybrid\"], \"sliding_window\": \"4\"", "\"sliding_window\" must be a positive"},
        {"[\"hybrid\", \"hybrid\"]", "\"hybrid\"", "\"layer_types\" must be a list"},
        {"\"partial_rotary_factor\": 0.5}}, \"layer_types\": [\"hybrid\", \"hybrid\"]",
         "\"partial_rotary_factor\": 0.5}, \"hybrid_sliding\": {\"rope_theta\": 10.0, \"partial_rotary_factor\": 0.125}},"
         " \"layer_types\": [\"hybrid\", \"hybrid_sliding\"], \"sliding_window\": 3",
         "hybrid_sliding.partial_rotary_factor = 1 must be"},
        {"\"partial_rotary_factor\": 0.5}}", "\"partial_rotary_factor\": 0.5}, \"hybrid_sliding\": {\"rope_type\": \"yarn\","
         " \"rope_theta\": 10.0}}", "rope_parameters.hybrid_sliding.rope_type"},
        {"\"partial_rotary_factor\": 0.5}}", "\"partial_rotary_factor\": 0.5}, \"hybrid_sliding\": {}}",
         "rope_parameters.hybrid_sliding.rope_theta"},
        {"\"partial_rotary_factor\": 0.5}}", "\"partial_rotary_factor\": 0.5}, \"hybrid_sliding\": 3}",
         "\"rope_parameters.hybrid_sliding\" must be an object"},
        /* an unused entry may hold anything finite, but it is written back, so it must read back the same */
        {"\"partial_rotary_factor\": 0.5}}", "\"partial_rotary_factor\": 0.5}, \"hybrid_sliding\": {\"rope_theta\": 1e39}}",
         "must be finite"},
        {"[\"hybrid\", \"hybrid\"]", "[\"hybrid\"]", "layer_types"},
        {"\"model_type\": \"zaya\"", "\"model_type\": \"llama\"", "model_type"},
        {"\"model_type\": \"zaya\"", "\"model_type\": \"zaya1_vl\"", "ZAYA1-VL, the vision-language model"},
        {"\"pad_token_id\": 0", "\"pad_token_id\": 0, \"quantization_config\": {\"quant_method\": \"fp8\"}",
         "quant_method \"fp8\"): quantised weights"},
        {"\"pad_token_id\": 0", "\"pad_token_id\": 0, \"quantization_config\": {\"quant_method\": \"mxfp4\"}",
         "MXFP4-Experts are not supported"},
        {"\"tie_word_embeddings\": true", "\"tie_word_embeddings\": 1", "tie_word_embeddings"},
        {"\"rope_theta\": 10000.0,", "", "rope_theta"},
        {"\"rope_type\": \"default\"", "\"rope_type\": \"yarn\"", "rope_type"},
        {"\"rms_norm_eps\": 1e-5", "\"rms_norm_eps\": -1", "rms_norm_eps"},
        {"\"pad_token_id\": 0", "\"pad_token_id\": 64", "pad_token_id"},
        {"{\"model_type\"", "[{\"model_type\"", "invalid JSON"},
        {"\"pad_token_id\": 0", "\"pad_token_id\": 0, \"zaya_attention\": \"gqa\"", "\"zaya_attention\" must be one of"},
        {"\"pad_token_id\": 0", "\"pad_token_id\": 0, \"zaya_moe\": 3", "\"zaya_moe\" must be one of"},
        {"\"pad_token_id\": 0", "\"pad_token_id\": 0, \"zaya_router\": \"linear\", \"zaya_moe\": \"dense\"",
         "does not combine"},
        {"\"pad_token_id\": 0", "\"pad_token_id\": 0, \"zaya_residual_scaling\": \"no\"", "zaya_residual_scaling"},
        /* found by fuzz_config: num_key_value_heads*head_dim overflowed int before any size check */
        {"\"head_dim\": 8", "\"head_dim\": 1073741824", "exceeds 2^24"},
        {"\"cca_time1\": 2", "\"cca_time1\": 2147483647", "exceeds 2^24"},
        {"\"rope_theta\": 10000.0", "\"rope_theta\": \"big\"", "\"rope_parameters.hybrid.rope_theta\""},
        /* quantized folders (mlx's affine layout): what zaya reads, else named */
        {"\"pad_token_id\": 0", "\"pad_token_id\": 0, \"quantization\": {\"group_size\": 64, \"bits\": 3}",
         "key \"quantization\": 3-bit quantization is not supported"},
        {"\"pad_token_id\": 0", "\"pad_token_id\": 0, \"quantization\": {\"group_size\": 16, \"bits\": 4}",
         "group size 16"},
        {"\"pad_token_id\": 0", "\"pad_token_id\": 0, \"quantization\": {\"group_size\": 32, \"bits\": 4, \"mode\": \"mxfp4\"}",
         "mode \"mxfp4\" is not supported"},
        {"\"pad_token_id\": 0", "\"pad_token_id\": 0, \"quantization\": {\"bits\": 4}", "needs integer \"bits\" and"},
        {"\"pad_token_id\": 0", "\"pad_token_id\": 0, \"quantization\": {\"group_size\": 64, \"bits\": 4, \"lm_head\": 1}",
         "key \"quantization\"[\"lm_head\"] must be false or"},
    };
    for (size_t i = 0; i < ZY_ARRAY_LEN(cases); i++) {
        ZyErr err = {{0}};
        int rc = parse_variant(cases[i].from, cases[i].to, &err);
        CHECK_MSG(rc == -1, "case %zu (%s) was accepted", i, cases[i].expect);
        CHECK_MSG(strstr(err.msg, cases[i].expect) != NULL, "case %zu: message \"%s\" lacks \"%s\"", i, err.msg,
                  cases[i].expect);
        CHECK_MSG(strncmp(err.msg, "cfg.json: ", 10) == 0, "case %zu: message \"%s\" does not start with the file", i,
                  err.msg);
    }
}

/* GOOD with its layer types and sliding entries replaced: `types` the layer_types list, `extra` text after the
 * hybrid RoPE entry inside rope_parameters (e.g. a "hybrid_sliding" entry), `tail` keys added at the end. */
static int parse_sliding(ZayaConfig *c, const char *types, const char *rope_extra, const char *tail, ZyErr *err) {
    char text[2048];
    const char *rp_end = strstr(GOOD, "\"partial_rotary_factor\": 0.5}") + 29;
    snprintf(text, sizeof text, "%.*s%s}, \"layer_types\": %s, \"pad_token_id\": 0%s}", (int)(rp_end - GOOD), GOOD,
             rope_extra, types, tail);
    return config_parse(c, text, "cfg.json", err);
}

TEST(config_sliding_window_layers_parse_and_round_trip) {
    ZyErr err = {{0}};
    ZayaConfig c, c2;
    /* the transformers layout: layer_types, sliding_window, rope_parameters.hybrid_sliding */
    REQUIRE(parse_sliding(&c, "[\"hybrid_sliding\", \"hybrid\"]",
                          ", \"hybrid_sliding\": {\"rope_type\": \"default\", \"rope_theta\": 1000.0, "
                          "\"partial_rotary_factor\": 0.25}", ", \"sliding_window\": 5", &err) == 0);
    CHECK(cfg_layer_window(&c, 0) == 5 && cfg_layer_window(&c, 1) == 0 && cfg_has_sliding(&c));
    CHECK(cfg_layer_is_sliding(&c, 0) && !cfg_layer_is_sliding(&c, 1) && !cfg_layer_is_sliding(&c, 2));
    CHECK(cfg_layer_rope_theta(&c, 0) == 1000.0f && cfg_layer_rope_theta(&c, 1) == 10000.0f);
    CHECK(cfg_layer_rotary_dim(&c, 0) == 2 && cfg_layer_rotary_dim(&c, 1) == 4);
    char *json = config_to_json(&c, "float32");
    REQUIRE(json);
    CHECK(strstr(json, "\"hybrid_sliding\"") && strstr(json, "\"sliding_window\":\t5"));
    REQUIRE(config_parse(&c2, json, "roundtrip", &err) == 0);
    free(json);
    CHECK(memcmp(&c, &c2, sizeof c) == 0);
    /* transformers' default: an entry without partial_rotary_factor rotates the whole head */
    REQUIRE(parse_sliding(&c, "[\"hybrid\", \"hybrid_sliding\"]", ", \"hybrid_sliding\": {\"rope_theta\": 500.0}",
                          ", \"sliding_window\": 1", &err) == 0);
    CHECK(cfg_layer_window(&c, 1) == 1 && cfg_layer_rotary_dim(&c, 1) == 8 && c.partial_rotary_factor_sliding == 1.0f);
    /* ZAYA1-8B's config: a hybrid_sliding entry, no sliding layer, sliding_window null, the stray rope_type */
    REQUIRE(parse_sliding(&c, "[\"hybrid\", \"hybrid\"]",
                          ", \"hybrid_sliding\": {\"rope_type\": \"default\", \"rope_theta\": 10000.0, "
                          "\"partial_rotary_factor\": 0.5}, \"rope_type\": \"default\"", ", \"sliding_window\": null",
                          &err) == 0);
    CHECK(!cfg_has_sliding(&c) && c.sliding_window == 0 && c.rope_theta_sliding == 10000.0f);
    json = config_to_json(&c, "float32");
    REQUIRE(config_parse(&c2, json, "roundtrip", &err) == 0);
    free(json);
    CHECK(memcmp(&c, &c2, sizeof c) == 0);
    /* a window on a model with no sliding layer is kept (transformers keeps it) and written back */
    REQUIRE(parse_sliding(&c, "null", "", ", \"sliding_window\": 4096", &err) == 0);
    CHECK(!cfg_has_sliding(&c) && c.sliding_window == 4096 && cfg_layer_window(&c, 0) == 0 && c.rope_theta_sliding == 0);
    json = config_to_json(&c, "float32");
    REQUIRE(config_parse(&c2, json, "roundtrip", &err) == 0);
    CHECK(strstr(json, "\"hybrid_sliding\"") == NULL);
    free(json);
    CHECK(memcmp(&c, &c2, sizeof c) == 0);
    /* every layer sliding: no "hybrid" RoPE entry is needed */
    const char *all = "{\"model_type\": \"zaya\", \"vocab_size\": 64, \"hidden_size\": 16, \"num_hidden_layers\": 2,"
                      " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 8, \"moe_intermediate_size\": 8,"
                      " \"num_experts\": 3, \"num_experts_per_tok\": 1, \"router_hidden_size\": 8, \"cca_time0\": 2,"
                      " \"cca_time1\": 2, \"rms_norm_eps\": 1e-5, \"tie_word_embeddings\": true,"
                      " \"max_position_embeddings\": 64, \"rope_parameters\": {\"hybrid_sliding\": {\"rope_theta\": 99.0,"
                      " \"partial_rotary_factor\": 0.5}}, \"layer_types\": [\"hybrid_sliding\", \"hybrid_sliding\"],"
                      " \"sliding_window\": 3}";
    REQUIRE(config_parse(&c, all, "all.json", &err) == 0);
    CHECK(cfg_layer_window(&c, 0) == 3 && cfg_layer_window(&c, 1) == 3 && cfg_layer_rope_theta(&c, 1) == 99.0f);
    /* ... but one full layer needs it */
    ZyErr e2 = {{0}};
    CHECK(parse_sliding(&c, "[\"hybrid_sliding\", \"hybrid\"]", "", ", \"sliding_window\": 3", &e2) == -1);
    CHECK_MSG(strstr(e2.msg, "no \"hybrid_sliding\" entry"), "%s", e2.msg);
    /* a config built in code: validate checks the window and the sliding RoPE */
    REQUIRE(config_parse(&c, GOOD, "cfg.json", &err) == 0);
    cfg_set_layer_sliding(&c, 1, 1);
    CHECK(config_validate(&c, "code", &e2) == -1 && strstr(e2.msg, "sliding_window"));
    c.sliding_window = 7;
    CHECK(config_validate(&c, "code", &e2) == -1 && strstr(e2.msg, "hybrid_sliding.partial_rotary_factor"));
    c.partial_rotary_factor_sliding = 0.5f, c.rope_theta_sliding = 1.0f;
    CHECK(config_validate(&c, "code", &e2) == -1 && strstr(e2.msg, "hybrid_sliding.rope_theta"));
    c.rope_theta_sliding = 10.0f;
    CHECK(config_validate(&c, "code", &e2) == 0);
    cfg_set_layer_sliding(&c, 2, 1); /* past the last layer */
    CHECK(config_validate(&c, "code", &e2) == -1 && strstr(e2.msg, "layer 2"));
    cfg_set_layer_sliding(&c, 2, 0);
}

TEST(config_files_in_repo_load) {
    static const char *files[] = {"configs/zaya1-base.json", "configs/tiny.json", "configs/bench-gpu-8b-slice.json",
                                  "configs/bench-gpu-sliding.json", "configs/tiny-sliding.json"};
    for (size_t i = 0; i < ZY_ARRAY_LEN(files); i++) {
        ZayaConfig c;
        ZyErr err = {{0}};
        CHECK_MSG(config_load(&c, files[i], &err) == 0, "%s", err.msg);
    }
    ZayaConfig base;
    ZyErr err = {{0}};
    REQUIRE(config_load(&base, "configs/zaya1-base.json", &err) == 0);
    CHECK(base.vocab_size == 262272 && base.hidden_size == 2048 && base.num_layers == 40 && base.num_experts == 16);
    CHECK(cfg_rotary_dim(&base) == 64 && cfg_conv_pad(&base) == 2);
    /* the GPU benchmark at ZAYA1-8B's real shapes: its widths, 8 layers */
    ZayaConfig slice;
    REQUIRE(config_load(&slice, "configs/bench-gpu-8b-slice.json", &err) == 0);
    CHECK(slice.vocab_size == 262272 && slice.hidden_size == 2048 && slice.num_layers == 8 && slice.num_experts == 16);
    CHECK(slice.num_heads == 8 && slice.num_kv_heads == 2 && slice.head_dim == 128 &&
          slice.moe_intermediate_size == 2048 && slice.router_hidden_size == 256);
    /* the sliding-window benchmark (device-session.sh's window part): bench-gpu with every other layer windowed */
    ZayaConfig gpu, sliding;
    REQUIRE(config_load(&gpu, "configs/bench-gpu.json", &err) == 0);
    REQUIRE(config_load(&sliding, "configs/bench-gpu-sliding.json", &err) == 0);
    CHECK(sliding.hidden_size == gpu.hidden_size && sliding.num_layers == gpu.num_layers &&
          sliding.head_dim == gpu.head_dim && sliding.num_experts == gpu.num_experts && sliding.sliding_window == 512);
    for (int l = 0; l < sliding.num_layers; l++) CHECK(cfg_layer_is_sliding(&sliding, l) == (l % 2 == 0));
}

/* generation_config.json: absent is fine; eos ids (integer or list) and the sampling keys are read; a key zaya uses
 * with the wrong type is an error naming the file and the key. */
TEST(generation_config_reads_release_keys_and_names_bad_ones) {
    char dir[] = "/tmp/zaya_gencfg_XXXXXX", path[256];
    REQUIRE(mkdtemp(dir));
    GenerationConfig gc;
    ZyErr err = {{0}};
    REQUIRE(generation_config_load(&gc, dir, &err) == 0);
    CHECK(!gc.present);
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    const char *good = "{\"bos_token_id\": 2, \"eos_token_id\": [1, 106], \"do_sample\": true, \"temperature\": 0.6,"
                       " \"top_k\": 20, \"top_p\": 0.95, \"transformers_version\": \"5.0\"}";
    REQUIRE(zy_write_file_atomic(path, good, strlen(good), &err) == 0);
    REQUIRE(generation_config_load(&gc, dir, &err) == 0);
    CHECK(gc.present && gc.n_eos == 2 && gc.eos[0] == 1 && gc.eos[1] == 106);
    CHECK(gc.has_do_sample && gc.do_sample && gc.has_temperature && gc.temperature == 0.6);
    CHECK(gc.has_top_k && gc.top_k == 20 && gc.has_top_p && gc.top_p == 0.95);
    /* stop ids: config eos, tokenizer eos, then the file's, each once; -1 means none */
    int32_t stops[GEN_MAX_STOPS];
    CHECK(generation_stop_ids(stops, 1, 7, &gc) == 3 && stops[0] == 1 && stops[1] == 7 && stops[2] == 106);
    CHECK(generation_stop_ids(stops, -1, -1, &gc) == 2 && stops[0] == 1 && stops[1] == 106);
    CHECK(generation_stop_ids(stops, 5, 5, NULL) == 1 && stops[0] == 5);
    CHECK(generation_stop_ids(stops, -1, -1, NULL) == 0);
    static const struct {
        const char *text, *expect;
    } bad[] = {
        {"{\"eos_token_id\": \"x\"}", "eos_token_id must be an integer or a list"},
        {"{\"eos_token_id\": [1, -3]}", "eos_token_id[1] must be a non-negative integer"},
        {"{\"do_sample\": 1}", "do_sample must be true or false"},
        {"{\"temperature\": -1}", "temperature must be a non-negative number"},
        {"{\"top_k\": 2.5}", "top_k must be a non-negative integer"},
        {"{\"top_p\": 0}", "top_p must be in (0, 1]"},
        {"[1, 2]", "invalid JSON"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        REQUIRE(zy_write_file_atomic(path, bad[i].text, strlen(bad[i].text), &err) == 0);
        memset(&err, 0, sizeof err);
        CHECK(generation_config_load(&gc, dir, &err) != 0);
        CHECK_MSG(strstr(err.msg, bad[i].expect) && strstr(err.msg, "generation_config.json"), "%s -> %s", bad[i].text,
                  err.msg);
    }
    remove(path);
    rmdir(dir);
}

/* "quantization" as mlx-lm writes it (and its copy in "quantization_config", alone too), per-module entries
 * included; written back by config_to_json. */
TEST(config_reads_mlx_quantization) {
    ZyErr err = {{0}};
    const char *forms[] = {
        ", \"quantization\": {\"group_size\": 64, \"bits\": 4, \"mode\": \"affine\"},"
        " \"quantization_config\": {\"group_size\": 64, \"bits\": 4, \"mode\": \"affine\"}",
        ", \"quantization_config\": {\"group_size\": 64, \"bits\": 4}",
        ", \"quantization\": {\"group_size\": 64, \"bits\": 4, \"model.layers.0.mlp.gate.down_proj\": false,"
        " \"model.layers.1.self_attn.o_proj\": {\"group_size\": 32, \"bits\": 8}}",
    };
    for (size_t i = 0; i < ZY_ARRAY_LEN(forms); i++) {
        char text[2048];
        snprintf(text, sizeof text, "%.*s%s}", (int)strlen(GOOD) - 1, GOOD, forms[i]);
        ZayaConfig c;
        CHECK_MSG(config_parse(&c, text, "cfg.json", &err) == 0, "form %zu: %s", i, err.msg);
        CHECK(c.quant_bits == 4 && c.quant_group_size == 64);
        char *json = config_to_json(&c, "bfloat16");
        ZayaConfig c2;
        CHECK(json && config_parse(&c2, json, "roundtrip", &err) == 0 && memcmp(&c, &c2, sizeof c) == 0);
        CHECK(json && strstr(json, "\"quantization\"") && strstr(json, "\"affine\""));
        free(json);
    }
}
