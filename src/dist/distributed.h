/* distributed: the process group (Open MPI). Launched by mpirun / srun zaya runs one rank per process; run
 * directly it is a group of one. Every collective returns an error instead of aborting, so callers can report
 * which rank failed. */
#ifndef ZAYA_DISTRIBUTED_H
#define ZAYA_DISTRIBUTED_H

#include <stddef.h>
#include <stdint.h>

#include "util/util.h"

typedef struct {
    int rank, size;
    int initialized_here; /* we called MPI_Init, so we finalize */
} Dist;

/* Initialises MPI (MPI_THREAD_FUNNELED) unless the process already did; errors are returned, not raised. */
int dist_init(Dist *d, ZyErr *err);
void dist_finalize(Dist *d);
/* Ends every rank after a fatal error on one (MPI_Abort): the others must not wait forever in a collective. */
void dist_abort(const Dist *d, int code);

/* In-place sums over all ranks. */
int dist_allreduce_f32(const Dist *d, float *buf, size_t n, ZyErr *err);
int dist_allreduce_f64(const Dist *d, double *buf, size_t n, ZyErr *err);
int dist_allreduce_i64(const Dist *d, int64_t *buf, size_t n, ZyErr *err);
/* Logical AND / max over ranks (agreement checks). */
int dist_allreduce_max_i64(const Dist *d, int64_t *buf, size_t n, ZyErr *err);
int dist_bcast(const Dist *d, void *buf, size_t bytes, int root, ZyErr *err);
/* ZeRO-1 exchange over an arena cut into one contiguous block per rank: block r is [offset[r], offset[r+1]).
 * reduce_scatter sums every rank's arena and leaves block `rank` of the sum in place (scratch holds one block);
 * allgather copies each rank's block to every rank. */
int dist_reduce_scatter_f32(const Dist *d, float *arena, const size_t *offset, float *scratch, ZyErr *err);
int dist_allgather_f32(const Dist *d, float *arena, const size_t *offset, ZyErr *err);
int dist_barrier(const Dist *d, ZyErr *err);

#endif
