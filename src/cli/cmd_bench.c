/* zaya bench comm: collective benchmarks in the nccl-tests format (run under mpirun; run directly it is one rank). */
#include <errno.h>
#include <omp.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cmd_bench_comm.h"
#include "commands.h"
#include "dist/distributed.h"
#include "gpu/gpu.h"
#include "gpu/gpu_comm.h"
#include "kernels/cpu.h"
#include "kernels/matmul.h"
#include "train/runconfig.h"

static void bench_usage(FILE *f) {
    fprintf(f,
            "usage: mpirun -np N zaya bench comm [options]   (run directly: one rank)\n\n"
            "Times MPI (or NCCL) collectives over message sizes, nccl-tests conventions: algbw = size / time,\n"
            "busbw = algbw x 2(n-1)/n (all_reduce), (n-1)/n (reduce_scatter, all_gather, alltoall), 1 (broadcast).\n"
            "Each size out-of-place and in-place (MPI_IN_PLACE); time per call averaged over -n calls, max over ranks.\n\n"
            "  -o, --op NAME            all_reduce, reduce_scatter, all_gather, broadcast, alltoall or all (default all)\n"
            "  -b, --minbytes SIZE      smallest size in bytes, K/M/G suffixes (default 8)\n"
            "  -e, --maxbytes SIZE      largest size (default 64M)\n"
            "  -f, --stepfactor F       size multiplier, >= 2 (default 2)\n"
            "  -n, --iters N            timed calls per size (default 20)\n"
            "  -w, --warmup_iters N     untimed calls first (default 5)\n"
            "  -d, --datatype T         float or bf16 (2-byte; sums round to nearest even bf16 per step) (default float)\n"
            "  -c, --check 0|1          fill with exact values and count wrong result elements (default 1)\n"
            "  -r, --root R             broadcast root (default 0)\n"
            "      --backend mpi|nccl   mpi: host buffers over MPI (default); nccl: device buffers over NCCL, one GPU\n"
            "                           per rank, time from GPU events (needs a build with GPU support and NCCL)\n"
            "      --json FILE          write every row as JSON\n"
            "      --plot FILE.png      busbw vs size per collective (gnuplot)\n"
            "  -h, --help\n\n"
            "Size is the largest buffer of one rank: all_gather's whole output, reduce_scatter's whole input,\n"
            "alltoall's whole send buffer, rounded down to whole elements (and n blocks); count is the MPI count.\n");
}

typedef struct {
    char shortf;
    const char *longf;
} Flag;

static const Flag flags[] = {{'o', "--op"},         {'b', "--minbytes"},     {'e', "--maxbytes"}, {'f', "--stepfactor"},
                             {'n', "--iters"},      {'w', "--warmup_iters"}, {'d', "--datatype"}, {'c', "--check"},
                             {'r', "--root"},       {0, "--json"},           {0, "--plot"},       {0, "--backend"}};

/* An integer in [lo, hi]; the message says what the flag needs. */
static int parse_int(const char *flag, const char *v, long lo, long hi, long *out, ZyErr *err) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end) return zy_fail(err, "%s expects an integer, got \"%s\"", flag, v);
    if (x < lo || x > hi) {
        if (hi == 1) return zy_fail(err, "%s expects 0 or 1, got \"%s\"", flag, v);
        if (lo == 1) return zy_fail(err, "%s must be positive, got \"%s\"", flag, v);
        if (lo == 0) return zy_fail(err, "%s must not be negative, got \"%s\"", flag, v);
        return zy_fail(err, "%s must be at least %ld, got \"%s\"", flag, lo, v);
    }
    *out = x;
    return 0;
}

typedef struct {
    BcConfig cfg;
    const char *json, *plot;
    int help;
} BenchArgs;

