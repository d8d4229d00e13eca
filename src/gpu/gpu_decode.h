/* gpu_decode: cached incremental inference on a GPU, the twin of src/infer/decode.c (ARCHITECTURE.md, "KV cache for
 * decoding"): per layer the cache holds k̂ (after QK norm, temperature and RoPE) and v for every sequence and past
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

/* generate() (decode.h) with the model and cache on the GPU; sampling stays on the host. */
int gpu_generate(GpuModel *gm, GpuKVCache *c, Sampler *s, const SamplingParams *p, ZyRng *rng, const int32_t *prompt,
                 int n_prompt, int max_new, const int32_t *stop_ids, int n_stop, GenerateTokenFn fn, void *ctx,
                 GenerateStats *st, ZyErr *err);

#endif
