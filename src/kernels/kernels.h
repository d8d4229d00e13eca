/* kernels: the ZAYA ops, forward and backward side by side (bodies in kernels.inc). Each op exists for
 * float (the model) and, with an _f64 suffix, for double (the finite-difference reference checks). */
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

/* The ops with large matrix products take the run's ZyGemmCtx (matmul.h: fp32, or bf16 inputs); NULL = fp32. */
void linear_forward(float *y, const float *x, const float *w, const float *bias, int rows, int in, int out, ZyGemmCtx *gemm);
void linear_backward(float *dx, float *dw, float *dbias, const float *dy, const float *x, const float *w, int rows, int in, int out, ZyGemmCtx *gemm);
void rmsnorm_forward(float *y, float *rstd, const float *x, const float *w, int rows, int dim, float eps);
void rmsnorm_backward(float *dx, float *dw, const float *dy, const float *x, const float *w, const float *rstd, int rows, int dim);
void residual_merge_forward(float *out, const float *h, const float *res, const float *hs, const float *hb, const float *rs, const float *rb, int rows, int dim);
void residual_merge_backward(float *dh, float *dres, float *dhs, float *dhb, float *drs, float *drb, const float *dout, const float *h, const float *res, const float *hs, const float *hb, const float *rs, const float *rb, int rows, int dim);
void embed_forward(float *x, const float *emb, const int32_t *tokens, const float *bias, const float *scale, int rows, int dim);
void embed_forward_bf16(float *x, const uint16_t *emb, const int32_t *tokens, const float *bias, const float *scale, int rows, int dim);
void embed_backward(float *demb, float *dbias, float *dscale, const float *dx, const float *emb, const int32_t *tokens, const float *bias, const float *scale, int rows, int dim, int pad_id);
/* wp is a workspace of cca_conv_work_floats(B, T, C, dh, k1) floats (the forward: M's rows with their taps side by
 * side, [B*T, C*k1]; the backward: the repacked grouped weights [k1, C, dh] and a gradient laid out like M
 * [B*(T+k1-1), C]); dwp one of cca_conv_grad_work_floats(C, dh, k1) (the weights' gradient). */
static inline long cca_conv_work_floats(int B, int T, int C, int dh, int k1) {
    const long forward = (long)B * T * C * k1, backward = (long)k1 * C * dh + (long)B * (T + k1 - 1) * C;
    return forward > backward ? forward : backward;
}
static inline long cca_conv_grad_work_floats(int C, int dh, int k1) { return (long)k1 * C * dh; }
void cca_conv_forward(float *Y, float *M, float *wp, const float *X, const float *w0, const float *b0, const float *w1, const float *b1, int B, int T, int C, int dh, int k0, int k1);
void cca_conv_backward(float *dX, float *dw0, float *db0, float *dw1, float *db1, float *dM, float *wp, float *dwp, const float *dY, const float *X, const float *M, const float *w0, const float *w1, int B, int T, int C, int dh, int k0, int k1);
/* cca_conv_forward's outputs at the last n of each sequence's T rows only, into Y [B*n, C] (cached decoding); work is
 * scratch of cca_conv_last_work_floats(B*n, C, k0, k1) floats. */
static inline long cca_conv_last_work_floats(int rows, int C, int k0, int k1) {
    return (long)k0 * C + 2L * rows * k1 * C;
}
void cca_conv_forward_last(float *Y, float *work, const float *X, const float *w0, const float *b0, const float *w1, const float *b1, int B, int T, int n, int C, int dh, int k0, int k1);
void qk_mean_forward(float *query, float *key, const float *Y, const float *X, int rows, int Hq, int Hkv, int dh);
void qk_mean_backward(float *dY, float *dX, const float *dquery, const float *dkey, int rows, int Hq, int Hkv, int dh);
void delayed_value_forward(float *value, const float *vc, const float *vd, int B, int T, int half);
void delayed_value_backward(float *dvc, float *dvd, const float *dvalue, int B, int T, int half);
void l2norm_forward(float *y, float *norm, const float *x, const float *temp, int rows, int H, int dh, float scale, float eps);
void l2norm_backward(float *dx, float *dtemp, const float *dy, const float *x, const float *norm, const float *temp, int rows, int H, int dh, float scale, float eps);
void rope_forward(float *x, const float *cosv, const float *sinv, int rows, int T, int H, int dh, int rd);
void rope_backward(float *dx, const float *cosv, const float *sinv, int rows, int T, int H, int dh, int rd);
void attention_forward(float *O, float *P, const float *Q, const float *Kx, const float *V, int B, int T, int Hq, int Hkv, int dh);
void attention_backward(float *dQ, float *dK, float *dV, float *dP, const float *dO, const float *P, const float *Q, const float *Kx, const float *V, int B, int T, int Hq, int Hkv, int dh);
void gelu_forward(float *y, const float *x, long n);
void gelu_backward(float *dx, const float *dy, const float *x, long n);
void swiglu_forward(float *act, const float *gu, int rows, int I);
void swiglu_backward(float *dgu, const float *dact, const float *gu, int rows, int I);
void router_choice_forward(float *probs, int32_t *choice, float *gate, const float *logits, const float *bias, int rows, int n_classes);
void router_choice_backward(float *dlogits, const float *dgate, const float *probs, const int32_t *choice, int rows, int n_classes);
/* Fused ops (kernels.inc, "fused"): one pass where the plain ops above take several; each equals a
 * composition of the plain ops (tests/unit/test_fused.c). */
