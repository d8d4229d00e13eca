/* config: the model's shape, loaded from / saved as a Hugging Face config.json (model_type "zaya"). */
#ifndef ZAYA_CONFIG_H
#define ZAYA_CONFIG_H

#include "util.h"

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
} ZayaConfig;

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
