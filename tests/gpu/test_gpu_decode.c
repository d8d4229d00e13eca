/* Cached decoding on the GPU (gpu_decode.c): logits of a prefill plus token-by-token steps against the GPU's full
 * forward (recompute) and against the CPU's cached decoding, for ZAYA1 and the research variants, several sequences
 * at once and inputs split into pieces; greedy generation equal to the CPU's. fp32 throughout, but for the bf16 KV
 * cache's cases (k̂ / v in bf16 on both devices). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "infer/decode.h"
#include "infer/prefix_cache.h"
#include "gpu/gpu.h"
#include "gpu/gpu_decode.h"
#include "gpu/gpu_model.h"
#include "gpu_test.h"
#include "kernels/kernels.h"
#include "model/model.h"

/* B sequences of T tokens: the GPU's full forward, the GPU cache (prefill of n0 tokens in pieces of `chunk`, then one
 * token at a time), the CPU cache the same way; every position's logits compared. */
static void compare_decode_kv(GpuTest *t, const char *label, const ZayaConfig *cfg, int B, int T, int n0, int chunk,
                              int kv_bf16, double tol);
static void compare_decode(GpuTest *t, const char *label, const ZayaConfig *cfg, int B, int T, int n0, int chunk) {
    compare_decode_kv(t, label, cfg, B, T, n0, chunk, 0, 1e-4);
}
/* kv_bf16: both caches hold k̂ / v in bf16 (--kv-dtype bf16), compared with each other within tol; the recompute
 * (fp32 attention) then differs by the rounding and is held to 2e-2. */
static void compare_decode_kv(GpuTest *t, const char *label, const ZayaConfig *cfg, int B, int T, int n0, int chunk,
                              int kv_bf16, double tol) {
    Model m;
    ZyErr err = {{0}};
    char name[200];
    if (gt_random_model(t, &m, cfg, label)) return;
    const int V = cfg->vocab_size;
    const size_t NV = (size_t)B * T * V;
    int32_t *tokens = gt_rand_int(t, (size_t)B * T, 0, V);
    float *full = gt_host(t, NV), *cached = gt_host(t, NV), *cpu = gt_host(t, NV);
    GpuModel *gm = NULL;
    GpuKVCache *gc = NULL;
    KVCache cc;
    int have_cc = 0;
    int ok = gpu_model_create(&gm, &m, -1, B, T, 0, 0, &err) == 0 && gpu_model_forward(gm, tokens, &err) == 0 &&
             gpu_model_logits(gm, full, &err) == 0 && gpu_kvcache_create_kv(&gc, gm, B, T, chunk, kv_bf16, &err) == 0;
    ok = ok && (have_cc = kvcache_create_kv(&cc, cfg, B, T, chunk, kv_bf16, &err) == 0);
    int32_t *piece = malloc((size_t)B * T * sizeof *piece);
    float *step = malloc((size_t)B * V * sizeof *step);
    /* prefill: tokens [:, :n0]; then one token per step; logits land at [b, pos] */
    for (int pos = 0; ok && pos < T;) {
        const int n = pos == 0 ? n0 : 1;
        for (int b = 0; b < B; b++) memcpy(piece + (size_t)b * n, tokens + (size_t)b * T + pos, n * sizeof(int32_t));
        float *lg = malloc((size_t)B * n * V * sizeof *lg), *lc = malloc((size_t)B * n * V * sizeof *lc);
        ok = lg && lc && gpu_model_decode(gm, gc, piece, n, lg, 0, &err) == 0 &&
             model_decode(&m, &cc, piece, n, lc, 0, &err) == 0;
        for (int b = 0; ok && b < B; b++) {
            memcpy(cached + ((size_t)b * T + pos) * V, lg + (size_t)b * n * V, (size_t)n * V * sizeof(float));
            memcpy(cpu + ((size_t)b * T + pos) * V, lc + (size_t)b * n * V, (size_t)n * V * sizeof(float));
        }
        free(lg), free(lc);
        pos += n;
    }
    snprintf(name, sizeof name, "%s: decode ran", label);
    if (gt_assert(t, ok, name, "%s", ok ? "prefill + steps" : err.msg)) {
        snprintf(name, sizeof name, "%s: cached vs GPU recompute", label);
        double e = gt_rel_err(cached, full, NV);
        const double tol_full = kv_bf16 ? 2e-2 : 1e-4;
        gt_assert(t, e <= tol_full && (!kv_bf16 || e > 0), name, "rel err %.2e (tol %.0e%s)", e, tol_full,
                  kv_bf16 ? ", and > 0: the cache rounds" : "");
        snprintf(name, sizeof name, "%s: GPU cached vs CPU cached", label);
        e = gt_rel_err(cached, cpu, NV);
        gt_assert(t, e <= tol, name, "rel err %.2e (tol %.0e)", e, tol);
        /* last_only gives the last position's row, and a full cache is an error that changes nothing */
        gpu_kvcache_reset(gc);
        int rc = gpu_model_decode(gm, gc, tokens, 1, step, 1, &err);
        int32_t extra[64] = {0};
        for (int k = 1; rc == 0 && k < T; k++) rc = gpu_model_decode(gm, gc, tokens, 1, NULL, 1, &err);
        int full_rc = gpu_model_decode(gm, gc, extra, 1, step, 1, &err);
        snprintf(name, sizeof name, "%s: full cache refused", label);
        gt_assert(t, rc == 0 && full_rc != 0 && gpu_kvcache_len(gc) == T, name, "%s", err.msg);
        int bad_rc = 0;
        gpu_kvcache_reset(gc);
        int32_t bad[64];
        for (int b = 0; b < 64; b++) bad[b] = b == B - 1 ? V : 1;
        bad_rc = gpu_model_decode(gm, gc, bad, 1, step, 1, &err);
        snprintf(name, sizeof name, "%s: bad token id refused", label);
        gt_assert(t, bad_rc != 0 && gpu_kvcache_len(gc) == 0, name, "%s", err.msg);
    }
    free(piece), free(step);
    if (have_cc) kvcache_free(&cc);
    gpu_kvcache_free(gc);
    gpu_model_free(gm);
    model_free(&m);
    gt_reset(t);
}

/* A switch of how a decoding step runs, not what it computes: bf16 products (the few-row kernels) and the bf16 KV
 * cache, a prefill in pieces and then single-token steps of B sequences, give the same logits bit for bit either way.
 * - programmatic dependent launch (ZAYA_GPU_PDL, on by default where the GPU has it): a kernel that touched its
 *   predecessor's output before gk_pdl_enter() would race here;
 * - a one-token step's layers as one persistent kernel (ZAYA_GPU_DECODE_LAYER=persistent): its phases are the
 *   launches' bodies; a missing grid barrier between phases or layers would race here. */
typedef struct {
    int pdl, hopper;
    int layer_ready; /* the persistent layer switched on and its few-row products with it */
    long layer_runs; /* layers run as one persistent kernel */
} DecodeRun;
static int decode_logits(const Model *m, int B, int T, int n0, const int32_t *tokens, float *out, DecodeRun *run,
                         ZyErr *err) {
    const int V = m->cfg.vocab_size;
    GpuModel *gm = NULL;
    GpuKVCache *gc = NULL;
    int32_t *piece = malloc((size_t)B * T * sizeof *piece);
    int ok = piece && gpu_model_create(&gm, m, -1, B, T, 1, 0, err) == 0 &&
             gpu_kvcache_create_kv(&gc, gm, B, T, 5, 1, err) == 0;
    for (int pos = 0; ok && pos < T;) {
        const int n = pos == 0 ? n0 : 1;
        for (int b = 0; b < B; b++) memcpy(piece + (size_t)b * n, tokens + (size_t)b * T + pos, n * sizeof(int32_t));
        float *lg = malloc((size_t)B * n * V * sizeof *lg);
        ok = lg && gpu_model_decode(gm, gc, piece, n, lg, 0, err) == 0;
        for (int b = 0; ok && b < B; b++)
            memcpy(out + ((size_t)b * T + pos) * V, lg + (size_t)b * n * V, (size_t)n * V * sizeof(float));
        free(lg);
        pos += n;
    }
    /* after the launches: a refused programmatic launch turns itself off */
    if (ok) {
        run->pdl = gpu_model_programmatic_launch(gm), run->hopper = ((GpuCtx *)gpu_model_ctx(gm))->cc_major >= 9;
        run->layer_ready = gpu_model_decode_layer_persistent(gm);
        run->layer_runs = gpu_model_decode_layer_runs(gm);
    }
    free(piece);
    gpu_kvcache_free(gc);
    gpu_model_free(gm);
    return ok ? 0 : -1;
}
/* The logits with env=off_value and with env=on_value (NULL: unset), bit for bit; the runs, for the caller's checks. */
static int compare_switch(GpuTest *t, const char *label, const ZayaConfig *cfg, int B, int T, int n0, const char *env,
                          const char *off_value, const char *on_value, DecodeRun *off_run, DecodeRun *on_run) {
    Model m;
    ZyErr err = {{0}};
    char name[200];
    if (gt_random_model(t, &m, cfg, label)) return 0;
    const size_t NV = (size_t)B * T * cfg->vocab_size;
    int32_t *tokens = gt_rand_int(t, (size_t)B * T, 0, cfg->vocab_size);
    float *on = gt_host(t, NV), *off = gt_host(t, NV);
    *off_run = *on_run = (DecodeRun){0};
    GtEnv e = gt_env_set(env, off_value);
    int ok = decode_logits(&m, B, T, n0, tokens, off, off_run, &err) == 0;
    gt_env_restore(&e);
    e = gt_env_set(env, on_value);
    ok = ok && decode_logits(&m, B, T, n0, tokens, on, on_run, &err) == 0;
    gt_env_restore(&e);
    snprintf(name, sizeof name, "%s: the same logits with %s=%s and %s", label, env, off_value,
             on_value ? on_value : "unset");
    gt_assert(t, ok && memcmp(on, off, NV * sizeof(float)) == 0, name, "%s rel err %.2e", ok ? "" : err.msg,
              ok ? gt_rel_err(on, off, NV) : 0.0);
    model_free(&m);
    gt_reset(t);
    return ok;
}
static void compare_pdl(GpuTest *t, const char *label, const ZayaConfig *cfg, int B, int T, int n0) {
    DecodeRun off, on;
    const int ok = compare_switch(t, label, cfg, B, T, n0, "ZAYA_GPU_PDL", "off", NULL, &off, &on);
    char name[200];
    snprintf(name, sizeof name, "%s: programmatic launch %s", label, on.hopper ? "on (sm_90+), off when asked" : "off");
    gt_assert(t, ok && on.pdl == on.hopper && off.pdl == 0, name, "on %d, off %d", on.pdl, off.pdl);
}
/* persistent: whether the config's layers take the persistent kernel (bf16 CCA, MLP router, experts) when the run
 * allows it (not under ZAYA_GPU_FEW_ROWS=off, which it needs). */
