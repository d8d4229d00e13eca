/* Cached incremental inference: the layer loop of model.c's forward for new tokens of many sequences, reading the
 * past from a KV cache of fixed-size blocks. Every op is the kernel the full forward uses; the new pieces are
 * attention of new queries over cached keys (a rectangular causal mask) and the bookkeeping of a ragged batch:
 * sequences at different positions, each adding its own number of rows. */
#include "infer/decode.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/attention.h"
#include "kernels/kernel_table.h"
#include "kernels/kernels.h"
#include "kernels/matmul.h"

/* ---- layout: one allocation carved into buffers (sizing pass with base = NULL, then binding) ------------------ */

static void carve_pool(ZyCarver *cv, KVPool *p) {
    const ZayaConfig *f = &p->cfg;
    const size_t S = p->blocks.max_seqs, ML = p->max_len, N = p->max_rows, P = p->conv_pad;
    const size_t BT = (size_t)p->blocks.n_blocks * p->blocks.block_tokens;
    const size_t D = f->hidden_size, Cq = cfg_q_channels(f), Ck = cfg_k_channels(f), C = Cq + Ck;
    const size_t R = f->router_hidden_size;
    const size_t Hq = f->num_heads, Hkv = f->num_kv_heads, half_rd = cfg_rotary_dim(f) / 2;
    const size_t k1 = f->cca_time1;
    for (int l = 0; l < f->num_layers; l++) {
        if (p->kv_bf16) { /* two bf16 values per carved float */
            p->k16[l] = (uint16_t *)ZY_CARVE_F(cv, (BT * Ck + 1) / 2);
            p->v16[l] = (uint16_t *)ZY_CARVE_F(cv, (BT * Ck + 1) / 2);
        } else {
            p->k[l] = ZY_CARVE_F(cv, BT * Ck);
            p->v[l] = ZY_CARVE_F(cv, BT * Ck);
        }
        p->conv_state[l] = ZY_CARVE_F(cv, S * P * C);
        p->vd_prev[l] = ZY_CARVE_F(cv, S * Ck / 2);
    }
    p->cache_bytes = cv->used;
    kvblocks_carve(cv, &p->blocks);
    p->rope_cos = ZY_CARVE_F(cv, ML * half_rd);
    p->rope_sin = ZY_CARVE_F(cv, ML * half_rd);
    if (cfg_has_sliding(f)) {
        const size_t half_sw = cfg_sliding_rotary_dim(f) / 2;
        p->rope_cos_sw = ZY_CARVE_F(cv, ML * half_sw);
        p->rope_sin_sw = ZY_CARVE_F(cv, ML * half_sw);
    }
    DecodeScratch *s = &p->s;
    s->tokens = ZY_CARVE_I(cv, N);
    s->x = ZY_CARVE_F(cv, N * D);
    s->x_mid = ZY_CARVE_F(cv, N * D);
    s->u = ZY_CARVE_F(cv, N * D);
    s->rstd = ZY_CARVE_F(cv, N);
    s->X = ZY_CARVE_F(cv, N * C);
    /* each sequence of the step adds P cached columns to its rows in Xe */
    const size_t SN = S < N ? S : N;
    s->Xe = ZY_CARVE_F(cv, (SN * P + N) * C);
    s->Y = ZY_CARVE_F(cv, N * C);
    s->conv_work = ZY_CARVE_F(cv, (size_t)cca_conv_last_work_floats((int)N, (int)C, f->cca_time0, (int)k1));
    s->query_pre = ZY_CARVE_F(cv, N * Cq);
    s->key_pre = ZY_CARVE_F(cv, N * Ck);
    s->query = ZY_CARVE_F(cv, N * Cq);
    s->key = ZY_CARVE_F(cv, N * Ck);
    s->norm_q = ZY_CARVE_F(cv, N * Hq);
    s->norm_k = ZY_CARVE_F(cv, N * Hkv);
    s->vc = ZY_CARVE_F(cv, N * Ck / 2);
    s->vd = ZY_CARVE_F(cv, N * Ck / 2);
    s->value = ZY_CARVE_F(cv, N * Ck);
    s->scores = ZY_CARVE_F(cv, (size_t)s->n_threads * p->chunk * ML);
    s->row_max = ZY_CARVE_F(cv, (size_t)s->n_threads * p->chunk);
    s->row_sum = (double *)zy_carve(cv, (size_t)s->n_threads * p->chunk, sizeof(double));
    s->attn_out = ZY_CARVE_F(cv, N * Cq);
    s->proj = ZY_CARVE_F(cv, N * D);
    s->z[0] = ZY_CARVE_F(cv, N * R);
    s->z[1] = ZY_CARVE_F(cv, N * R);
    layer_acts_carve_moe(cv, &s->moe, f, N, 0);
    s->moe.u_mlp = s->u;
    s->moe.router_rstd = s->rstd; /* free while the MoE block runs */
    s->last_rows = ZY_CARVE_F(cv, N * D); /* every row when a step asks for all (DECODE_LOGITS_ALL) */
}

size_t kvcache_bytes_per_token(const ZayaConfig *cfg, int kv_bf16) {
    return (size_t)cfg->num_layers * 2 * cfg_k_channels(cfg) * (kv_bf16 ? sizeof(uint16_t) : sizeof(float));
}

size_t kvpool_block_bytes(const ZayaConfig *cfg, int block_tokens, int kv_bf16) {
    return kvcache_bytes_per_token(cfg, kv_bf16) * (size_t)block_tokens;
}

size_t kvpool_state_bytes(const ZayaConfig *cfg) {
    const size_t P = cfg->attention == ZY_ATTN_CCA ? cfg_conv_pad(cfg) : 0;
    return (size_t)cfg->num_layers * (P * cfg_conv_channels(cfg) + cfg_k_channels(cfg) / 2) * sizeof(float);
}

