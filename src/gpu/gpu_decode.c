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
    float *query, *key, *value; /* key, value: the MHA variant's (CCA's go straight into the cache) */
    float *vc, *vd, *attn_out, *proj;
    float *z[2];
    LayerActs moe;   /* the MoE block's buffers (u_mlp = u; router state in z[]) */
    float *last_rows, *logits;
    unsigned *barrier; /* gk_decode_layers' grid barrier: a word, zeroed when created */
    /* the persistent kernel's layer plans (gk_decode_plan) for r + 1 rows at plans + r·L·gk_decode_plan_bytes(),
     * written at the first step of that many rows (plan_state 1; -1: refused, the step runs as launches) */
    unsigned char *plans;
    signed char plan_state[GK_DECODE_LAYER_ROWS];
    GkAttnPieces pieces; /* attention's key pieces (gpu_kernels.h): scratch for the rows that use them */
    size_t piece_words;  /* pieces.count's words, zeroed when created */
} GpuDecodeScratch;

struct GpuKVCache {
    GpuModel *gm;
    int batch, max_len, chunk, len, conv_pad;
    int kv_bf16;                             /* k and v hold bf16 values (kv_carve) */
    float **k, **v, **conv_state, **vd_prev; /* per layer, device */
    float *rope_cos, *rope_sin;
    float *rope_cos_sw, *rope_sin_sw; /* the sliding-window layers' own tables (NULL without such layers) */
    GpuDecodeScratch s;
    int32_t *h_tokens; /* host staging [B*chunk] */
    void *block;
    size_t bytes, cache_bytes;
};

/* The per-row buffers of N new rows (everything but the convolution blocks, the rows picked for logits and the
 * logits), shared by the same-length cache and the pool. */
static void carve_rows(ZyCarver *cv, GpuDecodeScratch *s, const ZayaConfig *f, size_t N) {
    const size_t D = f->hidden_size, Cq = cfg_q_channels(f), Ck = cfg_k_channels(f), C = Cq + Ck, half = Ck / 2;
    const size_t R = f->router_hidden_size;
    s->tokens = ZY_CARVE_I(cv, N);
    s->x = ZY_CARVE_F(cv, N * D);
    s->x_mid = ZY_CARVE_F(cv, N * D);
    s->u = ZY_CARVE_F(cv, N * D);
    s->rstd = ZY_CARVE_F(cv, N);
    s->X = ZY_CARVE_F(cv, N * C);
    s->query = ZY_CARVE_F(cv, N * Cq);
    s->key = ZY_CARVE_F(cv, N * Ck);
    s->vc = ZY_CARVE_F(cv, N * half);
    s->vd = ZY_CARVE_F(cv, N * half);
    s->value = ZY_CARVE_F(cv, N * Ck);
    s->attn_out = ZY_CARVE_F(cv, N * Cq);
    s->proj = ZY_CARVE_F(cv, N * D);
    s->z[0] = ZY_CARVE_F(cv, N * R);
    s->z[1] = ZY_CARVE_F(cv, N * R);
    layer_acts_carve_moe(cv, &s->moe, f, N, 1);
    s->barrier = (unsigned *)(void *)ZY_CARVE_I(cv, 4);
    const size_t Hq = f->num_heads, piece_rows = (size_t)gk_attn_piece_rows((long)N, (int)Hq);
    s->pieces.partial = ZY_CARVE_F(cv, piece_rows * Hq * GK_ATTN_PIECES * (f->head_dim + 2));
    s->piece_words = piece_rows * Hq;
    s->pieces.count = (unsigned *)(void *)ZY_CARVE_I(cv, s->piece_words);
    const size_t sets = N < GK_DECODE_LAYER_ROWS ? N : GK_DECODE_LAYER_ROWS;
    s->plans = (unsigned char *)ZY_CARVE_F(cv, sets * f->num_layers * (gk_decode_plan_bytes() / sizeof(float)));
}

/* The words the kernels count in, zeroed once (each use leaves them zero). */
static void zero_counters(GpuModel *gm, const GpuDecodeScratch *s) {
    gpu_memset_async(&gm->g, s->barrier, 0, sizeof(unsigned));
    gpu_memset_async(&gm->g, s->pieces.count, 0, s->piece_words * sizeof(unsigned));
}

/* n cached k̂ or v values: floats, or bf16 values in half as many floats' room (kv_bf16: the pointer is then read
 * as uint16_t *, by kv16) */
static float *kv_carve(ZyCarver *cv, size_t n, int kv_bf16) { return ZY_CARVE_F(cv, kv_bf16 ? (n + 1) / 2 : n); }
static uint16_t *kv16(float *p) { return (uint16_t *)(void *)p; }