void merge_rmsnorm_forward(float *out, float *y, float *rstd, const float *h, const float *res, const float *hs, const float *hb, const float *rs, const float *rb, const float *w, int rows, int dim, float eps);
void rmsnorm_merge_backward(float *dx, float *dh, float *dw, float *dhs, float *dhb, float *drs, float *drb, const float *du, const float *x, const float *w, const float *rstd, const float *h, const float *res, const float *hs, const float *hb, const float *rs, const float *rb, int rows, int dim);
void state_rmsnorm_forward(float *z, float *zn, float *rstd, const float *bias, const float *r_prev, const float *gamma, const float *w, int rows, int dim, float eps);
void state_backward(float *dr_prev, float *dgamma, float *dbias, const float *dz, const float *r_prev, const float *gamma, int rows, int dim);
void bias_gelu_forward(float *pre, float *y, const float *bias, int rows, int dim);
void gelu_bias_backward(float *dpre, float *dbias, const float *dy, const float *pre, int rows, int dim);
void moe_experts_forward(float *out, float *xin, float *gu, float *act, float *y, const float *u, const float *gate, const int32_t *choice, const int32_t *sorted, const int32_t *off, const float *w_gu, const float *w_down, const uint16_t *w_gu16, const uint16_t *w_down16, int rows, int D, int I, int E, ZyGemmCtx *gemm);
void moe_gate_backward(float *dgate, float *dy, const float *dout, const float *y, const float *gate, const int32_t *sorted, int n_routed, int D);
void moe_experts_backward(float *du, float *dw_gu, float *dw_down, float *dact, float *dgu, float *dxin, const float *dy, const float *xin, const float *gu, const float *act, const int32_t *sorted, const int32_t *off, const float *w_gu, const float *w_down, int D, int I, int E, ZyGemmCtx *gemm);
void l2norm_rope_forward(float *y, float *norm, const float *x, const float *temp, const float *cosv, const float *sinv, int rows, int T, int H, int dh, int rd, float scale, float eps);
void rope_l2norm_backward(float *dx, float *dtemp, float *dy, const float *x, const float *norm, const float *temp, const float *cosv, const float *sinv, int rows, int T, int H, int dh, int rd, float scale, float eps);
double cross_entropy(float *dlogits, float *row_loss, const float *logits, const int32_t *targets, int rows, int V, double dloss);

