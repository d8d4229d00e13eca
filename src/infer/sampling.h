/* sampling: picking the next token from a logits vector — greedy, temperature, min-p, top-k, top-p (nucleus) — and
 * the penalties that adjust the logits from the text so far (logit bias, repetition, presence, frequency). */
#ifndef ZAYA_SAMPLING_H
#define ZAYA_SAMPLING_H

#include <stdint.h>

#include "util/util.h"

typedef struct {
    double temperature; /* 0: greedy (argmax); otherwise logits are divided by it */
    int top_k;          /* keep the k most likely tokens; 0 = all */
    double top_p;       /* keep the smallest set of most likely tokens whose probability reaches top_p; 1 = all */
    double min_p;       /* drop tokens less likely than min_p x the most likely one (after temperature); 0 = off */
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

/* Checks the parameters: temperature >= 0, top_k >= 0, 0 < top_p <= 1, 0 <= min_p <= 1 (errors name the flag). */
int sampling_validate(const SamplingParams *p, ZyErr *err);
int sampler_create(Sampler *s, int V, ZyErr *err);
void sampler_free(Sampler *s);

/* Index of the largest logit (the first one on ties); NaNs are never chosen unless all are NaN. */
int32_t sample_argmax(const float *logits, int V);
/* Draws the next token. Greedy when temperature == 0 (rng not touched). Otherwise: softmax(logits / T) in double,
 * without the tokens below min_p x the largest probability, restricted to the top_k most likely, then to the
 * smallest prefix (by decreasing probability, ties by lower id) whose mass reaches top_p of what is left,
 * renormalised, sampled with one uniform draw from rng (vLLM's order). */
int32_t sample_next(Sampler *s, const SamplingParams *p, const float *logits, ZyRng *rng);

/* Adjustments of the logits that depend on the text so far (vLLM's sampling parameters), made on a copy before
 * sampling, greedy included. */
typedef struct {
    double presence, frequency; /* subtracted: presence once for each token the output holds, frequency x its count */
    double repetition;          /* over the prompt's and the output's tokens: a logit > 0 divided by it, else times;
                                 * 1 or 0 (a zeroed struct) = off */
    const int32_t *bias_ids;    /* logit_bias: added to these ids' logits (ids >= V ignored) */
    const float *bias;
    int n_bias;
} LogitsPenalties;

/* Whether p changes anything (presence = frequency = 0, repetition = 1 or 0 and no bias change nothing). */
int logits_penalties_active(const LogitsPenalties *p);
/* logit_bias first, then the repetition, frequency and presence penalties, as vLLM applies them. counts: [V] zeros
 * of scratch, left zeroed. Ids in prompt and output are < V. */
void logits_apply_penalties(float *logits, int V, const LogitsPenalties *p, const int32_t *prompt, int n_prompt,
                            const int32_t *output, int n_output, int32_t *counts);

#endif