int kvpool_create(KVPool *p, const ZayaConfig *cfg, int max_seqs, int max_len, int n_blocks, int block_tokens,
                  int max_rows, int chunk, int kv_bf16, ZyErr *err) {
    memset(p, 0, sizeof *p);
    if (max_seqs <= 0 || max_len <= 0 || n_blocks <= 0 || block_tokens <= 0 || max_rows <= 0 || chunk <= 0)
        return zy_fail(err, "KV cache: sequences %d, max_len %d, blocks %d, block size %d, rows %d and chunk %d must be "
                       "positive", max_seqs, max_len, n_blocks, block_tokens, max_rows, chunk);
    if (max_len > cfg->max_position_embeddings)
        return zy_fail(err, "KV cache: max_len %d exceeds max_position_embeddings %d", max_len,
                       cfg->max_position_embeddings);
    p->cfg = *cfg;
    p->max_len = max_len;
    p->blocks = kvblocks_shape(max_seqs, max_len, n_blocks, block_tokens);
    p->kv_bf16 = kv_bf16 != 0;
    p->chunk = chunk < max_len ? chunk : max_len;
    p->max_rows = max_rows < p->chunk ? p->chunk : max_rows;
    p->conv_pad = cfg->attention == ZY_ATTN_CCA ? cfg_conv_pad(cfg) : 0; /* the MHA variant has no convolutions */
    p->s.n_threads = omp_get_max_threads();
    const int L = cfg->num_layers;
    void **ptrs = calloc((size_t)6 * L, sizeof *ptrs);
    if (!ptrs) return zy_fail(err, "out of memory");
    p->ptrs = ptrs;
    p->k = (float **)ptrs;
    p->v = (float **)ptrs + L;
    p->conv_state = (float **)ptrs + 2 * L;
    p->vd_prev = (float **)ptrs + 3 * L;
    p->k16 = (uint16_t **)ptrs + 4 * L;
    p->v16 = (uint16_t **)ptrs + 5 * L;
    ZyCarver sizing = {0};
    carve_pool(&sizing, p);
    p->block = zy_calloc(sizing.used);
    if (!p->block) {
        size_t mb = sizing.used >> 20;
        kvpool_free(p);
        return zy_fail(err, "out of memory allocating %zu MB for a KV cache of %d blocks of %d tokens", mb, n_blocks,
                       block_tokens);
    }
    ZyCarver cv = {.base = p->block};
    carve_pool(&cv, p);
    rope_tables(p->rope_cos, p->rope_sin, max_len, cfg_rotary_dim(cfg), cfg->rope_theta);
    if (p->rope_cos_sw)
        rope_tables(p->rope_cos_sw, p->rope_sin_sw, max_len, cfg_sliding_rotary_dim(cfg), cfg->rope_theta_sliding);
    kvblocks_init(&p->blocks);
    return 0;
}

void kvpool_free(KVPool *p) {
    free(p->block_state);
    zy_free(p->block);
    free(p->ptrs);
    memset(p, 0, sizeof *p);
}

void kvpool_seq_reset(KVPool *p, int slot) {
    /* Only the state is read before being written; the k̂/v rows past len are never read. */
    const size_t P = p->conv_pad, C = cfg_conv_channels(&p->cfg), half = cfg_k_channels(&p->cfg) / 2;
    for (int l = 0; l < p->cfg.num_layers; l++) {
        memset(p->conv_state[l] + slot * P * C, 0, P * C * sizeof(float));
        memset(p->vd_prev[l] + slot * half, 0, half * sizeof(float));
    }
    p->blocks.len[slot] = 0;
}

void kvpool_seq_release(KVPool *p, int slot) {
    kvpool_seq_reset(p, slot);
    kvblocks_release(&p->blocks, slot);
}

int kvpool_reserve(KVPool *p, int slot, int tokens) { return kvblocks_reserve(&p->blocks, slot, tokens); }

int kvpool_fork(KVPool *p, int parent, int child) {
    int32_t from, to;
    if (kvblocks_fork(&p->blocks, parent, child, &from, &to)) return -1;
    const size_t Ck = cfg_k_channels(&p->cfg), block = (size_t)p->blocks.block_tokens * Ck; /* per block and layer */
    const size_t P = p->conv_pad, C = cfg_conv_channels(&p->cfg), half = Ck / 2;
    for (int l = 0; l < p->cfg.num_layers; l++) {
        if (from >= 0) { /* the whole block: rows past len are never read */
            if (p->kv_bf16) {
                memcpy(p->k16[l] + to * block, p->k16[l] + from * block, block * sizeof(uint16_t));
                memcpy(p->v16[l] + to * block, p->v16[l] + from * block, block * sizeof(uint16_t));
            } else {
                memcpy(p->k[l] + to * block, p->k[l] + from * block, block * sizeof(float));
                memcpy(p->v[l] + to * block, p->v[l] + from * block, block * sizeof(float));
            }
        }
        memcpy(p->conv_state[l] + (size_t)child * P * C, p->conv_state[l] + (size_t)parent * P * C, P * C * sizeof(float));
        memcpy(p->vd_prev[l] + (size_t)child * half, p->vd_prev[l] + (size_t)parent * half, half * sizeof(float));
    }
    return 0;
}

int kvpool_keep_block_states(KVPool *p, ZyErr *err) {
    if (p->block_state) return 0;
    const size_t bytes = kvpool_state_bytes(&p->cfg);
    if (!(p->block_state = calloc((size_t)p->blocks.n_blocks, bytes + (bytes == 0))))
        return zy_fail(err, "out of memory keeping the CCA state of %d KV blocks (%zu bytes each)", p->blocks.n_blocks,
                       bytes);
    return 0;
}

/* Layer l's part of a block's kept state: P*C conv columns, then Ck/2 delayed values (kvpool_state_bytes' order). */
static float *block_state_at(const KVPool *p, int32_t block, int l) {
    const size_t P = p->conv_pad, C = cfg_conv_channels(&p->cfg), half = cfg_k_channels(&p->cfg) / 2;
    return p->block_state + (size_t)block * p->cfg.num_layers * (P * C + half) + (size_t)l * (P * C + half);
}

int kvpool_seq_share(KVPool *p, int slot, const int32_t *blocks, int n) {
    if (!p->block_state || kvblocks_share(&p->blocks, slot, blocks, n)) return -1;
    const size_t P = p->conv_pad, C = cfg_conv_channels(&p->cfg), half = cfg_k_channels(&p->cfg) / 2;
    for (int l = 0; l < p->cfg.num_layers; l++) {
        const float *st = block_state_at(p, blocks[n - 1], l);
        memcpy(p->conv_state[l] + (size_t)slot * P * C, st, P * C * sizeof(float));
        memcpy(p->vd_prev[l] + (size_t)slot * half, st + P * C, half * sizeof(float));
    }
    return 0;
}

/* The first block end past position pos (a step adding rows at pos.. fills the blocks ending there and later). */
static int block_end_after(const KVPool *p, int pos) {
    const int bt = p->blocks.block_tokens;
    return (pos / bt + 1) * bt;
}

/* The block whose end is position `end` (a multiple of block_tokens) in slot's table, when kept states are wanted. */
static int32_t block_ending_at(const KVPool *p, int slot, int end) {
    return kvblocks_row(&p->blocks, slot)[(end - 1) / p->blocks.block_tokens];
}

/* ---- the block bookkeeping (KVBlocks), the GPU's pool's too ---------------------------------------------------- */

KVBlocks kvblocks_shape(int max_seqs, int max_len, int n_blocks, int block_tokens) {
    return (KVBlocks){.max_seqs = max_seqs, .block_tokens = block_tokens, .n_blocks = n_blocks,
                      .max_blocks = (max_len + block_tokens - 1) / block_tokens};
}

