/* Legacy ZAYA1 checkpoints (legacy.h); the mapping follows Zyphra's convert_zaya_weights_to_hf.py as described in
 * RELEASES.md. */
#include "model/legacy.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const cJSON *get(const cJSON *o, const char *k) { return cJSON_GetObjectItemCaseSensitive(o, k); }

int legacy_config_detect(const cJSON *root) {
    if (get(root, "moe_intermediate_size")) return 0;
    return get(root, "ffn_hidden_size") || get(root, "zaya_layers") || get(root, "norm_epsilon") ||
           get(root, "ffn_hidden_size_list");
}

/* A number key (required or with a default); integral when asked. */
static int num(const cJSON *root, const char *key, int required, double def, int integral, double *out,
               const char *label, ZyErr *err) {
    const cJSON *v = get(root, key);
    if (!v || cJSON_IsNull(v)) {
        if (required) return zy_fail(err, "%s: legacy config: missing key \"%s\"", label, key);
        *out = def;
        return 0;
    }
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) ||
        (integral && (v->valuedouble != floor(v->valuedouble) || v->valuedouble < 0 || v->valuedouble > 2147483647.0)))
        return zy_fail(err, "%s: legacy config: key \"%s\" must be %s", label, key,
                       integral ? "a non-negative integer below 2^31" : "a number");
    *out = v->valuedouble;
    return 0;
}

/* A setting zaya implements only one way: absent, or equal to want. */
static int must_be_bool(const cJSON *root, const char *key, int want, const char *label, ZyErr *err) {
    const cJSON *v = get(root, key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsBool(v) || cJSON_IsTrue(v) != want)
        return zy_fail(err, "%s: legacy config: key \"%s\" must be %s (zaya implements ZAYA1 as released)", label, key,
                       want ? "true" : "false");
    return 0;
}

/* Every element of a list-valued key equal (per-layer values zaya does not support varying); *out = the value. */
static int uniform_list(const cJSON *root, const char *key, double *out, const char *label, ZyErr *err) {
    const cJSON *v = get(root, key), *it;
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) == 0)
        return zy_fail(err, "%s: legacy config: key \"%s\" must be a non-empty list", label, key);
    int i = 0;
    cJSON_ArrayForEach(it, v) {
        if (!cJSON_IsNumber(it) || !(it->valuedouble >= 0 && it->valuedouble <= 2147483647.0))
            return zy_fail(err, "%s: legacy config: key \"%s[%d]\" must be a non-negative number below 2^31", label,
                           key, i);
        if (i == 0) *out = it->valuedouble;
        if (it->valuedouble != *out)
            return zy_fail(err, "%s: legacy config: key \"%s\" varies across layers (%g, then %g at [%d]); zaya needs "
                                "one value", label, key, *out, it->valuedouble, i);
        i++;
    }
    return 0;
}

/* A per-layer list read at the attention blocks: `key` has one entry per legacy layer (2·layers; the attention block
 * of native layer k is entry 2k) or one per native layer. *stride = 2 or 1; -1 with err otherwise. */
static int per_layer_list(const cJSON *v, const char *key, int layers, int *stride, const char *label, ZyErr *err) {
    const int n = cJSON_IsArray(v) ? cJSON_GetArraySize(v) : -1;
    if (n >= 0 && (long)n == 2L * layers) *stride = 2;
    else if (n == layers) *stride = 1;
    else
        return zy_fail(err, "%s: legacy config: key \"%s\" must be a list of %ld entries (one per legacy layer) or %d "
                       "(one per attention/MoE pair)", label, key, 2L * layers, layers);
    return 0;
}

/* Sliding windows (RELEASES.md, Zyphra's converter): which native layers slide comes from "layer_types"
 * ("full_attention" / "sliding_attention") or "swa_layers" (the previous tokens a sliding layer sees, 0 for full
 * attention), and the native window W = that count + 1 (the legacy count leaves out the token itself). Both given:
 * they must agree. Sets slide[k] and *window; 0, or -1 with err naming the key. */
