/* Next-token sampling. Candidates are ordered only as far as needed: plain temperature sampling needs no order,
 * top-k keeps a heap of the best k, top-p alone sorts only the histogram bucket where the mass crosses p. */
#include "infer/sampling.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int sampling_validate(const SamplingParams *p, ZyErr *err) {
    if (!(p->temperature >= 0) || !isfinite(p->temperature))
        return zy_fail(err, "--temperature must be a finite number >= 0 (got %g)", p->temperature);
    if (p->top_k < 0) return zy_fail(err, "--top-k must be >= 0 (got %d)", p->top_k);
    if (!(p->top_p > 0 && p->top_p <= 1)) return zy_fail(err, "--top-p must be in (0, 1] (got %g)", p->top_p);
    if (!(p->min_p >= 0 && p->min_p <= 1)) return zy_fail(err, "--min-p must be in [0, 1] (got %g)", p->min_p);
    return 0;
}

int sampler_create(Sampler *s, int V, ZyErr *err) {
    memset(s, 0, sizeof *s);
    if (V <= 0) return zy_fail(err, "sampler: vocabulary size %d", V);
    s->V = s->n_allowed = V;
    s->probs = malloc((size_t)V * sizeof *s->probs);
    s->order = malloc((size_t)V * sizeof *s->order);
    s->bucket_mass = malloc(SAMPLER_BUCKETS * sizeof *s->bucket_mass);
    if (!s->probs || !s->order || !s->bucket_mass) {
        sampler_free(s);
        return zy_fail(err, "out of memory");
    }
    return 0;
}

void sampler_free(Sampler *s) {
    free(s->probs);
    free(s->order);
    free(s->bucket_mass);
    memset(s, 0, sizeof *s);
}

int32_t sample_argmax(const float *logits, int V) {
    int32_t best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best] || (isnan(logits[best]) && !isnan(logits[i]))) best = i;
    return best;
}

/* Decreasing probability, then increasing id: a total order, so results do not depend on the sort algorithm. */
static int before(const float *p, int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); }

static void sift_down(const float *p, int32_t *h, int n, int i) { /* min-heap under `before` reversed */
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && before(p, h[m], h[l])) m = l;
        if (r < n && before(p, h[m], h[r])) m = r;
        if (m == i) return;
        int32_t t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

/* Sorts ids[0..n) by `before` (heap sort: no comparator context needed, no allocation). */
static void sort_ids(const float *p, int32_t *ids, int n) {
    for (int i = n / 2 - 1; i >= 0; i--) sift_down(p, ids, n, i);
    for (int m = n - 1; m > 0; m--) { /* the root is the worst: move it to the end */
        int32_t t = ids[0];
        ids[0] = ids[m];
        ids[m] = t;
        sift_down(p, ids, m, 0);
    }
}

/* Puts the k first ids under `before` into order[0..k), sorted: a heap of the best k (O(V log k)). */
static void select_top(const float *p, int32_t *order, int V, int k) {
    for (int i = 0; i < k; i++) order[i] = i;
    for (int i = k / 2 - 1; i >= 0; i--) sift_down(p, order, k, i); /* root = the worst kept */
    for (int32_t id = k; id < V; id++)
        if (before(p, id, order[0])) {
            order[0] = id;
            sift_down(p, order, k, 0);
        }
    sort_ids(p, order, k);
}

/* Top-p over the whole vocabulary in O(V): a histogram of the probabilities' top 16 bits (monotonic for positive
 * floats) finds the bucket where the mass crosses the target; only that bucket is sorted. Fills order[0..n) with
 * the nucleus (higher buckets in id order, then the crossing bucket best first) and returns n; *mass its mass. */
static int nucleus(Sampler *s, int V, double target, double *mass) {
    memset(s->bucket_mass, 0, SAMPLER_BUCKETS * sizeof *s->bucket_mass);
    for (int i = 0; i < V; i++) {
        uint32_t bits;
        memcpy(&bits, &s->probs[i], sizeof bits);
        s->bucket_mass[bits >> 16] += s->probs[i];
    }
    int cross = 0;
    double above = 0;
    for (int b = SAMPLER_BUCKETS - 1; b >= 0; b--) {
        if (above + s->bucket_mass[b] >= target || b == 0) {
            cross = b;
            break;
        }
        above += s->bucket_mass[b];
    }
    int n_hi = 0, n_cross = 0;
    for (int i = 0; i < V; i++) { /* higher buckets first (in id order), the crossing bucket collected at the end */
        uint32_t bits;
        memcpy(&bits, &s->probs[i], sizeof bits);
        if ((int)(bits >> 16) > cross) s->order[n_hi++] = i;
    }
    for (int i = 0; i < V; i++) {
        uint32_t bits;
        memcpy(&bits, &s->probs[i], sizeof bits);
        if ((int)(bits >> 16) == cross && s->probs[i] > 0) s->order[n_hi + n_cross++] = i;
    }
    sort_ids(s->probs, s->order + n_hi, n_cross);
    double acc = above;
    int n = n_hi;
    while (n < n_hi + n_cross) {
        acc += s->probs[s->order[n++]];
        if (acc >= target) break;
    }
    if (n == 0) s->order[n++] = sample_argmax(s->probs, V); /* everything underflowed: keep the best */
    *mass = acc;
    return n;
}

