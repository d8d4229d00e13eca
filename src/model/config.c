#include "model/config.h"

#include "kernels/quant.h"

#include "model/legacy.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int get_int(const cJSON *root, const char *key, int required, int def, int *out, const char *label,
                   ZyErr *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v)) {
        if (required) return zy_fail(err, "%s: missing key \"%s\"", label, key);
        *out = def;
        return 0;
    }
    if (!cJSON_IsNumber(v)) return zy_fail(err, "%s: key \"%s\" must be an integer", label, key);
    double d = v->valuedouble;
    if (d != floor(d) || d < -2147483648.0 || d > 2147483647.0)
        return zy_fail(err, "%s: key \"%s\" must be an integer (got %g)", label, key, d);
    *out = (int)d;
    return 0;
}

static int get_float(const cJSON *root, const char *key, int required, float def, float *out, const char *label,
                     ZyErr *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v)) {
        if (required) return zy_fail(err, "%s: missing key \"%s\"", label, key);
        *out = def;
        return 0;
    }
    if (!cJSON_IsNumber(v)) return zy_fail(err, "%s: key \"%s\" must be a number", label, key);
    *out = (float)v->valuedouble;
    return 0;
}

static int get_bool(const cJSON *root, const char *key, int required, int def, int *out, const char *label,
                    ZyErr *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v)) {
        if (required) return zy_fail(err, "%s: missing key \"%s\"", label, key);
        *out = def;
        return 0;
    }
    if (!cJSON_IsBool(v)) return zy_fail(err, "%s: key \"%s\" must be true or false", label, key);
    *out = cJSON_IsTrue(v);
    return 0;
}

/* Token ids may be null, an int, or (eos) a list of ints; we keep the first. */
/* An optional string key that must be one of `names` (NULL-terminated); absent = index 0. */
static int get_choice(const cJSON *root, const char *key, const char *const *names, int *out, const char *label,
                      ZyErr *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    *out = 0;
    if (!v || cJSON_IsNull(v)) return 0;
    char allowed[128] = "";
    for (int i = 0; names[i]; i++) {
        if (cJSON_IsString(v) && strcmp(v->valuestring, names[i]) == 0) {
            *out = i;
            return 0;
        }
        size_t n = strlen(allowed);
        snprintf(allowed + n, sizeof allowed - n, "%s\"%s\"", i ? ", " : "", names[i]);
    }
    return zy_fail(err, "%s: key \"%s\" must be one of %s", label, key, allowed);
}

const char *cfg_attention_name(ZyAttentionKind k) { return k == ZY_ATTN_MHA ? "mha" : "cca"; }
const char *cfg_router_name(ZyRouterKind k) { return k == ZY_ROUTER_LINEAR ? "linear" : "mlp"; }
const char *cfg_moe_name(ZyMoeKind k) { return k == ZY_MOE_DENSE ? "dense" : k == ZY_MOE_NOSKIP ? "noskip" : "skip"; }

static int get_token_id(const cJSON *root, const char *key, int def, int *out, const char *label, ZyErr *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (v && cJSON_IsArray(v)) {
        v = cJSON_GetArrayItem(v, 0);
        if (!v) {
            *out = -1;
            return 0;
        }
    }
    if (v && cJSON_IsNull(v)) {
        *out = -1;
        return 0;
    }
    if (v && !cJSON_IsNumber(v)) return zy_fail(err, "%s: key \"%s\" must be an integer or null", label, key);
    if (!v) {
        *out = def;
        return 0;
    }
    if (v->valuedouble != floor(v->valuedouble) || v->valuedouble < 0 || v->valuedouble > 2147483647.0)
        return zy_fail(err, "%s: key \"%s\" must be a non-negative integer", label, key);
    *out = (int)v->valuedouble;
    return 0;
}

/* One RoPE entry {"rope_type": "default", "rope_theta": θ, "partial_rotary_factor": f}; f defaults to 1.0, as
 * transformers' compute_default_rope_parameters reads it. `where` names the entry in errors. */
