/* The CPU's StepBackend (step.h): forward, backward and the optimizer on the host model, activations in host
 * memory. */
#include "train/step.h"

#include <math.h>
#include <stdlib.h>

typedef struct {
    StepHost h;
    ZyBf16Products products;
    Activations acts;
    int have_acts;
    int B, T;    /* the activations' micro-batch shape */
    double loss; /* Σ of this step's micro-batch losses */
    double *phase_seconds; /* set_timing's timers (NULL: off), kept across set_shape */
} CpuStep;

static int cpu_set_shape(void *x, int B, int T, ZyErr *err) {
    CpuStep *s = x;
    if (s->have_acts) acts_free(&s->acts);
    s->have_acts = 0;
    if (acts_create(&s->acts, &s->h.model->cfg, B, T, err)) return -1;
    acts_set_bf16(&s->acts, s->products);
    s->have_acts = 1;
    s->B = B, s->T = T;
    s->acts.phase_seconds = s->phase_seconds;
    return 0;
}

static void cpu_begin(void *x) {
    CpuStep *s = x;
    params_zero_grad(&s->h.model->params);
    s->loss = 0;
}

static int cpu_micro(void *x, const int32_t *inputs, const int32_t *targets, RoutingCounts *routes, ZyErr *err) {
    CpuStep *s = x;
    Model *m = s->h.model;
    model_forward(m, &s->acts, inputs);
    s->loss += model_backward(m, &s->acts, targets);
    const int classes = cfg_router_classes(&m->cfg);
    for (int l = 0; classes && l < m->cfg.num_layers; l++)
        routing_counts_add_layer(routes, l, s->acts.layers[l].choice, s->acts.layers[l].gate,
                                 s->acts.layers[l].router_probs, classes, (size_t)s->B * s->T);
    return 0;
}

static int cpu_reduce(void *x, int n_micro, int nan_fault, double *loss, double *sumsq, double *comm_seconds,
                      ZyErr *err) {
    CpuStep *s = x;
    ParamTable *p = &s->h.model->params;
    const Dist *d = s->h.dist;
    *loss = s->loss / n_micro;
    if (nan_fault) {
        *loss = NAN;
        p->grad[0] = NAN;
    }
    if (n_micro > 1) grad_scale(p, 1.0 / n_micro); /* mean over micro-batches */
    *comm_seconds = 0;
    if (d->size > 1) { /* ZeRO-1: sum the gradients into each rank's block, then the mean over ranks */
        const double t0 = zy_now_seconds();
        if (dist_reduce_scatter_f32(d, p->grad, s->h.zero_bounds, s->h.grad_scratch, err)) return -1;
        *comm_seconds = zy_now_seconds() - t0;
        grad_scale_owned(s->h.opt, p, 1.0 / d->size);
    }
    *sumsq = grad_sumsq_owned(s->h.opt, p);
    return 0;
}

static int cpu_apply(void *x, double clip, double lr, double *comm_seconds, ZyErr *err) {
    CpuStep *s = x;
    ParamTable *p = &s->h.model->params;
    if (clip < 1.0) grad_scale_owned(s->h.opt, p, clip);
    optim_step(s->h.opt, p, lr);
    /* every rank gets the updated blocks of the others */
    const double t0 = zy_now_seconds();
    if (dist_allgather_f32(s->h.dist, p->data, s->h.zero_bounds, err)) return -1;
    *comm_seconds = zy_now_seconds() - t0;
    return 0;
}

static int cpu_eval_loss(void *x, const int32_t *inputs, const int32_t *targets, double *loss, ZyErr *err) {
    CpuStep *s = x;
    model_forward(s->h.model, &s->acts, inputs);
    *loss = model_loss(s->h.model, &s->acts, targets);
    return 0;
}

static void cpu_set_timing(void *x, double *phase_seconds) {
    CpuStep *s = x;
    s->phase_seconds = phase_seconds;
    if (s->have_acts) s->acts.phase_seconds = phase_seconds;
}

static void cpu_free(void *x) {
    CpuStep *s = x;
    if (s->have_acts) acts_free(&s->acts);
    free(s);
}

int step_backend_cpu(StepBackend *be, const StepHost *h, ZyBf16Products products, ZyErr *err) {
    *be = (StepBackend){0};
    CpuStep *s = calloc(1, sizeof *s);
    if (!s) return zy_fail(err, "out of memory");
    s->h = *h;
    s->products = products;
    *be = (StepBackend){.ctx = s, .set_shape = cpu_set_shape, .begin = cpu_begin, .micro = cpu_micro,
                        .reduce = cpu_reduce, .apply = cpu_apply, .eval_loss = cpu_eval_loss, .set_timing = cpu_set_timing, .free = cpu_free};
    return 0;
}
