/* kernel_table: the hot kernels of one CPU level, as a table of function pointers.
 *
 * kernels_isa.c (the float ops of kernels.inc), attention.c and the bf16 matrix-vector kernel are compiled once
 * per level, each time with that level's -march and their names suffixed _generic, _avx2, _avx512 (Makefile);
 * each compilation fills one table. The ops' public names (kernels.h, attention.h) call through the table of the
 * process's level (cpu.h: CPUID, or ZAYA_CPU). Tests call a level's table directly to compare levels. */
#ifndef ZAYA_KERNEL_TABLE_H
#define ZAYA_KERNEL_TABLE_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu.h"
#include "kernels/matmul.h"

/* ZK(return type, name, (parameters), (arguments)) for every op with a public name (kernels.h, attention.h). */
#define ZY_KERNEL_OPS(ZK)                                                                                              \
    ZK(void, linear_forward,                                                                                           \
       (float *y, const float *x, const float *w, const float *bias, int rows, int in, int out, ZyGemmCtx *gemm),      \
       (y, x, w, bias, rows, in, out, gemm))                                                                           \
    ZK(void, linear_backward,                                                                                          \
       (float *dx, float *dw, float *dbias, const float *dy, const float *x, const float *w, int rows, int in,         \
       int out, ZyGemmCtx *gemm),                                                                                      \
       (dx, dw, dbias, dy, x, w, rows, in, out, gemm))                                                                 \
    ZK(void, rmsnorm_forward,                                                                                          \
       (float *y, float *rstd, const float *x, const float *w, int rows, int dim, float eps),                          \
       (y, rstd, x, w, rows, dim, eps))                                                                                \
    ZK(void, rmsnorm_backward,                                                                                         \
       (float *dx, float *dw, const float *dy, const float *x, const float *w, const float *rstd, int rows, int dim),  \
       (dx, dw, dy, x, w, rstd, rows, dim))                                                                            \
    ZK(void, residual_merge_forward,                                                                                   \
       (float *out, const float *h, const float *res, const float *hs, const float *hb, const float *rs,               \
       const float *rb, int rows, int dim),                                                                            \
       (out, h, res, hs, hb, rs, rb, rows, dim))                                                                       \
    ZK(void, residual_merge_backward,                                                                                  \
       (float *dh, float *dres, float *dhs, float *dhb, float *drs, float *drb, const float *dout, const float *h,     \
       const float *res, const float *hs, const float *hb, const float *rs, const float *rb, int rows, int dim),       \
       (dh, dres, dhs, dhb, drs, drb, dout, h, res, hs, hb, rs, rb, rows, dim))                                        \
    ZK(void, embed_forward,                                                                                            \
       (float *x, const float *emb, const int32_t *tokens, const float *bias, const float *scale, int rows, int dim),  \
       (x, emb, tokens, bias, scale, rows, dim))                                                                       \
    ZK(void, embed_backward,                                                                                           \
       (float *demb, float *dbias, float *dscale, const float *dx, const float *emb, const int32_t *tokens,            \
       const float *bias, const float *scale, int rows, int dim, int pad_id),                                          \
       (demb, dbias, dscale, dx, emb, tokens, bias, scale, rows, dim, pad_id))                                         \
    ZK(void, cca_conv_forward,                                                                                         \
       (float *Y, float *M, float *wp, const float *X, const float *w0, const float *b0, const float *w1,              \
       const float *b1, int B, int T, int C, int dh, int k0, int k1),                                                  \
       (Y, M, wp, X, w0, b0, w1, b1, B, T, C, dh, k0, k1))                                                             \
    ZK(void, cca_conv_backward,                                                                                        \
       (float *dX, float *dw0, float *db0, float *dw1, float *db1, float *dM, float *wp, float *dwp, const float *dY,  \
       const float *X, const float *M, const float *w0, const float *w1, int B, int T, int C, int dh, int k0, int k1), \
       (dX, dw0, db0, dw1, db1, dM, wp, dwp, dY, X, M, w0, w1, B, T, C, dh, k0, k1))                                   \
    ZK(void, cca_conv_forward_last,                                                                                    \
       (float *Y, float *work, const float *X, const float *w0, const float *b0, const float *w1, const float *b1,     \
       int B, int T, int n, int C, int dh, int k0, int k1),                                                            \
       (Y, work, X, w0, b0, w1, b1, B, T, n, C, dh, k0, k1))                                                             \
    ZK(void, qk_mean_forward,                                                                                          \
       (float *query, float *key, const float *Y, const float *X, int rows, int Hq, int Hkv, int dh),                  \
       (query, key, Y, X, rows, Hq, Hkv, dh))                                                                          \
    ZK(void, qk_mean_backward,                                                                                         \
       (float *dY, float *dX, const float *dquery, const float *dkey, int rows, int Hq, int Hkv, int dh),              \
       (dY, dX, dquery, dkey, rows, Hq, Hkv, dh))                                                                      \
    ZK(void, delayed_value_forward,                                                                                    \
       (float *value, const float *vc, const float *vd, int B, int T, int half),                                       \
       (value, vc, vd, B, T, half))                                                                                    \
    ZK(void, delayed_value_backward,                                                                                   \
       (float *dvc, float *dvd, const float *dvalue, int B, int T, int half),                                          \
       (dvc, dvd, dvalue, B, T, half))                                                                                 \
    ZK(void, l2norm_forward,                                                                                           \
       (float *y, float *norm, const float *x, const float *temp, int rows, int H, int dh, float scale, float eps),    \
       (y, norm, x, temp, rows, H, dh, scale, eps))                                                                    \
    ZK(void, l2norm_backward,                                                                                          \
       (float *dx, float *dtemp, const float *dy, const float *x, const float *norm, const float *temp, int rows,      \
       int H, int dh, float scale, float eps),                                                                         \
       (dx, dtemp, dy, x, norm, temp, rows, H, dh, scale, eps))                                                        \
    ZK(void, rope_forward,                                                                                             \
       (float *x, const float *cosv, const float *sinv, int rows, int T, int H, int dh, int rd),                       \
       (x, cosv, sinv, rows, T, H, dh, rd))                                                                            \
    ZK(void, rope_backward,                                                                                            \
       (float *dx, const float *cosv, const float *sinv, int rows, int T, int H, int dh, int rd),                      \
       (dx, cosv, sinv, rows, T, H, dh, rd))                                                                           \
    ZK(void, attention_forward,                                                                                        \
       (float *O, float *P, const float *Q, const float *Kx, const float *V, int B, int T, int Hq, int Hkv, int dh),   \
       (O, P, Q, Kx, V, B, T, Hq, Hkv, dh))                                                                            \
    ZK(void, attention_backward,                                                                                       \
       (float *dQ, float *dK, float *dV, float *dP, const float *dO, const float *P, const float *Q, const float *Kx,  \
       const float *V, int B, int T, int Hq, int Hkv, int dh),                                                         \
       (dQ, dK, dV, dP, dO, P, Q, Kx, V, B, T, Hq, Hkv, dh))                                                           \
    ZK(void, gelu_forward,                                                                                             \
       (float *y, const float *x, long n),                                                                             \
       (y, x, n))                                                                                                      \
    ZK(void, gelu_backward,                                                                                            \
       (float *dx, const float *dy, const float *x, long n),                                                           \
       (dx, dy, x, n))                                                                                                 \
    ZK(void, swiglu_forward,                                                                                           \
       (float *act, const float *gu, int rows, int I),                                                                 \
       (act, gu, rows, I))                                                                                             \
    ZK(void, swiglu_backward,                                                                                          \
       (float *dgu, const float *dact, const float *gu, int rows, int I),                                              \
       (dgu, dact, gu, rows, I))                                                                                       \
    ZK(void, router_choice_forward,                                                                                    \
       (float *probs, int32_t *choice, float *gate, const float *logits, const float *bias, int rows, int n_classes),  \
       (probs, choice, gate, logits, bias, rows, n_classes))                                                           \
    ZK(void, router_choice_backward,                                                                                   \
       (float *dlogits, const float *dgate, const float *probs, const int32_t *choice, int rows, int n_classes),       \
       (dlogits, dgate, probs, choice, rows, n_classes))                                                               \
    ZK(void, merge_rmsnorm_forward,                                                                                    \
       (float *out, float *y, float *rstd, const float *h, const float *res, const float *hs, const float *hb,         \
       const float *rs, const float *rb, const float *w, int rows, int dim, float eps),                                \
       (out, y, rstd, h, res, hs, hb, rs, rb, w, rows, dim, eps))                                                      \
    ZK(void, rmsnorm_merge_backward,                                                                                   \
       (float *dx, float *dh, float *dw, float *dhs, float *dhb, float *drs, float *drb, const float *du,              \
       const float *x, const float *w, const float *rstd, const float *h, const float *res, const float *hs,           \
       const float *hb, const float *rs, const float *rb, int rows, int dim),                                          \
       (dx, dh, dw, dhs, dhb, drs, drb, du, x, w, rstd, h, res, hs, hb, rs, rb, rows, dim))                            \
    ZK(void, state_rmsnorm_forward,                                                                                    \
       (float *z, float *zn, float *rstd, const float *bias, const float *r_prev, const float *gamma, const float *w,  \
       int rows, int dim, float eps),                                                                                  \
       (z, zn, rstd, bias, r_prev, gamma, w, rows, dim, eps))                                                          \
    ZK(void, state_backward,                                                                                           \
       (float *dr_prev, float *dgamma, float *dbias, const float *dz, const float *r_prev, const float *gamma,         \
       int rows, int dim),                                                                                             \
       (dr_prev, dgamma, dbias, dz, r_prev, gamma, rows, dim))                                                         \
    ZK(void, bias_gelu_forward,                                                                                        \
       (float *pre, float *y, const float *bias, int rows, int dim),                                                   \
       (pre, y, bias, rows, dim))                                                                                      \
    ZK(void, gelu_bias_backward,                                                                                       \
       (float *dpre, float *dbias, const float *dy, const float *pre, int rows, int dim),                              \
       (dpre, dbias, dy, pre, rows, dim))                                                                              \
    ZK(void, moe_experts_forward,                                                                                      \
       (float *out, float *xin, float *gu, float *act, float *y, const float *u, const float *gate,                    \
       const int32_t *choice, const int32_t *sorted, const int32_t *off, const float *w_gu, const float *w_down,       \
       const uint16_t *w_gu16, const uint16_t *w_down16, int rows, int D, int I, int E, ZyGemmCtx *gemm),              \
       (out, xin, gu, act, y, u, gate, choice, sorted, off, w_gu, w_down, w_gu16, w_down16, rows, D, I, E, gemm))      \
    ZK(void, moe_gate_backward,                                                                                        \
       (float *dgate, float *dy, const float *dout, const float *y, const float *gate, const int32_t *sorted,          \
       int n_routed, int D),                                                                                           \
       (dgate, dy, dout, y, gate, sorted, n_routed, D))                                                                \
    ZK(void, moe_experts_backward,                                                                                     \
       (float *du, float *dw_gu, float *dw_down, float *dact, float *dgu, float *dxin, const float *dy,                \
       const float *xin, const float *gu, const float *act, const int32_t *sorted, const int32_t *off,                 \
       const float *w_gu, const float *w_down, int D, int I, int E, ZyGemmCtx *gemm),                                  \
       (du, dw_gu, dw_down, dact, dgu, dxin, dy, xin, gu, act, sorted, off, w_gu, w_down, D, I, E, gemm))              \
    ZK(void, l2norm_rope_forward,                                                                                      \
       (float *y, float *norm, const float *x, const float *temp, const float *cosv, const float *sinv, int rows,      \
       int T, int H, int dh, int rd, float scale, float eps),                                                          \
       (y, norm, x, temp, cosv, sinv, rows, T, H, dh, rd, scale, eps))                                                 \
    ZK(void, rope_l2norm_backward,                                                                                     \
       (float *dx, float *dtemp, float *dy, const float *x, const float *norm, const float *temp, const float *cosv,   \
       const float *sinv, int rows, int T, int H, int dh, int rd, float scale, float eps),                             \
       (dx, dtemp, dy, x, norm, temp, cosv, sinv, rows, T, H, dh, rd, scale, eps))                                     \
    ZK(double, cross_entropy,                                                                                          \
       (float *dlogits, float *row_loss, const float *logits, const int32_t *targets, int rows, int V, double dloss),  \
       (dlogits, row_loss, logits, targets, rows, V, dloss))                                                           \
    ZK(size_t, flash_attention_workspace_floats,                                                                       \
       (int dh, int threads),                                                                                          \
       (dh, threads))                                                                                                  \
    ZK(void, flash_attention_forward,                                                                                  \
       (float *O, float *LSE, const float *Q, const float *K, const float *V, int B, int T, int Hq, int Hkv, int dh,   \
       int window, float *work, int threads),                                                                          \
       (O, LSE, Q, K, V, B, T, Hq, Hkv, dh, window, work, threads))                                                    \
    ZK(void, flash_attention_backward,                                                                                 \
       (float *dQ, float *dK, float *dV, const float *dO, const float *O, const float *LSE, const float *Q,            \
       const float *K, const float *V, int B, int T, int Hq, int Hkv, int dh, int window, float *work, int threads),   \
       (dQ, dK, dV, dO, O, LSE, Q, K, V, B, T, Hq, Hkv, dh, window, work, threads))                                  \
    ZK(void, decode_attn_scores,                                                                                       \
       (float *S, long lds, const float *Q, long ldq, const float *KT, long ldkt, int n, int cnt, int avail, int dh,   \
       float scale),                                                                                                   \
       (S, lds, Q, ldq, KT, ldkt, n, cnt, avail, dh, scale))                                                                 \
    ZK(void, decode_attn_scores_bf16,                                                                                  \
       (float *S, long lds, const float *Q, long ldq, const uint16_t *KT, long ldkt, int n, int cnt, int avail,       \
       int dh, float scale),                                                                                           \
       (S, lds, Q, ldq, KT, ldkt, n, cnt, avail, dh, scale))                                                           \
    ZK(void, decode_attn_values_bf16,                                                                                  \
       (float *O, long ldo, const float *P, long ldp, const uint16_t *V, long ldv, int n, int cnt, int dh,             \
       int accumulate),                                                                                                \
       (O, ldo, P, ldp, V, ldv, n, cnt, dh, accumulate))                                                               \
    ZK(void, decode_attn_softmax, (float *row, int n, int first, int last), (row, n, first, last))                     \
    ZK(void, decode_attn_values,                                                                                       \
       (float *O, long ldo, const float *P, long ldp, const float *V, long ldv, int n, int cnt, int dh,                \
       int accumulate),                                                                                                \
       (O, ldo, P, ldp, V, ldv, n, cnt, dh, accumulate))
