#include "cli/cmd_bench_comm.h"

#include "gpu/gpu_comm.h"
#include "train/report.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <limits.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *const op_names[BC_N_OPS] = {"all_reduce", "reduce_scatter", "all_gather", "broadcast", "alltoall"};

const char *bc_op_name(BcOp op) { return (unsigned)op < BC_N_OPS ? op_names[op] : "?"; }
const char *bc_type_name(BcType t) { return t == BC_BF16 ? "bf16" : "float"; }
size_t bc_type_size(BcType t) { return t == BC_BF16 ? 2 : 4; }
const char *bc_backend_name(BcBackend b) { return b == BC_NCCL ? "nccl" : "mpi"; }

int bc_parse_backend(const char *s, BcBackend *backend, ZyErr *err) {
    if (strcmp(s, "mpi") == 0 || strcmp(s, "MPI") == 0) {
        *backend = BC_MPI;
        return 0;
    }
    if (strcmp(s, "nccl") == 0 || strcmp(s, "NCCL") == 0) {
        *backend = BC_NCCL;
        return 0;
    }
    return zy_fail(err, "unknown backend \"%s\" (mpi or nccl)", s);
}
static int is_reduction(BcOp op) { return op == BC_ALL_REDUCE || op == BC_REDUCE_SCATTER; }
/* reduce_scatter, all_gather and alltoall move n blocks of `count` elements */
static int is_blocked(BcOp op) { return op == BC_REDUCE_SCATTER || op == BC_ALL_GATHER || op == BC_ALLTOALL; }

int bc_parse_ops(const char *s, unsigned *ops, ZyErr *err) {
    if (strcmp(s, "all") == 0) {
        *ops = (1u << BC_N_OPS) - 1;
        return 0;
    }
    static const char *const alias[BC_N_OPS] = {"allreduce", "reducescatter", "allgather", "bcast", "all_to_all"};
    for (int k = 0; k < BC_N_OPS; k++)
        if (strcmp(s, op_names[k]) == 0 || strcmp(s, alias[k]) == 0) {
            *ops = 1u << k;
            return 0;
        }
    return zy_fail(err, "unknown collective \"%s\" (all_reduce, reduce_scatter, all_gather, broadcast, alltoall or all)", s);
}

int bc_parse_type(const char *s, BcType *type, ZyErr *err) {
    if (strcmp(s, "float") == 0 || strcmp(s, "f32") == 0 || strcmp(s, "float32") == 0) {
        *type = BC_FLOAT;
        return 0;
    }
    if (strcmp(s, "bf16") == 0 || strcmp(s, "bfloat16") == 0) {
        *type = BC_BF16;
        return 0;
    }
    return zy_fail(err, "unknown data type \"%s\" (float or bf16)", s);
}

int bc_parse_size(const char *s, size_t *out, ZyErr *err) {
    const char *p = s;
    if (!isdigit((unsigned char)*p)) return zy_fail(err, "bad size \"%s\" (a positive number with an optional K, M or G)", s);
    unsigned long long v = 0;
    for (; isdigit((unsigned char)*p); p++) {
        if (v > (ULLONG_MAX - 9) / 10) return zy_fail(err, "size \"%s\" is too large", s);
        v = v * 10 + (unsigned)(*p - '0');
    }
    int shift = 0;
    switch (toupper((unsigned char)*p)) {
    case 'K': shift = 10; p++; break;
    case 'M': shift = 20; p++; break;
    case 'G': shift = 30; p++; break;
    default: break;
    }
    if (*p == 'B' || *p == 'b') p++;
    if (*p) return zy_fail(err, "bad size \"%s\" (a positive number with an optional K, M or G)", s);
    if (v == 0) return zy_fail(err, "size \"%s\" must be positive", s);
    if (v > ((unsigned long long)SIZE_MAX >> shift)) return zy_fail(err, "size \"%s\" is too large", s);
    *out = (size_t)(v << shift);
    return 0;
}

double bc_bus_factor(BcOp op, int n) {
    switch (op) {
    case BC_ALL_REDUCE: return 2.0 * (n - 1) / n;
    case BC_REDUCE_SCATTER:
    case BC_ALL_GATHER:
    case BC_ALLTOALL: return (double)(n - 1) / n;
    default: return 1.0;
    }
}

/* elements per rank block for S bytes (see BcRow.count) */
static size_t row_count(BcOp op, size_t bytes, size_t elem, int n) {
    return is_blocked(op) ? bytes / elem / (size_t)n : bytes / elem;
}

