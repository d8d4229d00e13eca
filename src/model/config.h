/* config: the model's shape, loaded from / saved as a Hugging Face config.json (model_type "zaya"). */
#ifndef ZAYA_CONFIG_H
#define ZAYA_CONFIG_H

/* The most layers a config may have (ZAYA1-8B has 40, the 74B preview 80): bounds what a config allocates. */
#define ZY_MAX_LAYERS 4096

#include <stdint.h>

#include "util/util.h"

typedef enum {
    ZY_ATTN_CCA = 0, /* compressed convolutional attention (CCGQA when num_key_value_heads < num_attention_heads) */
    ZY_ATTN_MHA,     /* standard softmax attention: q/k/v projections, RoPE, o_proj (GQA when Hkv < Hq) */
} ZyAttentionKind;
typedef enum {
    ZY_ROUTER_MLP = 0, /* ZAYA: down-projection, EDA depth state, RMSNorm, 2-layer GELU MLP */
    ZY_ROUTER_LINEAR,  /* logits = RMSNorm(x) W^T, one matrix, no depth state */
} ZyRouterKind;
typedef enum {
    ZY_MOE_SKIP = 0, /* top-1 over E experts plus the skip expert */
    ZY_MOE_NOSKIP,   /* top-1 over E experts, no skip class */
    ZY_MOE_DENSE,    /* one dense SwiGLU MLP of moe_intermediate_size (the active parameters of top-1), no router */
} ZyMoeKind;

typedef struct {
    int vocab_size;              /* V */
    int hidden_size;             /* D */
    int num_layers;              /* L (num_hidden_layers) */
    int num_heads;               /* Hq (num_attention_heads) */
    int num_kv_heads;            /* Hkv (num_key_value_heads) */
    int head_dim;                /* dh */
    int num_experts;             /* E (routed; the skip expert is index E) */
    int moe_intermediate_size;   /* I */
    int router_hidden_size;      /* R */
    int cca_time0, cca_time1;    /* k0 (depthwise) and k1 (grouped) conv kernel sizes */
    float rms_norm_eps;
    int tie_word_embeddings;
    int max_position_embeddings;
    float rope_theta;
    float partial_rotary_factor;
    float initializer_range;
    int bos_token_id, eos_token_id, pad_token_id; /* -1 when absent / null */
    /* zaya research variants for ablations (config keys "zaya_attention", "zaya_router", "zaya_moe",
     * "zaya_residual_scaling"); the zero values are ZAYA1, and only ZAYA1 exports to transformers. */
    ZyAttentionKind attention;
    ZyRouterKind router;
    ZyMoeKind moe;
    int no_residual_scaling; /* 1: plain residual adds, no learned residual scales/biases */
    /* read from a legacy (Megatron-style) config.json: the weights beside it carry legacy tensor names (legacy.h);
     * zaya writes the native schema and names */
    int legacy_layout;
    /* "quantization": the folder's matrices are MLX affine group-quantized (kernels/quant.h) with these defaults; 0 =
     * not quantized. Per-module entries of that object (mlx-lm's fine-grained form) are read by io/quant_io.c. */
    int quant_bits, quant_group_size;
    /* Sliding-window layers (layer_types "hybrid_sliding"; semantics in the comment above cfg_layer_window).
     * sliding_window: W, the whole span a windowed query sees, itself included (config key "sliding_window";
     * 0 when absent or null). rope_theta_sliding, partial_rotary_factor_sliding: the sliding layers' RoPE,
     * rope_parameters.hybrid_sliding; both 0 when the config has no such entry and no sliding layer (config_to_json
     * then writes none, so a config reads back equal). sliding_layers: bit l set when layer l is "hybrid_sliding" (a layer
     * >= ZY_MAX_SLIDING_LAYERS cannot be). All zero: every layer full attention, as before. */
    int sliding_window;
    float rope_theta_sliding;
    float partial_rotary_factor_sliding;
#define ZY_MAX_SLIDING_LAYERS 1024
    uint64_t sliding_layers[ZY_MAX_SLIDING_LAYERS / 64];
} ZayaConfig;

/* 1 when every research variant is at its ZAYA1 value, i.e. transformers' ZayaForCausalLM loads the model. */
static inline int cfg_is_zaya1(const ZayaConfig *c) {
    return c->attention == ZY_ATTN_CCA && c->router == ZY_ROUTER_MLP && c->moe == ZY_MOE_SKIP && !c->no_residual_scaling;
}
/* Router classes per MoE layer: E + 1 with the skip expert, E without, 0 for a dense MLP (no routing). */
static inline int cfg_router_classes(const ZayaConfig *c) {
    return c->moe == ZY_MOE_DENSE ? 0 : c->moe == ZY_MOE_NOSKIP ? c->num_experts : c->num_experts + 1;
}
const char *cfg_attention_name(ZyAttentionKind k);
const char *cfg_router_name(ZyRouterKind k);
const char *cfg_moe_name(ZyMoeKind k);

/* Derived sizes. */
static inline int cfg_q_channels(const ZayaConfig *c) { return c->num_heads * c->head_dim; }      /* Cq */
static inline int cfg_k_channels(const ZayaConfig *c) { return c->num_kv_heads * c->head_dim; }   /* Ck */
static inline int cfg_conv_channels(const ZayaConfig *c) { return cfg_q_channels(c) + cfg_k_channels(c); }
static inline int cfg_rotary_dim(const ZayaConfig *c) { return (int)(c->head_dim * c->partial_rotary_factor); }
static inline int cfg_conv_pad(const ZayaConfig *c) { return (c->cca_time0 - 1) + (c->cca_time1 - 1); }