/* ... and the kernels that only matmul.c calls. matmul_bf16_block: Y[r, o] = Σ_k X[r, k] · W16[o, k] for rows
 * r < nr (nr <= ZY_BF16_ROW_BLOCK), outputs o in [o0, o1): bf16 weights widened to fp32, fp32 accumulation.
 * matmul_f32_block: the same with fp32 weights W [out, in] (nr <= 4), tiles of dot products (matmul.c's few-row path).
 * f32_to_bf16_row: dst[i] = zy_f32_to_bf16(src[i]) (nearest even, NaN kept quiet), vectorised. */
#define ZY_KERNEL_INTERNAL(ZK) \
    ZK(void, matmul_bf16_block, (int nr, int o0, int o1, int in, const float *X, int ldx, const uint16_t *W16, \
                                float *Y, int ldy), (nr, o0, o1, in, X, ldx, W16, Y, ldy)) \
    ZK(void, matmul_f32_block, (int nr, int o0, int o1, int in, const float *X, int ldx, const float *W, float *Y, \
                               int ldy), (nr, o0, o1, in, X, ldx, W, Y, ldy)) \
    ZK(void, f32_to_bf16_row, (uint16_t *dst, const float *src, int n), (dst, src, n))
#define ZY_KERNEL_LIST(ZK) ZY_KERNEL_OPS(ZK) ZY_KERNEL_INTERNAL(ZK)