int bc_validate(const BcConfig *cfg, int nranks, ZyErr *err) {
    if (cfg->ops == 0 || cfg->ops >= (1u << BC_N_OPS)) return zy_fail(err, "no collective selected");
    if (cfg->min_bytes == 0) return zy_fail(err, "-b must be positive");
    if (cfg->min_bytes > cfg->max_bytes)
        return zy_fail(err, "-b %zu is larger than -e %zu", cfg->min_bytes, cfg->max_bytes);
    if (cfg->factor < 2) return zy_fail(err, "-f must be at least 2, got %llu", (unsigned long long)cfg->factor);
    if (cfg->iters <= 0) return zy_fail(err, "-n must be positive, got %d", cfg->iters);
    if (cfg->warmup < 0) return zy_fail(err, "-w must not be negative, got %d", cfg->warmup);
    if (cfg->root < 0 || cfg->root >= nranks)
        return zy_fail(err, "root %d is not a rank (0..%d)", cfg->root, nranks - 1);
    size_t elem = bc_type_size(cfg->type);
    if (cfg->max_bytes / elem > (size_t)INT_MAX)
        return zy_fail(err, "-e %zu: more than INT_MAX %s elements in one MPI call", cfg->max_bytes, bc_type_name(cfg->type));
    return 0;
}

/* ---- data: rank- and index-dependent values, exactly representable in float and bf16 ----------------------- */

