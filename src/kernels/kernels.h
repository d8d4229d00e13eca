/* kernels: the ZAYA ops, forward and backward side by side (bodies in kernels.inc). Each op exists for
 * float (the model) and, with an _f64 suffix, for double (the finite-difference reference checks).
 *
 * Every op's signature is written once, in the list ZY_REAL_OPS below (grep an op's name to find it there), over
 * the element type R: this header declares each op for R = float (name) and R = double (name_f64), and
 * kernel_table.h puts the float ones (ZY_FLOAT_OPS) in the table of each CPU level, through which the public names
 * dispatch. */
#ifndef ZAYA_KERNELS_H
#define ZAYA_KERNELS_H

#include <stdint.h>

#include "kernels/matmul.h"

/* OpenMP regions open only above this much work (elements touched): a fork/join costs microseconds, more than
 * a one-row decode step's ops take, and much more when the cores are shared with other processes. */
#define ZY_PAR_MIN 16384L
#define ZY_PAR(work) ((long)(work) >= ZY_PAR_MIN)
/* Column reductions (bias / scale gradients) run over chunks of this many columns per thread, each row read
 * contiguously, summed over the rows in order: the result does not depend on the thread count. */
#define ZY_COLS 64

/* The CCA convolutions' shape: B sequences of T rows of C channels (X [B*T, C]), the grouped conv's groups of dh
 * channels, the kernel widths k0 (depthwise) and k1 (grouped). */
typedef struct {
    int B, T, C, dh, k0, k1;
} ZyConvShape;
/* Their scratch. wp is a workspace of cca_conv_work_floats(shape) floats (the forward: M's rows with their taps side
 * by side, [B*T, C*k1]; the backward: the repacked grouped weights [k1, C, dh] and a gradient laid out like M
 * [B*(T+k1-1), C]); dwp one of cca_conv_grad_work_floats(shape) (the weights' gradient); cca_conv_forward_last's work
 * one of cca_conv_last_work_floats(B*n, C, k0, k1). */
static inline long cca_conv_work_floats(ZyConvShape s) {
    const long forward = (long)s.B * s.T * s.C * s.k1,
               backward = (long)s.k1 * s.C * s.dh + (long)s.B * (s.T + s.k1 - 1) * s.C;
    return forward > backward ? forward : backward;
}
static inline long cca_conv_grad_work_floats(ZyConvShape s) { return (long)s.k1 * s.C * s.dh; }
static inline long cca_conv_last_work_floats(int rows, int C, int k0, int k1) {
    return (long)k0 * C + 2L * rows * k1 * C;
}

/* OP(return type, name, (parameters), (arguments)) for every op of kernels.inc, over the element type R; WEIGHTS is
 * how a weight matrix that only a forward product reads travels (float: ZyWeights, its fp32 or bf16 views;
 * double: its values). */
