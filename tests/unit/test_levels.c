/* Every CPU level this machine can run against the generic one: the kernel tables directly (elementwise ops with
 * extreme inputs, flash attention), then the whole model — forward, loss, every gradient, cached decoding and bf16
 * decoding — with the process switched to each level in turn. Levels differ only in vector width and FMA use,
 * so results agree to rounding; a kernel that reads or writes out of place differs by far more. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/attention.h"
#include "model/config.h"
#include "kernels/cpu.h"
#include "infer/decode.h"
#include "kernels/kernel_table.h"
#include "model/model.h"
#include "test.h"
#include "util/util.h"

static float *randn_f(ZyRng *rng, long n, double scale) {
    float *p = malloc(sizeof(float) * (size_t)(n ? n : 1));
    for (long i = 0; i < n; i++) p[i] = (float)(scale * zy_rng_normal(rng));
    return p;
}

/* max |a - b| / (1 + |b|) */
static double max_err(const float *a, const float *b, long n) {
    double worst = 0;
    for (long i = 0; i < n; i++) {
        const double e = fabs((double)a[i] - b[i]) / (1.0 + fabs((double)b[i]));
        if (!(e <= worst)) worst = e; /* NaN counts as the worst */
    }
    return worst;
}

TEST(kernel_tables_of_every_level_match_generic) {
    ZyCpuInfo ci;
    zy_cpu_detect(&ci);
    const ZyKernelTable *g = zy_kernel_table(ZY_CPU_GENERIC);
    ZyRng rng;
    zy_rng_seed(&rng, 23);
    const int rows = 37, dim = 203, V = 1001; /* sizes off every vector width */
    float *x = randn_f(&rng, (long)rows * dim, 3.0), *w = randn_f(&rng, dim, 1.0);
    float *gu = randn_f(&rng, (long)rows * 2 * dim, 4.0), *logits = randn_f(&rng, (long)rows * V, 8.0);
    for (int i = 0; i < 50; i++) logits[i * 13] = (i % 2 ? 1 : -1) * 80.0f; /* near expf's range limit */
    int32_t targets[37];
    for (int r = 0; r < rows; r++) targets[r] = r % 5 == 4 ? -1 : (int32_t)(zy_rng_next(&rng) % V);
    const long n = (long)rows * dim;
    float *y[2], *rstd[2], *act[2], *gel[2], *dl[2], *rl[2];
    for (int k = 0; k < 2; k++) {
        y[k] = calloc(n, 4), rstd[k] = calloc(rows, 4), act[k] = calloc(n, 4), gel[k] = calloc(n, 4);
        dl[k] = calloc((size_t)rows * V, 4), rl[k] = calloc(rows, 4);
    }
    g->rmsnorm_forward(y[0], rstd[0], x, w, rows, dim, 1e-5f);
    g->swiglu_forward(act[0], gu, rows, dim);
    g->gelu_forward(gel[0], x, n);
    const double loss0 = g->cross_entropy(dl[0], rl[0], logits, targets, rows, V, 1.0);
    int levels = 0;
    for (int l = ZY_CPU_AVX2; l < ZY_CPU_LEVELS; l++) {
        if (!zy_cpu_supports(&ci, (ZyCpuLevel)l)) continue;
        const ZyKernelTable *t = zy_kernel_table((ZyCpuLevel)l);
        t->rmsnorm_forward(y[1], rstd[1], x, w, rows, dim, 1e-5f);
        t->swiglu_forward(act[1], gu, rows, dim);
        t->gelu_forward(gel[1], x, n);
        const double loss1 = t->cross_entropy(dl[1], rl[1], logits, targets, rows, V, 1.0);
        const double e[] = {max_err(y[1], y[0], n), max_err(rstd[1], rstd[0], rows), max_err(act[1], act[0], n),
                            max_err(gel[1], gel[0], n), max_err(dl[1], dl[0], (long)rows * V),
                            fabs(loss1 - loss0) / (1 + fabs(loss0))};
        printf("    %s vs generic: rmsnorm %.2g, rstd %.2g, swiglu %.2g, gelu %.2g, dlogits %.2g, loss %.2g\n",
               t->level, e[0], e[1], e[2], e[3], e[4], e[5]);
        for (size_t i = 0; i < ZY_ARRAY_LEN(e); i++) CHECK_MSG(e[i] < 2e-6, "%s: check %zu: %.3g", t->level, i, e[i]);
        levels++;
    }
    /* flash attention, forward and backward, a shape with partial tiles */
    const int B = 2, T = 77, Hq = 4, Hkv = 2, dh = 24;
    const long nq = (long)B * T * Hq * dh, nk = (long)B * T * Hkv * dh;
    float *Q = randn_f(&rng, nq, 1.0), *K = randn_f(&rng, nk, 1.0), *Vv = randn_f(&rng, nk, 1.0);
    float *dO = randn_f(&rng, nq, 1.0);
    float *O[2], *lse[2], *dQ[2], *dK[2], *dV[2];
    float *work = malloc(sizeof(float) * flash_attention_workspace_floats(dh, 8));
    for (int k = 0; k < 2; k++)
        O[k] = calloc(nq, 4), lse[k] = calloc((size_t)B * Hq * T, 4), dQ[k] = calloc(nq, 4), dK[k] = calloc(nk, 4),
        dV[k] = calloc(nk, 4);
    g->flash_attention_forward(O[0], lse[0], Q, K, Vv, B, T, Hq, Hkv, dh, 0, work, 8);
    g->flash_attention_backward(dQ[0], dK[0], dV[0], dO, O[0], lse[0], Q, K, Vv, B, T, Hq, Hkv, dh, 0, work, 8);
    for (int l = ZY_CPU_AVX2; l < ZY_CPU_LEVELS; l++) {
        if (!zy_cpu_supports(&ci, (ZyCpuLevel)l)) continue;
        const ZyKernelTable *t = zy_kernel_table((ZyCpuLevel)l);
        memset(dQ[1], 0, nq * 4), memset(dK[1], 0, nk * 4), memset(dV[1], 0, nk * 4);
        t->flash_attention_forward(O[1], lse[1], Q, K, Vv, B, T, Hq, Hkv, dh, 0, work, 8);
        t->flash_attention_backward(dQ[1], dK[1], dV[1], dO, O[1], lse[1], Q, K, Vv, B, T, Hq, Hkv, dh, 0, work, 8);
        const double e[] = {max_err(O[1], O[0], nq), max_err(dQ[1], dQ[0], nq), max_err(dK[1], dK[0], nk),
                            max_err(dV[1], dV[0], nk)};
        printf("    %s vs generic: attention O %.2g, dQ %.2g, dK %.2g, dV %.2g\n", t->level, e[0], e[1], e[2], e[3]);
        for (size_t i = 0; i < ZY_ARRAY_LEN(e); i++) CHECK_MSG(e[i] < 1e-5, "%s: attention %zu: %.3g", t->level, i, e[i]);
    }
    /* bf16 rounding of a row (the bf16 products' input): every level bit-identical to zy_f32_to_bf16, specials
     * included (ties to even, NaN kept quiet, infinities, denormals, the largest finite values rounding to inf) */
    enum { NR = 4099 };
    float *src = randn_f(&rng, NR, 1.0);
    uint16_t want[NR], got[NR];
    const uint32_t special[] = {0x3f808000u, 0x3f818000u, 0x7fc00001u, 0xff800001u, 0x7f800000u, 0xff800000u,
                                0x00000001u, 0x807fffffu, 0x7f7fffffu, 0xff7fffffu, 0x00000000u, 0x80000000u};
    for (size_t i = 0; i < ZY_ARRAY_LEN(special); i++) memcpy(src + 7 * i, &special[i], 4);
    for (int i = 0; i < NR; i++) want[i] = zy_f32_to_bf16(src[i]);
    for (int l = 0; l < ZY_CPU_LEVELS; l++) {
        if (!zy_cpu_supports(&ci, (ZyCpuLevel)l)) continue;
        memset(got, 0, sizeof got);
        zy_kernel_table((ZyCpuLevel)l)->f32_to_bf16_row(got, src, NR);
        CHECK_MSG(memcmp(got, want, sizeof got) == 0, "%s: f32_to_bf16_row differs from zy_f32_to_bf16",
                  zy_cpu_level_name((ZyCpuLevel)l));
    }
    free(src);
    printf("    levels compared with generic on this CPU: %d (best: %s)\n", levels,
           zy_cpu_level_name(zy_cpu_best_level(&ci)));
    for (int k = 0; k < 2; k++)
        free(y[k]), free(rstd[k]), free(act[k]), free(gel[k]), free(dl[k]), free(rl[k]), free(O[k]), free(lse[k]),
            free(dQ[k]), free(dK[k]), free(dV[k]);
    free(x), free(w), free(gu), free(logits), free(Q), free(K), free(Vv), free(dO), free(work);
}

