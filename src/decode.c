/* Cached incremental inference: the layer loop of model.c's forward for n new tokens per sequence, reading the
 * past from a KV cache. Every op is the kernel the full forward uses; the only new piece is attention of new
 * queries over cached keys (a rectangular causal mask). */
#include "decode.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "matmul.h"

/* ---- layout: one block carved into buffers (sizing pass with base = NULL, then binding) ------------------- */

#define CF ZY_CARVE_F
#define CI ZY_CARVE_I

static void carve_cache(ZyCarver *cv, KVCache *c) {
    const ZayaConfig *f = &c->cfg;
    const size_t B = c->batch, ML = c->max_len, Ch = c->chunk, N = B * Ch, P = c->conv_pad;
    const size_t D = f->hidden_size, Cq = cfg_q_channels(f), Ck = cfg_k_channels(f), C = Cq + Ck;
    const size_t R = f->router_hidden_size, E1 = f->num_experts + 1, I = f->moe_intermediate_size;
    const size_t Hq = f->num_heads, Hkv = f->num_kv_heads, half_rd = cfg_rotary_dim(f) / 2;
    const size_t TE = P + Ch;
    for (int l = 0; l < f->num_layers; l++) {
        c->k[l] = CF(cv, B * ML * Ck);
        c->v[l] = CF(cv, B * ML * Ck);
        c->conv_state[l] = CF(cv, B * P * C);
        c->vd_prev[l] = CF(cv, B * Ck / 2);
    }
    c->cache_bytes = cv->used;
    c->mark_state = CF(cv, (size_t)f->num_layers * B * (P * C + Ck / 2));
    c->rope_cos = CF(cv, ML * half_rd);
    c->rope_sin = CF(cv, ML * half_rd);
    DecodeScratch *s = &c->s;
    s->tokens = CI(cv, N);
    s->x = CF(cv, N * D);
    s->x_mid = CF(cv, N * D);
    s->u = CF(cv, N * D);
    s->rstd = CF(cv, N);
    s->X = CF(cv, N * C);
    s->Xe = CF(cv, B * TE * C);
    s->Ye = CF(cv, B * TE * C);
    s->Me = CF(cv, B * (TE + f->cca_time1 - 1) * C);
    s->query_pre = CF(cv, N * Cq);
    s->key_pre = CF(cv, N * Ck);
    s->query = CF(cv, N * Cq);
    s->key = CF(cv, N * Ck);
    s->norm_q = CF(cv, N * Hq);
    s->norm_k = CF(cv, N * Hkv);
    s->vc = CF(cv, N * Ck / 2);
    s->vd = CF(cv, N * Ck / 2);
    s->value = CF(cv, N * Ck);
    s->scores = CF(cv, Ch * ML);
    s->attn_out = CF(cv, N * Cq);
    s->proj = CF(cv, N * D);
    s->z[0] = CF(cv, N * R);
    s->z[1] = CF(cv, N * R);
    s->zn = CF(cv, N * R);
    s->h1 = CF(cv, N * R);
    s->h2 = CF(cv, N * R);
    s->router_logits = CF(cv, N * E1);
    s->router_probs = CF(cv, N * E1);
    s->choice = CI(cv, N);
    s->gate = CF(cv, N);
    s->expert_offset = CI(cv, E1);
    s->expert_cursor = CI(cv, E1);
    s->sorted_rows = CI(cv, N);
    s->expert_in = CF(cv, N * D);
    s->expert_gu = CF(cv, N * 2 * I);
    s->expert_act = CF(cv, N * I);
    s->expert_out = CF(cv, N * D);
    s->moe_out = CF(cv, N * D);
    s->last_rows = CF(cv, B * D);
    s->conv_wp = CF(cv, (size_t)cca_conv_work_floats((int)B, (int)TE, (int)C, f->head_dim, f->cca_time1));
}

size_t kvcache_bytes_per_token(const ZayaConfig *cfg) {
    return (size_t)cfg->num_layers * 2 * cfg_k_channels(cfg) * sizeof(float);
}

