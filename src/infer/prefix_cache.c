/* Automatic prefix caching over a block pool (see prefix_cache.h): a hash table of cached blocks chained by parent, and
 * LRU eviction of the blocks no sequence holds. */
#include "infer/prefix_cache.h"

#include <stdlib.h>
#include <string.h>

int prefix_cache_init(PrefixCache *c, KVBlocks *blocks, PrefixShareFn share, void *pool, ZyErr *err) {
    memset(c, 0, sizeof *c);
    c->blocks = blocks, c->share = share, c->pool = pool;
    c->block_tokens = blocks->block_tokens;
    c->n_blocks = blocks->n_blocks;
    int buckets = 1;
    while (buckets < 2 * c->n_blocks) buckets *= 2;
    c->mask = buckets - 1;
    const size_t nb = (size_t)c->n_blocks;
    c->bucket = malloc(sizeof *c->bucket * buckets);
    c->next = malloc(sizeof *c->next * nb);
    c->parent = malloc(sizeof *c->parent * nb);
    c->children = calloc(nb, sizeof *c->children);
    c->hash = malloc(sizeof *c->hash * nb);
    c->used = malloc(sizeof *c->used * nb);
    c->tokens = malloc(sizeof *c->tokens * nb * c->block_tokens);
    if (!c->bucket || !c->next || !c->parent || !c->children || !c->hash || !c->used || !c->tokens) {
        prefix_cache_free(c);
        return zy_fail(err, "out of memory for the prefix cache of %d blocks", blocks->n_blocks);
    }
    for (int i = 0; i < buckets; i++) c->bucket[i] = -1;
    for (size_t b = 0; b < nb; b++) c->parent[b] = PREFIX_NOT_CACHED;
    return 0;
}

static int kvpool_share(void *pool, int slot, const int32_t *blocks, int n) {
    return kvpool_seq_share(pool, slot, blocks, n);
}

int prefix_cache_init_kvpool(PrefixCache *c, KVPool *pool, ZyErr *err) {
    memset(c, 0, sizeof *c);
    if (kvpool_keep_block_states(pool, err)) return -1;
    return prefix_cache_init(c, &pool->blocks, kvpool_share, pool, err);
}

void prefix_cache_free(PrefixCache *c) {
    free(c->bucket);
    free(c->next);
    free(c->parent);
    free(c->children);
    free(c->hash);
    free(c->used);
    free(c->tokens);
    memset(c, 0, sizeof *c);
}

/* The hash of a prefix extended by one block's tokens (a splitmix64 step per token). */
static uint64_t chain_hash(uint64_t h, const int32_t *tokens, int n) {
    for (int i = 0; i < n; i++) {
        uint64_t x = h ^ (uint32_t)tokens[i];
        h = zy_splitmix64(&x);
    }
    return h;
}

/* The cached block after `parent` holding exactly these tokens (prefix hash h), or -1. */
static int32_t find(const PrefixCache *c, uint64_t h, int32_t parent, const int32_t *tokens) {
    for (int32_t b = c->bucket[h & c->mask]; b >= 0; b = c->next[b])
        if (c->hash[b] == h && c->parent[b] == parent &&
            memcmp(c->tokens + (size_t)b * c->block_tokens, tokens, sizeof *tokens * c->block_tokens) == 0)
            return b;
    return -1;
}

int prefix_cache_attach(PrefixCache *c, int slot, const int32_t *tokens, int n) {
    const int bt = c->block_tokens, want = n / bt < c->blocks->max_blocks ? n / bt : c->blocks->max_blocks;
    int32_t run[want > 0 ? want : 1];
    int got = 0;
    uint64_t h = 0;
    for (int32_t parent = -1; got < want; got++) {
        h = chain_hash(h, tokens + (size_t)got * bt, bt);
        const int32_t b = find(c, h, parent, tokens + (size_t)got * bt);
        if (b < 0) break;
        run[got] = parent = b;
    }
    if (got == 0 || c->share(c->pool, slot, run, got)) return 0;
    c->clock++;
    for (int i = 0; i < got; i++) c->used[run[i]] = c->clock;
    return got * bt;
}

void prefix_cache_count(PrefixCache *c, int reused) {
    c->st.queries++;
    c->st.hits += reused > 0;
    c->st.hit_tokens += (uint64_t)reused;
}

void prefix_cache_insert(PrefixCache *c, int slot, const int32_t *prompt, int n_prompt, const int32_t *more, int len) {
    const int bt = c->block_tokens;
    const int32_t *row = kvblocks_row(c->blocks, slot);
    int32_t block_tok[bt];
    uint64_t h = 0;
    c->clock++;
    for (int i = 0, parent = -1; i < len / bt; parent = row[i++]) {
        for (int t = 0; t < bt; t++) {
            const int pos = i * bt + t;
            block_tok[t] = pos < n_prompt ? prompt[pos] : more[pos - n_prompt];
        }
        h = chain_hash(h, block_tok, bt);
        const int32_t b = row[i];
        if (c->parent[b] != PREFIX_NOT_CACHED) continue; /* cached already (this slot's, or shared with it) */
        if (find(c, h, parent, block_tok) >= 0) return; /* the same prefix in another block: keep that one */
        c->parent[b] = parent;
        if (parent >= 0) c->children[parent]++;
        c->children[b] = 0;
        c->hash[b] = h;
        c->used[b] = c->clock;
        memcpy(c->tokens + (size_t)b * bt, block_tok, sizeof block_tok);
        c->next[b] = c->bucket[h & c->mask];
        c->bucket[h & c->mask] = b;
        c->blocks->refs[b]++; /* the cache's hold */
        c->st.cached++;
    }
}

int prefix_cache_evict(PrefixCache *c) {
    int32_t victim = -1;
    for (int32_t b = 0; b < c->n_blocks; b++)
        if (c->parent[b] != PREFIX_NOT_CACHED && c->blocks->refs[b] == 1 && c->children[b] == 0 &&
            (victim < 0 || c->used[b] < c->used[victim]))
            victim = b;
    if (victim < 0) return 0;
    int32_t *p = &c->bucket[c->hash[victim] & c->mask];
    while (*p != victim) p = &c->next[*p];
    *p = c->next[victim];
    if (c->parent[victim] >= 0) c->children[c->parent[victim]]--;
    c->parent[victim] = PREFIX_NOT_CACHED;
    c->blocks->refs[victim] = 0;
    c->blocks->free_blocks[c->blocks->n_free++] = victim;
    c->st.cached--;
    c->st.evictions++;
    return 1;
}

PrefixCacheStats prefix_cache_stats(const PrefixCache *c) {
    PrefixCacheStats st = c->st;
    st.idle = 0;
    for (int32_t b = 0; b < c->n_blocks; b++) st.idle += c->parent[b] != PREFIX_NOT_CACHED && c->blocks->refs[b] == 1;
    return st;
}