static void compare_layer_kernel(GpuTest *t, const char *label, const ZayaConfig *cfg, int B, int T, int n0,
                                 int persistent) {
    DecodeRun off, on;
    const int ok = compare_switch(t, label, cfg, B, T, n0, "ZAYA_GPU_DECODE_LAYER", "launches", "persistent", &off,
                                  &on);
    char name[200];
    const long steps = T - n0, want = persistent && on.layer_ready ? steps * cfg->num_layers : 0;
    snprintf(name, sizeof name, "%s: %s", label,
             want ? "every one-token step's layers ran as the persistent kernel"
                  : persistent ? "the launches ran (ZAYA_GPU_FEW_ROWS=off: not taken)" : "the launches ran (not taken)");
    gt_assert(t, ok && on.layer_runs == want && off.layer_runs == 0, name, "%ld layers (want %ld), %ld with it off",
              on.layer_runs, want, off.layer_runs);
}

/* The persistent layer's grid barrier on its own (gpu_grid_sync_probe): 2,000 rounds over one block an SM, every block
 * seeing its neighbour's stamp of the round after the barrier (a block let through early, or a stale cached read,
 * counts). The time a barrier takes is printed, not checked. */
static void check_grid_barrier(GpuTest *t) {
    GpuModel *gm = NULL;
    ZyErr err = {{0}};
    ZayaConfig cfg = gt_small_config();
    Model m;
    double us = 0;
    long stale = -1;
    int blocks = 0;
    if (model_create(&m, &cfg, &err)) {
        gt_assert(t, 0, "grid barrier", "%s", err.msg);
        return;
    }
    const int ok = gpu_model_create(&gm, &m, -1, 1, 1, 1, 0, &err) == 0 &&
                   gpu_grid_sync_probe(gpu_model_ctx(gm), 2000, &us, &stale, &blocks, &err) == 0;
    if (gt_assert(t, ok && stale == 0, "grid barrier: 2,000 rounds over one block an SM, no stale stamp", "%s%ld stale",
                  ok ? "" : err.msg, stale))
        printf("    grid barrier: %.2f us over %d blocks\n", us, blocks);
    gpu_model_free(gm);
    model_free(&m);
    gt_reset(t);
}

/* Greedy generation on the GPU and on the CPU: the same tokens. */
static int collect(void *ctx, int32_t tok, ZyErr *err) {
    (void)err;
    int32_t *out = ctx;
    out[++out[0]] = tok;
    return 0;
}

static void compare_generate(GpuTest *t) {
    ZayaConfig cfg = gt_small_config();
    Model m;
    ZyErr err = {{0}};
    if (model_create(&m, &cfg, &err)) {
        gt_assert(t, 0, "generate", "%s", err.msg);
        return;
    }
    gt_randomise_model(t, &m);
    int32_t prompt[12], got_gpu[64] = {0}, got_cpu[64] = {0};
    for (int i = 0; i < 12; i++) prompt[i] = 3 + (int32_t)(zy_rng_next(&t->rng) % 90);
    Sampler s;
    KVCache cc;
    GpuModel *gm = NULL;
    GpuKVCache *gc = NULL;
    SamplingParams sp = {.temperature = 0, .top_k = 0, .top_p = 1};
    ZyRng rng;
    zy_rng_seed(&rng, 1);
    GenerateStats st;
    int ok = sampler_create(&s, cfg.vocab_size, &err) == 0 && kvcache_create(&cc, &cfg, 1, 64, &err) == 0 &&
             gpu_model_create(&gm, &m, -1, 1, 1, 0, 0, &err) == 0 && gpu_kvcache_create(&gc, gm, 1, 64, 0, &err) == 0;
    ok = ok && generate(&m, &cc, &s, &sp, &rng, prompt, 12, 40, NULL, 0, collect, got_cpu, &st, &err) == 0;
    ok = ok && gpu_generate(gm, gc, &s, &sp, &rng, prompt, 12, 40, NULL, 0, collect, got_gpu, &st, &err) == 0;
    if (gt_assert(t, ok, "greedy generation ran", "%s", ok ? "40 tokens each" : err.msg)) {
        int differ = 0;
        for (int i = 1; i <= 40; i++) differ += got_cpu[i] != got_gpu[i];
        gt_assert(t, got_gpu[0] == 40 && differ == 0, "greedy generation: GPU tokens equal the CPU's", "%d of 40 differ",
                  differ);
    }
    gpu_kvcache_free(gc);
    gpu_model_free(gm);
    kvcache_free(&cc);
    sampler_free(&s);
    model_free(&m);
    gt_reset(t);
}

/* ---- the ragged step over a block pool (gpu_model_decode_step) against the CPU's model_decode_step ------------- */

/* Both pools: the CPU's and the GPU's, built with the same sizes; and a prefix cache over each where asked. */
typedef struct {
    KVPool cpu;
    GpuKVPool *gpu;
    int have_cpu;
    PrefixCache pc_cpu, pc_gpu; /* .blocks NULL: none */
} PoolPair;

static int pair_create(PoolPair *pp, GpuModel *gm, const ZayaConfig *cfg, int S, int ML, int NB, int bt, int rows,
                       int chunk, int kv_bf16, ZyErr *err) {
    memset(pp, 0, sizeof *pp);
    if (kvpool_create(&pp->cpu, cfg, S, ML, NB, bt, rows, chunk, kv_bf16, err)) return -1;
    pp->have_cpu = 1;
    return gpu_kvpool_create_kv(&pp->gpu, gm, S, ML, NB, bt, rows, chunk, kv_bf16, err);
}
static int gpu_share(void *pool, int slot, const int32_t *blocks, int n) {
    return gpu_kvpool_seq_share(pool, slot, blocks, n);
}
static int pair_prefix_caches(PoolPair *pp, ZyErr *err) {
    return prefix_cache_init_kvpool(&pp->pc_cpu, &pp->cpu, err) || gpu_kvpool_keep_block_states(pp->gpu, err) ||
           prefix_cache_init(&pp->pc_gpu, gpu_kvpool_blocks(pp->gpu), gpu_share, pp->gpu, err);
}
static void pair_free(PoolPair *pp) {
    prefix_cache_free(&pp->pc_cpu);
    prefix_cache_free(&pp->pc_gpu);
    gpu_kvpool_free(pp->gpu);
    if (pp->have_cpu) kvpool_free(&pp->cpu);
}
/* The host bookkeeping agrees: every slot's length and the free blocks. */
static int pair_same(const PoolPair *pp) {
    int same = gpu_kvpool_free_blocks(pp->gpu) == pp->cpu.blocks.n_free;
    for (int s = 0; s < pp->cpu.blocks.max_seqs; s++) same &= gpu_kvpool_len(pp->gpu, s) == pp->cpu.blocks.len[s];
    return same;
}

/* One request of a schedule: its tokens (prompt, then the ones fed back as if generated), where it stands. */
typedef struct {
    int arrive, n_prompt, n_total, fed, slot, state; /* state 0 waiting, 1 running, 2 done */
    int32_t *tok;
} Req;

typedef struct {
    int S, ML, NB, bt, rows, chunk; /* the pools */
    int n_req, max_prompt, max_gen;  /* the schedule */
    int kv_bf16;                     /* both pools hold k̂ / v in bf16 */
    int prefix;                      /* prompts start with the first's first `prefix` tokens; prefix caches on both */
    int graphs, persistent; /* steps as CUDA graphs / one-token layers as one kernel, where the run allows them */
} PoolCase;

/* A server's life on both pools in lockstep: requests arrive over time, join when a slot and the blocks for their
 * whole length are free, prefill in chunks next to single-token decode rows, leave when done (their blocks reused
 * by later ones); each step's sequences in a shuffled order; logits wanted at each prefill's end, for about two
 * decode rows in three and a few mid-prefill chunks. Every wanted row is compared, the bookkeeping after each step,
 * and once mid-way malformed steps are refused by both with the same words, changing nothing. bf16: the GPU takes
 * bf16 products; its rows are held to `tol` in bulk instead of each. With pc->prefix, the prompts share a start and
 * each pool has a prefix cache, used as serve_engine.c uses it: a joining request takes the cached blocks its
 * prompt starts with (and their kept state) and prefills the rest, each step's filled blocks are cached, and a
 * request short of blocks evicts idle cached ones; both caches must decide alike. */
