/* cuBLASLt's matrix product as far as src/gpu/gpu_ctx.cu uses it, on the CPU, for the emulated backend
 * (tests/gpu/emu/backend.sh puts this folder first on the include path, so gpu_ctx.cu's #include <cublasLt.h> finds
 * this file). The product follows the library's own definition, column-major: D = alpha op(A) op(B) + beta C with
 * op(A) m×k, op(B) k×n, C and D m×n, each layout rows × cols with its leading dimension and, for a strided batch, a
 * count and a stride in elements. So gpu_ctx.cu's mapping of row-major products onto it (operands swapped, transposes,
 * leading dimensions, batch strides) is what is checked. Refused as cuBLASLt refuses: a layout whose shape does not
 * fit the operation, a leading dimension under its rows, and an algorithm run on operands less aligned than the ones
 * it was picked for (the heuristic's MIN_ALIGNMENT preferences). bf16 operands are exact in fp32; each sum runs over
 * k in order in fp32 (a GPU's order differs: its results agree to fp32 rounding, not bit for bit). Header-only: one
 * file includes it. */
#ifndef ZAYA_EMU_CUBLASLT_H
#define ZAYA_EMU_CUBLASLT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <vector>

extern "C" {
#include "util/util.h" /* zy_f32_to_bf16, zy_bf16_to_f32: the project's one rounding */
}
#include "cuda_emu.h" /* emu::submit: a product queued during a capture runs when the graph does */

typedef enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_NOT_SUPPORTED = 15
} cublasStatus_t;
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;
typedef enum { CUBLAS_COMPUTE_32F = 68 } cublasComputeType_t;
typedef enum { CUDA_R_32F = 0, CUDA_R_16BF = 14 } cudaDataType_t;
typedef enum { CUBLASLT_MATMUL_DESC_TRANSA = 3, CUBLASLT_MATMUL_DESC_TRANSB = 4 } cublasLtMatmulDescAttributes_t;
typedef enum {
    CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT = 5,
    CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET = 6
} cublasLtMatrixLayoutAttribute_t;
typedef enum {
    CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8
} cublasLtMatmulPreferenceAttributes_t;

struct EmuLtHandle {
    int live;
};
struct EmuLtDesc {
    cublasComputeType_t compute;
    cudaDataType_t scale;
    cublasOperation_t ta, tb;
};
struct EmuLtLayout {
    cudaDataType_t type;
    uint64_t rows, cols;
    int64_t ld;
    int32_t batch;
    int64_t stride;
};
struct EmuLtPref {
    uint64_t workspace;
    uint32_t align[4]; /* A, B, C, D */
};
typedef EmuLtHandle *cublasLtHandle_t;
typedef EmuLtDesc *cublasLtMatmulDesc_t;
typedef EmuLtLayout *cublasLtMatrixLayout_t;
typedef EmuLtPref *cublasLtMatmulPreference_t;
typedef struct {
    uint64_t data[8]; /* here: the four operands' alignments the algorithm was picked for, then a tag */
} cublasLtMatmulAlgo_t;
typedef struct {
    cublasLtMatmulAlgo_t algo;
    size_t workspaceSize;
    cublasStatus_t state;
    float wavesCount;
    int reserved[4];
} cublasLtMatmulHeuristicResult_t;

enum { EMU_LT_ALGO_TAG = 0x656d756c74ull }; /* "emult": an algorithm this header made */

inline cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) {
    *h = new EmuLtHandle{1};
    return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t compute,
                                               cudaDataType_t scale) {
    *d = new EmuLtDesc{compute, scale, CUBLAS_OP_N, CUBLAS_OP_N};
    return compute == CUBLAS_COMPUTE_32F && scale == CUDA_R_32F ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_SUPPORTED;
}
inline cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
    delete d;
    return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
                                                     const void *buf, size_t size) {
    if (size != sizeof(cublasOperation_t)) return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(attr == CUBLASLT_MATMUL_DESC_TRANSA ? &d->ta : &d->tb, buf, size);
    return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType_t type, uint64_t rows,
                                                 uint64_t cols, int64_t ld) {
    *l = new EmuLtLayout{type, rows, cols, ld, 1, 0};
    return ld >= (int64_t)rows && ld > 0 ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}
