#include "model/routing.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int routing_counts_create(RoutingCounts *r, int num_layers, int num_experts, ZyErr *err) {
    memset(r, 0, sizeof *r);
    if (num_layers < 1 || num_experts < 1) return zy_fail(err, "routing: %d layers, %d experts", num_layers, num_experts);
    r->counts = calloc((size_t)num_layers * (num_experts + 1), sizeof *r->counts);
    r->sums = calloc((size_t)num_layers * 2, sizeof *r->sums);
    if (!r->counts || !r->sums) {
        routing_counts_free(r);
        return zy_fail(err, "out of memory");
    }
    r->num_layers = num_layers;
    r->num_experts = num_experts;
    return 0;
}

void routing_counts_free(RoutingCounts *r) {
    free(r->counts);
    free(r->sums);
    memset(r, 0, sizeof *r);
}

void routing_counts_reset(RoutingCounts *r) {
    memset(r->counts, 0, (size_t)r->num_layers * (r->num_experts + 1) * sizeof *r->counts);
    memset(r->sums, 0, (size_t)r->num_layers * 2 * sizeof *r->sums);
}

void routing_counts_add_layer(RoutingCounts *r, int layer, const int32_t *choice, const float *gate,
                              const float *probs, int classes, size_t n) {
    const int E = r->num_experts;
    if (classes <= E) probs = NULL; /* no skip class: p_skip stays 0 */
    int64_t *c = r->counts + (size_t)layer * (E + 1);
    double gate_sum = 0, skip_sum = 0;
    for (size_t i = 0; i < n; i++) {
        c[choice[i]]++;
        if (gate && choice[i] < E) gate_sum += gate[i];
        if (probs) skip_sum += probs[i * (size_t)classes + E];
    }
    r->sums[2 * layer] += gate_sum;
    r->sums[2 * layer + 1] += skip_sum;
}

void routing_counts_add(RoutingCounts *r, const RoutingCounts *other) {
    const size_t n = (size_t)r->num_layers * (r->num_experts + 1);
    for (size_t i = 0; i < n; i++) r->counts[i] += other->counts[i];
    for (int i = 0; i < 2 * r->num_layers; i++) r->sums[i] += other->sums[i];
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

LayerRouting routing_layer_stats(const RoutingCounts *r, int layer) {
    const int num_experts = r->num_experts;
    const int64_t *counts = r->counts + (size_t)layer * (num_experts + 1);
    LayerRouting s = {0};
    int64_t real = 0, most = 0;
    for (int e = 0; e < num_experts; e++) {
        real += counts[e];
        if (counts[e] > most) most = counts[e];
    }
    s.tokens = real + counts[num_experts];
    s.entropy = routing_entropy(counts, num_experts);
    s.skip_rate = s.tokens ? (double)counts[num_experts] / (double)s.tokens : 0.0;
    s.max_load = real ? (double)most * num_experts / (double)real : 0.0;
    s.gate = real ? r->sums[2 * layer] / (double)real : 0.0;
    s.p_skip = s.tokens ? r->sums[2 * layer + 1] / (double)s.tokens : 0.0;
    return s;
}

int routing_window_create(RoutingWindow *w, int num_layers, int num_experts, ZyErr *err) {
    memset(w, 0, sizeof *w);
    if (routing_counts_create(&w->total, num_layers, num_experts, err)) return -1;
    w->entropy_sum = calloc((size_t)num_layers, sizeof *w->entropy_sum);
    w->max_load_sum = calloc((size_t)num_layers, sizeof *w->max_load_sum);
    if (!w->entropy_sum || !w->max_load_sum) {
        routing_window_free(w);
        return zy_fail(err, "out of memory");
    }
    w->num_layers = num_layers;
    w->num_experts = num_experts;
    return 0;
}

void routing_window_free(RoutingWindow *w) {
    routing_counts_free(&w->total);
    free(w->entropy_sum);
    free(w->max_load_sum);
    memset(w, 0, sizeof *w);
}

void routing_window_reset(RoutingWindow *w) {
    routing_counts_reset(&w->total);
    memset(w->entropy_sum, 0, (size_t)w->num_layers * sizeof *w->entropy_sum);
    memset(w->max_load_sum, 0, (size_t)w->num_layers * sizeof *w->max_load_sum);
    w->steps = 0;
}

void routing_window_add_step(RoutingWindow *w, const RoutingCounts *step) {
    routing_counts_add(&w->total, step);
    for (int l = 0; l < w->num_layers; l++) {
        LayerRouting s = routing_layer_stats(step, l);
        w->entropy_sum[l] += s.entropy;
        w->max_load_sum[l] += s.max_load;
    }
    w->steps++;
}

LayerRouting routing_window_layer(const RoutingWindow *w, int layer) {
    LayerRouting s = routing_layer_stats(&w->total, layer);
    if (w->steps > 0) {
        s.entropy = w->entropy_sum[layer] / (double)w->steps;
        s.max_load = w->max_load_sum[layer] / (double)w->steps;
    }
    return s;
}
