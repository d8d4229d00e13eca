/* model: ZAYA1 (docs/model.md) — parameters, forward, backward. model.c reads like the spec. */
#ifndef ZAYA_MODEL_H
#define ZAYA_MODEL_H

#include <stdint.h>

#include "model/config.h"
#include "kernels/kernels.h"
#include "kernels/matmul.h"
#include "model/params.h"
#include "util/util.h"

/* Pointers into one arena (parameters or gradients) for one decoder layer. */
typedef struct {
    float *input_norm;                                   /* input_layernorm.weight [D] */
    float *w_q, *w_k, *w_v_current, *w_v_delayed;         /* qkv_proj.* [Cq,D] [Ck,D] [Ck/2,D] [Ck/2,D] */
    float *conv_dw_w, *conv_dw_b;                        /* conv_qk_depthwise [C,1,k0], [C] */
    float *conv_gr_w, *conv_gr_b;                        /* conv_qk_grouped [C,dh,k1], [C] */
    const uint16_t *conv_gr_w16; /* conv_gr_w's values in bf16, which decoding reads (model_conv_twins); else NULL */
    float *temp;                                         /* qk_norm.temp [Hkv] */
    float *w_o;                                          /* o_proj [D,Cq] */
    float *w_v;                                          /* MHA variant: self_attn.v_proj [Ck,D] (q/k in w_q/w_k) */
    float *attn_hs, *attn_hb, *attn_rs, *attn_rb;        /* post_attention_residual_scale [D] x4 */
    float *post_norm;                                    /* post_attention_layernorm [D] */
    float *router_down_w, *router_down_b;                /* mlp.gate.down_proj [R,D], [R] */
    float *router_state_scale;                           /* γ [R]; NULL at layer 0 */
    float *router_norm;                                  /* router_mlp.norm [R] */
    float *router_fc1_w, *router_fc1_b, *router_fc2_w, *router_fc2_b; /* [R,R], [R] */
    float *router_out_w;                                 /* router_mlp.out_proj [E+1,R] */
    float *router_w;                                     /* linear-router variant: mlp.gate.weight [classes,D] */
    float *balancing_bias;                               /* [classes] buffer, not trained; NULL for a dense MLP */
    float *expert_gate_up, *expert_down;                 /* [E,2I,D], [E,D,I]; dense variant: [2I,D], [D,I] */
    float *mlp_hs, *mlp_hb, *mlp_rs, *mlp_rb;            /* post_mlp_residual_scale [D] x4 */
    /* bf16 weights (model_use_bf16, which clears the fp32 pointers above; NULL otherwise) */
    const uint16_t *w_q16, *w_k16, *w_v_current16, *w_v_delayed16, *w_o16, *w_v16;
    const uint16_t *router_down_w16, *router_fc1_w16, *router_fc2_w16, *router_out_w16, *router_w16;
    const uint16_t *expert_gate_up16, *expert_down16;
    /* quantized weights (a quantized folder read in place: model_bind_views; the codes NULL otherwise) */
    ZyQuantMatrix w_q_quant, w_k_quant, w_v_current_quant, w_v_delayed_quant, w_o_quant, w_v_quant;
    ZyQuantMatrix router_down_w_quant, router_fc1_w_quant, router_fc2_w_quant, router_out_w_quant, router_w_quant;
    ZyQuantMatrix expert_gate_up_quant, expert_down_quant;
} LayerWeights;

/* A weight matrix of LayerWeights or Weights as the products take it: its fp32 view p, its bf16 twin (the field of
 * the same name suffixed 16) and its quantized one (suffixed _quant): WEIGHT_VIEWS(W->w_q) = {W->w_q, W->w_q16,
 * W->w_q_quant}. */
#define WEIGHT_VIEWS(p) ((ZyWeights){.f32 = (p), .bf16 = p##16, .quant = p##_quant})

/* The CCA convolutions' shape (kernels.h) for B sequences of T rows of cfg's model. */
static inline ZyConvShape model_conv_shape(const ZayaConfig *cfg, int B, int T) {
    return (ZyConvShape){.B = B, .T = T, .C = cfg_conv_channels(cfg), .dh = cfg->head_dim, .k0 = cfg->cca_time0,
                         .k1 = cfg->cca_time1};
}

