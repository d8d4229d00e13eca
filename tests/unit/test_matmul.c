/* zy_gemm's matrix-vector shortcuts (M = 1 or N = 1) against plain sgemm, every transpose and padded strides. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu.h"
#include "kernels/kernel_table.h"
#include "kernels/matmul.h"
#include "test.h"
#include "util/util.h"

TEST(gemm_matrix_vector_paths_match_sgemm) {
    ZyRng rng;
    zy_rng_seed(&rng, 11);
    const int shapes[][3] = {{1, 1, 1}, {1, 7, 5}, {1, 300, 129}, {5, 1, 9}, {257, 1, 64}, {1, 1, 1000}, {3, 1, 1}};
    double worst = 0;
    for (size_t s = 0; s < ZY_ARRAY_LEN(shapes); s++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (int beta_case = 0; beta_case < 2; beta_case++) {
                    const int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
                    /* stored shapes with 3 extra columns of padding so strides differ from the sizes */
                    const int a_rows = ta ? K : M, a_cols = ta ? M : K, b_rows = tb ? N : K, b_cols = tb ? K : N;
                    const int lda = a_cols + 3, ldb = b_cols + 3, ldc = N + 3;
                    float *A = malloc(sizeof(float) * a_rows * lda), *B = malloc(sizeof(float) * b_rows * ldb);
                    float *C1 = malloc(sizeof(float) * M * ldc), *C2 = malloc(sizeof(float) * M * ldc);
                    for (int i = 0; i < a_rows * lda; i++) A[i] = (float)zy_rng_normal(&rng);
                    for (int i = 0; i < b_rows * ldb; i++) B[i] = (float)zy_rng_normal(&rng);
                    for (int i = 0; i < M * ldc; i++) C1[i] = C2[i] = (float)zy_rng_normal(&rng);
                    const float beta = beta_case ? 0.5f : 0.0f;
                    zy_gemm(ta, tb, M, N, K, 1.25f, A, lda, B, ldb, beta, C1, ldc);
                    zy_gemm_reference(ta, tb, M, N, K, 1.25f, A, lda, B, ldb, beta, C2, ldc);
                    for (int i = 0; i < M; i++)
                        for (int j = 0; j < ldc; j++) {
                            const double a = C1[i * ldc + j], b = C2[i * ldc + j];
                            if (j >= N) { /* padding must be untouched */
                                CHECK(a == b);
                                continue;
                            }
                            const double err = fabs(a - b) / (1.0 + fabs(b)) / sqrt((double)K);
                            if (err > worst) worst = err;
                        }
                    free(A), free(B), free(C1), free(C2);
                }
    CHECK_MSG(worst < 1e-6, "worst relative difference %.3g", worst);
}

/* bf16 <-> fp32: round to nearest even at the 16-bit boundary, exact round trips, infinities, NaN kept NaN. */
TEST(bf16_conversion_rounds_to_nearest_even) {
    const struct {
        uint32_t in;
        uint16_t out;
    } cases[] = {
        {0x3f800000u, 0x3f80}, /* 1.0 exactly */
        {0x3f808000u, 0x3f80}, /* tie, even below: stays */
        {0x3f818000u, 0x3f82}, /* tie, odd below: rounds up */
        {0x3f808001u, 0x3f81}, /* just above the tie */
        {0x3f807fffu, 0x3f80}, /* just below the tie */
        {0xbf818000u, 0xbf82}, /* negative tie to even */
        {0x7f7fffffu, 0x7f80}, /* FLT_MAX rounds to +inf */
        {0x7f800000u, 0x7f80}, /* +inf */
        {0xff800000u, 0xff80}, /* -inf */
        {0x00000001u, 0x0000}, /* smallest denormal rounds to 0 */
        {0x80000000u, 0x8000}, /* -0 */
    };
    for (size_t i = 0; i < ZY_ARRAY_LEN(cases); i++) {
        float f;
        memcpy(&f, &cases[i].in, sizeof f);
        CHECK_MSG(zy_f32_to_bf16(f) == cases[i].out, "0x%08x -> 0x%04x, want 0x%04x", cases[i].in, zy_f32_to_bf16(f),
                  cases[i].out);
    }
    for (uint32_t h = 0; h < 0x10000u; h++) { /* every non-NaN bf16 survives the round trip */
        const float f = zy_bf16_to_f32((uint16_t)h);
        if (isnan(f)) {
            CHECK(isnan(zy_bf16_to_f32(zy_f32_to_bf16(f))));
            continue;
        }
        CHECK(zy_f32_to_bf16(f) == h);
    }
    const uint32_t snan = 0x7f800001u; /* a NaN whose payload sits in the dropped bits stays a NaN */
    float f;
    memcpy(&f, &snan, sizeof f);
    CHECK(isnan(zy_bf16_to_f32(zy_f32_to_bf16(f))));
    /* relative rounding error of normal numbers is at most 2^-8 (half an ulp of an 8-bit significand) */
    ZyRng rng;
    zy_rng_seed(&rng, 3);
    double worst = 0;
    for (int i = 0; i < 100000; i++) {
        const float x = (float)(zy_rng_normal(&rng) * pow(10.0, 6 * zy_rng_uniform(&rng) - 3));
        const double e = fabs((double)zy_round_bf16(x) - x) / fabs((double)x);
        if (e > worst) worst = e;
    }
    CHECK_MSG(worst <= 1.0 / 256, "worst relative rounding error %.3g", worst);
}