static uint64_t mix(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* Element i (in the rank's whole input) of rank `rank`: an integer. Copies (all_gather, broadcast, alltoall) use
 * [-255, 255]; sums use [-A, A] with A = 128 / n (at least 1, and only the first 128 ranks non-zero), so every
 * partial sum, in any order, is an integer of magnitude <= 128: exact in float and in bf16 (8 significant bits). */
float bc_input_value(BcOp op, int rank, int nranks, size_t i) {
    uint64_t h = mix((uint64_t)i * 0x100000001B3ull ^ mix((uint64_t)rank + 1));
    if (!is_reduction(op)) return (float)((int)(h % 511) - 255);
    if (rank >= 128) return 0;
    int a = nranks < 128 ? 128 / nranks : 1;
    return (float)((int)(h % (uint64_t)(2 * a + 1)) - a);
}

static float expected_value(BcOp op, int rank, int n, int root, size_t count, size_t i) {
    switch (op) {
    case BC_ALL_REDUCE: {
        float s = 0;
        for (int r = 0; r < n; r++) s += bc_input_value(op, r, n, i);
        return s;
    }
    case BC_REDUCE_SCATTER: {
        float s = 0;
        for (int r = 0; r < n; r++) s += bc_input_value(op, r, n, (size_t)rank * count + i);
        return s;
    }
    case BC_ALL_GATHER: return bc_input_value(op, (int)(i / count), n, i % count);
    case BC_BROADCAST: return bc_input_value(op, root, n, i);
    case BC_ALLTOALL: return bc_input_value(op, (int)(i / count), n, (size_t)rank * count + i % count);
    default: return 0;
    }
}

static void store(void *buf, BcType t, size_t i, float v) {
    if (t == BC_BF16)
        ((uint16_t *)buf)[i] = zy_f32_to_bf16(v);
    else
        ((float *)buf)[i] = v;
}

static float load(const void *buf, BcType t, size_t i) {
    return t == BC_BF16 ? zy_bf16_to_f32(((const uint16_t *)buf)[i]) : ((const float *)buf)[i];
}

/* A value no result element may keep: NaN (never equal to anything). */
static void fill_sentinel(void *buf, BcType t, size_t from, size_t to) {
    for (size_t i = from; i < to; i++) store(buf, t, i, __builtin_nanf(""));
}

static void fill_input(void *buf, BcType t, BcOp op, int rank, int n, size_t offset_index, size_t from, size_t to) {
    for (size_t i = from; i < to; i++) store(buf, t, i, bc_input_value(op, rank, n, offset_index + i - from));
}

/* Where each placement reads and writes (MPI semantics):
 * - all_reduce: out-of-place send[c] -> recv[c]; in-place recv[c] holds the input and the result.
 * - reduce_scatter (MPI_Reduce_scatter_block): send[n c] -> recv[c]; in-place recv[n c] input, result in recv[0, c).
 * - all_gather: send[c] -> recv[n c]; in-place recv block `rank` is this rank's contribution.
 * - broadcast: MPI_Bcast has one buffer; out-of-place the root sends from its send buffer and the others receive
 *   into their receive buffers, in-place every rank uses its receive buffer.
 * - alltoall: send[n c] -> recv[n c]; in-place recv[n c] holds the blocks to send and receives. */
static void fill(BcOp op, int inplace, BcType t, int rank, int n, int root, size_t c, void *send, void *recv) {
    size_t nc = (size_t)n * c;
    switch (op) {
    case BC_ALL_REDUCE:
    case BC_REDUCE_SCATTER:
    case BC_ALLTOALL: { /* the input fills the buffer it is read from; the sentinel what is received */
        const size_t in = op == BC_ALL_REDUCE ? c : nc, out = op == BC_ALLTOALL ? nc : c;
        if (inplace) {
            fill_input(recv, t, op, rank, n, 0, 0, in);
        } else {
            fill_input(send, t, op, rank, n, 0, 0, in);
            fill_sentinel(recv, t, 0, out);
        }
        break;
    }
    case BC_ALL_GATHER:
        fill_sentinel(recv, t, 0, nc);
        if (inplace)
            fill_input(recv, t, op, rank, n, 0, (size_t)rank * c, (size_t)(rank + 1) * c);
        else
            fill_input(send, t, op, rank, n, 0, 0, c);
        break;
    case BC_BROADCAST:
        if (rank == root)
            fill_input(inplace ? recv : send, t, op, rank, n, 0, 0, c);
        else
            fill_sentinel(recv, t, 0, c);
        break;
    default: break;
    }
}

/* res_off: where the result starts in recv, in elements (0, but NCCL's in-place reduce_scatter leaves the rank's
 * block at rank·c). */
static int64_t count_wrong(BcOp op, int inplace, BcType t, int rank, int n, int root, size_t c, const void *send,
                           const void *recv, size_t res_off) {
    const void *res = recv;
    size_t len = c;
    if (op == BC_ALL_GATHER || op == BC_ALLTOALL) len = (size_t)n * c;
    if (op == BC_BROADCAST && rank == root && !inplace) res = send, res_off = 0; /* the root's data must be left as it was */
    int64_t wrong = 0;
    for (size_t i = 0; i < len; i++) {
        float want = expected_value(op, rank, n, root, c, i);
        if (t == BC_BF16) want = zy_bf16_to_f32(zy_f32_to_bf16(want)); /* exact already; keeps the rule explicit */
        if (!(load(res, t, res_off + i) == want)) wrong++;
    }
    return wrong;
}

/* ---- bf16 sum: a user-defined MPI_Op ------------------------------------------------------------------------ */

/* Each pairwise sum is computed in float (exact for two bf16 values within 2^16 of each other in magnitude) and
 * rounded to the nearest bf16, ties to even (zy_f32_to_bf16). Commutative, not associative: the result depends
 * on the order MPI combines ranks in, as for any low-precision reduction; the benchmark's data are integers
 * whose partial sums are exact, so #wrong does not depend on that order. */
static void bf16_sum(void *in, void *inout, int *len, MPI_Datatype *type) {
    (void)type;
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++) b[i] = zy_f32_to_bf16(zy_bf16_to_f32(a[i]) + zy_bf16_to_f32(b[i]));
}

/* ---- one call of a collective ------------------------------------------------------------------------------- */

typedef struct {
    MPI_Datatype dt;
    MPI_Op sum;
    int rank, n, root;
    void *send, *recv;
} Ctx;

static int call(const Ctx *x, BcOp op, int inplace, size_t count) {
    int c = (int)count;
    void *send = inplace ? MPI_IN_PLACE : x->send;
    switch (op) {
    case BC_ALL_REDUCE: return MPI_Allreduce(send, x->recv, c, x->dt, x->sum, MPI_COMM_WORLD);
    case BC_REDUCE_SCATTER: return MPI_Reduce_scatter_block(send, x->recv, c, x->dt, x->sum, MPI_COMM_WORLD);
    case BC_ALL_GATHER:
        return inplace ? MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, x->recv, c, x->dt, MPI_COMM_WORLD)
                       : MPI_Allgather(x->send, c, x->dt, x->recv, c, x->dt, MPI_COMM_WORLD);
    case BC_BROADCAST:
        return MPI_Bcast(!inplace && x->rank == x->root ? x->send : x->recv, c, x->dt, x->root, MPI_COMM_WORLD);
    case BC_ALLTOALL:
        return inplace ? MPI_Alltoall(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, x->recv, c, x->dt, MPI_COMM_WORLD)
                       : MPI_Alltoall(x->send, c, x->dt, x->recv, c, x->dt, MPI_COMM_WORLD);
    default: return MPI_ERR_OP;
    }
}

