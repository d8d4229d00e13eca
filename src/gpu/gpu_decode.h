/* gpu_decode: cached incremental inference on a GPU, the twin of src/infer/decode.c (docs/model.md, cached
 * decoding): per layer the cache holds k̂ (after QK norm, temperature and RoPE) and v for every sequence and past
 * token, and per sequence the last P pre-convolution columns and the previous token's delayed value. Logits equal a
 * full recompute up to float rounding (tests/gpu/test_gpu_decode.c). */
#ifndef ZAYA_GPU_DECODE_H
#define ZAYA_GPU_DECODE_H

#include <stddef.h>
#include <stdint.h>

#include "infer/decode.h"
#include "gpu/gpu_model.h"
#include "util/util.h"

typedef struct GpuKVCache GpuKVCache;

/* A cache on gm's GPU for `batch` sequences of up to max_len tokens; inputs longer than `chunk` tokens per
 * sequence run in pieces (KV_DEFAULT_CHUNK when 0). */
int gpu_kvcache_create(GpuKVCache **out, GpuModel *gm, int batch, int max_len, int chunk, ZyErr *err);
/* The same with k̂ / v held in bf16 when kv_bf16 (--kv-dtype bf16, as the CPU's kvcache_create_kv: rounded
 * nearest-even when appended, widened exactly when attended, fp32 arithmetic; half the bytes). */
int gpu_kvcache_create_kv(GpuKVCache **out, GpuModel *gm, int batch, int max_len, int chunk, int kv_bf16,
                          ZyErr *err);
void gpu_kvcache_free(GpuKVCache *c);
void gpu_kvcache_reset(GpuKVCache *c);
int gpu_kvcache_len(const GpuKVCache *c);
int gpu_kvcache_max_len(const GpuKVCache *c);
size_t gpu_kvcache_bytes(const GpuKVCache *c); /* the cache and its per-sequence state on the device */

/* n new tokens per sequence (host tokens [batch, n]) continuing from the cache; writes host logits [batch, n, V],
 * or only each sequence's last position [batch, V] with last_only (logits may be NULL). Refused input (a full cache,
 * token ids outside the vocabulary) leaves the cache as it was; a GPU fault mid-pass empties it (the layers' states
 * were already overwritten). */
int gpu_model_decode(GpuModel *gm, GpuKVCache *c, const int32_t *tokens, int n, float *logits, int last_only,
                     ZyErr *err);

/* The DecodeBackend (decode.h) of GPU cache c over gm (both outlive it; d is its state): decode, decode_all, no
 * mark / rewind. */
typedef struct {
    GpuModel *gm;
    GpuKVCache *c;
} GpuDecode;
DecodeBackend gpu_decode_backend(GpuDecode *d, GpuModel *gm, GpuKVCache *c);

/* ---- a ragged batch over a block pool: KVPool and model_decode_step (decode.h) on the GPU, for a server ---------- */

typedef struct GpuKVPool GpuKVPool;

/* kvpool_create on gm's GPU: n_blocks blocks of block_tokens tokens shared by max_seqs sequences (slots) of up to
 * max_len tokens; one step runs up to max_rows new rows in all, at most chunk of them per sequence. The block
 * bookkeeping (block table, lengths, free blocks, holders) stays on the host, a KVBlocks as KVPool's is; per layer
 * k̂ and v [n_blocks, block_tokens, Ck], each slot's convolution and delayed-value state and the step's scratch
 * (logits for max_seqs + chunk rows) live on the device. Every slot starts empty. Errors as kvpool_create, and GPU
 * memory. */
int gpu_kvpool_create(GpuKVPool **out, GpuModel *gm, int max_seqs, int max_len, int n_blocks, int block_tokens,
                      int max_rows, int chunk, ZyErr *err);
