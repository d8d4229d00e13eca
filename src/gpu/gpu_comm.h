/* gpu_comm: collectives between the GPUs of a data-parallel run, through NCCL (RCCL under ZAYA_HIP), on device
 * buffers and on the GpuCtx's stream; the communicator is bootstrapped over MPI (rank 0's ncclGetUniqueId,
 * dist_bcast, ncclCommInitRank). Compiled into CUDA builds only (src/gpu/gpu_comm.c); a CUDA build without NCCL
 * (no nccl.h under CUDA_HOME at build time: -DZAYA_NO_NCCL) and the CPU-only build (gpu_none.c) keep every entry
 * point and say clearly why NCCL is not there.
 *
 * When NCCL is used (gpu_comm_decide): more than one rank, ZAYA_NCCL not 0, and every rank on its own GPU. Ranks
 * that share a GPU (two ranks of a node mapped to the same device, compared by device UUID all-gathered over MPI)
 * cannot be NCCL peers; they keep the host-staged MPI path (gpu_trainer.c). ZAYA_NCCL=1 makes NCCL a requirement
 * (an error naming the reason when it cannot be used), ZAYA_NCCL=0 turns it off, unset or "auto" decides.
 *
 * ZeRO-1 blocks are uneven (zero1_partition balances optimizer work, not elements), so the exchange is the
 * "v" form of the collectives: the reduce-scatter is one NCCL group of per-block ncclReduce calls (block r summed
 * into rank r, in place), the all-gather one group of per-block ncclBroadcast calls (block r from rank r, in
 * place). No padding, no scratch arena, and each ring link carries what a ring reduce-scatter / all-gather would
 * (every block but one). The alternative, equal padded blocks for
 * ncclReduceScatter / ncclAllGather, would need an arena-sized scratch buffer plus two copies per step and would
 * send the padding: blocks balanced by optimizer work can differ in size several-fold (an embedding's AdamW block
 * against Muon matrices). Deterministic: NCCL reduces without atomics in an order fixed by the ring (the rank count
 * and topology) and the protocol chosen for the size, so the same run on the same machines gives the same bits
 * (NCCL_ALGO / NCCL_PROTO fix NCCL's choice of algorithm and protocol); the order differs from MPI's and from
 * another rank count, as on the CPU path (with 2 ranks a + b is the same either way). */
#ifndef ZAYA_GPU_COMM_H
#define ZAYA_GPU_COMM_H

#include <stddef.h>

#include "dist/distributed.h"
#include "gpu/gpu.h"
#include "util/util.h"

typedef struct GpuComm GpuComm;

/* 1 when this binary can use NCCL (a CUDA build that found nccl.h). */
int gpu_comm_compiled(void);
/* "NCCL 2.28.9" (the library's version at run time), or why there is none. */
const char *gpu_comm_version(void);

/* Whether the ranks of d exchange device buffers over NCCL, the same answer on every rank: a collective call
 * (every rank makes it after opening its GPU g). *use = 1, or 0 with why (≤ cap bytes) saying why not: one rank,
 * ZAYA_NCCL=0, ranks sharing a GPU, built without NCCL. Errors (every rank returns -1): ZAYA_NCCL not 0, 1 or auto,
 * or different on different ranks; a device that cannot be queried; required (or ZAYA_NCCL=1) but not usable. */
int gpu_comm_decide(const Dist *d, const GpuCtx *g, int required, int *use, char *why, size_t cap, ZyErr *err);

/* The communicator over all ranks of d on g's device, collectives on g->stream (collective call; one rank works).
 * A rank whose NCCL set-up fails returns -1; the caller ends the job (dist_abort), the others may wait in NCCL's
 * bootstrap. */
int gpu_comm_create(GpuComm **out, const Dist *d, GpuCtx *g, ZyErr *err);
/* Waits for g's stream, polling NCCL for asynchronous errors: a collective that meets one (a network failure, a peer
 * gone) never completes, so a plain stream wait would hang; here the communicator is aborted (its kernels end, every
 * later call fails) and err names `what`; likewise a GPU fault. The trainer and the benchmark wait on NCCL here. */