static int parse_rope_entry(const cJSON *src, const char *where, float *theta, float *factor, const char *label,
                            ZyErr *err) {
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(src, "rope_type");
    if (type && !(cJSON_IsString(type) && strcmp(type->valuestring, "default") == 0))
        return zy_fail(err, "%s: key \"%s.rope_type\": only \"default\" is supported", label, where);
    if (get_float(src, "rope_theta", 1, 0, theta, label, err))
        return zy_fail(err, "%s: key \"%s.rope_theta\" is missing or not a number", label, where);
    if (get_float(src, "partial_rotary_factor", 0, 1.0f, factor, label, err))
        return zy_fail(err, "%s: key \"%s.partial_rotary_factor\" must be a number", label, where);
    return 0;
}

/* rope_parameters: {"hybrid": {...}, "hybrid_sliding": {...}} (the transformers 5 layout: one entry per layer type;
 * a stray top-level "rope_type" beside them, a known hub bug, is ignored), also accepted flat ({"rope_type",
 * "rope_theta", ...}, full-attention layers only) or as legacy top-level rope_theta / partial_rotary_factor keys
 * (sliding layers then take transformers' default theta 1e4 and the same factor). Runs after the layer types are
 * known: an entry a layer type needs must be there (transformers fails to load the model otherwise). */
static int parse_rope(const cJSON *root, ZayaConfig *cfg, const char *label, ZyErr *err) {
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(root, "rope_parameters");
    const int sliding = cfg_has_sliding(cfg);
    int full = 0;
    for (int l = 0; l < cfg->num_layers && !full; l++) full = !cfg_layer_is_sliding(cfg, l);
    if (rp && !cJSON_IsNull(rp)) {
        if (!cJSON_IsObject(rp)) return zy_fail(err, "%s: key \"rope_parameters\" must be an object", label);
        const cJSON *hybrid = cJSON_GetObjectItemCaseSensitive(rp, "hybrid");
        const cJSON *hs = cJSON_GetObjectItemCaseSensitive(rp, "hybrid_sliding");
        if (!hybrid && !hs) { /* flat */
            if (sliding)
                return zy_fail(err, "%s: key \"rope_parameters\" has no \"hybrid_sliding\" entry for the sliding-window "
                               "layers (write it as {\"hybrid\": {...}, \"hybrid_sliding\": {...}})", label);
            return parse_rope_entry(rp, "rope_parameters", &cfg->rope_theta, &cfg->partial_rotary_factor, label, err);
        }
        if (hybrid) {
            if (!cJSON_IsObject(hybrid))
                return zy_fail(err, "%s: key \"rope_parameters.hybrid\" must be an object", label);
            if (parse_rope_entry(hybrid, "rope_parameters.hybrid", &cfg->rope_theta, &cfg->partial_rotary_factor,
                                 label, err))
                return -1;
        } else if (full) {
            return zy_fail(err, "%s: key \"rope_parameters\" has no \"hybrid\" entry for the full-attention layers",
                           label);
        } else { /* every layer slides: transformers' defaults, unused */
            cfg->rope_theta = 5e6f;
            cfg->partial_rotary_factor = 0.5f;
        }
        if (hs) {
            if (!cJSON_IsObject(hs))
                return zy_fail(err, "%s: key \"rope_parameters.hybrid_sliding\" must be an object", label);
            if (parse_rope_entry(hs, "rope_parameters.hybrid_sliding", &cfg->rope_theta_sliding,
                                 &cfg->partial_rotary_factor_sliding, label, err))
                return -1;
            cfg->rope_theta_sliding += 0.0f, cfg->partial_rotary_factor_sliding += 0.0f; /* -0 reads as absent */
            return 0;
        }
        if (sliding)
            return zy_fail(err, "%s: key \"rope_parameters\" has no \"hybrid_sliding\" entry for the sliding-window "
                           "layers", label);
        return 0;
    }
    if (get_float(root, "rope_theta", 1, 0, &cfg->rope_theta, label, err) ||
        get_float(root, "partial_rotary_factor", 0, 0.5f, &cfg->partial_rotary_factor, label, err))
        return -1;
    if (sliding) cfg->rope_theta_sliding = 1e4f, cfg->partial_rotary_factor_sliding = cfg->partial_rotary_factor;
    return 0;
}