/* One level's results on a small model: logits, loss, every gradient, decoded logits (fp32 and bf16 weights). */
typedef struct {
    float *logits, *grad, *dec, *dec16;
    double loss;
} ModelRun;

/* bf16: "precision": "bf16" products; decode: also the cached decoding, fp32 then bf16 weights (else dec* NULL).
 * Vector parameters are randomised only with decode (the level comparison), so the two uses differ in data too. */
static int run_model_at(ZyCpuLevel level, int bf16, int decode, const ZayaConfig *c, const int32_t *tokens, int B,
                        int T, ModelRun *out) {
    zy_cpu_set_level(level);
    Model m;
    Activations a;
    ZyErr err;
    if (config_validate(c, "test", &err) || model_create(&m, c, &err) || acts_create(&a, c, B, T, &err)) {
        fprintf(stderr, "    %s\n", err.msg);
        return -1;
    }
    acts_set_bf16(&a, bf16 ? ZY_BF16_PRODUCTS_ONEDNN : ZY_BF16_PRODUCTS_FP32); /* oneDNN where it runs, else sgemm */
    model_init_weights(&m, 5);
    ZyRng rng;
    zy_rng_seed(&rng, 9); /* every vector parameter away from its initial constant, so each path matters */
    for (int i = 0; i < m.params.count && decode; i++)
        if (m.params.info[i].ndim == 1)
            for (size_t k = 0; k < m.params.info[i].numel; k++)
                m.params.data[m.params.info[i].offset + k] += (float)(0.1 * zy_rng_normal(&rng));
    const int N = B * T, V = c->vocab_size;
    int32_t *targets = malloc(sizeof(int32_t) * N);
    make_next_token_targets(targets, tokens, B, T);
    model_forward(&m, &a, tokens);
    out->logits = malloc(sizeof(float) * N * V);
    memcpy(out->logits, a.logits, sizeof(float) * N * V);
    memset(m.params.grad, 0, sizeof(float) * m.params.total);
    out->loss = model_backward(&m, &a, targets);
    out->grad = malloc(sizeof(float) * m.params.total);
    memcpy(out->grad, m.params.grad, sizeof(float) * m.params.total);
    out->dec = out->dec16 = NULL;
    int rc = 0;
    if (decode) { /* cached decoding of the first sequence, one token at a time, then the same with bf16 weights */
        KVCache kc;
        out->dec = malloc(sizeof(float) * T * V), out->dec16 = malloc(sizeof(float) * T * V);
        rc = kvcache_create(&kc, c, 1, T, &err);
        for (int t = 0; rc == 0 && t < T; t++)
            rc = model_decode(&m, &kc, tokens + t, 1, out->dec + (long)t * V, 0, &err);
        if (rc == 0) rc = model_use_bf16(&m, &err) < 0 ? -1 : 0;
        kvcache_reset(&kc);
        for (int t = 0; rc == 0 && t < T; t++)
            rc = model_decode(&m, &kc, tokens + t, 1, out->dec16 + (long)t * V, 0, &err);
        kvcache_free(&kc);
        if (rc) fprintf(stderr, "    %s: %s\n", zy_cpu_level_name(level), err.msg);
    }
    free(targets);
    acts_free(&a);
    model_free(&m);
    return rc;
}

