#include "optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "matmul.h"

void optim_config_default(OptimConfig *c) {
    c->weight_decay = 0.0;
    c->beta1 = 0.9;
    c->beta2 = 0.95;
    c->eps = 1e-8;
    c->muon_momentum = 0.95;
    c->muon_ns_steps = 5;
}

/* A Muon tensor is one matrix [m, n], or a stack of them (experts: [E, m, n]). */
static void matrix_shape(const ParamInfo *p, int *count, int *m, int *n) {
    if (p->ndim == 3) {
        *count = (int)p->shape[0];
        *m = (int)p->shape[1];
        *n = (int)p->shape[2];
    } else {
        *count = 1;
        *m = (int)p->shape[0];
        *n = p->ndim > 1 ? (int)p->shape[1] : 1;
    }
}

size_t muon_workspace_floats(int m, int n) {
    size_t r = (size_t)(m < n ? m : n), c = (size_t)(m < n ? n : m);
    return 2 * r * c + 2 * r * r;
}

int optim_create_block(Optimizer *o, const ParamTable *t, const OptimConfig *cfg, size_t begin, size_t end,
                       ZyErr *err) {
    memset(o, 0, sizeof *o);
    o->cfg = *cfg;
    o->begin = begin;
    o->end = end;
    o->owned = calloc((size_t)(t->count > 0 ? t->count : 1), 1);
    if (!o->owned) return zy_fail(err, "out of memory");
    size_t ws = 0;
    for (int i = 0; i < t->count; i++) {
        const ParamInfo *p = &t->info[i];
        o->owned[i] = p->offset >= begin && p->offset + p->numel <= end;
        if (!o->owned[i] || p->kind != PARAM_MUON) continue;
        int count, m, n;
        matrix_shape(p, &count, &m, &n);
        size_t need = muon_workspace_floats(m, n);
        if (need > ws) ws = need;
    }
    o->ns_work_floats = ws;
    size_t len = end > begin ? end - begin : 0;
    o->exp_avg = zy_calloc((len ? len : 1) * sizeof(float));
    o->exp_avg_sq = zy_calloc((len ? len : 1) * sizeof(float));
    o->ns_work = zy_calloc((ws ? ws : 1) * sizeof(float));
    if (!o->exp_avg || !o->exp_avg_sq || !o->ns_work) {
        optim_free(o);
        return zy_fail(err, "out of memory allocating optimizer state (%zu MB)", 2 * len * sizeof(float) >> 20);
    }
    return 0;
}

int optim_create(Optimizer *o, const ParamTable *t, const OptimConfig *cfg, ZyErr *err) {
    return optim_create_block(o, t, cfg, 0, t->total, err);
}

/* Optimizer work of one tensor, for balancing the ZeRO-1 blocks. */
static double update_cost(const ParamInfo *p) {
    if (p->kind == PARAM_BUFFER) return 0;
    if (p->kind == PARAM_ADAMW) return 10.0 * (double)p->numel;
    int count, m, n;
    matrix_shape(p, &count, &m, &n);
    double r = m < n ? m : n, c = m < n ? n : m;
    return count * (5.0 * (4.0 * r * r * c + 2.0 * r * r * r) + 10.0 * r * c);
}

void zero1_partition(const ParamTable *t, int n, size_t *bounds) {
    double total = 0;
    for (int i = 0; i < t->count; i++) total += update_cost(&t->info[i]);
    bounds[0] = 0;
    int block = 1;
    double acc = 0;
    for (int i = 0; i < t->count && block < n; i++) {
        acc += update_cost(&t->info[i]);
        /* block k ends after the first tensor that takes the running cost to k/n of the total */
        size_t end = i + 1 < t->count ? t->info[i + 1].offset : t->total;
        while (block < n && acc >= total * block / n) bounds[block++] = end;
    }
    while (block <= n) bounds[block++] = t->total;
}

double grad_sumsq_owned(const Optimizer *o, const ParamTable *t) {
    double ss = 0;
    for (int i = 0; i < t->count; i++) {
        const ParamInfo *p = &t->info[i];
        if (!param_trainable(p) || !o->owned[i]) continue;
        const float *g = t->grad + p->offset;
        for (size_t j = 0; j < p->numel; j++) ss += (double)g[j] * g[j];
    }
    return ss;
}

void grad_scale_owned(const Optimizer *o, ParamTable *t, double s) {
    const float f = (float)s;
    for (int i = 0; i < t->count; i++) {
        const ParamInfo *p = &t->info[i];
        if (!param_trainable(p) || !o->owned[i]) continue;
        float *g = t->grad + p->offset;
        for (size_t j = 0; j < p->numel; j++) g[j] *= f;
    }
}

void optim_free(Optimizer *o) {
    zy_free(o->exp_avg);
    zy_free(o->exp_avg_sq);
    zy_free(o->ns_work);
    free(o->owned);
    memset(o, 0, sizeof *o);
}