static int mpi_check(int rc, const char *what, ZyErr *err) {
    if (rc == MPI_SUCCESS) return 0;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    return zy_fail(err, "MPI %s failed: %.*s", what, len, msg);
}

/* ---- the table ---------------------------------------------------------------------------------------------- */

static void print_header(FILE *out) {
    fprintf(out, "#%74s%31s\n", "out-of-place", "in-place");
    fprintf(out, "#%11s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s\n", "size", "count", "type",
            "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
    fprintf(out, "#%11s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s\n", "(B)", "(elements)", "", "",
            "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
}

static void fmt_time(char *s, size_t cap, double us) {
    if (us >= 10000.0)
        snprintf(s, cap, "%7.0f", us);
    else if (us >= 100.0)
        snprintf(s, cap, "%7.1f", us);
    else
        snprintf(s, cap, "%7.2f", us);
}

static void print_row(FILE *out, const BcRow *r, BcType t) {
    fprintf(out, "%12zu  %12zu  %8s  %6s  %6d", r->bytes, r->count, bc_type_name(t), is_reduction(r->op) ? "sum" : "none",
            r->root);
    for (int p = 0; p < 2; p++) {
        char ts[32], ws[32];
        fmt_time(ts, sizeof ts, r->res[p].time_us);
        if (r->res[p].wrong < 0)
            snprintf(ws, sizeof ws, "N/A");
        else
            snprintf(ws, sizeof ws, "%lld", (long long)r->res[p].wrong);
        fprintf(out, "  %7s  %6.2f  %6.2f  %6s", ts, r->res[p].algbw, r->res[p].busbw, ws);
    }
    fprintf(out, "\n");
    fflush(out);
}

/* ---- the run ------------------------------------------------------------------------------------------------ */

static int n_sizes(const BcConfig *cfg) {
    int k = 0;
    for (size_t s = cfg->min_bytes;; s *= cfg->factor) {
        k++;
        if (s > cfg->max_bytes / cfg->factor) break; /* the same stepping as bc_run */
    }
    return k;
}

/* rank 0: memcpy of `bytes` from send to recv, warm-ups then iters, GB/s (bytes copied per second) */
static double memcpy_bw(void *dst, const void *src, size_t bytes, int warmup, int iters) {
    for (int i = 0; i < (warmup > 0 ? warmup : 1); i++) memcpy(dst, src, bytes);
    double t0 = MPI_Wtime();
    for (int i = 0; i < iters; i++) {
        memcpy(dst, src, bytes);
        __asm__ __volatile__("" : : "r"(dst) : "memory"); /* the copies are not dead stores */
    }
    double t = (MPI_Wtime() - t0) / iters;
    return t > 0 ? (double)bytes / t / 1e9 : 0;
}

/* the benchmark's collectives are gpu_comm's, in the same order */
_Static_assert((int)BC_ALL_REDUCE == (int)GPU_COLL_ALL_REDUCE && (int)BC_REDUCE_SCATTER == (int)GPU_COLL_REDUCE_SCATTER &&
                   (int)BC_ALL_GATHER == (int)GPU_COLL_ALL_GATHER && (int)BC_BROADCAST == (int)GPU_COLL_BROADCAST &&
                   (int)BC_ALLTOALL == (int)GPU_COLL_ALLTOALL,
               "BcOp and GpuCollective must agree");

/* `reps` calls of one collective on the chosen backend; *seconds (may be NULL) the time per call on this rank:
 * MPI_Wtime around the loop (MPI), GPU events around the loop (NCCL). */
static int run_calls(const BcConfig *cfg, const Ctx *x, BcOp op, int inplace, size_t count, int reps, double *seconds,
                     ZyErr *err) {
    if (cfg->backend == BC_NCCL)
        return gpu_comm_bench_run(cfg->gpu, (GpuCollective)op, inplace, cfg->type == BC_BF16, count, cfg->root, reps,
                                  seconds, err);
    double t0 = MPI_Wtime();
    for (int i = 0; i < reps; i++)
        if (mpi_check(call(x, op, inplace, count), bc_op_name(op), err)) return -1;
    if (seconds) *seconds = reps > 0 ? (MPI_Wtime() - t0) / reps : 0;
    return 0;
}

int bc_run(const Dist *d, const BcConfig *cfg, FILE *out, BcReport *rep, ZyErr *err) {
    memset(rep, 0, sizeof *rep);
    if (bc_validate(cfg, d->size, err)) return -1;
    const int nccl = cfg->backend == BC_NCCL;
    if (nccl && !cfg->gpu) return zy_fail(err, "bench comm --backend nccl: no GPU buffers were opened");
    const int n = d->size, rank = d->rank;
    const size_t elem = bc_type_size(cfg->type);
    int sizes = n_sizes(cfg), n_ops = 0;
    for (int k = 0; k < BC_N_OPS; k++) n_ops += (cfg->ops >> k) & 1;
    Ctx x = {.dt = cfg->type == BC_BF16 ? MPI_UINT16_T : MPI_FLOAT, .sum = MPI_SUM, .rank = rank, .n = n, .root = cfg->root};
    /* buffers for the largest size, allocated once (NCCL: the host side that fills and checks the device buffers);
     * every rank agrees that they exist before any collective */
    x.send = zy_calloc(cfg->max_bytes);
    x.recv = zy_calloc(cfg->max_bytes);
    rep->rows = calloc((size_t)sizes * (size_t)n_ops, sizeof *rep->rows);
    int ok = x.send && x.recv && rep->rows, all_ok = 0;
    if (mpi_check(MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD), "allreduce", err)) goto fail;
    if (!all_ok) {
        zy_fail(err, "cannot allocate 2 x %zu bytes of buffers%s", cfg->max_bytes, ok ? " on another rank" : "");
        goto fail;
    }
    if (!nccl && cfg->type == BC_BF16 && mpi_check(MPI_Op_create(bf16_sum, 1, &x.sum), "op_create", err)) goto fail;
    rep->nranks = n;
    rep->wrong_total = cfg->check ? 0 : -1;

    /* memcpy baseline: rank 0 alone (the others wait), the largest size; NCCL: a device-to-device copy */
    if (mpi_check(MPI_Barrier(MPI_COMM_WORLD), "barrier", err)) goto fail;
    if (rank == 0) {
        rep->memcpy_bytes = cfg->max_bytes;
        rep->memcpy_gbps = nccl ? gpu_comm_bench_memcpy(cfg->gpu, cfg->max_bytes, cfg->warmup, cfg->iters)
                                : memcpy_bw(x.recv, x.send, cfg->max_bytes, cfg->warmup, cfg->iters);
    }
    if (mpi_check(MPI_Bcast(&rep->memcpy_gbps, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD), "broadcast", err)) goto fail;
    rep->memcpy_bytes = cfg->max_bytes;
    if (out) {
        if (nccl)
            fprintf(out, "# zaya bench comm: %d rank%s, backend nccl (%s), type %s, sizes %zu..%zu B x%llu, %d iterations "
                         "after %d warm-ups, check %s\n", n, n == 1 ? "" : "s", gpu_comm_bench_describe(cfg->gpu),
                    bc_type_name(cfg->type), cfg->min_bytes, cfg->max_bytes, (unsigned long long)cfg->factor, cfg->iters,
                    cfg->warmup, cfg->check ? "on" : "off");
        else
            fprintf(out, "# zaya bench comm: %d rank%s, type %s, sizes %zu..%zu B x%llu, %d iterations after %d warm-ups, "
                         "check %s\n", n, n == 1 ? "" : "s", bc_type_name(cfg->type), cfg->min_bytes, cfg->max_bytes,
                    (unsigned long long)cfg->factor, cfg->iters, cfg->warmup, cfg->check ? "on" : "off");
        fprintf(out, "# memcpy baseline (rank 0, %s%zu B): %.2f GB/s\n", nccl ? "device to device, " : "", cfg->max_bytes,
                rep->memcpy_gbps);
        fprintf(out, "# time: per call, %s / iterations, max over ranks; algbw = size / time; busbw = algbw x factor\n",
                nccl ? "GPU events around the loop" : "loop time");
        fprintf(out, "#\n");
        print_header(out);
    }

    double bw_sum = 0;
    int bw_count = 0;
    for (int k = 0; k < BC_N_OPS; k++) {
        if (!((cfg->ops >> k) & 1)) continue;
        BcOp op = (BcOp)k;
        if (out) {
            fprintf(out, "# %s", bc_op_name(op));
            if (op == BC_ALL_REDUCE) fprintf(out, " (busbw factor 2(n-1)/n = %.3f)\n", bc_bus_factor(op, n));
            else if (op == BC_BROADCAST) fprintf(out, " (busbw factor 1, root %d)\n", cfg->root);
            else fprintf(out, " (busbw factor (n-1)/n = %.3f; size = the whole %s buffer, count = %s)\n", bc_bus_factor(op, n),
                         op == BC_ALL_GATHER ? "output" : op == BC_REDUCE_SCATTER ? "input" : "send",
                         op == BC_ALLTOALL ? "per peer" : "per rank");
        }
        for (size_t s = cfg->min_bytes; ; s *= cfg->factor) {
            BcRow *row = &rep->rows[rep->n_rows++];
            row->op = op;
            row->requested = s;
            row->count = row_count(op, s, elem, n);
            row->bytes = row->count * elem * (is_blocked(op) ? (size_t)n : 1);
            row->root = op == BC_BROADCAST ? cfg->root : -1;
            for (int p = 0; p < 2; p++) {
                BcResult *res = &row->res[p];
                fill(op, p, cfg->type, rank, n, cfg->root, row->count, x.send, x.recv);
                res->wrong = -1;
                if (cfg->check) {
                    /* NCCL: the host fill goes to the device, the result comes back (the bytes a row uses) */
                    const size_t span = row->bytes;
                    if (nccl && (gpu_comm_bench_put(cfg->gpu, 0, x.send, span, err) ||
                                 gpu_comm_bench_put(cfg->gpu, 1, x.recv, span, err)))
                        goto fail;
                    if (run_calls(cfg, &x, op, p, row->count, 1, NULL, err)) goto fail;
                    if (nccl && (gpu_comm_bench_get(cfg->gpu, 0, x.send, span, err) ||
                                 gpu_comm_bench_get(cfg->gpu, 1, x.recv, span, err)))
                        goto fail;
                    const size_t res_off = nccl && p && op == BC_REDUCE_SCATTER ? (size_t)rank * row->count : 0;
                    int64_t w = count_wrong(op, p, cfg->type, rank, n, cfg->root, row->count, x.send, x.recv, res_off),
                            all = 0;
                    if (mpi_check(MPI_Allreduce(&w, &all, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD), "allreduce", err)) goto fail;
                    res->wrong = all;
                    rep->wrong_total += all;
                }
                if (run_calls(cfg, &x, op, p, row->count, cfg->warmup, NULL, err)) goto fail;
                if (mpi_check(MPI_Barrier(MPI_COMM_WORLD), "barrier", err)) goto fail;
                double t = 0, tmax = 0;
                if (run_calls(cfg, &x, op, p, row->count, cfg->iters, &t, err)) goto fail;
                if (mpi_check(MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD), "allreduce", err)) goto fail;
                res->time_us = tmax * 1e6;
                res->algbw = tmax > 0 ? (double)row->bytes / tmax / 1e9 : 0;
                res->busbw = res->algbw * bc_bus_factor(op, n);
                bw_sum += res->busbw;
                bw_count++;
            }
            if (out) print_row(out, row, cfg->type);
            if (s > cfg->max_bytes / cfg->factor) break;
        }
    }
    rep->avg_busbw = bw_count ? bw_sum / bw_count : 0;
    if (out) {
        if (cfg->check)
            fprintf(out, "# Out of bounds values : %lld %s\n", (long long)rep->wrong_total, rep->wrong_total ? "FAILED" : "OK");
        else
            fprintf(out, "# Out of bounds values : N/A (not checked; -c 1 checks)\n");
        fprintf(out, "# Avg bus bandwidth    : %.4f\n", rep->avg_busbw);
        fprintf(out, "#\n");
        fflush(out);
    }
    if (x.sum != MPI_SUM) MPI_Op_free(&x.sum);
    zy_free(x.send);
    zy_free(x.recv);
    return 0;
fail:
    if (x.sum != MPI_SUM) MPI_Op_free(&x.sum);
    zy_free(x.send);
    zy_free(x.recv);
    bc_report_free(rep);
    return -1;
}