void kvblocks_carve(ZyCarver *cv, KVBlocks *b) {
    const size_t S = (size_t)b->max_seqs;
    b->table = ZY_CARVE_I(cv, S * b->max_blocks);
    b->len = (int *)ZY_CARVE_I(cv, S);
    b->n_held = (int *)ZY_CARVE_I(cv, S);
    b->free_blocks = ZY_CARVE_I(cv, b->n_blocks);
    b->refs = ZY_CARVE_I(cv, b->n_blocks);
}

void kvblocks_init(KVBlocks *b) {
    for (int i = 0; i < b->max_seqs; i++) b->len[i] = b->n_held[i] = 0;
    /* the stack hands out low ids first */
    for (int i = 0; i < b->n_blocks; i++) {
        b->free_blocks[i] = b->n_blocks - 1 - i;
        b->refs[i] = 0;
    }
    b->n_free = b->n_blocks;
}

int kvblocks_reserve(KVBlocks *b, int slot, int tokens) {
    int32_t *row = kvblocks_row(b, slot);
    const int need = kvblocks_for(b, tokens) - b->n_held[slot];
    if (need <= 0) return 0;
    if (need > b->n_free || b->n_held[slot] + need > b->max_blocks) return -1;
    for (int i = 0; i < need; i++) {
        const int32_t blk = b->free_blocks[--b->n_free];
        b->refs[blk] = 1;
        row[b->n_held[slot]++] = blk;
    }
    return 0;
}

void kvblocks_release(KVBlocks *b, int slot) {
    const int32_t *row = kvblocks_row(b, slot);
    for (int i = b->n_held[slot] - 1; i >= 0; i--) /* a shared block goes back with its last holder */
        if (--b->refs[row[i]] == 0) b->free_blocks[b->n_free++] = row[i];
    b->n_held[slot] = 0;
    b->len[slot] = 0;
}

int kvblocks_fork(KVBlocks *b, int parent, int child, int32_t *copy_from, int32_t *copy_to) {
    const int bt = b->block_tokens, len = b->len[parent], shared = len / bt, partial = len % bt;
    int32_t *pr = kvblocks_row(b, parent), *cr = kvblocks_row(b, child);
    const int own = b->n_held[child];
    if (parent == child || b->len[child] != 0 || shared + own > b->max_blocks || (partial && own < 1)) return -1;
    for (int i = 0; i < own; i++)
        if (b->refs[cr[i]] != 1) return -1;
    memmove(cr + shared, cr, (size_t)own * sizeof *cr);
    for (int i = 0; i < shared; i++) {
        cr[i] = pr[i];
        b->refs[pr[i]]++;
    }
    *copy_from = partial ? pr[shared] : -1;
    *copy_to = partial ? cr[shared] : -1;
    b->n_held[child] = shared + own;
    b->len[child] = len;
    return 0;
}

int kvblocks_share(KVBlocks *b, int slot, const int32_t *blocks, int n) {
    if (b->len[slot] != 0 || b->n_held[slot] != 0 || n <= 0 || n > b->max_blocks) return -1;
    int32_t *row = kvblocks_row(b, slot);
    for (int i = 0; i < n; i++) {
        row[i] = blocks[i];
        b->refs[blocks[i]]++;
    }
    b->n_held[slot] = n;
    b->len[slot] = n * b->block_tokens;
    return 0;
}

/* ---- the layer loop over a ragged batch ------------------------------------------------------------------------ */

/* Where each sequence of a step sits: its slot, first position, rows in the step's N rows, and its P cached
 * columns + rows in the convolution input Xe (at xe_row). */
typedef struct {
    int slot, pos0, n, row0, xe_row;
} StepSeq;

typedef struct {
    StepSeq *seq;
    int n_seqs, N;
} Step;

/* Where position pos of a slot sits in a layer's values (its row of Ck) and keys (channel 0 of its column; a block's
 * keys are stored transposed, [Ck, block_tokens], so that a query's scores against a block are a product of rows
 * broadcast against whole vectors of keys: no per-key sums to reduce), in elements of p->v[l] / p->v16[l] and
 * p->k[l] / p->k16[l]. */
static inline size_t kv_row_at(const KVPool *p, int slot, int pos) {
    const int32_t blk = kvblocks_row(&p->blocks, slot)[pos / p->blocks.block_tokens];
    return ((size_t)blk * p->blocks.block_tokens + pos % p->blocks.block_tokens) * cfg_k_channels(&p->cfg);
}
static inline size_t kv_key_at(const KVPool *p, int slot, int pos) {
    const int32_t blk = kvblocks_row(&p->blocks, slot)[pos / p->blocks.block_tokens];
    return (size_t)blk * p->blocks.block_tokens * cfg_k_channels(&p->cfg) + pos % p->blocks.block_tokens;
}

/* The next block's keys / values of kv head j, asked for while this block's are used: a sequence's blocks lie
 * anywhere in the pool, where the hardware's prefetchers lose the stream at each one (cached decoding reads every
 * cached key and value once per step: memory-bound). 16 keys' worth at most (the same-length cache's one block per
 * sequence is long). */
static inline void prefetch_keys(const KVPool *p, int l, int slot, int pos, int j) {
    const int bt = p->blocks.block_tokens, dh = p->cfg.head_dim, n = bt - pos % bt < 16 ? bt - pos % bt : 16;
    const size_t at = kv_key_at(p, slot, pos) + (size_t)j * dh * bt, size = p->kv_bf16 ? 2 : 4;
    const char *kt = p->kv_bf16 ? (const char *)(p->k16[l] + at) : (const char *)(p->k[l] + at);
    for (int d = 0; d < dh; d++)
        for (size_t c = 0; c < n * size; c += 64) __builtin_prefetch(kt + ((size_t)d * bt) * size + c);
}
static inline void prefetch_values(const KVPool *p, int l, int slot, int pos, int j) {
    const int bt = p->blocks.block_tokens, dh = p->cfg.head_dim, n = bt - pos % bt < 16 ? bt - pos % bt : 16;
    const size_t size = p->kv_bf16 ? 2 : 4;
    for (int t = 0; t < n; t++) {
        const size_t at = kv_row_at(p, slot, pos + t) + (size_t)j * dh;
        const char *v = p->kv_bf16 ? (const char *)(p->v16[l] + at) : (const char *)(p->v[l] + at);
        for (size_t c = 0; c < dh * size; c += 64) __builtin_prefetch(v + c);
    }
}

