/* Cached decoding on a GPU (gpu_decode.h): src/infer/decode.c's steps, each a gk_ kernel or a cuBLASLt product. */
#include "gpu/gpu_decode.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/gpu.h"
#include "gpu/gpu_model_internal.h"
#include "kernels/kernels.h"

/* Device scratch for one piece of B*chunk new rows, as DecodeScratch. */
typedef struct {
    int32_t *tokens;
    float *x, *x_mid, *u, *rstd;
    float *X, *Xe, *Ye, *Me;
    float *query_pre, *key_pre, *query, *key, *norm_q, *norm_k;
    float *vc, *vd, *value, *attn_out, *proj;
    float *z[2];
    LayerActs moe;   /* the MoE block's buffers (u_mlp = u; router state in z[]) */
    float *last_rows, *logits;
} GpuDecodeScratch;

struct GpuKVCache {
    GpuModel *gm;
    int batch, max_len, chunk, len, conv_pad;
    float **k, **v, **conv_state, **vd_prev; /* per layer, device */
    float *rope_cos, *rope_sin;
    float *rope_cos_sw, *rope_sin_sw; /* the sliding-window layers' own tables (NULL without such layers) */
    GpuDecodeScratch s;
    int32_t *h_tokens; /* host staging [B*chunk] */
    void *block;
    size_t bytes, cache_bytes;
};

static void carve(ZyCarver *cv, GpuKVCache *c) {
    const ZayaConfig *f = &c->gm->cfg;
    const size_t B = c->batch, n = c->chunk, N = B * n, D = f->hidden_size, V = f->vocab_size;
    const size_t Cq = cfg_q_channels(f), Ck = cfg_k_channels(f), C = Cq + Ck, half = Ck / 2;
    const size_t R = f->router_hidden_size, E1 = f->num_experts + 1, I = f->moe_intermediate_size;
    const size_t P = c->conv_pad, TE = P + n, rd = cfg_rotary_dim(f), L = f->num_layers;
    for (size_t l = 0; l < L; l++) {
        c->k[l] = ZY_CARVE_F(cv, B * c->max_len * Ck);
        c->v[l] = ZY_CARVE_F(cv, B * c->max_len * Ck);
        c->conv_state[l] = ZY_CARVE_F(cv, B * P * C);
        c->vd_prev[l] = ZY_CARVE_F(cv, B * half);
    }
    c->cache_bytes = cv->used;
    c->rope_cos = ZY_CARVE_F(cv, (size_t)c->max_len * (rd / 2));
    c->rope_sin = ZY_CARVE_F(cv, (size_t)c->max_len * (rd / 2));
    const size_t rds = cfg_has_sliding(f) ? (size_t)cfg_sliding_rotary_dim(f) : 0;
    c->rope_cos_sw = rds ? ZY_CARVE_F(cv, (size_t)c->max_len * (rds / 2)) : NULL;
    c->rope_sin_sw = rds ? ZY_CARVE_F(cv, (size_t)c->max_len * (rds / 2)) : NULL;
    GpuDecodeScratch *s = &c->s;
    s->tokens = ZY_CARVE_I(cv, N);
    s->x = ZY_CARVE_F(cv, N * D);
    s->x_mid = ZY_CARVE_F(cv, N * D);
    s->u = ZY_CARVE_F(cv, N * D);
    s->rstd = ZY_CARVE_F(cv, N);
    s->X = ZY_CARVE_F(cv, N * C);
    s->Xe = ZY_CARVE_F(cv, B * TE * C);
    s->Ye = ZY_CARVE_F(cv, B * TE * C);
    s->Me = ZY_CARVE_F(cv, B * (TE + f->cca_time1 - 1) * C);
    s->query_pre = ZY_CARVE_F(cv, N * Cq);
    s->key_pre = ZY_CARVE_F(cv, N * Ck);
    s->query = ZY_CARVE_F(cv, N * Cq);
    s->key = ZY_CARVE_F(cv, N * Ck);
    s->norm_q = ZY_CARVE_F(cv, N * f->num_heads);
    s->norm_k = ZY_CARVE_F(cv, N * f->num_kv_heads);
    s->vc = ZY_CARVE_F(cv, N * half);
    s->vd = ZY_CARVE_F(cv, N * half);
    s->value = ZY_CARVE_F(cv, N * Ck);
    s->attn_out = ZY_CARVE_F(cv, N * Cq);
    s->proj = ZY_CARVE_F(cv, N * D);
    s->z[0] = ZY_CARVE_F(cv, N * R);
    s->z[1] = ZY_CARVE_F(cv, N * R);
    LayerActs *m = &s->moe;
    m->router_zn = ZY_CARVE_F(cv, N * R);
    m->router_rstd = ZY_CARVE_F(cv, N);
    m->router_h1_pre = ZY_CARVE_F(cv, N * R);
    m->router_h1 = ZY_CARVE_F(cv, N * R);
    m->router_h2_pre = ZY_CARVE_F(cv, N * R);
    m->router_h2 = ZY_CARVE_F(cv, N * R);
    m->router_logits = ZY_CARVE_F(cv, N * E1);
    m->router_probs = ZY_CARVE_F(cv, N * E1);
    m->choice = ZY_CARVE_I(cv, N);
    m->gate = ZY_CARVE_F(cv, N);
    m->expert_offset = ZY_CARVE_I(cv, E1);
    m->expert_cursor = ZY_CARVE_I(cv, E1);
    m->sorted_rows = ZY_CARVE_I(cv, N);
    m->expert_in = ZY_CARVE_F(cv, N * D);
    m->expert_gu = ZY_CARVE_F(cv, N * 2 * I);
    m->expert_act = ZY_CARVE_F(cv, N * I);
    m->expert_out = ZY_CARVE_F(cv, N * D);
    m->moe_out = ZY_CARVE_F(cv, N * D);
    s->last_rows = ZY_CARVE_F(cv, B * D);
    s->logits = ZY_CARVE_F(cv, N * V);
}