/* The bf16 weight kernels — plain C, and the kernel of every CPU level this machine has — against sgemm on the same
 * (rounded) fp32 weights: any rows, in sizes not multiples of the vector width, strided X and Y; Y's padding
 * untouched; zy_matmul_wt (the level kernel for few rows, widened panels + sgemm for more) never reads the fp32
 * matrix. The avx512bf16 kernel rounds X to bf16 as well (vdpbf16ps takes bf16 pairs), so its reference is sgemm on
 * rounded X too. */
TEST(bf16_weight_kernels_match_sgemm_on_rounded_weights) {
    ZyRng rng;
    zy_rng_seed(&rng, 17);
    const int shapes[][3] = {{1, 1, 1}, {1, 7, 5}, {1, 300, 129}, {2, 33, 64}, {3, 17, 40}, {4, 64, 256},
                             {5, 40, 31}, {8, 129, 96}, {9, 50, 72}, {1, 1000, 1024}, {16, 20, 48},
                             {1, 70, 4133}, {33, 600, 40} /* panels of 256 output rows and a partial one */,
                             {70, 45, 100} /* the avx512bf16 tiles: a 64-row panel and a partial one */};
    ZyCpuInfo ci;
    zy_cpu_detect(&ci);
    /* slots: 0..ZY_CPU_LEVELS-1 the levels, then plain C, then zy_matmul_wt */
    enum { PLAIN = ZY_CPU_LEVELS, ENTRY, SLOTS };
    double worst[SLOTS] = {0};
    int ran[SLOTS] = {0};
    for (size_t s = 0; s < ZY_ARRAY_LEN(shapes); s++) {
        const int rows = shapes[s][0], out = shapes[s][1], in = shapes[s][2], ldx = in + 5, ldy = out + 3;
        float *X = malloc(sizeof(float) * rows * ldx), *Xr = malloc(sizeof(float) * rows * ldx);
        float *W = malloc(sizeof(float) * out * in);
        uint16_t *W16 = malloc(sizeof(uint16_t) * out * in);
        float *Yref = malloc(sizeof(float) * rows * ldy), *Yref_r = malloc(sizeof(float) * rows * ldy);
        float *Y = malloc(sizeof(float) * rows * ldy);
        for (int i = 0; i < rows * ldx; i++) X[i] = (float)zy_rng_normal(&rng), Xr[i] = zy_round_bf16(X[i]);
        for (int i = 0; i < out * in; i++) {
            W16[i] = zy_f32_to_bf16((float)zy_rng_normal(&rng));
            W[i] = zy_bf16_to_f32(W16[i]);
        }
        zy_gemm_reference(0, 1, rows, out, in, 1, X, ldx, W, in, 0, Yref, ldy);
        zy_gemm_reference(0, 1, rows, out, in, 1, Xr, ldx, W, in, 0, Yref_r, ldy);
        for (int slot = 0; slot < SLOTS; slot++) {
            if (slot < ZY_CPU_LEVELS && !zy_cpu_supports(&ci, (ZyCpuLevel)slot)) continue;
            for (int i = 0; i < rows * ldy; i++) Y[i] = -7.0f;
            if (slot < ZY_CPU_LEVELS)
                zy_matmul_bf16(slot, rows, out, in, X, ldx, W16, Y, ldy);
            else if (slot == PLAIN)
                zy_matmul_bf16(ZY_BF16_PLAIN, rows, out, in, X, ldx, W16, Y, ldy);
            else
                zy_matmul_wt(rows, out, in, X, ldx, (ZyWeights){.bf16 = W16}, Y, ldy); /* the fp32 matrix is not read */
            /* the process's level decides what zy_matmul_wt rounds (at avx512bf16: X too, for any number of rows) */
            const int rounds_x =
                slot == ZY_CPU_AVX512BF16 || (slot == ENTRY && zy_cpu_level() == ZY_CPU_AVX512BF16);
            const float *ref = rounds_x ? Yref_r : Yref;
            ran[slot] = 1;
            for (int r = 0; r < rows; r++)
                for (int o = 0; o < ldy; o++) {
                    if (o >= out) {
                        CHECK(Y[r * ldy + o] == -7.0f);
                        continue;
                    }
                    const double a = Y[r * ldy + o], b = ref[r * ldy + o];
                    const double err = fabs(a - b) / (1.0 + fabs(b)) / sqrt((double)in);
                    if (!(err <= worst[slot])) worst[slot] = err;
                }
        }
        free(X), free(Xr), free(W), free(W16), free(Yref), free(Yref_r), free(Y);
    }
    printf("    bf16 kernels vs sgemm on rounded weights: plain %.3g", worst[PLAIN]);
    for (int l = 0; l < ZY_CPU_LEVELS; l++)
        if (ran[l])
            printf(", %s %.3g", zy_cpu_level_name((ZyCpuLevel)l), worst[l]);
        else
            printf(", %s (not on this CPU)", zy_cpu_level_name((ZyCpuLevel)l));
    printf(", zy_matmul_wt %.3g\n", worst[ENTRY]);
    for (int slot = 0; slot < SLOTS; slot++) CHECK_MSG(worst[slot] < 1e-6, "slot %d: worst %.3g", slot, worst[slot]);
    CHECK(ran[PLAIN] && ran[ENTRY] && ran[ZY_CPU_GENERIC]);
}