/* Causal attention of one sequence's n new queries (positions p0..p0+n-1) for the nh query heads h0..h0+nh-1 (all
 * reading kv head h0 / G) over its cached keys 0..p0+n-1 — in a sliding-window layer (window W > 0) query p sees
 * keys p-W+1..p only — block by block, with the full forward's arithmetic (flash_attention_forward: scaled products,
 * its online softmax over the same key tiles, products with the values). The heads of a kv head share one pass
 * over its keys: each key is read once for all of them. sc: [n nh, p0+n] scratch, row t nh + g for query t of head
 * h0 + g; row_max, row_sum: n nh each, the rows' running softmax. */
static void attend_seq_heads(const KVPool *p, int layer, const StepSeq *q, int h0, int nh, const float *query,
                             float *out, float *sc, float *row_max, double *row_sum) {
    const ZayaConfig *f = &p->cfg;
    const int dh = f->head_dim, G = f->num_heads / f->num_kv_heads, j = h0 / G, W = cfg_layer_window(f, layer);
    const int Cq = f->num_heads * dh, Ck = f->num_kv_heads * dh, n = q->n, bt = p->blocks.block_tokens;
    const int hi = q->pos0 + n, lo = W > 0 && q->pos0 - W + 1 > 0 ? q->pos0 - W + 1 : 0, Lk = hi - lo;
    const float scale = (float)(1.0 / sqrt((double)dh));
    const float *qr = query + (size_t)q->row0 * Cq + h0 * dh;
    float *o = out + (size_t)q->row0 * Cq + h0 * dh;
    /* keys lo..hi-1 in pieces that stay inside one block; score column s - lo */
    for (int s0 = lo; s0 < hi;) {
        const int cnt = (bt - s0 % bt) < hi - s0 ? bt - s0 % bt : hi - s0;
        const size_t kt = kv_key_at(p, q->slot, s0) + (size_t)j * dh * bt; /* [dh, bt] */
        if (s0 + cnt < hi) prefetch_keys(p, layer, q->slot, s0 + cnt, j);
        /* one head's n queries (n rows Cq apart), or each query's nh heads (nh rows dh apart) */
        for (int t = 0; t < (nh == 1 ? 1 : n); t++) {
            float *st = sc + (size_t)t * nh * Lk + (s0 - lo);
            const float *qt = qr + (size_t)t * Cq;
            const int rows = nh == 1 ? n : nh, ldq = nh == 1 ? Cq : dh;
            if (p->kv_bf16)
                decode_attn_scores_bf16(st, Lk, qt, ldq, p->k16[layer] + kt, bt, rows, cnt, bt - s0 % bt, dh, scale);
            else
                decode_attn_scores(st, Lk, qt, ldq, p->k[layer] + kt, bt, rows, cnt, bt - s0 % bt, dh, scale);
        }
        s0 += cnt;
    }
    /* softmax and o = P V over the full forward's key tiles, each a step of its online softmax (running max and
     * sum, output rescaled) with the same roundings: decoding's output is the full forward's, bit for bit where the
     * scores are. P V register-blocked over the rows that share each value row: one head's n queries, or query t's
     * nh heads (adjacent in o). Score row r is query r / nh's head h0 + r % nh. */
    const int rows = n * nh;
    for (int r = 0; r < rows; r++) {
        row_max[r] = -INFINITY, row_sum[r] = 0;
        memset(o + (size_t)(r / nh) * Cq + (size_t)(r % nh) * dh, 0, sizeof(float) * (size_t)dh);
    }
    for (int k0 = lo / ZY_ATTN_KEY_TILE * ZY_ATTN_KEY_TILE; k0 < hi; k0 += ZY_ATTN_KEY_TILE) {
        const int c0 = k0 > lo ? k0 : lo, c1 = k0 + ZY_ATTN_KEY_TILE < hi ? k0 + ZY_ATTN_KEY_TILE : hi;
        for (int r = 0; r < rows; r++) {
            const int last = q->pos0 + r / nh; /* query at position p0+t sees keys up to p0+t ... */
            const int first = W > 0 && last - W + 1 > 0 ? last - W + 1 : 0; /* ... and from p0+t-W+1 in a window */
            decode_attn_softmax_tile(sc + (size_t)r * Lk + (c0 - lo), k0, c0, c1, first, last, &row_max[r], &row_sum[r],
                                     o + (size_t)(r / nh) * Cq + (size_t)(r % nh) * dh, dh);
        }
        for (int s0 = c0; s0 < c1;) { /* the tile's keys, block by block */
            const int cnt = (bt - s0 % bt) < c1 - s0 ? bt - s0 % bt : c1 - s0;
            const size_t vb = kv_row_at(p, q->slot, s0) + (size_t)j * dh;
            if (s0 + cnt < hi && (s0 + cnt) % bt == 0) prefetch_values(p, layer, q->slot, s0 + cnt, j);
            for (int t = 0; t < (nh == 1 ? 1 : n); t++) {
                float *ot = o + (size_t)t * Cq;
                const float *pt = sc + (size_t)t * nh * Lk + (s0 - lo);
                const int nr = nh == 1 ? n : nh, ldo = nh == 1 ? Cq : dh;
                if (p->kv_bf16)
                    decode_attn_values_bf16(ot, ldo, pt, Lk, p->v16[layer] + vb, Ck, nr, cnt, dh, 1);
                else
                    decode_attn_values(ot, ldo, pt, Lk, p->v[layer] + vb, Ck, nr, cnt, dh, 1);
            }
            s0 += cnt;
        }
    }
    for (int r = 0; r < rows; r++) decode_attn_normalise(o + (size_t)(r / nh) * Cq + (size_t)(r % nh) * dh, dh, row_sum[r]);
}

/* Appends every sequence's new rows of s->key / s->value to layer l's blocks, then attends in parallel, each
 * thread on its own score buffer: per (sequence, kv head) — its G query heads together — where their n G score rows
 * fit the buffer's `chunk` rows (decoding), else per (sequence, query head) (long prefill pieces). */