int kvcache_create_ex(KVCache *c, const ZayaConfig *cfg, int batch, int max_len, int chunk, ZyErr *err) {
    memset(c, 0, sizeof *c);
    if (batch <= 0 || max_len <= 0 || chunk <= 0)
        return zy_fail(err, "KV cache: batch %d, max_len %d and chunk %d must be positive", batch, max_len, chunk);
    if (max_len > cfg->max_position_embeddings)
        return zy_fail(err, "KV cache: max_len %d exceeds max_position_embeddings %d", max_len,
                       cfg->max_position_embeddings);
    c->cfg = *cfg;
    c->batch = batch;
    c->max_len = max_len;
    c->chunk = chunk < max_len ? chunk : max_len;
    c->conv_pad = cfg->attention == ZY_ATTN_CCA ? cfg_conv_pad(cfg) : 0; /* the MHA variant has no convolutions */
    const int L = cfg->num_layers;
    float **ptrs = calloc((size_t)4 * L, sizeof *ptrs);
    if (!ptrs) return zy_fail(err, "out of memory");
    c->ptrs = ptrs;
    c->k = ptrs;
    c->v = ptrs + L;
    c->conv_state = ptrs + 2 * L;
    c->vd_prev = ptrs + 3 * L;
    ZyCarver sizing = {0};
    carve_cache(&sizing, c);
    c->block = zy_calloc(sizing.used);
    if (!c->block) {
        size_t mb = sizing.used >> 20;
        kvcache_free(c);
        return zy_fail(err, "out of memory allocating %zu MB for a KV cache of %d x %d tokens", mb, batch, max_len);
    }
    ZyCarver cv = {.base = c->block};
    carve_cache(&cv, c);
    rope_tables(c->rope_cos, c->rope_sin, max_len, cfg_rotary_dim(cfg), cfg->rope_theta);
    return 0;
}

int kvcache_create(KVCache *c, const ZayaConfig *cfg, int batch, int max_len, ZyErr *err) {
    return kvcache_create_ex(c, cfg, batch, max_len, KV_DEFAULT_CHUNK, err);
}

void kvcache_reset(KVCache *c) {
    /* Only the state is read before being written; the k̂/v rows past len are never read. */
    const size_t B = c->batch, P = c->conv_pad, C = cfg_conv_channels(&c->cfg), half = cfg_k_channels(&c->cfg) / 2;
    for (int l = 0; l < c->cfg.num_layers; l++) {
        memset(c->conv_state[l], 0, B * P * C * sizeof(float));
        memset(c->vd_prev[l], 0, B * half * sizeof(float));
    }
    c->len = 0;
    kvcache_mark(c);
}

/* The per-sequence state of every layer, in or out of the mark buffer. */
static void copy_state(KVCache *c, int save) {
    const size_t B = c->batch, P = c->conv_pad, C = cfg_conv_channels(&c->cfg), half = cfg_k_channels(&c->cfg) / 2;
    float *m = c->mark_state;
    for (int l = 0; l < c->cfg.num_layers; l++) {
        float *conv = c->conv_state[l], *vd = c->vd_prev[l];
        memcpy(save ? m : conv, save ? conv : m, B * P * C * sizeof(float));
        m += B * P * C;
        memcpy(save ? m : vd, save ? vd : m, B * half * sizeof(float));
        m += B * half;
    }
}

void kvcache_mark(KVCache *c) {
    copy_state(c, 1);
    c->mark_len = c->len;
}

void kvcache_rewind(KVCache *c) {
    copy_state(c, 0);
    c->len = c->mark_len;
}

void kvcache_free(KVCache *c) {
    zy_free(c->block);
    free(c->ptrs);
    memset(c, 0, sizeof *c);
}

/* ---- the layer loop ------------------------------------------------------------------------------------------ */

/* Causal attention of n new queries per sequence (positions p0..p0+n-1) over the cached keys 0..p0+n-1; same
 * arithmetic as attention_forward (scaled GEMM, fp32 softmax with double sums, GEMM with the values). */