#define ZY_REAL_OPS(OP, R, WEIGHTS)                                                                                    \
    /* linear: y = x Wᵀ (+ b). The ops with large matrix products take the run's ZyGemmCtx (matmul.h: fp32, or         \
     * bf16 inputs); NULL = fp32. */                                                                                   \
    OP(void, linear_forward,                                                                                           \
       (R *y, const R *x, const R *w, const R *bias, int rows, int in, int out, ZyGemmCtx *gemm),                      \
       (y, x, w, bias, rows, in, out, gemm))                                                                           \
    OP(void, linear_backward,                                                                                          \
       (R *dx, R *dw, R *dbias, const R *dy, const R *x, const R *w, int rows, int in, int out, ZyGemmCtx *gemm),      \
       (dx, dw, dbias, dy, x, w, rows, in, out, gemm))                                                                 \
    /* RMSNorm, rstd saved per row */                                                                                  \
    OP(void, rmsnorm_forward, (R *y, R *rstd, const R *x, const R *w, int rows, int dim, R eps),                       \
       (y, rstd, x, w, rows, dim, eps))                                                                                \
    OP(void, rmsnorm_backward, (R *dx, R *dw, const R *dy, const R *x, const R *w, const R *rstd, int rows, int dim),  \
       (dx, dw, dy, x, w, rstd, rows, dim))                                                                            \
    /* residual merge: out = (h + hb) ⊙ hs + (res + rb) ⊙ rs */                                                        \
    OP(void, residual_merge_forward,                                                                                   \
       (R *out, const R *h, const R *res, const R *hs, const R *hb, const R *rs, const R *rb, int rows, int dim),      \
       (out, h, res, hs, hb, rs, rb, rows, dim))                                                                       \
    OP(void, residual_merge_backward,                                                                                  \
       (R *dh, R *dres, R *dhs, R *dhb, R *drs, R *drb, const R *dout, const R *h, const R *res, const R *hs,          \
        const R *hb, const R *rs, const R *rb, int rows, int dim),                                                     \
       (dh, dres, dhs, dhb, drs, drb, dout, h, res, hs, hb, rs, rb, rows, dim))                                        \
    /* embedding input: x = (Emb[tok] + b) ⊙ s */                                                                      \
    OP(void, embed_forward,                                                                                            \
       (R *x, const R *emb, const int32_t *tokens, const R *bias, const R *scale, int rows, int dim),                  \
       (x, emb, tokens, bias, scale, rows, dim))                                                                       \
    OP(void, embed_backward,                                                                                           \
       (R *demb, R *dbias, R *dscale, const R *dx, const R *emb, const int32_t *tokens, const R *bias,                 \
        const R *scale, int rows, int dim, int pad_id),                                                                \
       (demb, dbias, dscale, dx, emb, tokens, bias, scale, rows, dim, pad_id))                                         \
    /* CCA convolutions (depthwise, then grouped); _last: the outputs at the last n of each sequence's T rows only,    \
     * into Y [B*n, C] (cached decoding), the grouped kernel w1 from its bf16 view where it has one (the same sums) */ \
    OP(void, cca_conv_forward,                                                                                         \
       (R *Y, R *M, R *wp, const R *X, const R *w0, const R *b0, const R *w1, const R *b1, ZyConvShape shape),         \
       (Y, M, wp, X, w0, b0, w1, b1, shape))                                                                           \
    OP(void, cca_conv_backward,                                                                                        \
       (R *dX, R *dw0, R *db0, R *dw1, R *db1, R *dM, R *wp, R *dwp, const R *dY, const R *X, const R *M,              \
        const R *w0, const R *w1, ZyConvShape shape),                                                                  \
       (dX, dw0, db0, dw1, db1, dM, wp, dwp, dY, X, M, w0, w1, shape))                                                 \
    OP(void, cca_conv_forward_last,                                                                                    \
       (R *Y, R *work, const R *X, const R *w0, const R *b0, WEIGHTS w1, const R *b1, ZyConvShape shape, int n),       \
       (Y, work, X, w0, b0, w1, b1, shape, n))                                                                         \
    /* q-k mean skip */                                                                                                \
    OP(void, qk_mean_forward, (R *query, R *key, const R *Y, const R *X, int rows, int Hq, int Hkv, int dh),           \
       (query, key, Y, X, rows, Hq, Hkv, dh))                                                                          \
    OP(void, qk_mean_backward, (R *dY, R *dX, const R *dquery, const R *dkey, int rows, int Hq, int Hkv, int dh),      \
       (dY, dX, dquery, dkey, rows, Hq, Hkv, dh))                                                                      \
    /* delayed values: value_t = concat(vc_t, vd_{t-1}) */                                                             \
    OP(void, delayed_value_forward, (R *value, const R *vc, const R *vd, int B, int T, int half),                      \
       (value, vc, vd, B, T, half))                                                                                    \
    OP(void, delayed_value_backward, (R *dvc, R *dvd, const R *dvalue, int B, int T, int half),                        \
       (dvc, dvd, dvalue, B, T, half))                                                                                 \
    /* QK L2 norm per head, norm saved per (row, head) */                                                              \
    OP(void, l2norm_forward,                                                                                           \
       (R *y, R *norm, const R *x, const R *temp, int rows, int H, int dh, R scale, R eps),                            \
       (y, norm, x, temp, rows, H, dh, scale, eps))                                                                    \
    OP(void, l2norm_backward,                                                                                          \
       (R *dx, R *dtemp, const R *dy, const R *x, const R *norm, const R *temp, int rows, int H, int dh, R scale,      \
        R eps),                                                                                                        \
       (dx, dtemp, dy, x, norm, temp, rows, H, dh, scale, eps))                                                        \
    /* partial RoPE, in place */                                                                                       \
    OP(void, rope_forward, (R *x, const R *cosv, const R *sinv, int rows, int T, int H, int dh, int rd),               \
       (x, cosv, sinv, rows, T, H, dh, rd))                                                                            \
    OP(void, rope_backward, (R *dx, const R *cosv, const R *sinv, int rows, int T, int H, int dh, int rd),             \
       (dx, cosv, sinv, rows, T, H, dh, rd))                                                                           \
    /* causal GQA softmax attention with the probabilities P stored (the reference; the model runs attention.h's) */   \
    OP(void, attention_forward,                                                                                        \
       (R *O, R *P, const R *Q, const R *Kx, const R *V, int B, int T, int Hq, int Hkv, int dh),                       \
       (O, P, Q, Kx, V, B, T, Hq, Hkv, dh))                                                                            \
    OP(void, attention_backward,                                                                                       \
       (R *dQ, R *dK, R *dV, R *dP, const R *dO, const R *P, const R *Q, const R *Kx, const R *V, int B, int T,        \
        int Hq, int Hkv, int dh),                                                                                      \
       (dQ, dK, dV, dP, dO, P, Q, Kx, V, B, T, Hq, Hkv, dh))                                                           \
    /* activations */                                                                                                  \
    OP(void, gelu_forward, (R *y, const R *x, long n), (y, x, n))                                                      \
    OP(void, gelu_backward, (R *dx, const R *dy, const R *x, long n), (dx, dy, x, n))                                  \
    OP(void, swiglu_forward, (R *act, const R *gu, int rows, int I), (act, gu, rows, I))                               \
    OP(void, swiglu_backward, (R *dgu, const R *dact, const R *gu, int rows, int I), (dgu, dact, gu, rows, I))         \
    /* router choice: softmax, argmax with the balancing bias, the gate */                                             \
    OP(void, router_choice_forward,                                                                                    \
       (R *probs, int32_t *choice, R *gate, const R *logits, const R *bias, int rows, int n_classes),                  \
       (probs, choice, gate, logits, bias, rows, n_classes))                                                           \
    OP(void, router_choice_backward,                                                                                   \
       (R *dlogits, const R *dgate, const R *probs, const int32_t *choice, int rows, int n_classes),                   \
       (dlogits, dgate, probs, choice, rows, n_classes))                                                               \
    /* fused ops: one pass where the plain ops above take several; each equals a composition of the plain ops          \
     * (tests/unit/test_fused.c) */                                                                                    \
    OP(void, merge_rmsnorm_forward,                                                                                    \
       (R *out, R *y, R *rstd, const R *h, const R *res, const R *hs, const R *hb, const R *rs, const R *rb,           \
        const R *w, int rows, int dim, R eps),                                                                         \
       (out, y, rstd, h, res, hs, hb, rs, rb, w, rows, dim, eps))                                                      \
    OP(void, rmsnorm_merge_backward,                                                                                   \
       (R *dx, R *dh, R *dw, R *dhs, R *dhb, R *drs, R *drb, const R *du, const R *x, const R *w, const R *rstd,       \
        const R *h, const R *res, const R *hs, const R *hb, const R *rs, const R *rb, int rows, int dim),              \
       (dx, dh, dw, dhs, dhb, drs, drb, du, x, w, rstd, h, res, hs, hb, rs, rb, rows, dim))                            \
    OP(void, state_rmsnorm_forward,                                                                                    \
       (R *z, R *zn, R *rstd, const R *bias, const R *r_prev, const R *gamma, const R *w, int rows, int dim,           \
        R eps),                                                                                                        \
       (z, zn, rstd, bias, r_prev, gamma, w, rows, dim, eps))                                                          \
    OP(void, state_backward,                                                                                           \
       (R *dr_prev, R *dgamma, R *dbias, const R *dz, const R *r_prev, const R *gamma, int rows, int dim),             \
       (dr_prev, dgamma, dbias, dz, r_prev, gamma, rows, dim))                                                         \
    OP(void, bias_gelu_forward, (R *pre, R *y, const R *bias, int rows, int dim), (pre, y, bias, rows, dim))           \
    OP(void, gelu_bias_backward, (R *dpre, R *dbias, const R *dy, const R *pre, int rows, int dim),                    \
       (dpre, dbias, dy, pre, rows, dim))                                                                              \
    /* MoE: the dropless top-1 SwiGLU experts as grouped products (w_gu [E, 2I, D], w_down [E, D, I]) */               \
    OP(void, moe_experts_forward,                                                                                      \
       (R *out, R *xin, R *gu, R *act, R *y, const R *u, const R *gate, const int32_t *choice,                         \
        const int32_t *sorted, const int32_t *off, WEIGHTS w_gu, WEIGHTS w_down, int rows, int D, int I, int E,        \
        ZyGemmCtx *gemm),                                                                                              \
       (out, xin, gu, act, y, u, gate, choice, sorted, off, w_gu, w_down, rows, D, I, E, gemm))                        \
    OP(void, moe_gate_backward,                                                                                        \
       (R *dgate, R *dy, const R *dout, const R *y, const R *gate, const int32_t *sorted, int n_routed, int D),        \
       (dgate, dy, dout, y, gate, sorted, n_routed, D))                                                                \
    OP(void, moe_experts_backward,                                                                                     \
       (R *du, R *dw_gu, R *dw_down, R *dact, R *dgu, R *dxin, const R *dy, const R *xin, const R *gu,                 \
        const R *act, const int32_t *sorted, const int32_t *off, const R *w_gu, const R *w_down, int D, int I,         \
        int E, ZyGemmCtx *gemm),                                                                                       \
       (du, dw_gu, dw_down, dact, dgu, dxin, dy, xin, gu, act, sorted, off, w_gu, w_down, D, I, E, gemm))              \
    /* fused QK L2 norm and RoPE */                                                                                    \
    OP(void, l2norm_rope_forward,                                                                                      \
       (R *y, R *norm, const R *x, const R *temp, const R *cosv, const R *sinv, int rows, int T, int H, int dh,        \
        int rd, R scale, R eps),                                                                                       \
       (y, norm, x, temp, cosv, sinv, rows, T, H, dh, rd, scale, eps))                                                 \
    OP(void, rope_l2norm_backward,                                                                                     \
       (R *dx, R *dtemp, R *dy, const R *x, const R *norm, const R *temp, const R *cosv, const R *sinv, int rows,      \
        int T, int H, int dh, int rd, R scale, R eps),                                                                 \
       (dx, dtemp, dy, x, norm, temp, cosv, sinv, rows, T, H, dh, rd, scale, eps))                                     \
    /* cross-entropy over the targets != -1: the mean loss, per-row losses, dlogits scaled by dloss */                 \
    OP(double, cross_entropy,                                                                                          \
       (R *dlogits, R *row_loss, const R *logits, const int32_t *targets, int rows, int V, double dloss),              \
       (dlogits, row_loss, logits, targets, rows, V, dloss))

/* The model's ops (float: the names as listed) and the reference ones (double: the names suffixed _f64). */
#define ZY_FLOAT_OPS(OP) ZY_REAL_OPS(OP, float, ZyWeights)
#define ZY_DOUBLE_OPS(OP) ZY_REAL_OPS(OP, double, const double *)
#define ZY_REAL_OP_DECL(ret, name, params, args) ret name params;
#define ZY_REAL_OP_DECL_F64(ret, name, params, args) ret name##_f64 params;
ZY_FLOAT_OPS(ZY_REAL_OP_DECL)
ZY_DOUBLE_OPS(ZY_REAL_OP_DECL_F64)
#undef ZY_REAL_OP_DECL
#undef ZY_REAL_OP_DECL_F64

/* embed_forward with a bf16 embedding table (bf16 inference weights). */
void embed_forward_bf16(float *x, const uint16_t *emb, const int32_t *tokens, const float *bias, const float *scale,
                        int rows, int dim);

/* RoPE cos/sin tables [T, rd/2] for positions 0..T-1, built in fp32 like the reference. */
void rope_tables(float *cosv, float *sinv, int T, int rd, float theta);
void rope_tables_f64(double *cosv, double *sinv, int T, int rd, double theta);

#endif
