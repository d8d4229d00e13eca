/* kernels: the ZAYA ops, forward and backward side by side (bodies in kernels.inc). Each op exists for
 * float (the model) and, with an _f64 suffix, for double (the finite-difference reference checks). */
#ifndef ZAYA_KERNELS_H
#define ZAYA_KERNELS_H

#include <stdint.h>

void linear_forward(float *y, const float *x, const float *w, const float *bias, int rows, int in, int out);
void linear_backward(float *dx, float *dw, float *dbias, const float *dy, const float *x, const float *w, int rows, int in, int out);
void rmsnorm_forward(float *y, float *rstd, const float *x, const float *w, int rows, int dim, float eps);
void rmsnorm_backward(float *dx, float *dw, const float *dy, const float *x, const float *w, const float *rstd, int rows, int dim);
void residual_merge_forward(float *out, const float *h, const float *res, const float *hs, const float *hb, const float *rs, const float *rb, int rows, int dim);
void residual_merge_backward(float *dh, float *dres, float *dhs, float *dhb, float *drs, float *drb, const float *dout, const float *h, const float *res, const float *hs, const float *hb, const float *rs, const float *rb, int rows, int dim);
void embed_forward(float *x, const float *emb, const int32_t *tokens, const float *bias, const float *scale, int rows, int dim);
void embed_backward(float *demb, float *dbias, float *dscale, const float *dx, const float *emb, const int32_t *tokens, const float *bias, const float *scale, int rows, int dim, int pad_id);
void cca_conv_forward(float *Y, float *M, const float *X, const float *w0, const float *b0, const float *w1, const float *b1, int B, int T, int C, int dh, int k0, int k1);
void cca_conv_backward(float *dX, float *dw0, float *db0, float *dw1, float *db1, float *dM, const float *dY, const float *X, const float *M, const float *w0, const float *w1, int B, int T, int C, int dh, int k0, int k1);
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
double cross_entropy(float *dlogits, float *row_loss, const float *logits, const int32_t *targets, int rows, int V, double dloss);

void linear_forward_f64(double *y, const double *x, const double *w, const double *bias, int rows, int in, int out);
void linear_backward_f64(double *dx, double *dw, double *dbias, const double *dy, const double *x, const double *w, int rows, int in, int out);
void rmsnorm_forward_f64(double *y, double *rstd, const double *x, const double *w, int rows, int dim, double eps);
void rmsnorm_backward_f64(double *dx, double *dw, const double *dy, const double *x, const double *w, const double *rstd, int rows, int dim);
void residual_merge_forward_f64(double *out, const double *h, const double *res, const double *hs, const double *hb, const double *rs, const double *rb, int rows, int dim);
void residual_merge_backward_f64(double *dh, double *dres, double *dhs, double *dhb, double *drs, double *drb, const double *dout, const double *h, const double *res, const double *hs, const double *hb, const double *rs, const double *rb, int rows, int dim);
void embed_forward_f64(double *x, const double *emb, const int32_t *tokens, const double *bias, const double *scale, int rows, int dim);
void embed_backward_f64(double *demb, double *dbias, double *dscale, const double *dx, const double *emb, const int32_t *tokens, const double *bias, const double *scale, int rows, int dim, int pad_id);
void cca_conv_forward_f64(double *Y, double *M, const double *X, const double *w0, const double *b0, const double *w1, const double *b1, int B, int T, int C, int dh, int k0, int k1);
void cca_conv_backward_f64(double *dX, double *dw0, double *db0, double *dw1, double *db1, double *dM, const double *dY, const double *X, const double *M, const double *w0, const double *w1, int B, int T, int C, int dh, int k0, int k1);
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
double cross_entropy_f64(double *dlogits, double *row_loss, const double *logits, const int32_t *targets, int rows, int V, double dloss);

/* RoPE cos/sin tables [T, rd/2] for positions 0..T-1, built in fp32 like the reference. */
void rope_tables(float *cosv, float *sinv, int T, int rd, float theta);
void rope_tables_f64(double *cosv, double *sinv, int T, int rd, double theta);

#endif
