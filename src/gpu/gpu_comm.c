/* NCCL collectives between the ranks' GPUs (gpu_comm.h). Plain C against NCCL's and the CUDA runtime's C APIs;
 * built with -DZAYA_NO_NCCL when the build found no nccl.h (then only the decision and clear errors remain). */
#include "gpu/gpu_comm.h"

#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef ZAYA_HIP
#include <hip/hip_runtime_api.h>
#ifndef ZAYA_NO_NCCL
#include <rccl/rccl.h>
#endif
#define cudaError_t hipError_t
#define cudaSuccess hipSuccess
#define cudaGetErrorString hipGetErrorString
#define cudaSetDevice hipSetDevice
#define cudaGetDeviceProperties hipGetDeviceProperties
#define cudaDeviceProp hipDeviceProp_t
#define cudaMemcpyAsync hipMemcpyAsync
#define cudaMemcpyDeviceToDevice hipMemcpyDeviceToDevice
#define cudaStream_t hipStream_t
#define cudaStreamQuery hipStreamQuery
#define cudaErrorNotReady hipErrorNotReady
typedef hipDeviceProp_t DeviceProp;
#else
#include <cuda_runtime_api.h>
#ifndef ZAYA_NO_NCCL
#include <nccl.h>
#endif
typedef struct cudaDeviceProp DeviceProp;
#endif

#define NO_NCCL "this zaya was built without NCCL (no nccl.h under CUDA_HOME when it was built: install NCCL, e.g. Debian's libnccl-dev or NVIDIA's nccl package, and rebuild)"

/* ---- the decision ------------------------------------------------------------------------------------------ */

/* ZAYA_NCCL: 0 off, 1 required, 2 auto (unset, empty, "auto"), 3 not understood */
enum { MODE_OFF = 0, MODE_ON = 1, MODE_AUTO = 2, MODE_BAD = 3, MODE_NO_DEVICE = 4 };

static int env_mode(void) {
    const char *v = getenv("ZAYA_NCCL");
    if (!v || !*v || strcmp(v, "auto") == 0) return MODE_AUTO;
    if (strcmp(v, "0") == 0) return MODE_OFF;
    if (strcmp(v, "1") == 0) return MODE_ON;
    return MODE_BAD;
}

static const char *mode_name(int m) {
    return m == MODE_OFF ? "0" : m == MODE_ON ? "1" : m == MODE_AUTO ? "auto (unset)" : "invalid";
}

/* one rank's record: mode, then the device UUID as two 64-bit words */
typedef struct {
    int64_t w[3];
} Rec;

typedef struct {
    uint64_t hi, lo;
    int rank;
} Key;

static int key_cmp(const void *a, const void *b) {
    const Key *x = a, *y = b;
    if (x->hi != y->hi) return x->hi < y->hi ? -1 : 1;
    if (x->lo != y->lo) return x->lo < y->lo ? -1 : 1;
    return x->rank - y->rank;
}

