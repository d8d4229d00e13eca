/* eval: held-out loss on token streams and downstream tasks from JSONL files (multiple choice by log-likelihood,
 * lm-evaluation-harness conventions; exact match by greedy generation). Library code: callable from training. */
#ifndef ZAYA_EVAL_H
#define ZAYA_EVAL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "infer/decode.h"
#include "model/model.h"
#include "model/routing.h"
#include "io/shards.h"
#include "tokenizer/tokenizer.h"
#include "util/util.h"

/* Text <-> ids, as eval needs them: a thin adapter so eval does not depend on one tokenizer implementation.
 * encode/decode return malloc'ed arrays (freed with free()). */
typedef struct {
    void *ctx;
    int (*encode)(void *ctx, const char *text, size_t len, int32_t **ids, size_t *n, ZyErr *err);
    int (*decode)(void *ctx, const int32_t *ids, size_t n, char **bytes, size_t *len, ZyErr *err);
    int32_t bos_id; /* prepended to every context / prompt; -1: none */
    int32_t eos_id; /* ends a generated answer; -1: none */
    int vocab_size; /* ids it can decode are < vocab_size (greedy answers never pick others); 0: the model's */
} EvalTokenizer;

/* The adapter for a zaya Tokenizer: bos/eos are the tokenizer's (tokenizer_special_id: tokenizer_config.json's
 * bos_token / eos_token, the template's, usual names, <|bos|> / <|eos|>), else the model config's ids. */
void eval_tokenizer_from(EvalTokenizer *et, const Tokenizer *t, const ZayaConfig *cfg);

typedef enum { EVAL_TASK_MC, EVAL_TASK_EXACT } EvalTaskType;

typedef struct {
    char name[128];        /* the file's base name without .jsonl */
    EvalTaskType type;
    int n;                 /* examples scored */
    double acc;            /* mc: argmax of Σ log p(choice tokens) matches the answer */
    double acc_norm;       /* mc: the same with Σ log p divided by the choice's length in bytes */
    double exact_match;    /* exact: stripped greedy answer equals the stripped reference */
    double ppl;            /* mc: exp(-Σ log p / Σ tokens) over the correct choices; exact: NAN */
    double seconds;
} EvalResult;

/* Where eval runs the model: the functions below without _on run it on the CPU; the _on ones take a runner (the
 * GPU's: gpu_eval_runner_create, gpu/gpu_decode.h). */
typedef struct {
    void *ctx;
    /* A cache for one sequence of up to max_len tokens behind *be (decode_all set); close_cache frees it. */
    int (*open_cache)(void *ctx, int max_len, DecodeBackend *be, ZyErr *err);
    void (*close_cache)(void *ctx);
    /* The forward of one window (tokens [T], checked) and its mean loss against targets [T]. */
    int (*window)(void *ctx, const int32_t *tokens, const int32_t *targets, int T, double *mean_loss, ZyErr *err);
    /* Layer l's routing in the last window: choice [T], gate [T], router probabilities [T, classes] (host arrays,
     * valid until the next call). */
    int (*window_routing)(void *ctx, int layer, const int32_t **choice, const float **gate, const float **probs,
                          ZyErr *err);
} EvalRunner;

/* Multiple choice ({"context": str, "choices": [str, ...], "answer": int}) or exact match ({"prompt": str,
 * "answer": str}), told apart by the first line's keys; every line is validated first (errors name file:line).
 * limit > 0 scores only the first `limit` examples. Contexts that do not fit max_position_embeddings are cut from
 * the left (after bos), as the harness does. */
int eval_task_file(const Model *m, const Tokenizer *tok, const char *path, int limit, EvalResult *out, ZyErr *err);
/* The same through any tokenizer adapter. */
int eval_task_file_with(const Model *m, const EvalTokenizer *tok, const char *path, int limit, EvalResult *out,
                        ZyErr *err);
/* The same on a runner (NULL: the CPU); m is the host model (its config and vocabulary). */
int eval_task_file_on(const EvalRunner *run, const Model *m, const EvalTokenizer *tok, const char *path, int limit,
                      EvalResult *out, ZyErr *err);

#define EVAL_MAX_ANSWER_TOKENS 32 /* exact match: greedy answer length cap (it also stops at a newline or eos) */

/* A stream of token ids (e.g. a shard split) read by offset. */
typedef struct {
    void *ctx;
    uint64_t n_tokens;
    int (*read)(void *ctx, uint64_t offset, size_t n, int32_t *out, ZyErr *err);
} EvalTokenSource;

/* Mean next-token loss over consecutive windows of seq_len+1 tokens (stride seq_len, so every token after the first
 * is predicted once), at most max_tokens predictions (0 = the whole stream); the last window may be shorter.
 * Uses model_forward / model_loss. *n_scored gets the number of predictions. routes (may be NULL; created for the
 * model's layers and experts) gets each window's routing as one step. */
int eval_token_loss(Model *m, const EvalTokenSource *src, int seq_len, uint64_t max_tokens, RoutingWindow *routes,
                    double *loss, uint64_t *n_scored, ZyErr *err);
/* The same on a runner (NULL: the CPU). */
int eval_token_loss_on(const EvalRunner *run, Model *m, const EvalTokenSource *src, int seq_len, uint64_t max_tokens,
                       RoutingWindow *routes, double *loss, uint64_t *n_scored, ZyErr *err);

/* The same over a shard split's token stream (shardset_open'ed by the caller). */
int eval_shard_loss(Model *m, ShardSet *shards, int seq_len, uint64_t max_tokens, RoutingWindow *routes, double *loss,
                    uint64_t *n_scored, ZyErr *err);
int eval_shard_loss_on(const EvalRunner *run, Model *m, ShardSet *shards, int seq_len, uint64_t max_tokens,
                       RoutingWindow *routes, double *loss, uint64_t *n_scored, ZyErr *err);

/* Writes {"weights": ..., "tasks": [...], "heldout": {...}, "routing": {"windows", "layers": [{"layer", "tokens",
 * "entropy", "skip_rate", "max_load", "gate", "p_skip", "load": [E]}]}} atomically to path (heldout only when
 * n_heldout > 0, routing only when routes holds windows; weights, the dtype the model ran with, when not NULL). */
int eval_write_json(const char *path, const EvalResult *results, int n_results, const char *heldout_name,
                    double heldout_loss, uint64_t n_heldout, const RoutingWindow *routes, const char *weights,
                    ZyErr *err);
/* Per-layer routing health of the held-out windows (nothing when routes is NULL or empty). */
void eval_print_routing(FILE *f, const RoutingWindow *routes);
/* The table on f: task, type, n, acc, acc_norm / exact match, ppl (and the held-out row when n_heldout > 0). */
void eval_print_table(FILE *f, const EvalResult *results, int n_results, const char *heldout_name,
                      double heldout_loss, uint64_t n_heldout);

#endif