void newton_schulz5(float *out, const float *G, int m, int n, int steps, float *work) {
    const float a = 3.4445f, b = -4.7750f, c = 2.0315f;
    const int transposed = m > n, r = transposed ? n : m, cols = transposed ? m : n;
    float *X = work, *Xn = X + (size_t)r * cols, *A = Xn + (size_t)r * cols, *B = A + (size_t)r * r;
    double ss = 0;
    for (size_t i = 0; i < (size_t)m * n; i++) ss += (double)G[i] * G[i];
    const float inv = (float)(1.0 / (sqrt(ss) + 1e-7));
    if (transposed) {
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++) X[(size_t)j * cols + i] = G[(size_t)i * n + j] * inv;
    } else {
        for (size_t i = 0; i < (size_t)m * n; i++) X[i] = G[i] * inv;
    }
    for (int it = 0; it < steps; it++) {
        zy_gemm(0, 1, r, r, cols, 1.0f, X, cols, X, cols, 0.0f, A, r); /* A = X Xᵀ */
        for (size_t i = 0; i < (size_t)r * r; i++) B[i] = b * A[i];
        zy_gemm(0, 0, r, r, r, c, A, r, A, r, 1.0f, B, r); /* B = bA + cA² */
        for (size_t i = 0; i < (size_t)r * cols; i++) Xn[i] = a * X[i];
        zy_gemm(0, 0, r, cols, r, 1.0f, B, r, X, cols, 1.0f, Xn, cols); /* X = aX + BX */
        float *tmp = X;
        X = Xn;
        Xn = tmp;
    }
    if (transposed) {
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++) out[(size_t)i * n + j] = X[(size_t)j * cols + i];
    } else {
        memcpy(out, X, (size_t)m * n * sizeof(float));
    }
}

/* Muon (Moonlight's AdamW-RMS matching): M ← μM + G; N = G + μM; W ← W − lr·(0.2·√max(m,n)·NS5(N) + wd·W).
 * The Nesterov vector N is built in the Newton–Schulz output buffer's place (`update`). */
static void muon_update(Optimizer *o, float *w, const float *g, float *mom, int m, int n, double lr, float *update) {
    const float mu = (float)o->cfg.muon_momentum;
    const size_t len = (size_t)m * n;
    for (size_t i = 0; i < len; i++) {
        mom[i] = mu * mom[i] + g[i];
        update[i] = g[i] + mu * mom[i];
    }
    newton_schulz5(update, update, m, n, o->cfg.muon_ns_steps, o->ns_work);
    const float scale = (float)(0.2 * sqrt((double)(m > n ? m : n)) * lr), decay = (float)(lr * o->cfg.weight_decay);
    for (size_t i = 0; i < len; i++) w[i] -= scale * update[i] + decay * w[i];
}

/* AdamW exactly as torch.optim.AdamW orders it: decay, moments, bias-corrected step. Weight decay applies to
 * tensors with 2+ dims (embedding, head, conv kernels), not to vectors (norms, biases, scales, temp, γ). */
static void adamw_update(const Optimizer *o, const ParamInfo *p, float *w, const float *g, float *m, float *v,
                         double lr) {
    const double b1 = o->cfg.beta1, b2 = o->cfg.beta2;
    const double bc1 = 1.0 - pow(b1, (double)o->step), bc2_sqrt = sqrt(1.0 - pow(b2, (double)o->step));
    const float step_size = (float)(lr / bc1), eps = (float)o->cfg.eps;
    const float decay = p->ndim >= 2 ? (float)(1.0 - lr * o->cfg.weight_decay) : 1.0f;
    const float fb1 = (float)b1, fb2 = (float)b2, inv_bc2 = (float)(1.0 / bc2_sqrt);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < p->numel; i++) {
        w[i] *= decay;
        m[i] += (g[i] - m[i]) * (1.0f - fb1);
        v[i] = fb2 * v[i] + (1.0f - fb2) * g[i] * g[i];
        float denom = sqrtf(v[i]) * inv_bc2 + eps;
        w[i] -= step_size * (m[i] / denom);
    }
}

void optim_step(Optimizer *o, ParamTable *t, double lr) {
    o->step++;
    /* The Nesterov/NS output buffer: reuse the second-moment slot of a Muon tensor, which Muon leaves unused. */
    for (int i = 0; i < t->count; i++) {
        const ParamInfo *p = &t->info[i];
        if (!param_trainable(p) || !o->owned[i]) continue;
        float *w = t->data + p->offset, *g = t->grad + p->offset;
        float *m = optim_state(o, p, 0), *v = optim_state(o, p, 1);
        if (p->kind == PARAM_MUON) {
            int count, rows, cols;
            matrix_shape(p, &count, &rows, &cols);
            size_t len = (size_t)rows * cols;
            for (int k = 0; k < count; k++)
                muon_update(o, w + k * len, g + k * len, m + k * len, rows, cols, lr, v + k * len);
        } else {
            adamw_update(o, p, w, g, m, v, lr);
        }
    }
}

