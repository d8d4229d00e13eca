/* The ZAYA1 model (docs/model.md): parameter layout, forward and backward. */
#include "model/model.h"

#include <math.h>
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/attention.h"
#include "kernels/kernels.h"
#include "kernels/matmul.h"

/* ======================================================================================================
 * Parameter layout. One walk over the model registers every tensor (HF name, shape, optimizer, init) and,
 * run again over an arena, hands out the pointers, so names and shapes are written exactly once.
 * ====================================================================================================== */

typedef struct {
    ParamTable *table;
    float *base; /* NULL: registering; else binding views into this arena */
    float *const *ptrs; /* binding views from a per-tensor pointer table instead (model_bind_views) */
    int cursor;
    ZyErr *err;
    int failed;
} LayoutWalk;

static float *tensor(LayoutWalk *w, ParamKind kind, ParamInit init, int ndim, int64_t d0, int64_t d1, int64_t d2,
                     const char *fmt, ...) __attribute__((format(printf, 8, 9)));

static float *tensor(LayoutWalk *w, ParamKind kind, ParamInit init, int ndim, int64_t d0, int64_t d1, int64_t d2,
                     const char *fmt, ...) {
    if (w->failed) return NULL;
    if (w->ptrs) return w->ptrs[w->cursor++];
    if (w->base) return w->base + w->table->info[w->cursor++].offset;
    char name[128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    int64_t shape[3] = {d0, d1, d2};
    if (params_add(w->table, name, kind, init, ndim, shape, w->err) < 0) w->failed = 1;
    return NULL;
}

static void walk_layout(LayoutWalk *w, const ZayaConfig *c, Weights *out) {
    const int64_t D = c->hidden_size, V = c->vocab_size, Cq = cfg_q_channels(c), Ck = cfg_k_channels(c);
    const int64_t C = Cq + Ck, R = c->router_hidden_size, E = c->num_experts, I = c->moe_intermediate_size;
    const int64_t classes = cfg_router_classes(c);
    const ParamKind A = PARAM_ADAMW, MU = PARAM_MUON;
    out->embed = tensor(w, A, INIT_NORMAL, 2, V, D, 0, "model.embed_tokens.weight");
    out->in_scale = tensor(w, A, INIT_ONE, 1, D, 0, 0, "model.input_hidden_states_scale");
    out->in_bias = tensor(w, A, INIT_ZERO, 1, D, 0, 0, "model.input_hidden_states_bias");
    for (int l = 0; l < c->num_layers; l++) {
        LayerWeights *L = &out->layers[l];
#define P "model.layers.%d."
        L->input_norm = tensor(w, A, INIT_ONE, 1, D, 0, 0, P "input_layernorm.weight", l);
        if (c->attention == ZY_ATTN_CCA) {
            L->w_q = tensor(w, MU, INIT_NORMAL, 2, Cq, D, 0, P "self_attn.qkv_proj.q_proj.weight", l);
            L->w_k = tensor(w, MU, INIT_NORMAL, 2, Ck, D, 0, P "self_attn.qkv_proj.k_proj.weight", l);
            L->w_v_current = tensor(w, MU, INIT_NORMAL, 2, Ck / 2, D, 0, P "self_attn.qkv_proj.v_proj_current.weight", l);
            L->w_v_delayed = tensor(w, MU, INIT_NORMAL, 2, Ck / 2, D, 0, P "self_attn.qkv_proj.v_proj_delayed.weight", l);
            L->conv_dw_w = tensor(w, A, INIT_NORMAL, 3, C, 1, c->cca_time0, P "self_attn.qkv_proj.conv_qk_depthwise.weight", l);
            L->conv_dw_b = tensor(w, A, INIT_ZERO, 1, C, 0, 0, P "self_attn.qkv_proj.conv_qk_depthwise.bias", l);
            L->conv_gr_w = tensor(w, A, INIT_NORMAL, 3, C, c->head_dim, c->cca_time1, P "self_attn.qkv_proj.conv_qk_grouped.weight", l);
            L->conv_gr_b = tensor(w, A, INIT_ZERO, 1, C, 0, 0, P "self_attn.qkv_proj.conv_qk_grouped.bias", l);
            L->temp = tensor(w, A, INIT_ONE, 1, c->num_kv_heads, 0, 0, P "self_attn.qk_norm.temp", l);
        } else { /* MHA variant: plain projections (GQA when Hkv < Hq) */
            L->w_q = tensor(w, MU, INIT_NORMAL, 2, Cq, D, 0, P "self_attn.q_proj.weight", l);
            L->w_k = tensor(w, MU, INIT_NORMAL, 2, Ck, D, 0, P "self_attn.k_proj.weight", l);
            L->w_v = tensor(w, MU, INIT_NORMAL, 2, Ck, D, 0, P "self_attn.v_proj.weight", l);
        }
        L->w_o = tensor(w, MU, INIT_NORMAL, 2, D, Cq, 0, P "self_attn.o_proj.weight", l);
        if (!c->no_residual_scaling) {
            L->attn_hs = tensor(w, A, INIT_ONE, 1, D, 0, 0, P "post_attention_residual_scale.hidden_states_scale", l);
            L->attn_hb = tensor(w, A, INIT_ZERO, 1, D, 0, 0, P "post_attention_residual_scale.hidden_states_bias", l);
            L->attn_rs = tensor(w, A, INIT_ONE, 1, D, 0, 0, P "post_attention_residual_scale.residual_scale", l);
            L->attn_rb = tensor(w, A, INIT_ZERO, 1, D, 0, 0, P "post_attention_residual_scale.residual_bias", l);
        }
        L->post_norm = tensor(w, A, INIT_ONE, 1, D, 0, 0, P "post_attention_layernorm.weight", l);
        if (c->moe != ZY_MOE_DENSE && c->router == ZY_ROUTER_MLP) {
            L->router_down_w = tensor(w, MU, INIT_NORMAL, 2, R, D, 0, P "mlp.gate.down_proj.weight", l);
            L->router_down_b = tensor(w, A, INIT_ZERO, 1, R, 0, 0, P "mlp.gate.down_proj.bias", l);
            L->router_state_scale = l > 0 ? tensor(w, A, INIT_ONE, 1, R, 0, 0, P "mlp.gate.router_states_scale", l) : NULL;
            L->router_norm = tensor(w, A, INIT_ONE, 1, R, 0, 0, P "mlp.gate.router_mlp.norm.weight", l);
            L->router_fc1_w = tensor(w, MU, INIT_NORMAL, 2, R, R, 0, P "mlp.gate.router_mlp.fc1.weight", l);
            L->router_fc1_b = tensor(w, A, INIT_ZERO, 1, R, 0, 0, P "mlp.gate.router_mlp.fc1.bias", l);
            L->router_fc2_w = tensor(w, MU, INIT_NORMAL, 2, R, R, 0, P "mlp.gate.router_mlp.fc2.weight", l);
            L->router_fc2_b = tensor(w, A, INIT_ZERO, 1, R, 0, 0, P "mlp.gate.router_mlp.fc2.bias", l);
            L->router_out_w = tensor(w, MU, INIT_NORMAL, 2, classes, R, 0, P "mlp.gate.router_mlp.out_proj.weight", l);
        } else if (c->moe != ZY_MOE_DENSE) { /* linear-router variant: logits = u Wᵀ on the MoE input */
            L->router_w = tensor(w, MU, INIT_NORMAL, 2, classes, D, 0, P "mlp.gate.weight", l);
        }
        if (c->moe != ZY_MOE_DENSE) {
            /* the skip expert starts held at -1; without one every class starts at 0 */
            const ParamInit bias_init = c->moe == ZY_MOE_SKIP ? INIT_BALANCING_BIAS : INIT_ZERO;
            L->balancing_bias = tensor(w, PARAM_BUFFER, bias_init, 1, classes, 0, 0, P "mlp.gate.balancing_biases", l);
            L->expert_gate_up = tensor(w, MU, INIT_NORMAL, 3, E, 2 * I, D, P "mlp.experts.gate_up_proj", l);
            L->expert_down = tensor(w, MU, INIT_NORMAL, 3, E, D, I, P "mlp.experts.down_proj", l);
        } else { /* dense variant: one SwiGLU MLP of the experts' size (runs as one expert with gate 1) */
            L->expert_gate_up = tensor(w, MU, INIT_NORMAL, 2, 2 * I, D, 0, P "mlp.gate_up_proj.weight", l);
            L->expert_down = tensor(w, MU, INIT_NORMAL, 2, D, I, 0, P "mlp.down_proj.weight", l);
        }
        if (!c->no_residual_scaling) {
            L->mlp_hs = tensor(w, A, INIT_ONE, 1, D, 0, 0, P "post_mlp_residual_scale.hidden_states_scale", l);
            L->mlp_hb = tensor(w, A, INIT_ZERO, 1, D, 0, 0, P "post_mlp_residual_scale.hidden_states_bias", l);
            L->mlp_rs = tensor(w, A, INIT_ONE, 1, D, 0, 0, P "post_mlp_residual_scale.residual_scale", l);
            L->mlp_rb = tensor(w, A, INIT_ZERO, 1, D, 0, 0, P "post_mlp_residual_scale.residual_bias", l);
        }
#undef P
    }
    out->final_norm = tensor(w, A, INIT_ONE, 1, D, 0, 0, "model.norm.weight");
    out->lm_head = c->tie_word_embeddings ? out->embed : tensor(w, A, INIT_NORMAL, 2, V, D, 0, "lm_head.weight");
}

/* zaya_residual_scaling false: the merges read constant ones/zeros (exactly h + x) and write their unused
 * gradients to a sink. */
static void bind_plain_residuals(Model *m) {
    for (int l = 0; l < m->cfg.num_layers; l++) {
        LayerWeights *W = &m->w.layers[l], *G = &m->g.layers[l];
        W->attn_hs = W->attn_rs = W->mlp_hs = W->mlp_rs = m->unit_scale;
        W->attn_hb = W->attn_rb = W->mlp_hb = W->mlp_rb = m->zero_bias;
        G->attn_hs = G->attn_rs = G->mlp_hs = G->mlp_rs = m->merge_grad_sink;
        G->attn_hb = G->attn_rb = G->mlp_hb = G->mlp_rb = m->merge_grad_sink;
    }
}

int model_param_table(ParamTable *t, const ZayaConfig *cfg, ZyErr *err) {
    memset(t, 0, sizeof *t);
    if (config_validate(cfg, "model config", err)) return -1;
    LayerWeights *layers = calloc((size_t)cfg->num_layers, sizeof *layers);
    if (!layers) return zy_fail(err, "out of memory");
    LayoutWalk walk = {.table = t, .err = err};
    Weights scratch = {.layers = layers};
    walk_layout(&walk, cfg, &scratch);
    free(layers);
    if (walk.failed) {
        params_free(t);
        return -1;
    }
    return 0;
}

/* The tensor table and the per-layer view arrays for cfg, without arenas; for zaya_residual_scaling false also the
 * constants its merges read. */
static int model_create_layout(Model *m, const ZayaConfig *cfg, ZyErr *err) {
    memset(m, 0, sizeof *m);
    m->cfg = *cfg;
    if (config_validate(cfg, "model config", err)) return -1;
    m->w.layers = calloc((size_t)cfg->num_layers, sizeof(LayerWeights));
    m->g.layers = calloc((size_t)cfg->num_layers, sizeof(LayerWeights));
    if (!m->w.layers || !m->g.layers) {
        model_free(m);
        return zy_fail(err, "out of memory");
    }
    LayoutWalk walk = {.table = &m->params, .err = err};
    Weights scratch = {.layers = m->w.layers};
    walk_layout(&walk, cfg, &scratch);
    if (walk.failed) {
        model_free(m);
        return -1;
    }
    if (cfg->no_residual_scaling) {
        const size_t D = (size_t)cfg->hidden_size;
        m->unit_scale = malloc(D * sizeof(float));
        m->zero_bias = calloc(D, sizeof(float));
        m->merge_grad_sink = calloc(D, sizeof(float));
        if (!m->unit_scale || !m->zero_bias || !m->merge_grad_sink) {
            model_free(m);
            return zy_fail(err, "out of memory");
        }
        for (size_t i = 0; i < D; i++) m->unit_scale[i] = 1.0f;
    }
    return 0;
}

int model_create(Model *m, const ZayaConfig *cfg, ZyErr *err) {
    if (model_create_layout(m, cfg, err)) return -1;
    if (params_alloc(&m->params, err)) {
        model_free(m);
        return -1;
    }
    LayoutWalk bind_w = {.table = &m->params, .base = m->params.data};
    walk_layout(&bind_w, cfg, &m->w);
    LayoutWalk bind_g = {.table = &m->params, .base = m->params.grad};
    walk_layout(&bind_g, cfg, &m->g);
    if (cfg->no_residual_scaling) bind_plain_residuals(m);
    return 0;
}

int model_create_views(Model *m, const ZayaConfig *cfg, ZyErr *err) { return model_create_layout(m, cfg, err); }

void model_free(Model *m) {
    if (m->owner_free) m->owner_free(m->owner);
    params_free(&m->params);
    zy_free(m->bf16);
    zy_free(m->conv16);
    free(m->w.layers);
    free(m->g.layers);
    free(m->unit_scale), free(m->zero_bias), free(m->merge_grad_sink);
    memset(m, 0, sizeof *m);
}

/* Where a matrix view's bf16 and quantized twins are: a view p of [base, base + n) has its bf16 twin at arena + (p -
 * base) (the bf16 arena, laid out like the fp32 one) or at table[p - base], and its quantized one at quant[p - base]
 * (model_bind_views: base holds one tag float per tensor; a view outside [base, base + n) has neither). */
typedef struct {
    const float *base;
    size_t n;
    const uint16_t *arena;
    const uint16_t *const *table;
    const ZyQuantMatrix *quant;
} TwinMap;

static const uint16_t *bf16_of(const TwinMap *b, const float *p) {
    return b->table ? b->table[p - b->base] : b->arena + (p - b->base);
}

static ZyQuantMatrix quant_of(const TwinMap *b, const float *p) {
    return b->quant ? b->quant[p - b->base] : (ZyQuantMatrix){0};
}

int model_holds_bf16(const ParamInfo *p) { return p->ndim >= 2 && !strstr(p->name, "conv_qk"); }

int model_bf16_begin(Model *m, ZyErr *err) {
    if (m->bf16) return 0;
    m->bf16 = zy_calloc(m->params.total * sizeof(uint16_t));
    if (!m->bf16) return zy_fail(err, "out of memory allocating %zu MB of bf16 weights", (m->params.total * 2) >> 20);
    return 0;
}

int model_bf16_convert(Model *m, int i) {
    const ParamInfo *p = &m->params.info[i];
    if (p->ndim < 2) return 0;
    float *x = m->params.data + p->offset;
    if (model_holds_bf16(p)) {
        uint16_t *h = m->bf16 + p->offset;
        for (size_t j = 0; j < p->numel; j++) h[j] = zy_f32_to_bf16(x[j]);
        /* nothing reads these fp32 values any more: their memory goes back (the bf16 arena replaces it) */
        zy_release_pages(x, p->numel * sizeof *x);
    } else {
        for (size_t j = 0; j < p->numel; j++) x[j] = zy_round_bf16(x[j]);
    }
    return 1;
}

/* Switches a weight view to its bf16 or quantized twin (tensors a variant lacks stay NULL; a view that is no tag of
 * b keeps its fp32 values). The list is every tensor model_holds_bf16 accepts. */
#define TO_TWIN(b, p)                                                                                           \
    do {                                                                                                        \
        if (p && p >= (b)->base && p < (b)->base + (b)->n)                                                      \
            p##_quant = quant_of(b, p), p##16 = p##_quant.q ? NULL : bf16_of(b, p), p = NULL;                   \
    } while (0)

static void switch_to_twins(Model *m, const TwinMap *b) {
    for (int l = 0; l < m->cfg.num_layers; l++) {
        LayerWeights *L = &m->w.layers[l];
        TO_TWIN(b, L->w_q);
        TO_TWIN(b, L->w_k);
        TO_TWIN(b, L->w_v);
        TO_TWIN(b, L->w_o);
        TO_TWIN(b, L->w_v_current);
        TO_TWIN(b, L->w_v_delayed);
        TO_TWIN(b, L->router_down_w);
        TO_TWIN(b, L->router_fc1_w);
        TO_TWIN(b, L->router_fc2_w);
        TO_TWIN(b, L->router_out_w);
        TO_TWIN(b, L->router_w);
        TO_TWIN(b, L->expert_gate_up);
        TO_TWIN(b, L->expert_down);
    }
    TO_TWIN(b, m->w.embed);
    TO_TWIN(b, m->w.lm_head);
}
#undef TO_TWIN

void model_bf16_finish(Model *m) {
    const TwinMap b = {.base = m->params.data, .n = m->params.total, .arena = m->bf16};
    switch_to_twins(m, &b);
    model_conv_twins(m);
}

size_t model_conv_twins(Model *m) {
    const ZayaConfig *c = &m->cfg;
    if (c->attention != ZY_ATTN_CCA || m->conv16) return 0;
    const size_t per = (size_t)cfg_conv_channels(c) * c->head_dim * c->cca_time1;
    if (!(m->conv16 = zy_calloc((size_t)c->num_layers * per * sizeof(uint16_t)))) return 0;
    for (int l = 0; l < c->num_layers; l++) {
        LayerWeights *L = &m->w.layers[l];
        uint16_t *h = m->conv16 + (size_t)l * per;
        int exact = L->conv_gr_w != NULL;
        for (size_t j = 0; exact && j < per; j++) {
            h[j] = zy_f32_to_bf16(L->conv_gr_w[j]);
            exact = zy_bf16_to_f32(h[j]) == L->conv_gr_w[j]; /* else its sums would differ: fp32 stays the view read */
        }
        L->conv_gr_w16 = exact ? h : NULL;
    }
    return (size_t)c->num_layers * per * sizeof(uint16_t);
}

int model_bind_views(Model *m, float *const *t32, const uint16_t *const *t16, const ZyQuantMatrix *tq, ZyErr *err) {
    const int n = m->params.count;
    float *tags = calloc((size_t)n, sizeof *tags);
    float **ptrs = malloc((size_t)n * sizeof *ptrs);
    if (!tags || !ptrs) {
        free(tags), free(ptrs);
        return zy_fail(err, "out of memory");
    }
    /* a bf16 or quantized matrix is bound first to its tag, which switch_to_twins turns into t16[i] or tq[i]; its fp32
     * view ends NULL */
    for (int i = 0; i < n; i++)
        ptrs[i] = model_holds_bf16(&m->params.info[i]) && ((t16 && t16[i]) || (tq && tq[i].q)) ? tags + i : t32[i];
    LayoutWalk bind = {.table = &m->params, .ptrs = ptrs};
    walk_layout(&bind, &m->cfg, &m->w);
    const TwinMap b = {.base = tags, .n = (size_t)n, .table = t16, .quant = tq};
    switch_to_twins(m, &b);
    model_conv_twins(m);
    if (m->cfg.no_residual_scaling) bind_plain_residuals(m);
    free(tags), free(ptrs);
    return 0;
}

void model_embed(const Weights *w, float *x, const int32_t *tokens, int N, int D) {
    if (w->embed_quant.q)
        zy_quant_embed(x, &w->embed_quant, tokens, w->in_bias, w->in_scale, N, D);
    else if (w->embed16)
        embed_forward_bf16(x, w->embed16, tokens, w->in_bias, w->in_scale, N, D);
    else
        embed_forward(x, w->embed, tokens, w->in_bias, w->in_scale, N, D);
}

int model_use_bf16(Model *m, ZyErr *err) {
    if (m->bf16) return 0;
    if (model_bf16_begin(m, err)) return -1;
    int rounded = 0;
    for (int i = 0; i < m->params.count; i++) rounded += model_bf16_convert(m, i);
    model_bf16_finish(m);
    return rounded;
}

void model_drop_grads(Model *m) {
    zy_free(m->params.grad);
    m->params.grad = NULL;
    LayerWeights *layers = m->g.layers;
    if (layers) memset(layers, 0, (size_t)m->cfg.num_layers * sizeof *layers);
    m->g = (Weights){.layers = layers};
}

int model_parse_dtype(const char *s, const char *flag, ZyErr *err) {
    if (!strcmp(s, "f32") || !strcmp(s, "fp32") || !strcmp(s, "float32")) return 0;
    if (!strcmp(s, "bf16") || !strcmp(s, "bfloat16")) return 1;
    return zy_fail(err, "%s: unknown data type \"%s\" (f32 or bf16)", flag, s);
}

/* Values [first, first + count) of tensor p's initialisation. Normal draws go in chunks: the chunk's uniforms drawn in
 * stream order on one thread (cheap), then their Box-Muller transforms (log, sqrt, cos: ~40 ns each, 42 s for a 1B
 * model on one core) on every thread, so the values are one zy_rng_normal after another whatever the thread count. */
#define INIT_CHUNK ((size_t)1 << 20)
void model_init_values(const ParamInfo *p, double std, ZyRng *rng, size_t first, size_t count, float *out) {
    double *u = p->init == INIT_NORMAL && count >= 65536
                    ? malloc(2 * (count < INIT_CHUNK ? count : INIT_CHUNK) * sizeof(double))
                    : NULL; /* NULL: element by element, as before */
    if (u) {
        for (size_t j0 = 0; j0 < count; j0 += INIT_CHUNK) {
            const long len = (long)(count - j0 < INIT_CHUNK ? count - j0 : INIT_CHUNK);
            for (long k = 0; k < 2 * len; k++) u[k] = zy_rng_uniform(rng);
#pragma omp parallel for schedule(static) if (len >= 65536)
            for (long k = 0; k < len; k++) out[j0 + (size_t)k] = (float)(std * zy_normal_of(u[2 * k], u[2 * k + 1]));
        }
        free(u);
        return;
    }
    for (size_t j = 0; j < count; j++) {
        switch (p->init) {
        case INIT_ZERO: out[j] = 0.0f; break;
        case INIT_ONE: out[j] = 1.0f; break;
        case INIT_NORMAL: out[j] = (float)(std * zy_rng_normal(rng)); break;
        case INIT_BALANCING_BIAS: out[j] = first + j + 1 == p->numel ? -1.0f : 0.0f; break; /* skip expert at -1 */
        }
    }
}

void model_init_weights(Model *m, uint64_t seed) {
    ZyRng rng;
    zy_rng_seed(&rng, seed);
    for (int i = 0; i < m->params.count; i++) {
        const ParamInfo *p = &m->params.info[i];
        model_init_values(p, m->cfg.initializer_range, &rng, 0, p->numel, m->params.data + p->offset);
    }
}

/* ======================================================================================================
 * Activations: one block, carved into named buffers.
 * ====================================================================================================== */

void layer_acts_carve_moe(ZyCarver *cv, LayerActs *L, const ZayaConfig *c, size_t N, int for_backward) {
    const size_t D = c->hidden_size, R = c->router_hidden_size, E1 = c->num_experts + 1, I = c->moe_intermediate_size;
    L->router_zn = ZY_CARVE_F(cv, N * R);
    if (for_backward) {
        L->router_rstd = ZY_CARVE_F(cv, N);
        L->router_h1_pre = ZY_CARVE_F(cv, N * R);
        L->router_h1 = ZY_CARVE_F(cv, N * R);
        L->router_h2_pre = ZY_CARVE_F(cv, N * R);
        L->router_h2 = ZY_CARVE_F(cv, N * R);
    } else { /* the GELUs in place */
        L->router_h1 = L->router_h1_pre = ZY_CARVE_F(cv, N * R);
        L->router_h2 = L->router_h2_pre = ZY_CARVE_F(cv, N * R);
    }
    L->router_logits = ZY_CARVE_F(cv, N * E1);
    L->router_probs = ZY_CARVE_F(cv, N * E1);
    L->choice = ZY_CARVE_I(cv, N);
    L->gate = ZY_CARVE_F(cv, N);
    L->expert_offset = ZY_CARVE_I(cv, E1);
    L->expert_cursor = ZY_CARVE_I(cv, E1);
    L->sorted_rows = ZY_CARVE_I(cv, N);
    L->expert_in = ZY_CARVE_F(cv, N * D);
    L->expert_gu = ZY_CARVE_F(cv, N * 2 * I);
    L->expert_act = ZY_CARVE_F(cv, N * I);
    L->expert_out = ZY_CARVE_F(cv, N * D);
    L->moe_out = ZY_CARVE_F(cv, N * D);
}

static void carve_all(ZyCarver *cv, Activations *a, const ZayaConfig *c) {
    const int gpu = a->gpu_attn_work_floats > 0; /* device activations: the GPU kernels need no CPU workspaces */
    const size_t N = (size_t)a->B * a->T, T = (size_t)a->T, D = c->hidden_size, V = c->vocab_size;
    const size_t Cq = cfg_q_channels(c), Ck = cfg_k_channels(c), C = Cq + Ck, R = c->router_hidden_size;
    const size_t E1 = c->num_experts + 1, I = c->moe_intermediate_size, Hq = c->num_heads, Hkv = c->num_kv_heads;
    const size_t NM = (size_t)a->B * (T + c->cca_time1 - 1), rd = cfg_rotary_dim(c);
    a->tokens = ZY_CARVE_I(cv, N);
    for (int l = 0; l < c->num_layers; l++) {
        LayerActs *L = &a->layers[l];
        L->x_in = ZY_CARVE_F(cv, N * D);
        L->u_attn = ZY_CARVE_F(cv, N * D);
        L->rstd_attn = ZY_CARVE_F(cv, N);
        L->qk_down = ZY_CARVE_F(cv, N * C);
        L->conv_mid = ZY_CARVE_F(cv, NM * C);
        L->conv_out = ZY_CARVE_F(cv, N * C);
        L->query_pre = ZY_CARVE_F(cv, N * Cq);
        L->key_pre = ZY_CARVE_F(cv, N * Ck);
        L->q_norm = ZY_CARVE_F(cv, N * Hq);
        L->k_norm = ZY_CARVE_F(cv, N * Hkv);
        L->query = ZY_CARVE_F(cv, N * Cq);
        L->key = ZY_CARVE_F(cv, N * Ck);
        L->v_current = ZY_CARVE_F(cv, N * Ck / 2);
        L->v_delayed = ZY_CARVE_F(cv, N * Ck / 2);
        L->value = ZY_CARVE_F(cv, N * Ck);
        L->lse = ZY_CARVE_F(cv, (size_t)a->B * Hq * T);
        L->attn_out = ZY_CARVE_F(cv, N * Cq);
        L->attn_proj = ZY_CARVE_F(cv, N * D);
        L->x_mid = ZY_CARVE_F(cv, N * D);
        L->u_mlp = ZY_CARVE_F(cv, N * D);
        L->rstd_mlp = ZY_CARVE_F(cv, N);
        L->router_z = ZY_CARVE_F(cv, N * R);
        layer_acts_carve_moe(cv, L, c, N, 1);
    }
    a->x_final = ZY_CARVE_F(cv, N * D);
    a->final_normed = ZY_CARVE_F(cv, N * D);
    a->final_rstd = ZY_CARVE_F(cv, N);
    a->logits = ZY_CARVE_F(cv, N * V);
    a->row_loss = ZY_CARVE_F(cv, N);
    a->rope_cos = ZY_CARVE_F(cv, T * rd / 2);
    a->rope_sin = ZY_CARVE_F(cv, T * rd / 2);
    const size_t rds = cfg_has_sliding(c) ? (size_t)cfg_sliding_rotary_dim(c) : 0; /* none without sliding layers */
    a->rope_cos_sliding = rds ? ZY_CARVE_F(cv, T * rds / 2) : NULL;
    a->rope_sin_sliding = rds ? ZY_CARVE_F(cv, T * rds / 2) : NULL;
    if (!gpu) {
        a->conv_wp = ZY_CARVE_F(cv, (size_t)cca_conv_work_floats(model_conv_shape(c, a->B, a->T)));
        a->conv_dwp = ZY_CARVE_F(cv, (size_t)cca_conv_grad_work_floats(model_conv_shape(c, a->B, a->T)));
    }
    BackwardScratch *d = &a->d;
    d->d_x = ZY_CARVE_F(cv, N * D);
    d->d_u = ZY_CARVE_F(cv, N * D);
    d->d_h = ZY_CARVE_F(cv, N * D);
    d->d_qk_down = ZY_CARVE_F(cv, N * C);
    d->d_conv_out = ZY_CARVE_F(cv, N * C);
    d->d_conv_mid = ZY_CARVE_F(cv, NM * C);
    d->d_query = ZY_CARVE_F(cv, N * Cq);
    d->d_key = ZY_CARVE_F(cv, N * Ck);
    d->d_value = ZY_CARVE_F(cv, N * Ck);
    d->d_vc = ZY_CARVE_F(cv, N * Ck / 2);
    d->d_vd = ZY_CARVE_F(cv, N * Ck / 2);
    d->d_attn_out = ZY_CARVE_F(cv, N * Cq);
    a->attn_work = ZY_CARVE_F(cv, gpu ? (size_t)a->gpu_attn_work_floats
                                   : flash_attention_workspace_floats(c->head_dim, a->attn_threads));
    d->d_z = ZY_CARVE_F(cv, N * R);
    d->d_z_carry = ZY_CARVE_F(cv, N * R);
    d->d_zn = ZY_CARVE_F(cv, N * R);
    d->d_h1 = ZY_CARVE_F(cv, N * R);
    d->d_h2 = ZY_CARVE_F(cv, N * R);
    d->d_router_logits = ZY_CARVE_F(cv, N * E1);
    d->d_gate = ZY_CARVE_F(cv, N);
    d->d_expert_out = ZY_CARVE_F(cv, N * D);
    d->d_expert_act = ZY_CARVE_F(cv, N * I);
    d->d_expert_gu = ZY_CARVE_F(cv, N * 2 * I);
    d->d_expert_in = ZY_CARVE_F(cv, N * D);
    d->d_final = ZY_CARVE_F(cv, N * D);
    d->d_logits = ZY_CARVE_F(cv, N * V);
}

size_t acts_carve(Activations *a, const ZayaConfig *cfg, void *base) {
    ZyCarver cv = {.base = base};
    carve_all(&cv, a, cfg);
    return cv.used;
}

void model_bind_weights(const Model *m, float *base, Weights *out) {
    LayoutWalk bind = {.table = (ParamTable *)&m->params, .base = base};
    walk_layout(&bind, &m->cfg, out);
}

void model_bind_tensors(const Model *m, float *const *ptrs, Weights *out) {
    LayoutWalk bind = {.table = (ParamTable *)&m->params, .ptrs = ptrs};
    walk_layout(&bind, &m->cfg, out);
}

int acts_create(Activations *a, const ZayaConfig *cfg, int B, int T, ZyErr *err) {
    memset(a, 0, sizeof *a);
    if (B <= 0 || T <= 0) return zy_fail(err, "batch shape [%d, %d] must be positive", B, T);
    a->B = B;
    a->T = T;
    a->attn_threads = omp_get_max_threads(); /* sizes the attention scratch */
    a->layers = calloc((size_t)cfg->num_layers, sizeof(LayerActs));
    a->gemm = calloc(1, sizeof *a->gemm); /* fp32 until acts_set_bf16 */
    if (!a->layers || !a->gemm) {
        free(a->layers), free(a->gemm);
        a->layers = NULL, a->gemm = NULL;
        return zy_fail(err, "out of memory");
    }
    ZyCarver sizing = {0};
    carve_all(&sizing, a, cfg);
    a->block = zy_calloc(sizing.used);
    if (!a->block) {
        free(a->layers), free(a->gemm);
        a->layers = NULL, a->gemm = NULL;
        return zy_fail(err, "out of memory allocating %zu MB of activations for batch [%d, %d]", sizing.used >> 20, B, T);
    }
    ZyCarver cv = {.base = a->block};
    carve_all(&cv, a, cfg);
    rope_tables(a->rope_cos, a->rope_sin, T, cfg_rotary_dim(cfg), cfg->rope_theta);
    if (a->rope_cos_sliding)
        rope_tables(a->rope_cos_sliding, a->rope_sin_sliding, T, cfg_sliding_rotary_dim(cfg), cfg->rope_theta_sliding);
    return 0;
}

void acts_set_bf16(Activations *a, ZyBf16Products products) { a->gemm->bf16 = products; }

void acts_free(Activations *a) {
    zy_free(a->block);
    free(a->layers);
    if (a->gemm) zy_gemm_ctx_free(a->gemm);
    free(a->gemm);
    memset(a, 0, sizeof *a);
}

int model_check_tokens(const Model *m, const int32_t *tokens, int B, int T, ZyErr *err) {
    if (T > m->cfg.max_position_embeddings)
        return zy_fail(err, "sequence length %d exceeds max_position_embeddings %d", T, m->cfg.max_position_embeddings);
    for (long i = 0; i < (long)B * T; i++)
        if (tokens[i] < 0 || tokens[i] >= m->cfg.vocab_size)
            return zy_fail(err, "token id %d at [%ld, %ld] is outside the vocabulary [0, %d)", tokens[i], i / T, i % T,
                           m->cfg.vocab_size);
    return 0;
}

double model_train_flops_per_token(const ZayaConfig *c, int T) {
    const double D = c->hidden_size, Cq = cfg_q_channels(c), Ck = cfg_k_channels(c), C = Cq + Ck;
    const double R = c->router_hidden_size, K = cfg_router_classes(c), I = c->moe_intermediate_size;
    double per_layer = Cq * D + 2 * Ck * D + D * Cq + 3 * I * D; /* q, k, v, o and one expert */
    if (c->attention == ZY_ATTN_CCA) per_layer += C * c->head_dim * c->cca_time1;
    if (c->moe != ZY_MOE_DENSE) per_layer += c->router == ZY_ROUTER_MLP ? R * D + 2 * R * R + K * R : K * D;
    const double active = c->num_layers * per_layer + (double)c->vocab_size * D;
    double keys = 0; /* keys per query summed over the layers, counted as whole rows: T, or a sliding layer's W */
    for (int l = 0; l < c->num_layers; l++) {
        const int w = cfg_layer_window(c, l);
        keys += w > 0 && w < T ? w : T;
    }
    return 6.0 * active + 6.0 * c->num_heads * c->head_dim * keys;
}

void make_next_token_targets(int32_t *targets, const int32_t *tokens, int B, int T) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) targets[(long)b * T + t] = t + 1 < T ? tokens[(long)b * T + t + 1] : -1;
}