TEST(model_at_every_level_matches_generic) {
    ZyCpuInfo ci;
    zy_cpu_detect(&ci);
    const ZyCpuLevel keep = zy_cpu_level();
    /* dims off the vector widths; several experts so routing is exercised */
    ZayaConfig c = {.vocab_size = 203, .hidden_size = 40, .num_layers = 2, .num_heads = 4, .num_kv_heads = 2,
                    .head_dim = 12, .num_experts = 4, .moe_intermediate_size = 24, .router_hidden_size = 12,
                    .cca_time0 = 2, .cca_time1 = 2, .rms_norm_eps = 1e-5f, .tie_word_embeddings = 0,
                    .max_position_embeddings = 128, .rope_theta = 10000.0f, .partial_rotary_factor = 0.5f,
                    .initializer_range = 0.2f, .bos_token_id = 2, .eos_token_id = 1, .pad_token_id = 0};
    const int B = 2, T = 70;
    int32_t tokens[140];
    ZyRng rng;
    zy_rng_seed(&rng, 31);
    for (int i = 0; i < B * T; i++) tokens[i] = 3 + (int32_t)(zy_rng_next(&rng) % 200);
    ModelRun ref, run;
    REQUIRE(run_model_at(ZY_CPU_GENERIC, 0, 1, &c, tokens, B, T, &ref) == 0);
    Model probe;
    ZyErr err;
    REQUIRE(model_create(&probe, &c, &err) == 0);
    const size_t P = probe.params.total;
    model_free(&probe);
    const long NV = (long)B * T * c.vocab_size, TV = (long)T * c.vocab_size;
    for (int l = ZY_CPU_AVX2; l < ZY_CPU_LEVELS; l++) {
        if (!zy_cpu_supports(&ci, (ZyCpuLevel)l)) continue;
        REQUIRE(run_model_at((ZyCpuLevel)l, 0, 1, &c, tokens, B, T, &run) == 0);
        /* gradients: normwise over the arena (elementwise is dominated by entries that are ~0) */
        double num = 0, den = 0;
        for (size_t i = 0; i < P; i++) {
            const double d = (double)run.grad[i] - ref.grad[i];
            num += d * d, den += (double)ref.grad[i] * ref.grad[i];
        }
        const double e_logits = max_err(run.logits, ref.logits, NV), e_loss = fabs(run.loss - ref.loss);
        const double e_grad = sqrt(num / (den > 0 ? den : 1)), e_dec = max_err(run.dec, ref.dec, TV);
        /* bf16 decoding: at avx512bf16 the activations are rounded to bf16 as well (vdpbf16ps), elsewhere not */
        const double e_dec16 = max_err(run.dec16, ref.dec16, TV);
        const double tol16 = l == ZY_CPU_AVX512BF16 ? 5e-2 : 1e-5;
        printf("    %s vs generic: logits %.2g, loss %.2g, gradients (normwise) %.2g, decode %.2g, bf16 decode %.2g\n",
               zy_cpu_level_name((ZyCpuLevel)l), e_logits, e_loss, e_grad, e_dec, e_dec16);
        CHECK_MSG(e_logits < 1e-5 && e_loss < 1e-6 && e_grad < 1e-5 && e_dec < 1e-5 && e_dec16 < tol16,
                  "%s: logits %.3g loss %.3g grad %.3g decode %.3g bf16 decode %.3g", zy_cpu_level_name((ZyCpuLevel)l),
                  e_logits, e_loss, e_grad, e_dec, e_dec16);
        free(run.logits), free(run.grad), free(run.dec), free(run.dec16);
    }
    free(ref.logits), free(ref.grad), free(ref.dec), free(ref.dec16);
    zy_cpu_set_level(keep);
}