double grad_global_norm(const ParamTable *t) {
    double ss = 0;
    for (int i = 0; i < t->count; i++) {
        const ParamInfo *p = &t->info[i];
        if (!param_trainable(p)) continue;
        const float *g = t->grad + p->offset;
        for (size_t j = 0; j < p->numel; j++) ss += (double)g[j] * g[j];
    }
    return sqrt(ss);
}

void grad_scale(ParamTable *t, double s) {
    const float f = (float)s;
    for (int i = 0; i < t->count; i++) {
        const ParamInfo *p = &t->info[i];
        if (!param_trainable(p)) continue;
        float *g = t->grad + p->offset;
        for (size_t j = 0; j < p->numel; j++) g[j] *= f;
    }
}

double clip_coefficient(double max_norm, double norm) {
    if (max_norm <= 0) return 1.0;
    double coef = max_norm / (norm + 1e-6);
    return coef < 1.0 ? coef : 1.0;
}

double grad_clip(ParamTable *t, double max_norm, double norm) {
    double coef = clip_coefficient(max_norm, norm);
    if (coef < 1.0) grad_scale(t, coef);
    return coef;
}

double schedule_lr(const Schedule *s, int64_t step) {
    if (s->warmup_steps > 0 && step < s->warmup_steps) return s->peak_lr * (double)(step + 1) / (double)s->warmup_steps;
    const double floor_lr = s->peak_lr * s->min_ratio;
    const int64_t after = step - s->warmup_steps, span = s->total_steps - s->warmup_steps;
    switch (s->type) {
    case SCHEDULE_CONSTANT:
        return s->peak_lr;
    case SCHEDULE_COSINE: {
        if (span <= 1) return s->peak_lr;
        double progress = fmin(1.0, (double)after / (double)(span - 1));
        return floor_lr + 0.5 * (s->peak_lr - floor_lr) * (1.0 + cos(M_PI * progress));
    }
    case SCHEDULE_WSD: {
        int64_t decay_steps = (int64_t)llround(s->decay_fraction * (double)s->total_steps);
        int64_t decay_start = s->total_steps - decay_steps;
        if (step < decay_start || decay_steps <= 0) return s->peak_lr;
        double progress = (double)(step - decay_start + 1) / (double)decay_steps;
        return s->peak_lr + (floor_lr - s->peak_lr) * fmin(1.0, progress);
    }
    }
    return s->peak_lr;
}

int balancer_create(Balancer *b, int num_layers, int num_experts, double lr, ZyErr *err) {
    memset(b, 0, sizeof *b);
    b->num_layers = num_layers;
    b->num_experts = num_experts;
    b->lr = lr;
    b->beta1 = 0.9;
    b->beta2 = 0.999;
    b->eps = 1e-8;
    b->exp_avg = calloc((size_t)num_layers * num_experts, sizeof(double));
    b->exp_avg_sq = calloc((size_t)num_layers * num_experts, sizeof(double));
    if (!b->exp_avg || !b->exp_avg_sq) {
        balancer_free(b);
        return zy_fail(err, "out of memory");
    }
    return 0;
}

void balancer_free(Balancer *b) {
    free(b->exp_avg);
    free(b->exp_avg_sq);
    memset(b, 0, sizeof *b);
}

void balancer_update(Balancer *b, const int64_t *counts, float *const *biases) {
    const int E = b->num_experts;
    b->step++;
    const double bc1 = 1.0 - pow(b->beta1, (double)b->step), bc2 = 1.0 - pow(b->beta2, (double)b->step);
    for (int l = 0; l < b->num_layers; l++) {
        const int64_t *c = counts + (size_t)l * (E + 1);
        int64_t total = 0;
        for (int e = 0; e <= E; e++) total += c[e];
        if (total == 0) continue;
        for (int e = 0; e < E; e++) { /* the skip expert (index E) is held */
            double g = (double)c[e] / (double)total - 1.0 / E;
            double *m = &b->exp_avg[(size_t)l * E + e], *v = &b->exp_avg_sq[(size_t)l * E + e];
            *m = b->beta1 * *m + (1 - b->beta1) * g;
            *v = b->beta2 * *v + (1 - b->beta2) * g * g;
            biases[l][e] -= (float)(b->lr * (*m / bc1) / (sqrt(*v / bc2) + b->eps));
        }
    }
}

double routing_entropy(const int64_t *counts, int num_experts) {
    int64_t total = 0;
    for (int e = 0; e < num_experts; e++) total += counts[e];
    if (total == 0 || num_experts < 2) return 0.0;
    double h = 0;
    for (int e = 0; e < num_experts; e++) {
        if (!counts[e]) continue;
        double p = (double)counts[e] / (double)total;
        h -= p * log(p);
    }
    return h / log((double)num_experts);
}