void bc_report_free(BcReport *rep) {
    free(rep->rows);
    rep->rows = NULL;
    rep->n_rows = 0;
}

/* ---- JSON and plot ------------------------------------------------------------------------------------------ */

static cJSON *result_json(const BcResult *r) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "time_us", r->time_us);
    cJSON_AddNumberToObject(o, "algbw_gbps", r->algbw);
    cJSON_AddNumberToObject(o, "busbw_gbps", r->busbw);
    if (r->wrong >= 0)
        cJSON_AddNumberToObject(o, "wrong", (double)r->wrong);
    else
        cJSON_AddNullToObject(o, "wrong");
    return o;
}

int bc_write_json(const char *path, const BcConfig *cfg, const BcReport *rep, ZyErr *err) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "benchmark", "zaya bench comm");
    cJSON_AddNumberToObject(o, "nranks", rep->nranks);
    cJSON_AddStringToObject(o, "backend", bc_backend_name(cfg->backend));
    if (cfg->backend == BC_NCCL && cfg->gpu) cJSON_AddStringToObject(o, "device", gpu_comm_bench_describe(cfg->gpu));
    cJSON_AddStringToObject(o, "type", bc_type_name(cfg->type));
    cJSON_AddNumberToObject(o, "type_bytes", (double)bc_type_size(cfg->type));
    cJSON_AddNumberToObject(o, "min_bytes", (double)cfg->min_bytes);
    cJSON_AddNumberToObject(o, "max_bytes", (double)cfg->max_bytes);
    cJSON_AddNumberToObject(o, "step_factor", (double)cfg->factor);
    cJSON_AddNumberToObject(o, "iters", cfg->iters);
    cJSON_AddNumberToObject(o, "warmup_iters", cfg->warmup);
    cJSON_AddBoolToObject(o, "check", cfg->check != 0);
    cJSON_AddStringToObject(o, "time", cfg->backend == BC_NCCL
                                           ? "per call: GPU events around the loop / iters, max over ranks"
                                           : "per call: loop time / iters, max over ranks");
    cJSON *m = cJSON_AddObjectToObject(o, "memcpy_baseline");
    cJSON_AddNumberToObject(m, "bytes", (double)rep->memcpy_bytes);
    cJSON_AddNumberToObject(m, "gbps", rep->memcpy_gbps);
    cJSON_AddNumberToObject(o, "avg_busbw_gbps", rep->avg_busbw);
    if (rep->wrong_total >= 0)
        cJSON_AddNumberToObject(o, "wrong_total", (double)rep->wrong_total);
    else
        cJSON_AddNullToObject(o, "wrong_total");
    cJSON *per_op = cJSON_AddObjectToObject(o, "avg_busbw_gbps_by_op");
    for (int k = 0; k < BC_N_OPS; k++) {
        double sum = 0;
        int cnt = 0;
        for (int i = 0; i < rep->n_rows; i++)
            if (rep->rows[i].op == (BcOp)k) {
                sum += rep->rows[i].res[0].busbw + rep->rows[i].res[1].busbw;
                cnt += 2;
            }
        if (cnt) cJSON_AddNumberToObject(per_op, bc_op_name((BcOp)k), sum / cnt);
    }
    cJSON *rows = cJSON_AddArrayToObject(o, "rows");
    for (int i = 0; i < rep->n_rows; i++) {
        const BcRow *r = &rep->rows[i];
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "op", bc_op_name(r->op));
        cJSON_AddNumberToObject(j, "requested_bytes", (double)r->requested);
        cJSON_AddNumberToObject(j, "size_bytes", (double)r->bytes);
        cJSON_AddNumberToObject(j, "count", (double)r->count);
        cJSON_AddStringToObject(j, "type", bc_type_name(cfg->type));
        cJSON_AddStringToObject(j, "redop", is_reduction(r->op) ? "sum" : "none");
        cJSON_AddNumberToObject(j, "root", r->root);
        cJSON_AddNumberToObject(j, "bus_factor", bc_bus_factor(r->op, rep->nranks));
        cJSON_AddItemToObject(j, "out_of_place", result_json(&r->res[0]));
        cJSON_AddItemToObject(j, "in_place", result_json(&r->res[1]));
        cJSON_AddItemToArray(rows, j);
    }
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    if (!text) return zy_fail(err, "%s: out of memory", path);
    size_t len = strlen(text);
    text[len++] = '\n'; /* replaces the terminator; written by length */
    int rc = zy_write_file_atomic(path, text, len, err);
    free(text);
    return rc;
}