inline cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
    delete l;
    return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr,
                                                       const void *buf, size_t size) {
    if (attr == CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT && size == sizeof(int32_t)) return memcpy(&l->batch, buf, size),
                                                                                      CUBLAS_STATUS_SUCCESS;
    if (attr == CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET && size == sizeof(int64_t))
        return memcpy(&l->stride, buf, size), CUBLAS_STATUS_SUCCESS;
    return CUBLAS_STATUS_INVALID_VALUE;
}
inline cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) {
    *p = new EmuLtPref{0, {1, 1, 1, 1}};
    return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
    delete p;
    return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                           cublasLtMatmulPreferenceAttributes_t attr, const void *buf,
                                                           size_t size) {
    if (attr == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES && size == sizeof(uint64_t))
        return memcpy(&p->workspace, buf, size), CUBLAS_STATUS_SUCCESS;
    if (attr >= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES && attr <= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES &&
        size == sizeof(uint32_t))
        return memcpy(&p->align[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES], buf, size), CUBLAS_STATUS_SUCCESS;
    return CUBLAS_STATUS_INVALID_VALUE;
}

namespace emu_lt {
/* op(X)'s rows and columns from X's layout */
inline void op_shape(const EmuLtLayout *l, cublasOperation_t op, uint64_t *r, uint64_t *c) {
    *r = op == CUBLAS_OP_N ? l->rows : l->cols;
    *c = op == CUBLAS_OP_N ? l->cols : l->rows;
}
inline cublasStatus_t check(const EmuLtDesc *d, const EmuLtLayout *a, const EmuLtLayout *b, const EmuLtLayout *c,
                            const EmuLtLayout *dl) {
    uint64_t am, ak, bk, bn;
    op_shape(a, d->ta, &am, &ak);
    op_shape(b, d->tb, &bk, &bn);
    if (ak != bk || c->rows != am || c->cols != bn || dl->rows != am || dl->cols != bn || c->ld != dl->ld ||
        a->type != b->type || c->type != dl->type || (a->type == CUDA_R_32F && c->type != CUDA_R_32F) ||
        a->batch != b->batch || a->batch != c->batch || c->batch != dl->batch || a->batch < 1)
        return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}
inline float load(const void *p, cudaDataType_t t, int64_t i) {
    return t == CUDA_R_32F ? static_cast<const float *>(p)[i] : zy_bf16_to_f32(static_cast<const uint16_t *>(p)[i]);
}
inline void store(void *p, cudaDataType_t t, int64_t i, float v) {
    if (t == CUDA_R_32F)
        static_cast<float *>(p)[i] = v;
    else
        static_cast<uint16_t *>(p)[i] = zy_f32_to_bf16(v); /* nearest, ties to even, as the library's epilogue */
}
inline uint64_t alignment(const void *p) {
    const uint64_t v = (uint64_t)(uintptr_t)p | 256u;
    return v & (~v + 1);
}
} // namespace emu_lt

