/* The ZAYA1 model on a GPU (docs/model.md), step for step the same as src/model/model.c: the forward and the backward
 * below read like their CPU twins, each op a gk_ kernel (gpu_kernels.h) or a cuBLASLt product (gpu_gemm).
 *
 * Host synchronisation: none inside a pass in bf16 runs, whose experts' products are grouped GEMMs sized on the device
 * (gpu_expert_gemm.cu). fp32 runs (and GPUs before sm_80) take one cuBLASLt product per expert and so copy each MoE
 * layer's row offsets (E + 1 integers) to the host once a pass. */
#include "gpu/gpu_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/gpu.h"
#include "gpu/gpu_model_internal.h"
#include "gpu/gpu_weight_upload.h"
#include "kernels/kernels.h"

/* Phase timing (zaya bench train's breakdown): the queue is drained at each phase boundary, so it costs speed and is
 * off in training. */
double gpu_tick(GpuModel *gm) {
    if (!gm->tm) return 0;
    ZyErr ignore;
    gpu_sync(&gm->g, "phase timing", &ignore);
    return zy_now_seconds();
}
void gpu_tock(GpuModel *gm, ModelPhase phase, double *t0) {
    if (!gm->tm) return;
    double now = gpu_tick(gm);
    gm->tm[phase] += now - *t0;
    *t0 = now;
}

void gpu_model_set_timing(GpuModel *gm, double *phase_seconds) { gm->tm = phase_seconds; }

/* ---- products ------------------------------------------------------------------------------------------- */

static void fail_once(GpuModel *gm, const ZyErr *e) {
    if (!gm->failed) gm->err = *e, gm->failed = 1;
}

/* C = A Wᵀ (A [M, K] with row stride lda, W [N, K]): a linear layer's forward, as zy_matmul_wt_ctx. */
void gpu_mm_wt(GpuModel *gm, int M, int N, int K, const float *A, int lda, const float *W, const uint16_t *W16,
                  float *C, int ldc) {
    ZyErr e;
    if (gpu_gemm(&gm->g, 0, 1, M, N, K, 1.0f, A, NULL, lda, W, W16, K, 0.0f, C, ldc, &e)) fail_once(gm, &e);
}

/* bf16 runs on sm_80+ (bf16 tensor cores) take the convolution's products on them unless ZAYA_GPU_CONV=fp32. */
static int conv_tc(const GpuModel *gm) { return gm->bf16 && gm->conv_tc && gm->g.cc_major >= 8; }

void gpu_cca_conv_forward(GpuModel *gm, const LayerWeights *W, float *Y, float *M, const float *X, int B, int T) {
    const ZayaConfig *c = &gm->cfg;
    const int C = cfg_conv_channels(c), dh = c->head_dim;
    (conv_tc(gm) ? gk_cca_conv_forward_bf16 : gk_cca_conv_forward)(gm->g.stream, Y, M, X, W->conv_dw_w, W->conv_dw_b,
                                                                   W->conv_gr_w, W->conv_gr_b, B, T, C, dh,
                                                                   c->cca_time0, c->cca_time1);
}

/* The general product, A16 / B16 the operands' bf16 views or NULL (the product then rounds its own copy), as
 * zy_gemm_ctx_w / zy_gemm_ctx_ex. */
static void mm16(GpuModel *gm, int ta, int tb, int M, int N, int K, const float *A, const uint16_t *A16, int lda,
                 const float *B, const uint16_t *B16, int ldb, float beta, float *C, int ldc) {
    ZyErr e;
    if (gpu_gemm(&gm->g, ta, tb, M, N, K, 1.0f, A, A16, lda, B, B16, ldb, beta, C, ldc, &e)) fail_once(gm, &e);
}
/* gpu_mm_wt with A's bf16 view (or NULL). */
static void mm_wt16(GpuModel *gm, int M, int N, int K, const float *A, const uint16_t *A16, int lda, const float *W,
                    const uint16_t *W16, float *C, int ldc) {
    mm16(gm, 0, 1, M, N, K, A, A16, lda, W, W16, K, 0.0f, C, ldc);
}

/* bf16 runs: op16[which] = bf16(x[0, rows·ld)) (nearest even, gk_f32_to_bf16), for an activation that several
 * products read (the inputs of the q/k/v projections, the experts' rows, an output gradient used by both the input-
 * and the weight-gradient products): one rounding pass instead of one per product, with the same bf16 values, so the
 * products give the same bits. NULL in fp32 runs or when it does not fit (a model sized for fewer rows, as cached
 * decoding's): each product then rounds its own copy, as before. The buffer is reused by the next op16 of the same
 * slot: stream order keeps the products queued before that reading the old values. */
static const uint16_t *op16(GpuModel *gm, int which, const float *x, size_t rows, size_t ld) {
    const size_t n = rows * ld;
    if (!gm->bf16 || !gm->op16[which] || n == 0 || n > gm->op16_elems) return NULL;
    gk_f32_to_bf16(gm->g.stream, gm->op16[which], x, (long)n);
    return gm->op16[which];
}
/* Decoding's steps in bf16 runs: up to GK_SKINNY_ROWS rows, weights in the bf16 arena (ZAYA_GPU_FEW_ROWS=off: never). */
static int few_rows(const GpuModel *gm, int M) {
    return gm->few_rows && gm->bf16 && gm->params16 && M >= 1 && M <= GK_SKINNY_ROWS;
}

void gpu_mm_wt_rows(GpuModel *gm, int M, int K, const float *A, int lda, const GpuLinear *p, int n) {
    if (few_rows(gm, M) && n <= GK_SKINNY_OUTS) {
        GkSkinnyOut outs[GK_SKINNY_OUTS];
        int ok = 1;
        for (int j = 0; j < n; j++) {
            outs[j] = (GkSkinnyOut){.w = gpu_bf16_of(gm, p[j].w), .y = p[j].y, .n = p[j].n, .ldy = p[j].ldy,
                                    .bias = p[j].bias};
            ok = ok && outs[j].w;
        }
        if (ok && gk_skinny_mm(gm->g.stream, A, lda, M, K, outs, n) == 0) return;
    }
    /* bf16 runs: A rounded once for all n products where op16's buffer holds it (else each product rounds it) */
    const uint16_t *A16 = n > 1 ? op16(gm, 0, A, (size_t)M, (size_t)lda) : NULL;
    for (int j = 0; j < n; j++) {
        mm_wt16(gm, M, p[j].n, K, A, A16, lda, p[j].w, gpu_bf16_of(gm, p[j].w), p[j].y, p[j].ldy);
        if (p[j].bias) {
            if (p[j].ldy == p[j].n)
                gk_bias_gelu_forward(gm->g.stream, p[j].y, p[j].y, p[j].bias, M, p[j].n);
            else
                for (int r = 0; r < M; r++)
                    gk_bias_gelu_forward(gm->g.stream, p[j].y + (size_t)r * p[j].ldy, p[j].y + (size_t)r * p[j].ldy,
                                         p[j].bias, 1, p[j].n);
        }
    }
}

/* p16 + off when p16 is set. */
static const uint16_t *at16(const uint16_t *p16, size_t off) { return p16 ? p16 + off : NULL; }

const uint16_t *gpu_bf16_of(const GpuModel *gm, const float *w) {
    return gm->params16 && w ? gm->params16 + (w - gm->params) : NULL;
}

const uint16_t *gpu_embed16(const GpuModel *gm) { return gm->bf16 && !gm->grads ? gpu_bf16_of(gm, gm->w.embed) : NULL; }

void gpu_zero(GpuModel *gm, void *p, size_t floats) { gpu_memset_async(&gm->g, p, 0, floats * sizeof(float)); }

/* ---- set-up --------------------------------------------------------------------------------------------- */

static size_t operand_width(const ZayaConfig *c);
static void lean_arena(GpuModel *gm, const Model *m);

static void bind_plain_residuals(GpuModel *gm) {
    for (int l = 0; l < gm->cfg.num_layers; l++) {
        LayerWeights *W = &gm->w.layers[l], *G = &gm->gw.layers[l];
        W->attn_hs = W->attn_rs = W->mlp_hs = W->mlp_rs = gm->unit_scale;
        W->attn_hb = W->attn_rb = W->mlp_hb = W->mlp_rb = gm->zero_bias;
        G->attn_hs = G->attn_rs = G->mlp_hs = G->mlp_rs = gm->merge_grad_sink;
        G->attn_hb = G->attn_rb = G->mlp_hb = G->mlp_rb = gm->merge_grad_sink;
    }
}

int gpu_model_set_shape(GpuModel *gm, int B, int T, ZyErr *err) {
    if (gm->acts_block && gm->a.B == B && gm->a.T == T) return 0;
    if (B <= 0 || T <= 0) return zy_fail(err, "batch shape [%d, %d] must be positive", B, T);
    gpu_sync(&gm->g, "resizing activations", err);
    gpu_graph_free(gm->micro_graph); /* it points into the buffers freed here */
    gm->micro_graph = NULL;
    gpu_free(gm->acts_block), gpu_free(gm->targets), gpu_free(gm->plan);
    gpu_free(gm->op16[0]), gpu_free(gm->op16[1]);
    free(gm->h_plan), free(gm->h_tokens);
    gm->acts_block = NULL, gm->targets = NULL, gm->plan = NULL, gm->h_plan = NULL, gm->h_tokens = NULL;
    gm->op16[0] = gm->op16[1] = NULL, gm->op16_elems = 0;
    LayerActs *layers = gm->a.layers;
    memset(&gm->a, 0, sizeof gm->a);
    gm->a.layers = layers;
    gm->a.B = B, gm->a.T = T;
    gm->a.gpu_attn_work_floats = gk_flash_attention_work_floats(B, T, gm->cfg.num_heads);
    if (gm->bf16) { /* bf16 runs take the tensor-core attention (gpu_attention_tc.cu): its scratch, or the fp32 one */
        const long w16 = gk_flash_attention_bf16_work_floats(B, T, gm->cfg.num_heads, gm->cfg.num_kv_heads,
                                                             gm->cfg.head_dim);
        if (w16 > gm->a.gpu_attn_work_floats) gm->a.gpu_attn_work_floats = w16;
    }
    if (gm->a.gpu_attn_work_floats <= 0) gm->a.gpu_attn_work_floats = 1;
    const size_t N = (size_t)B * T;
    gm->acts_bytes = acts_carve(&gm->a, &gm->cfg, NULL);
    if (!(gm->acts_block = gpu_alloc(gm->acts_bytes, "activations", err)))
        return zy_wrap(err, "batch [%d, %d]", B, T);
    acts_carve(&gm->a, &gm->cfg, gm->acts_block);
    gm->targets = gpu_alloc(N * sizeof(int32_t), "targets", err);
    gm->plan = gpu_alloc((3 * N + 2) * sizeof(int32_t), "the embedding-gradient plan", err);
    gm->h_plan = malloc((3 * N + 2) * sizeof(int32_t));
    gm->h_tokens = malloc(N * sizeof(int32_t));
    if (!gm->targets || !gm->plan) return -1;
    if (!gm->h_plan || !gm->h_tokens) return zy_fail(err, "out of memory");
    /* RoPE tables, built on the host exactly as the CPU builds them */
    const int rd = cfg_rotary_dim(&gm->cfg);
    const size_t nt = (size_t)T * (rd / 2);
    float *cs = malloc((2 * nt + 1) * sizeof(float));
    if (!cs) return zy_fail(err, "out of memory");
    rope_tables(cs, cs + nt, T, rd, gm->cfg.rope_theta);
    int rc = gpu_upload(&gm->g, gm->a.rope_cos, cs, nt * sizeof(float), err) ||
             gpu_upload(&gm->g, gm->a.rope_sin, cs + nt, nt * sizeof(float), err);
    free(cs);
    if (rc) return -1;
    if (gm->a.rope_cos_sliding) { /* the sliding-window layers' own RoPE (acts_carve places them when there are any) */
        const int rds = cfg_sliding_rotary_dim(&gm->cfg);
        const size_t nts = (size_t)T * (rds / 2);
        float *ss = malloc((2 * nts + 1) * sizeof(float));
        if (!ss) return zy_fail(err, "out of memory");
        rope_tables(ss, ss + nts, T, rds, gm->cfg.rope_theta_sliding);
        rc = gpu_upload(&gm->g, gm->a.rope_cos_sliding, ss, nts * sizeof(float), err) ||
             gpu_upload(&gm->g, gm->a.rope_sin_sliding, ss + nts, nts * sizeof(float), err);
        free(ss);
        if (rc) return -1;
    }
    /* the largest bf16 operand a product converts: activations of N rows by the widest layer (or the logits) */
    const size_t act = operand_width(&gm->cfg), V = (size_t)gm->cfg.vocab_size;
    if (gm->bf16 && gpu_reserve_scratch(&gm->g, N * (V > act ? V : act), err)) return -1;
    return gm->bf16 ? gpu_model_reserve_operands(gm, N, err) : 0; /* op16's two buffers */
}

