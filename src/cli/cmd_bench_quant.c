/* zaya bench quant: the quantized-weight kernels (kernels/quant.h) against the bf16 few-row kernel on the same
 * matrix, at decoding's row counts: every kernel this CPU runs, both ways, 8 and 4 bits. The weights rotate over
 * copies larger than the caches, as in a decoding step where each matrix is read once; medians of the calls, and the
 * bytes each reads per second (codes, scales and biases; bf16 values). */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "kernels/cpu.h"
#include "kernels/matmul.h"
#include "kernels/quant.h"
#include "kernels/quant_many.h"

enum { REPS = 41, MAX_ROWS = 8, MAX_LINES = 1 + 2 * 2 * ZY_QK_COUNT };

typedef struct {
    int out, in, copies;
    const float *X;
    const uint16_t *W16;
    const ZyQuantMatrix *Q; /* [copies] */
    float *Y;
} Bench;

/* One call of line k's kernel (kernel < 0: the bf16 one) on copy c. */
static double call_seconds(const Bench *b, int kernel, int way, int bits, int rows, int c) {
    const double t0 = zy_now_seconds();
    if (kernel < 0)
        zy_matmul_bf16(-1, rows, b->out, b->in, b->X, b->in, b->W16 + (size_t)c * b->out * b->in, b->Y, b->out);
    else
        zy_matmul_quant(kernel, way, rows, b->X, b->in, &b->Q[(bits == 8 ? 0 : b->copies) + c], b->Y, b->out);
    return zy_now_seconds() - t0;
}

/* Line l of the many-row table on copy c: 0 bf16 weights; then per bits (8, 4) the few-row kernel and each path. */
static double many_call(const Bench *b, int l, int per_bits, int rows, int c) {
    const int k = (l - 1) % per_bits;
    const ZyQuantMatrix *q = &b->Q[(l > per_bits ? b->copies : 0) + c];
    const double t0 = zy_now_seconds();
    if (l == 0)
        zy_matmul_wt(rows, b->out, b->in, b->X, b->in, (ZyWeights){.bf16 = b->W16 + (size_t)c * b->out * b->in}, b->Y,
                     b->out);
    else if (k == 0)
        zy_matmul_quant(-1, -1, rows, b->X, b->in, q, b->Y, b->out);
    else
        zy_matmul_quant_many((ZyQuantMany)(k - 1), rows, b->out, b->in, b->X, b->in, q, b->Y, b->out);
    return zy_now_seconds() - t0;
}

/* Many rows (prefill, eval, forward): the few-row kernel of this CPU (the process's way), and each many-row path
 * (quant_many.h: fp32 panels for sgemm, bf16 panels for oneDNN's bf16 matmul, oneDNN's int8 matmul per group),
 * against bf16's own many-row path (zy_matmul_wt): where the kernels stop being the faster is ZY_QUANT_MAX_ROWS, and
 * which many-row path auto should pick on this CPU. Interleaved rounds as above; median and fastest call, ms; and
 * each path's normwise distance from the fp32 panels' product (what its roundings add). */