static void compare_pool(GpuTest *t, const char *label, const ZayaConfig *cfg, const PoolCase *pc, int bf16,
                         double tol) {
    Model m;
    ZyErr err = {{0}}, cerr = {{0}};
    char name[240];
    if (gt_random_model(t, &m, cfg, label)) return;
    /* the case's switches, read when the model and the pool are created; otherwise the run's own */
    GtEnv graphs_env = {0}, layer_env = {0};
    if (pc->graphs) graphs_env = gt_env_set("ZAYA_GPU_GRAPHS", "1");
    if (pc->persistent) layer_env = gt_env_set("ZAYA_GPU_DECODE_LAYER", "persistent");
    const int V = cfg->vocab_size, S = pc->S;
    Req *rq = calloc(pc->n_req, sizeof *rq);
    long total = 0;
    for (int r = 0; r < pc->n_req; r++) {
        Req *q = &rq[r];
        q->arrive = 2 * r;
        q->n_prompt = 1 + (int)(zy_rng_next(&t->rng) % pc->max_prompt);
        q->n_total = q->n_prompt + 1 + (int)(zy_rng_next(&t->rng) % pc->max_gen);
        if (q->n_total > pc->ML) q->n_total = pc->ML;
        if (q->n_prompt > q->n_total) q->n_prompt = q->n_total;
        q->tok = gt_rand_int(t, q->n_total, 0, V);
        int shared = pc->prefix < q->n_total ? pc->prefix : q->n_total; /* the first's start, where both have it */
        shared = shared < rq[0].n_total ? shared : rq[0].n_total;
        if (r > 0 && q->tok && rq[0].tok) memcpy(q->tok, rq[0].tok, sizeof(int32_t) * (size_t)shared);
        q->slot = -1;
        total += q->n_total;
    }
    float *want_cpu = gt_host(t, (size_t)total * V), *want_gpu = gt_host(t, (size_t)total * V);
    float *lc = gt_host(t, (size_t)(S + pc->chunk) * V), *lg = gt_host(t, (size_t)(S + pc->chunk) * V);
    int32_t *tokens = malloc(sizeof(int32_t) * (pc->rows + pc->chunk + 2));
    DecodeSeq *seqs = malloc(sizeof *seqs * (S + 1));
    Req **who = malloc(sizeof *who * (S + 1));
    Req **running = calloc(S, sizeof *running);
    GpuModel *gm = NULL;
    PoolPair pp = {0};
    int ok = tokens && seqs && who && running && rq && gpu_model_create(&gm, &m, -1, 1, 1, bf16, 0, &err) == 0 &&
             pair_create(&pp, gm, cfg, S, pc->ML, pc->NB, pc->bt, pc->rows, pc->chunk, pc->kv_bf16, &err) == 0 &&
             (!pc->prefix || pair_prefix_caches(&pp, &err) == 0);
    long n_rows = 0, reused_tokens = 0, all_rows = 0;
    int steps = 0, done = 0, max_batch = 0, mixed = 0, agree = 1, refusals_ok = -1, rows_over = 0;
    double worst = 0;
    /* with prefix caches: every block's kept state against the CPU pool's after each step, block by block, so that a
     * state kept at the wrong row or into the wrong block shows even when no later prompt reads it */
    const size_t state_floats = kvpool_state_bytes(cfg) / sizeof(float);
    float *states = pc->prefix ? gt_host(t, (size_t)pc->NB * state_floats) : NULL;
    long state_checks = 0, states_over = 0, states_kept = 0;
    double state_worst = 0;
    for (; ok && done < pc->n_req && steps < 2000; steps++) {
        /* join: FIFO, each holding blocks for its whole length */
        for (int r = 0; r < pc->n_req; r++) {
            Req *q = &rq[r];
            if (q->state != 0 || q->arrive > steps) continue;
            int slot = 0;
            while (slot < S && running[slot]) slot++;
            if (slot == S) break;
            int reused = 0, rc, rg;
            if (pc->prefix) { /* never the last prompt token: its logits are wanted */
                reused = prefix_cache_attach(&pp.pc_cpu, slot, q->tok, q->n_prompt - 1);
                agree &= prefix_cache_attach(&pp.pc_gpu, slot, q->tok, q->n_prompt - 1) == reused;
            }
            for (;;) {
                rc = kvpool_reserve(&pp.cpu, slot, q->n_total), rg = gpu_kvpool_reserve(pp.gpu, slot, q->n_total);
                agree &= rc == rg;
                if (!rc || !pc->prefix || !prefix_cache_evict(&pp.pc_cpu)) break;
                agree &= prefix_cache_evict(&pp.pc_gpu) == 1; /* blocks no request holds go back first */
            }
            if (rc) {
                if (reused) kvpool_seq_release(&pp.cpu, slot), gpu_kvpool_seq_release(pp.gpu, slot);
                break;
            }
            if (!reused) kvpool_seq_reset(&pp.cpu, slot), gpu_kvpool_seq_reset(pp.gpu, slot);
            reused_tokens += reused;
            q->state = 1, q->slot = slot, q->fed = reused, running[slot] = q;
        }
        /* the step: decode rows first, then prefill chunks while rows are left (as serve_engine.c), then shuffled */
        int n = 0, rows = 0, every_row = 0;
        for (int sl = 0; sl < S; sl++) {
            Req *q = running[sl];
            if (!q || q->fed < q->n_prompt) continue;
            seqs[n] = (DecodeSeq){.slot = sl, .n = 1, .logits = zy_rng_next(&t->rng) % 3 != 0};
            who[n++] = q;
            rows++;
        }
        for (int sl = 0; sl < S && rows < pc->rows; sl++) {
            Req *q = running[sl];
            if (!q || q->fed >= q->n_prompt) continue;
            int k = q->n_prompt - q->fed;
            k = k < pc->chunk ? k : pc->chunk;
            k = k < pc->rows - rows ? k : pc->rows - rows;
            /* every row's logits for about one chunk in eight (an echo), one such chunk a step (as the engine's logits
             * buffer allows: a row a sequence and a chunk's) */
            const uint64_t dice = zy_rng_next(&t->rng) % 8;
            const int all = !every_row && (dice == 0 || (q == rq && q->fed == 0)); /* the first prompt's first, always */
            every_row += all;
            seqs[n] = (DecodeSeq){.slot = sl, .n = k,
                                  .logits = all ? DECODE_LOGITS_ALL : q->fed + k == q->n_prompt || dice < 3};
            who[n++] = q;
            rows += k;
        }
        if (n == 0) continue; /* waiting for arrivals */
        for (int i = n - 1; i > 0; i--) {
            const int j = (int)(zy_rng_next(&t->rng) % (uint64_t)(i + 1));
            DecodeSeq d = seqs[i];
            Req *w = who[i];
            seqs[i] = seqs[j], who[i] = who[j];
            seqs[j] = d, who[j] = w;
        }
        int has1 = 0, hasn = 0;
        for (int i = 0, row = 0; i < n; i++) {
            memcpy(tokens + row, who[i]->tok + who[i]->fed, sizeof(int32_t) * seqs[i].n);
            row += seqs[i].n;
            has1 |= seqs[i].n == 1, hasn |= seqs[i].n > 1;
        }
        max_batch = n > max_batch ? n : max_batch;
        mixed += has1 && hasn;
        /* once, with a few sequences under way: malformed steps, refused alike, nothing changed */
        if (refusals_ok < 0 && n >= 2 && steps >= 6) {
            refusals_ok = 1;
            DecodeSeq *bad = malloc(sizeof *bad * (S + 1));
            int32_t *btok = malloc(sizeof *btok * rows);
            if (!bad || !btok) {
                free(bad), free(btok);
                ok = 0;
                break;
            }
            memcpy(btok, tokens, sizeof(int32_t) * rows);
            for (int k = 0; k < 3; k++) {
                memcpy(bad, seqs, sizeof *seqs * n);
                int nb = n;
                if (k == 0) bad[nb++] = (DecodeSeq){.slot = S, .n = 1}; /* a slot out of range */
                if (k == 1) bad[1].slot = bad[0].slot;                  /* one slot twice */
                if (k == 2) btok[rows - 1] = V;                         /* a token outside the vocabulary */
                const int rc = model_decode_step(&m, &pp.cpu, bad, nb, btok, lc, &cerr);
                const int rg = gpu_model_decode_step(gm, pp.gpu, bad, nb, btok, lg, &err);
                refusals_ok &= rc == -1 && rg == -1 && strcmp(cerr.msg, err.msg) == 0 && pair_same(&pp);
                if (rc != -1 || rg != -1 || strcmp(cerr.msg, err.msg))
                    fprintf(stderr, "    refusal %d: cpu %d \"%s\", gpu %d \"%s\"\n", k, rc, cerr.msg, rg, err.msg);
            }
            free(bad), free(btok);
        }
        const int rc = model_decode_step(&m, &pp.cpu, seqs, n, tokens, lc, &cerr);
        const int rg = gpu_model_decode_step(gm, pp.gpu, seqs, n, tokens, lg, &err);
        if (rc || rg) {
            ok = 0;
            if (rc) err = cerr;
            break;
        }
        for (int i = 0, place = 0; i < n; i++) { /* every row's logits take n places, any other sequence's one */
            const int rows = seqs[i].logits == DECODE_LOGITS_ALL ? seqs[i].n : seqs[i].logits != 0;
            for (int r = 0; r < rows; r++) {
                const size_t at = (size_t)(place + r) * V;
                const double e = gt_rel_err(lg + at, lc + at, V);
                worst = e > worst ? e : worst;
                rows_over += e > tol;
                memcpy(want_cpu + (size_t)n_rows * V, lc + at, sizeof(float) * V);
                memcpy(want_gpu + (size_t)n_rows * V, lg + at, sizeof(float) * V);
                n_rows++;
                all_rows += seqs[i].logits == DECODE_LOGITS_ALL;
            }
            place += seqs[i].logits == DECODE_LOGITS_ALL ? seqs[i].n : 1;
        }
        /* the blocks the step filled join the caches; leave: blocks back to the pool */
        for (int i = 0; i < n; i++) {
            Req *q = who[i];
            q->fed += seqs[i].n;
            if (pc->prefix) {
                prefix_cache_insert(&pp.pc_cpu, q->slot, q->tok, q->n_total, NULL, q->fed);
                prefix_cache_insert(&pp.pc_gpu, q->slot, q->tok, q->n_total, NULL, q->fed);
            }
            if (q->fed < q->n_total) continue;
            kvpool_seq_release(&pp.cpu, q->slot);
            gpu_kvpool_seq_release(pp.gpu, q->slot);
            running[q->slot] = NULL;
            q->state = 2;
            done++;
        }
        agree &= pair_same(&pp);
        if (pc->prefix && ok) {
            if (!states || gpu_kvpool_download_block_states(pp.gpu, states, &err)) {
                ok = 0;
                break;
            }
            for (int b = 0; b < pc->NB; b++, state_checks++) {
                const float *want = pp.cpu.block_state + (size_t)b * state_floats;
                const double e = gt_rel_err(states + (size_t)b * state_floats, want, state_floats);
                state_worst = e > state_worst ? e : state_worst;
                states_over += e > tol;
                int kept = 0;
                for (size_t i = 0; i < state_floats && !kept; i++) kept = want[i] != 0;
                states_kept += kept;
            }
        }
    }
    snprintf(name, sizeof name, "%s: schedule ran", label);
    if (gt_assert(t, ok && done == pc->n_req, name, "%s",
                  ok ? (done == pc->n_req ? "" : "requests left unfinished") : err.msg)) {
        printf("    %s: %d requests, %d steps (at most %d sequences, %d mixing prefill and decode), %ld logit rows, "
               "worst row %.2e\n", label, pc->n_req, steps, max_batch, mixed, n_rows, worst);
        snprintf(name, sizeof name, "%s: the schedule mixes joins, prefill chunks and decode rows, and chunks that "
                 "want every row's logits", label);
        gt_assert(t, mixed > 0 && max_batch >= 2 && n_rows > 0 && all_rows > 0, name,
                  "%d mixed steps, batch <= %d, %ld rows of every-row chunks", mixed, max_batch, all_rows);
        snprintf(name, sizeof name, "%s: lengths and free blocks equal the CPU pool's after every step", label);
        gt_assert(t, agree, name, "%s", agree ? "" : "bookkeeping differs");
        if (pc->prefix) {
            const PrefixCacheStats a = prefix_cache_stats(&pp.pc_cpu), b = prefix_cache_stats(&pp.pc_gpu);
            snprintf(name, sizeof name, "%s: prompts took cached blocks, as on the CPU", label);
            gt_assert(t, reused_tokens > 0 && a.cached == b.cached && a.evictions == b.evictions, name,
                      "%ld tokens reused; cached %d / %d, evicted %llu / %llu", reused_tokens, a.cached, b.cached,
                      (unsigned long long)a.evictions, (unsigned long long)b.evictions);
            printf("    %s: %ld prompt tokens from the cache, %llu evictions\n", label, reused_tokens,
                   (unsigned long long)a.evictions);
            /* fp32: every block within tol; bf16 products: a near-tie expert flip may move a few, so the bulk. CCA
             * keeps convolution and delayed-value states (some must be non-zero, or nothing was checked); the MHA
             * variant carries nothing across tokens: its states stay zero on both */
            const int carries = cfg->attention == ZY_ATTN_CCA;
            snprintf(name, sizeof name, "%s: every block's kept state equals the CPU pool's after each step", label);
            gt_assert(t, (states_kept > 0) == carries && (bf16 ? states_over * 10 <= state_checks : states_over == 0),
                      name,
                      "%ld of %ld block checks over %.0e (worst %.2e), %ld with a kept state", states_over,
                      state_checks, tol, state_worst, states_kept);
        }
        snprintf(name, sizeof name, "%s: malformed steps refused as on the CPU, nothing changed", label);
        gt_assert(t, refusals_ok == 1, name, "%s", refusals_ok == 1 ? "" : refusals_ok < 0 ? "never tried" : "see above");
        const double e = gt_rel_err(want_gpu, want_cpu, (size_t)n_rows * V);
        if (!bf16) {
            snprintf(name, sizeof name, "%s: wanted logits vs the CPU's (fp32)", label);
            gt_assert(t, e <= tol && worst <= tol, name, "rel err %.2e, worst row %.2e (tol %.0e)", e, worst, tol);
        } else { /* bf16 operands: a rare expert choice may flip on a near tie, so the bulk, not every row */
            snprintf(name, sizeof name, "%s: wanted logits vs the CPU's fp32 (bf16 products)", label);
            gt_assert(t, e <= tol && rows_over * 10 <= n_rows, name, "rel err %.2e (tol %.0e), %d of %ld rows over",
                      e, tol, rows_over, n_rows);
        }
        if (pc->graphs) { /* the steps ran as graphs (none refused) where the run allows them: bf16, grouped experts */
            const int can = bf16 && gpu_model_experts_grouped(gm), n = gpu_kvpool_graphs(pp.gpu);
            snprintf(name, sizeof name, "%s: steps replayed as CUDA graphs%s", label,
                     can ? "" : " (ZAYA_GPU_EXPERTS=loop: none)");
            gt_assert(t, can ? n > 0 : n == 0, name, "%s", (n > 0) == can ? "" : can ? "no graph captured (refused?)"
                                                                                     : "graphs without their conditions");
        }
        if (pc->persistent) { /* the one-token steps ran a layer a kernel, unless ZAYA_GPU_FEW_ROWS=off */
            const int can = gpu_model_decode_layer_persistent(gm);
            const long n = gpu_model_decode_layer_runs(gm);
            snprintf(name, sizeof name, "%s: one-token steps' layers as one persistent kernel%s", label,
                     can ? "" : " (ZAYA_GPU_FEW_ROWS=off: none)");
            gt_assert(t, can ? n > 0 : n == 0, name, "%s", (n > 0) == can ? "" : can ? "no layer ran that way (refused?)"
                                                                                     : "ran without its conditions");
        }
    }
    free(tokens), free(seqs), free(who), free(running), free(rq);
    pair_free(&pp);
    gpu_model_free(gm);
    gt_env_restore(&layer_env);
    gt_env_restore(&graphs_env);
    model_free(&m);
    gt_reset(t);
}

