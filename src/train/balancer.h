/* balancer: the expert-balancing controller of training, driven by the routing counts (model/routing.h). */
#ifndef ZAYA_BALANCER_H
#define ZAYA_BALANCER_H

#include <stdint.h>

#include "util/util.h"

/* The expert-balancing controller (docs/system.md): after each step, for each MoE layer, f_e = fraction of the
 * step's tokens (global batch) routed to class e drives an AdamW-style update of balancing_biases[e] (no weight
 * decay) with the error g_e = f_e − target_e. With the skip expert held (skip_rate < 0, ZAYA1's released
 * weights: skip bias −1, never chosen), only the E real experts move, target 1/E of the routed tokens. With a
 * skip target s ∈ [0, 1), the skip bias moves too: target s for the skip expert and (1 − s)/E for each real
 * expert, as fractions of all tokens, so the skip expert is a real choice taken by a controlled share of tokens
 * (docs/training.md, "Routing health"). Layers without routing (a dense MLP) have num_classes 0 and are left alone. */
typedef struct {
    int num_layers, num_experts;
    double lr, beta1, beta2, eps;
    double skip_rate;     /* < 0: the skip bias is held */
    int64_t step;
    double *exp_avg, *exp_avg_sq; /* [L, E+1]; the skip slot stays 0 while the skip bias is held */
} Balancer;

int balancer_create(Balancer *b, int num_layers, int num_experts, double lr, double skip_rate, ZyErr *err);
void balancer_free(Balancer *b);
/* counts [L, E+1]: tokens routed to each expert (index E = skip) this step; biases[l] points to layer l's
 * balancing_biases [E+1] (NULL: a layer without routing). Updates the biases in place. */
void balancer_update(Balancer *b, const int64_t *counts, float *const *biases);

#endif