/* The widest activation a product reads (not the logits): op16's row width. */
static size_t operand_width(const ZayaConfig *c) {
    const size_t cands[] = {(size_t)c->hidden_size, (size_t)cfg_conv_channels(c), 2 * (size_t)c->moe_intermediate_size,
                            (size_t)c->router_hidden_size};
    size_t act = 0;
    for (size_t i = 0; i < sizeof cands / sizeof *cands; i++) act = cands[i] > act ? cands[i] : act;
    return act;
}

int gpu_model_reserve_operands(GpuModel *gm, size_t rows, ZyErr *err) {
    const size_t need = rows * operand_width(&gm->cfg);
    if (!gm->bf16 || need <= gm->op16_elems) return 0;
    if (gpu_sync(&gm->g, "resizing the bf16 operand buffers", err)) return -1; /* queued products may read them */
    gpu_free(gm->op16[0]), gpu_free(gm->op16[1]);
    gm->op16[0] = gm->op16[1] = NULL, gm->op16_elems = 0;
    for (int i = 0; i < 2; i++)
        if (!(gm->op16[i] = gpu_alloc(need * sizeof(uint16_t), "bf16 activation operands", err))) return -1;
    gm->op16_elems = need;
    return 0;
}

int gpu_model_create(GpuModel **out, const Model *m, int device, int B, int T, int bf16, int train, ZyErr *err) {
    *out = NULL;
    const char *experts = getenv("ZAYA_GPU_EXPERTS"); /* grouped (default) | loop: see experts_grouped */
    if (experts && strcmp(experts, "grouped") && strcmp(experts, "loop"))
        return zy_fail(err, "ZAYA_GPU_EXPERTS=%s: expected grouped (one product for all experts) or loop (one per expert)",
                       experts);
    /* auto (default) | sm90 | async | staged: the grouped products' form (gk_expert_kernel) */
    const char *form = getenv("ZAYA_GPU_EXPERT_KERNEL");
    if (form && strcmp(form, "auto") && strcmp(form, "sm90") && strcmp(form, "async") && strcmp(form, "staged"))
        return zy_fail(err, "ZAYA_GPU_EXPERT_KERNEL=%s: expected auto (sm90 where it can run, else async), sm90 "
                       "(CUTLASS's wgmma + TMA grouped GEMM, H100/H200), async (cp.async into a ring of shared tiles) or "
                       "staged (loads through registers)", form);
    gk_expert_kernel(!form || !strcmp(form, "auto") || !strcmp(form, "sm90") ? GK_EXPERT_SM90
                     : !strcmp(form, "async")                                 ? GK_EXPERT_ASYNC
                                                                              : GK_EXPERT_STAGED);
    const char *conv = getenv("ZAYA_GPU_CONV"); /* tc (default) | fp32: bf16 runs' grouped convolution (gpu_conv_tc) */
    if (conv && strcmp(conv, "tc") && strcmp(conv, "fp32"))
        return zy_fail(err, "ZAYA_GPU_CONV=%s: expected tc (bf16 runs: the CCA convolution's products on tensor "
                       "cores) or fp32 (the fp32 kernels, as fp32 runs)", conv);
    /* on (default) | off: bf16 runs' sliding-window layers on the tensor-core attention (never run on a GPU yet) */
    const char *window_tc = getenv("ZAYA_GPU_WINDOW_TC");
    if (window_tc && strcmp(window_tc, "on") && strcmp(window_tc, "off"))
        return zy_fail(err, "ZAYA_GPU_WINDOW_TC=%s: expected on (bf16 runs: sliding-window layers on the tensor-core "
                       "attention) or off (the fp32 kernels, as fp32 runs)", window_tc);
    const char *few = getenv("ZAYA_GPU_FEW_ROWS"); /* on (default) | off: decoding's few-row products (gpu_mm_wt_rows) */
    if (few && strcmp(few, "on") && strcmp(few, "off"))
        return zy_fail(err, "ZAYA_GPU_FEW_ROWS=%s: expected on (decoding's steps of up to %d rows through the few-row "
                       "products) or off (cuBLASLt and the grouped experts, as longer passes)", few, GK_SKINNY_ROWS);
    const char *pdl = getenv("ZAYA_GPU_PDL"); /* on (default) | off: gk_programmatic_launch */
    if (pdl && strcmp(pdl, "on") && strcmp(pdl, "off"))
        return zy_fail(err, "ZAYA_GPU_PDL=%s: expected on (a decoding step's small kernels launched to overlap the one "
                       "before them, on sm_90 and newer) or off (every kernel waits for the one before to end)", pdl);
    const char *arena = getenv("ZAYA_GPU_ARENA"); /* lean (default) | full: a bf16 inference model's fp32 arena */
    if (arena && strcmp(arena, "lean") && strcmp(arena, "full"))
        return zy_fail(err, "ZAYA_GPU_ARENA=%s: expected lean (bf16 inference keeps fp32 copies only of what fp32 "
                       "kernels read: norms, biases, convolutions; the default) or full (every tensor "
                       "in fp32 and bf16, as training)", arena);
    const char *layer = getenv("ZAYA_GPU_DECODE_LAYER"); /* launches (default) | persistent: gk_decode_layers */
    if (layer && strcmp(layer, "launches") && strcmp(layer, "persistent"))
        return zy_fail(err, "ZAYA_GPU_DECODE_LAYER=%s: expected launches (a decoding step's layer as its dozen kernels, "
                       "the default) or persistent (the layers of a bf16 step of up to %d one-token rows as one "
                       "cooperative kernel)", layer, GK_DECODE_LAYER_ROWS);
    int graphs = 0;
    if (gpu_graphs_requested(&graphs, err)) return -1;
    GpuModel *gm = calloc(1, sizeof *gm);
    if (!gm) return zy_fail(err, "out of memory");
    gm->graphs = graphs && train; /* the training passes' graphs; decoding's pool reads the switch itself */
    gm->decode_layer_persistent = layer && !strcmp(layer, "persistent");
    gm->experts_grouped = !experts || !strcmp(experts, "grouped");
    gm->few_rows = !few || !strcmp(few, "on");
    gm->conv_tc = !conv || !strcmp(conv, "tc");
    gm->window_tc = !window_tc || !strcmp(window_tc, "on");
    gm->host = m;
    gm->cfg = m->cfg;
    gm->bf16 = bf16;
    const ZayaConfig *c = &m->cfg;
    if (gpu_open(&gm->g, device, err)) {
        free(gm);
        return -1;
    }
    gm->g.bf16 = bf16;
    const char *attn = getenv("ZAYA_GPU_ATTENTION"); /* own (default) | cudnn | auto */
    if (attn && strcmp(attn, "own") && strcmp(attn, "cudnn") && strcmp(attn, "auto")) {
        gpu_close(&gm->g);
        free(gm);
        return zy_fail(err, "ZAYA_GPU_ATTENTION=%s: expected own (zaya's flash attention kernels), cudnn (cuDNN's fused "
                       "SDPA, bf16 runs; an error where it cannot load) or auto (cuDNN where it loads)", attn);
    }
    gm->attn_cudnn = attn && strcmp(attn, "own");
    if (attn && !strcmp(attn, "cudnn") && !gk_cudnn_attention_available()) {
        const char *why = gk_cudnn_attention_status();
        gpu_close(&gm->g);
        free(gm);
        return zy_fail(err, "ZAYA_GPU_ATTENTION=cudnn: %s (docs/gpus.md: installing cuDNN)", why);
    }
    if (form && !strcmp(form, "sm90") && !gk_expert_sm90_ready()) {
        gpu_close(&gm->g);
        free(gm);
        return zy_fail(err, "ZAYA_GPU_EXPERT_KERNEL=sm90 needs an sm_90 GPU (H100, H200) and a build with CUTLASS's "
                       "headers (scripts/install-deps.sh installs them where nvcc is; docs/gpus.md)");
    }
    gk_programmatic_launch(!pdl || !strcmp(pdl, "on")); /* after gpu_open: it asks the current device */
    snprintf(gm->device_line, sizeof gm->device_line, "%s, sm_%d%d, %d SMs, %.1f GiB", gm->g.name, gm->g.cc_major,
             gm->g.cc_minor, gm->g.sm_count, gm->g.mem_total / 1073741824.0);
    const size_t total = m->params.total;
    gm->w.layers = calloc((size_t)c->num_layers, sizeof(LayerWeights));
    gm->gw.layers = calloc((size_t)c->num_layers, sizeof(LayerWeights));
    gm->a.layers = calloc((size_t)c->num_layers, sizeof(LayerActs));
    const int E1 = c->num_experts + 1;
    gm->h_off = calloc((size_t)c->num_layers * E1, sizeof(int32_t));
    gm->h_work = malloc((size_t)c->vocab_size * sizeof(int32_t));
    gm->attn_ran_cudnn = calloc((size_t)c->num_layers, 1);
    if (!gm->w.layers || !gm->gw.layers || !gm->a.layers || !gm->h_off || !gm->h_work ||
        !gm->attn_ran_cudnn) {
        gpu_model_free(gm);
        return zy_fail(err, "out of memory");
    }
    /* bf16 inference: the matrices' fp32 copies are never read (every product takes the bf16 arena), so the fp32
     * arena keeps its layout but holds only the rest (where the driver has sparse ranges; else all of it) */
    if (!train && bf16 && !(arena && !strcmp(arena, "full"))) lean_arena(gm, m);
    if ((!gm->params && !(gm->params = gpu_alloc(total * sizeof(float), "parameters", err))) ||
        (train && !(gm->grads = gpu_alloc(total * sizeof(float), "gradients", err))) ||
        /* a model without the fp32 arena uploads its bf16 matrices here first (gpu_model_upload) */
        ((bf16 || !gpu_weights_in_one_arena(m)) &&
         !(gm->params16 = gpu_alloc(total * sizeof(uint16_t), "bf16 weights", err))) ||
        !(gm->loss_sum = gpu_alloc(sizeof(double), "the loss accumulator", err)) ||
        !(gm->loss_scale = gpu_alloc(sizeof(float), "the loss scale", err)) ||
        !(gm->loss_valid = gpu_alloc(sizeof(int32_t), "the loss's target count", err))) {
        gpu_model_free(gm);
        return -1;
    }
    gpu_memset_async(&gm->g, gm->loss_sum, 0, sizeof(double));
    model_bind_weights(m, gm->params, &gm->w);
    if (gm->grads) model_bind_weights(m, gm->grads, &gm->gw);
    if (c->no_residual_scaling) {
        const size_t D = (size_t)c->hidden_size;
        float *ones = malloc(D * sizeof(float));
        gm->unit_scale = gpu_alloc(D * sizeof(float), "residual constants", err);
        gm->zero_bias = gpu_alloc(D * sizeof(float), "residual constants", err);
        gm->merge_grad_sink = gpu_alloc(D * sizeof(float), "residual constants", err);
        int bad = !ones || !gm->unit_scale || !gm->zero_bias || !gm->merge_grad_sink;
        if (!bad) {
            for (size_t i = 0; i < D; i++) ones[i] = 1.0f;
            bad = gpu_upload(&gm->g, gm->unit_scale, ones, D * sizeof(float), err);
        }
        free(ones);
        if (bad) {
            gpu_model_free(gm);
            return -1;
        }
        bind_plain_residuals(gm);
    }
    if (gpu_model_upload(gm, m, err) || gpu_model_set_shape(gm, B, T, err)) {
        gpu_model_free(gm);
        return -1;
    }
    /* the sm90 expert products' device memory now, not at a first product inside a captured graph */
    if (bf16 && c->num_experts > 0 && gk_expert_sm90_ready()) gk_expert_sm90_reserve(gm->g.stream, c->num_experts);
    if (!bf16 && gm->params16) { /* fp32 products: the bf16 arena was only the upload's way in */
        gpu_free(gm->params16);
        gm->params16 = NULL;
    }
    *out = gm;
    return 0;
}