int gpu_kvcache_create(GpuKVCache **out, GpuModel *gm, int batch, int max_len, int chunk, ZyErr *err) {
    *out = NULL;
    const ZayaConfig *f = &gm->cfg;
    if (chunk <= 0) chunk = KV_DEFAULT_CHUNK;
    if (batch <= 0 || max_len <= 0) return zy_fail(err, "KV cache: batch %d, max_len %d must be positive", batch, max_len);
    if (max_len > f->max_position_embeddings)
        return zy_fail(err, "KV cache: max_len %d exceeds max_position_embeddings %d", max_len,
                       f->max_position_embeddings);
    if (f->head_dim > 256 || f->num_kv_heads <= 0 || f->num_heads % f->num_kv_heads)
        return zy_fail(err, "KV cache: GPU decoding takes head_dim <= 256 and num_heads a multiple of num_kv_heads "
                       "(head_dim %d, %d heads, %d kv heads)", f->head_dim, f->num_heads, f->num_kv_heads);
    if (chunk > max_len) chunk = max_len;
    GpuKVCache *c = calloc(1, sizeof *c);
    const size_t L = (size_t)f->num_layers;
    if (!c || !(c->k = calloc(4 * L, sizeof(float *)))) {
        free(c);
        return zy_fail(err, "out of memory");
    }
    c->v = c->k + L, c->conv_state = c->k + 2 * L, c->vd_prev = c->k + 3 * L;
    c->gm = gm, c->batch = batch, c->max_len = max_len, c->chunk = chunk;
    c->conv_pad = f->attention == ZY_ATTN_CCA ? (f->cca_time0 - 1) + (f->cca_time1 - 1) : 0;
    ZyCarver sizing = {0};
    carve(&sizing, c);
    c->bytes = sizing.used;
    c->h_tokens = malloc((size_t)batch * chunk * sizeof(int32_t));
    const int rd = cfg_rotary_dim(f), rds = cfg_has_sliding(f) ? cfg_sliding_rotary_dim(f) : 0;
    const size_t nt = (size_t)max_len * (rd / 2), nts = (size_t)max_len * (rds / 2);
    float *tables = malloc((2 * (nt > nts ? nt : nts) + 1) * sizeof(float));
    if (!c->h_tokens || !tables || !(c->block = gpu_alloc(c->bytes, "the KV cache", err))) {
        free(tables);
        if (c->h_tokens && tables) zy_wrap(err, "batch %d x %d tokens", batch, max_len);
        else zy_fail(err, "out of memory");
        gpu_kvcache_free(c);
        return -1;
    }
    ZyCarver cv = {.base = c->block};
    carve(&cv, c);
    rope_tables(tables, tables + nt, max_len, rd, f->rope_theta);
    int rc = gpu_upload(&gm->g, c->rope_cos, tables, nt * sizeof(float), err) ||
             gpu_upload(&gm->g, c->rope_sin, tables + nt, nt * sizeof(float), err);
    if (!rc && c->rope_cos_sw) { /* the sliding layers' RoPE, as the CPU cache builds it */
        rope_tables(tables, tables + nts, max_len, rds, f->rope_theta_sliding);
        rc = gpu_upload(&gm->g, c->rope_cos_sw, tables, nts * sizeof(float), err) ||
             gpu_upload(&gm->g, c->rope_sin_sw, tables + nts, nts * sizeof(float), err);
    }
    free(tables);
    if (rc) {
        gpu_kvcache_free(c);
        return -1;
    }
    const size_t widest = (size_t)f->vocab_size > (size_t)2 * f->moe_intermediate_size ? (size_t)f->vocab_size
                                                                                          : (size_t)2 * f->moe_intermediate_size;
    if (gm->bf16 && gpu_reserve_scratch(&gm->g, (size_t)batch * chunk * (widest > (size_t)f->hidden_size ? widest : (size_t)f->hidden_size), err)) {
        gpu_kvcache_free(c);
        return -1;
    }
    *out = c;
    return 0;
}