static int legacy_windows(const cJSON *root, int layers, unsigned char *slide, long *window, const char *label,
                          ZyErr *err) {
    const cJSON *swa = get(root, "swa_layers"), *types = get(root, "layer_types"), *sw = get(root, "sliding_window");
    const int have_swa = swa && !cJSON_IsNull(swa), have_types = types && !cJSON_IsNull(types);
    *window = 0;
    if (have_swa) {
        int stride = 1, i = 0;
        double count = 0;
        if (per_layer_list(swa, "swa_layers", layers, &stride, label, err)) return -1;
        const cJSON *it;
        cJSON_ArrayForEach(it, swa) {
            if (!cJSON_IsNumber(it) || it->valuedouble != floor(it->valuedouble) || it->valuedouble < 0 ||
                it->valuedouble >= 2147483647.0)
                return zy_fail(err, "%s: legacy config: key \"swa_layers[%d]\" must be a non-negative integer", label, i);
            if (i % stride == 0 && it->valuedouble > 0) {
                if (count && it->valuedouble != count)
                    return zy_fail(err, "%s: legacy config: key \"swa_layers\" has windows of %g and %g tokens; zaya "
                                   "needs one window for every sliding layer", label, count, it->valuedouble);
                count = it->valuedouble;
                slide[i / stride] = 1;
            }
            i++;
        }
        *window = count ? (long)count + 1 : 0;
    }
    if (have_types) {
        int stride = 1, i = 0;
        if (per_layer_list(types, "layer_types", layers, &stride, label, err)) return -1;
        const cJSON *it;
        cJSON_ArrayForEach(it, types) {
            if (i % stride == 0) {
                const int str = cJSON_IsString(it), sl = str && !strcmp(it->valuestring, "sliding_attention");
                if (!sl && !(str && !strcmp(it->valuestring, "full_attention")))
                    return zy_fail(err, "%s: legacy config: key \"layer_types[%d]\": unknown layer type %s%s%s (legacy "
                                   "layer types are \"full_attention\" and \"sliding_attention\")", label, i,
                                   str ? "\"" : "", str ? it->valuestring : "(not a string)", str ? "\"" : "");
                if (have_swa && sl != slide[i / stride])
                    return zy_fail(err, "%s: legacy config: keys \"layer_types\" and \"swa_layers\" disagree about "
                                   "native layer %d (legacy layer %d)", label, i / stride, i / stride * 2);
                slide[i / stride] = (unsigned char)sl;
            }
            i++;
        }
    }
    int any = 0; /* slide[] has `layers` entries once a list was read (per_layer_list checked its length) */
    for (int k = 0; (have_swa || have_types) && k < layers && !any; k++) any = slide[k];
    if (any && !*window)
        return zy_fail(err, "%s: legacy config: key \"layer_types\" has \"sliding_attention\" layers but no "
                       "\"swa_layers\" gives their window", label);
    if (!any && sw && !cJSON_IsNull(sw))
        return zy_fail(err, "%s: legacy config: key \"sliding_window\" is set but neither \"layer_types\" nor "
                       "\"swa_layers\" names a sliding-window layer", label);
    return 0;
}