void gpu_model_free(GpuModel *gm) {
    if (!gm) return;
    if (gm->g.stream) {
        ZyErr ignore;
        gpu_sync(&gm->g, "freeing the model", &ignore);
    }
    gpu_graph_free(gm->micro_graph);
    if (gm->params_sparse)
        gpu_sparse_free(gm->params_sparse);
    else
        gpu_free(gm->params);
    free(gm->fp32_ranges);
    gpu_free(gm->grads), gpu_free(gm->params16);
    gpu_free(gm->loss_sum), gpu_free(gm->loss_scale), gpu_free(gm->loss_valid);
    gpu_free(gm->acts_block), gpu_free(gm->targets), gpu_free(gm->plan);
    gpu_free(gm->unit_scale), gpu_free(gm->zero_bias), gpu_free(gm->merge_grad_sink);
    gpu_free(gm->op16[0]), gpu_free(gm->op16[1]);
    free(gm->h_plan), free(gm->h_work), free(gm->h_tokens), free(gm->h_off);
    free(gm->attn_ran_cudnn);
    free(gm->w.layers), free(gm->gw.layers), free(gm->a.layers);
    if (gm->g.stream) gpu_close(&gm->g);
    free(gm);
}

const char *gpu_model_device(const GpuModel *gm) { return gm->device_line; }
float *gpu_model_params(GpuModel *gm) { return gm->params; }
float *gpu_model_grads(GpuModel *gm) { return gm->grads; }
uint16_t *gpu_model_params16(GpuModel *gm) { return gm->params16; }
void *gpu_model_ctx(GpuModel *gm) { return &gm->g; }
size_t gpu_model_fp32_weight_bytes(const GpuModel *gm) {
    return gm->params_sparse ? gpu_sparse_committed(gm->params_sparse) : gm->host->params.total * sizeof(float);
}

size_t gpu_model_bytes(const GpuModel *gm) {
    const size_t total = gm->host->params.total;
    return gpu_model_fp32_weight_bytes(gm) + (gm->grads ? total * sizeof(float) : 0) + (gm->params16 ? total * 2 : 0) +
           gm->acts_bytes;
}

/* Whether the fp32 arena holds the tensor at `offset` (floats): always, but in a lean arena only its ranges. */
static int fp32_held(const GpuModel *gm, size_t offset) {
    if (!gm->params_sparse) return 1;
    for (int i = 0; i < gm->n_fp32_ranges; i++)
        if (offset >= gm->fp32_ranges[2 * i] && offset < gm->fp32_ranges[2 * i] + gm->fp32_ranges[2 * i + 1]) return 1;
    return 0;
}

/* Whether a lean arena keeps tensor p in fp32: what fp32 kernels read — every tensor the products do not take in
 * bf16 (vectors, the convolutions): model_holds_bf16's rule, which the CPU's bf16 inference follows too. The
 * embedding is gathered from its bf16 copy there (gpu_embed16). */
static int lean_keeps(const ParamInfo *p) { return !model_holds_bf16(p); }

/* The lean fp32 arena: a sparse range the size of the whole, its pieces committed over lean_keeps' tensors (merged,
 * rounded out to the granularity). Where the driver has no sparse ranges or a commit fails, nothing changes and the
 * caller allocates the whole arena. */
static void lean_arena(GpuModel *gm, const Model *m) {
    const ParamTable *t = &m->params;
    ZyErr e;
    GpuSparse *s = gpu_sparse_reserve(&gm->g, t->total * sizeof(float), &e);
    size_t *r = s ? malloc(2 * (size_t)(t->count + 1) * sizeof(size_t)) : NULL;
    int nr = 0, ok = r != NULL;
    for (int i = 0; ok && i < t->count; i++) {
        const ParamInfo *p = &t->info[i];
        if (!p->numel || !lean_keeps(p)) continue;
        if (nr && r[2 * nr - 2] + r[2 * nr - 1] == p->offset)
            r[2 * nr - 1] += p->numel;
        else
            r[2 * nr] = p->offset, r[2 * nr + 1] = p->numel, nr++;
    }
    const size_t gran = s ? gpu_sparse_granularity(s) : 1;
    size_t done = 0; /* bytes [0, done) are settled */
    for (int k = 0; ok && k < nr; k++) {
        size_t b0 = r[2 * k] * sizeof(float) / gran * gran;
        const size_t b1 = ((r[2 * k] + r[2 * k + 1]) * sizeof(float) + gran - 1) / gran * gran;
        if (b0 < done) b0 = done;
        if (b1 > b0) ok = gpu_sparse_commit(s, b0, b1 - b0, &e) == 0;
        if (b1 > done) done = b1;
    }
    if (!ok) {
        free(r);
        gpu_sparse_free(s);
        return;
    }
    gm->params_sparse = s, gm->params = gpu_sparse_base(s), gm->fp32_ranges = r, gm->n_fp32_ranges = nr;
}

void gpu_model_refresh_bf16(GpuModel *gm) {
    if (!gm->bf16 || !gm->bf16_stale) return;
    if (!gm->params_sparse)
        gk_f32_to_bf16(gm->g.stream, gm->params16, gm->params, (long)gm->host->params.total);
    for (int i = 0; gm->params_sparse && i < gm->n_fp32_ranges; i++) {
        const size_t off = gm->fp32_ranges[2 * i];
        gk_f32_to_bf16(gm->g.stream, gm->params16 + off, gm->params + off, (long)gm->fp32_ranges[2 * i + 1]);
    }
    gm->bf16_stale = 0;
}

/* A tensor's fp32 values into the bf16 arena alone (a lean arena does not hold it): rounded on the host as
 * gk_f32_to_bf16 rounds (zy_f32_to_bf16, the same bits), a piece at a time. */
static int upload_rounded(GpuModel *gm, size_t offset, const float *src, size_t n, ZyErr *err) {
    enum { PIECE = 1 << 20 };
    uint16_t *h = malloc((n < PIECE ? n : PIECE) * sizeof *h);
    if (!h) return zy_fail(err, "out of memory");
    int rc = 0;
    for (size_t i = 0; !rc && i < n; i += PIECE) {
        const size_t k = n - i < PIECE ? n - i : PIECE;
        for (size_t j = 0; j < k; j++) h[j] = zy_f32_to_bf16(src[i + j]);
        rc = gpu_upload(&gm->g, gm->params16 + offset + i, h, k * sizeof *h, err);
    }
    free(h);
    return rc;
}
/* The uploads of a model without the fp32 arena (gpu_weight_upload.h), or into a lean one: fp32 tensors as they are,
 * bf16 matrices into the bf16 arena and widened on the device into the fp32 one where it holds them. Each copy waits,
 * so the host views may be pageable mapped file pages. */
static int sink_f32(void *ctx, size_t offset, const float *src, size_t n, ZyErr *err) {
    GpuModel *gm = ctx;
    if (!fp32_held(gm, offset)) return upload_rounded(gm, offset, src, n, err);
    return gpu_upload(&gm->g, gm->params + offset, src, n * sizeof(float), err);
}
static int sink_bf16(void *ctx, size_t offset, const uint16_t *src, size_t n, ZyErr *err) {
    GpuModel *gm = ctx;
    if (gpu_upload(&gm->g, gm->params16 + offset, src, n * sizeof(uint16_t), err)) return -1;
    if (fp32_held(gm, offset)) gk_bf16_to_f32(gm->g.stream, gm->params + offset, gm->params16 + offset, (long)n);
    return 0;
}

int gpu_model_upload(GpuModel *gm, const Model *m, ZyErr *err) {
    gm->bf16_stale = 1; /* the bf16 copy is rebuilt from the fp32 arena (exact for values that came up as bf16) */
    if (gpu_weights_in_one_arena(m) && !gm->params_sparse)
        return gpu_upload(&gm->g, gm->params, m->params.data, m->params.total * sizeof(float), err);
    if (!gm->params16) return zy_fail(err, "uploading a model without an fp32 arena needs the GPU's bf16 arena");
    const WeightSink sink = {.ctx = gm, .f32 = sink_f32, .bf16 = sink_bf16};
    if (gpu_upload_weights(m, &sink, err)) return -1;
    return gpu_sync(&gm->g, "widening the bf16 weights", err);
}

/* The host copies below need the host's fp32 arena (training, tests): a mapped bf16 model has none. */
static int host_arena(const Model *m, ZyErr *err) {
    if (gpu_weights_in_one_arena(m)) return 0;
    return zy_fail(err, "this model's host copy is not an fp32 arena (bf16 weights loaded mapped for inference)");
}

int gpu_model_download(GpuModel *gm, Model *m, ZyErr *err) {
    if (host_arena(m, err)) return -1;
    if (gm->params_sparse)
        return zy_fail(err, "this GPU model holds its matrices in bf16 only (a lean arena: ZAYA_GPU_ARENA=full keeps "
                       "them in fp32 too)");
    return gpu_download(&gm->g, m->params.data, gm->params, m->params.total * sizeof(float), err);
}
int gpu_model_download_grads(GpuModel *gm, Model *m, ZyErr *err) {
    if (!gm->grads) return zy_fail(err, "the GPU model was opened for inference (no gradients)");
    return gpu_download(&gm->g, m->params.grad, gm->grads, m->params.total * sizeof(float), err);
}
int gpu_model_upload_grads(GpuModel *gm, const Model *m, ZyErr *err) {
    if (!gm->grads) return zy_fail(err, "the GPU model was opened for inference (no gradients)");
    return gpu_upload(&gm->g, gm->grads, m->params.grad, m->params.total * sizeof(float), err);
}
int gpu_model_upload_range(GpuModel *gm, const Model *m, size_t offset, size_t count, ZyErr *err) {
    if (host_arena(m, err)) return -1;
    if (!fp32_held(gm, offset))
        return zy_fail(err, "uploading fp32 values [%zu, +%zu) into a lean arena, which does not hold them", offset,
                       count);
    gm->bf16_stale = 1;
    return gpu_upload(&gm->g, gm->params + offset, m->params.data + offset, count * sizeof(float), err);
}
void gpu_model_weights_changed(GpuModel *gm) { gm->bf16_stale = 1; }
void gpu_model_zero_grads(GpuModel *gm) {
    if (gm->grads) gpu_zero(gm, gm->grads, gm->host->params.total);
}