int gpu_comm_decide(const Dist *d, const GpuCtx *g, int required, int *use, char *why, size_t cap, ZyErr *err) {
    *use = 0;
    if (cap) why[0] = '\0';
    const int n = d->size;
    /* every rank's mode and device UUID, all-gathered as a sum of arrays that are zero but for the rank's row */
    Rec *all = calloc((size_t)n, sizeof *all);
    Key *keys = calloc((size_t)n, sizeof *keys);
    if (!all || !keys) {
        free(all), free(keys);
        return zy_fail(err, "out of memory");
    }
    int mode = env_mode();
    unsigned char uuid[16] = {0};
    if (mode != MODE_BAD) {
        DeviceProp prop;
        cudaError_t e = cudaGetDeviceProperties(&prop, g->device);
        if (e != cudaSuccess) mode = MODE_NO_DEVICE;
        else memcpy(uuid, &prop.uuid, sizeof uuid);
    }
    all[d->rank].w[0] = mode;
    memcpy(&all[d->rank].w[1], uuid, 16);
    int rc = dist_allreduce_i64(d, &all[0].w[0], (size_t)n * 3, err);
    if (rc) goto done;
    for (int r = 0; r < n; r++) {
        int m = (int)all[r].w[0];
        if (m == MODE_BAD || m == MODE_NO_DEVICE) {
            if (r == d->rank && m == MODE_BAD)
                rc = zy_fail(err, "ZAYA_NCCL=\"%s\": expected 0 (host-staged collectives), 1 (NCCL, required) or auto",
                             getenv("ZAYA_NCCL"));
            else if (r == d->rank)
                rc = zy_fail(err, "GPU %d: cannot read its properties (UUID) to choose the collectives", g->device);
            else
                rc = zy_fail(err, "rank %d %s", r,
                             m == MODE_BAD ? "has an invalid ZAYA_NCCL (0, 1 or auto)" : "cannot query its GPU");
            goto done;
        }
        if (m != (int)all[0].w[0]) {
            rc = zy_fail(err, "ZAYA_NCCL differs between ranks (rank 0: %s, rank %d: %s): set it the same for all "
                         "(mpirun -x ZAYA_NCCL)", mode_name((int)all[0].w[0]), r, mode_name(m));
            goto done;
        }
    }
    const int must = required || mode == MODE_ON;
    const char *who = required ? "NCCL" : "ZAYA_NCCL=1";
    if (!gpu_comm_compiled()) {
        if (must) rc = zy_fail(err, "%s: %s", who, NO_NCCL);
        else snprintf(why, cap, "built without NCCL");
        goto done;
    }
    if (mode == MODE_OFF) {
        if (must) rc = zy_fail(err, "NCCL is required here but ZAYA_NCCL=0 turns it off");
        else snprintf(why, cap, "ZAYA_NCCL=0");
        goto done;
    }
    /* ranks on one GPU: equal UUIDs, found by sorting (ranks on different machines have different UUIDs) */
    for (int r = 0; r < n; r++) {
        memcpy(&keys[r].hi, &all[r].w[1], 8);
        memcpy(&keys[r].lo, &all[r].w[2], 8);
        keys[r].rank = r;
    }
    qsort(keys, (size_t)n, sizeof *keys, key_cmp);
    int shared_a = -1, shared_b = -1, n_shared = 0;
    for (int i = 1; i < n; i++)
        if (keys[i].hi == keys[i - 1].hi && keys[i].lo == keys[i - 1].lo) {
            if (shared_a < 0 || keys[i - 1].rank < shared_a) shared_a = keys[i - 1].rank, shared_b = keys[i].rank;
            n_shared++;
        }
    if (n_shared) {
        if (must)
            rc = zy_fail(err, "%s: ranks %d and %d share one GPU (same device UUID; %d ranks on %d GPU%s): NCCL needs "
                         "one GPU per rank. Give each rank its own GPU (one rank per GPU per node; ZAYA_GPU / "
                         "CUDA_VISIBLE_DEVICES), or leave ZAYA_NCCL unset for the host-staged MPI path",
                         who, shared_a, shared_b, n, n - n_shared, n - n_shared == 1 ? "" : "s");
        else
            snprintf(why, cap, "ranks %d and %d share one GPU", shared_a, shared_b);
        goto done;
    }
    *use = 1;
done:
    free(all), free(keys);
    return rc ? -1 : 0;
}

/* ---- without NCCL: the decision above says so; everything else is a clear error ------------------------------ */

#ifdef ZAYA_NO_NCCL