void gpu_kvcache_free(GpuKVCache *c) {
    if (!c) return;
    if (c->block) {
        ZyErr ignore;
        gpu_sync(&c->gm->g, "freeing the KV cache", &ignore);
        gpu_free(c->block);
    }
    free(c->k);
    free(c->h_tokens);
    free(c);
}

/* Length 0 and the state zeroed: the convolution state's zero columns stand for the padding before position 0. */
void gpu_kvcache_reset(GpuKVCache *c) {
    c->len = 0;
    gpu_memset_async(&c->gm->g, c->block, 0, c->cache_bytes);
}
int gpu_kvcache_len(const GpuKVCache *c) { return c->len; }
int gpu_kvcache_max_len(const GpuKVCache *c) { return c->max_len; }
size_t gpu_kvcache_bytes(const GpuKVCache *c) { return c->cache_bytes; }

/* ---- the layer loop ------------------------------------------------------------------------------------------ */

/* Layer l's RoPE tables, rotary dim and window (a "hybrid_sliding" layer has its own; config.h). */
typedef struct {
    const float *cos, *sin;
    int rd, window;
} LayerGeom;
static LayerGeom layer_geom(const GpuKVCache *c, int l) {
    const ZayaConfig *f = &c->gm->cfg;
    const int sw = cfg_layer_is_sliding(f, l);
    return (LayerGeom){.cos = sw ? c->rope_cos_sw : c->rope_cos, .sin = sw ? c->rope_sin_sw : c->rope_sin,
                       .rd = cfg_layer_rotary_dim(f, l), .window = cfg_layer_window(f, l)};
}

/* Appends the n new k̂ / v rows of each sequence at position len, then attends over everything so far (a sliding
 * layer: over its window). */
static void append_kv_attend(GpuKVCache *c, int l, int n) {
    const ZayaConfig *f = &c->gm->cfg;
    GkStream st = c->gm->g.stream;
    const int B = c->batch, Ck = cfg_k_channels(f), p0 = c->len;
    const long seq = (long)c->max_len * Ck;
    gk_copy_rows(st, c->k[l] + (long)p0 * Ck, seq, c->s.key, (long)n * Ck, (long)n * Ck, B);
    gk_copy_rows(st, c->v[l] + (long)p0 * Ck, seq, c->s.value, (long)n * Ck, (long)n * Ck, B);
    gk_decode_attention(st, c->s.attn_out, c->s.query, c->k[l], c->v[l], B, n, p0, c->max_len, f->num_heads,
                        f->num_kv_heads, f->head_dim, layer_geom(c, l).window);
}