int gpu_comm_wait(GpuComm *c, const char *what, ZyErr *err);
/* Waits for the queued collectives (gpu_comm_wait) and destroys the communicator; aborts it after an error. */
void gpu_comm_free(GpuComm *c);
/* "NCCL 2.28.9, 4 ranks" */
const char *gpu_comm_describe(const GpuComm *c);

/* ZeRO-1 exchange on a device arena, bounds as dist_reduce_scatter_f32 ([ranks + 1]; block r = [bounds[r],
 * bounds[r+1]), contiguous from bounds[0]). reduce_scatter: block r of rank r becomes the sum over ranks of
 * everyone's block r (in place; the other blocks keep this rank's values). allgather: every rank's block r becomes
 * rank r's. Launches only (stream-ordered; the host waits with gpu_comm_wait); errors name the collective. */
int gpu_comm_reduce_scatter_f32(GpuComm *c, float *d_arena, const size_t *bounds, ZyErr *err);
int gpu_comm_allgather_f32(GpuComm *c, float *d_arena, const size_t *bounds, ZyErr *err);

/* ---- zaya bench comm --backend nccl ------------------------------------------------------------------------- */

/* The benchmark's collectives (the order of bench_comm.h's BcOp). */
typedef enum {
    GPU_COLL_ALL_REDUCE,
    GPU_COLL_REDUCE_SCATTER,
    GPU_COLL_ALL_GATHER,
    GPU_COLL_BROADCAST,
    GPU_COLL_ALLTOALL
} GpuCollective;

typedef struct GpuCommBench GpuCommBench;

/* Opens this rank's GPU (the rank-local choice, gpu.h), requires NCCL (gpu_comm_decide with required = 1: every
 * rank its own GPU), creates the communicator and a send and a receive device buffer of `bytes` each. Collective.
 * Returns 0; -1 or -2 when the ranks agreed on a failure before NCCL started (every rank returns, no collective is
 * left pending): -1 on the rank(s) that should report err (the ones that failed; rank 0 for a failure all share),
 * -2 on the others (err says another rank failed); -3 when the communicator's set-up failed on this rank (the
 * others may be waiting in NCCL's bootstrap: report and dist_abort). */
int gpu_comm_bench_open(GpuCommBench **out, const Dist *d, size_t bytes, ZyErr *err);
void gpu_comm_bench_close(GpuCommBench *b);
/* "NCCL 2.28.9, GPU NVIDIA H100 80GB HBM3" */
const char *gpu_comm_bench_describe(const GpuCommBench *b);
/* Host <-> the send (which = 0) or receive (1) device buffer, `bytes` from its start (waits). */
int gpu_comm_bench_put(GpuCommBench *b, int which, const void *host, size_t bytes, ZyErr *err);
int gpu_comm_bench_get(GpuCommBench *b, int which, void *host, size_t bytes, ZyErr *err);
/* `reps` calls of op on the device buffers (count: whole buffer for all_reduce and broadcast, per-rank block for
 * reduce_scatter and all_gather, per-peer block for alltoall; bf16: 2-byte elements, else float), nccl-tests'
 * placements: out-of-place send -> recv; in-place all_reduce / broadcast on recv, reduce_scatter recv[n c] -> its
 * block at recv + rank·c, all_gather from recv + rank·c, alltoall: recv copied to send on the device, then sent
 * (grouped ncclSend/ncclRecv cannot read and write one buffer). *seconds (may be NULL): GPU time per call between
 * two events around the calls, waited for. */
int gpu_comm_bench_run(GpuCommBench *b, GpuCollective op, int inplace, int bf16, size_t count, int root, int reps,
                       double *seconds, ZyErr *err);
/* Device-to-device copy of `bytes` (send -> recv), warm-ups then iters; bytes copied per second in GB/s (≤ 0 on
 * error). */
double gpu_comm_bench_memcpy(GpuCommBench *b, size_t bytes, int warmup, int iters);

#endif
