/* loader: the training batches, deterministic from (seed, step) and the per-dataset read cursors.
 * Each row of a global batch picks a dataset by the phase's mixture weights with a hash of (seed, step, row)
 * and takes the next seq_len+1 tokens at that dataset's cursor, so every dataset is read sequentially
 * (scatter factor near 1) and the global batch is the same whatever part of it a process reads. */
#ifndef ZAYA_LOADER_H
#define ZAYA_LOADER_H

#include <stdint.h>

#include "io/shards.h"
#include "util/util.h"

#define LOADER_MAX_DATASETS 16

typedef struct {
    int dataset;       /* index into the loader's datasets */
    uint64_t offset;   /* first token of the window in that dataset's train stream */
} BatchRow;

typedef struct {
    int n_datasets;
    ShardSet *train[LOADER_MAX_DATASETS];
    char names[LOADER_MAX_DATASETS][64];
    uint64_t cursor[LOADER_MAX_DATASETS]; /* next unread token per dataset */
    uint64_t epoch[LOADER_MAX_DATASETS];  /* completed passes per dataset */
    uint64_t seed;
} Loader;

/* Opens the train split of each shard directory (dirs[i] named names[i]). */
int loader_open(Loader *l, int n, const char *const *names, const char *const *dirs, uint64_t seed, int verify_crc,
                ZyErr *err);
void loader_close(Loader *l);
/* Plans the global batch of `step`: rows [batch] of (dataset, offset), advancing the cursors. weights[n_datasets]
 * are the phase's mixture weights (zero = unused). Errors if a chosen dataset is shorter than one window. */
int loader_plan(Loader *l, uint64_t step, int batch, int seq_len, const double *weights, BatchRow *rows, ZyErr *err);
/* Reads the planned rows [first, first+count) into tokens [count, seq_len+1]. */
int loader_read(Loader *l, const BatchRow *rows, int first, int count, int seq_len, int32_t *tokens, ZyErr *err);
/* Windows [rows, T+1] → inputs [rows, T] and next-token targets [rows, T]. */
void loader_split_windows(const int32_t *windows, int rows, int T, int32_t *inputs, int32_t *targets);
/* Scatter factor over everything read so far: pages touched / pages the bytes occupy (1.0 is ideal). */
double loader_scatter_factor(const Loader *l);

/* A 64-bit mix of (seed, a, b): splitmix64 finaliser; stable across platforms. */
uint64_t hash3(uint64_t seed, uint64_t a, uint64_t b);

/* Data skip windows: inclusive ranges of data-batch indices that are planned (the cursors advance exactly as if
 * they were trained on) but not trained on. A supervisor that rolls back past a non-finite or spiking step skips
 * the batch that caused it; because skipping only moves the data index, a run told the same windows from the start
 * reproduces it byte for byte. Kept sorted, overlapping and adjacent windows merged. */
#define LOADER_MAX_SKIP_WINDOWS 256

typedef struct {
    uint64_t first, last; /* inclusive */
} DataWindow;

typedef struct {
    int count;
    DataWindow w[LOADER_MAX_SKIP_WINDOWS];
} SkipWindows;

/* Parses "A:B" (or "A" for A:A); errors name the text and the reason. */
int skip_window_parse(const char *text, DataWindow *out, ZyErr *err);
/* Adds a window, merging it with those it overlaps or touches; adding one twice changes nothing. */
int skip_windows_add(SkipWindows *s, DataWindow w, ZyErr *err);
/* Whether a data index lies inside a window. */
int skip_windows_contains(const SkipWindows *s, uint64_t index);
/* The first data index >= index that lies in no window (the next batch that is trained on). */
uint64_t skip_windows_next_trained(const SkipWindows *s, uint64_t index);

#endif