/* Each refusal of model_decode_step, on pools with state in them: the GPU refuses the same steps with the same
 * words, and neither pool changes (the lengths, the free blocks, and the next step's logits still equal). */
static void pool_refusals(GpuTest *t, const ZayaConfig *cfg) {
    Model m;
    ZyErr err = {{0}}, cerr = {{0}};
    if (gt_random_model(t, &m, cfg, "pool refusals")) return;
    const int V = cfg->vocab_size, S = 4, ML = 16, bt = 4, chunk = 5, rows = 8;
    GpuModel *gm = NULL;
    PoolPair pp = {0};
    float *lc = gt_host(t, (size_t)S * V), *lg = gt_host(t, (size_t)S * V);
    int32_t *tok = gt_rand_int(t, 64, 0, V);
    int ok = gpu_model_create(&gm, &m, -1, 1, 1, 0, 0, &err) == 0 &&
             pair_create(&pp, gm, cfg, S, ML, 16, bt, rows, chunk, 0, &err) == 0;
    /* slots 0..2 hold blocks for the whole context, slot 3 none; state in all three, slot 2 almost full */
    for (int s = 0; ok && s < 3; s++)
        ok = kvpool_reserve(&pp.cpu, s, ML) == 0 && gpu_kvpool_reserve(pp.gpu, s, ML) == 0;
    const DecodeSeq warm[][3] = {{{0, 3, 1}, {1, 1, 1}, {2, 4, 0}}, {{2, 5, 1}, {0, 1, 1}, {1, 2, 0}},
                                 {{2, 5, 1}, {1, 1, 1}, {0, 1, 0}}};
    double worst = 0;
    for (int k = 0; ok && k < 3; k++) {
        ok = model_decode_step(&m, &pp.cpu, warm[k], 3, tok, lc, &cerr) == 0 &&
             gpu_model_decode_step(gm, pp.gpu, warm[k], 3, tok, lg, &err) == 0;
        for (int i = 0; ok && i < 3; i++)
            if (warm[k][i].logits) {
                const double e = gt_rel_err(lg + (size_t)i * V, lc + (size_t)i * V, V);
                worst = e > worst ? e : worst;
            }
    }
    if (!gt_assert(t, ok, "pool refusals: the pools filled", "%s", ok ? "" : cerr.msg[0] ? cerr.msg : err.msg)) {
        pair_free(&pp);
        gpu_model_free(gm);
        model_free(&m);
        gt_reset(t);
        return;
    }
    /* slot 2 now holds 14 tokens */
    int32_t badtok[16];
    memcpy(badtok, tok, sizeof badtok);
    struct {
        const char *what;
        DecodeSeq s[3];
        int n, bad_token;
    } cases[] = {
        {"no sequences", {{0, 1, 1}}, 0, 0},
        {"a slot out of range", {{0, 1, 1}, {S, 1, 1}}, 2, 0},
        {"a negative slot", {{-1, 1, 1}}, 1, 0},
        {"one slot twice", {{0, 1, 1}, {1, 1, 1}, {0, 1, 1}}, 3, 0},
        {"no new tokens", {{0, 0, 1}}, 1, 0},
        {"more tokens than a chunk", {{1, chunk + 1, 1}}, 1, 0},
        {"past max_len", {{2, 3, 1}}, 1, 0},
        {"a slot without blocks", {{0, 1, 1}, {3, 1, 1}}, 2, 0},
        {"too many rows", {{0, 5, 1}, {1, 4, 1}}, 2, 0},
        {"a token id past the vocabulary", {{0, 2, 1}, {1, 1, 1}}, 2, V},
        {"a negative token id", {{0, 2, 1}, {1, 1, 1}}, 2, -1},
    };
    int all = 1;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        badtok[2] = cases[c].bad_token ? cases[c].bad_token : tok[2];
        cerr.msg[0] = err.msg[0] = 0;
        const int rc = model_decode_step(&m, &pp.cpu, cases[c].s, cases[c].n, badtok, lc, &cerr);
        const int rg = gpu_model_decode_step(gm, pp.gpu, cases[c].s, cases[c].n, badtok, lg, &err);
        const int same = rc == -1 && rg == -1 && strcmp(cerr.msg, err.msg) == 0 && pair_same(&pp);
        char name[160];
        snprintf(name, sizeof name, "pool refusals: %s", cases[c].what);
        gt_assert(t, same, name, "cpu %d \"%s\", gpu %d \"%s\"", rc, cerr.msg, rg, err.msg);
        all &= same;
    }
    /* nothing changed: the next steps agree, slot 2 fills to the brim */
    const DecodeSeq after[][3] = {{{1, 4, 1}, {2, 2, 1}, {0, 1, 1}}, {{0, 5, 1}, {1, 1, 1}, {1, 1, 0}}};
    ok = 1;
    for (int k = 0; ok && k < 2; k++) {
        const int n = k == 0 ? 3 : 2;
        ok = model_decode_step(&m, &pp.cpu, after[k], n, tok, lc, &cerr) == 0 &&
             gpu_model_decode_step(gm, pp.gpu, after[k], n, tok, lg, &err) == 0;
        for (int i = 0; ok && i < n; i++) {
            const double e = gt_rel_err(lg + (size_t)i * V, lc + (size_t)i * V, V);
            worst = e > worst ? e : worst;
        }
    }
    gt_assert(t, ok && all && pair_same(&pp) && pp.cpu.blocks.len[2] == ML && worst <= 1e-4,
              "pool refusals: the pools unchanged (next steps' logits equal the CPU's)", "%s; worst row %.2e",
              ok ? "ran" : cerr.msg[0] ? cerr.msg : err.msg, worst);
    pair_free(&pp);
    gpu_model_free(gm);
    model_free(&m);
    gt_reset(t);
}