/* layer_types (null or absent: every layer "hybrid") and sliding_window into cfg (num_layers already read). */
static int parse_layer_types(const cJSON *root, ZayaConfig *cfg, const char *label, ZyErr *err) {
    const cJSON *types = cJSON_GetObjectItemCaseSensitive(root, "layer_types");
    if (types && !cJSON_IsNull(types)) {
        if (!cJSON_IsArray(types)) return zy_fail(err, "%s: key \"layer_types\" must be a list", label);
        if (cJSON_GetArraySize(types) != cfg->num_layers)
            return zy_fail(err, "%s: key \"layer_types\" has %d entries, num_hidden_layers is %d", label,
                           cJSON_GetArraySize(types), cfg->num_layers);
        int i = 0;
        const cJSON *t;
        cJSON_ArrayForEach(t, types) {
            const int str = cJSON_IsString(t);
            if (str && strcmp(t->valuestring, "hybrid_sliding") == 0) {
                if (i >= ZY_MAX_SLIDING_LAYERS)
                    return zy_fail(err, "%s: key \"layer_types[%d]\": zaya supports sliding-window layers among the "
                                   "first %d layers only", label, i, ZY_MAX_SLIDING_LAYERS);
                cfg_set_layer_sliding(cfg, i, 1);
            } else if (!str || strcmp(t->valuestring, "hybrid") != 0) {
                const int legacy_name = str && (!strcmp(t->valuestring, "sliding_attention") ||
                                                !strcmp(t->valuestring, "full_attention"));
                return zy_fail(err, "%s: key \"layer_types[%d]\": unknown layer type %s%s%s (the layer types are "
                               "\"hybrid\" and \"hybrid_sliding\"%s)", label, i, str ? "\"" : "",
                               str ? t->valuestring : "(not a string)", str ? "\"" : "",
                               legacy_name ? "; \"full_attention\"/\"sliding_attention\" are the legacy schema's names" : "");
            }
            i++;
        }
    }
    const cJSON *sw = cJSON_GetObjectItemCaseSensitive(root, "sliding_window");
    if (sw && !cJSON_IsNull(sw) &&
        (!cJSON_IsNumber(sw) || sw->valuedouble != floor(sw->valuedouble) || sw->valuedouble < 1 ||
         sw->valuedouble > 2147483647.0))
        return zy_fail(err, "%s: key \"sliding_window\" must be a positive integer or null", label);
    cfg->sliding_window = sw && !cJSON_IsNull(sw) ? (int)sw->valuedouble : 0;
    if (cfg_has_sliding(cfg) && cfg->sliding_window == 0)
        return zy_fail(err, "%s: key \"sliding_window\" is %s but key \"layer_types\" has \"hybrid_sliding\" layers "
                       "(it must be the window, a positive integer)", label, sw ? "null" : "missing");
    return 0;
}

/* One {"group_size", "bits"[, "mode": "affine"]} of "quantization" (where: the key it is under, for errors). */
static int parse_quant_entry(const cJSON *e, const char *where, int *bits, int *group, const char *label, ZyErr *err) {
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(e, "bits"), *g = cJSON_GetObjectItemCaseSensitive(e, "group_size");
    const cJSON *mode = cJSON_GetObjectItemCaseSensitive(e, "mode");
    if (!cJSON_IsNumber(b) || !cJSON_IsNumber(g) || b->valuedouble != (int)b->valuedouble ||
        g->valuedouble != (int)g->valuedouble)
        return zy_fail(err, "%s: %s needs integer \"bits\" and \"group_size\"", label, where);
    if (mode && !(cJSON_IsString(mode) && strcmp(mode->valuestring, "affine") == 0))
        return zy_fail(err, "%s: %s: mode %s%s%s is not supported (zaya reads mlx's \"affine\" quantization)", label,
                       where, cJSON_IsString(mode) ? "\"" : "", cJSON_IsString(mode) ? mode->valuestring : "(not a string)",
                       cJSON_IsString(mode) ? "\"" : "");
    *bits = (int)b->valuedouble, *group = (int)g->valuedouble;
    if (zy_quant_format_check(*bits, *group, err)) return zy_wrap(err, "%s: %s", label, where);
    return 0;
}

