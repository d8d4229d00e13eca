/* config: the model's shape, loaded from / saved as a Hugging Face config.json (model_type "zaya"). */
#ifndef ZAYA_CONFIG_H
#define ZAYA_CONFIG_H

#include "util.h"

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