static void many_rows(const Bench *b, int max_rows) {
    enum { MANY_REPS = 7, PER_BITS = 1 + ZY_QMANY_COUNT, LINES = 1 + 2 * PER_BITS };
    char names[LINES][40], why[160];
    int runs[LINES];
    for (int l = 0; l < LINES; l++) {
        const int bits = l <= PER_BITS ? 8 : 4, k = (l - 1) % PER_BITS; /* k 0: the kernel; 1..: path k - 1 */
        runs[l] = l == 0 || k == 0 || zy_quant_many_available((ZyQuantMany)(k - 1), why, sizeof why);
        if (l == 0) snprintf(names[l], sizeof names[l], "bf16 (zy_matmul_wt)");
        else if (k == 0) snprintf(names[l], sizeof names[l], "q%d kernel", bits);
        else if (k - 1 == ZY_QMANY_BF16)
            snprintf(names[l], sizeof names[l], "q%d bf16 %s", bits, zy_quant_many_bf16_native() ? "oneDNN" : "emulated");
        else snprintf(names[l], sizeof names[l], "q%d %s", bits, zy_quant_many_name((ZyQuantMany)(k - 1)));
    }
    char picked[256];
    zy_quant_many_describe(zy_quant_many(), picked, sizeof picked);
    printf("\nmany rows: median and fastest of %d calls, ms (kernel: %s, %s); this process's many-row path: %s\n",
           MANY_REPS, zy_quant_kernel_name(zy_quant_kernel_for_level()),
           zy_quant_way() == ZY_QUANT_INT8 ? "int8" : "widen", picked);
    if (!zy_quant_many_available(ZY_QMANY_INT8, why, sizeof why)) printf("(no int8 lines: %s)\n", why);
    printf("%-6s", "rows");
    for (int l = 0; l < LINES; l++)
        if (runs[l]) printf(" | %19s", names[l]);
    printf("\n");
    float *ref = malloc(sizeof(float) * (size_t)max_rows * b->out);
    int last = 4;
    for (int rows = 4; rows <= max_rows; rows *= 2) {
        double t[LINES][MANY_REPS];
        for (int i = 0; i < MANY_REPS; i++)
            for (int l = 0; l < LINES; l++)
                if (runs[l]) t[l][i] = many_call(b, l, PER_BITS, rows, i % b->copies);
        printf("%-6d", rows);
        for (int l = 0; l < LINES; l++) {
            if (!runs[l]) continue;
            const double med = zy_median(t[l], MANY_REPS); /* sorts: t[l][0] is then the fastest */
            printf(" | %9.1f %9.1f", med * 1e3, t[l][0] * 1e3);
        }
        printf("\n");
        last = rows;
    }
    /* at the most rows, each product against the fp32 panels' on the same copy */
    printf("%-6s", "error");
    for (int l = 0; l < LINES && ref; l++) {
        if (!runs[l]) continue;
        if (l == 0 || (l - 1) % PER_BITS == 1) { /* bf16 weights are not the quantized ones; the panels themselves */
            printf(" | %19s", "-");
            continue;
        }
        many_call(b, l - (l - 1) % PER_BITS + 1, PER_BITS, last, 0);
        memcpy(ref, b->Y, sizeof(float) * (size_t)last * b->out);
        many_call(b, l, PER_BITS, last, 0);
        double num = 0, den = 0;
        for (long j = 0; j < (long)last * b->out; j++)
            num += ((double)b->Y[j] - ref[j]) * ((double)b->Y[j] - ref[j]), den += (double)ref[j] * ref[j];
        printf(" | %19.2g", sqrt(num / (den + 1e-300)));
    }
    printf("\n(error: normwise distance from the fp32 panels' product at %d rows)\n", last);
    free(ref);
}