static void cached_attention(KVCache *c, int l, int n, int p0) {
    const ZayaConfig *f = &c->cfg;
    const int dh = f->head_dim, Hq = f->num_heads, Hkv = f->num_kv_heads, G = Hq / Hkv;
    const int Cq = Hq * dh, Ck = Hkv * dh, Lk = p0 + n;
    const float scale = (float)(1.0 / sqrt((double)dh));
    float *p = c->s.scores;
    for (int b = 0; b < c->batch; b++)
        for (int h = 0; h < Hq; h++) {
            const int j = h / G;
            const float *q = c->s.query + (long)b * n * Cq + h * dh;
            const float *k = c->k[l] + (long)b * c->max_len * Ck + j * dh;
            const float *v = c->v[l] + (long)b * c->max_len * Ck + j * dh;
            zy_gemm(0, 1, n, Lk, dh, scale, q, Cq, k, Ck, 0, p, Lk);
#pragma omp parallel for schedule(static) if (ZY_PAR((long)n * Lk * 4))
            for (int t = 0; t < n; t++) {
                float *row = p + (long)t * Lk;
                const int last = p0 + t; /* query at position p0+t sees keys 0..p0+t */
                float mx = row[0];
                for (int s = 1; s <= last; s++) mx = row[s] > mx ? row[s] : mx;
                double sum = 0;
                for (int s = 0; s <= last; s++) {
                    row[s] = (float)exp((double)(row[s] - mx));
                    sum += row[s];
                }
                float inv = (float)(1.0 / sum);
                for (int s = 0; s <= last; s++) row[s] *= inv;
                for (int s = last + 1; s < Lk; s++) row[s] = 0;
            }
            zy_gemm(0, 0, n, dh, Lk, 1, p, Lk, v, Ck, 0, c->s.attn_out + (long)b * n * Cq + h * dh, Cq);
        }
}

/* Appends the n new rows of s->key / s->value per sequence to layer l's cache at position len, then attends. */
static void append_kv_attend(KVCache *c, int l, int n) {
    const int Ck = cfg_k_channels(&c->cfg), p0 = c->len;
    for (int b = 0; b < c->batch; b++) {
        const long dst = ((long)b * c->max_len + p0) * Ck;
        memcpy(c->k[l] + dst, c->s.key + (long)b * n * Ck, (size_t)n * Ck * sizeof(float));
        memcpy(c->v[l] + dst, c->s.value + (long)b * n * Ck, (size_t)n * Ck * sizeof(float));
    }
    cached_attention(c, l, n, p0);
}

/* CCA on u for the new rows (N = B*n, sequence b's rows at b*n..): appends k̂ and v to the cache, updates the conv
 * and delayed-value state, writes s->proj [N, D]. */
static void cca_decode(const ZayaConfig *f, const LayerWeights *W, KVCache *c, int l, int n) {
    DecodeScratch *s = &c->s;
    const int B = c->batch, N = B * n, D = f->hidden_size, dh = f->head_dim, P = c->conv_pad, TE = P + n;
    const int Hq = f->num_heads, Hkv = f->num_kv_heads, Cq = Hq * dh, Ck = Hkv * dh, C = Cq + Ck, half = Ck / 2;
    const int p0 = c->len;
    /* 1. down projections */
    zy_matmul_wt(N, Cq, D, s->u, D, W->w_q, W->w_q16, s->X, C);
    zy_matmul_wt(N, Ck, D, s->u, D, W->w_k, W->w_k16, s->X + Cq, C);
    /* 2. convolutions over [P cached columns | n new]: the kernel's own left padding only feeds outputs for the P
     * cached rows, which are dropped; the cached zero columns before position 0 reproduce the full forward's
     * padding (depthwise outputs there are exactly b0). */
    for (int b = 0; b < B; b++) {
        float *xe = s->Xe + (long)b * TE * C;
        memcpy(xe, c->conv_state[l] + (long)b * P * C, (size_t)P * C * sizeof(float));
        memcpy(xe + (long)P * C, s->X + (long)b * n * C, (size_t)n * C * sizeof(float));
    }
    cca_conv_forward(s->Ye, s->Me, s->conv_wp, s->Xe, W->conv_dw_w, W->conv_dw_b, W->conv_gr_w, W->conv_gr_b, B, TE,
                     C, dh, f->cca_time0, f->cca_time1);
    for (int b = 0; b < B; b++)
        memcpy(c->conv_state[l] + (long)b * P * C, s->Xe + ((long)b * TE + n) * C, (size_t)P * C * sizeof(float));
    /* 3. q-k mean skip */
    for (int b = 0; b < B; b++) {
        const long off = ((long)b * TE + P) * C;
        qk_mean_forward(s->query_pre + (long)b * n * Cq, s->key_pre + (long)b * n * Ck, s->Ye + off, s->Xe + off, n,
                        Hq, Hkv, dh);
    }
    /* 4. values; the first new row's delayed half is the previous token's vd */
    zy_matmul_wt(N, half, D, s->u, D, W->w_v_current, W->w_v_current16, s->vc, half);
    zy_matmul_wt(N, half, D, s->u, D, W->w_v_delayed, W->w_v_delayed16, s->vd, half);
    delayed_value_forward(s->value, s->vc, s->vd, B, n, half);
    for (int b = 0; b < B; b++) {
        float *prev = c->vd_prev[l] + (long)b * half;
        memcpy(s->value + (long)b * n * Ck + half, prev, (size_t)half * sizeof(float));
        memcpy(prev, s->vd + ((long)b * n + n - 1) * half, (size_t)half * sizeof(float));
    }
    /* 5. QK norm and 6. RoPE at the absolute positions p0.. (tables offset by p0), fused as in model.c */
    const float scale = sqrtf((float)dh), eps = 1.1920928955078125e-07f; /* as model.c */
    const int rd = cfg_rotary_dim(f);
    const long toff = (long)p0 * (rd / 2);
    l2norm_rope_forward(s->query, s->norm_q, s->query_pre, NULL, c->rope_cos + toff, c->rope_sin + toff, N, n, Hq, dh,
                        rd, scale, eps);
    l2norm_rope_forward(s->key, s->norm_k, s->key_pre, W->temp, c->rope_cos + toff, c->rope_sin + toff, N, n, Hkv, dh,
                        rd, scale, eps);
    /* 7. attention over everything so far, the new keys and values appended first */
    append_kv_attend(c, l, n);
    /* 8. output projection */
    zy_matmul_wt(N, D, Cq, s->attn_out, Cq, W->w_o, W->w_o16, s->proj, D);
}