/* CCA on u for the new rows: appends k̂ and v, updates the convolution and delayed-value state, writes proj. */
static void cca_decode(GpuKVCache *c, const LayerWeights *W, int l, int n) {
    GpuModel *gm = c->gm;
    const ZayaConfig *f = &gm->cfg;
    GkStream st = gm->g.stream;
    GpuDecodeScratch *s = &c->s;
    const int B = c->batch, N = B * n, D = f->hidden_size, dh = f->head_dim, P = c->conv_pad, TE = P + n;
    const int Hq = f->num_heads, Hkv = f->num_kv_heads, Cq = Hq * dh, Ck = Hkv * dh, C = Cq + Ck, half = Ck / 2;
    const int p0 = c->len;
    /* 1. down projections */
    gpu_mm_wt(gm, N, Cq, D, s->u, D, W->w_q, gpu_bf16_of(gm, W->w_q), s->X, C);
    gpu_mm_wt(gm, N, Ck, D, s->u, D, W->w_k, gpu_bf16_of(gm, W->w_k), s->X + Cq, C);
    /* 2. convolutions over [P cached columns | n new] per sequence, then the last P columns become the state */
    gk_copy_rows(st, s->Xe, (long)TE * C, c->conv_state[l], (long)P * C, (long)P * C, B);
    gk_copy_rows(st, s->Xe + (long)P * C, (long)TE * C, s->X, (long)n * C, (long)n * C, B);
    gk_cca_conv_forward(st, s->Ye, s->Me, s->Xe, W->conv_dw_w, W->conv_dw_b, W->conv_gr_w, W->conv_gr_b, B, TE, C, dh,
                        f->cca_time0, f->cca_time1);
    gk_copy_rows(st, c->conv_state[l], (long)P * C, s->Xe + (long)n * C, (long)TE * C, (long)P * C, B);
    /* 3. q-k mean skip on each sequence's new rows (rows P.. of its [state | new] block), one launch */
    gk_qk_mean_forward_seqs(st, s->query_pre, s->key_pre, s->Ye, s->Xe, B, n, TE, P, Hq, Hkv, dh);
    /* 4. values; each sequence's first new row takes the previous token's vd, and its last vd is kept */
    gpu_mm_wt(gm, N, half, D, s->u, D, W->w_v_current, gpu_bf16_of(gm, W->w_v_current), s->vc, half);
    gpu_mm_wt(gm, N, half, D, s->u, D, W->w_v_delayed, gpu_bf16_of(gm, W->w_v_delayed), s->vd, half);
    gk_delayed_value_forward(st, s->value, s->vc, s->vd, B, n, half);
    gk_copy_rows(st, s->value + half, (long)n * Ck, c->vd_prev[l], half, half, B);
    gk_copy_rows(st, c->vd_prev[l], half, s->vd + (long)(n - 1) * half, (long)n * half, half, B);
    /* 5. QK norm and 6. RoPE at the absolute positions p0.. */
    const float scale = sqrtf((float)dh), eps = 1.1920928955078125e-07f;
    const LayerGeom g = layer_geom(c, l);
    const long toff = (long)p0 * (g.rd / 2);
    gk_l2norm_rope_forward(st, s->query, s->norm_q, s->query_pre, NULL, g.cos + toff, g.sin + toff, N, n, Hq, dh,
                           g.rd, scale, eps);
    gk_l2norm_rope_forward(st, s->key, s->norm_k, s->key_pre, W->temp, g.cos + toff, g.sin + toff, N, n, Hkv, dh,
                           g.rd, scale, eps);
    /* 7. attention over everything so far, and 8. the output projection */
    append_kv_attend(c, l, n);
    gpu_mm_wt(gm, N, D, Cq, s->attn_out, Cq, W->w_o, gpu_bf16_of(gm, W->w_o), s->proj, D);
}