static double normwise(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]), den += (double)b[i] * b[i];
    return sqrt(num / (den > 0 ? den : 1));
}

/* "precision": "bf16": forward and backward with bf16 inputs to the matrix products, at the process's level (oneDNN
 * on an avx512bf16 CPU) and through the sgemm fallback: deterministic (two runs, the same bits), close to fp32
 * (bf16 keeps 8 significant bits: logits and gradients within a few per cent), and the two paths close to each
 * other (the same rounded products, summed in another order). */
TEST(model_bf16_products_are_deterministic_and_close_to_fp32) {
    const ZyCpuLevel keep = zy_cpu_level();
    ZayaConfig c = {.vocab_size = 300, .hidden_size = 64, .num_layers = 2, .num_heads = 4, .num_kv_heads = 2,
                    .head_dim = 16, .num_experts = 4, .moe_intermediate_size = 48, .router_hidden_size = 32,
                    .cca_time0 = 2, .cca_time1 = 2, .rms_norm_eps = 1e-5f, .tie_word_embeddings = 1,
                    .max_position_embeddings = 128, .rope_theta = 10000.0f, .partial_rotary_factor = 0.5f,
                    .initializer_range = 0.1f, .bos_token_id = 2, .eos_token_id = 1, .pad_token_id = 0};
    const int B = 3, T = 50;
    int32_t tokens[150];
    ZyRng rng;
    zy_rng_seed(&rng, 41);
    for (int i = 0; i < B * T; i++) tokens[i] = 3 + (int32_t)(zy_rng_next(&rng) % 290);
    const ZyCpuLevel fallback = keep >= ZY_CPU_AVX512BF16 ? ZY_CPU_AVX512 : keep;
    ModelRun f32, b1, b2, bf;
    REQUIRE(run_model_at(keep, 0, 0, &c, tokens, B, T, &f32) == 0);
    REQUIRE(run_model_at(keep, 1, 0, &c, tokens, B, T, &b1) == 0);
    REQUIRE(run_model_at(keep, 1, 0, &c, tokens, B, T, &b2) == 0);
    REQUIRE(run_model_at(fallback, 1, 0, &c, tokens, B, T, &bf) == 0);
    zy_cpu_set_level(keep);
    Model probe;
    ZyErr err;
    REQUIRE(model_create(&probe, &c, &err) == 0);
    const size_t P = probe.params.total, NV = (size_t)B * T * c.vocab_size;
    model_free(&probe);
    const double logits16 = normwise(b1.logits, f32.logits, NV), grads16 = normwise(b1.grad, f32.grad, P);
    const double paths_l = normwise(bf.logits, b1.logits, NV), paths_g = normwise(bf.grad, b1.grad, P);
    printf("    bf16 vs fp32 (normwise): logits %.2g, loss %.6f vs %.6f, gradients %.2g; %s vs sgemm fallback: "
           "logits %.2g, gradients %.2g\n",
           logits16, b1.loss, f32.loss, grads16, zy_cpu_level_name(keep), paths_l, paths_g);
    CHECK(memcmp(b1.logits, b2.logits, sizeof(float) * NV) == 0 && memcmp(b1.grad, b2.grad, sizeof(float) * P) == 0 &&
          b1.loss == b2.loss);
    CHECK(memcmp(b1.logits, f32.logits, sizeof(float) * NV) != 0); /* bf16 really ran */
    CHECK_MSG(logits16 < 5e-2 && grads16 < 5e-2 && fabs(b1.loss - f32.loss) < 1e-2 * f32.loss,
              "bf16 vs fp32: logits %.3g gradients %.3g", logits16, grads16);
    /* Both paths sum the same exact bf16 products, in different orders (fp32 differences ~1e-7), but every later
     * product rounds its input to bf16 again, so an activation sitting at a rounding boundary moves by a whole bf16
     * ulp (2^-8): through two layers that reaches ~1e-4 (1.4e-4 measured with oneDNN's AVX512-BF16 kernels on an
     * AMD EPYC VM with avx512_bf16). A wrong path differs like bf16 from fp32 (~3e-2), far above these bounds. */
    CHECK_MSG(paths_l < 5e-4 && paths_g < 2e-3, "oneDNN vs fallback: logits %.3g gradients %.3g", paths_l, paths_g);
    ModelRun *runs[] = {&f32, &b1, &b2, &bf};
    for (int i = 0; i < 4; i++) free(runs[i]->logits), free(runs[i]->grad);
}
