/* decode: cached incremental inference (ARCHITECTURE.md, "KV cache for decoding"). Per layer the cache holds,
 * for every sequence and past token, k̂ (after QK-norm, temperature and RoPE) and v: 2·Hkv·dh floats. Per
 * sequence and layer it also holds a constant-size state: the last P = (k0-1)+(k1-1) pre-conv columns of
 * X = [q0 | k0] and the previous token's delayed value projection vd. Logits equal a full recompute
 * (model_forward) up to float rounding. */
#ifndef ZAYA_DECODE_H
#define ZAYA_DECODE_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"
#include "sampling.h"
#include "util.h"

/* Scratch for one chunk of B*chunk new token rows (sized once, reused by every call). */
typedef struct {
    int32_t *tokens;                        /* [B*chunk] */
    float *x, *x_mid, *u;                   /* residual stream in / after attention, normed input [N,D] */
    float *rstd;                            /* [N] */
    float *X;                               /* [q0 | k0] of the new rows [N,C] */
    float *Xe, *Ye, *Me;                    /* per sequence: P cached columns + new rows [B,P+chunk,C]; Me has k1-1 more */
    float *query_pre, *key_pre, *query, *key; /* [N,Cq], [N,Ck], [N,Cq], [N,Ck] */
    float *norm_q, *norm_k;                 /* [N,Hq], [N,Hkv] */
    float *vc, *vd, *value;                 /* [N,Ck/2] x2, [N,Ck] */
    float *scores;                          /* [chunk, max_len] for one (sequence, head) */
    float *attn_out, *proj;                 /* [N,Cq], [N,D] */
    float *z[2];                            /* router state, ping-pong across layers [N,R] */
    float *zn, *h1, *h2;                    /* [N,R] */
    float *router_logits, *router_probs;    /* [N,E+1] */
    int32_t *choice;                        /* [N] */
    float *gate;                            /* [N] */
    int32_t *expert_offset, *expert_cursor, *sorted_rows; /* counting sort of rows by expert: [E+1], [E+1], [N] */
    float *expert_in, *expert_gu, *expert_act, *expert_out; /* [N,D], [N,2I], [N,I], [N,D] */
    float *moe_out;                         /* [N,D] */
    float *last_rows;                       /* final-normed last row of each sequence [B,D] */
    float *conv_wp;                         /* cca_conv_forward's workspace */
} DecodeScratch;

typedef struct {
    ZayaConfig cfg;
    int batch, max_len, chunk;              /* chunk: rows per sequence processed at once (longer inputs are split) */
    int len;                                /* tokens already in the cache (the same for every sequence) */
    int conv_pad;                           /* P */
    float **k, **v;                         /* per layer [B, max_len, Ck]: k̂ after RoPE, and the values */
    float **conv_state;                     /* per layer [B, P, C]: X at positions len-P..len-1 (0 before 0) */
    float **vd_prev;                        /* per layer [B, Ck/2]: vd of the token at len-1 (0 when len = 0) */
    float *rope_cos, *rope_sin;             /* [max_len, rd/2], fp32 like the full forward */
    int mark_len;                           /* kvcache_mark: the length and per-sequence state saved */
    float *mark_state;                      /* conv_state and vd_prev of every layer, back to back */
    DecodeScratch s;
    size_t cache_bytes;                     /* k̂, v and the per-sequence state */
    void *block;                            /* one allocation behind everything above */
    void *ptrs;                             /* the per-layer pointer arrays */
} KVCache;

#define KV_DEFAULT_CHUNK 64

/* A cache for `batch` sequences of up to max_len tokens (<= max_position_embeddings); length 0. */
int kvcache_create(KVCache *c, const ZayaConfig *cfg, int batch, int max_len, ZyErr *err);
/* The same with an explicit chunk size: inputs longer than `chunk` tokens per sequence run in pieces. */
int kvcache_create_ex(KVCache *c, const ZayaConfig *cfg, int batch, int max_len, int chunk, ZyErr *err);
void kvcache_reset(KVCache *c); /* length 0, state zeroed */
/* Remembers the current length and state; kvcache_rewind returns to it (the k̂/v rows before the mark are never
 * overwritten), e.g. to score several continuations of one prefilled context. */
void kvcache_mark(KVCache *c);
void kvcache_rewind(KVCache *c);
void kvcache_free(KVCache *c);
/* Bytes of k̂ and v for one token of one sequence, all layers, fp32. */
size_t kvcache_bytes_per_token(const ZayaConfig *cfg);

/* Runs n new tokens per sequence (tokens [batch, n], row-major) continuing from the cache and appends them.
 * Writes logits [batch, n, V], or only the last position's [batch, V] if last_only (logits may be NULL to
 * only fill the cache). Errors (the cache is left untouched): cache full, token ids outside the vocabulary. */
int model_decode(const Model *m, KVCache *c, const int32_t *tokens, int n, float *logits, int last_only, ZyErr *err);
/* The same, also writing each token's chosen expert per layer to routing [L, batch, n] (E = skip) if non-NULL. */
int model_decode_ex(const Model *m, KVCache *c, const int32_t *tokens, int n, float *logits, int last_only,
                    int32_t *routing, ZyErr *err);

/* ---- generation (one sequence) ---------------------------------------------------------------------------- */

typedef enum { GEN_STOP_MAX_TOKENS, GEN_STOP_EOS, GEN_STOP_CALLBACK, GEN_STOP_CACHE_FULL } GenStop;

typedef struct {
    int n_prompt, n_generated;
    double prefill_s;  /* the prompt's forward, up to the first token's logits */
    double decode_s;   /* the single-token steps after that (n_generated - 1 of them), sampling included */
    GenStop stop;
} GenerateStats;

/* Called with each generated token: return 0 to go on, > 0 to stop after this token, < 0 for an error (err filled). */
typedef int (*GenerateTokenFn)(void *ctx, int32_t token, ZyErr *err);

/* What generation drives, whatever runs it (the CPU cache below, or a GPU's, gpu_decode.h): reset the cache, decode
 * n tokens of the one sequence writing the last position's logits [V], the cache's length. */
typedef struct {
    void *ctx;
    void (*reset)(void *ctx);
    int (*decode)(void *ctx, const int32_t *tokens, int n, float *logits, ZyErr *err);
    int (*len)(void *ctx);
    int batch, max_len, vocab_size;
} DecodeBackend;

/* generate() over any backend. */
int generate_with(const DecodeBackend *be, Sampler *s, const SamplingParams *p, ZyRng *rng, const int32_t *prompt,
                  int n_prompt, int max_new, const int32_t *stop_ids, int n_stop, GenerateTokenFn fn, void *ctx,
                  GenerateStats *st, ZyErr *err);

/* Resets the cache (batch 1), prefills the prompt, then samples up to max_new tokens, feeding each back. Stops
 * after a token in stop_ids (it is reported to fn and counted), at max_new, when fn asks, or when the cache is
 * full. */
int generate(const Model *m, KVCache *c, Sampler *s, const SamplingParams *p, ZyRng *rng, const int32_t *prompt,
             int n_prompt, int max_new, const int32_t *stop_ids, int n_stop, GenerateTokenFn fn, void *ctx,
             GenerateStats *st, ZyErr *err);

#endif