/* "quantization" as mlx-lm writes it (or its copy in "quantization_config" alone): the defaults, and per module path
 * false or an entry of its own (checked here, applied by the reader). */
static int parse_quantization(const cJSON *root, ZayaConfig *cfg, const char *label, ZyErr *err) {
    const char *key = "quantization";
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!q || cJSON_IsNull(q)) q = cJSON_GetObjectItemCaseSensitive(root, key = "quantization_config");
    if (!q || cJSON_IsNull(q)) return 0;
    if (!cJSON_IsObject(q)) return zy_fail(err, "%s: key \"%s\" must be an object", label, key);
    char where[320];
    snprintf(where, sizeof where, "key \"%s\"", key);
    if (parse_quant_entry(q, where, &cfg->quant_bits, &cfg->quant_group_size, label, err)) return -1;
    const cJSON *it;
    cJSON_ArrayForEach(it, q) {
        if (!strcmp(it->string, "bits") || !strcmp(it->string, "group_size") || !strcmp(it->string, "mode")) continue;
        snprintf(where, sizeof where, "key \"%s\"[\"%.200s\"]", key, it->string);
        int b, g;
        if (!cJSON_IsFalse(it) && !(cJSON_IsObject(it) && parse_quant_entry(it, where, &b, &g, label, err) == 0))
            return cJSON_IsObject(it) ? -1 : zy_fail(err, "%s: %s must be false or {\"group_size\", \"bits\"}", label, where);
    }
    return 0;
}