int bench_quant(int argc, char **argv) {
    int out = 4096, in = 2048, G = 64, many = 0;
    for (int i = 3; i < argc; i++) {
        char tail;
        if (strcmp(argv[i], "--weights") == 0 && i + 1 < argc) {
            if (sscanf(argv[++i], "%dx%d%c", &out, &in, &tail) != 2 || out < 1 || in < 32 || out > 1 << 20 || in > 1 << 16) {
                fprintf(stderr, "zaya: bench quant: --weights expects OUTxIN (IN a multiple of 128), got \"%s\"\n", argv[i]);
                return 1;
            }
        } else if (strcmp(argv[i], "--group-size") == 0 && i + 1 < argc) {
            G = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--many") == 0 && i + 1 < argc) {
            many = atoi(argv[++i]);
            if (many < 4 || many > 4096) {
                fprintf(stderr, "zaya: bench quant: --many %s: the most rows timed, 4..4096\n", argv[i]);
                return 1;
            }
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            printf("usage: zaya bench quant [--weights OUTxIN] [--group-size 32|64|128] [--many ROWS]\n"
                   "  a layer's weight [OUT, IN] (default 4096x2048: a ZAYA1-8B expert's gate_up) applied to 1..8 rows:\n"
                   "  the bf16 kernel and every quantized kernel this CPU runs (both ways, 8 and 4 bits), side by side;\n"
                   "  --many: then 4, 8, ... ROWS rows, the few-row kernel against each many-row path (fp32 panels + sgemm,\n"
                   "  bf16 panels + oneDNN's bf16 matmul, oneDNN's int8 matmul per group)\n");
            return 0;
        } else {
            fprintf(stderr, "zaya: bench quant: unknown or incomplete option \"%s\"\n", argv[i]);
            return 1;
        }
    }
    ZyErr err;
    if (zy_quant_format_check(8, G, &err) || in % 128 != 0) {
        fprintf(stderr, "zaya: bench quant: %s\n", in % 128 ? "IN must be a multiple of 128" : err.msg);
        return 1;
    }
    /* enough copies that the smallest (4-bit) set is well past the last-level cache */
    const size_t n = (size_t)out * in, q4_bytes = n / 2 + (size_t)out * (in / G) * 4;
    const int copies = (int)(1 + (96u << 20) / q4_bytes);
    const int x_rows = many > MAX_ROWS ? many : MAX_ROWS;
    float *w = malloc(sizeof(float) * in), *X = malloc(sizeof(float) * x_rows * in), *Y = malloc(sizeof(float) * x_rows * out);
    uint16_t *W16 = malloc(sizeof(uint16_t) * n * copies);
    ZyQuantMatrix *Q = calloc((size_t)2 * copies, sizeof *Q);
    uint32_t *codes = malloc(n * copies * 3 / 2); /* 8-bit then 4-bit codes */
    uint16_t *sb = malloc(sizeof(uint16_t) * (size_t)out * (in / G) * 4 * copies);
    float *fs = malloc(sizeof(float) * in / 16);
    if (!w || !X || !Y || !W16 || !Q || !codes || !sb || !fs) {
        fprintf(stderr, "zaya: bench quant: out of memory for %d copies of a %dx%d weight\n", copies, out, in);
        free(w), free(X), free(Y), free(W16), free(Q), free(codes), free(sb), free(fs);
        return 1;
    }
    ZyRng rng;
    zy_rng_seed(&rng, 1);
    for (size_t i = 0; i < (size_t)x_rows * in; i++) X[i] = (float)zy_rng_normal(&rng);
    const int groups = in / G;
    for (int c = 0; c < copies; c++)
        for (int bi = 0; bi < 2; bi++) {
            const int bits = bi ? 4 : 8;
            uint32_t *q = codes + (bi ? n * copies / 4 + n * c / 8 : n * c / 4);
            uint16_t *s = sb + ((size_t)(bi * copies + c) * out * groups * 2), *bias = s + (size_t)out * groups;
            Q[bi * copies + c] = (ZyQuantMatrix){.bits = bits, .group_size = G, .rows = out, .cols = in, .q = q,
                                                 .scales = s, .biases = bias, .scale_dtype = ZY_DT_BF16};
            for (int o = 0; o < out; o++) {
                for (int k = 0; k < in; k++) {
                    w[k] = zy_round_bf16((float)zy_rng_normal(&rng) * 0.02f); /* a bf16 release's values */
                    if (bi == 0) W16[(size_t)c * n + (size_t)o * in + k] = zy_f32_to_bf16(w[k]);
                }
                zy_quant_row(w, in, bits, G, q + (size_t)o * zy_quant_row_words(in, bits), fs, fs + groups);
                for (int g = 0; g < groups; g++) {
                    s[(size_t)o * groups + g] = zy_f32_to_bf16(fs[g]);
                    bias[(size_t)o * groups + g] = zy_f32_to_bf16(fs[groups + g]);
                }
            }
        }
    const Bench b = {.out = out, .in = in, .copies = copies, .X = X, .W16 = W16, .Q = Q, .Y = Y};
    ZyCpuInfo ci;
    zy_cpu_detect(&ci);
    printf("weight %dx%d (out x in), groups of %d, bf16 scales; rotating over %d copies; medians of %d calls, %d "
           "threads\ncpu %s (family %d model %d), kernel level %s\n", out, in, G, copies, REPS, omp_get_max_threads(),
           ci.brand, ci.family, ci.model, zy_cpu_level_name(zy_cpu_level()));
    /* the lines: bf16, then each kernel here (not the plain one), both ways, 8 then 4 bits */
    int n_lines = 0, kern[MAX_LINES], ways[MAX_LINES], bitss[MAX_LINES];
    for (int line = -1; line < 2 * ZY_QK_COUNT * 2; line++) {
        const int bits = line < 0 ? 16 : line / (2 * ZY_QK_COUNT) ? 4 : 8, kernel = line < 0 ? -1 : line / 2 % ZY_QK_COUNT;
        if (kernel == ZY_QK_PLAIN || (kernel >= 0 && !zy_quant_kernel_available((ZyQuantKernel)kernel))) continue;
        kern[n_lines] = kernel, ways[n_lines] = line < 0 ? 0 : line % 2, bitss[n_lines++] = bits;
    }
    const int row_counts[] = {1, 2, 4, 8};
    enum { NR = 4 };
    static double med[NR][MAX_LINES], best[NR][MAX_LINES];
    for (int r = 0; r < NR; r++) {
        /* interleaved: each round times every line once, so a neighbour's load on a shared machine falls on all */
        static double t[MAX_LINES][REPS];
        for (int i = -4; i < REPS; i++)
            for (int l = 0; l < n_lines; l++) { /* each line its own copy: one read just before by another line of the
                                                   same bits would still be in the last-level cache */
                const double s = call_seconds(&b, kern[l], ways[l], bitss[l], row_counts[r],
                                              (int)(((long)(i + REPS) * n_lines + l) % copies));
                if (i >= 0) t[l][i] = s;
            }
        for (int l = 0; l < n_lines; l++) med[r][l] = zy_median(t[l], REPS), best[r][l] = t[l][0]; /* sorted */
    }
    printf("%-22s", "");
    for (int r = 0; r < NR; r++) printf(" | %5d row%s %18s", row_counts[r], row_counts[r] > 1 ? "s" : " ", "");
    printf("\n%-22s", "kernel");
    for (int r = 0; r < NR; r++) printf(" | %7s %6s %5s %6s", "us", "GB/s", "x", "best");
    printf("\n");
    for (int l = 0; l < n_lines; l++) {
        char label[64];
        if (kern[l] < 0) snprintf(label, sizeof label, "bf16 (%s)", zy_cpu_level_name(zy_cpu_level()));
        else snprintf(label, sizeof label, "q%d %s %s", bitss[l], zy_quant_kernel_name((ZyQuantKernel)kern[l]), ways[l] ? "int8" : "widen");
        const double bytes = kern[l] < 0 ? 2.0 * n : (double)n * bitss[l] / 8 + (double)out * groups * 4;
        printf("%-22s", label);
        for (int r = 0; r < NR; r++)
            printf(" | %7.1f %6.1f %4.2fx %6.1f", med[r][l] * 1e6, bytes / med[r][l] / 1e9, med[r][0] / med[r][l],
                   bytes / best[r][l] / 1e9);
        printf("\n");
    }
    printf("(us, GB/s, x: the median call, x its speed against bf16's median; best: GB/s of the fastest call)\n");
    if (many) many_rows(&b, many);
    free(w), free(X), free(Y), free(W16), free(Q), free(codes), free(sb), free(fs);
    return 0;
}