/* A MoE layer's experts in one call (zy_matmul_wt_groups_ctx): groups of 0, 1, 2-4 and many rows (the three
 * avx512bf16 kernels, a 64-row panel and a partial one), strided X and Y, each group against its own weights —
 * bit for bit zy_matmul_wt on each group alone, for bf16 weights (the grouped kernel at avx512bf16, the loop elsewhere)
 * and fp32 ones; Y's padding untouched. */
TEST(grouped_weight_products_equal_one_call_per_group) {
    ZyRng rng;
    zy_rng_seed(&rng, 23);
    const int sizes[] = {3, 0, 1, 70, 2, 4, 5, 0, 1, 9};
    const int G = (int)ZY_ARRAY_LEN(sizes), shapes[][2] = {{64, 48}, {37, 100}, {130, 33}};
    int32_t off[ZY_ARRAY_LEN(sizes) + 1] = {0};
    for (int g = 0; g < G; g++) off[g + 1] = off[g] + sizes[g];
    const int rows = off[G];
    long mismatches = 0, compared = 0;
    for (size_t sh = 0; sh < ZY_ARRAY_LEN(shapes); sh++) {
        const int out = shapes[sh][0], in = shapes[sh][1], ldx = in + 3, ldy = out + 5;
        float *X = malloc(sizeof(float) * rows * ldx), *W = malloc(sizeof(float) * G * out * in);
        uint16_t *W16 = malloc(sizeof(uint16_t) * G * out * in);
        float *Y = malloc(sizeof(float) * rows * ldy), *Yref = malloc(sizeof(float) * rows * ldy);
        for (int i = 0; i < rows * ldx; i++) X[i] = (float)zy_rng_normal(&rng);
        for (long i = 0; i < (long)G * out * in; i++) {
            W[i] = (float)zy_rng_normal(&rng);
            W16[i] = zy_f32_to_bf16(W[i]);
        }
        for (int bf16 = 0; bf16 < 2; bf16++) {
            for (int i = 0; i < rows * ldy; i++) Y[i] = Yref[i] = -7.0f;
            const ZyWeights w = bf16 ? (ZyWeights){.bf16 = W16} : (ZyWeights){.f32 = W};
            zy_matmul_wt_groups_ctx(NULL, G, off, out, in, X, ldx, w, Y, ldy);
            for (int g = 0; g < G; g++) /* each group's matrix by hand, not by zy_weights_offset */
                if (sizes[g])
                    zy_matmul_wt(sizes[g], out, in, X + (long)off[g] * ldx, ldx,
                                 bf16 ? (ZyWeights){.bf16 = W16 + (long)g * out * in}
                                      : (ZyWeights){.f32 = W + (long)g * out * in},
                                 Yref + (long)off[g] * ldy, ldy);
            for (int i = 0; i < rows * ldy; i++) mismatches += memcmp(&Y[i], &Yref[i], sizeof(float)) != 0;
            compared += rows * ldy;
        }
        free(X), free(W), free(W16), free(Y), free(Yref);
    }
    printf("    %ld values (padding included) compared at level %s, %ld differ\n", compared,
           zy_cpu_level_name(zy_cpu_level()), mismatches);
    CHECK(mismatches == 0);
}