#define ZY_KERNEL_FIELD(ret, name, params, args) ret(*name) params;
typedef struct {
    const char *level; /* the level it was compiled for */
    ZY_KERNEL_LIST(ZY_KERNEL_FIELD)
} ZyKernelTable;
#undef ZY_KERNEL_FIELD

/* In a per-level compilation (-DZY_ISA=avx2): a name with the level's suffix (NAME_avx2), and the declarations of
 * that level's functions. */
#ifdef ZY_ISA
#define ZY_PASTE_(a, b) a##_##b
#define ZY_PASTE(a, b) ZY_PASTE_(a, b)
#define ZY_ISA_NAME(name) ZY_PASTE(name, ZY_ISA)
#define ZY_KERNEL_DECL(ret, name, params, args) ret ZY_ISA_NAME(name) params;
ZY_KERNEL_LIST(ZY_KERNEL_DECL)
#undef ZY_KERNEL_DECL
#endif

/* The table compiled for a level (levels above the ones compiled in give the highest compiled one below them:
 * avx512bf16 shares avx512's ops, its own bf16 kernels live in matmul.c). Never NULL. */
const ZyKernelTable *zy_kernel_table(ZyCpuLevel level);
/* The process's table: zy_kernel_table(zy_cpu_level()). */
const ZyKernelTable *zy_kernels(void);

#endif