void linear_forward_f64(double *y, const double *x, const double *w, const double *bias, int rows, int in, int out, ZyGemmCtx *gemm);
void linear_backward_f64(double *dx, double *dw, double *dbias, const double *dy, const double *x, const double *w, int rows, int in, int out, ZyGemmCtx *gemm);
void rmsnorm_forward_f64(double *y, double *rstd, const double *x, const double *w, int rows, int dim, double eps);
void rmsnorm_backward_f64(double *dx, double *dw, const double *dy, const double *x, const double *w, const double *rstd, int rows, int dim);
void residual_merge_forward_f64(double *out, const double *h, const double *res, const double *hs, const double *hb, const double *rs, const double *rb, int rows, int dim);
void residual_merge_backward_f64(double *dh, double *dres, double *dhs, double *dhb, double *drs, double *drb, const double *dout, const double *h, const double *res, const double *hs, const double *hb, const double *rs, const double *rb, int rows, int dim);
void embed_forward_f64(double *x, const double *emb, const int32_t *tokens, const double *bias, const double *scale, int rows, int dim);
void embed_backward_f64(double *demb, double *dbias, double *dscale, const double *dx, const double *emb, const int32_t *tokens, const double *bias, const double *scale, int rows, int dim, int pad_id);
void cca_conv_forward_f64(double *Y, double *M, double *wp, const double *X, const double *w0, const double *b0, const double *w1, const double *b1, int B, int T, int C, int dh, int k0, int k1);
void cca_conv_backward_f64(double *dX, double *dw0, double *db0, double *dw1, double *db1, double *dM, double *wp, double *dwp, const double *dY, const double *X, const double *M, const double *w0, const double *w1, int B, int T, int C, int dh, int k0, int k1);
void cca_conv_forward_last_f64(double *Y, double *work, const double *X, const double *w0, const double *b0, const double *w1, const double *b1, int B, int T, int n, int C, int dh, int k0, int k1);
void qk_mean_forward_f64(double *query, double *key, const double *Y, const double *X, int rows, int Hq, int Hkv, int dh);
void qk_mean_backward_f64(double *dY, double *dX, const double *dquery, const double *dkey, int rows, int Hq, int Hkv, int dh);
void delayed_value_forward_f64(double *value, const double *vc, const double *vd, int B, int T, int half);
void delayed_value_backward_f64(double *dvc, double *dvd, const double *dvalue, int B, int T, int half);
void l2norm_forward_f64(double *y, double *norm, const double *x, const double *temp, int rows, int H, int dh, double scale, double eps);
void l2norm_backward_f64(double *dx, double *dtemp, const double *dy, const double *x, const double *norm, const double *temp, int rows, int H, int dh, double scale, double eps);
void rope_forward_f64(double *x, const double *cosv, const double *sinv, int rows, int T, int H, int dh, int rd);
void rope_backward_f64(double *dx, const double *cosv, const double *sinv, int rows, int T, int H, int dh, int rd);
void attention_forward_f64(double *O, double *P, const double *Q, const double *Kx, const double *V, int B, int T, int Hq, int Hkv, int dh);
void attention_backward_f64(double *dQ, double *dK, double *dV, double *dP, const double *dO, const double *P, const double *Q, const double *Kx, const double *V, int B, int T, int Hq, int Hkv, int dh);
void gelu_forward_f64(double *y, const double *x, long n);
void gelu_backward_f64(double *dx, const double *dy, const double *x, long n);
void swiglu_forward_f64(double *act, const double *gu, int rows, int I);
void swiglu_backward_f64(double *dgu, const double *dact, const double *gu, int rows, int I);
void router_choice_forward_f64(double *probs, int32_t *choice, double *gate, const double *logits, const double *bias, int rows, int n_classes);
void router_choice_backward_f64(double *dlogits, const double *dgate, const double *probs, const int32_t *choice, int rows, int n_classes);
void merge_rmsnorm_forward_f64(double *out, double *y, double *rstd, const double *h, const double *res, const double *hs, const double *hb, const double *rs, const double *rb, const double *w, int rows, int dim, double eps);
void rmsnorm_merge_backward_f64(double *dx, double *dh, double *dw, double *dhs, double *dhb, double *drs, double *drb, const double *du, const double *x, const double *w, const double *rstd, const double *h, const double *res, const double *hs, const double *hb, const double *rs, const double *rb, int rows, int dim);
void state_rmsnorm_forward_f64(double *z, double *zn, double *rstd, const double *bias, const double *r_prev, const double *gamma, const double *w, int rows, int dim, double eps);
void state_backward_f64(double *dr_prev, double *dgamma, double *dbias, const double *dz, const double *r_prev, const double *gamma, int rows, int dim);
void bias_gelu_forward_f64(double *pre, double *y, const double *bias, int rows, int dim);
void gelu_bias_backward_f64(double *dpre, double *dbias, const double *dy, const double *pre, int rows, int dim);
void moe_experts_forward_f64(double *out, double *xin, double *gu, double *act, double *y, const double *u, const double *gate, const int32_t *choice, const int32_t *sorted, const int32_t *off, const double *w_gu, const double *w_down, const uint16_t *w_gu16, const uint16_t *w_down16, int rows, int D, int I, int E, ZyGemmCtx *gemm);
void moe_gate_backward_f64(double *dgate, double *dy, const double *dout, const double *y, const double *gate, const int32_t *sorted, int n_routed, int D);
void moe_experts_backward_f64(double *du, double *dw_gu, double *dw_down, double *dact, double *dgu, double *dxin, const double *dy, const double *xin, const double *gu, const double *act, const int32_t *sorted, const int32_t *off, const double *w_gu, const double *w_down, int D, int I, int E, ZyGemmCtx *gemm);
void l2norm_rope_forward_f64(double *y, double *norm, const double *x, const double *temp, const double *cosv, const double *sinv, int rows, int T, int H, int dh, int rd, double scale, double eps);
void rope_l2norm_backward_f64(double *dx, double *dtemp, double *dy, const double *x, const double *norm, const double *temp, const double *cosv, const double *sinv, int rows, int T, int H, int dh, int rd, double scale, double eps);
double cross_entropy_f64(double *dlogits, double *row_loss, const double *logits, const int32_t *targets, int rows, int V, double dloss);

/* RoPE cos/sin tables [T, rd/2] for positions 0..T-1, built in fp32 like the reference. */
void rope_tables(float *cosv, float *sinv, int T, int rd, float theta);
void rope_tables_f64(double *cosv, double *sinv, int T, int rd, double theta);

#endif