/* The same with k̂ / v in bf16 when kv_bf16 (as gpu_kvcache_create_kv). */
int gpu_kvpool_create_kv(GpuKVPool **out, GpuModel *gm, int max_seqs, int max_len, int n_blocks, int block_tokens,
                         int max_rows, int chunk, int kv_bf16, ZyErr *err);
void gpu_kvpool_free(GpuKVPool *p);
/* As kvpool_seq_reset / kvpool_seq_release / kvpool_reserve / kvpool_fork (its copies made on the device). */
void gpu_kvpool_seq_reset(GpuKVPool *p, int slot);
void gpu_kvpool_seq_release(GpuKVPool *p, int slot);
int gpu_kvpool_reserve(GpuKVPool *p, int slot, int tokens);
int gpu_kvpool_fork(GpuKVPool *p, int parent, int child);
/* As kvpool_keep_block_states and kvpool_seq_share: each block keeps the slot's state at its end in GPU memory
 * (kvpool_state_bytes a block), written by the step that fills it; a slot continues from a kept state. A prefix
 * cache (prefix_cache.h) runs over gpu_kvpool_blocks with gpu_kvpool_seq_share. */
int gpu_kvpool_keep_block_states(GpuKVPool *p, ZyErr *err);
int gpu_kvpool_seq_share(GpuKVPool *p, int slot, const int32_t *blocks, int n);
/* Every block's kept state into out (n_blocks x the floats of one slot's state, as KVPool's block_state lays them
 * out), after the queued work; -1 with an error without kept states or when the copy fails. */
int gpu_kvpool_download_block_states(GpuKVPool *p, float *out, ZyErr *err);
KVBlocks *gpu_kvpool_blocks(GpuKVPool *p);       /* the host bookkeeping */
int gpu_kvpool_len(const GpuKVPool *p, int slot); /* tokens cached for slot */
int gpu_kvpool_free_blocks(const GpuKVPool *p);
size_t gpu_kvpool_bytes(const GpuKVPool *p);      /* k̂, v, the per-slot state and the kept states on the device */
/* ZAYA_GPU_GRAPHS=1 (read by gpu_kvpool_create; 0, the default, is off): each step shape's device work is captured
 * once as a CUDA graph and replayed (bf16 runs with grouped experts; a refused capture turns graphs off for the pool).
 * The graphs held now (0 when off). */
int gpu_kvpool_graphs(const GpuKVPool *p);
/* The kernels the newest graph replays (a step's launches, counted by the capture); 0 without graphs. */
int gpu_kvpool_graph_kernels(const GpuKVPool *p);

/* model_decode_step on the GPU: the same ragged batch (seqs[i] adds tokens[row_i .. row_i + n_i) to its slot), the
 * same logits in the same places (a sequence's last row, or every row for DECODE_LOGITS_ALL; only those rows go
 * through lm_head), the same checks and messages: refused input (bad or repeated slot, n out of range, too many rows,
 * no blocks, token ids outside the vocabulary) changes nothing. Its own refusal: more rows wanting logits than one a
 * sequence plus a chunk's (the scratch holds no more). The step's descriptors go up in one copy; it waits for the GPU once at its end (and
 * once per layer for the experts' sizes, as gpu_model_decode). A GPU fault mid-step empties the step's sequences
 * (length 0, zero state, blocks kept): their states were already overwritten. */
int gpu_model_decode_step(GpuModel *gm, GpuKVPool *p, const DecodeSeq *seqs, int n_seqs, const int32_t *tokens,
                          float *logits, ZyErr *err);

/* generate() (decode.h) with the model and cache on the GPU; sampling stays on the host. */
int gpu_generate(GpuModel *gm, GpuKVCache *c, Sampler *s, const SamplingParams *p, ZyRng *rng, const int32_t *prompt,
                 int n_prompt, int max_new, const int32_t *stop_ids, int n_stop, GenerateTokenFn fn, void *ctx,
                 GenerateStats *st, ZyErr *err);

#endif