int config_validate(const ZayaConfig *c, const char *label, ZyErr *err) {
    struct {
        const char *key;
        int value;
    } positive[] = {
        {"vocab_size", c->vocab_size},
        {"hidden_size", c->hidden_size},
        {"num_hidden_layers", c->num_layers},
        {"num_attention_heads", c->num_heads},
        {"num_key_value_heads", c->num_kv_heads},
        {"head_dim", c->head_dim},
        {"num_experts", c->num_experts},
        {"moe_intermediate_size", c->moe_intermediate_size},
        {"router_hidden_size", c->router_hidden_size},
        {"cca_time0", c->cca_time0},
        {"cca_time1", c->cca_time1},
        {"max_position_embeddings", c->max_position_embeddings},
    };
    for (size_t i = 0; i < ZY_ARRAY_LEN(positive); i++)
        if (positive[i].value <= 0)
            return zy_fail(err, "%s: key \"%s\" must be positive (got %d)", label, positive[i].key, positive[i].value);
    if (c->num_heads % c->num_kv_heads != 0)
        return zy_fail(err, "%s: num_attention_heads (%d) must be a multiple of num_key_value_heads (%d)", label,
                       c->num_heads, c->num_kv_heads);
    /* derived channel counts are ints (cfg_q_channels, ...): bound them before multiplying in int */
    if ((int64_t)c->num_heads * c->head_dim > (1 << 24) || (int64_t)c->cca_time0 + c->cca_time1 > (1 << 24))
        return zy_fail(err, "%s: num_attention_heads*head_dim (%lld) or cca_time0+cca_time1 (%lld) exceeds 2^24", label,
                       (long long)c->num_heads * c->head_dim, (long long)c->cca_time0 + c->cca_time1);
    if ((c->num_kv_heads * c->head_dim) % 2 != 0)
        return zy_fail(err, "%s: num_key_value_heads*head_dim (%d) must be even (values are split current/delayed)",
                       label, c->num_kv_heads * c->head_dim);
    if (!(c->partial_rotary_factor > 0.0f && c->partial_rotary_factor <= 1.0f))
        return zy_fail(err, "%s: key \"partial_rotary_factor\" must be in (0, 1] (got %g)", label,
                       (double)c->partial_rotary_factor);
    double rd = c->head_dim * (double)c->partial_rotary_factor;
    if (rd != floor(rd) || ((int)rd) % 2 != 0 || rd < 2)
        return zy_fail(err, "%s: head_dim*partial_rotary_factor = %g must be an even integer >= 2", label, rd);
    if (!(c->rope_theta > 1.0f) || !isfinite(c->rope_theta))
        return zy_fail(err, "%s: key \"rope_theta\" must be a finite number > 1 (got %g)", label, (double)c->rope_theta);
    if (c->sliding_window < 0)
        return zy_fail(err, "%s: key \"sliding_window\" must be positive (got %d)", label, c->sliding_window);
    for (int l = c->num_layers; l < ZY_MAX_SLIDING_LAYERS; l++)
        if (cfg_layer_is_sliding(c, l))
            return zy_fail(err, "%s: layer %d is marked sliding but the model has %d layers", label, l, c->num_layers);
    if (!isfinite(c->rope_theta_sliding) || !isfinite(c->partial_rotary_factor_sliding))
        return zy_fail(err, "%s: key \"rope_parameters.hybrid_sliding\": rope_theta and partial_rotary_factor must be "
                       "finite", label);
    if (cfg_has_sliding(c)) {
        if (c->sliding_window <= 0)
            return zy_fail(err, "%s: sliding-window layers need a positive \"sliding_window\" (got %d)", label,
                           c->sliding_window);
        if (!(c->partial_rotary_factor_sliding > 0.0f && c->partial_rotary_factor_sliding <= 1.0f))
            return zy_fail(err, "%s: key \"rope_parameters.hybrid_sliding.partial_rotary_factor\" must be in (0, 1] "
                           "(got %g)", label, (double)c->partial_rotary_factor_sliding);
        const double rds = c->head_dim * (double)c->partial_rotary_factor_sliding;
        if (rds != floor(rds) || ((int)rds) % 2 != 0 || rds < 2)
            return zy_fail(err, "%s: head_dim*rope_parameters.hybrid_sliding.partial_rotary_factor = %g must be an even "
                           "integer >= 2", label, rds);
        if (!(c->rope_theta_sliding > 1.0f) || !isfinite(c->rope_theta_sliding))
            return zy_fail(err, "%s: key \"rope_parameters.hybrid_sliding.rope_theta\" must be a finite number > 1 "
                           "(got %g)", label, (double)c->rope_theta_sliding);
    }
    if (!(c->rms_norm_eps > 0.0f) || !isfinite(c->rms_norm_eps))
        return zy_fail(err, "%s: key \"rms_norm_eps\" must be positive (got %g)", label, (double)c->rms_norm_eps);
    if (!(c->initializer_range > 0.0f) || !isfinite(c->initializer_range))
        return zy_fail(err, "%s: key \"initializer_range\" must be positive", label);
    if (c->pad_token_id >= c->vocab_size)
        return zy_fail(err, "%s: pad_token_id (%d) must be < vocab_size (%d)", label, c->pad_token_id, c->vocab_size);
    /* bos/eos are not used by the model itself (the tokenizer checks them), so only pad is validated here: it
     * selects the embedding row that receives no gradient. */
    /* Guard the sizes that multiply into allocations (and the per-layer lists a config is written back with). */
    if (c->num_layers > ZY_MAX_LAYERS)
        return zy_fail(err, "%s: num_hidden_layers (%d) is more than zaya supports (%d)", label, c->num_layers,
                       ZY_MAX_LAYERS);
    double per_layer = (double)c->num_experts * 3.0 * c->moe_intermediate_size * c->hidden_size;
    if (per_layer * c->num_layers > 1e12 || (double)c->vocab_size * c->hidden_size > 1e12)
        return zy_fail(err, "%s: model too large (more than 1e12 parameters)", label);
    return 0;
}