static void append_kv_attend(KVPool *p, const Step *st, int l) {
    DecodeScratch *s = &p->s;
    const int Ck = cfg_k_channels(&p->cfg), Hq = p->cfg.num_heads, G = Hq / p->cfg.num_kv_heads;
    for (int i = 0; i < st->n_seqs; i++) {
        const StepSeq *q = &st->seq[i];
        for (int t = 0; t < q->n; t++) {
            const size_t kt = kv_key_at(p, q->slot, q->pos0 + t), vr = kv_row_at(p, q->slot, q->pos0 + t);
            const float *key = s->key + (size_t)(q->row0 + t) * Ck, *value = s->value + (size_t)(q->row0 + t) * Ck;
            if (p->kv_bf16) { /* rounded to nearest even, as the bf16 weights were */
                for (int c = 0; c < Ck; c++) p->k16[l][kt + (size_t)c * p->blocks.block_tokens] = zy_f32_to_bf16(key[c]);
                zy_kernels()->f32_to_bf16_row(p->v16[l] + vr, value, Ck);
            } else {
                for (int c = 0; c < Ck; c++) p->k[l][kt + (size_t)c * p->blocks.block_tokens] = key[c];
                memcpy(p->v[l] + vr, value, Ck * sizeof(float));
            }
        }
    }
    const int slots = st->n_seqs * Hq; /* one per (sequence, query head); a group's work sits on its first head */
    long work = 0;
    for (int i = 0; i < st->n_seqs; i++) work += (long)st->seq[i].n * (st->seq[i].pos0 + st->seq[i].n);
#pragma omp parallel for schedule(dynamic, 1) if (slots > 1 && ZY_PAR(work * Hq * p->cfg.head_dim))
    for (int x = 0; x < slots; x++) {
        const StepSeq *q = &st->seq[x / Hq];
        const int h = x % Hq, nh = q->n * G <= p->chunk ? G : 1;
        if (h % nh) continue;
        const size_t th = (size_t)omp_get_thread_num();
        attend_seq_heads(p, l, q, h, nh, s->query, s->attn_out, s->scores + th * p->chunk * p->max_len,
                         s->row_max + th * p->chunk, s->row_sum + th * p->chunk);
    }
}

/* CCA on u for the step's rows: appends k̂ and v to the cache, updates every sequence's conv and delayed-value
 * state, writes s->proj [N, D]. */
static void cca_decode(const ZayaConfig *f, const LayerWeights *W, KVPool *p, const Step *st, int l) {
    DecodeScratch *s = &p->s;
    const int N = st->N, D = f->hidden_size, dh = f->head_dim, P = p->conv_pad;
    const int Hq = f->num_heads, Hkv = f->num_kv_heads, Cq = Hq * dh, Ck = Hkv * dh, C = Cq + Ck, half = Ck / 2;
    /* 1. down projections and (4.) the values: the four products of u in one pass */
    {
        const ZyWeights w[] = {WEIGHT_VIEWS(W->w_q), WEIGHT_VIEWS(W->w_k), WEIGHT_VIEWS(W->w_v_current),
                               WEIGHT_VIEWS(W->w_v_delayed)};
        const int out[] = {Cq, Ck, half, half}, ld[] = {C, C, half, half};
        float *const y[] = {s->X, s->X + Cq, s->vc, s->vd};
        zy_matmul_wt_shared(N, D, s->u, D, 4, w, out, y, ld);
    }
    /* 2. convolutions over [P cached columns | n new] per sequence, outputs for the new rows only, into Y [N, C]:
     * the cached zero columns before position 0 reproduce the full forward's padding (depthwise outputs there are
     * exactly b0). Consecutive sequences with the same n run as one batch. */
    for (int i = 0; i < st->n_seqs; i++) {
        const StepSeq *q = &st->seq[i];
        float *xe = s->Xe + (size_t)q->xe_row * C;
        memcpy(xe, p->conv_state[l] + (size_t)q->slot * P * C, (size_t)P * C * sizeof(float));
        memcpy(xe + (size_t)P * C, s->X + (size_t)q->row0 * C, (size_t)q->n * C * sizeof(float));
    }
    for (int i = 0, g; i < st->n_seqs; i = g) {
        const StepSeq *q = &st->seq[i];
        for (g = i + 1; g < st->n_seqs && st->seq[g].n == q->n; g++) {}
        /* sequences i..g-1, each its P cached columns and n new rows */
        const ZyWeights w1 = {.f32 = W->conv_gr_w, .bf16 = W->conv_gr_w16}; /* bf16 where the model has it */
        cca_conv_forward_last(s->Y + (size_t)q->row0 * C, s->conv_work, s->Xe + (size_t)q->xe_row * C, W->conv_dw_w,
                              W->conv_dw_b, w1, W->conv_gr_b, model_conv_shape(f, g - i, P + q->n), q->n);
    }
    for (int i = 0; i < st->n_seqs; i++) {
        const StepSeq *q = &st->seq[i];
        memcpy(p->conv_state[l] + (size_t)q->slot * P * C, s->Xe + (size_t)(q->xe_row + q->n) * C,
               (size_t)P * C * sizeof(float));
        /* a block filled to its end keeps the state there: X of its last P positions, Xe rows from end - pos0 */
        for (int end = block_end_after(p, q->pos0); p->block_state && end <= q->pos0 + q->n; end += p->blocks.block_tokens)
            memcpy(block_state_at(p, block_ending_at(p, q->slot, end), l),
                   s->Xe + (size_t)(q->xe_row + end - q->pos0) * C, (size_t)P * C * sizeof(float));
    }
    /* 3. q-k mean skip, every row at once (Y and X both [N, C]) */
    qk_mean_forward(s->query_pre, s->key_pre, s->Y, s->X, N, Hq, Hkv, dh);
    /* 4. values (products made in 1.); each sequence's first new row's delayed half is its previous token's vd */
    for (int i = 0, g; i < st->n_seqs; i = g) {
        const StepSeq *q = &st->seq[i];
        for (g = i + 1; g < st->n_seqs && st->seq[g].n == q->n; g++) {}
        const size_t r = q->row0;
        delayed_value_forward(s->value + r * Ck, s->vc + r * half, s->vd + r * half, g - i, q->n, half);
    }
    /* 5. QK norm and 6. RoPE at each sequence's absolute positions (tables offset by pos0), fused as in model.c */
    const float scale = sqrtf((float)dh), eps = 1.1920928955078125e-07f; /* as model.c */
    const int rd = cfg_layer_rotary_dim(f, l);
    const float *rcos = cfg_layer_is_sliding(f, l) ? p->rope_cos_sw : p->rope_cos;
    const float *rsin = cfg_layer_is_sliding(f, l) ? p->rope_sin_sw : p->rope_sin;
    for (int i = 0; i < st->n_seqs; i++) {
        const StepSeq *q = &st->seq[i];
        float *prev = p->vd_prev[l] + (size_t)q->slot * half;
        memcpy(s->value + (size_t)q->row0 * Ck + half, prev, (size_t)half * sizeof(float));
        memcpy(prev, s->vd + (size_t)(q->row0 + q->n - 1) * half, (size_t)half * sizeof(float));
        for (int end = block_end_after(p, q->pos0); p->block_state && end <= q->pos0 + q->n; end += p->blocks.block_tokens)
            memcpy(block_state_at(p, block_ending_at(p, q->slot, end), l) + (size_t)P * C,
                   s->vd + (size_t)(q->row0 + end - 1 - q->pos0) * half, (size_t)half * sizeof(float));
        const size_t toff = (size_t)q->pos0 * (rd / 2), r = q->row0;
        l2norm_rope_forward(s->query + r * Cq, s->norm_q + r * Hq, s->query_pre + r * Cq, NULL, rcos + toff,
                            rsin + toff, q->n, q->n, Hq, dh, rd, scale, eps);
        l2norm_rope_forward(s->key + r * Ck, s->norm_k + r * Hkv, s->key_pre + r * Ck, W->temp, rcos + toff,
                            rsin + toff, q->n, q->n, Hkv, dh, rd, scale, eps);
    }
    /* 7. attention over everything so far, the new keys and values appended first */
    append_kv_attend(p, st, l);
    /* 8. output projection */
    zy_matmul_wt(N, D, Cq, s->attn_out, Cq, WEIGHT_VIEWS(W->w_o), s->proj, D);
}