/* The MHA variant on u for the new rows: q, k, v, RoPE at the absolute positions, keys and values appended to the
 * cache, attention over everything so far, o_proj into s->proj [N, D]. */
static void mha_decode(const ZayaConfig *f, const LayerWeights *W, KVCache *c, int l, int n) {
    DecodeScratch *s = &c->s;
    const int B = c->batch, N = B * n, D = f->hidden_size, dh = f->head_dim, p0 = c->len;
    const int Hq = f->num_heads, Hkv = f->num_kv_heads, Cq = Hq * dh, Ck = Hkv * dh, rd = cfg_rotary_dim(f);
    zy_matmul_wt(N, Cq, D, s->u, D, W->w_q, W->w_q16, s->query, Cq);
    zy_matmul_wt(N, Ck, D, s->u, D, W->w_k, W->w_k16, s->key, Ck);
    zy_matmul_wt(N, Ck, D, s->u, D, W->w_v, W->w_v16, s->value, Ck);
    const long toff = (long)p0 * (rd / 2);
    rope_forward(s->query, c->rope_cos + toff, c->rope_sin + toff, N, n, Hq, dh, rd);
    rope_forward(s->key, c->rope_cos + toff, c->rope_sin + toff, N, n, Hkv, dh, rd);
    append_kv_attend(c, l, n);
    zy_matmul_wt(N, D, Cq, s->attn_out, Cq, W->w_o, W->w_o16, s->proj, D);
}

/* MoE block on s->u with router state r_prev (NULL at layer 0); writes s->moe_out and z (the next r_prev):
 * model.c's moe_block_forward on the decode scratch (the router MLP's GELUs in place: no backward here). */
static void moe_decode(const ZayaConfig *f, const LayerWeights *W, DecodeScratch *s, float *z, const float *r_prev,
                       int N) {
    const MoeBuffers b = {.u = s->u, .z = z, .zn = s->zn, .rstd = s->rstd, .h1_pre = s->h1, .h1 = s->h1,
                          .h2_pre = s->h2, .h2 = s->h2, .logits = s->router_logits, .probs = s->router_probs,
                          .choice = s->choice, .gate = s->gate, .expert_offset = s->expert_offset,
                          .expert_cursor = s->expert_cursor, .sorted_rows = s->sorted_rows, .expert_in = s->expert_in,
                          .expert_gu = s->expert_gu, .expert_act = s->expert_act, .expert_out = s->expert_out,
                          .out = s->moe_out, .phase_seconds = NULL};
    moe_block_forward(f, W, &b, r_prev, N);
}

/* One piece of n <= chunk tokens per sequence (s->tokens [B, n] filled). Logits of position t_off+t of
 * sequence b go to logits[(b*n_total + t_off + t) * V] (all positions) or, with last_only, the last row of each
 * sequence to logits[b * V]. */