/* ======================================================================================================
 * Forward
 * ====================================================================================================== */

/* How layer l attends (as attn_geom in src/model/model.c): its RoPE tables and rotary dim, and its sliding window (0:
 * full causal). */
typedef struct {
    const float *cos, *sin;
    int rd, window;
} AttnGeom;
static AttnGeom attn_geom(const GpuModel *gm, int l) {
    const ZayaConfig *c = &gm->cfg;
    const int sw = cfg_layer_is_sliding(c, l);
    return (AttnGeom){.cos = sw ? gm->a.rope_cos_sliding : gm->a.rope_cos,
                      .sin = sw ? gm->a.rope_sin_sliding : gm->a.rope_sin, .rd = cfg_layer_rotary_dim(c, l),
                      .window = cfg_layer_window(c, l)};
}

/* Causal softmax attention of layer l: bf16 runs take cuDNN's fused SDPA where it was asked for and takes the shape
 * (gpu_attention_cudnn.cpp), else the tensor-core kernels (gpu_attention_tc.cu; their sliding windows unless
 * ZAYA_GPU_WINDOW_TC=off); fp32 runs and the rest the fp32 ones. A layer's backward takes the path its forward took
 * (both write the natural-log LSE, but each backward is checked only against its own forward's O and LSE;
 * attention_tc depends on the window and the model only). */
static int attention_tc(const GpuModel *gm, int window) { return gm->bf16 && (window == 0 || gm->window_tc); }
static void gpu_attention_forward(GpuModel *gm, LayerActs *L, int window) {
    const ZayaConfig *c = &gm->cfg;
    const int B = gm->a.B, T = gm->a.T, Hq = c->num_heads, Hkv = c->num_kv_heads, dh = c->head_dim;
    GkStream s = gm->g.stream;
    const size_t l = (size_t)(L - gm->a.layers);
    gm->attn_ran_cudnn[l] = 0;
    if (gm->bf16 && gm->attn_cudnn) {
        const int rc = gk_cudnn_attention_forward(s, L->attn_out, L->lse, L->query, L->key, L->value, B, T, Hq, Hkv,
                                                  dh, window);
        if (rc == 0) {
            gm->attn_ran_cudnn[l] = 1;
            return;
        }
        if (rc == -2) {
            ZyErr e;
            zy_fail(&e, "cuDNN attention forward failed (ZAYA_GPU_ATTENTION=own runs the own kernels)");
            if (!gm->failed) gm->err = e, gm->failed = 1;
            return;
        }
    }
    (attention_tc(gm, window) ? gk_flash_attention_forward_bf16 : gk_flash_attention_forward_window)(
        s, L->attn_out, L->lse, L->query, L->key, L->value, B, T, Hq, Hkv, dh, window);
}
static void gpu_attention_backward(GpuModel *gm, LayerActs *L, int window) {
    const ZayaConfig *c = &gm->cfg;
    const int B = gm->a.B, T = gm->a.T, Hq = c->num_heads, Hkv = c->num_kv_heads, dh = c->head_dim;
    BackwardScratch *d = &gm->a.d;
    GkStream s = gm->g.stream;
    if (gm->attn_ran_cudnn[L - gm->a.layers]) {
        if (gk_cudnn_attention_backward(s, d->d_query, d->d_key, d->d_value, d->d_attn_out, L->attn_out, L->lse,
                                        L->query, L->key, L->value, B, T, Hq, Hkv, dh, window)) {
            ZyErr e;
            zy_fail(&e, "cuDNN attention backward failed after its forward ran (ZAYA_GPU_ATTENTION=own runs the own "
                        "kernels)");
            if (!gm->failed) gm->err = e, gm->failed = 1;
        }
        return;
    }
    (attention_tc(gm, window) ? gk_flash_attention_backward_bf16 : gk_flash_attention_backward_window)(
        s, d->d_query, d->d_key, d->d_value, d->d_attn_out, L->attn_out, L->lse, L->query, L->key, L->value, B, T, Hq,
        Hkv, dh, gm->a.attn_work, window);
}

/* CCA attention on u = RMSNorm(x); writes L->attn_proj [N, D]. */
static void cca_forward(GpuModel *gm, int l, const LayerWeights *W, LayerActs *L) {
    const ZayaConfig *c = &gm->cfg;
    const Activations *a = &gm->a;
    GkStream s = gm->g.stream;
    const int B = a->B, T = a->T, N = B * T, D = c->hidden_size, dh = c->head_dim;
    const int Hq = c->num_heads, Hkv = c->num_kv_heads, Cq = Hq * dh, Ck = Hkv * dh, C = Cq + Ck;
    /* 1. down projections into X = [q0 | k0] (u rounded to bf16 once for the four products that read it) */
    const uint16_t *u16 = op16(gm, 0, L->u_attn, N, D);
    mm_wt16(gm, N, Cq, D, L->u_attn, u16, D, W->w_q, gpu_bf16_of(gm, W->w_q), L->qk_down, C);
    mm_wt16(gm, N, Ck, D, L->u_attn, u16, D, W->w_k, gpu_bf16_of(gm, W->w_k), L->qk_down + Cq, C);
    /* 2. the two causal convolutions over time */
    gpu_cca_conv_forward(gm, W, L->conv_out, L->conv_mid, L->qk_down, B, T);
    /* 3. q-k mean skip */
    gk_qk_mean_forward(s, L->query_pre, L->key_pre, L->conv_out, L->qk_down, N, Hq, Hkv, dh);
    /* 4. values with a one-token delay */
    mm_wt16(gm, N, Ck / 2, D, L->u_attn, u16, D, W->w_v_current, gpu_bf16_of(gm, W->w_v_current), L->v_current,
            Ck / 2);
    mm_wt16(gm, N, Ck / 2, D, L->u_attn, u16, D, W->w_v_delayed, gpu_bf16_of(gm, W->w_v_delayed), L->v_delayed,
            Ck / 2);
    gk_delayed_value_forward(s, L->value, L->v_current, L->v_delayed, B, T, Ck / 2);
    /* 5. QK L2 norm to √dh, keys times the per-kv-head temperature, and 6. partial RoPE, in one pass */
    const float scale = sqrtf((float)dh), eps = 1.1920928955078125e-07f;
    const AttnGeom g = attn_geom(gm, l);
    gk_l2norm_rope_qk_forward(s, (GkNormRopePart){L->query, L->q_norm, L->query_pre, NULL, Hq},
                              (GkNormRopePart){L->key, L->k_norm, L->key_pre, W->temp, Hkv}, g.cos, g.sin, NULL, N, T,
                              dh, g.rd, scale, eps);
    /* 7. causal softmax attention in the latent space (a sliding layer: over its window) */
    gpu_attention_forward(gm, L, g.window);
    /* 8. output projection */
    gpu_mm_wt(gm, N, D, Cq, L->attn_out, Cq, W->w_o, gpu_bf16_of(gm, W->w_o), L->attn_proj, D);
}

/* MHA variant: q, k, v projections, partial RoPE, causal GQA attention, o_proj. */
static void mha_forward(GpuModel *gm, int l, const LayerWeights *W, LayerActs *L) {
    const ZayaConfig *c = &gm->cfg;
    const Activations *a = &gm->a;
    GkStream s = gm->g.stream;
    const int B = a->B, T = a->T, N = B * T, D = c->hidden_size, dh = c->head_dim;
    const int Hq = c->num_heads, Hkv = c->num_kv_heads, Cq = Hq * dh, Ck = Hkv * dh;
    const AttnGeom g = attn_geom(gm, l);
    const uint16_t *u16 = op16(gm, 0, L->u_attn, N, D);
    mm_wt16(gm, N, Cq, D, L->u_attn, u16, D, W->w_q, gpu_bf16_of(gm, W->w_q), L->query, Cq);
    mm_wt16(gm, N, Ck, D, L->u_attn, u16, D, W->w_k, gpu_bf16_of(gm, W->w_k), L->key, Ck);
    mm_wt16(gm, N, Ck, D, L->u_attn, u16, D, W->w_v, gpu_bf16_of(gm, W->w_v), L->value, Ck);
    gk_rope_forward(s, L->query, g.cos, g.sin, N, T, Hq, dh, g.rd);
    gk_rope_forward(s, L->key, g.cos, g.sin, N, T, Hkv, dh, g.rd);
    gpu_attention_forward(gm, L, g.window);
    gpu_mm_wt(gm, N, D, Cq, L->attn_out, Cq, W->w_o, gpu_bf16_of(gm, W->w_o), L->attn_proj, D);
}

/* Whether the experts' products run grouped on the device (gk_expert_mm, no host wait) for `rows` rows: bf16 runs on
 * sm_80+ whose bf16 operand buffers hold the experts' rows. ZAYA_GPU_EXPERTS=loop (read at create) keeps one cuBLASLt
 * product per expert, for comparison. */
static int experts_grouped(const GpuModel *gm, size_t rows) {
    const ZayaConfig *c = &gm->cfg;
    const size_t D = (size_t)c->hidden_size, I2 = 2 * (size_t)c->moe_intermediate_size;
    return gm->experts_grouped && gm->bf16 && gm->g.cc_major >= 8 && gm->params16 && gm->op16[0] && gm->op16[1] &&
           rows * (I2 > D ? I2 : D) <= gm->op16_elems;
}

const char *gpu_model_attention_path(const GpuModel *gm) {
    if (!gm->bf16) return "fp32 flash attention";
    if (gm->attn_cudnn && gk_cudnn_attention_available()) return gk_cudnn_attention_status();
    return "tensor-core flash attention (head dim 64/128)";
}

int gpu_model_few_rows(const GpuModel *gm) { return few_rows(gm, 1) ? GK_SKINNY_ROWS : 0; }
int gpu_model_programmatic_launch(const GpuModel *gm) { return gm && gk_programmatic_launch_on(); }
int gpu_model_decode_layer_persistent(const GpuModel *gm) { return gm && gm->decode_layer_persistent && few_rows(gm, 1); }
long gpu_model_decode_layer_runs(const GpuModel *gm) { return gm ? gm->decode_layer_runs : 0; }

int gpu_model_experts_grouped(const GpuModel *gm) {
    if (!experts_grouped(gm, (size_t)gm->a.B * gm->a.T)) return 0;
    const int form = gk_expert_kernel(-1);
    return form == GK_EXPERT_STAGED ? 1 : form == GK_EXPERT_SM90 && gk_expert_sm90_ready() ? 3 : 2;
}