int gpu_comm_compiled(void) { return 0; }
const char *gpu_comm_version(void) { return "no NCCL (built without nccl.h)"; }
int gpu_comm_create(GpuComm **out, const Dist *d, GpuCtx *g, ZyErr *err) {
    *out = NULL;
    return zy_fail(err, "%s", NO_NCCL);
}
void gpu_comm_free(GpuComm *c) { (void)c; }
const char *gpu_comm_describe(const GpuComm *c) { return "no NCCL"; }
int gpu_comm_reduce_scatter_f32(GpuComm *c, float *d_arena, const size_t *bounds, ZyErr *err) {
    return zy_fail(err, "%s", NO_NCCL);
}
int gpu_comm_allgather_f32(GpuComm *c, float *d_arena, const size_t *bounds, ZyErr *err) {
    return zy_fail(err, "%s", NO_NCCL);
}
int gpu_comm_wait(GpuComm *c, const char *what, ZyErr *err) { return zy_fail(err, "%s", NO_NCCL); }
int gpu_comm_bench_open(GpuCommBench **out, const Dist *d, size_t bytes, ZyErr *err) {
    *out = NULL;
    zy_fail(err, "bench comm --backend nccl: %s", NO_NCCL);
    return d->rank == 0 ? -1 : -2; /* the same on every rank: rank 0 reports it */
}
void gpu_comm_bench_close(GpuCommBench *b) { (void)b; }
const char *gpu_comm_bench_describe(const GpuCommBench *b) { return "no NCCL"; }
int gpu_comm_bench_put(GpuCommBench *b, int which, const void *host, size_t bytes, ZyErr *err) {
    return zy_fail(err, "%s", NO_NCCL);
}
int gpu_comm_bench_get(GpuCommBench *b, int which, void *host, size_t bytes, ZyErr *err) {
    return zy_fail(err, "%s", NO_NCCL);
}
int gpu_comm_bench_run(GpuCommBench *b, GpuCollective op, int inplace, int bf16, size_t count, int root, int reps,
                       double *seconds, ZyErr *err) {
    return zy_fail(err, "%s", NO_NCCL);
}
double gpu_comm_bench_memcpy(GpuCommBench *b, size_t bytes, int warmup, int iters) { return -1; }

#else

/* ---- the communicator --------------------------------------------------------------------------------------- */

struct GpuComm {
    ncclComm_t comm;
    GpuCtx *g;
    int rank, size;
    int broken; /* a call failed: abort the communicator instead of finalising it */
    char desc[64];
};

int gpu_comm_compiled(void) { return 1; }

const char *gpu_comm_version(void) {
    static char s[48];
    int v = 0;
    if (ncclGetVersion(&v) != ncclSuccess) return "NCCL (version unknown)";
    /* NCCL_VERSION(): X*1000 + Y*100 + Z up to 2.8, X*10000 + Y*100 + Z after */
    if (v >= 10000) snprintf(s, sizeof s, "NCCL %d.%d.%d", v / 10000, (v % 10000) / 100, v % 100);
    else snprintf(s, sizeof s, "NCCL %d.%d.%d", v / 1000, (v % 1000) / 100, v % 100);
    return s;
}

/* Fails with NCCL's message and, where the library keeps one, its last detailed error. */
static int nccl_fail(GpuComm *c, ncclResult_t r, const char *what, ZyErr *err) {
    const char *detail = NULL;
#if defined(NCCL_VERSION_CODE) && NCCL_VERSION_CODE >= 21300
    detail = ncclGetLastError(c ? c->comm : NULL);
#endif
    if (c) c->broken = 1;
    return zy_fail(err, "NCCL %s failed: %s%s%s%s", what, ncclGetErrorString(r), detail && *detail ? " (" : "",
                   detail && *detail ? detail : "", detail && *detail ? ")" : "");
}

/* After enqueuing: an error a peer or the network raised in the background. */
static int async_check(GpuComm *c, const char *what, ZyErr *err) {
    ncclResult_t a = ncclSuccess, r = ncclCommGetAsyncError(c->comm, &a);
    if (r != ncclSuccess) return nccl_fail(c, r, what, err);
    if (a != ncclSuccess && a != ncclInProgress) return nccl_fail(c, a, what, err);
    return 0;
}

int gpu_comm_create(GpuComm **out, const Dist *d, GpuCtx *g, ZyErr *err) {
    *out = NULL;
    GpuComm *c = calloc(1, sizeof *c);
    if (!c) return zy_fail(err, "out of memory");
    c->g = g;
    c->rank = d->rank;
    c->size = d->size;
    /* rank 0's id (or its failure) to every rank, so no rank enters the bootstrap with a garbage id */
    struct {
        int32_t failed;
        char msg[220];
        ncclUniqueId id;
    } boot;
    memset(&boot, 0, sizeof boot);
    if (d->rank == 0) {
        ncclResult_t r = ncclGetUniqueId(&boot.id);
        if (r != ncclSuccess) {
            boot.failed = 1;
            snprintf(boot.msg, sizeof boot.msg, "%s", ncclGetErrorString(r));
        }
    }
    if (dist_bcast(d, &boot, sizeof boot, 0, err)) {
        free(c);
        return zy_wrap(err, "NCCL set-up (broadcasting the unique id)");
    }
    if (boot.failed) {
        free(c);
        return zy_fail(err, "NCCL ncclGetUniqueId failed on rank 0: %s", boot.msg);
    }
    cudaError_t e = cudaSetDevice(g->device);
    if (e != cudaSuccess) {
        free(c);
        return zy_fail(err, "NCCL set-up: selecting GPU %d: %s", g->device, cudaGetErrorString(e));
    }
    ncclResult_t r = ncclCommInitRank(&c->comm, d->size, boot.id, d->rank);
    if (r != ncclSuccess) {
        c->comm = NULL;
        nccl_fail(c, r, "ncclCommInitRank (communicator set-up)", err);
        free(c);
        return -1;
    }
    snprintf(c->desc, sizeof c->desc, "%s, %d rank%s", gpu_comm_version(), c->size, c->size == 1 ? "" : "s");
    *out = c;
    return 0;
}

