/* data_prepare: text corpora (.txt / .jsonl files and directories) -> token shards (shards.h).
 *
 * Documents: a .txt file is one document, or several separated by lines holding only "<|endoftext|>"; a .jsonl
 * file holds one {"text": "..."} object per line. Directories are walked recursively for .txt and .jsonl files
 * in sorted name order. Each document is tokenized, followed by the end-of-sequence id (and optionally preceded
 * by the beginning-of-sequence id, as `zaya eval` puts one before every prompt), and goes to the val split
 * with probability val_fraction, decided by a seeded hash of its index (deterministic, independent of threads).
 * Malformed .jsonl lines are reported as "file:line: reason" and skipped, or fail the run under strict.
 *
 * The shards are built in a temporary sibling directory and moved into place only when complete, so a failed run
 * leaves the output directory as it was. */
#ifndef ZAYA_DATA_PREPARE_H
#define ZAYA_DATA_PREPARE_H

#include <stdint.h>
#include <stdio.h>

#include "io/shards.h"
#include "util/util.h"

/* The tokenizer, behind a function pointer so this module does not depend on one implementation (and tests can
 * use a trivial one). encode returns malloc'ed ids (freed with free; NULL allowed when empty); thread is the
 * calling OpenMP thread, in [0, threads), so an encoder can keep per-thread state (tokenizer caches). */
typedef struct {
    int (*encode)(void *ctx, int thread, const char *text, size_t len, int32_t **ids, size_t *n_ids, ZyErr *err);
    void *ctx;
    int vocab_size;
    int eos_id;                  /* appended to every document */
    int bos_id;                  /* put before every document; -1: none */
} PrepareEncoder;

typedef struct {
    const char *const *inputs;   /* files and directories */
    int n_inputs;
    const char *out_dir;
    double val_fraction;         /* [0, 1] */
    uint64_t seed;
    int strict;                  /* a malformed line fails the run */
    int force;                   /* replace the shards of a non-empty output directory */
    uint64_t max_shard_tokens;   /* 0: SHARD_DEFAULT_MAX_TOKENS */
    const char *tokenizer_file;  /* recorded in meta.json (may be NULL) */
    uint32_t tokenizer_crc;
    int threads;                 /* tokenizer threads; 0: omp_get_max_threads() */
    FILE *warn;                  /* where malformed lines are reported, the first 20 per file (NULL: only counted) */
} PrepareOptions;

typedef struct {
    uint64_t documents[SHARD_NUM_SPLITS], tokens[SHARD_NUM_SPLITS], bytes[SHARD_NUM_SPLITS];
    int shards[SHARD_NUM_SPLITS];
    double seconds[SHARD_NUM_SPLITS]; /* tokenizer + writer time spent on the split's documents, summed over threads */
    uint64_t files, malformed_lines, empty_documents;
    double wall_seconds;
    int threads;
} PrepareReport;

/* 1 if document doc_index goes to the val split. */
int data_prepare_is_val(uint64_t seed, uint64_t doc_index, double val_fraction);

int data_prepare(const PrepareOptions *opt, const PrepareEncoder *enc, PrepareReport *rep, ZyErr *err);

#endif