inline cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a,
                                                     cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                                                     cublasLtMatrixLayout_t dl, cublasLtMatmulPreference_t p,
                                                     int requested, cublasLtMatmulHeuristicResult_t *results,
                                                     int *found) {
    *found = 0;
    if (requested < 1) return CUBLAS_STATUS_INVALID_VALUE;
    if (emu_lt::check(d, a, b, c, dl) != CUBLAS_STATUS_SUCCESS) return CUBLAS_STATUS_NOT_SUPPORTED;
    memset(&results[0], 0, sizeof results[0]);
    for (int i = 0; i < 4; i++) results[0].algo.data[i] = p->align[i];
    results[0].algo.data[4] = EMU_LT_ALGO_TAG;
    results[0].workspaceSize = p->workspace < (1u << 20) ? p->workspace : (1u << 20);
    results[0].state = CUBLAS_STATUS_SUCCESS;
    *found = 1;
    return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatmulAlgoCheck(cublasLtHandle_t, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a,
                                              cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                                              cublasLtMatrixLayout_t dl, const cublasLtMatmulAlgo_t *algo,
                                              cublasLtMatmulHeuristicResult_t *result) {
    if (algo->data[4] != EMU_LT_ALGO_TAG) return CUBLAS_STATUS_INVALID_VALUE;
    const cublasStatus_t st = emu_lt::check(d, a, b, c, dl);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    memset(result, 0, sizeof *result);
    result->algo = *algo;
    result->workspaceSize = 1u << 20;
    return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void *alpha, const void *A,
                                     cublasLtMatrixLayout_t la, const void *B, cublasLtMatrixLayout_t lb,
                                     const void *beta, const void *C, cublasLtMatrixLayout_t lc, void *D,
                                     cublasLtMatrixLayout_t ld, const cublasLtMatmulAlgo_t *algo, void *, size_t ws,
                                     void *) {
    if (!h || !algo || algo->data[4] != EMU_LT_ALGO_TAG) return CUBLAS_STATUS_INVALID_VALUE;
    cublasStatus_t st = emu_lt::check(d, la, lb, lc, ld);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    const void *ptr[4] = {A, B, C, D};
    for (int i = 0; i < 4; i++)
        if (emu_lt::alignment(ptr[i]) < algo->data[i]) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (ws < (1u << 20)) return CUBLAS_STATUS_INVALID_VALUE;
    float al, be;
    memcpy(&al, alpha, 4);
    memcpy(&be, beta, 4);
    uint64_t m, k, n, k2;
    emu_lt::op_shape(la, d->ta, &m, &k);
    emu_lt::op_shape(lb, d->tb, &k2, &n);
    /* a product queued while a stream is captured runs when the graph does: the operands are read then, the
     * descriptors (which the caller may destroy) were read now */
    const EmuLtDesc dd = *d;
    const EmuLtLayout a_l = *la, b_l = *lb, c_l = *lc, d_l = *ld;
    auto run = [=] {
        const EmuLtDesc *d = &dd;
        const EmuLtLayout *la = &a_l, *lb = &b_l, *lc = &c_l, *ld = &d_l;
        std::vector<float> col(m);
        for (int32_t bi = 0; bi < la->batch; bi++) {
            const int64_t oa = bi * la->stride, ob = bi * lb->stride, oc = bi * lc->stride, od = bi * ld->stride;
            for (uint64_t j = 0; j < n; j++) {
                for (uint64_t i = 0; i < m; i++) col[i] = 0;
                for (uint64_t p = 0; p < k; p++) {
                    const float bv = emu_lt::load(B, lb->type,
                                                  ob + (d->tb == CUBLAS_OP_N ? (int64_t)(p + j * lb->ld)
                                                                             : (int64_t)(j + p * lb->ld)));
                    for (uint64_t i = 0; i < m; i++)
                        col[i] += emu_lt::load(A, la->type,
                                                       oa + (d->ta == CUBLAS_OP_N ? (int64_t)(i + p * la->ld)
                                                                                  : (int64_t)(p + i * la->ld))) *
                                  bv;
                }
                for (uint64_t i = 0; i < m; i++) {
                    double v = al * col[i];
                    if (be != 0.0f) v += (double)be * emu_lt::load(C, lc->type, oc + (int64_t)(i + j * lc->ld));
                    emu_lt::store(D, ld->type, od + (int64_t)(i + j * ld->ld), (float)v);
                }
            }
        }
    };
    emu::submit(run);
    return CUBLAS_STATUS_SUCCESS;
}

#endif
