/* decode: cached incremental inference (docs/model.md, cached decoding). Per layer the cache holds,
 * for every sequence and past token, k̂ (after QK-norm, temperature and RoPE) and v: 2·Hkv·dh floats. Per
 * sequence and layer it also holds a constant-size state: the last P = (k0-1)+(k1-1) pre-conv columns of
 * X = [q0 | k0] and the previous token's delayed value projection vd. Logits equal a full recompute
 * (model_forward) up to float rounding. */
#ifndef ZAYA_DECODE_H
#define ZAYA_DECODE_H

#include <stddef.h>
#include <stdint.h>

#include "model/model.h"
#include "infer/sampling.h"
#include "util/util.h"

/* Scratch for one decoding step of up to max_rows new token rows from up to max_seqs sequences (sized once). */
typedef struct {
    int32_t *tokens;                        /* [N] */
    float *x, *x_mid, *u;                   /* residual stream in / after attention, normed input [N,D] */
    float *rstd;                            /* [N] */
    float *X;                               /* [q0 | k0] of the new rows [N,C] */
    float *Xe;                              /* per sequence: P cached columns + its new rows */
    float *Y, *conv_work;                   /* the convolution's outputs [N,C]; its workspace */
    float *query_pre, *key_pre, *query, *key; /* [N,Cq], [N,Ck], [N,Cq], [N,Ck] */
    float *norm_q, *norm_k;                 /* [N,Hq], [N,Hkv] */
    float *vc, *vd, *value;                 /* [N,Ck/2] x2, [N,Ck] */
    float *scores;                          /* per thread [chunk, max_len]: one (sequence, head) at a time */
    float *row_max;                         /* per thread [chunk]: the score rows' running softmax max ... */
    double *row_sum;                        /* ... and sum */
    int n_threads;                          /* score buffers */
    float *attn_out, *proj;                 /* [N,Cq], [N,D] */
    float *z[2];                            /* router state, ping-pong across layers [N,R] */
    LayerActs moe;                          /* the MoE block's buffers (u_mlp = u, router_rstd = rstd, the router
                                             * GELUs in place; router state in z[]) */
    float *last_rows;                       /* final-normed rows that get logits [max_seqs,D] */
} DecodeScratch;

/* A block pool's bookkeeping, in host memory wherever the blocks live (KVPool's here, gpu_decode.h's on a GPU): per
 * slot a row of the block table, its length and the blocks it holds; a stack of free block ids; per block its
 * holders (the slots whose rows hold it, kvblocks_fork and kvblocks_share letting several share it, and a prefix
 * cache's hold, prefix_cache.h). A block goes back to the stack with its last holder. */
typedef struct {
    int max_seqs, block_tokens, n_blocks, max_blocks; /* slots; block size; blocks; blocks one slot may hold */
    int32_t *table;                                   /* [max_seqs, max_blocks] block ids */
    int *len, *n_held;                                /* per slot: tokens cached, blocks held */
    int32_t *free_blocks;                             /* a stack of n_free block ids */
    int n_free;
    int32_t *refs;                                    /* per block: its holders */
} KVBlocks;

/* A shape (max_blocks: enough for max_len tokens), its arrays unset; kvblocks_carve carves them from cv (a sizing
 * pass with cv->base NULL, then the binding one); kvblocks_init then empties every slot and stacks every block. */
KVBlocks kvblocks_shape(int max_seqs, int max_len, int n_blocks, int block_tokens);
void kvblocks_carve(ZyCarver *cv, KVBlocks *b);
void kvblocks_init(KVBlocks *b);
static inline int32_t *kvblocks_row(const KVBlocks *b, int slot) { return b->table + (size_t)slot * b->max_blocks; }
/* Blocks needed for `tokens` positions. */
static inline int kvblocks_for(const KVBlocks *b, int tokens) { return (tokens + b->block_tokens - 1) / b->block_tokens; }
/* Makes slot hold blocks for `tokens` positions (new blocks low ids first); -1 (nothing taken) when the stack has
 * too few or the row too little room. */
int kvblocks_reserve(KVBlocks *b, int slot, int tokens);
/* Slot's length to 0 and its blocks given up (each back to the stack with its last holder). */
void kvblocks_release(KVBlocks *b, int slot);
/* The bookkeeping of kvpool_fork: child, empty and holding only blocks of its own, takes parent's full blocks (shared)
 * before its own and parent's length. *copy_from / *copy_to: the parent's partly filled last block and the child's
 * own block that must become a copy of it, or -1 / -1 when parent's length is whole blocks. -1, nothing changed,
 * as kvpool_fork refuses. The caller copies the block's rows and the slot's state. */
int kvblocks_fork(KVBlocks *b, int parent, int child, int32_t *copy_from, int32_t *copy_to);
/* The bookkeeping of kvpool_seq_share: slot, empty and holding nothing, takes the n blocks (shared) and the length
 * n * block_tokens. -1 (nothing changed) when the slot is not empty or n is out of range. */
int kvblocks_share(KVBlocks *b, int slot, const int32_t *blocks, int n);