typedef struct {
    float *embed;                  /* model.embed_tokens.weight [V,D] */
    float *in_scale, *in_bias;     /* model.input_hidden_states_{scale,bias} [D] */
    LayerWeights *layers;
    float *final_norm;             /* model.norm.weight [D] */
    float *lm_head;                /* lm_head.weight [V,D], or == embed when tied */
    const uint16_t *embed16, *lm_head16; /* bf16 weights (model_use_bf16; NULL otherwise) */
    ZyQuantMatrix embed_quant, lm_head_quant; /* quantized weights (model_bind_views; the codes NULL otherwise) */
} Weights;

typedef struct {
    ZayaConfig cfg;
    ParamTable params;
    Weights w; /* views of params.data */
    Weights g; /* views of params.grad (same layout) */
    uint16_t *bf16; /* model_use_bf16: a bf16 arena with params.data's layout (NULL: fp32 weights) */
    uint16_t *conv16; /* model_conv_twins: the grouped convolution kernels' bf16 copies (NULL: none) */
    /* model_bind_views: what the views point into (mapped files, converted copies), released by model_free */
    void *owner;
    void (*owner_free)(void *owner);
    /* zaya_residual_scaling false: every layer's residual scales/biases point at these constants (ones, zeros),
     * so a merge is exactly h + x, and their gradients land in a sink nobody reads ([D] each; else NULL) */
    float *unit_scale, *zero_bias, *merge_grad_sink;
} Model;

/* The tensor table (names, shapes, optimizer, init) of cfg's model, without allocating the arenas. */
int model_param_table(ParamTable *t, const ZayaConfig *cfg, ZyErr *err);
/* Builds the tensor table for cfg and allocates zeroed parameters and gradients. */
int model_create(Model *m, const ZayaConfig *cfg, ZyErr *err);
void model_free(Model *m);
/* Inference from weights that live elsewhere (model_io's mapped load): the tensor table of cfg without any arena
 * (params.data and params.grad stay NULL, so an 8B model does not need its 35 GB fp32 arena), then
 * model_bind_views binds m->w: for the matrices model_holds_bf16 accepts, quantized codes tq[i] where tq (may be
 * NULL) has them (tq[i].q non-NULL), else bf16 values t16[i] where t16 (may be NULL) has them — the fp32 views then
 * stay NULL, as after model_use_bf16 — and every other tensor's fp32 values at t32[i]. Inference only; m->g stays
 * unbound. m->owner/owner_free (set by the caller) keep the memory alive until model_free. */
int model_create_views(Model *m, const ZayaConfig *cfg, ZyErr *err);
int model_bind_views(Model *m, float *const *t32, const uint16_t *const *t16, const ZyQuantMatrix *tq, ZyErr *err);
/* The embedding of `tokens` from whichever view w holds (fp32, bf16, or quantized: only the rows used
 * dequantized): x [N, D] = (E[token] + in_bias) · in_scale. */
void model_embed(const Weights *w, float *x, const int32_t *tokens, int N, int D);
/* The tensors bf16 inference keeps in bf16: every matrix a product reads (2+ dims, but not the convolution kernels,
 * which the convolution reads as fp32 rounded to bf16 values). */
int model_holds_bf16(const ParamInfo *p);
/* bf16 weights for inference (`--dtype bf16`): the matrices (projections, router matrices, experts, embedding /
 * head) move to a bf16 arena (nearest even) and their fp32 pages are given back to the system (their pointers in
 * m->w are cleared); the convolution kernels are rounded to bf16 values but stay fp32; vectors (norms, biases,
 * residual scales) stay fp32, as do activations, the KV cache and every accumulation. Inference only: no backward
 * or optimizer step afterwards. Returns the number of tensors rounded, or -1. */
