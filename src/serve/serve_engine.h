/* serve_engine: continuous batching for zaya serve. One engine thread owns the model's KV block pool (decode.h's
 * KVPool) and runs decoding steps over a ragged batch: every running request adds one token per step, and prompts
 * are prefilled in chunks of at most prefill_chunk tokens alongside them, so a long prompt never stalls the others.
 * A request joins the batch between steps when a slot and the KV blocks for its whole length (prompt + max_tokens)
 * are free; until then it waits in a bounded FIFO queue, and past that the submit fails (HTTP 503). Its blocks go
 * back to the pool the step it ends: at its stop token or string, at max_tokens, or when cancelled (a client that
 * disconnects).
 *
 * n choices of one prompt join together: the first prefills the prompt, the others then continue from its cache
 * (the backend's fork: its full KV blocks shared, reference-counted, the partly filled last one copied) and each
 * samples its own tokens from there. A prompt's log-probabilities (echo) come from the logits of every prompt row,
 * which the prefill asks the step for.
 *
 * Prefix caching (prefix_cache.h; off with no_prefix_cache): a prompt joining the batch first takes the cached full
 * blocks its tokens start with (at most up to its last token, whose logits it needs), and the full blocks every
 * step completes are cached. A prompt whose log-probabilities are wanted (echo) needs every prompt row's logits, which
 * no cached block holds: it is computed in full (its blocks are still cached). When a request's blocks are short,
 * the cache gives back its least recently used blocks that no request holds, so caching never makes a request wait.
 *
 * Text: the engine detokenizes as it goes (the whole generation decoded each token, so byte-fallback and
 * multi-byte characters come out whole), repairs bytes that are not UTF-8 (U+FFFD, as transformers), holds back an
 * incomplete UTF-8 tail and whatever could still become a stop string (matched on the repaired text, as a client sees
 * it), and hands out text deltas. Counters and latency histograms for /metrics live here too. */
#ifndef ZAYA_SERVE_ENGINE_H
#define ZAYA_SERVE_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "infer/decode.h"
#include "infer/prefix_cache.h"
#include "model/model.h"
#include "infer/sampling.h"
#include "serve/serve_request.h"
#include "serve/serve_utf8.h"
#include "tokenizer/tokenizer.h"

typedef struct {
    int max_batch;      /* sequences decoded together (slots) */
    int max_context;    /* tokens per sequence, prompt + output */
    size_t kv_memory;   /* bytes for KV blocks; 0 = enough for max_batch full-context sequences */
    int block_tokens;   /* tokens per KV block */
    int prefill_chunk;  /* prompt tokens per sequence per step */
    int step_tokens;    /* rows per step in all (decode rows + prefill chunks) */
    int max_queue;      /* requests waiting for a slot; more get 503 */
    int threads;        /* OpenMP/BLAS threads of the decoding steps; 0 = the OpenMP default (all cores) */
    int kv_bf16;        /* k̂ and v held as bf16 (half the bytes per token), else fp32 */
    int no_prefix_cache; /* 1: every prompt computed in full (else full blocks are kept and reused, prefix_cache.h;
                          * serve_engine_info sets it where the backend has no prefix cache) */
} ServeEngineOpts;

typedef struct ServeEngine ServeEngine;
typedef struct ServeJob ServeJob;

/* Constrained decoding (structured output, serve_structured.h): each choice's own state masks its logits before
 * sampling (after the penalties) and follows the tokens it samples. Called on the engine thread. */
typedef struct {
    void *(*open)(void *arg);  /* a choice's state at submit; NULL: out of memory */
    /* Sets the logits of the tokens that may not come next to -INFINITY (tokens_left: this token and the ones after
     * it that max_tokens allows; end_ids: the job's stop ids). Returns how many remain; 0 ends the choice. */
    int (*mask)(void *state, float *logits, int V, long tokens_left, const int32_t *end_ids, int n_end);
    int (*accept)(void *state, int32_t token); /* the token taken; 1: nothing may follow it (the choice ends: stop) */
    void (*close)(void *state);
} ServeMaskOps;

/* A request as the engine runs it (copied at submit). */
typedef struct {
    const int32_t *prompt;
    int n_prompt;
    int max_tokens;          /* 0: no output, only the prompt's log-probabilities (prompt_logprobs) */
    SamplingParams sampling;
    LogitsPenalties penalties; /* applied to a copy of the logits before sampling (log-probabilities are before) */
    uint64_t seed;           /* choice j of n samples with seed + j */
    const int32_t *stop_ids; /* tokens that end generation (not part of the text) */
    int n_stop_ids;
    char *const *stop;       /* strings that end generation (cut from the text) */
    int n_stop;
    int include_stop_str;    /* ... or kept in it, the text ending after the stop string */
    int skip_special;        /* special tokens left out of the text */
    int logprobs;            /* -1: none; else the number of alternatives per token */
    int prompt_logprobs;     /* with logprobs >= 0: the prompt's tokens get theirs first (the first token's NAN) */
    int n;                   /* choices of this prompt (0 counts as 1), at most max_batch */
    ServeJob *wake;          /* NULL, or a job whose waiters this request's news wakes too (serve_jobs_wait) */
    const ServeMaskOps *mask; /* NULL, or constrained decoding: mask->open(mask_arg) per choice */
    void *mask_arg;
} ServeJobSpec;