/* ======================================================================================================
 * Forward
 * ====================================================================================================== */

/* Runs stmt and adds its wall time to timers[phase] when timing is on. */
#define TIMED(timers, phase, stmt)                                                                          \
    do {                                                                                                    \
        double t0_ = (timers) ? zy_now_seconds() : 0;                                                      \
        stmt;                                                                                               \
        if (timers) (timers)[phase] += zy_now_seconds() - t0_;                                              \
    } while (0)

/* How layer l attends: its RoPE tables and rotary dim, and its sliding window (0: full causal). A sliding layer
 * ("hybrid_sliding", config.h) differs from a full one in these alone. */
typedef struct {
    const float *cos, *sin;
    int rd, window;
} AttnGeom;

static AttnGeom attn_geom(const ZayaConfig *c, const Activations *a, int l) {
    const int s = cfg_layer_is_sliding(c, l);
    return (AttnGeom){.cos = s ? a->rope_cos_sliding : a->rope_cos, .sin = s ? a->rope_sin_sliding : a->rope_sin,
                      .rd = cfg_layer_rotary_dim(c, l), .window = cfg_layer_window(c, l)};
}

/* CCA attention on u = RMSNorm(x) of layer l; writes L->attn_proj [N, D]. */
static void cca_forward(const ZayaConfig *c, const LayerWeights *W, LayerActs *L, const Activations *a, int l) {
    const int B = a->B, T = a->T, N = B * T, D = c->hidden_size, dh = c->head_dim;
    const int Hq = c->num_heads, Hkv = c->num_kv_heads, Cq = Hq * dh, Ck = Hkv * dh, C = Cq + Ck;
    /* 1. down projections into X = [q0 | k0] */
    zy_matmul_wt_ctx(a->gemm, N, Cq, D, L->u_attn, D, WEIGHT_VIEWS(W->w_q), L->qk_down, C);
    zy_matmul_wt_ctx(a->gemm, N, Ck, D, L->u_attn, D, WEIGHT_VIEWS(W->w_k), L->qk_down + Cq, C);
    /* 2. the two causal convolutions over time */
    cca_conv_forward(L->conv_out, L->conv_mid, a->conv_wp, L->qk_down, W->conv_dw_w, W->conv_dw_b, W->conv_gr_w,
                     W->conv_gr_b, model_conv_shape(c, B, T));
    /* 3. q-k mean skip */
    qk_mean_forward(L->query_pre, L->key_pre, L->conv_out, L->qk_down, N, Hq, Hkv, dh);
    /* 4. values with a one-token delay */
    zy_matmul_wt_ctx(a->gemm, N, Ck / 2, D, L->u_attn, D, WEIGHT_VIEWS(W->w_v_current), L->v_current, Ck / 2);
    zy_matmul_wt_ctx(a->gemm, N, Ck / 2, D, L->u_attn, D, WEIGHT_VIEWS(W->w_v_delayed), L->v_delayed, Ck / 2);
    delayed_value_forward(L->value, L->v_current, L->v_delayed, B, T, Ck / 2);
    /* 5. QK L2 norm to √dh, keys times the per-kv-head temperature, and 6. partial RoPE, in one pass */
    const float scale = sqrtf((float)dh), eps = 1.1920928955078125e-07f; /* fp32 machine epsilon */
    const AttnGeom g = attn_geom(c, a, l);
    l2norm_rope_forward(L->query, L->q_norm, L->query_pre, NULL, g.cos, g.sin, N, T, Hq, dh, g.rd, scale, eps);
    l2norm_rope_forward(L->key, L->k_norm, L->key_pre, W->temp, g.cos, g.sin, N, T, Hkv, dh, g.rd, scale, eps);
    /* 7. causal softmax attention in the latent space (a sliding layer: over its window) */
    flash_attention_forward(L->attn_out, L->lse, L->query, L->key, L->value, B, T, Hq, Hkv, dh, g.window, a->attn_work,
                            a->attn_threads);
    /* 8. output projection */
    zy_matmul_wt_ctx(a->gemm, N, D, Cq, L->attn_out, Cq, WEIGHT_VIEWS(W->w_o), L->attn_proj, D);
}

