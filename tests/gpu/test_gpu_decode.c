/* Cached decoding on the GPU (gpu_decode.c): logits of a prefill plus token-by-token steps against the GPU's full
 * forward (recompute) and against the CPU's cached decoding, for ZAYA1 and the research variants, several sequences
 * at once and inputs split into pieces; greedy generation equal to the CPU's. fp32 throughout. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "infer/decode.h"
#include "gpu/gpu_decode.h"
#include "gpu/gpu_model.h"
#include "gpu_test.h"
#include "model/model.h"

/* B sequences of T tokens: the GPU's full forward, the GPU cache (prefill of n0 tokens in pieces of `chunk`, then one
 * token at a time), the CPU cache the same way; every position's logits compared. */
static void compare_decode(GpuTest *t, const char *label, const ZayaConfig *cfg, int B, int T, int n0, int chunk) {
    Model m;
    ZyErr err = {{0}};
    char name[200];
    if (model_create(&m, cfg, &err)) {
        gt_assert(t, 0, label, "%s", err.msg);
        return;
    }
    gt_randomise_model(t, &m);
    const int V = cfg->vocab_size;
    const size_t NV = (size_t)B * T * V;
    int32_t *tokens = gt_rand_int(t, (size_t)B * T, 0, V);
    float *full = gt_host(t, NV), *cached = gt_host(t, NV), *cpu = gt_host(t, NV);
    GpuModel *gm = NULL;
    GpuKVCache *gc = NULL;
    KVCache cc;
    int have_cc = 0;
    int ok = gpu_model_create(&gm, &m, -1, B, T, 0, 0, &err) == 0 && gpu_model_forward(gm, tokens, &err) == 0 &&
             gpu_model_logits(gm, full, &err) == 0 && gpu_kvcache_create(&gc, gm, B, T, chunk, &err) == 0;
    ok = ok && (have_cc = kvcache_create_ex(&cc, cfg, B, T, chunk, &err) == 0);
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
        gt_assert(t, e <= 1e-4, name, "rel err %.2e (tol 1e-4)", e);
        snprintf(name, sizeof name, "%s: GPU cached vs CPU cached", label);
        e = gt_rel_err(cached, cpu, NV);
        gt_assert(t, e <= 1e-4, name, "rel err %.2e (tol 1e-4)", e);
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
    compare_generate(t);
}