static int parse_args(int argc, char **argv, BenchArgs *a, ZyErr *err) {
    memset(a, 0, sizeof *a);
    a->cfg.ops = (1u << BC_N_OPS) - 1;
    a->cfg.type = BC_FLOAT;
    a->cfg.min_bytes = 8;
    a->cfg.max_bytes = 64u << 20;
    a->cfg.factor = 2;
    a->cfg.iters = 20;
    a->cfg.warmup = 5;
    a->cfg.check = 1;
    a->cfg.root = 0;
    for (int i = 3; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
            a->help = 1;
            return 0;
        }
        const Flag *f = NULL;
        const char *v = NULL;
        const char *eq = strncmp(arg, "--", 2) == 0 ? strchr(arg, '=') : NULL;
        size_t name_len = eq ? (size_t)(eq - arg) : strlen(arg);
        for (size_t k = 0; k < sizeof flags / sizeof flags[0]; k++) {
            if ((arg[0] == '-' && arg[1] == flags[k].shortf && flags[k].shortf && arg[2] == '\0') ||
                (strlen(flags[k].longf) == name_len && strncmp(arg, flags[k].longf, name_len) == 0))
                f = &flags[k];
        }
        if (!f) return zy_fail(err, "bench comm: unknown option \"%s\" (see 'zaya bench comm --help')", arg);
        if (eq)
            v = eq + 1;
        else if (i + 1 < argc)
            v = argv[++i];
        else
            return zy_fail(err, "bench comm: option %s needs a value", arg);
        long x = 0;
        int rc = 0;
        switch (f->shortf) {
        case 'o': rc = bc_parse_ops(v, &a->cfg.ops, err); break;
        case 'b': rc = bc_parse_size(v, &a->cfg.min_bytes, err); break;
        case 'e': rc = bc_parse_size(v, &a->cfg.max_bytes, err); break;
        case 'd': rc = bc_parse_type(v, &a->cfg.type, err); break;
        case 'f':
            rc = parse_int("-f", v, 2, LONG_MAX, &x, err);
            a->cfg.factor = (uint64_t)x;
            break;
        case 'n':
            rc = parse_int("-n", v, 1, INT_MAX, &x, err);
            a->cfg.iters = (int)x;
            break;
        case 'w':
            rc = parse_int("-w", v, 0, INT_MAX, &x, err);
            a->cfg.warmup = (int)x;
            break;
        case 'c':
            rc = parse_int("-c", v, 0, 1, &x, err);
            a->cfg.check = (int)x;
            break;
        case 'r':
            rc = parse_int("-r", v, 0, INT_MAX, &x, err);
            a->cfg.root = (int)x;
            break;
        default:
            if (strcmp(f->longf, "--json") == 0) a->json = v;
            else if (strcmp(f->longf, "--backend") == 0) rc = bc_parse_backend(v, &a->cfg.backend, err);
            else a->plot = v;
            break;
        }
        if (rc) return zy_wrap(err, "bench comm");
    }
    if (a->cfg.min_bytes > a->cfg.max_bytes)
        return zy_fail(err, "bench comm: -b %zu is larger than -e %zu", a->cfg.min_bytes, a->cfg.max_bytes);
    return 0;
}

/* The launcher's rank before MPI is up, so that a bad command line is reported once, not by every rank. */
static int launcher_rank(void) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v) return atoi(v);
    }
    return 0;
}

static int bench_comm(int argc, char **argv) {
    BenchArgs a;
    ZyErr err = {{0}};
    int bad = parse_args(argc, argv, &a, &err);
    if (!bad && a.help) {
        if (launcher_rank() == 0) bench_usage(stdout);
        return 0;
    }
    /* MPI starts before a bad command line is reported: a rank that exited at once would make mpirun kill the
     * others, rank 0 perhaps before it printed the message. The command line and the rank count are the same
     * on every rank, so every rank fails the same way, before any collective; rank 0 says why, all exit 1. */
    Dist d;
    if (dist_init(&d, &err)) {
        fprintf(stderr, "zaya: %s\n", err.msg);
        return 1;
    }
    if (!bad && bc_validate(&a.cfg, d.size, &err)) {
        bad = 1;
        zy_wrap(&err, "bench comm");
    }
    if (bad) {
        if (d.rank == 0) {
            fprintf(stderr, "zaya: %s\n", err.msg);
            fflush(stderr);
        }
        ZyErr ignored;
        dist_barrier(&d, &ignored); /* no rank leaves before rank 0 has printed */
        dist_finalize(&d);
        return 1;
    }
    GpuCommBench *gb = NULL;
    if (a.cfg.backend == BC_NCCL) { /* this rank's GPU, the NCCL communicator, device buffers of -e bytes */
        int r = gpu_comm_bench_open(&gb, &d, a.cfg.max_bytes, &err);
        if (r == -3) { /* NCCL's set-up failed here: the others may wait in its bootstrap */
            fprintf(stderr, "zaya: bench comm (rank %d): %s\n", d.rank, err.msg);
            dist_abort(&d, 1);
            dist_finalize(&d);
            return 1;
        }
        if (r) { /* every rank agreed to stop: the ranks that know why say it, nobody is left waiting */
            if (r == -1) {
                if (d.size > 1) fprintf(stderr, "zaya: rank %d: %s\n", d.rank, err.msg);
                else fprintf(stderr, "zaya: %s\n", err.msg);
                fflush(stderr);
            }
            ZyErr ignored;
            dist_barrier(&d, &ignored);
            dist_finalize(&d);
            return 1;
        }
        a.cfg.gpu = gb;
    }
    BcReport rep;
    if (bc_run(&d, &a.cfg, d.rank == 0 ? stdout : NULL, &rep, &err)) {
        fprintf(stderr, "zaya: bench comm (rank %d): %s\n", d.rank, err.msg);
        dist_abort(&d, 1); /* the other ranks may be waiting in a collective */
        gpu_comm_bench_close(gb);
        dist_finalize(&d);
        return 1;
    }
    int status = 0;
    if (d.rank == 0) {
        if (a.json && bc_write_json(a.json, &a.cfg, &rep, &err)) {
            fprintf(stderr, "zaya: bench comm: %s\n", err.msg);
            status = 1;
        }
        if (a.plot && bc_plot(a.plot, &a.cfg, &rep, &err)) {
            fprintf(stderr, "zaya: bench comm: %s\n", err.msg);
            status = 1;
        }
        if (rep.wrong_total > 0) {
            fprintf(stderr, "zaya: bench comm: %lld wrong result elements\n", (long long)rep.wrong_total);
            status = 1;
        }
    }
    bc_report_free(&rep);
    gpu_comm_bench_close(gb); /* NCCL before MPI goes */
    dist_finalize(&d);
    return status;
}