/* The KV cache as a pool of fixed-size blocks shared by up to max_seqs sequences (slots), each with its own length
 * (a server's running batch: sequences join and leave between steps). Per layer a block holds block_tokens rows of
 * k̂ (after QK-norm, temperature and RoPE) and v, 2·Ck values each (fp32, or bf16: kv_bf16); a slot's block table
 * maps its positions to blocks. Per slot and layer there is also the constant-size CCA state: the last P = (k0-1)+(k1-1) pre-conv columns
 * of X = [q0 | k0] and the previous token's delayed value projection vd. A sliding-window layer (config.h) attends
 * to its last W keys only and rotates with its own RoPE tables; its older blocks are kept (not reused). */
typedef struct {
    ZayaConfig cfg;
    int max_len;                            /* tokens per sequence (<= max_position_embeddings) */
    KVBlocks blocks;                        /* slots: the blocks each holds and its length; the free blocks */
    int max_rows, chunk;                    /* new rows per step, all sequences / per sequence */
    int conv_pad;                           /* P */
    int kv_bf16;                            /* k̂ and v held as bf16 (k16, v16; k, v unset), else fp32 (k, v) */
    float **k;                              /* per layer [n_blocks, Ck, block_tokens]: each block's keys transposed */
    float **v;                              /* per layer [n_blocks, block_tokens, Ck] */
    uint16_t **k16, **v16;                  /* the same as bf16 */
    float **conv_state;                     /* per layer [max_seqs, P, C]: X at positions len-P..len-1 (0 before 0) */
    float **vd_prev;                        /* per layer [max_seqs, Ck/2]: vd of the token at len-1 (0 when len = 0) */
    float *block_state;                     /* NULL, or per block the CCA state at its end (kvpool_keep_block_states) */
    float *rope_cos, *rope_sin;             /* [max_len, rd/2], fp32 like the full forward */
    float *rope_cos_sw, *rope_sin_sw;       /* the sliding-window layers' own tables (NULL without such layers) */
    DecodeScratch s;
    size_t cache_bytes;                     /* k̂, v and the per-slot state */
    void *block;                            /* one allocation behind everything above */
    void **ptrs;                            /* the per-layer pointer arrays */
} KVPool;

/* A pool of n_blocks blocks of block_tokens tokens for max_seqs sequences of up to max_len tokens; one step runs up
 * to max_rows new rows in all, at most chunk of them per sequence. Every slot starts empty. */
int kvpool_create(KVPool *p, const ZayaConfig *cfg, int max_seqs, int max_len, int n_blocks, int block_tokens,
                  int max_rows, int chunk, int kv_bf16, ZyErr *err);
void kvpool_free(KVPool *p);
/* Slot back to length 0 with zero state, keeping its blocks. */
void kvpool_seq_reset(KVPool *p, int slot);
/* Slot back to length 0, its blocks returned to the pool (a block shared with another slot stays with it). */
void kvpool_seq_release(KVPool *p, int slot);
/* Makes slot hold blocks for `tokens` positions; -1 (nothing taken) when the pool has too few free blocks. */
int kvpool_reserve(KVPool *p, int slot, int tokens);
/* Makes child, an empty slot holding only blocks of its own (kvpool_reserve), continue from parent's cached tokens
 * without computing them again: the parent's full blocks become the first of the child's (shared, reference-counted:
 * a full block is never written again), the parent's partly filled last block is copied into the child's first own
 * block (copy-on-write at the first block where the two will differ), and the CCA state and length are copied. The
 * child keeps its own blocks after those. -1 (nothing changes) when the child holds blocks of others, or too few of
 * its own for the copy, or its table has no room. */
int kvpool_fork(KVPool *p, int parent, int child);
/* From now on every step that fills a block to its end keeps the slot's CCA state at that point with the block
 * (kvpool_state_bytes per block, allocated here), so that a sequence can later continue from the block's end
 * without the tokens before it (kvpool_seq_share). */
int kvpool_keep_block_states(KVPool *p, ZyErr *err);
/* Makes slot, empty and holding no blocks, continue after the n full blocks `blocks` (shared, reference-counted, as
 * kvpool_fork shares) with the state kept at the last one's end: its length becomes n * block_tokens. -1 (nothing
 * changes) without kept states, when the slot is not empty, or n is out of range. */
int kvpool_seq_share(KVPool *p, int slot, const int32_t *blocks, int n);
/* Bytes of one block (all layers) and of one slot's constant CCA state (all layers). */
size_t kvpool_block_bytes(const ZayaConfig *cfg, int block_tokens, int kv_bf16);
size_t kvpool_state_bytes(const ZayaConfig *cfg);

/* One sequence's part of a step: n new tokens appended to slot at position len[slot]; logits wanted: none (0), of
 * its last new row (1), or of every new row (DECODE_LOGITS_ALL: a prompt's log-probabilities). */
typedef struct {
    int slot, n, logits;
} DecodeSeq;
#define DECODE_LOGITS_ALL 2

