/* The prefix cache's structure (prefix_cache.h) on a KVPool without a model: which blocks a prompt reuses (whole
 * blocks, every token compared, the parent chain), the references it holds, the state a reused prefix starts from,
 * duplicates, and LRU eviction leaf first. Decoding from a reused prefix against the uncached one: test_decode.c. */
#include <string.h>

#include "infer/decode.h"
#include "infer/prefix_cache.h"
#include "model/config.h"
#include "test.h"

enum { BT = 4, BLOCKS = 24, SLOTS = 4, MAXLEN = 48 };

static int make_pool(KVPool *p, PrefixCache *c, ZyErr *err) {
    ZayaConfig cfg = {.vocab_size = 61, .hidden_size = 24, .num_layers = 2, .num_heads = 4, .num_kv_heads = 2,
                      .head_dim = 8, .num_experts = 3, .moe_intermediate_size = 12, .router_hidden_size = 8,
                      .cca_time0 = 2, .cca_time1 = 2, .rms_norm_eps = 1e-5f, .max_position_embeddings = 64,
                      .rope_theta = 10000.0f, .partial_rotary_factor = 0.5f, .initializer_range = 0.02f};
    if (kvpool_create(p, &cfg, SLOTS, MAXLEN, BLOCKS, BT, 8, 8, 0, err)) return -1;
    return prefix_cache_init_kvpool(c, p, err);
}

/* Slot holds blocks for len tokens as if a step had computed them (the cache reads only the table). */
static void fill(KVPool *p, int slot, int len) {
    kvpool_reserve(p, slot, len);
    p->blocks.len[slot] = len;
}

static int row_of(const KVPool *p, int slot, int i) { return kvblocks_row(&p->blocks, slot)[i]; }

TEST(prefix_cache_reuses_whole_matching_blocks) {
    ZyErr err = {{0}};
    KVPool p;
    PrefixCache c;
    REQUIRE(make_pool(&p, &c, &err) == 0);
    int32_t a[40], b[40];
    for (int t = 0; t < 40; t++) a[t] = b[t] = 3 + t % 50;
    fill(&p, 0, 37);
    prefix_cache_insert(&c, 0, a, 30, a + 30, 37); /* prompt 30 tokens + 7 generated: 9 full blocks */
    CHECK(prefix_cache_stats(&c).cached == 9 && prefix_cache_stats(&c).idle == 0);
    for (int i = 0; i < 9; i++) CHECK(p.blocks.refs[row_of(&p, 0, i)] == 2);
    CHECK(p.blocks.refs[row_of(&p, 0, 9)] == 1); /* the partial tenth is not cached */
    /* every token of the prefix matches: 9 blocks; one token short of a block boundary: one block fewer */
    CHECK(prefix_cache_attach(&c, 1, b, 36) == 36);
    CHECK(p.blocks.len[1] == 36 && p.blocks.n_held[1] == 9);
    for (int i = 0; i < 9; i++) CHECK(row_of(&p, 1, i) == row_of(&p, 0, i) && p.blocks.refs[row_of(&p, 0, i)] == 3);
    kvpool_seq_release(&p, 1);
    CHECK(prefix_cache_attach(&c, 1, b, 35) == 32);
    kvpool_seq_release(&p, 1);
    /* a token differing in the third block: the two before it */
    b[10] = 1;
    CHECK(prefix_cache_attach(&c, 1, b, 36) == 8 && p.blocks.n_held[1] == 2);
    kvpool_seq_release(&p, 1);
    /* differing in the first: nothing, the slot untouched */
    b[10] = a[10];
    b[0] = 1;
    CHECK(prefix_cache_attach(&c, 1, b, 36) == 0 && p.blocks.n_held[1] == 0 && p.blocks.len[1] == 0);
    /* a slot that is not empty takes nothing */
    fill(&p, 2, 3);
    CHECK(prefix_cache_attach(&c, 2, a, 36) == 0 && p.blocks.n_held[2] == 1);
    kvpool_seq_release(&p, 2);
    prefix_cache_count(&c, 36);
    prefix_cache_count(&c, 0);
    PrefixCacheStats st = prefix_cache_stats(&c);
    CHECK(st.queries == 2 && st.hits == 1 && st.hit_tokens == 36);
    /* the request ends: its cached blocks stay (idle), the rest go back */
    kvpool_seq_release(&p, 0);
    st = prefix_cache_stats(&c);
    CHECK(st.cached == 9 && st.idle == 9 && p.blocks.n_free == BLOCKS - 9);
    prefix_cache_free(&c);
    kvpool_free(&p);
}