/* The MHA variant: q, k, v, RoPE at the absolute positions, append, attend, o_proj. */
static void mha_decode(GpuKVCache *c, const LayerWeights *W, int l, int n) {
    GpuModel *gm = c->gm;
    const ZayaConfig *f = &gm->cfg;
    GkStream st = gm->g.stream;
    GpuDecodeScratch *s = &c->s;
    const int B = c->batch, N = B * n, D = f->hidden_size, dh = f->head_dim, p0 = c->len;
    const int Hq = f->num_heads, Hkv = f->num_kv_heads, Cq = Hq * dh, Ck = Hkv * dh;
    gpu_mm_wt(gm, N, Cq, D, s->u, D, W->w_q, gpu_bf16_of(gm, W->w_q), s->query, Cq);
    gpu_mm_wt(gm, N, Ck, D, s->u, D, W->w_k, gpu_bf16_of(gm, W->w_k), s->key, Ck);
    gpu_mm_wt(gm, N, Ck, D, s->u, D, W->w_v, gpu_bf16_of(gm, W->w_v), s->value, Ck);
    const LayerGeom g = layer_geom(c, l);
    const long toff = (long)p0 * (g.rd / 2);
    gk_rope_forward(st, s->query, g.cos + toff, g.sin + toff, N, n, Hq, dh, g.rd);
    gk_rope_forward(st, s->key, g.cos + toff, g.sin + toff, N, n, Hkv, dh, g.rd);
    append_kv_attend(c, l, n);
    gpu_mm_wt(gm, N, D, Cq, s->attn_out, Cq, W->w_o, gpu_bf16_of(gm, W->w_o), s->proj, D);
}

/* One piece of n <= chunk tokens per sequence (host tokens in c->h_tokens [B, n]); host logits as decode_piece. */
static int decode_piece(GpuKVCache *c, int n, float *logits, int last_only, int n_total, int t_off, ZyErr *err) {
    GpuModel *gm = c->gm;
    const ZayaConfig *f = &gm->cfg;
    const Weights *w = &gm->w;
    GkStream st = gm->g.stream;
    GpuDecodeScratch *s = &c->s;
    const int B = c->batch, N = B * n, D = f->hidden_size, V = f->vocab_size;
    gm->failed = 0;
    gpu_upload_async(&gm->g, s->tokens, c->h_tokens, (size_t)N * sizeof(int32_t));
    gk_embed_forward(st, s->x, w->embed, s->tokens, w->in_bias, w->in_scale, N, D);
    gk_rmsnorm_forward(st, s->u, s->rstd, s->x, w->layers[0].input_norm, N, D, f->rms_norm_eps);
    const float *r_prev = NULL;
    for (int l = 0; l < f->num_layers; l++) {
        const LayerWeights *W = &w->layers[l];
        const int last = l + 1 == f->num_layers;
        if (f->attention == ZY_ATTN_CCA)
            cca_decode(c, W, l, n);
        else
            mha_decode(c, W, l, n);
        gk_merge_rmsnorm_forward(st, s->x_mid, s->u, s->rstd, s->proj, s->x, W->attn_hs, W->attn_hb, W->attn_rs,
                                 W->attn_rb, W->post_norm, N, D, f->rms_norm_eps);
        LayerActs *m = &s->moe;
        m->u_mlp = s->u;
        m->router_z = s->z[l & 1];
        gpu_moe_forward(gm, l, W, m, r_prev, N);
        /* the merge, normed by the next layer's input norm (or the final norm: per-row, so the rows picked below
         * are exactly RMSNorm of the last rows) */
        gk_merge_rmsnorm_forward(st, s->x, s->u, s->rstd, m->moe_out, s->x_mid, W->mlp_hs, W->mlp_hb, W->mlp_rs,
                                 W->mlp_rb, last ? w->final_norm : w->layers[l + 1].input_norm, N, D, f->rms_norm_eps);
        r_prev = m->router_z;
    }
    if (gm->failed) {
        *err = gm->err;
        gpu_kvcache_reset(c); /* the layers' states are already overwritten: the cache is no longer consistent */
        return -1;
    }
    c->len += n;
    if (!logits) return 0;
    if (last_only) {
        gk_copy_rows(st, s->last_rows, D, s->u + (long)(n - 1) * D, (long)n * D, D, B);
        gpu_mm_wt(gm, B, V, D, s->last_rows, D, w->lm_head, gpu_bf16_of(gm, w->lm_head), s->logits, V);
        if (gm->failed) return *err = gm->err, -1;
        return gpu_download(&gm->g, logits, s->logits, (size_t)B * V * sizeof(float), err);
    }
    gpu_mm_wt(gm, N, V, D, s->u, D, w->lm_head, gpu_bf16_of(gm, w->lm_head), s->logits, V);
    if (gpu_sync(&gm->g, "decoding", err)) return -1;
    for (int b = 0; b < B; b++)
        if (gpu_download(&gm->g, logits + ((long)b * n_total + t_off) * V, s->logits + (long)b * n * V,
                         (size_t)n * V * sizeof(float), err))
            return -1;
    return gm->failed ? (*err = gm->err, -1) : 0;
}