/* The experts' row offsets on the host (the per-expert products need their sizes): the one wait of a layer. */
static const int32_t *expert_offsets_to_host(GpuModel *gm, int l, const LayerActs *L, int E) {
    int32_t *h = gm->h_off + (size_t)l * (gm->cfg.num_experts + 1);
    ZyErr e;
    if (gpu_download(&gm->g, h, L->expert_offset, (size_t)(E + 1) * sizeof(int32_t), &e)) {
        fail_once(gm, &e);
        memset(h, 0, (size_t)(E + 1) * sizeof(int32_t));
    }
    return h;
}

/* y = A Wᵀ: through gpu_mm_wt_rows where few (decoding's few-row steps), else one product. */
static void linear(GpuModel *gm, int few, int M, int n, int K, const float *A, int lda, const float *w, float *y,
                   int ldy) {
    if (few)
        gpu_mm_wt_rows(gm, M, K, A, lda, &(GpuLinear){.w = w, .y = y, .n = n, .ldy = ldy}, 1);
    else
        gpu_mm_wt(gm, M, n, K, A, lda, w, gpu_bf16_of(gm, w), y, ldy);
}

/* The router's hidden layers, y = gelu(A Wᵀ + b) with A, y [M, R]: where few, in one few-row launch (pre unused);
 * else the product into pre, then pre += b and y = gelu(pre) (the backward reads pre). */
static void linear_gelu(GpuModel *gm, int few, int M, int R, const float *A, const float *w, const float *b, float *pre,
                        float *y) {
    if (few) {
        gpu_mm_wt_rows(gm, M, R, A, R, &(GpuLinear){.w = w, .y = y, .n = R, .ldy = R, .bias = b}, 1);
        return;
    }
    gpu_mm_wt(gm, M, R, R, A, R, w, gpu_bf16_of(gm, w), pre, R);
    gk_bias_gelu_forward(gm->g.stream, pre, y, b, M, R);
}

void gpu_router_tail_desc(const GpuModel *gm, const LayerWeights *W, const LayerActs *L, const float *r_prev, int N,
                          GkRouterTail *t) {
    const ZayaConfig *c = &gm->cfg;
    *t = (GkRouterTail){.z = L->router_z, .bias = W->router_down_b, .r_prev = r_prev,
                        .gamma = W->router_state_scale, .norm_w = W->router_norm, .eps = c->rms_norm_eps,
                        .w1 = gpu_bf16_of(gm, W->router_fc1_w), .w2 = gpu_bf16_of(gm, W->router_fc2_w),
                        .w_out = gpu_bf16_of(gm, W->router_out_w), .b1 = W->router_fc1_b, .b2 = W->router_fc2_b,
                        .balance_bias = W->balancing_bias, .logits = L->router_logits, .probs = L->router_probs,
                        .gate = L->gate, .choice = L->choice, .rows = N, .R = c->router_hidden_size,
                        .classes = cfg_router_classes(c)};
}

/* Decoding's few rows: the router after its down projection (state norm, hidden layers, logits, choice) in one
 * launch, the same bits as gpu_moe_forward's launches; -1 where gk_skinny_router_tail does not take the shape. */
static int router_tail(GpuModel *gm, const LayerWeights *W, LayerActs *L, const float *r_prev, int N) {
    GkRouterTail t;
    gpu_router_tail_desc(gm, W, L, r_prev, N, &t);
    return gk_skinny_router_tail(gm->g.stream, &t);
}

/* z = u W_downᵀ + b (+ r_prev ⊙ γ), the router MLP, biased top-1 choice, dropless SwiGLU experts. */
void gpu_moe_forward(GpuModel *gm, int l, const LayerWeights *W, LayerActs *L, const float *r_prev, int N,
                     int decoding) {
    const ZayaConfig *c = &gm->cfg;
    GkStream s = gm->g.stream;
    const int D = c->hidden_size, R = c->router_hidden_size, I = c->moe_intermediate_size;
    const int classes = cfg_router_classes(c);
    double t0 = gpu_tick(gm);
    /* decoding's few rows: each product one few-row launch, the experts two (products with SwiGLU, gate and combine) */
    const int few = decoding && few_rows(gm, N);
    if (c->moe == ZY_MOE_DENSE) { /* dense variant: every row to the one MLP with gate 1 */
        gk_route_all_to_one(s, L->choice, L->gate, N);
    } else if (c->router == ZY_ROUTER_MLP) {
        linear(gm, few, N, R, D, L->u_mlp, D, W->router_down_w, L->router_z, R);
        if (!few || router_tail(gm, W, L, r_prev, N)) { /* else these five ran as one launch */
            gk_state_rmsnorm_forward(s, L->router_z, L->router_zn, L->router_rstd, W->router_down_b, r_prev,
                                     W->router_state_scale, W->router_norm, N, R, c->rms_norm_eps);
            linear_gelu(gm, few, N, R, L->router_zn, W->router_fc1_w, W->router_fc1_b, L->router_h1_pre,
                        L->router_h1);
            linear_gelu(gm, few, N, R, L->router_h1, W->router_fc2_w, W->router_fc2_b, L->router_h2_pre,
                        L->router_h2);
            linear(gm, few, N, classes, R, L->router_h2, R, W->router_out_w, L->router_logits, classes);
            gk_router_choice_forward(s, L->router_probs, L->choice, L->gate, L->router_logits, W->balancing_bias, N,
                                     classes);
        }
    } else { /* linear-router variant: logits = u Wᵀ */
        linear(gm, few, N, classes, D, L->u_mlp, D, W->router_w, L->router_logits, classes);
        gk_router_choice_forward(s, L->router_probs, L->choice, L->gate, L->router_logits, W->balancing_bias, N,
                                 classes);
    }
    gpu_tock(gm, PHASE_ROUTER, &t0);
    const int E = c->moe == ZY_MOE_DENSE ? 1 : c->num_experts;
    if (few) { /* each row through its expert's weights, in row order: no sorting, gathering or scattering */
        const uint16_t *gu16 = gpu_bf16_of(gm, W->expert_gate_up), *down16 = gpu_bf16_of(gm, W->expert_down);
        if (gk_skinny_expert_swiglu(s, L->expert_act, L->u_mlp, L->choice, gu16, N, D, I, E) == 0 &&
            gk_skinny_expert_down(s, L->moe_out, L->expert_act, L->choice, L->gate, down16, N, I, D, E) == 0) {
            gpu_tock(gm, PHASE_EXPERTS, &t0);
            return;
        }
    }
    /* dropless top-1 experts: rows sorted by expert on the device, one product per expert, gate-scaled scatter */
    gk_group_by_expert(s, L->expert_offset, L->sorted_rows, L->choice, N, E);
    if (experts_grouped(gm, (size_t)N)) {
        /* one launch a product for all experts; the routed row count off[E] is read on the device, so the row ops
         * and bf16 roundings span N rows (their bound) and the products and row ops touch only the routed ones */
        const int32_t *off = L->expert_offset, *n_dev = off + E;
        /* the rows gathered as bf16 bits into expert_in's room: the gate-and-up product's operand here and its weight
         * gradient's in the backward, rounded once, as they are moved */
        uint16_t *in16 = (uint16_t *)(void *)L->expert_in;
        gk_gather_rows_bf16(s, in16, L->u_mlp, L->sorted_rows, N, n_dev, D);
        gk_expert_mm(s, off, E, N, 2 * I, D, in16, D, gpu_bf16_of(gm, W->expert_gate_up), 2L * I * D, 1, 0.0f,
                     L->expert_gu, 2 * I);
        /* SwiGLU writes the down product's bf16 operand straight into expert_act's room (bf16 bits, the backward's
         * weight-gradient operand too): no fp32 act, no rounding pass */
        uint16_t *act16 = (uint16_t *)(void *)L->expert_act;
        gk_swiglu_forward_bf16(s, act16, L->expert_gu, N, n_dev, I);
        gk_expert_mm(s, off, E, N, D, I, act16, I, gpu_bf16_of(gm, W->expert_down), (long)D * I, 1, 0.0f,
                     L->expert_out, D);
        gk_moe_combine(s, L->moe_out, L->expert_out, L->gate, L->sorted_rows, L->choice, N, N, n_dev, D, E);
        gpu_tock(gm, PHASE_EXPERTS, &t0);
        return;
    }
    const int32_t *off = expert_offsets_to_host(gm, l, L, E);
    const int n = off[E];
    gk_gather_rows(s, L->expert_in, L->u_mlp, L->sorted_rows, n, NULL, D);
    /* each expert's rows are a slice of one bf16 copy (one rounding pass, not one per expert) */
    const uint16_t *in16 = op16(gm, 0, L->expert_in, (size_t)n, D);
    for (int e = 0; e < E; e++) {
        const int r0 = off[e], ne = off[e + 1] - off[e];
        const float *wg = W->expert_gate_up + (size_t)e * 2 * I * D;
        if (ne)
            mm_wt16(gm, ne, 2 * I, D, L->expert_in + (size_t)r0 * D, at16(in16, (size_t)r0 * D), D, wg,
                    gpu_bf16_of(gm, wg), L->expert_gu + (size_t)r0 * 2 * I, 2 * I);
    }
    gk_swiglu_forward(s, L->expert_act, L->expert_gu, n, NULL, I);
    const uint16_t *act16 = op16(gm, 1, L->expert_act, (size_t)n, I);
    for (int e = 0; e < E; e++) {
        const int r0 = off[e], ne = off[e + 1] - off[e];
        const float *wd = W->expert_down + (size_t)e * D * I;
        if (ne)
            mm_wt16(gm, ne, D, I, L->expert_act + (size_t)r0 * I, at16(act16, (size_t)r0 * I), I, wd,
                    gpu_bf16_of(gm, wd), L->expert_out + (size_t)r0 * D, D);
    }
    gk_moe_combine(s, L->moe_out, L->expert_out, L->gate, L->sorted_rows, L->choice, N, n, NULL, D, E);
    gpu_tock(gm, PHASE_EXPERTS, &t0);
}

/* What a forward needs before its launches: the tokens on the device (a host copy kept for the embedding-gradient
 * plan) and the weights' bf16 copy current. Outside the launches, so a captured pass never holds a host copy. */
static void forward_inputs(GpuModel *gm, const int32_t *tokens) {
    const size_t N = (size_t)gm->a.B * gm->a.T;
    gpu_model_refresh_bf16(gm); /* bf16 products read bf16 copies of the weights, rebuilt once after every change */
    memcpy(gm->h_tokens, tokens, N * sizeof *tokens);
    gpu_upload_async(&gm->g, gm->a.tokens, gm->h_tokens, N * sizeof *tokens);
}