/* The MHA variant on u for the step's rows: q, k, v, RoPE at each sequence's positions, keys and values appended to
 * the cache, attention over everything so far, o_proj into s->proj [N, D]. */
static void mha_decode(const ZayaConfig *f, const LayerWeights *W, KVPool *p, const Step *st, int l) {
    DecodeScratch *s = &p->s;
    const int N = st->N, D = f->hidden_size, dh = f->head_dim;
    const int Hq = f->num_heads, Hkv = f->num_kv_heads, Cq = Hq * dh, Ck = Hkv * dh, rd = cfg_layer_rotary_dim(f, l);
    const float *rcos = cfg_layer_is_sliding(f, l) ? p->rope_cos_sw : p->rope_cos;
    const float *rsin = cfg_layer_is_sliding(f, l) ? p->rope_sin_sw : p->rope_sin;
    {
        const ZyWeights w[] = {WEIGHT_VIEWS(W->w_q), WEIGHT_VIEWS(W->w_k), WEIGHT_VIEWS(W->w_v)};
        const int out[] = {Cq, Ck, Ck}, ld[] = {Cq, Ck, Ck};
        float *const y[] = {s->query, s->key, s->value};
        zy_matmul_wt_shared(N, D, s->u, D, 3, w, out, y, ld);
    }
    for (int i = 0; i < st->n_seqs; i++) {
        const StepSeq *q = &st->seq[i];
        const size_t toff = (size_t)q->pos0 * (rd / 2), r = q->row0;
        rope_forward(s->query + r * Cq, rcos + toff, rsin + toff, q->n, q->n, Hq, dh, rd);
        rope_forward(s->key + r * Ck, rcos + toff, rsin + toff, q->n, q->n, Hkv, dh, rd);
    }
    append_kv_attend(p, st, l);
    zy_matmul_wt(N, D, Cq, s->attn_out, Cq, WEIGHT_VIEWS(W->w_o), s->proj, D);
}

/* MoE block on s->u with router state r_prev (NULL at layer 0); writes s->moe.moe_out and z (the next r_prev):
 * model.c's moe_block_forward on the decode scratch (the router MLP's GELUs in place: no backward here). */
static void moe_decode(const ZayaConfig *f, const LayerWeights *W, DecodeScratch *s, float *z, const float *r_prev,
                       int N) {
    s->moe.router_z = z;
    const MoeBuffers b = moe_buffers_of(&s->moe, NULL, NULL);
    moe_block_forward(f, W, &b, r_prev, N);
}

/* The layer loop for one step (s->tokens [N] filled): appends every sequence's rows to its cache and leaves the
 * final residual stream in s->x [N, D]. routing [L, N] (may be NULL) gets each row's expert per layer. */
static void decode_rows(const Model *m, KVPool *p, const Step *st, int32_t *routing) {
    const ZayaConfig *f = &m->cfg;
    const Weights *w = &m->w;
    DecodeScratch *s = &p->s;
    const int N = st->N, D = f->hidden_size;
    model_embed(w, s->x, s->tokens, N, D);
    const float *r_prev = NULL;
    /* residual merges fused with the RMSNorm reading their output, as in model_forward */
    rmsnorm_forward(s->u, s->rstd, s->x, w->layers[0].input_norm, N, D, f->rms_norm_eps);
    for (int l = 0; l < f->num_layers; l++) {
        const LayerWeights *W = &w->layers[l];
        if (f->attention == ZY_ATTN_CCA)
            cca_decode(f, W, p, st, l);
        else
            mha_decode(f, W, p, st, l);
        merge_rmsnorm_forward(s->x_mid, s->u, s->rstd, s->proj, s->x, W->attn_hs, W->attn_hb, W->attn_rs, W->attn_rb,
                              W->post_norm, N, D, f->rms_norm_eps);
        float *z = s->z[l & 1];
        moe_decode(f, W, s, z, r_prev, N);
        if (l + 1 < f->num_layers)
            merge_rmsnorm_forward(s->x, s->u, s->rstd, s->moe.moe_out, s->x_mid, W->mlp_hs, W->mlp_hb, W->mlp_rs,
                                  W->mlp_rb, w->layers[l + 1].input_norm, N, D, f->rms_norm_eps);
        else
            residual_merge_forward(s->x, s->moe.moe_out, s->x_mid, W->mlp_hs, W->mlp_hb, W->mlp_rs, W->mlp_rb, N, D);
        r_prev = z;
        if (routing) memcpy(routing + (size_t)l * N, s->moe.choice, (size_t)N * sizeof(int32_t));
    }
    for (int i = 0; i < st->n_seqs; i++) p->blocks.len[st->seq[i].slot] += st->seq[i].n;
}

/* Lays the step out: rows and convolution-buffer rows per sequence. */
static void plan_step(const KVPool *p, Step *st) {
    const int P = p->conv_pad;
    int row = 0, xe = 0;
    for (int i = 0; i < st->n_seqs; i++) {
        StepSeq *q = &st->seq[i];
        q->pos0 = p->blocks.len[q->slot];
        q->row0 = row;
        q->xe_row = xe;
        row += q->n;
        xe += P + q->n;
    }
    st->N = row;
}

/* The final RMSNorm and lm_head for `count` rows of s->x picked by rows[]: logits [count, V]. */
static void logits_rows(const Model *m, KVPool *p, const int *rows, int count, float *logits) {
    const ZayaConfig *f = &m->cfg;
    DecodeScratch *s = &p->s;
    const int D = f->hidden_size;
    for (int i = 0; i < count; i++)
        memcpy(s->last_rows + (size_t)i * D, s->x + (size_t)rows[i] * D, (size_t)D * sizeof(float));
    rmsnorm_forward(s->u, s->rstd, s->last_rows, m->w.final_norm, count, D, f->rms_norm_eps);
    zy_matmul_wt(count, f->vocab_size, D, s->u, D, WEIGHT_VIEWS(m->w.lm_head), logits, f->vocab_size);
}