cJSON *legacy_config_to_native(const cJSON *root, const char *label, ZyErr *err) {
    double vocab = 0, hidden = 0, head_dim = 0, heads = 0, kv_heads = 0, experts = 0, ffn = 0, router = 0, eps = 0;
    double topk = 0, maxpos = 0, theta = 0, rot = 0, layers = 0, init = 0, k0 = 0, k1 = 0;
    const cJSON *zl = get(root, "zaya_layers");
    if (must_be_bool(root, "cca", 1, label, err) || must_be_bool(root, "zaya_use_eda", 1, label, err) ||
        must_be_bool(root, "scale_residual_merge", 1, label, err) ||
        must_be_bool(root, "gated_linear_unit", 1, label, err) || must_be_bool(root, "add_bias_linear", 0, label, err))
        return NULL;
    const cJSON *act = get(root, "activation_func");
    if (act && !(cJSON_IsString(act) && !strcmp(act->valuestring, "swiglu"))) {
        zy_fail(err, "%s: legacy config: key \"activation_func\" must be \"swiglu\"", label);
        return NULL;
    }
    const cJSON *it;
    if (num(root, "vocab_size", 1, 0, 1, &vocab, label, err) || num(root, "hidden_size", 1, 0, 1, &hidden, label, err) ||
        num(root, "norm_epsilon", 0, 1e-5, 0, &eps, label, err) ||
        num(root, "moe_router_topk", 0, 1, 1, &topk, label, err) ||
        num(root, "max_position_embeddings", 1, 0, 1, &maxpos, label, err) ||
        num(root, "rope_theta", 0, 5e6, 0, &theta, label, err) ||
        num(root, "partial_rotary_factor", 0, 0.5, 0, &rot, label, err) ||
        num(root, "initializer_range", 0, 0.02, 0, &init, label, err) ||
        num(root, "cca_time0", 0, 2, 1, &k0, label, err) || num(root, "cca_time1", 0, 2, 1, &k1, label, err))
        return NULL;
    if (zl) { /* ZAYA1-base's per-layer schema: "a" an attention block, a number an MoE block of that many experts */
        if (!cJSON_IsArray(zl) || cJSON_GetArraySize(zl) == 0 || cJSON_GetArraySize(zl) % 2) {
            zy_fail(err, "%s: legacy config: key \"zaya_layers\" must be a list of attention/MoE pairs", label);
            return NULL;
        }
        int i = 0;
        experts = 0;
        cJSON_ArrayForEach(it, zl) {
            const int attn = cJSON_IsString(it) && !strcmp(it->valuestring, "a");
            const int moe = cJSON_IsNumber(it) && it->valuedouble >= 1 && it->valuedouble <= 65536 &&
                            it->valuedouble == floor(it->valuedouble);
            if (i % 2 == 0 ? !attn : !moe) {
                zy_fail(err, "%s: legacy config: key \"zaya_layers[%d]\" must be %s (layers alternate attention, "
                             "MoE)", label, i, i % 2 == 0 ? "\"a\"" : "an expert count");
                return NULL;
            }
            if (moe && experts && it->valuedouble != experts) {
                zy_fail(err, "%s: legacy config: key \"zaya_layers[%d]\": %g experts, earlier layers have %g; zaya "
                             "needs one expert count", label, i, it->valuedouble, experts);
                return NULL;
            }
            if (moe) experts = it->valuedouble;
            i++;
        }
        layers = i / 2; /* the list wins over num_hidden_layers, which can disagree */
        if (num(root, "cca_num_q_heads", 0, -1, 1, &heads, label, err)) return NULL;
        if (heads < 0 && num(root, "num_attention_heads", 1, 0, 1, &heads, label, err)) return NULL;
        if (get(root, "num_query_groups_list") ? uniform_list(root, "num_query_groups_list", &kv_heads, label, err)
                                               : num(root, "num_query_groups", 1, 0, 1, &kv_heads, label, err))
            return NULL;
        if (get(root, "ffn_hidden_size_list") ? uniform_list(root, "ffn_hidden_size_list", &ffn, label, err)
                                              : num(root, "ffn_hidden_size", 1, 0, 1, &ffn, label, err))
            return NULL;
        if (cJSON_IsArray(get(root, "zaya_mlp_expansion")) ? uniform_list(root, "zaya_mlp_expansion", &router, label, err)
                                                            : num(root, "zaya_mlp_expansion", 1, 0, 1, &router, label, err))
            return NULL;
    } else {
        if (num(root, "num_hidden_layers", 1, 0, 1, &layers, label, err) ||
            num(root, "num_attention_heads", 1, 0, 1, &heads, label, err) ||
            num(root, "num_experts", 1, 0, 1, &experts, label, err) ||
            num(root, "ffn_hidden_size", 1, 0, 1, &ffn, label, err) ||
            num(root, "zaya_mlp_expansion", 1, 0, 1, &router, label, err))
            return NULL;
        if (num(root, "num_key_value_heads", 0, -1, 1, &kv_heads, label, err)) return NULL;
        if (kv_heads < 0 && num(root, "num_query_groups", 1, 0, 1, &kv_heads, label, err)) return NULL;
        if (fmod(layers, 2) != 0) {
            zy_fail(err, "%s: legacy config: key \"num_hidden_layers\" is %g: legacy layers come in attention/MoE "
                         "pairs (an even count)", label, layers);
            return NULL;
        }
        layers /= 2;
    }
    if (num(root, "head_dim", 0, -1, 1, &head_dim, label, err)) return NULL;
    if (head_dim < 0 && num(root, "kv_channels", 1, 0, 1, &head_dim, label, err)) return NULL;
    if (fmod(ffn, 2) != 0) {
        zy_fail(err, "%s: legacy config: key \"ffn_hidden_size\" (%g) must be even (gate and up halves)", label, ffn);
        return NULL;
    }
    /* sliding windows, once the layer count is known (the per-layer lists are at most as long as the file) */
    const cJSON *swa = get(root, "swa_layers"), *types = get(root, "layer_types");
    long window = 0;
    double swa_theta = 0;
    unsigned char *slide = NULL;
    if ((swa && !cJSON_IsNull(swa)) || (types && !cJSON_IsNull(types)) || get(root, "sliding_window")) {
        const int lists = (cJSON_IsArray(swa) ? cJSON_GetArraySize(swa) : 0) +
                          (cJSON_IsArray(types) ? cJSON_GetArraySize(types) : 0);
        slide = calloc((size_t)(layers < lists ? layers : lists) + 1, 1); /* a list of another length is refused */
        if (!slide) {
            zy_fail(err, "%s: out of memory", label);
            return NULL;
        }
        if (legacy_windows(root, (int)layers, slide, &window, label, err) ||
            num(root, "swa_rotary_base", 0, 1e4, 0, &swa_theta, label, err)) {
            free(slide);
            return NULL;
        }
    }
    cJSON *n = cJSON_CreateObject();
    cJSON_AddStringToObject(n, "model_type", "zaya");
    cJSON_AddNumberToObject(n, "vocab_size", vocab);
    cJSON_AddNumberToObject(n, "hidden_size", hidden);
    cJSON_AddNumberToObject(n, "num_hidden_layers", layers);
    cJSON_AddNumberToObject(n, "num_attention_heads", heads);
    cJSON_AddNumberToObject(n, "num_key_value_heads", kv_heads);
    cJSON_AddNumberToObject(n, "head_dim", head_dim);
    cJSON_AddNumberToObject(n, "moe_intermediate_size", ffn / 2);
    cJSON_AddNumberToObject(n, "num_experts", experts);
    cJSON_AddNumberToObject(n, "num_experts_per_tok", topk);
    cJSON_AddNumberToObject(n, "router_hidden_size", router);
    cJSON_AddNumberToObject(n, "cca_time0", k0);
    cJSON_AddNumberToObject(n, "cca_time1", k1);
    cJSON_AddNumberToObject(n, "rms_norm_eps", eps);
    cJSON_AddNumberToObject(n, "max_position_embeddings", maxpos);
    if (window) { /* sliding layers: each layer type's RoPE, the native layer types and window */
        cJSON *rp = cJSON_AddObjectToObject(n, "rope_parameters");
        cJSON *hy = cJSON_AddObjectToObject(rp, "hybrid"), *hs = cJSON_AddObjectToObject(rp, "hybrid_sliding");
        cJSON_AddNumberToObject(hy, "rope_theta", theta);
        cJSON_AddNumberToObject(hy, "partial_rotary_factor", rot);
        cJSON_AddNumberToObject(hs, "rope_theta", swa_theta);
        cJSON_AddNumberToObject(hs, "partial_rotary_factor", rot);
        cJSON *lt = cJSON_AddArrayToObject(n, "layer_types");
        for (long k = 0; k < (long)layers; k++)
            cJSON_AddItemToArray(lt, cJSON_CreateString(slide[k] ? "hybrid_sliding" : "hybrid"));
        cJSON_AddNumberToObject(n, "sliding_window", (double)window);
    } else {
        cJSON_AddNumberToObject(n, "rope_theta", theta);
        cJSON_AddNumberToObject(n, "partial_rotary_factor", rot);
    }
    free(slide);
    cJSON_AddNumberToObject(n, "initializer_range", init);
    const cJSON *tie = get(root, "tie_word_embeddings");
    cJSON_AddBoolToObject(n, "tie_word_embeddings", tie ? cJSON_IsTrue(tie) : 1);
    static const char *const copied[] = {"bos_token_id", "eos_token_id", "pad_token_id", NULL};
    for (int i = 0; copied[i]; i++) {
        const cJSON *v = get(root, copied[i]);
        if (v) cJSON_AddItemToObject(n, copied[i], cJSON_Duplicate(v, 1));
    }
    return n;
}