int model_use_bf16(Model *m, ZyErr *err);
/* model_use_bf16 in steps, for a loader that converts each tensor as soon as its values are in (so the whole model
 * never sits in fp32): begin (allocates the bf16 arena), convert tensor i (returns 1 if it was rounded), finish
 * (switches the weight views to bf16) once every tensor is converted. */
int model_bf16_begin(Model *m, ZyErr *err);
int model_bf16_convert(Model *m, int i);
void model_bf16_finish(Model *m);
/* Inference weights (model_bf16_finish and model_bind_views call it): every layer's grouped convolution kernel whose
 * fp32 values are all bf16 values (a bf16 or quantized folder's, or rounded by model_use_bf16) gets a bf16 copy,
 * conv_gr_w16, that cached decoding's convolution reads instead: half the bytes, the same values and sums. The fp32
 * view stays for the full forward (and the GPU upload). Without memory for the copies there are none. Returns the
 * bytes allocated for them (0: none made, or made before). */
size_t model_conv_twins(Model *m);
/* Inference only: frees the gradient arena (as large as the weights) and clears m->g. */
void model_drop_grads(Model *m);
/* The weights inference runs on (model_load_dir_as): fp32, bf16, or a quantized folder's 8- or 4-bit codes read in
 * place (the value is the bits). */
typedef enum { MODEL_DTYPE_F32 = 0, MODEL_DTYPE_BF16 = 1, MODEL_DTYPE_Q4 = 4, MODEL_DTYPE_Q8 = 8 } ModelDtype;
/* Parses a --dtype value ("f32"/"fp32"/"float32" -> 0, "bf16"/"bfloat16" -> 1); -1 with an error otherwise. */
int model_parse_dtype(const char *s, const char *flag, ZyErr *err);

/* Initialises every parameter for training from scratch (docs/model.md), deterministically from seed. */
void model_init_weights(Model *m, uint64_t seed);
/* Values [first, first + count) of tensor p's initialisation (model_init_weights' for that range, drawn from *rng in
 * order: the normals' transforms on every core, the same values at any thread count). */
void model_init_values(const ParamInfo *p, double std, ZyRng *rng, size_t first, size_t count, float *out);

/* Where a training step's time goes (zaya bench train): accumulated when Activations.phase_seconds is set. */
typedef enum { PHASE_ATTENTION, PHASE_ROUTER, PHASE_EXPERTS, PHASE_NORMS, PHASE_HEAD, MODEL_PHASES } ModelPhase;

/* The buffers of one MoE block over N token rows (the block is position-independent, so the full forward and
 * cached decoding share it). h1_pre/h2_pre may alias h1/h2 when no backward pass follows. */
typedef struct {
    const float *u;                                      /* input RMSNorm(x) [N,D] */
    float *z, *zn, *rstd;                                /* router state after EDA [N,R]; RMSNorm(z); 1/rms [N] */
    float *h1_pre, *h1, *h2_pre, *h2;                    /* router MLP [N,R] */
    float *logits, *probs;                               /* [N,E+1] */
    int32_t *choice;                                     /* chosen expert, E = skip [N] */
    float *gate;                                         /* p[choice] [N] */
    int32_t *expert_offset, *expert_cursor, *sorted_rows; /* [E+1], [E+1], [N] */
    float *expert_in, *expert_gu, *expert_act, *expert_out; /* [N,D], [N,2I], [N,I], [N,D] */
    float *out;                                          /* gate · expert output, 0 for skipped rows [N,D] */
    double *phase_seconds;                               /* optional [MODEL_PHASES] timers (NULL: off) */
    ZyGemmCtx *gemm;                                     /* precision of the matrix products (NULL: fp32) */
} MoeBuffers;

/* z = u W_downᵀ + b (+ r_prev ⊙ γ), the router MLP, biased top-1 choice, dropless SwiGLU experts. */
void moe_block_forward(const ZayaConfig *c, const LayerWeights *W, const MoeBuffers *b, const float *r_prev, int N);