/* ---- Sliding-window attention, as transformers' ZayaForCausalLM (models/zaya, transformers 5.x) runs it ----
 * Native config.json: "layer_types" lists one entry per layer, "hybrid" (full causal attention) or
 * "hybrid_sliding" (windowed); absent or null means all "hybrid". Any "hybrid_sliding" layer needs an integer
 * "sliding_window" W (transformers refuses null; zaya also refuses W <= 0, which would leave a query nothing to
 * see). The mask is masking_utils.sliding_window_causal_mask_function: causal AND kv_idx > q_idx - W, so a query at
 * position p sees keys p-W+1 .. p — W keys, itself included (W = 1: only itself; W >= T: plain causal). The only
 * other difference of a sliding layer is its RoPE: the rotary tables come from rope_parameters["hybrid_sliding"]
 * (rope_theta, and partial_rotary_factor, which transformers defaults to 1.0 when that entry omits it), not
 * ["hybrid"]; transformers' default rope_parameters carry {"hybrid_sliding": {rope_theta 1e4, factor 0.5}}, and a
 * rope_parameters without the entry fails to load there once a sliding layer exists (so zaya refuses it).
 * Everything else (CCA, values, QK norm, MoE, residuals) is the same in both layer types. "sliding_attention" /
 * "full_attention" are the legacy schema's names and are not native layer types (transformers: KeyError).
 * Legacy config.json (Zyphra's convert_zaya_weights_to_hf.py, RELEASES.md; legacy.c): per legacy layer (attention
 * and MoE alternate, the attention block of native layer k is legacy layer 2k) either "layer_types"
 * ("full_attention" / "sliding_attention", of legacy or native length; the legacy list read every second entry)
 * or "swa_layers" (0: full attention, n > 0: sliding with n previous tokens). A legacy window counts the previous
 * tokens only, so the native W = n + 1 (vLLM's Zyphra model adds the same 1); zaya needs one n for every sliding
 * layer. The sliding layers' RoPE theta is "swa_rotary_base" (default 1e4), the factor "partial_rotary_factor".
 * Cached decoding (decode.c, and gpu_decode.c on a GPU) attends to a sliding layer's last W keys and rotates with
 * that layer's own tables (cfg_layer_rope_theta, cfg_layer_rotary_dim); so do the GPU model's forward and backward
 * (gpu_model.c, the fp32 attention kernels with a window). */

/* 1 when layer l is a sliding-window layer. */
static inline int cfg_layer_is_sliding(const ZayaConfig *c, int l) {
    return l >= 0 && l < ZY_MAX_SLIDING_LAYERS && (c->sliding_layers[l / 64] >> (l % 64) & 1);
}
/* 0 for a full-attention layer, W (the keys p-W+1..p a query at p sees) for a sliding-window layer. */
static inline int cfg_layer_window(const ZayaConfig *c, int l) {
    return cfg_layer_is_sliding(c, l) ? c->sliding_window : 0;
}
static inline void cfg_set_layer_sliding(ZayaConfig *c, int l, int sliding) {
    if (l < 0 || l >= ZY_MAX_SLIDING_LAYERS) return;
    if (sliding)
        c->sliding_layers[l / 64] |= (uint64_t)1 << (l % 64);
    else
        c->sliding_layers[l / 64] &= ~((uint64_t)1 << (l % 64));
}
/* 1 when any layer is a sliding-window layer. */
static inline int cfg_has_sliding(const ZayaConfig *c) {
    for (int i = 0; i < ZY_MAX_SLIDING_LAYERS / 64; i++)
        if (c->sliding_layers[i]) return 1;
    return 0;
}
/* The RoPE of layer l: theta and rotary dim (the "hybrid_sliding" parameters for a sliding layer). */
static inline float cfg_layer_rope_theta(const ZayaConfig *c, int l) {
    return cfg_layer_is_sliding(c, l) ? c->rope_theta_sliding : c->rope_theta;
}
static inline int cfg_sliding_rotary_dim(const ZayaConfig *c) {
    return (int)(c->head_dim * c->partial_rotary_factor_sliding);
}
static inline int cfg_layer_rotary_dim(const ZayaConfig *c, int l) {
    return cfg_layer_is_sliding(c, l) ? cfg_sliding_rotary_dim(c) : (int)(c->head_dim * c->partial_rotary_factor);
}

/* Parses config.json text; errors name the file (label) and the key. */
int config_parse(ZayaConfig *cfg, const char *json_text, const char *label, ZyErr *err);
int config_load(ZayaConfig *cfg, const char *path, ZyErr *err);
/* Checks every size and combination; called by config_parse, exposed for configs built in code. */
int config_validate(const ZayaConfig *cfg, const char *label, ZyErr *err);
/* Writes a config.json that transformers loads as ZayaConfig (atomic); torch_dtype names the weights' dtype
 * ("float32" or "bfloat16"). */
int config_save(const ZayaConfig *cfg, const char *path, const char *torch_dtype, ZyErr *err);
/* Serialises to a malloc'ed JSON string. */
char *config_to_json(const ZayaConfig *cfg, const char *torch_dtype);

#endif
