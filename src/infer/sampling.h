/* sampling: picking the next token from a logits vector — greedy, temperature, top-k, top-p (nucleus). */
#ifndef ZAYA_SAMPLING_H
#define ZAYA_SAMPLING_H

#include <stdint.h>

#include "util/util.h"

typedef struct {
    double temperature; /* 0: greedy (argmax); otherwise logits are divided by it */
    int top_k;          /* keep the k most likely tokens; 0 = all */
    double top_p;       /* keep the smallest set of most likely tokens whose probability reaches top_p; 1 = all */
} SamplingParams;

/* Scratch for one vocabulary size, allocated once (no allocation per token). */
typedef struct {
    int V;
    int n_allowed;  /* only ids < n_allowed are drawn (default V): a tokenizer smaller than a padded vocabulary */
    float *probs;   /* [V] */
    int32_t *order; /* [V] candidate token ids */
    double *bucket_mass; /* [SAMPLER_BUCKETS] probability mass per histogram bucket (top-p) */
} Sampler;

#define SAMPLER_BUCKETS 32768 /* the top 16 bits of a non-negative float */

/* Checks the parameters: temperature >= 0, top_k >= 0, 0 < top_p <= 1 (errors name the flag). */
int sampling_validate(const SamplingParams *p, ZyErr *err);
int sampler_create(Sampler *s, int V, ZyErr *err);
void sampler_free(Sampler *s);

/* Index of the largest logit (the first one on ties); NaNs are never chosen unless all are NaN. */
int32_t sample_argmax(const float *logits, int V);
/* Draws the next token. Greedy when temperature == 0 (rng not touched). Otherwise: softmax(logits / T) in double,
 * restricted to the top_k most likely, then to the smallest prefix (by decreasing probability, ties by lower id)
 * whose mass reaches top_p of what is left, renormalised, sampled with one uniform draw from rng. */
int32_t sample_next(Sampler *s, const SamplingParams *p, const float *logits, ZyRng *rng);

#endif