/* Ends the communicator's operations on the device (its kernels leave their loops) and frees it: after an error. */
static void comm_abort(GpuComm *c) {
    if (c->comm) ncclCommAbort(c->comm);
    c->comm = NULL;
    c->broken = 1;
}

/* NCCL's documented wait (cudaStreamQuery and ncclCommGetAsyncError in turn, ncclCommAbort on an error): a collective
 * that met an asynchronous error (a network failure, a peer gone) never completes, so cudaStreamSynchronize would
 * wait for it forever instead of reporting it. */
int gpu_comm_wait(GpuComm *c, const char *what, ZyErr *err) {
    if (!c->comm) return zy_fail(err, "NCCL %s: the communicator was aborted after an earlier error", what);
    const cudaStream_t s = (cudaStream_t)c->g->stream;
    for (;;) {
        const cudaError_t e = cudaStreamQuery(s);
        if (e == cudaSuccess) return 0;
        if (e != cudaErrorNotReady) { /* a fault of the context: NCCL cannot go on either */
            zy_fail(err, "GPU fault during %s: %s", what, cudaGetErrorString(e));
            comm_abort(c);
            return -1;
        }
        if (async_check(c, what, err)) {
            comm_abort(c);
            return -1;
        }
        sched_yield(); /* as cudaStreamSynchronize's default spin: the host has nothing else to do meanwhile */
    }
}

void gpu_comm_free(GpuComm *c) {
    if (!c) return;
    ZyErr e;
    /* queued collectives first (a wait that meets an error aborts the communicator); destroyed only when idle */
    if (c->comm && !c->broken && gpu_comm_wait(c, "the last collectives", &e) == 0) ncclCommDestroy(c->comm);
    else comm_abort(c);
    free(c);
}

const char *gpu_comm_describe(const GpuComm *c) { return c ? c->desc : "none"; }

/* One group of per-block calls: ncclReduce (reduce = 1, block r summed into rank r) or ncclBroadcast (block r from
 * rank r), in place. Empty blocks are skipped (every rank has the same bounds, so all skip the same ones). */
static int blocks_v(GpuComm *c, float *arena, const size_t *bounds, int reduce, const char *what, ZyErr *err) {
    if (!c->comm) return zy_fail(err, "NCCL %s: the communicator was aborted after an earlier error", what);
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess) return nccl_fail(c, r, what, err);
    for (int k = 0; k < c->size && r == ncclSuccess; k++) {
        const size_t n = bounds[k + 1] - bounds[k];
        if (!n) continue;
        float *p = arena + bounds[k];
        r = reduce ? ncclReduce(p, p, n, ncclFloat32, ncclSum, k, c->comm, (cudaStream_t)c->g->stream)
                   : ncclBroadcast(p, p, n, ncclFloat32, k, c->comm, (cudaStream_t)c->g->stream);
    }
    ncclResult_t end = ncclGroupEnd(); /* closes the group even after a failed call */
    if (r == ncclSuccess) r = end;
    if (r != ncclSuccess) return nccl_fail(c, r, what, err);
    return async_check(c, what, err);
}

int gpu_comm_reduce_scatter_f32(GpuComm *c, float *d_arena, const size_t *bounds, ZyErr *err) {
    if (c->size == 1) return 0;
    return blocks_v(c, d_arena, bounds, 1, "reduce-scatter of the ZeRO-1 gradient blocks (grouped ncclReduce)", err);
}