/* zaya bench gemm --weights OUTxIN: a layer's weight applied to the row counts of decoding and serving (a step's
 * rows, an expert's share of them), zaya's kernels (zy_matmul_wt) against the simple paths side by side: sgemm for
 * fp32 weights, widened panels + sgemm for bf16 ones. The weights rotate over copies larger than the caches, as in a
 * decoding step where each matrix is read once; medians of the calls. */
static double median_call_seconds(int variant, int rows, int out, int in, const float *X, const float *W,
                                  const uint16_t *W16, int copies, float *Y) {
    enum { REPS = 41 };
    double t[REPS];
    for (int i = -4; i < REPS; i++) { /* 4 warm-up calls: threads, pages */
        const size_t c = (size_t)((i + REPS) % copies) * out * in;
        const double t0 = zy_now_seconds();
        switch (variant) {
        case 0: zy_gemm_reference(0, 1, rows, out, in, 1, X, in, W + c, in, 0, Y, out); break;
        case 1: zy_matmul_wt(rows, out, in, X, in, (ZyWeights){.f32 = W + c}, Y, out); break;
        case 2: zy_matmul_bf16_panels(rows, out, in, X, in, W16 + c, Y, out); break;
        default: zy_matmul_wt(rows, out, in, X, in, (ZyWeights){.bf16 = W16 + c}, Y, out); break;
        }
        if (i >= 0) t[i] = zy_now_seconds() - t0;
    }
    return zy_median(t, REPS);
}

static int bench_gemm_weights(int out, int in) {
    const int row_counts[] = {1, 2, 4, 8, 16, 32, 64, 256};
    const int max_rows = 256, copies = (int)(1 + (96u << 20) / ((size_t)out * in * sizeof(float)));
    float *W = malloc(sizeof *W * (size_t)copies * out * in), *X = malloc(sizeof *X * (size_t)max_rows * in);
    uint16_t *W16 = malloc(sizeof *W16 * (size_t)copies * out * in);
    float *Y = malloc(sizeof *Y * (size_t)max_rows * out);
    if (!W || !X || !W16 || !Y) {
        fprintf(stderr, "zaya: bench gemm: out of memory for %d copies of a %dx%d weight\n", copies, out, in);
        free(W), free(X), free(W16), free(Y);
        return 1;
    }
    ZyRng rng;
    zy_rng_seed(&rng, 1);
    for (size_t i = 0; i < (size_t)copies * out * in; i++) {
        W[i] = (float)zy_rng_normal(&rng) * 0.02f;
        W16[i] = zy_f32_to_bf16(W[i]);
    }
    for (size_t i = 0; i < (size_t)max_rows * in; i++) X[i] = (float)zy_rng_normal(&rng);
    printf("weight %dx%d (out x in), rotating over %d copies (%.0f MB fp32); GFLOP/s of medians of 41 calls, "
           "%d threads, kernel level %s\n",
           out, in, copies, (double)copies * out * in * 4 / 1e6, omp_get_max_threads(), zy_cpu_level_name(zy_cpu_level()));
    printf("%6s  %14s %14s %7s  %14s %14s %7s\n", "rows", "fp32 sgemm", "fp32 zaya", "ratio", "bf16 panels",
           "bf16 zaya", "ratio");
    for (size_t k = 0; k < ZY_ARRAY_LEN(row_counts); k++) {
        const int rows = row_counts[k];
        const double flops = 2.0 * rows * out * in;
        double g[4];
        for (int v = 0; v < 4; v++) g[v] = flops / median_call_seconds(v, rows, out, in, X, W, W16, copies, Y) / 1e9;
        printf("%6d  %14.1f %14.1f %6.2fx  %14.1f %14.1f %6.2fx\n", rows, g[0], g[1], g[1] / g[0], g[2], g[3],
               g[3] / g[2]);
    }
    free(W), free(X), free(W16), free(Y);
    return 0;
}