int32_t sample_next(Sampler *s, const SamplingParams *p, const float *logits, ZyRng *rng) {
    const int V = s->n_allowed > 0 && s->n_allowed < s->V ? s->n_allowed : s->V;
    if (p->temperature == 0) return sample_argmax(logits, V);
    /* softmax(logits / T), max-shifted; the sum is of the stored (float) values so later walks agree with it */
    const double mx = logits[sample_argmax(logits, V)], invT = 1.0 / p->temperature;
    double sum = 0;
    for (int i = 0; i < V; i++) {
        double e = exp(((double)logits[i] - mx) * invT);
        s->probs[i] = e == e ? (float)e : 0.0f; /* NaN logits never win */
        if (s->probs[i] < p->min_p) s->probs[i] = 0; /* the largest is exp(0) = 1: min_p is relative to it */
        sum += s->probs[i];
    }
    const int top_k = p->top_k > 0 && p->top_k < V ? p->top_k : V;
    if (top_k == V && p->top_p >= 1) { /* plain temperature sampling: no order needed */
        const double r = zy_rng_uniform(rng) * sum;
        double acc = 0;
        int32_t last = 0;
        for (int i = 0; i < V; i++) {
            if (s->probs[i] <= 0) continue;
            acc += s->probs[i];
            last = i;
            if (r < acc) return i;
        }
        return last;
    }
    int n;
    double mass;
    if (top_k == V && V > 4096) { /* top-p alone over a large vocabulary: no full sort */
        n = nucleus(s, V, p->top_p * sum, &mass);
    } else { /* the k most likely in order, then top-p on what top-k kept (as in transformers) */
        select_top(s->probs, s->order, V, top_k);
        double mass_k = 0;
        for (int i = 0; i < top_k; i++) mass_k += s->probs[s->order[i]];
        const double target = p->top_p * mass_k;
        n = top_k;
        mass = mass_k;
        if (p->top_p < 1) { /* the smallest prefix reaching the target */
            double acc = 0;
            for (int i = 0; i < top_k; i++) {
                acc += s->probs[s->order[i]];
                if (acc >= target) {
                    n = i + 1;
                    mass = acc;
                    break;
                }
            }
        }
    }
    /* one uniform draw over the kept mass; rounding can leave it short: then the last kept id */
    const double r = zy_rng_uniform(rng) * mass;
    double acc = 0;
    for (int i = 0; i < n; i++) {
        acc += s->probs[s->order[i]];
        if (r < acc) return s->order[i];
    }
    return s->order[n - 1];
}

/* ---- penalties ------------------------------------------------------------------------------------------------- */

static int repetition_on(const LogitsPenalties *p) { return p->repetition > 0 && p->repetition != 1; }

int logits_penalties_active(const LogitsPenalties *p) {
    return p->n_bias > 0 || p->presence != 0 || p->frequency != 0 || repetition_on(p);
}

static float repeat_penalized(float logit, double r) { return logit > 0 ? (float)(logit / r) : (float)(logit * r); }

void logits_apply_penalties(float *logits, int V, const LogitsPenalties *p, const int32_t *prompt, int n_prompt,
                            const int32_t *output, int n_output, int32_t *counts) {
    for (int i = 0; i < p->n_bias; i++)
        if (p->bias_ids[i] >= 0 && p->bias_ids[i] < V) logits[p->bias_ids[i]] += p->bias[i];
    const int rep = repetition_on(p);
    if (p->presence == 0 && p->frequency == 0 && !rep) return;
    for (int i = 0; i < n_output; i++) counts[output[i]]++;
    for (int i = 0; i < n_output; i++) { /* each distinct output token once; -1 marks it done */
        const int32_t t = output[i];
        if (counts[t] <= 0) continue;
        float l = rep ? repeat_penalized(logits[t], p->repetition) : logits[t];
        logits[t] = (float)(l - p->frequency * counts[t] - p->presence);
        counts[t] = -1;
    }
    for (int i = 0; rep && i < n_prompt; i++) { /* prompt tokens the output does not hold */
        const int32_t t = prompt[i];
        if (counts[t] != 0) continue;
        logits[t] = repeat_penalized(logits[t], p->repetition);
        counts[t] = -1;
    }
    for (int i = 0; i < n_output; i++) counts[output[i]] = 0;
    for (int i = 0; i < n_prompt; i++) counts[prompt[i]] = 0;
}
