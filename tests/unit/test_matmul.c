/* zy_gemm's matrix-vector shortcuts (M = 1 or N = 1) against plain sgemm, every transpose and padded strides. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "matmul.h"
#include "test.h"
#include "util.h"

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
