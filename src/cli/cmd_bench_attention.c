/* zaya bench attention: the reference causal GQA attention (kernels.inc: full T x T GEMMs, saved probabilities)
 * against the fused flash kernels (attention.c) on the same random inputs, forward and backward timed side by
 * side in each repetition (medians), with the memory each keeps between forward and backward. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "kernels/attention.h"
#include "commands.h"
#include "kernels/kernels.h"
#include "util/util.h"

int bench_attention(int argc, char **argv) {
    int B = 8, T = 256, Hq = 8, Hkv = 2, dh = 64, reps = 10, threads = 0;
    ArgSpec specs[] = {
        {"--batch", ARG_INT, 0, &B, "sequences (default 8)", 0},
        {"--seq", ARG_INT, 0, &T, "sequence length (default 256)", 0},
        {"--heads", ARG_INT, 0, &Hq, "query heads (default 8)", 0},
        {"--kv-heads", ARG_INT, 0, &Hkv, "key/value heads, dividing --heads (default 2)", 0},
        {"--head-dim", ARG_INT, 0, &dh, "head size (default 64)", 0},
        {"--reps", ARG_INT, 0, &reps, "timed repetitions after one warm-up (default 10)", 0},
        {"--threads", ARG_INT, 0, &threads, "OpenMP/BLAS threads (default: all)", 0},
    };
    if (args_help(argc, argv, 3, "bench attention", "[--batch B --seq T --heads H --kv-heads K --head-dim D --reps N --threads K]",
                  specs, ZY_ARRAY_LEN(specs)))
        return 0;
    ZyErr err = {{0}};
    if (args_parse(argc, argv, 3, specs, ZY_ARRAY_LEN(specs), NULL, 0, NULL, "bench attention", &err)) {
        fprintf(stderr, "zaya: %s\n", err.msg);
        return 1;
    }
    if (B <= 0 || T <= 0 || Hq <= 0 || Hkv <= 0 || dh <= 0 || reps <= 0 || threads < 0 || Hq % Hkv) {
        fprintf(stderr, "zaya: bench attention: sizes and --reps must be positive, --kv-heads must divide --heads\n");
        return 1;
    }
    if (threads > 0) omp_set_num_threads(threads);
    const int nthr = omp_get_max_threads();
    const size_t nq = (size_t)B * T * Hq * dh, nk = (size_t)B * T * Hkv * dh, np = (size_t)B * Hq * T * T;
    const size_t nw = flash_attention_workspace_floats(dh, nthr), nl = (size_t)B * Hq * T;
    float *Q = malloc(nq * 4), *K = malloc(nk * 4), *V = malloc(nk * 4), *dO = malloc(nq * 4);
    float *O_ref = malloc(nq * 4), *O = malloc(nq * 4), *P = malloc(np * 4), *dP = malloc((size_t)T * T * 4);
    float *LSE = malloc(nl * 4), *work = malloc(nw * 4);
    float *dq[2] = {calloc(nq, 4), calloc(nq, 4)}, *dk[2] = {calloc(nk, 4), calloc(nk, 4)};
    float *dv[2] = {calloc(nk, 4), calloc(nk, 4)};
    double *t = malloc((size_t)4 * reps * sizeof *t);
    int rc = 1;
    if (!Q || !K || !V || !dO || !O_ref || !O || !P || !dP || !LSE || !work || !dq[0] || !dq[1] || !dk[0] || !dk[1] ||
        !dv[0] || !dv[1] || !t) {
        fprintf(stderr, "zaya: bench attention: out of memory (the reference needs %.1f MB of probabilities)\n",
                np * 4.0 / 1e6);
        goto done;
    }
    ZyRng rng;
    zy_rng_seed(&rng, 5);
    for (size_t i = 0; i < nq; i++) Q[i] = (float)zy_rng_normal(&rng), dO[i] = (float)zy_rng_normal(&rng);
    for (size_t i = 0; i < nk; i++) K[i] = (float)zy_rng_normal(&rng), V[i] = (float)zy_rng_normal(&rng);
    for (int r = -1; r < reps; r++) { /* r = -1: warm-up */
        double t0 = zy_now_seconds();
        attention_forward(O_ref, P, Q, K, V, B, T, Hq, Hkv, dh);
        double t1 = zy_now_seconds();
        flash_attention_forward(O, LSE, Q, K, V, B, T, Hq, Hkv, dh, 0, work, nthr);
        double t2 = zy_now_seconds();
        attention_backward(dq[0], dk[0], dv[0], dP, dO, P, Q, K, V, B, T, Hq, Hkv, dh);
        double t3 = zy_now_seconds();
        flash_attention_backward(dq[1], dk[1], dv[1], dO, O, LSE, Q, K, V, B, T, Hq, Hkv, dh, 0, work, nthr);
        double t4 = zy_now_seconds();
        if (r >= 0) t[r] = t1 - t0, t[reps + r] = t2 - t1, t[2 * reps + r] = t3 - t2, t[3 * reps + r] = t4 - t3;
    }
    double diff = 0, big = 1;
    for (size_t i = 0; i < nq; i++) diff = fmax(diff, fabs(O[i] - O_ref[i])), big = fmax(big, fabs(O_ref[i]));
    for (size_t i = 0; i < nq; i++) diff = fmax(diff, fabs(dq[1][i] - dq[0][i]) / (reps + 1));
    const double rf = zy_median(t, reps), ff = zy_median(t + reps, reps), rb = zy_median(t + 2 * reps, reps);
    const double fb = zy_median(t + 3 * reps, reps);
    /* causal convention: 2 products of T²/2 x dh multiply-adds forward, 5 backward (2 x B x Hq x T² x dh) */
    const double fl = 2.0 * B * Hq * (double)T * T * dh;
    printf("shape        B=%d T=%d Hq=%d Hkv=%d dh=%d, %d threads, median of %d\n", B, T, Hq, Hkv, dh, nthr, reps);
    printf("%-12s %10s %10s %8s\n", "", "reference", "flash", "speedup");
    printf("%-12s %8.3fms %8.3fms %7.2fx   (%.1f vs %.1f GFLOP/s, causal half counted)\n", "forward", rf * 1e3,
           ff * 1e3, rf / ff, fl / rf / 1e9, fl / ff / 1e9);
    printf("%-12s %8.3fms %8.3fms %7.2fx   (%.1f vs %.1f GFLOP/s)\n", "backward", rb * 1e3, fb * 1e3, rb / fb,
           2.5 * fl / rb / 1e9, 2.5 * fl / fb / 1e9);
    printf("%-12s %8.3fms %8.3fms %7.2fx\n", "fwd+bwd", (rf + rb) * 1e3, (ff + fb) * 1e3, (rf + rb) / (ff + fb));
    printf("memory       saved for backward: %.2f MB probabilities vs %.3f MB log-sum-exp; scratch: %.3f MB [T,T] vs "
           "%.3f MB tiles\n", np * 4.0 / 1e6, nl * 4.0 / 1e6, (double)T * T * 4.0 / 1e6, nw * 4.0 / 1e6);
    printf("max |diff|   %.3g (O, and dQ per call; values up to %.3g)\n", diff, big);
    rc = 0;
done:
    free(Q), free(K), free(V), free(dO), free(O_ref), free(O), free(P), free(dP), free(LSE), free(work), free(t);
    for (int i = 0; i < 2; i++) free(dq[i]), free(dk[i]), free(dv[i]);
    return rc;
}