/* The GPU pool's one refusal the CPU has not: more rows wanting logits than its logits buffer holds (a row a sequence
 * and a chunk's: 5 here) is refused, nothing changed. The same step without a logits buffer runs on both (no row goes
 * through lm_head, whatever the sequences want), keeping nothing where no block ends; the next step's logits and
 * every block's kept state then equal the CPU's. */
static void pool_logit_rows(GpuTest *t, const ZayaConfig *cfg) {
    Model m;
    ZyErr err = {{0}}, cerr = {{0}};
    if (gt_random_model(t, &m, cfg, "pool logit rows")) return;
    const int V = cfg->vocab_size, S = 2, ML = 16, NB = 8, bt = 4, rows = 6, chunk = 3;
    GpuModel *gm = NULL;
    PoolPair pp = {0};
    float *lc = gt_host(t, (size_t)rows * V), *lg = gt_host(t, (size_t)rows * V);
    int32_t *tok = gt_rand_int(t, 8, 0, V);
    int ok = gpu_model_create(&gm, &m, -1, 1, 1, 0, 0, &err) == 0 &&
             pair_create(&pp, gm, cfg, S, ML, NB, bt, rows, chunk, 0, &err) == 0 &&
             kvpool_keep_block_states(&pp.cpu, &err) == 0 && gpu_kvpool_keep_block_states(pp.gpu, &err) == 0;
    for (int s = 0; ok && s < S; s++)
        ok = kvpool_reserve(&pp.cpu, s, ML) == 0 && gpu_kvpool_reserve(pp.gpu, s, ML) == 0;
    const DecodeSeq echo[2] = {{0, 3, DECODE_LOGITS_ALL}, {1, 3, DECODE_LOGITS_ALL}};
    err.msg[0] = 0;
    const int refused = ok && gpu_model_decode_step(gm, pp.gpu, echo, 2, tok, lg, &err) == -1;
    gt_assert(t, refused && strstr(err.msg, "6 rows want logits") && pair_same(&pp),
              "pool logit rows: 6 rows wanting logits refused by a pool that holds 5, nothing changed", "\"%s\"",
              err.msg);
    ok = ok && model_decode_step(&m, &pp.cpu, echo, 2, tok, NULL, &cerr) == 0 &&
         gpu_model_decode_step(gm, pp.gpu, echo, 2, tok, NULL, &err) == 0;
    const DecodeSeq next[2] = {{1, 1, 1}, {0, 1, 1}}; /* both at 4 tokens: a block ends, its state kept */
    ok = ok && model_decode_step(&m, &pp.cpu, next, 2, tok + 6, lc, &cerr) == 0 &&
         gpu_model_decode_step(gm, pp.gpu, next, 2, tok + 6, lg, &err) == 0;
    const double e = ok ? gt_rel_err(lg, lc, (size_t)2 * V) : 0;
    const size_t F = kvpool_state_bytes(cfg) / sizeof(float);
    float *states = gt_host(t, (size_t)NB * F);
    ok = ok && states && gpu_kvpool_download_block_states(pp.gpu, states, &err) == 0;
    const double es = ok ? gt_rel_err(states, pp.cpu.block_state, (size_t)NB * F) : 0;
    double worst_block = 0;
    for (int b = 0; ok && b < NB; b++) {
        const double eb = gt_rel_err(states + (size_t)b * F, pp.cpu.block_state + (size_t)b * F, F);
        worst_block = eb > worst_block ? eb : worst_block;
    }
    gt_assert(t, ok && pair_same(&pp) && e <= 1e-4 && worst_block <= 1e-4,
              "pool logit rows: the step without a logits buffer runs as on the CPU (logits, kept states)",
              "%s; logits rel err %.2e, kept states %.2e (worst block %.2e)",
              ok ? "ran" : cerr.msg[0] ? cerr.msg : err.msg, e, es, worst_block);
    pair_free(&pp);
    gpu_model_free(gm);
    model_free(&m);
    gt_reset(t);
}

/* kvpool_fork on both pools: a prompt of 10 tokens (two full blocks of 4 and a partial one) prefilled in slot 0, then
 * forked into slots 1 and 2 (the full blocks shared, the partial one copied, the state copied), and all three go on
 * with tokens of their own for 8 steps, one row each: every step's logits against the CPU's, the bookkeeping alike,
 * and a refused fork (a child holding shared blocks) refused by both. keep: both pools keep block states, as serve's
 * prefix cache has them (n choices of a prompt): the children's copied block and the next fill and keep their states
 * at the end of a one-row step; every block's kept state then equals the CPU's, and a fourth slot continues from
 * child 1's four full blocks (its kept state) alike. */
