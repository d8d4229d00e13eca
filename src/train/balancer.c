#include "train/balancer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int balancer_create(Balancer *b, int num_layers, int num_experts, double lr, double skip_rate, ZyErr *err) {
    memset(b, 0, sizeof *b);
    b->num_layers = num_layers;
    b->num_experts = num_experts;
    b->lr = lr;
    b->beta1 = 0.9;
    b->beta2 = 0.999;
    b->eps = 1e-8;
    b->skip_rate = skip_rate;
    b->exp_avg = calloc((size_t)num_layers * (num_experts + 1), sizeof(double));
    b->exp_avg_sq = calloc((size_t)num_layers * (num_experts + 1), sizeof(double));
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
    const int E = b->num_experts, held = b->skip_rate < 0;
    b->step++;
    const double bc1 = 1.0 - pow(b->beta1, (double)b->step), bc2 = 1.0 - pow(b->beta2, (double)b->step);
    for (int l = 0; l < b->num_layers; l++) {
        if (!biases[l]) continue;
        const int64_t *c = counts + (size_t)l * (E + 1);
        /* held: shares of the routed tokens (the skip expert is never chosen then); else of all tokens */
        int64_t total = 0;
        for (int e = 0; e <= E; e++) total += c[e];
        if (total == 0) continue;
        for (int e = 0; e < (held ? E : E + 1); e++) {
            const double target = held ? 1.0 / E : e == E ? b->skip_rate : (1.0 - b->skip_rate) / E;
            const double g = (double)c[e] / (double)total - target;
            double *m = &b->exp_avg[(size_t)l * (E + 1) + e], *v = &b->exp_avg_sq[(size_t)l * (E + 1) + e];
            *m = b->beta1 * *m + (1 - b->beta1) * g;
            *v = b->beta2 * *v + (1 - b->beta2) * g * g;
            biases[l][e] -= (float)(b->lr * (*m / bc1) / (sqrt(*v / bc2) + b->eps));
        }
    }
}