/* MHA variant on u = RMSNorm(x): q, k, v projections, partial RoPE on q and k, causal softmax attention (GQA when
 * Hkv < Hq), o_proj; writes L->attn_proj [N, D]. No convolutions, value delay or QK norm. */
static void mha_forward(const ZayaConfig *c, const LayerWeights *W, LayerActs *L, const Activations *a, int l) {
    const int B = a->B, T = a->T, N = B * T, D = c->hidden_size, dh = c->head_dim;
    const int Hq = c->num_heads, Hkv = c->num_kv_heads, Cq = Hq * dh, Ck = Hkv * dh;
    const AttnGeom g = attn_geom(c, a, l);
    zy_matmul_wt_ctx(a->gemm, N, Cq, D, L->u_attn, D, WEIGHT_VIEWS(W->w_q), L->query, Cq);
    zy_matmul_wt_ctx(a->gemm, N, Ck, D, L->u_attn, D, WEIGHT_VIEWS(W->w_k), L->key, Ck);
    zy_matmul_wt_ctx(a->gemm, N, Ck, D, L->u_attn, D, WEIGHT_VIEWS(W->w_v), L->value, Ck);
    rope_forward(L->query, g.cos, g.sin, N, T, Hq, dh, g.rd);
    rope_forward(L->key, g.cos, g.sin, N, T, Hkv, dh, g.rd);
    flash_attention_forward(L->attn_out, L->lse, L->query, L->key, L->value, B, T, Hq, Hkv, dh, g.window, a->attn_work,
                            a->attn_threads);
    zy_matmul_wt_ctx(a->gemm, N, D, Cq, L->attn_out, Cq, WEIGHT_VIEWS(W->w_o), L->attn_proj, D);
}