static void carve(ZyCarver *cv, void *cache) {
    GpuKVCache *c = cache;
    const ZayaConfig *f = &c->gm->cfg;
    const size_t B = c->batch, n = c->chunk, N = B * n, D = f->hidden_size, V = f->vocab_size;
    const size_t Cq = cfg_q_channels(f), Ck = cfg_k_channels(f), C = Cq + Ck, half = Ck / 2;
    const size_t P = c->conv_pad, TE = P + n, rd = cfg_rotary_dim(f), L = f->num_layers;
    for (size_t l = 0; l < L; l++) {
        c->k[l] = kv_carve(cv, B * c->max_len * Ck, c->kv_bf16);
        c->v[l] = kv_carve(cv, B * c->max_len * Ck, c->kv_bf16);
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
    carve_rows(cv, s, f, N);
    s->Xe = ZY_CARVE_F(cv, B * TE * C);
    s->Ye = ZY_CARVE_F(cv, B * TE * C);
    s->Me = ZY_CARVE_F(cv, B * (TE + f->cca_time1 - 1) * C);
    s->last_rows = ZY_CARVE_F(cv, B * D);
    s->logits = ZY_CARVE_F(cv, N * V);
}

/* The RoPE tables of positions 0..max_len-1, and the sliding layers' own (cos_sw NULL without such layers), as the
 * CPU cache builds them. */
static int upload_rope(GpuModel *gm, float *cos, float *sin, float *cos_sw, float *sin_sw, int max_len, ZyErr *err) {
    const ZayaConfig *f = &gm->cfg;
    const int rd = cfg_rotary_dim(f), rds = cfg_has_sliding(f) ? cfg_sliding_rotary_dim(f) : 0;
    const size_t nt = (size_t)max_len * (rd / 2), nts = (size_t)max_len * (rds / 2);
    float *tables = malloc((2 * (nt > nts ? nt : nts) + 1) * sizeof(float));
    if (!tables) return zy_fail(err, "out of memory");
    rope_tables(tables, tables + nt, max_len, rd, f->rope_theta);
    int rc = gpu_upload(&gm->g, cos, tables, nt * sizeof(float), err) ||
             gpu_upload(&gm->g, sin, tables + nt, nt * sizeof(float), err);
    if (!rc && cos_sw) {
        rope_tables(tables, tables + nts, max_len, rds, f->rope_theta_sliding);
        rc = gpu_upload(&gm->g, cos_sw, tables, nts * sizeof(float), err) ||
             gpu_upload(&gm->g, sin_sw, tables + nts, nts * sizeof(float), err);
    }
    free(tables);
    return rc ? -1 : 0;
}

/* The checks the cache and the pool share: max_len within the model's positions, heads the decode kernels take. */
static int check_decode_shape(const ZayaConfig *f, int max_len, ZyErr *err) {
    if (max_len > f->max_position_embeddings)
        return zy_fail(err, "KV cache: max_len %d exceeds max_position_embeddings %d", max_len,
                       f->max_position_embeddings);
    if (f->head_dim > 256 || f->num_kv_heads <= 0 || f->num_heads % f->num_kv_heads)
        return zy_fail(err, "KV cache: GPU decoding takes head_dim <= 256 and num_heads a multiple of num_kv_heads "
                       "(head_dim %d, %d heads, %d kv heads)", f->head_dim, f->num_heads, f->num_kv_heads);
    return 0;
}

/* A carving onto the device (carve(cv, owner) lays out owner's buffers): the sizing pass, one allocation of *bytes
 * (what names it in errors), then the binding pass. NULL when the allocation fails. */
static void *carve_on_device(void (*carve)(ZyCarver *, void *), void *owner, size_t *bytes, const char *what,
                             ZyErr *err) {
    ZyCarver sizing = {0};
    carve(&sizing, owner);
    *bytes = sizing.used;
    ZyCarver cv = {.base = gpu_alloc(*bytes, what, err)};
    if (cv.base) carve(&cv, owner);
    return cv.base;
}

int gpu_kvcache_create(GpuKVCache **out, GpuModel *gm, int batch, int max_len, int chunk, ZyErr *err) {
    return gpu_kvcache_create_kv(out, gm, batch, max_len, chunk, 0, err);
}

int gpu_kvcache_create_kv(GpuKVCache **out, GpuModel *gm, int batch, int max_len, int chunk, int kv_bf16,
                          ZyErr *err) {
    *out = NULL;
    const ZayaConfig *f = &gm->cfg;
    if (chunk <= 0) chunk = KV_DEFAULT_CHUNK;
    if (batch <= 0 || max_len <= 0) return zy_fail(err, "KV cache: batch %d, max_len %d must be positive", batch, max_len);
    if (check_decode_shape(f, max_len, err)) return -1;
    if (chunk > max_len) chunk = max_len;
    GpuKVCache *c = calloc(1, sizeof *c);
    const size_t L = (size_t)f->num_layers;
    if (!c || !(c->k = calloc(4 * L, sizeof(float *)))) {
        free(c);
        return zy_fail(err, "out of memory");
    }
    c->v = c->k + L, c->conv_state = c->k + 2 * L, c->vd_prev = c->k + 3 * L;
    c->gm = gm, c->batch = batch, c->max_len = max_len, c->chunk = chunk, c->kv_bf16 = kv_bf16 != 0;
    c->conv_pad = f->attention == ZY_ATTN_CCA ? (f->cca_time0 - 1) + (f->cca_time1 - 1) : 0;
    c->h_tokens = malloc((size_t)batch * chunk * sizeof(int32_t));
    if (!c->h_tokens) {
        gpu_kvcache_free(c);
        return zy_fail(err, "out of memory");
    }
    if (!(c->block = carve_on_device(carve, c, &c->bytes, "the KV cache", err))) {
        zy_wrap(err, "batch %d x %d tokens", batch, max_len);
        gpu_kvcache_free(c);
        return -1;
    }
    if (upload_rope(gm, c->rope_cos, c->rope_sin, c->rope_cos_sw, c->rope_sin_sw, max_len, err)) {
        gpu_kvcache_free(c);
        return -1;
    }
    zero_counters(gm, &c->s);
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

/* Appends the n new k̂ / v rows of each sequence at position len (unless CCA's gk_cca_decode_rows did), then attends
 * over everything so far (a sliding layer: over its window). */
static void append_kv_attend(GpuKVCache *c, int l, int n, int append) {
    const ZayaConfig *f = &c->gm->cfg;
    GkStream st = c->gm->g.stream;
    const int B = c->batch, Ck = cfg_k_channels(f), p0 = c->len;
    const long seq = (long)c->max_len * Ck, at = (long)p0 * Ck;
    const int Hq = f->num_heads, Hkv = f->num_kv_heads, dh = f->head_dim, window = layer_geom(c, l).window;
    const long rows = (long)n * Ck; /* each sequence's n new rows as one row of the copy */
    const GkRowCopy k = {.dst = c->kv_bf16 ? (void *)(kv16(c->k[l]) + at) : (void *)(c->k[l] + at),
                         .dst_stride = seq, .src = c->s.key, .src_stride = rows, .len = rows, .n = B},
                    v = {.dst = c->kv_bf16 ? (void *)(kv16(c->v[l]) + at) : (void *)(c->v[l] + at),
                         .dst_stride = seq, .src = c->s.value, .src_stride = rows, .len = rows, .n = B};
    if (c->kv_bf16) {
        if (append) gk_copy_rows_idx2_bf16(st, k, v);
        gk_decode_attention_bf16(st, c->s.attn_out, c->s.query, kv16(c->k[l]), kv16(c->v[l]), B, n, p0, c->max_len,
                                 Hq, Hkv, dh, window, c->s.pieces);
        return;
    }
    if (append) gk_copy_rows_idx2(st, k, v);
    gk_decode_attention(st, c->s.attn_out, c->s.query, c->k[l], c->v[l], B, n, p0, c->max_len, Hq, Hkv, dh, window,
                        c->s.pieces);
}

/* The projections of the N rows of u: each a linear layer of gpu_mm_wt_rows, so that at decoding's few rows the
 * projections that read u go in one launch. CCA: q and k into X's two column ranges, the current and delayed values. */
static void cca_projections(GpuModel *gm, const LayerWeights *W, GpuDecodeScratch *s, int N) {
    const ZayaConfig *f = &gm->cfg;
    const int Cq = f->num_heads * f->head_dim, Ck = cfg_k_channels(f), C = Cq + Ck, half = Ck / 2;
    const GpuLinear p[4] = {{.w = W->w_q, .y = s->X, .n = Cq, .ldy = C},
                            {.w = W->w_k, .y = s->X + Cq, .n = Ck, .ldy = C},
                            {.w = W->w_v_current, .y = s->vc, .n = half, .ldy = half},
                            {.w = W->w_v_delayed, .y = s->vd, .n = half, .ldy = half}};
    gpu_mm_wt_rows(gm, N, f->hidden_size, s->u, f->hidden_size, p, 4);
}
static void mha_projections(GpuModel *gm, const LayerWeights *W, GpuDecodeScratch *s, int N) {
    const ZayaConfig *f = &gm->cfg;
    const int Cq = f->num_heads * f->head_dim, Ck = cfg_k_channels(f);
    const GpuLinear p[3] = {{.w = W->w_q, .y = s->query, .n = Cq, .ldy = Cq},
                            {.w = W->w_k, .y = s->key, .n = Ck, .ldy = Ck},
                            {.w = W->w_v, .y = s->value, .n = Ck, .ldy = Ck}};
    gpu_mm_wt_rows(gm, N, f->hidden_size, s->u, f->hidden_size, p, 3);
}
/* proj = attn_out W_oᵀ */
static void out_projection(GpuModel *gm, const LayerWeights *W, GpuDecodeScratch *s, int N) {
    const ZayaConfig *f = &gm->cfg;
    const int Cq = f->num_heads * f->head_dim, D = f->hidden_size;
    gpu_mm_wt_rows(gm, N, Cq, s->attn_out, Cq, &(GpuLinear){.w = W->w_o, .y = s->proj, .n = D, .ldy = D}, 1);
}

/* The convolution over B blocks of [P cached columns | TE − P new] (Xe): its outputs Ye at the new rows. A step of few
 * rows computes only those, in one launch (gk_cca_conv_decode); longer ones (prefill pieces) run the whole convolution
 * (Me its depthwise scratch), whose tiled products pay off there. */
#define DECODE_CONV_ROWS 64
static void decode_conv(GpuModel *gm, const LayerWeights *W, float *Ye, float *Me, const float *Xe, int B, int TE,
                        int P) {
    const ZayaConfig *f = &gm->cfg;
    if ((long)B * (TE - P) <= DECODE_CONV_ROWS &&
        gk_cca_conv_decode(gm->g.stream, Ye, Xe, W->conv_dw_w, W->conv_dw_b, W->conv_gr_w, W->conv_gr_b, B, TE, P,
                           cfg_conv_channels(f), f->head_dim, f->cca_time0, f->cca_time1) == 0)
        return;
    gpu_cca_conv_forward(gm, W, Ye, Me, Xe, B, TE);
}

/* CCA's rows after the convolution (gk_cca_decode_rows) for the same-length cache's n new rows a sequence at len. */
static GkCcaDecode cca_rows_desc(const GpuKVCache *c, const LayerWeights *W, int l, int n, int len) {
    const ZayaConfig *f = &c->gm->cfg;
    const GpuDecodeScratch *s = &c->s;
    const int B = c->batch, dh = f->head_dim, P = c->conv_pad, TE = P + n, Hq = f->num_heads, Hkv = f->num_kv_heads;
    const int C = (Hq + Hkv) * dh, half = Hkv * dh / 2;
    const LayerGeom g = layer_geom(c, l);
    const long toff = (long)len * (g.rd / 2);
    return (GkCcaDecode){
        .Xe = s->Xe, .Ye = s->Ye, .TE = TE, .P = P, .vc = s->vc, .vd = s->vd, .vd_prev = c->vd_prev[l],
        .slot_stride = half, .temp = W->temp, .cosv = g.cos + toff, .sinv = g.sin + toff, .scale = sqrtf((float)dh),
        .eps = 1.1920928955078125e-07f, .query = s->query, .k_cache = c->k[l], .v_cache = c->v[l],
        .kv_seq = c->max_len, .kv_p0 = len, .kv_bf16 = c->kv_bf16,
        .state = {.dst = c->conv_state[l], .dst_stride = (long)P * C, .src = s->Xe + (long)n * C,
                  .src_stride = (long)TE * C, .len = (long)P * C, .n = B},
        .N = B * n, .n = n, .Hq = Hq, .Hkv = Hkv, .dh = dh, .rd = g.rd};
}

/* CCA on u for the new rows: appends k̂ and v, updates the convolution and delayed-value state, writes proj. */
static void cca_decode(GpuKVCache *c, const LayerWeights *W, int l, int n) {
    GpuModel *gm = c->gm;
    const ZayaConfig *f = &gm->cfg;
    GkStream st = gm->g.stream;
    GpuDecodeScratch *s = &c->s;
    const int B = c->batch, N = B * n, dh = f->head_dim, P = c->conv_pad, TE = P + n;
    const int Cq = f->num_heads * dh, C = Cq + f->num_kv_heads * dh;
    /* 1. down projections (and 4.'s two value projections: they read u too) */
    cca_projections(gm, W, s, N);
    /* 2. convolutions over [P cached columns | n new] per sequence, then the last P columns become the state */
    gk_copy_rows_idx2(st,
                      (GkRowCopy){.dst = s->Xe, .dst_stride = (long)TE * C, .src = c->conv_state[l],
                                  .src_stride = (long)P * C, .len = (long)P * C, .n = B},
                      (GkRowCopy){.dst = s->Xe + (long)P * C, .dst_stride = (long)TE * C, .src = s->X,
                                  .src_stride = (long)n * C, .len = (long)n * C, .n = B});
    decode_conv(gm, W, s->Ye, s->Me, s->Xe, B, TE, P);
    /* 3. q-k mean skip, 4. values (each sequence's first new row takes the previous token's vd, its last vd is kept),
     * 5. QK norm and 6. RoPE at the absolute positions p0.., k̂ and v into the cache, and 2.'s last P columns back
     * into the convolution state: one launch */
    const GkCcaDecode d = cca_rows_desc(c, W, l, n, c->len);
    gk_cca_decode_rows(st, &d);
    /* 7. attention over everything so far, and 8. the output projection */
    append_kv_attend(c, l, n, 0);
    out_projection(gm, W, s, N);
}

/* The MHA variant: q, k, v, RoPE at the absolute positions, append, attend, o_proj. */
static void mha_decode(GpuKVCache *c, const LayerWeights *W, int l, int n) {
    GpuModel *gm = c->gm;
    const ZayaConfig *f = &gm->cfg;
    GkStream st = gm->g.stream;
    GpuDecodeScratch *s = &c->s;
    const int B = c->batch, N = B * n, dh = f->head_dim, p0 = c->len;
    const int Hq = f->num_heads, Hkv = f->num_kv_heads;
    mha_projections(gm, W, s, N);
    const LayerGeom g = layer_geom(c, l);
    const long toff = (long)p0 * (g.rd / 2);
    gk_rope_forward(st, s->query, g.cos + toff, g.sin + toff, N, n, Hq, dh, g.rd);
    gk_rope_forward(st, s->key, g.cos + toff, g.sin + toff, N, n, Hkv, dh, g.rd);
    append_kv_attend(c, l, n, 1);
    out_projection(gm, W, s, N);
}

/* A decoding pass's attention: the same-length cache's (c, n new rows per sequence) or a pool step's (p, ps). */
typedef struct DecodeAttend {
    GpuKVCache *c;
    int n;
    GpuKVPool *p;
    const struct PoolStep *ps;
} DecodeAttend;
static void decode_attend(const DecodeAttend *a, const ZayaConfig *f, const LayerWeights *W, int l);
static int decode_layers_persistent(GpuModel *gm, GpuDecodeScratch *s, int N, const DecodeAttend *a, int head);

/* The MoE block's merge normed by the next layer's input norm (or the final norm) of layer W, as decode_layers runs
 * it. */
static GkMergeNorm mlp_merge(const GpuDecodeScratch *s, const LayerWeights *W, const float *next_norm) {
    return (GkMergeNorm){.out = s->x, .y = s->u, .rstd = s->rstd, .h = s->moe.moe_out, .res = s->x_mid,
                         .hs = W->mlp_hs, .hb = W->mlp_hb, .rs = W->mlp_rs, .rb = W->mlp_rb, .w = next_norm};
}
/* The layer loop over the N rows of s (s->tokens on the device): embedding, then per layer the attention (CCA or MHA,
 * through a), the merge normed for the MoE block, the MoE block, and the merge normed by the next layer's input norm
 * (or the final norm: per row, so rows picked afterwards are exactly RMSNorm of theirs, as logits_rows computes them).
 * Leaves the final-normed rows in s->u. The step runs as one persistent kernel where it applies, else as launches;
 * head: every row's logits are wanted, which that kernel then computes too (into s->logits [N, V]). Returns 1 when it
 * did, else 0 (the caller's product). */
static int decode_layers(GpuModel *gm, GpuDecodeScratch *s, int N, const DecodeAttend *a, int head) {
    const ZayaConfig *f = &gm->cfg;
    const Weights *w = &gm->w;
    GkStream st = gm->g.stream;
    const int D = f->hidden_size;
    const int ran = decode_layers_persistent(gm, s, N, a, head);
    if (ran >= 0) return ran;
    gk_embed_forward(st, s->x, w->embed, gpu_embed16(gm), s->tokens, w->in_bias, w->in_scale, N, D);
    gk_rmsnorm_forward(st, s->u, s->rstd, s->x, w->layers[0].input_norm, N, D, f->rms_norm_eps);
    const float *r_prev = NULL;
    for (int l = 0; l < f->num_layers; l++) {
        const LayerWeights *W = &w->layers[l];
        const float *next_norm = l + 1 == f->num_layers ? w->final_norm : w->layers[l + 1].input_norm;
        decode_attend(a, f, W, l);
        gk_merge_rmsnorm_forward(st, s->x_mid, s->u, s->rstd, s->proj, s->x, W->attn_hs, W->attn_hb, W->attn_rs,
                                 W->attn_rb, W->post_norm, N, D, f->rms_norm_eps);
        LayerActs *m = &s->moe;
        m->u_mlp = s->u;
        m->router_z = s->z[l & 1];
        gpu_moe_forward(gm, l, W, m, r_prev, N, 1);
        const GkMergeNorm merge = mlp_merge(s, W, next_norm);
        gk_merge_rmsnorm_forward(st, merge.out, merge.y, merge.rstd, merge.h, merge.res, merge.hs, merge.hb, merge.rs,
                                 merge.rb, merge.w, N, D, f->rms_norm_eps);
        r_prev = m->router_z;
    }
    return 0;
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
    DecodeAttend da = {.c = c, .n = n};
    const int logits_done = decode_layers(gm, s, N, &da, logits != NULL);
    if (gm->failed) {
        *err = gm->err;
        gpu_kvcache_reset(c); /* the layers' states are already overwritten: the cache is no longer consistent */
        return -1;
    }
    c->len += n;
    if (!logits) return 0;
    const GpuLinear head = {.w = w->lm_head, .y = s->logits, .n = V, .ldy = V};
    if (last_only) { /* logits_done: n is 1, the rows are the last ones */
        if (!logits_done) {
            gk_copy_rows(st, s->last_rows, D, s->u + (long)(n - 1) * D, (long)n * D, D, B);
            gpu_mm_wt_rows(gm, B, D, s->last_rows, D, &head, 1);
        }
        if (gm->failed) return *err = gm->err, -1;
        return gpu_download(&gm->g, logits, s->logits, (size_t)B * V * sizeof(float), err);
    }
    if (!logits_done) gpu_mm_wt_rows(gm, N, D, s->u, D, &head, 1);
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
    gpu_model_refresh_bf16(gm); /* bf16 products read bf16 copies of the weights */
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

/* ---- a ragged batch over a block pool: the twin of KVPool and model_decode_step --------------------------------- */

/* The step's descriptors (int32), laid out in one host buffer and uploaded in one copy. Per row r of the step:
 * its token, absolute position, sequence (index in the step), row in the convolution blocks, and row in the pool's
 * k̂ / v. Per sequence i: its slot, where its [P state columns | new rows] block starts in Xe (and where its new state
 * starts: n rows further), its first and last rows; the rows that get logits; its block-table row. Where blocks keep
 * their states (gpu_kvpool_keep_block_states): per sequence the block that the step fills to the step's end (-1:
 * none), and per block the step fills to an end inside its rows (up to keep_in of them, -1 past the last) the block,
 * the Xe row where the state at that end starts and the row of its last delayed value. */
enum {
    D_TOKEN, D_POS, D_SEQ, D_XROW, D_PHYS, D_SLOT, D_XIN, D_XOUT, D_FIRST, D_LAST, D_LOGIT,
    D_KEEP_END, D_KEEP_IN, D_KEEP_XROW, D_KEEP_VDROW, D_TABLE, D_COUNT
};

struct GpuKVPool {
    GpuModel *gm;
    int max_len, max_rows, chunk, conv_pad;
    int logit_rows;            /* rows a step may want logits of: a row a sequence, plus a chunk's (every row's) */
    int kv_bf16;               /* k and v hold bf16 values (kv_carve) */
    KVBlocks blocks;           /* host bookkeeping, KVPool's (decode.h) */
    void *host;                /* the bookkeeping's arrays and h_desc, one allocation */
    /* device */
    float **k, **v;            /* per layer [n_blocks * block_tokens, Ck] */
    float *state;              /* per slot, every layer's [P, C] convolution columns then its vd_prev [Ck/2] */
    long layer_state, slot_state; /* floats of one layer's state / of one slot's */
    float *block_state;        /* NULL, or per block the slot state at its end (gpu_kvpool_keep_block_states) */
    int keep_in;               /* descriptors for kept states at ends inside a step's rows */
    float *rope_cos, *rope_sin, *rope_cos_sw, *rope_sin_sw;
    GpuDecodeScratch s;        /* max_rows rows; Xe/Ye/Me xe_rows; logits [logit_rows, V] */
    size_t xe_rows;
    int32_t *d_desc, *h_desc;  /* the descriptors, device and host */
    size_t off[D_COUNT + 1];   /* their offsets (ints) */
    void *block;
    size_t bytes, cache_bytes;
    /* ZAYA_GPU_GRAPHS=1: each step shape's device work captured once as a CUDA graph, then replayed (pool_step_run) */
    int graphs_on;
    struct StepGraph *graphs;  /* POOL_GRAPHS of them, filled round robin */
    int n_graphs, next_graph, last_graph_kernels; /* last_graph_kernels: the newest graph's kernel nodes */
    const void *graph_bufs[4]; /* the scratch the graphs were captured over (a regrown buffer retires them) */
};

static void carve_pool(ZyCarver *cv, void *pool) {
    GpuKVPool *p = pool;
    const ZayaConfig *f = &p->gm->cfg;
    const size_t S = p->blocks.max_seqs, R = p->max_rows, D = f->hidden_size, V = f->vocab_size, L = f->num_layers;
    const size_t Ck = cfg_k_channels(f), C = cfg_conv_channels(f), k1 = f->cca_time1;
    const size_t rows_kv = (size_t)p->blocks.n_blocks * p->blocks.block_tokens, SN = S < R ? S : R;
    for (size_t l = 0; l < L; l++) {
        p->k[l] = kv_carve(cv, rows_kv * Ck, p->kv_bf16);
        p->v[l] = kv_carve(cv, rows_kv * Ck, p->kv_bf16);
    }
    p->state = ZY_CARVE_F(cv, S * p->slot_state);
    p->cache_bytes = cv->used;
    const size_t half = cfg_rotary_dim(f) / 2, ML = p->max_len;
    p->rope_cos = ZY_CARVE_F(cv, ML * half);
    p->rope_sin = ZY_CARVE_F(cv, ML * half);
    const size_t half_sw = cfg_has_sliding(f) ? (size_t)cfg_sliding_rotary_dim(f) / 2 : 0;
    p->rope_cos_sw = half_sw ? ZY_CARVE_F(cv, ML * half_sw) : NULL;
    p->rope_sin_sw = half_sw ? ZY_CARVE_F(cv, ML * half_sw) : NULL;
    p->d_desc = ZY_CARVE_I(cv, p->off[D_COUNT]);
    GpuDecodeScratch *s = &p->s;
    carve_rows(cv, s, f, R);
    if (cv->base) s->tokens = p->d_desc + p->off[D_TOKEN]; /* the tokens come up with the descriptors */
    if (f->attention == ZY_ATTN_CCA) { /* each sequence padded to its group's longest (gpu_model_decode_step) */
        s->Xe = ZY_CARVE_F(cv, p->xe_rows * C);
        s->Ye = ZY_CARVE_F(cv, p->xe_rows * C);
        s->Me = ZY_CARVE_F(cv, (p->xe_rows + SN * (k1 - 1)) * C);
    }
    s->last_rows = ZY_CARVE_F(cv, (size_t)p->logit_rows * D);
    s->logits = ZY_CARVE_F(cv, (size_t)p->logit_rows * V);
}

static void pool_graphs_clear(GpuKVPool *p);

void gpu_kvpool_free(GpuKVPool *p) {
    if (!p) return;
    pool_graphs_clear(p);
    free(p->graphs);
    if (p->block) {
        ZyErr ignore;
        gpu_use(&p->gm->g, &ignore);
        gpu_sync(&p->gm->g, "freeing the KV pool", &ignore);
        gpu_free(p->block);
    }
    gpu_free(p->block_state);
    free(p->k);
    free(p->host);
    free(p);
}

int gpu_kvpool_create(GpuKVPool **out, GpuModel *gm, int max_seqs, int max_len, int n_blocks, int block_tokens,
                      int max_rows, int chunk, ZyErr *err) {
    return gpu_kvpool_create_kv(out, gm, max_seqs, max_len, n_blocks, block_tokens, max_rows, chunk, 0, err);
}

int gpu_kvpool_create_kv(GpuKVPool **out, GpuModel *gm, int max_seqs, int max_len, int n_blocks, int block_tokens,
                         int max_rows, int chunk, int kv_bf16, ZyErr *err) {
    *out = NULL;
    const ZayaConfig *f = &gm->cfg;
    /* kvpool_create's checks and words */
    if (max_seqs <= 0 || max_len <= 0 || n_blocks <= 0 || block_tokens <= 0 || max_rows <= 0 || chunk <= 0)
        return zy_fail(err, "KV cache: sequences %d, max_len %d, blocks %d, block size %d, rows %d and chunk %d must be "
                       "positive", max_seqs, max_len, n_blocks, block_tokens, max_rows, chunk);
    if (check_decode_shape(f, max_len, err)) return -1;
    if ((long long)n_blocks * block_tokens > INT32_MAX) /* the step's row indices are int32 */
        return zy_fail(err, "KV cache: %d blocks of %d tokens is more than 2^31 tokens", n_blocks, block_tokens);
    if (gpu_use(&gm->g, err)) return -1;
    GpuKVPool *p = calloc(1, sizeof *p);
    const size_t L = (size_t)f->num_layers;
    if (!p || !(p->k = calloc(2 * L, sizeof(float *)))) {
        free(p);
        return zy_fail(err, "out of memory");
    }
    p->v = p->k + L;
    p->gm = gm, p->kv_bf16 = kv_bf16 != 0;
    p->max_len = max_len;
    p->blocks = kvblocks_shape(max_seqs, max_len, n_blocks, block_tokens);
    p->chunk = chunk < max_len ? chunk : max_len;
    p->max_rows = max_rows < p->chunk ? p->chunk : max_rows;
    p->conv_pad = f->attention == ZY_ATTN_CCA ? cfg_conv_pad(f) : 0;
    const size_t S = max_seqs, R = p->max_rows, P = p->conv_pad, C = cfg_conv_channels(f);
    p->layer_state = (long)(P * C + cfg_k_channels(f) / 2);
    p->slot_state = p->layer_state * (long)L;
    p->xe_rows = (S < R ? S : R) * (P + p->chunk);
    p->logit_rows = (int)(S + (size_t)p->chunk < R ? S + (size_t)p->chunk : R);
    /* kept states at block ends inside a step's rows: a sequence of n > 1 rows crosses at most n / block_tokens + 1 */
    p->keep_in = (int)(R / (size_t)block_tokens + (S < R ? S : R));
    const size_t K = (size_t)p->keep_in;
    const size_t LR = (size_t)p->logit_rows;
    const size_t count[D_COUNT] = {R, R, R, R, R, S, S, S, S, S, LR, S, K, K, K, S * p->blocks.max_blocks};
    for (int i = 0; i < D_COUNT; i++) p->off[i + 1] = p->off[i] + count[i];
    /* host: the block bookkeeping and the descriptors' staging, one allocation */
    ZyCarver sizing = {0};
    kvblocks_carve(&sizing, &p->blocks);
    ZY_CARVE_I(&sizing, p->off[D_COUNT]);
    ZyCarver hc = {.base = p->host = calloc(1, sizing.used)};
    if (!hc.base) {
        gpu_kvpool_free(p);
        return zy_fail(err, "out of memory");
    }
    kvblocks_carve(&hc, &p->blocks);
    p->h_desc = ZY_CARVE_I(&hc, p->off[D_COUNT]);
    kvblocks_init(&p->blocks);
    if (!(p->block = carve_on_device(carve_pool, p, &p->bytes, "the KV pool", err))) {
        zy_wrap(err, "%d blocks of %d tokens for %d sequences", n_blocks, block_tokens, max_seqs);
        gpu_kvpool_free(p);
        return -1;
    }
    if (upload_rope(gm, p->rope_cos, p->rope_sin, p->rope_cos_sw, p->rope_sin_sw, max_len, err)) {
        gpu_kvpool_free(p);
        return -1;
    }
    zero_counters(gm, &p->s);
    if (gpu_graphs_requested(&p->graphs_on, err)) {
        gpu_kvpool_free(p);
        return -1;
    }
    /* bf16 products round their activation operand into scratch: at most max_rows rows of the widest of them */
    size_t wide = (size_t)f->hidden_size;
    const size_t others[3] = {(size_t)cfg_q_channels(f), (size_t)f->router_hidden_size, (size_t)f->moe_intermediate_size};
    for (int i = 0; i < 3; i++) wide = others[i] > wide ? others[i] : wide;
    /* and the model's shared bf16 operands for as many rows, so a step's experts run grouped (no host wait) */
    if (gm->bf16 && (gpu_reserve_scratch(&gm->g, R * wide, err) || gpu_model_reserve_operands(gm, R, err))) {
        gpu_kvpool_free(p);
        return -1;
    }
    *out = p;
    return 0;
}

/* Zero state: its convolution columns stand for the padding before position 0. The k̂ / v rows past len are never
 * read. */
void gpu_kvpool_seq_reset(GpuKVPool *p, int slot) {
    ZyErr ignore;
    gpu_use(&p->gm->g, &ignore);
    gpu_memset_async(&p->gm->g, p->state + (size_t)slot * p->slot_state, 0, (size_t)p->slot_state * sizeof(float));
    p->blocks.len[slot] = 0;
}

void gpu_kvpool_seq_release(GpuKVPool *p, int slot) {
    gpu_kvpool_seq_reset(p, slot);
    kvblocks_release(&p->blocks, slot);
}

int gpu_kvpool_reserve(GpuKVPool *p, int slot, int tokens) { return kvblocks_reserve(&p->blocks, slot, tokens); }

/* kvpool_fork's copies on the device, in stream order: the partly filled block (all of it: rows past the length are
 * never read) and the slot's state. */
int gpu_kvpool_fork(GpuKVPool *p, int parent, int child) {
    int32_t from, to;
    GpuCtx *g = &p->gm->g;
    ZyErr ignore;
    if (gpu_use(g, &ignore) || kvblocks_fork(&p->blocks, parent, child, &from, &to)) return -1;
    const size_t block = (size_t)p->blocks.block_tokens * cfg_k_channels(&p->gm->cfg) * (p->kv_bf16 ? 2 : 4);
    for (int l = 0; from >= 0 && l < p->gm->cfg.num_layers; l++) {
        gpu_copy_async(g, (char *)p->k[l] + to * block, (char *)p->k[l] + from * block, block);
        gpu_copy_async(g, (char *)p->v[l] + to * block, (char *)p->v[l] + from * block, block);
    }
    const size_t state = (size_t)p->slot_state;
    gpu_copy_async(g, p->state + child * state, p->state + parent * state, state * sizeof(float));
    return 0;
}

int gpu_kvpool_keep_block_states(GpuKVPool *p, ZyErr *err) {
    if (p->block_state) return 0;
    if (gpu_use(&p->gm->g, err)) return -1;
    const size_t bytes = (size_t)p->blocks.n_blocks * p->slot_state * sizeof(float);
    if (!(p->block_state = gpu_alloc(bytes, "the KV blocks' kept states", err))) return -1;
    gpu_memset_async(&p->gm->g, p->block_state, 0, bytes); /* as the CPU pool's: blocks filled before now keep zeros */
    pool_graphs_clear(p); /* the steps now also keep states */
    return 0;
}

int gpu_kvpool_seq_share(GpuKVPool *p, int slot, const int32_t *blocks, int n) {
    ZyErr ignore;
    if (!p->block_state || gpu_use(&p->gm->g, &ignore) || kvblocks_share(&p->blocks, slot, blocks, n)) return -1;
    const size_t state = (size_t)p->slot_state;
    gpu_copy_async(&p->gm->g, p->state + slot * state, p->block_state + blocks[n - 1] * state, state * sizeof(float));
    return 0;
}

int gpu_kvpool_download_block_states(GpuKVPool *p, float *out, ZyErr *err) {
    if (!p->block_state) return zy_fail(err, "the GPU pool keeps no block states (gpu_kvpool_keep_block_states)");
    if (gpu_use(&p->gm->g, err)) return -1;
    const size_t bytes = (size_t)p->blocks.n_blocks * p->slot_state * sizeof(float);
    return gpu_download(&p->gm->g, out, p->block_state, bytes, err);
}

KVBlocks *gpu_kvpool_blocks(GpuKVPool *p) { return &p->blocks; }
int gpu_kvpool_len(const GpuKVPool *p, int slot) { return p->blocks.len[slot]; }
int gpu_kvpool_free_blocks(const GpuKVPool *p) { return p->blocks.n_free; }
size_t gpu_kvpool_bytes(const GpuKVPool *p) {
    return p->cache_bytes + (p->block_state ? (size_t)p->blocks.n_blocks * p->slot_state * sizeof(float) : 0);
}
int gpu_kvpool_graphs(const GpuKVPool *p) { return p->n_graphs; }
int gpu_kvpool_graph_kernels(const GpuKVPool *p) { return p->n_graphs ? p->last_graph_kernels : 0; }

/* How one step is laid out: its rows, sequences and the two convolution groups (single-token sequences, padded to
 * P + 1 rows, then the others, each padded to P + the longest of them: the convolution is causal, so the padding rows
 * only feed padding outputs, and one launch per group replaces one per sequence). */
typedef struct PoolStep {
    int N, n_seqs, n_logits;
    int B0, TE0, B1, TE1;
    int keep_end, keep_in; /* kept states: at the sequences' ends (0 or n_seqs), inside their rows (D_KEEP_IN's) */
} PoolStep;

static const int32_t *desc(const GpuKVPool *p, int which) { return p->d_desc + p->off[which]; }

/* want_logits 0: the caller takes no logits, so no row goes through lm_head whatever seqs[].logits say (as on the
 * CPU), and D_LOGIT, sized for logit_rows, gets no entries. */
static void pool_plan(GpuKVPool *p, const DecodeSeq *seqs, int n_seqs, const int32_t *tokens, int want_logits,
                      PoolStep *ps) {
    const int P = p->conv_pad, bt = p->blocks.block_tokens, MB = p->blocks.max_blocks;
    int32_t *h = p->h_desc;
    const size_t *o = p->off;
    int B0 = 0, B1 = 0, n1 = 0;
    for (int i = 0; i < n_seqs; i++) {
        if (seqs[i].n == 1) B0++;
        else B1++, n1 = seqs[i].n > n1 ? seqs[i].n : n1;
    }
    *ps = (PoolStep){.n_seqs = n_seqs, .B0 = B0, .TE0 = P + 1, .B1 = B1, .TE1 = P + n1};
    if (p->block_state) { /* a count the step's shape sets, so that a graph replays any step of it */
        int multi_rows = 0;
        for (int i = 0; i < n_seqs; i++) multi_rows += seqs[i].n > 1 ? seqs[i].n : 0;
        ps->keep_end = n_seqs;
        ps->keep_in = multi_rows / bt + B1;
    }
    int row = 0, i0 = 0, i1 = 0, kept = 0;
    for (int i = 0; i < n_seqs; i++) {
        const int slot = seqs[i].slot, n = seqs[i].n, pos0 = p->blocks.len[slot];
        const int xb = n == 1 ? i0++ * ps->TE0 : B0 * ps->TE0 + i1++ * ps->TE1;
        const int32_t *trow = kvblocks_row(&p->blocks, slot);
        h[o[D_SLOT] + i] = slot;
        h[o[D_XIN] + i] = xb;
        h[o[D_XOUT] + i] = xb + n;
        h[o[D_FIRST] + i] = row;
        h[o[D_LAST] + i] = row + n - 1;
        for (int t = seqs[i].logits == DECODE_LOGITS_ALL ? 0 : n - 1; want_logits && seqs[i].logits && t < n; t++)
            h[o[D_LOGIT] + ps->n_logits++] = row + t; /* its last row, or every row */
        memcpy(h + o[D_TABLE] + (size_t)i * MB, trow, (size_t)((pos0 + n + bt - 1) / bt) * sizeof(int32_t));
        if (ps->keep_end) { /* the state at a block's end: Xe's P rows before it, the delayed value just before it */
            h[o[D_KEEP_END] + i] = (pos0 + n) % bt ? -1 : trow[(pos0 + n) / bt - 1];
            for (int end = (pos0 / bt + 1) * bt; end < pos0 + n; end += bt, kept++) {
                h[o[D_KEEP_IN] + kept] = trow[end / bt - 1];
                h[o[D_KEEP_XROW] + kept] = xb + end - pos0;
                h[o[D_KEEP_VDROW] + kept] = row + end - 1 - pos0;
            }
        }
        for (int t = 0; t < n; t++, row++) {
            const int pos = pos0 + t;
            h[o[D_TOKEN] + row] = tokens[row];
            h[o[D_POS] + row] = pos;
            h[o[D_SEQ] + row] = i;
            h[o[D_XROW] + row] = xb + P + t;
            h[o[D_PHYS] + row] = trow[pos / bt] * bt + pos % bt;
        }
    }
    ps->N = row;
    for (int k = kept; k < ps->keep_in; k++) h[o[D_KEEP_IN] + k] = -1;
    /* the descriptors up to the last sequence's table row (the rest of each table row is never read) */
    gpu_upload_async(&p->gm->g, p->d_desc, h, (o[D_TABLE] + (size_t)n_seqs * MB) * sizeof(int32_t));
}

/* ---- CUDA graphs of a step (ZAYA_GPU_GRAPHS=1; off by default until measured on a GPU) -------------------------
 * A step's device work depends on the step only through its shape (rows, sequences, wanted logits, the two
 * convolution groups): positions, slots and blocks are read from the descriptors on the device. So each shape is
 * captured once and replayed; the descriptors go up before the replay, outside the graph. Only bf16 runs with the
 * experts grouped can be captured (fp32's per-expert products wait for each layer's sizes); a refused capture turns
 * graphs off for the pool and the step runs as launches. */
#define POOL_GRAPHS 16
struct StepGraph {
    PoolStep shape;
    int want_logits, kernels; /* kernels: the kernel nodes it replays */
    void *exec;
};

static void pool_graphs_clear(GpuKVPool *p) {
    for (int i = 0; i < p->n_graphs; i++) gpu_graph_free(p->graphs[i].exec);
    p->n_graphs = p->next_graph = 0;
}

static LayerGeom pool_geom(const GpuKVPool *p, int l) {
    const ZayaConfig *f = &p->gm->cfg;
    const int sw = cfg_layer_is_sliding(f, l);
    return (LayerGeom){.cos = sw ? p->rope_cos_sw : p->rope_cos, .sin = sw ? p->rope_sin_sw : p->rope_sin,
                       .rd = cfg_layer_rotary_dim(f, l), .window = cfg_layer_window(f, l)};
}

/* The new rows' k̂ and v into their blocks, then every row's attention over its sequence so far (its window). */
static void pool_append_attend(GpuKVPool *p, const PoolStep *ps, int l, int append) {
    const ZayaConfig *f = &p->gm->cfg;
    GkStream st = p->gm->g.stream;
    const int Ck = cfg_k_channels(f), Hq = f->num_heads, Hkv = f->num_kv_heads, dh = f->head_dim;
    const int window = pool_geom(p, l).window;
    const GkRowCopy k = {.dst = p->k[l], .dst_stride = Ck, .dst_idx = desc(p, D_PHYS), .src = p->s.key,
                         .src_stride = Ck, .len = Ck, .n = ps->N},
                    v = {.dst = p->v[l], .dst_stride = Ck, .dst_idx = desc(p, D_PHYS), .src = p->s.value,
                         .src_stride = Ck, .len = Ck, .n = ps->N}; /* bf16: the same rows as bf16 elements */
    if (p->kv_bf16) {
        if (append) gk_copy_rows_idx2_bf16(st, k, v);
        gk_paged_decode_attention_bf16(st, p->s.attn_out, p->s.query, kv16(p->k[l]), kv16(p->v[l]), desc(p, D_SEQ),
                                       desc(p, D_POS), desc(p, D_TABLE), p->blocks.max_blocks,
                                       p->blocks.block_tokens, ps->N, Hq,
                                       Hkv, dh, window, p->s.pieces);
        return;
    }
    if (append) gk_copy_rows_idx2(st, k, v);
    gk_paged_decode_attention(st, p->s.attn_out, p->s.query, p->k[l], p->v[l], desc(p, D_SEQ), desc(p, D_POS),
                              desc(p, D_TABLE), p->blocks.max_blocks, p->blocks.block_tokens, ps->N, Hq, Hkv, dh, window,
                              p->s.pieces);
}

/* Layer l's convolution state of slot 0 (slot_state floats apart), then its kept vd. */
static float *pool_conv_state(const GpuKVPool *p, int l) { return p->state + (size_t)l * p->layer_state; }

/* CCA's rows after the convolution (gk_cca_decode_rows) for a pool step, each row through the step's descriptors. */
static GkCcaDecode pool_rows_desc(const GpuKVPool *p, const PoolStep *ps, const LayerWeights *W, int l) {
    const ZayaConfig *f = &p->gm->cfg;
    const GpuDecodeScratch *s = &p->s;
    const int dh = f->head_dim, P = p->conv_pad, C = (f->num_heads + f->num_kv_heads) * dh;
    float *conv = pool_conv_state(p, l), *vd_prev = conv + (size_t)P * C;
    const LayerGeom g = pool_geom(p, l);
    return (GkCcaDecode){
        .Xe = s->Xe, .Ye = s->Ye, .xrow = desc(p, D_XROW), .vc = s->vc, .vd = s->vd, .vd_prev = vd_prev,
        .slot_stride = p->slot_state, .row_seq = desc(p, D_SEQ), .seq_first = desc(p, D_FIRST),
        .seq_last = desc(p, D_LAST), .seq_slot = desc(p, D_SLOT), .temp = W->temp, .cosv = g.cos, .sinv = g.sin,
        .pos = desc(p, D_POS), .scale = sqrtf((float)dh), .eps = 1.1920928955078125e-07f, .query = s->query,
        .k_cache = p->k[l], .v_cache = p->v[l], .kv_row = desc(p, D_PHYS), .kv_bf16 = p->kv_bf16,
        .state = {.dst = conv, .dst_stride = p->slot_state, .dst_idx = desc(p, D_SLOT), .src = s->Xe, .src_stride = C,
                  .src_idx = desc(p, D_XOUT), .len = (long)P * C, .n = ps->n_seqs},
        .N = ps->N, .Hq = f->num_heads, .Hkv = f->num_kv_heads, .dh = dh, .rd = g.rd};
}

/* cca_decode for a ragged batch: the same steps, each sequence's state gathered from and scattered to its slot. */
static void pool_cca(GpuKVPool *p, const PoolStep *ps, const LayerWeights *W, int l) {
    GpuModel *gm = p->gm;
    const ZayaConfig *f = &gm->cfg;
    GkStream st = gm->g.stream;
    GpuDecodeScratch *s = &p->s;
    const int N = ps->N, S = ps->n_seqs, dh = f->head_dim, P = p->conv_pad, k1 = f->cca_time1;
    const int C = (f->num_heads + f->num_kv_heads) * dh;
    const float *conv = pool_conv_state(p, l);
    /* 1. down projections (and 4.'s two value projections: they read u too) */
    cca_projections(gm, W, s, N);
    /* 2. each sequence's [P cached columns | n new] block, the convolutions per group, the last P columns of each
     * block's real rows back to its slot */
    gk_copy_rows_idx2(st,
                      (GkRowCopy){.dst = s->Xe, .dst_stride = C, .dst_idx = desc(p, D_XIN), .src = conv,
                                  .src_stride = p->slot_state, .src_idx = desc(p, D_SLOT), .len = (long)P * C, .n = S},
                      (GkRowCopy){.dst = s->Xe, .dst_stride = C, .dst_idx = desc(p, D_XROW), .src = s->X,
                                  .src_stride = C, .len = C, .n = N});
    if (ps->B0)
        decode_conv(gm, W, s->Ye, s->Me, s->Xe, ps->B0, ps->TE0, P);
    if (ps->B1) {
        const size_t x1 = (size_t)ps->B0 * ps->TE0 * C, m1 = (size_t)ps->B0 * (ps->TE0 + k1 - 1) * C;
        decode_conv(gm, W, s->Ye + x1, s->Me + m1, s->Xe + x1, ps->B1, ps->TE1, P);
    }
    /* 3. q-k mean skip on each row's own column of its block, 4. values (each sequence's first row takes its slot's
     * previous vd, its last vd is kept), 5. QK norm and 6. RoPE at each row's absolute position, k̂ and v into the
     * pool, and 2.'s last P columns of each block's real rows back to its slot: one launch */
    const GkCcaDecode d = pool_rows_desc(p, ps, W, l);
    gk_cca_decode_rows(st, &d);
    if (ps->keep_in) { /* blocks filled to an end inside a sequence's rows keep the state there */
        float *kept = p->block_state + (size_t)l * p->layer_state;
        const int half = cfg_k_channels(f) / 2;
        gk_copy_rows_idx2(st,
                          (GkRowCopy){.dst = kept, .dst_stride = p->slot_state, .dst_idx = desc(p, D_KEEP_IN),
                                      .src = s->Xe, .src_stride = C, .src_idx = desc(p, D_KEEP_XROW),
                                      .len = (long)P * C, .n = ps->keep_in},
                          (GkRowCopy){.dst = kept + (size_t)P * C, .dst_stride = p->slot_state,
                                      .dst_idx = desc(p, D_KEEP_IN), .src = s->vd, .src_stride = half,
                                      .src_idx = desc(p, D_KEEP_VDROW), .len = half, .n = ps->keep_in});
    }
    /* 7. attention and 8. the output projection */
    pool_append_attend(p, ps, l, 0);
    out_projection(gm, W, s, N);
}

static void pool_mha(GpuKVPool *p, const PoolStep *ps, const LayerWeights *W, int l) {
    GpuModel *gm = p->gm;
    const ZayaConfig *f = &gm->cfg;
    GkStream st = gm->g.stream;
    GpuDecodeScratch *s = &p->s;
    const int N = ps->N, dh = f->head_dim;
    const int Hq = f->num_heads, Hkv = f->num_kv_heads;
    mha_projections(gm, W, s, N);
    const LayerGeom g = pool_geom(p, l);
    gk_rope_forward_pos(st, s->query, g.cos, g.sin, desc(p, D_POS), N, Hq, dh, g.rd);
    gk_rope_forward_pos(st, s->key, g.cos, g.sin, desc(p, D_POS), N, Hkv, dh, g.rd);
    pool_append_attend(p, ps, l, 1);
    out_projection(gm, W, s, N);
}

static void decode_attend(const DecodeAttend *a, const ZayaConfig *f, const LayerWeights *W, int l) {
    if (a->p)
        (f->attention == ZY_ATTN_CCA ? pool_cca : pool_mha)(a->p, a->ps, W, l);
    else
        (f->attention == ZY_ATTN_CCA ? cca_decode : mha_decode)(a->c, W, l, a->n);
}

/* Whether a step of N rows can run its layers as one persistent kernel (before its plans): the switch on, bf16 with
 * the few-row products, CCA, the MLP router and experts, no per-phase timing, a bf16 cache, every sequence one new
 * row, at most GK_DECODE_LAYER_ROWS of them. */
static int persistent_applies(const GpuModel *gm, int N, const DecodeAttend *a) {
    const ZayaConfig *f = &gm->cfg;
    if (!gpu_model_decode_layer_persistent(gm) || N > gpu_model_few_rows(gm) || gm->tm ||
        f->attention != ZY_ATTN_CCA || f->router != ZY_ROUTER_MLP || f->moe == ZY_MOE_DENSE)
        return 0;
    if (a->p ? a->ps->N != a->ps->n_seqs || a->ps->B1 : a->n != 1) return 0;
    return N >= 1 && N <= GK_DECODE_LAYER_ROWS && (a->p ? a->p->kv_bf16 : a->c->kv_bf16);
}

/* Layer l's descriptor for a step of N rows of one token each (the same-length cache's at position 0: the launch
 * moves it to the step's). Each layer but the first runs the one before's last merge first; the last runs its own
 * (the final norm). */
static GkDecodeLayer layer_desc(GpuModel *gm, GpuDecodeScratch *s, int N, const DecodeAttend *a, int l) {
    const ZayaConfig *f = &gm->cfg;
    const Weights *w = &gm->w;
    const LayerWeights *W = &w->layers[l], *W_next = l + 1 < f->num_layers ? &w->layers[l + 1] : NULL;
    const int D = f->hidden_size, dh = f->head_dim, Hq = f->num_heads, Hkv = f->num_kv_heads, R = f->router_hidden_size;
    const int Cq = Hq * dh, Ck = Hkv * dh, C = Cq + Ck, half = Ck / 2;
    const int P = a->p ? a->p->conv_pad : a->c->conv_pad, TE = P + 1;
    LayerActs *m = &s->moe;
    m->u_mlp = s->u;
    m->router_z = s->z[l & 1];
    GkDecodeLayer d = {
        .u = s->u,
        .Ye = s->Ye, .Xe = s->Xe, .conv_w0 = W->conv_dw_w, .conv_b0 = W->conv_dw_b, .conv_w1 = W->conv_gr_w,
        .conv_b1 = W->conv_gr_b, .TE = TE, .P = P, .C = C, .k0 = f->cca_time0, .k1 = f->cca_time1,
        .attn_out = s->attn_out, .query = s->query, .att_scale = (float)(1.0 / sqrt((double)dh)),
        .o_proj = {.w = gpu_bf16_of(gm, W->w_o), .y = s->proj, .n = D, .ldy = D},
        .merge_attn = {.out = s->x_mid, .y = s->u, .rstd = s->rstd, .h = s->proj, .res = s->x, .hs = W->attn_hs,
                       .hb = W->attn_hb, .rs = W->attn_rs, .rb = W->attn_rb, .w = W->post_norm},
        .router_down = {.w = gpu_bf16_of(gm, W->router_down_w), .y = m->router_z, .n = R, .ldy = R},
        .act = m->expert_act, .moe_out = m->moe_out, .w_gate_up = gpu_bf16_of(gm, W->expert_gate_up),
        .w_down = gpu_bf16_of(gm, W->expert_down), .choice = m->choice, .gate = m->gate,
        .N = N, .D = D, .Hq = Hq, .Hkv = Hkv, .dh = dh, .I = f->moe_intermediate_size, .E = f->num_experts,
        .eps = f->rms_norm_eps, .barrier = s->barrier, .att_pieces = s->pieces};
    if (l > 0)
        d.merge_in = mlp_merge(s, &w->layers[l - 1], W->input_norm);
    else /* the step's tokens embedded and normed */
        d.embed_in = (GkEmbedNorm){.emb = w->embed, .bias = w->in_bias, .scale = w->in_scale, .norm_w = W->input_norm,
                                   .tokens = s->tokens, .x = s->x, .u = s->u, .rstd = s->rstd,
                                   .emb16 = gpu_embed16(gm)};
    if (!W_next) { /* the final norm, and the logits' product (run where the step asks) */
        d.merge_mlp = mlp_merge(s, W, w->final_norm);
        d.head = (GkSkinnyOut){.w = gpu_bf16_of(gm, w->lm_head), .y = s->logits, .n = f->vocab_size,
                               .ldy = f->vocab_size};
    }
    /* q | k into Xe's new rows, vc, vd; the next layer's the same */
    for (int j = 0; j < (W_next ? 2 : 1); j++) {
        const LayerWeights *L = j ? W_next : W;
        GkSkinnyOut *o = j ? d.next_proj : d.proj;
        o[0] = (GkSkinnyOut){.w = gpu_bf16_of(gm, L->w_q), .y = s->Xe + (long)P * C, .n = Cq, .ldy = TE * C};
        o[1] = (GkSkinnyOut){.w = gpu_bf16_of(gm, L->w_k), .y = s->Xe + (long)P * C + Cq, .n = Ck, .ldy = TE * C};
        o[2] = (GkSkinnyOut){.w = gpu_bf16_of(gm, L->w_v_current), .y = s->vc, .n = half, .ldy = half};
        o[3] = (GkSkinnyOut){.w = gpu_bf16_of(gm, L->w_v_delayed), .y = s->vd, .n = half, .ldy = half};
    }
    gpu_router_tail_desc(gm, W, m, l > 0 ? s->z[(l - 1) & 1] : NULL, N, &d.tail);
    if (a->p) {
        const GpuKVPool *p = a->p;
        d.xe_state = (GkRowCopy){.dst = s->Xe, .dst_stride = C, .dst_idx = desc(p, D_XIN), .src = pool_conv_state(p, l),
                                 .src_stride = p->slot_state, .src_idx = desc(p, D_SLOT), .len = (long)P * C, .n = N};
        d.rows = pool_rows_desc(p, a->ps, W, l);
        d.k_cache = p->k[l], d.v_cache = p->v[l];
        d.att_seq = desc(p, D_SEQ), d.att_pos = desc(p, D_POS), d.att_table = desc(p, D_TABLE);
        d.max_blocks = p->blocks.max_blocks, d.block_tokens = p->blocks.block_tokens;
        d.window = pool_geom(p, l).window;
    } else {
        const GpuKVCache *c = a->c;
        d.xe_state = (GkRowCopy){.dst = s->Xe, .dst_stride = (long)TE * C, .src = c->conv_state[l],
                                 .src_stride = (long)P * C, .len = (long)P * C, .n = N};
        d.rows = cca_rows_desc(c, W, l, 1, 0);
        d.k_cache = c->k[l], d.v_cache = c->v[l];
        d.p0 = 0, d.max_len = c->max_len, d.window = layer_geom(c, l).window;
    }
    return d;
}

/* The plans of a step of N rows on the device (NULL: the step runs as launches), *first its first layer's
 * descriptor. Written and copied up at the first such step, then the same for every later one: a plan points at the
 * model's weights and this cache's buffers, which stay where they are. A graph's capture finds them there (its step
 * calls this before capturing), so the copy is never captured. */
static const void *layer_plans(GpuModel *gm, GpuDecodeScratch *s, int N, const DecodeAttend *a, GkDecodeLayer *first) {
    if (!persistent_applies(gm, N, a)) return NULL;
    const int L = gm->cfg.num_layers;
    const size_t bytes = gk_decode_plan_bytes() * (size_t)L;
    unsigned char *plans = s->plans + (size_t)(N - 1) * bytes;
    *first = layer_desc(gm, s, N, a, 0);
    if (s->plan_state[N - 1]) return s->plan_state[N - 1] > 0 ? plans : NULL;
    GkDecodeLayer *d = malloc((size_t)L * sizeof *d);
    void *host = malloc(bytes);
    ZyErr e;
    s->plan_state[N - 1] = -1;
    if (d && host) {
        for (int l = 0; l < L; l++) d[l] = layer_desc(gm, s, N, a, l);
        if (gk_decode_plan(d, L, host) == 0 && gpu_upload(&gm->g, plans, host, bytes, &e) == 0)
            s->plan_state[N - 1] = 1;
    }
    free(d);
    free(host);
    return s->plan_state[N - 1] > 0 ? plans : NULL;
}

/* A step whose every sequence has one new row, its embedding and layers as one persistent kernel (gk_decode_layers):
 * the same launches' bodies, the same bits. 0 when it ran (the final norm's rows in s->u), 1 when it also computed
 * every row's logits into s->logits (head asked, and lm_head has its bf16 copy); -1, nothing launched, where it does
 * not apply (persistent_applies, a shape gk_decode_plan refuses, a grid the device refuses). */
static int decode_layers_persistent(GpuModel *gm, GpuDecodeScratch *s, int N, const DecodeAttend *a, int head) {
    GkDecodeLayer first;
    const void *plans = layer_plans(gm, s, N, a, &first);
    head = head && gpu_bf16_of(gm, gm->w.lm_head); /* the last layer's plan has a head */
    if (!plans || gk_decode_layers(gm->g.stream, &first, plans, gm->cfg.num_layers, a->p ? 0 : a->c->len, head))
        return -1;
    gm->decode_layer_runs += gm->cfg.num_layers;
    return head;
}

/* The step's device work after its descriptors went up: the layers, then the rows that want logits through lm_head
 * (packed). */
static void pool_step_work(GpuModel *gm, GpuKVPool *p, const PoolStep *ps, int want_logits) {
    const ZayaConfig *f = &gm->cfg;
    GpuDecodeScratch *s = &p->s;
    DecodeAttend da = {.p = p, .ps = ps};
    /* every row wanting logits: they are the rows in order (one token each, where the layers' kernel applies) */
    const int logits_done = decode_layers(gm, s, ps->N, &da, want_logits && ps->n_logits == ps->N);
    if (ps->keep_end) /* a block the step fills to its end keeps the slot's state after it */
        gk_copy_rows_idx(gm->g.stream, p->block_state, p->slot_state, desc(p, D_KEEP_END), p->state, p->slot_state,
                         desc(p, D_SLOT), p->slot_state, ps->keep_end);
    if (logits_done || !want_logits || gm->failed) return;
    gk_gather_rows(gm->g.stream, s->last_rows, s->u, desc(p, D_LOGIT), ps->n_logits, NULL, f->hidden_size);
    gpu_mm_wt_rows(gm, ps->n_logits, f->hidden_size, s->last_rows, f->hidden_size,
                   &(GpuLinear){.w = gm->w.lm_head, .y = s->logits, .n = f->vocab_size, .ldy = f->vocab_size}, 1);
}

static int same_shape(const PoolStep *a, const PoolStep *b) {
    return a->N == b->N && a->n_seqs == b->n_seqs && a->n_logits == b->n_logits && a->B0 == b->B0 &&
           a->TE0 == b->TE0 && a->B1 == b->B1 && a->TE1 == b->TE1 && a->keep_end == b->keep_end &&
           a->keep_in == b->keep_in;
}

/* The graph of this shape, captured now if there is none; NULL when graphs are off (or were just turned off). */
static struct StepGraph *pool_graph(GpuModel *gm, GpuKVPool *p, const PoolStep *ps, int want_logits) {
    if (!p->graphs_on || gm->tm || !gm->bf16 || !gpu_model_experts_grouped(gm)) return NULL;
    const void *bufs[4] = {gm->g.scratch[0], gm->g.scratch[1], gm->op16[0], gm->op16[1]};
    if (memcmp(bufs, p->graph_bufs, sizeof bufs)) { /* a buffer the graphs point into moved */
        pool_graphs_clear(p);
        memcpy(p->graph_bufs, bufs, sizeof bufs);
    }
    for (int i = 0; i < p->n_graphs; i++)
        if (p->graphs[i].want_logits == want_logits && same_shape(&p->graphs[i].shape, ps)) return &p->graphs[i];
    if (!p->graphs && !(p->graphs = calloc(POOL_GRAPHS, sizeof *p->graphs))) return NULL;
    ZyErr ignore;
    void *exec = NULL;
    gm->failed = 0;
    if (gpu_graph_begin(&gm->g, &ignore)) return p->graphs_on = 0, NULL;
    pool_step_work(gm, p, ps, want_logits);
    int kernels = 0;
    if (gpu_graph_end(&gm->g, &exec, &kernels, &ignore) || gm->failed) { /* nothing ran: the step runs as launches instead */
        gpu_graph_free(exec);
        gm->failed = 0;
        return p->graphs_on = 0, NULL;
    }
    struct StepGraph *g = &p->graphs[p->next_graph];
    if (p->next_graph < p->n_graphs) gpu_graph_free(g->exec); /* the oldest one makes room */
    *g = (struct StepGraph){.shape = *ps, .want_logits = want_logits, .kernels = kernels, .exec = exec};
    p->last_graph_kernels = kernels;
    p->next_graph = (p->next_graph + 1) % POOL_GRAPHS;
    if (p->n_graphs < POOL_GRAPHS) p->n_graphs++;
    return g;
}

/* pool_step_work as one graph launch where graphs are on, else as launches. */
static void pool_step_run(GpuModel *gm, GpuKVPool *p, const PoolStep *ps, int want_logits) {
    GkDecodeLayer first;
    (void)layer_plans(gm, &p->s, ps->N, &(DecodeAttend){.p = p, .ps = ps}, &first); /* copied up outside a capture */
    struct StepGraph *g = pool_graph(gm, p, ps, want_logits);
    if (!g) {
        pool_step_work(gm, p, ps, want_logits);
        return;
    }
    ZyErr e;
    if (gpu_graph_launch(&gm->g, g->exec, &e) && !gm->failed) gm->failed = 1, gm->err = e;
}

/* Moves the step's packed logits (the wanted rows, sequence by sequence) to model_decode_step's places: sequence i's
 * at row o_i, which counts n_j rows for each earlier sequence that wants every row's and 1 for any other. o_i is at
 * least the packed start, so moving back to front never overwrites rows still to move. */
static void logits_to_places(float *logits, const DecodeSeq *seqs, int n_seqs, int V) {
    int packed = 0, place = 0;
    for (int i = 0; i < n_seqs; i++) {
        const int all = seqs[i].logits == DECODE_LOGITS_ALL;
        packed += all ? seqs[i].n : seqs[i].logits != 0;
        place += all ? seqs[i].n : 1;
    }
    for (int i = n_seqs - 1; i >= 0; i--) {
        const int all = seqs[i].logits == DECODE_LOGITS_ALL, rows = all ? seqs[i].n : seqs[i].logits != 0;
        packed -= rows;
        place -= all ? seqs[i].n : 1;
        if (rows && packed != place)
            memmove(logits + (size_t)place * V, logits + (size_t)packed * V, (size_t)rows * V * sizeof(float));
    }
}

/* A fault after the step's first write: its sequences start over (their states no longer match their lengths). */
static int pool_step_failed(GpuKVPool *p, const DecodeSeq *seqs, int n_seqs) {
    for (int i = 0; i < n_seqs; i++) gpu_kvpool_seq_reset(p, seqs[i].slot);
    return -1;
}

int gpu_model_decode_step(GpuModel *gm, GpuKVPool *p, const DecodeSeq *seqs, int n_seqs, const int32_t *tokens,
                          float *logits, ZyErr *err) {
    const ZayaConfig *f = &gm->cfg;
    if (p->gm != gm) return zy_fail(err, "decode: the KV cache belongs to another GPU model");
    /* model_decode_step's checks, in its order and words (decode.h) */
    const DecodeStepShape shape = {.blocks = &p->blocks, .chunk = p->chunk, .max_len = p->max_len,
                                   .max_rows = p->max_rows, .vocab_size = f->vocab_size, .all_logits = 1};
    int N, wanted;
    if (decode_step_check(&shape, seqs, n_seqs, tokens, &N, &wanted, err)) return -1;
    if (logits && wanted > p->logit_rows)
        return zy_fail(err, "decode: %d rows want logits in one step; this pool gives at most %d (one a sequence and "
                       "a chunk's)", wanted, p->logit_rows);
    if (gpu_use(&gm->g, err)) return -1;
    GpuDecodeScratch *s = &p->s;
    const int V = f->vocab_size;
    gpu_model_refresh_bf16(gm); /* bf16 products read bf16 copies of the weights */
    gm->failed = 0;
    PoolStep ps;
    pool_plan(p, seqs, n_seqs, tokens, logits != NULL, &ps);
    /* only the rows that want logits go through lm_head; they land packed, then move to their sequences' places, as
     * model_decode_step lays them out */
    const int want_logits = logits && ps.n_logits;
    pool_step_run(gm, p, &ps, want_logits);
    if (!want_logits && !gm->failed) { /* the step's faults surface here, before the lengths move */
        if (gpu_sync(&gm->g, "a decoding step", err)) return pool_step_failed(p, seqs, n_seqs);
        for (int i = 0; i < n_seqs; i++) p->blocks.len[seqs[i].slot] += seqs[i].n;
        return 0;
    }
    if (gm->failed) {
        *err = gm->err;
        return pool_step_failed(p, seqs, n_seqs);
    }
    if (gpu_download(&gm->g, logits, s->logits, (size_t)ps.n_logits * V * sizeof(float), err))
        return pool_step_failed(p, seqs, n_seqs);
    for (int i = 0; i < n_seqs; i++) p->blocks.len[seqs[i].slot] += seqs[i].n;
    logits_to_places(logits, seqs, n_seqs, V);
    return 0;
}