static void pool_fork(GpuTest *t, const char *label, const ZayaConfig *cfg, int kv_bf16, int keep, double tol) {
    Model m;
    ZyErr err = {{0}}, cerr = {{0}};
    if (gt_random_model(t, &m, cfg, label)) return;
    const int V = cfg->vocab_size, S = 4, ML = 24, bt = 4, NP = 10, NG = 8, NB = 24;
    GpuModel *gm = NULL;
    PoolPair pp = {0};
    float *lc = gt_host(t, (size_t)S * V), *lg = gt_host(t, (size_t)S * V);
    int32_t *prompt = gt_rand_int(t, NP, 0, V), *gen = gt_rand_int(t, (size_t)S * NG, 0, V);
    int ok = gpu_model_create(&gm, &m, -1, 1, 1, 0, 0, &err) == 0 &&
             pair_create(&pp, gm, cfg, S, ML, NB, bt, 12, 12, kv_bf16, &err) == 0 &&
             (!keep || (kvpool_keep_block_states(&pp.cpu, &err) == 0 &&
                        gpu_kvpool_keep_block_states(pp.gpu, &err) == 0)) &&
             kvpool_reserve(&pp.cpu, 0, NP + NG) == 0 && gpu_kvpool_reserve(pp.gpu, 0, NP + NG) == 0;
    const DecodeSeq pre = {.slot = 0, .n = NP, .logits = 1};
    ok = ok && model_decode_step(&m, &pp.cpu, &pre, 1, prompt, lc, &cerr) == 0 &&
         gpu_model_decode_step(gm, pp.gpu, &pre, 1, prompt, lg, &err) == 0;
    double worst = ok ? gt_rel_err(lg, lc, V) : 0;
    int forks_agree = 1;
    for (int c = 1; ok && c < 3; c++) { /* blocks of its own past the shared ones, as serve_engine.c reserves them */
        const int own = (NP + NG + bt - 1) / bt - NP / bt;
        ok = kvpool_reserve(&pp.cpu, c, own * bt) == 0 && gpu_kvpool_reserve(pp.gpu, c, own * bt) == 0;
        const int rc = kvpool_fork(&pp.cpu, 0, c), rg = gpu_kvpool_fork(pp.gpu, 0, c);
        forks_agree &= rc == 0 && rg == 0;
    }
    /* slot 1 now holds slot 0's full blocks: a second fork into it is refused alike, nothing changed */
    forks_agree &= kvpool_fork(&pp.cpu, 0, 1) == -1 && gpu_kvpool_fork(pp.gpu, 0, 1) == -1 && pair_same(&pp);
    for (int k = 0; ok && k < NG; k++) {
        const DecodeSeq step[3] = {{2, 1, 1}, {0, 1, 1}, {1, 1, 1}};
        int32_t tok[3];
        for (int i = 0; i < 3; i++) tok[i] = gen[step[i].slot * NG + k];
        ok = model_decode_step(&m, &pp.cpu, step, 3, tok, lc, &cerr) == 0 &&
             gpu_model_decode_step(gm, pp.gpu, step, 3, tok, lg, &err) == 0;
        for (int i = 0; ok && i < 3; i++) {
            const double e = gt_rel_err(lg + (size_t)i * V, lc + (size_t)i * V, V);
            worst = e > worst ? e : worst;
        }
    }
    char name[200];
    if (keep && ok) { /* each slot is at 18 tokens: blocks ending at 12 and 16 were filled by one-row steps */
        const size_t F = kvpool_state_bytes(cfg) / sizeof(float);
        float *states = gt_host(t, (size_t)NB * F);
        double state_worst = 0;
        int kept = 0;
        ok = states && gpu_kvpool_download_block_states(pp.gpu, states, &err) == 0;
        for (int b = 0; ok && b < NB; b++) {
            const float *want = pp.cpu.block_state + (size_t)b * F;
            const double e = gt_rel_err(states + (size_t)b * F, want, F);
            state_worst = e > state_worst ? e : state_worst;
            int any = 0;
            for (size_t i = 0; i < F && !any; i++) any = want[i] != 0;
            kept += any;
        }
        snprintf(name, sizeof name, "%s: every block's kept state equals the CPU pool's (forked children's too)", label);
        gt_assert(t, ok && kept >= 8 && state_worst <= tol, name, "%d blocks with a kept state, worst %.2e (tol %.0e)",
                  kept, state_worst, tol);
        /* slot 3 continues after child 1's four full blocks, from the state kept at the fourth's end */
        int32_t shared[4], tok = gen[3 * NG];
        memcpy(shared, kvblocks_row(&pp.cpu.blocks, 1), sizeof shared);
        const DecodeSeq next = {.slot = 3, .n = 1, .logits = 1};
        const int rc = kvpool_seq_share(&pp.cpu, 3, shared, 4), rg = gpu_kvpool_seq_share(pp.gpu, 3, shared, 4);
        ok = ok && rc == 0 && rg == 0 && kvpool_reserve(&pp.cpu, 3, 17) == 0 && gpu_kvpool_reserve(pp.gpu, 3, 17) == 0 &&
             model_decode_step(&m, &pp.cpu, &next, 1, &tok, lc, &cerr) == 0 &&
             gpu_model_decode_step(gm, pp.gpu, &next, 1, &tok, lg, &err) == 0;
        const double e = ok ? gt_rel_err(lg, lc, V) : 0;
        snprintf(name, sizeof name, "%s: a slot continues from a child's kept state as on the CPU", label);
        gt_assert(t, ok && pair_same(&pp) && e <= tol, name, "%s; logits rel err %.2e (tol %.0e)",
                  ok ? "shared" : cerr.msg[0] ? cerr.msg : err.msg, e, tol);
    }
    snprintf(name, sizeof name, "%s: forks agree with the CPU's (shared, copied, refused)", label);
    gt_assert(t, ok && forks_agree && pair_same(&pp), name, "%s",
              ok ? (!forks_agree ? "a fork's result differs" : pair_same(&pp) ? "" : "bookkeeping differs")
                 : cerr.msg[0] ? cerr.msg : err.msg);
    snprintf(name, sizeof name, "%s: the forked sequences' logits vs the CPU's", label);
    gt_assert(t, ok && worst <= tol, name, "worst row %.2e (tol %.0e)", worst, tol);
    pair_free(&pp);
    gpu_model_free(gm);
    model_free(&m);
    gt_reset(t);
}

/* ---- the pool step's own kernels alone (a failure here names the kernel before the model-level lockstep) ------- */

/* gk_paged_decode_attention vs a double reference: three sequences (long_seq, 1 and 20 tokens) whose blocks lie
 * shuffled over the pool, rows for the last 6 positions of the first (a prefill piece) and the last of the others
 * (decode rows), GQA, a window; with the key pieces' scratch (its counts left zero) and without. Every pool row no
 * sequence owns, and every table entry past a sequence's blocks, is NaN or points at NaN rows: a key read outside
 * [max(0, pos-W+1), pos] of the row's own sequence shows as a NaN. */
static void check_paged_attention(GpuTest *t, int Hq, int Hkv, int dh, int bt, int window, int long_seq) {
    enum { NS = 3 };
    const int lens[NS] = {long_seq, 1, 20}, news[NS] = {6, 1, 1};
    const int Cq = Hq * dh, Ck = Hkv * dh, G = Hq / Hkv;
    int MB = 0, used = 0, N = 0;
    for (int i = 0; i < NS; i++) {
        const int nb = (lens[i] + bt - 1) / bt;
        MB = nb > MB ? nb : MB;
        used += nb;
        N += news[i];
    }
    const int NB = used + 2; /* two blocks nobody owns */
    int32_t *perm = gt_rand_int(t, NB, 0, 1);
    for (int i = 0; i < NB; i++) perm[i] = i;
    for (int i = NB - 1; i > 0; i--) {
        const int j = (int)(zy_rng_next(&t->rng) % (uint64_t)(i + 1)), x = perm[i];
        perm[i] = perm[j], perm[j] = x;
    }
    int32_t *table = gt_rand_int(t, (size_t)NS * MB, 0, 1);
    const size_t nkv = (size_t)NB * bt * Ck;
    float *K = gt_host(t, nkv), *V = gt_host(t, nkv);
    for (size_t i = 0; i < nkv; i++) K[i] = V[i] = NAN;
    for (int i = 0, b = 0; i < NS; i++)
        for (int k = 0; k < MB; k++) /* past its blocks: an unowned (NaN) block */
            table[i * MB + k] = k < (lens[i] + bt - 1) / bt ? perm[b++] : perm[NB - 1];
    for (int i = 0; i < NS; i++)
        for (int s = 0; s < lens[i]; s++) {
            const size_t at = ((size_t)table[i * MB + s / bt] * bt + s % bt) * Ck;
            for (int c = 0; c < Ck; c++) {
                K[at + c] = (float)zy_rng_normal(&t->rng);
                V[at + c] = (float)zy_rng_normal(&t->rng);
            }
        }
    int32_t *seq = gt_rand_int(t, N, 0, 1), *pos = gt_rand_int(t, N, 0, 1);
    for (int i = 0, r = 0; i < NS; i++)
        for (int k = 0; k < news[i]; k++, r++) seq[r] = i, pos[r] = lens[i] - news[i] + k;
    float *Q = gt_rand(t, (size_t)N * Cq, 1.0f), *O = gt_host(t, (size_t)N * Cq);
    const double scale = (float)(1.0 / sqrt((double)dh));
    double *sc = malloc(sizeof(double) * (size_t)long_seq), *acc = malloc(sizeof(double) * dh);
    for (int r = 0; sc && acc && r < N; r++)
        for (int h = 0; h < Hq; h++) {
            const int last = pos[r], first = window > 0 && last - window + 1 > 0 ? last - window + 1 : 0;
            const float *q = Q + (size_t)r * Cq + (size_t)h * dh;
            double mx = -INFINITY, sum = 0;
            for (int s = first; s <= last; s++) {
                const float *k = K + ((size_t)table[seq[r] * MB + s / bt] * bt + s % bt) * Ck + (size_t)(h / G) * dh;
                double d = 0;
                for (int i = 0; i < dh; i++) d += (double)q[i] * k[i];
                sc[s - first] = d * scale;
                mx = sc[s - first] > mx ? sc[s - first] : mx;
            }
            for (int i = 0; i < dh; i++) acc[i] = 0;
            for (int s = first; s <= last; s++) {
                const double p = exp(sc[s - first] - mx);
                const float *v = V + ((size_t)table[seq[r] * MB + s / bt] * bt + s % bt) * Ck + (size_t)(h / G) * dh;
                sum += p;
                for (int i = 0; i < dh; i++) acc[i] += p * v[i];
            }
            for (int i = 0; i < dh; i++) O[(size_t)r * Cq + (size_t)h * dh + i] = (float)(acc[i] / sum);
        }
    free(sc), free(acc);
    const float *d_Q = gt_up(t, Q, (size_t)N * Cq), *d_K = gt_up(t, K, nkv), *d_V = gt_up(t, V, nkv);
    const int32_t *d_seq = gt_up_i(t, seq, N), *d_pos = gt_up_i(t, pos, N), *d_table = gt_up_i(t, table, (size_t)NS * MB);
    for (int pieces = 0; pieces < 2; pieces++) {
        float *d_O = gt_poison(t, (size_t)N * Cq);
        GkAttnPieces ap = {0};
        if (pieces)
            ap = (GkAttnPieces){.partial = gt_poison(t, (size_t)N * Hq * GK_ATTN_PIECES * (dh + 2)),
                                .count = gt_dev(t, (size_t)N * Hq * sizeof(unsigned))};
        gk_paged_decode_attention(t->g->stream, d_O, d_Q, d_K, d_V, d_seq, d_pos, d_table, MB, bt, N, Hq, Hkv, dh,
                                  window, ap);
        char nm[160];
        snprintf(nm, sizeof nm, "paged attention Hq%d Hkv%d dh%d bt%d W%d, lengths %d 1 20, %s", Hq, Hkv, dh, bt, window,
                 long_seq, pieces ? "key pieces" : "one block a row");
        gt_check(t, nm, d_O, O, (size_t)N * Cq, 1e-5);
        if (!pieces) continue;
        const int32_t *counts = gt_down_i(t, (const int32_t *)(const void *)ap.count, (size_t)N * Hq);
        int left = 0;
        for (int i = 0; i < N * Hq; i++) left += counts[i] != 0;
        gt_assert(t, left == 0, nm, "%d piece counts not left zero", left);
    }
}