/* Groups the token rows by chosen expert (counting sort, stable), skip-expert tokens left out. */
static void group_by_expert(const MoeBuffers *b, int N, int E) {
    int32_t *off = b->expert_offset, *cursor = b->expert_cursor;
    memset(off, 0, (size_t)(E + 1) * sizeof *off);
    for (int r = 0; r < N; r++)
        if (b->choice[r] < E) off[b->choice[r] + 1]++;
    for (int e = 0; e < E; e++) off[e + 1] += off[e];
    memcpy(cursor, off, (size_t)E * sizeof *off);
    for (int r = 0; r < N; r++)
        if (b->choice[r] < E) b->sorted_rows[cursor[b->choice[r]]++] = r;
}

void moe_block_forward(const ZayaConfig *c, const LayerWeights *W, const MoeBuffers *b, const float *r_prev, int N) {
    const int D = c->hidden_size, R = c->router_hidden_size, I = c->moe_intermediate_size;
    const int classes = cfg_router_classes(c);
    double t_router = b->phase_seconds ? zy_now_seconds() : 0;
    if (c->moe == ZY_MOE_DENSE) { /* dense variant: every row to the one MLP with gate 1 */
        for (int r = 0; r < N; r++) b->choice[r] = 0, b->gate[r] = 1.0f;
    } else if (c->router == ZY_ROUTER_MLP) {
        /* router: z = u W_downᵀ + b (+ r ⊙ γ), the state handed to the next layer, and its RMSNorm in one pass;
         * each MLP layer is a GEMM into its destination (beta = 0) and one bias + GELU pass */
        zy_matmul_wt_ctx(b->gemm, N, R, D, b->u, D, WEIGHT_VIEWS(W->router_down_w), b->z, R);
        state_rmsnorm_forward(b->z, b->zn, b->rstd, W->router_down_b, r_prev, W->router_state_scale, W->router_norm, N,
                              R, c->rms_norm_eps);
        zy_matmul_wt_ctx(b->gemm, N, R, R, b->zn, R, WEIGHT_VIEWS(W->router_fc1_w), b->h1_pre, R);
        bias_gelu_forward(b->h1_pre, b->h1, W->router_fc1_b, N, R);
        zy_matmul_wt_ctx(b->gemm, N, R, R, b->h1, R, WEIGHT_VIEWS(W->router_fc2_w), b->h2_pre, R);
        bias_gelu_forward(b->h2_pre, b->h2, W->router_fc2_b, N, R);
        zy_matmul_wt_ctx(b->gemm, N, classes, R, b->h2, R, WEIGHT_VIEWS(W->router_out_w), b->logits, classes);
        router_choice_forward(b->probs, b->choice, b->gate, b->logits, W->balancing_bias, N, classes);
    } else { /* linear-router variant: logits = u Wᵀ, no depth state */
        zy_matmul_wt_ctx(b->gemm, N, classes, D, b->u, D, WEIGHT_VIEWS(W->router_w), b->logits, classes);
        router_choice_forward(b->probs, b->choice, b->gate, b->logits, W->balancing_bias, N, classes);
    }

    double t_experts = b->phase_seconds ? zy_now_seconds() : 0;
    if (b->phase_seconds) b->phase_seconds[PHASE_ROUTER] += t_experts - t_router;
    /* dropless top-1 experts: grouped GEMMs over the rows sorted by expert, gate-scaled scatter back (the dense MLP
     * is the case of one expert) */
    const int E = c->moe == ZY_MOE_DENSE ? 1 : c->num_experts;
    group_by_expert(b, N, E);
    moe_experts_forward(b->out, b->expert_in, b->expert_gu, b->expert_act, b->expert_out, b->u, b->gate, b->choice,
                        b->sorted_rows, b->expert_offset, WEIGHT_VIEWS(W->expert_gate_up), WEIGHT_VIEWS(W->expert_down),
                        N, D, I, E, b->gemm);
    if (b->phase_seconds) b->phase_seconds[PHASE_EXPERTS] += zy_now_seconds() - t_experts;
}