/* The forward's launches over the tokens on the device (forward_inputs). */
static void forward_work(GpuModel *gm) {
    const ZayaConfig *c = &gm->cfg;
    Activations *a = &gm->a;
    GkStream s = gm->g.stream;
    const Weights *w = &gm->w;
    const int N = a->B * a->T, D = c->hidden_size;
    double t0 = gpu_tick(gm);
    /* x = (Emb[tokens] + b_in) ⊙ s_in; u = RMSNorm(x) */
    gk_embed_forward(s, a->layers[0].x_in, w->embed, gpu_embed16(gm), a->tokens, w->in_bias, w->in_scale, N, D);
    gk_rmsnorm_forward(s, a->layers[0].u_attn, a->layers[0].rstd_attn, a->layers[0].x_in, w->layers[0].input_norm, N,
                       D, c->rms_norm_eps);
    const float *r_prev = NULL;
    for (int l = 0; l < c->num_layers; l++) {
        const LayerWeights *W = &w->layers[l];
        LayerActs *L = &a->layers[l];
        const int last = l + 1 == c->num_layers;
        /* a = CCA(RMSNorm(x)); x = (a + bh) ⊙ sh + (x + br) ⊙ sr; u = RMSNorm(x) */
        gpu_tock(gm, PHASE_NORMS, &t0);
        if (c->attention == ZY_ATTN_CCA)
            cca_forward(gm, l, W, L);
        else
            mha_forward(gm, l, W, L);
        gpu_tock(gm, PHASE_ATTENTION, &t0);
        gk_merge_rmsnorm_forward(s, L->x_mid, L->u_mlp, L->rstd_mlp, L->attn_proj, L->x_in, W->attn_hs, W->attn_hb,
                                 W->attn_rs, W->attn_rb, W->post_norm, N, D, c->rms_norm_eps);
        gpu_tock(gm, PHASE_NORMS, &t0);
        /* m, r = MoE(u, r); x = (m + bh') ⊙ sh' + (x + br') ⊙ sr', normed by the next layer (or the final norm) */
        gpu_moe_forward(gm, l, W, L, r_prev, N, 0);
        t0 = gpu_tick(gm); /* the MoE block timed itself (router, experts): not the norms' time */
        float *x_out = last ? a->x_final : a->layers[l + 1].x_in;
        float *u_next = last ? a->final_normed : a->layers[l + 1].u_attn;
        float *rstd_next = last ? a->final_rstd : a->layers[l + 1].rstd_attn;
        const float *w_next = last ? w->final_norm : w->layers[l + 1].input_norm;
        gk_merge_rmsnorm_forward(s, x_out, u_next, rstd_next, L->moe_out, L->x_mid, W->mlp_hs, W->mlp_hb, W->mlp_rs,
                                 W->mlp_rb, w_next, N, D, c->rms_norm_eps);
        r_prev = L->router_z;
    }
    gpu_tock(gm, PHASE_NORMS, &t0);
    /* logits = RMSNorm(x; w_final) · headᵀ */
    gpu_mm_wt(gm, N, c->vocab_size, D, a->final_normed, D, w->lm_head, gpu_bf16_of(gm, w->lm_head), a->logits, c->vocab_size);
    gpu_tock(gm, PHASE_HEAD, &t0);
}

/* The first failure inside the launches since failed was cleared, into err. */
static int pass_status(GpuModel *gm, ZyErr *err) {
    if (!gm->failed) return 0;
    *err = gm->err;
    return -1;
}

int gpu_model_forward(GpuModel *gm, const int32_t *tokens, ZyErr *err) {
    gm->failed = 0;
    forward_inputs(gm, tokens);
    forward_work(gm);
    return pass_status(gm, err);
}

/* Cross-entropy of the last forward against the targets on the device (gm->targets): the pass's mean loss added to
 * the accumulator; with dlogits (fp32) or dlogits16 (its bf16 bits), (softmax − onehot) / n_valid as well. Launches
 * only (the count of valid targets is taken on the device), so a graph replays it for any batch. */
static void loss_work(GpuModel *gm, float *dlogits, uint16_t *dlogits16) {
    const int N = gm->a.B * gm->a.T;
    GkStream s = gm->g.stream;
    gk_loss_scale(s, gm->loss_scale, gm->loss_valid, gm->targets, N);
    gk_cross_entropy(s, dlogits, dlogits16, gm->a.row_loss, gm->a.logits, gm->targets, N, gm->cfg.vocab_size,
                     gm->loss_scale);
    gk_loss_add(s, gm->loss_sum, gm->a.row_loss, N, gm->loss_valid);
}

static void targets_input(GpuModel *gm, const int32_t *targets) {
    gpu_upload_async(&gm->g, gm->targets, targets, (size_t)gm->a.B * gm->a.T * sizeof *targets);
}

int gpu_model_loss(GpuModel *gm, const int32_t *targets, ZyErr *err) {
    gm->failed = 0;
    targets_input(gm, targets);
    loss_work(gm, NULL, NULL);
    gm->n_parts++;
    return pass_status(gm, err);
}

int gpu_model_take_loss(GpuModel *gm, double *sum, ZyErr *err) {
    *sum = 0;
    if (!gm->n_parts) return 0;
    if (gpu_download(&gm->g, sum, gm->loss_sum, sizeof *sum, err)) return -1;
    gpu_memset_async(&gm->g, gm->loss_sum, 0, sizeof(double));
    gm->n_parts = 0;
    return 0;
}

int gpu_model_logits(GpuModel *gm, float *logits, ZyErr *err) {
    return gpu_download(&gm->g, logits, gm->a.logits, (size_t)gm->a.B * gm->a.T * gm->cfg.vocab_size * sizeof(float),
                        err);
}

int gpu_model_routing(GpuModel *gm, int layer, int32_t *choice, float *gate, float *probs, ZyErr *err) {
    const LayerActs *L = &gm->a.layers[layer];
    const size_t N = (size_t)gm->a.B * gm->a.T, K = (size_t)cfg_router_classes(&gm->cfg);
    if (choice && gpu_download(&gm->g, choice, L->choice, N * sizeof *choice, err)) return -1;
    if (gate && gpu_download(&gm->g, gate, L->gate, N * sizeof *gate, err)) return -1;
    if (probs && K && gpu_download(&gm->g, probs, L->router_probs, N * K * sizeof *probs, err)) return -1;
    return 0;
}

void gpu_model_routing_stats(GpuModel *gm, int32_t *counts, double *sums) {
    const ZayaConfig *c = &gm->cfg;
    const int L = c->num_layers, E = c->num_experts, N = gm->a.B * gm->a.T, K = cfg_router_classes(c);
    for (int l = 0; l < L; l++) {
        const LayerActs *A = &gm->a.layers[l];
        gk_routing_stats(gm->g.stream, counts + (size_t)l * (E + 1), sums + 2 * (size_t)l, A->choice, A->gate,
                         A->router_probs, N, K, E);
    }
}

/* ======================================================================================================
 * Backward (reverse order of the forward; every gradient accumulates)
 * ====================================================================================================== */

/* Input: d->d_h = dL/d(moe_out); dz = dL/dz carried back from layer l+1's router. Output: d->d_u = dL/du_mlp
 * (overwritten); dz_prev = dL/dr_prev. As moe_backward in model.c. */
static void moe_backward(GpuModel *gm, int l, const LayerWeights *W, LayerWeights *G, LayerActs *L,
                         const float *r_prev, float *dz, float *dz_prev) {
    const ZayaConfig *c = &gm->cfg;
    GkStream s = gm->g.stream;
    BackwardScratch *d = &gm->a.d;
    const int N = gm->a.B * gm->a.T, D = c->hidden_size, R = c->router_hidden_size, I = c->moe_intermediate_size;
    const int E = c->moe == ZY_MOE_DENSE ? 1 : c->num_experts, K = cfg_router_classes(c);
    /* grouped (as the forward ran): the routed row count stays on the device, N bounds it; else the host's offsets */
    const int grouped = experts_grouped(gm, (size_t)N);
    const int32_t *off = grouped ? NULL : gm->h_off + (size_t)l * (c->num_experts + 1);
    const int32_t *n_dev = grouped ? L->expert_offset + E : NULL;
    const int n_routed = grouped ? N : off[E];
    double t0 = gpu_tick(gm);
    /* out = gate ⊙ y: dgate and dy in one pass over the routed rows */
    gpu_zero(gm, d->d_gate, N);
    if (grouped) /* dy as the down products' bf16 operand (bits in d_expert_out's room) */
        gk_moe_gate_backward_bf16(s, d->d_gate, (uint16_t *)(void *)d->d_expert_out, d->d_h, L->expert_out, L->gate,
                                  L->sorted_rows, n_routed, n_dev, D);
    else
        gk_moe_gate_backward(s, d->d_gate, d->d_expert_out, d->d_h, L->expert_out, L->gate, L->sorted_rows, n_routed,
                             n_dev, D);
    if (c->moe == ZY_MOE_DENSE) {
        gpu_zero(gm, d->d_u, (size_t)N * D);
    } else {
        gpu_zero(gm, d->d_router_logits, (size_t)N * K);
        gk_router_choice_backward(s, d->d_router_logits, d->d_gate, L->router_probs, L->choice, N, K);
    }
    /* each output gradient below feeds two products (input and weight gradient): rounded to bf16 once (op16) */
    if (c->moe != ZY_MOE_DENSE && c->router == ZY_ROUTER_LINEAR) { /* logits = u Wᵀ */
        const uint16_t *dl16 = op16(gm, 0, d->d_router_logits, N, K);
        mm16(gm, 0, 0, N, D, K, d->d_router_logits, dl16, K, W->router_w, gpu_bf16_of(gm, W->router_w), D, 0, d->d_u,
             D);
        mm16(gm, 1, 0, K, D, N, d->d_router_logits, dl16, K, L->u_mlp, NULL, D, 1, G->router_w, D);
    } else if (c->moe != ZY_MOE_DENSE) {
        const uint16_t *dl16 = op16(gm, 0, d->d_router_logits, N, K);
        mm16(gm, 0, 0, N, R, K, d->d_router_logits, dl16, K, W->router_out_w, gpu_bf16_of(gm, W->router_out_w), R, 0,
             d->d_h2, R);
        mm16(gm, 1, 0, K, R, N, d->d_router_logits, dl16, K, L->router_h2, NULL, R, 1, G->router_out_w, R);
        gk_gelu_bias_backward(s, d->d_h1, G->router_fc2_b, d->d_h2, L->router_h2_pre, N, R); /* d_h1 = d(h2_pre) */
        const uint16_t *dh16 = op16(gm, 1, d->d_h1, N, R);
        mm16(gm, 0, 0, N, R, R, d->d_h1, dh16, R, W->router_fc2_w, gpu_bf16_of(gm, W->router_fc2_w), R, 0, d->d_h2,
             R);
        mm16(gm, 1, 0, R, R, N, d->d_h1, dh16, R, L->router_h1, NULL, R, 1, G->router_fc2_w, R);
        gk_gelu_bias_backward(s, d->d_h1, G->router_fc1_b, d->d_h2, L->router_h1_pre, N, R); /* d_h1 = d(h1_pre) */
        dh16 = op16(gm, 0, d->d_h1, N, R);
        mm16(gm, 0, 0, N, R, R, d->d_h1, dh16, R, W->router_fc1_w, gpu_bf16_of(gm, W->router_fc1_w), R, 0, d->d_zn,
             R);
        mm16(gm, 1, 0, R, R, N, d->d_h1, dh16, R, L->router_zn, NULL, R, 1, G->router_fc1_w, R);
        gk_rmsnorm_backward(s, dz, G->router_norm, d->d_zn, L->router_z, W->router_norm, L->router_rstd, N, R);
        /* z = u W_downᵀ + b + r_prev ⊙ γ */
        gk_state_backward(s, dz_prev, G->router_state_scale, G->router_down_b, dz, r_prev, W->router_state_scale, N, R);
        const uint16_t *dz16 = op16(gm, 1, dz, N, R);
        mm16(gm, 0, 0, N, D, R, dz, dz16, R, W->router_down_w, gpu_bf16_of(gm, W->router_down_w), D, 0, d->d_u, D);
        mm16(gm, 1, 0, R, D, N, dz, dz16, R, L->u_mlp, NULL, D, 1, G->router_down_w, D);
    }
    gpu_tock(gm, PHASE_ROUTER, &t0);
    /* experts: the products, SwiGLU backward, scatter-add of dxin into d_u */
    if (grouped) { /* input gradients C = dY W_e and weight gradients G_e += dY_eᵀ X_e, one launch each */
        const int32_t *goff = L->expert_offset;
        /* bf16 bits written by the gate backward, the SwiGLU forward and the gather */
        const uint16_t *dy16 = (const uint16_t *)(const void *)d->d_expert_out;
        const uint16_t *act16 = (const uint16_t *)(const void *)L->expert_act;
        gk_expert_mm(s, goff, E, N, I, D, dy16, D, gpu_bf16_of(gm, W->expert_down), (long)D * I, 0, 0.0f,
                     d->d_expert_act, I);
        gk_expert_mm_wgrad(s, goff, E, D, I, dy16, D, act16, I, 1.0f, G->expert_down, (long)D * I, I);
        /* dgu as the products' bf16 operand, written into op16[0] (its last readers, the router's products, are
         * queued before it): no zeroing, no fp32 dgu, no rounding pass */
        uint16_t *dgu16 = gm->op16[0];
        gk_swiglu_backward_bf16(s, dgu16, d->d_expert_act, L->expert_gu, N, n_dev, I);
        const uint16_t *in16 = (const uint16_t *)(const void *)L->expert_in;
        gk_expert_mm(s, goff, E, N, D, 2 * I, dgu16, 2 * I, gpu_bf16_of(gm, W->expert_gate_up), 2L * I * D, 0, 0.0f,
                     d->d_expert_in, D);
        gk_expert_mm_wgrad(s, goff, E, 2 * I, D, dgu16, 2 * I, in16, D, 1.0f, G->expert_gate_up, 2L * I * D, D);
        gk_scatter_add_rows(s, d->d_u, d->d_expert_in, L->sorted_rows, N, n_dev, D);
        gpu_tock(gm, PHASE_EXPERTS, &t0);
        return;
    }
    /* per expert: each expert's operands are slices of bf16 copies made once per layer (op16), not rounded per
     * product */
    const uint16_t *dy16 = op16(gm, 0, d->d_expert_out, (size_t)n_routed, D);
    const uint16_t *act16 = op16(gm, 1, L->expert_act, (size_t)n_routed, I);
    for (int e = 0; e < E; e++) {
        const int r0 = off[e], ne = off[e + 1] - off[e];
        if (!ne) continue;
        const float *wd = W->expert_down + (size_t)e * D * I;
        const float *dye = d->d_expert_out + (size_t)r0 * D;
        const uint16_t *dye16 = at16(dy16, (size_t)r0 * D);
        mm16(gm, 0, 0, ne, I, D, dye, dye16, D, wd, gpu_bf16_of(gm, wd), I, 0, d->d_expert_act + (size_t)r0 * I, I);
        mm16(gm, 1, 0, D, I, ne, dye, dye16, D, L->expert_act + (size_t)r0 * I, at16(act16, (size_t)r0 * I), I, 1,
             G->expert_down + (size_t)e * D * I, I);
    }
    gpu_zero(gm, d->d_expert_gu, (size_t)n_routed * 2 * I);
    gk_swiglu_backward(s, d->d_expert_gu, d->d_expert_act, L->expert_gu, n_routed, NULL, I);
    const uint16_t *dgu16 = op16(gm, 0, d->d_expert_gu, (size_t)n_routed, 2 * (size_t)I);
    const uint16_t *in16 = op16(gm, 1, L->expert_in, (size_t)n_routed, D);
    for (int e = 0; e < E; e++) {
        const int r0 = off[e], ne = off[e + 1] - off[e];
        if (!ne) continue;
        const float *wg = W->expert_gate_up + (size_t)e * 2 * I * D;
        const float *dge = d->d_expert_gu + (size_t)r0 * 2 * I;
        const uint16_t *dge16 = at16(dgu16, (size_t)r0 * 2 * I);
        mm16(gm, 0, 0, ne, D, 2 * I, dge, dge16, 2 * I, wg, gpu_bf16_of(gm, wg), D, 0, d->d_expert_in + (size_t)r0 * D,
             D);
        mm16(gm, 1, 0, 2 * I, D, ne, dge, dge16, 2 * I, L->expert_in + (size_t)r0 * D, at16(in16, (size_t)r0 * D), D,
             1, G->expert_gate_up + (size_t)e * 2 * I * D, D);
    }
    gk_scatter_add_rows(s, d->d_u, d->d_expert_in, L->sorted_rows, n_routed, NULL, D);
    gpu_tock(gm, PHASE_EXPERTS, &t0);
}

