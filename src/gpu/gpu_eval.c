/* zaya eval on a GPU (gpu_eval.h): the EvalRunner callbacks over gpu_model.h and gpu_decode.h. */
#include "gpu/gpu_eval.h"

#include <stdlib.h>
#include <string.h>

#include "gpu/gpu_decode.h"
#include "gpu/gpu_model.h"

struct GpuEvalRunner {
    const Model *m;
    GpuModel *gm;
    GpuKVCache *c; /* open between open_cache and close_cache */
    GpuDecode d;
    int32_t *choice; /* the last window's routing, host copies [T], [T], [T, classes] */
    float *gate, *probs;
    int routing_T, routing_cap;
};

/* ---- task scoring: a one-sequence GPU cache behind its DecodeBackend ---- */

static int open_cache(void *x, int max_len, DecodeBackend *be, ZyErr *err) {
    GpuEvalRunner *r = x;
    if (gpu_kvcache_create(&r->c, r->gm, 1, max_len, 0, err)) return -1;
    *be = gpu_decode_backend(&r->d, r->gm, r->c);
    return 0;
}
static void close_cache(void *x) {
    GpuEvalRunner *r = x;
    gpu_kvcache_free(r->c);
    r->c = NULL;
}

/* ---- held-out windows ---- */

static int window(void *x, const int32_t *tokens, const int32_t *targets, int T, double *mean_loss, ZyErr *err) {
    GpuEvalRunner *r = x;
    if (gpu_model_set_shape(r->gm, 1, T, err) || gpu_model_forward(r->gm, tokens, err) ||
        gpu_model_loss(r->gm, targets, err) || gpu_model_take_loss(r->gm, mean_loss, err))
        return -1;
    if (T > r->routing_cap) {
        const int K = cfg_router_classes(&r->m->cfg);
        free(r->choice), free(r->gate), free(r->probs);
        r->choice = malloc((size_t)T * sizeof *r->choice);
        r->gate = malloc((size_t)T * sizeof *r->gate);
        r->probs = malloc((size_t)T * (K > 0 ? K : 1) * sizeof *r->probs);
        r->routing_cap = r->choice && r->gate && r->probs ? T : 0;
        if (!r->routing_cap) return zy_fail(err, "out of memory");
    }
    r->routing_T = T;
    return 0;
}

static int window_routing(void *x, int layer, const int32_t **choice, const float **gate, const float **probs,
                          ZyErr *err) {
    GpuEvalRunner *r = x;
    if (gpu_model_routing(r->gm, layer, r->choice, r->gate, r->probs, err)) return -1;
    *choice = r->choice, *gate = r->gate, *probs = r->probs;
    return 0;
}

int gpu_eval_runner_create(GpuEvalRunner **out, EvalRunner *run, const Model *m, int device, int bf16, ZyErr *err) {
    *out = NULL;
    GpuEvalRunner *r = calloc(1, sizeof *r);
    if (!r) return zy_fail(err, "out of memory");
    r->m = m;
    if (gpu_model_create(&r->gm, m, device, 1, 1, bf16, 0, err)) {
        free(r);
        return -1;
    }
    *run = (EvalRunner){.ctx = r, .open_cache = open_cache, .close_cache = close_cache, .window = window,
                        .window_routing = window_routing};
    *out = r;
    return 0;
}

void gpu_eval_runner_free(GpuEvalRunner *r) {
    if (!r) return;
    gpu_kvcache_free(r->c);
    gpu_model_free(r->gm);
    free(r->choice), free(r->gate), free(r->probs);
    free(r);
}

const char *gpu_eval_runner_device(const GpuEvalRunner *r) { return gpu_model_device(r->gm); }