/* One step over a ragged batch: seqs[i] contributes tokens[row_i .. row_i + n_i) (rows in order of seqs). Each
 * sequence has a place in logits: seqs[i]'s starts at row o_i = the number of rows before it, counting n_j for a
 * DECODE_LOGITS_ALL sequence and 1 for any other (o_i = i when none asks for every row); its last row's logits go
 * there where seqs[i].logits, every row's where DECODE_LOGITS_ALL. The slots must hold blocks for their new lengths
 * (kvpool_reserve). Errors (nothing changes): bad slot, repeated slot, n out of range, too many rows, no blocks,
 * token ids outside the vocabulary. */
int model_decode_step(const Model *m, KVPool *p, const DecodeSeq *seqs, int n_seqs, const int32_t *tokens,
                      float *logits, ZyErr *err);

/* What a pool's step is checked against (the GPU's pool, gpu_decode.h, shares the checks and their words). */
typedef struct {
    const KVBlocks *blocks;  /* slots, lengths, blocks held */
    int chunk, max_len, max_rows, vocab_size;
    int all_logits;          /* the pool gives every row's logits (DECODE_LOGITS_ALL with n > 1) */
} DecodeStepShape;
/* model_decode_step's refusals, in order: sequences, slots, rows per sequence, cache room, blocks held, rows in all,
 * token ids. On success *rows = the step's rows and *n_logits (if not NULL) = sequences that want logits. */
int decode_step_check(const DecodeStepShape *p, const DecodeSeq *seqs, int n_seqs, const int32_t *tokens, int *rows,
                      int *n_logits, ZyErr *err);

/* A cache for `batch` sequences of the same length (one block per sequence): generation, scoring, benchmarks. */
typedef struct {
    ZayaConfig cfg;
    int batch, max_len, chunk;              /* chunk: rows per sequence processed at once (longer inputs are split) */
    int len;                                /* tokens already in the cache (the same for every sequence) */
    int mark_len;                           /* kvcache_mark: the length and per-sequence state saved */
    float *mark_state;                      /* conv_state and vd_prev of every layer, back to back */
    size_t cache_bytes;                     /* k̂, v and the per-sequence state */
    KVPool pool;
} KVCache;

#define KV_DEFAULT_CHUNK 64

/* A cache for `batch` sequences of up to max_len tokens (<= max_position_embeddings); length 0. */
int kvcache_create(KVCache *c, const ZayaConfig *cfg, int batch, int max_len, ZyErr *err);
/* The same with an explicit chunk size: inputs longer than `chunk` tokens per sequence run in pieces. */
int kvcache_create_ex(KVCache *c, const ZayaConfig *cfg, int batch, int max_len, int chunk, ZyErr *err);
/* ... and with k̂ and v held as bf16 (kv_bf16 = 1: half the memory and half the bytes each step reads) or fp32 (the
 * cache above). */
int kvcache_create_kv(KVCache *c, const ZayaConfig *cfg, int batch, int max_len, int chunk, int kv_bf16, ZyErr *err);
/* A --kv-dtype value: "auto" (bf16 for a model whose weights are bf16 or quantized, on the CPU and on a GPU, where
 * the bf16 cache measured 1.5-3.5% faster a decode step than fp32 at batch 1 and 32 on an H200; f32 otherwise),
 * "f32"/"fp32" or "bf16". Returns kv_bf16 (0 or 1), or -1 with an error naming `flag`. */
int kv_dtype_resolve(const char *value, int weights_narrow, const char *flag, ZyErr *err);
void kvcache_reset(KVCache *c); /* length 0, state zeroed */
/* Remembers the current length and state; kvcache_rewind returns to it (the k̂/v rows before the mark are never
 * overwritten), e.g. to score several continuations of one prefilled context. */
void kvcache_mark(KVCache *c);
void kvcache_rewind(KVCache *c);
void kvcache_free(KVCache *c);
/* Bytes of k̂ and v for one token of one sequence, all layers, fp32 or bf16. */
size_t kvcache_bytes_per_token(const ZayaConfig *cfg, int kv_bf16);

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
 * n tokens of the one sequence writing the last position's logits [V], the cache's length. Scoring (eval) also
 * uses decode_all (every new position's logits [n, V]) and, where the cache has them (NULL otherwise), mark (keep
 * the current state) and rewind (go back to it). */
typedef struct {
    void *ctx;
    void (*reset)(void *ctx);
    int (*decode)(void *ctx, const int32_t *tokens, int n, float *logits, ZyErr *err);
    int (*len)(void *ctx);
    int (*decode_all)(void *ctx, const int32_t *tokens, int n, float *logits, ZyErr *err);
    void (*mark)(void *ctx);
    void (*rewind)(void *ctx);
    int batch, max_len, vocab_size;
} DecodeBackend;

/* The CPU backend over model m and cache c (both outlive it); d is its state. */
typedef struct {
    const Model *m;
    KVCache *c;
} CpuDecode;
DecodeBackend decode_backend_cpu(CpuDecode *d, const Model *m, KVCache *c);

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