/* dx += dy W (the input gradient) and dW += dyᵀ x: a linear layer y = x Wᵀ's backward. dy is rounded to bf16 once
 * for both products (op16 slot 0); x16 is x's bf16 view (op16 slot 1) or NULL. */
static void linear_back(GpuModel *gm, float *dx, float *dw, const float *dy, const float *x, const uint16_t *x16,
                        const float *w, int rows, int in, int out) {
    const uint16_t *dy16 = op16(gm, 0, dy, (size_t)rows, (size_t)out);
    mm16(gm, 0, 0, rows, in, out, dy, dy16, out, w, gpu_bf16_of(gm, w), in, 1, dx, in);
    mm16(gm, 1, 0, out, in, rows, dy, dy16, out, x, x16, in, 1, dw, in);
}

/* Input: d->d_h = dL/d(attn_proj). Output: d->d_u += dL/du_attn. The MHA variant's backward. */
static void mha_backward(GpuModel *gm, int l, const LayerWeights *W, LayerWeights *G, LayerActs *L) {
    const ZayaConfig *c = &gm->cfg;
    const Activations *a = &gm->a;
    BackwardScratch *d = &gm->a.d;
    GkStream s = gm->g.stream;
    const int B = a->B, T = a->T, N = B * T, D = c->hidden_size, dh = c->head_dim;
    const int Hq = c->num_heads, Hkv = c->num_kv_heads, Cq = Hq * dh, Ck = Hkv * dh;
    const AttnGeom g = attn_geom(gm, l);
    gpu_zero(gm, d->d_attn_out, (size_t)N * Cq);
    linear_back(gm, d->d_attn_out, G->w_o, d->d_h, L->attn_out, NULL, W->w_o, N, Cq, D);
    gpu_zero(gm, d->d_query, (size_t)N * Cq);
    gpu_zero(gm, d->d_key, (size_t)N * Ck);
    gpu_zero(gm, d->d_value, (size_t)N * Ck);
    gpu_attention_backward(gm, L, g.window);
    gk_rope_backward(s, d->d_query, g.cos, g.sin, N, T, Hq, dh, g.rd);
    gk_rope_backward(s, d->d_key, g.cos, g.sin, N, T, Hkv, dh, g.rd);
    const uint16_t *u16 = op16(gm, 1, L->u_attn, N, D); /* read by the three weight-gradient products */
    linear_back(gm, d->d_u, G->w_q, d->d_query, L->u_attn, u16, W->w_q, N, D, Cq);
    linear_back(gm, d->d_u, G->w_k, d->d_key, L->u_attn, u16, W->w_k, N, D, Ck);
    linear_back(gm, d->d_u, G->w_v, d->d_value, L->u_attn, u16, W->w_v, N, D, Ck);
}

/* Input: d->d_h = dL/d(attn_proj). Output: d->d_u += dL/du_attn. */
static void cca_backward(GpuModel *gm, int l, const LayerWeights *W, LayerWeights *G, LayerActs *L) {
    const ZayaConfig *c = &gm->cfg;
    const Activations *a = &gm->a;
    BackwardScratch *d = &gm->a.d;
    GkStream s = gm->g.stream;
    const int B = a->B, T = a->T, N = B * T, D = c->hidden_size, dh = c->head_dim;
    const int Hq = c->num_heads, Hkv = c->num_kv_heads, Cq = Hq * dh, Ck = Hkv * dh, C = Cq + Ck;
    /* 8. output projection */
    gpu_zero(gm, d->d_attn_out, (size_t)N * Cq);
    linear_back(gm, d->d_attn_out, G->w_o, d->d_h, L->attn_out, NULL, W->w_o, N, Cq, D);
    /* 7. attention */
    gpu_zero(gm, d->d_query, (size_t)N * Cq);
    gpu_zero(gm, d->d_key, (size_t)N * Ck);
    gpu_zero(gm, d->d_value, (size_t)N * Ck);
    const AttnGeom g = attn_geom(gm, l);
    gpu_attention_backward(gm, L, g.window);
    /* 4. delayed values */
    gpu_zero(gm, d->d_vc, (size_t)N * Ck / 2);
    gpu_zero(gm, d->d_vd, (size_t)N * Ck / 2);
    gk_delayed_value_backward(s, d->d_vc, d->d_vd, d->d_value, B, T, Ck / 2);
    /* u in bf16 for the four weight-gradient products that read it (op16 slot 1, kept to step 1 below) */
    const uint16_t *u16 = op16(gm, 1, L->u_attn, N, D);
    linear_back(gm, d->d_u, G->w_v_current, d->d_vc, L->u_attn, u16, W->w_v_current, N, D, Ck / 2);
    linear_back(gm, d->d_u, G->w_v_delayed, d->d_vd, L->u_attn, u16, W->w_v_delayed, N, D, Ck / 2);
    /* 6. RoPE and 5. QK norm in one pass → gradients of query_pre / key_pre (into the free d_attn_out / d_value) */
    const float scale = sqrtf((float)dh), eps = 1.1920928955078125e-07f;
    float *d_query_pre = d->d_attn_out, *d_key_pre = d->d_value;
    gk_rope_l2norm_backward(s, d_query_pre, NULL, d->d_query, L->query_pre, L->q_norm, NULL, g.cos, g.sin, N, T, Hq, dh,
                            g.rd, scale, eps);
    gk_rope_l2norm_backward(s, d_key_pre, G->temp, d->d_key, L->key_pre, L->k_norm, W->temp, g.cos, g.sin, N, T, Hkv,
                            dh, g.rd, scale, eps);
    /* 3. q-k mean skip → dY (conv output) and dX (direct path) */
    gpu_zero(gm, d->d_conv_out, (size_t)N * C);
    gpu_zero(gm, d->d_qk_down, (size_t)N * C);
    gk_qk_mean_backward(s, d->d_conv_out, d->d_qk_down, d_query_pre, d_key_pre, N, Hq, Hkv, dh);
    /* 2. convolutions */
    (conv_tc(gm) ? gk_cca_conv_backward_bf16 : gk_cca_conv_backward)(
        s, d->d_qk_down, G->conv_dw_w, G->conv_dw_b, G->conv_gr_w, G->conv_gr_b, d->d_conv_mid, d->d_conv_out,
        L->qk_down, L->conv_mid, W->conv_dw_w, W->conv_gr_w, B, T, C, dh, c->cca_time0, c->cca_time1);
    /* 1. down projections (dX has row stride C): dX rounded once for its four products (each rounded the whole
     * strided span before) */
    const uint16_t *dx16 = op16(gm, 0, d->d_qk_down, N, C);
    /* the k columns start Cq values in: shared only where that keeps the 256-byte alignment a rounded copy of
     * their own has (the product's algorithm depends on the operands' alignment, so this keeps its bits) */
    const uint16_t *dk16 = Cq % 128 == 0 ? at16(dx16, Cq) : NULL;
    mm16(gm, 0, 0, N, D, Cq, d->d_qk_down, dx16, C, W->w_q, gpu_bf16_of(gm, W->w_q), D, 1, d->d_u, D);
    mm16(gm, 1, 0, Cq, D, N, d->d_qk_down, dx16, C, L->u_attn, u16, D, 1, G->w_q, D);
    mm16(gm, 0, 0, N, D, Ck, d->d_qk_down + Cq, dk16, C, W->w_k, gpu_bf16_of(gm, W->w_k), D, 1, d->d_u, D);
    mm16(gm, 1, 0, Ck, D, N, d->d_qk_down + Cq, dk16, C, L->u_attn, u16, D, 1, G->w_k, D);
}