MoeBuffers moe_buffers_of(const LayerActs *L, double *phase_seconds, ZyGemmCtx *gemm) {
    return (MoeBuffers){.u = L->u_mlp, .z = L->router_z, .zn = L->router_zn, .rstd = L->router_rstd,
                        .h1_pre = L->router_h1_pre, .h1 = L->router_h1, .h2_pre = L->router_h2_pre, .h2 = L->router_h2,
                        .logits = L->router_logits, .probs = L->router_probs, .choice = L->choice, .gate = L->gate,
                        .expert_offset = L->expert_offset, .expert_cursor = L->expert_cursor,
                        .sorted_rows = L->sorted_rows, .expert_in = L->expert_in, .expert_gu = L->expert_gu,
                        .expert_act = L->expert_act, .expert_out = L->expert_out, .out = L->moe_out,
                        .phase_seconds = phase_seconds, .gemm = gemm};
}

void model_forward(Model *m, Activations *a, const int32_t *tokens) {
    const ZayaConfig *c = &m->cfg;
    const int N = a->B * a->T, D = c->hidden_size;
    const Weights *w = &m->w;
    memcpy(a->tokens, tokens, (size_t)N * sizeof *tokens);
    /* bf16 products: the weights may have changed since the last forward (an optimizer step, a load), so their bf16
     * copies are made again, once; this forward's backward reuses them */
    zy_gemm_ctx_weights_changed(a->gemm);
    /* x = (Emb[tokens] + b_in) ⊙ s_in */
    double *tm = a->phase_seconds;
    TIMED(tm, PHASE_NORMS, model_embed(w, a->layers[0].x_in, a->tokens, N, D));
    const float *r_prev = NULL;
    /* Each residual merge runs fused with the RMSNorm that reads its output (merge_rmsnorm_forward). */
    TIMED(tm, PHASE_NORMS,
          rmsnorm_forward(a->layers[0].u_attn, a->layers[0].rstd_attn, a->layers[0].x_in, w->layers[0].input_norm, N, D,
                          c->rms_norm_eps));
    for (int l = 0; l < c->num_layers; l++) {
        const LayerWeights *W = &w->layers[l];
        LayerActs *L = &a->layers[l];
        const int last = l + 1 == c->num_layers;
        float *x_out = last ? a->x_final : a->layers[l + 1].x_in;
        /* a = CCA(RMSNorm(x)); x = (a + bh) ⊙ sh + (x + br) ⊙ sr; u = RMSNorm(x) */
        if (c->attention == ZY_ATTN_CCA)
            TIMED(tm, PHASE_ATTENTION, cca_forward(c, W, L, a, l));
        else
            TIMED(tm, PHASE_ATTENTION, mha_forward(c, W, L, a, l));
        TIMED(tm, PHASE_NORMS,
              merge_rmsnorm_forward(L->x_mid, L->u_mlp, L->rstd_mlp, L->attn_proj, L->x_in, W->attn_hs, W->attn_hb,
                                    W->attn_rs, W->attn_rb, W->post_norm, N, D, c->rms_norm_eps));
        /* m, r = MoE(u, r); x = (m + bh') ⊙ sh' + (x + br') ⊙ sr', normed by the next layer (or the final norm) */
        MoeBuffers moe = moe_buffers_of(L, tm, a->gemm);
        moe_block_forward(c, W, &moe, r_prev, N);
        float *u_next = last ? a->final_normed : a->layers[l + 1].u_attn;
        float *rstd_next = last ? a->final_rstd : a->layers[l + 1].rstd_attn;
        const float *w_next = last ? w->final_norm : w->layers[l + 1].input_norm;
        TIMED(tm, PHASE_NORMS,
              merge_rmsnorm_forward(x_out, u_next, rstd_next, L->moe_out, L->x_mid, W->mlp_hs, W->mlp_hb, W->mlp_rs,
                                    W->mlp_rb, w_next, N, D, c->rms_norm_eps));
        r_prev = L->router_z;
    }
    /* logits = RMSNorm(x; w_final) · headᵀ */
    TIMED(tm, PHASE_HEAD,
          zy_matmul_wt_ctx(a->gemm, N, c->vocab_size, D, a->final_normed, D, WEIGHT_VIEWS(w->lm_head), a->logits,
                           c->vocab_size));
}

