/* routing: how a MoE model spreads its tokens over the experts. Counts per layer (index E = the skip expert) and the
 * health numbers a researcher checks first (normalised entropy over the real experts, skip rate, max/mean load);
 * training's controller that keeps them healthy is train/balancer.h. */
#ifndef ZAYA_ROUTING_H
#define ZAYA_ROUTING_H

#include <stddef.h>
#include <stdint.h>

#include "util/util.h"

/* Tokens routed to each expert, per layer: counts[l * (E + 1) + e], e == E the skip expert. */
typedef struct {
    int num_layers, num_experts;
    int64_t *counts; /* [L, E+1] */
    double *sums;    /* [L, 2]: Σ gate over the tokens sent to real experts, Σ p_skip over all tokens */
} RoutingCounts;

int routing_counts_create(RoutingCounts *r, int num_layers, int num_experts, ZyErr *err);
void routing_counts_free(RoutingCounts *r);
void routing_counts_reset(RoutingCounts *r);
/* Adds n tokens' choices (0..E) of layer l, with their gates p[choice] and router probabilities [n, classes]
 * (either may be NULL: the sums then stay as they are; classes = E + 1 with the skip expert, E without one, when
 * p_skip stays 0). */
void routing_counts_add_layer(RoutingCounts *r, int layer, const int32_t *choice, const float *gate,
                              const float *probs, int classes, size_t n);
/* Adds another table of the same shape. */
void routing_counts_add(RoutingCounts *r, const RoutingCounts *other);

/* One layer's health. */
typedef struct {
    int64_t tokens;   /* all tokens the layer routed, skip included */
    double entropy;   /* H(f)/ln E of the real experts' shares f_e = n_e / Σ_real n (1.0 = balanced; 0 when no token
                       * reached a real expert) */
    double skip_rate; /* n_E / tokens */
    double max_load;  /* max_e n_e / mean_e n_e over the real experts (1.0 = balanced, E = one expert takes all) */
    double gate;      /* mean gate p[e*] of the tokens sent to real experts: how much of the expert output is kept */
    double p_skip;    /* mean router probability of the skip expert */
} LayerRouting;

/* One layer's health from one table of counts (one step or one batch). */
LayerRouting routing_layer_stats(const RoutingCounts *r, int layer);

/* Routing over a window of steps (a logging interval, or an evaluation's batches). Balance is judged step by
 * step, as the hardware and the controller see it: entropy and max_load are the means of each step's values
 * (pooling the counts would hide a layer that sends every token of a step to one expert and rotates that expert
 * from step to step). Skip rate, gate and p_skip are over all the window's tokens. */
typedef struct {
    int num_layers, num_experts;
    int64_t steps;
    RoutingCounts total;        /* the window's counts and sums */
    double *entropy_sum;        /* [L]: Σ over steps of the step's entropy */
    double *max_load_sum;       /* [L] */
} RoutingWindow;

int routing_window_create(RoutingWindow *w, int num_layers, int num_experts, ZyErr *err);
void routing_window_free(RoutingWindow *w);
void routing_window_reset(RoutingWindow *w);
void routing_window_add_step(RoutingWindow *w, const RoutingCounts *step);
LayerRouting routing_window_layer(const RoutingWindow *w, int layer);
/* Normalised routing entropy H(p)/ln E of the real experts' share p_e = n_e / Σ n (1.0 = balanced). */
double routing_entropy(const int64_t *counts, int num_experts);

#endif