/* Saved activations of one layer for a batch [B, T]; N = B*T rows. */
typedef struct {
    float *x_in, *u_attn, *rstd_attn;                    /* residual in; RMSNorm(x) [N,D]; 1/rms [N] */
    float *qk_down;                                      /* X = [q0 | k0] [N,C] */
    float *conv_mid;                                     /* depthwise output M [B*(T+k1-1), C] */
    float *conv_out;                                     /* grouped output Y [N,C] */
    float *query_pre, *key_pre;                          /* after the q-k mean skip [N,Cq], [N,Ck] */
    float *q_norm, *k_norm;                              /* L2 norms [N,Hq], [N,Hkv] */
    float *query, *key;                                  /* normalised + RoPE [N,Cq], [N,Ck] */
    float *v_current, *v_delayed, *value;                /* [N,Ck/2] x2, [N,Ck] */
    float *lse;                                          /* attention log-sum-exp per query row [B,Hq,T] */
    float *attn_out;                                     /* concat_h o_h [N,Cq] */
    float *attn_proj;                                    /* o_proj output [N,D] */
    float *x_mid, *u_mlp, *rstd_mlp;                     /* after attention merge; RMSNorm [N,D]; [N] */
    float *router_z;                                     /* z (after EDA) = r_next [N,R] */
    float *router_zn, *router_rstd;                      /* RMSNorm(z) [N,R], [N] */
    float *router_h1_pre, *router_h1, *router_h2_pre, *router_h2; /* [N,R] */
    float *router_logits, *router_probs;                 /* [N,E+1] */
    int32_t *choice;                                     /* chosen expert, E = skip [N] */
    float *gate;                                         /* p[choice] [N] */
    int32_t *expert_offset;                              /* [E+1]: rows of expert e are sorted_rows[off[e]..off[e+1]) */
    int32_t *expert_cursor;                              /* [E] scratch for the counting sort */
    int32_t *sorted_rows;                                /* token rows grouped by expert (skip excluded) [N] */
    float *expert_in;                                    /* gathered u rows [N,D] */
    float *expert_gu;                                    /* [N,2I] */
    float *expert_act;                                   /* silu(g)*v [N,I] */
    float *expert_out;                                   /* before the gate [N,D] */
    float *moe_out;                                      /* gate * expert_out scattered back [N,D] */
} LayerActs;

/* The MoE block's buffers for N rows, carved into L in this order: router_zn, [router_rstd, router_h1_pre,]
 * router_h1, [router_h2_pre,] router_h2, router_logits ... moe_out (u_mlp and router_z are the caller's: training
 * keeps one z per layer, decoding two that alternate). for_backward: the bracketed buffers are carved, as the
 * backward pass reads them; without, the GELUs run in place (h1_pre = h1, h2_pre = h2) and router_rstd is left to
 * the caller, so the CPU decode step's scratch stays that small. The full forward and both decode steps share it. */
void layer_acts_carve_moe(ZyCarver *cv, LayerActs *L, const ZayaConfig *c, size_t N, int for_backward);
/* L's MoE buffers as moe_block_forward takes them. */
MoeBuffers moe_buffers_of(const LayerActs *L, double *phase_seconds, ZyGemmCtx *gemm);

/* Gradient scratch for the backward pass (shared by all layers). */
typedef struct {
    float *d_x, *d_u, *d_h;                              /* [N,D] */
    float *d_qk_down, *d_conv_out, *d_conv_mid;          /* [N,C], [N,C], [B*(T+k1-1),C] */
    float *d_query, *d_key, *d_value, *d_vc, *d_vd;      /* [N,Cq], [N,Ck], [N,Ck], [N,Ck/2] x2 */
    float *d_attn_out;                                   /* [N,Cq] */
    float *d_z, *d_z_carry, *d_zn, *d_h1, *d_h2;         /* [N,R] */
    float *d_router_logits, *d_gate;                     /* [N,E+1], [N] */
    float *d_expert_out, *d_expert_act, *d_expert_gu, *d_expert_in; /* [N,D], [N,I], [N,2I], [N,D] */
    float *d_final, *d_logits;                           /* [N,D], [N,V] */
} BackwardScratch;