int config_parse(ZayaConfig *cfg, const char *json_text, const char *label, ZyErr *err) {
    memset(cfg, 0, sizeof *cfg);
    cJSON *root = cJSON_Parse(json_text);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        char near[32] = "";
        if (at) snprintf(near, sizeof near, "%.20s", at);
        return zy_fail(err, "%s: invalid JSON near \"%s\"", label, near);
    }
    int rc = -1, legacy = 0;
    if (!cJSON_IsObject(root)) {
        zy_fail(err, "%s: expected a JSON object", label);
        goto done;
    }
    if (legacy_config_detect(root)) { /* Zyphra's legacy schema: read as the native config it converts to */
        cJSON *native = legacy_config_to_native(root, label, err);
        if (!native) goto done;
        cJSON_Delete(root);
        root = native;
        legacy = 1;
    }
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    /* released variants zaya does not run, named rather than failing on some later key */
    if (cJSON_IsString(mt) && strcmp(mt->valuestring, "zaya1_vl") == 0) {
        zy_fail(err, "%s: model_type \"zaya1_vl\" is ZAYA1-VL, the vision-language model: not supported (zaya runs the "
                "text models, model_type \"zaya\")", label);
        goto done;
    }
    const cJSON *quant = cJSON_GetObjectItemCaseSensitive(root, "quantization_config");
    /* mlx-lm copies its "quantization" there for transformers' sake: no quant_method (read below) */
    if (quant && !cJSON_IsNull(quant) && !(cJSON_IsObject(quant) && !cJSON_GetObjectItemCaseSensitive(quant, "quant_method"))) {
        const cJSON *method = cJSON_IsObject(quant) ? cJSON_GetObjectItemCaseSensitive(quant, "quant_method") : NULL;
        zy_fail(err, "%s: quantization_config (quant_method \"%s\"): quantised weights such as ZAYA1-8B-FP8-Experts / "
                "MXFP4-Experts are not supported; use the bf16 release (ZAYA1-8B)", label,
                cJSON_IsString(method) ? method->valuestring : "?");
        goto done;
    }
    if (!mt) {
        zy_fail(err, "%s: missing key \"model_type\" (expected \"zaya\")", label);
        goto done;
    }
    if (!cJSON_IsString(mt) || strcmp(mt->valuestring, "zaya") != 0) {
        zy_fail(err, "%s: key \"model_type\" must be \"zaya\"", label);
        goto done;
    }
    int experts_per_tok = 0, lm_head_bias = 0, attention_bias = 0;
    if (get_int(root, "vocab_size", 1, 0, &cfg->vocab_size, label, err) ||
        get_int(root, "hidden_size", 1, 0, &cfg->hidden_size, label, err) ||
        get_int(root, "num_hidden_layers", 1, 0, &cfg->num_layers, label, err) ||
        get_int(root, "num_attention_heads", 1, 0, &cfg->num_heads, label, err) ||
        get_int(root, "num_key_value_heads", 1, 0, &cfg->num_kv_heads, label, err) ||
        get_int(root, "head_dim", 1, 0, &cfg->head_dim, label, err) ||
        get_int(root, "moe_intermediate_size", 1, 0, &cfg->moe_intermediate_size, label, err) ||
        get_int(root, "num_experts", 1, 0, &cfg->num_experts, label, err) ||
        get_int(root, "num_experts_per_tok", 1, 0, &experts_per_tok, label, err) ||
        get_int(root, "router_hidden_size", 1, 0, &cfg->router_hidden_size, label, err) ||
        get_int(root, "cca_time0", 1, 0, &cfg->cca_time0, label, err) ||
        get_int(root, "cca_time1", 1, 0, &cfg->cca_time1, label, err) ||
        get_float(root, "rms_norm_eps", 1, 0, &cfg->rms_norm_eps, label, err) ||
        get_bool(root, "tie_word_embeddings", 1, 0, &cfg->tie_word_embeddings, label, err) ||
        get_int(root, "max_position_embeddings", 1, 0, &cfg->max_position_embeddings, label, err) ||
        get_float(root, "initializer_range", 0, 0.02f, &cfg->initializer_range, label, err) ||
        get_bool(root, "lm_head_bias", 0, 0, &lm_head_bias, label, err) ||
        get_bool(root, "attention_bias", 0, 0, &attention_bias, label, err) ||
        get_token_id(root, "bos_token_id", 2, &cfg->bos_token_id, label, err) ||
        get_token_id(root, "eos_token_id", 106, &cfg->eos_token_id, label, err) ||
        get_token_id(root, "pad_token_id", 0, &cfg->pad_token_id, label, err))
        goto done;
    if (cfg->num_layers > ZY_MAX_LAYERS) { /* before anything per layer is read */
        zy_fail(err, "%s: key \"num_hidden_layers\" (%d) is more than zaya supports (%d)", label, cfg->num_layers,
                ZY_MAX_LAYERS);
        goto done;
    }
    if (parse_layer_types(root, cfg, label, err) || parse_rope(root, cfg, label, err)) goto done;
    if (experts_per_tok != 1) {
        zy_fail(err, "%s: key \"num_experts_per_tok\" must be 1 (ZAYA routes top-1; got %d)", label, experts_per_tok);
        goto done;
    }
    if (lm_head_bias || attention_bias) {
        zy_fail(err, "%s: key \"%s\" = true is not supported", label, lm_head_bias ? "lm_head_bias" : "attention_bias");
        goto done;
    }
    {
        static const char *const attn[] = {"cca", "mha", NULL}, *const router[] = {"mlp", "linear", NULL},
                                  *const moe[] = {"skip", "noskip", "dense", NULL};
        int a = 0, r = 0, m = 0, rs = 1;
        if (get_choice(root, "zaya_attention", attn, &a, label, err) ||
            get_choice(root, "zaya_router", router, &r, label, err) || get_choice(root, "zaya_moe", moe, &m, label, err) ||
            get_bool(root, "zaya_residual_scaling", 0, 1, &rs, label, err))
            goto done;
        cfg->attention = (ZyAttentionKind)a;
        cfg->router = (ZyRouterKind)r;
        cfg->moe = (ZyMoeKind)m;
        cfg->no_residual_scaling = !rs;
        if (cfg->moe == ZY_MOE_DENSE && cfg->router != ZY_ROUTER_MLP) {
            zy_fail(err, "%s: key \"zaya_router\": \"linear\" does not combine with \"zaya_moe\": \"dense\" (a dense "
                         "MLP has no router)", label);
            goto done;
        }
    }
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(root, "hidden_act");
    if (act && !(cJSON_IsString(act) && strcmp(act->valuestring, "silu") == 0)) {
        zy_fail(err, "%s: key \"hidden_act\" must be \"silu\"", label);
        goto done;
    }
    if (parse_quantization(root, cfg, label, err)) goto done;
    cfg->legacy_layout = legacy;
    rc = config_validate(cfg, label, err);
