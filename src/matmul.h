/* matmul: the one seam every matrix product goes through (OpenBLAS today; the GPU backend plugs in here).
 * Row-major C = alpha * op(A) op(B) + beta * C with op = transpose when trans_* is non-zero;
 * op(A) is M x K, op(B) is K x N. */
#ifndef ZAYA_MATMUL_H
#define ZAYA_MATMUL_H

void zy_gemm(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
             int ldb, float beta, float *C, int ldc);
/* zy_gemm without its matrix-vector shortcuts (always sgemm): the reference in tests. */
void zy_gemm_reference(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda,
                       const float *B, int ldb, float beta, float *C, int ldc);
/* The upper triangle (row-major: j >= i) of the symmetric C [N, N] = alpha * op(A) op(A)ᵀ + beta * C, with
 * op(A) = A [N, K] (trans = 0) or Aᵀ (A [K, N], trans = 1); the strictly lower triangle is left as it was. Half
 * the FLOPs of the gemm (Muon's Newton–Schulz: X Xᵀ and A²). */
void zy_syrk_upper(int trans, int N, int K, float alpha, const float *A, int lda, float beta, float *C, int ldc);
/* Double precision, for the finite-difference reference checks. */
void zy_gemm_f64(int trans_a, int trans_b, int M, int N, int K, double alpha, const double *A, int lda,
                 const double *B, int ldb, double beta, double *C, int ldc);

/* Measured sgemm throughput (GFLOP/s) of this process's BLAS on square matrices of size n, timed for about
 * `seconds` after a warm-up: the peak MFU is quoted against. */
double zy_sgemm_probe_gflops(int n, double seconds);

#endif