typedef struct {
    int B, T;
    int32_t *tokens;           /* [N] copy of the batch */
    LayerActs *layers;
    float *x_final;            /* residual stream after the last layer [N,D] */
    float *final_normed, *final_rstd;
    float *logits;             /* [N,V] */
    float *row_loss;           /* [N] per-position loss (scratch of the cross-entropy) */
    float *rope_cos, *rope_sin; /* [T, rd/2] */
    float *rope_cos_sliding, *rope_sin_sliding; /* the sliding layers' (rope_parameters.hybrid_sliding) [T, rd'/2];
                                                 * NULL without sliding layers */
    float *conv_wp, *conv_dwp; /* cca_conv workspaces (repacked grouped-conv weights and their gradient) */
    float *attn_work;          /* flash-attention tile scratch for up to attn_threads threads */
    int attn_threads;
    BackwardScratch d;
    double *phase_seconds;     /* optional [MODEL_PHASES] time accumulators, set by the caller (NULL: off) */
    ZyGemmCtx *gemm;           /* how the matrix products compute (fp32, or bf16 inputs) and their scratch */
    void *block;               /* one allocation behind everything above */
    long gpu_attn_work_floats; /* > 0: the buffers live on a GPU (src/gpu/gpu_model.c), which needs this much
                                * attention scratch and none of the CPU kernels' workspaces */
} Activations;

int acts_create(Activations *a, const ZayaConfig *cfg, int B, int T, ZyErr *err);
/* "precision": "bf16": the projections, router, experts and head — forward and backward — multiply bf16-rounded
 * inputs with fp32 accumulation (matmul.h, zy_gemm_ctx); the weights, gradients, optimizer state and every other
 * op stay fp32 (the convolutions and attention included). products: how (ZyBf16Products; FP32, the default, for
 * fp32 products). */
void acts_set_bf16(Activations *a, ZyBf16Products products);
void acts_free(Activations *a);
/* The activation layout over one block at `base` (NULL: sizing only): sets every buffer pointer of a (B, T,
 * attn_threads and gpu_attn_work_floats set by the caller) and returns the bytes the block needs. acts_create uses
 * it on host memory, the GPU model on device memory. */
size_t acts_carve(Activations *a, const ZayaConfig *cfg, void *base);
/* Views of a parameter arena laid out like m->params (the same walk as m->w and m->g), e.g. one on a GPU. Residual
 * scales of a no_residual_scaling model stay NULL (the caller binds its own constants). */
void model_bind_weights(const Model *m, float *base, Weights *out);
/* The same from a pointer per tensor of m->params (ptrs[i] for tensor i, NULL allowed): per-tensor companions of the
 * weights, e.g. calibration statistics, reached through the fields the forward reads (out->layers is the caller's). */
void model_bind_tensors(const Model *m, float *const *ptrs, Weights *out);

/* Checks token ids (0 <= id < V) and T against max_position_embeddings; errors name the offending index. */
int model_check_tokens(const Model *m, const int32_t *tokens, int B, int T, ZyErr *err);
/* Forward pass for tokens [B,T] (already checked); fills a->logits [B*T, V]. */
void model_forward(Model *m, Activations *a, const int32_t *tokens);
/* Mean cross-entropy of a->logits against targets [B*T] (-1 = ignored); 0 when no target counts. */
double model_loss(const Model *m, Activations *a, const int32_t *targets);
/* Backward pass of the mean cross-entropy against targets; ACCUMULATES into m->params.grad. Requires the
 * forward pass on the same Activations. Returns the loss. */
double model_backward(Model *m, Activations *a, const int32_t *targets);

/* Training FLOPs per token at sequence length T: 6 × active matrix parameters (q, k, v, o, the grouped conv,
 * the router's matrices, one expert, the head) plus 6 × L × Hq × dh × T for attention scores and values (the
 * llm.c convention: the causal half is counted as whole); a sliding layer counts min(T, W) keys instead of T. */
double model_train_flops_per_token(const ZayaConfig *c, int T);

/* Next-token targets for a [B,T] batch: targets[b,t] = tokens[b,t+1], -1 at t = T-1. */
void make_next_token_targets(int32_t *targets, const int32_t *tokens, int B, int T);

#endif