/* gk_copy_rows_idx (both index lists: rows scattered by a permutation, gathered with repeats, strided), and
 * gk_rope_forward_pos / gk_l2norm_rope_qk_forward (q and k in one launch) against the CPU's forwards at each row's
 * table offset. (gk_cca_decode_rows's index form runs in every pool case below; test_gpu_cca.c checks its op by op.) */
static void check_ragged_kernels(GpuTest *t) {
    GkStream st = t->g->stream;
    char nm[128];
    { /* copy: dst row perm[k] (stride len) = src row from[k] (stride len + 3) */
        const int n = 37, ns = 11;
        const long len = 29, sst = len + 3;
        float *src = gt_rand(t, (size_t)ns * sst, 1.0f), *want = gt_host(t, (size_t)n * len);
        int32_t *perm = gt_rand_int(t, n, 0, 1), *from = gt_rand_int(t, n, 0, ns);
        for (int i = 0; i < n; i++) perm[i] = (i * 7 + 3) % n; /* 7 and 37 coprime: a permutation */
        for (int k = 0; k < n; k++) memcpy(want + perm[k] * len, src + from[k] * sst, (size_t)len * sizeof(float));
        float *d = gt_poison(t, (size_t)n * len);
        gk_copy_rows_idx(st, d, len, gt_up_i(t, perm, n), gt_up(t, src, (size_t)ns * sst), sst, gt_up_i(t, from, n),
                         len, n);
        gt_check(t, "copy_rows_idx: scattered by one index list, gathered by another", d, want, (size_t)n * len, 0);
    }
    /* RoPE at per-row positions: rows of H heads, positions in any order, the sliding layers' full rotary dim too */
    const int rows = 9, H = 3, dh = 16, T = 50;
    int32_t *pos = gt_rand_int(t, rows, 0, T);
    pos[0] = 0, pos[1] = T - 1;
    for (int rd = 8; rd <= 16; rd += 8) {
        const int half = rd / 2;
        const size_t n = (size_t)rows * H * dh, nt = (size_t)T * half;
        float *cosv = gt_host(t, nt), *sinv = gt_host(t, nt);
        rope_tables(cosv, sinv, T, rd, 10000.0f);
        const float *d_cos = gt_up(t, cosv, nt), *d_sin = gt_up(t, sinv, nt);
        const int32_t *d_pos = gt_up_i(t, pos, rows);
        float *x = gt_rand(t, n, 1.0f), *rx = gt_copy(t, x, n);
        for (int r = 0; r < rows; r++)
            rope_forward(rx + (size_t)r * H * dh, cosv + (size_t)pos[r] * half, sinv + (size_t)pos[r] * half, 1, 1, H,
                         dh, rd);
        float *d_x = gt_up(t, x, n);
        gk_rope_forward_pos(st, d_x, d_cos, d_sin, d_pos, rows, H, dh, rd);
        snprintf(nm, sizeof nm, "rope at per-row positions, rd %d", rd);
        gt_check(t, nm, d_x, rx, n, 1e-6);
        /* the query's H heads without a temperature and the key's Hk heads with one, in one launch */
        const int Hk = 2;
        const size_t nk = (size_t)rows * Hk * dh;
        const float *temp = gt_rand(t, Hk, 1.0f), *xk = gt_rand(t, nk, 1.0f);
        float *y = gt_host(t, n), *norm = gt_host(t, (size_t)rows * H);
        float *yk = gt_host(t, nk), *normk = gt_host(t, (size_t)rows * Hk);
        const float scale = sqrtf((float)dh), eps = 1.1920928955078125e-07f;
        for (int r = 0; r < rows; r++) {
            const float *cs = cosv + (size_t)pos[r] * half, *sn = sinv + (size_t)pos[r] * half;
            l2norm_rope_forward(y + (size_t)r * H * dh, norm + (size_t)r * H, x + (size_t)r * H * dh, NULL, cs, sn, 1,
                                1, H, dh, rd, scale, eps);
            l2norm_rope_forward(yk + (size_t)r * Hk * dh, normk + (size_t)r * Hk, xk + (size_t)r * Hk * dh, temp, cs,
                                sn, 1, 1, Hk, dh, rd, scale, eps);
        }
        float *d_y = gt_poison(t, n), *d_norm = gt_poison(t, (size_t)rows * H);
        float *d_yk = gt_poison(t, nk), *d_normk = gt_poison(t, (size_t)rows * Hk);
        gk_l2norm_rope_qk_forward(st, (GkNormRopePart){d_y, d_norm, gt_up(t, x, n), NULL, H},
                                  (GkNormRopePart){d_yk, d_normk, gt_up(t, xk, nk), gt_up(t, temp, Hk), Hk}, d_cos,
                                  d_sin, d_pos, rows, 1, dh, rd, scale, eps);
        snprintf(nm, sizeof nm, "l2norm + rope of q and k at per-row positions, rd %d: q", rd);
        gt_check(t, nm, d_y, y, n, 1e-6);
        snprintf(nm, sizeof nm, "l2norm + rope of q and k at per-row positions, rd %d: q norm", rd);
        gt_check(t, nm, d_norm, norm, (size_t)rows * H, 1e-6);
        snprintf(nm, sizeof nm, "l2norm + rope of q and k at per-row positions, rd %d: k", rd);
        gt_check(t, nm, d_yk, yk, nk, 1e-6);
        snprintf(nm, sizeof nm, "l2norm + rope of q and k at per-row positions, rd %d: k norm", rd);
        gt_check(t, nm, d_normk, normk, (size_t)rows * Hk, 1e-6);
    }
    /* attention through a block table: GQA 3 and 4, MHA; head_dim 256 (the kernel's limit: 8 values a lane), 48 (not
     * a multiple of the warp), 16; 1-, 5- and 16-token blocks; no window, windows shorter than the prefill piece */
    check_paged_attention(t, 6, 2, 256, 5, 0, 37);
    check_paged_attention(t, 4, 4, 48, 1, 7, 37);
    check_paged_attention(t, 8, 2, 16, 16, 3, 37);
    check_paged_attention(t, 4, 1, 32, 4, 1, 37);
    check_paged_attention(t, 8, 2, 128, 16, 0, 700); /* 700 keys: 11 pieces of 64 */
    check_paged_attention(t, 8, 2, 128, 16, 300, 700); /* a window of 300: 10 pieces of 32, not from 0 */
    gt_reset(t);
}