/* A reused prefix starts from the CCA state kept with its last block, not from zeros or another block's. */
TEST(prefix_cache_attach_restores_the_kept_state) {
    ZyErr err = {{0}};
    KVPool p;
    PrefixCache c;
    REQUIRE(make_pool(&p, &c, &err) == 0);
    const size_t per_block = kvpool_state_bytes(&p.cfg) / sizeof(float);
    const size_t P = p.conv_pad, C = cfg_conv_channels(&p.cfg), half = cfg_k_channels(&p.cfg) / 2;
    REQUIRE(per_block == (size_t)p.cfg.num_layers * (P * C + half));
    for (size_t i = 0; i < (size_t)BLOCKS * per_block; i++) p.block_state[i] = (float)i; /* block b's at b * per_block */
    int32_t a[12];
    for (int t = 0; t < 12; t++) a[t] = t;
    fill(&p, 0, 12);
    prefix_cache_insert(&c, 0, a, 12, NULL, 12);
    REQUIRE(prefix_cache_attach(&c, 1, a, 11) == 8);
    const float *want = p.block_state + (size_t)row_of(&p, 0, 1) * per_block;
    int same = 1;
    for (int l = 0; l < p.cfg.num_layers; l++) {
        same &= memcmp(p.conv_state[l] + P * C, want, P * C * sizeof(float)) == 0;
        same &= memcmp(p.vd_prev[l] + half, want + P * C, half * sizeof(float)) == 0;
        want += P * C + half;
    }
    CHECK(same);
    prefix_cache_free(&c);
    kvpool_free(&p);
}

/* A prefix computed twice (two requests at once) is cached once; the second copy stays its slot's and goes back to
 * the pool with it, and so does everything after it in that slot. */
TEST(prefix_cache_keeps_one_copy_of_a_prefix) {
    ZyErr err = {{0}};
    KVPool p;
    PrefixCache c;
    REQUIRE(make_pool(&p, &c, &err) == 0);
    int32_t a[16];
    for (int t = 0; t < 16; t++) a[t] = 7 + t;
    fill(&p, 0, 8);
    fill(&p, 1, 16);
    prefix_cache_insert(&c, 0, a, 16, NULL, 8);
    prefix_cache_insert(&c, 1, a, 16, NULL, 16);
    CHECK(prefix_cache_stats(&c).cached == 2);
    for (int i = 0; i < 4; i++) CHECK(p.blocks.refs[row_of(&p, 1, i)] == 1);
    /* slot 0 goes on: its third and fourth blocks join */
    kvpool_reserve(&p, 0, 16);
    p.blocks.len[0] = 16;
    prefix_cache_insert(&c, 0, a, 16, NULL, 16);
    CHECK(prefix_cache_stats(&c).cached == 4);
    kvpool_seq_release(&p, 0);
    kvpool_seq_release(&p, 1);
    CHECK(p.blocks.n_free == BLOCKS - 4 && prefix_cache_stats(&c).idle == 4);
    prefix_cache_free(&c);
    kvpool_free(&p);
}

/* Eviction gives back the least recently used block no request holds, a chain's last block before its first; a
 * block a request holds is never given back; a pool short of blocks gets every idle one back. */
TEST(prefix_cache_evicts_lru_leaf_first) {
    ZyErr err = {{0}};
    KVPool p;
    PrefixCache c;
    REQUIRE(make_pool(&p, &c, &err) == 0);
    int32_t a[12], b[12];
    for (int t = 0; t < 12; t++) a[t] = 5 + t, b[t] = 30 + t;
    fill(&p, 0, 12);
    prefix_cache_insert(&c, 0, a, 12, NULL, 12); /* chain a: 3 blocks */
    fill(&p, 1, 12);
    prefix_cache_insert(&c, 1, b, 12, NULL, 12); /* chain b: 3 blocks, newer */
    const int a_last = row_of(&p, 0, 2), a_first = row_of(&p, 0, 0), b_last = row_of(&p, 1, 2);
    kvpool_seq_release(&p, 0);
    CHECK(prefix_cache_evict(&c) == 1 && p.blocks.refs[a_last] == 0 && p.blocks.free_blocks[p.blocks.n_free - 1] == a_last);
    CHECK(prefix_cache_stats(&c).cached == 5 && prefix_cache_stats(&c).evictions == 1);
    CHECK(prefix_cache_attach(&c, 2, a, 11) == 8); /* a's first two are still there (and now recently used) */
    kvpool_seq_release(&p, 2);
    /* chain b is held by slot 1: a's two go, a_first last */
    CHECK(prefix_cache_evict(&c) == 1 && p.blocks.refs[a_first] == 1);
    CHECK(prefix_cache_evict(&c) == 1 && p.blocks.refs[a_first] == 0);
    CHECK(prefix_cache_evict(&c) == 0 && p.blocks.refs[b_last] == 2);
    CHECK(prefix_cache_attach(&c, 2, a, 11) == 0);
    kvpool_seq_release(&p, 1);
    /* one request holds half the pool, another wants the other half: b's three idle blocks come back for it */
    fill(&p, 0, MAXLEN);
    CHECK(p.blocks.n_free == BLOCKS - MAXLEN / BT - 3);
    int evicted = 0;
    while (kvpool_reserve(&p, 3, MAXLEN) != 0 && prefix_cache_evict(&c)) evicted++;
    CHECK(evicted == 3 && p.blocks.n_held[3] == MAXLEN / BT && prefix_cache_stats(&c).cached == 0);
    kvpool_seq_release(&p, 3);
    kvpool_seq_release(&p, 0);
    CHECK(p.blocks.n_free == BLOCKS);
    prefix_cache_free(&c);
    kvpool_free(&p);
}