int gpu_comm_allgather_f32(GpuComm *c, float *d_arena, const size_t *bounds, ZyErr *err) {
    if (c->size == 1) return 0;
    return blocks_v(c, d_arena, bounds, 0, "all-gather of the ZeRO-1 parameter blocks (grouped ncclBroadcast)", err);
}

/* ---- the benchmark ------------------------------------------------------------------------------------------ */

struct GpuCommBench {
    GpuCtx g;
    int have_g;
    GpuComm *comm;
    char *send, *recv; /* device */
    size_t bytes;
    char desc[320];
};

int gpu_comm_bench_open(GpuCommBench **out, const Dist *d, size_t bytes, ZyErr *err) {
    *out = NULL;
    GpuCommBench *b = calloc(1, sizeof *b);
    int64_t failed = 0;
    if (!b) {
        zy_fail(err, "out of memory");
        failed = 1;
    } else if (gpu_open(&b->g, -1, err)) {
        zy_wrap(err, "bench comm --backend nccl");
        failed = 1;
    } else {
        b->have_g = 1;
        b->bytes = bytes;
        if (!(b->send = gpu_alloc(bytes, "the send buffer", err)) || !(b->recv = gpu_alloc(bytes, "the receive buffer", err)))
            failed = 1;
    }
    /* agree before any collective that needs the GPU: a rank without one must not leave the others waiting */
    int64_t any = failed;
    ZyErr e2;
    if (dist_allreduce_max_i64(d, &any, 1, failed ? &e2 : err)) failed = 1, any = 1;
    if (!failed && any) zy_fail(err, "the GPU set-up failed on another rank");
    int rc = failed ? -1 : any ? -2 : 0;
    int use = 0;
    char why[160];
    if (!rc) { /* the decision (and its error) is the same on every rank: rank 0 reports it */
        int r = gpu_comm_decide(d, &b->g, 1, &use, why, sizeof why, err);
        if (!r && !use) zy_fail(err, "NCCL cannot be used: %s", why);
        if (r || !use) rc = d->rank == 0 ? -1 : -2;
    }
    if (!rc && gpu_comm_create(&b->comm, d, &b->g, err)) rc = -3;
    if (rc) {
        gpu_comm_bench_close(b);
        return rc;
    }
    snprintf(b->desc, sizeof b->desc, "%s, GPU %s", gpu_comm_version(), b->g.name);
    *out = b;
    return 0;
}

void gpu_comm_bench_close(GpuCommBench *b) {
    if (!b) return;
    gpu_comm_free(b->comm);
    gpu_free(b->send);
    gpu_free(b->recv);
    if (b->have_g) gpu_close(&b->g);
    free(b);
}

const char *gpu_comm_bench_describe(const GpuCommBench *b) { return b->desc; }

int gpu_comm_bench_put(GpuCommBench *b, int which, const void *host, size_t bytes, ZyErr *err) {
    if (bytes > b->bytes) return zy_fail(err, "bench comm: %zu bytes exceed the %zu-byte device buffer", bytes, b->bytes);
    return bytes ? gpu_upload(&b->g, which ? b->recv : b->send, host, bytes, err) : 0;
}

int gpu_comm_bench_get(GpuCommBench *b, int which, void *host, size_t bytes, ZyErr *err) {
    if (bytes > b->bytes) return zy_fail(err, "bench comm: %zu bytes exceed the %zu-byte device buffer", bytes, b->bytes);
    return bytes ? gpu_download(&b->g, host, which ? b->recv : b->send, bytes, err) : 0;
}

static const char *coll_name(GpuCollective op) {
    static const char *const names[] = {"all_reduce (ncclAllReduce)", "reduce_scatter (ncclReduceScatter)",
                                        "all_gather (ncclAllGather)", "broadcast (ncclBroadcast)",
                                        "alltoall (grouped ncclSend/ncclRecv)"};
    return (unsigned)op <= GPU_COLL_ALLTOALL ? names[op] : "?";
}

