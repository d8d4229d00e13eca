/* cuBLASLt products (gpu_gemm) against the CPU's zy_gemm: every transpose pair, odd shapes, row strides wider than
 * the matrix, beta = 1 accumulation; fp32 (no TF32) and bf16 operands with fp32 sums. */
#include <stdio.h>
#include <string.h>

#include "gpu_test.h"
#include "matmul.h"

/* Rounds a host array to bf16 values in place (what the GPU's bf16 operands hold). */
static void round_bf16(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = zy_round_bf16(x[i]);
}

static void one_case(GpuTest *t, int bf16, int ta, int tb, int M, int N, int K, int pad, float beta) {
    const int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
    const size_t na = (size_t)(ta ? K : M) * lda, nb = (size_t)(tb ? N : K) * ldb, nc = (size_t)M * ldc;
    float *A = gt_rand(t, na, 1.0f), *B = gt_rand(t, nb, 1.0f), *C = gt_rand(t, nc, 1.0f);
    float *dA = gt_up(t, A, na), *dB = gt_up(t, B, nb), *dC = gt_up(t, C, nc);
    if (bf16) round_bf16(A, na), round_bf16(B, nb);
    zy_gemm(ta, tb, M, N, K, 0.5f, A, lda, B, ldb, beta, C, ldc);
    t->g->bf16 = bf16;
    ZyErr err = {{0}};
    int rc = gpu_gemm(t->g, ta, tb, M, N, K, 0.5f, dA, NULL, lda, dB, NULL, ldb, beta, dC, ldc, &err);
    t->g->bf16 = 0;
    char name[160];
    snprintf(name, sizeof name, "%s ta%d tb%d %dx%dx%d pad %d beta %g", bf16 ? "bf16" : "fp32", ta, tb, M, N, K, pad,
             beta);
    if (!gt_assert(t, rc == 0, name, "%s", rc ? err.msg : "launched")) return;
    /* both sides sum exact products (bf16 × bf16 fits fp32) in fp32: only the order differs */
    gt_check(t, name, dC, C, nc, 2e-5);
}

void test_gpu_gemm(GpuTest *t) {
    const int shapes[][3] = {{1, 1, 1}, {7, 5, 3}, {33, 65, 17}, {128, 96, 64}, {257, 129, 300}, {1024, 1536, 512}};
    for (int bf16 = 0; bf16 < 2; bf16++)
        for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
            for (int ta = 0; ta < 2; ta++)
                for (int tb = 0; tb < 2; tb++)
                    one_case(t, bf16, ta, tb, shapes[s][0], shapes[s][1], shapes[s][2], s % 2 ? 3 : 0,
                             (ta + tb) % 2 ? 1.0f : 0.0f);
    gt_reset(t);
    /* given bf16 copies are used as they are (the weights' copies in training) */
    {
        const int M = 64, N = 48, K = 40;
        float *A = gt_rand(t, (size_t)M * K, 1), *B = gt_rand(t, (size_t)N * K, 1), *C = gt_host(t, (size_t)M * N);
        round_bf16(A, (size_t)M * K), round_bf16(B, (size_t)N * K);
        float *dA = gt_up(t, A, (size_t)M * K), *dB = gt_up(t, B, (size_t)N * K), *dC = gt_poison(t, (size_t)M * N);
        uint16_t *B16 = gt_dev(t, (size_t)N * K * 2);
        gk_f32_to_bf16(t->g->stream, B16, dB, (long)N * K);
        zy_gemm(0, 1, M, N, K, 1, A, K, B, K, 0, C, N);
        t->g->bf16 = 1;
        ZyErr err;
        int rc = gpu_gemm(t->g, 0, 1, M, N, K, 1, dA, NULL, K, NULL, B16, K, 0, dC, N, &err);
        t->g->bf16 = 0;
        gt_assert(t, rc == 0, "bf16 with a ready bf16 operand", "%s", rc ? err.msg : "launched");
        gt_check(t, "bf16 with a ready bf16 operand", dC, C, (size_t)M * N, 2e-5);
    }
    double tf = gpu_gemm_probe_tflops(t->g, 4096, 10);
    t->g->bf16 = 1;
    double tf16 = gpu_gemm_probe_tflops(t->g, 4096, 10);
    t->g->bf16 = 0;
    gt_assert(t, tf > 0 && tf16 > tf, "GEMM probe", "fp32 %.1f TFLOP/s, bf16 %.1f TFLOP/s (4096^3)", tf, tf16);
}
