/* checkpoint: a directory per step under ROOT —
 *   ROOT/step-00000100/{config.json, model.safetensors, optimizer-RRRRR-of-NNNNN.safetensors (one per rank),
 *                       trainer_state.json, run.json, manifest.json}
 * written under ROOT/.tmp-step-00000100 (every rank its optimizer shard in parallel, rank 0 the rest), every file
 * fsynced, the manifest (size and CRC-32 of every other file, counted as the files were written) written last,
 * then published by an atomic rename;
 * ROOT/latest (a one-line file naming the directory) moves after that, and only then are checkpoints beyond the
 * newest `keep` deleted. A published checkpoint is never overwritten. model.safetensors + config.json load in
 * transformers as they are. Optimizer state is stored by tensor name, so N ranks' shards resume on M ranks. */
#ifndef ZAYA_CHECKPOINT_H
#define ZAYA_CHECKPOINT_H

#include <stdint.h>
#include <stdio.h>

#include "dist/distributed.h"
#include "model/model.h"
#include "optim/optim.h"
#include "util/util.h"

typedef struct {
    const Model *model;
    const Optimizer *optim;
    const char *trainer_state_json; /* written as trainer_state.json */
    const char *run_json;           /* the run config, written as run.json (may be NULL) */
} CheckpointContent;

/* Saves and publishes step `step` under root; keeps the newest `keep` (0 = keep all). Collective over dist's
 * ranks (dist NULL: one process). Writes the published directory's path to out_dir (cap bytes) if non-NULL. */
int ckpt_save(const char *root, int64_t step, const CheckpointContent *content, const Dist *dist, int keep,
              char *out_dir, size_t cap, ZyErr *err);
/* Asynchronous save: snapshots in memory (rank 0 the parameters, every rank its optimizer block, each into the
 * image of its file), returns, and writes + publishes in a background thread per rank while training continues.
 * Collective (all ranks call it at the same step). *w: the writer, made on first use (NULL) and reused by every
 * later save of the run (its images stay allocated); the next ckpt_save_async must call ckpt_wait first. */
typedef struct CkptWriter CkptWriter;
int ckpt_save_async(CkptWriter **w, const char *root, int64_t step, const CheckpointContent *content, const Dist *dist,
                    int keep, ZyErr *err);
/* Makes the writer's images ready for saves of this model and optimizer (allocated, every page faulted in), so
 * that the first snapshot is a copy too. Local (no collective). */
int ckpt_writer_prepare(CkptWriter **w, const Model *model, const Optimizer *optim, const Dist *dist, ZyErr *err);
/* Waits for the save to be written (and, on rank 0, published); collective: every rank learns if any failed.
 * seconds: how long the background write took (from the end of the snapshot to the publish). */
int ckpt_wait(CkptWriter *w, const Dist *dist, char *out_dir, size_t cap, double *seconds, ZyErr *err);
/* Frees the writer and its images; a save still being written is finished first (locally, no collective). */
void ckpt_writer_free(CkptWriter *w);

/* The directory `latest` points to (error if there is none). */
int ckpt_latest(const char *root, char *dir, size_t cap, ZyErr *err);
/* Published checkpoint directories under root, newest first (by step); returns the count, -1 on error. */
int ckpt_list(const char *root, char dirs[][512], int max, ZyErr *err);
/* Checks every file against the manifest (presence, size, CRC-32); errors name the file and the mismatch. */
int ckpt_verify(const char *dir, ZyErr *err);
/* Loads the model weights, the optimizer state of the tensors `optim` owns (from whichever shard holds them)
 * and the trainer state JSON (malloc'ed) into an already-created model/optimizer, checking every file of the
 * checkpoint against the manifest on the way (a mismatch fails as ckpt_verify does). Collective over dist's ranks
 * (NULL: one process): each rank reads its ZeRO-1 block of model.safetensors and the state it owns, in parallel
 * chunks straight into the arenas, and the blocks are then all-gathered; each byte is read once. */
int ckpt_load(const char *dir, Model *model, Optimizer *optim, char **trainer_state_json, const Dist *dist, ZyErr *err);
/* Prints a checkpoint's step, world size, each file with its size and checksum status, and the trainer state;
 * returns -1 (with the first problem in err) if any file fails its check. dir may also be a run's checkpoint
 * root, meaning its `latest`. */
int ckpt_inspect(const char *dir, FILE *out, ZyErr *err);
/* CRC-32 (zlib's) of a whole file, read in parallel chunks. */
int file_crc32(const char *path, uint32_t *crc, uint64_t *size, ZyErr *err);

#endif
