/* model_stats: what a model shape costs — parameters (total and active per token), KV cache bytes per token,
 * training FLOPs per token — from its config alone, for `zaya ablate` and `zaya info`. */
#ifndef ZAYA_MODEL_STATS_H
#define ZAYA_MODEL_STATS_H

#include <stdint.h>

#include "model/config.h"
#include "util/util.h"

typedef struct {
    int64_t total;          /* trained parameters (tied embeddings once; balancing biases are buffers, not counted) */
    int64_t active;         /* those a token passes through: all but the E-1 experts it is not routed to */
    int64_t embedding;      /* the embedding (and an untied head) within total */
    int64_t kv_bytes_per_token;  /* 2 · L · Hkv · dh values in bf16: what a serving cache holds per token */
    double train_flops_per_token; /* 6 x active matrix parameters + attention, at the given sequence length */
} ModelStats;

/* Counts from the layout model.c would build for cfg (so every variant is counted as it is laid out); the FLOPs
 * are model_train_flops_per_token at sequence length seq_len. */
int model_stats_of(ModelStats *s, const ZayaConfig *cfg, int seq_len, ZyErr *err);

#endif