static int check_model(const Model *m, const ZayaConfig *cc, ZyErr *err) {
    const ZayaConfig *f = &m->cfg;
    if (f->num_layers != cc->num_layers || f->hidden_size != cc->hidden_size || f->num_heads != cc->num_heads ||
        f->num_kv_heads != cc->num_kv_heads || f->head_dim != cc->head_dim || f->cca_time0 != cc->cca_time0 ||
        f->cca_time1 != cc->cca_time1 || f->num_experts != cc->num_experts ||
        f->router_hidden_size != cc->router_hidden_size || f->moe_intermediate_size != cc->moe_intermediate_size ||
        f->rope_theta != cc->rope_theta || f->partial_rotary_factor != cc->partial_rotary_factor ||
        f->attention != cc->attention || f->router != cc->router || f->moe != cc->moe ||
        f->no_residual_scaling != cc->no_residual_scaling || f->sliding_window != cc->sliding_window ||
        f->rope_theta_sliding != cc->rope_theta_sliding ||
        f->partial_rotary_factor_sliding != cc->partial_rotary_factor_sliding ||
        memcmp(f->sliding_layers, cc->sliding_layers, sizeof f->sliding_layers) != 0)
        return zy_fail(err, "decode: the KV cache was built for another model shape");
    return 0;
}

int decode_step_check(const DecodeStepShape *p, const DecodeSeq *seqs, int n_seqs, const int32_t *tokens, int *rows,
                      int *n_logits, ZyErr *err) {
    if (n_seqs <= 0 || n_seqs > p->blocks->max_seqs)
        return zy_fail(err, "decode: %d sequences in a step (1..%d)", n_seqs, p->blocks->max_seqs);
    int N = 0, k = 0;
    for (int i = 0; i < n_seqs; i++) {
        const DecodeSeq *d = &seqs[i];
        if (d->slot < 0 || d->slot >= p->blocks->max_seqs) return zy_fail(err, "decode: slot %d out of range", d->slot);
        for (int j = 0; j < i; j++)
            if (seqs[j].slot == d->slot) return zy_fail(err, "decode: slot %d appears twice in one step", d->slot);
        if (d->n <= 0 || d->n > p->chunk)
            return zy_fail(err, "decode: %d new tokens for slot %d (1..%d)", d->n, d->slot, p->chunk);
        if (d->logits == DECODE_LOGITS_ALL && d->n > 1 && !p->all_logits)
            return zy_fail(err, "decode: every row's logits (slot %d) are not available on this pool: one row at a "
                           "time", d->slot);
        const int len = p->blocks->len[d->slot];
        if (d->n > p->max_len - len)
            return zy_fail(err, "decode: KV cache full (%d + %d tokens > max_len %d)", len, d->n, p->max_len);
        const int need = kvblocks_for(p->blocks, len + d->n);
        if (need > p->blocks->n_held[d->slot])
            return zy_fail(err, "decode: slot %d holds %d blocks, %d + %d tokens need %d", d->slot, p->blocks->n_held[d->slot],
                           len, d->n, need);
        N += d->n;
        k += d->logits == DECODE_LOGITS_ALL ? d->n : d->logits != 0;
    }
    if (N > p->max_rows) return zy_fail(err, "decode: %d rows in one step (at most %d)", N, p->max_rows);
    for (int i = 0; i < N; i++)
        if (tokens[i] < 0 || tokens[i] >= p->vocab_size)
            return zy_fail(err, "decode: token id %d (row %d) is outside the vocabulary [0, %d)", tokens[i], i,
                           p->vocab_size);
    *rows = N;
    if (n_logits) *n_logits = k;
    return 0;
}

int model_decode_step(const Model *m, KVPool *p, const DecodeSeq *seqs, int n_seqs, const int32_t *tokens,
                      float *logits, ZyErr *err) {
    if (check_model(m, &p->cfg, err)) return -1;
    const DecodeStepShape shape = {.blocks = &p->blocks, .chunk = p->chunk, .max_len = p->max_len,
                                   .max_rows = p->max_rows, .vocab_size = m->cfg.vocab_size, .all_logits = 1};
    int N, n_logits;
    if (decode_step_check(&shape, seqs, n_seqs, tokens, &N, &n_logits, err)) return -1;
    StepSeq seq[n_seqs];
    for (int i = 0; i < n_seqs; i++) seq[i] = (StepSeq){.slot = seqs[i].slot, .n = seqs[i].n};
    Step st = {.seq = seq, .n_seqs = n_seqs};
    plan_step(p, &st);
    memcpy(p->s.tokens, tokens, (size_t)N * sizeof(int32_t));
    decode_rows(m, p, &st, NULL);
    if (!logits || !n_logits) return 0;
    int rows[n_logits], k = 0;
    memset(rows, 0, sizeof rows); /* every entry is set below; gcc cannot see that n_logits counts them */
    for (int i = 0; i < n_seqs; i++)
        for (int r = seqs[i].logits == DECODE_LOGITS_ALL ? 0 : seqs[i].n - 1; seqs[i].logits && r < seqs[i].n; r++)
            rows[k++] = seq[i].row0 + r;
    /* logits of the wanted rows land packed, then move to their sequences' places (back to front: a place is never
     * before the packed rows it receives, nor inside those of an earlier sequence) */
    logits_rows(m, p, rows, k, logits);
    const size_t V = m->cfg.vocab_size;
    size_t place = 0;
    for (int i = 0; i < n_seqs; i++) place += seqs[i].logits == DECODE_LOGITS_ALL ? seqs[i].n : 1;
    for (int i = n_seqs - 1; i >= 0 && k > 0; i--) {
        const int m_rows = seqs[i].logits == DECODE_LOGITS_ALL ? seqs[i].n : 1;
        place -= m_rows;
        if (!seqs[i].logits) continue;
        k -= m_rows;
        if ((size_t)k != place) memmove(logits + place * V, logits + (size_t)k * V, m_rows * V * sizeof(float));
    }
    return 0;
}

/* ---- the same-length cache: one block per sequence ------------------------------------------------------------- */

int kv_dtype_resolve(const char *value, int weights_narrow, const char *flag, ZyErr *err) {
    if (!strcmp(value, "auto")) return weights_narrow != 0;
    if (!strcmp(value, "f32") || !strcmp(value, "fp32")) return 0;
    if (!strcmp(value, "bf16")) return 1;
    return zy_fail(err, "%s: '%s' is not a KV-cache dtype (auto, f32 or bf16)", flag, value);
}

int kvcache_create_ex(KVCache *c, const ZayaConfig *cfg, int batch, int max_len, int chunk, ZyErr *err) {
    return kvcache_create_kv(c, cfg, batch, max_len, chunk, 0, err);
}