double model_loss(const Model *m, Activations *a, const int32_t *targets) {
    return cross_entropy(NULL, a->row_loss, a->logits, targets, a->B * a->T, m->cfg.vocab_size, 1.0);
}

/* ======================================================================================================
 * Backward (reverse order of the forward; every gradient accumulates)
 * ====================================================================================================== */

static void zero(float *p, size_t n) { memset(p, 0, n * sizeof(float)); }

/* Input: d->d_h = dL/d(moe_out); dz = dL/dz carried back from layer l+1's router (zeroed at the last layer).
 * Output: d->d_u = dL/du_mlp (overwritten); dz_prev = dL/dr_prev for the previous layer (when r_prev). dz is
 * consumed (the router's own gradient is added to it). */
static void moe_backward(const ZayaConfig *c, const LayerWeights *W, LayerWeights *G, LayerActs *L,
                         const float *r_prev, BackwardScratch *d, float *dz, float *dz_prev, int N, double *tm,
                         ZyGemmCtx *gemm) {
    const int D = c->hidden_size, R = c->router_hidden_size, I = c->moe_intermediate_size;
    const int E = c->moe == ZY_MOE_DENSE ? 1 : c->num_experts, K = cfg_router_classes(c);
    const int n_routed = L->expert_offset[E];
    double t0 = tm ? zy_now_seconds() : 0;
    /* out = gate ⊙ y: dgate and dy in one pass over the routed rows */
    zero(d->d_gate, N);
    moe_gate_backward(d->d_gate, d->d_expert_out, d->d_h, L->expert_out, L->gate, L->sorted_rows, n_routed, D);
    double t1 = tm ? zy_now_seconds() : 0;
    if (c->moe == ZY_MOE_DENSE) { /* gate ≡ 1: no router; the experts' backward adds into a zeroed d_u */
        zero(d->d_u, (size_t)N * D);
    } else {
        zero(d->d_router_logits, (size_t)N * K);
        router_choice_backward(d->d_router_logits, d->d_gate, L->router_probs, L->choice, N, K);
    }
    if (c->moe != ZY_MOE_DENSE && c->router == ZY_ROUTER_LINEAR) { /* logits = u Wᵀ */
        zy_gemm_ctx_w(gemm, 0, 0, N, D, K, 1, d->d_router_logits, K, W->router_w, D, 0, d->d_u, D);
        zy_gemm_ctx_ex(gemm, 1, 0, K, D, N, 1, d->d_router_logits, K, ZY_MM_AGAIN, L->u_mlp, D, ZY_MM_STABLE, 1,
                       G->router_w, D);
    } else if (c->moe != ZY_MOE_DENSE) {
        /* router MLP, through the gate only; every activation gradient is a GEMM into its destination (beta = 0) */
        zy_gemm_ctx_w(gemm, 0, 0, N, R, K, 1, d->d_router_logits, K, W->router_out_w, R, 0, d->d_h2, R);
        zy_gemm_ctx_ex(gemm, 1, 0, K, R, N, 1, d->d_router_logits, K, ZY_MM_AGAIN, L->router_h2, R, ZY_MM_STABLE, 1,
                       G->router_out_w, R);
        gelu_bias_backward(d->d_h1, G->router_fc2_b, d->d_h2, L->router_h2_pre, N, R); /* d_h1 = d(h2_pre) */
        zy_gemm_ctx_w(gemm, 0, 0, N, R, R, 1, d->d_h1, R, W->router_fc2_w, R, 0, d->d_h2, R);       /* d_h2 = d(h1) */
        zy_gemm_ctx_ex(gemm, 1, 0, R, R, N, 1, d->d_h1, R, ZY_MM_AGAIN, L->router_h1, R, ZY_MM_STABLE, 1,
                       G->router_fc2_w, R);
        gelu_bias_backward(d->d_h1, G->router_fc1_b, d->d_h2, L->router_h1_pre, N, R); /* d_h1 = d(h1_pre) */
        zy_gemm_ctx_w(gemm, 0, 0, N, R, R, 1, d->d_h1, R, W->router_fc1_w, R, 0, d->d_zn, R);
        zy_gemm_ctx_ex(gemm, 1, 0, R, R, N, 1, d->d_h1, R, ZY_MM_AGAIN, L->router_zn, R, ZY_MM_STABLE, 1,
                       G->router_fc1_w, R);
        rmsnorm_backward(dz, G->router_norm, d->d_zn, L->router_z, W->router_norm, L->router_rstd, N, R);
        /* z = u W_downᵀ + b + r_prev ⊙ γ */
        state_backward(dz_prev, G->router_state_scale, G->router_down_b, dz, r_prev, W->router_state_scale, N, R);
        zy_gemm_ctx_w(gemm, 0, 0, N, D, R, 1, dz, R, W->router_down_w, D, 0, d->d_u, D);
        zy_gemm_ctx_ex(gemm, 1, 0, R, D, N, 1, dz, R, ZY_MM_AGAIN, L->u_mlp, D, ZY_MM_STABLE, 1, G->router_down_w, D);
    }
    double t2 = tm ? zy_now_seconds() : 0;
    /* experts: grouped GEMMs, SwiGLU backward, scatter-add of dxin into d_u */
    moe_experts_backward(d->d_u, G->expert_gate_up, G->expert_down, d->d_expert_act, d->d_expert_gu, d->d_expert_in,
                         d->d_expert_out, L->expert_in, L->expert_gu, L->expert_act, L->sorted_rows, L->expert_offset,
                         W->expert_gate_up, W->expert_down, D, I, E, gemm);
    if (tm) {
        tm[PHASE_EXPERTS] += (t1 - t0) + (zy_now_seconds() - t2);
        tm[PHASE_ROUTER] += t2 - t1;
    }
}