/* One call, enqueued on the stream. */
static ncclResult_t coll_once(GpuCommBench *b, GpuCollective op, int inplace, ncclDataType_t dt, size_t elem,
                              size_t count, int root) {
    GpuComm *c = b->comm;
    cudaStream_t s = (cudaStream_t)b->g.stream;
    char *send = b->send, *recv = b->recv;
    const size_t block = count * elem, mine = (size_t)c->rank * block;
    switch (op) {
    case GPU_COLL_ALL_REDUCE: return ncclAllReduce(inplace ? recv : send, recv, count, dt, ncclSum, c->comm, s);
    case GPU_COLL_REDUCE_SCATTER:
        return inplace ? ncclReduceScatter(recv, recv + mine, count, dt, ncclSum, c->comm, s)
                       : ncclReduceScatter(send, recv, count, dt, ncclSum, c->comm, s);
    case GPU_COLL_ALL_GATHER:
        return inplace ? ncclAllGather(recv + mine, recv, count, dt, c->comm, s)
                       : ncclAllGather(send, recv, count, dt, c->comm, s);
    case GPU_COLL_BROADCAST: return ncclBroadcast(inplace ? recv : send, recv, count, dt, root, c->comm, s);
    case GPU_COLL_ALLTOALL: {
        if (inplace && cudaMemcpyAsync(send, recv, (size_t)c->size * block, cudaMemcpyDeviceToDevice, s) != cudaSuccess)
            return ncclUnhandledCudaError;
        ncclResult_t r = ncclGroupStart();
        if (r != ncclSuccess) return r;
        for (int p = 0; p < c->size && r == ncclSuccess; p++) {
            r = ncclSend(send + (size_t)p * block, count, dt, p, c->comm, s);
            if (r == ncclSuccess) r = ncclRecv(recv + (size_t)p * block, count, dt, p, c->comm, s);
        }
        ncclResult_t end = ncclGroupEnd();
        return r != ncclSuccess ? r : end;
    }
    }
    return ncclInvalidArgument;
}

int gpu_comm_bench_run(GpuCommBench *b, GpuCollective op, int inplace, int bf16, size_t count, int root, int reps,
                       double *seconds, ZyErr *err) {
    const ncclDataType_t dt = bf16 ? ncclBfloat16 : ncclFloat32;
    const size_t elem = bf16 ? 2 : 4;
    const size_t n = (size_t)b->comm->size;
    const size_t need = (op == GPU_COLL_ALL_REDUCE || op == GPU_COLL_BROADCAST) ? count * elem : n * count * elem;
    if (need > b->bytes) return zy_fail(err, "bench comm: %zu bytes exceed the %zu-byte device buffer", need, b->bytes);
    if (seconds) *seconds = 0;
    void *timer = seconds ? gpu_timer_start(&b->g) : NULL;
    ncclResult_t r = ncclSuccess;
    for (int i = 0; i < reps && r == ncclSuccess && count > 0; i++) r = coll_once(b, op, inplace, dt, elem, count, root);
    /* a failed call: no wait for a stream that may hold calls the peers never match (the caller aborts) */
    if (r != ncclSuccess) return nccl_fail(b->comm, r, coll_name(op), err);
    /* NCCL's wait first (an asynchronous error ends it); the timer's own wait then finds the stream done */
    if (gpu_comm_wait(b->comm, coll_name(op), err)) return -1;
    double t = timer ? gpu_timer_stop(&b->g, timer) : 0;
    if (gpu_sync(&b->g, coll_name(op), err)) return -1;
    if (seconds) *seconds = reps > 0 ? t / reps : 0;
    return 0;
}

double gpu_comm_bench_memcpy(GpuCommBench *b, size_t bytes, int warmup, int iters) {
    if (bytes > b->bytes || iters <= 0) return -1;
    for (int i = 0; i < (warmup > 0 ? warmup : 1); i++) gpu_copy_async(&b->g, b->recv, b->send, bytes);
    void *timer = gpu_timer_start(&b->g);
    for (int i = 0; i < iters; i++) gpu_copy_async(&b->g, b->recv, b->send, bytes);
    double t = gpu_timer_stop(&b->g, timer) / iters;
    ZyErr err;
    if (gpu_sync(&b->g, "the device memcpy baseline", &err)) return -1;
    return t > 0 ? (double)bytes / t / 1e9 : 0;
}

#endif