static void decode_piece(const Model *m, KVCache *c, int n, float *logits, int last_only, int n_total, int t_off,
                         int32_t *routing) {
    const ZayaConfig *f = &m->cfg;
    const Weights *w = &m->w;
    DecodeScratch *s = &c->s;
    const int B = c->batch, N = B * n, D = f->hidden_size, V = f->vocab_size;
    if (w->embed16)
        embed_forward_bf16(s->x, w->embed16, s->tokens, w->in_bias, w->in_scale, N, D);
    else
        embed_forward(s->x, w->embed, s->tokens, w->in_bias, w->in_scale, N, D);
    const float *r_prev = NULL;
    /* residual merges fused with the RMSNorm reading their output, as in model_forward */
    rmsnorm_forward(s->u, s->rstd, s->x, w->layers[0].input_norm, N, D, f->rms_norm_eps);
    for (int l = 0; l < f->num_layers; l++) {
        const LayerWeights *W = &w->layers[l];
        if (f->attention == ZY_ATTN_CCA)
            cca_decode(f, W, c, l, n);
        else
            mha_decode(f, W, c, l, n);
        merge_rmsnorm_forward(s->x_mid, s->u, s->rstd, s->proj, s->x, W->attn_hs, W->attn_hb, W->attn_rs, W->attn_rb,
                              W->post_norm, N, D, f->rms_norm_eps);
        float *z = s->z[l & 1];
        moe_decode(f, W, s, z, r_prev, N);
        if (l + 1 < f->num_layers)
            merge_rmsnorm_forward(s->x, s->u, s->rstd, s->moe_out, s->x_mid, W->mlp_hs, W->mlp_hb, W->mlp_rs,
                                  W->mlp_rb, w->layers[l + 1].input_norm, N, D, f->rms_norm_eps);
        else
            residual_merge_forward(s->x, s->moe_out, s->x_mid, W->mlp_hs, W->mlp_hb, W->mlp_rs, W->mlp_rb, N, D);
        r_prev = z;
        if (routing)
            for (int b = 0; b < B; b++)
                memcpy(routing + ((long)l * B + b) * n_total + t_off, s->choice + (long)b * n, (size_t)n * sizeof(int32_t));
    }
    c->len += n;
    if (!logits) return;
    if (last_only) {
        for (int b = 0; b < B; b++)
            memcpy(s->last_rows + (long)b * D, s->x + ((long)b * n + n - 1) * D, (size_t)D * sizeof(float));
        rmsnorm_forward(s->u, s->rstd, s->last_rows, w->final_norm, B, D, f->rms_norm_eps);
        zy_matmul_wt(B, V, D, s->u, D, w->lm_head, w->lm_head16, logits, V);
        return;
    }
    rmsnorm_forward(s->u, s->rstd, s->x, w->final_norm, N, D, f->rms_norm_eps);
    for (int b = 0; b < B; b++)
        zy_matmul_wt(n, V, D, s->u + (long)b * n * D, D, w->lm_head, w->lm_head16,
                     logits + ((long)b * n_total + t_off) * V, V);
}

int model_decode_ex(const Model *m, KVCache *c, const int32_t *tokens, int n, float *logits, int last_only,
                    int32_t *routing, ZyErr *err) {
    const ZayaConfig *f = &m->cfg, *cc = &c->cfg;
    if (f->num_layers != cc->num_layers || f->hidden_size != cc->hidden_size || f->num_heads != cc->num_heads ||
        f->num_kv_heads != cc->num_kv_heads || f->head_dim != cc->head_dim || f->cca_time0 != cc->cca_time0 ||
        f->cca_time1 != cc->cca_time1 || f->num_experts != cc->num_experts ||
        f->router_hidden_size != cc->router_hidden_size || f->moe_intermediate_size != cc->moe_intermediate_size ||
        f->rope_theta != cc->rope_theta || f->partial_rotary_factor != cc->partial_rotary_factor ||
        f->attention != cc->attention || f->router != cc->router || f->moe != cc->moe ||
        f->no_residual_scaling != cc->no_residual_scaling)
        return zy_fail(err, "decode: the KV cache was built for another model shape");
    if (n <= 0) return zy_fail(err, "decode: %d new tokens (must be at least 1)", n);
    if (n > c->max_len - c->len)
        return zy_fail(err, "decode: KV cache full (%d + %d tokens > max_len %d)", c->len, n, c->max_len);
    const int B = c->batch;
    for (long i = 0; i < (long)B * n; i++)
        if (tokens[i] < 0 || tokens[i] >= f->vocab_size)
            return zy_fail(err, "decode: token id %d at [%ld, %ld] is outside the vocabulary [0, %d)", tokens[i], i / n,
                           i % n, f->vocab_size);
    for (int t0 = 0; t0 < n; t0 += c->chunk) {
        const int k = n - t0 < c->chunk ? n - t0 : c->chunk, final = t0 + k == n;
        for (int b = 0; b < B; b++)
            memcpy(c->s.tokens + (long)b * k, tokens + (long)b * n + t0, (size_t)k * sizeof(int32_t));
        /* with last_only, only the final piece produces logits */
        float *lg = last_only && !final ? NULL : logits;
        decode_piece(m, c, k, lg, last_only, n, t0, routing);
    }
    return 0;
}