/* Input: d->d_h = dL/d(attn_proj). Output: d->d_u += dL/du_attn. The MHA variant's backward. */
static void mha_backward(const ZayaConfig *c, const LayerWeights *W, LayerWeights *G, LayerActs *L,
                         const Activations *a, BackwardScratch *d, int l) {
    const int B = a->B, T = a->T, N = B * T, D = c->hidden_size, dh = c->head_dim;
    const int Hq = c->num_heads, Hkv = c->num_kv_heads, Cq = Hq * dh, Ck = Hkv * dh;
    const AttnGeom g = attn_geom(c, a, l);
    zero(d->d_attn_out, (size_t)N * Cq);
    linear_backward(d->d_attn_out, G->w_o, NULL, d->d_h, L->attn_out, W->w_o, N, Cq, D, a->gemm);
    zero(d->d_query, (size_t)N * Cq);
    zero(d->d_key, (size_t)N * Ck);
    zero(d->d_value, (size_t)N * Ck);
    flash_attention_backward(d->d_query, d->d_key, d->d_value, d->d_attn_out, L->attn_out, L->lse, L->query, L->key,
                             L->value, B, T, Hq, Hkv, dh, g.window, a->attn_work, a->attn_threads);
    rope_backward(d->d_query, g.cos, g.sin, N, T, Hq, dh, g.rd);
    rope_backward(d->d_key, g.cos, g.sin, N, T, Hkv, dh, g.rd);
    linear_backward(d->d_u, G->w_q, NULL, d->d_query, L->u_attn, W->w_q, N, D, Cq, a->gemm);
    linear_backward(d->d_u, G->w_k, NULL, d->d_key, L->u_attn, W->w_k, N, D, Ck, a->gemm);
    linear_backward(d->d_u, G->w_v, NULL, d->d_value, L->u_attn, W->w_v, N, D, Ck, a->gemm);
}