/* The fp32 few-row path (zy_matmul_f32: tiles of dot products for 2..ZY_F32_TILE_MAX_ROWS rows) against sgemm: every
 * CPU level's tile kernel this machine runs, row counts around the 4-row blocks and the limit, output counts off the
 * 4-wide tiles and the 32-output chunks, inputs off every vector width, strided X and Y; Y's padding untouched. */
TEST(f32_weight_tiles_match_sgemm) {
    ZyRng rng;
    zy_rng_seed(&rng, 23);
    const int shapes[][3] = {{1, 5, 3},   {2, 1, 1},    {2, 33, 64},  {3, 17, 40},  {4, 64, 256}, {5, 40, 31},
                             {7, 3, 17},  {8, 129, 96}, {9, 50, 72},  {13, 70, 515}, {16, 20, 48}, {16, 1024, 512},
                             {17, 40, 24} /* past the limit: sgemm */};
    ZyCpuInfo ci;
    zy_cpu_detect(&ci);
    enum { ENTRY = ZY_CPU_LEVELS, SLOTS };
    double worst[SLOTS] = {0};
    int ran[SLOTS] = {0};
    for (size_t s = 0; s < ZY_ARRAY_LEN(shapes); s++) {
        const int rows = shapes[s][0], out = shapes[s][1], in = shapes[s][2], ldx = in + 5, ldy = out + 3;
        float *X = malloc(sizeof(float) * rows * ldx), *W = malloc(sizeof(float) * out * in);
        float *Yref = malloc(sizeof(float) * rows * ldy), *Y = malloc(sizeof(float) * rows * ldy);
        float *Xa = malloc(sizeof(float) * rows * ldx), *Wa = malloc(sizeof(float) * out * in);
        float *Yabs = malloc(sizeof(float) * rows * ldy);
        for (int i = 0; i < rows * ldx; i++) X[i] = (float)zy_rng_normal(&rng), Xa[i] = fabsf(X[i]);
        for (int i = 0; i < out * in; i++) W[i] = (float)zy_rng_normal(&rng), Wa[i] = fabsf(W[i]);
        zy_gemm_reference(0, 1, rows, out, in, 1, X, ldx, W, in, 0, Yref, ldy);
        zy_gemm_reference(0, 1, rows, out, in, 1, Xa, ldx, Wa, in, 0, Yabs, ldy); /* Σ|x w|: the scale of rounding */
        for (int slot = 0; slot < SLOTS; slot++) {
            if (slot < ZY_CPU_LEVELS && !zy_cpu_supports(&ci, (ZyCpuLevel)slot)) continue;
            if (slot < ZY_CPU_LEVELS && rows > ZY_F32_TILE_MAX_ROWS) continue;
            for (int i = 0; i < rows * ldy; i++) Y[i] = -7.0f;
            if (slot < ZY_CPU_LEVELS) {
                const ZyKernelTable *kt = zy_kernel_table((ZyCpuLevel)slot);
                for (int r0 = 0; r0 < rows; r0 += 4) /* the kernel's contract: at most 4 rows, any output range */
                    for (int o0 = 0; o0 < out; o0 += 7)
                        kt->matmul_f32_block(rows - r0 < 4 ? rows - r0 : 4, o0, o0 + 7 < out ? o0 + 7 : out, in,
                                             X + r0 * ldx, ldx, W, Y + r0 * ldy, ldy);
            } else {
                zy_matmul_wt(rows, out, in, X, ldx, (ZyWeights){.f32 = W}, Y, ldy);
            }
            ran[slot] = 1;
            for (int r = 0; r < rows; r++)
                for (int o = 0; o < ldy; o++) {
                    if (o >= out) {
                        CHECK(Y[r * ldy + o] == -7.0f);
                        continue;
                    }
                    const double a = Y[r * ldy + o], b = Yref[r * ldy + o];
                    /* two fp32 sums in different orders differ by a few ulps of Σ|x w| */
                    const double err = fabs(a - b) / (1e-30 + Yabs[r * ldy + o]);
                    if (!(err <= worst[slot])) worst[slot] = err;
                }
        }
        free(X), free(W), free(Yref), free(Y), free(Xa), free(Wa), free(Yabs);
    }
    printf("    fp32 weight tiles vs sgemm (difference / sum |x w|):");
    for (int l = 0; l < ZY_CPU_LEVELS; l++)
        if (ran[l])
            printf(" %s %.3g,", zy_cpu_level_name((ZyCpuLevel)l), worst[l]);
        else
            printf(" %s (not on this CPU),", zy_cpu_level_name((ZyCpuLevel)l));
    printf(" zy_matmul_wt %.3g\n", worst[ENTRY]);
    for (int slot = 0; slot < SLOTS; slot++) CHECK_MSG(worst[slot] < 1e-6, "slot %d: worst %.3g of sum |x w|", slot, worst[slot]);
    CHECK(ran[ENTRY] && ran[ZY_CPU_GENERIC]);
}