int model_decode(const Model *m, KVCache *c, const int32_t *tokens, int n, float *logits, int last_only, ZyErr *err) {
    return model_decode_ex(m, c, tokens, n, logits, last_only, NULL, err);
}

/* ---- generation ----------------------------------------------------------------------------------------------- */

int generate_with(const DecodeBackend *be, Sampler *s, const SamplingParams *p, ZyRng *rng, const int32_t *prompt,
                  int n_prompt, int max_new, const int32_t *stop_ids, int n_stop, GenerateTokenFn fn, void *ctx,
                  GenerateStats *st, ZyErr *err) {
    memset(st, 0, sizeof *st);
    st->n_prompt = n_prompt;
    if (be->batch != 1) return zy_fail(err, "generate: the KV cache must hold one sequence (has %d)", be->batch);
    if (s->V != be->vocab_size)
        return zy_fail(err, "generate: sampler built for %d tokens, model has %d", s->V, be->vocab_size);
    if (n_prompt <= 0) return zy_fail(err, "generate: empty prompt");
    if (n_prompt > be->max_len)
        return zy_fail(err, "generate: prompt of %d tokens does not fit the %d-token context", n_prompt, be->max_len);
    float *logits = malloc((size_t)be->vocab_size * sizeof *logits);
    if (!logits) return zy_fail(err, "out of memory");
    be->reset(be->ctx);
    int rc = -1;
    double t0 = zy_now_seconds();
    if (be->decode(be->ctx, prompt, n_prompt, logits, err)) goto done;
    st->prefill_s = zy_now_seconds() - t0;
    t0 = zy_now_seconds();
    st->stop = GEN_STOP_MAX_TOKENS;
    while (st->n_generated < max_new) {
        int32_t tok = sample_next(s, p, logits, rng);
        st->n_generated++;
        int stop = 0;
        for (int i = 0; i < n_stop; i++) stop |= tok == stop_ids[i];
        int cb = fn ? fn(ctx, tok, err) : 0;
        if (cb < 0) goto done;
        if (stop) {
            st->stop = GEN_STOP_EOS;
            break;
        }
        if (cb > 0) {
            st->stop = GEN_STOP_CALLBACK;
            break;
        }
        if (st->n_generated == max_new) break; /* the last token needs no forward */
        if (be->len(be->ctx) >= be->max_len) {
            st->stop = GEN_STOP_CACHE_FULL;
            break;
        }
        if (be->decode(be->ctx, &tok, 1, logits, err)) goto done;
    }
    st->decode_s = zy_now_seconds() - t0;
    rc = 0;
done:
    free(logits);
    return rc;
}

/* The CPU backend: model_decode on a KVCache. */
typedef struct {
    const Model *m;
    KVCache *c;
} CpuDecode;
static void cpu_reset(void *x) { kvcache_reset(((CpuDecode *)x)->c); }
static int cpu_decode(void *x, const int32_t *tokens, int n, float *logits, ZyErr *err) {
    CpuDecode *d = x;
    return model_decode(d->m, d->c, tokens, n, logits, 1, err);
}
static int cpu_len(void *x) { return ((CpuDecode *)x)->c->len; }

int generate(const Model *m, KVCache *c, Sampler *s, const SamplingParams *p, ZyRng *rng, const int32_t *prompt,
             int n_prompt, int max_new, const int32_t *stop_ids, int n_stop, GenerateTokenFn fn, void *ctx,
             GenerateStats *st, ZyErr *err) {
    CpuDecode d = {.m = m, .c = c};
    const DecodeBackend be = {.ctx = &d, .reset = cpu_reset, .decode = cpu_decode, .len = cpu_len,
                              .batch = c->batch, .max_len = c->max_len, .vocab_size = m->cfg.vocab_size};
    return generate_with(&be, s, p, rng, prompt, n_prompt, max_new, stop_ids, n_stop, fn, ctx, st, err);
}