/* zaya bench gemm: the dense product peak that MFU figures are measured against (fp32 and bf16). */
static int bench_gemm(int argc, char **argv) {
    const char *device = "cpu";
    int n = 0, w_out = 0, w_in = 0;
    for (int i = 3; i < argc; i++) {
        if (strcmp(argv[i], "--weights") == 0 && i + 1 < argc) {
            char tail;
            if (sscanf(argv[++i], "%dx%d%c", &w_out, &w_in, &tail) != 2 || w_out < 1 || w_in < 1 ||
                w_out > 65536 || w_in > 65536) {
                fprintf(stderr, "zaya: bench gemm: --weights expects OUTxIN (each 1..65536), got \"%s\"\n", argv[i]);
                return 1;
            }
        } else if (strcmp(argv[i], "--device") == 0 && i + 1 < argc) {
            device = argv[++i];
        } else if (strcmp(argv[i], "--n") == 0 && i + 1 < argc) {
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end || v < 16 || v > 65536) {
                fprintf(stderr, "zaya: bench gemm: --n expects a size in [16, 65536], got \"%s\"\n", argv[i]);
                return 1;
            }
            n = (int)v;
        } else if (strcmp(argv[i], "--help") == 0) {
            printf("usage: zaya bench gemm [--device cpu|cuda|cuda:N] [--n SIZE] [--weights OUTxIN]\n"
                   "  n x n x n products, fp32 and bf16 operands (fp32 sums): the measured peak that MFU is quoted\n"
                   "  against (default n: 1024 on a CPU, 8192 on a GPU); on a GPU also a MoE layer's expert products,\n"
                   "  grouped on the device (each form) against one cuBLASLt product per expert, at bench-gpu's and\n"
                   "  ZAYA1-8B's widths\n"
                   "  --weights OUTxIN: instead, a layer weight [OUT, IN] applied to 1..256 rows (decoding, serving):\n"
                   "  zaya's kernels against sgemm (fp32 weights) and widened panels + sgemm (bf16), side by side (CPU)\n");
            return 0;
        } else {
            fprintf(stderr, "zaya: bench gemm: unknown or incomplete option \"%s\"\n", argv[i]);
            return 1;
        }
    }
    int gpu, index;
    ZyErr err;
    if (runconfig_parse_device(device, &gpu, &index, &err)) {
        fprintf(stderr, "zaya: bench gemm: --device: %s\n", err.msg);
        return 1;
    }
    if (w_out) {
        if (gpu) {
            fprintf(stderr, "zaya: bench gemm: --weights measures the CPU kernels (leave out --device)\n");
            return 1;
        }
        return bench_gemm_weights(w_out, w_in);
    }
    if (!gpu) {
        if (!n) n = 1024;
        /* bf16: oneDNN where it runs natively, else the rounded inputs through sgemm (what a bf16 run would cost
         * if it kept bf16 products) */
        const ZyBf16Products p = zy_bf16_products_available(ZY_BF16_PRODUCTS_ONEDNN, NULL, 0) ? ZY_BF16_PRODUCTS_ONEDNN
                                                                                          : ZY_BF16_PRODUCTS_SGEMM;
        double f32 = zy_sgemm_probe_gflops(n, 1.0), b16 = zy_gemm_bf16_probe_gflops(p, n, 1.0);
        printf("cpu  %dx%dx%d  fp32 %.1f GFLOP/s  bf16 (%s) %.1f GFLOP/s\n", n, n, n, f32, zy_bf16_products_name(p), b16);
        return 0;
    }
    GpuCtx g;
    if (gpu_open(&g, index, &err)) {
        fprintf(stderr, "zaya: bench gemm: %s\n", err.msg);
        return 1;
    }
    if (!n) n = 8192;
    g.bf16 = 0;
    double f32 = gpu_gemm_probe_tflops(&g, n, 10);
    g.bf16 = 1;
    double b16 = gpu_gemm_probe_tflops(&g, n, 20);
    double dense = gpu_dense_bf16_peak_tflops(&g);
    printf("gpu  %s  %dx%dx%d  fp32 %.1f TFLOP/s (no TF32)  bf16 %.1f TFLOP/s (cuBLASLt)", g.name, n, n, n, f32, b16);
    if (dense > 0) printf("  = %.1f%% of the %.0f TFLOP/s datasheet peak", 100 * b16 / dense, dense);
    printf("\n");
    /* a MoE layer's experts at bench-gpu's shapes (16 of 1024 x 1024 over the 16/17 of 4 x 2048 rows a skip expert
     * leaves) and at ZAYA1-8B's (16 of 2048 x 2048 over 16/17 of a 4 x 2048 micro-batch) */
    static const struct { const char *name; int E, rows, D, I; } shapes[] = {
        {"bench-gpu", 16, 7710, 1024, 1024},
        {"ZAYA1-8B", 16, 7710, 2048, 2048},
    };
    int rc = 0;
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0] && rc == 0; k++) {
        double tf[GPU_EXPERT_PROBE_FORMS];
        rc = gpu_expert_gemm_probe(&g, shapes[k].E, shapes[k].rows, shapes[k].D, shapes[k].I, 10, tf, &err);
        if (rc) {
            fprintf(stderr, "zaya: bench gemm: the experts' products (%s): %s\n", shapes[k].name, err.msg);
            break;
        }
        printf("gpu  experts  %s MoE layer's 6 products, %d experts of %d x %d over %d rows (bf16), TFLOP/s: ",
               shapes[k].name, shapes[k].E, shapes[k].D, shapes[k].I, shapes[k].rows);
        if (tf[GPU_EXPERT_PROBE_SM90] > 0)
            printf("grouped wgmma+TMA (sm90) %.1f = %.1f%% of the dense bf16 product, ", tf[GPU_EXPERT_PROBE_SM90],
                   b16 > 0 ? 100 * tf[GPU_EXPERT_PROBE_SM90] / b16 : 0.0);
        else
            printf("grouped wgmma+TMA (sm90) not here, ");
        printf("grouped WMMA async %.1f, staged %.1f (6 launches each), per-expert cuBLASLt %.1f (%d products)\n",
               tf[GPU_EXPERT_PROBE_ASYNC], tf[GPU_EXPERT_PROBE_STAGED], tf[GPU_EXPERT_PROBE_LOOP], 6 * shapes[k].E);
    }
    gpu_close(&g);
    return f32 > 0 && b16 > 0 && rc == 0 ? 0 : 1;
}