/* What runs the steps: a KV block pool and the decoding step over it (decode.h's KVPool and model_decode_step on the
 * CPU, built in; a GPU's, gpu_decode.h, from cmd_serve.c). The engine thread makes every call but n_free, which comes
 * from any thread under the engine's mutex (the pool's bookkeeping is host memory either way). */
typedef struct {
    void *ctx;
    int (*step)(void *ctx, const DecodeSeq *seqs, int n_seqs, const int32_t *tokens, float *logits, ZyErr *err);
    int (*reserve)(void *ctx, int slot, int tokens);  /* kvpool_reserve */
    void (*seq_reset)(void *ctx, int slot);           /* kvpool_seq_reset */
    void (*seq_release)(void *ctx, int slot);         /* kvpool_seq_release */
    int (*seq_len)(void *ctx, int slot);              /* tokens cached for slot */
    int (*n_free)(void *ctx);                         /* free blocks */
    void (*destroy)(void *ctx);                       /* the pool and ctx */
    int (*fork)(void *ctx, int parent, int child);    /* kvpool_fork; NULL: each choice prefills its own prompt */
    int all_logits;                                   /* the step takes DECODE_LOGITS_ALL (else one row at a time) */
    PrefixCache *(*prefix_cache)(void *ctx, ZyErr *err); /* a prefix cache over the pool; NULL: none */
} ServeBackend;

/* Builds a backend over model m with kvpool_create's sizes; arg is the caller's. */
typedef int (*ServeBackendOpen)(ServeBackend *be, void *arg, const Model *m, int max_seqs, int max_len, int n_blocks,
                                int block_tokens, int max_rows, int chunk, int kv_bf16, ZyErr *err);

/* The model and tokenizer must outlive the engine. Starts the engine thread. Decodes on the CPU. */
int serve_engine_create(ServeEngine **out, const Model *m, const Tokenizer *tok, const ServeEngineOpts *opts,
                        ZyErr *err);
/* The same with the steps on the backend `open` builds (kv_memory then counts the backend's memory: k̂ and v as
 * kvpool_block_bytes with opts->kv_bf16, and with the prefix cache kvpool_state_bytes per block; a backend without
 * a prefix cache wants opts->no_prefix_cache). */
int serve_engine_create_with(ServeEngine **out, const Model *m, const Tokenizer *tok, const ServeEngineOpts *opts,
                             ServeBackendOpen open, void *arg, ZyErr *err);
/* Stops taking requests; cancels those still queued; lets running ones finish for up to grace_s seconds, then
 * cancels them; joins the thread. Safe to call once; serve_engine_free calls it with grace 0 if needed. */
void serve_engine_shutdown(ServeEngine *e, double grace_s);
void serve_engine_free(ServeEngine *e);
/* What the engine was built with: the effective options, KV blocks in the pool, bytes per block (its kept CCA
 * state included when the prefix cache is on). */
void serve_engine_info(const ServeEngine *e, ServeEngineOpts *opts, int *n_blocks, size_t *block_bytes);

/* Queues a request: out[0 .. n) get its n choices. Errors: 400 (the prompt fills the context, an id outside the
 * vocabulary, n above max_batch), 503 (queue full or shutting down). */
int serve_engine_submit(ServeEngine *e, const ServeJobSpec *spec, ServeJob **out, ServeError *err);

/* One token's log-probabilities (model distribution, before temperature and penalties). */
typedef struct {
    int32_t token;
    float logprob;           /* NAN for a prompt's first token (nothing predicts it) */
    int n_top;
    int32_t top[SERVE_MAX_TOP_LOGPROBS];
    float top_logprob[SERVE_MAX_TOP_LOGPROBS];
} ServeLogprob;

/* What a job produced since the last take. Text and logprobs are malloc'ed (free with serve_delta_free). */
typedef struct {
    char *text;
    size_t len;
    ServeLogprob *logprobs;
    int n_logprobs;
    int finished;           /* no more output will come */
    const char *finish;     /* "stop", "length", "abort" (cancelled or shut down) */
    int prompt_tokens, completion_tokens;
    int first;              /* this take holds the first output */
} ServeDelta;
void serve_delta_free(ServeDelta *d);

/* Waits up to timeout_ms for output or the end. Returns 1 if there is something to take, 0 on timeout. */
int serve_job_wait(ServeJob *j, int timeout_ms);
/* The same for any of n jobs: jobs[1 ..] must wake jobs[0] (choices of one submit do; else spec.wake = jobs[0]). */
int serve_jobs_wait(ServeJob *const *jobs, int n, int timeout_ms);
/* Takes what is new (possibly nothing). */
int serve_job_take(ServeJob *j, ServeDelta *d);
/* Stops the job at the next step (a disconnected client); its KV blocks are freed then. */
void serve_job_cancel(ServeJob *j);
/* The caller is done with it (the engine frees it when both sides are). */
void serve_job_release(ServeJob *j);

/* Prometheus text exposition of the engine's gauges, counters and histograms (malloc'ed). */
char *serve_engine_metrics(ServeEngine *e);
/* Running and queued requests, KV blocks in use (tests and /health). */
void serve_engine_load(ServeEngine *e, int *running, int *queued, int *blocks_used);

#endif