int kvcache_create_kv(KVCache *c, const ZayaConfig *cfg, int batch, int max_len, int chunk, int kv_bf16, ZyErr *err) {
    memset(c, 0, sizeof *c);
    if (batch <= 0 || max_len <= 0 || chunk <= 0)
        return zy_fail(err, "KV cache: batch %d, max_len %d and chunk %d must be positive", batch, max_len, chunk);
    if (kvpool_create(&c->pool, cfg, batch, max_len, batch, max_len, batch * (chunk < max_len ? chunk : max_len),
                      chunk, kv_bf16, err))
        return -1;
    c->cfg = *cfg;
    c->batch = batch;
    c->max_len = max_len;
    c->chunk = c->pool.chunk;
    c->cache_bytes = c->pool.cache_bytes;
    c->mark_state = malloc((size_t)batch * kvpool_state_bytes(cfg) + 1);
    if (!c->mark_state) {
        kvcache_free(c);
        return zy_fail(err, "out of memory");
    }
    for (int b = 0; b < batch; b++) kvpool_reserve(&c->pool, b, max_len); /* sequence b holds block b */
    kvcache_reset(c);
    return 0;
}

int kvcache_create(KVCache *c, const ZayaConfig *cfg, int batch, int max_len, ZyErr *err) {
    return kvcache_create_ex(c, cfg, batch, max_len, KV_DEFAULT_CHUNK, err);
}

void kvcache_reset(KVCache *c) {
    for (int b = 0; b < c->batch; b++) kvpool_seq_reset(&c->pool, b);
    c->len = 0;
    kvcache_mark(c);
}

/* The per-sequence state of every layer, in or out of the mark buffer. */
static void copy_state(KVCache *c, int save) {
    const KVPool *p = &c->pool;
    const size_t B = c->batch, P = p->conv_pad, C = cfg_conv_channels(&c->cfg), half = cfg_k_channels(&c->cfg) / 2;
    float *m = c->mark_state;
    for (int l = 0; l < c->cfg.num_layers; l++) {
        float *conv = p->conv_state[l], *vd = p->vd_prev[l];
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
    for (int b = 0; b < c->batch; b++) c->pool.blocks.len[b] = c->len;
}

void kvcache_free(KVCache *c) {
    kvpool_free(&c->pool);
    free(c->mark_state);
    memset(c, 0, sizeof *c);
}

int model_decode_ex(const Model *m, KVCache *c, const int32_t *tokens, int n, float *logits, int last_only,
                    int32_t *routing, ZyErr *err) {
    KVPool *p = &c->pool;
    if (check_model(m, &c->cfg, err)) return -1;
    if (n <= 0) return zy_fail(err, "decode: %d new tokens (must be at least 1)", n);
    if (n > c->max_len - c->len)
        return zy_fail(err, "decode: KV cache full (%d + %d tokens > max_len %d)", c->len, n, c->max_len);
    const int B = c->batch, L = m->cfg.num_layers, D = m->cfg.hidden_size;
    const size_t V = m->cfg.vocab_size;
    for (long i = 0; i < (long)B * n; i++)
        if (tokens[i] < 0 || tokens[i] >= m->cfg.vocab_size)
            return zy_fail(err, "decode: token id %d at [%ld, %ld] is outside the vocabulary [0, %d)", tokens[i], i / n,
                           i % n, m->cfg.vocab_size);
    StepSeq seq[B];
    int32_t *route_rows = NULL;
    if (routing && !(route_rows = malloc((size_t)L * B * c->chunk * sizeof *route_rows)))
        return zy_fail(err, "out of memory");
    for (int t0 = 0; t0 < n; t0 += c->chunk) {
        const int k = n - t0 < c->chunk ? n - t0 : c->chunk, final = t0 + k == n;
        for (int b = 0; b < B; b++) {
            seq[b] = (StepSeq){.slot = b, .n = k};
            memcpy(p->s.tokens + (size_t)b * k, tokens + (size_t)b * n + t0, (size_t)k * sizeof(int32_t));
        }
        Step st = {.seq = seq, .n_seqs = B};
        plan_step(p, &st);
        decode_rows(m, p, &st, route_rows);
        c->len += k;
        if (routing)
            for (int l = 0; l < L; l++)
                for (int b = 0; b < B; b++)
                    memcpy(routing + ((size_t)l * B + b) * n + t0, route_rows + (size_t)l * st.N + (size_t)b * k,
                           (size_t)k * sizeof(int32_t));
        if (!logits) continue;
        if (last_only) { /* only the final piece produces logits */
            if (!final) continue;
            int rows[B];
            for (int b = 0; b < B; b++) rows[b] = b * k + k - 1;
            logits_rows(m, p, rows, B, logits);
            continue;
        }
        DecodeScratch *s = &p->s;
        rmsnorm_forward(s->u, s->rstd, s->x, m->w.final_norm, st.N, D, m->cfg.rms_norm_eps);
        for (int b = 0; b < B; b++)
            zy_matmul_wt(k, (int)V, D, s->u + (size_t)b * k * D, D, WEIGHT_VIEWS(m->w.lm_head),
                         logits + ((size_t)b * n + t0) * V, (int)V);
    }
    free(route_rows);
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
static void cpu_reset(void *x) { kvcache_reset(((CpuDecode *)x)->c); }
static int cpu_decode(void *x, const int32_t *tokens, int n, float *logits, ZyErr *err) {
    CpuDecode *d = x;
    return model_decode(d->m, d->c, tokens, n, logits, 1, err);
}
static int cpu_decode_all(void *x, const int32_t *tokens, int n, float *logits, ZyErr *err) {
    CpuDecode *d = x;
    return model_decode(d->m, d->c, tokens, n, logits, 0, err);
}
static int cpu_len(void *x) { return ((CpuDecode *)x)->c->len; }
static void cpu_mark(void *x) { kvcache_mark(((CpuDecode *)x)->c); }
static void cpu_rewind(void *x) { kvcache_rewind(((CpuDecode *)x)->c); }

DecodeBackend decode_backend_cpu(CpuDecode *d, const Model *m, KVCache *c) {
    d->m = m, d->c = c;
    return (DecodeBackend){.ctx = d, .reset = cpu_reset, .decode = cpu_decode, .len = cpu_len,
                           .decode_all = cpu_decode_all, .mark = cpu_mark, .rewind = cpu_rewind,
                           .batch = c->batch, .max_len = c->max_len, .vocab_size = m->cfg.vocab_size};
}

int generate(const Model *m, KVCache *c, Sampler *s, const SamplingParams *p, ZyRng *rng, const int32_t *prompt,
             int n_prompt, int max_new, const int32_t *stop_ids, int n_stop, GenerateTokenFn fn, void *ctx,
             GenerateStats *st, ZyErr *err) {
    CpuDecode d;
    const DecodeBackend be = decode_backend_cpu(&d, m, c);
    return generate_with(&be, s, p, rng, prompt, n_prompt, max_new, stop_ids, n_stop, fn, ctx, st, err);
}