/* ---- tensor names ---------------------------------------------------------------------------------------- */

static int starts(const char *s, const char *prefix, const char **rest) {
    size_t n = strlen(prefix);
    if (strncmp(s, prefix, n)) return 0;
    *rest = s + n;
    return 1;
}

int native_alias_name(const char *name, char *out, size_t cap) {
    const char *p = strstr(name, ".mlp.gate.router_mlp.rmsnorm_eda.");
    if (!p) return 0;
    snprintf(out, cap, "%.*s.mlp.gate.router_mlp.norm.%s", (int)(p - name), name,
             p + strlen(".mlp.gate.router_mlp.rmsnorm_eda."));
    return 1;
}

int legacy_tensor_name(const char *name, int num_layers, char *out, size_t cap, int *expert, ZyErr *err) {
    *expert = -1;
    const char *r;
    int n = -1;
    if (native_alias_name(name, out, cap)) return 0;
    if (starts(name, "model.final_norm.", &r))
        n = snprintf(out, cap, "model.norm.%s", r);
    else if (starts(name, "model.res_scale.", &r))
        n = snprintf(out, cap, "model.layers.%d.post_mlp_residual_scale.%s", num_layers - 1, r);
    else if (starts(name, "model.layers.", &r)) {
        char *end;
        long j = strtol(r, &end, 10);
        if (end == r || *end != '.' || j < 0 || j >= 2L * num_layers)
            return zy_fail(err, "legacy tensor \"%s\": layer index outside the %d legacy layers", name, 2 * num_layers);
        r = end + 1;
        const long k = j / 2;
        const char *t;
        if (j % 2 == 0) { /* attention block */
            static const struct {
                const char *legacy, *native;
            } qkv[] = {{"linear_q.", "q_proj."}, {"linear_k.", "k_proj."}, {"val_proj1.", "v_proj_current."},
                       {"val_proj2.", "v_proj_delayed."}, {"conv_qk.0.", "conv_qk_depthwise."},
                       {"conv_qk.1.", "conv_qk_grouped."}};
            if (starts(r, "self_attn.qkv.", &t)) {
                if (!strcmp(t, "temp")) {
                    n = snprintf(out, cap, "model.layers.%ld.self_attn.qk_norm.temp", k);
                } else {
                    for (size_t i = 0; i < sizeof qkv / sizeof *qkv && n < 0; i++) {
                        const char *u;
                        if (starts(t, qkv[i].legacy, &u))
                            n = snprintf(out, cap, "model.layers.%ld.self_attn.qkv_proj.%s%s", k, qkv[i].native, u);
                    }
                    if (n < 0) n = snprintf(out, cap, "model.layers.%ld.self_attn.qkv_proj.%s", k, t);
                }
            } else if (starts(r, "self_attn.", &t)) {
                n = snprintf(out, cap, "model.layers.%ld.self_attn.%s", k, t);
            } else if (starts(r, "input_norm.", &t)) {
                n = snprintf(out, cap, "model.layers.%ld.input_layernorm.%s", k, t);
            } else if (starts(r, "res_scale.", &t)) {
                if (k == 0) { /* the embedding's scale: legacy layer 0 has no residual_* */
                    if (strncmp(t, "hidden_states_", 14))
                        return zy_fail(err, "legacy tensor \"%s\": layer 0 has only hidden_states_{scale,bias}", name);
                    n = snprintf(out, cap, "model.input_%s", t);
                } else {
                    n = snprintf(out, cap, "model.layers.%ld.post_mlp_residual_scale.%s", k - 1, t);
                }
            }
        } else { /* MoE block */
            static const char *const mlp[] = {"fc1.", NULL, "fc2.", NULL, "out_proj."};
            if (starts(r, "input_norm.", &t)) {
                n = snprintf(out, cap, "model.layers.%ld.post_attention_layernorm.%s", k, t);
            } else if (starts(r, "res_scale.", &t)) {
                n = snprintf(out, cap, "model.layers.%ld.post_attention_residual_scale.%s", k, t);
            } else if (starts(r, "zaya_block.router.rmsnorm_eda.", &t)) {
                n = snprintf(out, cap, "model.layers.%ld.mlp.gate.router_mlp.norm.%s", k, t);
            } else if (starts(r, "zaya_block.router.router_mlp.", &t)) {
                const long i = strtol(t, &end, 10);
                if (end == t || *end != '.' || i < 0 || i > 4 || !mlp[i])
                    return zy_fail(err, "legacy tensor \"%s\": router_mlp has layers 0, 2 and 4", name);
                n = snprintf(out, cap, "model.layers.%ld.mlp.gate.router_mlp.%s%s", k, mlp[i], end + 1);
            } else if (starts(r, "zaya_block.router.", &t)) {
                n = snprintf(out, cap, "model.layers.%ld.mlp.gate.%s", k, t);
            } else if (starts(r, "zaya_block.experts.local_experts.", &t)) {
                const long e = strtol(t, &end, 10);
                if (end == t || *end != '.' || e < 0 || e > 1 << 20)
                    return zy_fail(err, "legacy tensor \"%s\": no expert index", name);
                *expert = (int)e;
                if (!strcmp(end + 1, "linear_fc1.weight"))
                    n = snprintf(out, cap, "model.layers.%ld.mlp.experts.gate_up_proj", k);
                else if (!strcmp(end + 1, "linear_fc2.weight"))
                    n = snprintf(out, cap, "model.layers.%ld.mlp.experts.down_proj", k);
                else
                    return zy_fail(err, "legacy tensor \"%s\": an expert has linear_fc1.weight and linear_fc2.weight only",
                                   name);
            }
        }
    } else {
        n = snprintf(out, cap, "%s", name); /* model.embed_tokens.weight, lm_head.weight */
    }
    if (n < 0) return zy_fail(err, "legacy tensor \"%s\" has no place in the native layout", name);
    if ((size_t)n >= cap) return zy_fail(err, "legacy tensor \"%s\": name too long", name);
    return 0;
}