static void size_label(char *out, size_t cap, size_t s) {
    if (s >= (1u << 30) && s % (1u << 30) == 0)
        snprintf(out, cap, "%zuG", s >> 30);
    else if (s >= (1u << 20) && s % (1u << 20) == 0)
        snprintf(out, cap, "%zuM", s >> 20);
    else if (s >= (1u << 10) && s % (1u << 10) == 0)
        snprintf(out, cap, "%zuK", s >> 10);
    else
        snprintf(out, cap, "%zu", s);
}

int bc_plot(const char *png_path, const BcConfig *cfg, const BcReport *rep, ZyErr *err) {
    if (strchr(png_path, '\'') || strchr(png_path, '\n'))
        return zy_fail(err, "%s: a plot path may not contain quotes or newlines", png_path);
    char script[] = "/tmp/zaya-bench-plot-XXXXXX";
    int fd = mkstemp(script);
    if (fd < 0) return zy_fail(err, "cannot create a temporary gnuplot script");
    FILE *g = fdopen(fd, "w");
    if (!g) {
        close(fd);
        unlink(script);
        return zy_fail(err, "cannot write the gnuplot script");
    }
    static const char *const colors[BC_N_OPS] = {"#4477aa", "#cc3311", "#228833", "#ccbb44", "#aa3377"};
    fprintf(g, "set terminal pngcairo size 1100,600 noenhanced\nset output '%s'\n", png_path);
    fprintf(g, "set title 'zaya bench comm: %d rank%s, %s%s, bus bandwidth (nccl-tests convention)'\n", rep->nranks,
            rep->nranks == 1 ? "" : "s", cfg->backend == BC_NCCL ? "NCCL on GPUs, " : "", bc_type_name(cfg->type));
    fprintf(g, "set logscale x 2\nset xlabel 'size (bytes; K, M, G = 2^10, 2^20, 2^30)'\nset ylabel 'busbw (GB/s)'\n"
               "set yrange [0:*]\nset grid\nset key outside right top\n");
    /* x tics at the requested sizes (at most ~12 labels) */
    int sizes = n_sizes(cfg), every = (sizes + 11) / 12, t = 0;
    fprintf(g, "set xtics (");
    for (size_t s = cfg->min_bytes;; s *= cfg->factor, t++) {
        if (t % every == 0) {
            char label[32];
            size_label(label, sizeof label, s);
            fprintf(g, "%s'%s' %zu", t ? ", " : "", label, s);
        }
        if (s > cfg->max_bytes / cfg->factor) break;
    }
    fprintf(g, ")\n");
    size_t last = cfg->min_bytes;
    while (last <= cfg->max_bytes / cfg->factor) last *= cfg->factor;
    fprintf(g, "set xrange [%g:%g]\n", (double)cfg->min_bytes / 1.25, (double)last * 1.25);
    /* one data block per collective: size busbw_out busbw_in (zero-byte rows cannot sit on a log axis) */
    int blocks[BC_N_OPS], n_blocks = 0;
    fprintf(g, "$data << EOD\n");
    for (int k = 0; k < BC_N_OPS; k++) {
        int any = 0;
        for (int i = 0; i < rep->n_rows; i++) {
            const BcRow *r = &rep->rows[i];
            if (r->op != (BcOp)k || r->bytes == 0) continue;
            if (!any && n_blocks) fprintf(g, "\n\n");
            any = 1;
            fprintf(g, "%zu %.9g %.9g\n", r->bytes, r->res[0].busbw, r->res[1].busbw);
        }
        if (any) blocks[n_blocks++] = k;
    }
    fprintf(g, "EOD\n");
    fprintf(g, "plot ");
    for (int b = 0; b < n_blocks; b++) {
        const char *name = bc_op_name((BcOp)blocks[b]);
        fprintf(g, "$data index %d using 1:2 with linespoints lw 2 pt 7 ps 0.6 lc rgb '%s' title '%s out-of-place', ", b,
                colors[blocks[b]], name);
        fprintf(g, "$data index %d using 1:3 with linespoints lw 2 dt 2 pt 6 ps 0.6 lc rgb '%s' title '%s in-place', ", b,
                colors[blocks[b]], name);
    }
    fprintf(g, "%.9g with lines dt 3 lw 1 lc rgb 'gray40' title '%smemcpy, rank 0 (%.2f GB/s)'\n", rep->memcpy_gbps,
            cfg->backend == BC_NCCL ? "device " : "", rep->memcpy_gbps);
    if (fclose(g) != 0) {
        unlink(script);
        return zy_fail(err, "cannot write the gnuplot script");
    }
    const int rc = report_run_gnuplot(script, err);
    unlink(script);
    return rc;
}