done:
    cJSON_Delete(root);
    return rc;
}

int config_load(ZayaConfig *cfg, const char *path, ZyErr *err) {
    char *text;
    if (zy_read_text_file(path, &text, err)) return -1;
    int rc = config_parse(cfg, text, path, err);
    free(text);
    return rc;
}

/* The double closest to the shortest decimal that reads back as f, so 1e-5f is written "1e-05" rather than
 * "9.99999974737875e-06". */
static double short_decimal(float f) {
    char buf[32];
    for (int prec = 1; prec <= 9; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, (double)f);
        if (strtof(buf, NULL) == f) return strtod(buf, NULL);
    }
    return (double)f;
}

char *config_to_json(const ZayaConfig *c, const char *torch_dtype) {
    cJSON *root = cJSON_CreateObject();
    cJSON *arch = cJSON_AddArrayToObject(root, "architectures");
    cJSON_AddItemToArray(arch, cJSON_CreateString("ZayaForCausalLM"));
    cJSON_AddStringToObject(root, "model_type", "zaya");
    cJSON_AddNumberToObject(root, "vocab_size", c->vocab_size);
    cJSON_AddNumberToObject(root, "hidden_size", c->hidden_size);
    cJSON_AddNumberToObject(root, "num_hidden_layers", c->num_layers);
    cJSON_AddNumberToObject(root, "num_attention_heads", c->num_heads);
    cJSON_AddNumberToObject(root, "num_key_value_heads", c->num_kv_heads);
    cJSON_AddNumberToObject(root, "head_dim", c->head_dim);
    cJSON_AddNumberToObject(root, "moe_intermediate_size", c->moe_intermediate_size);
    cJSON_AddNumberToObject(root, "num_experts", c->num_experts);
    cJSON_AddNumberToObject(root, "num_experts_per_tok", 1);
    cJSON_AddNumberToObject(root, "router_hidden_size", c->router_hidden_size);
    cJSON_AddNumberToObject(root, "cca_time0", c->cca_time0);
    cJSON_AddNumberToObject(root, "cca_time1", c->cca_time1);
    cJSON_AddNumberToObject(root, "rms_norm_eps", short_decimal(c->rms_norm_eps));
    cJSON_AddBoolToObject(root, "tie_word_embeddings", c->tie_word_embeddings);
    cJSON_AddNumberToObject(root, "max_position_embeddings", c->max_position_embeddings);
    cJSON_AddNumberToObject(root, "initializer_range", short_decimal(c->initializer_range));
    cJSON_AddStringToObject(root, "hidden_act", "silu");
    cJSON *rp = cJSON_AddObjectToObject(root, "rope_parameters");
    cJSON *hy = cJSON_AddObjectToObject(rp, "hybrid");
    cJSON_AddStringToObject(hy, "rope_type", "default");
    cJSON_AddNumberToObject(hy, "rope_theta", short_decimal(c->rope_theta));
    cJSON_AddNumberToObject(hy, "partial_rotary_factor", short_decimal(c->partial_rotary_factor));
    if (c->rope_theta_sliding != 0 || c->partial_rotary_factor_sliding != 0) { /* given, or a sliding layer's */
        cJSON *hs = cJSON_AddObjectToObject(rp, "hybrid_sliding");
        cJSON_AddStringToObject(hs, "rope_type", "default");
        cJSON_AddNumberToObject(hs, "rope_theta", short_decimal(c->rope_theta_sliding));
        cJSON_AddNumberToObject(hs, "partial_rotary_factor", short_decimal(c->partial_rotary_factor_sliding));
    }
    cJSON *types = cJSON_AddArrayToObject(root, "layer_types");
    for (int l = 0; l < c->num_layers; l++)
        cJSON_AddItemToArray(types, cJSON_CreateString(cfg_layer_is_sliding(c, l) ? "hybrid_sliding" : "hybrid"));
    if (c->sliding_window > 0)
        cJSON_AddNumberToObject(root, "sliding_window", c->sliding_window);
    else
        cJSON_AddNullToObject(root, "sliding_window");
    const struct {
        const char *key;
        int v;
    } ids[] = {{"bos_token_id", c->bos_token_id}, {"eos_token_id", c->eos_token_id}, {"pad_token_id", c->pad_token_id}};
    for (size_t i = 0; i < ZY_ARRAY_LEN(ids); i++) {
        if (ids[i].v >= 0)
            cJSON_AddNumberToObject(root, ids[i].key, ids[i].v);
        else
            cJSON_AddNullToObject(root, ids[i].key);
    }
    if (!cfg_is_zaya1(c)) { /* research variants: zaya reads these back; transformers cannot load the model */
        cJSON_AddStringToObject(root, "zaya_attention", cfg_attention_name(c->attention));
        cJSON_AddStringToObject(root, "zaya_router", cfg_router_name(c->router));
        cJSON_AddStringToObject(root, "zaya_moe", cfg_moe_name(c->moe));
        cJSON_AddBoolToObject(root, "zaya_residual_scaling", !c->no_residual_scaling);
    }
    if (c->quant_bits) { /* as mlx-lm writes it (per-module entries are the reader's: a parsed config has none) */
        cJSON *q = cJSON_AddObjectToObject(root, "quantization");
        cJSON_AddNumberToObject(q, "group_size", c->quant_group_size);
        cJSON_AddNumberToObject(q, "bits", c->quant_bits);
        cJSON_AddStringToObject(q, "mode", "affine");
        cJSON_AddItemToObject(root, "quantization_config", cJSON_Duplicate(q, 1));
    }
    cJSON_AddStringToObject(root, "torch_dtype", torch_dtype);
    char *s = cJSON_Print(root);
    cJSON_Delete(root);
    return s;
}

int config_save(const ZayaConfig *cfg, const char *path, const char *torch_dtype, ZyErr *err) {
    char *s = config_to_json(cfg, torch_dtype);
    if (!s) return zy_fail(err, "%s: out of memory serialising config", path);
    size_t n = strlen(s);
    char *with_nl = malloc(n + 2);
    if (!with_nl) {
        free(s);
        return zy_fail(err, "%s: out of memory", path);
    }
    memcpy(with_nl, s, n);
    with_nl[n] = '\n';
    int rc = zy_write_file_atomic(path, with_nl, n + 1, err);
    free(s);
    free(with_nl);
    return rc;
}
