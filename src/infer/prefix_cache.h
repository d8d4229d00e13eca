/* prefix_cache: automatic prefix caching over a block pool's blocks (a KVPool's, or a GPU's: it keeps to KVBlocks). A full block stays in the pool after the sequence
 * that filled it ends, keyed by its whole token prefix (a hash chained over the blocks up to and including it; on a
 * hit the block's own tokens are compared and its parent must be the block matched before it, so every token of the
 * prefix is compared, never the hash alone). A later sequence whose tokens start the same way takes the blocks
 * (shared, reference-counted, as kvpool_fork shares) and the CCA state kept at the last one's end
 * (kvpool_keep_block_states), and computes only the rest.
 *
 * Why a kept state rather than recomputing it: the state at a block's end (the last P pre-conv columns of every
 * layer and the last delayed value) depends on those positions' residual stream, which depends on their own past
 * convolution state, layer by layer, so recomputing it means running L * P tail tokens again (80 for ZAYA1-8B) on
 * every hit and writing rows of shared blocks. A kept state costs memory instead (kvpool_state_bytes per block, fp32:
 * 2/3 of a 16-token bf16 block at ZAYA1's shapes), is written by the step that fills the block at no extra compute,
 * and makes a reused prefix bit for bit the uncached one.
 *
 * The cache holds one reference to each cached block. A cached block that no sequence holds can be given back:
 * prefix_cache_evict frees the least recently used one without cached children (a sequence holding a cached block
 * holds all its ancestors, so every unreferenced cached block is freed leaf first). */
#ifndef ZAYA_PREFIX_CACHE_H
#define ZAYA_PREFIX_CACHE_H

#include <stdint.h>

#include "infer/decode.h"
#include "util/util.h"

typedef struct {
    uint64_t queries;    /* prompts looked up (prefix_cache_count) */
    uint64_t hits;       /* ... that reused at least one block */
    uint64_t hit_tokens; /* tokens reused, not computed */
    uint64_t evictions;  /* cached blocks given back to the pool */
    int cached;          /* blocks in the cache now */
    int idle;            /* ... of which no sequence holds (what prefix_cache_evict can free) */
} PrefixCacheStats;

/* Makes slot, empty and holding no blocks, continue after the n full cached blocks with the state kept at the last
 * one's end (kvpool_seq_share, or the GPU pool's); -1, nothing changed, when it cannot. */
typedef int (*PrefixShareFn)(void *pool, int slot, const int32_t *blocks, int n);

typedef struct {
    KVBlocks *blocks;            /* the pool's bookkeeping: the cache holds a reference to each cached block */
    PrefixShareFn share;
    void *pool;                  /* share's */
    int block_tokens, n_blocks, mask; /* mask: buckets - 1 */
    int32_t *bucket;   /* [mask + 1] first cached block of each hash bucket, -1 none */
    int32_t *next;     /* per block: the next in its bucket */
    int32_t *parent;   /* per block: the cached block before it (-1: the first), PREFIX_NOT_CACHED */
    int32_t *children; /* per block: cached blocks whose parent it is */
    uint64_t *hash;    /* per block: the hash of its whole prefix */
    uint64_t *used;    /* per block: clock of its last insertion or reuse (LRU) */
    int32_t *tokens;   /* [n_blocks, block_tokens] each cached block's tokens */
    uint64_t clock;
    PrefixCacheStats st;
} PrefixCache;

#define PREFIX_NOT_CACHED (-2)

/* An empty cache over a pool's blocks, whose pool keeps block states already (kvpool_keep_block_states, or the GPU
 * pool's). */
int prefix_cache_init(PrefixCache *c, KVBlocks *blocks, PrefixShareFn share, void *pool, ZyErr *err);
/* The same over a KVPool, whose blocks keep their states from now on (kvpool_keep_block_states). */
int prefix_cache_init_kvpool(PrefixCache *c, KVPool *pool, ZyErr *err);
void prefix_cache_free(PrefixCache *c);

/* Slot, empty and holding no blocks, takes the longest run of cached whole blocks that tokens[0 .. n) start with,
 * and their state: returns the tokens now in the slot (a multiple of block_tokens; 0 when nothing matched). A caller
 * that needs logits of the last token passes n = prompt length - 1. */
int prefix_cache_attach(PrefixCache *c, int slot, const int32_t *tokens, int n);
/* Counts one lookup that reused `reused` tokens (queries, hits, hit tokens: the caller counts only the admissions it
 * keeps). */
void prefix_cache_count(PrefixCache *c, int reused);
/* Caches the full blocks of slot that are not cached yet; its tokens are prompt[0 .. n_prompt) followed by
 * more[0 ..), len of them in all (the slot's length). Stops at a block whose prefix is cached already in another
 * block (the slot keeps its own copy, uncached). */
void prefix_cache_insert(PrefixCache *c, int slot, const int32_t *prompt, int n_prompt, const int32_t *more, int len);
/* Gives the least recently used unreferenced cached block back to the pool: 1, or 0 when there is none. */
int prefix_cache_evict(PrefixCache *c);
/* The counters, and the cached and idle blocks now. */
PrefixCacheStats prefix_cache_stats(const PrefixCache *c);

#endif
