#include "dist/distributed.h"

#include <limits.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

static int check(int rc, const char *what, ZyErr *err) {
    if (rc == MPI_SUCCESS) return 0;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    return zy_fail(err, "MPI %s failed: %.*s", what, len, msg);
}

int dist_init(Dist *d, ZyErr *err) {
    d->rank = 0;
    d->size = 1;
    d->initialized_here = 0;
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        int provided;
        if (check(MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided), "init", err)) return -1;
        d->initialized_here = 1;
    }
    /* errors come back as codes, so a failing collective is reported instead of killing the job silently */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &d->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &d->size);
    return 0;
}

void dist_finalize(Dist *d) {
    if (d->initialized_here) MPI_Finalize();
    d->initialized_here = 0;
}

void dist_abort(const Dist *d, int code) {
    if (d->size > 1) MPI_Abort(MPI_COMM_WORLD, code);
}

/* MPI counts are ints: large buffers go in chunks. */
static int allreduce(const Dist *d, void *buf, size_t n, MPI_Datatype type, size_t elem, MPI_Op op, ZyErr *err) {
    if (d->size == 1) return 0;
    char *p = buf;
    while (n > 0) {
        int c = n > (size_t)(INT_MAX / 2) ? INT_MAX / 2 : (int)n;
        if (check(MPI_Allreduce(MPI_IN_PLACE, p, c, type, op, MPI_COMM_WORLD), "allreduce", err)) return -1;
        p += (size_t)c * elem;
        n -= (size_t)c;
    }
    return 0;
}

int dist_allreduce_f32(const Dist *d, float *buf, size_t n, ZyErr *err) {
    return allreduce(d, buf, n, MPI_FLOAT, sizeof(float), MPI_SUM, err);
}
int dist_allreduce_f64(const Dist *d, double *buf, size_t n, ZyErr *err) {
    return allreduce(d, buf, n, MPI_DOUBLE, sizeof(double), MPI_SUM, err);
}
int dist_allreduce_i64(const Dist *d, int64_t *buf, size_t n, ZyErr *err) {
    return allreduce(d, buf, n, MPI_INT64_T, sizeof(int64_t), MPI_SUM, err);
}
int dist_allreduce_max_i64(const Dist *d, int64_t *buf, size_t n, ZyErr *err) {
    return allreduce(d, buf, n, MPI_INT64_T, sizeof(int64_t), MPI_MAX, err);
}

int dist_bcast(const Dist *d, void *buf, size_t bytes, int root, ZyErr *err) {
    if (d->size == 1) return 0;
    char *p = buf;
    while (bytes > 0) {
        int c = bytes > (size_t)(INT_MAX / 2) ? INT_MAX / 2 : (int)bytes;
        if (check(MPI_Bcast(p, c, MPI_BYTE, root, MPI_COMM_WORLD), "broadcast", err)) return -1;
        p += c;
        bytes -= (size_t)c;
    }
    return 0;
}

int dist_barrier(const Dist *d, ZyErr *err) {
    if (d->size == 1) return 0;
    return check(MPI_Barrier(MPI_COMM_WORLD), "barrier", err);
}

/* Block sizes as MPI int counts, counts[r] and displs[r] = counts[size + r] in one allocation the caller frees
 * (one block per rank must stay below 2^31 elements). NULL with err set on failure. */
static int *block_counts(const Dist *d, const size_t *offset, ZyErr *err) {
    int *counts = malloc(2 * (size_t)d->size * sizeof(int));
    if (!counts) {
        zy_fail(err, "out of memory");
        return NULL;
    }
    for (int r = 0; r < d->size; r++) {
        size_t n = offset[r + 1] - offset[r];
        if (n > (size_t)INT_MAX || offset[r] > (size_t)INT_MAX) {
            zy_fail(err, "ZeRO-1 block of rank %d (%zu floats at %zu) exceeds MPI's int counts", r, n, offset[r]);
            free(counts);
            return NULL;
        }
        counts[r] = (int)n;
        counts[d->size + r] = (int)offset[r];
    }
    return counts;
}

int dist_reduce_scatter_f32(const Dist *d, float *arena, const size_t *offset, float *scratch, ZyErr *err) {
    if (d->size == 1) return 0;
    int *counts = block_counts(d, offset, err);
    if (!counts) return -1;
    /* blocks are contiguous and in rank order from offset[0]: the send buffer is the arena from there */
    int rc = check(MPI_Reduce_scatter(arena + offset[0], scratch, counts, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD),
                   "reduce_scatter", err);
    if (!rc) memcpy(arena + offset[d->rank], scratch, (size_t)counts[d->rank] * sizeof(float));
    free(counts);
    return rc;
}

int dist_allgather_f32(const Dist *d, float *arena, const size_t *offset, ZyErr *err) {
    if (d->size == 1) return 0;
    int *counts = block_counts(d, offset, err);
    if (!counts) return -1;
    int rc = check(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, arena, counts, counts + d->size, MPI_FLOAT,
                                  MPI_COMM_WORLD),
                   "allgather", err);
    free(counts);
    return rc;
}