int gpu_model_decode(GpuModel *gm, GpuKVCache *c, const int32_t *tokens, int n, float *logits, int last_only,
                     ZyErr *err) {
    const ZayaConfig *f = &gm->cfg;
    if (c->gm != gm) return zy_fail(err, "decode: the KV cache belongs to another GPU model");
    if (n <= 0) return zy_fail(err, "decode: %d new tokens (must be at least 1)", n);
    if (n > c->max_len - c->len)
        return zy_fail(err, "decode: KV cache full (%d + %d tokens > max_len %d)", c->len, n, c->max_len);
    const int B = c->batch;
    for (long i = 0; i < (long)B * n; i++)
        if (tokens[i] < 0 || tokens[i] >= f->vocab_size)
            return zy_fail(err, "decode: token id %d at [%ld, %ld] is outside the vocabulary [0, %d)", tokens[i], i / n,
                           i % n, f->vocab_size);
    if (gm->bf16 && gm->bf16_stale) { /* bf16 products read bf16 copies of the weights */
        gk_f32_to_bf16(gm->g.stream, gm->params16, gm->params, (long)gm->host->params.total);
        gm->bf16_stale = 0;
    }
    for (int t0 = 0; t0 < n; t0 += c->chunk) {
        const int k = n - t0 < c->chunk ? n - t0 : c->chunk, final = t0 + k == n;
        for (int b = 0; b < B; b++)
            memcpy(c->h_tokens + (long)b * k, tokens + (long)b * n + t0, (size_t)k * sizeof(int32_t));
        if (decode_piece(c, k, last_only && !final ? NULL : logits, last_only, n, t0, err)) return -1;
    }
    return 0;
}

/* ---- generation: generate_with (decode.c) over the GPU cache --------------------------------------------------- */

static void dec_reset(void *x) { gpu_kvcache_reset(((GpuDecode *)x)->c); }
static int dec_decode(void *x, const int32_t *tokens, int n, float *logits, ZyErr *err) {
    GpuDecode *d = x;
    return gpu_model_decode(d->gm, d->c, tokens, n, logits, 1, err);
}
static int dec_decode_all(void *x, const int32_t *tokens, int n, float *logits, ZyErr *err) {
    GpuDecode *d = x;
    return gpu_model_decode(d->gm, d->c, tokens, n, logits, 0, err);
}
static int dec_len(void *x) { return ((GpuDecode *)x)->c->len; }

DecodeBackend gpu_decode_backend(GpuDecode *d, GpuModel *gm, GpuKVCache *c) {
    d->gm = gm, d->c = c;
    return (DecodeBackend){.ctx = d, .reset = dec_reset, .decode = dec_decode, .len = dec_len,
                           .decode_all = dec_decode_all, .batch = c->batch, .max_len = c->max_len,
                           .vocab_size = gm->cfg.vocab_size}; /* no mark / rewind on the GPU cache */
}

int gpu_generate(GpuModel *gm, GpuKVCache *c, Sampler *s, const SamplingParams *p, ZyRng *rng, const int32_t *prompt,
                 int n_prompt, int max_new, const int32_t *stop_ids, int n_stop, GenerateTokenFn fn, void *ctx,
                 GenerateStats *st, ZyErr *err) {
    GpuDecode d;
    const DecodeBackend be = gpu_decode_backend(&d, gm, c);
    return generate_with(&be, s, p, rng, prompt, n_prompt, max_new, stop_ids, n_stop, fn, ctx, st, err);
}
