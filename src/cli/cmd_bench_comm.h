/* bench_comm: collective benchmarks over MPI (all_reduce, reduce_scatter, all_gather, broadcast, alltoall) with
 * the nccl-tests conventions: for a collective over a buffer of S bytes taking t seconds per call,
 * algbw = S / t and busbw = algbw * f, f = 2(n-1)/n for all_reduce, (n-1)/n for reduce_scatter, all_gather and
 * alltoall, 1 for broadcast. S is the larger of the send and receive buffers of one rank: the whole input of
 * all_reduce, reduce_scatter and broadcast, the whole output of all_gather, the whole send (= receive) buffer of
 * alltoall. Each size runs out-of-place and in-place (MPI_IN_PLACE); with checking on, every rank fills its
 * buffers with exactly representable values that depend on rank and index and counts the elements that differ
 * from the exact result (#wrong, summed over ranks).
 *
 * Two backends: MPI (host buffers, MPI_Wtime; the default) and NCCL (device buffers, one GPU per rank, the NCCL
 * calls of the same collectives; alltoall as grouped ncclSend/ncclRecv; time from GPU events around the loop, max
 * over ranks; in-place with nccl-tests' placements: reduce_scatter's block at recv + rank·count). With NCCL the
 * fill and the check run on the host and travel through the device buffers (gpu_comm.h). */
#ifndef ZAYA_BENCH_COMM_H
#define ZAYA_BENCH_COMM_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "dist/distributed.h"
#include "util/util.h"

typedef enum { BC_ALL_REDUCE, BC_REDUCE_SCATTER, BC_ALL_GATHER, BC_BROADCAST, BC_ALLTOALL, BC_N_OPS } BcOp;
typedef enum { BC_FLOAT, BC_BF16 } BcType;
typedef enum { BC_MPI, BC_NCCL } BcBackend;
struct GpuCommBench; /* gpu/gpu_comm.h */

typedef struct {
    unsigned ops;        /* bit (1u << BcOp) per collective to run */
    BcType type;
    size_t min_bytes, max_bytes;
    uint64_t factor;     /* sizes min, min*f, min*f^2, ... <= max */
    int iters, warmup;
    int check;           /* fill, run once, count wrong elements */
    int root;            /* broadcast root */
    BcBackend backend;   /* BC_MPI (the default: zeroed config) or BC_NCCL */
    struct GpuCommBench *gpu; /* BC_NCCL: the open device buffers and communicator (gpu_comm_bench_open) */
} BcConfig;

typedef struct {
    double time_us;      /* per call: loop time / iters, max over ranks */
    double algbw, busbw; /* GB/s (1e9 bytes/s) */
    int64_t wrong;       /* elements != exact result, summed over ranks; -1 when not checked */
} BcResult;

typedef struct {
    BcOp op;
    size_t requested;    /* the size asked for (-b .. -e) */
    size_t bytes;        /* S: requested rounded down to whole elements (and to n blocks for the blocked ops) */
    size_t count;        /* the count passed to MPI: whole buffer (all_reduce, broadcast), per-rank block
                            (reduce_scatter, all_gather), per-peer block (alltoall) */
    int root;            /* -1 for collectives without a root */
    BcResult res[2];     /* [0] out-of-place, [1] in-place */
} BcRow;

typedef struct {
    int nranks;
    double memcpy_gbps;  /* rank 0: memcpy of memcpy_bytes */
    size_t memcpy_bytes;
    BcRow *rows;
    int n_rows;
    double avg_busbw;    /* mean of busbw over every row, both placements (nccl-tests' "Avg bus bandwidth") */
    int64_t wrong_total; /* -1 when not checked */
} BcReport;

const char *bc_op_name(BcOp op);
/* "all_reduce" ... or "all" (every collective); also accepts "allreduce"-style names without the underscore. */
int bc_parse_ops(const char *s, unsigned *ops, ZyErr *err);
int bc_parse_type(const char *s, BcType *type, ZyErr *err);
const char *bc_type_name(BcType t);
/* "mpi" or "nccl" */
int bc_parse_backend(const char *s, BcBackend *backend, ZyErr *err);
const char *bc_backend_name(BcBackend b);
size_t bc_type_size(BcType t);
/* "8", "1K", "64M", "2G" (binary multiples, case-insensitive); > 0. */
int bc_parse_size(const char *s, size_t *out, ZyErr *err);
int bc_validate(const BcConfig *cfg, int nranks, ZyErr *err);
/* nccl-tests' busbw factor for n ranks. */
double bc_bus_factor(BcOp op, int nranks);
/* Element i of rank `rank`'s input when checking: an integer whose partial sums over ranks are exact in float
 * and bf16 (see bench_comm.c). */
float bc_input_value(BcOp op, int rank, int nranks, size_t i);

/* Runs the benchmark on every rank of d (a collective call: every rank must call it with the same cfg; BC_NCCL:
 * cfg->gpu opened with at least max_bytes per buffer).
 * out (rank 0 only, NULL elsewhere) receives the nccl-tests style table, a row at a time. The report's rows are
 * allocated; free with bc_report_free. */
int bc_run(const Dist *d, const BcConfig *cfg, FILE *out, BcReport *rep, ZyErr *err);
void bc_report_free(BcReport *rep);

int bc_write_json(const char *path, const BcConfig *cfg, const BcReport *rep, ZyErr *err);
/* busbw vs size (log x) per collective, out-of-place solid and in-place dashed, memcpy baseline; gnuplot. */
int bc_plot(const char *png_path, const BcConfig *cfg, const BcReport *rep, ZyErr *err);

#endif