/* bf16 products (zy_gemm_ctx, "precision": "bf16") against sgemm on the rounded inputs, every transpose, alpha and
 * beta, strided operands, sizes on and off oneDNN's shape buckets (so padded and direct outputs both run): through
 * the process's level (oneDNN on an avx512bf16 CPU that has it) and through the sgemm fallback (level avx512 or
 * below). The products of bf16 values are exact in fp32, so only the summation order differs. Also: the scratch is
 * reused across calls of other sizes, C's padding columns are untouched, and a NULL / fp32 context is plain sgemm. */
TEST(bf16_gemm_matches_sgemm_on_rounded_inputs) {
    ZyRng rng;
    zy_rng_seed(&rng, 29);
    const int shapes[][3] = {{1, 1, 1}, {3, 5, 7}, {16, 32, 64}, {17, 33, 65}, {64, 64, 64}, {100, 36, 129},
                             {257, 48, 96}, {40, 600, 72}, {1100, 40, 24}, {8, 512, 520}};
    const ZyCpuLevel keep = zy_cpu_level();
    ZyCpuInfo ci;
    zy_cpu_detect(&ci);
    const ZyCpuLevel paths[2] = {keep, keep >= ZY_CPU_AVX512BF16 ? ZY_CPU_AVX512 : keep};
    double worst[2] = {0};
    for (int p = 0; p < 2; p++) {
        zy_cpu_set_level(paths[p]);
        ZyGemmCtx ctx = {.bf16 = 1};
        for (size_t s = 0; s < ZY_ARRAY_LEN(shapes); s++)
            for (int ta = 0; ta < 2; ta++)
                for (int tb = 0; tb < 2; tb++)
                    for (int v = 0; v < 2; v++) {
                        const int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
                        const float alpha = v ? 0.5f : 1.0f, beta = v ? 1.0f : 0.0f;
                        const int ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
                        const int lda = ac + 3, ldb = bc + 1, ldc = N + 2;
                        float *A = malloc(sizeof(float) * ar * lda), *B = malloc(sizeof(float) * br * ldb);
                        float *Ar = malloc(sizeof(float) * ar * lda), *Br = malloc(sizeof(float) * br * ldb);
                        float *C = malloc(sizeof(float) * M * ldc), *R = malloc(sizeof(float) * M * ldc);
                        for (int i = 0; i < ar * lda; i++) A[i] = (float)zy_rng_normal(&rng), Ar[i] = zy_round_bf16(A[i]);
                        for (int i = 0; i < br * ldb; i++) B[i] = (float)zy_rng_normal(&rng), Br[i] = zy_round_bf16(B[i]);
                        for (int i = 0; i < M * ldc; i++) C[i] = R[i] = (float)zy_rng_normal(&rng);
                        zy_gemm_reference(ta, tb, M, N, K, alpha, Ar, lda, Br, ldb, beta, R, ldc);
                        zy_gemm_ctx(&ctx, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
                        for (int i = 0; i < M; i++)
                            for (int j = 0; j < ldc; j++) {
                                const double a = C[i * ldc + j], b = R[i * ldc + j];
                                if (j >= N) {
                                    CHECK(a == b); /* padding untouched */
                                    continue;
                                }
                                const double e = fabs(a - b) / (1.0 + fabs(b)) / sqrt((double)K);
                                if (!(e <= worst[p])) worst[p] = e;
                            }
                        free(A), free(B), free(Ar), free(Br), free(C), free(R);
                    }
        zy_gemm_ctx_free(&ctx);
    }
    zy_cpu_set_level(keep);
    char backend[256];
    zy_gemm_bf16_backend(ZY_BF16_PRODUCTS_ONEDNN, backend, sizeof backend);
    printf("    bf16 products vs sgemm on rounded inputs: %s %.3g, sgemm fallback (%s) %.3g\n", backend, worst[0],
           zy_cpu_level_name(paths[1]), worst[1]);
    CHECK_MSG(worst[0] < 1e-6 && worst[1] < 1e-6, "worst %.3g %.3g", worst[0], worst[1]);
    /* a weight operand (zy_gemm_ctx_w) is packed once per weights generation: after the weight changes and
     * zy_gemm_ctx_weights_changed, the product uses the new values, as zy_gemm_ctx (no reuse) does */
    {
        enum { M = 70, N = 90, K = 100 };
        float *X = malloc(sizeof(float) * M * K), *W = malloc(sizeof(float) * N * K);
        float *C1 = malloc(sizeof(float) * M * N), *C2 = malloc(sizeof(float) * M * N);
        for (int i = 0; i < M * K; i++) X[i] = (float)zy_rng_normal(&rng);
        for (int i = 0; i < N * K; i++) W[i] = (float)zy_rng_normal(&rng);
        ZyGemmCtx ctx = {.bf16 = 1};
        int same = 1;
        for (int round = 0; round < 3; round++) {
            zy_gemm_ctx_w(&ctx, 0, 1, M, N, K, 1, X, K, W, K, 0, C1, N);
            zy_gemm_ctx(&ctx, 0, 1, M, N, K, 1, X, K, W, K, 0, C2, N);
            same &= memcmp(C1, C2, sizeof(float) * M * N) == 0;
            for (int i = 0; i < N * K; i++) W[i] *= -1.5f; /* an optimizer step */
            zy_gemm_ctx_weights_changed(&ctx);
        }
        CHECK_MSG(same, "a weight's packed bf16 copy outlived zy_gemm_ctx_weights_changed");
        zy_gemm_ctx_free(&ctx);
        free(X), free(W), free(C1), free(C2);
    }
    /* fp32 context and NULL: plain sgemm, bit for bit */
    float A[6] = {1.001f, 2, 3, 4, 5, 6}, B[6] = {0.3f, 1, 2, 3, 4, 5}, C1[4] = {0}, C2[4] = {0}, C3[4] = {0};
    ZyGemmCtx f32 = {0};
    zy_gemm_ctx(&f32, 0, 0, 2, 2, 3, 1, A, 3, B, 2, 0, C1, 2);
    zy_gemm_ctx(NULL, 0, 0, 2, 2, 3, 1, A, 3, B, 2, 0, C2, 2);
    zy_gemm(0, 0, 2, 2, 3, 1, A, 3, B, 2, 0, C3, 2);
    CHECK(memcmp(C1, C3, sizeof C1) == 0 && memcmp(C2, C3, sizeof C2) == 0);
}