/* Input: d->d_h = dL/d(attn_proj). Output: d->d_u += dL/du_attn. */
static void cca_backward(const ZayaConfig *c, const LayerWeights *W, LayerWeights *G, LayerActs *L,
                         const Activations *a, BackwardScratch *d, int l) {
    const AttnGeom g = attn_geom(c, a, l);
    const int B = a->B, T = a->T, N = B * T, D = c->hidden_size, dh = c->head_dim;
    const int Hq = c->num_heads, Hkv = c->num_kv_heads, Cq = Hq * dh, Ck = Hkv * dh, C = Cq + Ck;
    /* 8. output projection */
    zero(d->d_attn_out, (size_t)N * Cq);
    linear_backward(d->d_attn_out, G->w_o, NULL, d->d_h, L->attn_out, W->w_o, N, Cq, D, a->gemm);
    /* 7. attention */
    zero(d->d_query, (size_t)N * Cq);
    zero(d->d_key, (size_t)N * Ck);
    zero(d->d_value, (size_t)N * Ck);
    flash_attention_backward(d->d_query, d->d_key, d->d_value, d->d_attn_out, L->attn_out, L->lse, L->query, L->key,
                             L->value, B, T, Hq, Hkv, dh, g.window, a->attn_work, a->attn_threads);
    /* 4. delayed values (first, so d_value is free scratch afterwards) */
    zero(d->d_vc, (size_t)N * Ck / 2);
    zero(d->d_vd, (size_t)N * Ck / 2);
    delayed_value_backward(d->d_vc, d->d_vd, d->d_value, B, T, Ck / 2);
    linear_backward(d->d_u, G->w_v_current, NULL, d->d_vc, L->u_attn, W->w_v_current, N, D, Ck / 2, a->gemm);
    linear_backward(d->d_u, G->w_v_delayed, NULL, d->d_vd, L->u_attn, W->w_v_delayed, N, D, Ck / 2, a->gemm);
    /* 6. RoPE and 5. QK norm in one pass → gradients of query_pre / key_pre, overwritten (reusing the free
     * d_attn_out / d_value buffers) */
    const float scale = sqrtf((float)dh), eps = 1.1920928955078125e-07f;
    float *d_query_pre = d->d_attn_out, *d_key_pre = d->d_value;
    rope_l2norm_backward(d_query_pre, NULL, d->d_query, L->query_pre, L->q_norm, NULL, g.cos, g.sin, N, T, Hq, dh, g.rd,
                         scale, eps);
    rope_l2norm_backward(d_key_pre, G->temp, d->d_key, L->key_pre, L->k_norm, W->temp, g.cos, g.sin, N, T, Hkv, dh,
                         g.rd, scale, eps);
    /* 3. q-k mean skip → dY (conv output) and dX (direct path) */
    zero(d->d_conv_out, (size_t)N * C);
    zero(d->d_qk_down, (size_t)N * C);
    qk_mean_backward(d->d_conv_out, d->d_qk_down, d_query_pre, d_key_pre, N, Hq, Hkv, dh);
    /* 2. convolutions */
    cca_conv_backward(d->d_qk_down, G->conv_dw_w, G->conv_dw_b, G->conv_gr_w, G->conv_gr_b, d->d_conv_mid,
                      a->conv_wp, a->conv_dwp, d->d_conv_out, L->qk_down, L->conv_mid, W->conv_dw_w, W->conv_gr_w,
                      model_conv_shape(c, B, T));
    /* 1. down projections (dX has row stride C) */
    zy_gemm_ctx_w(a->gemm, 0, 0, N, D, Cq, 1, d->d_qk_down, C, W->w_q, D, 1, d->d_u, D);
    zy_gemm_ctx_ex(a->gemm, 1, 0, Cq, D, N, 1, d->d_qk_down, C, ZY_MM_AGAIN, L->u_attn, D, ZY_MM_STABLE, 1, G->w_q, D);
    zy_gemm_ctx_w(a->gemm, 0, 0, N, D, Ck, 1, d->d_qk_down + Cq, C, W->w_k, D, 1, d->d_u, D);
    zy_gemm_ctx_ex(a->gemm, 1, 0, Ck, D, N, 1, d->d_qk_down + Cq, C, ZY_MM_AGAIN, L->u_attn, D, ZY_MM_STABLE, 1,
                   G->w_k, D);
}

double model_backward(Model *m, Activations *a, const int32_t *targets) {
    const ZayaConfig *c = &m->cfg;
    const int N = a->B * a->T, D = c->hidden_size, R = c->router_hidden_size, V = c->vocab_size;
    const Weights *w = &m->w;
    Weights *g = &m->g;
    BackwardScratch *d = &a->d;
    /* loss and head: d_final = d_logits · head (beta = 0: no zeroing pass) */
    double *tm = a->phase_seconds, loss = 0;
    TIMED(tm, PHASE_HEAD, {
        loss = cross_entropy(d->d_logits, a->row_loss, a->logits, targets, N, V, 1.0);
        zy_gemm_ctx_w(a->gemm, 0, 0, N, D, V, 1, d->d_logits, V, w->lm_head, D, 0, d->d_final, D);
        zy_gemm_ctx_ex(a->gemm, 1, 0, V, D, N, 1, d->d_logits, V, ZY_MM_AGAIN, a->final_normed, D, ZY_MM_STABLE, 1,
                       g->lm_head, D);
    });
    /* Each RMSNorm backward runs fused with the backward of the residual merge that produced its input
     * (rmsnorm_merge_backward): d_x becomes the residual-path gradient below the merge, d_h its other input's. */
    const int Last = c->num_layers - 1;
    zero(d->d_x, (size_t)N * D);
    {
        const LayerWeights *W = &w->layers[Last];
        LayerWeights *G = &g->layers[Last];
        LayerActs *L = &a->layers[Last];
        TIMED(tm, PHASE_NORMS,
              rmsnorm_merge_backward(d->d_x, d->d_h, g->final_norm, G->mlp_hs, G->mlp_hb, G->mlp_rs, G->mlp_rb,
                                     d->d_final, a->x_final, w->final_norm, a->final_rstd, L->moe_out, L->x_mid,
                                     W->mlp_hs, W->mlp_hb, W->mlp_rs, W->mlp_rb, N, D));
    }
    /* router-state gradients ping-pong between two buffers across layers */
    float *dz = d->d_z, *dz_prev = d->d_z_carry;
    zero(dz, (size_t)N * R);
    for (int l = Last; l >= 0; l--) {
        const LayerWeights *W = &w->layers[l];
        LayerWeights *G = &g->layers[l];
        LayerActs *L = &a->layers[l];
        const float *r_prev = l > 0 ? a->layers[l - 1].router_z : NULL;
        /* here d_h = dL/dmoe_out, d_x = dL/dx_mid through the residual path */
        moe_backward(c, W, G, L, r_prev, d, dz, dz_prev, N, tm, a->gemm);
        float *t = dz;
        dz = dz_prev;
        dz_prev = t;
        /* u_mlp = RMSNorm(x_mid), x_mid = (a + bh) ⊙ sh + (x_in + br) ⊙ sr */
        TIMED(tm, PHASE_NORMS,
              rmsnorm_merge_backward(d->d_x, d->d_h, G->post_norm, G->attn_hs, G->attn_hb, G->attn_rs, G->attn_rb,
                                     d->d_u, L->x_mid, W->post_norm, L->rstd_mlp, L->attn_proj, L->x_in, W->attn_hs,
                                     W->attn_hb, W->attn_rs, W->attn_rb, N, D));
        zero(d->d_u, (size_t)N * D);
        if (c->attention == ZY_ATTN_CCA)
            TIMED(tm, PHASE_ATTENTION, cca_backward(c, W, G, L, a, d, l));
        else
            TIMED(tm, PHASE_ATTENTION, mha_backward(c, W, G, L, a, d, l));
        if (l > 0) { /* u_attn = RMSNorm(x_in), x_in = the previous layer's MLP merge */
            const LayerWeights *Wp = &w->layers[l - 1];
            LayerWeights *Gp = &g->layers[l - 1];
            LayerActs *Lp = &a->layers[l - 1];
            TIMED(tm, PHASE_NORMS,
                  rmsnorm_merge_backward(d->d_x, d->d_h, G->input_norm, Gp->mlp_hs, Gp->mlp_hb, Gp->mlp_rs, Gp->mlp_rb,
                                         d->d_u, L->x_in, W->input_norm, L->rstd_attn, Lp->moe_out, Lp->x_mid,
                                         Wp->mlp_hs, Wp->mlp_hb, Wp->mlp_rs, Wp->mlp_rb, N, D));
        } else {
            TIMED(tm, PHASE_NORMS,
                  rmsnorm_backward(d->d_x, G->input_norm, d->d_u, L->x_in, W->input_norm, L->rstd_attn, N, D));
        }
    }
    embed_backward(g->embed, g->in_bias, g->in_scale, d->d_x, w->embed, a->tokens, w->in_bias, w->in_scale, N, D,
                   c->pad_token_id);
    return loss;
}