void test_gpu_pool(GpuTest *t) {
    check_ragged_kernels(t);
    ZayaConfig c = gt_small_config();
    /* block_tokens 4 with prefill chunks of 7: sequences span blocks and chunks cross block edges; 25 blocks hold
     * two and a half full sequences, so requests wait for blocks and reuse the blocks of those that left */
    const PoolCase small = {.S = 4, .ML = 40, .NB = 25, .bt = 4, .rows = 12, .chunk = 7, .n_req = 10,
                            .max_prompt = 18, .max_gen = 14};
    compare_pool(t, "pool: zaya1 (CCA, 4 q / 2 kv heads)", &c, &small, 0, 1e-4);
    ZayaConfig k31 = c;
    k31.cca_time0 = 3, k31.cca_time1 = 1, k31.num_kv_heads = 1;
    compare_pool(t, "pool: k 3/1, one kv head", &k31, &small, 0, 1e-4);
    ZayaConfig k13 = c;
    k13.cca_time0 = 1, k13.cca_time1 = 3;
    compare_pool(t, "pool: k 1/3", &k13, &small, 0, 1e-4);
    /* 4 state columns: prefill pieces of 2 and 3 rows are shorter than the state (the new state keeps some of the
     * old columns) and sit padded next to longer ones */
    ZayaConfig k33 = c;
    k33.cca_time0 = 3, k33.cca_time1 = 3;
    compare_pool(t, "pool: k 3/3 (4 state columns)", &k33, &small, 0, 1e-4);
    ZayaConfig mha = c;
    mha.attention = ZY_ATTN_MHA;
    compare_pool(t, "pool: MHA variant", &mha, &small, 0, 1e-4);
    ZayaConfig sw = c;
    sw.sliding_window = 5, sw.rope_theta_sliding = 300.0f, sw.partial_rotary_factor_sliding = 1.0f;
    cfg_set_layer_sliding(&sw, 0, 1), cfg_set_layer_sliding(&sw, 2, 1);
    compare_pool(t, "pool: sliding W5 (layers 0, 2)", &sw, &small, 0, 1e-4);
    ZayaConfig swm = sw;
    swm.attention = ZY_ATTN_MHA, swm.sliding_window = 9;
    compare_pool(t, "pool: sliding W9, MHA variant", &swm, &small, 0, 1e-4);
    /* one-token blocks; 40 of them hold the two slots' sequences at once */
    const PoolCase tiny = {.S = 2, .ML = 20, .NB = 40, .bt = 1, .rows = 6, .chunk = 3, .n_req = 8, .max_prompt = 9,
                           .max_gen = 8};
    compare_pool(t, "pool: zaya1, 1-token blocks", &c, &tiny, 0, 1e-4);
    /* head_dim 128 (the attention kernel's 4 values per lane), long prefills in 64-row chunks over 16-token blocks */
    ZayaConfig wide = c;
    wide.hidden_size = 256, wide.num_heads = 8, wide.head_dim = 128, wide.num_experts = 8, wide.vocab_size = 1000;
    const PoolCase big = {.S = 3, .ML = 200, .NB = 30, .bt = 16, .rows = 80, .chunk = 64, .n_req = 5,
                          .max_prompt = 150, .max_gen = 20};
    const int gpu = gt_gpu_sized(t, "pool: head_dim 128, 150-token prompts (fp32 and bf16 KV cache)");
    if (gpu) compare_pool(t, "pool: head_dim 128, 64-row prefill chunks", &wide, &big, 0, 1e-4);
    /* bf16 products: the dense MLP (no expert choice to flip) and ZAYA1's experts */
    ZayaConfig dense = c;
    dense.moe = ZY_MOE_DENSE;
    compare_pool(t, "pool bf16: dense MLP", &dense, &small, 1, 6e-2);
    compare_pool(t, "pool bf16: zaya1", &c, &small, 1, 1e-1);
    /* the same steps replayed as CUDA graphs (ZAYA_GPU_GRAPHS=1: one capture per step shape), the same bars */
    PoolCase graphed = small;
    graphed.graphs = 1;
    compare_pool(t, "pool bf16, CUDA graphs: dense MLP", &dense, &graphed, 1, 6e-2);
    compare_pool(t, "pool bf16, CUDA graphs: zaya1", &c, &graphed, 1, 1e-1);
    /* the one-token steps' layers as one persistent kernel (ZAYA_GPU_DECODE_LAYER=persistent; each count of rows its
     * own plans; it reads a bf16 KV cache), as a launch and inside the graphs, the same bars */
    PoolCase small16 = small;
    small16.kv_bf16 = 1;
    PoolCase layered = small16;
    layered.persistent = 1;
    compare_pool(t, "pool bf16, persistent layers: zaya1", &c, &layered, 1, 1e-1);
    layered.graphs = 1;
    compare_pool(t, "pool bf16, persistent layers in CUDA graphs: zaya1", &c, &layered, 1, 1e-1);
    /* the bf16 KV cache (--kv-dtype bf16) on both sides, fp32 products: both round the same k̂ / v, which differ by
     * fp32 noise (~1e-6), so only the few that sit on a rounding edge (about 1e-6 / 2^-8, 3e-4 of them) land one bf16
     * step (2^-8) apart: 1e-3 holds that with room */
    compare_pool(t, "pool, bf16 KV cache: zaya1", &c, &small16, 0, 1e-3);
    compare_pool(t, "pool, bf16 KV cache: sliding W5 (layers 0, 2)", &sw, &small16, 0, 1e-3);
    PoolCase big16 = big;
    big16.kv_bf16 = 1;
    if (gpu) compare_pool(t, "pool, bf16 KV cache: head_dim 128", &wide, &big16, 0, 1e-3);
    pool_refusals(t, &c);
    /* the prompts' choices (n > 1) and the prefix cache: forks, kept block states, sequences continuing from them */
    pool_fork(t, "pool fork: zaya1", &c, 0, 0, 1e-4);
    pool_fork(t, "pool fork, bf16 KV cache: k 3/3", &k33, 1, 0, 1e-3);
    pool_fork(t, "pool fork, kept states: zaya1", &c, 0, 1, 1e-4);
    pool_logit_rows(t, &c);
    pool_fork(t, "pool fork, kept states, bf16 KV cache: k 3/3", &k33, 1, 1, 1e-3);
    PoolCase shared = small;
    shared.prefix = 13, shared.NB = 30, shared.n_req = 12; /* three full blocks and a bit */
    compare_pool(t, "pool, prefix cache: zaya1", &c, &shared, 0, 1e-4);
    compare_pool(t, "pool, prefix cache: k 3/3 (4 state columns)", &k33, &shared, 0, 1e-4);
    compare_pool(t, "pool, prefix cache: sliding W5 (layers 0, 2)", &sw, &shared, 0, 1e-4);
    compare_pool(t, "pool, prefix cache: MHA variant", &mha, &shared, 0, 1e-4);
    PoolCase shared16 = shared;
    shared16.kv_bf16 = 1, shared16.persistent = 1, shared16.graphs = 1;
    compare_pool(t, "pool bf16, prefix cache, persistent layers in CUDA graphs: zaya1", &c, &shared16, 1, 1e-1);
}

void test_gpu_decode(GpuTest *t) {
    ZayaConfig c = gt_small_config();
    compare_decode(t, "zaya1 B1 T40 prefill 13 in pieces of 5", &c, 1, 40, 13, 5);
    compare_decode(t, "zaya1 B3 T33 prefill 16 in one piece", &c, 3, 33, 16, 64);
    ZayaConfig k31 = c;
    k31.cca_time0 = 3, k31.cca_time1 = 1, k31.num_kv_heads = 1;
    compare_decode(t, "k 3/1, one kv head, B2 T30", &k31, 2, 30, 7, 4);
    ZayaConfig mha = c;
    mha.attention = ZY_ATTN_MHA;
    compare_decode(t, "MHA variant B2 T30", &mha, 2, 30, 9, 4);
    ZayaConfig dense = c;
    dense.moe = ZY_MOE_DENSE;
    compare_decode(t, "dense MLP B2 T25", &dense, 2, 25, 6, 64);
    ZayaConfig wide = c;
    wide.hidden_size = 256, wide.num_heads = 8, wide.head_dim = 128, wide.num_experts = 8, wide.vocab_size = 1000;
    if (gt_gpu_sized(t, "head_dim 128 B2 T200 prefill 150")) /* head_dim 128 on the emulator: the cases below */
        compare_decode(t, "head_dim 128 B2 T200 prefill 150", &wide, 2, 200, 150, 64);
    /* sliding-window layers (ZAYA1-74B-preview's hybrid_sliding): windows shorter than the prefill and its pieces,
     * their own RoPE (another theta, full rotation), alternating with full layers; and the MHA variant */
    ZayaConfig sw = c;
    sw.sliding_window = 5, sw.rope_theta_sliding = 300.0f, sw.partial_rotary_factor_sliding = 1.0f;
    cfg_set_layer_sliding(&sw, 0, 1), cfg_set_layer_sliding(&sw, 2, 1);
    compare_decode(t, "sliding W5 (layers 0, 2) B2 T30 prefill 13 in pieces of 4", &sw, 2, 30, 13, 4);
    ZayaConfig sw1 = sw;
    sw1.sliding_window = 1;
    compare_decode(t, "sliding W1 B1 T20", &sw1, 1, 20, 6, 64);
    ZayaConfig swm = sw;
    swm.attention = ZY_ATTN_MHA, swm.sliding_window = 9;
    compare_decode(t, "sliding W9, MHA variant B2 T40", &swm, 2, 40, 11, 64);
    /* the bf16 KV cache on both devices (tolerance: see test_gpu_pool's bf16 KV cases) */
    compare_decode_kv(t, "bf16 KV cache: zaya1 B3 T33 prefill 16", &c, 3, 33, 16, 64, 1, 1e-3);
    compare_decode_kv(t, "bf16 KV cache: MHA variant B2 T30", &mha, 2, 30, 9, 4, 1, 1e-3);
    compare_decode_kv(t, "bf16 KV cache: sliding W5 B2 T30", &sw, 2, 30, 13, 4, 1, 1e-3);
    compare_pdl(t, "bf16 zaya1 B3 T30 prefill 12", &c, 3, 30, 12);
    compare_pdl(t, "bf16 head_dim 128 B1 T40 prefill 9", &wide, 1, 40, 9);
    compare_pdl(t, "bf16 sliding W5 B2 T30 prefill 13", &sw, 2, 30, 13);
    compare_pdl(t, "bf16 MHA variant B2 T24 prefill 7", &mha, 2, 24, 7);
    check_grid_barrier(t);
    compare_layer_kernel(t, "persistent layer: bf16 zaya1 B3 T30 prefill 12", &c, 3, 30, 12, 1);
    compare_layer_kernel(t, "persistent layer: bf16 head_dim 128 B1 T40 prefill 9", &wide, 1, 40, 9, 1);
    compare_layer_kernel(t, "persistent layer: bf16 sliding W5 B2 T30 prefill 13", &sw, 2, 30, 13, 1);
    compare_layer_kernel(t, "persistent layer: bf16 MHA variant B2 T24 prefill 7", &mha, 2, 24, 7, 0);
    compare_generate(t);
}