/* What a backward needs before its launches: the targets on the device, and the embedding gradient's plan (rows
 * grouped by token, built on the host from the forward's tokens; its size goes up with it). */
static void backward_inputs(GpuModel *gm, const int32_t *targets) {
    const int N = gm->a.B * gm->a.T;
    targets_input(gm, targets);
    int32_t *rows_by_tok = gm->h_plan, *start = gm->h_plan + N, *tok = gm->h_plan + 2 * N + 1;
    gm->h_plan[3 * N + 1] = gk_embed_plan(gm->h_tokens, N, gm->cfg.vocab_size, rows_by_tok, start, tok, gm->h_work);
    gpu_upload_async(&gm->g, gm->plan, gm->h_plan, (size_t)(3 * N + 2) * sizeof(int32_t));
}

/* The loss and the backward's launches over backward_inputs' targets and plan. */
static void backward_work(GpuModel *gm) {
    const ZayaConfig *c = &gm->cfg;
    Activations *a = &gm->a;
    GkStream s = gm->g.stream;
    const int N = a->B * a->T, D = c->hidden_size, R = c->router_hidden_size, V = c->vocab_size;
    const Weights *w = &gm->w;
    Weights *g = &gm->gw;
    BackwardScratch *d = &a->d;
    double t0 = gpu_tick(gm);
    /* loss and head: d_final = d_logits · head. With the bf16 operands shared (op16), the cross-entropy writes the
     * logits' gradient as bf16 bits into d_logits' memory and both products read those: the values each product
     * would have rounded for itself, without the fp32 gradient's write and two rounding passes over N x V (at
     * ZAYA1-8B's 262,272-token vocabulary ~8 ms of every 8,192-token micro-batch on an H200). Placed on a 256-byte
     * boundary inside the buffer (half its bytes suffice), as the products' own rounded copies are, so cuBLASLt picks
     * the same algorithm for it and the step keeps its bits. */
    const int ce16 = gm->bf16 && gm->op16[0] && gm->op16_elems > 0 && (size_t)N * V >= 256;
    uint16_t *dl16 = ce16 ? (uint16_t *)(((uintptr_t)d->d_logits + 255) & ~(uintptr_t)255) : NULL;
    float *dl = ce16 ? NULL : d->d_logits;
    loss_work(gm, dl, dl16);
    mm16(gm, 0, 0, N, D, V, dl, dl16, V, w->lm_head, gpu_bf16_of(gm, w->lm_head), D, 0, d->d_final, D);
    mm16(gm, 1, 0, V, D, N, dl, dl16, V, a->final_normed, NULL, D, 1, g->lm_head, D);
    gpu_tock(gm, PHASE_HEAD, &t0);
    const int Last = c->num_layers - 1;
    gpu_zero(gm, d->d_x, (size_t)N * D);
    {
        const LayerWeights *W = &w->layers[Last];
        LayerWeights *G = &g->layers[Last];
        LayerActs *L = &a->layers[Last];
        gk_rmsnorm_merge_backward(s, d->d_x, d->d_h, g->final_norm, G->mlp_hs, G->mlp_hb, G->mlp_rs, G->mlp_rb,
                                  d->d_final, a->x_final, w->final_norm, a->final_rstd, L->moe_out, L->x_mid, W->mlp_hs,
                                  W->mlp_hb, W->mlp_rs, W->mlp_rb, N, D);
    }
    /* router-state gradients ping-pong between two buffers across layers */
    float *dz = d->d_z, *dz_prev = d->d_z_carry;
    gpu_zero(gm, dz, (size_t)N * R);
    for (int l = Last; l >= 0; l--) {
        const LayerWeights *W = &w->layers[l];
        LayerWeights *G = &g->layers[l];
        LayerActs *L = &a->layers[l];
        const float *r_prev = l > 0 ? a->layers[l - 1].router_z : NULL;
        gpu_tock(gm, PHASE_NORMS, &t0);
        moe_backward(gm, l, W, G, L, r_prev, dz, dz_prev);
        t0 = gpu_tick(gm);
        float *t = dz;
        dz = dz_prev;
        dz_prev = t;
        gk_rmsnorm_merge_backward(s, d->d_x, d->d_h, G->post_norm, G->attn_hs, G->attn_hb, G->attn_rs, G->attn_rb,
                                  d->d_u, L->x_mid, W->post_norm, L->rstd_mlp, L->attn_proj, L->x_in, W->attn_hs,
                                  W->attn_hb, W->attn_rs, W->attn_rb, N, D);
        gpu_zero(gm, d->d_u, (size_t)N * D);
        gpu_tock(gm, PHASE_NORMS, &t0);
        if (c->attention == ZY_ATTN_CCA)
            cca_backward(gm, l, W, G, L);
        else
            mha_backward(gm, l, W, G, L);
        gpu_tock(gm, PHASE_ATTENTION, &t0);
        if (l > 0) {
            const LayerWeights *Wp = &w->layers[l - 1];
            LayerWeights *Gp = &g->layers[l - 1];
            LayerActs *Lp = &a->layers[l - 1];
            gk_rmsnorm_merge_backward(s, d->d_x, d->d_h, G->input_norm, Gp->mlp_hs, Gp->mlp_hb, Gp->mlp_rs, Gp->mlp_rb,
                                      d->d_u, L->x_in, W->input_norm, L->rstd_attn, Lp->moe_out, Lp->x_mid, Wp->mlp_hs,
                                      Wp->mlp_hb, Wp->mlp_rs, Wp->mlp_rb, N, D);
        } else {
            gk_rmsnorm_backward(s, d->d_x, G->input_norm, d->d_u, L->x_in, W->input_norm, L->rstd_attn, N, D);
        }
    }
    /* the embedding gradient: rows grouped by token (backward_inputs' plan of this batch's tokens), summed in order */
    gk_embed_backward(s, g->embed, g->in_bias, g->in_scale, d->d_x, w->embed, a->tokens, w->in_bias, w->in_scale, N, D,
                      c->pad_token_id, gm->plan, gm->plan + N, gm->plan + 2 * N + 1, gm->plan + 3 * N + 1);
    gpu_tock(gm, PHASE_NORMS, &t0);
}

int gpu_model_backward(GpuModel *gm, const int32_t *targets, ZyErr *err) {
    if (!gm->grads) return zy_fail(err, "the GPU model was opened for inference (no gradients)");
    gm->failed = 0;
    backward_inputs(gm, targets);
    backward_work(gm);
    gm->n_parts++;
    return pass_status(gm, err);
}

/* ---- a training micro-batch as a CUDA graph (ZAYA_GPU_GRAPHS=1; off by default until timed on a GPU) ----------
 * Between forward_inputs / backward_inputs (tokens, targets, the embedding plan and its size copied up) and the
 * optimizer, a micro-batch's launches depend on nothing but the shape [B, T] and the buffers: the experts' products
 * are sized on the device (grouped), the loss counts its valid targets on the device and the embedding gradient reads
 * its plan's size there. So the forward, loss and backward are captured once and replayed as one launch. Not where
 * anything in them waits on the host or times itself: fp32 runs and ZAYA_GPU_EXPERTS=loop (each layer's offsets come
 * to the host), the phase breakdown (gpu_model_set_timing), cuDNN's attention (its plans and scratch are made at
 * first use, inside what would be the capture). A refused capture turns graphs off for the model, and the passes run
 * as launches: the same launches, the same bits. */
static const char *graphs_unfit(const GpuModel *gm) {
    if (!gm->bf16) return "fp32 runs wait on the host for each MoE layer's expert sizes";
    if (!gpu_model_experts_grouped(gm)) return "the experts' products are not grouped (ZAYA_GPU_EXPERTS=loop or a GPU before sm_80)";
    if (gm->tm) return "the phase breakdown drains the queue at each phase";
    if (gm->attn_cudnn) return "cuDNN's attention makes its plans at first use";
    return NULL;
}

/* The micro-batch graph of the current shape and buffers, captured now where there is none; NULL: run as launches. */
static void *micro_graph(GpuModel *gm) {
    if (!gm->graphs || graphs_unfit(gm)) return NULL;
    /* the buffers that can move without a new shape (gpu_model_set_shape retires the graph itself) */
    const void *bufs[4] = {gm->g.scratch[0], gm->g.scratch[1], gm->op16[0], gm->op16[1]};
    if (gm->micro_graph && !memcmp(bufs, gm->micro_graph_bufs, sizeof bufs)) return gm->micro_graph;
    gpu_graph_free(gm->micro_graph); /* captured over buffers that moved since (each move waited for the stream) */
    gm->micro_graph = NULL;
    ZyErr e;
    void *exec = NULL;
    int kernels = 0;
    if (gpu_graph_begin(&gm->g, &e)) goto refused;
    forward_work(gm);
    backward_work(gm);
    if (gpu_graph_end(&gm->g, &exec, &kernels, &e)) goto refused;
    if (gm->failed) {
        e = gm->err;
        gpu_graph_free(exec);
        goto refused;
    }
    memcpy(gm->micro_graph_bufs, bufs, sizeof bufs);
    gm->micro_graph_kernels = kernels;
    return gm->micro_graph = exec;
refused: /* nothing ran: the passes run as launches from now on */
    snprintf(gm->graphs_refused, sizeof gm->graphs_refused, "the capture failed: %.120s", e.msg);
    gm->failed = 0;
    gm->graphs = 0;
    return NULL;
}

int gpu_model_train_micro(GpuModel *gm, const int32_t *tokens, const int32_t *targets, ZyErr *err) {
    if (!gm->grads) return zy_fail(err, "the GPU model was opened for inference (no gradients)");
    gm->failed = 0;
    forward_inputs(gm, tokens);
    backward_inputs(gm, targets);
    void *graph = micro_graph(gm);
    if (graph) {
        if (gpu_graph_launch(&gm->g, graph, err)) return -1;
        gm->micro_graph_replays++;
    } else {
        forward_work(gm);
        backward_work(gm);
    }
    gm->n_parts++;
    return pass_status(gm, err);
}

int gpu_model_graphs(const GpuModel *gm, int *kernels, long *replays, const char **refused) {
    *kernels = gm->micro_graph ? gm->micro_graph_kernels : 0;
    *replays = gm->micro_graph_replays;
    *refused = gm->graphs_refused[0] ? gm->graphs_refused : gm->graphs ? graphs_unfit(gm) : NULL;
    return gm->graphs;
}

int gpu_graphs_requested(int *on, ZyErr *err) {
    const char *graphs = getenv("ZAYA_GPU_GRAPHS");
    *on = graphs && !strcmp(graphs, "1");
    if (graphs && strcmp(graphs, "0") && strcmp(graphs, "1"))
        return zy_fail(err, "ZAYA_GPU_GRAPHS=%s: expected 1 (training micro-batches and decoding steps replayed as CUDA "
                       "graphs) or 0 (off, the default)", graphs);
    return 0;
}