int cmd_bench(int argc, char **argv) {
    if (argc < 3 || strcmp(argv[2], "--help") == 0 || strcmp(argv[2], "-h") == 0) {
        FILE *f = argc < 3 ? stderr : stdout;
        fprintf(f, "usage: zaya bench comm|train|decode|attention|gemm|quant|ckpt [options]   (zaya bench <name> --help)\n\n"
                   "  comm     MPI or NCCL collective benchmarks (all_reduce, reduce_scatter, all_gather, broadcast, alltoall)\n"
                   "  train    full training steps: tokens/s, GFLOP/s, MFU, peak memory, time per phase\n"
                   "  decode   prefill and per-token cached decoding: latency, tokens/s, KV cache size\n"
                   "  attention  reference vs fused flash attention kernels, forward and backward, side by side\n"
                   "  gemm     the dense matrix-product peak (fp32, bf16) on the CPU or a GPU (--device cuda)\n"
                   "  quant    the quantized-weight kernels (8 and 4 bits) against the bf16 one, at decoding's row counts\n"
                   "  ckpt     checkpoints: the snapshot stall, the background write, the restore, against memcpy and the disk\n");
        return argc < 3 ? 1 : 0;
    }
    if (strcmp(argv[2], "comm") == 0) return bench_comm(argc, argv);
    if (strcmp(argv[2], "train") == 0) return bench_train(argc, argv);
    if (strcmp(argv[2], "decode") == 0) return bench_decode(argc, argv);
    if (strcmp(argv[2], "attention") == 0) return bench_attention(argc, argv);
    if (strcmp(argv[2], "gemm") == 0) return bench_gemm(argc, argv);
    if (strcmp(argv[2], "quant") == 0) return bench_quant(argc, argv);
    if (strcmp(argv[2], "ckpt") == 0) return bench_ckpt(argc, argv);
    fprintf(stderr, "zaya: bench: unknown benchmark \"%s\" (comm, train, decode, attention, gemm, quant, ckpt)\n", argv[2]);
    return 1;
}
